"""Operand layouts of gfx950's scaled MFMAs ``v_mfma_scale_f32_32x32x64_f8f6f4`` and
``v_mfma_scale_f32_16x16x128_f8f6f4``: which lane holds which element, which lane supplies
which scale, where each accumulator lands. Data, not code paths: one :class:`MfmaShape` per
instruction, and every layout a formula in its ``dim`` (the output tile, 32 or 16) and ``k``
(64 or 128).

Established from AMD's and Triton's sources (not from hardware of ours; no gfx950 at hand):

* **A / B elements** (B is stored like A: ``[N, K]``, one row per output column). Lane
  ``l`` (``r = l % dim``, group ``g = l // dim``: 0-1 for 32, 0-3 for 16) holds 32 elements
  of row ``r`` of the ``dim x k`` step:

  - 8-bit (e4m3, e5m2; 8 VGPRs): bytes 0-15 are K ``16g + [0, 16)``, bytes 16-31 are K
    ``k/2 + 16g + [0, 16)``: two 16-element chunks, so one lane's data straddles two scale
    blocks (32x32x64: blocks 0 and 1 for both groups; 16x16x128: groups 0-1 blocks 0 and 2,
    groups 2-3 blocks 1 and 3);
  - 6-bit (e2m3, e3m2; 6 VGPRs): K ``32g + [0, 32)``, element ``i`` at bits ``[6i, 6i+6)``
    of the 192-bit register group (LSB first, as ``reference/packing.py``);
  - 4-bit (e2m1; 4 VGPRs): K ``32g + [0, 32)``, element ``2i`` in the low nibble of byte ``i``.

  Source: composable_kernel ``test/mx_mfma_op/mx_mfma_op.hpp`` (the "Register Mapping for
  32x64" and "for 16x128" tables for FP8, FP6 and FP4, side by side, in a test AMD runs on
  gfx950), and Triton's ``ScaledBlockedToScaledMFMAF8F6F4`` (``AccelerateAMDMatmul.cpp``:
  dot-operand ``kWidth = kBase / 2`` = 16 bytes, i.e. two 16-element chunks for fp8 and one
  32-element chunk of packed fp4). IREE's ``MFMA_SCALE_F32_32x32x64_B32`` layout
  (``IREEGPUAttrs.cpp``) gives 32 *contiguous* K for every format, which disagrees for fp8;
  CK's ``scale_mapping`` output (below) scales fp8 bytes 16-31 of lane ``r`` by the scale of
  lane ``32 + r``, which CK's layout explains (K 32-47 are block 1) and IREE's does not.
* **Scales**: the scale operand of lane ``l`` is the e8m0 scale of row ``r``, K block ``g``
  (elements ``32g .. 32g + 31`` of the step), whichever lanes hold those elements; ``opsel``
  picks its byte of the 32-bit register. Source: the same CK test (``load_mx_A_row_major``:
  lane ``l`` loads ``x(l % dim, l / dim)``; its 16x128 table marks fp8 bytes 0-15 of groups
  0-1 / 2-3 with ``x(M,0)`` / ``x(M,1)`` and bytes 16-31 with ``x(M,2)`` / ``x(M,3)``), CK's
  ``test/mx_mfma_op/scale_mapping_{32x32x64,16x16x128}.txt`` (the printed output of
  ``scale_mapping_*.cpp``, which gives every lane scale ``2^lane`` and reads back which
  lane's scale multiplied each fp8 register byte: for 16x16x128, bytes 0-15 of groups 0-1
  from lane ``r``, of groups 2-3 from lane ``16 + r``, bytes 16-31 from lanes ``32 + r`` /
  ``48 + r``, which is this mapping together with the fp8 element layout above) and Triton's
  ``chooseScaledMfmaScaleLayout``. This is what ``nqdq.reference.layouts.CDNA4(dim)``
  stores: one 32-bit word per lane per 256 bytes, byte ``s % 4`` for K step ``s`` (32), byte
  ``2 (s % 2) + i`` for K step ``s`` and 16-row half ``i`` of a 32-row block (16); checked
  in tests/test_cdna4_gemm.py.
* **Accumulators** (``dim * dim / 64`` floats per lane: 16 or 4): ``acc[v]`` of lane ``l`` is
  ``D[4 (64 / dim) (v // 4) + 4 g + v % 4, r]``: for 32, ``D[8 (v // 4) + 4 g + v % 4, r]``
  (CK's ``mfma_type`` ``group_size = 4``, ``num_groups_per_blk = 4``); for 16,
  ``D[4 g + v, r]`` (the output table in CK's ``scale_mapping_16x16x128.cpp``: lanes 16g ..
  16g + 15 hold rows 4g .. 4g + 3). Both are the CDNA output layouts every ``dim x dim``
  MFMA shares: AMD's "Introduction to Matrix Core Programming on AMD CDNA3 and CDNA4"
  (ROCm blog) stores ``c_reg[i]`` of ``mfma_f32_16x16x16f16`` to ``C[4 (l / 16) + i, l % 16]``
  and ``c_reg[4 i + j]`` of ``mfma_scale_f32_32x32x64_f8f6f4`` to ``C[8 i + 4 (l / 32) + j,
  l % 32]``.
* **Format codes** (``cbsz`` for A, ``blgp`` for B): 0 e4m3, 1 e5m2, 2 e2m3, 3 e3m2, 4 e2m1,
  as LLVM's intrinsic documents them. Triton's ``getMfmaF8F6F4MatrixFormat`` maps E3M2 to 2
  and E2M3 to 3 against its own comment (its scaled path refuses mxfp6, so that code never
  runs); nqdq follows LLVM.
"""

from __future__ import annotations

from typing import NamedTuple

from ...formats import E2M1, E2M3, E3M2, E4M3, E5M2, FloatFormat

__all__ = [
    "MfmaOperand", "MfmaShape", "OPERANDS", "SHAPES", "operand", "mfma_shape", "element_k",
    "accumulator_coords", "scale_lane", "lane_load_chunks", "WAVE", "WAVE_TILE", "BLOCK",
]

WAVE = 64  # lanes of a wavefront
WAVE_TILE = 32  # rows / columns of C one wavefront of the GEMM computes, with either shape
BLOCK = 32  # elements per e8m0 scale (OCP MX)


class MfmaShape(NamedTuple):
    """One scaled-MFMA instruction: a ``dim x dim`` output tile, ``k`` of K, 32 elements of
    A and of B a lane."""

    dim: int  # rows = columns of the output tile
    k: int  # K of one instruction

    @property
    def name(self) -> str:
        return f"{self.dim}x{self.dim}x{self.k}"

    @property
    def groups(self) -> int:
        """Lanes per row of A: the K groups (and scale blocks) of one step, 2 or 4."""
        return WAVE // self.dim

    @property
    def accumulators(self) -> int:
        """Floats of D per lane: 16 or 4."""
        return self.dim * self.dim // WAVE

    @property
    def mnemonic(self) -> str:
        return f"v_mfma_scale_f32_{self.name}_f8f6f4"

    @property
    def intrinsic(self) -> str:
        return f"llvm.amdgcn.mfma.scale.f32.{self.name}.f8f6f4"


SHAPES = {32: MfmaShape(32, 64), 16: MfmaShape(16, 128)}


def mfma_shape(mfma_dim) -> MfmaShape:
    """The instruction of output tile ``mfma_dim`` (32: 32x32x64, 16: 16x16x128)."""
    if isinstance(mfma_dim, MfmaShape):
        return mfma_dim
    try:
        return SHAPES[mfma_dim]
    except (KeyError, TypeError):
        raise ValueError(f"mfma_dim={mfma_dim!r} is not a scaled-MFMA shape; one of {tuple(SHAPES)}") from None


class MfmaOperand(NamedTuple):
    """One ``cbsz`` / ``blgp`` operand format of the f8f6f4 instructions."""

    fmt: FloatFormat
    code: int  # cbsz / blgp value
    regs: int  # VGPRs per lane: 32 elements * bits / 32

    @property
    def bits(self) -> int:
        return self.fmt.bits

    def step_bytes(self, shape: MfmaShape) -> int:
        """Bytes of one row of one K step (``shape.k`` elements) in nqdq's packed layout."""
        return shape.k * self.bits // 8


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


def element_k(op: MfmaOperand, lane: int, e: int, shape: MfmaShape = SHAPES[32]) -> int:
    """K (within the step) of element ``e`` (0..31, register order) of ``lane``."""
    g = lane // shape.dim
    if op.bits == 8:
        return shape.k // 2 * (e // 16) + 16 * g + e % 16
    return 32 * g + e


def accumulator_coords(lane: int, v: int, shape: MfmaShape = SHAPES[32]) -> tuple[int, int]:
    """(row, column) of the output tile held by accumulator ``v`` of ``lane``."""
    return 4 * shape.groups * (v // 4) + 4 * (lane // shape.dim) + v % 4, lane % shape.dim


def scale_lane(row: int, block: int, shape: MfmaShape = SHAPES[32]) -> int:
    """The lane whose scale operand carries the scale of ``row``, K block ``block`` of the step."""
    return shape.dim * block + row


def lane_load_chunks(op: MfmaOperand, group: int, shape: MfmaShape = SHAPES[32]) -> tuple[tuple[int, int], ...]:
    """The byte ranges ``(offset, nbytes)`` of one row's K-step slice (``op.step_bytes(shape)``
    bytes of the packed row) that a lane of group ``group`` (lane // dim) loads, in register
    order.

    Follows from :func:`element_k` with whole bytes per element group: 8-bit elements are one
    byte each (two 16-byte chunks, ``k / 2`` apart); 32 six-bit elements are 24 bytes; 32
    four-bit ones 16."""
    if op.bits == 8:
        return ((16 * group, 16), (shape.k // 2 + 16 * group, 16))
    nbytes = 32 * op.bits // 8
    return ((nbytes * group, nbytes),)
