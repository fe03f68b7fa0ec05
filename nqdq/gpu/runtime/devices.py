"""Which GPU a call runs on: the one its arrays live on.

A process may hold arrays on several GPUs (JAX's devices, PyTorch's ``cuda:N``, CuPy under
``cupy.cuda.Device(n)``). As PyTorch's device guard does, every public entry point runs a
GPU call with its arrays' device current (:func:`guard`; ``nqdq._arrays.on_gpu_of`` is the
decorator), so the kernels launch there, the outputs are allocated there and the call runs
on that device's current stream. What nqdq caches per GPU is keyed by :func:`current`:

* ``launch.FastKernel`` entries: a ``CUfunction`` belongs to one context, and shared-memory
  and cluster opt-ins are set per device;
* ``quantize.get_plan`` plans and their CuPy runners (scratch arrays, SM counts, entries);
  ``nqdq.gpu.fused.moe.moe_plan``; the hot paths' remembered calls (``api._FAST``, ``nqdq.fused._moe._MOE_FAST``);
* ``quantize.grid.StreamWorkspaces``: the legacy and per-thread default streams have one handle on
  every device.

The GPUs of one process are taken to be of one architecture: kernels built for the first
one's compute capability choices (``ptx.convert.fp8_cvt_available``) serve all of them.
"""

from __future__ import annotations

import contextlib
import sys

_NULL = contextlib.nullcontext()
_get_device = None  # () -> the current device's ordinal, once known to be cheap (CuPy's, or 0 in the simulator)


def current() -> int:
    """The ordinal of the current CUDA device (the current context's; 0 under the simulator
    and where no context is current yet: Numba then makes device 0's)."""
    g = _get_device
    return g() if g is not None else _current_slow()


def _current_slow() -> int:
    global _get_device
    from .target import SIMULATOR

    if SIMULATOR:
        _get_device = _zero
        return 0
    cp = sys.modules.get("cupy")
    if cp is not None:  # cudaGetDevice: the current context's device (driver and runtime agree)
        _get_device = cp.cuda.runtime.getDevice
        return _get_device()
    try:
        from cuda.bindings import driver

        err, dev = driver.cuCtxGetDevice()
    except Exception:  # no driver (compile-only tools such as the PTX audit)
        return 0
    return int(dev) if err == driver.CUresult.CUDA_SUCCESS else 0


def _zero() -> int:
    return 0


def ordinal_of(a):
    """The ordinal of the GPU holding array ``a`` (CuPy, ``__cuda_array_interface__``, CUDA
    DLPack), or None (a host array, pinned host memory, an empty array with no address,
    the simulator)."""
    from .target import SIMULATOR

    if SIMULATOR or a is None or type(a).__module__ == "numpy":
        return None
    dev = getattr(getattr(a, "data", None), "device_id", None)  # CuPy's MemoryPointer
    if type(dev) is int:
        return dev
    try:
        cai = a.__cuda_array_interface__
    except Exception:  # PyTorch's bfloat16 raises here: its DLPack device below
        cai = None
    if cai is not None:
        ptr = int(cai["data"][0] or 0)
        return _pointer_device(ptr) if ptr else None
    dl = getattr(a, "__dlpack_device__", None)
    if dl is not None:
        kind, ordinal = dl()
        if int(kind) in (2, 13):  # kDLCUDA, kDLCUDAManaged (kDLCUDAHost: pinned host memory, any device)
            return int(ordinal)
    return None


_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9


def _pointer_device(ptr: int):
    """The ordinal of the device whose memory holds address ``ptr``, or None if unknown:
    CuPy's ``cudaPointerGetAttributes`` where CuPy is loaded, else libcuda's
    ``cuPointerGetAttribute`` by ctypes. Not cuda.bindings': its DEVICE_ORDINAL is 0 whatever
    the device (NVIDIA/cuda-python#2928; seen on two H200s of one host)."""
    cp = sys.modules.get("cupy")
    try:
        if cp is not None:
            return int(cp.cuda.runtime.pointerGetAttributes(ptr).device)
        import ctypes

        dev = ctypes.c_int(-1)
        fn = ctypes.CDLL("libcuda.so.1").cuPointerGetAttribute
        err = fn(ctypes.byref(dev), _CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ctypes.c_uint64(ptr))
    except Exception:
        return None
    return dev.value if err == 0 and dev.value >= 0 else None


def use(dev):
    """A context manager making GPU ``dev`` current for its body (CuPy's ``Device`` where
    CuPy is loaded, so its allocator and current stream follow; else Numba's ``gpus[dev]``,
    which pushes the device's primary context); a no-op where ``dev`` is None or current."""
    if dev is None or dev == current():
        return _NULL
    cp = sys.modules.get("cupy")
    if cp is not None:
        return cp.cuda.Device(dev)
    from .backend import cuda

    return cuda.gpus[dev]


def guard(*named):
    """``use`` the one GPU of the ``(name, array)`` pairs' device arrays; ValueError naming two
    of them when they are on different GPUs (nqdq runs a call on one GPU and copies nothing
    between GPUs)."""
    first = None
    for name, a in named:
        dev = ordinal_of(a)
        if dev is None:
            continue
        if first is None:
            first = (name, dev)
        elif dev != first[1]:
            raise ValueError(f"{first[0]} is on GPU {first[1]} and {name} on GPU {dev}: a call runs on one GPU, "
                             "so copy its arrays to one device first")  # fmt: skip
    return _NULL if first is None else use(first[1])
