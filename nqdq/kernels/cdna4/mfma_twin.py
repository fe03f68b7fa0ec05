"""Python twin of ``v_mfma_scale_f32_32x32x64_f8f6f4`` (LLVM
``llvm.amdgcn.mfma.scale.f32.32x32x64.f8f6f4``): the 64 lanes' registers in, the 64 lanes'
accumulators out, as the operand layouts of :mod:`.operands` define them.

    D[i, j] = C[i, j] + sum_k  A[i, k] * 2^(sa[i, k // 32] - 127) * B[j, k] * 2^(sb[j, k // 32] - 127)

for the 32 x 32 tile and the 64 K of one instruction: every element decoded exactly
(``reference/codec.float_code_table``: e4m3 NaN = S.1111.111, e5m2 inf/NaN, no specials in
fp6 / fp4), every scale ``2^(e - 127)`` (e8m0; 0xFF is NaN), products and their sum taken
exactly (float64 holds each product; the 64-term sum is exact when the terms are within
2^53 of each other, which the tests' data keep) and rounded once to float32 together with
C. How the hardware rounds inside one instruction is not documented to the bit; one
rounding per instruction is the model here, and what the kernel's float32 accumulation
over K steps means.
"""

from __future__ import annotations

import numpy as np

from ...reference.codec import float_code_table
from ...reference.packing import pack_codes, unpack_codes
from .operands import BLOCK, K_STEP, TILE, WAVE, MfmaOperand, accumulator_coords, element_k, operand

__all__ = [
    "mfma_scale_f32_32x32x64_f8f6f4", "registers_to_codes", "codes_to_registers",
    "accumulators_to_tile", "tile_to_accumulators", "scale_bytes", "e8m0_value",
]

_LANES = np.arange(WAVE)


def _k_order(op: MfmaOperand) -> np.ndarray:
    """[64 lanes, 32 elements] -> K of each element within the step."""
    return np.array([[element_k(op, lane, e) for e in range(32)] for lane in range(WAVE)])


def registers_to_codes(regs: np.ndarray, fmt) -> np.ndarray:
    """The A (or B) operand ``regs`` (uint32 ``[64, op.regs]``) as codes ``[32 rows, 64 K]``."""
    op = operand(fmt)
    regs = np.asarray(regs, dtype=np.uint32)
    if regs.shape != (WAVE, op.regs):
        raise ValueError(f"{op.fmt.name} operand registers must be uint32 [{WAVE}, {op.regs}], got {regs.shape}")
    stream = regs.astype("<u4").view(np.uint8).reshape(WAVE, 4 * op.regs)
    elems = unpack_codes(stream, op.bits, 32)  # [64, 32], register order
    codes = np.zeros((TILE, K_STEP), np.uint8)
    codes[(_LANES % 32)[:, None], _k_order(op)] = elems
    return codes


def codes_to_registers(codes: np.ndarray, fmt) -> np.ndarray:
    """Inverse of :func:`registers_to_codes`: codes ``[32, 64]`` -> uint32 ``[64, op.regs]``."""
    op = operand(fmt)
    codes = np.asarray(codes, np.uint8)
    if codes.shape != (TILE, K_STEP):
        raise ValueError(f"codes must be [{TILE}, {K_STEP}], got {codes.shape}")
    elems = codes[(_LANES % 32)[:, None], _k_order(op)]
    stream = pack_codes(elems, op.bits)  # [64, 4 * regs] bytes
    return np.ascontiguousarray(stream).view("<u4").astype(np.uint32)


_ACC = np.array([[accumulator_coords(lane, v) for v in range(16)] for lane in range(WAVE)])  # [64, 16, 2]


def accumulators_to_tile(acc: np.ndarray) -> np.ndarray:
    """float32 ``[64, 16]`` accumulators -> the ``[32, 32]`` tile they hold."""
    tile = np.empty((TILE, TILE), np.float32)
    tile[_ACC[..., 0], _ACC[..., 1]] = acc
    return tile


def tile_to_accumulators(tile: np.ndarray) -> np.ndarray:
    """Inverse of :func:`accumulators_to_tile`."""
    return np.asarray(tile, np.float32)[_ACC[..., 0], _ACC[..., 1]]


def e8m0_value(code) -> np.ndarray:
    """float64 2^(code - 127); 0xFF is NaN."""
    c = np.asarray(code, np.int64)
    return np.where(c == 0xFF, np.nan, np.ldexp(1.0, c - 127))


def scale_bytes(scale: np.ndarray, opsel: int) -> np.ndarray:
    """Per (row, K block) e8m0 codes ``[32, 2]`` from the 64 lanes' scale registers: byte
    ``opsel`` of lane ``32 * block + row`` (:func:`.operands.scale_lane`)."""
    if opsel not in (0, 1, 2, 3):
        raise ValueError(f"opsel must be 0..3 (a byte of the scale register), got {opsel!r}")
    s = (np.asarray(scale, np.uint32) >> np.uint32(8 * opsel)) & np.uint32(0xFF)
    return s.reshape(2, TILE).T.astype(np.uint8)


def _scaled_values(regs, fmt, scale, opsel) -> np.ndarray:
    op = operand(fmt)
    vals = float_code_table(op.fmt).astype(np.float64)[registers_to_codes(regs, op)]
    per_block = e8m0_value(scale_bytes(scale, opsel))  # [32, 2]
    return vals * np.repeat(per_block, BLOCK, axis=1)


def mfma_scale_f32_32x32x64_f8f6f4(a, b, c, cbsz, blgp, opsel_a, scale_a, opsel_b, scale_b):
    """One instruction for one wavefront, arguments in the LLVM intrinsic's order.

    a: uint32 [64, regs(cbsz)], b: uint32 [64, regs(blgp)] (8 / 6 / 4 VGPRs for fp8 / fp6 /
    fp4); c: float32 [64, 16]; cbsz / blgp: format codes 0-4; opsel_*: byte 0-3 of the
    scale registers scale_* (uint32 [64]). Returns the float32 [64, 16] accumulators D.
    """
    fa = _by_code(cbsz, "cbsz")
    fb = _by_code(blgp, "blgp")
    av = _scaled_values(a, fa, scale_a, opsel_a)  # [32, 64] rows i
    bv = _scaled_values(b, fb, scale_b, opsel_b)  # [32, 64] rows j
    with np.errstate(invalid="ignore", over="ignore"):
        d = accumulators_to_tile(np.asarray(c, np.float32)).astype(np.float64) + av @ bv.T
    return tile_to_accumulators(d.astype(np.float32))


def _by_code(code, argname) -> MfmaOperand:
    from .operands import OPERANDS

    for op in OPERANDS.values():
        if op.code == code:
            return op
    raise ValueError(f"{argname}={code!r} is not a format code (0 e4m3, 1 e5m2, 2 e2m3, 3 e3m2, 4 e2m1)")
