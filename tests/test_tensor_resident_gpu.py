"""Dynamic per-tensor scales in one cooperative launch on a GPU (``nqdq.gpu.quantize.tensor_resident``):
a grid of one block an SM, part of the input held on chip across the grid's amax, bit-exact
against the NumPy reference at real sizes (all resident; resident + streamed rounds;
f32 / f16 / bf16; an unaligned view; other element formats), repeated through the plan's
runner, on concurrent streams beside the one-launch kernels, and replayed from a CUDA graph.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

from helpers.gpu import gpu_cupy_or_skip  # noqa: E402

cp = gpu_cupy_or_skip()

import nqdq  # noqa: E402
import nqdq.gpu.quantize.tensor_resident as tensor_resident
import nqdq.gpu.quantize.plan as kq
from nqdq.schemes import resolve_scheme  # noqa: E402

from helpers.data import activation, edge_data  # noqa: E402
from helpers.gpu import check_gpu, check_graph_replays, check_quantized, check_repeated  # noqa: E402

KIND = {np.dtype(np.float32): 0, np.dtype(ml_dtypes.bfloat16): 1, np.dtype(np.float16): 2}


def _launches(shape, dtype=ml_dtypes.bfloat16, name="fp8_tensor"):
    plan = kq.get_plan(shape, KIND[np.dtype(dtype)], resolve_scheme(name))
    return [(k.py_func.__name__, g, b) for k, g, b, _a in plan.launches]


NAMES = ["fp8_tensor"]


@pytest.fixture(autouse=True)
def fresh_plans():
    kq._PLANS.clear()
    yield
    kq._PLANS.clear()


@pytest.mark.parametrize("name", NAMES)
def test_large_inputs_take_one_cooperative_launch(name):
    assert tensor_resident.available()
    NT, UR, US, V = tensor_resident.resident_geometry()
    assert US > 0
    for shape in [(1024, 7168), (8192, 8192), (16384, 7168)]:
        assert _launches(shape, name=name) == [("tensor_resident", kq._sm_count(), NT)]
    assert [n for n, _g, _b in _launches((64, 7168), name=name)] == ["static_encode"]  # decode sizes: one launch
    assert _launches((8192, 8192), name="nvfp4")[0][0] != "tensor_resident"  # NVFP4: the streaming kernels


@pytest.mark.parametrize(
    "shape,dtype",
    [((256, 7168), ml_dtypes.bfloat16), ((4096, 7168), ml_dtypes.bfloat16), ((8192, 8192), ml_dtypes.bfloat16),
     ((1000, 5000), np.float16), ((6000, 6000), np.float32), ((3, 1 << 22), ml_dtypes.bfloat16)],
    ids=str,
)  # fmt: skip
@pytest.mark.parametrize("name", NAMES)
def test_bit_exact_edge_values(shape, dtype, name):
    x = edge_data(shape, seed=shape[0] + shape[1], scale=30.0).astype(dtype)
    check_gpu(x, resolve_scheme(name))


@pytest.mark.parametrize("name", NAMES)
def test_unaligned_view(name):
    """A 1-D view one element into its buffer: no 16-byte alignment, every load element by
    element, the shared units staged through registers."""
    n = 20_000_000
    xh = edge_data((n + 1,), seed=3).astype(ml_dtypes.bfloat16)
    xd = cp.asarray(xh.view(np.uint16))[1:]
    check_gpu(xh[1:], resolve_scheme(name), dtype="bfloat16", x_dev=xd)


@pytest.mark.parametrize("fmt", ["e5m2", "int8", "int4"])
def test_other_element_formats(fmt):
    x = edge_data((2048, 7168), seed=11).astype(ml_dtypes.bfloat16)
    check_gpu(x, resolve_scheme(fmt, granularity="tensor"))


@pytest.mark.parametrize("name", NAMES)
def test_repeated_through_the_runner(name):
    """Five calls in a row on one stream's grid workspace (left zero by each), each exact."""
    check_repeated(name, (4096, 7168), 5, 21)


@pytest.mark.parametrize("name", NAMES)
def test_concurrent_streams_beside_one_launch_kernels(name):
    """Calls in flight on two streams at once, and one-launch (non-cooperative, waiting)
    grids on a third: the cooperative grids start only when every block fits, so nothing
    waits for ever, and every result is exact."""
    rng = np.random.default_rng(22)
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(3)]
    big = [[activation(rng, (4096, 7168)) for _ in range(4)] for _ in range(2)]
    small = [activation(rng, (64, 7168)) for _ in range(8)]
    dev_big = [[cp.asarray(x.view(np.uint16)) for x in d] for d in big]
    dev_small = [cp.asarray(x.view(np.uint16)) for x in small]
    cp.cuda.Device().synchronize()
    got_big, got_small = [[], []], []
    for i in range(8):
        if i < 4:
            for s in range(2):
                with streams[s]:
                    got_big[s].append(nqdq.quantize(dev_big[s][i], name, dtype="bfloat16"))
        with streams[2]:
            got_small.append(nqdq.quantize(dev_small[i], name, dtype="bfloat16"))
    cp.cuda.Device().synchronize()
    for s in range(2):
        for i in range(4):
            check_quantized(got_big[s][i], nqdq.quantize(big[s][i], name, device="cpu"), f"stream {s} call {i}")
    for i in range(8):
        check_quantized(got_small[i], nqdq.quantize(small[i], name, device="cpu"), f"small call {i}")


@pytest.mark.parametrize("name", NAMES)
def test_replays_from_a_cuda_graph(name):
    """Captured (a cooperative kernel node), then replayed on new data in the same buffer."""
    rng = np.random.default_rng(23)
    x = cp.asarray(activation(rng, (4096, 7168)).view(np.uint16))
    check_graph_replays(x, name, rng, trials=3)


@pytest.fixture
def refusing(monkeypatch):
    """Cooperative grids of two blocks an SM (kq._sm_count doubled), which the driver refuses
    (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) as under an MPS thread limit; no refusal
    recorded before (launch._REFUSED emptied, restored after), fresh plans and remembered
    calls before and after. Yields (launch module, the real SM count)."""
    import nqdq.api as api
    from nqdq.gpu.runtime import launch

    monkeypatch.setattr(launch, "_REFUSED", set())
    sms = kq._sm_count()
    monkeypatch.setattr(kq, "_sm_count", lambda: 2 * sms)
    kq._PLANS.clear()
    api.clear_fast_path()
    yield launch, sms
    kq._PLANS.clear()
    api.clear_fast_path()


def test_refused_cooperative_launch_falls_back(refusing):
    """A grid larger than the device holds at once (here: two blocks an SM of a kernel that
    fits one) is refused by the driver (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE), as under an
    MPS thread limit: the call runs the two-pass plan instead, warns once, and later calls
    plan without the cooperative kernel; every result exact."""
    launch, sms = refusing
    rng = np.random.default_rng(31)
    for i in range(3):
        xh = activation(rng, (4096, 7168))
        x = cp.asarray(xh.view(np.uint16))
        if i == 0:
            assert _launches((4096, 7168))[0][:2] == ("tensor_resident", 2 * sms)
            with pytest.warns(RuntimeWarning, match="refused a cooperative launch"):
                q = nqdq.quantize(x, "fp8_tensor", dtype="bfloat16")
            assert launch._REFUSED == {"cooperative"} and not tensor_resident.available()
            names = [n for n, _g, _b in _launches((4096, 7168))]
            assert names[0] == "tensor_amax" and "tensor_resident" not in names, names
        else:
            q = nqdq.quantize(x, "fp8_tensor", dtype="bfloat16")
        check_quantized(q, nqdq.quantize(xh, "fp8_tensor", device="cpu"), f"call {i}")
    # a NumPy input on the GPU (the plan's execute): the same fallback
    xh = activation(rng, (2048, 7168))
    check_quantized(nqdq.quantize(xh, "fp8_tensor", device="cuda"), nqdq.quantize(xh, "fp8_tensor", device="cpu"),
                    "numpy")


def test_numba_launch_plans_no_cooperative_or_cluster_kernels():
    """NQDQ_FAST_LAUNCH=0 (every launch through Numba, which has neither attribute): the
    planner takes the two-pass per-tensor path and the cluster-free per-channel path, and
    the results are exact (a separate process: the switch is read at import)."""
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent('''
        import cupy as cp, ml_dtypes, numpy as np
        import nqdq, nqdq.gpu.quantize.plan as kq
        from nqdq.schemes import resolve_scheme
        rng = np.random.default_rng(5)
        for name, shape in [("fp8_tensor", (4096, 7168)), ("int8_column", (8192, 8192))]:
            xh = (rng.standard_normal(shape) * 3).astype(ml_dtypes.bfloat16)
            plan = kq.get_plan(shape, 1, resolve_scheme(name))
            names = [k.py_func.__name__ for k, *_ in plan.launches]
            assert not plan.ex_kinds and "tensor_resident" not in names and "column_cluster" not in names, names
            q = nqdq.quantize(cp.asarray(xh.view(np.uint16)), name, dtype="bfloat16")
            r = nqdq.quantize(xh, name, device="cpu")
            assert np.array_equal(cp.asnumpy(q.codes).view(np.uint8), np.asarray(r.codes).view(np.uint8)), name
            assert np.array_equal(cp.asnumpy(q.scales), np.asarray(r.scales)), name
            print(name, names)
    ''')
    env = dict(os.environ, NQDQ_FAST_LAUNCH="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "fp8_tensor" in out.stdout and "int8_column" in out.stdout


def test_refusal_inside_a_graph_capture(refusing):
    """The first call of a plan whose cooperative launch is refused, inside a CUDA-graph
    capture: the capture is invalidated (the driver's error reaches the caller, after the
    warning); the next capture records the fallback's launches and replays exactly."""
    rng = np.random.default_rng(32)
    xh = activation(rng, (4096, 7168))
    x = cp.asarray(xh.view(np.uint16))
    want = nqdq.quantize(xh, "fp8_tensor", device="cpu")
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        with pytest.warns(RuntimeWarning, match="refused a cooperative launch"):
            with pytest.raises(Exception, match="[Cc]apture"):
                nqdq.quantize(x, "fp8_tensor", dtype="bfloat16")
        with pytest.raises(Exception, match="[Cc]apture"):
            s.end_capture()
    cp.cuda.Device().synchronize()
    with s:
        s.begin_capture()
        q = nqdq.quantize(x, "fp8_tensor", dtype="bfloat16")
        g = s.end_capture()
        x[...] = cp.asarray(xh.view(np.uint16))
        g.launch()
    s.synchronize()
    check_quantized(q, want, "replayed")
