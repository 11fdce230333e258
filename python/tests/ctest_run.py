"""Runs pytest for CTest against the package built in the tree (argv[1]:
build/python) on the test files that follow (python/CMakeLists.txt gives
one; none: every file of python/tests); exits 77 (skipped) when pytest or
the built module is missing, and when pytest collected nothing."""
import glob
import os
import subprocess
import sys

build = sys.argv[1]
try:
    import pytest  # noqa: F401
except ImportError:
    print("pytest is not installed: Python tests skipped")
    sys.exit(77)
if not glob.glob(os.path.join(build, "gpuipc", "_gpuipc*.so")):
    print("the gpuipc extension was not built (no Python headers): skipped")
    sys.exit(77)
env = dict(os.environ)
env["PYTHONPATH"] = build + os.pathsep + env.get("PYTHONPATH", "")
here = os.path.dirname(os.path.abspath(__file__))
rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                      "--rootdir", here] + (sys.argv[2:] or [here]), env=env)
sys.exit(77 if rc == 5 else rc)
