"""Persistent row blocks (``quantize.ROW_PERSIST``: a few blocks per SM loop over the rows,
each loading its next row before it encodes the current one) against the NumPy reference,
bit for bit: rows not a multiple of the grid, the last rows' prefetch past the end, rows of
units that a block's threads do not fill evenly, every input kind, NaN / inf / zero rows. Under the simulator
the SM count is 1, so ROW_PERSIST = 2 is a grid of two blocks looping over the rows;
tests/test_row_persist_gpu.py runs real grids.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nqdq.kernels.quantize as kq
from nqdq.schemes import resolve_scheme

from test_kernels import check, edge_data

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture
def persist(monkeypatch):
    """ROW_PERSIST = ``n`` blocks per SM and a small DEEP_ROWS, with fresh plans before and after."""

    def set_(n, deep_rows=4):
        monkeypatch.setattr(kq, "ROW_PERSIST", n)
        monkeypatch.setattr(kq, "DEEP_ROWS", deep_rows)
        kq._PLANS.clear()

    yield set_
    kq._PLANS.clear()


def _row_launch(shape, kind, name):
    plan = kq.get_plan(shape, kind, resolve_scheme(name))
    (k, grid, nt, args), = plan.launches
    return k.py_func.__name__, grid, args


def test_plan_takes_persistent_blocks_only_when_there_are_more_rows(persist):
    persist(2)
    name, grid, args = _row_launch((7, 56), 1, "fp8_row")
    assert (name, grid, args[-1]) == ("lastaxis_rows", 2 * kq._sm_count(), 7)  # rows passed last
    name, grid, _ = _row_launch((2, 56), 1, "fp8_row")
    assert grid == 2  # no more rows than blocks: one block per row
    persist(0)
    assert _row_launch((7, 56), 1, "fp8_row")[1] == 7


@pytest.mark.parametrize("name", ["fp8_row", "int8_row"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(7, 56), (5, 40), (9, 24)], ids=str)
def test_persistent_rows_bit_exact(name, dtype, shape, persist):
    persist(2)
    kind = {np.dtype(np.float32): 0, np.dtype(ml_dtypes.bfloat16): 1, np.dtype(np.float16): 2}[np.dtype(dtype)]
    assert _row_launch(shape, kind, name)[1] == 2  # the persistent kernel: two blocks
    x = edge_data(shape, seed=shape[0] * 31 + shape[1]).astype(dtype)
    x[1] = np.nan if shape[0] > 3 else x[1]  # a NaN row
    x[2] = 0.0  # an all-zero row (scale 1)
    check(x, resolve_scheme(name), x_ref=x.astype(np.float32))


def test_persistent_rows_three_blocks_one_row_each_and_more(persist):
    persist(3)
    assert _row_launch((4, 56), 1, "fp8_row")[1] == 3
    x = (np.random.default_rng(2).standard_normal((4, 48 + 8)) * 7).astype(ml_dtypes.bfloat16)
    check(x, resolve_scheme("fp8_row"), x_ref=x.astype(np.float32))
