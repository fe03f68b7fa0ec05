"""The amax by-product on a GPU at model sizes (``quantize(x, scheme, scale=s, amax_out=a)``,
issue 46 item 2): CuPy and PyTorch arrays, float32 / float16 / bfloat16, the one-pass kernels
(whole units) and the separate pass (rows that are not whole units); the amax bit-exact
against x's bits read here, the codes and scales those of the plain static call, ``a``
written in stream order on a non-default stream, and a NaN anywhere in a large tensor.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

from helpers.gpu import gpu_cupy_or_skip  # noqa: E402

cp = gpu_cupy_or_skip()

import nqdq  # noqa: E402

F32 = np.float32


def _expected(xh, finite):
    b = np.asarray(xh).astype(F32).reshape(-1).view(np.uint32) & np.uint32(0x7FFFFFFF)
    if finite:
        b = b[b < 0x7F800000]
    return np.uint32(b.max())


def _input(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape, dtype=F32) * np.exp2(rng.uniform(-4, 4, (shape[0], 1)))).astype(F32)
    return x.astype(dtype)


def _device(xh, dtype):
    if dtype == ml_dtypes.bfloat16:
        return cp.asarray(xh.view(np.uint16)), "bfloat16"
    return cp.asarray(xh), None


@pytest.mark.parametrize("scheme,scale", [("fp8_tensor", 0.01), ("nvfp4", 0.0005)])
@pytest.mark.parametrize("shape,dtype", [((1024, 7168), ml_dtypes.bfloat16), ((8192, 8192), ml_dtypes.bfloat16),
                                         ((512, 4096), np.float16), ((512, 4096), F32),
                                         ((333, 1000), F32)])  # fmt: skip
def test_cupy(scheme, scale, shape, dtype):
    xh = _input(shape, dtype, seed=shape[0] + len(scheme))
    x, dt = _device(xh, dtype)
    a = cp.full(1, -1.0, cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        q = nqdq.quantize(x, scheme, scale=scale, amax_out=a, dtype=dt)
        got = a.get()  # on the stream the call ran on
    plain = nqdq.quantize(x, scheme, scale=scale, dtype=dt)
    assert got.view(np.uint32)[0] == _expected(xh, finite=scheme == "nvfp4")
    assert cp.array_equal(q.codes.view(cp.uint8), plain.codes.view(cp.uint8))
    assert cp.array_equal(q.scales.view(cp.uint8), plain.scales.view(cp.uint8))


@pytest.mark.parametrize("scheme", ["fp8_tensor", "nvfp4"])
def test_nan_far_in(scheme):
    """One NaN (and one inf) near the end of a 64 M element tensor: the float amax is NaN
    (its payload), NVFP4's skips both."""
    xh = _input((8192, 8192), ml_dtypes.bfloat16, seed=5)
    xh[8190, 8000] = np.nan
    xh[17, 3] = -np.inf
    x, dt = _device(xh, ml_dtypes.bfloat16)
    a = cp.zeros(1, cp.float32)
    nqdq.quantize(x, scheme, scale=0.01, amax_out=a, dtype=dt)
    assert a.get().view(np.uint32)[0] == _expected(xh, finite=scheme == "nvfp4")


def test_repeated_calls_reset():
    """Each call records its own input's amax (the plan zeroes ``a`` first): a smaller
    amax after a larger one."""
    big = _input((1024, 7168), ml_dtypes.bfloat16, seed=1)
    small = (big.astype(F32) / 64).astype(ml_dtypes.bfloat16)
    a = cp.zeros(1, cp.float32)
    for xh in (big, small, big, small):
        x, dt = _device(xh, ml_dtypes.bfloat16)
        nqdq.quantize(x, "fp8_tensor", scale=0.01, amax_out=a, dtype=dt)
        assert a.get().view(np.uint32)[0] == _expected(xh, finite=False)


def test_torch():
    torch = pytest.importorskip("torch")
    xh = _input((1024, 7168), F32, seed=9)
    x = torch.from_numpy(xh).cuda().to(torch.bfloat16)
    a = torch.zeros(1, dtype=torch.float32, device="cuda")
    q = nqdq.quantize(x, "nvfp4", scale=0.001, amax_out=a)
    assert isinstance(q.codes, torch.Tensor)
    want = _expected(x.float().cpu().numpy(), finite=True)
    assert a.cpu().numpy().view(np.uint32)[0] == want


def test_wrong_gpu():
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    x = cp.ones((64, 128), cp.float32)
    with cp.cuda.Device(1):
        a = cp.zeros(1, cp.float32)
    with pytest.raises(ValueError, match="amax_out"):
        nqdq.quantize(x, "fp8_tensor", scale=0.1, amax_out=a)
