"""A kernel-written 4 KiB round trip from PyTorch, through gpuipc and
torch.multiprocessing, beside the same torch work in one process.

  python3 python/bench/kloop_torch.py ADEV BDEV [N]

Each round trip: A's kernel writes a 4 KiB int32 tensor (PyTorch's caching
allocator, default streams), it goes to B on GPU BDEV, B's kernel reads it
and writes the answer (each value + 1), which comes back and is read by
A's kernel (a comparison kept on the GPU); A waits for its GPU. Every
answer is checked at the end of each row.

  one_process  the same tensors and kernels in one process: .to() between
               the GPUs instead of a second process (what the torch work
               itself costs);
  gpuipc       Channel.send of the tensor (staged: it is the allocator's
               memory), Channel.recv_into a tensor of the receiver's own
               GPU, both ways;
  torch_mp     a torch.multiprocessing queue each way (CUDA IPC handles of
               the allocator's blocks), the receiver copying the tensor
               into its own GPU's tensor and dropping the shared one.

Prints "RESULT kloop_py <row> median_us p99_us n" per row and the ratio
of gpuipc's excess over one_process.
"""
import os
import sys
import time

import torch
import torch.multiprocessing as mp

import gpuipc

WARM = 100
WORDS = 1024


def _stats(ts):
    ts = sorted(ts)
    return ts[len(ts) // 2] * 1e6, ts[min(len(ts) - 1, len(ts) * 99 // 100)] * 1e6


def _report(row, ts):
    med, p99 = _stats(ts)
    print(f"RESULT kloop_py {row} {med:.1f} {p99:.1f} {len(ts)}")
    print(f"{row:12s} median {med:8.1f} us  p99 {p99:8.1f} us  ({len(ts)} round trips)",
          flush=True)
    return med


def one_process(adev, bdev, n):
    base = torch.arange(WORDS, dtype=torch.int32, device=adev)
    bad = torch.zeros((), dtype=torch.int64, device=adev)
    ts = []
    for i in range(n + WARM):
        t0 = time.perf_counter()
        x = base + i * 4096
        xb = x.to(bdev)
        ans = xb + 1
        back = ans.to(adev)
        bad += (back != x + 1).sum()
        torch.cuda.synchronize(adev)
        if i >= WARM:
            ts.append(time.perf_counter() - t0)
    assert int(bad) == 0, f"one_process: {int(bad)} wrong values"
    return ts


def _gp_side_b(dom, bdev, n, ready):
    torch.cuda.set_device(bdev)
    inb = torch.empty(WORDS, dtype=torch.int32, device=bdev)
    torch.cuda.synchronize(bdev)
    with gpuipc.Domain(dom) as d, d.channel("kloop", timeout=120) as ch:
        ready.set()
        for _ in range(n + WARM):
            ch.recv_into(inb, timeout=60)
            ch.send(inb + 1)
        ch.recv(timeout=60).release()  # A's "done": every answer was read


def gpuipc_row(adev, bdev, n):
    dom = f"kloop{os.getpid()}"
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_gp_side_b, args=(dom, bdev, n, ready))
    p.start()
    base = torch.arange(WORDS, dtype=torch.int32, device=adev)
    back = torch.empty_like(base)
    bad = torch.zeros((), dtype=torch.int64, device=adev)
    ts = []
    with gpuipc.Domain(dom) as d, d.channel("kloop", timeout=120) as ch:
        ready.wait(120)
        for i in range(n + WARM):
            t0 = time.perf_counter()
            x = base + i * 4096
            ch.send(x)
            ch.recv_into(back, timeout=60)
            bad += (back != x + 1).sum()
            torch.cuda.synchronize(adev)
            if i >= WARM:
                ts.append(time.perf_counter() - t0)
        ch.send(torch.zeros(1, dtype=torch.int32))
        p.join(120)
    assert p.exitcode == 0, f"gpuipc side B exited {p.exitcode}"
    assert int(bad) == 0, f"gpuipc: {int(bad)} wrong values"
    return ts


def _mp_side_b(bdev, n, q_in, q_out, ready):
    torch.cuda.set_device(bdev)
    inb = torch.empty(WORDS, dtype=torch.int32, device=bdev)
    torch.cuda.synchronize(bdev)
    ready.set()
    for _ in range(n + WARM):
        x = q_in.get()
        inb.copy_(x)
        del x
        q_out.put(inb + 1)


def torch_mp_row(adev, bdev, n):
    ctx = mp.get_context("spawn")
    q_in, q_out, ready = ctx.Queue(), ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_mp_side_b, args=(bdev, n, q_in, q_out, ready))
    p.start()
    ready.wait(120)
    base = torch.arange(WORDS, dtype=torch.int32, device=adev)
    back = torch.empty_like(base)
    bad = torch.zeros((), dtype=torch.int64, device=adev)
    ts = []
    keep = []
    for i in range(n + WARM):
        t0 = time.perf_counter()
        x = base + i * 4096
        q_in.put(x)
        y = q_out.get()
        back.copy_(y)
        del y
        bad += (back != x + 1).sum()
        torch.cuda.synchronize(adev)
        keep.append(x)  # torch.mp: the sender keeps what it shared alive
        if len(keep) > 64:
            keep.pop(0)
        if i >= WARM:
            ts.append(time.perf_counter() - t0)
    p.join(120)
    assert p.exitcode == 0, f"torch.mp side B exited {p.exitcode}"
    assert int(bad) == 0, f"torch_mp: {int(bad)} wrong values"
    return ts


def main():
    adev, bdev = int(sys.argv[1]), int(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
    rows = os.environ.get("KLOOP_ROWS", "one_process,gpuipc,torch_mp").split(",")
    print(f"kloop_torch: GPU {adev} <-> GPU {bdev}, 4 KiB int32, torch "
          f"{torch.__version__}, {n} round trips a row", flush=True)
    meds = {}
    for row, fn in (("one_process", one_process), ("gpuipc", gpuipc_row),
                    ("torch_mp", torch_mp_row)):
        if row in rows:
            meds[row] = _report(row, fn(adev, bdev, n))
    if "one_process" in meds and "gpuipc" in meds:
        print(f"gpuipc adds {meds['gpuipc'] - meds['one_process']:.1f} us to "
              f"the one-process torch work")


if __name__ == "__main__":
    main()
