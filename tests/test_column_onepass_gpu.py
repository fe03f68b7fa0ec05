"""The one-pass per-channel kernels on a real GPU, selected by ``choices=``: the shared-memory
ring (``column_ring``, ``PerChannel.RING``) with several chunks per stripe (P > 1), so blocks
wait for each other through the workspace (the simulator runs only P = 1,
tests/test_column_ring.py), and the single-chunk kernel (``columns.column_onepass``), bit for
bit against the NumPy reference: every stripe width, rows and channel counts that fill no
block or stripe, NaN / inf / all-zero / subnormal channels, every input dtype, 8-bit int /
fp8 / 4-bit codes, repeated calls (the workspace is zeroed per call) and CUDA-graph replays.

Runs only with NQDQ_TEST_GPU=1 on a machine with a CUDA GPU and CuPy (``pytest -m gpu``).
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

from helpers.gpu import gpu_cupy_or_skip  # noqa: E402

cp = gpu_cupy_or_skip()

import nqdq.gpu.quantize.column_ring as column_ring
import nqdq.gpu.quantize.plan as kq
from nqdq.gpu.quantize.choices import KernelChoices, PerChannel  # noqa: E402
from nqdq.schemes import resolve_scheme  # noqa: E402

from helpers.data import column_data  # noqa: E402
from helpers.gpu import check_calls_and_graph, check_gpu, check_unaligned  # noqa: E402
from helpers.kernels import KINDS  # noqa: E402


RING = KernelChoices(per_channel=PerChannel.RING)
SINGLE = KernelChoices(per_channel=PerChannel.SINGLE_CHUNK)


def _names_and_p(shape, dtype, sch=None, choices=RING):
    """The plan's kernel names and the ring's chunks a stripe (P; 1 for other kernels)."""
    plan = kq.get_plan(shape, KINDS[dtype], sch or resolve_scheme("int8_column"), choices=choices)
    names = [k.py_func.__name__ for k, _, _, _ in plan.launches]
    return names, (plan.launches[0][3][4] if names == ["column_ring"] else 1)


@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((4096, 2048), ml_dtypes.bfloat16),  # 128 threads, W = 16: P = 64 chunks of 64 rows, 16 stripes
        ((3001, 1000), ml_dtypes.bfloat16),  # short last chunk; 125 units: the last stripe partial
        ((2000, 512), np.float32),  # f32: 4 channels per unit
        ((2, 1500, 776), np.float16),  # N-D, f16 (97 units)
        ((20000, 256), ml_dtypes.bfloat16),  # tall: narrower stripes
        ((40000, 64), ml_dtypes.bfloat16),  # taller, narrow: W = 4
    ],
)
def test_ring_multichunk_exact(shape, dtype):
    names, P = _names_and_p(shape, dtype)
    assert names == ["column_ring"] and P > 1
    x = column_data(shape, seed=shape[-1]).astype(dtype)
    check_gpu(x, resolve_scheme("int8_column"), choices=RING)


@pytest.mark.parametrize("name, kw", [("e4m3", {"granularity": "column"}), ("int4", {"granularity": "column"})])
def test_ring_formats(name, kw):
    """fp8 (the paired cvt encode) and packed 4-bit codes (e2m1 / e5m2: the simulator)."""
    x = column_data((2500, 1536), seed=3).astype(ml_dtypes.bfloat16)
    check_gpu(x, resolve_scheme(name, **kw), choices=RING)


@pytest.mark.parametrize("shape", [(64, 7168), (1, 4096)])
def test_single_chunk(shape):
    """Decode sizes: the single-chunk kernel, automatically (no cluster for rows a block holds,
    no ring of a single chunk) and chosen; one launch, no workspace."""
    assert _names_and_p(shape, ml_dtypes.bfloat16, choices=None)[0] == ["column_onepass"]
    assert _names_and_p(shape, ml_dtypes.bfloat16, choices=SINGLE)[0] == ["column_onepass"]
    check_gpu(column_data(shape, seed=5).astype(ml_dtypes.bfloat16), resolve_scheme("int8_column"))


@pytest.mark.parametrize("shape, dtype", [((8192, 8192), ml_dtypes.bfloat16), ((16384, 7168), ml_dtypes.bfloat16),
                                          ((3000, 4000), np.float32), ((1, 5000, 1032), np.float16)])
@pytest.mark.parametrize("force_wait", [False, True])
def test_ring_issue_shapes(fresh_plans, shape, dtype, force_wait):
    """The shared-memory ring at the issue's sizes (P = 128 / 256 chunks a stripe), odd
    shapes, and with the wait path (every item held arrives first) on every item."""
    if force_wait:  # the plan's ring kernel built with the wait path on every item
        fresh_plans.setattr(column_ring, "make_column_ring_kernel",
                            functools.partial(column_ring.make_column_ring_kernel, force_wait=True))
    names, P = _names_and_p(shape, dtype)
    assert names == ["column_ring"] and P > 1
    rng = np.random.default_rng(shape[-1])
    x = (rng.standard_normal(shape) * np.exp2(rng.uniform(-8, 8, shape[-1]))).astype(dtype)
    x.reshape(-1, shape[-1])[7, 3] = np.nan
    x.reshape(-1, shape[-1])[:, 5] = 0
    check_gpu(x, resolve_scheme("int8_column"), choices=RING)


@pytest.mark.parametrize("name", ["int8_column", "e4m3"])
def test_ring_unaligned_input(name):
    """An input 2 bytes past a 16-byte boundary (a flat buffer's [1:], reshaped): the ring's
    element-load staging (``stage_sync``) instead of cp.async, P > 1."""
    sch = resolve_scheme(name, **({} if name == "int8_column" else {"granularity": "column"}))
    names, P = _names_and_p((3000, 1024), ml_dtypes.bfloat16, sch)
    assert names == ["column_ring"] and P > 1
    check_unaligned(column_data((3000, 1024), seed=11).astype(ml_dtypes.bfloat16), sch, choices=RING)


def test_ring_repeated_calls_and_graph():
    """The workspace is scratch of each call, zeroed in its sequence: calls after a first
    one (whose workspace ends non-zero), and a captured CUDA graph replayed on new data."""
    sch = resolve_scheme("int8_column")
    rng = np.random.default_rng(2)
    shape = (4096, 2048)
    new = [(rng.standard_normal(shape) * np.exp2(rng.uniform(-6, 6, shape[-1]))).astype(ml_dtypes.bfloat16)
           for _ in range(5)]  # fmt: skip
    check_calls_and_graph(sch, new[:3], new[3:], choices=RING)
