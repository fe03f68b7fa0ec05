"""What the fused ops share: argument checks, reading the inputs (NumPy on the host, arrays
on the GPU) and assembling the results (:class:`~nqdq.quantized.QuantizedTensor`, the new
residual in the input's form)."""

from __future__ import annotations

import numpy as np

from .. import _arrays
from ..quantized import QuantizedTensor
from ..reference.packing import pack_codes
from ..schemes import resolve_scheme


# ----------------------------------------------------------------------------- argument checks, inputs
def _eps(eps) -> np.float32:
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating, np.integer)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    e = np.float32(eps)
    if not (np.isfinite(e) and e > 0):
        raise ValueError(f"eps must be positive and finite in float32, got {eps!r}")
    return e


def _scheme(scheme, scale):
    from ..gpu.fused.plan import out_kind

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
    from ..gpu.runtime.interop import device_input

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


# ----------------------------------------------------------------------------- the kernels' outputs as results
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
    from ..gpu.runtime.backend import cuda

    return cuda.to_device(host)
