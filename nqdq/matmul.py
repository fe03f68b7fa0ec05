"""``matmul``: GEMMs on quantized tensors with the dequantization fused into the epilogue.

``matmul(qa, qb)`` computes ``dequant(qa) @ dequant(qb).T`` for activations ``qa`` [M, K]
and weights ``qb`` [N, K] (the usual ``nn.Linear`` layout), then ``alpha``, ``bias``,
an activation and the output rounding, on tensor cores (``nqdq.gpu.gemm.plan``) or by the
NumPy reference (``nqdq.reference.matmul``).

Accepted operands (``scheme.block_for(shape)`` decides; preset names for illustration):

=================  ===========================================  ==========================
                   qa [M, K] (activations)                      qb [N, K] (weights)
=================  ===========================================  ==========================
INT8               int8 symmetric, scales constant along K:     int8 symmetric, scales
                   per tensor, per row = per token              constant along K: per
                   (``"int8_row"``); or asymmetric uint8 + zero  tensor, per row of W = per
                   points (``"int8_asym"``, per row / tensor)    output channel
                                                                (``"int8_row"``)
FP8 (e4m3/e5m2,    per tensor or per row (``"fp8_tensor"``,      per tensor or per row of W
either operand)    ``"fp8_row"``, ``"e5m2"``)                    (``"fp8_tensor"``, ``"fp8_row"``)
FP8 block          ``"fp8_1x128"`` (1 x 128 groups along K)      ``"fp8_128x128"``
=================  ===========================================  ==========================

So the scale maps are ``s_a[m]`` (one per token, or one for all) and ``s_b[n]`` (one per
output channel = one per row of the [N, K] weight, or one for all). A weight quantized
with ``"int8_column"`` (``axis=-1``) has one scale per *input* channel k, which cannot
leave the K sum; use ``"int8_row"`` (or ``granularity="column", axis=0``). Scales that are
constant along K but shared by several rows (a ``block`` scheme with K <= its block) are
expanded to one per row. FP8 block scales are applied per 128 of K, in float32, to the
tensor core's partial sums (DeepSeek-V3's "promotion").
"""

from __future__ import annotations

import numbers

import numpy as np

from . import _arrays
from .formats import FloatFormat, IntFormat
from .gpu.runtime.interop import is_cupy
from .quantized import ARRAY_FIELDS, QuantizedTensor

__all__ = ["matmul"]

_ACTIVATIONS = (None, "relu", "gelu")
_FP8 = ("e4m3", "e5m2")


class _Operand:
    """One operand's codes and scale data as the GEMM takes them."""

    def __init__(self, codes, elem, scales, mode, za=None, expanded=False):
        self.codes, self.elem, self.scales, self.mode, self.za = codes, elem, scales, mode, za
        self.expanded = expanded  # scales (and zero points) expanded to one per row: built per call


def _expand_rows(s, rows, block_rows, xp):
    """Scales constant along K, one per ``block_rows`` rows -> one per row ([rows])."""
    s = s.reshape(-1)
    return xp.repeat(s, block_rows)[:rows] if block_rows > 1 else s


def _operand(q, name: str, role: str, xp) -> _Operand:
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"{name} must be a QuantizedTensor (from nqdq.quantize), got {type(q).__name__}")
    q.check_arrays(name)  # shapes, dtypes, presence: the GEMM indexes with the implied shapes
    sch = q.scheme
    shape = tuple(q.shape)
    if len(shape) != 2:
        raise ValueError(f"{name} must be 2-D ([{'M' if role == 'a' else 'N'}, K]), got shape {shape}")
    if q.scale_layout != "linear":
        raise ValueError(f"{name}.scale_layout={q.scale_layout!r}: matmul reads linear scales only")
    elem = sch.element
    is_int8 = isinstance(elem, IntFormat) and elem.bits == 8
    is_fp8 = isinstance(elem, FloatFormat) and elem.name in _FP8
    if not (is_int8 or is_fp8) or sch.scale_format != "f32" or sch.centred or sch.tensor_scale:
        raise ValueError(
            f"{name} has scheme {sch.name!r} (element {sch.fmt}, scale format {sch.scale_format}"
            f"{', centred' if sch.centred else ''}); matmul takes int8 or fp8 (e4m3 / e5m2) codes "
            f"with float32 scales (e.g. 'int8_row', 'int8_asym', 'fp8_row', 'fp8_1x128', 'fp8_128x128')"
        )
    if not sch.symmetric and role == "b":
        raise ValueError(f"{name} is asymmetric ({sch.name!r}); weights must be symmetric int8 (e.g. 'int8_row')")
    rows, K = shape
    br, bk = (int(v) for v in sch.block_for(shape))
    scales = q.scales
    what = "per token" if role == "a" else "per output channel (per row of the [N, K] weight)"
    if bk >= K:  # constant along K: per tensor, per row, or per group of rows
        if br >= rows:
            mode, s = "tensor", scales.reshape(-1)[:1]
        else:
            mode, s = "row", _expand_rows(scales, rows, br, xp)
        za = None
        if not sch.symmetric:
            za = q.zero_points.reshape(-1)[:1] if mode == "tensor" else _expand_rows(q.zero_points, rows, br, xp)
        return _Operand(q.codes, elem.name if is_fp8 else "int8", s, mode, za, expanded=mode == "row" and br > 1)
    # scales vary along K: only the fp8 block layouts are GEMM-able
    ok_block = is_fp8 and bk == 128 and br == (1 if role == "a" else 128)
    if not ok_block:
        want = "'fp8_1x128' (1 x 128 groups)" if role == "a" else "'fp8_128x128' (128 x 128 tiles)"
        raise ValueError(
            f"{name} ({sch.name!r}, scale groups {br} x {bk} on shape {shape}) has scales that vary along K, "
            f"which cannot be applied outside the K sum; use scales {what} or per tensor"
            + (f", or fp8 {want}" if is_fp8 or is_int8 else "")
            + (". For a weight, 'int8_column' (axis=-1) scales input channels: use 'int8_row'" if role == "b" and is_int8 else "")
        )
    return _Operand(q.codes, elem.name, scales.reshape(-1), "block")


def matmul(qa, qb, out_dtype="float32", *, bias=None, activation=None, alpha=1.0, device=None):
    """``act(alpha * dequant(qa) @ dequant(qb).T + bias)`` as ``out_dtype``.

    Parameters
    ----------
    qa : QuantizedTensor [M, K], the activations (see the module docstring for schemes).
    qb : QuantizedTensor [N, K], the weights.
    out_dtype : ``"float32"`` (default), ``"float16"`` or ``"bfloat16"`` (a GPU result holds
        bfloat16 as uint16 bits, as ``nqdq.dequantize`` does there).
    bias : None or N float values (float32 after conversion), added after ``alpha``.
    activation : None, ``"relu"`` or ``"gelu"`` (the erf form, not the tanh approximation).
    alpha : a real scalar multiplying the product.
    device : None (GPU operands run on the GPU, NumPy ones on the CPU reference), ``"cpu"``
        or ``"cuda"`` (tensor-core kernels; NumPy operands are copied over and back, or run
        in Numba's CUDA simulator under NUMBA_ENABLE_CUDASIM=1).

    A call like an earlier GPU call (same schemes, shapes, dtypes, arguments, GPU: see
    ``_hot_key``) skips the checks and launches the remembered GEMM at once (``_RUNNERS``).
    """
    if _RUNNERS and type(qa) is QuantizedTensor and type(qb) is QuantizedTensor:
        try:
            run = _RUNNERS.get(_hot_key(qa, qb, out_dtype, bias, activation, alpha, device))
        except (AttributeError, KeyError, TypeError):  # another library, an unhashable argument
            run = None
        if run is not None:
            return run(qa, qb, bias)
    codes = getattr(qa, "codes", None)
    if codes is not None and not isinstance(codes, np.ndarray) and not is_cupy(codes):
        from .gpu.runtime import callers as _callers

        caller = _callers.caller_of(codes)
        if caller.name != "cupy" and _arrays.is_device_array(codes):
            return _matmul_for(caller, qa, qb, out_dtype, bias, activation, alpha, device)
    return _matmul(qa, qb, out_dtype, bias=bias, activation=activation, alpha=alpha, device=device)


def _matmul_for(caller, qa, qb, out_dtype, bias, activation, alpha, device):
    """A PyTorch or JAX caller's general path: the operands as the kernels' arrays (zero-copy
    views), the call on that library's current stream of their GPU, the result in the
    caller's library (bfloat16 as its own); a PyTorch call remembers a runner of tensors."""
    import dataclasses

    from .gpu.runtime import callers as _callers
    from .gpu.runtime.devices import ordinal_of
    from .gpu.runtime.interop import kernel_view

    def view(q):
        if not isinstance(q, QuantizedTensor):
            return q
        return dataclasses.replace(q, **{f: kernel_view(getattr(q, f), f"q.{f}") for f in ARRAY_FIELDS
                                         if getattr(q, f) is not None and type(getattr(q, f)) is type(qa.codes)})

    bias_v = kernel_view(bias, "bias") if bias is not None and type(bias) is type(qa.codes) else bias
    handle = caller.stream(ordinal_of(qa.codes) or 0)
    with _callers.running_on(handle) if handle is not None else _callers._NULL:
        out = _matmul(view(qa), view(qb), out_dtype, bias=bias_v, activation=activation, alpha=alpha, device=device,
                      _caller=(caller, qa, qb, bias))  # fmt: skip
        if out.dtype == np.uint16:  # bfloat16 bits
            return caller.result_bfloat16(out)
        return caller.result(out)


@_arrays.on_gpu_of("qa.codes", "qb.codes", "bias")
def _matmul(qa, qb, out_dtype="float32", *, bias=None, activation=None, alpha=1.0, device=None, _caller=None):
    """matmul's general path, on the operands' GPU: every check, then the GEMM; a GPU call
    remembers a runner for the calls like it (``_remember_runner``)."""
    bias_arg = bias
    on_device = _arrays.use_device(getattr(qa, "codes", None), device, argname="qa.codes")
    xp = np
    if on_device and _arrays.is_device_array(getattr(qa, "codes", None)):
        try:
            import cupy as xp  # the GPU arrays' library, for the small scale reshapes
        except Exception:  # pragma: no cover - Numba device arrays without CuPy
            xp = np
    a = _operand(qa, "qa", "a", xp)
    b = _operand(qb, "qb", "b", xp)
    if _arrays.is_device_array(qa.codes) != _arrays.is_device_array(qb.codes):
        raise ValueError("qa and qb must both be on the GPU or both on the host; move qb (or qa) first")
    M, K = qa.shape
    N, Kb = qb.shape
    if Kb != K:
        raise ValueError(f"qa.shape {tuple(qa.shape)} and qb.shape {tuple(qb.shape)} disagree on K ({K} != {Kb}); qb is [N, K]")
    if K == 0:
        raise ValueError("qa and qb have K = 0")
    fam = {"int8"} if a.elem == b.elem == "int8" else set()
    if not fam and (a.elem == "int8" or b.elem == "int8"):
        raise ValueError(f"qa is {a.elem} and qb is {b.elem}: matmul pairs int8 with int8 and fp8 with fp8")
    if (a.mode == "block") != (b.mode == "block"):
        blk, other = ("qa", "qb") if a.mode == "block" else ("qb", "qa")
        raise ValueError(
            f"{blk} has fp8 block scales but {other} has {(b if blk == 'qa' else a).mode} scales; "
            "block scaling pairs 'fp8_1x128' activations with 'fp8_128x128' weights"
        )
    mma = ("u8s8" if a.za is not None else "s8s8") if fam else f"{a.elem}.{b.elem}"
    out_dt = _arrays.float_dtype(out_dtype, "out_dtype")
    out_name = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}.get(out_dt, "bfloat16")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not one of {_ACTIVATIONS}")
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not np.isfinite(float(alpha)):
        raise TypeError(f"alpha must be a finite real number, got {alpha!r}")
    if bias is not None:
        if _arrays.is_device_array(bias) != on_device and not (on_device and isinstance(bias, np.ndarray)):
            raise ValueError("bias is a GPU array but the matmul runs on the host; pass bias.get()")
        if not hasattr(bias, "shape"):
            bias = np.asarray(bias)
        bshape = tuple(bias.shape)
        if bshape != (N,):
            raise ValueError(f"bias must have shape ({N},) (one per output channel), got {bshape}")
        bdt = np.dtype(bias.dtype)
        if bdt.kind != "f":
            raise TypeError(f"bias must be a float array, got dtype {bdt}")
    kw = dict(mma=mma, sa=a.scales, sb=b.scales, sa_mode=a.mode, sb_mode=b.mode, za=a.za, bias=bias,
              alpha=float(alpha), out_dtype=out_name, activation=activation)  # fmt: skip
    if on_device:
        from .gpu.gemm import plan as kg

        out = kg.gemm(a.codes, b.codes, **kw)
        if not (a.expanded or b.expanded):
            if _caller is None:
                _remember_runner(qa, qb, out_dtype, bias_arg, activation, alpha, device, kw)
            elif _caller[0].name == "torch":  # the caller's own tensors, as later calls give them
                _remember_runner(_caller[1], _caller[2], out_dtype, _caller[3], activation, alpha, device, kw,
                                 torch=_caller[0])  # fmt: skip
        return out
    from .reference import matmul as ref

    h = _arrays.host
    kw.update(sa=h(kw["sa"]), sb=h(kw["sb"]), za=h(kw["za"]), bias=None if bias is None else h(bias))
    return ref.gemm(h(a.codes), h(b.codes), **kw)


# ----------------------------------------------------------------------------- the GPU hot path
# The first GPU call of a kind goes through every check above and nqdq.gpu.gemm.plan.gemm; then,
# where the same launch can serve every call whose _hot_key is equal (arrays C-contiguous in
# the codes' library on the current GPU, codes [rows, K] of one byte, float32 scales and bias,
# zero points of one byte, no scales expanded per call, K a multiple of 16, a non-empty
# output), it remembers a runner: run(qa, qb, bias) reads the arrays' addresses, allocates the
# output (_alloc_out) and launches the GEMM's compiled launch sequence
# (nqdq.gpu.gemm.plan.gemm_sequence) on the current stream. Nothing in it waits for the GPU or
# copies to the host. Bounded as nqdq.quantize's hot path is (nqdq.api.remember_bounded):
# at most _RUNNERS_MAX keys, the oldest dropped first. The tile is chosen when the runner is
# built (plan.default_config, from what the key holds: schemes, shapes, arguments, GPU).
_RUNNERS: dict = {}
_RUNNERS_MAX = 256
_FACTS: dict = {}  # array type -> facts(x), registered with the first runner of that library
_current_device = None  # nqdq.gpu.runtime.devices.current, set with the first runner
_cupy_alloc = _cupy_ndarray = _cupy_new = _cupy_stream = None  # set with the first CuPy runner


def _cupy_facts(x):
    """What a launch depends on in a CuPy array: shape, dtype, C-contiguity, its GPU."""
    return x.shape, x.dtype, x._c_contiguous, x.data.device_id


def _numpy_facts(x):
    """The same for the simulator's NumPy arrays (one device, 0)."""
    return x.shape, x.dtype, x.flags.c_contiguous, 0


def _hot_key(qa, qb, out_dtype, bias, activation, alpha, device):
    """Everything that decides a call's launch: the schemes (so the scale modes), logical
    shapes and scale layouts; shape, dtype, C-contiguity and GPU of each array (``_FACTS``
    of the codes' library: KeyError for another); the arguments (alpha with its type, so
    that True is not taken for 1.0); the current GPU."""
    facts = _FACTS[type(qa.codes)]
    za = qa.zero_points
    return (type(qa.codes), qa.scheme, qb.scheme, qa.shape, qb.shape, qa.scale_layout, qb.scale_layout, facts(qa.codes),
            facts(qb.codes), facts(qa.scales), facts(qb.scales), None if za is None else facts(za),
            None if bias is None else facts(bias), out_dtype, activation, alpha, type(alpha), device,
            _current_device())  # fmt: skip


def clear_hot_path():
    """Forget the remembered GEMM runners (tests)."""
    _RUNNERS.clear()


def _register(codes, simulator: bool, torch=None) -> bool:
    """Whether calls with ``codes``' array library can have runners (CuPy, PyTorch where
    ``torch`` (its caller) is given, or NumPy in the simulator); the first time, the
    library's facts and allocation are set up."""
    global _current_device, _cupy_alloc, _cupy_ndarray, _cupy_new, _cupy_stream
    from .gpu.runtime import devices as _devices

    if type(codes) in _FACTS:
        return True
    if torch is not None and not simulator:
        to_numpy = {t: np.dtype(d) for d, t in torch.dtypes.items()}
        to_numpy[torch.torch.bfloat16] = np.dtype(np.uint16)  # (as the kernels see it)

        def torch_facts(x):
            """The same for PyTorch tensors (dtypes by their NumPy twins)."""
            return tuple(x.shape), to_numpy.get(x.dtype, x.dtype), x.is_contiguous(), x.get_device()

        _current_device = _devices.current
        _FACTS[torch.tensor] = torch_facts
        return True
    if simulator:
        if type(codes) is not np.ndarray:
            return False
        _current_device = _devices.current
        _FACTS[np.ndarray] = _numpy_facts
        return True
    if not is_cupy(codes) or not hasattr(codes, "_c_contiguous"):
        return False
    import cupy

    from .gpu.runtime.interop import cupy_array_new

    _cupy_alloc, _cupy_ndarray, _cupy_stream = cupy.cuda.alloc, cupy.ndarray, cupy.cuda.get_current_stream
    _cupy_new = cupy_array_new(cupy, cupy.cuda.alloc(256))
    _current_device = _devices.current
    _FACTS[type(codes)] = _cupy_facts
    return True


def _remember_runner(qa, qb, out_dtype, bias, activation, alpha, device, kw, torch=None):
    """After a GPU call on the general path: remember a runner for the calls like it, where
    one can serve them (see above); else nothing. ``torch``: the PyTorch caller whose
    tensors qa and qb hold."""
    from .gpu.gemm import plan as kg
    from .gpu.runtime.target import SIMULATOR

    if not _register(qa.codes, SIMULATOR, torch):
        return
    try:
        key = _hot_key(qa, qb, out_dtype, bias, activation, alpha, device)
        hash(key)
    except (AttributeError, KeyError, TypeError):
        return
    if key in _RUNNERS:
        return
    (M, K), (N, _) = (int(v) for v in qa.shape), (int(v) for v in qb.shape)
    ca, cb, sa, sb, za, fb, dev = key[7], key[8], key[9], key[10], key[11], key[12], key[-1]
    arrays = [f for f in (ca, cb, sa, sb, za, fb) if f is not None]
    if not all(contiguous and gpu == dev for _shape, _dt, contiguous, gpu in arrays):
        return
    byte = (np.dtype(np.int8), np.dtype(np.uint8))
    if ca[0] != (M, K) or cb[0] != (N, K) or ca[1] not in byte or cb[1] not in byte:
        return
    f32 = np.dtype(np.float32)
    if sa[1] != f32 or sb[1] != f32 or (za is not None and za[1] not in byte):
        return
    if fb is not None and (fb[0] != (N,) or fb[1] != f32):
        return
    sa_mode, sb_mode = kw["sa_mode"], kw["sb_mode"]
    need = ((sa, kg.scale_count(sa_mode, M, K)), (sb, kg.scale_count(sb_mode, N, K, 128)),
            (za, kg.scale_count(sa_mode, M, K)))  # fmt: skip
    if any(f is not None and int(np.prod(f[0])) < n for f, n in need):
        return
    seq = kg.gemm_sequence(M, N, K, mma=kw["mma"], sa_mode=sa_mode, sb_mode=sb_mode, asym=za is not None,
                           bias=fb is not None, alpha=kw["alpha"], out_dtype=kw["out_dtype"],
                           activation=activation)  # fmt: skip
    if seq is None:
        return
    from .api import remember_bounded

    if SIMULATOR:
        run = _simulated_runner(seq, (M, N), za is not None, fb is not None, dev)
    elif torch is not None:
        run = _torch_runner(torch, seq, (M, N), za is not None, fb is not None, dev)
    else:
        run = _gpu_runner(seq, (M, N), za is not None, fb is not None, dev)
    remember_bounded(_RUNNERS, key, run, _RUNNERS_MAX)


def _alloc_out(shape, dtype, nbytes: int, device: int):
    """(the output array, its address): ``nbytes`` of GPU memory on ``device`` (the current
    GPU) from CuPy's pool, the first ``shape`` x ``dtype`` of it the C-contiguous output
    array (the rest: the launches' scratch). The runners' one allocation."""
    mem = _cupy_alloc(nbytes)
    if _cupy_new is not None:  # cupy.ndarray(shape, dtype, mem) without its Python frames (runtime.interop)
        out = _cupy_new(_cupy_ndarray)
        out._init(shape, dtype, mem)
    else:
        out = _cupy_ndarray(shape, dtype, mem)
    return out, mem.ptr


def _gpu_runner(seq, shape, asym: bool, has_bias: bool, device: int):
    """``run(qa, qb, bias)``: ``seq`` on the current stream of ``device``, with the arrays'
    addresses."""
    launch, nbytes, dtype, stream = seq.run, seq.nbytes, seq.out_dtype, _cupy_stream

    def run(qa, qb, bias):
        out, base = _alloc_out(shape, dtype, nbytes, device)
        launch(stream(device).ptr, qa.codes.data.ptr, qb.codes.data.ptr, qa.scales.data.ptr, qb.scales.data.ptr,
               qa.zero_points.data.ptr if asym else 0, bias.data.ptr if has_bias else 0, base)  # fmt: skip
        return out

    run.sequence = seq
    return run


def _torch_runner(caller, seq, shape, asym: bool, has_bias: bool, device: int):
    """``run(qa, qb, bias)`` of PyTorch tensors: ``seq`` on PyTorch's current stream of
    ``device``; the output (bfloat16 as torch.bfloat16) the head of one ``torch.empty``
    whose tail is the launches' scratch."""
    torch = caller.torch
    launch, dtype, stream = seq.run, seq.out_dtype, caller.stream
    tdt = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16}.get(dtype, torch.bfloat16)
    count = -(-seq.nbytes // dtype.itemsize)
    whole = count == shape[0] * shape[1]
    dev, empty = torch.device("cuda", device), torch.empty

    def run(qa, qb, bias):
        buf = empty(count, dtype=tdt, device=dev)
        launch(stream(device), qa.codes.data_ptr(), qb.codes.data_ptr(), qa.scales.data_ptr(), qb.scales.data_ptr(),
               qa.zero_points.data_ptr() if asym else 0, bias.data_ptr() if has_bias else 0, buf.data_ptr())  # fmt: skip
        return buf.view(shape) if whole else buf[: shape[0] * shape[1]].view(shape)

    run.sequence = seq
    return run


def _simulated_runner(seq, shape, asym: bool, has_bias: bool, device: int):
    """``run(qa, qb, bias)`` in the simulator: ``seq`` given the NumPy arrays."""
    launch, nbytes, dtype = seq.run, seq.nbytes, seq.out_dtype
    size = shape[0] * shape[1] * dtype.itemsize

    def run(qa, qb, bias):
        buf = np.empty(nbytes, np.uint8)
        launch(0, qa.codes, qb.codes, qa.scales, qb.scales, qa.zero_points, bias, buf)
        return buf[:size].view(dtype).reshape(shape)

    run.sequence = seq
    return run
