"""GPU side of tests/test_int_group_tile.py: int4_group / int8 1xG groups and fp8_128x128 tiles,
asymmetric rows and the asymmetric / centred stat groups (int4_asym, int8_centred), compiled,
at sizes that take the deep paths, with the warp shuffle and its shared-memory twin, f32 / f16
/ bf16 and unaligned views; bit for bit against the reference (tests/test_kernels_gpu.py's
check_gpu)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

from helpers.gpu import gpu_cupy_or_skip  # noqa: E402

cp = gpu_cupy_or_skip()

import nqdq.gpu.quantize.plan as kq
from nqdq.gpu.quantize import lastaxis  # noqa: E402
from nqdq.gpu.quantize import tiles  # noqa: E402
from nqdq.schemes import resolve_scheme  # noqa: E402

from helpers.gpu import check_aligned_and_not, check_gpu, check_with_shuffle_twin, edge_input  # noqa: E402

SCHEMES = [pytest.param("int4_group", {}, id="int4_group"),
           pytest.param("int8", {"granularity": "group", "group_size": 64}, id="int8_group64"),
           pytest.param("fp8_128x128", {}, id="fp8_128x128"),
           pytest.param("int8_asym", {}, id="int8_asym_rows"),
           pytest.param("int4", {"granularity": "row", "symmetric": False}, id="int4_asym_rows")]


@pytest.fixture(scope="module")
def big_bf16():
    """640 x 8192 bfloat16 (deep paths: kq.DEEP_UNITS), outlier channels, NaN / inf in a few groups."""
    import ml_dtypes

    rng = np.random.default_rng(29)
    x = (rng.standard_normal((640, 8192)) * 3).astype(np.float32)
    x[:, rng.choice(8192, 8, replace=False)] *= 100.0
    x.reshape(-1)[rng.choice(x.size, 16, replace=False)] = [np.nan, np.inf, -np.inf, -0.0] * 4
    return x.astype(ml_dtypes.bfloat16)


def _clear():
    lastaxis.make_lastaxis_stat_group_kernel.cache_clear()
    lastaxis.make_lastaxis_asym_row_kernel.cache_clear()
    lastaxis.make_lastaxis_group_kernel.cache_clear()
    tiles.make_tile_kernel.cache_clear()
    kq._PLANS.clear()


@pytest.fixture
def fresh():
    """Plans and kernels built from scratch (CENTRED_UNITS set by a test is read when a plan
    is built), and dropped after the test."""
    _clear()
    yield
    _clear()


@pytest.mark.parametrize("name, kw", SCHEMES)
def test_deep(fresh, big_bf16, name, kw):
    x = big_bf16.copy()
    x[:128, :128] = 0  # an all-zero group / tile
    x[128:256, 128:256] = (x[128:256, 128:256].astype(np.float32) * 1e-28).astype(x.dtype)  # scales below 2^-80
    check_gpu(x, resolve_scheme(name, **kw))


@pytest.mark.parametrize("name, kw", SCHEMES)
def test_shuffle_twin(fresh, monkeypatch, big_bf16, name, kw):
    check_with_shuffle_twin(monkeypatch, big_bf16[:256], resolve_scheme(name, **kw))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("name, kw", SCHEMES)
def test_inputs_and_unaligned(fresh, dtype, name, kw):
    xh, bits, kind = edge_input((96, 1024), dtype, seed=23)
    check_aligned_and_not(xh, bits, resolve_scheme(name, **kw), dtype)


STAT = [pytest.param("int4_asym", {}, 2, id="int4_asym"), pytest.param("int8_centred", {}, 2, id="int8_centred_k2"),
        pytest.param("int8_centred", {}, 4, id="int8_centred_k4"),
        pytest.param("int4", {"granularity": "group", "group_size": 64, "symmetric": False}, 2, id="int4_asym_g64"),
        pytest.param("int8", {"granularity": "group", "group_size": 32, "symmetric": False}, 2, id="int8_asym_g32")]


def _stat_specials(x):
    """Groups of 128 in row 300: zero, constant, a range that overflows float32 (the halves'
    scale), all negative, tiny (below the reciprocal's range), one NaN, +inf only, a negative
    NaN, -inf and +inf."""
    r = x[300].astype(np.float32)
    g = np.arange(128)
    r[0:128] = 0
    r[128:256] = 2.5
    r[256:384] = np.where(g % 2 == 0, 3.0e38, -3.0e38)
    r[384:512] = -np.linspace(1, 7, 128)
    r[512:640] = np.linspace(-1, 1, 128) * 1e-30
    r[640:768] = np.where(g == 3, np.nan, r[640:768])
    r[768:896] = np.where(g == 5, np.inf, 1.0)
    r[896:1024] = np.where(g == 127, -np.nan, np.linspace(-1, 2, 128))  # a NaN with its sign bit set
    r[1024:1152] = np.where(g == 2, -np.inf, np.where(g == 9, np.inf, 0.5))
    x[300] = r.astype(x.dtype)
    return x


@pytest.mark.parametrize("name, kw, cu", STAT)
def test_stat_groups_deep_and_twin(fresh, monkeypatch, big_bf16, name, kw, cu):
    """lastaxis_stat_groups at 640 x 8192 bfloat16 (deep threads), CENTRED_UNITS 2 and 4,
    special groups; then the shuffle's twin."""
    monkeypatch.setattr(kq, "CENTRED_UNITS", cu)
    kq._PLANS.clear()
    sch = resolve_scheme(name, **kw)
    x = _stat_specials(big_bf16.copy())
    plan = kq.get_plan(x.shape, 1, sch)
    assert [k.py_func.__name__ for k, _, _, _ in plan.launches] == ["lastaxis_stat_groups"]
    check_gpu(x, sch)
    check_with_shuffle_twin(monkeypatch, x[256:512], sch)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("name, kw, cu", STAT)
def test_stat_groups_inputs_and_unaligned(fresh, monkeypatch, dtype, name, kw, cu):
    monkeypatch.setattr(kq, "CENTRED_UNITS", cu)
    kq._PLANS.clear()
    xh, bits, kind = edge_input((96, 1024), dtype, seed=31)
    check_aligned_and_not(xh, bits, resolve_scheme(name, **kw), dtype)
