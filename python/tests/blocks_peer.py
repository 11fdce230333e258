"""The two ends of test_blocks.py's block batches across processes:
`blocks_peer.py send|recv DOMAIN KIND`, KIND host (HOST buffers) or gpu
(LEGACY buffers of the fake CUDA driver's device 0, GPUIPC_CUDA_LIB).
Each prints one JSON line at the end; every byte is derived from seeds, so
the receiver checks what crossed on its own.

The sender sends a plain tensor (message 1), then BATCHES batches of
blocks of a (ROWS, ROW) uint8 "KV cache layer" (a numpy array of a gpuipc
buffer on HOST, the Buffer itself on the fake GPU) on a channel of depth 2:
batch b is the rows src_rows(b), each filled with row_bytes(b, k) first.
The receiver puts block k of batch b into row dst_rows(b)[k] of its own
layer; before the first batch it checks the refusals (nothing taken)."""
import json
import sys

import numpy as np

import gpuipc

ROWS, ROW, BATCHES, PER = 2048, 1024, 5, 400


def src_rows(b):
    """Batch b's source rows: disjoint between batches, scattered."""
    return np.random.default_rng(1).permutation(ROWS)[b * PER:(b + 1) * PER]


def dst_rows(b):
    return np.random.default_rng(100 + b).permutation(ROWS)[:PER]


def row_bytes(b, k):
    return np.random.default_rng(1000 * b + k).integers(0, 256, ROW, dtype=np.uint8)


def layer(kind):
    if kind == "host":
        buf = gpuipc.empty((ROWS, ROW), "uint8")
        return buf, buf.numpy()
    buf = gpuipc.empty((ROWS, ROW), "uint8", kind=gpuipc.LEGACY, device=0)
    return buf, buf


def put_rows(kind, buf, arr, rows, data):
    if kind == "host":
        arr[rows] = data
        return
    for r, d in zip(rows, data):
        gpuipc._gpuipc.memcpy(buf.ptr + int(r) * ROW, d.ctypes.data, ROW, 0, None)


def get_all(kind, buf, arr):
    if kind == "host":
        return arr
    out = np.empty((ROWS, ROW), np.uint8)
    gpuipc._gpuipc.memcpy(out.ctypes.data, buf.ptr, ROWS * ROW, 0, 2)
    return out


def send(dom, kind):
    buf, arr = layer(kind)
    with gpuipc.Domain(dom) as d:
        ch = d.channel("blocks", timeout=30, depth=2)
        ch.send(np.arange(16, dtype=np.uint8))
        tickets = []
        for b in range(BATCHES):
            rows = src_rows(b)
            put_rows(kind, buf, arr, rows, [row_bytes(b, k) for k in range(PER)])
            # numpy indices for the first batches, a list for the last
            idx = rows if b < BATCHES - 1 else [int(r) for r in rows]
            tickets.append(ch.send_blocks(arr, idx, stream=2 if kind == "gpu" else None))
        ch.done(tickets[-1], timeout=30)
        info = ch.info()
        print(json.dumps({"tickets": tickets, "sent": info["sent"],
                          "buffers_sent": info["buffers_sent"]}), flush=True)
        ch.close()


def refusals(ch, dst):
    out = {}
    for name, idx in (("range", [0, ROWS]), ("dup", [3, 5, 3]),
                      ("negative", [-1]), ("type", [1.5])):
        try:
            ch.recv_blocks(dst, idx, timeout=0)
            out[name] = "none"
        except Exception as e:  # noqa: BLE001 - what it raised is the answer
            out[name] = [type(e).__name__, isinstance(e, ValueError), str(e)]
    return out


def recv(dom, kind):
    buf, arr = layer(kind)
    fake = None
    if kind == "gpu":
        import ctypes
        import os
        fake = ctypes.CDLL(os.environ["GPUIPC_CUDA_LIB"])
    with gpuipc.Domain(dom) as d:
        ch = d.channel("blocks", timeout=30)
        out = {"refused": refusals(ch, arr)}
        # Message 1 is a tensor: refused by recv_blocks, still there.
        try:
            ch.recv_blocks(arr, dst_rows(0), timeout=30)
        except ValueError as e:
            out["tensor_refused"] = str(e)
        t = ch.recv(timeout=30)
        out["tensor"] = np.asarray(t).tolist() == list(range(16))
        t.release()
        # Batch 1: the wrong calls are refused and it stays.
        try:
            ch.recv(timeout=30)
        except ValueError as e:
            out["batch_refused"] = str(e)
        try:
            ch.recv_blocks(arr, dst_rows(0)[:-1], timeout=30)
        except ValueError as e:
            out["count_refused"] = str(e)
        batched0 = fake.fake_cuda_batch_copies() if fake else 0
        launched0 = fake.fake_cuda_block_launches() if fake else 0
        ok = []
        for b in range(BATCHES):
            idx = dst_rows(b)
            if b == 1:
                try:
                    import torch
                    idx = torch.from_numpy(idx.copy())
                except ImportError:
                    pass
            ch.recv_blocks(arr, idx, timeout=30, stream=2 if kind == "gpu" else None)
            got = get_all(kind, buf, arr)
            ok.append(all(np.array_equal(got[r], row_bytes(b, k))
                          for k, r in enumerate(dst_rows(b))))
        out["ok"] = ok
        out["batched"] = (fake.fake_cuda_batch_copies() - batched0) if fake else None
        out["launched"] = (fake.fake_cuda_block_launches() - launched0) if fake else None
        out["received"] = ch.info()["received"]
        print(json.dumps(out), flush=True)
        ch.close()


if __name__ == "__main__":
    {"send": send, "recv": recv}[sys.argv[1]](sys.argv[2], sys.argv[3])
