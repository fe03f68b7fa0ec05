"""The integer last-axis group encode (``_rowwise_kernels.INT_GROUP_FAST``: one reciprocal per
chunk, bfloat16 pair amax, units interleaved over a group's lanes), the tile kernel's and the
asymmetric rows kernel's reciprocal once per thread (``_tile_kernels.RECIP_ONCE``,
``_rowwise_kernels.ASYM_ROW_RECIP_ONCE``), each switched on and off, against
the reference bit for bit (codes packed and unpacked, scales, dequantized values). Small
cases for the simulator; with NQDQ_TEST_GPU=1 the same cases run compiled
(tests/test_int_group_tile_gpu.py adds real sizes)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nqdq.kernels.quantize as kq
from nqdq.kernels import _rowwise_kernels as RK
from nqdq.kernels import _tile_kernels as TK
from nqdq.schemes import resolve_scheme

from test_kernels import _launched, check, edge_data

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN/inf arithmetic in the simulator


def _clear():
    RK.make_lastaxis_group_kernel.cache_clear()
    TK.make_tile_kernel.cache_clear()
    kq._PLANS.clear()


@pytest.fixture(params=[True, False], ids=["new", "old"])
def switch(request, monkeypatch):
    """Both switches set to the parameter; kernels and plans built meanwhile are dropped."""
    monkeypatch.setattr(RK, "INT_GROUP_FAST", request.param)
    monkeypatch.setattr(TK, "RECIP_ONCE", request.param)
    _clear()
    yield request.param
    _clear()


@pytest.mark.parametrize(
    "name, kw, shape, dtype",
    [
        ("int4_group", {}, (6, 256), ml_dtypes.bfloat16),  # L = 16, K = 4: 4 lanes a group, interleaved
        ("int4_group", {}, (4, 256), np.float16),
        ("int4_group", {}, (3, 256), np.float32),  # L = 32 units of 4
        ("int4", {"granularity": "group", "group_size": 32}, (4, 96), ml_dtypes.bfloat16),  # L = 4 = K: one lane
        ("int4", {"granularity": "group", "group_size": 16}, (4, 64), ml_dtypes.bfloat16),  # L = K = 2
        ("int8", {"granularity": "group", "group_size": 64}, (4, 128), ml_dtypes.bfloat16),  # 8-bit codes, LL = 2
    ],
)
def test_int_groups_exact(switch, name, kw, shape, dtype):
    sch = resolve_scheme(name, **kw)
    x = edge_data(shape, seed=shape[0] + shape[1]).astype(dtype)
    x.reshape(-1)[:32] = 0.0  # an all-zero group (scale 1, recip_guarded's range)
    x.reshape(-1)[32:64] *= np.asarray(1e-25, dtype)  # a tiny one: its scale is below the reciprocal's range
    assert "lastaxis_groups" in _launched(shape, dtype, sch)
    check(x, sch, x_ref=x.astype(np.float32))


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32])
def test_tile_recip_once_exact(switch, dtype):
    sch = resolve_scheme("fp8_128x128", block_shape=(8, 64))
    x = edge_data((17, 128), seed=9).astype(dtype)  # a partial row tile
    x[:8, :64] = 0.0
    x[8:16, 64:] *= np.asarray(1e-30, dtype)
    assert "tile_blocks" in _launched(x.shape, dtype, sch)
    check(x, sch, x_ref=x.astype(np.float32))


def test_int_group_interleave_geometry(monkeypatch):
    """With the switch on, int4_group's chunks of 4 units are interleaved over a group's 4
    lanes (lane l: units l, l + 4, ...: ST = 4), as fp8's are; without it they are
    consecutive (ST = 1)."""
    for on, st in ((True, 4), (False, 1)):
        monkeypatch.setattr(RK, "INT_GROUP_FAST", on)
        _clear()
        plan = kq.get_plan((8, 1024), 1, resolve_scheme("int4_group"))
        k = [k for k, _, _, _ in plan.launches if k.py_func.__name__ == "lastaxis_groups"][0]
        assert k.py_func.__globals__["ST"] == st
    _clear()


@pytest.mark.parametrize("on", [True, False], ids=["new", "old"])
@pytest.mark.parametrize(
    "name, shape, dtype",
    [("int8_asym", (5, 512), ml_dtypes.bfloat16), ("int4_asym", (3, 256), np.float32), ("int8_asym", (4, 200), np.float16)],
)
def test_asym_rows_recip_once_exact(monkeypatch, on, name, shape, dtype):
    """``_rowwise_kernels.ASYM_ROW_RECIP_ONCE``: the asymmetric rows kernel's reciprocal and
    float bounds once per thread, on and off (int4_asym: per-row scales here, granularity row)."""
    monkeypatch.setattr(RK, "ASYM_ROW_RECIP_ONCE", on)
    RK.make_lastaxis_asym_row_kernel.cache_clear()
    kq._PLANS.clear()
    try:
        sch = resolve_scheme(name) if name == "int8_asym" else resolve_scheme("int4", granularity="row", symmetric=False)
        x = edge_data(shape, seed=shape[1]).astype(dtype)
        x[1] = 0.0  # an all-zero row
        x[2] *= np.asarray(1e-30, dtype)  # a row whose scale is below the reciprocal's range
        assert "lastaxis_asym_rows" in _launched(shape, dtype, sch)
        check(x, sch, x_ref=x.astype(np.float32))
    finally:
        RK.make_lastaxis_asym_row_kernel.cache_clear()
        kq._PLANS.clear()


def test_switches_on_for_users():
    """The three switches passed their GPU runs (H100, 2026-11-21): on without
    NQDQ_UNMEASURED_KERNELS; the launch-bound knobs (measured no faster) off."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if k not in ("NQDQ_UNMEASURED_KERNELS", "NQDQ_INT_GROUP_FAST", "NQDQ_TILE_RECIP_ONCE",
                        "NQDQ_ASYM_ROW_RECIP_ONCE", "NQDQ_INT_GROUP_MIN_BLOCKS", "NQDQ_TILE_MIN_BLOCKS")}
    env["NUMBA_ENABLE_CUDASIM"] = "1"
    code = ("import nqdq.kernels._rowwise_kernels as RK, nqdq.kernels._tile_kernels as TK; "
            "print(RK.INT_GROUP_FAST, TK.RECIP_ONCE, RK.ASYM_ROW_RECIP_ONCE, RK.INT_GROUP_MIN_BLOCKS, TK.MIN_BLOCKS)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True", "True", "0", "0"]
