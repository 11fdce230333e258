"""The README's quick start, as a user runs it: the two sides of a
language's example (examples/hello_send + hello_recv, or their Python
twins) started as two processes in a domain of their own, the receiver
first and then the sender first; both must exit 0 and say what crossed.

  python3 tests/quickstart.py c SEND RECV
  python3 tests/quickstart.py python EXAMPLES_DIR BUILD_PYTHON_DIR

Exits 77 (skipped) for Python when numpy or the built package is missing."""
import os
import subprocess
import sys

WANT_SEND = "sent 4x4 float32, the receiver gave it back"
WANT_RECV = "4x4 float32, sum 120"


def pair(send, recv, env, first):
    procs = {}
    for side in (first, "recv" if first == "send" else "send"):
        cmd = send if side == "send" else recv
        procs[side] = subprocess.Popen(cmd + [f"qs-{first}-{os.getpid()}"],
                                       stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, env=env,
                                       text=True)
    out = {}
    for side, p in procs.items():
        try:
            out[side] = p.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            for q in procs.values():
                q.kill()
            sys.exit(f"FAIL: {side} did not finish in 60 s")
        if p.returncode != 0:
            sys.exit(f"FAIL: {side} ({first} first) exited {p.returncode}:\n"
                     f"{out[side]}")
    if WANT_SEND not in out["send"] or WANT_RECV not in out["recv"]:
        sys.exit(f"FAIL: ({first} first) sender said {out['send']!r}, "
                 f"receiver said {out['recv']!r}")
    print(out["recv"].strip())
    print(out["send"].strip())


def main():
    lang = sys.argv[1]
    env = dict(os.environ)
    if lang == "c":
        send, recv = [sys.argv[2]], [sys.argv[3]]
    else:
        ex, build = sys.argv[2], sys.argv[3]
        env["PYTHONPATH"] = build + os.pathsep + env.get("PYTHONPATH", "")
        probe = subprocess.run([sys.executable, "-c", "import numpy, gpuipc"],
                               env=env, capture_output=True, text=True)
        if probe.returncode != 0:
            print("SKIP: numpy or the built gpuipc package is missing:",
                  probe.stderr.strip().splitlines()[-1:])
            sys.exit(77)
        send = [sys.executable, os.path.join(ex, "hello_send.py")]
        recv = [sys.executable, os.path.join(ex, "hello_recv.py")]
    for first in ("recv", "send"):
        pair(send, recv, env, first)
    print(f"quickstart ({lang}): ok")


if __name__ == "__main__":
    main()
