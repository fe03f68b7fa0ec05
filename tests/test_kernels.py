"""The kernels against the reference, bit for bit: codes, scales, zero points, tensor scale
and means compared as integer views (atol=0, rtol=0), dequantized values too.

In CI this runs in Numba's CUDA simulator (conftest sets NUMBA_ENABLE_CUDASIM=1), so the
cases are small; with NQDQ_TEST_GPU=1 the same file runs the compiled kernels on a GPU
(NumPy inputs are copied there and back). Every output is poisoned (every byte 0xA5) before
a kernel runs, so an element a kernel forgets to write fails.

Two documented exceptions to "integer views": NaN *payloads* in float32 outputs that are
computed, not chosen (centred means of a group holding NaN, dequantized NaNs) follow the
host FPU in the reference (x86 keeps the first NaN operand, the GPU returns its canonical
NaN); those compare as "both NaN". Every NaN a scale holds is the canonical 0x7FC00000 on
both sides and is compared bit for bit.
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest
from numba import cuda

import nqdq
import nqdq.gpu.quantize.plan as kq
from nqdq.gpu.quantize.choices import KernelChoices, PerChannel, PerTensor
from nqdq.gpu.device import codec as _codec
from nqdq.gpu.quantize import general
from nqdq.reference import codec as rcodec
from nqdq.reference import quantize as ref
from nqdq.reference.rng import random_bits
from nqdq.schemes import resolve_scheme, schemes

from helpers.data import edge_data
from helpers.encoders import E2M1_PAIR_KS, NVFP4_PAIR_MBS, bf16_finite_units
from helpers.kernels import assert_same, check, launched
from helpers.ptx import compile_rows

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN/inf arithmetic in the simulator


# ----------------------------------------------------------------------------- helpers
def wide_data(shape, seed=1):
    """Values spread over 16 decades: sums where the addition order shows in the last bit."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 10.0 ** rng.integers(-8, 8, shape)).astype(np.float32)


# ----------------------------------------------------------------------------- every scheme
@pytest.mark.parametrize("name", schemes())
def test_every_scheme_random(name):
    rng = np.random.default_rng(114)
    check(rng.standard_normal((3, 70)).astype(np.float32), resolve_scheme(name))


@pytest.mark.parametrize("name", schemes())
def test_every_scheme_edge_values(name):
    check(edge_data((5, 64), seed=zlib.crc32(name.encode())), resolve_scheme(name))


@pytest.mark.parametrize("name", ["mxfp8", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4"])
@pytest.mark.parametrize("rounding", ["floor", "rceil", "even"])
def test_mx_scale_roundings(name, rounding):
    rng = np.random.default_rng(125)
    x = edge_data((4, 96), scale=10.0 ** rng.integers(-3, 4))
    x[0, :32] = 2.0 ** rng.integers(-140, 127, 32)  # powers of two: floor/rceil/even boundaries
    x[1, 32:64] *= 1e-38  # subnormal amax
    x[2, 64] = np.float32(3.4028235e38)  # "even" rounds this amax up to 2^128
    x[3, 0] = np.float32(-3.3e38)
    check(x, resolve_scheme(name, scale_rounding=rounding))


@pytest.mark.parametrize("name", ["int8_asym", "int4_asym"])
def test_asymmetric_range_wider_than_flt_max(name):
    rng = np.random.default_rng(135)
    x = rng.standard_normal((3, 128)).astype(np.float32)
    x[0, 3], x[0, 7] = 3.4e38, -3.4e38  # hi - lo overflows: the scale is formed from halves
    x[1, 5], x[1, 9] = 2.0e38, -1.5e38
    x[2, 0] = -3.4e38
    check(x, resolve_scheme(name))


@pytest.mark.parametrize(
    "name, kw",
    [
        ("fp8_row", {}),
        ("e5m2", {"granularity": "tensor"}),
        ("mxfp4", {}),
        ("mxfp6_e3m2", {}),
        ("nvfp4", {}),
        ("int8_row", {}),
        ("int4_group", {"group_size": 32}),
        ("int8_centred", {"group_size": 32}),
        ("int4_asym", {"group_size": 32}),
        ("int8", {"granularity": "column", "symmetric": False}),
    ],
)
@pytest.mark.parametrize("seed", [7, 2**40 + 12345])
def test_stochastic_rounding(name, kw, seed):
    check(edge_data((3, 70), seed=seed % 97), resolve_scheme(name, **kw), seed=seed)


def test_stochastic_rounding_is_independent_of_launch_shape():
    rng = np.random.default_rng(163)
    x = rng.standard_normal((5, 96)).astype(np.float32)
    sch = resolve_scheme("mxfp4")
    a = kq.quantize(x, sch, seed=3, threads=32)
    b = kq.quantize(x, sch, seed=3, threads=128)
    assert_same(a.codes, b.codes, "codes under two block sizes")


# ----------------------------------------------------------------------------- static scales
@pytest.mark.parametrize(
    "name, kw, scale",
    [
        ("fp8_tensor", {}, 0.05),
        ("e4m3", {"granularity": "row"}, np.array([[0.01], [0.1], [1.0]], np.float32)),
        ("int8", {"granularity": "group", "group_size": 16}, None),
        ("int4", {"granularity": "block", "block_shape": (2, 16)}, None),
        ("e2m1", {"granularity": "column"}, None),
    ],
)
def test_static_scales(name, kw, scale):
    rng = np.random.default_rng(182)
    x = edge_data((3, 70))
    sch = resolve_scheme(name, static_scale=True, **kw)
    if scale is None:
        scale = (rng.random(sch.scale_shape(x.shape)) + 0.01).astype(np.float32)
    check(x, sch, scale=scale)


# ----------------------------------------------------------------------------- shapes and axes
@pytest.mark.parametrize(
    "name, kw, shape",
    [
        ("e4m3", {"granularity": "row", "axis": 1}, (2, 3, 40)),
        ("e4m3", {"granularity": "row", "axis": 0}, (3, 2, 5)),
        ("int4", {"granularity": "row", "axis": 0}, (5, 7)),
        ("int8", {"granularity": "group", "axis": 0, "group_size": 2}, (5, 3, 8)),
        ("int8", {"granularity": "column", "axis": 1}, (2, 3, 40)),
        ("int8", {"granularity": "column", "axis": 0}, (6, 20)),
        ("int4", {"granularity": "column", "axis": 0}, (2, 4, 5)),
        ("int4", {"granularity": "column"}, (2, 3, 9)),
        ("mxfp8", {"axis": 1}, (2, 40, 3)),
        ("mxfp4", {}, (2, 3, 40)),
        ("fp8_128x128", {"block_shape": (4, 16)}, (2, 9, 40)),
        ("int8", {"granularity": "block", "block_shape": (3, 5), "symmetric": False}, (7, 11)),
        ("e2m1", {"granularity": "block", "block_shape": (3, 5)}, (7, 11)),
        ("int8_centred", {"axis": 0, "group_size": 4}, (9, 3, 2)),
        ("int8_centred", {"group_size": 24}, (4, 50)),
        ("int8_centred", {"group_size": 200}, (3, 70)),
        ("e2m1", {"granularity": "tensor"}, (3, 33)),
        ("e2m3", {"granularity": "group", "group_size": 6}, (3, 38)),
        ("e3m2", {"granularity": "group", "group_size": 3}, (2, 29)),
        ("int4", {"granularity": "group", "group_size": 3}, (2, 31)),
        ("int4", {"granularity": "group", "group_size": 5, "symmetric": False}, (3, 21)),
        ("fp8_1x128", {}, (130, 33)),
        ("int8_asym", {}, (1, 1)),
        ("nvfp4", {}, (1, 17)),
        ("fp8_row", {}, (40,)),
    ],
)
def test_shapes_and_axes(name, kw, shape):
    check(edge_data(shape), resolve_scheme(name, **kw))


@pytest.mark.parametrize("group_size", [1, 5, 24, 64, 100])
def test_centred_halving_sum_order(group_size):
    # values over 16 decades: any other summation order changes the last bits of the means
    check(wide_data((3, 100)), resolve_scheme("int8_centred", group_size=group_size))


@pytest.mark.parametrize("axis", [-1, 0])
def test_centred_mean_of_huge_finite_groups(axis):
    # partial sums of values near FLT_MAX would overflow without the 2^-k leaf scaling
    x = np.full((3, 40), 3e38, np.float32)
    x[1, ::3] = -2e38
    check(x, resolve_scheme("int8_centred", group_size=16, axis=axis))


@pytest.mark.parametrize("threads", [32, 128])
@pytest.mark.parametrize("name", ["mxfp4", "int8_centred", "nvfp4", "int4_asym"])
def test_block_size_does_not_change_results(name, threads):
    check(wide_data((4, 150)), resolve_scheme(name), threads=threads)


@pytest.mark.parametrize(
    "name, kw, shape",
    [
        ("fp8_row", {}, (3, 70)),
        ("int8_centred", {"group_size": 64}, (2, 200)),
        ("int4_group", {}, (2, 300)),
        ("int4_asym", {}, (2, 300)),
        ("int4", {"granularity": "group", "group_size": 37}, (2, 100)),
        ("mxfp4", {}, (3, 64)),
    ],
)
def test_long_groups_and_unaligned_fallbacks(monkeypatch, name, kw, shape):
    # with a tiny staging buffer the group kernel re-reads groups from memory (the path for
    # groups over 8192 elements), and groups whose packed bytes would straddle two blocks
    # go through strided_params + encode
    monkeypatch.setattr(general, "SEG_MAX", 32)
    check(edge_data(shape), resolve_scheme(name, **kw))


@pytest.mark.parametrize("name", ["fp8_row", "mxfp4", "int4_group", "nvfp4", "int8_column", "fp8_tensor"])
def test_empty_input(name):
    sch = resolve_scheme(name)
    x = np.zeros((0, 32), np.float32)
    got = kq.quantize(x, sch)
    want = ref.quantize(x, sch)
    assert_same(got.scales, want.scales, "scales")
    assert np.asarray(got.codes).shape[0] == 0


# ----------------------------------------------------------------------------- input dtypes
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("name", ["fp8_row", "mxfp4", "int8_centred"])
def test_half_inputs(dtype, name):
    x = edge_data((3, 64), scale=2.0).astype(dtype)
    if dtype == np.float16:
        x.reshape(-1)[:6] = np.array([6e-8, -6e-8, 1e-5, 65504, -65504, 3e-5], np.float16)  # subnormals, max
    check(x, resolve_scheme(name), x_ref=x.astype(np.float32))


def test_big_endian_and_bad_dtypes():
    x = edge_data((2, 64))
    sch = resolve_scheme("fp8_row")
    assert_same(kq.quantize(x.astype(">f4"), sch).codes, ref.quantize(x, sch).codes, "big-endian codes")
    with pytest.raises(TypeError, match="float64"):
        kq.quantize(x.astype(np.float64), sch)
    with pytest.raises(TypeError, match="int32"):
        kq.quantize(x.astype(np.int32), sch)


def test_uint16_bits_with_dtype():
    x = edge_data((2, 64)).astype(ml_dtypes.bfloat16)
    sch = resolve_scheme("mxfp8")
    a = kq.quantize(x.view(np.uint16), sch, dtype="bfloat16")
    b = ref.quantize(x.astype(np.float32), sch)
    assert_same(a.scales, b.scales, "scales")
    with pytest.raises(TypeError, match="dtype='bfloat16'"):
        kq.quantize(x.view(np.uint16), sch)


# ----------------------------------------------------------------------------- device functions
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "int8", "int4"])
def test_encode_at_every_code_point(fmt):
    """Every representable value, the midpoints between neighbours (ties), one float32 ulp
    either side of them, and values past the maximum: static scale 1 isolates the codec."""
    sch = resolve_scheme(fmt, granularity="tensor", static_scale=True)
    if sch.element.kind == "float":
        vals = rcodec.float_code_table(sch.element).astype(np.float64)
    else:
        vals = np.arange(-9, 10, dtype=np.float64)
    vals = np.unique(vals[np.isfinite(vals)])
    mids = (vals[1:] + vals[:-1]) / 2
    pts = np.concatenate([vals, mids, vals * 1.0000001, -mids, [vals.max() * 2, 1e30, 1e-45]]).astype(np.float32)
    ulp = np.concatenate([np.nextafter(pts, np.float32(np.inf)), np.nextafter(pts, np.float32(-np.inf))])
    x = np.concatenate([pts, ulp, [np.nan, -np.nan, np.inf, -np.inf]]).astype(np.float32)
    check(x.reshape(1, -1), sch, scale=1.0)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m3", "e3m2", "e2m1"])
def test_encode_random_float32_bit_patterns(fmt):
    """Random float32 bit patterns (every exponent: huge, tiny, subnormal, NaN payloads)
    through the codec, scale 1."""
    u = np.random.default_rng(zlib.crc32(fmt.encode())).integers(0, 2**32, 2000, dtype=np.uint64)
    x = u.astype(np.uint32).view(np.float32).reshape(1, -1)
    check(x, resolve_scheme(fmt, granularity="tensor", static_scale=True), scale=1.0)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_cvt_matches_twin(fmt):
    """The inline-PTX ``cvt.rn.satfinite.e{4m3,5m2}x2.f32`` path of the element encoder
    against its bit-manipulation twin and the reference, over every bfloat16 value (as
    float32) and random float32 bit patterns (NaN payloads of both signs, subnormals, huge).
    Needs the compiled kernels on an sm_89+ GPU (NQDQ_TEST_GPU=1); skipped in the simulator."""
    from nqdq.gpu.ptx import convert
    from nqdq.gpu.device.elements import encode_element, format_tuple
    from nqdq.gpu.device.scales import MODE_FLOAT

    if not convert.fp8_cvt_available():
        pytest.skip("no sm_89+ GPU (simulator or older GPU): the twin is the only path")
    sch = resolve_scheme(fmt, granularity="tensor", static_scale=True)
    FMT = format_tuple(sch)
    assert convert.fp8_cvt_supports(FMT)
    ONE, ZERO = np.float32(1.0), np.float32(0.0)

    @cuda.jit
    def both(x, out_cvt, out_twin):
        i = cuda.grid(1)
        if i < x.size:
            out_cvt[i] = encode_element(x[i], ONE, ZERO, 0, MODE_FLOAT, FMT, False, 0, True)
            out_twin[i] = _codec.encode_float_rne(x[i], FMT[1], FMT[2], FMT[3], FMT[4], FMT[5])

    bf = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32)
    rnd = np.random.default_rng(zlib.crc32(b"cvt" + fmt.encode())).integers(0, 2**32, 1 << 20, dtype=np.uint64)
    x = np.concatenate([bf, rnd.astype(np.uint32).view(np.float32)])
    out_cvt = np.zeros(x.size, np.uint8)
    out_twin = np.zeros(x.size, np.uint8)
    both[(x.size + 255) // 256, 256](x, out_cvt, out_twin)
    want = rcodec.encode_float(x, sch.element).astype(np.uint8)
    assert_same(out_twin, want, f"{fmt} twin vs reference")
    assert_same(out_cvt, want, f"{fmt} cvt vs reference")


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_cvt_pair_matches_twin(fmt):
    """The paired ``cvt.rn.satfinite.e{4m3,5m2}x2.f32`` of the last-axis kernels (two codes
    per instruction, used for groups without NaN) against the bit-manipulation twin on both
    halves, over every non-NaN bfloat16 value and random non-NaN float32 bit patterns.
    Needs an sm_89+ GPU (NQDQ_TEST_GPU=1); skipped in the simulator."""
    from nqdq.gpu.ptx import convert
    from nqdq.gpu.device.elements import format_tuple

    if not convert.fp8_cvt_available():
        pytest.skip("no sm_89+ GPU (simulator or older GPU): the twin is the only path")
    sch = resolve_scheme(fmt, granularity="tensor", static_scale=True)
    FMT = format_tuple(sch)
    pair = convert.cvt_e4m3x2 if fmt == "e4m3" else convert.cvt_e5m2x2

    @cuda.jit
    def both(x, out_pair, out_twin):
        i = cuda.grid(1)
        if 2 * i + 1 < x.size:
            out_pair[i] = pair(x[2 * i + 1], x[2 * i])
            lo = _codec.encode_float_rne(x[2 * i], FMT[1], FMT[2], FMT[3], FMT[4], FMT[5])
            hi = _codec.encode_float_rne(x[2 * i + 1], FMT[1], FMT[2], FMT[3], FMT[4], FMT[5])
            out_twin[i] = lo | (hi << 8)

    bf = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32)
    rnd = np.random.default_rng(zlib.crc32(b"pair" + fmt.encode())).integers(0, 2**32, 1 << 20, dtype=np.uint64)
    x = np.concatenate([bf, rnd.astype(np.uint32).view(np.float32)])
    x = x[~np.isnan(x)]
    x = np.concatenate([x, np.roll(x, 12345)])[: (x.size // 2) * 2]  # every value in both halves
    out_pair = np.zeros(x.size // 2, np.uint16)
    out_twin = np.zeros(x.size // 2, np.uint16)
    both[(x.size // 2 + 255) // 256, 256](x, out_pair, out_twin)
    want = rcodec.encode_float(x, sch.element).astype(np.uint16)
    assert_same(out_twin, want[0::2] | (want[1::2] << 8), f"{fmt} twin pairs vs reference")
    assert_same(out_pair, out_twin, f"{fmt} cvt pair vs twin")


def test_half_to_float_bits():
    """float16 / bfloat16 -> float32 by bit manipulation, against NumPy / ml_dtypes casts."""
    rng = np.random.default_rng(403)
    @cuda.jit
    def widen(x, kind, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = _codec.load_f32(x, i, kind)

    h = np.concatenate([np.arange(0, 2048), np.arange(0x7BF0, 0x7C10), rng.integers(0, 65536, 512)]).astype(np.uint16)
    h = np.concatenate([h, h | 0x8000])
    for kind, dt in ((_codec.KIND_F16, np.float16), (_codec.KIND_BF16, ml_dtypes.bfloat16)):
        out = np.empty(h.size, np.float32)
        widen[(h.size + 127) // 128, 128](h, kind, out)
        assert_same(out, h.view(dt).astype(np.float32), f"{dt.__name__} widening", nan_equal=True)


def test_philox_matches_reference():
    @cuda.jit
    def bits(idx, key_lo, key_hi, out):
        i = cuda.grid(1)
        if i < idx.size:
            out[i] = _codec.philox4x32_10(idx[i] >> 2, 0, key_lo, key_hi)[idx[i] & 3]

    seed = 0x1234_5678_9ABC_DEF0
    idx = np.arange(64, dtype=np.int64)
    out = np.empty(64, np.uint32)
    bits[1, 64](idx, seed & 0xFFFFFFFF, seed >> 32, out)
    assert_same(out, random_bits(seed, 64), "philox words")


# ----------------------------------------------------------------------------- the public API
@pytest.mark.parametrize("name", ["mxfp4", "int8_centred", "fp8_tensor", "int4_asym"])
def test_api_device_cuda_matches_cpu(name):
    x = edge_data((4, 64))
    a = nqdq.quantize(x, name, device="cuda")
    b = nqdq.quantize(x, name)
    for k in ("codes", "scales", "zero_points", "tensor_scale"):
        assert_same(getattr(a, k), getattr(b, k), k)
    assert_same(a.means, b.means, "means", nan_equal=True)
    assert a.shape == b.shape and a.dtype == b.dtype and a.scheme == b.scheme
    assert_same(nqdq.dequantize(a, device="cuda"), nqdq.dequantize(b), "dequantized", nan_equal=True)


def test_api_device_options():
    x = edge_data((3, 64)).astype(ml_dtypes.bfloat16)
    a = nqdq.quantize(x.view(np.uint16), "e4m3", granularity="tensor", dtype="bfloat16", device="cuda",
                      rounding="stochastic", seed=5)
    b = nqdq.quantize(x, "e4m3", granularity="tensor", rounding="stochastic", seed=5)
    assert a.dtype == "bfloat16"
    assert_same(a.codes, b.codes, "codes")
    with pytest.raises(ValueError, match="nonfinite='raise'"):
        nqdq.quantize(x, "mxfp4", device="cuda", nonfinite="raise")
    y = nqdq.dequantize(b, dtype="bfloat16", device="cuda")
    assert_same(y, nqdq.dequantize(b, dtype="bfloat16"), "bf16 dequantized", nan_equal=True)


# ----------------------------------------------------------------------------- last-axis fast kernels
# nqdq/gpu/quantize/lastaxis.py: C-contiguous input, groups along the last axis (whole
# rows, or 1xG groups of 2^k 16-byte units), float / MX / NVFP4 scales, RNE. The cases below
# check that the plan picks them (and falls back where it must), and bit-exactness through
# them for every input kind, rows shorter than a block, several units per thread, partial
# blocks, NaN / inf groups (edge_data), and the unaligned-input loads.
FAST_SCHEMES = ["fp8_row", "int8_row", "mxfp8", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp4", "nvfp4", "fp8_1x128", "int4_group"]


@pytest.mark.parametrize(
    "name, kw, shape, dtype, kernel",
    [
        ("fp8_row", {}, (3, 72), ml_dtypes.bfloat16, "lastaxis_rows"),
        ("int8_row", {}, (2, 1000), np.float16, "lastaxis_rows"),
        ("fp8_row", {}, (2, 20), np.float32, "lastaxis_rows"),
        ("mxfp4", {}, (3, 64), np.float32, "lastaxis_groups"),
        ("nvfp4", {}, (3, 64), ml_dtypes.bfloat16, "lastaxis_groups"),
        ("fp8_1x128", {}, (2, 384), np.float16, "lastaxis_groups"),
        ("fp8_row", {}, (3, 70), ml_dtypes.bfloat16, None),  # rows not whole 16-byte units
        ("mxfp8", {}, (3, 80), ml_dtypes.bfloat16, None),  # partial last group
        ("int4", {"granularity": "group", "group_size": 24}, (2, 48), np.float32, None),  # 6 units
        ("int4_asym", {}, (2, 256), np.float32, "lastaxis_stat_groups"),  # zero points
        ("int8_asym", {}, (2, 1000), np.float16, "lastaxis_asym_rows"),  # 125 units: not 2^k
        ("int8_asym", {}, (3, 40), np.float32, "lastaxis_asym_rows"),  # 10 units: a row < a block
        ("int8_asym", {}, (3, 64), ml_dtypes.bfloat16, "lastaxis_stat_groups"),  # 8 units: one group
        ("int4_asym", {}, (3, 70), ml_dtypes.bfloat16, None),  # rows not whole units
        ("int4_asym", {}, (2, 320), np.float32, None),  # partial last group
        ("int8_centred", {}, (2, 256), np.float32, "lastaxis_stat_groups"),
        ("int8_centred", {}, (2, 256), ml_dtypes.bfloat16, "lastaxis_stat_groups"),
        ("int8_centred", {}, (2, 64), np.float32, None),  # row shorter than the group (P = 128)
        ("int8_centred", {"group_size": 48}, (2, 96), np.float32, None),  # 12 units: not 2^k
        ("int8_centred", {"axis": 0}, (128, 8), np.float32, None),  # another axis
    ],
)
def test_lastaxis_kernel_choice(name, kw, shape, dtype, kernel):
    """``kernel``: the last-axis kernel the plan must launch, None: only general kernels."""
    fast = {"lastaxis_rows", "lastaxis_groups", "lastaxis_asym_rows", "lastaxis_stat_groups"}
    names = launched(shape, dtype, resolve_scheme(name, **kw))
    assert (fast & set(names)) == ({kernel} if kernel else set()), names
    # stochastic rounding: the same kernel's stoch variant (tests/test_stochastic_lastaxis.py)
    names = launched(shape, dtype, resolve_scheme(name, **kw), stoch=True)
    assert (fast & set(names)) == ({kernel} if kernel else set()), names


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("name", FAST_SCHEMES)
def test_lastaxis_kernels_exact(name, dtype):
    shape = (3, 128) if name != "fp8_1x128" else (2, 256)
    x = edge_data(shape, seed=zlib.crc32(name.encode()) % 1000).astype(dtype)
    assert {"lastaxis_rows", "lastaxis_groups"} & set(launched(shape, dtype, resolve_scheme(name)))
    check(x, resolve_scheme(name), x_ref=x.astype(np.float32))


@pytest.fixture
def deep_units(monkeypatch):
    """Force several units per thread (the paths large inputs take) on small inputs."""
    monkeypatch.setattr(kq, "DEEP_UNITS", 0)
    monkeypatch.setattr(kq, "DEEP_ROWS", 0)
    kq._PLANS.clear()
    yield
    kq._PLANS.clear()


@pytest.mark.parametrize(
    "name, shape, dtype",
    [
        ("int8_row", (2, 1000), np.float16),  # 125 units per row: 32 threads x 4 units
        ("fp8_row", (3, 320), ml_dtypes.bfloat16),  # 40 units: 32 threads x 2, a partial second
        ("mxfp4", (5, 96), ml_dtypes.bfloat16),  # 60 units, one partial block of 4 x 64
        ("nvfp4", (3, 160), np.float32),  # NVFP4's tensor amax pass too
        ("fp8_1x128", (3, 256), np.float32),
    ],
)
def test_lastaxis_several_units_per_thread(deep_units, name, shape, dtype):
    x = edge_data(shape, seed=len(name)).astype(dtype)
    check(x, resolve_scheme(name), x_ref=x.astype(np.float32))


@pytest.mark.parametrize(
    "name, shape, dtype",
    [
        ("fp8_row", (6, 320), ml_dtypes.bfloat16),  # 40 units: 32 threads x 2, a partial second
        ("fp8_row", (6, 1000), np.float16),  # 125 units: 32 threads x 4, a partial fourth
        ("int8_row", (6, 256), np.float32),  # 64 units: 32 threads x 2, no partial unit
    ],
)
def test_row_kernel_whole_rows(deep_units, monkeypatch, name, shape, dtype):
    """The row kernel's straight-line rows (``whole``: a finite row whose scale has a
    reciprocal encodes every unit without a check but the last unit's), which a GPU takes
    where the encode is the fp8 cvt (kq._cheap): forced here, so the simulator runs them.
    Rows: finite, all zeros, tiny (its scale has no reciprocal in recip_guarded's range:
    the per-unit path), with an inf, with a NaN."""
    monkeypatch.setattr(kq, "_cheap", lambda fmt: True)
    kq._PLANS.clear()
    x = (np.random.default_rng(7).standard_normal(shape) * 3).astype(np.float32)
    x[1] = 0
    if dtype != np.float16:  # (a float16 row cannot be that small)
        x[2] *= np.float32(2.0**-120)
    x[3, 5] = np.inf
    x[4, 7] = np.nan
    x = x.astype(dtype)
    assert "lastaxis_rows" in launched(shape, dtype, resolve_scheme(name))
    check(x, resolve_scheme(name), x_ref=x.astype(np.float32))


@pytest.mark.parametrize("name, dtype", [("fp8_row", ml_dtypes.bfloat16), ("mxfp4", np.float16), ("nvfp4", np.float32),
                                         ("int4_asym", ml_dtypes.bfloat16), ("int8_centred", np.float16)])
def test_lastaxis_unaligned_input(unaligned_loads, name, dtype):
    x = edge_data((2, 64), seed=4).astype(dtype)
    check(x, resolve_scheme(name), x_ref=x.astype(np.float32))


def _boundary_values():
    """Every e2m1 / int rounding boundary and tie, their float32 neighbours, signed zeros,
    subnormals, infinities, huge values, and random values at several magnitudes (no NaN:
    the finite-group encoders are only called where none can arise)."""
    base = [k / 8 for k in range(0, 72)] + [7.0, 7.5, 8.0, 12.0, 126.5, 127.0, 127.5, 128.0, 1000.0, 2.0**22,
                                             3.4e38, 1e-40, 1e-45, 2.0**-126, np.inf]
    base += [k + 0.5 for k in range(-10, 10)]
    b = np.array(base, np.float32)
    near = np.concatenate([np.nextafter(b, np.float32(np.inf)), np.nextafter(b, np.float32(0))])
    rnd = np.random.default_rng(5).standard_normal(400).astype(np.float32) * np.float32(4.0) ** np.arange(-4, 4).repeat(50)
    v = np.concatenate([b, near, rnd.astype(np.float32)])
    return np.concatenate([v, -v]).astype(np.float32)


def test_finite_group_encoders():
    """The last-axis kernels' encoders for finite groups (e2m1 by float rounding onto the
    grid, integers by the 1.5 * 2^23 trick) against the reference codec, value by value."""
    from nqdq.formats import get_format
    from nqdq.gpu.quantize import encoders

    x = _boundary_values()

    @cuda.jit
    def enc(x, o4, o8, oi4):
        for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
            o4[i] = encoders.e2m1_code_nonnan(x[i])
            o8[i] = encoders.int_code_finite(x[i], -127, 127) & 0xFF
            oi4[i] = encoders.int_code_finite(x[i], -7, 7) & 0xFF

    o4, o8, oi4 = (np.zeros(x.size, np.uint8) for _ in range(3))
    enc[4, 64](x, o4, o8, oi4)
    assert_same(o4, rcodec.encode_float(x, get_format("e2m1")).astype(np.uint8), "e2m1", x=x)
    assert_same(o8, rcodec.encode_int(x, get_format("int8")).view(np.uint8), "int8", x=x)
    assert_same(oi4, rcodec.encode_int(x, get_format("int4")).view(np.uint8), "int4", x=x)


@pytest.mark.parametrize(
    "name, units, cols, seed",
    [("mxfp8", 2, 512, 9), ("fp8_1x128", 2, 512, 9), ("mxfp8", 1, 256, 8), ("fp8_1x128", 1, 256, 8), ("nvfp4", 1, 256, 8)],
)
def test_lastaxis_cheap_chunks(monkeypatch, name, units, cols, seed):
    """fp8 groups on an sm_89+ GPU take the cvt encoder's chunk layout (kq._cheap), which
    the simulator (no cvt) would not: forced here. ``units`` = kq.CHEAP_UNITS: 1, chunks of
    one unit; 2, a lane holds units l and l + LL of its group (interleaved chunks). Codes
    and scales stay bit-exact."""
    monkeypatch.setattr(kq, "_cheap", lambda fmt: True)
    monkeypatch.setattr(kq, "CHEAP_UNITS", units)
    kq._PLANS.clear()
    try:
        x = edge_data((3, cols), seed=seed).astype(ml_dtypes.bfloat16)
        check(x, resolve_scheme(name), x_ref=x.astype(np.float32))
    finally:
        kq._PLANS.clear()


# ----------------------------------------------------------------------------- asymmetric / centred last-axis
# lastaxis_asym_rows / lastaxis_stat_groups (quantize.lastaxis): the (max, min) statistic as
# order-preserving integer keys, the zero point; the centred mean by the halving sum across
# lanes (position by position) and within a thread, then the centred amax.
STAT_FAST = {"lastaxis_asym_rows", "lastaxis_stat_groups"}


def _stat_groups_data(shape, qmax, seed):
    """edge_data, with whole 128-element groups that are: all zero, NaN, +inf only, -inf
    only, a NaN of negative sign (keys below -inf), and rounding ties: [0, qmax] spanned so
    s = 1 and zp = 0 with every k + 0.5 (asymmetric), or +-v pairs 64 apart so the halving
    sum is exactly 0 and the amax 127 (centred), plus float32 neighbours of the ties."""
    x = edge_data(shape, seed=seed).reshape(-1, 128)
    x[0] = 0.0
    x[1, 5] = np.nan
    x[2, 7] = np.inf
    x[3, 9] = -np.inf
    x[4, 11] = -np.nan
    t = (np.arange(64) % (qmax + 1)).astype(np.float32) + np.float32(0.5)
    t[::3] = np.nextafter(t[::3], np.float32(0))
    t[1::5] = np.nextafter(t[1::5], np.float32(np.inf))
    if qmax == 127:  # centred
        t = np.minimum(t, 126.5)
        t[0] = 127.0
        x[5, :64], x[5, 64:] = t, -t
    else:
        x[5, :64], x[5, 64:] = t, t[::-1]
        x[5, 0], x[5, 1] = 0.0, qmax
    return x.reshape(shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("name, shape", [("int8_asym", (6, 128)), ("int4_asym", (3, 256)), ("int8_centred", (3, 256)),
                                         ("int8_asym", (3, 1000))])
def test_lastaxis_stat_kernels_exact(name, shape, dtype):
    sch = resolve_scheme(name)
    qmax = {"int8_asym": 255, "int4_asym": 15, "int8_centred": 127}[name]
    x = (_stat_groups_data(shape, qmax, seed=len(name)) if shape[1] % 128 == 0 else edge_data(shape)).astype(dtype)
    assert STAT_FAST & set(launched(shape, dtype, sch))
    check(x, sch, x_ref=x.astype(np.float32))


@pytest.mark.parametrize("name, shape, dtype", [("int8_asym", (2, 1000), np.float16), ("int4_asym", (3, 256), np.float32),
                                                ("int8_centred", (3, 256), ml_dtypes.bfloat16)])
def test_lastaxis_stat_several_units_per_thread(deep_units, name, shape, dtype):
    x = edge_data(shape, seed=11).astype(dtype)
    check(x, resolve_scheme(name), x_ref=x.astype(np.float32))


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_lastaxis_centred_halving_sum_order(group_size):
    # values over 16 decades: a sum in any other order changes the last bits of the means
    sch = resolve_scheme("int8_centred", group_size=group_size)
    assert "lastaxis_stat_groups" in launched((3, 256), np.float32, sch)
    check(wide_data((3, 256)), sch)


@pytest.mark.parametrize("units", [1, 4])
@pytest.mark.parametrize("group_size", [32, 128])
def test_lastaxis_centred_chunk_geometries(monkeypatch, units, group_size):
    """Other chunk widths (kq.CENTRED_UNITS): other splits of the halving sum between the
    lanes' reduce-scatter, the thread, and the final butterflies (1 unit, bf16 128: a plain
    lane level after the scatter; 4 units: more levels in the thread)."""
    monkeypatch.setattr(kq, "CENTRED_UNITS", units)
    kq._PLANS.clear()
    try:
        sch = resolve_scheme("int8_centred", group_size=group_size)
        x = wide_data((2, 256)).astype(ml_dtypes.bfloat16)
        assert "lastaxis_stat_groups" in launched(x.shape, ml_dtypes.bfloat16, sch)
        check(x, sch, x_ref=x.astype(np.float32))
    finally:
        kq._PLANS.clear()


# ----------------------------------------------------------------------------- static scales, one pass
# static_encode (quantize.lastaxis): caller-given scales per tensor or per last-axis row,
# 16-byte loads, the finite-unit encoders only where s is finite and non-zero.
_ROW_SCALES = np.array([[0.01], [0.0], [np.inf], [np.nan], [-0.5], [1e-40], [3.0]], np.float32)


@pytest.mark.parametrize(
    "name, kw, shape, dtype, kernel",
    [
        ("fp8_tensor", {}, (3, 64), ml_dtypes.bfloat16, "static_encode"),
        ("e4m3", {"granularity": "row"}, (3, 64), np.float32, "static_encode"),
        ("int4", {"granularity": "tensor"}, (3, 36), np.float32, "static_encode"),  # 27 whole units
        ("fp8_tensor", {}, (3, 70), ml_dtypes.bfloat16, None),  # not whole units
        ("e4m3", {"granularity": "row"}, (3, 36), ml_dtypes.bfloat16, None),  # rows not whole units
        ("e4m3", {"granularity": "row", "axis": 0}, (8, 64), np.float32, None),
        ("int8", {"granularity": "group", "group_size": 16}, (3, 64), np.float32, None),
    ],
)
def test_static_kernel_choice(name, kw, shape, dtype, kernel):
    sch = resolve_scheme(name, static_scale=True, **kw)
    names = set(launched(shape, dtype, sch, static_scale=True))
    assert ("static_encode" in names) == (kernel is not None), names
    names = set(launched(shape, dtype, sch, static_scale=True, stoch=True))  # its stoch variant
    assert ("static_encode" in names) == (kernel is not None), names


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize(
    "name, kw, scale",
    [
        ("fp8_tensor", {}, 0.05),
        ("e5m2", {"granularity": "tensor"}, 1e-40),  # subnormal scale: quotients overflow
        ("e4m3", {"granularity": "row"}, _ROW_SCALES),  # zero, inf, NaN, negative scales
        ("int4", {"granularity": "row"}, _ROW_SCALES),
        ("e2m1", {"granularity": "tensor"}, 0.25),
        ("int8", {"granularity": "tensor"}, 0.02),
    ],
)
def test_static_kernel_exact(name, kw, scale, dtype):
    sch = resolve_scheme(name, static_scale=True, **kw)
    x = edge_data((7, 64), seed=len(name)).astype(dtype)
    assert "static_encode" in launched(x.shape, dtype, sch, static_scale=True)
    check(x, sch, scale=scale, x_ref=x.astype(np.float32))


def test_static_kernel_several_units_per_thread(deep_units):
    x = edge_data((5, 96), seed=2).astype(ml_dtypes.bfloat16)
    check(x, resolve_scheme("fp8_tensor", static_scale=True), scale=0.03, x_ref=x.astype(np.float32))


# ----------------------------------------------------------------------------- dynamic per-tensor, two passes
# Dynamic per-tensor float scales over whole units: tensor_amax (vector loads, NaN and inf
# counted) -> finalize -> static_encode with the scale finalize wrote. The amax must see
# every element (several blocks, several units per thread) and the encode must agree with
# the reference's dynamic encode for every kind of tensor amax.
def _dynamic_tensor_data(case, shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * 3
    if case == "edge":  # NaN in the tensor: scale NaN
        x = edge_data(shape, seed=seed)
    elif case == "inf":  # inf but no NaN: scale inf
        x[1, 5] = -np.inf
    elif case == "zeros":  # amax 0
        x[:] = 0.0
        x[0, 3] = -0.0
    elif case == "huge":  # amax near FLT_MAX, at the far end of the tensor
        x[-1, -1] = -3.4e38
    elif case == "tiny":  # subnormal amax: the scale underflows
        x = (x * 1e-41).astype(np.float32)
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("case", ["gauss", "edge", "inf", "zeros", "huge", "tiny"])
def test_dynamic_tensor_fast(dtype, case):
    """The streaming path, PerTensor.TWO_PASS (one launch at these sizes otherwise:
    tests/test_grid_one_launch.py; above them, one cooperative launch: tests/test_tensor_resident.py)."""
    sch = resolve_scheme("fp8_tensor")
    x = _dynamic_tensor_data(case, (5, 64), seed=3).astype(dtype)
    two_pass = KernelChoices(per_tensor=PerTensor.TWO_PASS)
    names = launched(x.shape, dtype, sch, choices=two_pass)
    assert names == ["tensor_amax", "finalize", "static_encode"], names
    check(x, sch, x_ref=x.astype(np.float32), choices=two_pass)


@pytest.mark.parametrize(
    "name, kw", [("int8", {"granularity": "tensor"}), ("e2m1", {"granularity": "tensor"}), ("e5m2", {"granularity": "tensor"})]
)
def test_dynamic_tensor_fast_formats(name, kw, deep_units):
    x = _dynamic_tensor_data("huge", (7, 96), seed=4).astype(ml_dtypes.bfloat16)
    sch = resolve_scheme(name, **kw)
    assert "static_encode" in launched(x.shape, ml_dtypes.bfloat16, sch)
    check(x, sch, x_ref=x.astype(np.float32))


@pytest.mark.parametrize(
    "shape, dtype, stoch, fast",
    [((3, 64), np.float32, False, True), ((3, 70), ml_dtypes.bfloat16, False, False), ((3, 64), np.float32, True, True)],
)
def test_dynamic_tensor_kernel_choice(shape, dtype, stoch, fast):
    sch = resolve_scheme("fp8_tensor")
    assert ("static_encode" in launched(shape, dtype, sch, stoch=stoch)) == fast


# ----------------------------------------------------------------------------- per-channel, two passes
# quantize.columns: float scales per last-axis channel (amax down every row), a thread per
# unit column and chunk of rows; several chunks per column, rows not a multiple of the rows
# a thread loads at once, NaN / inf / all-zero channels, N-D inputs.
def _column_data(shape, seed):
    rng = np.random.default_rng(seed + 1)
    x = edge_data(shape, seed=seed)
    x[..., 5] = 0.0  # an all-zero channel: s = 1
    x[..., 6] = -0.0
    x[..., 9] = np.inf  # inf but no NaN in the channel
    x.reshape(-1, shape[-1])[:, 10] = rng.standard_normal(x.size // shape[-1]) * 1e-41  # subnormal amax
    return x


COLUMN_TWO_PASS = KernelChoices(per_channel=PerChannel.TWO_PASS)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize(
    "name, kw, shape",
    [
        ("int8_column", {}, (9, 64)),  # 3 chunks of 4 rows, the last one short
        ("e4m3", {"granularity": "column"}, (2, 3, 32)),  # N-D: every leading index is a row
        ("int4", {"granularity": "column"}, (5, 48)),  # 4-bit codes, two per byte
        ("e2m1", {"granularity": "column"}, (3, 16)),
    ],
)
def test_column_fast(name, kw, shape, dtype):
    """PerChannel.TWO_PASS (the one-pass designs: tests/test_column_onepass.py, test_column_ring.py,
    test_column_cluster.py)."""
    sch = resolve_scheme(name, **kw)
    x = _column_data(shape, seed=len(name)).astype(dtype)
    assert launched(x.shape, dtype, sch, choices=COLUMN_TWO_PASS) == ["column_amax", "finalize", "column_encode"]
    check(x, sch, x_ref=x.astype(np.float32), choices=COLUMN_TWO_PASS)


@pytest.mark.parametrize(
    "name, kw, shape, fast",
    [
        ("int8_column", {}, (4, 64), True),
        ("int8_column", {}, (4, 60), False),  # rows not whole 16-byte units (bf16)
        ("int8", {"granularity": "column", "axis": 0}, (4, 64), False),  # channel axis first
        ("int8", {"granularity": "column", "symmetric": False}, (4, 64), False),  # zero points
    ],
)
def test_column_kernel_choice(name, kw, shape, fast):
    sch = resolve_scheme(name, **kw)
    assert ("column_encode" in launched(shape, ml_dtypes.bfloat16, sch, choices=COLUMN_TWO_PASS)) == fast
    assert "column_encode" not in launched(shape, ml_dtypes.bfloat16, sch, stoch=True, choices=COLUMN_TWO_PASS)


# ----------------------------------------------------------------------------- B0 x B1 tiles, one pass
# tile_blocks (quantize.tiles): one block per tile, units in registers from the load to the
# encode. The simulator runs small tiles (a 128 x 128 tile takes minutes there: the real
# size runs in tests/test_kernels_gpu.py).
@pytest.mark.parametrize(
    "kw, shape, dtype, fast",
    [
        ({"block_shape": (4, 16)}, (2, 9, 64), np.float32, True),  # batch, partial row tile
        ({"block_shape": (3, 32)}, (7, 64), ml_dtypes.bfloat16, True),
        ({}, (256, 256), ml_dtypes.bfloat16, True),
        ({}, (3, 2, 128, 384), np.float16, True),  # N-D: leading axes are the batch
        ({"block_shape": (4, 16)}, (2, 9, 40), np.float32, False),  # partial column tile
        ({"block_shape": (4, 12)}, (8, 48), ml_dtypes.bfloat16, False),  # tile rows not whole units
    ],
)
def test_tile_kernel_choice(kw, shape, dtype, fast):
    sch = resolve_scheme("fp8_128x128", **kw)
    assert ("tile_blocks" in launched(shape, dtype, sch)) == fast
    assert "tile_blocks" not in launched(shape, dtype, sch, stoch=True)
    assert "tile_blocks" not in launched(shape, dtype, resolve_scheme("int8", granularity="block", symmetric=False,
                                                                       block_shape=sch.block_shape))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize(
    "name, kw, shape",
    [
        ("fp8_128x128", {"block_shape": (4, 16)}, (2, 5, 32)),  # batch, partial row tile
        ("fp8_128x128", {"block_shape": (8, 64)}, (9, 64)),  # several units per thread
        ("int4", {"granularity": "block", "block_shape": (3, 16)}, (5, 32)),  # packed codes
    ],
)
def test_tile_kernel_exact(name, kw, shape, dtype):
    sch = resolve_scheme(name, **kw)
    x = edge_data(shape, seed=len(shape)).astype(dtype)
    x.reshape(-1, shape[-1])[:4, :16] = 0.0  # an all-zero tile
    assert "tile_blocks" in launched(shape, dtype, sch)
    check(x, sch, x_ref=x.astype(np.float32))


def test_tile_kernel_unaligned_input(unaligned_loads):
    x = edge_data((6, 32), seed=6).astype(ml_dtypes.bfloat16)
    check(x, resolve_scheme("fp8_128x128", block_shape=(4, 16)), x_ref=x.astype(np.float32))


# ----------------------------------------------------------------------------- MX e2m1 in bfloat16 pairs
# quantize.pair_encoders.e2m1_unit_bf16: MXFP4 of bfloat16 input, two elements per instruction
# (bfloat16 multiply by 2^-k, one bfloat16 addition of a magic onto the e2m1 grid).
@pytest.mark.skipif(not kq.SIMULATOR, reason="runs the twins (the GPU test is test_kernels_gpu::test_e2m1_pairs_gpu)")
def test_e2m1_pairs_every_bf16():
    """e2m1_unit_bf16 (through its twins) against the reference codec on x * 2^-k in float32,
    for every finite bfloat16 x and k over the whole MX range: with the clamp ("floor",
    "even"), every value; without it ("rceil"), every |x * 2^-k| < 7 (rceil keeps a group's
    values at most 6 * (1 + 2^-22))."""
    from nqdq.formats import get_format
    from nqdq.gpu.quantize import pair_encoders

    fn = pair_encoders.e2m1_unit_bf16.py_func
    pats, words = bf16_finite_units()
    x = (pats << 16).view(np.float32)
    cols = [words[:, j] for j in range(4)]
    for k in E2M1_PAIR_KS:
        p = np.float32(2.0**-k)
        with np.errstate(over="ignore"):
            y = x * p  # what the reference encodes (exact but for float32 overflow / subnormals)
        want = rcodec.encode_float(y, get_format("e2m1")).astype(np.uint32)
        hb = np.uint32(p.view(np.uint32) >> 16)
        for clamp in (False, True):
            got = fn(cols, np.uint32(hb | (hb << 16)), clamp)
            codes = np.stack([(got >> np.uint32(4 * j)) & np.uint32(15) for j in range(8)], axis=1).reshape(-1)
            ok = np.ones(y.shape, bool) if clamp else np.abs(y) < 7
            assert ok.sum() > 600
            bad = ok & (codes != want)
            assert not bad.any(), f"k={k} clamp={clamp}: {int(bad.sum())} differ, first x={x[bad][0]!r} code {codes[bad][0]} != {want[bad][0]}"


@pytest.mark.parametrize("rounding", ["rceil", "floor", "even"])
def test_mxfp4_bf16_pair_path(monkeypatch, rounding):
    """The group kernel takes the pair encoder for MXFP4 of bfloat16 input (finite groups)
    and the element encoder for groups with NaN / inf, bit for bit with the reference: edge
    data, a group of subnormals only (k clamped to -127) and groups at the top of the range."""
    from nqdq.gpu.quantize import group_chunks, pair_encoders

    calls = []
    enc = pair_encoders.e2m1_unit_bf16

    def spy(w, p2, clamp):
        calls.append(clamp)
        return enc(w, p2, clamp)

    if kq.SIMULATOR:  # a compiled kernel cannot call the spy (NQDQ_TEST_GPU=1 compiles these tests)
        monkeypatch.setattr(group_chunks, "e2m1_unit_bf16", spy)
    x = edge_data((4, 256), seed=11)
    x[1, :32] = np.float32(2.0**-133) * np.arange(32)  # bfloat16 subnormals: 2^-k = 2^127
    x[1, 32:64] = np.float32(3.3e38) * np.linspace(-1, 1, 32, dtype=np.float32)  # k = 125 / 126
    x[2, :32] = np.float32(0.25) * np.arange(-16, 16)  # ties of the grid at k = 0 .. 2
    xb = x.astype(ml_dtypes.bfloat16)
    kq._PLANS.clear()
    try:
        check(xb, resolve_scheme("mxfp4", scale_rounding=rounding), x_ref=xb.astype(np.float32))
    finally:
        kq._PLANS.clear()
    if kq.SIMULATOR:
        assert calls and set(calls) == {rounding != "rceil"}


@pytest.mark.skipif(not kq.SIMULATOR, reason="runs the twins (the GPU test is test_kernels_gpu::test_e2m1_pairs_gpu)")
def test_e2m1_nvfp4_pairs_every_bf16(monkeypatch):
    """e2m1_unit_nvfp4 (float32 products rounded to odd into bfloat16, then the pair
    encoder, through the twins) against the reference codec on fp32(x * m_b), for every
    finite bfloat16 x and multipliers that put products just above / below the grid's ties
    (1 +- an ulp), overflow them (1e30, FLT_MAX) or make them subnormal."""
    from nqdq.formats import get_format
    from nqdq.gpu.quantize import pair_encoders

    # the bit casts by NumPy views, so that the twins run on whole arrays at once
    monkeypatch.setattr(pair_encoders, "f32_bits", lambda f: np.asarray(f, np.float32).view(np.uint32))
    monkeypatch.setattr(pair_encoders, "bits_f32", lambda u: np.asarray(u, np.uint32).view(np.float32))
    pats, words = bf16_finite_units()
    x = (pats << 16).view(np.float32)
    for mb in NVFP4_PAIR_MBS:
        mb = np.float32(mb)
        with np.errstate(over="ignore", under="ignore"):
            y = x * mb
            got = pair_encoders.e2m1_unit_nvfp4.py_func([words[:, j] for j in range(4)], mb)
        codes = np.stack([(got >> np.uint32(4 * j)) & np.uint32(15) for j in range(8)], axis=1).reshape(-1)
        want = rcodec.encode_float(y, get_format("e2m1")).astype(np.uint32)
        bad = codes != want
        assert not bad.any(), f"m_b={mb!r}: {int(bad.sum())} differ, first x={x[bad][0]!r} code {codes[bad][0]} != {want[bad][0]}"


def test_nvfp4_bf16_pair_path(monkeypatch):
    """NVFP4 of bfloat16 takes the pair encoder for finite blocks, bit for bit with the
    reference (edge data: NaN / inf blocks, tiny blocks whose e4m3 scale is subnormal)."""
    from nqdq.gpu.quantize import group_chunks, pair_encoders

    calls = []
    enc = pair_encoders.e2m1_unit_nvfp4

    def spy(w, mb):
        calls.append(1)
        return enc(w, mb)

    if kq.SIMULATOR:  # a compiled kernel cannot call the spy (NQDQ_TEST_GPU=1 compiles these tests)
        monkeypatch.setattr(group_chunks, "e2m1_unit_nvfp4", spy)
    x = edge_data((4, 256), seed=12)
    x[1, :16] = np.float32(1e-3) * np.arange(16)  # e4m3 scale in its subnormal range: |y| beyond 6
    x[2, :16] = np.float32(0.25) * np.arange(-8, 8)
    xb = x.astype(ml_dtypes.bfloat16)
    kq._PLANS.clear()
    try:
        check(xb, resolve_scheme("nvfp4"), x_ref=xb.astype(np.float32))
    finally:
        kq._PLANS.clear()
    if kq.SIMULATOR:
        assert calls


def _e2m1_f32_probe_values():
    """float32 magnitudes around every e2m1 code boundary: the grid points and the midpoints
    (ties), each with its float32 neighbours 1 and 2 ulps away, values past 6 (saturation),
    subnormals, and random values over a wide range; both signs."""
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6.5, 7, 7.5, 8, 1e3], np.float32)
    base = np.concatenate([grid, mids])
    near = [base]
    for steps in (1, 2):
        up, down = base.copy(), base.copy()
        for _ in range(steps):
            up = np.nextafter(up, np.float32(np.inf))
            down = np.nextafter(down, np.float32(0))
        near += [up, down]
    rng = np.random.default_rng(11)
    rand = (rng.standard_normal(20000) * 10.0 ** rng.uniform(-3, 1, 20000)).astype(np.float32)
    sub = np.array([1e-45, 1e-40, 1.1754942e-38], np.float32)
    v = np.concatenate(near + [rand, sub])
    return np.concatenate([v, -v]).astype(np.float32)


@pytest.mark.skipif(not kq.SIMULATOR, reason="runs the twins (the GPU runs the kernel in test_mxfp4_f32_pair_path)")
def test_e2m1_f32_pairs_match_the_codec(monkeypatch):
    """e2m1_unit_f32 (through its twins) against the reference codec on y = x * 2^-k for x =
    v * 2^k, v around every code boundary (ties, 1-2 ulps off, saturation, subnormal
    products), over the MX range of k; both signs, zeros included."""
    from nqdq.formats import get_format
    from nqdq.gpu.quantize import pair_encoders

    # the bit casts by NumPy views, so that the twins run on whole arrays at once
    monkeypatch.setattr(pair_encoders, "f32_bits", lambda f: np.asarray(f, np.float32).view(np.uint32))
    monkeypatch.setattr(pair_encoders, "bits_f32", lambda u: np.asarray(u, np.uint32).view(np.float32))
    fn = pair_encoders.e2m1_unit_f32.py_func
    v = _e2m1_f32_probe_values()
    v = v[: v.size // 8 * 8]
    for k in (-127, -126, -20, -1, 0, 1, 5, 60, 126):
        p = np.float32(2.0**-k)
        with np.errstate(over="ignore", under="ignore"):
            x = (v.astype(np.float64) * 2.0**k).astype(np.float32)
            ok = np.isfinite(x)
            x = np.where(ok, x, np.float32(0))
            y = x * p  # the reference's float32 product
        want = rcodec.encode_float(y, get_format("e2m1")).astype(np.uint32)
        e = x.view(np.uint32).reshape(-1, 8)
        got = fn([e[:, j] for j in range(8)], p)
        codes = np.stack([(got >> np.uint32(4 * j)) & np.uint32(15) for j in range(8)], axis=1).reshape(-1)
        bad = codes != want
        assert not bad.any(), f"k={k}: {int(bad.sum())} differ, first y={y[bad][0]!r} code {codes[bad][0]} != {want[bad][0]}"


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
def test_mxfp4_f32_pair_path(monkeypatch, dtype, rounding):
    """MXFP4 of float16 input (8-element units) takes e2m1_unit_f32 in finite groups and the
    element encoder elsewhere, bit for bit with the reference; float32 input (4-element
    units) keeps the element encoder."""
    from nqdq.gpu.quantize import lastaxis
    from nqdq.gpu.quantize import encoders, pair_encoders

    calls = []
    enc = pair_encoders.e2m1_unit_f32

    def spy(e, p0):
        calls.append(1)
        return enc(e, p0)

    if kq.SIMULATOR:  # a compiled kernel cannot call the spy
        monkeypatch.setattr(encoders, "e2m1_unit_f32", spy)
    kq._PLANS.clear()
    lastaxis.make_lastaxis_group_kernel.cache_clear()
    try:
        x = edge_data((4, 128), seed=9).astype(dtype)
        x[3, 64:96] = np.float32(1e-7)  # a finite group of tiny values (subnormal in float16)
        check(x, resolve_scheme("mxfp4", scale_rounding=rounding), x_ref=x.astype(np.float32))
    finally:
        kq._PLANS.clear()
        lastaxis.make_lastaxis_group_kernel.cache_clear()
    if kq.SIMULATOR:
        assert bool(calls) == (dtype == np.float16)


_WORD_VIEW_PTX_SCRIPT = r"""
import json, re
import ml_dtypes
import numpy as np
from numba import cuda, typeof
from nqdq.tools import ptx_audit as A
from nqdq.gpu.ptx.memory import as_u16, as_u32
from nqdq.tools.ptx_audit import _no_gpu_compile


def body(k, args):
    with _no_gpu_compile():
        ptx, _ = cuda.compile_ptx(k.py_func, tuple(typeof(a) for a in args), cc=(9, 0))
    b = ptx[ptx.index(".entry"):]
    ins = (ln.strip() for ln in b.splitlines() if re.match(r"\s*(@!?%p\d+\s+)?[a-z]", ln))
    return [s for s in ins if not s.startswith(".")]


@cuda.jit
def views(x, codes, out):
    out[0] = as_u32(x)[1]
    as_u16(codes)[2] = np.uint16(7)


tiny = body(views, (np.zeros(8, np.uint16), np.zeros(8, np.uint8), np.zeros(1, np.uint32)))
rows = {}
for label, k, args in A._case_launches("fp8_row", {}, (1024, 8192), ml_dtypes.bfloat16, None, False):
    if k.py_func.__name__ == "lastaxis_rows":
        ins = body(k, args)
        first = next(i for i, s in enumerate(ins) if s.split()[0].startswith("ld.global"))
        rows = dict(before_load=first, total=len(ins))
print(json.dumps(dict(tiny=tiny, rows=rows)))
"""


def test_word_views_have_no_device_checks():
    """``_ptx.as_u32`` / ``as_u16`` (every quantize kernel's 32- and 16-bit views of its input
    and codes) compile to no comparison or branch (compiled for sm_90, no GPU): Numba's
    ``a[:k].view(np.uint32)`` checks size and contiguity on the device, which put the row
    kernel's first global load 153 PTX instructions in (fp8_row 0.4-0.8 us slower at bf16
    8192x8192 on an H100: docs/design/last-axis.md, "Word views"); now it is the 18th."""
    r = compile_rows(_WORD_VIEW_PTX_SCRIPT)
    ops = [s.split()[0] for s in r["tiny"]]
    assert not [o for o in ops if o.startswith(("setp", "bra", "selp"))], r["tiny"]
    assert sum(o.startswith("ld.global") for o in ops) == 1 and sum(o.startswith("st.global") for o in ops) == 2
    assert r["rows"]["before_load"] < 100, r["rows"]
