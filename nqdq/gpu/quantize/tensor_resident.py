"""Dynamic per-tensor float scales (fp8_tensor-style) for inputs larger than the one-launch
kernels take, in one cooperative launch that keeps as much of the input on chip
as fits.

Every code depends on a statistic of the whole tensor, so the streaming path reads the
input twice: an amax pass, then the encode pass. For a tensor larger than L2 both reads come
from DRAM, and the issue's byte count (input + codes + scales) caps that at 60 % of copy
for bf16 -> fp8 (bf16 8192x8192: 201 MB counted, 335 MB moved). This kernel reads less
the second time. It works on *items* of K consecutive 16-byte units (K = 1 here: one unit an
item; the source generator takes any K).

1. A grid of as many blocks as the device holds at once (``P`` = SMs x blocks an SM; a
   cooperative launch, ``launch.cooperative``). Each thread first issues the loads of its
   U *resident* items: US of them by ``cp.async`` into the block's dynamic shared memory,
   UR into registers. The resident items are the first P * NT * U of the tensor, thread t
   of block b holding items b * NT * U + i * NT + t.
2. While those land, the grid streams the rest in rounds of P * NT * V items (V a thread
   a round), keeping only the running statistic: the amax (NaN and inf counted, as
   ``tensor_amax``'s).
3. The resident items join it; block max, then grid max (``grid.grid_max``), then the
   scale exactly as ``finalize`` computes it, block 0 writing the scale.
4. The register items are encoded (no read).
5. The streamed rounds are read again **in reverse order**, so the first ones re-read are
   the last ones read, the ones L2 may still hold. While each round's loads are in flight
   the thread encodes its share of the shared-memory items (spread evenly over the
   rounds), so the SMs' encode work overlaps DRAM instead of following it.

On an H100 (132 SMs, 227 KiB of shared memory a block) the default geometry holds
132 x 1024 x (4 + 14) x 16 bytes = 39 MB on chip. The encoders are the streaming kernels'
(``lastaxis.static_unit_fns``), so the results are theirs bit for bit.

What it gains, and what limits it (H100, bf16 fp8_tensor; docs/design/per-tensor-dynamic.md):
62-63 % of copy at 8192x8192 and 16384x7168 (the two kernels: 56 / 58 %), 63-65 %
at 4096x7168 (51 %). ncu shows the second read mostly missing L2: at 8192x8192 DRAM reads
212.7 MB, of which the input is 134.2 and the streamed part 95, so L2 served only about
17 MB of the reversed rounds (the codes written meanwhile take its room); the evict-first L2
policy on the second reads or on the code stores did not change that. NVFP4 gained nothing
here (51.9 / 54.1 % against the streaming kernels' 51.2 / 53.6 %; 39 against 48 % at
2048x7168): its block encode bounds it, not the second read, so it stays on the streaming
kernels.

Why it cannot deadlock: every block waits for every other (the grid max), which is safe
only if all blocks are resident at once. The launch is cooperative, so the driver starts
the grid only when all P blocks fit (and refuses one that never could) -- concurrent calls
on other streams, or other kernels, delay it, never split it. The grid is one block an SM:
the launch bounds cap a thread's registers at 65536 / NT, and ``resident_geometry`` sizes
the shared memory by the device's opt-in limit a block, so one block always fits an SM.
Where the process has less of the device at once (an MPS active-thread limit, a green
context of part of the SMs) the driver refuses the grid (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE):
the plan then runs the call by the two-pass plan, warns once, and plans no cooperative
kernel again (``launch.LaunchRefused``, ``plan.QuantPlan.fallback``). Under
``NQDQ_FAST_LAUNCH=0`` (every launch through Numba) it is not planned at all (``available``).

Under the CUDA simulator the grid is one block (blocks run one after another there), with
a small geometry, so CI runs every phase: resident units in registers and shared memory,
several streamed rounds, a partial last round, unaligned inputs (their resident units
staged through registers, ``columns.stage_sync``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import int32, types
from ..runtime.backend import cuda

from ..device.codec import F32, ONE, ZERO
from .columns import stage_sync
from ..device.division import recip_guarded
from .grid import grid_max
from ..ptx.mma import cp_async_commit, cp_async_unit, cp_async_wait, ld_shared_u32x4, smem_addr
from ..ptx.convert import fp8_cvt_available, fp8_cvt_supports
from ..ptx.memory import array_addr, as_u16, as_u32
from .general import group_params
from .lastaxis import static_unit_fns
from .reductions import _block_max_fn, amax_done, amax_step
from .units import load_unit, unit_elems, vec_of
from ..device.scales import MODE_FLOAT
from ..runtime.target import SIMULATOR, devfn, device_has

# (NT, UR, US, V): threads a block (one block an SM), units a thread in registers and in
# shared memory (US 0: as many as the device's shared memory takes), units a thread streams a
# round. H100, bf16 8192x8192 / 16384x7168 / 4096x7168, % of copy:
# before the interleave of step 5, (1024, 4, 0, 4) 59 / 59 / 60 %, and at 512 threads with
# UR 4 / 8 / 12 / 16 and V 4 / 8 (128 registers) 51-53 / 54-55 / 44-47 %: half the warps
# hide less latency; with it, (1024, 4, 0, 4) 62.5-63 / 61.6-62.4 / 63.5-63.8 %, UR 2
# 62.6 / 61.0 / 65.2 %, V 8 62.0 / 60.6 / 60.2 %.
GPU_GEOMETRY = (1024, 4, 0, 4)
SIM_GEOMETRY = (64, 1, 2, 2)
GEOMETRY = SIM_GEOMETRY if SIMULATOR else GPU_GEOMETRY
SMEM_RESERVE = 1024  # bytes of a block's shared memory left for the static arrays (block max, grid max)


_SRC = """
def tensor_resident(x, nitems, codes, scales, ARGS):
    t = cuda.threadIdx.x
    b = cuda.blockIdx.x
    ring = cuda.shared.array(0, u32)  # the block's shared resident items: unit k of a thread's item i at ((i * K + k) * NT + t) * 4
    sb = smem_addr(ring)
    red = cuda.shared.array(NW, int32)
    gslot = cuda.shared.array(1, int32)
    scratch = cuda.shared.array(SCRATCH, int32)
    x32 = as_u32(x)
    c32 = as_u32(codes)
    c16 = as_u16(codes)
    z = np.uint32(0)
    Z4 = (z, z, z, z)
    aligned = (array_addr(x) & 15) == 0
    r0 = np.int64(b) * (NT * U) + t  # this thread's resident items: r0 + i * NT (i < US shared, the rest registers)
    s0 = np.int64(cuda.gridDim.x) * (NT * U)  # the streamed items start here
    step = np.int64(cuda.gridDim.x) * (NT * V)  # items a round
    u1 = s0 + np.int64(b) * (NT * V) + t  # this thread's items of round 0: u1 + v * NT
    nrounds = (nitems - s0 + step - 1) // step if nitems > s0 else np.int64(0)
    for i in range(US):
        g = r0 + i * NT
        for k in range(K):
            if aligned:
                cp_async_unit(ring, sb, ((i * K + k) * NT + t) * 4, x32, (g * K + k) * 4, g < nitems)
            else:
                stage_sync(ring, ((i * K + k) * NT + t) * 4, x, x32, g * K + k, g < nitems, kind)
    commit()
    if aligned:
        pass
        w{r}_{k} = load_unit(x, x32, True, (r0 + {r} * NT) * K + {k}, r0 + {r} * NT < nitems, kind)  #RK
    else:
        pass
        w{r}_{k} = load_unit(x, x32, False, (r0 + {r} * NT) * K + {k}, r0 + {r} * NT < nitems, kind)  #RK
    a = np.int32(0)
    a2 = np.uint32(0)
    k = np.int64(0)
    while k < nrounds:  # the streamed items: the statistic only
        u = u1 + k * step
        if aligned:
            v{v}_{k} = load_unit(x, x32, True, (u + {v} * NT) * K + {k}, u + {v} * NT < nitems, kind)  #VK
        else:
            v{v}_{k} = load_unit(x, x32, False, (u + {v} * NT) * K + {k}, u + {v} * NT < nitems, kind)  #VK
        a, a2 = stat(a, a2, ITEM_v{v})  #V
        k += 1
    wait_all()  # (a thread reads only its own slots: its wait makes them visible to it)
    a, a2 = stat(a, a2, ITEM_w{r})  #R
    for i in range(US):
        a, a2 = stat(a, a2, SLOTS_i)
    a = stat_done(a, a2)
    a = block_max(a, t, scratch, red)
    a = grid_max(a, t, sync, gslot)
    p, q = params(a)
    if b == 0 and t == 0:
        PUBLISH
    encode(ITEM_w{r}, r0 + {r} * NT, nitems, t, scratch, codes, c16, c32, scales, p, q)  #R
    # the streamed rounds again, last first (those L2 still holds), each round's loads in
    # flight while a share of the shared items is encoded
    per = (US + nrounds - 1) // nrounds if nrounds > 0 else np.int64(0)
    j = np.int64(0)
    k = nrounds
    while k > 0:
        k -= 1
        u = u1 + k * step
        if aligned:
            v{v}_{k} = load_unit(x, x32, True, (u + {v} * NT) * K + {k}, u + {v} * NT < nitems, kind)  #VK
        else:
            v{v}_{k} = load_unit(x, x32, False, (u + {v} * NT) * K + {k}, u + {v} * NT < nitems, kind)  #VK
        e = j + per
        while j < e and j < US:
            encode(SLOTS_j, r0 + j * NT, nitems, t, scratch, codes, c16, c32, scales, p, q)
            j += 1
        encode(ITEM_v{v}, u + {v} * NT, nitems, t, scratch, codes, c16, c32, scales, p, q)  #V
    while j < US:
        encode(SLOTS_j, r0 + j * NT, nitems, t, scratch, codes, c16, c32, scales, p, q)
        j += 1
"""


def _source(K, UR, US, V, args, publish):
    """_SRC for items of K units (the unit tuples of an item: ITEM_w{r} / ITEM_v{v} /
    SLOTS_i / SLOTS_j, padded to four with Z4), its per-item lines written out ("#R": the UR
    register items, w{r}_{k}: resident items US .. US + UR - 1; "#V": the V streamed items
    of a round; "#RK" / "#VK": one line per unit of each), the kernel's extra parameters
    ``args`` and the statement that publishes the tensor's scale (``publish``)."""

    def item(name):
        return ", ".join(f"{name}_{k}" if k < K else "Z4" for k in range(4))

    def slots(i):
        return ", ".join(f"ld_shared_u32x4(ring, sb, (({i} * K + {k}) * NT + t) * 4)" if k < K else "Z4" for k in range(4))

    marks = {"#RK": ("r", range(US, US + UR), True), "#VK": ("v", range(V), True),
             "#R": ("r", range(US, US + UR), False), "#V": ("v", range(V), False)}
    lines = []
    for line in _SRC.replace("ARGS", args).replace("PUBLISH", publish).splitlines():
        for mark, (key, rng, per_unit) in marks.items():
            if line.endswith(mark):
                body = line[: -len(mark)].rstrip()
                for n in rng:
                    out = body.replace("{%s}" % key, str(n))
                    out = out.replace(f"ITEM_w{n}", item(f"w{n}")).replace(f"ITEM_v{n}", item(f"v{n}"))
                    lines += [out.replace("{k}", str(k)) for k in range(K)] if per_unit else [out]
                break
        else:
            lines.append(line.replace("SLOTS_i", slots("i")).replace("SLOTS_j", slots("j")))
    return "\n".join(lines) + "\n"


def _build(name, src, ns, NT, US, K):
    glb = dict(globals())
    glb.update(ns)
    # generated kernel source: why it is generated, see the note in quantize/unrolled.py
    exec(compile(src, f"<nqdq {name}>", "exec"), glb)
    fn = glb["tensor_resident"]
    fn.source = src
    k = cuda.jit(fn) if SIMULATOR else cuda.jit(fn, launch_bounds=(NT, 1))
    k.nqdq_cooperative = True
    k.nqdq_dynamic_smem = NT * US * K * 16
    return k


def _common(kind, NT, UR, US, V, K, shfl):
    shfl_on = (not SIMULATOR) if shfl is None else shfl
    return dict(kind=kind, NT=NT, U=UR + US, US=US, V=V, K=K, VEC=vec_of(kind), NW=NT // 32,
                SCRATCH=1 if shfl_on else NT, block_max=_block_max_fn(NT, shfl_on), u32=types.uint32,
                commit=cp_async_commit, wait_all=cp_async_wait(0)), shfl_on  # fmt: skip


@lru_cache(maxsize=None)
def make_tensor_resident_kernel(kind, fmt, max_elem, NT, UR, US, V, packed, shfl=None):
    """``tensor_resident`` (module docstring) for a float scale of the whole tensor: items of
    one unit; blocks of NT threads, UR register and US shared resident units a thread, V
    streamed units a thread a round; launch bounds of one block an SM (so ptxas may give a
    thread 65536 / NT registers). Its parameters (x, nunits, codes, scales, sync). The kernel
    carries its dynamic shared memory (``launch.dynamic_smem``) and is launched cooperatively
    (``launch.cooperative``). ``shfl``: warp shuffles (default: on a GPU)."""
    assert NT % 32 == 0 and UR + US >= 1 and V >= 1
    ns, _ = _common(kind, NT, UR, US, V, 1, shfl)
    vec = ns["VEC"]
    static_unit, _ = static_unit_fns(fmt, vec, fmt[5] if packed else 8, fp8_cvt_available() and fp8_cvt_supports(fmt),
                                     False)  # fmt: skip
    maxe = F32(max_elem)

    @devfn
    def stat(a, a2, w0, w1, w2, w3):
        return amax_step(a, a2, w0, kind, vec)  # (every unit: NaN and inf count, as tensor_amax's)

    @devfn
    def params(a):
        st, p0, pz = group_params(MODE_FLOAT, a, ZERO, ZERO, maxe, 0, 0, 0, ONE, ONE)
        return st, recip_guarded(st)

    @devfn
    def stat_done(a, a2):
        return amax_done(a, a2, kind)

    @devfn
    def encode(w0, w1, w2, w3, u, n, t, scratch, codes, c16, c32, scales, st, rst):
        if u < n:
            static_unit(unit_elems(w0, kind), u, 1, st, rst, scales, codes, c16, c32)

    ns.update(stat=stat, stat_done=stat_done, params=params, encode=encode)
    src = _source(1, UR, US, V, "sync", "scales[0] = p")
    return _build(f"tensor_resident NT={NT} UR={UR} US={US} V={V}", src, ns, NT, US, 1)


def available() -> bool:
    """``cp.async`` (sm_80+) on the current device and a cooperative launch to be had
    (``launch.ex_launch_ok``: the fast launch path, not refused in this process); always
    under the simulator (and with no GPU, for compile-only tools)."""
    from ..runtime.launch import ex_launch_ok

    return device_has((8, 0)) and ex_launch_ok("cooperative")


def resident_geometry(smem_per_block=None, geometry=None):
    """(NT, UR, US, V) of the kernel: ``geometry`` (default GEOMETRY), its US 0 replaced by
    the most units a thread whose slots fit ``smem_per_block`` (default: the device's opt-in
    shared memory a block) less SMEM_RESERVE (at least one resident unit a thread)."""
    NT, UR, US, V = geometry or GEOMETRY
    if US == 0 and not SIMULATOR:
        if smem_per_block is None:
            smem_per_block = int(cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        US = max(0, (smem_per_block - SMEM_RESERVE) // (NT * 16))
    return NT, (UR if UR + US else 1), US, V


_ = (np, int32, array_addr, as_u16, as_u32, grid_max, load_unit, stage_sync, cp_async_unit, ld_shared_u32x4,
     smem_addr)  # used by the generated source
