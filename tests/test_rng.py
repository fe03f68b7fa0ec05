"""Philox4x32-10 known answers, and the properties stochastic rounding must have:
deterministic per seed, position-keyed (independent of shape), unbiased, and never
moving a value that is exactly representable."""

from __future__ import annotations

import numpy as np
import pytest

import nqdq
from nqdq.reference.rng import philox4x32_10, random_bits

# Random123 kat_vectors, philox4x32 with 10 rounds: (counter c0..c3, key k0 k1) -> output
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),  # pi digits
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("counter,key,want", PHILOX_KAT)
def test_philox_known_answers(counter, key, want):
    out = philox4x32_10(tuple(np.uint32(c) for c in counter), tuple(np.uint32(k) for k in key))
    assert [int(w) for w in out] == list(want)
    assert all(np.asarray(w).dtype == np.uint32 for w in out)


def test_philox_vectorized_matches_scalar():
    c = np.array([0, 0xFFFFFFFF, 0x243F6A88], np.uint32)
    c1 = np.array([0, 0xFFFFFFFF, 0x85A308D3], np.uint32)
    c2 = np.array([0, 0xFFFFFFFF, 0x13198A2E], np.uint32)
    c3 = np.array([0, 0xFFFFFFFF, 0x03707344], np.uint32)
    k0 = np.array([0, 0xFFFFFFFF, 0xA4093822], np.uint32)
    k1 = np.array([0, 0xFFFFFFFF, 0x299F31D0], np.uint32)
    out = np.stack(philox4x32_10((c, c1, c2, c3), (k0, k1)), axis=-1)
    assert out.tolist() == [list(w) for _, _, w in PHILOX_KAT]


def test_random_bits_layout():
    # element i takes word i % 4 of the block at counter (i // 4, 0, 0, 0), key = seed:
    # with seed 0 the first four elements are the counter-0 / key-0 known answer.
    assert random_bits(0, 4).tolist() == list(PHILOX_KAT[0][2])
    assert random_bits(0, 3).tolist() == list(PHILOX_KAT[0][2][:3])
    seed = (0x299F31D0 << 32) | 0xA4093822  # key (low word, high word)
    blk = philox4x32_10((np.uint32(5), np.uint32(0), np.uint32(0), np.uint32(0)),
                        (np.uint32(0xA4093822), np.uint32(0x299F31D0)))
    assert random_bits(seed, 24)[20:24].tolist() == [int(w) for w in blk]
    # a prefix of a longer stream is the shorter stream
    np.testing.assert_array_equal(random_bits(12345, 1000)[:37], random_bits(12345, 37))


def test_random_bits_in_chunks(monkeypatch):
    """random_bits works codec.CHUNK elements (whole blocks) at a time: with a chunk of 8,
    the words of blocks computed in one vectorized call, for sizes that end inside a block."""
    from nqdq.reference import codec

    seed = (0x299F31D0 << 32) | 0xA4093822
    blocks = np.arange(10, dtype=np.uint32)
    zero = np.zeros_like(blocks)
    want = np.stack(philox4x32_10((blocks, zero, zero, zero), (np.uint32(0xA4093822), np.uint32(0x299F31D0))),
                    axis=-1).reshape(-1)
    monkeypatch.setattr(codec, "CHUNK", 8)
    for n in (0, 1, 7, 8, 9, 23, 37, 40):
        got = random_bits(seed, n)
        assert got.dtype == np.uint32 and got.shape == (n,)
        np.testing.assert_array_equal(got, want[:n])


def _sr(x, seed, scheme="e4m3", **kw):
    kw.setdefault("granularity", "tensor")
    kw.setdefault("scale", 1.0)
    return nqdq.quantize(x, scheme, rounding="stochastic", seed=seed, **kw)


def test_stochastic_is_deterministic_per_seed():
    x = np.random.default_rng(0).standard_normal((64, 96)).astype(np.float32)
    a, b, c = _sr(x, 7), _sr(x, 7), _sr(x, 8)
    np.testing.assert_array_equal(a.codes, b.codes)
    assert not np.array_equal(a.codes, c.codes)
    # and differs from round-to-nearest somewhere (it is actually stochastic)
    rne = nqdq.quantize(x, "e4m3", granularity="tensor", scale=1.0)
    assert not np.array_equal(a.codes, rne.codes)


@pytest.mark.parametrize("scheme,kw", [
    ("e4m3", dict(granularity="tensor", scale=1.0)),
    ("int8", dict(granularity="tensor", scale=0.01)),
    ("mxfp4", {}),
    ("nvfp4", {}),
])
def test_stochastic_is_independent_of_shape(scheme, kw):
    """Bits are keyed by the C-order index: the same flat data in another shape (with the
    same scale groups) gets the same codes."""
    flat = np.random.default_rng(1).standard_normal(64 * 32).astype(np.float32)
    shapes = [(64, 32), (32, 64), (2, 32, 32), (16, 4, 32)]
    outs = []
    for shp in shapes:
        q = nqdq.quantize(flat.reshape(shp), scheme, rounding="stochastic", seed=99, **kw)
        outs.append((q.unpacked_codes().reshape(-1), np.asarray(q.scales).reshape(-1)))
    for codes, scales in outs[1:]:
        np.testing.assert_array_equal(codes, outs[0][0])
        np.testing.assert_array_equal(scales, outs[0][1])


@pytest.mark.parametrize("value,lo,hi,scheme", [
    # e4m3: 1.03 lies between 1.0 (0x38) and 1.125 (0x39); the same below zero
    (1.03, 1.0, 1.125, "e4m3"),
    (-1.03, -1.125, -1.0, "e4m3"),
    # e4m3 subnormal range: 0.3 * 2^-9 lies between 0 and the min subnormal 2^-9
    (0.3 * 2.0**-9, 0.0, 2.0**-9, "e4m3"),
    # e5m2: 3.3 between 3.0 and 3.5
    (3.3, 3.0, 3.5, "e5m2"),
    (-3.3, -3.5, -3.0, "e5m2"),
    # int8 with scale 1: 0.3 between 0 and 1, -41.7 between -42 and -41
    (0.3, 0.0, 1.0, "int8"),
    (-41.7, -42.0, -41.0, "int8"),
])
def test_stochastic_is_unbiased(value, lo, hi, scheme):
    n = 1_000_000
    v = np.float32(value)
    x = np.full(n, v, np.float32)
    q = _sr(x, 2024, scheme)
    y = nqdq.dequantize(q).astype(np.float64)
    assert set(np.unique(y).tolist()) <= {lo, hi}
    p = (float(v) - lo) / (hi - lo)  # probability of rounding up
    sigma = (hi - lo) * np.sqrt(p * (1 - p) / n)
    assert abs(y.mean() - float(v)) < 4 * sigma, (y.mean(), float(v), sigma)


def test_stochastic_mx_is_unbiased():
    # mxfp4 (rceil): a block of 1.2 has amax * fp32(1/6) ~= 0.2 -> scale 2^-2, so each
    # element is 1.2 / 0.25 = 4.8, between the e2m1 values 4 and 6: P(up) = 0.4.
    n = 32 * 20000
    x = np.full((n // 32, 32), np.float32(1.2), np.float32)
    q = nqdq.quantize(x, "mxfp4", rounding="stochastic", seed=5)
    assert np.all(np.asarray(q.scales) == 125)  # 2^(125 - 127) = 0.25
    y = nqdq.dequantize(q).astype(np.float64)
    assert set(np.unique(y).tolist()) == {1.0, 1.5}
    sigma = 0.5 * np.sqrt(0.4 * 0.6 / n)
    assert abs(y.mean() - float(np.float32(1.2))) < 4 * sigma


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m3", "e3m2"])
@pytest.mark.parametrize("seed", [0, 1, 2**64 - 1])
def test_stochastic_keeps_representable_values(fmt, seed):
    codes = np.arange(1 << {"e4m3": 8, "e5m2": 8, "e2m3": 6, "e3m2": 6}[fmt], dtype=np.uint8)
    vals = nqdq.decode(codes, fmt, packed=False)
    vals = vals[np.isfinite(vals)]
    x = np.tile(vals, 50)
    q = nqdq.quantize(x, fmt, granularity="tensor", scale=1.0, rounding="stochastic", seed=seed)
    y = nqdq.dequantize(q)
    np.testing.assert_array_equal(y, x)
    assert np.array_equal(np.signbit(y), np.signbit(x))  # -0 stays -0


@pytest.mark.parametrize("seed", [0, 3, 2**63 + 5])
def test_stochastic_keeps_integers(seed):
    x = np.tile(np.arange(-127, 128, dtype=np.float32), 40)
    q = nqdq.quantize(x, "int8", granularity="tensor", scale=1.0, rounding="stochastic", seed=seed)
    np.testing.assert_array_equal(np.asarray(q.codes, np.float32), x)


def test_stochastic_mx_keeps_representable_values():
    # a block whose values are e2m1 values times 2^3 (amax 6 * 8 = 48): rceil gives
    # 48 * fp32(1/6) = 8 (exact after rounding) -> scale 2^3, every element exact.
    base = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6] * 4, np.float32) * 8
    x = np.tile(base, (100, 1))
    x[:, 1::2] *= -1
    q = nqdq.quantize(x, "mxfp4", rounding="stochastic", seed=11)
    np.testing.assert_array_equal(nqdq.dequantize(q), x)


# ----------------------------------------------------------------------------- the exact rule
def test_stochastic_rule_float_exact():
    """docs/numerics.md: a float format drops t low bits of the significand; stochastic
    rounding adds the top t of the element's 32 random bits (t <= 32) to the dropped bits and
    keeps the carry. Recomputed here for e4m3 with scale 1 and |x| in [2^-18, 448): with
    e = floor(log2|x|) and the 24-bit significand m, t = 20 + max(-6 - e, 0) (23 - 3 mantissa
    bits, plus the subnormal shift below 2^-6), the code magnitude is
    (m >> t) + carry + 8 * max(e + 6, 0), saturating at 0x7E."""
    rng = np.random.default_rng(17)
    n = 200_000
    e = rng.integers(-18, 9, n)
    x = (np.ldexp(1 + rng.random(n), e) * rng.choice([-1, 1], n)).astype(np.float32)
    x = np.where(np.abs(x) < 448, x, np.float32(300.0)).astype(np.float32)
    seed = 0xDEADBEEF12345678
    q = nqdq.quantize(x, "e4m3", granularity="tensor", scale=1.0, rounding="stochastic", seed=seed)
    r = random_bits(seed, n).astype(np.int64)
    u = np.abs(x).view(np.uint32).astype(np.int64)
    ef = u >> 23  # all inputs are float32 normals
    m = (u & 0x7FFFFF) | 0x800000  # 24-bit significand
    e = ef - 127
    t = 20 + np.maximum(-6 - e, 0)
    assert t.max() <= 32
    kept = m >> t
    dropped = m & ((1 << t) - 1)
    up = dropped + (r >> (32 - t)) >= (1 << t)
    mag = kept + up + (np.maximum(e + 6, 0) << 3)  # code magnitude: binade offset + mantissa
    mag = np.minimum(mag, 0x7E)  # rounding up from the top binade saturates
    want = (mag | (np.signbit(x).astype(np.int64) << 7)).astype(np.uint8)
    np.testing.assert_array_equal(np.asarray(q.codes), want)


def test_stochastic_rule_int_exact():
    """docs/numerics.md: integers round up when (bits >> 8) * 2^-24 < frac(v)."""
    rng = np.random.default_rng(18)
    n = 200_000
    x = (rng.standard_normal(n) * 40).astype(np.float32)
    seed = 77
    q = nqdq.quantize(x, "int8", granularity="tensor", scale=1.0, rounding="stochastic", seed=seed)
    r = random_bits(seed, n)
    fl = np.floor(x.astype(np.float64))
    frac = x.astype(np.float64) - fl
    want = np.clip(fl + ((r >> 8).astype(np.float64) * 2.0**-24 < frac), -127, 127)
    np.testing.assert_array_equal(np.asarray(q.codes, np.float64), want)


def test_stochastic_rule_at_its_extremes():
    """Where the random bits are extreme the rule is decided by one unit: e4m3 keeps t = 20
    dropped bits for values in [1, 2). At an index whose top 20 random bits are all ones, an
    exactly representable value (dropped bits 0) must still not move; at an index whose top 20
    random bits are all zero, a value one float32 ulp below the next code (dropped bits
    2^20 - 1) must still round down."""
    seed, n = 0, 1 << 22
    top = random_bits(seed, n) >> np.uint32(12)
    ones = np.flatnonzero(top == 0xFFFFF)[:3]
    zeros = np.flatnonzero(top == 0)[:2]
    assert len(ones) == 3 and len(zeros) == 2  # (about 4 of each are expected in 2^22)
    x = np.ones(n, np.float32)
    x[ones] = 1.125  # 0x39, exact
    x[zeros] = np.float32(1.125) - np.float32(2.0**-23)  # dropped bits all ones
    q = nqdq.quantize(x, "e4m3", granularity="tensor", scale=1.0, rounding="stochastic", seed=seed)
    c = np.asarray(q.codes)
    assert c[ones].tolist() == [0x39] * 3
    assert c[zeros].tolist() == [0x38] * 2
