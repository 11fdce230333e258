"""Python input checked where it comes in: read-only destinations,
tickets, timeouts, shapes, sizes, streams, dtypes, kinds, use after close;
and a conversion that fails leaves a received view usable. In one process,
both ends of a channel in it (HOST memory)."""
import errno
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gpuipc

# ---- A: read-only destinations ---------------------------------------------

def test_recv_into_refuses_read_only_destinations(pair):
    """recv_into never writes into read-only memory (an immutable bytes
    object, an array whose writeable flag is off), and refusing loses no
    message: the next recv_into gets it."""
    tx, rx = pair
    want = np.arange(16, dtype=np.uint8)
    t = tx.send(want)
    src = b"z" * 16
    ro = np.zeros(16, np.uint8)
    ro.flags.writeable = False
    for dst in (np.frombuffer(src, np.uint8), src, memoryview(src), ro):
        with pytest.raises(ValueError, match="read-only"):
            rx.recv_into(dst, timeout=5)
    assert src == bytes([ord("z")] * 16) and not ro.any()
    assert not tx.done(t, timeout=0)  # still in the channel
    out = np.zeros(16, np.uint8)
    rx.recv_into(out, timeout=5)
    assert (out == want).all()
    assert tx.done(t, timeout=5)


# ---- C: tickets and timeouts -----------------------------------------------

def test_tickets_out_of_range_are_refused(pair):
    """A ticket is 0 .. 2**64 - 1: a negative or larger one is a
    ValueError (it no longer wraps onto a real ticket), a bool or float a
    TypeError."""
    tx, rx = pair
    t = tx.send(np.zeros(4))
    for bad in (-1, -t, t + 2 ** 64, 2 ** 70):
        with pytest.raises(ValueError, match="ticket"):
            tx.done(bad)
        with pytest.raises(ValueError, match="ticket"):
            tx.wait(bad, timeout=0)
    for bad in (True, 1.0, "1"):
        with pytest.raises(TypeError, match="ticket"):
            tx.done(bad)
    rx.recv(timeout=5).release()
    assert tx.done(t, timeout=5)


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, -1, -0.5, True, False],
                         ids=repr)
def test_timeouts_must_be_finite_seconds(bad, pair):
    """Timeouts are None (forever) or finite seconds >= 0: infinity, NaN,
    negatives and bools are refused, naming the timeout, before the call
    does anything."""
    err = TypeError if isinstance(bad, bool) else ValueError
    with pytest.raises(err, match="timeout"):
        gpuipc.Domain("never-joined", timeout=bad)
    tx, rx = pair
    t = tx.send(np.zeros(4))
    with pytest.raises(err, match="timeout"):
        rx.recv(timeout=bad)
    with pytest.raises(err, match="timeout"):
        tx.done(t, timeout=bad)
    with rx.recv(timeout=None) as v:  # None stays "forever"
        assert v.shape == (4,)


# ---- D: shapes, sizes, streams ---------------------------------------------

BAD_BUFFER_ARGS = {
    "empty((-1, 4))": (lambda: gpuipc.empty((-1, 4)), ValueError, "shape"),
    "empty((2, -3))": (lambda: gpuipc.empty((2, -3)), ValueError, "shape"),
    "empty(-5)": (lambda: gpuipc.empty(-5), ValueError, "shape"),
    "Buffer(shape=(-2, 8))": (lambda: gpuipc.Buffer(4096, shape=(-2, 8)), ValueError, "shape"),
    "empty((2.5, 4))": (lambda: gpuipc.empty((2.5, 4)), TypeError, "shape"),
    "empty(4.0)": (lambda: gpuipc.empty(4.0), TypeError, "shape"),
    "empty((True, 4))": (lambda: gpuipc.empty((True, 4)), TypeError, "shape"),
    "Buffer(shape=(2.0, 8))": (lambda: gpuipc.Buffer(4096, shape=(2.0, 8)), TypeError, "shape"),
    "Buffer(4096.0)": (lambda: gpuipc.Buffer(4096.0), TypeError, "nbytes"),
    "Buffer(4096.7)": (lambda: gpuipc.Buffer(4096.7), TypeError, "nbytes"),
    "Buffer(0)": (lambda: gpuipc.Buffer(0), ValueError, "nbytes"),
    "Buffer(shape too large)": (lambda: gpuipc.Buffer(4096, shape=(4096,), dtype="float32"),
                                ValueError, "shape"),
    "empty(dtype U4)": (lambda: gpuipc.empty(4, "U4"), ValueError, "dtype"),
    "empty(dtype unknown)": (lambda: gpuipc.empty(4, "not-a-dtype"), ValueError, "dtype"),
    "view(shape=(-1,))": (lambda: gpuipc.empty(4).view("float32", (-1,)), ValueError, "shape"),
    "view(offset=1.5)": (lambda: gpuipc.empty(4).view("float32", (2,), offset=1.5),
                         TypeError, "offset"),
}


@pytest.mark.parametrize("case", list(BAD_BUFFER_ARGS))
def test_buffer_arguments_are_checked(case):
    """Sizes, shapes, offsets and dtypes: a TypeError or ValueError that
    names the argument, before anything is allocated."""
    call, err, word = BAD_BUFFER_ARGS[case]
    with pytest.raises(err, match=word):
        call()


def test_empty_sizes_are_exact():
    b = gpuipc.empty((3, 0, 2), "int16")
    assert b.shape == (3, 0, 2) and b.numpy().shape == (3, 0, 2)
    b = gpuipc.empty((5, 3), "float64")
    assert b.nbytes >= 120 and b.numpy().shape == (5, 3)


def test_a_host_send_checks_its_stream(pair):
    """A host send takes no stream, but what it is given must be one."""
    tx, rx = pair
    for obj in (np.zeros(4), gpuipc.empty(4)):
        for bad in ("x", 1.5, True):
            with pytest.raises(TypeError, match="stream"):
                tx.send(obj, stream=bad)
    with pytest.raises(gpuipc.WouldBlock):
        rx.recv(timeout=0)  # nothing was sent


# ---- D: dtypes -----------------------------------------------------------------

@pytest.mark.parametrize("arr", [
    np.array([object(), 1], dtype=object),
    np.array(["2026-11-27"], dtype="datetime64[ns]"),
    np.array([1], dtype="timedelta64[s]"),
    np.array(["ab"], dtype="U2"),
    np.zeros(4, dtype="V2"),
    np.zeros(4, dtype=[("a", "u1"), ("b", "u1")]),
    np.zeros(4, dtype=[("a", "<f2")]),
], ids=["object", "datetime64", "timedelta64", "str", "void2", "struct2", "struct-f2"])
def test_unsupported_dtypes_are_refused_clearly(pair, arr):
    """Objects, dates, strings, raw bytes and structured types cannot be
    sent: a ValueError that names the dtype, and nothing is sent (a 2-byte
    void or structured type is no bfloat16)."""
    tx, rx = pair
    with pytest.raises(ValueError, match="dtype") as e:
        tx.send(arr)
    assert "invalid literal" not in str(e.value)
    with pytest.raises(gpuipc.WouldBlock):
        rx.recv(timeout=0)


def test_real_bfloat16_still_maps_to_bfloat16(pair):
    """A gpuipc buffer of bfloat16 (by name or torch's dtype) and a torch
    bfloat16 tensor cross as DLPack's bfloat16."""
    torch = pytest.importorskip("torch")
    tx, rx = pair
    sent = [gpuipc.empty(4, "bfloat16"), gpuipc.empty(4, torch.bfloat16),
            torch.ones(4, dtype=torch.bfloat16)]
    for obj in sent:
        tx.send(obj)
        with rx.recv(timeout=5) as v:
            assert v._dl_dtype == (4, 16, 1)
    t = torch.arange(4, dtype=torch.bfloat16)
    tx.send(t)
    v = rx.recv(timeout=5)
    assert torch.equal(torch.from_dlpack(v), t)


# ---- D: a failed conversion leaves the view usable -------------------------

def test_bool_view_numpy_and_refused_dlpack_keep_the_view(pair):
    """numpy() serves every dtype (bool too, which numpy 1.24's DLPack
    lacks); a DLPack consumer that refuses the view (torch 1.13 knows no
    DLPack bool; a capsule dropped unconsumed) leaves it with the Tensor,
    unreleased, while the exception is still alive too."""
    tx, rx = pair
    want = np.array([True, False, True, True])
    t = tx.send(want)
    v = rx.recv(timeout=5)
    cap = v.__dlpack__()
    del cap  # no consumer took it
    assert "released" not in repr(v)
    try:
        import torch
        try:
            got = torch.from_dlpack(v).numpy()
        except (RuntimeError, TypeError, BufferError) as e:
            assert not tx.done(t, timeout=0), e  # not given back
            got = v.numpy()  # still usable, inside the handler too
    except ImportError:
        got = v.numpy()
    assert (got == want).all() and got.dtype == np.bool_
    del got
    import gc
    gc.collect()
    assert tx.done(t, timeout=5)  # given back once its arrays went


def test_numpy_of_every_dtype_and_shape(pair):
    """numpy() reads the view through the array interface: 0-d and
    bool views too, and hands the view over (given back when the array
    goes)."""
    tx, rx = pair
    for a in (np.array(7, np.int16), np.array([[True], [False]]), np.arange(3.0)):
        t = tx.send(a)
        v = rx.recv(timeout=5)
        got = v.numpy()
        assert got.shape == a.shape and got.dtype == a.dtype and (got == a).all()
        assert repr(v).endswith(" released>")
        assert not tx.done(t, timeout=0)
        del got
        assert tx.done(t, timeout=5)


# ---- D: use after close ------------------------------------------------------

def test_use_after_close_is_a_value_error(dom, pair):
    """Every use of a closed, released or left object raises gpuipc.Closed,
    a ValueError (as a closed file does)."""
    assert issubclass(gpuipc.Closed, ValueError)
    assert issubclass(gpuipc.Closed, gpuipc.Error)
    tx, rx = pair
    tx.send(np.zeros(4))
    v = rx.recv(timeout=5)
    v.release()
    b = gpuipc.empty(4)
    b.release()
    tx.close()
    for call in (lambda: tx.send(np.zeros(4)), lambda: tx.info(), lambda: v.numpy(),
                 lambda: np.asarray(v), lambda: b.numpy(), lambda: b.export()):
        with pytest.raises(gpuipc.Closed):
            call()


def test_domain_of_the_parent_is_a_value_error(env):
    """A fork() child using its parent's domain gets gpuipc.Closed
    (GPUIPC_E_CLOSED), which is a ValueError."""
    code = textwrap.dedent("""
        import os, gpuipc
        d = gpuipc.Domain("forked")
        pid = os.fork()
        if pid == 0:
            try:
                d.stat("x")
                os._exit(3)
            except ValueError as e:
                os._exit(0 if isinstance(e, gpuipc.Closed) else 4)
            except BaseException:
                os._exit(5)
        _, st = os.waitpid(pid, 0)
        d.leave()
        print(os.waitstatus_to_exitcode(st))
        """)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0"]


def test_pinned_is_a_bool_and_unpinned_segments_carry_bytes(dom):
    """``pinned`` takes True or False only (TypeError otherwise, nothing
    created); a segment created and opened unpinned holds and shows the
    same bytes (on this machine no CUDA: only the flag's path)."""
    for bad in (0, 1, None, "no"):
        with pytest.raises(TypeError, match="pinned must be True or False"):
            dom.create_segment("pin-bad", 4096, pinned=bad)
        with pytest.raises(TypeError, match="pinned must be True or False"):
            dom.open_segment("pin-bad", pinned=bad)
    with pytest.raises(gpuipc.NotFound):
        dom.open_segment("pin-bad")
    s = dom.create_segment("pin-off", 4096, exclusive=True, pinned=False)
    s.numpy()[:4] = [1, 2, 3, 4]
    s.publish()
    o = dom.open_segment("pin-off", pinned=False)
    assert list(o.numpy()[:4]) == [1, 2, 3, 4]
    o.release()
    s.release()
    dom.unlink("pin-off")


# ---- D: state dicts of numpy arrays ----------------------------------------

def test_state_dict_of_numpy_arrays_is_a_clear_type_error(dom):
    pytest.importorskip("torch")
    from gpuipc import state_dict
    with pytest.raises(TypeError, match="torch tensor"):
        state_dict.publish(dom, "sd", {"w": np.zeros(4, np.float32)})
    with pytest.raises(TypeError, match="torch tensor"):
        state_dict.copy_into(dom, "sd", {"w": np.zeros(4, np.float32)}, timeout=0)


# ---- E: kinds, the C library's list ----------------------------------------

def test_kinds_are_the_c_librarys_list():
    """The kinds the package takes (by name or as a constant) are the C
    library's (gpuipc.h's GPUIPC_KIND_MAP, the extension's KINDS): each a
    constant of the package and its stubs, and a kind to C; the value after
    the last is none, nor is an unknown name."""
    from gpuipc import _common, _gpuipc as _c
    assert _common._KINDS == _c.KINDS
    assert sorted(_c.KINDS.values()) == list(range(len(_c.KINDS)))
    stubs = os.path.join(os.path.dirname(gpuipc.__file__), "__init__.pyi")
    with open(stubs) as f:
        stub_lines = f.read().splitlines()
    for name, value in _c.KINDS.items():
        assert getattr(gpuipc, name.upper(), None) == value, name
        assert f"{name.upper()}: int" in stub_lines, name
        assert _common._kind(name) == value
        rc, why = _c.kind_available(value)
        assert rc != -errno.EINVAL, (name, why)
    rc, why = _c.kind_available(len(_c.KINDS))
    assert rc == -errno.EINVAL and "unknown kind" in why
    with pytest.raises(ValueError, match="unknown kind"):
        gpuipc.empty(4, kind="no-such-kind")
