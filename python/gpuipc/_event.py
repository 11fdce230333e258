"""gpuipc's interprocess CUDA events: Event. The C calls live in
_gpuipc_event.c."""
from . import _gpuipc as _c
from ._common import _Boxed, _stream


class Event(_Boxed):
    """An interprocess CUDA event (``gpuipc_event_create`` / ``_import``)."""

    _closed = "the event was released"

    def __init__(self, device=0, _box=None):
        self._box = _box if _box is not None else _c.event_create(int(device))

    @classmethod
    def from_handle(cls, packed, device=-1):
        return cls(_box=_c.event_import(bytes(packed), int(device)))

    def export(self):
        return _c.event_export(self._h())

    def record(self, stream=None):
        _c.event_op(self._h(), 0, _stream(stream))

    def wait(self, stream=None):
        _c.event_op(self._h(), 1, _stream(stream))

    def query(self):
        return _c.event_op(self._h(), 2, None)

    def synchronize(self):
        _c.event_op(self._h(), 3, None)

    def release(self):
        box = self._take_box()
        if box is not None:
            _c.close(box)

    close = release
