"""PyTorch integration: tensors born shareable (a pluggable allocator backed
by gpuipc VMM memory), a module's tensors moved into gpuipc memory in place
(move_to_gpuipc: CPU modules too, on the HOST kind) and imports of
PyTorch's and CuPy's own CUDA IPC handles. Everything but move_to_gpuipc
on CPU modules needs a GPU."""
import errno
import os
import struct

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
    pools take from now on.

    With PyTorch's expandable segments on in the environment
    (``expandable_segments:True`` in PYTORCH_CUDA_ALLOC_CONF or
    PYTORCH_ALLOC_CONF), the pool is tried at once with one block on the
    current GPU: PyTorch keeps expandable segments to its own pools, but
    some releases served a MemPool's blocks from them anyway, bypassing its
    allocator, or refused them (pytorch/pytorch#147851); mem_pool then
    raises Unsupported rather than hand out a pool whose tensors would be
    copied when sent or lent."""
    import torch
    _c.alloc_set_kind(_kind(kind))
    prefix = "gpuipc_torch" if not chunk_bytes else "gpuipc_torch_pool"
    if chunk_bytes:
        _c.pool_set_chunk(int(chunk_bytes))
    if prefix not in _pool_allocators:
        _pool_allocators[prefix] = _pluggable(prefix)
    pool = torch.cuda.MemPool(_pool_allocators[prefix].allocator())
    if _expandable_conf():
        _check_pool(pool)
    return pool


def _expandable_conf():
    """Whether the environment may turn PyTorch's expandable segments on:
    the last expandable_segments option of PYTORCH_CUDA_ALLOC_CONF or of
    PYTORCH_ALLOC_CONF is True (PyTorch releases differ in which of the two
    they read; a needless trial of the pool costs one block)."""
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        on = False
        for opt in os.environ.get(var, "").split(","):
            key, _, value = opt.partition(":")
            if key.strip() == "expandable_segments":
                on = value.strip() == "True"
        if on:
            return True
    return False


def _check_pool(pool):
    """Unsupported unless a block made in ``pool`` is gpuipc memory."""
    import torch
    from ._errors import Unsupported
    why = None
    try:
        with torch.cuda.use_mem_pool(pool):
            probe = torch.empty(1, dtype=torch.uint8, device="cuda")
    except RuntimeError as e:
        why = f"PyTorch refused the pool's first block: {e}"
    else:
        buf = buffer_of(probe)
        del probe
        if buf is None:
            why = "PyTorch made the pool's first block in an expandable segment"
        else:
            buf.release()
    if why is not None:
        raise Unsupported(_c.E_UNSUPPORTED, "GPUIPC_E_UNSUPPORTED",
                          f"mem_pool: under expandable_segments:True this PyTorch does not "
                          f"give a MemPool's blocks to its allocator ({why}; "
                          "pytorch/pytorch#147851): turn expandable segments off while "
                          "the pool is in use (torch.cuda.memory._set_allocator_settings("
                          "'expandable_segments:False')), or move the weights with "
                          "move_to_gpuipc")


_MOVE_ALIGN = 256  # where each tensor starts in the buffer


def _movable(module, buffers):
    """The distinct tensors of ``module`` to move (each Parameter once, tied
    or not; buffers too with ``buffers``), checked before anything moves:
    TypeError for a layout other than strided (sparse), ValueError for a
    tensor with no memory (meta) or on a device other than CPU or CUDA."""
    import torch
    seen, out = set(), []
    named = list(module.named_parameters()) + (list(module.named_buffers()) if buffers else [])
    for n, t in named:
        if t is None or id(t) in seen:
            continue  # a tied Parameter: moved once
        seen.add(id(t))
        if t.layout != torch.strided:
            raise TypeError(f"move_to_gpuipc: {n} is a {t.layout} tensor; only dense "
                            "(strided) tensors move")
        if t.device.type == "meta":
            raise ValueError(f"move_to_gpuipc: {n} is on the meta device (no memory to "
                             "move: materialize the module first, e.g. to_empty())")
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError(f"move_to_gpuipc: {n} is on {t.device}; gpuipc holds CPU "
                             "(HOST) and CUDA memory")
        out.append((n, t))
    return out


def _in_gpuipc(t):
    """Whether all of contiguous ``t`` already lies in one gpuipc buffer."""
    from ._common import DL_CPU, DL_CUDA
    if not t.is_contiguous() or t.numel() == 0:
        return False
    lo = t.data_ptr()
    box = _c.buf_find(DL_CUDA if t.is_cuda else DL_CPU, lo,
                      lo + t.numel() * t.element_size())
    if box is None:
        return False
    _c.close(box)
    return True


def move_to_gpuipc(module, buffers=False, kind=None):
    """Move ``module``'s parameters (and, with ``buffers``, its buffers) into
    gpuipc memory in place: the same ``torch.nn.Parameter`` (and buffer)
    objects keep their dtype, shape, device and ``requires_grad``; only
    their ``.data`` now lies in one gpuipc buffer per device, packed
    (each tensor contiguous, at a 256-byte aligned offset). Optimizers,
    hooks, ``named_parameters()`` and weight tying (two names, one
    Parameter: moved once, still one) keep working, and
    ``state_dict.Publisher(lend=True)`` then lends the module's
    ``state_dict()`` with no copy: readers see the next optimizer step.

    ``kind``: the buffers' kind, "host" for CPU tensors (the default
    there), a GPU kind ("vmm", the default, "pool", "legacy") for CUDA
    tensors. Tensors already in gpuipc memory stay where they are.
    Non-contiguous tensors become contiguous. Gradients and optimizer
    state are not moved (they are not shared).

    Everything is checked before anything moves (TypeError: a sparse
    tensor; ValueError: a meta tensor, a device other than CPU or CUDA, a
    kind that does not fit the device). Returns the new gpuipc Buffers,
    one per device, in no particular order ([] when nothing moved); the
    tensors hold the memory themselves, so releasing them is optional.

    Copies run on PyTorch's current stream of each device and are done
    when the call returns. The memory the tensors leave goes back to
    PyTorch's allocator (``torch.cuda.empty_cache()`` hands CUDA memory
    back to the driver). Tensors that shared one storage (other than one
    Parameter under two names) no longer share it after the move."""
    import torch
    from ._common import HOST, VMM
    tensors = _movable(module, buffers)
    by_dev = {}
    for n, t in tensors:
        if not _in_gpuipc(t):
            by_dev.setdefault(t.device, []).append(t)
    kinds = {}
    for dev in by_dev:
        k = (HOST if dev.type == "cpu" else VMM) if kind is None else _kind(kind)
        if (k == HOST) != (dev.type == "cpu"):
            raise ValueError(f"move_to_gpuipc: kind {kind!r} does not hold {dev} tensors "
                             "(host: CPU; vmm, pool, legacy: CUDA)")
        kinds[dev] = k
    out = []
    for dev, ts in by_dev.items():
        offs, total = [], 0
        for t in ts:
            offs.append(total)
            total += (t.numel() * t.element_size() + _MOVE_ALIGN - 1) // _MOVE_ALIGN * _MOVE_ALIGN
        buf = Buffer(max(total, 1), kinds[dev], -1 if dev.type == "cpu" else dev.index or 0)
        raw = torch.utils.dlpack.from_dlpack(buf.__dlpack__())
        with torch.no_grad():
            for t, off in zip(ts, offs):
                n = t.numel() * t.element_size()
                view = raw[off:off + n].view(t.dtype).view(t.shape)
                view.copy_(t.detach())
                t.data = view
        if dev.type == "cuda":
            torch.cuda.current_stream(dev).synchronize()
        out.append(buf)
    return out


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


# PyTorch's expandable-segment handle (PYTORCH_CUDA_ALLOC_CONF=
# expandable_segments:True): b"\x02e", its ShareHeader (pid_t pid; size_t
# segment_size; size_t num_handles), then per piece of segment_size bytes
# (a cuMemCreate allocation of its own) the exporter's descriptor number
# (an int), or a 64-byte fabric handle.
_EXPANDABLE = b"\x02e"
_EXP_HEADER = struct.Struct("<i4xQQ")
_EXP_FD = struct.Struct("<i")
# pidfd_getfd's number in Linux's generic syscall table (x86-64, arm64,
# ppc64, s390x, riscv64, i386, arm); MIPS, Alpha and IA-64 number it apart.
_SYS_PIDFD_GETFD = 438
_OWN_NUMBERING = ("mips", "alpha", "ia64")


def _expandable_piece(handle, offset, nbytes):
    """(exporter pid, its descriptor of the piece that holds bytes
    [offset, offset + nbytes) of expandable-segment ``handle``, where they
    start in that piece). BadHandle: a malformed handle; Unsupported: the
    bytes span two pieces (separate allocations that gpuipc does not map
    as one range) or the pieces are fabric handles."""
    from ._errors import BadHandle, Unsupported
    head = _EXP_HEADER.size + len(_EXPANDABLE)
    if len(handle) < head:
        raise BadHandle(_c.E_BADHANDLE, "GPUIPC_E_BADHANDLE",
                        f"from_torch: an expandable-segment handle of {len(handle)} bytes "
                        f"(its header alone is {head})")
    pid, piece, count = _EXP_HEADER.unpack_from(handle, len(_EXPANDABLE))
    if piece == 0 or count == 0 or pid <= 0:
        raise BadHandle(_c.E_BADHANDLE, "GPUIPC_E_BADHANDLE",
                        f"from_torch: expandable-segment header pid {pid}, piece size "
                        f"{piece}, {count} pieces")
    if len(handle) == head + 64 * count:  # never 4 bytes a piece as well
        raise Unsupported(_c.E_UNSUPPORTED, "GPUIPC_E_UNSUPPORTED",
                          "from_torch: the expandable segment is shared by fabric handles "
                          "(expandable_segments_handle_type); gpuipc imports its POSIX "
                          "file descriptors only")
    if len(handle) != head + _EXP_FD.size * count:
        raise BadHandle(_c.E_BADHANDLE, "GPUIPC_E_BADHANDLE",
                        f"from_torch: an expandable-segment handle of {len(handle)} bytes "
                        f"for {count} pieces (want {head + _EXP_FD.size * count})")
    if nbytes <= 0 or offset < 0 or offset + nbytes > piece * count:
        raise BadHandle(_c.E_BADHANDLE, "GPUIPC_E_BADHANDLE",
                        f"from_torch: bytes [{offset}, +{nbytes}) are not inside the "
                        f"{count} pieces of {piece} bytes the handle shares")
    k = offset // piece
    if (offset + nbytes - 1) // piece != k:
        raise Unsupported(_c.E_UNSUPPORTED, "GPUIPC_E_UNSUPPORTED",
                          f"from_torch: the tensor's {nbytes} bytes span "
                          f"{(offset + nbytes - 1) // piece - k + 1} pieces of PyTorch's "
                          f"expandable segment ({piece} bytes each, separate "
                          "allocations); gpuipc maps one: send the tensor through a "
                          "Channel (staged), or allocate it in gpuipc memory "
                          "(gpuipc.torch.mem_pool, move_to_gpuipc)")
    fd = _EXP_FD.unpack_from(handle, head + _EXP_FD.size * k)[0]
    return pid, fd, offset - k * piece


def _take_fd(pid, fd):
    """A descriptor of this process for descriptor ``fd`` of process
    ``pid`` (pidfd_getfd, what PyTorch's own import does: it needs ptrace
    access to ``pid``); the caller closes it."""
    import ctypes
    from ._errors import Denied, PeerGone, Unsupported, error_for
    no_pidfd = Unsupported(_c.E_UNSUPPORTED, "GPUIPC_E_UNSUPPORTED",
                           "from_torch: expandable-segment handles need pidfd_open "
                           "and pidfd_getfd (Linux >= 5.6 on a machine of the generic "
                           "syscall table)")
    if not hasattr(os, "pidfd_open") or os.uname().machine.startswith(_OWN_NUMBERING):
        raise no_pidfd
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise PeerGone(_c.E_PEER_GONE, "GPUIPC_E_PEER_GONE",
                       f"from_torch: the exporting process {pid} is gone") from None
    except OSError as e:
        if e.errno == errno.ENOSYS:
            raise no_pidfd from None
        raise
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mine = libc.syscall(ctypes.c_long(_SYS_PIDFD_GETFD), ctypes.c_int(pidfd),
                            ctypes.c_int(fd), ctypes.c_uint(0))
        err = ctypes.get_errno()
    finally:
        os.close(pidfd)
    if mine >= 0:
        return mine
    what = f"from_torch: pidfd_getfd(process {pid}, descriptor {fd})"
    if err == errno.EPERM:
        raise Denied(-err, "EPERM", f"{what}: not permitted: taking another process's "
                     "descriptor needs ptrace access to it (the same user and "
                     "kernel.yama.ptrace_scope 0, the exporter an ancestor, or "
                     "CAP_SYS_PTRACE), as PyTorch's own import of this handle does")
    if err == errno.ENOSYS:
        raise Unsupported(_c.E_UNSUPPORTED, "GPUIPC_E_UNSUPPORTED",
                          f"{what}: the kernel lacks pidfd_getfd (Linux >= 5.6)")
    if err == errno.ESRCH:
        raise PeerGone(_c.E_PEER_GONE, "GPUIPC_E_PEER_GONE",
                       f"{what}: the exporting process is gone")
    raise error_for(-err, errno.errorcode.get(err, "E?"), f"{what}: {os.strerror(err)} "
                    "(the exporter let go of the memory?)")


def _import_expandable(handle, offset, nbytes, device, pid):
    """The buffer box of bytes [offset, offset + nbytes) of memory PyTorch's
    expandable-segments allocator shared: its piece's descriptor, taken
    from the exporter, imported by gpuipc_handle_from_cuda_fd."""
    owner, fd, off = _expandable_piece(handle, offset, nbytes)
    if owner != pid:
        from ._errors import BadHandle
        raise BadHandle(_c.E_BADHANDLE, "GPUIPC_E_BADHANDLE",
                        f"from_torch: the handle was made by process {owner}, not {pid}")
    mine = _take_fd(pid, fd)
    try:
        return _c.import_cuda_fd(mine, off, nbytes, device)
    finally:
        os.close(mine)  # the import holds a duplicate


def from_torch(shared, device=None):
    """Map a tensor another process shared (share_torch, or a raw
    ``_share_cuda_`` handle in the same dict form); returns a torch tensor
    (no copy) whose memory lives while the result does. PyTorch's
    caching allocator (b"\x02c" handles) is imported through
    gpuipc_handle_from_cuda_ipc; its expandable segments
    (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, b"\x02e") through
    gpuipc_handle_from_cuda_fd, the descriptor taken from the exporter with
    pidfd_getfd as PyTorch itself does (Denied without ptrace access to
    it). An expandable segment is pieces of separate allocations (20 MiB
    each for large blocks, 2 MiB for small ones): a tensor whose bytes span
    two of them raises Unsupported (send it through a Channel instead)."""
    import torch
    dev = shared["device"] if device is None else device
    handle = bytes(shared["handle"])
    if handle[:2] == _EXPANDABLE and len(handle) != 64:
        box = _import_expandable(handle, int(shared["offset"]), int(shared["nbytes"]), dev,
                                 int(shared["pid"]))
    else:
        box = _c.import_cuda_ipc(handle, shared["offset"], shared["nbytes"], dev,
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
