"""Every scheme round-trips with the accuracy its element format allows; scheme resolution,
scale shapes and axis handling.

SQNR thresholds. A float format with M mantissa bits rounds each value with an error
uniform over one ulp, so for a value in [2^e, 2^(e+1)) the noise power is
(2^(e-M))^2 / 12 while the signal power, averaged over a uniform significand in [1, 2),
is (7/3) 2^(2e): SQNR ~= 10 log10(28 * 4^M) = 14.5 + 6.02 M dB, independent of the scale
while the values stay in the normal range:
    M = 3 (e4m3, e2m3): 32.5 dB     M = 2 (e5m2, e3m2): 26.5 dB     M = 1 (e2m1): 20.5 dB
Gaussian data has more small significands than a uniform law, so real figures sit ~1 dB
lower; we allow ~3.5 dB below theory, and more where the format's exponent range is the
limit: e2m3 has two exponent bits, so elements more than 8x below the block's largest
fall into its subnormals (absolute step 2^-3 of the block scale); e2m1 spans only
0.5..6 (values below 1/12 of the block max round to 0) and a power-of-two MX scale leaves
the top binade partly unused; MX "floor" clips the top of a block (up to 448..512 -> 448
for e4m3) and loses another ~1 dB.

A uniform integer quantizer with step s adds noise s^2 / 12 per element. With s =
amax / qmax the Gaussian figure is 10 log10(12 qmax^2 sigma^2 / amax^2): over a row of 512
amax ~= 3.3 sigma -> int8 42.5 dB; a column of 256, amax ~= 3.2 sigma -> 42.8 dB; groups of
128, amax ~= 2.8 sigma -> int8 44 dB, int4 18.8 dB; asymmetric groups span ~5.5 sigma over
qmax steps -> int8 43 dB, int4 19.5 dB. For any input (the outlier-heavy weight too) the
same model gives a data-dependent prediction from the scales actually chosen,
10 log10(sum x^2 / sum s_g^2 / 12), and the round trip must come within 1 dB of it
(values far below one step round to 0 with error |x| < s/2, which only helps).
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from helpers.spec import per_element, sqnr_db

import nqdq


def gaussian():
    return np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)


def llm_weight():
    """Shaped like an LLM linear weight: N(0, 0.02), four input channels (columns) ten
    times larger (the channel outliers seen in real checkpoints), and 16 isolated entries
    of +-0.5 (25 sigma)."""
    rng = np.random.default_rng(20240601)
    w = rng.standard_normal((256, 512)) * 0.02
    w[:, [3, 97, 200, 411]] *= 10
    r = rng.integers(0, 256, 16)
    c = rng.integers(0, 512, 16)
    w[r, c] = np.where(rng.random(16) < 0.5, -1, 1) * 0.5
    return w.astype(np.float32)


INPUTS = {"gaussian": gaussian(), "llm_weight": llm_weight()}

# Minimum SQNR (dB) per element format for (gaussian, llm_weight); see the module docstring.
FLOAT_THRESHOLDS = {
    "e4m3": (29.0, 29.0),  # 32.5 theory; e4m3's 17 binades absorb the outliers
    "e5m2": (23.0, 23.0),  # 26.5 theory
    "e3m2": (23.0, 23.0),  # 26.5 theory; 3 exponent bits = 7 binades, enough for a block
    "e2m3": (28.0, 26.0),  # 32.5 theory, minus subnormal loss (worse beside outliers)
    "e2m1": (16.0, 13.0),  # 20.5 theory, minus range/flush-to-zero loss (worse beside outliers)
}
INT_THRESHOLDS = {  # Gaussian, from 10 log10(12 qmax^2 sigma^2 / amax^2) minus ~3 dB
    ("int8", "row", True): 39.0,
    ("int8", "column", True): 39.0,
    ("int8", "group", True): 40.0,  # int8_centred, groups of 128
    ("int4", "group", True): 16.0,
    ("int8", "block", True): 39.0,  # 64x32 tiles: amax ~= 3.5 sigma -> 42 dB
    ("int8", "row", False): 39.0,
    ("int8", "column", False): 39.0,
    ("int4", "group", False): 16.5,
}
NVFP4_THRESHOLD = (17.0, 17.0)  # e2m1 with a non-power-of-two scale per 16: >= mxfp4


def cases():
    out = [(s, {}) for s in nqdq.schemes()]
    out += [("int8", dict(symmetric=False)), ("int4", dict(symmetric=False)),
            ("int8_row", dict(symmetric=False)), ("int4_group", dict(symmetric=False)),
            ("int8", dict(granularity="column", symmetric=False))]
    for r in ("floor", "rceil", "even"):
        for s in ("mxfp8", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4"):
            out.append((s, dict(scale_rounding=r)))
    out += [("e4m3", dict(granularity="tensor")), ("e4m3", dict(granularity="column")),
            ("e4m3", dict(granularity="group", group_size=64)), ("e5m2", dict(granularity="block")),
            ("int8", dict(granularity="block", block_shape=(64, 32)))]
    return out


def _id(case):
    s, kw = case
    return s + "".join(f"-{k}={v}" for k, v in kw.items())


@pytest.mark.parametrize("case", cases(), ids=_id)
@pytest.mark.parametrize("which", list(INPUTS))
def test_round_trip_sqnr(case, which):
    scheme, kw = case
    x = INPUTS[which]
    q = nqdq.quantize(x, scheme, **kw)
    y = nqdq.dequantize(q)
    assert y.shape == x.shape and y.dtype == np.float32
    assert np.isfinite(y).all()
    got = sqnr_db(x, y)
    sch = q.scheme
    i = list(INPUTS).index(which)
    if sch.element.kind == "int":
        # data-dependent prediction from the scales chosen (uniform-noise model)
        s = per_element(np.asarray(q.scales, np.float64), sch.block_for(x.shape), x.shape)
        predicted = 10 * np.log10(np.sum(x.astype(np.float64) ** 2) / np.sum(s * s / 12))
        assert got > predicted - 1.0, f"{scheme} {kw}: {got:.2f} dB vs uniform-noise model {predicted:.2f} dB"
        if which == "gaussian":
            thr = INT_THRESHOLDS[(sch.fmt, sch.granularity, sch.symmetric)]
            assert got > thr, f"{scheme} {kw}: {got:.2f} dB < {thr}"
        return
    if sch.is_nvfp4:
        thr = NVFP4_THRESHOLD[i]
    else:
        thr = FLOAT_THRESHOLDS[sch.fmt][i]
        if sch.scale_rounding == "floor":
            thr -= 1.0  # floor saturates the top of each block
    assert got > thr, f"{scheme} {kw} on {which}: SQNR {got:.2f} dB < {thr} dB"


def test_sqnr_ordering_sanity():
    """More mantissa bits, more accuracy, on the same data and the same MX blocks."""
    x = INPUTS["gaussian"]
    s = {n: sqnr_db(x, nqdq.dequantize(nqdq.quantize(x, n))) for n in ("mxfp8", "mxfp6_e2m3", "mxfp8_e5m2", "mxfp4")}
    assert s["mxfp8"] > s["mxfp8_e5m2"] + 4 > s["mxfp4"] + 8
    assert s["mxfp6_e2m3"] > s["mxfp8_e5m2"]


# ----------------------------------------------------------------------------- resolution
PRESETS = {  # what each preset means, written from SPEC.md / the schemes docstring
    "mxfp8": ("e4m3", "group", 32, "e8m0"),
    "mxfp8_e4m3": ("e4m3", "group", 32, "e8m0"),
    "mxfp8_e5m2": ("e5m2", "group", 32, "e8m0"),
    "mxfp6_e2m3": ("e2m3", "group", 32, "e8m0"),
    "mxfp6_e3m2": ("e3m2", "group", 32, "e8m0"),
    "mxfp4": ("e2m1", "group", 32, "e8m0"),
    "nvfp4": ("e2m1", "group", 16, "ue4m3"),
    "fp8_1x128": ("e4m3", "group", 128, "f32"),
    "fp8_128x128": ("e4m3", "block", None, "f32"),
    "int8_centred": ("int8", "group", 128, "f32"),
    "fp8_tensor": ("e4m3", "tensor", None, "f32"),
    "fp8_row": ("e4m3", "row", None, "f32"),
    "int8_row": ("int8", "row", None, "f32"),
    "int8_column": ("int8", "column", None, "f32"),
    "int4_group": ("int4", "group", 128, "f32"),
}


def test_schemes_lists_presets_and_formats():
    names = nqdq.schemes()
    assert set(PRESETS) <= set(names)
    assert {"e4m3", "e5m2", "e2m1", "e2m3", "e3m2", "int8", "int4"} <= set(names)
    assert len(names) == len(set(names))


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_meaning(name):
    fmt, gran, group, scale_format = PRESETS[name]
    x = np.ones((4, 256), np.float32)
    sch = nqdq.quantize(x, name).scheme
    assert (sch.fmt, sch.granularity, sch.scale_format) == (fmt, gran, scale_format)
    if group is not None:
        assert sch.group_size == group
    if name == "fp8_128x128":
        assert tuple(sch.block_shape) == (128, 128)
    assert sch.centred == (name == "int8_centred")
    assert sch.tensor_scale == (name == "nvfp4")
    assert (sch.scale_rounding is not None) == (scale_format == "e8m0")


@pytest.mark.parametrize("name", ["mxfp4", "mxfp8", "mxfp6_e3m2"])
def test_mx_default_scale_rounding_is_rceil(name):
    # docs/numerics.md: rceil is the default (TransformerEngine / cuBLAS)
    assert nqdq.quantize(np.ones((1, 32), np.float32), name).scheme.scale_rounding == "rceil"


@pytest.mark.parametrize("name", ["e2m1", "e2m3", "e3m2"])
def test_bare_narrow_float_format_means_its_mx_scheme(name):
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    a = nqdq.quantize(x, name)
    b = nqdq.quantize(x, {"e2m1": "mxfp4", "e2m3": "mxfp6_e2m3", "e3m2": "mxfp6_e3m2"}[name])
    np.testing.assert_array_equal(a.codes, b.codes)
    np.testing.assert_array_equal(a.scales, b.scales)


# (scheme, options, input shape, expected scale shape): ceil(dim / extent) per axis
SCALE_SHAPES = [
    ("fp8_tensor", {}, (5, 7, 9), (1, 1, 1)),
    ("fp8_row", {}, (5, 7, 9), (5, 7, 1)),
    ("e4m3", dict(granularity="row", axis=1), (5, 7, 9), (5, 1, 9)),
    ("e4m3", dict(granularity="row", axis=0), (5, 7, 9), (1, 7, 9)),
    ("int8_column", {}, (5, 7, 9), (1, 1, 9)),
    ("int8", dict(granularity="column", axis=0), (6, 10), (6, 1)),
    ("int8", dict(granularity="column", axis=1), (4, 6, 10), (1, 6, 1)),
    ("fp8_1x128", {}, (3, 300), (3, 3)),
    ("e4m3", dict(granularity="group", group_size=32, axis=0), (50, 3), (2, 3)),
    ("fp8_128x128", {}, (130, 200), (2, 2)),
    ("fp8_128x128", {}, (2, 130, 200), (2, 2, 2)),
    ("e4m3", dict(granularity="block", block_shape=(16, 8)), (33, 17), (3, 3)),
    ("e4m3", dict(granularity="block", block_shape=4), (8, 9), (2, 3)),
    ("mxfp4", {}, (3, 50), (3, 2)),
    ("mxfp6_e2m3", {}, (2, 3, 65), (2, 3, 3)),
    ("nvfp4", {}, (3, 50), (3, 4)),
    ("int4_group", {}, (2, 129), (2, 2)),
    ("int8_centred", {}, (2, 300), (2, 3)),
]


@pytest.mark.parametrize("scheme,kw,shape,sshape", SCALE_SHAPES)
def test_scale_shapes(scheme, kw, shape, sshape):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    q = nqdq.quantize(x, scheme, **kw)
    assert np.asarray(q.scales).shape == sshape
    assert tuple(q.shape) == shape
    assert nqdq.dequantize(q).shape == shape
    if q.zero_points is not None:
        assert np.asarray(q.zero_points).shape == sshape
    if q.means is not None:
        assert np.asarray(q.means).shape == sshape


# ----------------------------------------------------------------------------- axes
@pytest.mark.parametrize("fmt", ["e4m3", "int8"])
def test_row_axis_is_transposed_row(fmt):
    x = np.random.default_rng(2).standard_normal((6, 40)).astype(np.float32)
    a = nqdq.quantize(x, fmt, granularity="row", axis=0)
    b = nqdq.quantize(np.ascontiguousarray(x.T), fmt, granularity="row", axis=-1)
    np.testing.assert_array_equal(np.asarray(a.codes), np.asarray(b.codes).T)
    np.testing.assert_array_equal(np.asarray(a.scales), np.asarray(b.scales).T)


def test_column_is_one_scale_per_index_along_axis():
    x = np.random.default_rng(3).standard_normal((6, 40)).astype(np.float32)
    x[:, 5] *= 100
    q = nqdq.quantize(x, "int8", granularity="column")  # axis=-1: one scale per column
    s = np.asarray(q.scales)
    assert s.shape == (1, 40)
    np.testing.assert_array_equal(s[0], (np.abs(x).max(axis=0) / np.float32(127)).astype(np.float32))
    # column along axis=-1 groups exactly like row along axis=0
    r = nqdq.quantize(x, "int8", granularity="row", axis=0)
    np.testing.assert_array_equal(s, np.asarray(r.scales))
    np.testing.assert_array_equal(q.codes, r.codes)
    # column along axis 0: one scale per row index
    c0 = nqdq.quantize(x, "int8", granularity="column", axis=0)
    np.testing.assert_array_equal(np.asarray(c0.scales)[:, 0],
                                  (np.abs(x).max(axis=1) / np.float32(127)).astype(np.float32))


def test_column_on_3d_reduces_all_other_axes():
    x = np.random.default_rng(4).standard_normal((3, 4, 5)).astype(np.float32)
    q = nqdq.quantize(x, "int8", granularity="column", axis=1)
    want = (np.abs(x).max(axis=(0, 2)) / np.float32(127)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(q.scales).reshape(-1), want)


def test_group_axis_is_transposed_group():
    x = np.random.default_rng(5).standard_normal((70, 6)).astype(np.float32)
    a = nqdq.quantize(x, "e4m3", granularity="group", group_size=32, axis=0)
    b = nqdq.quantize(np.ascontiguousarray(x.T), "e4m3", granularity="group", group_size=32)
    np.testing.assert_array_equal(np.asarray(a.codes), np.asarray(b.codes).T)
    np.testing.assert_array_equal(np.asarray(a.scales), np.asarray(b.scales).T)


def test_negative_and_positive_axis_agree():
    x = np.random.default_rng(6).standard_normal((3, 4, 40)).astype(np.float32)
    for gran in ("row", "column"):
        a = nqdq.quantize(x, "e4m3", granularity=gran, axis=1)
        b = nqdq.quantize(x, "e4m3", granularity=gran, axis=-2)
        np.testing.assert_array_equal(a.codes, b.codes)
        np.testing.assert_array_equal(a.scales, b.scales)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("scheme", ["mxfp4", "nvfp4", "fp8_row", "int8_centred", "int4_group", "mxfp6_e3m2"])
def test_half_inputs_same_as_their_float32(scheme, dtype):
    x = (np.random.default_rng(7).standard_normal((8, 256)) * 3).astype(dtype)
    a = nqdq.quantize(x, scheme)
    b = nqdq.quantize(x.astype(np.float32), scheme)
    assert a.dtype == np.dtype(dtype).name
    np.testing.assert_array_equal(a.codes, b.codes)
    np.testing.assert_array_equal(a.scales, b.scales)
    y32 = nqdq.dequantize(b)
    for out, want_dtype in ((np.float16, np.float16), (ml_dtypes.bfloat16, ml_dtypes.bfloat16),
                            ("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)):
        y = nqdq.dequantize(a, dtype=out)
        assert y.dtype == np.dtype(want_dtype)
        # computed in float32, rounded once to the output type
        np.testing.assert_array_equal(y.view(np.uint16), y32.astype(want_dtype).view(np.uint16))


# ----------------------------------------------------------------------------- from_dict (file metadata)
@pytest.mark.parametrize("name", nqdq.schemes())
def test_from_dict_round_trips_every_scheme(name):
    from nqdq.schemes import Scheme, resolve_scheme

    sch = resolve_scheme(name)
    assert Scheme.from_dict(sch.to_dict()) == sch
    assert Scheme.from_dict(json.loads(json.dumps(sch.to_dict()))) == sch  # as a file holds it


@pytest.mark.parametrize(
    "kw",
    [dict(scheme="e4m3", granularity="group", group_size=64), dict(scheme="int8", granularity="block", block_shape=(64, 32)),
     dict(scheme="mxfp4", scale_rounding="floor"), dict(scheme="int4", symmetric=False, group_size=16),
     dict(scheme="e2m1", granularity="group", group_size=16), dict(scheme="e4m3", axis=0),
     dict(scheme="fp8_tensor", static_scale=True)],
)  # fmt: skip
def test_from_dict_round_trips_options(kw):
    from nqdq.schemes import Scheme, resolve_scheme

    sch = resolve_scheme(**kw)
    assert Scheme.from_dict(json.loads(json.dumps(sch.to_dict()))) == sch


def _fp8_1x128(**change):
    from nqdq.schemes import resolve_scheme

    return {**resolve_scheme("fp8_1x128").to_dict(), **change}


@pytest.mark.parametrize(
    "d,message",
    [
        ([1, 2], r"must be a JSON object, got list"),
        ("mxfp4", r"must be a JSON object, got str"),
        ({}, r"fields \['name', 'fmt', 'granularity'\] are missing"),
        ({"name": "mxfp4", "fmt": "e2m1"}, r"\['granularity'\] are missing"),
        (_fp8_1x128(colour="red"), r"unknown scheme fields \['colour'\]"),
        (_fp8_1x128(granularity="diagonal"), r"granularity='diagonal' \(expected 'group'\)"),
        (_fp8_1x128(group_size=0), r"group_size must be a positive int"),
        (_fp8_1x128(group_size="128"), r"group_size='128' has the wrong type"),
        (_fp8_1x128(group_size=True), r"group_size=True has the wrong type"),
        (_fp8_1x128(axis="last"), r"axis='last' has the wrong type"),
        (_fp8_1x128(symmetric=1), r"symmetric=1 has the wrong type"),
        (_fp8_1x128(fmt="e8m0"), r"fmt='e8m0' \(expected 'e4m3'\)"),
        (_fp8_1x128(name="e8m0", fmt="e8m0"), r"'e8m0' is a scale format"),
        (_fp8_1x128(scale_format="bogus"), r"scale_format='bogus' \(expected 'f32'\)"),
        (_fp8_1x128(scale_rounding="floor"), r"scale_rounding applies to MX schemes only"),
        (_fp8_1x128(name="nosuch"), r"scheme='nosuch' is unknown"),
        (_fp8_1x128(block_shape=[1, 2, 3]), r"block_shape=\[1, 2, 3\] is not a pair of ints"),
        (_fp8_1x128(centred=True), r"centred=True \(expected False\)"),
    ],
)
def test_from_dict_refuses_what_quantize_would(d, message):
    # issue 44, item 3: a list gave AttributeError, missing keys KeyError, fmt="e8m0" and
    # scale_format="bogus" were accepted
    from nqdq.schemes import Scheme

    with pytest.raises(ValueError, match=message):
        Scheme.from_dict(d)


# ----------------------------------------------------------------------------- groups longer than their axis
def test_group_longer_than_its_axis_is_bounded():
    # issue 44, item 7: group_size=10**13 on a (1, 256) input asked for 36 TiB (MemoryError)
    x = np.random.default_rng(5).standard_normal((1, 256)).astype(np.float32)
    with pytest.raises(ValueError, match=r"group_size=10000000000000 is longer than axis 1 of x \(length 256\)"):
        nqdq.quantize(x, "e4m3", granularity="group", group_size=10**13)
    with pytest.raises(ValueError, match=r"block_shape\[0\]=1048576 is longer than axis 0"):
        nqdq.quantize(x, "e4m3", granularity="block", block_shape=(2**20, 128))
    with pytest.raises(ValueError, match=r"block_shape\[1\]=257"):
        nqdq.quantize(x, "e4m3", granularity="block", block_shape=(1, 257))


def test_group_longer_than_its_axis_up_to_128_is_one_partial_group():
    # a short axis keeps working with the presets' groups (and any group up to 128): one
    # partial group, as if padded with zeros: the same scale as a group the axis' length
    x = np.random.default_rng(6).standard_normal((3, 20)).astype(np.float32)
    a = nqdq.quantize(x, "e4m3", granularity="group", group_size=128)
    b = nqdq.quantize(x, "e4m3", granularity="group", group_size=20)
    np.testing.assert_array_equal(a.scales.view(np.uint32), b.scales.view(np.uint32))
    np.testing.assert_array_equal(a.codes, b.codes)
    assert nqdq.quantize(x, "mxfp4").scales.shape == (3, 1)
    assert nqdq.quantize(x, "fp8_128x128").scales.shape == (1, 1)
    with pytest.raises(ValueError, match=r"group_size=129 is longer than axis 1"):
        nqdq.quantize(x, "e4m3", granularity="group", group_size=129)
    nqdq.quantize(np.zeros((2, 300), np.float32), "e4m3", granularity="group", group_size=300)  # = the axis
