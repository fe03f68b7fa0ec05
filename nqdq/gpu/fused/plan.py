"""Launchers of the fused kernels (bodies: ``_fused_kernels``; spec: ``reference/fused``).

Each function takes :class:`~nqdq.gpu.runtime.interop.DeviceInput` arrays (flat, in the
kernels' form: float32 or the uint16 bits of bfloat16 / float16) and returns flat outputs
in the input's library. Every op is one launch of :func:`_fused_rows.fused_row_kernel` (the
MoE sort adds the launch that builds the permutation (three under graph capture); or, from
MOE_RANK_MIN_PAIRS pairs on, the one that ranks the pairs by chunks, the rows kernel then finding
each pair's row: rank_path; a planned MoE call launches each kernel after the first as its
predecessor's programmatic dependent on sm_90+; up to MOE_LOCAL_MAX_PAIRS pairs no sort is
launched, each block of the rows kernel finding its own pairs' rows: local_path).
"""

from __future__ import annotations

import itertools
import threading
from functools import lru_cache

import numpy as np

from ...reference.packing import packed_length
from ...schemes import Scheme
from . import kernels as fused_kernels
from ..device.elements import format_tuple
from ..runtime.interop import Allocator, DeviceInput, device_address
from ..runtime.target import SIMULATOR, device_cc
from ..runtime.launch import Ptr, fast_kernel
from ..quantize.grid import MAX_DONE, SYNC_WORDS
from ..quantize.params import max_elem as _max_elem, mx_config as _mx_cfg
from ..quantize.plan import _XDTYPES, _sm_count
from ..quantize.slots import fill_bytes
from ...reference.fused import MAX_ROW as MAX_ROW_REF
from ...reference.fused import row_geometry
from . import rows as _fused_rows
from .rows import fused_row_kernel
from ..quantize.lastaxis import SHFL_DEFAULT

__all__ = ["out_kind", "geometry", "run_rows", "rows_plan", "moe_sort", "MAX_ROW"]

MAX_ROW = MAX_ROW_REF  # longest row (reference/fused.row_geometry: 32 warps x 8 units per lane)
# The MoE sort's rows of bfloat16 into MX e2m1 are OP_SCATTER's (each token read and encoded
# once, its codes and scales stored to its k sorted rows) where the kernel has the words' path and
# k <= MOE_SCATTER_MAX_K (_scatter), else OP_GATHER's (each sorted row reads its token: k reads and
# encodes of it). OP_SCATTER's blocks: MOE_UNITS units a lane, with as many warps as the row then
# needs (at most 32; else the spec's row geometry). The scatter path has no row-wide reduction (a
# group's 4 lanes are neighbours in any layout), so its layout is free. H100 A/B (docs/design/moe.md):
# at hidden 7168 (7 warps x 4 units instead of 4 x 7) moe_sort + mxfp4 without the id check
# 44.9 -> 40.6 us; 2 units 41.7, 1 unit 50.0; ncu: the row kernel 30.3 -> 27.5 us, 59 -> 51
# registers. OP_SCATTER against OP_GATHER: docs/design/moe.md.
MOE_UNITS = 4
# The MoE sort of a direct call is one launch (moe_sort_kernel, its blocks waiting for each
# other's counts, by a wait that no residency can turn into a deadlock: _grid.wait_done), of a
# call under graph capture three (count, scan, scatter). H100 (docs/design/moe.md), 2048 tokens
# top-4 of 256, planned calls, one launch against three:
# called eagerly (host and device) 37.7 -> 36.8 us (and 40.4 -> 37.8 without programmatic dependents), the host's
# time a call 23.2 -> 16.1 us (38.4 -> 28.1 on another host); replayed from a CUDA graph (device
# only) 34.2 -> 36.2 us, and at 64 tokens top-8 9.0 -> 13.3 (moe_plan).
# The planned MoE call launches each kernel after the first as its predecessor's programmatic
# dependent (launch.compile_sequence's ``pdl``; sm_90+; OP_SCATTER rows only): a kernel allows its
# dependent's launch at its start (griddepcontrol.launch_dependents) and waits for its predecessor
# (griddepcontrol.wait) before it reads what that one wrote, so the OP_SCATTER rows load their
# tokens while the sort runs, and the three-launch sort's kernels start before the one before them
# ends. H100, in the runs of the one-launch sort's figures: eager 37.8 -> 36.8 us (one-launch sort), graph
# 36.6 -> 36.2 (one-launch sort), 35.2 -> 34.2 (three launches).
# OP_SCATTER's blocks load and encode MOE_STAGE tokens into shared memory before they wait for
# the sort (_fused_rows._scatter_staged_source), over a grid of at most MOE_STAGE_BLOCKS blocks an
# SM. H100 (docs/design/moe.md), 2048 tokens x 7168 top-4 of 256, against one block per token
# (which waited for the sort after its token's loads: only the first wave read early), with the
# lanes' groups below: eager 35.5 -> 32.0 us, graphs 32.4 -> 26.8 us a call (64 tokens top-8
# 9.1 -> 7.6); 4 / 4 measured best of 4 / 5, 3 / 5, 2 / 8, 8 / 2 (H100 and H200); with the
# pipelined rounds and the rank sort: 8 / 3 (eager, 2048 tokens: 32.0 -> 29.0 us; 8192: 112.2 -> 95.8).
# Where rows are whole quads of units (n % 32 == 0), each lane's units are contiguous, so a lane
# holds whole MX groups (no butterfly; its words leave in 16-byte stores); elsewhere the strided
# layout. H100, as above: the rows kernel alone 25.2 (staged, strided) -> 22.2 us, 56 -> 47
# registers. Where a block has more than one round, the rounds after the first load their tokens
# while the round before is stored: H100, 8192 tokens x 7168 top-4 of 256 (4 rounds a block),
# eager, with the rank sort and MOE_STAGE 8: 106.2 -> 97.0 us (without it, MOE_STAGE 4: 113.0 -> 109.8).
MOE_STAGE = 8
MOE_STAGE_BLOCKS = 3
MOE_STAGE_SMEM = 40 << 10  # the staged tokens' shared memory, at most (static shared memory: < 48 KiB a block)
# From MOE_RANK_MIN_PAIRS (token, expert) pairs on, where the rows take the staged OP_SCATTER
# kernel (rank_path), the sort is moe_rank_kernel (one launch: each block ranks its chunk of pairs,
# the last to finish scans the counts; no grid barrier, no second pass) and the rows kernel
# finds each pair's row from its rank (_fused_rows.rank_row), storing the op's perm itself.
# H100, bf16 x 7168 top-4 of 256, MOE_STAGE 8 with pipelined rounds, eager, chunks of 1024 pairs at
# every size (before rank_chunk_shift): 4096 pairs 24.8 us against 17.5 for moe_sort's one launch,
# 8192 33.1 against 30.0; 16384 51.5 against 59.0, 32768 99.5 against 107.6.
MOE_RANK_MIN_PAIRS = 12288
# ... over about MOE_RANK_BLOCKS chunks of 256 to 1024 pairs (rank_chunk_shift). H100, as above,
# chunks of 256 / 512 / 1024 pairs: 8192 pairs 29.8 / 30.9 / 33.4 us, 16384 57.2 / 49.7 / 53.0,
# 32768 121.4 / 105.2 / 95.3 (moe_sort's one launch: 29.4, 57.7, 109.8).
MOE_RANK_BLOCKS = 32
# Up to MOE_LOCAL_MAX_PAIRS (token, expert) pairs, where the staged rows take every token in one
# round (local_path: at most MOE_STAGE_BLOCKS blocks an SM x the stage), no sort is launched:
# each block counts every pair's bucket itself while its tokens load and finds its own pairs'
# rows (_fused_rows.RANK_LOCAL). One launch, no workspace, no block waiting for another. Every
# block reads and counts every id, so it pays only for small calls. H100 (docs/design/moe.md),
# hidden 7168 of 256 experts, local / the sorts, us: CUDA graphs 64 tokens
# top-8 5.88 / 8.01, 256 top-8 9.19 / 10.25, 512 top-4 10.45 / 10.60; eager 64 top-8 6.7 / 11.9,
# 256 top-8 9.4 / 14.1, 512 top-4 10.8 / 14.3; past the bound, graphs 512 top-8 14.91 / 13.90,
# 1024 top-4 19.63 / 14.23, eager 2048 top-4 36.3 / 29.2.
MOE_LOCAL_MAX_PAIRS = 2048
STATIC_SMEM = 48 << 10  # a block's static shared memory, at most
# A planned call with check_ids=True passes the sort a word of pinned host memory (IdChecks) for
# its id check (_fused_kernels.report_ids) and polls that word: it waits for the sort, not for the
# rows (reading offsets[E] back, CuPy's copy, waited for the whole op). The local path (no sort)
# reads offsets[E] back.


def out_kind(sch: Scheme) -> int:
    """The kernel's output mode for ``sch``, or ValueError naming ``scheme``."""
    elem = sch.element
    if sch.is_mx and sch.group_size == 32 and elem.bits in (4, 8):
        return fused_kernels.OUT_MX
    if sch.scale_format == "f32" and elem.kind == "float" and elem.bits == 8 and sch.axis in (-1, None):
        if sch.granularity == "row":
            return fused_kernels.OUT_ROW
        if sch.granularity == "group" and sch.group_size == 128:
            return fused_kernels.OUT_GROUP
        if sch.granularity == "tensor" and sch.static_scale:
            return fused_kernels.OUT_TENSOR
    raise ValueError(
        f"scheme={sch.name!r} ({sch.fmt}, {sch.granularity}) has no fused kernel; fused ops support "
        "'fp8_row', 'fp8_tensor' with scale=, 'fp8_1x128' and the MX schemes with 4- or 8-bit codes ('mxfp4', 'mxfp8')"
    )


def geometry(n: int) -> tuple[int, int]:
    """(threads per row, units per thread) of the row kernel: the spec's layout
    (reference/fused.row_geometry, a function of n only); ValueError past MAX_ROW."""
    if n > MAX_ROW:
        raise ValueError(f"x has rows of {n} elements; the fused kernels hold at most {MAX_ROW}")
    nw, u = row_geometry(n)
    return 32 * nw, u


def _view(a, dtype, ok: bool, alloc, dummies):
    """``a`` viewed as ``dtype`` when ``ok``, else a 1-element dummy of that dtype."""
    if ok:
        return a.view(dtype)
    key = np.dtype(dtype).str
    if key not in dummies:
        dummies[key] = alloc.empty(1, dtype)
    return dummies[key]


def run_rows(op, xin, rows, n, sch, *, w=None, wkind=1, res=None, eps=0.0, sscale=None, perm=None,
             strides=None, out=None, want_y=False, moe=None, alloc=None, launches=None):
    """Launch the fused row kernel. ``xin``: DeviceInput of the input (its flat array,
    kind, lib); ``res``: flat residual array (same kind) or None; ``w``: flat weight array
    (kind ``wkind``); ``perm``: int32 source rows (OP_GATHER); ``strides``: (sb, sh, D) in
    elements for OP_ROWS over a [B, H, D] view (None: contiguous rows of n). ``moe``: for
    OP_GATHER, (inv, k): the sorted row of each (token, slot) pair (moe_sort's inv) and
    k; where the kernel has the bfloat16 words' MX e2m1 path (``_fused_rows.words_path``,
    _scatter), the staged OP_SCATTER runs instead: MOE_STAGE tokens a block of the rows // k,
    each token read once and stored to its k rows. ``alloc``: the Allocator of the outputs
    (default: one of the input's library); ``launches``: a list that receives the launch as
    (kernel, grid, block, args) instead of running it (moe_plan).
    Returns dict(codes, scales, newres, y) of flat arrays (None where not produced)."""
    alloc = alloc if alloc is not None else Allocator(xin.lib)
    kind = xin.kind
    x = xin.arr
    nt, U = geometry(n)
    nw = nt // 32
    mode = fused_kernels.OUT_Y if want_y else (out if out is not None else out_kind(sch))
    dummies = {}
    xdt = _XDTYPES[kind]
    if strided := strides is not None:
        sb, sh, D = strides
        aligned = sb % 8 == 0 and sh % 8 == 0 and D % 8 == 0
    else:
        sb, sh, D = n, n, n
        aligned = n % 8 == 0
    # fast: every unit of 8 elements is 16-byte aligned in x, the residuals, w, y and codes
    fast = aligned and device_address(x) % 16 == 0
    if w is not None:
        fast = fast and device_address(w) % 16 == 0
    if res is not None:
        fast = fast and device_address(res) % 16 == 0
    newres = alloc.empty(rows * n, xdt) if res is not None else None
    if newres is not None:
        fast = fast and device_address(newres) % 16 == 0
    res_a = res if res is not None else _view(x, xdt, False, alloc, dummies)
    if w is None:
        w = _view(x, np.float32, False, alloc, {})
        wkind = 0
    nr = newres if newres is not None else _view(x, xdt, False, alloc, dummies)

    if mode == fused_kernels.OUT_Y:
        fmt, mx, maxe, G, nbits = (1, 3, -6, 0x7E, 0x7F, 8, 0, 0, 4, 1), (0, 0, 0, 1.0), 448.0, 0, 8
        y = alloc.empty(rows * n, np.float32)
    else:
        fmt, mx, maxe = format_tuple(sch), _mx_cfg(sch), _max_elem(sch)
        G = 32 if mode == fused_kernels.OUT_MX else (128 if mode == fused_kernels.OUT_GROUP else 0)
        nbits = sch.code_bits
        y = None
    yout = y if y is not None else _view(x, np.float32, False, alloc, dummies)
    pcols = packed_length(n, nbits)
    ngroups = -(-n // G) if G else 1
    codes = alloc.empty(rows * pcols, np.uint8) if mode != fused_kernels.OUT_Y else None
    if mode in (fused_kernels.OUT_ROW, fused_kernels.OUT_GROUP):
        scales = alloc.empty(rows * ngroups, np.float32)
    elif mode == fused_kernels.OUT_MX:
        scales = alloc.empty(rows * ngroups, np.uint8)
    else:
        scales = None
    codes_a = codes if codes is not None else _view(x, np.uint8, False, alloc, dummies)
    for a in (y, codes):
        fast = fast and (a is None or device_address(a) % 16 == 0)
    sdt = np.uint8 if mode == fused_kernels.OUT_MX else np.float32
    scales_a = scales if scales is not None else _view(x, sdt, False, alloc, dummies)
    perm_a = perm if perm is not None else _view(x, np.int32, False, alloc, dummies)
    cbase_a = pout_a = _view(x, np.int32, False, alloc, dummies)
    nbk, csh, rank = 1, 8, 0
    tokens = rows // max(1, int(moe[1])) if moe is not None else rows

    grid, kd, stage, lanes, pipe = rows, 0, 0, 0, 0
    if moe is not None and _scatter(op, mode, kind, fast, fmt, moe[1]):
        perm_a, kd = moe[0], int(moe[1])
        if len(moe) > 2:  # (packed / ids, k, cbase / offsets, pout, buckets, csh / None): the kernel finds the rows
            cbase_a, pout_a, nbk = moe[2], moe[3], int(moe[4])
            if moe[5] is None:  # local_path's: the ids, no sort before
                rank = _fused_rows.RANK_LOCAL
            else:  # moe_rank's packed ranks and chunk bases
                csh, rank = int(moe[5]), _fused_rows.RANK_PACKED
        op, grid = fused_kernels.OP_SCATTER, tokens
        U, nw, stage = scatter_geometry(n, kd, local=rank == _fused_rows.RANK_LOCAL)
        if stage:
            # lanes' groups where a lane's units are whole groups (G = 32: quads) and rows whole quads of units
            lanes = int(U % (G // 8) == 0 and fast and n % 32 == 0)
            if rank == _fused_rows.RANK_LOCAL:  # one round: csh tokens a block
                csh = -(-tokens // max(1, _sm_count() * MOE_STAGE_BLOCKS))
                if csh > stage:
                    raise RuntimeError("internal: local_path's tokens do not fit one round of the staged kernel")
                grid = -(-tokens // max(csh, 1))
            else:
                grid = min(grid, max(1, _sm_count() * MOE_STAGE_BLOCKS))
                pipe = int(grid * stage < tokens)  # (a block with one round has nothing to overlap)
    if moe is not None and len(moe) > 2 and not (rank and stage):
        raise RuntimeError("internal: moe_rank's ranks or the ids given, but the rows do not take the staged "
                           "OP_SCATTER kernel (rank_path / local_path and run_rows disagree)")
    # fast 2: every lane's U units in the row (full_rows: no unit tested against the row's end)
    full = _fused_rows.full_rows(op, mode, res is not None) and fast and n == 32 * nw * U * 8
    kern = fused_row_kernel(op, mode, kind, wkind, nw, U, 2 if full else bool(fast), strided, res is not None, fmt,
                            mx, float(maxe), G, SHFL_DEFAULT, kd, stage, lanes, pipe, rank)
    # dm: the fast strided loader's u // (D / 8) as (u * dm) >> 32 (_fused_rows._loader)
    dm = (1 << 32) // max(D // 8, 1) + 1
    args = (x, res_a, w, nr, yout, codes_a, scales_a, perm_a,
            n, pcols, ngroups, np.float32(eps), np.float32(1.0 if sscale is None else sscale), sb, sh, D, dm,
            _fused_rows.prefetch_distance(op, mode, res is not None), rows // max(kd, 1),
            cbase_a, pout_a, nbk, csh)
    _launch(launches, kern, grid, 32 * nw, args)
    return dict(codes=codes, scales=scales, newres=newres, y=y, pcols=pcols, ngroups=ngroups, alloc=alloc, op=op)


def _launch(launches, kern, grid, block, args):
    """Launch now, or append (kernel, grid, block, args) to ``launches`` (a plan)."""
    if launches is not None:
        launches.append((kern, grid, block, args))
    elif grid > 0:
        fast_kernel(kern).launch(grid, block, args, None)


def moe_sort(ids, npairs: int, k: int, num_experts: int, alloc: Allocator, launches=None, ws=None, one=True,
             out=None, flag=None):
    """(perm int32 [npairs], offsets int32 [E+2], inv int32 [npairs]) on the device from
    expert ids [npairs] (int32 or int64; token-major, then slot): reference/fused.moe_sort's
    stable order, perm[row] = token of the pair sorted to ``row``, inv[pair] = its row.
    Nothing waits for the device: ids outside [0, E) sort after every expert, in pair order
    (rows offsets[E]:offsets[E + 1]); offsets[:E + 1] is the op's offsets, and
    offsets[E] == npairs says every id was in range.

    ``one`` (a direct call's): one launch (``moe_sort_kernel``, at most one block per SM,
    its blocks waiting for each other's counts on ``ws``: a zeroed ``_grid`` workspace the
    kernel leaves zero; None: a zeroed one of ``alloc``'s; the wait ends whatever part of the
    grid is resident); else three (count, scan, scatter).
    ``out``: (perm, offsets, inv) to write instead of new arrays (a plan's second sequence).
    ``flag``: an int32 [1] the sort sets to 1 (every id in range) or 2 (_fused_kernels.report_ids:
    what a planned call with check_ids=True polls); None: none set (the kernels' ``report``
    argument 0)."""
    if not 1 <= num_experts <= fused_kernels.MOE_MAX_EXPERTS:
        raise ValueError(f"num_experts={num_experts} must be in [1, {fused_kernels.MOE_MAX_EXPERTS}] "
                         "for the device sort")
    nchunks = max(1, -(-npairs // fused_kernels.MOE_CHUNK))
    nb = num_experts + 1  # the experts, then the bucket of ids out of range
    if out is None:
        out = (alloc.empty(max(npairs, 1), np.int32), alloc.empty(num_experts + 2, np.int32),
               alloc.empty(max(npairs, 1), np.int32))
    perm, offsets, inv = out
    report, flag = _report(flag, alloc)
    if one:
        G = min(nchunks, _sm_count(), MAX_DONE)
        counts = alloc.empty(G * nb, np.int32)
        if ws is None:
            ws = alloc.empty(SYNC_WORDS, np.int32)
            fill_bytes(ws, 0)
        _launch(launches, fused_kernels.moe_sort_kernel, G, fused_kernels.MOE_CHUNK,
                (ids, npairs, num_experts, k, counts, ws, perm, offsets, inv, flag, report))
        return perm[:npairs], offsets, inv[:npairs]
    counts = alloc.empty(nchunks * nb, np.int32)
    base = alloc.empty(nchunks * nb, np.int32)
    _launch(launches, fused_kernels.moe_count_kernel, nchunks, fused_kernels.MOE_CHUNK,
            (ids, npairs, num_experts, counts))
    _launch(launches, fused_kernels.moe_scan_kernel, 1, moe_scan_threads(num_experts),
            (counts, nchunks, num_experts, base, offsets, flag, report))
    _launch(launches, fused_kernels.moe_scatter_kernel, nchunks, fused_kernels.MOE_CHUNK,
            (ids, npairs, num_experts, k, base, perm, inv))
    return perm[:npairs], offsets, inv[:npairs]


def _scatter(op, mode, kind, fast, fmt, k) -> bool:
    """Whether run_rows takes the staged OP_SCATTER for the MoE rows of ``op`` (OP_GATHER)
    with k experts a token: the bfloat16 words' MX e2m1 path, at most MOE_SCATTER_MAX_K rows a
    token."""
    return bool(_fused_rows.words_path(op, mode, kind, fast, fmt) and 1 <= k <= _fused_rows.MOE_SCATTER_MAX_K)


def scatter_geometry(n: int, k: int, local: bool = False) -> tuple[int, int, int]:
    """(U, warps, stage) of OP_SCATTER's blocks for rows of n: MOE_UNITS a lane over as many
    warps as the row needs (the spec's geometry where that is over 32 warps); the tokens a
    block stages, MOE_STAGE at most, their words and scale codes (5 bytes a unit and token) at
    most MOE_STAGE_SMEM, and with ``local`` (RANK_LOCAL)
    small enough that the block's shared memory, the local sort's included, stays under
    STATIC_SMEM."""
    nt, U = geometry(n)
    nw = nt // 32
    nw_u = -(-(n // 8) // (32 * MOE_UNITS))  # warps for MOE_UNITS a lane
    if 0 < nw_u <= 32:
        U, nw = MOE_UNITS, nw_u
    NT = 32 * nw
    stage = max(1, min(MOE_STAGE, _fused_rows.MOE_STAGE_MAX, MOE_STAGE_SMEM // (5 * U * NT)))
    if local:
        def smem(s):  # the staged words and codes, rw (int64, two rounds), the local sort's, and 1 KiB for
            # the prelude's arrays and alignment (hidden 7168, top-4, stage 8: 42504 bytes by ptxas, 41480 + 1024 here)
            return 5 * s * U * NT + 16 * s * k + 8 * fused_kernels.MOE_LOCAL_BUCKETS + 4 * s * k + 4 * NT + 1024

        while stage > 0 and smem(stage) > STATIC_SMEM:
            stage -= 1
    return U, nw, stage


def local_path(xin, n: int, sch: Scheme, k: int, npairs: int, num_experts: int) -> bool:
    """Whether moe_sort_quantize launches no sort: the rows take the staged OP_SCATTER kernel
    (_scatter) and fit one round of it, at most MOE_LOCAL_MAX_PAIRS pairs and
    MOE_LOCAL_BUCKETS - 1 experts."""
    if not (0 < npairs <= MOE_LOCAL_MAX_PAIRS and num_experts + 1 <= fused_kernels.MOE_LOCAL_BUCKETS):
        return False
    _, _, stage = scatter_geometry(n, k, local=True)
    if stage <= 0 or -(-npairs // k) > stage * _sm_count() * MOE_STAGE_BLOCKS:
        return False
    return staged_scatter(xin, n, sch, k)


def moe_local(ids, npairs: int, k: int, num_experts: int, alloc: Allocator):
    """(offsets int32 [E + 2], perm int32 [npairs], moe) for local_path's call: run_rows'
    ``moe=`` argument, with which the rows kernel sorts the pairs of the ids itself
    (RANK_LOCAL) and writes perm and offsets (moe_sort's)."""
    offsets, perm = alloc.empty(num_experts + 2, np.int32), alloc.empty(max(npairs, 1), np.int32)
    return offsets, perm[:npairs], (ids, k, offsets, perm, num_experts + 1, None)


def staged_scatter(xin, n: int, sch: Scheme, k: int) -> bool:
    """Whether run_rows takes the staged OP_SCATTER kernel (_scatter) for the MoE rows of
    ``xin`` (C-contiguous [tokens, n]) with k experts a token."""
    try:
        mode = out_kind(sch)
    except ValueError:
        return False
    fast = n % 8 == 0 and device_address(xin.arr) % 16 == 0  # (the outputs: fresh, aligned arrays)
    return _scatter(fused_kernels.OP_GATHER, mode, xin.kind, fast, format_tuple(sch), k)


def rank_path(xin, n: int, sch: Scheme, k: int, npairs: int) -> bool:
    """Whether moe_sort_quantize's sort is moe_rank (npairs >= MOE_RANK_MIN_PAIRS): where
    run_rows takes the staged OP_SCATTER kernel (_scatter) for its rows of
    ``xin`` (C-contiguous [tokens, n]) with k experts a token."""
    return npairs >= MOE_RANK_MIN_PAIRS and staged_scatter(xin, n, sch, k)


def rank_chunk_shift(npairs: int) -> int:
    """log2 of moe_rank_kernel's chunk: about MOE_RANK_BLOCKS chunks, of 256 to 1024 pairs."""
    return max(8, min(fused_kernels.MOE_RANK_SHIFT, (-(-npairs // MOE_RANK_BLOCKS) - 1).bit_length()))


def moe_rank(ids, npairs: int, num_experts: int, alloc: Allocator, launches=None, ws=None, out=None, flag=None):
    """(packed int32 [npairs], cbase, offsets int32 [E+2], perm int32 [npairs], csh) from
    expert ids [npairs] as moe_sort takes them, by moe_rank_kernel (one launch, a block a chunk
    of 2^csh pairs: rank_chunk_shift): packed and cbase (the chunks' first rows of each
    bucket) are what the staged rows kernel reads with RANK (run_rows' ``moe=(packed, k,
    cbase, perm, E + 1, csh)``); perm is written by that kernel; offsets as moe_sort's.
    ``ws``: a zeroed ``_grid`` workspace (its first word the kernel's ticket, left zero); None:
    a zeroed one of ``alloc``'s. ``out``: (packed, cbase, offsets, perm) to write instead of
    new arrays. ``flag``: as moe_sort's."""
    if not 1 <= num_experts <= fused_kernels.MOE_MAX_EXPERTS:
        raise ValueError(f"num_experts={num_experts} must be in [1, {fused_kernels.MOE_MAX_EXPERTS}] "
                         "for the device sort")
    csh = rank_chunk_shift(npairs)
    nchunks = max(1, -(-npairs // (1 << csh)))
    nb = num_experts + 1
    counts = alloc.empty(nchunks * nb, np.int32)
    if out is None:
        out = (alloc.empty(max(npairs, 1), np.int32), alloc.empty(nchunks * nb, np.int32),
               alloc.empty(num_experts + 2, np.int32), alloc.empty(max(npairs, 1), np.int32))
    packed, cbase, offsets, perm = out
    report, flag = _report(flag, alloc)
    if ws is None:
        ws = alloc.empty(SYNC_WORDS, np.int32)
        fill_bytes(ws, 0)
    _launch(launches, fused_kernels.moe_rank_kernel, nchunks, fused_kernels.MOE_CHUNK,
            (ids, npairs, num_experts, csh, counts, cbase, packed, offsets, ws, flag, report))
    return packed, cbase, offsets, perm[:npairs], csh


_SORTS_REPORTING = (fused_kernels.moe_sort_kernel, fused_kernels.moe_scan_kernel,
                    fused_kernels.moe_rank_kernel)  # (their last argument: report)


def _report(flag, alloc):
    """(report, flag) arguments of a sort kernel: (1, flag), or where ``flag`` is None (0, a
    word of ``alloc``'s that the kernel never touches; not an array it writes: the simulator
    copies each argument back after the kernel, the last copy of an array passed twice
    winning)."""
    return (0, alloc.empty(1, np.int32)) if flag is None else (1, flag)


def _unreported(launches):
    """``launches`` (a plan's) with every sort kernel's ``report`` argument 0."""
    return [(kern, g, b, a[:-1] + (0,)) if kern in _SORTS_REPORTING else (kern, g, b, a) for kern, g, b, a in launches]


def moe_rows(xin, ids, npairs: int, k: int, num_experts: int, sch: Scheme, alloc: Allocator, launches=None,
             ws=None, flag=None):
    """The MoE sort + quantize's launches for x ``xin`` (C-contiguous [tokens, hidden]) and
    ``ids`` (npairs, token-major): no sort where local_path holds, moe_rank's
    where rank_path does, else moe_sort's; then run_rows. ``ws``: the sort's
    workspace (None: a zeroed one of ``alloc``'s); ``flag``: the sort's id check word (as
    moe_sort's; the local path has none). Returns (run_rows' outputs, perm, offsets [E + 2],
    the path: "local", "rank" or "sort", and moe_sort's inv on the sort path, else None)."""
    hidden = xin.shape[1]
    if local_path(xin, hidden, sch, k, npairs, num_experts):  # the rows kernel sorts its own pairs
        offsets, perm, moe = moe_local(ids, npairs, k, num_experts, alloc)
        out = run_rows(fused_kernels.OP_GATHER, xin, npairs, hidden, sch, moe=moe, alloc=alloc, launches=launches)
        return out, perm, offsets, "local", None
    if rank_path(xin, hidden, sch, k, npairs):  # the rows kernel finds each pair's row (and stores perm)
        packed, cbase, offsets, perm, csh = moe_rank(ids, npairs, num_experts, alloc, launches, ws=ws, flag=flag)
        out = run_rows(fused_kernels.OP_GATHER, xin, npairs, hidden, sch,
                       moe=(packed, k, cbase, perm, num_experts + 1, csh),
                       alloc=alloc, launches=launches)
        return out, perm, offsets, "rank", None
    perm, offsets, inv = moe_sort(ids, npairs, k, num_experts, alloc, launches, ws=ws, flag=flag)
    out = run_rows(fused_kernels.OP_GATHER, xin, npairs, hidden, sch, perm=perm, moe=(inv, k), alloc=alloc,
                   launches=launches)
    return out, perm, offsets, "sort", inv


def moe_scan_threads(num_experts: int) -> int:
    """The scan's block: a power of two >= E, at least a warp, at most MOE_MAX_EXPERTS."""
    return min(fused_kernels.MOE_MAX_EXPERTS, max(32, 1 << (num_experts - 1).bit_length()))


# ----------------------------------------------------------------------------- the MoE hot path
class IdChecks:
    """Words of pinned host memory that the sort's kernels write (_fused_kernels.report_ids: 1
    every expert id in range, 2 not), mapped into the device's address space: a planned
    moe_sort_quantize with check_ids=True takes one (``take``), passes its device address to
    the sort, and polls it (``wait``) instead of waiting for the stream, so it returns once the
    sort has its totals, the rows still to run. A ring of ``n`` words: a word is taken again only after n
    later calls, each of which waited for its own word (calls in flight at once: at most one
    a thread). ``host``: an int32 array over the words; ``dev``: their device address
    (tests build one over a NumPy array, ``dev`` 0)."""

    POLLS = 1024  # reads of the word between two queries of the stream

    def __init__(self, host, dev: int):
        self.host, self.dev, self.n = host, int(dev), len(host)
        self._read = host.item
        self._next = itertools.count()

    @classmethod
    def pinned(cls, cp, n: int = 1024):
        mem = cp.cuda.alloc_pinned_memory(4 * n)
        # (cudaHostAlloc's memory is mapped; its device address, the same as the host's with
        # unified addressing, by cudaPointerGetAttributes)
        self = cls(np.frombuffer(mem, np.int32, n), cp.cuda.runtime.pointerGetAttributes(mem.ptr).devicePointer)
        self._mem = mem  # (kept alive with the words)
        return self

    def take(self) -> tuple[int, int]:
        """(i, device address) of a word, cleared."""
        i = next(self._next) % self.n
        self.host[i] = 0
        return i, self.dev + 4 * i

    def wait(self, i: int, stream) -> bool:
        """Whether word i says every id was in range, once the kernel has written it. Every
        POLLS reads, the stream is queried (``stream.done``): a stream with nothing left to
        run and the word still clear means the check never ran (RuntimeError), not a wait
        for ever."""
        read, polls = self._read, self.POLLS
        n = 0
        while True:
            v = read(i)
            if v:
                return v == 1
            n += 1
            if n % polls == 0 and stream.done:
                v = read(i)
                if v:
                    return v == 1
                raise RuntimeError("moe_sort_quantize: the stream ended without the sort writing its id "
                                   "check (_fused_kernels.report_ids)")


_ID_CHECKS = None
_ID_CHECKS_LOCK = threading.Lock()


def id_checks(cp) -> IdChecks:
    """The process's pinned :class:`IdChecks` (made on first use)."""
    global _ID_CHECKS
    with _ID_CHECKS_LOCK:
        if _ID_CHECKS is None:
            _ID_CHECKS = IdChecks.pinned(cp)
    return _ID_CHECKS


class _Slot(Ptr):
    """A planned 1-D array: a launch.Ptr (``base`` + ``offset`` bytes) that also takes the
    slices and dtype views run_rows and moe_sort take of real arrays."""

    __slots__ = ()

    def __getitem__(self, s):
        start, stop, step = s.indices(self.n)
        if step != 1:
            raise ValueError("a planned array takes contiguous slices only")
        return _Slot(self.base, self.offset + start * self.dtype.itemsize, stop - start, self.dtype)

    def view(self, dtype):
        dt = np.dtype(dtype)
        return _Slot(self.base, self.offset, self.n * self.dtype.itemsize // dt.itemsize, dt)


class _PlanAlloc:
    """Allocator of a plan: every array a 256-byte aligned slot of one buffer ("base")."""

    lib = "cupy"

    def __init__(self):
        self.total = 0

    def empty(self, n, dtype):
        dt = np.dtype(dtype)
        slot = _Slot("base", self.total, n, dt)
        self.total += -(-max(n * dt.itemsize, 1) // 256) * 256
        return slot


@lru_cache(maxsize=64)
def moe_plan(device: int, tokens: int, hidden: int, k: int, num_experts: int, kind: int, dtype_name: str,
             ids_char: str, sch: Scheme, switches: tuple):
    """``run(x, ids, flag=0) -> (codes, scales, perm, offsets)`` for moe_sort_quantize on
    C-contiguous CuPy arrays of these shapes and dtypes (x: 16-byte aligned; ids: int32 or int64,
    the char ``ids_char``) on GPU ``device`` (current when built and called: _devices), on CuPy's
    current stream: one ``cupy.cuda.alloc`` for every output and
    scratch array and the launches of the general path (moe_rank or moe_sort, run_rows: the
    same kernels, grids and arguments, recorded once) by ``launch.compile_sequence``; ``offsets``
    is the op's [E + 1] (moe_sort's but its last entry). None where that cannot be built (simulator, NQDQ_FAST_LAUNCH=0,
    no CuPy). ``switches``: moe_switches(), part of the cache key. On the local path (local_path)
    the call is one launch, the rows kernel's, with no workspace. With OP_SCATTER rows on sm_90+
    every launch after the first is its predecessor's programmatic dependent: the rows' loads
    overlap the sort. On the rank path (rank_path) the sort is moe_rank's one launch, its
    ticket the stream's workspace on a
    direct call and, under graph capture, a word of the call's allocation zeroed by a memset
    first. Else a direct call sorts in one launch, a call under graph capture
    in three (``run.seq`` and ``run.seq_graph``). Except on the local path (which has no sort),
    a direct call given ``flag`` (the device address of an IdChecks word:
    check_ids=True) launches ``run.seq_check``, the same launches but the sort's ``report``
    argument 1: the sort writes its id check there (_fused_kernels.report_ids)."""
    import sys

    from ..runtime import launch

    cp = sys.modules.get("cupy")
    if SIMULATOR or cp is None or not launch._fast_path_allowed() or tokens * k == 0:
        return None
    from ..runtime.interop import DeviceInput, cupy_array_new

    alloc, launches = _PlanAlloc(), []
    tk = tokens * k
    x = _Slot("xp", 0, tokens * hidden, _XDTYPES[kind])
    ids = _Slot("ids", 0, tk, np.dtype(ids_char))
    ws = _Slot("ws", 0, SYNC_WORDS, np.dtype(np.int32))
    flag = _Slot("flag", 0, 1, np.dtype(np.int32))  # the sort's id check word (run's ``flag``)
    xin = DeviceInput(x, kind, (tokens, hidden), dtype_name, "cupy")
    # (x's slot at offset 0: aligned, as the hot path's x must be)
    out, perm, offsets, path, inv = moe_rows(xin, ids, tk, k, num_experts, sch, alloc, launches, ws=ws, flag=flag)
    local, rank = path == "local", path == "rank"
    checked, launches = launches, _unreported(launches)  # (a call with check_ids=True, and one without)
    if rank:
        ws_graph = alloc.empty(SYNC_WORDS, np.int32)  # a captured call's own ticket, zeroed by a memset node
    names = ("xp", "ids", "base", "ws", "flag")
    # each launch after the first is its predecessor's programmatic dependent (the sort's
    # kernels and OP_SCATTER wait for their predecessor before they read its output)
    pdl_ok = out["op"] == fused_kernels.OP_SCATTER and (device_cc() or (0, 0)) >= (9, 0)  # (sm_90+)

    def sequence(ls):
        return launch.compile_sequence(ls, names, pdl=tuple(range(1, len(ls))) if pdl_ok else ())

    seq = seq_graph = sequence(launches)
    reports = not local  # (the local path has no sort to report the check)
    seq_check = sequence(checked) if reports else None
    if seq is None or (reports and seq_check is None):
        return None
    if not rank and not local:
        # Captured in a CUDA graph, the call takes the three-launch sort (into the same arrays):
        # a graph pays no host time a launch, and on the device the three launches are shorter
        # (H100, graphs, dependent launches: 64 tokens top-8 9.0 against 13.3 us a call, 2048 top-4
        # 34.1 against 36.1); and its replays need no workspace of their own (no memset node).
        # Direct calls take the one launch and the stream's _grid workspace (left zero).
        l3 = []
        moe_sort(ids, tk, k, num_experts, alloc, l3, one=False, out=(perm, offsets, inv))
        seq_graph = sequence(l3 + launches[-1:])
        if seq_graph is None:
            return None
    total = max(alloc.total, 1)
    parts = [(out["codes"], (tk, out["pcols"])), (out["scales"], sch.scale_shape((tk, hidden))), (perm, (tk,)),
             (offsets, (num_experts + 1,))]
    views = [(a.offset, tuple(shape), a.dtype) for a, shape in parts]
    _alloc, _nd, _cur = cp.cuda.alloc, cp.ndarray, cp.cuda.get_current_stream
    # the arrays by ndarray's own __new__ + _init where that builds what the constructor does
    # (about 1 us less each: _interop.cupy_array_new, as nqdq.quantize's hot path)
    new = cupy_array_new(cp, cp.cuda.alloc(256))

    if rank:
        # direct calls: the stream's workspace (left zero by the rank kernel); captured: the
        # call's own, zeroed first (a graph may be replayed on any stream, beside direct calls)
        from ..quantize.runners import capture_test, stream_workspaces as _stream_workspaces

        _ws, _capturing, _memset = _stream_workspaces(cp).get, capture_test(cp), cp.cuda.runtime.memsetAsync
        ws_off = ws_graph.offset

        def launch(st, x, ids, mp, flag=0):
            if _capturing(st.ptr):
                _memset(mp.ptr + ws_off, 0, SYNC_WORDS * 4, st.ptr)
                seq(st.ptr, x.data.ptr, ids.data.ptr, mp.ptr, mp.ptr + ws_off, 0)
            else:
                (seq_check if flag else seq)(st.ptr, x.data.ptr, ids.data.ptr, mp.ptr, _ws(st, device), flag)
    elif seq_graph is seq:
        def launch(st, x, ids, mp, flag=0):
            (seq_check if flag else seq)(st.ptr, x.data.ptr, ids.data.ptr, mp.ptr, 0, flag)
    else:
        from ..quantize.runners import capture_test, stream_workspaces as _stream_workspaces

        _ws, _capturing = _stream_workspaces(cp).get, capture_test(cp)

        def launch(st, x, ids, mp, flag=0):
            if _capturing(st.ptr):
                seq_graph(st.ptr, x.data.ptr, ids.data.ptr, mp.ptr, 0, 0)
            else:
                (seq_check if flag else seq)(st.ptr, x.data.ptr, ids.data.ptr, mp.ptr, _ws(st, device), flag)

    if new is not None:
        def run(x, ids, flag=0):
            mp = _alloc(total)
            launch(_cur(device), x, ids, mp, flag)
            arrays = []
            for off, shape, dt in views:
                a = new(_nd)
                a._init(shape, dt, mp + off)
                arrays.append(a)
            return arrays
    else:
        def run(x, ids, flag=0):
            mp = _alloc(total)
            launch(_cur(device), x, ids, mp, flag)
            return [_nd(shape, dt, mp + off) for off, shape, dt in views]

    run.launch, run.total, run.seq, run.seq_graph = launch, total, seq, seq_graph  # (diagnostics and tests)
    run.seq_check = seq_check  # run(x, ids, flag) with ``flag`` != 0 launches it: the sort reports to flag
    return run


# ----------------------------------------------------------------------------- the rows hot path
def rows_switches() -> tuple:
    """What run_rows reads of build switches (part of the plans' and hot paths' keys): none
    are left."""
    return ()


def moe_switches() -> tuple:
    """What moe_plan reads of the MoE launcher's module settings (its ``switches``, and the MoE
    hot path's key), in one place: the geometry and size rules (tests set smaller ones to reach
    every path at small sizes)."""
    return (MOE_UNITS, MOE_STAGE, MOE_STAGE_BLOCKS, MOE_RANK_MIN_PAIRS, MOE_LOCAL_MAX_PAIRS)


class RowsPlan:
    """A fused row op's call planned once (``rows_plan``): run_rows' launch recorded with its
    arrays as slots (launch.Ptr) of the call variables ``xp`` (x), ``wp`` (the weight),
    ``rp`` (the residual) and ``base`` (the call's one allocation of ``total`` bytes, every
    output and dummy a 256-byte aligned slot of it). ``outputs``: name -> (byte offset, items,
    dtype) of "codes", "scales", "newres", "y" and "static" (the static per-tensor scale's
    words, which the caller fills) where the op has them; ``pcols``: the codes' row length.
    ``sequence(stream, xp, wp, rp, base)`` launches it from raw addresses
    (launch.compile_sequence; None in the simulator or with NQDQ_FAST_LAUNCH=0); ``replay``,
    its twin, takes arrays (NumPy under the simulator) and launches through FastKernel."""

    __slots__ = ("launches", "total", "outputs", "pcols", "sequence")

    def __init__(self, launches, total, outputs, pcols, sequence):
        self.launches, self.total, self.outputs, self.pcols, self.sequence = launches, total, outputs, pcols, sequence

    def replay(self, stream, xp, wp, rp, base):
        """The launches with each slot an array over the memory of its call variable (each
        one an array whose first byte is the variable's address, C-contiguous along its last
        axis): the simulator's twin of ``sequence``."""
        named = {"xp": xp, "wp": wp, "rp": rp, "base": base}
        for kern, grid, block, args in self.launches:
            if grid > 0:
                real = tuple(_slot_array(a, named[a.base]) if isinstance(a, Ptr) else a for a in args)
                fast_kernel(kern).launch(grid, block, real, None)


def _slot_array(p, a):
    """The ``p.n`` items of ``p.dtype`` at ``p.offset`` bytes into the memory of array ``a``."""
    nbytes = p.n * p.dtype.itemsize
    raw = np.lib.stride_tricks.as_strided(a.view(np.uint8), (p.offset + nbytes,), (1,))
    return raw[p.offset :].view(p.dtype)


@lru_cache(maxsize=64)
def rows_plan(device: int, op: int, rows: int, n: int, kind: int, wkind: int, has_res: bool, sch, want_y: bool,
              eps, sscale, strides, static_words: int, switches: tuple):
    """The :class:`RowsPlan` of run_rows(op, ...) on ``rows`` rows of ``n`` (x of ``kind``;
    the weight of ``wkind`` for OP_NORM; the residual where ``has_res``; ``strides``: OP_ROWS's
    (sb, sh, D) over a [B, H, D] view, None for contiguous rows) on GPU ``device`` (current
    when built and launched), every address 16-byte aligned (the hot paths' callers check
    that of their arrays; the outputs' slots are). ``static_words``: float32 words of the
    static per-tensor scale output to reserve ("static"). ``switches``: rows_switches(), part
    of the cache key. None where the call launches nothing (no rows)."""
    if rows <= 0 or n <= 0:
        return None
    alloc, launches = _PlanAlloc(), []
    xdt = _XDTYPES[kind]
    span = rows * n if strides is None else (rows - 1) * strides[0] + (n // strides[2] - 1) * strides[1] + strides[2]
    xin = DeviceInput(_Slot("xp", 0, span, xdt), kind, (rows, n), "", "cupy")
    w = _Slot("wp", 0, n, _XDTYPES[wkind]) if op == fused_kernels.OP_NORM else None
    res = _Slot("rp", 0, rows * n, xdt) if has_res else None
    out = run_rows(op, xin, rows, n, sch, w=w, wkind=wkind, res=res, eps=eps, sscale=sscale, strides=strides,
                   want_y=want_y, alloc=alloc, launches=launches)
    outputs = {name: (out[name].offset, out[name].n, out[name].dtype) for name in ("codes", "scales", "newres", "y")
               if out[name] is not None}
    if static_words:
        slot = alloc.empty(static_words, np.float32)
        outputs["static"] = (slot.offset, slot.n, slot.dtype)
    sequence = None
    if not SIMULATOR:
        from ..runtime import launch

        sequence = launch.compile_sequence(launches, ("xp", "wp", "rp", "base"))
        if sequence is None:
            return None
    return RowsPlan(tuple(launches), max(alloc.total, 1), outputs, out["pcols"], sequence)


def audit_launches():
    """(label, kernel, args) of representative fused kernels for ``_ptx_audit.compile_and_audit``
    (``python -m nqdq.gpu.fused.plan``: compiled for sm_90 without a GPU; the same rules as the
    quantize kernels: no f64, IEEE div/sqrt, no FMA, no ftz). The layout is hidden 7168's
    (4 warps x 7 units), the fast (aligned) variant unless labelled "slow", FULL (fast = 2: the
    row fills the units) where _fused_rows.full_rows says so, as the launcher builds it."""
    from ...schemes import resolve_scheme

    def args(kind, wkind, sdt):
        xd, wd = _XDTYPES[kind], _XDTYPES[wkind]
        z = np.zeros
        return (z(8, xd), z(8, xd), z(8, wd), z(8, xd), z(8, np.float32), z(8, np.uint8), z(8, sdt), z(8, np.int32),
                1, 1, 1, np.float32(1), np.float32(1), 1, 1, 1, 1, 0, 1, z(8, np.int32), z(8, np.int32), 1, 8)

    nw, u = row_geometry(7168)
    def F(op, mode, res):  # (7168 = 4 warps x 32 x 7 units x 8: FULL where the launcher builds it so)
        return 2 if _fused_rows.full_rows(op, mode, res) else True

    out = []
    for name, mode, G in (("fp8_row", fused_kernels.OUT_ROW, 0), ("fp8_1x128", fused_kernels.OUT_GROUP, 128),
                          ("mxfp4", fused_kernels.OUT_MX, 32),
                          ("fp8_tensor", fused_kernels.OUT_TENSOR, 0)):
        sch = resolve_scheme(name, static_scale=name == "fp8_tensor")
        sdt = np.uint8 if mode == fused_kernels.OUT_MX else np.float32
        for kind, res in ((1, False), (1, True), (2, True), (0, False)):
            k = fused_row_kernel(fused_kernels.OP_NORM, mode, kind, kind, nw, u, F(fused_kernels.OP_NORM, mode, res),
                                 False, res,
                                 format_tuple(sch), _mx_cfg(sch), float(_max_elem(sch)), G, True)
            out.append((f"rmsnorm{'+res' if res else ''} {name} kind {kind}", k, args(kind, kind, sdt)))
    sch = resolve_scheme("fp8_row")
    k = fused_row_kernel(fused_kernels.OP_NORM, fused_kernels.OUT_ROW, 1, 1, nw, u, False, False, True,
                         format_tuple(sch), _mx_cfg(sch), 448.0,
                         0, True)
    out.append(("rmsnorm+res fp8_row kind 1 slow", k, args(1, 1, np.float32)))
    sch = resolve_scheme("mxfp4")
    k = fused_row_kernel(fused_kernels.OP_GATHER, fused_kernels.OUT_MX, 1, 0, nw, u,
                         F(fused_kernels.OP_GATHER, fused_kernels.OUT_MX, False), False, False,
                         format_tuple(sch), _mx_cfg(sch), 6.0, 32, True)
    out.append(("moe gather mxfp4", k, args(1, 0, np.uint8)))
    # the staged form as the launcher builds it at hidden 7168 (MOE_UNITS: 7 warps x 4 units, lanes' groups)
    k = fused_row_kernel(fused_kernels.OP_SCATTER, fused_kernels.OUT_MX, 1, 0, 7, 4, True, False, False,
                         format_tuple(sch), _mx_cfg(sch),
                         6.0, 32, True, 4, 4, 1)
    out.append(("moe scatter-rows staged mxfp4", k, args(1, 0, np.uint8)))
    k = fused_row_kernel(fused_kernels.OP_SCATTER, fused_kernels.OUT_MX, 1, 0, 7, 4, True, False, False,
                         format_tuple(sch), _mx_cfg(sch),
                         6.0, 32, True, 4, 4, 1, 0, 1)
    out.append(("moe scatter-rows staged rank mxfp4", k, args(1, 0, np.uint8)))
    k = fused_row_kernel(fused_kernels.OP_SCATTER, fused_kernels.OUT_MX, 1, 0, 7, 4, True, False, False,
                         format_tuple(sch), _mx_cfg(sch),
                         6.0, 32, True, 4, 8, 1, 0, _fused_rows.RANK_LOCAL)
    out.append(("moe scatter-rows staged local mxfp4", k, args(1, 0, np.uint8)))
    k = fused_row_kernel(fused_kernels.OP_ROWS, fused_kernels.OUT_GROUP, 1, 0, nw, u,
                         F(fused_kernels.OP_ROWS, fused_kernels.OUT_GROUP, False), True, False,
                         format_tuple(resolve_scheme("fp8_1x128")), (0, 0, 0, 1.0), 448.0, 128, True)
    out.append(("flatten strided fp8_1x128", k, args(1, 0, np.float32)))
    fy = (1, 3, -6, 0x7E, 0x7F, 8, 0, 0, 4, 1)
    k = fused_row_kernel(fused_kernels.OP_NORM, fused_kernels.OUT_Y, 1, 1, nw, u, True, False, True, fy, (0, 0, 0, 1.0),
                         448.0, 0, True)
    out.append(("rmsnorm y (unfused)", k, args(1, 1, np.float32)))
    a = np.zeros(8, np.int32)
    out += [("moe count", fused_kernels.moe_count_kernel, (a, 1, 1, a)),
            ("moe scan", fused_kernels.moe_scan_kernel, (a, 1, 1, a, a, a, 1)),
            ("moe scatter", fused_kernels.moe_scatter_kernel, (a, 1, 1, 1, a, a, a)),
            ("moe sort (one launch)", fused_kernels.moe_sort_kernel, (a, 1, 1, 1, a, a, a, a, a, a, 1)),
            ("moe rank", fused_kernels.moe_rank_kernel, (a, 1, 1, 8, a, a, a, a, a, a, 1))]
    return out


if __name__ == "__main__":  # pragma: no cover - needs numba-cuda with NVVM
    import sys

    from ...tools.ptx_audit import compile_and_audit

    rows = compile_and_audit(audit_launches())
    for r in rows:
        print(f"{r['kernel']:20s} regs {r.get('regs', '-')!s:>4s} stack {r.get('stack', '-')!s:>4s} "
              f"div.rn {r['divs']:3d} fma {r['fma']} f64 {r['f64']}  {r['case']}" + (f"  PROBLEMS {r['problems']}" if r["problems"] else ""))
    bad = sum(bool(r["problems"]) for r in rows)
    print(f"{len(rows)} fused kernels compiled for sm_90, {bad} with problems")
    sys.exit(1 if bad else 0)
