"""Device twins of ``nqdq.reference.scales``: the scale formula of every scheme, from
per-group statistics to the parameters the element encoder needs.

Statistics a kernel gathers per scale group (all order-independent except the sum):

* ``amax_bits``: max of the float32 bits of |x| as integers. Non-negative floats order
  like their bits and every NaN is above +inf, so this *is* ``np.max(np.abs(x))``, NaN
  included, and exact whatever the reduction order.
* ``mn`` / ``mx``: NaN-propagating min / max (asymmetric integers).
* ``sum``: the centred INT8 mean's halving sum, whose order *is* the spec
  (reference/scales.halving_sum). See :func:`pairwise_push`.

Element parameters produced for each group (``p0``, ``p1``, ``pz``):

==========  ==========================  ============  ==========
mode        p0                          p1            pz
==========  ==========================  ============  ==========
float       divisor s                   -             -
mx          multiplier 2^(127-code)     -             -
nvfp4       multiplier m_b              -             -
asym        divisor s                   -             zero point
centred     divisor s                   mean          -
==========  ==========================  ============  ==========
"""

from __future__ import annotations

import numpy as np

from .codec import (
    F32, FLT_MAX, NAN, ONE, ZERO, bits_f32, decode_float_code, encode_float_bits, f32_bits, fmin_f32, is_finite_f32,
    mul_rn, nanmax_f32, nanmin_f32, rint_f32,
)
from ..runtime.target import devfn

HALF = F32(0.5)
TWO = F32(2.0)
CENTRED_MARGIN = F32(1.015625)  # reference scales.CENTRED_MARGIN, 1 + 2^-6
NVFP4_FP8_X_FP4 = F32(F32(448.0) * F32(6.0))  # 2688, as reference: F32(448) * F32(6)
NVFP4_INV6 = F32(1.0 / 6.0)  # fp32(1/6), computed in float64 then rounded, as reference

# E4M3 (the ue4m3 block scale) field values, for encode_float_bits / decode_float_code
E4M3_MBITS = 3
E4M3_EMIN = -6
E4M3_MAX_CODE = 0x7E
E4M3_NAN_CODE = 0x7F

# modes (the scheme families of reference/quantize.py)
MODE_FLOAT = 0  # symmetric, float32 scale amax / max_elem (float and int elements)
MODE_MX = 1  # e8m0 shared scale
MODE_NVFP4 = 2  # ue4m3 block scale + fp32 tensor scale
MODE_ASYM = 3  # asymmetric integer: scale + zero point
MODE_CENTRED = 4  # blockwise-centred INT8: mean + scale

MX_FLOOR = 0
MX_RCEIL = 1
MX_EVEN = 2


@devfn
def finite_top_scale(s, top):
    """reference scales.finite_top_scale: ``s``, or the float32 just below it where ``top * s``
    overflows (s finite, positive)."""
    if is_finite_f32(s) and not is_finite_f32(mul_rn(s, top)):
        return bits_f32(np.uint32(f32_bits(s) - 1))
    return s


@devfn
def float_scale(amax, max_elem):
    """float32 ``amax / max_elem``; 1.0 when that is 0; NaN when amax is not finite; one ulp
    lower where ``max_elem * s`` would overflow (finite_top_scale)."""
    if not is_finite_f32(amax):
        return NAN
    s = amax / max_elem
    if s == ZERO:
        return ONE
    return finite_top_scale(s, max_elem)


@devfn
def centred_params(mean, amax_c, qmax_f):
    """reference scales.centred_params: (scale, mean) of a centred group from its mean and
    amax_c = max |x - mean|; a finite group whose |mean| + amax_c * (1 + 2^-6) overflows is not
    centred (mean 0, scale float_scale(FLT_MAX, qmax))."""
    r = abs(mean) + mul_rn(amax_c, CENTRED_MARGIN)
    if amax_c == amax_c and not is_finite_f32(r) and r == r:
        return float_scale(FLT_MAX, qmax_f), ZERO
    return float_scale(amax_c, qmax_f), mean


@devfn
def mx_scale_code(amax, rounding, mbits, emax, inv_max):
    """e8m0 code of the shared scale (reference scales.mx_scale_code); ``inv_max`` is
    fp32(1 / max_elem)."""
    if rounding == MX_RCEIL:
        v = amax * inv_max
        vb = f32_bits(v)
        ef = (vb >> 23) & 0xFF
        man = vb & 0x7FFFFF
        if ef == 0xFF:
            return 0xFF
        up = man > 0 and ef != 0xFE and not (ef == 0 and man <= 0x400000)
        code = ef + 1 if up else ef
        return min(code, 254 - emax)  # reference mx_top_code
    bits = f32_bits(amax)
    if not is_finite_f32(amax):
        return 0xFF
    if rounding == MX_EVEN:
        bits = (bits + (1 << (22 - mbits))) & 0xFF800000
    # a carry of "even" into exponent field 0xFF (amax rounded to 2^128) is exponent 128
    ef = (bits >> 23) & 0x1FF
    k = ef - 127 - emax
    if k < -127:
        k = -127
    if k > 127 - emax:  # reference mx_top_code: every code decodes below 2^128
        k = 127 - emax
    return k + 127


@devfn
def nvfp4_tensor_encode_scale(finite_amax):
    """S_enc = 2688 / amax, min(., FLT_MAX); 1.0 when amax is 0 (or S_enc is 0)."""
    if finite_amax == ZERO:
        return ONE
    s = NVFP4_FP8_X_FP4 / finite_amax
    if s > FLT_MAX:
        s = FLT_MAX
    if s == ZERO:
        return ONE
    return s


@devfn
def nvfp4_block_scale_code(block_amax, s_enc):
    """ue4m3 code of e4m3(block_amax * (S_enc * fp32(1/6))), saturating; 0x7F (NaN) for a
    non-finite block amax."""
    if not is_finite_f32(block_amax):
        return E4M3_NAN_CODE
    t = s_enc * NVFP4_INV6
    v = block_amax * t
    return encode_float_bits(f32_bits(v), E4M3_MBITS, E4M3_EMIN, E4M3_MAX_CODE, E4M3_NAN_CODE, 8, False, 0)


@devfn
def nvfp4_element_multiplier(code, s_enc):
    """fmin(1 / (float(s_b) * (1 / S_enc)), FLT_MAX): fmin, so a NaN block gives FLT_MAX."""
    s_dec = ONE / s_enc
    sb = decode_float_code(code, 4, 3, 1)
    return fmin_f32(ONE / (sb * s_dec), FLT_MAX)


@devfn
def range_scale(hi, lo, qmax_f):
    """reference scales.range_scale: float_scale(hi - lo, qmax), or, when hi - lo overflows
    although both are finite, ((hi * 0.5 - lo * 0.5) / qmax) * 2 (products by mul_rn, so
    NVVM cannot contract them into the subtraction)."""
    span = hi - lo
    if not is_finite_f32(span) and span == span and is_finite_f32(hi) and is_finite_f32(lo):
        return ((mul_rn(hi, HALF) - mul_rn(lo, HALF)) / qmax_f) * TWO
    return float_scale(span, qmax_f)


@devfn
def asym_params(mn, mx, qmax_f):
    """(scale, zero point) of an asymmetric integer group from its NaN-propagating min and
    max (reference quantize: xmin = min(min, 0), xmax = max(max, 0), s = float_scale(xmax -
    xmin, qmax) (range_scale) or NaN if either is non-finite, zp = clip(rint(-xmin / s), 0, qmax) with NaN
    -> 0)."""
    xmin = nanmin_f32(mn, ZERO)
    xmax = nanmax_f32(mx, ZERO)
    s = range_scale(xmax, xmin, qmax_f)
    if not (is_finite_f32(xmin) and is_finite_f32(xmax)):
        s = NAN
    z = -xmin / s
    if z != z:
        return s, 0
    if z < ZERO:
        z = ZERO
    if z > qmax_f:
        z = qmax_f
    zf = rint_f32(z)
    return asym_top_scale(s, zf, qmax_f), int(zf)


@devfn
def asym_top_scale(s, zf, qmax_f):
    """reference scales.asym_scale_zero_point's last step: where n * s overflows (n = max(zp,
    qmax - zp), zp as float32 ``zf``) the scale finite_top_scale(RN(FLT_MAX / n), n)."""
    n = zf if zf > qmax_f - zf else qmax_f - zf
    if is_finite_f32(s) and not is_finite_f32(mul_rn(n, s)):
        return finite_top_scale(FLT_MAX / n, n)
    return s


# ----------------------------------------------------------------------------- halving sum
# reference/scales.halving_sum pads to P = 2^k and adds v[:h] + v[h:] level by level. Two
# facts make it cheap to reproduce in parallel:
#  1. the elements whose index is congruent to j modulo a power of two T form a subtree,
#     summed in the same halving order; the T subtree sums are then halving-summed;
#  2. halving-summing v equals summing bitreverse(v) pairwise (recursive halves), which a
#     single thread can do streaming, in O(log P) registers: visit the leaves in
#     bit-reversed order and merge like a binary counter (pairwise_push).
# Addition is commutative in IEEE arithmetic, so which operand is "left" never matters.

STACK_DEPTH = 40


@devfn
def next_bitrev(rev, n):
    """The successor of ``rev`` in bit-reversed counting over log2(n) bits."""
    bit = n >> 1
    while bit > 0 and (rev & bit) != 0:
        rev ^= bit
        bit >>= 1
    return rev | bit


@devfn
def pairwise_push(stack, sp, s, val):
    """Push leaf number ``s`` (0-based, in visiting order) with value ``val`` onto the
    pairwise-summation stack; returns the new stack pointer."""
    k = s
    while (k & 1) == 1:
        sp -= 1
        val = stack[sp] + val
        k >>= 1
    stack[sp] = val
    return sp + 1
