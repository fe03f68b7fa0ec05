"""Quantize / dequantize on the GPU: the launchers, with the signatures of
``nqdq.reference.quantize.quantize`` / ``dequantize`` (plus device-only options).

A quantize call runs a :class:`QuantPlan`, built once per (shape, input kind, scheme,
packing, rounding, block size, kernel choices, device) and cached (:func:`get_plan`). Which
kernels a plan launches is the rule table of ``rules`` (``rules.RULES``, shown in its
docstring); where more than one design remains, ``choices.KernelChoices`` names them and
``choices=`` selects one. This module holds the planner's tunables (each with the
measurement behind it), the plans' execution in any array library, and ``dequantize``.
"""

from __future__ import annotations

import collections
import math
import threading

import numpy as np

from ...reference import quantize as ref
from ...reference.packing import packed_length
from ...reference.quantize import QuantParts
from ...reference.scales import nvfp4_given_encode_scale
from ...schemes import Scheme
from ..device.codec import KIND_BF16, KIND_F16, KIND_F32
from ..device.elements import format_tuple
from ..device.scales import MODE_FLOAT, MODE_MX, MODE_NVFP4
from ..runtime import devices as _devices
from ..runtime import launch
from ..runtime.interop import Allocator, DeviceInput, device_address, device_input, is_cupy, lib_of
from ..runtime.launch import fast_kernel as _fast_kernel
from ..runtime.target import SIMULATOR
from . import dequant_kernels
from . import general
from . import lastaxis
from . import rules, runners
from .choices import AUTO, KernelChoices
from .params import E_TARGET, cdiv as _cdiv, geo_args as _geo_args, kernel_mode as _mode, team_log2 as _team_log2
from .slots import AMAX as _AMAX, SEED_HI as _SEED_HI, SEED_LO as _SEED_LO, X as _X
from .slots import Outputs, Recorder, Slot, copy_into, fill_bytes, host, split_seed, zero_word

__all__ = ["quantize", "dequantize", "has_nonfinite", "to_bfloat16_bits", "get_plan", "QuantPlan", "THREADS",
           "KernelChoices"]  # fmt: skip

THREADS = 64 if SIMULATOR else 256  # threads per block (results never depend on it)

# ----------------------------------------------------------------------------- tunables
# (rules.Tuning; read when a plan is built: tests set them on small inputs and clear _PLANS)
ROW_UNITS_MAX = 8  # 16-byte units a thread of the row kernel holds in registers
GROUP_UNITS = 4  # 16-byte units a thread of the group kernel loads before using any (deep)
CHEAP_UNITS = 1  # units per chunk where the encode is the paired fp8 cvt (K > 1: interleaved over the group's lanes)
# deep rows of the float row kernel: units per thread it aims at, with NT the fewest warps that
# hold the row (less padding than a power of two). H100, bf16 fp8_row, us: 8192x8192 U = 8 (NT
# 128) 72.06, 5 (NT 224) 71.14, 4 (NT 256) 70.72; 16384x7168 U = 7 (NT 128) 120.26, 5 (NT 192)
# 119.68, 4 (NT 224) 123.74 (Triton peer 70.27 / 118.62; docs/design/last-axis.md)
ROW_UNITS_DEEP = 5
DEEP_ROWS = 528  # rows from which the row kernel uses deep threads (4 blocks per H100 SM)
DEEP_UNITS = 4 * 256 * 264  # units from which the group kernel uses GROUP_UNITS per thread
SHFL = lastaxis.SHFL_DEFAULT  # tests set False to run the shuffle's shared-memory twin on a GPU
# units per chunk of the centred groups: 4 (the sum's unit levels in the thread; H100, bf16
# 8192x8192 / 16384x7168: 86 / 87 % of copy with 2, 92 / 93 % with 4)
CENTRED_UNITS = 4
# PerTensor.AMAX_IN_GROUPS, automatically below this many 16-byte units: 2048x7168 (1.8M units)
# measured faster with it, 8192x8192 (8.4M) slower; the crossover between them is not measured
NVFP4_SENC_MAX_UNITS = 1 << 21
NVFP4_PARTS_MAX = 1024  # amax blocks (partials that every group-kernel block reduces) at most
GRID_MAX_U = 4  # PerTensor.ONE_LAUNCH: units or chunks a thread at most, one block an SM


def _launch(kernel, grid, block, stream, *args):
    """Every launch goes through FastKernel: ``cuLaunchKernel`` with packed arguments on
    CuPy's current stream (``stream`` None) on a GPU, Numba's launch under the simulator."""
    _fast_kernel(kernel).launch(grid, block, args, stream)


def _sm_count() -> int:
    """Blocks a kernel whose blocks wait for each other (the ``grid`` one-launch kernels,
    the column ring) may count on being resident: one per SM of the current device (1 under
    the simulator, which runs blocks one after another; dry runs set SIMULATOR)."""
    if SIMULATOR:
        return 1
    from ..runtime.backend import cuda

    return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)


def _cheap(fmt) -> bool:
    from ..ptx.convert import fp8_cvt_available, fp8_cvt_supports

    return fp8_cvt_available() and fp8_cvt_supports(fmt)


def _tuning() -> rules.Tuning:
    return rules.Tuning(
        ROW_UNITS_MAX=ROW_UNITS_MAX, ROW_UNITS_DEEP=ROW_UNITS_DEEP, DEEP_ROWS=DEEP_ROWS, GROUP_UNITS=GROUP_UNITS,
        DEEP_UNITS=DEEP_UNITS, CHEAP_UNITS=CHEAP_UNITS, CENTRED_UNITS=CENTRED_UNITS, SHFL=SHFL,
        NVFP4_SENC_MAX_UNITS=NVFP4_SENC_MAX_UNITS, NVFP4_PARTS_MAX=NVFP4_PARTS_MAX, GRID_MAX_U=GRID_MAX_U,
    )  # fmt: skip


def _build_plan(shape, kind, sch, packed, stoch, nt, static_scale, choices, amax=False) -> QuantPlan:
    name, rec, out = rules.build(shape, kind, sch, packed, stoch, nt, static_scale, choices, _tuning(), _sm_count,
                                 _cheap, amax)  # fmt: skip
    qp = QuantPlan(shape, rec, out, sch, packed, static_scale)
    qp.rule = name
    qp._xdtype = _XDTYPES[kind]
    qp._build_args = (shape, kind, sch, packed, stoch, nt, static_scale, choices, amax)
    return qp


# ----------------------------------------------------------------------------- the plan
class QuantPlan:
    """Everything one ``quantize`` call of a given (shape, input kind, scheme, packing,
    rounding, block size, kernel choices) does, decided once: the rule that built it
    (``rule``), the arrays it allocates (slots), the launches (kernels, grids, blocks,
    arguments), and where the results are. Executed by :meth:`execute` (any array library,
    Numba fallback included) or, for CuPy input on a real GPU, by the generated
    :meth:`cupy_runner` (raw addresses, one allocation)."""

    def __init__(self, shape, rec: Recorder, out: Outputs, sch: Scheme, packed: bool, static_scale: bool):
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
        self.zero_amax = rec.zero_amax  # the caller's amax array zeroed before the launches
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
        the rules take the case's other kernels: the same results). Cached; the plan cache is
        cleared so later calls plan afresh."""
        if self._fallback is None:
            with _PLANS_LOCK:
                _PLANS.clear()
            self._fallback = _build_plan(*self._build_args)
        return self._fallback

    # -- any library: slots become arrays of the allocator's library, FastKernel launches
    def execute(self, xarr, alloc: Allocator, seed=None, scale_host=None, out_fill=None, amax_out=None) -> QuantParts:
        """Run the plan on ``xarr``; ``amax_out``: the caller's float32[1] kernel array for
        the amax by-product (a plan built with ``amax``)."""
        if self.ex_kinds & launch._REFUSED:
            return self.fallback().execute(xarr, alloc, seed, scale_host, out_fill, amax_out)
        try:
            return self._execute(xarr, alloc, seed, scale_host, out_fill, amax_out)
        except launch.LaunchRefused as e:  # the fallback runs the whole call again, on arrays of its own
            launch.refuse(e.kind)
            return self.fallback().execute(xarr, alloc, seed, scale_host, out_fill, amax_out)

    def _execute(self, xarr, alloc, seed, scale_host, out_fill, amax_out):
        arrays = [alloc.empty(s.n, s.dtype) for s in self.slots]
        for s in self.slots:
            if s.role in ("zero", "reset"):
                fill_bytes(arrays[s.i], 0)
        if out_fill is not None:
            for s in (self.codes, self.scales, self.zps, self.means, self.tscale):
                if s is not None:
                    fill_bytes(arrays[s.i], out_fill)
        if self.static_scale and self.tscale is not None:  # NVFP4: [S_dec, S_enc] (quantize)
            copy_into(arrays[self.tscale.i], scale_host[:1])
            copy_into(arrays[self.sparams.i], scale_host[1:])
        elif self.static_scale:
            copy_into(arrays[self.scales.i], scale_host)
        lo, hi = split_seed(seed)
        A = alloc.kernel_arg
        xa = A(xarr)
        if self.zero_amax:
            zero_word(amax_out)
        for kernel, grid, block, args in self.launches:
            real = tuple(
                A(arrays[a.i]) if type(a) is Slot else xa if a is _X else lo if a is _SEED_LO else hi if a is _SEED_HI
                else amax_out if a is _AMAX else a
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

    # -- on a GPU: generated runners (``runners``), built once
    def cupy_runner(self):
        """``run(x, lo=0, hi=0) -> (codes, scales, zero_points, tensor_scale, means)`` for a
        C-contiguous CuPy ``x`` of this plan's shape and kind (``runners.build_cupy_runner``;
        a plan with cooperative or cluster launches: behind ``runners.refusal_guard``), or
        None where it cannot be built."""
        if self._runner_built:
            return self._runner
        with self._lock:
            if not self._runner_built:  # (an error, e.g. under an invalidated graph capture: built again next call)
                run = runners.build_cupy_runner(self)
                self._runner = run if run is None or not self.ex_kinds else runners.refusal_guard(self, run)
                self._runner_built = True
        return self._runner

    def torch_runner(self, caller):
        """``run(x) -> (codes, scales, zero_points, tensor_scale, means)`` for a contiguous
        PyTorch tensor ``x`` (``runners.build_torch_runner``), or None."""
        with self._lock:
            if not hasattr(self, "_torch_run"):
                self._torch_run = runners.build_torch_runner(self, caller)
        return self._torch_run


_PLANS: collections.OrderedDict = collections.OrderedDict()
_PLANS_MAX = 256
_PLANS_LOCK = threading.Lock()
_XDTYPES = {KIND_F32: np.dtype(np.float32), KIND_BF16: np.dtype(np.uint16), KIND_F16: np.dtype(np.uint16)}


def get_plan(shape, kind, sch: Scheme, *, packed=True, stoch=False, threads=None, static_scale=False,
             choices: KernelChoices | None = None, amax=False) -> QuantPlan:  # fmt: skip
    """The (LRU-cached) :class:`QuantPlan` of a quantize call on the current GPU (a plan's
    grids follow its SM count, its runner holds its arrays and kernel handles: runtime.devices).
    ``choices``: the designs to take where more than one remains (default: automatic);
    ``amax``: the plan also records the input's amax (a given tensor scale)."""
    nt = threads or THREADS
    choices = AUTO if choices is None else choices
    key = (tuple(shape), kind, sch, bool(packed), bool(stoch), nt, bool(static_scale), choices, _devices.current(),
           bool(amax))  # fmt: skip
    plan = _PLANS.get(key)
    if plan is not None:
        try:
            _PLANS.move_to_end(key)
        except KeyError:
            pass
        return plan
    plan = _build_plan(tuple(shape), kind, sch, bool(packed), bool(stoch), nt, bool(static_scale), choices,
                       bool(amax))  # fmt: skip
    with _PLANS_LOCK:
        _PLANS[key] = plan
        while len(_PLANS) > _PLANS_MAX:
            _PLANS.popitem(last=False)
    return plan


def quantize(x, scheme: Scheme, *, scale=None, seed=None, packed=True, dtype=None, threads=None, out_fill=None,
             choices: KernelChoices | None = None, amax_out=None):  # fmt: skip
    """``nqdq.reference.quantize.quantize`` on the device.

    ``x``: a device array (CuPy, ``__cuda_array_interface__``, CUDA DLPack) of float32 /
    float16 / bfloat16 -- or uint16 bits with ``dtype="bfloat16"``/``"float16"`` -- or a
    NumPy array (run in the simulator under NUMBA_ENABLE_CUDASIM=1, else copied to the GPU
    and back). Returns a :class:`QuantParts` in the input's library whose codes are packed
    along the last axis when ``packed`` (one per byte, as the reference's, otherwise).
    ``threads`` overrides the block size; ``out_fill`` fills every output byte first (tests);
    ``choices`` selects kernel designs (``KernelChoices``; default automatic). ``amax_out``
    (with ``scale``, a per-tensor scale): a float32 array of one element on x's GPU (NumPy:
    copied back) that receives the input's amax, the dynamic scheme's statistic, in the same
    pass where the kernels allow (docs/design/per-tensor-dynamic.md). The planning
    is cached (:func:`get_plan`); CuPy input on a GPU runs the plan's generated launcher
    (:meth:`QuantPlan.cupy_runner`).
    """
    xin = x if isinstance(x, DeviceInput) else device_input(x, "x", dtype)
    shape = tuple(xin.shape)
    if len(shape) == 0:
        raise ValueError("x must have at least one dimension, got a 0-d array")
    alloc = Allocator(xin.lib)
    if math.prod(shape) == 0:
        return _empty_parts(alloc, scheme, shape, packed)
    plan = get_plan(shape, xin.kind, scheme, packed=packed, stoch=seed is not None, threads=threads,
                    static_scale=scale is not None, choices=choices, amax=amax_out is not None)  # fmt: skip
    scale_host = None
    if scale is not None and scheme.is_nvfp4:  # the tensor scale S_dec given, and S_enc from it
        s_dec = np.asarray(host(scale), np.float32).reshape(())
        scale_host = np.array([s_dec, nvfp4_given_encode_scale(s_dec)], np.float32)
    elif scale is not None:
        scale_host = np.ascontiguousarray(
            np.broadcast_to(np.asarray(host(scale), np.float32), plan.sshape)
        ).reshape(-1)
    if out_fill is None and xin.lib == "cupy" and is_cupy(xin.arr):
        run = plan.cupy_runner()
        if run is not None:
            lo, hi = split_seed(seed)
            c, s, z, t, m = run(xin.arr, lo, hi)
            return QuantParts(codes=c, scales=s, zero_points=z, tensor_scale=t, means=m)
    if amax_out is None:
        return plan.execute(xin.arr, alloc, seed=seed, scale_host=scale_host, out_fill=out_fill)
    host_amax = isinstance(amax_out, np.ndarray) and not SIMULATOR  # NumPy x on a GPU: copied back
    amax_dev = alloc.empty(1, np.float32) if host_amax else amax_out
    parts = plan.execute(xin.arr, alloc, seed=seed, scale_host=scale_host, out_fill=out_fill,
                         amax_out=alloc.kernel_arg(amax_dev))  # fmt: skip
    if host_amax:
        amax_out.reshape(-1)[:] = host(amax_dev).reshape(-1)
    return parts


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


# =============================================================================== dequantize
def dequant_units_launch(sch: Scheme, shape, nt: int, out: str = "float32"):
    """``(kernel, grid, block, geometry, tpr_log2)`` of the unit decode kernel
    (``dequant_kernels.make_dequant_units_kernel``) for packed codes of ``shape``, writing
    ``out`` ("float32", "bfloat16" or "float16"), or None where it does not apply (the
    element kernel then decodes). ``geometry``: the kernel's arguments from ``rows`` to
    ``col_sh`` (``rows, cpr, nseg, spc, d1, d2, b0, b1, b2, n1, n2, nc, gw, col_m, col_sh``).
    A row's ``cpr`` chunks (``chunk_elems`` elements each) split into ``nseg`` segments of
    ``spc``, a whole number of warp steps (32 chunks), where rows are fewer than
    ``_DEQ_WARPS_PER_SM`` a multiprocessor, down to two steps a lane (64 rows of 7168 to
    bfloat16 on 132 SMs: 14 segments of 64 chunks); a team of up to a warp decodes a segment.
    The codes and the output must be 16-byte aligned (callers check the codes' address; they
    allocate the output)."""
    C = shape[-1]
    geo = _geo_args(shape, sch.block_for(shape))
    bc = geo[5]
    if not dequant_kernels.dequant_units_apply(sch.code_bits, C, bc):
        return None
    out_kind = {"float32": dequant_kernels.DEQ_F32, "bfloat16": dequant_kernels.DEQ_BF16,
                "float16": dequant_kernels.DEQ_F16}[out]  # fmt: skip
    E = dequant_kernels.chunk_elems(out_kind)
    rows = math.prod(shape) // C
    cpr = C // E
    nseg = max(1, min(_cdiv(_DEQ_WARPS_PER_SM * _sm_count(), rows), cpr // 64))
    spc = 32 * _cdiv(_cdiv(cpr, nseg), 32) if nseg > 1 else cpr
    nseg = _cdiv(cpr, spc)
    tpr_log2 = min(max(spc - 1, 0).bit_length(), 5, nt.bit_length() - 1)  # a team: at most a warp
    grid = max(1, min(_cdiv(rows * nseg, nt >> tpr_log2), 1 << 20))
    col_m, col_sh = dequant_kernels.column_divisor(bc, C - 1)
    gw = bc // E  # chunks a scale group
    wide = (rows + 1) * cpr + gw >= 1 << 32  # (a group's end past the last row's: no u32 wrap)
    step_scales = (1 << tpr_log2) % gw == 0  # each step of a lane a new group
    k = dequant_kernels.make_dequant_units_kernel(_mode(sch), format_tuple(sch), sch.symmetric, out_kind, wide,
                                                  step_scales)  # fmt: skip
    return k, grid, nt, (rows, cpr, nseg, spc, *geo[:5], *geo[6:], gw, col_m, col_sh), tpr_log2


_DEQ_WARPS_PER_SM = 8  # dequant_units_launch: segments (a warp each) aimed at per SM where rows are few


def dequant_element_launch(sch: Scheme, shape, nt: int, packed: bool = True):
    """``(kernel, grid, block, geometry, tpr_log2)`` of the element decode kernel
    (``dequant_kernels.make_dequant_kernel``: float32 values of codes of ``shape``, packed
    along the last axis when ``packed``), every shape's: ``geometry`` its arguments from
    ``rows`` to ``nc`` (``rows, C, pcols, d1, d2, b0, b1, b2, bc, n1, n2, nc``)."""
    C = shape[-1]
    rows = math.prod(shape) // C
    sub = packed and sch.code_bits < 8
    pcols = packed_length(C, sch.code_bits) if sub else C
    tpr_log2 = _team_log2(C, nt)
    grid = max(1, min(_cdiv(rows, nt >> tpr_log2), 1 << 20))
    k = dequant_kernels.make_dequant_kernel(_mode(sch), format_tuple(sch), sch.symmetric, packed)
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
            return np.ascontiguousarray(a if isinstance(a, np.ndarray) else host(a)).reshape(-1).view(dtype)
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
    _launch(general.make_tensor_partials_kernel(xin.kind, MODE_FLOAT, nt), nblocks, nt, None, A(xin.arr), n,
            A(pi), A(pa), A(pb))
    return bool((host(pi) >= 0x7F800000).any())


def to_bfloat16_bits(values):
    """bfloat16 bits (uint16, round to nearest even) of a float32 device array, in its
    library (CuPy has no bfloat16 dtype)."""
    lib = lib_of(values)
    alloc = Allocator(lib)
    flat = values.reshape(-1)
    dst = alloc.empty(flat.size, np.uint16)
    grid = max(1, min(_cdiv(flat.size, THREADS), 1 << 20))
    _launch(dequant_kernels.f32_to_bf16_kernel, grid, THREADS, None, alloc.kernel_arg(flat), alloc.kernel_arg(dst),
            flat.size)
    return alloc.to_lib(dst, values.shape)
