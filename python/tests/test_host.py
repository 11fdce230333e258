"""The gpuipc Python package on the HOST kind, across real processes:
segments, channels (staged and zero-copy), numpy and torch (CPU) tensors,
errors as exceptions, a peer killed with SIGKILL, asyncio."""
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import peer  # noqa: E402  (pattern, digest, ARRAYS)


class Proc:
    """A peer.py process whose JSON lines are read as they come."""

    def __init__(self, env, role, dom, arg=None):
        cmd = [sys.executable, os.path.join(HERE, "peer.py"), role, dom]
        if arg is not None:
            cmd.append(arg)
        self.p = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)

    def line(self):
        s = self.p.stdout.readline()
        assert s, f"peer exited (rc {self.p.wait()}) without answering"
        return json.loads(s)

    def finish(self, timeout=60):
        try:
            out, _ = self.p.communicate("\n", timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            raise
        assert self.p.returncode == 0, f"peer exited with {self.p.returncode}"
        return [json.loads(x) for x in out.splitlines() if x.strip()]

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


@pytest.fixture
def procs():
    started = []
    yield started
    for p in started:
        p.kill()


def start(procs, *a):
    p = Proc(*a)
    procs.append(p)
    return p


def test_segment_published_bytes_reach_another_process(env, procs):
    creator = start(procs, env, "seg_create", "d")
    assert creator.line() == {"filling": "weights", "state": "filling"}
    reader = start(procs, env, "seg_open", "d")  # waits for the publication
    assert creator.line() == {"published": True}
    got = reader.finish()[-1]
    assert got["sha"] == peer.digest(peer.pattern(11, (1 << 20,), "uint8"))
    assert got["nbytes"] == 1 << 20 and got["kind"] == "host"
    assert got["zero_copy"] is True
    creator.finish()


def test_channel_carries_every_dtype_and_layout(env, procs):
    rx = start(procs, env, "recv_arrays", "d")
    tx = start(procs, env, "send_arrays", "d")
    got = rx.finish()[-1]["got"]
    want = []
    for seed, shape, dtype in peer.ARRAYS:
        a = peer.pattern(seed, shape, dtype)
        want.append([a.dtype.str, list(shape), peer.digest(a)])
    strided = peer.pattern(8, (8, 6), "int32")[::2, 1::2]
    want.append(["<i4", [4, 3], peer.digest(strided)])
    want.append(["<f8", [4, 4], peer.digest(peer.pattern(9, (4, 4), "float64"))])
    assert got == want
    assert tx.finish()[-1] == {"sent": len(want)}


def test_zero_copy_view_is_the_senders_buffer(env, procs):
    rx = start(procs, env, "zero_copy_recv", "d")
    tx = start(procs, env, "zero_copy_send", "d")
    r = rx.finish()[-1]
    s = tx.finish()[-1]
    # np.from_dlpack's array lies at the received buffer's mapping...
    assert r["ptr"] == r["buffer_ptr"] + r["byte_offset"]
    # ...which is the sender's memfd mapped here, not a copy:
    assert r["mapping"] is not None and "memfd:" in r["mapping"]
    assert r["sha"] == peer.digest(peer.pattern(21, (256, 256), "float32"))
    # the sender's later write shows through the receiver's array
    assert r["row_after"] == [1.0, 2.0, 3.0, 4.0]
    assert r["released"] is True
    assert s["held_while_viewed"] is True and s["freed_after"] is True
    # two handles went: the buffer itself, and the staging buffer of "go"
    assert s["info"] == 2


@pytest.mark.skipif(not os.environ.get("FAKE_CUDA_FULL"),
                    reason="FAKE_CUDA_FULL (the fake CUDA driver) not set")
def test_host_work_loads_no_cuda(env, procs):
    """Where a CUDA driver is (the fake here), processes that only move host
    memory (a published segment, arrays through a channel, zero-copy views)
    never load it: no context, no GPU memory, no CUDA start-up."""
    env["GPUIPC_CUDA_LIB"] = os.environ["FAKE_CUDA_FULL"]
    env["PEER_DRIVER_CHECK"] = "1"
    creator = start(procs, env, "seg_create", "d")
    assert creator.line()["state"] == "filling"
    reader = start(procs, env, "seg_open", "d")
    assert creator.line() == {"published": True}
    got = reader.finish()
    assert got[-2]["sha"] == peer.digest(peer.pattern(11, (1 << 20,), "uint8"))
    assert got[-1] == {"driver_loaded": False}
    assert creator.finish()[-1] == {"driver_loaded": False}
    for rx_role, tx_role in (("recv_arrays", "send_arrays"),
                             ("zero_copy_recv", "zero_copy_send")):
        rx = start(procs, env, rx_role, "d")
        tx = start(procs, env, tx_role, "d")
        r, t = rx.finish(), tx.finish()
        assert len(r) >= 2 and len(t) >= 2, (r, t)
        assert r[-1] == {"driver_loaded": False}, rx_role
        assert t[-1] == {"driver_loaded": False}, tx_role


def test_torch_cpu_tensors(env, procs):
    pytest.importorskip("torch")
    rx = start(procs, env, "torch_recv", "d")
    tx = start(procs, env, "torch_send", "d")
    assert rx.finish(timeout=120)[-1] == {"same": [True, True, True, True]}
    tx.finish(timeout=60)


def test_torch_tensors_and_views_sent_on(env, procs):
    """Every form of CPU torch tensor the send path reads in C (at an
    offset, 0-d, bool, bfloat16, complex, Parameter, requiring grad)
    crosses, and comes back as the received host view sent on: every byte
    checked. Strided views are refused with a sentence that says why; a
    received tensor dropped without a release is given back. With a gpuipc
    buffer alive, a tensor outside it is still staged (no handle crosses)
    and one inside it crosses as that buffer (its handle does)."""
    pytest.importorskip("torch")
    n = len(peer.torch_forms()[0]) + 2
    echo = start(procs, env, "torch_echo", "d", str(n))
    tx = start(procs, env, "torch_echo_send", "d")
    assert tx.finish(timeout=120)[-1] == {"same": [True] * n, "n": n,
                                          "refused": [True, True],
                                          "handles": [0, 1],
                                          "dropped_is_released": True}
    assert echo.finish(timeout=60)[-1] == {"echoed": n}


def test_held_view_holds_up_no_other_message(env, procs):
    """A receiver that keeps one view costs the sender that message alone:
    ten depths of staged messages go past it, its bytes stay as sent, and
    info() names it as the one in flight until it is let go."""
    rx = start(procs, env, "hold_recv", "d")
    tx = start(procs, env, "hold_send", "d")
    s = tx.finish()[-1]
    r = rx.finish()[-1]
    assert s == {"sent": peer.HOLD_N, "others_done": True, "held": True,
                 "in_flight": 1, "oldest": 1, "freed": True,
                 "oldest_after": 0}
    assert r == {"others_ok": True, "held_intact": True}


def test_done_tickets_are_let_go_past_one_not_done(monkeypatch):
    """Channel._hold keeps what a staged GPU copy reads until its message is
    free; one message held long must not keep every later one."""
    import threading
    from gpuipc import _channel

    class C:
        @staticmethod
        def channel_send_done(box, ticket, ms):
            return ticket != 1  # message 1 is held, every other one free

    monkeypatch.setattr(_channel, "_c", C)
    ch = _channel.Channel.__new__(_channel.Channel)
    ch._box, ch._keep, ch._lock = None, {}, threading.Lock()
    for t in range(1, 101):
        ch._hold(t, ("tensor", t))
    assert 1 in ch._keep and len(ch._keep) <= 9


def test_errors_are_exceptions_with_name_and_sentence(env, procs):
    r = start(procs, env, "errors", "d").finish()[-1]
    assert r["notfound"][0] == "ENOENT" and r["notfound"][2] is True
    assert "absent" in r["notfound"][1]
    assert r["timeout"] == ["ETIMEDOUT", True]
    assert r["exists"] == "EEXIST"
    assert r["already"] == "EALREADY"
    assert r["mismatch"][:2] == ["GPUIPC_E_MISMATCH", True] and "8192" in r["mismatch"][2]
    assert r["badname"] == ["EINVAL", True]
    assert r["open_timeout"] == "ETIMEDOUT"
    assert r["poll"] == ["EAGAIN", True]
    assert r["recv_timeout"] == ["ETIMEDOUT", True]
    assert r["large"] == [[64 << 20], True]  # every byte of 64 MiB arrived
    assert "neither DLPack" in r["not_tensor"]
    assert "big-endian" in r["big_endian"]
    assert r["closed_peer"] == ["GPUIPC_E_PEER_GONE", True]
    assert "closed" in r["use_after_close"]


def test_sender_killed_mid_stream_receiver_gets_peer_gone(env, procs):
    rx = start(procs, env, "stream_recv", "d")
    tx = start(procs, env, "stream_send", "d")
    assert rx.line() == {"got": 5}
    os.kill(tx.p.pid, signal.SIGKILL)
    tx.p.wait()
    r = rx.finish(timeout=30)[-1]
    assert r["peer_gone"] == "GPUIPC_E_PEER_GONE" and r["received"] >= 5


def test_receiver_killed_blocked_sender_gets_peer_gone(env, procs):
    rx = start(procs, env, "stream_recv", "d", "hold")
    tx = start(procs, env, "blocked_sender", "d")
    assert tx.line() == {"sent": 4}
    assert rx.line() == {"holding": 4}
    os.kill(rx.p.pid, signal.SIGKILL)
    rx.p.wait()
    assert tx.finish(timeout=30)[-1] == {"peer_gone": "GPUIPC_E_PEER_GONE"}


@pytest.mark.parametrize("how", ["drop", "hold"])
def test_fork_child_leaves_the_parents_channel_alone(env, procs, how):
    """A child made by os.fork() that lets go of the channel it inherited
    (and of a view it inherited) and exits with sys.exit(0) -- its
    references dropped, or finalised at interpreter shutdown -- tells the
    peer nothing: the parent goes on exchanging messages with it."""
    echo = start(procs, env, "fork_echo", "d")
    fork = start(procs, env, "fork_close", "d", how)
    want = [peer.digest(peer.pattern(peer.FORK_SEED + i, (256,), "int32"))
            for i in range(peer.FORK_MESSAGES)]
    assert fork.finish()[-1] == {"child": 0, "got": want, "peer_gone": False,
                                 "received": peer.FORK_MESSAGES}
    assert echo.finish()[-1] == {"got": want}


def test_asyncio_recv(env, procs):
    rx = start(procs, env, "async_recv", "d")
    tx = start(procs, env, "async_send", "d")
    want = [[peer.digest(peer.pattern(100 * k + i, (4096,), "uint8"))
             for i in range(peer.ASYNC_MESSAGES)]
            for k in range(peer.ASYNC_CHANNELS)]
    assert rx.finish()[-1] == {"sha": want, "threads": 1,
                               "fds": peer.ASYNC_CHANNELS}
    tx.finish()


def test_error_hierarchy_in_process():
    import gpuipc
    assert issubclass(gpuipc.TimeoutError, gpuipc.Error)
    assert issubclass(gpuipc.TimeoutError, TimeoutError)
    assert issubclass(gpuipc.PeerGone, gpuipc.Error)
    assert gpuipc.err_name(-110) == "ETIMEDOUT"
    assert gpuipc.err_name(gpuipc._gpuipc.E_PEER_GONE) == "GPUIPC_E_PEER_GONE"
    e = gpuipc._errors.error_for(-1007, "GPUIPC_E_PEER_GONE", "peer 12 has gone")
    assert isinstance(e, gpuipc.PeerGone) and e.detail == "peer 12 has gone"


def test_buffer_ranges_seen_in_c():
    """What the send paths see of this process's buffers is the library's
    index (gpuipc_buf_find): a range in a live buffer is found (for its
    device type only), one past its end or in heap memory is not, and a
    buffer released or collected leaves nothing behind."""
    import gc
    import gpuipc
    from gpuipc import _gpuipc as c
    from gpuipc._common import DL_CPU, DL_CUDA

    def found(typ, lo, hi):
        box = c.buf_find(typ, lo, hi)
        if box is None:
            return None
        ptr = c.buf_info(box)[0]
        c.close(box)
        return ptr

    a, b = gpuipc.Buffer(4096), gpuipc.Buffer(3 << 20)
    for buf in (a, b):
        assert found(DL_CPU, buf.ptr, buf.ptr + buf.nbytes) == buf.ptr
        assert found(DL_CPU, buf.ptr + buf.nbytes - 1, buf.ptr + buf.nbytes) == buf.ptr
        assert found(DL_CPU, buf.ptr + 8, buf.ptr + buf.nbytes + 1) is None
        assert found(DL_CUDA, buf.ptr, buf.ptr + 1) is None
    heap = np.zeros(16)
    hp = heap.__array_interface__["data"][0]
    assert found(DL_CPU, hp, hp + 8) is None
    ap, bp = a.ptr, b.ptr
    a.release()
    assert found(DL_CPU, ap + 8, ap + 9) is None
    assert found(DL_CPU, bp + 8, bp + 9) == bp
    del b, buf
    gc.collect()
    assert found(DL_CPU, bp + 8, bp + 9) is None


def _go(p):
    p.p.stdin.write("\n")
    p.p.stdin.flush()


def test_state_dict_lent(env, procs):
    """Tensors in gpuipc memory are lent in place: one segment per buffer,
    readers see the publisher's later writes (copied tensors do not), a
    buffer keeps its segment from version to version (the reader maps it
    once), a buffer no longer used is unlinked."""
    pytest.importorskip("torch")
    pub = start(procs, env, "sd_lend_publish", "d")
    assert pub.line() == {"published": 1, "segments": 2, "copied": True,
                          "lent": ["a0", "a1", "b"]}
    rd = start(procs, env, "sd_lend_read", "d")
    assert rd.line() == {"version": 1, "same": True, "n": 4}
    _go(pub)
    assert pub.line() == {"wrote": True}
    _go(rd)
    assert rd.line() == {"lent_sees": -1.0, "copy_keeps": 7.0}
    _go(pub)
    assert pub.line() == {"published": 2, "kept": True, "unlinked": [True],
                          "copied": False, "old_pack_gone": True}
    _go(rd)
    assert rd.line() == {"version": 2, "same": True, "reused": True, "views_kept": True,
                         "old_b_intact": True}
    assert rd.line() == {"copied_version": 2, "copy_same": True}
    rd.finish()
    pub.finish()


def test_state_dict_relend_leaves_nothing(env, procs):
    """A buffer that leaves the state dict and comes back is lent again
    (not copied), and each lend it had goes from the broker once its
    version is retired: after 40 versions the broker holds the entries and
    descriptors it held after the first two."""
    pytest.importorskip("torch")
    r = start(procs, env, "sd_relend", "d").line()
    assert r == {"copied": False, "first": r["first"], "last": r["first"]}


def test_state_dict_unmoved_versions(env, procs):
    """A lent version where every tensor lies where it lay writes no
    manifest: the head names the last one's, readers that had it hand out
    the same tensors (seeing the in-place writes), a reader with nothing
    cached and copy_into find the version through it, and a later version
    that moves a tensor (from a publisher started anew) retires the old
    manifest and segments."""
    pytest.importorskip("torch")
    pub = start(procs, env, "sd_same_publish", "d")
    assert pub.line() == {"published": 1, "manifest": True}
    rd = start(procs, env, "sd_same_read", "d")
    assert rd.line() == {"version": 1, "a": 0.0, "b": list(range(10))}
    _go(pub)
    assert pub.line() == {"published": [2, 3], "manifests": [False, False],
                          "first_kept": True}
    _go(rd)
    assert rd.line() == {"version": 3, "same_tensors": True, "a": 6.0,
                         "fresh": [3, 6.0, True], "copied": [3, True, True]}
    _go(pub)
    assert pub.line() == {"published": 4, "manifest": True, "old_gone": True}
    _go(rd)
    assert rd.line() == {"version": 4, "a": 6.0, "b": [2 * i for i in range(10)],
                         "old_intact": True}
    rd.finish()
    pub.finish()

def test_state_dict_versions(env, procs):
    pytest.importorskip("torch")
    pub = start(procs, env, "sd_publish", "d")
    assert pub.line() == {"published": 1}
    rd = start(procs, env, "sd_read", "d")
    assert rd.line() == {"version": 1, "same": True, "n": 7}
    pub.p.stdin.write("\n")
    pub.p.stdin.flush()
    assert pub.line() == {"published": 2}
    rd.p.stdin.write("\n")
    rd.p.stdin.flush()
    assert rd.line() == {"old_intact": True, "new_version": 2, "new_same": True,
                         "old_name_gone": True, "mixed_same": True, "missing": "'nope'"}
    rd.finish()
    pub.finish()


def _published(d):
    return {s["name"] for s in d.segments() if s["state"] == "published"}


def _lent_names(d):
    """The segments of state dict "w" named by their publisher: lent, or
    holding copies (".c")."""
    return {n for n in _published(d) if re.fullmatch(r"w\.[0-9a-f]{6}\.c?\d+", n)}


@pytest.fixture
def joined(env):
    """(environment of the peers, domain name) for a test that joins the
    domain itself: the library reads GPUIPC_DIR once a process, so the
    peers use this process's runtime directory, and a name of their own."""
    e = dict(env)
    if "GPUIPC_DIR" in os.environ:
        e["GPUIPC_DIR"] = os.environ["GPUIPC_DIR"]
    else:
        del e["GPUIPC_DIR"]
    return e, "sd" + os.urandom(4).hex()


@pytest.mark.parametrize("retired", ["w.v1.m", "data"])
def test_state_dict_reader_skips_a_retired_version(joined, procs, retired):
    """A reader that read version 1 from the head, whose manifest the
    publisher retired (versions 2 and 3 came out) before the reader opened
    it, opens version 3 at once: it never waits for a name that is gone
    (its timeout is forever). One that opened version 1's manifest and
    then its copies' segment after versions 2 and 3 came out gets version
    1 whole: holding the manifest kept the publisher from reusing the
    segment for version 3 (never version 1's manifest over version 3's
    bytes)."""
    torch = pytest.importorskip("torch")
    import gpuipc
    from gpuipc import state_dict
    env, dom = joined
    with gpuipc.Domain(dom) as d:  # hosts the broker
        pub = start(procs, env, "sd_race_publish", dom)
        assert pub.line() == {"published": 1}
        opened, raced = d.open_segment, []

        def open_segment(name, wait=False, **kw):
            is_data = re.fullmatch(r"w\.[0-9a-f]{6}\.c1", name) is not None
            if (name == retired or is_data and retired == "data") and not raced:
                # the reader read 1 from the head
                raced.append(name)
                for ver in (2, 3):
                    pub.p.stdin.write("more\n")
                    pub.p.stdin.flush()
                    assert pub.line() == {"published": ver}
            if wait and name not in _published(d) and name != "w":
                raise AssertionError(f"the reader waits for {name}, which is gone")
            return opened(name, wait=wait, **kw)
        d.open_segment = open_segment
        r = state_dict.Reader(d, "w", timeout=None)
        sd = r.open()
        assert len(raced) == 1
        want = 1 if retired == "data" else 3
        assert sd.version == want
        if retired == "data":  # version 3 went elsewhere
            assert state_dict._manifest(d, "w", 3, 5)["data"] != raced[0]
        assert all(torch.equal(sd[k], t) for k, t in peer.sd_make(want).items())
        sd.release()
        r.close()
        pub.finish()


def test_state_dict_head_appears_with_its_first_version(joined, procs):
    """Until its first version is published, a state dict has no head (a
    reader would find a head naming no version); a reader that came
    meanwhile (its timeout is forever) gets version 1."""
    import threading
    torch = pytest.importorskip("torch")
    import gpuipc
    from gpuipc import state_dict
    env, dom = joined
    with gpuipc.Domain(dom) as d:
        pub = start(procs, env, "sd_stop_publish", dom, "first_head")
        assert pub.line() == {"stopped": "first_head", "version": 1}
        assert "w.v1.m" in _published(d)
        assert "w" not in {s["name"] for s in d.segments()}
        got = []
        reader = threading.Thread(target=lambda: got.append(state_dict.open(d, "w", timeout=None)))
        reader.start()
        _go(pub)
        assert pub.line() == {"published": 1}
        reader.join()
        assert got[0].version == 1
        assert all(torch.equal(got[0][k], t) for k, t in peer.sd_make(1).items())
        got[0].release()
        pub.finish()


@pytest.mark.parametrize("stop", ["before_head", "before_retire", "lent_before_head"])
def test_state_dict_publisher_killed_mid_publish_leaves_no_version(joined, procs, stop):
    """A publisher killed (SIGKILL) after writing version 2 and before the
    head names it, or before it retired version 1, leaves a version behind
    (lent: a segment lent for version 2 too); the next publisher's version
    (all lent: it writes no data segment) unlinks it and keeps its own,
    which readers read; a reader of version 1 keeps its tensors."""
    torch = pytest.importorskip("torch")
    import gpuipc
    from gpuipc import state_dict
    env, dom = joined
    with gpuipc.Domain(dom) as d:  # hosts the broker, which outlives the kill
        pub = start(procs, env, "sd_stop_publish", dom, stop)
        assert pub.line() == {"published": 1}
        held = state_dict.open(d, "w")
        _go(pub)
        assert pub.line() == {"stopped": stop, "version": 2}
        os.kill(pub.p.pid, signal.SIGKILL)
        pub.p.wait()
        left = {"before_head": {"w.v2.m"}, "before_retire": {"w.v1.m", "w.v2.m"},
                "lent_before_head": {"w.v2.m"}}[stop]
        assert left <= _published(d)
        assert len(_lent_names(d)) == 2  # version 1's and version 2's (lent or copies)
        buf = gpuipc.Buffer(1 << 16)
        want = torch.arange(64.0).reshape(16, 4)
        sd = {"x": peer._host_tensor(buf, torch.float32, (16, 4), want)}
        with state_dict.Publisher(d, "w", lend=True) as p2:
            ver = p2.publish(sd)
            versions = sorted(n for n in _published(d) if re.fullmatch(r"w\.v\d+(\.m)?", n))
            assert versions == [f"w.v{ver}.m"]
            assert _lent_names(d) == set(state_dict._manifest(d, "w", ver, 5)["segments"])
            with state_dict.open(d, "w") as got:
                assert got.version == ver and torch.equal(got["x"], want)
        v1 = peer.sd_lent(1) if stop.startswith("lent_") else peer.sd_make(1)
        assert all(torch.equal(held[k], t) for k, t in v1.items())
        held.release()


# ---- a module moved into gpuipc memory; snapshots that reuse their segments --

def test_move_to_gpuipc_keeps_the_parameters():
    """move_to_gpuipc moves a CPU module's tensors into one HOST buffer in
    place: the same Parameter objects (tied ones still one), the same
    values, an optimizer made before the move (its state too) trains them
    in the buffer, and buffers move only when asked."""
    torch = pytest.importorskip("torch")
    from gpuipc.torch import move_to_gpuipc
    m = peer.sd_module("cpu")
    m[1].weight.data = m[1].weight.data.t().contiguous().t()  # not contiguous
    assert not m[1].weight.is_contiguous()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    params = list(m.parameters())
    opt = torch.optim.Adam(m.parameters(), lr=0.1)
    peer._train_step(m, opt, "cpu")
    stepped = {k: v.clone() for k, v in m.state_dict().items()}
    bufs = move_to_gpuipc(m)
    assert len(bufs) == 1 and bufs[0].kind == "host"
    assert list(m.parameters()) == params and all(a is b for a, b in zip(params, m.parameters()))
    assert m[3].weight is m[0].weight
    assert all(torch.equal(stepped[k], v) for k, v in m.state_dict().items())
    raw = torch.from_dlpack(bufs[0])
    lo, hi = raw.data_ptr(), raw.data_ptr() + raw.numel()
    assert all(lo <= p.data_ptr() < hi and p.data_ptr() % 256 == 0 for p in params)
    assert m[1].weight.is_contiguous()
    assert not lo <= m[2].running_mean.data_ptr() < hi  # buffers stay
    w = m[0].weight
    off = w.data_ptr() - lo
    in_buf = lambda: raw[off:off + w.numel() * 4].view(torch.float32).view(w.shape)  # noqa: E731
    peer._train_step(m, opt, "cpu")  # Adam's moments from before the move
    assert not torch.equal(in_buf(), stepped["0.weight"])
    assert torch.equal(in_buf(), m[0].weight.detach())
    assert move_to_gpuipc(m) == []  # already there
    moved = move_to_gpuipc(m, buffers=True)
    assert len(moved) == 1 and moved[0].ptr <= m[2].running_mean.data_ptr() < moved[0].ptr + \
        moved[0].nbytes
    assert not torch.equal(before["0.weight"], m[0].weight)


def test_move_to_gpuipc_refuses_what_cannot_move():
    """Sparse and meta tensors and a GPU kind for CPU tensors are refused
    before anything moves."""
    torch = pytest.importorskip("torch")
    from gpuipc.torch import move_to_gpuipc

    def module_with(t):
        m = torch.nn.Linear(4, 4)
        m.register_parameter("extra", torch.nn.Parameter(t, requires_grad=False))
        return m
    cases = [(torch.eye(3).to_sparse(), TypeError, "sparse"),
             (torch.empty(3, device="meta"), ValueError, "meta")]
    for t, exc, word in cases:
        m = module_with(t)
        ptr = m.weight.data_ptr()
        with pytest.raises(exc, match=word):
            move_to_gpuipc(m)
        assert m.weight.data_ptr() == ptr  # nothing moved
    m = torch.nn.Linear(4, 4)
    ptr = m.weight.data_ptr()
    with pytest.raises(ValueError, match="kind"):
        move_to_gpuipc(m, kind="vmm")
    assert m.weight.data_ptr() == ptr


def test_moved_module_lent_to_a_reader(env, procs):
    """A module moved into gpuipc memory (parameters and buffers) is lent
    whole, no copy, from one buffer: a reader in another process sees its
    weights, and the optimizer's next step through the same tensors
    (the next version moves nothing: no manifest)."""
    pytest.importorskip("torch")
    _lent_module(env, procs, None)


def _lent_module(env, procs, arg):
    pub = start(procs, env, "sd_module_publish", "d", arg)
    first = pub.line()
    sums = first.pop("sums")
    assert first == {"published": 1, "copied": False, "segments": 1, "buffers": 1,
                     "same_params": True, "tied": True}
    rd = start(procs, env, "sd_module_read", "d", arg)
    assert rd.line() == {"version": 1, "sums": sums}
    _go(pub)
    second = pub.line()
    assert second["published"] == 2 and second["manifest"] is False
    assert second["sums"] != sums
    _go(rd)
    assert rd.line() == {"version": 2, "sums": second["sums"], "first_sums": second["sums"],
                         "same_tensors": True}
    rd.finish()
    pub.finish()


def test_snapshots_reuse_their_segments(env, procs):
    """20 snapshot versions in a row, a reader opening each and letting go
    (but holding version 3 throughout): the domain's segments stop growing
    (retired versions' segments are reused, at most three hold copies,
    one of them version 3 held), version 3's bytes stay intact, and the
    reader's work per open does not grow: its mappings stay as many, and
    once the publisher reuses segments (which the reader keeps mapped)
    each open asks the broker for the manifest alone."""
    pytest.importorskip("torch")
    _snapshots(env, procs, None)


def _snapshots(env, procs, arg):
    pub = start(procs, env, "sd_snap_publish", "d", arg)
    rd = None
    counts, maps, copies, calls = [], [], [], []
    for v in range(1, 21):
        pub.p.stdin.write("more\n")
        pub.p.stdin.flush()
        said = pub.line()
        assert said["published"] == v
        # Behind GPU work (versions 6 and 7 on a GPU): publish returned
        # while it ran (its manifests are unpinned: no registration waits).
        if arg in ("cuda", "cuda1") and v in (6, 7):
            assert said.pop("gpu_busy") is True, (v, said)
        counts.append(said["segments"])
        copies.append(len(said["copies"]))
        if rd is None:
            rd = start(procs, env, "sd_snap_read", "d", arg)
        rd.p.stdin.write("open\n")
        rd.p.stdin.flush()
        got = rd.line()
        calls.append(got.pop("calls"))
        assert got == {"version": v, "same": True, "held_intact": True,
                       "maps": got["maps"]}, got
        maps.append(got["maps"])
    assert counts[4:] == [counts[4]] * 16, counts
    assert maps[4:] == [maps[4]] * 16, maps
    assert max(copies) <= 3 and min(copies) >= 1, copies
    # the manifest (and, the first time, the head and a new segment's
    # mapping); once the publisher reuses segments, the manifest alone
    assert calls[0] == {"open_segment": 3} and all(c["open_segment"] <= 2 for c in calls[1:])
    assert calls[5:] == [{"open_segment": 1}] * 15, calls
    rd.finish()
    pub.finish()


def test_snapshot_readers_racing_a_publisher(env, procs):
    """A reader opening the newest snapshot 200 times (holding the last
    three) while a publisher puts out versions one after the other, reusing
    its segments: every version the reader opened is whole when opened and
    when let go (no reuse overwrote a version in use)."""
    pytest.importorskip("torch")
    pub = start(procs, env, "sd_fast_publish", "d")
    assert pub.line() == {"published": 1}
    _go(pub)  # publishing from now until the reader is done
    rd = start(procs, env, "sd_race_read", "d", "200")
    got = rd.line()
    _go(pub)
    done = pub.line()
    assert got["torn"] == 0, got
    # published: the newest and two retired ones kept for reuse. The
    # versions the reader held last (three at most) may be unlinked since,
    # as the publisher went on and let go of the oldest retired ones, and
    # are still listed until the reader, which says its line before it
    # lets go, has let go of them: counted apart
    assert done["named"] <= 3 and done["held"] <= 3, done
    rd.finish()
    pub.finish()


def test_snapshot_reader_killed_holding_a_version(joined, procs):
    """A reader killed (SIGKILL) while it holds a version lets go of it
    with its connection: the publisher reuses that version's segment, and
    the versions after make no new segment."""
    pytest.importorskip("torch")
    import gpuipc
    from gpuipc import state_dict
    env, dom = joined
    # The manifests are read through a domain object of their own: opens
    # through the publisher's own connection would count as its holds.
    with gpuipc.Domain(dom) as d, state_dict.Publisher(d, "w") as pub, \
            gpuipc.Domain(dom) as look:
        def publish(v):
            pub.publish(peer.sd_full(v))
            return state_dict._manifest(look, "w", v, 5)["data"]
        first = publish(1)
        rd = start(procs, env, "sd_hold_read", dom)
        assert rd.line() == {"version": 1, "whole": True}
        before = {publish(v) for v in range(2, 6)}
        assert first not in before  # held: not reused
        os.kill(rd.p.pid, signal.SIGKILL)
        rd.p.wait()
        # the broker (this process) drops the dead connection's holds once
        # it sees the hang-up; meanwhile another retired segment is free
        after = {publish(v) for v in range(6, 12)}
        assert after <= before | {first}, (before, after)
        assert first in after


def test_snapshot_segments_not_reused_across_brokers(dom, monkeypatch):
    """A broker that took the domain over (another epoch) learns of the
    holders as they re-join: a segment retired under the broker before is
    not reused (it is unlinked; the publisher takes a new one), and those
    retired under the new broker are."""
    pytest.importorskip("torch")
    import gpuipc
    from gpuipc import state_dict
    epochs = iter(())
    real = state_dict.Publisher._epoch

    def epoch(self):
        e = real(self)
        return e + 1 if next(epochs, False) else e
    monkeypatch.setattr(state_dict.Publisher, "_epoch", epoch)
    with state_dict.Publisher(dom, "w") as pub, gpuipc.Domain(dom.name) as look:
        def publish(v):
            pub.publish(peer.sd_full(v))
            return state_dict._manifest(look, "w", v, 5)["data"]
        names = [publish(v) for v in (1, 2, 3, 4)]
        assert names[2:] == names[:2]  # reused
        epochs = iter(lambda: True, None)  # a new broker from now on
        names += [publish(v) for v in (5, 6, 7, 8)]
        assert names[4] not in names[:4] and names[5] not in names[:4]
        assert names[6:] == names[4:6]  # reused again
        listed = {s["name"] for s in dom.segments()}
        assert not set(names[:4]) & listed  # the old ones unlinked
