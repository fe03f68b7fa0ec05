"""NumPy twin of the gfx950 block-scaled GEMM kernel (:mod:`.gemm_ir`): the same grid, the
same bytes loaded by each lane, the same scale words and ``opsel`` bytes, the instruction
through its twin (:func:`.mfma_twin.mfma_scale_f32_32x32x64_f8f6f4`), the same stores, and
the float64 reference it is checked against.

Operands as the kernel reads them (:func:`pack_operands` builds them from codes):

* ``a_packed`` uint8 ``[M, K * bits_a / 8]``, ``b_packed`` uint8 ``[N, K * bits_b / 8]``:
  codes packed along K (``reference/packing.py``);
* ``scale_a`` / ``scale_b``: e8m0 codes of the ``[M, K / 32]`` / ``[N, K / 32]`` scales in
  ``scale_layout`` ("cdna4_32": ``reference.layouts.CDNA4(32).swizzle``, or "linear").
"""

from __future__ import annotations

import numpy as np

from ...reference.codec import float_code_table
from ...reference.layouts import get_layout
from ...reference.packing import pack_codes
from .gemm_ir import SCALE_LAYOUTS
from .mfma_twin import accumulators_to_tile, e8m0_value, mfma_scale_f32_32x32x64_f8f6f4
from .operands import BLOCK, K_STEP, TILE, WAVE, lane_load_chunks, operand

__all__ = ["check_gemm_shape", "pack_operands", "gemm_twin", "reference_gemm", "lane_operand_offsets"]

_LANE = np.arange(WAVE)


def check_gemm_shape(M, N, K) -> None:
    """ValueError unless the kernel covers the shape exactly: one 64-lane workgroup per
    32 x 32 tile of C, one instruction per 64 of K, no bounds checks in the kernel."""
    for name, v, m in (("M", M, TILE), ("N", N, TILE), ("K", K, K_STEP)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0 or v % m:
            raise ValueError(
                f"{name}={v!r}: the gfx950 block-scaled GEMM needs M and N positive multiples of "
                f"{TILE} and K a positive multiple of {K_STEP} (pad the operands, with zero codes)"
            )


def pack_operands(a_codes, scale_a, b_codes, scale_b, fmt_a, fmt_b, scale_layout="cdna4_32"):
    """Codes (uint8 ``[M, K]``, ``[N, K]``) and linear e8m0 scales (``[M, K/32]``,
    ``[N, K/32]``) -> ``(a_packed, stored_scale_a, b_packed, stored_scale_b)`` as the kernel
    reads them."""
    if scale_layout not in SCALE_LAYOUTS:
        raise ValueError(f"scale_layout={scale_layout!r} is not one of {SCALE_LAYOUTS}")
    layout = get_layout(scale_layout)
    out = []
    for codes, scales, fmt in ((a_codes, scale_a, fmt_a), (b_codes, scale_b, fmt_b)):
        out += [pack_codes(np.asarray(codes, np.uint8), operand(fmt).bits),
                layout.swizzle(np.ascontiguousarray(scales, np.uint8))]
    return tuple(out)


def lane_operand_offsets(fmt, tile: int, step: int, K: int) -> np.ndarray:
    """Byte offsets ``[64, 4 * regs]`` into the packed ``[rows, K * bits / 8]`` operand that
    each lane loads for K step ``step`` of tile row (or column) ``tile``, in register order:
    the kernel's address math (:mod:`.gemm_ir`), lane by lane."""
    op = operand(fmt)
    row = tile * TILE + _LANE % 32
    row_bytes = K * op.bits // 8
    rows = []
    for lane in range(WAVE):
        chunks = lane_load_chunks(op, lane // 32)
        rows.append(np.concatenate([np.arange(o, o + n) for o, n in chunks]))
    within = np.stack(rows)  # [64, 4 * regs]
    return (row * row_bytes)[:, None] + step * op.step_bytes + within


def _scale_registers(stored, layout: str, tile: int, step: int, K: int):
    """(uint32 [64] scale registers, opsel) that the kernel passes at ``step``."""
    flat = np.ascontiguousarray(stored, np.uint8).reshape(-1)
    if layout == "cdna4_32":
        chunks = -(-K // 256)  # 256-byte chunks per 32 rows: ceil(K / 32 / 8)
        first = (tile * chunks + step // 4) * 256 + 4 * _LANE
        words = flat[first[:, None] + np.arange(4)].astype(np.uint32)
        reg = words[:, 0] | words[:, 1] << 8 | words[:, 2] << 16 | words[:, 3] << 24
        return reg.astype(np.uint32), step % 4
    row = tile * TILE + _LANE % 32
    return flat[row * (K // BLOCK) + 2 * step + _LANE // 32].astype(np.uint32), 0


def gemm_twin(a_packed, scale_a, b_packed, scale_b, M, N, K, fmt_a, fmt_b, scale_layout="cdna4_32"):
    """float32 ``[M, N]``: what the kernel of ``gemm_ir(fmt_a, fmt_b, scale_layout)`` stores,
    computed workgroup by workgroup, K step by K step, lane by lane."""
    check_gemm_shape(M, N, K)
    op_a, op_b = operand(fmt_a), operand(fmt_b)
    for name, arr, rows, op in (("a_packed", a_packed, M, op_a), ("b_packed", b_packed, N, op_b)):
        want = (rows, K * op.bits // 8)
        if np.asarray(arr).shape != want:
            raise ValueError(f"{name} has shape {np.asarray(arr).shape}, expected {want} for {op.fmt.name}")
    a_flat = np.ascontiguousarray(a_packed, np.uint8).reshape(-1)
    b_flat = np.ascontiguousarray(b_packed, np.uint8).reshape(-1)
    c = np.zeros((M, N), np.float32)
    for tm in range(M // TILE):  # workgroup id y
        for tn in range(N // TILE):  # workgroup id x
            acc = np.zeros((WAVE, 16), np.float32)
            for s in range(K // K_STEP):
                a_regs = a_flat[lane_operand_offsets(op_a, tm, s, K)].view("<u4")
                b_regs = b_flat[lane_operand_offsets(op_b, tn, s, K)].view("<u4")
                sa, opsel = _scale_registers(scale_a, scale_layout, tm, s, K)
                sb, _ = _scale_registers(scale_b, scale_layout, tn, s, K)
                acc = mfma_scale_f32_32x32x64_f8f6f4(
                    a_regs, b_regs, acc, op_a.code, op_b.code, opsel, sa, opsel, sb)
            c[tm * TILE:(tm + 1) * TILE, tn * TILE:(tn + 1) * TILE] = accumulators_to_tile(acc)
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
