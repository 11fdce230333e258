"""Processes of test_expandable.py's GPU tests, run with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set by the test before
CUDA starts): `expandable_peer.py ROLE DOMAIN`; the last line is JSON.

Pairs of roles meet in the domain and pace each other with channel "c":
the leader sends a number (a version), the follower answers once it has
checked that version."""
import json
import os
import subprocess
import sys

import numpy as np

import gpuipc

SMALL = 64 << 10  # floats: 256 KiB, a small block (2 MiB pieces)
LARGE = 12 << 20  # floats: 48 MiB, over several 20 MiB pieces


def say(**kw):
    print(json.dumps(kw), flush=True)


def make(seed, n):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(n, device="cuda", generator=g)


def expandable(tensors=()):
    """Whether PyTorch's allocator runs expandable segments here, and every
    one of ``tensors`` lies in one of them."""
    import torch
    assert os.environ.get("PYTORCH_CUDA_ALLOC_CONF") == "expandable_segments:True"
    segs = [(s["address"], s["address"] + s["total_size"])
            for s in torch.cuda.memory_snapshot() if s.get("is_expandable")]
    return bool(segs) and all(any(lo <= t.data_ptr() < hi for lo, hi in segs)
                              for t in tensors)


def tell(ch, n):
    ch.send(np.array([n], dtype=np.int64))  # staged: the array may go


def hear(ch):
    with ch.recv(timeout=120) as v:
        return int(v.numpy()[0])


# ---- Channel.send --------------------------------------------------------

def chan_send(dom):
    import torch
    with gpuipc.Domain(dom) as d, d.channel("x", timeout=60) as ch:
        ts = [make(1, 1000), make(2, LARGE), make(3, SMALL)]
        torch.cuda.synchronize()
        exp = expandable(ts)
        tickets = [ch.send(t) for t in ts]  # staged: not gpuipc memory
        for t in tickets:
            ch.wait(t, timeout=120)
        say(expandable=exp, sent=len(ts))


def chan_recv(dom):
    import torch
    with gpuipc.Domain(dom) as d, d.channel("x", timeout=60) as ch:
        s = torch.cuda.Stream()
        dst = torch.full((LARGE,), -1.0, device="cuda")
        exp = expandable([dst])
        same = []
        with torch.cuda.stream(s):
            v = ch.recv(timeout=120, stream=s)
            t = torch.from_dlpack(v)
            same.append(bool(torch.equal(t, make(1, 1000))))
            del t, v
            ch.recv_into(dst, timeout=120, stream=s)  # into the expandable allocator's memory
            same.append(bool(torch.equal(dst, make(2, LARGE))))
            v = ch.recv(timeout=120, stream=s)
            t = torch.from_dlpack(v)
            same.append(bool(torch.equal(t, make(3, SMALL))))
            del t, v
        s.synchronize()
        say(expandable=exp, same=same)


# ---- from_torch ------------------------------------------------------------

def ipc_export(dom):
    """Share a small tensor (one piece) and a large one (several pieces)."""
    import torch
    from gpuipc import torch as gt
    small, large = make(7, SMALL), make(8, LARGE)
    torch.cuda.synchronize()
    assert expandable([small, large])
    for t in (small, large):
        sh = gt.share_torch(t)
        sh["handle"] = sh["handle"].hex()
        print(json.dumps(sh), flush=True)
    sys.stdin.readline()


def ipc_import(dom):
    """Start the exporter (a child: pidfd_getfd needs ptrace access, which
    an ancestor has), map its small tensor, be refused its large one."""
    import torch
    from gpuipc import torch as gt
    torch.cuda.init()
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "ipc_export", dom],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        small, large = (json.loads(p.stdout.readline()) for _ in range(2))
        for sh in (small, large):
            sh["handle"] = bytes.fromhex(sh["handle"])
            sh["shape"], sh["strides"] = tuple(sh["shape"]), tuple(sh["strides"])
        try:
            t = gt.from_torch(small)
        except gpuipc.Denied as e:  # no ptrace access here (seccomp, Yama)
            say(denied=e.detail)
            return
        same = bool(torch.equal(t, make(7, SMALL)))
        del t
        try:
            gt.from_torch(large)
            spanning = "mapped"
        except gpuipc.Unsupported:
            spanning = "Unsupported"
    finally:
        p.communicate("\n", timeout=60)
    assert p.returncode == 0, p.returncode
    say(handle=chr(small["handle"][1]), same=same, spanning=spanning)


# ---- state dict snapshots ----------------------------------------------------

def _sd(scale=1):
    import torch
    return {f"w{i}": make(10 + i, (i + 1) * (3 << 20)).to(torch.bfloat16) * scale
            for i in range(4)}


def sd_publish(dom):
    import torch
    from gpuipc import state_dict
    with gpuipc.Domain(dom) as d, d.channel("c", timeout=60) as ch, \
            state_dict.Publisher(d, "sd") as pub:
        sd = _sd()
        exp = expandable(sd.values())
        vers = []
        for _ in range(2):
            vers.append(pub.publish(sd))  # a snapshot: copied into gpuipc segments
            tell(ch, vers[-1])
            assert hear(ch) == vers[-1]
            with torch.no_grad():
                for t in sd.values():
                    t.mul_(2)  # the next version; the last one's copies stay as they were
        say(expandable=exp, published=vers)


def sd_read(dom):
    import torch
    from gpuipc import state_dict
    with gpuipc.Domain(dom) as d, d.channel("c", timeout=60) as ch, \
            state_dict.Reader(d, "sd", device=0) as r:
        mine = {k: torch.empty_like(v) for k, v in _sd().items()}
        exp = expandable(mine.values())
        vers, same = [], []
        for scale in (1, 2):
            ver = hear(ch)
            vers.append(r.copy_into(mine))
            same.append(vers[-1] == ver and all(torch.equal(mine[k], v)
                                                for k, v in _sd(scale).items()))
            tell(ch, ver)
        say(expandable=exp, versions=vers, same=same)


# ---- move_to_gpuipc ------------------------------------------------------------

def _module():
    import torch
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(2048, 4096, device="cuda"),
                               torch.nn.Linear(4096, 1024, device="cuda"))


def move_publish(dom):
    import torch
    from gpuipc import state_dict
    from gpuipc import torch as gt
    model = _module()
    params = list(model.parameters())
    before = expandable(params)
    want = [p.detach().clone() for p in params]
    gt.move_to_gpuipc(model)
    bufs = [gt.buffer_of(p) for p in params]
    in_gpuipc = all(b is not None for b in bufs) and len({b.ptr for b in bufs}) == 1
    for b in bufs:
        if b is not None:
            b.release()
    kept = all(torch.equal(a, p) for a, p in zip(want, model.parameters())) and all(
        a is b for a, b in zip(model.parameters(), params))  # the same Parameters
    with gpuipc.Domain(dom) as d, d.channel("c", timeout=60) as ch, \
            state_dict.Publisher(d, "m", lend=True) as pub:
        vers = []
        for _ in range(2):
            vers.append(pub.publish(model.state_dict()))  # lent: no copy
            tell(ch, vers[-1])
            assert hear(ch) == vers[-1]
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(2)  # in place, in the lent memory
        say(expandable_before=before, in_gpuipc=in_gpuipc, kept=kept, published=vers)


def move_read(dom):
    import torch
    from gpuipc import state_dict
    ref = _module().state_dict()
    mine = {k: torch.empty_like(v) for k, v in ref.items()}
    with gpuipc.Domain(dom) as d, d.channel("c", timeout=60) as ch, \
            state_dict.Reader(d, "m", device=0) as r:
        vers, same = [], []
        for scale in (1, 2):
            ver = hear(ch)
            vers.append(r.copy_into(mine))
            same.append(vers[-1] == ver and all(torch.equal(mine[k], v * scale)
                                                for k, v in ref.items()))
            tell(ch, ver)
        say(versions=vers, same=same)


# ---- mem_pool ----------------------------------------------------------------------

def mem_pool(dom):
    """A pool's tensors are gpuipc memory, or mem_pool refuses the pool."""
    import torch
    from gpuipc import torch as gt
    b = torch.ones(4 << 20, device="cuda")
    try:
        pool = gt.mem_pool()
    except gpuipc.Unsupported as e:
        say(expandable=expandable([b]), refused=e.detail)
        return
    with torch.cuda.use_mem_pool(pool):
        a = torch.ones(4 << 20, device="cuda")
    found = [gt.buffer_of(a), gt.buffer_of(b)]
    say(expandable=expandable([b]), pool_in_gpuipc=found[0] is not None,
        other_in_gpuipc=found[1] is not None)
    for f in found:
        if f is not None:
            f.release()


if __name__ == "__main__":
    globals()[sys.argv[1]](sys.argv[2])
