"""Per-channel (``column``) float scales in one pass by thread-block clusters
(``column_cluster``, sm_90+): a stripe of W 16-byte unit columns down ALL the rows is one
cluster of CL blocks, so the stripe's amax is combined in the cluster's shared memory, with
no workspace, no counters and no wait on any block outside the cluster.

Block ``rank`` of a stripe's cluster holds rows ``rank * R .. rank * R + R - 1`` (R = U *
RG, RG = NT / W rows at a time): thread t takes unit column ``t % W`` of rows ``rank * R +
t // W + i * RG``, i < U: its first U - UR units staged in the block's shared memory by
``cp.async`` (a thread's own slots: its wait makes them visible to it), the last UR loaded
into registers (so that a block holds 512 or 1024 rows of a 128-byte stripe at 3 or 2
blocks an SM: ``GPU_CONFIGS``); an aligned input's loads carry the ``.L2::256B`` prefetch
size (the neighbouring stripe's half of the 256 bytes comes into L2 with them, for the
cluster resident beside this one: H100, bf16 int8_column, 8192x8192 88.9 -> 90.5 % of copy,
16384x7168 84.0 -> 86.0 %). While the loads fly, thread 0 sets
up the block's mbarrier for CL * 4W words and a cluster barrier (relaxed arrival, acquire
wait) makes every block's mbarrier ready before anyone stores into it. Then each block

1. keeps the per-channel max of |x| in the input's own width (``word_max``: four words a
   thread), combines it over the lanes of its unit column (butterfly) and over the warps
   (one shared slot each, one block barrier) into the block's 4W words;
2. pushes those words into every block of the cluster, itself included, by ``st.async``
   (``ptx.st_async_u32``: each store counts its bytes into the receiver's mbarrier) and
   waits on its own mbarrier (acquire, cluster scope) until all CL blocks' words are in;
3. one thread a channel combines that channel's word of the CL blocks, computes the scale
   as ``finalize`` does and its reciprocal (``channel_scale``; rank 0 writes the stripe's
   scales), then a block barrier;
4. encodes its units from shared memory and registers as ``column_ring`` does (the
   reciprocal encoder straight-line where every scale of its channels has one and all U
   units are inside the data) and writes the codes. A block exits only after every store
   into it has landed, and nobody reads its memory, so it needs no barrier before it exits.

The push, not a pull (each block's words read by ``ld.shared::cluster`` between a release /
acquire cluster barrier): ptxas makes every cluster-scope release a ``MEMBAR.GPU`` (a round
trip to L2, under load: ncu put 12 % of the warps' stall cycles there); the push measured
1.0-1.3 us faster at bf16 8192x8192.

So the input is read once (bytes = input + codes + scales), and a block waits only for
the CL - 1 blocks that the hardware launched with it on the same GPC, which other resident
blocks of the SM cover, as they cover the row kernel's block barrier. Clusters never wait
on each other, so any grid size is safe (no residency argument, unlike ``column_ring``).

Launched with one cluster a stripe (grid = S * CL blocks, ``launch.cluster_size`` of the
kernel: ``cuLaunchKernelEx`` with the cluster attribute; rule ``column_cluster`` of
``plan``, ``choices.PerChannel.CLUSTER``) where ``available`` and ``cluster_geometry`` fit;
else the ring or the kernels of ``columns``. Under the CUDA simulator a cluster is one block (CL = 1: the barriers
and the mbarrier wait are block barriers, the stores and loads the block's own words,
``ptx``'s twins); the GPU tests run CL = 16.
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
from numba import types
from ..runtime.backend import cuda

from ..device.codec import F32, KIND_F32
from .columns import (# fmt: skip
    SMEM_PER_SM, _expand, amax_bits, channel_scale, encode_unit_cols, encode_unit_cols_r, rint_in_range, stage_sync,
    unit_col_scales, units_inside, word_max,
)
from ..ptx.mma import cp_async_commit, cp_async_unit_l2_256, cp_async_wait, ld_shared_u32x4, smem_addr
from ..ptx.cluster import cluster_arrive_relaxed, cluster_wait, mbar_init_tx, mbar_wait0, st_async_u32
from ..ptx.convert import fp8_cvt_available, fp8_cvt_supports
from ..ptx.memory import array_addr, as_u16, as_u32, load_u32x4_l2_256
from ..ptx.pairs import u16x2_max
from .units import load_unit, unit_elems, vec_of
from ..runtime.target import SIMULATOR, devfn, device_has


# (NT, U, UR) tried in order by cluster_geometry: NT threads a block, U 16-byte units a
# thread, UR of them in registers and U - UR in shared slots (cp.async). The first whose
# stripes are wide enough (MIN_STRIPE_BYTES) takes the shape. H100, bf16 int8_column, clusters
# of 16, % of copy, measured before the .L2::256B loads (the bound and the current figures:
# docs/design/per-channel.md):
# * (256, 16, 10): 24 KiB shared + 40 registers of data a thread, 3 blocks an SM: 8192x8192
#   88.8 %, 4096x7168 84.9 % (UR 8: 87.8 / 84.5 %; UR 0, all shared: 85.0 / 80.3 %; the
#   previous (512, 8, 0): 85.0 / 79.5 %; 8192x8192: UR 4 / 5 / 6 under launch bounds of 4
#   blocks an SM, the rest staged, 85.9 / 86.7 / 84.7 %; UR 9, no spill, 88.1 %; UR 12 at 2
#   blocks an SM 86.0 %; 256-byte stripes at 2 blocks of 512 threads an SM, (512, 16, 4 / 5 /
#   6), 83.2 / 82.8 / 83.9 %, at 1 block of 1024, (1024, 8, 2 / 4), 61 / 62 %; clusters of 8,
#   (512, 16, 5), 84.1 %, and of 12, (512, 11, 5), 82.3 %; 4096x7168 in clusters of 8:
#   84.9 %);
# * (512, 16, 5), for up to twice the rows (16384x7168: 128-byte stripes of 1024 rows a
#   block, 88 KiB shared, 2 blocks an SM): 83.6 % (UR 4: 83.1 %; the ring: 76.5 %; 64-byte
#   stripes at 3 blocks an SM, (256, 16, 4 / 8 / 9 / 10): 68.7 / 72.9 / 73.0 / 74.2 %).
# A cluster that takes stripes in turn (as many clusters as are resident: 21 / 14 of 16
# blocks by cuOccupancyMaxActiveClusters for these two configs; the next stripe's loads
# issued after an encode) was 10-17 % slower than this kernel at every shape, and as slow
# with one cluster a stripe, so the loop itself cost it.
# With the .L2::256B loads, at 16384x7168 (the default 86 %):
# 64-byte stripes, (256, 16, 10 / 8), 82.2 / 80.9 %; clusters of 8, (512, 16, 5), 64-byte
# stripes, 78.8 %; blocks of 1024 threads, CL 16 (1024, 8, 2) / CL 8 (1024, 16, 4), 64.6 /
# 78.7 %; the first wave's stripe pairs delayed by 0.5-1 us each (nanosleep), 87 %, but the
# delays must stop at the resident cluster count, which the plan does not know: not kept.
# Each block prefetching into L2 the rows of the stripe that takes its place next wave: 86 % at
# best and slower with more (L2 evicts the lines first); with
# no encode at all (timing only) the kernel reaches 88 %, and a stream of its read pattern
# alone (benchmarks/peers.py --bound stripe-stream: no amax, no encode) 89 %, against 95 % for the same
# stream reading in row order.
GPU_CONFIGS = ((256, 16, 10), (512, 16, 5))


# the simulator: clusters of one block, 64 threads x 2 units in shared slots; a GPU: clusters
# by the SM count (cluster_size_for), GPU_CONFIGS
CLUSTER_SIZE, CLUSTER_CONFIGS = (1, ((64, 2, 0),)) if SIMULATOR else (0, GPU_CONFIGS)
# a row's share of a stripe at least this many bytes: DRAM reads 32- and 64-byte pieces of
# rows 16 KiB apart poorly (H100, bf16 int8_column, clusters of 8 or 16, registers: 8192x8192
# 32-byte shares 34 % of copy, 64-byte 71 %, 128-byte 78 %; 16384x7168 64-byte shares 67-71 %
# against the ring's 76 %), so cluster_geometry passes over a config that would cut rows finer
# (the next config, else the ring)
MIN_STRIPE_BYTES = 128


def cluster_size_for(sms):
    """Blocks a cluster where CLUSTER_SIZE is 0: 16 (the most an H100 / H200 GPC takes, not
    portable) on GPUs of 132 SMs or more, else 8 (portable); 1 under the simulator."""
    if SIMULATOR:
        return 1
    return CLUSTER_SIZE or (16 if sms >= 132 else 8)


@devfn
def comb(a, b, kind):
    """The per-channel max of two of word_max's words: f32 magnitude bits (their integer
    order is that of |x|, NaN above inf), else two 16-bit magnitudes a word (max.u16x2)."""
    if kind == KIND_F32:
        return max(np.uint32(a), np.uint32(b))
    return u16x2_max(np.uint32(a), np.uint32(b))


@devfn
def xor_comb(v, off, shfl, scratch, t, kind):
    """comb(v, v of lane t ^ off): a butterfly step (``shfl``: by shuffle; else through
    shared memory, every thread of the block calling, as in ``quantize.reductions.xor_max``)."""
    if shfl:
        return comb(v, np.uint32(cuda.shfl_xor_sync(0xFFFFFFFF, np.int32(v), off)), kind)
    cuda.syncthreads()
    scratch[t] = v
    cuda.syncthreads()
    return comb(v, scratch[t ^ off], kind)


@devfn
def load_unit_l2_256(x32, unit, valid):
    """``load_unit`` of an aligned input (16-byte unit ``unit`` of the word view ``x32``;
    zeros where not ``valid``) with the ``.L2::256B`` prefetch size."""
    z = np.uint32(0)
    if not valid:
        return z, z, z, z
    return load_u32x4_l2_256(x32, unit)


_SRC = """
def column_cluster(x, rows, upr, C, scales, codes):
    t = cuda.threadIdx.x
    stripe = cuda.blockIdx.x // CL
    rank = cuda.blockIdx.x - stripe * CL
    ring = cuda.shared.array(0, u32)  # the block's units: U a thread, a thread's own slots
    sb = smem_addr(ring)
    scratch = cuda.shared.array(SCRATCH, u32)
    red = cuda.shared.array(RED, u32)  # per warp: W unit columns x 4 words
    recv = cuda.shared.array(RECV, u32)  # every block's words, block r's at r * BAM
    mbar = cuda.shared.array(1, u64)
    sc = cuda.shared.array(CH, np.float32)
    rcs = cuda.shared.array(CH, np.float32)
    x32 = as_u32(x)
    c32 = as_u32(codes)
    c16 = as_u16(codes)
    lu = t % W
    uc = stripe * W + lu
    r0 = rank * (U * RG) + t // W
    nv = units_inside(rows, r0, uc, upr, LOG_RG, U)
    g = np.int64(r0) * upr + uc
    ustep = np.int64(RG) * upr  # units between a thread's rows
    if (array_addr(x) & 15) == 0:
        LOAD_A{i}  #U
    else:
        LOAD_U{i}  #U
    commit()
    if t == 0:  # while the loads fly: every block's mbarrier set up before any block stores into it
        mbar_init_tx(mbar, CL * BAM * 4)
    cluster_arrive_relaxed()
    cluster_wait()
    wait_all()  # (a thread reads only its own slots: its wait makes them visible to it)
    z = np.int32(0)
    m = (z, z, z, z, z, z, z, z)
    m = word_max(m, SLOT{i}, kind)  #U
    q0 = np.uint32(m[0])
    q1 = np.uint32(m[Q1])  # (16-bit kinds: word k in m[2k] and m[2k + 1])
    q2 = np.uint32(m[Q2])
    q3 = np.uint32(m[Q3])
    off = 16
    while off >= W:  # the lanes of one unit column
        q0 = xor_comb(q0, off, SHFL, scratch, t, kind)
        q1 = xor_comb(q1, off, SHFL, scratch, t, kind)
        q2 = xor_comb(q2, off, SHFL, scratch, t, kind)
        q3 = xor_comb(q3, off, SHFL, scratch, t, kind)
        off >>= 1
    if t % 32 < W:
        rb = ((t // 32) * W + lu) * 4
        red[rb] = q0
        red[rb + 1] = q1
        red[rb + 2] = q2
        red[rb + 3] = q3
    cuda.syncthreads()
    if t < W * 4:
        a = red[t]
        for k in range(1, NW):
            a = comb(a, red[k * (W * 4) + t], kind)
        for r in range(CL):
            st_async_u32(recv, rank * BAM + t, a, mbar, r)
    mbar_wait0(mbar)  # every block's words are here
    if t < CH:  # channel t: word (t // VEC) * 4 + its element's word, of each block of the cluster
        e = t % VEC
        wi = (t // VEC) * 4 + (e // 2 if VEC == 8 else e)
        a = recv[wi]
        for r in range(1, CL):
            a = comb(a, recv[r * BAM + wi], kind)
        col = stripe * CH + t
        channel_scale(amax_bits(a, e, kind), t, col, rank == 0 and col < C, sc, rcs, scales, MAXE)
    cuda.syncthreads()
    sv, rc, ok, okr = unit_col_scales(sc, rcs, lu * VEC, VEC)
    if okr and nv == U:  # every unit inside, every scale with a reciprocal: one basic block
        encode_unit_cols_r(unit_elems(SLOT{i}, kind), sv, rc, g + {i} * ustep, codes, c16, c32, fmt, CVT, VEC, NB, NOCLIP)  #U
    elif okr:
        if {i} < nv: encode_unit_cols_r(unit_elems(SLOT{i}, kind), sv, rc, g + {i} * ustep, codes, c16, c32, fmt, CVT, VEC, NB, NOCLIP)  #U
    else:  # a NaN / inf in a channel, a zero or out-of-range scale: the general encode
        if {i} < nv: encode_unit_cols(unit_elems(SLOT{i}, kind), sv, ok, g + {i} * ustep, codes, c16, c32, fmt, CVT, VEC, NB)  #U
"""


@lru_cache(maxsize=None)
def make_column_cluster_kernel(kind, fmt, max_elem, CL, NT, W, U, packed, shfl=None, UR=0):
    """``column_cluster`` for clusters of CL blocks of NT threads, stripes W units wide, U
    units a thread (R = U * NT / W rows a block), U - UR of them staged in shared memory by
    cp.async and UR loaded into registers; the kernel carries its cluster size
    (``launch.cluster_size``) and its dynamic shared memory (``launch.dynamic_smem``);
    launch bounds of as many blocks an SM as that memory and the registers allow (3 of 256
    threads x (6 + 10) units, 2 of 512 x (11 + 5)). ``shfl``: warp shuffles (default: on a
    GPU; the simulator has none)."""
    assert NT % 32 == 0 and 1 <= W <= 32 and W & (W - 1) == 0 and NT % W == 0
    vec = vec_of(kind)
    RG = NT // W
    shfl_on = (not SIMULATOR) if shfl is None else shfl
    ns = dict(
        kind=kind, fmt=fmt, CL=CL, NT=NT, W=W, RG=RG, LOG_RG=RG.bit_length() - 1, U=U, VEC=vec, CH=W * vec,
        Q1=1 if vec == 4 else 2, Q2=2 if vec == 4 else 4, Q3=3 if vec == 4 else 6,
        NW=NT // 32, RED=NT // 32 * W * 4, BAM=W * 4, RECV=CL * W * 4,
        SCRATCH=1 if shfl_on else NT, NB=(fmt[5] if packed else 8), SHFL=shfl_on,
        CVT=fp8_cvt_available() and fp8_cvt_supports(fmt), MAXE=F32(max_elem),
        NOCLIP=rint_in_range(fmt, F32(max_elem)), u32=types.uint32, u64=types.uint64,
        commit=cp_async_commit, wait_all=cp_async_wait(0),
    )  # fmt: skip
    src = _units(_expand(_SRC, U), U, U - UR) + "\n"
    glb = dict(globals())
    glb.update(ns)
    # (the units' statements written out: quantize.unrolled's note says why)
    exec(compile(src, f"<nqdq column_cluster CL={CL} NT={NT} W={W} U={U} UR={UR}>", "exec"), glb)
    fn = glb["column_cluster"]
    fn.source = src
    # blocks an SM: as many as the shared slots allow, and the registers (about 40 a thread
    # and 4 a register unit)
    bps = max(1, min(2048 // NT, SMEM_PER_SM // (slot_bytes(NT, U - UR) + 4096), 65536 // (NT * (40 + 4 * UR))))
    k = cuda.jit(fn) if SIMULATOR else cuda.jit(fn, launch_bounds=(NT, bps))
    k.nqdq_cluster = CL
    k.nqdq_dynamic_smem = slot_bytes(NT, U - UR)
    return k


def _units(src, U, US):
    """A thread's units 0 .. US - 1 in the block's shared slots (cp.async; "SLOT{i}" a load
    of the slot), US .. U - 1 in registers w{i} (ld.global): each whole token LOAD_A{i},
    LOAD_U{i} (the aligned and unaligned loads, the aligned ones with the ``.L2::256B``
    prefetch size) and SLOT{i} of ``src`` replaced."""

    def unit(m):
        what, i = m.group(1), int(m.group(2))
        assert i < U, m.group(0)
        if i < US:
            return {
                "LOAD_A": f"cp_async_unit_l2_256(ring, sb, (t + {i} * NT) * 4, x32, (g + {i} * ustep) * 4, {i} < nv)",
                "LOAD_U": f"stage_sync(ring, (t + {i} * NT) * 4, x, x32, g + {i} * ustep, {i} < nv, kind)",
                "SLOT": f"ld_shared_u32x4(ring, sb, (t + {i} * NT) * 4)",
            }[what]
        return {
            "LOAD_A": f"w{i} = load_unit_l2_256(x32, g + {i} * ustep, {i} < nv)",
            "LOAD_U": f"w{i} = load_unit(x, x32, False, g + {i} * ustep, {i} < nv, kind)",
            "SLOT": f"w{i}",
        }[what]

    return re.sub(r"\b(LOAD_A|LOAD_U|SLOT)(\d+)\b", unit, src)


def slot_bytes(NT, U):
    """Shared memory of a block's units: U 16-byte units a thread."""
    return NT * U * 16


def available() -> bool:
    """Clusters on the current device: compute capability 9.0 or newer (the simulator's
    clusters of one block always; with no GPU, compile-only tools such as the PTX audit
    target sm_90: yes), where a cluster launch is to be had (``launch.ex_launch_ok``: the
    fast launch path, not refused in this process)."""
    from ..runtime.launch import ex_launch_ok

    return device_has((9, 0)) and ex_launch_ok("cluster")


def cluster_geometry(rows, upr, vec, sms, cl=None, configs=None):
    """(CL, NT, W, U, UR) of ``column_cluster`` for ``rows`` rows of ``upr`` 16-byte units,
    from the first of ``configs`` ((NT, U, UR) each; default CLUSTER_CONFIGS: GPU_CONFIGS on
    a GPU) that applies, or None where none
    does. A block of NT threads takes RG = NT / W rows at a time, U of
    them, so the cluster's CL blocks hold CL * U * RG >= rows; RG is the least power of two
    that covers, but at least ``vec`` (so that the block's RG * W threads are as many as its
    W * vec channels: a thread computes each scale), and W = NT / RG (at most 32, and no
    wider than the row needs); the NT returned is RG * W. A config does not apply where W
    would cut a row into pieces of less than MIN_STRIPE_BYTES (too many rows: the next
    config, else the ring), nor where one block of the widest stripes already holds every
    row (the single-block kernels take those). ``sms``: the SM count (``cluster_size_for``)."""
    CL = cl or cluster_size_for(sms)
    for NT, U, UR in configs or CLUSTER_CONFIGS:
        if rows <= U * (NT // 32):
            return None
        RG = max(1 << max(-(-rows // (CL * U)) - 1, 0).bit_length(), vec)
        W = min(NT // RG, 32, 1 << max(upr - 1, 0).bit_length())
        if (W * 16 < MIN_STRIPE_BYTES and W < upr) or RG * W < 32:
            continue
        return CL, RG * W, W, U, UR
    return None


def cluster_launch(kind, fmt, max_elem, packed, rows, C, geometry, x, scales, codes):
    """The launch ``(kernel, grid, block, args)`` of ``column_cluster`` with ``geometry``
    (cluster_geometry's)."""
    upr = C // vec_of(kind)
    CL, NT, W, U, UR = geometry
    k = make_column_cluster_kernel(kind, fmt, max_elem, CL, NT, W, U, packed, UR=UR)
    return (k, -(-upr // W) * CL, NT, (x, rows, upr, C, scales, codes))


_ = (amax_bits, channel_scale, encode_unit_cols, encode_unit_cols_r, stage_sync, unit_col_scales, units_inside, word_max,
     cp_async_unit_l2_256, ld_shared_u32x4, smem_addr, cluster_arrive_relaxed, cluster_wait, mbar_init_tx, mbar_wait0,
     st_async_u32, array_addr, as_u16, as_u32, load_unit, unit_elems)  # used by the generated source
