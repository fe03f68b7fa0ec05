"""Saving and loading QuantizedTensor: .npz and .safetensors round trips, refusal of files
from a newer nqdq, and refusal of files nqdq did not write."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

import nqdq

ARRAYS = ("codes", "scales", "zero_points", "tensor_scale", "means")

CASES = [
    ("mxfp4", {}, np.float32, (3, 50)),
    ("mxfp6_e3m2", dict(scale_rounding="floor"), np.float32, (2, 70)),
    ("mxfp8_e5m2", {}, ml_dtypes.bfloat16, (4, 64)),
    ("nvfp4", {}, np.float16, (5, 48)),
    ("fp8_128x128", {}, np.float32, (130, 200)),
    ("fp8_1x128", {}, ml_dtypes.bfloat16, (3, 256)),
    ("int8", dict(symmetric=False), np.float32, (6, 33)),
    ("int4", dict(symmetric=False, granularity="group", group_size=16), np.float32, (4, 40)),
    ("int4_group", {}, np.float16, (2, 130)),
    ("int8_centred", {}, np.float32, (3, 200)),
    ("int8_column", {}, np.float32, (4, 7, 9)),
    ("e4m3", dict(granularity="row", axis=0), np.float32, (8, 5)),
    ("fp8_tensor", {}, np.float32, (0, 16)),
]


def _ids(c):
    return f"{c[0]}-{np.dtype(c[2]).name}-{'x'.join(map(str, c[3]))}"


@pytest.fixture(params=[".npz", ".safetensors"])
def ext(request):
    return request.param


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_round_trip(tmp_path, ext, case):
    scheme, kw, dtype, shape = case
    x = (np.random.default_rng(0).standard_normal(shape) * 4).astype(dtype)
    if x.size:
        x.reshape(-1)[3] = np.nan  # a NaN group must survive too
    q = nqdq.quantize(x, scheme, **kw)
    path = tmp_path / f"q{ext}"
    q.save(path)
    r = nqdq.load(path)
    assert r.scheme == q.scheme
    assert tuple(r.shape) == tuple(q.shape)
    assert r.dtype == np.dtype(dtype).name
    assert r.scale_layout == q.scale_layout
    assert r.format_version == nqdq.FORMAT_VERSION
    for k in ARRAYS:
        a, b = getattr(q, k), getattr(r, k)
        assert (a is None) == (b is None), k
        if a is not None:
            a, b = np.asarray(a), np.asarray(b)
            assert a.dtype == b.dtype and a.shape == b.shape, (k, a.dtype, b.dtype, a.shape, b.shape)
            np.testing.assert_array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8), err_msg=k)  # bits
    ya, yb = nqdq.dequantize(q), nqdq.dequantize(r)
    np.testing.assert_array_equal(ya.view(np.uint32), yb.view(np.uint32))


def test_the_file_name_is_kept(tmp_path):
    q = nqdq.quantize(np.ones((2, 32), np.float32), "mxfp4")
    path = tmp_path / "weights.bin"  # not .npz: written as npz under the given name
    q.save(path)
    assert path.exists() and not (tmp_path / "weights.bin.npz").exists()
    np.testing.assert_array_equal(nqdq.load(path).codes, q.codes)
    q.save(str(tmp_path / "w.safetensors"))  # str paths too
    np.testing.assert_array_equal(nqdq.load(str(tmp_path / "w.safetensors")).codes, q.codes)


# ----------------------------------------------------------------------------- versions
def _bump_npz(src, dst, edit):
    with np.load(src, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays["__nqdq__"]))
    edit(meta)
    arrays["__nqdq__"] = np.array(json.dumps(meta))
    with open(dst, "wb") as fh:
        np.savez(fh, **arrays)


def _bump_safetensors(src, dst, edit):
    with safe_open(src, framework="numpy") as f:
        header = dict(f.metadata())
        arrays = {k: f.get_tensor(k) for k in f.keys()}
    meta = json.loads(header["__nqdq__"])
    edit(meta)
    header["__nqdq__"] = json.dumps(meta)
    save_file(arrays, dst, metadata=header)


def _rewrite(tmp_path, ext, edit):
    q = nqdq.quantize(np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32), "nvfp4")
    src, dst = tmp_path / f"a{ext}", tmp_path / f"b{ext}"
    q.save(src)
    (_bump_npz if ext == ".npz" else _bump_safetensors)(str(src), str(dst), edit)
    return q, dst


def test_rewrite_helper_is_faithful(tmp_path, ext):
    # editing nothing gives a file that loads to the same tensor (so the next test's
    # refusal is about the version, not about the rewrite)
    q, dst = _rewrite(tmp_path, ext, lambda m: None)
    np.testing.assert_array_equal(nqdq.dequantize(nqdq.load(dst)), nqdq.dequantize(q))


def test_newer_format_version_is_refused(tmp_path, ext):
    def bump(meta):
        meta["format_version"] = nqdq.FORMAT_VERSION + 1

    _, dst = _rewrite(tmp_path, ext, bump)
    with pytest.raises(ValueError, match=rf"format version {nqdq.FORMAT_VERSION + 1}.*[Uu]pgrade"):
        nqdq.load(dst)


def test_missing_format_version_is_refused(tmp_path, ext):
    _, dst = _rewrite(tmp_path, ext, lambda m: m.pop("format_version"))
    with pytest.raises(ValueError, match="format version"):
        nqdq.load(dst)


def test_missing_array_is_refused(tmp_path):
    q = nqdq.quantize(np.ones((2, 32), np.float32), "int8", symmetric=False)
    src = tmp_path / "a.npz"
    q.save(src)
    with np.load(src, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k != "zero_points"}
    dst = tmp_path / "b.npz"
    with open(dst, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(ValueError, match="zero_points"):
        nqdq.load(dst)


# ----------------------------------------------------------------------------- foreign files
def test_foreign_npz_is_refused(tmp_path):
    path = tmp_path / "other.npz"
    np.savez(path, weight=np.random.default_rng(0).standard_normal((4, 4)), codes=np.zeros(3, np.uint8))
    with pytest.raises(ValueError, match="not an nqdq file"):
        nqdq.load(path)


def test_foreign_safetensors_is_refused(tmp_path):
    path = tmp_path / "other.safetensors"
    save_file({"weight": np.zeros((4, 4), np.float32)}, str(path))
    with pytest.raises(ValueError, match="nqdq metadata"):
        nqdq.load(path)
    path2 = tmp_path / "other2.safetensors"
    save_file({"codes": np.zeros((4, 4), np.uint8)}, str(path2), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="nqdq metadata"):
        nqdq.load(path2)


def test_random_bytes_are_refused(tmp_path):
    path = tmp_path / "junk.safetensors"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 1000, dtype=np.uint8).tobytes())
    with pytest.raises(ValueError, match="junk.safetensors"):
        nqdq.load(path)
