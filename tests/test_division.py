"""Division by a reciprocal (nqdq/gpu/device/division.py; docs/numerics.md, "Division by a
reciprocal"): the exact fma twin against rational arithmetic, div_by_recip against the
correctly rounded quotient over hard cases, the guards, and the float-scale kernels that use
it, bit for bit against the reference (simulator: the twins run)."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from numba import cuda

from nqdq.gpu.device import division as D

F32 = np.float32
EPS = 2.0**-23  # float32 spacing in [1, 2)


# ----------------------------------------------------------------------------- exact oracle
def rn_f32(v: Fraction, neg_zero=False) -> np.float32:
    """The rational v rounded to the nearest float32, ties to even (subnormals and overflow
    included); an exact zero is -0.0 if ``neg_zero``."""
    if v == 0:
        return F32(-0.0) if neg_zero else F32(0.0)
    neg = v < 0
    v = -v if neg else v
    e = v.numerator.bit_length() - v.denominator.bit_length()
    if Fraction(2) ** e > v:
        e -= 1
    q = max(e, -126) - 23  # the float32 quantum at v
    m = round(v / Fraction(2) ** q)  # Fraction rounds half to even
    val = m * Fraction(2) ** q
    out = F32(np.inf) if val >= 2**128 else F32(float(val))
    return -out if neg else out


def exact_fma(a, b, c) -> np.float32:
    a, b, c = F32(a), F32(b), F32(c)
    p = Fraction(float(a)) * Fraction(float(b))
    v = p + Fraction(float(c))
    # an exact zero sum is -0 only when both the product and c are -0 (IEEE 754, round to nearest)
    pneg = np.signbit(a) != np.signbit(b)
    return rn_f32(v, neg_zero=(p == 0 and pneg and c == 0 and np.signbit(c)))


def exact_div(x, s) -> np.float32:
    x, s = F32(x), F32(s)
    return rn_f32(Fraction(float(x)) / Fraction(float(s)), neg_zero=np.signbit(x) != np.signbit(s))


def bits(a):
    return np.atleast_1d(np.asarray(a, np.float32)).view(np.uint32)


def assert_bits(got, want, what, *ctx):
    got, want = np.atleast_1d(np.asarray(got, np.float32)), np.atleast_1d(np.asarray(want, np.float32))
    bad = np.nonzero(bits(got) != bits(want))[0]
    if bad.size:
        i = bad[0]
        extra = " ".join(f"{np.atleast_1d(c)[i if np.size(c) > 1 else 0]!r}" for c in ctx)
        raise AssertionError(f"{what}: {bad.size} of {got.size} differ, first at {i}: got {got[i]!r} want {want[i]!r} {extra}")


def div(x, s):
    """div_by_recip (its Python body, vectorized by the twin) with r = RN(1 / s)."""
    s = F32(s)
    return D.div_by_recip.py_func(np.asarray(x, np.float32), s, F32(1) / s)


# ----------------------------------------------------------------------------- the fma twin
def _fma_cases(rng, n):
    """Triples: random magnitudes, products cancelled by c, sums just off a float32
    midpoint (where rounding the float64 sum first would round twice), tiny results."""
    out = []
    for _ in range(n):
        a = F32(rng.standard_normal() * 2.0 ** rng.integers(-40, 40))
        b = F32(rng.standard_normal() * 2.0 ** rng.integers(-40, 40))
        k = rng.integers(0, 4)
        if k == 0:
            c = F32(rng.standard_normal() * 2.0 ** rng.integers(-60, 60))
        elif k == 1:
            c = -F32(a * b)  # cancellation: the exact error of the product survives
        elif k == 2:
            c = F32(-F32(a * b) * F32(1 + rng.integers(-4, 5) * EPS))
        else:
            c = F32(rng.standard_normal() * 2.0**-140)
        out.append((a, b, c))
    # products 2^-24 * (1 -+ 2^-46) added to 1 and 1 + 2^-23: the exact sum is 2^-70 off a midpoint
    for A, B in ((2**23 + 1, 2**24 - 2), (2**23 + 3, 2**24 - 6), (2**23 + 5, 2**24 - 10)):
        a = F32(A * 2.0**-23)
        b = F32(B * 2.0**-48)
        for c in (1.0, 1.0 + EPS, 2.0 - EPS, -1.0, -(1.0 + EPS)):
            out += [(a, b, F32(c)), (-a, b, F32(-c))]
    z = F32(0.0)
    out += [(z, F32(1), -z), (-z, F32(1), -z), (-z, F32(1), z), (F32(1e-30), F32(1e-30), -z), (F32(-1e-30), F32(1e-30), -z),
            (F32(3.0e38), F32(2), F32(0)), (F32(2.0**-75), F32(2.0**-75), F32(0)), (F32(1.5 * 2.0**-75), F32(2.0**-74), -z)]
    return out


def test_fma_twin_is_exact():
    """fma_f32_twin (scalar and vectorized) = a * b + c rounded once, by rational arithmetic,
    including sums 2^-70 off a float32 midpoint (a float64 sum then a float32 cast rounds
    those twice: checked to differ, so the cases are hard), signed zeros, subnormal results
    and overflow."""
    rng = np.random.default_rng(11)
    cases = _fma_cases(rng, 3000)
    a, b, c = (np.array(col, np.float32) for col in zip(*cases))
    want = np.array([exact_fma(*t) for t in cases], np.float32)
    assert_bits(np.array([D.fma_f32_twin(*t) for t in cases], np.float32), want, "scalar twin", a, b, c)
    assert_bits(D.fma_f32_twin(a, b, c), want, "vector twin", a, b, c)
    with np.errstate(all="ignore"):
        naive = (a.astype(np.float64) * b + c).astype(np.float32)
    assert (bits(naive) != bits(want)).sum() >= 6  # double rounding really happens on these


# ----------------------------------------------------------------------------- div_by_recip
SCALES = [1.0, 3.0, 0.0123, 448.0 / 7, 1.0 / 448, 2.0**-80, 2.0**-80 * (1 + EPS), 2.0**126, 2.0**126 * (1 - EPS / 2),
          2.0**-60 * 1.9999999, 2.0**100 * 1.3333333]


def _bf16_all():
    h = np.arange(1 << 16, dtype=np.uint32)
    x = (h << 16).view(np.float32)
    return x[np.isfinite(x)]


def _in_contract(x, s):
    """Where div_by_recip must give RN(x / s) (docs/numerics.md): |x| >= 2^-102 and
    |x / s| >= 2^-125 (else it only has to give a code-zero of x's sign)."""
    with np.errstate(all="ignore"):
        return (np.abs(x) >= 2.0**-102) & (np.abs(x.astype(np.float64) / np.asarray(s, np.float64)) >= 2.0**-125)


@pytest.mark.parametrize("s", SCALES)
def test_every_bf16_at_scales(s):
    """Every finite bfloat16 x (as float32) at scales across the guarded range, its edges
    included: RN(x / s) bit for bit (IEEE division, which NumPy's float32 division is:
    spot-checked against rational arithmetic), and where the quotient leaves the range the
    proof covers, a value of x's sign below 2^-20 (a code-zero)."""
    s = F32(s)
    assert D.RCP_S_MIN_BITS <= int(bits(s)[0]) <= D.RCP_S_MAX_BITS
    x = _bf16_all()
    x = x[np.abs(x.astype(np.float64)) < np.float64(s) * 2.0**64]  # the ratio guard
    got = div(x, s)
    with np.errstate(all="ignore"):
        want = x / s
    ok = _in_contract(x, s)
    assert_bits(got[ok], want[ok], f"x / {s!r}", x[ok])
    tiny = ~ok
    assert np.all(np.abs(got[tiny]) < 2.0**-20) and np.all(np.signbit(got[tiny]) == np.signbit(x[tiny]))
    rng = np.random.default_rng(int(bits(s)[0]) & 0xFFFF)
    for i in rng.choice(np.nonzero(ok)[0], 40, replace=False):
        assert bits(exact_div(x[i], s)) == bits(want[i])


def test_quotients_next_to_midpoints():
    """x = RN(m * s) and its neighbours for float32 midpoints m (x / s within a few ulps of
    x's spacing from m: the hardest quotients to round), random s over the guarded range."""
    rng = np.random.default_rng(3)
    n = 20000
    s = (rng.uniform(1, 2, n) * 2.0 ** rng.integers(-80, 126, n)).astype(np.float32)
    f = (rng.uniform(1, 2, n) * 2.0 ** rng.integers(-60, 60, n)).astype(np.float32)
    s = np.where(s.astype(np.float64) * f < 2.0**126, s, s * F32(2.0**-80))  # x = m * s finite
    m = f.astype(np.float64) * (1 + 2.0**-24)  # the midpoint above f (exact in float64)
    x0 = (m * s.astype(np.float64)).astype(np.float32)
    for d in (-2, -1, 0, 1, 2):
        x = (x0.view(np.int32) + d).view(np.float32)
        ok = _in_contract(x, s) & (np.abs(x.astype(np.float64)) < s.astype(np.float64) * 2.0**64)
        assert_bits(D.div_by_recip.py_func(x[ok], s[ok], F32(1) / s[ok]), x[ok] / s[ok], f"midpoint neighbour {d}",
                    x[ok], s[ok])
    for i in range(0, n, 500):
        assert bits(exact_div(x0[i], s[i])) == bits(x0[i] / s[i])


def test_significands_near_two():
    """a, b within 2000 ulps below 2 (every pair): where RN(a * RN(1/b)) can be 1.5 ulps from
    a / b and the residual is rounded (docs/numerics.md: the case the proof bounds separately,
    its three closest pairs included), at several exponents."""
    k = np.arange(1, 2001)
    a = (2.0 - k * EPS).astype(np.float32)
    for ea, eb in ((0, 0), (5, -7), (-30, 40)):
        xa = np.repeat(a, a.size) * F32(2.0**ea)
        sb = np.tile(a, a.size) * F32(2.0**eb)
        assert_bits(D.div_by_recip.py_func(xa, sb, F32(1) / sb), xa / sb, f"near two 2^{ea}/2^{eb}", xa, sb)


def test_largest_reciprocal_errors():
    """Divisors whose reciprocal is rounded the most (|s * RN(1/s) - 1| near 2^-24), every
    dividend significand above 1/frac of them (where q0 is not faithful): 60 divisors x 40000
    dividends."""
    b = (np.arange(0x3F800001, 0x40000000, 97, dtype=np.uint32)).view(np.float32)
    y = F32(1) / b
    frac = np.abs(b.astype(np.float64) * y - 1) / (b.astype(np.float64) * 2.0**-25)
    rng = np.random.default_rng(7)
    for i in np.argsort(-frac)[:60]:
        lo = max(int(bits(F32(1 / frac[i]))[0]), 0x3F800000)
        a = rng.integers(lo, 0x40000000, 40000, dtype=np.uint32).view(np.float32)
        s = np.full(a.size, b[i], np.float32)
        assert_bits(D.div_by_recip.py_func(a, s, y[i]), a / s, f"s={b[i]!r}", a)


def test_random_pairs_and_zeros():
    """300k random (x, s) over the guarded range and ratio, both signs of x; x = +-0 gives
    the quotient's signed zero; subnormal x."""
    rng = np.random.default_rng(5)
    n = 300000
    s = (rng.uniform(1, 2, n) * 2.0 ** rng.integers(-80, 126, n)).astype(np.float32)
    with np.errstate(over="ignore"):
        x = (rng.uniform(-2, 2, n) * 2.0 ** rng.integers(-63, 63, n)).astype(np.float32) * s
    ok = np.isfinite(x) & (np.abs(x.astype(np.float64)) < s.astype(np.float64) * 2.0**64) & _in_contract(x, s)
    assert ok.sum() > n // 2
    x, s = x[ok], s[ok]
    assert_bits(D.div_by_recip.py_func(x, s, F32(1) / s), x / s, "random", x, s)
    for s1 in (F32(1), F32(2.0**-80), F32(3e-5), F32(2.0**126)):
        z = np.array([0.0, -0.0, 1e-45, -1e-45, 2.0**-140, -(2.0**-126)], np.float32)
        got = div(z, s1)
        with np.errstate(all="ignore"):
            want = z / s1
        exact = _in_contract(z, s1)
        assert_bits(got[exact], want[exact], f"zeros/subnormals / {s1!r}")
        assert np.all(np.signbit(got) == np.signbit(z)) and np.all(np.abs(got[~exact]) < 2.0**-20)


# ----------------------------------------------------------------------------- guards (simulator kernel)
def test_guards():
    """recip_guarded: RN(1/s) exactly on [2^-80, 2^126], 0 outside (one ulp either side,
    negative, zero, inf, NaN); ratio_ok: |amax| < s * 2^64 on the bits."""
    from nqdq.gpu.device.codec import f32_bits

    sv = np.array([2.0**-80, np.nextafter(F32(2.0**-80), F32(0)), 2.0**126, np.nextafter(F32(2.0**126), F32(np.inf)), 1.0,
                   -1.0, 0.0, -0.0, np.inf, np.nan, 1e-45, 3e38, 0.0123], np.float32)
    amax = np.array([2.0**-16, 1.0, 2.0**127, 1.0, 2.0**64, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 3e38, 1.0], np.float32)
    r = np.zeros_like(sv)
    ok = np.zeros(sv.size, np.int32)

    @cuda.jit
    def k(sv, amax, r, ok):
        i = cuda.grid(1)
        if i < sv.size:
            r[i] = D.recip_guarded(sv[i])
            ok[i] = D.ratio_ok(np.int32(f32_bits(amax[i])), sv[i])

    k[1, 32](sv, amax, r, ok)
    inside = np.array([1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1], bool)  # 3e38 > 2^126: out
    with np.errstate(all="ignore"):
        assert_bits(r, np.where(inside, F32(1) / sv, F32(0)), "recip_guarded", sv)
    # amax 2^-16 vs s 2^-80: 2^-16 = s * 2^64 exactly, not below; 2^64 vs 1 the same; 3e38 vs 3e38 * 2^64: yes
    assert ok[0] == 0 and ok[4] == 0 and ok[11] == 1 and ok[12] == 1 and ok[2] == 1


# ----------------------------------------------------------------------------- kernels (simulator)
def _spy_count(monkeypatch):
    """Count div_by_recip calls made by the row-wise and per-channel kernels (the simulator
    runs Python)."""
    from nqdq.gpu.quantize import asym_units, encoders, sr_units
    from nqdq.gpu.quantize import columns as column_kernels

    calls = [0]
    real = D.div_by_recip

    def spy(x, s, r):
        calls[0] += 1
        return real(x, s, r)

    for unit_encoders in (encoders, sr_units, asym_units):  # the last-axis kernels' unit encoders
        monkeypatch.setattr(unit_encoders, "div_by_recip", spy)
    monkeypatch.setattr(column_kernels, "div_by_recip", spy)  # (the per-channel integer encode without the clip)
    return calls


def _hard_rows(rows, cols, seed, dtype):
    """Rows whose quotients x / s sit on and next to the code grid's rounding midpoints (x =
    the float32 neighbours of (code value + half a step) * s, s the row's scale), with signed
    zeros, subnormals and one row of all-tiny values."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x[:, 0] = 448.0  # fixes the row's fp8 scale: s = amax / 448 = 1 for fp8_row / fp8_1x128
    mids = (np.arange(1, 64) + 0.5).astype(np.float32) / 8  # e4m3 midpoints in [1/8, 8)
    j = rng.integers(1, cols, (rows, cols // 3))
    v = (rng.choice(mids, j.shape) * rng.choice([-1, 1], j.shape)).astype(np.float32)
    v = (v.view(np.int32) + rng.integers(-1, 2, j.shape).astype(np.int32)).view(np.float32)
    np.put_along_axis(x, j, v, axis=1)
    x[:, 1], x[:, 2], x[:, 3] = -0.0, 0.0, -1e-42
    x[-1] = x[-1] * F32(2.0**-100)  # a row whose scale is below 2^-80: divides per element
    return x.astype(dtype)


@pytest.mark.parametrize("name, dtype, cols", [
    ("fp8_row", ml_dtypes.bfloat16, 256), ("fp8_row", np.float32, 96), ("int8_row", np.float16, 128),
    ("fp8_1x128", ml_dtypes.bfloat16, 256), ("int8_asym", ml_dtypes.bfloat16, 128), ("int8_centred", np.float32, 128),
    ("int4_group", ml_dtypes.bfloat16, 128), ("int8_column", ml_dtypes.bfloat16, 64)])
def test_kernels_divide_by_reciprocal(monkeypatch, name, dtype, cols):
    """The float-scale kernels encode finite units by div_by_recip (counted) and give the
    reference's codes and scales bit for bit, on quotients next to code boundaries."""
    from helpers.kernels import check
    from nqdq.gpu.quantize import plan as kq
    from nqdq.schemes import resolve_scheme

    calls = _spy_count(monkeypatch)
    kq._PLANS.clear()
    x = _hard_rows(4, cols, 1, dtype)
    check(x, resolve_scheme(name), x_ref=x.astype(np.float32))
    assert calls[0] >= 3 * cols  # three rows of finite units went through the reciprocal


def test_static_scales_ratio_and_range(monkeypatch):
    """Caller-given scales: units whose |x| reaches s * 2^64, and scales outside [2^-80,
    2^126] or negative, divide per element; the codes stay the reference's."""
    from helpers.kernels import check
    from nqdq.gpu.quantize import plan as kq
    from nqdq.schemes import resolve_scheme

    kq._PLANS.clear()
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    x[1, :8] = 1e30  # one unit beyond s * 2^64 for s = 1e-3
    sch = resolve_scheme("e4m3", granularity="row", static_scale=True)
    for scale in ([1e-3, 1e-3, 2.0**-90, -0.5], [2.0**127, 3.0, 1e-3, 1e-3]):
        check(x, sch, scale=np.array(scale, np.float32).reshape(4, 1))
    check(x.astype(ml_dtypes.bfloat16), resolve_scheme("fp8_tensor", static_scale=True), scale=np.float32(1e-3),
          x_ref=x.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_fused_rows_divide_by_reciprocal(monkeypatch):
    """The fused RMSNorm + fp8_row / fp8_1x128 / static fp8_tensor kernels (vector path)
    encode finite units by div_by_recip (counted) and give the unfused spec's codes; a
    static scale so small that |y| reaches s * 2^64 sends its units per element."""
    from nqdq import fused

    calls = _spy_count(monkeypatch)
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((3, 64)) * 3).astype(ml_dtypes.bfloat16)
    x[0, 1], x[0, 2] = -0.0, 0.0
    w = rng.standard_normal(64).astype(ml_dtypes.bfloat16)
    for scheme, scale in (("fp8_row", None), ("fp8_1x128", None), ("fp8_tensor", 0.0173), ("fp8_tensor", 1e-25)):
        a = fused.rmsnorm_quantize(x, w, scheme, scale=scale)
        b = fused.rmsnorm_quantize(x, w, scheme, scale=scale, device="cuda")
        np.testing.assert_array_equal(np.asarray(a.codes).view(np.uint8), np.asarray(b.codes).view(np.uint8))
        np.testing.assert_array_equal(bits(a.scales), bits(b.scales))
    assert calls[0] >= 3 * 3 * 64


# ----------------------------------------------------------------------------- the PTX audit's exemption
_PTX_PAIR = """
	mul.f32 	%f4, %f2, %f1;
	neg.f32 	%f5, %f1;
	fma.rn.f32 	%f6, %f4, %f3, %f5;
	neg.f32 	%f7, %f6;
	fma.rn.f32 	%f8, %f7, %f2, %f4;
"""


def test_audit_matches_only_the_pattern():
    """tools.ptx_audit.recip_div_fmas counts a division's two fma and flags any other fma.f32: a
    contracted a * b + c, a correction whose addend is not q0, or whose multiplier is not r."""
    from nqdq.tools.ptx_audit import recip_div_fmas

    assert recip_div_fmas(_PTX_PAIR) == (1, 0)
    assert recip_div_fmas(_PTX_PAIR + _PTX_PAIR.replace("%f", "%g")) == (2, 0)
    assert recip_div_fmas(_PTX_PAIR + "\tfma.rn.f32 \t%f9, %f1, %f2, %f3;\n") == (1, 1)
    assert recip_div_fmas(_PTX_PAIR.replace("%f7, %f2, %f4;", "%f7, %f2, %f1;")) == (0, 2)  # addend not q0
    assert recip_div_fmas(_PTX_PAIR.replace("%f7, %f2, %f4;", "%f7, %f3, %f4;")) == (0, 2)  # multiplier s, not r
    assert recip_div_fmas(_PTX_PAIR.replace("neg.f32 \t%f5, %f1;", "neg.f32 \t%f5, %f3;")) == (0, 2)  # -s, not -x


def test_audit_flags_generic_atomics():
    """tools.ptx_audit.generic_atomics counts the atomics and reductions with no state space (NVVM
    could not tell shared from global memory: a generic ATOM on the GPU), predicated ones
    included, and none of those that name .shared, .shared::cta or .global."""
    from nqdq.tools.ptx_audit import generic_atomics

    ok = ("\tatom.shared.add.u32 \t%r1, [%r2], 1;\n\t@%p1 atom.global.add.u32 \t%r1, [%rd2], 1;\n"
          "\tred.shared::cta.add.u32 \t[%r2], 1;\n\tatom.global.exch.b32 \t%r1, [%rd2], 0;\n")
    assert generic_atomics(ok) == 0
    bad = "\t@!%p3 atom.add.u32 \t%r1, [%rd2], 1;\n\tatom.exch.b32 \t%r1, [%rd2], 0;\n\tred.add.u32 \t[%rd2], 1;\n"
    assert generic_atomics(ok + bad) == 3


_AUDIT_SCRIPT = r"""
import json
import ml_dtypes, numpy as np
from nqdq.tools import ptx_audit as A
from nqdq.gpu.runtime import interop as _interop
from nqdq.gpu.quantize import plan as kq
from nqdq.schemes import resolve_scheme
out = []
for name, kw, shape, dt in (("fp8_row", {}, (4, 1024), ml_dtypes.bfloat16),
                            ("fp8_tensor", {"static_scale": True}, (4, 1024), np.float32)):
    sch = resolve_scheme(name, **kw)
    x = np.zeros(shape, dt)
    rec = []
    with A.dry_run(rec):
        xin = _interop.DeviceInput(x.reshape(-1).view(np.uint16 if dt != np.float32 else np.float32),
                                   0 if dt == np.float32 else 1, shape, str(np.dtype(dt)), "numpy")
        kq.quantize(xin, sch, scale=1.0 if sch.static_scale else None)
    for r in A.compile_and_audit([(name, k, a) for k, a in rec], registers=False):
        out.append(dict(kernel=r["kernel"], rdiv=r["rdiv"], fma=r["fma"], divs=r["divs"], problems=r["problems"]))
print(json.dumps(out))
"""


def test_kernels_compile_with_only_the_pattern_fmas():
    """fp8_row and static fp8_tensor compiled for sm_90 (NVVM, no GPU): every fma.f32 is one of
    a division's two, one division per element of a thread's units, no audit problem."""
    from helpers.ptx import compile_rows

    rows = {r["kernel"]: r for r in compile_rows(_AUDIT_SCRIPT)}
    assert not any(r["problems"] for r in rows.values()), rows
    assert rows["lastaxis_rows"]["rdiv"] >= 8 and rows["lastaxis_rows"]["fma"] == 2 * rows["lastaxis_rows"]["rdiv"]
    assert rows["static_encode"]["rdiv"] >= 4 and rows["static_encode"]["fma"] == 2 * rows["static_encode"]["rdiv"]
