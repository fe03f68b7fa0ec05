"""Fast kernels for the common case: a C-contiguous input whose scale groups run along
the LAST axis and are either whole rows (per-token: fp8_row, int8_row) or small groups
that tile each row exactly (1xG with G/VEC a power of two <= 32: fp8_1x128, int4_group,
MXFP8/6/4, NVFP4's block pass), float32 / float16 / bfloat16 input, RNE elements and
dynamic scales of the float, MX and NVFP4 modes; also asymmetric integer rows / groups
and centred INT8 groups (``lastaxis_asym_rows``, ``lastaxis_stat_groups``) and caller-given
float scales per tensor or row (``static_encode``). Everything else runs the general kernels
of ``general``; the planner decides, at plan time.

This module holds the kernels: their templates and factories, and the names their statements
call (written out per unit from the templates: ``unrolled`` says why). Their device functions:
``units`` (load, unpack and store a unit), ``reductions`` (amax, butterflies, block max),
``encoders`` (round to nearest), ``pair_encoders`` (MX and NVFP4 on bfloat16 pairs),
``sr_units`` (stochastic rounding), ``asym_units`` (asymmetric and centred statistics and
encoders); the group kernels' per-chunk steps: ``group_chunks``, ``stat_chunks``.

Why a separate family: the general kernels index any (d0, d1, d2, C) view element by
element; these move memory in the widest pieces the GPU has and keep every value in
registers between the statistic and the encode, which is what reaching the copy bandwidth
takes:

* a *unit* is 16 bytes of input (8 bf16/f16 or 4 f32 values): one ``ld.global.nc.v4.u32``
  (``ptx.memory.load_u32x4``) per unit, all of a thread's U units issued before any is used;
* its codes leave in one store (8 fp8/int8 codes: ``st.global.v2.u32``; 8 fp4 codes: one
  32-bit store; fp6: three 16-bit stores);
* one read of the input: the unit words stay in registers from the amax to the encode;
* a group of G elements is L = G / VEC consecutive units: a thread takes chunks of K of
  them (K = 1 for fp8, whose encode is cheap and whose loads then stay coalesced; up to 4
  for fp4 / fp6 / int, which then compute the group parameters once per chunk), and the
  L / K lanes of a group combine their amax by ``shfl.sync.bfly`` (``xor_max``); a row is
  combined by the warps of one block (one shared-memory slot per warp, one barrier);
* finite groups take shorter exact encoders: fp8 two codes per ``cvt.rn.satfinite.e4m3x2``,
  e2m1 and integers by float rounding tricks without a float -> int conversion; MXFP4,
  MXFP6 and NVFP4 of bfloat16 input two elements per instruction on bfloat16 pairs
  (``e2m1_unit_bf16``, ``fp6_unit_bf16``, ``e2m1_unit_nvfp4``: ``pair_encoders``; float32
  element words of MX e2m1 / fp6 likewise, rounded to odd into bfloat16 first).

Exactness is the reference's, by the same device functions as the general kernels:
``group_params`` for the scale (float ``amax / max`` by IEEE division, MX e8m0 codes,
NVFP4 ue4m3), ``encode_element`` for the elements (IEEE ``x / s`` for float scales: by
``div.rn``, or in finite units from one reciprocal per scale and a correction step that gives
the same quotient bit for bit, ``device.division`` / ``recip_store_unit``;
``x * 2^-k`` for MX -- the exact reciprocal of a power of two, so the product is
the same float32 as the quotient, see ``device.codec.e8m0_reciprocal``), and the amax as the max
of |x|'s float32 bits (order-independent, NaN-propagating). A group whose amax is not
finite (it holds a NaN or an infinity) takes ``encode_element`` per element, NaN rules
included; only finite groups, where no NaN can arise, use the shorter encoders
(``enc_finite``, the paired cvt), which give encode_element's codes for every non-NaN value
(tests/test_kernels.py::test_finite_group_encoders, ::test_fp8_cvt_pair_matches_twin).

The warp shuffle has a twin (``xor_max`` with ``shfl=False``: shared memory and barriers)
that the CUDA simulator runs; the GPU tests run both variants.

Stochastic rounding: every factory takes ``stoch`` (compile-time; False builds the kernels
above unchanged), whose kernel keeps the loads, statistics, scales and stores and encodes
each element by encode_element with its Philox bits (``sr_units``), taking the seed's
halves as two more arguments.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import float32, int32, uint32

from ..device.codec import F32, ONE, ZERO, bits_f32, f32_bits
from ..device.division import ratio_ok, recip_guarded
from ..device.scales import MODE_ASYM, MODE_FLOAT, MODE_NVFP4, nvfp4_tensor_encode_scale
from ..ptx.convert import fp8_cvt_available, fp8_cvt_supports
from ..ptx.memory import array_addr, as_u16, as_u32
from ..runtime.backend import cuda
from ..runtime.target import SIMULATOR, devfn
from .asym_units import asym_group, asym_unit_store_r, unit_keys
from .encoders import encode_store_unit_r, recip_store_unit
from .general import group_params, store_scale
from .grid import DONE_WORDS, grid_max_help, grid_max_publish, grid_max_read, missing, wait_done
from .group_chunks import group_chunk_fns, unit_consts
from .reductions import _block_max_fn, abs_i32, amax_done, amax_step, unit_amax, unit_amax_finite
from .sr_units import sr_store_unit, sr_store_unit_r
from .stat_chunks import stat_chunk_fns
from .units import FINITE, load_unit, unit_elems, vec_of
from .unrolled import jit_unrolled, sub_once

__all__ = ["make_lastaxis_group_kernel", "make_lastaxis_row_kernel", "make_lastaxis_asym_row_kernel",
           "make_lastaxis_stat_group_kernel", "make_static_kernel", "make_tensor_amax_kernel",
           "make_amax_from_parts_kernel", "vec_of", "SHFL_DEFAULT"]

SHFL_DEFAULT = not SIMULATOR  # the simulator has no warp shuffle: it runs the twin


def _jit_unrolled(name, template, ns, U, K=1):
    """unrolled.jit_unrolled of a template of this module (or ``tiles``'), its names resolved
    here: the device functions every last-axis kernel's statements call."""
    return jit_unrolled(name, template, ns, U, K, globals())


# ----------------------------------------------------------------------------- small groups
_GROUPS_SRC = '''
def lastaxis_groups(x, nchunks, codes, scales, SENC_ARGS):
    tid = cuda.threadIdx.x
    scratch = cuda.shared.array(SCRATCH, int32)
    x32 = as_u32(x)  # 16-bit kinds: two elements per word
    c32 = as_u32(codes)
    c16 = as_u16(codes)
    aligned = (array_addr(x) & 15) == 0
    z = np.uint32(0)
    Z4 = (z, z, z, z)
    c0 = cuda.blockIdx.x * (NT * U) + tid
    if aligned:  # (two copies of the loads: a uniform branch instead of predicated element loads)
        w{j}_{k} = load_unit(x, x32, True, unit_of(c0 + {jNT}) + {k} * ST, c0 + {jNT} < nchunks, kind)
    else:
        w{j}_{k} = load_unit(x, x32, False, unit_of(c0 + {jNT}) + {k} * ST, c0 + {jNT} < nchunks, kind)
SENC
    s_dec = ONE / s_enc  # NVFP4's S_dec, once per thread (the pair path's block multiplier uses it)
    chunk_step(CHUNK_ARGS, c0 + {jNT}, nchunks, tid, scratch, codes, c16, c32, scales, s_enc, s_dec)
'''
# The grid's max of a one-launch kernel (``quantize.grid``, decode sizes) by done bits instead of a
# barrier over the grid (quantize.grid.wait_done): block b publishes its block max as item b; a block
# that waits long computes the missing blocks' maxima itself, from their units (HELP: source
# lines, at 16 spaces, that leave block g's block max in ``h``), so the wait ends however few
# of the grid's blocks are resident. VAR: the block max in, the grid max out.
_GRID_MAX_SRC = """    miss = cuda.shared.array(DONE_WORDS, int32)
    grid_max_publish(VAR, tid, sync)
    while not wait_done(tid, sync, gslot, miss):
        for g in range(cuda.gridDim.x):
            if missing(miss, g):
HELP
                grid_max_help(h, tid, sync, g)
                cuda.syncthreads()  # (block_max's ``red`` read by every thread before the next writes it)
    VAR = grid_max_read(tid, sync, gslot)
"""


def _grid_max_src(var, help_lines):
    return _GRID_MAX_SRC.replace("VAR", var).replace("HELP\n", help_lines)


# S_enc: read from the finalize kernel's output (``sparams``), or -- NVFP4 with
# ``senc_parts`` -- computed by every block from the tensor-amax kernel's per-block partials
# (``parts``, ``nparts`` of them: a few KiB, L2-resident), by the reference's formula
# (nvfp4_tensor_encode_scale of the max, as finalize does; the max of integers is exact in
# any order), block 0 writing the tensor scale 1 / S_enc that finalize wrote. The partial
# loads are issued after the units' loads, so their latency overlaps them.
# ``senc_grid`` -- NVFP4 at decode sizes, one kernel (``quantize.grid``): the finite amax of the units
# the block holds, the grid's max, S_enc from it; block 0 writes the tensor scale
_SENC_FROM_SPARAMS = ("sparams", "    s_enc = sparams[0] if mode == MODE_NVFP4 else ONE")
_SENC_FROM_GRID = ("tscale, sync", '''    red = cuda.shared.array(NW, int32)
    gslot = cuda.shared.array(1, int32)
    pa = np.int32(0)
    pa = max(pa, unit_amax_finite(unit_elems(w{j}_{k}, kind), VEC))
    pa = block_max(pa, tid, scratch, red)
''' + _grid_max_src("pa", """\
                h = np.int32(0)
                cg = g * (NT * U) + tid
                for jj in range(U):
                    for kk in range(K):
                        if aligned:
                            wv = load_unit(x, x32, True, unit_of(cg + jj * NT) + kk * ST, cg + jj * NT < nchunks, kind)
                        else:
                            wv = load_unit(x, x32, False, unit_of(cg + jj * NT) + kk * ST, cg + jj * NT < nchunks, kind)
                        h = max(h, unit_amax_finite(unit_elems(wv, kind), VEC))
                h = block_max(h, tid, scratch, red)
""") + '''    s_enc = nvfp4_tensor_encode_scale(bits_f32(np.uint32(pa)))
    if cuda.blockIdx.x == 0 and tid == 0:
        tscale[0] = ONE / s_enc''')
_SENC_FROM_PARTS = ("parts, nparts, tscale", '''    red = cuda.shared.array(NW, int32)
    pa = np.int32(0)
    for i in range(tid, nparts, NT):
        pa = max(pa, np.int32(parts[i]))
    pa = block_max(pa, tid, scratch, red)
    s_enc = nvfp4_tensor_encode_scale(bits_f32(np.uint32(pa)))
    if cuda.blockIdx.x == 0 and tid == 0:
        tscale[0] = ONE / s_enc''')


# NVFP4's amax by-product: each chunk's group amax (chunk_step returns it) where it is finite,
# the finite amax of the chunk's own units where the group holds a NaN or inf (every lane of
# such a group recomputes its units, so the group is covered), then _AMAX_OUT's reduction
_GROUPS_CHUNK_STEP = "    chunk_step(CHUNK_ARGS, c0 + {jNT}, nchunks, tid, scratch, codes, c16, c32, scales, s_enc, s_dec)\n"
_GROUPS_AMAX_STEP = ("    a = fold_finite(a, chunk_step(CHUNK_ARGS, c0 + {jNT}, nchunks, tid, scratch, codes, c16, c32, scales, "
                     "s_enc, s_dec), CHUNK_ARGS)\n")


def _fold_finite_fn(kind, K, VEC):
    @devfn
    def fold_finite(a, g, w0, w1, w2, w3):
        """max(a, the finite amax of a chunk whose group amax is g)."""
        if g < FINITE:
            return max(a, g)
        f = unit_amax_finite(unit_elems(w0, kind), VEC)
        if K >= 2:
            f = max(f, unit_amax_finite(unit_elems(w1, kind), VEC))
        if K >= 4:
            f = max(f, max(unit_amax_finite(unit_elems(w2, kind), VEC), unit_amax_finite(unit_elems(w3, kind), VEC)))
        return max(a, f)

    return fold_finite


@lru_cache(maxsize=None)
def make_lastaxis_group_kernel(kind, mode, fmt, mx_cfg, max_elem, L, K, NT, U, packed, shfl, senc_parts=False,
                               senc_grid=False, stoch=False, amax=False):  # fmt: skip
    """Groups of L units (G = L * VEC elements, L a power of two <= 32) tiling a flat
    C-contiguous input whose rows hold a whole number of groups: group g covers units
    g*L .. g*L + L - 1 and owns scales[g]. A thread takes *chunks* of K consecutive units
    (K divides L: one set of group parameters per chunk, not per unit), so a group is LL =
    L / K consecutive lanes of one warp, combined by a butterfly of log2(LL) steps. Block b
    owns chunks b*NT*U + j*NT + t (thread t, j < U); all U * K loads of a thread are issued
    before the first is used. ``senc_parts`` (NVFP4): the kernel takes (parts, nparts,
    tscale) instead of ``sparams`` and computes S_enc itself (see _SENC_FROM_PARTS);
    ``senc_grid`` (NVFP4): it takes (tscale, sync) and computes S_enc from the whole grid's
    units (_GRID_MAX_SRC: at most one block per SM, _SENC_FROM_GRID). ``amax`` (NVFP4, S_enc
    from ``sparams``: a given tensor scale): the kernel takes ``amax_out`` after ``sparams``
    and records the input's finite amax there (_GROUPS_AMAX_STEP, _AMAX_OUT). ``stoch``:
    stochastic rounding (chunk_step_sr; the kernel takes key_lo, key_hi last)."""
    assert NT % 32 == 0
    assert not (senc_parts or senc_grid) or mode == MODE_NVFP4
    assert not amax or (mode == MODE_NVFP4 and not (senc_parts or senc_grid))
    fns = group_chunk_fns(kind, mode, fmt, mx_cfg, max_elem, L, K, packed, shfl)
    chunk_step, chunk_step_sr, unit_of, ST, IG, VEC = (fns[k] for k in ("chunk_step", "chunk_step_sr", "unit_of", "ST", "IG",
                                                                         "VEC"))
    chunk_args = ", ".join("w{j}_%d" % k if k < K else "Z4" for k in range(4))
    ns = dict(NT=NT, U=U, K=K, SCRATCH=1 if shfl else NT, kind=kind, mode=mode,
              chunk_step=chunk_step, unit_of=unit_of, ST=ST, NW=NT // 32, block_max=_block_max_fn(NT, shfl))
    if senc_grid:
        ns.update(VEC=VEC)
    sargs, senc = _SENC_FROM_GRID if senc_grid else _SENC_FROM_PARTS if senc_parts else _SENC_FROM_SPARAMS
    src = _GROUPS_SRC
    if amax:
        ns.update(fold_finite=_fold_finite_fn(kind, K, VEC))
        sargs = "sparams, amax_out"
        src = sub_once(src, "scales, SENC_ARGS):", "scales, SENC_ARGS, amax_out):")
        src = sub_once(src, _GROUPS_CHUNK_STEP, "    a = np.int32(0)\n" + _GROUPS_AMAX_STEP) + _AMAX_OUT
    src = src.replace("CHUNK_ARGS", chunk_args).replace("SENC_ARGS", sargs if not amax else "sparams").replace("SENC", senc)
    if stoch:
        ns["chunk_step"] = chunk_step_sr
        src = sub_once(src, f"scales, {sargs}):", f"scales, {sargs}, key_lo, key_hi):")
        src = sub_once(src, "scales, s_enc, s_dec)", "scales, s_enc, s_dec, key_lo, key_hi)")
    return _jit_unrolled("lastaxis_groups", src, ns, U, K)


# ----------------------------------------------------------------------------- whole rows
_ROWS_SRC = '''
def lastaxis_rows(x, upr, codes, scales, sparams):
    tid = cuda.threadIdx.x
    row = cuda.blockIdx.x
    scratch = cuda.shared.array(SCRATCH, int32)
    red = cuda.shared.array(NW, int32)
    x32 = as_u32(x)  # 16-bit kinds: two elements per word
    c32 = as_u32(codes)
    c16 = as_u16(codes)
    aligned = (array_addr(x) & 15) == 0
    base = row * upr + tid
    if aligned:  # (two copies of the loads: a uniform branch instead of predicated element loads)
        w{j} = load_unit(x, x32, True, base + {jNT}, {j} < U - 1 or tid + {jNT} < upr, kind)
    else:
        w{j} = load_unit(x, x32, False, base + {jNT}, {j} < U - 1 or tid + {jNT} < upr, kind)
    a = np.int32(0)
    a2 = np.uint32(0)
    a, a2 = amax_step(a, a2, w{j}, kind, VEC)
    a = amax_done(a, a2, kind)
    a = block_max(a, tid, scratch, red)
    s_enc = sparams[0] if mode == MODE_NVFP4 else ONE
    sv, p0, pz = group_params(mode, a, ZERO, ZERO, MAXE, MXR, MXM, MXE, MXI, s_enc)
    if tid == 0:
        store_scale(scales, row, mode, sv)
    clean = a < FINITE
    rp = recip_guarded(p0) if mode == MODE_FLOAT else ZERO
    if WHOLE and clean and rp != ZERO:  # (row-uniform: the units straight-line, no check each)
        if {j} < U - 1 or tid + {jNT} < upr: recip_store_unit(unit_elems(w{j}, kind), base + {jNT}, p0, rp, codes, c16, c32, fmt, CVT, VEC, NB)
    else:
        if tid + {jNT} < upr: encode_store_unit_r(unit_elems(w{j}, kind), base + {jNT}, p0, rp, clean, codes, c16, c32, mode, fmt, CVT, VEC, NB)
'''


@lru_cache(maxsize=None)
def make_lastaxis_row_kernel(kind, mode, fmt, mx_cfg, max_elem, NT, U, packed, shfl, stoch=False, whole=True):
    """One scale per row of a C-contiguous (rows, upr units) input, one block per row: thread
    t holds the row's units t, t + NT, ... (U of them) in registers from the load to the
    encode; the row's amax is combined by warps (butterfly) and across warps (one shared slot
    each, one barrier). The launch must have U = ceil(upr / NT), so that NT * (U - 1) < upr
    <= NT * U: units 0 .. U - 2 of every thread are inside the row, and only the last one is
    checked. ``whole``: where the row is finite and its scale has a reciprocal (row-uniform),
    the units go to the reciprocal encoder as one straight-line block, with no per-unit check
    (ptxas interleaves them); else each unit through encode_store_unit_r. ``stoch``:
    stochastic rounding (_ROWS_SR_ENCODE; the kernel takes key_lo, key_hi last)."""
    VEC, NB, CVT, MAXE, MXR, MXM, MXE, MXI = unit_consts(kind, mode, fmt, mx_cfg, max_elem, packed)
    assert NT % 32 == 0
    ns = dict(NT=NT, U=U, NW=NT // 32, SCRATCH=1 if shfl else NT, kind=kind,
              mode=mode, fmt=fmt, VEC=VEC, NB=NB, CVT=CVT, MAXE=MAXE, MXR=MXR, MXM=MXM, MXE=MXE, MXI=MXI,
              WHOLE=whole and mode == MODE_FLOAT, block_max=_block_max_fn(NT, shfl))
    src = _ROWS_SRC
    if stoch:
        src = sub_once(src, "scales, sparams):", "scales, sparams, key_lo, key_hi):")
        src = sub_once(src, _ROWS_RNE_ENCODE, _ROWS_SR_ENCODE)
    return _jit_unrolled("lastaxis_rows", src, ns, U)


# the row kernel's encode (its last two lines), and its stochastic-rounding replacement
_ROWS_RNE_ENCODE = _ROWS_SRC[_ROWS_SRC.index("    rp = recip_guarded(p0)"):]
_ROWS_SR_ENCODE = ("    rp = recip_guarded(p0) if mode == MODE_FLOAT else ZERO\n"
                   "    if tid + {jNT} < upr: sr_store_unit_r(unit_elems(w{j}, kind), base + {jNT}, p0, rp, clean, "
                   "key_lo, key_hi, codes, c16, c32, mode, fmt, VEC, NB)\n")


# ----------------------------------------------------------------------------- tensor amax
_TENSOR_SRC = '''
def tensor_amax(x, nunits, part_i, part_a, part_b):
    tid = cuda.threadIdx.x
    scratch = cuda.shared.array(SCRATCH, int32)
    red = cuda.shared.array(NW, int32)
    x32 = as_u32(x)
    aligned = (array_addr(x) & 15) == 0
    a = np.int32(0)
    for ub in range(cuda.blockIdx.x * (NT * U), nunits, cuda.gridDim.x * (NT * U)):
        u0 = ub + tid
        w{j} = load_unit(x, x32, aligned, u0 + {jNT}, u0 + {jNT} < nunits, kind)
        a = max(a, amax_of(unit_elems(w{j}, kind), VEC))
    a = block_max(a, tid, scratch, red)
    if tid == 0:
        b = cuda.blockIdx.x
        part_i[b] = a
        part_a[b] = ZERO
        part_b[b] = ZERO
'''


@lru_cache(maxsize=None)
def make_tensor_amax_kernel(kind, NT, U, shfl, finite=True):
    """The first pass of NVFP4 (``finite``: amax over the finite elements) and of dynamic
    per-tensor float scales (``finite=False``: NaN and inf count, as tensor_partials'
    MODE_FLOAT): per-block amax of a flat input of ``nunits`` whole units (grid-stride, U
    loads in flight per thread), written as finalize's partials (part_i = amax bits;
    part_a = part_b = 0, which finalize's NVFP4 and float branches do not use)."""
    assert NT % 32 == 0
    ns = dict(NT=NT, U=U, NW=NT // 32, SCRATCH=1 if shfl else NT, kind=kind,
              VEC=vec_of(kind), block_max=_block_max_fn(NT, shfl), amax_of=unit_amax_finite if finite else unit_amax)
    return _jit_unrolled("tensor_amax", _TENSOR_SRC, ns, U)


@lru_cache(maxsize=None)
def make_amax_from_parts_kernel(NT, shfl):
    """``amax_out[0]``: the float32 whose bits are the max of ``nparts`` partial amax bits
    (``tensor_partials``' part_i), one block of NT threads: the amax by-product of the
    shapes whose encode kernels have no amax variant (``rules._Case.amax_pass``)."""
    block_max = _block_max_fn(NT, shfl)
    NW, SCRATCH = NT // 32, 1 if shfl else NT

    @cuda.jit
    def amax_from_parts(part_i, nparts, amax_out):
        tid = cuda.threadIdx.x
        scratch = cuda.shared.array(SCRATCH, int32)
        red = cuda.shared.array(NW, int32)
        a = np.int32(0)
        for i in range(tid, nparts, NT):
            a = max(a, np.int32(part_i[i]))
        a = block_max(a, tid, scratch, red)
        if tid == 0:
            amax_out[0] = bits_f32(np.uint32(a))

    return amax_from_parts


# ----------------------------------------------------------------------------- asymmetric / centred
# The integer schemes whose groups carry more than an amax (reference/quantize.py): asymmetric
# rows and groups, centred INT8 groups. Their statistics and element encoders: asym_units
# (the comment there), the groups' per-chunk steps: stat_chunks.

_ASYM_ROWS_SRC = """
def lastaxis_asym_rows(x, upr, codes, scales, zps, means):
    tid = cuda.threadIdx.x
    row = cuda.blockIdx.x
    scratch = cuda.shared.array(SCRATCH, int32)
    red = cuda.shared.array(NW, int32)
    red2 = cuda.shared.array(NW, int32)
    x32 = as_u32(x)
    c32 = as_u32(codes)
    c16 = as_u16(codes)
    aligned = (array_addr(x) & 15) == 0
    base = row * upr + tid
    w{j} = load_unit(x, x32, aligned, base + {jNT}, tid + {jNT} < upr, kind)
    khi = np.int32(0)
    nklo = np.int32(-1)
    h{j}, l{j} = unit_keys(unit_elems(w{j}, kind), VEC)
    khi = max(khi, h{j})
    nklo = max(nklo, l{j})
    khi = block_max(khi, tid, scratch, red)
    nklo = block_max(nklo, tid, scratch, red2)
    sv, pz, clean = asym_group(khi, nklo, MAXE)
    if tid == 0:
        scales[row] = sv
        zps[row] = pz
    if tid + {jNT} < upr: STORE_INT_UNIT
"""
# The row's reciprocal and float bounds once per thread (asym_unit_store_r), not once per
# unit (each unit's encode sits in its own `if` block, so NVVM would compute recip_guarded, a
# div.rn, and two int -> float conversions U times per thread), and the codes clipped as
# integers (asym_code_r). The same codes bit for bit. H100: int8_asym bf16 8192x8192 /
# 16384x7168 80 / 81 -> 89 / 90 % of copy with the reciprocal once, 96 / 99 % with the
# integer clip at the current row geometry (docs/design/last-axis.md).
_ASYM_STORE_CLIP = ("asym_unit_store_r(unit_elems(w{j}, kind), base + {jNT}, sv, rr, pz, flo, fhi, clean, codes, c16, c32, "
                    "fmt, VEC, NB)")
_ASYM_STORE_SR = ("sr_store_unit(unit_elems(w{j}, kind), base + {jNT}, sv, ZERO, pz, key_lo, key_hi, codes, c16, c32, "
                  "mode, fmt, VEC, NB)")
_ASYM_ONCE_LINES = """    flo = F32(-pz)
    fhi = F32(np.int32(fmt[7]) - pz)
    rr = recip_guarded(sv)
"""


@lru_cache(maxsize=None)
def make_lastaxis_asym_row_kernel(kind, fmt, max_elem, NT, U, packed, shfl, stoch=False):
    """Asymmetric integers, one scale and zero point per row: make_lastaxis_row_kernel's
    layout with a (max, min) statistic (two block reductions). ``stoch``: stochastic rounding
    (sr_store_unit with the row's scale and zero point; the kernel takes key_lo, key_hi last)."""
    VEC, NB = vec_of(kind), (fmt[5] if packed else 8)
    assert NT % 32 == 0
    ns = dict(NT=NT, U=U, NW=NT // 32, SCRATCH=1 if shfl else NT, kind=kind,
              mode=MODE_ASYM, fmt=fmt, VEC=VEC, NB=NB, MAXE=F32(max_elem), block_max=_block_max_fn(NT, shfl))
    if stoch:
        src = sub_once(_ASYM_ROWS_SRC, "zps, means):", "zps, means, key_lo, key_hi):")
        src = sub_once(src, "STORE_INT_UNIT", _ASYM_STORE_SR)
    else:
        src = _ASYM_ROWS_SRC.replace("    if tid + {jNT} < upr: STORE_INT_UNIT",
                                     _ASYM_ONCE_LINES + "    if tid + {jNT} < upr: " + _ASYM_STORE_CLIP)
    return _jit_unrolled("lastaxis_asym_rows", src, ns, U)


# lastaxis_stat_groups (int4_asym, int8_centred, every 1xG asymmetric or centred group of 2^k
# units), as the float-scale groups and the asymmetric rows: (1) a chunk's K units interleaved
# over the group's LL lanes (lane l of a group holds its units l, l + LL, ...: unit_of, ST =
# LL), so that each load / store instruction of a warp covers whole contiguous pieces. (2) The
# group's reciprocal (and the asymmetric float bounds) once per chunk, not once per unit: the
# units' encodes sit in separate basic blocks, so NVVM does not share them. (3) Asymmetric
# codes clipped as integers (asym_code_r: clip(rint(x / s) + zp, 0, qmax), the reference's
# formula, by one add-and-min instead of two float compare-and-selects). (4) Asymmetric
# statistics in fewer instructions: bfloat16 min / max two elements per instruction (min /
# max.bf16x2; a NaN, which those skip, found by the |x| max of word_amax16 and made the group's
# max), other 16-bit input's keys in pairs (word_ukeys), a lane's (max key, 0xFFFF - min key)
# packed in one word for the butterfly, the zero point's -xmin / s by the encode's reciprocal
# (asym_group_r). (5) Centred: with the units interleaved, the halving sum's top levels (the
# unit bits, above the lane bits) are additions inside the thread, so fewer shuffles. The same
# codes, scales, zero points and means bit for bit. H100, bf16 8192x8192 / 16384x7168, % of
# copy: int4_asym 68 / 69 -> 90 / 92, int8_centred 84 / 84 -> 92 / 93 (docs/design/last-axis.md).
_STAT_GROUPS_SRC = """
def lastaxis_stat_groups(x, nchunks, codes, scales, zps, means):
    tid = cuda.threadIdx.x
    scratch = cuda.shared.array(SCRATCH, int32)
    x32 = as_u32(x)
    c32 = as_u32(codes)
    c16 = as_u16(codes)
    aligned = (array_addr(x) & 15) == 0
    z = np.uint32(0)
    Z4 = (z, z, z, z)
    c0 = cuda.blockIdx.x * (NT * U) + tid
    w{j}_{k} = load_unit(x, x32, aligned, unit_of(c0 + {jNT}) + {k} * ST, c0 + {jNT} < nchunks, kind)
    chunk_step(CHUNK_ARGS, c0 + {jNT}, nchunks, tid, scratch, codes, c16, c32, scales, zps, means)
"""


@lru_cache(maxsize=None)
def make_lastaxis_stat_group_kernel(kind, mode, fmt, max_elem, L, K, NT, U, packed, shfl, stoch=False):
    """Asymmetric (MODE_ASYM) or centred (MODE_CENTRED) groups of L units along the last
    axis: make_lastaxis_group_kernel's layout (chunks of K units, LL = L / K lanes per group,
    U chunks per thread), with the group's (max, min) or halving sum and centred amax; units
    interleaved over the group's lanes (see the comment above _STAT_GROUPS_SRC). ``stoch``:
    stochastic rounding (the same statistics and parameters, every unit by sr_store_unit; the
    kernel takes key_lo, key_hi last)."""
    assert NT % 32 == 0
    fns = stat_chunk_fns(kind, mode, fmt, max_elem, L, K, packed, shfl, stoch)
    chunk_step, unit_of, ST = fns["chunk_step"], fns["unit_of"], fns["ST"]
    chunk_args = ", ".join("w{j}_%d" % k if k < K else "Z4" for k in range(4))
    ns = dict(NT=NT, U=U, K=K, SCRATCH=1 if shfl else NT, kind=kind,
              chunk_step=chunk_step, unit_of=unit_of, ST=ST)
    src = _STAT_GROUPS_SRC.replace("CHUNK_ARGS", chunk_args)
    if stoch:
        src = sub_once(src, "zps, means):", "zps, means, key_lo, key_hi):")
        src = sub_once(src, "scales, zps, means)", "scales, zps, means, key_lo, key_hi)")
    return _jit_unrolled("lastaxis_stat_groups", src, ns, U, K)


# ----------------------------------------------------------------------------- static scales
# Caller-given float scales (``scale=``): nothing to reduce, one streaming pass. A unit is
# encoded by the finite-group encoders when no NaN can arise in x / s (s finite and non-zero,
# every element of the unit finite), else element by element by encode_element.
_STATIC_SRC = """
def static_encode(x, nunits, upr, codes, scales):
    tid = cuda.threadIdx.x
    x32 = as_u32(x)
    c32 = as_u32(codes)
    c16 = as_u16(codes)
    aligned = (array_addr(x) & 15) == 0
    u0 = cuda.blockIdx.x * (NT * U) + tid
    if aligned:  # (two copies of the loads: a uniform branch instead of predicated element loads)
        w{j} = load_unit(x, x32, True, u0 + {jNT}, u0 + {jNT} < nunits, kind)
    else:
        w{j} = load_unit(x, x32, False, u0 + {jNT}, u0 + {jNT} < nunits, kind)
    st = scales[0]
    rst = recip_guarded(st)
    if u0 + {jNT} < nunits: static_unit(unit_elems(w{j}, kind), u0 + {jNT}, upr, st, rst, scales, codes, c16, c32)
"""


# a thread's amax of the units it holds (amax_step / amax_done: NaN and inf count), of the dynamic
# kernel below and of the amax by-product (_STATIC_AMAX_OUT)
_STATIC_AMAX_STATS = """    a = np.int32(0)
    a2 = np.uint32(0)
    a, a2 = amax_step(a, a2, w{j}, kind, VEC)
"""
# dynamic per-tensor scale in the same kernel (decode sizes; ``quantize.grid``): the block's amax of
# the units it holds (NaN and inf count, as tensor_amax's MODE_FLOAT pass), the grid's max,
# finalize's scale (group_params), block 0 writing it
_STATIC_DYNAMIC = """    red = cuda.shared.array(NW, int32)
    gslot = cuda.shared.array(1, int32)
    scratch = cuda.shared.array(SCRATCH, int32)
""" + _STATIC_AMAX_STATS + """    a = amax_done(a, a2, kind)
    a = block_max(a, tid, scratch, red)
""" + _grid_max_src("a", """\
                h = np.int32(0)
                h2 = np.uint32(0)
                ug = g * (NT * U) + tid
                for jj in range(U):
                    if aligned:
                        wv = load_unit(x, x32, True, ug + jj * NT, ug + jj * NT < nunits, kind)
                    else:
                        wv = load_unit(x, x32, False, ug + jj * NT, ug + jj * NT < nunits, kind)
                    h, h2 = amax_step(h, h2, wv, kind, VEC)
                h = amax_done(h, h2, kind)
                h = block_max(h, tid, scratch, red)
""") + """    st, p0, pz = group_params(MODE_FLOAT, a, ZERO, ZERO, MAXE, 0, 0, 0, ONE, ONE)
    if cuda.blockIdx.x == 0 and tid == 0:
        scales[0] = st
"""


def static_unit_fns(fmt, VEC, NB, CVT, per_row):
    """(static_unit, static_unit_sr): encode and store unit ``u`` (elements ``e``) under the
    float scale ``st`` of the tensor (its guarded reciprocal ``rst``), or (``per_row``) under
    scales[u // upr]; by the reciprocal where the unit is finite and the scale allows, else
    element by element (``static_unit_sr``: stochastic rounding, keys last). Used by
    ``static_encode`` and ``quantize.tensor_resident``; not cached (see group_chunk_fns)."""

    @devfn
    def static_unit(e, u, upr, st, rst, scales, c8, c16, c32):
        s = scales[u // upr] if per_row else st
        r = recip_guarded(s) if per_row else rst
        am = unit_amax(e, VEC)
        clean = am < FINITE and abs_i32(f32_bits(s)) < FINITE and s != ZERO
        if r != ZERO and not ratio_ok(am, s):
            clean = False  # a caller-given scale far below |x| (all codes saturate): element by element
        encode_store_unit_r(e, u, s, r, clean, c8, c16, c32, MODE_FLOAT, fmt, CVT, VEC, NB)

    @devfn
    def static_unit_sr(e, u, upr, st, rst, scales, c8, c16, c32, key_lo, key_hi):
        """static_unit under stochastic rounding: encode_element's x / s per element (any scale)."""
        s = scales[u // upr] if per_row else st
        r = recip_guarded(s) if per_row else rst
        am = unit_amax(e, VEC)
        clean = am < FINITE and abs_i32(f32_bits(s)) < FINITE and s != ZERO and (r == ZERO or ratio_ok(am, s))
        sr_store_unit_r(e, u, s, r, clean, key_lo, key_hi, c8, c16, c32, MODE_FLOAT, fmt, VEC, NB)

    return static_unit, static_unit_sr


# The amax by-product (``amax``: delayed scaling): the units' amax as the dynamic kernels take it
# (amax_step / amax_done: NaN and inf count), the block's max, one atomic max of its bits into
# ``amax_out`` (float32[1], zeroed by the plan before the launch: the bits of non-negative floats
# order as integers, so the max is exact in any order). The statistic is gathered as the units
# arrive, the reduction after the encode.
_AMAX_OUT = """    red = cuda.shared.array(NW, int32)
    a = block_max(a, tid, scratch, red)
    if tid == 0:
        cuda.atomic.max(as_u32(amax_out), 0, np.uint32(a))
"""
_STATIC_AMAX_OUT = """    scratch = cuda.shared.array(SCRATCH, int32)
    a = amax_done(a, a2, kind)
""" + _AMAX_OUT


@lru_cache(maxsize=None)
def make_static_kernel(kind, fmt, NT, U, packed, per_row, dynamic_max_elem=None, shfl=True, stoch=False,
                       amax=False):  # fmt: skip
    """Static float scales of a flat C-contiguous input of ``nunits`` whole units: one
    scale for the tensor, or (``per_row``) scales[u // upr] for unit u, rows of ``upr``
    units. Block b owns units b*NT*U + j*NT + t, all U loads issued before any is used.
    ``dynamic_max_elem`` (one tensor scale): the kernel takes a ``sync`` workspace too and
    computes the scale itself, amax / max_elem as finalize does, over the whole grid
    (_GRID_MAX_SRC: at most one block per SM), and writes it to scales[0]. ``amax`` (one
    given tensor scale): the kernel takes ``amax_out`` after ``scales`` and records the
    input's amax there (_AMAX_OUT). ``stoch``: stochastic rounding (static_unit_sr; the
    kernel takes key_lo, key_hi last)."""
    VEC, NB = vec_of(kind), (fmt[5] if packed else 8)
    DYN = dynamic_max_elem is not None
    assert not (DYN and per_row) and not (amax and (DYN or per_row))
    CVT = fp8_cvt_available() and fp8_cvt_supports(fmt)
    assert NT % 32 == 0
    static_unit, static_unit_sr = static_unit_fns(fmt, VEC, NB, CVT, per_row)

    ns = dict(NT=NT, U=U, kind=kind, static_unit=static_unit)
    src = _STATIC_SRC
    if DYN:
        ns.update(NW=NT // 32, SCRATCH=1 if shfl else NT, VEC=VEC, MAXE=F32(dynamic_max_elem),
                  block_max=_block_max_fn(NT, shfl))
        src = src.replace("codes, scales):", "codes, scales, sync):").replace("    st = scales[0]\n", _STATIC_DYNAMIC)
    if amax:
        ns.update(NW=NT // 32, SCRATCH=1 if shfl else NT, VEC=VEC, block_max=_block_max_fn(NT, shfl))
        src = sub_once(src, "codes, scales):", "codes, scales, amax_out):")
        src = sub_once(src, "    st = scales[0]\n", _STATIC_AMAX_STATS + "    st = scales[0]\n") + _STATIC_AMAX_OUT
    if stoch:
        ns["static_unit"] = static_unit_sr
        args = "codes, scales, sync" if DYN else "codes, scales, amax_out" if amax else "codes, scales"
        src = sub_once(src, f"{args}):", f"{args}, key_lo, key_hi):")
        src = sub_once(src, "scales, codes, c16, c32)", "scales, codes, c16, c32, key_lo, key_hi)")
    return _jit_unrolled("static_encode", src, ns, U)


_ = (np, cuda, float32, int32, uint32, ONE, bits_f32, array_addr, group_params, store_scale)  # the generated kernels
_ = (as_u16, as_u32, load_unit, unit_elems, amax_step, amax_done)  # their loads and statistics
_ = (recip_store_unit, sr_store_unit, asym_group, asym_unit_store_r, unit_keys)  # their encodes
_ = nvfp4_tensor_encode_scale  # used by the generated group kernel (_SENC_FROM_PARTS)
_ = (DONE_WORDS, grid_max_help, grid_max_publish, grid_max_read, missing, wait_done)  # the one-launch kernels' wait
