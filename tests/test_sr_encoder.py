"""The 32-bit stochastic float encoder (``device.codec.encode_float_sr32``, what every stochastic
float encode on the GPU runs) against the 64-bit one it replaces (``encode_float_bits(...,
stochastic=True, r)``) and the spec (``reference.codec.encode_float(..., rbits=r)``), bit for
bit, for every float element format; and the device Philox4x32-10 against the reference.

Inputs: every float32 pattern next to each format's rounding boundaries (each code value and
each midpoint, the float32 values just below / at / above them), the normal / subnormal edge
of the target, max and the overflow threshold, the t = 31 / 32 and t = 56 edges of the
encoder's rarest path, float32 subnormals, +-0, +-inf, NaNs with payloads; each crossed with
random words {0, 1, 2^31 - 1, 2^31, 2^32 - 1} and the two words that make the spec's sum carry
exactly and just miss. Then random (u, r) pairs. The device function itself (host: its
``py_func``, plain Python on NumPy scalars) and, in the CUDA simulator, as a kernel.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.spec import FLOAT_FORMATS, code_fields, code_values, float_fields

from numba import cuda

from nqdq.formats import FORMATS
from nqdq.gpu.device import codec as _codec
from nqdq.reference.codec import encode_float
from nqdq.reference.rng import philox4x32_10 as ref_philox

R_FIXED = (0, 1, 2**31 - 1, 2**31, 2**32 - 1)


def _args(name):
    f = FORMATS[name]
    return (f.mbits, f.emin, f.max_code, f.nan_code if f.nan_code is not None else -1, f.bits)


def _spec_t(u: int, name: str) -> tuple[int, int]:
    """(t, discarded bits rem) of the spec's shift for float32 bits ``u`` (finite)."""
    f = FORMATS[name]
    ef = (u >> 23) & 0xFF
    e, m = (ef - 127, (u & 0x7FFFFF) | 0x800000) if ef else (-126, u & 0x7FFFFF)
    t = min(23 - f.mbits + max(f.emin - e, 0), 56)
    return t, m & ((1 << t) - 1)


def carry_words(u: int, name: str) -> tuple[int, ...]:
    """The smallest random word whose sum with the discarded bits carries, and the one
    below it (the spec's top min(t, 32) bits: rem + (r >> (32 - t)) >= 2^t, or
    (rem >> (t - 32)) + r >= 2^32)."""
    if (u & 0x7F800000) == 0x7F800000:
        return ()
    t, rem = _spec_t(u, name)
    if t <= 32:
        need = (1 << t) - rem  # r >> (32 - t) >= need
        r = need << (32 - t)
    else:
        r = (1 << 32) - (rem >> (t - 32))
    return tuple(w for w in (r, r - 1) if 0 <= w < 2**32)


def edge_patterns(name: str) -> np.ndarray:
    """float32 bit patterns at every boundary the encoder has (see module docstring)."""
    f = FORMATS[name]
    mags = code_values(name)[: f.max_code + 1].astype(np.float64)
    ulp_top = mags[-1] - mags[-2]
    v = np.concatenate([
        mags,
        (mags[:-1] + mags[1:]) / 2,  # midpoints
        [mags[-1] + ulp_top / 2, mags[-1] + ulp_top, 2 * mags[-1], 1e30, 3.4028234663852886e38],
        # the target's normal / subnormal edge, and the subnormal block's t = 31 / 32 and
        # t = 56 edges (t = 23 - M + emin - e)
        [2.0**f.emin, 2.0 ** (f.emin - f.mbits - 8), 2.0 ** (f.emin - f.mbits - 9), 2.0 ** (f.emin - f.mbits - 33)],
        [2.0**-126, 2.0**-127, 2.0**-149],  # float32 normal / subnormal edge
    ]).astype(np.float32)
    u = v.view(np.uint32).astype(np.int64)
    u = np.concatenate([u, u + 1, u - 1, u + 0x7FF, u | 0x7FFFFF])  # neighbours, binade tops
    u = u[(u >= 0) & (u < 0x7F800000)]
    specials = [0, 1, 2, 0x3FFFFF, 0x400000, 0x7FFFFF, 0x800000, 0x7F7FFFFF,  # zero, fp32 subnormals
                0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0x7FA00001]  # inf, NaNs with payloads
    u = np.concatenate([u, specials]).astype(np.uint32)
    return np.unique(np.concatenate([u, u | np.uint32(0x80000000)]))


def edge_pairs(name: str) -> tuple[np.ndarray, np.ndarray]:
    us, rs = [], []
    for u in edge_patterns(name).tolist():
        for r in R_FIXED + carry_words(u, name):
            us.append(u)
            rs.append(r)
    return np.array(us, np.uint32), np.array(rs, np.uint32)


def random_pairs(name: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Half uniform over all float32 bit patterns, half with an exponent over
    [emin - 40, emax + 3] of the format (its normal and subnormal range, and far below)."""
    f = FORMATS[name]
    rng = np.random.default_rng(seed)
    h = n // 2
    u1 = rng.integers(0, 2**32, h, dtype=np.uint64).astype(np.uint32)
    sign = rng.integers(0, 2, n - h, dtype=np.uint32) << np.uint32(31)
    e = rng.integers(f.emin - 40, f.emax + 4, n - h) + 127
    u2 = sign | (e.astype(np.uint32) << np.uint32(23)) | rng.integers(0, 1 << 23, n - h, dtype=np.uint32)
    return np.concatenate([u1, u2]), rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)


def spec_codes(us: np.ndarray, rs: np.ndarray, name: str) -> np.ndarray:
    return encode_float(us.view(np.float32), FORMATS[name], rbits=rs).astype(np.int64)


def host_codes(fn, us, rs, name, *extra):
    a = _args(name)
    return np.array([int(fn.py_func(u, *a, *extra, r)) for u, r in zip(us.tolist(), rs.tolist())], np.int64)


def assert_codes(got, want, us, rs, name, what):
    bad = np.flatnonzero(got != want)
    if bad.size:
        i = bad[0]
        raise AssertionError(
            f"{what} [{name}]: {bad.size} of {got.size} codes differ; first at {i}:\n"
            f"  input {float_fields(us.view(np.float32)[i], np.float32)}  r={int(rs[i]):#010x}\n"
            f"  got   {code_fields(got[i], name)}\n"
            f"  want  {code_fields(want[i], name)}"
        )


def sr32(u, mbits, emin, max_code, nan_code, nbits, r):
    return _codec.encode_float_sr32.py_func(u, mbits, emin, max_code, nan_code, nbits, r)


sr32.py_func = sr32  # host_codes' calling convention


def bits64(u, mbits, emin, max_code, nan_code, nbits, r):
    return _codec.encode_float_bits.py_func(u, mbits, emin, max_code, nan_code, nbits, True, r)


bits64.py_func = bits64


@pytest.mark.parametrize("name", FLOAT_FORMATS)
def test_edges(name):
    """Every boundary pattern x every edge word: sr32 == encode_float_bits == the spec."""
    us, rs = edge_pairs(name)
    want = spec_codes(us, rs, name)
    assert_codes(host_codes(bits64, us, rs, name), want, us, rs, name, "encode_float_bits vs spec")
    assert_codes(host_codes(sr32, us, rs, name), want, us, rs, name, "encode_float_sr32 vs spec")


@pytest.mark.parametrize("name", FLOAT_FORMATS)
def test_random_pairs(name):
    us, rs = random_pairs(name, 60_000, seed=FORMATS[name].bits * 100 + FORMATS[name].mbits)
    assert_codes(host_codes(sr32, us, rs, name), spec_codes(us, rs, name), us, rs, name, "encode_float_sr32 vs spec")


@pytest.mark.parametrize("name", FLOAT_FORMATS)
def test_random_pairs_vs_encode_float_bits(name):
    us, rs = random_pairs(name, 10_000, seed=7 + FORMATS[name].mbits)
    assert_codes(host_codes(sr32, us, rs, name), host_codes(bits64, us, rs, name), us, rs, name,
                 "encode_float_sr32 vs encode_float_bits")


@pytest.mark.parametrize("name", FLOAT_FORMATS)
def test_device_function_in_simulator(name):
    """The device function run as a kernel (CUDA simulator; on a GPU with NQDQ_TEST_GPU=1)."""
    mbits, emin, max_code, nan_code, nbits = _args(name)

    @cuda.jit
    def kernel(us, rs, out):
        i = cuda.grid(1)
        if i < us.size:
            out[i] = _codec.encode_float_sr32(us[i], mbits, emin, max_code, nan_code, nbits, rs[i])

    e_us, e_rs = edge_pairs(name)
    sel = np.random.default_rng(1).choice(e_us.size, min(e_us.size, 1500), replace=False)
    r_us, r_rs = random_pairs(name, 1500, seed=11)
    us = np.concatenate([e_us[sel], r_us])
    rs = np.concatenate([e_rs[sel], r_rs])
    out = np.zeros(us.size, np.uint32)
    kernel[(us.size + 127) // 128, 128](us, rs, out)
    assert_codes(out.astype(np.int64), spec_codes(us, rs, name), us, rs, name, "encode_float_sr32 kernel vs spec")


def test_device_philox_matches_reference():
    """device.codec.philox4x32_10 (one wide multiply each; its host twin) == reference/rng.py,
    counters and keys over the whole 32-bit range."""
    rng = np.random.default_rng(3)
    n = 3000
    c0, c1, k0, k1 = (rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32) for _ in range(4))
    c0[:4] = [0, 1, 0xFFFFFFFF, 0x80000000]
    k0[:4] = [0, 0xFFFFFFFF, 0, 0x9E3779B9]
    z = np.zeros(n, np.uint32)
    want = np.stack(ref_philox((c0, c1, z, z), (k0, k1)), axis=-1).astype(np.int64)
    got = np.array([_codec.philox4x32_10.py_func(int(a), int(b), int(c), int(d)) for a, b, c, d in zip(c0, c1, k0, k1)],
                   np.int64)
    bad = np.flatnonzero((got != want).any(axis=1))
    assert bad.size == 0, (f"{bad.size} blocks differ; first: counter ({c0[bad[0]]:#x}, {c1[bad[0]]:#x}) key "
                           f"({k0[bad[0]]:#x}, {k1[bad[0]]:#x}): {got[bad[0]]} != {want[bad[0]]}")


def fast_codes(us, rs, name, sub):
    """(codes, keys) of device.codec.sr_float_code_fast (its host function) over (us, rs)."""
    f = FORMATS[name]
    out = [_codec.sr_float_code_fast.py_func(u, f.mbits, f.emin, f.max_code, f.bits, r, sub)
           for u, r in zip(us.tolist(), rs.tolist())]
    return np.array([int(c) for c, _ in out], np.int64), np.array([int(k) for _, k in out], np.int64)


@pytest.mark.parametrize("sub", [False, True])
@pytest.mark.parametrize("name", FLOAT_FORMATS)
def test_fast_code_where_its_key_allows(name, sub):
    """sr_float_code_fast (the last-axis kernels' stochastic encode of a finite unit) equals the
    spec wherever its key passes sr_fast_key_bound, over the edge pairs and random pairs of
    finite inputs; and the key passes exactly where the docstring says (a = 0, the normal range,
    and with ``sub`` every |u| down to 2^(emin - M - 8)), so the bound is not vacuous."""
    f = FORMATS[name]
    e_us, e_rs = edge_pairs(name)
    r_us, r_rs = random_pairs(name, 20_000, seed=5 + f.mbits + 10 * sub)
    us = np.concatenate([e_us, r_us])
    rs = np.concatenate([e_rs, r_rs])
    keep = (us & np.uint32(0x7FFFFFFF)) < np.uint32(0x7F800000)  # finite only (the caller's clean units)
    us, rs = us[keep], rs[keep]
    codes, keys = fast_codes(us, rs, name, sub)
    ok = keys >= _codec.sr_fast_key_bound.py_func(f.mbits, f.emin, sub)
    a = (us & np.uint32(0x7FFFFFFF)).astype(np.int64)
    lo = (119 - f.mbits + f.emin) << 23 if sub else (127 + f.emin) << 23
    np.testing.assert_array_equal(ok, (a == 0) | (a >= lo))
    assert ok.mean() > 0.3 and (~ok).any()
    assert_codes(codes[ok], spec_codes(us[ok], rs[ok], name), us[ok], rs[ok], name,
                 f"sr_float_code_fast(sub={sub}) vs spec")


def _e2m1_cases(bits16, rng):
    """float32 patterns of every finite 16-bit value given (bf16 / f16 as float32), each with
    the two carry-exact words and one random word, every eighth also with 0, 2^31 and 2^32 - 1."""
    us, rs = [], []
    for i, u in enumerate(bits16.tolist()):
        fixed = (0, 2**31, 2**32 - 1) if i % 8 == 0 else ()
        for r in fixed + carry_words(u, "e2m1") + (int(rng.integers(0, 2**32)),):
            us.append(u)
            rs.append(r)
    return np.array(us, np.uint32), np.array(rs, np.uint32)


@pytest.mark.parametrize("kind", ["bfloat16", "float16"])
def test_e2m1_float_form(kind):
    """sr_e2m1_code_f (MX e2m1 of 16-bit input under stochastic rounding, by float arithmetic)
    equals the spec for every finite bfloat16 / float16 value q (an MX product x * 2^-k of such
    an x is again one: at most 8 / 11 significant bits) where its key passes, crossed with the
    fixed, carry-exact and random words; and its key passes for q = 0 and every |q| >= 2^-14."""
    import ml_dtypes

    dt = ml_dtypes.bfloat16 if kind == "bfloat16" else np.float16
    v = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(dt).astype(np.float32)
    v = v[np.isfinite(v)]
    us, rs = _e2m1_cases(v.view(np.uint32), np.random.default_rng(4))

    @cuda.jit
    def kernel(qs, rs, codes, keys):  # (it casts bits: a kernel, in the simulator or on a GPU)
        for i in range(cuda.grid(1), qs.size, cuda.gridsize(1)):
            codes[i], keys[i] = _codec.sr_e2m1_code_f(qs[i], rs[i])

    codes = np.zeros(us.size, np.uint32)
    keys = np.zeros(us.size, np.uint32)
    kernel[1, 1](us.view(np.float32), rs, codes, keys)  # (one simulator thread: no thread switching)
    codes, keys = codes.astype(np.int64), keys.astype(np.int64)
    ok = keys >= _codec.E2M1_SR_MIN_BITS - 1
    a = (us & np.uint32(0x7FFFFFFF)).astype(np.int64)
    np.testing.assert_array_equal(ok, (a == 0) | (a >= _codec.E2M1_SR_MIN_BITS))
    assert ok.mean() > 0.5 and (~ok).any()
    assert_codes(codes[ok], spec_codes(us[ok], rs[ok], "e2m1"), us[ok], rs[ok], "e2m1", f"sr_e2m1_code_f ({kind})")


def test_e2m1_integer_form():
    """sr_e2m1_code_i (MX e2m1 and NVFP4 under stochastic rounding, one wide multiply-add an
    element) equals the spec wherever its key passes E2M1_SR_I_KEY, over every
    e2m1 edge pair and random finite float32 q with full 24-bit significands from 2^-40 to 2^10
    (NVFP4's q = x * m_b), crossed with the fixed, carry-exact and random words; the key passes
    exactly for q = +-0, |q| < 2^-33 and |q| >= 2^-10. Run as a kernel: the simulator's twin
    here (Python ints), the inline PTX on a GPU with NQDQ_TEST_GPU=1."""
    rng = np.random.default_rng(27)
    e_us, e_rs = edge_pairs("e2m1")
    n = 6000
    ef = rng.integers(87, 137, n).astype(np.uint32)
    r_us = (rng.integers(0, 2, n, dtype=np.uint32) << np.uint32(31)) | (ef << np.uint32(23)) | \
        rng.integers(0, 1 << 23, n, dtype=np.uint32)
    c_us, c_rs = [], []
    for u in r_us.tolist():  # each random q with its two carry-exact words and one random word
        for r in carry_words(u, "e2m1") + (int(rng.integers(0, 2**32)),):
            c_us.append(u)
            c_rs.append(r)
    us = np.concatenate([e_us, np.array(c_us, np.uint32)])
    rs = np.concatenate([e_rs, np.array(c_rs, np.uint32)])
    keep = (us & np.uint32(0x7FFFFFFF)) < np.uint32(0x7F800000)  # finite (clean groups)
    us, rs = us[keep], rs[keep]

    @cuda.jit
    def kernel(us, rs, codes, keys):
        for i in range(cuda.grid(1), us.size, cuda.gridsize(1)):
            u = us[i]
            codes[i], keys[i] = _codec.sr_e2m1_code_i(u & np.uint32(0x7FFFFFFF), rs[i], u)

    codes = np.zeros(us.size, np.uint32)
    keys = np.zeros(us.size, np.uint32)
    kernel[1, 1](us, rs, codes, keys)  # (one simulator thread: no thread switching)
    ok = keys.astype(np.int64) >= _codec.E2M1_SR_I_KEY
    e = ((us >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int64)
    a = (us & np.uint32(0x7FFFFFFF)).astype(np.int64)
    np.testing.assert_array_equal(ok, (a == 0) | (e < 94) | (e >= 117))
    assert ok.mean() > 0.5 and (~ok).sum() > 100
    assert_codes(codes[ok].astype(np.int64), spec_codes(us[ok], rs[ok], "e2m1"), us[ok], rs[ok], "e2m1",
                 "sr_e2m1_code_i vs spec")
