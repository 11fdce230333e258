"""gpuipc from Python against torch.multiprocessing, on one GPU machine.

  python3 python/bench/bench_py.py rtt        # 4 KiB round trip
  python3 python/bench/bench_py.py weights    # Llama-2-7B-shaped state dict
  python3 python/bench/bench_py.py all
  python3 python/bench/bench_py.py snapshot [N]  # N snapshot versions in a row

rtt: a 4 KiB tensor goes to a peer and back, N times, each timed: gpuipc
Channel (HOST kind, and CUDA when a GPU is there) vs a torch.multiprocessing
queue pair; median, p99 and mean of each.
weights: 291 bf16 tensors (13.48 GB) from one process to another on GPU 0,
first and later syncs: torch.multiprocessing per-tensor handles and a
hand-made bucket (zero-copy and copied), gpuipc's state_dict as snapshots
and lent from gpuipc.torch.mem_pool() (zero-copy and copied) or from a
model moved with gpuipc.torch.move_to_gpuipc(), and a one-process copy_
as the floor. Each sync is timed twice: until the
receiver has the weights (its time.monotonic() when done, against the
sender's start: CLOCK_MONOTONIC, one clock for every process of the
machine), and until the sender has heard so (the reply's wake-up
included: a process asleep for milliseconds wakes in 0.1-0.5 ms)."""
import os
import sys
import time

import torch
import torch.multiprocessing as mp

import gpuipc

N_RTT = 2000
ROUNDS = 5  # syncs per mode: the first, then the median of the later ones


def llama_shapes():
    shapes = [("embed", (32000, 4096))]
    for i in range(32):
        p = f"layers.{i}."
        shapes += [(p + n, (4096, 4096)) for n in ("q", "k", "v", "o")]
        shapes += [(p + "gate", (11008, 4096)), (p + "up", (11008, 4096)),
                   (p + "down", (4096, 11008)), (p + "in_norm", (4096,)),
                   (p + "post_norm", (4096,))]
    shapes += [("norm", (4096,)), ("lm_head", (32000, 4096))]
    assert len(shapes) == 291
    return shapes


def make_sd(device="cuda"):
    return {n: torch.empty(s, dtype=torch.bfloat16, device=device).normal_()
            for n, s in llama_shapes()}


# ---- round trip ------------------------------------------------------------

def _gp_echo(dom, cuda, n):
    with gpuipc.Domain(dom) as d, d.channel("rtt", timeout=60) as ch:
        for _ in range(n + 100):
            with ch.recv(timeout=60) as v:
                ch.send(v)


def rtt_gpuipc(cuda):
    dom = f"rtt{os.getpid()}{int(cuda)}"
    p = mp.get_context("spawn").Process(target=_gp_echo, args=(dom, cuda, N_RTT))
    p.start()
    ts = []
    with gpuipc.Domain(dom) as d, d.channel("rtt", timeout=60) as ch:
        x = torch.zeros(1024, dtype=torch.float32, device="cuda" if cuda else "cpu")
        for i in range(N_RTT + 100):
            t0 = time.perf_counter()
            ch.send(x)
            ch.recv(timeout=60).release()
            ts.append(time.perf_counter() - t0)
    p.join()
    return _stats(ts[100:])


def _stats(ts):
    """Round trips in seconds as (median, p99, mean) in microseconds."""
    ts = sorted(ts)
    return (1e6 * ts[len(ts) // 2], 1e6 * ts[len(ts) * 99 // 100],
            1e6 * sum(ts) / len(ts))


def _mp_echo(q_in, q_out, n):
    # stays until told: the last tensor's fd is fetched from this process.
    # torch.multiprocessing refuses to send on a CUDA tensor it received, so
    # the echo answers with a CUDA tensor of its own, as a user would.
    own = None
    for x in iter(q_in.get, None):
        if x.is_cuda:
            if own is None:
                own = torch.empty_like(x)
            x = own
        q_out.put(x)


def rtt_mp(cuda):
    ctx = mp.get_context("spawn")
    q1, q2 = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_mp_echo, args=(q1, q2, N_RTT))
    p.start()
    x = torch.zeros(1024, dtype=torch.float32, device="cuda" if cuda else "cpu")
    ts = []
    for i in range(N_RTT + 100):
        t0 = time.perf_counter()
        q1.put(x)
        q2.get()
        ts.append(time.perf_counter() - t0)
    q1.put(None)
    p.join()
    return _stats(ts[100:])


def bench_rtt():
    modes = [False] + ([True] if torch.cuda.is_available() else [])
    for cuda in modes:
        dev = "cuda" if cuda else "cpu"
        g, m = rtt_gpuipc(cuda), rtt_mp(cuda)
        print(f"rtt 4KiB {dev}, us median / p99 (mean): gpuipc {g[0]:.1f} / {g[1]:.1f} "
              f"({g[2]:.1f})   torch.multiprocessing {m[0]:.1f} / {m[1]:.1f} ({m[2]:.1f})"
              f"   ratio of medians {m[0] / g[0]:.0f}x", flush=True)


# ---- weights -----------------------------------------------------------------

def _sync_secs(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def _warm_cuda(done=None):
    """A receiver as a serving process is: CUDA up before the first sync
    (then says so on ``done``)."""
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    if done is not None:
        done.put("ready")


def _mp_receiver(q, done, rounds):
    _warm_cuda(done)
    dst = None
    for r in range(rounds):
        sd = q.get()
        if dst is None:
            dst = {k: torch.empty_like(v) for k, v in sd.items()}
        for k, v in sd.items():
            dst[k].copy_(v, non_blocking=True)
        torch.cuda.synchronize()
        del sd
        done.put(time.monotonic())


def _first_later(out):
    """(the first sync, the median of the later ones)."""
    later = sorted(out[1:])
    return out[0], later[len(later) // 2]


def weights_mp(sd, rounds=ROUNDS):
    return _mp_rounds(_mp_receiver, (rounds,), sd, rounds)


def _mp_rounds(receiver, args, what, rounds):
    """Time ``rounds`` hand-overs of ``what`` through a torch.multiprocessing
    queue to ``receiver(q, done, *args)``, which says when it is ready and
    when each round is done."""
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=receiver, args=(q, done) + tuple(args))
    p.start()
    done.get()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        t0 = time.monotonic()
        q.put(what)
        at = done.get()
        out.append((at - t0, time.monotonic() - t0))
    p.join()
    return out


def _views(flat, shapes):
    out, off = {}, 0
    for n, shp in shapes:
        k = 1
        for x in shp:
            k *= x
        out[n] = flat[off:off + k].view(shp)
        off += k
    return out


def _mp_bucket_receiver(q, done, copy, rounds):
    _warm_cuda(done)
    dst = None
    for _ in range(rounds):
        flat = q.get()  # the second time torch finds the handle open
        if copy:
            if dst is None:
                dst = torch.empty_like(flat)
            dst.copy_(flat)
            torch.cuda.synchronize()
        else:
            sd = _views(flat, llama_shapes())  # the 291 tensors, zero-copy
            del sd
        del flat
        done.put(time.monotonic())


def weights_mp_bucket(sd, copy, rounds=ROUNDS):
    """A hand-made bucket: the sender concatenates (not timed, as if its
    weights lived there), one handle crosses, the receiver cuts views or
    copies the bucket into one of its own (allocated the first time)."""
    flat = torch.cat([v.reshape(-1) for v in sd.values()])
    out = _mp_rounds(_mp_bucket_receiver, (copy, rounds), flat, rounds)
    del flat
    return out


def _gp_sd_receiver(dom, rounds, copy):
    from gpuipc import state_dict
    with gpuipc.Domain(dom) as d, state_dict.Reader(d, "w", device=0) as rd, \
            d.channel("go", timeout=600) as ch:
        _warm_cuda()
        # A reader's own tensors are there before its first sync (a rollout
        # worker has its model): allocated untimed, of the shapes the
        # publisher's make_sd gives.
        dst = ({n: torch.empty(s, dtype=torch.bfloat16, device="cuda")
                for n, s in llama_shapes()} if copy else None)
        torch.cuda.synchronize()
        ch.recv(timeout=600).release()  # the channel warmed up before timing
        ch.send(torch.zeros(1))
        for r in range(rounds):
            ch.recv(timeout=600).release()
            t0 = time.monotonic()
            if copy:
                rd.copy_into(dst)
            else:
                with rd.open() as sd:
                    assert len(sd) == 291
            t1 = time.monotonic()
            ch.send(torch.tensor([t1 - t0, t1], dtype=torch.float64))


def weights_gpuipc(sd, copy, lend, rounds=ROUNDS):
    """gpuipc's state_dict, Publisher and Reader kept between syncs. Without
    ``lend`` each version is a snapshot (the tensors are copied into a new
    segment); with it, the tensors (born in gpuipc.torch.mem_pool()) are
    lent in place. The receiver opens 291 zero-copy tensors, or copies into
    tensors of its own (allocated before the first round, untimed)."""
    from gpuipc import state_dict
    dom = f"w{os.getpid()}{int(copy)}{int(lend)}"
    p = mp.get_context("spawn").Process(target=_gp_sd_receiver,
                                        args=(dom, rounds, copy))
    p.start()
    out, parts = [], []
    with gpuipc.Domain(dom) as d, state_dict.Publisher(d, "w", lend=lend) as pub, \
            d.channel("go", timeout=600) as ch:
        ch.send(torch.zeros(1))
        ch.recv(timeout=600).release()
        for r in range(rounds):
            torch.cuda.synchronize()
            t0 = time.monotonic()
            pub.publish(sd)
            t1 = time.monotonic()
            ch.send(torch.zeros(1))
            with ch.recv(timeout=600) as v:
                took, at = torch.from_dlpack(v).tolist()
            out.append((at - t0, time.monotonic() - t0))
            parts.append(f"{1e3 * (t1 - t0):.1f}/{1e3 * took:.1f}")
        segs = len(pub.segments())
    p.join()
    print(f"   publish/receiver ms by round: {' '.join(parts)}; {segs} segments",
          flush=True)
    return out


def _copy_floor(sd):
    """The median time of a one-process copy_ of ``sd`` into tensors of its own."""
    dst = {k: torch.empty_like(v) for k, v in sd.items()}

    def copy_all():
        for k, v in sd.items():
            dst[k].copy_(v, non_blocking=True)
    ts = sorted(_sync_secs(copy_all) for _ in range(ROUNDS))
    return ts[len(ts) // 2]


def _row(what, out, t, copied):
    """Prints one mode's first and later syncs; ``t`` is the copy floor."""
    (a, b), (c, d) = (_first_later([o[i] for o in out]) for i in (0, 1))
    ratio = f"; later, copy_ floor / sync {t / b:.2f} ({t / d:.2f} with the reply)" if copied else ""
    print(f"{what}: first {a:.4f} s, later {b:.4f} s at the receiver (first / later "
          f"{a / b:.2f}); with the reply {c:.4f} / {d:.4f} s{ratio}", flush=True)


def bench_weights():
    sd = make_sd()
    total = sum(v.numel() * v.element_size() for v in sd.values())
    print(f"state dict: {len(sd)} tensors, {total / 1e9:.2f} GB; {ROUNDS} syncs a mode: "
          "the first, then the median of the others", flush=True)
    t = _copy_floor(sd)
    print(f"one-process copy_ (floor), median of {ROUNDS}: {t:.4f} s  "
          f"{total / t / 1e9:.1f} GB/s", flush=True)
    torch.cuda.empty_cache()

    def row(what, out, copied=False):
        _row(what, out, t, copied)

    row("torch.multiprocessing per-tensor handles (copied)", weights_mp(sd), True)
    torch.cuda.empty_cache()
    for copy in (False, True):
        out = weights_mp_bucket(sd, copy)
        torch.cuda.empty_cache()  # the bucket's memory, cached by PyTorch
        row(f"torch.multiprocessing one bucket, {'copied' if copy else 'zero-copy'}", out, copy)
    for copy in (False, True):
        row(f"gpuipc state_dict snapshot, {'copied' if copy else 'zero-copy'} "
            f"(publish + {'copy_into' if copy else 'open'})",
            weights_gpuipc(sd, copy, lend=False), copy)
    # The same weights born in gpuipc memory, as a trainer's would be: in a
    # pool of large chunks (the default), and a buffer per block.
    from gpuipc import torch as gt
    for chunk in (2 << 30, 0):
        pool = gt.mem_pool(chunk_bytes=chunk)
        with torch.cuda.use_mem_pool(pool):
            lent = {k: v.clone() for k, v in sd.items()}
        how = "chunked pool" if chunk else "a buffer per block"
        for copy in ((False, True) if chunk else (False,)):
            row(f"gpuipc state_dict lent ({how}), {'copied' if copy else 'zero-copy'} "
                f"(publish + {'copy_into' if copy else 'open'})",
                weights_gpuipc(lent, copy, lend=True), copy)
        del lent, pool
        torch.cuda.empty_cache()
    bench_moved(sd, t)


def bench_moved(sd=None, t=None):
    """The weights as a model PyTorch's allocator made, moved into gpuipc
    memory in place (one buffer), then lent: the first sync against later
    ones."""
    from gpuipc import torch as gt
    if sd is None:
        sd = make_sd()
        t = _copy_floor(sd)
        torch.cuda.empty_cache()

    def row(what, out, copied=False):
        _row(what, out, t, copied)
    model = torch.nn.Module()
    for i, (k, v) in enumerate(sd.items()):
        model.register_parameter(f"p{i}", torch.nn.Parameter(v.clone(), requires_grad=False))
    gt.move_to_gpuipc(model)
    torch.cuda.empty_cache()
    moved = dict(zip(sd, model.parameters()))
    for copy in (False, True):
        row(f"gpuipc state_dict lent (move_to_gpuipc), {'copied' if copy else 'zero-copy'} "
            f"(publish + {'copy_into' if copy else 'open'})",
            weights_gpuipc(moved, copy, lend=True), copy)
    del moved, model
    torch.cuda.empty_cache()


def bench_snapshot(versions=20):
    """Snapshots of tensors PyTorch's allocator made, same GPU: ``versions``
    publish + copy_into in a row, against the floor of the same work in one
    process (a copy_ of the publisher's bytes into a buffer of its own and
    a copy_ from there into the reader's tensors: twice the one-process
    copy), and the GPU's free memory before and after (no growth: the
    publisher reuses its copies' segments once no reader holds them)."""
    sd = make_sd()
    total = sum(v.numel() * v.element_size() for v in sd.values())
    t = _copy_floor(sd)
    torch.cuda.empty_cache()
    free0 = torch.cuda.mem_get_info()[0]
    out = weights_gpuipc(sd, True, lend=False, rounds=versions)
    torch.cuda.empty_cache()
    free1 = torch.cuda.mem_get_info()[0]
    later = sorted(o[0] for o in out[1:])
    med = later[len(later) // 2]
    print(f"snapshot, same GPU, {versions} versions of {total / 1e9:.2f} GB: first "
          f"{out[0][0]:.4f} s, later median {med:.4f} s (min {later[0]:.4f}, max "
          f"{later[-1]:.4f}); floor 2 x one-process copy_ {2 * t:.4f} s; ratio "
          f"{med / (2 * t):.2f}; GPU free memory {free0 / 2**30:.2f} GiB before, "
          f"{free1 / 2**30:.2f} GiB after", flush=True)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    if what == "snapshot":
        bench_snapshot(int(sys.argv[2]) if len(sys.argv) > 2 else 20)
    if what in ("rtt", "all"):
        bench_rtt()
    if what in ("weights", "all"):
        bench_weights()
    if what == "moved":
        bench_moved()
