"""x / s, correctly rounded, from a reciprocal of s computed once per scale.

The float-scale encoders divide every element by its group's scale (``encode(x / s)``, the
spec's IEEE division). ``div.rn.f32`` is about ten instructions plus a slow-path branch per
element; where a unit of elements shares one scale s, this module divides them by

    r  = RN(1 / s)              once per scale (div.rn: ``recip_guarded``)
    q0 = RN(x * r)
    e  = RN(q0 * s - x)         one fma: exact here (see below)
    q  = RN(q0 - e * r)         one fma

three instructions per element, and q is the IEEE quotient RN(x / s) bit for bit, +-0
included, whenever s passes ``recip_guarded`` (2^-80 <= s <= 2^126: positive, normal, with a
normal reciprocal), |x| < s * 2^64 (nothing overflows; callers with dynamic scales have |x|
<= s * max_elem * (1 + 2^-23), callers with caller-given scales check it per unit:
``ratio_ok``), |x| >= 2^-102 and |x / s| >= 2^-125 (every intermediate normal or exact).
Outside the last two conditions |x / s| < 2^-22, and q has x's sign and |q| < 2^-20: every
fp8 / integer code of it is the signed zero (or 0) that RN(x / s) gets, since no format here
has a nonzero code below 2^-16. The proof (Markstein's correction step, Markstein 1990;
Muller et al., Handbook of Floating-Point Arithmetic, 2nd ed., sec. 4.9) is in
docs/numerics.md, "Division by a reciprocal". In short, for the significands a, b in [1, 2)
of x and s and z = a / b: r is within half an ulp of 1/b, so q0 is within 1.5 ulps of z; q0
- e * r = z + (z - q0)(b r - 1) exactly where q0 is one of the two floats around z (e is
then exact), and a / b lies at least 2^-p * spacing / b from every rounding midpoint, more
than that correction error, so q = RN(z); where q0 is further away (z < 1 only, e then
possibly rounded) the computed value still falls strictly between the midpoints around
RN(z), but for three significand pairs near 2 that are checked one by one.

The residual is computed with the signs chosen so that x = -0 gives q = -0 (with e = RN(x -
q0 * s) instead, -0 / s would come out +0).

Against ``div.rn.f32`` per element (H100): fp8_1x128 89 -> 96 %, fp8_128x128 76 -> 86 %,
int8_centred 79 -> 84 % of copy, fused RMSNorm + fp8_row 126 -> 103 us; the float-scale
encoders divide this way wherever a unit shares a scale that passes the guards above.

``fma_f32`` is ``cuda.fma`` (``fma.rn.f32``) on the GPU; the CUDA simulator, whose ``cuda.fma``
is ``a * b + c`` rounded twice, runs the exact twin ``fma_f32_twin``. The PTX audit allows
``fma.f32`` only in this pattern (``nqdq.tools.ptx_audit.recip_div_fmas``).
"""

from __future__ import annotations

import math

import numpy as np
from ..runtime.backend import cuda

from .codec import F32, ONE, ZERO, f32_bits
from ..runtime.target import SIMULATOR, devfn

__all__ = ["RCP_S_MIN_BITS", "RCP_S_MAX_BITS", "RCP_RATIO_BITS", "div_by_recip", "fma_f32", "fma_f32_twin",
           "ratio_ok", "recip_guarded"]

RCP_S_MIN_BITS = 0x17800000  # 2^-80: below it a tiny x's residual could be inexact and its quotient not tiny
RCP_S_MAX_BITS = 0x7E800000  # 2^126: above it 1 / s is subnormal (its rounding error is not relative)
RCP_RATIO_BITS = 64 << 23  # |x| < s * 2^64 (on the bits): no intermediate overflows


F32_OVERFLOW = 2.0**128 - 2.0**103  # float64 values from here round to inf in float32 (RN)


def fma_f32_twin(a, b, c):
    """float32 a * b + c rounded once (IEEE fma, round to nearest even), in Python: the
    product of two float32 is exact in float64 (48 significant bits, exponents within
    float64's normal range), the float64 sum's error is exact by 2Sum, and the sum rounded *to
    odd* in 53 bits then rounded to nearest in float32 (at most 24 bits: 53 >= 24 + 2) is the
    sum rounded to nearest once (subnormal float32 results included: they keep fewer bits).
    Scalars (the simulator's calls) or NumPy arrays (the tests)."""
    if np.ndim(a) == 0 and np.ndim(b) == 0 and np.ndim(c) == 0:
        p = float(a) * float(b)
        cc = float(c)
        s = p + cc
        if not math.isfinite(s):
            return F32(s)
        bb = s - p
        t = (p - (s - bb)) + (cc - bb)  # p + cc = s + t exactly
        if t != 0.0 and (np.float64(s).view(np.int64) & 1) == 0:  # inexact, s even: the odd neighbour towards t
            s = math.nextafter(s, math.inf if t > 0.0 else -math.inf)
        if abs(s) >= F32_OVERFLOW:
            return F32(math.copysign(math.inf, s))
        return F32(s)
    with np.errstate(all="ignore"):
        p = np.asarray(a, np.float64) * np.asarray(b, np.float64)
        cc = np.asarray(c, np.float64)
        s = p + cc
        bb = s - p
        t = (p - (s - bb)) + (cc - bb)
        odd = (s.view(np.int64) & 1) == 1
        fix = np.isfinite(s) & (t != 0.0) & ~odd
        s = np.where(fix, np.nextafter(s, np.where(t > 0.0, np.inf, -np.inf)), s)
        return s.astype(np.float32)


if SIMULATOR:
    fma_f32 = devfn(fma_f32_twin)
else:

    @devfn
    def fma_f32(a, b, c):
        """float32 a * b + c rounded once (``fma.rn.f32``)."""
        return cuda.fma(a, b, c)


@devfn
def recip_guarded(s):
    """RN(1 / s) where s is in div_by_recip's range [2^-80, 2^126] (positive, normal, with a
    normal reciprocal), else 0 (the caller then divides). Once per scale."""
    b = np.int32(f32_bits(s))  # negative s: a negative int32, outside the range
    if b >= RCP_S_MIN_BITS and b <= RCP_S_MAX_BITS:
        return ONE / s
    return ZERO


@devfn
def ratio_ok(amax_bits, s):
    """|x| < s * 2^64 for every x of a unit whose max |x| has the float32 bits ``amax_bits``
    (finite, >= 0), for s in recip_guarded's range (s's bits plus 64 in the exponent field;
    int64: no wrap-around; where s * 2^64 overflows every finite x passes, rightly)."""
    return np.int64(amax_bits) < f32_bits(s) + RCP_RATIO_BITS


@devfn
def div_by_recip(x, s, r):
    """RN(x / s) for float32 x and r = recip_guarded(s) != 0, |x| < s * 2^64 (module doc)."""
    q0 = x * r
    e = fma_f32(q0, s, -x)
    return fma_f32(-e, r, q0)

