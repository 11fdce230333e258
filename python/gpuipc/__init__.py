"""gpuipc: share GPU (and host) memory and send tensors between processes
on one machine. See README.md's Python section."""
from . import _gpuipc
from ._errors import (Error, NoDriver, NoDevice, CudaError, BadHandle, VersionError,
                      Unsupported, PeerGone, Denied, WholeBlock, ProtocolError,
                      Mismatch, Lost, Closed, TimeoutError, WouldBlock,
                      InvalidArgument, NotFound, Exists, MessageTooLarge,
                      AlreadyDone, OutOfMemory, OSError)
from ._common import AUTO, HOST, VMM, LEGACY, POOL, DEFAULT
from ._buffer import Buffer, empty
from ._tensor import Tensor, describe
from ._channel import Channel
from ._domain import Domain, Segment
from ._event import Event
from ._device import (version, driver_status, device_count, devices, device_by_uuid,
                      kind_available, topology, config)

__version__ = _gpuipc.version()
# The most blocks one block batch holds (Channel.send_blocks).
CHANNEL_BLOCKS_MAX = _gpuipc.CHANNEL_BLOCKS_MAX


def err_name(code):
    """The symbolic name of a status code ("GPUIPC_E_DENIED", "EINVAL")."""
    return _gpuipc.err_name(code)


def strerror(code):
    return _gpuipc.strerror(code)


def last_error():
    """The sentence of the last failure on this thread."""
    return _gpuipc.last_error()


def library_path():
    """The path of the extension module, which exports gpuipc_torch_malloc
    and gpuipc_torch_free for torch.cuda.memory.CUDAPluggableAllocator."""
    return _gpuipc.__file__


def libgpuipc_path():
    """The path of the shared library libgpuipc that this package calls
    (gpuipc/libgpuipc.so.1 inside a pip-installed package). C code of the
    same process that loads this very file (ctypes, a C extension linked to
    it) shares the package's buffers (gpuipc_buf_find finds them both
    ways), import cache and driver: one copy of gpuipc's state."""
    return _gpuipc.libgpuipc_path()
