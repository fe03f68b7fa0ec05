"""nqdq.quantize's GPU hot path: cached plans, the generated CuPy launcher, CUDA graphs.

Without a GPU (the simulator) the plan cache and the plans' slots are checked; with
``NQDQ_TEST_GPU=1`` on a GPU machine, repeated ``nqdq.quantize`` calls on CuPy arrays
(the remembered fast path) are compared bit for bit with the NumPy reference, and a
captured ``nqdq.quantize`` is replayed on new data.
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

import nqdq
from nqdq import api
from nqdq.gpu.quantize import plan as kq
from nqdq.schemes import resolve_scheme

from helpers.data import activation
from helpers.gpu import check_graph_replays, check_quantized

ON_GPU = os.environ.get("NQDQ_TEST_GPU") == "1"
gpu = pytest.mark.skipif(not ON_GPU, reason="needs NQDQ_TEST_GPU=1 and a CUDA GPU")

SCHEMES = ["fp8_row", "mxfp4", "nvfp4", "fp8_1x128", "int8_asym", "int8_centred", "fp8_tensor", "int8_column",
           "fp8_128x128"]  # fmt: skip


def test_plans_are_cached_and_classify_their_arrays():
    from nqdq.gpu.device.codec import KIND_BF16
    from nqdq.gpu.quantize.choices import KernelChoices, PerTensor

    sch = resolve_scheme("fp8_row")
    p = kq.get_plan((64, 7168), KIND_BF16, sch)
    assert kq.get_plan((64, 7168), KIND_BF16, sch) is p
    assert len(p.launches) == 1
    roles = {s.i: s.role for s in p.slots}
    assert roles[p.codes.i] == roles[p.scales.i] == "out"
    assert sorted(r for r in roles.values() if r != "out") == ["dummy"] * 3  # S_enc, zps, means placeholders
    # tensor amax partials -> the block pass, which reduces them and computes S_enc itself
    # (PerTensor.AMAX_IN_GROUPS; a GPU plans the one-launch grid at 64x7168: tests/test_grid_one_launch*.py)
    amax_in = KernelChoices(per_tensor=PerTensor.AMAX_IN_GROUPS)
    nv = kq.get_plan((64, 7168), KIND_BF16, resolve_scheme("nvfp4"), choices=amax_in)
    assert len(nv.launches) == 2 and nv.tscale is not None
    assert sum(s.role == "scratch" for s in nv.slots) == 4  # partials (3) and S_enc
    if kq.SIMULATOR:
        assert p.cupy_runner() is None


def test_plan_execute_matches_reference_in_the_simulator():
    if not kq.SIMULATOR:
        pytest.skip("simulator check")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 256)).astype(ml_dtypes.bfloat16)
    for name in ("fp8_row", "nvfp4"):
        a = nqdq.quantize(x, name, device="cuda")
        b = nqdq.quantize(x, name, device="cpu")
        np.testing.assert_array_equal(np.asarray(a.codes), b.codes)
        np.testing.assert_array_equal(np.asarray(a.scales).view(np.uint8), np.asarray(b.scales).view(np.uint8))


# --- on the GPU ---------------------------------------------------------------------------


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", SCHEMES)
def test_gpu_repeated_calls_take_the_fast_path_bit_exact(name):
    import cupy as cp

    rng = np.random.default_rng(7)
    for trial in range(3):
        xh = activation(rng, (64, 7168))
        x = cp.asarray(xh.view(np.uint16))
        n_before = len(api._FAST)
        q = nqdq.quantize(x, name, dtype="bfloat16")
        assert isinstance(q.codes, cp.ndarray)
        if trial:
            assert len(api._FAST) == n_before  # a hit: nothing new remembered
        check_quantized(q, nqdq.quantize(xh, name, device="cpu"), name)
    assert any(k[0] == name for k in api._FAST)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["fp8_row", "mxfp4", "nvfp4", "fp8_1x128"])
def test_gpu_quantize_captured_in_a_cuda_graph_replays(name):
    import cupy as cp

    rng = np.random.default_rng(8)
    x = cp.asarray(activation(rng, (64, 7168)).view(np.uint16))
    nqdq.quantize(x, name, dtype="bfloat16")  # plan, compile, load, remember
    check_graph_replays(x, name, rng, trials=2)


@gpu
@pytest.mark.gpu
def test_gpu_fast_path_respects_the_current_stream_and_checks():
    import cupy as cp

    rng = np.random.default_rng(9)
    xh = activation(rng, (8, 512))
    x = cp.asarray(xh.view(np.uint16))
    ref = nqdq.quantize(xh, "mxfp4", device="cpu")
    nqdq.quantize(x, "mxfp4", dtype="bfloat16")
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        q = nqdq.quantize(x, "mxfp4", dtype="bfloat16")
    s.synchronize()
    check_quantized(q, ref, "mxfp4 on a stream")
    with pytest.raises(ValueError, match="C-contiguous"):
        nqdq.quantize(cp.asarray(np.zeros((8, 1024), np.uint16))[:, ::2], "mxfp4", dtype="bfloat16")
    with pytest.raises(TypeError):
        nqdq.quantize(x, "mxfp4")  # uint16 without dtype=


@gpu
@pytest.mark.gpu
def test_gpu_output_arrays_equal_the_constructors():
    """The runner builds its outputs by the ndarray base's __new__ + _init: each must equal
    ``cupy.ndarray(shape, dtype, memptr)`` over the same memory in every field."""
    import cupy as cp

    from nqdq.gpu.runtime.interop import _same_cupy_array

    x = cp.asarray(activation(np.random.default_rng(10), (16, 1024)).view(np.uint16))
    for name in ("fp8_row", "nvfp4", "int8_asym"):
        q = nqdq.quantize(x, name, dtype="bfloat16")
        q = nqdq.quantize(x, name, dtype="bfloat16")  # the remembered path
        run = next(fq for k, fq in api._FAST.items() if k[0] == name).run
        assert run.fast_arrays, name
        for f in ("codes", "scales", "zero_points", "tensor_scale", "means"):
            a = getattr(q, f)
            if a is not None:
                assert _same_cupy_array(a, cp.ndarray(a.shape, a.dtype, a.data)), (name, f)


# --- the hot path's pieces, without a GPU ---------------------------------------------------


class _FakeMemptr:
    def __init__(self, ptr, mem):
        self.ptr, self.mem = ptr, mem


class _FakeBase:
    """Stands in for CuPy's Cython ``_ndarray_base``: ``__new__`` makes an empty array,
    ``_init(shape, dtype, memptr)`` fills every field as ``cupy.ndarray(...)`` does."""

    def __new__(cls, *args, **kwargs):
        return super().__new__(cls)

    def _init(self, shape, dtype, memptr):
        self.shape, self.dtype, self.data = tuple(shape), np.dtype(dtype), memptr
        self.size = int(np.prod(shape))
        self.strides = tuple(int(np.prod(shape[i + 1 :])) * self.dtype.itemsize for i in range(len(shape)))
        self._c_contiguous, self._f_contiguous = True, len(shape) <= 1
        self._index_32_bits = True
        self.base = None


class _FakeNdarray(_FakeBase):
    """``cupy.ndarray``: a Python subclass whose ``__new__`` calls the base's ``_init``."""

    def __new__(cls, *args, **kwargs):
        x = super().__new__(cls)
        x._init(*args, **kwargs)
        return x


def test_cupy_array_new_takes_the_base_path_only_when_it_builds_the_same_array():
    from types import SimpleNamespace

    from nqdq.gpu.runtime.interop import cupy_array_new

    mp = _FakeMemptr(0x7F0000001000, object())
    new = cupy_array_new(SimpleNamespace(ndarray=_FakeNdarray), mp)
    assert new is not None
    a = new(_FakeNdarray)
    a._init((3, 5), np.dtype(np.float32), mp)
    assert type(a) is _FakeNdarray and a.shape == (3, 5) and a.strides == (20, 4) and a.data is mp

    class Flagged(_FakeBase):  # its constructor does more than the base's _init: not the same array
        def __new__(cls, *args, **kwargs):
            x = super().__new__(cls)
            x._init(*args, **kwargs)
            x._index_32_bits = False
            return x

    assert cupy_array_new(SimpleNamespace(ndarray=Flagged), mp) is None

    class NoInitBase:  # a CuPy without the internal _init: the constructor stays
        pass

    class NoInit(NoInitBase):
        def __init__(self, shape, dtype, memptr):
            pass

    assert cupy_array_new(SimpleNamespace(ndarray=NoInit), mp) is None


def test_remembered_calls_drop_the_oldest_beyond_the_limit(monkeypatch):
    monkeypatch.setattr(api, "_FAST", {})
    monkeypatch.setattr(api, "_FAST_MAX", 2)
    for k in ("a", "b", "c"):
        api._remember((k,), k.upper())
    assert list(api._FAST.items()) == [(("b",), "B"), (("c",), "C")]
    with pytest.raises(TypeError):
        api._remember((["unhashable"],), "D")
    assert len(api._FAST) == 2
