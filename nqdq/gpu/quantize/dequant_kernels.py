"""The dequantize kernels: float32 (or 16-bit) values of codes and their scales, the
arithmetic of ``reference.quantize.dequantize``. The launch plans (``plan.dequant_units_launch``,
``plan.dequant_element_launch``, ``dequant_plan``) pick the kernel and its constants.

=============================  ==================================================================
kernel                         does
=============================  ==================================================================
make_dequant_kernel            one element a thread, any shape: unpack, decode, scale; float32
make_dequant_units_kernel      16 bytes of codes a thread (where ``dequant_units_apply`` holds):
                               the same arithmetic per element, so the same bits; writes float32,
                               bfloat16 or float16 by 16-byte stores
f32_to_bf16_kernel             float32 -> bfloat16 bits, round to nearest even (after the element
                               kernel, for a bfloat16 result)
=============================  ==================================================================

An element's scale is found as the encode kernel finds it (``general.scale_row_index``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import float32, uint32
from ..runtime.backend import cuda

from ..device.codec import F32, ONE, ZERO, decode_e8m0, decode_float_code, decode_small_float, f32_bits, mul_rn
from ..device.elements import load_code
from ..device.scales import MODE_ASYM, MODE_CENTRED, MODE_MX, MODE_NVFP4
from ..ptx.convert import cvt_f16x2
from ..ptx.memory import as_u32, load_u32x4, store_u32x4
from .general import scale_row_index


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
    are ``block_cols`` columns wide: 8- or 4-bit codes, rows of whole 16-byte units, groups
    of whole 8-element chunks (the codes' and the output's addresses 16-byte aligned: the
    caller checks)."""
    per = {8: 16, 4: 32}.get(code_bits)
    return per is not None and C % per == 0 and block_cols % 8 == 0


DEQ_F32, DEQ_BF16, DEQ_F16 = 0, 1, 2  # what make_dequant_units_kernel writes


@lru_cache(maxsize=None)
def make_dequant_units_kernel(mode, fmt, symmetric, out_kind):
    """The dequant kernel's values by 16-byte units of codes: a thread reads one unit by a
    16-byte load (16 8-bit or 32 4-bit codes of a row), decodes it in chunks of 8 elements
    that share a scale (one scale read a chunk) and writes (``out_kind``) float32 words,
    bfloat16 bits rounded to nearest even as ``f32_to_bf16_kernel`` rounds, or float16 bits
    (``cvt_f16x2``: round to nearest even, as NumPy's cast), by 16-byte stores. The same
    arithmetic per element as make_dequant_kernel, so the same bits; where
    dequant_units_apply holds. A row's ``upr`` units are ``nseg`` segments of ``spu`` units
    (more than one where rows are few, so that every SM has work), a team of 2^tpr_log2
    threads a segment; ``bc_log2``: log2 of ``bc`` where it is a power of two (a shift for
    the chunk's scale column), else -1."""
    NBITS = fmt[5]
    IS_FLOAT = fmt[0] == 1
    EBITS, MBITS, NAN_STYLE = fmt[8], fmt[1], fmt[9]
    CHUNKS = 2 if NBITS == 8 else 4  # 8-element chunks a unit
    PER_WORD = 32 // NBITS
    MASK = (1 << NBITS) - 1
    HALF = 1 << (NBITS - 1)

    @cuda.jit
    def dequant_units(codes, rows, upr, nseg, spu, C, pcols, d1, d2, b0, b1, b2, bc, bc_log2, n1, n2, nc, scales, zps,
                      means, tscale, out, tpr_log2):
        cw = as_u32(codes)
        ow = as_u32(out)
        r = cuda.local.array(8, uint32)
        f = cuda.local.array(8, float32)
        tpr = 1 << tpr_log2
        lane = cuda.threadIdx.x & (tpr - 1)
        spb = cuda.blockDim.x >> tpr_log2
        for seg in range(cuda.blockIdx.x * spb + (cuda.threadIdx.x >> tpr_log2), rows * nseg, cuda.gridDim.x * spb):
            row = seg // nseg
            first_unit = (seg - row * nseg) * spu
            srow = scale_row_index(row, d1, d2, b0, b1, b2, n1, n2) * nc
            for cu in range(first_unit + lane, min(first_unit + spu, upr), tpr):
                w = load_u32x4(cw, (row * pcols >> 4) + cu)
                c0 = cu * (CHUNKS * 8)
                for k in range(CHUNKS):
                    c = c0 + 8 * k
                    si = np.uint64(srow + ((c >> bc_log2) if bc_log2 >= 0 else c // bc))
                    s = ONE
                    zp = ZERO
                    mean = ZERO
                    if mode == MODE_MX:
                        s = decode_e8m0(np.int64(scales[si]))
                    elif mode == MODE_NVFP4:
                        s = decode_float_code(np.int64(scales[si]), 4, 3, 1) * tscale[0]
                    else:
                        s = F32(scales[si])
                    if mode == MODE_ASYM:
                        zp = F32(np.int64(zps[si]))
                    if mode == MODE_CENTRED:
                        mean = means[si]
                    for j in range(8):
                        e = 8 * k + j
                        code = np.int64((w[e // PER_WORD] >> np.uint32(NBITS * (e % PER_WORD))) & MASK)
                        if IS_FLOAT:
                            val = decode_small_float(code, EBITS, MBITS, NAN_STYLE)
                        elif symmetric:
                            if code >= HALF:
                                code -= 1 << NBITS
                            val = F32(code)
                        else:
                            val = F32(code)
                        if mode == MODE_CENTRED:
                            res = mul_rn(val, s) + mean
                        elif mode == MODE_ASYM:
                            res = (val - zp) * s
                        else:
                            res = val * s
                        f[j] = res
                        b = f32_bits(res)
                        if out_kind == DEQ_BF16:
                            if (b & 0x7FFFFFFF) > 0x7F800000:
                                b = 0xFFC0 if (b >> 31) == 1 else 0x7FC0
                            else:
                                b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
                        r[j] = uint32(b)
                    first = row * C + c0 + 8 * k  # the chunk's first element
                    if out_kind == DEQ_BF16:
                        store_u32x4(ow, first >> 3, uint32(r[0] | (r[1] << 16)), uint32(r[2] | (r[3] << 16)),
                                    uint32(r[4] | (r[5] << 16)), uint32(r[6] | (r[7] << 16)))
                    elif out_kind == DEQ_F16:
                        store_u32x4(ow, first >> 3, cvt_f16x2(f[1], f[0]), cvt_f16x2(f[3], f[2]), cvt_f16x2(f[5], f[4]),
                                    cvt_f16x2(f[7], f[6]))
                    else:
                        store_u32x4(ow, first >> 2, r[0], r[1], r[2], r[3])
                        store_u32x4(ow, (first >> 2) + 1, r[4], r[5], r[6], r[7])

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
