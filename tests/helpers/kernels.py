"""The quantize kernels against the NumPy reference, bit for bit (integer views: atol=0,
rtol=0), from outputs poisoned first; and the names of the kernels a plan launches."""

from __future__ import annotations

import ml_dtypes
import numpy as np

import nqdq.gpu.quantize.plan as kq
from nqdq.reference import quantize as ref
from nqdq.reference.packing import pack_codes

POISON = 0xA5  # every output byte before a kernel runs: an element a kernel forgets to write fails

# input dtype -> the kernels' input kind (nqdq.gpu.device.codec KIND_*)
KINDS = {np.float32: 0, ml_dtypes.bfloat16: 1, np.float16: 2}

# the 16-byte-unit kernels of nqdq/gpu/quantize/lastaxis.py and its static-scale kernel
UNIT_KERNELS = {"lastaxis_rows", "lastaxis_groups", "lastaxis_asym_rows", "lastaxis_stat_groups", "static_encode"}


def _bits(a):
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_same(got, want, what, *, nan_equal=False, x=None):
    """Bit-identical (integer views); with ``nan_equal`` any two NaNs match."""
    if want is None:
        assert got is None, f"{what}: kernel returned an array, reference None"
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != reference {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != reference {want.dtype}"
    gb, wb = _bits(got), _bits(want)
    bad = gb != wb
    if nan_equal and (got.dtype.kind == "f" or got.dtype == ml_dtypes.bfloat16):
        bad &= ~(np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32)))
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        extra = ""
        if x is not None and x.shape == got.shape:
            xv = np.asarray(x, np.float32)[i]
            extra = f", x={xv!r} (bits {np.float32(xv).view(np.uint32):#010x})"
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} differ; first at {i}: kernel {got[i]!r} "
            f"(bits {int(gb[i]):#x}) vs reference {want[i]!r} (bits {int(wb[i]):#x}){extra}"
        )


def check(x, sch, *, seed=None, scale=None, threads=None, x_ref=None, choices=None):
    """Quantize and dequantize ``x`` with the kernels (the designs of ``choices``, a
    ``KernelChoices``: default automatic) and the reference; compare everything."""
    xr = np.asarray(x if x_ref is None else x_ref, np.float32)
    got = kq.quantize(x, sch, seed=seed, scale=scale, threads=threads, out_fill=POISON, choices=choices)
    want = ref.quantize(xr, sch, seed=seed, scale=scale)
    wcodes = want.codes if sch.code_bits == 8 else pack_codes(want.codes, sch.code_bits)
    assert_same(got.codes, wcodes, f"{sch.name} codes", x=xr if sch.code_bits == 8 else None)
    assert_same(got.scales, want.scales, f"{sch.name} scales")
    assert_same(got.zero_points, want.zero_points, f"{sch.name} zero points")
    assert_same(got.tensor_scale, want.tensor_scale, f"{sch.name} tensor scale")
    assert_same(got.means, want.means, f"{sch.name} means", nan_equal=True)
    # unpacked codes too (the kernels can write one code per byte, as the reference does)
    if sch.code_bits < 8:
        un = kq.quantize(x, sch, seed=seed, scale=scale, threads=threads, packed=False, out_fill=POISON,
                         choices=choices)
        assert_same(un.codes, want.codes, f"{sch.name} unpacked codes", x=xr)
    deq = kq.dequantize(got, sch, xr.shape, threads=threads, out_fill=POISON)
    assert_same(deq, ref.dequantize(want, sch, xr.shape), f"{sch.name} dequantized", nan_equal=True)
    return got


def launched(shape, dtype, sch, **kw):
    """The names of the kernels the plan for (``shape``, ``dtype``, ``sch``) launches, in order."""
    plan = kq.get_plan(shape, KINDS[dtype], sch, **kw)
    return [k.py_func.__name__ if hasattr(k, "py_func") else k.__name__ for k, _, _, _ in plan.launches]
