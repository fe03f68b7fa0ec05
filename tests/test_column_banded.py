"""Per-channel scales by column bands re-read from L2 (``_column_banded.column_banded``) in
the simulator: the geometry and ticket-order helpers by hand, and the kernel bit for bit
against the NumPy reference with several bands, several chunks per stripe and a partial
last band. The simulator runs blocks one after another: the first persistent block takes
every ticket in order, so each phase-2 wait is met when reached (the whole item order runs;
concurrent waits run in tests/test_column_banded_gpu.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nqdq.kernels._column_banded as CB
import nqdq.kernels._column_kernels as CK
import nqdq.kernels.quantize as kq
from nqdq.schemes import resolve_scheme

from test_column_onepass import _column_data, _launched
from test_kernels import _KINDS, check

MB = 1 << 20


@pytest.fixture
def banded(onepass):
    onepass.setattr(kq, "COLUMN_BANDED", True)
    kq._PLANS.clear()
    yield onepass
    kq._PLANS.clear()


@pytest.mark.parametrize(
    "rows, upr, band, want",
    [
        # bf16 8192 x 8192 (1024 units), 12 MB bands: 96 units -> 3 stripes of 32 (4 MB each),
        # 32 stripes in 11 bands (3 stripes each, the last 2 missing); chunks of 16 * 8 rows
        (8192, 1024, 12 * MB, (256, 32, 16, 64, 32, 3, 11)),
        # bf16 16384 x 7168 (896 units), 12 MB: 48 units = 3 stripes of 16 exactly (2 of 32 would be 64)
        (16384, 896, 12 * MB, (256, 16, 16, 64, 56, 3, 19)),
        (16384, 896, 16 * MB, (256, 32, 16, 128, 28, 2, 14)),
        # bf16 65536 x 1024 (128 units), 12 MB: 12 units = 3 stripes of 4
        (65536, 128, 12 * MB, (256, 4, 16, 64, 32, 3, 11)),
        # a band narrower than the narrowest stripe: one stripe of 4 units a band
        (1 << 20, 128, 12 * MB, (256, 4, 16, 1024, 32, 1, 32)),
        # a band wider than the whole input: one band of every stripe
        (64, 896, 12 * MB, (256, 32, 16, 1, 28, 28, 1)),
    ],
)
def test_banded_geometry(rows, upr, band, want):
    assert CB.banded_geometry(rows, upr, 8, band, nt=256, units=16) == want


def test_item_order():
    """Every band's phase 1 and phase 2 exactly once, phase 2 of band b right after phase 1
    of band b + lag (so after every phase-1 item of band b): the wait's lower tickets."""
    for nb in range(1, 7):
        for lag in range(1, nb + 1):
            order = [CB.item_of(q, nb, lag) for q in range(2 * nb)]
            assert sorted(order) == sorted([(p, b) for p in (False, True) for b in range(nb)])
            for b in range(nb):
                p2 = order.index((True, b))
                assert order.index((False, b)) < p2
                assert order[p2 - 1] == (False, b + lag) if b + lag < nb else all(
                    (False, k) in order[:p2] for k in range(nb))
    assert [CB.item_of(q, 3, 1) for q in range(6)] == [(False, 0), (False, 1), (True, 0), (False, 2), (True, 1),
                                                      (True, 2)]  # fmt: skip


# (shape, dtype, band bytes, units): several bands (some partial), P > 1 chunks, partial chunks
_CASES = [
    ((50, 96), ml_dtypes.bfloat16, 50 * 16 * 4, 2),  # 12 units: W = 4, 3 bands of 1 stripe; P = 2 (18 rows short)
    ((37, 200), ml_dtypes.bfloat16, 37 * 16 * 8, 1),  # 25 units: W = 8, 4 bands (the last stripe partial), P = 5
    ((3, 7, 48), np.float32, 21 * 16 * 8, 1),  # f32: 12 units of 4 channels, W = 8; N-D; P = 3
    ((29, 104), np.float16, 29 * 16 * 8, 2),  # 13 units: W = 8, 2 stripes in 2 bands, P = 2
]


@pytest.mark.parametrize("shape, dtype, band, units", _CASES)
def test_banded_exact(banded, shape, dtype, band, units):
    banded.setattr(CK, "ONEPASS_UNITS", 1)  # no single-chunk one pass for these rows
    banded.setattr(CB, "BAND_BYTES", band)
    banded.setattr(CB, "BANDED_UNITS", units)
    banded.setattr(kq, "_sm_count", lambda: 1)  # (1 under the simulator already)
    sch = resolve_scheme("int8_column")
    x = _column_data(shape, seed=shape[-1]).astype(dtype)
    assert _launched(shape, dtype, sch) == ["column_banded"]
    plan = kq.get_plan(shape, _KINDS[dtype], sch)
    ((_, grid, block, args),) = plan.launches
    vec = 4 if dtype == np.float32 else 8
    NT, W, U, P, S, B, NB = CB.banded_geometry(x.size // shape[-1], shape[-1] // vec, vec, band, units=units)
    assert args[4:11] == (W, U, P, S, B, NB, 1) and P > 1 and NB > 1 and block == NT
    assert "zero" in [s.role for s in plan.slots]  # the workspace, zeroed by the plan
    check(x, sch, x_ref=x.astype(np.float32))


@pytest.mark.parametrize("name, kw", [("e4m3", {"granularity": "column"}), ("int4", {"granularity": "column"}),
                                      ("e2m1", {"granularity": "column"})])
def test_banded_formats(banded, name, kw):
    banded.setattr(CK, "ONEPASS_UNITS", 1)
    banded.setattr(CB, "BAND_BYTES", 40 * 16 * 4)
    banded.setattr(CB, "BANDED_UNITS", 1)
    x = _column_data((40, 64), seed=7).astype(ml_dtypes.bfloat16)
    assert _launched(x.shape, ml_dtypes.bfloat16, resolve_scheme(name, **kw)) == ["column_banded"]
    check(x, resolve_scheme(name, **kw), x_ref=x.astype(np.float32))


def test_banded_decode_keeps_onepass(banded):
    """Rows that fit one chunk (P = 1) keep column_onepass alone (one launch, no workspace)."""
    assert _launched((4, 64), ml_dtypes.bfloat16, resolve_scheme("int8_column")) == ["column_onepass"]
