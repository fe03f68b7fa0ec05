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
(one allocation, one planned launch on the current stream, no wait for the device).

Where each part lives: here the row ops (rmsnorm, rmsnorm_quantize, flatten_quantize), each
a public function (its hot check) and its general path (every check; the host reference or
the kernels); ``_rows_hot`` their hot path (the remembered calls, the array libraries'
adapters); ``_moe`` moe_sort_quantize with its own hot path; ``_common`` the argument checks
and result assembly they share. The launchers: ``nqdq.gpu.fused.plan`` (the row kernel) and
``nqdq.gpu.fused.moe`` (the MoE sort); the spec: ``nqdq.reference.fused``.
"""

from __future__ import annotations

import numpy as np

from .. import _arrays
from ..gpu.runtime import callers as _callers
from ..reference import fused as R
from . import _moe
from ._common import _device_rows, _eps, _finish, _host_rows, _pack, _qt, _residual_out, _scheme
from ._moe import moe_sort_quantize
from ._rows_hot import (_OP_NORM_Q, _OP_Y, _ROWS_FAST, _flat_key, _flat_plan_runner, _flat_quantize_runner,
                        _flat_rows_runner, _hot, _hot_lib, _norm_key, _norm_runner, _remember_rows)

__all__ = ["rmsnorm", "rmsnorm_quantize", "flatten_quantize", "moe_sort_quantize"]


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
    from ..gpu.fused import kernels as fused_kernels
    from ..gpu.fused.plan import run_rows

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
    from ..gpu.fused import kernels as fused_kernels
    from ..gpu.fused.plan import run_rows

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
    from ..gpu.fused import kernels as fused_kernels
    from ..gpu.fused.plan import run_rows

    if getattr(x, "ndim", None) != 3:
        raise ValueError(f"x must be 3-D [B, H, D], got shape {getattr(x, 'shape', None)}")
    from ..gpu.runtime.target import SIMULATOR

    if not SIMULATOR and _c_contiguous(x):
        # a contiguous [B, H, D] is already [B, H*D] in memory: nqdq.quantize's row kernels
        # (the same spec) are faster than the fused row kernel on it (H100, bf16 [8192, 7168],
        # as measured when this route was chosen: 74.0 / 95.4 us to fp8_1x128 / mxfp4 against
        # 176-181 us)
        from ..api import quantize

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
    from ..gpu.runtime.interop import DeviceInput, device_input, is_cupy
    from ..gpu.runtime.target import SIMULATOR

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


def clear_hot_path():
    """Forget the remembered GPU calls of every fused op (api.clear_fast_path)."""
    _ROWS_FAST.clear()
    _moe._MOE_FAST.clear()
