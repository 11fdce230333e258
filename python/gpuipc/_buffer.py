"""gpuipc's buffers: Buffer (memory gpuipc allocated or mapped), its
sub-views and empty(). The library finds the buffer an array lies in by
address (gpuipc_buf_find), so that Channel.send (_channel.py) sends it
without a copy. Their segments' class, Segment, is in _domain.py. The C
calls live in _gpuipc_buffer.c."""
from . import _gpuipc as _c
from ._common import (DL_CPU, DL_CUDA, HOST, _Boxed, _Desc, _Held, _KIND_NAMES, _count,
                      _dims, _dtype_of, _kind, _nbytes)

# ---- buffers ----------------------------------------------------------------

class Buffer(_Boxed):
    """Memory gpuipc allocated (``gpuipc_buf_alloc``) or mapped: arrays in it
    are sent without a copy. Exposes ``__dlpack__``, and
    ``__array_interface__`` (HOST) or ``__cuda_array_interface__`` (GPU), as
    ``dtype`` x ``shape`` (default: bytes).

    The memory stays mapped while anything made from it lives: an array of
    ``numpy()``, a DLPack consumer's tensor and a sub-view (``view()``) each
    hold a reference of their own, and an array made through the array
    interfaces (``np.asarray(buf)``) keeps this Buffer, which then keeps the
    memory until it goes. ``release()`` drops only the Buffer's own."""

    _closed = "the buffer was released"
    _pin = None  # the reference that arrays made through an interface need

    def __init__(self, nbytes, kind=HOST, device=-1, shape=None, dtype="uint8"):
        nbytes = _count(nbytes, "nbytes")
        if nbytes <= 0:
            raise ValueError(f"nbytes: a buffer needs a size > 0, not {nbytes}")
        typ = _dtype_of(dtype)  # checked before anything is allocated
        dims = None if shape is None else _dims(shape)
        box = _c.buf_alloc(nbytes, _kind(kind), _count(device, "device"))
        try:
            self._init(box, dims, dtype, typ)
        except BaseException:
            _c.close(box)
            raise

    @classmethod
    def _wrap(cls, box, shape=None, dtype="uint8"):
        self = cls.__new__(cls)
        self._init(box, None if shape is None else _dims(shape), dtype, _dtype_of(dtype))
        return self

    def _init(self, box, shape, dtype, typ):
        self._box = box
        self.ptr, self.nbytes, k, self.device = _c.buf_info(box)
        self.kind = _KIND_NAMES.get(k, "?")
        self.typestr, item, self._dl = typ
        self.shape = shape if shape is not None else (self.nbytes // item,)
        n = _nbytes(self.shape, item)
        if n > self.nbytes:
            raise ValueError(f"shape: {self.shape} of {dtype} needs {n} bytes; "
                             f"the buffer has {self.nbytes}")

    def _dl_device_type(self):
        return DL_CPU if self.kind == "host" else DL_CUDA

    def release(self):
        """Drop this Buffer's reference to the memory; what was made from
        it (arrays, DLPack tensors, sub-views) keeps the memory mapped
        until it goes."""
        box = self._take_box()
        if box is not None:
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
        dev = self.device if self.device >= 0 else 0
        return _Desc(self.ptr, self._dl_device_type(), dev, self._dl, self.shape, None, self)

    def __dlpack_device__(self):
        d = self._desc()
        return (d.device_type, d.device_id)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("gpuipc buffers are exported without copying")
        t = self._desc().t
        return _c.dlpack_of(self._keeper(), t)

    def _keeper(self):
        """What an array made from this buffer holds: a reference of its own
        to the memory, and this Buffer."""
        return (_c.buf_retain(self._h()), self)

    def _interface(self):
        self._h()
        return {"version": 3, "shape": self.shape, "typestr": self.typestr,
                "data": (self.ptr, False), "strides": None}

    def _pinned_interface(self):
        """The array interface, for an array whose base is this Buffer: the
        memory is then kept until the Buffer goes, release() or not."""
        d = self._interface()
        if self._pin is None:
            self._pin = _c.buf_retain(self._box)
        return d

    @property
    def __array_interface__(self):
        if self.kind != "host":
            raise AttributeError("__array_interface__: GPU memory (use __cuda_array_interface__)")
        return self._pinned_interface()

    @property
    def __cuda_array_interface__(self):
        if self.kind == "host":
            raise AttributeError("__cuda_array_interface__: host memory")
        d = self._pinned_interface()
        d["stream"] = None
        return d

    def numpy(self):
        """A numpy array over this memory (HOST; no copy), which keeps the
        memory mapped while it (or a view of it) lives."""
        if self.kind != "host":
            raise TypeError("numpy(): GPU memory (use torch/cupy.from_dlpack)")
        return _Held(self._interface(), self._keeper()).array()

    def view(self, dtype, shape, offset=0):
        """A Buffer-like view of ``shape`` x ``dtype`` starting ``offset``
        bytes in (sendable without a copy), which keeps the memory mapped
        while it lives (until its own release())."""
        return _SubView(self, dtype, shape, offset)

    def __repr__(self):
        return f"<gpuipc.{type(self).__name__} {self.kind} {self.nbytes} bytes at {self.ptr:#x}>"


class _SubView(Buffer):
    def __init__(self, parent, dtype, shape, offset):
        self.typestr, item, self._dl = _dtype_of(dtype)
        self.shape = _dims(shape)
        offset = _count(offset, "offset")
        n = _nbytes(self.shape, item)
        if offset < 0 or offset + n > parent.nbytes:
            raise ValueError("offset, shape: the view reaches outside the buffer")
        self._parent = parent
        self.kind, self.device = parent.kind, parent.device
        self.ptr, self.nbytes = parent.ptr + offset, n
        self._box = _c.buf_retain(parent._h())  # its own reference

    def release(self):
        box = self._take_box()
        if box is not None:
            _c.close(box)

    close = release


def empty(shape, dtype="float32", kind=HOST, device=-1):
    """A new gpuipc Buffer holding ``shape`` x ``dtype`` (zero-filled for
    HOST): arrays made from it (``numpy()``, ``torch.from_dlpack``) are sent
    without a copy. ``shape``: an int or a sequence of ints >= 0; ``dtype``:
    an integer, float, complex, bool or bfloat16 type (numpy, torch or a
    name); TypeError or ValueError otherwise."""
    shape = _dims(shape)
    _, item, _ = _dtype_of(dtype)
    return Buffer(max(_nbytes(shape, item), 1), kind, device, shape, dtype)
