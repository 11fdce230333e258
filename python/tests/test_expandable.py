"""gpuipc with PyTorch's expandable segments
(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, as verl, SGLang and vLLM
run it): PyTorch then maps its blocks from pieces of cuMemCreate memory (20
MiB each for large blocks, 2 MiB for small ones) and shares them as
b"\\x02e" handles naming the exporter's file descriptors.

Without a GPU: gpuipc.torch.from_torch reads such a handle, takes the
piece's descriptor from the exporting process (a real child here, holding a
memfd) and hands it to the import (recorded, on host memory); malformed
handles, a tensor that spans two pieces and an exporter that is gone are
refused with clear errors before anything is mapped.

With a GPU (skipped otherwise), each in processes whose environment sets
the allocator mode before CUDA starts (expandable_peer.py): Channel.send of
tensors that allocator made (one spanning pieces), received as views and
into such tensors; from_torch of such a tensor's handle; state dict
snapshots of such tensors copied into such targets; move_to_gpuipc of a
module made there, lent to a reader; and mem_pool, whose blocks stay
gpuipc memory under that mode (or which refuses, by name, a PyTorch that
gives them to expandable segments). Every check compares the bytes that
crossed. Without a GPU too: when mem_pool takes the mode to be on."""
import json
import os
import struct
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
torch = pytest.importorskip("torch")
import gpuipc  # noqa: E402
import gpuipc.torch as gt  # noqa: E402
from gpuipc import _gpuipc as _c  # noqa: E402

EXPANDABLE = "expandable_segments:True"


def handle(pid, piece, fds):
    """A PyTorch expandable-segment handle: b"\\x02e", its ShareHeader, one
    descriptor number per piece."""
    return b"\x02e" + struct.pack("<i4xQQ", pid, piece, len(fds)) + b"".join(
        struct.pack("<i", fd) for fd in fds)


def shared(h, offset, nbytes, pid, dtype="torch.uint8", shape=None):
    shape = shape or (nbytes,)
    strides = tuple(int(torch.tensor(shape[i + 1:]).prod()) for i in range(len(shape)))
    return {"handle": h, "offset": offset, "nbytes": nbytes, "device": 0, "pid": pid,
            "dtype": dtype, "shape": shape, "strides": strides, "storage_offset": 0}


@pytest.fixture
def exporter():
    """A child process holding a memfd at a descriptor number other than
    ours: (its pid, that number, the (st_dev, st_ino) of the file)."""
    code = ("import os, sys\n"
            "for _ in range(5): os.open('/dev/null', os.O_RDONLY)\n"
            "fd = os.memfd_create('piece')\n"
            "st = os.fstat(fd)\n"
            "print(fd, st.st_dev, st.st_ino, flush=True)\n"
            "sys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    fd, dev, ino = map(int, p.stdout.readline().split())
    yield p.pid, fd, (dev, ino)
    p.communicate("")


def test_expandable_handle_imports_the_exporters_piece(exporter, monkeypatch):
    # A 4 KiB tensor 1 MiB into the third of four 2 MiB pieces: the import
    # gets a descriptor of ours for the exporter's third piece (the same
    # file), the offset inside that piece and the size; the descriptor is
    # closed once the import holds its own. The "import" here is host
    # memory, so the tensor made from it can be checked.
    pid, fd, ident = exporter
    piece = 2 << 20
    seen = []
    host = gpuipc.empty((4096,), "uint8")
    host.numpy()[:] = [i % 251 for i in range(4096)]

    def fake_import(mine, offset, nbytes, device):
        st = os.fstat(mine)
        seen.append(((st.st_dev, st.st_ino), offset, nbytes, device, mine))
        return _c.buf_retain(host._h())
    monkeypatch.setattr(_c, "import_cuda_fd", fake_import, raising=False)
    h = handle(pid, piece, [fd + 10, fd + 11, fd, fd + 12])
    t = gt.from_torch(shared(h, 2 * piece + (1 << 20), 4096, pid, shape=(64, 64)))
    assert len(seen) == 1
    got_ident, offset, nbytes, device, mine = seen[0]
    assert got_ident == ident, "not the exporter's descriptor of that piece"
    assert (offset, nbytes, device) == (1 << 20, 4096, 0)
    with pytest.raises(OSError):
        os.fstat(mine)  # closed after the import
    assert t.shape == (64, 64) and t.dtype == torch.uint8
    assert t.flatten().tolist() == [i % 251 for i in range(4096)]


def test_expandable_handle_refusals(exporter, monkeypatch):
    pid, fd, _ = exporter
    piece = 20 << 20
    monkeypatch.setattr(_c, "import_cuda_fd", lambda *a: pytest.fail("imported"),
                        raising=False)
    # bytes over a piece boundary: two allocations, not one range
    with pytest.raises(gpuipc.Unsupported, match=r"span 2 pieces.*Channel"):
        gt.from_torch(shared(handle(pid, piece, [fd, fd]), piece - 8, 16, pid))
    with pytest.raises(gpuipc.Unsupported, match="span 3 pieces"):
        gt.from_torch(shared(handle(pid, piece, [fd] * 3), 0, 2 * piece + 1, pid))
    # fabric handles (64 bytes a piece)
    fab = b"\x02e" + struct.pack("<i4xQQ", pid, piece, 2) + bytes(128)
    with pytest.raises(gpuipc.Unsupported, match="fabric"):
        gt.from_torch(shared(fab, 0, 16, pid))
    # malformed: short, wrong length, empty header, range outside
    with pytest.raises(gpuipc.BadHandle, match="header alone"):
        gt.from_torch(shared(b"\x02e" + bytes(10), 0, 16, pid))
    with pytest.raises(gpuipc.BadHandle, match="for 2 pieces"):
        gt.from_torch(shared(handle(pid, piece, [fd, fd]) + b"x", 0, 16, pid))
    with pytest.raises(gpuipc.BadHandle, match="0 pieces"):
        gt.from_torch(shared(handle(pid, piece, []), 0, 16, pid))
    with pytest.raises(gpuipc.BadHandle, match="not inside"):
        gt.from_torch(shared(handle(pid, piece, [fd]), piece - 8, 16, pid))
    # a handle another process made than the one named
    with pytest.raises(gpuipc.BadHandle, match="made by process"):
        gt.from_torch(shared(handle(pid, piece, [fd]), 0, 16, pid + 1))
    # a descriptor the exporter does not have open
    with pytest.raises(OSError, match="pidfd_getfd"):
        gt.from_torch(shared(handle(pid, piece, [1000]), 0, 16, pid))


def test_expandable_handle_of_a_process_gone():
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                       capture_output=True, text=True)
    gone = int(p.stdout)
    with pytest.raises(gpuipc.PeerGone, match=f"process {gone} is gone"):
        gt.from_torch(shared(handle(gone, 2 << 20, [3]), 0, 16, gone))


# ---- on a GPU -------------------------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


def peers(env, *roles, timeout=300):
    """Run expandable_peer.py ROLE for each of ``roles`` at once (domain of
    this test) under the expandable allocator; their last JSON lines."""
    env = dict(env, PYTORCH_CUDA_ALLOC_CONF=EXPANDABLE)
    dom = f"x{os.getpid()}"
    ps = [subprocess.Popen([sys.executable, os.path.join(HERE, "expandable_peer.py"), r, dom],
                           env=env, stdout=subprocess.PIPE, text=True) for r in roles]
    out = []
    try:
        for p in ps:
            o, _ = p.communicate(timeout=timeout)
            assert p.returncode == 0, f"{p.args[2]} exited {p.returncode}: {o}"
            out.append(json.loads(o.strip().splitlines()[-1]))
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
    return out


@gpu
def test_channel_sends_expandable_tensors(env):
    # staged (not gpuipc memory); one tensor spans several pieces; received
    # as views and into tensors of the same allocator
    s, r = peers(env, "chan_send", "chan_recv")
    assert s == {"expandable": True, "sent": 3}
    assert r == {"expandable": True, "same": [True, True, True]}


@gpu
def test_from_torch_of_an_expandable_tensor(env):
    # the importer starts the exporter (ptrace access: an ancestor);
    # a tensor in one piece is mapped, one over pieces refused clearly
    (r,) = peers(env, "ipc_import")
    if "denied" in r:  # as PyTorch's own import of the handle would be
        pytest.skip(f"no ptrace access to a child here: {r['denied']}")
    assert r == {"handle": "e", "same": True, "spanning": "Unsupported"}


@gpu
def test_state_dict_snapshots_of_expandable_tensors(env):
    p, r = peers(env, "sd_publish", "sd_read")
    assert p == {"expandable": True, "published": [1, 2]}
    assert r == {"expandable": True, "versions": [1, 2], "same": [True, True]}


@gpu
def test_move_to_gpuipc_of_an_expandable_module(env):
    p, r = peers(env, "move_publish", "move_read")
    assert p == {"expandable_before": True, "in_gpuipc": True, "kept": True,
                 "published": [1, 2]}
    assert r == {"versions": [1, 2], "same": [True, True]}


@gpu
def test_mem_pool_stays_gpuipc_memory(env):
    # PyTorch keeps expandable segments to its own pools; a release that
    # gives a MemPool's blocks to them instead is refused by name, never
    # handed out as a pool whose tensors are not gpuipc memory
    (r,) = peers(env, "mem_pool")
    if "refused" in r:
        assert "expandable" in r["refused"] and "147851" in r["refused"], r
        print("this PyTorch: mem_pool refused under expandable segments:", r["refused"])
        return
    assert r == {"expandable": True, "pool_in_gpuipc": True, "other_in_gpuipc": False}


@pytest.mark.parametrize("env_vars, on", [
    ({}, False),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, True),
    ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128, expandable_segments : True"}, True),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,expandable_segments:False"}, False),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:true"}, False),  # PyTorch: True only
    ({"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, True),
    # either name (PyTorch releases differ in which they read)
    ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128",
      "PYTORCH_ALLOC_CONF": "expandable_segments:True"}, True),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False",
      "PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.8"}, False),
])
def test_mem_pool_knows_when_expandable_segments_are_on(monkeypatch, env_vars, on):
    # what decides whether mem_pool tries its pool before handing it out
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env_vars.items():
        monkeypatch.setenv(k, v)
    assert gt._expandable_conf() is on
