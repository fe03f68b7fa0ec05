"""Asymmetric and centred integer groups' statistics and encoders of a 16-byte unit (the
last-axis asymmetric rows and the asymmetric / centred groups: ``lastaxis``, ``stat_chunks``).
"""

from __future__ import annotations

import numpy as np

from ..device.codec import NAN, ONE, ZERO, bits_f32, f32_bits, is_finite_f32, nanmax_f32, nanmin_f32, rint_f32
from ..device.division import div_by_recip, recip_guarded
from ..device.elements import encode_element
from ..device.scales import MODE_ASYM, asym_top_scale, range_scale
from ..ptx.pairs import bf16x2_max, bf16x2_min, u16x2_max, u16x2_min
from ..runtime.backend import cuda
from ..runtime.target import devfn
from .encoders import RINT_MAGIC, RINT_MAGIC_BITS, int_code_finite, int_code_finite_f
from .general import group_params
from .reductions import abs_i32
from .units import FINITE, half_bits, pack4, store_packed

# The integer schemes whose groups carry more than an amax (reference/quantize.py):
# asymmetric (scale and zero point from the group's min and max) and centred INT8 (mean by
# the reference's halving sum, then the amax of x - mean). Same loads, layout and stores as
# above; the statistics and the element encode differ.
#
# min / max as integers: key(b) maps float32 bits to an int32 that orders like the value
# (non-negative floats keep their bits, negative ones flip their magnitude bits), and is its
# own inverse. A positive NaN keys above +inf and a negative one below -inf, so a NaN in the
# group makes the max or the min key a NaN, the group non-finite, and asym_params then gives
# what it gives for any non-finite group (scale NaN, zero point 0: every code 0). The min is
# carried as ~key (max of ~k is ~min of k), so both statistics combine by xor_max.


@devfn
def key(b):
    k = np.int32(b)
    return k if k >= 0 else np.int32(k ^ np.int32(0x7FFFFFFF))


@devfn
def unit_keys(e, vec):
    """(max key, ~min key) over the unit's elements."""
    k0, k1, k2, k3 = key(e[0]), key(e[1]), key(e[2]), key(e[3])
    hi = max(max(k0, k1), max(k2, k3))
    lo = min(min(k0, k1), min(k2, k3))
    if vec == 8:
        k4, k5, k6, k7 = key(e[4]), key(e[5]), key(e[6]), key(e[7])
        hi = max(hi, max(max(k4, k5), max(k6, k7)))
        lo = min(lo, min(min(k4, k5), min(k6, k7)))
    return hi, np.int32(~lo)


@devfn
def asym_group(khi, nklo, max_elem):
    """(scale, zero point, finite) of an asymmetric group from its max key and ~min key:
    group_params (asym_params) on the decoded max and min."""
    mx = bits_f32(np.uint32(key(np.uint32(khi))))
    mn = bits_f32(np.uint32(key(np.uint32(~nklo))))
    sv, p0, pz = group_params(MODE_ASYM, 0, mn, mx, max_elem, 0, 0, 0, ONE, ONE)
    clean = (abs_i32(f32_bits(mx)) < FINITE) and (abs_i32(f32_bits(mn)) < FINITE)
    return sv, np.int32(pz), clean


@devfn
def enc_int(xb, p0, p1, pz, flo, fhi, clean, mode, fmt, mask, r):
    """An asymmetric / centred element's code. Finite groups (s finite and non-zero, x -
    mean finite: no NaN can arise) by int_code_finite: asym clip(rint(x / s) + zp, 0, qmax)
    = rint(clip(x / s, -zp, qmax - zp)) + zp (integer bounds commute with rint); centred
    rint(clip((x - mean) / s)); the quotient by the reciprocal r of s (device.division; |x| <=
    max(hi, -lo) <= hi - lo = s * qmax, |x - mean| <= s * 127 up to rounding, so no overflow).
    Otherwise encode_element, every NaN rule included. ``flo``, ``fhi``: asym's bounds -zp,
    qmax - zp as float32. ``clean`` is a compile-time branch where the caller passes a
    constant (encode_store_int_unit_r does)."""
    x = bits_f32(xb)
    if clean:
        if mode == MODE_ASYM:
            v = div_by_recip(x, p0, r)
            q = np.int32(int_code_finite_f(v, flo, fhi)) + pz
        else:
            c = x - p1
            v = div_by_recip(c, p0, r)
            q = np.int32(int_code_finite(v, fmt[6], fmt[7]))
        return np.uint32(np.uint32(q) & np.uint32(mask))
    return np.uint32(encode_element(x, p0, p1, pz, mode, fmt, False, 0, False) & mask)


@devfn
def int_unit_codes(e, p0, p1, pz, flo, fhi, clean, mode, fmt, vec, m, nb, r):
    """(lo, hi): the unit's codes packed by fours (see store_packed)."""
    lo = pack4(enc_int(e[0], p0, p1, pz, flo, fhi, clean, mode, fmt, m, r),
               enc_int(e[1], p0, p1, pz, flo, fhi, clean, mode, fmt, m, r),
               enc_int(e[2], p0, p1, pz, flo, fhi, clean, mode, fmt, m, r),
               enc_int(e[3], p0, p1, pz, flo, fhi, clean, mode, fmt, m, r), nb)
    hi = np.uint32(0)
    if vec == 8:
        hi = pack4(enc_int(e[4], p0, p1, pz, flo, fhi, clean, mode, fmt, m, r),
                   enc_int(e[5], p0, p1, pz, flo, fhi, clean, mode, fmt, m, r),
                   enc_int(e[6], p0, p1, pz, flo, fhi, clean, mode, fmt, m, r),
                   enc_int(e[7], p0, p1, pz, flo, fhi, clean, mode, fmt, m, r), nb)
    return lo, hi


@devfn
def encode_store_int_unit_r(e, unit, p0, p1, pz, flo, fhi, r, clean, c8, c16, c32, mode, fmt, vec, nb):
    """Encode and store an integer unit: one branch per unit on ``clean``, each side with its
    eight element encodes in a straight line (a branch per element kept each division in its
    own basic block, where the next one could not overlap it). The per-scale values come from
    the caller, so that one whose units sit in separate blocks computes them once: the bounds
    ``flo`` = -pz, ``fhi`` = qmax - pz as float32 and r = recip_guarded(p0); a scale outside
    recip_guarded's range (r = 0) goes element by element, as a non-finite group does."""
    m = (1 << nb) - 1
    if clean and r != ZERO:
        lo, hi = int_unit_codes(e, p0, p1, pz, flo, fhi, True, mode, fmt, vec, m, nb, r)
    else:
        lo, hi = int_unit_codes(e, p0, p1, pz, flo, fhi, False, mode, fmt, vec, m, nb, r)
    store_packed(lo, hi, unit, c8, c16, c32, vec, nb)


@devfn
def word_ukeys(w):
    """Per 16-bit half of ``w`` (a bfloat16 or float16 element): a key that orders as an
    unsigned number like the value (sign set: every bit flipped; else the sign bit set), a
    NaN above +inf (sign 0) or below -inf (sign 1), as key() orders float32 bits; a bijection
    (ukey_bits inverts it), so the max / min key is one element's exact bits."""
    neg = np.uint32((w >> np.uint32(15)) & np.uint32(0x00010001))
    return np.uint32(w ^ (np.uint32(neg * np.uint32(0x7FFF)) | np.uint32(0x80008000)))


@devfn
def ukey_bits(k, kind):
    """float32 bits of the 16-bit element whose word_ukeys key is ``k`` (0 <= k < 2^16)."""
    h = (k ^ np.uint32(0x8000)) if (k & np.uint32(0x8000)) != 0 else (~k & np.uint32(0xFFFF))
    return half_bits(np.uint32(h), 0, kind)


@devfn
def unit_ukeys(w):
    """(max, min) per 16-bit half of word_ukeys over the unit's 4 words."""
    k0, k1, k2, k3 = word_ukeys(w[0]), word_ukeys(w[1]), word_ukeys(w[2]), word_ukeys(w[3])
    return (np.uint32(u16x2_max(u16x2_max(k0, k1), u16x2_max(k2, k3))),
            np.uint32(u16x2_min(u16x2_min(k0, k1), u16x2_min(k2, k3))))


@devfn
def asym_code_r(xb, s, r, pzm, qmax):
    """clip(rint(x / s) + zp, 0, qmax) of an element of a finite asymmetric group whose s has a
    reciprocal r (recip_guarded(s) != 0: s normal, >= 2^-80), x / s by r (device.division); ``pzm`` =
    zp - RINT_MAGIC_BITS. The group's range includes 0 (xmin <= 0 <= xmax) and s = RN(RN(xmax -
    xmin) / qmax) (or the halves' formula where xmax - xmin overflows), so s >= (-xmin / qmax)(1 -
    2^-24) and |x / s| <= qmax (1 + 2^-23) < 2^22: the magic-constant rint (int_code_finite) is
    exact before any clip. Only the upper clip can bind: RN(-xmin / s) <= qmax (1 + 2^-23)
    rounds to at most qmax (the float spacing there is far coarser), so zp = rint(-xmin / s)
    unclipped, and x >= xmin gives rint(x / s) >= -zp (RN and rint are monotone and odd; a
    quotient below device.division's small-x bounds has |q| < 2^-20 and rints to 0), i.e. the sum
    is >= 0. One add-and-min instruction."""
    v = div_by_recip(bits_f32(xb), s, r)
    q = np.int32(np.int32(f32_bits(v + RINT_MAGIC)) + pzm)
    return np.uint32(min(q, np.int32(qmax)))


@devfn
def asym_unit_store_r(e, unit, s, r, pz, flo, fhi, clean, c8, c16, c32, fmt, vec, nb):
    """An asymmetric unit's codes: a finite group with s in recip_guarded's range by
    asym_code_r, anything else by encode_store_int_unit_r (its arguments: ``flo``, ``fhi``
    the float bounds -zp, qmax - zp; ``r`` = recip_guarded(s) or ZERO)."""
    if clean and r != ZERO:
        qm = fmt[7]
        pzm = np.int32(pz - RINT_MAGIC_BITS)
        lo = pack4(asym_code_r(e[0], s, r, pzm, qm), asym_code_r(e[1], s, r, pzm, qm), asym_code_r(e[2], s, r, pzm, qm),
                   asym_code_r(e[3], s, r, pzm, qm), nb)
        hi = np.uint32(0)
        if vec == 8:
            hi = pack4(asym_code_r(e[4], s, r, pzm, qm), asym_code_r(e[5], s, r, pzm, qm), asym_code_r(e[6], s, r, pzm, qm),
                       asym_code_r(e[7], s, r, pzm, qm), nb)
        store_packed(lo, hi, unit, c8, c16, c32, vec, nb)
    else:
        encode_store_int_unit_r(e, unit, s, ZERO, pz, flo, fhi, r, clean, c8, c16, c32, MODE_ASYM, fmt, vec, nb)


@devfn
def unit_bf16_minmax(w):
    """(max, min) per bfloat16 half over the unit's 4 words (max / min.bf16x2: exact values,
    a NaN skipped where the other operand is not NaN)."""
    return (np.uint32(bf16x2_max(bf16x2_max(w[0], w[1]), bf16x2_max(w[2], w[3]))),
            np.uint32(bf16x2_min(bf16x2_min(w[0], w[1]), bf16x2_min(w[2], w[3]))))


@devfn
def xor_u16x2_max(w, off, shfl, scratch, tid):
    """u16x2_max(w, w of lane tid ^ off): one butterfly step of a max per 16-bit half (the
    twin through the int32 scratch)."""
    if shfl:
        return np.uint32(u16x2_max(w, np.uint32(cuda.shfl_xor_sync(0xFFFFFFFF, np.int32(w), off))))
    cuda.syncthreads()
    scratch[tid] = np.int32(w)
    cuda.syncthreads()
    return np.uint32(u16x2_max(w, np.uint32(scratch[tid ^ off])))


@devfn
def asym_group_r(mxb, mnb, max_elem):
    """(scale, zero point, finite, r = recip_guarded(scale) or ZERO) of an asymmetric group
    from the float32 bits of its max and min: asym_params (group_params' MODE_ASYM), its
    -xmin / s by the reciprocal where s has one (RN(-xmin / s) bit for bit: |xmin| <= s * qmax
    * (1 + 2^-22), and where _division's small-quotient conditions fail the quotient is below
    2^-20 with the sign of -xmin >= 0, whose rint is 0 as the IEEE quotient's), the IEEE
    division otherwise (s NaN or out of range)."""
    mn = bits_f32(mnb)
    mx = bits_f32(mxb)
    xmin = nanmin_f32(mn, ZERO)
    xmax = nanmax_f32(mx, ZERO)
    s = range_scale(xmax, xmin, max_elem)
    finite = is_finite_f32(xmin) and is_finite_f32(xmax)
    if not finite:
        s = NAN
    r = recip_guarded(s)
    if r != ZERO:
        z = -div_by_recip(xmin, s, r)  # (RN is symmetric: -RN(xmin / s) = RN(-xmin / s))
    else:
        z = -xmin / s
    if z != z:
        return s, np.int32(0), finite, r
    if z < ZERO:
        z = ZERO
    if z > max_elem:
        z = max_elem
    zf = rint_f32(z)
    st = asym_top_scale(s, zf, max_elem)  # a range near FLT_MAX: every code decodes finite
    if st != s:
        s = st
        r = recip_guarded(s)
    return s, np.int32(zf), finite, r
