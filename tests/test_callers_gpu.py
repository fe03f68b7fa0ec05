"""Every caller gets results in its own library, on its own stream, bit-exact (GPU only).

PyTorch and JAX tensors (each dtype), CuPy arrays: ``quantize`` and ``dequantize`` against
the NumPy reference, the result types, a producer kernel on a side stream followed by an
nqdq call with no synchronization between, ``stream=``, and capture in ``torch.cuda.graph``
replayed with new data. Skipped without ``NQDQ_TEST_GPU=1`` or without the library.
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

import nqdq

ON_GPU = os.environ.get("NQDQ_TEST_GPU") == "1"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason="needs NQDQ_TEST_GPU=1 and a CUDA GPU")]

SCHEMES = ["fp8_row", "nvfp4", "mxfp4", "int8_asym", "fp8_tensor", "fp8_1x128"]
DTYPES = ["bfloat16", "float16", "float32"]


def _torch():
    return pytest.importorskip("torch")


def _data(shape, dtype, seed):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 3
    return x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)


def _bits(a):
    """Bytes of a result of any library, for exact comparison."""
    if hasattr(a, "detach"):  # PyTorch
        import torch

        return a.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().copy()
    if hasattr(a, "get"):
        a = a.get()
    a = np.ascontiguousarray(np.asarray(a))
    return a.reshape(-1).view(np.uint8)


def _same(q, ref):
    for name in ("codes", "scales", "zero_points", "tensor_scale", "means"):
        a, b = getattr(q, name), getattr(ref, name)
        assert (a is None) == (b is None), name
        if a is not None:
            np.testing.assert_array_equal(_bits(a), _bits(b), err_msg=name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_torch_in_torch_out(scheme, dtype):
    torch = _torch()
    x = _data((64, 512), dtype, seed=SCHEMES.index(scheme) * 3 + DTYPES.index(dtype))
    ref = nqdq.quantize(x, scheme)
    xt = torch.from_numpy(x.view(np.int16) if dtype == "bfloat16" else x).cuda()
    if dtype == "bfloat16":
        xt = xt.view(torch.bfloat16)
    for _ in range(3):  # the first call plans, the later ones take the remembered runner
        q = nqdq.quantize(xt, scheme)
        assert isinstance(q.codes, torch.Tensor) and q.codes.device == xt.device
        assert isinstance(q.scales, torch.Tensor)
        _same(q, ref)
    for out in ("float32", "bfloat16", "float16"):
        y = nqdq.dequantize(q, out)
        want = nqdq.dequantize(ref, out)
        assert isinstance(y, torch.Tensor)
        assert y.dtype == {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[out]
        np.testing.assert_array_equal(_bits(y), _bits(want))


@pytest.mark.parametrize("dtype", DTYPES)
def test_jax_in_jax_out(dtype):
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    x = _data((32, 256), dtype, seed=7)
    xj = jnp.asarray(x)
    for scheme in ("fp8_row", "nvfp4", "int8_asym"):
        q = nqdq.quantize(xj, scheme)
        assert isinstance(q.codes, jax.Array) and isinstance(q.scales, jax.Array)
        _same(q, nqdq.quantize(x, scheme))
        y = nqdq.dequantize(q, "bfloat16")
        assert isinstance(y, jax.Array) and y.dtype == jnp.bfloat16
        np.testing.assert_array_equal(_bits(y), _bits(nqdq.dequantize(nqdq.quantize(x, scheme), "bfloat16")))


def test_cupy_stays_cupy():
    cp = pytest.importorskip("cupy")
    x = _data((16, 256), "float16", seed=3)
    q = nqdq.quantize(cp.asarray(x), "mxfp4")
    assert isinstance(q.codes, cp.ndarray)
    _same(q, nqdq.quantize(x, "mxfp4"))


def test_torch_side_stream_producer_orders_without_sync():
    """A long producer kernel on a side stream, then nqdq on that stream (PyTorch's current
    one inside ``torch.cuda.stream``): the call sees the producer's result."""
    torch = _torch()
    side = torch.cuda.Stream()
    x = torch.randn(4096, 7168, device="cuda", dtype=torch.bfloat16)
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # ~tens of ms of device time ahead of the producer
        y = x * 2 + 1  # the producer
        q = nqdq.quantize(y, "fp8_row")
        z = nqdq.dequantize(q, "float32")
    torch.cuda.synchronize()
    ref = nqdq.quantize(y.float().cpu().numpy().astype(ml_dtypes.bfloat16), "fp8_row")
    _same(q, ref)
    assert z.shape == y.shape


def test_stream_argument():
    torch = _torch()
    cp = pytest.importorskip("cupy")
    s = torch.cuda.Stream()
    x = torch.randn(256, 1024, device="cuda", dtype=torch.float16)
    ref = nqdq.quantize(x.cpu().numpy(), "nvfp4")
    for stream in (s, s.cuda_stream):
        q = nqdq.quantize(x, "nvfp4", stream=stream)
        s.synchronize()
        _same(q, ref)
    cs = cp.cuda.Stream(non_blocking=True)
    q = nqdq.quantize(cp.asarray(x.cpu().numpy()), "nvfp4", stream=cs)
    cs.synchronize()
    _same(q, ref)
    with pytest.raises(ValueError, match="stream"):
        nqdq.quantize(x.cpu().numpy(), "nvfp4", stream=s)


@pytest.mark.parametrize("scheme", ["fp8_row", "nvfp4", "mxfp4", "fp8_tensor"])
def test_torch_graph_capture_replays_with_new_data(scheme):
    torch = _torch()
    x = torch.randn(64, 7168, device="cuda", dtype=torch.bfloat16)
    nqdq.quantize(x, scheme)  # warm: plan, runner, kernels loaded
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            q = nqdq.quantize(x, scheme)
    for seed in (1, 2):
        new = torch.from_numpy(_data((64, 7168), "bfloat16", seed).view(np.int16)).cuda().view(torch.bfloat16)
        x.copy_(new)
        g.replay()
        torch.cuda.synchronize()
        _same(q, nqdq.quantize(new.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16), scheme))


def test_torch_tensor_on_second_gpu():
    torch = _torch()
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    x = torch.randn(64, 1024, device="cuda:1", dtype=torch.bfloat16)
    q = nqdq.quantize(x, "mxfp4")
    assert q.codes.device == x.device
    _same(q, nqdq.quantize(x.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16), "mxfp4"))


def test_bad_callers():
    torch = _torch()
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="contiguous"):
        nqdq.quantize(x.t(), "fp8_row")
    with pytest.raises(TypeError, match="stream"):
        nqdq.quantize(x, "fp8_row", stream="default")


def test_calls_that_touch_host_memory_refuse_capture():
    torch = _torch()
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    nqdq.quantize(x, "fp8_tensor", scale=0.5)  # warm
    nqdq.quantize(x, "fp8_row", nonfinite="raise")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    for kw in ({"scale": 0.5}, {"nonfinite": "raise"}):
        g = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="cannot be captured"):
            with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
                nqdq.quantize(x, "fp8_tensor" if "scale" in kw else "fp8_row", **kw)
    torch.cuda.synchronize()
    q = nqdq.quantize(x, "fp8_row")  # the process still works after the refused captures
    assert isinstance(q.codes, torch.Tensor)


def test_torch_fused_and_matmul_results_are_tensors():
    torch = _torch()
    x = _data((64, 512), "bfloat16", seed=21)
    w = np.random.default_rng(22).uniform(0.5, 1.5, 512).astype(np.float32)
    xt = torch.from_numpy(x.view(np.int16)).cuda().view(torch.bfloat16)
    wt = torch.from_numpy(w).cuda()
    for _ in range(2):
        q, new_res = nqdq.fused.rmsnorm_quantize(xt, wt, "fp8_row", residual=xt)
        assert isinstance(q.codes, torch.Tensor) and new_res.dtype == torch.bfloat16
        ref, ref_res = nqdq.fused.rmsnorm_quantize(x, w, "fp8_row", residual=x)
        _same(q, ref)
        np.testing.assert_array_equal(_bits(new_res), _bits(ref_res))
    wq = _data((96, 512), "bfloat16", seed=23)
    wqt = torch.from_numpy(wq.view(np.int16)).cuda().view(torch.bfloat16)
    qa, qb = nqdq.quantize(xt, "fp8_row"), nqdq.quantize(wqt, "fp8_row")
    want = nqdq.matmul(nqdq.quantize(x, "fp8_row"), nqdq.quantize(wq, "fp8_row"), "float32")
    for _ in range(3):  # the general path, then the remembered runner of tensors
        got = nqdq.matmul(qa, qb, "bfloat16")
        assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16 and got.shape == (64, 96)
        g = got.float().cpu().numpy()
        assert np.abs(g - want).max() <= 2.0**-7 * np.abs(want).max() + 1e-3


def _tensor(a):
    """A CUDA tensor of NumPy array ``a`` (bfloat16 through its bits)."""
    torch = _torch()
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).cuda().view(torch.bfloat16)
    return torch.from_numpy(a).cuda()


def _remembered(op, type_):
    from nqdq import fused

    return any(k[0] == op and k[2] is type_ for k in fused._ROWS_FAST)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("scheme, scale, with_residual",
                         [("fp8_row", None, True), ("mxfp4", None, False), ("fp8_1x128", None, True),
                          ("fp8_tensor", 0.05, False)])  # fmt: skip
def test_torch_fused_hot_path(scheme, scale, with_residual, dtype):
    # the general path, then the remembered PyTorch runner: tensors out, the same bits as NumPy
    torch = _torch()
    x, r = _data((64, 512), dtype, seed=31), _data((64, 512), dtype, seed=32)
    w = np.random.default_rng(33).uniform(0.5, 1.5, 512).astype(np.float32)
    xt, rt, wt = _tensor(x), _tensor(r), _tensor(w)
    ref = nqdq.fused.rmsnorm_quantize(x, w, scheme, residual=r if with_residual else None, scale=scale)
    ref_q, ref_res = ref if with_residual else (ref, None)
    for _ in range(3):
        out = nqdq.fused.rmsnorm_quantize(xt, wt, scheme, residual=rt if with_residual else None, scale=scale)
        q, new_res = out if with_residual else (out, None)
        assert isinstance(q.codes, torch.Tensor) and isinstance(q.scales, torch.Tensor)
        assert q.codes.device == xt.device and q.dtype == dtype
        _same(q, ref_q)
        if with_residual:
            assert new_res.dtype == xt.dtype
            np.testing.assert_array_equal(_bits(new_res), _bits(ref_res))
    assert _remembered("rmsnorm_quantize", torch.Tensor)


def test_torch_rmsnorm_and_flatten_hot_paths():
    torch = _torch()
    x, r = _data((64, 512), "bfloat16", seed=41), _data((64, 512), "bfloat16", seed=42)
    w = np.random.default_rng(43).uniform(0.5, 1.5, 512).astype(np.float32)
    xt, rt, wt = _tensor(x), _tensor(r), _tensor(w)
    ref_y, ref_res = nqdq.fused.rmsnorm(x, w, residual=r)
    base = _data((4, 8, 128), "bfloat16", seed=44)  # [H, B, D]; flatten reads its [B, H, D] view in place
    flat = np.ascontiguousarray(base.transpose(1, 0, 2))
    bt = _tensor(base)
    ref_view, ref_flat = nqdq.fused.flatten_quantize(flat, "mxfp4"), nqdq.fused.flatten_quantize(flat, "fp8_1x128")
    for _ in range(3):
        y, new_res = nqdq.fused.rmsnorm(xt, wt, residual=rt)
        assert y.dtype == torch.float32 and new_res.dtype == torch.bfloat16
        np.testing.assert_array_equal(_bits(y), _bits(ref_y))
        np.testing.assert_array_equal(_bits(new_res), _bits(ref_res))
        q = nqdq.fused.flatten_quantize(bt.transpose(0, 1), "mxfp4")
        assert isinstance(q.codes, torch.Tensor)
        _same(q, ref_view)
        _same(nqdq.fused.flatten_quantize(bt.transpose(0, 1).contiguous(), "fp8_1x128"), ref_flat)
    assert _remembered("rmsnorm", torch.Tensor) and _remembered("flatten_quantize", torch.Tensor)


def test_torch_fused_graph_capture_replays_with_new_data():
    torch = _torch()
    x = torch.randn(64, 7168, device="cuda", dtype=torch.bfloat16)
    w_host = np.random.default_rng(51).uniform(0.5, 1.5, 7168).astype(np.float32)
    w = _tensor(w_host)
    for _ in range(2):  # the general path, then the remembered runner
        nqdq.fused.rmsnorm_quantize(x, w, "fp8_row")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            q = nqdq.fused.rmsnorm_quantize(x, w, "fp8_row")
    for seed in (52, 53):
        new = _data((64, 7168), "bfloat16", seed)
        x.copy_(_tensor(new))
        g.replay()
        torch.cuda.synchronize()
        _same(q, nqdq.fused.rmsnorm_quantize(new, w_host, "fp8_row"))


@pytest.mark.parametrize("layout", ["nv_128x4", "cdna4_32"])
def test_torch_with_layout_stays_in_torch(layout):
    # a PyTorch-made q changes layout on its GPU, in tensors, and back, with NumPy's bits
    torch = _torch()
    x = _data((200, 512), "bfloat16", seed=61)
    q = nqdq.quantize(_tensor(x), "mxfp4")
    ref = nqdq.quantize(x, "mxfp4").with_layout(layout)
    for _ in range(2):
        sw = q.with_layout(layout)
        assert isinstance(sw.scales, torch.Tensor) and sw.scales.device == q.codes.device
        np.testing.assert_array_equal(_bits(sw.scales), _bits(ref.scales))
        back = sw.with_layout("linear")
        assert isinstance(back.scales, torch.Tensor)
        np.testing.assert_array_equal(_bits(back.scales), _bits(q.scales))
    np.testing.assert_array_equal(_bits(nqdq.dequantize(sw)), _bits(nqdq.dequantize(ref)))
