"""The caller's array library on the GPU path: the stream a call runs on, and the library
its results come back in.

nqdq imports neither PyTorch nor JAX. A library is reached through the module of the array
the caller passed (``sys.modules``), once an array of its type arrives:

==========  =====================================  ==========================================
caller      stream a call runs on (``stream=None``)  results
==========  =====================================  ==========================================
CuPy        CuPy's current stream                  CuPy arrays
PyTorch     PyTorch's current stream of the        ``torch.Tensor`` (codes uint8 / int8,
            tensor's device                        scales float32, bfloat16 as torch.bfloat16)
JAX         CuPy's current stream (JAX has no      ``jax.Array`` through DLPack (bfloat16 as
            current stream: its arrays are ready   jnp.bfloat16); the input is exported with
            when exported through DLPack)          ``__dlpack__(stream=...)``, so JAX orders it
Numba, any  CuPy's current stream (the legacy      CuPy arrays where CuPy is installed, Numba
CAI array   default stream without CuPy)           device arrays otherwise
==========  =====================================  ==========================================

``stream=`` given to an entry point (an integer handle, a CuPy stream, a PyTorch stream, or
any object with ``__cuda_stream__``) overrides the default for that call.
"""

from __future__ import annotations

import contextlib
import sys
import threading

import numpy as np

from . import launch

_NULL = contextlib.nullcontext()


def stream_handle(stream) -> int:
    """The ``CUstream`` handle of ``stream``: an int, a CuPy stream (``.ptr``), a PyTorch
    stream (``.cuda_stream``) or an object with ``__cuda_stream__``; TypeError naming
    ``stream`` otherwise."""
    if isinstance(stream, bool):
        raise TypeError("stream must be a CUDA stream (an int handle, a CuPy or PyTorch stream), got a bool")
    if isinstance(stream, (int, np.integer)):
        if int(stream) < 0:
            raise ValueError(f"stream={int(stream)} is not a stream handle")
        return int(stream)
    try:
        return launch._stream_handle(stream)
    except TypeError:
        raise TypeError(f"stream must be a CUDA stream (an int handle, a CuPy or PyTorch stream), "
                        f"got {type(stream).__name__}") from None


class Caller:
    """CuPy, Numba and ``__cuda_array_interface__`` callers: CuPy's current stream, results
    as the kernels' allocator made them (CuPy where installed)."""

    name = "cupy"

    def stream(self, device: int) -> int | None:
        """This library's current stream on ``device``; None: CuPy's (launch's default)."""
        return None

    def result(self, a):
        return a

    def result_bfloat16(self, bits):
        """``bits`` (uint16 holding bfloat16) as this library's bfloat16 where it has one."""
        return bits


class TorchCaller(Caller):
    """PyTorch tensors: PyTorch's current stream, results as tensors (zero-copy, DLPack)."""

    name = "torch"

    def __init__(self, torch):
        self.torch = torch
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton's launcher reads
        self._raw_stream = raw if raw is not None else self._public_stream
        self.tensor = torch.Tensor
        self.dtypes = {
            np.dtype(np.uint8): torch.uint8, np.dtype(np.int8): torch.int8, np.dtype(np.float32): torch.float32,
            np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64, np.dtype(np.float16): torch.float16,
        }  # fmt: skip

    def _public_stream(self, device):
        return self.torch.cuda.current_stream(device).cuda_stream

    def stream(self, device):
        return self._raw_stream(device)

    def result(self, a):
        if a is None or isinstance(a, self.tensor):
            return a
        return self.torch.from_dlpack(_export(a))

    def result_bfloat16(self, bits):
        return self.torch.from_dlpack(_export(bits, as_bfloat16=True))


class JaxCaller(Caller):
    """JAX arrays: results imported by ``jax.dlpack.from_dlpack`` (zero-copy; JAX's stream
    waits for the call's through the exporter's ``__dlpack__(stream=...)``)."""

    name = "jax"

    def __init__(self, jax):
        import importlib

        self.dlpack = importlib.import_module("jax.dlpack")  # (part of the loaded jax package)

    def result(self, a):
        if a is None:
            return None
        return self.dlpack.from_dlpack(_export(a))

    def result_bfloat16(self, bits):
        return self.dlpack.from_dlpack(_export(bits, as_bfloat16=True))

    def hold(self, inputs, handle: int):
        """Keep ``inputs`` (JAX arrays, their DLPack owners) alive until the work queued on
        stream ``handle`` so far has run: JAX frees a buffer in the order of its own streams,
        not of the stream nqdq read it on."""
        _HELD.hold(inputs, handle)


class _HeldUntilDone:
    """Objects kept alive until an event recorded after them on a stream has completed
    (``cuEventRecord`` / ``cuEventQuery``); the completed ones are released at the next call."""

    def __init__(self):
        self._held = []
        self._lock = threading.Lock()

    def hold(self, objs, handle: int):
        from cuda.bindings import driver

        err, ev = driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        if err != driver.CUresult.CUDA_SUCCESS or driver.cuEventRecord(ev, handle)[0] != driver.CUresult.CUDA_SUCCESS:
            driver.cuStreamSynchronize(handle)  # (no event: wait here rather than free what is read)
            return
        with self._lock:
            keep = []
            for e, o in self._held:
                if driver.cuEventQuery(e)[0] == driver.CUresult.CUDA_SUCCESS:
                    driver.cuEventDestroy(e)
                else:
                    keep.append((e, o))
            keep.append((ev, objs))
            self._held = keep


_HELD = _HeldUntilDone()


def _export(a, as_bfloat16=False):
    """``a`` (the kernels' CuPy or Numba array) offered through DLPack, written on this
    call's stream (``runtime.interop.DLPackExport``: bfloat16 named as such; no CuPy needed)."""
    from .interop import DLPackExport

    return DLPackExport(a, launch._stream_handle(None), as_bfloat16=as_bfloat16)


_CALLERS: dict = {}
_DEFAULT = Caller()
_LOCK = threading.Lock()


def caller_of(x) -> Caller:
    """The :class:`Caller` of array ``x``'s library (by its type; made once a type)."""
    t = type(x)
    c = _CALLERS.get(t)
    if c is not None:
        return c
    root = t.__module__.split(".")[0]
    mod = sys.modules.get(root)
    if root == "torch" and mod is not None and isinstance(x, mod.Tensor):
        c = TorchCaller(mod)
    elif root in ("jax", "jaxlib") and sys.modules.get("jax") is not None:
        c = JaxCaller(sys.modules["jax"])
    else:
        c = _DEFAULT
    with _LOCK:
        _CALLERS[t] = c
    return c


@contextlib.contextmanager
def running_on(handle: int):
    """Launches of this thread, and CuPy's allocations and current stream where CuPy is
    loaded, on stream ``handle`` for the body (the general path of a call with a caller's
    stream: the kernels' allocator and every launch follow it)."""
    cp = sys.modules.get("cupy")
    ctx = cp.cuda.ExternalStream(handle) if cp is not None and handle else _NULL
    prev = launch.stream_override(handle)
    try:
        with ctx:
            yield
    finally:
        launch.stream_override(prev)


def call_stream(caller: Caller, stream, device: int):
    """The stream handle a GPU call runs on: ``stream`` when given (ValueError where it
    belongs to another GPU than the call's arrays), else the caller's library's current
    stream on ``device`` (None: CuPy's, launch's default)."""
    if stream is None:
        return caller.stream(device)
    handle = stream_handle(stream)
    owner = stream_device(stream, handle)
    if owner is not None and owner != device:
        raise ValueError(f"stream is a stream of GPU {owner}, but the call's arrays are on GPU {device}")
    return handle


def stream_device(stream, handle: int):
    """The GPU of a stream object (PyTorch's ``.device``, CuPy's ``.device_id``) or handle
    (``cuStreamGetDevice``, CUDA 12.8+); None where unknown or for the default streams."""
    dev = getattr(stream, "device", None)
    index = getattr(dev, "index", None)  # PyTorch: torch.device("cuda", n)
    if isinstance(index, int):
        return index
    dev_id = getattr(stream, "device_id", None)  # CuPy
    if isinstance(dev_id, int):
        return dev_id
    if handle <= 2:  # the legacy and per-thread default streams: one handle on every GPU
        return None
    try:
        from cuda.bindings import driver

        err, dev = driver.cuStreamGetDevice(handle)
    except Exception:
        return None
    return int(dev) if err == driver.CUresult.CUDA_SUCCESS else None


def capturing(handle: int) -> bool:
    """Whether stream ``handle`` is capturing a CUDA graph (``cuStreamIsCapturing``); an
    error (the legacy stream queried while another stream captures) counts as capturing."""
    from .target import SIMULATOR

    if SIMULATOR:
        return False
    try:
        from cuda.bindings import driver

        err, status = driver.cuStreamIsCapturing(handle)
    except Exception:
        return True
    return err != driver.CUresult.CUDA_SUCCESS or int(status) != 0


def refuse_capture(what: str):
    """RuntimeError where this call's stream is capturing a CUDA graph: ``what`` reads or
    writes host memory per call, which a graph cannot replay."""
    if capturing(launch._stream_handle(None)):
        raise RuntimeError(f"{what}, so this call cannot be captured in a CUDA graph; run it outside the capture")


def in_caller_library(*names):
    """Decorator for an entry point's general path: where its first named argument is a
    PyTorch or JAX GPU array, the call runs on that library's current stream of the arrays'
    GPU, its named arguments of that library reach the body as the kernels' arrays (zero-copy
    views, ``_interop.kernel_view``), and its results (arrays, QuantizedTensors, tuples of
    them) come back in the caller's library: uint16 bits as bfloat16 where the first
    argument is bfloat16. CuPy, Numba and host arrays: the call as it is."""
    import functools
    import inspect

    def deco(fn):
        params = list(inspect.signature(fn).parameters)
        where = [(params.index(n), n) for n in names]
        dtype_at = params.index("dtype") if "dtype" in params else None

        @functools.wraps(fn)
        def call(*args, **kwargs):
            i0, n0 = where[0]
            x = args[i0] if i0 < len(args) else kwargs.get(n0)
            caller = caller_of(x) if x is not None else _DEFAULT
            if caller.name == "cupy" or not _is_gpu(x):
                return fn(*args, **kwargs)
            from .devices import current
            from .interop import kernel_view

            args = list(args)
            behind = {}  # id of a kernel view -> the caller's array (original())
            given = None  # (the dtype argument as passed,) where the body is told "bfloat16"
            for i, n in where:
                a = args[i] if i < len(args) else kwargs.get(n)
                if a is not None and type(a) is type(x):
                    v = kernel_view(a, n)
                    behind[id(v)] = a
                    if i < len(args):
                        args[i] = v
                    else:
                        kwargs[n] = v
            bf16 = str(getattr(x, "dtype", "")).endswith("bfloat16")
            if bf16 and dtype_at is not None:  # the views hold bfloat16 as uint16 bits: say so
                if dtype_at < len(args):
                    given = (args[dtype_at],)
                    args[dtype_at] = "bfloat16" if args[dtype_at] is None else args[dtype_at]
                else:
                    given = (kwargs.get("dtype"),)
                    kwargs["dtype"] = "bfloat16" if kwargs.get("dtype") is None else kwargs["dtype"]
            handle = caller.stream(current())
            prev = getattr(_BEHIND, "views", None), getattr(_BEHIND, "dtype", None)
            _BEHIND.views, _BEHIND.dtype = behind, given
            try:
                with running_on(handle) if handle is not None else _NULL:
                    out = fn(*args, **kwargs)
                    return _in_library(caller, out, bf16)
            finally:
                _BEHIND.views, _BEHIND.dtype = prev

        return call

    return deco


_BEHIND = threading.local()  # .views, .dtype: what in_caller_library changed for the body running on this thread


def original(a):
    """The caller's own array (a PyTorch tensor, a JAX array) behind ``a``, a kernel view
    that :func:`in_caller_library` made for the body running now; ``a`` itself otherwise. The
    hot paths key and run on the caller's arrays, not on the views."""
    views = getattr(_BEHIND, "views", None)
    return a if views is None or a is None else views.get(id(a), a)


def original_dtype(dtype):
    """The ``dtype`` argument the caller passed, where :func:`in_caller_library` said
    "bfloat16" for the body (a bfloat16 tensor's views are uint16 bits); ``dtype`` otherwise.
    The hot paths' keys hold what the caller passes."""
    given = getattr(_BEHIND, "dtype", None)
    return dtype if given is None else given[0]


def _is_gpu(x) -> bool:
    from ..._arrays import is_device_array

    return is_device_array(x)


def _in_library(caller, out, bf16: bool):
    from ...quantized import ARRAY_FIELDS, QuantizedTensor

    if out is None:
        return None
    if isinstance(out, tuple):
        return tuple(_in_library(caller, o, bf16) for o in out)
    if isinstance(out, QuantizedTensor):
        import dataclasses

        return dataclasses.replace(out, **{f: caller.result(getattr(out, f)) for f in ARRAY_FIELDS})
    if bf16 and getattr(out, "dtype", None) == np.uint16:
        return caller.result_bfloat16(out)
    return caller.result(out)
