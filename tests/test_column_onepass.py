"""The one-pass per-channel kernel (``_column_kernels.column_onepass``) in the simulator:
bit for bit against the NumPy reference, every stripe one chunk (P = 1: the simulator runs
blocks one after another, so a wait across blocks would never end; the multi-chunk wait
runs in tests/test_column_onepass_gpu.py), with and without the workspace / ticket path,
several stripe widths, stripes and rows that do not fill a block, NaN / inf / all-zero /
subnormal channels, 8-, 4- and 8-bit-float codes. The geometry rules are checked by hand
against shapes of the issue."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nqdq.gpu.quantize.columns as column_kernels
import nqdq.gpu.quantize.plan as kq
from nqdq.schemes import resolve_scheme

from test_kernels import _KINDS, check, edge_data


def _launched(shape, dtype, sch):
    plan = kq.get_plan(shape, _KINDS[dtype], sch)
    return [k.py_func.__name__ if hasattr(k, "py_func") else k.__name__ for k, _, _, _ in plan.launches]


def _column_data(shape, seed):
    x = edge_data(shape, seed=seed)
    c = x.reshape(-1, shape[-1])
    c[:, 1] = 0.0  # an all-zero channel: s = 1
    c[:, 2] = -0.0
    c[:, 3] = np.inf  # inf but no NaN in the channel: s = NaN
    c[:, 4] = np.random.default_rng(seed).standard_normal(c.shape[0]) * 1e-41  # subnormal amax
    c[c.shape[0] // 2, 5] = np.nan  # one NaN: NaN scale
    c[:, -1] = np.random.default_rng(seed + 1).standard_normal(c.shape[0]) * 1e30  # large finite
    return x


# ----------------------------------------------------------------------------- geometry
@pytest.mark.parametrize(
    "rows, upr, sms, want",
    [
        # bf16 8192 x 8192 (1024 units per row) on an H100 (132 SMs): 32 stripes of 32 units,
        # chunks of 16 * 256 / 32 = 128 rows, P = 8192 / 128 = 64
        (8192, 1024, 132, (256, 32, 16, 64, 32)),
        # bf16 16384 x 7168 (896 units): W = 32 would need P = 128 > 64; W = 16: 256 rows, P = 64
        (16384, 896, 132, (256, 16, 16, 64, 56)),
        # bf16 65536 x 1024: W = 4 (64 rows per pass, 1024 per chunk), P = 64
        (65536, 128, 132, (256, 4, 16, 64, 32)),
        # decode 64 x 7168: one chunk per stripe, the narrowest stripes (64 rows per pass, U = 1)
        (64, 896, 132, (256, 4, 1, 1, 224)),
        # 300 rows fit one chunk at W = 4 with U = ceil(300 / 64) = 5 -> 8 (a power of two)
        (300, 896, 132, (256, 4, 8, 1, 224)),
        # a 16-SM device (a MIG slice) bounds P by 16: W = 8, chunks of 512 rows
        (8192, 1024, 16, (256, 8, 16, 16, 128)),
        # narrow rows: no stripe wider than 2 * upr (3 units: W <= 4)
        (5000, 3, 132, (256, 4, 16, 5, 1)),
        (65536 * 2, 128, 132, None),  # 128 chunks of the narrowest stripe: the two passes
    ],
)
def test_onepass_geometry(rows, upr, sms, want):
    assert column_kernels.onepass_geometry(rows, upr, sms, nt=256) == want


def test_onepass_geometry_channels_per_block():
    """A stripe's W * VEC channels are at most NT (one thread each for the scales): with 64
    threads, bf16 stripes are at most 8 units wide, f32 ones 16."""
    assert column_kernels.onepass_geometry(8, 64, 1, nt=64, vec=8)[1] == 4  # P = 1: narrowest
    assert column_kernels.onepass_geometry(2000, 64, 32, nt=64, vec=8) == (64, 8, 16, 16, 8)  # 128 rows per chunk
    assert column_kernels.onepass_geometry(2000, 64, 32, nt=64, vec=4) == (64, 16, 16, 32, 4)  # 64 rows per chunk


def test_onepass_geometry_p_max():
    assert column_kernels.onepass_geometry(8192, 1024, 132, p_max=128, nt=256) == (256, 32, 16, 64, 32)
    assert column_kernels.onepass_geometry(65536, 128, 132, p_max=128, nt=256) == (256, 8, 16, 128, 16)
    assert column_kernels.onepass_geometry(65536, 128, 100, p_max=128, nt=256) == (256, 4, 16, 64, 32)  # P <= SMs


# ----------------------------------------------------------------------------- bit for bit
_EXACT_CASES = [
    ("int8_column", {}, (37, 96)),  # rows not a multiple of a pass; several stripes
    ("e4m3", {"granularity": "column"}, (2, 9, 40)),  # N-D: every leading index is a row
    ("int4", {"granularity": "column"}, (11, 48)),  # 4-bit codes, two per byte
    ("e2m1", {"granularity": "column"}, (5, 16)),
]


# every case without the workspace; with it (the pipelined kernel) every case in bf16 and
# int8_column in every dtype (the simulator's time is the limit)
@pytest.mark.parametrize(
    "name, kw, shape, dtype, sync",
    [(*c, d, False) for c in _EXACT_CASES for d in (np.float32, np.float16, ml_dtypes.bfloat16)]
    + [(*c, d, True) for c in _EXACT_CASES for d in (np.float32, np.float16, ml_dtypes.bfloat16)
       if d == ml_dtypes.bfloat16 or c[0] == "int8_column"],
)
def test_onepass_exact(onepass, name, kw, shape, dtype, sync):
    """Without the workspace (one block per item), with it (pipelined: persistent blocks)."""
    onepass.setattr(kq, "COLUMN_ONEPASS_SYNC", sync)
    sch = resolve_scheme(name, **kw)
    x = _column_data(shape, seed=len(name) + shape[-1]).astype(dtype)
    assert _launched(x.shape, dtype, sch) == ["column_onepass"]
    roles = [s.role for s in kq.get_plan(x.shape, _KINDS[dtype], sch).slots]
    assert ("zero" in roles) == bool(sync)  # the workspace, zeroed by the plan
    check(x, sch, x_ref=x.astype(np.float32))


@pytest.mark.parametrize("widths, dtype, C", [((8,), ml_dtypes.bfloat16, 1000), ((4,), ml_dtypes.bfloat16, 1000),
                                               ((16,), np.float32, 500)])
def test_onepass_widths(onepass, widths, dtype, C):
    """Stripes of 16 / 8 / 4 units (W * VEC <= the simulator's 64 threads), the last one
    partly outside the rows (1000 bf16: 125 units; 500 f32: 125 units), U > 1 units per
    thread, one block per item."""
    onepass.setattr(column_kernels, "ONEPASS_WIDTHS", widths)
    sch = resolve_scheme("int8_column")
    shape = (21, C)
    x = _column_data(shape, seed=widths[0]).astype(dtype)
    plan = kq.get_plan(shape, _KINDS[dtype], sch)
    ((_, grid, block, args),) = plan.launches
    vec = 4 if dtype == np.float32 else 8
    NT, W, U, P, S = column_kernels.onepass_geometry(21, 125, 1, vec=vec)
    assert (W, P, S, grid, block, args[4]) == (widths[0], 1, -(-125 // widths[0]), S, NT, W)
    assert U * NT // W >= 21 and U > 1
    check(x, sch, x_ref=x.astype(np.float32))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_onepass_pipelined_two_chunks(onepass, dtype):
    """The pipelined kernel with P = 2 chunks per stripe in the simulator: one persistent
    block holds both chunks of a stripe (its next item is of the current stripe, so it
    arrives before it waits: the early arrival), then moves to the next stripe (the late
    arrival). One unit per thread and item, 16 rows per chunk at W = 4: 32 rows, 2 stripes."""
    onepass.setattr(kq, "_sm_count", lambda: 2)  # P <= 2
    onepass.setattr(column_kernels, "ONEPASS_UNITS", 1)  # no single-chunk geometry for 32 rows
    onepass.setattr(column_kernels, "ONEPASS_PIPE_UNITS", 1)
    onepass.setattr(column_kernels, "ONEPASS_PIPE_BLOCKS", 1)
    vec = 4 if dtype == np.float32 else 8
    shape = (32, 8 * vec)
    sch = resolve_scheme("int8_column")
    plan = kq.get_plan(shape, _KINDS[dtype], sch)
    ((k, grid, block, args),) = plan.launches
    assert (grid, args[4], args[5], args[6]) == (1, 4, 2, 2)  # 1 block; W, P, S
    x = _column_data(shape, seed=11).astype(dtype)
    check(x, sch, x_ref=x.astype(np.float32))


@pytest.mark.parametrize("dtype, C", [(ml_dtypes.bfloat16, 136), (np.float32, 96)])
def test_onepass_item_kernel_with_workspace(dtype, C):
    """The one-block-per-item kernel with its workspace and ticket (the plan's where the
    pipelined geometry does not fit, P > 1: on a GPU), launched directly with P = 1 (its own
    arrival completes each stripe): the reference's codes and scales, every stripe arrived
    once, every ticket taken."""
    from nqdq.reference import quantize as ref

    sch = resolve_scheme("int8_column")
    rows = 21
    x = _column_data((rows, C), seed=C).astype(dtype)
    kind = _KINDS[x.dtype.type]
    vec = 4 if dtype == np.float32 else 8
    upr = C // vec
    NT, W, U, P, S = column_kernels.onepass_geometry(rows, upr, 1, vec=vec)
    assert P == 1
    k = column_kernels.make_column_onepass_kernel(kind, kq.format_tuple(sch), kq._max_elem(sch), NT, U, False, True)
    xf = x.reshape(-1)
    xf = xf if dtype == np.float32 else xf.view(np.uint16)
    ws = np.zeros(column_kernels.onepass_workspace_words(C, S), np.int32)
    scales = np.full(C, np.nan, np.float32)
    codes = np.full(rows * C, 0xA5, np.uint8)
    k[S, NT](xf, rows, upr, C, W, P, S, ws, scales, codes)
    assert ws[C + S] == S and (ws[C:C + S] == 1).all()
    want = ref.quantize(x.astype(np.float32), sch)
    assert (scales.view(np.uint32) == want.scales.view(np.uint32)).all()
    assert (codes.view(np.int8).reshape(rows, C) == want.codes).all()


@pytest.mark.parametrize(
    "name, kw, want",
    [("int8_column", {}, True), ("int4", {"granularity": "column"}, True), ("e4m3", {"granularity": "column"}, False)],
)
def test_rint_in_range(name, kw, want):
    """The integer formats of the per-channel schemes take the encode without the clip; a
    max_elem past the format's range, or a float format, does not."""
    sch = resolve_scheme(name, **kw)
    fmt = kq.format_tuple(sch)
    assert column_kernels.rint_in_range(fmt, kq._max_elem(sch)) == want
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


def test_onepass_falls_back(onepass):
    """More rows than one chunk holds in the simulator (P would exceed 1): the two passes;
    COLUMN_ONEPASS off: the two passes too."""
    sch = resolve_scheme("int8_column")
    rows = column_kernels.ONEPASS_UNITS * column_kernels.ONEPASS_THREADS // min(column_kernels.ONEPASS_WIDTHS) + 1
    assert _launched((rows, 64), ml_dtypes.bfloat16, sch) == ["column_amax", "finalize", "column_encode"]
    assert _launched((4, 64), ml_dtypes.bfloat16, sch) == ["column_onepass"]
    onepass.setattr(kq, "COLUMN_ONEPASS", False)
    kq._PLANS.clear()
    assert _launched((4, 64), ml_dtypes.bfloat16, sch) == ["column_amax", "finalize", "column_encode"]


