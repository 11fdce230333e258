"""The receiving side of the Python quick start (README): joins domain
"hello" (sys.argv[1] names another), receives hello_send.py's array on
channel "greetings" as a view of the sender's memory and prints its sum."""
import sys

import numpy as np

import gpuipc

with gpuipc.Domain(sys.argv[1] if len(sys.argv) > 1 else "hello") as d, \
        d.channel("greetings", timeout=10) as ch:
    with ch.recv(timeout=10) as view:      # given back at the end of the block
        a = np.from_dlpack(view)           # torch/cupy.from_dlpack too
        print(f"hello_recv.py: {a.shape[0]}x{a.shape[1]} {a.dtype}, "
              f"sum {a.sum():.0f}")
        del a
