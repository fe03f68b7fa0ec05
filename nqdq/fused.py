"""Fused quantization ops: RMSNorm (after an optional residual add), flatten, and the MoE
sort, each followed by quantization, in one pass over the data on the GPU.

Every function returns :class:`~nqdq.quantized.QuantizedTensor` objects of the same form as
:func:`nqdq.quantize` for the same scheme (so ``nqdq.dequantize``, ``save`` and ``load``
work), bit-identical to ``nqdq.reference.fused`` (the unfused composition, in the order that
reference states). Inputs are float32 / float16 / bfloat16 (on CuPy, bfloat16 as uint16 bits
with ``dtype="bfloat16"``); NumPy inputs run the reference on the CPU unless
``device="cuda"``, GPU arrays run the kernels.

Schemes: ``"fp8_row"`` (per-token dynamic), ``"fp8_tensor"`` with ``scale=`` (per-tensor
static), ``"fp8_1x128"``, ``"mxfp4"`` (and ``"mxfp8"``).

A repeated GPU call with the same arguments takes a hot path that skips every check and plan
(one allocation, one planned launch on the current stream, no wait for the device): the
"rows hot path" section for rmsnorm / rmsnorm_quantize / flatten_quantize, the "MoE hot
path" one for moe_sort_quantize.
"""

from __future__ import annotations

import sys

import numpy as np

from . import _arrays
from .gpu.runtime import callers as _callers
from .quantized import QuantizedTensor
from .reference import fused as R
from .reference.packing import pack_codes
from .schemes import resolve_scheme

__all__ = ["rmsnorm", "rmsnorm_quantize", "flatten_quantize", "moe_sort_quantize"]


# ----------------------------------------------------------------------------- argument checks
def _eps(eps) -> np.float32:
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating, np.integer)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    e = np.float32(eps)
    if not (np.isfinite(e) and e > 0):
        raise ValueError(f"eps must be positive and finite in float32, got {eps!r}")
    return e


def _scheme(scheme, scale):
    from .gpu.fused.plan import out_kind

    sch = resolve_scheme(scheme, static_scale=scale is not None)
    if sch.granularity == "tensor" and scale is None:
        raise ValueError(f"scheme={scheme!r}: the fused per-tensor scheme is static: pass scale=<float>")
    out_kind(sch)  # ValueError naming the scheme when no fused kernel exists
    return sch


def _dtype_of(a):
    dt = getattr(a, "dtype", None)
    return None if dt is None else str(dt)


def _weight_dtype(weight, weight_dtype, x_dtype):
    """A uint16 weight on the GPU is read as the bits of x's dtype unless told otherwise."""
    if weight_dtype is not None:
        return weight_dtype
    if _dtype_of(weight) in ("uint16", "int16") and x_dtype in ("bfloat16", "float16"):
        return x_dtype
    return None


def _pack(codes, sch):
    return pack_codes(codes, sch.code_bits) if sch.code_bits < 8 else codes


def _qt(codes, scales, sch, shape, dtype_name):
    return QuantizedTensor(codes=codes, scales=scales, scheme=sch, shape=tuple(shape), dtype=dtype_name,
                           scale_layout="linear")


def _host_rows(x, weight, residual, dtype, weight_dtype):
    x32, dname = _arrays.float_input(x, "x", dtype=dtype)
    if x32.ndim < 1 or x32.shape[-1] < 1:
        raise ValueError(f"x must have at least one dimension with a non-empty last axis, got shape {x32.shape}")
    w32, wname = _arrays.float_input(weight, "weight", dtype=_weight_dtype(weight, weight_dtype, dname))
    if w32.shape != (x32.shape[-1],):
        raise ValueError(f"weight must have shape ({x32.shape[-1]},) (x's last axis), got {w32.shape}")
    r32 = None
    if residual is not None:
        r32, rname = _arrays.float_input(residual, "residual", dtype=dtype)
        if r32.shape != x32.shape or rname != dname:
            raise ValueError(f"residual must match x (shape {x32.shape}, {dname}), got shape {r32.shape}, {rname}")
    return x32, dname, w32, wname, r32


def _device_rows(x, weight, residual, dtype, weight_dtype):
    from .gpu.runtime.interop import device_input

    xin = device_input(x, "x", dtype)
    if len(xin.shape) < 1 or xin.shape[-1] < 1:
        raise ValueError(f"x must have at least one dimension with a non-empty last axis, got shape {xin.shape}")
    win = device_input(weight, "weight", _weight_dtype(weight, weight_dtype, xin.dtype))
    n = xin.shape[-1]
    if tuple(win.shape) != (n,):
        raise ValueError(f"weight must have shape ({n},) (x's last axis), got {tuple(win.shape)}")
    rin = None
    if residual is not None:
        rin = device_input(residual, "residual", dtype if dtype is not None else _weight_dtype(residual, None, xin.dtype))
        if tuple(rin.shape) != tuple(xin.shape) or rin.kind != xin.kind:
            raise ValueError(f"residual must match x (shape {xin.shape}, {xin.dtype}), got shape {rin.shape}, {rin.dtype}")
    return xin, win, rin


def _residual_out(a, dtype_name, lib, x):
    """The new residual in the input's form (NumPy: its dtype; GPU: uint16 bits for bfloat16)."""
    if a is None:
        return None
    dt = _residual_dtype(dtype_name, lib, x)
    return a if a.dtype == dt else a.view(dt)


def _residual_dtype(dtype_name, lib, x) -> np.dtype:
    """The dtype of the new residual that comes back for input x of ``dtype_name``."""
    if lib == "numpy":
        return np.dtype({"bfloat16": _arrays.BFLOAT16, "float16": np.float16, "float32": np.float32}[dtype_name])
    if dtype_name == "float16" and _dtype_of(x) == "float16":
        return np.dtype(np.float16)
    return np.dtype(np.float32 if dtype_name == "float32" else np.uint16)


# ----------------------------------------------------------------------------- public ops
def rmsnorm(x, weight, eps=1e-6, residual=None, *, device=None, dtype=None, weight_dtype=None):
    """RMSNorm over the last axis as float32 y (reference/fused's order): the first half of
    the unfused composition. Returns y, or (y, new residual) when ``residual`` is given."""
    if _ROWS_FAST:  # the hot path: a repeated GPU call (_remember_rows)
        fr = _hot(_norm_key(_OP_Y, x, weight, residual, (eps.__class__, eps), device, dtype, weight_dtype))
        if fr is not None:
            out = fr(x, weight, residual)
            if out is not None:
                return out
    return _rmsnorm(x, weight, eps, residual, device, dtype, weight_dtype)


@_arrays.on_gpu_of("x", "weight", "residual")
@_callers.in_caller_library("x", "weight", "residual")
def _rmsnorm(x, weight, eps, residual, device, dtype, weight_dtype):
    """rmsnorm's general path, on the arrays' GPU (every check; remembers the hot path)."""
    e = _eps(eps)
    if not _arrays.use_device(x, device):
        x32, dname, w32, wname, r32 = _host_rows(x, weight, residual, dtype, weight_dtype)
        new_res = None
        if r32 is not None:
            new_res = R.add_residual(x32, r32, dname)
            x32 = new_res.astype(np.float32)
        y = R.rmsnorm(x32, w32, e, dname, wname)
        return y if residual is None else (y, new_res)
    from .gpu.fused import kernels as fused_kernels
    from .gpu.fused.plan import run_rows

    xin, win, rin = _device_rows(x, weight, residual, dtype, weight_dtype)
    n = xin.shape[-1]
    rows = int(np.prod(xin.shape[:-1], dtype=np.int64))
    out = run_rows(fused_kernels.OP_NORM, xin, rows, n, None, w=win.arr, wkind=win.kind,
                   res=None if rin is None else rin.arr,
                   eps=e, want_y=True)
    alloc = out["alloc"]
    y = alloc.to_lib(out["y"], xin.shape)
    new_res = None if residual is None else _residual_out(alloc.to_lib(out["newres"], xin.shape), xin.dtype, xin.lib, x)
    ox, ow, orr, odt = (*map(_callers.original, (x, weight, residual)), _callers.original_dtype(dtype))
    lib = _hot_lib(ox, xin, device, ow, orr)
    if lib is not None:
        _remember_rows(lambda: _norm_key(_OP_Y, ox, ow, orr, (eps.__class__, eps), device, odt, weight_dtype),
                       lambda: _norm_runner(lib, xin, win, rin, None, e, None, x))
    return y if residual is None else (y, new_res)


def rmsnorm_quantize(x, weight, scheme, eps=1e-6, residual=None, scale=None, device=None, *, dtype=None,
                     weight_dtype=None):
    """Quantize RMSNorm(x [+ residual]) * weight under ``scheme``, in one pass on the GPU.

    x: [..., n]; weight: [n] (float32 / float16 / bfloat16, any of them); residual: like x;
    the new residual fl(x + residual) rounded to x's dtype is what gets normalized, and is
    returned: ``(q, new_residual)``; without residual just ``q``. ``scale``: the static
    per-tensor dequantization scale of ``"fp8_tensor"``. eps: float32, > 0.
    """
    if _ROWS_FAST:  # the hot path: a repeated GPU call (_remember_rows)
        fr = _hot(_norm_key(_OP_NORM_Q, x, weight, residual, (scheme, eps.__class__, eps, scale.__class__, scale),
                            device, dtype, weight_dtype))
        if fr is not None:
            out = fr(x, weight, residual)
            if out is not None:
                return out
    return _rmsnorm_quantize(x, weight, scheme, eps, residual, scale, device, dtype, weight_dtype)


@_arrays.on_gpu_of("x", "weight", "residual")
@_callers.in_caller_library("x", "weight", "residual")
def _rmsnorm_quantize(x, weight, scheme, eps, residual, scale, device, dtype, weight_dtype):
    """rmsnorm_quantize's general path, on the arrays' GPU (every check; remembers the hot path)."""
    e = _eps(eps)
    sch = _scheme(scheme, scale)
    if not _arrays.use_device(x, device):
        x32, dname, w32, wname, r32 = _host_rows(x, weight, residual, dtype, weight_dtype)
        sch.check_shape(x32.shape)
        s = None if scale is None else _arrays.static_scale(scale, sch.scale_shape(x32.shape))
        parts, new_res = R.rmsnorm_quantize(x32, w32, sch, e, dname, wname, res32=r32, scale=s)
        q = _qt(_pack(parts.codes, sch), parts.scales, sch, x32.shape, dname)
        return q if residual is None else (q, new_res)
    from .gpu.fused import kernels as fused_kernels
    from .gpu.fused.plan import run_rows

    xin, win, rin = _device_rows(x, weight, residual, dtype, weight_dtype)
    shape = tuple(xin.shape)
    sch.check_shape(shape)
    s = None if scale is None else _arrays.static_scale(scale, sch.scale_shape(shape))
    n = shape[-1]
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    out = run_rows(fused_kernels.OP_NORM, xin, rows, n, sch, w=win.arr, wkind=win.kind,
                   res=None if rin is None else rin.arr,
                   eps=e, sscale=None if s is None else np.float32(s.reshape(-1)[0]))
    q = _finish(out, sch, shape, xin, s)
    new_res = None if residual is None else _residual_out(out["alloc"].to_lib(out["newres"], shape), xin.dtype, xin.lib, x)
    ox, ow, orr, odt = (*map(_callers.original, (x, weight, residual)), _callers.original_dtype(dtype))
    lib = _hot_lib(ox, xin, device, ow, orr)
    if lib is not None:
        _remember_rows(lambda: _norm_key(_OP_NORM_Q, ox, ow, orr,
                                         (scheme, eps.__class__, eps, scale.__class__, scale), device, odt, weight_dtype),
                       lambda: _norm_runner(lib, xin, win, rin, sch, e, s, x))  # fmt: skip
    return q if residual is None else (q, new_res)


def _finish(out, sch, shape, xin, static=None):
    alloc = out["alloc"]
    codes = alloc.to_lib(out["codes"], tuple(shape[:-1]) + (out["pcols"],))
    if static is not None:
        host = np.ascontiguousarray(static, np.float32)
        scales = host if xin.lib == "numpy" else _to_device(host, alloc)
    else:
        scales = alloc.to_lib(out["scales"], sch.scale_shape(tuple(shape)))
    return _qt(codes, scales, sch, shape, xin.dtype)


def _to_device(host, alloc):
    if alloc.cp is not None:
        return alloc.cp.asarray(host)
    from numba import cuda

    return cuda.to_device(host)


def flatten_quantize(x, scheme, *, device=None, dtype=None):
    """Quantize a [B, H, D] array as [B, H*D] (row b = x[b] in C order of (h, d)). On the GPU a
    strided view (e.g. ``a.transpose(1, 0, 2)`` of a [H, B, D] array) is read in place when
    its last axis is contiguous and D and the other strides are multiples of 4."""
    if _ROWS_FAST:  # the hot path: a repeated GPU call (_remember_rows)
        fr = _hot(_flat_key(x, scheme, device, dtype))
        if fr is not None:
            out = fr(x, None, None)
            if out is not None:
                return out
    return _flatten_quantize(x, scheme, device, dtype)


@_arrays.on_gpu_of("x")
@_callers.in_caller_library("x")
def _flatten_quantize(x, scheme, device, dtype):
    """flatten_quantize's general path, on x's GPU (every check; remembers the hot path)."""
    sch = _scheme(scheme, None)
    if not _arrays.use_device(x, device):
        x32, dname = _arrays.float_input(x, "x", dtype=dtype)
        if x32.ndim != 3:
            raise ValueError(f"x must be 3-D [B, H, D], got shape {x32.shape}")
        b, h, d = x32.shape
        sch.check_shape((b, h * d))
        parts = R.flatten_quantize(x32, sch)
        return _qt(_pack(parts.codes, sch), parts.scales, sch, (b, h * d), dname)
    from .gpu.fused import kernels as fused_kernels
    from .gpu.fused.plan import run_rows

    if getattr(x, "ndim", None) != 3:
        raise ValueError(f"x must be 3-D [B, H, D], got shape {getattr(x, 'shape', None)}")
    from .gpu.runtime.target import SIMULATOR

    if not SIMULATOR and _c_contiguous(x):
        # a contiguous [B, H, D] is already [B, H*D] in memory: nqdq.quantize's row kernels
        # (the same spec) are faster than the fused row kernel on it (H100, bf16 [8192, 7168],
        # as measured when this route was chosen: 74.0 / 95.4 us to fp8_1x128 / mxfp4 against
        # 176-181 us)
        from .api import quantize

        b, h, d = (int(v) for v in x.shape)
        q = quantize(x.reshape(b, h * d), sch, device="cuda", dtype=dtype)
        ox, odt = _callers.original(x), _callers.original_dtype(dtype)
        lib = _hot_lib(ox, None, device)
        if lib is not None and lib.compiled:  # (CuPy, PyTorch)
            _remember_rows(lambda: _flat_key(ox, scheme, device, odt),
                           lambda: _flat_plan_runner(x, sch, q, dtype) if lib.name == "cupy" else
                           _flat_quantize_runner(sch, (b, h * d), device, dtype))
        return q
    xin, strides = _strided_input(x, dtype)
    b, h, d = xin.shape
    shape = (b, h * d)
    sch.check_shape(shape)
    out = run_rows(fused_kernels.OP_ROWS, xin, b, h * d, sch, strides=strides)
    q = _finish(out, sch, shape, xin)
    ox, odt = _callers.original(x), _callers.original_dtype(dtype)
    lib = _hot_lib(ox, xin, device)
    if lib is not None and (strides is not None or _c_contiguous(x)):  # (not a contiguous copy of x)
        _remember_rows(lambda: _flat_key(ox, scheme, device, odt), lambda: _flat_rows_runner(lib, xin, strides, sch, q))
    return q


def _c_contiguous(x) -> bool:
    flags = getattr(x, "flags", None)
    try:
        return bool(flags["C_CONTIGUOUS"]) if flags is not None else False
    except Exception:
        return bool(getattr(flags, "c_contiguous", False))


def _strided_input(x, dtype):
    """(DeviceInput over the memory of a [B, H, D] view, (sb, sh, D) or None when contiguous)."""
    from .gpu.runtime.interop import DeviceInput, device_input, is_cupy
    from .gpu.runtime.target import SIMULATOR

    item = x.dtype.itemsize
    st = tuple(int(s) for s in x.strides)
    b, h, d = (int(v) for v in x.shape)
    contiguous = st == (h * d * item, d * item, item)
    in_place = (is_cupy(x) or (SIMULATOR and isinstance(x, np.ndarray))) and not contiguous
    if not in_place or b * h * d == 0 or st[2] != item or min(st) < 0 or any(s % item for s in st):
        xin = device_input(x, "x", dtype)
        return xin, None
    sb, sh = st[0] // item, st[1] // item
    if sb % 4 or sh % 4 or d % 4:
        xin = device_input(x, "x", dtype)  # a contiguous copy
        return xin, None
    span = (b - 1) * sb + (h - 1) * sh + d
    probe = device_input(x[:1, :1, :1], "x", dtype)  # dtype checks, kind
    if is_cupy(x):
        import cupy

        flat = cupy.ndarray((span,), dtype=x.dtype, memptr=x.data)
    else:
        flat = np.lib.stride_tricks.as_strided(x, (span,), (item,))
    if probe.dtype != "float32":
        flat = flat.view(np.uint16)
    return DeviceInput(flat, probe.kind, (b, h, d), probe.dtype, probe.lib), (sb, sh, d)


# ----------------------------------------------------------------------------- the rows hot path
# A repeated rmsnorm / rmsnorm_quantize / flatten_quantize call on the GPU with the same
# arguments (op, array types, shapes, dtypes, strides for flatten, scheme, eps, static scale,
# residual or not, dtype options, the current GPU, the build switches: the key) skips every
# check and plan: the first call validates on the general path and remembers a function that
# takes the arrays' addresses (refusing, for the general path, arrays on another GPU, not
# C-contiguous where the plan reads them so, or not 16-byte aligned), makes the call's one
# allocation of outputs and launches the planned sequence on the current stream of the
# caller's library (_CupyLib for CuPy arrays, _TorchLib for PyTorch tensors: results in that
# library; kernels.fused.rows_plan: the general path's kernel, grid and arguments, recorded
# once; a contiguous flatten on a GPU: nqdq.quantize's hot path, as its general path). No
# host copy, no wait for the device: fp8_tensor's static scales are filled on the stream
# (cuMemsetD32Async). Under the simulator, NumPy arrays with device="cuda" take it too
# (_SimulatedLib: the plan's replay), so CI runs it. A dict of at most _ROWS_FAST_MAX keys,
# the oldest dropped first (api.remember_bounded).
_ROWS_FAST: dict = {}
_ROWS_FAST_MAX = 256
_OP_Y, _OP_NORM_Q, _OP_FLAT = "rmsnorm", "rmsnorm_quantize", "flatten_quantize"  # the keys' first element
_device_now = None  # nqdq.gpu.runtime.devices.current, set by _remember_rows before any key is made
_rows_switches = None  # nqdq.gpu.fused.plan.rows_switches, set with it
_LIBS: dict = {}  # "cupy" / "simulated" -> the library adapter, made once


def _hot(key):
    """The remembered function of ``key``, or None (None or unhashable keys included)."""
    try:
        return _ROWS_FAST.get(key)
    except TypeError:  # an unhashable argument (a list for scale, ...)
        return None


def _norm_key(op, x, weight, residual, options, device, dtype, weight_dtype):
    """The hot path's key of an RMSNorm op (None for arguments without shapes and dtypes)."""
    try:
        return (op, device, type(x), x.shape, x.dtype, type(weight), weight.shape, weight.dtype,
                None if residual is None else (type(residual), residual.shape, residual.dtype), options, dtype,
                weight_dtype, _device_now(), _rows_switches())  # fmt: skip
    except AttributeError:
        return None


def _flat_key(x, scheme, device, dtype):
    """The hot path's key of flatten_quantize (x's strides included: they pick the kernel;
    a PyTorch tensor's ``stride()``, in elements)."""
    try:
        strides = x.stride() if callable(getattr(x, "stride", None)) else x.strides
        return (_OP_FLAT, device, type(x), x.shape, strides, x.dtype, scheme, dtype, _device_now(), _rows_switches())
    except AttributeError:
        return None


def _remember_rows(make_key, build):
    """Remember ``build()`` (a hot-path function, or None: nothing) under ``make_key()``."""
    global _device_now, _rows_switches
    from .api import remember_bounded
    from .gpu.runtime.devices import current
    from .gpu.fused.plan import rows_switches

    _device_now, _rows_switches = current, rows_switches
    key = make_key()
    try:
        if key is None or key in _ROWS_FAST:
            return
    except TypeError:  # an unhashable argument
        return
    fr = build()
    if fr is not None:
        remember_bounded(_ROWS_FAST, key, fr, _ROWS_FAST_MAX)


def _hot_lib(x, xin, device, *others):
    """The hot path's library adapter for this call (x and ``others``: the caller's own
    arrays, None or of x's type), or None: CuPy arrays and PyTorch CUDA tensors on a GPU;
    NumPy arrays with device="cuda" under the simulator."""
    from .gpu.runtime.interop import is_cupy
    from .gpu.runtime.target import SIMULATOR

    if any(a is not None and type(a) is not type(x) for a in others):
        return None
    if is_cupy(x) and hasattr(x, "_c_contiguous") and (xin is None or xin.lib == "cupy"):
        name = "cupy"
    elif _callers.caller_of(x).name == "torch" and getattr(x, "is_cuda", False):
        name = "torch"
    elif SIMULATOR and type(x) is np.ndarray and device in ("cuda", "gpu"):
        name = "simulated"
    else:
        return None
    lib = _LIBS.get(name)
    if lib is None:
        make = {"cupy": lambda: _CupyLib(sys.modules["cupy"]), "torch": lambda: _TorchLib(sys.modules["torch"]),
                "simulated": _SimulatedLib}[name]  # fmt: skip
        lib = _LIBS[name] = make()
    return lib


class _CupyLib:
    """CuPy arrays on a GPU, as the hot paths take and give them: an input by its device
    address; CuPy's current stream of the call's GPU; the outputs as arrays over one
    allocation a call (``alloc``: the one place the hot paths allocate, so that results in
    another library, PyTorch's or JAX's, change it and ``view`` alone)."""

    name = "cupy"
    compiled = True  # runs a RowsPlan's compiled sequence (raw addresses)

    def __init__(self, cp):
        from .gpu.runtime.interop import cupy_array_new

        self._malloc, self._nd, self._current = cp.cuda.alloc, cp.ndarray, cp.cuda.get_current_stream
        # arrays by ndarray's own __new__ + _init where that builds what the constructor does
        # (about 1 us less each: _interop.cupy_array_new, as nqdq.quantize's runners)
        self._new = cupy_array_new(cp, cp.cuda.alloc(256))

    def address(self, a, dev: int, contiguous: bool = True):
        """a's device address, or None where a planned launch cannot take a: on another GPU
        than ``dev``, not 16-byte aligned, not C-contiguous where ``contiguous``."""
        m = a.data
        p = m.ptr
        if m.device_id != dev or p & 15 or (contiguous and not a._c_contiguous):
            return None
        return p

    def stream(self, dev: int) -> int:
        return self._current(dev).ptr

    def alloc(self, nbytes: int, dev: int):
        """(owner, device address): a uint8 array of ``nbytes`` new bytes on GPU ``dev`` (the
        current one: the hot path's key holds it), the memory of every output of a call."""
        mem = self._malloc(nbytes)
        return self._array((nbytes,), _U8, mem), mem.ptr

    def view(self, owner, offset: int, shape, dtype):
        """An output: ``shape`` of ``dtype`` at ``offset`` bytes into ``owner``'s memory."""
        return self._array(shape, dtype, owner.data + offset if offset else owner.data)

    def _array(self, shape, dtype, memptr):
        new = self._new
        if new is None:
            return self._nd(shape, dtype, memptr)
        a = new(self._nd)
        a._init(shape, dtype, memptr)
        return a

    def fill32(self, base: int, offset: int, word: int, count: int, stream: int):
        _memset32(base + offset, word, count, stream)


_cu_memset32 = None  # libcuda's cuMemsetD32Async, loaded at the first fill


def _memset32(address: int, word: int, count: int, stream: int):
    """``count`` 32-bit words ``word`` at ``address``, in ``stream``'s order (a memset node
    under graph capture; no host copy)."""
    global _cu_memset32
    f = _cu_memset32
    if f is None:
        import ctypes

        f = ctypes.CDLL("libcuda.so.1").cuMemsetD32Async  # (CUdeviceptr, unsigned int, size_t, CUstream)
        f.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]
        f.restype = ctypes.c_int
        _cu_memset32 = f
    err = f(address, word, count, stream)
    if err:
        raise RuntimeError(f"cuMemsetD32Async of the static scales failed: CUresult {err}")


class _TorchLib:
    """PyTorch CUDA tensors, the twin of _CupyLib for a PyTorch caller: an input by
    ``data_ptr()``; PyTorch's current stream of the GPU; the outputs tensors over one
    ``torch.empty`` a call (PyTorch's caching allocator, on that stream), a bfloat16 x's new
    residual as ``torch.bfloat16`` (the one 16-bit output that holds bfloat16 bits)."""

    name = "torch"
    compiled = True

    def __init__(self, torch):
        self._empty, self._u8, self._device = torch.empty, torch.uint8, torch.device
        self._stream = _callers.TorchCaller(torch).stream
        self._devices: dict = {}
        self._dtypes = {np.dtype(np.uint8): torch.uint8, np.dtype(np.float32): torch.float32,
                        np.dtype(np.uint16): torch.bfloat16, np.dtype(np.float16): torch.float16}  # fmt: skip

    def address(self, a, dev: int, contiguous: bool = True):
        p = a.data_ptr()
        if a.get_device() != dev or p & 15 or (contiguous and not a.is_contiguous()):
            return None
        return p

    def stream(self, dev: int) -> int:
        return self._stream(dev)

    def alloc(self, nbytes: int, dev: int):
        d = self._devices.get(dev)
        if d is None:
            d = self._devices[dev] = self._device("cuda", dev)
        owner = self._empty(nbytes, dtype=self._u8, device=d)
        return owner, owner.data_ptr()

    def view(self, owner, offset: int, shape, dtype):
        n = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        part = owner if offset == 0 and n == owner.numel() else owner[offset : offset + n]
        return part.view(self._dtypes[dtype]).view(shape)

    def fill32(self, base: int, offset: int, word: int, count: int, stream: int):
        _memset32(base + offset, word, count, stream)


class _SimulatedLib:
    """NumPy arrays with device="cuda" under the CUDA simulator: the twin of _CupyLib that CI
    runs (an input is the array itself, the outputs views of one NumPy buffer)."""

    name = "simulated"
    compiled = False  # runs a RowsPlan's replay (arrays)

    def address(self, a, dev: int, contiguous: bool = True):
        if not a.dtype.isnative or (contiguous and not a.flags.c_contiguous):
            return None
        return a

    def stream(self, dev: int) -> int:
        return 0

    def alloc(self, nbytes: int, dev: int):
        owner = np.empty(nbytes, np.uint8)
        return owner, owner

    def view(self, owner, offset: int, shape, dtype):
        dt = np.dtype(dtype)
        return owner[offset : offset + dt.itemsize * int(np.prod(shape, dtype=np.int64))].view(dt).reshape(shape)

    def fill32(self, base, offset: int, word: int, count: int, stream: int):
        base[offset : offset + 4 * count].view(np.uint32)[:] = word


_U8 = np.dtype(np.uint8)


def _rows_runner(lib, plan, dev: int, parts, finish, contiguous: bool = True, static_word: int = 0):
    """``fr(x, w, r)`` -> ``finish(*outputs)``, or None where ``lib`` refuses an array (the
    general path then runs): ``plan``'s launch on the arrays' addresses, the outputs ``parts``
    ((plan output name, shape, dtype), in finish's order) views of the call's one allocation;
    the "static" output filled with ``static_word``. ``contiguous``: x must be C-contiguous
    (else a strided view, as the plan reads it)."""
    seq = plan.sequence if lib.compiled else plan.replay
    address, alloc, view, stream = lib.address, lib.alloc, lib.view, lib.stream
    total = plan.total
    views = tuple((plan.outputs[name][0], tuple(shape), np.dtype(dt)) for name, shape, dt in parts)
    static = plan.outputs.get("static")
    fill32 = lib.fill32

    def fr(x, w, r):
        xp = address(x, dev, contiguous)
        wp = 0 if w is None else address(w, dev)
        rp = 0 if r is None else address(r, dev)
        if xp is None or wp is None or rp is None:
            return None
        owner, base = alloc(total, dev)
        st = stream(dev)
        seq(st, xp, wp, rp, base)
        if static is not None:
            fill32(base, static[0], static_word, static[1], st)
        return finish(*[view(owner, off, shape, dt) for off, shape, dt in views])

    fr.plan = plan
    return fr


def _norm_runner(lib, xin, win, rin, sch, e, s, x):
    """The hot path of an RMSNorm op (rmsnorm where ``sch`` is None, else rmsnorm_quantize;
    ``s``: the static scales, or None) as its general path ran it, or None."""
    from .gpu.fused import kernels as fused_kernels
    from .gpu.fused.plan import rows_plan, rows_switches

    shape = tuple(xin.shape)
    rows, n = int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]
    words, word = 0, 0
    if s is not None:
        bits = np.ascontiguousarray(s, np.float32).reshape(-1).view(np.uint32)
        if bits.size == 0 or (bits != bits[0]).any():
            return None
        words, word = bits.size, int(bits[0])
    dev = _device_now()
    plan = rows_plan(dev, fused_kernels.OP_NORM, rows, n, xin.kind, win.kind, rin is not None, sch, sch is None, e,
                     None if s is None else np.float32(s.reshape(-1)[0]), None, words, rows_switches())  # fmt: skip
    if plan is None:
        return None
    res_part = [("newres", shape, _residual_dtype(xin.dtype, xin.lib, x))] if rin is not None else []
    if sch is None:
        parts = [("y", shape, np.float32)] + res_part
        return _rows_runner(lib, plan, dev, parts, _pair if rin is not None else _first)
    sshape = sch.scale_shape(shape)
    scales = ("static", sshape, np.float32) if s is not None else ("scales", sshape, plan.outputs["scales"][2])
    parts = [("codes", shape[:-1] + (plan.pcols,), np.uint8), scales] + res_part
    QT, dname = QuantizedTensor, xin.dtype

    if rin is None:
        def finish(codes, scales):
            return QT(codes, scales, sch, shape, dname, "linear")
    else:
        def finish(codes, scales, new_res):
            return QT(codes, scales, sch, shape, dname, "linear"), new_res

    return _rows_runner(lib, plan, dev, parts, finish, static_word=word)


def _first(a):
    return a


def _pair(a, b):
    return a, b


def _flat_rows_runner(lib, xin, strides, sch, q):
    """The hot path of flatten_quantize by the fused row kernel (``strides``: the [B, H, D]
    view's, read in place; None: contiguous), as its general path ran it (``q``), or None."""
    from .gpu.fused import kernels as fused_kernels
    from .gpu.fused.plan import rows_plan, rows_switches

    b, h, d = xin.shape
    shape = (b, h * d)
    dev = _device_now()
    plan = rows_plan(dev, fused_kernels.OP_ROWS, b, h * d, xin.kind, 0, False, sch, False, 0.0, None, strides, 0,
                     rows_switches())
    if plan is None:
        return None
    parts = [("codes", tuple(np.shape(q.codes)), np.uint8), ("scales", sch.scale_shape(shape), plan.outputs["scales"][2])]
    QT, dname = QuantizedTensor, xin.dtype

    def finish(codes, scales):
        return QT(codes, scales, sch, shape, dname, "linear")

    return _rows_runner(lib, plan, dev, parts, finish, contiguous=strides is None)


def _flat_plan_runner(x, sch, q, dtype):
    """The hot path of flatten_quantize of a C-contiguous CuPy [B, H, D]: the plan runner of
    nqdq.quantize on [B, H*D] (the same memory; it reads x's address alone), as the general
    path's nqdq.quantize call, or None."""
    from .gpu.quantize import plan as kq
    from .gpu.runtime.interop import device_input

    xin = device_input(x, "x", dtype)
    run = kq.get_plan(tuple(q.shape), xin.kind, sch).cupy_runner()
    if run is None:
        return None
    dev, shape, dname, QT = _device_now(), tuple(q.shape), q.dtype, QuantizedTensor

    def fr(x, w, r):
        if x.data.device_id != dev:
            return None
        c, s, z, t, m = run(x)
        return QT(c, s, sch, shape, dname, "linear", z, t, m)

    fr.run = run
    return fr


def _flat_quantize_runner(sch, shape, device, dtype):
    """The hot path of flatten_quantize of a contiguous PyTorch [B, H, D]: nqdq.quantize of
    the [B, H*D] view (its own PyTorch hot path), as the general path's call."""
    from .api import quantize

    def fr(x, w, r):
        return quantize(x.view(shape), sch, device=device, dtype=dtype)

    return fr


def moe_sort_quantize(x, expert_ids, num_experts, scheme="mxfp4", *, device=None, dtype=None, check_ids=True):
    """Gather the rows of x [T, H] in expert order and quantize them.

    ``expert_ids`` [T, k] (integers in [0, num_experts)): token t goes to experts
    expert_ids[t, :]. The T*k (token, slot) pairs are sorted stably by expert id, then token,
    then slot. Returns ``(q, perm, offsets)``: q quantizes the [T*k, H] gathered rows,
    perm[i] (int32) is the source token of sorted row i, and expert e's rows are
    offsets[e]:offsets[e+1] (int32, [E+1]); empty experts have equal offsets.

    An id outside [0, num_experts) is a ValueError naming ``expert_ids``. For ids already on
    the GPU (CuPy) that check is made by the sort kernels and read back, the one wait for the
    device: a repeated call waits for the sort only (the sort writes the result to pinned host
    memory, which the call polls), the first call for the whole op. ``check_ids=False`` skips the read
    (the call then never waits: the pairs with ids out of range sort after every expert, in
    (token, slot) order, as rows offsets[E]: of q and perm, so offsets[E] < T*k says so); a
    call on a stream capturing a CUDA graph must pass it (else RuntimeError).
    """
    if type(x) is _cupy_ndarray and type(expert_ids) is _cupy_ndarray and (device is None or device == "cuda"):
        key = _moe_key(x, expert_ids, num_experts, scheme, dtype)  # the hot path (_remember_moe)
        fm = _MOE_FAST.get(key)
        if (fm is not None and x._c_contiguous and expert_ids._c_contiguous and x.data.ptr % 16 == 0
                and expert_ids.data.device_id == key[0] == _current_gpu()):  # fmt: skip
            return fm(x, expert_ids, check_ids)
    return _moe_sort_quantize(x, expert_ids, num_experts, scheme, device, dtype, check_ids)


@_arrays.on_gpu_of("x", "expert_ids")
@_callers.in_caller_library("x", "expert_ids")
def _moe_sort_quantize(x, expert_ids, num_experts, scheme, device, dtype, check_ids):
    """moe_sort_quantize's general path, on the arrays' GPU (every check, the plan)."""
    sch = _scheme(scheme, None)
    if isinstance(num_experts, bool) or not isinstance(num_experts, (int, np.integer)) or num_experts < 1:
        raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
    num_experts = int(num_experts)
    ids_kind = getattr(getattr(expert_ids, "dtype", None), "kind", None)
    if ids_kind not in ("i", "u"):
        raise TypeError(f"expert_ids must be an integer array, got dtype {getattr(expert_ids, 'dtype', type(expert_ids).__name__)}")
    if getattr(expert_ids, "ndim", None) != 2:
        raise ValueError(f"expert_ids must be 2-D [tokens, k], got shape {getattr(expert_ids, 'shape', None)}")
    if not _arrays.use_device(x, device):
        x32, dname = _arrays.float_input(x, "x", dtype=dtype)
        ids = _arrays.host(expert_ids)
        _check_moe(x32.shape, ids.shape, ids.min() if ids.size else 0, ids.max() if ids.size else 0, num_experts)
        parts, perm, offsets = R.moe_sort_quantize(x32, ids, num_experts, sch)
        shape = (ids.size, x32.shape[1])
        return _qt(_pack(parts.codes, sch), parts.scales, sch, shape, dname), perm, offsets
    from .gpu.runtime.interop import device_input, is_cupy
    from .gpu.fused.plan import moe_rows

    xin = device_input(x, "x", dtype)
    if len(xin.shape) != 2:
        raise ValueError(f"x must be 2-D [tokens, hidden], got shape {xin.shape}")
    from .gpu.runtime.interop import Allocator
    from .gpu.runtime.target import SIMULATOR

    alloc = Allocator(xin.lib)
    on_device = is_cupy(expert_ids)
    if on_device:  # range-checked by the sort kernels (no min / max here: each would wait for the device)
        ids = _device_ids(expert_ids).reshape(-1)
        lo, hi = 0, 0
    else:
        ids = np.ascontiguousarray(_arrays.host(expert_ids)).reshape(-1)
        lo, hi = (int(ids.min()), int(ids.max())) if ids.size else (0, 0)
        ids = ids.astype(np.int32)  # in [0, E) once checked
        if not SIMULATOR:
            ids = _to_device(ids, alloc)
    _check_moe(xin.shape, tuple(expert_ids.shape), lo, hi, num_experts)
    tk = int(np.prod(expert_ids.shape))
    if on_device and check_ids and tk > 0 and not SIMULATOR and _capturing_now():
        raise RuntimeError(_CHECK_CAPTURED)
    k = int(expert_ids.shape[1])
    shape = (tk, xin.shape[1])
    sch.check_shape(shape)
    out, perm, offsets, _, _ = moe_rows(xin, ids, tk, k, num_experts, sch, alloc)
    q = _finish(out, sch, shape, xin)
    if on_device and check_ids and tk > 0 and int(_arrays.host(offsets[num_experts : num_experts + 1])[0]) != tk:
        raise ValueError(f"expert_ids must lie in [0, {num_experts}): some of the {tk} ids on the device do not")
    if on_device:
        _remember_moe(x, expert_ids, num_experts, scheme, dtype, xin, sch)
    return q, alloc.to_lib(perm, (tk,)), alloc.to_lib(offsets[: num_experts + 1], (num_experts + 1,))


# ----------------------------------------------------------------------------- the MoE hot path
# A repeated moe_sort_quantize with C-contiguous CuPy x (16-byte aligned) and int32 / int64
# CuPy ids of the same shapes, dtypes and arguments skips every check and plan: the first call
# validates on the general path and remembers a function that allocates once and launches the
# planned kernels (kernels.fused.moe_plan: the sort's one or three, then the rows). Where
# check_ids, it polls the word of pinned memory the sort writes its id check to
# (kernels.fused.IdChecks), or (the local path) reads offsets[E] back. Keyed also by the MoE
# launcher's switches (kernels.fused.moe_switches), so a benchmark's A/B of them is seen (as
# nqdq.quantize's fast path, a dict of at most _MOE_FAST_MAX keys, the oldest dropped first).
_MOE_FAST: dict = {}
_MOE_FAST_MAX = 64
_cupy_ndarray = None  # cupy.ndarray once a CuPy input reached the hot path's builder
_current_gpu = None  # cupy.cuda.runtime.getDevice, set with _cupy_ndarray
_KF = None  # nqdq.gpu.fused.plan, set by _remember_moe before any hot call can come


def _moe_key(x, ids, num_experts, scheme, dtype):
    """The hot path's key: x's GPU (first), the call's shapes, dtypes and arguments, then
    (last) the build switches moe_plan takes."""
    try:
        return (x.data.device_id, x.shape, x.dtype.char, ids.shape, ids.dtype.char, num_experts, scheme, dtype,
                _KF.moe_switches())
    except TypeError:  # an unhashable scheme argument
        return None


def _remember_moe(x, expert_ids, num_experts, scheme, dtype, xin, sch):
    global _cupy_ndarray, _current_gpu, _KF
    from .api import remember_bounded
    from .gpu.fused import plan as KF
    from .gpu.runtime.interop import is_cupy

    if not (is_cupy(x) and is_cupy(expert_ids) and hasattr(x, "_c_contiguous")) or xin.lib != "cupy":
        return
    if not _ids_as_they_are(expert_ids.dtype):
        return
    _KF = KF
    key = _moe_key(x, expert_ids, num_experts, scheme, dtype)
    if key is None or key in _MOE_FAST:  # (remembered: this call went the general way for x's layout)
        return
    tokens, hidden = (int(v) for v in xin.shape)
    k = int(expert_ids.shape[1])
    run = KF.moe_plan(key[0], tokens, hidden, k, num_experts, xin.kind, xin.dtype, expert_ids.dtype.char, sch,
                      key[-1])  # fmt: skip
    if run is None:
        return
    _current_gpu = sys.modules["cupy"].cuda.runtime.getDevice
    _cupy_ndarray = type(x)
    tk, E, shape, dname = tokens * k, num_experts, (tokens * k, hidden), xin.dtype

    import cupy

    from .gpu.quantize.runners import capture_test

    checks = KF.id_checks(cupy) if run.seq_check is not None else None
    capturing, current, dev = capture_test(cupy), cupy.cuda.get_current_stream, key[0]  # (x's GPU: current in fm)

    def fm(x, ids, check_ids):
        if not check_ids:
            codes, scales, perm, offsets = run(x, ids)
            return _qt(codes, scales, sch, shape, dname), perm, offsets
        st = current(dev)
        if capturing(st.ptr):
            raise RuntimeError(_CHECK_CAPTURED)
        if checks is not None:  # wait for the sort's id check, not for the rows
            i, flag = checks.take()
            codes, scales, perm, offsets = run(x, ids, flag)
            ok = checks.wait(i, st)
        else:
            codes, scales, perm, offsets = run(x, ids)
            ok = int(offsets[E : E + 1].get()[0]) == tk
        if not ok:
            raise ValueError(f"expert_ids must lie in [0, {E}): some of the {tk} ids on the device do not")
        return _qt(codes, scales, sch, shape, dname), perm, offsets

    fm.run = run
    remember_bounded(_MOE_FAST, key, fm, _MOE_FAST_MAX)


_CHECK_CAPTURED = ("moe_sort_quantize(check_ids=True) waits for the device's check of expert_ids, which a "
                   "stream capturing a CUDA graph cannot do: pass check_ids=False (offsets[E] < T*k then "
                   "says that some ids were out of range)")


def _capturing_now() -> bool:
    """Whether CuPy's current stream is capturing a CUDA graph."""
    import cupy

    from .gpu.quantize.runners import capture_test

    return capture_test(cupy)(cupy.cuda.get_current_stream().ptr)


def _ids_as_they_are(dt) -> bool:
    """Whether the sort kernels read CuPy ids of dtype ``dt`` as they are (int32, int64)."""
    return dt.kind == "i" and dt.itemsize in (4, 8)


def _device_ids(ids):
    """CuPy expert ids as the sort kernels read them, every value kept (so one out of range
    stays out of range): int32 / int64 as they are, narrower integers as int32, uint32 and
    uint64 as int64 (a uint64 past 2^63 turns negative: still out of range)."""
    if _ids_as_they_are(ids.dtype):
        return ids
    return ids.astype(np.int32 if ids.dtype.itemsize < 4 else np.int64)


def _check_moe(xshape, idshape, lo, hi, num_experts):
    if len(xshape) != 2:
        raise ValueError(f"x must be 2-D [tokens, hidden], got shape {tuple(xshape)}")
    if idshape[0] != xshape[0]:
        raise ValueError(f"expert_ids has {idshape[0]} rows but x has {xshape[0]} tokens")
    if lo < 0 or hi >= num_experts:
        raise ValueError(f"expert_ids must lie in [0, {num_experts}), got values in [{lo}, {hi}]")
