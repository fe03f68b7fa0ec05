"""nqdq.matmul's block-scaled, centred and weight-only pairs on the CPU path.

What each pair computes is the float64 product of the dequantized operands. The expectations
here come from ``nqdq.dequantize`` (each value rounded to float32: exact for MX, rel. 2^-24
for the others) and a float64 matmul, or from values written out by hand (the known-answer
cases: codes and scales chosen so that every product is a small exact number), never from
the reference under test. The GPU path of these pairs is not built: it must say so.
"""

from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest

import nqdq
from nqdq.quantized import QuantizedTensor
from nqdq.reference import matmul as ref
from nqdq.schemes import resolve_scheme

from helpers.gemm import SCHEME_PAIRS, rel_l2

MX = ["mxfp8", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4"]
WEIGHTS = ["int4_group", "int4_asym", "mxfp4", "nvfp4", "mxfp6_e2m3", "mxfp6_e3m2", "fp8_row", "fp8_128x128",
           "int8_row"]  # fmt: skip
# (M, N, K): odd M and N, M = 1, K not a multiple of the MX block (32), of NVFP4's (16) or of 128
SHAPES = [(5, 7, 96), (1, 9, 64), (3, 5, 40)]


def data(shape, seed, offset=0.0):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(shape).astype(np.float32)
    v[..., ::5] *= 8  # uneven blocks, so the scales differ
    return (v + np.float32(offset)).astype(np.float32)


def dequantized(q):
    return nqdq.dequantize(q).astype(np.float64)


def assert_close(got, want, rel=1e-6):
    """float32 ``got`` against the float64 ``want``: rel. L2 and elementwise (to the scale of
    the whole output, as a single output near zero may be a cancellation)."""
    got = np.asarray(got)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert rel_l2(got, want) < rel, rel_l2(got, want)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=rel * np.abs(want).max())


def block_scaled(codes, scales, scheme, shape, **arrays):
    """An MX / NVFP4 QuantizedTensor written by hand: uint8 codes (packed) and scale codes."""
    q = QuantizedTensor(np.asarray(codes, np.uint8), np.asarray(scales, np.uint8), resolve_scheme(scheme), shape,
                        "float32", **arrays)  # fmt: skip
    q.check_arrays()
    return q


# ----------------------------------------------------------------------------- pairs vs dequantize
@pytest.mark.parametrize("sb", MX)
@pytest.mark.parametrize("sa", MX)
def test_mx_pairs_equal_the_dequantized_product(sa, sb):
    """Every MX x MX pair, mixed element formats included (FP8 x FP4, FP6 x FP4, ...)."""
    M, N, K = SHAPES[0]
    qa, qb = nqdq.quantize(data((M, K), 1), sa), nqdq.quantize(data((N, K), 2), sb)
    assert_close(nqdq.matmul(qa, qb, device="cpu"), dequantized(qa) @ dequantized(qb).T)


@pytest.mark.parametrize("sa,sb", [("mxfp8", "mxfp4"), ("mxfp4", "mxfp6_e3m2"), ("nvfp4", "nvfp4")])
@pytest.mark.parametrize("shape", SHAPES + [(3, 4, 20), (2, 3, 8)])
def test_block_scaled_shapes(sa, sb, shape):
    """M = 1, odd M / N, and K not a multiple of the block: the last block is partial."""
    M, N, K = shape
    qa, qb = nqdq.quantize(data((M, K), 3), sa), nqdq.quantize(data((N, K), 4), sb)
    assert_close(nqdq.matmul(qa, qb), dequantized(qa) @ dequantized(qb).T)  # device=None: NumPy -> CPU


@pytest.mark.parametrize("sa,sb,kw_a,kw_b", [
    ("int8_centred", "int8_row", {}, {}),
    ("int8_row", "int8_centred", {}, {}),
    ("int8_asym", "int8_centred", {}, {}),
    ("int8_centred", "int8_centred", {}, {}),
    ("int8_centred", "int8", {}, dict(granularity="tensor")),
    ("int8_centred", "int8_centred", dict(group_size=32), dict(group_size=32)),
])  # fmt: skip
@pytest.mark.parametrize("shape", [(5, 7, 200), (1, 3, 64)])
def test_centred_pairs_equal_the_dequantized_product(sa, sb, kw_a, kw_b, shape):
    """Centred INT8 on either side or both; data with a large mean, so the means matter."""
    M, N, K = shape
    qa = nqdq.quantize(data((M, K), 5, offset=3.0), sa, **kw_a)
    qb = nqdq.quantize(data((N, K), 6, offset=-2.0), sb, **kw_b)
    assert_close(nqdq.matmul(qa, qb, device="cpu"), dequantized(qa) @ dequantized(qb).T)


def test_centred_a_is_the_issues_formula():
    """C[m, n] = sum_g (s_a[m, g] sum_(k in g) q_a b + mu_a[m, g] sum_(k in g) b), written
    over the codes, scales and means of qa (groups of 128; K = 200: the second is partial)."""
    M, N, K, G = 4, 6, 200, 128
    qa = nqdq.quantize(data((M, K), 7, offset=5.0), "int8_centred")
    qb = nqdq.quantize(data((N, K), 8), "int8_row")
    b = dequantized(qb)
    q = qa.codes.astype(np.float64)
    want = np.zeros((M, N))
    for g in range(-(-K // G)):
        k = slice(g * G, min(K, (g + 1) * G))
        s, mu = qa.scales[:, g, None].astype(np.float64), qa.means[:, g, None].astype(np.float64)
        want += s * (q[:, k] @ b[:, k].T) + mu * b[:, k].sum(axis=1)[None, :]
    assert_close(nqdq.matmul(qa, qb, device="cpu"), want)


X_DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]


@pytest.mark.parametrize("x_dtype", X_DTYPES)
@pytest.mark.parametrize("sw", WEIGHTS)
def test_weight_only_equals_x_times_the_dequantized_weight(sw, x_dtype):
    M, N, K = SHAPES[0]
    x = data((M, K), 9).astype(x_dtype)
    qw = nqdq.quantize(data((N, K), 10), sw)
    assert_close(nqdq.matmul(x, qw, device="cpu"), x.astype(np.float64) @ dequantized(qw).T)


@pytest.mark.parametrize("sw,shape", [("int4_asym", (1, 9, 64)), ("nvfp4", (3, 5, 40)), ("int4_group", (3, 5, 200)),
                                      ("fp8_128x128", (2, 130, 136)), ("int8_asym", (3, 5, 40)),
                                      ("fp8_1x128", (2, 3, 200))])  # fmt: skip
def test_weight_only_shapes_and_more_weights(sw, shape):
    M, N, K = shape
    x = data((M, K), 11).astype(np.float16)
    qw = nqdq.quantize(data((N, K), 12), sw)
    assert_close(nqdq.matmul(x, qw), x.astype(np.float64) @ dequantized(qw).T)


@pytest.mark.parametrize("bits_of", ["bfloat16", "float16"])
def test_weight_only_takes_uint16_bits_with_dtype(bits_of):
    """uint16 bits of bfloat16 / float16 with ``dtype=``, as nqdq.quantize takes them."""
    M, N, K = 3, 5, 64
    x = data((M, K), 13).astype(np.dtype(bits_of) if bits_of == "float16" else ml_dtypes.bfloat16)
    qw = nqdq.quantize(data((N, K), 14), "mxfp4")
    got = nqdq.matmul(x.view(np.uint16), qw, dtype=bits_of, device="cpu")
    np.testing.assert_array_equal(got, nqdq.matmul(x, qw, device="cpu"))
    assert_close(got, x.astype(np.float64) @ dequantized(qw).T)


@pytest.mark.parametrize("sa,sb", SCHEME_PAIRS)
def test_whole_operand_reference_agrees_with_gemm_on_the_int8_fp8_pairs(sa, sb):
    """reference.matmul.matmul (whole operands) and reference.matmul.gemm (the launcher's
    arguments) are both float64 of exact values: the same up to the final float32 rounding."""
    qa, qb = nqdq.quantize(data((5, 200), 15), sa), nqdq.quantize(data((7, 200), 16) * 0.05, sb)
    assert rel_l2(ref.matmul(qa, qb), nqdq.matmul(qa, qb, device="cpu")) < 1e-7


# ----------------------------------------------------------------------------- known answers
# e2m1 codes: 0x2 = 1, 0x4 = 2, 0x5 = 3, 0x7 = 6, +0x8 = negative; packed, element 2i in the
# low nibble. e4m3 codes: 0x38 = 1, 0x30 = 0.5, 0x40 = 2, 0xB8 = -1, 0x34 = 0.75, 0x3C = 1.5.
# e2m3: 0x08 = 1, 0x0C = 1.5; e3m2: 0x0C = 1, 0x2C = -1. e8m0 code e: 2^(e - 127).
def test_known_answer_mxfp4_x_mxfp8():
    """K = 4 (one partial block). a = [1, 2, -3, 6] * 2^(128-127); b rows [1, 1, 1, 1] and
    [2, -1, 0.5, 0], both * 2^(125-127). C = 2 * 0.25 * (a . b):
    row 0: 1 + 2 - 3 + 6 = 6 -> 3.0; row 1: 2 - 2 - 1.5 + 0 = -1.5 -> -0.75."""
    qa = block_scaled([[0x42, 0x7D]], [[128]], "mxfp4", (1, 4))
    qb = block_scaled([[0x38, 0x38, 0x38, 0x38], [0x40, 0xB8, 0x30, 0x00]], [[125], [125]], "mxfp8", (2, 4))
    np.testing.assert_array_equal(nqdq.matmul(qa, qb, device="cpu"), np.array([[3.0, -0.75]], np.float32))


def test_known_answer_mx_two_blocks():
    """K = 40: a full block of 32 and a partial one of 8, each with its own scales.
    a[0] = 1 * 2^0, a[32] = 1 * 2^3; b[0] = 2 * 2^-1, b[32] = -0.5 * 2^2 (mxfp8 x mxfp8),
    C = 1 * 1 + 8 * (-2) = -15."""
    a = np.zeros((1, 40), np.uint8)
    b = np.zeros((1, 40), np.uint8)
    a[0, 0] = a[0, 32] = 0x38
    b[0, 0], b[0, 32] = 0x40, 0x30 | 0x80
    qa = block_scaled(a, [[127, 130]], "mxfp8", (1, 40))
    qb = block_scaled(b, [[126, 129]], "mxfp8", (1, 40))
    assert nqdq.matmul(qa, qb, device="cpu")[0, 0] == -15.0


def test_known_answer_mxfp6_e2m3_x_e3m2():
    """K = 4, 6-bit codes packed four to three bytes (LSB first): a = [1, 1.5, 0, 0] * 2^-1,
    b = [1, -1, 0, 0] * 2^4; C = (1 - 1.5) * 2^3 = -4."""
    def pack6(c):
        word = c[0] | c[1] << 6 | c[2] << 12 | c[3] << 18
        return [word & 0xFF, (word >> 8) & 0xFF, word >> 16]

    qa = block_scaled([pack6([0x08, 0x0C, 0, 0])], [[126]], "mxfp6_e2m3", (1, 4))
    qb = block_scaled([pack6([0x0C, 0x2C, 0, 0])], [[131]], "mxfp6_e3m2", (1, 4))
    assert nqdq.matmul(qa, qb, device="cpu")[0, 0] == -4.0


def test_known_answer_nvfp4():
    """K = 4: a = [1, 2, -3, 6] * ue4m3(0.5) * 2.0 (tensor scale) = [1, 2, -3, 6];
    b = [1, 1, 1, 1] * ue4m3(1.5) * 0.25 = 0.375 each; C = 6 * 0.375 = 2.25."""
    qa = block_scaled([[0x42, 0x7D]], [[0x30]], "nvfp4", (1, 4), tensor_scale=np.float32(2.0))
    qb = block_scaled([[0x22, 0x22]], [[0x3C]], "nvfp4", (1, 4), tensor_scale=np.float32(0.25))
    assert nqdq.matmul(qa, qb, device="cpu")[0, 0] == 2.25


def test_known_answer_nvfp4_two_blocks():
    """K = 20: blocks of 16 and 4. a[0] = 6 * 1.0 * 1.0, a[16] = -4 * 0.5 * 1.0;
    b[0] = 0.5 * 2.0 * 4.0, b[16] = 3 * 0.75 * 4.0; C = 6 * 4 + (-2) * 9 = 6."""
    a = np.zeros((1, 10), np.uint8)
    b = np.zeros((1, 10), np.uint8)
    a[0, 0], a[0, 8] = 0x07, 0x0E  # element 0 (low nibble) = 6, element 16 = -4
    b[0, 0], b[0, 8] = 0x01, 0x05  # 0.5, 3
    qa = block_scaled(a, [[0x38, 0x30]], "nvfp4", (1, 20), tensor_scale=np.float32(1.0))
    qb = block_scaled(b, [[0x40, 0x34]], "nvfp4", (1, 20), tensor_scale=np.float32(4.0))
    assert nqdq.matmul(qa, qb, device="cpu")[0, 0] == 6.0


def test_known_answer_centred():
    """qa: codes [1, -2, 3, 0], scale 0.5, mean 10 -> [10.5, 9, 11.5, 10]; qb: int8_row codes
    [1, 1, 1, 1], scale 2 -> 2 each. C = 2 * 41 = 82 (= 0.5 * 2 * 2 + 10 * 8, the formula)."""
    sch = resolve_scheme("int8_centred")
    qa = QuantizedTensor(np.array([[1, -2, 3, 0]], np.int8), np.array([[0.5]], np.float32), sch, (1, 4), "float32",
                         means=np.array([[10.0]], np.float32))  # fmt: skip
    qb = QuantizedTensor(np.ones((1, 4), np.int8), np.array([[2.0]], np.float32), resolve_scheme("int8_row"), (1, 4),
                         "float32")  # fmt: skip
    assert nqdq.matmul(qa, qb, device="cpu")[0, 0] == 82.0
    assert nqdq.matmul(qb, qa, device="cpu")[0, 0] == 82.0


def test_known_answer_weight_only_int4_asym():
    """x = [1, 0.5, -2, 3] (float16); qw: uint4 codes [8, 9, 7, 15] (packed 0x98, 0xF7), zero
    point 8, scale 0.25 -> [0, 0.25, -0.25, 1.75]; C = 0.125 + 0.5 + 5.25 = 5.875."""
    qw = QuantizedTensor(np.array([[0x98, 0xF7]], np.uint8), np.array([[0.25]], np.float32),
                         resolve_scheme("int4_asym"), (1, 4), "float32",
                         zero_points=np.array([[8]], np.uint8))  # fmt: skip
    x = np.array([[1, 0.5, -2, 3]], np.float16)
    assert nqdq.matmul(x, qw, device="cpu")[0, 0] == 5.875


# ----------------------------------------------------------------------------- the epilogue
def gelu(v):
    """0.5 v (1 + erf(v / sqrt 2)), written 0.5 v erfc(-v / sqrt 2): 1 + erf cancels for v < -5."""
    return 0.5 * v * np.vectorize(math.erfc)(-v / math.sqrt(2.0))


@pytest.mark.parametrize("case", ["mx", "nvfp4", "centred", "weight-only"])
@pytest.mark.parametrize("kw", [
    dict(alpha=0.5, bias=True),
    dict(activation="relu", bias=True),
    dict(activation="gelu", alpha=2.0),
    dict(out_dtype="float16", activation="relu"),
    dict(out_dtype="bfloat16", bias=True, activation="gelu"),
])  # fmt: skip
def test_epilogue(case, kw):
    M, N, K = 5, 7, 64
    a = data((M, K), 17)
    w = data((N, K), 18) * np.float32(0.1)
    if case == "weight-only":
        qa, b = a.astype(ml_dtypes.bfloat16), nqdq.quantize(w, "int4_asym")
        A = qa.astype(np.float64)
    else:
        sa, sb = {"mx": ("mxfp8", "mxfp4"), "nvfp4": ("nvfp4", "nvfp4"), "centred": ("int8_centred", "int8_row")}[case]
        qa, b = nqdq.quantize(a, sa), nqdq.quantize(w, sb)
        A = dequantized(qa)
    kw = dict(kw)
    bias = np.random.default_rng(19).standard_normal(N).astype(np.float32) if kw.pop("bias", False) else None
    out_dtype = kw.get("out_dtype", "float32")
    v = kw.get("alpha", 1.0) * (A @ dequantized(b).T) + (0.0 if bias is None else bias.astype(np.float64))
    v = {None: v, "relu": np.maximum(v, 0.0), "gelu": gelu(v)}[kw.get("activation")]
    got = nqdq.matmul(qa, b, bias=bias, device="cpu", **kw)
    assert got.shape == (M, N)
    if out_dtype == "float32":
        assert_close(got, v)
        return
    dt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[out_dtype]
    assert got.dtype == dt
    # float64 rounded once; the expectation's float64 differs from the reference's by the
    # float32 rounding of dequantize, so one unit in the last place where they straddle a tie
    eps = {np.float16: 2.0**-10, ml_dtypes.bfloat16: 2.0**-7}[dt]
    g, want = got.astype(np.float64), v.astype(dt).astype(np.float64)
    assert np.all(np.abs(g - want) <= eps * np.abs(want) + 1e-30)
    assert np.count_nonzero(g) > g.size // 4


# ----------------------------------------------------------------------------- the GPU path
@pytest.mark.parametrize("sa,sb,K", [("mxfp8", "mxfp4", 64), ("mxfp6_e3m2", "mxfp4", 40), ("mxfp8_e5m2", "mxfp6_e2m3", 96),
                                     ("mxfp4", "mxfp4", 33)])  # fmt: skip
def test_mx_pairs_on_the_gpu_path(sa, sb, K):
    """MX x MX on the kernels (the simulator here, the GPU with NQDQ_TEST_GPU=1): the float64
    product of the dequantized operands, to float32 accumulation (rel. L2 < 1e-5, SPEC);
    K padded to whole blocks of 32."""
    qa = nqdq.quantize(data((3, K), 30), sa)
    qb = nqdq.quantize(data((5, K), 31), sb)
    got = np.asarray(nqdq.matmul(qa, qb, device="cuda", bias=np.arange(5, dtype=np.float32)), np.float64)
    A = np.asarray(nqdq.dequantize(qa), np.float64)
    B = np.asarray(nqdq.dequantize(qb), np.float64)
    want = A @ B.T + np.arange(5)
    assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)


@pytest.mark.parametrize("M,N,K,kw", [(3, 5, 64, dict(alpha=0.5, activation="relu")), (1, 9, 40, {}),
                                      (6, 12, 48, dict(bias=True, out_dtype="bfloat16"))])  # fmt: skip
def test_nvfp4_pair_on_the_gpu_path(M, N, K, kw):
    """NVFP4 x NVFP4 on the kernels (exact bfloat16 operands, the bf16 GEMM, both tensor
    scales in the epilogue): the float64 product of the dequantized operands to float32
    accumulation (rel. L2 < 1e-5); K = 40: a partial block of 16 padded; bfloat16 output:
    one rounding of each element (2^-8 relative, with 2^-7 for the float32 sums' order)."""
    qa = nqdq.quantize(data((M, K), 40), "nvfp4")
    qb = nqdq.quantize(data((N, K), 41) * np.float32(0.01), "nvfp4")
    kw = dict(kw)
    bias = np.random.default_rng(44).standard_normal(N).astype(np.float32) if kw.pop("bias", False) else None
    got = np.asarray(nqdq.matmul(qa, qb, device="cuda", bias=bias, **kw)).astype(np.float64)
    want = kw.get("alpha", 1.0) * (dequantized(qa) @ dequantized(qb).T) + (0.0 if bias is None else bias)
    if kw.get("activation") == "relu":
        want = np.maximum(want, 0.0)
        assert (got == 0).any()
    if kw.get("out_dtype") == "bfloat16":
        assert np.all(np.abs(got - want) <= 2.0**-7 * np.abs(want) + 1e-30)
    else:
        assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)


@pytest.mark.parametrize("scheme,kw", [("int8_row", {}), ("fp8_row", {}), ("fp8_tensor", {}),
                                       ("int4", dict(granularity="row", symmetric=False)), ("mxfp4", {}),
                                       ("int8", dict(granularity="block", block_shape=(5, 128))),
                                       ("mxfp6_e3m2", {}), ("nvfp4", {})])  # fmt: skip
def test_weight_only_on_the_gpu_path(scheme, kw):
    """matmul(x, qw) with a bfloat16 x on the kernels: qw as exact bfloat16 weights (unit
    scales dequantized, or MX / NVFP4 blocks folded), its row / tensor scales in the bf16
    GEMM's epilogue; against the float64 product of x and dequantize(qw) (rel. L2 < 1e-5:
    float32 accumulation). Odd M, N; K = 72 (a partial MX block); int8 blocks of 5 rows x
    all of K: one scale per 5 rows (N = 7: the last block partial), expanded per row."""
    M, N, K = 3, 7, 72
    x = data((M, K), 42).astype(ml_dtypes.bfloat16)
    qw = nqdq.quantize(data((N, K), 43), scheme, **kw)
    bias = np.linspace(-1, 1, N).astype(np.float32)
    got = np.asarray(nqdq.matmul(x, qw, device="cuda", bias=bias), np.float64)
    want = x.astype(np.float64) @ dequantized(qw).T + bias
    assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)


@pytest.mark.parametrize("scheme,gs", [("int4_group", 128), ("int4_asym", 128), ("int4_group", 256)])
@pytest.mark.parametrize("M,kw", [(1, {}), (9, dict(bias=True, activation="gelu", out_dtype="bfloat16")),
                                  (17, dict(alpha=0.5, activation="relu", out_dtype="float16"))])  # fmt: skip
def test_weight_only_int4_in_registers(scheme, gs, M, kw):
    """int4 weights in groups along K on the in-register kernel (gpu.gemm.weight_only): N = 20
    (a partial 16-row tile), K = 256 (two chunks of 128: one a warp; one group of 256 or two
    of 128), M = 1 (one n8 token tile), 9 (two, the second partial), 17 (two token blocks).
    float32 output: rel. L2 < 1e-5 against x @ dequantize(qw).T in float64 (float32 sums);
    half outputs: one rounding of each element (2^-7 / 2^-10 relative, with the float32
    sums' order)."""
    N, K = 20, 256
    x = data((M, K), 45).astype(ml_dtypes.bfloat16)
    qw = nqdq.quantize(data((N, K), 46), scheme, group_size=gs)
    kw = dict(kw)
    bias = np.linspace(-2, 2, N).astype(np.float32) if kw.pop("bias", False) else None
    got = nqdq.matmul(x, qw, device="cuda", bias=bias, **kw)
    want = kw.get("alpha", 1.0) * (x.astype(np.float64) @ dequantized(qw).T) + (0.0 if bias is None else bias)
    want = {None: want, "relu": np.maximum(want, 0.0), "gelu": gelu(want)}[kw.get("activation")]
    out = kw.get("out_dtype", "float32")
    assert got.shape == (M, N) and got.dtype == {"float32": np.float32, "float16": np.float16,
                                                 "bfloat16": ml_dtypes.bfloat16}[out]  # fmt: skip
    g = got.astype(np.float64)
    if out == "float32":
        assert np.linalg.norm(g - want) <= 1e-5 * np.linalg.norm(want)
    else:
        eps = 2.0**-7 if out == "bfloat16" else 2.0**-10
        assert np.all(np.abs(g - want) <= eps * np.abs(want) + 1e-6 * np.abs(want).max())
    assert np.count_nonzero(g) > g.size // 4


@pytest.mark.parametrize("x_dtype,sb,why", [("float32", "mxfp4", "x must be bfloat16 on the GPU"),
                                            ("float16", "int8_row", "x must be bfloat16 on the GPU"),
                                            ("bfloat16", "int4_group_64", "multiples of 128"),
                                            ("bfloat16", "int8_group", "scales that vary along K"),
                                            ("bfloat16", "fp8_128x128", "scales that vary along K"),
                                            ("qa", "int8_centred", None)])  # fmt: skip
def test_new_pairs_on_the_gpu_path_not_built(x_dtype, sb, why):
    """``device="cuda"`` reaches ``_pairs_gpu.new_pair_gpu`` (after every check): the pairs without a
    kernel raise NotImplementedError naming the pair, what is missing and the CPU path."""
    kw = {"int4_group_64": dict(group_size=64), "int8_group": dict(granularity="group")}.get(sb, {})
    sb = {"int4_group_64": "int4_group", "int8_group": "int8"}.get(sb, sb)
    qb = nqdq.quantize(data((5, 256), 21), sb, **kw)  # (K = 256: two 128 x 128 tiles along K)
    if x_dtype == "qa":
        qa, name = nqdq.quantize(data((3, 256), 20), "int8_row"), f"int8_row x {sb}"
    else:
        qa = data((3, 256), 20).astype(ml_dtypes.bfloat16 if x_dtype == "bfloat16" else x_dtype)
        name = f"{x_dtype} x {sb} (weight-only)"
    with pytest.raises(NotImplementedError, match=re.escape(name) + ".*" + re.escape(why or "") +
                       '.*device="cpu" computes it'):  # fmt: skip
        nqdq.matmul(qa, qb, device="cuda")


# ----------------------------------------------------------------------------- errors
def _q(scheme, shape=(4, 64), seed=22, kw=None):
    return nqdq.quantize(data(shape, seed), scheme, **(kw or {}))


@pytest.mark.parametrize("a,b,exc,match", [
    (("mxfp8",), ("nvfp4",), ValueError, "qa has scheme 'mxfp8'.*qb has scheme 'nvfp4'.*do not pair"),
    (("nvfp4",), ("mxfp4",), ValueError, "qa has scheme 'nvfp4'.*do not pair"),
    (("mxfp4",), ("fp8_row",), ValueError, "qa has scheme 'mxfp4'.*qb has scheme 'fp8_row'"),
    (("fp8_row",), ("mxfp4",), ValueError, "qb has scheme 'mxfp4'.*qa has scheme 'fp8_row'"),
    (("nvfp4",), ("int8_row",), ValueError, "qa has scheme 'nvfp4'"),
    (("int8_centred",), ("fp8_row",), ValueError, "qa has scheme 'int8_centred' but qb has scheme 'fp8_row'"),
    (("fp8_1x128",), ("int8_centred",), ValueError, "qb has scheme 'int8_centred' but qa"),
    (("int8_centred",), ("int8_column",), ValueError, "qa has scheme 'int8_centred' but qb has scheme 'int8_column'"),
    (("int8_centred",), ("int8_asym",), ValueError, "qb is asymmetric"),
    (("int8_centred",), ("int8_centred", (4, 64), 23, dict(group_size=32)), ValueError, "qb .*same group size"),
    (("mxfp8", (4, 64)), ("mxfp4", (6, 96)), ValueError, r"qa.shape \(4, 64\) and qb.shape \(6, 96\) disagree on K"),
    (("mxfp8", (64,)), ("mxfp8",), ValueError, r"qa must be 2-D \(\[M, K\]\)"),
    (("nvfp4",), ("nvfp4", (2, 3, 64)), ValueError, r"qb must be 2-D \(\[N, K\]\)"),
    (("mxfp8", (4, 64), 22, dict(scale_layout="nv_128x4")), ("mxfp8",), ValueError, "qa.scale_layout='nv_128x4'"),
    (("int8_row",), ("nvfp4", (4, 64), 23, dict(scale_layout="nv_128x4")), ValueError, "qb.scale_layout='nv_128x4'"),
    (("mxfp8", (64, 64), 22, dict(axis=0)), ("mxfp8", (64, 64)), ValueError, "qa .*along axis 0.*axis=-1"),
])  # fmt: skip
def test_pair_errors_name_the_argument(a, b, exc, match):
    qa, qb = _q(*a), _q(*b)
    with pytest.raises(exc, match=match):
        nqdq.matmul(qa, qb, device="cpu")


@pytest.mark.parametrize("x,w,kw,exc,match", [
    (np.zeros((4, 64)), ("mxfp4",), {}, TypeError, "x has dtype float64.*float32, float16 or bfloat16"),
    (np.zeros((4, 64), np.int8), ("int8_row",), {}, TypeError, "x has dtype int8"),
    (np.zeros((4, 64), np.uint16), ("nvfp4",), {}, TypeError, "x has dtype uint16.*dtype='bfloat16'"),
    (np.zeros((4, 64), np.float32), ("nvfp4",), dict(dtype="bfloat16"), TypeError, "dtype='bfloat16' does not match x"),
    (np.zeros((2, 4, 64), np.float32), ("int4_group",), {}, ValueError, r"x must be 2-D \(\[M, K\]\)"),
    (np.zeros((4, 96), np.float16), ("int4_group",), {}, ValueError,
     r"x.shape \(4, 96\) and qw.shape \(4, 64\) disagree on K"),
    (np.zeros((4, 64), np.float32), np.zeros((4, 64), np.float32), {}, TypeError, "qw must be a QuantizedTensor"),
    (np.zeros((4, 64), np.float32), ("int4_group", (64,)), {}, ValueError, r"qw must be 2-D \(\[N, K\]\)"),
    (np.zeros((4, 64), np.float32), ("mxfp4", (4, 64), 22, dict(scale_layout="nv_128x4")), {}, ValueError,
     "qw.scale_layout='nv_128x4'"),
    (np.zeros((4, 64), np.float32), ("int8_column",), {}, ValueError, "qw .*int8_column.*use 'int8_row'"),
    (np.zeros((4, 64), np.float32), ("int8_centred",), {}, ValueError, "qw has scheme 'int8_centred'"),
    (np.zeros((4, 64), np.float32), ("e2m1", (4, 64), 22, dict(granularity="row")), {}, ValueError,
     "qw .*element e2m1.*cannot be the weight"),
    (np.zeros((4, 64), np.float32), ("int4", (4, 64), 22, dict(granularity="block", block_shape=(2, 32))), {},
     ValueError, "qw .*scale groups 2 x 32"),
    ([[1.0] * 64] * 4, ("int8_row",), {}, TypeError, "qa must be a QuantizedTensor.*or x a float array"),
    (np.zeros((4, 64), np.float32), ("mxfp4",), dict(bias=np.zeros(3, np.float32)), ValueError,
     r"bias must have shape \(4,\)"),
    (np.zeros((4, 64), np.float32), ("mxfp4",), dict(activation="tanh"), ValueError, "activation='tanh'"),
])  # fmt: skip
def test_weight_only_errors_name_the_argument(x, w, kw, exc, match):
    qw = _q(*w) if isinstance(w, tuple) else w
    with pytest.raises(exc, match=match):
        nqdq.matmul(x, qw, device="cpu", **kw)


def test_plain_b_and_dtype_with_a_quantized_a():
    w = data((5, 64), 24)
    for sa in ("mxfp8", "int8_centred", "int8_row"):
        with pytest.raises(TypeError, match="qb must be a QuantizedTensor"):
            nqdq.matmul(_q(sa), w, device="cpu")
    with pytest.raises(TypeError, match="dtype='bfloat16'.*qa is a QuantizedTensor"):
        nqdq.matmul(_q("mxfp8"), _q("mxfp8"), dtype="bfloat16")
