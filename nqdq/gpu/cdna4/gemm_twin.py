"""NumPy twin of the gfx950 block-scaled GEMM kernels (:mod:`.gemm_ir`): the same grid, the
same bytes loaded by each lane, the same scale words and ``opsel`` bytes, the instructions
through their twins (:data:`.mfma_twin.MFMA_TWINS`), the same stores, and the float64
reference they are checked against.

Operands as the kernels read them (:func:`pack_operands` builds them from codes):

* ``a_packed`` uint8 ``[M, K * bits_a / 8]``, ``b_packed`` uint8 ``[N, K * bits_b / 8]``:
  codes packed along K (``reference/packing.py``);
* ``scale_a`` / ``scale_b``: e8m0 codes of the ``[M, K / 32]`` / ``[N, K / 32]`` scales in
  ``scale_layout`` ("cdna4_32" / "cdna4_16": ``reference.layouts.CDNA4(mfma_dim).swizzle``,
  or "linear").
"""

from __future__ import annotations

import numpy as np

from ...reference.codec import float_code_table
from ...reference.layouts import get_layout
from ...reference.packing import pack_codes
from .gemm_ir import STEPS_PER_SCALE_WORD, gemm_variant
from .mfma_twin import MFMA_TWINS, accumulators_to_tile, e8m0_value
from .operands import BLOCK, WAVE, WAVE_TILE, lane_load_chunks, mfma_shape, operand

__all__ = ["check_gemm_shape", "pack_operands", "gemm_twin", "reference_gemm", "lane_operand_offsets"]

_LANE = np.arange(WAVE)


def check_gemm_shape(M, N, K, mfma_dim=32) -> None:
    """ValueError unless the kernel covers the shape exactly: one 64-lane workgroup per
    32 x 32 tile of C, one K step per instruction K (64 or 128), no bounds checks."""
    shape = mfma_shape(mfma_dim)
    for name, v, m in (("M", M, WAVE_TILE), ("N", N, WAVE_TILE), ("K", K, shape.k)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0 or v % m:
            raise ValueError(
                f"{name}={v!r}: the gfx950 {shape.name} block-scaled GEMM needs M and N positive multiples "
                f"of {WAVE_TILE} and K a positive multiple of {shape.k} (pad the operands, with zero codes)"
            )


def pack_operands(a_codes, scale_a, b_codes, scale_b, fmt_a, fmt_b, scale_layout=None, mfma_dim=32):
    """Codes (uint8 ``[M, K]``, ``[N, K]``) and linear e8m0 scales (``[M, K/32]``,
    ``[N, K/32]``) -> ``(a_packed, stored_scale_a, b_packed, stored_scale_b)`` as the kernel
    ``gemm_ir(fmt_a, fmt_b, scale_layout, mfma_dim)`` reads them."""
    _, scale_layout = gemm_variant(mfma_dim, scale_layout)
    layout = get_layout(scale_layout)
    out = []
    for codes, scales, fmt in ((a_codes, scale_a, fmt_a), (b_codes, scale_b, fmt_b)):
        out += [pack_codes(np.asarray(codes, np.uint8), operand(fmt).bits),
                layout.swizzle(np.ascontiguousarray(scales, np.uint8))]
    return tuple(out)


def lane_operand_offsets(fmt, row0: int, step: int, K: int, mfma_dim=32) -> np.ndarray:
    """Byte offsets ``[64, 4 * regs]`` into the packed ``[rows, K * bits / 8]`` operand that
    each lane loads for K step ``step`` of the ``dim`` rows from ``row0`` on, in register
    order: the kernel's address math (:mod:`.gemm_ir`), lane by lane."""
    op, shape = operand(fmt), mfma_shape(mfma_dim)
    row = row0 + _LANE % shape.dim
    row_bytes = K * op.bits // 8
    rows = []
    for lane in range(WAVE):
        chunks = lane_load_chunks(op, lane // shape.dim, shape)
        rows.append(np.concatenate([np.arange(o, o + n) for o, n in chunks]))
    within = np.stack(rows)  # [64, 4 * regs]
    return (row * row_bytes)[:, None] + step * op.step_bytes(shape) + within


def _scale_registers(stored, layout: str, tile: int, step: int, K: int, half: int = 0, mfma_dim=32):
    """(uint32 [64] scale registers, opsel) that the kernel passes at ``step`` for 16-row (or
    32-row) ``half`` of wave tile ``tile``."""
    shape = mfma_shape(mfma_dim)
    flat = np.ascontiguousarray(stored, np.uint8).reshape(-1)
    if layout == "linear":
        row = tile * WAVE_TILE + shape.dim * half + _LANE % shape.dim
        return flat[row * (K // BLOCK) + shape.groups * step + _LANE // shape.dim].astype(np.uint32), 0
    unroll = STEPS_PER_SCALE_WORD[shape.dim, layout]
    chunks = -(-K // 256)  # 256-byte chunks per 32 rows: ceil(K / 32 / 8)
    first = (tile * chunks + step // unroll) * 256 + 4 * _LANE
    words = flat[first[:, None] + np.arange(4)].astype(np.uint32)
    reg = words[:, 0] | words[:, 1] << 8 | words[:, 2] << 16 | words[:, 3] << 24
    return reg.astype(np.uint32), (step % unroll) * (WAVE_TILE // shape.dim) + half


def gemm_twin(a_packed, scale_a, b_packed, scale_b, M, N, K, fmt_a, fmt_b, scale_layout=None, mfma_dim=32):
    """float32 ``[M, N]``: what the kernel of ``gemm_ir(fmt_a, fmt_b, scale_layout, mfma_dim)``
    stores, computed workgroup by workgroup, K step by K step, instruction by instruction,
    lane by lane."""
    shape, scale_layout = gemm_variant(mfma_dim, scale_layout)
    check_gemm_shape(M, N, K, shape)
    op_a, op_b = operand(fmt_a), operand(fmt_b)
    for name, arr, rows, op in (("a_packed", a_packed, M, op_a), ("b_packed", b_packed, N, op_b)):
        want = (rows, K * op.bits // 8)
        if np.asarray(arr).shape != want:
            raise ValueError(f"{name} has shape {np.asarray(arr).shape}, expected {want} for {op.fmt.name}")
    a_flat = np.ascontiguousarray(a_packed, np.uint8).reshape(-1)
    b_flat = np.ascontiguousarray(b_packed, np.uint8).reshape(-1)
    mfma = MFMA_TWINS[shape.dim]
    halves = range(WAVE_TILE // shape.dim)
    c = np.zeros((M, N), np.float32)
    for tm in range(M // WAVE_TILE):  # workgroup id y
        for tn in range(N // WAVE_TILE):  # workgroup id x
            acc = {(i, j): np.zeros((WAVE, shape.accumulators), np.float32) for i in halves for j in halves}
            for s in range(K // shape.k):
                a_regs = [a_flat[lane_operand_offsets(op_a, tm * WAVE_TILE + shape.dim * i, s, K, shape)].view("<u4")
                          for i in halves]
                b_regs = [b_flat[lane_operand_offsets(op_b, tn * WAVE_TILE + shape.dim * j, s, K, shape)].view("<u4")
                          for j in halves]
                for i in halves:
                    sa, opsel_a = _scale_registers(scale_a, scale_layout, tm, s, K, i, shape)
                    for j in halves:
                        sb, opsel_b = _scale_registers(scale_b, scale_layout, tn, s, K, j, shape)
                        acc[i, j] = mfma(a_regs[i], b_regs[j], acc[i, j], op_a.code, op_b.code,
                                         opsel_a, sa, opsel_b, sb)
            for (i, j), x in acc.items():
                r0, c0 = tm * WAVE_TILE + shape.dim * i, tn * WAVE_TILE + shape.dim * j
                c[r0:r0 + shape.dim, c0:c0 + shape.dim] = accumulators_to_tile(x, shape)
    return c


def reference_gemm(a_codes, scale_a, fmt_a, b_codes, scale_b, fmt_b) -> np.ndarray:
    """float64 ``dequant(A) @ dequant(B).T`` from codes ``[M, K]`` / ``[N, K]`` and linear
    e8m0 scales ``[M, K/32]`` / ``[N, K/32]``: every value ``code * 2^(e - 127)`` exact in
    float64, one matrix product (``nqdq.reference.matmul``'s rule for the other GEMMs)."""

    def dequant(codes, scales, fmt):
        vals = float_code_table(operand(fmt).fmt).astype(np.float64)[np.asarray(codes, np.uint8)]
        return vals * np.repeat(e8m0_value(scales), BLOCK, axis=1)[:, : vals.shape[1]]

    with np.errstate(invalid="ignore", over="ignore"):
        return dequant(a_codes, scale_a, fmt_a) @ dequant(b_codes, scale_b, fmt_b).T
