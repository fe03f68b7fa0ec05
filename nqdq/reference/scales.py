"""Scale computation: blocked reductions and the scale formulas of every scheme.

All arithmetic is float32 with one IEEE rounding per operation, written in the order a
kernel performs it; that order is part of the spec (a kernel that reassociates gives
different bits). Non-finite policy: a NaN or +-inf anywhere in a scale group makes that
group's scale NaN (float32 NaN, e8m0 0xFF, ue4m3 0x7F), so the whole group decodes to NaN;
other groups are unaffected (for NVFP4 the tensor amax is taken over finite values only).
"""

from __future__ import annotations

import numpy as np

from ..formats import E4M3, FloatFormat
from .codec import decode_e8m0, decode_float, encode_float

__all__ = [
    "range_scale",
    "blocked",
    "expand",
    "block_amax",
    "tensor_amax",
    "float_scale",
    "finite_top_scale",
    "asym_scale_zero_point",
    "centred_params",
    "mx_scale_code",
    "mx_top_code",
    "nvfp4_tensor_encode_scale",
    "nvfp4_given_encode_scale",
    "NVFP4_TENSOR_SCALE_MIN",
    "NVFP4_TENSOR_SCALE_MAX",
    "nvfp4_block_scale_code",
    "nvfp4_element_multiplier",
    "halving_sum",
    "group_mean",
]

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)


def blocked(x: np.ndarray, block: tuple[int, ...], fill=0.0):
    """View ``x`` as ``(n0, b0, n1, b1, ...)`` blocks, padding each axis with ``fill``.

    Returns ``(view, axes)`` where reducing ``view`` over ``axes`` gives one value per block.
    """
    pad = [(0, -d % b) for d, b in zip(x.shape, block)]
    if any(p for _, p in pad):
        x = np.pad(x, pad, constant_values=fill)
    shape = []
    for d, b in zip(x.shape, block):
        shape += [d // b, b]
    return x.reshape(shape), tuple(range(1, 2 * x.ndim, 2))


def expand(s: np.ndarray, block: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    """Broadcast one value per block back to every element of an input of ``shape``."""
    out = s
    for ax, b in enumerate(block):
        if b != 1:
            out = np.repeat(out, b, axis=ax)
    return out[tuple(slice(0, d) for d in shape)]


def block_amax(x: np.ndarray, block) -> np.ndarray:
    """max |x| per block (NaN if the block holds a NaN); padding contributes 0."""
    v, axes = blocked(np.abs(x), block)
    return np.max(v, axis=axes) if v.size else np.zeros([v.shape[i] for i in range(0, v.ndim, 2)], F32)


def tensor_amax(x: np.ndarray, finite: bool = False) -> np.float32:
    """The amax of the whole tensor as the dynamic per-tensor scales take it, and as
    ``quantize(..., amax_out=)`` records it: the float32 whose bits are the largest bits of
    |x| (x as float32; a NaN orders above +inf, so a NaN's payload is kept, as the kernels'
    integer max of |x|'s bits keeps it), over the finite values only when ``finite``
    (NVFP4's tensor amax); 0 for an empty x."""
    b = np.ascontiguousarray(x, F32).reshape(-1).view(np.uint32) & np.uint32(0x7FFFFFFF)
    if finite:
        b = b[b < np.uint32(0x7F800000)]
    return np.array(b.max() if b.size else 0, np.uint32).view(F32)[()]


def float_scale(amax: np.ndarray, max_elem: float) -> np.ndarray:
    """float32 dequantization scale ``amax / max_elem`` (float32 division).

    A scale that would be 0 (an all-zero block, or amax so small the quotient underflows)
    is 1.0, so every code decodes to 0 and nothing divides by zero; a non-finite amax
    gives NaN. A scale whose largest code would decode to inf (``max_elem * s`` overflows:
    amax within about an ulp of FLT_MAX, and the quotient rounded up) is lowered by one
    ulp (:func:`finite_top_scale`), so every code decodes finite.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = (amax.astype(F32) / F32(max_elem)).astype(F32)
    s = finite_top_scale(np.where(s == 0, F32(1.0), s), max_elem)
    return np.where(np.isfinite(amax), s, F32(np.nan)).astype(F32)


def finite_top_scale(s: np.ndarray, top) -> np.ndarray:
    """``s``, or the float32 just below it where ``top * s`` (float32) overflows although
    ``s`` is finite. One step is enough for every ``s <= RN(FLT_MAX / top)`` (the scales
    this is applied to): then ``top * prev(s) <= FLT_MAX`` exactly."""
    s = np.asarray(s, F32)
    with np.errstate(over="ignore", invalid="ignore"):
        over = np.isinf((s * np.asarray(top, F32)).astype(F32)) & np.isfinite(s)
    return np.where(over, np.nextafter(s, F32(0)), s).astype(F32)


def range_scale(hi: np.ndarray, lo: np.ndarray, qmax: int) -> np.ndarray:
    """Asymmetric scale ``(hi - lo) / qmax`` (float32), 1.0 where that is 0.

    When ``hi - lo`` overflows although both are finite, the same quotient is formed from
    halves, ``((hi * 0.5 - lo * 0.5) / qmax) * 2`` -- each step exact or rounded exactly as
    the plain formula (scaling by powers of two commutes with rounding away from the
    subnormal range), so the result is what an overflow-free float32 would give.
    """
    hi, lo = hi.astype(F32), lo.astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        span = (hi - lo).astype(F32)
        halved = ((((hi * F32(0.5)) - (lo * F32(0.5))).astype(F32) / F32(qmax)).astype(F32) * F32(2)).astype(F32)
    plain = float_scale(span, float(qmax))
    return np.where(np.isinf(span) & np.isfinite(hi) & np.isfinite(lo), halved, plain).astype(F32)


def asym_scale_zero_point(hi: np.ndarray, lo: np.ndarray, qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """(scale, zero point) of asymmetric groups with ``hi = max(max x, 0)``, ``lo = min(min x, 0)``.

    ``s = range_scale(hi, lo, qmax)`` (NaN if either is non-finite), ``zp = clip(rint(-lo / s),
    0, qmax)`` (0 for a NaN quotient). Codes decode as ``(code - zp) * s`` with ``|code - zp|
    <= n = max(zp, qmax - zp)``; where ``n * s`` (float32) overflows -- a range near or past
    FLT_MAX, e.g. ``[FLT_MAX, -FLT_MAX]`` -- the scale becomes the largest one the zero point
    allows, ``finite_top_scale(RN(FLT_MAX / n), n)``, so every code decodes finite (values
    beyond ``n * s`` saturate to the end codes). Elsewhere nothing changes.
    """
    hi, lo = np.asarray(hi, F32), np.asarray(lo, F32)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        s = range_scale(hi, lo, qmax)
        s = np.where(np.isfinite(lo) & np.isfinite(hi), s, F32(np.nan)).astype(F32)
        zp = np.clip(np.rint((-lo / s).astype(F32)), 0, qmax)
        zp = np.where(np.isnan(zp), 0, zp).astype(np.uint8)
        n = np.maximum(zp.astype(F32), F32(qmax) - zp.astype(F32)).astype(F32)
        over = np.isinf((n * s).astype(F32)) & np.isfinite(s)
        top = finite_top_scale((FLT_MAX / n).astype(F32), n)
    return np.where(over, top, s).astype(F32), zp


# centred INT8: a group is centred on its mean unless code * s + mean could overflow
CENTRED_MARGIN = F32(1.015625)  # 1 + 2^-6: above 1 + 1/254 (half a step) plus the roundings


def centred_params(mean: np.ndarray, amax_c: np.ndarray, qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """(scale, mean) of centred groups from the group mean and ``amax_c = max |x - mean|``.

    Normally ``s = float_scale(amax_c, qmax)`` and the mean is kept. A finite group (amax_c
    not NaN) whose decode ``code * s + mean`` could overflow -- ``R = |mean| + amax_c *
    (1 + 2^-6)`` (float32, each operation rounded) is inf, which includes a residual ``x -
    mean`` or a partial group's mean that overflowed -- is not centred: its mean is 0 and
    its scale ``float_scale(FLT_MAX, qmax)``, so codes are ``rint(x / s)`` and decode finite.
    Where R is finite, |code * s + mean| <= R (each code is within half a step of x - mean),
    so those groups decode finite as they are. R is finite for every group with |x| <= 1e38.
    """
    mean, amax_c = np.asarray(mean, F32), np.asarray(amax_c, F32)
    with np.errstate(over="ignore", invalid="ignore"):
        r = (np.abs(mean) + (amax_c * CENTRED_MARGIN).astype(F32)).astype(F32)
    plain = float_scale(amax_c, qmax)
    fallback = np.isinf(r) & ~np.isnan(amax_c)
    s = np.where(fallback, float_scale(np.array(FLT_MAX, F32), qmax), plain).astype(F32)
    return s, np.where(fallback, F32(0), mean).astype(F32)


def mx_scale_code(amax: np.ndarray, elem: FloatFormat, rounding: str) -> np.ndarray:
    """OCP MX shared scale as an e8m0 code (uint8), per ``rounding`` (see schemes.SCALE_ROUNDINGS).

    floor:  k = floor(log2 amax) - emax_elem, clamped to [-127, 127]; amax = 0 or an fp32
            subnormal amax gives k = -127 (microxcaling adds FP32_MIN_NORMAL; same code).
    even:   as floor after rounding amax half-up to the element's mantissa width
            (adding 2^(22 - mbits) to the bits and clearing the mantissa); a finite amax
            that rounds to 2^128 uses exponent 128.
    rceil:  v = amax * fp32(1 / max_elem); the smallest 2^k >= v, k in [-127, 127]
            (TransformerEngine float_to_e8m0 / cvt.rp.satfinite.ue8m0x2.f32).

    In every mode k is then at most 127 - emax_elem (code 254 - emax_elem), so that every
    element code decodes finite: value * 2^k <= max_elem * 2^(127 - emax_elem) < 2^128.
    Only blocks whose amax exceeds that bound (2.98e38 for e4m3, 2.55e38 for e2m1) are
    affected; their largest elements saturate to it.
    """
    a = np.asarray(amax, F32)
    bits = a.view(np.uint32).astype(np.int64)
    if rounding in ("floor", "even"):
        if rounding == "even":
            bits = (bits + (1 << (22 - elem.mbits))) & 0xFF800000
        # for "even" a carry can reach exponent field 0xFF: the amax rounded to 2^128,
        # which still gives a finite k (unlike torchao's current EVEN, which gives NaN there)
        ef = (bits >> 23) & 0x1FF
        code = np.clip(ef - 127 - elem.emax, -127, 127) + 127
        bad = ~np.isfinite(a)
    elif rounding == "rceil":
        v = (a * F32(1.0 / elem.max_value)).astype(F32)
        vb = v.view(np.uint32).astype(np.int64)
        ef = (vb >> 23) & 0xFF
        man = vb & 0x7FFFFF
        up = (man > 0) & (ef != 0xFE) & ~((ef == 0) & (man <= 0x400000))
        code = ef + up
        bad = ~np.isfinite(v)
    else:
        raise ValueError(f"scale_rounding={rounding!r} is not one of ('floor', 'rceil', 'even')")
    code = np.minimum(code, mx_top_code(elem))
    return np.where(bad, 0xFF, code).astype(np.uint8)


def mx_top_code(elem: FloatFormat) -> int:
    """The largest e8m0 code of a finite block: 2^(code - 127) * max_elem stays below 2^128."""
    return 254 - elem.emax


def mx_scale_value(code: np.ndarray) -> np.ndarray:
    """The float32 value 2^(code-127) that elements are divided by (NaN for 0xFF)."""
    return decode_e8m0(code)


# --- NVFP4 (TransformerEngine, transformer_engine/common/cast/nvfp4/core_nvfp4.cuh) -------

_NVFP4_FP8_MAX = F32(448.0)
_NVFP4_FP4_MAX = F32(6.0)


def nvfp4_tensor_encode_scale(finite_amax: F32) -> F32:
    """S_enc = 448 * 6 / amax (float32), min(., FLT_MAX); 1.0 when amax is 0 or S_enc is 0."""
    a = F32(finite_amax)
    if a == 0:
        return F32(1.0)
    with np.errstate(divide="ignore", over="ignore"):
        s = F32(_NVFP4_FP8_MAX * _NVFP4_FP4_MAX) / a
    s = min(F32(s), FLT_MAX)
    return F32(1.0) if s == 0 else F32(s)


# The tensor scales S_dec = RN(1 / S_enc) that the dynamic path can give, and so the range a
# caller-given one (``scale=``) must lie in: at the bottom the S_dec of S_enc = FLT_MAX, RN(1 /
# FLT_MAX) = 2^-128 (below it RN(1 / S_dec) overflows); at the top the S_dec of amax = FLT_MAX,
# RN(1 / RN(2688 / FLT_MAX)), which is also the largest S_dec whose top decode
# fp32(6 * fp32(448 * S_dec)) is finite.
NVFP4_TENSOR_SCALE_MIN = F32(float.fromhex("0x1p-128"))  # 2.9387359e-39 (a float32 subnormal)
NVFP4_TENSOR_SCALE_MAX = F32(float.fromhex("0x1.86186p+116"))  # 1.2659313e+35


def nvfp4_given_encode_scale(s_dec) -> F32:
    """S_enc of a caller-given tensor scale S_dec (``scale=``, the value stored as the tensor
    scale): ``min(RN(1 / S_dec), FLT_MAX)`` (float32 division; the min acts at S_dec = 2^-128
    alone, whose reciprocal 2^128 overflows, and gives the dynamic path's clamped S_enc).

    Why this is the dynamic path's S_enc where it can be: RN(1 / RN(1 / RN(1 / y))) = RN(1 / y)
    for every float32 y (the reciprocal rounded to nearest is monotone), so for S_dec = RN(1 /
    S_enc0) of a dynamic S_enc0, RN(1 / S_enc) = S_dec: the element multipliers, which use
    1 / S_enc, are the dynamic path's. S_enc itself equals S_enc0 where S_enc0's reciprocal
    round-trips (83 % of float32 values); elsewhere two neighbouring float32 S_enc share one
    S_dec and S_enc is the one nearer 1 / S_dec, the other's neighbour. A ValueError naming
    ``scale`` for S_dec outside [NVFP4_TENSOR_SCALE_MIN, NVFP4_TENSOR_SCALE_MAX] (not
    positive, NaN and inf included)."""
    s = np.asarray(s_dec, F32)
    if s.size != 1:
        raise ValueError(f"scale of scheme 'nvfp4' is its one tensor scale: one value, got shape {s.shape}")
    s = F32(s.reshape(()))
    if not NVFP4_TENSOR_SCALE_MIN <= s <= NVFP4_TENSOR_SCALE_MAX:
        raise ValueError(
            f"scale={float(s)!r}: NVFP4's tensor scale S_dec must lie in [2^-128, 0x1.86186p+116] "
            "(~[2.94e-39, 1.27e35]), the range of amax / 2688 (below it 1 / scale overflows float32, "
            "above it the largest code decodes to inf)"
        )
    with np.errstate(divide="ignore", over="ignore"):
        e = F32(F32(1.0) / s)
    return min(e, FLT_MAX)


def nvfp4_block_scale_code(block_amax: np.ndarray, s_enc: F32) -> np.ndarray:
    """ue4m3 block scale: e4m3(block_amax * (S_enc * fp32(1/6))), RN, saturating."""
    t = F32(s_enc * F32(1.0 / 6.0))
    with np.errstate(over="ignore", invalid="ignore"):
        v = (block_amax.astype(F32) * t).astype(F32)
    code = encode_float(v, E4M3, saturate=True)
    return np.where(np.isfinite(block_amax), code, np.uint8(E4M3.nan_code)).astype(np.uint8)


def nvfp4_element_multiplier(code: np.ndarray, s_enc: F32) -> tuple[np.ndarray, F32]:
    """Per-block multiplier fmin(1 / (float(s_b) * (1 / S_enc)), FLT_MAX) and S_dec = 1 / S_enc."""
    s_dec = F32(F32(1.0) / F32(s_enc))
    sb = decode_float(code, E4M3)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        mult = np.fmin((F32(1.0) / (sb * s_dec).astype(F32)).astype(F32), FLT_MAX)
    return mult.astype(F32), s_dec


def group_mean(v: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Mean of each row of ``v`` (a group padded with zeros to ``v.shape[-1]``, holding
    ``count`` real elements), as ``halving_sum(v * 2^-k) * (fp32(P) / fp32(count))`` with
    ``P = 2^k`` the group length padded to a power of two.

    Scaling every element by 2^-k first (exact, away from the subnormal range) keeps every
    partial sum within the largest |v|, so a group of large finite values never overflows
    to inf; for a full power-of-two group the factor is exactly 1 and the mean is the
    halving sum of the scaled values.
    """
    n = v.shape[-1]
    p = 1 << max(n - 1, 0).bit_length()
    s = halving_sum((v.astype(F32) * F32(1.0 / p)).astype(F32))
    factor = (F32(p) / np.maximum(count, F32(1)).astype(F32)).astype(F32)
    return (s * factor).astype(F32)


def halving_sum(v: np.ndarray) -> np.ndarray:
    """Sum over the last axis by repeated halving (v[:h] + v[h:]) in float32, after padding
    the axis with zeros to a power of two. This fixed tree is the order a warp's shuffle
    reduction adds in, so a kernel can reproduce the sum bit for bit."""
    n = v.shape[-1]
    p = 1 << max(n - 1, 0).bit_length()
    if p != n:
        v = np.concatenate([v, np.zeros(v.shape[:-1] + (p - n,), v.dtype)], axis=-1)
    v = v.astype(F32)
    while v.shape[-1] > 1:
        h = v.shape[-1] // 2
        v = (v[..., :h] + v[..., h:]).astype(F32)
    return v[..., 0]
