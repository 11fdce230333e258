"""What gpuipc's Python modules share: buffer kinds, DLPack codes, the
"domain's timeout" marker, timeouts in seconds as the library's
milliseconds, dtypes, streams, the tensor description the C layer takes
(_Desc) and _Boxed, the base of the classes that hold a C object. The
objects live by concern beside it: _buffer.py (Buffer), _tensor.py
(describe, Tensor), _channel.py, _domain.py (Domain, Segment), _event.py,
_device.py; gpuipc/__init__.py re-exports them."""
import sys

from . import _gpuipc as _c

# Kinds (gpuipc_kind_t), name -> value: the C library's list
# (GPUIPC_KIND_MAP), which the extension hands over as KINDS.
_KINDS = dict(_c.KINDS)
_KIND_NAMES = {v: k for k, v in _KINDS.items()}
AUTO, HOST, VMM, LEGACY, POOL = (_KINDS[k] for k in ("auto", "host", "vmm", "legacy", "pool"))

# DLPack device types and type codes.
DL_CPU, DL_CUDA, DL_CUDA_HOST = 1, 2, 3
_INT, _UINT, _FLOAT, _BFLOAT, _COMPLEX, _BOOL = 0, 1, 2, 4, 5, 6

DEFAULT = object()  # "the domain's timeout" (GPUIPC_TIMEOUT_DEFAULT)


def _kind(kind):
    if isinstance(kind, str):
        try:
            return _KINDS[kind.lower()]
        except KeyError:
            raise ValueError(f"unknown kind {kind!r}; one of {sorted(_KINDS)}") from None
    return int(kind)


def _ms(timeout, default=DEFAULT, forever=-1, default_ms=-2):
    """Seconds (None: forever, 0: do not wait) as the library's milliseconds."""
    if timeout is DEFAULT:
        return default_ms
    if timeout is None:
        return forever
    return _c.seconds_ms(timeout)  # rounded up; ValueError below 0


# ---- dtypes ----------------------------------------------------------------

_DL_KINDS = {"i": _INT, "u": _UINT, "f": _FLOAT, "c": _COMPLEX, "b": _BOOL}
_BF16 = ("<V2", 2, (_BFLOAT, 16, 1))


def _typestr_to_dl(typestr, what="dtype"):
    """numpy's typestr ('<f4') as a DLPack (code, bits, lanes): integers,
    unsigned, floats, complex and bool, little-endian (a bfloat16's
    typestr, '<V2', says nothing of it: _dl_of_dtype knows it)."""
    kind, size = typestr[1:2], typestr[2:]
    code = _DL_KINDS.get(kind)
    if code is None or not size.isdigit():
        raise ValueError(f"{what} {typestr!r} cannot be sent: not an integer, "
                         "float, complex or bool type")
    if typestr[0] == ">" and size != "1":
        raise ValueError(f"big-endian data ({typestr}) cannot be sent")
    return (code, int(size) * 8, 1)


def _is_bfloat16(dt):
    """Whether numpy dtype ``dt`` is a real bfloat16 (ml_dtypes'), not any
    2-byte void or structured type."""
    return dt.kind == "V" and dt.itemsize == 2 and dt.names is None and dt.name == "bfloat16"


def _dl_of_dtype(dt, what="dtype"):
    """A numpy dtype object as a DLPack (code, bits, lanes)."""
    if _is_bfloat16(dt):
        return _BF16[2]
    return _typestr_to_dl(dt.str, what)


def _dl_to_typestr(code, bits, lanes):
    if lanes != 1:
        return f"|V{bits * lanes // 8}"
    kind = {_INT: "i", _UINT: "u", _FLOAT: "f", _COMPLEX: "c", _BOOL: "b"}.get(code)
    if kind is None:
        return f"<V{bits // 8}"  # bfloat16, float8: raw bytes for numpy
    return f"{'|' if bits == 8 else '<'}{kind}{bits // 8}"


_DTYPES = {"float32": "<f4", "float64": "<f8", "float16": "<f2", "int8": "|i1",
           "uint8": "|u1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
           "bool": "|b1"}


def _dtype_of(dtype):
    """A dtype given as a numpy dtype, a torch dtype or a string, as
    (typestr, itemsize, DLPack (code, bits, lanes)); ValueError for one
    that gpuipc cannot send (objects, strings, dates, structured types,
    big-endian), TypeError for what is no dtype."""
    name = str(dtype).replace("torch.", "")
    if name == "bfloat16":
        return _BF16
    try:
        import numpy as np
    except ImportError:
        if name not in _DTYPES:
            raise ValueError(f"dtype: unknown dtype {dtype!r}") from None
        ts = _DTYPES[name]
        return ts, int(ts[2:]), _typestr_to_dl(ts)
    named = isinstance(dtype, str) or type(dtype).__module__ == "torch"
    try:
        dt = np.dtype(name if named else dtype)
    except TypeError:
        if named:
            raise ValueError(f"dtype: unknown dtype {dtype!r}") from None
        raise TypeError(f"dtype: {dtype!r} is not a dtype") from None
    return dt.str, dt.itemsize, _dl_of_dtype(dt, f"dtype {dtype!r}:")


def _dims(shape, what="shape"):
    """``shape`` (an int or a sequence of ints) as a tuple of ints >= 0."""
    import operator
    if not isinstance(shape, (list, tuple)):
        shape = (shape,)
    out = []
    for x in shape:
        if isinstance(x, bool):
            raise TypeError(f"{what}: {shape!r} holds a bool, not a size")
        try:
            n = operator.index(x)
        except TypeError:
            raise TypeError(f"{what}: {shape!r} holds {x!r}, not an int") from None
        if n < 0:
            raise ValueError(f"{what}: {tuple(shape)} has a negative size")
        out.append(n)
    return tuple(out)


def _count(n, what):
    """``n``, an int (not a bool, not a float), as an int."""
    import operator
    if isinstance(n, bool):
        raise TypeError(f"{what}: an int, not a bool")
    try:
        return operator.index(n)
    except TypeError:
        raise TypeError(f"{what}: an int, not {n!r}") from None


# ---- streams ---------------------------------------------------------------

_raw_stream = None  # PyTorch's "current stream of device d" as an integer


def _torch_stream(torch, device):
    """PyTorch's current stream on ``device`` (None: the current device) as
    an integer, without making a torch.cuda.Stream object (which costs
    microseconds a call)."""
    global _raw_stream
    f = _raw_stream
    if f is None:
        f = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if f is None:  # a PyTorch without it
            def f(dev):
                return torch.cuda.current_stream(dev).cuda_stream
        _raw_stream = f
    if device is None:
        device = torch.cuda.current_device()
    return f(device)


def _stream(s, cuda=True, device=None):
    """A stream as an integer (CUstream), from an int, a torch/CuPy stream
    (.cuda_stream / .ptr) or None (PyTorch's current stream on ``device``,
    default the current one, when torch is in use with CUDA, else the
    legacy default stream)."""
    if s is None:
        if not cuda:
            return None
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return _torch_stream(torch, device) or None
        return None
    if isinstance(s, int) and not isinstance(s, bool):
        return s
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(s, attr, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    raise TypeError(f"stream: not a stream: {s!r} (None, an int, or an object "
                    "with .cuda_stream or .ptr)")


# ---- tensors in: describe any array ----------------------------------------

class _Desc:
    """A tensor as the C layer takes it, and what keeps its memory alive.
    ``lo``, ``hi``: the bytes it spans, worked out when first asked for;
    ``readonly``: whether its producer said it must not be written."""
    __slots__ = ("t", "keep", "device_type", "device_id", "_span", "readonly")

    def __init__(self, ptr, dev_type, dev_id, dtype, shape, strides, keep, offset=0,
                 readonly=False):
        self._set((ptr, dev_type, dev_id, dtype, tuple(shape),
                   None if strides is None else tuple(strides), offset), keep)
        self.readonly = readonly

    @classmethod
    def _of(cls, t, keep):
        """A description of the C layer's tuple ``t`` (as __init__ makes)."""
        self = cls.__new__(cls)
        self._set(t, keep)
        return self

    def _set(self, t, keep):
        self.t, self.keep, self._span, self.readonly = t, keep, None, False
        self.device_type, self.device_id = t[1], t[2]

    def _bounds(self):
        ptr, _, _, dtype, shape, strides, offset = self.t
        ptr += offset
        item = max(1, dtype[1] * dtype[2] // 8)
        if 0 in shape:
            span = (ptr, ptr)
        elif strides is None:
            span = (ptr, ptr + _nbytes(shape, item))
        else:
            lo = hi = 0
            for n, st in zip(shape, strides):
                if st < 0:
                    lo += (n - 1) * st
                else:
                    hi += (n - 1) * st
            span = (ptr + lo * item, ptr + (hi + 1) * item)
        self._span = span
        return span

    @property
    def lo(self):
        return (self._span or self._bounds())[0]

    @property
    def hi(self):
        return (self._span or self._bounds())[1]

    @property
    def cuda(self):
        return self.device_type == DL_CUDA

    def stream(self, s):
        """Stream ``s`` as an integer for a GPU tensor (None for host, which
        takes none, but a stream it is given must still be one)."""
        if self.cuda:
            return _stream(s, device=self.device_id)
        if s is not None:
            _stream(s)
        return None


def _c_strides(shape):
    out, n = [], 1
    for x in reversed(shape):
        out.append(n)
        n *= x
    return tuple(reversed(out))


def _nbytes(shape, item):
    """The bytes of ``shape`` x elements of ``item`` bytes."""
    n = item
    for x in shape:
        n *= x
    return n


class _Boxed:
    """An object of the C layer's, held in ``_box`` (None once closed)."""

    _box = None
    _closed = "the object is closed"  # what using it after closing says

    def _h(self):
        if self._box is None:
            raise _closed_error(self._closed)
        return self._box

    def _take_box(self):
        """The box, which this object no longer holds (None if closed)."""
        box, self._box = self._box, None
        return box

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _closed_error(what):
    """gpuipc.Closed (a ValueError, as for a closed file) saying ``what``."""
    from ._errors import Closed
    return Closed(_c.E_CLOSED, "GPUIPC_E_CLOSED", what)


class _Held:
    """What an array made by ``numpy()`` lies on: the array interface of
    the memory, and ``keep``, which keeps it mapped while the array (or any
    view of it) lives."""
    __slots__ = ("__array_interface__", "keep")

    def __init__(self, interface, keep):
        self.__array_interface__ = interface
        self.keep = keep

    def array(self):
        import numpy as np
        return np.asarray(self)
