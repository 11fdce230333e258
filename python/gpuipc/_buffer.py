"""gpuipc's buffers: Buffer (memory gpuipc allocated or mapped), its
sub-views, empty(), and the registry of this process's buffers that lets
Channel.send (_channel.py) send an array lying in one without a copy. Their
segments' class, Segment, is in _domain.py. The C calls live in
_gpuipc_buffer.c."""
import threading

from . import _gpuipc as _c
from ._common import (DL_CPU, DL_CUDA, HOST, _Boxed, _Desc, _KIND_NAMES, _dtype_of,
                      _kind, _nbytes, _typestr_to_dl)

# ---- the registry of gpuipc memory (zero-copy sends) -----------------------

class _Registry:
    """The buffers this process holds, so that an array lying in one is sent
    as that buffer (no copy). Their address ranges are kept in C
    (_gpuipc_registry.c), where the C send paths see them too; here, the
    buffers by (device type, start): several may start at one address (a
    buffer and the segment it is lent as), and the range stays while any
    of them is held."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries = {}  # (device_type, start) -> [weakref], newest last

    def add(self, buf):
        import weakref
        key = (buf._dl_device_type(), buf.ptr)
        with self._lock:
            refs = [r for r in self._entries.get(key, ()) if r() is not None]
            self._entries[key] = refs + [weakref.ref(buf)]
            _c.registry_set(key[0], key[1], buf.ptr + buf.nbytes)

    def remove(self, buf):
        key = (buf._dl_device_type(), buf.ptr)
        with self._lock:
            refs = self._entries.get(key)
            if refs is None:
                return
            left = [r for r in refs if r() not in (buf, None)]
            last = left[-1]() if left else None
            if last is not None:
                self._entries[key] = left
                _c.registry_set(key[0], key[1], last.ptr + last.nbytes)
            else:
                del self._entries[key]
                _c.registry_drop(*key)

    def find_desc(self, d):
        """The live buffer that holds all of _Desc ``d``, or None (at once,
        without working out d's bounds, while no buffer is registered)."""
        if not self._entries:
            return None
        return self.find_span(d.device_type, d.lo, d.hi)

    def find_span(self, dev_type, lo, hi):
        """The live buffer that holds bytes [lo, hi) of ``dev_type``, or None."""
        with self._lock:
            span = _c.registry_find(dev_type, lo)
            if span is None or hi > span[1]:
                return None
            refs = self._entries[(dev_type, span[0])]
        for ref in reversed(refs):
            buf = ref()
            if buf is not None and buf._box is not None:
                return buf
        return None


_registry = _Registry()


# ---- buffers ----------------------------------------------------------------

class Buffer(_Boxed):
    """Memory gpuipc allocated (``gpuipc_buf_alloc``) or mapped: arrays in it
    are sent without a copy. Exposes ``__dlpack__``, and
    ``__array_interface__`` (HOST) or ``__cuda_array_interface__`` (GPU), as
    ``dtype`` x ``shape`` (default: bytes)."""

    _closed = "the buffer was released"

    def __init__(self, nbytes, kind=HOST, device=-1, shape=None, dtype="uint8"):
        box = _c.buf_alloc(int(nbytes), _kind(kind), int(device))
        self._init(box, shape, dtype)

    @classmethod
    def _wrap(cls, box, shape=None, dtype="uint8"):
        self = cls.__new__(cls)
        self._init(box, shape, dtype)
        return self

    def _init(self, box, shape, dtype):
        self._box = box
        self.ptr, self.nbytes, k, self.device = _c.buf_info(box)
        self.kind = _KIND_NAMES.get(k, "?")
        self.typestr, item = _dtype_of(dtype)
        self.shape = tuple(shape) if shape is not None else (self.nbytes // item,)
        n = _nbytes(self.shape, item)
        if n > self.nbytes:
            raise ValueError(f"shape {self.shape} of {dtype} needs {n} bytes; the buffer has {self.nbytes}")
        _registry.add(self)

    def __del__(self):
        if self._box is not None:
            _registry.remove(self)

    def _dl_device_type(self):
        return DL_CPU if self.kind == "host" else DL_CUDA

    def release(self):
        """Drop this process's reference (views made from it must be gone)."""
        box = self._take_box()
        if box is not None:
            _registry.remove(self)
            _c.close(box)

    close = release

    def __exit__(self, *exc):
        self.release()  # a sub-view's own release, not close

    def alive(self):
        return _c.buf_alive(self._h())

    def export(self):
        """(packed handle bytes, fd or -1) for ``Buffer.from_handle`` in
        another process; the caller owns (and must close) the fd."""
        return _c.buf_export(self._h())

    @classmethod
    def from_handle(cls, packed, fd=-1, device=-1):
        return cls._wrap(_c.buf_import(bytes(packed), int(fd), int(device)))

    def _desc(self):
        self._h()
        dtype = _typestr_to_dl(self.typestr)
        dev = self.device if self.device >= 0 else 0
        return _Desc(self.ptr, self._dl_device_type(), dev, dtype, self.shape, None, self)

    def __dlpack_device__(self):
        d = self._desc()
        return (d.device_type, d.device_id)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("gpuipc buffers are exported without copying")
        return _c.dlpack_of(self, self._desc().t)

    def _interface(self):
        self._h()
        return {"version": 3, "shape": self.shape, "typestr": self.typestr,
                "data": (self.ptr, False), "strides": None}

    @property
    def __array_interface__(self):
        if self.kind != "host":
            raise AttributeError("__array_interface__: GPU memory (use __cuda_array_interface__)")
        return self._interface()

    @property
    def __cuda_array_interface__(self):
        if self.kind == "host":
            raise AttributeError("__cuda_array_interface__: host memory")
        d = self._interface()
        d["stream"] = None
        return d

    def numpy(self):
        """A numpy array over this memory (HOST; no copy)."""
        import numpy as np
        return np.asarray(self)

    def view(self, dtype, shape, offset=0):
        """A Buffer-like view of ``shape`` x ``dtype`` starting ``offset``
        bytes in (sendable without a copy)."""
        return _SubView(self, dtype, shape, offset)

    def __repr__(self):
        return f"<gpuipc.{type(self).__name__} {self.kind} {self.nbytes} bytes at {self.ptr:#x}>"


class _SubView(Buffer):
    def __init__(self, parent, dtype, shape, offset):
        self._parent = parent
        self._box = parent._h()
        self.kind, self.device = parent.kind, parent.device
        self.typestr, item = _dtype_of(dtype)
        self.shape = tuple(shape)
        n = _nbytes(self.shape, item)
        if offset < 0 or offset + n > parent.nbytes:
            raise ValueError("the view reaches outside the buffer")
        self.ptr, self.nbytes = parent.ptr + offset, n

    def release(self):
        self._box = None

    def __del__(self):
        pass


def empty(shape, dtype="float32", kind=HOST, device=-1):
    """A new gpuipc Buffer holding ``shape`` x ``dtype`` (zero-filled for
    HOST): arrays made from it (``numpy()``, ``torch.from_dlpack``) are sent
    without a copy."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    _, item = _dtype_of(dtype)
    return Buffer(max(_nbytes(shape, item), 1), kind, device, shape, dtype)
