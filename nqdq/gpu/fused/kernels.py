"""Device functions of the fused ops shared by the row kernel (``fused.rows``) -- the
float64 sum of squares' butterfly and split, the float-float arithmetic of the norm
(reference/fused, operation for operation), rounding to
the input's 16-bit dtype -- and the kernels of the MoE sort (three small ones, or one; or the
rank kernel, whose ranks the staged rows kernel turns into rows). Launchers:
``nqdq.gpu.fused.plan``; spec: ``nqdq.reference.fused``.

Products that meet an addition go through mul_rn so NVVM cannot contract them into an FMA
(the PTX audit checks it).
"""

from __future__ import annotations

import math

import numpy as np
from numba import int32
from ..runtime.backend import cuda

from ..device.codec import F32, KIND_F16, KIND_F32, bits_f32, f16_bits_to_f32_bits, f32_bits, mul_rn
from ..quantize.grid import DONE_WORDS, arrive, leave_done, mark_done, missing, wait_done
from ..ptx.griddep import griddep_launch, griddep_wait
from ..ptx.memory import load_cg
from ..runtime.target import SIMULATOR, devfn

ONE = F32(1.0)
SPLITTER = F32(4097.0)  # Veltkamp, as reference/fused.SPLITTER
CANON_NAN_BITS = 0x7FC00000

OP_NORM = 0  # RMSNorm rows (optionally after the residual add)
OP_ROWS = 1  # plain rows of a (possibly strided) [B, H, D] view: flatten
OP_GATHER = 2  # row i is source row perm[i]: the MoE sort
OP_SCATTER = 3  # row t is written to rows perm[t * k + j], j < k: the MoE sort, each token read once

OUT_Y = 0  # write float32 y (the unfused norm)
OUT_ROW = 1  # per-row float scale (fp8_row)
OUT_TENSOR = 2  # static per-tensor scale (fp8_tensor with scale=)
OUT_GROUP = 3  # float scale per G = 128 (fp8_1x128)
OUT_MX = 4  # e8m0 scale per 32 (mxfp4)

SIG_BITS = {KIND_F32: 24, 1: 8, KIND_F16: 11}  # KIND_BF16 == 1
R_SPLIT_MIN_BITS = 5  # reference/fused.R_SPLIT_MIN_BITS

MOE_CHUNK = 256  # pairs per block in the MoE sort kernels
MOE_MAX_EXPERTS = 1024
MOE_BUCKETS = MOE_MAX_EXPERTS + 1  # the experts and the bucket of ids out of range


# ----------------------------------------------------------------------------- float-float
@devfn
def two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@devfn
def xor_lane(v, off, shfl, scratch, tid):
    """v of lane tid ^ off (``shfl.sync.bfly``: one 32-bit shuffle for int32, two for
    float64); the simulator's twin through the shared ``scratch`` of v's type, one slot per
    thread (every thread of the block calls it). The row sum's float64 butterfly and
    the group parameters' int32 one (_fused_rows._share_source)."""
    if shfl:
        return cuda.shfl_xor_sync(0xFFFFFFFF, v, off)
    cuda.syncthreads()
    scratch[tid] = v
    cuda.syncthreads()
    return scratch[tid ^ off]


@devfn
def idx_get_f32(v, src, shfl, scratch, tid):
    """float32 v of thread ``src`` of the caller's warp (``shfl.sync.idx`` from lane src % 32;
    the twin through the int32 ``scratch``, src the thread's index in the block)."""
    if shfl:
        return cuda.shfl_sync(0xFFFFFFFF, v, src & 31)
    cuda.syncthreads()
    scratch[tid] = np.int32(f32_bits(v))
    cuda.syncthreads()
    return bits_f32(np.uint32(scratch[src]))


@devfn
def split_sum64(s):
    """reference/fused.row_sum_sq's pair from the float64 sum s: hi = fl32(s) (cvt.rn),
    lo = fl32(s - hi) (exact difference, one rounding), 0 where hi is inf or NaN."""
    hi = F32(s)
    if (f32_bits(hi) & np.uint32(0x7FFFFFFF)) >= np.uint32(0x7F800000):
        return hi, F32(0.0)
    return hi, F32(s - np.float64(hi))


@devfn
def split(a):
    c = mul_rn(SPLITTER, a)
    hi = c - (c - a)
    return hi, a - hi


@devfn
def prod_err(a, b, p):
    """The exact error a*b - p of p = fl(a*b) (Dekker; reference two_prod)."""
    ah, al = split(a)
    bh, bl = split(b)
    return (((mul_rn(ah, bh) - p) + mul_rn(ah, bl)) + mul_rn(al, bh)) + mul_rn(al, bl)


@devfn
def rsqrt_mean(s_hi, s_lo, nf, epsf):
    """reference/fused.rsqrt_mean, operation for operation."""
    h, lo = two_sum(s_hi, s_lo)
    q1 = h / nf
    p = mul_rn(q1, nf)
    pe = prod_err(q1, nf, p)
    q2 = (((h - p) - pe) + lo) / nf
    m1, m2 = two_sum(q1, q2)
    a1, a2 = two_sum(m1, epsf)
    a1, a2 = two_sum(a1, a2 + m2)
    s1 = math.sqrt(a1)
    p = mul_rn(s1, s1)
    pe = prod_err(s1, s1, p)
    s2 = (((a1 - p) - pe) + a2) / (s1 + s1)
    s1, s2 = two_sum(s1, s2)
    r1 = ONE / s1
    p = mul_rn(s1, r1)
    pe = prod_err(s1, r1, p)
    r2 = (((ONE - p) - pe) - mul_rn(s2, r1)) * r1
    return two_sum(r1, r2)


# ----------------------------------------------------------------------------- 16-bit out
@devfn
def f32_to_bf16_bits(u):
    """bfloat16 bits of float32 bits u, nearest even (NaN must be canonical already)."""
    return np.int32(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)


@devfn
def f32_to_f16_bits(u):
    """float16 bits of float32 bits u, nearest even (numpy's astype): overflow to inf,
    subnormals rounded at 2^-24, NaN -> 0x7E00 (with the sign; callers pass canonical NaN)."""
    sign = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    if a > 0x7F800000:
        return np.int32(sign | 0x7E00)
    if a >= 0x477FF000:  # >= 65520 rounds to inf
        return np.int32(sign | 0x7C00)
    e = a >> 23
    if e >= 113:  # a normal float16
        m = a & 0x7FFFFF
        q = ((e - 112) << 10) | (m >> 13)
        rem = m & 0x1FFF
        if rem > 0x1000 or (rem == 0x1000 and (q & 1) == 1):
            q += 1
        return np.int32(sign | q)
    shift = 126 - e  # value = mm * 2^(e - 150); the quantum 2^-24 is mm >> shift
    if shift > 24:
        return np.int32(sign)
    mm = (a & 0x7FFFFF) | 0x800000
    q = mm >> shift
    rem = mm & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if rem > half or (rem == half and (q & 1) == 1):
        q += 1
    return np.int32(sign | q)


@devfn
def round_bits(h, kind):
    """The bits (as stored in the input's array) of float32 h rounded to the input kind,
    after canonicalizing NaN; and the rounded value as float32."""
    u = f32_bits(h)
    if (u & 0x7FFFFFFF) > 0x7F800000:
        u = CANON_NAN_BITS
    if kind == KIND_F32:
        return np.int64(u), bits_f32(u)
    if kind == KIND_F16:
        b = np.int64(f32_to_f16_bits(u))
        return b, bits_f32(f16_bits_to_f32_bits(b))
    b = np.int64(f32_to_bf16_bits(u))
    return b, bits_f32(b << 16)


# ----------------------------------------------------------------------------- MoE sort
# The pairs (token, slot) are sorted into E + 1 buckets: the E experts, then one bucket for
# ids outside [0, E), kept in pair order after every expert (rows offsets[E]: of the order).
# Every pair thus has a sorted row, and a row's token is always a row of x: the kernels never
# wait on the host, and the caller checks offsets[E] == T * k.
@devfn
def moe_bucket(e, num_experts):
    """The bucket of expert id ``e``: itself in [0, E), else E (the ids out of range)."""
    return num_experts if e < 0 or e >= num_experts else e


@cuda.jit
def moe_count_kernel(ids, npairs, num_experts, counts):
    """counts[chunk, b] (E + 1 buckets a chunk) = the chunk's MOE_CHUNK pairs in bucket b:
    expert e for an id in [0, E), bucket E for any other id (atomic adds into shared
    memory: the counts do not depend on their order)."""
    hist = cuda.shared.array(MOE_BUCKETS, int32)
    griddep_launch()  # (programmatic dependent launch: the scan may start; it reads counts after griddep_wait)
    ch = cuda.blockIdx.x
    count_chunks(ids, npairs, num_experts, ch, ch + 1, cuda.threadIdx.x, hist, counts, ch)


@devfn
def count_chunks(ids, npairs, num_experts, c0, c1, t, hist, counts, slot):
    """The block's count of its chunks [c0, c1)'s pairs by bucket (shared atomics into hist,
    which keeps them) stored to counts[slot, :]; returns the bucket of thread t's pair in chunk
    c0 (-1: none)."""
    nb = num_experts + 1
    for e in range(t, nb, MOE_CHUNK):
        hist[e] = 0
    p = c0 * MOE_CHUNK + t
    e0 = moe_bucket(ids[p], num_experts) if c0 < c1 and p < npairs else -1
    cuda.syncthreads()
    if e0 >= 0:
        cuda.atomic.add(hist, e0, 1)
    for ch in range(c0 + 1, c1):
        p = ch * MOE_CHUNK + t
        if p < npairs:
            cuda.atomic.add(hist, moe_bucket(ids[p], num_experts), 1)
    cuda.syncthreads()
    for e in range(t, nb, MOE_CHUNK):
        counts[slot * nb + e] = hist[e]
    return e0


MOE_UNROLL = 8  # chunks whose counts a scan thread loads before it uses them
MOE_WARPS = MOE_CHUNK // 32
MOE_WARP_SLOTS = MOE_WARPS * MOE_BUCKETS  # the scatter's per-warp counts


@devfn
def column_walk(counts, nchunks, nb, e, run, c, base, write):
    """run plus bucket e's column of chunk counts (counts[ch, e] for every chunk, nb buckets
    a chunk), the loads MOE_UNROLL at a time into ``c`` (issued together, not one round trip
    each); where ``write`` (a literal at each call: inlined, the branch folds away)
    base[ch, e] = the running value before chunk ch."""
    ch = 0
    while ch + MOE_UNROLL <= nchunks:
        for i in range(MOE_UNROLL):
            c[i] = counts[(ch + i) * nb + e]
        for i in range(MOE_UNROLL):
            if write:
                base[(ch + i) * nb + e] = run
            run += c[i]
        ch += MOE_UNROLL
    while ch < nchunks:
        if write:
            base[ch * nb + e] = run
        run += counts[ch * nb + e]
        ch += 1
    return run


# the scan runs up to MOE_MAX_EXPERTS threads in its one block: a launch bound keeps its
# registers within one SM's file (unbounded, ptxas gave it 79: too many for 1024 threads)
@(cuda.jit if SIMULATOR else cuda.jit(launch_bounds=(MOE_MAX_EXPERTS,)))
def moe_scan_kernel(counts, nchunks, num_experts, base, offsets, id_flag, report):
    """One block of nt >= E threads (a power of two): offsets[0..E] = exclusive scan of the
    expert totals (offsets[E]: the pairs with a valid id), offsets[E + 1] = all pairs;
    base[chunk, b] = first sorted row of bucket b's pairs in that chunk; where ``report``,
    id_flag[0]: report_ids'.
    Thread e sums its expert's column (column_walk), the totals are scanned by a Hillis-Steele
    scan over the block (log2 nt steps); the invalid bucket's column, after every expert, is
    walked by thread E (thread 0 when E == nt)."""
    tot = cuda.shared.array(MOE_MAX_EXPERTS, int32)
    c = cuda.local.array(MOE_UNROLL, int32)
    e = cuda.threadIdx.x
    nt = cuda.blockDim.x
    nb = num_experts + 1
    griddep_launch()  # (programmatic dependent launch: the scatter may start, and wait for this kernel)
    griddep_wait()  # (programmatic dependent launch: the count kernel's counts are complete and visible)
    s = 0
    if e < num_experts:
        s = column_walk(counts, nchunks, nb, e, 0, c, base, False)
    tot[e] = s
    cuda.syncthreads()
    off = 1
    while off < nt:  # inclusive scan of tot (entries past E are 0)
        v = tot[e - off] if e >= off else 0
        cuda.syncthreads()
        tot[e] += v
        cuda.syncthreads()
        off *= 2
    run = tot[e] - s  # exclusive
    if e < num_experts:
        offsets[e] = run
        column_walk(counts, nchunks, nb, e, run, c, base, True)
    if e == (num_experts if num_experts < nt else 0):
        valid = tot[num_experts - 1]
        offsets[num_experts] = valid
        total = column_walk(counts, nchunks, nb, num_experts, valid, c, base, True)
        offsets[num_experts + 1] = total
        if report:
            report_ids(id_flag, valid, total)
            cuda.threadfence_system()


@devfn
def report_ids(flag, valid, npairs):
    """The sort's id check for the caller: flag[0] = 1 where every pair has a valid id
    (``valid`` == npairs: offsets[E]), else 2. ``flag`` is a word of pinned host memory that
    moe_sort_quantize(check_ids=True) polls (gpu.fused.moe.IdChecks) instead of waiting for the
    rows; so each kernel that stores it ends with a system fence (the store leaves the SM at
    once; the fence sees it out before the kernel ends). The sort kernels store it only where
    their ``report`` argument is set (gpu.fused.moe.moe_plan: the sequence of a call with
    check_ids=True): the fence costs about 1 us of the three-launch sort (H100, CUDA graph)."""
    flag[0] = 1 if valid == npairs else 2


@cuda.jit
def moe_scatter_kernel(ids, npairs, num_experts, k, base, perm, inv):
    """perm[row] = token of the pair sorted to ``row`` and inv[pair] = row: base of (chunk,
    bucket) plus the number of earlier pairs of the same bucket in the chunk (stable): those
    of the earlier warps (per-warp counts in shared memory, atomic adds: order-free) plus the
    earlier lanes of the pair's own warp (at most 31 compares)."""
    sid = cuda.shared.array(MOE_CHUNK, int32)
    whist = cuda.shared.array(MOE_WARP_SLOTS, int32)
    t = cuda.threadIdx.x
    ch = cuda.blockIdx.x
    w = t >> 5
    nb = num_experts + 1
    p = ch * MOE_CHUNK + t
    griddep_launch()  # (programmatic dependent launch: the rows may start; they read inv after griddep_wait)
    e = moe_bucket(ids[p], num_experts) if p < npairs else -1
    warp_counts(e, t, w, nb, sid, whist)
    griddep_wait()  # (programmatic dependent launch: the scan's bases are complete and visible)
    if e >= 0:
        row = base[ch * nb + e] + chunk_rank(sid, whist, w, nb, e, t)
        perm[row] = p // k
        inv[p] = row


@devfn
def warp_counts(e, t, w, nb, sid, whist):
    """What chunk_rank reads, for a chunk whose thread t holds a pair of bucket e (-1: none):
    sid[t] = e and whist[v * nb + b] = the pairs of bucket b in warp v (whist zeroed, then
    shared atomics: order-free); block barriers before the counts and after."""
    for i in range(t, MOE_WARPS * nb, MOE_CHUNK):
        whist[i] = 0
    sid[t] = e
    cuda.syncthreads()
    if e >= 0:
        cuda.atomic.add(whist, w * nb + e, 1)
    cuda.syncthreads()


@devfn
def advance_buckets(hist, whist, t, nb):
    """hist[b] (each bucket's next row, or running count) advanced past a chunk: plus the
    chunk's pairs of bucket b, the sum of its per-warp counts (warp_counts' whist)."""
    for e in range(t, nb, MOE_CHUNK):
        n = 0
        for v in range(MOE_WARPS):
            n += whist[v * nb + e]
        hist[e] += n


@devfn
def chunk_rank(sid, whist, w, nb, e, t):
    """The pairs of bucket ``e`` before thread t's own (of warp w) in its chunk (stable):
    those of the earlier warps (whist[v * nb + e], the per-warp counts) plus the earlier
    lanes of its warp whose bucket (sid) is e (at most 31 compares)."""
    rank = 0
    for v in range(w):
        rank += whist[v * nb + e]
    for i in range(t & ~31, t):
        if sid[i] == e:
            rank += 1
    return rank


MOE_WALK = 32  # the one-launch sort: counts of as many blocks a thread reads before it adds them


def scan_buckets_fn(NT):
    """scan_buckets for a block of NT threads (a compile-time constant)."""

    @devfn
    def scan_buckets(tot, part, t, nb):
        """tot[0..nb) (the buckets' totals) made their exclusive scan, the buckets' first rows,
        by a block of NT threads: each thread sums its ceil(nb / NT) neighbouring buckets, a
        Hillis-Steele scan of those sums (``part``: NT words of shared memory), then each
        thread its buckets' runs. Block barriers before and after."""
        cuda.syncthreads()
        q = (nb + NT - 1) // NT
        lo = t * q
        hi = min(nb, lo + q)
        s = 0
        for e in range(lo, hi):
            s += tot[e]
        part[t] = s
        cuda.syncthreads()
        off = 1
        while off < NT:  # inclusive scan of the threads' sums
            v = part[t - off] if t >= off else 0
            cuda.syncthreads()
            part[t] += v
            cuda.syncthreads()
            off *= 2
        run = part[t] - s
        for e in range(lo, hi):
            n = tot[e]
            tot[e] = run
            run += n
        cuda.syncthreads()

    return scan_buckets


scan_buckets = scan_buckets_fn(MOE_CHUNK)  # the sort kernels' (blocks of MOE_CHUNK threads)


@cuda.jit
def moe_sort_kernel(ids, npairs, num_experts, k, counts, sync, perm, offsets, inv, id_flag, report):
    """The three kernels above in one launch (moe_count, moe_scan, moe_scatter: the same
    perm, inv and offsets, bit for bit) of G <= MAX_DONE blocks of MOE_CHUNK threads (the
    launcher takes G <= the SM count). Block b takes the chunks [b * per, (b + 1) * per)
    (per = ceil(chunks / G)), in order:

    1. counts its pairs' buckets (shared atomics) into counts[b, :] (E + 1 buckets) and
       arrives (``_grid.arrive`` on the zeroed workspace ``sync``, which the last block to
       leave, at its end, zeroes again: ``_grid.leave_done``);
    2. waits for every block (``_grid.wait_done``); after HELP_SPINS reads of the arrivals
       it counts the chunks of the blocks not done itself (the same counts, stored to the
       same words) and marks them done. So no block waits for a block that has not started, and
       the sort ends whatever part of the grid is resident: a block that could not start
       (its SM held by other grids, an MPS thread limit), when it does start, counts its
       chunks again, finds every bit set and sorts its chunks (a block barrier over the
       grid, _grid's grid_wait, was removed from this step: a block could wait for ever
       there);
    3. reads bucket e's column of counts (``ld.global.cg``: from L2, never a stale line of
       the SM's L1; MOE_WALK loads in flight a thread; read by atomics, every block's read of
       a count one after another at its L2 slice, the sort took 10.8 us instead of 9.0, H100,
       2048 x top-4 of 256, CUDA graph): ``pre`` the earlier blocks' pairs, ``tot`` every
       block's; scans the totals over the buckets (each thread its ceil(nb / MOE_CHUNK)
       neighbouring buckets, then a Hillis-Steele scan of the threads' sums) into the
       buckets' first rows; block 0 stores offsets (offsets[E]: the pairs with a valid id,
       offsets[E + 1]: all) and, where ``report``, report_ids' id_flag[0] (its system fence at
       the kernel's end);
    4. sorts its chunks as moe_scatter_kernel does, bucket e's rows from first[e] + pre[e]
       on, advanced by each chunk's counts (the first chunk's buckets kept from step 1).

    Its time is global round trips in a row: the ids' load, the counts' store and fence, the
    arrival and the spin, the columns' loads; then the stores. H100, CUDA graph, 2048 tokens
    top-4 of 256: 9.0 us against 9.9 for the three launches; but the whole MoE op (the rows
    after it) 36.2 against 35.2 (programmatic dependents; 34.2 for the three launches with it), and at 64
    tokens top-8 13.3 against 9.0: it pays off in host time, two launches a call fewer, so
    only direct calls take it; calls under graph capture take the three (gpu.fused.moe.moe_plan).
    """
    hist = cuda.shared.array(MOE_BUCKETS, int32)  # the block's counts; then its next row in each bucket
    tot = cuda.shared.array(MOE_BUCKETS, int32)  # every block's counts; then the buckets' first rows
    part = cuda.shared.array(MOE_CHUNK, int32)  # the scan's per-thread sums
    sid = cuda.shared.array(MOE_CHUNK, int32)
    whist = cuda.shared.array(MOE_WARP_SLOTS, int32)
    flag = cuda.shared.array(1, int32)
    miss = cuda.shared.array(DONE_WORDS, int32)
    c = cuda.local.array(MOE_WALK, int32)
    t = cuda.threadIdx.x
    b = cuda.blockIdx.x
    G = cuda.gridDim.x
    w = t >> 5
    nb = num_experts + 1
    nch = (npairs + MOE_CHUNK - 1) // MOE_CHUNK
    per = (nch + G - 1) // G
    c0 = b * per
    c1 = min(nch, c0 + per)
    griddep_launch()  # the row kernel (a programmatic dependent) may start now: it reads inv only after griddep_wait
    e0 = count_chunks(ids, npairs, num_experts, c0, c1, t, hist, counts, b)  # (the first chunk's bucket, kept)
    cuda.syncthreads()
    if t == 0:
        arrive(sync, b)
    while not wait_done(t, sync, flag, miss):  # (every block's counts stored; else the missing ones counted here)
        for g in range(G):
            if missing(miss, g):  # (uniform: shared)
                g0 = g * per
                count_chunks(ids, npairs, num_experts, g0, min(nch, g0 + per), t, hist, counts, g)
                cuda.syncthreads()
                if t == 0:
                    mark_done(sync, g)
    for e in range(t, nb, MOE_CHUNK):
        s = 0
        pre = 0
        g = 0
        while g < G:  # (constant trip counts: unrolled, c in registers, the loads issued together)
            for i in range(MOE_WALK):
                if g + i < G:
                    c[i] = load_cg(counts, (g + i) * nb + e)
            for i in range(MOE_WALK):
                if g + i < G:
                    if g + i == b:
                        pre = s
                    s += c[i]
            g += MOE_WALK
        hist[e] = pre
        tot[e] = s
    scan_buckets(tot, part, t, nb)
    for e in range(t, nb, MOE_CHUNK):
        hist[e] += tot[e]
        if b == 0:
            offsets[e] = tot[e]
    if b == 0 and t == 0:
        offsets[nb] = npairs
        if report:  # (before the block sorts its chunks: the caller may go on)
            report_ids(id_flag, tot[num_experts], npairs)
    for ch in range(c0, c1):
        cuda.syncthreads()  # hist is this chunk's; the previous chunk's reads of whist are done
        p = ch * MOE_CHUNK + t
        e = e0
        if ch != c0:
            e = moe_bucket(ids[p], num_experts) if p < npairs else -1
        warp_counts(e, t, w, nb, sid, whist)
        if e >= 0:
            row = hist[e] + chunk_rank(sid, whist, w, nb, e, t)
            perm[row] = p // k
            inv[p] = row
        if ch + 1 < c1:
            cuda.syncthreads()  # every row of this chunk is taken from hist before it moves on
            advance_buckets(hist, whist, t, nb)
    leave_done(t, sync)  # (at the end: off the way of the rows)
    if report and b == 0 and t == 0:
        cuda.threadfence_system()  # (report_ids' word out before the kernel ends)


# ----------------------------------------------------------------------------- MoE rank
# The sort as the staged OP_SCATTER rows kernel takes it (rank_path): one launch whose blocks
# each rank a chunk of MOE_RANK_CHUNK pairs on their own, the last of them to finish scanning
# the chunks' counts; the rows kernel then finds each pair's row itself.
MOE_RANK_SHIFT = 10  # packed = bucket << MOE_RANK_SHIFT | rank in the chunk
MOE_RANK_CHUNK = 1 << MOE_RANK_SHIFT  # the most pairs a rank block takes (its chunk: 2^csh, csh in 8..10)
MOE_RANK_SUB = MOE_RANK_CHUNK // MOE_CHUNK  # ... in at most MOE_RANK_SUB rounds of its MOE_CHUNK threads' pairs
assert MOE_BUCKETS << MOE_RANK_SHIFT < 2 ** 31


@cuda.jit
def moe_rank_kernel(ids, npairs, num_experts, csh, counts, cbase, packed, offsets, ticket, id_flag, report):
    """Block b (MOE_CHUNK threads) ranks the pairs [b * 2^csh, (b + 1) * 2^csh) of its chunk
    (csh in 8..10: one to MOE_RANK_SUB rounds):
    packed[p] = bucket << MOE_RANK_SHIFT | (the pairs of the same bucket before p in the chunk),
    the bucket as moe_bucket's (E + 1: ids out of range), the rank stable (moe_scatter_kernel's
    per-warp counts and compares, a round of MOE_CHUNK pairs at a time, each bucket's running
    count carried between rounds), and stores its buckets' counts to counts[b, :]. The block
    that finishes last (a ticket: ``atom.add`` on ticket[0], zero at the start, which that
    block sets back to zero) reads every chunk's counts (``ld.global.cg``, MOE_WALK loads in
    flight a thread), scans the totals over the buckets (scan_buckets) and stores
    cbase[c, e] = first row of bucket e's pairs in chunk c, offsets (moe_sort's: [E + 2]) and
    (where ``report``) report_ids' id_flag[0].
    A pair's sorted row is then cbase[p >> csh, bucket] + its rank (_fused_rows,
    RANK): the same rows as moe_sort's, without a second pass over the pairs or a grid
    barrier; no block waits for another."""
    hist = cuda.shared.array(MOE_BUCKETS, int32)  # the chunk's running counts; then the totals' scan
    part = cuda.shared.array(MOE_CHUNK, int32)
    sid = cuda.shared.array(MOE_CHUNK, int32)
    whist = cuda.shared.array(MOE_WARP_SLOTS, int32)
    last = cuda.shared.array(1, int32)
    c = cuda.local.array(MOE_WALK, int32)
    ev = cuda.local.array(MOE_RANK_SUB, int32)
    t = cuda.threadIdx.x
    b = cuda.blockIdx.x
    G = cuda.gridDim.x
    w = t >> 5
    nb = num_experts + 1
    griddep_launch()  # the rows kernel (a programmatic dependent) may start: it reads packed and cbase after griddep_wait
    nsub = 1 << (csh - 8)  # (MOE_CHUNK = 2^8)
    p0 = b << csh
    for r in range(MOE_RANK_SUB):  # every round's id loaded at once (one round trip, not one a round)
        p = p0 + r * MOE_CHUNK + t
        ev[r] = moe_bucket(ids[p], num_experts) if r < nsub and p < npairs else -1
    for e in range(t, nb, MOE_CHUNK):
        hist[e] = 0
    for r in range(nsub):
        cuda.syncthreads()  # hist is this round's; the last round's reads of whist are done
        p = p0 + r * MOE_CHUNK + t
        e = ev[r]
        warp_counts(e, t, w, nb, sid, whist)
        if e >= 0:
            packed[p] = (e << MOE_RANK_SHIFT) | (hist[e] + chunk_rank(sid, whist, w, nb, e, t))
        cuda.syncthreads()  # every rank of this round is taken from hist before it moves on
        advance_buckets(hist, whist, t, nb)
    for e in range(t, nb, MOE_CHUNK):
        counts[b * nb + e] = hist[e]
    cuda.syncthreads()
    if t == 0:
        cuda.threadfence()  # the block's counts are visible before its ticket is
        last[0] = 1 if cuda.atomic.add(ticket, 0, 1) == G - 1 else 0
    cuda.syncthreads()
    if last[0] == 0:
        return
    if t == 0:
        cuda.atomic.exch(ticket, 0, 0)  # (every block has taken its ticket: the next launch finds zero)
    cuda.threadfence()
    for e in range(t, nb, MOE_CHUNK):
        hist[e] = column_cg(counts, G, nb, e, 0, c, cbase, False)
    scan_buckets(hist, part, t, nb)
    for e in range(t, nb, MOE_CHUNK):
        offsets[e] = hist[e]
        column_cg(counts, G, nb, e, hist[e], c, cbase, True)
    if t == 0:
        offsets[nb] = npairs
        if report:
            report_ids(id_flag, hist[num_experts], npairs)
            cuda.threadfence_system()


@devfn
def column_cg(counts, nchunks, nb, e, run, c, base, write):
    """column_walk's sum of bucket e's column of counts from ``run`` (and where ``write``,
    base[ch, e] = the running value before chunk ch), each count by ``ld.global.cg`` (other
    blocks' stores, never a stale L1 line), MOE_WALK loads in flight (``c``)."""
    g = 0
    while g < nchunks:  # (constant trip counts: unrolled, c in registers, the loads issued together)
        for i in range(MOE_WALK):
            if g + i < nchunks:
                c[i] = load_cg(counts, (g + i) * nb + e)
        for i in range(MOE_WALK):
            if g + i < nchunks:
                if write:
                    base[(g + i) * nb + e] = run
                run += c[i]
        g += MOE_WALK
    return run


# ----------------------------------------------------------------------------- the local sort
# gpu.fused.moe.local_path: no sort launch. Each block of the staged rows kernel
# (fused.rows, RANK == RANK_LOCAL) takes a contiguous run of tokens, counts every pair's
# bucket itself (the ids are npairs words, read by every block from L2) and finds its own
# pairs' rows from those counts: rows = the bucket's first row + the bucket's pairs before the
# block's first pair + the rank among the block's own pairs. The same rows as moe_sort's
# stable order, with no block waiting for another and no workspace.
MOE_LOCAL_BUCKETS = 513  # the experts (at most 512) and the bucket of ids out of range (shared counts)
MOE_LOCAL_BATCH = 8  # ids a thread loads before it counts any (one round trip for 8)


@devfn
def local_count(ids, lo, hi, ne, first, t, nt, ht, hb, ev):
    """Count the pairs [lo, hi) (thread t of nt takes lo + t, lo + t + nt, ...): ht[b] += the
    pairs of bucket b (moe_bucket), hb[b] += those before pair ``first``; shared atomics
    (order-free; ptxas aggregates a warp's increments of one address). ``ev``: MOE_LOCAL_BATCH
    int32 of local memory (the batch's buckets). (H100, 2048 tokens top-4: this form 36.3 us
    a call; one atomic a pair into hb or ht by a select between them, 38.8 us, the select
    making the atomics generic ones; into one array of both, its index without a branch, 43.1.)"""
    p = lo + t
    while p < hi:
        for r in range(MOE_LOCAL_BATCH):  # (constant trip counts: unrolled, ev in registers)
            q = p + r * nt
            ev[r] = moe_bucket(ids[q], ne) if q < hi else -1
        for r in range(MOE_LOCAL_BATCH):
            e = ev[r]
            if e >= 0:
                cuda.atomic.add(ht, e, 1)
                if p + r * nt < first:
                    cuda.atomic.add(hb, e, 1)
        p += MOE_LOCAL_BATCH * nt


def local_rows_fn(NT):
    """local_rows for a block of NT threads."""
    scan = scan_buckets_fn(NT)

    @devfn
    def local_rows(ids, ne, npairs, first, cnt, k, ht, hb, ob, part, rw, perm, offsets, t, b):
        """After local_count over every pair (ht: each bucket's pairs; hb: those before pair
        ``first``): rw[q] = the sorted row of pair first + q, q < cnt (the block's own pairs),
        perm[row] = its token (pair // k); block 0 stores offsets (moe_sort's: [E + 2]).
        ``ob``: cnt int32 of shared memory, ``part``: NT. Block barriers before and after."""
        nb = ne + 1
        scan(ht, part, t, nb)  # ht: each bucket's first row
        for q in range(t, cnt, NT):
            ob[q] = moe_bucket(ids[first + q], ne)
        cuda.syncthreads()
        for q in range(t, cnt, NT):
            e = ob[q]
            row = ht[e] + hb[e]
            for j in range(q):  # the block's earlier pairs of the same bucket (stable)
                if ob[j] == e:
                    row += 1
            rw[q] = row
            perm[row] = (first + q) // k
        if b == 0:
            for e in range(t, nb, NT):
                offsets[e] = ht[e]
            if t == 0:
                offsets[nb] = npairs
        cuda.syncthreads()

    return local_rows
