"""The one-pass per-channel kernel (``_column_kernels.column_onepass``) on a real GPU:
several chunks per stripe (P > 1), so blocks wait for each other through the workspace
(the simulator runs only P = 1, tests/test_column_onepass.py), bit for bit against the
NumPy reference: every stripe width, rows and channel counts that fill no block or stripe,
NaN / inf / all-zero / subnormal channels, every input dtype, 8-bit int / fp8 / 4-bit
codes, repeated calls (the workspace is zeroed per call) and CUDA-graph replays.

Runs only with NQDQ_TEST_GPU=1 on a machine with a CUDA GPU and CuPy (``pytest -m gpu``).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

from _helpers import gpu_cupy_or_skip  # noqa: E402

cp = gpu_cupy_or_skip()

import nqdq.gpu.quantize.columns as column_kernels
import nqdq.gpu.quantize.plan as kq
from nqdq.schemes import resolve_scheme  # noqa: E402

from test_column_onepass import _column_data  # noqa: E402
from test_kernels import _KINDS as _KIND  # noqa: E402
from test_kernels_gpu import check_gpu  # noqa: E402


def _geometry(shape, dtype):
    """onepass_geometry's (NT, W, U, P, S) of one block per item, and the plan's kernel names."""
    plan = kq.get_plan(shape, _KIND[dtype], resolve_scheme("int8_column"))
    names = [k.py_func.__name__ for k, _, _, _ in plan.launches]
    vec = 4 if dtype == np.float32 else 8
    rows = int(np.prod(shape[:-1]))
    g = column_kernels.onepass_geometry(rows, shape[-1] // vec, kq._sm_count(), kq.COLUMN_ONEPASS_P_MAX, vec=vec)
    return g, names


@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((4096, 2048), ml_dtypes.bfloat16),  # 256 threads: P = 32 chunks of 128 rows, 8 stripes of 32 units
        ((3001, 1000), ml_dtypes.bfloat16),  # short last chunk; 125 units: the last stripe partial
        ((2000, 512), np.float32),  # f32: 4 channels per unit
        ((2, 1500, 776), np.float16),  # N-D, f16 (97 units)
        ((20000, 256), ml_dtypes.bfloat16),  # tall: 256 threads: W = 8, P = 40
        ((40000, 64), ml_dtypes.bfloat16),  # taller, narrow: 256 threads: W = 4
    ],
)
@pytest.mark.parametrize("pipe", [True, False, "ring"])
def test_onepass_multichunk_exact(onepass, shape, dtype, pipe):
    """The pipelined register kernel, the one-block-per-item one (where the pipelined
    geometry does not fit: here its items made one unit a thread) and the ring."""
    if pipe is False:
        onepass.setattr(column_kernels, "ONEPASS_PIPE_UNITS", 1)
    onepass.setattr(kq, "COLUMN_RING", pipe == "ring")
    plan = kq.get_plan(shape, _KIND[dtype], resolve_scheme("int8_column"))
    names = [k.py_func.__name__ for k, _, _, _ in plan.launches]
    if pipe == "ring":
        assert names == ["column_ring"]
    P = 1
    if names in (["column_onepass"], ["column_ring"]):
        P = plan.launches[0][3][4 if names == ["column_ring"] else 5]
    if P == 1:
        pytest.skip(f"no multi-chunk one pass at this block size: {names}")
    assert P > 1
    x = _column_data(shape, seed=shape[-1]).astype(dtype)
    check_gpu(x, resolve_scheme("int8_column"))


@pytest.mark.parametrize("ring", [False, True])
@pytest.mark.parametrize("name, kw", [("e4m3", {"granularity": "column"}), ("int4", {"granularity": "column"})])
def test_onepass_formats(onepass, name, kw, ring):
    """fp8 (the paired cvt encode) and packed 4-bit codes (e2m1 / e5m2: the simulator)."""
    onepass.setattr(kq, "COLUMN_RING", ring)
    x = _column_data((2500, 1536), seed=3).astype(ml_dtypes.bfloat16)
    check_gpu(x, resolve_scheme(name, **kw))


@pytest.mark.parametrize("shape", [(64, 7168), (1, 4096)])
def test_onepass_single_chunk(onepass, shape):
    """P = 1 on the GPU: no workspace, one launch."""
    g, names = _geometry(shape, ml_dtypes.bfloat16)
    assert names == ["column_onepass"] and g[3] == 1
    check_gpu(_column_data(shape, seed=5).astype(ml_dtypes.bfloat16), resolve_scheme("int8_column"))


@pytest.mark.parametrize("shape, dtype", [((8192, 8192), ml_dtypes.bfloat16), ((16384, 7168), ml_dtypes.bfloat16),
                                          ((3000, 4000), np.float32), ((1, 5000, 1032), np.float16)])
@pytest.mark.parametrize("force_wait", [False, True])
def test_ring_issue_shapes(onepass, shape, dtype, force_wait):
    """The shared-memory ring at the issue's sizes (P = 128 / 256 chunks a stripe), odd
    shapes, and with the wait path (every item held arrives first) on every item."""
    import nqdq.gpu.quantize.column_ring as column_ring

    onepass.setattr(kq, "COLUMN_RING", True)
    onepass.setattr(column_ring, "RING_FORCE_WAIT", force_wait)
    plan = kq.get_plan(shape, _KIND[dtype], resolve_scheme("int8_column"))
    assert [k.py_func.__name__ for k, _, _, _ in plan.launches] == ["column_ring"]
    assert plan.launches[0][3][4] > 1  # P
    rng = np.random.default_rng(shape[-1])
    x = (rng.standard_normal(shape) * np.exp2(rng.uniform(-8, 8, shape[-1]))).astype(dtype)
    x.reshape(-1, shape[-1])[7, 3] = np.nan
    x.reshape(-1, shape[-1])[:, 5] = 0
    check_gpu(x, resolve_scheme("int8_column"))


@pytest.mark.parametrize("name", ["int8_column", "e4m3"])
def test_ring_unaligned_input(onepass, name):
    """An input 2 bytes past a 16-byte boundary (a flat buffer's [1:], reshaped): the ring's
    element-load staging (``stage_sync``) instead of cp.async, P > 1."""
    onepass.setattr(kq, "COLUMN_RING", True)
    sch = resolve_scheme(name, **({} if name == "int8_column" else {"granularity": "column"}))
    shape = (3000, 1024)
    plan = kq.get_plan(shape, _KIND[ml_dtypes.bfloat16], sch)
    assert [k.py_func.__name__ for k, _, _, _ in plan.launches] == ["column_ring"]
    assert plan.launches[0][3][4] > 1  # P
    check_unaligned(_column_data(shape, seed=11).astype(ml_dtypes.bfloat16), sch)


def check_unaligned(x, sch):
    """check_gpu of bf16 ``x`` given as the device view 2 bytes past a 16-byte boundary (a
    flat buffer's [1:], reshaped)."""
    buf = cp.empty(x.size + 1, cp.uint16)
    buf[1:] = cp.asarray(x.view(np.uint16).reshape(-1))
    xd = buf[1:].reshape(x.shape)
    assert xd.data.ptr % 16 == 2
    check_gpu(x, sch, dtype="bfloat16", x_dev=xd)


def test_onepass_p_max_128(onepass):
    """The knob raises P: 65536 x 1024 bf16 (256 threads: W = 8, P = 128; needs >= 128 SMs)."""
    if kq._sm_count() < 128:
        pytest.skip("fewer than 128 SMs")
    onepass.setattr(kq, "COLUMN_ONEPASS_P_MAX", 128)
    g, _ = _geometry((65536, 1024), ml_dtypes.bfloat16)
    if g is None:
        pytest.skip("no one-pass geometry at this block size")
    assert g[3] > 64, g
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((65536, 1024)) * np.exp2(rng.uniform(-8, 8, 1024))).astype(ml_dtypes.bfloat16)
    check_gpu(x, resolve_scheme("int8_column"))


@pytest.mark.parametrize("ring", [False, True])
def test_onepass_repeated_calls_and_graph(onepass, ring):
    """The workspace is scratch of each call, zeroed in its sequence: calls after a first
    one (whose workspace ends non-zero), and a captured CUDA graph replayed on new data."""
    onepass.setattr(kq, "COLUMN_RING", ring)
    sch = resolve_scheme("int8_column")
    rng = np.random.default_rng(2)
    shape = (4096, 2048)
    new = [(rng.standard_normal(shape) * np.exp2(rng.uniform(-6, 6, shape[-1]))).astype(ml_dtypes.bfloat16)
           for _ in range(5)]  # fmt: skip
    check_calls_and_graph(sch, new[:3], new[3:])


def check_calls_and_graph(sch, calls, replays):
    """Each bf16 input of ``calls`` quantized in turn (check_gpu), then a CUDA graph captured
    on the last one and replayed on each of ``replays`` (written into the captured input,
    the outputs poisoned first), against the reference: 8-bit codes and the scales."""
    from nqdq.reference import quantize as ref

    for xh in calls:
        check_gpu(xh, sch)
    x = cp.asarray(calls[-1].view(np.uint16))
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        kq.quantize(x, sch, dtype="bfloat16")
        s.synchronize()
        s.begin_capture()
        q = kq.quantize(x, sch, dtype="bfloat16")
        graph = s.end_capture()
    for trial, xh in enumerate(replays):
        with s:
            x[...] = cp.asarray(xh.view(np.uint16))
            q.codes.fill(0x5A)
            q.scales.fill(0)
        graph.launch(s)
        s.synchronize()
        want = ref.quantize(xh.astype(np.float32), sch)
        assert (q.codes.get().view(np.int8) == want.codes).all(), f"replay {trial} codes"
        assert (q.scales.get().view(np.uint32) == want.scales.view(np.uint32)).all(), f"replay {trial} scales"
