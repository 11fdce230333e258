"""Weights in one step: a whole state dict under one name.

A version N is a JSON manifest in HOST segment "NAME.vN.m" that places
every tensor in a segment: one segment of the publisher's,
"NAME.<token>.c<k>" (the manifest's "data"), holds copies (packed,
256-byte aligned, one copy each) of the tensors that were copied, and,
with ``lend``, tensors that already lie in gpuipc memory
(``gpuipc.torch.move_to_gpuipc``, ``mem_pool`` / ``use_allocator``, or a
``gpuipc.Buffer``) are not copied: the buffer under them is lent as a
segment of its own, "NAME.<token>.<k>", which keeps its name from version
to version while the publisher lends it. The 8-byte
HOST segment "NAME" holds N and, in its low 24 bits, how many versions
back N's manifest was written: a version whose tensors all lie where the
last one's did (lent, same names, places, dtypes and shapes) writes no
manifest, it only moves the head, and a reader that has that manifest's
tensors already hands them out again. Publishing N unlinks N-1's segments
that N does not use (readers that hold them keep them), except N-1's
copies' segment, which the publisher keeps for reuse (``Publisher._POOL``
retired ones at most; beyond that the oldest is unlinked). Manifests and
heads are mapped unpinned (no GPU reads them): registering host memory
with CUDA, and undoing it, waits for the GPU's queued work, and a
publisher or reader would wait for its GPU at every version.

A version copied into a segment that a retired version leaves names the
publisher's interprocess event in its manifest ("event"), recorded on the
publisher's stream after the copies: the publisher's host does not wait
for them, and a reader's stream waits for the event before it reads.

Copies' segments are reused, not made anew for each version: a reader
uses version N while it holds N's manifest segment (a tensor of N's
copies holds it), and can only open N's manifest until N is retired (its
name unlinked). The publisher keeps a retired manifest held and copies a
later version into the retired version's segment once the broker lists no
other holder of that manifest (one request looks at the whole pool);
until then it takes another segment, or a new one. A broker that took
the domain over since the manifest was made (another epoch) may not know
every holder yet: such segments are unlinked, not reused. Readers keep the
copies' segments they used last mapped (Reader._COPIES), so once the
publisher reuses its segments an open maps nothing and asks the broker
for the manifest alone. A reader in the publisher's process reads
through a Domain object of its own: opens through the publisher's
connection count as the publisher's holds until both let go, and the
publisher then takes a new segment for each version.

The head is published with the first version in it, and moves only once
a version's segments are published: a reader never waits for the
segments the head names. One it finds gone was retired by a newer
version, which it opens instead. What a publisher that died mid-publish
left (a version written but never named by the head, or one the head no
longer names but that was not unlinked yet) the next full publish of any
publisher of the name unlinks: versions other than the newest (their
copies too), and lent or copies' segments the newest does not use that no
process holds (a live publisher holds what it is writing and the
retired copies it keeps).

Copied versions are snapshots: a reader of N sees N even after N+1 is out
(while it holds a tensor of N: a GPU reader keeps them until its work on
them is done, as with any memory it frees).
Lent tensors are the publisher's memory: readers see its later writes, so
the publisher writes them only while no reader uses the version (as RL
trainers and rollout engines alternate anyway).

Publisher and Reader keep their segments between calls: a reader's second
sync of a lent state dict maps nothing and makes no view anew. The module
functions publish / open / copy_into are the one-shot forms."""
import bisect
import contextlib
import itertools
import json
import operator
import os
import re
import struct
import threading

from . import _gpuipc as _c
from ._buffer import Buffer
from ._common import DL_CPU, DL_CUDA, HOST, VMM, _stream  # noqa: F401
from ._domain import Domain  # noqa: F401
from ._errors import InvalidArgument, NotFound

_ALIGN = 256


def _torch():
    import torch
    return torch


def _as_bytes(buf):
    torch = _torch()
    return torch.utils.dlpack.from_dlpack(buf.__dlpack__())


def _tensor_at(raw, e):
    torch = _torch()
    return raw[e["offset"]:e["offset"] + e["nbytes"]].view(getattr(torch, e["dtype"])).view(
        e["shape"])


def _dev_of(t):
    """The CUDA device index of tensor ``t``, -1 for a CPU tensor."""
    return t.device.index if t.is_cuda else -1


def _copy_all(copies, torch_copy, stream):
    """Queue ``copies`` ((dst address, dst device, src address, src device,
    bytes, entry) each; dst None: not as bytes) on ``stream`` (None:
    PyTorch's current stream of the device): those whose two sides lie on
    one device (or both on the host) as raw bytes, in one
    gpuipc_memcpy_batch a device (a torch copy_ costs 10-30 us of host time
    a tensor, a state dict has hundreds); the others by
    ``torch_copy(entry)`` in the stream's context. Host copies are done on
    return."""
    torch = _torch()
    batches, slow = {}, []
    for dst, ddev, src, sdev, n, e in copies:
        if dst is None or ddev != sdev:
            slow.append(e)
        elif n > 0:
            b = batches.setdefault(ddev, ([], [], []))
            b[0].append(dst)
            b[1].append(src)
            b[2].append(n)
    for dev, (d, s_, n) in batches.items():
        if dev < 0:
            _c.memcpy_batch(d, s_, n, -1, None)
        else:
            st = stream if stream is not None else torch.cuda.current_stream(dev)
            # Both sides device memory: the driver's device-to-device copy.
            _c.memcpy_batch(d, s_, n, dev, st.cuda_stream, _c.MEMCPY_DEVICE)
    if slow:
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with ctx:
            for e in slow:
                torch_copy(e)


# A tensor's address, and its dtype and shape: compared tensor by tensor
# on every sync (copy_into(share=True)), each as one pass of C.
_PTR = operator.methodcaller("data_ptr")
_META = operator.attrgetter("dtype", "shape")


def _placement(target):
    """(the tensors of ``target``, what places them: its names, and their
    objects, addresses, dtypes and shapes), equal from one call to the next
    while each name is the same tensor where it was (the tensors are kept
    with it: their ids stay theirs)."""
    ts = list(target.values())
    return ts, (list(target), list(map(id, ts)), list(map(_PTR, ts)), list(map(_META, ts)))


def _check_tensors(sd, what):
    """TypeError unless every value of ``sd`` is a torch tensor (numpy
    arrays are not taken: torch.from_numpy(a) shares their memory)."""
    torch = _torch()
    if all(map(isinstance, sd.values(), itertools.repeat(torch.Tensor))):
        return
    for k, t in sd.items():
        if not torch.is_tensor(t):
            raise TypeError(f"{what}: {k!r} is a {type(t).__module__}.{type(t).__qualname__}, "
                            "not a torch tensor (torch.from_numpy(a) shares a numpy array)")


def _entry(name, t):
    return {"name": name, "dtype": str(t.dtype).replace("torch.", ""),
            "shape": list(t.shape), "nbytes": t.numel() * t.element_size()}


def _buffer_under(t):
    """(the gpuipc Buffer that holds all of contiguous tensor ``t``, whether
    the caller must release it), or (None, False)."""
    if not t.is_contiguous():
        return None, False
    lo = t.data_ptr()
    hi = lo + t.numel() * t.element_size()
    # Any buffer of this process: gpuipc's, or PyTorch's allocator's block
    # on gpuipc (use_allocator, mem_pool).
    box = _c.buf_find(DL_CUDA if t.is_cuda else DL_CPU, lo, hi)
    return (None, False) if box is None else (Buffer._wrap(box), True)


def _create_fresh(domain, name, nbytes, **kw):
    """Create segment ``name``; one left by a publisher that died before
    it made its version current is unlinked first."""
    from ._errors import Exists
    try:
        return domain.create_segment(name, nbytes, exclusive=True, **kw)
    except Exists:
        try:
            domain.unlink(name)
        except NotFound:
            pass
        return domain.create_segment(name, nbytes, exclusive=True, **kw)


def _parallel(fn, items, workers=8):
    """fn(item) for every item, ``workers`` at a time (the C calls release
    the GIL: broker requests and CUDA imports overlap); the first error is
    raised once all are done."""
    if len(items) <= 1:
        for x in items:
            fn(x)
        return
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(min(workers, len(items))) as ex:
        for f in [ex.submit(fn, x) for x in items]:
            f.result()


_BACK = 24  # the head's low bits: how many versions back the manifest is


def _manifest(domain, name, ver, timeout):
    """Version ``ver``'s manifest (a dict), or None when it is gone
    (``timeout``: for the broker's answer; it never waits for the name)."""
    try:
        return _read_manifest(domain, name, ver, timeout)
    except NotFound:
        return None


def _read_manifest(domain, name, ver, timeout, hold=False):
    """Version ``ver``'s manifest (a dict); NotFound when it is gone. A
    head moves only once the version's segments are published, so a name
    missing here was retired, never still to come: nothing waits for it.
    ``hold``: (the dict, its Segment, still held)."""
    m = domain.open_segment(f"{name}.v{ver}.m", timeout=timeout, pinned=False)
    try:
        a = m.numpy()
        n = struct.unpack("<Q", bytes(a[:8]))[0]
        man = json.loads(bytes(a[8:8 + n]))
    except BaseException:
        m.release()
        raise
    if hold:
        return man, m
    m.release()
    return man


class _Named:
    """What Publisher and Reader share: state dict ``name`` of ``domain``
    and its head segment, held while open: one 8-byte word (written and
    read whole) holding the newest version and its manifest's."""

    def __init__(self, domain, name, timeout):
        self.domain, self.name, self.timeout = domain, name, timeout
        self._head = None
        self._word = None  # the head as one uint64
        self.version = 0

    def _hold_head(self, seg):
        import numpy as np
        self._head = seg
        self._word = seg.numpy()[:8].view(np.uint64)

    def _read_head(self):
        """(newest version, the version whose manifest places it)."""
        w = int(self._word[0])
        ver = w >> _BACK
        return ver, ver - (w & ((1 << _BACK) - 1))

    def _close_head(self):
        if self._head is not None:
            self._word = None
            self._head.release()
            self._head = None

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


class Publisher(_Named):
    """Publishes versions of state dict ``name`` in ``domain``.

    ``lend``: tensors lying in gpuipc memory are lent in place (no copy;
    see the module's text; ``gpuipc.torch.move_to_gpuipc(model)`` puts a
    model there), the others copied, one copy each, into a segment that
    a retired version no reader uses any more leaves for reuse (see the
    module's text). ``device``: the GPU that holds copies (default: that
    of the first tensor; CPU tensors: HOST)."""

    def __init__(self, domain, name, lend=False, device=None, timeout=30):
        super().__init__(domain, name, timeout)
        self.lend, self.device = lend, device
        self._token = os.urandom(3).hex()
        self._serial = 0
        self._lent = {}    # buffer address -> (segment name, Segment)
        self._starts = []  # sorted addresses of _lent, for _lent_under
        self._lock = threading.Lock()
        self._keep = ()    # this version's manifest
        self._man_id = None  # (its segment id, the broker's epoch): see _sweep
        self._man_epoch = None  # the broker's epoch before it was made
        self._data = None  # (name, Segment, bytes) holding this version's copies
        # The same of retired versions, with the version's manifest (held,
        # unlinked) and its id: reused once no reader holds that manifest.
        self._pool = []
        self._names = ()   # the segments this publisher's newest version names
        self._placed = None  # _layout of the newest version when all of it is lent
        self._man_ver = 0    # the version whose manifest places the newest
        self._sync_dev = -1  # the device whose stream a version waits for
        self._event = None   # (device, Event, its handle in hex): see _record

    def _current(self):
        """(newest version, its manifest's version); (0, 0) while the
        state dict has no head yet."""
        if self._head is None:
            try:
                self._hold_head(self.domain.open_segment(self.name, nbytes=8,
                                                         timeout=self.timeout,
                                                         pinned=False))
            except NotFound:
                return 0, 0
        return self._read_head()

    def _move_head(self, word):
        """Make ``word`` the head (the newest version's segments are
        published). The first version creates the head and publishes it
        with the word in it: readers never see a head without a version,
        and a publisher that dies before this leaves no head behind."""
        if self._head is not None:
            self._word[0] = word
            return
        seg = self.domain.create_segment(self.name, 8, kind=HOST, exclusive=True,
                                         timeout=self.timeout, pinned=False)
        self._hold_head(seg)
        self._word[0] = word
        seg.publish()

    def _layout(self, sd):
        """What places ``sd``'s tensors: equal from one call to the next
        when every tensor lies where it lay."""
        return [(k, t.data_ptr(), t.dtype, t.shape, t.stride()) for k, t in sd.items()]

    def _lent_under(self, t):
        """(name, Segment) of a buffer lent already that holds all of
        contiguous tensor ``t``, or None. (Held, a lent buffer's addresses
        cannot come to another buffer.)"""
        if not self._starts or not t.is_contiguous():
            return None
        lo = t.data_ptr()
        i = bisect.bisect_right(self._starts, lo) - 1
        if i < 0:
            return None
        name, seg = self._lent[self._starts[i]]
        if lo + t.numel() * t.element_size() > seg.ptr + seg.nbytes or (
                seg.kind == "host") == t.is_cuda:
            return None
        return name, seg

    def _lend_new(self, sd):
        """Lend, several at a time, the buffers under ``sd``'s tensors that
        are not lent yet (each is a request to the broker and, for GPU
        memory, an export)."""
        new, starts = {}, []  # found so far: one look-up a buffer, not a tensor
        for t in sd.values():
            if self._lent_under(t) is None:
                lo = t.data_ptr()
                i = bisect.bisect_right(starts, lo) - 1
                b = new[starts[i]][0] if i >= 0 else None
                if b is not None and t.is_contiguous() and (b.kind == "host") != t.is_cuda \
                        and lo + t.numel() * t.element_size() <= b.ptr + b.nbytes:
                    continue  # in a buffer found already
                buf, owned = _buffer_under(t)
                if buf is None:
                    continue
                if buf.ptr in new:
                    if owned:
                        buf.release()
                    continue
                new[buf.ptr] = (buf, owned)
                bisect.insort(starts, buf.ptr)
        if not new:
            return
        names = {}
        for ptr in new:
            self._serial += 1
            names[ptr] = f"{self.name}.{self._token}.{self._serial}"
        _parallel(lambda ptr: self._lend(names[ptr], *new[ptr]), list(new))

    def _lend(self, seg_name, buf, owned):
        """Lend ``buf`` as segment ``seg_name``; one that cannot be lent here
        (another process's memory) is left to be copied."""
        try:
            seg = self.domain.lend_segment(seg_name, buf, scratch=True, timeout=self.timeout)
        except InvalidArgument as e:
            if "imported" not in e.detail:
                raise
            return  # another process's memory: copied instead
        finally:
            if owned:
                buf.release()  # the segment holds this very buffer
        with self._lock:
            self._lent[seg.ptr] = (seg_name, seg)
            bisect.insort(self._starts, seg.ptr)

    def publish(self, sd, stream=None):
        """Publish ``sd`` (name -> torch tensor) as the next version; returns
        its number. Work queued on ``stream`` (default: PyTorch's current
        stream) before the call is in it."""
        _check_tensors(sd, "publish")
        torch = _torch()
        layout = self._layout(sd) if self.lend else None
        if layout is not None and layout == self._placed:
            ver = self._republish(stream)
            if ver is not None:
                return ver
        entries, placed, segs, copies, off = [], [], {}, [], 0
        first = next(iter(sd.values()), None)
        if self.lend:
            self._lend_new(sd)
        for k, t in sd.items():
            e = _entry(k, t)
            lent = self._lent_under(t) if self.lend else None
            if lent is not None:
                seg_name, seg = lent
                e["seg"] = segs.setdefault(seg_name, len(segs))
                e["offset"] = t.data_ptr() - seg.ptr
                placed.append(t)
            else:
                e["seg"], e["offset"] = -1, off
                off += (e["nbytes"] + _ALIGN - 1) // _ALIGN * _ALIGN
                copies.append((e, t))
            entries.append(e)
        cur, cur_man = self._current()
        ver = cur + 1
        dev = self.device
        if dev is None and first is not None and first.is_cuda:
            dev = first.device.index
        cuda = dev is not None or any(t.is_cuda for t in placed)
        s = stream if stream is not None else (
            torch.cuda.current_stream(dev) if cuda else None)
        data, ev_hex = None, None
        if copies:
            data = self._take_data(max(off, _ALIGN), dev)
            seg, raw, fresh = data[1], data[2], data[3]
            base, rdev = raw.data_ptr(), _dev_of(raw)

            def torch_copy(et):
                e, t = et
                _tensor_at(raw, e).copy_(t.detach().reshape(e["shape"]), non_blocking=True)
            _copy_all([(base + e["offset"] if t.is_contiguous() else None, rdev,
                        t.data_ptr(), _dev_of(t), e["nbytes"], (e, t))
                       for e, t in copies], torch_copy, s if dev is not None else None)
            if fresh:
                seg.publish(s if dev is not None else None)
            elif dev is not None:
                # Published long ago: readers' streams wait for this
                # event, which the manifest names, and the host goes on.
                ev_hex = self._record(dev, s)
            data = data[:3]
        if placed and cuda and s is not None:
            s.synchronize()  # readers find lent tensors written when they look
        self._sync_dev = dev if placed and cuda else -1
        self._man_epoch = self._epoch() if data is not None else None
        man = json.dumps({"version": ver, "copied": data is not None,
                          "data": None if data is None else data[0],
                          "event": ev_hex,
                          "nbytes": off, "segments": sorted(segs, key=segs.get),
                          "tensors": entries}).encode()
        mseg = _create_fresh(self.domain, f"{self.name}.v{ver}.m", len(man) + 8, kind=HOST,
                             pinned=False,
                             timeout=self.timeout)
        import numpy as np
        a = mseg.numpy()
        a[:8] = np.frombuffer(struct.pack("<Q", len(man)), np.uint8)
        a[8:8 + len(man)] = np.frombuffer(man, np.uint8)
        mseg.publish()
        self._move_head(ver << _BACK)  # now ver, with a manifest of its own
        prev, self._data = self._data, data
        self._retire(cur, cur_man, set(segs), prev)
        self._keep = (mseg,)
        self._names = ((data[0],) if data is not None else ()) + (
            f"{self.name}.v{ver}.m",) + tuple(segs)
        self.version = self._man_ver = ver
        self._placed = layout if data is None else None
        self._sweep(ver)
        return ver

    def _record(self, dev, s):
        """Record this publisher's interprocess event of GPU ``dev`` on
        stream ``s``; its handle, in hex, for the manifest. Re-recorded for
        each version: a reader that waits after a later record waits a
        little longer, for copies into another segment."""
        from ._event import Event
        if self._event is None or self._event[0] != dev:
            if self._event is not None:
                self._event[1].release()
            ev = Event(dev)
            self._event = (dev, ev, bytes(ev.export()).hex())
        self._event[1].record(s)
        return self._event[2]

    def _republish(self, stream):
        """The next version of a state dict that lies where the newest did,
        all of it lent: once the writes queued on ``stream`` are done, the
        head names it, with the newest's manifest. None (take the full
        path): another publisher's version came in between, or the
        manifest would be too far back."""
        torch = _torch()
        cur, _ = self._read_head()
        ver = cur + 1
        if cur != self.version or ver - self._man_ver >= 1 << _BACK:
            return None
        if self._sync_dev != -1:
            (stream or torch.cuda.current_stream(self._sync_dev)).synchronize()
        self._word[0] = ver << _BACK | (ver - self._man_ver)
        self.version = ver
        return ver

    _POOL = 2  # retired versions' copies kept for reuse

    def _take_data(self, nbytes, dev):
        """(name, Segment, its bytes, fresh) to copy a version of ``nbytes``
        into: a retired version's segment of ours whose manifest no reader
        holds (a reader holds the manifest of a version it uses; it cannot
        open it any more: retiring unlinked it), else a new one. One
        broker request looks at the whole pool."""
        kind, device = (HOST, -1) if dev is None else (VMM, dev)
        if self._pool:
            listed = self.domain.segments()
            by_id = {x["id"]: x for x in listed}
            named = {x["name"] for x in listed if x["state"] == "published"}
            epoch = self._epoch()
            for e in list(self._pool):
                n, seg, _, _, (mid, mepoch) = e
                m = by_id.get(mid)
                if n not in named or m is None or mepoch != epoch or (
                        m["nholders"] == 1 and m["holders"][0][1] > 1):
                    # unlinked by another publisher; a broker that took the
                    # domain over since the manifest was made (it learns
                    # of holders as they re-join: it may not know them
                    # all); the manifest opened through our own domain
                    # (one connection: its opens count as ours until both
                    # let go): never reusable
                    self._pool.remove(e)
                    self._drop(e)
                    continue
                if seg.nbytes < nbytes or seg.device != device or (
                        seg.kind == "host") != (kind == HOST):
                    continue
                if m["nholders"] == 1:
                    self._pool.remove(e)
                    e[3].release()  # the retired manifest: nobody reads it
                    return n, seg, e[2], False
        self._serial += 1
        n = f"{self.name}.{self._token}.c{self._serial}"
        seg = _create_fresh(self.domain, n, nbytes, kind=kind, device=device,
                            timeout=self.timeout)
        return n, seg, _as_bytes(seg), True

    def _epoch(self):
        """The epoch of the domain's broker now (a broker that takes over
        has another)."""
        return self.domain.info()["epoch"]

    def _drop(self, entry):
        """Unlink and let go of a pool entry (readers keep what they hold)."""
        try:
            self.domain.unlink(entry[0])
        except NotFound:
            pass
        entry[1].release()
        entry[3].release()

    def _retire(self, old, old_man, used, prev=None):
        """Unlink version ``old``'s segments (its manifest is version
        ``old_man``'s) that the new one does not use, and let go of lent
        buffers no longer in it. ``prev``: our copies of ``old``, which go
        to the pool (the oldest beyond _POOL are unlinked)."""
        if old == self.version:
            names = self._names  # ours: no need to read its manifest
        elif old:
            man = _manifest(self.domain, self.name, old_man, 0) or {}
            names = (man.get("data") or f"{self.name}.v{old}", f"{self.name}.v{old_man}.m"
                     ) + tuple(man.get("segments", ()))
        else:
            names = ()
        keep = self._keep
        if prev is not None and keep and self._man_id is not None:
            used = used | {prev[0]}
            self._pool.append(prev + (keep[0], self._man_id))  # its manifest stays held
            keep = ()
            while len(self._pool) > self._POOL:
                self._drop(self._pool.pop(0))
        elif prev is not None:
            prev[1].release()  # unlinked below with the version's names
        for n in names:
            if n in used:
                continue
            try:
                self.domain.unlink(n)
            except NotFound:
                pass
        for ptr, (n, seg) in list(self._lent.items()):
            if n not in used:
                del self._lent[ptr]
                self._starts.remove(ptr)
                seg.release()
        for seg in keep:
            seg.release()
        self._keep = ()

    def _sweep(self, ver):
        """Unlink the segments of state dict ``name`` that a publisher which
        died mid-publish left published, now that ``ver`` (ours) is the
        newest: versions up to ``ver`` that it does not use (written but
        never named by the head, or named before and not retired yet) with
        their copies' segments, and newer versions and other publishers'
        lent and copies' segments that ``ver`` does not use and no process
        holds (a live publisher holds what it is writing and what it keeps
        for reuse). Holders keep what they hold; the head's are kept.
        Notes the id of ``ver``'s manifest, with the broker's epoch when one
        broker saw it made and listed (for _take_data)."""
        pre = re.escape(self.name)
        version = re.compile(pre + r"\.v(\d+)(?:\.m)?")
        lent = re.compile(pre + r"\.[0-9a-f]{6}\.c?\d+")  # lent, or copies
        keep = set(self._names) | {e[0] for e in self._pool}
        drop = []
        mine = f"{self.name}.v{ver}.m"
        self._man_id = None
        for s in self.domain.segments():
            n = s["name"]
            if n == mine and s["state"] == "published" and self._man_epoch is not None:
                self._man_id = s["id"]  # what _take_data looks for once ver retires
            if s["state"] != "published" or n in keep:
                continue
            m = version.fullmatch(n)
            if m is not None:
                stale = int(m.group(1)) <= ver or s["nholders"] == 0
                if stale and n.endswith(".m"):
                    data = (_manifest(self.domain, self.name, int(m.group(1)), 0) or {}
                            ).get("data")
                    if data and data not in keep:
                        drop.append(data)  # the version's copies, held or not
            else:
                stale = lent.fullmatch(n) is not None and s["nholders"] == 0
            if stale:
                drop.append(n)
        for n in drop:
            try:
                self.domain.unlink(n)
            except NotFound:
                pass
        if self._man_id is not None:
            epoch = self._epoch()
            self._man_id = (self._man_id, epoch) if epoch == self._man_epoch else None

    def segments(self):
        """The segments this publisher holds for its newest version."""
        return self._keep + ((self._data[1],) if self._data is not None else ()) + tuple(
            seg for _, seg in self._lent.values())

    def close(self):
        """Let go of this publisher's references; the newest version stays
        openable until a newer one or an unlink retires it (HOST and VMM
        memory lives on in the domain). Retired versions' copies kept for
        reuse are unlinked."""
        for e in self._pool:
            self._drop(e)
        for seg in self.segments():
            seg.release()
        self._lent, self._starts, self._keep, self._data, self._pool = {}, [], (), None, []
        if self._event is not None:
            self._event[1].release()
            self._event = None
        self._close_head()


class SharedStateDict(dict):
    """name -> zero-copy tensor of one published version; ``release()``
    (or a ``with`` block) drops the dict's tensors: the version's memory
    goes once no tensor made from it is left."""

    def release(self):
        self.clear()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.release()


class _Sources(dict):
    """A version as copy_into reads it: name -> (its segment's bytes as a
    torch tensor, its manifest entry), no tensor made for each (a view
    costs 8-10 us of host time, a state dict has hundreds); ``view(name)``
    makes one where a target needs torch's copy_."""

    def view(self, name):
        raw, e = self[name]
        return _tensor_at(raw, e)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        pass  # what it holds goes with it


class Reader(_Named):
    """Opens the newest version of state dict ``name`` again and again,
    keeping the segments of lent tensors mapped (and their views made)
    while versions keep using them, and the last copies' segments mapped
    for the versions that reuse them. ``device``: the GPU to map GPU memory
    on (-1: its own); ``stream``: the stream that waits for copied
    versions' writes."""

    def __init__(self, domain, name, device=-1, stream=None, timeout=30):
        super().__init__(domain, name, timeout)
        self.device, self.stream = device, stream
        self._segs = {}   # lent segment name -> Segment
        self._raws = {}   # lent segment name -> its bytes as a torch tensor
        self._views = {}  # (segment, offset, dtype, shape) -> lent tensor
        self._copies = {}  # copies' segment name -> Segment, the last _COPIES used
        self._last = None  # (manifest version, views) of an all-lent version
        self._share_ext = None  # copy_into(share=True)'s last extents: _share_extents
        self._lock = threading.Lock()
        self._events = {}  # publishers' events ((hex handle, device) -> Event): _wait
        self.share_stats = None  # the last copy_into(share=True)'s

    def open(self):
        """The newest version as a SharedStateDict of zero-copy tensors. Its
        memory stays mapped, and its copies unchanged, while a tensor of it
        is alive; the reader also
        keeps lent segments mapped, and their tensors made, until a version
        no longer uses them or ``close()``. A version placed as the last one
        opened (all lent, nothing moved) is those same tensors again. Waits
        (``timeout``) only for the state dict's first version; a version
        retired before this reader mapped it is skipped for the newest at
        once. NotFound: a segment the head still names is gone (unlinked
        by hand)."""
        return self._open(self.stream)

    def _open(self, stream, for_copy=False):
        """open(), with ``stream`` the one that waits for copied versions'
        writes; ``for_copy``: a copied version as a _Sources (copy_into)."""
        if self._head is None:
            self._hold_head(self.domain.open_segment(self.name, wait=True,
                                                     timeout=self.timeout,
                                                     pinned=False))
        for _ in range(100):
            ver, mver = self._read_head()
            try:
                return self._open_version(ver, mver, stream, for_copy)
            except NotFound:
                if self._read_head() == (ver, mver):
                    raise  # gone, yet still the newest: nothing newer to take
        raise NotFound(0, "ENOENT", f"state dict {self.name}: no stable version")

    def _open_version(self, ver, mver, stream=None, for_copy=False):
        """Version ``ver`` (placed by version ``mver``'s manifest); NotFound
        when a segment of it is gone (retired: the head has moved on).
        ``for_copy``: a copied version comes as a _Sources (copy_into)."""
        if self._last is not None and self._last[0] == mver:
            out = SharedStateDict(self._last[1])  # placed as the last one opened
            out.version = self.version = ver
            return out
        man, mseg = _read_manifest(self.domain, self.name, mver, self.timeout, hold=True)
        self._last = None
        packed = None
        try:
            if man["copied"]:
                packed = self._copies_of(man, ver, mseg)
                if man.get("event"):
                    self._wait(man["event"], stream, packed.device.index)
        finally:
            mseg.release()  # held on by the copies' tensors, if any
        if for_copy and packed is not None:
            out = self._sources(man, packed)
            out.version = self.version = ver
            return out
        views = self._make_views(man, packed)
        if packed is None:
            self._last = (mver, views)
        out = SharedStateDict(views)
        out.version = self.version = ver
        return out

    _COPIES = 2  # copies' segments kept mapped: a publisher alternates two

    def _wait(self, handle, stream, views_dev):
        """Make ``stream`` (None: PyTorch's current stream of GPU
        ``views_dev``, where the version's views lie and are read) wait for
        the publisher's event ``handle`` (hex), recorded after its copies
        into a segment it reused."""
        from ._event import Event
        torch = _torch()
        # Opened for the stream's GPU: a stream waits only on events of
        # its own device's context. Not the current device: a reader of
        # GPU 1 in a process whose current device is 0 reads on GPU 1.
        dev = getattr(stream, "device", None)
        if dev is not None:
            dev = dev.index if hasattr(dev, "index") else int(dev)
        else:
            dev = views_dev
        if stream is None:
            stream = torch.cuda.current_stream(dev)
        ev = self._events.get((handle, dev))
        if ev is None:
            while len(self._events) >= 4:  # a publisher keeps one a GPU
                self._events.pop(next(iter(self._events))).release()
            ev = self._events[(handle, dev)] = Event.from_handle(bytes.fromhex(handle), dev)
        ev.wait(stream)

    def _copies_of(self, man, ver, mseg):
        """The bytes of version ``ver``'s copies as a torch tensor, which
        holds the version's manifest ``mseg`` while it (or a view of it)
        lives: a publisher reuses a retired version's segment only once no
        reader holds its manifest. The segment stays mapped here (the
        last _COPIES of them) for the versions that reuse it."""
        name = man.get("data") or f"{self.name}.v{ver}"
        seg = self._copies.pop(name, None)
        if seg is None:
            seg = self.domain.open_segment(name, timeout=self.timeout, device=self.device,
                                           stream=self.stream)
        self._copies[name] = seg  # the newest last
        while len(self._copies) > self._COPIES:
            self._copies.pop(next(iter(self._copies))).release()
        sub = seg.view("uint8", (seg.nbytes,))
        sub._claim = mseg.view("uint8", (mseg.nbytes,))  # a reference of its own
        try:
            return _as_bytes(sub)
        finally:
            sub.release()  # the tensor holds its own reference, and sub

    def _map(self, names):
        """Map the lent segments ``names`` (those not mapped yet, several at
        a time); let go of those no longer named."""
        def open_one(n):
            seg = self.domain.open_segment(n, timeout=self.timeout, device=self.device)
            with self._lock:
                self._segs[n] = seg
        _parallel(open_one, [n for n in names if n not in self._segs])
        for n in [n for n in self._segs if n not in names]:
            del self._segs[n]  # unmapped once no tensor of it is left
            self._raws.pop(n, None)

    def _raw(self, name):
        """Lent segment ``name``'s bytes as a torch tensor (made once)."""
        raw = self._raws.get(name)
        if raw is None:
            raw = self._raws[name] = _as_bytes(self._segs[name])
        return raw

    def _sources(self, man, packed):
        names = man["segments"]
        self._map(names)
        src = {}
        for e in man["tensors"]:
            raw = packed if e["seg"] < 0 else self._raw(names[e["seg"]])
            src[e["name"]] = (raw, e)
        return _Sources(src)

    def _make_views(self, man, packed):
        names = man["segments"]
        self._map(names)
        views, lent = {}, {}
        for e in man["tensors"]:
            if e["seg"] < 0:
                views[e["name"]] = _tensor_at(packed, e)
                continue
            key = (names[e["seg"]], e["offset"], e["dtype"], tuple(e["shape"]))
            t = self._views.get(key)
            if t is None:
                t = _tensor_at(self._raw(key[0]), e)
            views[e["name"]] = lent[key] = t
        self._views = lent
        return views

    def copy_into(self, target, stream=None, share=False, chunk_bytes=0):
        """Copy the newest version into the tensors of ``target`` (a state
        dict of the same names, shapes and dtypes) on ``stream`` (default:
        PyTorch's current one); returns the version once the copies are done.

        ``share=True``: the readers that copy the same version at the same
        time share the work (docs/shared-copy.md): they form a chain in the
        order they came, the first copying from the publisher and each other
        from the one before it, so each byte leaves the publisher's GPU once
        however many readers there are. The
        targets must then be gpuipc memory (``gpuipc.torch.mem_pool()``,
        ``move_to_gpuipc``), which the other readers read from, and each
        target exactly the size and dtype of its tensor (ValueError
        otherwise, before anything is copied). ``chunk_bytes``: the unit of
        the sharing (0: the library's default). A reader that dies or stalls
        costs the others at most the timeout; its own call raises. What
        the call did is in ``share_stats`` afterwards (a dict: joined,
        server, chunks, from_publisher, from_peers, taken_over, passed_over,
        recopied, lent, opened, ahead; gpuipc_share_stats_t says what each
        counts).
        Between calls the library keeps the targets' gpuipc buffers lent
        and the peers' memory mapped, and opens the next version's round
        ahead; a target buffer released meanwhile (a closed mem_pool, say)
        comes free then (a thread of the library lets go of its lend)."""
        _check_tensors(target, "copy_into")
        torch = _torch()
        first = next(iter(target.values()))
        if share:
            with self._open(stream if stream is not None else self.stream) as sd:
                self._share_into(sd, target, stream, chunk_bytes)
                return sd.version
        # A version all lent: its views are kept from one version to the
        # next, and torch's copy_ of each starts the copies at once. A
        # copied one (a snapshot): raw bytes in one batch, no view made.
        with self._open(stream if stream is not None else self.stream, for_copy=True) as src:
            if isinstance(src, _Sources):
                self._copy_raw(src, target, stream)
            else:
                ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
                with ctx:
                    for k, t in target.items():
                        t.copy_(src[k], non_blocking=True)
            if first.is_cuda:
                (stream or torch.cuda.current_stream()).synchronize()
            return src.version

    @staticmethod
    def _copy_raw(src, target, stream):
        """copy_into from a _Sources: targets of the version's dtype and
        shape, contiguous, as bytes; the others by torch's copy_ (which
        converts)."""
        copies = []
        for k, t in target.items():
            raw, e = src[k]
            fits = (t.is_contiguous() and str(t.dtype) == "torch." + e["dtype"]
                    and list(t.shape) == e["shape"])
            copies.append((t.data_ptr() if fits else None, _dev_of(t),
                           raw.data_ptr() + e["offset"], _dev_of(raw), e["nbytes"], k))
        _copy_all(copies, lambda k: target[k].copy_(src.view(k), non_blocking=True), stream)

    def _share_into(self, sd, target, stream, chunk_bytes):
        """copy_into(share=True): one gpuipc_share_copy of every tensor,
        in the version's own order (every reader lists the same extents)."""
        torch = _torch()
        missing = [k for k in target if k not in sd]
        if missing:
            raise ValueError(f"copy_into: {missing[0]!r} is not in version {sd.version} "
                             f"of {self.name}")
        ext = self._share_extents(sd, target)
        first = next(iter(target.values()))
        if first.is_cuda:
            s = stream or torch.cuda.current_stream(first.device)
            handle = s.cuda_stream
        else:
            s, handle = None, None
        # The next version's round: its table is opened ahead, after this
        # call, so that the next sync finds it mapped.
        self.share_stats = _c.share_copy(self.domain._box, f"{self.name}.v{sd.version}",
                                         ext, handle, int(chunk_bytes), self.timeout,
                                         f"{self.name}.v{sd.version + 1}")
        if s is not None:
            s.synchronize()

    def _share_extents(self, sd, target):
        """The (src, dst, bytes) of every tensor of ``target``, in the
        version's order. The last call's, when the version's tensors are
        the very views it had (a lent state dict synced every step: its
        views are kept from one version to the next) and the target's the
        very tensors they were, of the same address, dtype and shape; else
        built and checked anew."""
        c = self._share_ext
        if c is not None and c[0] is target and self._last is not None and c[1] is self._last:
            if _placement(target)[1] == c[3]:
                return c[4]
        self._share_ext = None
        ext = []
        for k, src in sd.items():
            t = target.get(k)
            if t is None:
                continue
            if t.dtype != src.dtype or t.shape != src.shape or not t.is_contiguous():
                raise ValueError(f"copy_into(share=True): target {k!r} is {t.dtype} "
                                 f"{tuple(t.shape)}{'' if t.is_contiguous() else ' (strided)'}"
                                 f", the version's is {src.dtype} {tuple(src.shape)}")
            n = t.numel() * t.element_size()
            if n:
                ext.append((src.data_ptr(), t.data_ptr(), n))
        # With _last set, ``sd`` holds its views (_open_version): kept.
        if self._last is not None:
            self._share_ext = (target, self._last, *_placement(target), ext)
        return ext

    def close(self):
        """Let go of the reader's segments: each is unmapped once no tensor
        made from it is left."""
        for seg in self._copies.values():
            seg.release()
        for ev in self._events.values():
            ev.release()
        self._events = {}
        self._segs, self._raws, self._views, self._last, self._copies = {}, {}, {}, None, {}
        self._share_ext = None
        self._close_head()


def publish(domain, name, sd, device=None, stream=None, timeout=30, lend=False):
    """Publish state dict ``sd`` (name -> torch tensor) under ``name`` as a
    new version (see Publisher); returns (version, segments). Without
    ``lend``, keep the segments while this version should stay openable by
    name. With ``lend``, the domain keeps one Publisher per name between
    calls (a buffer keeps its segment from version to version; leaving the
    domain lets go), and the segments are that publisher's."""
    if lend:
        pubs = domain.__dict__.setdefault("_sd_publishers", {})
        p = pubs.get(name)
        if p is None:
            p = pubs[name] = Publisher(domain, name, lend=True, device=device,
                                       timeout=timeout)
        return p.publish(sd, stream), p.segments()
    p = Publisher(domain, name, device=device, timeout=timeout)
    ver = p.publish(sd, stream)
    segs = p.segments()
    p._keep, p._data = (), None  # handed to the caller
    p.close()
    return ver, segs


def open(domain, name, device=-1, timeout=30, stream=None):  # noqa: A001
    """The newest version of state dict ``name`` as a SharedStateDict of
    zero-copy tensors (on ``device``: the GPU to map a GPU version for)."""
    r = Reader(domain, name, device=device, stream=stream, timeout=timeout)
    try:
        return r.open()
    finally:
        r.close()


def copy_into(domain, name, target, stream=None, timeout=30, share=False):
    """Copy the newest version of ``name`` into the tensors of ``target``
    (a state dict of the same names, shapes and dtypes), on ``stream``
    (``share``: see Reader.copy_into)."""
    _check_tensors(target, "copy_into")
    first = next(iter(target.values()))
    dev = first.device.index if first.is_cuda else -1
    with Reader(domain, name, device=dev, stream=stream, timeout=timeout) as r:
        return r.copy_into(target, stream, share=share)
