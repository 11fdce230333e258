#!/usr/bin/env python3
"""gpuipc channels against their baselines, in one run, as a markdown table.

Run from the repository root on a machine with two GPUs (the lent 2xH200):

    python3 bench/channel_vs_baselines.py [--quick] [--out FILE]

It builds gpuipc and bench/channel_bench (cmake, Release, in build-bench/),
compiles bench/channel_nccl.c against NCCL, then runs, each under a time
limit, all within a budget of 8 minutes:

  channel_bench 0 0   latency and bandwidth, both ends on GPU 0, with
                      cudaMemcpyAsync device-to-device in the same process
  channel_bench 0 0 --streams
                      the 4 KiB round trip on each stream handle (NULL,
                      legacy, per-thread, created), idle and with a copy
                      queued before each send, with that copy's own floor
  kinds_bench         first import of each kind against the raw driver calls
  channel_bench 0 1   the same across GPUs, with cudaMemcpyPeerAsync
  channel_nccl        NCCL send/recv between two processes (GPU 0 -> 1)
  channel_torch.py    a torch.multiprocessing queue round trip, 4 KiB

and prints the tables, the first with every row of "the path users take"
against its baseline and target (also written to --out, default $OUT/channel_bench.md
when $OUT is set, else build-bench/channel_bench.md). NCCL_NVLS_ENABLE=0 is
set for every step; nothing here creates multicast objects.
"""
import datetime
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

BUDGET_S = 470
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build-bench")
START = time.monotonic()
LOG = []


def left():
    return BUDGET_S - (time.monotonic() - START)


def say(*a):
    msg = " ".join(str(x) for x in a)
    print(msg, flush=True)
    LOG.append(msg)


def run(cmd, limit, env=None, cwd=ROOT):
    """Run @cmd within min(limit, what is left); return (rc, output)."""
    t = max(5, min(limit, left() - 5))
    say("$ " + " ".join(cmd) + "   (limit %ds)" % t)
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=t)
        out, rc = p.stdout, p.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc = 124
    for line in out.splitlines():
        if not line.startswith("RESULT"):
            say("  | " + line)
    if rc != 0:
        say("  -> exit status %d" % rc)
    return rc, out


def run_pair(cmds, limit, env):
    """Start two processes together; return their outputs."""
    t = max(5, min(limit, left() - 5))
    say("$ " + "  &  ".join(" ".join(c) for c in cmds) + "   (limit %ds)" % t)
    procs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for c in cmds]
    outs = []
    deadline = time.monotonic() + t
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            say("  -> timed out")
        outs.append(out or "")
        for line in (out or "").splitlines():
            if not line.startswith("RESULT"):
                say("  | " + line)
    return "\n".join(outs)


def parse(out, lat, bw, imp=None):
    for line in out.splitlines():
        f = line.split()
        if len(f) == 5 and f[0] == "RESULT" and f[1] == "lat":
            lat[f[2]] = (float(f[3]), float(f[4]))
        elif len(f) == 6 and f[0] == "RESULT" and f[1] == "bw":
            bw[(f[2], f[3], int(f[4]))] = float(f[5])
        elif len(f) == 5 and f[0] == "RESULT" and f[1] == "import" and imp is not None:
            imp[f[2]] = (float(f[3]), float(f[4]))


def size_name(b):
    for unit, n in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n:
            return "%d %s" % (b // n, unit)
    return "%d B" % b


def machine():
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version",
                            "--format=csv,noheader"], stdout=subprocess.PIPE,
                           text=True, timeout=20).stdout.strip()
        gpus = "; ".join(q.splitlines())
    except Exception as e:  # no nvidia-smi: say so
        gpus = "nvidia-smi failed: %s" % e
    try:
        topo = subprocess.run(["nvidia-smi", "topo", "-m"], stdout=subprocess.PIPE,
                              text=True, timeout=20).stdout
        m = re.search(r"GPU0\s+X\s+(\S+)", topo)
        link = m.group(1) if m else "?"
    except Exception:
        link = "?"
    return "%s, %s, GPU0-GPU1 %s" % (socket.gethostname(), gpus, link)


def fmt(v, nd=2):
    return "n/a" if v is None else ("%.*f" % (nd, v))


HANDLES = (("null", "NULL (legacy default)"), ("legacy", "CU_STREAM_LEGACY"),
           ("perthread", "CU_STREAM_PER_THREAD"), ("created", "created, non-blocking"))


def users_path(lat, bw, imp):
    """Every row of "the path users take" on one GPU: gpuipc, its baseline
    in this run, the ratio, the target, and whether it is met."""
    out = ["**The path users take, one GPU**: gpuipc against its baseline "
           "in this run.", "",
           "| what | gpuipc | baseline (this run) | ratio | target | met |",
           "|---|---:|---:|---:|---|---|"]

    def row(what, g, b, unit, target, ok):
        ratio = g / b if g is not None and b else None
        met = "n/a" if g is None or ok is None else ("yes" if ok(g, ratio) else "**no**")
        out.append("| %s | %s | %s | %s | %s | %s |" % (
            what, "n/a" if g is None else fmt(g) + unit,
            "" if b is None else fmt(b) + unit, fmt(ratio), target, met))

    med = lambda k: lat[k][0] if k in lat else None
    for h, name in HANDLES:
        row("4 KiB round trip, idle, %s" % name, med("same_gpu_rt_" + h), None,
            " us", "<= 3 us", lambda g, r: g <= 3)
    for h, name in HANDLES:
        b = med("same_copy_wait_" + h)
        row("same, a 4 KiB copy queued before each send, %s (baseline: the copy "
            "alone, one process, host polls until done)" % name,
            med("same_gpu_rt_%s_copy" % h), b, " us", "<= baseline + 2 us",
            lambda g, r, b=b: b is not None and g <= b + 2)
    for h, name in HANDLES:
        row("as programs run: a kernel writes the tensor before each send, the "
            "receiver's kernel reads it before the release, %s" % name,
            med("same_gpu_rt_%s_kernels" % h), None, " us", "", None)
    for size, target in ((1 << 20, 0.9), (4 << 20, 0.95), (16 << 20, 0.95),
                         (64 << 20, 0.98), (256 << 20, 0.98), (1 << 30, 0.98)):
        row("copy bandwidth, %s, created streams (baseline cudaMemcpyAsync)" % size_name(size),
            bw.get(("same", "copy", size)), bw.get(("same", "memcpy", size)),
            " GB/s", ">= %.2fx" % target, lambda g, r, t=target: r is not None and r >= t)
    for k in ("vmm", "legacy", "pool"):
        raw, g = imp.get(k + "_same", (None, None))
        row("first import, %s (baseline: the raw driver calls)" % k.upper(), g, raw,
            " us", "<= 1.05x", lambda g, r: r is not None and r <= 1.05)
    return out


def table(lat, bw, quick, imp=None):
    out = []
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    out.append("### gpuipc channels against baselines (%s%s)" %
               (now, ", quick run" if quick else ""))
    out.append("")
    out.append("Machine: " + machine())
    out.append("")
    out += users_path(lat, bw, imp or {})
    out.append("")
    out.append("**4 KiB round trip** (send -> recv -> release -> the sender "
               "sees its buffer free), microseconds:")
    out.append("")
    out.append("| what | median | p99 | target |")
    out.append("|---|---:|---:|---|")

    def row(label, key, target=""):
        v = lat.get(key)
        out.append("| %s | %s | %s | %s |" % (label, fmt(v and v[0]),
                                               fmt(v and v[1]), target))

    for where, desc in (("same", "same GPU"), ("cross", "GPU 0 -> GPU 1")):
        row("gpuipc, VMM, %s, released (send_wait)" % desc,
            where + "_gpu_rt_released", "<= 8")
        row("gpuipc, VMM, %s, free on the GPU too (send_done)" % desc,
            where + "_gpu_rt_done")
        row("gpuipc, VMM, %s, kernel writes it before each send (events "
            "both ways), released" % desc, where + "_gpu_rt_kernel")
        row("gpuipc, VMM, %s, one way: gpuipc_channel_send called -> gpuipc_channel_recv "
            "returns in the receiver (buffer mapped)" % desc,
            where + "_gpu_oneway", "<= 3")
        row("gpuipc, VMM, %s, ping-pong / 2 (send, recv, release, reply)"
            % desc, where + "_gpu_pingpong")
        row("gpuipc, VMM, %s, ping-pong / 2, kernel writes it before each "
            "send" % desc, where + "_gpu_pingpong_kernel")
        row("gpuipc, HOST kind (%s run)" % desc, where + "_host_rt")
    row("NCCL 2.28 send/recv ping-pong, GPU 0 <-> 1", "nccl_rt")
    row("PyTorch torch.multiprocessing queue, put/get/touch/ack", "torch_rt")
    out.append("")
    out.append("**Bandwidth**, GB/s (10^9 bytes/s), the producer's clock from "
               "the first send until the last buffer is free again:")
    out.append("")
    out.append("| size | same GPU: copy | zero-copy + copy | cudaMemcpyAsync "
               "| cross: copy | zero-copy + copy | cudaMemcpyPeerAsync | NCCL "
               "| copy / peer | copy / NCCL |")
    out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    sizes = sorted({k[2] for k in bw})
    for s in sizes:
        g = lambda w, m: bw.get((w, m, s))
        cc, cp, nc = g("cross", "copy"), g("cross", "memcpy"), g("cross", "nccl")
        r1 = cc / cp if cc and cp else None
        r2 = cc / nc if cc and nc else None
        out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            size_name(s), fmt(g("same", "copy")), fmt(g("same", "zerocopy")),
            fmt(g("same", "memcpy")), fmt(cc), fmt(g("cross", "zerocopy")),
            fmt(cp), fmt(nc), fmt(r1), fmt(r2)))
    out.append("")
    out.append("A sender or receiver whose stream has nothing pending at "
               "send or release needs no event (gpuipc checks with "
               "cuStreamQuery); the 'kernel' rows show the event path: a "
               "peer's event that is still pending is polled for up to "
               "GPUIPC_CHAN_EVENT_POLL_US (200 us) before a stream is made to "
               "wait for it (on one GPU such a wait costs a switch between "
               "the two processes' contexts, about 140 us).")
    out.append("")
    out.append("Targets: round trip <= 8 us median (one way <= 3 us); cross-GPU "
               "copy >= 1.0x cudaMemcpyPeerAsync from 64 MiB; >= NCCL at every "
               "size. cudaMemcpyPeerAsync runs in one process with peer access "
               "enabled; NCCL is measured at the receiving rank after a "
               "barrier.")
    return "\n".join(out)


def main():
    quick = "--quick" in sys.argv
    out_file = None
    if "--out" in sys.argv:
        out_file = sys.argv[sys.argv.index("--out") + 1]
    elif os.environ.get("OUT"):
        out_file = os.path.join(os.environ["OUT"], "channel_bench.md")
    else:
        out_file = os.path.join(BUILD, "channel_bench.md")
    env = dict(os.environ)
    env["NCCL_NVLS_ENABLE"] = "0"
    rundir = tempfile.mkdtemp(prefix="gpuipc-bench-")
    os.chmod(rundir, 0o700)
    env["GPUIPC_DIR"] = rundir
    lat, bw = {}, {}
    qarg = ["--quick"] if quick else []

    jobs = str(min(16, os.cpu_count() or 2))
    rc, _ = run(["cmake", "-S", ROOT, "-B", BUILD, "-DCMAKE_BUILD_TYPE=Release",
                 "-DBUILD_TESTING=OFF", "-DGPUIPC_BUILD_TOOLS=OFF",
                 "-DGPUIPC_WERROR=OFF"], 120, env)
    if rc == 0:
        rc, _ = run(["cmake", "--build", BUILD, "-j", jobs, "--target",
                     "channel_bench", "kinds_bench"], 240, env)
    bench = os.path.join(BUILD, "bench", "channel_bench")
    if rc != 0 or not os.path.exists(bench):
        say("channel_bench did not build")
        return 1
    nccl = os.path.join(BUILD, "channel_nccl")
    cuda = "/usr/local/cuda"
    run([shutil.which("cc") or "gcc", "-O2", "-std=gnu11", os.path.join(ROOT, "bench", "channel_nccl.c"),
         "-I" + cuda + "/include", "-L" + cuda + "/lib64",
         "-Wl,-rpath," + cuda + "/lib64", "-lcudart", "-lnccl", "-o", nccl],
        60, env)

    ngpu = 0
    try:
        q = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE,
                           text=True, timeout=20).stdout
        ngpu = len([l for l in q.splitlines() if l.startswith("GPU")])
    except Exception:
        pass
    imp = {}
    _, o = run([bench, "0", "0"] + qarg, 120, env)
    parse(o, lat, bw)
    _, o = run([bench, "0", "0", "--streams"], 60, env)
    parse(o, lat, bw)
    kinds = os.path.join(BUILD, "bench", "kinds_bench")
    if os.path.exists(kinds):
        _, o = run([kinds, "--n", "100"], 60, env)
        parse(o, lat, bw, imp)
    if ngpu >= 2:
        _, o = run([bench, "0", "1"] + qarg, 120, env)
        parse(o, lat, bw)
        if os.path.exists(nccl):
            idfile = os.path.join(rundir, "nccl.id")
            o = run_pair([[nccl, "0", idfile] + qarg, [nccl, "1", idfile] + qarg],
                         120, env)
            parse(o, lat, bw)
    else:
        say("one GPU: no cross-GPU or NCCL runs")
    _, o = run([sys.executable, os.path.join(ROOT, "bench", "channel_torch.py")]
               + qarg, 90, env)
    parse(o, lat, bw)

    md = table(lat, bw, quick, imp)
    print("\n" + md)
    try:
        os.makedirs(os.path.dirname(out_file), exist_ok=True)
        with open(out_file, "w") as f:
            f.write(md + "\n\n<details><summary>log</summary>\n\n```\n" +
                    "\n".join(LOG) + "\n```\n</details>\n")
        print("\nwritten to " + out_file)
    except OSError as e:
        print("could not write %s: %s" % (out_file, e))
    shutil.rmtree(rundir, ignore_errors=True)
    print("total %.0f s" % (time.monotonic() - START))
    return 0


if __name__ == "__main__":
    sys.exit(main())
