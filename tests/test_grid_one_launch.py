"""One-launch dynamic per-tensor and NVFP4 quantization (``nqdq.gpu.quantize.grid``): the plan
takes it for inputs that fit in one block per SM, and its codes and scales are the
reference's bit for bit. Under the simulator a grid is one block (blocks run one after
another there, so a multi-block wait could not end); tests/test_grid_one_launch_gpu.py runs
the multi-block wait on a GPU.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nqdq.gpu.quantize.plan as kq
from nqdq.gpu.quantize import runners
from nqdq.gpu.quantize.choices import KernelChoices, PerTensor
from nqdq.gpu.quantize.grid import SYNC_WORDS
from nqdq.gpu.runtime.target import SIMULATOR
from nqdq.schemes import resolve_scheme

from helpers.data import edge_data
from helpers.kernels import check
from helpers.probes import grid_max_kernel

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

ONE_LAUNCH = {"fp8_tensor": "static_encode", "nvfp4": "lastaxis_groups"}
DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]
ONE = KernelChoices(per_tensor=PerTensor.ONE_LAUNCH)
TWO_PASS = KernelChoices(per_tensor=PerTensor.TWO_PASS)


def _launches(shape, dtype, name, choices=None):
    kind = {np.dtype(np.float32): 0, np.dtype(ml_dtypes.bfloat16): 1, np.dtype(np.float16): 2}[np.dtype(dtype)]
    plan = kq.get_plan(shape, kind, resolve_scheme(name), choices=choices)
    return [(k.py_func.__name__, g) for k, g, _b, _a in plan.launches]


@pytest.mark.skipif(not SIMULATOR, reason="simulator geometry (one block)")
@pytest.mark.parametrize("name", sorted(ONE_LAUNCH))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_small_inputs_take_one_launch(name, dtype):
    assert _launches((4, 64), dtype, name) == [(ONE_LAUNCH[name], 1)]
    assert len(_launches((4, 64), dtype, name, TWO_PASS)) == 3  # the streaming paths: amax kernel first


@pytest.mark.parametrize("name", sorted(ONE_LAUNCH))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(4, 64), (1, 16), (3, 32)])
def test_one_launch_bit_exact_edge_values(name, dtype, shape):
    x = edge_data(shape, seed=shape[0] * 7 + shape[1]).astype(dtype)
    check(x, resolve_scheme(name), x_ref=x.astype(np.float32), choices=ONE)


@pytest.mark.parametrize("name", sorted(ONE_LAUNCH))
@pytest.mark.parametrize(
    "fill", [0.0, -0.0, np.nan, np.inf, 1e-40, 3.0e38], ids=["zero", "negzero", "nan", "inf", "subnormal", "huge"]
)
def test_one_launch_uniform_inputs(name, fill):
    """All-equal inputs: amax 0 (scale 1), NaN / inf amax (non-finite scale for fp8_tensor,
    NVFP4's finite amax ignoring them), subnormal and near-overflow amaxes."""
    x = np.full((2, 32), fill, np.float32)
    x[1, 5] = -1.5  # one ordinary value among them
    check(x.astype(ml_dtypes.bfloat16), resolve_scheme(name), x_ref=x.astype(ml_dtypes.bfloat16).astype(np.float32),
          choices=ONE)


@pytest.mark.parametrize("name", sorted(ONE_LAUNCH))
def test_one_launch_matches_streaming_path(name):
    """The one-launch and the two-pass paths agree bit for bit on random data."""
    x = (np.random.default_rng(3).standard_normal((4, 64)) * 5).astype(ml_dtypes.bfloat16)
    sch = resolve_scheme(name)
    a = kq.quantize(x, sch, choices=ONE)
    b = kq.quantize(x, sch, choices=TWO_PASS)
    for f in ("codes", "scales", "tensor_scale"):
        if getattr(a, f) is not None:
            assert np.asarray(getattr(a, f)).tobytes() == np.asarray(getattr(b, f)).tobytes(), f


@pytest.mark.skipif(not SIMULATOR, reason="the simulator runs a grid's blocks one after another")
@pytest.mark.parametrize("name", sorted(ONE_LAUNCH))
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
def test_one_launch_grid_run_block_after_block(name, dtype, fresh_plans):
    """A one-launch grid of 3 blocks, which the simulator runs one after another (as a GPU
    whose SMs other grids hold would): block 0 publishes its max, waits, finds blocks 1 and
    2 not done, computes their maxima from their units itself (quantize.lastaxis._GRID_MAX_SRC)
    and encodes its own units; blocks 1 and 2, when they run, find every block done. The
    tensor's largest magnitude is in block 2's units, so block 0's codes match the reference
    only if it took block 2's max."""
    fresh_plans.setattr(kq, "_sm_count", lambda: 3)
    assert _launches((12, 256), dtype, name, ONE) == [(ONE_LAUNCH[name], 3)]
    x = np.random.default_rng(28).standard_normal((12, 256)).astype(np.float32)
    x[11, 200] = 40.0  # (the last block's units)
    x = x.astype(dtype)
    check(x, resolve_scheme(name), x_ref=x.astype(np.float32), choices=ONE)


@pytest.mark.skipif(not SIMULATOR, reason="a one-block grid (the GPU file runs many blocks)")
def test_grid_max_leaves_its_workspace_zero():
    """The kernel that used a grid_max workspace hands it on as it found it (all zero), so
    the next kernel of the stream can use it without a memset (quantize.grid.StreamWorkspaces)."""
    k = grid_max_kernel
    sync = np.zeros(SYNC_WORDS, np.int32)
    for v in (7, 0x7F800000, 3):  # again and again on the same words: each call sees zeros
        out = np.full(1, -1, np.int32)
        k[1, 32](np.array([v], np.int32), sync, out)
        assert out[0] == v
        assert sync.tolist() == [0] * SYNC_WORDS


def test_capture_test_counts_an_error_as_capturing():
    """The plans' capture test (quantize's one-launch runner, the MoE plan): a stream that is
    capturing (any non-zero cudaStreamCaptureStatus) or whose query fails (the legacy stream
    while another stream captures) gets the graph-safe path; only status 0 is a direct call."""
    from types import SimpleNamespace

    def is_capturing(st):
        if st == 3:
            raise RuntimeError("cudaErrorStreamCaptureImplicit")
        return {1: 0, 2: 1, 4: 2}[st]

    cp = SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(streamIsCapturing=is_capturing)))
    capturing = runners.capture_test(cp)
    assert [capturing(st) for st in (1, 2, 3, 4)] == [False, True, True, True]


@pytest.mark.parametrize("name", sorted(ONE_LAUNCH))
def test_one_launch_is_plain_after_a_refused_cooperative_launch(name, fresh_plans):
    """The one-launch kernels are launched plainly (their wait needs no co-resident grid:
    quantize.grid.wait_done), so they stay the plan after the driver refused a cooperative launch
    (which rules out quantize.tensor_resident's kernels), exact."""
    from nqdq.gpu.runtime import launch

    fresh_plans.setattr(launch, "_REFUSED", {"cooperative"})
    plan = kq.get_plan((4, 64), 1, resolve_scheme(name))
    ((k, *_),) = plan.launches
    assert k.py_func.__name__ == ONE_LAUNCH[name] and not launch.cooperative(k) and plan.ex_kinds == set()
    x = edge_data((4, 64), seed=3).astype(ml_dtypes.bfloat16)
    check(x, resolve_scheme(name), x_ref=x.astype(np.float32))
