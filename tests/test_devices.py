"""Which GPU a call runs on (nqdq.gpu.runtime.devices, nqdq._arrays.on_gpu_of), without a GPU.

The simulator has one device, so these tests stand in fakes for the arrays (CuPy's
``data.device_id``, DLPack's ``__dlpack_device__``, a ``__cuda_array_interface__`` pointer)
and for CuPy's ``Device``, and check the routing: which ordinal an array reports, which
device a call is switched to, and the error for arrays on two GPUs. On two GPUs,
tests/test_multi_gpu.py runs the kernels themselves.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import nqdq
from nqdq import _arrays
from nqdq.gpu.runtime import devices as _devices, target as _target


class _CupyLike:
    """What ordinal_of reads of a CuPy array: ``data.device_id`` (and the CAI is_device_array sees)."""

    def __init__(self, dev):
        self.data = types.SimpleNamespace(device_id=dev)
        self.__cuda_array_interface__ = {"data": (4096, False), "shape": (4,), "typestr": "<f4", "version": 3}


class _DLPackOnly:
    def __init__(self, kind, dev):
        self._d = (kind, dev)

    def __dlpack_device__(self):
        return self._d


class _CAIOnly:
    def __init__(self, ptr):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (4,), "typestr": "<f4", "version": 3}


@pytest.fixture
def hardware(monkeypatch):
    """The non-simulator branches, with the current device 0 and a fake CuPy whose
    ``cuda.Device(n)`` records n."""
    monkeypatch.setattr(_target, "SIMULATOR", False)
    monkeypatch.setattr(_devices, "_get_device", lambda: 0)
    switched = []

    class Device:
        def __init__(self, n):
            self.n = n

        def __enter__(self):
            switched.append(self.n)

        def __exit__(self, *exc):
            switched.append(-1)

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=Device))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return switched


@pytest.mark.skipif(not _target.SIMULATOR, reason="the simulator's one device")
def test_simulator_arrays_have_no_gpu():
    assert _devices.ordinal_of(np.zeros(3)) is None
    assert _devices.current() == 0
    assert _devices.guard(("x", np.zeros(3))) is _devices._NULL


def test_ordinal_of_each_kind_of_array(hardware, monkeypatch):
    assert _devices.ordinal_of(_CupyLike(3)) == 3
    assert _devices.ordinal_of(_DLPackOnly(2, 5)) == 5  # kDLCUDA
    assert _devices.ordinal_of(_DLPackOnly(13, 1)) == 1  # kDLCUDAManaged
    assert _devices.ordinal_of(_DLPackOnly(3, 0)) is None  # kDLCUDAHost: pinned host memory
    assert _devices.ordinal_of(np.zeros(2)) is None
    assert _devices.ordinal_of(None) is None
    asked = []
    monkeypatch.setattr(_devices, "_pointer_device", lambda p: asked.append(p) or 6)
    assert _devices.ordinal_of(_CAIOnly(0x7000)) == 6 and asked == [0x7000]
    assert _devices.ordinal_of(_CAIOnly(0)) is None  # an empty array: no address to ask about
    assert asked == [0x7000]


def test_pointer_device_asks_cupy_where_it_is_loaded(hardware, monkeypatch):
    asked = []

    def attrs(ptr):
        asked.append(ptr)
        if ptr == 0xBAD:
            raise RuntimeError("cudaErrorInvalidValue")
        return types.SimpleNamespace(device=4)

    sys.modules["cupy"].cuda.runtime = types.SimpleNamespace(pointerGetAttributes=attrs)
    assert _devices._pointer_device(0x9000) == 4
    assert _devices._pointer_device(0xBAD) is None  # unknown: the call runs where it is
    assert asked == [0x9000, 0xBAD]


def test_use_switches_only_away_from_the_current_gpu(hardware):
    assert _devices.use(0) is _devices._NULL
    assert _devices.use(None) is _devices._NULL
    with _devices.use(2):
        assert hardware == [2]
    assert hardware == [2, -1]


def test_guard_takes_the_arrays_gpu_and_refuses_two(hardware):
    with _devices.guard(("x", np.zeros(2)), ("w", _CupyLike(1)), ("r", None)):
        assert hardware == [1]
    with pytest.raises(ValueError, match=r"x is on GPU 1 and weight on GPU 0: a call runs on one GPU"):
        _devices.guard(("x", _CupyLike(1)), ("weight", _CupyLike(0)))
    assert _devices.guard(("x", _CupyLike(0))) is _devices._NULL  # already current


def test_on_gpu_of_reads_named_and_dotted_arguments(hardware):
    seen = []

    @_arrays.on_gpu_of("a", "q.codes", "bias")
    def op(a, q, *, bias=None):
        seen.append(list(hardware))
        return "ran"

    host = types.SimpleNamespace(codes=np.zeros(2))
    assert op(np.zeros(2), host) == "ran" and seen[-1] == []  # host arrays: no switch
    assert op(np.zeros(2), types.SimpleNamespace(codes=_CupyLike(3))) == "ran" and seen[-1] == [3]
    assert op(np.zeros(2), host, bias=_CupyLike(2)) == "ran" and seen[-1] == [3, -1, 2]
    with pytest.raises(ValueError, match=r"a is on GPU 1 and q.codes on GPU 2"):
        op(_CupyLike(1), types.SimpleNamespace(codes=_CupyLike(2)))
    assert op.__name__ == "op"


def test_public_entry_points_run_on_their_arrays_gpu():
    """Every public function that runs kernels on GPU arrays is wrapped (or, for the two hot
    paths, calls a wrapped general path: quantize, dequantize, the fused ops)."""
    import importlib

    from nqdq import api, fused, quantized

    mm = importlib.import_module("nqdq.matmul")  # (nqdq.matmul is the function)
    wrapped = [api._quantize, api._dequantize, fused._rmsnorm, fused._rmsnorm_quantize, fused._flatten_quantize,
               fused._moe._moe_sort_quantize, mm._matmul, quantized.QuantizedTensor.with_layout]  # fmt: skip
    for fn in wrapped:
        assert getattr(fn, "__wrapped__", None) is not None, fn.__qualname__
    assert nqdq.quantize is api.quantize and nqdq.fused.moe_sort_quantize is fused.moe_sort_quantize
