"""One-launch dynamic per-tensor and NVFP4 quantization on a GPU: many blocks waiting for
each other's amax (``nqdq.gpu.quantize.grid``), bit-exact against the NumPy reference through
both launch paths (the plan's generated CuPy runner, with its stream's workspace that every
call leaves zero, and the general one), repeated, on concurrent streams, on per-thread
default streams, and replayed from a CUDA graph beside direct calls.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

from helpers.gpu import gpu_cupy_or_skip  # noqa: E402

cp = gpu_cupy_or_skip()

import nqdq  # noqa: E402
import nqdq.gpu.quantize.plan as kq
from nqdq.gpu.quantize import runners  # noqa: E402
from nqdq.schemes import resolve_scheme  # noqa: E402

from helpers.data import activation, edge_data  # noqa: E402
from helpers.gpu import check_gpu, check_graph_replays, check_quantized, check_repeated  # noqa: E402

NAMES = ["fp8_tensor", "nvfp4"]
KIND = {np.dtype(np.float32): 0, np.dtype(ml_dtypes.bfloat16): 1, np.dtype(np.float16): 2}


def _plan(shape, dtype, name):
    return kq.get_plan(shape, KIND[np.dtype(dtype)], resolve_scheme(name))


@pytest.mark.parametrize("name", NAMES)
def test_decode_sizes_take_one_launch_of_many_blocks(name):
    plan = _plan((64, 7168), ml_dtypes.bfloat16, name)
    assert len(plan.launches) == 1
    grid = plan.launches[0][1]
    assert 1 < grid <= kq._sm_count()
    large = [k.py_func.__name__ for k, _g, _b, _a in _plan((1024, 7168), ml_dtypes.bfloat16, name).launches]
    # too large: fp8_tensor's cooperative kernel (tests/test_tensor_resident_gpu.py), NVFP4's streaming kernels
    assert large == ["tensor_resident"] if name == "fp8_tensor" else len(large) >= 2


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
    """Ten calls in a row on one stream's workspace, each exact."""
    check_repeated(name, (64, 7168), 10, 11)


@pytest.mark.parametrize("name", NAMES)
def test_one_launch_on_concurrent_streams(name):
    """Calls of one plan in flight on two streams at once each have their own workspace."""
    rng = np.random.default_rng(12)
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    data = [[activation(rng, (64, 7168)) for _ in range(8)] for _ in streams]
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
            check_quantized(results[s][i], nqdq.quantize(data[s][i], name, device="cpu"), f"{name} stream {s} call {i}")


@pytest.mark.parametrize("name", NAMES)
def test_one_launch_on_many_streams(name):
    """Eight streams with calls of a grid of about one block an SM in flight at once: more
    grids than fit the SMs together, launched plainly, so grids may be partly resident while
    others hold the SMs (their waits end: quantize.grid.wait_done); every result exact."""
    shape = (130, 8192)
    plan = _plan(shape, ml_dtypes.bfloat16, name)
    ((k, grid, _b, _a),) = plan.launches
    assert not getattr(k, "nqdq_cooperative", False) and plan.ex_kinds == set()
    assert grid > kq._sm_count() // 2
    rng = np.random.default_rng(14)
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(8)]
    data = [[activation(rng, shape) for _ in range(6)] for _ in streams]
    devs = [[cp.asarray(x.view(np.uint16)) for x in d] for d in data]
    cp.cuda.Device().synchronize()
    results = [[] for _ in streams]
    for i in range(6):
        for s, st in enumerate(streams):
            with st:
                results[s].append(nqdq.quantize(devs[s][i], name, dtype="bfloat16"))
    cp.cuda.Device().synchronize()
    for s in range(len(streams)):
        for i in range(6):
            check_quantized(results[s][i], nqdq.quantize(data[s][i], name, device="cpu"), f"{name} stream {s} call {i}")
    check_repeated(name, (64, 7168), 3, 15)  # the runner and the workspace, repeated


@pytest.mark.parametrize("name", NAMES)
def test_one_launch_partly_resident(name):
    """A 64x7168 call while another grid holds all but FREE_SMS SMs until the call is done
    (helpers.gpu.sm_hog), the plain launch: more blocks than the free SMs hold at once, so the
    grid is partly resident. The resident blocks compute the missing blocks' maxima from
    their units themselves (_rowwise_kernels._GRID_MAX_SRC), so the call ends (a grid
    barrier would wait for ever: the hog would give up after about two seconds) with the
    reference's codes and scales."""
    from helpers.gpu import FREE_SMS, sm_hog

    shape = (64, 7168)
    rng = np.random.default_rng(28)
    x = activation(rng, shape)
    dev = cp.asarray(x.view(np.uint16))
    ((k, grid, block, _a),) = _plan(shape, ml_dtypes.bfloat16, name).launches
    assert not getattr(k, "nqdq_cooperative", False)
    assert grid > FREE_SMS * (2048 // block)  # (2048 threads an SM at most)
    nqdq.quantize(dev, name, dtype="bfloat16")  # (compiled before the hog holds the SMs)
    st = cp.cuda.Stream(non_blocking=True)
    with sm_hog(st) as done:
        with st:
            q = nqdq.quantize(dev, name, dtype="bfloat16")
        done()
    check_quantized(q, nqdq.quantize(x, name, device="cpu"), name)


@pytest.mark.parametrize("name", NAMES)
def test_one_launch_replays_from_a_cuda_graph(name):
    rng = np.random.default_rng(13)
    x = cp.asarray(activation(rng, (64, 7168)).view(np.uint16))
    nqdq.quantize(x, name, dtype="bfloat16")
    check_graph_replays(x, name, rng, trials=3)


def test_grid_max_many_blocks_leave_the_workspace_zero():
    """Many blocks: every block gets the grid's max, and the last to leave zeroes the words."""
    from numba import cuda

    from nqdq.gpu.quantize.grid import SYNC_WORDS

    from helpers.probes import grid_max_kernel as k

    n = kq._sm_count()
    rng = np.random.default_rng(5)
    sync = cuda.to_device(np.zeros(SYNC_WORDS, np.int32))
    for _ in range(5):
        vals = rng.integers(0, 0x7F800001, n, dtype=np.int32)
        out = cuda.device_array(n, np.int32)
        k[n, 128](cuda.to_device(vals), sync, out)
        assert (out.copy_to_host() == vals.max()).all()
        assert sync.copy_to_host().tolist() == [0] * SYNC_WORDS


@pytest.mark.parametrize("name", NAMES)
def test_one_launch_stream_workspace_is_zero_between_calls(name):
    """Direct calls use their stream's workspace (no memset), which each call leaves zero."""
    rng = np.random.default_rng(14)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        for _ in range(4):
            xh = activation(rng, (64, 7168))
            q = nqdq.quantize(cp.asarray(xh.view(np.uint16)), name, dtype="bfloat16")
            check_quantized(q, nqdq.quantize(xh, name, device="cpu"), name)
    s.synchronize()
    ws = runners._STREAM_WS._by_ptr[s.ptr][1]
    assert ws.get().tolist() == [0] * ws.size
    assert "ws = _ws(cs, _DEV)" in kq.get_plan((64, 7168), 1, resolve_scheme(name)).cupy_runner().source


@pytest.mark.parametrize("name", NAMES)
def test_one_launch_graph_replays_beside_direct_calls(name):
    """A graph captured on stream a holds a workspace of its own: replayed on stream b while
    direct calls run on a (whose workspace is a's), every result is exact."""
    rng = np.random.default_rng(15)
    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    xg = cp.asarray(activation(rng, (64, 7168)).view(np.uint16))
    with a:
        nqdq.quantize(xg, name, dtype="bfloat16")  # warm a's pool (no cudaMalloc in the capture)
        a.synchronize()
        a.begin_capture()
        qg = nqdq.quantize(xg, name, dtype="bfloat16")
        graph = a.end_capture()
    for trial in range(4):
        xh_g = activation(rng, (64, 7168))
        xg[...] = cp.asarray(xh_g.view(np.uint16))
        cp.cuda.Device().synchronize()
        data = [activation(rng, (64, 7168)) for _ in range(6)]
        devs = [cp.asarray(x.view(np.uint16)) for x in data]
        cp.cuda.Device().synchronize()
        direct = []
        for i in range(6):
            if i == 1:
                graph.launch(b)
            with a:
                direct.append(nqdq.quantize(devs[i], name, dtype="bfloat16"))
        cp.cuda.Device().synchronize()
        check_quantized(qg, nqdq.quantize(xh_g, name, device="cpu"), f"{name} replay {trial}")
        for i in range(6):
            check_quantized(direct[i], nqdq.quantize(data[i], name, device="cpu"), f"{name} trial {trial} call {i}")


@pytest.mark.parametrize("name", NAMES)
def test_one_launch_per_thread_default_streams(name):
    """The per-thread default stream has one handle for every host thread; each thread's
    calls get a workspace of their own (a shared one would mix two grids' arrivals)."""
    import threading

    rng = np.random.default_rng(16)
    data = [[activation(rng, (64, 7168)) for _ in range(6)] for _ in range(2)]
    devs = [[cp.asarray(x.view(np.uint16)) for x in d] for d in data]
    cp.cuda.Device().synchronize()
    results = [[], []]
    barrier = threading.Barrier(2)

    def work(t):
        with cp.cuda.Stream.ptds:
            barrier.wait()
            for x in devs[t]:
                results[t].append(nqdq.quantize(x, name, dtype="bfloat16"))
            cp.cuda.Stream.ptds.synchronize()

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    cp.cuda.Device().synchronize()
    for t in range(2):
        assert len(results[t]) == 6, f"thread {t} did not finish"
        for i in range(6):
            check_quantized(results[t][i], nqdq.quantize(data[t][i], name, device="cpu"), f"{name} thread {t} call {i}")
