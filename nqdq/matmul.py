"""``matmul``: GEMMs on quantized tensors with the dequantization fused into the epilogue.

``matmul(qa, qb)`` computes ``dequant(qa) @ dequant(qb).T`` for activations ``qa`` [M, K]
and weights ``qb`` [N, K] (the usual ``nn.Linear`` layout), then ``alpha``, ``bias``,
an activation and the output rounding, on tensor cores (``nqdq.gpu.gemm.plan``) or by the
NumPy reference (``nqdq.reference.matmul``). ``matmul(x, qw)``, with ``x`` a plain float
array, is the weight-only GEMM.

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
MX (mixed too)     ``"mxfp8"``, ``"mxfp8_e5m2"``,               any of the same five
                   ``"mxfp6_e2m3"``, ``"mxfp6_e3m2"``,
                   ``"mxfp4"``
NVFP4              ``"nvfp4"``                                  ``"nvfp4"``
centred INT8       ``"int8_centred"`` with an INT8 qb above,    ``"int8_centred"`` with an
                   or with a centred qb (same group size)       INT8 qa above
weight-only        ``x``: float32, float16 or bfloat16          ``qw``: int4 / int8 / fp8
                   (``ml_dtypes.bfloat16``, or uint16 bits      with scales per row, per
                   with ``dtype="bfloat16"`` as in              group along K or per tensor
                   ``nqdq.quantize``)                           (``"int4_group"``,
                                                                ``"int4_asym"``,
                                                                ``"int8_row"``,
                                                                ``"fp8_row"``), fp8
                                                                128 x 128 tiles
                                                                (``"fp8_128x128"``), MX,
                                                                NVFP4
=================  ===========================================  ==========================

So the scale maps are ``s_a[m]`` (one per token, or one for all) and ``s_b[n]`` (one per
output channel = one per row of the [N, K] weight, or one for all). A weight quantized
with ``"int8_column"`` (``axis=-1``) has one scale per *input* channel k, which cannot
leave the K sum; use ``"int8_row"`` (or ``granularity="column", axis=0``). Scales that are
constant along K but shared by several rows (a ``block`` scheme with K <= its block) are
expanded to one per row. FP8 block scales are applied per 128 of K, in float32, to the
tensor core's partial sums (DeepSeek-V3's "promotion").

Block-scaled pairs multiply each element product by what the formats define: 2^(ea + eb) per
32 of K for MX (any two of the five MX element formats), ue4m3 x ue4m3 per 16 of K times
both fp32 tensor scales for NVFP4. MX with NVFP4 is refused: the block (32 vs 16) and the
scale format (e8m0 vs ue4m3) differ, and the tensor cores' block-scaled MMAs take one scale
vector size and one scale type per instruction for both operands (sm_100 ``tcgen05.mma
.block_scale``, sm_120 ``mma.sync .block_scale``). K need not be a multiple of the block:
``quantize`` gives the last, partial block its own scale, and the product runs over the K
elements there are, which is the product of both operands padded with zero codes to a whole
block (zero codes add nothing, whatever their block's scale). Centred INT8 adds each group's
mean back: C[m, n] = sum_g (s_a[m, g] sum_(k in g) q_a b + mu_a[m, g] sum_(k in g) b). The
rules are data: ``_NEW_PAIRS`` and ``_WEIGHT_PATTERNS``; their GPU kernels plug in at
``_pairs_gpu.new_pair_gpu`` (which says which pairs have one; the others ``device="cpu"`` computes).
docs/design/gemm.md has the reasons.
"""

from __future__ import annotations

import numbers

import numpy as np

from . import _arrays
from .formats import FloatFormat, IntFormat
from .gpu.runtime.interop import is_cupy
from .quantized import ARRAY_FIELDS, QuantizedTensor
from .schemes import Scheme

__all__ = ["matmul"]

_ACTIVATIONS = (None, "relu", "gelu")
_FP8 = ("e4m3", "e5m2")

# The pairs beyond int8 x int8 and fp8 x fp8, as data. matmul(qa, qb): (family of qa,
# family of qb) (``_family``: "mx", "nvfp4", "centred", and "int8" / "int8_asym" for int8
# with scales constant along K). A pair with an MX, NVFP4 or centred operand that is not
# here is refused.
_NEW_PAIRS = frozenset({
    ("mx", "mx"),  # mxfp8 / mxfp6 / mxfp4, mixed: 2^(ea + eb) per 32 of K
    ("nvfp4", "nvfp4"),  # ue4m3 x ue4m3 per 16 of K, times both tensor scales
    ("centred", "int8"), ("int8", "centred"), ("int8_asym", "centred"),
    ("centred", "centred"),  # the same group size
})  # fmt: skip
# matmul(x, qw): the scale patterns (``_pattern``) a weight may have, by its scale format;
# "tile" (128 x 128) for fp8 elements only. Centred weights are refused.
_WEIGHT_PATTERNS = {
    "f32": frozenset({"tensor", "row", "group", "tile"}),  # int4, int8 (asym too), fp8
    "e8m0": frozenset({"group"}),  # MX, along K
    "ue4m3": frozenset({"group"}),  # NVFP4, along K
}
_BLOCK_SCALED = {"mx": "MX: one e8m0 scale per 32 of K",
                 "nvfp4": "NVFP4: one ue4m3 scale per 16 of K and an fp32 tensor scale"}  # fmt: skip
_X_DTYPES = ("float32", "float16", "bfloat16")  # a plain x (weight-only): the dtypes nqdq.quantize takes


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
            f"with float32 scales (e.g. 'int8_row', 'int8_asym', 'fp8_row', 'fp8_1x128', 'fp8_128x128'), "
            "block-scaled MX / NVFP4 pairs or 'int8_centred'; quantized weights with a plain float x: matmul(x, qw)"
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


def matmul(qa, qb, out_dtype="float32", *, bias=None, activation=None, alpha=1.0, device=None, dtype=None):
    """``act(alpha * dequant(qa) @ dequant(qb).T + bias)`` as ``out_dtype``.

    Parameters
    ----------
    qa : QuantizedTensor [M, K], the activations (see the module docstring for schemes);
        or ``x``, a plain float32 / float16 / bfloat16 array [M, K]: the weight-only GEMM
        ``x @ dequant(qw).T`` (``x`` taken as it is, not quantized).
    qb : QuantizedTensor [N, K], the weights (``qw`` of the weight-only GEMM). K need not be
        a multiple of a scale block (see the module docstring: the last block is partial,
        as if padded with zero codes).
    out_dtype : ``"float32"`` (default), ``"float16"`` or ``"bfloat16"`` (a GPU result holds
        bfloat16 as uint16 bits, as ``nqdq.dequantize`` does there).
    bias : None or N float values (float32 after conversion), added after ``alpha``.
    activation : None, ``"relu"`` or ``"gelu"`` (the erf form, not the tanh approximation).
    alpha : a real scalar multiplying the product.
    device : None (GPU operands run on the GPU, NumPy ones on the CPU reference), ``"cpu"``
        or ``"cuda"`` (tensor-core kernels; NumPy operands are copied over and back, or run
        in Numba's CUDA simulator under NUMBA_ENABLE_CUDASIM=1). MX x MX, NVFP4 x NVFP4 and
        the weight-only GEMM of a bfloat16 x with weights whose scales are constant along K,
        MX or NVFP4 run on the GPU (``_pairs_gpu.new_pair_gpu``); the centred pairs and the other
        weight-only ones on the CPU reference only, for now: on the GPU they raise
        NotImplementedError.
    dtype : ``"bfloat16"`` / ``"float16"`` to read a uint16 ``x`` as the bits of that type,
        as ``nqdq.quantize`` does (CuPy has no bfloat16 dtype); weight-only calls only.

    A call like an earlier GPU call (same schemes, shapes, dtypes, arguments, GPU: see
    ``_hot_key``) skips the checks and launches the remembered GEMM at once (``_RUNNERS``).
    """
    if _RUNNERS and dtype is None and type(qa) is QuantizedTensor and type(qb) is QuantizedTensor:
        try:
            run = _RUNNERS.get(_hot_key(qa, qb, out_dtype, bias, activation, alpha, device))
        except (AttributeError, KeyError, TypeError):  # another library, an unhashable argument
            run = None
        if run is not None:
            return run(qa, qb, bias)
    codes = getattr(qa, "codes", getattr(qb, "codes", None))  # (a plain x: the weights' library)
    if codes is not None and not isinstance(codes, np.ndarray) and not is_cupy(codes):
        from .gpu.runtime import callers as _callers

        caller = _callers.caller_of(codes)
        if caller.name != "cupy" and _arrays.is_device_array(codes):
            return _matmul_for(caller, qa, qb, out_dtype, bias, activation, alpha, device, dtype)
    return _matmul(qa, qb, out_dtype, bias=bias, activation=activation, alpha=alpha, device=device, dtype=dtype)


def _matmul_for(caller, qa, qb, out_dtype, bias, activation, alpha, device, dtype=None):
    """A PyTorch or JAX caller's general path: the operands as the kernels' arrays (zero-copy
    views), the call on that library's current stream of their GPU, the result in the
    caller's library (bfloat16 as its own); a PyTorch call remembers a runner of tensors."""
    import dataclasses

    from .gpu.runtime import callers as _callers
    from .gpu.runtime.devices import ordinal_of
    from .gpu.runtime.interop import kernel_view

    lead = qb.codes if not isinstance(qa, QuantizedTensor) else qa.codes  # (a plain x: the weights' array)

    def view(q):
        if not isinstance(q, QuantizedTensor):
            return q
        return dataclasses.replace(q, **{f: kernel_view(getattr(q, f), f"q.{f}") for f in ARRAY_FIELDS
                                         if getattr(q, f) is not None and type(getattr(q, f)) is type(lead)})

    bias_v = kernel_view(bias, "bias") if bias is not None and type(bias) is type(lead) else bias
    handle = caller.stream(ordinal_of(lead) or 0)
    with _callers.running_on(handle) if handle is not None else _callers._NULL:
        out = _matmul(view(qa), view(qb), out_dtype, bias=bias_v, activation=activation, alpha=alpha, device=device,
                      dtype=dtype, _caller=(caller, qa, qb, bias))  # fmt: skip
        if out.dtype == np.uint16:  # bfloat16 bits
            return caller.result_bfloat16(out)
        return caller.result(out)


@_arrays.on_gpu_of("qa.codes", "qb.codes", "bias")
def _matmul(qa, qb, out_dtype="float32", *, bias=None, activation=None, alpha=1.0, device=None, dtype=None,
            _caller=None):  # fmt: skip
    """matmul's general path, on the operands' GPU: every check, then the GEMM; a GPU call
    remembers a runner for the calls like it (``_remember_runner``). The block-scaled,
    centred and weight-only pairs go to ``_matmul_new``."""
    if dtype is not None and isinstance(qa, QuantizedTensor):
        raise TypeError(f"dtype={dtype!r} reads a plain x's uint16 bits (the weight-only matmul(x, qw)); "
                        "qa is a QuantizedTensor: leave dtype out")  # fmt: skip
    if not isinstance(qa, QuantizedTensor) or _new_family(qa) is not None or _new_family(qb) is not None:
        return _matmul_new(qa, qb, out_dtype, bias, activation, alpha, device, dtype)
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
    out_name, bias = _epilogue_args(out_dtype, activation, alpha, bias, N, on_device)
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


def _epilogue_args(out_dtype, activation, alpha, bias, N, on_device):
    """Check the epilogue's arguments; (out_dtype's name, bias as an array or None)."""
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
    return out_name, bias


# ----------------------------------------------------------------------------- the new pairs
_WEIGHT_F32_ELEMENTS = ("int4", "int8", "e4m3", "e5m2")  # weight-only weights with float32 scales


def _new_family(q):
    """"mx", "nvfp4" or "centred" for a QuantizedTensor of such a scheme; else None (also for
    anything that is not one: the int8 / fp8 checks report it)."""
    sch = getattr(q, "scheme", None)
    if not isinstance(sch, Scheme):
        return None
    return "mx" if sch.is_mx else "nvfp4" if sch.is_nvfp4 else "centred" if sch.centred else None


def _pattern(sch: Scheme, shape) -> str:
    """How the scales of a [rows, K] operand vary: "group" (1 x G groups along K, the last
    one partial where G does not divide K: every group scheme along K, MX, NVFP4 and centred
    included), "tensor" (one), "row" (constant along K: per row or per group of rows),
    "tile" (128 x 128) or "other"."""
    rows, K = shape
    br, bk = (int(v) for v in sch.block_for(shape))
    if sch.granularity == "group" and br == 1:
        return "group"
    if bk >= K:
        return "tensor" if br >= rows else "row"
    if br == 1:
        return "group"
    return "tile" if (br, bk) == (128, 128) else "other"


def _family(q) -> str | None:
    """The family of a checked quantized operand in ``_NEW_PAIRS``: "mx", "nvfp4",
    "centred"; "int8" / "int8_asym" for int8 codes with float32 scales constant along K (the
    INT8 operands of the int8 pairs); None for any other."""
    fam = _new_family(q)
    if fam is not None:
        return fam
    sch, elem = q.scheme, q.scheme.element
    if isinstance(elem, IntFormat) and elem.bits == 8 and _pattern(sch, tuple(q.shape)) in ("tensor", "row"):
        return "int8" if sch.symmetric else "int8_asym"
    return None


def _checked(q, name: str, rows: str):
    """``q`` (argument ``name``) as a 2-D QuantizedTensor with linear scales and the arrays
    its scheme implies, or the error naming it."""
    if not isinstance(q, QuantizedTensor):
        hint = "; matmul does not quantize it: pass nqdq.quantize(w, scheme)" if name in ("qb", "qw") else ""
        raise TypeError(f"{name} must be a QuantizedTensor (from nqdq.quantize), got {type(q).__name__}{hint}")
    q.check_arrays(name)  # shapes, dtypes, presence
    shape = tuple(q.shape)
    if len(shape) != 2:
        raise ValueError(f"{name} must be 2-D ([{rows}, K]), got shape {shape}")
    if q.scale_layout != "linear":
        raise ValueError(f"{name}.scale_layout={q.scale_layout!r}: matmul reads linear scales only; "
                         f"pass {name}.with_layout('linear')")  # fmt: skip
    sch = q.scheme
    if _new_family(q) is not None and int(sch.block_for(shape)[0]) != 1:
        raise ValueError(f"{name} ({sch.name!r}, scale groups {' x '.join(map(str, sch.block_for(shape)))} on shape "
                         f"{shape}) has its scale blocks along axis 0; block-scaled and centred operands need them "
                         "along K: quantize with axis=-1")  # fmt: skip
    return shape


def _new_pair(qa, qb) -> str:
    """The name of a quantized pair with an MX, NVFP4 or centred operand ("mxfp8 x mxfp4"),
    if ``_NEW_PAIRS`` has it; else the ValueError naming qa / qb."""
    fa, fb = _family(qa), _family(qb)
    na, nb = qa.scheme.name, qb.scheme.name
    if (fa, fb) in _NEW_PAIRS:
        ga, gb = int(qa.scheme.block_for(tuple(qa.shape))[1]), int(qb.scheme.block_for(tuple(qb.shape))[1])
        if fa == fb == "centred" and ga != gb:
            raise ValueError(f"qb (centred, groups of {gb} along K) and qa (centred, groups of {ga}) must have the "
                             "same group size: quantize both with the same group_size")  # fmt: skip
        return f"{na} x {nb}"
    if fa in _BLOCK_SCALED and fb in _BLOCK_SCALED:
        raise ValueError(
            f"qa has scheme {na!r} ({_BLOCK_SCALED[fa]}) and qb has scheme {nb!r} ({_BLOCK_SCALED[fb]}): MX and "
            "NVFP4 do not pair (blocks of 32 and 16, e8m0 and ue4m3 scales; a block-scaled MMA takes one block and "
            "one scale format for both operands); quantize both as MX or both as 'nvfp4'"
        )
    for name, fam, other, other_scheme in (("qa", fa, "qb", nb), ("qb", fb, "qa", na)):
        if fam in _BLOCK_SCALED:
            raise ValueError(
                f"{name} has scheme {(na if name == 'qa' else nb)!r} ({_BLOCK_SCALED[fam]}) but {other} has scheme "
                f"{other_scheme!r}; a block-scaled operand pairs with one of its family: MX with MX ('mxfp8', "
                "'mxfp8_e5m2', 'mxfp6_e2m3', 'mxfp6_e3m2', 'mxfp4', mixed), 'nvfp4' with 'nvfp4'. Float "
                "activations with block-scaled weights: the weight-only matmul(x, qw)"
            )
    if fb == "int8_asym":
        raise ValueError(f"qb is asymmetric ({nb!r}); weights must be symmetric int8 (e.g. 'int8_row') "
                         "or 'int8_centred'")  # fmt: skip
    name, other, other_scheme = ("qa", "qb", nb) if fa == "centred" else ("qb", "qa", na)
    raise ValueError(
        f"{name} has scheme 'int8_centred' but {other} has scheme {other_scheme!r}; centred int8 pairs with int8 "
        "whose scales are constant along K ('int8_row', per tensor; 'int8_asym' as qa) or with 'int8_centred'"
    )


def _weight(qw):
    """Check ``qw`` as the weights of the weight-only ``matmul(x, qw)`` (``_WEIGHT_PATTERNS``)."""
    shape = _checked(qw, "qw", "N")
    sch = qw.scheme
    if sch.centred:
        raise ValueError(f"qw has scheme {sch.name!r}: the weight-only matmul(x, qw) takes weights without "
                         "means; a centred weight pairs with a quantized qa (e.g. nqdq.quantize(x, 'int8_row'))")
    pattern = _pattern(sch, shape)
    ok = pattern in _WEIGHT_PATTERNS[sch.scale_format]
    if sch.scale_format == "f32":
        ok = ok and sch.fmt in _WEIGHT_F32_ELEMENTS and (pattern != "tile" or sch.fmt in _FP8)
    if not ok:
        br, bk = sch.block_for(shape)
        raise ValueError(
            f"qw ({sch.name!r}, element {sch.fmt}, scale groups {br} x {bk} on shape {shape}) cannot be the weight "
            "of matmul(x, qw): it takes int4 / int8 / fp8 with scales per row of the [N, K] weight, per group "
            "along K or per tensor ('int4_group', 'int4_asym', 'int8_row', 'fp8_row'), fp8 128 x 128 tiles "
            "('fp8_128x128'), or MX / NVFP4 blocks along K"
            + ("; 'int8_column' (axis=-1) scales input channels: use 'int8_row'" if sch.granularity == "column" else "")
        )


def _dtype_name(a) -> str:
    """NumPy's name of an array's dtype, for any array library ("bfloat16" for torch.bfloat16)."""
    try:
        return np.dtype(a.dtype).name
    except TypeError:
        return str(a.dtype).rpartition(".")[2]


def _plain_x(x, dtype, device):
    """``x`` of the weight-only ``matmul(x, qw)``: (x, whether it runs on the GPU, its dtype's
    name) after the checks, with x on the host as float32 (float16 and bfloat16 convert
    exactly)."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise TypeError(f"qa must be a QuantizedTensor (from nqdq.quantize), or x a float array for the weight-only "
                        f"matmul(x, qw); got {type(x).__name__}")  # fmt: skip
    on_device = _arrays.use_device(x, device, argname="x")
    name = _dtype_name(x)
    if dtype is not None:
        want = _arrays.float_dtype(dtype, "dtype")
        if not (name in ("uint16", "int16") and want.itemsize == 2) and name != want.name:
            raise TypeError(f"dtype={dtype!r} does not match x.dtype={name} (dtype= reads uint16 bits)")
        name = want.name
    elif name not in _X_DTYPES:
        hint = " (bits: pass dtype='bfloat16' or 'float16')" if name in ("uint16", "int16") else ""
        raise TypeError(
            f"x has dtype {name}{hint}; a plain x (the weight-only matmul(x, qw)) must be float32, float16 or "
            "bfloat16, else qa must be a QuantizedTensor (from nqdq.quantize)"
        )
    if len(x.shape) != 2:
        raise ValueError(f"x must be 2-D ([M, K]), got shape {tuple(x.shape)}")
    if on_device:
        return x, True, name
    x32, _ = _arrays.float_input(x, "x", dtype=dtype)
    return x32, False, name


def _host_q(q):
    """``q`` with NumPy arrays (CuPy ones copied), for the reference."""
    import dataclasses

    return dataclasses.replace(q, **{f: _arrays.host(getattr(q, f)) for f in ARRAY_FIELDS})


def _matmul_new(qa, qb, out_dtype, bias, activation, alpha, device, dtype):
    """matmul of the block-scaled, centred and weight-only pairs: the checks (errors name
    qa and qb, or x and qw), then the float64 reference (``nqdq.reference.matmul.matmul``)
    or, on the GPU, ``_pairs_gpu.new_pair_gpu``."""
    if isinstance(qa, QuantizedTensor):
        on_device = _arrays.use_device(qa.codes, device, argname="qa.codes")
        a_name, b_name = "qa", "qb"
        shape_a = _checked(qa, "qa", "M")
        _checked(qb, "qb", "N")
        pair, a, a_gpu = _new_pair(qa, qb), qa, _arrays.is_device_array(qa.codes)
    else:
        a_name, b_name = "x", "qw"
        a, on_device, x_dtype = _plain_x(qa, dtype, device)
        _weight(qb)
        shape_a, a_gpu = tuple(a.shape), _arrays.is_device_array(a)
        pair = f"{x_dtype} x {qb.scheme.name} (weight-only)"
    if a_gpu != _arrays.is_device_array(qb.codes):
        raise ValueError(f"{a_name} and {b_name} must both be on the GPU or both on the host; "
                         f"move {b_name} (or {a_name}) first")  # fmt: skip
    K, (N, Kb) = shape_a[1], tuple(qb.shape)
    if Kb != K:
        raise ValueError(f"{a_name}.shape {shape_a} and {b_name}.shape {tuple(qb.shape)} disagree on K "
                         f"({K} != {Kb}); {b_name} is [N, K]")  # fmt: skip
    if K == 0:
        raise ValueError(f"{a_name} and {b_name} have K = 0")
    out_name, bias = _epilogue_args(out_dtype, activation, alpha, bias, N, on_device)
    if on_device:
        from ._pairs_gpu import new_pair_gpu

        return new_pair_gpu(pair, a, qb, bias=bias, alpha=float(alpha), out_dtype=out_name, activation=activation)
    from .reference import matmul as ref

    a = _host_q(a) if a_name == "qa" else a
    return ref.matmul(a, _host_q(qb), out_name, bias=_arrays.host(bias), activation=activation, alpha=float(alpha))


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
