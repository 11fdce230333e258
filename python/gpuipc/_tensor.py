"""gpuipc's tensors: describe() turns anything array-like (DLPack, the
(CUDA) array interface, the buffer protocol, a gpuipc Buffer) into the
description the C layer sends (_common._Desc), and Tensor is a view that
Channel.recv (_channel.py) received, handed on through DLPack or the array
interfaces. The C calls live in _gpuipc_tensor.c."""
import sys

from . import _gpuipc as _c
from ._buffer import Buffer
from ._common import (DL_CPU, DL_CUDA, _BF16, _Boxed, _Desc, _Held, _KIND_NAMES,
                      _c_strides, _closed_error, _dl_to_typestr, _nbytes, _stream,
                      _typestr_to_dl)
from ._errors import Error


def _elem_strides(strides, item, what):
    if strides is None:
        return None
    out = []
    for s in strides:
        if s % item:
            raise ValueError(f"{what}: a stride of {s} bytes is not a whole number of elements")
        out.append(s // item)
    return out


def _dl_of_interface(obj, typestr):
    """The DLPack dtype of an array interface's ``typestr``; a 2-byte void
    is a bfloat16 only when the array's dtype says so (ml_dtypes')."""
    if typestr[1:] == "V2":
        dt = getattr(obj, "dtype", None)
        if getattr(dt, "name", None) == "bfloat16" and getattr(dt, "names", ()) is None:
            return _BF16[2]
    return _typestr_to_dl(typestr, "dtype")


def _from_array_interface(obj, ai, dev_type, dtype_of=None):
    if ai.get("mask") is not None:
        raise ValueError("masked arrays cannot be sent")
    dtype = _dl_of_interface(obj if dtype_of is None else dtype_of, ai["typestr"])
    item = dtype[1] // 8
    data = ai.get("data")
    ptr = data[0] if data else 0
    readonly = bool(data[1]) if data else False
    strides = _elem_strides(ai.get("strides"), item, "array")
    dev_id = 0
    if dev_type == DL_CUDA:
        dev_id = _cuda_device_of(ptr)
    return _Desc(ptr, dev_type, dev_id, dtype, ai["shape"], strides, obj, readonly=readonly)


def _cuda_device_of(ptr):
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.current_device()
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        return cupy.cuda.runtime.getDevice()
    try:
        return _c.device_current()
    except Error:
        return 0


def _from_torch(t):
    """A plain strided torch tensor described from its attributes, read in
    C (_gpuipc_torch.c): what __dlpack__ would say, without its cost (a
    capsule, and a torch.cuda.Stream object when a stream is named). None:
    take the DLPack path (other layouts, conjugate or negative views, other
    dtypes)."""
    t_ = _c.torch_desc(t)
    return None if t_ is None else _Desc._of(t_, t)


def describe(obj, stream=None):
    """Describe ``obj`` (DLPack, CUDA array interface, numpy array interface
    or the buffer protocol) without copying it. A CUDA tensor's data must be
    ready on ``stream`` (default: PyTorch's current stream of its device),
    the stream its send or copy is ordered on."""
    if isinstance(obj, (Buffer, Tensor)):
        return obj._desc()
    d = _from_torch(obj)  # None, at once, for anything but a torch tensor
    if d is not None:
        return d
    ai = getattr(obj, "__array_interface__", None)
    if isinstance(ai, dict):
        return _from_array_interface(obj, ai, DL_CPU)
    if hasattr(obj, "__dlpack__"):
        dev = tuple(obj.__dlpack_device__()) if hasattr(obj, "__dlpack_device__") else (DL_CPU, 0)
        if dev[0] == DL_CUDA:
            cap = obj.__dlpack__(stream=_stream(stream, device=dev[1]) or 1)
        else:
            cap = obj.__dlpack__()
        t, hold = _c.dlpack_take(cap)
        return _Desc(t[0], t[1], t[2], t[3], t[4], t[5], (obj, hold), t[6])
    cai = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(cai, dict):
        return _from_array_interface(obj, cai, DL_CUDA)
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError(f"{type(obj).__name__} speaks neither DLPack, the CUDA array "
                        "interface, the array interface nor the buffer protocol") from None
    import numpy as np
    arr = np.asarray(mv)
    return _from_array_interface((obj, arr), arr.__array_interface__, DL_CPU, arr)


# ---- received tensors --------------------------------------------------------

class Tensor(_Boxed):
    """A tensor received with ``Channel.recv``: a view of the sender's
    memory. Give it back with ``release()``, a ``with`` block, or by handing
    it to a consumer (``numpy()``, ``torch.from_dlpack``, ``np.from_dlpack``,
    ``cupy.from_dlpack``), whose array gives it back when it goes (a
    consumer that refuses it, e.g. for its dtype, leaves it here, usable).
    One dropped unreleased is given back when it goes (its box releases it
    after the work queued on the stream it was received on). An array made
    through the array interfaces (``np.asarray(view)``) keeps this Tensor:
    the view is then given back when the Tensor goes, release() or not."""

    _closed = "the tensor was released or handed to a consumer"
    _pin = None     # the box, kept for arrays made through an interface
    _lent = False   # a DLPack capsule may have taken the view from the box

    def __init__(self, box, stream, info):
        self._box = box
        self._stream = stream
        # ((data, device type, device id, dtype, shape, strides, byte
        # offset), buffer pointer, buffer size, kind, buffer device): read
        # once by the receive, so the attributes below outlive the view's
        # release; each is worked out when asked for (a receive that only
        # passes the view on, or gives it back, pays for none of them).
        self._info = info

    device_type = property(lambda self: self._info[0][1])
    device_id = property(lambda self: self._info[0][2])
    _dl_dtype = property(lambda self: self._info[0][3])
    shape = property(lambda self: self._info[0][4])
    byte_offset = property(lambda self: self._info[0][6])
    data_ptr = property(lambda self: self._info[0][0] + self._info[0][6])
    buffer_ptr = property(lambda self: self._info[1])
    buffer_size = property(lambda self: self._info[2])
    buffer_device = property(lambda self: self._info[4])
    kind = property(lambda self: _KIND_NAMES.get(self._info[3], "?"))
    typestr = property(lambda self: _dl_to_typestr(*self._info[0][3]))

    @property
    def strides(self):
        st = self._info[0][5]
        return st if st is not None else _c_strides(self._info[0][4])

    @property
    def device(self):
        return "cpu" if self.device_type != DL_CUDA else f"cuda:{self.device_id}"

    @property
    def nbytes(self):
        return _nbytes(self.shape, self._dl_dtype[1] * self._dl_dtype[2] // 8)

    def _h(self, keep=False):
        """The box; gpuipc.Closed once released or taken by a consumer.
        ``keep``: arrays will read the view here, so a DLPack capsule that
        no consumer took yet is revoked."""
        box = self._box
        if box is None or ((self._lent or keep) and not _c.box_held(box, keep)):
            self._box = None
            raise _closed_error(self._closed)
        return box

    def _held(self):
        try:
            self._h()
            return True
        except ValueError:
            return False

    def release(self, stream=None):
        """Give the view back to the sender (for GPU views, after the work
        queued on ``stream`` so far; default: the stream it was received on).
        Handed to a consumer already, it is the consumer's to give back."""
        box, self._box = self._box, None
        if box is None:
            return
        s = self._stream if stream is None else _stream(stream)
        if self._pin is not None:  # arrays may still read it: when this goes
            _c.box_stream(box, s)
            return
        # (a host view's release takes no stream: the C layer ignores it)
        _c.close(box, s)

    def __exit__(self, *exc):
        self.release()

    def _desc(self):
        self._h()
        t = self._info[0]
        return _Desc(t[0] + t[6], t[1], t[2], t[3], t[4], t[5], self)

    def __dlpack_device__(self):
        return (self.device_type, self.device_id)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """Hand the view to a consumer that uses it on ``stream`` (DLPack's
        convention: None or 1 the legacy default stream, 2 per-thread, -1 no
        synchronisation, else a CUstream): the release is ordered after the
        work the consumer queues there before letting go. Until a consumer
        takes the capsule the view stays this Tensor's: one that refuses
        it leaves the Tensor usable."""
        if copy:
            raise BufferError("gpuipc views are exported without copying")
        box = self._h()
        if self._pin is not None:
            return self._pinned_dlpack()
        s = None
        if self.device_type == DL_CUDA:
            if stream == -1:
                s = self._stream
            elif stream is not None:
                s = _stream(stream)
            if s is None:
                s = 1
        cap = _c.view_to_dlpack(box, s)
        self._lent = True
        return cap

    def _pinned_dlpack(self):
        """A capsule that keeps this Tensor (arrays made through its array
        interface read the view too): the view goes when all have gone."""
        if self.device_type == DL_CUDA:
            raise BufferError("a GPU view whose __cuda_array_interface__ was read "
                              "cannot be handed over by DLPack as well")
        t = self._info[0]
        return _c.dlpack_of(self, (t[0] + t[6], t[1], t[2], t[3], t[4], t[5], 0))

    def _interface(self):
        item = self._dl_dtype[1] * self._dl_dtype[2] // 8
        return {"version": 3, "shape": tuple(self.shape), "typestr": self.typestr,
                "data": (self.data_ptr, False),
                "strides": tuple(s * item for s in self.strides)}

    @property
    def __array_interface__(self):
        if self.device_type == DL_CUDA:
            raise AttributeError("__array_interface__: a GPU tensor")
        self._pin = self._h(keep=True)
        return self._interface()

    @property
    def __cuda_array_interface__(self):
        if self.device_type != DL_CUDA:
            raise AttributeError("__cuda_array_interface__: a host tensor")
        self._pin = self._h(keep=True)
        d = self._interface()
        d["stream"] = self._stream if self._stream not in (None, 0) else 1
        return d

    def numpy(self):
        """A numpy array over the view (HOST, no copy; any dtype, bool
        included); the view is given back when the array goes."""
        if self.device_type == DL_CUDA:
            raise TypeError("numpy(): a GPU tensor (use torch/cupy.from_dlpack)")
        box = self._h(keep=True)
        if self._pin is not None:  # this Tensor keeps the view already
            return _Held(self._interface(), self).array()
        a = _Held(self._interface(), box).array()
        self._box = None  # the array's now
        return a

    def __repr__(self):
        state = "" if self._held() else " released"
        return f"<gpuipc.Tensor {self.typestr} {tuple(self.shape)} {self.device}{state}>"
