"""Test configuration.

Kernels run under Numba's CUDA simulator unless NQDQ_TEST_GPU=1 is set (on the GPU
machine), so the same tests run in CI without a GPU. The variable must be set before
numba.cuda is first imported, hence here.
"""

import os

if os.environ.get("NQDQ_TEST_GPU") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
# NQDQ_TEST_SPREAD_GPUS=N (N GPUs, with pytest-xdist): worker gwK sees only GPU K % N, so one
# run spreads the single-GPU tests over every GPU of the machine. Run the two-GPU tests
# (tests/test_multi_gpu.py) without it: each worker sees one GPU and they skip.
_spread = os.environ.get("NQDQ_TEST_SPREAD_GPUS")
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _spread and _worker.startswith("gw"):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(int(_worker[2:]) % int(_spread))


import pytest  # noqa: E402  (after the environment above: numba.cuda reads it at import)


@pytest.fixture
def fresh_plans(monkeypatch):
    """Quantize plans built from scratch, and dropped after the test: for tests that set a
    planner tunable or a kernel geometry (read when a plan is built; plans are cached without
    them). Yields the monkeypatch that sets them. (Kernel designs are selected by argument:
    ``choices=``, part of the plan key.)"""
    import nqdq.gpu.quantize.plan as kq

    kq._PLANS.clear()
    yield monkeypatch
    monkeypatch.undo()
    kq._PLANS.clear()


@pytest.fixture
def row_kernel_ops(monkeypatch):
    """The ops (``fused.kernels.OP_*``) of every fused row kernel built during the test, in
    order (``kernels.fused.fused_row_kernel`` spied; the kernels built as before)."""
    from nqdq.gpu.fused import plan as KF

    ops = []
    build = KF.fused_row_kernel

    def spy(op, *a, **kw):
        ops.append(op)
        return build(op, *a, **kw)

    monkeypatch.setattr(KF, "fused_row_kernel", spy)
    return ops


@pytest.fixture
def unaligned_loads(monkeypatch):
    """The kernels read element by element when the input is not 16-byte aligned (a view
    at an offset); the simulator's arrays always report aligned, so pretend otherwise."""
    import nqdq.gpu.quantize.plan as kq
    from nqdq.gpu.quantize import lastaxis
    from nqdq.gpu.quantize import tiles
    from nqdq.gpu.runtime.target import SIMULATOR

    if not SIMULATOR:
        pytest.skip("compiled kernels: tests/test_kernels_gpu.py reads real unaligned views")

    def clear():
        for f in (lastaxis.make_lastaxis_group_kernel, lastaxis.make_lastaxis_row_kernel,
                  lastaxis.make_tensor_amax_kernel,
                  lastaxis.make_lastaxis_asym_row_kernel, lastaxis.make_lastaxis_stat_group_kernel,
                  lastaxis.make_static_kernel,
                  tiles.make_tile_kernel):
            f.cache_clear()
        kq._PLANS.clear()

    monkeypatch.setattr(lastaxis, "array_addr", lambda a: 2)
    clear()
    yield
    monkeypatch.undo()
    clear()
