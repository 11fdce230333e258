"""A process that loads libgpuipc.so through ctypes and imports gpuipc has
one copy of gpuipc's state: the checks are one_library.py's, run in a new
interpreter with the library loaded first and with the package imported
first. GPUIPC_TEST_LIBGPUIPC names the build tree's library (CTest sets
it); without it, the file the package reports."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _library():
    path = os.environ.get("GPUIPC_TEST_LIBGPUIPC")
    if path:
        return path
    import gpuipc
    return gpuipc.libgpuipc_path()


@pytest.mark.parametrize("order", ["ctypes-first", "import-first"])
def test_one_copy_of_the_library(env, order):
    p = subprocess.run([sys.executable, os.path.join(HERE, "one_library.py"), _library(), order],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().endswith("one library: ok"), p.stdout
