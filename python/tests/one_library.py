#!/usr/bin/env python3
"""One copy of gpuipc's state in a process that loads libgpuipc.so itself
(ctypes here; an MPI code or a C extension of the user's alike) and
imports the gpuipc package: both must call the same library. Were the
library compiled into the extension as well, each copy would keep its own
buffers, import cache, driver loader and fork handlers, and every check
below would fail.

usage: one_library.py LIBGPUIPC ORDER
  LIBGPUIPC  the libgpuipc.so.N that the package's extension is linked to
  ORDER      ctypes-first (load LIBGPUIPC, then import gpuipc) or
             import-first
Prints "one library: ok" and exits 0; an AssertionError otherwise. Run by
test_one_library.py and by pip_install.py (on the installed package)."""
import ctypes
import os
import sys

path, order = sys.argv[1], sys.argv[2]
if order == "ctypes-first":
    lib = ctypes.CDLL(path)
    import gpuipc
else:
    import gpuipc
    lib = ctypes.CDLL(path)
from gpuipc import _gpuipc as _c  # noqa: E402
from gpuipc._common import DL_CPU  # noqa: E402

P = ctypes.c_void_p
lib.gpuipc_buf_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_uint,
                                 ctypes.POINTER(P)]
lib.gpuipc_buf_ptr.argtypes = [P]
lib.gpuipc_buf_ptr.restype = P
lib.gpuipc_buf_release.argtypes = [P]
lib.gpuipc_buf_find.argtypes = [P, ctypes.c_size_t, ctypes.POINTER(P),
                                ctypes.POINTER(ctypes.c_size_t)]
HOST = 1  # GPUIPC_KIND_HOST

# A buffer the C library allocates is found by the package ...
cbuf = P()
assert lib.gpuipc_buf_alloc(8192, HOST, -1, 0, ctypes.byref(cbuf)) == 0
cptr = lib.gpuipc_buf_ptr(cbuf)
box = _c.buf_find(DL_CPU, cptr + 100, cptr + 200)
assert box is not None, "the package does not see the buffer the C library made"
assert _c.buf_info(box)[:2] == (cptr, 8192), _c.buf_info(box)
_c.close(box)

# ... a Buffer the package allocates by the C library ...
pbuf = gpuipc.Buffer(4096)
found, off = P(), ctypes.c_size_t()
assert lib.gpuipc_buf_find(P(pbuf.ptr + 10), 16, ctypes.byref(found), ctypes.byref(off)) == 0, \
    "the C library does not see the package's Buffer"
assert off.value == 10
assert lib.gpuipc_buf_ptr(found) == pbuf.ptr
assert lib.gpuipc_buf_release(found) == 0

# ... and released through C, it is gone for the package too.
assert lib.gpuipc_buf_release(cbuf) == 0
assert _c.buf_find(DL_CPU, cptr, cptr + 1) is None

# The sentence of a failure in C is the package's last_error (one
# thread-local slot, not two).
assert lib.gpuipc_buf_find(None, 1, ctypes.byref(found), None) < 0
assert "ptr is NULL" in gpuipc.last_error(), gpuipc.last_error()

# The extension calls that very file.
assert os.path.samefile(gpuipc.libgpuipc_path(), path), (gpuipc.libgpuipc_path(), path)
pbuf.release()
print("one library: ok")
