"""Arrays on a GPU other than the current one (two GPUs; ``NQDQ_TEST_GPU=1``).

A call runs on its arrays' GPU whatever device is current (as PyTorch's device guard does),
returns arrays there, leaves the current device as it was, and is bit-exact against the
NumPy reference. Calls alternate between the GPUs so that every per-device cache (launch
entries, plans, the hot paths' remembered calls, the default stream's grid workspace, the
MoE op's pinned id-check words) is used from both. Public API only (it runs against older
trees too), but for the last test, which checks the path without CuPy through
``nqdq.gpu.runtime.devices`` in a fresh process. The routing without a GPU: tests/test_devices.py.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers.data import activation, topk_ids

import nqdq

ON_GPU = os.environ.get("NQDQ_TEST_GPU") == "1"


def _gpus() -> int:
    if not ON_GPU:
        return 0
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_gpus() < 2, reason="needs NQDQ_TEST_GPU=1 and two CUDA GPUs")]

# per-token and block scales, NVFP4's two-level scales (one launch at decode sizes, the
# default stream's workspace), dynamic per-tensor (one launch / cooperative), per-channel (clusters)
SCHEMES = ["fp8_row", "mxfp4", "nvfp4", "fp8_tensor", "int8_column", "fp8_128x128"]
SHAPES = [(64, 7168), (2048, 7168)]


def _same(got, want, what, dev):
    import cupy as cp

    if want is None:
        assert got is None, what
        return
    assert isinstance(got, cp.ndarray) and got.device.id == dev, (what, type(got), getattr(got, "device", None))
    g, w = got.get(), np.asarray(want)
    assert g.shape == w.shape and g.dtype == w.dtype, (what, g.shape, w.shape)
    np.testing.assert_array_equal(g.reshape(-1).view(np.uint8), w.reshape(-1).view(np.uint8), err_msg=what)


def _check(q, ref, what, dev):
    for f in ("codes", "scales", "zero_points", "tensor_scale", "means"):
        _same(getattr(q, f), getattr(ref, f), f"{what} {f}", dev)


def _on(dev, host_bits):
    import cupy as cp

    with cp.cuda.Device(dev):
        return cp.asarray(host_bits)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", SCHEMES)
def test_quantize_runs_on_the_arrays_gpu(name, shape):
    import cupy as cp

    rng = np.random.default_rng(11)
    for rnd in range(3):  # the first call plans; the next ones take the hot path on each GPU
        for dev, cur in ((1, 0), (0, 0), (0, 1), (1, 1)):
            xh = activation(rng, shape)
            x = _on(dev, xh.view(np.uint16))
            with cp.cuda.Device(cur):
                q = nqdq.quantize(x, name, dtype="bfloat16")
                assert cp.cuda.runtime.getDevice() == cur
            _check(q, nqdq.quantize(xh, name, device="cpu"), f"{name} {shape} x on {dev}, {cur} current, round {rnd}",
                   dev)  # fmt: skip
            with cp.cuda.Device(cur):
                y = nqdq.dequantize(q)
            assert y.device.id == dev
            np.testing.assert_array_equal(y.get(), nqdq.dequantize(nqdq.quantize(xh, name, device="cpu")))


def test_layouts_and_a_cuda_array_interface_on_the_second_gpu():
    import cupy as cp

    rng = np.random.default_rng(3)
    xh = activation(rng, (300, 4096))
    ref = nqdq.quantize(xh, "mxfp4", device="cpu", scale_layout="nv_128x4")

    class Wrapped:  # only the CUDA array interface: its device comes from the pointer
        def __init__(self, a):
            self.__cuda_array_interface__ = a.__cuda_array_interface__
            self._keep = a

    x = _on(1, xh.view(np.uint16))
    with cp.cuda.Device(0):
        for arg in (x, Wrapped(x)):
            q = nqdq.quantize(arg, "mxfp4", dtype="bfloat16", scale_layout="nv_128x4")
            assert cp.cuda.runtime.getDevice() == 0
            _same(q.codes, ref.codes, "codes", 1)
            _same(q.scales, ref.scales, "nv_128x4 scales", 1)
            _same(q.with_layout("linear").scales, ref.with_layout("linear").scales, "linear scales", 1)


@pytest.mark.parametrize("scheme", ["fp8_row", "mxfp4"])
def test_fused_ops_run_on_the_arrays_gpu(scheme):
    import cupy as cp

    rng = np.random.default_rng(5)
    xh, rh = activation(rng, (96, 5120)), activation(rng, (96, 5120))
    wh = rng.uniform(0.5, 1.5, 5120).astype(np.float32)
    ref, ref_res = nqdq.fused.rmsnorm_quantize(xh, wh, scheme, residual=rh, device="cpu")
    for dev in (1, 0, 1):
        x, r = _on(dev, xh.view(np.uint16)), _on(dev, rh.view(np.uint16))
        w = _on(dev, wh)
        with cp.cuda.Device(1 - dev):
            q, new_res = nqdq.fused.rmsnorm_quantize(x, w, scheme, residual=r, dtype="bfloat16")
            assert cp.cuda.runtime.getDevice() == 1 - dev
        _check(q, ref, f"rmsnorm+res+{scheme} on {dev}", dev)
        _same(new_res, np.asarray(ref_res).view(np.uint16), "new residual", dev)
    x1, w0 = _on(1, xh.view(np.uint16)), _on(0, wh)
    with pytest.raises(ValueError, match="x is on GPU 1 and weight on GPU 0"):
        nqdq.fused.rmsnorm_quantize(x1, w0, scheme, dtype="bfloat16")


@pytest.mark.parametrize("tokens", [16, 1024])  # one launch (no sort); the sort with its id check
def test_moe_sort_runs_on_the_arrays_gpu(tokens):
    import cupy as cp

    rng = np.random.default_rng(9)
    xh = activation(rng, (tokens, 2048))
    ids_h = topk_ids(rng, tokens, 64, 4, np.int32)
    ref, ref_perm, ref_off = nqdq.fused.moe_sort_quantize(xh, ids_h, 64, "mxfp4", device="cpu")
    for rnd in range(3):
        for dev in (1, 0):
            x, ids = _on(dev, xh.view(np.uint16)), _on(dev, ids_h)
            for check in (True, False):
                with cp.cuda.Device(1 - dev):
                    q, perm, off = nqdq.fused.moe_sort_quantize(x, ids, 64, "mxfp4", dtype="bfloat16", check_ids=check)
                _check(q, ref, f"moe {tokens} on {dev} round {rnd} check {check}", dev)
                _same(perm, ref_perm, "perm", dev)
                _same(off, ref_off, "offsets", dev)
            bad_h = ids_h.copy()
            bad_h[tokens // 2, 1] = 64
            bad = _on(dev, bad_h)
            with cp.cuda.Device(1 - dev), pytest.raises(ValueError, match="expert_ids must lie in"):
                nqdq.fused.moe_sort_quantize(x, bad, 64, "mxfp4", dtype="bfloat16")


def test_matmul_runs_on_the_operands_gpu():
    import cupy as cp

    rng = np.random.default_rng(2)
    a = rng.standard_normal((128, 512)).astype(np.float32)
    b = rng.standard_normal((256, 512)).astype(np.float32)
    want = nqdq.matmul(nqdq.quantize(a, "int8_row"), nqdq.quantize(b, "int8_row"))
    got = {}
    for dev in (1, 0):
        qa, qb = (nqdq.quantize(_on(dev, m), "int8_row") for m in (a, b))
        with cp.cuda.Device(1 - dev):
            c = nqdq.matmul(qa, qb)
        assert c.device.id == dev
        got[dev] = c.get()
    np.testing.assert_array_equal(got[1], got[0])  # one kernel, the same bits on either GPU
    # the float32 epilogue against the float64 reference rounded once (as tests/test_matmul_gpu.py)
    np.testing.assert_allclose(got[1], want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


_NO_CUPY = r"""
import sys
sys.modules["cupy"] = None  # as if CuPy were not installed: Numba arrays, libcuda's pointer query
import numpy as np
from numba import cuda
import nqdq
from nqdq.gpu.runtime import devices as _devices

x = np.random.default_rng(4).standard_normal((64, 7168)).astype(np.float32)
ref = nqdq.quantize(x, "nvfp4", device="cpu")
with cuda.gpus[1]:
    d = cuda.to_device(x)
assert _devices.ordinal_of(d) == 1, _devices.ordinal_of(d)
for cur in (0, 1, 0):
    with cuda.gpus[cur]:
        q = nqdq.quantize(d, "nvfp4")
        assert _devices.current() == cur
    assert _devices.ordinal_of(q.codes) == 1
    assert np.array_equal(q.codes.copy_to_host(), ref.codes)
    assert np.array_equal(q.scales.copy_to_host().view(np.uint8), ref.scales.view(np.uint8))
    ts = q.tensor_scale
    ts = ts.copy_to_host() if hasattr(ts, "copy_to_host") else ts
    assert np.array_equal(np.atleast_1d(ts).view(np.uint8), np.atleast_1d(ref.tensor_scale).view(np.uint8))
print("exact on GPU 1")
"""


def test_numba_arrays_without_cupy_run_on_their_gpu():
    """Without CuPy: the device from libcuda's cuPointerGetAttribute (ctypes), the switch by
    Numba's ``gpus[n]``, outputs as Numba arrays on the input's GPU (a fresh process, CuPy
    blocked)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _NO_CUPY], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ))  # fmt: skip
    assert r.returncode == 0 and "exact on GPU 1" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
