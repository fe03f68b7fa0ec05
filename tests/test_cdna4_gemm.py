"""The gfx950 block-scaled GEMM (nqdq.gpu.cdna4) -- assembled for gfx950, not run.

No AMD GPU and no ROCm here, so three kinds of check stand in for a run:

(a) twins: the Python twins of ``v_mfma_scale_f32_32x32x64_f8f6f4`` and
    ``v_mfma_scale_f32_16x16x128_f8f6f4`` and the NumPy twin of the kernels' data movement
    (which lane loads which bytes, which scale word and ``opsel`` byte) against the float64
    reference of the dequantized operands, every test over both instructions (``dim`` 32 /
    16, reading the ``cdna4_32`` / ``cdna4_16`` scale layouts);
(b) the generated LLVM IR assembled for gfx950 by llvmlite's AMDGPU backend (each compile
    in a subprocess): the scaled MFMAs of each K step (1 of 32x32x64, 4 of 16x16x128) with
    the right format codes, operand widths and ``op_sel`` bytes, the bytes loaded per K step,
    no scratch, no spills, a register budget;
(c) the gfx950 scaled conversions assembled, and their Python twins against nqdq's
    reference encoders over every input class.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from nqdq.formats import E2M1, E4M3, E5M2
from nqdq.gpu.cdna4 import cvt_twin
from nqdq.gpu.cdna4.gemm_ir import STEPS_PER_SCALE_WORD, gemm_ir, gemm_variant, kernel_name, mfmas_per_step
from nqdq.gpu.cdna4.gemm_twin import _scale_registers, check_gemm_shape, gemm_twin, pack_operands, reference_gemm
from nqdq.gpu.cdna4.mfma_twin import (
    MFMA_TWINS, accumulators_to_tile, codes_to_registers, registers_to_codes, tile_to_accumulators,
)
from nqdq.gpu.cdna4.operands import OPERANDS, SHAPES, WAVE_TILE, element_k, operand, scale_lane
from nqdq.reference.codec import encode_float, float_code_table
from nqdq.reference.layouts import get_layout
from nqdq.reference.quantize import quantize
from nqdq.schemes import resolve_scheme

llvmlite = pytest.importorskip("llvmlite")
from nqdq.gpu.cdna4.assemble import AssemblyError, assemble, count_instruction, kernel_stats  # noqa: E402

FORMATS = tuple(OPERANDS)  # e4m3 e5m2 e2m3 e3m2 e2m1
SCHEME = {"e4m3": "mxfp8", "e5m2": "mxfp8_e5m2", "e2m3": "mxfp6_e2m3", "e3m2": "mxfp6_e3m2", "e2m1": "mxfp4"}
PAIRS = [(f, f) for f in FORMATS] + [("e4m3", "e2m1"), ("e2m1", "e5m2"), ("e2m3", "e4m3"), ("e3m2", "e2m3")]
DIMS = tuple(SHAPES)  # 32: v_mfma_scale_f32_32x32x64_f8f6f4, 16: v_mfma_scale_f32_16x16x128_f8f6f4
VGPR_BUDGET = 128  # unified VGPR + AGPR file per lane; 512 is the gfx950 maximum, 128 keeps 4 waves / SIMD


def rel_l2(got, ref):
    ref = np.asarray(ref, np.float64)
    return np.linalg.norm(np.asarray(got, np.float64) - ref) / np.linalg.norm(ref)


def quantized(rng, shape, fmt, spread=4):
    """Codes [rows, K] and linear e8m0 scales [rows, K/32] from nqdq's MX quantizer, with
    block magnitudes spread over 2^-spread .. 2^spread so the scales differ block to block."""
    x = rng.standard_normal(shape).astype(np.float32)
    x *= np.exp2(rng.integers(-spread, spread + 1, (shape[0], shape[1] // 32))).repeat(32, axis=1).astype(np.float32)
    q = quantize(x, resolve_scheme(SCHEME[fmt]))
    return q.codes, q.scales


# --- (a) twins ----------------------------------------------------------------------------


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_registers_round_trip_and_cover_the_step(fmt, dim):
    op, shape = operand(fmt), SHAPES[dim]
    ks = {(lane % dim, element_k(op, lane, e, shape)) for lane in range(64) for e in range(32)}
    assert ks == {(r, k) for r in range(dim) for k in range(shape.k)}  # every element exactly once
    codes = np.random.default_rng(0).integers(0, 1 << op.bits, (dim, shape.k)).astype(np.uint8)
    regs = codes_to_registers(codes, fmt, dim)
    assert regs.shape == (64, op.regs) and regs.dtype == np.uint32
    np.testing.assert_array_equal(registers_to_codes(regs, fmt, dim), codes)


def test_fp8_lanes_straddle_scale_blocks():
    # CK's "Register Mapping for 32x64 / 16x128 for FP8": 32x32x64 lane 0 holds K 0-15 and
    # K 32-47, lane 32 K 16-31 and K 48-63; 16x16x128 lane 16g holds K 16g + [0, 16) and
    # 64 + 16g + [0, 16). fp6 / fp4 lanes hold one whole block (K 32g .. 32g + 31).
    fp8, s32, s16 = operand("e4m3"), SHAPES[32], SHAPES[16]
    assert [element_k(fp8, 0, e, s32) for e in (0, 15, 16, 31)] == [0, 15, 32, 47]
    assert [element_k(fp8, 32, e, s32) for e in (0, 15, 16, 31)] == [16, 31, 48, 63]
    assert [element_k(fp8, 16, e, s16) for e in (0, 15, 16, 31)] == [16, 31, 80, 95]
    assert [element_k(fp8, 48, e, s16) for e in (0, 15, 16, 31)] == [48, 63, 112, 127]
    for fmt in ("e2m3", "e2m1"):
        assert [element_k(operand(fmt), 32, e, s32) for e in (0, 31)] == [32, 63]
        assert [element_k(operand(fmt), 48, e, s16) for e in (0, 31)] == [96, 127]


@pytest.mark.parametrize("dim", DIMS)
def test_fp8_scale_slots_as_ck_measured(dim):
    """CK's test/mx_mfma_op/scale_mapping_{32x32x64,16x16x128}.txt (a gfx950 run giving lane l
    the scale 2^l): fp8 byte e of lane g * dim + r is scaled by the scale of lane
    ``r + 32 * (e >= 16)`` (32x32x64) or ``r + 32 * (e >= 16) + 16 * (g >= 2)`` (16x16x128).
    The element layout with "lane dim * block + row carries (row, block)" reproduces it."""
    fp8, shape = operand("e4m3"), SHAPES[dim]
    for lane in range(64):
        r, g = lane % dim, lane // dim
        for e in range(32):
            measured = r + 32 * (e >= 16) + (16 * (g >= 2) if dim == 16 else 0)
            assert scale_lane(r, element_k(fp8, lane, e, shape) // 32, shape) == measured


@pytest.mark.parametrize("dim", DIMS)
def test_accumulator_layout_round_trips(dim):
    tile = np.arange(dim * dim, dtype=np.float32).reshape(dim, dim)
    acc = tile_to_accumulators(tile, dim)
    if dim == 32:  # acc[v] of lane l = D[8 (v // 4) + 4 (l // 32) + v % 4, l % 32]
        assert acc[0, 0] == tile[0, 0] and acc[33, 5] == tile[8 + 4 + 1, 1] and acc[63, 15] == tile[24 + 4 + 3, 31]
    else:  # acc[v] of lane l = D[4 (l // 16) + v, l % 16]
        assert acc.shape == (64, 4) and acc[17, 2] == tile[4 + 2, 1] and acc[63, 3] == tile[12 + 3, 15]
    np.testing.assert_array_equal(accumulators_to_tile(acc, dim), tile)


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("fa, fb", PAIRS)
def test_instruction_twin_against_float64(fa, fb, dim):
    """One instruction: every (row, block) scale different, opsel picking a byte of the scale
    registers, a nonzero C; D against C + float64 product of the dequantized tiles."""
    rng = np.random.default_rng(hash((fa, fb, dim)) % 2**32)
    k = SHAPES[dim].k
    ca, sa = quantized(rng, (dim, k), fa)
    cb, sb = quantized(rng, (dim, k), fb)
    opsel_a, opsel_b = 2, 1
    # lane dim * block + row carries scale (row, block) in byte opsel; the other bytes are noise
    noise = rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
    reg_a = (noise & ~np.uint32(0xFF << 8 * opsel_a)) | (sa.T.reshape(64).astype(np.uint32) << 8 * opsel_a)
    reg_b = (noise & ~np.uint32(0xFF << 8 * opsel_b)) | (sb.T.reshape(64).astype(np.uint32) << 8 * opsel_b)
    c = rng.standard_normal((dim, dim)).astype(np.float32)
    d = MFMA_TWINS[dim](
        codes_to_registers(ca, fa, dim), codes_to_registers(cb, fb, dim), tile_to_accumulators(c, dim),
        operand(fa).code, operand(fb).code, opsel_a, reg_a, opsel_b, reg_b)
    ref = c.astype(np.float64) + reference_gemm(ca, sa, fa, cb, sb, fb)
    assert rel_l2(accumulators_to_tile(d, dim), ref) < 1e-5
    np.testing.assert_array_equal(accumulators_to_tile(d, dim), ref.astype(np.float32))  # one rounding


LAYOUTS = [(dim, layout) for dim, layout in STEPS_PER_SCALE_WORD]  # (32, cdna4_32), (32, linear), (16, ...)


@pytest.mark.parametrize("dim, layout", LAYOUTS)
def test_scale_words_are_the_lanes_scales(dim, layout):
    """For every tile, K step, 16-row half (16x16x128) and lane, the scale byte the kernel
    passes (word, opsel) is the linear scale (row, block (k / 32) s + l // dim) that
    operands.scale_lane wants: cdna4_32 / cdna4_16 hold what the lanes of their instruction
    want."""
    shape = SHAPES[dim]
    rows, K = 64, shape.k * 7  # 7 steps: whole words and a tail (3 of 4 steps, or 1 of 2)
    lin = np.random.default_rng(3).integers(0, 255, (rows, K // 32)).astype(np.uint8)
    stored = get_layout(layout).swizzle(lin)
    lane = np.arange(64)
    for tile in range(rows // WAVE_TILE):
        for s in range(K // shape.k):
            for half in range(WAVE_TILE // dim):
                reg, opsel = _scale_registers(stored, layout, tile, s, K, half, dim)
                got = (reg >> np.uint32(8 * opsel)) & np.uint32(0xFF)
                row = tile * WAVE_TILE + dim * half + lane % dim
                np.testing.assert_array_equal(got, lin[row, shape.groups * s + lane // dim])


@pytest.mark.parametrize("dim, layout", LAYOUTS)
@pytest.mark.parametrize("fa, fb", PAIRS)
def test_gemm_twin_against_reference(fa, fb, dim, layout):
    rng = np.random.default_rng(hash((fa, fb, dim, layout)) % 2**32)
    # 2 x 3 tiles; 5 K steps of 64 (cdna4_32: one word of 4 + a tail of 1) or 3 of 128
    # (cdna4_16: one word of 2 + a tail of 1)
    M, N, K = 64, 96, {32: 320, 16: 384}[dim]
    ca, sa = quantized(rng, (M, K), fa)
    cb, sb = quantized(rng, (N, K), fb)
    ap, sap, bp, sbp = pack_operands(ca, sa, cb, sb, fa, fb, layout, dim)
    got = gemm_twin(ap, sap, bp, sbp, M, N, K, fa, fb, layout, dim)
    assert got.dtype == np.float32 and got.shape == (M, N)
    assert rel_l2(got, reference_gemm(ca, sa, fa, cb, sb, fb)) < 1e-5


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("fa, fb", [("e4m3", "e4m3"), ("e2m1", "e2m1"), ("e2m3", "e5m2")])
def test_gemm_twin_bit_exact_when_sums_are_exact(fa, fb, dim):
    """Codes of magnitude <= 4 with scales 2^-2 .. 2^2: every partial sum is a multiple of
    2^-8 below 2^14, exact in float32, so the kernel's float32 result equals the reference."""
    rng = np.random.default_rng(7)
    M, N, K = 32, 64, {32: 448, 16: 640}[dim]
    out = []
    for rows, fmt in ((M, fa), (N, fb)):
        table = float_code_table(operand(fmt).fmt)
        mag = np.where(np.isfinite(table), np.abs(table), np.inf)
        ok = np.flatnonzero((mag <= 4) & (mag * 8 == np.floor(mag * 8)))
        out += [rng.choice(ok, (rows, K)).astype(np.uint8), rng.integers(125, 130, (rows, K // 32)).astype(np.uint8)]
    ca, sa, cb, sb = out
    ap, sap, bp, sbp = pack_operands(ca, sa, cb, sb, fa, fb, mfma_dim=dim)
    got = gemm_twin(ap, sap, bp, sbp, M, N, K, fa, fb, mfma_dim=dim)
    np.testing.assert_array_equal(got, reference_gemm(ca, sa, fa, cb, sb, fb).astype(np.float32))


@pytest.mark.parametrize("dim, M, N, K, bad", [
    (32, 48, 32, 64, "M"), (32, 32, 40, 64, "N"), (32, 32, 32, 96, "K"), (32, 32, 32, 0, "K"),
    (32, 0, 32, 64, "M"), (32, 32.0, 32, 64, "M"),
    (16, 16, 32, 128, "M"), (16, 32, 48, 128, "N"), (16, 32, 32, 64, "K"), (16, 32, 32, 192, "K"),
])
def test_odd_shapes_rejected(dim, M, N, K, bad):
    # the 16x16x128 kernel's wave tile is 32 x 32 too (2 x 2 instructions): M = 16 is refused
    with pytest.raises(ValueError, match=rf"^{bad}="):
        check_gemm_shape(M, N, K, dim)


@pytest.mark.parametrize("dim, layout", [(16, "cdna4_32"), (32, "cdna4_16"), (8, None), (32, "nv_128x4")])
def test_kernel_variants_are_the_rule_table(dim, layout):
    with pytest.raises(ValueError, match="mfma_dim=|scale_layout="):
        gemm_ir("e4m3", "e4m3", layout, dim)
    assert gemm_variant(16) == (SHAPES[16], "cdna4_16") and gemm_variant() == (SHAPES[32], "cdna4_32")


# --- (b) the kernel assembled for gfx950 ----------------------------------------------------

def _mfma_lines(asm, mnemonic):
    return list(re.finditer(
        rf"^\s+{mnemonic} a\[\d+:\d+\], v\[(\d+):(\d+)\], v\[(\d+):(\d+)\], a\[\d+:\d+\], v\d+, v\d+(?P<mods>.*)$",
        asm, re.M))


def _loop_body(asm):
    """The text of the kernel's K loop: from a label to the branch back to it."""
    for m in re.finditer(r"^(\.LBB\d+_\d+):.*$", asm, re.M):
        back = re.search(rf"^\s+s_cbranch_\w+ {re.escape(m.group(1))}$", asm[m.end():], re.M)
        if back:
            return asm[m.end(): m.end() + back.start()]
    raise AssertionError("no loop in the kernel")


def _opsel_byte(mods):
    op_sel = re.search(r"op_sel:\[(\d),(\d),0\]", mods)
    hi = re.search(r"op_sel_hi:\[(\d),(\d),0\]", mods)
    lo_a, lo_b = (int(op_sel.group(1)), int(op_sel.group(2))) if op_sel else (0, 0)
    hi_a, hi_b = (int(hi.group(1)), int(hi.group(2))) if hi else (0, 0)
    return lo_a | hi_a << 1, lo_b | hi_b << 1


_LOAD_BYTES = {"global_load_ubyte": 1, "global_load_dword": 4, "global_load_dwordx2": 8,
               "global_load_dwordx3": 12, "global_load_dwordx4": 16}


def _loaded_bytes(asm):
    """Bytes per lane that the global loads in ``asm`` read (any other load fails)."""
    loads = re.findall(r"^\s+(global_load_\w+|buffer_load_\w+|flat_load_\w+|s_load_\w+)\s", asm, re.M)
    assert set(loads) <= set(_LOAD_BYTES), loads
    return sum(_LOAD_BYTES[m] for m in loads)


@pytest.mark.parametrize("fa, fb, dim, layout", [(f, f, dim, f"cdna4_{dim}") for dim in DIMS for f in FORMATS] + [
    (fa, fb, dim, f"cdna4_{dim}") for dim in DIMS for fa, fb in (("e4m3", "e2m1"), ("e2m3", "e5m2"))] + [
    ("e2m3", "e5m2", 32, "linear"), ("e2m1", "e2m1", 32, "linear"),
    ("e4m3", "e3m2", 16, "linear"), ("e2m1", "e2m1", 16, "linear")])
def test_kernel_assembles_for_gfx950(fa, fb, dim, layout):
    asm = assemble(gemm_ir(fa, fb, layout, dim), "gfx950")
    assert '.amdgcn_target "amdgcn-amd-amdhsa--gfx950"' in asm
    op_a, op_b, shape = operand(fa), operand(fb), SHAPES[dim]
    unroll = STEPS_PER_SCALE_WORD[dim, layout]
    per_step = mfmas_per_step(dim)  # 1 (32x32x64), 4 (16x16x128: 2 x 2 halves of the 32 x 32 tile)
    halves = WAVE_TILE // dim
    # per_step scaled MFMAs per K step: `unroll` steps in the loop body, unroll - 1 more in the tail
    body = _loop_body(asm)
    assert count_instruction(body, shape.mnemonic) == unroll * per_step
    assert count_instruction(asm, shape.mnemonic) == (2 * unroll - 1) * per_step
    for other in SHAPES.values():  # never the unscaled form, never the other shape
        assert count_instruction(asm, f"v_mfma_f32_{other.name}_f8f6f4") == 0
        assert other == shape or count_instruction(asm, other.mnemonic) == 0
    lines = _mfma_lines(asm, shape.mnemonic)
    assert len(lines) == (2 * unroll - 1) * per_step
    for m in lines:
        a0, a1, b0, b1 = (int(g) for g in m.groups()[:4])
        assert (a1 - a0 + 1, b1 - b0 + 1) == (op_a.regs, op_b.regs)  # 8 / 6 / 4 VGPRs per operand
        mods = m.group("mods")
        assert (f"cbsz:{op_a.code}" in mods) == (op_a.code != 0)
        assert (f"blgp:{op_b.code}" in mods) == (op_b.code != 0)
    # the loop's instructions take scale bytes 0-3 of their words: K step j of the word, then
    # the A / B half (cdna4_32: (j, j); cdna4_16: (2j + i, 2j + jj)); linear scales byte 0
    want = sorted((halves * j + i, halves * j + jj) if layout != "linear" else (0, 0)
                  for j in range(unroll) for i in range(halves) for jj in range(halves))
    assert sorted(_opsel_byte(m.group("mods")) for m in _mfma_lines(body, shape.mnemonic)) == want
    # the loop body loads each lane's operand bytes of its steps and its scales, nothing more
    operand_bytes = unroll * halves * (32 * op_a.bits // 8 + 32 * op_b.bits // 8)
    scale_bytes = 2 * 4 if layout != "linear" else 2 * halves
    assert _loaded_bytes(body) == operand_bytes + scale_bytes
    stats = kernel_stats(asm, kernel_name(fa, fb, layout, dim))
    assert stats.private_segment_size == 0 and stats.vgpr_spill_count == 0 and stats.sgpr_spill_count == 0
    assert stats.group_segment_size == 0  # no LDS
    assert per_step * shape.accumulators <= stats.agpr_count and stats.vgpr_count <= VGPR_BUDGET, stats
    assert ".amdhsa_private_segment_fixed_size 0" in asm and ".private_segment_fixed_size: 0" in asm


@pytest.mark.parametrize("dim", DIMS)
def test_scaled_mfma_is_refused_for_gfx942(dim):
    """The scaled MFMAs exist on gfx950 only: for gfx942 LLVM 22 aborts the process ("Cannot
    select: intrinsic"), which is why every compile runs in a child. (The IR names no CPU,
    so the target machine's ``cpu`` is the one assembled for.)"""
    with pytest.raises(AssemblyError, match="Cannot select"):
        assemble(gemm_ir("e4m3", "e4m3", mfma_dim=dim), "gfx942", timeout=60)


# --- (c) the gfx950 scaled conversions ------------------------------------------------------


def test_cvt_intrinsics_assemble_for_gfx950():
    asm = assemble(cvt_twin.cvt_ir(), "gfx950")
    for mnemonic in cvt_twin.CVT_MNEMONICS:
        assert count_instruction(asm, mnemonic) == 1, mnemonic
    # dst_sel = 1 (byte 1) and word_sel = 1 (high half) are op_sel bits of the destination
    assert re.search(r"v_cvt_scalef32_pk_fp4_f32 v\d+, v\d+, v\d+, v\d+ op_sel:\[0,0,1,0\]", asm)
    assert len(re.findall(r"v_cvt_scalef32_pk_(?:fp8|bf8)_f32 v\d+, v\d+, v\d+, v\d+ op_sel:\[0,0,0,1\]", asm)) == 2


def input_classes(fmt):
    """float64 values/scale over every class: each finite code's value (both signs), each
    midpoint between neighbours (ties), one float32 ulp either side of each midpoint, +-0,
    half the smallest subnormal (ties to zero), and magnitudes past the maximum."""
    mags = float_code_table(fmt)[: fmt.max_code + 1].astype(np.float64)
    mids = (mags[:-1] + mags[1:]) / 2
    near = np.concatenate([np.nextafter(mids.astype(np.float32), np.float32(np.inf)),
                           np.nextafter(mids.astype(np.float32), np.float32(0))]).astype(np.float64)
    over = fmt.max_value * np.array([1.0, 1.0625, 1.5, 2.0, 1e3])
    v = np.concatenate([mags, mids, near, [0.0, mags[1] / 2, mags[1] * 0.75], over])
    return np.concatenate([v, -v])


@pytest.mark.parametrize("fmt", [E2M1, E4M3, E5M2], ids=lambda f: f.name)
@pytest.mark.parametrize("scale", [1.0, 2.0**-3, 2.0**5])
def test_cvt_twins_match_reference_encoders(fmt, scale):
    """The twins' table search against reference/codec.encode_float (RNE, saturating): the
    same code for every class, the same packing into the result register."""
    v = input_classes(fmt)
    src = (v * scale).astype(np.float32)
    assert np.array_equal(src.astype(np.float64) / scale, v)  # the classes survive the scaling exactly
    want = encode_float(v, fmt, saturate=True)
    np.testing.assert_array_equal(cvt_twin.round_to_code(v, fmt), want)
    old = np.uint32(0xA5A5A5A5)
    half = len(src) // 2
    s0, s1, w0, w1 = src[:half], src[half:], want[:half].astype(np.uint32), want[half:].astype(np.uint32)
    if fmt is E2M1:
        for sel in range(4):
            got = cvt_twin.cvt_scalef32_pk_fp4_f32(old, s0, s1, np.float32(scale), sel)
            keep = old & ~np.uint32(0xFF << 8 * sel)
            np.testing.assert_array_equal(got, keep | ((w0 | w1 << 4) << np.uint32(8 * sel)))
    else:
        cvt = cvt_twin.cvt_scalef32_pk_fp8_f32 if fmt is E4M3 else cvt_twin.cvt_scalef32_pk_bf8_f32
        for word in (False, True):
            got = cvt(old, s0, s1, np.float32(scale), word)
            keep = old & ~np.uint32(0xFFFF << 16 * word)
            np.testing.assert_array_equal(got, keep | ((w0 | w1 << 8) << np.uint32(16 * word)))
