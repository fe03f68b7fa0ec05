"""The block-scaled and weight-only GEMMs on a GPU at model-like sizes (issue 47): NVFP4 x
NVFP4 and the weight-only ``matmul(x, qw)`` (x bfloat16) from CuPy and PyTorch operands,
against the float64 product of the dequantized operands (rel. L2 < 1e-5: float32
accumulation in an order the reference does not share), run twice for the same bits
(deterministic), and the caller's array library back.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

from helpers.gpu import gpu_cupy_or_skip  # noqa: E402

cp = gpu_cupy_or_skip()

import nqdq  # noqa: E402


def _data(shape, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(shape, dtype=np.float32)
    v[:, ::7] *= 8  # uneven blocks: the block scales differ
    return cp.asarray(v * np.float32(scale))


def _close(got, A, B, bias=None):
    want = A.astype(cp.float64) @ B.astype(cp.float64).T + (0 if bias is None else bias.astype(cp.float64))
    err = float(cp.linalg.norm(cp.asarray(got, cp.float64) - want) / cp.linalg.norm(want))
    assert err < 1e-5, err


@pytest.mark.parametrize("M,N,K", [(256, 512, 1024), (129, 4100, 4000), (8, 14336, 4096)])
def test_nvfp4_pair(M, N, K):
    """Sizes on the wgmma tiles (large) and the persistent ones; K = 4000: not a whole
    stage; N = 4100 a partial tile."""
    qa, qb = nqdq.quantize(_data((M, K), M), "nvfp4"), nqdq.quantize(_data((N, K), N, 0.02), "nvfp4")
    got = nqdq.matmul(qa, qb)
    assert isinstance(got, cp.ndarray) and got.dtype == np.float32 and got.shape == (M, N)
    _close(got, nqdq.dequantize(qa), nqdq.dequantize(qb))
    assert cp.array_equal(nqdq.matmul(qa, qb), got)  # deterministic


@pytest.mark.parametrize("scheme", ["int8_row", "fp8_row", "mxfp4", "mxfp8", "nvfp4"])
@pytest.mark.parametrize("M,N,K", [(16, 14336, 4096), (300, 2048, 1000)])
def test_weight_only_cupy(scheme, M, N, K):
    x = _data((M, K), K)
    xb = (x.view(cp.uint32) >> 16).astype(cp.uint16)  # bfloat16 bits
    qw = nqdq.quantize(_data((N, K), N, 0.05), scheme)
    bias = cp.linspace(-1, 1, N, dtype=cp.float32)
    got = nqdq.matmul(xb, qw, dtype="bfloat16", bias=bias)
    assert isinstance(got, cp.ndarray) and got.dtype == np.float32 and got.shape == (M, N)
    _close(got, (xb.astype(cp.uint32) << 16).view(cp.float32), nqdq.dequantize(qw), bias)
    assert cp.array_equal(nqdq.matmul(xb, qw, dtype="bfloat16", bias=bias), got)


@pytest.mark.parametrize("scheme", ["int4_group", "int4_asym"])
@pytest.mark.parametrize("M,N,K", [(1, 14336, 4096), (16, 14336, 4096), (64, 4096, 14336), (300, 2000, 1024)])
def test_weight_only_int4_in_registers(scheme, M, N, K):
    """The in-register int4 kernel at decode shapes (K = 14336: 112 chunks, 8 warps a CTA)
    and a larger M over several token blocks (N = 2000: a partial row block)."""
    x = _data((M, K), K + 1)
    xb = (x.view(cp.uint32) >> 16).astype(cp.uint16)
    qw = nqdq.quantize(_data((N, K), N + 1, 0.05), scheme)
    got = nqdq.matmul(xb, qw, dtype="bfloat16")
    assert isinstance(got, cp.ndarray) and got.dtype == np.float32 and got.shape == (M, N)
    _close(got, (xb.astype(cp.uint32) << 16).view(cp.float32), nqdq.dequantize(qw))
    assert cp.array_equal(nqdq.matmul(xb, qw, dtype="bfloat16"), got)


def test_torch_operands_give_torch_results():
    torch = pytest.importorskip("torch")
    x = torch.randn(32, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 2048, device="cuda") * 0.05
    for scheme in ("nvfp4", "int8_row", "int4_group"):
        qw = nqdq.quantize(w, scheme)
        got = nqdq.matmul(x, qw, out_dtype="bfloat16")
        assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16 and got.shape == (32, 1024)
        want = x.double() @ torch.as_tensor(nqdq.dequantize(qw), device="cuda").double().T
        err = float((got.double() - want).norm() / want.norm())
        assert err < 2.0**-8, err  # bfloat16 output: one rounding of each element
    qa = nqdq.quantize(x.float(), "nvfp4")
    qb = nqdq.quantize(w, "nvfp4")
    got = nqdq.matmul(qa, qb)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    _close(cp.asarray(got), cp.asarray(nqdq.dequantize(qa)), cp.asarray(nqdq.dequantize(qb)))
