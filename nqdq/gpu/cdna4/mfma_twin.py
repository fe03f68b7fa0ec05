"""Python twins of ``v_mfma_scale_f32_32x32x64_f8f6f4`` and
``v_mfma_scale_f32_16x16x128_f8f6f4`` (LLVM ``llvm.amdgcn.mfma.scale.f32.{32x32x64,
16x16x128}.f8f6f4``): the 64 lanes' registers in, the 64 lanes' accumulators out, as the
operand layouts of :mod:`.operands` define them for each :class:`.operands.MfmaShape`.

    D[i, j] = C[i, j] + sum_k  A[i, k] * 2^(sa[i, k // 32] - 127) * B[j, k] * 2^(sb[j, k // 32] - 127)

for the ``dim x dim`` tile and the ``k`` of one instruction (32 x 32 x 64 or 16 x 16 x 128):
every element decoded exactly (``reference/codec.float_code_table``: e4m3 NaN = S.1111.111,
e5m2 inf/NaN, no specials in fp6 / fp4), every scale ``2^(e - 127)`` (e8m0; 0xFF is NaN),
products and their sum taken exactly (float64 holds each product; the 64- or 128-term sum
is exact when the terms are within 2^53 of each other, which the tests' data keep) and
rounded once to float32 together with C. How the hardware rounds inside one instruction is
not documented to the bit; one rounding per instruction is the model here, and what the
kernel's float32 accumulation over K steps means.
"""

from __future__ import annotations

import numpy as np

from ...reference.codec import float_code_table
from ...reference.packing import pack_codes, unpack_codes
from .operands import (
    BLOCK, OPERANDS, SHAPES, WAVE, MfmaOperand, MfmaShape, accumulator_coords, element_k, mfma_shape, operand,
)

__all__ = [
    "mfma_scale_f32_32x32x64_f8f6f4", "mfma_scale_f32_16x16x128_f8f6f4", "MFMA_TWINS",
    "registers_to_codes", "codes_to_registers", "accumulators_to_tile", "tile_to_accumulators",
    "scale_bytes", "e8m0_value",
]

_LANES = np.arange(WAVE)


def _k_order(op: MfmaOperand, shape: MfmaShape) -> np.ndarray:
    """[64 lanes, 32 elements] -> K of each element within the step."""
    return np.array([[element_k(op, lane, e, shape) for e in range(32)] for lane in range(WAVE)])


def registers_to_codes(regs: np.ndarray, fmt, mfma_dim=32) -> np.ndarray:
    """The A (or B) operand ``regs`` (uint32 ``[64, op.regs]``) as codes ``[dim rows, k]``."""
    op, shape = operand(fmt), mfma_shape(mfma_dim)
    regs = np.asarray(regs, dtype=np.uint32)
    if regs.shape != (WAVE, op.regs):
        raise ValueError(f"{op.fmt.name} operand registers must be uint32 [{WAVE}, {op.regs}], got {regs.shape}")
    stream = regs.astype("<u4").view(np.uint8).reshape(WAVE, 4 * op.regs)
    elems = unpack_codes(stream, op.bits, 32)  # [64, 32], register order
    codes = np.zeros((shape.dim, shape.k), np.uint8)
    codes[(_LANES % shape.dim)[:, None], _k_order(op, shape)] = elems
    return codes


def codes_to_registers(codes: np.ndarray, fmt, mfma_dim=32) -> np.ndarray:
    """Inverse of :func:`registers_to_codes`: codes ``[dim, k]`` -> uint32 ``[64, op.regs]``."""
    op, shape = operand(fmt), mfma_shape(mfma_dim)
    codes = np.asarray(codes, np.uint8)
    if codes.shape != (shape.dim, shape.k):
        raise ValueError(f"codes must be [{shape.dim}, {shape.k}] for {shape.name}, got {codes.shape}")
    elems = codes[(_LANES % shape.dim)[:, None], _k_order(op, shape)]
    stream = pack_codes(elems, op.bits)  # [64, 4 * regs] bytes
    return np.ascontiguousarray(stream).view("<u4").astype(np.uint32)


def _acc_coords(shape: MfmaShape) -> np.ndarray:
    """[64, accumulators, 2]: (row, column) of every lane's accumulators."""
    return np.array([[accumulator_coords(lane, v, shape) for v in range(shape.accumulators)] for lane in range(WAVE)])


_ACC = {dim: _acc_coords(shape) for dim, shape in SHAPES.items()}


def accumulators_to_tile(acc: np.ndarray, mfma_dim=32) -> np.ndarray:
    """float32 ``[64, dim * dim / 64]`` accumulators -> the ``[dim, dim]`` tile they hold."""
    shape = mfma_shape(mfma_dim)
    coords = _ACC[shape.dim]
    tile = np.empty((shape.dim, shape.dim), np.float32)
    tile[coords[..., 0], coords[..., 1]] = acc
    return tile


def tile_to_accumulators(tile: np.ndarray, mfma_dim=32) -> np.ndarray:
    """Inverse of :func:`accumulators_to_tile`."""
    coords = _ACC[mfma_shape(mfma_dim).dim]
    return np.asarray(tile, np.float32)[coords[..., 0], coords[..., 1]]


def e8m0_value(code) -> np.ndarray:
    """float64 2^(code - 127); 0xFF is NaN."""
    c = np.asarray(code, np.int64)
    return np.where(c == 0xFF, np.nan, np.ldexp(1.0, c - 127))


def scale_bytes(scale: np.ndarray, opsel: int, mfma_dim=32) -> np.ndarray:
    """Per (row, K block) e8m0 codes ``[dim, k / 32]`` from the 64 lanes' scale registers:
    byte ``opsel`` of lane ``dim * block + row`` (:func:`.operands.scale_lane`)."""
    shape = mfma_shape(mfma_dim)
    if opsel not in (0, 1, 2, 3):
        raise ValueError(f"opsel must be 0..3 (a byte of the scale register), got {opsel!r}")
    s = (np.asarray(scale, np.uint32) >> np.uint32(8 * opsel)) & np.uint32(0xFF)
    return s.reshape(shape.groups, shape.dim).T.astype(np.uint8)


def _scaled_values(regs, op, scale, opsel, shape) -> np.ndarray:
    vals = float_code_table(op.fmt).astype(np.float64)[registers_to_codes(regs, op, shape)]
    per_block = e8m0_value(scale_bytes(scale, opsel, shape))  # [dim, k / 32]
    return vals * np.repeat(per_block, BLOCK, axis=1)


def _mfma_scale(shape: MfmaShape, a, b, c, cbsz, blgp, opsel_a, scale_a, opsel_b, scale_b):
    fa = _by_code(cbsz, "cbsz")
    fb = _by_code(blgp, "blgp")
    c = np.asarray(c, np.float32)
    if c.shape != (WAVE, shape.accumulators):
        raise ValueError(f"c must be float32 [{WAVE}, {shape.accumulators}] for {shape.name}, got {c.shape}")
    av = _scaled_values(a, fa, scale_a, opsel_a, shape)  # [dim, k] rows i
    bv = _scaled_values(b, fb, scale_b, opsel_b, shape)  # [dim, k] rows j
    with np.errstate(invalid="ignore", over="ignore"):
        d = accumulators_to_tile(c, shape).astype(np.float64) + av @ bv.T
    return tile_to_accumulators(d.astype(np.float32), shape)


def mfma_scale_f32_32x32x64_f8f6f4(a, b, c, cbsz, blgp, opsel_a, scale_a, opsel_b, scale_b):
    """One 32 x 32 x 64 instruction for one wavefront, arguments in the LLVM intrinsic's order.

    a: uint32 [64, regs(cbsz)], b: uint32 [64, regs(blgp)] (8 / 6 / 4 VGPRs for fp8 / fp6 /
    fp4); c: float32 [64, 16]; cbsz / blgp: format codes 0-4; opsel_*: byte 0-3 of the
    scale registers scale_* (uint32 [64]). Returns the float32 [64, 16] accumulators D.
    """
    return _mfma_scale(SHAPES[32], a, b, c, cbsz, blgp, opsel_a, scale_a, opsel_b, scale_b)


def mfma_scale_f32_16x16x128_f8f6f4(a, b, c, cbsz, blgp, opsel_a, scale_a, opsel_b, scale_b):
    """One 16 x 16 x 128 instruction for one wavefront, arguments in the LLVM intrinsic's order.

    As :func:`mfma_scale_f32_32x32x64_f8f6f4` with c and D float32 [64, 4], and four scale
    blocks per row (lane ``16 * block + row``) instead of two.
    """
    return _mfma_scale(SHAPES[16], a, b, c, cbsz, blgp, opsel_a, scale_a, opsel_b, scale_b)


MFMA_TWINS = {32: mfma_scale_f32_32x32x64_f8f6f4, 16: mfma_scale_f32_16x16x128_f8f6f4}  # by mfma_dim


def _by_code(code, argname) -> MfmaOperand:
    for op in OPERANDS.values():
        if op.code == code:
            return op
    raise ValueError(f"{argname}={code!r} is not a format code (0 e4m3, 1 e5m2, 2 e2m3, 3 e3m2, 4 e2m1)")
