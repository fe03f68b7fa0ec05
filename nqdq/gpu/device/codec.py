"""Device twins of ``nqdq.reference.codec`` and ``nqdq.reference.rng``: element codecs by
bit manipulation, stochastic rounding and Philox4x32-10, written once for three targets
(real CUDA through NVVM, the CUDA simulator, AMD through numba-hip).

Rules every function here follows, because the reference is the spec:

* float arithmetic is float32 only: every constant is an ``np.float32`` module global (a
  Python float literal would promote the expression to float64);
* integer work is done on Python ints / int64 holding the float32 *bits* (read through a
  1-element local-array view, which NVVM lowers to a plain ``mov.b32``); the hot element
  encoders (``encode_float_rne``, ``encode_float_sr32``, ``encode_int_f32``) wrap each step in ``np.int32`` so
  that NVVM narrows Numba's int64 arithmetic to 32-bit instructions (the audit's ``i64``
  column counts what is left);
* nothing here uses warp shuffles, cooperative groups, fp16/bf16 Numba types or printf;
  libdevice (``mul_rn``, ``fadd_rz``) and inline PTX (``mul_wide_u32``,
  ``sign_add``, ``sr_e2m1_code_i``) only where ``runtime.target.PTX``: elsewhere (the simulator,
  AMD) each is its ``*_twin``, integer / float32 code that compiles as a device function.
"""

from __future__ import annotations

import math

import numpy as np
from numba import float32, uint32
from ..runtime.backend import cuda

# inline PTX on NVIDIA, twins elsewhere (sr_e2m1_code_i: for quantize.lastaxis)
from ..ptx.stochastic import mul_wide_u32, sign_add, sr_e2m1_code_i  # noqa: F401
from ..runtime.target import PTX, devfn

F32 = np.float32
ZERO = F32(0.0)
ONE = F32(1.0)
NAN = F32(np.nan)  # bits 0x7FC00000, the reference's np.nan
FLT_MAX = F32(np.finfo(np.float32).max)
TWO_M24 = F32(2.0**-24)
TWO_23 = F32(2.0**23)
TWO_112 = F32(2.0**112)  # float32's exponent bias less float16's: f16_top_to_f32_bits
TWO_16 = F32(2.0**16)  # float16's exponent 31 (inf, NaN) through that rebias: above its max 65504
U64_MASK32 = np.uint64(0xFFFFFFFF)
U64_32 = np.uint64(32)

# input kinds: how the input array's elements are read
KIND_F32 = 0  # float32 array
KIND_BF16 = 1  # uint16 array holding bfloat16 bits
KIND_F16 = 2  # uint16 array holding float16 bits


# ----------------------------------------------------------------------------- bit casts
@devfn
def f32_bits(f):
    """The 32 bits of float32 ``f`` as a non-negative int."""
    a = cuda.local.array(1, float32)
    a[0] = f
    return np.int64(a.view(np.uint32)[0])  # int64: Numba keeps int() of a uint32 unsigned


@devfn
def bits_f32(u):
    """The float32 whose bits are ``u`` (0 <= u < 2^32)."""
    a = cuda.local.array(1, uint32)
    a[0] = u
    return a.view(np.float32)[0]


@devfn
def is_nan_bits(u):
    return (u & 0x7FFFFFFF) > 0x7F800000


@devfn
def is_finite_f32(f):
    return (f32_bits(f) & 0x7F800000) != 0x7F800000


@devfn
def f16_top_to_f32_bits(t):
    """Exact float16 -> float32 on the bits, for the float16 in the top 16 bits of uint32
    ``t`` (its low 16 bits are ignored: the high element of an input word is passed as is),
    without a branch or a loop (one multiply, one compare and a select; no float16 type, so
    the same source builds for CUDA, the simulator and numba-hip).

    The sign, exponent and mantissa moved to float32's places (an arithmetic shift by 3
    keeps the sign at bit 31), read as float32, are the value times 2^-112 (float32's
    exponent bias 127 less float16's 15); one multiply by 2^112 restores it, exactly, for
    every finite float16: a normal one's exponent rises by 112; a subnormal one, m * 2^-24,
    is read as the float32 subnormal m * 2^-136 (IEEE gradual underflow, which float32 inputs
    already need: no ftz, as the PTX audit checks) and comes out normal. Zeros keep their
    sign. Exponent 31 (inf, NaN) comes out as 2^16 or more, above float16's max 65504: those
    take the moved bits with float32's all-ones exponent instead, keeping a NaN's payload as
    NumPy's float16 -> float32 cast does."""
    x = np.uint32(np.uint32(np.int32(t) >> np.int32(3)) & np.uint32(0x8FFFE000))
    f = bits_f32(x) * TWO_112
    b = np.uint32(f32_bits(f))
    if abs(f) >= TWO_16:  # a select (no branch): float16 inf or NaN
        b = np.uint32(x | np.uint32(0x7F800000))
    return b


@devfn
def f16_bits_to_f32_bits(h):
    """Exact float16 -> float32 on the bits (0 <= h < 2^16; subnormals normalised, NaN
    payload kept), as a uint32: f16_top_to_f32_bits of ``h << 16``."""
    return f16_top_to_f32_bits(np.uint32(np.uint32(h) << np.uint32(16)))


@devfn
def load_f32(x, i, kind):
    """Element ``i`` of the input as float32 (exact for every input kind)."""
    # an unsigned index: Numba then omits the negative-index wraparound (3 int64 ops)
    if kind == KIND_F32:
        return x[np.uint64(i)]
    h = np.int64(x[np.uint64(i)])
    if kind == KIND_BF16:
        return bits_f32(h << 16)
    return bits_f32(f16_bits_to_f32_bits(h))


# ----------------------------------------------------------------------------- float32 helpers
@devfn
def nanmax_f32(a, b):
    """max with NaN propagation (np.maximum / np.max)."""
    if a != a:
        return a
    if b != b:
        return b
    return a if a > b else b


@devfn
def nanmin_f32(a, b):
    """min with NaN propagation (np.minimum / np.min)."""
    if a != a:
        return a
    if b != b:
        return b
    return a if a < b else b


@devfn
def fmin_f32(a, b):
    """min ignoring NaN (np.fmin), as the NVFP4 element multiplier uses."""
    if a != a:
        return b
    if b != b:
        return a
    return a if a < b else b


@devfn
def rint_f32(v):
    """Round float32 to the nearest integer, ties to even (np.rint), for any finite v:
    below 2^23 adding and removing 2^23 rounds in the FPU's RNE mode; above it v is an
    integer already. (NVVM/ptxas never fold (v + c) - c without fast-math.)"""
    a = v if v >= ZERO else -v
    if a < TWO_23:
        a = (a + TWO_23) - TWO_23
        return a if v >= ZERO else -a
    return v


@devfn
def mul_rn_twin(a, b):
    return a * b


if not PTX:
    # (NVVM contracts a * b + c by default, hence libdevice on NVIDIA; LLVM's AMDGPU back end
    # fuses only where the IR allows contraction, which Numba's lowering does not ask for:
    # to be confirmed in the gfx9 assembly, docs/amd.md)
    mul_rn = mul_rn_twin
else:

    @devfn
    def mul_rn(a, b):
        """float32 product that NVVM/ptxas will not contract into an FMA with a following
        add (libdevice __nv_fmul_rn -> ``mul.rn.f32``). The reference rounds the product
        and the sum separately (centred INT8 dequantize: code * s + mean)."""
        return cuda.libdevice.fmul_rn(a, b)


# ----------------------------------------------------------------------------- Philox4x32-10
PHILOX_W0 = np.uint64(0x9E3779B9)
PHILOX_W1 = np.uint64(0xBB67AE85)
PHILOX_M0_32 = np.uint32(0xD2511F53)
PHILOX_M1_32 = np.uint32(0xCD9E8D57)


# Philox's products by mul_wide_u32: H100, bf16 8192x8192 under stochastic rounding, fp8_row
# 156.0 -> 145.8 us, mxfp8 146.1 -> 140.4 against libdevice umulhi and a 32-bit multiply (SASS
# of the fp8_row kernel 5096 -> 4688 instructions).
@devfn
def philox4x32_10(ctr_lo, ctr_hi, key_lo, key_hi):
    """Philox4x32-10 of counter (ctr_lo, ctr_hi, 0, 0) under key (key_lo, key_hi) (each
    < 2^32), as reference/rng.philox4x32_10; returns the 4 output words as ints.

    The counter words are uint32 and each product is a uint32 widened to uint64 times a
    32-bit constant, so NVVM emits one ``mul.wide.u32`` per multiply (one IMAD.WIDE.U32)
    and 32-bit xors (LOP3); the key schedule depends on the key only (uniform registers)."""
    c0 = np.uint32(ctr_lo)
    c1 = np.uint32(ctr_hi)
    c2 = np.uint32(0)
    c3 = np.uint32(0)
    k0 = np.uint64(np.uint32(key_lo))
    k1 = np.uint64(np.uint32(key_hi))
    for _ in range(10):
        p0 = mul_wide_u32(c0, PHILOX_M0_32)
        p1 = mul_wide_u32(c2, PHILOX_M1_32)
        hi0 = np.uint32(p0 >> U64_32)
        hi1 = np.uint32(p1 >> U64_32)
        lo0 = np.uint32(p0 & U64_MASK32)
        lo1 = np.uint32(p1 & U64_MASK32)
        n0 = np.uint32(hi1 ^ c1 ^ np.uint32(k0))
        n2 = np.uint32(hi0 ^ c3 ^ np.uint32(k1))
        c1 = lo1
        c3 = lo0
        c0 = n0
        c2 = n2
        k0 = (k0 + PHILOX_W0) & U64_MASK32
        k1 = (k1 + PHILOX_W1) & U64_MASK32
    return np.int64(c0), np.int64(c1), np.int64(c2), np.int64(c3)


@devfn
def philox_word(idx, key_lo, key_hi):
    """The 32 random bits of element ``idx`` (C-order linear index): word idx % 4 of the
    Philox block at counter idx // 4 (reference/rng.random_bits)."""
    blk = idx >> 2
    w0, w1, w2, w3 = philox4x32_10(blk & 0xFFFFFFFF, blk >> 32, key_lo, key_hi)
    j = idx & 3
    if j == 0:
        return w0
    if j == 1:
        return w1
    if j == 2:
        return w2
    return w3


# ----------------------------------------------------------------------------- element codecs
@devfn
def round_shift_rne(m, t):
    """m >> t rounded to nearest even (1 <= t <= 25, m < 2^24)."""
    q = m >> t
    rem = m & ((1 << t) - 1)
    half = 1 << (t - 1)
    if rem > half or (rem == half and (q & 1) == 1):
        q += 1
    return q


@devfn
def round_shift_stochastic(m, t, r):
    """m >> t rounded up when the top min(t, 32) discarded bits plus as many random bits
    carry (reference codec._round_shift with rbits; 1 <= t <= 56)."""
    q = m >> t
    rem = m & ((1 << t) - 1)
    if t <= 32:
        up = rem + (r >> (32 - t)) >= (1 << t)
    else:
        up = (rem >> (t - 32)) + r >= (1 << 32)
    return q + 1 if up else q


@devfn
def encode_float_rne(v, mbits, emin, max_code, nan_code, nbits):
    """encode_float_bits(f32_bits(v), ..., stochastic=False) with the rounding done by the
    FPU: the same code, in about a third of the instructions.

    With k = max(e, emin) (e = the exponent of |v|; an fp32 subnormal has e < emin), the
    format's quantum at |v| is 2^(k - M), so |v| * 2^(M - k) is exact (a power-of-two scale
    into [0, 2^(M+1))) and its round-to-nearest-even is the reference's ``m >> t`` rounded
    (t = 23 - M + max(emin - e, 0)); a result of 2^(M+1) (or 2^M from a subnormal) carries
    into the next binade through ``q + ((k - emin) << M)`` exactly as the reference's does.
    Values so small that the scaled value is below 1/2 round to 0, as the reference's clamped
    shift does."""
    # 32-bit integers throughout (np.int32 after each step: Numba types integer arithmetic
    # as int64, and the truncations let NVVM narrow it back to 32-bit instructions)
    u = f32_bits(v)
    sign = np.int32(u >> 31)
    ef = np.int32((u >> 23) & 0xFF)
    sbit = np.int32(sign << (nbits - 1))
    if ef == 0xFF:
        if np.int32(u & 0x7FFFFF) != 0:
            if nan_code >= 0:
                return np.int32(nan_code | sbit)
            return np.int32((1 - sign) << (nbits - 1))
        return np.int32(max_code | sbit)
    k = np.int32(ef - 127)
    if k < emin:
        k = np.int32(emin)
    # the product is exact (a power-of-two scale), so an FMA would not change it; mul_rn
    # keeps the PTX audit's "no fma" rule simple
    a = mul_rn(bits_f32(np.uint32(u & 0x7FFFFFFF)), pow2_f32(np.int32(mbits - k)))
    q = np.int32((a + TWO_23) - TWO_23)  # a < 2^(M+1): RNE to an integer
    mag = np.int32(q + np.int32((k - emin) << mbits))
    if mag > max_code:
        mag = np.int32(max_code)
    return np.int32(mag | sbit)


@devfn
def encode_float_bits(u, mbits, emin, max_code, nan_code, nbits, stochastic, r):
    """Code of the float32 with bits ``u`` in a float format (reference
    codec.encode_float with saturate=True): RNE, or stochastic with random bits ``r``.

    ``nan_code`` < 0 means the format has no NaN: NaN gives the zero whose sign bit is the
    complement of the NaN's (ml_dtypes)."""
    sign = u >> 31
    ef = (u >> 23) & 0xFF
    man = u & 0x7FFFFF
    sbit = sign << (nbits - 1)
    if ef == 0xFF:
        if man != 0:
            if nan_code >= 0:
                return nan_code | sbit
            return (1 - sign) << (nbits - 1)
        return max_code | sbit  # +-inf saturate
    if ef != 0:
        e = ef - 127
        m = man | 0x800000
    else:
        e = -126
        m = man
    d = emin - e
    if d < 0:
        d = 0
    t = (23 - mbits) + d
    if stochastic:
        if t > 56:
            t = 56
        q = round_shift_stochastic(m, t, r)
    else:
        if t > 25:
            t = 25
        q = round_shift_rne(m, t)
    ee = e - emin
    if ee < 0:
        ee = 0
    mag = q + (ee << mbits)
    if mag > max_code:
        mag = max_code
    return mag | sbit


U32_SIGN_OFF = np.uint32(0x7FFFFFFF)
U32_INF = np.uint32(0x7F800000)


@devfn
def encode_float_sr32(u, mbits, emin, max_code, nan_code, nbits, r):
    """encode_float_bits(u, mbits, emin, max_code, nan_code, nbits, True, r) for float32
    bits ``u`` and random bits ``r`` (both < 2^32), in 32-bit integer arithmetic and with
    a short path for the target's normal range; returns the code as a uint32.

    Normal range (``e >= emin``, ``a = u & 0x7FFFFFFF`` finite, or inf). There the spec
    shifts ``m = man | 2^23`` right by ``t = 23 - M`` (M = mbits; 1 <= M <= 3, so t <= 22)
    and rounds up iff ``rem + (r >> (32 - t)) >= 2^t``, ``rem = m mod 2^t``: a carry out of
    the low t bits. Since ``a = ef * 2^23 + man`` has the same low t bits as m, adding
    ``R = r >> (32 - t) = r >> (9 + M)`` (< 2^t) to ``a`` carries into bit t exactly then,
    and the carry runs on through the kept mantissa into the exponent field by itself:
    ``A = a + R``, ``A >> t = ef * 2^M + (man >> t) + up`` (A < 2^31: no wrap). The spec's
    magnitude is ``q + up + ((e - emin) << M)`` with ``q = 2^M + (man >> t)`` and
    ``e = ef - 127``, which is ``(A >> t) - ((126 + emin) << M)``; the saturation
    ``min(., max_code)`` follows. +-inf (``a = 0x7F800000``) lands far above max_code and
    saturates, as the spec's inf does.

    Below the normal range (``e < emin``: subnormal in the target, zero, float32
    subnormals; ``a < (127 + emin) << 23``) the quantum is fixed at 2^(emin - M): with
    ``m = (a & 0xFFFFFF) | 2^23`` (the significand, implicit bit included) and
    ``t = 23 - M + emin - (ef - 127)`` (> 23 - M). For t <= 31,
    ``(m + (r >> (32 - t))) >> t`` is q + up as above (the sum is < 2^24 + 2^31); for
    t >= 32 (``a < (119 - M + emin) << 23``: below 2^(emin - M - 8)), q = 0 and the spec
    rounds up iff ``(m >> (t - 32)) + r >= 2^32``, i.e. ``m >> (t - 32) > ~r`` (the spec's
    clamp t <= 56 gives 0 = m >> 24, as does any shift of 24 to 31). Zero and the float32
    subnormals (ef = 0, whose significand has no implicit bit) all have t >= 32 and a shift
    of at least 24, so the implicit bit set in m for them shifts out: 0, as in the spec. The
    magnitude is at most 2^M, the smallest normal code (an up from the top subnormal
    carries into it, as in the spec).
    NaN (``a > 0x7F800000``): nan_code with the NaN's sign, or (no NaN in the format) the
    zero of the opposite sign (ml_dtypes).

    Structure: the normal-range magnitude (4 instructions: sm_90 SASS LOP3, LEA.HI (a + R),
    LEA.HI (>> t, - offset), and the range test) is computed for every lane; lanes outside
    the range then run one short block (ptxas predicates its t >= 32 part) and overwrite it.
    A warp of normal values runs about 11 instructions per element (sign and saturation
    included); a warp that mixes normal and subnormal lanes pays the shortcut plus the
    block (about 25 more), not two full encoders. (A branch-free variant that computes both
    magnitudes and selects costs about 30 for every warp: better only for warps that are
    mostly mixed, measured on one bf16 MX unit.) Every step is wrapped in np.uint32 /
    np.int32 so that NVVM emits 32-bit instructions (see encode_float_rne)."""
    u = np.uint32(u)
    r = np.uint32(r)
    a = np.uint32(u & U32_SIGN_OFF)
    lo = (127 + emin) << 23  # the smallest normal of the target
    big = np.uint32(np.uint32(a + np.uint32(r >> np.uint32(9 + mbits))) >> np.uint32(23 - mbits))
    # int32: negative (and then overwritten) below the normal range; no wrap on the host
    mag = np.int32(np.int32(big) - np.int32((126 + emin) << mbits))
    # not in [lo, inf] (one unsigned compare; int64 then truncated, so the host does not wrap)
    if np.uint32(np.int64(a) - lo) > np.uint32(0x7F800000 - lo):
        if a > U32_INF:  # NaN: its sign (or the opposite sign's zero) at bit nbits - 1
            if nan_code >= 0:
                sb = np.uint32(np.uint32(u >> np.uint32(32 - nbits)) & np.uint32(1 << (nbits - 1)))
                return np.uint32(np.uint32(nan_code) | sb)
            return np.uint32(np.uint32(np.uint32(~u) >> np.uint32(32 - nbits)) & np.uint32(1 << (nbits - 1)))
        # significand with the implicit bit (also set for a float32 subnormal or zero: those
        # have t >= 32 and take the block below, where any m < 2^24 shifts out)
        m = np.uint32(np.uint32(a & np.uint32(0xFFFFFF)) | np.uint32(0x800000))
        t = np.int32(np.int32(150 - mbits + emin) - np.int32(a >> np.uint32(23)))
        tc = np.int32(min(t, np.int32(31)))
        mag = np.int32(np.uint32(m + np.uint32(r >> np.uint32(32 - tc))) >> np.uint32(tc))
        if a < np.uint32((119 - mbits + emin) << 23):  # t >= 32: below 2^(emin - M - 8), or 0
            x = np.uint32(m >> np.uint32(min(np.int32(t - 32), np.int32(31))))
            mag = np.int32(1) if x > np.uint32(~r) else np.int32(0)
    if mag > max_code:
        mag = np.int32(max_code)
    # the sign bit moved to bit nbits - 1 (one LOP3 with the OR)
    return np.uint32(np.uint32(mag) | np.uint32(np.uint32(u >> np.uint32(32 - nbits)) & np.uint32(1 << (nbits - 1))))


@devfn
def sr_fast_key_bound(mbits, emin, sub):
    """The smallest key that sr_float_code_fast's result is valid for (host or device; a
    compile-time constant in kernels): its key ``a - 1`` (uint32, so ``a = 0`` gives
    2^32 - 1) must be at least this, i.e. ``a`` is 0 or at least the target's smallest
    normal (``sub`` False) or 2^(emin - M - 8), the bottom of the shift-by-t <= 31 range
    (``sub`` True)."""
    lo = (119 - mbits + emin) if sub else (127 + emin)
    return (lo << 23) - 1


@devfn
def sr_float_code_fast(u, mbits, emin, max_code, nbits, r, sub):
    """(code, key): encode_float_sr32(u, mbits, emin, max_code, nan_code, nbits, r) for
    finite float32 bits ``u``, without a branch, where ``key >= sr_fast_key_bound(mbits,
    emin, sub)``; the caller checks a unit's keys at once (their min) and takes
    encode_float_sr32 for a unit where one falls short. ``key = a - 1`` (uint32),
    a = u & 0x7FFFFFFF.

    ``sub`` False: the normal-range carry of encode_float_sr32 (``(a + (r >> (9 + M))) >>
    (23 - M)`` less the exponent offset), floored at 0 so that a = 0 gives magnitude 0 (the
    spec's code of a signed zero: R = r >> (9 + M) < 2^(23 - M) leaves 0 >> (23 - M) = 0,
    and 0 minus the offset is negative); valid for a = 0 and the normal range.
    ``sub`` True (the 6-bit formats, where much of a group lies below the normal
    range): the spec's shift by t with ``t = max(23 - M, 150 - M + emin - ef)`` (ef = a >>
    23), for every lane: ``m = significand | 2^23`` (0 for a = 0),
    ``q = (m + (r >> (32 - t))) >> t`` and ``mag = q + (max(ef - 127 - emin, 0) << M)``;
    in the normal range that is the spec's q + ((e - emin) << M) with t = 23 - M, below it
    the subnormal q with a zero exponent term; valid for a = 0 and wherever t <= 31 (t is
    clamped to 31, so no shift reaches 32). Then min(mag, max_code) and the sign, as in
    encode_float_sr32 (by sign_add: multiply-adds, off the ALU pipe)."""
    u = np.uint32(u)
    r = np.uint32(r)
    a = np.uint32(u & U32_SIGN_OFF)
    if sub:
        ef = np.int32(a >> np.uint32(23))
        t = np.int32(min(max(np.int32(np.int32(150 - mbits + emin) - ef), np.int32(23 - mbits)), np.int32(31)))
        m = np.uint32(np.uint32(a & np.uint32(0x7FFFFF)) | np.uint32(0x800000))
        if a == np.uint32(0):
            m = np.uint32(0)
        q = np.uint32(np.uint32(m + np.uint32(r >> np.uint32(32 - t))) >> np.uint32(t))
        ee = np.int32(max(np.int32(ef - np.int32(127 + emin)), np.int32(0)))
        mag = np.int32(np.int32(q) + np.int32(ee << np.int32(mbits)))
    else:
        big = np.uint32(np.uint32(a + np.uint32(r >> np.uint32(9 + mbits))) >> np.uint32(23 - mbits))
        mag = np.int32(max(np.int32(np.int32(big) - np.int32((126 + emin) << mbits)), np.int32(0)))
    mag = np.int32(min(mag, np.int32(max_code)))
    return np.uint32(sign_add(u, np.uint32(mag), np.uint32(1 << (nbits - 1)))), np.uint32(np.int64(a) - 1)


@devfn
def fadd_rz_twin(a, b):
    """float32 a + b rounded toward zero, for the one use below (a >= 0 below 2^23, b = 2^23:
    the sum 2^23 + floor(a) exactly)."""
    return F32(F32(b) + F32(math.floor(F32(a))))  # (math.floor: np.floor is no GPU-target ufunc)


if not PTX:
    fadd_rz = fadd_rz_twin
else:

    @devfn
    def fadd_rz(a, b):
        """float32 a + b rounded toward zero (libdevice __nv_fadd_rz -> ``add.rz.f32``)."""
        return cuda.libdevice.fadd_rz(a, b)


E2M1_SR_MIN_BITS = 0x38800000  # 2^-14: see sr_e2m1_code_f
F_TWO = F32(2.0)
F_FOUR = F32(4.0)
F_EIGHT = F32(8.0)
F_HALF = F32(0.5)
F_2P23 = F32(8388608.0)


@devfn
def sr_e2m1_code_f(q, r):
    """(code, key): encode_float_sr32's stochastic e2m1 code of float32 ``q`` (finite) with
    random bits ``r``, by float arithmetic, valid where ``key >= E2M1_SR_MIN_BITS - 1`` and q
    holds at most 11 significant bits (q = x * 2^-k of a bfloat16 or float16 x: MX e2m1 of
    16-bit input). key = |q|'s bits - 1 as uint32 (q = +-0: 2^32 - 1).

    The spec rounds up iff floor(f * 2^32) + r >= 2^32, f the fraction of |q| in units of the
    target's step Q at |q| (any t: docs/numerics.md). e2m1's steps: Q = 0.5 below 2 (its
    subnormals 0, 0.5 and the binade [1, 2)), 1 on [2, 4), 2 from 4 (6 and up saturate, so
    larger binades need no step of their own). y = |q| / Q is exact (a power of two),
    n = floor(y) = RZ(y + 2^23) - 2^23 exactly (y < 2^23), f = y - n exactly. With at most 11
    significant bits and |q| >= 2^-14, y >= 2^-13 has no bit below 2^-23, so F = f * 2^23 is
    an integer and floor(f * 2^32) + r >= 2^32 iff F + (r >> 9) >= 2^23, i.e. iff
    f + h >= 2 with h = 1 + (r >> 9) * 2^-23 (the float32 with bits 0x3F800000 | (r >> 9)):
    the exact sum is a multiple of 2^-23, below 2 it is representable, and 2 is, so the
    rounded sum is >= 2 exactly when the exact one is. q = +-0 gives f = 0 < 2 - h: code 0.
    The magnitude is n + up + (0, 2, 4) by Q (the codes of 0.5 * n, n, 2n), saturated at 7
    (|q| is first clamped to 8, whose code saturates as every |q| >= 6 does); the sign at bit 3."""
    u = np.uint32(f32_bits(q))
    a = min(abs(q), F_EIGHT)  # (from 6 every code saturates: 8 keeps y = 4, n below 256)
    inv = F_TWO
    off = np.int32(0)
    if a >= F_TWO:
        inv = ONE
        off = np.int32(2)
    if a >= F_FOUR:
        inv = F_HALF
        off = np.int32(4)
    y = a * inv
    nf = fadd_rz(y, F_2P23)
    f = y - (nf - F_2P23)
    h = bits_f32(np.uint32(np.uint32(0x3F800000) | np.uint32(np.uint32(r) >> np.uint32(9))))
    mag = np.int32(np.int32(np.uint32(f32_bits(nf)) & np.uint32(0xFF)) + off)
    if f + h >= F_TWO:
        mag = np.int32(mag + 1)
    mag = np.int32(min(mag, np.int32(7)))
    code = np.uint32(np.uint32(mag) | np.uint32(np.uint32(u >> np.uint32(28)) & np.uint32(8)))
    return code, np.uint32(np.int64(u & U32_SIGN_OFF) - 1)


# MX e2m1 and NVFP4 under stochastic rounding in integer arithmetic, any float32 q (NVFP4's
# q = x * m_b has 24 significant bits, so sr_e2m1_code_f's float form does not hold there).
# The spec's magnitude is floor(|q| / Q + r * 2^-32) plus the codes below Q's binade (0, 2, 4
# for Q = 0.5, 1, 2: docs/numerics.md), saturated at 7. With ef = |q|'s exponent field and
# m its significand (implicit bit set), |q| / Q = m * 2^(c - 32) for c = min(ef - 117, 10):
# Q = 0.5 below 2 (ef <= 127: |q| / Q = m * 2^(ef - 149)), 1 on [2, 4), 2 on [4, 8) (c = 10
# for ef >= 127: |q| / Q = m * 2^-22 in [2, 4)). For 0 <= c (ef >= 117, |q| >= 2^-10) m * 2^c
# is an integer, so the spec's floor(floor(f * 2^32) + r) carry is exactly the high word of the
# 64-bit m * 2^c + r: one mad.wide.u32 an element, its multiplier 2^c by a shl that gives 0
# for c < 0 (PTX clamps shift amounts at 32), then 2 * max(ef - 127, 0) added and min(., 7).
# Where c < 0 the magnitude is then 0: right for q = +-0 and every |q| < 2^-33 (floor(f * 2^32)
# = 0 there: no r carries), not for 2^-33 <= |q| < 2^-10 (94 <= ef <= 116), which the key
# marks: c + 23 (uint32) >= 23 exactly where the code is the spec's (E2M1_SR_I_KEY).
# On NVIDIA it is one inline-PTX block (``ptx.sr_e2m1_code_i``, twin ``sr_e2m1_code_i_twin``)
# whose sign (x's bit 31 times 8), significand (a - (ef - 1) * 2^23) and sums are
# multiply-adds: the ALU pipe, which stochastic rounding fills (Philox's xors), gets 7
# instructions an element (the unit's key check included) where the same steps written as
# integer code took 13.
E2M1_SR_I_KEY = 23


@devfn
def rint_stochastic_f32(v, stochastic, r):
    """reference codec.rint_stochastic for |v| <= 2^22: RNE, or floor + (u < frac) with
    u = (r >> 8) * 2^-24."""
    if not stochastic:
        return rint_f32(v)
    fl = F32(math.floor(v))
    frac = v - fl
    u = F32(r >> 8) * TWO_M24
    return fl + ONE if u < frac else fl


@devfn
def encode_int_f32(v, lo, hi, stochastic, r):
    """reference codec.encode_int: clip, NaN -> 0, round (RNE or stochastic), clip.
    Returns the code as an int in [lo, hi]."""
    if v != v:
        v = ZERO
    flo = F32(lo)
    fhi = F32(hi)
    if v < flo:
        v = flo
    if v > fhi:
        v = fhi
    q = np.int32(rint_stochastic_f32(v, stochastic, r))  # |v| <= hi after the clip: fits
    if q < lo:
        q = np.int32(lo)
    if q > hi:
        q = np.int32(hi)
    return q


# ----------------------------------------------------------------------------- decoders
@devfn
def pow2_f32(k):
    """2^k as float32 for -126 <= k <= 127 (normal exponents only)."""
    return bits_f32(np.uint32((k + 127) << 23))


@devfn
def decode_float_code(c, ebits, mbits, nan_style):
    """float32 value of a float-format code (reference codec.float_code_table):
    nan_style 0 = none, 1 = all_ones (e4m3fn), 2 = ieee (e5m2)."""
    nbits = 1 + ebits + mbits
    sign = (c >> (nbits - 1)) & 1
    ef = (c >> mbits) & ((1 << ebits) - 1)
    man = c & ((1 << mbits) - 1)
    bias = (1 << (ebits - 1)) - 1
    top = ef == (1 << ebits) - 1
    if nan_style == 2 and top:
        val = NAN if man != 0 else bits_f32(0x7F800000)
    elif nan_style == 1 and top and man == (1 << mbits) - 1:
        val = NAN
    else:
        if ef != 0:
            sig = man + (1 << mbits)
            k = ef - bias - mbits
        else:
            sig = man
            k = 1 - bias - mbits
        val = F32(sig) * pow2_f32(k)
    return -val if sign == 1 else val


@devfn
def decode_small_float(c, ebits, mbits, nan_style):
    """decode_float_code for the narrow formats (e4m3, e5m2, e3m2, e2m3, e2m1), the same
    float32 for every code, in a few integer operations and one multiply: the code's exponent
    and mantissa fields moved to float32's places read as 2^(e - 127) (1 + m / 2^mbits), or
    for e = 0 as the float32 subnormal m / 2^mbits * 2^-126; the multiply by 2^(127 - bias)
    (a normal float32 for these biases) makes either the format's value, exactly. No
    int-to-float conversion and no branch on the fields (the top exponent of e5m2 and
    e4m3fn's all-ones code take a select)."""
    nbits = 1 + ebits + mbits
    mag = c & ((1 << (nbits - 1)) - 1)
    bias = (1 << (ebits - 1)) - 1
    val = bits_f32(np.uint32(mag << (23 - mbits))) * bits_f32(np.uint32((254 - bias) << 23))
    if nan_style == 2 and (mag >> mbits) == (1 << ebits) - 1:
        val = NAN if (mag & ((1 << mbits) - 1)) != 0 else bits_f32(0x7F800000)
    elif nan_style == 1 and mag == (1 << (nbits - 1)) - 1:
        val = NAN
    return -val if (c >> (nbits - 1)) & 1 == 1 else val


@devfn
def decode_e8m0(code):
    """float32 2^(code - 127); code 0 is the subnormal 2^-127, 0xFF is NaN."""
    if code == 0xFF:
        return NAN
    if code == 0:
        return bits_f32(0x00400000)
    return bits_f32(code << 23)


@devfn
def e8m0_reciprocal(code):
    """1 / 2^(code - 127) = 2^(127 - code), exactly (2^-127 is the float32 subnormal
    0x00400000); NaN for 0xFF. x * this is the same real number as x / 2^(code - 127), so
    IEEE rounding gives the same float32: MX elements multiply instead of dividing."""
    if code == 0xFF:
        return NAN
    k = 254 - code  # biased exponent of the reciprocal
    if k == 0:
        return bits_f32(0x00400000)
    return bits_f32(k << 23)
