"""Launchers of the fused row kernel (bodies: ``rows``, ``kernels``; spec: ``reference/fused``).

Each function takes :class:`~nqdq.gpu.runtime.interop.DeviceInput` arrays (flat, in the
kernels' form: float32 or the uint16 bits of bfloat16 / float16) and returns flat outputs
in the input's library. Every row op (rmsnorm, rmsnorm_quantize, flatten_quantize, the MoE
op's rows) is one launch of :func:`rows.fused_row_kernel` by ``run_rows``; the MoE rows take
its staged OP_SCATTER form where they can (``scatter_geometry``, ``staged_scatter``). The MoE
sort that comes before those rows, and the MoE op's plan: ``moe``.

``rows_plan`` records run_rows' launch once for the row ops' hot path (``nqdq.fused._rows_hot``);
``audit_launches``: the representative fused kernels for the PTX audit
(``python -m nqdq.gpu.fused.plan``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ...reference.packing import packed_length
from ...schemes import Scheme
from . import kernels as fused_kernels
from ..device.elements import format_tuple
from ..runtime.interop import Allocator, DeviceInput, device_address
from ..runtime.target import SIMULATOR
from ..runtime.launch import fast_kernel
from ..runtime.sequence import Ptr, compile_sequence
from ..quantize.params import max_elem as _max_elem, mx_config as _mx_cfg
from ..quantize.plan import _XDTYPES, _sm_count
from ...reference.fused import MAX_ROW as MAX_ROW_REF
from ...reference.fused import row_geometry
from . import rows as _fused_rows
from .rows import fused_row_kernel
from ..quantize.lastaxis import SHFL_DEFAULT

__all__ = ["out_kind", "geometry", "run_rows", "rows_plan", "scatter_geometry", "staged_scatter", "MAX_ROW"]

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
# OP_SCATTER's blocks load and encode MOE_STAGE tokens into shared memory before they wait for
# the sort (fused.rows._scatter_staged_source), over a grid of at most MOE_STAGE_BLOCKS blocks an
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
STATIC_SMEM = 48 << 10  # a block's static shared memory, at most


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
                csh = -(-tokens // staged_blocks())
                if csh > stage:
                    raise RuntimeError("internal: local_path's tokens do not fit one round of the staged kernel")
                grid = -(-tokens // max(csh, 1))
            else:
                grid = min(grid, staged_blocks())
                pipe = int(grid * stage < tokens)  # (a block with one round has nothing to overlap)
    if moe is not None and len(moe) > 2 and not (rank and stage):
        raise RuntimeError("internal: moe_rank's ranks or the ids given, but the rows do not take the staged "
                           "OP_SCATTER kernel (rank_path / local_path and run_rows disagree)")
    # fast 2: every lane's U units in the row (full_rows: no unit tested against the row's end)
    full = _fused_rows.full_rows(op, mode, res is not None) and fast and n == 32 * nw * U * 8
    kern = fused_row_kernel(op, mode, kind, wkind, nw, U, 2 if full else bool(fast), strided, res is not None, fmt,
                            mx, float(maxe), G, SHFL_DEFAULT, kd, stage, lanes, pipe, rank)
    # dm: the fast strided loader's u // (D / 8) as (u * dm) >> 32 (fused.rows._loader)
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


def staged_blocks() -> int:
    """The most blocks of the staged OP_SCATTER's grid: MOE_STAGE_BLOCKS an SM (a block's
    rounds cover the tokens past that; the MoE local path's tokens fit one round of them)."""
    return max(1, _sm_count() * MOE_STAGE_BLOCKS)


def scatter_switches() -> tuple:
    """What run_rows reads of the staged OP_SCATTER's module settings (part of moe.moe_switches:
    the MoE plans' and hot path's keys)."""
    return (MOE_UNITS, MOE_STAGE, MOE_STAGE_BLOCKS)


def staged_scatter(xin, n: int, sch: Scheme, k: int) -> bool:
    """Whether run_rows takes the staged OP_SCATTER kernel (_scatter) for the MoE rows of
    ``xin`` (C-contiguous [tokens, n]) with k experts a token."""
    try:
        mode = out_kind(sch)
    except ValueError:
        return False
    fast = n % 8 == 0 and device_address(xin.arr) % 16 == 0  # (the outputs: fresh, aligned arrays)
    return _scatter(fused_kernels.OP_GATHER, mode, xin.kind, fast, format_tuple(sch), k)


# ----------------------------------------------------------------------------- plans (the hot paths')
# A plan is a call's launches recorded once with its arrays as slots of a few call variables
# (rows_plan here; moe.moe_plan), launched again from the arrays' addresses.
class _Slot(Ptr):
    """A planned 1-D array: a sequence.Ptr (``base`` + ``offset`` bytes) that also takes the
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


def rows_switches() -> tuple:
    """What run_rows reads of build switches (part of the plans' and hot paths' keys): none
    are left."""
    return ()


class RowsPlan:
    """A fused row op's call planned once (``rows_plan``): run_rows' launch recorded with its
    arrays as slots (sequence.Ptr) of the call variables ``xp`` (x), ``wp`` (the weight),
    ``rp`` (the residual) and ``base`` (the call's one allocation of ``total`` bytes, every
    output and dummy a 256-byte aligned slot of it). ``outputs``: name -> (byte offset, items,
    dtype) of "codes", "scales", "newres", "y" and "static" (the static per-tensor scale's
    words, which the caller fills) where the op has them; ``pcols``: the codes' row length.
    ``sequence(stream, xp, wp, rp, base)`` launches it from raw addresses
    (sequence.compile_sequence; None in the simulator or with NQDQ_FAST_LAUNCH=0); ``replay``,
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
        sequence = compile_sequence(launches, ("xp", "wp", "rp", "base"))
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
