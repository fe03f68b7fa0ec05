"""The fused row kernel (launcher: ``nqdq.gpu.fused.plan.run_rows``; spec: ``reference/fused``).

One block of NT = 32 * NW threads per row, laid out as reference/fused.row_geometry says
(a function of the row length only): thread t holds the row's 8-element units t, t + NT,
..., t + NT * (U - 1) in registers from the load to the store, the way the row-wise quantize
kernels (``quantize.lastaxis``) do:

* a unit is read by one 16-byte ``ld.global.nc.v4.u32`` (two for float32) and kept as its
  raw words (a bfloat16 unit is 4 registers); a row whose units are not 16-byte aligned
  (n % 8 != 0, odd strides or addresses) is read element by element into the same words:
  the same values, the same order, only slower (``fast=False``);
* the residual (optional) is added per element and the new residual leaves in two 8-byte
  stores per unit;
* RMSNorm's sum of squares in float64, in the spec's order (reference/fused.row_sum_sq):
  each element converted to float64 and squared (exact), a unit's 8 squares added in element
  order and the thread's units in order, in registers; the 32 lanes by a butterfly of
  ``shfl.sync.bfly`` (fl64 addition is commutative, so each lane of a pair gets the tree's
  value); the warps by one shared slot each, one barrier, then every thread adds the NW sums
  in order, splits the sum into the float32 pair (hi, lo) and computes 1/sqrt itself (no
  second barrier); for MX outputs thread 0 alone does, and the other warps
  read the result after a second barrier;
* the amax of y's units by ``max.NaN.f32`` of |.|;
* quantize: per row (a butterfly max and one more barrier), per 1x128 / MX-32 group (no
  barrier: for float and MX "rceil" scales the thread's U unit amaxes go through one
  transposed butterfly over the group's 16 / 4 lanes, each group's parameters are computed by
  the one lane its amax ends on and sent back by ``shfl.sync.idx``; for the other MX scale
  roundings and the bfloat16 words' path, a butterfly and the parameters per unit on every
  lane) or a static scale; finite units take
  the row-wise kernels' finite encoders (paired cvt for fp8, grid rounding for e2m1) and
  leave in one 8-byte (fp8) or 4-byte (fp4) store, everything else encode_element per element.

The MoE sort's rows (no norm) come in two forms: OP_GATHER, one block per sorted row reading
its token (perm), and OP_SCATTER (bfloat16 words into MX e2m1, k <= MOE_SCATTER_MAX_K), each
token read and encoded once and each unit's word and group scale stored to the token's k
sorted rows: a grid of a few blocks an SM staging rounds of tokens' codes in shared memory
before the sort's wait (_scatter_staged_source), each lane holding whole MX groups where it
can (LANES); for small calls with no sort before it, each block counting every pair's bucket
itself (RANK_LOCAL).

The warp shuffles have twins (``kernels.xor_lane`` / ``idx_get_f32`` and
``quantize.reductions.xor_max`` with shfl=False: shared memory and barriers) that the CUDA
simulator runs. Per-unit statements are written out (generated source, ``_row_source``) so
NVVM keeps every unit in registers (``quantize.unrolled``'s note); the device functions they
call are built per configuration in ``row_fns``.
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
from numba import float32, float64, int32, int64, uint8, uint32

from ...reference.fused import UNIT, WARP
from ..device.codec import F32, KIND_BF16, KIND_F16, KIND_F32, ONE, ZERO, bits_f32, f32_bits
from ..device.division import recip_guarded
from ..device.scales import MODE_FLOAT, MODE_MX, MX_RCEIL
from ..ptx.convert import fp8_cvt_available, fp8_cvt_supports
from ..ptx.griddep import griddep_wait
from ..ptx.memory import as_u16, as_u32, load_u32x4
from ..quantize.encoders import is_e2m1
from ..quantize.general import group_params, store_scale
from ..quantize.reductions import _block_max_fn, abs_i32, xor_max
from ..quantize.units import FINITE, half_bits
from ..quantize.unrolled import compile_source
from ..runtime.backend import cuda
from ..runtime.target import SIMULATOR, devfn
from .kernels import (
    MOE_LOCAL_BATCH, MOE_LOCAL_BUCKETS, MOE_RANK_SHIFT, OP_GATHER, OP_NORM, OP_ROWS, OP_SCATTER, OUT_GROUP, OUT_MX,
    OUT_ROW, OUT_TENSOR, OUT_Y, R_SPLIT_MIN_BITS, SIG_BITS, idx_get_f32, local_count, local_rows_fn, rsqrt_mean,
    xor_lane,
)
from .row_fns import encode_fns, norm_fns, prefetch_fn, residual_fns, words_fns

__all__ = ["fused_row_kernel"]


def _loader(kind, fast, strided, full=False):
    """load(x, x32, qu, u, nu, base, n, sh, D, dm) -> (a, b): unit u of the row at element
    ``base`` as raw words (16-bit kinds: a = 4 words of 2 elements, b unused; float32: a =
    elements 0-3, b = 4-7), zeros past n (u >= nu units on the fast path, an int32 test).
    Fast path (base % 8 == 0): the unit is the array's 8-element unit ``qu`` = base / 8 + u,
    which the kernel passes as (base / 8 + tid) + j * NT: one per-thread value and a constant
    that ptxas folds into the load's address (no 64-bit arithmetic per unit). ``strided``: the
    row is H heads of D elements, head h at base + h * sh; on the fast path (sh, D multiples
    of 8 too) the unit's head is (u * dm) >> 32 = u // (D / 8) (dm = 2^32 // (D / 8) + 1
    from the launcher: exact while u * D / 8 < 2^32) instead of a 64-bit division. ``full``
    (fast path, every lane's units in the row: the kernel's FULL): no test of u."""
    F32K = kind == KIND_F32

    @devfn
    def elem(x, base, c, n, sh, D):
        if c >= n:
            return np.uint32(0)
        off = base + c
        if strided:
            hh = c // D
            off = base + hh * sh + (c - hh * D)
        if F32K:
            return np.uint32(f32_bits(x[off]))
        return np.uint32(x[off])

    @devfn
    def pair(x, base, c, n, sh, D):
        return np.uint32(elem(x, base, c, n, sh, D) | (elem(x, base, c + 1, n, sh, D) << np.uint32(16)))

    @devfn
    def load(x, x32, qu, u, nu, base, n, sh, D, dm):
        z = np.uint32(0)
        Z = (z, z, z, z)
        if fast:
            if not full and u >= nu:
                return Z, Z
            if strided:
                hh = (np.int64(u) * dm) >> 32
                qu = ((base + hh * sh) >> 3) + (np.int64(u) - hh * (D >> 3))
            if F32K:
                return load_u32x4(x32, 2 * qu), load_u32x4(x32, 2 * qu + 1)
            return load_u32x4(x32, qu), Z
        c = u * UNIT
        if F32K:
            return ((elem(x, base, c, n, sh, D), elem(x, base, c + 1, n, sh, D), elem(x, base, c + 2, n, sh, D),
                     elem(x, base, c + 3, n, sh, D)),
                    (elem(x, base, c + 4, n, sh, D), elem(x, base, c + 5, n, sh, D), elem(x, base, c + 6, n, sh, D),
                     elem(x, base, c + 7, n, sh, D)))
        return (pair(x, base, c, n, sh, D), pair(x, base, c + 2, n, sh, D), pair(x, base, c + 4, n, sh, D),
                pair(x, base, c + 6, n, sh, D)), Z

    return load


def _elems(kind):
    """elems(a, b) -> the unit's 8 elements as float32 bits."""
    if kind == KIND_F32:
        @devfn
        def elems(a, b):
            return a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]
    else:
        @devfn
        def elems(a, b):
            return (half_bits(a[0], 0, kind), half_bits(a[0], 1, kind), half_bits(a[1], 0, kind),
                    half_bits(a[1], 1, kind), half_bits(a[2], 0, kind), half_bits(a[2], 1, kind),
                    half_bits(a[3], 0, kind), half_bits(a[3], 1, kind))
    return elems


# The row kernel's choices, each the winner of an H100 A/B (bf16 [8192, 7168]; docs/design/fused.md):
# - the new bfloat16 residual x + r by cvt.rn.bf16x2.f32, two elements an instruction, its NaN
#   halves (0x7FFF) made the spec's canonical 0x7FC0 branch-free (add_res_cvt): rmsnorm + res +
#   mxfp4 158.5 -> 148.0 us;
# - flatten / MoE rows of bfloat16 into MX e2m1 on the loaded words (words_path: word_amax16,
#   e2m1_unit_bf16, no float32 unpacking): flatten + mxfp4 60.8 -> 57.0 us, MoE 209.9 -> 200.5;
# - normalize's y = fl(a * r_hi) + fl(a * r_lo) as fma(a, r_hi, fl(a * r_lo)) (a * r_hi is exact:
#   reference/fused.normalize; the PTX audit accepts exactly this fma): rmsnorm + fp8_1x128 75.9
#   -> 74.6 us, + mxfp4 83.9 -> 81.7;
# - 1x128 / MX-32 group scales (float scales and MX "rceil", not the words' path) computed once
#   per group, not once per lane of it (_share_source): rmsnorm + fp8_1x128 74.7 -> 72.6 us,
#   + mxfp4 79.6 -> 69.2;
# - the RMSNorm ops' unit amax of y by max.NaN.f32 of |.| (unit_amax_nan: 0x7FFFFFFF for a unit
#   holding a NaN, above +inf like the NaN's own bits, which is all any consumer asks):
#   rmsnorm + mxfp4 69.1 -> 66.0 us, + fp8_row 70.0 -> 66.7;
# - MX "rceil" e2m1 of y by e2m1_unit_f32_p2 (y rounded to odd into bfloat16 pairs, one
#   bfloat16 multiply by 2^-k a pair): rmsnorm + mxfp4 64.5 -> 62.0 us;
# - the row's 1/sqrt (rsqrt_mean, about 150 SASS instructions) by warp 0 alone, passed on after
#   a second barrier, for MX outputs only (row_rsqrt): rmsnorm + mxfp4 65.6 -> 64.5 us,
#   + fp8_row 66.6 -> 69.9 (its row amax already waits at a second barrier);
# - FULL kernels where the row fills the block's units, per op (full_rows);
# - the L2 prefetch of row + PREFETCH_TENSOR for the static per-tensor output only
#   (prefetch_distance).
# Measured and dropped: the weights loaded before the row's reduction (+28 registers: rmsnorm +
# fp8_row 87.1 -> 90.1 us), a launch bound of 5 blocks an SM (no gain), MX e2m1 of y by the
# clamped pair encoder for every MX scale rounding (97.2 vs 96.8 us: no gain) and the strided
# flatten's unit indices stepped per thread (57.4 vs 57.0 us: no gain).
PREFETCH_TENSOR = 264  # rows ahead (2 x the H100's 132 SMs): 86.9 -> 79.7 us; 528 and 1056 rows slower


def prefetch_distance(op, out, has_res):
    """Rows ahead that an op's blocks prefetch into L2 (0: none): PREFETCH_TENSOR for RMSNorm
    into the static per-tensor output without the residual, the one op it made faster (it made
    fp8_row, fp8_1x128 and mxfp4 slower; with the residual the +res mxfp4 kernel went from 96 to
    133 registers)."""
    return PREFETCH_TENSOR if op == OP_NORM and not has_res and out == OUT_TENSOR else 0


def full_rows(op, out, has_res) -> bool:
    """Whether an op's kernel is built FULL (fast = 2: no unit tested against the row's end)
    where its rows fill the units (n = NT * U * 8, aligned: hidden 7168 in 4 warps x 7 units,
    4096, 8192, ...): flatten and the RMSNorm ops with the residual (+res mxfp4 140.7 -> 135.0 us,
    +res fp8_1x128 152.5 -> 147.4), rmsnorm + mxfp4 (61.3 -> 58.5) and + fp8_tensor (71.1 ->
    70.1); not rmsnorm + fp8_row / fp8_1x128 without it (ptxas then takes 120 / 100 registers
    instead of 72: 65.9 -> 72.0 and 69.6 -> 75.6 us), the MoE rows (36.6 -> 37.6) nor the
    unfused y kernel."""
    if op == OP_ROWS:
        return True
    return op == OP_NORM and out != OUT_Y and (has_res or out in (OUT_MX, OUT_TENSOR))


def _share_source(U, LL, NT, recip, full=False):
    """The statements (kernel source) of the group parameters once per group (GSHARE) after the
    units' amaxes v0 .. v{U-1} (int32 bits, 0 for a unit past the row): the transposed butterfly
    over the group's LL lanes, the groups' parameters where they end up, their multipliers back
    to the units' lanes, the codes. With P = U rounded up to a power of two (padding amaxes 0),
    each of the first s = min(log2 P, log2 LL) steps at offset LL / 2, LL / 4, ... splits a
    lane's values in two halves, keeps the half that the lane's bit of the offset names (the
    upper one where it is set), sends the other to its partner and takes the partner's maxima
    into the kept half; the remaining offsets are plain butterfly steps of the one value left.
    Lane l then holds the group amax of the units j = jbase(l) + i, i < c = P >> s, where bit k
    of l's offset bits gives bit (log2 P - 1 - k) of jbase; of the LL >> s lanes holding the
    same j, the one whose other bits are 0 stores the scale. ``recip``: float scales (the
    reciprocals go back too). ``full``: every group of the lanes' units is in the row (the
    kernel's FULL)."""
    P = 1 << max(U - 1, 0).bit_length()
    LG, PG = LL.bit_length() - 1, P.bit_length() - 1
    S = min(PG, LG)
    C = P >> S
    L = [f"    v{j} = np.int32(0)" for j in range(U, P)]
    c, off = P, LL >> 1
    while off:
        if c > 1:
            h = c // 2
            L += [f"    bk = (tid & {off}) != 0"]
            for i in range(h):
                L += [f"    sd = v{i} if bk else v{h + i}",
                      f"    v{i} = max(v{h + i} if bk else v{i}, xor_lane(sd, {off}, SHFL, scratch, tid))"]
            c = h
        else:
            L += [f"    v0 = xor_max(v0, {off}, SHFL, scratch, tid)"]
        off >>= 1
    jb = " | ".join([f"(((tid >> {LG - 1 - k}) & 1) << {PG - 1 - k})" for k in range(S)]) or "0"
    L += [f"    jb = np.int32({jb})",
          f"    own = (tid & {(LL >> S) - 1}) == 0",
          f"    gu = np.int32(tid & {~(LL - 1)})"]  # the group's first unit (j = 0), its lanes' base
    for i in range(C):
        inr = "" if full else f" and gu + (jb + {i}) * {NT} < nunits"
        L += [f"    p{i}, r{i} = group_params_r(v{i}, own and jb + {i} < {U}{inr}, "
              f"sg + np.uint64(jb + {i}) * np.uint64({NT // LL}), scales)"]
    for j in range(U):
        lj = sum(((j >> (PG - 1 - k)) & 1) << (LG - 1 - k) for k in range(S))
        i = j & (C - 1)
        L += [f"    pj = idx_get_f32(p{i}, gu | {lj}, SHFL, scratch, tid)",
              f"    rj = idx_get_f32(r{i}, gu | {lj}, SHFL, scratch, tid)" if recip else "    rj = ZERO",
              f"    if u{j} < nunits: put_codes(y{j}, u{j}, row, n, pcols, pj, rj, pj == pj, codes, c16, c32, tu + {j * NT})"]
    return L


_KERNEL_ARGS = ("x, res, w, newres, yout, codes, scales, perm, n, pcols, ngroups, eps, sscale, sb, sh, D, dm, pf, m, "
                "cbase, pout, nbk, csh")


@devfn
def rank_row(packed, cbase, pout, nbk, csh, pi, tok):
    """The sorted row of pair ``pi`` (token ``tok``) from moe_rank_kernel's outputs (RANK):
    the first row of its bucket in its chunk (pi >> csh), cbase[chunk, bucket] (nbk buckets a chunk),
    plus its rank in the chunk, both in packed[pi]; stores the token to pout[row] (the op's
    perm: one thread a pair)."""
    v = packed[pi]
    row = np.int64(cbase[(pi >> csh) * nbk + (v >> MOE_RANK_SHIFT)]) + (v & ((1 << MOE_RANK_SHIFT) - 1))
    pout[row] = tok
    return row


MOE_SCATTER_MAX_K = 8  # OP_SCATTER's rows per token (top-k): held in registers, the stores unrolled
MOE_STAGE_MAX = 16  # OP_SCATTER's staged tokens a block (shared memory: 5 bytes a unit and token)


def words_path(op, out, kind, fast, fmt) -> bool:
    """Whether rows of bfloat16 words go straight into MX e2m1 (flatten and the MoE sort, no
    norm; aligned units): the only path OP_SCATTER is built for."""
    return bool(op != OP_NORM and kind == KIND_BF16 and fast and out == OUT_MX and fmt[5] == 4
                and is_e2m1(fmt))


RANK_PACKED = 1  # OP_SCATTER's rows from moe_rank_kernel's packed ranks and chunk bases
RANK_LOCAL = 2  # OP_SCATTER's rows found by each block from every pair's bucket (local_path)


def _scatter_staged_source(U, NT, KD, S, LANES, LL, PIPE=0, RANK=0):
    """OP_SCATTER's body with STAGE = S (after the prelude: tid, views, nunits, ut, u0..): a
    block takes tokens blockIdx + i * gridDim (m tokens) in rounds of S. A round loads and
    encodes its S tokens, their words and scale codes into shared memory, then waits for the
    sort (griddep_wait: launched as the sort's programmatic dependent (moe_plan), the first
    round reads its tokens while the sort runs; after that the wait returns at once) and
    stores them to the rows perm gives them. Each lane reads back only its own slots. The
    round's S * KD rows are read first, thread t < S * KD the pair t (``rw``, shared, by round
    parity: one barrier a round), so the round waits for one round trip, not one a token (a
    token's row loads after the last token's stores, which may alias them, would each wait).
    The codes and scales are the one-block-per-token form's.

    ``PIPE``: the rounds after the first overlap their loads with the stores: for each slot
    i, the lane issues the loads of the next round's token i (into registers), stores slot i
    of this round, then encodes the loaded token into slot i (its own slots: program order
    keeps the store's reads before the new writes). Without it a block's rounds alternate
    a load phase and a store phase, and its SM's reads stall while it stores.

    ``RANK`` RANK_PACKED: ``perm`` holds moe_rank_kernel's packed ranks, and each pair's row is
    found here (rank_row, which also stores the op's perm to ``pout``) instead of read from
    moe_sort's inv. RANK_LOCAL: no sort ran; ``perm`` holds the expert ids (nbk = E + 1
    buckets), ``csh`` the tokens a block: block b takes the tokens [b * csh, (b + 1) * csh) in
    one round, counts every pair's bucket in shared memory while its tokens load (a slice of
    the pairs after each token's loads: _fused_kernels.local_count), and finds its pairs'
    rows (local_rows: each bucket's first row, plus its pairs before the block's first pair,
    plus the rank among the block's own), storing the op's perm to ``pout`` and (block 0) the
    offsets to ``cbase``. No block waits for another.

    The lane's units: t + j * NT (the prelude's, a group over LL lanes: stage_unit's
    butterfly, put_staged), or with LANES t * U + j (U a multiple of LL, rows of whole quads
    of units: n % 32 == 0, aligned, so a lane's quad is wholly in the row or past it): the
    lane's whole groups, their amax in the lane (stage_group), its words in 16-byte stores
    (put_quad), its scale codes by put_rows. (The lanes' words by 4-byte stores, a unit
    apart, made each warp's store a partial write of 16 sectors: H100, hidden 2880, the whole
    op 27.7 us against 18.0 for one block a token, and 13.9 by 16-byte stores.)"""
    J = range(U)
    H = range(U // LL) if LANES else ()
    SK = S * KD
    L = ["    sw = cuda.shared.array(SWN, uint32)",
         "    sc = cuda.shared.array(SWN, uint8)",
         f"    rw = cuda.shared.array({2 * SK}, int64)",
         "    g = np.int32(cuda.gridDim.x)",
         "    t0 = np.int32(cuda.blockIdx.x)",
         "    par = 0"]
    if LANES:  # the lane's units t * U + j, read from quad (row's first) + t * U + j
        L += [f"    u{j} = np.int32(tid * {U} + {j})" for j in J]
        L += [f"    ul = ut * {U}"]
        q = "tx + {j}"
    else:
        L += ["    ul = ut"]
        q = f"tx + {{j}} * {NT}"

    def load(tok, ind):  # token ``tok``'s units into a{j}, b{j}
        return [f"{ind}base = np.int64({tok}) * sb",
                f"{ind}tx = (base >> 3) + ul"] + [
            f"{ind}a{j}, b{j} = load_x(x, x32, {q.format(j=j)}, u{j}, nunits, base, n, sh, D, dm)" for j in J]

    def stage(ind):  # the loaded token into slot i
        if LANES:
            return [f"{ind}stage_group(" + "".join(f"a{h * LL + e}, " for e in range(LL))
                    + "".join(f"u{h * LL + e} < nunits, " for e in range(LL))
                    + f"sw, sc, (i * {U} + {h * LL}) * {NT} + tid, (i * {U // LL} + {h}) * {NT} + tid)" for h in H]
        return [f"{ind}stage_unit(a{j}, u{j} < nunits, tid, scratch, sw, sc, (i * {U} + {j}) * {NT} + tid)" for j in J]

    def rows(ind):  # the round's rows (round t0) into rw[par], then a barrier
        R = [f"{ind}if tid < {SK}:",
             f"{ind}    ti = np.int32(tid // {KD})",
             f"{ind}    tk = t0 + ti * g",
             f"{ind}    if tk < m:",
             f"{ind}        pi = np.int64(tk) * {KD} + (tid - ti * {KD})"]
        if RANK == RANK_PACKED:
            R += [f"{ind}        rw[par * {SK} + tid] = rank_row(perm, cbase, pout, nbk, csh, pi, tk)"]
        else:
            R += [f"{ind}        rw[par * {SK} + tid] = np.int64(perm[pi])"]
        return R + [f"{ind}cuda.syncthreads()"]

    def put(ind):  # slot i (token ``tok``) to its KD sorted rows
        P = [f"{ind}p{j} = rw[par * {SK} + i * {KD} + {j}]" for j in range(KD)]
        P += [f"{ind}dd = (" + "".join(f"p{j} * nunits, " for j in range(KD)) + ")",
              f"{ind}ss = (" + "".join(f"p{j} * ngroups, " for j in range(KD)) + ")"]
        if LANES:  # 4 words a 16-byte store, quad (row's first unit + t * U + 4 r) / 4 (rows of whole quads)
            for r in range(U // 4):
                P += [f"{ind}if u{4 * r} < nunits:",
                      f"{ind}    put_quad(sw, (i * {U} + {4 * r}) * {NT} + tid, c32, dd, ut * {U // 4} + {r})"]
            P += [f"{ind}put_rows(sc, (i * {U // LL} + {h}) * {NT} + tid, u{h * LL} < nunits, "
                  f"ut * {U // LL} + {h}, scales, ss)" for h in H]
        else:
            P += [f"{ind}put_staged(sw, sc, (i * {U} + {j}) * {NT} + tid, u{j} < nunits, u{j}, tid, c32, scales, dd, "
                  f"ss)" for j in J]
        return P

    I2, I3, I4 = " " * 8, " " * 12, " " * 16
    if RANK == RANK_LOCAL:  # one round: tokens [f0, fe), their rows found here from every pair's bucket
        L += ["    ht = cuda.shared.array(MOE_LOCAL_BUCKETS, int32)",
              "    hb = cuda.shared.array(MOE_LOCAL_BUCKETS, int32)",
              f"    ob = cuda.shared.array({SK}, int32)",
              f"    part = cuda.shared.array({NT}, int32)",
              "    ev = cuda.local.array(MOE_LOCAL_BATCH, int32)",
              "    ne = nbk - 1",
              f"    npairs = np.int64(m) * {KD}",
              "    f0 = t0 * csh",  # (csh: the tokens a block)
              "    fe = min(f0 + csh, m)",
              f"    first = np.int64(f0) * {KD}",
              f"    for e in range(tid, nbk, {NT}):",
              "        ht[e] = 0",
              "        hb[e] = 0",
              "    cuda.syncthreads()",
              "    for i in range(STAGE):",
              "        tok = f0 + np.int32(i)",
              "        if tok < fe:"]
        # a slice of the pairs counted while the token's loads are in flight
        L += load("tok", I3)
        L += [f"{I3}local_count(perm, npairs * i // (fe - f0), npairs * (i + 1) // (fe - f0), ne, first, tid, {NT}, "
              "ht, hb, ev)"]
        L += stage(I3)
        L += [f"    local_rows(perm, ne, npairs, first, (fe - f0) * {KD}, {KD}, ht, hb, ob, part, rw, pout, cbase, tid, "
              "t0)",
              "    for i in range(STAGE):",
              "        tok = f0 + np.int32(i)",
              "        if tok < fe:"]
        return L + put(I3)
    if not PIPE:
        L += ["    while t0 < m:",
              "        for i in range(STAGE):",
              "            tok = t0 + np.int32(i) * g",
              "            if tok < m:"]
        L += load("tok", I4) + stage(I4)
        # the sort's rows are read only after griddep_wait (in any other launch it does nothing)
        L += ["        griddep_wait()"] + rows(I2)
        L += ["        for i in range(STAGE):",
              "            tok = t0 + np.int32(i) * g",
              "            if tok < m:"]
        L += put(I4)
        L += ["        t0 += np.int32(STAGE) * g",
              "        par ^= 1"]
        return L
    # PIPE: the first round as above, then each slot's next token loaded before the slot's stores
    L += ["    for i in range(STAGE):",
          "        tok = t0 + np.int32(i) * g",
          "        if tok < m:"]
    L += load("tok", I3) + stage(I3)
    L += ["    griddep_wait()",
          "    while t0 < m:"] + rows(I2)
    L += ["        t1 = t0 + np.int32(STAGE) * g",
          "        for i in range(STAGE):",
          "            tok = t0 + np.int32(i) * g",
          "            nxt = t1 + np.int32(i) * g",
          "            if nxt < m:"]
    L += load("nxt", I4)
    L += ["            if tok < m:"] + put(I4)
    L += ["            if nxt < m:"] + stage(I4)
    L += ["        t0 = t1",
          "        par ^= 1"]
    return L


def _row_source(out, U, NT, LL, MODE, NORM, RES, RSPLIT, WPAIRS, GSHARE, PF, FULL, STAGE, KD, LANES, PIPE, RANK):
    """The source of fused_row_kernel's kernel (``fused_rows``) for its configuration's
    constants: one statement per unit where a unit is involved (the loads, the residual, the
    sum of squares, each unit's values and their use), then the row's or the groups' scales
    and codes; OP_SCATTER's staged body after the prelude (_scatter_staged_source)."""
    L = [f"def fused_rows({_KERNEL_ARGS}):",
         "    tid = cuda.threadIdx.x",
         "    row = cuda.blockIdx.x",
         "    scratch = cuda.shared.array(SCRATCH, int32)",
         "    red = cuda.shared.array(RED, float64)",
         "    scratch64 = cuda.shared.array(SCRATCH64, float64)",
         "    redm = cuda.shared.array(NW, int32)",
         "    x32 = as_u32(x)",
         "    r32 = as_u32(res)",
         "    nr32 = as_u32(newres)",
         "    w32 = as_u32(w)",
         "    y32 = as_u32(yout)",
         "    c32 = as_u32(codes)",
         "    c16 = as_u16(codes)",
         "    n = np.int32(n)",
         "    nunits = np.int32((n + (UNIT - 1)) >> 3)",
         "    src = perm[row] if OP == OP_GATHER else row",
         "    base = np.int64(src) * sb",
         "    rbase = np.int64(row) * n",
         # the fast path's unit indices: (row's first unit + tid) + j * NT (see _loader)
         "    ut = np.int64(tid)",
         "    tx = (base >> 3) + ut",
         "    tu = (rbase >> 3) + ut"]
    J = range(U)
    L += [f"    u{j} = np.int32(tid + {j * NT})" for j in J]
    if PF:  # the lines of row + pf into L2 (a hint: no value depends on it), before the row's own loads
        L += ["    if pf > 0 and row + pf < cuda.gridDim.x:",
              "        prefetch_rows(x32, row + pf, tid, nunits, sb)"]
    L += [f"    a{j}, b{j} = load_x(x, x32, tx + {j * NT}, u{j}, nunits, base, n, sh, D, dm)" for j in J]
    if RES:
        L += [f"    a{j}, b{j} = add_res(a{j}, b{j}, res, r32, newres, nr32, rbase, tu + {j * NT}, u{j}, nunits, n)"
              for j in J]
    if NORM:
        L += ["    s = unit_sq(a0, b0)"]
        L += [f"    s = s + unit_sq(a{j}, b{j})" for j in range(1, U)]
        L += ["    rr = cuda.shared.array(2, float32)",
              "    r1, r2 = row_rsqrt(s, tid, scratch64, red, rr, F32(n), eps)"]
        if RSPLIT:
            L += ["    r_hi = bits_f32(np.uint32(f32_bits(r1) & RMASK))", "    r_lo = (r1 - r_hi) + r2"]
        else:
            L += ["    r_hi = r1", "    r_lo = r2"]
        Y = "norm_unit(a{j}, b{j}, wa{j}, wb{j}, u{j}, n, r1, r2, r_hi, r_lo)"
    elif WPAIRS:
        Y = "a{j}"
    else:
        Y = "elems(a{j}, b{j})"
    # each unit's values are made right before their use (fewer live registers), except per
    # row, where every unit waits for the row's amax
    if out == OUT_Y:
        use = "    if u{j} < nunits: put_y(y{j}, yout, y32, rbase, tu + {jNT}, u{j}, n)"
    elif out == OUT_TENSOR:
        L += ["    p0 = sscale", "    sclean = abs_i32(f32_bits(p0)) < FINITE and p0 != ZERO", "    rp = recip_guarded(p0)"]
        use = "    if u{j} < nunits: put_static(y{j}, u{j}, row, n, pcols, p0, rp, sclean, codes, c16, c32, tu + {jNT})"
    elif out == OUT_ROW:
        use = "    if u{j} < nunits: am = max(am, amax_y(y{j}))"
        L += ["    am = np.int32(0)"]
    else:
        # the group's scale index: (row * ngroups + tid // LL) + j * NT / LL (NT % LL == 0)
        # unsigned: Numba's indexing then has no negative-index wraparound (some 6 instructions
        # a unit, and the row's product redone per unit beside it)
        L += ["    sg = np.uint64(np.int64(row) * ngroups + (ut >> LLSH))"]
        if GSHARE:  # every unit's amax first; the groups' parameters after the loop (_share_source)
            use = "    v{j} = amax_y(y{j}) if u{j} < nunits else np.int32(0)"
        else:
            use = ("    group_unit{w}(y{j}, u{j} < nunits, u{j}, row, n, pcols, sg + np.uint64({jNL}), tid, scratch, codes, c16, c32, "
               "scales, tu + {jNT})").replace("{w}", "_w" if WPAIRS else "")
    for j in J:
        if NORM:  # (each unit's weights right before their use: held through the row's sum, they cost registers)
            L += [f"    wa{j}, wb{j} = load_w(w, w32, ut + {j * NT}, u{j}, nunits, 0, n, n, n, 0)"]
        L += ["    y{j} = {Y}".format(j=j, Y=Y.format(j=j, jNT=j * NT)), use.format(j=j, jNT=j * NT, jNL=j * NT // max(LL, 1))]
    if out == OUT_ROW:
        L += ["    am = block_max(am, tid, scratch, redm)",
              "    sv, p0, pz = group_params(MODE, am, ZERO, ZERO, MAXE, MXR, MXM, MXE, MXI, ONE)",
              "    if tid == 0: store_scale(scales, row, MODE, sv)",
              "    clean = am < FINITE",
              "    rp = recip_guarded(p0) if MODE == MODE_FLOAT else ZERO"]
        # (one test per unit, not one "clean" branch per row over all units: ptxas then
        # schedules the units' encodes together, 121 registers instead of 89; measured slower,
        # H100: rmsnorm + fp8_row 91.1 vs 81.3 us)
        L += [f"    if u{j} < nunits: put_codes(y{j}, u{j}, row, n, pcols, p0, rp, clean, codes, c16, c32, tu + {j * NT})"
              for j in J]
    if GSHARE:
        L += _share_source(U, LL, NT, MODE == MODE_FLOAT, FULL)
    if STAGE:  # OP_SCATTER: the staged scatter replaces the one-row body (the prelude up to the units' indices stays)
        k = L.index("    tu = (rbase >> 3) + ut") + 1 + U
        assert L[k - 1].startswith(f"    u{U - 1} = "), L[k - 1]
        L = L[:k] + _scatter_staged_source(U, NT, KD, STAGE, LANES, LL, PIPE, RANK)
    src = "\n".join(L) + "\n"
    if FULL:  # unit j of every lane is in the row
        src = re.sub(r"\bu\d+ < nunits\b", "True", src)
    return src


@lru_cache(maxsize=None)
def fused_row_kernel(op, out, kind, wkind, NW, U, fast, strided, has_res, fmt, mx_cfg, max_elem, G, shfl, KD=0,
                     STAGE=0, LANES=0, PIPE=0, RANK=0):
    """The kernel for one configuration (every argument a compile-time constant): ``op`` OP_*,
    ``out`` OUT_*, input / weight kinds, NW warps x U units per thread (the spec's geometry),
    ``fast`` (16-byte aligned units: vector loads and stores; 2: and n = NT * U * 8, every
    lane's units in the row: full_rows), ``strided`` (a [B, H, D] view), ``fmt`` / ``mx_cfg`` /
    ``max_elem`` as in kernels.quantize, G the scale group (128 or 32; 0 otherwise), ``shfl``
    (warp shuffles; False: their simulator twins). Arguments: see _KERNEL_ARGS (flat arrays; sb
    the row stride of x in elements; pf the L2 prefetch distance in rows, 0: none; m the rows,
    OP_SCATTER's tokens). ``KD``: OP_SCATTER's rows per token (k of the MoE sort,
    1..MOE_SCATTER_MAX_K). ``STAGE``: OP_SCATTER's tokens a block encodes into shared memory
    before it waits for the sort (_scatter_staged_source; OP_SCATTER is built staged only);
    ``LANES``: with STAGE, each lane's units contiguous (its whole scale groups; rows of whole
    quads of units, n % 32 == 0: 16-byte stores); ``PIPE``: with STAGE, each round's stores
    overlap the next round's loads (_scatter_staged_source); ``RANK``: with STAGE, RANK_PACKED:
    the rows from moe_rank_kernel's packed ranks (in ``perm``) and chunk bases (``cbase``,
    ``nbk`` buckets a chunk, chunks of 2^``csh`` pairs), the op's perm stored to ``pout``;
    RANK_LOCAL: no sort before it, the rows found by each block from the ids (in ``perm``;
    ``nbk`` = E + 1, ``csh`` the tokens a block), the op's perm to ``pout``, its offsets to
    ``cbase``."""
    RSQ0 = out == OUT_MX  # the row's 1/sqrt by warp 0
    pf_code = prefetch_distance(op, out, has_res) > 0
    NT = WARP * NW
    NORM = op == OP_NORM
    RES = has_res and NORM
    F32K = kind == KIND_F32
    XB, WB = SIG_BITS[kind], SIG_BITS[wkind]
    K = 24 - XB - WB
    RSPLIT = K >= R_SPLIT_MIN_BITS
    PEXACT = XB + WB <= 24
    RMASK = ((0xFFFFFFFF << (24 - K)) & 0xFFFFFFFF) if RSPLIT else 0
    MODE = MODE_MX if out == OUT_MX else MODE_FLOAT
    CVT = out != OUT_Y and fp8_cvt_available() and fp8_cvt_supports(fmt)
    NB = fmt[5] if out != OUT_Y else 8
    MAXE = F32(max_elem)
    MXR, MXM, MXE, MXI = mx_cfg[0], mx_cfg[1], mx_cfg[2], F32(mx_cfg[3])
    LL = G // UNIT  # lanes per scale group
    LLSH = max(LL, 1).bit_length() - 1  # log2(LL)
    MXRC = MODE == MODE_MX and MXR == MX_RCEIL
    # MX "rceil" e2m1 of y by e2m1_unit_f32_p2 (the multiplier in the bfloat16 pairs)
    MXE2M1 = MODE == MODE_MX and NB == 4 and is_e2m1(fmt) and MXR == MX_RCEIL
    # rows of bfloat16 words straight into MX e2m1 (flatten, MoE: no norm)
    WPAIRS = words_path(op, out, kind, fast, fmt)
    if op == OP_SCATTER and not (WPAIRS and 1 <= KD <= MOE_SCATTER_MAX_K):
        raise ValueError(f"OP_SCATTER is built for the bfloat16 words' MX e2m1 path (words_path) and 1 <= k <= "
                         f"{MOE_SCATTER_MAX_K} rows a token, not k = {KD}")
    if (op == OP_SCATTER) != (STAGE != 0) or not 0 <= STAGE <= MOE_STAGE_MAX:
        raise ValueError(f"OP_SCATTER is built staged, 1..{MOE_STAGE_MAX} tokens a block, and STAGE is OP_SCATTER's "
                         f"only: not STAGE = {STAGE} (op {op})")
    if LANES and not (STAGE and U % (G // UNIT) == 0 and fast):
        raise ValueError(f"LANES needs STAGE, aligned rows and whole groups a lane: U = {U}, G = {G}")
    if (PIPE or RANK) and not STAGE:
        raise ValueError("PIPE and RANK need STAGE (the staged rounds)")
    if RANK == RANK_LOCAL and PIPE:
        raise ValueError("RANK_LOCAL is one round a block: no PIPE")
    # e2m1_unit_bf16 clamps to 6: "floor" / "even" scales can leave |x| / 2^k up to 8, and so can
    # "rceil" blocks above 6 * 2^125, whose exponent is capped (reference scales.mx_top_code)
    CLAMP = True
    RCVT = RES and kind == KIND_BF16 and fast  # the residual by cvt.rn.bf16x2.f32
    # the L2 prefetch of row + pf: contiguous rows, RMSNorm without the residual (prefetch_distance;
    # with the residual the +res mxfp4 kernel went from 96 to 133 registers)
    PF = pf_code and fast and not strided
    # group parameters once per group (_share_source): group outputs but the words' pair path, with
    # the scales whose parameters tell a non-finite amax by a NaN multiplier (float scales; MX
    # "rceil": code 0xFF)
    GSHARE = out in (OUT_GROUP, OUT_MX) and not WPAIRS and (MODE == MODE_FLOAT or MXRC)
    # FULL (fast == 2, the launcher's: n = NT * U * 8): every lane's U units are in the row,
    # so no unit is tested against the row's end (nor predicated: the loads' addresses and
    # zeroed registers per unit go too)
    FULL = fast == 2
    load_x = _loader(kind, fast, strided, FULL)
    load_r = _loader(kind, fast, False, FULL)
    load_w = _loader(wkind, fast, False, FULL)
    elems = _elems(kind)
    welems = _elems(wkind)

    add_res = residual_fns(kind, fast, F32K, RCVT, load_r, elems)
    norm = norm_fns(NW, RSQ0, RSPLIT, PEXACT, out, fast, shfl, elems, welems)
    codes_fns = encode_fns(MODE, fmt, CVT, NB, NORM, MXE2M1, MXRC, MAXE, MXR, MXM, MXE, MXI, LL, fast, shfl,
                           norm["canon8"])
    words = words_fns(MODE, fmt, CVT, MXRC, MAXE, MXR, MXM, MXE, MXI, LL, LLSH, NT, KD, CLAMP, elems,
                      codes_fns["group_max"], codes_fns["group_scale"], codes_fns["put_codes"])
    prefetch_rows = prefetch_fn(F32K, NT)

    block_max = _block_max_fn(NT, shfl)

    src = _row_source(out, U, NT, LL, MODE, NORM, RES, RSPLIT, WPAIRS, GSHARE, PF, FULL, STAGE, KD, LANES, PIPE, RANK)
    glb = dict(globals())
    glb.update(SCRATCH=1 if shfl else NT, SCRATCH64=1 if shfl or not NORM else NT, RED=NW, NW=NW, OP=op, MODE=MODE, MAXE=MAXE, MXR=MXR, MXM=MXM, MXE=MXE,
               MXI=MXI, RMASK=RMASK, load_x=load_x, load_w=load_w, LLSH=LLSH,
               add_res=add_res, elems=elems, **norm, **codes_fns, **words, block_max=block_max, as_u32=as_u32,
               as_u16=as_u16, prefetch_rows=prefetch_rows, KD=KD, SHFL=shfl,
               griddep_wait=griddep_wait, STAGE=STAGE, SWN=max(STAGE * U * NT, 1),
               uint32=uint32, uint8=uint8, rank_row=rank_row, local_count=local_count,
               local_rows=local_rows_fn(NT), MOE_LOCAL_BUCKETS=MOE_LOCAL_BUCKETS, MOE_LOCAL_BATCH=MOE_LOCAL_BATCH)
    # (the units' statements written out: quantize.unrolled's note says why)
    fn = compile_source(src, f"<nqdq fused_rows op={op} out={out} NW={NW} U={U}>", glb, "fused_rows")
    # launch bounds: a block of NT threads must fit one SM's registers (NT = 1024 at most
    # rows: <= 64 registers a thread; ptxas spills rather than fail at launch)
    kern = cuda.jit(fn) if SIMULATOR else cuda.jit(fn, launch_bounds=(NT,))
    kern.source = src
    # what the PTX audit allows of float64 (its rule is none: a stray float literal would
    # promote float32 math): the sum of squares' conversions, one per element in (8 U) and
    # one for the sum's high part, and its two results out (hi, lo), nothing else
    kern.f64_cvts = (UNIT * U + 1, 2) if NORM else (0, 0)
    return kern


_ = (float32, float64, int32, int64, OP_GATHER, rsqrt_mean, abs_i32, KIND_F16)  # used by the generated source
_ = (ONE, ZERO, bits_f32, FINITE, recip_guarded, group_params, store_scale)  # ... its rows' scale and encode
_ = (xor_max, xor_lane, idx_get_f32)  # ... its groups' butterflies (_share_source)
