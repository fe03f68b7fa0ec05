"""Quantize / dequantize on the GPU: the launchers, with the signatures of
``nqdq.reference.quantize.quantize`` / ``dequantize`` (plus device-only options).

Which kernels run (see ``_quantize_kernels`` for each):

=====================================================  ======================================
scheme                                                 kernels
=====================================================  ======================================
C-contiguous, groups along the last axis, rows of      ``lastaxis_rows`` / ``lastaxis_groups``
whole 16-byte units: per-token rows, 1xG with G/VEC    (``_rowwise_kernels``: 16-byte loads,
a power of two <= 32 (MX, fp8_1x128, int4 group),      one read, shuffles; _fast_lastaxis)
float / MX scales; RNE, and stochastic rounding
with LASTAXIS_STOCH (every fast path of this table
but the tiles and per-channel scales)
NVFP4 under the same conditions                        ``tensor_amax`` -> ``lastaxis_groups``
                                                       (S_enc from the amax partials in each
                                                       block: NVFP4_SENC_IN_GROUPS, inputs
                                                       below NVFP4_SENC_MAX_UNITS); larger:
                                                       ``tensor_amax`` -> ``finalize`` ->
                                                       ``lastaxis_groups``
asymmetric integers under the same conditions;        ``lastaxis_asym_rows`` /
centred INT8 whole 2^k-unit groups                     ``lastaxis_stat_groups``
other last-axis groups / rows (partial groups;         ``group`` (one pass; groups of more
stochastic without LASTAXIS_STOCH)                     than SEG_MAX elements re-read L1/L2)
NVFP4 otherwise                                        ``tensor_partials`` -> ``finalize``
                                                       (S_enc) -> ``group``
NVFP4 with the tensor scale given (``scale=``)         ``lastaxis_groups``, else ``group``
                                                       (S_enc written by the plan with the
                                                       tensor scale, no kernel: one pass)
per-tensor dynamic float scales, whole units:         ``static_encode`` with the grid's amax
decode sizes (GRID_ONE_LAUNCH)                         (``_grid``, one launch)
... larger (TENSOR_RESIDENT, RNE, sm_80+)              ``tensor_resident`` (one cooperative
                                                       launch, part of the input on chip)
... otherwise                                          ``tensor_amax`` -> ``finalize`` ->
                                                       ``static_encode`` (16-byte loads)
per-tensor (dynamic) otherwise                         ``tensor_partials`` -> ``finalize`` ->
                                                       ``encode``
per-channel float scales, channel axis last, rows of   ``column_onepass`` (workspace zeroed by the plan)
whole units, a stripe's rows in at most                (_column_kernels: one read, each
64 chunks held on chip (COLUMN_ONEPASS)                block's chunk in registers across a
                                                       per-stripe wait; P = 1: only
                                                       ``column_onepass``)
per-channel float scales, whole units, otherwise       ``column_amax`` -> ``finalize`` ->
                                                       ``column_encode`` (two passes)
per-channel (``column``) otherwise                     ``column_partials`` -> ``finalize`` ->
                                                       ``encode`` (``group`` when the channel
                                                       axis is the first of a 2-D array)
float B0 x B1 blocks, whole-unit tiles                 ``tile_blocks`` (one pass, _tile_kernels)
block B0 x B1 otherwise                                ``tile_params`` -> ``encode``
group / row along another axis (and last-axis groups   ``strided_params`` -> ``encode``
whose packed bytes would straddle two blocks)
static float scales per tensor / last-axis row,        ``static_encode`` (16-byte loads)
whole units
static scales (``scale=``) otherwise                   ``encode``
=====================================================  ======================================

The paths marked with a switch in capitals are on; set to False, their cases take the
kernels of the row below them. LASTAXIS_STOCH (stochastic rounding on the 16-byte-unit
kernels: their ``stoch`` variants) is on too.

Every path writes codes already packed along the last axis (4-bit: two per byte, 6-bit:
four per three bytes), and scales in the linear layout ``scheme.scale_shape(shape)``.
No path transposes the input: other axes are handled by index arithmetic.
"""

from __future__ import annotations

import collections
import math
import os
import sys
import threading

import numpy as np

from ...reference import quantize as ref
from ...reference.packing import packed_length
from ...reference.quantize import QuantParts
from ...reference.scales import nvfp4_given_encode_scale
from ...schemes import Scheme
from ..runtime import devices as _devices
from . import grid as grid_sync
from . import general as quantize_kernels
from . import lastaxis as rowwise_kernels
from . import tensor_resident
from ..runtime import launch
from ..device.elements import format_tuple
from ..device.codec import KIND_BF16, KIND_F16, KIND_F32
from ..runtime.interop import Allocator, DeviceInput, cupy_array_new, device_address, device_input, is_cupy, lib_of
from ..runtime.launch import fast_kernel as _fast_kernel
from ..device.scales import MODE_ASYM, MODE_CENTRED, MODE_FLOAT, MODE_MX, MODE_NVFP4, MX_EVEN, MX_FLOOR, MX_RCEIL
from ..runtime.target import SIMULATOR

__all__ = ["quantize", "dequantize", "has_nonfinite", "to_bfloat16_bits", "get_plan", "QuantPlan", "THREADS"]

THREADS = 64 if SIMULATOR else 256  # threads per block (results never depend on it)
E_TARGET = 8  # elements each thread reduces in the group kernel
_MX_ROUNDING = {"floor": MX_FLOOR, "rceil": MX_RCEIL, "even": MX_EVEN}


def _pow2floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _pow2ceil(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _mode(sch: Scheme) -> int:
    if sch.is_mx:
        return MODE_MX
    if sch.is_nvfp4:
        return MODE_NVFP4
    if sch.centred:
        return MODE_CENTRED
    if not sch.symmetric:
        return MODE_ASYM
    return MODE_FLOAT


def _max_elem(sch: Scheme) -> float:
    elem = sch.element
    if elem.kind == "float":
        return float(elem.max_value)
    return float(elem.qrange(sch.symmetric)[1])


def _mx_cfg(sch: Scheme) -> tuple:
    if not sch.is_mx:
        return (0, 0, 0, 1.0)
    e = sch.element
    return (_MX_ROUNDING[sch.scale_rounding], e.mbits, e.emax, float(np.float32(1.0 / e.max_value)))


def _launch(kernel, grid, block, stream, *args):
    """Every launch goes through FastKernel: ``cuLaunchKernel`` with packed arguments on
    CuPy's current stream (``stream`` None) on a GPU, Numba's launch under the simulator."""
    _fast_kernel(kernel).launch(grid, block, args, stream)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _team_log2(work_per_row: int, nt: int) -> int:
    """log2 of the threads that share a row in the elementwise kernels: the power of two
    nearest above the row's work items, at most a block."""
    return min(max(work_per_row - 1, 0).bit_length(), nt.bit_length() - 1)


def view4(shape, block):
    """Merge the leading axes of ``shape`` into at most three, keeping the last axis:
    returns (dims, blocks) of a (d0, d1, d2, C) view whose scale groups are blocks."""
    merged = []
    for d, b in zip(shape[:-1], block[:-1]):
        if d == 1:
            continue
        if merged:
            D, B = merged[-1]
            if b == d:  # a fully reduced axis joins the previous one's groups
                merged[-1] = (D * d, B * d)
                continue
            if b == 1 and B == 1:
                merged[-1] = (D * d, 1)
                continue
        merged.append((d, b))
    if len(merged) > 3:
        raise NotImplementedError(f"scale groups {block} over shape {shape} do not fit a 4-D view")
    merged = [(1, 1)] * (3 - len(merged)) + merged
    dims = tuple(d for d, _ in merged) + (shape[-1],)
    blocks = tuple(b for _, b in merged) + (block[-1],)
    return dims, blocks


def _geo_args(shape, block):
    dims, blocks = view4(shape, block)
    n = tuple(_cdiv(d, b) for d, b in zip(dims, blocks))
    return (dims[1], dims[2], blocks[0], blocks[1], blocks[2], blocks[3], n[1], n[2], n[3])


class _Slot:
    """An array of a quantize plan: ``n`` items of ``dtype``; ``role`` is "out" (returned),
    "scratch" (written by one launch, read by a later one), "zero" (scratch that must be
    zero when the first launch starts: the column one-pass workspace), "reset" (the same,
    and the kernel leaves it zero when it ends: a ``_grid`` workspace, which the CuPy
    runner takes from ``_grid.StreamWorkspaces`` outside graph capture) or "dummy" (a
    placeholder for an output the scheme does not have: never written, never read)."""

    __slots__ = ("i", "n", "dtype", "role")

    def __init__(self, i, n, dtype, role):
        self.i, self.n, self.dtype, self.role = i, int(n), np.dtype(dtype), role


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"<{self.name}>"


_X = _Marker("x")  # the input array (flat)
_SEED_LO = _Marker("seed_lo")
_SEED_HI = _Marker("seed_hi")


class _Recorder:
    """Stands in for an :class:`Allocator` and the launcher while a plan is built: it
    records allocations (as slots) and launches (with slots and markers as arguments)."""

    def __init__(self):
        self.slots = []
        self.launches = []

    def empty(self, n, dtype, role="scratch"):
        s = _Slot(len(self.slots), n, dtype, role)
        self.slots.append(s)
        return s

    def launch(self, kernel, grid, block, *args):
        args = tuple(int(a) if isinstance(a, np.integer) else a for a in args)
        self.launches.append((kernel, grid, block, args))


class _Outputs:
    """Output slots of one quantize plan, and the dummies kernels need for the rest."""

    def __init__(self, rec: _Recorder, sch: Scheme, mode, shape, packed):
        n = math.prod(shape)
        C = shape[-1]
        self.rows = n // C
        sub = packed and sch.code_bits < 8
        self.pcols = packed_length(C, sch.code_bits) if sub else C
        self.sshape = sch.scale_shape(shape)
        ns = math.prod(self.sshape)
        self.codes = rec.empty(self.rows * self.pcols, np.uint8, "out")
        self.scales = rec.empty(ns, np.uint8 if mode in (MODE_MX, MODE_NVFP4) else np.float32, "out")
        self.zps = rec.empty(ns, np.uint8, "out") if mode == MODE_ASYM else None
        self.means = rec.empty(ns, np.float32, "out") if mode == MODE_CENTRED else None
        self.tscale = rec.empty(1, np.float32, "out") if mode == MODE_NVFP4 else None
        # S_enc: written by the NVFP4 finalize kernel, read by the group kernel; unused otherwise
        self.sparams = rec.empty(1, np.float32, "scratch" if mode == MODE_NVFP4 else "dummy")
        self._dummy_u8 = rec.empty(1, np.uint8, "dummy")
        self._dummy_f32 = rec.empty(1, np.float32, "dummy")

    def args(self):
        return (
            self.codes,
            self.scales,
            self.zps if self.zps is not None else self._dummy_u8,
            self.means if self.means is not None else self._dummy_f32,
        )


def fill_bytes(a, value):
    """Fill every byte of ``a`` (NumPy / CuPy / Numba) with ``value`` (test poisoning)."""
    if isinstance(a, np.ndarray):
        a.view(np.uint8)[...] = value
    elif is_cupy(a):
        a.view("uint8").fill(value)
    else:
        a.view(np.uint8).copy_to_device(np.full(a.nbytes, value, np.uint8))


def _split_seed(seed):
    if seed is None:
        return 0, 0
    s = int(seed) & 0xFFFFFFFFFFFFFFFF
    return s & 0xFFFFFFFF, s >> 32


def _group_plan(G_true, cols, ngroups, mode, nt, sub_packed):
    """Geometry of the group kernel, or None when it cannot keep packed bytes in one block."""
    G = G_true if ngroups > 1 else min(G_true, cols)
    P = _pow2ceil(G_true if mode == MODE_CENTRED else G)
    if G <= quantize_kernels.SEG_MAX:
        gpb = _pow2floor(min(quantize_kernels.SEG_MAX // G, max(1, (nt * E_TARGET) // P), nt))
        team = nt // gpb
        if team > P:
            team = P
            gpb = nt // team
        stash = True
    else:
        gpb, team, stash = 1, nt, False
    if ngroups > 1 and sub_packed and (gpb * G) % 4:
        return None
    return dict(G=G, P=P, gpb=gpb, team=team, stash=stash)


class QuantPlan:
    """Everything one ``quantize`` call of a given (shape, input kind, scheme, packing,
    rounding, block size) does, decided once: the arrays it allocates (slots), the
    launches (kernels, grids, blocks, arguments), and where the results are. Executed by
    :meth:`execute` (any array library, Numba fallback included) or, for CuPy input on a
    real GPU, by the generated :meth:`cupy_runner` (raw addresses, one allocation)."""

    def __init__(self, shape, rec: _Recorder, out: _Outputs, sch: Scheme, packed: bool, static_scale: bool):
        self.shape = shape
        self.slots = rec.slots
        self.launches = rec.launches
        self.static_scale = static_scale
        self.cshape = tuple(shape[:-1]) + (out.pcols,)
        self.codes_int8 = sch.element.kind == "int" and sch.symmetric and not (packed and sch.code_bits < 8)
        self.sshape = out.sshape
        self.codes, self.scales, self.zps, self.tscale, self.means = (
            out.codes, out.scales, out.zps, out.tscale, out.means
        )
        self.sparams = out.sparams  # NVFP4's S_enc (with a given tensor scale: written by execute)
        self._runner = None
        self._runner_built = False
        self._lock = threading.Lock()
        # its cooperative / cluster launches (launch.LaunchRefused: the plan built again without them)
        self.ex_kinds = {launch.ex_kind(k) for k, _g, _b, _a in self.launches} - {None}
        self._build_args = None
        self._fallback = None

    def fallback(self) -> "QuantPlan":
        """The plan of the same call built again now, after the driver refused one of this
        plan's cooperative or cluster launches (``launch.refuse`` has ruled that kind out, so
        the planner takes its other kernels: the same results). Cached; the plan cache is
        cleared so later calls plan afresh."""
        if self._fallback is None:
            with _PLANS_LOCK:
                _PLANS.clear()
            self._fallback = _build_plan(*self._build_args)
        return self._fallback

    # -- any library: slots become arrays of the allocator's library, FastKernel launches
    def execute(self, xarr, alloc: Allocator, seed=None, scale_host=None, out_fill=None) -> QuantParts:
        if self.ex_kinds & launch._REFUSED:
            return self.fallback().execute(xarr, alloc, seed, scale_host, out_fill)
        try:
            return self._execute(xarr, alloc, seed, scale_host, out_fill)
        except launch.LaunchRefused as e:  # the fallback runs the whole call again, on arrays of its own
            launch.refuse(e.kind)
            return self.fallback().execute(xarr, alloc, seed, scale_host, out_fill)

    def _execute(self, xarr, alloc, seed, scale_host, out_fill):
        arrays = [alloc.empty(s.n, s.dtype) for s in self.slots]
        for s in self.slots:
            if s.role in ("zero", "reset"):
                fill_bytes(arrays[s.i], 0)
        if out_fill is not None:
            for s in (self.codes, self.scales, self.zps, self.means, self.tscale):
                if s is not None:
                    fill_bytes(arrays[s.i], out_fill)
        if self.static_scale and self.tscale is not None:  # NVFP4: [S_dec, S_enc] (quantize)
            _copy_into(arrays[self.tscale.i], scale_host[:1])
            _copy_into(arrays[self.sparams.i], scale_host[1:])
        elif self.static_scale:
            _copy_into(arrays[self.scales.i], scale_host)
        lo, hi = _split_seed(seed)
        A = alloc.kernel_arg
        xa = A(xarr)
        for kernel, grid, block, args in self.launches:
            real = tuple(
                A(arrays[a.i]) if type(a) is _Slot else xa if a is _X else lo if a is _SEED_LO else hi if a is _SEED_HI else a
                for a in args
            )
            _launch(kernel, grid, block, None, *real)
        codes = alloc.to_lib(arrays[self.codes.i], self.cshape)
        if self.codes_int8:
            codes = codes.view(np.int8) if isinstance(codes, np.ndarray) else codes.view("int8")

        def res(s, shape):
            return None if s is None else alloc.to_lib(arrays[s.i], shape)

        return QuantParts(
            codes=codes,
            scales=res(self.scales, self.sshape),
            zero_points=res(self.zps, self.sshape),
            tensor_scale=res(self.tscale, ()),
            means=res(self.means, self.sshape),
        )

    # -- CuPy on a GPU: one generated function
    def cupy_runner(self):
        """``run(x) -> (codes, scales, zero_points, tensor_scale, means)`` for a C-contiguous
        CuPy ``x`` of this plan's shape and kind, on CuPy's current stream: one
        ``cupy.cuda.alloc`` for every output and scratch array (the outputs are arrays over
        it, so scratch lives as long as they do: safe under CUDA-graph capture), the dummies
        in a buffer the plan owns, then per kernel its addresses stored into a parameter
        buffer packed once and one ``cuLaunchKernel`` (``launch.compile_sequence``); the
        output arrays built by ``_interop.cupy_array_new``'s path where it applies. None
        where it cannot be built (simulator, NQDQ_FAST_LAUNCH=0, static scales, no CuPy)."""
        if self._runner_built:
            return self._runner
        with self._lock:
            if not self._runner_built:  # (an error, e.g. under an invalidated graph capture: built again next call)
                run = self._build_cupy_runner()
                self._runner = run if run is None or not self.ex_kinds else self._refusal_guard(run)
                self._runner_built = True
        return self._runner

    def _refusal_guard(self, run):
        """``run`` (a runner of this plan's cooperative or cluster launches) until the driver
        refuses such a launch; from then on (a refused launch runs nothing) the fallback
        plan's runner, for this call and every later one (the calls that remembered this
        runner keep it: it forwards). Inside a CUDA-graph capture the refusal invalidates the
        capture (the driver's cudaErrorStreamCaptureInvalidated reaches the caller, the
        warning says why); a capture after it records the fallback's launches."""
        state = [run]

        def guarded(x, lo=0, hi=0):
            f = state[0]
            if f is run:
                if not launch._REFUSED or not self.ex_kinds & launch._REFUSED:
                    try:
                        return run(x, lo, hi)
                    except launch.LaunchRefused as e:
                        launch.refuse(e.kind)
                f = self.fallback().cupy_runner()  # (an error here: tried again next call)
                if f is None:  # (built under the same conditions as this plan's: not expected)
                    raise RuntimeError(f"no runner for the fallback of the plan of {self.shape}")
                state[0] = f
            return f(x, lo, hi)

        guarded.__dict__.update(run.__dict__)  # (source, plan, fast_arrays)
        guarded.inner = run
        return guarded

    def _build_cupy_runner(self):
        if SIMULATOR or self.static_scale:
            return None
        cp = sys.modules.get("cupy")
        if cp is None or not launch._fast_path_allowed():
            return None
        align = 256
        offsets, total = {}, 0
        dummy_off, dummy_total = {}, 0
        reset = [s for s in self.slots if s.role == "reset"]  # direct calls: the stream's workspace
        if len(reset) > 1 or any(s.n > grid_sync.SYNC_WORDS or s.dtype != np.int32 for s in reset):
            return None  # (no plan has more than one grid_max workspace)
        for s in self.slots:
            nb = max(s.n * s.dtype.itemsize, 1)
            if s.role == "dummy":
                dummy_off[s.i] = dummy_total
                dummy_total += -(-nb // align) * align
            else:
                offsets[s.i] = total
                total += -(-nb // align) * align
        dummies = cp.zeros(max(dummy_total, align), np.uint8) if dummy_total else None

        def ptr(a):
            if type(a) is _Slot:
                if a.role == "dummy":
                    return launch.Ptr("dummy", dummy_off[a.i], a.n, a.dtype)
                if reset and a is reset[0]:  # the stream's workspace
                    return launch.Ptr("ws", 0, a.n, a.dtype)
                return launch.Ptr("base", offsets[a.i], a.n, a.dtype)
            return self._marker_arg(a)

        launches = [(k, g, b, tuple(map(ptr, args))) for k, g, b, args in self.launches]
        seq = launch.compile_sequence(launches, ("xp", "base", "dummy", "lo", "hi", "ws"))
        if seq is None:
            return None
        # the output arrays: ndarray's own __new__ + _init where that builds the same array
        # as cupy.ndarray(shape, dtype, memptr) (about half its host time; _interop)
        new = cupy_array_new(cp, dummies.data if dummies is not None else cp.cuda.alloc(align))
        ns = {
            "_seq": seq, "_alloc": cp.cuda.alloc, "_nd": cp.ndarray, "_new": new,
            "_cur": cp.cuda.get_current_stream, "_dummies": dummies,
            "_DP": int(dummies.data.ptr) if dummies is not None else 0,
        }  # fmt: skip
        zero = [s for s in self.slots if s.role == "zero"]  # zeroed in the call's stream, before the launches
        lines = ["def run(x, lo=0, hi=0):", f"    mp = _alloc({max(total, 1)})"]
        # the current stream of the plan's GPU, named so that CuPy need not ask for the current
        # device again (the caller runs the plan with its GPU current: get_plan)
        ns["_DEV"] = _devices.current()
        lines += ["    cs = _cur(_DEV)", "    st = cs.ptr"] if reset else ["    st = _cur(_DEV).ptr"]
        lines += [f"    _memset(mp.ptr + {offsets[s.i]}, 0, {s.n * s.dtype.itemsize}, st)" for s in zero]
        if reset:  # the stream's own grid_max workspace; in a graph, the call's own (a memset node)
            r = reset[0]
            lines += [
                "    if _capturing(st):",
                f"        ws = mp.ptr + {offsets[r.i]}",
                f"        _memset(ws, 0, {r.n * r.dtype.itemsize}, st)",
                "    else:",
                "        ws = _ws(cs, _DEV)",
            ]
            ns["_capturing"] = capture_test(cp)
            ns["_ws"] = _stream_workspaces(cp).get
        lines.append(f"    _seq(st, x.data.ptr, mp.ptr, _DP, lo, hi, {'ws' if reset else 0})")
        ns["_memset"] = cp.cuda.runtime.memsetAsync
        results = []
        for name, s, shape, dt in (
            ("codes", self.codes, self.cshape, np.int8 if self.codes_int8 else np.uint8),
            ("scales", self.scales, self.sshape, None),
            ("zps", self.zps, self.sshape, None),
            ("ts", self.tscale, (), None),
            ("means", self.means, self.sshape, None),
        ):
            if s is None:
                results.append("None")
                continue
            ns[f"_S_{name}"] = tuple(shape)
            ns[f"_D_{name}"] = np.dtype(dt if dt is not None else s.dtype)
            off = offsets[s.i]
            memptr = "mp" if off == 0 else f"mp + {off}"
            if new is not None:
                lines += [f"    {name} = _new(_nd)", f"    {name}._init(_S_{name}, _D_{name}, {memptr})"]
            else:
                lines.append(f"    {name} = _nd(_S_{name}, _D_{name}, {memptr})")
            results.append(name)
        lines.append(f"    return {', '.join(results)}")
        src = "\n".join(lines) + "\n"
        exec(compile(src, f"<nqdq quantize plan {self.shape}>", "exec"), ns)
        run = ns["run"]
        run.source = src
        run.plan = self
        run.fast_arrays = new is not None
        return run


    def _marker_arg(self, a):
        """A recorded launch argument as a compiled sequence's (launch.Ptr / Var) where it is
        a marker (the input, the seed's halves), else as it is."""
        if a is _X:
            return launch.Ptr("xp", 0, math.prod(self.shape), self._xdtype)
        if a is _SEED_LO:
            return launch.Var("lo")
        if a is _SEED_HI:
            return launch.Var("hi")
        return a

    # -- PyTorch on a GPU: the same launches, the arrays PyTorch's
    def torch_runner(self, caller):
        """``run(x) -> (codes, scales, zero_points, tensor_scale, means)`` for a contiguous
        PyTorch tensor ``x`` of this plan's shape and kind on the plan's GPU: each output and
        scratch array a ``torch.empty`` on PyTorch's current stream (its caching allocator
        orders reuse by stream and keeps a graph capture's allocations in the graph's pool),
        the workspaces that must start zero ``torch.zeros`` (a memset node under capture), the
        launches a compiled sequence on that stream. None where it cannot be built (as
        :meth:`cupy_runner`, and plans with cooperative or cluster launches, whose refusal
        fallback the CuPy runner alone carries)."""
        with self._lock:
            if not hasattr(self, "_torch_run"):
                self._torch_run = self._build_torch_runner(caller)
        return self._torch_run

    def _build_torch_runner(self, caller):
        if SIMULATOR or self.static_scale or self.ex_kinds:
            return None
        if not launch._fast_path_allowed():
            return None
        torch = caller.torch
        dev_index = _devices.current()
        device = torch.device("cuda", dev_index)
        shapes = {
            self.codes.i: (self.cshape, np.int8 if self.codes_int8 else np.uint8),
            self.scales.i: (self.sshape, self.scales.dtype),
        }
        for s, shape in ((self.zps, self.sshape), (self.tscale, ()), (self.means, self.sshape)):
            if s is not None:
                shapes[s.i] = (shape, s.dtype)
        outs = [s for s in self.slots if s.i in shapes]  # each its own tensor, returned
        reset = [s for s in self.slots if s.role == "reset"]
        if len(reset) > 1 or any(s.n > grid_sync.SYNC_WORDS or s.dtype != np.int32 for s in reset):
            return None
        offsets, totals = {}, {"scratch": 0, "zero": 0, "dummy": 0}
        for s in self.slots:  # scratch, zeroed scratch and dummies: one buffer each, 256-byte aligned parts
            if s.i in shapes or s.role == "reset":
                continue
            pool = {"scratch": "scratch", "zero": "zero", "dummy": "dummy"}[s.role]
            offsets[s.i] = (pool, totals[pool])
            totals[pool] += -(-max(s.n * s.dtype.itemsize, 1) // 256) * 256
        dummies = torch.zeros(max(totals["dummy"], 256), dtype=torch.uint8, device=device)
        names = {s.i: f"out{k}" for k, s in enumerate(outs)}

        def ptr(a):
            if type(a) is _Slot:
                if a.i in names:
                    return launch.Ptr(names[a.i], 0, a.n, a.dtype)
                if a.role == "reset":
                    return launch.Ptr("ws", 0, a.n, a.dtype)
                pool, off = offsets[a.i]
                return launch.Ptr(pool, off, a.n, a.dtype)
            return self._marker_arg(a)

        launches = [(k, g, b, tuple(map(ptr, args))) for k, g, b, args in self.launches]
        seq = launch.compile_sequence(launches, ("xp", *names.values(), "scratch", "zero", "dummy", "ws", "lo", "hi"))
        if seq is None:
            return None
        make = tuple((shapes[s.i][0], caller.dtypes[np.dtype(shapes[s.i][1])]) for s in outs)
        where = {s.i: k for k, s in enumerate(outs)}
        picks = tuple(None if s is None else where[s.i] for s in (self.codes, self.scales, self.zps, self.tscale, self.means))
        stream_of, DP, empty, zeros, u8 = caller.stream, dummies.data_ptr(), torch.empty, torch.zeros, torch.uint8
        n_scratch, n_zero = totals["scratch"], totals["zero"]
        workspaces = _TorchWorkspaces(torch, device, dev_index) if reset else None

        def run(x):
            st = stream_of(dev_index)
            arrays = [empty(shape, dtype=dt, device=device) for shape, dt in make]
            scratch = empty(n_scratch, dtype=u8, device=device) if n_scratch else None
            zero = zeros(n_zero, dtype=u8, device=device) if n_zero else None
            ws = workspaces.get(st) if workspaces is not None else None
            seq(st, x.data_ptr(), *[a.data_ptr() for a in arrays], 0 if scratch is None else scratch.data_ptr(),
                0 if zero is None else zero.data_ptr(), DP, 0 if ws is None else ws.data_ptr(), 0, 0)  # fmt: skip
            return tuple(None if k is None else arrays[k] for k in picks)

        run.plan = self
        run.dummies = dummies
        return run


class _TorchWorkspaces:
    """The torch runners' ``grid_max`` workspace (``_grid``): one zeroed tensor per stream of
    a direct call, as ``_grid.StreamWorkspaces`` keeps for CuPy (the kernels leave it zero,
    and kernels of one stream run one after another); under graph capture the call's own,
    zeroed by a memset node of the graph. Streams are told apart as there
    (``_grid.workspace_key``). A stream handle that the caller destroys and PyTorch reuses
    for a new stream keeps the workspace, which is then still zero."""

    def __init__(self, torch, device, dev_index, limit=64):
        self._zeros, self._device, self._dev, self._i32 = torch.zeros, device, dev_index, torch.int32
        self._capturing = torch.cuda.is_current_stream_capturing
        self._by_stream = {}
        self._limit = limit

    def get(self, stream):
        if self._capturing():
            return self._zeros(grid_sync.SYNC_WORDS, dtype=self._i32, device=self._device)
        key = grid_sync.workspace_key(stream, self._dev)
        ws = self._by_stream.get(key)
        if ws is None:
            ws = self._zeros(grid_sync.SYNC_WORDS, dtype=self._i32, device=self._device)
            while len(self._by_stream) >= self._limit:
                self._by_stream.pop(next(iter(self._by_stream)), None)
            self._by_stream[key] = ws
        return ws


_STREAM_WS = None
_STREAM_WS_LOCK = threading.Lock()


def capture_test(cp):
    """``capturing(stream_handle) -> bool`` for a plan's runner: whether the stream is capturing
    a CUDA graph (cudaStreamIsCapturing); an error (the legacy stream queried while another
    stream captures) counts as capturing, the graph-safe answer."""
    is_capturing = cp.cuda.runtime.streamIsCapturing

    def capturing(st):
        try:
            return is_capturing(st) != 0
        except Exception:
            return True

    return capturing


def _stream_workspaces(cp):
    """The process's :class:`_grid.StreamWorkspaces` (one per process: a stream's kernels
    share one workspace whatever plan launched them)."""
    global _STREAM_WS
    with _STREAM_WS_LOCK:
        if _STREAM_WS is None:
            _STREAM_WS = grid_sync.StreamWorkspaces(cp)
    return _STREAM_WS


_PLANS: collections.OrderedDict = collections.OrderedDict()
_PLANS_MAX = 256
_PLANS_LOCK = threading.Lock()


def get_plan(shape, kind, sch: Scheme, *, packed=True, stoch=False, threads=None, static_scale=False) -> QuantPlan:
    """The (LRU-cached) :class:`QuantPlan` of a quantize call on the current GPU (a plan's
    grids follow its SM count, its runner holds its arrays and kernel handles: _devices)."""
    nt = threads or THREADS
    key = (tuple(shape), kind, sch, bool(packed), bool(stoch), nt, bool(static_scale), _devices.current())
    plan = _PLANS.get(key)
    if plan is not None:
        try:
            _PLANS.move_to_end(key)
        except KeyError:
            pass
        return plan
    plan = _build_plan(tuple(shape), kind, sch, bool(packed), bool(stoch), nt, bool(static_scale))
    with _PLANS_LOCK:
        _PLANS[key] = plan
        while len(_PLANS) > _PLANS_MAX:
            _PLANS.popitem(last=False)
    return plan


_XDTYPES = {KIND_F32: np.dtype(np.float32), KIND_BF16: np.dtype(np.uint16), KIND_F16: np.dtype(np.uint16)}


def quantize(x, scheme: Scheme, *, scale=None, seed=None, packed=True, dtype=None, threads=None, out_fill=None):
    """``nqdq.reference.quantize.quantize`` on the device.

    ``x``: a device array (CuPy, ``__cuda_array_interface__``, CUDA DLPack) of float32 /
    float16 / bfloat16 -- or uint16 bits with ``dtype="bfloat16"``/``"float16"`` -- or a
    NumPy array (run in the simulator under NUMBA_ENABLE_CUDASIM=1, else copied to the GPU
    and back). Returns a :class:`QuantParts` in the input's library whose codes are packed
    along the last axis when ``packed`` (one per byte, as the reference's, otherwise).
    ``threads`` overrides the block size; ``out_fill`` fills every output byte first (tests).
    The planning is cached (:func:`get_plan`); CuPy input on a GPU runs the plan's
    generated launcher (:meth:`QuantPlan.cupy_runner`).
    """
    xin = x if isinstance(x, DeviceInput) else device_input(x, "x", dtype)
    shape = tuple(xin.shape)
    if len(shape) == 0:
        raise ValueError("x must have at least one dimension, got a 0-d array")
    alloc = Allocator(xin.lib)
    if math.prod(shape) == 0:
        return _empty_parts(alloc, scheme, shape, packed)
    plan = get_plan(shape, xin.kind, scheme, packed=packed, stoch=seed is not None, threads=threads,
                    static_scale=scale is not None)  # fmt: skip
    scale_host = None
    if scale is not None and scheme.is_nvfp4:  # the tensor scale S_dec given, and S_enc from it
        s_dec = np.asarray(_host(scale), np.float32).reshape(())
        scale_host = np.array([s_dec, nvfp4_given_encode_scale(s_dec)], np.float32)
    elif scale is not None:
        scale_host = np.ascontiguousarray(
            np.broadcast_to(np.asarray(_host(scale), np.float32), plan.sshape)
        ).reshape(-1)
    if out_fill is None and xin.lib == "cupy" and is_cupy(xin.arr):
        run = plan.cupy_runner()
        if run is not None:
            lo, hi = _split_seed(seed)
            c, s, z, t, m = run(xin.arr, lo, hi)
            return QuantParts(codes=c, scales=s, zero_points=z, tensor_scale=t, means=m)
    return plan.execute(xin.arr, alloc, seed=seed, scale_host=scale_host, out_fill=out_fill)


ROW_UNITS_MAX = 8  # 16-byte units a thread of the row kernel holds in registers
GROUP_UNITS = 4  # 16-byte units a thread of the group kernel loads before using any (deep)
CHEAP_UNITS = 1  # units per chunk where the encode is the paired fp8 cvt (K > 1: interleaved over the group's lanes)
# deep rows: units per thread the row kernel aims at, and NT any multiple of 32 (else a power
# of two). H100, bf16 fp8_row, us: 8192x8192 U = 8 (NT 128) 72.06, 5 exact (NT 224) 71.14, 4 exact
# (NT 256) 70.72; 16384x7168 U = 7 (NT 128) 120.26, 5 exact (NT 192) 119.68, 4 exact (NT 224)
# 123.74 (Triton peer 70.27 / 118.62; docs/design/last-axis.md)
ROW_UNITS_DEEP = 5
ROW_NT_EXACT = True
DEEP_ROWS = 528  # rows from which the row kernel uses deep threads (4 blocks per H100 SM)
DEEP_UNITS = 4 * 256 * 264  # units from which the group kernel uses GROUP_UNITS per thread
SHFL = rowwise_kernels.SHFL_DEFAULT  # tests set False to run the shuffle's shared-memory twin on a GPU
# A path written after the last GPU run (checked bit for bit in the simulator, compiled for
# sm_90, never yet run on a GPU) lands behind a switch set to _UNMEASURED: off for users,
# on with NQDQ_UNMEASURED_KERNELS=1 (tests/conftest.py sets it, so CI and the next GPU
# run test it). False sends its cases to the general kernels, so a GPU run can A/B them
# (clear _PLANS after a change). (The asymmetric / centred last-axis kernels, static_encode
# and tile_blocks beat the general kernels 1.9-4.5x on an H100: docs/design/last-axis.md.)
_UNMEASURED = os.environ.get("NQDQ_UNMEASURED_KERNELS", "0") == "1"
# units per chunk of the centred groups: 4 (the sum's unit levels in the thread; H100, bf16
# 8192x8192 / 16384x7168: 86 / 87 % of copy with 2, 92 / 93 % with 4)
CENTRED_UNITS = 4
# Stochastic rounding on the 16-byte-unit kernels (each factory's ``stoch`` variant: the same
# loads, statistics, scales and stores, every element by encode_element with its Philox bits,
# _rowwise_kernels.sr_store_unit): the last-axis rows and groups (float, MX, NVFP4, asymmetric,
# centred), static_encode (static and dynamic per-tensor / static per-row scales). Tiles and
# per-channel scales keep the general kernels. On since its H100 run (71 GPU tests passed; bf16
# 8192x8192 1.5-4x the general kernels, e.g. int8_row 353 -> 158 us, mxfp4 609 -> 306 us, still
# compute-bound: docs/design/stochastic-rounding.md).
# False: every stochastic case on the general kernels (A/B; clear _PLANS after a change).
LASTAXIS_STOCH = True
# NVFP4 on the last-axis group kernel in two launches (tensor_amax -> lastaxis_groups, which
# computes S_enc from the amax partials: _rowwise_kernels._SENC_FROM_PARTS) instead of three
# (tensor_amax -> finalize -> lastaxis_groups), for inputs of fewer than NVFP4_SENC_MAX_UNITS
# 16-byte units. H100: 64x7168 bf16 host 14.5 -> 11.5 us per call, device 11.0 -> 7.7 us;
# 128 / 256 / 512 / 2048 x 7168 11.9 -> 7.9, 14.5 -> 10.5, 17.7 -> 13.0, 38.5 -> 34.9 us; but
# 8192x8192 and 16384x7168 49 / 51 -> 46 / 47 % of copy (every one of their 8192-14336 blocks
# waits for its partials and a barrier before encoding): those keep the three launches. The
# bound, 2^21 units (16.8M bf16 elements), lies between 2048x7168 (1.8M units, faster) and
# 8192x8192 (8.4M, slower); the crossover itself is not measured.
NVFP4_SENC_IN_GROUPS = True
NVFP4_SENC_MAX_UNITS = 1 << 21
NVFP4_PARTS_MAX = 1024  # amax blocks (partials that every group-kernel block reduces) at most
# dynamic fp8_tensor-style scales and NVFP4 at decode sizes: one launch whose blocks share
# the tensor amax through _grid.wait_done (at most one block per SM, GRID_MAX_U units or chunks
# per thread), instead of an amax kernel before the encode (docs/design/per-tensor-dynamic.md)
GRID_ONE_LAUNCH = True  # H100: 40 GPU tests passed; 64x7168 host 14.16 -> 8.92 us (fp8_tensor), 11.46 -> 9.51 (nvfp4)
GRID_MAX_U = 4
# ... launched plainly: their blocks wait on work items, not on each other (_grid.wait_done),
# so no residency (concurrent calls on other streams, other grids holding the SMs, an MPS
# thread limit) can leave a grid waiting for ever. (A cooperative launch, NQDQ_GRID_COOPERATIVE,
# gave that safety for 0.7-1.3 us of host time a call and was removed:
# docs/design/per-tensor-dynamic.md.)
# The one-launch kernels leave their workspace zero (_grid.grid_max_read), so the CuPy runner's
# direct calls take their stream's workspace (_grid.StreamWorkspaces) instead of zeroing one
# with a memset per call (1.2 us a call less: docs/design/launch-path.md); under graph capture it
# keeps the memset (a graph node).
# ... and above that size, one cooperative launch that holds part of the input in registers and
# shared memory across the grid's amax and re-reads the rest last-read first, from L2 where it
# still is (_tensor_resident). NQDQ_TENSOR_RESIDENT=0: the amax pass, then the encode pass (A/B).
TENSOR_RESIDENT = os.environ.get("NQDQ_TENSOR_RESIDENT", "1") == "1"
# (NVFP4 stays on the streaming kernels: in the cooperative kernel it measured no faster, the
# block encode bounds it; docs/design/per-tensor-dynamic.md, "Why NVFP4 stays on two passes".)
# float per-channel scales, channel axis last, rows of whole units: column_amax -> finalize ->
# column_encode (GPU-checked, H100) ...
# ... in one pass where the geometry fits (_column_kernels.onepass_launches): column_onepass
# (its workspace a "zero" slot), every block's chunk held in registers across a per-stripe wait. False: the
# two passes above (A/B). COLUMN_ONEPASS_P_MAX: chunks per stripe at most (None: the module's
# ONEPASS_P_MAX; always at most the SM count). COLUMN_ONEPASS_SYNC (tests): the workspace and
# the wait even where P = 1. H100: GPU tests and compute-sanitizer clean, bit-exact; bf16 int8_column
# 8192x8192 / 16384x7168 51 / 53 % of copy (two passes 42 / 46 %), 64x7168 6.2 us (20.4,
# host-bound), 65536x1024 43 % (42 %): on.
COLUMN_ONEPASS = True
COLUMN_ONEPASS_P_MAX = None
# ... through a shared-memory ring where its geometry fits and the stripes take more than one
# chunk (_column_ring: cp.async loads of a block's next items in flight while it waits and
# encodes). H100: GPU tests and compute-sanitizer clean; bf16 int8_column 8192x8192 /
# 16384x7168 71 / 73 % of copy (register kernels 55 / 54 %); 74 / 76 % after later
# instruction cuts (_column_ring's docstring).
# NQDQ_COLUMN_RING=0: the register kernels (A/B).
COLUMN_RING = os.environ.get("NQDQ_COLUMN_RING", "1") == "1"
# ... and ahead of both, by thread-block clusters where its geometry fits (_column_cluster:
# a stripe down every row is one cluster of 16 blocks on 132-SM GPUs, else 8, its amax
# combined through the cluster's shared memory; sm_90+). H100, step by step: first GPU tests
# and compute-sanitizer clean, bit-exact; bf16 int8_column 8192x8192 84 % of copy (ring 75 %),
# 4096x7168 74 % (66 %); 16384x7168 then kept the ring (76 %: a cluster's share of its rows
# would have been 64-byte pieces, 71 %). The amax words pushed by st.async: 85 %. Part of
# each thread's units in registers (_column_cluster.GPU_CONFIGS): 8192x8192 89 %, 16384x7168
# 83 % (taken from the ring), whole tensors bit-exact; its 15 GPU tests compute-sanitizer
# clean. Its loads with the .L2::256B prefetch size: 90 / 86 % (docs/design/per-channel.md).
# NQDQ_COLUMN_CLUSTER=0: the ring (A/B).
COLUMN_CLUSTER = os.environ.get("NQDQ_COLUMN_CLUSTER", "1") == "1"
COLUMN_ONEPASS_SYNC = False


def _sm_count() -> int:
    """Blocks a kernel whose blocks wait for each other (the one-pass column kernel, the
    ``_grid`` one-launch kernels) may count on being resident: one per SM of the current
    device (1 under the simulator, which runs blocks one after another; dry runs set
    SIMULATOR)."""
    if SIMULATOR:
        return 1
    from ..runtime.backend import cuda

    return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)


def _fast_tile(shape, kind, sch, mode):
    """True where ``tile_blocks`` applies: float scales over B0 x B1 tiles of the last two
    axes, rows of whole tiles (C % B1 == 0) of whole 16-byte units (B1 % VEC == 0)."""
    if mode != MODE_FLOAT or len(shape) < 2:
        return False
    B0, B1 = sch.block_for(shape)[-2:]
    vec = rowwise_kernels.vec_of(kind)
    return B1 % vec == 0 and shape[-1] % B1 == 0 and B0 * (B1 // vec) <= 1024 * 8


def _fast_column(shape, kind, mode, ax, stoch):
    """Float per-channel scales along the last axis of a C-contiguous input whose rows are
    whole 16-byte units: ``_column_kernels`` (one pass where _onepass_column, else two
    streaming passes)."""
    return mode == MODE_FLOAT and not stoch and ax == len(shape) - 1 and shape[-1] % rowwise_kernels.vec_of(kind) == 0


def _onepass_column(rows, C, kind, fmt, maxe, packed, rec, out, nt):
    """The one-pass launches (``_column_kernels.onepass_launches``) of a _fast_column case
    where COLUMN_ONEPASS is on and its geometry fits, else None (the two passes)."""
    if not COLUMN_ONEPASS:
        return None
    from . import columns as column_kernels

    if COLUMN_CLUSTER:
        from . import column_cluster

        if column_cluster.available():
            cl = column_cluster.cluster_launch(kind, fmt, maxe, packed, rows, C, _sm_count(), _X, out.scales, out.codes)
            if cl is not None:
                return [cl]
    from . import column_ring

    if COLUMN_RING and column_ring.available():
        ring = column_ring.ring_launch(kind, fmt, maxe, packed, rows, C, _sm_count(), rec.empty, _X, out.scales,
                                       out.codes,
                              allow_p1=COLUMN_ONEPASS_SYNC)  # fmt: skip
        if ring is not None:
            return [ring]

    return column_kernels.onepass_launches(kind, fmt, maxe, packed, rows, C, _sm_count(), COLUMN_ONEPASS_P_MAX,
                                           COLUMN_ONEPASS_SYNC,
                               rec.empty, _X, out.scales, out.codes, nt)  # fmt: skip


def _fast_static(shape, kind, sch, mode, nt):
    """(NT, U, per_row) of ``static_encode`` for caller-given float scales of one tensor
    scale or one scale per last-axis row, a C-contiguous input of whole 16-byte units
    (rows of whole units when per row); None otherwise (the general ``encode``)."""
    if mode != MODE_FLOAT:
        return None
    nd = len(shape)
    per_row = sch.granularity == "row"
    if per_row and sch.axis % nd != nd - 1:
        return None
    if sch.granularity not in ("tensor", "row"):
        return None
    vec = rowwise_kernels.vec_of(kind)
    n = math.prod(shape)
    if (shape[-1] if per_row else n) % vec:
        return None
    NT = max(32, min(nt, 256))
    nunits = n // vec
    while NT > 64 and nunits < NT * 264:
        NT //= 2
    return NT, (GROUP_UNITS if nunits >= DEEP_UNITS else 1), per_row


def _fast_lastaxis(shape, kind, mode, G, nt, cheap_encode=False):
    """The last-axis kernel (``_rowwise_kernels``) for a C-contiguous input whose scale
    groups of G run along the last axis, or None where only the general kernels apply:
    ("group", L, K, NT, U) when groups of G = L * VEC (L a power of two <= 32) tile each row,
    ("row", NT, U) when a group is a whole row of at most 1024 * ROW_UNITS_MAX units; rows
    must be whole 16-byte units. Small inputs get shallow threads (U = 1 or 2: more of them,
    less latency each), large ones deep threads (more loads in flight, fewer blocks).
    ``cheap_encode``: the elements are fp8 encoded by the paired cvt instruction."""
    if mode not in (MODE_FLOAT, MODE_MX, MODE_NVFP4, MODE_ASYM, MODE_CENTRED):
        return None
    C = shape[-1]
    if mode == MODE_CENTRED and (G > C or C % G):
        return None  # the halving sum pads to the scheme's group: whole groups only
    vec = rowwise_kernels.vec_of(kind)
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
        K = min(L, CHEAP_UNITS) if cheap_encode else min(L, GROUP_UNITS)
        if mode == MODE_CENTRED:
            K = min(L, CENTRED_UNITS)
        nchunks = n // vec // K
        NT = max(32, min(nt, 256))
        while NT > 64 and nchunks < NT * 264:  # small inputs: more, smaller blocks
            NT //= 2
        return ("group", L, K, NT, max(1, GROUP_UNITS // K) if n // vec >= DEEP_UNITS else 1)
    if G == C and mode != MODE_CENTRED:
        upr = C // vec
        exact = ROW_NT_EXACT and mode == MODE_FLOAT  # (measured for the float row kernel only)
        u_target = (ROW_UNITS_DEEP if exact else ROW_UNITS_MAX) if rows >= DEEP_ROWS else 2
        NT = 32
        while NT < 1024 and NT * u_target < upr:
            NT *= 2
        if exact:  # the fewest warps that hold the row in u_target units each (less padding)
            NT = min(1024, 32 * _cdiv(_cdiv(upr, u_target), 32))
        U = _cdiv(upr, NT)
        if U <= ROW_UNITS_MAX:
            return ("row", NT, U)
    return None


def _grid_geometry(nitems, nt):
    """(NT, U, blocks) for a one-launch kernel of ``_grid`` over ``nitems`` work items (units
    or chunks) of which a thread holds U <= GRID_MAX_U, at most _sm_count() blocks (one
    per SM); None when the input is too large for that (or GRID_ONE_LAUNCH is
    off): the streaming two-kernel paths then."""
    if not GRID_ONE_LAUNCH:
        return None
    NT = max(32, min(nt, 256))
    limit = min(_sm_count(), grid_sync.MAX_DONE)
    U = _cdiv(nitems, NT * limit)
    if U > GRID_MAX_U:
        return None
    return NT, U, _cdiv(nitems, NT * U)


def _cheap(fmt) -> bool:
    from ..ptx import fp8_cvt_available, fp8_cvt_supports

    return fp8_cvt_available() and fp8_cvt_supports(fmt)


def _build_plan(shape, kind, sch, packed, stoch, nt, static_scale) -> QuantPlan:
    rec = _Recorder()
    _launch = rec.launch
    n = math.prod(shape)
    mode = _mode(sch)
    fmt = format_tuple(sch)
    maxe = _max_elem(sch)
    mxc = _mx_cfg(sch)
    key_lo, key_hi = (_SEED_LO, _SEED_HI) if stoch else (0, 0)
    # the 16-byte-unit kernels: their stochastic variants take the seed's halves last (sr);
    # without LASTAXIS_STOCH a stochastic case takes no fast path (fast_ok)
    fast_ok = not stoch or LASTAXIS_STOCH
    sr = {"stoch": True} if stoch else {}
    keys = (key_lo, key_hi) if stoch else ()
    block = sch.block_for(shape)
    out = _Outputs(rec, sch, mode, shape, packed)
    codes, scales, zps, means = out.args()
    xa = _X
    nd = len(shape)
    C = shape[-1]
    rows = out.rows
    sub_packed = packed and sch.code_bits < 8
    stream = None

    def run_encode():
        k = quantize_kernels.make_encode_kernel(kind, mode, fmt, nt, packed, stoch)
        tpr_log2 = _team_log2(_cdiv(C, 4), nt)
        grid = max(1, min(_cdiv(rows, nt >> tpr_log2), 1 << 20))
        _launch(
            k, grid, nt,
            xa, rows, C, *_geo_args(shape, block), codes, out.pcols, scales, zps, means, key_lo, key_hi, tpr_log2,
        )  # fmt: skip

    def run_group(view_rows, view_cols, G_true, plan):
        ngroups = _cdiv(view_cols, G_true)
        k = quantize_kernels.make_group_kernel(
            kind, mode, fmt, mxc, maxe, plan["G"], plan["P"], plan["team"], plan["gpb"], nt, plan["stash"], packed, stoch
        )
        if ngroups == 1:
            segs = 1
            grid = _cdiv(view_rows, plan["gpb"])
        else:
            segs = _cdiv(ngroups, plan["gpb"])
            grid = view_rows * segs
        vpcols = packed_length(view_cols, sch.code_bits) if sub_packed else view_cols
        _launch(
            k, grid, nt,
            xa, view_rows, view_cols, ngroups, segs, codes, vpcols, scales, zps, means,
            out.sparams, key_lo, key_hi,
        )  # fmt: skip

    def run_fast(fast):
        """A last-axis kernel of ``_rowwise_kernels`` (see _fast_lastaxis)."""
        vec = rowwise_kernels.vec_of(kind)
        if mode in (MODE_ASYM, MODE_CENTRED):
            if fast[0] == "row":
                _, NT, U = fast
                k = rowwise_kernels.make_lastaxis_asym_row_kernel(kind, fmt, maxe, NT, U, packed, SHFL, **sr)
                _launch(k, rows, NT, xa, C // vec, codes, scales, zps, means, *keys)
            else:
                _, L, K, NT, U = fast
                k = rowwise_kernels.make_lastaxis_stat_group_kernel(kind, mode, fmt, maxe, L, K, NT, U, packed, SHFL,
                                                                    **sr)
                nchunks = n // vec // K
                _launch(k, _cdiv(nchunks, NT * U), NT, xa, nchunks, codes, scales, zps, means, *keys)
        elif fast[0] == "row":
            _, NT, U = fast
            assert NT * (U - 1) < C // vec <= NT * U  # (the kernel checks only its last unit)
            # a finite row's units straight-line where the encode is the fp8 cvt (H100, bf16
            # fp8_row 8192x8192: 31.8 -> 27.9 M warp instructions, 71.0-71.4 -> 70.9-71.2 us);
            # int8_row measured 0.5-1 us slower with it, so integer rows keep a branch a unit
            whole = _cheap(fmt)
            k = rowwise_kernels.make_lastaxis_row_kernel(kind, mode, fmt, mxc, maxe, NT, U, packed, SHFL, whole=whole,
                                                         **sr)
            _launch(k, rows, NT, xa, C // vec, codes, scales, out.sparams, *keys)
        else:
            _, L, K, NT, U = fast
            k = rowwise_kernels.make_lastaxis_group_kernel(kind, mode, fmt, mxc, maxe, L, K, NT, U, packed, SHFL, **sr)
            nchunks = n // vec // K
            _launch(k, _cdiv(nchunks, NT * U), NT, xa, nchunks, codes, scales, out.sparams, *keys)

    def partials(count):
        """finalize's partial statistics, ``count`` of each: amax bits, min, max."""
        return rec.empty(count, np.int64), rec.empty(count, np.float32), rec.empty(count, np.float32)

    def run_tensor_stats(stat_mode):
        nblocks = max(1, min(_cdiv(n, nt * E_TARGET), 1024))
        parts = partials(nblocks)
        _launch(quantize_kernels.make_tensor_partials_kernel(kind, stat_mode, nt), nblocks, nt, xa, n, *parts)
        return (*parts, nblocks)

    def tensor_amax_parts(NT, finite, max_blocks=1024):
        """Whole units: the vector-load tensor amax pass (``finite``: over the finite
        elements, NVFP4's); returns its partials and their count."""
        vec = rowwise_kernels.vec_of(kind)
        nblocks = max(1, min(_cdiv(n // vec, NT * GROUP_UNITS), max_blocks))
        parts = partials(nblocks)
        _launch(rowwise_kernels.make_tensor_amax_kernel(kind, NT, GROUP_UNITS, SHFL, finite), nblocks, NT, xa, n // vec,
                *parts)
        return parts, nblocks

    def run_tensor_amax(NT, finite):
        """tensor_amax_parts, then finalize."""
        parts, nblocks = tensor_amax_parts(NT, finite)
        run_finalize(mode, parts, nblocks, 1, 1)

    def run_static(NT, U, per_row):
        """static_encode over whole units with the scales in ``scales``."""
        vec = rowwise_kernels.vec_of(kind)
        k = rowwise_kernels.make_static_kernel(kind, fmt, NT, U, packed, per_row, **sr)
        _launch(k, _cdiv(n // vec, NT * U), NT, xa, n // vec, C // vec, codes, scales, *keys)

    def run_finalize(fmode, parts, nchunks, ngroups, I):
        pi, pa, pb = parts
        tsc = out.tscale if out.tscale is not None else out._dummy_f32
        nft = min(nt, _pow2ceil(nchunks * I))  # threads per group: no more than its partials
        _launch(
            quantize_kernels.make_finalize_kernel(fmode, maxe, nft), ngroups, nft,
            pi, pa, pb, nchunks, ngroups, I, scales, zps, out.sparams, tsc,
        )  # fmt: skip

    del stream
    ax = sch.axis % nd
    fast_static = _fast_static(shape, kind, sch, mode, nt) if static_scale and fast_ok else None
    if fast_static is not None:  # caller-given scales, whole units: one streaming pass
        run_static(*fast_static)
    elif static_scale and mode == MODE_NVFP4:
        # the tensor scale given: execute writes S_enc into sparams and the tensor scale (no
        # kernel); the group kernels read S_enc from sparams, as after finalize: one pass
        fast = _fast_lastaxis(shape, kind, mode, block[-1], nt, _cheap(fmt)) if fast_ok else None
        if fast is not None:
            run_fast(fast)
        else:
            run_group(rows, C, block[-1], _group_plan(block[-1], C, _cdiv(C, block[-1]), mode, nt, sub_packed))
    elif static_scale:
        run_encode()
    elif mode == MODE_NVFP4:
        fast = _fast_lastaxis(shape, kind, mode, block[-1], nt, _cheap(fmt)) if fast_ok else None
        gs = _grid_geometry(n // rowwise_kernels.vec_of(kind) // fast[2],
                            nt) if fast is not None and fast[0] == "group" else None
        if gs is not None:  # one launch: S_enc over the whole grid in the group kernel (_grid)
            _, L, Kc, _, _ = fast
            NT, U, nblocks = gs
            k = rowwise_kernels.make_lastaxis_group_kernel(kind, mode, fmt, mxc, maxe, L, Kc, NT, U, packed, SHFL,
                                                           senc_grid=True,
                                              **sr)
            _launch(k, nblocks, NT, xa, n // rowwise_kernels.vec_of(kind) // Kc, codes, scales, out.tscale,
                    rec.empty(grid_sync.SYNC_WORDS, np.int32, "reset"), *keys)
        elif (fast is not None and fast[0] == "group" and NVFP4_SENC_IN_GROUPS
              and n // rowwise_kernels.vec_of(kind) < NVFP4_SENC_MAX_UNITS):
            # two launches: the group kernel computes S_enc from the amax partials itself
            parts, nparts = tensor_amax_parts(max(32, min(nt, 256)), True, NVFP4_PARTS_MAX)
            _, L, Kc, NT, U = fast
            k = rowwise_kernels.make_lastaxis_group_kernel(kind, mode, fmt, mxc, maxe, L, Kc, NT, U, packed, SHFL,
                                                           senc_parts=True,
                                              **sr)
            nchunks = n // rowwise_kernels.vec_of(kind) // Kc
            _launch(k, _cdiv(nchunks, NT * U), NT, xa, nchunks, codes, scales, parts[0], nparts, out.tscale, *keys)
        elif fast is not None:  # finite amax of whole units, vector loads
            run_tensor_amax(max(32, min(nt, 256)), True)
            run_fast(fast)
        else:
            pi, pa, pb, nb = run_tensor_stats(MODE_NVFP4)
            run_finalize(MODE_NVFP4, (pi, pa, pb), nb, 1, 1)
            plan = _group_plan(block[-1], C, _cdiv(C, block[-1]), mode, nt, sub_packed)
            run_group(rows, C, block[-1], plan)
    elif sch.granularity == "tensor":
        fast_static = _fast_static(shape, kind, sch, mode, nt) if fast_ok else None
        gs = _grid_geometry(n // rowwise_kernels.vec_of(kind),
                            nt) if fast_static is not None and mode == MODE_FLOAT else None
        if gs is not None:  # one launch: the amax over the whole grid in the static kernel (_grid)
            NT, U, nblocks = gs
            k = rowwise_kernels.make_static_kernel(kind, fmt, NT, U, packed, False, maxe, SHFL, **sr)
            _launch(k, nblocks, NT, xa, n // rowwise_kernels.vec_of(kind), shape[-1] // rowwise_kernels.vec_of(kind),
                    codes, scales,
                    rec.empty(grid_sync.SYNC_WORDS, np.int32, "reset"), *keys)
        elif (fast_static is not None and mode == MODE_FLOAT and not stoch and TENSOR_RESIDENT
              and tensor_resident.available()):
            # one cooperative launch: part of the input held on chip across the grid's amax (_tensor_resident)
            NT, UR, US, V = tensor_resident.resident_geometry()
            k = tensor_resident.make_tensor_resident_kernel(kind, fmt, maxe, NT, UR, US, V, packed)
            _launch(k, _sm_count(), NT, xa, n // rowwise_kernels.vec_of(kind), codes, scales,
                    rec.empty(grid_sync.SYNC_WORDS, np.int32, "reset"))
        elif fast_static is not None:  # whole units: vector-load amax pass, then the static pass
            NT, U, _ = fast_static
            run_tensor_amax(NT, False)
            run_static(NT, U, False)
        else:
            pi, pa, pb, nb = run_tensor_stats(mode)
            run_finalize(mode, (pi, pa, pb), nb, 1, 1)
            run_encode()
    elif sch.granularity == "block" and not stoch and _fast_tile(shape, kind, sch, mode):
        from . import tiles as tile_kernels

        R = shape[-2]
        B0, B1 = sch.block_for(shape)[-2:]
        nR, nC = _cdiv(R, B0), C // B1
        k = tile_kernels.make_tile_kernel(kind, fmt, maxe, B0, B1, packed, SHFL)
        NT = tile_kernels.tile_geometry(kind, B0, B1)[2]
        _launch(k, (n // (R * C)) * nR * nC, NT, xa, R, C, nR, nC, codes, scales)
    elif sch.granularity == "block":
        R = shape[-2]
        B0, B1 = sch.block_shape
        ntiles = (n // (R * C)) * _cdiv(R, B0) * _cdiv(C, B1)
        _launch(quantize_kernels.make_tile_params_kernel(kind, mode, maxe, nt, B0, B1), ntiles, nt, xa, R, C, scales,
                zps)
        run_encode()
    elif sch.granularity == "column" and _fast_column(shape, kind, mode, ax, stoch) and (
        one := _onepass_column(rows, C, kind, fmt, maxe, packed, rec, out, nt)
    ) is not None:  # one read: each block's chunk in registers across a per-stripe wait
        for k, grid, nthreads, args in one:
            _launch(k, grid, nthreads, *args)
    elif sch.granularity == "column" and _fast_column(shape, kind, mode, ax, stoch):
        from . import columns as column_kernels

        upr = C // rowwise_kernels.vec_of(kind)
        NT, grid, rpc = column_kernels.column_geometry(rows, upr, nt)
        parts = partials(grid[1] * C)
        _launch(column_kernels.make_column_amax_kernel(kind, NT), grid, NT, xa, rows, upr, rpc, *parts)
        run_finalize(mode, parts, grid[1], C, 1)
        _launch(column_kernels.make_column_encode_kernel(kind, fmt, NT, packed), grid, NT, xa, rows, upr, rpc, scales,
                codes)
    elif sch.granularity == "column":
        O, L, I = math.prod(shape[:ax]), shape[ax], math.prod(shape[ax + 1 :])
        plan = _group_plan(I, I, 1, mode, nt, sub_packed) if O == 1 and (nd == 2 or not sub_packed) else None
        if plan is not None:  # one channel = one contiguous row of the (L, I) view
            run_group(L, I, I, plan)
        else:
            J = L * I
            nchunks = max(1, min(O, _cdiv(1 << 17, J)))
            oc = _cdiv(O, nchunks)
            nchunks = _cdiv(O, oc)
            parts = partials(nchunks * J)
            _launch(quantize_kernels.make_column_partials_kernel(kind, mode), (_cdiv(J, 128), nchunks), 128, xa, O, J,
                    oc, *parts)
            run_finalize(mode, parts, nchunks, L, I)
            run_encode()
    else:  # group / row
        G = block[ax]
        fast = _fast_lastaxis(shape, kind, mode, G, nt, _cheap(fmt)) if ax == nd - 1 and fast_ok else None
        plan = _group_plan(G, C, _cdiv(C, G), mode, nt, sub_packed) if ax == nd - 1 and fast is None else None
        if fast is not None:
            run_fast(fast)
        elif plan is not None:
            run_group(rows, C, G, plan)
        else:
            O, L, I = math.prod(shape[:ax]), shape[ax], math.prod(shape[ax + 1 :])
            ngr = O * _cdiv(L, G) * I
            k = quantize_kernels.make_strided_params_kernel(kind, mode, fmt, mxc, maxe)
            _launch(k, _cdiv(ngr, 128), 128, xa, O, L, I, G, _pow2ceil(G), scales, zps, means)
            run_encode()

    qp = QuantPlan(shape, rec, out, sch, packed, static_scale)
    qp._xdtype = _XDTYPES[kind]
    qp._build_args = (shape, kind, sch, packed, stoch, nt, static_scale)
    return qp


def _empty_parts(alloc, sch, shape, packed):
    """Empty inputs: the reference's answer (nothing to launch), in the output library."""
    p = ref.quantize(np.zeros(shape, np.float32), sch)
    codes = p.codes
    if packed and sch.code_bits < 8:
        from ...reference.packing import pack_codes

        codes = pack_codes(codes, sch.code_bits)
    return QuantParts(
        *(_to_device_like(alloc, a) for a in (codes, p.scales, p.zero_points, p.tensor_scale, p.means))
    )


def _to_device_like(alloc, a):
    if a is None or SIMULATOR or alloc.lib == "numpy":
        return a
    if alloc.cp is not None:
        return alloc.cp.asarray(a)
    from ..runtime.backend import cuda

    return cuda.to_device(np.ascontiguousarray(a))


def _host(a):
    if a is None or isinstance(a, np.ndarray):
        return a
    if hasattr(a, "get"):
        return a.get()
    if hasattr(a, "copy_to_host"):
        return a.copy_to_host()
    return np.asarray(a)


def _copy_into(dst, host_src):
    if isinstance(dst, np.ndarray):
        dst[...] = host_src
    elif is_cupy(dst):
        dst.set(host_src)
    else:
        dst.copy_to_device(host_src)


# =============================================================================== dequantize
def dequant_units_launch(sch: Scheme, shape, nt: int, out: str = "float32"):
    """``(kernel, grid, block, geometry, tpr_log2)`` of the unit decode kernel
    (``_quantize_kernels.make_dequant_units_kernel``) for packed codes of ``shape``, writing
    ``out`` ("float32", "bfloat16" or "float16"), or None where it does not apply (the
    element kernel then decodes). ``geometry``: the kernel's
    arguments from ``rows`` to ``nc`` (``rows, upr, nseg, spu, C, pcols, d1, d2, b0, b1, b2,
    bc, bc_log2, n1, n2, nc``). Rows split into segments until there are about four a
    multiprocessor (64 rows of 7168 on 132: 9 segments of 50 units). The codes and the output
    must be 16-byte aligned (callers check the codes' address; they allocate the output)."""
    C = shape[-1]
    geo = _geo_args(shape, sch.block_for(shape))
    bc = geo[5]
    if not quantize_kernels.dequant_units_apply(sch.code_bits, C, bc):
        return None
    rows = math.prod(shape) // C
    upr = C // (16 if sch.code_bits == 8 else 32)
    pcols = packed_length(C, sch.code_bits)
    bc_log2 = bc.bit_length() - 1 if bc & (bc - 1) == 0 else -1
    nseg = max(1, min(_cdiv(4 * _sm_count(), rows), upr // 8))  # segments of at least 8 units
    spu = _cdiv(upr, nseg)
    nseg = _cdiv(upr, spu)
    tpr_log2 = _team_log2(spu, nt)
    grid = max(1, min(_cdiv(rows * nseg, nt >> tpr_log2), 1 << 20))
    out_kind = {"float32": quantize_kernels.DEQ_F32, "bfloat16": quantize_kernels.DEQ_BF16,
                "float16": quantize_kernels.DEQ_F16}[out]  # fmt: skip
    k = quantize_kernels.make_dequant_units_kernel(_mode(sch), format_tuple(sch), sch.symmetric, out_kind)
    return k, grid, nt, (rows, upr, nseg, spu, C, pcols, *geo[:6], bc_log2, *geo[6:]), tpr_log2


def dequant_element_launch(sch: Scheme, shape, nt: int, packed: bool = True):
    """``(kernel, grid, block, geometry, tpr_log2)`` of the element decode kernel
    (``_quantize_kernels.make_dequant_kernel``: float32 values of codes of ``shape``, packed
    along the last axis when ``packed``), every shape's: ``geometry`` its arguments from
    ``rows`` to ``nc`` (``rows, C, pcols, d1, d2, b0, b1, b2, bc, n1, n2, nc``)."""
    C = shape[-1]
    rows = math.prod(shape) // C
    sub = packed and sch.code_bits < 8
    pcols = packed_length(C, sch.code_bits) if sub else C
    tpr_log2 = _team_log2(C, nt)
    grid = max(1, min(_cdiv(rows, nt >> tpr_log2), 1 << 20))
    k = quantize_kernels.make_dequant_kernel(_mode(sch), format_tuple(sch), sch.symmetric, packed)
    return k, grid, nt, (rows, C, pcols, *_geo_args(shape, sch.block_for(shape))), tpr_log2


def dequantize(parts: QuantParts, scheme: Scheme, shape, *, packed=True, threads=None, out_fill=None):
    """``nqdq.reference.quantize.dequantize`` on the device: float32 values, in the
    library of ``parts.codes`` (codes packed along the last axis when ``packed``)."""
    shape = tuple(shape)
    lib = lib_of(parts.codes)
    alloc = Allocator(lib)
    n = math.prod(shape)
    sch = scheme
    if n == 0:
        return _to_device_like(alloc, np.zeros(shape, np.float32))
    nt = threads or THREADS

    def dev(a, dtype):
        if a is None:
            a = np.zeros(1, dtype)
        if SIMULATOR:
            return np.ascontiguousarray(a if isinstance(a, np.ndarray) else _host(a)).reshape(-1).view(dtype)
        if isinstance(a, np.ndarray):
            from ..runtime.backend import cuda

            return cuda.to_device(np.ascontiguousarray(a).reshape(-1).view(dtype))
        return alloc.kernel_arg(a).reshape(a.size).view(dtype)

    out = alloc.empty(n, np.float32)
    if out_fill is not None:
        fill_bytes(out, out_fill)
    sc_dtype = np.uint8 if _mode(sch) in (MODE_MX, MODE_NVFP4) else np.float32
    codes = dev(parts.codes, np.uint8)
    tail = (dev(parts.scales, sc_dtype), dev(parts.zero_points, np.uint8), dev(parts.means, np.float32),
            dev(parts.tensor_scale, np.float32), alloc.kernel_arg(out))  # fmt: skip
    units = dequant_units_launch(sch, shape, nt) if packed or sch.code_bits == 8 else None
    if units is None or device_address(codes) % 16:
        units = dequant_element_launch(sch, shape, nt, packed)
    k, grid, block, geometry, tpr_log2 = units
    _launch(k, grid, block, None, codes, *geometry, *tail, tpr_log2)
    return alloc.to_lib(out, shape)


# =============================================================================== small helpers
def has_nonfinite(x, dtype=None) -> bool:
    """True if the device array ``x`` holds a NaN or an infinity (one reduction pass)."""
    xin = x if isinstance(x, DeviceInput) else device_input(x, "x", dtype)
    n = math.prod(xin.shape)
    if n == 0:
        return False
    alloc = Allocator(xin.lib)
    nt = THREADS
    nblocks = max(1, min(_cdiv(n, nt * E_TARGET), 1024))
    pi = alloc.empty(nblocks, np.int64)
    pa = alloc.empty(nblocks, np.float32)
    pb = alloc.empty(nblocks, np.float32)
    A = alloc.kernel_arg
    _launch(quantize_kernels.make_tensor_partials_kernel(xin.kind, MODE_FLOAT, nt), nblocks, nt, None, A(xin.arr), n,
            A(pi), A(pa), A(pb))
    return bool((_host(pi) >= 0x7F800000).any())


def to_bfloat16_bits(values):
    """bfloat16 bits (uint16, round to nearest even) of a float32 device array, in its
    library (CuPy has no bfloat16 dtype)."""
    lib = lib_of(values)
    alloc = Allocator(lib)
    flat = values.reshape(-1)
    dst = alloc.empty(flat.size, np.uint16)
    grid = max(1, min(_cdiv(flat.size, THREADS), 1 << 20))
    _launch(quantize_kernels.f32_to_bf16_kernel, grid, THREADS, None, alloc.kernel_arg(flat), alloc.kernel_arg(dst),
            flat.size)
    return alloc.to_lib(dst, values.shape)
