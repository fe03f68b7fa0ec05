"""The single-chunk per-channel kernel (``columns.column_onepass``, ``PerChannel.SINGLE_CHUNK``:
one block holds every row of its stripe) in the simulator, selected by ``choices=``: bit for
bit against the NumPy reference, several stripe widths, stripes and rows that do not fill a
block, NaN / inf / all-zero / subnormal channels, 8-, 4- and 8-bit-float codes. The geometry
rules are checked by hand against shapes of the issue."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nqdq.gpu.quantize.columns as column_kernels
import nqdq.gpu.quantize.plan as kq
from nqdq.gpu.quantize.choices import KernelChoices, PerChannel
from nqdq.gpu.quantize.params import max_elem
from nqdq.schemes import resolve_scheme

from helpers.data import column_data
from helpers.kernels import KINDS, check, launched


# ----------------------------------------------------------------------------- geometry
SINGLE = KernelChoices(per_channel=PerChannel.SINGLE_CHUNK)
TWO_PASS = ["column_amax", "finalize", "column_encode"]


@pytest.mark.parametrize(
    "rows, upr, want",
    [
        # decode 64 x 7168 (896 bf16 units a row): the narrowest stripes (64 rows per pass, U = 1)
        (64, 896, (256, 4, 1, 224)),
        # 300 rows fit one chunk at W = 4 with U = ceil(300 / 64) = 5 -> 8 (a power of two)
        (300, 896, (256, 4, 8, 224)),
        (1024, 896, (256, 4, 16, 224)),  # 16 units a thread: the most a block holds
        (1025, 896, None),  # more rows than a block holds: the two passes
        # narrow rows: no stripe wider than 2 * upr but the narrowest (3 units: W = 4)
        (100, 3, (256, 4, 2, 1)),
    ],
)
def test_single_chunk_geometry(rows, upr, want):
    assert column_kernels.single_chunk_geometry(rows, upr, vec=8, nt=256) == want


def test_single_chunk_geometry_channels_per_block():
    """A stripe's W * VEC channels are at most NT (one thread each for the scales): with 64
    threads, bf16 stripes are at most 8 units wide, f32 ones 16; the narrowest that holds
    the rows is taken."""
    assert column_kernels.stripe_widths(64, 64, 8) == [8, 4]
    assert column_kernels.stripe_widths(64, 64, 4) == [16, 8, 4]
    assert column_kernels.single_chunk_geometry(8, 64, vec=8, nt=64) == (64, 4, 1, 16)
    assert column_kernels.single_chunk_geometry(200, 64, vec=4, nt=64) == (64, 4, 16, 16)  # 16 rows a pass


# ----------------------------------------------------------------------------- bit for bit
_EXACT_CASES = [
    ("int8_column", {}, (37, 96)),  # rows not a multiple of a pass; several stripes
    ("e4m3", {"granularity": "column"}, (2, 9, 40)),  # N-D: every leading index is a row
    ("int4", {"granularity": "column"}, (11, 48)),  # 4-bit codes, two per byte
    ("e2m1", {"granularity": "column"}, (5, 16)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("name, kw, shape", _EXACT_CASES)
def test_single_chunk_exact(name, kw, shape, dtype):
    """One launch, no workspace (its ``ws`` argument a dummy)."""
    sch = resolve_scheme(name, **kw)
    x = column_data(shape, seed=len(name) + shape[-1]).astype(dtype)
    assert launched(x.shape, dtype, sch, choices=SINGLE) == ["column_onepass"]
    roles = [s.role for s in kq.get_plan(x.shape, KINDS[dtype], sch, choices=SINGLE).slots]
    assert "zero" not in roles and "reset" not in roles
    check(x, sch, x_ref=x.astype(np.float32), choices=SINGLE)


@pytest.mark.parametrize("widths, dtype, C", [((8,), ml_dtypes.bfloat16, 1000), ((4,), ml_dtypes.bfloat16, 1000),
                                               ((16,), np.float32, 500)])
def test_single_chunk_widths(fresh_plans, widths, dtype, C):
    """Stripes of 16 / 8 / 4 units (W * VEC <= the simulator's 64 threads), the last one
    partly outside the rows (1000 bf16: 125 units; 500 f32: 125 units), U > 1 units per
    thread."""
    fresh_plans.setattr(column_kernels, "ONEPASS_WIDTHS", widths)
    sch = resolve_scheme("int8_column")
    shape = (21, C)
    x = column_data(shape, seed=widths[0]).astype(dtype)
    plan = kq.get_plan(shape, KINDS[dtype], sch, choices=SINGLE)
    ((_, grid, block, args),) = plan.launches
    vec = 4 if dtype == np.float32 else 8
    NT, W, U, S = column_kernels.single_chunk_geometry(21, 125, vec=vec)
    assert (W, S, grid, block, args[4], args[5]) == (widths[0], -(-125 // widths[0]), S, NT, W, 1)
    assert U * NT // W >= 21 and U > 1
    check(x, sch, x_ref=x.astype(np.float32), choices=SINGLE)


@pytest.mark.parametrize(
    "name, kw, want",
    [("int8_column", {}, True), ("int4", {"granularity": "column"}, True), ("e4m3", {"granularity": "column"}, False)],
)
def test_rint_in_range(name, kw, want):
    """The integer formats of the per-channel schemes take the encode without the clip; a
    max_elem past the format's range, or a float format, does not."""
    sch = resolve_scheme(name, **kw)
    fmt = kq.format_tuple(sch)
    assert column_kernels.rint_in_range(fmt, max_elem(sch)) == want
    if fmt[0] == 0:
        assert not column_kernels.rint_in_range(fmt, fmt[7] + 0.5) and column_kernels.rint_in_range(fmt, fmt[7] + 0.25)


@pytest.mark.parametrize("max_elem", [127.0, 7.0])
def test_dynamic_quotients_stay_in_range(max_elem):
    """What rint_in_range relies on, in float32 over a million amaxes of every binade that
    recip_guarded accepts (s = RN(amax / max_elem) in [2^-80, 2^126]): x = +-amax (the
    largest quotients) and x = the float32 neighbours below amax give RN(x / s) within
    max_elem * (1 + 2^-22), so rint stays in [-max_elem, max_elem]."""
    rng = np.random.default_rng(7)
    lo, hi = np.float32(2.0**-80) * np.float32(max_elem), np.float32(2.0**126)
    bits = rng.integers(lo.view(np.int32), hi.view(np.int32), 1 << 20, dtype=np.int32)
    amax = bits.view(np.float32)
    m = np.float32(max_elem)
    s = amax / m
    for x in (amax, -amax, np.nextafter(amax, np.float32(0)), np.nextafter(amax, np.float32(0)) * np.float32(0.75)):
        q = x / s
        assert np.abs(q).max() <= max_elem * (1 + 2.0**-22)
        assert np.abs(np.rint(q)).max() <= max_elem


def test_single_chunk_falls_back():
    """More rows than one block holds: the two passes, the design's plain fallback; rows a
    block holds take it automatically (no cluster of a single block's rows, no ring of a
    single chunk), and the two passes where the caller chooses them."""
    sch = resolve_scheme("int8_column")
    rows = column_kernels.ONEPASS_UNITS * column_kernels.ONEPASS_THREADS // min(column_kernels.ONEPASS_WIDTHS) + 1
    assert launched((rows, 64), ml_dtypes.bfloat16, sch, choices=SINGLE) == TWO_PASS
    assert launched((4, 64), ml_dtypes.bfloat16, sch) == ["column_onepass"]
    assert launched((4, 64), ml_dtypes.bfloat16, sch, choices=KernelChoices(per_channel="two_pass")) == TWO_PASS
