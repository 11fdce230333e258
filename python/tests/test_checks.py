"""Python input checked where it comes in: tickets and timeouts. In one
process, both ends of a channel in it (HOST memory)."""
import math

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
