"""The GEMM kernels and tensor-core intrinsics on a real GPU (``pytest -m gpu`` with
NQDQ_TEST_GPU=1; benchmarks/gemm_peers.py runs these and the timings in one call).

* the intrinsic probe of tests/test_mma.py on hardware: equal to the same NumPy result the
  simulator twins equal there (int8 exactly; fp8 to the tensor core's float32 summation);
* every scheme pair, CuPy operands from nqdq.quantize on the GPU, against the reference
  at shapes that are multiples of no tile (and M = 1), for both kernel families: the
  default (wgmma on sm_90) and mma.sync (``GPU_CONFIG``); float32 output;
* epilogues (bias, ReLU, GELU, float16 / bfloat16 bits) and the seed acceptance test.

Tolerances (float32 output, rel. L2 vs the float64 reference): 1e-5 wherever the tensor
core sums exactly (int8: int32; fp8 through mma.sync: measured ~1e-7 on the H100, i.e. a
float32 adder). FP8 through wgmma is not such a case: the H100's fp8 wgmma adds with fewer
bits than float32 (DeepSeek-V3 reports ~14 on H800). The kernel promotes each 128 of K
into float32, which keeps the error independent of K: measured 0.8-1.3e-4 at K = 1000 to
8192 (``benchmarks/gemm_peers.py --accuracy``, docs/design/gemm.md); the bound is 5e-4.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

from helpers.gpu import gpu_cupy_or_skip  # noqa: E402

cp = gpu_cupy_or_skip()

import nqdq  # noqa: E402
from nqdq.matmul import matmul  # noqa: E402

from helpers.gemm import SCHEME_PAIRS, gemm_kwargs, rel_l2  # noqa: E402
from helpers.probes import MMA_CASES, make_mma_probe, mma_operands, mma_stub  # noqa: E402



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


def test_mbarrier_hardware_matches_twins():
    """The mbarrier probe of tests/test_mma.py on hardware: the same hand-derived outputs
    the simulated twins produce there."""
    from helpers.probes import MBAR_THREADS, make_mbarrier_probe, mbarrier_expected

    src = np.random.default_rng(5).integers(0, 256, MBAR_THREADS * 16, dtype=np.uint8)
    out = cp.full((MBAR_THREADS, 19), -1, np.int32)
    make_mbarrier_probe()[1, MBAR_THREADS](cp.asarray(src), out)
    np.testing.assert_array_equal(out.get(), mbarrier_expected(src))


def _rng(*case):
    """A generator of this test case's own (the data never depend on which tests ran before)."""
    import zlib

    return np.random.default_rng(zlib.crc32(repr(case).encode()))


def gpu_operands(M, N, K, sa, sb, rng=None):
    rng = _rng(M, N, K, sa, sb) if rng is None else rng
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


def tolerance(qa, config=None):
    """rel. L2 bound for float32 output (module docstring)."""
    from nqdq.gpu.gemm import plan as kg

    fp8 = qa.scheme.fmt in ("e4m3", "e5m2")
    wgmma = isinstance(config, kg.WgmmaConfig) if config is not None else kg.device_cc() == (9, 0)  # default_config
    return 5e-4 if fp8 and wgmma else 1e-5


@pytest.mark.parametrize("family", ["default", "mma.sync"])
@pytest.mark.parametrize("sa,sb", SCHEME_PAIRS + [("e4m3", "e5m2"), ("e5m2", "e5m2")])
@pytest.mark.parametrize("shape", [(257, 383, 1000), (1, 4096, 512), (130, 136, 4096)])
def test_gemm_gpu_matches_reference(sa, sb, shape, family):
    from nqdq.gpu.gemm import plan as kg

    x, w, qa, qb = gpu_operands(*shape, sa, sb)
    if family == "default":
        config = None
        got = matmul(qa, qb)
    else:
        config = kg.GPU_CONFIG
        a, b, kw = gemm_kwargs(host_q(qa), host_q(qb))
        got = kg.gemm(cp.asarray(a), cp.asarray(b), config=config, **kw)
    assert isinstance(got, cp.ndarray) and got.shape == shape[:1] + shape[1:2]
    want = matmul(host_q(qa), host_q(qb), device="cpu")
    err = rel_l2(got.get(), want)
    assert err < tolerance(qa, config), err


@pytest.mark.parametrize("cfg", ["wide_direct", "wide_fixed", "fp8_row", "fp8_block", "persistent_128", "ring",
                                 "ring_direct", "ws256"])
@pytest.mark.parametrize("sa,sb", [("int8_asym", "int8_row"), ("fp8_row", "fp8_row"), ("fp8_1x128", "fp8_128x128")])
def test_gemm_gpu_wgmma_configs(sa, sb, cfg):
    """Every named sm_90a tile (nqdq.gpu.gemm.plan) with the scale kinds it is chosen for,
    large-output tiles included, at one small shape (edges in M, N, K; 6 or 9 tiles, fewer
    than the persistent grid's CTAs: see test_gemm_gpu_persistent_wraps for CTAs that walk
    several tiles), and the block-barrier ring with fp8 ("ring", "ring_direct": 128 x 128, parked and direct
    epilogues) and block scales on 128 x 256 tiles with a producer ("ws256": two 128-blocks
    of weight scales per tile, N = 383 leaves the last one partial)."""
    from nqdq.gpu.gemm import plan as kg

    W = kg.WgmmaConfig
    config = {"wide_direct": kg.WGMMA_CONFIG_WIDE_DIRECT, "wide_fixed": kg.WGMMA_CONFIG_WIDE_FIXED,
              "fp8_row": kg.WGMMA_CONFIG_FP8_ROW, "fp8_block": kg.WGMMA_CONFIG_FP8_BLOCK,
              "persistent_128": kg.WGMMA_CONFIG_PERSISTENT_128, "ring": W(), "ring_direct": W(direct=True),
              "ws256": W(n=256, producer=True, direct=True)}[cfg]  # fmt: skip
    if sa == "fp8_1x128" and 128 % config.bn and config.bn != 256:
        pytest.skip("block scales need N = 128 (or 256) tiles")
    takes = {"wide_direct": "int8", "wide_fixed": "int8", "fp8_row": "fp8_row", "fp8_block": "fp8_1x128",
             "ws256": "fp8_1x128", "ring": "fp8", "ring_direct": "fp8"}  # fmt: skip
    if not sa.startswith(takes.get(cfg, "")):
        pytest.skip("the scale kinds this tile is for (compile time)")
    x, w, qa, qb = gpu_operands(257, 383, 1000, sa, sb)
    a, b, kw = gemm_kwargs(host_q(qa), host_q(qb))
    got = kg.gemm(cp.asarray(a), cp.asarray(b), config=config, **kw)
    want = matmul(host_q(qa), host_q(qb), device="cpu")
    err = rel_l2(got.get(), want)
    assert err < tolerance(qa, config), err


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
        kw["bias"] = _rng("bias", sa, sb, N).standard_normal(N).astype(np.float32)
    got = matmul(qa, qb, bias=None if "bias" not in kw else cp.asarray(kw["bias"]), **{k: v for k, v in kw.items() if k != "bias"})
    want = matmul(host_q(qa), host_q(qb), device="cpu", **kw)
    got = got.get()
    if want.dtype == ml_dtypes.bfloat16:
        assert got.dtype == np.uint16  # bfloat16 bits on the GPU, as nqdq.dequantize returns them
        got = got.view(ml_dtypes.bfloat16)
    assert got.dtype == want.dtype
    if tolerance(qa) == 1e-5:  # exact accumulation: the epilogue's float32 roundings, then the output's
        # The kernel's epilogue computes alpha * acc * s_a * s_b + bias and the activation in
        # float32, the reference in float64: a few float32 roundings of terms as large as T =
        # |alpha| |A| |B|^T + |bias|, times the activation's slope (GELU's <= 1.13), which
        # dominate where the bias cancels the product (|want| << T, near GELU's zero); then
        # one rounding to 16 bits (1 ulp of want at most). 8 float32 ulps of T covers the
        # roundings (each <= 2^-24 T, at most 4 of them, x 1.13) with room.
        A = np.abs(nqdq.dequantize(host_q(qa)).astype(np.float64))
        B = np.abs(nqdq.dequantize(host_q(qb)).astype(np.float64))
        T = abs(kw.get("alpha", 1.0)) * (A @ B.T) + (np.abs(kw["bias"]) if "bias" in kw else 0.0)
        eps = {np.float16: 2.0**-10, ml_dtypes.bfloat16: 2.0**-7}[want.dtype.type]
        g, w = got.astype(np.float64), want.astype(np.float64)
        assert np.all(np.abs(g - w) <= eps * np.abs(w) + 8 * 2.0**-24 * T), np.max(np.abs(g - w) / (eps * np.abs(w) + 8 * 2.0**-24 * T))
    else:  # the rounding to 16 bits (<= 2^-9 / 2^-12 relative) plus the accumulation bound
        want32 = matmul(host_q(qa), host_q(qb), "float32", device="cpu", **{k: v for k, v in kw.items() if k != "out_dtype"})
        half_ulp = 2.0**-9 if want.dtype == ml_dtypes.bfloat16 else 2.0**-12
        err = rel_l2(got, want32)
        assert err < half_ulp + tolerance(qa), err


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
    err = rel_l2(got, matmul(qa, qb, device="cpu"))
    assert err < tolerance(qa), err


@pytest.mark.parametrize("sa,sb,n,kw", [
    ("int8_asym", "int8_row", 256, dict(out_dtype="bfloat16", activation="gelu", bias=True)),
    ("fp8_row", "fp8_row", 192, dict(out_dtype="float16", activation="relu", bias=True, alpha=0.5)),
])  # fmt: skip
def test_gemm_gpu_epilogues_same_bits(sa, sb, n, kw):
    """The parked and the direct epilogues multiply in the same order, so with the same
    main loop (the block-barrier ring; int8: WGMMA_CONFIG_WIDE_FIXED and _DIRECT) their
    outputs are bit-identical (edges: 300 x 520 leaves partial rows / columns; N = 520 is
    even, so the direct epilogue's interior tiles store pairs)."""
    from nqdq.gpu.gemm import plan as kg

    M, N, K = 300, 520, 777
    x, w, qa, qb = gpu_operands(M, N, K, sa, sb)
    a, b, gkw = gemm_kwargs(host_q(qa), host_q(qb))
    gkw.update(kw)
    if gkw.pop("bias", False):
        gkw["bias"] = _rng("bias", sa, sb, n).standard_normal(N).astype(np.float32)
    outs = [kg.gemm(cp.asarray(a), cp.asarray(b), config=kg.WgmmaConfig(n=n, direct=d), **gkw).get().view(np.uint16)
            for d in (False, True)]  # fmt: skip
    assert outs[0].shape == (M, N)
    assert np.count_nonzero(outs[0]) > M * N // 4  # a real output (ReLU zeroes about half)
    np.testing.assert_array_equal(outs[1], outs[0])


@pytest.mark.parametrize("sa,sb", [("fp8_row", "fp8_row"), ("fp8_1x128", "fp8_128x128")])
def test_gemm_gpu_persistent_wraps(sa, sb):
    """A persistent grid where every CTA walks several tiles (2048 x 1920: 16 x 10 or 15
    tiles on 132 SMs; WGMMA_CONFIG_FP8_ROW / _BLOCK) and the producer's ring phases run on
    across them: equal bit for bit to the same tile on the block-barrier ring, one tile per
    CTA, with the same products in the same order (each 128 of K summed by the same
    wgmma's, then promoted; the direct epilogue)."""
    from nqdq.gpu.gemm import plan as kg

    x, w, qa, qb = gpu_operands(2048 + 33, 1920 + 7, 1000, sa, sb)
    a, b, gkw = gemm_kwargs(host_q(qa), host_q(qb))
    gkw.update(out_dtype="bfloat16")
    persistent = kg.WGMMA_CONFIG_FP8_ROW if sa == "fp8_row" else kg.WGMMA_CONFIG_FP8_BLOCK
    one_tile = kg.WgmmaConfig(n=persistent.n, direct=True)
    outs = [kg.gemm(cp.asarray(a), cp.asarray(b), config=c, **gkw).get() for c in (one_tile, persistent)]
    assert np.count_nonzero(outs[0]) > outs[0].size // 2
    np.testing.assert_array_equal(outs[1], outs[0])
    want = matmul(host_q(qa), host_q(qb), device="cpu")
    assert rel_l2(outs[1].view(ml_dtypes.bfloat16).astype(np.float32), want) < 2.0**-8 + 5e-4


def test_out_pair_intrinsics_match_twins():
    """cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32 and st.global.u32 (the direct epilogue's pair
    stores) against their twins over special values and random float32 bit patterns,
    NaN lanes included (the instructions write a canonical NaN: the twins' too)."""
    from numba import cuda

    from nqdq.gpu.ptx import convert, memory

    @cuda.jit
    def probe(x, out_bf, out_h):
        i = cuda.grid(1)
        if 2 * i + 1 < x.size:
            memory.st_u32_at(out_bf, 2 * i, convert.cvt_bf16x2(x[2 * i + 1], x[2 * i]))
            memory.st_u32_at(out_h, 2 * i, convert.cvt_f16x2(x[2 * i + 1], x[2 * i]))

    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 65519.996, 3.4028235e38, 1e-45, -1e-45,
                        6.1e-5, 5.96e-8, 2.98e-8, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8], np.float32)  # fmt: skip
    bits = np.random.default_rng(12).integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([special, bits.view(np.float32)])
    bf, h = cp.zeros(x.size, np.uint16), cp.zeros(x.size, np.uint16)
    probe[(x.size // 2 + 255) // 256, 256](cp.asarray(x), bf, h)
    want_bf = convert.round_to_half_bits(x.astype(np.float64), 8, 7).astype(np.uint16)  # the twins' rounding
    want_h = convert.round_to_half_bits(x.astype(np.float64), 5, 10).astype(np.uint16)
    for i in range(0, special.size, 2):  # the twins' packing: element 0 in bits 0-15
        assert convert.cvt_bf16x2_twin(x[i + 1], x[i]) == int(want_bf[i]) | (int(want_bf[i + 1]) << 16)
        assert convert.cvt_f16x2_twin(x[i + 1], x[i]) == int(want_h[i]) | (int(want_h[i + 1]) << 16)
    np.testing.assert_array_equal(bf.get(), want_bf)
    np.testing.assert_array_equal(h.get(), want_h)


# ----------------------------------------------------------------------------- the hot path
HOT_PAIRS = [("int8_row", "int8_row"), ("int8_asym", "int8_row"), ("fp8_row", "fp8_row"), ("fp8_tensor", "fp8_tensor"),
             ("fp8_1x128", "fp8_128x128")]  # fmt: skip


def _matmul_module():
    import sys

    return sys.modules["nqdq.matmul"]  # (nqdq.matmul is also the function)


@pytest.mark.parametrize("sa,sb", HOT_PAIRS)
@pytest.mark.parametrize("shape", [(16, 1024, 512), (257, 384, 1024), (128, 1152, 4096)])
@pytest.mark.parametrize("kw", [{}, {"out_dtype": "bfloat16", "activation": "gelu", "bias": True, "alpha": 0.5},
                                {"out_dtype": "float16", "activation": "relu", "bias": True}],
                         ids=["plain", "bf16-gelu-bias", "f16-relu-bias"])  # fmt: skip
def test_hot_path_same_bits_as_the_first_call(sa, sb, shape, kw):
    """The remembered runner (repeated calls) against the general path (the first call, and
    the first call after the cache is cleared, on new operands of the same kind)."""
    mm = _matmul_module()
    mm.clear_hot_path()
    M, N, K = shape
    rng = _rng(sa, sb, M, N, K)
    x = cp.asarray(rng.standard_normal((M, K)).astype(np.float32))
    w = cp.asarray((rng.standard_normal((N, K)) * 0.05).astype(np.float32))
    kw = dict(kw)
    if kw.pop("bias", False):
        kw["bias"] = cp.asarray(rng.standard_normal(N).astype(np.float32))
    qa, qb = nqdq.quantize(x, sa), nqdq.quantize(w, sb)
    first = matmul(qa, qb, **kw)
    assert len(mm._RUNNERS) == 1
    for _ in range(3):
        hot = matmul(qa, qb, **kw)
        assert hot.dtype == first.dtype and hot.shape == (M, N) and hot.flags.c_contiguous
        np.testing.assert_array_equal(hot.get().view(np.uint8), first.get().view(np.uint8))
    qa2, qb2 = nqdq.quantize(x * 3 - 1, sa), nqdq.quantize(w[::-1].copy(), sb)
    hot = matmul(qa2, qb2, **kw)
    assert len(mm._RUNNERS) == 1
    mm.clear_hot_path()
    general = matmul(qa2, qb2, **kw)
    np.testing.assert_array_equal(hot.get().view(np.uint8), general.get().view(np.uint8))


@pytest.mark.parametrize("sa,sb", [("fp8_row", "fp8_row"), ("int8_asym", "int8_row"), ("fp8_1x128", "fp8_128x128")])
def test_hot_path_captured_in_a_cuda_graph(sa, sb):
    """The hot path neither waits for the GPU nor copies to the host (either would break the
    capture), and replays: new operand data in the same buffers, the new product."""
    mm = _matmul_module()
    mm.clear_hot_path()
    M, N, K = 64, 512, 1024
    rng = _rng(sa, sb, M, N, K)
    x = cp.asarray(rng.standard_normal((M, K)).astype(np.float32))
    w = cp.asarray((rng.standard_normal((N, K)) * 0.05).astype(np.float32))
    qa, qb = nqdq.quantize(x, sa), nqdq.quantize(w, sb)
    matmul(qa, qb)  # checks, compiles, remembers the runner
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        matmul(qa, qb)  # warm this stream's pool (no cudaMalloc inside the capture)
        s.synchronize()
        s.begin_capture()
        out = matmul(qa, qb)
        graph = s.end_capture()
    qa2 = nqdq.quantize(x * 2 + 0.5, sa)
    with s:
        for name in ("codes", "scales", "zero_points"):
            if getattr(qa, name) is not None:
                getattr(qa, name)[...] = getattr(qa2, name)
        out.fill(0)
    graph.launch(s)
    s.synchronize()
    mm.clear_hot_path()
    want = matmul(qa2, qb)
    np.testing.assert_array_equal(out.get().view(np.uint8), want.get().view(np.uint8))
