"""One-launch dynamic per-tensor and NVFP4 quantization on a GPU: many blocks waiting for
each other's amax (``nqdq.kernels._grid``), bit-exact against the NumPy reference through
both launch paths (the plan's generated CuPy runner, with its per-call zeroed workspace,
and the general one), repeated, on concurrent streams, and replayed from a CUDA graph.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

from _helpers import gpu_cupy_or_skip  # noqa: E402

cp = gpu_cupy_or_skip()

import nqdq  # noqa: E402
import nqdq.kernels.quantize as kq  # noqa: E402
from nqdq.schemes import resolve_scheme  # noqa: E402

from test_api_gpu_path import _check, _check_graph_replays  # noqa: E402
from test_kernels import edge_data  # noqa: E402
from test_kernels_gpu import check_gpu  # noqa: E402

NAMES = ["fp8_tensor", "nvfp4"]
KIND = {np.dtype(np.float32): 0, np.dtype(ml_dtypes.bfloat16): 1, np.dtype(np.float16): 2}


def _act(rng, shape, dtype=ml_dtypes.bfloat16):
    x = rng.standard_normal(shape).astype(np.float32)
    x *= np.exp2(rng.uniform(-6, 6, (shape[0], 1))).astype(np.float32)
    return x.astype(dtype)


def _plan(shape, dtype, name):
    return kq.get_plan(shape, KIND[np.dtype(dtype)], resolve_scheme(name))


@pytest.mark.parametrize("name", NAMES)
def test_decode_sizes_take_one_launch_of_many_blocks(name):
    assert kq.GRID_ONE_LAUNCH
    plan = _plan((64, 7168), ml_dtypes.bfloat16, name)
    assert len(plan.launches) == 1
    grid = plan.launches[0][1]
    assert 1 < grid <= kq._sm_count()
    assert len(_plan((1024, 7168), ml_dtypes.bfloat16, name).launches) >= 2  # too large: streaming


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "shape,dtype",
    [((64, 7168), ml_dtypes.bfloat16), ((7, 7168), ml_dtypes.bfloat16), ((1, 16), ml_dtypes.bfloat16),
     ((128, 7168), ml_dtypes.bfloat16), ((33, 4096), np.float16), ((64, 2048), np.float32),
     ((130, 8192), ml_dtypes.bfloat16)],
    ids=str,
)  # fmt: skip
def test_one_launch_edge_values(name, shape, dtype):
    x = edge_data(shape, seed=shape[0] + shape[1]).astype(dtype)
    check_gpu(x, resolve_scheme(name))


@pytest.mark.parametrize("name", NAMES)
def test_one_launch_repeated_through_the_runner(name):
    """The generated runner zeroes the workspace per call: ten calls in a row, each exact."""
    rng = np.random.default_rng(11)
    for _ in range(10):
        xh = _act(rng, (64, 7168))
        q = nqdq.quantize(cp.asarray(xh.view(np.uint16)), name, dtype="bfloat16")
        _check(q, nqdq.quantize(xh, name, device="cpu"), name)


@pytest.mark.parametrize("name", NAMES)
def test_one_launch_on_concurrent_streams(name):
    """Calls of one plan in flight on two streams at once each have their own workspace."""
    rng = np.random.default_rng(12)
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    data = [[_act(rng, (64, 7168)) for _ in range(8)] for _ in streams]
    devs = [[cp.asarray(x.view(np.uint16)) for x in d] for d in data]
    cp.cuda.Device().synchronize()
    results = [[], []]
    for i in range(8):
        for s, st in enumerate(streams):
            with st:
                results[s].append(nqdq.quantize(devs[s][i], name, dtype="bfloat16"))
    cp.cuda.Device().synchronize()
    for s in range(2):
        for i in range(8):
            _check(results[s][i], nqdq.quantize(data[s][i], name, device="cpu"), f"{name} stream {s} call {i}")


@pytest.mark.parametrize("name", NAMES)
def test_one_launch_replays_from_a_cuda_graph(name):
    rng = np.random.default_rng(13)
    x = cp.asarray(_act(rng, (64, 7168)).view(np.uint16))
    nqdq.quantize(x, name, dtype="bfloat16")
    _check_graph_replays(x, name, rng, trials=3)
