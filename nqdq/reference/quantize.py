"""Quantize / dequantize for every scheme, in vectorized NumPy: the spec, and the CPU backend.

Inputs are float32 arrays (the API converts float16 / bfloat16 exactly). Every scale
group follows :meth:`nqdq.schemes.Scheme.block_for`; a group cut short by the end of an
axis (a shape that is not a multiple of the block) is a *partial* group: its scale is
computed from the elements it has (as if padded with zeros, which never change a max
or a sum) and it is stored like any other, so ``scales.shape[i] == ceil(shape[i] / block[i])``.

Element arithmetic (float32, one rounding each):

* float scales:   code = encode(x / s)                       decode: value(code) * s
* asymmetric int: code = clip(rint(x / s) + zp, 0, qmax)     decode: (code - zp) * s
* centred int8:   code = rint((x - mean) / s)                decode: code * s + mean
* MX:             code = encode(x / 2^k)                     decode: value(code) * 2^k
* NVFP4:          code = encode(x * m_b)                     decode: value(code) * (s_b * S_dec)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..formats import E4M3, FloatFormat
from ..schemes import Scheme
from . import scales as S
from .codec import decode_float, decode_int, encode_float, encode_int, rint_stochastic
from .rng import random_bits

__all__ = ["QuantParts", "quantize", "dequantize"]

F32 = np.float32


@dataclass
class QuantParts:
    """What quantize produces: unpacked codes (one per byte, input shape) and scale data."""

    codes: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None = None
    tensor_scale: np.ndarray | None = None  # float32 scalar (NVFP4 S_dec)
    means: np.ndarray | None = None  # centred INT8


def _encode(v: np.ndarray, scheme: Scheme, rbits) -> np.ndarray:
    elem = scheme.element
    if isinstance(elem, FloatFormat):
        return encode_float(v.astype(F32), elem, saturate=True, rbits=rbits)
    return encode_int(v, elem, symmetric=True, rbits=rbits)


def _values(codes: np.ndarray, scheme: Scheme) -> np.ndarray:
    elem = scheme.element
    if isinstance(elem, FloatFormat):
        return decode_float(codes, elem)
    return decode_int(codes, elem, symmetric=scheme.symmetric)


def quantize(x: np.ndarray, scheme: Scheme, *, scale=None, seed=None) -> QuantParts:
    """Quantize float32 ``x`` under ``scheme``. ``scale``: caller-given float32 scales,
    broadcastable to ``scheme.scale_shape(x.shape)``; for NVFP4 the one tensor scale S_dec
    (``tensor_scale``; S_enc from it by ``scales.nvfp4_given_encode_scale``). ``seed`` (int)
    selects stochastic rounding with Philox bits keyed by the seed and each element's C-order
    index."""
    x = np.ascontiguousarray(x, dtype=F32)
    block = scheme.block_for(x.shape)
    sshape = scheme.scale_shape(x.shape)
    rbits = None if seed is None else random_bits(seed, x.size).reshape(x.shape)

    if scheme.is_mx:
        code = S.mx_scale_code(S.block_amax(x, block), scheme.element, scheme.scale_rounding)
        with np.errstate(invalid="ignore"):
            v = x / S.expand(S.mx_scale_value(code), block, x.shape)
        return QuantParts(_encode(v, scheme, rbits), code)

    if scheme.is_nvfp4:
        if scale is None:
            finite = np.where(np.isfinite(x), np.abs(x), F32(0))
            s_enc = S.nvfp4_tensor_encode_scale(finite.max() if x.size else F32(0))
        else:  # the tensor scale S_dec given: S_enc from it, no pass over the tensor
            s_enc = S.nvfp4_given_encode_scale(scale)
        code = S.nvfp4_block_scale_code(S.block_amax(x, block), s_enc)
        mult, s_dec = S.nvfp4_element_multiplier(code, s_enc)
        with np.errstate(over="ignore", invalid="ignore"):
            v = (x * S.expand(mult, block, x.shape)).astype(F32)
        tensor_scale = np.array(s_dec if scale is None else np.asarray(scale, F32).reshape(()), F32)
        return QuantParts(_encode(v, scheme, rbits), code, tensor_scale=tensor_scale)

    elem = scheme.element
    if scheme.centred:
        v, _ = S.blocked(x, block)
        axes = tuple(range(1, v.ndim, 2))
        # last groups along an axis may be partial: divide by the real element count
        ones, _ = S.blocked(np.ones(x.shape, F32), block)
        count = ones.sum(axis=axes).astype(F32)
        flat = np.moveaxis(v, axes, tuple(range(v.ndim - len(axes), v.ndim)))
        flat = flat.reshape(flat.shape[: v.ndim - len(axes)] + (int(np.prod(block)),))
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = S.group_mean(flat, count)
            c = (x - S.expand(mean, block, x.shape)).astype(F32)
            s, mean = S.centred_params(mean, S.block_amax(c, block), elem.max_value(True))
            c = (x - S.expand(mean, block, x.shape)).astype(F32)
        with np.errstate(invalid="ignore"):
            q = encode_int(c / S.expand(s, block, x.shape), elem, symmetric=True, rbits=rbits)
        return QuantParts(q, s, means=mean)

    if not scheme.symmetric:  # asymmetric integer with zero point
        lo, qmax = elem.qrange(False)
        v, axes = S.blocked(x, block)
        with np.errstate(invalid="ignore", over="ignore"):
            xmin = np.minimum(np.min(v, axis=axes), F32(0)) if v.size else np.zeros(sshape, F32)
            xmax = np.maximum(np.max(v, axis=axes), F32(0)) if v.size else np.zeros(sshape, F32)
            s, zp = S.asym_scale_zero_point(xmax, xmin, qmax)
            r = (x / S.expand(s, block, x.shape)).astype(F32)
        r = np.clip(r, -(qmax + 1), qmax + 1)  # keeps |r| small so its fraction is exact
        r = np.where(np.isnan(r), F32(0), r)
        q = rint_stochastic(r, rbits).astype(np.int64) + S.expand(zp, block, x.shape)
        return QuantParts(np.clip(q, 0, qmax).astype(np.uint8), s, zero_points=zp)

    if scale is not None:
        s = np.broadcast_to(np.asarray(scale, F32), sshape).astype(F32)
    else:
        max_elem = elem.max_value if isinstance(elem, FloatFormat) else elem.max_value(True)
        s = S.float_scale(S.block_amax(x, block), max_elem)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        v = (x / S.expand(s, block, x.shape)).astype(F32)
    return QuantParts(_encode(v, scheme, rbits), s)


def dequantize(parts: QuantParts, scheme: Scheme, shape: tuple[int, ...]) -> np.ndarray:
    """float32 values of unpacked codes under ``scheme`` (see the module docstring)."""
    block = scheme.block_for(shape)
    vals = _values(parts.codes, scheme)
    with np.errstate(invalid="ignore", over="ignore"):
        if scheme.is_mx:
            return (vals * S.expand(S.mx_scale_value(parts.scales), block, shape)).astype(F32)
        if scheme.is_nvfp4:
            sb = decode_float(parts.scales, E4M3)
            m = (sb * F32(parts.tensor_scale)).astype(F32)
            return (vals * S.expand(m, block, shape)).astype(F32)
        s = S.expand(parts.scales, block, shape)
        if scheme.centred:
            return ((vals * s).astype(F32) + S.expand(parts.means, block, shape)).astype(F32)
        if not scheme.symmetric:
            zp = S.expand(parts.zero_points, block, shape).astype(F32)
            return ((vals - zp).astype(F32) * s).astype(F32)
        return (vals * s).astype(F32)

