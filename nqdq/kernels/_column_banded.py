"""Per-channel (``column``) float scales in one launch by column bands re-read from L2
(``column_banded``): the input is read from HBM once for the amaxes and once more from L2
for the codes, instead of being held in registers across a wait (``_column_kernels``'
one pass) or read twice from HBM (its two passes).

*Geometry* (``banded_geometry``). The C channels are stripes of W 16-byte units (all rows);
B consecutive stripes are a *band*, sized to about ``BAND_BYTES`` of input so that two
bands and the codes being written stay in L2 (H100: 50 MB). A stripe's rows are P chunks of
R = U * NT / W rows; a work *item* is (phase, stripe, chunk):

- phase 1: read the tile from HBM, per-channel amax over its rows (``word_max`` ->
  ``amax_bits``, reduced over the block in shared memory), ``atom.max`` into the stripe's C
  workspace words, fence, arrive (``atom.add``) on the stripe's counter. Never waits.
- phase 2: wait until the stripe's counter is P (all its phase-1 items done), read the
  amaxes back by atomics (L2, never a stale line), scales and reciprocals as ``finalize``
  computes them (``_scales.float_scale``, ``recip_guarded``; ``unit_col_scales``), re-read
  the tile (an L2 hit when the band is still resident) and write the codes
  (``encode_cols``: every NaN / inf / zero rule of the reference); chunk 0 of a stripe
  writes its scales.

Items of a band are numbered chunk-major (the blocks working on a band at once read whole
band-wide row segments). *Persistent* blocks (about the resident count) take items by one
atomic ticket, in band order with a lag of L bands:
``P1(0) .. P1(L-1), P1(L), P2(0), P1(L+1), P2(1), ..., P1(NB-1), P2(NB-1-L), P2(NB-L) .. P2(NB-1)``
(``item_of``): a phase-2 item's phase-1 items were ticketed a whole band (L bands) earlier,
so its wait is short, and its tile was read about (L + 1) bands of input ago.

*Why it cannot deadlock, without a cooperative launch and with any grid.* A block's first
act for every item is t = atomicAdd(ticket, 1); it finishes item t before it takes another.
Only phase-2 items wait, and only for phase-1 items of their own stripe, whose tickets are
LOWER (the order above). Every issued ticket is held by a block that is running (it took
the ticket while running and leaves only after finishing its item) or that has finished it.
Let t be the lowest ticket not yet finished: its block is running, and every item it could
wait for has a lower ticket, hence is finished; so item t completes. By induction every
issued ticket completes, and blocks keep taking tickets until all are issued. No residency
bound enters (unlike the one pass's P <= SM count): any number of rows fits.
Under the CUDA simulator blocks run one after another: the first block takes every ticket
in order, so each wait is already satisfied when it is reached (the simulator tests run the
whole item order, several bands and chunks, in one block).

*Measured: it does not pay* (H100, bf16 int8_column, docs/performance.md "Per-channel
scales by column bands re-read from L2"; every run whole-tensor bit-exact against the one
pass). Best configuration (the defaults below: 12 MiB bands, 3 blocks per SM, L2 hints,
8 phase-1 loads in flight): 140.4 us = 50 % of a D2D copy at 8192x8192 (one pass: 127.1 us,
55 %), 239.5 us = 50 % at 16384x7168 (221.0 us, 54 %); bands of 4-24 MiB, lag 2, 4 blocks
per SM, smaller items: 42-52 %. ncu (8192x8192): DRAM 55 % of peak moving about 269 MB
where 192 MB is the ideal (input once + codes): roughly 60 % of the phase-2 re-reads miss
L2 even with 12 MiB bands and evict_last / evict_first hints, while the one pass moves
188 MB at 38 % of peak; both are latency-bound (37 % / 25 % occupancy, register-limited by
the per-channel encode). Off (``quantize.COLUMN_BANDED``); kept reachable for A/B. Its GPU
tests (tests/test_column_banded_gpu.py, 17) and a compute-sanitizer memcheck passed (14:10).

The workspace is ``_column_kernels.onepass_workspace_words(C, S)`` words (C amaxes, S
stripe counters, the ticket), zero at the start of every call: a plan "zero" slot (a memset
in the call's stream, recorded by CUDA-graph capture too).
"""

from __future__ import annotations

import os
from functools import lru_cache

import numpy as np
from numba import cuda

from ._codec import F32, KIND_F32, bits_f32
from ._column_kernels import (
    _expand, amax_bits, encode_cols, onepass_workspace_words, unit_col_scales, word_max,
)  # fmt: skip
from ._division import RECIP_DIV, recip_guarded
from ._ptx import array_addr, fp8_cvt_available, fp8_cvt_supports
from ._rowwise_kernels import load_unit, unit_elems, vec_of
from ._scales import float_scale
from ._target import SIMULATOR, devfn

BANDED_THREADS = 64 if SIMULATOR else int(os.environ.get("NQDQ_COLUMN_BANDED_THREADS", "256"))
BANDED_WIDTHS = (32, 16, 8, 4)  # stripe widths W in units, widest first
# input bytes of a band (target). H100 14:00, 8192x8192: 8 / 12 / 16 / 24 MiB 158.1 / 159.9 /
# 159.4 / 164.4 us (2 blocks per SM, no hints); 14:03 with 3 blocks, hints, 8 phase-1 loads:
# 12 MiB 140.4 us, 8 / 4 MiB with U = 8 140.8 / 144.5 (16384x7168: 239.5; 245.4 / 230.0)
BAND_BYTES = int(float(os.environ.get("NQDQ_COLUMN_BAND_MB", "12")) * (1 << 20))
BANDED_UNITS = 16  # U: units a thread covers in an item (R = U * NT / W rows a chunk)
BANDED_LAG = 1  # L: phase 2 of band b is ticketed after phase 1 of band b + L (H100: 2 is 1-3 % slower)
# persistent blocks: SM count x this (also the launch bound). sm_90 registers (nvJitLink):
# 105 at 2 (no spill), 80 at 3 (60 bytes spilled), 64 at 4 (136 bytes spilled), bf16 int8.
# H100 2026-11-21 14:00 / 14:03, 8192x8192: 2: 159.9 us, 3: 148.8 (no hints); with hints and 8
# phase-1 loads 3: 140.4, 4: 147.7
BANDED_BLOCKS_PER_SM = 3
BANDED_IN_FLIGHT = 4  # loads a thread issues before it uses any, phase 2 (a compile-time unroll)
BANDED_IN_FLIGHT_P1 = 8  # the same in phase 1 (no encode: few registers live; H100: 8 > 4 by 2-3 %)
# L2 eviction hints (a compile-time switch, A/B only): 0 none; 1 phase-1 loads evict_last;
# 2 that and phase-2 re-reads evict_first (their last use). Hints change no value.
# H100 14:00, 8192x8192 / 16384x7168 at 2 blocks per SM: 0: 159.9 / 270.9 us, 2: 142.8 / 241.2.
BANDED_HINTS = int(os.environ.get("NQDQ_COLUMN_BANDED_HINTS", "2"))
_SLEEP = not SIMULATOR
_SLEEP_MAX_NS = 256


if SIMULATOR:

    def load_u32x4_hint(a, i, first):
        """Simulator twin: four consecutive words (a cache hint changes no value)."""
        j = 4 * int(i)
        return (a[j], a[j + 1], a[j + 2], a[j + 3])

else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from ._ptx import _elem_ptr

    @intrinsic
    def load_u32x4_hint(typingctx, a, i, first):
        """Words 4*i .. 4*i + 3 of the uint32 array ``a`` (16-byte aligned) by one
        ``ld.global.nc.L2::cache_hint.v4.u32`` under an L2 policy made by ``createpolicy``:
        evict_first where ``first`` (a literal bool), else evict_last."""
        if not isinstance(first, types.BooleanLiteral):
            return None
        prio = "evict_first" if first.literal_value else "evict_last"
        sig = types.UniTuple(types.uint32, 4)(a, i, first)

        def codegen(context, builder, sig, args):
            i4 = builder.mul(context.cast(builder, args[1], sig.args[1], types.int64), ir.Constant(ir.IntType(64), 4))
            ptr = _elem_ptr(context, builder, sig.args[0], args[0], i4, types.int64)
            i32 = ir.IntType(32)
            fty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [ptr.type])
            asm = ir.InlineAsm(fty, "{ .reg .b64 pol; createpolicy.fractional.L2::" + prio + ".b64 pol, 1.0; "
                               "ld.global.nc.L2::cache_hint.v4.u32 {$0, $1, $2, $3}, [$4], pol; }",
                               "=r,=r,=r,=r,l", side_effect=False)  # fmt: skip
            res = builder.call(asm, [ptr])
            vals = [builder.extract_value(res, k) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen


@devfn
def load_unit_p1(x, x32, aligned, unit, valid, kind, hints):
    """A phase-1 load: load_unit, evict_last in L2 where ``hints`` (BANDED_HINTS) >= 1."""
    if hints >= 1 and valid and aligned:
        return load_u32x4_hint(x32, unit, False)
    return load_unit(x, x32, aligned, unit, valid, kind)


@devfn
def load_unit_p2(x, x32, aligned, unit, valid, kind, hints):
    """A phase-2 re-read: load_unit, evict_first in L2 where ``hints`` >= 2."""
    if hints >= 2 and valid and aligned:
        return load_u32x4_hint(x32, unit, True)
    return load_unit(x, x32, aligned, unit, valid, kind)


def banded_geometry(rows, upr, vec=8, band_bytes=None, nt=None, units=None):
    """(NT, W, U, P, S, B, NB) of ``column_banded`` for ``rows`` rows of ``upr`` 16-byte
    units: NT threads a block, S stripes of W units (W * vec <= NT channels), chunks of
    R = U * NT / W rows (P a stripe), bands of B stripes (NB bands; the last may be partly
    outside the stripes: its missing items are no-ops). The (W, B) whose band is nearest to
    ``band_bytes`` (BAND_BYTES) of input, wider stripes on ties; one stripe of the narrowest
    width where even that exceeds it."""
    NT = nt or BANDED_THREADS
    U = units or BANDED_UNITS
    target = (band_bytes or BAND_BYTES) / (rows * 16)  # units of a band
    fits = [W for W in BANDED_WIDTHS if W * vec <= NT and (W < 2 * upr or W == BANDED_WIDTHS[-1])]
    if not fits:
        return None
    best = None
    for W in fits:  # widest first: a tie keeps the wider
        if target >= W or W == fits[-1]:
            B = max(1, int(target / W + 0.5))
            err = abs(B * W - target)
            if best is None or err < best[0]:
                best = (err, W, B)
    _, W, B = best
    S = -(-upr // W)
    B = min(B, S)
    NB = -(-S // B)
    B = -(-S // NB)  # even bands
    P = -(-rows // (U * NT // W))
    return NT, W, U, P, S, B, NB


def item_of(q, nbands, lag):
    """(phase 2?, band) of the q-th band segment of the ticket order (module docstring)."""
    if q < lag:
        return False, q
    if q < 2 * nbands - lag:
        j = q - lag
        if j % 2 == 0:
            return False, lag + j // 2
        return True, j // 2
    return True, q - nbands


def banded_launches(kind, fmt, max_elem, packed, rows, C, sms, empty, x, scales, codes, band_bytes=None):
    """The launch ``[(kernel, grid, block, args)]`` of ``column_banded`` over ``rows`` rows of
    C channels (a workspace "zero" slot from ``empty(n, dtype, role)``), or None where no
    stripe width fits."""
    vec = vec_of(kind)
    upr = C // vec
    g = banded_geometry(rows, upr, vec, band_bytes)
    if g is None:
        return None
    NT, W, U, P, S, B, NB = g
    lag = min(BANDED_LAG, NB)
    ws = empty(onepass_workspace_words(C, S), np.int32, "zero")
    grid = max(1, min(2 * NB * B * P, sms * BANDED_BLOCKS_PER_SM))
    k = make_column_banded_kernel(kind, fmt, max_elem, NT, packed, BANDED_IN_FLIGHT, BANDED_BLOCKS_PER_SM, BANDED_HINTS,
                                  BANDED_IN_FLIGHT_P1)
    return [(k, grid, NT, (x, rows, upr, C, W, U, P, S, B, NB, lag, ws, scales, codes))]


# The loads of a pass: BANDED_IN_FLIGHT(_P1) rows of a thread's unit column issued before any
# is used (lines marked "#U" / "#A" are repeated for i = 0 .. BANDED_IN_FLIGHT(_P1) - 1).
_BANDED_SRC = """
def column_banded(x, rows, upr, C, W, U, P, S, B, NB, lag, ws, scales, codes):
    t = cuda.threadIdx.x
    red = cuda.shared.array((NT, VEC), np.int32)  # per thread: its channels' amax bits
    sc = cuda.shared.array(CH_MAX, np.float32)  # the stripe's scales
    rcs = cuda.shared.array(CH_MAX, np.float32)  # and their reciprocals (0: divide instead)
    slot = cuda.shared.array(1, np.int32)
    RG = NT // W  # rows one pass of the block covers
    CH = W * VEC  # channels of a stripe
    R = U * RG  # rows of a chunk
    STEP = RG * IF  # rows of a phase-2 pass (IF loads in flight)
    STEP1 = RG * IF1  # and of a phase-1 pass
    I = B * P  # items of a band
    total = 2 * NB * I
    lu = t % W
    rg = t // W
    x32 = x[: (x.size >> SH) << SH].view(np.uint32)
    c32 = codes[: (codes.size >> 2) << 2].view(np.uint32)
    c16 = codes[: (codes.size >> 1) << 1].view(np.uint16)
    aligned = (array_addr(x) & 15) == 0
    z = np.int32(0)
    while True:
        if t == 0:
            slot[0] = cuda.atomic.add(ws, C + S, np.int32(1))  # the ticket
        cuda.syncthreads()
        tk = slot[0]
        cuda.syncthreads()  # (slot is rewritten next)
        if tk >= total:
            return
        q = tk // I
        i = tk - q * I
        if q < lag:  # item_of
            p2 = False
            band = q
        elif q < 2 * NB - lag:
            j = q - lag
            p2 = (j & 1) == 1
            band = j // 2 + (0 if p2 else lag)
        else:
            p2 = True
            band = q - NB
        chunk = i // B
        stripe = band * B + (i - chunk * B)
        if stripe >= S:  # a missing stripe of the last band
            continue
        uc = stripe * W + lu
        colok = uc < upr
        rbeg = chunk * R
        r1 = min(rows, rbeg + R)
        if not p2:
            a = (z, z, z, z, z, z, z, z)
            for r in range(rbeg + rg, r1, STEP1):
                w{i} = load_unit_p1(x, x32, aligned, (r + {i} * RG) * upr + uc, colok and r + {i} * RG < r1, kind, HINTS)  #A
                a = word_max(a, w{i}, kind)  #A
            for j in range(VEC):
                red[t, j] = amax_bits(a[j], j, kind)
            cuda.syncthreads()
            if t < CH and stripe * CH + t < C:  # the block's amax of channel t of the stripe
                m = np.int32(0)
                for g in range(RG):
                    m = max(m, red[t // VEC + g * W, t % VEC])
                cuda.atomic.max(ws, stripe * CH + t, m)
            cuda.threadfence()  # every thread's atomic max is visible before the arrival is
            cuda.syncthreads()  # (and red is rewritten by the next item only after this)
            if t == 0:
                cuda.atomic.add(ws, C + stripe, np.int32(1))
        else:
            if t == 0:
                ns = np.uint32(32)
                while cuda.atomic.add(ws, C + stripe, np.int32(0)) < P:
                    if SLEEP:
                        cuda.nanosleep(ns)
                    ns = min(ns * np.uint32(2), np.uint32(SLEEP_MAX_NS))
                cuda.threadfence()
            cuda.syncthreads()
            if t < CH:  # the stripe's amaxes, by atomics (L2, never stale); scales as finalize's
                m = np.int32(0)
                if stripe * CH + t < C:
                    m = cuda.atomic.max(ws, stripe * CH + t, np.int32(0))
                s = float_scale(bits_f32(np.uint32(m)), MAXE)
                sc[t] = s
                rcs[t] = recip_guarded(s)
                if chunk == 0 and stripe * CH + t < C:
                    scales[stripe * CH + t] = s
            cuda.syncthreads()
            sv, rc, ok, okr = unit_col_scales(sc, rcs, lu * VEC, RECIP, VEC)
            for r in range(rbeg + rg, r1, STEP):
                v{i} = colok and r + {i} * RG < r1  #U
                w{i} = load_unit_p2(x, x32, aligned, (r + {i} * RG) * upr + uc, v{i}, kind, HINTS)  #U
                if v{i}: encode_cols(unit_elems(w{i}, kind), sv, rc, ok, okr, (r + {i} * RG) * upr + uc, codes, c16, c32, fmt, CVT, VEC, NBITS)  #U
            cuda.syncthreads()  # (sc and rcs are rewritten by the next item)
"""


def banded_source(in_flight=None, in_flight_p1=None):
    src = _BANDED_SRC.replace("#A\n", "#P1\n").replace("#U\n", "#P2\n")
    src = _expand(src.replace("#P1\n", "#U\n"), in_flight_p1 or BANDED_IN_FLIGHT_P1)
    return _expand(src.replace("#P2\n", "#U\n"), in_flight or BANDED_IN_FLIGHT)


@lru_cache(maxsize=None)
def make_column_banded_kernel(kind, fmt, max_elem, NT, packed, in_flight=None, blocks_per_sm=None, hints=0,
                              in_flight_p1=None):
    """Persistent blocks of NT threads working through the ticket order of the module
    docstring; arguments: the geometry of ``banded_geometry``, the lag, the workspace."""
    ns = dict(
        kind=kind, fmt=fmt, NT=NT, VEC=vec_of(kind), NBITS=(fmt[5] if packed else 8),
        SH=0 if kind == KIND_F32 else 1, CVT=fp8_cvt_available() and fp8_cvt_supports(fmt), RECIP=RECIP_DIV,
        MAXE=F32(max_elem), CH_MAX=32 * vec_of(kind), SLEEP=_SLEEP, SLEEP_MAX_NS=_SLEEP_MAX_NS,
        IF=in_flight or BANDED_IN_FLIGHT, IF1=in_flight_p1 or BANDED_IN_FLIGHT_P1, HINTS=hints,
    )  # fmt: skip
    ns.update(float_scale=float_scale, bits_f32=bits_f32, recip_guarded=recip_guarded, load_unit=load_unit,
              unit_elems=unit_elems, word_max=word_max, amax_bits=amax_bits, encode_cols=encode_cols,
              unit_col_scales=unit_col_scales, array_addr=array_addr,
              load_unit_p1=load_unit_p1, load_unit_p2=load_unit_p2)  # (used only in the source)
    src = banded_source(in_flight, in_flight_p1) + "\n"
    glb = dict(globals())
    glb.update(ns)
    exec(compile(src, f"<nqdq column_banded IF={ns['IF']}>", "exec"), glb)
    fn = glb["column_banded"]
    fn.source = src
    bps = blocks_per_sm or BANDED_BLOCKS_PER_SM
    if bps and not SIMULATOR:
        return cuda.jit(fn, launch_bounds=(NT, bps))
    return cuda.jit(fn)
