"""Which kernels a quantize call launches, as data: :data:`RULES`, an ordered table of (name,
condition, builder); the first rule whose condition holds records the plan's allocations
and launches (``plan.get_plan`` builds and caches plans through :func:`build`). Where more
than one design remains for a case, the choice is named in ``choices`` (``KernelChoices``:
the reason and the measured figure of each) and the caller may select one (``choices=``);
a rule marked with a design applies under the automatic choice or where that design is
selected. "Whole units": a C-contiguous input whose rows (or whole tensor, per tensor) are
whole 16-byte units (8 bf16 / f16, 4 f32 elements). tests/test_plan_rules.py checks this
table against :data:`RULES`, name by name, in order.

==========================  ========================================  ===================================
rule                        case                                      kernels
==========================  ========================================  ===================================
static_units                caller-given float scales per tensor or   ``static_encode`` (one pass; the
                            per last-axis row, whole units            amax by-product in it)
nvfp4_given_scale_units     NVFP4, tensor scale given, last-axis      ``lastaxis_groups`` (S_enc written by
                            groups of whole units                     the plan: one pass; the amax
                                                                      by-product in it)
nvfp4_given_scale           NVFP4, tensor scale given, otherwise      ``group`` (-> ``tensor_partials`` ->
                                                                      ``amax_from_parts``: the amax)
static                      caller-given scales otherwise             ``encode`` (-> ``tensor_partials``
                                                                      -> ``amax_from_parts``: the amax)
nvfp4_one_launch            NVFP4, groups of whole units, decode      ``lastaxis_groups`` (S_enc over the
                            sizes (PerTensor.ONE_LAUNCH)              grid, ``grid``)
nvfp4_amax_in_groups        ... below NVFP4_SENC_MAX_UNITS units      ``tensor_amax`` -> ``lastaxis_groups``
                            (PerTensor.AMAX_IN_GROUPS)                (S_enc from the amax partials)
nvfp4_two_pass_units        ... otherwise (PerTensor.TWO_PASS)        ``tensor_amax`` -> ``finalize`` ->
                                                                      ``lastaxis_groups``
nvfp4_general               NVFP4 otherwise                           ``tensor_partials`` -> ``finalize``
                                                                      -> ``group``
tensor_one_launch           dynamic float scale per tensor, whole     ``static_encode`` with the grid's
                            units, decode sizes                       amax (``grid``, one launch)
                            (PerTensor.ONE_LAUNCH)
tensor_resident             ... RNE, sm_80+, cooperative launch       ``tensor_resident`` (one cooperative
                            (PerTensor.RESIDENT)                      launch, part of the input on chip)
tensor_two_pass_units       ... otherwise (PerTensor.TWO_PASS)        ``tensor_amax`` -> ``finalize`` ->
                                                                      ``static_encode``
tensor_general              per tensor (dynamic) otherwise            ``tensor_partials`` -> ``finalize``
                                                                      -> ``encode``
tile_blocks                 float B0 x B1 blocks, whole-unit tiles,   ``tile_blocks`` (one pass)
                            RNE
tile_general                B0 x B1 blocks otherwise                  ``tile_params`` -> ``encode``
column_cluster              float per-channel scales, channel axis    ``column_cluster`` (one pass, sm_90+)
                            last, rows of whole units, RNE
                            (PerChannel.CLUSTER)
column_ring                 ... stripes of several chunks, sm_80+     ``column_ring`` (one pass, workspace
                            (PerChannel.RING)                         zeroed by the plan)
column_single_chunk         ... a stripe's rows in one block          ``column_onepass`` (one pass)
                            (PerChannel.SINGLE_CHUNK)
column_two_pass             ... otherwise (PerChannel.TWO_PASS)       ``column_amax`` -> ``finalize`` ->
                                                                      ``column_encode``
column_rows                 per-channel, channel axis first of a      ``group`` (a channel is a row)
                            2-D array (or unpacked codes)
column_general              per-channel otherwise                     ``column_partials`` -> ``finalize``
                                                                      -> ``encode``
lastaxis_units              groups / rows along the last axis, whole  ``lastaxis_rows`` / ``lastaxis_groups``
                            units, groups of 2^k <= 32 units or       / ``lastaxis_asym_rows`` /
                            rows of at most 8192 units                ``lastaxis_stat_groups``
lastaxis_groups             last-axis groups / rows otherwise         ``group`` (one pass)
strided                     groups along another axis (and last-axis  ``strided_params`` -> ``encode``
                            groups whose packed bytes would straddle
                            two blocks)
==========================  ========================================  ===================================

Stochastic rounding takes the same 16-byte-unit kernels (their ``stoch`` variants), but not
the tile, per-channel one-pass, or cooperative kernels (the conditions say "RNE").
Every path writes codes already packed along the last axis (4-bit: two per byte, 6-bit:
four per three bytes), and scales in the linear layout ``scheme.scale_shape(shape)``.
No path transposes the input: other axes are handled by index arithmetic.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import numpy as np

from ...reference.packing import packed_length
from ..device.elements import format_tuple
from ..device.scales import MODE_ASYM, MODE_CENTRED, MODE_FLOAT, MODE_MX, MODE_NVFP4
from . import column_cluster, column_ring, columns, tensor_resident
from . import general
from . import grid as grid_sync
from . import lastaxis
from .choices import PerChannel, PerTensor
from .params import E_TARGET, cdiv, geo_args, group_plan, kernel_mode, max_elem, mx_config, pow2ceil, team_log2
from .slots import AMAX, SEED_HI, SEED_LO, X, Outputs, Recorder


class Tuning(NamedTuple):
    """The planner's tunables (``plan`` defines them, with the measurements behind each, and
    passes them to :func:`build` as this tuple, read when a plan is built)."""

    ROW_UNITS_MAX: int  # 16-byte units a thread of the row kernel holds in registers
    ROW_UNITS_DEEP: int  # units a thread of the float row kernel aims at on deep rows
    DEEP_ROWS: int  # rows from which the row kernel uses deep threads
    GROUP_UNITS: int  # units a thread of the group / amax kernels loads before using any (deep)
    DEEP_UNITS: int  # units from which the group kernel uses GROUP_UNITS per thread
    CHEAP_UNITS: int  # units per chunk where the encode is the paired fp8 cvt
    CENTRED_UNITS: int  # units per chunk of the centred groups
    SHFL: bool  # warp shuffles (False: their shared-memory twin)
    NVFP4_SENC_MAX_UNITS: int  # PerTensor.AMAX_IN_GROUPS automatically below this many units
    NVFP4_PARTS_MAX: int  # amax blocks whose partials every group-kernel block reduces, at most
    GRID_MAX_U: int  # PerTensor.ONE_LAUNCH: units or chunks a thread at most


# ----------------------------------------------------------------------------- what applies
def block_threads(nt, items=None):
    """Threads a block of the 16-byte-unit kernels: ``nt`` kept within 32 .. 256 and, given
    the ``items`` (units or chunks) the blocks share, halved (not below 64) while they would
    fill fewer than 264 blocks: small inputs get more, smaller blocks."""
    NT = max(32, min(nt, 256))
    if items is not None:
        while NT > 64 and items < NT * 264:
            NT //= 2
    return NT


def fast_tile(shape, kind, sch, mode):
    """True where ``tile_blocks`` applies: float scales over B0 x B1 tiles of the last two
    axes, rows of whole tiles (C % B1 == 0) of whole 16-byte units (B1 % VEC == 0)."""
    if mode != MODE_FLOAT or len(shape) < 2:
        return False
    B0, B1 = sch.block_for(shape)[-2:]
    vec = lastaxis.vec_of(kind)
    return B1 % vec == 0 and shape[-1] % B1 == 0 and B0 * (B1 // vec) <= 1024 * 8


def fast_column(shape, kind, mode, ax, stoch):
    """Float per-channel scales along the last axis of a C-contiguous input whose rows are
    whole 16-byte units, rounding to nearest even: the kernels of ``columns``,
    ``column_ring`` and ``column_cluster``."""
    return mode == MODE_FLOAT and not stoch and ax == len(shape) - 1 and shape[-1] % lastaxis.vec_of(kind) == 0


def fast_static(shape, kind, sch, mode, nt, tune):
    """(NT, U, per_row) of ``static_encode`` for float scales of one tensor scale or one
    scale per last-axis row, a C-contiguous input of whole 16-byte units (rows of whole
    units when per row); None otherwise (the general ``encode``)."""
    if mode != MODE_FLOAT:
        return None
    nd = len(shape)
    per_row = sch.granularity == "row"
    if per_row and sch.axis % nd != nd - 1:
        return None
    if sch.granularity not in ("tensor", "row"):
        return None
    vec = lastaxis.vec_of(kind)
    n = math.prod(shape)
    if (shape[-1] if per_row else n) % vec:
        return None
    nunits = n // vec
    return block_threads(nt, nunits), (tune.GROUP_UNITS if nunits >= tune.DEEP_UNITS else 1), per_row


def fast_lastaxis(shape, kind, mode, G, nt, tune, cheap_encode=False):
    """The last-axis kernel (``lastaxis``) for a C-contiguous input whose scale groups of G
    run along the last axis, or None where only the general kernels apply: ("group", L, K,
    NT, U) when groups of G = L * VEC (L a power of two <= 32) tile each row, ("row", NT, U)
    when a group is a whole row of at most 1024 * ROW_UNITS_MAX units; rows must be whole
    16-byte units. Small inputs get shallow threads (U = 1 or 2: more of them, less latency
    each), large ones deep threads (more loads in flight, fewer blocks). ``cheap_encode``:
    the elements are fp8 encoded by the paired cvt instruction."""
    if mode not in (MODE_FLOAT, MODE_MX, MODE_NVFP4, MODE_ASYM, MODE_CENTRED):
        return None
    C = shape[-1]
    if mode == MODE_CENTRED and (G > C or C % G):
        return None  # the halving sum pads to the scheme's group: whole groups only
    vec = lastaxis.vec_of(kind)
    if C % vec:
        return None
    n = math.prod(shape)
    rows = n // C
    G = min(G, C)
    L = G // vec
    if C % G == 0 and G % vec == 0 and L & (L - 1) == 0 and L <= 32:
        # units per chunk: one set of group parameters per chunk saves instructions where the
        # element encode is long (fp4 / fp6 / int: measured 52 -> 54 % of copy for mxfp4), but
        # a thread's K consecutive units make each load instruction K-strided; where the encode
        # is one cvt per pair (fp8) coalescing matters more (mxfp8 97 -> 74 %, fp8_1x128 89 ->
        # 65 % of copy with K = 4 on an H100, bf16 8192x8192): K = 1 there
        K = min(L, tune.CHEAP_UNITS) if cheap_encode else min(L, tune.GROUP_UNITS)
        if mode == MODE_CENTRED:
            K = min(L, tune.CENTRED_UNITS)
        U = max(1, tune.GROUP_UNITS // K) if n // vec >= tune.DEEP_UNITS else 1
        return ("group", L, K, block_threads(nt, n // vec // K), U)
    if G == C and mode != MODE_CENTRED:
        upr = C // vec
        exact = mode == MODE_FLOAT  # (ROW_UNITS_DEEP measured for the float row kernel only)
        u_target = (tune.ROW_UNITS_DEEP if exact else tune.ROW_UNITS_MAX) if rows >= tune.DEEP_ROWS else 2
        NT = 32
        while NT < 1024 and NT * u_target < upr:
            NT *= 2
        if exact:  # the fewest warps that hold the row in u_target units each (less padding)
            NT = min(1024, 32 * cdiv(cdiv(upr, u_target), 32))
        U = cdiv(upr, NT)
        if U <= tune.ROW_UNITS_MAX:
            return ("row", NT, U)
    return None


def grid_geometry(nitems, nt, sms, max_u):
    """(NT, U, blocks) for a one-launch kernel of ``grid`` over ``nitems`` work items (units
    or chunks) of which a thread holds U <= ``max_u``, at most ``sms`` blocks (one per SM);
    None when the input is too large for that (the streaming paths then)."""
    NT = block_threads(nt)
    limit = min(sms, grid_sync.MAX_DONE)
    U = cdiv(nitems, NT * limit)
    if U > max_u:
        return None
    return NT, U, cdiv(nitems, NT * U)


# ----------------------------------------------------------------------------- a call being planned
class _Case:
    """One quantize call being planned: its inputs, what the rules' conditions test (each
    computed once, when first asked), and the launch steps the builders share, each
    recording its allocations and launches into ``rec``."""

    def __init__(self, shape, kind, sch, packed, stoch, nt, static_scale, choices, tune, sm_count, cheap, amax=False):
        self.shape, self.kind, self.sch, self.packed, self.stoch = shape, kind, sch, packed, stoch
        self.nt, self.static_scale, self.choices, self.tune = nt, static_scale, choices, tune
        self.amax = amax  # record the input's amax in the caller's AMAX (a given tensor scale)
        assert not amax or (static_scale and (sch.granularity == "tensor" or sch.is_nvfp4))
        self._sm_count, self._cheap = sm_count, cheap
        self.n, self.nd, self.C = math.prod(shape), len(shape), shape[-1]
        self.mode, self.fmt, self.maxe, self.mxc = kernel_mode(sch), format_tuple(sch), max_elem(sch), mx_config(sch)
        self.block = sch.block_for(shape)
        self.ax = sch.axis % self.nd
        self.vec = lastaxis.vec_of(kind)
        self.sub_packed = packed and sch.code_bits < 8
        # the general kernels take the seed's halves always (0 under RNE); the 16-byte-unit
        # kernels' stochastic variants take them last, their RNE variants not at all
        self.key_lo, self.key_hi = (SEED_LO, SEED_HI) if stoch else (0, 0)
        self.keys = (SEED_LO, SEED_HI) if stoch else ()
        self.sr = {"stoch": True} if stoch else {}
        self.rec = Recorder()
        self.launch = self.rec.launch
        self.out = Outputs(self.rec, sch, self.mode, shape, packed)
        self.rows = self.out.rows
        self.codes, self.scales, self.zps, self.means = self.out.args()

    def granularity(self, g) -> bool:
        return self.sch.granularity == g

    # -- what the conditions test
    @functools.cached_property
    def sms(self) -> int:
        """SMs of the current device (1 under the simulator): blocks that may wait for each other."""
        return self._sm_count()

    @functools.cached_property
    def cheap(self) -> bool:
        """The format's elements encode by the paired fp8 cvt instruction (sm_89+)."""
        return self._cheap(self.fmt)

    @functools.cached_property
    def fast_static(self):
        return fast_static(self.shape, self.kind, self.sch, self.mode, self.nt, self.tune)

    @functools.cached_property
    def fast_lastaxis(self):
        """``fast_lastaxis`` of the scheme's last-axis groups (rules read it only where the
        groups run along the last axis)."""
        return fast_lastaxis(self.shape, self.kind, self.mode, self.block[-1], self.nt, self.tune, self.cheap)

    @functools.cached_property
    def lastaxis_group_plan(self):
        G = self.block[-1]
        return group_plan(G, self.C, cdiv(self.C, G), self.mode, self.nt, self.sub_packed)

    @functools.cached_property
    def fast_column(self) -> bool:
        return self.granularity("column") and fast_column(self.shape, self.kind, self.mode, self.ax, self.stoch)

    def oli(self):
        """(O, L, I): the input as (outer, along the scale axis, inner)."""
        return math.prod(self.shape[: self.ax]), self.shape[self.ax], math.prod(self.shape[self.ax + 1 :])

    # -- launch steps
    def encode(self):
        """The general ``encode`` with the scales (zero points, means) already written."""
        k = general.make_encode_kernel(self.kind, self.mode, self.fmt, self.nt, self.packed, self.stoch)
        tpr_log2 = team_log2(cdiv(self.C, 4), self.nt)
        grid = max(1, min(cdiv(self.rows, self.nt >> tpr_log2), 1 << 20))
        self.launch(
            k, grid, self.nt,
            X, self.rows, self.C, *geo_args(self.shape, self.block), self.codes, self.out.pcols, self.scales,
            self.zps, self.means, self.key_lo, self.key_hi, tpr_log2,
        )  # fmt: skip

    def group(self, view_rows, view_cols, G_true, plan):
        """The general ``group`` kernel over a (view_rows, view_cols) view, groups of G_true."""
        ngroups = cdiv(view_cols, G_true)
        k = general.make_group_kernel(
            self.kind, self.mode, self.fmt, self.mxc, self.maxe, plan["G"], plan["P"], plan["team"], plan["gpb"],
            self.nt, plan["stash"], self.packed, self.stoch,
        )  # fmt: skip
        if ngroups == 1:
            segs = 1
            grid = cdiv(view_rows, plan["gpb"])
        else:
            segs = cdiv(ngroups, plan["gpb"])
            grid = view_rows * segs
        vpcols = packed_length(view_cols, self.sch.code_bits) if self.sub_packed else view_cols
        self.launch(
            k, grid, self.nt,
            X, view_rows, view_cols, ngroups, segs, self.codes, vpcols, self.scales, self.zps, self.means,
            self.out.sparams, self.key_lo, self.key_hi,
        )  # fmt: skip

    def groups(self):
        """The general ``group`` kernel over the rows, the scheme's last-axis groups."""
        self.group(self.rows, self.C, self.block[-1], self.lastaxis_group_plan)

    def units(self, fast):
        """A last-axis kernel of ``lastaxis`` (see _fast_lastaxis)."""
        kind, fmt, maxe, packed, vec, sr, keys = self.kind, self.fmt, self.maxe, self.packed, self.vec, self.sr, self.keys
        shfl = self.tune.SHFL
        if self.mode in (MODE_ASYM, MODE_CENTRED):
            if fast[0] == "row":
                _, NT, U = fast
                k = lastaxis.make_lastaxis_asym_row_kernel(kind, fmt, maxe, NT, U, packed, shfl, **sr)
                self.launch(k, self.rows, NT, X, self.C // vec, self.codes, self.scales, self.zps, self.means, *keys)
            else:
                _, L, K, NT, U = fast
                k = lastaxis.make_lastaxis_stat_group_kernel(kind, self.mode, fmt, maxe, L, K, NT, U, packed,
                                                                    shfl, **sr)  # fmt: skip
                nchunks = self.n // vec // K
                self.launch(k, cdiv(nchunks, NT * U), NT, X, nchunks, self.codes, self.scales, self.zps,
                            self.means, *keys)  # fmt: skip
        elif fast[0] == "row":
            _, NT, U = fast
            assert NT * (U - 1) < self.C // vec <= NT * U  # (the kernel checks only its last unit)
            # a finite row's units straight-line where the encode is the fp8 cvt (H100, bf16
            # fp8_row 8192x8192: 31.8 -> 27.9 M warp instructions, 71.0-71.4 -> 70.9-71.2 us);
            # int8_row measured 0.5-1 us slower with it, so integer rows keep a branch a unit
            k = lastaxis.make_lastaxis_row_kernel(kind, self.mode, fmt, self.mxc, maxe, NT, U, packed, shfl,
                                                         whole=self.cheap, **sr)  # fmt: skip
            self.launch(k, self.rows, NT, X, self.C // vec, self.codes, self.scales, self.out.sparams, *keys)
        else:
            _, L, K, NT, U = fast
            k = lastaxis.make_lastaxis_group_kernel(kind, self.mode, fmt, self.mxc, maxe, L, K, NT, U, packed,
                                                           shfl, amax=self.amax, **sr)  # fmt: skip
            nchunks = self.n // vec // K
            self.launch(k, cdiv(nchunks, NT * U), NT, X, nchunks, self.codes, self.scales, self.out.sparams,
                        *self.amax_arg(), *keys)  # fmt: skip

    def partials(self, count):
        """finalize's partial statistics, ``count`` of each: amax bits, min, max."""
        return self.rec.empty(count, np.int64), self.rec.empty(count, np.float32), self.rec.empty(count, np.float32)

    def tensor_stats(self, stat_mode):
        """The general tensor statistics pass; returns its partials and their count."""
        nblocks = max(1, min(cdiv(self.n, self.nt * E_TARGET), 1024))
        parts = self.partials(nblocks)
        k = general.make_tensor_partials_kernel(self.kind, stat_mode, self.nt)
        self.launch(k, nblocks, self.nt, X, self.n, *parts)
        return parts, nblocks

    def tensor_amax_parts(self, NT, finite, max_blocks=1024):
        """Whole units: the vector-load tensor amax pass (``finite``: over the finite
        elements, NVFP4's); returns its partials and their count."""
        nunits = self.n // self.vec
        U = self.tune.GROUP_UNITS
        nblocks = max(1, min(cdiv(nunits, NT * U), max_blocks))
        parts = self.partials(nblocks)
        k = lastaxis.make_tensor_amax_kernel(self.kind, NT, U, self.tune.SHFL, finite)
        self.launch(k, nblocks, NT, X, nunits, *parts)
        return parts, nblocks

    def tensor_amax(self, NT, finite):
        """tensor_amax_parts, then finalize."""
        parts, nblocks = self.tensor_amax_parts(NT, finite)
        self.finalize(self.mode, parts, nblocks, 1, 1)

    def static(self, NT, U, per_row):
        """``static_encode`` over whole units with the scales in ``scales`` (the amax
        by-product in the same pass where asked)."""
        nunits = self.n // self.vec
        k = lastaxis.make_static_kernel(self.kind, self.fmt, NT, U, self.packed, per_row, shfl=self.tune.SHFL,
                                        amax=self.amax, **self.sr)  # fmt: skip
        self.launch(k, cdiv(nunits, NT * U), NT, X, nunits, self.C // self.vec, self.codes, self.scales,
                    *self.amax_arg(), *self.keys)  # fmt: skip

    def amax_arg(self):
        """The AMAX argument of a kernel that records the amax by atomics (none where the
        amax is not asked): the plan zeroes AMAX before the launches."""
        if not self.amax:
            return ()
        self.rec.zero_amax = True
        return (AMAX,)

    def amax_pass(self):
        """The amax by-product for the shapes whose one-pass kernels have no amax variant
        (rows that are not whole units, strided views): the general statistics pass (the
        dynamic scheme's: NVFP4 over the finite values) and its partials' max into AMAX."""
        parts, nblocks = self.tensor_stats(MODE_NVFP4 if self.mode == MODE_NVFP4 else MODE_FLOAT)
        k = lastaxis.make_amax_from_parts_kernel(block_threads(self.nt), self.tune.SHFL)
        self.launch(k, 1, block_threads(self.nt), parts[0], nblocks, AMAX)

    def finalize(self, fmode, parts, nchunks, ngroups, I):
        """The scales (zero points, S_enc, tensor scale) from ``parts``."""
        tsc = self.out.tscale if self.out.tscale is not None else self.out.dummy_f32
        nft = min(self.nt, pow2ceil(nchunks * I))  # threads per group: no more than its partials
        self.launch(
            general.make_finalize_kernel(fmode, self.maxe, nft), ngroups, nft,
            *parts, nchunks, ngroups, I, self.scales, self.zps, self.out.sparams, tsc,
        )  # fmt: skip

    def grid_workspace(self):
        """A ``grid`` one-launch kernel's workspace (left zero by the kernel: "reset")."""
        return self.rec.empty(grid_sync.SYNC_WORDS, np.int32, "reset")


# ----------------------------------------------------------------------------- the rules' conditions
def _nvfp4_grid(c: _Case):
    f = c.fast_lastaxis
    if f is None or f[0] != "group" or not c.choices.allows(PerTensor.ONE_LAUNCH):
        return None
    return grid_geometry(c.n // c.vec // f[2], c.nt, c.sms, c.tune.GRID_MAX_U)


def _nvfp4_amax_in_groups(c: _Case):
    f = c.fast_lastaxis
    if f is None or f[0] != "group":
        return None
    chosen = c.choices.per_tensor
    if chosen is PerTensor.AMAX_IN_GROUPS or (chosen is None and c.n // c.vec < c.tune.NVFP4_SENC_MAX_UNITS):
        return f
    return None


def _tensor_grid(c: _Case):
    if not (c.granularity("tensor") and c.fast_static and c.choices.allows(PerTensor.ONE_LAUNCH)):
        return None
    return grid_geometry(c.n // c.vec, c.nt, c.sms, c.tune.GRID_MAX_U)


def _tensor_resident(c: _Case) -> bool:
    return bool(c.granularity("tensor") and c.fast_static and not c.stoch
                and c.choices.allows(PerTensor.RESIDENT) and tensor_resident.available())  # fmt: skip


def _column_cluster(c: _Case):
    if not (c.fast_column and c.choices.allows(PerChannel.CLUSTER) and column_cluster.available()):
        return None
    return column_cluster.cluster_geometry(c.rows, c.C // c.vec, c.vec, c.sms)


def _column_ring(c: _Case):
    """The ring's geometry where it applies: stripes of several chunks (a single chunk
    takes the ring only where the caller chose it: the simulator's only P)."""
    if not (c.fast_column and c.choices.allows(PerChannel.RING) and column_ring.available()):
        return None
    g = column_ring.ring_geometry(c.rows, c.C // c.vec, c.sms, c.vec)
    return g if g is not None and (g[5] > 1 or c.choices.per_channel is PerChannel.RING) else None


def _column_single_chunk(c: _Case):
    if not (c.fast_column and c.choices.allows(PerChannel.SINGLE_CHUNK)):
        return None
    return columns.single_chunk_geometry(c.rows, c.C // c.vec, c.vec)


def _column_rows(c: _Case):
    """The group kernel's geometry where one channel is one contiguous row of the (L, I)
    view (O == 1: the channel axis first)."""
    O, _L, I = c.oli()
    if not c.granularity("column") or O != 1 or (c.nd != 2 and c.sub_packed):
        return None
    return group_plan(I, I, 1, c.mode, c.nt, c.sub_packed)


# ----------------------------------------------------------------------------- the rules' builders
def _build_nvfp4_one_launch(c: _Case, gs):
    _, L, K, _, _ = c.fast_lastaxis
    NT, U, nblocks = gs
    k = lastaxis.make_lastaxis_group_kernel(c.kind, c.mode, c.fmt, c.mxc, c.maxe, L, K, NT, U, c.packed,
                                                   c.tune.SHFL, senc_grid=True, **c.sr)  # fmt: skip
    c.launch(k, nblocks, NT, X, c.n // c.vec // K, c.codes, c.scales, c.out.tscale, c.grid_workspace(), *c.keys)


def _build_nvfp4_amax_in_groups(c: _Case, fast):
    parts, nparts = c.tensor_amax_parts(block_threads(c.nt), True, c.tune.NVFP4_PARTS_MAX)
    _, L, K, NT, U = fast
    k = lastaxis.make_lastaxis_group_kernel(c.kind, c.mode, c.fmt, c.mxc, c.maxe, L, K, NT, U, c.packed,
                                                   c.tune.SHFL, senc_parts=True, **c.sr)  # fmt: skip
    nchunks = c.n // c.vec // K
    c.launch(k, cdiv(nchunks, NT * U), NT, X, nchunks, c.codes, c.scales, parts[0], nparts, c.out.tscale, *c.keys)


def _build_nvfp4_two_pass_units(c: _Case, fast):
    c.tensor_amax(block_threads(c.nt), True)
    c.units(fast)


def _build_stats_then(after):
    """Builder: the general statistics pass, finalize, then ``after(c)``."""

    def build(c: _Case, _):
        parts, nblocks = c.tensor_stats(c.mode)
        c.finalize(c.mode, parts, nblocks, 1, 1)
        after(c)

    return build


def _build_tensor_one_launch(c: _Case, gs):
    NT, U, nblocks = gs
    k = lastaxis.make_static_kernel(c.kind, c.fmt, NT, U, c.packed, False, c.maxe, c.tune.SHFL, **c.sr)
    c.launch(k, nblocks, NT, X, c.n // c.vec, c.C // c.vec, c.codes, c.scales, c.grid_workspace(), *c.keys)


def _build_tensor_resident(c: _Case, _):
    NT, UR, US, V = tensor_resident.resident_geometry()
    k = tensor_resident.make_tensor_resident_kernel(c.kind, c.fmt, c.maxe, NT, UR, US, V, c.packed)
    c.launch(k, c.sms, NT, X, c.n // c.vec, c.codes, c.scales, c.grid_workspace())


def _build_tensor_two_pass_units(c: _Case, fs):
    NT, U, _ = fs
    c.tensor_amax(NT, False)
    c.static(NT, U, False)


def _build_tile_blocks(c: _Case, _):
    from . import tiles

    R = c.shape[-2]
    B0, B1 = c.block[-2:]
    nR, nC = cdiv(R, B0), c.C // B1
    k = tiles.make_tile_kernel(c.kind, c.fmt, c.maxe, B0, B1, c.packed, c.tune.SHFL)
    NT = tiles.tile_geometry(c.kind, B0, B1)[2]
    c.launch(k, (c.n // (R * c.C)) * nR * nC, NT, X, R, c.C, nR, nC, c.codes, c.scales)


def _build_tile_general(c: _Case, _):
    R = c.shape[-2]
    B0, B1 = c.sch.block_shape
    ntiles = (c.n // (R * c.C)) * cdiv(R, B0) * cdiv(c.C, B1)
    k = general.make_tile_params_kernel(c.kind, c.mode, c.maxe, c.nt, B0, B1)
    c.launch(k, ntiles, c.nt, X, R, c.C, c.scales, c.zps)
    c.encode()


def _launch_tuple(c: _Case, kernel, grid, block, args):
    c.launch(kernel, grid, block, *args)


def _build_column_cluster(c: _Case, g):
    _launch_tuple(c, *column_cluster.cluster_launch(c.kind, c.fmt, c.maxe, c.packed, c.rows, c.C, g, X, c.scales,
                                                    c.codes))  # fmt: skip


def _build_column_ring(c: _Case, g):
    _launch_tuple(c, *column_ring.ring_launch(c.kind, c.fmt, c.maxe, c.packed, c.rows, c.C, c.sms, g, c.rec.empty, X,
                                              c.scales, c.codes))  # fmt: skip


def _build_column_single_chunk(c: _Case, g):
    _launch_tuple(c, *columns.single_chunk_launch(c.kind, c.fmt, c.maxe, c.packed, c.rows, c.C, g, c.rec.empty, X,
                                                  c.scales, c.codes))  # fmt: skip


def _build_column_two_pass(c: _Case, _):
    upr = c.C // c.vec
    NT, grid, rpc = columns.column_geometry(c.rows, upr, c.nt)
    parts = c.partials(grid[1] * c.C)
    c.launch(columns.make_column_amax_kernel(c.kind, NT), grid, NT, X, c.rows, upr, rpc, *parts)
    c.finalize(c.mode, parts, grid[1], c.C, 1)
    c.launch(columns.make_column_encode_kernel(c.kind, c.fmt, NT, c.packed), grid, NT, X, c.rows, upr, rpc, c.scales,
             c.codes)  # fmt: skip


def _build_column_rows(c: _Case, plan):
    _, L, I = c.oli()
    c.group(L, I, I, plan)


def _build_column_general(c: _Case, _):
    O, L, I = c.oli()
    J = L * I
    nchunks = max(1, min(O, cdiv(1 << 17, J)))
    oc = cdiv(O, nchunks)
    nchunks = cdiv(O, oc)
    parts = c.partials(nchunks * J)
    k = general.make_column_partials_kernel(c.kind, c.mode)
    c.launch(k, (cdiv(J, 128), nchunks), 128, X, O, J, oc, *parts)
    c.finalize(c.mode, parts, nchunks, L, I)
    c.encode()


def _build_strided(c: _Case, _):
    O, L, I = c.oli()
    G = c.block[c.ax]
    ngr = O * cdiv(L, G) * I
    k = general.make_strided_params_kernel(c.kind, c.mode, c.fmt, c.mxc, c.maxe)
    c.launch(k, cdiv(ngr, 128), 128, X, O, L, I, G, pow2ceil(G), c.scales, c.zps, c.means)
    c.encode()


class Rule(NamedTuple):
    """A row of the dispatch table: where ``when(case)`` gives a true value (a geometry, or
    True), ``build(case, value)`` records the plan's launches."""

    name: str
    when: Callable
    build: Callable


def _last(c: _Case) -> bool:
    return c.ax == c.nd - 1


# The dispatch, first match wins (the module docstring shows it as a table).
RULES = (
    Rule("static_units", lambda c: c.static_scale and c.fast_static, lambda c, fs: c.static(*fs)),
    Rule("nvfp4_given_scale_units", lambda c: c.static_scale and c.mode == MODE_NVFP4 and c.fast_lastaxis,
         lambda c, fast: c.units(fast)),
    Rule("nvfp4_given_scale", lambda c: c.static_scale and c.mode == MODE_NVFP4, lambda c, _: _then_amax(c, c.groups)),
    Rule("static", lambda c: c.static_scale, lambda c, _: _then_amax(c, c.encode)),
    Rule("nvfp4_one_launch", lambda c: c.mode == MODE_NVFP4 and _nvfp4_grid(c), _build_nvfp4_one_launch),
    Rule("nvfp4_amax_in_groups", lambda c: c.mode == MODE_NVFP4 and _nvfp4_amax_in_groups(c),
         _build_nvfp4_amax_in_groups),
    Rule("nvfp4_two_pass_units", lambda c: c.mode == MODE_NVFP4 and c.fast_lastaxis, _build_nvfp4_two_pass_units),
    Rule("nvfp4_general", lambda c: c.mode == MODE_NVFP4, _build_stats_then(_Case.groups)),
    Rule("tensor_one_launch", _tensor_grid, _build_tensor_one_launch),
    Rule("tensor_resident", _tensor_resident, _build_tensor_resident),
    Rule("tensor_two_pass_units", lambda c: c.granularity("tensor") and c.fast_static, _build_tensor_two_pass_units),
    Rule("tensor_general", lambda c: c.granularity("tensor"), _build_stats_then(_Case.encode)),
    Rule("tile_blocks", lambda c: c.granularity("block") and not c.stoch and fast_tile(c.shape, c.kind, c.sch, c.mode),
         _build_tile_blocks),
    Rule("tile_general", lambda c: c.granularity("block"), _build_tile_general),
    Rule("column_cluster", _column_cluster, _build_column_cluster),
    Rule("column_ring", _column_ring, _build_column_ring),
    Rule("column_single_chunk", _column_single_chunk, _build_column_single_chunk),
    Rule("column_two_pass", lambda c: c.fast_column, _build_column_two_pass),
    Rule("column_rows", _column_rows, _build_column_rows),
    Rule("column_general", lambda c: c.granularity("column"), _build_column_general),
    Rule("lastaxis_units", lambda c: _last(c) and c.fast_lastaxis, lambda c, fast: c.units(fast)),
    Rule("lastaxis_groups", lambda c: _last(c) and c.lastaxis_group_plan, lambda c, _: c.groups()),
    Rule("strided", lambda c: True, _build_strided),
)


def _then_amax(c: _Case, step):
    """``step()``, then the separate amax pass where the amax is asked."""
    step()
    if c.amax:
        c.amax_pass()


def build(shape, kind, sch, packed, stoch, nt, static_scale, choices, tune, sm_count, cheap, amax=False):
    """Record the plan of a quantize call: the first rule of RULES whose condition holds
    builds it. Returns (the rule's name, the recorder, the output slots). ``tune``: the
    plan's tunables; ``sm_count()`` / ``cheap(fmt)``: the device's SM count and whether
    a format's elements encode by the paired fp8 cvt (asked only where a rule needs them)."""
    c = _Case(shape, kind, sch, packed, stoch, nt, static_scale, choices, tune, sm_count, cheap, amax)
    for rule in RULES:
        value = rule.when(c)
        if value:
            rule.build(c, value)
            return rule.name, c.rec, c.out
    raise AssertionError("the last rule always applies")
