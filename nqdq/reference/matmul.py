"""The GEMM spec: float64 matmul of the dequantized operands, then the epilogue.

``gemm`` has the launcher's signature (``nqdq.gpu.gemm.plan.gemm``) and is what the
kernels are tested against. With A = dequant(qa) [M, K] and W = dequant(qb) [N, K]:

    out = round_to(out_dtype, act(alpha * (A @ W.T) + bias))

computed in float64 (every dequantized value ``code * scale`` is exact in float64), with
``act`` one of None, ``"relu"`` (max(v, 0)) or ``"gelu"`` (erf form,
0.5 v (1 + erf(v / sqrt 2)) = 0.5 v erfc(-v / sqrt 2), as
``torch.nn.functional.gelu(approximate="none")``; not the tanh approximation).

The kernels accumulate exactly in int32 (int8) or in the tensor core's float32 (fp8), and
apply the epilogue in float32; the reference rounds once at the end. So int8 results agree
to float32 rounding of a few operations (rel. ~1e-7), fp8 ones to float32 accumulation.

``matmul`` is the same spec on whole operands, with ``nqdq.matmul``'s signature: any pair
that ``nqdq.matmul`` accepts (block-scaled MX / NVFP4, centred INT8, a plain float ``x``
times quantized weights, and the int8 / fp8 pairs), each operand dequantized exactly in
float64 by ``dequantize_exact``.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from ..formats import E4M3, FloatFormat
from . import scales as S
from .codec import decode_e8m0, decode_float, decode_int

__all__ = ["gemm", "matmul", "dequantize_exact", "decode_operand", "epilogue", "gelu_erf"]

_FP8 = {
    "e4m3": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64),
    "e5m2": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e5m2).astype(np.float64),
}
_erfc = np.frompyfunc(math.erfc, 1, 1)


def gelu_erf(v: np.ndarray) -> np.ndarray:
    """0.5 v (1 + erf(v / sqrt 2)) in float64, as 0.5 v erfc(-v / sqrt 2) (no cancellation
    for negative v; the kernels use the same form in float32)."""
    return 0.5 * v * _erfc(-v / math.sqrt(2.0)).astype(np.float64)


def _values(codes: np.ndarray, elem: str, za=None, za_mode="tensor") -> np.ndarray:
    if elem in _FP8:
        return _FP8[elem][np.asarray(codes).view(np.uint8)]
    if elem == "bf16":  # bfloat16 values, or their uint16 bits
        c = np.asarray(codes)
        return (c if c.dtype == ml_dtypes.bfloat16 else c.view(np.uint16).view(ml_dtypes.bfloat16)).astype(np.float64)
    v = np.asarray(codes).astype(np.float64)  # int8 codes, or uint8 codes of an asymmetric int8
    if za is not None:
        z = np.asarray(za, np.float64).reshape(-1)
        v = v - (z[:, None] if za_mode == "row" else z[0])
    return v


def _scales(s: np.ndarray, mode: str, rows: int, K: int, block_rows: int) -> np.ndarray:
    """float64 scale of every element of a [rows, K] operand."""
    if mode == "mx":  # e8m0 codes [rows, ceil(K/32)], one per 32 of K (OCP MX)
        v = decode_e8m0(np.asarray(s).view(np.uint8).reshape(rows, -(-K // 32))).astype(np.float64)
        return np.repeat(v, 32, axis=1)[:, :K]
    s = np.asarray(s, np.float64)
    if mode == "tensor":
        return np.full((rows, K), s.reshape(-1)[0])
    if mode == "row":
        return np.repeat(s.reshape(-1)[:, None], K, axis=1)
    s = s.reshape(-(-rows // block_rows), -(-K // 128))  # block: [ceil(rows/br), ceil(K/128)]
    return np.repeat(np.repeat(s, block_rows, axis=0), 128, axis=1)[:rows, :K]


def decode_operand(codes, elem, scales, mode, *, block_rows, za=None):
    """float64 dequantized values of a [rows, K] operand (see ``gemm`` for the arguments)."""
    rows, K = codes.shape
    za_mode = "row" if (za is not None and np.asarray(za).size > 1) else "tensor"
    return _values(codes, elem, za, za_mode) * _scales(scales, mode, rows, K, block_rows)


def gemm(a_codes, b_codes, *, mma, sa, sb, sa_mode, sb_mode, za=None, bias=None, alpha=1.0,
         out_dtype="float32", activation=None, config=None):  # fmt: skip
    """The reference of ``nqdq.gpu.gemm.plan.gemm`` (same arguments; ``config`` unused).

    a_codes [M, K], b_codes [N, K]; mma "s8s8" / "u8s8" (asymmetric A: uint8 codes, zero
    points ``za``, 1 or M of them) / "<fa>.<fb>" (fp8 formats). sa / sb: float32 scales,
    ``sa_mode`` / ``sb_mode`` "tensor" (1 value), "row" (M / N values: per token, per
    output channel), "block" (A: [M, ceil(K/128)] 1x128 groups; B: [ceil(N/128),
    ceil(K/128)] 128x128 tiles) or "mx" (uint8 e8m0 codes, [rows, ceil(K/32)]: one
    power of two 2^(c - 127) per 32 of K, 0xFF NaN; the block-scaled formats' codes
    converted exactly to e4m3 / e5m2). Returns [M, N] NumPy ``out_dtype`` (float32, float16 or
    bfloat16 as ml_dtypes.bfloat16).
    """
    del config
    if mma in ("s8s8", "u8s8"):
        fa = fb = "int8"
    else:
        fa, fb = mma.split(".")
    A = decode_operand(np.asarray(a_codes), fa, sa, sa_mode, block_rows=1, za=za)
    W = decode_operand(np.asarray(b_codes), fb, sb, sb_mode, block_rows=128)
    return epilogue(A @ W.T, bias=bias, alpha=alpha, out_dtype=out_dtype, activation=activation)


def epilogue(product, *, bias=None, alpha=1.0, out_dtype="float32", activation=None):
    """``round_to(out_dtype, act(alpha * product + bias))`` of the float64 ``product``
    [M, N]: float64 throughout, one rounding at the end (bias: N values, taken as float32)."""
    v = float(alpha) * product
    if bias is not None:
        v = v + np.asarray(bias, np.float32).astype(np.float64)[None, :]
    if activation == "relu":
        v = np.maximum(v, 0.0)
    elif activation == "gelu":
        v = gelu_erf(v)
    dt = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[out_dtype]
    return v.astype(dt)


def dequantize_exact(parts, scheme, shape) -> np.ndarray:
    """float64 values of unpacked codes ``parts`` (``reference.quantize.QuantParts``) under
    ``scheme``, for an input of ``shape``; with v the code's value (``decode_float`` /
    ``decode_int``) and s, zp, mean its group's:

    * float scales:   v * s          (int8, int4, fp8; asymmetric: (v - zp) * s)
    * centred int8:   v * s + mean
    * MX:             v * 2^(e - 127)               (e8m0 code e; 0xFF: NaN)
    * NVFP4:          v * (ue4m3(s_b) * S_dec)      (the fp32 tensor scale S_dec)

    Every product is exact in float64 (a code of at most 8 significant bits times a float32
    scale, or NVFP4's 2 + 4 + 24 bits; exponents far inside float64's range), where
    ``reference.quantize.dequantize`` rounds each step to float32; the centred sum is the one
    rounding. Partial groups (a shape that is not a
    multiple of the block) take their group's scale like any other element."""
    shape = tuple(int(d) for d in shape)
    block = scheme.block_for(shape)
    elem = scheme.element
    codes = np.asarray(parts.codes)
    if isinstance(elem, FloatFormat):
        v = decode_float(codes, elem).astype(np.float64)
    else:
        v = decode_int(codes, elem, symmetric=scheme.symmetric).astype(np.float64)

    def each(a):  # one value per group -> one per element
        return S.expand(np.asarray(a), block, shape)

    if scheme.is_mx:
        s = decode_e8m0(np.asarray(parts.scales).view(np.uint8)).astype(np.float64)
    elif scheme.is_nvfp4:
        s_dec = float(np.asarray(parts.tensor_scale, np.float32).reshape(-1)[0])
        s = decode_float(np.asarray(parts.scales).view(np.uint8), E4M3).astype(np.float64) * s_dec
    else:
        s = np.asarray(parts.scales, np.float32).astype(np.float64)
    if not scheme.symmetric:
        v = v - each(parts.zero_points).astype(np.float64)
    v = v * each(s)
    if scheme.centred:
        v = v + each(np.asarray(parts.means, np.float32)).astype(np.float64)
    return v


def _operand_values(q) -> np.ndarray:
    """float64 values of a matmul operand: a QuantizedTensor of host arrays, dequantized
    exactly, or a float array (float32 / float16 / ml_dtypes.bfloat16) as it is."""
    if not hasattr(q, "scheme"):
        return np.asarray(q).astype(np.float64)
    from .quantize import QuantParts

    parts = QuantParts(q.unpacked_codes(), q.scales, q.zero_points, q.tensor_scale, q.means)
    return dequantize_exact(parts, q.scheme, tuple(q.shape))


def matmul(qa, qb, out_dtype="float32", *, bias=None, activation=None, alpha=1.0):
    """The spec of ``nqdq.matmul(qa, qb, ...)`` (same arguments, less ``device``):
    ``epilogue(A @ W.T)`` with A = ``dequantize_exact(qa)`` [M, K] (or a plain float ``qa``,
    the weight-only GEMM's activations ``x``, as they are) and W = ``dequantize_exact(qb)``
    [N, K]. Host arrays, linear scales; ``nqdq.matmul`` checks the pair first.

    Per element product this is the formats' own scaling: 2^(ea + eb) for two MX operands
    (mixed element formats alike); ue4m3(s_a) ue4m3(s_b) S_dec,a S_dec,b for two NVFP4 ones.
    For a centred A (groups g of K, scales s_a, means mu_a) it equals the issue's
    C[m, n] = sum_g (s_a[m, g] sum_(k in g) q_a[m, k] b[n, k] + mu_a[m, g] sum_(k in g) b[n, k]),
    with b the dequantized B."""
    A = _operand_values(qa)
    W = _operand_values(qb)
    return epilogue(A @ W.T, bias=bias, alpha=alpha, out_dtype=out_dtype, activation=activation)
