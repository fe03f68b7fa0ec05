"""The GPU test modules' gate (``gpu_cupy_or_skip``, called at module level before anything
imports CuPy) and their checks on a real GPU: the kernels on CuPy arrays against the NumPy
reference bit for bit, unaligned device views, repeated calls, CUDA-graph replays, a grid
under test left only a few SMs (``sm_hog``). CuPy is imported inside the functions, so this
module imports without it."""

from __future__ import annotations

import contextlib
import os

import ml_dtypes
import numpy as np
import pytest

import nqdq
import nqdq.gpu.quantize.plan as kq
from nqdq.reference import quantize as ref
from nqdq.reference.packing import pack_codes

from helpers.data import activation, edge_data
from helpers.kernels import POISON, assert_same


def gpu_cupy_or_skip():
    """CuPy, for a module of GPU tests (call it at module level): the whole module is
    skipped unless NQDQ_TEST_GPU=1, CuPy imports and a CUDA device is present."""
    if os.environ.get("NQDQ_TEST_GPU") != "1":
        pytest.skip("GPU tests need NQDQ_TEST_GPU=1 (and a CUDA GPU with CuPy)", allow_module_level=True)
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError
    except Exception:
        pytest.skip("no CUDA device", allow_module_level=True)
    return cp


FREE_SMS = 8  # SMs sm_hog leaves to the grid under test
_HOG_SRC = r"""
extern "C" __global__ void hog(const volatile int *flag, int *gave_up, long long limit) {
    extern __shared__ int s[];
    long long t0 = clock64();
    if (threadIdx.x == 0) {
        while (flag[0] == 0) {
            if (clock64() - t0 > limit) { atomicAdd(gave_up, 1); break; }
            __nanosleep(1000);
        }
    }
    s[threadIdx.x] = threadIdx.x;
    __syncthreads();
}
extern "C" __global__ void release(int *flag) { flag[0] = 1; }
"""


@contextlib.contextmanager
def sm_hog(stream, free=FREE_SMS, seconds=2.0):
    """A grid that holds all but ``free`` SMs of the current device (one block on each, with
    all the shared memory a block may have) until ``done()`` (yielded) is called: that
    launches, in ``stream`` (the grid under test's, after it), a kernel that releases the hog.
    So the grid under test has only ``free`` SMs until it ends. On leaving, the device is
    synchronized and the test fails if the hog gave up (about ``seconds`` of waiting, so a
    grid that cannot end without the held SMs fails the test instead of hanging it)."""
    import time

    import cupy as cp

    dev = cp.cuda.Device()
    attrs = dev.attributes
    mod = cp.RawModule(code=_HOG_SRC, options=("-std=c++14",))
    hog, release = mod.get_function("hog"), mod.get_function("release")
    smem = attrs["MaxSharedMemoryPerBlockOptin"]
    hog.max_dynamic_shared_size_bytes = smem
    flag, gave_up = cp.zeros(1, cp.int32), cp.zeros(1, cp.int32)
    clock_hz = attrs["ClockRate"] * 1e3
    hs = cp.cuda.Stream(non_blocking=True)
    hog((attrs["MultiProcessorCount"] - free,), (32,), (flag, gave_up, np.int64(seconds * clock_hz)),
        stream=hs, shared_mem=smem)
    time.sleep(0.05)  # the hog's blocks are on their SMs before the grid under test is launched
    released = []

    def done():
        release((1,), (1,), (flag,), stream=stream)
        released.append(True)

    try:
        yield done
    finally:
        if not released:
            done()
        dev.synchronize()
    assert int(gave_up.get()[0]) == 0, "the hog gave up waiting: the grid under test did not end without its SMs"


# ----------------------------------------------------------------------------- the kernels (plan.quantize)
def host(a):
    """A host copy of a CuPy, PyTorch (CUDA tensors have .cpu) or NumPy array."""
    if a is None:
        return None
    if hasattr(a, "get"):
        return a.get()
    return a.cpu().numpy() if hasattr(a, "cpu") else np.asarray(a)


def check_gpu(x_host, sch, *, dtype=None, seed=None, x_dev=None, choices=None):
    """Kernels (the designs of ``choices``, a ``KernelChoices``: default automatic) on a CuPy
    copy of ``x_host`` (bf16 as uint16 bits + dtype=) vs the reference."""
    import cupy as cp

    if x_dev is None:
        if x_host.dtype == ml_dtypes.bfloat16:
            x_dev, dtype = cp.asarray(x_host.view(np.uint16)), "bfloat16"
        else:
            x_dev = cp.asarray(x_host)
    got = kq.quantize(x_dev, sch, dtype=dtype, seed=seed, out_fill=POISON, choices=choices)
    assert isinstance(got.codes, cp.ndarray) and isinstance(got.scales, cp.ndarray)
    xr = x_host.astype(np.float32)
    want = ref.quantize(xr, sch, seed=seed)
    wcodes = want.codes if sch.code_bits == 8 else pack_codes(want.codes, sch.code_bits)
    assert_same(host(got.codes), wcodes, f"{sch.name} codes")
    assert_same(host(got.scales), want.scales, f"{sch.name} scales")
    assert_same(host(got.zero_points), want.zero_points, f"{sch.name} zero points")
    assert_same(host(got.tensor_scale), want.tensor_scale, f"{sch.name} tensor scale")
    assert_same(host(got.means), want.means, f"{sch.name} means", nan_equal=True)
    deq = kq.dequantize(got, sch, xr.shape, out_fill=POISON)
    assert isinstance(deq, cp.ndarray)
    assert_same(host(deq), ref.dequantize(want, sch, xr.shape), f"{sch.name} dequantized", nan_equal=True)


def check_with_shuffle_twin(monkeypatch, x, sch):
    """check_gpu with the warp shuffle replaced by its shared-memory twin (what the
    simulator runs)."""
    monkeypatch.setattr(kq, "SHFL", False)
    kq._PLANS.clear()
    try:
        check_gpu(x, sch)
    finally:
        kq._PLANS.clear()


def edge_input(shape, dtype, seed):
    """(edge data as ``dtype``, the dtype of its bits on the device, the kernels' input kind)."""
    x = edge_data(shape, seed=seed)
    if dtype == "bfloat16":
        return x.astype(ml_dtypes.bfloat16), np.uint16, 1
    xh = x.astype(dtype)
    return xh, xh.dtype, (0 if dtype == "float32" else 2)


def check_aligned_and_not(xh, bits, sch, dtype):
    """check_gpu from an aligned copy and from a view one element into a buffer (not
    16-byte aligned: the element-by-element loads)."""
    import cupy as cp

    flat = cp.empty(xh.size + 1, bits)
    view = flat[1:].reshape(xh.shape)
    view[...] = cp.asarray(xh.view(bits))
    assert view.data.ptr % 16 != 0
    for xd in (cp.asarray(xh.view(bits)), view):
        check_gpu(xh, sch, x_dev=xd, dtype="bfloat16" if dtype == "bfloat16" else None)


def check_unaligned(x, sch, choices=None):
    """check_gpu of bf16 ``x`` given as the device view 2 bytes past a 16-byte boundary (a
    flat buffer's [1:], reshaped)."""
    import cupy as cp

    buf = cp.empty(x.size + 1, cp.uint16)
    buf[1:] = cp.asarray(x.view(np.uint16).reshape(-1))
    xd = buf[1:].reshape(x.shape)
    assert xd.data.ptr % 16 == 2
    check_gpu(x, sch, dtype="bfloat16", x_dev=xd, choices=choices)


def check_calls_and_graph(sch, calls, replays, choices=None):
    """Each bf16 input of ``calls`` quantized in turn (check_gpu; the designs of ``choices``),
    then a CUDA graph captured on the last one and replayed on each of ``replays`` (written
    into the captured input, the outputs poisoned first), against the reference: 8-bit codes
    and the scales."""
    import cupy as cp

    for xh in calls:
        check_gpu(xh, sch, choices=choices)
    x = cp.asarray(calls[-1].view(np.uint16))
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        kq.quantize(x, sch, dtype="bfloat16", choices=choices)
        s.synchronize()
        s.begin_capture()
        q = kq.quantize(x, sch, dtype="bfloat16", choices=choices)
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


# ----------------------------------------------------------------------------- nqdq.quantize's GPU path
def _same(got, want, what):
    if want is None:
        assert got is None, what
        return
    g = got.get() if hasattr(got, "get") else np.asarray(got)
    w = np.asarray(want)
    assert g.shape == w.shape and g.dtype == w.dtype, (what, g.shape, w.shape, g.dtype, w.dtype)
    # bit patterns, flattened (0-d arrays cannot change itemsize in a view)
    np.testing.assert_array_equal(g.reshape(-1).view(np.uint8), w.reshape(-1).view(np.uint8), err_msg=what)


def check_quantized(q, want, name):
    """``q`` (device or host arrays) is ``want`` bit for bit: every array, scheme, shape, dtype."""
    for f in ("codes", "scales", "zero_points", "tensor_scale", "means"):
        _same(getattr(q, f), getattr(want, f), f"{name} {f}")
    assert q.scheme == want.scheme and tuple(q.shape) == tuple(want.shape) and q.dtype == want.dtype


def check_graph_replays(x, name, rng, trials):
    """Capture nqdq.quantize(x) in a CUDA graph (``x`` a bf16 activation of (rows, cols)
    as uint16 bits), then, ``trials`` times, put new data in the same input buffer, poison
    the codes, replay and compare with the reference."""
    import cupy as cp

    s = cp.cuda.Stream(non_blocking=True)
    with s:
        nqdq.quantize(x, name, dtype="bfloat16")  # warm the memory pool of this stream (CuPy's
        s.synchronize()  # free lists are per stream: no cudaMalloc inside the capture)
        s.begin_capture()
        q = nqdq.quantize(x, name, dtype="bfloat16")
        graph = s.end_capture()
    for trial in range(trials):
        xh = activation(rng, x.shape)
        with s:  # on the replay's stream: s is non-blocking, so the null stream's work is unordered with it
            x[...] = cp.asarray(xh.view(np.uint16))
            q.codes.fill(0xA5)
        graph.launch(s)
        s.synchronize()
        check_quantized(q, nqdq.quantize(xh, name, device="cpu"), f"{name} replay {trial}")


def check_repeated(name, shape, calls, seed):
    """``calls`` calls in a row of ``name`` on new bf16 data of ``shape`` through the plan's
    runner (one stream's grid workspace, left zero by each), each exact."""
    import cupy as cp

    rng = np.random.default_rng(seed)
    for _ in range(calls):
        xh = activation(rng, shape)
        q = nqdq.quantize(cp.asarray(xh.view(np.uint16)), name, dtype="bfloat16")
        check_quantized(q, nqdq.quantize(xh, name, device="cpu"), name)
