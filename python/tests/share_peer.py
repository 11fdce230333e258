"""The processes of test_share.py: a publisher of snapshot versions and
readers that copy them with Reader.copy_into(share=True) into tensors in
gpuipc HOST memory. Each prints JSON lines and acts on the test's lines."""
import json
import sys

import gpuipc
from gpuipc import state_dict

CHUNK = 16384
# Sizes that are not multiples of the chunk, of several dtypes.
SHAPES = {"embed": ((300, 257), "bfloat16"), "norm": ((1000,), "float32"),
          "ids": ((3333,), "int64"), "mask": ((70001,), "uint8"),
          "tiny": ((3,), "float16"), "proj": ((129, 64), "float32")}
# Sizes that are multiples of 256 bytes: in targets() they lie one right
# after the other, as a model moved into gpuipc memory does (the third
# argument "aligned" picks them).
ALIGNED = {"embed": ((300, 256), "bfloat16"), "norm": ((1024,), "float32"),
           "ids": ((3328,), "int64"), "mask": ((70144,), "uint8"),
           "proj": ((128, 64), "float32")}


def itemsize(dt):
    import torch
    return torch.empty((), dtype=getattr(torch, dt)).element_size()


def same(a, b):
    """Bit for bit (the random bytes make NaNs, which == never equals)."""
    import torch
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def say(**kw):
    print(json.dumps(kw), flush=True)


def make(version):
    import torch
    g = torch.Generator().manual_seed(version)
    out = {}
    for k, (shape, dt) in SHAPES.items():
        n = 1
        for s in shape:
            n *= s
        x = torch.randint(0, 255, (n * itemsize(dt),), generator=g,
                          dtype=torch.uint8)
        out[k] = x.view(getattr(torch, dt)).view(shape)
    return out


def _sizes():
    """Each tensor of SHAPES: its bytes."""
    out = {}
    for k, (shape, dt) in SHAPES.items():
        n = itemsize(dt)
        for s in shape:
            n *= s
        out[k] = n
    return out


def nchunks():
    """The chunks of a version when each tensor is an extent."""
    return sum((n + CHUNK - 1) // CHUNK for n in _sizes().values())


def total_bytes():
    """The bytes of targets()'s buffer."""
    return sum((n + 255) // 256 * 256 for n in _sizes().values())


def targets():
    """A state dict of SHAPES in one gpuipc HOST buffer (256-byte aligned
    places), and the buffer."""
    import torch
    sizes = _sizes()
    buf = gpuipc.empty((total_bytes(),), "uint8")
    raw = torch.from_dlpack(buf)
    out, off = {}, 0
    for k, (shape, dt) in SHAPES.items():
        out[k] = raw[off:off + sizes[k]].view(getattr(torch, dt)).view(shape)
        off += (sizes[k] + 255) // 256 * 256
    return out, buf


def publish(dom):
    with gpuipc.Domain(dom) as d, state_dict.Publisher(d, "w") as pub:
        while sys.stdin.readline().strip() == "more":
            say(published=pub.publish(make(pub.version + 1)))


def lend(dom):
    """Publishes version N of make() lent (Publisher(lend=True)): the same
    gpuipc memory every version, its bytes rewritten in place."""
    with gpuipc.Domain(dom) as d, state_dict.Publisher(d, "w", lend=True) as pub:
        sd, buf = targets()
        while sys.stdin.readline().strip() == "more":
            for k, t in make(pub.version + 1).items():
                sd[k].copy_(t)
            say(published=pub.publish(sd))
        del sd
        buf.release()


def read(dom):
    with gpuipc.Domain(dom) as d, state_dict.Reader(d, "w") as r:
        mine, buf = targets()
        say(ready=True)
        while sys.stdin.readline().strip() == "go":
            ver = r.copy_into(mine, share=True, chunk_bytes=CHUNK)
            want = make(ver)
            say(version=ver, equal=all(same(mine[k], t) for k, t in want.items()),
                stats=r.share_stats)
        del mine


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[3] == "aligned":
        SHAPES = ALIGNED
    globals()[sys.argv[1]](sys.argv[2])
