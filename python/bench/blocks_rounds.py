"""Block batches from Python, a round at a time: 1,024 scattered 16 KiB
rows of a VMM cache on GPU 0 (a torch uint8 tensor of a gpuipc buffer)
sent with Channel.send_blocks into scattered rows of one on the last GPU
(Channel.recv_blocks), each round timed at the sender from send_blocks
until the batch is free (done); the indices given as FORM: a CPU torch
tensor (torch), a numpy array (numpy) or a list of ints (list). Two
processes, started by hand on one domain name:

  python3 python/bench/blocks_rounds.py recv DOMAIN FORM &
  python3 python/bench/blocks_rounds.py send DOMAIN FORM

The sender prints "RESULT pyblk FORM <median us>" (rounds 11 to 60); the
receiver checks that every destination row holds the sender's bytes."""
import sys, time, statistics as st, numpy as np, torch, gpuipc
role, dom, form = sys.argv[1], sys.argv[2], sys.argv[3]
ROWS, ROW, N, IT = 4096, 16384, 1024, 60
dev = 0 if role == "send" else torch.cuda.device_count() - 1
torch.cuda.set_device(dev)
buf = gpuipc.empty((ROWS, ROW), "uint8", kind=gpuipc.VMM, device=dev)
t = torch.from_dlpack(buf); t.fill_(7 if role == "send" else 0)
rows = np.random.default_rng(1 if role == "send" else 2).permutation(ROWS)[:N]
idx = {"torch": torch.from_numpy(rows), "numpy": rows, "list": rows.tolist()}[form]
s = torch.cuda.Stream()
with gpuipc.Domain(dom) as d, d.channel("b", timeout=60) as ch:
    ts = []
    with torch.cuda.stream(s):
        for i in range(IT):
            if role == "send":
                t0 = time.perf_counter()
                k = ch.send_blocks(t, idx, stream=s)
                ch.done(k, timeout=60)
                ts.append((time.perf_counter() - t0) * 1e6)
            else:
                ch.recv_blocks(t, idx, timeout=60, stream=s)
    s.synchronize()
    if role == "send":
        print("RESULT pyblk %s %.1f" % (form, st.median(ts[10:])))
    else:
        assert bool((t[torch.from_numpy(rows).cuda()] == 7).all())
