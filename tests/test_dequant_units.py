"""The unit decode kernel (``dequant_kernels.make_dequant_units_kernel``: 16 bytes of codes a
thread, float32 or bfloat16 written directly) against the NumPy reference, bit for bit, on
every code value (random code bytes under each scheme's scales), and where it does not apply
(rows not of whole 16-byte units, scale groups not of whole 8-element chunks, 6-bit codes)
the element kernel's results, equally exact. CUDA simulator here; compiled with
NQDQ_TEST_GPU=1."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import nqdq
from nqdq.gpu.quantize import plan as kq
from nqdq.gpu.device.codec import decode_float_code, decode_small_float, f32_bits
from nqdq.gpu.runtime.backend import cuda
from nqdq.gpu.runtime.target import SIMULATOR
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
    ("int8", {"granularity": "group", "group_size": 24}, (2, 48)),  # groups of 3 chunks: the division
    ("fp8_row", {}, (1, 400)),  # one row of 25 units: segments of 9, 9 and 7 (the simulator counts one SM)
    ("mxfp4", {}, (1, 832)),  # 26 units of 32 codes: segments of 9, 9 and 8
]
ELEMENT_ONLY = [
    ("fp8_row", {}, (3, 40)),  # 40 codes: not whole 16-byte units
    ("mxfp6_e2m3", {}, (2, 64)),  # 6-bit codes
    ("int8", {"granularity": "group", "group_size": 12}, (2, 48)),  # a scale group splits a chunk
    ("int8_column", {}, (3, 32)),  # a scale a column
]


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
    np.testing.assert_array_equal(np.where(both_nan, 0, g), np.where(both_nan, 0, w))


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


@pytest.mark.parametrize("name, kw, shape", CASES + ELEMENT_ONLY, ids=lambda v: v if isinstance(v, str) else None)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_decode_matches_reference(name, kw, shape, dtype):
    q = _q(name, kw, shape, seed=len(name) * 7 + shape[-1])
    units = kq.dequant_units_launch(q.scheme, tuple(q.shape), kq.THREADS)
    assert (units is not None) == ((name, kw, shape) in CASES)
    want = nqdq.dequantize(q, dtype, device="cpu")
    got = nqdq.dequantize(q, dtype, device="cuda")
    _same(got, want)


@pytest.mark.parametrize("name, kw, shape", CASES, ids=lambda v: v if isinstance(v, str) else None)
@pytest.mark.parametrize("out", ["bfloat16", "float16"])
def test_16_bit_results_written_directly(name, kw, shape, out):
    # the kernel's own rounding to bfloat16 / float16 (the hot path's launch), poisoned output first
    q = _q(name, kw, shape, seed=shape[0] * 11 + shape[-1])
    k, grid, block, geometry, tpr_log2 = kq.dequant_units_launch(q.scheme, tuple(q.shape), kq.THREADS, out)
    n = int(np.prod(shape))
    res = np.full(n, 0xA5A5, np.uint16)
    one = np.zeros(1, np.float32)
    scales = np.ascontiguousarray(q.scales).reshape(-1)
    args = (np.ascontiguousarray(q.codes).reshape(-1), *geometry,
            scales if scales.dtype == np.uint8 else scales.view(np.float32),
            np.zeros(1, np.uint8) if q.zero_points is None else np.ascontiguousarray(q.zero_points).reshape(-1),
            one if q.means is None else np.ascontiguousarray(q.means, np.float32).reshape(-1),
            one if q.tensor_scale is None else np.ascontiguousarray(q.tensor_scale, np.float32).reshape(-1),
            res, tpr_log2)  # fmt: skip
    k[grid, block](*args)
    want = nqdq.dequantize(q, out, device="cpu")
    _same(res.reshape(shape).view(want.dtype), want)


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
