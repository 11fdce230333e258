"""describe(): the attribute fast path for torch tensors says exactly what
the DLPack path says (pointer, device, dtype, shape, strides), and leaves
what it cannot describe to DLPack."""
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
    d = _tensor._from_torch(torch, t)
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


def test_fast_path_leaves_the_rest_to_dlpack():
    assert _tensor._from_torch(torch, torch.zeros(4, dtype=torch.complex64).conj()) is None
    assert _tensor._from_torch(torch, torch.zeros(4, dtype=torch.bool)) is None
    sparse = torch.zeros(3, 3).to_sparse()
    assert _tensor._from_torch(torch, sparse) is None


def test_describe_takes_grad_tensors_and_keeps_them():
    w = torch.ones(8, requires_grad=True)
    d = _tensor.describe(w)
    assert d.t[0] == w.data_ptr() and d.keep is w
