"""Argument checking for arrays and dtypes, shared by the API functions.

Every error names the argument it is about.
"""

from __future__ import annotations

import functools
import inspect

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_FLOAT_INPUTS = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16", BFLOAT16: "bfloat16"}
_DTYPE_NAMES = {"float32": np.float32, "float16": np.float16, "bfloat16": BFLOAT16, "float64": np.float64}


def host(a):
    """A NumPy view of ``a`` (CuPy arrays are copied to the host); None stays None."""
    if a is None or isinstance(a, np.ndarray):
        return a
    if hasattr(a, "get") and hasattr(a, "__cuda_array_interface__"):
        return a.get()
    return np.asarray(a)


def float_input(x, argname: str, *, allow_float64: bool = False, dtype=None):
    """Return ``(x as float32 ndarray, original dtype name)``; float16/bfloat16 convert
    exactly. float64 is kept as float64 when ``allow_float64`` (for exact encoding).
    ``dtype="bfloat16"``/``"float16"`` reads a uint16 array as the bits of that type."""
    if dtype is not None and isinstance(x, np.ndarray):
        want = float_dtype(dtype, "dtype")
        if x.dtype in (np.uint16, np.int16) and want.itemsize == 2:
            x = x.view(want)
        elif x.dtype != want:
            raise TypeError(f"dtype={dtype!r} does not match {argname}.dtype={x.dtype}")
    if hasattr(x, "__cuda_array_interface__") and not isinstance(x, np.ndarray):
        raise TypeError(
            f"{argname} is a GPU array; this function runs on the host: "
            f"pass {argname}.get() (CuPy) or a NumPy array"
        )
    if not isinstance(x, np.ndarray):
        if isinstance(x, (list, tuple, float, int)):
            x = np.asarray(x)
        elif hasattr(x, "__dlpack__"):  # a PyTorch / JAX array in host memory
            lib = type(x).__module__.split(".")[0]
            raise TypeError(
                f"{argname} is a {lib} array in host memory; nqdq runs the kernels on GPU arrays and the NumPy "
                f"reference on NumPy arrays: move {argname} to the GPU, or pass np.asarray({argname}) "
                "(results then come back as NumPy arrays)"
            )
        else:
            raise TypeError(f"{argname} must be a NumPy array, got {type(x).__name__}")
    if x.dtype.kind == "f" and not x.dtype.isnative:  # e.g. a big-endian .npy
        x = x.astype(x.dtype.newbyteorder("="))
    dt = x.dtype
    if dt == np.float64 and allow_float64:
        return x, "float64"
    if dt in _FLOAT_INPUTS:
        return x.astype(np.float32), _FLOAT_INPUTS[dt]
    if dt == np.float64:
        raise TypeError(
            f"{argname} has dtype float64; nqdq quantizes float32, float16 and bfloat16 "
            f"(pass {argname}.astype(np.float32); nqdq.encode accepts float64 directly)"
        )
    kind = {"i": "integer", "u": "unsigned integer", "b": "boolean", "c": "complex"}.get(dt.kind, str(dt))
    raise TypeError(f"{argname} has {kind} dtype {dt}; expected float32, float16 or bfloat16")


def float_dtype(dtype, argname: str, *, allow_float64: bool = False) -> np.dtype:
    """Parse an output dtype: float32, float16 or bfloat16 (names or dtype objects)."""
    try:
        dt = np.dtype(_DTYPE_NAMES.get(dtype, dtype)) if isinstance(dtype, str) else np.dtype(dtype)
    except TypeError:
        dt = None
    ok = set(_FLOAT_INPUTS) | ({np.dtype(np.float64)} if allow_float64 else set())
    if dt not in ok:
        names = ", ".join(sorted(_FLOAT_INPUTS.values()) + (["float64"] if allow_float64 else []))
        raise TypeError(f"{argname}={dtype!r} is not one of {names}")
    return dt


def check_device(device):
    if device not in (None, "cpu", "cuda", "gpu"):
        raise ValueError(f"device={device!r} is not one of None, 'cpu', 'cuda'")


def is_device_array(a) -> bool:
    """True for GPU arrays: ``__cuda_array_interface__`` or a CUDA DLPack device."""
    if a is None or isinstance(a, np.ndarray):
        return False
    try:
        a.__cuda_array_interface__  # PyTorch raises TypeError here for bfloat16
        return True
    except Exception:
        pass
    dev = getattr(a, "__dlpack_device__", None)
    try:
        return dev is not None and int(dev()[0]) in (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
    except Exception:
        return False


def use_device(x, device, argname: str = "x") -> bool:
    """Whether to run on the GPU kernels: GPU arrays by default, anything with device='cuda'."""
    check_device(device)
    if device == "cpu":
        if is_device_array(x):
            raise ValueError(f"{argname} is a GPU array but device='cpu'; copy it to the host first (e.g. {argname}.get())")
        return False
    return device in ("cuda", "gpu") or is_device_array(x)


def on_gpu_of(*names):
    """Decorator: a call whose named arguments hold GPU arrays runs with their GPU current
    (``nqdq.gpu.runtime.devices.guard``: kernels, outputs and stream on the arrays' device; a
    ValueError where two are on different GPUs). A name may reach into an argument by
    attribute, ``"q.codes"``. Host arrays: the call as it is."""

    def deco(fn):
        params = list(inspect.signature(fn).parameters)
        where = []
        for name in names:
            arg, _, attr = name.partition(".")
            where.append((name, params.index(arg), arg, attr))

        @functools.wraps(fn)
        def call(*args, **kwargs):
            named = []
            for name, i, arg, attr in where:
                a = args[i] if i < len(args) else kwargs.get(arg)
                if attr:
                    a = getattr(a, attr, None)
                if is_device_array(a):
                    named.append((name, a))
            if not named:
                return fn(*args, **kwargs)
            from .gpu.runtime.devices import guard

            with guard(*named):
                return fn(*args, **kwargs)

        return call

    return deco


def device_astype(values, dtype):
    """float32 GPU values as ``dtype``: float16 through the array's astype, bfloat16 as its
    uint16 bits (round to nearest even), in the values' library."""
    dt = np.dtype(dtype)
    if dt == np.float32:
        return values
    if dt == BFLOAT16:
        if isinstance(values, np.ndarray):
            return values.astype(BFLOAT16)
        from .gpu.quantize.plan import to_bfloat16_bits

        return to_bfloat16_bits(values)
    return values.astype(dt)


def static_scale(scale, scale_shape):
    """Check caller-given scales: float32-representable, positive and finite, broadcastable."""
    s = np.asarray(host(scale))
    if s.dtype.kind not in "fiu":
        raise TypeError(f"scale must be a real number or array, got dtype {s.dtype}")
    s = s.astype(np.float32)
    try:
        s = np.broadcast_to(s, scale_shape)
    except ValueError:
        raise ValueError(f"scale with shape {s.shape} does not broadcast to the scale shape {scale_shape}") from None
    if not (np.isfinite(s).all() and (s > 0).all()):
        raise ValueError("scale must be positive and finite")
    return s
