"""PyTorch and CuPy against gpuipc (needs a GPU, torch, cupy).

  python3 tests/gpu/torch_import.py BUILD_DIR [DEVICE]

1. PyTorch -> gpuipc: a tensor that starts inside its caching-allocator
   block (a second allocation in the block, then a slice of it) holds
   (i * 7 + seed) mod 256; its storage is shared with _share_cuda_() and
   the 66 bytes, offset, size, device and pid go to
   `cuda_import ipc` (fork+exec), which imports it with
   gpuipc_handle_from_cuda_ipc and checks every byte.
2. gpuipc -> CuPy: `cuda_import legacy-export` allocates a LEGACY buffer
   of 16 M floats with the pattern and prints its handle's 64 bytes;
   cupy.cuda.runtime.ipcOpenMemHandle opens them here, every byte is
   checked.
3. cuMem fd: `cuda_import vmm-fd` makes cuMemCreate memory, exports its
   POSIX fd and hands it to a child that imports it with
   gpuipc_handle_from_cuda_fd (PyTorch has no public way to give the fd
   of an expandable segment).
Exit 0 when all pass, 77 without a GPU.
"""
import os
import subprocess
import sys

SEED_TORCH, SEED_CUPY, SEED_FD = 11, 23, 37


def run(args, **kw):
    print("+", " ".join(args)[:200], flush=True)
    p = subprocess.run(args, **kw)
    if p.returncode != 0:
        sys.exit("FAIL: %s exited %d" % (args[1], p.returncode))


def torch_to_gpuipc(helper, dev):
    import torch
    torch.cuda.set_device(dev)
    pad = torch.empty(512 << 10, dtype=torch.uint8, device="cuda")
    big = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    skip = 4096 + 13
    t = big[skip:skip + 700000]
    n = t.numel()
    i = torch.arange(n, device="cuda", dtype=torch.int64)
    t.copy_(((i * 7 + SEED_TORCH) % 256).to(torch.uint8))
    torch.cuda.synchronize()
    share = t.untyped_storage()._share_cuda_()
    handle, storage_off = share[1], share[3]
    off = storage_off + t.storage_offset() * t.element_size()
    print("torch: handle %d bytes %r..., storage offset %d, tensor offset %d"
          % (len(handle), handle[:2], storage_off, off), flush=True)
    assert len(handle) == 66 and handle[:2] == b"\x02c", handle[:2]
    assert storage_off > 0, "the storage should not start its block"
    run([helper, "ipc", str(dev), handle.hex(), str(off), str(n),
         str(os.getpid()), str(SEED_TORCH)])
    del pad, big, t


def gpuipc_to_cupy(helper, dev):
    import cupy
    size = (16 << 20) * 4  # 16 M floats
    p = subprocess.Popen([helper, "legacy-export", str(dev), str(size),
                          str(SEED_CUPY)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    hexh = off = n = None
    for line in p.stdout:
        f = line.split()
        if len(f) == 3 and len(f[0]) == 128:
            hexh, off, n = f[0], int(f[1]), int(f[2])
            break
        print(line, end="")
    if hexh is None:
        sys.exit("FAIL: legacy-export printed no handle (rc %s)" % p.wait())
    with cupy.cuda.Device(dev):
        ptr = cupy.cuda.runtime.ipcOpenMemHandle(bytes.fromhex(hexh))
        mem = cupy.cuda.UnownedMemory(ptr + off, n, None)
        a = cupy.ndarray((n,), dtype=cupy.uint8,
                         memptr=cupy.cuda.MemoryPointer(mem, 0))
        want = ((cupy.arange(n, dtype=cupy.int64) * 7 + SEED_CUPY) % 256
                ).astype(cupy.uint8)
        bad = int((a != want).sum())
        f32 = a.view(cupy.float32)
        print("cupy: opened %d bytes (%d floats), %d wrong" %
              (n, f32.size, bad), flush=True)
        del a, f32, mem
        cupy.cuda.runtime.ipcCloseMemHandle(ptr)
    p.stdin.write("done\n")
    p.stdin.close()
    rc = p.wait()
    if bad != 0 or rc != 0:
        sys.exit("FAIL: cupy read %d wrong bytes; exporter rc %d" % (bad, rc))


def main():
    build = sys.argv[1]
    dev = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    helper = os.path.join(build, "tests", "cuda_import")
    try:
        import torch
        if not torch.cuda.is_available():
            print("SKIP: no GPU")
            sys.exit(77)
    except ImportError:
        print("SKIP: no torch")
        sys.exit(77)
    torch_to_gpuipc(helper, dev)
    gpuipc_to_cupy(helper, dev)
    run([helper, "vmm-fd", str(dev), str(6 << 20), str((2 << 20) + 999),
         str(SEED_FD)])
    print("torch_import: PASS")


if __name__ == "__main__":
    main()
