"""gpuipc's exceptions: one class per GPUIPC_E_* code, and the errno
codes the library returns mapped onto Python's own OSError subclasses."""
import builtins
import errno as _errno

from . import _gpuipc as _c


class Error(Exception):
    """A gpuipc call failed. ``code`` is the library's negative code,
    ``name`` its symbolic name (``gpuipc_err_name``) and ``detail`` the
    sentence ``gpuipc_last_error()`` gave."""

    def __init__(self, code=0, name="", detail=""):
        super().__init__(f"{name}: {detail}" if name else detail)
        self.code = code
        self.name = name
        self.detail = detail

    def __reduce__(self):
        return (type(self), (self.code, self.name, self.detail))


# Library codes (GPUIPC_E_*).
class NoDriver(Error): """The CUDA driver is not available."""
class NoDevice(Error): """No usable CUDA device."""
class CudaError(Error): """A CUDA driver call failed."""
class BadHandle(Error, ValueError): """A malformed or foreign handle."""
class VersionError(Error): """An incompatible protocol version."""
class Unsupported(Error, NotImplementedError): """Not supported here."""
class PeerGone(Error, builtins.ConnectionError): """The peer process has gone."""
class Denied(Error, builtins.PermissionError): """Access denied."""
class WholeBlock(Error): """The export would reveal memory outside the range."""
class ProtocolError(Error): """The peer broke the protocol."""
class Mismatch(Error, ValueError): """The segment exists with other properties."""
class Lost(Error): """The segment was lost: no surviving process held it."""
class Closed(Error, ValueError):
    """The object is closed: used after close(), release() or leave(), handed
    over to a consumer, or (GPUIPC_E_CLOSED) a domain being left or joined
    by the parent of a fork() child. A ValueError, as for a closed file."""

# errno codes.
class TimeoutError(Error, builtins.TimeoutError): """-ETIMEDOUT: the wait ran out."""
class WouldBlock(Error, builtins.BlockingIOError): """-EAGAIN: not now (a timeout of 0, a full channel)."""
class InvalidArgument(Error, ValueError): """-EINVAL: the library refused an argument."""
class NotFound(Error, builtins.FileNotFoundError): """-ENOENT: no such segment or broker."""
class Exists(Error, builtins.FileExistsError): """-EEXIST: the name exists."""
class MessageTooLarge(Error, ValueError): """-EMSGSIZE: a message longer than its path carries (channels stage tensors of any size)."""
class AlreadyDone(Error): """-EALREADY: published already."""
class OutOfMemory(Error, MemoryError): """-ENOMEM."""
class OSError(Error, builtins.OSError): """Another -errno code."""

_BY_CODE = {
    _c.E_NODRIVER: NoDriver, _c.E_NODEVICE: NoDevice, _c.E_CUDA: CudaError,
    _c.E_BADHANDLE: BadHandle, _c.E_VERSION: VersionError,
    _c.E_UNSUPPORTED: Unsupported, _c.E_PEER_GONE: PeerGone,
    _c.E_DENIED: Denied, _c.E_WHOLEBLOCK: WholeBlock, _c.E_PROTO: ProtocolError,
    _c.E_MISMATCH: Mismatch, _c.E_LOST: Lost, _c.E_CLOSED: Closed,
    -_errno.ETIMEDOUT: TimeoutError, -_errno.EAGAIN: WouldBlock,
    -_errno.EINVAL: InvalidArgument, -_errno.ENOENT: NotFound,
    -_errno.EEXIST: Exists, -_errno.EMSGSIZE: MessageTooLarge,
    -_errno.EALREADY: AlreadyDone, -_errno.ENOMEM: OutOfMemory,
    -_errno.EPERM: Denied, -_errno.EACCES: Denied,
}


def error_for(code, name, detail):
    """The exception for library code ``code``."""
    cls = _BY_CODE.get(code)
    if cls is None:
        cls = OSError if -4096 < code < 0 else Error
    exc = cls(code, name, detail)
    if issubclass(cls, builtins.OSError) and code > -4096:
        exc.errno = -code
    return exc


_c.set_error_factory(error_for)
