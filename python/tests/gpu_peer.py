"""Processes of the GPU tests: `gpu_peer.py ROLE DOMAIN [ARG]`, JSON lines."""
import json
import os
import sys

import gpuipc


def say(**kw):
    print(json.dumps(kw), flush=True)


def make(seed, n=1 << 20):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(n, device="cuda", generator=g)


def torch_send(dom, arg):
    import torch
    if arg == "alloc":
        from gpuipc import torch as gt
        gt.use_allocator()
    with gpuipc.Domain(dom) as d, d.channel("g", timeout=60) as ch:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            ts = [make(i) for i in range(4)]
            tickets = [ch.send(t, stream=s) for t in ts]
        for t in tickets:
            ch.wait(t, stream=s, timeout=60)
        say(sums=[float(t.sum()) for t in ts], info=ch.info()["buffers_sent"])


def torch_recv(dom, arg):
    import torch
    with gpuipc.Domain(dom) as d, d.channel("g", timeout=60) as ch:
        s = torch.cuda.Stream()
        same = []
        with torch.cuda.stream(s):
            for i in range(4):
                v = ch.recv(timeout=60, stream=s)
                t = torch.from_dlpack(v)
                same.append(bool(torch.equal(t, make(i))))
                del t
        s.synchronize()
        say(same=same)


def echo(dom, arg):
    """Send back every CUDA tensor received (staged: a view is not this
    process's memory), then leave at once: its last copies and their events
    may still be queued when the channel closes."""
    with gpuipc.Domain(dom) as d, d.channel("e", timeout=60) as ch:
        for _ in range(int(arg)):
            with ch.recv(timeout=60) as v:
                ch.send(v)
    say(done=True)


def ping(dom, arg):
    """Send a CUDA tensor, take its echo, check it; then close (which must
    return though the echo's process is gone). ARG: rounds, and ",late":
    before the last receive the stream gets 0.2 s of GPU work, so that its
    wait for the echo's event runs on the GPU after the echo has left."""
    import torch
    n, _, late = arg.partition(",")
    with gpuipc.Domain(dom) as d, d.channel("e", timeout=60) as ch:
        same = True
        for i in range(int(n)):
            x = make(i, 1024)
            ch.send(x)
            if late and i == int(n) - 1:
                torch.cuda._sleep(400_000_000)
            v = ch.recv(timeout=60)
            same = same and bool(torch.equal(torch.from_dlpack(v), x))
    torch.cuda.synchronize()
    say(same=same)


def big(n=1 << 28):
    """1 GiB of int32 from PyTorch's caching allocator (not gpuipc memory),
    each value a function of its index."""
    import torch
    i = torch.arange(n, dtype=torch.int64, device="cuda")
    return (i * 2654435761 % 2**31).to(torch.int32)


def large_send(dom, arg):
    import torch
    with gpuipc.Domain(dom) as d, d.channel("big", timeout=60) as ch:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            t = big()
            ticket = ch.send(t, stream=s)  # staged: one copy on s
        ch.wait(ticket, stream=s, timeout=120)
        s.synchronize()
        say(bytes=t.numel() * t.element_size(), info=ch.info()["buffers_sent"])


def large_recv(dom, arg):
    import torch
    with gpuipc.Domain(dom) as d, d.channel("big", timeout=60) as ch:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            v = ch.recv(timeout=120, stream=s)
            x = torch.from_dlpack(v)
            shape = list(x.shape)
            same = bool(torch.equal(x, big()))
            del x
        s.synchronize()
        say(same=same, shape=shape)


def cupy_send(dom, arg):
    import cupy as cp
    with gpuipc.Domain(dom) as d, d.channel("c", timeout=60) as ch:
        a = cp.arange(1 << 16, dtype=cp.float32) * 3
        buf = gpuipc.empty((1 << 16,), "float32", kind="vmm", device=0)
        b = cp.from_dlpack(buf)
        b[:] = a
        cp.cuda.Device().synchronize()
        t1, t2 = ch.send(a), ch.send(buf)
        ch.done(t1, timeout=60)
        ch.done(t2, timeout=60)
        say(sent=2)


def cupy_recv(dom, arg):
    import cupy as cp
    with gpuipc.Domain(dom) as d, d.channel("c", timeout=60) as ch:
        want = cp.arange(1 << 16, dtype=cp.float32) * 3
        ok = []
        for _ in range(2):
            v = ch.recv(timeout=60)
            x = cp.from_dlpack(v)
            ok.append(bool((x == want).all()))
            del x
        say(same=ok)


def ipc_export(dom, arg):
    import torch
    from gpuipc import torch as gt
    t = make(7).reshape(1024, 1024)[3:5]
    shared = gt.share_torch(t)
    shared["handle"] = shared["handle"].hex()
    say(shared=shared, sum=float(t.sum()))
    sys.stdin.readline()


def ipc_import(dom, arg):
    import torch
    from gpuipc import torch as gt
    shared = json.loads(sys.stdin.readline())
    shared["handle"] = bytes.fromhex(shared["handle"])
    shared["shape"], shared["strides"] = tuple(shared["shape"]), tuple(shared["strides"])
    t = gt.from_torch(shared)
    say(same=bool(torch.equal(t, make(7).reshape(1024, 1024)[3:5])))


def sd_publish(dom, arg):
    import torch
    from gpuipc import state_dict
    with gpuipc.Domain(dom) as d:
        sd = {f"w{i}": make(i, 4096 * (i + 1)).to(torch.bfloat16) for i in range(8)}
        ver, keep = state_dict.publish(d, "sd", sd)
        say(published=ver)
        sys.stdin.readline()


def sd_read(dom, arg):
    import torch
    from gpuipc import state_dict
    with gpuipc.Domain(dom) as d:
        with state_dict.open(d, "sd", device=0) as sd:
            same = all(torch.equal(sd[f"w{i}"], make(i, 4096 * (i + 1)).to(torch.bfloat16))
                       for i in range(8))
        say(same=same)


def sd_lend_publish(dom, arg):
    """Weights born in a gpuipc memory pool, lent in place (no copy); then
    written in place and published again."""
    import torch
    from gpuipc import state_dict
    from gpuipc import torch as gt
    pool = gt.mem_pool()
    with torch.cuda.use_mem_pool(pool):
        sd = {f"w{i}": make(i, 4096 * (i + 1)).to(torch.bfloat16) for i in range(8)}
        sd["big"] = make(99, 8 << 20)  # a block of its own
    other = make(100, 1000)  # PyTorch's own memory: copied
    sd["other"] = other
    with gpuipc.Domain(dom) as d, state_dict.Publisher(d, "sdl", lend=True) as pub:
        ver = pub.publish(sd)
        m = state_dict._manifest(d, "sdl", ver, 5)
        say(published=ver, lent=sum(e["seg"] >= 0 for e in m["tensors"]),
            segments=len(m["segments"]), copied=m["copied"],
            chunks=len(gpuipc._gpuipc.pool_chunks()))
        sys.stdin.readline()
        sd["big"].mul_(2)  # on the current stream; publish orders it
        say(published=pub.publish(sd))
        sys.stdin.readline()
        del sd["other"]  # all lent now: a manifest, then none while nothing moves
        v3 = pub.publish(sd)
        sd["big"].mul_(2)
        v4 = pub.publish(sd)
        say(published=[v3, v4], manifests=[state_dict._manifest(d, "sdl", v, 0) is not None
                                           for v in (v3, v4)])  # timeout 0: at once
        sys.stdin.readline()


def sd_lend_read(dom, arg):
    import torch
    from gpuipc import state_dict
    with gpuipc.Domain(dom) as d, state_dict.Reader(d, "sdl", device=0) as r:
        v1 = r.open()
        same = all(torch.equal(v1[f"w{i}"], make(i, 4096 * (i + 1)).to(torch.bfloat16))
                   for i in range(8))
        same = same and torch.equal(v1["big"], make(99, 8 << 20)) and torch.equal(
            v1["other"], make(100, 1000))
        say(version=v1.version, same=same)
        sys.stdin.readline()  # version 2 is out
        v2 = r.open()
        mine = {k: torch.empty_like(t) for k, t in v2.items()}
        ver = r.copy_into(mine)
        say(version=v2.version, big_doubled=torch.equal(v2["big"], make(99, 8 << 20) * 2),
            lent_view_kept=v2["w0"] is v1["w0"], sees_in_place=torch.equal(
                v1["big"], v2["big"]), copied_version=ver,
            copy_same=all(torch.equal(mine[k], v2[k]) for k in mine))
        sys.stdin.readline()  # versions 3 (all lent) and 4 (moved nothing) are out
        v4 = r.open()
        say(version=v4.version, big_quadrupled=torch.equal(v4["big"], make(99, 8 << 20) * 4),
            same_tensors=v4["w3"] is v1["w3"] and v4["big"] is v2["big"],
            other_gone="other" not in v4)


BLK_ROWS, BLK_ROW, BLK_N = 4096, 16384, 512


def blk_cache(dev, seed):
    """A paged cache layer in gpuipc memory of GPU dev, as torch uint8 rows,
    filled from seed (0: zeros) on the current stream."""
    import torch
    buf = gpuipc.empty((BLK_ROWS, BLK_ROW), "uint8", kind=gpuipc.VMM, device=dev)
    t = torch.from_dlpack(buf)
    if seed:
        # drawn on the CPU (the same bytes on any GPU), then a kernel of
        # the current stream writes the rows
        g = torch.Generator().manual_seed(seed)
        t.copy_(torch.randint(0, 256, t.shape, dtype=torch.uint8, generator=g))
        t.bitwise_xor_(0x5A)
    else:
        t.zero_()
    return buf, t


def blk_indices(b, dst):
    """Batch b's indices (its destination rows with dst), each batch in
    another form: a CPU torch tensor, numpy int32, a strided numpy view, a
    CUDA tensor (copied to the host), a list."""
    import numpy as np
    import torch
    rows = np.random.default_rng(10 * b + dst).permutation(BLK_ROWS)[:BLK_N]
    form = b % 5
    if form == 0:
        return rows, torch.from_numpy(rows.astype(np.int64))
    if form == 1:
        return rows, rows.astype(np.int32)
    if form == 2:
        return rows, np.repeat(rows, 2).astype(np.uint16)[::2]
    if form == 3:
        return rows, torch.from_numpy(rows).cuda()
    return rows, rows.tolist()


def blocks_send(dom, arg):
    """BLK_N scattered rows of a cache on GPU 0 a batch, five batches, each
    after the kernels that wrote the cache (a stream of its own)."""
    import torch
    torch.cuda.set_device(0)
    with gpuipc.Domain(dom) as d, d.channel("g", timeout=60) as ch:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            buf, cache = blk_cache(0, 5)
            for b in range(5):
                _, idx = blk_indices(b, 0)
                t = ch.send_blocks(cache, idx, stream=s)
                ch.wait(t, stream=s, timeout=60)
        s.synchronize()
        say(sent=ch.info()["sent"])


def blocks_recv(dom, arg):
    """Each batch into other scattered rows of a cache on the last GPU;
    every byte against the sender's rows, regenerated here, and the rows
    no batch wrote still zero."""
    import torch
    dev = torch.cuda.device_count() - 1
    torch.cuda.set_device(dev)
    with gpuipc.Domain(dom) as d, d.channel("g", timeout=60) as ch:
        s = torch.cuda.Stream()
        ok = []
        with torch.cuda.stream(s):
            _, want = blk_cache(dev, 5)
            buf, cache = blk_cache(dev, 0)
            written = torch.zeros(BLK_ROWS, dtype=torch.bool, device=f"cuda:{dev}")
            for b in range(5):
                src, _ = blk_indices(b, 0)
                dst, didx = blk_indices(b, 1)
                ch.recv_blocks(cache, didx, timeout=60, stream=s)
                d_rows = torch.from_numpy(dst).to(f"cuda:{dev}")
                s_rows = torch.from_numpy(src).to(f"cuda:{dev}")
                ok.append(bool(torch.equal(cache[d_rows], want[s_rows])))
                written[d_rows] = True
            untouched = bool((cache[~written] == 0).all())
        s.synchronize()
        say(ok=ok, untouched=untouched, device=dev)


if __name__ == "__main__":
    globals()[sys.argv[1]](sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
