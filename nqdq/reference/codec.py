"""Element codecs by bit manipulation: the NumPy reference every kernel mirrors.

Encoding works on the bits of a float32 (or float64) input, never through a float cast,
so that the same steps run in a CUDA kernel, the CUDA simulator and on AMD:

1. split |x| into exponent ``e`` (unbiased) and significand ``m`` with its implicit bit;
2. discard ``t = (src_mbits - M) + max(emin - e, 0)`` low bits of ``m`` with
   round-to-nearest-even (or stochastically, adding ``t`` random bits to the discarded
   part and keeping the carry);
3. the code magnitude is ``q + (max(e - emin, 0) << M)``: when rounding carries ``q`` to
   ``2^(M+1)`` (or a subnormal to ``2^M``) the addition moves into the next binade by
   itself;
4. magnitudes above the largest finite code saturate (default) or become the format's
   overflow code (inf for e5m2, NaN for e4m3fn, max for formats with neither), exactly as
   ``ml_dtypes`` casts do.

NaN inputs: formats with a NaN keep the sign (``0x7F``/``0xFF`` for e4m3fn,
``0x7E``/``0xFE`` for e5m2); formats without one (e2m1, e2m3, e3m2) give the zero whose
sign bit is the *complement* of the NaN's sign bit, which is what ml_dtypes 0.5-0.6 does
(``float4_e2m1fn(nan) == -0.0``). Inside :func:`nqdq.quantize` a NaN always also makes its
block's scale NaN, so the block decodes to NaN whatever its codes are.

Large arrays are encoded ``CHUNK`` elements at a time (:func:`in_chunks`): every element is
computed on its own, so the codes are the same, and the int64 temporaries of the steps above
stay in the CPU's caches (a 4096x7168 float32 array to e4m3: 7-16x faster than in one pass on
the 2-core CI machine; docs/performance.md, "The NumPy path (CPU)").
"""

from __future__ import annotations

import functools

import numpy as np

from ..formats import FloatFormat, IntFormat

__all__ = [
    "encode_float",
    "decode_float",
    "encode_int",
    "decode_int",
    "encode_e8m0",
    "decode_e8m0",
    "float_code_table",
    "split_float",
    "in_chunks",
    "settle_allocator",
]

# elements a chunked loop of the reference takes at a time: in_chunks' encodes, rng.random_bits
# (a multiple of 4: whole Philox blocks), fused.rmsnorm's rows
CHUNK = 1 << 16
_settled = False  # settle_allocator ran (once a process)


def settle_allocator():
    """Let the C allocator keep the chunks' temporaries (once a process; called before a
    chunked loop). glibc's malloc maps each block at or above its mmap threshold (128 KiB at
    start) fresh from the kernel, page faults included, and gives it back on free, until the
    free of a mapped block below 32 MiB raises the threshold to that block's size, as a
    program that frees such an array does. A chunk's int64 temporaries are 512 KiB each, so
    an input whose own arrays are all larger than 32 MiB never raised it: float32 16384x7168
    to fp8 took 5.0-8.7 s a call, against 1.8-3.9 s after this (the CI machine). One untouched
    block of just under 32 MiB, allocated and freed, raises it; other allocators ignore it."""
    global _settled
    if not _settled:
        _settled = True
        np.empty((32 << 20) - (1 << 16), np.uint8)  # (freed at once)


def in_chunks(fn):
    """``fn(x, *args, rbits=None, **kw)``, elementwise in ``x`` and its random bits ``rbits``
    (same size), evaluated ``CHUNK`` elements at a time into one array of ``x``'s shape: the
    same result, with temporaries of ``CHUNK`` elements instead of ``x.size``."""

    @functools.wraps(fn)
    def run(x, *args, rbits=None, **kw):
        x = np.asarray(x)
        if x.size <= CHUNK:
            return fn(x, *args, rbits=rbits, **kw)
        if rbits is not None and np.size(rbits) != x.size:
            raise ValueError(f"rbits has {np.size(rbits)} elements, x has {x.size}")
        settle_allocator()
        flat = np.ascontiguousarray(x).reshape(-1)
        rflat = None if rbits is None else np.ascontiguousarray(rbits).reshape(-1)
        out = None
        for i in range(0, flat.size, CHUNK):
            part = fn(flat[i : i + CHUNK], *args, rbits=None if rflat is None else rflat[i : i + CHUNK], **kw)
            if out is None:
                out = np.empty(flat.size, part.dtype)
            out[i : i + CHUNK] = part
        return out.reshape(x.shape)

    return run

_SRC = {
    np.dtype(np.float32): (np.uint32, 8, 23),
    np.dtype(np.float64): (np.uint64, 11, 52),
}


def split_float(x: np.ndarray):
    """Sign, exponent and significand of a float32/float64 array, as int64 arrays.

    Returns ``(sign, e, m, is_nan, is_inf, mbits)`` where finite ``|x| = m * 2^(e - mbits)``,
    ``m`` carrying the implicit bit for normal numbers (subnormals use the minimum
    exponent and no implicit bit, so they need no special case downstream).
    """
    utype, ebits, mbits = _SRC[x.dtype]
    nbits = 1 + ebits + mbits
    u = x.view(utype).astype(np.uint64)
    sign = (u >> np.uint64(nbits - 1)).astype(np.int64)
    ef = ((u >> np.uint64(mbits)) & np.uint64((1 << ebits) - 1)).astype(np.int64)
    man = (u & np.uint64((1 << mbits) - 1)).astype(np.int64)
    bias = (1 << (ebits - 1)) - 1
    special = ef == (1 << ebits) - 1
    is_nan = special & (man != 0)
    is_inf = special & (man == 0)
    normal = ef != 0
    e = np.where(normal, ef, 1) - bias
    m = np.where(normal, man | (1 << mbits), man)
    return sign, e, m, is_nan, is_inf, mbits


def _round_shift(m, t, rbits):
    """``m >> t`` rounded to nearest even, or stochastically with 32 random bits ``rbits``.

    Stochastic rounding adds the top ``min(t, 32)`` random bits to the top ``min(t, 32)``
    discarded bits and keeps the carry, so it rounds up with probability equal to the
    discarded fraction (to 2^-32 resolution).
    """
    q = m >> t
    rem = m & ((np.int64(1) << t) - 1)
    if rbits is None:
        half = np.int64(1) << (t - 1)
        up = (rem > half) | ((rem == half) & ((q & 1) == 1))
    else:
        r = rbits.astype(np.int64)
        short = t <= 32
        r_t = r >> np.where(short, 32 - t, 0)  # top t random bits
        rem32 = rem >> np.where(short, 0, t - 32)  # top 32 discarded bits
        width = np.where(short, t, 32)
        up = np.where(short, rem + r_t, rem32 + r) >= (np.int64(1) << width)
    return q + up.astype(np.int64)


@in_chunks
def encode_float(x: np.ndarray, fmt: FloatFormat, *, saturate: bool = True, rbits=None):
    """Encode float32/float64 ``x`` to ``fmt`` codes (uint8, one code per byte).

    ``rbits`` (uint32, same shape) switches to stochastic rounding (float32 inputs only).
    """
    sign, e, m, is_nan, is_inf, src_mbits = split_float(x)
    # For float32 m < 2^24: past t = src_mbits + 2 every input rounds to zero (RNE) and
    # the stochastic carry is zero too, so clamping t keeps shifts in range.
    t_max = src_mbits + 2 if rbits is None else 56
    t = np.minimum((src_mbits - fmt.mbits) + np.maximum(fmt.emin - e, 0), t_max)
    q = _round_shift(m, t, rbits)
    mag = q + (np.maximum(e - fmt.emin, 0) << fmt.mbits)

    if saturate:
        overflow_code = fmt.max_code
        inf_code = fmt.max_code
    elif fmt.nan == "ieee":
        overflow_code = inf_code = fmt.inf_code
    elif fmt.nan == "all_ones":
        overflow_code = inf_code = fmt.nan_code
    else:  # no inf, no NaN: ml_dtypes saturates
        overflow_code = inf_code = fmt.max_code
    mag = np.where(mag > fmt.max_code, overflow_code, mag)
    mag = np.where(is_inf, inf_code, mag)
    if fmt.nan_code is not None:
        mag = np.where(is_nan, fmt.nan_code, mag)
        out_sign = sign
    else:
        mag = np.where(is_nan, 0, mag)
        out_sign = np.where(is_nan, 1 - sign, sign)
    code = mag | (out_sign << (fmt.bits - 1))
    return code.astype(np.uint8)


def float_code_table(fmt: FloatFormat) -> np.ndarray:
    """float32 value of every code of ``fmt`` (index = code), from the bit fields."""
    codes = np.arange(1 << fmt.bits, dtype=np.int64)
    sign = codes >> (fmt.bits - 1)
    ef = (codes >> fmt.mbits) & ((1 << fmt.ebits) - 1)
    man = codes & ((1 << fmt.mbits) - 1)
    normal = ef != 0
    sig = np.where(normal, man + (1 << fmt.mbits), man).astype(np.float64)
    val = np.ldexp(sig, np.where(normal, ef, 1) - fmt.bias - fmt.mbits)
    top = ef == (1 << fmt.ebits) - 1
    if fmt.nan == "ieee":
        val = np.where(top, np.where(man == 0, np.inf, np.nan), val)
    elif fmt.nan == "all_ones":
        val = np.where(top & (man == (1 << fmt.mbits) - 1), np.nan, val)
    val = np.where(sign == 1, -val, val)
    return val.astype(np.float32)


def decode_float(codes: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """float32 values of ``fmt`` codes (uint8, one per byte; bits above the format ignored)."""
    table = float_code_table(fmt)
    return table[np.asarray(codes, dtype=np.uint8) & np.uint8((1 << fmt.bits) - 1)]


def rint_stochastic(v: np.ndarray, rbits) -> np.ndarray:
    """Round float32 ``v`` to an integer-valued float: nearest-even, or up with probability
    equal to its fraction when ``rbits`` (uint32) are given (24 random bits compared with
    the exactly computed fraction)."""
    if rbits is None:
        return np.rint(v)
    fl = np.floor(v)
    frac = v - fl  # exact: Sterbenz, |v| < 2^24 after clamping by the caller
    u = (rbits >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)
    return fl + (u < frac).astype(np.float32)


@in_chunks
def encode_int(x: np.ndarray, fmt: IntFormat, *, symmetric: bool = True, rbits=None):
    """Round float32 ``x`` to integers (RNE or stochastic) and saturate to the code range.

    Symmetric codes are int8 two's complement in ``[-(2^(b-1)-1), 2^(b-1)-1]``; asymmetric
    codes are uint8 in ``[0, 2^b - 1]`` (the caller has already added the zero point).
    NaN encodes to 0 (and makes its block's scale NaN inside quantize).
    """
    lo, hi = fmt.qrange(symmetric)
    v = np.clip(np.asarray(x, np.float32), lo, hi)  # clip first: keeps |v| small and exact
    v = np.where(np.isnan(v), np.float32(0), v)
    q = rint_stochastic(v, rbits)
    q = np.clip(q, lo, hi).astype(np.int64)
    return q.astype(np.int8 if symmetric else np.uint8)


def decode_int(codes: np.ndarray, fmt: IntFormat, *, symmetric: bool = True) -> np.ndarray:
    """float32 values of integer codes; a 4-bit symmetric code is sign-extended from its nibble.
    Byte codes (int8, uint8) are looked up in a table of the same rule over every byte value."""
    c = np.asarray(codes)
    if c.dtype in (np.int8, np.uint8):
        table = _int_values(np.arange(256, dtype=np.uint8).view(c.dtype), fmt, symmetric)
        return table[c.view(np.uint8)]
    return _int_values(c, fmt, symmetric)


def _int_values(codes, fmt: IntFormat, symmetric: bool) -> np.ndarray:
    c = codes.astype(np.int64)
    if symmetric:
        c = c & ((1 << fmt.bits) - 1)
        c = np.where(c >= (1 << (fmt.bits - 1)), c - (1 << fmt.bits), c)
    return c.astype(np.float32)


def encode_e8m0(x: np.ndarray) -> np.ndarray:
    """Round float32/float64 to a power of two as an e8m0 code, as ml_dtypes'
    ``float8_e8m0fnu`` cast does: to nearest with ties up (1.5 * 2^k -> 2^(k+1)); below
    2^-126, any value above 2^-127 gives 2^-126 (ml_dtypes' rule for float32 subnormals);
    zero, negative, inf and NaN give 0xFF; values rounding past 2^127 give 0xFF.
    (MX scale *computation* does not use this: see reference/scales.py.)"""
    sign, e, m, is_nan, is_inf, mbits = split_float(np.asarray(x))
    one = np.int64(1) << mbits  # m of an exact power of two (normal numbers)
    normal_range = (e > -126) | ((e == -126) & (m >= one))  # |x| >= 2^-126
    code = e + 127 + (m >= 3 * (one >> 1))
    # |x| < 2^-126: x > 2^-127  <=>  m > 2^(mbits - 127 - e)
    s = np.clip(mbits - 127 - e, 0, 62)
    code = np.where(normal_range, code, (m > (np.int64(1) << s)) & (mbits - 127 - e <= 62))
    bad = (sign == 1) | (m == 0) | is_nan | is_inf | (code > 254)
    return np.where(bad, 0xFF, code).astype(np.uint8)


def decode_e8m0(codes: np.ndarray) -> np.ndarray:
    """float32 value 2^(code - 127); code 0 is the float32 subnormal 2^-127; 0xFF is NaN."""
    c = np.asarray(codes, dtype=np.uint8).astype(np.int64)
    bits = np.where(c == 0, 0x00400000, c << 23)
    bits = np.where(c == 0xFF, 0x7FC00000, bits)
    return bits.astype(np.uint32).view(np.float32)

