"""Encoders of finite MX and NVFP4 groups on bfloat16 pairs, two elements an instruction: MX
e2m1 (MXFP4) and fp6 (MXFP6) of bfloat16 input, of float32 element words rounded to odd into
bfloat16 first, and NVFP4's e2m1; each gives encode_element's codes (see the comments).
"""

from __future__ import annotations

import numpy as np

from ..device.codec import bits_f32, f32_bits
from ..ptx.memory import store_u32x2
from ..ptx.pairs import bf16x2_absmin, bf16x2_absmul, bf16x2_add, bf16x2_max, bf16x2_min, bf16x2_mul, prmt, u16x2_min
from ..runtime.target import devfn

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
