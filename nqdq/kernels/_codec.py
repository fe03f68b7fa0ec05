"""Device twins of ``nqdq.reference.codec`` and ``nqdq.reference.rng``: element codecs by
bit manipulation, stochastic rounding and Philox4x32-10, written once for three targets
(real CUDA through NVVM, the CUDA simulator, AMD through numba-hip).

Rules every function here follows, because the reference is the spec:

* float arithmetic is float32 only: every constant is an ``np.float32`` module global (a
  Python float literal would promote the expression to float64);
* integer work is done on Python ints / int64 holding the float32 *bits* (read through a
  1-element local-array view, which NVVM lowers to a plain ``mov.b32``); the hot element
  encoders (``encode_float_rne``, ``encode_int_f32``) wrap each step in ``np.int32`` so
  that NVVM narrows Numba's int64 arithmetic to 32-bit instructions (the audit's ``i64``
  column counts what is left);
* nothing here uses warp shuffles, cooperative groups, fp16/bf16 Numba types, libdevice
  (except :func:`mul_rn`, which has a portable twin) or printf.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, uint32

from ._target import SIMULATOR, devfn

F32 = np.float32
ZERO = F32(0.0)
ONE = F32(1.0)
NAN = F32(np.nan)  # bits 0x7FC00000, the reference's np.nan
FLT_MAX = F32(np.finfo(np.float32).max)
TWO_M24 = F32(2.0**-24)
TWO_23 = F32(2.0**23)
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
def f16_bits_to_f32_bits(h):
    """Exact float16 -> float32 on the bits (subnormals normalised, NaN payload kept)."""
    s = (h >> 15) << 31
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0x1F:
        return s | 0x7F800000 | (m << 13)
    if e == 0:
        if m == 0:
            return s
        e32 = 113  # 127 - 15 + 1, decremented once per normalising shift
        while (m & 0x400) == 0:
            m = m << 1
            e32 -= 1
        return s | (e32 << 23) | ((m & 0x3FF) << 13)
    return s | ((e + 112) << 23) | (m << 13)


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


if SIMULATOR:
    mul_rn = mul_rn_twin
else:

    @devfn
    def mul_rn(a, b):
        """float32 product that NVVM/ptxas will not contract into an FMA with a following
        add (libdevice __nv_fmul_rn -> ``mul.rn.f32``). The reference rounds the product
        and the sum separately (centred INT8 dequantize: code * s + mean)."""
        return cuda.libdevice.fmul_rn(a, b)


# ----------------------------------------------------------------------------- Philox4x32-10
PHILOX_M0 = np.uint64(0xD2511F53)
PHILOX_M1 = np.uint64(0xCD9E8D57)
PHILOX_W0 = np.uint64(0x9E3779B9)
PHILOX_W1 = np.uint64(0xBB67AE85)


@devfn
def philox4x32_10(ctr_lo, ctr_hi, key_lo, key_hi):
    """Philox4x32-10 of counter (ctr_lo, ctr_hi, 0, 0) under key (key_lo, key_hi), as
    reference/rng.philox4x32_10; returns the 4 output words as ints."""
    c0 = np.uint64(ctr_lo)
    c1 = np.uint64(ctr_hi)
    c2 = np.uint64(0)
    c3 = np.uint64(0)
    k0 = np.uint64(key_lo)
    k1 = np.uint64(key_hi)
    for _ in range(10):
        p0 = PHILOX_M0 * c0
        p1 = PHILOX_M1 * c2
        n0 = (p1 >> U64_32) ^ c1 ^ k0
        n2 = (p0 >> U64_32) ^ c3 ^ k1
        c1 = p1 & U64_MASK32
        c3 = p0 & U64_MASK32
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
