"""The MX fp6 pair encoders and NVFP4's two-launch plan, bit for bit with the reference.

* ``quantize.pair_encoders.fp6_unit_bf16`` / ``fp6_unit_f32`` (MXFP6 e2m3 / e3m2 of a finite
  group, two elements per bfloat16 instruction), through their twins: every finite bfloat16
  value, and float32 values around every code boundary, at 2^-k over the MX range, against
  the reference codec on x * 2^-k in float32;
* the group kernel with those encoders (bfloat16 / float16 / float32 input, the three MX
  scale roundings) and NVFP4 with S_enc computed in the group kernel (two launches), in the
  simulator, against the reference quantize.

The compiled encoders are checked on a GPU by tests/test_mx_encoders_gpu.py.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nqdq.gpu.quantize.plan as kq
from nqdq.gpu.quantize.choices import KernelChoices, PerTensor
from nqdq.formats import get_format
from nqdq.gpu.quantize import group_chunks, pair_encoders
from nqdq.reference import codec as rcodec
from nqdq.schemes import resolve_scheme
from nqdq.reference import quantize as ref
from nqdq.reference.packing import pack_codes

from helpers.data import edge_data
from helpers.encoders import FP6, FP6_KS, bf16_finite_units
from helpers.kernels import POISON, assert_same, check


def test_format_tuples_are_the_schemes():
    from nqdq.gpu.device.elements import format_tuple

    for name, fmt in FP6.items():
        assert format_tuple(resolve_scheme(f"mxfp6_{name}")) == fmt
    # the constants: shift 7 - M, 2^emin, vmax as bfloat16 pairs, exponent step (7 - M) << 7
    assert pair_encoders.fp6_pair_consts.py_func(FP6["e2m3"]) == (4, 0x3F803F80, 0x40F040F0, 0x02000200)  # 1.0, 7.5
    assert pair_encoders.fp6_pair_consts.py_func(FP6["e3m2"]) == (5, 0x3E803E80, 0x41E041E0, 0x02800280)  # 0.25, 28.0


def _unpack(lo, hi):
    """The 8 codes of each unit from fp6_unit_*'s (lo, hi) 24-bit halves."""
    cols = [(lo >> np.uint32(6 * j)) & np.uint32(63) for j in range(4)] + [(hi >> np.uint32(6 * j)) & np.uint32(63) for j in range(4)]
    return np.stack(cols, axis=1).reshape(-1)


def _first_bad(x, got, want, what):
    bad = got != want
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        pytest.fail(f"{what}: {int(bad.sum())} differ, first x={x[i]!r} (bits {x.view(np.uint32)[i]:#010x}) code {got[i]:#04x} != {want[i]:#04x}")


@pytest.mark.parametrize("name", ["e2m3", "e3m2"])
def test_fp6_pairs_every_bf16(name):
    """fp6_unit_bf16 (through its twins) for every finite bfloat16 x at each k: with the clamp
    ("floor", "even"), every value, products far beyond the format's range or below its
    smallest subnormal included; without it ("rceil"), every |x * 2^-k| <= vmax."""
    fmt, ref_fmt = FP6[name], get_format(name)
    f6 = pair_encoders.fp6_pair_consts.py_func(fmt)
    pats, words = bf16_finite_units()
    x = (pats << 16).view(np.float32)
    cols = [words[:, j] for j in range(4)]
    for k in FP6_KS:
        p = np.float32(2.0**-k)
        with np.errstate(over="ignore"):
            y = x * p  # what the reference encodes (exact but for float32 overflow / subnormals)
        want = rcodec.encode_float(y, ref_fmt).astype(np.uint32)
        hb = np.uint32(p.view(np.uint32) >> 16)
        for clamp in (True, False):
            lo, hi = pair_encoders.fp6_unit_bf16.py_func(cols, np.uint32(hb | (hb << 16)), f6, clamp)
            got = _unpack(lo, hi)
            if not clamp:  # "rceil" groups: |y| <= vmax
                ok = np.abs(y) <= ref_fmt.max_value
                assert ok.sum() > 500
                got, want_k, xk = got[ok], want[ok], x[ok]
            else:
                want_k, xk = want, x
            _first_bad(xk, got, want_k, f"{name} k={k} clamp={clamp}")


def _boundary_f32(name):
    """float32 values around every code boundary of the format (each grid value, each
    midpoint between neighbours, and 1-2 ulps either side of both), the top of the range,
    zeros, float32 subnormals, both signs."""
    table = np.abs(rcodec.float_code_table(get_format(name))[:32].astype(np.float64))
    grid = np.unique(np.concatenate([table, [2 * table.max()]]))  # beyond the max: saturation
    mids = (grid[:-1] + grid[1:]) / 2
    base = np.concatenate([grid, mids]).astype(np.float32)
    near = [base]
    for d in (1, 2):
        near += [np.nextafter(base, np.float32(np.inf)), np.nextafter(base, np.float32(0))]
        base = near[-2]
    v = np.concatenate(near + [np.float32([1e-45, 1e-40, 2.0**-126, 3.0e38, 3.4e38])])
    v = np.concatenate([v, -v])
    rng = np.random.default_rng(5)
    v = np.concatenate([v, (rng.standard_normal(4096) * 4).astype(np.float32)])
    return np.concatenate([v, np.zeros((-v.size) % 8, np.float32)])


@pytest.mark.parametrize("name", ["e2m3", "e3m2"])
def test_fp6_f32_pairs_boundaries(monkeypatch, name):
    """fp6_unit_f32 (through its twins; float32 products rounded to odd into bfloat16) at
    every code boundary, for units of 8 (float16 input) and 4 (float32) elements: the
    values are taken as y (k = 0) and as y * 2^k, so that x * 2^-k is the boundary value."""
    fmt, ref_fmt = FP6[name], get_format(name)
    f6 = pair_encoders.fp6_pair_consts.py_func(fmt)
    # the bit casts by NumPy views, so that the twins run on whole arrays at once
    monkeypatch.setattr(pair_encoders, "f32_bits", lambda f: np.asarray(f, np.float32).view(np.uint32))
    monkeypatch.setattr(pair_encoders, "bits_f32", lambda u: np.asarray(u, np.uint32).view(np.float32))
    y0 = _boundary_f32(name)
    for k in [0, 1, -3, 40, -40, 126, -127]:
        p = np.float32(2.0**-k)
        with np.errstate(over="ignore", under="ignore"):
            x = (y0.astype(np.float64) * 2.0**k).astype(np.float32)  # y0 * 2^k where float32 holds it
            x = np.where(np.isfinite(x), x, np.float32(0))  # a finite group's elements are finite
            y = x * p
        want = rcodec.encode_float(y, ref_fmt).astype(np.uint32)
        e = x.view(np.uint32).reshape(-1, 8)
        lo, hi = pair_encoders.fp6_unit_f32.py_func([e[:, j] for j in range(8)], p, f6, 8)
        _first_bad(x, _unpack(lo, hi), want, f"{name} vec=8 k={k}")
        e4 = x.view(np.uint32).reshape(-1, 4)
        lo4, _ = pair_encoders.fp6_unit_f32.py_func([e4[:, j] for j in range(4)], p, f6, 4)
        got4 = np.stack([(lo4 >> np.uint32(6 * j)) & np.uint32(63) for j in range(4)], axis=1).reshape(-1)
        _first_bad(x, got4, want, f"{name} vec=4 k={k}")


@pytest.mark.parametrize("rounding", ["floor", "rceil", "even"])
@pytest.mark.parametrize("name", ["mxfp6_e2m3", "mxfp6_e3m2"])
def test_mxfp6_group_kernel(monkeypatch, name, rounding):
    """The group kernel with the fp6 pair encoders, bit for bit with the reference: bfloat16
    (chunks of 4 units, one 24-byte store) on edge data, ties and groups at the ends of the
    MX range; float16 and float32 input (encode_store_unit's float32-pair branch)."""
    calls = []
    enc = pair_encoders.fp6_unit_bf16

    def spy(w, p2, f6, clamp):
        calls.append(clamp)
        return enc(w, p2, f6, clamp)

    monkeypatch.setattr(group_chunks, "fp6_unit_bf16", spy)
    sch = resolve_scheme(name, scale_rounding=rounding)
    x = edge_data((4, 256), seed=31)
    x[1, :32] = np.float32(2.0**-133) * np.arange(32)  # subnormal group: k clamped to -127
    x[1, 32:64] = np.float32(3.3e38) * np.linspace(-1, 1, 32, dtype=np.float32)  # k near the top
    x[2, :32] = np.float32(0.0625) * np.arange(-16, 16)  # grid values and ties
    x[2, 32:64] = np.float32(7.75) * np.linspace(-4, 4, 32, dtype=np.float32)
    kq._PLANS.clear()
    try:
        check(x.astype(ml_dtypes.bfloat16), sch, x_ref=x.astype(ml_dtypes.bfloat16))
        assert calls and set(calls) == {rounding != "rceil"}, "the bfloat16 group kernel did not take the fp6 pair encoder"
        check(x.astype(np.float16), sch, x_ref=x.astype(np.float16))
        check(x[:2], sch)
    finally:
        kq._PLANS.clear()


def _kernel_names(shape, kind, sch, **kw):
    return [k.py_func.__name__ for k, _, _, _ in kq.get_plan(shape, kind, sch, **kw).launches]


def _check_nvfp4(x, dt, sch, **kw):
    """Codes, block scales and tensor scale of one packed quantize against the reference."""
    xd = x.astype(dt)
    got = kq.quantize(xd, sch, out_fill=POISON, **kw)
    want = ref.quantize(xd.astype(np.float32), sch)
    assert_same(got.codes, pack_codes(want.codes, 4), "nvfp4 codes")
    assert_same(got.scales, want.scales, "nvfp4 block scales")
    assert_same(got.tensor_scale, want.tensor_scale, "nvfp4 tensor scale")


@pytest.mark.parametrize("kind", ["bfloat16", "float32"])
def test_nvfp4_two_launches(fresh_plans, kind):
    """NVFP4 with S_enc computed in the group kernel (PerTensor.AMAX_IN_GROUPS): two launches,
    and the reference's codes, block scales and tensor scale -- with more amax partials than
    threads (each thread reduces several: one unit per amax thread, 32 threads), an all-zero
    tensor (S_enc = 1) and non-finite values (left out of the tensor amax). Automatically
    below NVFP4_SENC_MAX_UNITS units only (measured slower above it: finalize between)."""
    fresh_plans.setattr(kq, "GROUP_UNITS", 1)
    sch = resolve_scheme("nvfp4")
    amax_in = KernelChoices(per_tensor=PerTensor.AMAX_IN_GROUPS)
    dt = ml_dtypes.bfloat16 if kind == "bfloat16" else np.float32
    code = 1 if kind == "bfloat16" else 0
    shape = (16, 1024) if kind == "bfloat16" else (2, 512)  # float32: the small cases only (simulator time)
    assert _kernel_names(shape, code, sch, threads=32, choices=amax_in) == ["tensor_amax", "lastaxis_groups"]
    nparts = kq.get_plan(shape, code, sch, threads=32, choices=amax_in).launches[1][3][5]
    assert nparts > 32 or kind == "float32", f"{nparts} partials: want more than the 32 threads of a block"
    x = edge_data(shape, seed=41, scale=20.0)
    x[1, 100] = np.float32(900.0)  # the tensor amax, in one partial only
    _check_nvfp4(x, dt, sch, threads=32, choices=amax_in)
    _check_nvfp4(np.zeros((2, 64), np.float32), dt, sch, choices=amax_in)
    y = edge_data((2, 64), seed=42)
    y[0, :3] = [np.inf, np.nan, -np.inf]
    _check_nvfp4(y, dt, sch, choices=amax_in)
    # automatically: inputs of NVFP4_SENC_MAX_UNITS (2^21) units and more keep finalize
    assert kq.NVFP4_SENC_MAX_UNITS == 1 << 21
    big = (kq.NVFP4_SENC_MAX_UNITS * (8 if kind == "bfloat16" else 4) // 1024, 1024)
    assert _kernel_names(big, code, sch) == ["tensor_amax", "finalize", "lastaxis_groups"]
    assert _kernel_names((big[0] - 1, 1024), code, sch) == ["tensor_amax", "lastaxis_groups"]
    two_pass = KernelChoices(per_tensor=PerTensor.TWO_PASS)
    assert _kernel_names((2, 64), code, sch, choices=two_pass) == ["tensor_amax", "finalize", "lastaxis_groups"]
