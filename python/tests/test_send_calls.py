"""Channel.send of a tensor makes one call into the extension: the C side
reads the tensor (a torch tensor's attributes, the array interface or
DLPack), finds the gpuipc buffer its memory lies in by address
(gpuipc_buf_find) and sends it. Counted with sys.setprofile: each
"c_call" of a function of gpuipc._gpuipc during one send."""
import sys

import numpy as np
import pytest

import gpuipc
from gpuipc import _gpuipc


def calls_into_gpuipc(fn):
    """How many functions of gpuipc._gpuipc ``fn()`` calls, and its result."""
    n = 0

    def prof(frame, event, arg):
        nonlocal n
        if event == "c_call" and getattr(arg, "__self__", None) is _gpuipc:
            n += 1

    sys.setprofile(prof)
    try:
        out = fn()
    finally:
        sys.setprofile(None)
    return n, out


def _sources():
    torch = pytest.importorskip("torch")
    heap = np.arange(1024, dtype=np.float32)
    buf_np = gpuipc.empty(1024, "float32")
    buf_np.numpy()[:] = heap
    buf_t = gpuipc.empty(1024, "float32")
    buf_s = gpuipc.empty(2048, "float32")
    keep = (buf_np, buf_t, buf_s)
    return keep, {
        "numpy, heap": heap,
        "numpy, in a gpuipc buffer": buf_np.numpy()[3:],
        "torch, heap": torch.arange(1024, dtype=torch.float32),
        "torch, in a gpuipc buffer": torch.from_dlpack(buf_t)[5:],
        "torch, strided, in a gpuipc buffer": torch.from_dlpack(buf_s)[::2],
    }


def test_one_call_per_send(pair):
    tx, rx = pair
    keep, sources = _sources()
    counts = {}
    for name, obj in sources.items():
        n, ticket = calls_into_gpuipc(lambda: tx.send(obj))
        counts[name] = n
        ptr = obj.data_ptr() if hasattr(obj, "data_ptr") else obj.__array_interface__["data"][0]
        with rx.recv(timeout=10) as v:
            assert (np.asarray(v.numpy()) == np.asarray(obj)).all(), name
            # Memory of a gpuipc buffer crossed as that buffer (the view is
            # it, in this same process); the heap's was staged.
            assert (v.data_ptr == ptr) == ("in a gpuipc buffer" in name), name
        tx.wait(ticket, timeout=10)
    print(counts)
    assert counts == {name: 1 for name in sources}, counts
    del keep
