"""The amax by-product: ``nqdq.quantize(x, scheme, scale=s, amax_out=a)`` (issue 46, item 2).

With a given tensor scale (``fp8_tensor``, an int tensor scale, ``nvfp4``), ``a`` (float32,
one element) receives x's amax: the float32 whose bits are the largest bits of |x|, NaN and
inf counting except for NVFP4 (finite values only), the statistic of the dynamic scheme.
Each case runs on the reference and on the kernels (the CUDA simulator here, the GPU with
NQDQ_TEST_GPU=1): the codes and scales equal the plain static call's, the amax equals a
value computed here from x's bits, and for finite x it gives the dynamic scheme's scale.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nqdq
from nqdq.gpu.quantize import plan as kq
from nqdq.schemes import resolve_scheme

F32 = np.float32
BF16 = ml_dtypes.bfloat16
KIND = {np.dtype(np.float32): 0, np.dtype(BF16): 1, np.dtype(np.float16): 2}


def _host(a):
    return np.asarray(a.copy_to_host() if hasattr(a, "copy_to_host") else a)


def _expected_amax(x, finite):
    """max |x| over x as float32, by the bits (written out here, not taken from nqdq)."""
    b = np.asarray(x).astype(F32).reshape(-1).view(np.uint32) & np.uint32(0x7FFFFFFF)
    if finite:
        b = b[b < 0x7F800000]
    return np.uint32(b.max() if b.size else 0)


def _run(x, scheme, scale, device):
    a = np.full(1, -3.0, F32)  # not zero: the call must overwrite it
    q = nqdq.quantize(x, scheme, scale=scale, amax_out=a, device=device)
    plain = nqdq.quantize(x, scheme, scale=scale, device=device)
    for f in ("codes", "scales", "tensor_scale"):
        got, want = getattr(q, f), getattr(plain, f)
        if want is not None:
            assert np.array_equal(_host(got).reshape(-1).view(np.uint8), _host(want).reshape(-1).view(np.uint8)), f
    return a


# (scheme, scale, shape, dtype, the rule that plans it on the kernels)
CASES = [
    ("fp8_tensor", 0.02, (4, 64), np.float32, "static_units"),
    ("fp8_tensor", 0.02, (6, 96), BF16, "static_units"),
    ("fp8_tensor", 0.02, (3, 40), np.float16, "static_units"),
    ("fp8_tensor", 0.02, (3, 37), np.float32, "static"),  # rows that are not whole units
    ("int8_tensor", 0.03, (2, 64), BF16, "static_units"),
    ("nvfp4", 0.004, (4, 64), np.float32, "nvfp4_given_scale_units"),
    ("nvfp4", 0.004, (2, 128), BF16, "nvfp4_given_scale_units"),
    ("nvfp4", 0.004, (3, 48), np.float16, "nvfp4_given_scale_units"),
    ("nvfp4", 0.004, (3, 40), np.float32, "nvfp4_given_scale"),
]


def _scheme(name):
    return resolve_scheme("int8", granularity="tensor", static_scale=True) if name == "int8_tensor" else name


def _data(shape, dtype, seed, nonfinite=None):
    rng = np.random.default_rng(seed)
    x = (rng.uniform(-1, 1, shape) * np.exp2(rng.uniform(-3, 3, (shape[0], 1)))).astype(F32)  # |x| < 8
    x.reshape(-1)[rng.integers(x.size)] = -11.5  # the amax, negative
    if nonfinite is not None:
        x.reshape(-1)[rng.integers(x.size)] = nonfinite
    return x.astype(dtype)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("name,scale,shape,dtype,rule", CASES)
def test_amax_recorded(name, scale, shape, dtype, rule, device):
    x = _data(shape, dtype, seed=sum(shape) * 7 + len(name))
    if device == "cuda":
        sch = resolve_scheme(_scheme(name), static_scale=True) if name != "int8_tensor" else _scheme(name)
        plan = kq.get_plan(shape, KIND[np.dtype(dtype)], sch, static_scale=True, amax=True)
        assert plan.rule == rule
    a = _run(x, _scheme(name), scale, device)
    assert a.view(np.uint32)[0] == _expected_amax(x, finite=name == "nvfp4")
    assert a[0] == F32(11.5)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("name,scale,shape,dtype,rule", [CASES[0], CASES[1], CASES[3], CASES[5], CASES[8]])
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_nonfinite(name, scale, shape, dtype, rule, device, bad):
    """NaN / inf: part of the float schemes' amax (NaN above inf), skipped by NVFP4's."""
    x = _data(shape, dtype, seed=7, nonfinite=bad)
    a = _run(x, name, scale, device)
    if name == "nvfp4":
        assert a[0] == F32(11.5)
    elif np.isnan(bad):
        assert np.isnan(a[0])
        if dtype == np.float32:  # the payload of x's NaN, sign cleared
            assert a.view(np.uint32)[0] == _expected_amax(x, finite=False)
    else:
        assert a[0] == np.inf


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("name,shape,dtype", [("fp8_tensor", (4, 64), np.float32), ("fp8_tensor", (6, 96), BF16),
                                              ("nvfp4", (4, 64), BF16)])  # fmt: skip
def test_gives_the_dynamic_scale(name, shape, dtype, device):
    """Delayed scaling's step: the recorded amax gives the scale the dynamic call computes
    (fp8: amax / 448 in float32; NVFP4: S_dec = 1 / (2688 / amax), both rounded)."""
    x = _data(shape, dtype, seed=11)
    a = _run(x, name, 0.5 if name != "nvfp4" else 0.01, device)
    dyn = nqdq.quantize(x, name, device=device)
    if name == "nvfp4":
        want = F32(1) / (F32(448 * 6) / a[0])
        assert _host(dyn.tensor_scale).reshape(()) == want
    else:
        assert _host(dyn.scales).reshape(()) == a[0] / F32(448)


def test_all_zero_and_subnormal():
    """An all-zero x records 0; a subnormal amax is kept as it is (bits, not a rounded value)."""
    for device in ("cpu", "cuda"):
        a = _run(np.zeros((2, 64), F32), "fp8_tensor", 1.0, device)
        assert a.view(np.uint32)[0] == 0
        x = np.zeros((2, 64), F32)
        x[1, 3] = -np.float32(1e-40)
        a = _run(x, "fp8_tensor", 1.0, device)
        assert a.view(np.uint32)[0] == np.float32(1e-40).view(np.uint32)


def test_stochastic_rounding_records_too():
    x = _data((4, 64), np.float32, seed=3)
    for device in ("cpu", "cuda"):
        a = np.zeros(1, F32)
        q = nqdq.quantize(x, "fp8_tensor", scale=0.05, amax_out=a, rounding="stochastic", seed=9, device=device)
        plain = nqdq.quantize(x, "fp8_tensor", scale=0.05, rounding="stochastic", seed=9, device=device)
        assert np.array_equal(_host(q.codes).view(np.uint8), _host(plain.codes).view(np.uint8))
        assert a[0] == F32(11.5)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(scheme="fp8_tensor"), "pass scale= too"),
        (dict(scheme="fp8_row", scale=0.1), "one tensor scale"),
        (dict(scheme="mxfp4", scale=1.0), "one tensor scale|static"),
        (dict(scheme="fp8_tensor", scale=0.1, amax_out=np.zeros(2, F32)), "one element"),
        (dict(scheme="fp8_tensor", scale=0.1, amax_out=np.zeros(1, np.float64)), "float32"),
        (dict(scheme="fp8_tensor", scale=0.1, amax_out=[0.0]), "NumPy array"),
    ],
)
def test_bad_amax_out(kw, match):
    x = np.ones((2, 64), F32)
    kw = {"amax_out": np.zeros(1, F32), **kw}
    with pytest.raises((ValueError, TypeError), match=match):
        nqdq.quantize(x, **kw)


def test_read_only_amax_out():
    a = np.zeros(1, F32)
    a.flags.writeable = False
    with pytest.raises(ValueError, match="amax_out must be writable"):
        nqdq.quantize(np.ones((2, 64), F32), "fp8_tensor", scale=0.1, amax_out=a)


def test_amax_history_steps():
    """Delayed scaling with the history: each step quantizes with the scale of the steps
    before it (1 at first) and records its own amax; the scales written out by hand."""
    h = nqdq.AmaxHistory("fp8_tensor", length=2, margin=1)
    amaxes = [F32(4.0), F32(0.5), F32(0.25), F32(0.0)]
    # history max over the last 2 steps, times 2^1, / 448
    want_scales = [F32(1.0), F32(8.0) / F32(448), F32(8.0) / F32(448), F32(1.0) / F32(448)]
    for step, (amax, want) in enumerate(zip(amaxes, want_scales)):
        x = np.zeros((2, 64), F32)
        x[1, step] = -amax
        assert h.scale[0] == want, step
        q = nqdq.quantize(x, "fp8_tensor", scale=h.scale, amax_out=h.slot)
        assert np.asarray(q.scales).reshape(()) == want
        h.update()
    # the last step's amax (0) with 0.25 still in the history: the max 0.25 stands
    assert h.scale[0] == F32(0.5) / F32(448)


def test_amax_history_most_recent_and_nvfp4():
    h = nqdq.AmaxHistory("nvfp4", length=4, algo="most_recent")
    for amax in (F32(10.0), F32(3.0), F32(np.inf)):
        h.slot[0] = amax  # as quantize(..., amax_out=h.slot) records it
        h.update()
    # inf kept the scale of the step before: S_dec = 1 / (2688 / 3), as the dynamic path
    assert h.scale[0] == F32(1) / (F32(2688) / F32(3.0))


@pytest.mark.parametrize("kw,match", [(dict(scheme="fp8_row"), "one tensor scale"), (dict(length=0), "length"),
                                      (dict(algo="mean"), "algo"), (dict(margin=0.5), "margin")])  # fmt: skip
def test_amax_history_bad(kw, match):
    with pytest.raises(ValueError, match=match):
        nqdq.AmaxHistory(**kw)
