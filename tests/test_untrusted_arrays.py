"""A QuantizedTensor is untrusted input: ``dequantize`` (both backends), ``with_layout`` and
``matmul`` check the shape, dtype and presence of every array against what its scheme, shape
and scale layout imply (``QuantizedTensor.check_arrays``) before anything reads them, so a
hand-built or crafted ``q`` is a ValueError naming the array, never an out-of-bounds read in
a kernel (the simulator raised IndexError; a GPU reads past the end) nor a silently wrong
decode (short scales broadcast, float64 scales read as twice as many float32)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import nqdq
from nqdq.quantized import expected_arrays
from nqdq.schemes import Scheme, resolve_scheme


def _x(shape=(4, 256), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# (scheme, array, how to spoil it, what the error says): each one a fault issue 44 found
SPOILED = [
    ("mxfp4", "codes", lambda a: a[:, :100], r"codes has shape \(4, 100\).*\(4, 128\)"),
    ("mxfp4", "codes", lambda a: a.view(np.int8), r"codes has dtype int8"),
    ("fp8_row", "codes", lambda a: a[:3], r"codes has shape \(3, 256\)"),
    ("fp8_row", "scales", lambda a: a[:1], r"scales has shape \(1, 1\).*\(4, 1\)"),
    ("fp8_row", "scales", lambda a: np.float32(2.0), r"scales has shape \(\)"),
    ("fp8_row", "scales", lambda a: np.ones((4, 1), np.uint8), r"scales has dtype uint8.*float32"),
    ("fp8_row", "scales", lambda a: a.astype(np.float64), r"scales has dtype float64"),
    ("fp8_1x128", "scales", lambda a: a[:, :1], r"scales has shape \(4, 1\).*\(4, 2\)"),
    ("mxfp8", "scales", lambda a: a[:, :7], r"scales has shape \(4, 7\).*e8m0.*\(4, 8\)"),
    ("mxfp8", "scales", lambda a: a.view(np.int8), r"scales has dtype int8"),
    ("nvfp4", "scales", lambda a: a[:2], r"scales has shape \(2, 16\)"),
    ("nvfp4", "tensor_scale", lambda a: None, r"tensor_scale is missing"),
    ("nvfp4", "tensor_scale", lambda a: np.ones(2, np.float32), r"tensor_scale has shape \(2,\)"),
    ("nvfp4", "tensor_scale", lambda a: np.float32(np.nan), r"tensor_scale is nan.*finite"),
    ("nvfp4", "tensor_scale", lambda a: np.float32(0.0), r"tensor_scale is 0.0.*positive"),
    ("int8_asym", "zero_points", lambda a: a[:1], r"zero_points has shape \(1, 1\).*\(4, 1\)"),
    ("int8_asym", "zero_points", lambda a: None, r"zero_points is missing"),
    ("int4_asym", "zero_points", lambda a: a[:, :1], r"zero_points has shape \(4, 1\).*\(4, 2\)"),
    ("int8_centred", "means", lambda a: a[:, :1], r"means has shape \(4, 1\).*\(4, 2\)"),
    ("int8_centred", "means", lambda a: None, r"means is missing"),
    ("fp8_row", "zero_points", lambda a: np.zeros((4, 1), np.uint8), r"zero_points is set.*has no zero_points"),
    ("int8_row", "codes", lambda a: a.view(np.uint8), r"codes has dtype uint8.*int8"),
]


def _spoil(scheme, array, spoil):
    q = nqdq.quantize(_x(), scheme)
    return dataclasses.replace(q, **{array: spoil(getattr(q, array))})


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("scheme,array,spoil,message", SPOILED, ids=lambda v: v if isinstance(v, str) else "")
def test_dequantize_refuses_spoiled_arrays(device, scheme, array, spoil, message):
    q = _spoil(scheme, array, spoil)
    with pytest.raises(ValueError, match=rf"q\.{message}"):
        nqdq.dequantize(q, device=device)  # "cuda": the simulator, which raised IndexError


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_valid_q_decodes_as_before(device):
    # the checks refuse nothing quantize makes: every scheme decodes bit for bit as the reference
    x = _x((3, 64), seed=1)
    for name in ("mxfp4", "mxfp6_e2m3", "nvfp4", "fp8_row", "fp8_128x128", "int8_asym", "int4_asym",
                 "int8_centred", "int8_column", "fp8_tensor"):  # fmt: skip
        q = nqdq.quantize(x, name)
        q.check_arrays()
        got = nqdq.dequantize(q, device=device)
        want = nqdq.dequantize(q, device="cpu")
        np.testing.assert_array_equal(np.asarray(got).view(np.uint32), want.view(np.uint32), err_msg=name)


def test_short_scales_no_longer_decode_silently():
    # issue 44, item 2: rows 1-3 decoded with row 0's scale
    q = nqdq.quantize(_x(), "fp8_row")
    with pytest.raises(ValueError, match=r"q\.scales has shape \(1, 1\)"):
        nqdq.dequantize(dataclasses.replace(q, scales=q.scales[:1]))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_matmul_refuses_spoiled_operands(device):
    qa = nqdq.quantize(_x((4, 64), seed=2), "int8_asym")
    qb = nqdq.quantize(_x((8, 64), seed=3), "int8_row")
    with pytest.raises(ValueError, match=r"qa\.zero_points has shape \(1, 1\)"):
        nqdq.matmul(dataclasses.replace(qa, zero_points=qa.zero_points[:1]), qb, device=device)
    with pytest.raises(ValueError, match=r"qb\.scales has shape \(1, 1\)"):
        nqdq.matmul(qa, dataclasses.replace(qb, scales=qb.scales[:1]), device=device)
    with pytest.raises(ValueError, match=r"qb\.codes has shape \(8, 32\)"):
        nqdq.matmul(qa, dataclasses.replace(qb, codes=qb.codes[:, :32]), device=device)


def test_with_layout_refuses_short_swizzled_scales():
    q = nqdq.quantize(_x((4, 256)), "mxfp4", scale_layout="nv_128x4")
    bad = dataclasses.replace(q, scales=q.scales[:, :1, :8])
    with pytest.raises(ValueError, match=r"q\.scales has shape \(1, 1, 8, 4, 4\).*scale_layout='nv_128x4'"):
        bad.with_layout("linear")
    with pytest.raises(ValueError, match=r"q\.scales has shape \(1, 1, 8, 4, 4\)"):
        nqdq.dequantize(bad)


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(scale_layout="nv_256x8"), r"scale_layout='nv_256x8' is not one of"),
        (dict(dtype="float64"), r"dtype='float64' is not one of"),
        (dict(shape=(4, 255)), r"codes has shape \(4, 256\)"),
        (dict(shape=(4.0, 256)), r"shape=\(4\.0, 256\) is not a tuple of"),
        (dict(shape=(-4, 256)), r"negative"),
        (dict(shape=()), r"at least one dimension"),
        (dict(codes=[[1, 2]]), r"q\.codes must be an array, got list"),
        (dict(scheme="fp8_row"), r"scheme must be a nqdq Scheme"),
    ],
)
def test_dequantize_refuses_bad_fields(change, message):
    q = nqdq.quantize(_x(), "fp8_row")
    q.check_arrays()  # with the (4, 256) shape in the cache: (4.0, 256) must not hit it
    with pytest.raises(ValueError, match=message):
        nqdq.dequantize(dataclasses.replace(q, **change))


@pytest.mark.parametrize(
    "scheme,message",
    [
        (Scheme(name="e4m3", fmt="e4m3", granularity="group", group_size=0), r"group_size must be a positive int"),
        (Scheme(name="e4m3", fmt="e8m0", granularity="row"), r"fmt='e8m0' \(expected 'e4m3'\)"),
        (Scheme(name="e4m3", fmt="e4m3", granularity="row", scale_format="e8m0"), r"scale_format='e8m0'"),
        (Scheme(name="e4m3", fmt="e4m3", granularity="block", block_shape=[128, 128]), r"not a Scheme"),
    ],
)
def test_dequantize_refuses_hand_built_schemes(scheme, message):
    q = nqdq.quantize(_x(), "fp8_row")
    with pytest.raises(ValueError, match=message):
        nqdq.dequantize(dataclasses.replace(q, scheme=scheme))


def test_expected_arrays_spells_out_every_array():
    sch = resolve_scheme("nvfp4")
    spec = expected_arrays(sch, (3, 50), "nv_128x4")
    assert spec["codes"].shape == (3, 25) and spec["codes"].dtype == np.uint8
    assert spec["scales"].shape == (1, 1, 32, 4, 4) and spec["scales"].dtype == np.uint8
    assert spec["tensor_scale"].shape == () and spec["tensor_scale"].dtype == np.float32
    assert spec["zero_points"] is None and spec["means"] is None
    spec = expected_arrays(resolve_scheme("mxfp6_e3m2"), (2, 5, 70))
    assert spec["codes"].shape == (2, 5, 54)  # 70 six-bit codes: 18 groups of 3 bytes
    assert spec["scales"].shape == (2, 5, 3)
    spec = expected_arrays(resolve_scheme("int4_asym"), (2, 130))
    assert spec["codes"].shape == (2, 65) and spec["zero_points"].shape == (2, 2)
