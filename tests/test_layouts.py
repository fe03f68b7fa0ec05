"""Scale layouts (nqdq.reference.layouts, nqdq.gpu.layouts) and their use through the API.

The expected side is written here independently of the reshapes under test: hand-worked
byte positions from the spec formulas, and a loop that places every scale with
``np.ravel_multi_index`` over Triton's / cuBLAS's named axes (what a view + permute means).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import nqdq
from nqdq.api import dequantize, quantize
from nqdq.gpu import layouts as kl
from nqdq.quantized import load
from nqdq.reference import layouts as reference_layouts

SWIZZLED = ("nv_128x4", "cdna4_16", "cdna4_32")
SHAPES = [(1, 1), (129, 5), (200, 3), (256, 8), (31, 9), (33, 17), (128, 4), (0, 3)]


def ceil_to(n, m):
    return -(-n // m) * m


def loop_swizzle(s, name):
    """Every scale placed one at a time, from the layouts' definitions (not the reshape code):

    nv_128x4 (cuBLAS "block scaling factors layout"): 128x4 tiles, row-block major; scale
        (r, c) of a tile at byte (r % 32) * 16 + (r // 32) * 4 + c of its 512;
    cdna4_32: view(R//32, 32, C//8, 4, 2).permute(0, 2, 4, 1, 3) (Triton shuffle_scales_cdna4);
    cdna4_16: view(R//32, 2, 16, C//8, 2, 4).permute(0, 3, 5, 2, 4, 1).
    """
    rows, cols = s.shape
    if name == "nv_128x4":
        R, C = ceil_to(rows, 128), ceil_to(cols, 4)
        out = np.zeros(R * C, s.dtype)
        for r in range(rows):
            for c in range(cols):
                tile = (r // 128) * (C // 4) + c // 4
                rr = r % 128
                out[tile * 512 + (rr % 32) * 16 + (rr // 32) * 4 + c % 4] = s[r, c]
        return out.reshape(R // 128, C // 4, 32, 4, 4)
    R, C = ceil_to(rows, 32), ceil_to(cols, 8)
    out = np.zeros(R * C, s.dtype)
    for r in range(rows):
        for c in range(cols):
            if name == "cdna4_32":
                view_idx = (r // 32, r % 32, c // 8, (c % 8) // 2, c % 2)
                view_dims = (R // 32, 32, C // 8, 4, 2)
                perm = (0, 2, 4, 1, 3)
            else:
                view_idx = (r // 32, (r % 32) // 16, r % 16, c // 8, (c % 8) // 4, c % 4)
                view_dims = (R // 32, 2, 16, C // 8, 2, 4)
                perm = (0, 3, 5, 2, 4, 1)
            flat = np.ravel_multi_index(tuple(view_idx[p] for p in perm), tuple(view_dims[p] for p in perm))
            out[flat] = s[r, c]
    return out.reshape(R // 32, C * 32)


def random_scales(shape, seed=0):
    # 1..255: never the zero pad byte, so misplaced padding shows
    return np.random.default_rng(seed).integers(1, 256, shape, dtype=np.uint8)


# ----------------------------------------------------------------------------- reference
@pytest.mark.parametrize(
    "name, rows, cols, r, c, offset",
    [
        # nv_128x4, one 128x4 tile: (r % 32) * 16 + (r // 32) * 4 + c
        ("nv_128x4", 128, 4, 0, 0, 0),
        ("nv_128x4", 128, 4, 1, 0, 16),
        ("nv_128x4", 128, 4, 32, 0, 4),
        ("nv_128x4", 128, 4, 5, 1, 81),  # 5*16 + 0 + 1
        ("nv_128x4", 128, 4, 33, 2, 22),  # 1*16 + 1*4 + 2
        ("nv_128x4", 128, 4, 127, 3, 511),  # 31*16 + 3*4 + 3
        # 2 x 2 tiles of 512: tile (r // 128, c // 4) starts at (2 * (r // 128) + c // 4) * 512
        ("nv_128x4", 256, 8, 0, 4, 512),
        ("nv_128x4", 256, 8, 128, 0, 1024),
        ("nv_128x4", 256, 8, 200, 6, 1674),  # tile 3; r%128 = 72 -> 8*16 + 2*4 + 2 = 138
        # cdna4_32, one [32, 8] block: ((c % 2) * 32 + r) * 4 + c // 2
        ("cdna4_32", 32, 8, 0, 1, 128),
        ("cdna4_32", 32, 8, 0, 2, 1),
        ("cdna4_32", 32, 8, 1, 0, 4),
        ("cdna4_32", 32, 8, 5, 3, 149),  # (32 + 5) * 4 + 1
        ("cdna4_32", 32, 8, 31, 7, 255),
        ("cdna4_32", 64, 16, 32, 8, 768),  # block (1, 1) of 2 x 2 blocks of 256
        # cdna4_16, one [32, 8] block: (((c % 4) * 16 + r % 16) * 2 + c // 4) * 2 + r // 16
        ("cdna4_16", 32, 8, 16, 0, 1),
        ("cdna4_16", 32, 8, 0, 4, 2),
        ("cdna4_16", 32, 8, 1, 0, 4),
        ("cdna4_16", 32, 8, 0, 1, 64),
        ("cdna4_16", 32, 8, 17, 5, 71),  # ((16 + 1) * 2 + 1) * 2 + 1
        ("cdna4_16", 32, 8, 31, 7, 255),
        ("cdna4_16", 40, 9, 33, 8, 3 * 256 + 4),  # padded to 64 x 16: block (1, 1) is 3rd; (r%32, c%8) = (1, 0) -> 4
    ],
)
def test_hand_worked_positions(name, rows, cols, r, c, offset):
    s = np.zeros((rows, cols), np.uint8)
    s[r, c] = 0xA5
    flat = reference_layouts.get_layout(name).swizzle(s).reshape(-1)
    assert flat[offset] == 0xA5 and np.count_nonzero(flat) == 1
    assert reference_layouts.get_layout(name).offset(r, c, rows, cols) == offset


@pytest.mark.parametrize("name", SWIZZLED)
@pytest.mark.parametrize("shape", SHAPES)
def test_reference_matches_loop_and_round_trips(name, shape):
    lay = reference_layouts.get_layout(name)
    s = random_scales(shape)
    sw = lay.swizzle(s)
    want = loop_swizzle(s, name)
    assert sw.shape == want.shape == lay.swizzled_shape(*shape)
    np.testing.assert_array_equal(sw, want)  # padding included: zero bytes
    back = lay.unswizzle(sw, *shape)
    assert back.dtype == s.dtype
    np.testing.assert_array_equal(back, s)


def test_function_spellings_and_padded_shapes():
    s = random_scales((129, 5))
    assert reference_layouts.swizzle_nv_128x4(s).shape == (2, 2, 32, 4, 4)
    assert (reference_layouts.swizzle_cdna4(s, 16).shape == (5, 8 * 32)
            == reference_layouts.swizzle_cdna4(s, mfma_dim=32).shape)
    np.testing.assert_array_equal(reference_layouts.unswizzle_nv_128x4(reference_layouts.swizzle_nv_128x4(s), 129, 5),
                                  s)
    for d in (16, 32):
        np.testing.assert_array_equal(reference_layouts.unswizzle_cdna4(reference_layouts.swizzle_cdna4(s, d), 129, 5,
                                                                        d), s)
    # float32 scales move as well (the maps never look at the values)
    f = np.random.default_rng(1).standard_normal((40, 9)).astype(np.float32)
    np.testing.assert_array_equal(reference_layouts.swizzle_cdna4(f, 16), loop_swizzle(f, "cdna4_16"))


def test_reference_errors():
    with pytest.raises(ValueError, match="scale_layout='nv'"):
        reference_layouts.get_layout("nv")
    with pytest.raises(ValueError, match="mfma_dim"):
        reference_layouts.swizzle_cdna4(random_scales((32, 8)), 64)
    with pytest.raises(ValueError, match="2-D"):
        reference_layouts.swizzle_nv_128x4(random_scales((2, 3, 4)))
    with pytest.raises(ValueError, match=r"\(2, 2, 32, 4, 4\)"):
        reference_layouts.unswizzle_nv_128x4(np.zeros((1, 2, 32, 4, 4), np.uint8), 129, 5)


# ----------------------------------------------------------------------------- kernels
@pytest.mark.parametrize("name", SWIZZLED)
@pytest.mark.parametrize(
    "shape, words",
    # words=True takes the 32-bit word kernels when cols % 4 == 0 ((40, 8), (33, 12): cdna4
    # pads half a block of columns, (70, 4): 58 pad rows), else one scale per thread
    [((1, 1), True), ((129, 5), True), ((40, 8), True), ((33, 12), True), ((70, 4), True), ((40, 8), False),
     ((40, 68), True)],  # 17 words a row: nv slabs of 8 words (the 3rd has one), cdna4 slabs of 16
)
def test_kernel_bit_exact(name, shape, words):
    s = random_scales(shape, seed=2)
    lay = reference_layouts.get_layout(name)
    got = kl.swizzle(s, name, words=words)
    want = lay.swizzle(s)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    # unswizzle: poison the padding so a read of it would show
    stored = want.copy().reshape(-1)
    pad = np.ones(stored.size, bool)
    pad[[lay.offset(r, c, *shape) for r in range(shape[0]) for c in range(shape[1])]] = False
    stored[pad] = 0xEE
    np.testing.assert_array_equal(kl.unswizzle(stored.reshape(want.shape), name, *shape, words=words), s)


def test_kernel_paths(monkeypatch):
    # uint8 with cols % 4 == 0 takes the tiled 32-bit word kernels, anything else one scale per thread
    ran = []
    real = kl.fast_kernel
    monkeypatch.setattr(kl, "fast_kernel", lambda k: (ran.append(k.py_func.__name__), real(k))[1])
    s8 = random_scales((40, 8))
    for name in SWIZZLED:
        kl.unswizzle(kl.swizzle(s8, name), name, 40, 8)
    assert ran == ["_swizzle_words_nv_128x4", "_unswizzle_words_nv_128x4"] + ["swizzle_words", "unswizzle_words"] * 2
    ran.clear()
    kl.swizzle(random_scales((40, 9)), "cdna4_16")
    kl.swizzle(s8, "cdna4_16", words=False)
    kl.swizzle(s8.astype(np.float32), "cdna4_16")
    assert ran == ["swizzle_kernel"] * 3


def test_kernel_float32_scales():
    # any dtype moves (byte-per-element kernels for itemsize > 1)
    f = np.random.default_rng(4).standard_normal((33, 8)).astype(np.float32)
    for name in SWIZZLED:
        got = kl.swizzle(f, name)
        np.testing.assert_array_equal(got, reference_layouts.get_layout(name).swizzle(f))
        np.testing.assert_array_equal(kl.unswizzle(got, name, 33, 8), f)


def test_kernel_errors():
    with pytest.raises(ValueError, match="2-D"):
        kl.swizzle(random_scales((4,)), "nv_128x4")
    with pytest.raises(ValueError, match="stored scales have shape"):
        kl.unswizzle(np.zeros((2, 256), np.uint8), "cdna4_32", 32, 8)
    with pytest.raises(ValueError, match="scale_layout='bad'"):
        kl.swizzle(random_scales((4, 4)), "bad")


# ----------------------------------------------------------------------------- API
def _x(shape, seed=3):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 4


CASES = [
    ("mxfp4", "nv_128x4", (3, 70, 96)),
    ("mxfp4", "cdna4_16", (3, 70, 96)),
    ("mxfp4", "cdna4_32", (130, 64)),
    ("mxfp8", "nv_128x4", (130, 64)),
    ("mxfp8", "cdna4_32", (96,)),  # 1-D: one row
    ("mxfp6_e2m3", "cdna4_16", (33, 96)),
    ("nvfp4", "nv_128x4", (3, 70, 96)),
    ("nvfp4", "nv_128x4", (200, 48)),
]


@pytest.mark.parametrize("scheme, layout, shape", CASES)
def test_quantize_with_layout_matches_linear(scheme, layout, shape):
    x = _x(shape)
    q = quantize(x, scheme, scale_layout=layout)
    q0 = quantize(x, scheme)
    assert q.scale_layout == layout and q0.scale_layout == "linear"
    rows = int(np.prod(shape[:-1]))
    cols = q0.scales.shape[-1]
    assert q.scales.shape == reference_layouts.get_layout(layout).swizzled_shape(rows, cols)
    np.testing.assert_array_equal(q.scales, reference_layouts.get_layout(layout).swizzle(q0.scales.reshape(rows, cols)))
    np.testing.assert_array_equal(q.codes, q0.codes)
    lin = q.with_layout("linear")
    assert lin.scale_layout == "linear" and lin.scales.shape == q0.scales.shape
    np.testing.assert_array_equal(lin.scales, q0.scales)
    np.testing.assert_array_equal(dequantize(q), dequantize(q0))
    # linear -> layout -> another layout directly
    np.testing.assert_array_equal(q0.with_layout(layout).scales, q.scales)
    if scheme != "nvfp4":
        other = "cdna4_16" if layout != "cdna4_16" else "nv_128x4"
        np.testing.assert_array_equal(q.with_layout(other).with_layout("linear").scales, q0.scales)


@pytest.mark.parametrize("layout", SWIZZLED)
@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_save_load_round_trip(tmp_path, layout, suffix):
    pytest.importorskip("safetensors") if suffix == ".safetensors" else None
    x = _x((70, 96))
    q = quantize(x, "mxfp4", scale_layout=layout)
    path = tmp_path / f"q{suffix}"
    q.save(path)
    r = load(path)
    assert r.scale_layout == layout
    np.testing.assert_array_equal(r.scales, q.scales)
    np.testing.assert_array_equal(r.codes, q.codes)
    np.testing.assert_array_equal(dequantize(r), dequantize(quantize(x, "mxfp4")))


def test_load_rejects_bad_layout_and_shape(tmp_path):
    q = quantize(_x((70, 96)), "mxfp4", scale_layout="nv_128x4")
    bad = q.with_layout("nv_128x4")
    bad.scales = q.scales.reshape(1, -1)  # right bytes, wrong (unpadded-looking) shape
    bad.save(tmp_path / "shape.npz")
    with pytest.raises(ValueError, match="scale_layout='nv_128x4'"):
        load(tmp_path / "shape.npz")
    cd = quantize(_x((70, 96)), "mxfp4", scale_layout="cdna4_32")
    cd.scale_layout = "nv_128x4"  # cdna4 bytes labelled nv: shapes differ, caught
    cd.save(tmp_path / "label.npz")
    with pytest.raises(ValueError, match=r"is \(1, 1, 32, 4, 4\)"):
        load(tmp_path / "label.npz")
    q.scale_layout = "nv_256x8"
    q.save(tmp_path / "name.npz")
    with pytest.raises(ValueError, match="scale_layout='nv_256x8' is not one of"):
        load(tmp_path / "name.npz")


@pytest.mark.parametrize("scheme", ["fp8_row", "fp8_tensor", "fp8_1x128", "fp8_128x128", "int8_column", "int8_asym", "int4_group", "int8_centred"])
def test_layout_errors_for_schemes_without_block_scales(scheme):
    x = _x((64, 256))
    with pytest.raises(ValueError, match=rf"scale_layout='nv_128x4'.*scheme='{scheme}'"):
        quantize(x, scheme, scale_layout="nv_128x4")
    with pytest.raises(ValueError, match="scale_layout='cdna4_16'"):
        quantize(x, scheme).with_layout("cdna4_16")


def test_layout_argument_errors():
    x = _x((64, 64))
    with pytest.raises(ValueError, match="scale_layout='nv' is not one of"):
        quantize(x, "mxfp4", scale_layout="nv")
    with pytest.raises(ValueError, match="scale_layout='cdna4_32' is for MX schemes.*scheme='nvfp4'"):
        quantize(x, "nvfp4", scale_layout="cdna4_32")
    with pytest.raises(ValueError, match="along the last axis.*axis=0"):
        quantize(x, "mxfp8", axis=0, scale_layout="nv_128x4")
    with pytest.raises(ValueError, match="scale_layout=3"):
        quantize(x, "mxfp4").with_layout(3)
    q = quantize(x, "mxfp4", scale_layout="nv_128x4")
    q.scale_layout = "nv_64x4"
    with pytest.raises(ValueError, match="q.scale_layout='nv_64x4'"):
        dequantize(q)


def test_layout_names_are_one_list():
    import nqdq.api as api

    assert api._LAYOUTS is reference_layouts.LAYOUTS == ("linear", "nv_128x4", "cdna4_16", "cdna4_32")
    assert nqdq.quantize is quantize


# ----------------------------------------------------------------------------- GPU (real size)
@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("NQDQ_TEST_GPU") != "1", reason="GPU tests need NQDQ_TEST_GPU=1")
def test_gpu_real_size_scales():
    """MXFP4 and NVFP4 scales of a bf16 [8192, 7168] activation, on the GPU (CuPy): the
    kernels vs the reference, both directions, and through nqdq.quantize / dequantize."""
    cp = pytest.importorskip("cupy")
    import ml_dtypes

    x = (np.random.default_rng(5).standard_normal((8192, 7168)) * 3).astype(ml_dtypes.bfloat16)
    xd = cp.asarray(x.view(np.uint16))
    timings = []
    for scheme, layouts in (("mxfp4", SWIZZLED), ("nvfp4", ("nv_128x4",))):
        q0 = quantize(xd, scheme, dtype="bfloat16")
        assert isinstance(q0.scales, cp.ndarray)
        s_host = q0.scales.get()
        deq0 = dequantize(q0).get()
        for name in layouts:
            lay = reference_layouts.get_layout(name)
            got = kl.swizzle(q0.scales, name)
            assert isinstance(got, cp.ndarray)
            np.testing.assert_array_equal(got.get(), lay.swizzle(s_host))
            back = kl.unswizzle(got, name, *s_host.shape)
            np.testing.assert_array_equal(back.get(), s_host)
            q = quantize(xd, scheme, dtype="bfloat16", scale_layout=name)
            assert isinstance(q.scales, cp.ndarray) and q.scale_layout == name
            np.testing.assert_array_equal(q.scales.get(), got.get())
            np.testing.assert_array_equal(dequantize(q).get(), deq0)
            # informational timing (CUDA events, median of 50 after 5 warm-ups; the
            # [8192, 224] scale array is 1.8 MB, L2-resident: not a bandwidth figure)
            for label, fn in (("swizzle", lambda: kl.swizzle(q0.scales, name)),
                              ("unswizzle", lambda: kl.unswizzle(got, name, *s_host.shape))):
                for _ in range(5):
                    fn()
                ts = []
                for _ in range(50):
                    a, b = cp.cuda.Event(), cp.cuda.Event()
                    a.record()
                    fn()
                    b.record()
                    b.synchronize()
                    ts.append(cp.cuda.get_elapsed_time(a, b) * 1e3)
                timings.append(f"{scheme} {s_host.shape} {name} {label}: {np.median(ts):.1f} us")
    print("\n" + "\n".join(timings))


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("NQDQ_TEST_GPU") != "1", reason="GPU tests need NQDQ_TEST_GPU=1")
def test_gpu_layout_bandwidth():
    """A 64 MiB uint8 scale array (> the H100's 50 MB L2): kernels bit-exact vs the reference,
    then timed beside a device-to-device copy of the same bytes (CUDA events around 20
    back-to-back calls, median of 7 repeats after a warm-up; bytes = read + written)."""
    cp = pytest.importorskip("cupy")
    rows, cols = 131072, 512
    s_host = random_scales((rows, cols), seed=6)
    s = cp.asarray(s_host)

    def timed(fn, reps=20):
        fn()
        out = []
        for _ in range(7):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            for _ in range(reps):
                fn()
            b.record()
            b.synchronize()
            out.append(cp.cuda.get_elapsed_time(a, b) / reps * 1e3)
        return float(np.median(out))

    nbytes = 2 * s.nbytes
    dst = cp.empty_like(s)
    t = timed(lambda: cp.copyto(dst, s))
    lines = [f"copy d2d {s.nbytes >> 20} MiB: {t:.1f} us, {nbytes / t / 1e3:.0f} GB/s"]
    for name in SWIZZLED:
        want = reference_layouts.get_layout(name).swizzle(s_host)
        for words in (True, False):
            got = kl.swizzle(s, name, words=words)
            np.testing.assert_array_equal(got.get(), want)
            back = kl.unswizzle(got, name, rows, cols, words=words)
            np.testing.assert_array_equal(back.get(), s_host)
            ts = timed(lambda: kl.swizzle(s, name, words=words))
            tu = timed(lambda: kl.unswizzle(got, name, rows, cols, words=words))
            kind = "32-bit words" if words else "one scale per thread"
            lines.append(
                f"{name} {kind}: swizzle {ts:.1f} us ({nbytes / ts / 1e3:.0f} GB/s), "
                f"unswizzle {tu:.1f} us ({nbytes / tu / 1e3:.0f} GB/s)"
            )
    print("\n" + "\n".join(lines))
