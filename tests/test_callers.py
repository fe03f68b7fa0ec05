"""The caller's library and stream (nqdq.gpu.runtime.callers), without a GPU.

Stand-in modules play PyTorch and JAX: routing by the array's type, the stream a call takes,
results handed to the library's own import (``from_dlpack``), and ``stream=`` checks. The
GPU tests (tests/test_callers_gpu.py) run the real libraries.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import nqdq
from nqdq.gpu.runtime import callers as _callers, launch


def _stand_in_torch(monkeypatch, raw_stream=True):
    """A module named ``torch`` with what TorchCaller reads: Tensor, _C, cuda, from_dlpack."""
    torch = types.ModuleType("torch")
    calls = []

    class Tensor:
        __module__ = "torch"

        def __init__(self, data, dtype="uint8"):
            self.data, self.dtype = data, dtype

        def view(self, dtype):
            calls.append(("view", dtype))
            return Tensor(self.data, dtype)

    torch.Tensor = Tensor
    torch.bfloat16, torch.uint8, torch.int8, torch.float32 = "bfloat16", "uint8", "int8", "float32"
    torch.int32, torch.int64, torch.float16 = "int32", "int64", "float16"
    torch._C = types.SimpleNamespace()
    if raw_stream:
        torch._C._cuda_getCurrentRawStream = lambda dev: 1000 + dev
    torch.cuda = types.SimpleNamespace(current_stream=lambda dev: types.SimpleNamespace(cuda_stream=2000 + dev),
                                       current_device=lambda: 0)  # fmt: skip

    def from_dlpack(a):
        info = _read_capsule(a.__dlpack__(stream=1000))
        calls.append(("from_dlpack", info[2:4]))
        return Tensor(a, info[2:4])

    torch.from_dlpack = from_dlpack
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr("nqdq.gpu.runtime.interop._order_after", lambda consumer, producer: None)  # (no driver)
    monkeypatch.setattr(_callers, "_CALLERS", {})
    return torch, calls


class _Exported:
    """A stand-in GPU result: a C-contiguous device array (``__cuda_array_interface__``)."""

    def __init__(self, dtype, shape=(2, 3), ptr=0x7000):
        self.dtype = np.dtype(dtype)
        self.__cuda_array_interface__ = {"shape": shape, "typestr": self.dtype.str, "data": (ptr, False),
                                         "strides": None, "version": 3}  # fmt: skip


def _read_capsule(capsule):
    """(device type, ndim, dtype code, bits, shape, data) of a DLPack capsule, then its deleter called."""
    import ctypes

    from nqdq.gpu.runtime import interop as _interop

    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    ptr = get(capsule, b"dltensor")
    m = _interop._DLManagedTensor.from_address(ptr)
    t = m.dl_tensor
    out = (t.device.device_type, t.ndim, t.dtype.code, t.dtype.bits, tuple(t.shape[i] for i in range(t.ndim)), t.data)
    assert ptr in _interop._EXPORTED
    m.deleter(ptr)
    assert ptr not in _interop._EXPORTED  # the deleter releases the export
    return out


def test_dlpack_export_names_the_dtype():
    from nqdq.gpu.runtime.interop import DLPackExport

    e = DLPackExport(_Exported(np.uint16, (4, 5), 0x9000), stream=0, as_bfloat16=True)
    assert e.__dlpack_device__() == (2, 0)
    assert _read_capsule(e.__dlpack__()) == (2, 2, 4, 16, (4, 5), 0x9000)  # kDLCUDA, bfloat16
    assert _read_capsule(DLPackExport(_Exported(np.float32), 0).__dlpack__())[2:4] == (2, 32)
    assert _read_capsule(DLPackExport(_Exported(np.int8), 0).__dlpack__())[2:4] == (0, 8)
    assert _read_capsule(DLPackExport(_Exported(np.float32, ()), 0).__dlpack__())[1] == 0  # 0-d
    strided = _Exported(np.float32, (2, 3))
    strided.__cuda_array_interface__["strides"] = (4, 8)
    with pytest.raises(ValueError, match="C-contiguous"):
        DLPackExport(strided, 0)


def test_stream_handles():
    assert _callers.stream_handle(0) == 0 and _callers.stream_handle(np.int64(7)) == 7
    assert _callers.stream_handle(types.SimpleNamespace(ptr=11)) == 11  # CuPy
    assert _callers.stream_handle(types.SimpleNamespace(cuda_stream=12)) == 12  # PyTorch

    class Protocol:
        def __cuda_stream__(self):
            return (0, 13)

    assert _callers.stream_handle(Protocol()) == 13
    with pytest.raises(TypeError, match="stream"):
        _callers.stream_handle(True)
    with pytest.raises(TypeError, match="stream"):
        _callers.stream_handle("default")
    with pytest.raises(ValueError, match="stream"):
        _callers.stream_handle(-1)


def test_torch_tensors_route_to_torch(monkeypatch):
    torch, calls = _stand_in_torch(monkeypatch)
    c = _callers.caller_of(torch.Tensor(None))
    assert c.name == "torch" and _callers.caller_of(torch.Tensor(None)) is c  # made once a type
    assert c.stream(1) == 1001  # PyTorch's current raw stream of the tensor's device
    assert _callers.call_stream(c, 55, 1) == 55  # stream= wins
    t = c.result(_Exported(np.float32))
    assert isinstance(t, torch.Tensor) and calls == [("from_dlpack", (2, 32))]
    calls.clear()
    c.result_bfloat16(_Exported(np.uint16))
    assert calls == [("from_dlpack", (4, 16))]  # bfloat16 named in the capsule: no view needed
    assert c.result(None) is None


def test_body_sees_views_and_knows_the_callers_arrays(monkeypatch):
    # the general path's body gets kernel views (bfloat16 as uint16 bits, dtype="bfloat16"
    # said), and the hot paths key on what the caller passed: its tensors and its dtype
    torch, _ = _stand_in_torch(monkeypatch)
    monkeypatch.setattr(_callers, "_is_gpu", lambda a: True)
    monkeypatch.setattr("nqdq.gpu.runtime.interop.kernel_view", lambda a, name: ("view", name))
    seen = {}

    @_callers.in_caller_library("x", "w")
    def body(x, w, dtype=None):
        seen.update(x=x, w=w, dtype=dtype, ox=_callers.original(x), ow=_callers.original(w),
                    odt=_callers.original_dtype(dtype), none=_callers.original(None))  # fmt: skip

    x, w = torch.Tensor(None, "torch.bfloat16"), torch.Tensor(None, "torch.float32")
    body(x, w)
    assert seen["x"] == ("view", "x") and seen["dtype"] == "bfloat16"
    assert seen["ox"] is x and seen["ow"] is w and seen["odt"] is None and seen["none"] is None
    body(x, w, dtype="bfloat16")
    assert seen["odt"] == "bfloat16"
    # outside a body, and after one: the arguments as they are
    v = ("view", "x")
    assert _callers.original(v) is v and _callers.original_dtype("float16") == "float16"


def test_torch_without_raw_stream_uses_public_api(monkeypatch):
    torch, _ = _stand_in_torch(monkeypatch, raw_stream=False)
    assert _callers.caller_of(torch.Tensor(None)).stream(0) == 2000


def test_other_arrays_keep_the_default_caller(monkeypatch):
    monkeypatch.setattr(_callers, "_CALLERS", {})
    c = _callers.caller_of(np.zeros(3))
    assert c.name == "cupy" and c.stream(0) is None and c.result("a") == "a"


def test_jax_arrays_route_to_jax(monkeypatch):
    jax = types.ModuleType("jax")
    dl = types.ModuleType("jax.dlpack")
    dl.from_dlpack = lambda a: ("jax", _read_capsule(a.__dlpack__(stream=5))[2:4])
    for name, mod in (("jax", jax), ("jax.dlpack", dl)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(_callers, "_CALLERS", {})
    ArrayImpl = type("ArrayImpl", (), {"__module__": "jaxlib._jax"})
    c = _callers.caller_of(ArrayImpl())
    assert c.name == "jax" and c.stream(0) is None  # CuPy's current stream
    monkeypatch.setattr("nqdq.gpu.runtime.interop._order_after", lambda consumer, producer: None)
    assert c.result(_Exported(np.uint8)) == ("jax", (1, 8))
    assert c.result_bfloat16(_Exported(np.uint16)) == ("jax", (4, 16))


def test_stream_override_reaches_launches():
    assert launch._stream_handle(None) == 0  # no CuPy in this process: the legacy stream
    with _callers.running_on(42):
        assert launch._stream_handle(None) == 42
        with _callers.running_on(43):
            assert launch._stream_handle(None) == 43
        assert launch._stream_handle(None) == 42
    assert launch._stream_handle(None) == 0


def test_stream_with_host_arrays_is_an_error():
    x = np.random.default_rng(5).standard_normal((4, 64)).astype(np.float32)
    with pytest.raises(ValueError, match="stream"):
        nqdq.quantize(x, "fp8_row", stream=0)
    q = nqdq.quantize(x, "fp8_row")
    with pytest.raises(ValueError, match="stream"):
        nqdq.dequantize(q, stream=0)


def test_a_stream_of_another_gpu_is_an_error():
    c = _callers.Caller()
    torch_stream = types.SimpleNamespace(cuda_stream=77, device=types.SimpleNamespace(index=1))
    with pytest.raises(ValueError, match="stream is a stream of GPU 1"):
        _callers.call_stream(c, torch_stream, 0)
    cupy_stream = types.SimpleNamespace(ptr=78, device_id=0)
    assert _callers.call_stream(c, cupy_stream, 0) == 78
    assert _callers.call_stream(c, 0, 3) == 0  # the legacy default stream serves every GPU


def test_a_host_array_of_another_library_is_an_error():
    class HostTensor:  # a CPU tensor: DLPack on kDLCPU
        __module__ = "torch"

        def __dlpack__(self, stream=None):
            raise AssertionError("not read")

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(TypeError, match="torch array in host memory.*np.asarray"):
        nqdq.quantize(HostTensor(), "fp8_row")


def test_nbytes_reads_shapes_not_data():
    """QuantizedTensor.nbytes of arrays that cannot be read on the host (GPU arrays): shapes
    and item sizes only."""
    x = np.random.default_rng(31).standard_normal((4, 256)).astype(np.float32)
    q = nqdq.quantize(x, "int8_asym")
    want = q.nbytes

    class Opaque:
        def __init__(self, a):
            self.shape, self.dtype = a.shape, a.dtype

        def __array__(self, *args, **kwargs):
            raise AssertionError("read on the host")

    import dataclasses

    q2 = dataclasses.replace(q, codes=Opaque(q.codes), scales=Opaque(q.scales), zero_points=Opaque(q.zero_points))
    assert q2.nbytes == want == q.codes.nbytes + q.scales.nbytes + q.zero_points.nbytes
