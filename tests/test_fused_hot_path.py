"""The fused row ops' hot path (nqdq.fused._rows_hot._ROWS_FAST): a repeated rmsnorm /
rmsnorm_quantize / flatten_quantize call with the same arguments skips the checks and the
plan and launches the planned call (nqdq.gpu.fused.plan.rows_plan). In the simulator NumPy
arrays with device="cuda" take it (_rows_hot._SimulatedLib: the plan's replay), so these run
in CI: the remembered call hits on a repeat and gives the first call's bits (and the
reference's), misses when any element of the key changes, still raises clear errors, and
refuses arrays the plan cannot take. tests/test_fused_gpu.py::test_gpu_fused_hot_path runs
the CuPy form on a GPU.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nqdq import fused
from nqdq.fused import _rows_hot
from nqdq.gpu.fused.plan import rows_switches

BF16 = np.dtype(ml_dtypes.bfloat16)


def bits(a):
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def assert_same(a, b):
    """Two results of one op (a QuantizedTensor, an array, or a tuple of them) bit for bit."""
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for u, v in zip(a, b):
            assert_same(u, v)
        return
    if hasattr(a, "codes"):
        assert (a.shape, a.dtype, a.scheme, a.scale_layout) == (b.shape, b.dtype, b.scheme, b.scale_layout)
        pairs = [(a.codes, b.codes), (a.scales, b.scales)]
    else:
        pairs = [(a, b)]
    for u, v in pairs:
        u, v = np.asarray(u), np.asarray(v)
        assert (u.shape, u.dtype) == (v.shape, v.dtype)
        np.testing.assert_array_equal(bits(u), bits(v))


def first_array(out):
    out = out[0] if isinstance(out, tuple) else out
    return out.codes if hasattr(out, "codes") else out


@pytest.fixture(autouse=True)
def fresh_hot_path():
    _rows_hot._ROWS_FAST.clear()
    yield
    _rows_hot._ROWS_FAST.clear()


def data(t=3, n=200, dtype=BF16, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((t, n)) * np.exp2(rng.uniform(-3, 3, (t, 1)))).astype(dtype)
    return x, rng.standard_normal(n).astype(dtype), rng.standard_normal((t, n)).astype(dtype)


X, W, RES = data()
X3 = data(15, 40, seed=1)[0].reshape(3, 5, 40)
X3_VIEW = np.ascontiguousarray(X3.transpose(1, 0, 2)).transpose(1, 0, 2)  # read in place (strided)

CALLS = {
    "rmsnorm_quantize fp8_row": lambda **kw: fused.rmsnorm_quantize(X, W, "fp8_row", **kw),
    "rmsnorm_quantize mxfp4 +res": lambda **kw: fused.rmsnorm_quantize(X, W, "mxfp4", residual=RES, **kw),
    "rmsnorm_quantize fp8_tensor": lambda **kw: fused.rmsnorm_quantize(X, W, "fp8_tensor", scale=0.0173, **kw),
    "rmsnorm_quantize fp8_1x128 +res float16": lambda **kw: fused.rmsnorm_quantize(
        *(a.astype(np.float16) for a in (X, W)), "fp8_1x128", residual=RES.astype(np.float16), **kw),
    "rmsnorm +res": lambda **kw: fused.rmsnorm(X, W, residual=RES, **kw),
    "flatten_quantize mxfp4": lambda **kw: fused.flatten_quantize(X3, "mxfp4", **kw),
    "flatten_quantize fp8_1x128 strided": lambda **kw: fused.flatten_quantize(X3_VIEW, "fp8_1x128", **kw),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_repeat_takes_the_hot_path_with_the_same_bits(name):
    call = CALLS[name]
    first = call(device="cuda")  # the general path, which remembers the call
    assert len(_rows_hot._ROWS_FAST) == 1
    (fr,) = _rows_hot._ROWS_FAST.values()
    hot = call(device="cuda")
    assert len(_rows_hot._ROWS_FAST) == 1
    assert_same(hot, first)
    assert_same(hot, call())  # the NumPy reference (device=None: the CPU)
    # the hot call's outputs are views of its one allocation; the general path's are not
    owner = np.asarray(first_array(hot)).base
    assert owner is not None and all(np.shares_memory(owner, np.asarray(a)) for a in _arrays(hot))
    assert not np.shares_memory(np.asarray(first_array(first)), np.asarray(_arrays(first)[-1]))
    assert fr.plan.outputs  # (the remembered function: a planned call)


def _arrays(out):
    out = out if isinstance(out, tuple) else (out,)
    got = []
    for o in out:
        got += [o.codes, o.scales] if hasattr(o, "codes") else [o]
    return got


def test_key_changes_with_every_element(monkeypatch):
    """_norm_key / _flat_key differ when any element of the call differs: op, device argument,
    array types, shapes, dtypes, residual or not, scheme, eps (value and type), static scale,
    dtype options, the current GPU; flatten's strides. Both end with rows_switches()."""
    _rows_hot._remember_rows(lambda: None, lambda: None)  # (sets the key's device and switch readers)
    base = dict(op=_rows_hot._OP_NORM_Q, x=X, weight=W, residual=None,
                options=("fp8_row", float, 1e-6, type(None), None), device="cuda", dtype=None, weight_dtype=None)
    k0 = _rows_hot._norm_key(**base)
    assert k0 == _rows_hot._norm_key(**base) and hash(k0) == hash(_rows_hot._norm_key(**base))
    changes = dict(op=_rows_hot._OP_Y, x=X[:2], weight=W.astype(np.float32), residual=RES, device="gpu",
                   dtype="bfloat16", weight_dtype="bfloat16", options=("mxfp4", float, 1e-6, type(None), None))
    changes2 = [dict(x=X.astype(np.float32)), dict(x=X.view(np.uint16)), dict(options=("fp8_row", float, 1e-5, type(None), None)),
                dict(options=("fp8_row", int, 1, type(None), None)), dict(options=("fp8_tensor", float, 1e-6, float, 0.5)),
                dict(options=("fp8_tensor", float, 1e-6, float, 0.25)), dict(x=list(X))]
    keys = {k0}
    for ch in [{k: v} for k, v in changes.items()] + changes2:
        k = _rows_hot._norm_key(**{**base, **ch})
        assert k != k0 and k not in keys, ch
        keys.add(k)
    assert _rows_hot._norm_key(**{**base, "x": list(X)}) is None  # no shape / dtype: no key, the general path
    monkeypatch.setattr(_rows_hot, "_device_now", lambda: 1)
    assert _rows_hot._norm_key(**base) != k0  # another current GPU
    monkeypatch.undo()
    _rows_hot._remember_rows(lambda: None, lambda: None)
    assert k0[-1] == rows_switches()  # the build switches run_rows reads (none left)
    f0 = _rows_hot._flat_key(X3, "mxfp4", "cuda", None)
    assert f0[-1] == rows_switches()
    assert f0 != _rows_hot._flat_key(X3_VIEW, "mxfp4", "cuda", None)  # same shape, other strides
    flat_key = _rows_hot._flat_key
    assert f0 != flat_key(X3, "fp8_1x128", "cuda", None) != flat_key(X3, "mxfp4", "cuda", "bfloat16")


def test_changed_arguments_miss_and_give_their_own_bits():
    """A call that differs in eps, residual or scheme is not the remembered one: it runs the
    general path (its own result, equal to the reference) and is remembered beside it."""
    fused.rmsnorm_quantize(X, W, "fp8_row", device="cuda")
    for kw in (dict(eps=1e-3), dict(residual=RES)):
        got = fused.rmsnorm_quantize(X, W, "fp8_row", device="cuda", **kw)
        assert_same(got, fused.rmsnorm_quantize(X, W, "fp8_row", **kw))
    assert len(_rows_hot._ROWS_FAST) == 3


def test_errors_are_still_raised_after_a_remembered_call():
    fused.rmsnorm_quantize(X, W, "fp8_row", eps=1, device="cuda")
    fused.rmsnorm_quantize(X, W, "fp8_tensor", scale=0.5, device="cuda")
    assert len(_rows_hot._ROWS_FAST) == 2
    with pytest.raises(TypeError, match="eps"):
        fused.rmsnorm_quantize(X, W, "fp8_row", eps=True, device="cuda")  # == 1 and hashes so: its type is in the key
    with pytest.raises(ValueError, match="weight"):
        fused.rmsnorm_quantize(X, W[:-1], "fp8_row", eps=1, device="cuda")
    with pytest.raises(ValueError, match="residual"):
        fused.rmsnorm_quantize(X, W, "fp8_row", eps=1, residual=RES.astype(np.float16), device="cuda")
    with pytest.raises(ValueError, match="scale"):
        fused.rmsnorm_quantize(X, W, "fp8_tensor", scale=-0.5, device="cuda")
    with pytest.raises(ValueError, match="scale"):
        fused.rmsnorm_quantize(X, W, "fp8_tensor", scale=[[0.5, 0.5]], device="cuda")  # (unhashable: no key)
    with pytest.raises(ValueError, match="device"):
        fused.rmsnorm_quantize(X, W, "fp8_row", eps=1, device="tpu")
    with pytest.raises(ValueError, match="3-D"):
        fused.flatten_quantize(X, "mxfp4", device="cuda")


def test_the_runner_refuses_arrays_the_plan_cannot_take():
    """The remembered function returns None (the caller then runs the general path) for an
    x that is not C-contiguous or not in native byte order; the general path reads such an
    x as a contiguous copy and gives the reference's bits."""
    fused.rmsnorm_quantize(X, W, "fp8_row", device="cuda")
    (fr,) = _rows_hot._ROWS_FAST.values()
    wide = np.zeros((3, 400), BF16)
    wide[:, ::2] = X
    strided = wide[:, ::2]
    assert fr(strided, W, None) is None
    swapped = X.astype(np.float32).astype(">f4")
    assert fr(swapped, W, None) is None
    assert_same(fused.rmsnorm_quantize(strided, W, "fp8_row", device="cuda"), fused.rmsnorm_quantize(X, W, "fp8_row"))


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(_rows_hot, "_ROWS_FAST_MAX", 2)
    for eps in (1e-6, 1e-5, 1e-4):
        fused.rmsnorm(X[:1], W, eps, device="cuda")
    assert len(_rows_hot._ROWS_FAST) == 2
    assert [k[9][1] for k in _rows_hot._ROWS_FAST] == [1e-5, 1e-4]  # (options = (type, eps)): the oldest dropped
