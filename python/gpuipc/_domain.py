"""gpuipc's domains: Domain, the named rendezvous of processes, with its
named segments (Segment, a Buffer of _buffer.py) and the channels it opens
(_channel.py). The C calls live in _gpuipc_buffer.c."""
from . import _gpuipc as _c
from ._buffer import Buffer
from ._channel import Channel
from ._common import AUTO, DEFAULT, HOST, _Boxed, _count, _kind, _ms, _stream


def _unpinned(pinned):
    """The open flag for ``pinned`` (a bool)."""
    if not isinstance(pinned, bool):
        raise TypeError(f"pinned must be True or False, not {pinned!r}")
    return 0 if pinned else _c.UNPINNED


class Domain(_Boxed):
    """A named rendezvous of processes (``gpuipc_domain_join``); a context
    manager that leaves the domain on exit."""

    _closed = "the domain was left"

    def __init__(self, name, timeout=DEFAULT, host_broker=True):
        self.name = name
        flags = 0 if host_broker else _c.JOIN_NO_BROKER
        self._box = _c.domain_join(name, _ms(timeout, default_ms=0), flags)

    def leave(self):
        for p in self.__dict__.pop("_sd_publishers", {}).values():
            p.close()  # state_dict.publish(lend=True)'s
        box = self._take_box()
        if box is not None:
            _c.close(box)

    close = leave

    def info(self):
        return _c.domain_info(self._h())

    # segments
    def create_segment(self, name, nbytes, kind=HOST, device=-1, exclusive=False,
                       scratch=False, timeout=DEFAULT, stream=None, pinned=True):
        """Allocate segment ``name`` (or open it if it exists, unless
        ``exclusive``): fill it, then ``publish()``. With ``scratch`` it is
        published at once. ``pinned=False``: HOST memory mapped anew is not
        registered with CUDA in this process (for data no GPU reads:
        registering, and undoing it at the release, wait for the work
        queued on the GPU)."""
        flags = _c.CREATE | (_c.EXCL if exclusive else 0) | (_c.SCRATCH if scratch else 0)
        return self._open(name, nbytes, kind, device, flags | _unpinned(pinned),
                          timeout, stream)

    def lend_segment(self, name, buffer, scratch=False, timeout=DEFAULT):
        """Publish ``buffer`` (a Buffer this process allocated, e.g. the
        one ``gpuipc.torch.buffer_of`` finds under a tensor) as new segment
        ``name``, without a copy: openers map these very bytes and see later
        writes. Raises Exists if the name is taken. Then ``publish()``
        (ordered after a stream's work), or ``scratch``: published at once.
        The Segment is a handle of its own on ``buffer``'s memory: its
        ``release()`` ends the lend (once unlinked, the name's record goes
        from the broker) while ``buffer`` stays yours."""
        flags = _c.CREATE | (_c.SCRATCH if scratch else 0)
        box = _c.segment_open(self._h(), name, 0, _kind(AUTO), -1, flags, _ms(timeout),
                              None, buffer._h())
        return Segment._wrap(box, name, self)

    def open_segment(self, name, wait=False, timeout=DEFAULT, nbytes=0, kind=AUTO,
                     device=-1, stream=None, pinned=True):
        """Open published segment ``name``; ``wait`` waits for its
        publication; ``pinned``: as for create_segment."""
        flags = _c.WAIT if wait else 0
        return self._open(name, nbytes, kind, device, flags | _unpinned(pinned),
                          timeout, stream)

    def _open(self, name, nbytes, kind, device, flags, timeout, stream):
        device = _count(device, "device")
        box = _c.segment_open(self._h(), name, _count(nbytes, "nbytes"), _kind(kind),
                              device, flags, _ms(timeout), _stream(stream, device >= 0))
        return Segment._wrap(box, name, self)

    def unlink(self, name):
        """Remove segment ``name`` (its memory goes with its last holder)."""
        _c.segment_unlink(self._h(), name)

    def stat(self, name):
        return _c.segment_stat(self._h(), name)

    def segments(self):
        return _c.segment_list(self._h())

    # channels
    def channel(self, name, timeout=DEFAULT, depth=0, device=None, send_timeout=DEFAULT,
                stage_slots=0, stage_slot_bytes=0):
        """Meet the other end of channel ``name`` (``gpuipc_channel_open``)."""
        return Channel(self, name, timeout, depth, device, send_timeout, stage_slots,
                       stage_slot_bytes)


class Segment(Buffer):
    """A named segment of a domain (``gpuipc_segment_open``)."""

    @classmethod
    def _wrap(cls, box, name=None, domain=None):
        self = super()._wrap(box)
        self.name, self._domain = name, domain
        return self

    def publish(self, stream=None):
        """Make the segment (created here, now filled) visible to other
        openers, ordered after the work queued on ``stream``."""
        _c.segment_publish(self._h(), _stream(stream, self.kind != "host"))

    def unlink(self):
        self._domain.unlink(self.name)

