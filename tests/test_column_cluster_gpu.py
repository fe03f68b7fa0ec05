"""The thread-block-cluster kernel of per-channel scales (``column_cluster.column_cluster``,
``PerChannel.CLUSTER``) on a real GPU (sm_90+): clusters of 16 blocks (8 on GPUs of fewer SMs) that combine a
stripe's amax through each other's shared memory, in both of GPU_CONFIGS, bit for bit
against the NumPy reference at the issue's shapes and odd ones (partial stripes, rows that
fill no block, every input dtype), NaN / inf / zero channels, fp8 and packed 4-bit codes,
an unaligned input, the launch outside the CuPy runner (``FastKernel.launch``), repeated
calls and a captured CUDA graph; a cluster launch the driver refuses (the plan without
clusters: the ring, exact).

Runs only with NQDQ_TEST_GPU=1 on a machine with a CUDA GPU and CuPy (``pytest -m gpu``).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

from helpers.gpu import gpu_cupy_or_skip  # noqa: E402

cp = gpu_cupy_or_skip()

import nqdq  # noqa: E402
import nqdq.gpu.quantize.column_cluster as column_cluster
import nqdq.gpu.quantize.plan as kq
from nqdq.gpu.quantize.choices import KernelChoices, PerChannel  # noqa: E402
from nqdq.reference import quantize as ref  # noqa: E402
from nqdq.schemes import resolve_scheme  # noqa: E402

from helpers.data import column_data  # noqa: E402
from helpers.gpu import check_calls_and_graph, check_gpu, check_unaligned  # noqa: E402
from helpers.kernels import KINDS  # noqa: E402

if not column_cluster.available():
    pytest.skip("thread-block clusters need sm_90+", allow_module_level=True)


CLUSTER = KernelChoices(per_channel=PerChannel.CLUSTER)


def _taken(shape, dtype, sch, choices=CLUSTER):
    """The plan's launch, asserted to be column_cluster with this GPU's cluster size where
    cluster_geometry takes the shape here (clusters of 16 on an H100 / H200: every shape
    below; a shape a cluster of 8 cannot take skips); chosen, and automatically."""
    vec = 4 if dtype == np.float32 else 8
    CL = column_cluster.cluster_size_for(kq._sm_count())
    g = column_cluster.cluster_geometry(int(np.prod(shape[:-1])), shape[-1] // vec, vec, kq._sm_count())
    if g is None:
        pytest.skip(f"not a cluster shape for clusters of {CL}")
    plan = kq.get_plan(shape, KINDS[dtype], sch, choices=choices)
    assert [k.py_func.__name__ for k, _, _, _ in plan.launches] == ["column_cluster"]
    assert kq.get_plan(shape, KINDS[dtype], sch).rule == "column_cluster"
    ((k, grid, block, args),) = plan.launches
    assert k.nqdq_cluster == CL == g[0] and grid % CL == 0 and block == g[1]
    return k, grid, block


def _channels(shape, dtype, seed):
    """Channels of very different magnitudes, a NaN, an inf, an all-zero channel."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp2(rng.uniform(-8, 8, shape[-1]))).astype(np.float32)
    v = x.reshape(-1, shape[-1])
    v[v.shape[0] // 3, 3] = np.nan
    v[v.shape[0] - 1, 9] = -np.inf
    v[:, 5] = 0
    return x.astype(dtype)


@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((8192, 8192), ml_dtypes.bfloat16),  # the issue's: 8-unit stripes, 512 rows a block (16 blocks)
        ((16384, 7168), ml_dtypes.bfloat16),  # the issue's: the second config, 1024 rows a block
        ((12000, 2056), ml_dtypes.bfloat16),  # the second config; rows fill no block, the last stripe 1 unit
        ((8000, 7168), ml_dtypes.bfloat16),  # rows that fill no block
        ((1000, 4104), ml_dtypes.bfloat16),  # 513 units: the last stripe partial; rows fill no block
        ((3000, 4000), np.float32),  # f32: 4 channels a unit
        ((1, 5000, 1032), np.float16),  # N-D, f16
        ((129, 7168), ml_dtypes.bfloat16),  # just over one block's rows: 32-unit stripes
    ],
)
def test_cluster_exact(shape, dtype):
    _taken(shape, dtype, resolve_scheme("int8_column"))
    check_gpu(_channels(shape, dtype, shape[-1]), resolve_scheme("int8_column"), choices=CLUSTER)


def test_cluster_edge_channels():
    """The simulator's edge data (every channel kind of column_data) at a GPU size."""
    shape = (4096, 2048)
    _taken(shape, ml_dtypes.bfloat16, resolve_scheme("int8_column"))
    check_gpu(column_data(shape, seed=7).astype(ml_dtypes.bfloat16), resolve_scheme("int8_column"), choices=CLUSTER)


@pytest.mark.parametrize("name, kw", [("e4m3", {"granularity": "column"}), ("int4", {"granularity": "column"}),
                                      ("e5m2", {"granularity": "column"})])
def test_cluster_formats(name, kw):
    """fp8 (the paired cvt encode) and packed 4-bit codes."""
    sch = resolve_scheme(name, **kw)
    _taken((2500, 1536), ml_dtypes.bfloat16, sch)
    check_gpu(_channels((2500, 1536), ml_dtypes.bfloat16, 3), sch, choices=CLUSTER)


def test_cluster_unaligned_input():
    """An input 2 bytes past a 16-byte boundary: the element loads."""
    sch = resolve_scheme("int8_column")
    shape = (3000, 1024)
    _taken(shape, ml_dtypes.bfloat16, sch)
    check_unaligned(_channels(shape, ml_dtypes.bfloat16, 11), sch, choices=CLUSTER)


def test_cluster_numpy_device_cuda():
    """A NumPy input with device="cuda" (the launch by FastKernel.launch, not the CuPy runner)."""
    x = _channels((2048, 3072), np.float32, 5)
    sch = resolve_scheme("int8_column")
    _taken(x.shape, np.float32, sch, choices=None)  # (nqdq.quantize: the automatic choice)
    q = nqdq.quantize(x, scheme="int8_column", device="cuda")
    want = ref.quantize(x, sch)
    assert (np.asarray(q.codes).view(np.int8) == want.codes).all()
    assert (np.asarray(q.scales).view(np.uint32) == want.scales.view(np.uint32)).all()


def test_cluster_repeated_calls_and_graph():
    """Calls after a first one, and a captured CUDA graph (the cluster launch by
    cuLaunchKernelEx in the runner's sequence) replayed on new data."""
    sch = resolve_scheme("int8_column")
    shape = (4096, 2048)
    _taken(shape, ml_dtypes.bfloat16, sch)
    new = [_channels(shape, ml_dtypes.bfloat16, seed) for seed in (20, 21, 22, 30, 31)]
    check_calls_and_graph(sch, new[:3], new[3:], choices=CLUSTER)


@pytest.fixture
def refusing_clusters(fresh_plans):
    """Plans of clusters of 32 blocks, more than any GPU takes, so that the driver refuses the
    launch (CUDA_ERROR_INVALID_CLUSTER_SIZE, 912) as it refuses a cluster that no GPC of this
    process can hold; no refusal recorded before (launch._REFUSED emptied, restored after),
    fresh plans and remembered calls before and after. Yields the launch module."""
    import nqdq.api as api
    from nqdq.gpu.runtime import launch

    fresh_plans.setattr(launch, "_REFUSED", set())
    fresh_plans.setattr(column_cluster, "cluster_size_for", lambda sms: 32)
    api.clear_fast_path()
    yield launch
    api.clear_fast_path()


def test_refused_cluster_launch_falls_back(refusing_clusters):
    """The first call of a plan whose cluster launch the driver refuses warns once and runs
    the plan without clusters; later calls (the CuPy runner remembered by nqdq.quantize, and
    a NumPy input with device="cuda": the plan's execute) plan no cluster kernel. Every result
    exact."""
    launch = refusing_clusters
    sch = resolve_scheme("int8_column")
    shape = (4096, 2048)
    ((k, _g, _b, _a),) = kq.get_plan(shape, KINDS[ml_dtypes.bfloat16], sch).launches
    assert k.py_func.__name__ == "column_cluster" and k.nqdq_cluster == 32
    for i in range(3):
        xh = _channels(shape, ml_dtypes.bfloat16, 40 + i)
        x = cp.asarray(xh.view(np.uint16))
        if i == 0:
            with pytest.warns(RuntimeWarning, match="refused a cluster launch"):
                q = nqdq.quantize(x, "int8_column", dtype="bfloat16")
            assert launch._REFUSED == {"cluster"} and not column_cluster.available()
            names = [k.py_func.__name__ for k, _, _, _ in kq.get_plan(shape, KINDS[ml_dtypes.bfloat16], sch).launches]
            assert "column_cluster" not in names, names
        else:
            q = nqdq.quantize(x, "int8_column", dtype="bfloat16")
        want = ref.quantize(xh.astype(np.float32), sch)
        assert (cp.asnumpy(q.codes).view(np.int8) == want.codes).all(), f"call {i}"
        assert (cp.asnumpy(q.scales).view(np.uint32) == want.scales.view(np.uint32)).all(), f"call {i}"
    xh = _channels((2048, 3072), np.float32, 5)
    q = nqdq.quantize(xh, "int8_column", device="cuda")
    want = ref.quantize(xh, sch)
    assert (np.asarray(q.codes).view(np.int8) == want.codes).all()
    assert (np.asarray(q.scales).view(np.uint32) == want.scales.view(np.uint32)).all()
