"""The unit decode kernel (``dequant_kernels.make_dequant_units_kernel``: a chunk of 8
elements a thread a step, 4 for float32, consecutive lanes consecutive chunks; float32,
bfloat16 or float16 written directly) against the NumPy reference, bit for bit: on random
code bytes under each scheme's scales, on every code of each format under scales at the
edges of its three decodes (the fast one's folded factor 2^(127 - bias) * s exact or not,
NaN / inf codes, non-finite, zero, subnormal, smallest-normal and near-float32-max scales,
subnormal results), with rows split into segments and segments not a whole number of warp
steps; and where it does not apply (rows not of whole 16-byte units, scale groups not of
whole 8-element chunks, 6-bit codes) the element kernel's results, equally exact. CUDA
simulator here (it counts one SM: rows split where fewer than 8); compiled with
NQDQ_TEST_GPU=1; the PTX for sm_90 (loads, stores, registers) in a subprocess."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import nqdq
from nqdq.gpu.quantize import dequant_kernels
from nqdq.gpu.quantize import plan as kq
from nqdq.gpu.device.codec import decode_float_code, decode_small_float, f32_bits
from nqdq.gpu.device.elements import format_tuple
from nqdq.gpu.quantize.params import kernel_mode
from nqdq.gpu.runtime.backend import cuda
from nqdq.gpu.runtime.target import SIMULATOR
from nqdq.reference.packing import pack_codes
from nqdq.schemes import resolve_scheme

CASES = [
    ("fp8_row", {}, (5, 64)),
    ("fp8_1x128", {}, (3, 256)),
    ("fp8_128x128", {}, (3, 256)),
    ("fp8_tensor", {}, (2, 48)),
    ("mxfp8_e5m2", {}, (3, 64)),
    ("mxfp4", {}, (4, 64)),
    ("nvfp4", {}, (3, 96)),
    ("int8_row", {}, (3, 32)),
    ("int8_asym", {}, (3, 64)),
    ("int8_centred", {}, (2, 64)),
    ("int4_group", {"group_size": 32}, (3, 64)),
    ("int4_asym", {}, (2, 64)),
    ("int8", {"granularity": "group", "group_size": 24}, (2, 48)),  # groups of 3 chunks: no step of whole groups
    # rows split (the simulator counts one SM: fewer than 8 rows of 128 chunks or more): 1040 codes are
    # 130 chunks (65 16-byte units) to 16-bit results, segments of 96 and 34; 260 to float32: 96, 96, 68
    ("fp8_row", {}, (3, 1040)),
    ("mxfp4", {}, (2, 1056)),  # 132 chunks: 96 + 36, each step of a lane 8 groups on
    ("nvfp4", {}, (1, 2080)),  # 260 chunks: 96, 96, 68 (float32, 520: 96 x 5, 40)
]
ELEMENT_ONLY = [
    ("fp8_row", {}, (3, 40)),  # 40 codes: not whole 16-byte units
    ("mxfp6_e2m3", {}, (2, 64)),  # 6-bit codes
    ("int8", {"granularity": "group", "group_size": 12}, (2, 48)),  # a scale group splits a chunk
    ("int8_column", {}, (3, 32)),  # a scale a column
]
OUTS = ["float32", "bfloat16", "float16"]
F32_MAX = float(np.finfo(np.float32).max)
# (the simulator's NumPy scalars, and the reference's casts, warn of the overflows and NaNs that edge scales make)
_QUIET = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _ids(v):
    return v if isinstance(v, str) else None


def _q(name, kw, shape, seed):
    """A QuantizedTensor of ``shape`` whose codes are random bytes (every code value, NaN and
    infinity codes among them) under the scales quantize gave random data."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    q = nqdq.quantize(x, resolve_scheme(name, **kw))
    codes = rng.integers(0, 256, q.codes.shape, dtype=np.uint8).view(q.codes.dtype)  # (int8 for signed codes)
    return dataclasses.replace(q, codes=codes)


def _bits(a):
    a = np.asarray(a)
    return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)


def _same(got, want):
    """Bit for bit, except NaN payloads, which are computed (code x scale), not chosen: the
    reference's follow the host FPU (x86 keeps the first NaN operand), the GPU returns its
    canonical NaN (tests/test_kernels.py, the documented exception); both NaN there."""
    got, want = np.asarray(got), np.asarray(want)
    g, w = _bits(got).reshape(want.shape), _bits(want)
    if want.dtype == np.float16:
        value = lambda b: b.view(np.float16)  # noqa: E731
    elif want.dtype.itemsize == 2:  # bfloat16: the top half of a float32
        value = lambda b: (b.astype(np.uint32) << 16).view(np.float32)  # noqa: E731
    else:
        value = lambda b: b.view(np.float32)  # noqa: E731
    both_nan = np.isnan(value(g)) & np.isnan(value(w))
    bad = np.flatnonzero((np.where(both_nan, 0, g) != np.where(both_nan, 0, w)).reshape(-1))
    assert bad.size == 0, f"{bad.size} of {g.size} differ, first at {bad[0]}: got {g.reshape(-1)[bad[0]]:#x}, " \
                          f"want {w.reshape(-1)[bad[0]]:#x}"  # fmt: skip


def _units(q, out, wide=None, step_scales=None):
    """The unit kernel's ``out`` results for ``q`` (output poisoned first), launched as the
    plan launches it; ``wide`` / ``step_scales``: that variant of the planned kernel."""
    launch = kq.dequant_units_launch(q.scheme, tuple(q.shape), kq.THREADS, out)
    assert launch is not None
    k, grid, block, geometry, tpr_log2 = launch
    if wide is not None or step_scales is not None:
        if step_scales is None:  # the plan's: groups that divide the team
            step_scales = (1 << tpr_log2) % geometry[12] == 0
        out_kind = {"float32": dequant_kernels.DEQ_F32, "bfloat16": dequant_kernels.DEQ_BF16,
                    "float16": dequant_kernels.DEQ_F16}[out]  # fmt: skip
        k = dequant_kernels.make_dequant_units_kernel(kernel_mode(q.scheme), format_tuple(q.scheme),
                                                      q.scheme.symmetric, out_kind, bool(wide),
                                                      bool(step_scales))  # fmt: skip
    n = int(np.prod(q.shape))
    res = np.full(n, 0xA5A5A5A5, np.uint32).view(np.float32) if out == "float32" else np.full(n, 0xA5A5, np.uint16)
    one = np.zeros(1, np.float32)
    scales = np.ascontiguousarray(q.scales).reshape(-1)
    args = (np.ascontiguousarray(q.codes).reshape(-1).view(np.uint8), *geometry,
            scales if scales.dtype == np.uint8 else scales.view(np.float32),
            np.zeros(1, np.uint8) if q.zero_points is None else np.ascontiguousarray(q.zero_points).reshape(-1),
            one if q.means is None else np.ascontiguousarray(q.means, np.float32).reshape(-1),
            one if q.tensor_scale is None else np.ascontiguousarray(q.tensor_scale, np.float32).reshape(-1),
            res, tpr_log2)  # fmt: skip
    k[grid, block](*args)
    return res.reshape(q.shape).view({"float32": np.float32, "bfloat16": ml_dtypes.bfloat16,
                                      "float16": np.float16}[out])  # fmt: skip


@pytest.mark.parametrize("ebits, mbits, nan_style, top, top_value, tiny",
                         [(4, 3, 1, 0x7E, 448.0, 2.0**-9), (5, 2, 2, 0x7B, 57344.0, 2.0**-16),
                          (3, 2, 0, 0x1F, 28.0, 2.0**-4), (2, 3, 0, 0x1F, 7.5, 2.0**-3), (2, 1, 0, 0x7, 6.0, 0.5)],
                         ids=["e4m3", "e5m2", "e3m2", "e2m3", "e2m1"])  # fmt: skip
def test_small_float_decode_equals_the_general_decode(ebits, mbits, nan_style, top, top_value, tiny):
    # every code of each narrow format, both decodes in one kernel, compared as bits (NaN too:
    # both are the same constant, negated by the same operation)
    @cuda.jit
    def both(out):
        c = cuda.grid(1)
        if c < out.shape[1]:
            out[0, c] = f32_bits(decode_small_float(np.int64(c), ebits, mbits, nan_style))
            out[1, c] = f32_bits(decode_float_code(np.int64(c), ebits, mbits, nan_style))

    n = 1 << (1 + ebits + mbits)
    out = np.zeros((2, n), np.int64)
    both[1, 256](out)
    np.testing.assert_array_equal(out[0], out[1])
    bits = out[0].astype(np.uint32).view(np.float32)
    assert bits[top] == top_value and bits[1] == tiny and bits[n // 2 + 1] == -tiny  # the largest, a subnormal


@_QUIET
@pytest.mark.parametrize("name, kw, shape", CASES + ELEMENT_ONLY, ids=_ids)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_decode_matches_reference(name, kw, shape, dtype):
    # the general path (nqdq.dequantize on the device: the unit kernel's float32, or the element kernel's)
    q = _q(name, kw, shape, seed=len(name) * 7 + shape[-1])
    units = kq.dequant_units_launch(q.scheme, tuple(q.shape), kq.THREADS)
    assert (units is not None) == ((name, kw, shape) in CASES)
    want = nqdq.dequantize(q, dtype, device="cpu")
    got = nqdq.dequantize(q, dtype, device="cuda")
    _same(got, want)


@_QUIET
@pytest.mark.parametrize("name, kw, shape", CASES, ids=_ids)
@pytest.mark.parametrize("out", OUTS)
def test_results_written_directly(name, kw, shape, out):
    # the kernel's own float32 / bfloat16 / float16 results (the hot path's launch), poisoned output first
    q = _q(name, kw, shape, seed=shape[0] * 11 + shape[-1] + OUTS.index(out))
    _same(_units(q, out), nqdq.dequantize(q, out, device="cpu"))


# ----------------------------------------------------------------------------- every code, edge scales
def _pow2(e):
    return float(np.ldexp(np.float32(1), e))


def _below(v):
    return float(np.nextafter(np.float32(v), np.float32(0)))


# float32 scales at the decodes' edges: the fold's bound 2^(bias + 1) (e4m3 256, e5m2 65536, e2m1 4)
# and just below it, near float32's max (the product overflows), the smallest normal and subnormals
# (subnormal results), zero, infinities and NaN (the general decode), a negative scale
EDGE_SCALES = [1.0, 0.75, -2.5, 256.0, _below(256.0), 65536.0, _below(65536.0), 4.0, _below(4.0), F32_MAX,
               _below(F32_MAX), F32_MAX / 3, _pow2(-126), 1.5 * _pow2(-126), _pow2(-127), _pow2(-149), 0.0, -0.0,
               np.inf, -np.inf, np.nan, 1e-30, 1e30, _pow2(100)]  # fmt: skip
# e8m0 codes: 0 (2^-127), the last folded and first not folded for e2m1 (128, 129), e4m3 (134,
# 135) and e5m2 (142, 143), 254 (2^127) and 255 (NaN)
MX_CODES = [0, 1, 2, 100, 126, 127, 128, 129, 130, 134, 135, 136, 142, 143, 144, 200, 253, 254, 255]


def _edge_q(name, kw, codes, scales, seed, **arrays):
    """A QuantizedTensor of ``codes`` (one per element, unpacked) and ``scales`` (and the
    ``zero_points`` / ``means`` / ``tensor_scale`` given), in the arrays' layouts of
    quantize's (a scale group of random data quantized first, for the structure)."""
    sch = resolve_scheme(name, **kw)
    x = np.random.default_rng(seed).standard_normal(codes.shape).astype(np.float32)
    q = nqdq.quantize(x, sch)
    packed = pack_codes(codes.astype(np.uint8), sch.code_bits).view(q.codes.dtype)
    fields = dict(codes=packed.reshape(q.codes.shape), scales=np.asarray(scales).astype(q.scales.dtype).reshape(
        q.scales.shape))  # fmt: skip
    for f, a in arrays.items():
        ref = getattr(q, f)
        fields[f] = np.asarray(a).astype(ref.dtype).reshape(ref.shape)
    return dataclasses.replace(q, **fields)


def _every_code(rows, C, bits, shift=1):
    """(rows, C) codes, each row every ``bits``-wide code (C a multiple of 2^bits), rolled on by row."""
    base = np.arange(C) % (1 << bits)
    return np.stack([np.roll(base, shift * r) for r in range(rows)]).astype(np.uint8)


@_QUIET
@pytest.mark.parametrize("name", ["fp8_row", "e5m2", "int8_row", "int8_asym", "int8_centred"])
@pytest.mark.parametrize("out", OUTS)
def test_every_8_bit_code_under_edge_row_scales(name, out):
    # a row a scale of EDGE_SCALES, each row all 256 codes (NaN and infinity codes among them)
    rows = len(EDGE_SCALES)
    codes = _every_code(rows, 256, 8, shift=37)
    rng = np.random.default_rng(101 + OUTS.index(out))
    extra = {}
    if name == "int8_asym":
        extra["zero_points"] = rng.permutation(np.r_[0, 255, 128, rng.integers(0, 256, rows - 3)])
    if name == "int8_centred":  # groups of 128: a mean a group, the edge values among them
        extra["means"] = rng.permutation(np.r_[np.float32(EDGE_SCALES), rng.standard_normal(rows).astype(np.float32)])
        scales = np.repeat(np.float32(EDGE_SCALES), 2)
    else:
        scales = np.float32(EDGE_SCALES)
    q = _edge_q(name, {}, codes, scales, seed=3, **extra)
    _same(_units(q, out), nqdq.dequantize(q, out, device="cpu"))


@_QUIET
@pytest.mark.parametrize("name", ["fp8_1x128", "int4_group", "int4_asym"])
@pytest.mark.parametrize("out", OUTS)
def test_every_code_under_edge_group_scales(name, out):
    # groups of 128, a row's two a scale of EDGE_SCALES: every code under each (4-bit: in each group),
    # zero points at random
    sch = resolve_scheme(name)
    rows = len(EDGE_SCALES)
    codes = _every_code(rows, 256, sch.code_bits, shift=5)
    rng = np.random.default_rng(202 + OUTS.index(out))
    scales = np.repeat(np.float32(EDGE_SCALES), 2)
    extra = {}
    if not sch.symmetric:
        extra["zero_points"] = rng.integers(0, 1 << sch.code_bits, 2 * rows)
    q = _edge_q(name, {}, codes, scales, seed=4, **extra)
    _same(_units(q, out), nqdq.dequantize(q, out, device="cpu"))


@_QUIET
@pytest.mark.parametrize("name", ["mxfp8", "mxfp8_e5m2", "mxfp4"])
@pytest.mark.parametrize("out", OUTS)
def test_every_code_under_edge_mx_scales(name, out):
    # a row an e8m0 code of MX_CODES for its 8 groups of 32, the row every code (8-bit: 256, 4-bit: 16 a group)
    sch = resolve_scheme(name)
    rows = len(MX_CODES)
    codes = _every_code(rows, 256, sch.code_bits, shift=11)
    q = _edge_q(name, {}, codes, np.repeat(np.uint8(MX_CODES), 8), seed=5)
    _same(_units(q, out), nqdq.dequantize(q, out, device="cpu"))


@_QUIET
@pytest.mark.parametrize("tensor_scale", [1.0, 2.0**-140, 2.0**100, F32_MAX / 4, F32_MAX, 0.5],
                         ids=["1", "subnormal", "2^100", "max/4", "max", "0.5"])  # fmt: skip
@pytest.mark.parametrize("out", OUTS)
def test_every_nvfp4_code_under_every_block_scale(tensor_scale, out):
    # every ue4m3 block scale byte (NaN 0x7F / 0xFF, subnormals, the sign bit set) times a tensor
    # scale (finite and positive, as check_arrays requires): the multiplier on both sides of the
    # fold's bound 4, subnormal, overflowing to inf; each group of 16 every e2m1 code
    codes = _every_code(16, 256, 4, shift=3)
    rng = np.random.default_rng(303 + OUTS.index(out))
    q = _edge_q("nvfp4", {}, codes, rng.permutation(256), seed=6, tensor_scale=np.float32(tensor_scale))
    _same(_units(q, out), nqdq.dequantize(q, out, device="cpu"))


@_QUIET
@pytest.mark.parametrize("name, shape", [("fp8_row", (3, 1040)), ("mxfp8_e5m2", (2, 1024)), ("mxfp4", (2, 1056)),
                                         ("nvfp4", (1, 2080)), ("int8_asym", (2, 768)), ("int4_group", (3, 512)),
                                         ("int8_centred", (2, 640))], ids=_ids)  # fmt: skip
@pytest.mark.parametrize("wide, step_scales", [(True, None), (False, False)], ids=["wide", "group-runs"])
@pytest.mark.parametrize("out", OUTS)
def test_kernel_variants_agree(name, shape, wide, step_scales, out):
    # the 64-bit index variant (planned from 2^32 chunks on) and the group-run loop where the plan
    # takes per-step scales (groups that divide the team), on split rows: the reference's bits
    q = _q(name, {}, shape, seed=shape[-1] + 13 * OUTS.index(out) + (wide is True))
    _same(_units(q, out, wide=wide, step_scales=step_scales), nqdq.dequantize(q, out, device="cpu"))


# ----------------------------------------------------------------------------- the plan
@pytest.mark.skipif(not SIMULATOR, reason="the simulator's one SM (a GPU splits rows by its own count)")
@pytest.mark.parametrize("name, shape, out, nseg, spc", [("fp8_row", (3, 1040), "bfloat16", 2, 96),
                                                         ("fp8_row", (3, 1040), "float32", 3, 96),
                                                         ("mxfp4", (2, 1056), "float16", 2, 96),
                                                         ("nvfp4", (1, 2080), "bfloat16", 3, 96),
                                                         ("nvfp4", (1, 2080), "float32", 6, 96),
                                                         ("fp8_row", (5, 64), "bfloat16", 1, 8)])  # fmt: skip
def test_rows_split_in_the_simulator(name, shape, out, nseg, spc):
    # the split CASES' comments describe (one SM: segments where rows are fewer than 8)
    geometry = kq.dequant_units_launch(resolve_scheme(name), shape, kq.THREADS, out)[3]
    assert geometry[2:4] == (nseg, spc)


@pytest.mark.parametrize("d", [8, 16, 24, 32, 40, 96, 128, 136, 256, 1000, 4096, 7168, 8192, 14336, 65536, 1 << 20])
def test_column_divisor(d):
    # floor(n / d) by a 32x32 -> 64-bit multiply and shifts for every column below the row's end: all n
    # to 2^18, then the n around every multiple of d and the largest row lengths
    m, sh = dequant_kernels.column_divisor(d, (1 << 30) - 1)
    k = np.arange(0, (1 << 30) // d + 1, max(1, (1 << 30) // d // (1 << 16)), dtype=np.int64) * d
    n = np.concatenate([np.arange(1 << 18), k - 1, k, k + 1, [(1 << 30) - 1]])
    n = n[(n >= 0) & (n < 1 << 30)].astype(np.uint64)
    np.testing.assert_array_equal(((n * np.uint64(m)) >> np.uint64(32)) >> np.uint64(sh), n // np.uint64(d))


@pytest.mark.parametrize("shape, out, nseg, spc, team, step_scales",
                         [((64, 7168), "bfloat16", 14, 64, 32, False),  # 896 chunks, 8 warps an SM aimed at
                          ((8192, 8192), "bfloat16", 1, 1024, 32, False),  # a warp a row
                          ((8192, 8192), "float32", 1, 2048, 32, False),
                          ((2, 4096), "bfloat16", 8, 64, 32, False),  # down to two steps a lane
                          ((8192, 64), "bfloat16", 1, 8, 8, True)],  # short rows: a team of 8 lanes a row
                         ids=["64x7168", "8192x8192", "8192x8192-f32", "2x4096", "8192x64"])  # fmt: skip
def test_segments_on_132_sms(monkeypatch, shape, out, nseg, spc, team, step_scales):
    monkeypatch.setattr(kq, "_sm_count", lambda: 132)
    k, grid, block, geometry, tpr_log2 = kq.dequant_units_launch(resolve_scheme("fp8_row"), shape, 256, out)
    rows, cpr, nseg_, spc_ = geometry[:4]
    assert (rows, nseg_, spc_, 1 << tpr_log2) == (shape[0], nseg, spc, team)
    assert grid == -(-rows * nseg // (256 >> tpr_log2))
    assert k is dequant_kernels.make_dequant_units_kernel(0, format_tuple(resolve_scheme("fp8_row")), True,
                                                          {"float32": 0, "bfloat16": 1}[out], False, step_scales)
    q = kq.dequant_units_launch(resolve_scheme("mxfp4"), shape, 256, out)  # groups of 32: each step new groups
    assert q[3][:4] == geometry[:4] and q[0] is not k


@pytest.mark.skipif(SIMULATOR, reason="device addresses: a GPU (the simulator's twins need no alignment)")
def test_unaligned_codes_take_the_element_kernel():
    # CuPy codes one byte into a buffer: the general path and the hot path (third call) decode
    # them by the element kernel, not by 16-byte loads from an unaligned address
    cp = pytest.importorskip("cupy")
    q = _q("fp8_row", {}, (3, 64), seed=5)
    buf = cp.zeros(q.codes.size + 1, cp.uint8)
    buf[1:] = cp.asarray(q.codes.reshape(-1))
    shifted = dataclasses.replace(q, codes=buf[1:].reshape(q.codes.shape), scales=cp.asarray(q.scales))
    assert shifted.codes.data.ptr % 16 == 1
    want = nqdq.dequantize(q, "bfloat16")
    for _ in range(3):
        _same(nqdq.dequantize(shifted, "bfloat16").get(), want)


@pytest.mark.parametrize("name, shape, units", [("fp8_row", (4, 64), True), ("int4_group", (2, 128), True),
                                                ("mxfp6_e2m3", (2, 64), False), ("fp8_row", (3, 40), False)])  # fmt: skip
def test_hot_path_plan(name, shape, units):
    # the hot path's launch sequence (kernels.dequant_plan, built on a GPU only): the unit kernel
    # writing each result itself, or the element kernel's float32, rounded to bfloat16 by a
    # second launch and to float16 by the caller's library; every launch given its kernel's
    # parameters
    import inspect

    from nqdq.gpu.quantize.dequant_plan import DequantPlan

    for out in ("float32", "bfloat16", "float16"):
        plan = DequantPlan(resolve_scheme(name), shape, out, kq.THREADS)
        names = [k.py_func.__name__ for k, *_ in plan.launches]
        assert plan.units == units
        if units:
            assert names == ["dequant_units"] and plan.out == out
        else:
            assert names == (["dequant", "f32_to_bf16_kernel"] if out == "bfloat16" else ["dequant"])
            assert plan.out == ("bfloat16" if out == "bfloat16" else "float32")
        for k, _grid, _block, args in plan.launches:
            assert len(args) == len(inspect.signature(k.py_func).parameters)


# ----------------------------------------------------------------------------- PTX for sm_90
_PTX_SCRIPT = r"""
import json, re
import numpy as np
from numba import typeof
from nqdq.gpu.quantize import plan as kq
from nqdq.gpu.runtime.backend import cuda
from nqdq.schemes import resolve_scheme
from nqdq.tools.ptx_audit import _audit_ptx, _no_gpu_compile

kq.SIMULATOR = True  # plan as the dry run does (one SM), compile for real
rows = []
for name, out in [("fp8_row", "bfloat16"), ("fp8_row", "float32"), ("mxfp4", "bfloat16"), ("mxfp4", "float32"),
                  ("int8_asym", "float16"), ("nvfp4", "bfloat16")]:
    sch = resolve_scheme(name)
    k, grid, block, geometry, tpr_log2 = kq.dequant_units_launch(sch, (8192, 8192), 256, out)
    sc = np.zeros(4, np.uint8 if sch.scale_format != "f32" else np.float32)
    res = np.zeros(4, np.float32 if out == "float32" else np.uint16)
    args = (np.zeros(16, np.uint8), *geometry, sc, np.zeros(4, np.uint8), np.zeros(4, np.float32),
            np.zeros(1, np.float32), res, tpr_log2)
    with _no_gpu_compile():
        ptx, _ = cuda.compile_ptx(k.py_func, tuple(typeof(a) for a in args), cc=(9, 0))
    body = ptx[ptx.find(".entry"):]
    r = _audit_ptx(name, k.py_func.__name__, ptx, (9, 0), True)
    r.update(case=[name, out], loads=sorted(set(re.findall(r"\bld\.global(?:\.nc)?\.(u64|u32|u16)\b", body))),
             stores=re.findall(r"\bst\.global\.[a-z0-9.]+", body), div64=len(re.findall(r"\b(?:div|rem)\.[su]64", body)),
             cvt_bf16=body.count("cvt.rn.bf16x2.f32"))
    rows.append(r)
print(json.dumps(rows))
"""


def test_unit_kernel_ptx_for_sm90():
    """At 8192x8192 each kernel stores one 16-byte vector a step (the only global store), loads
    a chunk's codes by one load of 8 bytes (8-bit codes, 16-bit results), 4 (4-bit codes, or
    8-bit to float32) or 2 (4-bit to float32), has no 64-bit division, no float64, no fma, no
    flush to zero (the PTX audit's rules), no spill, and few registers (about 30 with
    nvJitLink 13; 64 for the kernel before, whose warps stored 16 of every 32 bytes a time)."""
    from helpers.ptx import compile_rows

    want_load = {("fp8_row", "bfloat16"): "u64", ("fp8_row", "float32"): "u32", ("mxfp4", "bfloat16"): "u32",
                 ("mxfp4", "float32"): "u16", ("int8_asym", "float16"): "u64", ("nvfp4", "bfloat16"): "u32"}
    for r in compile_rows(_PTX_SCRIPT):
        case = tuple(r["case"])
        assert r["problems"] == [] and r["div64"] == 0, r
        assert r["stores"] == ["st.global.v4.u32"], r
        assert want_load[case] in r["loads"] and not set(r["loads"]) - {want_load[case], "u32"}, r
        assert r.get("spill_st", 0) == 0 and r.get("regs", 0) <= 40, r
        assert r["cvt_bf16"] == (8 if case[1] == "bfloat16" else 0), r
