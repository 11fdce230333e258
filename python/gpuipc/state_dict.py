"""Weights in one step: a whole state dict under one name.

The publisher packs every tensor into one segment (256-byte aligned) of
version N, "NAME.vN", with a JSON manifest in "NAME.vN.m" (HOST), then
points the 8-byte HOST segment "NAME" at N and unlinks version N-1, which
lives on for readers that still hold it. Readers open the newest version
as a dict of zero-copy tensors, or copy it into tensors of their own.
Segments outlive the publisher while held (HOST and VMM memory)."""
import json
import struct

from ._common import HOST, VMM, _stream  # noqa: F401
from ._domain import Domain  # noqa: F401
from ._errors import NotFound

_ALIGN = 256


def _torch():
    import torch
    return torch


def _layout(sd):
    entries, off = [], 0
    for name, t in sd.items():
        n = t.numel() * t.element_size()
        entries.append({"name": name, "dtype": str(t.dtype).replace("torch.", ""),
                        "shape": list(t.shape), "offset": off, "nbytes": n})
        off += (n + _ALIGN - 1) // _ALIGN * _ALIGN
    return entries, max(off, _ALIGN)


def _as_bytes(buf):
    torch = _torch()
    return torch.utils.dlpack.from_dlpack(buf.__dlpack__())


def _tensor_at(raw, e):
    torch = _torch()
    return raw[e["offset"]:e["offset"] + e["nbytes"]].view(getattr(torch, e["dtype"])).view(
        e["shape"])


def publish(domain, name, sd, device=None, stream=None, timeout=30):
    """Publish state dict ``sd`` (name -> torch tensor) under ``name`` as a
    new version; returns (version, segments): keep the segments while
    this version should stay openable by name. ``device``: the GPU to hold
    it (default: that of the first tensor; None and CPU tensors: HOST)."""
    torch = _torch()
    entries, total = _layout(sd)
    first = next(iter(sd.values()), None)
    if device is None and first is not None and first.is_cuda:
        device = first.device.index
    try:
        head = domain.open_segment(name, nbytes=8, timeout=0)
    except NotFound:
        head = domain.create_segment(name, 8, kind=HOST, scratch=True)
    cur = struct.unpack("<Q", bytes(head.numpy()[:8]))[0]
    ver = cur + 1
    kind = HOST if device is None else VMM
    dev = -1 if device is None else device
    data = domain.create_segment(f"{name}.v{ver}", total, kind=kind, device=dev,
                                 exclusive=True)
    raw = _as_bytes(data)
    s = stream if stream is not None else (torch.cuda.current_stream(dev)
                                           if device is not None else None)
    ctx = torch.cuda.stream(s) if device is not None else _Null()
    with ctx:
        for e, t in zip(entries, sd.values()):
            _tensor_at(raw, e).copy_(t.detach().reshape(e["shape"]), non_blocking=True)
    data.publish(s if device is not None else None)
    man = json.dumps({"version": ver, "kind": "host" if device is None else "vmm",
                      "nbytes": total, "tensors": entries}).encode()
    mseg = domain.create_segment(f"{name}.v{ver}.m", len(man) + 8, kind=HOST, exclusive=True)
    mseg.numpy()[:8] = list(struct.pack("<Q", len(man)))
    mseg.numpy()[8:8 + len(man)] = list(man)
    mseg.publish()
    head.numpy()[:8] = list(struct.pack("<Q", ver))  # readers now find ver
    if cur:
        for old in (f"{name}.v{cur}", f"{name}.v{cur}.m"):
            try:
                domain.unlink(old)
            except NotFound:
                pass
    # The publisher's own references: the broker and readers keep the rest.
    data._keep_raw = raw
    return ver, (head, data, mseg)


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        pass


class SharedStateDict(dict):
    """name -> zero-copy tensor of one published version; ``release()``
    (or a ``with`` block) lets the version go."""

    def release(self):
        self.clear()
        for s in self._segs:
            s.release()
        self._segs = ()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.release()


def open(domain, name, device=-1, timeout=30, stream=None):  # noqa: A001
    """The newest version of state dict ``name`` as a SharedStateDict of
    zero-copy tensors (on ``device``: the GPU to map a GPU version for)."""
    head = domain.open_segment(name, wait=True, timeout=timeout)
    try:
        for _ in range(100):
            ver = struct.unpack("<Q", bytes(head.numpy()[:8]))[0]
            try:
                m = domain.open_segment(f"{name}.v{ver}.m", wait=True, timeout=timeout)
                data = domain.open_segment(f"{name}.v{ver}", wait=True, timeout=timeout,
                                           device=device, stream=stream)
                break
            except NotFound:
                continue  # republished meanwhile: take the newer one
        else:
            raise NotFound(0, "ENOENT", f"state dict {name}: no stable version")
    finally:
        head.release()
    a = m.numpy()
    n = struct.unpack("<Q", bytes(a[:8]))[0]
    man = json.loads(bytes(a[8:8 + n]))
    raw = _as_bytes(data)
    out = SharedStateDict((e["name"], _tensor_at(raw, e)) for e in man["tensors"])
    out.version = man["version"]
    out._segs = (m, data)
    return out


def copy_into(domain, name, target, stream=None, timeout=30):
    """Copy the newest version of ``name`` into the tensors of ``target``
    (a state dict of the same names, shapes and dtypes), on ``stream``."""
    torch = _torch()
    first = next(iter(target.values()))
    dev = first.device.index if first.is_cuda else -1
    with open(domain, name, device=dev, timeout=timeout, stream=stream) as sd:
        ctx = torch.cuda.stream(stream) if stream is not None else _Null()
        with ctx:
            for k, t in target.items():
                t.copy_(sd[k], non_blocking=True)
        if first.is_cuda:
            (stream or torch.cuda.current_stream()).synchronize()
        return sd.version
