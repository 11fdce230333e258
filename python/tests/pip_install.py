#!/usr/bin/env python3
"""The README's Python install, as a new user on Debian 12 runs it: a fresh
venv that sees the system's packages, `pip install --no-index
--no-build-isolation ./python` (no registry reached), then the installed
package (never the build tree's) imported, its version checked against the
library's, the package's own libgpuipc.so.N shown to be the one copy that a
ctypes load of it shares (one_library.py), and two processes exchanging an
array over a HOST channel.

usage: pip_install.py SOURCE_DIR SCRATCH_DIR VERSION
  SOURCE_DIR   the repository (include/, src/, python/ are copied from it)
  SCRATCH_DIR  emptied, then holds the copy, the venv and the runtime dir
  VERSION      CMake's project(VERSION), which pip and gpuipc.__version__
               must both say

Exits 77 (skipped) only when a Debian package it needs is missing, or when
the interpreter is itself a venv (whose packages a venv made from it does
not see: the README's lines use the system's python3), and
names it; any other failure is a failure.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig

source, scratch, version = sys.argv[1], sys.argv[2], sys.argv[3]


def skip(why):
    print("skipped: " + why)
    sys.exit(77)


def fail(what):
    print("FAIL: " + what)
    sys.exit(1)


# ----- the README's lines are for the system's interpreter -----
if sys.prefix != sys.base_prefix:
    skip("%s is itself a virtual environment (%s): a venv made from it with "
         "--system-site-packages sees %s's packages, not this one's; the "
         "README's lines use the system's /usr/bin/python3"
         % (sys.executable, sys.prefix, sys.base_prefix))

# ----- the Debian packages the README names -----
missing = []
if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
    missing.append("python3-dev")
for module, package in (("ensurepip", "python3-venv"), ("setuptools", "python3-setuptools"),
                        ("wheel", "python3-wheel"), ("numpy", "python3-numpy")):
    if importlib.util.find_spec(module) is None:
        missing.append(package)
if missing:
    skip("%s lacks the Debian package(s) %s (apt-get install %s)"
         % (sys.executable, ", ".join(missing), " ".join(missing)))

# ----- a fresh copy of the sources: pip builds in the tree it is given -----
shutil.rmtree(scratch, ignore_errors=True)
tree = os.path.join(scratch, "src")
junk = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".venv")
for part in ("include", "src", "python"):
    shutil.copytree(os.path.join(source, part), os.path.join(tree, part), ignore=junk)

# Nothing of the caller's Python or pip set-up leaks in: a new user has none.
env = {k: v for k, v in os.environ.items()
       if not k.startswith(("PYTHON", "PIP_", "GPUIPC_", "FAKE_CUDA_", "VIRTUAL_ENV"))}
env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1",
           PIP_NO_CACHE_DIR="1", PIP_NO_INPUT="1")


def run(args, cwd, what):
    print("$ " + " ".join(args), flush=True)
    p = subprocess.run(args, cwd=cwd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=540)
    print(p.stdout, end="", flush=True)
    if p.returncode != 0:
        if what == "venv" and "ensurepip" in p.stdout:
            skip("python3 -m venv has no pip to put in the venv: install python3-venv")
        fail("%s exited %d" % (what, p.returncode))
    return p.stdout


# ----- the README's two lines, run where it says (the repository's root) -----
venv = os.path.join(tree, ".venv")
run([sys.executable, "-m", "venv", "--system-site-packages", ".venv"], tree, "venv")
py = os.path.join(venv, "bin", "python")
run([os.path.join(venv, "bin", "pip"), "install", "--no-index", "--no-build-isolation",
     "./python"], tree, "pip install")

# ----- what pip installed -----
out = run([py, "-m", "pip", "show", "gpuipc"], scratch, "pip show")
pip_version = next((line.split(":", 1)[1].strip() for line in out.splitlines()
                    if line.startswith("Version:")), None)
if pip_version != version:
    fail("pip says gpuipc %s, the library is %s" % (pip_version, version))
out = run([py, "-c", "import gpuipc, json; print(json.dumps("
           "[gpuipc.__version__, gpuipc.__file__, gpuipc.library_path(), "
           "gpuipc.libgpuipc_path()]))"],
          scratch, "import gpuipc")
py_version, init, lib, libgpuipc = json.loads(out.strip().splitlines()[-1])
if py_version != version:
    fail("gpuipc.__version__ is %s, the library is %s" % (py_version, version))
site = os.path.realpath(venv) + os.sep
for path in (init, lib, libgpuipc):
    if not os.path.realpath(path).startswith(site):
        fail("gpuipc was imported from %s, not from the venv %s" % (path, venv))

# ----- the package ships libgpuipc, and its extension calls that copy -----
soname = "libgpuipc.so." + version.split(".")[0]
if os.path.dirname(libgpuipc) != os.path.dirname(init) or \
        os.path.basename(libgpuipc) != soname:
    fail("the extension calls %s, not the package's own gpuipc/%s" % (libgpuipc, soname))
for order in ("ctypes-first", "import-first"):
    run([py, os.path.join(tree, "python", "tests", "one_library.py"), libgpuipc, order],
        scratch, "one_library.py " + order)

# ----- two processes, one HOST channel, the installed package -----
SEND = """
import gpuipc, numpy as np
with gpuipc.Domain("pip") as d, d.channel("kv", timeout=30) as ch:
    buf = gpuipc.empty((256, 1024), "float32")
    buf.numpy()[:] = np.arange(256 * 1024, dtype=np.float32).reshape(256, 1024)
    ch.wait(ch.send(buf), timeout=30)
print("sent", flush=True)
"""
# The array made from the view dies with check(): the view then goes back
# to the sender, whose wait returns (an array kept past the channel's close
# would never be given back: PeerGone, as the README says).
RECV = """
import gpuipc, json, numpy as np
def check(view):
    a = np.from_dlpack(view)
    want = np.arange(256 * 1024, dtype=np.float32).reshape(256, 1024)
    return {"shape": list(a.shape), "dtype": str(a.dtype),
            "equal": bool((a == want).all())}
with gpuipc.Domain("pip") as d, d.channel("kv", timeout=30) as ch:
    with ch.recv(timeout=30) as view:
        print(json.dumps(check(view)), flush=True)
"""
rundir = os.path.join(scratch, "run")
os.makedirs(rundir, mode=0o700)
env.update(GPUIPC_DIR=rundir, GPUIPC_NO_CUDA="1")
procs = [subprocess.Popen([py, "-c", code], cwd=scratch, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
         for code in (RECV, SEND)]
outs = []
for p in procs:
    try:
        outs.append(p.communicate(timeout=60)[0])
    except subprocess.TimeoutExpired:
        for q in procs:
            q.kill()
        fail("the two processes did not finish in 60 s")
for name, p, o in zip(("receiver", "sender"), procs, outs):
    print("%s (exit %d):\n%s" % (name, p.returncode, o), end="")
    if p.returncode != 0:
        fail("the %s exited %d" % (name, p.returncode))
got = json.loads(outs[0].strip().splitlines()[-1])
if got != {"shape": [256, 1024], "dtype": "float32", "equal": True}:
    fail("the receiver saw %r" % got)

# The venv the README makes in the repository is no file to commit.
if shutil.which("git") and os.path.exists(os.path.join(source, ".git")):
    p = subprocess.run(["git", "-C", source, "check-ignore", "-q", ".venv"])
    if p.returncode != 0:
        fail(".venv (the README's venv) is not in .gitignore")

print("pip install ./python: gpuipc %s installed (with %s), imported, one copy of "
      "its state beside ctypes, and an array crossed between two processes"
      % (version, soname))
