"""What the Python test files share: the environment a test's peer
processes run in; a domain of this process, and both ends of a channel
in it."""
import itertools
import os
import sys
import threading

import pytest


@pytest.fixture
def env(tmp_path):
    """Each test has a runtime directory of its own."""
    e = dict(os.environ)
    e["GPUIPC_DIR"] = str(tmp_path / "run")
    e["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return e


_names = itertools.count()


@pytest.fixture
def dom():
    """A domain of this process, of a name no other test uses."""
    import gpuipc
    d = gpuipc.Domain(f"t{os.getpid()}x{next(_names)}")
    yield d
    d.leave()


@pytest.fixture
def pair(dom):
    """(sending end, receiving end) of one channel of ``dom``."""
    ends = {}
    th = threading.Thread(target=lambda: ends.setdefault("rx", dom.channel("p", timeout=10)))
    th.start()
    tx = dom.channel("p", timeout=10)
    th.join()
    yield tx, ends["rx"]
    tx.close()
    ends["rx"].close()
