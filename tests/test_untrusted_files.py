"""A file is untrusted input (issue 44): ``nqdq.load`` checks the metadata through the checks
``quantize`` makes and every array against the shape and dtype the metadata implies before
reading it, reads only the members the metadata names, and raises ValueError naming the file
and the array; saves are atomic."""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile

import numpy as np
import pytest
from safetensors.numpy import save_file

import nqdq


def _x(shape=(4, 256), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture(params=[".npz", ".safetensors"])
def ext(request):
    return request.param


def _npz_members(path):
    with zipfile.ZipFile(path) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist()}


def _write_npz_members(path, members):
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)


def _meta_of(q):
    return json.loads(json.dumps(q._metadata()))


def _write(path, arrays, meta):
    """A file holding ``arrays`` and the nqdq metadata ``meta``, written without nqdq."""
    path = str(path)
    if path.endswith(".safetensors"):
        save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, path, metadata={"__nqdq__": json.dumps(meta)})
    else:
        with open(path, "wb") as fh:
            np.savez(fh, **arrays, __nqdq__=np.array(json.dumps(meta)))


# ----------------------------------------------------------------------------- items 1 and 2: arrays
SPOILED = [
    ("mxfp4", "codes", lambda a: a[:, :100], r"array codes has shape \(4, 100\).*is \(4, 128\) uint8"),
    ("fp8_row", "scales", lambda a: a[:1], r"array scales has shape \(1, 1\).*is \(4, 1\) float32"),
    ("fp8_row", "scales", lambda a: a.reshape(-1)[:1].reshape(()), r"array scales has shape \(1,\)"),  # saved 1-d
    ("fp8_row", "scales", lambda a: a.view(np.uint8), r"array scales has shape \(4, 4\)"),
    ("fp8_row", "scales", lambda a: a.astype(np.float64), r"array scales has shape \(4, 1\) and dtype (float64|F64)"),
    ("mxfp8", "scales", lambda a: a[:, :7], r"array scales has shape \(4, 7\)"),
    ("nvfp4", "scales", lambda a: a[:1], r"array scales has shape \(1, 16\)"),
    ("int8_asym", "zero_points", lambda a: a[:1], r"array zero_points has shape \(1, 1\)"),
    ("int8_centred", "means", lambda a: a[:, :1], r"array means has shape \(4, 1\)"),
    ("int8_row", "codes", lambda a: a.view(np.uint8), r"array codes has shape \(4, 256\) and dtype (uint8|U8)"),
]


@pytest.mark.parametrize("scheme,array,spoil,message", SPOILED, ids=lambda v: v if isinstance(v, str) else "")
def test_load_refuses_arrays_that_disagree_with_the_metadata(tmp_path, ext, scheme, array, spoil, message):
    # issue 44, items 1 and 2: these loaded, then read out of bounds on the GPU or decoded wrong
    q = nqdq.quantize(_x(), scheme)
    path = tmp_path / f"c{ext}"
    dataclasses.replace(q, **{array: spoil(getattr(q, array))}).save(path)
    with pytest.raises(ValueError, match=rf"c{ext}: {message}"):
        nqdq.load(path)


@pytest.mark.parametrize("scheme,array", [("nvfp4", "tensor_scale"), ("int8_asym", "zero_points"), ("int8_centred", "means")])
def test_load_refuses_missing_arrays(tmp_path, ext, scheme, array):
    # issue 44, item 2: a missing array gave an unrelated numpy AxisError on decode
    q = nqdq.quantize(_x(), scheme)
    meta = _meta_of(q)
    arrays = {k: getattr(q, k) for k in meta["arrays"] if k != array}
    path = tmp_path / f"m{ext}"
    _write(path, arrays, meta)
    with pytest.raises(ValueError, match=rf"m{ext}: array {array} is listed in the metadata but missing"):
        nqdq.load(path)
    meta["arrays"].remove(array)  # unlisted too: the scheme has it
    _write(path, arrays, meta)
    with pytest.raises(ValueError, match=rf"array {array} is not listed in the metadata, but scheme '{scheme}' has"):
        nqdq.load(path)


def test_load_refuses_bad_tensor_scale_values(tmp_path, ext):
    q = nqdq.quantize(_x(), "nvfp4")
    for value in (np.nan, np.inf, 0.0, -1.0):
        path = tmp_path / f"t{ext}"
        dataclasses.replace(q, tensor_scale=np.array(value, np.float32)).save(path)
        with pytest.raises(ValueError, match=rf"t{ext}: array tensor_scale is .*finite and positive"):
            nqdq.load(path)


def test_load_refuses_zero_points_beyond_the_code_range(tmp_path, ext):
    q = nqdq.quantize(_x(), "int4_asym")
    zp = q.zero_points.copy()
    zp[1, 1] = 16
    path = tmp_path / f"z{ext}"
    dataclasses.replace(q, zero_points=zp).save(path)
    with pytest.raises(ValueError, match=r"array zero_points holds 16 > 15"):
        nqdq.load(path)


def test_loaded_spoiled_file_cannot_reach_the_kernel(tmp_path):
    # the example: the simulator raised IndexError in the decoder
    q = nqdq.quantize(_x(), "mxfp4")
    dataclasses.replace(q, codes=q.codes[:, :100]).save(tmp_path / "c.npz")
    with pytest.raises(ValueError, match="c.npz: array codes"):
        nqdq.dequantize(nqdq.load(tmp_path / "c.npz"), device="cuda")


# ----------------------------------------------------------------------------- item 3: metadata
@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda m: m.update(scheme=[1, 2]), r"scheme metadata: a scheme must be a JSON object, got list"),
        (lambda m: m["scheme"].pop("granularity"), r"scheme metadata: scheme fields \['granularity'\] are missing"),
        (lambda m: m["scheme"].update(fmt="e8m0"), r"scheme metadata: .*fmt='e8m0'"),
        (lambda m: m["scheme"].update(scale_format="bogus"), r"scheme metadata: .*scale_format='bogus'"),
        (lambda m: m["scheme"].update(group_size=0), r"scheme metadata: .*group_size must be a positive int"),
        (lambda m: m["scheme"].update(group_size=2**40), r"group_size=1099511627776 is longer than axis 1"),
        (lambda m: m["scheme"].update(group_size=2**24), r"group_size=16777216 is longer than axis 1"),
        (lambda m: m["scheme"].update(axis=5), r"axis=5 is out of range"),
        (lambda m: m.update(shape=[4, "256"]), r"shape=\[4, '256'\] in the metadata is not a list of ints"),
        (lambda m: m.update(shape=[4, -256]), r"shape=\(4, -256\) has a negative length"),
        (lambda m: m.update(shape=[2**40, 2**40]), r"array codes is a member of|array codes has shape"),
        (lambda m: m.update(dtype="float64"), r"dtype='float64' in the metadata is not one of"),
        (lambda m: m.update(scale_layout="nv_256x8"), r"scale_layout='nv_256x8' is not one of"),
        (lambda m: m.update(arrays="codes"), r"arrays='codes' in the metadata is not a list"),
        (lambda m: m.update(format_version=True), r"no nqdq format version"),
    ],
)
def test_load_refuses_bad_metadata(tmp_path, ext, edit, message):
    q = nqdq.quantize(_x(), "fp8_1x128")
    meta = _meta_of(q)
    edit(meta)
    path = tmp_path / f"b{ext}"
    _write(path, {k: getattr(q, k) for k in ("codes", "scales")}, meta)
    with pytest.raises(ValueError, match=rf"b{ext}: {message}"):
        nqdq.load(path)


def test_load_refuses_metadata_that_is_not_json(tmp_path):
    q = nqdq.quantize(_x(), "fp8_row")
    path = tmp_path / "j.safetensors"
    save_file({"codes": q.codes, "scales": q.scales}, str(path), metadata={"__nqdq__": "{not json"})
    with pytest.raises(ValueError, match="j.safetensors: the nqdq metadata is not JSON"):
        nqdq.load(path)


# ----------------------------------------------------------------------------- item 4: atomic saves
@pytest.mark.parametrize("ext", [".npz", ".safetensors"])
def test_a_failed_save_leaves_the_old_file(tmp_path, monkeypatch, ext):
    path = tmp_path / f"w{ext}"
    old = nqdq.quantize(_x(seed=1), "mxfp4")
    old.save(path)
    before = path.read_bytes()

    def half_then_fail(*args, **kwargs):  # a disk that fills half-way through the write
        fh = args[0] if ext == ".npz" else None
        target = fh if fh is not None else open(args[1], "wb")
        target.write(b"PK\x03\x04" + b"\0" * 100)
        target.flush()
        raise OSError(28, "No space left on device")

    if ext == ".npz":
        monkeypatch.setattr(np, "savez", half_then_fail)
    else:
        import safetensors.numpy

        monkeypatch.setattr(safetensors.numpy, "save_file", half_then_fail)
    with pytest.raises(OSError, match="No space left"):
        nqdq.quantize(_x(seed=2), "fp8_row").save(path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == [path.name]  # no temporary left behind
    np.testing.assert_array_equal(nqdq.load(path).codes, old.codes)


def test_save_replaces_and_keeps_permissions(tmp_path, ext):
    path = tmp_path / f"p{ext}"
    nqdq.quantize(_x(seed=3), "fp8_row").save(path)
    os.chmod(path, 0o640)
    q = nqdq.quantize(_x(seed=4), "nvfp4")
    q.save(path)
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert os.listdir(tmp_path) == [path.name]
    np.testing.assert_array_equal(nqdq.dequantize(nqdq.load(path)).view(np.uint32), nqdq.dequantize(q).view(np.uint32))


# ----------------------------------------------------------------------------- item 5: damaged zips
def test_truncated_npz_names_the_file(tmp_path):
    path = tmp_path / "t.npz"
    nqdq.quantize(_x(), "fp8_row").save(path)
    data = path.read_bytes()
    for cut in (len(data) // 2, len(data) - 10, 3):
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=r"t\.npz"):  # was a raw zipfile.BadZipFile
            nqdq.load(path)


def test_corrupt_member_names_the_file(tmp_path):
    path = tmp_path / "crc.npz"
    q = nqdq.quantize(_x(), "fp8_row")
    q.save(path)
    members = _npz_members(path)
    codes = bytearray(members["codes.npy"])
    codes[-1] ^= 0xFF
    members["codes.npy"] = bytes(codes)
    _write_npz_members(path, members)
    with zipfile.ZipFile(path, "r") as zf:  # rewrite the stored CRC of the original bytes
        info = zf.getinfo("codes.npy")
    raw = bytearray(path.read_bytes())
    import zlib

    good = zlib.crc32(bytes(codes)).to_bytes(4, "little")
    bad = (zlib.crc32(bytes(codes)) ^ 1).to_bytes(4, "little")
    assert raw.count(good) >= 1
    path.write_bytes(bytes(raw).replace(good, bad))
    with pytest.raises(ValueError, match=r"crc\.npz: not a readable \.npz file .*CRC"):
        nqdq.load(path)
    assert info.file_size == len(codes)


# ----------------------------------------------------------------------------- item 8: only named members
def test_load_reads_only_the_members_the_metadata_names(tmp_path, monkeypatch):
    path = tmp_path / "x.npz"
    q = nqdq.quantize(_x(), "mxfp4")
    q.save(path)
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("junk.npy", b"\0" * (1 << 20))  # read by np.load's z[k] for every k before
    opened = []
    real_open = zipfile.ZipFile.open

    def spy(self, name, *args, **kwargs):
        opened.append(getattr(name, "filename", name))
        return real_open(self, name, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", spy)
    r = nqdq.load(path)
    assert sorted(opened) == ["__nqdq__.npy", "codes.npy", "scales.npy"]
    np.testing.assert_array_equal(r.codes, q.codes)
    np.testing.assert_array_equal(r.scales, q.scales)


def test_member_size_is_checked_before_reading(tmp_path, monkeypatch):
    # a member whose size in the zip directory does not fit the metadata is refused unread
    path = tmp_path / "big.npz"
    q = nqdq.quantize(_x(), "fp8_row")
    members = _npz_members(_saved(q, tmp_path / "src.npz"))
    members["scales.npy"] += b"\0" * 100_000  # trailing bytes: a larger member
    _write_npz_members(path, members)
    monkeypatch.setattr(zipfile.ZipFile, "open", _refuse_member("scales.npy"))
    with pytest.raises(ValueError, match=r"big\.npz: array scales is a member of 100\d\d\d bytes, but the float32"):
        nqdq.load(path)


def _saved(q, path):
    q.save(path)
    return path


def _refuse_member(member):
    real_open = zipfile.ZipFile.open

    def guarded(self, name, *args, **kwargs):
        assert getattr(name, "filename", name) != member, f"{member} was opened"
        return real_open(self, name, *args, **kwargs)

    return guarded


def test_npy_header_is_checked_before_reading(tmp_path):
    # right size, wrong header (float32 scales saved with a uint8 header of the same bytes)
    path = tmp_path / "h.npz"
    q = nqdq.quantize(_x(), "fp8_row")
    members = _npz_members(_saved(q, tmp_path / "src.npz"))
    import io

    buf = io.BytesIO()
    np.save(buf, q.scales.view(np.uint8))
    members["scales.npy"] = buf.getvalue()
    _write_npz_members(path, members)
    with pytest.raises(ValueError, match=r"h\.npz: array scales has shape \(4, 4\) and dtype uint8"):
        nqdq.load(path)
