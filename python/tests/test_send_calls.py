"""Channel.send of a tensor makes one call into the extension: the C side
reads the tensor (a torch tensor's attributes, the array interface or
DLPack), finds the gpuipc buffer its memory lies in by address
(gpuipc_buf_find) and sends it. Counted with sys.setprofile: each
"c_call" of a function of gpuipc._gpuipc during one send."""
import json
import os
import subprocess
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


CUDA_DLPACK = r'''
import json, sys, threading
import gpuipc
from gpuipc import _gpuipc as _c
sys.path.insert(0, sys.argv[1])
from test_send_calls import calls_into_gpuipc


class CudaArray:
    """Device memory seen through DLPack alone, as a CuPy array is."""

    def __init__(self, ptr, n, owner):
        self.streams = []
        # Made here: the producer's own call into gpuipc is not the send's.
        self.cap = _c.dlpack_of(owner, (ptr, 2, 0, (2, 32, 1), (n,), None, 0))

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None, **kw):
        self.streams.append(stream)
        return self.cap


d = gpuipc.Domain("calls")
ends = {}
th = threading.Thread(target=lambda: ends.setdefault("rx", d.channel("p", timeout=10)))
th.start()
tx = d.channel("p", timeout=10)
th.join()
buf = gpuipc.empty(1024, "float32", kind=gpuipc.LEGACY, device=0)
x = CudaArray(buf.ptr + 64, 100, buf)
n, ticket = calls_into_gpuipc(lambda: tx.send(x))
v = ends["rx"].recv(timeout=10)
out = {"calls": n, "zero_copy": v.data_ptr == buf.ptr + 64, "streams": x.streams,
       "kept": list(tx._keep) == [ticket]}
v.release()
tx.wait(ticket, timeout=10)
# Past 8 kept, a send lets go of those whose messages are free, still in
# one call.
calls = []
for i in range(11):
    y = CudaArray(buf.ptr, 1024, buf)
    n, ticket = calls_into_gpuipc(lambda: tx.send(y))
    calls.append(n)
    ends["rx"].recv(timeout=10).release()
    tx.wait(ticket, timeout=10)
out["calls_after"] = sorted(set(calls))
out["kept_after"] = len(tx._keep)
print(json.dumps(out))
'''


@pytest.mark.skipif(not os.environ.get("FAKE_CUDA_FULL"),
                    reason="FAKE_CUDA_FULL (the fake CUDA driver) not set")
def test_one_call_per_cuda_send(env):
    """A CUDA array known by DLPack alone (CuPy's way), in a gpuipc buffer
    (LEGACY memory of the fake driver): one call, sent as that buffer, its
    producer asked for the legacy default stream (no stream given, no
    torch), and kept until its message is free; past 8 kept, the free
    ones are let go, still in one call."""
    env["GPUIPC_CUDA_LIB"] = os.environ["FAKE_CUDA_FULL"]
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.run([sys.executable, "-c", CUDA_DLPACK, here], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    kept_after = got.pop("kept_after")
    assert got == {"calls": 1, "zero_copy": True, "streams": [1], "kept": True,
                   "calls_after": [1]}, got
    assert 1 <= kept_after <= 8, kept_after  # 12 sent, the free ones let go


def test_one_call_per_recv_into(pair):
    """Channel.recv_into of a torch tensor is one call too (read in C as a
    send's tensor is); a destination of the wrong shape or one that is not
    contiguous is refused (ValueError) and the message waits for the
    right one."""
    torch = pytest.importorskip("torch")
    tx, rx = pair
    src = torch.arange(64, dtype=torch.int32)
    t = tx.send(src)
    for bad in (torch.zeros(63, dtype=torch.int32),
                torch.zeros(64, dtype=torch.int64),
                torch.zeros(128, dtype=torch.int32)[::2]):
        with pytest.raises(ValueError):
            rx.recv_into(bad, timeout=5)
    assert not tx.done(t, timeout=0)  # still in the channel
    out = torch.zeros(64, dtype=torch.int32)
    # (No timeout: seconds are turned into milliseconds by a call of its own.)
    n, got = calls_into_gpuipc(lambda: rx.recv_into(out))
    assert n == 1 and got is out
    assert torch.equal(out, src)
    assert tx.done(t, timeout=5)
