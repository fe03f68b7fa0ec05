"""The bfloat16 GEMM (``plan``'s ``"bf16.bf16"`` kind: ``mma_sync`` and the sm_90a ``wgmma``
kernel) and the NVFP4 operands it takes (``nqdq._pairs_gpu.exact_bf16``), in the simulator, plus
the kernels assembled.

* The claim NVFP4 on the bf16 GEMM rests on, checked from ml_dtypes alone: every e2m1 value
  times every ue4m3 value is exactly a bfloat16 value (all 16 x 128 codes: 16 x 127 finite
  products, ue4m3 0x7F being NaN; and the other 128 e4m3 bytes, the sign bit set, which the
  reference decodes too).
* The operands: ``exact_bf16`` of an ``nvfp4`` tensor (its dequantize with the tensor scale
  set to 1) against float64 products of ml_dtypes values (e2m1 code value x e4m3 scale value,
  by hand-unpacked nibbles), on codes from ``nqdq.quantize(x, "nvfp4")`` and on hand-picked
  codes; K not a multiple of 16 or 32 (the partial last block, an odd K's spare nibble).
* GEMM: ``plan.gemm(mma="bf16.bf16")`` against ``reference.matmul.gemm`` (fed
  ml_dtypes.bfloat16 arrays: it reads operand values with ``astype(float64)``), rel. L2 < 1e-5
  with float32 output (the kernel: exact bf16 products summed in float32 per K step of 16,
  the twin rounding once a step; the reference: float64, one rounding). NVFP4 x NVFP4
  through ``nqdq.matmul``: tests/test_matmul_pairs.py.

Every test makes its data from its own seed.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nqdq
from nqdq.gpu.gemm import mma_sync
from nqdq.gpu.gemm import plan as kg
from nqdq._pairs_gpu import exact_bf16
from nqdq.quantized import QuantizedTensor
from nqdq.reference import matmul as ref
from nqdq.schemes import resolve_scheme

from helpers.gemm import rel_l2
from helpers.ptx import compile_rows

E2M1 = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
E4M3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def bf16_values(bits):
    return np.asarray(bits).view(ml_dtypes.bfloat16).astype(np.float64)


def pack_nibbles(codes):
    """[rows, K] 4-bit codes -> [rows, ceil(K/2)] bytes, element 2i in the low nibble (written
    out here, not nqdq's packer); an odd K's spare high nibble is 0."""
    rows, K = codes.shape
    c = np.zeros((rows, K + K % 2), np.uint8)
    c[:, :K] = codes
    return (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(packed, K):
    p = np.asarray(packed).view(np.uint8)
    return np.stack([p & 0xF, p >> 4], axis=-1).reshape(p.shape[0], -1)[:, :K]


def nvfp4_values(packed, scales, K):
    """float64 [rows, K] of e2m1 code value x e4m3 value of its block's scale (ml_dtypes)."""
    s = np.repeat(E4M3[np.asarray(scales).view(np.uint8)], 16, axis=1)[:, :K]
    return E2M1[unpack_nibbles(packed, K)] * s


def assert_bits_are_values(bits, values):
    """bf16 ``bits`` [rows, K] hold ``values`` [rows, K] exactly (signed zeros; NaN where NaN)."""
    got = bf16_values(bits)
    nan = np.isnan(values)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan], values[~nan])
    np.testing.assert_array_equal(np.signbit(got[~nan]), np.signbit(values[~nan]))


def operand_bits(q):
    """``exact_bf16`` of an nvfp4 tensor: (uint16 bits [rows, K], the tensor scale), its mode checked."""
    bits, s, mode = exact_bf16(q)
    assert mode == "tensor"
    return np.asarray(bits).view(np.uint16), s


# ----------------------------------------------------------------------------- the claim
def test_every_e2m1_times_ue4m3_is_a_bfloat16_value():
    """16 e2m1 codes x 256 e4m3 bytes (ue4m3: the 128 with the sign bit clear): each finite
    product converts to bfloat16 and back unchanged, with its sign; at most 6 significant
    bits; magnitudes from 2^-10 (0.5 x the smallest subnormal scale 2^-9) to 2688 (6 x 448)."""
    product = E4M3[:, None] * E2M1[None, :]
    finite = np.isfinite(product)
    assert finite[:128].sum() == 16 * 127 and finite.sum() == 16 * 254  # 0x7F, 0xFF: NaN
    p = product[finite]
    back = p.astype(ml_dtypes.bfloat16).astype(np.float64)
    np.testing.assert_array_equal(back, p)
    np.testing.assert_array_equal(np.signbit(back), np.signbit(p))
    nz = np.abs(p[p != 0])
    assert nz.min() == 2.0**-10 and nz.max() == 2688.0
    mant, _ = np.frexp(nz)
    assert np.all(mant * 64 == np.floor(mant * 64))  # 6 significant bits at most


# ----------------------------------------------------------------------------- the operands
@pytest.mark.parametrize("rows,K", [(4, 64), (3, 37), (5, 100), (1, 5)])
def test_operands_of_quantized_codes(rows, K):
    """Codes and scales of ``nqdq.quantize(x, "nvfp4")`` (K = 37, 100, 5: a partial last
    block; 37 and 5 odd), with rows of very different magnitudes (block scales across the
    ue4m3 range, subnormal ones included); the tensor scale is left for the epilogue."""
    rng = np.random.default_rng([rows, K, 16])
    x = rng.standard_normal((rows, K)).astype(np.float32)
    x *= np.float32(2.0) ** rng.integers(-12, 4, (rows, 1)).astype(np.float32)
    x[0, : min(K, 16)] *= np.float32(1e-3)  # a small first block beside the row's large ones
    q = nqdq.quantize(x, "nvfp4")
    assert q.codes.shape == (rows, -(-K // 2)) and q.scales.shape == (rows, -(-K // 16))
    got, s = operand_bits(q)
    assert got.shape == (rows, K) and s is q.tensor_scale
    assert_bits_are_values(got, nvfp4_values(q.codes, q.scales, K))
    # times the tensor scale: nqdq.dequantize's values, to its float32 rounding of scale x S_dec
    deq = nqdq.dequantize(q).astype(np.float64)
    np.testing.assert_allclose(bf16_values(got) * float(q.tensor_scale), deq, rtol=2.0**-23, atol=0)


def test_operands_of_hand_picked_codes():
    """Row 0: +0, -0, 6 and -6 under the largest ue4m3 scale 448 (+-2688); row 1: 0.5 and -0.5
    under the smallest subnormal scale 2^-9 (+-2^-10), then a zero scale (+-0 whatever the
    code); row 2: a NaN scale (0x7F: NaN elements), then every code under scale 1.0; K = 45:
    three blocks of 16 would need 48, and the last byte's spare nibble holds a nonzero code
    that must be ignored."""
    K = 45
    codes = np.zeros((3, K), np.uint8)
    scales = np.zeros((3, 3), np.uint8)
    codes[0, :4] = [0x0, 0x8, 0x7, 0xF]
    scales[0] = 0x7E  # 448
    codes[1, :4], codes[1, 16:20] = [0x1, 0x9, 0x1, 0x9], [0x7, 0xF, 0x0, 0x8]
    scales[1] = [0x01, 0x00, 0x01]  # 2^-9, 0, 2^-9
    codes[2, :16] = np.arange(16)
    codes[2, 16:32] = np.arange(16)
    codes[2, 32:] = np.arange(K - 32)
    scales[2] = [0x7F, 0x38, 0x38]  # NaN, 1.0, 1.0
    packed = pack_nibbles(codes)
    packed[:, -1] |= 0xB0  # K odd: the spare high nibble of the last byte
    values = nvfp4_values(pack_nibbles(codes), scales, K)
    assert values[0, 2] == 2688.0 and values[0, 3] == -2688.0 and np.signbit(values[0, 1])
    assert values[1, 0] == 2.0**-10 and values[1, 1] == -(2.0**-10) and np.signbit(values[1, 19])
    q = QuantizedTensor(packed, scales, resolve_scheme("nvfp4"), (3, K), "float32", tensor_scale=np.float32(0.25))
    got, s = operand_bits(q)
    assert float(s) == 0.25
    assert_bits_are_values(got, values)
    assert np.isnan(bf16_values(got[2, :16])).all()
    np.testing.assert_array_equal(got[0, :4], [0x0000, 0x8000, 0x4528, 0xC528])  # +-2688 = +-1.3125 * 2^11


def bf16_operand(rng, rows, K, spread=4):
    """ml_dtypes.bfloat16 [rows, K]: normal values times powers of two in [2^-spread, 2^spread]."""
    v = rng.standard_normal((rows, K)) * 2.0 ** rng.integers(-spread, spread + 1, (rows, K))
    return v.astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("shape,modes,bits", [
    ((1, 8, 32), ("tensor", "tensor"), True),  # M = 1; uint16 bits
    ((17, 9, 37), ("row", "row"), False),  # odd M, N; K padded to 40 by the launcher
    ((16, 24, 80), ("tensor", "row"), True),  # the last 64-byte tile half full
    ((5, 16, 8), ("row", "tensor"), False),  # one K step, half of it zeros
])  # fmt: skip
def test_bf16_gemm_matches_reference(shape, modes, bits):
    M, N, K = shape
    rng = np.random.default_rng([M, N, K, 7])
    a, b = bf16_operand(rng, M, K), bf16_operand(rng, N, K)
    sa_mode, sb_mode = modes
    sa = rng.uniform(0.5, 2, 1 if sa_mode == "tensor" else M).astype(np.float32)
    sb = rng.uniform(0.5, 2, 1 if sb_mode == "tensor" else N).astype(np.float32)
    kw = dict(mma="bf16.bf16", sa=sa, sb=sb, sa_mode=sa_mode, sb_mode=sb_mode)
    got = kg.gemm(a.view(np.uint16) if bits else a, b.view(np.uint16) if bits else b, **kw)
    want = ref.gemm(a, b, **kw)
    assert got.dtype == np.float32 and got.shape == (M, N)
    assert rel_l2(got, want) < 1e-5
    # the reference against a product written out here
    direct = (a.astype(np.float64) * sa[:, None] if sa_mode == "row" else a.astype(np.float64) * sa[0]) @ \
        (b.astype(np.float64) * (sb[:, None] if sb_mode == "row" else sb[0])).T  # fmt: skip
    np.testing.assert_array_equal(want, direct.astype(np.float32))


@pytest.mark.parametrize("kw", [dict(bias=True, activation="relu", alpha=0.25),
                                dict(bias=True, activation="gelu", out_dtype="bfloat16"),
                                dict(out_dtype="float16")])  # fmt: skip
def test_bf16_gemm_epilogue(kw):
    M, N, K = 9, 10, 48
    rng = np.random.default_rng(48)
    a, b = bf16_operand(rng, M, K, 2), bf16_operand(rng, N, K, 2)
    if kw.pop("bias", False):
        kw["bias"] = (rng.standard_normal(N) * 20).astype(np.float32)
    args = dict(mma="bf16.bf16", sa=np.float32(0.5), sb=np.float32(3), sa_mode="tensor", sb_mode="tensor", **kw)
    got = kg.gemm(a, b, **args)
    want = ref.gemm(a, b, **args)
    assert got.dtype == want.dtype and got.shape == (M, N)
    if want.dtype == np.float32:
        assert (got == 0).any() and rel_l2(got, want) < 1e-5  # relu clipped some
    else:  # one rounding of a float32 vs a float64 value: at most one ulp apart
        g, w = got.astype(np.float64), want.astype(np.float64)
        assert np.all(np.abs(g - w) <= (2.0**-7 if want.dtype == ml_dtypes.bfloat16 else 2.0**-10) * np.abs(w))


def test_bf16_launch_sequence_equals_gemm():
    """``gemm_sequence`` (nqdq.matmul's hot path) takes the bf16 kind: uint16 codes, 2 bytes an
    element; the same bits as ``gemm``."""
    M, N, K = 7, 16, 32
    rng = np.random.default_rng(32)
    a, b = bf16_operand(rng, M, K).view(np.uint16), bf16_operand(rng, N, K).view(np.uint16)
    sa, sb = np.float32([0.75]), rng.uniform(0.5, 2, N).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    kw = dict(mma="bf16.bf16", sa_mode="tensor", sb_mode="row", activation="relu")
    seq = kg.gemm_sequence(M, N, K, bias=True, **kw)
    out = np.empty(seq.nbytes, np.uint8)
    seq.run(0, a, b, sa, sb, None, bias, out)
    want = kg.gemm(a, b, sa=sa, sb=sb, bias=bias, **kw)
    np.testing.assert_array_equal(out.view(np.float32).reshape(M, N), want)
    assert kg.gemm_sequence(M, N, 36, **kw) is None  # K not a multiple of 8: padded copies


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(sa_mode="block"), ValueError, "sa_mode='block': mma='bf16.bf16' takes the 'tensor' and 'row'"),
    (dict(sa_mode="mx", sb_mode="mx"), ValueError, "mma='bf16.bf16': the MX scale mode takes fp8 codes"),
    (dict(za=np.uint8(3)), ValueError, "za: mma='bf16.bf16' takes no zero points"),
    (dict(a_dtype=np.float16), TypeError, r"a_codes \(mma 'bf16.bf16'\) must hold bfloat16 bits"),
    (dict(a_dtype=np.uint8), TypeError, r"a_codes \(mma 'bf16.bf16'\) must hold bfloat16 bits"),
])  # fmt: skip
def test_bf16_errors_name_the_argument(kw, exc, msg):
    kw = dict(kw)
    a = np.zeros((2, 16), kw.pop("a_dtype", np.uint16))
    args = dict(dict(mma="bf16.bf16", sa=np.float32(1), sb=np.float32(1), sa_mode="tensor", sb_mode="tensor"), **kw)
    with pytest.raises(exc, match=msg):
        kg.gemm(a, np.zeros((4, 16), np.uint16), **args)


def test_bf16_takes_the_wgmma_tiles_on_sm90(monkeypatch):
    """sm_90 runs bf16 on the wgmma kernel: int8's wide tile for large outputs, the
    persistent 128 x 128 one below (plan's named choices); MX stays on mma.sync."""
    monkeypatch.setattr(kg, "SIMULATOR", False)
    monkeypatch.setattr(kg, "device_cc", lambda: (9, 0))

    def spec(mma, mode=mma_sync.SCALE_ROW):
        return kg.GemmSpec(mma=mma, sa_mode=mode, sb_mode=mode, out=mma_sync.OUT_BF16, act=mma_sync.ACT_NONE,
                           bias=False, asym=False)  # fmt: skip

    assert kg.default_config(spec("bf16.bf16"), (4096, 4096)) is kg.WGMMA_CONFIG_BF16
    assert kg.default_config(spec("bf16.bf16"), (16, 14336)) is kg.WGMMA_CONFIG_PERSISTENT_128
    assert kg.default_config(spec("e4m3.e4m3", mma_sync.SCALE_MX), (4096, 4096)) is kg.GPU_CONFIG
    with pytest.raises(ValueError, match="no MX scale mode"):
        kg.get_kernel(kg.WgmmaConfig(), spec("e4m3.e4m3", mma_sync.SCALE_MX))


@pytest.mark.parametrize("mode,M,N,K", [("ring", 17, 24, 72), ("ringd", 17, 24, 200), ("ws", 65, 24, 264),
                                        ("ws", 65, 24, 8)])  # fmt: skip
def test_bf16_wgmma_matches_reference(mode, M, N, K):
    """The sm_90a kernel's bf16 kind (m64nNk16 wgmma from the same swizzled 128-byte rows as
    the 8-bit kinds: 64 elements of K a stage) in the forms of the named choices, a
    one-warpgroup 64 x 16 tile: the block-barrier ring with the parked ("ring") and the
    direct ("ringd") epilogue, and a producer warpgroup on a persistent grid ("ws": M = 65,
    2 CTAs walk 4 tiles; K = 264: 9 stages, the 3-slot ring wraps; K = 8: one partial
    stage). Row scales on both sides, bias and ReLU. rel. L2 < 1e-5: the twin sums each
    wgmma's 16 products in float64, the reference the whole row; the hardware's order differs."""
    rng = np.random.default_rng(M * 1000 + K)
    a, b = bf16_operand(rng, M, K).view(np.uint16), bf16_operand(rng, N, K).view(np.uint16)
    kw = dict(mma="bf16.bf16", sa=rng.uniform(0.5, 2, M).astype(np.float32),
              sb=rng.uniform(0.5, 2, N).astype(np.float32), sa_mode="row", sb_mode="row",
              bias=rng.standard_normal(N).astype(np.float32), activation="relu")  # fmt: skip
    cfg = kg.WgmmaConfig(warpgroups=1, n=16, stages=3, group_m=2, producer=mode == "ws", direct=mode != "ring")
    got = kg.gemm(a, b, config=cfg, **kw)
    want = ref.gemm(a, b, **kw)
    assert (got == 0).any() and rel_l2(got, want) < 1e-5


# ----------------------------------------------------------------------------- PTX
_PTX_SCRIPT = r"""
import json, re
from nqdq.gpu.gemm import plan as kg
from nqdq.gpu.gemm.mma_sync import ACT_GELU, ACT_NONE, OUT_BF16, OUT_F32, SCALE_ROW, SCALE_TENSOR, GemmSpec
out = []
for sa, o, act, bias, cc in [(SCALE_TENSOR, OUT_F32, ACT_NONE, False, (9, 0)),
                             (SCALE_ROW, OUT_BF16, ACT_GELU, True, (8, 9))]:
    spec = GemmSpec(mma="bf16.bf16", sa_mode=sa, sb_mode=sa, out=o, act=act, bias=bias, asym=False)
    ptx = kg.compile_ptx(spec, cc)
    cubin, log = kg.assemble(ptx, cc)
    spill = re.search(r"(\d+) bytes spill stores", log)
    out.append(dict(mma=sorted(set(re.findall(r"mma\.sync\.aligned\.[a-z0-9.]+", ptx))),
                    ldmatrix=ptx.count("ldmatrix.sync.aligned.m8n8.x4.shared.b16"), cubin=len(cubin),
                    spill=int(spill.group(1)) if spill else None))
print(json.dumps(out))
"""


def test_bf16_mma_sync_kernels_assemble():
    """The bf16 GEMM on mma.sync (GPU_CONFIG's 128 x 128 tile) for sm_90 and sm_89, compiled
    by numba-cuda and assembled by nvJitLink without a GPU: the m16n8k16 bf16 mma only, the
    fp8 kernel's 12 ldmatrix a 64-byte tile, no spills."""
    rows = compile_rows(_PTX_SCRIPT)
    assert len(rows) == 2
    for row in rows:
        assert row["mma"] == ["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"], row
        assert row["ldmatrix"] == 12 and row["spill"] == 0 and row["cubin"] > 0, row


def test_reference_reads_bf16_bits():
    """reference.matmul.gemm's "bf16.bf16" takes bfloat16 arrays or their uint16 bits alike
    (1.5 * 2 + 2 * 4 = 11; -0.25 * 8 = -2)."""
    a = np.array([[1.5, 2.0], [-0.25, 0.0]], ml_dtypes.bfloat16)
    b = np.array([[2.0, 4.0], [8.0, 1.0]], ml_dtypes.bfloat16)
    one = np.ones(1, np.float32)
    kw = dict(mma="bf16.bf16", sa=one, sb=one, sa_mode="tensor", sb_mode="tensor")
    want = np.array([[11.0, 14.0], [-0.5, -2.0]], np.float32)
    np.testing.assert_array_equal(ref.gemm(a, b, **kw), want)
    np.testing.assert_array_equal(ref.gemm(a.view(np.uint16), b.view(np.uint16), **kw), want)
