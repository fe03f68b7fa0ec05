"""The compiled kernels on a real GPU, at real sizes, with CuPy arrays in and out.

Runs only with NQDQ_TEST_GPU=1 on a machine with a CUDA GPU and CuPy (``pytest -m gpu``;
``scripts/gpu_check.py`` does it in one call). Everything is compared bit for bit with the
NumPy reference on the same data, as in tests/test_kernels.py (tests/helpers/kernels.py, gpu.py).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

from helpers.gpu import gpu_cupy_or_skip  # noqa: E402

cp = gpu_cupy_or_skip()

import nqdq  # noqa: E402
import nqdq.gpu.quantize.plan as kq
from nqdq.gpu.quantize.choices import KernelChoices  # noqa: E402
from nqdq.reference import quantize as ref  # noqa: E402
from nqdq.reference.packing import pack_codes  # noqa: E402
from nqdq.schemes import resolve_scheme  # noqa: E402

from helpers.data import edge_data  # noqa: E402
from helpers.gpu import check_aligned_and_not, check_gpu, check_with_shuffle_twin, edge_input, host  # noqa: E402
from helpers.kernels import POISON, assert_same  # noqa: E402


@pytest.fixture(scope="module")
def act_bf16():
    """A 1024 x 7168 bfloat16 activation with outlier channels and a few specials."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1024, 7168)).astype(np.float32)
    x[:, rng.choice(7168, 16, replace=False)] *= 50.0
    x.reshape(-1)[rng.choice(x.size, 64, replace=False)] = [np.nan, np.inf, -np.inf, 0.0] * 16
    return x.astype(ml_dtypes.bfloat16)


SCHEMES = [
    "fp8_row", "fp8_1x128", "fp8_128x128", "fp8_tensor", "mxfp8", "mxfp8_e5m2", "mxfp6_e2m3",
    "mxfp6_e3m2", "mxfp4", "nvfp4", "int8_row", "int8_column", "int4_group", "int8_centred",
    "int8_asym", "int4_asym",
]


@pytest.mark.parametrize("name", SCHEMES)
def test_bf16_activation(act_bf16, name):
    check_gpu(act_bf16, resolve_scheme(name))


@pytest.mark.parametrize("name", ["fp8_row", "mxfp4", "nvfp4", "int8_centred"])
def test_full_size_4096x7168(name):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((4096, 7168)) * 3).astype(ml_dtypes.bfloat16)
    check_gpu(x, resolve_scheme(name))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("name", ["mxfp8", "int4_group", "fp8_128x128"])
def test_f32_f16_inputs(dtype, name):
    check_gpu(edge_data((256, 1000), seed=3).astype(dtype), resolve_scheme(name))


@pytest.mark.parametrize(
    "name, kw, shape",
    [
        ("e4m3", {"granularity": "row", "axis": 1}, (8, 512, 96)),
        ("int8", {"granularity": "column", "axis": 0}, (64, 8, 96)),
        ("int8", {"granularity": "column"}, (4, 256, 384)),
        ("mxfp8", {"axis": 0}, (256, 8, 16)),
        ("int8_centred", {"axis": 1, "group_size": 64}, (4, 256, 33)),
        ("int4", {"granularity": "row", "axis": 0}, (300, 77)),
        ("fp8_128x128", {}, (3, 300, 200)),
        ("fp8_row", {}, (64, 20000)),  # rows longer than a block stages
        ("int8_centred", {"group_size": 10000}, (4, 20000)),
        ("int4", {"granularity": "group", "group_size": 10001}, (3, 25000)),
    ],
)
def test_nd_axes_and_long_groups(name, kw, shape):
    check_gpu(edge_data(shape, seed=5), resolve_scheme(name, **kw))


@pytest.mark.parametrize("name", ["mxfp4", "nvfp4", "int8_centred", "int4_asym", "fp8_row"])
def test_stochastic(name):
    check_gpu(edge_data((512, 1024), seed=7).astype(ml_dtypes.bfloat16), resolve_scheme(name), seed=2**63 + 11)


def test_api_cupy_in_cupy_out(act_bf16):
    xd = cp.asarray(act_bf16.view(np.uint16))
    q = nqdq.quantize(xd, "mxfp4", dtype="bfloat16")
    assert isinstance(q.codes, cp.ndarray) and q.dtype == "bfloat16"
    qh = nqdq.quantize(act_bf16, "mxfp4")
    assert_same(host(q.codes), qh.codes, "codes")
    assert_same(host(q.scales), qh.scales, "scales")
    y = nqdq.dequantize(q)
    assert isinstance(y, cp.ndarray) and y.dtype == np.float32
    assert_same(host(y), nqdq.dequantize(qh), "dequantized", nan_equal=True)
    yb = nqdq.dequantize(q, dtype="bfloat16")
    assert yb.dtype == np.uint16
    assert_same(host(yb).view(ml_dtypes.bfloat16), nqdq.dequantize(qh, dtype="bfloat16"), "bf16", nan_equal=True)
    yh = nqdq.dequantize(q, dtype="float16")
    assert_same(host(yh), nqdq.dequantize(qh, dtype="float16"), "f16", nan_equal=True)
    # NumPy in, device="cuda": runs the kernels, NumPy out
    qn = nqdq.quantize(act_bf16, "mxfp4", device="cuda")
    assert isinstance(qn.codes, np.ndarray)
    assert_same(qn.codes, qh.codes, "device='cuda' codes")


def test_on_a_cupy_stream():
    x = edge_data((512, 512), seed=9)
    sch = resolve_scheme("nvfp4")
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        xd = cp.asarray(x)
        got = kq.quantize(xd, sch)
        codes = got.codes.get(stream=s)
    s.synchronize()
    assert_same(codes, pack_codes(ref.quantize(x, sch).codes, 4), "codes on a stream")


def test_cuda_array_interface_input():
    from numba import cuda

    x = edge_data((64, 256), seed=11)
    d = cuda.to_device(x)  # a Numba device array: __cuda_array_interface__, not CuPy
    q = nqdq.quantize(d, "fp8_1x128")
    assert_same(host(q.codes), nqdq.quantize(x, "fp8_1x128").codes, "codes")


def test_dlpack_bfloat16():
    torch = pytest.importorskip("torch")  # only to produce a bf16 DLPack tensor; nqdq never imports it
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    t = torch.randn(128, 512, dtype=torch.bfloat16, device="cuda") * 4
    q = nqdq.quantize(t, "mxfp4")
    assert q.dtype == "bfloat16"
    xh = t.float().cpu().numpy()
    qh = nqdq.quantize(xh.astype(ml_dtypes.bfloat16), "mxfp4")
    assert_same(host(q.codes), qh.codes, "codes")
    assert_same(host(q.scales), qh.scales, "scales")


def test_bad_device_inputs():
    x = cp.zeros((64, 64), cp.float32)
    with pytest.raises(ValueError, match="C-contiguous"):
        nqdq.quantize(x[:, ::2], "fp8_row")
    with pytest.raises(TypeError, match="dtype='bfloat16'"):
        nqdq.quantize(x.view(cp.uint16), "fp8_row")
    with pytest.raises(ValueError, match="device='cpu'"):
        nqdq.quantize(x, "fp8_row", device="cpu")


# ----------------------------------------------------------------------------- last-axis fast kernels
FAST = ["fp8_row", "int8_row", "mxfp8", "mxfp6_e3m2", "mxfp4", "nvfp4", "fp8_1x128", "int4_group"]


def _fast_kernels(shape, kind, sch):
    return {k.py_func.__name__ for k, _, _, _ in kq.get_plan(shape, kind, sch).launches} & {"lastaxis_rows", "lastaxis_groups"}


@pytest.fixture(scope="module")
def big_bf16():
    """640 x 8192 bf16: large enough for the deep paths (several 16-byte units per thread,
    kq.DEEP_UNITS / DEEP_ROWS), with outlier channels, and NaN / inf in a few groups."""
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((640, 8192)) * 3).astype(np.float32)
    x[:, rng.choice(8192, 8, replace=False)] *= 100.0
    x.reshape(-1)[rng.choice(x.size, 16, replace=False)] = [np.nan, np.inf, -np.inf, -0.0] * 4
    return x.astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("name", FAST)
def test_lastaxis_deep_paths(big_bf16, name):
    sch = resolve_scheme(name)
    assert _fast_kernels(big_bf16.shape, 1, sch)
    check_gpu(big_bf16, sch)


@pytest.mark.parametrize("name", ["fp8_row", "int8_row", "mxfp8", "mxfp4", "nvfp4", "fp8_1x128"])
def test_lastaxis_shuffle_twin(monkeypatch, act_bf16, name):
    """The same kernels with the warp shuffle replaced by its shared-memory twin (what the
    simulator runs): both must give the reference's bits."""
    check_with_shuffle_twin(monkeypatch, act_bf16[:256], resolve_scheme(name))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("name", ["fp8_row", "mxfp8", "nvfp4", "fp8_1x128"])
def test_lastaxis_inputs_and_unaligned(dtype, name):
    """f32 / f16 / bf16 through the last-axis kernels, from aligned arrays and from a view
    one element into a buffer (not 16-byte aligned: the element-by-element loads)."""
    shape = (96, 1024)
    sch = resolve_scheme(name)
    xh, bits, kind = edge_input(shape, dtype, seed=13)
    assert _fast_kernels(shape, kind, sch)
    check_aligned_and_not(xh, bits, sch, dtype)


def test_wide_load_store_match_twins():
    """ptx.load_u32x4 / store_u32x2 (ld.global.nc.v4.u32 / st.global.v2.u32) move the same
    words as plain indexing (their simulator twins)."""
    from numba import cuda

    from nqdq.gpu.ptx.memory import load_u32x4, store_u32x2

    @cuda.jit
    def copy(src, dst_vec, dst_twin):
        i = cuda.grid(1)
        if 4 * i + 3 < src.size:
            w = load_u32x4(src, i)
            store_u32x2(dst_vec, 2 * i, w[0], w[1])
            store_u32x2(dst_vec, 2 * i + 1, w[2], w[3])
            for k in range(4):
                dst_twin[4 * i + k] = src[4 * i + k]

    src = cp.asarray(np.random.default_rng(3).integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32))
    a, b = cp.zeros_like(src), cp.zeros_like(src)
    copy[16, 64](src, a, b)
    assert_same(host(a), host(src), "vector copy")
    assert_same(host(b), host(src), "twin copy")


# ----------------------------------------------------------------------------- asymmetric, centred, static, tile paths
# lastaxis_asym_rows / lastaxis_stat_groups (asymmetric and centred INT8), static_encode
# (caller-given scales), tile_blocks (128 x 128 tiles): simulator-checked; these run them
# compiled, with the shuffles and their twin, at sizes that take the deep paths.
NEW = {"int8_asym": "lastaxis_asym_rows", "int4_asym": "lastaxis_stat_groups",
       "int8_centred": "lastaxis_stat_groups", "fp8_128x128": "tile_blocks"}


def _kernels(shape, kind, sch, **kw):
    return {k.py_func.__name__ for k, _, _, _ in kq.get_plan(shape, kind, sch, **kw).launches}


@pytest.mark.parametrize("name", sorted(NEW))
def test_new_paths_deep(big_bf16, name):
    sch = resolve_scheme(name)
    assert NEW[name] in _kernels(big_bf16.shape, 1, sch)
    check_gpu(big_bf16, sch)


@pytest.mark.parametrize("name", sorted(NEW))
def test_new_paths_shuffle_twin(monkeypatch, big_bf16, name):
    check_with_shuffle_twin(monkeypatch, big_bf16[:256], resolve_scheme(name))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("name", sorted(NEW))
def test_new_paths_inputs_and_unaligned(dtype, name):
    """As test_lastaxis_inputs_and_unaligned, for the new paths (96 rows: a partial
    128-row tile for fp8_128x128)."""
    shape = (96, 1024)
    sch = resolve_scheme(name)
    xh, bits, kind = edge_input(shape, dtype, seed=17)
    assert NEW[name] in _kernels(shape, kind, sch)
    check_aligned_and_not(xh, bits, sch, dtype)


@pytest.mark.parametrize("name, kw, scale", [("fp8_tensor", {}, 0.05), ("e4m3", {"granularity": "row"}, None),
                                             ("int4", {"granularity": "tensor"}, 0.3)])
def test_static_encode(big_bf16, name, kw, scale):
    sch = resolve_scheme(name, static_scale=True, **kw)
    if scale is None:
        scale = (np.random.default_rng(4).random(sch.scale_shape(big_bf16.shape)) + 0.01).astype(np.float32)
    assert "static_encode" in _kernels(big_bf16.shape, 1, sch, static_scale=True)
    xr = big_bf16.astype(np.float32)
    got = kq.quantize(cp.asarray(big_bf16.view(np.uint16)), sch, dtype="bfloat16", scale=scale, out_fill=POISON)
    want = ref.quantize(xr, sch, scale=scale)
    wcodes = want.codes if sch.code_bits == 8 else pack_codes(want.codes, sch.code_bits)
    assert_same(host(got.codes), wcodes, f"{name} static codes")
    assert_same(host(got.scales), want.scales, f"{name} static scales")


@pytest.mark.parametrize("nan", [False, True])
@pytest.mark.parametrize(
    "name, kw, kernel",
    [
        ("fp8_tensor", {}, "static_encode"),  # dynamic per-tensor: tensor_amax -> finalize -> static_encode
        ("int8", {"granularity": "tensor"}, "static_encode"),
        ("int8_column", {}, "column_encode"),  # per channel: column_amax -> finalize -> column_encode
        ("e4m3", {"granularity": "column"}, "column_encode"),
        ("int4", {"granularity": "column"}, "column_encode"),
    ],
)
def test_two_pass_fast(big_bf16, name, kw, kernel, nan):
    """The two-pass paths (an amax over the whole tensor / every row first) at a size with
    several units per thread and many row chunks, with and without NaN / inf in the input
    (per channel: PerChannel.TWO_PASS, the one-pass designs in tests/test_column_*_gpu.py;
    per tensor: PerTensor.TWO_PASS, the cooperative kernel in tests/test_tensor_resident_gpu.py)."""
    two_pass = KernelChoices(per_channel="two_pass", per_tensor="two_pass")
    x = big_bf16
    if not nan:
        xf = x.astype(np.float32)
        x = np.where(np.isfinite(xf), xf, np.float32(1.0)).astype(ml_dtypes.bfloat16)
    sch = resolve_scheme(name, **kw)
    assert kernel in _kernels(x.shape, 1, sch, choices=two_pass)
    check_gpu(x, sch, choices=two_pass)


# ----------------------------------------------------------------------------- MX e2m1 in bfloat16 pairs
def _pair_operands(n, seed):
    """Random words of two finite, non-zero bfloat16 values over every binade (subnormals
    included) and both signs."""
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 1 << 16, (2, n), dtype=np.uint64).astype(np.uint32)
    h = np.where((h & 0x7F80) == 0x7F80, h & 0x807F | 0x4000, h)  # no inf / NaN
    h = np.where((h & 0x7FFF) == 0, h | 1, h)  # no zeros (min / max of +-0 are not modelled)
    return (h[0] | (h[1] << 16)).astype(np.uint32)


def test_pair_intrinsics_match_twins():
    """ptx's 16-bit pair instructions (mul / add / min / max.bf16x2, abs + mul, abs + min,
    max / min.u16x2, prmt) on the GPU against their NumPy twins, over random words of every binade."""
    from numba import cuda

    from nqdq.gpu.ptx import pairs as P

    @cuda.jit
    def ops(a, b, out):
        i = cuda.grid(1)
        if i < a.size:
            out[0, i] = P.bf16x2_mul(a[i], b[i])
            out[1, i] = P.bf16x2_absmul(a[i], b[i])
            out[2, i] = P.bf16x2_add(a[i], b[i])
            out[3, i] = P.bf16x2_min(a[i], b[i])
            out[4, i] = P.bf16x2_max(a[i], b[i])
            out[5, i] = P.u16x2_max(a[i], b[i])
            out[6, i] = P.prmt(a[i], b[i], np.uint32(0x6420))
            out[7, i] = P.prmt(a[i], b[i], np.uint32(0x7531))
            out[8, i] = P.bf16x2_absmin(a[i], b[i])
            out[9, i] = P.u16x2_min(a[i], b[i])

    a, b = _pair_operands(1 << 16, 1), _pair_operands(1 << 16, 2)
    b[: 1 << 14] = a[: 1 << 14] ^ np.uint32(0x80018001)  # sums that cancel to an ulp or so
    out = cp.zeros((10, a.size), cp.uint32)
    ops[(a.size + 255) // 256, 256](cp.asarray(a), cp.asarray(b), out)
    got = host(out)
    twins = [P.bf16x2_mul_twin(a, b), P.bf16x2_absmul_twin(a, b), P.bf16x2_add_twin(a, b), P.bf16x2_min_twin(a, b),
             P.bf16x2_max_twin(a, b), P.u16x2_max_twin(a, b), P.prmt_twin(a, b, 0x6420), P.prmt_twin(a, b, 0x7531),
             P.bf16x2_absmin_twin(a, b), P.u16x2_min_twin(a, b)]
    for k, name in enumerate(["mul", "absmul", "add", "min", "max", "u16x2_max", "prmt 6420", "prmt 7531", "absmin",
                              "u16x2_min"]):
        assert_same(got[k], twins[k], f"{name} GPU vs twin")


def test_e2m1_pairs_gpu():
    """e2m1_unit_bf16 compiled, for every finite bfloat16 x and 2^-k over the MX range,
    against the reference codec on x * 2^-k (as test_kernels::test_e2m1_pairs_every_bf16
    does for the twins)."""
    from numba import cuda

    from nqdq.formats import get_format
    from nqdq.gpu.quantize import pair_encoders
    from nqdq.reference import codec as rcodec
    from helpers.encoders import E2M1_PAIR_KS, bf16_finite_units

    def make(clamp):
        @cuda.jit
        def enc(w, p2, out):
            i = cuda.grid(1)
            if i < out.size:
                out[i] = pair_encoders.e2m1_unit_bf16((w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]), p2, clamp)

        return enc

    pats, words = bf16_finite_units()
    x = (pats << 16).view(np.float32)
    wd = cp.asarray(words.reshape(-1))
    out = cp.zeros(words.shape[0], cp.uint32)
    for clamp in (False, True):
        enc = make(clamp)
        for k in E2M1_PAIR_KS:
            p = np.float32(2.0**-k)
            with np.errstate(over="ignore"):
                y = x * p
            hb = np.uint32(p.view(np.uint32) >> 16)
            enc[(out.size + 255) // 256, 256](wd, np.uint32(hb | (hb << 16)), out)
            got = host(out)
            codes = np.stack([(got >> np.uint32(4 * j)) & np.uint32(15) for j in range(8)], axis=1).reshape(-1)
            want = rcodec.encode_float(y, get_format("e2m1")).astype(np.uint32)
            ok = np.ones(y.shape, bool) if clamp else np.abs(y) < 7
            bad = ok & (codes != want)
            assert not bad.any(), f"k={k} clamp={clamp}: {int(bad.sum())} differ, first x={x[bad][0]!r}"


@pytest.mark.parametrize("rounding", ["rceil", "floor", "even"])
def test_mxfp4_bf16_pairs_full_size(rounding):
    """MXFP4 of bfloat16 at 1024 x 7168 (deep chunks) through the pair encoder, with edge
    values, subnormal-only and near-max groups, bit for bit."""
    x = edge_data((1024, 7168), seed=21)
    x[7, :32] = np.float32(2.0**-133) * np.arange(32)
    x[8, :32] = np.float32(3.3e38) * np.linspace(-1, 1, 32, dtype=np.float32)
    xb = x.astype(ml_dtypes.bfloat16)
    check_gpu(xb, resolve_scheme("mxfp4", scale_rounding=rounding))


def test_e2m1_nvfp4_pairs_gpu():
    """e2m1_unit_nvfp4 compiled (float32 products rounded to odd into bfloat16, then the pair
    encoder), every finite bfloat16 x times NVFP4-like multipliers, against the reference
    codec on fp32(x * m_b)."""
    from numba import cuda

    from nqdq.formats import get_format
    from nqdq.gpu.quantize import pair_encoders
    from nqdq.reference import codec as rcodec
    from helpers.encoders import NVFP4_PAIR_MBS, bf16_finite_units

    @cuda.jit
    def enc(w, mb, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = pair_encoders.e2m1_unit_nvfp4((w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]), mb)

    pats, words = bf16_finite_units()
    x = (pats << 16).view(np.float32)
    wd = cp.asarray(words.reshape(-1))
    out = cp.zeros(words.shape[0], cp.uint32)
    for mb in NVFP4_PAIR_MBS:
        mb = np.float32(mb)
        with np.errstate(over="ignore", under="ignore"):
            y = x * mb
        enc[(out.size + 255) // 256, 256](wd, mb, out)
        got = host(out)
        codes = np.stack([(got >> np.uint32(4 * j)) & np.uint32(15) for j in range(8)], axis=1).reshape(-1)
        want = rcodec.encode_float(y, get_format("e2m1")).astype(np.uint32)
        bad = codes != want
        assert not bad.any(), f"m_b={mb!r}: {int(bad.sum())} differ, first x={x[bad][0]!r}"


def test_nvfp4_bf16_pairs_full_size():
    """NVFP4 of bfloat16 at 1024 x 7168 through the pair encoder (edge values, blocks whose
    e4m3 scale is subnormal), bit for bit."""
    x = edge_data((1024, 7168), seed=22, scale=40.0)
    x[7, :16] = np.float32(1e-3) * np.arange(16)
    check_gpu(x.astype(ml_dtypes.bfloat16), resolve_scheme("nvfp4"))


@pytest.mark.parametrize("name", ["mxfp8", "fp8_1x128"])
def test_interleaved_chunks_gpu(monkeypatch, name):
    """fp8 groups with CHEAP_UNITS = 2 (two units per lane, interleaved over the group's
    lanes) at a size that takes the deep chunks, bit for bit."""
    monkeypatch.setattr(kq, "CHEAP_UNITS", 2)
    kq._PLANS.clear()
    try:
        check_gpu(edge_data((1024, 7168), seed=23).astype(ml_dtypes.bfloat16), resolve_scheme(name))
    finally:
        kq._PLANS.clear()
