"""Column bands re-read from L2 (``_column_banded.column_banded``) on a real GPU: persistent
blocks run concurrently, so phase-2 items really wait on other blocks' phase-1 arrivals
(the simulator runs the whole ticket order in one block, tests/test_column_banded.py).
Bit for bit against the NumPy reference: many bands (small band sizes), several chunks per
stripe, partial stripes / chunks / last bands, f32 / f16 / bf16, int8 / fp8 / int4 codes,
NaN / inf / all-zero / subnormal channels, the lag, the blocks per SM and the L2 hint loads
(``load_u32x4_hint``: its words against the reference, i.e. against its simulator twin's),
repeated calls (the workspace is zeroed per call) and a captured CUDA graph replayed.

Runs only with NQDQ_TEST_GPU=1 on a machine with a CUDA GPU and CuPy (``pytest -m gpu``).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

from _helpers import gpu_cupy_or_skip  # noqa: E402

cp = gpu_cupy_or_skip()

import nqdq.kernels._column_banded as CB  # noqa: E402
import nqdq.kernels.quantize as kq  # noqa: E402
from nqdq.schemes import resolve_scheme  # noqa: E402

from test_column_onepass import _column_data  # noqa: E402
from test_kernels import _KINDS  # noqa: E402
from test_kernels_gpu import check_gpu  # noqa: E402

MB = 1 << 20


@pytest.fixture
def banded(onepass):
    onepass.setattr(kq, "COLUMN_BANDED", True)
    kq._PLANS.clear()
    yield onepass
    kq._PLANS.clear()


def _banded_args(shape, dtype, name="int8_column", **kw):
    plan = kq.get_plan(shape, _KINDS[dtype], resolve_scheme(name, **kw))
    ((k, grid, block, args),) = plan.launches
    assert k.py_func.__name__ == "column_banded"
    return grid, args[4:11]  # W, U, P, S, B, NB, lag


@pytest.mark.parametrize(
    "shape, dtype, band",
    [
        ((4096, 2048), ml_dtypes.bfloat16, 1 * MB),  # 16 bands of one 16-unit stripe; P = 16
        ((3001, 1000), ml_dtypes.bfloat16, 0.5 * MB),  # 125 units: W = 4, the last stripe partial; short last chunk
        ((2000, 512), np.float32, 0.25 * MB),  # f32: 4 channels a unit
        ((2, 1500, 776), np.float16, 0.3 * MB),  # N-D, f16, 97 units
        ((20000, 256), ml_dtypes.bfloat16, 2 * MB),  # tall: bands of 2 stripes of 4 units, P = 20
        ((40000, 64), ml_dtypes.bfloat16, 1 * MB),  # taller, narrow: 2 bands of one stripe, P = 40
        ((4096, 7168), ml_dtypes.bfloat16, None),  # the default band size (BAND_BYTES)
    ],
)
def test_banded_exact(banded, shape, dtype, band):
    if band is not None:
        banded.setattr(CB, "BAND_BYTES", int(band))
    grid, (W, U, P, S, B, NB, lag) = _banded_args(shape, dtype)
    assert P > 1 and NB > 1, (W, U, P, S, B, NB)
    x = _column_data(shape, seed=shape[-1]).astype(dtype)
    check_gpu(x, resolve_scheme("int8_column"))


@pytest.mark.parametrize("name, kw", [("e4m3", {"granularity": "column"}), ("int4", {"granularity": "column"})])
def test_banded_formats(banded, name, kw):
    """fp8 (the paired cvt encode) and packed 4-bit codes."""
    banded.setattr(CB, "BAND_BYTES", MB)
    x = _column_data((2500, 1536), seed=3).astype(ml_dtypes.bfloat16)
    assert _banded_args(x.shape, ml_dtypes.bfloat16, name, **kw)[1][5] > 1
    check_gpu(x, resolve_scheme(name, **kw))


@pytest.mark.parametrize("knob, value", [("BANDED_LAG", 2), ("BANDED_LAG", 5), ("BANDED_BLOCKS_PER_SM", 2),
                                         ("BANDED_HINTS", 0), ("BANDED_UNITS", 4), ("BANDED_IN_FLIGHT_P1", 4)])
def test_banded_knobs(banded, knob, value):
    """The lag (waits on bands ticketed further back; 5 >= NB: all phase 1 first), two
    blocks per SM (no spills), plain loads instead of the L2 hint loads (the defaults: the
    hint loads, whose words are thus checked against the reference in the other tests),
    smaller items, fewer phase-1 loads in flight: the same codes."""
    banded.setattr(CB, "BAND_BYTES", MB)
    banded.setattr(CB, knob, value)
    x = _column_data((3000, 2048), seed=9).astype(ml_dtypes.bfloat16)
    assert _banded_args(x.shape, ml_dtypes.bfloat16)[1][5] > 1
    check_gpu(x, resolve_scheme("int8_column"))


def test_banded_few_blocks(banded):
    """Fewer persistent blocks than an SM count (one block per SM, 8 SMs' worth): each block
    works through many items, its phase-2 waits met by other blocks' phase-1 items."""
    banded.setattr(CB, "BAND_BYTES", MB)
    banded.setattr(kq, "_sm_count", lambda: 4)
    x = _column_data((3000, 2048), seed=4).astype(ml_dtypes.bfloat16)
    grid, g = _banded_args(x.shape, ml_dtypes.bfloat16)
    assert grid == 4 * CB.BANDED_BLOCKS_PER_SM
    check_gpu(x, resolve_scheme("int8_column"))


def test_banded_repeated_calls_and_graph(banded):
    """The workspace is scratch of each call, zeroed in its sequence: calls after a first
    one (whose workspace ends non-zero), and a captured CUDA graph replayed on new data."""
    banded.setattr(CB, "BAND_BYTES", MB)
    sch = resolve_scheme("int8_column")
    rng = np.random.default_rng(2)
    shape = (4096, 2048)
    for trial in range(3):
        xh = (rng.standard_normal(shape) * np.exp2(rng.uniform(-6, 6, shape[-1]))).astype(ml_dtypes.bfloat16)
        check_gpu(xh, sch)
    from nqdq.reference import quantize as ref

    x = cp.asarray(xh.view(np.uint16))
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        kq.quantize(x, sch, dtype="bfloat16")
        s.synchronize()
        s.begin_capture()
        q = kq.quantize(x, sch, dtype="bfloat16")
        graph = s.end_capture()
    for trial in range(2):
        xh = (rng.standard_normal(shape) * np.exp2(rng.uniform(-6, 6, shape[-1]))).astype(ml_dtypes.bfloat16)
        with s:
            x[...] = cp.asarray(xh.view(np.uint16))
            q.codes.fill(0x5A)
            q.scales.fill(0)
        graph.launch(s)
        s.synchronize()
        want = ref.quantize(xh.astype(np.float32), sch)
        assert (q.codes.get().view(np.int8) == want.codes).all(), f"replay {trial} codes"
        assert (q.scales.get().view(np.uint32) == want.scales.view(np.uint32)).all(), f"replay {trial} scales"
