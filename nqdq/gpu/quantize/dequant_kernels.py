"""The dequantize kernels: float32 (or 16-bit) values of codes and their scales, the
arithmetic of ``reference.quantize.dequantize``. The launch plans (``plan.dequant_units_launch``,
``plan.dequant_element_launch``, ``dequant_plan``) pick the kernel and its constants.

=============================  ==================================================================
kernel                         does
=============================  ==================================================================
make_dequant_kernel            one element a thread, any shape: unpack, decode, scale; float32
make_dequant_units_kernel      a chunk of 16 bytes of results a thread a step, consecutive lanes
                               consecutive chunks (where ``dequant_units_apply`` holds): the
                               element kernel's bits; writes float32, bfloat16 or float16
f32_to_bf16_kernel             float32 -> bfloat16 bits, round to nearest even (after the element
                               kernel, for a bfloat16 result)
=============================  ==================================================================

An element's scale is found as the encode kernel finds it (``general.scale_row_index``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from ..runtime.backend import cuda

from ..device.codec import (F32, FLT_MAX, ONE, ZERO, bits_f32, decode_e8m0, decode_float_code, decode_small_float,
                            f32_bits, mul_rn)
from ..device.elements import load_code
from ..device.scales import MODE_ASYM, MODE_CENTRED, MODE_FLOAT, MODE_MX, MODE_NVFP4
from ..ptx.convert import cvt_bf16x2, cvt_f16x2
from ..ptx.memory import as_u16, as_u32, store_u32x4
from ..ptx.stochastic import mul_wide_u32
from ..runtime.target import SIMULATOR, devfn
from .general import scale_row_index

if SIMULATOR:

    def as_u64(a):
        """The array's whole 64-bit words as a uint64 view (``ptx.memory.as_u32``'s twin's way)."""
        k = a.size * a.dtype.itemsize // 8 * 8 // a.dtype.itemsize
        return a[:k].view(np.uint64)

else:
    from numba import types as _types

    from ..ptx.memory import _as_words

    as_u64 = _as_words(_types.uint64, 8)  # (memory.as_u32's view, 8-byte words: a chunk's 8 codes)


@lru_cache(maxsize=None)
def make_dequant_kernel(mode, fmt, symmetric, packed):
    """float32 values of (packed) codes of a (rows, C) view (reference quantize.dequantize)."""
    NBITS = fmt[5]
    IS_FLOAT = fmt[0] == 1
    EBITS, MBITS, NAN_STYLE = fmt[8], fmt[1], fmt[9]

    @cuda.jit
    def dequant(codes, rows, C, pcols, d1, d2, b0, b1, b2, bc, n1, n2, nc, scales, zps, means, tscale, out, tpr_log2):
        tpr = 1 << tpr_log2
        lane = cuda.threadIdx.x & (tpr - 1)
        rpb = cuda.blockDim.x >> tpr_log2
        for row in range(cuda.blockIdx.x * rpb + (cuda.threadIdx.x >> tpr_log2), rows, cuda.gridDim.x * rpb):
            srow = scale_row_index(row, d1, d2, b0, b1, b2, n1, n2) * nc
            for c in range(lane, C, tpr):
                code = load_code(codes, row * pcols, c, NBITS, packed)
                if IS_FLOAT:
                    val = decode_float_code(code, EBITS, MBITS, NAN_STYLE)
                elif symmetric:
                    width = NBITS if packed else 8
                    if code >= (1 << (width - 1)):
                        code -= 1 << width
                    val = F32(code)
                else:
                    val = F32(code)
                si = np.uint64(srow + c // bc)
                if mode == MODE_MX:
                    res = val * decode_e8m0(np.int64(scales[si]))
                elif mode == MODE_NVFP4:
                    res = val * (decode_float_code(np.int64(scales[si]), 4, 3, 1) * tscale[0])
                elif mode == MODE_CENTRED:
                    res = mul_rn(val, scales[si]) + means[si]
                elif mode == MODE_ASYM:
                    res = (val - F32(np.int64(zps[si]))) * scales[si]
                else:
                    res = val * scales[si]
                out[np.uint64(row * C + c)] = res

    return dequant


def dequant_units_apply(code_bits: int, C: int, block_cols: int) -> bool:
    """Whether :func:`make_dequant_units_kernel` decodes a (rows, C) view whose scale groups
    are ``block_cols`` columns wide: 8- or 4-bit codes, rows of whole 16-byte units of codes,
    groups of whole 8-element chunks, rows shorter than 2^30 elements (the scale column's
    multiply-shift; the codes' and the output's addresses 16-byte aligned: the caller
    checks)."""
    per = {8: 16, 4: 32}.get(code_bits)
    return per is not None and C % per == 0 and block_cols % 8 == 0 and C < 1 << 30


DEQ_F32, DEQ_BF16, DEQ_F16 = 0, 1, 2  # what make_dequant_units_kernel writes


def chunk_elems(out_kind) -> int:
    """Elements a thread of the unit kernel decodes a step: 16 bytes of results (8 bfloat16 /
    float16 values, 4 float32 ones)."""
    return 4 if out_kind == DEQ_F32 else 8


def column_divisor(d: int, n_max: int) -> tuple[int, int]:
    """``(m, sh)``: floor(n / d) == ((n * m) >> 32) >> sh for every 0 <= n <= n_max (d >= 3,
    n_max < 2^30): the unit kernel finds a chunk's scale column by a ``mul.wide.u32`` and a
    shift, not a division. Granlund and Montgomery 1994, theorem 4.2: with l = ceil(log2 d),
    N >= bits(n_max) and m = ceil(2^(N + l) / d), 2^(N + l) <= m d < 2^(N + l) + 2^l, which
    makes floor(m n / 2^(N + l)) = floor(n / d) for every n < 2^N. N = max(bits(n_max), 32 -
    l) <= 30 puts N + l at 32 or more and keeps m below 2^32 (m <= 2^(N + 1) + 1)."""
    assert d >= 3 and 0 <= n_max < 1 << 30, (d, n_max)
    lg = (d - 1).bit_length()
    N = max(n_max.bit_length(), 32 - lg)
    m = -(-(1 << (N + lg)) // d)
    assert m < 1 << 32
    return m, N + lg - 32


def _replicate(v: int, nbits: int) -> int:
    """``v`` in every ``nbits``-wide field of a 32-bit word."""
    return sum(v << (nbits * i) for i in range(32 // nbits))


_FAST, _TWO_MUL, _GENERAL = 0, 1, 2  # a chunk's decode (make_dequant_units_kernel)


@lru_cache(maxsize=None)
def make_dequant_units_kernel(mode, fmt, symmetric, out_kind, wide=False, step_scales=False):
    """The dequant kernel's values, a chunk of E = ``chunk_elems(out_kind)`` elements a thread
    a step: 8 for bfloat16 / float16 results (16 bytes by one ``st.global.v4.u32``; its codes
    8 bytes for 8-bit codes, 4 for 4-bit), 4 for float32 (16 bytes; codes 4 or 2 bytes). The
    lanes of a team take consecutive chunks, so a warp's loads and stores are contiguous (512
    bytes of results a store). Where ``dequant_units_apply`` holds.

    A row's ``cpr`` chunks are ``nseg`` segments of ``spc`` chunks (more than one where rows
    are few, so that every SM has work), a team of 2^tpr_log2 threads (at most a warp) a
    segment. Scale groups are ``gw`` chunks wide; a chunk's group column is ``((column *
    col_m) >> 32) >> col_sh`` (:func:`column_divisor`). ``step_scales`` (where ``gw``
    divides the team): each step of a lane lands in a new group, ``tpr / gw`` groups on, whose
    scale it reads; otherwise a lane decodes a group's scale once for its chunks in it (a
    row's scale once a segment). Index arithmetic is 32-bit unless ``wide`` (2^32 chunks or
    more).

    Each chunk takes one of three decodes, every one with the element kernel's bits:

    * fast (one multiply an element): float codes' fields moved into float32's places
      (``decode_small_float``'s bits before its multiply: the value times 2^-(127 - bias)),
      times K = 2^(127 - bias) * s. K * moved is the real number value * s, so the float32
      product is the same, whenever K is exact: |s| < 2^(bias + 1) (a float32 times a power
      of two is exact until it overflows, and K < 2^128 there). Integer codes are converted
      exactly and scaled as the element kernel scales them. Taken where the chunk has no NaN /
      inf code and the scale (and mean) is finite (and that small, float codes): no result is
      NaN then, so bfloat16 is ``cvt.rn.bf16x2.f32``, whose bits are the round-to-nearest-even
      of ``f32_to_bf16_kernel`` for every non-NaN float32, subnormals and overflow included;
    * two multiplies (float codes, 2^(bias + 1) <= |s| finite): (moved * 2^(127 - bias)) * s,
      the code's value first, as ``decode_small_float`` then the element kernel compute it;
    * general (a NaN / inf code, a non-finite scale or mean): the element kernel's decode,
      and bfloat16 by ``f32_to_bf16_kernel``'s rule (NaN: the quiet NaN of its sign).

    float16 is ``cvt.rn.f16x2.f32`` on every path (NaN: the instruction's canonical NaN).

    One function because its device functions are closures over the constants computed here,
    which NVVM folds (every format, mode, output and path branch resolved in the PTX)."""
    NBITS = fmt[5]
    IS_FLOAT = fmt[0] == 1
    EBITS, MBITS, NAN_STYLE = fmt[8], fmt[1], fmt[9]
    BF16 = out_kind == DEQ_BF16
    E = chunk_elems(out_kind)
    E_LOG2 = E.bit_length() - 1
    LOAD_BYTES = E * NBITS // 8  # a chunk's codes: 8, 4 or 2 bytes
    PER_WORD = 32 // NBITS  # codes a 32-bit word
    MASK = (1 << NBITS) - 1
    HALF = 1 << (NBITS - 1)
    U32, U64 = np.uint32, np.uint64
    IX = np.uint64 if wide else np.uint32  # chunks, rows, segments, scale indices
    NVFP4 = mode == MODE_NVFP4
    # float codes have float32, MX or NVFP4 scales (value * s), MX and NVFP4 float codes: the schemes allow no other
    assert mode in (MODE_FLOAT, MODE_MX, MODE_NVFP4) if IS_FLOAT else mode not in (MODE_MX, MODE_NVFP4), (mode, fmt)
    BIAS = (1 << (EBITS - 1)) - 1 if IS_FLOAT else 0
    REBIAS = F32(2.0 ** (127 - BIAS)) if IS_FLOAT else ONE  # decode_small_float's multiplier
    FOLD_MAX = F32(2.0 ** (BIAS + 1))  # |s| below it: K = s * REBIAS is exact
    # the fast float decode: the code at the word's top, shifted right arithmetically so that
    # its exponent field lands in float32's low exponent bits (the sign copied down), masked
    # to sign, exponent and mantissa
    SAR = 8 - EBITS if IS_FLOAT else 0
    MOVE_MASK = U32(0x80000000 | ((HALF - 1) << (32 - NBITS - SAR))) if IS_FLOAT else U32(0)
    # NaN / inf codes (e4m3fn: every magnitude bit set; e5m2: every exponent bit set): a code
    # is one iff (code & M) + (HALF - M) reaches the field's top bit, and no field carries into
    # the next, so one add tests a word's (or a 64-bit load's) fields at once
    CHECK = IS_FLOAT and NAN_STYLE != 0
    SPECIAL = (HALF - 1) if NAN_STYLE == 1 else ((1 << EBITS) - 1) << MBITS
    SPEC = tuple(U32(_replicate(v, NBITS)) for v in (SPECIAL, HALF - SPECIAL, HALF))
    SPEC64 = tuple(U64(int(v) * 0x100000001) for v in SPEC)
    ALWAYS_FAST = not IS_FLOAT and not BF16  # integer codes: only bfloat16's NaN rule needs the general decode
    view = {8: as_u64, 4: as_u32, 2: as_u16}[LOAD_BYTES]

    @devfn
    def group_scale(scales, zps, means, si, ts):
        """(K, s, zp, mean, code, fast, two) of scale group ``si``: the fast path's factor, the
        scale (MX: decoded from ``code`` by the chunks off the fast path), zero point, mean,
        and whether the fast and the two-multiply decodes may take its chunks (by the scale;
        the codes are checked per chunk)."""
        zp = mean = s = ZERO
        code = np.int64(0)
        if mode == MODE_MX:  # K = 2^(code - 127) * REBIAS, exactly, where fast (code 0: 2^-127, the same formula)
            code = np.int64(scales[si])
            K = bits_f32(U32(U32(code + (127 - BIAS)) << U32(23)))
            return K, s, zp, mean, code, code <= 127 + BIAS, code != 0xFF
        if NVFP4:  # (decode_small_float: decode_float_code's float32 for every e4m3 code)
            s = decode_small_float(np.int64(scales[si]), 4, 3, 1) * ts
        else:
            s = F32(scales[si])
        if mode == MODE_ASYM:
            zp = F32(np.int64(zps[si]))
        finite = abs(s) <= FLT_MAX
        if mode == MODE_CENTRED:
            mean = means[si]
            finite = finite and abs(mean) <= FLT_MAX
        if IS_FLOAT:
            return s * REBIAS, s, zp, mean, code, abs(s) < FOLD_MAX, finite
        return s, s, zp, mean, code, ALWAYS_FAST or finite, False

    @devfn
    def element(w, p, K, s, zp, mean, path):
        """float32 result of the code in field ``p`` of word ``w`` by the chunk's decode."""
        if path == _GENERAL:
            code = np.int64((w >> U32(NBITS * p)) & U32(MASK))
            if IS_FLOAT:
                val = decode_small_float(code, EBITS, MBITS, NAN_STYLE)
            elif symmetric:
                if code >= HALF:
                    code -= 1 << NBITS
                val = F32(code)
            else:
                val = F32(code)
        else:
            x = U32(w << U32(32 - NBITS * (p + 1)))  # the code in the word's top bits
            if IS_FLOAT:
                moved = bits_f32(U32(U32(np.int32(x) >> np.int32(SAR)) & MOVE_MASK))
                return moved * K if path == _FAST else (moved * REBIAS) * s
            if symmetric:
                val = F32(np.int32(np.int32(x) >> np.int32(32 - NBITS)))
            else:
                val = F32(U32(x >> U32(32 - NBITS)))
        if mode == MODE_CENTRED:
            return mul_rn(val, s) + mean
        if mode == MODE_ASYM:
            return (val - zp) * s
        return val * s

    @devfn
    def bf16_general(r):
        """f32_to_bf16_kernel's bits of float32 ``r`` (NaN: the quiet NaN of its sign)."""
        b = f32_bits(r)
        if (b & 0x7FFFFFFF) > 0x7F800000:
            return U32(0xFFC0 if (b >> 31) == 1 else 0x7FC0)
        return U32(((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF)

    @devfn
    def pair(lo, hi, path):
        """The word of two 16-bit results (``lo`` in bits 0-15)."""
        if out_kind == DEQ_F16:
            return cvt_f16x2(hi, lo)
        if path == _GENERAL:
            return U32(bf16_general(lo) | (bf16_general(hi) << U32(16)))
        return cvt_bf16x2(hi, lo)  # (no NaN on these paths)

    @devfn
    def chunk(w0, w1, K, s, zp, mean, code, path):
        """The 4 result words of a chunk whose codes are the words w0 (elements 0 ..) and w1."""
        if mode == MODE_MX and path != _FAST:
            s = decode_e8m0(code)
        if E == 4:
            r0 = element(w0, 0, K, s, zp, mean, path)
            r1 = element(w0, 1, K, s, zp, mean, path)
            r2 = element(w0, 2, K, s, zp, mean, path)
            r3 = element(w0, 3, K, s, zp, mean, path)
            return U32(f32_bits(r0)), U32(f32_bits(r1)), U32(f32_bits(r2)), U32(f32_bits(r3))
        wb = w1 if PER_WORD == 4 else w0  # elements 4-7: the second word's 8-bit codes, w0's high 4-bit ones
        q = 0 if PER_WORD == 4 else 4
        r0 = element(w0, 0, K, s, zp, mean, path)
        r1 = element(w0, 1, K, s, zp, mean, path)
        r2 = element(w0, 2, K, s, zp, mean, path)
        r3 = element(w0, 3, K, s, zp, mean, path)
        r4 = element(wb, q, K, s, zp, mean, path)
        r5 = element(wb, q + 1, K, s, zp, mean, path)
        r6 = element(wb, q + 2, K, s, zp, mean, path)
        r7 = element(wb, q + 3, K, s, zp, mean, path)
        return pair(r0, r1, path), pair(r2, r3, path), pair(r4, r5, path), pair(r6, r7, path)

    @devfn
    def step(cv, ow, g, K, s, zp, mean, code, fast, two):
        """Chunk ``g``: its codes loaded, decoded by the path its codes and scale allow, stored."""
        clean = True
        if LOAD_BYTES == 8:
            v = cv[g]
            w0 = U32(v & U64(0xFFFFFFFF))
            w1 = U32(v >> U64(32))
            if CHECK:
                clean = U64(U64(U64(v & SPEC64[0]) + SPEC64[1]) & SPEC64[2]) == U64(0)
        else:
            w0 = U32(cv[g])
            w1 = U32(0)
            if CHECK:
                clean = U32(U32(U32(w0 & SPEC[0]) + SPEC[1]) & SPEC[2]) == U32(0)
        if clean and fast:
            o0, o1, o2, o3 = chunk(w0, w1, K, s, zp, mean, code, _FAST)
        elif IS_FLOAT and clean and two:
            o0, o1, o2, o3 = chunk(w0, w1, K, s, zp, mean, code, _TWO_MUL)
        else:
            o0, o1, o2, o3 = chunk(w0, w1, K, s, zp, mean, code, _GENERAL)
        store_u32x4(ow, g, o0, o1, o2, o3)

    @devfn
    def scale_row(row, d1, d2, b0, b1, b2, n1, n2):
        """``general.scale_row_index`` in IX arithmetic."""
        i2 = IX(row % d2)
        r01 = IX(row // d2)
        i1 = IX(r01 % d1)
        i0 = IX(r01 // d1)
        return IX(IX(IX(IX(i0 // b0) * n1) + IX(i1 // b1)) * n2 + IX(i2 // b2))

    @cuda.jit
    def dequant_units(codes, rows, cpr, nseg, spc, d1, d2, b0, b1, b2, n1, n2, nc, gw, col_m, col_sh, scales, zps,
                      means, tscale, out, tpr_log2):
        cv = view(codes)
        ow = as_u32(out)
        ts = tscale[0] if NVFP4 else ONE
        t = U32(tpr_log2)
        lane = IX(U32(cuda.threadIdx.x) & U32((U32(1) << t) - U32(1)))
        tpr = IX(IX(1) << IX(t))
        spb = IX(U32(cuda.blockDim.x) >> t)
        nsegs = IX(IX(rows) * IX(nseg))
        cprx, nsegx, spcx, gwx = IX(cpr), IX(nseg), IX(spc), IX(gw)
        m32, sh32 = U32(col_m), U32(col_sh)
        dsc = IX(tpr // gwx) if step_scales else IX(0)  # groups a lane's step moves on
        seg = IX(IX(cuda.blockIdx.x) * spb + IX(U32(cuda.threadIdx.x) >> t))
        while seg < nsegs:
            row = seg
            first = IX(0)
            if nsegx != IX(1):
                row = IX(seg // nsegx)
                first = IX(IX(seg - row * nsegx) * spcx)
            end = min(IX(first + spcx), cprx)
            srow = IX(scale_row(row, IX(d1), IX(d2), IX(b0), IX(b1), IX(b2), IX(n1), IX(n2)) * IX(nc))
            base = IX(row * cprx)
            g = IX(base + first + lane)  # the lane's chunk (of the whole view)
            gend = IX(base + end)
            if step_scales:
                sc = U32(U32(mul_wide_u32(U32(U32(g - base) << U32(E_LOG2)), m32) >> U64(32)) >> sh32)
                si = IX(srow + IX(sc))
                while g < gend:
                    K, s, zp, mean, code, fast, two = group_scale(scales, zps, means, si, ts)
                    step(cv, ow, g, K, s, zp, mean, code, fast, two)
                    g = IX(g + tpr)
                    si = IX(si + dsc)
            else:
                while g < gend:
                    # the group of chunk g: its scale decoded once for the lane's chunks in it
                    sc = U32(U32(mul_wide_u32(U32(U32(g - base) << U32(E_LOG2)), m32) >> U64(32)) >> sh32)
                    stop = min(IX(base + IX(IX(sc + U32(1)) * gwx)), gend)
                    K, s, zp, mean, code, fast, two = group_scale(scales, zps, means, IX(srow + IX(sc)), ts)
                    while True:
                        step(cv, ow, g, K, s, zp, mean, code, fast, two)
                        g = IX(g + tpr)
                        if g >= stop:
                            break
            seg = IX(seg + IX(IX(cuda.gridDim.x) * spb))

    return dequant_units


@cuda.jit
def f32_to_bf16_kernel(src, dst, n):
    """float32 -> bfloat16 bits, round to nearest even (NaN -> quiet NaN of the same sign)."""
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        u = f32_bits(src[e])
        if (u & 0x7FFFFFFF) > 0x7F800000:
            dst[e] = 0xFFC0 if (u >> 31) == 1 else 0x7FC0
        else:
            dst[e] = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
