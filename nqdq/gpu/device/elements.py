"""Per-element device functions shared by every quantize / dequantize kernel: encode one
element given its group's parameters, decode one code, and the packing of codes along the
last axis (reference/packing.py: element i at bits [b*i, b*i + b) of the row's byte stream).

Format constants travel as a tuple ``fmt`` = (is_float, mbits, emin, max_code, nan_code,
nbits, qlo, qhi, ebits, nan_style), built on the host by :func:`format_tuple`; the kernel
factories close over it, so after inlining every branch on it folds away.
"""

from __future__ import annotations

import numpy as np

from ...formats import FloatFormat
from .codec import (
    F32, ZERO, encode_float_rne, encode_float_sr32, encode_int_f32, f32_bits, philox4x32_10, rint_stochastic_f32,
)
from ..ptx.convert import E4M3, cvt_e4m3, cvt_e5m2
from .scales import MODE_ASYM, MODE_CENTRED, MODE_MX, MODE_NVFP4
from ..runtime.target import devfn

_NAN_STYLE = {"none": 0, "all_ones": 1, "ieee": 2}


def format_tuple(scheme) -> tuple:
    """Compile-time constants of the scheme's element format (see module docstring)."""
    elem = scheme.element
    if isinstance(elem, FloatFormat):
        nan_code = elem.nan_code if elem.nan_code is not None else -1
        return (1, elem.mbits, elem.emin, elem.max_code, nan_code, elem.bits, 0, 0, elem.ebits, _NAN_STYLE[elem.nan])
    lo, hi = elem.qrange(scheme.symmetric)
    return (0, 0, 0, 0, -1, elem.bits, lo, hi, 0, 0)


@devfn
def encode_element(x, p0, p1, pz, mode, fmt, stoch, r, cvt):
    """Code (0..255; an int8 code in two's complement) of float32 ``x`` in a group with
    parameters (p0, p1, pz) (see _scales; for MX p0 is 2^-k, not 2^k), exactly as
    reference/quantize.py. ``cvt`` (a compile-time constant: _ptx.fp8_cvt_available() and
    _ptx.fp8_cvt_supports(fmt)) encodes e4m3 / e5m2 by the PTX instruction."""
    if mode == MODE_NVFP4 or mode == MODE_MX:
        v = x * p0  # NVFP4: the block multiplier; MX: the exact reciprocal of 2^k (see device.codec)
    elif mode == MODE_CENTRED:
        v = (x - p1) / p0
    else:
        v = x / p0
    if mode == MODE_ASYM:
        qmax = fmt[7]
        lim = F32(qmax + 1)
        if v != v:
            v = ZERO
        elif v < -lim:
            v = -lim
        elif v > lim:
            v = lim
        q = int(rint_stochastic_f32(v, stoch, r)) + pz
        if q < 0:
            q = 0
        if q > qmax:
            q = qmax
        return q
    if fmt[0] == 1:
        if x != x:
            # A NaN operand propagates itself (sign included) through the host FPU's
            # divide/multiply that the reference runs on; the GPU would return its
            # canonical positive NaN. The code depends on the NaN's sign, so keep x's.
            v = x
        if stoch:
            # encode_float_bits(..., True, r) in 32-bit arithmetic (bit for bit; tests/test_sr_encoder.py)
            return np.int64(encode_float_sr32(f32_bits(v), fmt[1], fmt[2], fmt[3], fmt[4], fmt[5], r))
        if cvt:
            if v != v:  # the instruction writes a canonical NaN; the spec keeps the sign
                return fmt[4] | ((f32_bits(v) >> 31) << 7)
            if fmt[8] == E4M3:
                return np.int64(cvt_e4m3(v))
            return np.int64(cvt_e5m2(v))
        return encode_float_rne(v, fmt[1], fmt[2], fmt[3], fmt[4], fmt[5])
    return encode_int_f32(v, fmt[6], fmt[7], stoch, r) & 0xFF


@devfn
def random_word(idx, key_lo, key_hi, cache):
    """Philox bits of element ``idx``; ``cache`` (int64[5] local array: block, 4 words)
    keeps the last block so a run of consecutive elements costs one Philox per 4."""
    blk = idx >> 2
    if cache[0] != blk:
        w0, w1, w2, w3 = philox4x32_10(blk & 0xFFFFFFFF, blk >> 32, key_lo, key_hi)
        cache[0] = blk
        cache[1] = w0
        cache[2] = w1
        cache[3] = w2
        cache[4] = w3
    return np.int64(cache[1 + (idx & 3)])


@devfn
def store_unit(codes, rowbase, c, q, ncols, pcols, nbits, packed):
    """Write the codes ``q[0..3]`` of columns c..c+3 of a row (c % 4 == 0 when packing;
    codes past ``ncols`` are 0) at ``codes[rowbase:]``: 8-bit (or unpacked) one per byte,
    4-bit two per byte (low nibble first), 6-bit four per three bytes (LSB first)."""
    if nbits == 8 or not packed:
        for j in range(4):
            if c + j < ncols:
                codes[np.uint64(rowbase + c + j)] = q[j] & 0xFF
    elif nbits == 4:
        b = c >> 1
        codes[np.uint64(rowbase + b)] = (q[0] & 0xF) | ((q[1] & 0xF) << 4)
        if b + 1 < pcols:
            codes[np.uint64(rowbase + b + 1)] = (q[2] & 0xF) | ((q[3] & 0xF) << 4)
    else:
        w = (q[0] & 0x3F) | ((q[1] & 0x3F) << 6) | ((q[2] & 0x3F) << 12) | ((q[3] & 0x3F) << 18)
        b = (c >> 2) * 3
        codes[np.uint64(rowbase + b)] = w & 0xFF
        codes[np.uint64(rowbase + b + 1)] = (w >> 8) & 0xFF
        codes[np.uint64(rowbase + b + 2)] = (w >> 16) & 0xFF


@devfn
def store_unit_wide(codes, c32, c16, wide, rowbase, c, q, ncols, pcols, nbits, packed):
    """store_unit, with one 32-bit store for four 8-bit codes (one 16-bit store for four
    4-bit codes) when ``wide`` (the views c32 = codes as uint32, c16 = as uint16 are valid
    and the codes array is 4-byte aligned) and the unit's bytes are aligned and in the row."""
    if nbits == 8 or not packed:
        off = rowbase + c
        if wide and (off & 3) == 0 and c + 3 < ncols:
            w = (q[0] & 0xFF) | ((q[1] & 0xFF) << 8) | ((q[2] & 0xFF) << 16) | ((q[3] & 0xFF) << 24)
            c32[np.uint64(off >> 2)] = np.uint32(w)
            return
    elif nbits == 4:
        off = rowbase + (c >> 1)
        if wide and (off & 1) == 0 and (c >> 1) + 1 < pcols:
            w = (q[0] & 0xF) | ((q[1] & 0xF) << 4) | ((q[2] & 0xF) << 8) | ((q[3] & 0xF) << 12)
            c16[np.uint64(off >> 1)] = np.uint16(w)
            return
    store_unit(codes, rowbase, c, q, ncols, pcols, nbits, packed)


@devfn
def load_code(codes, rowbase, c, nbits, packed):
    """The code of column ``c`` of a row stored at ``codes[rowbase:]`` (inverse of
    store_unit), as an unsigned int of ``nbits`` bits (8 bits when unpacked)."""
    if nbits == 8 or not packed:
        return np.int64(codes[np.uint64(rowbase + c)])
    if nbits == 4:
        byte = np.int64(codes[np.uint64(rowbase + (c >> 1))])
        return (byte >> (4 * (c & 1))) & 0xF
    b = rowbase + (c >> 2) * 3
    w = np.int64(codes[np.uint64(b)]) | (np.int64(codes[np.uint64(b + 1)]) << 8) | (np.int64(codes[np.uint64(b + 2)]) << 16)
    return (w >> (6 * (c & 3))) & 0x3F
