"""Finite inputs near the top of float32 decode finite, as close as each format allows
(docs/numerics.md, "Inputs near the float32 maximum"), on the reference and the kernels
(simulator here, the GPU with NQDQ_TEST_GPU=1) bit for bit (issue 44, item 6).

Bounds, for every element x of these inputs and its decoded value d:
* float scales (symmetric): every nonzero x is its group's amax, so |d - x| <= 2^-21 |x|;
* MX: d = sign(x) * max_elem * 2^(127 - emax) (every nonzero |x| here is above that bound);
* NVFP4: |d - x| <= |x| / 8;
* asymmetric and centred integers: |d - x| <= s, one step of the group's scale (to the
  roundings of the decode).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nqdq
from nqdq.schemes import resolve_scheme

FLT_MAX = np.float32(np.finfo(np.float32).max)
SCHEMES = nqdq.schemes()


def _host(a):
    if a is None:
        return None
    return np.asarray(a.copy_to_host() if hasattr(a, "copy_to_host") else a)


def _round_trip_both(x, scheme):
    """(reference q, reference decode, kernel decode), after checking that every array the
    kernels wrote and their decode equal the reference's bit for bit."""
    q = nqdq.quantize(x, scheme)
    d = nqdq.dequantize(q)
    qk = nqdq.quantize(x, scheme, device="cuda")
    for name in ("codes", "scales", "zero_points", "tensor_scale", "means"):
        want, got = _host(getattr(q, name)), _host(getattr(qk, name))
        assert (want is None) == (got is None), f"{scheme} {name}: present in one backend only"
        if want is not None:
            assert want.tobytes() == got.tobytes(), f"{scheme} {name}: kernel {got.ravel()[:4]} != reference {want.ravel()[:4]}"
    dk = _host(nqdq.dequantize(qk))
    assert d.tobytes() == dk.tobytes(), f"{scheme}: kernel decode {dk.ravel()[:4]} != reference {d.ravel()[:4]}"
    return q, d


def _check_close(x, q, d, scheme):
    """Finite, and within the module docstring's bound of x."""
    assert np.isfinite(d).all(), f"{scheme}: {d[~np.isfinite(d)][:4]} from finite input"
    sch = q.scheme
    x64, d64 = x.astype(np.float64), d.astype(np.float64)
    err = np.abs(d64 - x64)
    if sch.is_mx:
        e = sch.element
        top = float(e.max_value) * 2.0 ** (127 - e.emax)
        want = np.where(x64 == 0, 0.0, np.sign(x64) * np.minimum(np.abs(x64), top))
        assert np.array_equal(d64, want), f"{scheme}: {d64[x64 != 0][:4]} != {want[x64 != 0][:4]}"
    elif sch.is_nvfp4:
        assert (err <= np.abs(x64) / 8).all(), f"{scheme}: error {err.max():.3g}"
    elif sch.centred or not sch.symmetric:
        s = np.asarray(q.scales, np.float64)
        step = np.repeat(s, x.shape[-1] // s.shape[-1] if s.shape[-1] else 1, axis=-1)[..., : x.shape[-1]]
        assert (err <= step * (1 + 2.0**-20)).all(), f"{scheme}: error {err.max():.3g} above one step {step.max():.3g}"
    else:
        assert (err <= np.abs(x64) * 2.0**-21).all(), f"{scheme}: error {err.max():.3g} at {x64.flat[err.argmax()]:.8g}"


@pytest.mark.parametrize("v", [FLT_MAX, -FLT_MAX], ids=["max", "-max"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_flt_max_alone(scheme, v):
    x = np.zeros((2, 32), np.float32)
    x[0, 0] = v
    q, d = _round_trip_both(x, scheme)
    _check_close(x, q, d, scheme)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_3_3e38(scheme):
    x = np.zeros((2, 32), np.float32)
    x[1, 7] = np.float32(3.3e38)
    q, d = _round_trip_both(x, scheme)
    _check_close(x, q, d, scheme)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_max_and_minus_max(scheme):
    x = np.zeros((2, 32), np.float32)
    x[0, 0], x[0, 1] = FLT_MAX, -FLT_MAX
    q, d = _round_trip_both(x, scheme)
    _check_close(x, q, d, scheme)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_max_then_31_minus_max(scheme):
    """[max] + [-max] * 31: the centred residual max - mean overflows (mean -0.9375 max)."""
    x = np.zeros((2, 32), np.float32)
    x[0, 0] = FLT_MAX
    x[0, 1:] = -FLT_MAX
    q, d = _round_trip_both(x, scheme)
    _check_close(x, q, d, scheme)


def test_centred_partial_group_whose_mean_overflows():
    """Three FLT_MAX in a group of 128: the halving sum is 3 max / 4, times fp32(4 / 3) > 4 / 3."""
    x = np.full((2, 3), FLT_MAX, np.float32)
    x[1] = np.float32(1.5)
    q, d = _round_trip_both(x, "int8_centred")
    _check_close(x, q, d, "int8_centred")


def test_centred_mean_and_residual_near_the_top():
    """A group centred on 2^127 whose decode code * s + mean would round past FLT_MAX is
    not centred (mean 0); one below the bound keeps its mean (and decodes finite)."""
    x = np.zeros((2, 128), np.float32)
    x[0, :64] = FLT_MAX
    x[0, 64:] = np.float32(2.0**126)
    x[1, :64] = np.float32(1e38)
    x[1, 64:] = np.float32(-1e38)
    q, d = _round_trip_both(x, "int8_centred")
    _check_close(x, q, d, "int8_centred")
    assert float(np.asarray(q.means)[0, 0]) == 0.0
    assert float(np.asarray(q.means)[1, 0]) == 0.0 and float(np.asarray(q.scales)[1, 0]) == np.float32(1e38) / np.float32(127)


@pytest.mark.parametrize("rounding", ["rceil", "floor", "even"])
@pytest.mark.parametrize("scheme", ["mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8"])
def test_mx_bfloat16_near_the_top(scheme, rounding):
    """bfloat16 input takes the pair encoders; an "rceil" block with a capped exponent takes
    the clamped ones. Values up to bfloat16's largest, 3.39e38."""
    x = np.zeros((4, 256), np.float32)
    x[0, :32] = np.float32(3.3e38) * np.linspace(-1, 1, 32, dtype=np.float32)
    x[1, 32:64] = np.float32(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    x[2, :32] = np.float32(2.6e38)
    x[3, 64:96] = -np.float32(3.2e38)
    xb = x.astype(ml_dtypes.bfloat16)
    sch = resolve_scheme(scheme, scale_rounding=rounding)
    q, d = _round_trip_both(xb, sch)
    assert np.isfinite(d).all()


def test_report_notes_finite_values_that_decode_non_finite(monkeypatch):
    """nqdq report leaves non-finite round trips out of its statistics and says so."""
    from nqdq.tools import report

    real = report.dequantize

    def spoiled(q):
        d = np.array(real(q))
        d.flat[0] = np.inf
        return d

    monkeypatch.setattr(report, "dequantize", spoiled)
    x = np.ones((2, 32), np.float32)
    rows, notes = report.report_tensor("w", x, [("fp8_row", resolve_scheme("fp8_row"))])
    assert len(rows) == 1
    assert any("fp8_row: 1 finite values decoded to NaN/inf" in n for n in notes), notes


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("scheme", ["mxfp4", "mxfp8", "fp8_row", "fp8_1x128"])
def test_fused_flatten_near_the_top(scheme, dtype):
    """flatten_quantize (the fused kernels' MX "rceil" parameters and e2m1 encoders) on blocks
    above the MX cap: the reference's codes and scales, which decode finite."""
    from nqdq import fused

    x = np.zeros((2, 4, 64), np.float32)
    x[0, 0, :32] = np.float32(3.3e38) * np.linspace(-1, 1, 32, dtype=np.float32)
    x[1, 2, 5] = np.float32(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    x[1, 3, :7] = np.float32(-3.2e38)
    xd = x.astype(dtype)
    q = fused.flatten_quantize(xd, scheme)
    qk = fused.flatten_quantize(xd, scheme, device="cuda")
    for name in ("codes", "scales"):
        assert _host(getattr(q, name)).tobytes() == _host(getattr(qk, name)).tobytes(), f"{scheme} {name}"
    assert np.isfinite(nqdq.dequantize(q)).all()
