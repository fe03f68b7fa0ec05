"""Element codecs, bit for bit: nqdq.encode / nqdq.decode against ml_dtypes over every
bf16 and fp16 bit pattern, >= 10^6 random float32 patterns concentrated on each format's
range, exact ties, overflow, subnormals, signed zeros, inf and NaN; plus hand-worked cases
whose expected bits are derived in comments from the format definitions.

Conventions checked (ml_dtypes 0.5/0.6, which nqdq matches):
* saturate=False is exactly ``x.astype(ml_dtypes.<type>)``;
* saturate=True (default) equals it on every input that does not overflow, and finite
  overflow / +-inf give +-max;
* formats without NaN (e2m1, e2m3, e3m2) encode NaN as the zero whose sign bit is the
  complement of the NaN's sign bit (ml_dtypes: float4_e2m1fn(nan) == -0.0).
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from helpers.spec import (
    FLOAT_FORMATS,
    MAX_CODE,
    SPEC,
    all_bf16_as_f32,
    all_f16_as_f32,
    assert_codes_equal,
    assert_same_floats,
    bits,
    code_values,
    concentrated_f32,
    oracle_encode,
    special_f32,
)

import nqdq

N_RANDOM = 1_000_000


def ml_codes(x, name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NaN/inf casts
        return np.asarray(x).astype(SPEC[name][3]).view(np.uint8)


def encode(x, name, saturate):
    return nqdq.encode(x, name, saturate=saturate, packed=False)


def input_sets(name):
    return {
        "all-bf16": all_bf16_as_f32(),
        "all-fp16": all_f16_as_f32(),
        "random-f32": concentrated_f32(name, N_RANDOM, seed=bits(name) * 1000 + SPEC[name][0]),
        "specials": special_f32(name),
    }


# ----------------------------------------------------------------------------- vs ml_dtypes
@pytest.mark.parametrize("name", FLOAT_FORMATS)
def test_encode_nonsaturating_equals_ml_dtypes(name):
    for label, x in input_sets(name).items():
        got = encode(x, name, saturate=False)
        assert got.dtype == np.uint8
        assert_codes_equal(got, ml_codes(x, name), x, name, f"saturate=False, {label}")


@pytest.mark.parametrize("name", FLOAT_FORMATS)
def test_encode_saturating(name):
    """Equal to ml_dtypes wherever ml_dtypes does not overflow; +-max code otherwise."""
    max_code = MAX_CODE[name]
    sign = 1 << (bits(name) - 1)
    for label, x in input_sets(name).items():
        got = encode(x, name, saturate=True)
        want = ml_codes(x, name)
        is_nan = np.isnan(x)
        # Overflow per the spec card: |x| rounds (RNE, unbounded exponent) above max.
        mag = np.where(np.isfinite(x), np.abs(x), 0)
        over = np.isinf(x) | (oracle_encode(mag, name, saturate=False) != oracle_encode(mag, name, saturate=True))
        want = np.where(over & ~is_nan, np.where(np.signbit(x), sign | max_code, max_code), want).astype(np.uint8)
        assert_codes_equal(got, want, x, name, f"saturate=True, {label}")


def test_encode_in_chunks(monkeypatch):
    """Arrays larger than codec.CHUNK are encoded a chunk at a time (the int64 temporaries
    stay small): with a chunk of 12 elements, odd sizes and 2-D shapes whose rows straddle
    chunks, every float format against ml_dtypes, stochastic codes and integer codes against
    the same functions in one pass, and random bits of another size refused."""
    from nqdq.formats import get_format
    from nqdq.reference import codec
    from nqdq.reference.rng import random_bits

    monkeypatch.setattr(codec, "CHUNK", 12)
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((7, 143)) * 30).astype(np.float32)
    x.flat[::50] = np.nan
    x.flat[3::70] = -np.inf
    x.flat[5::41] = -0.0
    r = random_bits(9, x.size).reshape(x.shape)
    for name in FLOAT_FORMATS:
        fmt = get_format(name)
        got = codec.encode_float(x, fmt, saturate=False)
        assert got.shape == x.shape and got.dtype == np.uint8
        assert_codes_equal(got, ml_codes(x, name), x, name, "in chunks")
        np.testing.assert_array_equal(codec.encode_float(x, fmt, rbits=r),
                                      codec.encode_float.__wrapped__(x, fmt, rbits=r))
    for name in ("int8", "int4"):
        for sym in (True, False):
            fmt = get_format(name)
            got = codec.encode_int(x[:, 1:], fmt, symmetric=sym, rbits=r[:, 1:])  # (a strided view)
            np.testing.assert_array_equal(got, codec.encode_int.__wrapped__(x[:, 1:], fmt, symmetric=sym, rbits=r[:, 1:]))
    with pytest.raises(ValueError, match="rbits has 1000 elements"):
        codec.encode_float(x, get_format("e4m3"), rbits=r.reshape(-1)[:1000])


@pytest.mark.parametrize("name", FLOAT_FORMATS)
@pytest.mark.parametrize("saturate", [False, True])
def test_encode_equals_exact_oracle(name, saturate):
    """A second, independent expectation: exact float64 rounding (tests/helpers/spec.py, oracle_encode)
    on the finite inputs, for float32 and for float64 inputs with full 52-bit mantissas."""
    x = concentrated_f32(name, 200_000, seed=7)
    assert_codes_equal(encode(x, name, saturate), oracle_encode(x, name, saturate=saturate), x, name, "f32")
    # float64 inputs whose low mantissa bits are not zero: nqdq rounds them once, directly
    # from float64. (ml_dtypes 0.6 goes through float32 first, which double-rounds values
    # just off a tie, e.g. 1.0625 + 2^-40 -> 0x38 there; nqdq gives the correctly rounded 0x39.)
    rng = np.random.default_rng(11)
    x64 = x.astype(np.float64) * (1 + rng.uniform(-2**-20, 2**-20, x.size))
    assert_codes_equal(encode(x64, name, saturate), oracle_encode(x64, name, saturate=saturate), x64, name, "f64")


@pytest.mark.parametrize("name", FLOAT_FORMATS)
def test_encode_float64_exact_inputs_equal_ml_dtypes(name):
    """float64 inputs that are exactly float32 (so no double rounding is possible) give the
    ml_dtypes codes, including specials."""
    for label, x in input_sets(name).items():
        with np.errstate(invalid="ignore"):
            x64 = x.astype(np.float64)
        assert_codes_equal(encode(x64, name, False), ml_codes(x64, name), x64, name, f"float64 {label}")


def test_float64_near_tie_is_correctly_rounded():
    # 1.0625 is the e4m3 tie between 1.0 (0x38) and 1.125 (0x39); 2^-40 above it is nearer
    # to 1.125, 2^-40 below it nearer to 1.0. (Not representable in float32.)
    x = np.array([1.0625 + 2.0**-40, 1.0625 - 2.0**-40, -(1.0625 + 2.0**-40)])
    assert encode(x, "e4m3", False).tolist() == [0x39, 0x38, 0xB9]


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("name", FLOAT_FORMATS)
def test_encode_half_inputs_equal_their_float32(name, dtype):
    x = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    for sat in (False, True):
        assert_codes_equal(encode(x, name, sat), encode(x.astype(np.float32), name, sat), x.astype(np.float32), name)


# ----------------------------------------------------------------------------- e8m0
def test_e8m0_encode_equals_ml_dtypes():
    rng = np.random.default_rng(3)
    sets = {
        "all-bf16": all_bf16_as_f32(),
        "all-fp16": all_f16_as_f32(),
        "random-f32": rng.integers(0, 2**32, N_RANDOM, dtype=np.uint64).astype(np.uint32).view(np.float32),
        # powers of two and the midpoints 1.5 * 2^k around them, including f32 subnormals
        "pow2": np.ldexp(np.float32(1), np.arange(-149, 128)).astype(np.float32),
        "mid": (np.float32(1.5) * np.ldexp(np.float32(1), np.arange(-149, 127))).astype(np.float32),
    }
    for label, x in sets.items():
        got = nqdq.encode(x, "e8m0")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = x.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
        assert_codes_equal(got, want, x, "e8m0", label)


def test_e8m0_encode_float64():
    x = np.array([1.0, 0.75, 2.0**-127, 3.0 * 2**100])
    # 1.0 = 2^0 -> 127; 0.75 = 1.5 * 2^-1 is the (linear) tie 2^-1 / 2^0, ties up -> 127;
    # 2^-127 -> 0; 3 * 2^100 = 1.5 * 2^101 -> up to 2^102 -> 229.
    assert nqdq.encode(x, "e8m0").tolist() == [127, 127, 0, 229]


def test_ue4m3_encode_float64():
    # ue4m3 is e4m3fn with the sign bit clear: 1.0 -> 0x38, 448 -> 0x7E, 1000 saturates -> 0x7E
    assert nqdq.encode(np.array([1.0, 448.0, 1000.0]), "ue4m3").tolist() == [0x38, 0x7E, 0x7E]


def test_ue4m3_encode_by_hand():
    x = np.array([1.0, 1.0625, 448.0, 1000.0, 2.0**-9, 0.0, np.nan], np.float32)
    # e4m3fn codes with sign 0: 0x38, tie -> 0x38, 0x7E, saturates 0x7E, 0x01, 0x00, NaN 0x7F
    assert nqdq.encode(x, "ue4m3").tolist() == [0x38, 0x38, 0x7E, 0x7E, 0x01, 0x00, 0x7F]


def test_ue4m3_never_sets_the_sign_bit():
    x = np.array([-0.0, -np.nan], np.float32)
    try:
        codes = nqdq.encode(x, "ue4m3")
    except ValueError:
        return  # refusing them is fine too
    assert (codes & 0x80).tolist() == [0, 0], codes


def test_e8m0_hand_worked():
    x = np.array([1.0, 2.0, 0.5, 2.0**127, 2.0**-127, 0.0, -1.0, np.inf, np.nan], np.float32)
    # 2^(c - 127): 1 -> 127, 2 -> 128, 0.5 -> 126, 2^127 -> 254, 2^-127 -> 0;
    # e8m0 has no zero, no sign and no inf: 0, negatives, inf and NaN -> 0xFF (NaN).
    assert nqdq.encode(x, "e8m0").tolist() == [127, 128, 126, 254, 0, 255, 255, 255, 255]


# ----------------------------------------------------------------------------- decode
@pytest.mark.parametrize("name", FLOAT_FORMATS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.float64])
def test_decode_every_code_equals_ml_dtypes(name, dtype):
    codes = np.arange(1 << bits(name), dtype=np.uint8)
    want = codes.view(SPEC[name][3]).astype(np.float32).astype(dtype)
    got = nqdq.decode(codes, name, packed=False, dtype=dtype)
    assert_same_floats(got, want, f"decode {name} -> {np.dtype(dtype).name}")
    # and the values are those of the spec card
    assert_same_floats(
        nqdq.decode(codes, name, packed=False, dtype=np.float64), code_values(name), f"decode {name} vs card"
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.float64])
def test_decode_e8m0_every_code(dtype):
    codes = np.arange(256, dtype=np.uint8)
    with np.errstate(over="ignore"):  # 2^16 and up are inf in float16
        want = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32).astype(dtype)
        got = nqdq.decode(codes, "e8m0", dtype=dtype)
    assert_same_floats(got, want, "decode e8m0")
    # by hand: code 0 is 2^-127 (a float32 subnormal), 127 is 1.0, 254 is 2^127, 255 is NaN
    v = nqdq.decode(np.array([0, 127, 254, 255], np.uint8), "e8m0", dtype=np.float64)
    assert v[0] == 2.0**-127 and v[1] == 1.0 and v[2] == 2.0**127 and np.isnan(v[3])


@pytest.mark.parametrize("name", FLOAT_FORMATS)
def test_encode_decode_every_code_round_trips(name):
    codes = np.arange(1 << bits(name), dtype=np.uint8)
    vals = nqdq.decode(codes, name, packed=False)
    ok = ~np.isnan(vals)
    back = encode(vals[ok], name, saturate=False)
    assert_codes_equal(back, codes[ok], vals[ok], name, "decode->encode")


# ----------------------------------------------------------------------------- hand-worked
NAN = np.nan
INF = np.inf

# (value, saturating code, non-saturating code). Every expectation is derived from the
# format definition: value = (-1)^s * 2^(e - bias) * 1.m, subnormal 2^(1 - bias) * 0.m.
HAND = {
    "e4m3": [  # bias 7, 3 mantissa bits; code = s.eeee.mmm
        (1.0, 0x38, 0x38),  # 2^0: e = 7 = 0111, m = 000 -> 0011_1000
        (1.125, 0x39, 0x39),  # 1.001b -> m = 001
        (1.0625, 0x38, 0x38),  # halfway 1.0 (m=000) / 1.125 (m=001): ties to even m=000
        (1.1875, 0x3A, 0x3A),  # halfway 1.125 (m=001) / 1.25 (m=010): even is 010
        (-1.0625, 0xB8, 0xB8),  # sign bit 0x80 on the same tie
        (448.0, 0x7E, 0x7E),  # max = 1.75 * 2^8: e = 15 = 1111, m = 110 (111 is NaN)
        (464.0, 0x7E, 0x7E),  # halfway 448 / 480 (the unusable S.1111.111): even m=110 -> 448
        (464.0001, 0x7E, 0x7F),  # past the tie rounds to 480: overflow -> max / NaN (no inf)
        (480.0, 0x7E, 0x7F),
        (1e30, 0x7E, 0x7F),
        (-464.0001, 0xFE, 0xFF),
        (INF, 0x7E, 0x7F),  # inf saturates to max, or is NaN non-saturating (no inf code)
        (-INF, 0xFE, 0xFF),
        (2.0**-6, 0x08, 0x08),  # min normal: e = 1, m = 000
        (7 * 2.0**-9, 0x07, 0x07),  # max subnormal 0.111b * 2^-6
        (2.0**-9, 0x01, 0x01),  # min subnormal 0.001b * 2^-6 = 2^-9
        (2.0**-10, 0x00, 0x00),  # halfway 0 / 2^-9: ties to even -> 0
        (1.5 * 2.0**-10, 0x01, 0x01),  # 0.75 * 2^-9 > half -> 2^-9
        (3 * 2.0**-10, 0x02, 0x02),  # 1.5 * 2^-9, halfway codes 1 / 2: even -> 2
        (0.0, 0x00, 0x00),
        (-0.0, 0x80, 0x80),  # signed zero keeps its sign
        (-1e-30, 0x80, 0x80),  # underflows to -0
        (NAN, 0x7F, 0x7F),  # NaN = S.1111.111, sign kept
        (-NAN, 0xFF, 0xFF),
    ],
    "e5m2": [  # bias 15, 2 mantissa bits; code = s.eeeee.mm
        (1.0, 0x3C, 0x3C),  # e = 15 = 01111, m = 00
        (1.125, 0x3C, 0x3C),  # halfway 1.0 (m=00) / 1.25 (m=01): even -> 00
        (1.375, 0x3E, 0x3E),  # halfway 1.25 (01) / 1.5 (10): even -> 10
        (57344.0, 0x7B, 0x7B),  # max 1.75 * 2^15: e = 30 = 11110, m = 11
        (61439.99609375, 0x7B, 0x7B),  # just below the 57344 / 65536 midpoint
        (61440.0, 0x7B, 0x7C),  # the midpoint: ties to even = 2^16 (m=00) = overflow -> inf
        (INF, 0x7B, 0x7C),  # inf = S.11111.00
        (-INF, 0xFB, 0xFC),
        (2.0**-16, 0x01, 0x01),  # min subnormal 0.01b * 2^-14
        (2.0**-17, 0x00, 0x00),  # halfway 0 / 2^-16 -> even 0
        (3 * 2.0**-17, 0x02, 0x02),  # halfway codes 1 / 2 -> 2
        (-0.0, 0x80, 0x80),
        (NAN, 0x7E, 0x7E),  # quiet NaN S.11111.10, sign kept
        (-NAN, 0xFE, 0xFE),
    ],
    "e2m1": [  # bias 1, 1 mantissa bit; codes 0..7 = 0, .5, 1, 1.5, 2, 3, 4, 6
        (0.25, 0x0, 0x0),  # halfway 0 / 0.5 -> even code 0
        (0.75, 0x2, 0x2),  # halfway 0.5 (code 1) / 1 (code 2) -> 2
        (1.25, 0x2, 0x2),  # halfway 1 (2) / 1.5 (3) -> 2
        (1.75, 0x4, 0x4),  # halfway 1.5 (3) / 2 (4) -> 4
        (2.5, 0x4, 0x4),  # halfway 2 (4) / 3 (5) -> 4
        (3.5, 0x6, 0x6),  # halfway 3 (5) / 4 (6) -> 6
        (5.0, 0x6, 0x6),  # halfway 4 (6) / 6 (7) -> 6
        (5.0001, 0x7, 0x7),
        (6.0, 0x7, 0x7),  # max: e = 11, m = 1
        (7.0, 0x7, 0x7),  # no inf/NaN: overflow saturates in both modes (ml_dtypes)
        (INF, 0x7, 0x7),
        (-INF, 0xF, 0xF),
        (-0.0, 0x8, 0x8),
        (-0.1, 0x8, 0x8),  # rounds to -0
        (NAN, 0x8, 0x8),  # no NaN: ml_dtypes gives -0.0 (sign bit complemented)
        (-NAN, 0x0, 0x0),
    ],
    "e2m3": [  # bias 1, 3 mantissa bits; subnormal step 2^(1-1-3) = 0.125, max 1.875 * 4 = 7.5
        (1.0, 0x08, 0x08),  # e = 01, m = 000
        (1.0625, 0x08, 0x08),  # halfway 1.0 (000) / 1.125 (001) -> 000
        (0.0625, 0x00, 0x00),  # halfway 0 / 0.125 -> 0
        (0.1875, 0x02, 0x02),  # halfway 0.125 (1) / 0.25 (2) -> 2
        (7.5, 0x1F, 0x1F),  # max: e = 11, m = 111
        (7.75, 0x1F, 0x1F),  # halfway 7.5 / 8: no inf, saturates
        (-INF, 0x3F, 0x3F),
        (-0.0, 0x20, 0x20),
        (NAN, 0x20, 0x20),  # ml_dtypes: NaN -> -0
        (-NAN, 0x00, 0x00),
    ],
    "e3m2": [  # bias 3, 2 mantissa bits; subnormal step 2^(1-3-2) = 0.0625, max 1.75 * 16 = 28
        (1.0, 0x0C, 0x0C),  # e = 011, m = 00
        (1.125, 0x0C, 0x0C),  # halfway 1.0 (00) / 1.25 (01) -> 00
        (1.375, 0x0E, 0x0E),  # halfway 1.25 (01) / 1.5 (10) -> 10
        (0.03125, 0x00, 0x00),  # halfway 0 / 0.0625 -> 0
        (28.0, 0x1F, 0x1F),  # max: e = 111, m = 11
        (30.0, 0x1F, 0x1F),  # halfway 28 / 32: no inf, saturates
        (INF, 0x1F, 0x1F),
        (-0.0, 0x20, 0x20),
        (NAN, 0x20, 0x20),
        (-NAN, 0x00, 0x00),
    ],
}


@pytest.mark.parametrize("name", FLOAT_FORMATS)
@pytest.mark.parametrize("saturate", [True, False])
def test_hand_worked_cases(name, saturate):
    vals = [v for v, _, _ in HAND[name]]
    x = np.array(vals, np.float32)
    assert [bool(np.signbit(v)) for v in x] == [bool(np.signbit(v)) for v in vals]  # -NaN keeps its sign
    want = np.array([s if saturate else n for _, s, n in HAND[name]], np.uint8)
    assert_codes_equal(encode(x, name, saturate), want, x, name, f"hand-worked saturate={saturate}")
    # float64 inputs give the same codes
    assert_codes_equal(encode(x.astype(np.float64), name, saturate), want, x, name, "hand-worked float64")


def test_negative_nan_has_sign_bit():
    x = np.array([-np.nan], np.float32)
    assert np.signbit(x[0])
    assert encode(x, "e4m3", True).tolist() == [0xFF]


@pytest.mark.parametrize("name", ["e2m1", "e2m3", "e3m2"])
def test_decode_ignores_bits_above_the_format(name):
    """decode of unpacked codes reads only the format's low bits (so a code with stray
    high bits, e.g. an unmasked nibble, still decodes as itself)."""
    codes = np.arange(1 << bits(name), dtype=np.uint8)
    high = codes | np.uint8(0xFF ^ ((1 << bits(name)) - 1))
    assert_same_floats(
        nqdq.decode(high, name, packed=False), nqdq.decode(codes, name, packed=False), "high bits"
    )


# ----------------------------------------------------------------------------- integers
def test_int8_encode_hand_worked():
    x = np.array([2.5, 3.5, -2.5, -3.5, 0.5, 1.5, -0.5, 126.5, 127.49, 200, -200, 127.5, -128.5, np.inf, -np.inf,
                  np.nan, -0.0], np.float32)
    # round half to even: 2.5 -> 2, 3.5 -> 4, -2.5 -> -2, -3.5 -> -4, 0.5 -> 0, 1.5 -> 2, -0.5 -> 0,
    # 126.5 -> 126; saturation to [-128, 127]; NaN -> 0.
    want = [2, 4, -2, -4, 0, 2, 0, 126, 127, 127, -128, 127, -128, 127, -128, 0, 0]
    got = nqdq.encode(x, "int8")
    assert got.dtype == np.int8
    assert got.tolist() == want
    assert nqdq.encode(x.astype(np.float64), "int8").tolist() == want


def test_int4_encode_hand_worked():
    x = np.array([2.5, 3.5, -2.5, 7.4, 7.5, 9, -8.5, -9, np.nan, -np.inf], np.float32)
    # RNE then saturation to [-8, 7]; NaN -> 0
    want = [2, 4, -2, 7, 7, 7, -8, -8, 0, -8]
    assert nqdq.encode(x, "int4", packed=False).tolist() == want
    # packed: element 2i in the low nibble, nibbles are 4-bit two's complement:
    #   (2, 4) -> 0x42; (-2 = 0xE, 7) -> 0x7E; (7, 7) -> 0x77; (-8 = 0x8, -8) -> 0x88; (0, -8) -> 0x80
    assert nqdq.encode(x, "int4").tolist() == [0x42, 0x7E, 0x77, 0x88, 0x80]
    # [1, -1, 7, -8, 3]: (1, 0xF) -> 0xF1; (7, 0x8) -> 0x87; (3, pad 0) -> 0x03
    assert nqdq.encode(np.array([1, -1, 7, -8, 3], np.float32), "int4").tolist() == [0xF1, 0x87, 0x03]


def test_int_decode_every_code():
    codes = np.arange(-128, 128, dtype=np.int16).astype(np.int8)
    assert nqdq.decode(codes, "int8").tolist() == list(range(-128, 128))
    # int4 nibbles 0..15 are two's complement: 0..7, -8..-1; two per byte, low nibble first
    packed = np.array([0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE], np.uint8)
    assert nqdq.decode(packed, "int4").tolist() == list(range(8)) + list(range(-8, 0))
    # the codec on byte codes (a table of every byte value) and on wider integers (the rule)
    from nqdq.formats import get_format
    from nqdq.reference.codec import decode_int

    b = np.arange(256, dtype=np.uint8)
    assert decode_int(b, get_format("int8"), symmetric=False).tolist() == list(range(256))  # zero-point codes
    assert decode_int(b, get_format("int8")).tolist() == list(range(128)) + list(range(-128, 0))
    assert decode_int(b.reshape(16, 16), get_format("int4")).reshape(-1).tolist() == [((v & 15) ^ 8) - 8 for v in range(256)]
    assert decode_int(np.array([3, -3, 300], np.int16), get_format("int8"), symmetric=False).tolist() == [3, -3, 300]
    assert decode_int(b, get_format("int8")).dtype == np.float32


def test_encode_int_rejects_saturate_false():
    with pytest.raises(ValueError, match="saturate"):
        nqdq.encode(np.ones(4, np.float32), "int8", saturate=False)
