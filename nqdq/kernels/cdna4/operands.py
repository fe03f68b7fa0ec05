"""Operand layouts of gfx950's ``v_mfma_scale_f32_32x32x64_f8f6f4``: which lane holds which
element, which lane supplies which scale, where each accumulator lands. Data, not code paths.

Established from AMD's and Triton's sources (not from hardware; no gfx950 at hand):

* **A / B elements** (B is stored like A: ``[N, K]``, one row per output column). Lane
  ``l`` (``r = l % 32``, ``h = l // 32``) holds 32 elements of row ``r`` of the 32 x 64 step:

  - 8-bit (e4m3, e5m2; 8 VGPRs): bytes 0-15 are K ``16h + [0, 16)``, bytes 16-31 are K
    ``32 + 16h + [0, 16)``: two half-blocks, so one lane's data straddles both scale blocks;
  - 6-bit (e2m3, e3m2; 6 VGPRs): K ``32h + [0, 32)``, element ``i`` at bits ``[6i, 6i+6)``
    of the 192-bit register group (LSB first, as ``reference/packing.py``);
  - 4-bit (e2m1; 4 VGPRs): K ``32h + [0, 32)``, element ``2i`` in the low nibble of byte ``i``.

  Source: composable_kernel ``test/mx_mfma_op/mx_mfma_op.hpp`` (the "Register Mapping for
  32x64" tables for FP8, FP6 and FP4, in a test AMD runs on gfx950), and Triton's
  ``ScaledBlockedToScaledMFMAF8F6F4`` (``AccelerateAMDMatmul.cpp``: dot-operand ``kWidth =
  kBase / 2`` = 16 bytes, i.e. two 16-element chunks for fp8 and one 32-element chunk of
  packed fp4). IREE's ``MFMA_SCALE_F32_32x32x64_B32`` layout (``IREEGPUAttrs.cpp``) gives 32
  *contiguous* K for every format, which disagrees for fp8; a layout test on hardware with
  unequal block scales is what would settle it (an unscaled product cannot: the same K
  permutation on A and B leaves it unchanged).
* **Scales**: the scale operand of lane ``l`` is the e8m0 scale of row ``r``, K block
  ``h`` (elements ``32h .. 32h + 31`` of the step), whichever lanes hold those elements;
  ``opsel`` picks its byte of the 32-bit register. Source: the same CK test
  (``load_mx_A_row_major``: lane ``l`` loads ``x(l % 32, l / 32)``) and Triton's
  ``chooseScaledMfmaScaleLayout`` (lane bases ``{0,1}..{0,16}`` = row, ``{1,0}`` = block).
  This is what ``nqdq.reference.layouts.CDNA4(32)`` stores: the 32-bit word at byte
  ``4 l`` of a 256-byte chunk holds lane ``l``'s scales for four consecutive K steps, byte
  ``s % 4`` for step ``s`` (checked in tests/test_cdna4_gemm.py).
* **Accumulators** (16 floats per lane): ``acc[v]`` of lane ``l`` is ``D[8 (v // 4) + 4 h +
  v % 4, r]`` (the CDNA 32x32 output layout; CK's ``mfma_type`` ``group_size = 4``,
  ``num_groups_per_blk = 4``).
* **Format codes** (``cbsz`` for A, ``blgp`` for B): 0 e4m3, 1 e5m2, 2 e2m3, 3 e3m2, 4 e2m1,
  as LLVM's intrinsic documents them. Triton's ``getMfmaF8F6F4MatrixFormat`` maps E3M2 to 2
  and E2M3 to 3 against its own comment (its scaled path refuses mxfp6, so that code never
  runs); nqdq follows LLVM.
"""

from __future__ import annotations

from typing import NamedTuple

from ...formats import E2M1, E2M3, E3M2, E4M3, E5M2, FloatFormat

__all__ = [
    "MfmaOperand", "OPERANDS", "operand", "element_k", "accumulator_coords", "scale_lane",
    "lane_load_chunks", "WAVE", "TILE", "K_STEP", "BLOCK",
]

WAVE = 64  # lanes of a wavefront
TILE = 32  # rows / columns of one instruction's output tile
K_STEP = 64  # K of one instruction
BLOCK = 32  # elements per e8m0 scale (OCP MX)


class MfmaOperand(NamedTuple):
    """One ``cbsz`` / ``blgp`` operand format of the f8f6f4 instructions."""

    fmt: FloatFormat
    code: int  # cbsz / blgp value
    regs: int  # VGPRs per lane: 32 elements * bits / 32

    @property
    def bits(self) -> int:
        return self.fmt.bits

    @property
    def step_bytes(self) -> int:
        """Bytes of one row of one K step (64 elements) in nqdq's packed layout."""
        return K_STEP * self.bits // 8


OPERANDS = {
    "e4m3": MfmaOperand(E4M3, 0, 8),
    "e5m2": MfmaOperand(E5M2, 1, 8),
    "e2m3": MfmaOperand(E2M3, 2, 6),
    "e3m2": MfmaOperand(E3M2, 3, 6),
    "e2m1": MfmaOperand(E2M1, 4, 4),
}


def operand(fmt) -> MfmaOperand:
    """The operand format called ``fmt`` ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1")."""
    if isinstance(fmt, MfmaOperand):
        return fmt
    key = getattr(fmt, "name", fmt)
    try:
        return OPERANDS[key]
    except KeyError:
        raise ValueError(f"fmt={fmt!r} is not an f8f6f4 operand format; one of {tuple(OPERANDS)}") from None


def element_k(op: MfmaOperand, lane: int, e: int) -> int:
    """K (0..63, within the step) of element ``e`` (0..31, register order) of ``lane``."""
    h = lane // 32
    if op.bits == 8:
        return 32 * (e // 16) + 16 * h + e % 16
    return 32 * h + e


def accumulator_coords(lane: int, v: int) -> tuple[int, int]:
    """(row, column) of the output tile held by accumulator ``v`` (0..15) of ``lane``."""
    return 8 * (v // 4) + 4 * (lane // 32) + v % 4, lane % 32


def scale_lane(row: int, block: int) -> int:
    """The lane whose scale operand carries the scale of ``row``, K block ``block`` (0, 1)."""
    return 32 * block + row


def lane_load_chunks(op: MfmaOperand, half: int) -> tuple[tuple[int, int], ...]:
    """The byte ranges ``(offset, nbytes)`` of one row's K-step slice (``op.step_bytes`` bytes
    of the packed row) that a lane of half ``half`` (lane // 32) loads, in register order.

    Follows from :func:`element_k` with whole bytes per element group: 8-bit elements are one
    byte each (two 16-byte chunks); 32 six-bit elements are 24 bytes; 32 four-bit ones 16."""
    if op.bits == 8:
        return ((16 * half, 16), (32 + 16 * half, 16))
    nbytes = 32 * op.bits // 8
    return ((nbytes * half, nbytes),)
