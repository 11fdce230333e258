"""PyTorch integration: tensors born shareable (a pluggable allocator backed
by gpuipc VMM memory) and imports of PyTorch's and CuPy's own CUDA IPC
handles. Needs a GPU."""
import os

from . import _gpuipc as _c
from ._buffer import Buffer
from ._common import _kind

_allocator = None
_pool_allocators = {}  # functions' prefix -> CUDAPluggableAllocator


def _pluggable(prefix="gpuipc_torch"):
    import torch
    return torch.cuda.memory.CUDAPluggableAllocator(
        _c.__file__, prefix + "_malloc", prefix + "_free")


def mem_pool(kind="vmm", chunk_bytes=2 << 30):
    """A ``torch.cuda.MemPool`` of gpuipc memory: tensors made under
    ``with torch.cuda.use_mem_pool(pool):`` are born shareable (sent with no
    copy, lent in place by ``state_dict.Publisher(lend=True)``), while the
    rest of the program keeps PyTorch's own allocator.

    The pool cuts PyTorch's blocks from a few large gpuipc buffers (chunks:
    64 MiB, doubling up to ``chunk_bytes``; a larger block gets one of its
    own), so a model's hundreds of tensors are lent with a handful of
    exports and imports. A tensor of the pool that is sent or lent shares
    its whole chunk: keep in the pool only what is shared together (the
    weights). ``chunk_bytes=0``: a buffer per block, sharing nothing else,
    one export each. ``kind`` and ``chunk_bytes`` apply to the memory the
    pools take from now on."""
    import torch
    _c.alloc_set_kind(_kind(kind))
    prefix = "gpuipc_torch" if not chunk_bytes else "gpuipc_torch_pool"
    if chunk_bytes:
        _c.pool_set_chunk(int(chunk_bytes))
    if prefix not in _pool_allocators:
        _pool_allocators[prefix] = _pluggable(prefix)
    return torch.cuda.MemPool(_pool_allocators[prefix].allocator())


def use_allocator(kind="vmm"):
    """Make gpuipc's allocator PyTorch's CUDA allocator (call before any CUDA
    tensor exists): every block PyTorch's caching allocator takes is a
    gpuipc buffer, so ordinary CUDA tensors are sent with no copy."""
    global _allocator
    import torch
    if _allocator is None:
        _c.alloc_set_kind(_kind(kind))
        _allocator = _pluggable()
        torch.cuda.memory.change_current_allocator(_allocator)
    return _allocator


def buffer_of(tensor):
    """The gpuipc Buffer holding ``tensor``'s memory (use_allocator,
    mem_pool), or None."""
    from ._common import DL_CUDA
    p = tensor.data_ptr()
    box = _c.buf_find(DL_CUDA, p, p)
    return None if box is None else Buffer._wrap(box)


def share_torch(tensor):
    """What another process needs to import ``tensor`` with from_torch:
    (PyTorch's _share_cuda_ handle, storage offset in bytes, bytes, device,
    pid, dtype, shape, strides, element offset)."""
    st = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage()
    dev, handle, size, offset = st._share_cuda_()[:4]
    return {"handle": bytes(handle), "offset": int(offset), "nbytes": int(size),
            "device": int(dev), "pid": os.getpid(), "dtype": str(tensor.dtype),
            "shape": tuple(tensor.shape), "strides": tuple(tensor.stride()),
            "storage_offset": int(tensor.storage_offset())}


def from_torch(shared, device=None):
    """Map a tensor another process shared (share_torch, or a raw
    ``_share_cuda_`` handle in the same dict form) through
    gpuipc_handle_from_cuda_ipc; returns a torch tensor (no copy) whose
    memory lives while the result does."""
    import torch
    dev = shared["device"] if device is None else device
    box = _c.import_cuda_ipc(shared["handle"], shared["offset"], shared["nbytes"], dev,
                             shared["pid"])
    buf = Buffer._wrap(box)
    raw = torch.utils.dlpack.from_dlpack(buf.__dlpack__())
    dtype = getattr(torch, shared["dtype"].replace("torch.", ""))
    return raw.view(dtype).as_strided(shared["shape"], shared["strides"],
                                      shared["storage_offset"])


def from_cupy(handle, nbytes, device, pid, offset=0, shape=None, dtype="uint8"):
    """Map memory that CuPy shared with cupy.cuda.runtime.ipcGetMemHandle
    (64 bytes) in process ``pid``, as a gpuipc Buffer (DLPack and the CUDA
    array interface)."""
    box = _c.import_cuda_ipc(bytes(handle), int(offset), int(nbytes), int(device), int(pid))
    return Buffer._wrap(box, shape, dtype)
