"""Fast kernels for the common case: a C-contiguous input whose scale groups run along
the LAST axis and are either whole rows (per-token: fp8_row, int8_row) or small groups
that tile each row exactly (1xG with G/VEC a power of two <= 32: fp8_1x128, int4_group,
MXFP8/6/4, NVFP4's block pass), float32 / float16 / bfloat16 input, RNE elements and
dynamic scales of the float, MX and NVFP4 modes; also asymmetric integer rows / groups
and centred INT8 groups (``lastaxis_asym_rows``, ``lastaxis_stat_groups``: see the section
"asymmetric / centred" below) and caller-given float scales per tensor or row
(``static_encode``). Everything else runs the general kernels of ``_quantize_kernels``;
``quantize._fast_lastaxis`` / ``_fast_static`` decide, at plan time.

Why a separate family: the general kernels index any (d0, d1, d2, C) view element by
element; these move memory in the widest pieces the GPU has and keep every value in
registers between the statistic and the encode, which is what reaching the copy bandwidth
takes:

* a *unit* is 16 bytes of input (8 bf16/f16 or 4 f32 values): one ``ld.global.nc.v4.u32``
  (``_ptx.load_u32x4``) per unit, all of a thread's U units issued before any is used;
* its codes leave in one store (8 fp8/int8 codes: ``st.global.v2.u32``; 8 fp4 codes: one
  32-bit store; fp6: three 16-bit stores);
* one read of the input: the unit words stay in registers from the amax to the encode;
* a group of G elements is L = G / VEC consecutive units: a thread takes chunks of K of
  them (K = 1 for fp8, whose encode is cheap and whose loads then stay coalesced; up to 4
  for fp4 / fp6 / int, which then compute the group parameters once per chunk), and the
  L / K lanes of a group combine their amax by ``shfl.sync.bfly`` (``xor_max``); a row is
  combined by the warps of one block (one shared-memory slot per warp, one barrier);
* finite groups take shorter exact encoders: fp8 two codes per ``cvt.rn.satfinite.e4m3x2``,
  e2m1 and integers by float rounding tricks without a float -> int conversion; MXFP4,
  MXFP6 and NVFP4 of bfloat16 input two elements per instruction on bfloat16 pairs
  (``e2m1_unit_bf16``, ``fp6_unit_bf16``, ``e2m1_unit_nvfp4``: see the sections "MX e2m1 of
  bfloat16 input" and "MX fp6"; float32 element words of MX e2m1 / fp6 likewise, rounded to
  odd into bfloat16 first).

Exactness is the reference's, by the same device functions as the general kernels:
``group_params`` for the scale (float ``amax / max`` by IEEE division, MX e8m0 codes,
NVFP4 ue4m3), ``encode_element`` for the elements (IEEE ``x / s`` for float scales: by
``div.rn``, or in finite units from one reciprocal per scale and a correction step that gives
the same quotient bit for bit, ``_division`` / ``recip_store_unit``;
``x * 2^-k`` for MX -- the exact reciprocal of a power of two, so the product is
the same float32 as the quotient, see ``_codec.e8m0_reciprocal``), and the amax as the max
of |x|'s float32 bits (order-independent, NaN-propagating). A group whose amax is not
finite (it holds a NaN or an infinity) takes ``encode_element`` per element, NaN rules
included; only finite groups, where no NaN can arise, use the shorter encoders
(``enc_finite``, the paired cvt), which give encode_element's codes for every non-NaN value
(tests/test_kernels.py::test_finite_group_encoders, ::test_fp8_cvt_pair_matches_twin).

The warp shuffle has a twin (``xor_max`` with ``shfl=False``: shared memory and barriers)
that the CUDA simulator runs; the GPU tests run both variants.

Stochastic rounding: every factory takes ``stoch`` (compile-time; False builds the kernels
above unchanged), whose kernel keeps the loads, statistics, scales and stores and encodes
each element by encode_element with its Philox bits (section "stochastic rounding" below,
``sr_store_unit``), taking the seed's halves as two more arguments.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import float32, int32, uint32

from ..runtime.backend import cuda

from ..device.codec import (
    F32, FLT_MAX, KIND_BF16, KIND_F32, ONE, ZERO, bits_f32, f16_top_to_f32_bits, f32_bits, fmin_f32, mul_rn,
)
from ..device.elements import encode_element
from ..device.codec import encode_float_rne
from ..device.codec import encode_int_f32, philox4x32_10, sr_fast_key_bound, sr_float_code_fast  # stochastic rounding
from ..device.codec import E2M1_SR_MIN_BITS, sr_e2m1_code_f  # stochastic rounding, MX e2m1
from ..device.codec import E2M1_SR_I_KEY, sr_e2m1_code_i  # stochastic rounding, MX e2m1 and NVFP4
from ..device.division import RECIP_DIV, div_by_recip, ratio_ok, recip_guarded
from ..device.codec import NAN, is_finite_f32, nanmax_f32, nanmin_f32, rint_f32  # asym_group_r
from ..device.scales import asym_top_scale, range_scale  # asym_group_r
from ..device.scales import centred_params  # the generated centred step
from .grid import DONE_WORDS, grid_max_help, grid_max_publish, grid_max_read, missing, wait_done
from ..ptx import (
    E4M3, absmax_nan, array_addr, as_u16, as_u32, bf16x2_absmin, bf16x2_absmul, bf16x2_add, bf16x2_max, bf16x2_min,
    bf16x2_mul, cvt_e4m3, cvt_e4m3x2, cvt_e5m2x2, fp8_cvt_available, fp8_cvt_supports, load_u32x4, prmt, store_u32x2,
    u16x2_max, u16x2_min,
)
from .general import group_params, store_scale
from ..device.scales import (
    MODE_ASYM, MODE_CENTRED, MODE_FLOAT, MODE_MX, MODE_NVFP4, MX_RCEIL, NVFP4_INV6, float_scale,
    nvfp4_block_scale_code, nvfp4_tensor_encode_scale,
)
from ..runtime.target import SIMULATOR, devfn

__all__ = ["make_lastaxis_group_kernel", "make_lastaxis_row_kernel", "make_lastaxis_asym_row_kernel",
           "make_lastaxis_stat_group_kernel", "make_static_kernel", "make_tensor_amax_kernel", "vec_of", "SHFL_DEFAULT"]

FINITE = 0x7F800000  # abs bits below this: a finite float32
# Integer elements under float scales in last-axis groups (int4_group, int8 1xG): the group's
# reciprocal once per chunk (not once per unit: the units' encodes sit in separate basic blocks,
# so NVVM does not share it), bfloat16 amax two elements per instruction (word_amax16: the max
# of |x|'s 16-bit patterns is the max of their float32 bits), and a chunk's K units interleaved
# over the group's lanes as fp8 does (each load instruction of a warp covers whole sectors).
# The same codes and scales bit for bit. H100: int4_group bf16 8192x8192 / 16384x7168 77 / 78
# -> 95 / 97 % of copy (docs/design/last-axis.md). No launch bound: 5 blocks per SM (48 instead
# of 49 registers) measured no faster.
SHFL_DEFAULT = not SIMULATOR  # the simulator has no warp shuffle: it runs the twin


def vec_of(kind) -> int:
    """Elements per 16-byte unit."""
    return 4 if kind == KIND_F32 else 8


# ----------------------------------------------------------------------------- helpers
@devfn
def xor_max(v, off, shfl, scratch, tid):
    """max(v, v of lane tid ^ off): one butterfly step of a max over lanes. ``shfl``
    (compile-time): ``shfl.sync.bfly``; else the twin through shared memory (every thread of
    the block must call it, as every caller here does)."""
    if shfl:
        return max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, off))
    cuda.syncthreads()
    scratch[tid] = v
    cuda.syncthreads()
    return max(v, scratch[tid ^ off])


# Every per-unit function below is written out element by element (no loops over the
# unit): NVVM then keeps a thread's units in registers. A loop over a local array whose
# trip count it does not unroll would put them in local memory instead.
@devfn
def load_unit(x, x32, aligned, unit, valid, kind):
    """The 4 words of ``unit`` (zeros when not ``valid``). Unaligned input (a view at an odd
    offset) is read element by element."""
    z = np.uint32(0)
    if not valid:
        return z, z, z, z
    if aligned:
        return load_u32x4(x32, unit)
    i = np.uint64(4 * unit)
    if kind == KIND_F32:
        return x32[i], x32[i + np.uint64(1)], x32[i + np.uint64(2)], x32[i + np.uint64(3)]
    return pair_word(x, i), pair_word(x, i + np.uint64(1)), pair_word(x, i + np.uint64(2)), pair_word(x, i + np.uint64(3))


@devfn
def pair_word(x, k):
    """Word k of a 16-bit input read as two elements."""
    e = k * np.uint64(2)
    return np.uint32(np.uint32(x[e]) | (np.uint32(x[e + np.uint64(1)]) << np.uint32(16)))


@devfn
def half_bits(w, hi, kind):
    """float32 bits of the low (hi=0) or high (hi=1) 16-bit element of word w."""
    if kind == KIND_BF16:
        if hi == 0:
            return np.uint32(w << np.uint32(16))
        return np.uint32(w & np.uint32(0xFFFF0000))
    # float16: its bits in the word's top half (the high element's are there already)
    return f16_top_to_f32_bits(w if hi == 1 else np.uint32(w << np.uint32(16)))


@devfn
def unit_elems(w, kind):
    """The unit's elements as float32 bits (8 of them; an f32 unit fills the first 4)."""
    if kind == KIND_F32:
        z = np.uint32(0)
        return w[0], w[1], w[2], w[3], z, z, z, z
    return (half_bits(w[0], 0, kind), half_bits(w[0], 1, kind), half_bits(w[1], 0, kind), half_bits(w[1], 1, kind),
            half_bits(w[2], 0, kind), half_bits(w[2], 1, kind), half_bits(w[3], 0, kind), half_bits(w[3], 1, kind))


@devfn
def abs_i32(b):
    return np.int32(b & np.uint32(0x7FFFFFFF))


@devfn
def unit_amax(e, vec):
    """max over the unit of |x|'s float32 bits (the amax as bits, NaN above +inf)."""
    a = max(max(abs_i32(e[0]), abs_i32(e[1])), max(abs_i32(e[2]), abs_i32(e[3])))
    if vec == 8:
        a = max(a, max(max(abs_i32(e[4]), abs_i32(e[5])), max(abs_i32(e[6]), abs_i32(e[7]))))
    return a


@devfn
def unit_amax_nan(e):
    """unit_amax of an 8-element unit by _ptx.absmax_nan (FMNMX.NAN of |.|): the same bits but
    for a unit holding a NaN, whose amax is 0x7FFFFFFF (above +inf, as unit_amax's |NaN|)."""
    a = absmax_nan(absmax_nan(e[0], e[1]), absmax_nan(e[2], e[3]))
    b = absmax_nan(absmax_nan(e[4], e[5]), absmax_nan(e[6], e[7]))
    return np.int32(absmax_nan(a, b))


@devfn
def finite_abs(b):
    a = abs_i32(b)
    return a if a < FINITE else np.int32(0)


@devfn
def unit_amax_finite(e, vec):
    """The same over the finite elements only (NVFP4's tensor amax)."""
    a = max(max(finite_abs(e[0]), finite_abs(e[1])), max(finite_abs(e[2]), finite_abs(e[3])))
    if vec == 8:
        a = max(a, max(max(finite_abs(e[4]), finite_abs(e[5])), max(finite_abs(e[6]), finite_abs(e[7]))))
    return a


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


# ---- float scales, finite units: x / s by the reciprocal r = recip_guarded(s) (_division:
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
    if RECIP_DIV and clean and mode == MODE_FLOAT and r != ZERO:
        recip_store_unit(e, unit, p0, r, c8, c16, c32, fmt, cvt, vec, nb)
    else:  # as encode_store_unit: a float scale without a reciprocal goes element by element
        encode_store_unit(e, unit, p0, clean and not (RECIP_DIV and mode == MODE_FLOAT), c8, c16, c32, mode, fmt, cvt,
                          vec, nb)


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


# ---- MX e2m1 of bfloat16 input, two elements per instruction (finite groups). The MX
# multiplier is a power of two 2^-k with -127 <= k <= 126 (a normal bfloat16), so y = x * 2^-k
# is exact in bfloat16 (``bf16x2_mul``) wherever it is normal, and where it is not (|y| <
# 2^-126) its code is a signed zero either way. On |y| (at most 6 * (1 + 2^-22) for "rceil",
# below 8 for "floor" / "even", whose results are first clamped to 6: rounding is monotone and
# 6 is on the grid) one bfloat16 addition rounds onto the e2m1 grid and leaves the code in
# the sum's low mantissa bits: with t = 2^floor(log2(max(|y|, 1))) (1, 2 or 4; the grid
# spacing there is t / 2) the magic m = t / 2 * (2^7 + 2r), r = log2 t, has ulp t / 2, so
# |y| + m, rounded to nearest even, is m + n * t / 2 with n = |y| on the grid in units of
# t / 2 -- and the mantissa of that sum is 2r + n, which is the e2m1 code (n <= 4 for r = 0:
# codes 0-4 = 0 .. 2; 2 <= n <= 4 for r = 1: 4-6 = 2, 3, 4; n in {2, 3} for r = 2: 6, 7 =
# 4, 6). Ties go to even n, i.e. to even codes, as RNE on the e2m1 code requires, and for
# |y| in [6, 7) the sum saturates by itself (n = 3). The sign is the input's.
# tests/test_kernels.py::test_e2m1_pairs_every_bf16 checks every bfloat16 value at several k.
BF16X2_ONE = 0x3F803F80
BF16X2_SIX = 0x40C040C0
BF16X2_EXP = 0x7F807F80
M2E2M1 = 0x02020202  # per half: (6 << 7) - 2 * 127, the magic's exponent offset less 2 * bias


@devfn
def e2m1_pair_sum(a):
    """bfloat16 pair a + m for a pair of magnitudes a <= 6 (see above): the e2m1 code of
    element j in bits 16j .. 16j + 2, bits 16j + 3 .. 16j + 6 zero."""
    t = np.uint32(bf16x2_max(a, np.uint32(BF16X2_ONE)) & np.uint32(BF16X2_EXP))  # exponent bits of t
    m = np.uint32(t + (t >> np.uint32(6)) + np.uint32(M2E2M1))  # exponent + 6, mantissa 2r
    return np.uint32(bf16x2_add(a, m))


@devfn
def e2m1_pack(s0, s1, s2, s3, w):
    """The 8 e2m1 codes of a unit (element 0 in bits 0-3) from the pair sums s0 .. s3 and
    the signs of the input words w (the signs of x, and of y: the multiplier is positive)."""
    c01 = prmt(s0, s1, np.uint32(0x6420))  # code j in byte j
    c23 = prmt(s2, s3, np.uint32(0x6420))
    g01 = prmt(w[0], w[1], np.uint32(0x7531)) >> np.uint32(4)  # sign of element j at bit 8j + 3
    g23 = prmt(w[2], w[3], np.uint32(0x7531)) >> np.uint32(4)
    n01 = np.uint32((c01 & np.uint32(0x07070707)) | (g01 & np.uint32(0x08080808)))  # nibble j in byte j
    n23 = np.uint32((c23 & np.uint32(0x07070707)) | (g23 & np.uint32(0x08080808)))
    n01 = np.uint32(n01 | (n01 >> np.uint32(4)))  # byte 0: n0 | n1 << 4, byte 2: n2 | n3 << 4
    n23 = np.uint32(n23 | (n23 >> np.uint32(4)))
    return np.uint32(prmt(n01, n23, np.uint32(0x6420)))


@devfn
def mx_pair_abs(w, p2, clamp):
    """|x * p2| for the bfloat16 pair w and the power of two p2, clamped to 6 if ``clamp``."""
    a = np.uint32(bf16x2_absmul(w, p2))
    if clamp:
        a = np.uint32(bf16x2_min(a, np.uint32(BF16X2_SIX)))
    return a


@devfn
def e2m1_unit_bf16(w, p2, clamp):
    """The 8 packed e2m1 codes (element 0 in bits 0-3) of a bfloat16 unit (4 words) times
    the power of two p2 (bf16x2), for a finite MX group."""
    return e2m1_pack(e2m1_pair_sum(mx_pair_abs(w[0], p2, clamp)), e2m1_pair_sum(mx_pair_abs(w[1], p2, clamp)),
                     e2m1_pair_sum(mx_pair_abs(w[2], p2, clamp)), e2m1_pair_sum(mx_pair_abs(w[3], p2, clamp)), w)


# NVFP4's element multiplier is not a power of two: y = x * m_b is rounded in float32 (the
# spec's product), and its 24-bit significand does not fit a bfloat16. Rounded *to odd*
# into bfloat16 (the top 16 bits, and bit 0 set when any of the low 16 was: the exact y is
# then never mistaken for a tie, and a tie stays a tie), y keeps enough bits for the
# grid's round to nearest even: rounding to odd with p bits, then to nearest with q <= p - 2
# bits, is rounding to nearest once (the e2m1 grid at |y| has at most 2 significant bits,
# bfloat16 8; both grids are binary, the e2m1 one a subset). Then as above, clamped to 6
# (a block's e4m3 scale, rounded to nearest, and down to a subnormal, can leave |y| above 7).
@devfn
def rto_parts(y0, y1):
    """(t, s) of the float32 bits y0, y1: the bfloat16 pair of their top halves (truncated; y0
    in bits 0-15, the signs theirs) and its sticky bits (1 in a half whose low half is not 0).
    t | s is the pair rounded to odd; apart, an encoder's |t | s| (bf16x2_absmin's and) folds
    into the one LOP3 with the or, and the signs are read off t."""
    t = prmt(y0, y1, np.uint32(0x7632))
    s = u16x2_min(prmt(y0, y1, np.uint32(0x5410)), np.uint32(0x00010001))
    return np.uint32(t), np.uint32(s)


@devfn
def nvfp4_pair_abs(w, mb):
    """min(|rto_bf16(x * mb)|, 6) of the bfloat16 pair w (float32 products)."""
    y0 = np.uint32(f32_bits(bits_f32(np.uint32(w << np.uint32(16))) * mb))
    y1 = np.uint32(f32_bits(bits_f32(np.uint32(w & np.uint32(0xFFFF0000))) * mb))
    t, s = rto_parts(y0, y1)
    return np.uint32(bf16x2_absmin(np.uint32(t | s), np.uint32(BF16X2_SIX)))


@devfn
def e2m1_unit_nvfp4(w, mb):
    """The 8 packed e2m1 codes of a bfloat16 unit times NVFP4's float32 multiplier mb, for
    a finite block (no NaN can arise: mb is finite and positive, x finite)."""
    return e2m1_pack(e2m1_pair_sum(nvfp4_pair_abs(w[0], mb)), e2m1_pair_sum(nvfp4_pair_abs(w[1], mb)),
                     e2m1_pair_sum(nvfp4_pair_abs(w[2], mb)), e2m1_pair_sum(nvfp4_pair_abs(w[3], mb)), w)


# MX e2m1 of float32 element words (float16 / float32 inputs, and the fused ops' normalized
# y), two elements per bfloat16 pair: y = x * 2^-k is exact in float32 (but for subnormals,
# whose code is a signed zero either way), then rounded *to odd* into bfloat16 (the NVFP4
# argument above: rounding to odd with 8 bits, then to nearest even with at most 2, is
# rounding to nearest once), clamped to 6 (the e2m1 encode saturates: (6, 7) rounds to 6 and
# anything larger is past the top of the grid) and put on the grid by the same magic add;
# the signs are those of the rounded pairs (p0 > 0: of x). Where: encode_store_unit, MX
# finite groups of 8-element units. H100: fused RMSNorm + MXFP4 30.7 -> 40.6 % of copy, with
# the residual 59.2 -> 70.4 %, flatten + MXFP4 35.6 -> 53.2 % (docs/design/last-axis.md).


@devfn
def f32_pair_rto(e_lo, e_hi, p0):
    """rto_parts (t, s) of the float32 products x_lo * p0, x_hi * p0: t | s is the pair
    rounded to odd."""
    return rto_parts(np.uint32(f32_bits(bits_f32(e_lo) * p0)), np.uint32(f32_bits(bits_f32(e_hi) * p0)))


@devfn
def e2m1_unit_f32(e, p0):
    """The 8 packed e2m1 codes (element 0 in bits 0-3) of an 8-element unit of float32 bits
    ``e`` times the MX power of two p0, for a finite group."""
    t0, s0 = f32_pair_rto(e[0], e[1], p0)
    t1, s1 = f32_pair_rto(e[2], e[3], p0)
    t2, s2 = f32_pair_rto(e[4], e[5], p0)
    t3, s3 = f32_pair_rto(e[6], e[7], p0)
    six = np.uint32(BF16X2_SIX)
    return e2m1_pack(e2m1_pair_sum(bf16x2_absmin(t0 | s0, six)), e2m1_pair_sum(bf16x2_absmin(t1 | s1, six)),
                     e2m1_pair_sum(bf16x2_absmin(t2 | s2, six)), e2m1_pair_sum(bf16x2_absmin(t3 | s3, six)),
                     (t0, t1, t2, t3))


# The same codes with the multiplier folded into the pairs: y is rounded to odd into bfloat16
# first and the pair's magnitude then scaled by one bfloat16 multiply, exact where the product
# is normal (a power of two scales the bfloat16 grid: rto(y) * 2^-k is rto(y * 2^-k)). Where y
# is subnormal its bfloat16 grid (2^-133) is coarser than float32's, but 2^-k <= 2^127 puts the
# e2m1 spacing of y * 2^-k (>= 2^-1) at >= 2^-128 in units of y: rounding to odd on a grid at
# least 32 times finer, then to nearest, is still rounding to nearest once, and the product is
# exact. Where y * 2^-k < 2^-126 both give a signed zero code (p2 = 2^-127, code 254, is a
# bfloat16 subnormal: the products it makes that are not exact are all below 2^-126). The
# signs are y's. In an MX "rceil" group |y| * 2^-k <= 6 * (1 + 2^-22) (the scale is amax / 6
# rounded up to a power of two, amax the group's), so rto(y) * 2^-k, at most one bfloat16 ulp
# above, stays below 6.1 and needs no clamp (the magic sum puts [6, 7) on code 7 by itself):
# per pair two float32 multiplies and the clamp less than e2m1_unit_f32.
@devfn
def e2m1_unit_f32_p2(e, p2, clamp):
    """e2m1_unit_f32's codes (element 0 in bits 0-3) of an 8-element unit of float32 bits ``e``
    in a finite MX group, p2 = 2^-k as a bfloat16 pair (the float32 multiplier's top half
    twice: prmt 0x3232). ``clamp`` (compile-time): each scaled pair clamped to 6 (any scale
    rounding); without, for "rceil" groups only (|e| * 2^-k <= 6 * (1 + 2^-22))."""
    m = np.uint32(0x7FFF7FFF)  # |.|: folds into the LOP3 with the sticky bits
    six = np.uint32(BF16X2_SIX)
    t0, s0 = rto_parts(e[0], e[1])
    t1, s1 = rto_parts(e[2], e[3])
    t2, s2 = rto_parts(e[4], e[5])
    t3, s3 = rto_parts(e[6], e[7])
    a0, a1 = bf16x2_mul((t0 & m) | s0, p2), bf16x2_mul((t1 & m) | s1, p2)
    a2, a3 = bf16x2_mul((t2 & m) | s2, p2), bf16x2_mul((t3 & m) | s3, p2)
    if clamp:
        a0, a1 = bf16x2_min(a0, six), bf16x2_min(a1, six)
        a2, a3 = bf16x2_min(a2, six), bf16x2_min(a3, six)
    return e2m1_pack(e2m1_pair_sum(a0), e2m1_pair_sum(a1), e2m1_pair_sum(a2), e2m1_pair_sum(a3), (t0, t1, t2, t3))


# ---- MX fp6 (e2m3, e3m2) in bfloat16 pairs (finite groups). The same argument as the e2m1
# pairs above, for a format of M mantissa bits (3 or 2), smallest normal exponent emin and
# largest finite value vmax: y = x * 2^-k is exact in bfloat16 wherever it is normal (its code
# is a signed zero where it is not), and |y| is first clamped to vmax where it can exceed it ("floor" / "even" scales; rounding is monotone and
# vmax is on the grid, so every |y| >= vmax -- an infinite product included -- gets the
# largest code, as the reference's saturation does). With T = max(exponent of |y|, emin) the
# fp6 grid spacing at |y| is 2^(T - M); the magic m = 2^(T + 7 - M) has exactly that bfloat16
# ulp and |y| < 2^(T + 1) <= m / 2^(6 - M), so one bfloat16 addition |y| + m, rounded to
# nearest even, is m + n * 2^(T - M) with n = |y| rounded onto the grid in units of the spacing
# (n <= 2^(M + 1): no carry out of the sum's mantissa). The code is then n + ((T - emin) << M)
# -- for T = emin that is a subnormal n (n = 2^M: the smallest normal), above it the normal
# code -- computed per 16-bit half as (s - m) + (T - emin) << M, with (T - emin) << M read
# off the exponent bits of 2^T by one shift (both halves at once: the shifted-out bits are
# the zero mantissa of 2^T). Ties go to even n, i.e. to even codes. The sign is the input's
# (the multiplier is positive). The pair's two codes are packed into 12 bits by one multiply-add
# (lo + hi * 64 = c - (c >> 16) * (2^16 - 64)). Float32 element words (float16 / float32 input) are first
# rounded *to odd* into bfloat16 (f32_pair_rto: 8 significant bits, then RNE to at most 4, is
# rounding to nearest once). tests/test_mx_encoders.py checks every finite bfloat16 value at
# several k, and float32 values around every code boundary. Where: the group kernel for
# bfloat16 input, encode_store_unit for float32 element words. H100: bf16 8192x8192 /
# 16384x7168 mxfp6_e3m2 and e2m3 46 / 47 -> 97 / 100 % of copy (docs/design/last-axis.md).


@devfn
def fp6_pair_consts(fmt):
    """Constants of the fp6 pair encoder for the element format tuple ``fmt`` (compile-time:
    they fold; on the host: ``.py_func``): (7 - M, 2^emin, vmax, (7 - M) << 7), each but the
    first as a bfloat16 pair."""
    M = fmt[1]
    emax = (fmt[3] >> M) + fmt[2] - 1  # max_code = ((emax - emin + 1) << M) | (2^M - 1)
    pmin = (127 + fmt[2]) << 7
    vmax = ((127 + emax) << 7) | (((1 << M) - 1) << (7 - M))
    return (7 - M, pmin | (pmin << 16), vmax | (vmax << 16), ((7 - M) << 7) | ((7 - M) << 23))


@devfn
def is_fp6(fmt):
    """The element format tuple is a 6-bit float with 2 or 3 mantissa bits (e3m2, e2m3)."""
    return fmt[0] == 1 and fmt[5] == 6 and (fmt[1] == 2 or fmt[1] == 3)


@devfn
def fp6_pair_codes(a, w, f6):
    """The fp6 codes of the bfloat16 pair a of magnitudes <= vmax with the signs of the pair
    w, packed into 12 bits (element 0's code in bits 0-5); f6 = fp6_pair_consts(fmt)."""
    u = np.uint32(bf16x2_max(a, np.uint32(f6[1])) & np.uint32(BF16X2_EXP))  # 2^T per half
    v = np.uint32(u - np.uint32(f6[1]))  # (T - emin) << 7 per half (no borrow: T >= emin)
    m = np.uint32(u + np.uint32(f6[3]))  # 2^(T + 7 - M)
    s = np.uint32(bf16x2_add(a, m))
    c = np.uint32(np.uint32(s - m) + (v >> np.uint32(f6[0])))  # per half n + (T - emin) << M
    c = np.uint32(c | ((w >> np.uint32(10)) & np.uint32(0x00200020)))  # sign bits 15, 31 -> 5, 21
    return np.uint32(c - np.uint32((c >> np.uint32(16)) * np.uint32(0xFFC0)))  # lo + hi * 64


@devfn
def fp6_unit_bf16(w, p2, f6, clamp):
    """(lo, hi): the fp6 codes of elements 0-3 and 4-7 of a bfloat16 unit (4 words) times
    the power of two p2 (bf16x2), 24 bits each (store_packed's form), for a finite MX group.
    ``clamp``: |y| first clamped to vmax ("floor" / "even" scales leave |y| up to 2^(emax+1);
    "rceil" keeps a bfloat16 y at most vmax: the next bfloat16 above it is beyond the float32
    rounding of amax / vmax)."""
    a0 = np.uint32(bf16x2_absmul(w[0], p2))
    a1 = np.uint32(bf16x2_absmul(w[1], p2))
    a2 = np.uint32(bf16x2_absmul(w[2], p2))
    a3 = np.uint32(bf16x2_absmul(w[3], p2))
    if clamp:
        vmax = np.uint32(f6[2])
        a0 = np.uint32(bf16x2_min(a0, vmax))
        a1 = np.uint32(bf16x2_min(a1, vmax))
        a2 = np.uint32(bf16x2_min(a2, vmax))
        a3 = np.uint32(bf16x2_min(a3, vmax))
    lo = np.uint32(fp6_pair_codes(a0, w[0], f6) | (fp6_pair_codes(a1, w[1], f6) << np.uint32(12)))
    hi = np.uint32(fp6_pair_codes(a2, w[2], f6) | (fp6_pair_codes(a3, w[3], f6) << np.uint32(12)))
    return lo, hi


@devfn
def fp6_unit_f32(e, p0, f6, vec):
    """fp6_unit_bf16 for a unit of float32 element bits ``e`` (vec = 8 or 4; hi = 0 for 4)
    times the MX power of two p0 (float32), by bfloat16 pairs rounded to odd, clamped (a
    product rounded to odd can sit one bfloat16 ulp above vmax)."""
    vmax = np.uint32(f6[2])
    t0, s0 = f32_pair_rto(e[0], e[1], p0)
    t1, s1 = f32_pair_rto(e[2], e[3], p0)
    lo = np.uint32(fp6_pair_codes(bf16x2_absmin(t0 | s0, vmax), t0, f6)
                   | (fp6_pair_codes(bf16x2_absmin(t1 | s1, vmax), t1, f6) << np.uint32(12)))
    hi = np.uint32(0)
    if vec == 8:
        t2, s2 = f32_pair_rto(e[4], e[5], p0)
        t3, s3 = f32_pair_rto(e[6], e[7], p0)
        hi = np.uint32(fp6_pair_codes(bf16x2_absmin(t2 | s2, vmax), t2, f6)
                       | (fp6_pair_codes(bf16x2_absmin(t3 | s3, vmax), t3, f6) << np.uint32(12)))
    return lo, hi


@devfn
def store_fp6_chunk(c32, chunk, l0, h0, l1, h1, l2, h2, l3, h3):
    """Store the fp6 codes of 4 consecutive 8-element units (24 + 24 bits each, as
    fp6_unit_bf16 returns them) as the 24 bytes at 24 * chunk: three 8-byte stores."""
    i = np.uint64(3 * chunk)
    store_u32x2(c32, i, np.uint32(l0 | (h0 << np.uint32(24))), np.uint32((h0 >> np.uint32(8)) | (l1 << np.uint32(16))))
    store_u32x2(c32, i + np.uint64(1), np.uint32((l1 >> np.uint32(16)) | (h1 << np.uint32(8))),
                np.uint32(l2 | (h2 << np.uint32(24))))
    store_u32x2(c32, i + np.uint64(2), np.uint32((h2 >> np.uint32(8)) | (l3 << np.uint32(16))),
                np.uint32((l3 >> np.uint32(16)) | (h3 << np.uint32(8))))


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
def word_amax16(w):
    """Per 16-bit half, max over the unit's 4 words of |x|'s bits (unsigned: the order of
    the float32 bits of |x|, NaN above +inf)."""
    m = np.uint32(0x7FFF7FFF)
    return np.uint32(u16x2_max(u16x2_max(w[0] & m, w[1] & m), u16x2_max(w[2] & m, w[3] & m)))


@devfn
def amax_step(a, a2, w, kind, vec):
    """Running amax of whole units (word tuples): bfloat16 words two halves per instruction
    into a2 (word_amax16), other kinds as float32 bits into a; amax_done combines them into
    unit_amax's value (the order of the bits is that of the float32 bits of |x|)."""
    if kind == KIND_BF16:
        return a, np.uint32(u16x2_max(a2, word_amax16(w)))
    return max(a, unit_amax(unit_elems(w, kind), vec)), a2


@devfn
def amax_done(a, a2, kind):
    if kind == KIND_BF16:
        return np.int32(max(a2 & np.uint32(0xFFFF), a2 >> np.uint32(16)) << np.uint32(16))
    return a


@devfn
def pack4(q0, q1, q2, q3, nb):
    return np.uint32(q0 | (q1 << np.uint32(nb)) | (q2 << np.uint32(2 * nb)) | (q3 << np.uint32(3 * nb)))


@devfn
def encode_store_unit(e, unit, p0, clean, c8, c16, c32, mode, fmt, cvt, vec, nb):
    """Encode the unit's elements (float32 bits ``e``) with their group's parameter p0 and
    store the codes (``nb`` bits each, first element lowest) at byte unit * vec * nb / 8.
    A clean unit under a float scale is divided by the reciprocal (recip_store_unit), which
    needs every |x| < p0 * 2^64: callers with caller-given scales pass clean = False where
    ratio_ok fails. A scale outside recip_guarded's range (|amax| below about 2^-71) takes
    encode_element per element, as non-finite units do (one path less to compile)."""
    if RECIP_DIV and mode == MODE_FLOAT:
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


@devfn
def store_packed(lo, hi, unit, c8, c16, c32, vec, nb):
    """Store a unit's codes, packed in ``lo`` (elements 0-3) and ``hi`` (4-7, ``nb`` bits
    each, first element lowest), at byte unit * vec * nb / 8."""
    bits = nb * vec
    if bits == 64:  # eight 8-bit codes
        store_u32x2(c32, unit, lo, hi)
    elif bits == 32:  # four 8-bit or eight 4-bit codes
        c32[np.uint64(unit)] = np.uint32(lo | (hi << np.uint32(16))) if vec == 8 else lo
    elif bits == 16:  # four 4-bit codes
        c16[np.uint64(unit)] = np.uint16(lo)
    elif bits == 48:  # eight 6-bit codes: 24 + 24 bits in three 16-bit words
        i = np.uint64(3 * unit)
        c16[i] = np.uint16(lo & np.uint32(0xFFFF))
        c16[i + np.uint64(1)] = np.uint16((lo >> np.uint32(16)) | ((hi & np.uint32(0xFF)) << np.uint32(8)))
        c16[i + np.uint64(2)] = np.uint16(hi >> np.uint32(8))
    else:  # 24: four 6-bit codes in three bytes
        i = np.uint64(3 * unit)
        c8[i] = np.uint8(lo & np.uint32(0xFF))
        c8[i + np.uint64(1)] = np.uint8((lo >> np.uint32(8)) & np.uint32(0xFF))
        c8[i + np.uint64(2)] = np.uint8(lo >> np.uint32(16))


# ---- stochastic rounding (``rounding="stochastic"``). Every factory below takes ``stoch``, a
# compile-time switch: False (the default) generates the RNE kernel exactly as before; True the
# same kernel -- loads, layout, statistics, group parameters and scales (never rounded
# stochastically, so the RNE kernel's bits) and stores -- whose per-unit encode is
# sr_store_unit, and which takes two more arguments, key_lo and key_hi (the seed's halves).
# Element i (its C-order linear index) takes word i % 4 of the Philox4x32-10 block at counter
# i // 4 (reference/rng.random_bits). A 16-byte unit u holds elements u * VEC .. u * VEC + VEC - 1
# and VEC is 4 or 8, so its random bits are whole Philox blocks, u or 2u and 2u + 1, whatever
# thread or launch geometry holds the unit. The encode is encode_element's with stoch=True (the
# general kernels' encoder, every NaN rule included): the finite-group shortcuts above are
# round-to-nearest only, and a float scale keeps the IEEE x / s (div.rn) -- the reciprocal
# division (_division) equals it only where |x / s| >= 2^-125 and |x| >= 2^-102; below, its
# quotient is only known to be tiny and of x's sign, which round-to-nearest maps to the same zero
# code but which would move a stochastic rounding's threshold.
@devfn
def unit_random_words(unit, vec, key_lo, key_hi):
    """The 32 random bits of each element of 16-byte unit ``unit`` (element unit * vec + j
    takes r_j): Philox block ``unit`` for a float32 unit (vec = 4; r4 .. r7 are 0), blocks
    2 unit and 2 unit + 1 for a 16-bit one (vec = 8)."""
    b = np.int64(unit)
    if vec == 4:
        r0, r1, r2, r3 = philox4x32_10(b & 0xFFFFFFFF, b >> 32, key_lo, key_hi)
        z = np.int64(0)
        return r0, r1, r2, r3, z, z, z, z
    b = b * 2
    r0, r1, r2, r3 = philox4x32_10(b & 0xFFFFFFFF, b >> 32, key_lo, key_hi)
    b = b + 1
    r4, r5, r6, r7 = philox4x32_10(b & 0xFFFFFFFF, b >> 32, key_lo, key_hi)
    return r0, r1, r2, r3, r4, r5, r6, r7


@devfn
def sr_enc(xb, p0, p1, pz, mode, fmt, r, mask):
    """The stochastically rounded code of the element with float32 bits ``xb`` and random
    bits ``r`` in a group with parameters (p0, p1, pz) (group_params'; centred: p1 = mean)."""
    return np.uint32(encode_element(bits_f32(xb), p0, p1, pz, mode, fmt, True, r, False) & mask)


@devfn
def sr_store_unit(e, unit, p0, p1, pz, key_lo, key_hi, c8, c16, c32, mode, fmt, vec, nb):
    """encode_store_unit under stochastic rounding: the unit's elements (float32 bits ``e``)
    encoded with their Philox bits (unit_random_words) and stored as store_packed does."""
    r = unit_random_words(unit, vec, key_lo, key_hi)
    m = (1 << nb) - 1
    lo = pack4(sr_enc(e[0], p0, p1, pz, mode, fmt, r[0], m), sr_enc(e[1], p0, p1, pz, mode, fmt, r[1], m),
               sr_enc(e[2], p0, p1, pz, mode, fmt, r[2], m), sr_enc(e[3], p0, p1, pz, mode, fmt, r[3], m), nb)
    hi = np.uint32(0)
    if vec == 8:
        hi = pack4(sr_enc(e[4], p0, p1, pz, mode, fmt, r[4], m), sr_enc(e[5], p0, p1, pz, mode, fmt, r[5], m),
                   sr_enc(e[6], p0, p1, pz, mode, fmt, r[6], m), sr_enc(e[7], p0, p1, pz, mode, fmt, r[7], m), nb)
    store_packed(lo, hi, unit, c8, c16, c32, vec, nb)


# ---- stochastic rounding of a clean unit, the short way. sr_store_unit runs encode_element per
# element: an IEEE division (ten instructions and a slow-path branch) and encode_float_sr32,
# whose normal-range shortcut and subnormal block are two branches per element. For a unit of
# a finite group under a float scale with a reciprocal (r != 0), an MX power of two or an NVFP4
# multiplier, sr_store_unit_r takes instead, for every element without a branch:
#   q = x / s by div_by_recip (three instructions), or x * multiplier (the reference's product);
#   the code by sr_float_code_fast (float formats; formats of at most SR_SUB_BITS bits with its
#   branch-free subnormal range, where much of a group lies) or encode_int_f32 (integers);
# then checks the unit once: every code's key passes sr_fast_key_bound, and (float scales) every
# |x| is 0 or at least max(2^-102, s * 2^-124), where div_by_recip is RN(x / s) bit for bit
# (_division: |x| >= 2^-102 and |x / s| >= 2^-125 hold there, and +-0 is exact; |x| < s * 2^64 holds
# for a dynamic scale's group and is part of ``clean`` for a caller-given one). A unit that fails
# is encoded again by sr_store_unit (its Philox bits are recomputed: rare). The same codes bit
# for bit as sr_store_unit (tests/test_sr_encoder.py, tests/test_stochastic_lastaxis.py).
# H100, bf16 8192x8192, against sr_store_unit for every unit: fp8_row SR 172.9 -> 146.0 us,
# mxfp6_e2m3 201.2 -> 163.1, mxfp8 150.3 -> 140.2 (with Philox's wide multiplies).
SR_SUB_BITS = 6  # e2m3, e3m2: sr_float_code_fast's subnormal range (fp8's subnormals are rare)
# e2m1 (MXFP4, NVFP4) does not take this short encode: H100, bf16 8192x8192, with its branch-free
# subnormal range it took mxfp4 SR from 199.0 to 239.0 us and nvfp4 from 280.7 to 287.9 (about a
# third of an e2m1 group lies below its normal range, [0.5, 1) of 6); e2m1 has its own integer
# encode (sr_unit_e2m1_i, below)
SR_FAST_MIN_FLOAT_BITS = 6
TINY_X_BITS = 0x0C800000  # 2^-102
S_TINY_SHIFT = 124 << 23  # s * 2^-124 on the bits (s >= 2^-80 under recip_guarded: may underflow, then 2^-102 rules)
# The stochastic row and group kernels have no launch bound: H100, bf16 8192x8192, 5 blocks per
# SM (fp8_row 62 -> 56 registers) measured mixed (fp8_row 156.0 -> 154.1 us, mxfp4 198.9 -> 203.0).


@devfn
def sr_fast_code(xb, p0, r, mode, fmt, rw, mask):
    """(code, key) of the element with float32 bits ``xb`` and random bits ``rw`` in a clean
    unit (see above): the key is sr_float_code_fast's (integers: always valid)."""
    x = bits_f32(xb)
    q = div_by_recip(x, p0, r) if mode == MODE_FLOAT else x * p0
    if fmt[0] == 1:
        c, k = sr_float_code_fast(f32_bits(q), fmt[1], fmt[2], fmt[3], fmt[5], rw, fmt[5] <= SR_SUB_BITS)
        return np.uint32(c & np.uint32(mask)), k
    return np.uint32(encode_int_f32(q, fmt[6], fmt[7], True, rw) & mask), np.uint32(0xFFFFFFFF)


@devfn
def x_key(xb):
    """|x|'s bits less 1 as uint32 (x = +-0: 2^32 - 1): a unit's min of these is at least
    T - 1 iff every |x| is 0 or >= T."""
    return np.uint32(np.int64(np.uint32(xb) & np.uint32(0x7FFFFFFF)) - 1)


@devfn
def sr_unit_fast(e, unit, p0, r, key_lo, key_hi, mode, fmt, vec, nb):
    """(lo, hi, ok): the unit's codes packed as store_packed takes them, and whether they are
    sr_store_unit's (every key passes; float scales: every |x| in div_by_recip's range)."""
    rw = unit_random_words(unit, vec, key_lo, key_hi)
    m = (1 << nb) - 1
    c0, k0 = sr_fast_code(e[0], p0, r, mode, fmt, rw[0], m)
    c1, k1 = sr_fast_code(e[1], p0, r, mode, fmt, rw[1], m)
    c2, k2 = sr_fast_code(e[2], p0, r, mode, fmt, rw[2], m)
    c3, k3 = sr_fast_code(e[3], p0, r, mode, fmt, rw[3], m)
    lo = pack4(c0, c1, c2, c3, nb)
    kmin = min(min(k0, k1), min(k2, k3))
    xmin = min(min(x_key(e[0]), x_key(e[1])), min(x_key(e[2]), x_key(e[3])))
    hi = np.uint32(0)
    if vec == 8:
        c4, k4 = sr_fast_code(e[4], p0, r, mode, fmt, rw[4], m)
        c5, k5 = sr_fast_code(e[5], p0, r, mode, fmt, rw[5], m)
        c6, k6 = sr_fast_code(e[6], p0, r, mode, fmt, rw[6], m)
        c7, k7 = sr_fast_code(e[7], p0, r, mode, fmt, rw[7], m)
        hi = pack4(c4, c5, c6, c7, nb)
        kmin = min(kmin, min(min(k4, k5), min(k6, k7)))
        xmin = min(xmin, min(min(x_key(e[4]), x_key(e[5])), min(x_key(e[6]), x_key(e[7]))))
    ok = True
    if fmt[0] == 1:
        ok = kmin >= np.uint32(sr_fast_key_bound(fmt[1], fmt[2], fmt[5] <= SR_SUB_BITS))
    if mode == MODE_FLOAT:
        tb = max(np.int32(TINY_X_BITS), np.int32(np.int32(f32_bits(p0)) - np.int32(S_TINY_SHIFT)))
        ok = ok and xmin >= np.uint32(tb - 1)
    return lo, hi, ok


# MX e2m1 of 16-bit input (mxfp4 of bf16 / f16), clean groups: sr_e2m1_code_f's float form of
# the rule (its steps are powers of two and q = x * 2^-k keeps at most 11 significant bits), kept
# where every |q| is 0 or >= 2^-14; mostly FMA-pipe work where encode_float_sr32's integer carry
# and its subnormal block (about a third of an e2m1 group) fill the ALU pipe (H200, bf16
# 8192x8192: mxfp4 SR 200.6 -> 156.0 us against sr_store_unit). Tried after the integer encode
# below (sr_store_unit_r), which is faster where it holds (H100, bf16 8192x8192, mxfp4 SR
# 145.2 -> 134.5 us, docs/design/stochastic-rounding.md).


@devfn
def sr_unit_e2m1(e, unit, p0, key_lo, key_hi, nb):
    """(lo, hi, ok): the codes of an 8-element unit of a clean MX e2m1 group (multiplier p0 =
    2^-k), packed as store_packed takes them, and whether sr_e2m1_code_f holds for all."""
    rw = unit_random_words(unit, 8, key_lo, key_hi)
    c0, k0 = sr_e2m1_code_f(bits_f32(e[0]) * p0, rw[0])
    c1, k1 = sr_e2m1_code_f(bits_f32(e[1]) * p0, rw[1])
    c2, k2 = sr_e2m1_code_f(bits_f32(e[2]) * p0, rw[2])
    c3, k3 = sr_e2m1_code_f(bits_f32(e[3]) * p0, rw[3])
    c4, k4 = sr_e2m1_code_f(bits_f32(e[4]) * p0, rw[4])
    c5, k5 = sr_e2m1_code_f(bits_f32(e[5]) * p0, rw[5])
    c6, k6 = sr_e2m1_code_f(bits_f32(e[6]) * p0, rw[6])
    c7, k7 = sr_e2m1_code_f(bits_f32(e[7]) * p0, rw[7])
    kmin = min(min(min(k0, k1), min(k2, k3)), min(min(k4, k5), min(k6, k7)))
    ok = kmin >= np.uint32(E2M1_SR_MIN_BITS - 1)
    return pack4(c0, c1, c2, c3, nb), pack4(c4, c5, c6, c7, nb), ok


# MX e2m1 and NVFP4, clean groups, any input kind: sr_e2m1_code_i's integer form of the rule
# (one IMAD.WIDE.U32 an element, no branch), kept where every |q| is 0, below 2^-33 or at
# least 2^-10; q = |x| * p0 (the sign is x's: p0 > 0). H100, bf16 8192x8192
# (docs/design/stochastic-rounding.md): nvfp4 SR 265.0 -> 191 us, mxfp4 SR 145.2 -> 134.5.


@devfn
def e2m1_sr_i(xb, p0, rw):
    """(code, key) of the element with float32 bits ``xb`` times p0 > 0 (sr_e2m1_code_i)."""
    return sr_e2m1_code_i(f32_bits(abs(bits_f32(xb)) * p0), rw, xb)


@devfn
def sr_unit_e2m1_i(e, unit, p0, key_lo, key_hi, vec, nb):
    """(lo, hi, ok): the e2m1 codes of a unit of a clean MX / NVFP4 group (multiplier p0),
    packed as store_packed takes them, and whether sr_e2m1_code_i holds for all."""
    rw = unit_random_words(unit, vec, key_lo, key_hi)
    c0, k0 = e2m1_sr_i(e[0], p0, rw[0])
    c1, k1 = e2m1_sr_i(e[1], p0, rw[1])
    c2, k2 = e2m1_sr_i(e[2], p0, rw[2])
    c3, k3 = e2m1_sr_i(e[3], p0, rw[3])
    kmin = min(min(k0, k1), min(k2, k3))
    hi = np.uint32(0)
    if vec == 8:
        c4, k4 = e2m1_sr_i(e[4], p0, rw[4])
        c5, k5 = e2m1_sr_i(e[5], p0, rw[5])
        c6, k6 = e2m1_sr_i(e[6], p0, rw[6])
        c7, k7 = e2m1_sr_i(e[7], p0, rw[7])
        hi = pack4(c4, c5, c6, c7, nb)
        kmin = min(kmin, min(min(k4, k5), min(k6, k7)))
    return pack4(c0, c1, c2, c3, nb), hi, kmin >= np.uint32(E2M1_SR_I_KEY)


@devfn
def sr_store_unit_r(e, unit, p0, r, clean, key_lo, key_hi, c8, c16, c32, mode, fmt, vec, nb):
    """sr_store_unit of a unit with its group's parameter p0 and, for a float scale, r =
    recip_guarded(p0) (else unused): ``clean`` (a finite group; a caller-given scale: finite,
    non-zero, ratio_ok) units under a float scale with r != 0, an MX scale or a finite NVFP4
    multiplier take sr_unit_fast, and keep its codes where it says they hold."""
    e2m1 = fmt[0] == 1 and fmt[5] == 4 and fmt[1] == 1 and fmt[3] == 7  # (constants: folded)
    if clean and e2m1 and (
            mode == MODE_MX or (mode == MODE_NVFP4 and abs_i32(f32_bits(p0)) < FINITE)):
        lo, hi, ok = sr_unit_e2m1_i(e, unit, p0, key_lo, key_hi, vec, nb)
        if ok:
            store_packed(lo, hi, unit, c8, c16, c32, vec, nb)
            return
    if (fmt[0] == 0 or fmt[5] >= SR_FAST_MIN_FLOAT_BITS) and clean and (
            mode == MODE_MX or (mode == MODE_NVFP4 and abs_i32(f32_bits(p0)) < FINITE)
            or (mode == MODE_FLOAT and r != ZERO)):
        lo, hi, ok = sr_unit_fast(e, unit, p0, r, key_lo, key_hi, mode, fmt, vec, nb)
        if ok:
            store_packed(lo, hi, unit, c8, c16, c32, vec, nb)
            return
    if clean and mode == MODE_MX and vec == 8 and e2m1:
        lo, hi, ok = sr_unit_e2m1(e, unit, p0, key_lo, key_hi, nb)
        if ok:
            store_packed(lo, hi, unit, c8, c16, c32, vec, nb)
            return
    sr_store_unit(e, unit, p0, ZERO, 0, key_lo, key_hi, c8, c16, c32, mode, fmt, vec, nb)


def _sub(src, old, new):
    """``src`` with its one occurrence of ``old`` replaced (the SR variants' edits of a kernel
    template: an edit that no longer finds its text fails loudly instead of doing nothing)."""
    assert src.count(old) == 1, (old, src.count(old))
    return src.replace(old, new)


def mx_uncapped_bound(max_elem, emax):
    """One above the float32 bits of max_elem * 2^(127 - emax): an MX block whose amax bits are
    below it has |x| / 2^k <= max_elem under "rceil" (reference scales.mx_top_code)."""
    return int(np.float32(float(max_elem) * 2.0 ** (127 - int(emax))).view(np.uint32)) + 1


def _consts(kind, mode, fmt, mx_cfg, max_elem, packed):
    nb = fmt[5] if packed else 8
    cvt = fp8_cvt_available() and fp8_cvt_supports(fmt)
    return vec_of(kind), nb, cvt, F32(max_elem), mx_cfg[0], mx_cfg[1], mx_cfg[2], F32(mx_cfg[3])


def _jit_unrolled(name, template, ns, U, K=1):
    """Compile a kernel whose per-unit statements are written out: a line of ``template``
    holding ``{j}`` (and ``{jNT}`` = j * NT) is repeated for j = 0 .. U-1, one holding ``{k}``
    for k = 0 .. K-1 (j outer), so every unit lives in its own named register tuple (see the
    comment above load_unit)."""
    lines = []
    for ln in template.splitlines():
        js = range(U) if ("{j}" in ln or "{jNT}" in ln) else [None]
        ks = range(K) if "{k}" in ln else [None]
        for jj in js:
            for kk in ks:
                out = ln
                if jj is not None:
                    out = out.replace("{jNT}", str(jj * ns["NT"])).replace("{j}", str(jj))
                if kk is not None:
                    out = out.replace("{k}", str(kk))
                lines.append(out)
    src = "\n".join(lines) + "\n"
    glb = dict(globals())
    glb.update(ns)
    exec(compile(src, f"<nqdq {name} U={U} K={K}>", "exec"), glb)
    fn = glb[name]
    fn.source = src
    return cuda.jit(fn)


# ----------------------------------------------------------------------------- small groups
_GROUPS_SRC = '''
def lastaxis_groups(x, nchunks, codes, scales, SENC_ARGS):
    tid = cuda.threadIdx.x
    scratch = cuda.shared.array(SCRATCH, int32)
    x32 = as_u32(x)  # 16-bit kinds: two elements per word
    c32 = as_u32(codes)
    c16 = as_u16(codes)
    aligned = (array_addr(x) & 15) == 0
    z = np.uint32(0)
    Z4 = (z, z, z, z)
    c0 = cuda.blockIdx.x * (NT * U) + tid
    if aligned:  # (two copies of the loads: a uniform branch instead of predicated element loads)
        w{j}_{k} = load_unit(x, x32, True, unit_of(c0 + {jNT}) + {k} * ST, c0 + {jNT} < nchunks, kind)
    else:
        w{j}_{k} = load_unit(x, x32, False, unit_of(c0 + {jNT}) + {k} * ST, c0 + {jNT} < nchunks, kind)
SENC
    s_dec = ONE / s_enc  # NVFP4's S_dec, once per thread (the pair path's block multiplier uses it)
    chunk_step(CHUNK_ARGS, c0 + {jNT}, nchunks, tid, scratch, codes, c16, c32, scales, s_enc, s_dec)
'''
# The grid's max of a one-launch kernel (``_grid``, decode sizes) by done bits instead of a
# barrier over the grid (_grid.wait_done): block b publishes its block max as item b; a block
# that waits long computes the missing blocks' maxima itself, from their units (HELP: source
# lines, at 16 spaces, that leave block g's block max in ``h``), so the wait ends however few
# of the grid's blocks are resident. VAR: the block max in, the grid max out.
_GRID_MAX_SRC = """    miss = cuda.shared.array(DONE_WORDS, int32)
    grid_max_publish(VAR, tid, sync)
    while not wait_done(tid, sync, gslot, miss):
        for g in range(cuda.gridDim.x):
            if missing(miss, g):
HELP
                grid_max_help(h, tid, sync, g)
                cuda.syncthreads()  # (block_max's ``red`` read by every thread before the next writes it)
    VAR = grid_max_read(tid, sync, gslot)
"""


def _grid_max_src(var, help_lines):
    return _GRID_MAX_SRC.replace("VAR", var).replace("HELP\n", help_lines)


# S_enc: read from the finalize kernel's output (``sparams``), or -- NVFP4 with
# ``senc_parts`` -- computed by every block from the tensor-amax kernel's per-block partials
# (``parts``, ``nparts`` of them: a few KiB, L2-resident), by the reference's formula
# (nvfp4_tensor_encode_scale of the max, as finalize does; the max of integers is exact in
# any order), block 0 writing the tensor scale 1 / S_enc that finalize wrote. The partial
# loads are issued after the units' loads, so their latency overlaps them.
# ``senc_grid`` -- NVFP4 at decode sizes, one kernel (``_grid``): the finite amax of the units
# the block holds, the grid's max, S_enc from it; block 0 writes the tensor scale
_SENC_FROM_SPARAMS = ("sparams", "    s_enc = sparams[0] if mode == MODE_NVFP4 else ONE")
_SENC_FROM_GRID = ("tscale, sync", '''    red = cuda.shared.array(NW, int32)
    gslot = cuda.shared.array(1, int32)
    pa = np.int32(0)
    pa = max(pa, unit_amax_finite(unit_elems(w{j}_{k}, kind), VEC))
    pa = block_max(pa, tid, scratch, red)
''' + _grid_max_src("pa", """\
                h = np.int32(0)
                cg = g * (NT * U) + tid
                for jj in range(U):
                    for kk in range(K):
                        if aligned:
                            wv = load_unit(x, x32, True, unit_of(cg + jj * NT) + kk * ST, cg + jj * NT < nchunks, kind)
                        else:
                            wv = load_unit(x, x32, False, unit_of(cg + jj * NT) + kk * ST, cg + jj * NT < nchunks, kind)
                        h = max(h, unit_amax_finite(unit_elems(wv, kind), VEC))
                h = block_max(h, tid, scratch, red)
""") + '''    s_enc = nvfp4_tensor_encode_scale(bits_f32(np.uint32(pa)))
    if cuda.blockIdx.x == 0 and tid == 0:
        tscale[0] = ONE / s_enc''')
_SENC_FROM_PARTS = ("parts, nparts, tscale", '''    red = cuda.shared.array(NW, int32)
    pa = np.int32(0)
    for i in range(tid, nparts, NT):
        pa = max(pa, np.int32(parts[i]))
    pa = block_max(pa, tid, scratch, red)
    s_enc = nvfp4_tensor_encode_scale(bits_f32(np.uint32(pa)))
    if cuda.blockIdx.x == 0 and tid == 0:
        tscale[0] = ONE / s_enc''')


def group_chunk_fns(kind, mode, fmt, mx_cfg, max_elem, L, K, packed, shfl):
    """The per-chunk functions of ``lastaxis_groups`` (see make_lastaxis_group_kernel):
    ``chunk_step`` / ``chunk_step_sr`` (a chunk of K units w0 .. w3: its group's amax over
    the group's L / K lanes, the group's scale, the encode and the stores), ``unit_of`` (a
    chunk's first unit), ``ST`` (units between a chunk's units), ``IG``, ``VEC``; shared
    with ``_tensor_resident``'s NVFP4 kernel. Not cached: each kernel factory (cached
    itself) builds its own."""
    VEC, NB, CVT, MAXE, MXR, MXM, MXE, MXI = _consts(kind, mode, fmt, mx_cfg, max_elem, packed)
    assert L & (L - 1) == 0 and 1 <= L <= 32 and L % K == 0 and K in (1, 2, 4)
    LL = L // K
    # MX e2m1 of bfloat16 input: amax and encode two elements per instruction (e2m1_unit_bf16);
    # "floor" / "even" scales can leave |x| / 2^k up to 8, which is clamped to 6 first
    # chunk c holds units unit_of(c) + k * ST, k < K: consecutive (ST = 1), or, for the fp8
    # formats (paired cvt) and integer elements under float scales
    # (int4_group: K = 4), interleaved over the group's lanes (ST = LL: lane l of a group holds its
    # units l, l + LL, ...), so that each load / store instruction of a warp still covers
    # whole contiguous pieces of LL units (coalesced as with K = 1)
    IG = mode == MODE_FLOAT and fmt[0] == 0  # integer elements, float scales
    ILV = K > 1 and (fp8_cvt_supports(fmt) or IG)
    ST = LL if ILV else 1

    @devfn
    def unit_of(c):
        if ILV:
            return (c // LL) * L + (c % LL)
        return c * K

    PAIRS = kind == KIND_BF16 and mode in (MODE_MX, MODE_NVFP4) and NB == 4 and is_e2m1(fmt)
    # MX fp6 of bfloat16 input: the pair encoder (fp6_pair_codes); a chunk of 4 units stores
    # its 24 code bytes (8-byte aligned: 24 * chunk) by three 8-byte stores
    FP6P = kind == KIND_BF16 and mode == MODE_MX and NB == 6 and is_fp6.py_func(fmt)
    F6 = fp6_pair_consts.py_func(fmt) if FP6P else (0, 0, 0, 0)
    CHUNK6 = FP6P and K == 4 and ST == 1
    CLAMP = MXR != MX_RCEIL
    # the unclamped pair encoders need |x| / 2^k <= max_elem, which "rceil" gives but for blocks
    # above max_elem * 2^(127 - emax), whose exponent is capped (reference mx_top_code): those
    # take encode_store_unit's clamped / saturating encoders
    PAIR_CLEAN = FINITE if CLAMP or mode != MODE_MX else mx_uncapped_bound(MAXE, MXE)
    CVT_E4M3 = fp8_cvt_available()  # NVFP4's ue4m3 block code by the cvt instruction (sm_89+)

    @devfn
    def chunk_amax(w0, w1, w2, w3, tid, scratch):
        """The group amax of a chunk (units w0 .. w{K-1}) over the group's LL lanes: the units'
        amax bits (bfloat16 halves two per instruction where the kernel's encoders take the
        words: word_amax16, the same bits as unit_amax), then the butterfly (every lane takes
        part, in range or not)."""
        if PAIRS or FP6P or (IG and kind == KIND_BF16):  # bfloat16 halves: the same amax bits, two per instruction
            a2 = word_amax16(w0)
            if K >= 2:
                a2 = u16x2_max(a2, word_amax16(w1))
            if K >= 4:
                a2 = u16x2_max(a2, u16x2_max(word_amax16(w2), word_amax16(w3)))
            a = np.int32(max(a2 & np.uint32(0xFFFF), a2 >> np.uint32(16)) << np.uint32(16))
        else:
            a = unit_amax(unit_elems(w0, kind), VEC)
            if K >= 2:
                a = max(a, unit_amax(unit_elems(w1, kind), VEC))
            if K >= 4:
                a = max(a, max(unit_amax(unit_elems(w2, kind), VEC), unit_amax(unit_elems(w3, kind), VEC)))
        off = LL >> 1
        while off > 0:
            a = xor_max(a, off, shfl, scratch, tid)
            off >>= 1
        return a

    @devfn
    def chunk_step(w0, w1, w2, w3, chunk, nchunks, tid, scratch, c8, c16, c32, scales, s_enc, s_dec):
        """One chunk (units w0 .. w{K-1}; the rest are unused zeros): amax, butterfly over
        the group's LL lanes, parameters, encode. Chunk by chunk, so that only one chunk's
        parameters are live at a time (registers, hence occupancy)."""
        a = chunk_amax(w0, w1, w2, w3, tid, scratch)
        if chunk < nchunks:
            u = unit_of(chunk)
            if PAIRS and mode == MODE_NVFP4 and a < FINITE:
                code, mb = nvfp4_block(a, s_enc, s_enc * NVFP4_INV6, s_dec, CVT_E4M3)
                if (tid & (LL - 1)) == 0:
                    scales[chunk // LL] = np.uint8(code)
                c32[np.uint64(u)] = e2m1_unit_nvfp4(w0, mb)
                if K >= 2:
                    c32[np.uint64(u + ST)] = e2m1_unit_nvfp4(w1, mb)
                if K >= 4:
                    c32[np.uint64(u + 2 * ST)] = e2m1_unit_nvfp4(w2, mb)
                    c32[np.uint64(u + 3 * ST)] = e2m1_unit_nvfp4(w3, mb)
                return
            sv, p0, pz = group_params(mode, a, ZERO, ZERO, MAXE, MXR, MXM, MXE, MXI, s_enc)
            if (tid & (LL - 1)) == 0:
                store_scale(scales, chunk // LL, mode, sv)
            clean = a < FINITE
            if FP6P and a < PAIR_CLEAN:
                hb = np.uint32(f32_bits(p0)) >> np.uint32(16)  # 2^-k as bfloat16 (exact: a normal power of two)
                p2 = np.uint32(hb | (hb << np.uint32(16)))
                l0, h0 = fp6_unit_bf16(w0, p2, F6, CLAMP)
                if CHUNK6:
                    l1, h1 = fp6_unit_bf16(w1, p2, F6, CLAMP)
                    l2, h2 = fp6_unit_bf16(w2, p2, F6, CLAMP)
                    l3, h3 = fp6_unit_bf16(w3, p2, F6, CLAMP)
                    store_fp6_chunk(c32, chunk, l0, h0, l1, h1, l2, h2, l3, h3)
                    return
                store_packed(l0, h0, u, c8, c16, c32, VEC, NB)
                if K >= 2:
                    l1, h1 = fp6_unit_bf16(w1, p2, F6, CLAMP)
                    store_packed(l1, h1, u + ST, c8, c16, c32, VEC, NB)
                if K >= 4:
                    l2, h2 = fp6_unit_bf16(w2, p2, F6, CLAMP)
                    store_packed(l2, h2, u + 2 * ST, c8, c16, c32, VEC, NB)
                    l3, h3 = fp6_unit_bf16(w3, p2, F6, CLAMP)
                    store_packed(l3, h3, u + 3 * ST, c8, c16, c32, VEC, NB)
                return
            if PAIRS and a < PAIR_CLEAN:
                hb = np.uint32(f32_bits(p0)) >> np.uint32(16)  # 2^-k as bfloat16 (exact: a normal power of two)
                p2 = np.uint32(hb | (hb << np.uint32(16)))
                c32[np.uint64(u)] = e2m1_unit_bf16(w0, p2, CLAMP)
                if K >= 2:
                    c32[np.uint64(u + ST)] = e2m1_unit_bf16(w1, p2, CLAMP)
                if K >= 4:
                    c32[np.uint64(u + 2 * ST)] = e2m1_unit_bf16(w2, p2, CLAMP)
                    c32[np.uint64(u + 3 * ST)] = e2m1_unit_bf16(w3, p2, CLAMP)
                return
            if IG:  # one reciprocal per chunk (encode_store_unit_r)
                rp = recip_guarded(p0)
                encode_store_unit_r(unit_elems(w0, kind), u, p0, rp, clean, c8, c16, c32, mode, fmt, CVT, VEC, NB)
                if K >= 2:
                    encode_store_unit_r(unit_elems(w1, kind), u + ST, p0, rp, clean, c8, c16, c32, mode, fmt, CVT, VEC,
                                        NB)
                if K >= 4:
                    encode_store_unit_r(unit_elems(w2, kind), u + 2 * ST, p0, rp, clean, c8, c16, c32, mode, fmt, CVT,
                                        VEC, NB)
                    encode_store_unit_r(unit_elems(w3, kind), u + 3 * ST, p0, rp, clean, c8, c16, c32, mode, fmt, CVT,
                                        VEC, NB)
                return
            encode_store_unit(unit_elems(w0, kind), u, p0, clean, c8, c16, c32, mode, fmt, CVT, VEC, NB)
            if K >= 2:
                encode_store_unit(unit_elems(w1, kind), u + ST, p0, clean, c8, c16, c32, mode, fmt, CVT, VEC, NB)
            if K >= 4:
                encode_store_unit(unit_elems(w2, kind), u + 2 * ST, p0, clean, c8, c16, c32, mode, fmt, CVT, VEC, NB)
                encode_store_unit(unit_elems(w3, kind), u + 3 * ST, p0, clean, c8, c16, c32, mode, fmt, CVT, VEC, NB)

    @devfn
    def chunk_step_sr(w0, w1, w2, w3, chunk, nchunks, tid, scratch, c8, c16, c32, scales, s_enc, s_dec, key_lo, key_hi):
        """chunk_step under stochastic rounding: the same amax and butterfly (chunk_amax), group
        parameters and scale (group_params: the reference's formula; a finite NVFP4 block by
        nvfp4_block's shortcut, which reproduces it), every unit by
        sr_store_unit_r."""
        a = chunk_amax(w0, w1, w2, w3, tid, scratch)
        if chunk < nchunks:
            u = unit_of(chunk)
            clean = a < FINITE
            if mode == MODE_NVFP4 and clean:  # nvfp4_block's shortcut, as chunk_step's
                code, p0 = nvfp4_block(a, s_enc, s_enc * NVFP4_INV6, s_dec, CVT_E4M3)
                if (tid & (LL - 1)) == 0:
                    scales[chunk // LL] = np.uint8(code)
            else:
                sv, p0, pz = group_params(mode, a, ZERO, ZERO, MAXE, MXR, MXM, MXE, MXI, s_enc)
                if (tid & (LL - 1)) == 0:
                    store_scale(scales, chunk // LL, mode, sv)
            rp = recip_guarded(p0) if mode == MODE_FLOAT else ZERO
            sr_store_unit_r(unit_elems(w0, kind), u, p0, rp, clean, key_lo, key_hi, c8, c16, c32, mode, fmt, VEC, NB)
            if K >= 2:
                sr_store_unit_r(unit_elems(w1, kind), u + ST, p0, rp, clean, key_lo, key_hi, c8, c16, c32, mode, fmt,
                                VEC, NB)
            if K >= 4:
                sr_store_unit_r(unit_elems(w2, kind), u + 2 * ST, p0, rp, clean, key_lo, key_hi, c8, c16, c32, mode,
                                fmt, VEC, NB)
                sr_store_unit_r(unit_elems(w3, kind), u + 3 * ST, p0, rp, clean, key_lo, key_hi, c8, c16, c32, mode,
                                fmt, VEC, NB)

    return dict(chunk_step=chunk_step, chunk_step_sr=chunk_step_sr, unit_of=unit_of, ST=ST, IG=IG, VEC=VEC)


@lru_cache(maxsize=None)
def make_lastaxis_group_kernel(kind, mode, fmt, mx_cfg, max_elem, L, K, NT, U, packed, shfl, senc_parts=False,
                               senc_grid=False, stoch=False):
    """Groups of L units (G = L * VEC elements, L a power of two <= 32) tiling a flat
    C-contiguous input whose rows hold a whole number of groups: group g covers units
    g*L .. g*L + L - 1 and owns scales[g]. A thread takes *chunks* of K consecutive units
    (K divides L: one set of group parameters per chunk, not per unit), so a group is LL =
    L / K consecutive lanes of one warp, combined by a butterfly of log2(LL) steps. Block b
    owns chunks b*NT*U + j*NT + t (thread t, j < U); all U * K loads of a thread are issued
    before the first is used. ``senc_parts`` (NVFP4): the kernel takes (parts, nparts,
    tscale) instead of ``sparams`` and computes S_enc itself (see _SENC_FROM_PARTS);
    ``senc_grid`` (NVFP4): it takes (tscale, sync) and computes S_enc from the whole grid's
    units (_GRID_MAX_SRC: at most one block per SM, _SENC_FROM_GRID). ``stoch``: stochastic
    rounding (chunk_step_sr; the kernel takes key_lo, key_hi last)."""
    assert NT % 32 == 0
    assert not (senc_parts or senc_grid) or mode == MODE_NVFP4
    fns = group_chunk_fns(kind, mode, fmt, mx_cfg, max_elem, L, K, packed, shfl)
    chunk_step, chunk_step_sr, unit_of, ST, IG, VEC = (fns[k] for k in ("chunk_step", "chunk_step_sr", "unit_of", "ST", "IG",
                                                                         "VEC"))
    chunk_args = ", ".join("w{j}_%d" % k if k < K else "Z4" for k in range(4))
    ns = dict(NT=NT, U=U, K=K, SCRATCH=1 if shfl else NT, kind=kind, mode=mode,
              chunk_step=chunk_step, unit_of=unit_of, ST=ST, NW=NT // 32, block_max=_block_max_fn(NT, shfl))
    if senc_grid:
        ns.update(VEC=VEC)
    sargs, senc = _SENC_FROM_GRID if senc_grid else _SENC_FROM_PARTS if senc_parts else _SENC_FROM_SPARAMS
    src = _GROUPS_SRC.replace("CHUNK_ARGS", chunk_args).replace("SENC_ARGS", sargs).replace("SENC", senc)
    if stoch:
        ns["chunk_step"] = chunk_step_sr
        src = _sub(src, f"scales, {sargs}):", f"scales, {sargs}, key_lo, key_hi):")
        src = _sub(src, "scales, s_enc, s_dec)", "scales, s_enc, s_dec, key_lo, key_hi)")
    return _jit_unrolled("lastaxis_groups", src, ns, U, K)


# ----------------------------------------------------------------------------- whole rows
_ROWS_SRC = '''
def lastaxis_rows(x, upr, codes, scales, sparams):
    tid = cuda.threadIdx.x
    row = cuda.blockIdx.x
    scratch = cuda.shared.array(SCRATCH, int32)
    red = cuda.shared.array(NW, int32)
    x32 = as_u32(x)  # 16-bit kinds: two elements per word
    c32 = as_u32(codes)
    c16 = as_u16(codes)
    aligned = (array_addr(x) & 15) == 0
    base = row * upr + tid
    if aligned:  # (two copies of the loads: a uniform branch instead of predicated element loads)
        w{j} = load_unit(x, x32, True, base + {jNT}, {j} < U - 1 or tid + {jNT} < upr, kind)
    else:
        w{j} = load_unit(x, x32, False, base + {jNT}, {j} < U - 1 or tid + {jNT} < upr, kind)
    a = np.int32(0)
    a2 = np.uint32(0)
    a, a2 = amax_step(a, a2, w{j}, kind, VEC)
    a = amax_done(a, a2, kind)
    a = block_max(a, tid, scratch, red)
    s_enc = sparams[0] if mode == MODE_NVFP4 else ONE
    sv, p0, pz = group_params(mode, a, ZERO, ZERO, MAXE, MXR, MXM, MXE, MXI, s_enc)
    if tid == 0:
        store_scale(scales, row, mode, sv)
    clean = a < FINITE
    rp = recip_guarded(p0) if mode == MODE_FLOAT else ZERO
    if WHOLE and clean and rp != ZERO:  # (row-uniform: the units straight-line, no check each)
        if {j} < U - 1 or tid + {jNT} < upr: recip_store_unit(unit_elems(w{j}, kind), base + {jNT}, p0, rp, codes, c16, c32, fmt, CVT, VEC, NB)
    else:
        if tid + {jNT} < upr: encode_store_unit_r(unit_elems(w{j}, kind), base + {jNT}, p0, rp, clean, codes, c16, c32, mode, fmt, CVT, VEC, NB)
'''


def _block_max_fn(NT, shfl):
    NW = NT // 32

    @devfn
    def block_max(a, tid, scratch, red):
        """The max of ``a`` over the block: butterfly in each warp, one shared slot per warp."""
        off = 16
        while off > 0:
            a = xor_max(a, off, shfl, scratch, tid)
            off >>= 1
        if (tid & 31) == 0:
            red[tid >> 5] = a
        cuda.syncthreads()
        for k in range(NW):
            a = max(a, red[k])
        return a

    return block_max


@lru_cache(maxsize=None)
def make_lastaxis_row_kernel(kind, mode, fmt, mx_cfg, max_elem, NT, U, packed, shfl, stoch=False, whole=True):
    """One scale per row of a C-contiguous (rows, upr units) input, one block per row: thread
    t holds the row's units t, t + NT, ... (U of them) in registers from the load to the
    encode; the row's amax is combined by warps (butterfly) and across warps (one shared slot
    each, one barrier). The launch must have U = ceil(upr / NT), so that NT * (U - 1) < upr
    <= NT * U: units 0 .. U - 2 of every thread are inside the row, and only the last one is
    checked. ``whole``: where the row is finite and its scale has a reciprocal (row-uniform),
    the units go to the reciprocal encoder as one straight-line block, with no per-unit check
    (ptxas interleaves them); else each unit through encode_store_unit_r. ``stoch``:
    stochastic rounding (_ROWS_SR_ENCODE; the kernel takes key_lo, key_hi last)."""
    VEC, NB, CVT, MAXE, MXR, MXM, MXE, MXI = _consts(kind, mode, fmt, mx_cfg, max_elem, packed)
    assert NT % 32 == 0
    ns = dict(NT=NT, U=U, NW=NT // 32, SCRATCH=1 if shfl else NT, kind=kind,
              mode=mode, fmt=fmt, VEC=VEC, NB=NB, CVT=CVT, MAXE=MAXE, MXR=MXR, MXM=MXM, MXE=MXE, MXI=MXI,
              WHOLE=whole and RECIP_DIV and mode == MODE_FLOAT, block_max=_block_max_fn(NT, shfl))
    src = _ROWS_SRC
    if stoch:
        src = _sub(src, "scales, sparams):", "scales, sparams, key_lo, key_hi):")
        src = _sub(src, _ROWS_RNE_ENCODE, _ROWS_SR_ENCODE)
    return _jit_unrolled("lastaxis_rows", src, ns, U)


# the row kernel's encode (its last two lines), and its stochastic-rounding replacement
_ROWS_RNE_ENCODE = _ROWS_SRC[_ROWS_SRC.index("    rp = recip_guarded(p0)"):]
_ROWS_SR_ENCODE = ("    rp = recip_guarded(p0) if mode == MODE_FLOAT else ZERO\n"
                   "    if tid + {jNT} < upr: sr_store_unit_r(unit_elems(w{j}, kind), base + {jNT}, p0, rp, clean, "
                   "key_lo, key_hi, codes, c16, c32, mode, fmt, VEC, NB)\n")


# ----------------------------------------------------------------------------- tensor amax
_TENSOR_SRC = '''
def tensor_amax(x, nunits, part_i, part_a, part_b):
    tid = cuda.threadIdx.x
    scratch = cuda.shared.array(SCRATCH, int32)
    red = cuda.shared.array(NW, int32)
    x32 = as_u32(x)
    aligned = (array_addr(x) & 15) == 0
    a = np.int32(0)
    for ub in range(cuda.blockIdx.x * (NT * U), nunits, cuda.gridDim.x * (NT * U)):
        u0 = ub + tid
        w{j} = load_unit(x, x32, aligned, u0 + {jNT}, u0 + {jNT} < nunits, kind)
        a = max(a, amax_of(unit_elems(w{j}, kind), VEC))
    a = block_max(a, tid, scratch, red)
    if tid == 0:
        b = cuda.blockIdx.x
        part_i[b] = a
        part_a[b] = ZERO
        part_b[b] = ZERO
'''


@lru_cache(maxsize=None)
def make_tensor_amax_kernel(kind, NT, U, shfl, finite=True):
    """The first pass of NVFP4 (``finite``: amax over the finite elements) and of dynamic
    per-tensor float scales (``finite=False``: NaN and inf count, as tensor_partials'
    MODE_FLOAT): per-block amax of a flat input of ``nunits`` whole units (grid-stride, U
    loads in flight per thread), written as finalize's partials (part_i = amax bits;
    part_a = part_b = 0, which finalize's NVFP4 and float branches do not use)."""
    assert NT % 32 == 0
    ns = dict(NT=NT, U=U, NW=NT // 32, SCRATCH=1 if shfl else NT, kind=kind,
              VEC=vec_of(kind), block_max=_block_max_fn(NT, shfl), amax_of=unit_amax_finite if finite else unit_amax)
    return _jit_unrolled("tensor_amax", _TENSOR_SRC, ns, U)


# ----------------------------------------------------------------------------- asymmetric / centred
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
def enc_int(xb, p0, p1, pz, flo, fhi, clean, mode, fmt, mask, r, rd):
    """An asymmetric / centred element's code. Finite groups (s finite and non-zero, x -
    mean finite: no NaN can arise) by int_code_finite: asym clip(rint(x / s) + zp, 0, qmax)
    = rint(clip(x / s, -zp, qmax - zp)) + zp (integer bounds commute with rint); centred
    rint(clip((x - mean) / s)). Otherwise encode_element, every NaN rule included. ``flo``,
    ``fhi``: asym's bounds -zp, qmax - zp as float32. ``clean`` and ``rd`` (divide by the
    reciprocal r of s: _division; |x| <= max(hi, -lo) <= hi - lo = s * qmax, |x - mean| <=
    s * 127 up to rounding, so no overflow) are compile-time branches where the caller
    passes constants (encode_store_int_unit_r does)."""
    x = bits_f32(xb)
    if clean:
        if mode == MODE_ASYM:
            v = div_by_recip(x, p0, r) if rd else x / p0
            q = np.int32(int_code_finite_f(v, flo, fhi)) + pz
        else:
            c = x - p1
            v = div_by_recip(c, p0, r) if rd else c / p0
            q = np.int32(int_code_finite(v, fmt[6], fmt[7]))
        return np.uint32(np.uint32(q) & np.uint32(mask))
    return np.uint32(encode_element(x, p0, p1, pz, mode, fmt, False, 0, False) & mask)


@devfn
def int_unit_codes(e, p0, p1, pz, flo, fhi, clean, mode, fmt, vec, m, nb, r, rd):
    """(lo, hi): the unit's codes packed by fours (see store_packed)."""
    lo = pack4(enc_int(e[0], p0, p1, pz, flo, fhi, clean, mode, fmt, m, r, rd),
               enc_int(e[1], p0, p1, pz, flo, fhi, clean, mode, fmt, m, r, rd),
               enc_int(e[2], p0, p1, pz, flo, fhi, clean, mode, fmt, m, r, rd),
               enc_int(e[3], p0, p1, pz, flo, fhi, clean, mode, fmt, m, r, rd), nb)
    hi = np.uint32(0)
    if vec == 8:
        hi = pack4(enc_int(e[4], p0, p1, pz, flo, fhi, clean, mode, fmt, m, r, rd),
                   enc_int(e[5], p0, p1, pz, flo, fhi, clean, mode, fmt, m, r, rd),
                   enc_int(e[6], p0, p1, pz, flo, fhi, clean, mode, fmt, m, r, rd),
                   enc_int(e[7], p0, p1, pz, flo, fhi, clean, mode, fmt, m, r, rd), nb)
    return lo, hi


@devfn
def encode_store_int_unit_r(e, unit, p0, p1, pz, flo, fhi, r, clean, c8, c16, c32, mode, fmt, vec, nb):
    """Encode and store an integer unit: one branch per unit on ``clean``, each side with its
    eight element encodes in a straight line (a branch per element kept each division in its
    own basic block, where the next one could not overlap it). The per-scale values come from
    the caller, so that one whose units sit in separate blocks computes them once: the bounds
    ``flo`` = -pz, ``fhi`` = qmax - pz as float32 and r = recip_guarded(p0) (ZERO without
    RECIP_DIV)."""
    m = (1 << nb) - 1
    if clean and r != ZERO:
        lo, hi = int_unit_codes(e, p0, p1, pz, flo, fhi, True, mode, fmt, vec, m, nb, r, True)
    elif clean and not RECIP_DIV:  # (with RECIP_DIV a scale outside recip_guarded's range: per element)
        lo, hi = int_unit_codes(e, p0, p1, pz, flo, fhi, True, mode, fmt, vec, m, nb, r, False)
    else:
        lo, hi = int_unit_codes(e, p0, p1, pz, flo, fhi, False, mode, fmt, vec, m, nb, r, False)
    store_packed(lo, hi, unit, c8, c16, c32, vec, nb)


@devfn
def xor_add(v, off, shfl, scratch, tid):
    """v + (v of lane tid ^ off), float32: one butterfly step of a sum. IEEE addition is
    commutative, so both lanes of a pair hold the same sum. The twin passes the bits through
    the int32 scratch."""
    if shfl:
        return v + cuda.shfl_xor_sync(0xFFFFFFFF, v, off)
    cuda.syncthreads()
    scratch[tid] = np.int32(f32_bits(v))
    cuda.syncthreads()
    return v + bits_f32(np.uint32(scratch[tid ^ off]))


@devfn
def xor_get(v, off, shfl, scratch, tid):
    """float32 v of lane tid ^ off (``shfl.sync.bfly``; the twin through the int32 scratch)."""
    if shfl:
        return cuda.shfl_xor_sync(0xFFFFFFFF, v, off)
    cuda.syncthreads()
    scratch[tid] = np.int32(f32_bits(v))
    cuda.syncthreads()
    return bits_f32(np.uint32(scratch[tid ^ off]))


_ASYM_ROWS_SRC = """
def lastaxis_asym_rows(x, upr, codes, scales, zps, means):
    tid = cuda.threadIdx.x
    row = cuda.blockIdx.x
    scratch = cuda.shared.array(SCRATCH, int32)
    red = cuda.shared.array(NW, int32)
    red2 = cuda.shared.array(NW, int32)
    x32 = as_u32(x)
    c32 = as_u32(codes)
    c16 = as_u16(codes)
    aligned = (array_addr(x) & 15) == 0
    base = row * upr + tid
    w{j} = load_unit(x, x32, aligned, base + {jNT}, tid + {jNT} < upr, kind)
    khi = np.int32(0)
    nklo = np.int32(-1)
    h{j}, l{j} = unit_keys(unit_elems(w{j}, kind), VEC)
    khi = max(khi, h{j})
    nklo = max(nklo, l{j})
    khi = block_max(khi, tid, scratch, red)
    nklo = block_max(nklo, tid, scratch, red2)
    sv, pz, clean = asym_group(khi, nklo, MAXE)
    if tid == 0:
        scales[row] = sv
        zps[row] = pz
    if tid + {jNT} < upr: STORE_INT_UNIT
"""
# The row's reciprocal and float bounds once per thread (asym_unit_store_r), not once per
# unit (each unit's encode sits in its own `if` block, so NVVM would compute recip_guarded, a
# div.rn, and two int -> float conversions U times per thread), and the codes clipped as
# integers (asym_code_r). The same codes bit for bit. H100: int8_asym bf16 8192x8192 /
# 16384x7168 80 / 81 -> 89 / 90 % of copy with the reciprocal once, 96 / 99 % with the
# integer clip at the current row geometry (docs/design/last-axis.md).
_ASYM_STORE_CLIP = ("asym_unit_store_r(unit_elems(w{j}, kind), base + {jNT}, sv, rr, pz, flo, fhi, clean, codes, c16, c32, "
                    "fmt, VEC, NB)")
_ASYM_STORE_SR = ("sr_store_unit(unit_elems(w{j}, kind), base + {jNT}, sv, ZERO, pz, key_lo, key_hi, codes, c16, c32, "
                  "mode, fmt, VEC, NB)")
_ASYM_ONCE_LINES = """    flo = F32(-pz)
    fhi = F32(np.int32(fmt[7]) - pz)
    rr = recip_guarded(sv) if RECIP_DIV else ZERO
"""


@lru_cache(maxsize=None)
def make_lastaxis_asym_row_kernel(kind, fmt, max_elem, NT, U, packed, shfl, stoch=False):
    """Asymmetric integers, one scale and zero point per row: make_lastaxis_row_kernel's
    layout with a (max, min) statistic (two block reductions). ``stoch``: stochastic rounding
    (sr_store_unit with the row's scale and zero point; the kernel takes key_lo, key_hi last)."""
    VEC, NB = vec_of(kind), (fmt[5] if packed else 8)
    assert NT % 32 == 0
    ns = dict(NT=NT, U=U, NW=NT // 32, SCRATCH=1 if shfl else NT, kind=kind,
              mode=MODE_ASYM, fmt=fmt, VEC=VEC, NB=NB, MAXE=F32(max_elem), block_max=_block_max_fn(NT, shfl))
    if stoch:
        src = _sub(_ASYM_ROWS_SRC, "zps, means):", "zps, means, key_lo, key_hi):")
        src = _sub(src, "STORE_INT_UNIT", _ASYM_STORE_SR)
    else:
        src = _ASYM_ROWS_SRC.replace("    if tid + {jNT} < upr: STORE_INT_UNIT",
                                     _ASYM_ONCE_LINES + "    if tid + {jNT} < upr: " + _ASYM_STORE_CLIP)
    return _jit_unrolled("lastaxis_asym_rows", src, ns, U)


# lastaxis_stat_groups (int4_asym, int8_centred, every 1xG asymmetric or centred group of 2^k
# units), as the float-scale groups and the asymmetric rows: (1) a chunk's K units interleaved
# over the group's LL lanes (lane l of a group holds its units l, l + LL, ...: unit_of, ST =
# LL), so that each load / store instruction of a warp covers whole contiguous pieces. (2) The
# group's reciprocal (and the asymmetric float bounds) once per chunk, not once per unit: the
# units' encodes sit in separate basic blocks, so NVVM does not share them. (3) Asymmetric
# codes clipped as integers (asym_code_r: clip(rint(x / s) + zp, 0, qmax), the reference's
# formula, by one add-and-min instead of two float compare-and-selects). (4) Asymmetric
# statistics in fewer instructions: bfloat16 min / max two elements per instruction (min /
# max.bf16x2; a NaN, which those skip, found by the |x| max of word_amax16 and made the group's
# max), other 16-bit input's keys in pairs (word_ukeys), a lane's (max key, 0xFFFF - min key)
# packed in one word for the butterfly, the zero point's -xmin / s by the encode's reciprocal
# (asym_group_r). (5) Centred: with the units interleaved, the halving sum's top levels (the
# unit bits, above the lane bits) are additions inside the thread, so fewer shuffles. The same
# codes, scales, zero points and means bit for bit. H100, bf16 8192x8192 / 16384x7168, % of
# copy: int4_asym 68 / 69 -> 90 / 92, int8_centred 84 / 84 -> 92 / 93 (docs/design/last-axis.md).
_STAT_GROUPS_SRC = """
def lastaxis_stat_groups(x, nchunks, codes, scales, zps, means):
    tid = cuda.threadIdx.x
    scratch = cuda.shared.array(SCRATCH, int32)
    x32 = as_u32(x)
    c32 = as_u32(codes)
    c16 = as_u16(codes)
    aligned = (array_addr(x) & 15) == 0
    z = np.uint32(0)
    Z4 = (z, z, z, z)
    c0 = cuda.blockIdx.x * (NT * U) + tid
    w{j}_{k} = load_unit(x, x32, aligned, unit_of(c0 + {jNT}) + {k} * ST, c0 + {jNT} < nchunks, kind)
    chunk_step(CHUNK_ARGS, c0 + {jNT}, nchunks, tid, scratch, codes, c16, c32, scales, zps, means)
"""


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
    reciprocal r (recip_guarded(s) != 0: s normal, >= 2^-80), x / s by r (_division); ``pzm`` =
    zp - RINT_MAGIC_BITS. The group's range includes 0 (xmin <= 0 <= xmax) and s = RN(RN(xmax -
    xmin) / qmax) (or the halves' formula where xmax - xmin overflows), so s >= (-xmin / qmax)(1 -
    2^-24) and |x / s| <= qmax (1 + 2^-23) < 2^22: the magic-constant rint (int_code_finite) is
    exact before any clip. Only the upper clip can bind: RN(-xmin / s) <= qmax (1 + 2^-23)
    rounds to at most qmax (the float spacing there is far coarser), so zp = rint(-xmin / s)
    unclipped, and x >= xmin gives rint(x / s) >= -zp (RN and rint are monotone and odd; a
    quotient below _division's small-x bounds has |q| < 2^-20 and rints to 0), i.e. the sum
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
    r = recip_guarded(s) if RECIP_DIV else ZERO
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
        r = recip_guarded(s) if RECIP_DIV else ZERO
    return s, np.int32(zf), finite, r


# The centred chunk step, generated for the chunk's W = K * VEC elements (one named
# register each). A group of G = P elements (a power of two) is LL lanes of W elements.
# reference halving_sum's levels h = P/2 .. 1 add element i and i + h. Units consecutive
# in a lane (the old layout): the levels P/2 .. W add the same position of lanes l and
# l ^ (h / W): per position, a butterfly over the lanes (offsets LL/2 .. 1, in that order).
# Done as a reduce-scatter: at each such level the two lanes of a pair split the positions
# they hold (on the next position bit), each sending the half it gives up and adding the
# partner's copy of the half it keeps -- the same sums, one shuffle per pair of positions
# instead of one per position. When a lane is down to one position the remaining lane
# levels are plain butterflies. Then the levels between positions a lane still holds are
# added in the thread, and the last ones (positions split across lanes) are butterflies
# again (position bit t <-> lane offset LL >> (t + 1)). Units interleaved (lane l holds
# units l + k * LL): the top log2(K) levels pair unit k with unit k + K/2^i of
# the same lane, additions in the thread (FOLD), which leaves VEC positions per lane for the
# lane levels as above.
_CENTRED_STEP_SRC = """
def centred_step(w0, w1, w2, w3, chunk, nchunks, tid, scratch, c8, c16, c32, scales, zps, means):
    e0 = unit_elems(w0, kind)
    e1 = unit_elems(w1, kind)
    e2 = unit_elems(w2, kind)
    e3 = unit_elems(w3, kind)
LEAVES
CROSS
LOCAL
    mean = mul_rn(v0, FACTOR)
    a = np.int32(0)
AMAX
    off = LL >> 1
    while off > 0:
        a = xor_max(a, off, shfl, scratch, tid)
        off >>= 1
    if chunk < nchunks:
        s, mean = centred_params(mean, bits_f32(np.uint32(a)), MAXE)
        if (tid & (LL - 1)) == 0:
            scales[chunk // LL] = s
            means[chunk // LL] = mean
        clean = a < FINITE
ENCODE
"""
_CENTRED_ENCODE_ONCE = """        u = unit_of(chunk)
        rr = recip_guarded(s) if RECIP_DIV else ZERO
        encode_store_int_unit_r(e0, u, s, mean, 0, ZERO, ZERO, rr, clean, c8, c16, c32, mode, fmt, VEC, NB)
        if K >= 2:
            encode_store_int_unit_r(e1, u + ST, s, mean, 0, ZERO, ZERO, rr, clean, c8, c16, c32, mode, fmt, VEC, NB)
        if K >= 4:
            encode_store_int_unit_r(e2, u + 2 * ST, s, mean, 0, ZERO, ZERO, rr, clean, c8, c16, c32, mode, fmt, VEC, NB)
            encode_store_int_unit_r(e3, u + 3 * ST, s, mean, 0, ZERO, ZERO, rr, clean, c8, c16, c32, mode, fmt, VEC, NB)"""

# the centred encode under stochastic rounding
_CENTRED_ENCODE_SR = """        u = unit_of(chunk)
        sr_store_unit(e0, u, s, mean, 0, key_lo, key_hi, c8, c16, c32, mode, fmt, VEC, NB)
        if K >= 2:
            sr_store_unit(e1, u + ST, s, mean, 0, key_lo, key_hi, c8, c16, c32, mode, fmt, VEC, NB)
        if K >= 4:
            sr_store_unit(e2, u + 2 * ST, s, mean, 0, key_lo, key_hi, c8, c16, c32, mode, fmt, VEC, NB)
            sr_store_unit(e3, u + 3 * ST, s, mean, 0, key_lo, key_hi, c8, c16, c32, mode, fmt, VEC, NB)"""


def _lane_levels_src(W, LL, ind):
    """(cross, local) statement lines of the halving sum's lane levels and the position
    levels after them, for slots v0 .. v{W-1} holding W consecutive positions of each of LL
    lanes (see the comment above _CENTRED_STEP_SRC); the total ends in v0 of every lane."""
    cross = []
    slots = [f"v{i}" for i in range(W)]  # slot k: position lanebits + (k << S)
    S = 0  # position bits split over lanes so far
    off = LL >> 1
    while off > 0:  # lane levels, LL/2 .. 1
        if len(slots) > 1:
            cross.append(f"{ind}b{S} = (tid & {off}) != 0")
            new = []
            for m in range(len(slots) // 2):
                ev, od = slots[2 * m], slots[2 * m + 1]
                cross.append(f"{ind}r{S}_{m} = xor_get({ev} if b{S} else {od}, {off}, shfl, scratch, tid)")
                cross.append(f"{ind}{ev} = ({od} if b{S} else {ev}) + r{S}_{m}")
                new.append(ev)
            slots = new
            S += 1
        else:
            cross.append(f"{ind}{slots[0]} = xor_add({slots[0]}, {off}, shfl, scratch, tid)")
        off >>= 1
    local = []
    h = W >> 1
    while h > 0:  # position levels W/2 .. 1
        if h >= (1 << S):  # both positions in this lane: slots k and k + h / 2^S
            d = h >> S
            local += [f"{ind}{slots[k]} = {slots[k]} + {slots[k + d]}" for k in range(d)]
        else:  # position bit t = log2(h) was split over lanes at lane offset LL >> (t + 1)
            t = h.bit_length() - 1
            local.append(f"{ind}{slots[0]} = xor_add({slots[0]}, {LL >> (t + 1)}, shfl, scratch, tid)")
        h >>= 1
    assert slots[0] == "v0"
    return cross, local


def _centred_step_src(K, VEC, LL):
    W = K * VEC
    ind = "    "
    leaves = [f"{ind}v{i} = mul_rn(bits_f32(e{i // VEC}[{i % VEC}]), INV_P)" for i in range(W)]
    hk = K >> 1  # unit levels in the thread: v(k VEC + e) += v((k + hk) VEC + e), hk = K/2 .. 1
    while hk > 0:
        leaves += [f"{ind}v{k * VEC + e} = v{k * VEC + e} + v{(k + hk) * VEC + e}" for k in range(hk) for e in range(VEC)]
        hk >>= 1
    cross, local = _lane_levels_src(VEC, LL, ind)
    amax = [f"{ind}a = max(a, abs_i32(f32_bits(bits_f32(e{i // VEC}[{i % VEC}]) - mean)))" for i in range(W)]
    return (_CENTRED_STEP_SRC.replace("LEAVES", "\n".join(leaves)).replace("CROSS", "\n".join(cross) or f"{ind}pass")
            .replace("LOCAL", "\n".join(local) or f"{ind}pass").replace("AMAX", "\n".join(amax))
            .replace("ENCODE", _CENTRED_ENCODE_ONCE))


@lru_cache(maxsize=None)
def make_lastaxis_stat_group_kernel(kind, mode, fmt, max_elem, L, K, NT, U, packed, shfl, stoch=False):
    """Asymmetric (MODE_ASYM) or centred (MODE_CENTRED) groups of L units along the last
    axis: make_lastaxis_group_kernel's layout (chunks of K units, LL = L / K lanes per group,
    U chunks per thread), with the group's (max, min) or halving sum and centred amax; units
    interleaved over the group's lanes (see the comment above _STAT_GROUPS_SRC). ``stoch``:
    stochastic rounding (the same statistics and parameters, every unit by sr_store_unit; the
    kernel takes key_lo, key_hi last)."""
    VEC, NB = vec_of(kind), (fmt[5] if packed else 8)
    assert L & (L - 1) == 0 and 1 <= L <= 32 and NT % 32 == 0 and L % K == 0 and K in (1, 2, 4)
    assert mode in (MODE_ASYM, MODE_CENTRED)
    LL = L // K
    MAXE = F32(max_elem)
    ST = LL
    PK = kind != KIND_F32  # 16-bit elements: keys in pairs

    @devfn
    def unit_of(c):
        """First unit of chunk c (its others: + k * ST); c >= 0: (c // LL) * L + c % LL,
        without a signed division."""
        return c * K - (c & (LL - 1)) * (K - 1)

    @devfn
    def chunk_ukeys(w0, w1, w2, w3):
        """The 16-bit (max, min) key pairs over a chunk's units w0 .. w{K-1} (unit_ukeys: two
        elements per instruction), for chunk_keys and the packed-stats step."""
        hi2, lo2 = unit_ukeys(w0)
        if K >= 2:
            h1, l1 = unit_ukeys(w1)
            hi2 = u16x2_max(hi2, h1)
            lo2 = u16x2_min(lo2, l1)
        if K >= 4:
            h2, l2 = unit_ukeys(w2)
            h3, l3 = unit_ukeys(w3)
            hi2 = u16x2_max(hi2, u16x2_max(h2, h3))
            lo2 = u16x2_min(lo2, u16x2_min(l2, l3))
        return hi2, lo2

    @devfn
    def chunk_keys(w0, w1, w2, w3, tid, scratch):
        """(max key, ~min key) of an asymmetric chunk's group (units w0 .. w{K-1}) over its LL
        lanes: the units' order-preserving keys (16-bit elements two per instruction where PK:
        unit_ukeys, the same keys as unit_keys), then a butterfly of each (every lane takes part)."""
        if PK:
            hi2, lo2 = chunk_ukeys(w0, w1, w2, w3)
            khi = key(ukey_bits(max(hi2 & np.uint32(0xFFFF), hi2 >> np.uint32(16)), kind))
            nklo = np.int32(~key(ukey_bits(min(lo2 & np.uint32(0xFFFF), lo2 >> np.uint32(16)), kind)))
        else:
            khi, nklo = unit_keys(unit_elems(w0, kind), VEC)
            if K >= 2:
                h1, l1 = unit_keys(unit_elems(w1, kind), VEC)
                khi = max(khi, h1)
                nklo = max(nklo, l1)
            if K >= 4:
                h2, l2 = unit_keys(unit_elems(w2, kind), VEC)
                h3, l3 = unit_keys(unit_elems(w3, kind), VEC)
                khi = max(khi, max(h2, h3))
                nklo = max(nklo, max(l2, l3))
        off = LL >> 1
        while off > 0:
            khi = xor_max(khi, off, shfl, scratch, tid)
            nklo = xor_max(nklo, off, shfl, scratch, tid)
            off >>= 1
        return khi, nklo

    @devfn
    def chunk_asym_group(khi, nklo, chunk, tid, scales, zps):
        """asym_group's (scale, zero point, clean) of a chunk's group from its keys; the group's
        first lane stores the scale and zero point."""
        sv, pz, clean = asym_group(khi, nklo, MAXE)
        if (tid & (LL - 1)) == 0:
            scales[chunk // LL] = sv
            zps[chunk // LL] = pz
        return sv, pz, clean

    if mode == MODE_ASYM:

        @devfn
        def chunk_step(w0, w1, w2, w3, chunk, nchunks, tid, scratch, c8, c16, c32, scales, zps, means):
            if PK:
                if kind == KIND_BF16:
                    mx2, mn2 = unit_bf16_minmax(w0)
                    a2 = word_amax16(w0)
                    if K >= 2:
                        x1, n1 = unit_bf16_minmax(w1)
                        mx2 = bf16x2_max(mx2, x1)
                        mn2 = bf16x2_min(mn2, n1)
                        a2 = u16x2_max(a2, word_amax16(w1))
                    if K >= 4:
                        x2, n2 = unit_bf16_minmax(w2)
                        x3, n3 = unit_bf16_minmax(w3)
                        mx2 = bf16x2_max(mx2, bf16x2_max(x2, x3))
                        mn2 = bf16x2_min(mn2, bf16x2_min(n2, n3))
                        a2 = u16x2_max(a2, u16x2_max(word_amax16(w2), word_amax16(w3)))
                    hi2 = word_ukeys(mx2)
                    lo2 = word_ukeys(mn2)
                    hk = max(hi2 & np.uint32(0xFFFF), hi2 >> np.uint32(16))
                    if max(a2 & np.uint32(0xFFFF), a2 >> np.uint32(16)) > np.uint32(0x7F80):
                        hk = np.uint32(0xFFFF)  # a NaN: the max key of a NaN (0x7FFF, sign 0)
                else:
                    hi2, lo2 = chunk_ukeys(w0, w1, w2, w3)
                    hk = max(hi2 & np.uint32(0xFFFF), hi2 >> np.uint32(16))
                lk = min(lo2 & np.uint32(0xFFFF), lo2 >> np.uint32(16))
                kw = np.uint32(hk | ((np.uint32(0xFFFF) - lk) << np.uint32(16)))  # both maxima in one word
                off = LL >> 1
                while off > 0:
                    kw = xor_u16x2_max(kw, off, shfl, scratch, tid)
                    off >>= 1
                if chunk < nchunks:
                    sv, pz, clean, rr = asym_group_r(ukey_bits(kw & np.uint32(0xFFFF), kind),
                                                     ukey_bits(np.uint32(0xFFFF) - (kw >> np.uint32(16)), kind), MAXE)
                    if (tid & (LL - 1)) == 0:
                        scales[chunk // LL] = sv
                        zps[chunk // LL] = pz
                    u = unit_of(chunk)
                    flo = F32(-pz)
                    fhi = F32(np.int32(fmt[7]) - pz)
                    asym_unit_store_r(unit_elems(w0, kind), u, sv, rr, pz, flo, fhi, clean, c8, c16, c32, fmt, VEC, NB)
                    if K >= 2:
                        asym_unit_store_r(unit_elems(w1, kind), u + ST, sv, rr, pz, flo, fhi, clean, c8, c16, c32, fmt,
                                          VEC, NB)
                    if K >= 4:
                        asym_unit_store_r(unit_elems(w2, kind), u + 2 * ST, sv, rr, pz, flo, fhi, clean, c8, c16, c32,
                                          fmt, VEC, NB)
                        asym_unit_store_r(unit_elems(w3, kind), u + 3 * ST, sv, rr, pz, flo, fhi, clean, c8, c16, c32,
                                          fmt, VEC, NB)
                return
            khi, nklo = chunk_keys(w0, w1, w2, w3, tid, scratch)
            if chunk < nchunks:
                sv, pz, clean = chunk_asym_group(khi, nklo, chunk, tid, scales, zps)
                u = unit_of(chunk)
                flo = F32(-pz)  # int -> float conversions and the reciprocal: once per chunk
                fhi = F32(np.int32(fmt[7]) - pz)
                rr = recip_guarded(sv) if RECIP_DIV else ZERO
                asym_unit_store_r(unit_elems(w0, kind), u, sv, rr, pz, flo, fhi, clean, c8, c16, c32, fmt, VEC, NB)
                if K >= 2:
                    asym_unit_store_r(unit_elems(w1, kind), u + ST, sv, rr, pz, flo, fhi, clean, c8, c16, c32, fmt, VEC,
                                      NB)
                if K >= 4:
                    asym_unit_store_r(unit_elems(w2, kind), u + 2 * ST, sv, rr, pz, flo, fhi, clean, c8, c16, c32, fmt,
                                      VEC, NB)
                    asym_unit_store_r(unit_elems(w3, kind), u + 3 * ST, sv, rr, pz, flo, fhi, clean, c8, c16, c32, fmt,
                                      VEC, NB)

    else:
        P = L * VEC  # a whole group: the halving sum's padding P is G itself
        glb = dict(globals())
        glb.update(kind=kind, mode=mode, fmt=fmt, VEC=VEC, NB=NB, K=K, LL=LL, MAXE=MAXE, shfl=shfl, ST=ST, unit_of=unit_of,
                   INV_P=F32(1.0 / P), FACTOR=F32(np.float32(P) / np.float32(P)))  # fp32(P) / fp32(count)
        src = _centred_step_src(K, VEC, LL)
        if stoch:  # the same mean, scale and layout; the encode by sr_store_unit
            src = _sub(src, "zps, means):", "zps, means, key_lo, key_hi):")
            src = _sub(src, _CENTRED_ENCODE_ONCE, _CENTRED_ENCODE_SR)
        exec(compile(src, f"<nqdq centred_step K={K} VEC={VEC} LL={LL}{' stoch' if stoch else ''}>",
                     "exec"), glb)
        chunk_step = devfn(glb["centred_step"])
        chunk_step.source = src

    if stoch and mode == MODE_ASYM:

        @devfn
        def chunk_step(w0, w1, w2, w3, chunk, nchunks, tid, scratch, c8, c16, c32, scales, zps, means, key_lo, key_hi):
            """The asymmetric chunk under stochastic rounding: the keys (chunk_keys: exact
            values, order-free), asym_group's scale and zero point (asym_params, the
            reference's), every unit by sr_store_unit."""
            khi, nklo = chunk_keys(w0, w1, w2, w3, tid, scratch)
            if chunk < nchunks:
                sv, pz, clean = chunk_asym_group(khi, nklo, chunk, tid, scales, zps)
                u = unit_of(chunk)
                sr_store_unit(unit_elems(w0, kind), u, sv, ZERO, pz, key_lo, key_hi, c8, c16, c32, mode, fmt, VEC, NB)
                if K >= 2:
                    sr_store_unit(unit_elems(w1, kind), u + ST, sv, ZERO, pz, key_lo, key_hi, c8, c16, c32, mode, fmt,
                                  VEC, NB)
                if K >= 4:
                    sr_store_unit(unit_elems(w2, kind), u + 2 * ST, sv, ZERO, pz, key_lo, key_hi, c8, c16, c32, mode,
                                  fmt, VEC, NB)
                    sr_store_unit(unit_elems(w3, kind), u + 3 * ST, sv, ZERO, pz, key_lo, key_hi, c8, c16, c32, mode,
                                  fmt, VEC, NB)

    chunk_args = ", ".join("w{j}_%d" % k if k < K else "Z4" for k in range(4))
    ns = dict(NT=NT, U=U, K=K, SCRATCH=1 if shfl else NT, kind=kind,
              chunk_step=chunk_step, unit_of=unit_of, ST=ST)
    src = _STAT_GROUPS_SRC.replace("CHUNK_ARGS", chunk_args)
    if stoch:
        src = _sub(src, "zps, means):", "zps, means, key_lo, key_hi):")
        src = _sub(src, "scales, zps, means)", "scales, zps, means, key_lo, key_hi)")
    return _jit_unrolled("lastaxis_stat_groups", src, ns, U, K)


# ----------------------------------------------------------------------------- static scales
# Caller-given float scales (``scale=``): nothing to reduce, one streaming pass. A unit is
# encoded by the finite-group encoders when no NaN can arise in x / s (s finite and non-zero,
# every element of the unit finite), else element by element by encode_element.
_STATIC_SRC = """
def static_encode(x, nunits, upr, codes, scales):
    tid = cuda.threadIdx.x
    x32 = as_u32(x)
    c32 = as_u32(codes)
    c16 = as_u16(codes)
    aligned = (array_addr(x) & 15) == 0
    u0 = cuda.blockIdx.x * (NT * U) + tid
    if aligned:  # (two copies of the loads: a uniform branch instead of predicated element loads)
        w{j} = load_unit(x, x32, True, u0 + {jNT}, u0 + {jNT} < nunits, kind)
    else:
        w{j} = load_unit(x, x32, False, u0 + {jNT}, u0 + {jNT} < nunits, kind)
    st = scales[0]
    rst = recip_guarded(st)
    if u0 + {jNT} < nunits: static_unit(unit_elems(w{j}, kind), u0 + {jNT}, upr, st, rst, scales, codes, c16, c32)
"""


# dynamic per-tensor scale in the same kernel (decode sizes; ``_grid``): the block's amax of
# the units it holds (NaN and inf count, as tensor_amax's MODE_FLOAT pass), the grid's max,
# finalize's scale (group_params), block 0 writing it
_STATIC_DYNAMIC = """    red = cuda.shared.array(NW, int32)
    gslot = cuda.shared.array(1, int32)
    scratch = cuda.shared.array(SCRATCH, int32)
    a = np.int32(0)
    a2 = np.uint32(0)
    a, a2 = amax_step(a, a2, w{j}, kind, VEC)
    a = amax_done(a, a2, kind)
    a = block_max(a, tid, scratch, red)
""" + _grid_max_src("a", """\
                h = np.int32(0)
                h2 = np.uint32(0)
                ug = g * (NT * U) + tid
                for jj in range(U):
                    if aligned:
                        wv = load_unit(x, x32, True, ug + jj * NT, ug + jj * NT < nunits, kind)
                    else:
                        wv = load_unit(x, x32, False, ug + jj * NT, ug + jj * NT < nunits, kind)
                    h, h2 = amax_step(h, h2, wv, kind, VEC)
                h = amax_done(h, h2, kind)
                h = block_max(h, tid, scratch, red)
""") + """    st, p0, pz = group_params(MODE_FLOAT, a, ZERO, ZERO, MAXE, 0, 0, 0, ONE, ONE)
    if cuda.blockIdx.x == 0 and tid == 0:
        scales[0] = st
"""


def static_unit_fns(fmt, VEC, NB, CVT, per_row):
    """(static_unit, static_unit_sr): encode and store unit ``u`` (elements ``e``) under the
    float scale ``st`` of the tensor (its guarded reciprocal ``rst``), or (``per_row``) under
    scales[u // upr]; by the reciprocal where the unit is finite and the scale allows, else
    element by element (``static_unit_sr``: stochastic rounding, keys last). Used by
    ``static_encode`` and ``_tensor_resident``; not cached (see group_chunk_fns)."""

    @devfn
    def static_unit(e, u, upr, st, rst, scales, c8, c16, c32):
        s = scales[u // upr] if per_row else st
        r = recip_guarded(s) if per_row else rst
        am = unit_amax(e, VEC)
        clean = am < FINITE and abs_i32(f32_bits(s)) < FINITE and s != ZERO
        if RECIP_DIV and r != ZERO and not ratio_ok(am, s):
            clean = False  # a caller-given scale far below |x| (all codes saturate): element by element
        encode_store_unit_r(e, u, s, r, clean, c8, c16, c32, MODE_FLOAT, fmt, CVT, VEC, NB)

    @devfn
    def static_unit_sr(e, u, upr, st, rst, scales, c8, c16, c32, key_lo, key_hi):
        """static_unit under stochastic rounding: encode_element's x / s per element (any scale)."""
        s = scales[u // upr] if per_row else st
        r = recip_guarded(s) if per_row else rst
        am = unit_amax(e, VEC)
        clean = am < FINITE and abs_i32(f32_bits(s)) < FINITE and s != ZERO and (r == ZERO or ratio_ok(am, s))
        sr_store_unit_r(e, u, s, r, clean, key_lo, key_hi, c8, c16, c32, MODE_FLOAT, fmt, VEC, NB)

    return static_unit, static_unit_sr


@lru_cache(maxsize=None)
def make_static_kernel(kind, fmt, NT, U, packed, per_row, dynamic_max_elem=None, shfl=True, stoch=False):
    """Static float scales of a flat C-contiguous input of ``nunits`` whole units: one
    scale for the tensor, or (``per_row``) scales[u // upr] for unit u, rows of ``upr``
    units. Block b owns units b*NT*U + j*NT + t, all U loads issued before any is used.
    ``dynamic_max_elem`` (one tensor scale): the kernel takes a ``sync`` workspace too and
    computes the scale itself, amax / max_elem as finalize does, over the whole grid
    (_GRID_MAX_SRC: at most one block per SM), and writes it to scales[0]. ``stoch``:
    stochastic rounding (static_unit_sr; the kernel takes key_lo, key_hi last)."""
    VEC, NB = vec_of(kind), (fmt[5] if packed else 8)
    DYN = dynamic_max_elem is not None
    assert not (DYN and per_row)
    CVT = fp8_cvt_available() and fp8_cvt_supports(fmt)
    assert NT % 32 == 0
    static_unit, static_unit_sr = static_unit_fns(fmt, VEC, NB, CVT, per_row)

    ns = dict(NT=NT, U=U, kind=kind, static_unit=static_unit)
    src = _STATIC_SRC
    if DYN:
        ns.update(NW=NT // 32, SCRATCH=1 if shfl else NT, VEC=VEC, MAXE=F32(dynamic_max_elem),
                  block_max=_block_max_fn(NT, shfl))
        src = src.replace("codes, scales):", "codes, scales, sync):").replace("    st = scales[0]\n", _STATIC_DYNAMIC)
    if stoch:
        ns["static_unit"] = static_unit_sr
        args = "codes, scales, sync" if DYN else "codes, scales"
        src = _sub(src, f"{args}):", f"{args}, key_lo, key_hi):")
        src = _sub(src, "scales, codes, c16, c32)", "scales, codes, c16, c32, key_lo, key_hi)")
    return _jit_unrolled("static_encode", src, ns, U)


_ = (float32, int32, uint32, ONE, array_addr, group_params, store_scale)  # used by the generated kernel sources
_ = (as_u16, as_u32)  # the generated kernels' word views
_ = (mul_rn, float_scale, centred_params, MODE_CENTRED)  # used by the generated centred step
_ = nvfp4_tensor_encode_scale  # used by the generated group kernel (_SENC_FROM_PARTS)
_ = (DONE_WORDS, grid_max_help, grid_max_publish, grid_max_read, missing, wait_done)  # the one-launch kernels' wait
