"""describe(): the torch tensor reader in C says exactly what the DLPack
path says (pointer, device, dtype, shape, strides), and leaves what it
cannot describe to DLPack; timeouts in seconds as the library's ms."""
import pytest

torch = pytest.importorskip("torch")
from gpuipc import _tensor  # noqa: E402


def _by_dlpack(t):
    from gpuipc import _gpuipc as _c
    cap = t.__dlpack__()
    d, _hold = _c.dlpack_take(cap)
    ptr, dev_type, dev_id, dtype, shape, strides, off = d
    n = len(shape)
    if strides is None:  # DLPack may omit compact strides
        strides, m = [0] * n, 1
        for i in reversed(range(n)):
            strides[i], m = m, m * shape[i]
    return ptr + off, dev_type, dev_id, tuple(dtype), tuple(shape), tuple(strides)


def _fast(t):
    d = _tensor._from_torch(t)
    assert d is not None, f"fast path refused {t.dtype} {tuple(t.shape)}"
    ptr, dev_type, dev_id, dtype, shape, strides, off = d.t
    assert off == 0
    return ptr, dev_type, dev_id, tuple(dtype), tuple(shape), tuple(strides)


DTYPES = [torch.float16, torch.float32, torch.float64, torch.bfloat16, torch.int8,
          torch.int16, torch.int32, torch.int64, torch.uint8, torch.complex64,
          torch.complex128]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fast_path_matches_dlpack(dtype):
    base = torch.zeros((6, 10, 4), dtype=dtype)
    cases = [base, base[2:], base[:, 3:7], base.transpose(0, 2), base[1, 2],
             base[::2, ::3], base.reshape(-1)[5:17], base[0, 0, 0]]
    for t in cases:
        assert _fast(t) == _by_dlpack(t), (dtype, tuple(t.shape), t.stride())


def test_fast_path_reads_bool_which_old_dlpack_refuses():
    t = torch.zeros((3, 2), dtype=torch.bool)[1:]
    assert _fast(t) == (t.data_ptr(), 1, 0, (6, 8, 1), (2, 2), (2, 1))


def test_fast_path_leaves_the_rest_to_dlpack():
    assert _tensor._from_torch(torch.zeros(4, dtype=torch.complex64).conj()) is None
    assert _tensor._from_torch(torch.zeros(4)._neg_view()) is None
    q = torch.quantize_per_tensor(torch.zeros(4), 0.1, 0, torch.qint8)
    assert _tensor._from_torch(q) is None  # a dtype the reader does not know
    sparse = torch.zeros(3, 3).to_sparse()
    assert _tensor._from_torch(sparse) is None
    assert _tensor._from_torch(torch.zeros(3, device="meta")) is None
    assert _tensor._from_torch([1, 2]) is None  # not a tensor at all


def test_describe_takes_grad_tensors_and_keeps_them():
    w = torch.ones(8, requires_grad=True)
    d = _tensor.describe(w)
    assert d.t[0] == w.data_ptr() and d.keep is w


def test_timeouts_in_seconds_become_whole_milliseconds():
    from gpuipc._common import DEFAULT, _ms
    assert _ms(None) == -1 and _ms(DEFAULT) == -2 and _ms(0) == 0 and _ms(0.0) == 0
    assert _ms(1e-6) == 1 and _ms(0.0015) == 2 and _ms(2) == 2000 and _ms(1.5) == 1500
    assert _ms(1e12) == 2**31 - 1
    for bad in (-1, -0.001, float("nan")):
        with pytest.raises(ValueError):
            _ms(bad)
    with pytest.raises(TypeError):
        _ms("1")
