"""Channel.send_blocks / Channel.recv_blocks: blocks of a tensor along its
first dimension, picked by indices, as one message. Across real processes
(blocks_peer.py) on HOST buffers and on the fake CUDA driver's GPU memory,
every byte checked; in one process, the call counts (one call into the
extension a send_blocks, whatever the number of blocks) and the checks."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import gpuipc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import blocks_peer  # noqa: E402  (BATCHES, PER)
from test_send_calls import calls_into_gpuipc  # noqa: E402


def run_pair(env, kind):
    peer = os.path.join(HERE, "blocks_peer.py")
    rx = subprocess.Popen([sys.executable, peer, "recv", "blk", kind], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tx = subprocess.Popen([sys.executable, peer, "send", "blk", kind], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    outs = []
    for p in (tx, rx):
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            tx.kill()
            rx.kill()
            raise
        assert p.returncode == 0, out + err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def check_pair(s, r):
    n = blocks_peer.BATCHES
    # one message (one ticket) a batch, after the tensor; three buffers
    # introduced: the staged tensor's host stage, the block lists' area and
    # the layer
    assert s["tickets"] == list(range(2, n + 2)), s
    assert s["sent"] == n + 1 and s["buffers_sent"] == 3, s
    assert r["ok"] == [True] * n, r
    assert r["received"] == n + 1, r
    assert r["tensor"] is True
    assert "message 1 is a tensor, not a block batch" in r["tensor_refused"]
    assert "message 2 is a block batch of 400 blocks" in r["batch_refused"]
    assert "holds 400 blocks, not the 399" in r["count_refused"]
    ref = r["refused"]
    assert ref["range"][:2] == ["IndexError", False], ref
    assert "indices[1] is 2048, outside the tensor's 2048 blocks" in ref["range"][2]
    assert ref["dup"][:2] == ["InvalidArgument", True], ref
    assert "destination blocks 0 and 2 overlap" in ref["dup"][2]
    assert ref["negative"][0] == "IndexError", ref
    assert ref["type"][0] == "TypeError", ref


def test_blocks_host_processes(env):
    """HOST buffers: 5 batches of 400 scattered 1 KiB rows on a channel of
    depth 2, into scattered rows of the receiver's layer; every byte."""
    s, r = run_pair(env, "host")
    check_pair(s, r)
    assert r["batched"] is None


@pytest.mark.skipif(not os.environ.get("FAKE_CUDA_FULL"),
                    reason="FAKE_CUDA_FULL (the fake CUDA driver) not set")
def test_blocks_fake_gpu_processes(env):
    """LEGACY buffers of the fake driver's device 0: one launch of gpuipc's
    block kernel a batch, no batched copy (the fake counts both), every
    byte. The receiving thread has no CUDA context current, as in a
    process that reaches the GPU through gpuipc alone."""
    env["GPUIPC_CUDA_LIB"] = os.environ["FAKE_CUDA_FULL"]
    s, r = run_pair(env, "gpu")
    check_pair(s, r)
    assert r["launched"] == blocks_peer.BATCHES, r
    assert r["batched"] == 0, r


def test_send_blocks_one_call(pair):
    """A numpy array of a gpuipc buffer: one call into the extension for 4
    blocks as for 1000, and the blocks arrive where recv_blocks puts them."""
    tx, rx = pair
    src = gpuipc.empty((1024, 64), "int32").numpy()
    src[:] = np.arange(1024 * 64, dtype=np.int32).reshape(1024, 64)
    dst = gpuipc.empty((1024, 64), "int32").numpy()
    for n in (4, 1000):
        idx = np.random.default_rng(n).permutation(1024)[:n]
        didx = np.random.default_rng(n + 1).permutation(1024)[:n]
        calls, ticket = calls_into_gpuipc(lambda: tx.send_blocks(src, idx))
        assert calls == 1, (n, calls)
        dst[:] = -1
        rx.recv_blocks(dst, didx.tolist(), timeout=10)
        assert np.array_equal(dst[didx], src[idx])
        untouched = np.ones(1024, bool)
        untouched[didx] = False
        assert (dst[untouched] == -1).all()
        assert tx.done(ticket, timeout=10)


def test_send_blocks_checks(pair):
    """Refused before anything is sent: indices out of range, not ints, a
    tensor outside gpuipc memory or not contiguous."""
    tx, rx = pair
    src = gpuipc.empty((16, 8), "uint8").numpy()
    with pytest.raises(IndexError, match=r"indices\[1\] is 16, outside"):
        tx.send_blocks(src, [0, 16])
    with pytest.raises(IndexError, match=r"indices\[0\] is -1"):
        tx.send_blocks(src, np.array([-1]))
    with pytest.raises(TypeError, match=r"indices\[0\] is 1.5, not an int"):
        tx.send_blocks(src, [1.5])
    with pytest.raises(TypeError, match="indices must be"):
        tx.send_blocks(src, 3)
    with pytest.raises(ValueError, match="0 indices"):
        tx.send_blocks(src, [])
    with pytest.raises(ValueError, match="does not lie in a gpuipc buffer"):
        tx.send_blocks(np.zeros((16, 8), np.uint8), [1])
    with pytest.raises(ValueError, match="contiguous"):
        tx.send_blocks(src[:, ::2], [1])
    assert tx.info()["sent"] == 0
    # a block size the receiver does not expect: refused, and it stays
    tx.send_blocks(src, [1, 2])
    small = gpuipc.empty((16, 4), "uint8").numpy()
    with pytest.raises(gpuipc.InvalidArgument, match="block 0 of message 1 is 8 bytes"):
        rx.recv_blocks(small, [0, 1], timeout=10)
    ro = gpuipc.empty((16, 8), "uint8").numpy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        rx.recv_blocks(ro, [0, 1], timeout=10)
    dst = gpuipc.empty((16, 8), "uint8").numpy()
    src[1:3] = [[7] * 8, [9] * 8]
    rx.recv_blocks(dst, [5, 6], timeout=10)
    assert dst[5].tolist() == [7] * 8 and dst[6].tolist() == [9] * 8


class _NoToList(np.ndarray):
    """An integer array whose .tolist() must not be called: indices read in
    place."""

    def tolist(self):
        raise AssertionError("tolist called")


def test_indices_read_in_place(pair):
    """Integer arrays in host memory are read where they lie (numpy of every
    integer width, strided and reversed views, CPU torch tensors), lists and
    tuples as before; every form moves the same blocks, and what is no
    integer array is judged as a sequence, with the same errors."""
    tx, rx = pair
    src = gpuipc.empty((256, 16), "int32").numpy()
    src[:] = np.arange(256 * 16, dtype=np.int32).reshape(256, 16)
    dst = gpuipc.empty((256, 16), "int32").numpy()
    rng = np.random.default_rng(7)
    base = rng.permutation(256)[:40]
    dbase = rng.permutation(256)[:40]
    forms = [
        ("list", lambda a: a.tolist()),
        ("tuple", lambda a: tuple(a.tolist())),
        ("int64", lambda a: a.astype(np.int64)),
        ("int32", lambda a: a.astype(np.int32)),
        ("uint16", lambda a: a.astype(np.uint16)),
        ("uint8", lambda a: a.astype(np.uint8)),
        ("int16 strided", lambda a: np.repeat(a, 2).astype(np.int16)[::2]),
        ("reversed", lambda a: a[::-1].astype(np.int64)[::-1]),
        ("no tolist", lambda a: a.astype(np.int64).view(_NoToList)),
    ]
    try:
        import torch
        forms += [
            ("torch int64", lambda a: torch.from_numpy(a.astype(np.int64))),
            ("torch int32", lambda a: torch.from_numpy(a.astype(np.int32))),
            ("torch strided", lambda a: torch.from_numpy(np.repeat(a, 2))[::2]),
        ]
    except ImportError:
        pass
    for name, form in forms:
        s, d = form(base), form(dbase)
        assert [int(x) for x in s] == base.tolist(), name
        dst[:] = -1
        ticket = tx.send_blocks(src, s)
        rx.recv_blocks(dst, d, timeout=10)
        assert np.array_equal(dst[dbase], src[base]), name
        untouched = np.ones(256, bool)
        untouched[dbase] = False
        assert (dst[untouched] == -1).all(), name
        assert tx.done(ticket, timeout=10), name
    sent = tx.info()["sent"]
    # read in place, checked as a list is
    with pytest.raises(IndexError, match=r"indices\[1\] is 256, outside"):
        tx.send_blocks(src, np.array([0, 256], np.uint16))
    with pytest.raises(IndexError, match=r"indices\[0\] is -3"):
        tx.send_blocks(src, np.array([-3, 1], np.int8))
    with pytest.raises(ValueError, match="0 indices"):
        tx.send_blocks(src, np.zeros(0, np.int64))
    with pytest.raises(gpuipc.InvalidArgument, match="overlap"):
        rx.recv_blocks(dst, np.array([3, 5, 3], np.int32), timeout=0)
    # no integer array: the sequence path's errors, as before
    with pytest.raises(TypeError, match=r"indices\[0\] is True, not an int"):
        tx.send_blocks(src, np.array([True, False]))
    with pytest.raises(TypeError, match=r"indices\[0\] is 1.5, not an int"):
        tx.send_blocks(src, np.array([1.5]))
    with pytest.raises(TypeError, match=r"indices\[0\] is \[1, 2\], not an int"):
        tx.send_blocks(src, np.array([[1, 2]], np.int64))
    with pytest.raises(OverflowError):
        tx.send_blocks(src, np.array([2 ** 63], np.uint64))
    assert tx.info()["sent"] == sent
