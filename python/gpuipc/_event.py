"""gpuipc's interprocess CUDA events: Event. The C calls live in
_gpuipc_event.c."""
from . import _gpuipc as _c
from ._common import _stream


class Event:
    """An interprocess CUDA event (``gpuipc_event_create`` / ``_import``)."""

    def __init__(self, device=0, _box=None):
        self._box = _box if _box is not None else _c.event_create(int(device))

    @classmethod
    def from_handle(cls, packed, device=-1):
        return cls(_box=_c.event_import(bytes(packed), int(device)))

    def export(self):
        return _c.event_export(self._box)

    def record(self, stream=None):
        _c.event_op(self._box, 0, _stream(stream))

    def wait(self, stream=None):
        _c.event_op(self._box, 1, _stream(stream))

    def query(self):
        return _c.event_op(self._box, 2, None)

    def synchronize(self):
        _c.event_op(self._box, 3, None)

    def release(self):
        box, self._box = self._box, None
        if box is not None:
            _c.close(box)
