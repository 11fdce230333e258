"""PyTorch baseline of channel_vs_baselines.py: a CUDA tensor through a
torch.multiprocessing queue, put -> get -> touch -> ack, 4 KiB.

    python3 channel_torch.py [--quick]

Prints "RESULT lat torch_rt MEDIAN P99" (microseconds).
"""
import sys
import time

import torch
import torch.multiprocessing as mp


def consumer(q, ack, n):
    torch.cuda.set_device(0)
    for i in range(n):
        t = q.get()
        t[0].item()  # touch it on the GPU
        del t
        ack.put(i)


def main():
    quick = "--quick" in sys.argv
    n = 200 if quick else 1000
    warm = n // 10
    mp.set_start_method("spawn")
    q, ack = mp.Queue(), mp.Queue()
    p = mp.Process(target=consumer, args=(q, ack, n + warm))
    p.start()
    x = torch.zeros(1024, dtype=torch.float32, device="cuda:0")  # 4 KiB
    torch.cuda.synchronize()
    lat = []
    for i in range(n + warm):
        t0 = time.perf_counter()
        q.put(x)
        ack.get()
        if i >= warm:
            lat.append((time.perf_counter() - t0) * 1e6)
    p.join()
    lat.sort()
    med, p99 = lat[len(lat) // 2], lat[min(len(lat) - 1, len(lat) * 99 // 100)]
    print("RESULT lat torch_rt %.3f %.3f" % (med, p99))
    print("  torch.multiprocessing queue 4 KiB: median %.1f us, p99 %.1f us"
          % (med, p99))


if __name__ == "__main__":
    main()
