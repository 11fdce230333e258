"""The other processes of the Python tests: `peer.py ROLE DOMAIN [ARG]`.
Each prints JSON lines on stdout that the test reads; the data are made by
pattern() from a seed, so both sides (and the test) know every byte."""
import gc
import hashlib
import json
import os
import sys
import time

import numpy as np

import gpuipc


def say(**kw):
    print(json.dumps(kw), flush=True)


def pattern(seed, shape, dtype):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer(rng.bytes(n), dtype=dtype).reshape(shape).copy()


def digest(arr):
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


# What the channel tests send: (seed, shape, dtype).
ARRAYS = [(1, (1000,), "float32"), (2, (3, 5, 7), "int64"), (3, (64, 64), "uint8"),
          (4, (17,), "complex64"), (5, (2, 3), "bool"), (6, (0, 4), "float64"),
          (7, (), "int16")]


def seg_create(dom, arg):
    with gpuipc.Domain(dom) as d:
        seg = d.create_segment("weights", 1 << 20)
        seg.numpy()[:] = pattern(11, (1 << 20,), "uint8")
        say(filling=seg.name, state=d.stat("weights")["state"])
        seg.publish()
        say(published=True)
        sys.stdin.readline()  # hold the domain until the test is done


def seg_open(dom, arg):
    with gpuipc.Domain(dom) as d:
        seg = d.open_segment("weights", wait=True, timeout=30)
        a = np.asarray(seg)
        say(nbytes=seg.nbytes, kind=seg.kind, sha=digest(a),
            zero_copy=a.__array_interface__["data"][0] == seg.ptr)
        seg.release()


def send_arrays(dom, arg):
    with gpuipc.Domain(dom) as d, d.channel("c", timeout=30) as ch:
        tickets = []
        for seed, shape, dtype in ARRAYS:
            tickets.append(ch.send(pattern(seed, shape, dtype)))
        # non-contiguous through a gpuipc buffer (zero-copy needs no staging)
        buf = gpuipc.empty((8, 6), "int32")
        buf.numpy()[:] = pattern(8, (8, 6), "int32")
        tickets.append(ch.send(buf.numpy()[::2, 1::2]))
        # the same bytes again, for recv_into
        tickets.append(ch.send(pattern(9, (4, 4), "float64")))
        for t in tickets:
            assert ch.done(t, timeout=30)
        say(sent=len(tickets))


def recv_arrays(dom, arg):
    with gpuipc.Domain(dom) as d, d.channel("c", timeout=30) as ch:
        out = []
        for _ in ARRAYS:
            with ch.recv(timeout=30) as v:
                # numpy 1.24's from_dlpack knows no bool; the array
                # interface serves those
                plain = v.shape != () and v.typestr[1] in "iuf"
                a = np.from_dlpack(v) if plain else np.asarray(v)
                out.append([v.typestr, list(v.shape), digest(a)])
                del a
        v = ch.recv(timeout=30)
        a = np.from_dlpack(v)
        out.append([v.typestr, list(v.shape), digest(a)])
        del a
        dst = np.zeros((4, 4), "float64")
        ch.recv_into(dst, timeout=30)
        out.append(["<f8", [4, 4], digest(dst)])
        say(got=out)


def zero_copy_send(dom, arg):
    with gpuipc.Domain(dom) as d, d.channel("z", timeout=30) as ch:
        buf = gpuipc.empty((256, 256), "float32")
        a = buf.numpy()
        a[:] = pattern(21, (256, 256), "float32")
        t = ch.send(buf)
        ack = ch.recv(timeout=30)  # the receiver holds the view now
        ack.release()
        held = not ch.done(t, timeout=0)
        a[0, :4] = [1.0, 2.0, 3.0, 4.0]  # visible to the receiver: shared
        ch.send(np.array([1], "int8"))
        freed = ch.done(t, timeout=30)  # after the receiver dropped its array
        say(buf_ptr=buf.ptr, held_while_viewed=held, freed_after=freed,
            info=ch.info()["buffers_sent"])


def zero_copy_recv(dom, arg):
    with gpuipc.Domain(dom) as d, d.channel("z", timeout=30) as ch:
        v = ch.recv(timeout=30)
        assert v.kind == "host"
        arr = np.from_dlpack(v)  # the capsule owns the view now
        ptr = arr.__array_interface__["data"][0]
        mapped = None
        with open("/proc/self/maps") as f:
            for line in f:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if lo <= ptr < hi:
                    mapped = line.split(None, 5)[-1].strip()
        first = digest(arr)
        ch.send(np.array([0], "int8"))
        go = ch.recv(timeout=30)
        go.release()
        row = arr[0, :4].tolist()
        del arr  # the deleter gives the view back
        say(ptr=ptr, buffer_ptr=v.buffer_ptr, byte_offset=v.byte_offset, mapping=mapped,
            sha=first, row_after=row, released=repr(v).endswith(" released>"))


def torch_tensors():
    """The CPU torch tensors torch_send sends and torch_recv expects."""
    import torch
    g = torch.Generator().manual_seed(5)
    return [torch.randn(33, 7, generator=g), torch.randint(-9, 9, (100,), generator=g),
            torch.randn(4, 4, generator=g).to(torch.bfloat16),
            torch.randn(6, 5, generator=g).t()[1:3]]


def torch_send(dom, arg):
    ts = torch_tensors()
    with gpuipc.Domain(dom) as d, d.channel("t", timeout=30) as ch:
        for t in ts:
            ch.send(t.contiguous())
        say(sums=[float(t.float().sum()) for t in ts])
        sys.stdin.readline()


def torch_recv(dom, arg):
    import torch
    from torch.utils.dlpack import from_dlpack
    with gpuipc.Domain(dom) as d, d.channel("t", timeout=30) as ch:
        want = torch_tensors()
        same = []
        for w in want:
            t = from_dlpack(ch.recv(timeout=30))
            same.append(bool(t.dtype == w.dtype and t.shape == w.shape and torch.equal(t, w)))
            del t
        say(same=same)


def torch_forms():
    """CPU torch tensors of every form the send path reads: views at an
    offset, 0-d, bool, bfloat16, complex, a Parameter, one that requires
    grad; and (the last two) strided views, which staging refuses."""
    import torch
    g = torch.Generator().manual_seed(11)
    base = torch.randn(6, 10, 4, generator=g)
    return [base, base[2:], base[3, 4:], base.reshape(-1)[5:17], base[1, 2, 3],
            torch.tensor(True), torch.randint(0, 2, (9,), generator=g).bool(),
            torch.randn(5, 3, generator=g).to(torch.bfloat16),
            torch.randn(4, generator=g, dtype=torch.complex64)[1:],
            torch.nn.Parameter(torch.randn(3, 3, generator=g)),
            torch.ones(8, requires_grad=True)], [base[:, 3:7], base.transpose(0, 2)]


def torch_echo_send(dom, arg):
    """Send torch_forms() to the echo and check what comes back, byte for
    byte: each went out through the C send path, was received as a view,
    and came back as that view sent on."""
    import torch
    sent, strided = torch_forms()
    with gpuipc.Domain(dom) as d, d.channel("e", timeout=30) as ch:
        refused = []
        for t in strided:
            try:
                ch.send(t)
            except gpuipc.InvalidArgument as e:
                refused.append("contiguous" in e.detail)
        same = []
        for t in sent:
            ch.send(t)
            with ch.recv(timeout=30) as v:
                shape = tuple(v.shape)
                back = np.asarray(v).tobytes()  # every byte, in C order
            want = t.detach().contiguous()
            if want.dtype == torch.bfloat16:  # numpy has no bfloat16
                want = want.view(torch.int16)
            same.append(shape == tuple(t.shape) and back == want.numpy().tobytes())
        # With a gpuipc buffer alive, memory outside it is still staged
        # (no handle crosses) and a tensor inside it crosses as that buffer.
        buf = gpuipc.empty((64,), "float32")
        inside = torch.from_dlpack(buf)[4:20]
        inside.copy_(torch.arange(16.0))
        handles = []
        for t in (torch.arange(7.0), inside):
            before = ch.info()["buffers_sent"]
            ch.send(t)
            with ch.recv(timeout=30) as v:
                same.append(np.asarray(v).tobytes() == t.numpy().tobytes())
            handles.append(ch.info()["buffers_sent"] - before)
        last = ch.send(sent[0])  # the echo drops this one unreleased
        say(same=same, n=len(sent) + 2, refused=refused, handles=handles,
            dropped_is_released=ch.done(last, timeout=30))


def torch_echo(dom, arg):
    """Send back every tensor received, as the view it came in; drop the
    last one received without releasing it."""
    with gpuipc.Domain(dom) as d, d.channel("e", timeout=30) as ch:
        for _ in range(int(arg)):
            with ch.recv(timeout=30) as v:
                ch.send(v)
        v = ch.recv(timeout=30)
        del v  # never released: going, it gives the message back
        say(echoed=int(arg))
        sys.stdin.readline()


def errors(dom, arg):
    import threading
    res = {}
    with gpuipc.Domain(dom) as d:
        try:
            d.open_segment("absent")
        except gpuipc.NotFound as e:
            res["notfound"] = [e.name, e.detail, isinstance(e, FileNotFoundError)]
        try:
            d.open_segment("absent", wait=True, timeout=0.05)
        except gpuipc.TimeoutError as e:
            res["timeout"] = [e.name, isinstance(e, TimeoutError)]
        s = d.create_segment("x", 4096, exclusive=True)
        try:
            d.create_segment("x", 4096, exclusive=True)
        except gpuipc.Exists as e:
            res["exists"] = e.name
        s.publish()
        try:
            s.publish()
        except gpuipc.AlreadyDone as e:
            res["already"] = e.name
        try:
            d.open_segment("x", nbytes=8192)
        except gpuipc.Mismatch as e:
            res["mismatch"] = [e.name, e.code == gpuipc._gpuipc.E_MISMATCH, e.detail]
        try:
            d.open_segment("bad/name")
        except gpuipc.InvalidArgument as e:
            res["badname"] = [e.name, isinstance(e, ValueError)]
        try:
            d.channel("lonely", timeout=0.05)
        except gpuipc.TimeoutError as e:
            res["open_timeout"] = e.name
        ends = {}
        th = threading.Thread(target=lambda: ends.setdefault(
            "b", d.channel("pair", timeout=10, stage_slot_bytes=4096)))
        th.start()
        a = d.channel("pair", timeout=10, stage_slot_bytes=4096)
        th.join()
        b = ends["b"]
        try:
            b.recv(timeout=0)
        except gpuipc.WouldBlock as e:
            res["poll"] = [e.name, isinstance(e, BlockingIOError)]
        t0 = time.monotonic()
        try:
            b.recv(timeout=0.1)
        except gpuipc.TimeoutError as e:
            res["recv_timeout"] = [e.name, time.monotonic() - t0 >= 0.09]
        # far more than the 4096-byte slots: a large stage of its own
        big = pattern(12, (64 << 20,), "uint8")
        a.send(big, block=False)
        with b.recv(timeout=10) as v:
            res["large"] = [list(v.shape), bool(np.array_equal(v.numpy(), big))]
        try:
            a.send(object())
        except TypeError as e:
            res["not_tensor"] = str(e)
        try:
            a.send(np.zeros(4, ">i4"))
        except ValueError as e:
            res["big_endian"] = str(e)
        a.close()
        try:
            b.recv(timeout=5)
        except gpuipc.PeerGone as e:
            res["closed_peer"] = [e.name, isinstance(e, ConnectionError)]
        b.close()
        try:
            b.recv()
        except ValueError as e:
            res["use_after_close"] = str(e)
    say(**res)


def stream_send(dom, arg):
    with gpuipc.Domain(dom) as d, d.channel("k", timeout=30, depth=4) as ch:
        i = 0
        while True:
            ch.send(pattern(i % 5, (1024,), "uint8"))
            i += 1
            if arg == "blocked" and i == 4:
                say(sent=i)
            if arg == "blocked" and i > 4:
                say(unexpected=i)


def stream_recv(dom, arg):
    with gpuipc.Domain(dom) as d, d.channel("k", timeout=30, depth=4) as ch:
        want = [digest(pattern(i, (1024,), "uint8")) for i in range(5)]
        n = 0
        if arg == "hold":
            views = [ch.recv(timeout=30) for _ in range(4)]
            say(holding=len(views))
            time.sleep(3600)
        try:
            while True:
                with ch.recv(timeout=60) as v:
                    assert digest(np.asarray(v)) == want[n % 5], n
                n += 1
                if n == 5:
                    say(got=n)
        except gpuipc.PeerGone as e:
            say(peer_gone=e.name, received=n, detail=e.detail)


def blocked_sender(dom, arg):
    with gpuipc.Domain(dom) as d, d.channel("k", timeout=30, depth=4) as ch:
        for i in range(4):
            ch.send(pattern(i, (1024,), "uint8"))
        say(sent=4)
        try:
            ch.send(pattern(4, (1024,), "uint8"))  # waits for a release
            say(unexpected="sent")
        except gpuipc.PeerGone as e:
            say(peer_gone=e.name)


# What fork_close and fork_echo exchange: message i is pattern(FORK_SEED + i).
FORK_MESSAGES, FORK_SEED = 4, 40
HELD = []  # what a fork_close child keeps until interpreter shutdown


def fork_close(dom, arg):
    """Exchange message 0 with fork_echo, then os.fork(): the child finds
    that it cannot send on its copy of the channel, lets go of it and exits
    with sys.exit(0) -- "drop": it drops its references (channel and view)
    and collects; "hold": it keeps them, so that interpreter shutdown
    finalises them. Then the parent exchanges the other messages."""
    d = gpuipc.Domain(dom)
    ch = d.channel("f", timeout=30)
    got = []
    ch.send(pattern(FORK_SEED, (256,), "int32"))
    v = ch.recv(timeout=30)  # the echo of message 0, held across the fork
    got.append(digest(np.asarray(v)))
    pid = os.fork()
    if pid == 0:
        try:
            ch.send(pattern(FORK_SEED, (256,), "int32"))
            sys.exit(3)  # the parent's channel must refuse
        except gpuipc.Closed:
            pass
        if arg == "drop":
            del v, ch
            gc.collect()
        else:
            HELD.extend([d, ch, v])
        sys.exit(0)
    child = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    v.release()
    for i in range(1, FORK_MESSAGES):
        ch.send(pattern(FORK_SEED + i, (256,), "int32"))
        with ch.recv(timeout=30) as v:
            got.append(digest(np.asarray(v)))
    info = ch.info()
    ch.close()
    d.leave()
    say(child=child, got=got, peer_gone=info["peer_gone"],
        received=info["received"])


def fork_echo(dom, arg):
    """Send back every message of fork_close as the view it came in; say
    what came, and how the channel failed if it did."""
    with gpuipc.Domain(dom) as d, d.channel("f", timeout=30) as ch:
        got = []
        try:
            for _ in range(FORK_MESSAGES):
                with ch.recv(timeout=30) as v:
                    got.append(digest(np.asarray(v)))
                    ch.send(v)
            say(got=got)
        except gpuipc.Error as e:
            say(got=got, error=e.name, detail=e.detail)


HOLD_DEPTH, HOLD_N = 4, 40


def hold_send(dom, arg):
    """Ten depths of messages (staged numpy arrays) past one the receiver
    holds, then "go": it may let the held one go."""
    with gpuipc.Domain(dom) as d, d.channel("h", timeout=30, depth=HOLD_DEPTH,
                                            stage_slots=HOLD_DEPTH,
                                            send_timeout=10) as ch:
        tickets = [ch.send(pattern(100 + i, (256,), "uint8"))
                   for i in range(HOLD_N)]
        others = all(ch.done(t, timeout=30) for t in tickets[1:])
        held = not ch.done(tickets[0], timeout=0)
        info = ch.info()
        ch.send(np.array([1], "int8"))  # go
        freed = ch.done(tickets[0], timeout=30)
        say(sent=len(tickets), others_done=others, held=held,
            in_flight=info["in_flight"], oldest=info["oldest_in_flight"],
            freed=freed, oldest_after=ch.info()["oldest_in_flight"])


def hold_recv(dom, arg):
    """Keep the first message (as an array, which holds its view), drop
    every other one; check the kept one's bytes after all the others came
    through, and once more at "go", then let it go."""
    with gpuipc.Domain(dom) as d, d.channel("h", timeout=30) as ch:
        first = np.from_dlpack(ch.recv(timeout=30))
        ok = []
        for i in range(1, HOLD_N):
            a = np.from_dlpack(ch.recv(timeout=30))
            ok.append(digest(a) == digest(pattern(100 + i, (256,), "uint8")))
            del a  # its view goes back
        want = digest(pattern(100, (256,), "uint8"))
        intact = digest(first) == want
        ch.recv(timeout=30).release()  # go
        intact = intact and digest(first) == want
        del first
        say(others_ok=all(ok), held_intact=intact)
        try:  # stay until the sender has looked and closed
            ch.recv(timeout=30)
        except gpuipc.PeerGone:
            pass


ASYNC_CHANNELS, ASYNC_MESSAGES = 3, 20


def async_recv(dom, arg):
    """Several channels in one asyncio loop, waiting on their fds: no
    thread besides the main one."""
    import asyncio
    import threading

    async def one(ch):
        out = []
        for _ in range(ASYNC_MESSAGES):
            v = await ch.arecv(timeout=30)
            with v:
                out.append(digest(np.asarray(v)))
        return out

    async def main(chs):
        got = await asyncio.gather(*(one(ch) for ch in chs))
        return got, threading.active_count()

    with gpuipc.Domain(dom) as d:
        chs = [d.channel(f"a{k}", timeout=30) for k in range(ASYNC_CHANNELS)]
        got, threads = asyncio.run(main(chs))
        fds = {ch.fileno() for ch in chs}
        for ch in chs:
            ch.close()
        say(sha=got, threads=threads, fds=len(fds))


def async_send(dom, arg):
    """Message i of channel k is pattern(100 * k + i), sent round robin
    with pauses, so that the receiver waits on every channel."""
    with gpuipc.Domain(dom) as d:
        chs = [d.channel(f"a{k}", timeout=30) for k in range(ASYNC_CHANNELS)]
        tickets = []
        for i in range(ASYNC_MESSAGES):
            for k, ch in enumerate(chs):
                tickets.append((ch, ch.send(pattern(100 * k + i, (4096,), "uint8"))))
                time.sleep(0.002 * ((i + k) % 3))
        for ch, t in tickets:
            ch.done(t, timeout=30)
        for ch in chs:
            ch.close()


def sd_make(version):
    import torch
    g = torch.Generator().manual_seed(version)
    return {f"layer{i}.weight": torch.randn(16, 8 + i, generator=g).to(torch.bfloat16)
            for i in range(5)} | {"norm": torch.arange(7, dtype=torch.float32) * version,
                                  # not contiguous: published by torch's copy
                                  "proj": (torch.arange(24.0) * version).view(4, 6).t()}


def sd_publish(dom, arg):
    from gpuipc import state_dict
    with gpuipc.Domain(dom) as d:
        keep = []
        for v in (1, 2):
            ver, segs = state_dict.publish(d, "w", sd_make(v))
            keep.append(segs)
            say(published=ver)
            sys.stdin.readline()


def sd_read(dom, arg):
    import torch
    from gpuipc import state_dict
    with gpuipc.Domain(dom) as d:
        old = state_dict.open(d, "w")
        ok1 = all(torch.equal(old[k], t) for k, t in sd_make(1).items())
        say(version=old.version, same=ok1, n=len(old))
        sys.stdin.readline()  # the publisher has published version 2 now
        still = all(torch.equal(old[k], t) for k, t in sd_make(1).items())
        mine = {k: torch.zeros_like(t) for k, t in sd_make(2).items()}
        ver = state_dict.copy_into(d, "w", mine)
        want = sd_make(2)
        ok2 = all(torch.equal(mine[k], t) for k, t in want.items())
        # Targets torch's copy_ serves: another dtype (converted), not
        # contiguous; the others raw.
        mixed = {k: torch.zeros_like(t) for k, t in want.items()}
        mixed["layer0.weight"] = torch.zeros(16, 8, dtype=torch.float32)
        mixed["layer1.weight"] = torch.zeros(9, 16, dtype=torch.bfloat16).t()
        state_dict.copy_into(d, "w", mixed)
        ok3 = (torch.equal(mixed["layer0.weight"], want["layer0.weight"].float()) and
               all(torch.equal(mixed[k], t) for k, t in want.items() if k != "layer0.weight"))
        try:
            state_dict.copy_into(d, "w", {"nope": torch.zeros(1)})
            missing = "no error"
        except KeyError as e:
            missing = str(e)
        try:
            d.open_segment("w.v1")  # unlinked by the publisher, alive while held
            gone = False
        except gpuipc.NotFound:
            gone = True
        old.release()
        say(old_intact=still, new_version=ver, new_same=ok2, old_name_gone=gone,
            mixed_same=ok3, missing=missing)


def _host_tensor(buf, dtype, shape, fill):
    import torch
    t = torch.from_dlpack(buf).view(dtype)[:int(np.prod(shape))].view(shape)
    t.copy_(fill.reshape(shape))
    return t


def sd_relend(dom, arg):
    """Publishes versions that use buffer b every other time: b is lent
    anew each time it comes back (not copied), and its retired segments go
    from the broker (this process hosts it: the only member)."""
    import torch
    from gpuipc import state_dict
    with gpuipc.Domain(dom) as d:
        a, b = gpuipc.Buffer(1 << 16), gpuipc.Buffer(1 << 16)
        sd = {"a": _host_tensor(a, torch.float32, (16,), torch.ones(16)),
              "b": _host_tensor(b, torch.int64, (8,), torch.arange(8))}
        pub = state_dict.Publisher(d, "w", lend=True)
        copied, counts = [], []
        for i in range(40):
            pub.publish(sd if i % 2 == 0 else {"a": sd["a"]})
            copied.append(state_dict._manifest(d, "w", pub.version, 5)["copied"])
            info = d.info()
            counts.append([info["segments"], info["broker_fds"]])
        pub.close()
        say(copied=any(copied), first=counts[:2], last=counts[-2:])


def sd_lend_publish(dom, arg):
    """Lends two tensors of one gpuipc buffer and one of another, copies one
    that lies in ordinary memory; then writes in place, publishes again
    with one lent buffer dropped and a new one added."""
    import torch
    from gpuipc import state_dict
    with gpuipc.Domain(dom) as d:
        a, b, c = (gpuipc.Buffer(1 << 16) for _ in range(3))
        a1 = torch.from_dlpack(a).view(torch.float32)[1024:1040]  # 4 KiB in
        a1.copy_(torch.ones(16))
        sd = {"a0": _host_tensor(a, torch.float32, (64, 8), torch.arange(512.0)),
              "a1": a1,
              "b": _host_tensor(b, torch.int64, (100,), torch.arange(100)),
              "plain": torch.full((5, 5), 7, dtype=torch.bfloat16)}
        pub = state_dict.Publisher(d, "w", lend=True)
        ver = pub.publish(sd)
        m = state_dict._manifest(d, "w", ver, 5)
        say(published=ver, segments=len(m["segments"]), copied=m["copied"],
            lent=sorted(e["name"] for e in m["tensors"] if e["seg"] >= 0))
        sys.stdin.readline()
        sd["a0"][0, 0] = -1.0  # in place: readers see it
        sd["plain"][0, 0] = -1  # not lent: the version's copy keeps 7
        say(wrote=True)
        sys.stdin.readline()
        old_segs = m["segments"]
        sd2 = {"a0": sd["a0"], "a1": sd["a1"],
               "c": _host_tensor(c, torch.int16, (30,), torch.arange(30) * 3)}
        ver = pub.publish(sd2)
        m2 = state_dict._manifest(d, "w", ver, 5)
        gone = [n for n in old_segs if n not in m2["segments"]]
        def unlinked(n):
            try:
                d.stat(n)
                return False
            except gpuipc.NotFound:
                return True
        say(published=ver, kept=[n for n in old_segs if n in m2["segments"]] ==
            [m2["segments"][m["tensors"][0]["seg"]]], unlinked=[unlinked(n) for n in gone],
            copied=m2["copied"], old_pack_gone=unlinked("w.v1") and unlinked("w.v1.m"))
        sys.stdin.readline()
        pub.close()


def sd_lend_read(dom, arg):
    import torch
    from gpuipc import state_dict
    with gpuipc.Domain(dom) as d:
        r = state_dict.Reader(d, "w")
        v1 = r.open()
        ok = (torch.equal(v1["a0"].flatten(), torch.arange(512.0)) and
              torch.equal(v1["a1"], torch.ones(16)) and
              torch.equal(v1["b"], torch.arange(100)) and
              torch.equal(v1["plain"], torch.full((5, 5), 7, dtype=torch.bfloat16)))
        say(version=v1.version, same=ok, n=len(v1))
        sys.stdin.readline()  # the publisher wrote in place
        say(lent_sees=float(v1["a0"][0, 0]), copy_keeps=float(v1["plain"][0, 0]))
        sys.stdin.readline()  # version 2 is out
        segs_before = dict(r._segs)
        v2 = r.open()
        same_maps = all(r._segs[n] is s for n, s in segs_before.items() if n in r._segs)
        ok2 = (sorted(v2) == ["a0", "a1", "c"] and float(v2["a0"][0, 0]) == -1.0 and
               torch.equal(v2["c"], torch.arange(30, dtype=torch.int16) * 3))
        again = r.open()
        say(version=v2.version, same=ok2, reused=same_maps and len(r._segs) == 2,
            views_kept=again["a0"] is v2["a0"], old_b_intact=torch.equal(
                v1["b"], torch.arange(100)))
        mine = {"a0": torch.zeros(64, 8), "a1": torch.zeros(16),
                "c": torch.zeros(30, dtype=torch.int16)}
        ver = state_dict.copy_into(d, "w", mine)
        say(copied_version=ver, copy_same=torch.equal(mine["c"], v2["c"]) and
            torch.equal(mine["a0"], v2["a0"]))
        v1.release()
        r.close()


def _gone(d, name):
    try:
        d.stat(name)
        return False
    except gpuipc.NotFound:
        return True


def sd_same_publish(dom, arg):
    """Publishes two lent tensors, then twice more after writing in place
    (nothing moved: no manifest), then, as a publisher started anew, a
    version where one tensor moved to another buffer."""
    import torch
    from gpuipc import state_dict
    with gpuipc.Domain(dom) as d:
        a, b, c = (gpuipc.Buffer(1 << 16) for _ in range(3))
        sd = {"a": _host_tensor(a, torch.float32, (16, 4), torch.arange(64.0)),
              "b": _host_tensor(b, torch.int32, (10,), torch.arange(10, dtype=torch.int32))}
        pub = state_dict.Publisher(d, "w", lend=True)
        say(published=pub.publish(sd), manifest=not _gone(d, "w.v1.m"))
        sys.stdin.readline()
        vers = []
        for x in (5.0, 6.0):
            sd["a"][0, 0] = x
            vers.append(pub.publish(sd))
        say(published=vers, manifests=[not _gone(d, f"w.v{v}.m") for v in vers],
            first_kept=not _gone(d, "w.v1.m"))
        sys.stdin.readline()
        segs = state_dict._manifest(d, "w", 1, 5)["segments"]
        pub2 = state_dict.Publisher(d, "w", lend=True)  # a restarted publisher
        sd["b"] = _host_tensor(c, torch.int32, (10,), torch.arange(10, dtype=torch.int32) * 2)
        v4 = pub2.publish(sd)
        say(published=v4, manifest=not _gone(d, "w.v4.m"),
            old_gone=_gone(d, "w.v1.m") and all(_gone(d, n) for n in segs))
        sys.stdin.readline()
        pub2.close()
        pub.close()


def sd_same_read(dom, arg):
    import torch
    from gpuipc import state_dict
    with gpuipc.Domain(dom) as d:
        r = state_dict.Reader(d, "w")
        v1 = r.open()
        say(version=v1.version, a=float(v1["a"][0, 0]), b=v1["b"].tolist())
        sys.stdin.readline()  # versions 2 and 3: written in place
        v3 = r.open()
        fresh = state_dict.open(d, "w")  # a reader with nothing cached
        mine = {"a": torch.zeros(16, 4), "b": torch.zeros(10, dtype=torch.int32)}
        copied = state_dict.copy_into(d, "w", mine)
        say(version=v3.version, same_tensors=v3["a"] is v1["a"] and v3["b"] is v1["b"],
            a=float(v3["a"][0, 0]), fresh=[fresh.version, float(fresh["a"][0, 0]),
                                          torch.equal(fresh["a"], v3["a"])],
            copied=[copied, torch.equal(mine["a"], v3["a"]), torch.equal(mine["b"], v3["b"])])
        fresh.release()
        sys.stdin.readline()  # version 4: b moved, a lent anew
        v4 = r.open()
        say(version=v4.version, a=float(v4["a"][0, 0]), b=v4["b"].tolist(),
            old_intact=v1["b"].tolist() == list(range(10)))
        r.close()


def sd_race_publish(dom, arg):
    """Publishes version 1 of "w" (copied), then one version more for each
    "more" line the test writes; an empty line ends it."""
    from gpuipc import state_dict
    with gpuipc.Domain(dom) as d, state_dict.Publisher(d, "w") as pub:
        ver = pub.publish(sd_make(1))
        say(published=ver)
        while sys.stdin.readline().strip() == "more":
            ver = pub.publish(sd_make(ver + 1))
            say(published=ver)


def sd_stop_publish(dom, stop):
    """Publishes versions 1 and 2 of "w" (copied), one for each line the
    test writes, and stops at ``stop`` -- "first_head": before the head
    names version 1; "before_head": before it names version 2;
    "before_retire": before version 2 retires version 1 --, says so, and
    goes on at the test's word (unless the test kills it there).
    "lent_before_head": as "before_head", the versions lent (sd_lent)."""
    from gpuipc import state_dict
    pub_cls = state_dict.Publisher
    method, at = {"first_head": ("_move_head", 1), "before_head": ("_move_head", 2),
                  "lent_before_head": ("_move_head", 2),
                  "before_retire": ("_retire", 2)}[stop]
    lend = stop.startswith("lent_")
    real = getattr(pub_cls, method)

    def hooked(self, *a):
        ver = a[0] >> state_dict._BACK if method == "_move_head" else a[0] + 1
        if ver == at:
            say(stopped=stop, version=ver)
            sys.stdin.readline()
        return real(self, *a)
    setattr(pub_cls, method, hooked)
    with gpuipc.Domain(dom) as d, pub_cls(d, "w", lend=lend) as pub:
        for ver in (1, 2):
            say(published=pub.publish(sd_lent(ver) if lend else sd_make(ver)))
            sys.stdin.readline()


def sd_lent(ver):
    """Version ``ver`` of a state dict that is lent, a gpuipc buffer of
    its own for each version."""
    import torch
    return {"x": _host_tensor(gpuipc.Buffer(1 << 12), torch.float32, (16, 4),
                              torch.arange(64.0) * ver)}


def _dev(arg):
    """The torch device of a peer's ARG: "cuda" and "cuda1" (GPU 0; with
    "cuda1" a reader maps it for GPU 1) or the CPU."""
    return "cuda:0" if arg in ("cuda", "cuda1") else "cpu"


def sd_module(device):
    """A small model with a tied weight (the embedding is the output
    layer's too) and a buffer (BatchNorm's running statistics)."""
    import torch
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Embedding(12, 8), torch.nn.Linear(8, 8),
                            torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 12, bias=False))
    m[3].weight = m[0].weight
    return m.to(device)


def sd_sums(sd):
    """name -> the float64 sum of the tensor's values, on the CPU: equal on
    both sides when the bytes are."""
    return {k: float(t.detach().cpu().double().sum()) for k, t in sd.items()}


def _train_step(m, opt, device):
    import torch
    opt.zero_grad(set_to_none=True)
    m(torch.tensor([1, 2, 3, 4], device=device)).square().mean().backward()
    opt.step()


def sd_module_publish(dom, arg):
    """Moves sd_module's parameters and buffers into gpuipc memory in place
    and lends its state dict; at the test's word, trains a step and
    publishes again (nothing moved: lent, no manifest)."""
    import torch
    from gpuipc import state_dict
    from gpuipc.torch import move_to_gpuipc
    dev = _dev(arg)
    m = sd_module(dev)
    params = list(m.parameters())
    opt = torch.optim.Adam(m.parameters(), lr=0.1)
    _train_step(m, opt, dev)  # optimizer state exists before the move
    bufs = move_to_gpuipc(m, buffers=True)
    with gpuipc.Domain(dom) as d, state_dict.Publisher(d, "w", lend=True) as pub:
        ver = pub.publish(m.state_dict())
        man = state_dict._manifest(d, "w", ver, 5)
        say(published=ver, copied=man["copied"], segments=len(man["segments"]),
            buffers=len(bufs), same_params=all(a is b for a, b in zip(params, m.parameters())),
            tied=m[3].weight is m[0].weight, sums=sd_sums(m.state_dict()))
        sys.stdin.readline()
        _train_step(m, opt, dev)
        ver = pub.publish(m.state_dict())
        say(published=ver, manifest=not _gone(d, f"w.v{ver}.m"),
            sums=sd_sums(m.state_dict()))
        sys.stdin.readline()


def sd_module_read(dom, arg):
    """Opens the lent model at the test's word: says the sums of what it
    sees, and whether the second version's tensors are the first's."""
    from gpuipc import state_dict
    dev = -1 if arg != "cuda" else 0
    with gpuipc.Domain(dom) as d, state_dict.Reader(d, "w", device=dev) as r:
        first = r.open()
        say(version=first.version, sums=sd_sums(first))
        sys.stdin.readline()
        second = r.open()
        say(version=second.version, sums=sd_sums(second), first_sums=sd_sums(first),
            same_tensors=all(second[k] is first[k] for k in first))


def sd_snap_publish(dom, arg):
    """Publishes version v of sd_make(v) (every tensor copied: a snapshot)
    for each "more" line; says how many segments the domain has and the
    snapshot segments of the state dict, and for the versions published
    behind GPU work whether that work was still running when publish
    returned (gpu_busy: the host did not wait for it)."""
    import re
    from gpuipc import state_dict
    dev = _dev(arg)
    with gpuipc.Domain(dom) as d, state_dict.Publisher(d, "w") as pub:
        while sys.stdin.readline().strip() == "more":
            sd = {k: t.to(dev) for k, t in sd_make(pub.version + 1).items()}
            behind = dev != "cpu" and pub.version + 1 in (6, 7)
            if behind:
                # Versions into reused segments whose copies queue behind
                # ~1 s of GPU work: a reader must wait for them on its
                # stream, and the publisher's host must not.
                import torch
                torch.cuda._sleep(2_000_000_000)
            ver = pub.publish(sd)
            more = {}
            if behind:
                more["gpu_busy"] = not torch.cuda.current_stream().query()
            names = [s["name"] for s in d.segments()]
            say(published=ver, segments=len(names),
                copies=sorted(n for n in names if re.fullmatch(r"w\.[0-9a-f]{6}\.c\d+", n)),
                **more)


def _maps():
    """How many shared-memory mappings this process has (HOST segments)."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "memfd:" in line)


def sd_snap_read(dom, arg):
    """At each line of the test opens the newest version, checks it and
    lets go of it, except version 3, which it holds to the end; says what
    the open asked of the broker (calls by name), its mappings, and whether
    version 3 is still intact."""
    import torch
    from gpuipc import state_dict
    dev = _dev(arg)
    rdev = -1 if dev == "cpu" else 1 if arg == "cuda1" else 0
    with gpuipc.Domain(dom) as d, state_dict.Reader(d, "w", device=rdev) as r:
        calls = {}

        def counted(name, fn):
            def call(*a, **kw):
                calls[name] = calls.get(name, 0) + 1
                return fn(*a, **kw)
            return call
        for name in ("open_segment", "stat", "segments", "unlink"):
            setattr(d, name, counted(name, getattr(d, name)))
        held = None
        while sys.stdin.readline().strip():
            calls.clear()
            sd = r.open()
            asked = dict(calls)
            want = sd_make(sd.version)
            same = all(torch.equal(sd[k].cpu(), t) for k, t in want.items())
            if sd.version == 3:
                held = sd
            else:
                sd.release()
            del sd
            gc.collect()
            intact = held is None or all(torch.equal(held[k].cpu(), t)
                                         for k, t in sd_make(3).items())
            say(version=r.version, same=same, calls=asked,
                maps=_maps(), held_intact=intact)


def sd_full(ver):
    """A state dict whose every value is ``ver``: a reader checks a version
    whole at a glance."""
    import torch
    return {"a": torch.full((4096,), float(ver)), "b": torch.full((333,), ver, dtype=torch.int32),
            "c": torch.full((64, 64), float(ver), dtype=torch.bfloat16)}


def _whole(sd, ver):
    return sorted(sd) == ["a", "b", "c"] and all(bool((t == ver).all()) for t in sd.values())


def sd_fast_publish(dom, arg):
    """Publishes versions of sd_full (snapshots) one after the other, as
    fast as it can, from the test's first line to its second; says how many
    and how many segments held their copies."""
    import re
    import select
    from gpuipc import state_dict
    with gpuipc.Domain(dom) as d, state_dict.Publisher(d, "w") as pub, \
            gpuipc.Domain(dom) as look:  # opens of its own (see test_host)
        pub.publish(sd_full(1))
        say(published=1)
        sys.stdin.readline()
        names = set()
        while not select.select([sys.stdin], [], [], 0)[0]:
            v = pub.publish(sd_full(pub.version + 1))
            names.add(state_dict._manifest(look, "w", v, 5)["data"])
        sys.stdin.readline()
        ours = [s for s in d.segments() if re.fullmatch(r"w\.[0-9a-f]{6}\.c\d+", s["name"])]
        say(published=pub.version, copies=len(names),
            named=len([s for s in ours if s["state"] == "published"]),
            held=len([s for s in ours if s["state"] != "published"]))


def sd_race_read(dom, arg):
    """Opens the newest version ARG times, holding the last three it
    opened: each must be whole (every value its version) when opened and
    still when, three opens later, it is let go."""
    from gpuipc import state_dict
    with gpuipc.Domain(dom) as d, state_dict.Reader(d, "w") as r:
        held, torn, seen = [], 0, set()
        for _ in range(int(arg)):
            sd = r.open()
            seen.add(sd.version)
            torn += not _whole(sd, sd.version)
            held.append(sd)
            if len(held) > 3:
                old = held.pop(0)
                torn += not _whole(old, old.version)
                old.release()
        torn += sum(not _whole(h, h.version) for h in held)
        say(torn=torn, versions=len(seen))


def sd_hold_read(dom, arg):
    """Opens the newest version, says which, and holds it until killed (or
    the test's word)."""
    from gpuipc import state_dict
    with gpuipc.Domain(dom) as d, state_dict.Reader(d, "w") as r:
        sd = r.open()
        say(version=sd.version, whole=_whole(sd, sd.version))
        sys.stdin.readline()


def driver_loaded():
    """Whether the CUDA driver gpuipc would load is mapped in this process."""
    lib = os.environ.get("GPUIPC_CUDA_LIB", "libcuda.so.1")
    name = os.path.basename(os.path.realpath(lib)) if "/" in lib else lib.split(".so")[0]
    with open("/proc/self/maps") as f:
        return any(name in line for line in f)


if __name__ == "__main__":
    role, dom = sys.argv[1], sys.argv[2]
    globals()[role](dom, sys.argv[3] if len(sys.argv) > 3 else None)
    if os.environ.get("PEER_DRIVER_CHECK"):
        say(driver_loaded=driver_loaded())
