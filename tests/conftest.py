"""Test configuration.

Kernels run under Numba's CUDA simulator unless NQDQ_TEST_GPU=1 is set (on the GPU
machine), so the same tests run in CI without a GPU. NQDQ_UNMEASURED_KERNELS=1 (below)
turns on the kernel paths that have not yet run on a GPU. The variable must be set before
numba.cuda is first imported, hence here.
"""

import os

if os.environ.get("NQDQ_TEST_GPU") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
# The kernel paths not yet run on a GPU are off for users (nqdq/gpu/quantize/plan.py) and on
# for the tests, so CI checks them in the simulator and the next GPU run on the device.
os.environ.setdefault("NQDQ_UNMEASURED_KERNELS", "1")
# NQDQ_TEST_SPREAD_GPUS=N (N GPUs, with pytest-xdist): worker gwK sees only GPU K % N, so one
# run spreads the single-GPU tests over every GPU of the machine. Run the two-GPU tests
# (tests/test_multi_gpu.py) without it: each worker sees one GPU and they skip.
_spread = os.environ.get("NQDQ_TEST_SPREAD_GPUS")
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _spread and _worker.startswith("gw"):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(int(_worker[2:]) % int(_spread))


import pytest  # noqa: E402  (after the environment above: numba.cuda reads it at import)


@pytest.fixture
def sr_fast(monkeypatch):
    """Stochastic rounding on the 16-byte-unit kernels (quantize.LASTAXIS_STOCH: on by default
    since its GPU run; set here all the same, so the tests do not depend on it), with a fresh
    plan cache before and after (plans are cached without the switch); yields the monkeypatch
    for further switches (tests/test_stochastic_lastaxis*.py)."""
    import nqdq.gpu.quantize.plan as kq

    monkeypatch.setattr(kq, "LASTAXIS_STOCH", True)
    kq._PLANS.clear()
    yield monkeypatch
    kq._PLANS.clear()


@pytest.fixture
def onepass(monkeypatch):
    """The one-pass per-channel path on (tests/test_column_onepass*.py), in registers (the
    shared-memory ring and the cluster kernel off: tests/test_column_ring*.py and
    tests/test_column_cluster*.py turn them on); plans built inside the
    test are dropped afterwards. Yields the monkeypatch for further switches."""
    import nqdq.gpu.quantize.plan as kq

    monkeypatch.setattr(kq, "COLUMN_ONEPASS", True)
    monkeypatch.setattr(kq, "COLUMN_RING", False)
    monkeypatch.setattr(kq, "COLUMN_CLUSTER", False)
    kq._PLANS.clear()
    yield monkeypatch
    kq._PLANS.clear()


@pytest.fixture
def row_kernel_ops(monkeypatch):
    """The ops (``_fused_kernels.OP_*``) of every fused row kernel built during the test, in
    order (``kernels.fused.fused_row_kernel`` spied; the kernels built as before)."""
    from nqdq.gpu.fused import plan as KF

    ops = []
    build = KF.fused_row_kernel

    def spy(op, *a, **kw):
        ops.append(op)
        return build(op, *a, **kw)

    monkeypatch.setattr(KF, "fused_row_kernel", spy)
    return ops
