"""Scale formulas and element codes of the NumPy reference, worked by hand and checked
against a deliberately slow scalar re-derivation on Python Fractions.

Hex codes below are derived from the spec cards (value = 2^(e - bias) * 1.m):
e4m3: 1.75 * 2^6 = 112 -> e = 13 = 1101, m = 110 -> 0x6E; e2m1 codes 0..7 = 0, .5, 1, 1.5,
2, 3, 4, 6 and 0x8 | c for negatives; e8m0 code = k + 127 for a scale 2^k.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from helpers.spec import SPEC, f32_round, per_element

import nqdq

F32 = np.float32


def q_codes(q):
    return np.asarray(q.unpacked_codes())


# ============================================================================ MX scales
# e2m1: emax_elem = 2 (6 = 1.5 * 2^2), max_elem = 6; fp32(1/6) = 11184811 * 2^-26.
# e4m3: emax_elem = 8 (448 = 1.75 * 2^8), max_elem = 448.
MX_SCALE_CASES = [
    # (scheme, amax, floor, rceil, even)
    # amax 6: floor(log2 6) = 2 -> k = 0; rceil 6 * fp32(1/6) = 1 + 2^-25 -> fp32 1.0 -> k = 0;
    # even: 6 = 1.1b * 2^2 is already 1 mantissa bit -> k = 0.        All: code 127.
    ("mxfp4", 6.0, 127, 127, 127),
    # amax 5: floor -> 0; rceil 5 * fp32(1/6) = 0.8333 -> 2^0; even 1.01b rounds half-up to 1.0b (the
    # dropped bits 01 are below half) -> 4 -> k = 0.
    ("mxfp4", 5.0, 127, 127, 127),
    # amax 7 = 1.11b * 2^2: floor -> k = 0 (7 then saturates to 6); rceil 7/6 = 1.17 -> 2^1 -> 128;
    # even: 1.11b + half of the 1-bit ulp (0.01b) = 10.00b -> 8 = 2^3 -> k = 1 -> 128.
    ("mxfp4", 7.0, 127, 128, 128),
    # amax 6.5 = 1.101b * 2^2: floor 127; rceil 6.5/6 > 1 -> 128; even 1.101b + 0.01b = 1.111b
    # -> mantissa cleared -> 2^2 -> 127.
    ("mxfp4", 6.5, 127, 128, 127),
    # amax 3 = 1.1b * 2^1: floor k = 1 - 2 = -1 -> 126; rceil 3 * fp32(1/6) = (2^25 + 1) * 2^-26
    # -> fp32 0.5 exactly -> k = -1 -> 126; even exact -> 126.
    ("mxfp4", 3.0, 126, 126, 126),
    # amax 3.5 = 1.11b * 2^1: floor -> 126; rceil 3.5/6 = 0.58 -> 2^0 -> 127; even 1.11b + 0.01b
    # = 10.0b -> 2^2 -> k = 0 -> 127.
    ("mxfp4", 3.5, 126, 127, 127),
    # amax 448: floor 8 - 8 = 0; rceil 448 * fp32(1/448) = 1 + 3 * 2^-26 -> fp32 1.0 -> 0;
    # even 1.11b (3 mantissa bits: 1.110b) exact -> 0.            All 127.
    ("mxfp8", 448.0, 127, 127, 127),
    # amax 449: floor 127; rceil 449/448 > 1 -> 128; even 1.1100000011b + 2^-4 -> 1.1110...b
    # -> 2^8 -> 127.
    ("mxfp8", 449.0, 127, 128, 127),
    # amax 496 = 1.1111b * 2^8: even adds 2^-4 -> 10.0000b -> 2^9 -> k = 1 -> 128;
    # floor 127; rceil 496/448 > 1 -> 128.
    ("mxfp8", 496.0, 127, 128, 128),
    # amax 6 + 2^-21 (the float32 after 6): floor 127; even 1.1000..01b + 0.01b -> 1.11b -> 2^2 -> 127;
    # rceil: fp32(1/6) = (1 + 2^-25)/6, so v = (1 + 2^-21/6)(1 + 2^-25) = 1 + 1.09e-7, which rounds
    # to fp32 1 + 2^-23 (> 1) -> 2^1 -> 128.
    ("mxfp4", float.fromhex("0x1.800002p+2"), 127, 128, 127),
    # amax 448 + 2^-15: fp32(1/448) = (1 + 3 * 2^-26)/448, v = 1 + 1.13e-7 -> fp32 1 + 2^-23 -> 128.
    ("mxfp8", float.fromhex("0x1.c00002p+8"), 127, 128, 127),
    # amax 2^-140 (a float32 subnormal): floor k = -142 clamps to -127 -> code 0;
    # rceil 2^-140 * fp32(1/6) <= 2^-127 -> code 0; even as floor -> 0.
    ("mxfp4", 2.0**-140, 0, 0, 0),
    # amax 2^-126: floor -128 -> clamps to 0; rceil 2^-126 / 6 ~ 2^-128.6 <= 2^-127 -> 0.
    ("mxfp4", 2.0**-126, 0, 0, 0),
    # amax FLT_MAX = (2 - 2^-23) * 2^127: floor k = 127 - 2 = 125 -> 252; rceil FLT_MAX / 6 =
    # 2^125.4 -> 2^126, capped at 127 - emax = 125 (mx_top_code: 4 * 2^126 would be inf) -> 252.
    ("mxfp4", float(np.finfo(np.float32).max), 252, 252, None),
    # amax 0: no division by zero; floor k = -127 (clamped) -> code 0; rceil 0 -> code 0.
    ("mxfp4", 0.0, 0, 0, 0),
    ("mxfp8", 0.0, 0, 0, 0),
]


@pytest.mark.parametrize("scheme,amax,floor,rceil,even", MX_SCALE_CASES)
def test_mx_scale_code_by_hand(scheme, amax, floor, rceil, even):
    x = np.zeros((2, 32), F32)
    x[0, 3] = amax
    x[1, 5] = -amax  # the sign does not matter
    for rounding, want in (("floor", floor), ("rceil", rceil), ("even", even)):
        if want is None:
            continue
        q = nqdq.quantize(x, scheme, scale_rounding=rounding)
        assert np.asarray(q.scales).tolist() == [[want], [want]], (rounding, amax)


def test_mx_even_scale_of_huge_finite_block_is_finite():
    x = np.zeros((1, 32), F32)
    x[0, 0] = np.finfo(np.float32).max
    x[0, 1] = 1.0
    q = nqdq.quantize(x, "mxfp4", scale_rounding="even")
    # torchao EVEN: the rounded amax has exponent field 0xFF -> 128 - emax_elem 2 = 126 (253),
    # capped at 127 - emax = 125 (mx_top_code: every code decodes finite) -> 252
    assert np.asarray(q.scales).tolist() == [[252]]
    assert np.isfinite(nqdq.dequantize(q)).all()
    assert nqdq.dequantize(q)[0, 1] == 0.0  # 1.0 is far below the block's step


def test_mx_elements_by_hand():
    x = np.zeros((1, 32), F32)
    x[0, :5] = [7.0, 3.5, -0.26, 0.25, 1.75]
    # floor: scale 2^0. 7 saturates to 6 (code 7); 3.5 is the 3/4 tie -> 4 (code 6);
    # -0.26 is past the 0/0.5 midpoint -> -0.5 (0x9); 0.25 is the 0/0.5 tie -> 0; 1.75 is the
    # 1.5/2 tie -> 2 (code 4).
    q = nqdq.quantize(x, "mxfp4", scale_rounding="floor")
    assert q_codes(q)[0, :5].tolist() == [7, 6, 0x9, 0, 4]
    assert nqdq.dequantize(q)[0, :5].tolist() == [6.0, 4.0, -0.5, 0.0, 2.0]
    # rceil: scale 2^1, elements 3.5, 1.75, -0.13, 0.125, 0.875 -> 4 (6), 2 (4), -0 (0x8),
    # 0 (0), 1 (2: 0.875 is past the 0.5/1 midpoint 0.75)
    q = nqdq.quantize(x, "mxfp4", scale_rounding="rceil")
    assert q_codes(q)[0, :5].tolist() == [6, 4, 0x8, 0, 2]
    y = nqdq.dequantize(q)[0, :5]
    assert y.tolist() == [8.0, 4.0, 0.0, 0.0, 2.0] and np.signbit(y[2])
    # padding elements of the packed byte stream are code 0
    assert q.codes.shape == (1, 16)


MX_PRESETS = ("mxfp8", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4")


@pytest.mark.parametrize("scheme,rounding", [(s, r) for s in MX_PRESETS for r in ("floor", "rceil", "even")]
                         + [("nvfp4", None)])
def test_zero_blocks_decode_to_exact_zeros(scheme, rounding):
    x = np.zeros((3, 64), F32)
    x[1, 40:] = np.linspace(-1, 1, 24, dtype=F32)
    kw = {} if rounding is None else dict(scale_rounding=rounding)
    q = nqdq.quantize(x, scheme, **kw)
    y = nqdq.dequantize(q)
    assert np.isfinite(y).all()
    assert np.all(y[0] == 0) and np.all(y[2] == 0) and np.all(y[1, :32] == 0)
    if scheme != "nvfp4":
        assert np.asarray(q.scales)[0].tolist() == [0, 0]  # 2^-127
    x0 = np.zeros((2, 32), F32)
    q0 = nqdq.quantize(x0, scheme, **kw)
    assert np.all(nqdq.dequantize(q0) == 0)
    if scheme == "nvfp4":
        assert float(q0.tensor_scale) == 1.0  # S_enc = 1 when A == 0, S_dec = 1


# ============================================================================ NVFP4
def test_nvfp4_worked_example():
    """Tensor amax A = 6 -> S_enc = 2688 / 6 = 448 (exact).
    t = fp32(448 * fp32(1/6)) = fp32(448 * 11184811 * 2^-26) = 9786710 * 2^-17 = 74.66667175...
    block 0, amax 6:   6 * t = 58720260 * 2^-17 = 448.0000305 (exact in fp32) -> e4m3 saturating,
                       below the 448/480 midpoint -> 448 = 0x7E
    block 1, amax 1.5: 1.5 * t = 112.0000076 -> e4m3 112 = 0x6E
    S_dec = fp32(1/448) = 9586981 * 2^-32 = 0x1.24924Ap-9
    m_0 = 1 / fp32(448 * S_dec) = 1 / fp32(1 + 3 * 2^-26) = 1 / 1.0 = 1
    m_1 = 1 / fp32(112 * S_dec) = 1 / fp32(0.25 + 48 * 2^-32) = 1 / 0.25 = 4
    elements: block 0 [6, 3] -> e2m1 6 (7), 3 (5); block 1 [1.5, -0.75, 0.4] * 4 = [6, -3, 1.6]
    -> 7, 0xD, 1.5 (3: 1.6 is below the 1.5/2 midpoint)
    decode: value * fp32(s_b * S_dec): block 0 * 1.0, block 1 * 0.25 -> [1.5, -0.75, 0.375]."""
    x = np.zeros(32, F32)
    x[[0, 1]] = [6.0, 3.0]
    x[[16, 17, 18]] = [1.5, -0.75, 0.4]
    q = nqdq.quantize(x, "nvfp4")
    assert np.asarray(q.scales).tolist() == [0x7E, 0x6E]
    assert float(q.tensor_scale) == float.fromhex("0x1.24924Ap-9")
    c = q_codes(q)
    assert c[[0, 1, 16, 17, 18]].tolist() == [7, 5, 7, 0xD, 3]
    assert np.count_nonzero(c) == 5
    y = nqdq.dequantize(q)
    assert y[[0, 1, 16, 17, 18]].tolist() == [6.0, 3.0, 1.5, -0.75, 0.375]


def test_nvfp4_block_scale_uses_fp32_reciprocal_of_6():
    """The block scale multiplies by the fp32 *reciprocal* of 6 (TransformerEngine), which is
    not the same as dividing by 6: with A = 6, S_enc = 448 and
      t = fp32(448 * fp32(1/6)) = 0x1.2aaaacp+6  (fp32(448 / 6) would be 0x1.2aaaaap+6, 1 ulp lower).
    A block with amax b = 0x1.724924p+2 (5.785714) gives b * t = 0x1.b00002p+8 = 432.00003, just
    past the e4m3 midpoint 432 between 416 (0x7D) and 448 (0x7E) -> 0x7E. (With 448 / 6 it would be
    431.99997 -> 0x7D.) Its multiplier is then 1, and b encodes to e2m1 6 (code 7)."""
    b = float.fromhex("0x1.724924p+2")
    x = np.zeros((1, 32), F32)
    x[0, 0] = 6.0
    x[0, 16] = b
    q = nqdq.quantize(x, "nvfp4")
    assert np.asarray(q.scales).tolist() == [[0x7E, 0x7E]]
    assert q_codes(q)[0, [0, 16]].tolist() == [7, 7]


# ============================================================================ float scales
def test_per_tensor_scale_and_codes_by_hand():
    x = np.array([[1.0, -3.0], [2.0, 0.5]], F32)
    q = nqdq.quantize(x, "fp8_tensor")
    # s = fp32(amax / 448) = fp32(3 / 448); x / s = 149.3, -448, 298.7, 74.7 ->
    # e4m3 144 = 1.125 * 2^7 (0x71), -448 (0xFE), 288 = 1.125 * 2^8 (0x79), 72 = 1.125 * 2^6 (0x69)
    assert np.asarray(q.scales).tolist() == [[F32(3) / F32(448)]]
    assert q_codes(q).tolist() == [[0x71, 0xFE], [0x79, 0x69]]


def test_per_row_int8_by_hand():
    x = np.array([[1.0, -3.0, 0.25, 4.0], [0.0, 0.0, 0.0, 0.0]], F32)
    q = nqdq.quantize(x, "int8_row")
    # row 0: s = fp32(4/127); x / s = 31.75, -95.25, 7.94, 127 -> 32, -95, 8, 127
    # row 1: amax 0 -> s = 1 (usable, never 0), codes 0
    assert np.asarray(q.scales).tolist() == [[F32(4) / F32(127)], [1.0]]
    assert q_codes(q).tolist() == [[32, -95, 8, 127], [0, 0, 0, 0]]
    assert np.all(nqdq.dequantize(q)[1] == 0)


def test_per_group_int4_by_hand():
    x = np.array([[0.7, -0.1, 0.3, 0.2, 0.0, 0.0, 0.0, 0.0]], F32)
    q = nqdq.quantize(x, "int4", granularity="group", group_size=4)
    # group 0: s = fp32(0.7 / 7) ~ 0.1 -> 7, -1, 3, 2; group 1: all zero -> s = 1, codes 0
    assert np.asarray(q.scales).tolist() == [[F32(0.7) / F32(7), 1.0]]
    assert q_codes(q).tolist() == [[7, -1, 3, 2, 0, 0, 0, 0]]
    # packed int4 nibbles: (7, -1 = 0xF) -> 0xF7, (3, 2) -> 0x23, zeros
    assert np.asarray(q.codes).tolist() == [[0xF7, 0x23, 0x00, 0x00]]


def test_per_block_by_hand():
    x = np.array([[1.0, 2.0, 1.0, -8.0], [2.5, 4.0, 0.5, 0.0]], F32)
    q = nqdq.quantize(x, "e4m3", granularity="block", block_shape=2)
    # block (0,0) = [[1, 2], [2.5, 4]]: s = fp32(4/448) = fp32(1/112); x/s = 112, 224, 280, 448
    #   -> 112 = 1.75 * 2^6 (0x6E), 224 = 1.75 * 2^7 (0x76), 280 -> 288 = 1.125 * 2^8 (0x79), 0x7E
    # block (0,1) = [[1, -8], [0.5, 0]]: s = fp32(8/448); x/s = 56 = 1.75 * 2^5 (0x66), -448 (0xFE),
    #   28 = 1.75 * 2^4 (0x5E), 0
    assert np.asarray(q.scales).tolist() == [[F32(4) / F32(448), F32(8) / F32(448)]]
    assert q_codes(q).tolist() == [[0x6E, 0x76, 0x66, 0xFE], [0x79, 0x7E, 0x5E, 0x00]]


@pytest.mark.parametrize("scheme,kw,max_elem", [
    ("fp8_tensor", {}, 448.0),
    ("fp8_row", {}, 448.0),
    ("e5m2", dict(granularity="row"), 57344.0),
    ("int8_row", {}, 127.0),
    ("int8_column", {}, 127.0),
    ("fp8_1x128", {}, 448.0),
    ("int4_group", {}, 7.0),
    ("fp8_128x128", {}, 448.0),
])
def test_float_scales_are_amax_over_max(scheme, kw, max_elem):
    """s = fp32(amax / max_elem) per group, with the groups formed here by NumPy slicing."""
    x = np.random.default_rng(8).standard_normal((256, 384)).astype(F32) * F32(3)
    x[7, 300] = 1000.0
    q = nqdq.quantize(x, scheme, **kw)
    s = np.asarray(q.scales)
    a = np.abs(x)
    if scheme == "fp8_tensor":
        amax = a.max().reshape(1, 1)
    elif q.scheme.granularity == "row":
        amax = a.max(axis=1, keepdims=True)
    elif q.scheme.granularity == "column":
        amax = a.max(axis=0, keepdims=True)
    elif q.scheme.granularity == "group":
        amax = a.reshape(256, 3, 128).max(axis=2)
    else:
        amax = a.reshape(2, 128, 3, 128).max(axis=(1, 3))
    np.testing.assert_array_equal(s, amax / F32(max_elem))
    # and every element code is the saturating RNE code of fp32(x / s): clip to +-max, then
    # the ml_dtypes cast (or np.rint for integers)
    v = np.clip(x / per_element(s, q.scheme.block_for(x.shape), x.shape), -max_elem, max_elem)
    if q.scheme.fmt.startswith("int"):
        np.testing.assert_array_equal(q_codes(q), np.rint(v))
    else:
        np.testing.assert_array_equal(q_codes(q), v.astype(SPEC[q.scheme.fmt][3]).view(np.uint8))


def test_static_scale():
    x = np.array([[1.0, -2.0, 500.0], [0.1, 0.0, -0.3]], F32)
    q = nqdq.quantize(x, "e4m3", granularity="tensor", scale=0.5)
    # x / 0.5 = 2 = 2^1 (e = 1000, 0x40), -4 = -2^2 (0xC8), 1000 (saturates to 448 = 0x7E),
    # 0.2 = 1.6 * 2^-3 -> 1.625 (e = 0100, m = 101: 0x25), 0, -0.6 = -1.2 * 2^-1 -> -1.25 (0xB2)
    assert np.asarray(q.scales).tolist() == [[0.5]]
    assert q_codes(q).tolist() == [[0x40, 0xC8, 0x7E], [0x25, 0x00, 0xB2]]
    # per-row static scales broadcast from a column vector
    q = nqdq.quantize(x, "int8", granularity="row", scale=np.array([[0.25], [0.01]], F32))
    assert q_codes(q).tolist() == [[4, -8, 127], [10, 0, -30]]


# ============================================================================ zero points
def test_asymmetric_int8_by_hand():
    x = np.array([[-1.0, 0.0, 1.0, 3.0], [-4.0, -1.0, 0.0, 0.0], [1.0, 2.2, 4.0, 0.0]], F32)
    q = nqdq.quantize(x, "int8", symmetric=False)
    # row 0: lo = -1, hi = 3, s = fp32(4/255); zp = rint(1/s = 63.75) = 64;
    #        codes rint(x/s) + 64: -64 + 64 = 0, 64, 64 + 64 = 128, rint(191.25) + 64 = 255
    # row 1: lo = -4, hi = 0 (max(max x, 0)), s = fp32(4/255); zp = rint(255) = 255;
    #        codes -255 + 255 = 0, rint(-63.75) + 255 = 191, 255, 255
    # row 2: lo = 0 (min(min x, 0)), hi = 4, s = fp32(4/255), zp = 0;
    #        codes rint(63.75) = 64, rint(140.25) = 140, 255, 0
    s = F32(4) / F32(255)
    assert np.asarray(q.scales).tolist() == [[s], [s], [s]]
    assert np.asarray(q.zero_points).tolist() == [[64], [255], [0]]
    assert np.asarray(q.codes).dtype == np.uint8
    assert q_codes(q).tolist() == [[0, 64, 128, 255], [0, 191, 255, 255], [64, 140, 255, 0]]
    y = nqdq.dequantize(q)
    # decode (code - zp) * s: zero is exact, the rest within s/2
    assert y[0, 1] == 0 and y[1, 2] == 0 and y[2, 3] == 0
    assert np.max(np.abs(y - x)) <= s / 2 * 1.0001


def test_asymmetric_int4_by_hand():
    x = np.array([[1.0, 2.2, 4.0, 0.0]], F32)
    q = nqdq.quantize(x, "int4", symmetric=False, group_size=4)
    # lo = 0, hi = 4, s = fp32(4/15), zp = 0: rint(3.75) = 4, rint(8.25) = 8, 15, 0
    assert np.asarray(q.zero_points).tolist() == [[0]]
    assert q_codes(q).tolist() == [[4, 8, 15, 0]]
    assert np.asarray(q.codes).tolist() == [[0x84, 0x0F]]  # unsigned nibbles, low first


# ============================================================================ centred INT8
def test_centred_int8_restores_mean():
    x = np.empty((2, 128), F32)
    x[0, 0::2], x[0, 1::2] = 6.0, 4.0  # mean 5 exactly, centred values +-1
    x[1] = 7.25  # constant: centred values all 0
    q = nqdq.quantize(x, "int8_centred")
    assert np.asarray(q.means).tolist() == [[5.0], [7.25]]
    # row 0: s = fp32(1/127), codes +-127; row 1: amax 0 -> s = 1, codes 0
    assert np.asarray(q.scales).tolist() == [[F32(1) / F32(127)], [1.0]]
    c = q_codes(q)
    assert np.all(c[0, 0::2] == 127) and np.all(c[0, 1::2] == -127) and np.all(c[1] == 0)
    # decode code * s + mean: fp32(127 * fp32(1/127)) is within an ulp of 1, + 5 rounds to 6;
    # the constant row is exact (a plain symmetric quantizer would be off by ~7.25/254)
    np.testing.assert_array_equal(nqdq.dequantize(q), x)


def test_centred_partial_group_divides_by_real_count():
    x = np.zeros((1, 130), F32)
    x[0, :128] = 1.0
    x[0, 128:] = [10.0, 20.0]
    q = nqdq.quantize(x, "int8_centred")
    # the partial group holds 2 elements: mean (10 + 20) / 2 = 15, not 30 / 128
    assert np.asarray(q.means).tolist() == [[1.0, 15.0]]
    assert np.asarray(q.scales).tolist() == [[1.0, F32(5) / F32(127)]]
    assert q_codes(q)[0, 128:].tolist() == [-127, 127]


# ============================================================================ partial blocks
PARTIAL = [
    # scheme, options, shape, slice giving the last (partial) group(s) alone
    ("e4m3", dict(granularity="group", group_size=32), (3, 50), np.s_[:, 32:]),
    ("int4", dict(granularity="group", group_size=32), (3, 50), np.s_[:, 32:]),
    ("int8", dict(granularity="group", group_size=32, symmetric=False), (3, 50), np.s_[:, 32:]),
    ("int8_centred", {}, (2, 200), np.s_[:, 128:]),
    ("fp8_128x128", {}, (130, 200), np.s_[128:, 128:]),
    ("e4m3", dict(granularity="block", block_shape=(16, 8)), (33, 17), np.s_[32:, 16:]),
    ("mxfp4", {}, (3, 50), np.s_[:, 32:]),
    ("mxfp6_e3m2", {}, (3, 50), np.s_[:, 32:]),
    ("mxfp8", dict(scale_rounding="floor"), (3, 50), np.s_[:, 32:]),
]


@pytest.mark.parametrize("scheme,kw,shape,sl", PARTIAL)
def test_partial_group_scale_comes_from_its_own_elements(scheme, kw, shape, sl):
    rng = np.random.default_rng(9)
    x = rng.standard_normal(shape).astype(F32)
    x[..., :8] *= 50  # the full groups are much larger: a padded/averaged scale would show
    q = nqdq.quantize(x, scheme, **kw)
    sshape = tuple(-(-d // b) for d, b in zip(shape, q.scheme.block_for(shape)))
    assert np.asarray(q.scales).shape == sshape
    part = nqdq.quantize(np.ascontiguousarray(x[sl]), scheme, **kw)
    last = tuple(slice(-s, None) for s in np.asarray(part.scales).shape)
    np.testing.assert_array_equal(np.asarray(q.scales)[last], np.asarray(part.scales))
    np.testing.assert_array_equal(q_codes(q)[sl], q_codes(part))
    for k in ("zero_points", "means"):
        if getattr(q, k) is not None:
            np.testing.assert_array_equal(np.asarray(getattr(q, k))[last], np.asarray(getattr(part, k)))
    y = nqdq.dequantize(q)
    np.testing.assert_array_equal(y[sl], nqdq.dequantize(part))


def test_nvfp4_partial_block():
    # the tensor scale depends on the whole tensor, so keep the global amax in the tail
    x = np.random.default_rng(10).standard_normal((3, 50)).astype(F32)
    x[1, 49] = 9.0
    q = nqdq.quantize(x, "nvfp4")
    assert np.asarray(q.scales).shape == (3, 4)
    part = nqdq.quantize(np.ascontiguousarray(x[:, 48:]), "nvfp4")
    assert float(part.tensor_scale) == float(q.tensor_scale)
    np.testing.assert_array_equal(np.asarray(q.scales)[:, 3:], np.asarray(part.scales))
    np.testing.assert_array_equal(q_codes(q)[:, 48:], q_codes(part))


# ============================================================================ scalar oracle
def format_table(ebits, mbits, max_code):
    """Fraction value of codes 0..max_code (positive finite), from the definition."""
    bias = (1 << (ebits - 1)) - 1
    out = []
    for c in range(max_code + 1):
        ef, man = c >> mbits, c & ((1 << mbits) - 1)
        if ef == 0:
            out.append(Fraction(man, 1 << mbits) * Fraction(2) ** (1 - bias))
        else:
            out.append((1 + Fraction(man, 1 << mbits)) * Fraction(2) ** (ef - bias))
    return out


E4M3_TABLE = format_table(4, 3, 0x7E)
E2M1_TABLE = format_table(2, 1, 0x7)


def encode_scalar(v: Fraction, negative: bool, table, sign_bit):
    """Nearest table entry, ties to the even code, saturating; sign bit from ``negative``."""
    a = abs(v)
    best = None
    for c, t in enumerate(table):
        d = abs(a - t)
        if best is None or d < best[0] or (d == best[0] and c % 2 == 0):
            best = (d, c)
    if a > table[-1]:
        best = (0, len(table) - 1)
    return best[1] | (sign_bit if negative else 0)


def floor_log2(a: Fraction) -> int:
    k = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2) ** k > a:
        k -= 1
    while Fraction(2) ** (k + 1) <= a:
        k += 1
    return k


def oracle_fp8_row(x):
    codes, scales = [], []
    for row in x.tolist():
        amax = max(abs(Fraction(v)) for v in row)
        s = f32_round(amax / 448)
        if s == 0:
            s = Fraction(1)
        scales.append(float(s))
        codes.append([encode_scalar(f32_round(Fraction(v) / s), math.copysign(1, v) < 0, E4M3_TABLE, 0x80)
                      for v in row])
    return np.array(codes), np.array(scales)


def oracle_mxfp4(x, rounding):
    inv6 = f32_round(Fraction(1, 6))
    codes, scales = [], []
    for row in x.tolist():
        crow, srow = [], []
        for b in range(0, len(row), 32):
            blk = row[b : b + 32]
            amax = max(abs(Fraction(v)) for v in blk)
            if rounding == "floor":
                k = -127 if amax == 0 else floor_log2(amax) - 2  # emax(e2m1) = 2
            else:  # rceil: smallest 2^k >= fp32(amax * fp32(1/6))
                v = f32_round(amax * inv6)
                if v == 0:
                    k = -127
                else:
                    k = floor_log2(v)
                    if Fraction(2) ** k < v:
                        k += 1
            k = min(max(k, -127), 127)
            srow.append(k + 127)
            crow += [encode_scalar(f32_round(Fraction(v) / Fraction(2) ** k), math.copysign(1, v) < 0, E2M1_TABLE, 0x8)
                     for v in blk]
        codes.append(crow)
        scales.append(srow)
    return np.array(codes), np.array(scales)


def oracle_nvfp4(x):
    flt_max = Fraction(float(np.finfo(np.float32).max))
    A = max(abs(Fraction(v)) for v in x.reshape(-1).tolist())
    s_enc = Fraction(1) if A == 0 else f32_round(Fraction(2688) / A)
    s_enc = flt_max if s_enc is None else min(s_enc, flt_max)
    if s_enc == 0:
        s_enc = Fraction(1)
    t = f32_round(s_enc * f32_round(Fraction(1, 6)))
    s_dec = f32_round(1 / s_enc)
    codes, scales = [], []
    for row in x.tolist():
        crow, srow = [], []
        for b in range(0, len(row), 16):
            blk = row[b : b + 16]
            bamax = max(abs(Fraction(v)) for v in blk)
            sc = encode_scalar(f32_round(bamax * t), False, E4M3_TABLE, 0x80)
            srow.append(sc)
            den = f32_round(E4M3_TABLE[sc] * s_dec)
            m = flt_max if den == 0 else min(f32_round(1 / den) or flt_max, flt_max)
            crow += [encode_scalar(f32_round(Fraction(v) * m), math.copysign(1, v) < 0, E2M1_TABLE, 0x8) for v in blk]
        codes.append(crow)
        scales.append(srow)
    return np.array(codes), np.array(scales), float(s_dec)


def oracle_inputs(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, 64)) * 10.0 ** rng.uniform(-4, 4, (6, 1))
    x[0, :32] = 0.0  # an all-zero block / group
    x[0, 40] = -0.0
    # exact e2m1 ties once scaled by 2^-3 (block amax 6 * 2^-3 = 0.75 gives k = -3 for both roundings)
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -0.75, -1.25, -5.0, 0.1, 4.4, 0.0, 3.0])
    x[1, :32] = np.tile(ties, 2) * 2.0**-3
    x[2, 32:] = rng.standard_normal(32) * 1e-39  # float32 subnormals
    x[3, 5] = 1e30  # an outlier
    return x.astype(F32)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_oracle_fp8_per_row(seed):
    x = oracle_inputs(seed)
    q = nqdq.quantize(x, "fp8_row")
    codes, scales = oracle_fp8_row(x)
    np.testing.assert_array_equal(np.asarray(q.scales)[:, 0], scales.astype(F32))
    np.testing.assert_array_equal(q_codes(q), codes)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("rounding", ["floor", "rceil"])
def test_oracle_mxfp4(seed, rounding):
    x = oracle_inputs(seed)
    q = nqdq.quantize(x, "mxfp4", scale_rounding=rounding)
    codes, scales = oracle_mxfp4(x, rounding)
    np.testing.assert_array_equal(np.asarray(q.scales), scales)
    np.testing.assert_array_equal(q_codes(q), codes)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_oracle_nvfp4(seed):
    x = oracle_inputs(seed)
    x[3, 5] = 300.0  # keep A moderate so the other rows are not all flushed to zero
    q = nqdq.quantize(x, "nvfp4")
    codes, scales, s_dec = oracle_nvfp4(x)
    assert float(q.tensor_scale) == s_dec
    np.testing.assert_array_equal(np.asarray(q.scales), scales)
    np.testing.assert_array_equal(q_codes(q), codes)


# ============================================================================ centred mean order
def halving_sum_scalar(vals):
    """docs/numerics.md: pad with zeros to a power of two, then repeatedly add the top half
    to the bottom half, in float32 (a warp's butterfly order). Scalar Python loop."""
    v = [F32(a) for a in vals]
    p = 1
    while p < len(v):
        p *= 2
    v += [F32(0)] * (p - len(v))
    while len(v) > 1:
        h = len(v) // 2
        v = [F32(v[i] + v[i + h]) for i in range(h)]
    return v[0]


@pytest.mark.parametrize("group_size,n", [(128, 256), (96, 200), (32, 50)])
def test_centred_mean_uses_the_halving_order(group_size, n):
    rng = np.random.default_rng(group_size)
    x = (rng.standard_normal((3, n)) * 10.0 ** rng.uniform(-3, 3, (3, n)) + 7).astype(F32)
    q = nqdq.quantize(x, "int8_centred", group_size=group_size)
    means = np.asarray(q.means)
    seq_differs = False
    for r in range(3):
        for g, start in enumerate(range(0, n, group_size)):
            grp = x[r, start : start + group_size]
            # docs/numerics.md: leaves scaled by 2^-k (P = 2^k = the group size padded to a
            # power of two), halving-summed, then times fp32(P) / fp32(count)
            P = 1 << (group_size - 1).bit_length()
            scaled = [F32(F32(a) * F32(1.0 / P)) for a in grp.tolist()]
            want = F32(halving_sum_scalar(scaled) * F32(F32(P) / F32(len(grp))))
            assert means[r, g].view(np.uint32) == want.view(np.uint32), (r, g, means[r, g], want)
            seq = F32(0)
            for a in grp:
                seq = F32(seq + a)
            seq_differs |= F32(seq / F32(len(grp))) != want
    assert seq_differs  # the data is such that the summation order matters


# ============================================================================ extreme finite input
def test_asymmetric_huge_finite_range_stays_finite():
    x = np.array([[-3e38, 3e38, 0.0, 1e38]], F32)
    q = nqdq.quantize(x, "int8", symmetric=False, nonfinite="raise")  # finite input: no error...
    y = nqdq.dequantize(q)
    assert np.isfinite(np.asarray(q.scales)).all() and np.isfinite(y).all()  # ...and no NaN either
    # step (6e38 / 255) ~ 2.4e36: every value within half a step
    assert np.max(np.abs(y.astype(np.float64) - x)) <= 1.2e36 * 1.01


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_centred_huge_finite_group_stays_finite():
    x = np.full((1, 128), 3e38, F32)
    q = nqdq.quantize(x, "int8_centred", nonfinite="raise")
    np.testing.assert_array_equal(nqdq.dequantize(q), x)


# ============================================================================ decode formulas
@pytest.mark.parametrize("scheme,kw", [
    ("fp8_row", {}), ("e5m2", dict(granularity="tensor")), ("fp8_1x128", {}), ("fp8_128x128", {}),
    ("int8_row", {}), ("int4_group", {}), ("int8", dict(symmetric=False)),
    ("int4", dict(symmetric=False, group_size=32)), ("int8_centred", {}),
    ("mxfp8", {}), ("mxfp6_e2m3", {}), ("mxfp6_e3m2", {}), ("mxfp4", dict(scale_rounding="floor")), ("nvfp4", {}),
])
def test_dequantize_follows_the_documented_formula(scheme, kw):
    """docs/numerics.md, decoding: value * s, (code - zp) * s, code * s + mean (product and sum
    rounded separately), value * 2^k, value * fp32(s_b * S_dec); each a float32 operation.
    Element values come from the spec-card tables in tests/helpers/spec.py, not from nqdq."""
    from helpers.spec import code_values

    rng = np.random.default_rng(12)
    x = (rng.standard_normal((130, 256)) * 10.0 ** rng.uniform(-2, 2, (130, 1)) + 0.3).astype(F32)
    q = nqdq.quantize(x, scheme, **kw)
    sch = q.scheme
    codes = q_codes(q)
    if sch.element.kind == "int":
        vals = codes.astype(F32)
    else:
        vals = code_values(sch.fmt).astype(F32)[codes.view(np.uint8)]
    s = np.asarray(q.scales)
    block = sch.block_for(x.shape)

    def per_elem(a):
        return per_element(a, block, x.shape)

    if sch.is_mx:
        want = vals * per_elem(np.ldexp(F32(1), s.astype(np.int32) - 127).astype(F32))
    elif sch.is_nvfp4:
        sb = code_values("e4m3").astype(F32)[s]
        want = vals * per_elem((sb * F32(q.tensor_scale)).astype(F32))
    elif sch.centred:
        want = (vals * per_elem(s)).astype(F32) + per_elem(np.asarray(q.means))
    elif not sch.symmetric:
        want = (vals - per_elem(np.asarray(q.zero_points)).astype(F32)) * per_elem(s)
    else:
        want = vals * per_elem(s)
    want = want.astype(F32)
    np.testing.assert_array_equal(nqdq.dequantize(q).view(np.uint32), want.view(np.uint32))
