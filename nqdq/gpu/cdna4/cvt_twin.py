"""gfx950's scaled down-conversions, ``llvm.amdgcn.cvt.scalef32.pk.{fp4,fp8,bf8}.f32``
(``v_cvt_scalef32_pk_fp4_f32``, ``v_cvt_scalef32_pk_fp8_f32``, ``v_cvt_scalef32_pk_bf8_f32``):
their LLVM IR, and Python twins of what they are taken to compute -- assembled for gfx950,
not run.

Semantics modelled (from LLVM's intrinsic definitions and MLIR's lowering of
``arith.scaling_truncf`` -- which divides by the scale -- to these instructions with the
scale passed through; not checked on hardware):

* each of ``src0``, ``src1`` becomes the code nearest to ``src / scale`` (ties to the even
  code), magnitudes past the format's largest finite value saturating to it (an
  assumption: the saturation behaviour is not documented in the sources read; NaN and inf
  inputs are left out for the same reason);
* fp4: ``code(src0) | code(src1) << 4`` replaces byte ``dst_sel`` (0-3) of ``old``;
* fp8 / bf8: ``code(src0) | code(src1) << 8`` replaces the 16-bit half ``word_sel`` of ``old``.

The twins round by searching the format's value table (nearest value, tie to the even
code) -- a different algorithm from ``reference/codec.encode_float``'s bit manipulation, so
that comparing the two over every input class (tests/test_cdna4_gemm.py) checks one
against the other.
"""

from __future__ import annotations

import numpy as np

from ...formats import E2M1, E4M3, E5M2, FloatFormat
from ...reference.codec import float_code_table

__all__ = [
    "round_to_code", "cvt_scalef32_pk_fp4_f32", "cvt_scalef32_pk_fp8_f32", "cvt_scalef32_pk_bf8_f32",
    "cvt_ir", "CVT_MNEMONICS",
]

CVT_MNEMONICS = ("v_cvt_scalef32_pk_fp4_f32", "v_cvt_scalef32_pk_fp8_f32", "v_cvt_scalef32_pk_bf8_f32")


def round_to_code(v, fmt: FloatFormat) -> np.ndarray:
    """Codes (uint8) of finite float64 ``v``: nearest representable magnitude, ties to the even
    code, saturating at the largest finite magnitude; the sign bit is ``v``'s (-0.0 included)."""
    v = np.asarray(v, np.float64)
    mags = float_code_table(fmt)[: fmt.max_code + 1].astype(np.float64)  # ascending with the code
    a = np.abs(v)
    hi = np.clip(np.searchsorted(mags, a), 1, fmt.max_code)  # mags[hi - 1] < a <= mags[hi]
    lo = hi - 1
    d_lo, d_hi = a - mags[lo], mags[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo)
    code = np.where(a >= mags[fmt.max_code], fmt.max_code, code)
    sign = np.signbit(v).astype(np.int64) << (fmt.bits - 1)
    return (code | sign).astype(np.uint8)


def _scaled(src, scale):
    return np.asarray(src, np.float32).astype(np.float64) / np.float64(np.float32(scale))


def cvt_scalef32_pk_fp4_f32(old, src0, src1, scale, dst_sel: int):
    """uint32: byte ``dst_sel`` of ``old`` replaced by the two e2m1 codes of src / scale."""
    if dst_sel not in (0, 1, 2, 3):
        raise ValueError(f"dst_sel must be 0..3, got {dst_sel!r}")
    byte = round_to_code(_scaled(src0, scale), E2M1).astype(np.uint32) | (
        round_to_code(_scaled(src1, scale), E2M1).astype(np.uint32) << np.uint32(4))
    shift = np.uint32(8 * dst_sel)
    return (np.asarray(old, np.uint32) & ~(np.uint32(0xFF) << shift)) | (byte << shift)


def _pk8(old, src0, src1, scale, word_sel, fmt):
    half = round_to_code(_scaled(src0, scale), fmt).astype(np.uint32) | (
        round_to_code(_scaled(src1, scale), fmt).astype(np.uint32) << np.uint32(8))
    shift = np.uint32(16 * bool(word_sel))
    return (np.asarray(old, np.uint32) & ~(np.uint32(0xFFFF) << shift)) | (half << shift)


def cvt_scalef32_pk_fp8_f32(old, src0, src1, scale, word_sel: bool):
    """uint32 (the ``<2 x i16>`` result): half ``word_sel`` replaced by two e4m3 codes."""
    return _pk8(old, src0, src1, scale, word_sel, E4M3)


def cvt_scalef32_pk_bf8_f32(old, src0, src1, scale, word_sel: bool):
    """As :func:`cvt_scalef32_pk_fp8_f32`, e5m2 codes."""
    return _pk8(old, src0, src1, scale, word_sel, E5M2)


def cvt_ir() -> str:
    """An LLVM IR module with one function per conversion (operands from arguments, so
    nothing folds), for assembling: ``@cvt_fp4(i32, float, float, float)`` writes byte 1,
    ``@cvt_fp8`` / ``@cvt_bf8`` write the high half."""
    return """; gfx950 scaled conversions, assembled for gfx950, not run (nqdq.gpu.cdna4.cvt_twin)
target triple = "amdgcn-amd-amdhsa"

declare i32 @llvm.amdgcn.cvt.scalef32.pk.fp4.f32(i32, float, float, float, i32)
declare <2 x i16> @llvm.amdgcn.cvt.scalef32.pk.fp8.f32(<2 x i16>, float, float, float, i1)
declare <2 x i16> @llvm.amdgcn.cvt.scalef32.pk.bf8.f32(<2 x i16>, float, float, float, i1)

define i32 @cvt_fp4(i32 %old, float %x, float %y, float %scale) #0 {
  %r = call i32 @llvm.amdgcn.cvt.scalef32.pk.fp4.f32(i32 %old, float %x, float %y, float %scale, i32 1)
  ret i32 %r
}

define <2 x i16> @cvt_fp8(<2 x i16> %old, float %x, float %y, float %scale) #0 {
  %r = call <2 x i16> @llvm.amdgcn.cvt.scalef32.pk.fp8.f32(<2 x i16> %old, float %x, float %y, float %scale, i1 true)
  ret <2 x i16> %r
}

define <2 x i16> @cvt_bf8(<2 x i16> %old, float %x, float %y, float %scale) #0 {
  %r = call <2 x i16> @llvm.amdgcn.cvt.scalef32.pk.bf8.f32(<2 x i16> %old, float %x, float %y, float %scale, i1 true)
  ret <2 x i16> %r
}

attributes #0 = { nounwind }
"""
