"""Per-channel (``column``) float scales of a C-contiguous input, channel axis last: one scale
per last-axis index, the amax taken down all the leading rows (``reference/quantize``:
``s = amax / max_elem``, ``1`` where that is 0; codes ``encode(x / s)``).

The amax needs every row before any code can be written. Two of the plan's per-channel
designs live here (``choices.PerChannel``: which shapes take which, and their figures); the
other two, which read the input once at any size, are the cluster kernel
(``column_cluster``) and the shared-memory ring (``column_ring``), built on the device
functions below.

**Single chunk** (``column_onepass``, ``PerChannel.SINGLE_CHUNK``): one block per stripe of
W 16-byte unit columns holds every row of it in REGISTERS (U units per thread, NT threads:
U * NT / W >= rows), reduces the per-channel amaxes over its warps in shared memory, computes
the scales as ``finalize`` does (``scales.float_scale``) and their reciprocals, encodes the
units it still holds and writes the codes and the stripe's scales. One launch, no workspace,
no block waits for another; the input is read once. ``single_chunk_geometry`` gives the
narrowest stripes that hold the rows with at most ONEPASS_UNITS units a thread (the most
blocks for a small input), or None (more rows than a block holds).

**Two passes** (``column_amax`` -> ``finalize`` -> ``column_encode``, ``PerChannel.TWO_PASS``):
any number of rows on any device: ``column_amax`` reads the input once and leaves per-chunk
partial amaxes, ``finalize`` (``general``) turns them into scales, and ``column_encode`` reads
the input again and writes the codes (42-46 % of a copy: the input is read twice).

Both give a thread whole 16-byte *unit* columns (8 bf16 / f16 or 4 f32 channels): the
lanes of a warp read consecutive units of a row (coalesced 16-byte loads,
``lastaxis.load_unit``), and a thread's per-channel state (8 running amaxes, then 8 scales)
stays in registers. The element encode is ``lastaxis``' (every NaN rule; the finite encoders
where the unit and its scales are finite and the scales non-zero); in finite units x / s is
taken from the channel's reciprocal, computed once per chunk (``division``: the IEEE quotient
bit for bit).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from ..runtime.backend import cuda

from ..device.codec import F32, KIND_BF16, KIND_F32, ZERO, bits_f32, f16_bits_to_f32_bits, f32_bits
from ..device.division import div_by_recip, recip_guarded
from ..ptx.convert import fp8_cvt_available, fp8_cvt_supports
from ..ptx.memory import array_addr, as_u16, as_u32
from ..ptx.pairs import u16x2_max
from .encoders import enc, enc_finite, enc_finite_r, fp8_pair_rr, int_code_rint
from .reductions import abs_i32, unit_amax
from .units import FINITE, load_unit, pack4, store_packed, unit_elems, vec_of
from ..device.scales import MODE_FLOAT, float_scale
from ..runtime.target import SIMULATOR, devfn

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

    @cuda.jit
    def column_amax(x, rows, upr, rpc, part_i, part_a, part_b):
        uc = cuda.blockIdx.x * NT + cuda.threadIdx.x
        c = cuda.blockIdx.y
        x32 = as_u32(x)
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


def rint_in_range(fmt, max_elem):
    """Whether the integer codes of a dynamic per-channel scale need no clip (the finite
    encode then rounds the quotient and nothing else): ``fmt`` an integer format whose range
    holds [-max_elem, max_elem] with half a step to spare. Then for x in a channel of amax
    ``amax`` and s = RN(amax / max_elem) in recip_guarded's range (normal: within 2^-24 of
    amax / max_elem, relatively), |x / s| <= max_elem / (1 - 2^-24) and its rounding
    RN(x / s) <= max_elem * (1 + 2^-22) < hi + 0.5 (and > lo - 0.5): rint never leaves
    [lo, hi], so ``int_code_finite``'s clip is a no-op there. A compile-time test."""
    m = float(max_elem) * (1.0 + 2.0**-22)
    return fmt[0] == 0 and m < fmt[7] + 0.5 and -m > fmt[6] - 0.5


@devfn
def enc_col_r(xb, s, r, fmt, mask, noclip):
    """enc_finite_r of one element, or (``noclip``: rint_in_range holds) the rounded quotient
    without the clip."""
    if noclip:
        return np.uint32(int_code_rint(div_by_recip(bits_f32(xb), s, r)) & np.uint32(mask))
    return enc_finite_r(xb, s, r, fmt, mask)


@devfn
def encode_unit_cols_r(e, s, r, unit, c8, c16, c32, fmt, cvt, vec, nb, noclip):
    """encode_unit_cols of a finite unit whose channels' scales all have reciprocals r[j]
    (``recip_guarded`` != 0): x / s[j] by the reciprocal, bit for bit the IEEE quotient.
    The scales are dynamic (amax / max_elem down the column), so |x| <= s * max_elem *
    (1 + 2^-23) and div_by_recip's ratio condition holds without a check; ``noclip``
    (``rint_in_range`` of the format and max_elem): integer codes without the clip."""
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
    lo = pack4(enc_col_r(e[0], s[0], r[0], fmt, m, noclip), enc_col_r(e[1], s[1], r[1], fmt, m, noclip),
               enc_col_r(e[2], s[2], r[2], fmt, m, noclip), enc_col_r(e[3], s[3], r[3], fmt, m, noclip), nb)
    if vec == 8:
        hi = pack4(enc_col_r(e[4], s[4], r[4], fmt, m, noclip), enc_col_r(e[5], s[5], r[5], fmt, m, noclip),
                   enc_col_r(e[6], s[6], r[6], fmt, m, noclip), enc_col_r(e[7], s[7], r[7], fmt, m, noclip), nb)
    store_packed(lo, hi, unit, c8, c16, c32, vec, nb)


@devfn
def encode_cols(e, s, r, ok, okr, unit, c8, c16, c32, fmt, cvt, vec, nb):
    """A unit's codes: by the reciprocals where ``okr`` (every scale has one) and the unit is
    finite, else encode_unit_cols."""
    if okr and unit_amax(e, vec) < FINITE:
        encode_unit_cols_r(e, s, r, unit, c8, c16, c32, fmt, cvt, vec, nb, False)
    else:
        encode_unit_cols(e, s, ok, unit, c8, c16, c32, fmt, cvt, vec, nb)


@devfn
def scale_ok(s):
    return abs_i32(f32_bits(s)) < FINITE and s != ZERO


@devfn
def unit_col_scales(sc, rcs, j0, vec):
    """The scales and reciprocals of a unit's ``vec`` channels j0 .. (8-tuples; a 4-channel
    unit repeats its first), from a stripe's shared copies; ``ok``: every scale finite and
    non-zero; ``okr``: also every reciprocal in range."""
    s0, s1, s2, s3 = sc[j0], sc[j0 + 1], sc[j0 + 2], sc[j0 + 3]
    q0, q1, q2, q3 = rcs[j0], rcs[j0 + 1], rcs[j0 + 2], rcs[j0 + 3]
    s4, s5, s6, s7 = s0, s0, s0, s0
    q4, q5, q6, q7 = q0, q0, q0, q0
    if vec == 8:
        s4, s5, s6, s7 = sc[j0 + 4], sc[j0 + 5], sc[j0 + 6], sc[j0 + 7]
        q4, q5, q6, q7 = rcs[j0 + 4], rcs[j0 + 5], rcs[j0 + 6], rcs[j0 + 7]
    ok = scale_ok(s0) and scale_ok(s1) and scale_ok(s2) and scale_ok(s3)
    if vec == 8:
        ok = ok and scale_ok(s4) and scale_ok(s5) and scale_ok(s6) and scale_ok(s7)
    okr = ok and q0 != ZERO and q1 != ZERO and q2 != ZERO and q3 != ZERO
    if vec == 8:
        okr = okr and q4 != ZERO and q5 != ZERO and q6 != ZERO and q7 != ZERO
    return (s0, s1, s2, s3, s4, s5, s6, s7), (q0, q1, q2, q3, q4, q5, q6, q7), ok, okr


@lru_cache(maxsize=None)
def make_column_encode_kernel(kind, fmt, NT, packed):
    """Grid (ceil(units per row / NT), chunks): block (bx, c) encodes rows [c * rpc,
    (c + 1) * rpc) of units bx * NT + t with the scales of their channels."""
    VEC, NB = vec_of(kind), (fmt[5] if packed else 8)
    CVT = fp8_cvt_available() and fp8_cvt_supports(fmt)

    @cuda.jit
    def column_encode(x, rows, upr, rpc, scales, codes):
        uc = cuda.blockIdx.x * NT + cuda.threadIdx.x
        c = cuda.blockIdx.y
        if uc >= upr:
            return
        x32 = as_u32(x)
        c32 = as_u32(codes)
        c16 = as_u16(codes)
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
        # one reciprocal per channel for the whole chunk of rows (0: out of range)
        rc = (recip_guarded(s0), recip_guarded(s1), recip_guarded(s2), recip_guarded(s3),
              recip_guarded(s4), recip_guarded(s5), recip_guarded(s6), recip_guarded(s7))
        okr = ok and rc[0] != ZERO and rc[1] != ZERO and rc[2] != ZERO and rc[3] != ZERO
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


# ----------------------------------------------------------------------------- single chunk
ONEPASS_THREADS = 64 if SIMULATOR else 256  # threads per block of column_onepass
ONEPASS_UNITS = 16  # 16-byte units a thread holds in registers at most (U): 64 KiB per block
# Resident blocks per SM asked of ptxas (launch bounds; read when a kernel is built): 128
# registers a thread. Without, the bf16 kernel takes 132 at U = 16 (one 256-thread block
# per SM: nothing loads while it waits and encodes); with, it spills 40 bytes.
ONEPASS_MIN_BLOCKS = 2 * 256 // ONEPASS_THREADS
ONEPASS_WIDTHS = (32, 16, 8, 4)  # stripe widths W in units, widest (longest row segments) first


def stripe_widths(upr, NT, vec):
    """The stripe widths (units) of ONEPASS_WIDTHS a block of NT threads can take over rows
    of ``upr`` units, widest first: W * vec channels at most NT (a thread each for the
    scales), and none wider than 2 * upr (but the narrowest)."""
    widths = ONEPASS_WIDTHS  # (read per call: tests narrow it)
    return [W for W in widths if W * vec <= NT and (W < 2 * upr or W == widths[-1])]


def single_chunk_geometry(rows, upr, vec=8, nt=None):
    """(NT, W, U, S) of ``column_onepass`` for ``rows`` rows of ``upr`` units, or None where
    one block cannot hold a stripe's rows: NT threads per block, the narrowest stripes of W
    units (S of them) whose rows fit U <= ONEPASS_UNITS units a thread (U a power of two: few
    specialisations); ``vec``: channels per unit (a stripe's W * vec channels are at most NT)."""
    NT = nt or ONEPASS_THREADS
    for W in reversed(stripe_widths(upr, NT, vec)):
        U = -(-rows // (NT // W))
        if U <= ONEPASS_UNITS:
            return NT, W, 1 << max(U - 1, 0).bit_length(), -(-upr // W)
    return None


def single_chunk_launch(kind, fmt, max_elem, packed, rows, C, geometry, empty, x, scales, codes):
    """The launch ``(kernel, grid, block, args)`` of ``column_onepass`` over ``rows`` rows of C
    channels with ``geometry`` (single_chunk_geometry's): one block a stripe. ``empty(n, dtype,
    role)`` allocates (the plan recorder's: the kernel's unused ``ws`` argument, a dummy)."""
    NT, W, U, S = geometry
    k = make_column_onepass_kernel(kind, fmt, max_elem, NT, U, packed)
    return k, S, NT, (x, rows, C // vec_of(kind), C, W, 1, S, empty(1, np.int32, "dummy"), scales, codes)


SMEM_PER_SM = 228 * 1024  # H100 / H200: shared memory an SM holds


@devfn
def units_inside(rows, r0, uc, upr, log_rg, U):
    """How many of a thread's U units of an item lie inside the data: those of rows r0, r0 +
    RG, ... (RG = 2^log_rg) below ``rows``; none where its unit column uc is past the row's
    ``upr`` units. The loads (the rest of a shared slot gets zeros) and the encode stores
    exactly these (``column_ring``, ``column_cluster``)."""
    if uc >= upr:
        return np.int32(0)
    return np.int32(min(max(rows - r0 + ((1 << log_rg) - 1), 0) >> log_rg, U))


@devfn
def stage_sync(ring, si, x, x32, u, ok, kind):
    """Unaligned input: unit ``u`` loaded (element by element) and stored into the shared
    slot at word ``si`` (where an aligned input's unit goes by cp.async)."""
    w = load_unit(x, x32, False, u, ok, kind)
    ring[si] = w[0]
    ring[si + 1] = w[1]
    ring[si + 2] = w[2]
    ring[si + 3] = w[3]


@devfn
def word_max(a, w, kind):
    """Running per-channel max of |x|'s bits in the input's own width, straight from a unit's
    words ``w`` (no conversion, so the compiler keeps only the words live until the
    encode): f32 |x| bits; 16-bit inputs two 16-bit magnitudes a word, both halves by one
    ``max.u16x2`` (elements 2k and 2k + 1 share word k: a[2k] and a[2k + 1] hold the same
    running word). The order of |x| is the order of those bits (NaN above inf) in every
    width; ``amax_bits`` converts."""
    if kind == KIND_F32:
        return (max(a[0], abs_i32(w[0])), max(a[1], abs_i32(w[1])), max(a[2], abs_i32(w[2])), max(a[3], abs_i32(w[3])),
                a[4], a[5], a[6], a[7])  # fmt: skip
    m = np.uint32(0x7FFF7FFF)
    p0 = np.int32(u16x2_max(np.uint32(a[0]), w[0] & m))
    p1 = np.int32(u16x2_max(np.uint32(a[2]), w[1] & m))
    p2 = np.int32(u16x2_max(np.uint32(a[4]), w[2] & m))
    p3 = np.int32(u16x2_max(np.uint32(a[6]), w[3] & m))
    return p0, p0, p1, p1, p2, p2, p3, p3


@devfn
def amax_bits(m, j, kind):
    """float32 bits of channel j's max from word_max's ``m`` (exact for finite values and
    inf; a NaN stays above inf, which is all float_scale needs of it): a 16-bit input's
    channel j is the low (j even) or high half of m[j]."""
    if kind == KIND_F32:
        return np.int32(m)
    if kind == KIND_BF16:
        return np.int32(np.uint32(m) << np.uint32(16) if j % 2 == 0 else np.uint32(m) & np.uint32(0xFFFF0000))
    h = np.uint32(m) & np.uint32(0xFFFF) if j % 2 == 0 else np.uint32(m) >> np.uint32(16)
    return np.int32(f16_bits_to_f32_bits(np.int64(h)))


@devfn
def channel_scale(m, t, col, out, sc, rcs, scales, maxe):
    """Thread t's channel of a stripe: its scale from the amax bits ``m`` as ``finalize``
    computes it, and the scale's reciprocal (``recip_guarded``), into ``sc[t]`` / ``rcs[t]``;
    where ``out`` (the stripe's chunk 0, a channel inside the input) also into ``scales[col]``."""
    s = float_scale(bits_f32(np.uint32(m)), maxe)
    sc[t] = s
    rcs[t] = recip_guarded(s)
    if out:
        scales[col] = s


@devfn
def encode_finite_or_flag(e, s, r, okr, unit, c8, c16, c32, fmt, cvt, vec, nb, noclip, i):
    """encode_unit_cols_r of a finite unit when every scale has a reciprocal (``okr``) and 0;
    else nothing and bit i (the unit for the caller's general encode)."""
    if okr and unit_amax(e, vec) < FINITE:
        encode_unit_cols_r(e, s, r, unit, c8, c16, c32, fmt, cvt, vec, nb, noclip)
        return np.uint32(0)
    return np.uint32(1) << np.uint32(i)


# The kernel's source; the lines marked "#U" are repeated for i = 0 .. U - 1 ({i} replaced):
# each unit a variable of its own, so the chunk stays in registers (a local array indexed in
# loops is left in local memory by NVVM: 256 bytes of stack at U = 16). Block b takes stripe
# b // P, chunk b - stripe * P: with P = 1 (single_chunk_launch's) its stripe is b, chunk 0,
# and ``ws`` (a placeholder) is never read.
_ONEPASS_SRC = """
def column_onepass(x, rows, upr, C, W, P, S, ws, scales, codes):
    t = cuda.threadIdx.x
    red = cuda.shared.array((NT, VEC), np.int32)  # per thread: its channels' amax bits
    sc = cuda.shared.array(CH_MAX, np.float32)  # the stripe's scales
    rcs = cuda.shared.array(CH_MAX, np.float32)  # and their reciprocals (0: divide instead)
    RG = NT // W  # rows of a stripe one pass of the block covers
    CH = W * VEC  # channels of a stripe
    item = cuda.blockIdx.x
    stripe = item // P
    chunk = item - stripe * P
    lu = t % W
    rg = t // W
    uc = stripe * W + lu
    colok = uc < upr
    r0 = chunk * (U * RG) + rg
    x32 = as_u32(x)
    c32 = as_u32(codes)
    c16 = as_u16(codes)
    aligned = (array_addr(x) & 15) == 0
    z = np.int32(0)
    a = (z, z, z, z, z, z, z, z)
    v{i} = colok and r0 + {i} * RG < rows  #U
    w{i} = load_unit(x, x32, aligned, (r0 + {i} * RG) * upr + uc, v{i}, kind)  #U
    a = word_max(a, w{i}, kind)  #U
    for j in range(VEC):
        red[t, j] = amax_bits(a[j], j, kind)
    cuda.syncthreads()
    m = np.int32(0)
    if t < CH:  # the block's amax of channel t of the stripe (CH <= NT)
        for g in range(RG):
            m = max(m, red[t // VEC + g * W, t % VEC])
    cuda.syncthreads()  # (red is rewritten below)
    if t < CH:
        channel_scale(m, t, stripe * CH + t, chunk == 0 and stripe * CH + t < C, sc, rcs, scales, MAXE)
    cuda.syncthreads()
    s, rc, ok, okr = unit_col_scales(sc, rcs, lu * VEC, VEC)
    # finite units with reciprocals: encoded from registers; the rest flagged in ``slow``
    # and re-read below by one copy of the general encode (not U inlined copies of it)
    slow = np.uint32(0)
    if v{i}: slow |= encode_finite_or_flag(unit_elems(w{i}, kind), s, rc, okr, (r0 + {i} * RG) * upr + uc, codes, c16, c32, fmt, CVT, VEC, NB, NOCLIP, {i})  #U
    i = 0
    while slow != 0:  # a data-dependent trip count: never unrolled
        if slow & np.uint32(1):
            u = (r0 + i * RG) * upr + uc
            e = unit_elems(load_unit(x, x32, aligned, u, True, kind), kind)
            encode_unit_cols(e, s, ok, u, codes, c16, c32, fmt, CVT, VEC, NB)
        slow >>= np.uint32(1)
        i += 1
"""


def _expand(src, U):
    """Repeat the lines marked "#U" for i = 0 .. U - 1 ({i} replaced)."""
    lines = []
    for line in src.splitlines():
        if line.endswith("#U"):
            lines += [line[: -len("#U")].rstrip().replace("{i}", str(i)) for i in range(U)]
        else:
            lines.append(line)
    return "\n".join(lines)


@lru_cache(maxsize=None)
def make_column_onepass_kernel(kind, fmt, max_elem, NT, U, packed):
    """Grid S blocks of NT threads (``single_chunk_launch``): block b covers units b * W +
    t % W of rows t // W + i * NT / W (i < U) of every row, W (a power of two, 4 <= W <= 32,
    W * VEC <= NT) an argument."""
    ns = dict(
        kind=kind, fmt=fmt, NT=NT, U=U, VEC=vec_of(kind), NB=(fmt[5] if packed else 8),
        CVT=fp8_cvt_available() and fp8_cvt_supports(fmt), MAXE=F32(max_elem),
        NOCLIP=rint_in_range(fmt, F32(max_elem)), CH_MAX=32 * vec_of(kind),
    )  # fmt: skip
    src = _expand(_ONEPASS_SRC, U) + "\n"
    glb = dict(globals())
    glb.update(ns)
    # generated kernel source: why it is generated, see the note in quantize/unrolled.py
    exec(compile(src, f"<nqdq column_onepass U={U}>", "exec"), glb)
    fn = glb["column_onepass"]
    fn.source = src
    if ONEPASS_MIN_BLOCKS and not SIMULATOR:  # (the simulator's jit takes no launch bounds)
        return cuda.jit(fn, launch_bounds=(NT, ONEPASS_MIN_BLOCKS))
    return cuda.jit(fn)
