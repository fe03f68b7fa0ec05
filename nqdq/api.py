"""The public API: quantize, dequantize, encode, decode. Thin: it checks arguments, picks a
backend and wraps the result; the numerics live in ``nqdq.reference`` (and the kernels)."""

from __future__ import annotations

import sys

import numpy as np

from . import _arrays
from .formats import FloatFormat, IntFormat, ScaleFormat, get_format
from .quantized import QuantizedTensor
from .reference import codec
from .reference import quantize as ref
from .reference.layouts import LAYOUTS, scale_matrix_shape
from .reference.packing import pack_codes, unpack_codes
from .schemes import resolve_scheme

__all__ = ["quantize", "dequantize", "encode", "decode"]

_ROUNDINGS = ("nearest", "stochastic")
_LAYOUTS = LAYOUTS  # the one list of scale layout names (nqdq.reference.layouts)
_NONFINITE = ("propagate", "raise")


def quantize(
    x,
    scheme,
    *,
    granularity=None,
    axis=-1,
    group_size=None,
    block_shape=None,
    scale=None,
    symmetric=None,
    scale_rounding=None,
    rounding="nearest",
    seed=None,
    scale_layout="linear",
    device=None,
    nonfinite="propagate",
    dtype=None,
) -> QuantizedTensor:
    """Quantize a float32 / float16 / bfloat16 array.

    Parameters
    ----------
    x : array of float32, float16 or ml_dtypes.bfloat16, at least 1-D.
    scheme : a preset (``"mxfp4"``, ``"nvfp4"``, ``"fp8_1x128"``, ...) or an element format
        (``"e4m3"``, ``"int8"``, ...); see :func:`nqdq.schemes`.
    granularity : ``"tensor" | "row" | "column" | "group" | "block"`` for element formats.
    axis : the axis a row / group runs along, or the channel axis of ``"column"``.
    group_size, block_shape : group length (default 128) and tile (default 128x128).
    scale : static float32 scales (dequantization scales, ``x ~ code * scale``), a scalar
        or an array broadcastable to the scale shape; computed from the data when None.
    symmetric : False for integer formats with zero points (uint codes); None (default)
        means the scheme's own choice: True, except for the ``*_asym`` presets.
    scale_rounding : MX schemes: ``"rceil"`` (default), ``"floor"`` or ``"even"``.
    rounding : ``"nearest"`` (to even) or ``"stochastic"`` (needs ``seed``).
    scale_layout : ``"linear"`` (``scheme.scale_shape(x.shape)``, row-major), or for the MX
        and NVFP4 schemes a tensor-core layout of the 2-D scale matrix ``[rows, K/block]``
        (leading axes of ``x`` flattened into rows; zero-padded to whole tiles):
        ``"nv_128x4"`` (cuBLASLt / sm_100 ``tcgen05.mma`` block scales,
        ``[R/128, C/4, 32, 4, 4]``), ``"cdna4_16"`` / ``"cdna4_32"`` (gfx950
        ``v_mfma_scale_f32_{16x16x128,32x32x64}_f8f6f4`` preshuffle, ``[R/32, C*32]``).
        See ``nqdq.reference.layouts``; ``q.with_layout(name)`` converts.
    device : None (GPU arrays run on the GPU, NumPy arrays on the CPU), ``"cpu"`` (the NumPy
        reference) or ``"cuda"`` (the kernels; NumPy input is copied to the GPU and back, or
        runs in Numba's CUDA simulator under NUMBA_ENABLE_CUDASIM=1).
    nonfinite : ``"propagate"`` (a NaN/inf makes its scale group NaN) or ``"raise"``.
    dtype : ``"bfloat16"`` / ``"float16"`` to read a uint16 array as the bits of that type
        (CuPy has no bfloat16 dtype); None reads ``x.dtype``.

    GPU arrays (CuPy, ``__cuda_array_interface__``, CUDA DLPack) stay on the GPU: the result
    holds arrays of the same library (CuPy when installed), on the GPU that holds ``x``
    (whichever device is current; the call leaves the current device as it was).
    """
    if type(x) is _cupy_ndarray and scale is None and seed is None and (device is None or device == "cuda"):
        # the hot path: a repeated call with a CuPy array on the current GPU (see _fast_quantizer)
        try:
            key = (scheme, granularity, axis, group_size, block_shape, symmetric, scale_rounding, rounding,
                   scale_layout, nonfinite, dtype, x.shape, x.dtype.char, x.data.device_id)  # fmt: skip
            fq = _FAST.get(key)
        except TypeError:  # an unhashable argument (a list for block_shape, ...)
            fq = None
        if fq is not None and x._c_contiguous and _current_gpu() == key[-1]:
            return fq(x)
    return _quantize(x, scheme, granularity, axis, group_size, block_shape, scale, symmetric, scale_rounding, rounding,
                     seed, scale_layout, device, nonfinite, dtype)  # fmt: skip


@_arrays.on_gpu_of("x")
def _quantize(x, scheme, granularity, axis, group_size, block_shape, scale, symmetric, scale_rounding, rounding, seed,
              scale_layout, device, nonfinite, dtype):  # fmt: skip
    """quantize's general path, on x's GPU where x is a GPU array (every check, the plan)."""
    on_device = _arrays.use_device(x, device)
    if on_device:
        from .kernels import quantize as kq
        from .kernels._interop import device_input

        xdev = device_input(x, "x", dtype)
        shape, dtype_name = tuple(xdev.shape), xdev.dtype
    else:
        x32, dtype_name = _arrays.float_input(x, "x", dtype=dtype)
        shape = tuple(x32.shape)
    if rounding not in _ROUNDINGS:
        raise ValueError(f"rounding={rounding!r} is not one of {_ROUNDINGS}")
    if rounding == "stochastic":
        if seed is None:
            raise ValueError("rounding='stochastic' needs seed=<int> (results are deterministic for a seed)")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**64:
            raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
    elif seed is not None:
        raise ValueError("seed is only used with rounding='stochastic'")
    if scale_layout not in _LAYOUTS:
        raise ValueError(f"scale_layout={scale_layout!r} is not one of {_LAYOUTS}")
    if nonfinite not in _NONFINITE:
        raise ValueError(f"nonfinite={nonfinite!r} is not one of {_NONFINITE}")

    sch = resolve_scheme(
        scheme,
        granularity=granularity,
        axis=axis,
        group_size=group_size,
        block_shape=block_shape,
        symmetric=symmetric,
        scale_rounding=scale_rounding,
        static_scale=scale is not None,
    )
    sch.check_shape(shape)
    if scale_layout != "linear":
        scale_matrix_shape(sch, shape, scale_layout)  # ValueError if the layout does not apply
    if scale is not None:
        scale = _arrays.static_scale(scale, sch.scale_shape(shape))
    if nonfinite == "raise" and (kq.has_nonfinite(xdev) if on_device else not np.isfinite(x32).all()):
        raise ValueError("x contains NaN or inf and nonfinite='raise'")

    seed = None if rounding == "nearest" else int(seed)
    if on_device and seed is None and scale is None and nonfinite == "propagate" and xdev.lib == "cupy" and scale_layout == "linear":
        fq = _fast_quantizer(x, sch, shape, dtype_name, xdev.kind)
        if fq is not None:
            try:
                _remember(
                    (scheme, granularity, axis, group_size, block_shape, symmetric, scale_rounding, rounding,
                     scale_layout, nonfinite, dtype, x.shape, x.dtype.char, x.data.device_id),
                    fq,
                )  # fmt: skip
            except TypeError:
                pass
            return fq(xdev.arr)
    if on_device:
        parts = kq.quantize(xdev, sch, scale=scale, seed=seed)  # codes come back packed
        codes = parts.codes
    else:
        parts = ref.quantize(x32, sch, scale=scale, seed=seed)
        codes = parts.codes
        if sch.code_bits < 8:
            codes = pack_codes(codes, sch.code_bits)
    q = QuantizedTensor(
        codes=codes,
        scales=parts.scales,
        scheme=sch,
        shape=shape,
        dtype=dtype_name,
        scale_layout="linear",
        zero_points=parts.zero_points,
        tensor_scale=parts.tensor_scale,
        means=parts.means,
    )
    return q if scale_layout == "linear" else q.with_layout(scale_layout)  # swizzled after quantizing


# ----------------------------------------------------------------------------- the GPU hot path
# A repeated nqdq.quantize call with a C-contiguous CuPy array and the same arguments
# (scheme options, shape, dtype, the array's GPU, which must be the current one: the
# remembered function allocates and launches there) skips every check and plan: the first call validates
# the arguments on the general path, and when the result needs no per-call host work
# (no static scale, no stochastic rounding, nonfinite="propagate") remembers a function
# that only allocates the outputs and launches the planned kernels
# (nqdq.kernels.quantize.QuantPlan.cupy_runner). A dict of at most _FAST_MAX keys, the
# oldest remembered dropped first: not an LRU, because moving each hit to the end of an
# OrderedDict cost about 0.2 us per call (a dropped key that comes back goes through the
# checks once more and finds its plan in nqdq.kernels.quantize's plan cache).
_FAST: dict = None  # set below
_FAST_MAX = 256
_cupy_ndarray = None  # cupy.ndarray once a CuPy input was seen (nqdq never imports CuPy itself)
_current_gpu = None  # cupy.cuda.runtime.getDevice, set with _cupy_ndarray


def _fast_quantizer(x, sch, shape, dtype_name, kind):
    """``fq(x) -> QuantizedTensor`` for this call's arguments, or None."""
    global _cupy_ndarray, _current_gpu
    from .kernels import quantize as kq
    from .kernels._interop import is_cupy

    if not is_cupy(x) or not hasattr(x, "_c_contiguous"):
        return None
    run = kq.get_plan(shape, kind, sch).cupy_runner()
    if run is None:
        return None
    if _cupy_ndarray is None:
        _current_gpu = sys.modules["cupy"].cuda.runtime.getDevice
        _cupy_ndarray = type(x)
    QT = QuantizedTensor

    def fq(x):
        c, s, z, t, m = run(x)
        return QT(c, s, sch, shape, dtype_name, "linear", z, t, m)

    fq.run = run
    return fq


def _remember(key, fq):
    remember_bounded(_FAST, key, fq, _FAST_MAX)


def remember_bounded(cache: dict, key, value, limit: int):
    """cache[key] = value, then the oldest keys dropped past ``limit`` (the GPU hot paths'
    caches: nqdq.quantize's here, nqdq.fused.moe_sort_quantize's)."""
    hash(key)
    cache[key] = value
    while len(cache) > limit:
        try:
            del cache[next(iter(cache))]  # dicts keep insertion order: the oldest
        except (KeyError, StopIteration, RuntimeError):  # another thread changed it meanwhile
            break


def clear_fast_path():
    """Forget the remembered GPU calls (tests; after changing NQDQ_FAST_LAUNCH): nqdq.quantize's
    and nqdq.fused.moe_sort_quantize's."""
    from . import fused

    _FAST.clear()
    fused._MOE_FAST.clear()


@_arrays.on_gpu_of("q.codes")
def dequantize(q: QuantizedTensor, dtype=np.float32, *, device=None):
    """Decode ``q`` to ``dtype`` (float32, float16 or bfloat16): values are computed in
    float32, then rounded to ``dtype`` (nearest even). A ``q`` holding GPU arrays (or
    ``device="cuda"``) decodes on the GPU into the same array library; bfloat16 comes back
    as its uint16 bits there (CuPy has no bfloat16 dtype)."""
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"q must be a QuantizedTensor (from nqdq.quantize or nqdq.load), got {type(q).__name__}")
    q.check_arrays("q")  # shapes, dtypes, presence: the kernels index with the implied shapes
    out_dtype = _arrays.float_dtype(dtype, "dtype")
    if q.scale_layout not in _LAYOUTS:
        raise ValueError(f"q.scale_layout={q.scale_layout!r} is not one of {_LAYOUTS}")
    if q.scale_layout != "linear":
        q = q.with_layout("linear")  # the decoders read linear scales
    sch = q.scheme
    if _arrays.use_device(q.codes, device, argname="q.codes"):
        from .kernels import quantize as kq

        parts = ref.QuantParts(q.codes, q.scales, q.zero_points, q.tensor_scale, q.means)
        return _arrays.device_astype(kq.dequantize(parts, sch, tuple(q.shape)), out_dtype)
    codes = q.unpacked_codes()
    parts = ref.QuantParts(
        codes=codes,
        scales=_arrays.host(q.scales),
        zero_points=_arrays.host(q.zero_points),
        tensor_scale=_arrays.host(q.tensor_scale),
        means=_arrays.host(q.means),
    )
    if codes.shape != tuple(q.shape):
        raise ValueError(f"q.codes unpack to shape {codes.shape}, but q.shape is {tuple(q.shape)}")
    return ref.dequantize(parts, sch, tuple(q.shape)).astype(out_dtype)


def encode(x, fmt, *, saturate=True, packed=True):
    """Element codes of ``x`` in ``fmt`` (uint8; int8 for ``"int8"``), round-to-nearest-even.

    For float16 / bfloat16 / float32 inputs, float formats equal ``x.astype(ml_dtypes.<fmt>)``
    bit for bit when ``saturate=False``; with ``saturate=True`` (default) finite overflow
    and +-inf become +-max instead of inf/NaN. float64 inputs are rounded once, directly
    (ml_dtypes 0.6 rounds float64 through float32, so near a tie it can differ).
    Integer formats round to nearest even and always saturate to ``[-2^(b-1), 2^(b-1) - 1]``.
    Scale formats: ``"e8m0"`` (as ml_dtypes' float8_e8m0fnu cast) and ``"ue4m3"`` (e4m3fn of
    a non-negative value; -0.0 and NaN of either sign encode as 0x00 / 0x7F). 4- and 6-bit
    codes are packed along the last axis when ``packed`` (see ``nqdq.reference.packing``).
    """
    f = get_format(fmt)
    xs, _ = _arrays.float_input(x, "x", allow_float64=True)
    if isinstance(f, ScaleFormat):
        if f.name == "ue4m3":
            if (xs < 0).any():
                raise ValueError("x has negative values, but ue4m3 codes are unsigned")
            return codec.encode_float(np.abs(xs), get_format("e4m3"), saturate=saturate)
        if f.name == "e8m0":
            return codec.encode_e8m0(xs)
        raise ValueError(f"fmt={fmt!r} is not an encodable format")
    xs, _ = _arrays.float_input(x, "x", allow_float64=True)
    if isinstance(f, FloatFormat):
        codes = codec.encode_float(xs, f, saturate=saturate)
    else:
        if not saturate:
            raise ValueError(f"saturate=False is not available for {f.name}: integer codes always saturate")
        lo, hi = -(1 << (f.bits - 1)), (1 << (f.bits - 1)) - 1
        v = np.clip(xs, lo, hi)
        codes = np.rint(np.where(np.isnan(v), 0, v)).astype(np.int8)
    if packed and f.bits < 8:
        return pack_codes(codes, f.bits)
    return codes


def decode(codes, fmt, *, packed=True, dtype=np.float32, length=None):
    """Values of ``fmt`` codes as ``dtype``. Packed 4/6-bit ``codes`` unpack along the last
    axis to ``length`` elements (default: every slot, including any padding)."""
    f = get_format(fmt)
    out_dtype = _arrays.float_dtype(dtype, "dtype", allow_float64=True)
    c = _arrays.host(codes)
    if not isinstance(c, np.ndarray) or c.dtype not in (np.uint8, np.int8):
        raise TypeError(f"codes must be a uint8 or int8 array, got {getattr(c, 'dtype', type(c).__name__)}")
    if c.ndim == 0 and packed and f.bits < 8:
        raise ValueError("packed codes need at least one dimension")
    if packed and f.bits < 8:
        per, nbytes = (2, 1) if f.bits == 4 else (4, 3)
        if c.shape[-1] % nbytes:
            raise ValueError(f"codes: packed {f.bits}-bit codes come in groups of {nbytes} bytes, got {c.shape[-1]} bytes")
        slots = c.shape[-1] // nbytes * per
        if length is None:
            length = slots
        elif isinstance(length, bool) or not isinstance(length, (int, np.integer)) or not 0 <= length <= slots:
            raise ValueError(f"length={length!r} must be an int in [0, {slots}] for {c.shape[-1]} packed bytes")
        c = unpack_codes(c, f.bits, int(length))
    elif length is not None:
        raise ValueError("length is only used with packed 4/6-bit codes")
    if isinstance(f, FloatFormat):
        return codec.decode_float(c, f).astype(out_dtype)
    if isinstance(f, IntFormat):
        return codec.decode_int(c, f, symmetric=True).astype(out_dtype)
    if f.name == "e8m0":
        return codec.decode_e8m0(c).astype(out_dtype)
    if f.name == "ue4m3":
        return codec.decode_float(c, get_format("e4m3")).astype(out_dtype)
    raise ValueError(f"fmt={fmt!r} has no codes to decode")


_FAST = {}
