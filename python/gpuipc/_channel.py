"""gpuipc's channels: Channel, an ordered two-way pipe for tensors between
two processes of a domain (opened by Domain.channel, _domain.py). What it
sends is described by _tensor.describe and found in this process's buffers
by the library (gpuipc_buf_find); what it receives is a _tensor.Tensor. The C calls
live in _gpuipc_channel.c."""
import errno
import threading

from . import _gpuipc as _c
from ._buffer import Buffer
from ._common import DEFAULT, _Boxed, _ms, _stream
from ._errors import Error, WouldBlock, error_for
from ._tensor import Tensor, describe


class Channel(_Boxed):
    """A two-way, ordered pipe for tensors between two processes of a domain
    (``gpuipc_channel_open``). A context manager that closes it.

    A channel does not survive ``os.fork()``: in the child, closing it or
    letting it go (and its received tensors) frees the child's copy and
    tells the peer nothing, so the parent's channel goes on; any other use
    raises Closed."""

    _closed = "the channel is closed"

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

    def close(self):
        box = self._take_box()
        if box is not None:
            _c.close(box)
        self._keep.clear()

    def send(self, obj, stream=None, block=True):
        """Send a tensor (torch, CuPy, JAX, numpy, a gpuipc Buffer, anything
        with DLPack, the CUDA array interface or the buffer protocol).
        Memory of a gpuipc buffer travels without a copy (any buffer of
        this process, found by address: one C code made through the same
        libgpuipc too); other memory is staged through the channel's own
        buffer. A tensor, numpy or DLPack array is read and sent in one
        call into the extension. ``block=False`` raises
        WouldBlock instead of waiting for room. Returns the ticket."""
        flags = 0 if block else _c.SEND_NONBLOCK
        if type(obj) is Tensor:
            # A received view in host memory that no buffer of this process
            # holds is sent on in C (staged). None: sent nothing.
            if stream is None:
                ticket = _c.channel_send_view(self._h(), obj._h(), flags)
                if ticket is not None:
                    return ticket
        elif not isinstance(obj, Buffer):
            # One call: read in C (torch, the array interface, DLPack), the
            # buffer it lies in found by address, sent; a GPU tensor kept
            # in _keep until its message is free. NotImplemented: sent
            # nothing, for describe() (the CUDA array interface alone, the
            # buffer protocol, a dtype or layout it judges).
            ticket = _c.channel_send_any(self._h(), obj, stream, flags, self._keep)
            if ticket is not NotImplemented:
                return ticket
        d = describe(obj, stream)
        s = d.stream(stream)
        if isinstance(obj, Buffer):  # a buffer, or a sub-view with its own reference
            box = obj._box
        else:  # the gpuipc buffer the memory lies in (a reference of its own)
            box = _c.buf_find(d.device_type, d.lo, d.hi)
        ticket = _c.channel_send(self._h(), box, d.t, s, flags)
        if d.cuda:
            self._hold(ticket, (d.keep, box))
        return ticket

    def send_blocks(self, tensor, indices, stream=None, block=True):
        """Send the blocks ``tensor[i]`` for ``i`` in ``indices`` (a list,
        or a numpy or torch integer array: one in host memory is read where
        it lies, a CUDA one copied to the host first, which waits for its
        GPU) as one message, a block batch
        (``gpuipc_channel_send_blocks``): one descriptor, one ticket, one
        batched copy at the receiver (``recv_blocks``), whatever the number
        of blocks (1 .. ``gpuipc.CHANNEL_BLOCKS_MAX``). ``tensor`` is a
        contiguous tensor (torch, numpy, DLPack, a gpuipc Buffer) whose
        memory lies in a gpuipc buffer (``gpuipc.empty``, a gpuipc
        allocator): a paged KV cache of one layer, say, whose first
        dimension is the block. The blocks travel without a copy on this
        side; the array of blocks is built in one call into the extension.
        ``stream``: as ``send``'s (the message is ordered after its work).
        ``block=False`` raises WouldBlock instead of waiting for room.
        Raises IndexError for an index outside ``0 .. len(tensor) - 1``,
        ValueError for a tensor that is not contiguous or not in a gpuipc
        buffer, TypeError for indices that are not ints, and what ``send``
        raises. Returns the ticket."""
        flags = 0 if block else _c.SEND_NONBLOCK
        if not isinstance(tensor, (Buffer, Tensor)):
            ticket = _c.channel_send_blocks(self._h(), tensor, indices, stream,
                                            flags, self._keep)
            if ticket is not NotImplemented:
                return ticket
        d = describe(tensor, stream)
        box = tensor._box if isinstance(tensor, Buffer) else None
        ticket = _c.channel_send_blocks_desc(self._h(), box, d.t, indices,
                                             d.stream(stream), flags)
        if d.cuda:
            self._hold(ticket, (d.keep, box))
        return ticket

    def recv_blocks(self, dst, indices, timeout=None, stream=None):
        """Receive the next message, a block batch, copying its block ``k``
        into ``dst[indices[k]]`` (``gpuipc_channel_recv_blocks``): one
        launch of gpuipc's block kernel between GPU memories, else one
        batched copy, on ``stream`` after the sender's work (on the legacy
        default stream, which ``cuMemcpyBatchAsync`` refuses, on a stream
        of gpuipc's own ordered after it and before its later work),
        the message given back when the copies are done. ``dst`` is a contiguous,
        writable tensor in a gpuipc buffer whose first dimension is the
        block; ``indices`` as ``send_blocks``'s, one per block sent, no
        index twice. Everything is checked before the message is taken:
        IndexError for an index outside ``dst``, ValueError
        (InvalidArgument) for a repeated index (two blocks overlap), a
        block count or size that differs from the message's, or a message
        that is not a block batch (it stays first in line: take it with
        ``recv``). Returns ``dst``."""
        d = describe(dst, stream)
        if d.readonly:
            raise ValueError("recv_blocks: dst is read-only")
        box = dst._box if isinstance(dst, Buffer) else None
        _c.channel_recv_blocks_desc(self._h(), box, d.t, indices,
                                    d.stream(stream), _ms(timeout))
        return dst

    def _hold(self, ticket, what):
        """Keep ``what`` (a staged GPU tensor the copy still reads) until
        message ``ticket`` is free; past 8 kept, let go of every one that
        is. Messages come free in any order: one the receiver holds keeps
        only its own entry (at most ``depth`` are not free)."""
        with self._lock:
            keep = self._keep
            keep[ticket] = what
            if len(keep) <= 8:
                return
            for t in list(keep):
                try:
                    if not _c.channel_send_done(self._box, t, 0):
                        continue
                except Error:
                    pass
                keep.pop(t, None)  # channel_send_any may have let it go

    def done(self, ticket, timeout=0):
        """Whether message ``ticket``'s buffer is free again (released, and
        the receiver's work on it complete); waits up to ``timeout`` s.
        Messages come free in any order: a later ticket may be done while
        an earlier one is still held (``info()["oldest_in_flight"]``)."""
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
        box, info = _c.channel_recv(self._h(), s, timeout)
        return Tensor(box, s, info)

    def recv_into(self, dst, timeout=None, stream=None):
        """Receive the next tensor by copying it into ``dst`` (same dtype and
        shape, contiguous, writable), on ``stream``; the sender's buffer is
        given back when the copy is done. A read-only ``dst`` (bytes, an
        array whose writeable flag is off) raises ValueError before
        anything is received."""
        if not isinstance(dst, (Buffer, Tensor)):
            # A torch tensor is read in C, its stream found there: one call.
            if _c.channel_recv_into_any(self._h(), dst, stream,
                                        _ms(timeout)) is not NotImplemented:
                return dst
        d = describe(dst, stream)
        if d.readonly:
            raise ValueError("recv_into: dst is read-only")
        s = d.stream(stream)
        _c.channel_recv_into(self._h(), d.t, s, _ms(timeout))
        return dst

    def fileno(self):
        """The descriptor an event loop waits on for readability
        (``gpuipc_channel_fd``): readable when a message or a release may
        have come since a call found nothing. The channel owns it: do not
        read or close it."""
        return _c.channel_fd(self._h())

    async def arecv(self, timeout=None, stream=None):
        """``recv`` for asyncio, without threads: the running loop waits on
        ``fileno()`` (``loop.add_reader``). Releases that arrive meanwhile
        are taken in (``progress``). One ``arecv`` at a time per channel."""
        import asyncio
        loop = asyncio.get_running_loop()
        fd = self.fileno()
        end = None if timeout is None else loop.time() + timeout
        while True:
            try:
                return self.recv(0, stream)
            except WouldBlock:
                self.progress()  # the descriptor serves both directions
            left = None if end is None else end - loop.time()
            if left is not None and left <= 0:
                raise error_for(-errno.ETIMEDOUT, "ETIMEDOUT", f"channel {self.name}: "
                                f"no message within {timeout} s")
            ready = loop.create_future()
            loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
            try:
                await asyncio.wait_for(ready, left)
            except asyncio.TimeoutError:
                pass  # the next round raises, unless a message came
            finally:
                loop.remove_reader(fd)

    def info(self):
        """Counters (``gpuipc_channel_info``): ``in_flight`` messages sent
        and not free yet, ``oldest_in_flight`` the ticket of the oldest of
        them (0: none; the one a receiver may be holding), ``sent``,
        ``received``, ``views`` (received, not yet released), ..."""
        return _c.channel_info(self._h())
