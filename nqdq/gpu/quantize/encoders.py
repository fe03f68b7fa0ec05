"""Round-to-nearest encoders of a 16-byte unit's elements (float32 bits) under its group's
parameter, and the unit's store: ``encode_store_unit`` (any mode: float, MX, NVFP4 scales),
``encode_store_unit_r`` / ``recip_store_unit`` (float scales, by the reciprocal), and the
shorter exact encoders of finite groups they take (paired fp8 cvt, integers and e2m1 by float
rounding, the bfloat16 pair encoders of ``pair_encoders``), each giving encode_element's codes.
"""

from __future__ import annotations

import numpy as np

from ..device.codec import F32, FLT_MAX, ONE, ZERO, bits_f32, encode_float_rne, f32_bits, fmin_f32
from ..device.division import div_by_recip, recip_guarded
from ..device.elements import encode_element
from ..device.scales import MODE_FLOAT, MODE_MX, MODE_NVFP4, nvfp4_block_scale_code
from ..ptx.convert import E4M3, cvt_e4m3, cvt_e4m3x2, cvt_e5m2x2
from ..runtime.target import devfn
from .pair_encoders import e2m1_unit_f32, fp6_pair_consts, fp6_unit_f32, is_fp6
from .units import pack4, store_packed


@devfn
def scaled(xb, p0, mode):
    """x / s (float scales: IEEE division, as the reference) or x * multiplier (MX: 2^-k,
    the exact reciprocal of the power-of-two scale; NVFP4: the reference's multiplier)."""
    x = bits_f32(xb)
    if mode == MODE_NVFP4 or mode == MODE_MX:
        return x * p0
    return x / p0


@devfn
def fp8_pair(e_lo, e_hi, p0, mode, fmt):
    """Codes of two elements by one paired cvt: code(lo) in bits 0-7, code(hi) in 8-15."""
    if fmt[8] == E4M3:
        return np.uint32(cvt_e4m3x2(scaled(e_hi, p0, mode), scaled(e_lo, p0, mode)))
    return np.uint32(cvt_e5m2x2(scaled(e_hi, p0, mode), scaled(e_lo, p0, mode)))


# ---- float scales, finite units: x / s by the reciprocal r = recip_guarded(s) (device.division:
# three instructions per element instead of div.rn's ten and its slow-path branch, and the
# same quotient bit for bit, so the same codes). Used where r != 0 and every |x| < s * 2^64:
# dynamic scales (|x| <= amax <= s * max_elem * (1 + 2^-23)), and caller-given scales whose
# unit passes ratio_ok (static_unit, the fused kernel's static scale).
@devfn
def fp8_pair_rr(e_lo, e_hi, s_lo, s_hi, r_lo, r_hi, fmt):
    """Codes of two elements by one paired cvt, each quotient by its own scale and reciprocal
    (the per-channel kernels' elements have different scales)."""
    q_hi = div_by_recip(bits_f32(e_hi), s_hi, r_hi)
    q_lo = div_by_recip(bits_f32(e_lo), s_lo, r_lo)
    if fmt[8] == E4M3:
        return np.uint32(cvt_e4m3x2(q_hi, q_lo))
    return np.uint32(cvt_e5m2x2(q_hi, q_lo))


@devfn
def fp8_pair_r(e_lo, e_hi, p0, r, fmt):
    """fp8_pair of a float scale p0 with its reciprocal r."""
    return fp8_pair_rr(e_lo, e_hi, p0, p0, r, r, fmt)


@devfn
def enc_finite_r(xb, p0, r, fmt, mask):
    """enc_finite of a float scale p0 with its reciprocal r (no cvt): the code of the
    quotient by the integer / e2m1 / general float encoder (encode_element's, for a non-NaN
    quotient)."""
    q = div_by_recip(bits_f32(xb), p0, r)
    if fmt[0] == 0:
        return np.uint32(int_code_finite(q, fmt[6], fmt[7]) & np.uint32(mask))
    if fmt[5] == 4 and fmt[1] == 1 and fmt[3] == 7:  # e2m1
        return np.uint32(e2m1_code_nonnan(q) & np.uint32(mask))
    return np.uint32(encode_float_rne(q, fmt[1], fmt[2], fmt[3], fmt[4], fmt[5]) & mask)


@devfn
def recip_store_unit(e, unit, p0, r, c8, c16, c32, fmt, cvt, vec, nb):
    """encode_store_unit of a finite unit under a float scale p0 with reciprocal r != 0."""
    if cvt:
        w0 = np.uint32(fp8_pair_r(e[0], e[1], p0, r, fmt) | (fp8_pair_r(e[2], e[3], p0, r, fmt) << np.uint32(16)))
        w1 = np.uint32(0)
        if vec == 8:
            w1 = np.uint32(fp8_pair_r(e[4], e[5], p0, r, fmt) | (fp8_pair_r(e[6], e[7], p0, r, fmt) << np.uint32(16)))
        store_packed(w0, w1, unit, c8, c16, c32, vec, 8)
        return
    m = (1 << nb) - 1
    hi = np.uint32(0)
    lo = pack4(enc_finite_r(e[0], p0, r, fmt, m), enc_finite_r(e[1], p0, r, fmt, m),
               enc_finite_r(e[2], p0, r, fmt, m), enc_finite_r(e[3], p0, r, fmt, m), nb)
    if vec == 8:
        hi = pack4(enc_finite_r(e[4], p0, r, fmt, m), enc_finite_r(e[5], p0, r, fmt, m),
                   enc_finite_r(e[6], p0, r, fmt, m), enc_finite_r(e[7], p0, r, fmt, m), nb)
    store_packed(lo, hi, unit, c8, c16, c32, vec, nb)


@devfn
def encode_store_unit_r(e, unit, p0, r, clean, c8, c16, c32, mode, fmt, cvt, vec, nb):
    """encode_store_unit with r = recip_guarded(p0) computed by the caller, once per row
    (units under a condition each would each compute their own)."""
    if clean and mode == MODE_FLOAT and r != ZERO:
        recip_store_unit(e, unit, p0, r, c8, c16, c32, fmt, cvt, vec, nb)
    else:  # as encode_store_unit: a float scale without a reciprocal goes element by element
        encode_store_unit(e, unit, p0, clean and mode != MODE_FLOAT, c8, c16, c32, mode, fmt, cvt, vec, nb)


@devfn
def enc(xb, p0, mode, fmt, cvt, mask):
    """One element's code, by the general kernels' encoder (every NaN rule included)."""
    return np.uint32(encode_element(bits_f32(xb), p0, ZERO, 0, mode, fmt, False, 0, cvt) & mask)


# ---- element encoders for finite groups (no NaN can arise: see encode_store_unit). They give
# encode_element's codes with fewer instructions and no float -> int conversion (F2I runs at
# an eighth of the FP32 rate); tests/test_kernels.py checks them over every code boundary.
RINT_MAGIC = F32(12582912.0)  # 1.5 * 2^23: v + this rounds v to an integer (RNE) for |v| < 2^22
RINT_MAGIC_BITS = 0x4B400000
E2M1_TWO = F32(2.0)
E2M1_FOUR = F32(4.0)
E2M1_SIX = F32(6.0)


@devfn
def int_code_finite(v, lo, hi):
    """reference codec.encode_int (RNE) of a non-NaN v: clip to [lo, hi], round to nearest
    even. In [2^23, 2^24) the float32 spacing is 1, so v + 1.5 * 2^23 is rounded by the FPU to
    the integer nearest v (ties to even) and its bits are those of the magic plus rint(v)."""
    return int_code_finite_f(v, F32(lo), F32(hi))


@devfn
def int_code_finite_f(v, flo, fhi):
    """int_code_finite with the bounds already float32 (integers, so exact): callers whose
    bounds change at run time convert them once per unit, not once per element."""
    if v < flo:
        v = flo
    if v > fhi:
        v = fhi
    return int_code_rint(v)


@devfn
def int_code_rint(v):
    """rint(v) (RNE) as int32 bits, for |v| < 2^22: int_code_finite without the clip, for
    callers that know v lies in the format's range (``_column_kernels.rint_in_range``)."""
    return np.uint32(np.int32(f32_bits(v + RINT_MAGIC) - RINT_MAGIC_BITS))


@devfn
def e2m1_code_nonnan(v):
    """The e2m1 code of a non-NaN v (saturating, RNE), as encode_float_rne's. The e2m1 grid
    has spacing 0.5 below 2, 1 in [2, 4), 2 from 4 on: adding and removing 2^22, 2^23 or 2^24
    (whose float32 spacing is exactly that) rounds |v| onto the grid, ties to even (an even
    multiple of the spacing is an even code); results above 6 saturate. The code is then read
    from the rounded value's bits."""
    b = f32_bits(v)
    a = bits_f32(np.uint32(b & 0x7FFFFFFF))
    mb = 0x4A800000  # 2^22
    if a >= E2M1_TWO:
        mb = 0x4B000000  # 2^23
    if a >= E2M1_FOUR:
        mb = 0x4B800000  # 2^24
    m = bits_f32(np.uint32(mb))
    r = (a + m) - m
    if not r < E2M1_SIX:
        r = E2M1_SIX
    # (bits >> 22) - 251 is 0 for 0.0 (clamped), 1 for 0.5 and 3 .. 8 for 1.0 .. 6.0
    j = np.int32(np.uint32(np.uint32(f32_bits(r)) >> np.uint32(22))) - np.int32(251)
    if j < 0:
        j = np.int32(0)
    if j > 1:
        j = np.int32(j - 1)
    return np.uint32(np.uint32(j) | np.uint32((b >> 28) & 8))


def is_e2m1(fmt) -> bool:
    """The element format tuple is e2m1 (4 bits, 1 mantissa bit, max code 7)."""
    return fmt[0] == 1 and fmt[5] == 4 and fmt[1] == 1 and fmt[3] == 7


@devfn
def enc_finite(xb, p0, mode, fmt, cvt, mask):
    """encode_element's code of an element of a finite group."""
    if fmt[0] == 0:  # integer elements
        return np.uint32(int_code_finite(scaled(xb, p0, mode), fmt[6], fmt[7]) & np.uint32(mask))
    if fmt[5] == 4 and fmt[1] == 1 and fmt[3] == 7:  # e2m1
        return np.uint32(e2m1_code_nonnan(scaled(xb, p0, mode)) & np.uint32(mask))
    return enc(xb, p0, mode, fmt, cvt, mask)


# NVFP4's block parameters for a finite block, as group_params (nvfp4_block_scale_code,
# nvfp4_element_multiplier) with fewer instructions: the tensor constants t6 = S_enc *
# fp32(1/6) and S_dec = 1 / S_enc are computed once per chunk (same IEEE operations, same
# values), the ue4m3 code of v = amax * t6 (finite, >= 0) by one cvt.rn.satfinite.e4m3x2
# where the GPU has it (the same code as the bit-manipulation encoder for every non-NaN
# value: tests/test_kernels.py::test_fp8_cvt_matches_twin), and its value by placing the
# code's 7 bits as float32 bits 20-26 and multiplying by 2^120 (exact, subnormal codes
# included: the float32 subnormal m * 2^-129 times 2^120 is m * 2^-9).
TWO_P120 = F32(2.0**120)


@devfn
def nvfp4_block(amax_bits, s_enc, t6, s_dec, cvt):
    """(ue4m3 code, element multiplier) of a finite NVFP4 block of amax ``amax_bits``;
    t6 = S_enc * fp32(1/6), s_dec = 1 / S_enc; ``cvt``: by the e4m3 cvt instruction."""
    if cvt:
        code = np.uint32(cvt_e4m3(bits_f32(np.uint32(amax_bits)) * t6))
    else:
        code = np.uint32(nvfp4_block_scale_code(bits_f32(np.uint32(amax_bits)), s_enc))
    sb = bits_f32(np.uint32(code << np.uint32(20))) * TWO_P120
    return code, fmin_f32(ONE / (sb * s_dec), FLT_MAX)


@devfn
def encode_store_unit(e, unit, p0, clean, c8, c16, c32, mode, fmt, cvt, vec, nb):
    """Encode the unit's elements (float32 bits ``e``) with their group's parameter p0 and
    store the codes (``nb`` bits each, first element lowest) at byte unit * vec * nb / 8.
    A clean unit under a float scale is divided by the reciprocal (recip_store_unit), which
    needs every |x| < p0 * 2^64: callers with caller-given scales pass clean = False where
    ratio_ok fails. A scale outside recip_guarded's range (|amax| below about 2^-71) takes
    encode_element per element, as non-finite units do (one path less to compile)."""
    if mode == MODE_FLOAT:
        r = recip_guarded(p0)  # once per unit; the units of one basic block share it (CSE)
        if clean and r != ZERO:
            recip_store_unit(e, unit, p0, r, c8, c16, c32, fmt, cvt, vec, nb)
            return
        clean = False
    if cvt and clean:
        # a finite group: s (or the multiplier) is finite and non-zero and x is finite, so no
        # NaN can arise, and the paired instruction gives encode_element's codes
        w0 = np.uint32(fp8_pair(e[0], e[1], p0, mode, fmt) | (fp8_pair(e[2], e[3], p0, mode, fmt) << np.uint32(16)))
        w1 = np.uint32(0)
        if vec == 8:
            w1 = np.uint32(fp8_pair(e[4], e[5], p0, mode, fmt) | (fp8_pair(e[6], e[7], p0, mode, fmt) << np.uint32(16)))
        store_packed(w0, w1, unit, c8, c16, c32, vec, 8)
        return
    if clean and mode == MODE_MX and vec == 8 and fmt[5] == 4 and fmt[1] == 1 and fmt[3] == 7 \
            and nb == 4:  # fmt: skip
        c32[np.uint64(unit)] = e2m1_unit_f32(e, p0)  # MX e2m1, finite group: pairs (see e2m1_unit_f32)
        return
    if clean and mode == MODE_MX and nb == 6 and is_fp6(fmt):
        lo, hi = fp6_unit_f32(e, p0, fp6_pair_consts(fmt), vec)  # MX fp6, finite group: pairs (see fp6_pair_codes)
        store_packed(lo, hi, unit, c8, c16, c32, vec, nb)
        return
    m = (1 << nb) - 1
    hi = np.uint32(0)
    if clean and not cvt:  # as above: no NaN can arise, the finite-group encoders apply
        lo = pack4(enc_finite(e[0], p0, mode, fmt, cvt, m), enc_finite(e[1], p0, mode, fmt, cvt, m),
                   enc_finite(e[2], p0, mode, fmt, cvt, m), enc_finite(e[3], p0, mode, fmt, cvt, m), nb)
        if vec == 8:
            hi = pack4(enc_finite(e[4], p0, mode, fmt, cvt, m), enc_finite(e[5], p0, mode, fmt, cvt, m),
                       enc_finite(e[6], p0, mode, fmt, cvt, m), enc_finite(e[7], p0, mode, fmt, cvt, m), nb)
    else:
        lo = pack4(enc(e[0], p0, mode, fmt, cvt, m), enc(e[1], p0, mode, fmt, cvt, m),
                   enc(e[2], p0, mode, fmt, cvt, m), enc(e[3], p0, mode, fmt, cvt, m), nb)
        if vec == 8:
            hi = pack4(enc(e[4], p0, mode, fmt, cvt, m), enc(e[5], p0, mode, fmt, cvt, m),
                       enc(e[6], p0, mode, fmt, cvt, m), enc(e[7], p0, mode, fmt, cvt, m), nb)
    store_packed(lo, hi, unit, c8, c16, c32, vec, nb)
