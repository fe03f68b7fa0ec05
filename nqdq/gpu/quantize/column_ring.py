"""Per-channel (``column``) float scales in one pass through a shared-memory ring
(``column_ring``, ``choices.PerChannel.RING``): a work item is a stripe of W 16-byte unit
columns by a chunk of R rows; the amaxes of a stripe's P chunks meet in a workspace; a block
encodes its chunk once all P have arrived, holding its chunks in shared memory, so that it
keeps loading while it waits and encodes.

Persistent blocks of NT threads, each with a ring of D slots of one item (U units a
thread: ``D * U * NT * 16`` bytes of dynamic shared memory). Iteration k of a block:

1. thread 0 takes the next ticket (item k + D - 1) and looks once at the counter of item
   k's stripe (``ld.acquire``), both in flight at once; a block barrier; where the stripe
   is complete, the threads of its channels start loading its amaxes (``ld.relaxed``);
2. the block issues item k + D - 1's loads into the free slot with ``cp.async``
   (``ptx.mma.cp_async_unit``; zeros for units past the rows or channels), one commit group
   per item (empty past the last ticket);
3. it waits for the group of item k + L (``cp.async.wait_group D - 1 - L``: the D - 1 - L
   newer groups stay in flight), reduces its per-channel amaxes, adds them to the stripe's
   workspace by atomic max and arrives on the stripe's counter (a barrier, then thread 0's
   fence and atomic add);
4. if item k's stripe was not complete at step 1, the block first waits for all its loads
   and arrives every item it holds, then spins until it is and loads the amaxes;
5. it computes the stripe's scales as ``finalize`` does (chunk 0 writes them), encodes item
   k from its slot and writes the codes. Where every scale of a thread's 8 channels has a
   reciprocal, every element of those channels is finite (an inf or NaN would have made
   its channel's scale inf or NaN), so the units go straight to the reciprocal encoder
   (``encode_unit_cols_r``) with no per-unit check, and without the integer clip where the
   format's range holds every quotient (``rint_in_range``); a whole item's units (every
   row inside the data, the common case) as one straight-line block. Otherwise one copy
   of the general encode takes them.

So DRAM keeps D - 1 - L items a block in flight while the block waits and encodes, and a
stripe normally completes in the L iterations between a block's arrival and its encode.
The next iteration's first barrier separates this encode's reads of slot k from that
iteration's loads into it, so an iteration ends without a barrier.

Measured (H100, bf16 int8_column; the cluster kernel that now runs ahead of this one, and
the bound: docs/design/per-channel.md): 74-75 / 76 % of a D2D copy at 8192x8192 / 16384x7168 (93.3-94.0 /
155.8-157.6 us), against 51-55 % for the same design with the chunks in registers (not kept:
``choices.PerChannel``). Defaults: 128
threads, 8 units a thread, 3 slots, lag 1, 4 blocks an SM (48 KiB of ring each). The kernel
is latency-bound (16 warps an SM: its registers and shared memory allow no more; ncu: 34 M
warp instructions; about 40 % of its warps' stall samples wait at block barriers, on the
stripe's counter and amaxes or on the ticket, 22 % fall in the encode).

*Why it cannot deadlock* (the argument of CUB's decoupled look-back): tickets are taken in
order, stripe-major, by blocks that have started. A block
spins only in step 4, after arriving every item it holds, and nothing else a block does
waits on another block. If every running block were spinning, let s be the lowest
incomplete stripe: every issued ticket has arrived (held ones by the rule above, the rest
by blocks that finished), so s has a ticket not yet issued, and every ticket issued is
below it; a spinning block spins on its oldest item's stripe, which is therefore s. So
each running block holds a distinct ticket of s, and there are at most P - 1 of them. With
P <= the blocks that can be resident at once (``ring_launch`` bounds P by the SM count
times the blocks an SM holds) that cannot happen.

Under the CUDA simulator blocks run one after another, so only P = 1 runs there (a stripe
is complete at its own arrival); ``make_column_ring_kernel(..., force_wait=True)`` (tests)
takes step 4's wait path on every item, so the simulator covers it too.

Planned (rule ``column_ring`` of ``plan``) where ``available`` and ``ring_geometry`` fit and
the stripes take more than one chunk (any P where the caller chose the ring), unless the
cluster kernel (``column_cluster``, ahead of it) takes the shape; else the single-chunk or
the two-pass kernels of ``columns``.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import types
from ..runtime.backend import cuda

from ..device.codec import F32
from .columns import (# fmt: skip
    _expand, amax_bits, channel_scale, encode_unit_cols, encode_unit_cols_r, SMEM_PER_SM, rint_in_range, stage_sync,
    stripe_widths, unit_col_scales, units_inside, word_max,
)
from ..ptx.mma import cp_async_commit, cp_async_unit, cp_async_wait, ld_shared_u32x4, smem_addr
from ..ptx.convert import fp8_cvt_available, fp8_cvt_supports
from ..ptx.memory import array_addr, as_u16, as_u32, load_acquire_i32, load_relaxed_i32
from .units import unit_elems, vec_of
from ..runtime.target import SIMULATOR, devfn, device_has


# (NT, U, D, L): threads a block, units a thread an item, slots, lag. H100, bf16 int8_column:
# 128 threads, 8 units, 3 slots, lag 1 (the module docstring's figures).
RING_THREADS, RING_UNITS, RING_SLOTS, RING_LAG = (64, 2, 3, 1) if SIMULATOR else (128, 8, 3, 1)
RING_BLOCKS_PER_SM = 4  # resident blocks an SM is asked to hold (launch bounds; the smem fits them)
RING_P_MAX = 256  # chunks per stripe at most (and at most the resident blocks)
SMEM_RESERVED = 1024  # per resident block (the driver's)
_SLEEP = not SIMULATOR  # (the simulator has no nanosleep; with P = 1 it never spins)
_SLEEP_MAX_NS = 256  # the waiting thread's back-off doubles from 32 ns up to this


def workspace_words(C, S):
    """int32 words of the ring's workspace: C channel amaxes, S stripe counters, a ticket."""
    return C + S + 1


def ring_smem(NT, U, D):
    """Dynamic shared memory of a block: D slots of U units a thread."""
    return D * U * NT * 16


def static_smem(NT, vec):
    """The kernel's static shared arrays (red, scales, reciprocals, tickets), bytes."""
    return NT * vec * 4 + 2 * 32 * vec * 4 + 64


# The kernel's source: snippets for a slot's loads (STAGE), its arrival (ARRIVE) and the
# encode, with the lines marked "#U" repeated for each unit i < U ({i} replaced: straight-line
# code, every shared offset a constant) and {d} the slot's variable. W (the stripe width),
# NT, U, D and L are compile-time constants, so t % W, t // W and the row loops fold; the
# stripe of an item is a multiply-shift by P's reciprocal (``divp``); the shared window's
# base address is taken once (``ptx.mma.smem_addr``).
_STAGE = """
s_it = np.int64(tk[{d}])
if s_it < total:
    s_st = divp(s_it, pinv)
    s_uc = s_st * W + lu
    s_r0 = (s_it - s_st * P) * (U * RG) + rg
    s_nv = units_inside(rows, s_r0, s_uc, upr, LOG_RG, U)
    s_g = s_r0 * upr + s_uc
    s_sw = {d} * SLOT + t4
    if aligned:
        cp_async_unit(ring, sb, s_sw + {i} * NT * 4, x32, (s_g + {i} * ustep) * 4, {i} < s_nv)  #U
    else:
        stage_sync(ring, s_sw + {i} * NT * 4, x, x32, s_g + {i} * ustep, {i} < s_nv, kind)  #U
"""
_ARRIVE = """
a_st = divp(tk[{d}], pinv)
a_sw = {d} * SLOT + t4
a_m8 = (z, z, z, z, z, z, z, z)
a_m8 = word_max(a_m8, ld_shared_u32x4(ring, sb, a_sw + {i} * NT * 4), kind)  #U
for j in range(VEC):
    red[t, j] = amax_bits(a_m8[j], j, kind)
cuda.syncthreads()
if t < CH:
    a_m = z
    for a_gg in range(RG):
        a_m = max(a_m, red[(t // VEC) + a_gg * W, t % VEC])
    if a_st * CH + t < C:
        cuda.atomic.max(ws, a_st * CH + t, a_m)
cuda.syncthreads()
if t == 0:  # the block's atomics (ordered before it by the barrier) visible before the arrival
    cuda.threadfence()
    cuda.atomic.add(ws, C + a_st, np.int32(1))
arrived |= 1 << {d}
"""


ITEMS_MAX = 1 << 24  # items a launch may have (divp's range)


def p_reciprocal(P):
    """``pinv`` of divp for a divisor 1 <= P <= 256: ceil(2^32 / P)."""
    if not 1 <= P <= 256:
        raise ValueError(f"P = {P}: divp takes divisors 1 .. 256")
    return -(-(1 << 32) // P)


@devfn
def divp(a, pinv):
    """a // P for 0 <= a < ITEMS_MAX and pinv = p_reciprocal(P) (int64 result): with pinv =
    2^32 / P + e, 0 <= e < 1, a * pinv / 2^32 = a / P + a * e / 2^32, and a * e / 2^32 < 2^-8
    <= 1 / P, so the floor is that of a / P (a multiply and a shift instead of a division)."""
    return np.int64((np.uint64(a) * np.uint64(pinv)) >> np.uint64(32))


_RING_SRC = """
def column_ring(x, rows, upr, C, P, pinv, S, ws, scales, codes):
    t = cuda.threadIdx.x
    ring = cuda.shared.array(0, u32)  # (a Numba type: the simulator sizes dynamic arrays by it)
    red = cuda.shared.array((NT, VEC), np.int32)
    sc = cuda.shared.array(CH, np.float32)
    rcs = cuda.shared.array(CH, np.float32)
    tk = cuda.shared.array(D, np.int32)  # each slot's item (>= total: none)
    flag = cuda.shared.array(1, np.int32)
    sb = smem_addr(ring)
    lu = t % W
    rg = t // W
    t4 = t * 4
    total = S * P
    ustep = np.int64(RG) * upr  # units between a thread's units of an item
    z = np.int32(0)
    x32 = as_u32(x)
    c32 = as_u32(codes)
    c16 = as_u16(codes)
    aligned = (array_addr(x) & 15) == 0
    arrived = 0  # bit d: slot d's item has arrived (every thread keeps the same mask)
    for d in range(D - 1):  # items 0 .. D - 2 in flight
        if t == 0:
            tk[d] = cuda.atomic.add(ws, C + S, np.int32(1))
        cuda.syncthreads()
{STAGE_d}
        commit()
    wait_lag()
    for d in range(L):  # items 0 .. L - 1 arrive
        if tk[d] < total:
{ARRIVE_d}
    k = 0
    while True:
        sl = k % D
        nx = (k + D - 1) % D  # the slot item k - 1 left
        item = np.int64(tk[sl])
        stripe = divp(item, pinv)
        chunk = item - stripe * P
        if t == 0:  # the next ticket, and one look at item k's stripe: both in flight at once
            tk[nx] = cuda.atomic.add(ws, C + S, np.int32(1))
            flag[0] = 1 if not FORCE_WAIT and item < total and peek_acq(ws, C + stripe) >= P else 0
        cuda.syncthreads()
        arrived &= ~(1 << nx)
        ready = flag[0] == 1
        m = z
        if ready and t < CH and stripe * CH + t < C:  # the stripe's amaxes, loaded while k + L arrives
            m = peek(ws, stripe * CH + t)
{STAGE_nx}
        commit()
        wait_lag()  # item k + L's loads are complete
        la = (k + L) % D
        if tk[la] < total and (arrived >> la) & 1 == 0:
{ARRIVE_la}
        if item >= total:  # (tickets only grow: nothing after it either)
            break
        if not ready:  # every item held arrives before the block waits
            wait_all()
            for j1 in range(1, D):
                d = (k + j1) % D
                if tk[d] < total and (arrived >> d) & 1 == 0:
{ARRIVE_d3}
            if t == 0:
                ns = np.uint32(32)
                while peek_acq(ws, C + stripe) < P:
                    if SLEEP:
                        cuda.nanosleep(ns)
                    ns = min(ns * np.uint32(2), np.uint32(SLEEP_MAX_NS))
            cuda.syncthreads()
            if t < CH and stripe * CH + t < C:
                m = peek(ws, stripe * CH + t)
        if t < CH:
            channel_scale(m, t, stripe * CH + t, chunk == 0 and stripe * CH + t < C, sc, rcs, scales, MAXE)
        cuda.syncthreads()
        sv, rc, ok, okr = unit_col_scales(sc, rcs, lu * VEC, VEC)
        uc = stripe * W + lu
        r0 = chunk * (U * RG) + rg
        nv = units_inside(rows, r0, uc, upr, LOG_RG, U)
        g = r0 * upr + uc
        sw = sl * SLOT + t4
        if okr and nv == U:  # every unit inside: one basic block, the units interleaved
            encode_unit_cols_r(unit_elems(ld_shared_u32x4(ring, sb, sw + {i} * NT * 4), kind), sv, rc, g + {i} * ustep, codes, c16, c32, fmt, CVT, VEC, NB, NOCLIP)  #U
        elif okr:  # every scale finite with a reciprocal: so is every element of these channels
            if {i} < nv: encode_unit_cols_r(unit_elems(ld_shared_u32x4(ring, sb, sw + {i} * NT * 4), kind), sv, rc, g + {i} * ustep, codes, c16, c32, fmt, CVT, VEC, NB, NOCLIP)  #U
        else:  # a NaN / inf in a channel, a zero or out-of-range scale: the general encode, one copy
            for i in range(nv):
                e = unit_elems(ld_shared_u32x4(ring, sb, sw + i * NT * 4), kind)
                encode_unit_cols(e, sv, ok, g + i * ustep, codes, c16, c32, fmt, CVT, VEC, NB)
        # (the next iteration's first barrier, before its loads into slot sl, is the one that
        # separates them from this encode's reads; sc, rcs, flag and red are rewritten only
        # after further barriers)
        k += 1
"""


def _indent(src, n):
    return "\n".join(" " * n + ln if ln.strip() else ln for ln in src.strip("\n").splitlines())


def _ring_source(U):
    src = _RING_SRC
    for key, snip, d, n in (("{STAGE_d}", _STAGE, "d", 8), ("{ARRIVE_d}", _ARRIVE, "d", 12),
                            ("{STAGE_nx}", _STAGE, "nx", 8), ("{ARRIVE_la}", _ARRIVE, "la", 12),
                            ("{ARRIVE_d3}", _ARRIVE, "d", 20)):  # fmt: skip
        src = src.replace(key, _indent(snip.replace("{d}", d), n))
    return _expand(src, U)


@lru_cache(maxsize=None)
def make_column_ring_kernel(kind, fmt, max_elem, NT, W, U, D, L, packed, force_wait=False, bps=None):
    """Persistent blocks of NT threads over items of U units a thread of stripes W units
    wide (R = U * NT / W rows), a ring of D slots, arrivals L items ahead of the encode; the
    kernel carries its dynamic shared memory (``launch.dynamic_smem``). ``bps``: blocks an
    SM (launch bounds; RING_BLOCKS_PER_SM). ``force_wait``: step 4's wait path on every item
    (tests: the simulator's single block would otherwise never take it). Counters and amaxes are read by ``ld.relaxed`` /
    ``ld.acquire`` (by atomics measured no different); a whole item's units are encoded
    straight-line (H100, bf16 int8_column 8192x8192: 93.7 us against 94.7 with a branch a
    unit)."""
    bps = bps or RING_BLOCKS_PER_SM
    vec = vec_of(kind)
    RG = NT // W
    ns = dict(
        kind=kind, fmt=fmt, NT=NT, W=W, RG=RG, LOG_RG=RG.bit_length() - 1, U=U, D=D, L=L, VEC=vec, CH=W * vec,
        SLOT=U * NT * 4, NB=(fmt[5] if packed else 8),
        CVT=fp8_cvt_available() and fp8_cvt_supports(fmt), MAXE=F32(max_elem),
        NOCLIP=rint_in_range(fmt, F32(max_elem)),
        FORCE_WAIT=force_wait, SLEEP=_SLEEP, SLEEP_MAX_NS=_SLEEP_MAX_NS, u32=types.uint32,
        peek=load_relaxed_i32, peek_acq=load_acquire_i32,
        commit=cp_async_commit, wait_lag=cp_async_wait(D - 1 - L), wait_all=cp_async_wait(0),
    )  # fmt: skip
    src = _ring_source(U) + "\n"
    glb = dict(globals())
    glb.update(ns)
    # generated kernel source: why it is generated, see the note in quantize/unrolled.py
    exec(compile(src, f"<nqdq column_ring NT={NT} W={W} U={U} D={D} L={L}>", "exec"), glb)
    fn = glb["column_ring"]
    fn.source = src
    k = cuda.jit(fn) if SIMULATOR else cuda.jit(fn, launch_bounds=(NT, bps))
    k.nqdq_dynamic_smem = ring_smem(NT, U, D)
    return k


def ring_geometry(rows, upr, sms, vec, nt=None, units=None, slots=None):
    """(NT, W, U, D, L, P, S) of ``column_ring`` for ``rows`` rows of ``upr`` units: the
    widest stripes (``columns.stripe_widths``) whose chunks of R = U * NT / W rows
    cover the rows in P <= min(RING_P_MAX, resident blocks) chunks; None where none does,
    where the ring does not fit RING_BLOCKS_PER_SM blocks an SM, or where the items would
    reach ITEMS_MAX (divp's range; 256 GiB of input at least). ``sms``: the SM count
    (1 under the simulator, which runs one block at a time)."""
    NT = nt or RING_THREADS
    U = units or RING_UNITS
    D = slots or RING_SLOTS
    L = min(RING_LAG, D - 1)
    per_block = ring_smem(NT, U, D) + static_smem(NT, vec) + SMEM_RESERVED
    if not SIMULATOR and per_block * RING_BLOCKS_PER_SM > SMEM_PER_SM:
        return None
    p_max = min(RING_P_MAX, sms * (1 if SIMULATOR else RING_BLOCKS_PER_SM))
    for W in stripe_widths(upr, NT, vec):
        P = -(-rows // (U * NT // W))
        S = -(-upr // W)
        if P <= p_max:
            return (NT, W, U, D, L, P, S) if S * P < ITEMS_MAX else None
    return None


def available() -> bool:
    """The ring's ``cp.async`` loads on the current device: compute capability 8.0 or newer
    (the simulator, which runs their twins, and compile-only tools: yes; AMD: no, its
    per-channel scales take the kernels of ``columns``)."""
    return device_has((8, 0))


def ring_launch(kind, fmt, max_elem, packed, rows, C, sms, geometry, empty, x, scales, codes):
    """The launch ``(kernel, grid, block, args)`` of ``column_ring`` with ``geometry``
    (ring_geometry's, for ``sms`` SMs). Its workspace (workspace_words) is a "zero" slot of
    ``empty``."""
    vec = vec_of(kind)
    NT, W, U, D, L, P, S = geometry
    k = make_column_ring_kernel(kind, fmt, max_elem, NT, W, U, D, L, packed, bps=RING_BLOCKS_PER_SM)
    grid = min(S * P, sms * (1 if SIMULATOR else RING_BLOCKS_PER_SM))
    ws = empty(workspace_words(C, S), np.int32, "zero")
    return (k, grid, NT, (x, rows, C // vec, C, P, p_reciprocal(P), S, ws, scales, codes))


_ = (amax_bits, channel_scale, encode_unit_cols, encode_unit_cols_r, stage_sync, unit_col_scales, units_inside, word_max,
     cp_async_unit, ld_shared_u32x4, smem_addr, array_addr, as_u16, as_u32, unit_elems)  # used by the generated source
