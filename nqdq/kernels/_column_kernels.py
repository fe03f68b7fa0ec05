"""Per-channel (``column``) float scales of a C-contiguous input, channel axis last: one scale
per last-axis index, the amax taken down all the leading rows (``reference/quantize``:
``s = amax / max_elem``, ``1`` where that is 0; codes ``encode(x / s)``).

The amax needs every row before any code can be written, so this is two streaming passes
(the issue's byte count caps it near 60 % of a copy): ``column_amax`` reads the input once
and leaves per-chunk partial amaxes, ``finalize`` (``_quantize_kernels``) turns them into
scales, and ``column_encode`` reads the input again and writes the codes.

Both passes give a thread one 16-byte *unit* column (8 bf16 / f16 or 4 f32 channels) and a
chunk of rows: the lanes of a warp read consecutive units of a row (coalesced 16-byte
loads, ``_rowwise_kernels.load_unit``), and a thread's per-channel state (8 running amaxes,
then 8 scales) stays in registers for its whole chunk. ``ROWS_IN_FLIGHT`` rows are loaded
before any is used. The element encode is ``_rowwise_kernels``' (every NaN rule; the finite
encoders where the unit and its scales are finite and the scales non-zero); in finite units
x / s is taken from the channel's reciprocal, computed once per chunk (``_division``: the
IEEE quotient bit for bit).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda

from ._codec import KIND_F32, ZERO, f32_bits
from ._division import RECIP_DIV, recip_guarded
from ._ptx import array_addr, fp8_cvt_available, fp8_cvt_supports
from ._rowwise_kernels import (
    FINITE, abs_i32, enc, enc_finite, enc_finite_r, fp8_pair_rr, load_unit, pack4, store_packed, unit_amax, unit_elems, vec_of,
)  # fmt: skip
from ._scales import MODE_FLOAT
from ._target import devfn

ROWS_IN_FLIGHT = 4  # rows of a thread's unit column loaded before any is used


@devfn
def lane_max(a, e, vec):
    """Running per-channel amax (float32 bits of |x|, NaN above +inf) of one unit."""
    a0 = max(a[0], abs_i32(e[0]))
    a1 = max(a[1], abs_i32(e[1]))
    a2 = max(a[2], abs_i32(e[2]))
    a3 = max(a[3], abs_i32(e[3]))
    if vec == 8:
        return (a0, a1, a2, a3, max(a[4], abs_i32(e[4])), max(a[5], abs_i32(e[5])),
                max(a[6], abs_i32(e[6])), max(a[7], abs_i32(e[7])))  # fmt: skip
    return a0, a1, a2, a3, a[4], a[5], a[6], a[7]


@lru_cache(maxsize=None)
def make_column_amax_kernel(kind, NT):
    """Grid (ceil(units per row / NT), chunks): block (bx, c) reads rows [c * rpc, (c + 1)
    * rpc) of units bx * NT + t and writes, for each of their channels j, part_i[c * C + j]
    (amax bits; part_a = part_b = 0, unused by finalize's float branch)."""
    VEC = vec_of(kind)
    SH = 0 if kind == KIND_F32 else 1

    @cuda.jit
    def column_amax(x, rows, upr, rpc, part_i, part_a, part_b):
        uc = cuda.blockIdx.x * NT + cuda.threadIdx.x
        c = cuda.blockIdx.y
        x32 = x[: (x.size >> SH) << SH].view(np.uint32)
        aligned = (array_addr(x) & 15) == 0
        z = np.int32(0)
        a = (z, z, z, z, z, z, z, z)
        if uc < upr:
            r0 = c * rpc
            r1 = min(rows, r0 + rpc)
            for r in range(r0, r1, ROWS_IN_FLIGHT):
                w0 = load_unit(x, x32, aligned, r * upr + uc, True, kind)
                w1 = load_unit(x, x32, aligned, (r + 1) * upr + uc, r + 1 < r1, kind)
                w2 = load_unit(x, x32, aligned, (r + 2) * upr + uc, r + 2 < r1, kind)
                w3 = load_unit(x, x32, aligned, (r + 3) * upr + uc, r + 3 < r1, kind)
                a = lane_max(a, unit_elems(w0, kind), VEC)  # missing rows load zeros: no change
                a = lane_max(a, unit_elems(w1, kind), VEC)
                a = lane_max(a, unit_elems(w2, kind), VEC)
                a = lane_max(a, unit_elems(w3, kind), VEC)
            base = np.uint64(c) * np.uint64(upr * VEC) + np.uint64(uc * VEC)
            for j in range(VEC):
                part_i[base + np.uint64(j)] = a[j]
                part_a[base + np.uint64(j)] = ZERO
                part_b[base + np.uint64(j)] = ZERO

    return column_amax


@devfn
def encode_unit_cols(e, s, ok, unit, c8, c16, c32, fmt, cvt, vec, nb):
    """Encode a unit whose element j has its own scale s[j]; ``ok``: every s[j] finite and
    non-zero (then a unit of finite elements takes the finite encoders)."""
    m = (1 << nb) - 1
    hi = np.uint32(0)
    if ok and unit_amax(e, vec) < FINITE:
        lo = pack4(enc_finite(e[0], s[0], MODE_FLOAT, fmt, cvt, m), enc_finite(e[1], s[1], MODE_FLOAT, fmt, cvt, m),
                   enc_finite(e[2], s[2], MODE_FLOAT, fmt, cvt, m), enc_finite(e[3], s[3], MODE_FLOAT, fmt, cvt, m), nb)
        if vec == 8:
            hi = pack4(enc_finite(e[4], s[4], MODE_FLOAT, fmt, cvt, m), enc_finite(e[5], s[5], MODE_FLOAT, fmt, cvt, m),
                       enc_finite(e[6], s[6], MODE_FLOAT, fmt, cvt, m), enc_finite(e[7], s[7], MODE_FLOAT, fmt, cvt, m), nb)
    else:
        lo = pack4(enc(e[0], s[0], MODE_FLOAT, fmt, cvt, m), enc(e[1], s[1], MODE_FLOAT, fmt, cvt, m),
                   enc(e[2], s[2], MODE_FLOAT, fmt, cvt, m), enc(e[3], s[3], MODE_FLOAT, fmt, cvt, m), nb)
        if vec == 8:
            hi = pack4(enc(e[4], s[4], MODE_FLOAT, fmt, cvt, m), enc(e[5], s[5], MODE_FLOAT, fmt, cvt, m),
                       enc(e[6], s[6], MODE_FLOAT, fmt, cvt, m), enc(e[7], s[7], MODE_FLOAT, fmt, cvt, m), nb)
    store_packed(lo, hi, unit, c8, c16, c32, vec, nb)


@devfn
def encode_unit_cols_r(e, s, r, unit, c8, c16, c32, fmt, cvt, vec, nb):
    """encode_unit_cols of a finite unit whose channels' scales all have reciprocals r[j]
    (``recip_guarded`` != 0): x / s[j] by the reciprocal, bit for bit the IEEE quotient.
    The scales are dynamic (amax / max_elem down the column), so |x| <= s * max_elem *
    (1 + 2^-23) and div_by_recip's ratio condition holds without a check."""
    if cvt:
        lo = fp8_pair_rr(e[0], e[1], s[0], s[1], r[0], r[1], fmt) | (
            fp8_pair_rr(e[2], e[3], s[2], s[3], r[2], r[3], fmt) << np.uint32(16))
        hi = np.uint32(0)
        if vec == 8:
            hi = fp8_pair_rr(e[4], e[5], s[4], s[5], r[4], r[5], fmt) | (
                fp8_pair_rr(e[6], e[7], s[6], s[7], r[6], r[7], fmt) << np.uint32(16))
        store_packed(np.uint32(lo), np.uint32(hi), unit, c8, c16, c32, vec, nb)
        return
    m = (1 << nb) - 1
    hi = np.uint32(0)
    lo = pack4(enc_finite_r(e[0], s[0], r[0], fmt, m), enc_finite_r(e[1], s[1], r[1], fmt, m),
               enc_finite_r(e[2], s[2], r[2], fmt, m), enc_finite_r(e[3], s[3], r[3], fmt, m), nb)
    if vec == 8:
        hi = pack4(enc_finite_r(e[4], s[4], r[4], fmt, m), enc_finite_r(e[5], s[5], r[5], fmt, m),
                   enc_finite_r(e[6], s[6], r[6], fmt, m), enc_finite_r(e[7], s[7], r[7], fmt, m), nb)
    store_packed(lo, hi, unit, c8, c16, c32, vec, nb)


@devfn
def encode_cols(e, s, r, ok, okr, unit, c8, c16, c32, fmt, cvt, vec, nb):
    """A unit's codes: by the reciprocals where ``okr`` (every scale has one) and the unit is
    finite, else encode_unit_cols."""
    if okr and unit_amax(e, vec) < FINITE:
        encode_unit_cols_r(e, s, r, unit, c8, c16, c32, fmt, cvt, vec, nb)
    else:
        encode_unit_cols(e, s, ok, unit, c8, c16, c32, fmt, cvt, vec, nb)


@devfn
def scale_ok(s):
    return abs_i32(f32_bits(s)) < FINITE and s != ZERO


@lru_cache(maxsize=None)
def make_column_encode_kernel(kind, fmt, NT, packed):
    """Grid (ceil(units per row / NT), chunks): block (bx, c) encodes rows [c * rpc,
    (c + 1) * rpc) of units bx * NT + t with the scales of their channels."""
    VEC, NB = vec_of(kind), (fmt[5] if packed else 8)
    SH = 0 if kind == KIND_F32 else 1
    CVT = fp8_cvt_available() and fp8_cvt_supports(fmt)
    RECIP = RECIP_DIV

    @cuda.jit
    def column_encode(x, rows, upr, rpc, scales, codes):
        uc = cuda.blockIdx.x * NT + cuda.threadIdx.x
        c = cuda.blockIdx.y
        if uc >= upr:
            return
        x32 = x[: (x.size >> SH) << SH].view(np.uint32)
        c32 = codes[: (codes.size >> 2) << 2].view(np.uint32)
        c16 = codes[: (codes.size >> 1) << 1].view(np.uint16)
        aligned = (array_addr(x) & 15) == 0
        j0 = uc * VEC
        s0, s1, s2, s3 = scales[j0], scales[j0 + 1], scales[j0 + 2], scales[j0 + 3]
        s4, s5, s6, s7 = s0, s0, s0, s0
        if VEC == 8:
            s4, s5, s6, s7 = scales[j0 + 4], scales[j0 + 5], scales[j0 + 6], scales[j0 + 7]
        s = (s0, s1, s2, s3, s4, s5, s6, s7)
        ok = scale_ok(s0) and scale_ok(s1) and scale_ok(s2) and scale_ok(s3)
        if VEC == 8:
            ok = ok and scale_ok(s4) and scale_ok(s5) and scale_ok(s6) and scale_ok(s7)
        # one reciprocal per channel for the whole chunk of rows (RECIP_DIV; 0: out of range)
        rc = (recip_guarded(s0), recip_guarded(s1), recip_guarded(s2), recip_guarded(s3),
              recip_guarded(s4), recip_guarded(s5), recip_guarded(s6), recip_guarded(s7))
        okr = RECIP and ok and rc[0] != ZERO and rc[1] != ZERO and rc[2] != ZERO and rc[3] != ZERO
        if VEC == 8:
            okr = okr and rc[4] != ZERO and rc[5] != ZERO and rc[6] != ZERO and rc[7] != ZERO
        r0 = c * rpc
        r1 = min(rows, r0 + rpc)
        for r in range(r0, r1, ROWS_IN_FLIGHT):
            u0, u1, u2, u3 = r * upr + uc, (r + 1) * upr + uc, (r + 2) * upr + uc, (r + 3) * upr + uc
            w0 = load_unit(x, x32, aligned, u0, True, kind)
            w1 = load_unit(x, x32, aligned, u1, r + 1 < r1, kind)
            w2 = load_unit(x, x32, aligned, u2, r + 2 < r1, kind)
            w3 = load_unit(x, x32, aligned, u3, r + 3 < r1, kind)
            encode_cols(unit_elems(w0, kind), s, rc, ok, okr, u0, codes, c16, c32, fmt, CVT, VEC, NB)
            if r + 1 < r1:
                encode_cols(unit_elems(w1, kind), s, rc, ok, okr, u1, codes, c16, c32, fmt, CVT, VEC, NB)
            if r + 2 < r1:
                encode_cols(unit_elems(w2, kind), s, rc, ok, okr, u2, codes, c16, c32, fmt, CVT, VEC, NB)
            if r + 3 < r1:
                encode_cols(unit_elems(w3, kind), s, rc, ok, okr, u3, codes, c16, c32, fmt, CVT, VEC, NB)

    return column_encode


def column_geometry(rows, upr, nt=128):
    """(NT, grid, rows per chunk): enough blocks to fill an H100 (~4 per SM) with at least
    ``ROWS_IN_FLIGHT`` rows per thread."""
    NT = 32
    while NT < min(nt, 128) and NT < upr:
        NT *= 2
    bx = -(-upr // NT)
    want = max(1, -(-528 // bx))  # chunks for ~528 blocks
    rpc = max(ROWS_IN_FLIGHT, -(-rows // want))
    rpc = -(-rpc // ROWS_IN_FLIGHT) * ROWS_IN_FLIGHT
    return NT, (bx, -(-rows // rpc)), rpc
