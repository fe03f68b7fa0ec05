"""Arrays in and out of the kernels, without importing any array library but CuPy (and
that only when it is installed and the input is on a GPU).

Inputs accepted on the device path:

* NumPy arrays: under the CUDA simulator they are used as they are; on a real GPU they
  are copied to the device and the results copied back (``device="cuda"``);
* CuPy arrays, and any object with ``__cuda_array_interface__`` (Numba device arrays,
  PyTorch/JAX CUDA tensors that export it): used in place, no copy;
* any object with ``__dlpack__`` on a CUDA device (JAX, PyTorch, ...), including bfloat16,
  which no CUDA-array-interface exporter can describe: the DLPack capsule is read here with
  ctypes and the data used in place.

bfloat16 / float16 may also come as a uint16 array of their bits plus ``dtype=`` (CuPy has
no bfloat16 dtype). Results go back in the input's library: CuPy for CuPy (and for
``__cuda_array_interface__`` / DLPack inputs when CuPy is installed, Numba device arrays
otherwise), NumPy for NumPy.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import numpy as np

from ..device.codec import KIND_BF16, KIND_F16, KIND_F32
from .target import SIMULATOR

_KINDS = {"float32": KIND_F32, "bfloat16": KIND_BF16, "float16": KIND_F16}


def _cupy():
    try:
        import cupy

        return cupy
    except Exception:  # not installed, or no usable CUDA
        return None


def is_cupy(a) -> bool:
    return type(a).__module__.split(".")[0] == "cupy"


def lib_of(a) -> str:
    """The array library of a kernel argument or result: "numpy", "cupy" or "numba"."""
    if isinstance(a, np.ndarray):
        return "numpy"
    return "cupy" if is_cupy(a) else "numba"


def device_address(a) -> int:
    """The device address of a kernel argument (CuPy, Numba: ``__cuda_array_interface__``), for
    alignment checks; 0 for NumPy arrays and under the simulator, whose twins need none."""
    if SIMULATOR or isinstance(a, np.ndarray):
        return 0
    return int(a.__cuda_array_interface__["data"][0])


def has_cuda_array_interface(a) -> bool:
    """``hasattr`` lets anything but AttributeError through; PyTorch raises TypeError for a
    bfloat16 tensor's ``__cuda_array_interface__`` (such tensors come in through DLPack)."""
    try:
        a.__cuda_array_interface__
        return True
    except Exception:
        return False


@dataclass
class DeviceInput:
    """The input as the kernels read it: a 1-D array (float32, or uint16 bits), its kind,
    logical shape, dtype name and the library results go back to."""

    arr: object
    kind: int
    shape: tuple
    dtype: str
    lib: str  # "numpy" (results on the host), "cupy" or "numba"
    keepalive: object = None


def _dtype_name(dt, argname, explicit):
    """Name of the floating dtype the elements hold."""
    dt = np.dtype(dt) if not isinstance(dt, str) else dt
    name = str(dt)
    if explicit is not None:
        want = str(explicit) if not isinstance(explicit, type) else np.dtype(explicit).name
        want = {"bf16": "bfloat16"}.get(want, want)
        if want not in _KINDS:
            raise TypeError(f"dtype={explicit!r} is not one of float32, float16, bfloat16")
        if want == "float32":
            if name != "float32":
                raise TypeError(f"dtype='float32' needs {argname} of dtype float32, got {name}")
        elif name not in ("uint16", "int16", want):
            raise TypeError(f"dtype={want!r} needs {argname} holding its bits as uint16, got dtype {name}")
        return want
    if name in _KINDS:
        return name
    if name in ("uint16", "int16"):
        raise TypeError(
            f"{argname} has dtype {name}; pass dtype='bfloat16' (or 'float16') to read it as the bits of those"
        )
    raise TypeError(f"{argname} has dtype {name}; expected float32, float16 or bfloat16")


def device_input(x, argname: str = "x", dtype=None) -> DeviceInput:
    """Wrap ``x`` for the kernels (no copy where it is already on the device)."""
    if isinstance(x, np.ndarray):
        if not x.dtype.isnative:  # big-endian input: the kernels read native bits
            x = x.astype(x.dtype.newbyteorder("="))
        name = _dtype_name(x.dtype, argname, dtype)
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        flat = x.reshape(-1)
        flat = flat.view(np.uint16) if name != "float32" else flat.view(np.float32)
        if SIMULATOR:
            return DeviceInput(flat, _KINDS[name], tuple(x.shape), name, "numpy")
        from .backend import cuda

        return DeviceInput(cuda.to_device(flat), _KINDS[name], tuple(x.shape), name, "numpy")
    if SIMULATOR:
        raise TypeError(f"{argname} is a {type(x).__name__}; under the CUDA simulator only NumPy arrays run")
    if is_cupy(x) and hasattr(x, "_c_contiguous"):  # CuPy stays CuPy: FastKernel takes it as it is
        name = _dtype_name(x.dtype, argname, dtype)
        if not x._c_contiguous:
            raise ValueError(f"{argname} must be C-contiguous on the device (make a contiguous copy first)")
        flat = x.reshape(x.size) if x.ndim != 1 else x
        if name != "float32" and flat.dtype != np.uint16:
            flat = flat.view(np.uint16)
        return DeviceInput(flat, _KINDS[name], tuple(x.shape), name, "cupy")
    from .backend import cuda

    keep = None
    lib = "cupy" if (is_cupy(x) or _cupy() is not None) else "numba"
    void16 = has_cuda_array_interface(x) and x.__cuda_array_interface__.get("typestr", "")[1:] == "V2"
    if has_cuda_array_interface(x) and not (void16 and hasattr(x, "__dlpack__")):
        # (PyTorch exports bfloat16 as an opaque 2-byte "V2" type: DLPack names it, so use that)
        dev = cuda.as_cuda_array(x, sync=False)  # we launch on CuPy's current stream: no host sync
        if void16:
            dev = dev.view(np.uint16)
    elif hasattr(x, "__dlpack__"):
        dev, keep = from_dlpack(x, argname)
    else:
        raise TypeError(f"{argname} must be a NumPy or GPU array, got {type(x).__name__}")
    if dlpack_is_bf16(keep):
        if dtype not in (None, "bfloat16", "bf16"):
            raise TypeError(f"{argname} is a bfloat16 DLPack tensor but dtype={dtype!r}")
        name = "bfloat16"
    else:
        name = _dtype_name(dev.dtype, argname, dtype)
    if not dev.is_c_contiguous():
        raise ValueError(f"{argname} must be C-contiguous on the device (make a contiguous copy first)")
    flat = dev.reshape(dev.size) if dev.ndim != 1 else dev
    if name != "float32" and flat.dtype != np.uint16:
        flat = flat.view(np.uint16)
    return DeviceInput(flat, _KINDS[name], tuple(dev.shape), name, lib, keep)


# ----------------------------------------------------------------------------- DLPack
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.c_void_p)),
]

_DL_TYPES = {(2, 32): "<f4", (2, 16): "<f2", (4, 16): "<u2", (1, 16): "<u2", (0, 16): "<i2"}  # bf16 -> bits
# ... and what a QuantizedTensor's arrays hold (codes, scales, zero points, means): kernel_view
_DL_ANY_TYPES = {**_DL_TYPES, (1, 8): "|u1", (0, 8): "|i1", (0, 32): "<i4", (1, 32): "<u4", (0, 64): "<i8"}


class _DLPackOwner:
    """Owns a consumed DLPack capsule: calls the producer's deleter when collected."""

    def __init__(self, managed_ptr, source):
        self._ptr = managed_ptr
        self._source = source  # keep the producer alive too

    def __del__(self):
        try:
            m = _DLManagedTensor.from_address(self._ptr)
            if m.deleter:
                m.deleter(self._ptr)
        except Exception:
            pass


def from_dlpack(x, argname="x", any_dtype=False):
    """A Numba device array over a CUDA DLPack tensor (bfloat16 arrives as uint16 bits)."""
    from .backend import cuda

    get_ptr = ctypes.pythonapi.PyCapsule_GetPointer
    get_ptr.restype = ctypes.c_void_p
    get_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]
    rename = ctypes.pythonapi.PyCapsule_SetName
    rename.argtypes = [ctypes.py_object, ctypes.c_char_p]
    # the stream this call launches on, so that the producer orders its pending work before
    # ours (DLPack: 1 names the legacy default stream, whose handle is 0)
    from .launch import _stream_handle

    st = _stream_handle(None) if not SIMULATOR else 0
    try:
        capsule = x.__dlpack__(stream=st or 1)
    except TypeError:
        capsule = x.__dlpack__()
    ptr = get_ptr(capsule, b"dltensor")
    m = _DLManagedTensor.from_address(ptr)
    t = m.dl_tensor
    if t.device.device_type not in (2, 3, 13):
        raise TypeError(f"{argname} is a DLPack tensor on device type {t.device.device_type}, not CUDA")
    key = (t.dtype.code, t.dtype.bits)
    types = _DL_ANY_TYPES if any_dtype else _DL_TYPES
    if key not in types or t.dtype.lanes != 1:
        raise TypeError(f"{argname} has DLPack dtype code {t.dtype.code}/{t.dtype.bits} bits; expected float32, float16 or bfloat16")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    itemsize = t.dtype.bits // 8
    if t.strides:
        strides = tuple(t.strides[i] * itemsize for i in range(t.ndim))
    else:
        strides = None
    rename(capsule, b"used_dltensor")
    owner = _DLPackOwner(ptr, x)
    desc = {
        "shape": shape,
        "strides": strides,
        "typestr": types[key],
        "data": (t.data + t.byte_offset, False),
        "version": 3,
    }
    arr = cuda.from_cuda_array_interface(desc, owner=owner, sync=False)
    return arr, (owner, t.dtype.code == 4)


_get_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_get_capsule_ptr.restype = ctypes.c_void_p
_get_capsule_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]
_rename_capsule = ctypes.pythonapi.PyCapsule_SetName
_rename_capsule.argtypes = [ctypes.py_object, ctypes.c_char_p]


def dlpack_address(x, stream: int):
    """``(address, owner)`` of a CUDA DLPack tensor's first element, exported for ``stream``
    (the producer orders its pending writes before it); None where the tensor is not
    C-contiguous. ``owner`` returns the capsule to the producer when collected: keep it (and
    ``x``) alive until the work reading the address has run. For the hot paths: the caller
    checked the shape, dtype and device when it planned the call."""
    capsule = x.__dlpack__(stream=stream or 1)
    ptr = _get_capsule_ptr(capsule, b"dltensor")
    t = _DLManagedTensor.from_address(ptr).dl_tensor
    _rename_capsule(capsule, b"used_dltensor")
    owner = _DLPackOwner(ptr, x)
    if t.strides:
        acc = 1
        for i in range(t.ndim - 1, -1, -1):
            if t.shape[i] != 1 and t.strides[i] != acc:
                return None
            acc *= t.shape[i]
    return t.data + t.byte_offset, owner


def dlpack_is_bf16(keepalive) -> bool:
    return bool(keepalive and keepalive[1])


# ----------------------------------------------------------------------------- outputs
class Allocator:
    """Allocates outputs in one library and converts them for the kernels."""

    def __init__(self, lib: str):
        self.lib = lib
        self.cp = _cupy() if lib == "cupy" else None

    def empty(self, n, dtype):
        if SIMULATOR:
            return np.empty(n, dtype)
        if self.cp is not None:
            return self.cp.empty(n, dtype)
        from .backend import cuda

        return cuda.device_array(n, dtype)

    def kernel_arg(self, a):
        """What to pass to a kernel for array ``a``: the array itself (launches go through
        ``launch.FastKernel``, which takes CuPy arrays, Numba device arrays and any
        ``__cuda_array_interface__`` object as they are; NumPy arrays under the simulator)."""
        return a

    def to_lib(self, a, shape):
        """``a`` (flat) reshaped, in the result library (NumPy results are copied back)."""
        if a is None:
            return None
        if SIMULATOR:
            return a.reshape(shape)
        if self.lib == "numpy":
            host = a.get() if hasattr(a, "get") and not hasattr(a, "copy_to_host") else a.copy_to_host()
            return np.asarray(host).reshape(shape)
        return a.reshape(shape)

    def stream(self):
        """The stream kernels launch on: CuPy's current stream when CuPy is in use."""
        if SIMULATOR or self.cp is None:
            return 0
        from .backend import cuda

        ptr = self.cp.cuda.get_current_stream().ptr
        return cuda.external_stream(ptr) if ptr else 0


# ----------------------------------------------------------------------------- CuPy views
def _same_cupy_array(a, b) -> bool:
    return (
        type(a) is type(b)
        and a.shape == b.shape
        and a.strides == b.strides
        and a.dtype == b.dtype
        and a.size == b.size
        and a.data.ptr == b.data.ptr
        and a.data.mem is b.data.mem
        and a._c_contiguous == b._c_contiguous
        and a._f_contiguous == b._f_contiguous
        and a._index_32_bits == b._index_32_bits
        and a.base is None
        and b.base is None
    )


def cupy_array_new(cp, memptr):
    """A cheaper way to wrap CuPy memory in a new ``cupy.ndarray``, or None.

    ``cupy.ndarray(shape, dtype, memptr)`` costs about 2 us of host time (CuPy 14, H100 host):
    ``ndarray`` is a Python subclass whose ``__new__`` forwards ``*args, **kwargs`` to the
    Cython base and then calls its ``_init``, and ``type.__call__`` then calls a Python
    ``__init__`` that does nothing. Calling the base's ``__new__`` and ``_init`` directly does
    the same work without those two Python frames::

        a = new(cupy.ndarray)
        a._init(shape, dtype, memptr)   # == cupy.ndarray(shape, dtype, memptr)

    Returns ``new`` when this CuPy has that internal path and it builds arrays equal in every
    field (shape, strides, dtype, size, pointer, owner, contiguity flags, no base) to the
    constructor's, checked on ``memptr`` now (a 2-D uint8 and a 0-d float32 array); None
    otherwise, and callers keep using the constructor."""
    nd = cp.ndarray
    base = nd.__base__
    new = getattr(base, "__new__", None)
    if new is None or not hasattr(base, "_init") or new is object.__new__:
        return None
    try:
        for shape, dtype in (((2, 4), np.dtype(np.uint8)), ((), np.dtype(np.float32))):
            a = new(nd)
            a._init(shape, dtype, memptr)
            if not _same_cupy_array(a, nd(shape, dtype, memptr)):
                return None
    except Exception:  # a CuPy whose internals differ: the constructor it is
        return None
    return new


def kernel_view(a, argname="array"):
    """A GPU array of any library (PyTorch, JAX, Numba, ``__cuda_array_interface__``, CUDA
    DLPack) as an array the launchers take, zero-copy: CuPy where installed, else a Numba
    device array; bfloat16 as its uint16 bits."""
    if is_cupy(a) or isinstance(a, np.ndarray):
        return a
    from .backend import cuda

    void16 = has_cuda_array_interface(a) and a.__cuda_array_interface__.get("typestr", "")[1:] == "V2"
    if has_cuda_array_interface(a) and not void16:
        dev = cuda.as_cuda_array(a, sync=False)
    elif hasattr(a, "__dlpack__"):
        dev, _keep = from_dlpack(a, argname, any_dtype=True)
    else:
        raise TypeError(f"{argname} must be a GPU array, got {type(a).__name__}")
    cp = _cupy()
    return cp.asarray(dev) if cp is not None else dev


# ----------------------------------------------------------------------------- DLPack export
_DL_CODES = {"u": 1, "i": 0, "f": 2}
_EXPORTED: dict = {}  # address of a DLManagedTensor handed out -> (struct, shape, owner): freed by its deleter
_EXPORT_LOCK = threading.Lock()


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _export_deleter(ptr):
    with _EXPORT_LOCK:
        _EXPORTED.pop(ptr, None)


class DLPackExport:
    """A device array (CuPy, Numba, anything with ``__cuda_array_interface__``) offered
    through DLPack (``__dlpack__`` / ``__dlpack_device__``), optionally as another dtype of
    the same size: ``as_bfloat16`` exports uint16 bits as bfloat16 (DLPack code 4), which
    neither CuPy nor Numba can describe. The consumer's stream waits for the exporter's
    (``stream``, the one the data was written on) through an event, as the protocol asks."""

    def __init__(self, array, stream: int, *, as_bfloat16=False):
        cai = array.__cuda_array_interface__
        self._array = array
        self._stream = int(stream)
        self._ptr = int(cai["data"][0] or 0)
        self._shape = tuple(int(d) for d in cai["shape"])
        dt = np.dtype(cai["typestr"])
        from .launch import _c_strides

        if cai.get("strides") is not None and tuple(cai["strides"]) != _c_strides(self._shape, dt.itemsize):
            raise ValueError("DLPackExport takes C-contiguous arrays")
        self._code = 4 if as_bfloat16 else _DL_CODES[dt.kind]
        self._bits = dt.itemsize * 8
        from .devices import ordinal_of

        self._device = ordinal_of(array) or 0

    def __dlpack_device__(self):
        return (2, self._device)  # kDLCUDA

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if stream is not None and stream != -1:
            _order_after(int(stream), self._stream)
        n = len(self._shape)
        shape = (ctypes.c_int64 * max(n, 1))(*self._shape)
        m = _DLManagedTensor()
        t = m.dl_tensor
        t.data = self._ptr
        t.device.device_type, t.device.device_id = 2, self._device
        t.ndim = n
        t.dtype.code, t.dtype.bits, t.dtype.lanes = self._code, self._bits, 1
        t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = None  # C-contiguous (DLPack: NULL strides)
        t.byte_offset = 0
        m.deleter = _export_deleter
        addr = ctypes.addressof(m)
        with _EXPORT_LOCK:
            _EXPORTED[addr] = (m, shape, self._array)
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(addr, b"dltensor", None)


def _order_after(consumer: int, producer: int):
    """Make stream ``consumer`` (a DLPack stream number: 1 legacy, 2 per-thread, else a
    handle) wait for the work queued so far on stream handle ``producer``."""
    consumer = {1: 0}.get(consumer, consumer)
    if consumer == producer:
        return
    from cuda.bindings import driver

    err, ev = driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)
    if err != driver.CUresult.CUDA_SUCCESS:
        driver.cuStreamSynchronize(producer)
        return
    driver.cuEventRecord(ev, producer)
    driver.cuStreamWaitEvent(consumer, ev, 0)
    driver.cuEventDestroy(ev)  # (destroyed once the wait is queued: the driver keeps what it needs)
