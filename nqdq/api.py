"""The public API: quantize, dequantize, encode, decode. Thin: it checks arguments, picks a
backend and wraps the result; the numerics live in ``nqdq.reference`` (and the kernels)."""

from __future__ import annotations

import contextlib
import math
import sys

import numpy as np

from . import _arrays
from .formats import FloatFormat, IntFormat, ScaleFormat, get_format
from .quantized import ARRAY_FIELDS, QuantizedTensor
from .reference import codec
from .reference import quantize as ref
from .reference.layouts import LAYOUTS, scale_matrix_shape
from .reference.packing import pack_codes, unpack_codes
from .reference.scales import tensor_amax
from .schemes import resolve_scheme

__all__ = ["quantize", "dequantize", "encode", "decode"]

_ROUNDINGS = ("nearest", "stochastic")
_LAYOUTS = LAYOUTS  # the one list of scale layout names (nqdq.reference.layouts)
_NONFINITE = ("propagate", "raise")
_NULL = contextlib.nullcontext()


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
    stream=None,
    amax_out=None,
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
        For ``"nvfp4"`` the tensor scale S_dec (stored as ``q.tensor_scale``; the dynamic
        path gives amax / 2688), one value: the ue4m3 block scales are computed from it in
        one pass over ``x`` (S_enc = min(fp32(1 / scale), FLT_MAX), docs/numerics.md).
        FlashInfer's / TensorRT-LLM's ``fp4_quantize(x, global_scale)`` takes the
        reciprocal, ``global_scale = 2688 / amax``: pass ``scale = 1 / global_scale``.
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
    stream : GPU calls: the stream to run on (an int handle, a CuPy or PyTorch stream);
        None: the caller's library's current stream (PyTorch's for a tensor, CuPy's
        otherwise; ``nqdq.gpu.runtime.callers``). A ValueError with NumPy input on the CPU.
    amax_out : with ``scale=`` of a scheme with one tensor scale (``"fp8_tensor"``, an int
        per-tensor scale, ``"nvfp4"``): a float32 array of one element (on x's GPU for GPU
        input; NumPy for NumPy input) that receives x's amax, the statistic the dynamic
        scheme computes (max |x| as float32; NaN / inf count, except for NVFP4, whose amax
        is over the finite values), in the same pass over x where the kernels allow it,
        written in stream order: TransformerEngine's delayed scaling (quantize with the scale
        of earlier steps, record this step's amax; ``nqdq.AmaxHistory`` keeps the history).

    GPU arrays (CuPy, PyTorch, JAX, ``__cuda_array_interface__``, CUDA DLPack) stay on the GPU:
    the result holds arrays of the caller's library (CuPy for CuPy and other CUDA arrays when
    installed, ``torch.Tensor`` for PyTorch, ``jax.Array`` for JAX), on the GPU that holds
    ``x`` (whichever device is current; the call leaves the current device as it was).
    """
    t = type(x)
    if scale is None and seed is None and stream is None and amax_out is None and (device is None or device == "cuda"):
        if t is _cupy_ndarray:
            # the hot path: a repeated call with a CuPy array on the current GPU (see _fast_quantizer)
            try:
                key = (scheme, granularity, axis, group_size, block_shape, symmetric, scale_rounding, rounding,
                       scale_layout, nonfinite, dtype, x.shape, x.dtype.char, x.data.device_id)  # fmt: skip
                fq = _FAST.get(key)
            except TypeError:  # an unhashable argument (a list for block_shape, ...)
                fq = None
            if fq is not None and x._c_contiguous and _current_gpu() == key[-1]:
                return fq(x)
        elif t is _jax_array:
            # ... and with a JAX array (see _fast_jax_quantizer)
            try:
                key = (t, scheme, granularity, axis, group_size, block_shape, symmetric, scale_rounding, rounding,
                       scale_layout, nonfinite, dtype, x.shape, x.dtype, x.__dlpack_device__()[1])  # fmt: skip
                fq = _FAST.get(key)
            except TypeError:
                fq = None
            if fq is not None and _current_gpu() == key[-1]:
                return fq(x)
        elif t is _torch_tensor:
            # ... and with a PyTorch tensor (see _fast_torch_quantizer)
            try:
                key = (t, scheme, granularity, axis, group_size, block_shape, symmetric, scale_rounding, rounding,
                       scale_layout, nonfinite, dtype, x.shape, x.dtype, x.get_device())  # fmt: skip
                fq = _FAST.get(key)
            except TypeError:
                fq = None
            if fq is not None and x.is_contiguous() and _torch_gpu() == key[-1]:
                return fq(x)
    return _quantize(x, scheme, granularity, axis, group_size, block_shape, scale, symmetric, scale_rounding, rounding,
                     seed, scale_layout, device, nonfinite, dtype, stream, amax_out)  # fmt: skip


@_arrays.on_gpu_of("x", "amax_out")
def _quantize(x, scheme, granularity, axis, group_size, block_shape, scale, symmetric, scale_rounding, rounding, seed,
              scale_layout, device, nonfinite, dtype, stream, amax_out=None):  # fmt: skip
    """quantize's general path, on x's GPU where x is a GPU array (every check, the plan),
    on the call's stream, with its results in the caller's library."""
    on_device = _arrays.use_device(x, device)
    if not on_device:
        if stream is not None:
            raise ValueError("stream= is for GPU calls; x is a host array (pass device='cuda' to run on the GPU)")
        return _quantize_on(x, scheme, granularity, axis, group_size, block_shape, scale, symmetric, scale_rounding,
                            rounding, seed, scale_layout, False, nonfinite, dtype, amax_out=amax_out)  # fmt: skip
    from .gpu.runtime import callers as _callers

    caller = _callers.caller_of(x)
    handle = _callers.call_stream(caller, stream, _devices_current())
    with _callers.running_on(handle) if handle is not None else _NULL:
        q = _quantize_on(x, scheme, granularity, axis, group_size, block_shape, scale, symmetric, scale_rounding,
                         rounding, seed, scale_layout, True, nonfinite, dtype, caller, stream, amax_out)  # fmt: skip
        if caller.name == "jax":
            caller.hold(x, _launch_stream())
    return q


def _launch_stream():
    from .gpu.runtime.launch import _stream_handle

    return _stream_handle(None)


def _gpu_of(a):
    """The CUDA device number of a DLPack-capable array (CuPy, PyTorch, JAX), else None."""
    try:
        dev_type, dev_id = a.__dlpack_device__()
    except (AttributeError, TypeError, RuntimeError):
        return None
    return int(dev_id) if int(dev_type) in (2, 3, 13) else None  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged


def _nvfp4_tensor_scale(scale, x):
    """``scale=`` of an NVFP4 scheme, checked: its tensor scale S_dec, one positive float32
    (a number, or a 0-d / 1-element array on the host or on x's GPU) in the range
    ``reference.scales.nvfp4_given_encode_scale`` accepts; a float32 0-d NumPy array."""
    from .reference.scales import nvfp4_given_encode_scale

    gpu = _gpu_of(scale)
    if gpu is not None and _gpu_of(x) not in (None, gpu):
        raise ValueError(f"scale is on GPU {gpu} but x is on GPU {_gpu_of(x)}: pass scale on x's GPU or as a number")
    if gpu is not None and not hasattr(scale, "get") and hasattr(scale, "cpu"):
        scale = scale.cpu()  # a PyTorch tensor (NumPy does not read GPU memory)
    s = np.asarray(_arrays.host(scale))
    if s.size != 1:
        raise ValueError(f"scale of scheme 'nvfp4' is its one tensor scale (S_dec): a number or a 1-element array, "
                         f"got shape {s.shape}")  # fmt: skip
    s = np.array(_arrays.static_scale(s.reshape(()), ()), np.float32)
    nvfp4_given_encode_scale(s)  # ValueError naming scale outside the range of tensor scales
    return s


def _amax_out_checked(amax_out, sch, scale, on_device):
    """``amax_out`` of quantize, checked (None: not asked): with a given scale of a scheme
    with one tensor scale; a float32 array of one element, writable, on the GPU for a GPU
    call (as the kernels take it), NumPy for the reference."""
    if amax_out is None:
        return None
    if scale is None:
        raise ValueError("amax_out records x's amax beside a given tensor scale: pass scale= too (without scale=, "
                         "the dynamic scheme computes the amax itself and its scale holds it)")  # fmt: skip
    if not (sch.granularity == "tensor" or sch.is_nvfp4):
        raise ValueError(f"amax_out is for schemes with one tensor scale ('fp8_tensor', an int tensor scale, "
                         f"'nvfp4'), not {sch.name!r} ({sch.granularity} scales)")  # fmt: skip
    if isinstance(amax_out, np.ndarray):
        a = amax_out
        if not a.flags.writeable:
            raise ValueError("amax_out must be writable")
    elif on_device:
        if not _arrays.is_device_array(amax_out):
            raise TypeError(f"amax_out must be a GPU array on x's GPU, got {type(amax_out).__name__}")
        from .gpu.runtime.interop import kernel_view

        a = kernel_view(amax_out, "amax_out")
    else:
        raise TypeError(f"amax_out must be a NumPy array for NumPy x on the CPU, got {type(amax_out).__name__}")
    if np.dtype(a.dtype) != np.float32 or a.size != 1:
        raise ValueError(f"amax_out must be float32 with one element, got {np.dtype(a.dtype)} of shape {tuple(a.shape)}")
    return a


def _quantize_on(x, scheme, granularity, axis, group_size, block_shape, scale, symmetric, scale_rounding, rounding,
                 seed, scale_layout, on_device, nonfinite, dtype, caller=None, stream=None, amax_out=None):  # fmt: skip
    if on_device:
        from .gpu.quantize import plan as kq
        from .gpu.runtime.interop import device_input

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
    if on_device and (scale is not None or nonfinite == "raise"):
        from .gpu.runtime.callers import refuse_capture

        refuse_capture("scale= is checked on the host and copied to the GPU" if scale is not None else
                       "nonfinite='raise' reads the check's result back to the host")  # fmt: skip
    amax_out = _amax_out_checked(amax_out, sch, scale, on_device)
    if scale is not None:
        scale = _nvfp4_tensor_scale(scale, x) if sch.is_nvfp4 else _arrays.static_scale(scale, sch.scale_shape(shape))
    if nonfinite == "raise" and (kq.has_nonfinite(xdev) if on_device else not np.isfinite(x32).all()):
        raise ValueError("x contains NaN or inf and nonfinite='raise'")

    seed = None if rounding == "nearest" else int(seed)
    fast_ok = on_device and seed is None and scale is None and nonfinite == "propagate" and scale_layout == "linear"
    if fast_ok and stream is None and caller is not None and caller.name == "torch" and xdev.kind is not None:
        fq = _fast_torch_quantizer(x, sch, shape, dtype_name, xdev.kind, caller)
        if fq is not None:
            try:
                _remember(
                    (type(x), scheme, granularity, axis, group_size, block_shape, symmetric, scale_rounding, rounding,
                     scale_layout, nonfinite, dtype, x.shape, x.dtype, x.get_device()),
                    fq,
                )  # fmt: skip
            except TypeError:
                pass
            return fq(x)
    if fast_ok and stream is None and caller is not None and caller.name == "jax":
        fq = _fast_jax_quantizer(x, sch, shape, dtype_name, xdev.kind, caller)
        if fq is not None:
            try:
                _remember(
                    (type(x), scheme, granularity, axis, group_size, block_shape, symmetric, scale_rounding, rounding,
                     scale_layout, nonfinite, dtype, x.shape, x.dtype, x.__dlpack_device__()[1]),
                    fq,
                )  # fmt: skip
            except TypeError:
                pass
            return fq(x)
    if fast_ok and xdev.lib == "cupy" and (caller is None or caller.name == "cupy"):
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
        parts = kq.quantize(xdev, sch, scale=scale, seed=seed, amax_out=amax_out)  # codes come back packed
        if caller is not None and caller.name != "cupy":
            parts = ref.QuantParts(*(caller.result(getattr(parts, f)) for f in ARRAY_FIELDS))
        codes = parts.codes
    else:
        parts = ref.quantize(x32, sch, scale=scale, seed=seed)
        codes = parts.codes
        if amax_out is not None:
            amax_out.reshape(-1)[0] = tensor_amax(x32, finite=sch.is_nvfp4)
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
# (nqdq.gpu.quantize.plan.QuantPlan.cupy_runner). A dict of at most _FAST_MAX keys, the
# oldest remembered dropped first: not an LRU, because moving each hit to the end of an
# OrderedDict cost about 0.2 us per call (a dropped key that comes back goes through the
# checks once more and finds its plan in nqdq.gpu.quantize.plan's plan cache).
_FAST: dict = None  # set below
_FAST_MAX = 256
_cupy_ndarray = None  # cupy.ndarray once a CuPy input was seen (nqdq never imports CuPy itself)
_current_gpu = None  # cupy.cuda.runtime.getDevice, set with _cupy_ndarray


def _fast_quantizer(x, sch, shape, dtype_name, kind):
    """``fq(x) -> QuantizedTensor`` for this call's arguments, or None."""
    from .gpu.quantize import plan as kq
    from .gpu.runtime.interop import is_cupy

    if not is_cupy(x) or not hasattr(x, "_c_contiguous"):
        return None
    run = kq.get_plan(shape, kind, sch).cupy_runner()
    if run is None:
        return None
    _note_cupy()
    return _quantized_by(run, sch, shape, dtype_name)


def _note_cupy():
    """The hot paths' CuPy facts, once CuPy is in use: its array type and cudaGetDevice."""
    global _cupy_ndarray, _current_gpu
    if _cupy_ndarray is None:
        cp = sys.modules["cupy"]
        _current_gpu = cp.cuda.runtime.getDevice
        _cupy_ndarray = cp.ndarray


def _quantized_by(run, sch, shape, dtype_name):
    """``fq(x) -> QuantizedTensor`` over a plan's runner ``run(x) -> (codes, scales, zero
    points, tensor scale, means)``: the remembered call of a hot path."""
    QT = QuantizedTensor

    def fq(x):
        c, s, z, t, m = run(x)
        return QT(c, s, sch, shape, dtype_name, "linear", z, t, m)

    fq.run = run
    return fq


_torch_tensor = None  # torch.Tensor once a PyTorch input was seen (nqdq never imports PyTorch itself)
_torch_gpu = None  # nqdq.gpu.runtime.devices.current, set with _torch_tensor


def _devices_current():
    from .gpu.runtime.devices import current

    return current()


_jax_array = None  # the JAX array type once a JAX input was seen (nqdq never imports JAX itself)


class _Address:
    """A device address where a runner reads ``x.data.ptr`` (CuPy's spelling)."""

    __slots__ = ("ptr", "data")

    def __init__(self, ptr):
        self.ptr, self.data = ptr, self


def _fast_jax_quantizer(x, sch, shape, dtype_name, kind, caller):
    """``fq(x) -> QuantizedTensor`` of JAX arrays for this call's arguments, or None: the
    CuPy runner of the plan on CuPy's current stream, its input address from JAX's DLPack
    export for that stream (JAX orders its pending writes before it), the results imported
    by ``jax.dlpack.from_dlpack``, the input held until the call has run
    (``_callers.JaxCaller.hold``). Needs CuPy (the runner allocates through it)."""
    global _jax_array
    from .gpu.quantize import plan as kq
    from .gpu.runtime.interop import dlpack_address
    from .gpu.runtime.launch import _stream_handle

    cp = sys.modules.get("cupy")
    if cp is None:
        return None
    run = kq.get_plan(shape, kind, sch).cupy_runner()
    if run is None:
        return None
    _note_cupy()
    _jax_array = type(x)
    QT, R, hold = QuantizedTensor, caller.result, caller.hold

    def fq(x):
        st = _stream_handle(None)
        got = dlpack_address(x, st)
        if got is None:
            raise ValueError("x must be C-contiguous on the device (make a contiguous copy first)")
        c, s, z, t, m = run(_Address(got[0]))
        hold((x, got[1]), st)
        return QT(R(c), R(s), sch, shape, dtype_name, "linear", R(z), R(t), R(m))

    fq.run = run
    return fq


def _fast_torch_quantizer(x, sch, shape, dtype_name, kind, caller):
    """``fq(x) -> QuantizedTensor`` of PyTorch tensors for this call's arguments, or None
    (``QuantPlan.torch_runner``)."""
    global _torch_tensor, _torch_gpu
    from .gpu.runtime import devices as _devices
    from .gpu.quantize import plan as kq

    if not x.is_contiguous():
        return None
    run = kq.get_plan(shape, kind, sch).torch_runner(caller)
    if run is None:
        return None
    _torch_gpu = _devices.current
    _torch_tensor = caller.tensor
    return _quantized_by(run, sch, shape, dtype_name)


def _fast_dequantizer(q, caller, out_dtype):
    """``fd(q) -> values`` for repeated dequantize calls like this one (CuPy or PyTorch
    arrays, C-contiguous, linear scales), or None (``kernels.dequant_plan``)."""
    global _torch_gpu, _torch_tensor
    from .gpu.runtime import devices as _devices
    from .gpu.quantize import dequant_plan
    from .gpu.runtime.interop import is_cupy

    arrays = (q.codes, q.scales, q.zero_points, q.tensor_scale, q.means)
    if caller.name == "torch":
        contiguous = _torch_contiguous
    elif caller.name == "cupy" and is_cupy(q.codes) and hasattr(q.codes, "_c_contiguous"):
        contiguous = _cupy_contiguous
    else:
        return None
    if q.scale_layout != "linear" or not contiguous(q) or math.prod(q.shape) == 0:
        return None
    if any(a is not None and type(a) is not type(q.codes) for a in arrays):
        return None
    out = "bfloat16" if out_dtype == _arrays.BFLOAT16 else np.dtype(out_dtype).name
    plan = dequant_plan.get_plan(q.scheme, tuple(q.shape), out)
    run = plan.torch_runner(caller) if caller.name == "torch" else plan.cupy_runner()
    if run is None:
        return None
    if plan.units:  # the unit kernel's 16-byte loads of the codes
        contiguous = _torch_aligned if caller.name == "torch" else _cupy_aligned
        if not contiguous(q):
            return None
    f16 = out == "float16" and plan.out != "float16"  # (rounded here where the plan writes float32)
    if caller.name == "torch":
        _torch_gpu, _torch_tensor = _devices.current, caller.tensor
        half = caller.torch.float16

        def fd(q):
            v = run(q.codes, q.scales, q.zero_points, q.tensor_scale, q.means)
            return v.to(half) if f16 else v

        fd.gpu = _torch_gpu
    else:
        _note_cupy()

        def fd(q):
            v = run(q.codes, q.scales, q.zero_points, q.tensor_scale, q.means)
            return v.astype(np.float16) if f16 else v

        fd.gpu = _current_gpu
    fd.contiguous = contiguous
    return fd


def _torch_contiguous(q):
    return all(a is None or a.is_contiguous() for a in (q.codes, q.scales, q.zero_points, q.tensor_scale, q.means))


def _cupy_contiguous(q):
    return all(a is None or a._c_contiguous for a in (q.codes, q.scales, q.zero_points, q.tensor_scale, q.means))


def _torch_aligned(q):
    return q.codes.data_ptr() & 15 == 0 and _torch_contiguous(q)


def _cupy_aligned(q):
    return q.codes.data.ptr & 15 == 0 and _cupy_contiguous(q)


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
    and nqdq.dequantize's, nqdq.fused's and nqdq.matmul's."""
    from . import fused

    import importlib

    _matmul_module = importlib.import_module("nqdq.matmul")  # (nqdq.matmul the attribute is the function)

    _FAST.clear()
    fused.clear_hot_path()
    _matmul_module.clear_hot_path()


def dequantize(q: QuantizedTensor, dtype=np.float32, *, device=None, stream=None):
    """Decode ``q`` to ``dtype`` (float32, float16 or bfloat16): values are computed in
    float32, then rounded to ``dtype`` (nearest even). A ``q`` holding GPU arrays (or
    ``device="cuda"``) decodes on the GPU into the library of ``q.codes`` (PyTorch and JAX
    give their own bfloat16; CuPy, which has none, its uint16 bits), on ``stream`` (None:
    that library's current stream, as ``quantize``)."""
    c = getattr(q, "codes", None)
    t = type(c)
    if (t is _cupy_ndarray or t is _torch_tensor) and stream is None and (device is None or device == "cuda"):
        # the hot path: a repeated call on arrays of the shapes and dtypes a first call checked
        try:
            key = _dequant_key(q, t, dtype)
            fd = _FAST.get(key)
        except TypeError:  # an unhashable field (a list for q.shape, ...)
            fd = None
        if fd is not None and fd.contiguous(q) and fd.gpu() == key[-1]:
            return fd(q)
    return _dequantize(q, dtype, device, stream)


def _dequant_key(q, t, dtype):
    """What a remembered dequantize depends on: the arrays' shapes and dtypes (checked by the
    first call's ``check_arrays``), the scheme, shape, layout, output dtype and GPU."""
    c, s, z, ts, m = q.codes, q.scales, q.zero_points, q.tensor_scale, q.means
    return (t, "dequantize", dtype, q.scheme, q.shape, q.scale_layout, c.shape, c.dtype, s.shape, s.dtype,
            None if z is None else (z.shape, z.dtype), None if ts is None else (ts.shape, ts.dtype),
            None if m is None else (m.shape, m.dtype), _array_gpu(c))  # fmt: skip


def _array_gpu(a):
    return a.data.device_id if type(a) is _cupy_ndarray else a.get_device()


@_arrays.on_gpu_of("q.codes")
def _dequantize(q, dtype, device, stream):
    """dequantize's general path, on the GPU of q's arrays where they are GPU arrays."""
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"q must be a QuantizedTensor (from nqdq.quantize or nqdq.load), got {type(q).__name__}")
    q.check_arrays("q")  # shapes, dtypes, presence: the kernels index with the implied shapes
    q_in = q
    out_dtype = _arrays.float_dtype(dtype, "dtype")
    if q.scale_layout not in _LAYOUTS:
        raise ValueError(f"q.scale_layout={q.scale_layout!r} is not one of {_LAYOUTS}")
    if q.scale_layout != "linear":
        q = q.with_layout("linear")  # the decoders read linear scales
    sch = q.scheme
    if _arrays.use_device(q.codes, device, argname="q.codes"):
        from .gpu.runtime import callers as _callers
        from .gpu.quantize import plan as kq
        from .gpu.runtime.interop import kernel_view

        caller = _callers.caller_of(q.codes)
        if stream is None and (device is None or device == "cuda") and q is q_in:
            fd = _fast_dequantizer(q, caller, out_dtype)
            if fd is not None:
                try:
                    _remember(_dequant_key(q, type(q.codes), dtype), fd)
                except TypeError:
                    pass
                return fd(q)
        handle = _callers.call_stream(caller, stream, _devices_current())
        with _callers.running_on(handle) if handle is not None else _NULL:
            arrays = (q.codes, q.scales, q.zero_points, q.tensor_scale, q.means)
            if caller.name != "cupy":  # PyTorch / JAX arrays as the kernels take them (zero-copy)
                arrays = tuple(None if a is None else kernel_view(a) for a in arrays)
            out = _arrays.device_astype(kq.dequantize(ref.QuantParts(*arrays), sch, tuple(q.shape)), out_dtype)
            if caller.name == "cupy":
                return out
            if caller.name == "jax":
                caller.hold(tuple(getattr(q, f) for f in ARRAY_FIELDS), _launch_stream())
            return caller.result_bfloat16(out) if out_dtype == _arrays.BFLOAT16 else caller.result(out)
    if stream is not None:
        raise ValueError("stream= is for GPU calls; q holds host arrays (pass device='cuda' to run on the GPU)")
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
