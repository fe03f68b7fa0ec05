"""``matmul``: GEMMs on quantized tensors with the dequantization fused into the epilogue.

``matmul(qa, qb)`` computes ``dequant(qa) @ dequant(qb).T`` for activations ``qa`` [M, K]
and weights ``qb`` [N, K] (the usual ``nn.Linear`` layout), then ``alpha``, ``bias``,
an activation and the output rounding, on tensor cores (``nqdq.kernels.gemm``) or by the
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
from .quantized import QuantizedTensor

__all__ = ["matmul"]

_ACTIVATIONS = (None, "relu", "gelu")
_FP8 = ("e4m3", "e5m2")


class _Operand:
    """One operand's codes and scale data as the GEMM takes them."""

    def __init__(self, codes, elem, scales, mode, za=None):
        self.codes, self.elem, self.scales, self.mode, self.za = codes, elem, scales, mode, za


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
        return _Operand(q.codes, elem.name if is_fp8 else "int8", s, mode, za)
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


@_arrays.on_gpu_of("qa.codes", "qb.codes", "bias")
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
    """
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
        from .kernels import gemm as kg

        return kg.gemm(a.codes, b.codes, **kw)
    from .reference import matmul as ref

    h = _arrays.host
    kw.update(sa=h(kw["sa"]), sb=h(kw["sb"]), za=h(kw["za"]), bias=None if bias is None else h(bias))
    return ref.gemm(h(a.codes), h(b.codes), **kw)
