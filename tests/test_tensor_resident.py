"""Dynamic per-tensor float scales in one cooperative launch
(``nqdq.gpu.quantize.tensor_resident``): the plan takes it above the one-launch sizes, and its
codes and scales are the reference's bit for bit,
whatever part of the input is held in registers, in shared memory or streamed (and read
again, last round first). Under the simulator the grid is one block of a small
geometry; tests/test_tensor_resident_gpu.py runs the real grid.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nqdq.gpu.quantize.tensor_resident as tensor_resident
import nqdq.gpu.quantize.plan as kq
from nqdq.gpu.quantize import runners
from nqdq.gpu.quantize.choices import KernelChoices, PerTensor
from nqdq.gpu.runtime.target import SIMULATOR
from nqdq.schemes import resolve_scheme

from helpers.data import edge_data
from helpers.kernels import check

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

KIND = {np.dtype(np.float32): 0, np.dtype(ml_dtypes.bfloat16): 1, np.dtype(np.float16): 2}


RESIDENT = KernelChoices(per_tensor=PerTensor.RESIDENT)  # at every size (the one-launch kernel not chosen)
TWO_PASS = KernelChoices(per_tensor=PerTensor.TWO_PASS)


@pytest.fixture
def geometry(fresh_plans):
    """Set the resident kernel's (NT, UR, US, V) for the test (read when a plan is built:
    plans built afresh, and dropped after)."""

    def set_(g):
        fresh_plans.setattr(tensor_resident, "GEOMETRY", g)

    return set_


def _names(shape, dtype, sch, stoch=False, choices=RESIDENT):
    plan = kq.get_plan(shape, KIND[np.dtype(dtype)], sch, stoch=stoch, choices=choices)
    return [k.py_func.__name__ for k, _g, _b, _a in plan.launches]


def _units(dtype):
    return 4 if np.dtype(dtype) == np.float32 else 8


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's plan (one block)")
def test_plan_takes_the_resident_kernel():
    sch = resolve_scheme("fp8_tensor")
    assert _names((16, 64), ml_dtypes.bfloat16, sch) == ["tensor_resident"]
    assert _names((16, 64), ml_dtypes.bfloat16, sch, stoch=True) != ["tensor_resident"]  # RNE only
    assert _names((5, 7), np.float32, sch) != ["tensor_resident"]  # not whole 16-byte units
    assert _names((16, 64), ml_dtypes.bfloat16, sch, choices=TWO_PASS) == ["tensor_amax", "finalize", "static_encode"]
    assert _names((64, 1024), ml_dtypes.bfloat16, sch, choices=None) == ["tensor_resident"]  # beyond one launch
    nv = resolve_scheme("nvfp4")  # NVFP4 stays on the streaming kernels (no faster in this one)
    assert _names((16, 64), ml_dtypes.bfloat16, nv) == ["tensor_amax", "finalize", "lastaxis_groups"]
    assert _names((64, 1024), ml_dtypes.bfloat16, nv, choices=None) == ["tensor_amax", "lastaxis_groups"]


def test_kernel_carries_its_launch():
    """Cooperative, with the shared memory of its NT * US units, and the grid one block an SM."""
    NT, UR, US, V = tensor_resident.resident_geometry()
    (k, grid, block, _args), = kq.get_plan((16, 64), 1, resolve_scheme("fp8_tensor"), choices=RESIDENT).launches
    assert k.py_func.__name__ == "tensor_resident"
    assert k.nqdq_cooperative and k.nqdq_dynamic_smem == NT * US * 16
    assert (grid, block) == (kq._sm_count(), NT)


def test_geometry_fills_shared_memory():
    """US 0 takes as many units as the block's shared memory holds beyond SMEM_RESERVE."""
    got = tensor_resident.resident_geometry(smem_per_block=232448, geometry=(1024, 4, 0, 4))
    assert got == ((1024, 4, 14, 4) if not SIMULATOR else (1024, 4, 0, 4))
    assert tensor_resident.resident_geometry(smem_per_block=232448, geometry=(512, 8, 3, 8)) == (512, 8, 3, 8)


# (geometry, elements): every unit resident (a partial block), resident + one partial round,
# resident + several rounds ending in a partial one; registers only, shared memory only
CASES = [
    ((64, 1, 2, 2), 8 * 150),
    ((64, 1, 2, 2), 8 * 300),
    ((64, 1, 2, 2), 8 * 640 + 8 * 3),
    ((64, 0, 3, 1), 8 * 420),
    ((64, 2, 0, 2), 8 * 333),
]


@pytest.mark.parametrize("g,n", CASES, ids=lambda v: str(v))
def test_bit_exact_bf16(geometry, g, n):
    geometry(g)
    x = edge_data((n,), seed=n).astype(ml_dtypes.bfloat16)
    check(x, resolve_scheme("fp8_tensor"), x_ref=x.astype(np.float32), choices=RESIDENT)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "unaligned"])
def test_bit_exact_kinds_and_unaligned_views(geometry, dtype, offset):
    """f32 / f16 inputs, and a view one element into its buffer (no 16-byte alignment: the
    shared units staged through registers, every load element by element)."""
    geometry((64, 1, 2, 2))
    n = 64 * 3 * _units(dtype) + 40 * _units(dtype)
    base = edge_data((n + offset,), seed=5).astype(dtype)
    x = base[offset:]
    check(x, resolve_scheme("fp8_tensor"), x_ref=x.astype(np.float32), choices=RESIDENT)


@pytest.mark.parametrize("fmt", ["e5m2", "int8", "int4", "e2m3"])
def test_other_element_formats(geometry, fmt):
    """Per-tensor scales of other formats: 8-bit float and integer, packed int4, 6-bit."""
    geometry((64, 1, 2, 2))
    x = edge_data((12, 64), seed=7).astype(ml_dtypes.bfloat16)
    check(x, resolve_scheme(fmt, granularity="tensor"), x_ref=x.astype(np.float32), choices=RESIDENT)


@pytest.mark.parametrize("fill", [0.0, np.nan, np.inf, 1e-40], ids=["zero", "nan", "inf", "subnormal"])
def test_uniform_inputs(geometry, fill):
    """All-equal inputs (amax 0: scale 1; NaN / inf amax: a non-finite scale, every code by
    the element path) with one ordinary value in a streamed round."""
    geometry((64, 1, 2, 2))
    x = np.full(8 * 260, fill, np.float32)
    x[8 * 250 + 3] = -1.5
    xb = x.astype(ml_dtypes.bfloat16)
    check(xb, resolve_scheme("fp8_tensor"), x_ref=xb.astype(np.float32), choices=RESIDENT)


def test_matches_the_two_kernel_path(geometry):
    """The resident kernel and the amax pass + static encode agree bit for bit."""
    x = (np.random.default_rng(3).standard_normal((24, 96)) * 5).astype(ml_dtypes.bfloat16)
    sch = resolve_scheme("fp8_tensor")
    geometry((64, 1, 2, 2))
    a = kq.quantize(x, sch, choices=RESIDENT)
    b = kq.quantize(x, sch, choices=TWO_PASS)
    for f in ("codes", "scales"):
        assert np.asarray(getattr(a, f)).tobytes() == np.asarray(getattr(b, f)).tobytes(), f


@pytest.fixture
def refusals(monkeypatch):
    """launch._REFUSED emptied for the test and restored after (a refusal is process-wide)."""
    from nqdq.gpu.runtime import launch

    monkeypatch.setattr(launch, "_REFUSED", set())
    return launch


def test_refused_cooperative_launch_falls_back(geometry, refusals, monkeypatch):
    """A cooperative launch the driver refuses (launch.LaunchRefused: an MPS thread limit, a
    partial green context) runs the call again by the plan built without such kernels, warns
    once, and later plans avoid them; the results are the reference's."""
    geometry((64, 1, 2, 2))
    sch = resolve_scheme("fp8_tensor")
    x = edge_data((8 * 300,), seed=9).astype(ml_dtypes.bfloat16)
    plan = kq.get_plan(x.shape, 1, sch, choices=RESIDENT)
    assert plan.ex_kinds == {"cooperative"} and kq.get_plan((16, 64), 1, sch, choices=RESIDENT).ex_kinds == {
        "cooperative"}
    tries = []

    def refused(*a, **k):
        tries.append(1)
        raise refusals.LaunchRefused("refused (test)", "cooperative")

    monkeypatch.setattr(plan, "_execute", refused)
    with pytest.warns(RuntimeWarning, match="refused a cooperative launch"):
        check(x, sch, x_ref=x.astype(np.float32), choices=RESIDENT)  # (its quantize call: the fallback's result)
    assert tries == [1] and refusals._REFUSED == {"cooperative"} and not tensor_resident.available()
    assert [k.py_func.__name__ for k, *_ in plan.fallback().launches] == ["tensor_amax", "finalize", "static_encode"]
    assert _names((16, 64), ml_dtypes.bfloat16, sch) == ["tensor_amax", "finalize", "static_encode"]  # plans afresh
    check(x, sch, x_ref=x.astype(np.float32), choices=RESIDENT)  # the refused plan itself forwards, without trying again
    assert tries == [1]


def test_refusal_guard_of_a_runner(geometry, refusals, monkeypatch):
    """The CuPy runner of a plan with a cooperative launch: a refusal switches it for good to
    the fallback plan's runner; any other launch error reaches the caller."""
    geometry((64, 1, 2, 2))
    plan = kq.get_plan((16, 64), 1, resolve_scheme("fp8_tensor"), choices=RESIDENT)
    other = kq.get_plan((32, 64), 1, resolve_scheme("fp8_tensor"), choices=RESIDENT)
    assert plan.ex_kinds == other.ex_kinds == {"cooperative"}
    calls = []

    class Alt:
        def cupy_runner(self):
            return lambda x, lo=0, hi=0: calls.append(("alt", x)) or "alt result"

    monkeypatch.setattr(plan, "fallback", lambda: Alt())

    def inner(x, lo=0, hi=0):
        calls.append(("inner", x))
        if x == "bad":
            raise RuntimeError("cuLaunchKernel(tensor_resident) failed: 700")
        raise refusals.LaunchRefused("refused (test)", "cooperative")

    run = runners.refusal_guard(plan, inner)
    with pytest.raises(RuntimeError, match="700"):
        run("bad")
    with pytest.warns(RuntimeWarning, match="refused"):
        assert run("x1") == "alt result"
    assert run("x2") == "alt result"
    assert calls == [("inner", "bad"), ("inner", "x1"), ("alt", "x1"), ("alt", "x2")]
    # a runner built before the refusal (another plan of the kind) goes straight to its fallback;
    # where building that fails (e.g. inside an invalidated graph capture) the next call tries again
    builds = []

    def flaky():
        builds.append(1)
        if len(builds) == 1:
            raise RuntimeError("cudaErrorStreamCaptureInvalidated (test)")
        return Alt()

    monkeypatch.setattr(other, "fallback", flaky)
    run2 = runners.refusal_guard(other, inner)
    del calls[:]
    with pytest.raises(RuntimeError, match="Invalidated"):
        run2("y1")
    assert run2("y2") == "alt result" and run2("y3") == "alt result"
    assert calls == [("alt", "y2"), ("alt", "y3")] and builds == [1, 1]
