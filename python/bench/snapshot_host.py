"""State dict snapshots on the HOST kind (no GPU needed): a Llama-2-7B-shaped
state dict scaled down SCALE times (default 8: 291 bf16 tensors, 1.69 GB)
published ROUNDS times by a Publisher() (every tensor copied) and read by a
Reader of the same process through a Domain object of its own, against a
one-process copy_ of the same tensors, in the same run.

  python3 python/bench/snapshot_host.py [SCALE] [ROUNDS]

Prints the copy's median, publish's first and later times (median of the
rounds after the first), Reader.open's and copy_into's, publish + copy_into
against the copy, and the broker's segment count after each round (it stays
flat once the publisher reuses its segments)."""
import os
import statistics
import sys
import time

import torch

import gpuipc
from gpuipc import state_dict


def shapes(scale):
    out = [("embed", (32000 // scale, 4096))]
    for i in range(32):
        p = f"layers.{i}."
        out += [(p + n, (4096 // scale, 4096)) for n in ("q", "k", "v", "o")]
        out += [(p + "gate", (11008 // scale, 4096)), (p + "up", (11008 // scale, 4096)),
                (p + "down", (4096 // scale, 11008)), (p + "in_norm", (4096,)),
                (p + "post_norm", (4096,))]
    return out + [("norm", (4096,)), ("lm_head", (32000 // scale, 4096))]


def main(scale=8, rounds=8):
    torch.set_num_threads(1)
    sd = {n: torch.randn(s).to(torch.bfloat16) for n, s in shapes(scale)}
    total = sum(t.numel() * t.element_size() for t in sd.values())
    dst = {k: torch.empty_like(v) for k, v in sd.items()}

    def copy_all():
        t0 = time.perf_counter()
        for k, v in sd.items():
            dst[k].copy_(v)
        return time.perf_counter() - t0
    floor = statistics.median(copy_all() for _ in range(rounds))
    dom = f"snap{os.getpid()}"
    pub_t, open_t, copy_t, segs = [], [], [], []
    with gpuipc.Domain(dom) as d, gpuipc.Domain(dom) as d2, \
            state_dict.Publisher(d, "w") as pub, state_dict.Reader(d2, "w") as rd:
        for _ in range(rounds):
            t0 = time.perf_counter()
            pub.publish(sd)
            t1 = time.perf_counter()
            with rd.open() as got:
                t2 = time.perf_counter()
                assert len(got) == len(sd)
            t3 = time.perf_counter()
            rd.copy_into(dst)
            t4 = time.perf_counter()
            pub_t.append(t1 - t0)
            open_t.append(t2 - t1)
            copy_t.append(t4 - t3)
            segs.append(d.info()["segments"])

    def later(xs):
        return statistics.median(xs[1:])
    ms = 1e3
    print(f"{len(sd)} tensors, {total / 1e9:.2f} GB; one-process copy {floor * ms:.1f} ms")
    print(f"publish: first {pub_t[0] * ms:.1f} ms, later {later(pub_t) * ms:.1f} ms "
          f"({later(pub_t) / floor:.2f}x the copy)")
    print(f"Reader.open: first {open_t[0] * ms:.2f} ms, later {later(open_t) * ms:.2f} ms; "
          f"copy_into later {later(copy_t) * ms:.1f} ms")
    print(f"publish + copy_into, later: {(later(pub_t) + later(copy_t)) / floor:.2f}x the copy")
    print(f"broker segments after each round: {segs}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
