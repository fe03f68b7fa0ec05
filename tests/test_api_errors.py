"""Bad input raises a clear error that names the argument; empty input works."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nqdq

X = np.ones((4, 64), np.float32)


def Q(**kw):
    scheme = kw.pop("scheme", "e4m3")
    x = kw.pop("x", X)
    return nqdq.quantize(x, scheme, **kw)


ERRORS = [
    # (id, callable, exception type, regex the message must match)
    ("unknown scheme", lambda: Q(scheme="fp9"), ValueError, r"scheme='fp9'"),
    ("scheme not str", lambda: Q(scheme=3), TypeError, r"\bscheme\b"),
    ("scale format as scheme", lambda: Q(scheme="e8m0"), ValueError, r"scheme='e8m0'"),
    ("unknown option", lambda: Q(foo=1), TypeError, r"foo"),
    ("unknown granularity", lambda: Q(granularity="diag"), ValueError, r"granularity='diag'"),
    ("integer input", lambda: Q(x=np.ones((4, 64), np.int32)), TypeError, r"\bx\b.*int"),
    ("unsigned input", lambda: Q(x=np.ones((4, 64), np.uint8)), TypeError, r"\bx\b"),
    ("bool input", lambda: Q(x=np.ones((4, 64), bool)), TypeError, r"\bx\b.*bool"),
    ("complex input", lambda: Q(x=np.ones((4, 64), np.complex64)), TypeError, r"\bx\b.*complex"),
    ("float64 input", lambda: Q(x=np.ones((4, 64))), TypeError, r"\bx\b.*float64"),
    ("fp8 input", lambda: Q(x=np.ones((4, 64), ml_dtypes.float8_e4m3fn)), TypeError, r"\bx\b"),
    ("not an array", lambda: Q(x={"a": 1}), TypeError, r"\bx\b"),
    ("0-d input", lambda: Q(x=np.array(1.0, np.float32)), ValueError, r"\bx\b.*dimension"),
    ("granularity conflicts with preset", lambda: Q(scheme="mxfp4", granularity="row"), ValueError,
     r"granularity='row'.*mxfp4"),
    ("group_size without group", lambda: Q(granularity="row", group_size=32), ValueError, r"group_size"),
    ("group_size on MX", lambda: Q(scheme="mxfp4", group_size=16), ValueError, r"group_size=16"),
    ("group_size on nvfp4", lambda: Q(scheme="nvfp4", group_size=32), ValueError, r"group_size=32"),
    ("group_size 0", lambda: Q(granularity="group", group_size=0), ValueError, r"group_size"),
    ("group_size negative", lambda: Q(granularity="group", group_size=-4), ValueError, r"group_size"),
    ("group_size float", lambda: Q(granularity="group", group_size=32.0), ValueError, r"group_size"),
    ("group_size bool", lambda: Q(granularity="group", group_size=True), ValueError, r"group_size"),
    ("block_shape without block", lambda: Q(granularity="group", block_shape=(2, 2)), ValueError, r"block_shape"),
    ("block_shape 3 dims", lambda: Q(granularity="block", block_shape=(2, 2, 2)), ValueError, r"block_shape"),
    ("block_shape negative", lambda: Q(granularity="block", block_shape=(2, -2)), ValueError, r"block_shape"),
    ("block_shape zero", lambda: Q(granularity="block", block_shape=0), ValueError, r"block_shape"),
    ("block on 1-D", lambda: Q(scheme="fp8_128x128", x=np.ones(64, np.float32)), ValueError, r"granularity='block'"),
    ("column on 1-D", lambda: Q(scheme="int8_column", x=np.ones(64, np.float32)), ValueError, r"granularity='column'"),
    ("axis out of range", lambda: Q(axis=2), ValueError, r"axis=2"),
    ("axis out of range negative", lambda: Q(axis=-3), ValueError, r"axis=-3"),
    ("axis out of range group", lambda: Q(granularity="group", group_size=4, axis=5), ValueError, r"axis=5"),
    ("axis out of range column", lambda: Q(granularity="column", axis=2), ValueError, r"axis=2"),
    ("axis float", lambda: Q(axis=1.0), TypeError, r"\baxis\b"),
    ("packed group along another axis", lambda: Q(scheme="e2m1", granularity="group", group_size=2, axis=0),
     ValueError, r"axis=0"),
    ("stochastic without seed", lambda: Q(rounding="stochastic"), ValueError, r"seed"),
    ("seed without stochastic", lambda: Q(seed=1), ValueError, r"seed"),
    ("negative seed", lambda: Q(rounding="stochastic", seed=-1), ValueError, r"seed"),
    ("seed too large", lambda: Q(rounding="stochastic", seed=2**64), ValueError, r"seed"),
    ("float seed", lambda: Q(rounding="stochastic", seed=1.5), ValueError, r"seed"),
    ("unknown rounding", lambda: Q(rounding="up"), ValueError, r"rounding='up'"),
    ("bad scale_rounding", lambda: Q(scheme="mxfp4", scale_rounding="ceil"), ValueError, r"scale_rounding='ceil'"),
    ("scale_rounding on non-MX", lambda: Q(scale_rounding="floor"), ValueError, r"scale_rounding"),
    ("scale_rounding on nvfp4", lambda: Q(scheme="nvfp4", scale_rounding="rceil"), ValueError, r"scale_rounding"),
    ("symmetric=False on float", lambda: Q(symmetric=False), ValueError, r"symmetric=False"),
    ("symmetric=False on centred", lambda: Q(scheme="int8_centred", symmetric=False), ValueError, r"symmetric=False"),
    ("symmetric not bool", lambda: Q(scheme="int8", symmetric=0), TypeError, r"symmetric"),
    ("static scale 0", lambda: Q(granularity="tensor", scale=0.0), ValueError, r"\bscale\b"),
    ("static scale negative", lambda: Q(granularity="tensor", scale=-1.0), ValueError, r"\bscale\b"),
    ("static scale NaN", lambda: Q(granularity="tensor", scale=np.nan), ValueError, r"\bscale\b"),
    ("static scale inf", lambda: Q(granularity="tensor", scale=np.inf), ValueError, r"\bscale\b"),
    ("static scale one bad entry", lambda: Q(granularity="row", scale=np.array([[1.0], [1.0], [0.0], [1.0]])),
     ValueError, r"\bscale\b"),
    ("static scale wrong shape", lambda: Q(granularity="row", scale=np.ones(3, np.float32)), ValueError, r"\bscale\b"),
    ("static scale string", lambda: Q(granularity="tensor", scale="a"), TypeError, r"\bscale\b"),
    ("static scale on MX", lambda: Q(scheme="mxfp4", scale=1.0), ValueError, r"\bscale\b"),
    ("static scale on nvfp4, two values", lambda: Q(scheme="nvfp4", scale=np.ones(2, np.float32)), ValueError,
     r"\bscale\b"),
    ("static scale asymmetric", lambda: Q(scheme="int8", symmetric=False, scale=1.0), ValueError, r"\bscale\b"),
    ("unknown nonfinite", lambda: Q(nonfinite="ignore"), ValueError, r"nonfinite='ignore'"),
    ("unknown scale_layout", lambda: Q(scale_layout="swizzled"), ValueError, r"scale_layout='swizzled'"),
    ("unknown device", lambda: Q(device="tpu"), ValueError, r"device='tpu'"),
    # dequantize
    ("dequantize int dtype", lambda: nqdq.dequantize(Q(), dtype=np.int32), TypeError, r"dtype"),
    ("dequantize float64", lambda: nqdq.dequantize(Q(), dtype=np.float64), TypeError, r"dtype"),
    ("dequantize bad dtype name", lambda: nqdq.dequantize(Q(), dtype="float8"), TypeError, r"dtype='float8'"),
    ("dequantize not a QuantizedTensor", lambda: nqdq.dequantize(X), TypeError, r"\bq\b"),
    # encode / decode
    ("encode unknown format", lambda: nqdq.encode(X, "e9m9"), ValueError, r"fmt='e9m9'"),
    ("encode int input", lambda: nqdq.encode(np.ones(4, np.int32), "e4m3"), TypeError, r"\bx\b"),
    ("encode int saturate=False", lambda: nqdq.encode(X, "int8", saturate=False), ValueError, r"saturate"),
    ("encode ue4m3 negative", lambda: nqdq.encode(-X, "ue4m3"), ValueError, r"\bx\b"),
    ("decode unknown format", lambda: nqdq.decode(np.zeros(4, np.uint8), "e9m9"), ValueError, r"fmt='e9m9'"),
    ("decode float codes", lambda: nqdq.decode(np.ones(4, np.float32), "e4m3"), TypeError, r"codes"),
    ("decode bad dtype", lambda: nqdq.decode(np.ones(4, np.uint8), "e4m3", dtype=np.int8), TypeError, r"dtype"),
    ("decode length unpacked", lambda: nqdq.decode(np.ones(4, np.uint8), "e4m3", length=3), ValueError, r"length"),
]


@pytest.mark.parametrize("call,exc,match", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_error_names_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_float64_message_suggests_a_cast():
    with pytest.raises(TypeError, match=r"astype\(np\.float32\)"):
        Q(x=np.ones((2, 32)))


def test_unknown_scheme_lists_known_ones():
    with pytest.raises(ValueError, match=r"mxfp4.*nvfp4"):
        Q(scheme="mxfp5")


@pytest.mark.parametrize("scheme", ["fp8_tensor", "fp8_128x128"])
def test_axis_is_ignored_where_it_has_no_meaning(scheme):
    # tensor and block granularities do not use axis: passing one must not change anything
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    a = nqdq.quantize(x, scheme)
    b = nqdq.quantize(x, scheme, axis=0)
    np.testing.assert_array_equal(a.codes, b.codes)
    np.testing.assert_array_equal(a.scales, b.scales)


def test_valid_options_are_accepted():
    # the positive side of the checks above
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    Q(x=x, scheme="mxfp4", scale_rounding="floor")
    Q(x=x, rounding="stochastic", seed=np.uint64(2**64 - 1))
    Q(x=x, granularity="tensor", scale=np.float32(0.01))
    Q(x=x, granularity="row", scale=np.full((4, 1), 0.01, np.float32))
    Q(x=x, device="cpu", nonfinite="raise", scale_layout="linear")
    Q(x=x, scheme="int4", granularity="block", block_shape=(2, 32), symmetric=False)
    nqdq.dequantize(Q(x=x), dtype="bfloat16")


def test_non_contiguous_input_is_read_correctly():
    x = np.random.default_rng(2).standard_normal((64, 128)).astype(np.float32)
    v = x[:, ::2]
    a = nqdq.quantize(v, "mxfp4")
    b = nqdq.quantize(np.ascontiguousarray(v), "mxfp4")
    np.testing.assert_array_equal(a.codes, b.codes)
    np.testing.assert_array_equal(a.scales, b.scales)


# ----------------------------------------------------------------------------- empty input
EMPTY_SHAPES = [(0, 32), (3, 0), (0,), (0, 0), (2, 0, 32)]


EMPTY_CASES = [(s, shp) for s in nqdq.schemes() for shp in EMPTY_SHAPES
               if not (s in ("fp8_128x128", "int8_column") and len(shp) < 2)]  # those need 2-D


@pytest.mark.parametrize("scheme,shape", EMPTY_CASES)
def test_empty_input(scheme, shape):
    x = np.zeros(shape, np.float32)
    q = nqdq.quantize(x, scheme)
    assert tuple(q.shape) == shape
    # docs/numerics.md: scales have ceil(dim / extent) entries per axis
    assert np.asarray(q.scales).shape == q.scheme.scale_shape(shape)
    assert np.asarray(q.scales).size == 0  # ceil(0 / extent) = 0 along the empty axis
    if q.scheme.tensor_scale:
        assert float(q.tensor_scale) == 1.0
    y = nqdq.dequantize(q)
    assert y.shape == shape and y.dtype == np.float32
    assert nqdq.dequantize(q, dtype=ml_dtypes.bfloat16).shape == shape


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1", "e2m3", "int4", "int8", "e8m0"])
@pytest.mark.parametrize("shape", [(0,), (0, 32), (3, 0)])
def test_empty_encode_decode(fmt, shape):
    c = nqdq.encode(np.zeros(shape, np.float32), fmt)
    assert c.size == 0 and c.shape[:-1] == shape[:-1]
    assert nqdq.decode(c, fmt, **({"length": shape[-1]} if fmt in ("e2m1", "e2m3", "int4") else {})).shape == shape


def test_big_endian_float32_input():
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    a = nqdq.quantize(x.astype(">f4"), "mxfp4")
    b = nqdq.quantize(x, "mxfp4")
    np.testing.assert_array_equal(a.codes, b.codes)
    np.testing.assert_array_equal(nqdq.encode(x.astype(">f8"), "e4m3"), nqdq.encode(x.astype(np.float64), "e4m3"))
