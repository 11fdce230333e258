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

one_process and gpuipc run by turns, TURN round trips each, in the same
process A (B waits for its next message meanwhile): a machine whose speed
drifts during the run (a Python loop's round trip moved by 30 % between
runs a minute apart on one machine) moves both rows alike, and what gpuipc
adds is their difference. Each turn starts with a few round trips left
out of the figures.

Prints "RESULT kloop_py <row> median_us p99_us n" per row and what gpuipc
adds to one_process (the medians' difference, and the median of the
turns' differences).
"""
import os
import sys
import time

import torch
import torch.multiprocessing as mp

import gpuipc

WARM = 100
WORDS = 1024
TURN = 200  # round trips of a row's turn
SETTLE = 10  # round trips a turn leaves out first


def _stats(ts):
    ts = sorted(ts)
    return ts[len(ts) // 2] * 1e6, ts[min(len(ts) - 1, len(ts) * 99 // 100)] * 1e6


def _report(row, ts):
    med, p99 = _stats(ts)
    print(f"RESULT kloop_py {row} {med:.1f} {p99:.1f} {len(ts)}")
    print(f"{row:12s} median {med:8.1f} us  p99 {p99:8.1f} us  ({len(ts)} round trips)",
          flush=True)
    return med


class _OneProcess:
    """The torch work alone: .to() between the GPUs in place of a second
    process (made as every row is; it has no process to size by trips)."""

    def __init__(self, adev, bdev, trips):
        self.adev, self.bdev = adev, bdev
        self.base = torch.arange(WORDS, dtype=torch.int32, device=adev)
        self.bad = torch.zeros((), dtype=torch.int64, device=adev)

    def trip(self, i):
        x = self.base + i * 4096
        xb = x.to(self.bdev)
        ans = xb + 1
        back = ans.to(self.adev)
        self.bad += (back != x + 1).sum()
        torch.cuda.synchronize(self.adev)

    def check(self):
        assert int(self.bad) == 0, f"one_process: {int(self.bad)} wrong values"


def _gp_side_b(dom, bdev, n, ready):
    torch.cuda.set_device(bdev)
    inb = torch.empty(WORDS, dtype=torch.int32, device=bdev)
    torch.cuda.synchronize(bdev)
    with gpuipc.Domain(dom) as d, d.channel("kloop", timeout=120) as ch:
        ready.set()
        for _ in range(n):
            ch.recv_into(inb, timeout=120)
            ch.send(inb + 1)
        ch.recv(timeout=60).release()  # A's "done": every answer was read


class _Gpuipc:
    """Channel.send of the tensor (staged), Channel.recv_into a tensor of
    the receiver's GPU, both ways, with process B."""

    def __init__(self, adev, bdev, trips):
        self.dom = f"kloop{os.getpid()}"
        ctx = mp.get_context("spawn")
        ready = ctx.Event()
        self.p = ctx.Process(target=_gp_side_b,
                             args=(self.dom, bdev, trips, ready))
        self.p.start()
        self.base = torch.arange(WORDS, dtype=torch.int32, device=adev)
        self.back = torch.empty_like(self.base)
        self.bad = torch.zeros((), dtype=torch.int64, device=adev)
        self.adev = adev
        self.d = gpuipc.Domain(self.dom)
        self.ch = self.d.channel("kloop", timeout=120)
        ready.wait(120)

    def trip(self, i):
        x = self.base + i * 4096
        self.ch.send(x)
        self.ch.recv_into(self.back, timeout=60)
        self.bad += (self.back != x + 1).sum()
        torch.cuda.synchronize(self.adev)

    def check(self):
        self.ch.send(torch.zeros(1, dtype=torch.int32))
        self.p.join(120)
        self.ch.close()
        self.d.close()
        assert self.p.exitcode == 0, f"gpuipc side B exited {self.p.exitcode}"
        assert int(self.bad) == 0, f"gpuipc: {int(self.bad)} wrong values"


def _timed(row, i0, count, ts):
    for i in range(i0, i0 + count):
        t0 = time.perf_counter()
        row.trip(i)
        if i - i0 >= SETTLE:
            ts.append(time.perf_counter() - t0)


def by_turns(adev, bdev, n, rows):
    """The rows of @rows ({name: class}) by turns of TURN round trips, n
    measured in all each; their times, and each turn's median per row."""
    turns = max(1, -(-n // (TURN - SETTLE)))
    trips = WARM + turns * TURN
    made = {name: cls(adev, bdev, trips) for name, cls in rows.items()}
    ts = {name: [] for name in rows}
    meds = {name: [] for name in rows}
    for name, row in made.items():
        _timed(row, 0, WARM, [])  # warm-up, left out
    for k in range(turns):
        for name, row in made.items():
            got = []
            _timed(row, WARM + k * TURN, TURN, got)
            ts[name] += got
            meds[name].append(_stats(got)[0])
    for row in made.values():
        row.check()
    return ts, meds


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
    turned = {name: cls for name, cls in (("one_process", _OneProcess),
                                          ("gpuipc", _Gpuipc)) if name in rows}
    meds = {}
    if turned:
        ts, turn_meds = by_turns(adev, bdev, n, turned)
        for name in turned:
            meds[name] = _report(name, ts[name])
    if "torch_mp" in rows:
        meds["torch_mp"] = _report("torch_mp", torch_mp_row(adev, bdev, n))
    if "one_process" in meds and "gpuipc" in meds:
        diffs = sorted(g - o for g, o in zip(turn_meds["gpuipc"],
                                             turn_meds["one_process"]))
        print(f"RESULT kloop_py adds {meds['gpuipc'] - meds['one_process']:.1f} "
              f"{diffs[len(diffs) // 2]:.1f} {len(diffs)}")
        print(f"gpuipc adds {meds['gpuipc'] - meds['one_process']:.1f} us to "
              f"the one-process torch work (medians' difference; the median "
              f"of {len(diffs)} turns' differences: {diffs[len(diffs) // 2]:.1f}, "
              f"range {diffs[0]:.1f} .. {diffs[-1]:.1f})")


if __name__ == "__main__":
    main()
