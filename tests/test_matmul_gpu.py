"""The GEMM kernels and tensor-core intrinsics on a real GPU (``pytest -m gpu`` with
NQDQ_TEST_GPU=1; benchmarks/gemm_peers.py runs these and the timings in one call).

* the intrinsic probe of tests/test_mma.py on hardware: equal to the same NumPy result the
  simulator twins equal there (int8 exactly; fp8 to the tensor core's float32 summation);
* every scheme pair, CuPy operands from nqdq.quantize on the GPU, against the reference
  at shapes that are multiples of no tile (and M = 1): float32 rel. L2 < 1e-5;
* epilogues (bias, ReLU, GELU, float16 / bfloat16 bits) and the seed acceptance test.
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

if os.environ.get("NQDQ_TEST_GPU") != "1":
    pytest.skip("GPU tests need NQDQ_TEST_GPU=1 (and a CUDA GPU with CuPy)", allow_module_level=True)
cp = pytest.importorskip("cupy")
try:
    if cp.cuda.runtime.getDeviceCount() < 1:
        raise RuntimeError
except Exception:
    pytest.skip("no CUDA device", allow_module_level=True)

import nqdq  # noqa: E402
from nqdq.matmul import matmul  # noqa: E402

from test_matmul import SCHEME_PAIRS, assert_ulp_close, rel_l2  # noqa: E402
from test_mma import MMA_CASES, make_mma_probe, mma_operands, mma_stub  # noqa: E402

RNG = np.random.default_rng(77)


@pytest.mark.parametrize("kind", MMA_CASES)
def test_mma_hardware_matches_numpy(kind):
    a, b, want = mma_operands(kind, np.random.default_rng(3))
    d = cp.zeros(16 * 8, np.int32 if kind in ("s8s8", "u8s8") else np.float32)
    make_mma_probe(mma_stub(kind))[1, 32](cp.asarray(a), cp.asarray(b), d)
    got = d.get().reshape(16, 8)
    if want.dtype == np.int32:
        np.testing.assert_array_equal(got, want)
    else:  # hardware float32 accumulation order vs one float64 sum rounded once
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def gpu_operands(M, N, K, sa, sb, rng=RNG):
    x = rng.standard_normal((M, K)).astype(np.float32)
    x[:, ::7] *= 4
    w = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)
    qa, qb = nqdq.quantize(cp.asarray(x), sa), nqdq.quantize(cp.asarray(w), sb)
    assert isinstance(qa.codes, cp.ndarray)
    return x, w, qa, qb


def host_q(q):
    from dataclasses import replace

    h = lambda a: None if a is None else a.get()  # noqa: E731
    return replace(q, codes=h(q.codes), scales=h(q.scales), zero_points=h(q.zero_points))


@pytest.mark.parametrize("sa,sb", SCHEME_PAIRS + [("e4m3", "e5m2"), ("e5m2", "e5m2")])
@pytest.mark.parametrize("shape", [(257, 383, 1000), (1, 4096, 512), (130, 136, 4096)])
def test_gemm_gpu_matches_reference(sa, sb, shape):
    x, w, qa, qb = gpu_operands(*shape, sa, sb)
    got = matmul(qa, qb)
    assert isinstance(got, cp.ndarray) and got.shape == shape[:1] + shape[1:2]
    want = matmul(host_q(qa), host_q(qb), device="cpu")
    assert rel_l2(got.get(), want) < 1e-5


@pytest.mark.parametrize(
    "sa,sb,kw",
    [
        ("int8_row", "int8_row", dict(out_dtype="float16", activation="relu", bias=True, alpha=0.25)),
        ("int8_asym", "int8_row", dict(out_dtype="bfloat16", activation="gelu", bias=True)),
        ("fp8_1x128", "fp8_128x128", dict(out_dtype="bfloat16", bias=True, alpha=2.0)),
        ("fp8_row", "fp8_row", dict(out_dtype="bfloat16", activation="gelu")),
    ],
)
def test_gemm_gpu_epilogues(sa, sb, kw):
    M, N, K = 300, 520, 777
    x, w, qa, qb = gpu_operands(M, N, K, sa, sb)
    kw = dict(kw)
    if kw.pop("bias", False):
        kw["bias"] = RNG.standard_normal(N).astype(np.float32)
    got = matmul(qa, qb, bias=None if "bias" not in kw else cp.asarray(kw["bias"]), **{k: v for k, v in kw.items() if k != "bias"})
    want = matmul(host_q(qa), host_q(qb), device="cpu", **kw)
    got = got.get()
    if want.dtype == ml_dtypes.bfloat16:
        assert got.dtype == np.uint16  # bfloat16 bits on the GPU, as nqdq.dequantize returns them
        got = got.view(ml_dtypes.bfloat16)
    assert_ulp_close(got, want, want.dtype.type)


def test_seed_acceptance_gpu():
    rng = np.random.default_rng(1024)
    x = rng.standard_normal((512, 1024)).astype(np.float32)
    w = rng.standard_normal((512, 1024)).astype(np.float32)
    qa = nqdq.quantize(cp.asarray(x), "int8", granularity="tensor")
    qb = nqdq.quantize(cp.asarray(w), "int8_row")
    err = rel_l2(matmul(qa, qb).get(), x @ w.T)
    assert err < 0.03, err


def test_numpy_operands_with_device_cuda():
    rng = np.random.default_rng(9)
    x, w = rng.standard_normal((33, 160)).astype(np.float32), rng.standard_normal((48, 160)).astype(np.float32)
    qa, qb = nqdq.quantize(x, "fp8_row"), nqdq.quantize(w, "fp8_row")
    got = matmul(qa, qb, device="cuda")
    assert isinstance(got, np.ndarray)
    assert rel_l2(got, matmul(qa, qb, device="cpu")) < 1e-5
