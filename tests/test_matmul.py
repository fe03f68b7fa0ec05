"""nqdq.matmul.matmul: the reference (spec), the tensor-core kernels under the CUDA
simulator, the seed acceptance test, and argument errors.

Tolerances: the reference is float64 of the exact dequantized values, rounded once; the
kernels sum exactly in int32 (int8) or in float32 (fp8, on the GPU the tensor core's own
accumulation) and apply the epilogue in float32 (a handful of roundings of 2^-24), so
float32 outputs agree to rel. L2 < 1e-5 (the issue's bound). float16 / bfloat16 outputs are
the float32 value rounded once (kernel) vs the float64 value rounded once (reference): they
may differ by one unit in the last place where the two straddle a rounding boundary.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nqdq
from nqdq.matmul import matmul
from nqdq.reference import matmul as ref

from helpers.gemm import SCHEME_PAIRS, gemm_kwargs, rel_l2


def operands(M, N, K, sa, sb, rng=None):
    rng = np.random.default_rng([M, N, K]) if rng is None else rng
    x = rng.standard_normal((M, K)).astype(np.float32)
    x[:, ::7] *= 4  # uneven rows / groups, so per-row and per-block scales differ
    w = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)
    return x, w, nqdq.quantize(x, sa), nqdq.quantize(w, sb)


def assert_ulp_close(got, want, dtype):
    """Equal, or one unit in the last place apart (see the module docstring)."""
    g = np.asarray(got).astype(np.float64)
    w = np.asarray(want).astype(np.float64)
    eps = {np.float16: 2.0**-10, ml_dtypes.bfloat16: 2.0**-7}[dtype]
    tiny = {np.float16: 2.0**-24, ml_dtypes.bfloat16: 2.0**-133}[dtype]
    assert np.all(np.abs(g - w) <= eps * np.abs(w) + tiny), np.max(np.abs(g - w) / (np.abs(w) + tiny))


# ----------------------------------------------------------------------------- the reference
@pytest.mark.parametrize("sa,sb", SCHEME_PAIRS)
def test_reference_equals_dequantize_then_matmul(sa, sb):
    """The reference's scale / zero-point maps against nqdq.dequantize (independent code):
    dequantize rounds each code * scale to float32 (rel. 2^-24), the reference does not."""
    rng = np.random.default_rng(58)
    x, w, qa, qb = operands(37, 150, 300, sa, sb)
    bias = rng.standard_normal(150).astype(np.float32)
    got = matmul(qa, qb, bias=bias, alpha=0.5, device="cpu")
    want = 0.5 * (nqdq.dequantize(qa).astype(np.float64) @ nqdq.dequantize(qb).astype(np.float64).T) + bias
    assert got.dtype == np.float32 and got.shape == (37, 150)
    assert rel_l2(got, want) < 1e-6


def test_reference_activations_and_dtypes():
    x, w, qa, qb = operands(8, 16, 64, "int8_row", "int8_row")
    base = matmul(qa, qb, device="cpu").astype(np.float64)
    np.testing.assert_array_equal(matmul(qa, qb, activation="relu", device="cpu"), np.maximum(base, 0).astype(np.float32))
    gelu = matmul(qa, qb, activation="gelu", device="cpu")
    # erf form at a few hand-checked points: gelu(0) = 0, gelu(v) ~ v for large v, gelu(-v) ~ 0
    np.testing.assert_allclose(ref.gelu_erf(np.array([0.0, 6.0, -6.0, 1.0])), [0.0, 6.0, -5.9e-9, 0.8413447460685429], atol=1e-8)
    assert rel_l2(gelu, ref.gelu_erf(base)) < 1e-7
    assert matmul(qa, qb, "float16", device="cpu").dtype == np.float16
    assert matmul(qa, qb, "bfloat16", device="cpu").dtype == ml_dtypes.bfloat16


def test_seed_acceptance_int8_tensor_x_channel_512x512x1024():
    """INT8 per-tensor A x per-output-channel B vs the float32 product of the unquantized
    inputs: rel. L2 < 0.03 (the issue's seed acceptance test), on the reference path."""
    rng = np.random.default_rng(1024)
    x = rng.standard_normal((512, 1024)).astype(np.float32)
    w = rng.standard_normal((512, 1024)).astype(np.float32)
    qa = nqdq.quantize(x, "int8", granularity="tensor")
    qb = nqdq.quantize(w, "int8_row")  # one scale per row of W = per column of B = W.T
    err = rel_l2(matmul(qa, qb, device="cpu"), x @ w.T)
    assert err < 0.03, err


# ----------------------------------------------------------------------------- kernels (simulator)
# Shapes not multiples of any tile (16 x 16 x 64 in the simulator): odd M, N, K, M = 1,
# K not a multiple of 16 (the launcher pads) and K > 128 (several fp8 scale blocks).
SIM_SHAPES = [(17, 24, 64), (1, 9, 200), (5, 31, 136)]


@pytest.mark.parametrize("sa,sb", SCHEME_PAIRS)
@pytest.mark.parametrize("shape", SIM_SHAPES[:2])
def test_kernel_matches_reference(sa, sb, shape):
    x, w, qa, qb = operands(*shape, sa, sb)
    got = matmul(qa, qb, device="cuda")
    want = matmul(qa, qb, device="cpu")
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == want.shape
    assert rel_l2(got, want) < 1e-5


@pytest.mark.parametrize(
    "sa,sb,kw",
    [
        ("int8_row", "int8_row", dict(out_dtype="float16", activation="relu", bias=True, alpha=0.25)),
        ("int8_asym", "int8_row", dict(out_dtype="bfloat16", activation="gelu", bias=True)),
        ("fp8_1x128", "fp8_128x128", dict(out_dtype="bfloat16", bias=True, alpha=2.0)),
        ("e5m2", "e5m2", dict(activation="gelu")),
        ("e4m3", "e5m2", dict(out_dtype="float16")),
    ],
)
def test_kernel_epilogues(sa, sb, kw):
    rng = np.random.default_rng(119)
    M, N, K = SIM_SHAPES[2]
    x, w, qa, qb = operands(M, N, K, sa, sb)
    kw = dict(kw)
    if kw.pop("bias", False):
        kw["bias"] = rng.standard_normal(N).astype(np.float32)
    got = matmul(qa, qb, device="cuda", **kw)
    want = matmul(qa, qb, device="cpu", **kw)
    assert got.dtype == want.dtype and got.shape == (M, N)
    if want.dtype == np.float32:
        assert rel_l2(got, want) < 1e-5
    else:
        assert_ulp_close(got, want, want.dtype.type)


@pytest.mark.parametrize("sa,sb,mode,K", [("int8_row", "int8_row", "ring", 200), ("int8_asym", "int8_row", "ring", 200),
                                          ("fp8_row", "e5m2", "ring", 200), ("fp8_row", "fp8_tensor", "ring", 200),
                                          ("fp8_1x128", "fp8_128x128", "ring", 200),
                                          ("int8_row", "int8_row", "ringd", 200),
                                          ("int8_asym", "int8_row", "ringd", 300),
                                          ("fp8_row", "e5m2", "ws", 520), ("fp8_row", "fp8_tensor", "ws", 300),
                                          ("int8_asym", "int8_row", "ws", 520),
                                          ("fp8_1x128", "fp8_128x128", "ws", 520),
                                          ("fp8_1x128", "fp8_128x128", "wspp", 400),
                                          ("fp8_1x128", "fp8_128x128", "wspp", 520)])  # fmt: skip
def test_wgmma_kernel_matches_reference(sa, sb, mode, K):
    """The sm_90a kernel (wgmma from swizzled shared tiles) with a one-warpgroup 64 x 16
    tile, its twins reading shared memory through the descriptors as the hardware does, in
    the forms the named choices take (nqdq.gpu.gemm.plan). Modes: "ring" (block barrier
    per K step, the parked epilogue: 4 columns per thread, N = 24 leaves the last thread's
    partial), "ringd" (the same with the direct epilogue), "ws" (a producer warpgroup
    feeding the mbarrier ring, 256 threads, the consumers released by the empty barriers
    the producer waits on; direct epilogue on a persistent grid: 2 CTAs walk the 4 tiles of
    M = 65, N = 24, so the ring runs on from one tile into the next; K = 520: 5 steps, the
    3-slot ring wraps and both barrier parities are waited on), "wspp" ("ws" with
    ping-pong accumulators; K = 400 and 520: an even and an odd number of steps take the
    two tails)."""
    from nqdq.gpu.gemm import plan as kg

    producer = mode.startswith("ws")
    x, w, qa, qb = operands(65 if producer else 17, 24, K, sa, sb)
    a, b, kw = gemm_kwargs(qa, qb)
    cfg = kg.WgmmaConfig(warpgroups=1, n=16, stages=3, group_m=2, producer=producer, pingpong=mode == "wspp",
                         direct=mode != "ring")  # fmt: skip
    got = kg.gemm(a, b, config=cfg, **kw)
    want = ref.gemm(a, b, **kw)
    assert rel_l2(got, want) < 1e-5


def test_wgmma_producer_block_scales_n256():
    """Block scales with a 64 x 256 tile fed by a producer warpgroup: a thread's fragment
    columns span two 128-blocks of weight scales (N = 136: the second block is partial)."""
    from nqdq.gpu.gemm import plan as kg

    x, w, qa, qb = operands(17, 136, 256, "fp8_1x128", "fp8_128x128")
    a, b, kw = gemm_kwargs(qa, qb)
    cfg = kg.WgmmaConfig(warpgroups=1, n=256, stages=3, group_m=2, producer=True, direct=True)
    got = kg.gemm(a, b, config=cfg, **kw)
    want = ref.gemm(a, b, **kw)
    assert rel_l2(got, want) < 1e-5


@pytest.mark.parametrize("sa,sb,kw", [("fp8_row", "fp8_row", dict(out_dtype="float16", activation="relu", alpha=0.5)),
                                       ("int8_asym", "int8_row", dict(out_dtype="bfloat16", activation="gelu")),
                                       ("fp8_1x128", "fp8_128x128", dict(out_dtype="bfloat16", alpha=2.0))])  # fmt: skip
def test_wgmma_epilogues_same_bits(sa, sb, kw):
    """The parked and the direct (from registers) epilogues multiply in the same order:
    with the same main loop (the block-barrier ring, 64 x 16 tiles) the outputs are
    bit-identical, bias, activation and half-precision rounding included (M = 17, N = 24:
    partial edges)."""
    rng = np.random.default_rng(197)
    from dataclasses import replace

    from nqdq.gpu.gemm import plan as kg

    x, w, qa, qb = operands(17, 24, 200, sa, sb)
    a, b, gkw = gemm_kwargs(qa, qb)
    gkw.update(kw, bias=rng.standard_normal(24).astype(np.float32))
    base = kg.WgmmaConfig(warpgroups=1, n=16, stages=3, group_m=2)
    outs = [np.asarray(kg.gemm(a, b, config=replace(base, direct=d), **gkw)).view(np.uint16) for d in (False, True)]
    assert np.count_nonzero(outs[0]) > outs[0].size // 4
    np.testing.assert_array_equal(outs[1], outs[0])


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_output_rounding_bits():
    """The kernels' float32 -> float16 / bfloat16 rounding, bit for bit against NumPy /
    ml_dtypes over special values and random float32 bit patterns (simulated kernel)."""
    from numba import cuda

    from nqdq.gpu.gemm.mma_sync import bf16_bits_rne, f16_bits_rne

    @cuda.jit
    def conv(v, h, b):
        for i in range(v.size):
            h[i] = f16_bits_rne(v[i])
            b[i] = bf16_bits_rne(v[i])

    special = np.array([0.0, -0.0, 1.0, 65504.0, 65519.99, 65520.0, 1e9, -np.inf, np.inf, 2.0**-24, 2.0**-25,
                        3 * 2.0**-26, 2.0**-14, 2.0**-14 - 2.0**-25, 1 + 2.0**-11, 1 + 3 * 2.0**-11], np.float32)  # fmt: skip
    bits = np.random.default_rng(0).integers(0, 2**32, 1500, dtype=np.uint64).astype(np.uint32)
    v = np.concatenate([special, -special, bits.view(np.float32)])
    v = v[~np.isnan(v)]  # NaN payloads are not part of the contract (both give a quiet NaN)
    h, b = np.zeros(v.size, np.uint16), np.zeros(v.size, np.uint16)
    conv[1, 1](v, h, b)
    np.testing.assert_array_equal(h, v.astype(np.float16).view(np.uint16))
    np.testing.assert_array_equal(b, v.astype(ml_dtypes.bfloat16).view(np.uint16))


# ----------------------------------------------------------------------------- errors
def _q(shape, scheme, **kw):
    rng = np.random.default_rng(list(shape))
    return nqdq.quantize(rng.standard_normal(shape).astype(np.float32), scheme, **kw)


@pytest.mark.parametrize(
    "a,b,kw,exc,msg",
    [
        (("int8_row",), ("int8_column",), {}, ValueError, "qb.*vary along K.*int8_row"),
        (("mxfp8",), ("fp8_row",), {}, ValueError, "qa has scheme 'mxfp8'"),
        (("int8_row",), ("fp8_row",), {}, ValueError, "int8 with int8"),
        (("fp8_1x128",), ("fp8_row",), {}, ValueError, "qa has fp8 block scales but qb"),
        (("fp8_row",), ("fp8_128x128",), {}, ValueError, "qb has fp8 block scales"),
        (("int8_row",), ("int8_asym",), {}, ValueError, "qb is asymmetric"),
        (("int4_group",), ("int8_row",), {}, ValueError, "qa has scheme"),
        (("int8_row", (8, 300)), ("int8_row", (16, 256)), {}, ValueError, "disagree on K"),
        (("int8_row",), ("int8_row",), dict(bias=np.zeros(3, np.float32)), ValueError, r"bias must have shape \(16,\)"),
        (("int8_row",), ("int8_row",), dict(bias=np.zeros(16, np.int32)), TypeError, "bias must be a float"),
        (("int8_row",), ("int8_row",), dict(activation="tanh"), ValueError, "activation='tanh'"),
        (("int8_row",), ("int8_row",), dict(out_dtype="int8"), TypeError, "out_dtype"),
        (("int8_row",), ("int8_row",), dict(alpha="2"), TypeError, "alpha"),
        (("int8_row",), ("int8_row",), dict(device="tpu"), ValueError, "device='tpu'"),
    ],
)
def test_errors_name_the_argument(a, b, kw, exc, msg):
    qa = _q(a[1] if len(a) > 1 else (8, 256), a[0])
    qb = _q(b[1] if len(b) > 1 else (16, 256), b[0])
    with pytest.raises(exc, match=msg):
        matmul(qa, qb, **kw)


def test_errors_non_quantized_and_non_2d():
    qb = _q((16, 256), "int8_row")
    with pytest.raises(TypeError, match="qa must be a QuantizedTensor"):
        matmul(np.zeros((8, 256)), qb)
    with pytest.raises(ValueError, match="qa must be 2-D"):
        matmul(_q((2, 8, 256), "int8_row"), qb)
