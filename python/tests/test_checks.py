"""Python input checked where it comes in: tickets and timeouts; use
after close. In one process, both ends of a channel in it (HOST
memory)."""
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gpuipc

# ---- C: tickets and timeouts -----------------------------------------------

def test_tickets_out_of_range_are_refused(pair):
    """A ticket is 0 .. 2**64 - 1: a negative or larger one is a
    ValueError (it no longer wraps onto a real ticket), a bool or float a
    TypeError."""
    tx, rx = pair
    t = tx.send(np.zeros(4))
    for bad in (-1, -t, t + 2 ** 64, 2 ** 70):
        with pytest.raises(ValueError, match="ticket"):
            tx.done(bad)
        with pytest.raises(ValueError, match="ticket"):
            tx.wait(bad, timeout=0)
    for bad in (True, 1.0, "1"):
        with pytest.raises(TypeError, match="ticket"):
            tx.done(bad)
    rx.recv(timeout=5).release()
    assert tx.done(t, timeout=5)


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, -1, -0.5, True, False],
                         ids=repr)
def test_timeouts_must_be_finite_seconds(bad, pair):
    """Timeouts are None (forever) or finite seconds >= 0: infinity, NaN,
    negatives and bools are refused, naming the timeout, before the call
    does anything."""
    err = TypeError if isinstance(bad, bool) else ValueError
    with pytest.raises(err, match="timeout"):
        gpuipc.Domain("never-joined", timeout=bad)
    tx, rx = pair
    t = tx.send(np.zeros(4))
    with pytest.raises(err, match="timeout"):
        rx.recv(timeout=bad)
    with pytest.raises(err, match="timeout"):
        tx.done(t, timeout=bad)
    with rx.recv(timeout=None) as v:  # None stays "forever"
        assert v.shape == (4,)


# ---- D: use after close ------------------------------------------------------

def test_use_after_close_is_a_value_error(dom, pair):
    """Every use of a closed, released or left object raises gpuipc.Closed,
    a ValueError (as a closed file does)."""
    assert issubclass(gpuipc.Closed, ValueError)
    assert issubclass(gpuipc.Closed, gpuipc.Error)
    tx, rx = pair
    tx.send(np.zeros(4))
    v = rx.recv(timeout=5)
    v.release()
    b = gpuipc.empty(4)
    b.release()
    tx.close()
    for call in (lambda: tx.send(np.zeros(4)), lambda: tx.info(), lambda: v.numpy(),
                 lambda: np.asarray(v), lambda: b.numpy(), lambda: b.export()):
        with pytest.raises(gpuipc.Closed):
            call()


def test_domain_of_the_parent_is_a_value_error(env):
    """A fork() child using its parent's domain gets gpuipc.Closed
    (GPUIPC_E_CLOSED), which is a ValueError."""
    code = textwrap.dedent("""
        import os, gpuipc
        d = gpuipc.Domain("forked")
        pid = os.fork()
        if pid == 0:
            try:
                d.stat("x")
                os._exit(3)
            except ValueError as e:
                os._exit(0 if isinstance(e, gpuipc.Closed) else 4)
            except BaseException:
                os._exit(5)
        _, st = os.waitpid(pid, 0)
        d.leave()
        print(os.waitstatus_to_exitcode(st))
        """)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0"]
