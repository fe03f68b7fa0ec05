"""Non-finite policy (docs/numerics.md): a NaN or +-inf anywhere in a scale group makes that
group's scale NaN (float32 NaN, e8m0 0xFF, ue4m3 0x7F) and the whole group decode to NaN;
other groups are exactly as without it. nonfinite='raise' raises instead."""

from __future__ import annotations

import numpy as np
import pytest

import nqdq

# (scheme, options, shape, index of the bad element, slice of its scale group, the scale index)
CASES = [
    ("fp8_row", {}, (4, 64), (1, 10), np.s_[1, :], (1, 0)),
    ("fp8_1x128", {}, (2, 384), (1, 200), np.s_[1, 128:256], (1, 1)),
    ("fp8_128x128", {}, (256, 256), (130, 3), np.s_[128:, :128], (1, 0)),
    ("int8_row", {}, (4, 64), (2, 0), np.s_[2, :], (2, 0)),
    ("int8_column", {}, (8, 16), (5, 7), np.s_[:, 7], (0, 7)),
    ("int4_group", {}, (2, 256), (0, 255), np.s_[0, 128:], (0, 1)),
    ("int8", dict(symmetric=False), (4, 64), (3, 63), np.s_[3, :], (3, 0)),
    ("int4", dict(symmetric=False, granularity="group", group_size=32), (2, 64), (1, 31), np.s_[1, :32], (1, 0)),
    ("int8_centred", {}, (2, 256), (0, 5), np.s_[0, :128], (0, 0)),
    ("mxfp8", {}, (2, 64), (0, 40), np.s_[0, 32:], (0, 1)),
    ("mxfp8_e5m2", dict(scale_rounding="floor"), (2, 64), (1, 0), np.s_[1, :32], (1, 0)),
    ("mxfp6_e2m3", dict(scale_rounding="even"), (2, 64), (1, 33), np.s_[1, 32:], (1, 1)),
    ("mxfp6_e3m2", {}, (2, 64), (0, 1), np.s_[0, :32], (0, 0)),
    ("mxfp4", {}, (2, 64), (1, 63), np.s_[1, 32:], (1, 1)),
    ("nvfp4", {}, (2, 64), (0, 20), np.s_[0, 16:32], (0, 1)),
]

# the NaN scale, as each scale format stores it
NAN_SCALE = {"f32": None, "e8m0": 0xFF, "ue4m3": 0x7F}


def _ids(c):
    return c[0] + "".join(f"-{k}={v}" for k, v in c[1].items())


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, -np.nan], ids=["nan", "inf", "-inf", "-nan"])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_bad_value_spoils_only_its_group(case, bad):
    scheme, kw, shape, idx, group, sidx = case
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    clean = nqdq.quantize(x, scheme, **kw)
    xb = x.copy()
    xb[idx] = bad
    q = nqdq.quantize(xb, scheme, **kw)
    s = np.asarray(q.scales)
    nan_code = NAN_SCALE[q.scheme.scale_format]
    if nan_code is None:
        assert s.dtype == np.float32 and np.isnan(s[sidx])
    else:
        assert s.dtype == np.uint8 and s[sidx] == nan_code
    # every other scale is what it was without the bad value
    others = np.ones(s.shape, bool)
    others[sidx] = False
    np.testing.assert_array_equal(s[others], np.asarray(clean.scales)[others])
    if q.tensor_scale is not None:  # NVFP4: the tensor scale is over finite values only
        assert float(q.tensor_scale) == float(clean.tensor_scale)
    y, yc = nqdq.dequantize(q), nqdq.dequantize(clean)
    assert np.isnan(y[group]).all()
    mask = np.ones(shape, bool)
    mask[group] = False
    np.testing.assert_array_equal(y[mask], yc[mask])
    np.testing.assert_array_equal(q.unpacked_codes()[mask], clean.unpacked_codes()[mask])


@pytest.mark.parametrize("scheme", ["fp8_tensor", "e5m2"])
def test_per_tensor_bad_value_spoils_everything(scheme):
    x = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
    x[2, 2] = np.inf
    q = nqdq.quantize(x, scheme, granularity="tensor") if scheme == "e5m2" else nqdq.quantize(x, scheme)
    assert np.isnan(np.asarray(q.scales)).all()
    assert np.isnan(nqdq.dequantize(q)).all()


def test_asymmetric_and_centred_side_arrays():
    x = np.random.default_rng(2).standard_normal((2, 128)).astype(np.float32)
    x[1, 3] = np.nan
    q = nqdq.quantize(x, "int8", symmetric=False)
    assert np.isfinite(np.asarray(q.scales)[0, 0]) and np.isnan(np.asarray(q.scales)[1, 0])
    assert np.asarray(q.zero_points).dtype == np.uint8  # no garbage from a NaN cast
    q = nqdq.quantize(x, "int8_centred")
    assert np.isfinite(np.asarray(q.means)[0, 0])
    assert np.isnan(nqdq.dequantize(q)[1]).all() and np.isfinite(nqdq.dequantize(q)[0]).all()


def test_nvfp4_all_nonfinite_tensor():
    x = np.full((1, 32), np.nan, np.float32)
    q = nqdq.quantize(x, "nvfp4")
    assert float(q.tensor_scale) == 1.0  # A over no finite values is 0 -> S_enc = 1
    assert np.asarray(q.scales).tolist() == [[0x7F, 0x7F]]
    assert np.isnan(nqdq.dequantize(q)).all()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("scheme", ["fp8_row", "mxfp4", "nvfp4", "int8_centred", "int4_group"])
def test_nonfinite_raise(scheme, bad):
    x = np.ones((2, 256), np.float32)
    nqdq.quantize(x, scheme, nonfinite="raise")  # finite input is fine
    x[1, 7] = bad
    with pytest.raises(ValueError, match="nonfinite"):
        nqdq.quantize(x, scheme, nonfinite="raise")


def test_nonfinite_raise_checks_half_inputs():
    x = np.ones((2, 32), np.float16)
    x[0, 0] = np.inf
    with pytest.raises(ValueError, match="nonfinite"):
        nqdq.quantize(x, "mxfp4", nonfinite="raise")


def test_overflow_to_inf_in_half_input_is_nonfinite():
    # a float16 inf is an inf: the policy applies after the exact conversion
    x = np.ones((1, 64), np.float16)
    x[0, 40] = np.float16(np.inf)
    q = nqdq.quantize(x, "mxfp8")
    # block 0: amax 1, rceil: 1 * fp32(1/448) = 2^-8.8 -> smallest 2^k above is 2^-8 -> 127 - 8 = 119
    assert np.asarray(q.scales).tolist() == [[119, 0xFF]]
