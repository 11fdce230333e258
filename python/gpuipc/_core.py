"""gpuipc's objects: Domain, Buffer, Segment, Channel, Tensor (a received
view), Event; devices and topology. The C calls live in _gpuipc."""
import bisect
import math
import sys
import threading

from . import _gpuipc as _c
from ._errors import Error

# Kinds (gpuipc_kind_t).
AUTO, HOST, VMM, LEGACY, POOL = 0, 1, 2, 3, 4
_KINDS = {"auto": AUTO, "host": HOST, "vmm": VMM, "legacy": LEGACY, "pool": POOL}
_KIND_NAMES = {v: k for k, v in _KINDS.items()}

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
    if timeout < 0:
        raise ValueError("a timeout is None (forever) or >= 0 seconds")
    if timeout == 0:
        return 0
    return max(1, min(int(math.ceil(timeout * 1000)), 2**31 - 1))


# ---- dtypes ----------------------------------------------------------------

def _typestr_to_dl(typestr):
    """numpy's typestr ('<f4') as a DLPack (code, bits, lanes)."""
    if typestr[0] == ">" and typestr[2:] not in ("1",):
        raise ValueError(f"big-endian data ({typestr}) cannot be sent")
    kind, size = typestr[1], int(typestr[2:])
    code = {"i": _INT, "u": _UINT, "f": _FLOAT, "c": _COMPLEX, "b": _BOOL}.get(kind)
    if code is None:
        if kind == "V" and size == 2:
            return (_BFLOAT, 16, 1)
        raise ValueError(f"dtype {typestr} has no DLPack equivalent")
    return (code, size * 8, 1)


def _dl_to_typestr(code, bits, lanes):
    if lanes != 1:
        return f"|V{bits * lanes // 8}"
    kind = {_INT: "i", _UINT: "u", _FLOAT: "f", _COMPLEX: "c", _BOOL: "b"}.get(code)
    if kind is None:
        return f"<V{bits // 8}"  # bfloat16, float8: raw bytes for numpy
    return f"{'|' if bits == 8 else '<'}{kind}{bits // 8}"


def _dtype_of(dtype):
    """A dtype given as a numpy dtype, a torch dtype or a string, as
    (typestr, itemsize)."""
    name = str(dtype).replace("torch.", "")
    if name in ("bfloat16",):
        return "<V2", 2
    try:
        import numpy as np
        dt = np.dtype(name)
        return dt.str, dt.itemsize
    except (ImportError, TypeError):
        pass
    table = {"float32": "<f4", "float64": "<f8", "float16": "<f2", "int8": "|i1",
             "uint8": "|u1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
             "bool": "|b1"}
    if name not in table:
        raise ValueError(f"unknown dtype {dtype!r}")
    ts = table[name]
    return ts, int(ts[2:])


# ---- streams ---------------------------------------------------------------

def _stream(s, cuda=True):
    """A stream as an integer (CUstream), from an int, a torch/CuPy stream
    (.cuda_stream / .ptr) or None (PyTorch's current stream when torch is in
    use with CUDA, else the legacy default stream)."""
    if s is None:
        if not cuda:
            return None
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda.current_stream().cuda_stream or None
        return None
    if isinstance(s, int):
        return s
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(s, attr, None)
        if isinstance(v, int):
            return v
    raise TypeError(f"not a stream: {s!r} (an int, or an object with .cuda_stream or .ptr)")


# ---- tensors in: describe any array ----------------------------------------

class _Desc:
    """A tensor as the C layer takes it, and what keeps its memory alive."""
    __slots__ = ("t", "keep", "device_type", "device_id", "lo", "hi")

    def __init__(self, ptr, dev_type, dev_id, dtype, shape, strides, keep):
        self.t = (ptr, dev_type, dev_id, dtype, tuple(shape),
                  None if strides is None else tuple(strides), 0)
        self.keep = keep
        self.device_type, self.device_id = dev_type, dev_id
        item = max(1, dtype[1] * dtype[2] // 8)
        if any(n == 0 for n in shape):
            self.lo = self.hi = ptr
            return
        if strides is None:
            n = 1
            for x in shape:
                n *= x
            self.lo, self.hi = ptr, ptr + n * item
        else:
            lo = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
            hi = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
            self.lo, self.hi = ptr + lo * item, ptr + (hi + 1) * item

    @property
    def cuda(self):
        return self.device_type == DL_CUDA


def _elem_strides(strides, item, what):
    if strides is None:
        return None
    out = []
    for s in strides:
        if s % item:
            raise ValueError(f"{what}: a stride of {s} bytes is not a whole number of elements")
        out.append(s // item)
    return out


def _from_array_interface(obj, ai, dev_type):
    if ai.get("mask") is not None:
        raise ValueError("masked arrays cannot be sent")
    dtype = _typestr_to_dl(ai["typestr"])
    item = dtype[1] // 8
    ptr = ai["data"][0] if ai.get("data") else 0
    strides = _elem_strides(ai.get("strides"), item, "array")
    dev_id = 0
    if dev_type == DL_CUDA:
        dev_id = _cuda_device_of(ptr)
    return _Desc(ptr, dev_type, dev_id, dtype, ai["shape"], strides, obj)


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


def describe(obj, stream=None):
    """Describe ``obj`` (DLPack, CUDA array interface, numpy array interface
    or the buffer protocol) without copying it."""
    if isinstance(obj, (Buffer, Tensor)):
        return obj._desc()
    ai = getattr(obj, "__array_interface__", None)
    if isinstance(ai, dict):
        return _from_array_interface(obj, ai, DL_CPU)
    if hasattr(obj, "__dlpack__"):
        dev = tuple(obj.__dlpack_device__()) if hasattr(obj, "__dlpack_device__") else (DL_CPU, 0)
        if dev[0] == DL_CUDA:
            cap = obj.__dlpack__(stream=_stream(stream) or 1)
        else:
            cap = obj.__dlpack__()
        t, hold = _c.dlpack_take(cap)
        d = _Desc(t[0], t[1], t[2], t[3], t[4], t[5], (obj, hold))
        if t[6]:
            d.t = d.t[:6] + (t[6],)
            d.lo += t[6]
            d.hi += t[6]
        return d
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
    return _from_array_interface((obj, arr), arr.__array_interface__, DL_CPU)


# ---- the registry of gpuipc memory (zero-copy sends) -----------------------

class _Registry:
    """Address ranges of the buffers this process holds, so that an array
    lying in one is sent as that buffer (no copy)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._starts = []  # sorted (device_type, start)
        self._entries = {}  # (device_type, start) -> (end, weakref)

    def add(self, buf):
        import weakref
        key = (buf._dl_device_type(), buf.ptr)
        with self._lock:
            if key not in self._entries:
                bisect.insort(self._starts, key)
            self._entries[key] = (buf.ptr + buf.nbytes, weakref.ref(buf))

    def remove(self, buf):
        key = (buf._dl_device_type(), buf.ptr)
        with self._lock:
            e = self._entries.get(key)
            if e is not None and e[1]() in (buf, None):
                del self._entries[key]
                self._starts.remove(key)

    def find(self, dev_type, lo, hi):
        with self._lock:
            i = bisect.bisect_right(self._starts, (dev_type, lo)) - 1
            if i < 0 or self._starts[i][0] != dev_type:
                return None
            end, ref = self._entries[self._starts[i]]
        buf = ref()
        if buf is None or hi > end or buf._box is None:
            return None
        return buf


_registry = _Registry()


# ---- devices, topology, library -------------------------------------------

def version():
    """The library's version, "MAJOR.MINOR.PATCH"."""
    return _c.version()


def driver_status():
    """(code, driver_version, reason): code 0 when a CUDA driver and device
    are usable, else the reason's code; never raises."""
    return _c.driver_status()


def device_count():
    return _c.device_count()


def devices():
    """A dict per visible CUDA device (name, uuid, memory, capabilities)."""
    return [_c.device_info(i) for i in range(_c.device_count())]


def device_by_uuid(uuid):
    """The local ordinal of the GPU with this 16-byte UUID."""
    return _c.device_by_uuid(bytes(uuid))


def kind_available(kind):
    """(True, "") when buffers of ``kind`` can be made here, else (False, why)."""
    rc, why = _c.kind_available(_kind(kind))
    return rc == 0, why


def topology():
    """{(src, dst): p2p dict} for every pair of visible GPUs."""
    n = _c.device_count()
    return {(a, b): _c.topo_p2p(a, b) for a in range(n) for b in range(n)}


def config():
    """The GPUIPC_* settings in force."""
    return _c.config()


# ---- domains ----------------------------------------------------------------

class Domain:
    """A named rendezvous of processes (``gpuipc_domain_join``); a context
    manager that leaves the domain on exit."""

    def __init__(self, name, timeout=DEFAULT, host_broker=True):
        self.name = name
        flags = 0 if host_broker else _c.JOIN_NO_BROKER
        self._box = _c.domain_join(name, _ms(timeout, default_ms=0), flags)

    def _h(self):
        if self._box is None:
            raise ValueError("the domain was left")
        return self._box

    def leave(self):
        box, self._box = self._box, None
        if box is not None:
            _c.close(box)

    close = leave

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.leave()

    def info(self):
        return _c.domain_info(self._h())

    # segments
    def create_segment(self, name, nbytes, kind=HOST, device=-1, exclusive=False,
                       scratch=False, timeout=DEFAULT, stream=None):
        """Allocate segment ``name`` (or open it if it exists, unless
        ``exclusive``): fill it, then ``publish()``. With ``scratch`` it is
        published at once."""
        flags = _c.CREATE | (_c.EXCL if exclusive else 0) | (_c.SCRATCH if scratch else 0)
        return self._open(name, nbytes, kind, device, flags, timeout, stream)

    def open_segment(self, name, wait=False, timeout=DEFAULT, nbytes=0, kind=AUTO,
                     device=-1, stream=None):
        """Open published segment ``name``; ``wait`` waits for its publication."""
        flags = _c.WAIT if wait else 0
        return self._open(name, nbytes, kind, device, flags, timeout, stream)

    def _open(self, name, nbytes, kind, device, flags, timeout, stream):
        box = _c.segment_open(self._h(), name, int(nbytes), _kind(kind), int(device),
                              flags, _ms(timeout), _stream(stream, device >= 0))
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


# ---- buffers and segments ---------------------------------------------------

class Buffer:
    """Memory gpuipc allocated (``gpuipc_buf_alloc``) or mapped: arrays in it
    are sent without a copy. Exposes ``__dlpack__``, and
    ``__array_interface__`` (HOST) or ``__cuda_array_interface__`` (GPU), as
    ``dtype`` x ``shape`` (default: bytes)."""

    _box = None

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
        n = item
        for x in self.shape:
            n *= x
        if n > self.nbytes:
            raise ValueError(f"shape {self.shape} of {dtype} needs {n} bytes; the buffer has {self.nbytes}")
        _registry.add(self)

    def __del__(self):
        if self._box is not None:
            _registry.remove(self)

    def _dl_device_type(self):
        return DL_CPU if self.kind == "host" else DL_CUDA

    def _h(self):
        if self._box is None:
            raise ValueError("the buffer was released")
        return self._box

    def release(self):
        """Drop this process's reference (views made from it must be gone)."""
        box, self._box = self._box, None
        if box is not None:
            _registry.remove(self)
            _c.close(box)

    close = release

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

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
        n = item
        for x in self.shape:
            n *= x
        if offset < 0 or offset + n > parent.nbytes:
            raise ValueError("the view reaches outside the buffer")
        self.ptr, self.nbytes = parent.ptr + offset, n

    def release(self):
        self._box = None

    def __del__(self):
        pass


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


def empty(shape, dtype="float32", kind=HOST, device=-1):
    """A new gpuipc Buffer holding ``shape`` x ``dtype`` (zero-filled for
    HOST): arrays made from it (``numpy()``, ``torch.from_dlpack``) are sent
    without a copy."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    _, item = _dtype_of(dtype)
    n = item
    for x in shape:
        n *= x
    return Buffer(max(n, 1), kind, device, shape, dtype)


# ---- received tensors --------------------------------------------------------

class Tensor:
    """A tensor received with ``Channel.recv``: a view of the sender's
    memory. Give it back with ``release()``, a ``with`` block, or by handing
    it to a consumer (``torch.from_dlpack``, ``np.from_dlpack``,
    ``cupy.from_dlpack``), whose deleter gives it back when the consumer's
    array goes."""

    def __init__(self, box, stream):
        self._box = box
        self._stream = stream
        (t, self.buffer_ptr, self.buffer_size, k, self.buffer_device) = _c.view_info(box)
        (data, self.device_type, self.device_id, self._dl_dtype, self.shape,
         strides, self.byte_offset) = t
        self.data_ptr = data + self.byte_offset
        self.kind = _KIND_NAMES.get(k, "?")
        self.strides = strides if strides is not None else _c_strides(self.shape)
        self.typestr = _dl_to_typestr(*self._dl_dtype)

    @property
    def device(self):
        return "cpu" if self.device_type != DL_CUDA else f"cuda:{self.device_id}"

    @property
    def nbytes(self):
        n = self._dl_dtype[1] * self._dl_dtype[2] // 8
        for x in self.shape:
            n *= x
        return n

    def _h(self):
        if self._box is None:
            raise ValueError("the tensor was released or handed to a consumer")
        return self._box

    def release(self, stream=None):
        """Give the view back to the sender (for GPU views, after the work
        queued on ``stream`` so far; default: the stream it was received on)."""
        box, self._box = self._box, None
        if box is not None:
            s = self._stream if stream is None else _stream(stream)
            _c.close(box, s if self.device_type == DL_CUDA else None)

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def _desc(self):
        self._h()
        return _Desc(self.data_ptr, self.device_type, self.device_id, self._dl_dtype,
                     self.shape, self.strides, self)

    def __dlpack_device__(self):
        return (self.device_type, self.device_id)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """Hand the view to a consumer that uses it on ``stream`` (DLPack's
        convention: None or 1 the legacy default stream, 2 per-thread, -1 no
        synchronisation, else a CUstream): the release is ordered after the
        work the consumer queues there before letting go."""
        if copy:
            raise BufferError("gpuipc views are exported without copying")
        s = None
        if self.device_type == DL_CUDA:
            if stream == -1:
                s = self._stream
            elif stream is not None:
                s = _stream(stream)
            if s is None:
                s = 1
        cap = _c.view_to_dlpack(self._h(), s)
        self._box = None
        return cap

    def _interface(self):
        item = self._dl_dtype[1] * self._dl_dtype[2] // 8
        return {"version": 3, "shape": tuple(self.shape), "typestr": self.typestr,
                "data": (self.data_ptr, False),
                "strides": tuple(s * item for s in self.strides)}

    @property
    def __array_interface__(self):
        self._h()
        if self.device_type == DL_CUDA:
            raise AttributeError("__array_interface__: a GPU tensor")
        return self._interface()

    @property
    def __cuda_array_interface__(self):
        self._h()
        if self.device_type != DL_CUDA:
            raise AttributeError("__cuda_array_interface__: a host tensor")
        d = self._interface()
        d["stream"] = self._stream if self._stream not in (None, 0) else 1
        return d

    def numpy(self):
        """A numpy array over the view (HOST, no copy); the view is given back
        when the array goes."""
        import numpy as np
        return np.from_dlpack(self)

    def __repr__(self):
        state = "" if self._box is not None else " released"
        return f"<gpuipc.Tensor {self.typestr} {tuple(self.shape)} {self.device}{state}>"


def _c_strides(shape):
    out, n = [], 1
    for x in reversed(shape):
        out.append(n)
        n *= x
    return tuple(reversed(out))


# ---- channels ----------------------------------------------------------------

class Channel:
    """A two-way, ordered pipe for tensors between two processes of a domain
    (``gpuipc_channel_open``). A context manager that closes it."""

    def __init__(self, domain, name, timeout=DEFAULT, depth=0, device=None,
                 send_timeout=DEFAULT, stage_slots=0, stage_slot_bytes=0):
        self.name = name
        # Seconds, None (forever), 0 (no wait) or DEFAULT (the domain's),
        # for the other end to come and for room to send.
        open_ms = _ms(timeout)
        send_ms = _ms(send_timeout)
        self._box = _c.channel_open(domain._h(), name, open_ms, int(depth),
                                    -1 if device is None else int(device),
                                    0 if device is None else 1, send_ms,
                                    int(stage_slots), int(stage_slot_bytes))
        self._keep = {}  # ticket -> what a staged GPU copy still reads
        self._lock = threading.Lock()

    def _h(self):
        if self._box is None:
            raise ValueError("the channel is closed")
        return self._box

    def close(self):
        box, self._box = self._box, None
        if box is not None:
            _c.close(box)
        self._keep.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, obj, stream=None, block=True):
        """Send a tensor (torch, CuPy, JAX, numpy, a gpuipc Buffer, anything
        with DLPack, the CUDA array interface or the buffer protocol).
        Memory of a gpuipc buffer travels without a copy; other memory is
        staged through the channel's own buffer. ``block=False`` raises
        WouldBlock instead of waiting for room. Returns the ticket."""
        d = describe(obj, stream)
        s = _stream(stream) if d.cuda else None
        buf = _registry.find(d.device_type, d.lo, d.hi)
        box = buf._box if buf is not None else None
        if box is None and d.cuda:
            box = _c.alloc_lookup(d.lo)
        flags = 0 if block else _c.SEND_NONBLOCK
        ticket = _c.channel_send(self._h(), box, d.t, s, flags)
        if d.cuda:
            self._hold(ticket, (d.keep, box))
        return ticket

    def _hold(self, ticket, what):
        with self._lock:
            self._keep[ticket] = what
            if len(self._keep) > 8:
                for t in list(self._keep):
                    try:
                        if not _c.channel_send_done(self._box, t, 0):
                            continue
                    except Error:
                        pass
                    self._keep.pop(t, None)

    def done(self, ticket, timeout=0):
        """Whether message ``ticket``'s buffer is free again (released, and
        the receiver's work on it complete); waits up to ``timeout`` s."""
        ms = _ms(timeout)
        try:
            r = _c.channel_send_done(self._h(), ticket, ms)
        except Error:
            raise
        if r:
            self._keep.pop(ticket, None)
        return r

    def wait(self, ticket, stream=None, timeout=None):
        """Wait (host) for the release of ``ticket``, then make ``stream``
        wait for the receiver's work on it (no host wait for that)."""
        _c.channel_send_wait(self._h(), ticket, _stream(stream), _ms(timeout))

    def progress(self):
        return _c.channel_progress(self._h())

    def recv(self, timeout=None, stream=None):
        """The next tensor, as a zero-copy view (``Tensor``). ``timeout`` in
        seconds (None: forever, 0: do not wait); ``stream``: the stream that
        will use a GPU view (made to wait for the sender's work)."""
        s = _stream(stream)
        box = _c.channel_recv(self._h(), s, _ms(timeout))
        return Tensor(box, s)

    def recv_into(self, dst, timeout=None, stream=None):
        """Receive the next tensor by copying it into ``dst`` (same dtype and
        shape, contiguous), on ``stream``; the sender's buffer is given back
        when the copy is done."""
        d = describe(dst, stream)
        s = _stream(stream) if d.cuda else None
        _c.channel_recv_into(self._h(), d.t, s, _ms(timeout))
        return dst

    async def arecv(self, timeout=None, stream=None):
        """``recv`` for asyncio: waits in a worker thread (the C API offers no
        pollable descriptor yet)."""
        import asyncio
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: self.recv(timeout, stream))

    def info(self):
        return _c.channel_info(self._h())


# ---- events -------------------------------------------------------------------

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
