"""Reader.copy_into(share=True) on the HOST kind, across real processes: a
publisher's snapshot versions copied by three readers at once into tensors
in gpuipc memory, every tensor's bytes checked, each reader's counts
adding up to the version's chunks (tensors of several dtypes and sizes,
none a multiple of the chunk: the extents are the tensors); a second
version is a round of its own, whose table each reader opened ahead (while
the first was copied); targets that cannot take part are refused
before anything is copied. Whether the chunks were shared between the
members is C's test (tests/share_copy.c holds members in one round)."""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import share_peer  # noqa: E402
import gpuipc  # noqa: E402
from gpuipc import state_dict  # noqa: E402


class Proc:
    def __init__(self, env, role, dom, shapes=""):
        self.p = subprocess.Popen([sys.executable, os.path.join(HERE, "share_peer.py"),
                                   role, dom, shapes], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)

    def tell(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def line(self):
        s = self.p.stdout.readline()
        assert s, f"peer exited (rc {self.p.wait()}) without answering"
        return json.loads(s)

    def finish(self):
        self.p.communicate("\n", timeout=60)
        assert self.p.returncode == 0, f"peer exited with {self.p.returncode}"


@pytest.fixture
def procs():
    started = []
    yield started
    for x in started:
        if x.p.poll() is None:
            x.p.kill()
        x.p.wait()


def test_three_readers_copy_two_versions(env, procs):
    dom = "share"
    pub = Proc(env, "publish", dom)
    procs.append(pub)
    readers = [Proc(env, "read", dom) for _ in range(3)]
    procs.extend(readers)
    for r in readers:
        assert r.line() == {"ready": True}
    want_chunks = share_peer.nchunks()
    lent, joined = {}, {}
    for v in (1, 2):
        pub.tell("more")
        assert pub.line() == {"published": v}
        for r in readers:
            r.tell("go")
        took = 0
        for r in readers:
            got = r.line()
            st = got.pop("stats")
            assert got == {"version": v, "equal": True}
            assert st["chunks"] == want_chunks
            assert st["from_publisher"] + st["from_peers"] == want_chunks, st
            # a member that joins as another leaves takes the leaver's
            # chunks over (from the publisher): counted, never lost
            assert 0 <= st["taken_over"] <= st["from_publisher"]
            # the second call's table was opened ahead (looked at below);
            # nobody died; its one target buffer is lent at the first call
            # that joins a round, and kept
            assert (st["ahead"], st["recopied"]) == (int(v == 2), 0), st
            lent[r] = lent.get(r, 0) + st["lent"]
            joined[r] = joined.get(r, 0) | st["joined"]
            took += st["from_publisher"]
        # Every chunk left the publisher at least once; with three readers
        # in one round, once (C's test holds them together to show it).
        assert want_chunks <= took <= 3 * want_chunks
        if v == 1:
            # Each reader's library opened the next version's round table
            # ahead, before it is published (tests/share_ahead.c shows the
            # next call takes it). Looked at from another process: this
            # one's library keeps the runtime directory it first used.
            look = ("import gpuipc, json, time\n"
                    "with gpuipc.Domain(%r) as d:\n"
                    "    for _ in range(6000):\n"
                    "        st = [x['nholders'] for x in d.segments()\n"
                    "              if x['name'] == 'w.v2.share']\n"
                    "        if st == [3]:\n"
                    "            break\n"
                    "        time.sleep(0.01)\n"
                    "    print(json.dumps([(x['name'], x['nholders'])\n"
                    "                      for x in d.segments()]))\n" % dom)
            out = subprocess.run([sys.executable, "-c", look], env=env, check=True,
                                 capture_output=True, text=True, timeout=120).stdout
            assert ["w.v2.share", 3] in json.loads(out), out
    assert lent == joined, (lent, joined)
    for r in readers:
        r.finish()
    pub.finish()


def test_targets_that_cannot_share_are_refused(env, procs, monkeypatch):
    monkeypatch.setenv("GPUIPC_DIR", env["GPUIPC_DIR"])
    pub = Proc(env, "lend", "share2")  # its versions' views are kept: see below
    procs.append(pub)
    pub.tell("more")
    assert pub.line() == {"published": 1}
    with gpuipc.Domain("share2") as d, state_dict.Reader(d, "w") as r:
        mine, buf = share_peer.targets()
        # PyTorch's own memory: not a gpuipc buffer the others could read
        plain = {k: torch.empty_like(t) for k, t in mine.items()}
        with pytest.raises(ValueError, match="does not lie in a gpuipc buffer"):
            r.copy_into(plain, share=True)
        bad = dict(mine)
        bad["norm"] = mine["norm"][:999]
        with pytest.raises(ValueError, match="target 'norm' is torch.float32 \\(999,\\)"):
            r.copy_into(bad, share=True)
        bad["norm"] = mine["norm"].view(torch.int32)
        with pytest.raises(ValueError, match="target 'norm' is torch.int32"):
            r.copy_into(bad, share=True)
        assert all(not t.any() for t in mine.values())  # nothing was copied
        r.copy_into(mine, share=True, chunk_bytes=share_peer.CHUNK)
        assert all(share_peer.same(mine[k], t) for k, t in share_peer.make(1).items())
        assert r.share_stats["from_publisher"] + r.share_stats["from_peers"] == \
            share_peer.nchunks()
        # A lent version's views are kept from one version to the next, and
        # with them the extents of the last call; the next version lands.
        pub.tell("more")
        assert pub.line() == {"published": 2}
        kept = r._share_ext
        assert kept is not None
        r.copy_into(mine, share=True, chunk_bytes=share_peer.CHUNK)
        assert all(share_peer.same(mine[k], t) for k, t in share_peer.make(2).items())
        assert r._share_ext is kept  # taken again, not rebuilt
        # The same target, one tensor swapped for another (in other gpuipc
        # memory): the bytes land in the new one.
        other, obuf = share_peer.targets()
        mine["norm"] = other["norm"]
        r.copy_into(mine, share=True, chunk_bytes=share_peer.CHUNK)
        assert share_peer.same(other["norm"], share_peer.make(2)["norm"])
        # ... and one whose storage was swapped under the same object
        other["norm"].zero_()
        held = mine["embed"]
        held.data = other["embed"].data
        other["embed"].zero_()
        r.copy_into(mine, share=True, chunk_bytes=share_peer.CHUNK)
        assert share_peer.same(other["embed"], share_peer.make(2)["embed"])
        assert share_peer.same(other["norm"], share_peer.make(2)["norm"])
        del other, held
        obuf.release()
        del mine
        buf.release()
    pub.finish()


def test_tensors_back_to_back_are_one_extent(env, procs, monkeypatch):
    """A lent state dict whose tensors lie one right after the other in
    one buffer, read into targets laid out the same way (a model moved
    into gpuipc memory on both sides): the tensors are one extent, cut in
    whole chunks, not a chunk (or more) for each tensor; every byte right."""
    monkeypatch.setattr(share_peer, "SHAPES", share_peer.ALIGNED)
    dom = "share_aligned"
    pub = Proc(env, "lend", dom, "aligned")
    procs.append(pub)
    readers = [Proc(env, "read", dom, "aligned") for _ in range(3)]
    procs.extend(readers)
    for r in readers:
        assert r.line() == {"ready": True}
    merged = (share_peer.total_bytes() + share_peer.CHUNK - 1) // share_peer.CHUNK
    assert merged < share_peer.nchunks()  # what a chunk a tensor would be
    for v in (1, 2):
        pub.tell("more")
        assert pub.line() == {"published": v}
        for r in readers:
            r.tell("go")
        for r in readers:
            got = r.line()
            st = got.pop("stats")
            assert got == {"version": v, "equal": True}
            assert st["chunks"] == merged, st
            assert st["from_publisher"] + st["from_peers"] == merged, st
    for r in readers:
        r.finish()
    pub.finish()
