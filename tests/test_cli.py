"""The ``nqdq`` command: ``report`` on the built-in sample and on .npy/.npz/.safetensors files
(bfloat16 included), ``schemes``, ``--version`` and the errors (exit status 2).

main() runs in-process with argv lists; one test runs ``python -m nqdq report`` with no
argument as a subprocess (the real, LLM-sized default)."""

import dataclasses
import io
import json
import math
import os
import struct
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import nqdq
from nqdq.tools import report as R
from nqdq.tools.cli import main
from nqdq.schemes import resolve_scheme

SMALL = "64x512"  # small enough for fast tests, 128-divisible for the block schemes
FEW = "mxfp8,mxfp4,nvfp4,fp8_128x128,int8_column,fp8_row"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys, *argv):
    rc, out, err = run(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out), err


def write_safetensors(path, tensors):
    """A safetensors file written by hand: {name: (dtype tag, array)}, so that the test
    does not depend on what the safetensors NumPy API can save (bfloat16)."""
    header, blobs, offset = {}, [], 0
    for name, (tag, arr) in tensors.items():
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": tag, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"written_by": "test_cli"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def roundtrip_stats(x, scheme):
    q = nqdq.quantize(x, scheme)
    return q.bits_per_value, R.error_stats(x.astype(np.float32), nqdq.dequantize(q))


# --------------------------------------------------------------------------- the sample


def test_sample_is_deterministic_llm_like():
    a = R.sample_weight((64, 1024))
    assert a.dtype == np.float32 and a.shape == (64, 1024)
    np.testing.assert_array_equal(a, R.sample_weight((64, 1024)))
    assert not np.array_equal(a, R.sample_weight((64, 1024), seed=1))
    col_amax = np.abs(a).max(axis=0)
    assert (col_amax > 4 * np.median(col_amax)).sum() == 1024 // 512  # the outlier columns
    row_rms = np.sqrt((a.astype(np.float64) ** 2).mean(axis=1))
    assert row_rms.max() / row_rms.min() > 2  # per-channel scale variation


def test_sample_report_lists_every_scheme_with_sane_numbers(capsys):
    rows, _ = run_json(capsys, "report", "--sample-shape", SMALL)
    by = {r["scheme"]: r for r in rows}
    picked, _ = R.resolve_schemes(None)
    assert list(by) == [n for n, _ in picked]
    # every name of nqdq.schemes() is reported, or is an alias of a reported scheme
    reported = {dataclasses.replace(resolve_scheme(n), name="") for n in by}
    assert all(dataclasses.replace(resolve_scheme(n), name="") in reported for n in nqdq.schemes())

    n = 64 * 512
    assert by["nvfp4"]["bits_per_value"] == pytest.approx(4.5 + 32 / n, abs=0, rel=1e-12)
    assert by["mxfp4"]["bits_per_value"] == 4.25
    assert by["fp8_tensor"]["bits_per_value"] == 8 + 32 / n
    assert by["mxfp8"]["sqnr_db"] > by["mxfp6_e2m3"]["sqnr_db"] > by["mxfp4"]["sqnr_db"]
    assert by["int8_row"]["sqnr_db"] > by["int4_group"]["sqnr_db"]
    for r in rows:
        assert set(r) >= {"tensor", "scheme", "bits_per_value", "compression", "sqnr_db", "rel_l2", "max_abs_err"}
        assert r["tensor"] == "sample" and r["dtype"] == "float32" and r["shape"] == [64, 512]
        assert r["compression"] == pytest.approx(32 / r["bits_per_value"])
        assert 8 < r["sqnr_db"] < 60, r
        assert r["rel_l2"] == pytest.approx(10 ** (-r["sqnr_db"] / 20), rel=1e-9)
        assert 0 < r["max_abs_err"] < 1


def test_sample_table(capsys):
    rc, out, _ = run(capsys, "report", "--sample-shape", SMALL, "--schemes", FEW)
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("input: built-in sample") and "64x512" in lines[0]
    head = next(i for i, l in enumerate(lines) if l.startswith("scheme"))
    table = lines[head : head + 2 + 6]
    assert [l.split()[0] for l in table[2:]] == FEW.split(",")
    assert len({len(l) for l in table}) == 1  # aligned: numbers right-justified to one width
    x = R.sample_weight((64, 512))
    bits, st = roundtrip_stats(x, "nvfp4")
    nv = next(l for l in table if l.startswith("nvfp4")).split()
    assert nv[1] == f"{bits:.3f}" and nv[3] == f"{st['sqnr_db']:.2f}" and nv[5] == f"{st['max_abs_err']:.3e}"


def test_python_m_nqdq_default_report():
    """The real default: `python -m nqdq report`, 1024x4096, every scheme."""
    p = subprocess.run([sys.executable, "-m", "nqdq", "report"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "1024x4096" in p.stdout and "4,194,304 values" in p.stdout
    rows = {l.split()[0]: l.split() for l in p.stdout.splitlines() if l.split()}
    for name, _ in R.resolve_schemes(None)[0]:
        assert name in rows, name
    assert float(rows["mxfp8"][3]) > float(rows["mxfp4"][3])
    assert rows["nvfp4"][1] == "4.500"
    assert "note: aliases not repeated: " in p.stdout
    assert p.stderr == ""  # no progress bar when stderr is not a TTY


# --------------------------------------------------------------------------- statistics


def test_error_stats_by_hand():
    st = R.error_stats(np.array([1.0, 2.0], np.float32), np.array([1.0, 1.0], np.float32))
    assert st["sqnr_db"] == pytest.approx(10 * math.log10(5 / 1))
    assert st["rel_l2"] == pytest.approx(math.sqrt(1 / 5))
    assert st["max_abs_err"] == 1.0
    exact = R.error_stats(np.array([0.5, -3.0]), np.array([0.5, -3.0]))
    assert exact["sqnr_db"] == math.inf and exact["rel_l2"] == 0 and exact["max_abs_err"] == 0
    nan = R.error_stats(np.array([1.0, np.nan]), np.array([1.0, 0.0]))
    assert nan["sqnr_db"] == math.inf  # NaN positions are left out


def test_lossless_is_null_in_json(capsys, tmp_path):
    x = np.tile(np.array([0.5, -1.0, 2.0, 4.0], np.float32), (2, 8))  # exact in every 8-bit float scheme
    np.save(tmp_path / "exact.npy", x)
    rows, _ = run_json(capsys, "report", str(tmp_path / "exact.npy"), "--schemes", "fp8_tensor")
    assert rows[0]["sqnr_db"] is None and rows[0]["rel_l2"] == 0
    rc, out, _ = run(capsys, "report", str(tmp_path / "exact.npy"), "--schemes", "fp8_tensor")
    assert rc == 0 and out.splitlines()[5].split()[:4] == ["fp8_tensor", "8.500", "3.76x", "inf"]


# --------------------------------------------------------------------------- files


def test_npy_float16_matches_the_api(capsys, tmp_path):
    x = R.sample_weight((32, 256), seed=3).astype(np.float16)
    np.save(tmp_path / "w.npy", x.astype(">f2"))  # big-endian on disk: read as float16
    rows, _ = run_json(capsys, "report", str(tmp_path / "w.npy"), "--schemes", "mxfp4,int8_row")
    got = [(r["tensor"], r["scheme"], r["dtype"]) for r in rows]
    assert got == [("w", "mxfp4", "float16"), ("w", "int8_row", "float16")]
    bits, st = roundtrip_stats(x, "mxfp4")
    assert rows[0]["sqnr_db"] == st["sqnr_db"] and rows[0]["max_abs_err"] == st["max_abs_err"]
    assert rows[0]["compression"] == 16 / bits
    # --tensor on a .npy: its one tensor is named after the file
    assert len(run_json(capsys, "report", str(tmp_path / "w.npy"), "--tensor", "w", "--schemes", "mxfp4")[0]) == 1


def test_npz_multi_tensor_with_notes(capsys, tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "m.npz"
    np.savez(
        path,
        weight=R.sample_weight((128, 256)),
        bias=rng.standard_normal(256).astype(np.float32),  # 1-D: no block/column scales
        ids=np.arange(10),  # integer: skipped
        scalar=np.float32(2.0),  # 0-d: skipped
        empty=np.zeros((0, 32), np.float32),  # no values: skipped
        w64=rng.standard_normal((4, 64)),  # float64: converted
    )
    rc, out, _ = run(capsys, "report", str(path), "--schemes", "mxfp4,fp8_128x128,int8_column")
    assert rc == 0
    assert "input: " in out and "(6 tensors)" in out
    assert "note: scalar: skipped: a 0-d tensor (shape ())" in out
    assert "note: empty: skipped: an empty tensor (shape (0, 32))" in out
    assert "note: bias: fp8_128x128 skipped: granularity='block' needs x with at least 2 dimensions" in out
    assert "note: bias: int8_column skipped" in out
    assert "note: ids: skipped: integer tensor (int64)" in out
    assert "note: w64: float64 input converted to float32" in out
    assert "note: w64: fp8_128x128 skipped" not in out  # 4x64 is one partial 128x128 tile
    assert "all 3 tensors" in out and "(2/3 tensors)" in out

    rows, err = run_json(capsys, "report", str(path), "--schemes", "mxfp4,fp8_128x128,int8_column")
    got = [(r["tensor"], r["scheme"]) for r in rows]
    assert got == [("weight", "mxfp4"), ("weight", "fp8_128x128"), ("weight", "int8_column"), ("bias", "mxfp4"),
                   ("w64", "mxfp4"), ("w64", "fp8_128x128"), ("w64", "int8_column")]
    w64 = [r for r in rows if r["tensor"] == "w64"]
    assert all(r["dtype"] == "float64" and r["compression"] == 64 / r["bits_per_value"] for r in w64)
    assert "note: ids: skipped" in err  # notes go to stderr with --json


def test_aggregate_rows_weigh_by_size():
    a = R.Row("a", (2,), "float32", "s", "e4m3", "row", 8.0, 4.0, 0, 0, 0.5, 100, signal=10.0, noise=1.0)
    b = R.Row("b", (2,), "float16", "s", "e4m3", "row", 4.0, 4.0, 0, 0, 0.25, 300, signal=3000.0, noise=3.0)
    (t,) = R.aggregate_rows([a, b])
    assert t.numel == 400 and t.n_tensors == 2 and t.max_abs_err == 0.5
    rel = (100 * 0.1 + 300 * 0.001) / 400  # size-weighted relative noise power, whatever the tensors' scale
    assert t.sqnr_db == pytest.approx(-10 * math.log10(rel)) and t.rel_l2 == pytest.approx(math.sqrt(rel))
    assert t.bits_per_value == pytest.approx((800 + 1200) / 400)
    assert t.compression == pytest.approx((32 * 100 + 16 * 300) / (800 + 1200))


def test_safetensors_float32_multi_tensor_and_tensor_option(capsys, tmp_path):
    from safetensors.numpy import save_file

    a = R.sample_weight((64, 256), seed=1)
    b = R.sample_weight((32, 128), seed=2).astype(np.float16)
    save_file({"layers.0.w": a, "layers.1.w": b, "step": np.array([7], np.int32)}, str(tmp_path / "m.safetensors"))
    rows, err = run_json(capsys, "report", str(tmp_path / "m.safetensors"), "--schemes", "nvfp4")
    assert {(r["tensor"], r["dtype"]) for r in rows} == {("layers.0.w", "float32"), ("layers.1.w", "float16")}
    assert "step: skipped: integer tensor (int32)" in err
    rows, _ = run_json(capsys, "report", str(tmp_path / "m.safetensors"), "--tensor", "layers.1.w",
                       "--schemes", "nvfp4,mxfp8")
    assert [(r["tensor"], r["scheme"]) for r in rows] == [("layers.1.w", "nvfp4"), ("layers.1.w", "mxfp8")]
    assert rows[0]["sqnr_db"] == roundtrip_stats(b, "nvfp4")[1]["sqnr_db"]


def test_safetensors_bfloat16(capsys, tmp_path):
    bf = R.sample_weight((32, 256), seed=4).astype(ml_dtypes.bfloat16)
    f64 = np.linspace(-1, 1, 2 * 64).reshape(2, 64)
    path = tmp_path / "bf.safetensors"
    e8m0 = np.ones(4, np.uint8)  # a dtype NumPy has no name for in the file's tag table
    write_safetensors(path, {"w": ("BF16", bf.view(np.uint16)), "d": ("F64", f64), "e": ("F8_E8M0", e8m0)})
    srcs = {s.name: s for s in R.open_tensors(path)}
    loaded = srcs["w"].load()
    assert loaded.dtype == ml_dtypes.bfloat16 and loaded.shape == (32, 256)
    np.testing.assert_array_equal(loaded.view(np.uint16), bf.view(np.uint16))
    np.testing.assert_array_equal(srcs["d"].load(), f64)

    rows, err = run_json(capsys, "report", str(path), "--schemes", "mxfp4,fp8_row")
    w = [r for r in rows if r["tensor"] == "w"]
    assert [r["dtype"] for r in w] == ["bfloat16", "bfloat16"]
    assert w[0]["compression"] == 16 / 4.25
    assert w[0]["sqnr_db"] == roundtrip_stats(bf, "mxfp4")[1]["sqnr_db"]
    assert "d: float64 input converted to float32" in err
    assert "e: skipped: dtype F8_E8M0" in err


def test_nan_in_tensor_is_noted(capsys, tmp_path):
    x = R.sample_weight((4, 64))
    x[0, 0] = np.nan
    np.save(tmp_path / "n.npy", x)
    rows, err = run_json(capsys, "report", str(tmp_path / "n.npy"), "--schemes", "mxfp4")
    assert "n: 1 NaN/inf values; the statistics cover only" in err
    assert math.isfinite(rows[0]["sqnr_db"])


def test_only_integer_tensors_exit_1(capsys, tmp_path):
    np.save(tmp_path / "i.npy", np.arange(12).reshape(3, 4))
    rc, out, err = run(capsys, "report", str(tmp_path / "i.npy"))
    assert rc == 1 and "note: i: skipped: integer tensor" in out and "no tensor could be quantized" in err


def test_progress_bar_only_on_a_tty(capsys, tmp_path, monkeypatch):
    np.savez(tmp_path / "two.npz", a=R.sample_weight((8, 64)), b=R.sample_weight((8, 64), seed=1))

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(["report", str(tmp_path / "two.npz"), "--schemes", "mxfp4"]) == 0
    assert "nqdq report" in tty.getvalue()  # tqdm drew on the "terminal"
    tty.truncate(0)
    assert main(["report", str(tmp_path / "two.npz"), "--schemes", "mxfp4", "--json"]) == 0
    assert tty.getvalue().strip("\x00") == ""


# --------------------------------------------------------------------------- schemes, version


def test_schemes_command(capsys):
    rc, out, _ = run(capsys, "schemes")
    assert rc == 0
    names = [l.split()[0] for l in out.splitlines()[2:] if not l.startswith("*")]
    assert names == nqdq.schemes()
    assert "nvfp4         e2m1       4  group        1x16         ue4m3        4.500  + f32 tensor scale" in out
    rc, out, _ = run(capsys, "schemes", "--json")
    rows = {r["scheme"]: r for r in json.loads(out)}
    assert rows["fp8_128x128"]["scale_group"] == "128x128" and rows["mxfp4"]["scale_format"] == "e8m0"
    assert rows["e4m3"]["notes"] == "= fp8_row"


def test_version(capsys):
    rc, out, _ = run(capsys, "--version")
    assert rc == 0 and out.strip() == f"nqdq {nqdq.__version__}"


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "argv, message",
    [
        (["report", "{tmp}/missing.npy"], "argument FILE: no such file: "),
        (["report", "{tmp}/w.pt"], "argument FILE: unsupported file extension '.pt'"),
        (["report", "--schemes", "mxfp4,nope"], "argument --schemes: unknown scheme(s) 'nope'; known: mxfp8"),
        (["report", "--schemes", ","], "argument --schemes: no scheme given"),
        (["report", "{tmp}/m.safetensors", "--tensor", "nope"], "argument --tensor: no tensor named 'nope' in "),
        (["report", "--tensor", "w"], "argument --tensor: needs a FILE"),
        (["report", "{tmp}/m.safetensors", "--sample-shape", "8x8"], "argument --sample-shape: only applies"),
        (["report", "--sample-shape", "0x8"], "argument --sample-shape: '0x8' is not a shape"),
        (["report", "{tmp}/bad.safetensors"], "argument FILE: "),
        (["report", "{tmp}/bad.npz"], "argument FILE: "),
        (["frobnicate"], "argument COMMAND: invalid choice: 'frobnicate'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_errors_exit_2_naming_the_argument(capsys, tmp_path, argv, message):
    from safetensors.numpy import save_file

    save_file({"w": np.ones((2, 32), np.float32)}, str(tmp_path / "m.safetensors"))
    (tmp_path / "bad.safetensors").write_bytes(struct.pack("<Q", 10**9) + b"{}")
    (tmp_path / "bad.npz").write_bytes(b"not a zip file")
    (tmp_path / "w.pt").write_bytes(b"")
    rc, out, err = run(capsys, *[a.format(tmp=tmp_path) for a in argv])
    assert rc == 2
    assert message in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["report", "--seed", "-1"], "argument --seed: '-1' is not a seed (a non-negative integer)"),
        (["report", "--seed", "x"], "argument --seed: 'x' is not a seed"),
        (["report", "--sample-shape", "10000000x10000000"], "argument --sample-shape: '10000000x10000000' has "
                                                            "100,000,000,000,000 values; the built-in sample has at most"),
    ],
)  # fmt: skip
def test_sample_arguments_out_of_range_exit_2(capsys, argv, message):
    # issue 44, item 9: both exited 1 with a traceback
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and message in err, err
    assert "Traceback" not in err and out == ""


def _npz_of_two(path):
    rng = np.random.default_rng(7)
    np.savez(path, a=rng.standard_normal((8, 64)).astype(np.float32), b=rng.standard_normal((8, 64)).astype(np.float32))
    return path.read_bytes()


def test_truncated_npz_exits_2_naming_file(capsys, tmp_path):
    # issue 44, item 5: a raw zipfile.BadZipFile, a traceback and exit status 1
    path = tmp_path / "cut.npz"
    data = _npz_of_two(path)
    path.write_bytes(data[: len(data) // 2])
    rc, out, err = run(capsys, "report", str(path), "--schemes", "fp8_row")
    assert rc == 2 and "Traceback" not in err
    assert f"nqdq report: error: argument FILE: {path} is not a readable .npz file" in err, err


def test_npz_member_that_fails_to_read_exits_2_naming_file(capsys, tmp_path):
    # the zip directory is intact, a member's bytes are not (its CRC fails when it is read)
    path = tmp_path / "crc.npz"
    data = bytearray(_npz_of_two(path))
    i = data.index(b"b.npy") + 200  # inside member b's data (stored, not compressed)
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    rc, out, err = run(capsys, "report", str(path), "--schemes", "fp8_row")
    assert rc == 2 and "Traceback" not in err
    assert f"argument FILE: tensor 'b' of {path} cannot be read" in err, err


NASTY = {"\x1b]0;owned\x07\x1b[31mred": "escape sequences", "w\nnote: fake": "a fake note line", "rtl\u202eexe": "U+202E"}


def test_tensor_names_reach_the_terminal_escaped(capsys, tmp_path):
    # issue 44, item 10: a name from a file could drive the terminal or forge a line
    path = tmp_path / "names.safetensors"
    rng = np.random.default_rng(8)
    write_safetensors(path, {name: ("F32", rng.standard_normal((4, 64)).astype(np.float32)) for name in NASTY})
    rc, out, err = run(capsys, "report", str(path), "--schemes", "fp8_row")
    assert rc == 0, err
    text = out + err
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert not any(line.startswith("note: fake") for line in text.splitlines())
    assert "\\x1b]0;owned\\x07\\x1b[31mred" in out and "w\\nnote: fake" in out and "rtl\\u202eexe" in out
    rows, _ = run_json(capsys, "report", str(path), "--schemes", "fp8_row")
    assert sorted(r["tensor"] for r in rows) == sorted(NASTY)  # JSON keeps the names, escaped as JSON does


def test_tensor_names_in_errors_and_notes_are_escaped(capsys, tmp_path):
    path = tmp_path / "n.safetensors"
    write_safetensors(path, {"i\x1b[2Jx": ("I32", np.arange(4, dtype=np.int32))})
    rc, out, err = run(capsys, "report", str(path), "--tensor", "nope")
    assert rc == 2 and "\x1b" not in err and "i\\x1b[2Jx" in err
    rc, out, err = run(capsys, "report", str(path), "--schemes", "fp8_row")
    assert "\x1b" not in out + err and "note: i\\x1b[2Jx: skipped: integer tensor" in out
    rc, out, err = run(capsys, "report", str(path), "--schemes", "fp8_row", "--json")
    assert "\x1b" not in err and "note: i\\x1b[2Jx: skipped" in err
