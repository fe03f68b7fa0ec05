"""The MX block-scaled GEMM on the mma.sync kernel (``nqdq.gpu.gemm``: ``blockscaled``,
``plan``, ``mma_sync``), in the simulator, plus its PTX assembled for sm_89 / sm_90.

* Conversion: every code of e2m1, e2m3 and e3m2, packed as nqdq packs them (odd K, whose
  last byte group is part padding, too), becomes the e4m3 byte of the same value: values
  compared as float32 bits (signed zeros) with ml_dtypes' float4_e2m1fn / float6_e2m3fn /
  float6_e3m2fn; the device kernel and the NumPy twin are both run.
* GEMM: ``plan.gemm`` in scale mode "mx" against ``reference.matmul.gemm`` (fp8 codes) or
  against float64 products of ml_dtypes values (fp6 / fp4 codes, whose conversion is under
  test), rel. L2 < 1e-5 with float32 output. The kernel sums each 32 of K in the tensor core
  (the twin: exact products, one float32 rounding), then adds partial * 2^(ea - 127) *
  2^(eb - 127) in float32; the references sum in float64 and round once. The sm_120a variant
  (``SCALE_MX_HW``: the block-scaled mma applies the codes, the twins of
  ``ptx.mma_blockscale``) runs the fp8 cases too, forced by ``mx_kernel``.
* sm_120a (assembled, not run): that variant compiled for ``cc=(12, 0, "a")``, assembled by
  nvJitLink, its SASS read by nvdisasm; and the plan picks it for compute capability 12.0 only.

Every test makes its data from its own seed.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nqdq.gpu.gemm import blockscaled as bs
from nqdq.gpu.gemm import mma_sync
from nqdq.gpu.gemm import plan as kg
from nqdq.gpu.runtime.backend import cuda
from nqdq.gpu.runtime.target import SIMULATOR
from nqdq.reference import matmul as ref
from nqdq.reference.packing import pack_codes, packed_length

from helpers.gemm import rel_l2
from helpers.ptx import compile_rows
from test_mma_blockscale import nvdisasm_path

# element format -> (bits, the ml_dtypes type of its codes)
ELEMENTS = {
    "e2m1": (4, ml_dtypes.float4_e2m1fn),
    "e2m3": (6, ml_dtypes.float6_e2m3fn),
    "e3m2": (6, ml_dtypes.float6_e3m2fn),
    "e4m3": (8, ml_dtypes.float8_e4m3fn),
    "e5m2": (8, ml_dtypes.float8_e5m2),
}
CONVERTERS = [bs.convert_codes, bs.convert_codes_reference]  # the device kernel, its NumPy twin
# the MX kernel variants: float32 promotion every 32 of K, sm_120a's block-scaled mma
MX_KERNELS = pytest.mark.parametrize("mx_kernel", [mma_sync.SCALE_MX, mma_sync.SCALE_MX_HW],
                                     ids=["promote", "blockscale_mma"])  # fmt: skip
# NumPy arrays straight into the kernels and launch sequences: the simulator (on a GPU,
# tests/test_matmul_pairs.py runs the MX path through nqdq.matmul, conversion included)
simulator_only = pytest.mark.skipif(not SIMULATOR, reason="NumPy arrays into kernels: the CUDA simulator")


def f32_bits(values):
    return np.asarray(values).astype(np.float32).view(np.uint32)


# ----------------------------------------------------------------------------- conversion
@pytest.mark.parametrize("convert", CONVERTERS, ids=["kernel", "twin"])
@pytest.mark.parametrize("elem,K", [("e2m1", 16), ("e2m1", 17), ("e2m3", 64), ("e2m3", 66), ("e3m2", 64),
                                    ("e3m2", 67)])  # fmt: skip
def test_every_code_converts_to_the_same_e4m3_value(convert, elem, K):
    """Rows of all 2^bits codes (in order, reversed, shuffled; odd K: random codes after
    them), packed (4-bit: two a byte; 6-bit: four in three bytes): each e4m3 byte's value
    equals its code's, signed zero, subnormals and the maximum included."""
    if convert is bs.convert_codes and not SIMULATOR:
        pytest.skip("NumPy arrays into kernels: the CUDA simulator")
    bits, mld = ELEMENTS[elem]
    rng = np.random.default_rng([bits, K, 31])
    n = 1 << bits
    every = np.arange(n, dtype=np.uint8)
    rows = [every, every[::-1], rng.permutation(every)]
    codes = np.stack([np.r_[r, rng.integers(0, n, K - n)].astype(np.uint8) for r in rows])
    packed = pack_codes(codes, bits)
    assert packed.shape == (3, packed_length(K, bits))
    got = convert(packed, elem, 3, K)
    assert isinstance(got, np.ndarray) and got.dtype == np.uint8 and got.shape == (3, K)
    np.testing.assert_array_equal(f32_bits(got.view(ml_dtypes.float8_e4m3fn)), f32_bits(codes.view(mld)))


@simulator_only
@pytest.mark.parametrize("elem,rows,K", [("e2m1", 5, 33), ("e2m3", 4, 70), ("e3m2", 1, 32), ("e2m1", 0, 8)])
def test_conversion_kernel_equals_twin_on_any_bytes(elem, rows, K):
    """Random packed bytes, the padding bits of a partial last group included (ignored)."""
    bits, _ = ELEMENTS[elem]
    rng = np.random.default_rng([rows, K, 71])
    packed = rng.integers(0, 256, (rows, packed_length(K, bits)), dtype=np.uint8)
    got = bs.convert_codes(packed, elem, rows, K)
    np.testing.assert_array_equal(got, bs.convert_codes_reference(packed, elem, rows, K))


def test_prepare_mx_operand():
    rng = np.random.default_rng(5)
    fp8 = rng.integers(0, 256, (3, 64), dtype=np.uint8)
    for elem in ("e4m3", "e5m2"):  # bytes used as they are; e5m2 keeps its own mma kind
        codes, kind = bs.prepare_mx_operand(fp8, elem, 3, 64)
        assert kind == elem and np.shares_memory(codes, fp8) and codes.shape == (3, 64)
    e2m1 = rng.integers(0, 16, (3, 64), dtype=np.uint8)
    codes, kind = bs.prepare_mx_operand(pack_codes(e2m1, 4), "float4_e2m1fn", 3, 64)  # an alias
    assert kind == "e4m3"
    np.testing.assert_array_equal(f32_bits(codes.view(ml_dtypes.float8_e4m3fn)),
                                  f32_bits(e2m1.view(ml_dtypes.float4_e2m1fn)))  # fmt: skip
    with pytest.raises(ValueError, match=r"codes hold 96 bytes; a \[3, 128\] e2m1 operand packs into 3 x 64"):
        bs.prepare_mx_operand(pack_codes(e2m1, 4)[:, :32], "e2m1", 3, 128)
    with pytest.raises(ValueError, match="elem_name='int8' is not an MX element format"):
        bs.prepare_mx_operand(fp8, "int8", 3, 64)


# ----------------------------------------------------------------------------- the GEMM
@cuda.jit
def _decode_e8m0(codes, out):
    i = cuda.grid(1)
    if i < codes.size:
        out[i] = mma_sync.e8m0_f32(np.uint32(codes[i]))


def test_e8m0_scale_decode_every_code():
    """The kernel's branch-free e8m0 decode: 2^(c - 127) for every code, 0 the subnormal
    2^-127, 0xFF NaN (ml_dtypes' float8_e8m0fnu values; bits compared)."""
    codes = np.arange(256, dtype=np.uint8)
    out = np.zeros(256, np.float32)
    _decode_e8m0[4, 64](codes, out)
    want = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    assert want[0] == 2.0**-127 and np.isnan(want[255])
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


def mx_operand(rng, rows, K, elem, spread=6):
    """(packed codes as nqdq stores them, e8m0 scales [rows, K/32] around 2^0, float64 values
    from ml_dtypes): random codes of ``elem``, fp8 NaN / inf codes left out."""
    bits, mld = ELEMENTS[elem]
    codes = rng.integers(0, 1 << bits, (rows, K), dtype=np.uint8)
    values = codes.view(mld).astype(np.float64)
    bad = ~np.isfinite(values)
    codes[bad], values[bad] = 0, 0.0
    scales = rng.integers(127 - spread, 127 + spread + 1, (rows, K // 32)).astype(np.uint8)
    return pack_codes(codes, bits), scales, values


def mx_product(a_values, sa, b_values, sb):
    """float64 A @ B^T of values times 2^(e - 127) per 32 of K (e8m0: ml_dtypes' e8m0fnu)."""
    def scaled(v, s):
        return v * np.repeat(s.view(ml_dtypes.float8_e8m0fnu).astype(np.float64), 32, axis=1)

    return scaled(a_values, sa) @ scaled(b_values, sb).T


def run_mx(a, sa, ea, b, sb, eb, M, N, K, **kw):
    """plan.gemm of packed MX operands, each through prepare_mx_operand; (output, mma)."""
    a8, fa = bs.prepare_mx_operand(a, ea, M, K)
    b8, fb = bs.prepare_mx_operand(b, eb, N, K)
    mma = f"{fa}.{fb}"
    return kg.gemm(a8, b8, mma=mma, sa=sa, sb=sb, sa_mode="mx", sb_mode="mx", **kw), (a8, b8, mma)


@MX_KERNELS
@pytest.mark.parametrize("ea,eb,shape", [
    ("e4m3", "e4m3", (16, 16, 64)),
    ("e5m2", "e4m3", (17, 24, 96)),  # K = 96: the last 64-wide tile holds one K step
    ("e4m3", "e5m2", (1, 9, 64)),
    ("e5m2", "e5m2", (3, 7, 128)),
])  # fmt: skip
def test_fp8_mx_gemm_matches_reference(ea, eb, shape, mx_kernel):
    M, N, K = shape
    rng = np.random.default_rng([M, N, K, 3])
    a, sa, _ = mx_operand(rng, M, K, ea)
    b, sb, _ = mx_operand(rng, N, K, eb)
    got, (a8, b8, mma) = run_mx(a, sa, ea, b, sb, eb, M, N, K, mx_kernel=mx_kernel)
    assert mma == f"{ea}.{eb}" and got.dtype == np.float32 and got.shape == (M, N)
    want = ref.gemm(a8, b8, mma=mma, sa=sa, sb=sb, sa_mode="mx", sb_mode="mx")
    assert rel_l2(got, want) < 1e-5


@pytest.mark.parametrize("ea,eb,shape", [("e2m1", "e2m3", (16, 16, 64)), ("e3m2", "e5m2", (5, 12, 64)),
                                         ("e2m1", "e2m1", (1, 8, 96))])  # fmt: skip
def test_fp6_fp4_mx_gemm_matches_float64(ea, eb, shape):
    """Converted codes: the expected product from ml_dtypes' values, not the conversion."""
    M, N, K = shape
    rng = np.random.default_rng([M, N, K, 4])
    a, sa, av = mx_operand(rng, M, K, ea)
    b, sb, bv = mx_operand(rng, N, K, eb)
    got, (_, _, mma) = run_mx(a, sa, ea, b, sb, eb, M, N, K)
    assert mma == "e4m3." + ("e5m2" if eb == "e5m2" else "e4m3")
    assert rel_l2(got, mx_product(av, sa, bv, sb).astype(np.float32)) < 1e-5


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the 2^127 blocks, on purpose
def test_mx_gemm_extreme_scales():
    """Scale codes 0 (2^-127, a float32 subnormal), 254 (2^127) and 0xFF (NaN) among a spread
    around 127; 16 x 16 x 128 (four K steps). A's 254 meets B scales of at least 2^0 (its
    partial * 2^127 is then exact or overflows as the product does: see docs/design/gemm.md,
    "MX block scales on mma.sync")."""
    M, N, K = 16, 16, 128
    rng = np.random.default_rng(254)
    a, sa, av = mx_operand(rng, M, K, "e4m3")
    b, sb, bv = mx_operand(rng, N, K, "e4m3")
    sa[0, :] = 0  # row 0: every block 2^-127 (outputs near 2^-127 times the B scales)
    sa[3, 1] = 0  # one block of row 3 adds almost nothing
    sa[9, 0] = 254  # row 9: a 2^127 block ...
    sb[:, 0] = rng.integers(127, 130, N)  # ... against B scales >= 1 there
    av[9, :32] = 0.0  # ... where one small code makes partials b[n, 0] / 64: finite below 2 (|b| < 128)
    av[9, 0] = 0.015625
    sb[5, 2] = 254  # column 5: a 2^127 block
    sb[7, 3] = 0xFF  # column 7: NaN
    a = pack_codes(av.astype(ml_dtypes.float8_e4m3fn).view(np.uint8), 8)
    got, (a8, b8, mma) = run_mx(a, sa, "e4m3", b, sb, "e4m3", M, N, K)
    want = ref.gemm(a8, b8, mma=mma, sa=sa, sb=sb, sa_mode="mx", sb_mode="mx")
    np.testing.assert_array_equal(want, mx_product(av, sa, bv, sb).astype(np.float32))  # the spec, twice
    assert np.isnan(want[:, 7]).all() and np.isinf(want[:, 5]).any() and np.isinf(want[9]).any()
    assert np.isfinite(want[9, [c for c in range(N) if c not in (5, 7)]]).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    for rows, cols in [(slice(1, None), [c for c in range(N) if c not in (5, 7)]), (slice(0, 1), slice(None)),
                       (slice(None), [5]), (slice(9, 10), slice(None))]:  # fmt: skip
        g, w, f = got[rows][:, cols], want[rows][:, cols], finite[rows][:, cols]
        assert rel_l2(g[f], w[f]) < 1e-5, (rows, cols)


@pytest.mark.parametrize("kw", [dict(bias=True, activation="relu", alpha=0.5),
                                dict(bias=True, activation="gelu", out_dtype="bfloat16")])  # fmt: skip
def test_mx_gemm_epilogue(kw):
    M, N, K = 17, 10, 64
    rng = np.random.default_rng(17)
    a, sa, _ = mx_operand(rng, M, K, "e4m3")
    b, sb, _ = mx_operand(rng, N, K, "e4m3", spread=3)
    kw = dict(kw, bias=rng.standard_normal(N).astype(np.float32) * 1e3)
    got, (a8, b8, mma) = run_mx(a, sa, "e4m3", b, sb, "e4m3", M, N, K, **kw)
    want = ref.gemm(a8, b8, mma=mma, sa=sa, sb=sb, sa_mode="mx", sb_mode="mx", **kw)
    assert got.dtype == want.dtype and got.shape == (M, N)
    if want.dtype == np.float32:
        assert (got == 0).any() and rel_l2(got, want) < 1e-5  # relu clipped some
    else:  # one rounding of a float32 vs a float64 value: at most one bfloat16 ulp apart
        g, w = got.astype(np.float64), want.astype(np.float64)
        assert np.all(np.abs(g - w) <= 2.0**-7 * np.abs(w))


@simulator_only
def test_mx_launch_sequence_equals_gemm():
    """``gemm_sequence`` (nqdq.matmul's hot path) takes mode "mx": uint8 scale codes, [rows,
    K/32] of them; the same bits as ``gemm``."""
    M, N, K = 9, 16, 64
    rng = np.random.default_rng(64)
    a, sa, _ = mx_operand(rng, M, K, "e4m3")
    b, sb, _ = mx_operand(rng, N, K, "e5m2")
    bias = rng.standard_normal(N).astype(np.float32)
    kw = dict(mma="e4m3.e5m2", sa_mode="mx", sb_mode="mx", activation="relu")
    seq = kg.gemm_sequence(M, N, K, bias=True, **kw)
    assert kg.scale_count("mx", M, K) == sa.size and kg.scale_count("mx", N, K, 128) == sb.size
    out = np.empty(seq.nbytes, np.uint8)
    seq.run(0, a, b, sa, sb, None, bias, out)
    want = kg.gemm(a, b, sa=sa, sb=sb, bias=bias, **kw)
    np.testing.assert_array_equal(out.view(np.float32).reshape(M, N), want)


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(sb_mode="row"), ValueError, "sa_mode='mx' and sb_mode='row'.*both operands"),
    (dict(sa_mode="block"), ValueError, "sa_mode='block' and sb_mode='mx'"),
    (dict(K=48), ValueError, "K=48: the MX scale mode needs K a multiple of 32.*to 64"),
    (dict(mma="s8s8"), ValueError, "mma='s8s8': the MX scale mode takes fp8 codes"),
    (dict(sa_dtype=np.float32), TypeError, r"sa \(mode 'mx'\) must hold uint8 e8m0 codes"),
    (dict(sb_rows=3), ValueError, r"sb \(mode 'mx'\) must hold 4 x 2 e8m0 codes"),
    (dict(config=kg.WgmmaConfig(warpgroups=1, n=16)), ValueError, "config: the wgmma kernel has no MX"),
])  # fmt: skip
def test_mx_errors_name_the_argument(kw, exc, msg):
    kw = dict(kw)
    K = kw.pop("K", 64)
    sa = np.full((2, K // 32), 127, kw.pop("sa_dtype", np.uint8))
    sb = np.full((kw.pop("sb_rows", 4), K // 32), 127, np.uint8)
    args = dict(dict(mma="e4m3.e4m3", sa_mode="mx", sb_mode="mx"), **kw)
    with pytest.raises(exc, match=msg):
        kg.gemm(np.zeros((2, K), np.uint8), np.zeros((4, K), np.uint8), sa=sa, sb=sb, **args)


def test_mx_takes_the_mma_sync_tile_on_sm90(monkeypatch):
    """sm_90's wgmma kernel has no MX mode: MX takes GPU_CONFIG there (the plan's named
    choices), the other fp8 modes keep their wgmma tiles."""
    monkeypatch.setattr(kg, "SIMULATOR", False)
    monkeypatch.setattr(kg, "device_cc", lambda: (9, 0))

    def spec(mode):
        return kg.GemmSpec(mma="e4m3.e5m2", sa_mode=mode, sb_mode=mode, out=mma_sync.OUT_BF16,
                           act=mma_sync.ACT_NONE, bias=False, asym=False)  # fmt: skip

    assert kg.default_config(spec(mma_sync.SCALE_MX), (4096, 4096)) is kg.GPU_CONFIG
    assert isinstance(kg.default_config(spec(mma_sync.SCALE_ROW), (4096, 4096)), kg.WgmmaConfig)
    monkeypatch.setattr(kg, "device_cc", lambda: (8, 9))
    assert kg.default_config(spec(mma_sync.SCALE_MX), (64, 64)) is kg.GPU_CONFIG


def test_mx_kernel_by_compute_capability(monkeypatch):
    """The plan (``MX_KERNEL_BY_CC``) gives MX the block-scaled mma on compute capability 12.0
    only (sm_120a; assembled, not run); every GPU that runs today keeps the promotion kernel,
    on the mma.sync tile; the other scale modes are untouched."""
    assert kg.mx_kernel_mode(None) == mma_sync.SCALE_MX  # the simulator
    monkeypatch.setattr(kg, "SIMULATOR", False)
    for cc, want in [((12, 0), mma_sync.SCALE_MX_HW), ((8, 9), mma_sync.SCALE_MX), ((9, 0), mma_sync.SCALE_MX),
                     ((10, 0), mma_sync.SCALE_MX), ((12, 1), mma_sync.SCALE_MX), ((8, 0), mma_sync.SCALE_MX)]:
        monkeypatch.setattr(kg, "device_cc", lambda cc=cc: cc)
        plan = kg.plan_gemm(256, 256, 128, mma="e4m3.e5m2", sa_mode="mx", sb_mode="mx")
        assert plan.spec.sa_mode == plan.spec.sb_mode == want, cc
        assert plan.cfg is kg.GPU_CONFIG and kg.default_config(plan.spec, (256, 256)) is kg.GPU_CONFIG, cc
        row = kg.plan_gemm(256, 256, 128, mma="e4m3.e5m2", sa_mode="row", sb_mode="row", config=kg.GPU_CONFIG)
        assert row.spec.sa_mode == mma_sync.SCALE_ROW, cc
    with pytest.raises(ValueError, match="mx_kernel=2: one of"):
        kg.plan_gemm(16, 16, 64, mma="e4m3.e4m3", sa_mode="mx", sb_mode="mx", mx_kernel=mma_sync.SCALE_BLOCK)


# ----------------------------------------------------------------------------- PTX
_PTX_SCRIPT = r"""
import json, re
import numpy as np
from numba import cuda, typeof
from nqdq.gpu.gemm import blockscaled as bs, plan as kg
from nqdq.gpu.gemm.mma_sync import ACT_GELU, ACT_NONE, OUT_BF16, OUT_F32, SCALE_MX, GemmSpec
from nqdq.tools.ptx_audit import _no_gpu_compile
out = []
for mma, o, act, bias, cc in [("e4m3.e4m3", OUT_F32, ACT_NONE, False, (9, 0)),
                              ("e5m2.e4m3", OUT_BF16, ACT_GELU, True, (8, 9))]:
    spec = GemmSpec(mma=mma, sa_mode=SCALE_MX, sb_mode=SCALE_MX, out=o, act=act, bias=bias, asym=False)
    ptx = kg.compile_ptx(spec, cc)
    cubin, log = kg.assemble(ptx, cc)
    spill = re.search(r"(\d+) bytes spill stores", log)
    out.append(dict(mma=sorted(set(re.findall(r"mma\.sync\.aligned\.m16n8k32\.row\.col\.[a-z0-9.]+", ptx))),
                    ldg_u8=ptx.count("ld.global.u8"), cubin=len(cubin), spill=int(spill.group(1)) if spill else None))
for elem in ("e2m1", "e3m2"):
    with _no_gpu_compile():
        k = bs.make_convert_kernel(elem)
        ptx, _ = cuda.compile_ptx(k.py_func, (typeof(np.zeros(3, np.uint8)),) * 2 + (typeof(1),) * 3, cc=(9, 0))
    cubin, log = kg.assemble(ptx, (9, 0))
    out.append(dict(elem=elem, cubin=len(cubin)))
print(json.dumps(out))
"""


def test_mx_kernels_assemble():
    """The MX GEMM (GPU_CONFIG's 128 x 128 tile) for sm_90 and sm_89 and the conversion
    kernels, compiled by numba-cuda and assembled by nvJitLink without a GPU: the fp8 mma
    kinds of the pair, one scale byte load per fragment row and column (8 + 8), no spills."""
    rows = compile_rows(_PTX_SCRIPT)
    assert rows[0]["mma"] == ["mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"], rows[0]
    assert rows[1]["mma"] == ["mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e4m3.f32"], rows[1]
    for row in rows[:2]:
        assert row["ldg_u8"] == 16 and row["spill"] == 0 and row["cubin"] > 0, row
    assert all(row["cubin"] > 0 for row in rows[2:]), rows


_SM120A_SCRIPT = r"""
import json, re, subprocess, sys, tempfile
from nqdq.gpu.gemm import plan as kg
from nqdq.gpu.gemm.mma_sync import ACT_GELU, ACT_NONE, OUT_BF16, OUT_F32, SCALE_MX_HW, GemmSpec
out = []
for mma, o, act, bias in [("e4m3.e4m3", OUT_F32, ACT_NONE, False), ("e5m2.e4m3", OUT_BF16, ACT_GELU, True)]:
    spec = GemmSpec(mma=mma, sa_mode=SCALE_MX_HW, sb_mode=SCALE_MX_HW, out=o, act=act, bias=bias, asym=False)
    ptx = kg.compile_ptx(spec, (12, 0, "a"))
    cubin, log = kg.assemble(ptx, (12, 0, "a"))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([sys.argv[1], "-c", f.name], capture_output=True, text=True, check=True).stdout
    ins = [(int(a, 16), t) for a, t in re.findall(r"/\*([0-9a-f]{4})\*/\s+([^;]*);", sass)]
    labels = {m.group(1): int(m.group(2), 16) for m in re.finditer(r"^\.L_x_(\d+):\n\s+/\*([0-9a-f]+)\*/", sass, re.M)}
    loops = []  # (first, branch) of every backward branch holding a block-scaled MMA: the K loops
    for a, t in ins:
        m = re.search(r"BRA[^`]*`\(\.L_x_(\d+)\)", t)
        if m and labels[m.group(1)] < a and any(labels[m.group(1)] <= b <= a and "MMA" in u for b, u in ins):
            loops.append((labels[m.group(1)], a))
    lo, hi = min(l for l, _ in loops), max(h for _, h in loops)
    body = [t for a, t in ins if lo <= a <= hi]
    spill = re.findall(r"(\d+) bytes spill (?:stores|loads)", log)
    out.append(dict(mma=mma, target=re.search(r"^\.target\s+(\S+)", ptx, re.M).group(1),
                    ptx_mma=sorted(set(re.findall(r"mma\.sync\.aligned\.[^\s]+", ptx))),
                    sass_mma=sorted(set(re.findall(r"\b[A-Z]MMA[A-Z0-9._]*", sass))),
                    loop_mma=sum("MMA" in t for t in body), loop_ldg=sum("LDG.E.U8" in t for t in body),
                    loop_float=[t for t in body if re.search(r"\bF(FMA|MUL|ADD)\b", t)],
                    regs=int(re.search(r"Used (\d+) registers", log).group(1)), spill=[int(s) for s in spill],
                    lmem=re.findall(r"(\d+) bytes lmem", log)))
print(json.dumps(out))
"""


def test_mx_blockscale_gemm_assembles_for_sm120a():
    """The sm_120a MX GEMM (GPU_CONFIG's 128 x 128 tile; assembled, not run): compiled for
    ``cc=(12, 0, "a")`` and assembled by nvJitLink, it holds only block-scaled MMAs
    (``QMMA.SF.16832.F32.<A>.<B>.E8``), 16 in the K loop (a warp tile of 4 x 4 per K step of
    32) beside 3 scale-byte loads and no float32 FFMA / FMUL / FADD (no promotion); no spills,
    no local memory."""
    nvdisasm = nvdisasm_path()
    if nvdisasm is None:
        pytest.skip("nvdisasm not installed: pip install 'nvidia-cuda-nvdisasm>=13' (the test extra)")
    rows = compile_rows(_SM120A_SCRIPT.replace("sys.argv[1]", repr(nvdisasm)))
    for row, (fa, fb) in zip(rows, [("E4M3", "E4M3"), ("E5M2", "E4M3")]):
        ptx_kind = f"mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.{fa.lower()}." \
                   f"{fb.lower()}.f32.ue8m0"
        assert row["target"] == "sm_120a" and row["ptx_mma"] == [ptx_kind], row
        assert row["sass_mma"] == [f"QMMA.SF.16832.F32.{fa}.{fb}.E8"], row
        assert row["loop_mma"] == 16 and row["loop_ldg"] == 3 and row["loop_float"] == [], row
        assert row["spill"] == [0, 0] and set(row["lmem"]) <= {"0"} and row["regs"] <= 168, row
