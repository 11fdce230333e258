"""What the Python test files share: the environment a test's peer
processes run in."""
import os
import sys

import pytest


@pytest.fixture
def env(tmp_path):
    """Each test has a runtime directory of its own."""
    e = dict(os.environ)
    e["GPUIPC_DIR"] = str(tmp_path / "run")
    e["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return e
