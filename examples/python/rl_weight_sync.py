"""RL weight sync with gpuipc: a trainer and K rollout workers.

The trainer (this process) and K worker processes (started here, with
multiprocessing's spawn) each hold the same Llama model, built from a
config with random weights (nothing is downloaded). Each step:

  1. the trainer takes a real optimizer step (forward + backward on random
     token ids, AdamW);
  2. it publishes its weights through gpuipc and every worker copies them
     into its own model (timed: publish until every worker's copy is done);
  3. every worker runs a forward on one fixed batch and the trainer checks
     that the workers' logits equal its own, bit for bit;
  4. the baseline RL frameworks use (NCCL broadcast of each tensor of the
     state dict, through torch.distributed) sends the same weights (timed).

The gpuipc side is four calls:

  trainer:  gpuipc.torch.move_to_gpuipc(model)           # once: weights in gpuipc memory
            pub = gpuipc.state_dict.Publisher(dom, "weights", lend=True)
            pub.publish(model.state_dict())              # each step: lent, no copy
  worker:   reader = gpuipc.state_dict.Reader(dom, "weights", device=gpu)
            reader.copy_into(my_model.state_dict())      # each step

Run (needs PyTorch with CUDA, transformers, the gpuipc package):

  python3 rl_weight_sync.py --workers 3 --trainer-gpu 0 --worker-gpus 1,2,3
  python3 rl_weight_sync.py --size tiny --workers 2 --worker-gpus 0,0

With --share the workers share the copying (Reader.copy_into(share=True):
each byte leaves the trainer's GPU about once, the rest moves between the
workers; their own models are moved into gpuipc memory for that).
Several workers may share a GPU, and a worker may sit on the trainer's GPU;
NCCL refuses two ranks on one GPU, so the baseline is skipped then.
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (as verl, SGLang and vLLM
run PyTorch) works too: move_to_gpuipc takes the weights out of it.
Exit status: 0 when every worker's logits equalled the trainer's, 1 when
they did not (or a worker failed), 2 for bad flags or a missing package.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
import traceback

# Model sizes: "tiny" for tests, "1b" like Llama 3.2 1B (1.24 B parameters).
SIZES = {
    "tiny": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=1024,
                 tie_word_embeddings=False),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
               tie_word_embeddings=True),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Sync a trainer's weights to K rollout workers through gpuipc "
                    "(state_dict.Publisher(lend=True) + Reader.copy_into), check the "
                    "workers' logits, and time it against NCCL per-tensor broadcast.")
    p.add_argument("--workers", type=int, default=2, help="rollout worker processes (K)")
    p.add_argument("--trainer-gpu", type=int, default=0, help="the trainer's GPU")
    p.add_argument("--worker-gpus", default=None,
                   help="comma-separated GPU of each worker (default: 1..K, or the "
                        "trainer's GPU when there is only one); a GPU may repeat")
    p.add_argument("--size", choices=sorted(SIZES), default="tiny",
                   help="model preset: tiny (tests) or 1b (~1.24 B parameters, benchmark)")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps, each followed "
                   "by a sync (the first is a warm-up, left out of the medians)")
    p.add_argument("--batch", type=int, default=2, help="training batch (sequences)")
    p.add_argument("--seq", type=int, default=128, help="training sequence length")
    p.add_argument("--share", action="store_true",
                   help="the workers share the copying (Reader.copy_into(share=True)): "
                        "each byte leaves the trainer's GPU about once, the rest "
                        "moves between the workers; their models are moved into "
                        "gpuipc memory first")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the NCCL per-tensor broadcast baseline")
    p.add_argument("--atol", type=float, default=0.0,
                   help="largest |trainer - worker| logit difference accepted (default "
                        "0: bitwise equal, as same weights on the same kind of GPU give)")
    p.add_argument("--domain", default=None, help="gpuipc domain name (default: one "
                   "of this run's own)")
    p.add_argument("--reply-timeout", type=float, default=600,
                   help="seconds to wait for a worker's answer (and for NCCL); past "
                        "it every process prints where its threads are and the run "
                        "fails")
    a = p.parse_args(argv)
    if a.workers < 1:
        p.error("--workers must be at least 1")
    if a.reply_timeout <= 0:
        p.error("--reply-timeout must be positive")
    if a.steps < 2:
        p.error("--steps must be at least 2 (the first is a warm-up)")
    if a.worker_gpus is None:
        a.gpus = None  # chosen once CUDA is known (default_gpus)
    else:
        try:
            a.gpus = [int(x) for x in a.worker_gpus.split(",")]
        except ValueError:
            p.error(f"--worker-gpus {a.worker_gpus!r}: not a comma-separated list of ints")
        if len(a.gpus) != a.workers:
            p.error(f"--worker-gpus names {len(a.gpus)} GPUs for {a.workers} workers")
        if min(a.gpus + [a.trainer_gpu]) < 0:
            p.error("GPU ordinals are >= 0")
    return a


def die(msg):
    """Bad flags or a missing package: say so, exit 2."""
    print(f"rl_weight_sync: {msg}", file=sys.stderr)
    sys.exit(2)


def need_packages():
    """torch (with CUDA) and transformers, or a clear message and exit 2."""
    try:
        import torch
    except ImportError as e:
        die(f"needs PyTorch ({e})")
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        die(f"needs transformers (pip install transformers): {e}")
    if not torch.cuda.is_available():
        die("needs a CUDA GPU (torch.cuda.is_available() is False)")


def build_model(size, gpu, seed):
    """A LlamaForCausalLM of preset ``size`` with random weights, bf16, on ``gpu``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(max_position_embeddings=4096, **SIZES[size])
    with torch.device("cuda", gpu):
        model = LlamaForCausalLM(config)
    return model.to(torch.bfloat16)


def unique(sd):
    """``sd`` without the second name of a tied tensor (lm_head.weight is
    embed_tokens.weight in the 1b preset): each tensor is sent once."""
    seen, out = set(), {}
    for k, t in sd.items():
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            out[k] = t
    return out


def fixed_batch(vocab, gpu):
    """The batch every process runs its logits check on: the same ids everywhere."""
    import torch
    g = torch.Generator().manual_seed(1234)
    return torch.randint(vocab, (2, 32), generator=g).to(f"cuda:{gpu}")


def logits_of(model, ids):
    import torch
    with torch.no_grad():
        out = model(input_ids=ids).logits
    torch.cuda.synchronize()
    return out


def nccl_broadcast(sd):
    """The baseline: every tensor of ``sd`` broadcast from rank 0, one call each."""
    import torch
    import torch.distributed as dist
    for t in sd.values():
        dist.broadcast(t, src=0)
    torch.cuda.synchronize()


# ---- a rollout worker (a process of its own) ------------------------------

def worker_main(rank, gpu, args, conn, nccl_file):
    """Worker ``rank`` (1..K) on ``gpu``: answers the trainer's requests on
    ``conn`` until "stop"; any failure goes back as ("error", text). On
    SIGUSR1 (the trainer gave up waiting) it prints where its threads are."""
    import faulthandler
    import signal
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        worker_loop(rank, gpu, args, conn, nccl_file)
    except BaseException:
        conn.send(("error", f"worker {rank} (GPU {gpu}):\n{traceback.format_exc()}"))


def worker_loop(rank, gpu, args, conn, nccl_file):
    import torch
    import gpuipc
    from gpuipc.state_dict import Reader
    torch.cuda.set_device(gpu)
    model = build_model(args.size, gpu, seed=100 + rank).eval()  # other weights than the trainer's
    if args.share:
        import gpuipc.torch
        gpuipc.torch.move_to_gpuipc(model)  # the others read this worker's copy
    mine = unique(model.state_dict())
    ids = fixed_batch(model.config.vocab_size, gpu)
    conn.send(("built",))
    if nccl_file is not None:
        init_nccl(nccl_file, rank, args.workers + 1, gpu, args.reply_timeout)
    with gpuipc.Domain(args.domain) as dom:
        reader = Reader(dom, "weights", device=gpu)
        conn.send(("ready",))
        while True:
            msg = conn.recv()
            if msg[0] == "sync":
                conn.send(("synced", reader.copy_into(mine, share=args.share)))
            elif msg[0] == "logits":
                conn.send(("logits", logits_of(model, ids).cpu()))
            elif msg[0] == "nccl":
                nccl_broadcast(mine)
                conn.send(("nccl_done",))
            elif msg[0] == "stop":
                break
        reader.close()
    if nccl_file is not None:
        # collective: returns once the trainer destroys its group too
        torch.distributed.destroy_process_group()
    conn.send(("stopped",))


def init_nccl(path, rank, world, gpu, timeout):
    import datetime
    import torch
    import torch.distributed as dist
    dist.init_process_group("nccl", init_method=f"file://{path}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", gpu),
                            timeout=datetime.timedelta(seconds=timeout))


# ---- the trainer ------------------------------------------------------------

class Workers:
    """The worker processes and their pipes."""

    def __init__(self, args, nccl_file):
        import multiprocessing as mp
        self.timeout = args.reply_timeout
        ctx = mp.get_context("spawn")
        self.procs, self.conns = [], []
        for rank, gpu in enumerate(args.gpus, start=1):
            ours, theirs = ctx.Pipe()
            p = ctx.Process(target=worker_main, args=(rank, gpu, args, theirs, nccl_file),
                            name=f"worker{rank}")
            p.start()
            self.procs.append(p)
            self.conns.append(ours)

    def send(self, *msg):
        for c in self.conns:
            c.send(msg)

    def replies(self, want):
        """One reply of kind ``want`` from each worker, in rank order;
        RuntimeError with the worker's traceback when one failed or died."""
        out = []
        for rank, (p, c) in enumerate(zip(self.procs, self.conns), start=1):
            deadline = time.monotonic() + self.timeout
            while not c.poll(0.1):
                if not p.is_alive() and not c.poll(0):
                    raise RuntimeError(f"worker {rank} died (exit code {p.exitcode})")
                if time.monotonic() > deadline:
                    self.dump()
                    raise RuntimeError(f"worker {rank}: no answer to {want!r} in "
                                       f"{self.timeout:g} s (stacks above)")
            msg = c.recv()
            if msg[0] == "error":
                raise RuntimeError(msg[1])
            if msg[0] != want:
                raise RuntimeError(f"worker {rank} answered {msg[0]!r}, not {want!r}")
            out.append(msg[1] if len(msg) > 1 else None)
        return out

    def dump(self):
        """Every live worker, then the trainer, prints where its threads are."""
        import faulthandler
        import signal
        for p in self.procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGUSR1)
        time.sleep(1)
        faulthandler.dump_traceback(all_threads=True)

    def stop(self):
        """Make sure every worker is gone (after a failure: ask, then kill)."""
        for p, c in zip(self.procs, self.conns):
            if p.is_alive():
                try:
                    c.send(("stop",))
                except OSError:
                    pass  # it is on its way out
        for p in self.procs:
            p.join(60)
            if p.is_alive():
                p.kill()
                p.join()


def default_gpus(args):
    import torch
    n = torch.cuda.device_count()
    bad = [g for g in (args.gpus or []) + [args.trainer_gpu] if g >= n]
    if bad:
        die(f"GPU {bad[0]} does not exist ({n} visible)")
    if args.gpus is None:
        others = [g for g in range(n) if g != args.trainer_gpu] or [args.trainer_gpu]
        args.gpus = [others[i % len(others)] for i in range(args.workers)]


def train_step(model, opt, args):
    import torch
    model.train()
    ids = torch.randint(model.config.vocab_size, (args.batch, args.seq),
                        device=next(model.parameters()).device)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    model.eval()
    torch.cuda.synchronize()
    return float(loss)


def check_logits(want, got, atol):
    """Failures (text) of the workers whose logits differ from ``want``."""
    import torch
    bad = []
    for rank, g in enumerate(got, start=1):
        if torch.equal(want, g):
            continue
        diff = (want.float() - g.float()).abs().max().item()
        if diff > atol:
            bad.append(f"worker {rank}: logits differ from the trainer's (max |diff| "
                       f"{diff:.3g} > --atol {atol})")
    return bad


def main(argv=None):
    args = parse_args(argv)
    need_packages()
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast off (inherited by the workers)
    import torch
    import gpuipc
    import gpuipc.torch
    from gpuipc.state_dict import Publisher
    default_gpus(args)
    args.domain = args.domain or f"rlsync{os.getpid()}"
    baseline = not args.no_baseline
    if baseline and len(set(args.gpus + [args.trainer_gpu])) < args.workers + 1:
        print("baseline skipped: NCCL needs a GPU of its own for each process "
              f"(trainer GPU {args.trainer_gpu}, workers {args.gpus})")
        baseline = False

    torch.cuda.set_device(args.trainer_gpu)
    model = build_model(args.size, args.trainer_gpu, seed=0)
    gpuipc.torch.move_to_gpuipc(model)  # once: the weights now live in gpuipc memory
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sd = unique(model.state_dict())
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    print(f"model {args.size}: {sum(t.numel() for t in sd.values()) / 1e9:.3f} B "
          f"parameters, {len(sd)} tensors, {nbytes / 2**30:.2f} GiB bf16; trainer on "
          f"GPU {args.trainer_gpu}, workers on GPUs {args.gpus}", flush=True)
    ids = fixed_batch(model.config.vocab_size, args.trainer_gpu)

    tmp = tempfile.TemporaryDirectory(prefix="rlsync")
    nccl_file = os.path.join(tmp.name, "nccl_init") if baseline else None
    with gpuipc.Domain(args.domain) as dom, \
            Publisher(dom, "weights", lend=True) as pub:
        workers = Workers(args, nccl_file)
        try:
            workers.replies("built")  # every worker's model is made
            if baseline:
                import faulthandler
                faulthandler.dump_traceback_later(args.reply_timeout)  # stuck joining
                init_nccl(nccl_file, 0, args.workers + 1, args.trainer_gpu,
                          args.reply_timeout)
                faulthandler.cancel_dump_traceback_later()
            workers.replies("ready")  # every worker built, joined and waiting
            times, bad = run_steps(model, opt, sd, pub, workers, ids, args, baseline)
            workers.send("stop")
            if baseline:
                # NCCL's teardown is collective: every rank destroys its
                # group before any waits for the others to have stopped
                torch.distributed.destroy_process_group()
            workers.replies("stopped")
        except RuntimeError as e:
            print(f"rl_weight_sync: {e}", file=sys.stderr)
            abort_nccl()
            return 1
        finally:
            workers.stop()
    tmp.cleanup()
    report(times, nbytes)
    if bad:
        print("FAIL: " + "; ".join(bad), file=sys.stderr)
        return 1
    print(f"OK: after each of {args.steps} syncs, every worker's logits equalled the "
          "trainer's" + (" bit for bit" if args.atol == 0 else f" (within {args.atol})"))
    return 0


def abort_nccl():
    """After a failure: drop the NCCL group without the collective
    teardown, which would wait for workers that failed or are gone."""
    import torch.distributed as dist
    if not dist.is_initialized():
        return
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort is not None:
        abort()


def run_steps(model, opt, sd, pub, workers, ids, args, baseline):
    """The steps: train, sync through gpuipc (timed), check logits, then the
    baseline (timed). Returns ({"gpuipc": [ms], "nccl_per_tensor": [ms]},
    the logit failures)."""
    times = {"gpuipc": [], "nccl_per_tensor": []}
    bad = []
    for step in range(args.steps):
        loss = train_step(model, opt, args)

        t0 = time.perf_counter()
        pub.publish(sd)  # lent: names the trainer's own memory, copies nothing
        workers.send("sync")
        versions = workers.replies("synced")  # each worker's copy_into is done
        times["gpuipc"].append((time.perf_counter() - t0) * 1e3)
        if set(versions) != {pub.version}:
            raise RuntimeError(f"workers copied versions {versions}, not {pub.version}")

        want = logits_of(model, ids).cpu()
        workers.send("logits")
        bad += [f"step {step}: {b}" for b in check_logits(want, workers.replies("logits"),
                                                           args.atol)]

        if baseline:
            t0 = time.perf_counter()
            workers.send("nccl")
            nccl_broadcast(sd)
            workers.replies("nccl_done")
            times["nccl_per_tensor"].append((time.perf_counter() - t0) * 1e3)
        print(f"step {step}: loss {loss:.4f}, gpuipc sync {times['gpuipc'][-1]:.2f} ms"
              + (f", nccl {times['nccl_per_tensor'][-1]:.2f} ms" if baseline else "")
              + (", logits equal" if not bad else ""), flush=True)
    return times, bad


def report(times, nbytes):
    """The table: median sync time over the steps after the first (warm-up)."""
    base = None
    print(f"\n{'method':<16} {'median ms':>10} {'GB/s/worker':>12} {'ratio':>7}")
    for name in ("gpuipc", "nccl_per_tensor"):
        ts = times[name][1:]
        if not ts:
            print(f"{name:<16} {'skipped':>10}")
            continue
        med = statistics.median(ts)
        base = base or med
        print(f"{name:<16} {med:10.2f} {nbytes / med / 1e6:12.1f} {med / base:7.2f}")
    print(f"(first sync, left out: gpuipc {times['gpuipc'][0]:.1f} ms, it maps the "
          "segments; ratio: time / gpuipc's)")


if __name__ == "__main__":
    sys.exit(main())
