"""NVFP4 x NVFP4 on the tensor cores as a bfloat16 GEMM (``nqdq.gpu.gemm``: ``blockscaled``
``prepare_nvfp4_operand`` / ``nvfp4_gemm``, ``plan``'s ``"bf16.bf16"`` kind, ``mma_sync``), in
the simulator, plus the conversion kernel assembled for sm_90.

* The claim the design rests on, checked from ml_dtypes alone: every e2m1 value times every
  ue4m3 value is exactly a bfloat16 value (all 16 x 128 codes: 16 x 127 finite products,
  ue4m3 0x7F being NaN; and the other 128 e4m3 bytes, the sign bit set, which the reference
  decodes too).
* Conversion: the device kernel and its NumPy twin, bit for bit, against float64 products of
  ml_dtypes values (e2m1 code value x e4m3 scale value, by hand-unpacked nibbles), on codes
  from ``nqdq.quantize(x, "nvfp4")`` and on hand-picked codes; K not a multiple of 16 or 32
  (the partial last block, the padding to whole blocks of 16, an odd K's spare nibble).
* GEMM: ``plan.gemm(mma="bf16.bf16")`` against ``reference.matmul.gemm`` (fed
  ml_dtypes.bfloat16 arrays: it reads operand values with ``astype(float64)``) and
  ``nvfp4_gemm`` against the float64 product of ``nqdq.dequantize`` outputs, rel. L2 < 1e-5 with
  float32 output (the kernel: exact bf16 products summed in float32 per K step of 16, the
  twin rounding once a step; the references: float64, one rounding).

Every test makes its data from its own seed.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nqdq
from nqdq.gpu.gemm import blockscaled as bs
from nqdq.gpu.gemm import mma_sync
from nqdq.gpu.gemm import plan as kg
from nqdq.reference import matmul as ref

from helpers.gemm import rel_l2
from helpers.ptx import compile_rows

CONVERTERS = [bs.convert_nvfp4, bs.convert_nvfp4_reference]  # the device kernel, its NumPy twin
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
    """bf16 ``bits`` [rows, Kp] hold ``values`` [rows, K] exactly (signed zeros, NaN where
    NaN: the one quiet NaN 0x7FC0), and +0 past K."""
    K = values.shape[1]
    got = bf16_values(bits)
    nan = np.isnan(values)
    assert np.all(bits[:, :K][nan] == 0x7FC0)
    np.testing.assert_array_equal(got[:, :K][~nan], values[~nan])
    np.testing.assert_array_equal(np.signbit(got[:, :K][~nan]), np.signbit(values[~nan]))
    assert not bits[:, K:].any()


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
    # the conversion's table is these products' bits (NaN: 0x7FC0)
    table = bs.nvfp4_bf16_table()
    np.testing.assert_array_equal(table[finite], product[finite].astype(ml_dtypes.bfloat16).view(np.uint16))
    assert np.all(table[~finite] == 0x7FC0)


# ----------------------------------------------------------------------------- conversion
@pytest.mark.parametrize("convert", CONVERTERS, ids=["kernel", "twin"])
@pytest.mark.parametrize("rows,K", [(4, 64), (3, 37), (5, 100), (1, 5)])
def test_conversion_of_quantized_codes(convert, rows, K):
    """Codes and scales of ``nqdq.quantize(x, "nvfp4")`` (K = 37, 100, 5: a partial last
    block; 37 and 5 odd), with rows of very different magnitudes (block scales across the
    ue4m3 range, subnormal ones included)."""
    rng = np.random.default_rng([rows, K, 16])
    x = rng.standard_normal((rows, K)).astype(np.float32)
    x *= np.float32(2.0) ** rng.integers(-12, 4, (rows, 1)).astype(np.float32)
    x[0, : min(K, 16)] *= np.float32(1e-3)  # a small first block beside the row's large ones
    q = nqdq.quantize(x, "nvfp4")
    assert q.codes.shape == (rows, -(-K // 2)) and q.scales.shape == (rows, -(-K // 16))
    got = convert(q.codes, q.scales, rows, K)
    Kp = -(-K // 16) * 16
    assert isinstance(got, np.ndarray) and got.dtype == np.uint16 and got.shape == (rows, Kp)
    assert_bits_are_values(got, nvfp4_values(q.codes, q.scales, K))
    # times the tensor scale: nqdq.dequantize's values, to its float32 rounding of scale x S_dec
    deq = nqdq.dequantize(q).astype(np.float64)
    exact = bf16_values(got)[:, :K] * float(q.tensor_scale)
    np.testing.assert_allclose(exact, deq, rtol=2.0**-23, atol=0)


@pytest.mark.parametrize("convert", CONVERTERS, ids=["kernel", "twin"])
def test_conversion_of_hand_picked_codes(convert):
    """Row 0: +0, -0, 6 and -6 under the largest ue4m3 scale 448 (+-2688); row 1: 0.5 and -0.5
    under the smallest subnormal scale 2^-9 (+-2^-10), then a zero scale (+-0 whatever the
    code); row 2: a NaN scale (0x7F), then every code under scale 1.0; K = 45: three whole
    blocks of 16 would need 48, and the last byte's spare nibble holds a nonzero code that
    must be ignored."""
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
    got = convert(packed, scales, 3, K)
    assert got.shape == (3, 48)
    assert_bits_are_values(got, values)
    np.testing.assert_array_equal(got[2, :16], np.full(16, 0x7FC0, np.uint16))
    np.testing.assert_array_equal(got[0, :4], [0x0000, 0x8000, 0x4528, 0xC528])  # +-2688 = +-1.3125 * 2^11


@pytest.mark.parametrize("rows,K", [(3, 33), (2, 64), (0, 16), (4, 1)])
def test_conversion_kernel_equals_twin_on_any_bytes(rows, K):
    """Random code and scale bytes (NaN scales, sign-bit scales and spare nibbles included)."""
    rng = np.random.default_rng([rows, K, 99])
    packed = rng.integers(0, 256, (rows, -(-K // 2)), dtype=np.uint8)
    scales = rng.integers(0, 256, (rows, -(-K // 16)), dtype=np.uint8)
    got = bs.convert_nvfp4(packed, scales, rows, K)
    np.testing.assert_array_equal(got, bs.convert_nvfp4_reference(packed, scales, rows, K))
    assert got.shape == (rows, -(-K // 16) * 16)


def test_prepare_nvfp4_operand_errors_name_the_argument():
    codes = np.zeros((2, 16), np.uint8)
    scales = np.zeros((2, 2), np.uint8)
    assert bs.prepare_nvfp4_operand(codes, scales, 2, 32).shape == (2, 32)
    with pytest.raises(ValueError, match=r"codes hold 32 bytes; a \[2, 40\] NVFP4 operand has 2 x 20"):
        bs.prepare_nvfp4_operand(codes, scales, 2, 40)
    with pytest.raises(ValueError, match=r"block_scales hold 8 bytes; a \[2, 31\] NVFP4 operand has 2 x 2"):
        bs.prepare_nvfp4_operand(codes, scales[:, :1].repeat(4, axis=1), 2, 31)
    with pytest.raises(TypeError, match="block_scales must be bytes"):
        bs.prepare_nvfp4_operand(codes, scales.astype(np.float32), 2, 32)


# ----------------------------------------------------------------------------- bf16 GEMM
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


# ----------------------------------------------------------------------------- NVFP4 x NVFP4
def nvfp4_pair(seed, M, N, K):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, K)).astype(np.float32)
    x[:, ::5] *= 8  # uneven blocks: block scales differ
    w = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)
    qa, qb = nqdq.quantize(x, "nvfp4"), nqdq.quantize(w, "nvfp4")
    want = nqdq.dequantize(qa).astype(np.float64) @ nqdq.dequantize(qb).astype(np.float64).T
    return qa, qb, want, rng


def run_nvfp4(qa, qb, M, N, K, **kw):
    return bs.nvfp4_gemm(qa.codes, qa.scales, qa.tensor_scale, qb.codes, qb.scales, qb.tensor_scale, M, N, K, **kw)


@pytest.mark.parametrize("M,N,K", [(1, 16, 64), (7, 9, 37), (18, 17, 96)])
def test_nvfp4_gemm_matches_dequantized_product(M, N, K):
    qa, qb, want, _ = nvfp4_pair([M, N, K, 4], M, N, K)
    got = run_nvfp4(qa, qb, M, N, K)
    assert got.dtype == np.float32 and got.shape == (M, N)
    assert rel_l2(got, want) < 1e-5


@pytest.mark.parametrize("kw", [dict(bias=True, activation="relu", alpha=2.0),
                                dict(bias=True, out_dtype="bfloat16")])  # fmt: skip
def test_nvfp4_gemm_epilogue(kw):
    M, N, K = 6, 12, 48
    qa, qb, product, rng = nvfp4_pair(612, M, N, K)
    kw = dict(kw)
    bias = kw["bias"] = rng.standard_normal(N).astype(np.float32)
    want = kw.get("alpha", 1.0) * product + bias
    if kw.get("activation") == "relu":
        want = np.maximum(want, 0)
    got = run_nvfp4(qa, qb, M, N, K, **kw)
    assert got.shape == (M, N)
    if kw.get("out_dtype") == "bfloat16":
        assert got.dtype == ml_dtypes.bfloat16
        assert np.all(np.abs(got.astype(np.float64) - want) <= 2.0**-7 * np.abs(want) + 1e-30)
    else:
        assert (got == 0).any() and rel_l2(got, want) < 1e-5


def test_nvfp4_gemm_takes_one_tensor_scale_each():
    qa, qb, _, _ = nvfp4_pair(1, 2, 8, 32)
    with pytest.raises(ValueError, match="tscale_b must be one float32 tensor scale"):
        bs.nvfp4_gemm(qa.codes, qa.scales, qa.tensor_scale, qb.codes, qb.scales, np.ones(2, np.float32), 2, 8, 32)


# ----------------------------------------------------------------------------- PTX
_PTX_SCRIPT = r"""
import json, re
import numpy as np
from numba import cuda, typeof
from nqdq.gpu.gemm import blockscaled as bs, plan as kg
from nqdq.gpu.gemm.mma_sync import ACT_GELU, ACT_NONE, OUT_BF16, OUT_F32, SCALE_ROW, SCALE_TENSOR, GemmSpec
from nqdq.tools.ptx_audit import _no_gpu_compile
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
with _no_gpu_compile():
    u8, u32 = typeof(np.zeros(3, np.uint8)), typeof(np.zeros(3, np.uint32))
    ptx, _ = cuda.compile_ptx(bs.convert_nvfp4_kernel.py_func, (u8, u8, u32) + (typeof(1),) * 5, cc=(9, 0))
cubin, log = kg.assemble(ptx, (9, 0))
spill = re.search(r"(\d+) bytes spill stores", log)
out.append(dict(cubin=len(cubin), f64=len(re.findall(r"\.f64\b", ptx)), spill=int(spill.group(1)) if spill else None,
                stores=sorted(set(re.findall(r"st\.global\.[a-z0-9]+", ptx)))))
print(json.dumps(out))
"""


def test_nvfp4_kernels_assemble():
    """The bf16 GEMM (GPU_CONFIG's 128 x 128 tile) for sm_90 and sm_89 and the conversion
    kernel, compiled by numba-cuda and assembled by nvJitLink without a GPU: the m16n8k16 bf16
    mma only, the fp8 kernel's 12 ldmatrix a 64-byte tile, no spills; the conversion has no
    float64 instruction and stores 4 bytes (a pair of outputs) at a time."""
    rows = compile_rows(_PTX_SCRIPT)
    for row in rows[:2]:
        assert row["mma"] == ["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"], row
        assert row["ldmatrix"] == 12 and row["spill"] == 0 and row["cubin"] > 0, row
    assert rows[2]["cubin"] > 0 and rows[2]["f64"] == 0 and rows[2]["spill"] == 0, rows[2]
    assert rows[2]["stores"] == ["st.global.u32"], rows[2]


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
