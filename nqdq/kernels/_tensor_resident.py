"""Dynamic per-tensor float scales (fp8_tensor-style) for inputs larger than the one-launch
kernels take, in one cooperative launch that keeps as much of the input on chip as fits.

Every code depends on the amax of the whole tensor, so the streaming path reads the input
twice: an amax pass, then the encode pass. For a tensor larger than L2 both reads come
from DRAM, and the issue's byte count (input + codes + scales) caps that at 60 % of copy
for bf16 -> fp8 (bf16 8192x8192: 201 MB counted, 335 MB moved). This kernel reads less
the second time:

1. A grid of as many blocks as the device holds at once (``P`` = SMs x blocks an SM; a
   cooperative launch, ``launch.cooperative``). Each thread first issues the loads of its
   U *resident* units (16 bytes each): US of them by ``cp.async`` into the block's dynamic
   shared memory, UR into registers. The resident units are the first P * NT * U of the
   tensor, thread t of block b holding units b * NT * U + i * NT + t.
2. While those land, the grid streams the rest in rounds of P * NT * V units (V a thread
   a round, a warp's loads 512 contiguous bytes), keeping only the running amax.
3. The resident units join the amax; block max, then grid max (``_grid.grid_max``), then
   the scale exactly as ``finalize`` computes it (block 0 writes it).
4. The register units are encoded (no read).
5. The streamed rounds are read again **in reverse order**, so the first ones re-read are
   the last ones read, the ones L2 may still hold. While each round's loads are in flight
   the thread encodes its share of the shared-memory units (spread evenly over the
   rounds), so the SMs' encode work overlaps DRAM instead of following it.

On an H100 (132 SMs, 227 KiB of shared memory a block) the default geometry holds
132 x 1024 x (4 + 14) x 16 bytes = 39 MB on chip. The codes are the static kernel's
(``_rowwise_kernels.static_unit_fns``: the same encoder, the same scale), so the results
are those of the two-kernel path bit for bit.

What it gains, and what limits it (H100, bf16 fp8_tensor, docs/performance.md "Twenty-fifth
session"): 62-63 % of copy at 8192x8192 and 16384x7168 (the two kernels: 56 / 58 %), 64-65 %
at 4096x7168 (51 %). ncu shows the second read mostly missing L2: at 8192x8192 DRAM reads
222 MB of which the input is 134 and the streamed part 95, so L2 served only about 7 MB
of the reversed rounds (the codes written meanwhile take its room); the evict-first L2
policy on the second reads or on the code stores did not change that.

Why it cannot deadlock: every block waits for every other (the grid max), which is safe
only if all blocks are resident at once. The launch is cooperative, so the driver starts
the grid only when all P blocks fit (and refuses one that never could) -- concurrent calls
on other streams, or other kernels, delay it, never split it. The grid is sized from the
kernel's own occupancy on the current device (``resident_geometry``).

Under the CUDA simulator the grid is one block (blocks run one after another there), with
a small geometry, so CI runs every phase: resident units in registers and shared memory,
several streamed rounds, a partial last round, unaligned inputs (their resident units
staged through registers, ``_column_kernels.stage_sync``).
"""

from __future__ import annotations

import os
from functools import lru_cache

import numpy as np
from numba import cuda, int32, types

from ._codec import F32, ONE, ZERO
from ._column_kernels import stage_sync
from ._division import recip_guarded
from ._grid import grid_max
from ._mma import cp_async_commit, cp_async_unit, cp_async_wait, ld_shared_u32x4, smem_addr
from ._ptx import array_addr, as_u16, as_u32, fp8_cvt_available, fp8_cvt_supports
from ._quantize_kernels import group_params
from ._rowwise_kernels import _block_max_fn, amax_done, amax_step, load_unit, static_unit_fns, unit_elems, vec_of
from ._scales import MODE_FLOAT
from ._target import SIMULATOR, device_cc

# (NT, UR, US, V): threads a block (one block an SM), units a thread in registers and in
# shared memory, units a thread streams a round. NQDQ_TENSOR_RESIDENT_GEOMETRY="NT,UR,US,V"
# (A/B on a GPU; US 0: as many as the device's shared memory takes). H100, bf16
# 8192x8192 / 16384x7168 / 4096x7168, % of copy (2026-11-27, "Twenty-fifth session"):
# before the interleave of step 5, (1024, 4, 0, 4) 59 / 59 / 60 %, and at 512 threads with
# UR 4 / 8 / 12 / 16 and V 4 / 8 (128 registers) 51-53 / 54-55 / 44-47 %: half the warps
# hide less latency; with it, (1024, 4, 0, 4) 62.5-63 / 61.6-62.4 / 63.5-63.8 %, UR 2
# 62.6 / 61.0 / 65.2 %, V 8 62.0 / 60.6 / 60.2 %.
GPU_GEOMETRY = (1024, 4, 0, 4)
SIM_GEOMETRY = (64, 1, 2, 2)


def _env_geometry():
    v = os.environ.get("NQDQ_TENSOR_RESIDENT_GEOMETRY")
    if not v:
        return GPU_GEOMETRY
    NT, UR, US, V = (int(p) for p in v.split(","))
    if not (NT in (128, 256, 512, 1024) and 0 <= UR <= 32 and 0 <= US <= 64 and 1 <= V <= 16):
        raise ValueError(f"NQDQ_TENSOR_RESIDENT_GEOMETRY={v!r}: need NT 128 .. 1024 (a power of two), UR 0 .. 32, "
                         "US 0 .. 64, V 1 .. 16")
    return NT, UR, US, V


GEOMETRY = SIM_GEOMETRY if SIMULATOR else _env_geometry()
SMEM_RESERVE = 1024  # bytes of a block's shared memory left for the static arrays (block max, grid max)


_SRC = """
def tensor_resident(x, nunits, codes, scales, sync):
    t = cuda.threadIdx.x
    b = cuda.blockIdx.x
    ring = cuda.shared.array(0, u32)  # the block's shared resident units: a thread's unit i at (t + i * NT) * 4
    sb = smem_addr(ring)
    red = cuda.shared.array(NW, int32)
    gslot = cuda.shared.array(1, int32)
    scratch = cuda.shared.array(SCRATCH, int32)
    x32 = as_u32(x)
    c32 = as_u32(codes)
    c16 = as_u16(codes)
    aligned = (array_addr(x) & 15) == 0
    r0 = np.int64(b) * (NT * U) + t  # this thread's resident units: r0 + i * NT (i < US shared, the rest registers)
    s0 = np.int64(cuda.gridDim.x) * (NT * U)  # the streamed units start here
    step = np.int64(cuda.gridDim.x) * (NT * V)  # units a round
    u1 = s0 + np.int64(b) * (NT * V) + t  # this thread's units of round 0: u1 + v * NT
    nrounds = (nunits - s0 + step - 1) // step if nunits > s0 else np.int64(0)
    for i in range(US):
        g = r0 + i * NT
        if aligned:
            cp_async_unit(ring, sb, (t + i * NT) * 4, x32, g * 4, g < nunits)
        else:
            stage_sync(ring, (t + i * NT) * 4, x, x32, g, g < nunits, kind)
    commit()
    if aligned:
        pass
        w{r} = load_unit(x, x32, True, r0 + {r} * NT, r0 + {r} * NT < nunits, kind)  #R
    else:
        pass
        w{r} = load_unit(x, x32, False, r0 + {r} * NT, r0 + {r} * NT < nunits, kind)  #R
    a = np.int32(0)
    a2 = np.uint32(0)
    k = np.int64(0)
    while k < nrounds:  # the streamed units: amax only
        u = u1 + k * step
        if aligned:
            v{v} = load_unit(x, x32, True, u + {v} * NT, u + {v} * NT < nunits, kind)  #V
        else:
            v{v} = load_unit(x, x32, False, u + {v} * NT, u + {v} * NT < nunits, kind)  #V
        a, a2 = amax_step(a, a2, v{v}, kind, VEC)  #V
        k += 1
    wait_all()  # (a thread reads only its own slots: its wait makes them visible to it)
    a, a2 = amax_step(a, a2, w{r}, kind, VEC)  #R
    for i in range(US):
        a, a2 = amax_step(a, a2, ld_shared_u32x4(ring, sb, (t + i * NT) * 4), kind, VEC)
    a = amax_done(a, a2, kind)
    a = block_max(a, t, scratch, red)
    a = grid_max(a, t, sync, gslot)
    st, p0, pz = group_params(MODE_FLOAT, a, ZERO, ZERO, MAXE, 0, 0, 0, ONE, ONE)
    if b == 0 and t == 0:
        scales[0] = st
    rst = recip_guarded(st)
    if r0 + {r} * NT < nunits: static_unit(unit_elems(w{r}, kind), r0 + {r} * NT, 1, st, rst, scales, codes, c16, c32)  #R
    # the streamed rounds again, last first (those L2 still holds), each round's loads in
    # flight while a share of the shared units is encoded
    per = (US + nrounds - 1) // nrounds if nrounds > 0 else np.int64(0)
    j = np.int64(0)
    k = nrounds
    while k > 0:
        k -= 1
        u = u1 + k * step
        if aligned:
            v{v} = load_unit(x, x32, True, u + {v} * NT, u + {v} * NT < nunits, kind)  #V
        else:
            v{v} = load_unit(x, x32, False, u + {v} * NT, u + {v} * NT < nunits, kind)  #V
        e = j + per
        while j < e and j < US:
            g = r0 + j * NT
            if g < nunits:
                static_unit(unit_elems(ld_shared_u32x4(ring, sb, (t + j * NT) * 4), kind), g, 1, st, rst, scales, codes, c16, c32)
            j += 1
        if u + {v} * NT < nunits: static_unit(unit_elems(v{v}, kind), u + {v} * NT, 1, st, rst, scales, codes, c16, c32)  #V
    while j < US:
        g = r0 + j * NT
        if g < nunits:
            static_unit(unit_elems(ld_shared_u32x4(ring, sb, (t + j * NT) * 4), kind), g, 1, st, rst, scales, codes, c16, c32)
        j += 1
"""


def _source(UR, US, V):
    """_SRC with its per-unit lines written out: "#R" lines for the UR register units
    (w{r}: resident units US .. US + UR - 1), "#V" lines for the V streamed units of a round."""
    lines = []
    for line in _SRC.splitlines():
        for mark, key, rng in (("#R", "{r}", range(US, US + UR)), ("#V", "{v}", range(V))):
            if line.endswith(mark):
                lines += [line[: -len(mark)].rstrip().replace(key, str(i)) for i in rng]
                break
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


@lru_cache(maxsize=None)
def make_tensor_resident_kernel(kind, fmt, max_elem, NT, UR, US, V, packed, shfl=None):
    """``tensor_resident`` (module docstring) for blocks of NT threads, UR register and US
    shared resident units a thread, V streamed units a thread a round; launch bounds of one
    block an SM (so ptxas may give a thread 65536 / NT registers). The kernel carries its
    dynamic shared memory (``launch.dynamic_smem``) and is launched cooperatively
    (``launch.cooperative``). ``shfl``: warp shuffles (default: on a GPU)."""
    assert NT % 32 == 0 and UR + US >= 1 and V >= 1
    vec = vec_of(kind)
    nb = fmt[5] if packed else 8
    shfl_on = (not SIMULATOR) if shfl is None else shfl
    static_unit, _ = static_unit_fns(fmt, vec, nb, fp8_cvt_available() and fp8_cvt_supports(fmt), False)
    ns = dict(
        kind=kind, NT=NT, U=UR + US, V=V, VEC=vec, NW=NT // 32, SCRATCH=1 if shfl_on else NT, MAXE=F32(max_elem),
        MODE_FLOAT=MODE_FLOAT, static_unit=static_unit, block_max=_block_max_fn(NT, shfl_on), u32=types.uint32,
        commit=cp_async_commit, wait_all=cp_async_wait(0),
    )  # fmt: skip
    src = _source(UR, US, V)
    ns.update(US=US)
    glb = dict(globals())
    glb.update(ns)
    exec(compile(src, f"<nqdq tensor_resident NT={NT} UR={UR} US={US} V={V}>", "exec"), glb)
    fn = glb["tensor_resident"]
    fn.source = src
    k = cuda.jit(fn) if SIMULATOR else cuda.jit(fn, launch_bounds=(NT, 1))
    k.nqdq_cooperative = True
    k.nqdq_dynamic_smem = NT * US * 16
    return k


def available() -> bool:
    """``cp.async`` (sm_80+) on the current device; always under the simulator (and with no
    GPU, for compile-only tools)."""
    if SIMULATOR or not cuda.is_available():
        return True
    cc = device_cc()
    return cc is not None and cc >= (8, 0)


def resident_geometry(smem_per_block=None, geometry=None):
    """(NT, UR, US, V) of the kernel: ``geometry`` (default GEOMETRY), its US 0 replaced by
    the most units a thread whose slots fit ``smem_per_block`` (default: the device's opt-in
    shared memory a block) less SMEM_RESERVE."""
    NT, UR, US, V = geometry or GEOMETRY
    if US == 0 and not SIMULATOR:
        if smem_per_block is None:
            smem_per_block = int(cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        US = max(0, (smem_per_block - SMEM_RESERVE) // (NT * 16))
    return NT, UR, US, V


_ = (int32, array_addr, as_u16, as_u32, grid_max, group_params, recip_guarded, amax_done, amax_step, load_unit,
     unit_elems, stage_sync, cp_async_unit, ld_shared_u32x4, smem_addr)  # used by the generated source
