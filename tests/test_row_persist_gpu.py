"""Persistent row blocks (``quantize.ROW_PERSIST``) on a GPU at real sizes, whole tensors
bit for bit against the NumPy reference (out-poisoned), through both launch paths: the
general one (``out_fill``) and the plan's generated CuPy runner. The rows outnumber the
grid (a few blocks per SM), so every block loops and prefetches past its last row."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

from _helpers import gpu_cupy_or_skip  # noqa: E402

cp = gpu_cupy_or_skip()

import nqdq  # noqa: E402
import nqdq.kernels.quantize as kq  # noqa: E402
from nqdq.schemes import resolve_scheme  # noqa: E402

from test_api_gpu_path import _check  # noqa: E402
from test_kernels import edge_data  # noqa: E402
from test_kernels_gpu import check_gpu  # noqa: E402


@pytest.fixture
def persist(monkeypatch):
    def set_(n):
        monkeypatch.setattr(kq, "ROW_PERSIST", n)
        kq._PLANS.clear()
        nqdq.api.clear_fast_path()

    yield set_
    kq._PLANS.clear()
    nqdq.api.clear_fast_path()


@pytest.mark.parametrize("blocks_per_sm", [2, 3])
@pytest.mark.parametrize("name", ["fp8_row", "int8_row"])
@pytest.mark.parametrize(
    "shape,dtype",
    [((2048, 7168), ml_dtypes.bfloat16), ((1000, 5120), ml_dtypes.bfloat16), ((777, 2880), np.float16),
     ((600, 4096), np.float32), ((4096, 8192), ml_dtypes.bfloat16)],
    ids=str,
)  # fmt: skip
def test_persistent_rows_bit_exact(name, shape, dtype, blocks_per_sm, persist):
    persist(blocks_per_sm)
    plan = kq.get_plan(shape, {np.dtype(np.float32): 0, np.dtype(ml_dtypes.bfloat16): 1,
                               np.dtype(np.float16): 2}[np.dtype(dtype)], resolve_scheme(name))  # fmt: skip
    assert plan.launches[0][1] == blocks_per_sm * kq._sm_count() < shape[0]  # the persistent grid
    x = edge_data(shape, seed=shape[0]).astype(dtype)
    check_gpu(x, resolve_scheme(name))


@pytest.mark.parametrize("name", ["fp8_row", "int8_row"])
def test_persistent_rows_through_the_runner(name, persist):
    persist(3)
    rng = np.random.default_rng(21)
    for _ in range(3):
        xh = (rng.standard_normal((4096, 7168)) * np.exp2(rng.uniform(-6, 6, (4096, 1)))).astype(ml_dtypes.bfloat16)
        q = nqdq.quantize(cp.asarray(xh.view(np.uint16)), name, dtype="bfloat16")
        _check(q, nqdq.quantize(xh, name, device="cpu"), name)
