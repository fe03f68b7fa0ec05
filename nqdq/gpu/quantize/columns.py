"""Per-channel (``column``) float scales of a C-contiguous input, channel axis last: one scale
per last-axis index, the amax taken down all the leading rows (``reference/quantize``:
``s = amax / max_elem``, ``1`` where that is 0; codes ``encode(x / s)``).

The amax needs every row before any code can be written. Two designs live here; two more
are the defaults where their geometries fit: one cluster of blocks a stripe, the amax met in
the cluster's shared memory (``_column_cluster``, sm_90+, first), and the one pass with each
block's items in a shared-memory ring (``_column_ring``, where a stripe takes several
chunks).

**One pass** (``column_onepass``, the default where ``onepass_geometry`` fits): a work item
is (stripe of W 16-byte unit columns, chunk of R rows); its block loads the item into
REGISTERS (U units per thread, NT threads: R = U * NT / W rows), reduces per-channel
amaxes over its warps in shared memory, adds them to a per-stripe workspace by global
atomic max, arrives on the stripe's counter (fence, then atomic add) and waits until the
P chunks of its stripe have all arrived (one thread spins with a bounded back-off, then a
block barrier). It then reads the stripe's amaxes back (by atomics: never a stale cached
line), computes the scales as ``finalize`` does (``_scales.float_scale``) and their
reciprocals, encodes the units it still holds and writes the codes; chunk 0 of each
stripe writes the stripe's scales. The input is read once: bytes = input + codes + scales.
The workspace (``onepass_workspace_words``: C amaxes, S stripe counters, a ticket) is zero
at the start of every call: the plan allocates it as a "zero" slot, which its CuPy runner
zeroes with a memset in the call's stream before the launch (a memset node under CUDA-graph
capture) and its general path fills.

*Why it cannot deadlock without a cooperative launch.* A block does not use blockIdx: its
first act is t = atomicAdd(ticket, 1), and it works on item t, items numbered stripe-major
(item = stripe * P + chunk), as CUB's decoupled look-back does. Tickets are handed out in
the order blocks start, so when ticket t has been issued every ticket below it belongs to
a block that has started (it is resident, or has finished). Let s be the lowest stripe
with a chunk not yet finished. Blocks of stripes below s never wait again (their stripes
are complete) and leave. If stripe s still misses an arrival, its last ticket s * P + P -
1 is not yet issued, so no ticket above it is either: every resident waiting block
belongs to stripe s, at most P - 1 of them. With P <= the number of blocks that can be
resident at once, a slot is (or becomes) free, the next block starts, takes the next
ticket of stripe s, and so on until its P chunks have all arrived; then they all finish
and the argument repeats with s + 1. ``onepass_geometry`` bounds P by the device's SM
count (a block of this kernel fits on an SM by itself, so at least one per SM is resident
once other kernels' blocks leave; they never wait for ours) and by ``ONEPASS_P_MAX``.
Under the CUDA simulator blocks run one after another, so a wait across blocks would never
end there: the plans then take P = 1 (every stripe one chunk; its own arrival completes
it). Without the wait (``sync=False``, P = 1 on a GPU too: small inputs) the kernel skips
the workspace and is the only launch.

*Pipelined* (``_PIPE_SRC``, where its geometry fits): persistent blocks (about the resident
count) that each hold two items of 8 units a thread, and issue the next item's loads before
encoding the current one. A block never waits while an arrival of its own is pending: the
next item arrives before the wait, except when the current stripe is already complete
(then it arrives after the encode, which needs no wait), so the argument above holds with
"running blocks" for "started blocks"; a block holds at most two tickets of the lowest
incomplete stripe, so P <= 2 x the running blocks suffices.

Measured (H100, bf16, int8_column; the cluster kernel now ahead of these, and the bound of any
one-pass per-channel kernel: docs/design/per-channel.md):
51 / 53 % of a D2D copy at 8192x8192 / 16384x7168 per item, 55 / 54 % pipelined, against
42 / 46 % for the two passes; the blocks of a stripe load together and then encode together,
so loads and encodes overlap poorly (what the pipelined kernel starts to address).

**Two passes** (``column_amax`` -> ``finalize`` -> ``column_encode``): for shapes the one
pass does not cover (more rows than P chunks of R rows hold, ``COLUMN_ONEPASS`` off):
``column_amax`` reads the input once and leaves per-chunk partial amaxes, ``finalize``
(``_quantize_kernels``) turns them into scales, and ``column_encode`` reads the input
again and writes the codes (about 60 % of a copy at best: the input is read twice).

Both give a thread whole 16-byte *unit* columns (8 bf16 / f16 or 4 f32 channels): the
lanes of a warp read consecutive units of a row (coalesced 16-byte loads,
``_rowwise_kernels.load_unit``), and a thread's per-channel state (8 running amaxes, then
8 scales) stays in registers. The element encode is ``_rowwise_kernels``' (every NaN
rule; the finite encoders where the unit and its scales are finite and the scales
non-zero); in finite units x / s is taken from the channel's reciprocal, computed once
per chunk (``_division``: the IEEE quotient bit for bit).
"""

from __future__ import annotations

import os
from functools import lru_cache

import numpy as np
from ..runtime.backend import cuda

from ..device.codec import F32, KIND_BF16, KIND_F32, ZERO, bits_f32, f16_bits_to_f32_bits, f32_bits
from ..device.division import RECIP_DIV, div_by_recip, recip_guarded
from ..ptx import array_addr, as_u16, as_u32, fp8_cvt_available, fp8_cvt_supports, load_u32x4_ordered, u16x2_max
from .lastaxis import (# fmt: skip
    FINITE, abs_i32, enc, enc_finite, enc_finite_r, fp8_pair_rr, int_code_rint, load_unit, pack4, store_packed,
    unit_amax, unit_elems, vec_of,
)
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
def unit_col_scales(sc, rcs, j0, recip, vec):
    """The scales and reciprocals of a unit's ``vec`` channels j0 .. (8-tuples; a 4-channel
    unit repeats its first), from a stripe's shared copies; ``ok``: every scale finite and
    non-zero; ``okr``: also every reciprocal in range (``recip``: RECIP_DIV)."""
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
    okr = recip and ok and q0 != ZERO and q1 != ZERO and q2 != ZERO and q3 != ZERO
    if vec == 8:
        okr = okr and q4 != ZERO and q5 != ZERO and q6 != ZERO and q7 != ZERO
    return (s0, s1, s2, s3, s4, s5, s6, s7), (q0, q1, q2, q3, q4, q5, q6, q7), ok, okr


@lru_cache(maxsize=None)
def make_column_encode_kernel(kind, fmt, NT, packed):
    """Grid (ceil(units per row / NT), chunks): block (bx, c) encodes rows [c * rpc,
    (c + 1) * rpc) of units bx * NT + t with the scales of their channels."""
    VEC, NB = vec_of(kind), (fmt[5] if packed else 8)
    CVT = fp8_cvt_available() and fp8_cvt_supports(fmt)
    RECIP = RECIP_DIV

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


# ----------------------------------------------------------------------------- one pass
# threads per block of column_onepass (NQDQ_COLUMN_ONEPASS_THREADS: A/B on a GPU; read at import)
ONEPASS_THREADS = 64 if SIMULATOR else int(os.environ.get("NQDQ_COLUMN_ONEPASS_THREADS", "256"))
ONEPASS_UNITS = 16  # 16-byte units a thread holds in registers at most (U): 64 KiB per block
ONEPASS_P_MAX = 64  # chunks per stripe at most (each waits for all of them)
# Resident blocks per SM asked of ptxas (launch bounds; read when a kernel is built): 128
# registers a thread. Without, the bf16 kernel takes 132 at U = 16 (one 256-thread block
# per SM: nothing loads while it waits and encodes); with, it spills 40 bytes.
ONEPASS_MIN_BLOCKS = 2 * 256 // ONEPASS_THREADS
ONEPASS_WIDTHS = (32, 16, 8, 4)  # stripe widths W in units, widest (longest row segments) first
_SLEEP = not SIMULATOR  # (the simulator has no nanosleep; with P = 1 it never spins)
# (No L2 prefetch of a later ticket's chunk: one and two resident grids ahead measured slower,
# H100, bf16 int8 8192x8192 144 / 153 us against 135 us without.)
# The pipelined kernel (_PIPE_SRC) for P > 1 where its geometry fits: persistent blocks
# (ONEPASS_PIPE_BLOCKS, None: the SM count x ONEPASS_MIN_BLOCKS), each holding two items of
# ONEPASS_PIPE_UNITS units a thread. H100, bf16 8192x8192 / 16384x7168: 55 / 54 % of copy
# against 51 / 53 % one item a block.
ONEPASS_PIPE_UNITS = 8
ONEPASS_PIPE_BLOCKS = None


@devfn
def load_unit_ordered(x, x32, aligned, unit, valid, kind):
    """load_unit by load_u32x4_ordered (aligned input; element loads otherwise)."""
    if valid and aligned:
        return load_u32x4_ordered(x32, unit)
    return load_unit(x, x32, aligned, unit, valid, kind)
_SLEEP_MAX_NS = 256  # the waiting thread's back-off doubles from 32 ns up to this


def onepass_workspace_words(C, S):
    """int32 words of a one-pass workspace: C channel amaxes, S stripe counters, a ticket."""
    return C + S + 1


def stripe_widths(upr, NT, vec):
    """The stripe widths (units) of ONEPASS_WIDTHS a block of NT threads can take over rows
    of ``upr`` units, widest first: W * vec channels at most NT (a thread each for the
    scales), and none wider than 2 * upr (but the narrowest)."""
    widths = ONEPASS_WIDTHS  # (read per call: tests narrow it)
    return [W for W in widths if W * vec <= NT and (W < 2 * upr or W == widths[-1])]


def onepass_geometry(rows, upr, sms, p_max=None, nt=None, vec=8, units=None):
    """(NT, W, U, P, S) of ``column_onepass`` for ``rows`` rows of ``upr`` units, or None
    where it does not fit (the caller takes the two passes). NT threads per block, stripes
    of W units (S of them), U units per thread, P chunks of R = U * NT / W rows per stripe;
    ``sms``: resident blocks the wait may count on (the SM count; 1 under the simulator);
    ``vec``: channels per unit (a stripe's W * vec channels are at most NT).

    A single chunk per stripe (P = 1: no workspace, no wait) where rows fit one: the
    narrowest stripes that hold them with at most ONEPASS_UNITS units per thread (most
    blocks for a small input). Otherwise the widest stripes whose chunks of ONEPASS_UNITS
    units per thread (``units`` where given) cover the rows in P <= min(p_max, sms) chunks."""
    NT = nt or ONEPASS_THREADS
    p_max = min(ONEPASS_P_MAX if p_max is None else p_max, sms)
    fits = stripe_widths(upr, NT, vec)
    if not fits:
        return None
    for W in reversed(fits):  # P = 1: narrowest first
        rg = NT // W
        U = -(-rows // rg)
        if U <= ONEPASS_UNITS:
            U = 1 << max(U - 1, 0).bit_length()  # a power of two: few specialisations
            return NT, W, U, 1, -(-upr // W)
    units = units or ONEPASS_UNITS
    for W in fits:
        P = -(-rows // (units * NT // W))
        if P <= p_max:
            return NT, W, units, P, -(-upr // W)
    return None


def onepass_launches(kind, fmt, max_elem, packed, rows, C, sms, p_max, force_sync, empty, x, scales, codes, nt):
    """The launches ``(kernel, grid, block, args)`` of the one pass over ``rows`` rows of C
    channels, or None where onepass_geometry does not fit: ``column_onepass`` (pipelined
    where its geometry fits) with a zeroed workspace when P > 1 or ``force_sync``, else without.
    ``empty(n, dtype[, role])`` allocates (the plan recorder's; role "zero": zero at the
    launch); sms: onepass_geometry's."""
    vec = vec_of(kind)
    upr = C // vec
    g = onepass_geometry(rows, upr, sms, p_max, vec=vec, units=ONEPASS_PIPE_UNITS)
    pipe = g is not None and g[3] > 1
    if not pipe:  # one chunk per stripe, or too many of the pipelined kernel's: one item per block
        g = onepass_geometry(rows, upr, sms, p_max, vec=vec)
    if g is None:
        return None
    NT, W, U, P, S = g
    if P == 1 and not force_sync:
        k = make_column_onepass_kernel(kind, fmt, max_elem, NT, U, packed, False)
        return [(k, S, NT, (x, rows, upr, C, W, 1, S, empty(1, np.int32, "dummy"), scales, codes))]
    nw = onepass_workspace_words(C, S)
    ws = empty(nw, np.int32, "zero")
    if pipe or force_sync:
        grid = min(S * P, ONEPASS_PIPE_BLOCKS or sms * ONEPASS_MIN_BLOCKS)
        k = make_column_onepass_kernel(kind, fmt, max_elem, NT, U, packed, True, True)
        return [(k, grid, NT, (x, rows, upr, C, W, P, S, ws, scales, codes))]
    k = make_column_onepass_kernel(kind, fmt, max_elem, NT, U, packed, True)
    return [(k, S * P, NT, (x, rows, upr, C, W, P, S, ws, scales, codes))]


SMEM_PER_SM = 228 * 1024  # H100 / H200: shared memory an SM holds


@devfn
def units_inside(rows, r0, uc, upr, log_rg, U):
    """How many of a thread's U units of an item lie inside the data: those of rows r0, r0 +
    RG, ... (RG = 2^log_rg) below ``rows``; none where its unit column uc is past the row's
    ``upr`` units. The loads (the rest of a shared slot gets zeros) and the encode stores
    exactly these (``_column_ring``, ``_column_cluster``)."""
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
# loops is left in local memory by NVVM: 256 bytes of stack at U = 16).
_ONEPASS_SRC = """
def column_onepass(x, rows, upr, C, W, P, S, ws, scales, codes):
    t = cuda.threadIdx.x
    red = cuda.shared.array((NT, VEC), np.int32)  # per thread: its channels' amax bits
    sc = cuda.shared.array(CH_MAX, np.float32)  # the stripe's scales
    rcs = cuda.shared.array(CH_MAX, np.float32)  # and their reciprocals (0: divide instead)
    RG = NT // W  # rows of a stripe one pass of the block covers
    CH = W * VEC  # channels of a stripe
    slot = cuda.shared.array(1, np.int32)
    if SYNC:
        if t == 0:
            slot[0] = cuda.atomic.add(ws, C + S, np.int32(1))  # the ticket: this block's item
        cuda.syncthreads()
        item = slot[0]
    else:
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
    if SYNC:
        if t < CH and stripe * CH + t < C:
            cuda.atomic.max(ws, stripe * CH + t, m)
        cuda.threadfence()  # every thread's atomic max is visible before the arrival is
        cuda.syncthreads()
        if t == 0:
            cuda.atomic.add(ws, C + stripe, np.int32(1))
            ns = np.uint32(32)
            while cuda.atomic.add(ws, C + stripe, np.int32(0)) < P:
                if SLEEP:
                    cuda.nanosleep(ns)
                ns = min(ns * np.uint32(2), np.uint32(SLEEP_MAX_NS))
            cuda.threadfence()
        cuda.syncthreads()
        if t < CH and stripe * CH + t < C:  # the stripe's amaxes, by atomics (L2, never stale)
            m = cuda.atomic.max(ws, stripe * CH + t, np.int32(0))
    if t < CH:
        channel_scale(m, t, stripe * CH + t, chunk == 0 and stripe * CH + t < C, sc, rcs, scales, MAXE)
    cuda.syncthreads()
    s, rc, ok, okr = unit_col_scales(sc, rcs, lu * VEC, RECIP, VEC)
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


# The pipelined kernel (``pipe``): persistent blocks, two items in registers. Each iteration
# takes the next ticket and issues its loads (b{i}) before the current item (a{i}) is
# encoded, so a block's next chunk streams in while it encodes. The next item arrives after
# that encode only where the current stripe is complete at a first look (then the block
# never waits while an arrival of its own is pending: no dependency between blocks beyond
# the one-pass kernel's); otherwise (and always without LATE) before the wait.
# H100, arrival always after the encode except within one stripe: 29 / 22 %
# of copy (a stripe then completes only after the blocks holding its chunks have encoded
# their previous items: a chain across stripes).
_PIPE_ARRIVE = """
    m8 = (z, z, z, z, z, z, z, z)
    m8 = word_max(m8, {p}{i}, kind)  #U
    for j in range(VEC):
        red[t, j] = amax_bits(m8[j], j, kind)
    cuda.syncthreads()
    if t < CH:
        m = np.int32(0)
        for g in range(RG):
            m = max(m, red[t // VEC + g * W, t % VEC])
        if s{p} * CH + t < C:
            cuda.atomic.max(ws, s{p} * CH + t, m)
    cuda.threadfence()  # every thread's atomic max is visible before the arrival is
    cuda.syncthreads()
    if t == 0:
        cuda.atomic.add(ws, C + s{p}, np.int32(1))
"""
_PIPE_SRC = """
def column_onepass(x, rows, upr, C, W, P, S, ws, scales, codes):
    t = cuda.threadIdx.x
    red = cuda.shared.array((NT, VEC), np.int32)
    sc = cuda.shared.array(CH_MAX, np.float32)
    rcs = cuda.shared.array(CH_MAX, np.float32)
    slot = cuda.shared.array(2, np.int32)  # the ticket; whether the current stripe is complete
    RG = NT // W
    CH = W * VEC
    lu = t % W
    rg = t // W
    x32 = as_u32(x)
    c32 = as_u32(codes)
    c16 = as_u16(codes)
    aligned = (array_addr(x) & 15) == 0
    total = S * P
    z = np.int32(0)
    if t == 0:
        slot[0] = cuda.atomic.add(ws, C + S, np.int32(1))
    cuda.syncthreads()
    cur = slot[0]
    cuda.syncthreads()
    if cur >= total:
        return
    sa = cur // P
    ca = cur - sa * P
    uca = sa * W + lu
    r0a = ca * (U * RG) + rg
    va{i} = uca < upr and r0a + {i} * RG < rows  #U
    a{i} = load_unit_ordered(x, x32, aligned, (r0a + {i} * RG) * upr + uca, va{i}, kind)  #U
{ARRIVE_a}
    while True:
        if t == 0:
            slot[0] = cuda.atomic.add(ws, C + S, np.int32(1))
        cuda.syncthreads()
        nxt = slot[0]
        more = nxt < total
        sb = nxt // P
        cb = nxt - sb * P
        ucb = sb * W + lu
        r0b = cb * (U * RG) + rg
        vb{i} = more and ucb < upr and r0b + {i} * RG < rows  #U
        b{i} = load_unit_ordered(x, x32, aligned, (r0b + {i} * RG) * upr + ucb, vb{i}, kind)  #U
        if t == 0:  # one look at the current stripe: complete already?
            slot[1] = 1 if cuda.atomic.add(ws, C + sa, np.int32(0)) >= P else 0
        cuda.syncthreads()
        early = more and (sb == sa or slot[1] == 0 or not LATE)
        if early:
{ARRIVE_b_early}
        if t == 0:
            ns = np.uint32(32)
            while cuda.atomic.add(ws, C + sa, np.int32(0)) < P:
                if SLEEP:
                    cuda.nanosleep(ns)
                ns = min(ns * np.uint32(2), np.uint32(SLEEP_MAX_NS))
            cuda.threadfence()
        cuda.syncthreads()
        if t < CH:  # the stripe's amaxes, by atomics (L2, never stale); scales as finalize's
            m = np.int32(0)
            if sa * CH + t < C:
                m = cuda.atomic.max(ws, sa * CH + t, np.int32(0))
            channel_scale(m, t, sa * CH + t, ca == 0 and sa * CH + t < C, sc, rcs, scales, MAXE)
        cuda.syncthreads()
        sv, rc, ok, okr = unit_col_scales(sc, rcs, lu * VEC, RECIP, VEC)
        slow = np.uint32(0)
        if va{i}: slow |= encode_finite_or_flag(unit_elems(a{i}, kind), sv, rc, okr, (r0a + {i} * RG) * upr + uca, codes, c16, c32, fmt, CVT, VEC, NB, NOCLIP, {i})  #U
        i = 0
        while slow != 0:
            if slow & np.uint32(1):
                u = (r0a + i * RG) * upr + uca
                e = unit_elems(load_unit(x, x32, aligned, u, True, kind), kind)
                encode_unit_cols(e, sv, ok, u, codes, c16, c32, fmt, CVT, VEC, NB)
            slow >>= np.uint32(1)
            i += 1
        cuda.syncthreads()  # (sc, rcs and slot are rewritten next)
        if not more:
            break
        if not early:
{ARRIVE_b_late}
        a{i} = b{i}  #U
        va{i} = vb{i}  #U
        sa, ca, uca, r0a = sb, cb, ucb, r0b
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


def _pipe_source(U):
    def arrive(p, indent):
        body = _expand(_PIPE_ARRIVE.replace("{p}", p), U)
        return "\n".join(" " * indent + ln if ln.strip() else ln for ln in body.splitlines())

    src = _PIPE_SRC.replace("{ARRIVE_a}", arrive("a", 0)).replace("{ARRIVE_b_early}", arrive("b", 8))
    return _expand(src.replace("{ARRIVE_b_late}", arrive("b", 8)), U)


@lru_cache(maxsize=None)
def make_column_onepass_kernel(kind, fmt, max_elem, NT, U, packed, sync, pipe=False):
    """Grid S * P (sync) or S (P = 1, no sync) blocks of NT threads: the item (stripe,
    chunk) of a block covers units stripe * W + t % W of rows chunk * R + t // W + i * NT /
    W (i < U), W (a power of two, 4 <= W <= 32, W * VEC <= NT) an argument; see the module
    docstring for the wait. ``ws``: the workspace (onepass_workspace_words; unused without
    sync)."""
    ns = dict(
        kind=kind, fmt=fmt, NT=NT, U=U, VEC=vec_of(kind), NB=(fmt[5] if packed else 8),
        CVT=fp8_cvt_available() and fp8_cvt_supports(fmt), RECIP=RECIP_DIV, LATE=True,
        MAXE=F32(max_elem), NOCLIP=rint_in_range(fmt, F32(max_elem)), CH_MAX=32 * vec_of(kind), SYNC=sync, SLEEP=_SLEEP,
        SLEEP_MAX_NS=_SLEEP_MAX_NS,
    )  # fmt: skip
    src = (_pipe_source(U) if pipe else _expand(_ONEPASS_SRC, U)) + "\n"
    glb = dict(globals())
    glb.update(ns)
    exec(compile(src, f"<nqdq column_onepass U={U}{' pipe' if pipe else ''}>", "exec"), glb)
    fn = glb["column_onepass"]
    fn.source = src
    if ONEPASS_MIN_BLOCKS and not SIMULATOR:  # (the simulator's jit takes no launch bounds)
        return cuda.jit(fn, launch_bounds=(NT, ONEPASS_MIN_BLOCKS))
    return cuda.jit(fn)
