"""Stochastic rounding through the 16-byte-unit kernels (``lastaxis``' ``stoch`` variants):
the plan takes them for the cases it takes for
round-to-nearest-even, and their codes are the reference's bit for bit (Philox4x32-10 bits of
each element's C-order index, reference/rng.py), their scales the RNE scales.

In the CUDA simulator (conftest), so the inputs are small; tests/test_stochastic_lastaxis_gpu.py
runs the same kernels at real sizes on a GPU. Each case quantizes, dequantizes and compares
everything (helpers.kernels.check: codes packed and unpacked, scales, zero points, means, tensor
scale, dequantized values), from outputs poisoned first.
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest
from numba import cuda

import nqdq.gpu.quantize.plan as kq
from nqdq.gpu.quantize.choices import KernelChoices, PerTensor
from nqdq.reference import quantize as ref
from nqdq.schemes import resolve_scheme

from helpers.data import edge_data
from helpers.kernels import UNIT_KERNELS, assert_same, check, launched

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

BF16 = ml_dtypes.bfloat16
SEEDS = (7, 2**63 + 2**40 + 12345)  # one seed with both key words non-zero

# scheme -> (kw, a small shape whose rows are whole groups of whole 16-byte units, its kernel)
SCHEMES = {
    "fp8_row": ({}, (3, 200), "lastaxis_rows"),  # (rows of 2^k <= 32 units run the group kernel)
    "int8_row": ({}, (3, 200), "lastaxis_rows"),
    "fp8_1x128": ({}, (2, 256), "lastaxis_groups"),
    "mxfp8": ({}, (3, 128), "lastaxis_groups"),
    "mxfp8_e5m2": ({}, (3, 64), "lastaxis_groups"),
    "mxfp6_e2m3": ({}, (3, 128), "lastaxis_groups"),
    "mxfp6_e3m2": ({}, (3, 128), "lastaxis_groups"),
    "mxfp4": ({}, (3, 128), "lastaxis_groups"),
    "int4_group": ({}, (2, 256), "lastaxis_groups"),
    "nvfp4": ({}, (3, 128), "lastaxis_groups"),
    "fp8_tensor": ({}, (3, 128), "static_encode"),
    "int8_asym": ({}, (3, 200), "lastaxis_asym_rows"),
    "int4_asym": ({}, (2, 256), "lastaxis_stat_groups"),
    "int8_centred": ({}, (2, 256), "lastaxis_stat_groups"),
}
# (input dtype, seed): both seeds on bfloat16, one each on float32 / float16
KINDS = [(BF16, SEEDS[0]), (BF16, SEEDS[1]), (np.float32, SEEDS[1]), (np.float16, SEEDS[0])]


def sr_data(shape, seed):
    """edge_data (NaN, +-inf, signed zeros, subnormals, format maxima, ties) with whole groups
    of 32 that hold a NaN, an infinity only, only zeros, and only values on the fp8 / int grids
    (nothing to round: stochastic rounding must keep them), where the shape has room."""
    x = edge_data(shape, seed=seed).reshape(-1, shape[-1])
    rng = np.random.default_rng(seed)
    groups = [g for g in range(x.shape[1] // 32)]
    for i, g in enumerate(groups[:4] if x.shape[0] > 1 else []):
        row = x[(i + 1) % x.shape[0], 32 * g: 32 * g + 32]
        row[:] = rng.standard_normal(32).astype(np.float32)
        if i == 0:
            row[5] = np.nan
        elif i == 1:
            row[:] = np.where(rng.random(32) < 0.3, np.float32(-np.inf), row)
        elif i == 2:
            row[:] = np.where(rng.random(32) < 0.5, np.float32(0.0), np.float32(-0.0))
        else:
            row[:] = rng.integers(-7, 8, 32).astype(np.float32)
    return x.reshape(shape)


def _run(name, dtype, seed, shape=None, choices=None, **kw):
    """Check scheme ``name`` under stochastic rounding on sr_data cast to ``dtype`` (the
    designs of ``choices``), asserting that the plan runs the scheme's kernel (with
    ``shape``: a 16-byte-unit kernel); returns (the kernels' QuantParts, the input, the
    scheme)."""
    skw, sshape, kernel = SCHEMES[name]
    sch = resolve_scheme(name, **skw)
    x = sr_data(shape or sshape, seed=zlib.crc32(name.encode()) % 1000).astype(dtype)
    names = launched(x.shape, dtype, sch, stoch=True, choices=choices)
    assert (kernel in names) if shape is None else (UNIT_KERNELS & set(names)), names
    return check(x, sch, seed=seed, x_ref=x.astype(np.float32), choices=choices, **kw), x, sch


# ----------------------------------------------------------------------------- bit-exact
@pytest.mark.parametrize("dtype, seed", KINDS, ids=lambda v: np.dtype(v).name if isinstance(v, type) else str(v))
@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_sr_fast_kernels_exact(name, dtype, seed):
    """Every scheme, input kind and two seeds: codes (packed and not), scales and dequantized
    values equal the reference's, and the scales equal round-to-nearest's bit for bit."""
    got, x, sch = _run(name, dtype, seed)
    rne = ref.quantize(x.astype(np.float32), sch)
    assert_same(got.scales, rne.scales, f"{name} scales under stochastic rounding vs RNE")


@pytest.mark.parametrize(
    "name, shape, dtype",
    [
        ("fp8_row", (3, 72), BF16),  # 9 units a row: fewer than a warp's threads
        ("int8_row", (2, 1000), np.float16),  # 125 units a row
        ("fp8_row", (1, 8), np.float32),  # one row of two units
        ("mxfp4", (5, 96), BF16),  # 60 units: a partial block of chunks
        ("mxfp8", (2, 3, 64), np.float32),  # 3-D: linear indices across the leading axes
        ("nvfp4", (3, 160), np.float32),
        ("int8_asym", (3, 40), np.float32),  # 10 units a row
        ("int4_asym", (3, 64), BF16),  # one group a row (64 < 128)
        ("fp8_tensor", (7, 96), BF16),
    ],
)
def test_sr_fast_kernels_shapes(name, shape, dtype):
    _run(name, dtype, SEEDS[1], shape=shape)


@pytest.mark.parametrize(
    "name, kw, shape, dtype",
    [
        ("fp8_row", {}, (3, 70), BF16),  # rows not whole 16-byte units
        ("mxfp8", {}, (3, 80), BF16),  # a partial last group
        ("int4", {"granularity": "group", "group_size": 24}, (2, 48), np.float32),  # groups of 6 units
        ("int8_centred", {}, (2, 64), np.float32),  # a row shorter than the group
        ("fp8_128x128", {}, (4, 64), np.float32),  # tiles: the general kernels under stochastic rounding
        ("int8_column", {}, (4, 64), np.float32),  # per-channel: the same
    ],
)
def test_sr_general_fallbacks(name, kw, shape, dtype):
    """Cases the 16-byte-unit kernels do not take still give the reference's bits (general kernels)."""
    sch = resolve_scheme(name, **kw)
    assert not UNIT_KERNELS & set(launched(shape, dtype, sch, stoch=True))
    x = sr_data(shape, seed=5).astype(dtype)
    check(x, sch, seed=SEEDS[0], x_ref=x.astype(np.float32))


@pytest.mark.parametrize("name, kw, scale", [("fp8_tensor", {}, 0.05), ("e4m3", {"granularity": "row"}, None),
                                             ("int4", {"granularity": "tensor"}, 0.25)])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_sr_static_scales(name, kw, scale, dtype):
    """Caller-given scales (``scale=``) through static_encode's stochastic variant."""
    shape = (3, 64)
    sch = resolve_scheme(name, static_scale=True, **kw)
    if scale is None:  # one per row, one of them 0 and one NaN
        scale = np.array([[0.05], [0.0], [np.nan]], np.float32)
    assert "static_encode" in launched(shape, dtype, sch, static_scale=True, stoch=True)
    x = sr_data(shape, seed=11).astype(dtype)
    check(x, sch, seed=SEEDS[1], scale=scale, x_ref=x.astype(np.float32))


@pytest.mark.parametrize("design, kernels", [
    (PerTensor.ONE_LAUNCH, ["lastaxis_groups"]),  # S_enc over the grid, one launch
    (PerTensor.AMAX_IN_GROUPS, ["tensor_amax", "lastaxis_groups"]),  # S_enc from the amax partials
    (PerTensor.TWO_PASS, ["tensor_amax", "finalize", "lastaxis_groups"]),
])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_sr_nvfp4_tensor_scale_paths(design, kernels, dtype):
    choices = KernelChoices(per_tensor=design)
    assert launched((3, 128), dtype, resolve_scheme("nvfp4"), stoch=True, choices=choices) == kernels
    _run("nvfp4", dtype, SEEDS[0], choices=choices)


@pytest.mark.parametrize("design, kernels", [(PerTensor.ONE_LAUNCH, ["static_encode"]),
                                             (PerTensor.TWO_PASS, ["tensor_amax", "finalize", "static_encode"])])
def test_sr_dynamic_tensor_paths(design, kernels):
    choices = KernelChoices(per_tensor=design)
    assert launched((3, 128), BF16, resolve_scheme("fp8_tensor"), stoch=True, choices=choices) == kernels
    _run("fp8_tensor", BF16, SEEDS[1], choices=choices)


@pytest.mark.parametrize("name, dtype", [("fp8_row", BF16), ("mxfp4", np.float16), ("int4_asym", BF16),
                                         ("nvfp4", np.float32), ("int8_centred", np.float16)])
def test_sr_unaligned_input(unaligned_loads, name, dtype):
    """Input that is not 16-byte aligned (element-by-element loads): the same units, the same bits."""
    x = sr_data((2, 128) if name != "int8_centred" else (2, 256), seed=4).astype(dtype)
    assert UNIT_KERNELS & set(launched(x.shape, dtype, resolve_scheme(name), stoch=True))
    check(x, resolve_scheme(name), seed=SEEDS[1], x_ref=x.astype(np.float32))


# ----------------------------------------------------------------------------- the plan's choice
@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_sr_plan_takes_the_fast_kernel(name):
    """Stochastic rounding takes the RNE plan's 16-byte-unit kernel (its stoch variant, whose
    arguments end with the seed's halves)."""
    skw, shape, kernel = SCHEMES[name]
    sch = resolve_scheme(name, **skw)
    for dtype in (np.float32, np.float16, BF16):
        rne = launched(shape, dtype, sch)
        assert kernel in rne
        assert launched(shape, dtype, sch, stoch=True) == rne, dtype
        plan = kq.get_plan(shape, {np.float32: 0, BF16: 1, np.float16: 2}[dtype], sch, stoch=True)
        for k, _grid, _block, args in plan.launches:
            if k.py_func.__name__ == kernel:
                assert args[-2:] == (kq._SEED_LO, kq._SEED_HI), args


# ----------------------------------------------------------------------------- launch geometry
@pytest.mark.parametrize("name, shape, dtype", [("fp8_row", (2, 1024), BF16), ("mxfp4", (4, 256), BF16),
                                                ("int4_group", (2, 512), np.float32), ("int8_asym", (2, 1000), np.float16),
                                                ("int8_centred", (2, 512), BF16), ("nvfp4", (2, 256), np.float32)])
def test_sr_launch_geometry_does_not_change_bits(fresh_plans, name, shape, dtype):
    """The same bits under block sizes of 32 and 128 threads, and with several units per thread
    (the deep paths: kq.DEEP_UNITS / DEEP_ROWS), as the reference's."""
    sch = resolve_scheme(name, **SCHEMES.get(name, ({},))[0])
    x = sr_data(shape, seed=3).astype(dtype)
    want = ref.quantize(x.astype(np.float32), sch, seed=SEEDS[1])
    runs = []
    for threads, deep in ((32, False), (128, False), (128, True)):
        if deep:
            fresh_plans.setattr(kq, "DEEP_UNITS", 0)
            fresh_plans.setattr(kq, "DEEP_ROWS", 0)
        kq._PLANS.clear()
        plan = kq.get_plan(shape, {np.float32: 0, BF16: 1, np.float16: 2}[dtype], sch, stoch=True, threads=threads)
        assert UNIT_KERNELS & {k.py_func.__name__ for k, _, _, _ in plan.launches}
        runs.append((plan.launches, kq.quantize(x, sch, seed=SEEDS[1], threads=threads, packed=False)))
    # (a kernel object is one geometry of units per thread: the factories cache them)
    geometries = [tuple((id(k), g, b) for k, g, b, _ in launches) for launches, _ in runs]
    assert len(set(geometries)) >= 2, geometries  # (rows: the block fits the row, not ``threads``)
    for launches, got in runs:
        assert_same(got.codes, want.codes, f"{name} codes, launches {[(g, b) for _, g, b, _ in launches]}")
        assert_same(got.scales, want.scales, f"{name} scales")


def test_sr_bits_depend_on_the_seed():
    """The stochastic variant really rounds stochastically: other seeds, other codes (same scales)."""
    sch = resolve_scheme("mxfp4")
    x = np.random.default_rng(1).standard_normal((4, 128)).astype(np.float32)
    a, b = (kq.quantize(x, sch, seed=s, packed=False) for s in SEEDS)
    r = kq.quantize(x, sch, packed=False)
    assert_same(a.scales, r.scales, "scales")
    assert (a.codes != b.codes).mean() > 0.1 and (a.codes != r.codes).mean() > 0.1


# ----------------------------------------------------------------------------- the short unit encode
def _fast_units(name, units, p0s):
    """Run quantize.sr_units.sr_unit_fast and sr_store_unit on float32 units (rows of 8) with
    their float scales: (ok flags, the fast codes, sr_store_unit's codes), 8 bytes a unit."""
    from nqdq.gpu.quantize import sr_units
    from nqdq.gpu.quantize.units import store_packed
    from nqdq.gpu.device.division import recip_guarded
    from nqdq.gpu.device.elements import format_tuple
    from nqdq.gpu.device.scales import MODE_FLOAT

    fmt = format_tuple(resolve_scheme(name))
    key_lo, key_hi = 7, 12345

    @cuda.jit
    def kernel(E, p0s, ok, f8, f16, f32, g8, g16, g32):
        i = cuda.grid(1)
        if i < E.shape[0]:
            e = (E[i, 0], E[i, 1], E[i, 2], E[i, 3], E[i, 4], E[i, 5], E[i, 6], E[i, 7])
            p0 = p0s[i]
            lo, hi, good = sr_units.sr_unit_fast(e, i, p0, recip_guarded(p0), key_lo, key_hi, MODE_FLOAT, fmt, 8, 8)
            ok[i] = good
            store_packed(lo, hi, i, f8, f16, f32, 8, 8)
            sr_units.sr_store_unit(e, i, p0, np.float32(0), 0, key_lo, key_hi, g8, g16, g32, MODE_FLOAT, fmt, 8, 8)

    n = units.shape[0]
    E = np.ascontiguousarray(units, np.float32).view(np.uint32).astype(np.int64)
    ok = np.zeros(n, np.bool_)
    fast, ref = np.zeros(8 * n, np.uint8), np.zeros(8 * n, np.uint8)
    kernel[1, n](E, np.asarray(p0s, np.float32), ok, fast, fast.view(np.uint16), fast.view(np.uint32),
                 ref, ref.view(np.uint16), ref.view(np.uint32))
    return ok, fast.reshape(n, 8), ref.reshape(n, 8)


@pytest.mark.parametrize("name", ["fp8_row", "int8_row"])
def test_sr_fast_unit_division_range(name):
    """A float scale's unit takes the short encode only where div_by_recip is the IEEE quotient:
    every |x| is 0 or at least max(2^-102, s * 2^-124) (the bound on either side of it tested,
    for a small s, where 2^-102 rules, and a large one); where it does, its codes are
    sr_store_unit's. (fp8: an x that small has |x / s| < 2^-22, below e4m3's normal range, so
    its code's key rejects the unit first.)"""
    f32 = np.float32
    below = lambda v: np.nextafter(f32(v), f32(0))  # noqa: E731
    rng = np.random.default_rng(3)
    units, p0s, want_ok = [], [], []
    for s in (f32(1.3 * 2.0**-60), f32(1.7 * 2.0**40)):
        t = max(f32(2.0**-102), f32(s * f32(2.0**-124)))
        base = (rng.standard_normal(8) * s * 100).astype(f32)
        for x, good in [(None, True), (f32(0.0), True), (f32(-0.0), True), (t, True), (-t, True),
                        (below(t), False), (-below(t), False), (f32(2.0**-149), False)]:
            u = base.copy()
            if x is not None:
                u[3] = x
            units.append(u)
            p0s.append(s)
            want_ok.append(good and (name.startswith("int") or not x))
    ok, fast, ref = _fast_units(name, np.array(units), p0s)
    np.testing.assert_array_equal(ok, np.array(want_ok))
    assert_same(fast[ok], ref[ok], f"{name}: the short encode's codes")


@pytest.mark.parametrize("mode_name", ["nvfp4", "mxfp4"])
def test_sr_e2m1_integer_unit(mode_name):
    """sr_unit_e2m1_i (MX e2m1 / NVFP4 units of a clean group, any input kind) against
    sr_store_unit, the per-element path: equal codes wherever it reports ok, and ok exactly
    where every |x * p0| is 0, below 2^-33 or at least 2^-10 (an element placed on either side
    of 2^-10 and 2^-33, for NVFP4's multipliers and MX powers of two)."""
    from nqdq.gpu.quantize import sr_units
    from nqdq.gpu.device.elements import format_tuple
    from nqdq.gpu.device.scales import MODE_MX, MODE_NVFP4

    fmt = format_tuple(resolve_scheme(mode_name))
    mode = MODE_NVFP4 if mode_name == "nvfp4" else MODE_MX
    key_lo, key_hi = 7, 12345

    @cuda.jit
    def kernel(E, p0s, ok, f16, g8, g16, g32):
        i = cuda.grid(1)
        if i < E.shape[0]:
            e = (E[i, 0], E[i, 1], E[i, 2], E[i, 3], E[i, 4], E[i, 5], E[i, 6], E[i, 7])
            lo, hi, good = sr_units.sr_unit_e2m1_i(e, i, p0s[i], key_lo, key_hi, 8, 4)
            ok[i] = good
            f16[2 * i] = np.uint16(lo)
            f16[2 * i + 1] = np.uint16(hi)
            sr_units.sr_store_unit(e, i, p0s[i], np.float32(0), 0, key_lo, key_hi, g8, g16, g32, mode, fmt, 8, 4)

    f32 = np.float32
    rng = np.random.default_rng(5)
    units, p0s, want_ok = [], [], []
    for _ in range(6):
        p0 = f32(rng.uniform(0.5, 2.0) * 2.0 ** rng.integers(-20, 20)) if mode == MODE_NVFP4 else \
            f32(2.0 ** rng.integers(-20, 20))
        base = (rng.standard_normal(8) * 2.5 / p0).astype(f32)  # |x * p0| mostly within e2m1's range
        for q in [None, 0.0, -0.0, 2.0**-10, -(2.0**-10), 0.99 * 2.0**-10, 2.0**-33, 0.99 * 2.0**-33, 1e-30, 7.5, 1e6]:
            u = base.copy()
            good = True
            if q is not None:
                x = f32(q / p0)  # |x * p0| rounds to q or its neighbour: the bound is checked on it
                u[rng.integers(8)] = x
                qq = abs(np.float64(f32(abs(x) * p0)))
                good = qq == 0 or qq < 2.0**-33 or qq >= 2.0**-10
            units.append(u)
            p0s.append(p0)
            want_ok.append(good)
    n = len(units)
    E = np.ascontiguousarray(np.array(units), np.float32).view(np.uint32).astype(np.int64)
    ok = np.zeros(n, np.bool_)
    fast, ref = np.zeros(4 * n, np.uint8), np.zeros(4 * n, np.uint8)
    kernel[1, n](E, np.asarray(p0s, np.float32), ok, fast.view(np.uint16), ref, ref.view(np.uint16),
                 ref.view(np.uint32))
    np.testing.assert_array_equal(ok, np.array(want_ok))
    assert ok.sum() > n // 2 and (~ok).sum() >= 6
    assert_same(fast.reshape(n, 4)[ok], ref.reshape(n, 4)[ok], f"{mode_name}: the integer unit encode's codes")
