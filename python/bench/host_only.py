"""What host-only work costs on a GPU machine: two NumPy processes that
exchange arrays through a gpuipc channel (HOST kind), against a process that
starts CUDA (cuInit and device 0's primary context, what registering host
memory took before), in the same run.

  python3 python/bench/host_only.py [ROUNDS]

For the pair: the channel's open (both processes started), ROUNDS round
trips of a 256 KiB float32 array with every byte checked, whether the CUDA
driver got mapped into either process, and the GPU memory each holds
(nvidia-smi, while the channel is open). For the CUDA start: its time and
GPU memory, measured the same way."""
import ctypes
import os
import subprocess
import sys
import time

import numpy as np

import gpuipc


def gpu_mib(pid):
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True).stdout
    except FileNotFoundError:
        return None
    for line in out.splitlines():
        p, _, mib = line.partition(",")
        if p.strip() == str(pid):
            return int(mib)
    return 0


def driver_mapped():
    with open(f"/proc/{os.getpid()}/maps") as f:
        return any("libcuda" in line for line in f)


def pair_end(role, dom, rounds):
    a = np.arange(1 << 16, dtype=np.float32)
    with gpuipc.Domain(dom) as d:
        t0 = time.monotonic()
        ch = d.channel("c", timeout=60)
        t1 = time.monotonic()
        for _ in range(rounds):
            if role == "a":
                ch.send(a)
                with ch.recv(timeout=30) as v:
                    assert np.array_equal(np.from_dlpack(v), a)
            else:
                with ch.recv(timeout=30) as v:
                    ch.send(np.from_dlpack(v).copy())
        t2 = time.monotonic()
        if role == "a":
            peer = ch.info()["peer_pid"]
            print(f"gpuipc HOST pair: open {1e3 * (t1 - t0):.1f} ms, {rounds} round trips "
                  f"{1e3 * (t2 - t1):.1f} ms; GPU memory MiB: this {gpu_mib(os.getpid())}, "
                  f"peer {gpu_mib(peer)}; driver mapped here: {driver_mapped()}", flush=True)
            ch.send(np.zeros(1, np.int8))
        else:
            ch.recv(timeout=60).release()
        ch.close()
    if role == "b" and driver_mapped():
        print("gpuipc HOST pair: the peer mapped the CUDA driver", flush=True)


def cuda_start():
    t0 = time.monotonic()
    cu = ctypes.CDLL("libcuda.so.1")
    assert cu.cuInit(0) == 0
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    t1 = time.monotonic()
    print(f"CUDA start (cuInit + primary context): {1e3 * (t1 - t0):.1f} ms; "
          f"GPU memory MiB: {gpu_mib(os.getpid())}", flush=True)


def main():
    if len(sys.argv) > 2 and sys.argv[1] in ("a", "b"):
        pair_end(sys.argv[1], sys.argv[2], int(sys.argv[3]))
        return
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    dom = f"hostonly{os.getpid()}"
    b = subprocess.Popen([sys.executable, __file__, "b", dom, str(rounds)])
    subprocess.run([sys.executable, __file__, "a", dom, str(rounds)], check=True)
    assert b.wait() == 0
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        print("CUDA start: no CUDA driver here")
        return
    subprocess.run([sys.executable, __file__, "cuda", "-"], check=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["cuda"]:
        cuda_start()
    else:
        main()
