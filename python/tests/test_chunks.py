"""The pooled pluggable allocator behind gpuipc.torch.mem_pool()
(_gpuipc_chunks.c), called as PyTorch calls it, through its two exported C
functions, in a process of its own on the fake CUDA driver (whose "device
memory" is host memory, so every byte can be checked): blocks are cut from
a few growing chunks, never overlap, come back first fit and joined, and a
chunk goes when its last block does while a reference taken through
buf_find (gpuipc_buf_find) keeps its memory."""
import os
import subprocess
import sys

import pytest

FAKE = os.environ.get("FAKE_CUDA_FULL")

BODY = r'''
import ctypes, random
import gpuipc
from gpuipc import _gpuipc as _c
from gpuipc._common import DL_CUDA

MiB = 1 << 20
lib = ctypes.CDLL(_c.__file__)
malloc = lib.gpuipc_torch_pool_malloc
malloc.restype = ctypes.c_void_p
malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
free = lib.gpuipc_torch_pool_free
free.restype = None
free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
_c.alloc_set_kind(gpuipc.LEGACY)  # the fake driver's cuMemAlloc
_c.pool_set_chunk(256 * MiB)

def chunks():
    return sorted((size, used, nb) for _, size, used, nb in _c.pool_chunks())

def fill(p, n, byte):
    ctypes.memset(p, byte, n)

def check(p, n, byte):
    data = ctypes.string_at(p, n)
    assert data == bytes([byte]) * n, f"block at {p:#x}: bytes changed"

# Small blocks share the first chunk (64 MiB), cut in 2 MiB steps.
a = malloc(1 * MiB, 0, None)
b = malloc(3 * MiB, 0, None)
assert a and b and b == a + 2 * MiB, (a, b)
assert chunks() == [(64 * MiB, 6 * MiB, 2)], chunks()
fill(a, 1 * MiB, 0xA1)
fill(b, 3 * MiB, 0xB2)

# What does not fit takes a chunk twice the largest one so far.
c = malloc(100 * MiB, 0, None)
assert chunks() == [(64 * MiB, 6 * MiB, 2), (128 * MiB, 100 * MiB, 1)], chunks()
fill(c, 100 * MiB, 0xC3)

# buf_find finds a block's whole chunk (what a send or a lend shares).
box = _c.buf_find(DL_CUDA, b + 12345, b + 12345)
ptr, nbytes, kind, dev = _c.buf_info(box)
assert (ptr, nbytes, kind, dev) == (a, 64 * MiB, gpuipc.LEGACY, 0), (ptr, nbytes, kind, dev)
assert _c.buf_find(DL_CUDA, 1, 1) is None

# Freed bytes come back first fit, joined with their free neighbours.
free(a, 1 * MiB, 0, None)
d = malloc(2 * MiB, 0, None)
assert d == a, (d, a)
free(d, 2 * MiB, 0, None)
e = malloc(58 * MiB, 0, None)  # the tail after b, exactly
assert e == b + 4 * MiB, (e, b)
free(e, 58 * MiB, 0, None)
x = malloc(2 * MiB, 0, None)  # a's old place again
y = malloc(2 * MiB, 0, None)
z = malloc(2 * MiB, 0, None)
assert (x, y, z) == (a, b + 4 * MiB, b + 6 * MiB), (x, y, z)
free(y, 0, 0, None)
free(z, 0, 0, None)  # joins y's bytes before it and the tail after it
assert malloc(58 * MiB, 0, None) == y
free(y, 0, 0, None)
free(x, 0, 0, None)
free(b, 3 * MiB, 0, None)  # the last block: the chunk goes back ...
assert chunks() == [(128 * MiB, 100 * MiB, 1)], chunks()
check(b, 3 * MiB, 0xB2)  # ... but the reference taken above keeps its memory
held = _c.buf_find(DL_CUDA, b, b)  # a live buffer still, found by address
assert _c.buf_info(held)[0] == a, _c.buf_info(held)
_c.close(held)
_c.close(box)
assert _c.buf_find(DL_CUDA, b, b) is None  # the last reference went
check(c, 100 * MiB, 0xC3)

# Growth stops at the cap; a block above it gets a chunk of its own.
f = malloc(200 * MiB, 0, None)
g = malloc(200 * MiB, 0, None)
h = malloc(300 * MiB, 0, None)
assert chunks() == sorted([(128 * MiB, 100 * MiB, 1), (256 * MiB, 200 * MiB, 1),
                           (256 * MiB, 200 * MiB, 1), (300 * MiB, 300 * MiB, 1)]), chunks()
for p in (f, g, h, c):
    free(p, 0, 0, None)
assert chunks() == [], chunks()

# Random blocks, each filled with its own byte: none overlaps another, and
# when all are gone so are the chunks.
rng = random.Random(7)
live = {}
for i in range(600):
    if live and rng.random() < 0.45:
        p = rng.choice(list(live))
        n, byte = live.pop(p)
        check(p, n, byte)
        free(p, n, 0, None)
    else:
        n = rng.choice([512, 4096, MiB, 2 * MiB + 1, 9 * MiB, 21 * MiB])
        p = malloc(n, 0, None)
        assert p, n
        byte = rng.randrange(1, 256)
        fill(p, n, byte)
        live[p] = (n, byte)
for p, (n, byte) in live.items():
    check(p, n, byte)
    free(p, n, 0, None)
assert chunks() == [], chunks()

# What PyTorch never asks, refused without harm.
assert malloc(0, 0, None) is None and malloc(-5, 0, None) is None
free(12345, 0, 0, None)  # not a block of the pool: nothing happens
try:
    _c.pool_set_chunk(4096)
except ValueError as e:
    assert "2 MiB" in str(e)
else:
    raise AssertionError("a chunk below 2 MiB was taken")
print("chunks ok")
'''


@pytest.mark.skipif(not FAKE, reason="FAKE_CUDA_FULL (the fake CUDA driver) not set")
def test_pool_chunks_on_fake_driver(env):
    env["GPUIPC_CUDA_LIB"] = FAKE
    r = subprocess.run([sys.executable, "-c", BODY], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "chunks ok" in r.stdout
