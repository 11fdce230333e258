"""The sending side of the Python quick start (README): joins domain
"hello" (sys.argv[1] names another), sends a 4x4 float32 array on channel
"greetings" without copying it, and waits until hello_recv.py lets go."""
import sys

import gpuipc

with gpuipc.Domain(sys.argv[1] if len(sys.argv) > 1 else "hello") as d, \
        d.channel("greetings", timeout=10) as ch:
    buf = gpuipc.empty((4, 4), "float32")  # memory others can map
    buf.numpy().flat[:] = range(16)        # or send any numpy/torch/CuPy array
    ticket = ch.send(buf)
    ch.wait(ticket, timeout=10)            # until the receiver let go
    print("hello_send.py: sent 4x4 float32, the receiver gave it back")
