"""How long gpuipc memory stays mapped in Python: while anything made
from it lives. Each case runs in a process of its own, so that a crash
(SIGSEGV: memory unmapped under an array) fails the test instead of
ending pytest."""
import subprocess
import sys
import textwrap

import pytest

import gpuipc

N = 1 << 20  # float32 elements: 4 MiB, unmapped when released


def run_py(env, code, timeout=60):
    """Run ``code`` in a new interpreter; its stdout's last line."""
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, (f"exited with {p.returncode} "
                               f"(-11: SIGSEGV)\n{p.stderr[-2000:]}")
    return p.stdout.strip().splitlines()[-1]


# Each makes `a` from Buffer `b` (of N float32 ones), then releases `b`
# (or leaves its with block); `a` is then read and written.
BUFFER_CASES = {
    "numpy": "a = b.numpy()",
    "np.asarray": "a = np.asarray(b)",
    "np.from_dlpack": "a = np.from_dlpack(b)",
    "torch.from_dlpack": "import torch; a = torch.from_dlpack(b).numpy()",
    "sub-view": "a = b.view('float32', (N // 2,), offset=4 * (N // 2)).numpy()",
    "sub-view kept": "s = b.view('float32', (N,)); a = s",
    "slice of numpy()": "a = b.numpy()[::2]",
}


@pytest.mark.parametrize("make", list(BUFFER_CASES), ids=list(BUFFER_CASES))
def test_arrays_outlive_buffer_release(env, make):
    """An array made from a Buffer keeps its memory mapped after
    Buffer.release(): reading and writing it neither crashes nor sees
    other memory."""
    if "torch" in make:
        pytest.importorskip("torch")
    out = run_py(env, f"""
        import gc, numpy as np, gpuipc
        N = {N}
        b = gpuipc.empty((N,), "float32")
        b.numpy()[:] = 1
        {BUFFER_CASES[make]}
        b.release()
        del b
        gc.collect()
        x = gpuipc.empty((N,), "float32")  # may come where b was, if unmapped
        x.numpy()[:] = 7
        if isinstance(a, gpuipc.Buffer):
            a = a.numpy()
        a = a + 1
        print(float(a.sum()), float(x.numpy().sum()))
        """)
    n = N // 2 if make in ("sub-view", "slice of numpy()") else N
    assert out == f"{float(2 * n)} {float(7 * N)}"


def test_array_outlives_its_with_block(env):
    """The common form: an array made inside ``with gpuipc.empty(...) as
    b:`` used after the block."""
    out = run_py(env, f"""
        import numpy as np, gpuipc
        with gpuipc.empty(({N},), "float32") as b:
            a = b.numpy()
            a[:] = 3
            t = np.from_dlpack(b)
        print(float(a.sum()), float(t.sum()))
        """)
    assert out == f"{3.0 * N} {3.0 * N}"


def test_memory_goes_with_the_last_array(env):
    """release() with arrays alive defers the unmapping to the last one;
    with none, it unmaps at once (the range leaves /proc/self/maps)."""
    out = run_py(env, f"""
        import gc, gpuipc
        def mapped(p):  # a gpuipc HOST buffer (a memfd) is mapped at p
            with open("/proc/self/maps") as f:
                for line in f:
                    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                    if lo <= p < hi:
                        return "memfd:" in line
            return False
        b = gpuipc.empty(({N},), "float32"); p = b.ptr
        a = b.numpy(); s = b.view("uint8", (16,))
        b.release()
        r = [mapped(p)]
        del a; gc.collect(); r.append(mapped(p))
        s.release(); r.append(mapped(p))
        c = gpuipc.empty(({N},), "float32"); q = c.ptr
        c.release(); r.append(mapped(q))
        print(r)
        """)
    assert out == "[True, True, False, False]"


def test_arrays_of_a_dropped_buffer_cross_without_copy(env):
    """An array keeps the Buffer it was made from, unreleased: sent, it
    crosses as that buffer (the view received in this same process is
    that memory), not staged; so does one whose Buffer was released: the
    array's own reference keeps the buffer, which the library still finds
    by address."""
    pytest.importorskip("torch")
    out = run_py(env, """
        import threading, numpy as np, torch, gpuipc
        d = gpuipc.Domain("dropped")
        ends = {}
        th = threading.Thread(target=lambda: ends.setdefault("rx", d.channel("p", timeout=10)))
        th.start()
        tx = d.channel("p", timeout=10)
        th.join()
        rx = ends["rx"]
        a = gpuipc.empty(64, "float32").numpy()
        t = torch.from_dlpack(gpuipc.empty(64, "float32"))
        a[:] = 5
        t[:] = 6
        b = gpuipc.empty(64, "float32")
        c = b.numpy()
        c[:] = 7
        b.release()
        where = []
        for x in (a, t, c):
            ptr = x.data_ptr() if x is t else x.__array_interface__["data"][0]
            tx.send(x)
            with rx.recv(timeout=5) as v:
                assert (v.numpy() == np.asarray(x)).all()
                where.append(v.data_ptr == ptr)
        print(where)
        """)
    assert out == "[True, True, True]"


def test_object_dtype_refused():
    """An object dtype over shared memory would read its bytes as
    pointers: Buffer and empty refuse it (and other dtypes that cannot be
    sent) before allocating."""
    for dtype in ("object", "O", "U4", "datetime64[ns]", "V2", [("a", "u1"), ("b", "u1")]):
        with pytest.raises(ValueError, match="dtype"):
            gpuipc.Buffer(4096, dtype=dtype)
        with pytest.raises(ValueError, match="dtype"):
            gpuipc.empty((4,), dtype)
    with pytest.raises(ValueError, match="dtype"):
        gpuipc.empty(4).view("object", (4,))


SENDER = """
import sys, numpy as np, gpuipc
with gpuipc.Domain("life") as d, d.channel("c", timeout=30) as ch:
    if sys.argv[1] == "buffer":  # zero-copy: the receiver maps this buffer
        b = gpuipc.empty(({n},), "float32")
        b.numpy()[:] = 1
        ch.send(b)
    else:  # staged through the channel's own memory
        ch.send(np.ones({n}, np.float32))
    ch.recv(timeout=30).release()  # the receiver let go, closing
"""

RECEIVER = """
import gc, numpy as np, gpuipc
d = gpuipc.Domain("life")
ch = d.channel("c", timeout=30)
v = ch.recv(timeout=30)
{make}
ch.send(np.zeros(1, np.int8))
ch.close()
d.leave()
gc.collect()
a = a + 1
print(float(a.sum()))
"""

# Each makes `a` from received view `v`, then gives `v` back.
VIEW_CASES = {
    "np.asarray": "a = np.asarray(v); v.release()",
    "with np.asarray": "with v:\n    a = np.asarray(v)",
    "numpy": "a = v.numpy(); v.release()",
    "slice of numpy": "a = v.numpy()[1:]; v.release()",
}


@pytest.mark.parametrize("path", ["buffer", "staged"])
@pytest.mark.parametrize("make", list(VIEW_CASES), ids=list(VIEW_CASES))
def test_arrays_outlive_view_release(env, tmp_path, make, path):
    """An array made from a received view keeps the view's memory mapped
    after release(), the channel's close and leaving the domain."""
    sender = tmp_path / "sender.py"
    sender.write_text(SENDER.format(n=N))
    tx = subprocess.Popen([sys.executable, str(sender), path], env=env)
    try:
        out = run_py(env, RECEIVER.format(make=VIEW_CASES[make]))
        assert tx.wait(timeout=60) == 0
    finally:
        if tx.poll() is None:
            tx.kill()
            tx.wait()
    n = N - 1 if "slice" in make else N
    assert out == str(2.0 * n)
