"""Stochastic rounding through the 16-byte-unit kernels on a real GPU, at real sizes, with
CuPy arrays in and out: the compiled ``stoch`` variants of ``lastaxis`` (warp
shuffles, vector loads, several units per thread) against the NumPy reference, bit for bit.

Runs only with NQDQ_TEST_GPU=1 (``pytest -m gpu``); tests/test_stochastic_lastaxis.py runs the
same kernels in the simulator.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

from helpers.gpu import gpu_cupy_or_skip  # noqa: E402

cp = gpu_cupy_or_skip()

import nqdq.gpu.quantize.plan as kq
from nqdq.gpu.quantize.choices import KernelChoices, PerTensor  # noqa: E402
from nqdq.reference import quantize as ref  # noqa: E402
from nqdq.reference.packing import pack_codes  # noqa: E402
from nqdq.schemes import resolve_scheme  # noqa: E402

from helpers.data import edge_data  # noqa: E402
from helpers.gpu import check_gpu, host  # noqa: E402
from helpers.kernels import POISON, UNIT_KERNELS, assert_same  # noqa: E402

SEED = 2**63 + 2**40 + 12345
SCHEMES = ["fp8_row", "int8_row", "fp8_1x128", "mxfp8", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4", "int4_group", "nvfp4",
           "fp8_tensor", "int8_asym", "int4_asym", "int8_centred"]
KINDS = {"float32": 0, "bfloat16": 1, "float16": 2}


def _data(shape, seed):
    """Gaussian data (per-row magnitudes over 2^-8 .. 2^8), outlier columns, and NaN / inf /
    -0 in a few groups."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp2(rng.uniform(-8, 8, (shape[0], 1)))).astype(np.float32)
    x[:, rng.choice(shape[1], 8, replace=False)] *= 100.0
    x.reshape(-1)[rng.choice(x.size, 16, replace=False)] = [np.nan, np.inf, -np.inf, -0.0] * 4
    return x


@pytest.fixture(scope="module")
def big_640x8192():
    return _data((640, 8192), 21).astype(ml_dtypes.bfloat16)


@pytest.fixture(scope="module")
def big_1000x7168():
    return _data((1000, 7168), 22).astype(ml_dtypes.bfloat16)


def _assert_fast(shape, kind, sch):
    names = {k.py_func.__name__ for k, _, _, _ in kq.get_plan(shape, kind, sch, stoch=True).launches}
    assert UNIT_KERNELS & names, names


@pytest.mark.parametrize("name", SCHEMES)
def test_sr_640x8192(big_640x8192, name):
    """bf16 640 x 8192: the deep paths (several units per thread)."""
    sch = resolve_scheme(name)
    _assert_fast(big_640x8192.shape, 1, sch)
    check_gpu(big_640x8192, sch, seed=SEED)


@pytest.mark.parametrize("name", SCHEMES)
def test_sr_1000x7168(big_1000x7168, name):
    sch = resolve_scheme(name)
    _assert_fast(big_1000x7168.shape, 1, sch)
    check_gpu(big_1000x7168, sch, seed=7)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", ["fp8_row", "fp8_1x128", "mxfp8", "mxfp6_e3m2", "mxfp4", "int4_group", "nvfp4", "int8_asym",
                                  "int8_centred"])
def test_sr_f32_f16(name, dtype):
    x = _data((256, 4096), 23).astype(dtype)
    sch = resolve_scheme(name)
    _assert_fast(x.shape, KINDS[dtype], sch)
    check_gpu(x, sch, seed=SEED)


@pytest.mark.parametrize("design, launches", [(PerTensor.TWO_PASS, 3), (PerTensor.AMAX_IN_GROUPS, 2)])
def test_sr_nvfp4_three_launches_and_parts(big_640x8192, design, launches):
    """NVFP4's S_enc from finalize (three launches) and from the amax partials."""
    choices = KernelChoices(per_tensor=design)
    sch = resolve_scheme("nvfp4")
    assert len(kq.get_plan(big_640x8192.shape, 1, sch, stoch=True, choices=choices).launches) == launches
    check_gpu(big_640x8192, sch, seed=SEED, choices=choices)


@pytest.mark.parametrize("name", ["nvfp4", "fp8_tensor"])
def test_sr_one_launch_grid(name):
    """64 x 7168: the one-launch kernels whose blocks share the tensor amax (quantize.grid)."""
    x = _data((64, 7168), 24).astype(ml_dtypes.bfloat16)
    sch = resolve_scheme(name)
    assert len(kq.get_plan(x.shape, 1, sch, stoch=True).launches) == 1
    check_gpu(x, sch, seed=SEED)


@pytest.mark.parametrize("name", ["fp8_row", "mxfp4", "int4_asym", "nvfp4"])
def test_sr_shuffle_twin(fresh_plans, big_640x8192, name):
    """The same kernels with the warp shuffle replaced by the simulator's shared-memory twin."""
    fresh_plans.setattr(kq, "SHFL", False)
    check_gpu(big_640x8192[:128], resolve_scheme(name), seed=SEED)


@pytest.mark.parametrize("name", ["fp8_row", "mxfp6_e2m3", "int8_centred"])
def test_sr_unaligned_view(name):
    """A view one element into a buffer (not 16-byte aligned): the element-by-element loads."""
    xh = edge_data((96, 1024), seed=13).astype(ml_dtypes.bfloat16)
    flat = cp.empty(xh.size + 1, np.uint16)
    view = flat[1:].reshape(xh.shape)
    view[...] = cp.asarray(xh.view(np.uint16))
    assert view.data.ptr % 16 != 0
    check_gpu(xh, resolve_scheme(name), seed=SEED, x_dev=view, dtype="bfloat16")


def _codes_and_scales(x_bf16, sch, **kw):
    """The kernels' codes and scales (bf16 bits in, outputs poisoned first) against the
    reference's, bit for bit; ``kw``: quantize's scale= / threads=."""
    got = kq.quantize(cp.asarray(x_bf16.view(np.uint16)), sch, dtype="bfloat16", seed=SEED, out_fill=POISON, **kw)
    want = ref.quantize(x_bf16.astype(np.float32), sch, seed=SEED, scale=kw.get("scale"))
    wcodes = want.codes if sch.code_bits == 8 else pack_codes(want.codes, sch.code_bits)
    assert_same(host(got.codes), wcodes, f"{sch.name} codes {kw}")
    assert_same(host(got.scales), want.scales, f"{sch.name} scales {kw}")


@pytest.mark.parametrize("name, kw, scale", [("fp8_tensor", {}, 0.05), ("e4m3", {"granularity": "row"}, None),
                                             ("int4", {"granularity": "tensor"}, 0.3)])
def test_sr_static_scales(big_640x8192, name, kw, scale):
    """Caller-given scales (static_encode's stochastic variant)."""
    sch = resolve_scheme(name, static_scale=True, **kw)
    if scale is None:
        scale = (np.random.default_rng(4).random(sch.scale_shape(big_640x8192.shape)) + 0.01).astype(np.float32)
    assert "static_encode" in {k.py_func.__name__ for k, _, _, _ in
                               kq.get_plan(big_640x8192.shape, 1, sch, stoch=True, static_scale=True).launches}
    _codes_and_scales(big_640x8192, sch, scale=scale)


@pytest.mark.parametrize("threads", [32, 64])
@pytest.mark.parametrize("name", ["mxfp4", "int4_group", "fp8_1x128", "nvfp4"])
def test_sr_block_size(big_1000x7168, threads, name):
    """Other block sizes (other geometries of the group kernels) give the reference's bits too."""
    _codes_and_scales(big_1000x7168[:200], resolve_scheme(name), threads=threads)
