"""One publisher, k readers on other GPUs: a state dict's sync beside NCCL.

  python3 python/bench/weights_readers.py [--readers 1,2,3] [--rounds 6]
          [--size 7b|1b] [--pub-gpu 0] [--rows gpuipc,shared,nccl_flat,nccl_tensor]
          [--chunk-mib N]

The publisher (this process, GPU --pub-gpu) holds a Llama-2-7B-shaped bf16
state dict (291 tensors, 13.48 GB; --size 1b: a ~1.24 B parameter one),
born in gpuipc.torch.mem_pool(). For each k in --readers it spawns k reader
processes on the next k GPUs, each with a state dict of the same shapes of
its own (in mem_pool too), and times, for each row, a sync from the
publisher's first call until every reader has the new values:

  gpuipc       Publisher(lend=True).publish + each reader's
               Reader.copy_into(target): every reader copies every byte
               from the publisher's GPU;
  shared       the same with copy_into(target, share=True): the readers
               share the copying (docs/shared-copy.md), each byte leaving
               the publisher's GPU about once;
  nccl_flat    torch.distributed NCCL broadcast of one flat bucket of all
               the bytes (publisher's bucket packed beforehand, untimed;
               the readers receive into a flat bucket of their own);
  nccl_tensor  NCCL broadcast of each tensor into the readers' tensors, the
               way RL frameworks sync weights.

Before every sync the publisher changes every element (int16 + 1, on its
stream); after it each reader checks two int64 sums of each tensor (all
elements, and a strided sample weighted by position) against the
publisher's, so a stale, misplaced or torn byte fails the run (exit 1).
The first round of a row is a warm-up (mappings, NCCL's channels); the
median of the later ones is printed with min and max, and each row's ratio
to nccl_flat and nccl_tensor.
Output: "RESULT readers <k> <row> median_ms min_ms max_ms GB/s" per row.
"""
import argparse
import os
import statistics
import sys
import time


def shapes_of(size):
    if size == "1b":
        h, inter, layers, vocab = 2048, 8192, 16, 128256
    else:
        h, inter, layers, vocab = 4096, 11008, 32, 32000
    out = [("embed", (vocab, h))]
    for i in range(layers):
        p = f"layers.{i}."
        out += [(p + n, (h, h)) for n in ("q", "k", "v", "o")]
        out += [(p + "gate", (inter, h)), (p + "up", (inter, h)), (p + "down", (h, inter)),
                (p + "in_norm", (h,)), (p + "post_norm", (h,))]
    out += [("norm", (h,)), ("lm_head", (vocab, h))]
    return out


def make_sd(size, dev, pool):
    import torch
    with torch.cuda.use_mem_pool(pool):
        return {n: torch.empty(s, dtype=torch.bfloat16, device=f"cuda:{dev}")
                for n, s in shapes_of(size)}


def sums(sd):
    """Per tensor: (sum of all int16 words, sum of a strided sample times
    its position), as one int64 tensor on the host."""
    import torch
    out = []
    for t in sd.values():
        w = t.view(-1).view(torch.int16)
        s = w[::4099]
        pos = torch.arange(1, s.numel() + 1, device=w.device, dtype=torch.int64)
        out.append(torch.stack([w.sum(dtype=torch.int64), (s.to(torch.int64) * pos).sum()]))
    return torch.stack(out).cpu()


def init_nccl(path, rank, world, dev):
    import datetime
    import torch
    import torch.distributed as dist
    dist.init_process_group("nccl", init_method=f"file://{path}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", dev),
                            timeout=datetime.timedelta(seconds=300))


def flat_views(flat, sd):
    out, off = {}, 0
    for k, t in sd.items():
        n = t.numel()
        out[k] = flat[off:off + n].view(t.shape)
        off += n
    return out


# ---- a reader (a process of its own) ---------------------------------------

def reader_main(rank, dev, args, conn, nccl_path, world):
    import traceback
    try:
        reader_loop(rank, dev, args, conn, nccl_path, world)
    except BaseException:
        conn.send(("error", f"reader {rank} (GPU {dev}):\n{traceback.format_exc()}"))


def reader_loop(rank, dev, args, conn, nccl_path, world):
    import torch
    import torch.distributed as dist
    import gpuipc
    import gpuipc.torch
    from gpuipc.state_dict import Reader
    torch.cuda.set_device(dev)
    pool = gpuipc.torch.mem_pool()
    mine = make_sd(args.size, dev, pool)
    flat = None
    if "nccl_flat" in args.rows:
        n = sum(t.numel() for t in mine.values())
        flat = torch.empty(n, dtype=torch.bfloat16, device=f"cuda:{dev}")
    init_nccl(nccl_path, rank, world, dev)
    with gpuipc.Domain(args.domain) as dom:
        reader = Reader(dom, "weights", device=dev)
        conn.send(("ready",))
        while True:
            msg = conn.recv()
            if msg[0] == "gpuipc":
                ver = reader.copy_into(mine, share=True, chunk_bytes=args.chunk_mib << 20) \
                    if msg[1] else reader.copy_into(mine)
                conn.send(("done", ver, time.monotonic()))
            elif msg[0] == "nccl_tensor":
                for t in mine.values():
                    dist.broadcast(t, src=0)
                torch.cuda.synchronize()
                conn.send(("done", None, time.monotonic()))
            elif msg[0] == "nccl_flat":
                dist.broadcast(flat, src=0)
                torch.cuda.synchronize()
                conn.send(("done", None, time.monotonic()))
            elif msg[0] == "sums":
                conn.send(("sums", sums(flat_views(flat, mine) if msg[1] else mine)))
            elif msg[0] == "stop":
                break
        reader.close()
    dist.destroy_process_group()  # collective: the publisher destroys its own
    conn.send(("stopped",))


# ---- the publisher ----------------------------------------------------------

class Readers:
    def __init__(self, args, k, nccl_path):
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        self.procs, self.conns = [], []
        gpus = [g for g in range(args.ngpus) if g != args.pub_gpu][:k]
        for rank, dev in enumerate(gpus, start=1):
            ours, theirs = ctx.Pipe()
            p = ctx.Process(target=reader_main, args=(rank, dev, args, theirs, nccl_path, k + 1))
            p.start()
            self.procs.append(p)
            self.conns.append(ours)
        self.gpus = gpus

    def send(self, *msg):
        for c in self.conns:
            c.send(msg)

    def replies(self, want, timeout=300):
        out = []
        for rank, (p, c) in enumerate(zip(self.procs, self.conns), start=1):
            if not c.poll(timeout):
                raise RuntimeError(f"reader {rank}: no {want!r} in {timeout} s")
            msg = c.recv()
            if msg[0] == "error":
                raise RuntimeError(msg[1])
            if msg[0] != want:
                raise RuntimeError(f"reader {rank} answered {msg[0]!r}, not {want!r}")
            out.append(msg[1:])
        return out

    def kill(self):
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()


def run_k(args, k, sd, flat, pub, nccl_path):
    import torch
    import torch.distributed as dist
    readers = Readers(args, k, nccl_path)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    try:
        init_nccl(nccl_path, 0, k + 1, args.pub_gpu)
        readers.replies("ready")
        print(f"-- {k} reader(s) on GPUs {readers.gpus}, publisher on GPU {args.pub_gpu}",
              flush=True)
        base = {}
        for row in args.rows:
            ts = []
            for r in range(args.rounds):
                for t in sd.values():
                    t.view(torch.int16).add_(1)  # every element changes
                if row == "nccl_flat":
                    torch.cat([t.view(-1) for t in sd.values()], out=flat)
                torch.cuda.synchronize()
                t0 = time.monotonic()
                if row in ("gpuipc", "shared"):
                    ver = pub.publish(sd)
                    readers.send("gpuipc", row == "shared")
                    got = readers.replies("done")
                    if {g[0] for g in got} != {ver}:
                        raise RuntimeError(f"{row}: readers copied versions "
                                           f"{[g[0] for g in got]}, not {ver}")
                else:
                    readers.send(row)
                    for t in ([flat] if row == "nccl_flat" else sd.values()):
                        dist.broadcast(t, src=0)
                    got = readers.replies("done")
                ts.append((max(g[1] for g in got) - t0) * 1e3)
                want = sums(sd)
                readers.send("sums", row == "nccl_flat")
                for i, (s,) in enumerate(readers.replies("sums"), start=1):
                    if not torch.equal(s, want):
                        bad = (s != want).any(dim=1).nonzero().flatten().tolist()
                        names = list(sd)
                        raise RuntimeError(f"{row} round {r}: reader {i} differs in "
                                           f"{len(bad)} tensors, first {names[bad[0]]}")
            later = ts[1:]
            med = statistics.median(later)
            base[row] = med
            print(f"RESULT readers {k} {row} {med:.2f} {min(later):.2f} {max(later):.2f} "
                  f"{nbytes / med / 1e6:.1f}")
            print(f"  {row:<12} median {med:8.2f} ms (min {min(later):.2f}, max "
                  f"{max(later):.2f}; first {ts[0]:.1f}), {nbytes / med / 1e6:7.1f} GB/s a "
                  "reader, values checked", flush=True)
        for row in ("gpuipc", "shared"):
            for b in ("nccl_flat", "nccl_tensor"):
                if row in base and b in base:
                    print(f"  ratio {row} / {b}: {base[row] / base[b]:.2f}")
        readers.send("stop")
        dist.destroy_process_group()
        readers.replies("stopped")
    finally:
        readers.kill()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--readers", default="1,2,3")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--size", choices=("7b", "1b"), default="7b")
    p.add_argument("--pub-gpu", type=int, default=0)
    p.add_argument("--rows", default="nccl_flat,nccl_tensor,gpuipc,shared")
    p.add_argument("--chunk-mib", type=int, default=0,
                   help="shared: the chunk of the sharing in MiB (0: the library's)")
    a = p.parse_args()
    a.rows = a.rows.split(",")
    a.readers = [int(x) for x in a.readers.split(",")]
    if a.rounds < 2:
        p.error("--rounds must be at least 2 (the first is a warm-up)")
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    import torch
    import gpuipc
    import gpuipc.torch
    from gpuipc.state_dict import Publisher
    a.ngpus = torch.cuda.device_count()
    if max(a.readers) > a.ngpus - 1:
        p.error(f"{max(a.readers)} readers need {max(a.readers) + 1} GPUs, {a.ngpus} here")
    a.domain = f"wreaders{os.getpid()}"
    torch.cuda.set_device(a.pub_gpu)
    pool = gpuipc.torch.mem_pool()
    sd = make_sd(a.size, a.pub_gpu, pool)
    g = torch.Generator(device=f"cuda:{a.pub_gpu}").manual_seed(0)
    for t in sd.values():
        t.normal_(generator=g)
    n = sum(t.numel() for t in sd.values())
    flat = None
    if "nccl_flat" in a.rows:
        flat = torch.empty(n, dtype=torch.bfloat16, device=f"cuda:{a.pub_gpu}")
    print(f"state dict: {len(sd)} tensors, {n * 2 / 1e9:.2f} GB bf16, in gpuipc memory "
          f"(mem_pool) on GPU {a.pub_gpu}; {torch.cuda.get_device_name(a.pub_gpu)}",
          flush=True)
    import tempfile
    with gpuipc.Domain(a.domain) as dom, Publisher(dom, "weights", lend=True) as pub:
        for k in a.readers:
            with tempfile.TemporaryDirectory(prefix="wreaders") as tmp:
                run_k(a, k, sd, flat, pub, os.path.join(tmp, "nccl"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
