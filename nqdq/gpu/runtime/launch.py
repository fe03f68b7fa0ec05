"""Low-overhead launches of compiled Numba CUDA kernels, capturable in CUDA graphs.

Numba's ``kernel[grid, block, stream](*args)`` types every argument, resolves the overload
and marshals each array through its own device-array wrapper on every call: about 120 us
of host time per launch with CuPy arguments (H100, numba-cuda 0.30). A decode step that
quantizes a 64 x 7168 activation runs for a few microseconds on the device, so that host
time *is* the cost. :class:`FastKernel` does the same launch in about 7 us, of which the
driver call itself is about 4 (docs/design/launch-path.md):

* compile once per argument signature (``dispatcher.compile(sig)``, Numba's own compiled
  module: same cubin, same linking, same module setup), and launch the current context's
  ``CUfunction`` of Numba's ``CUkernel`` (see :func:`_function_handle`);
* per call, build a small cache key from the current device (an entry's ``CUfunction``
  belongs to that device's context: ``_devices``) and the arguments (dtype, ndim, layout of
  arrays; Python type of scalars), look the compiled entry up in an LRU, pack the arguments into a
  thread-local parameter buffer with one precompiled ``struct.Struct.pack_into`` and call
  ``cuLaunchKernel`` (CuPy's ``driver.launchKernel`` when CuPy is loaded, else
  ``cuda.bindings``') with a fixed ``void*[]`` pointing into it;
* for repeated calls with CuPy arrays, a function generated for the last key does the
  same in one step: inline checks that the arguments still have that key, then pack and
  launch (it declines, and the general path runs, when they do not).

Numba's kernel ABI, which the packer follows (``numba.cuda.dispatcher._Kernel._prepare_args``;
checked against the ``.entry`` parameter list of the kernel's PTX when an entry is built):
an array argument of ``ndim`` dimensions expands to ``meminfo (u64, 0), parent (u64, 0),
nitems (i64), itemsize (i64), data (u64), shape[ndim] (i64), strides[ndim] (i64, bytes)``;
an integer to its own width, float32/float64 to ``f32``/``f64``, float16 to its 16 bits,
bool to one byte, complex to two floats. Each parameter sits at an offset aligned to its
size, which is what ``struct``'s native (``@``) mode does.

``sequence.compile_sequence`` goes one step further for a fixed sequence of launches whose
arrays have fixed shapes (nqdq.quantize's plans): one generated function packs each
kernel's parameters with every shape and constant baked in, only the addresses given per
call, and launches them in order (about 8 us for a whole single-kernel ``nqdq.quantize``
call on an H100 host, allocation and result arrays included; docs/design/launch-path.md,
"Where the time goes").

The launch only calls ``cuLaunchKernel`` on the stream it is given, so it can be captured
in a CUDA graph (``stream.begin_capture()`` ... ``end_capture()`` in CuPy). Compile before
capturing: the first launch of a signature loads a module, which must not happen inside
a capture.

Under ``NUMBA_ENABLE_CUDASIM=1`` (and for kernels the fast path does not cover: debug or
cooperative kernels, launch-config-sensitive kernels, record/tuple arguments), every
launch goes through Numba's own ``kernel[grid, block, stream, shared_mem](*args)``, so the
simulator runs the same kernels with the same results. ``NQDQ_FAST_LAUNCH=0`` forces that
path everywhere.

Example (``x``, ``out`` CuPy arrays)::

    @cuda.jit
    def scale_rows(x, out, f):
        i, j = cuda.grid(2)
        if i < x.shape[0] and j < x.shape[1]:
            out[i, j] = x[i, j] * f

    k = fast_kernel(scale_rows)          # one FastKernel per dispatcher
    k[(4, 64), (16, 16)](x, out, 2.0)    # Numba's launch syntax, ~7 us of host time
    k.launch((4, 64), (16, 16), (x, out, 2.0), stream=s)

The pieces around it: ``abi`` (the parameter layout), ``packers`` (the packing and fast-path
functions generated per signature, and why they are generated), ``launch_ex``
(cuLaunchKernelEx's configuration) and ``sequence`` (``compile_sequence``, ``Ptr``, ``Var``).

Limits: arguments must be device arrays (CuPy, Numba device arrays, anything with
``__cuda_array_interface__``) or scalars: unlike Numba, host NumPy arrays are refused, not
copied. One device: the compiled entry is bound to the device current when it was built.
"""

from __future__ import annotations

import collections
import ctypes
import os
import struct
import sys
import threading
import weakref

from .abi import (
    _arg_codes, _c_strides, _cai_layout, _fits, _numba_type, _param_offsets, param_format, ptx_param_sizes,
)
from .devices import current as _current_device
from .launch_ex import _dim3, _ex_config
from .packers import make_fast_launch, make_packer

__all__ = [
    "FastKernel", "PreparedLaunch", "fast_kernel", "simulated", "param_format", "ptx_param_sizes",
]


def simulated() -> bool:
    """True when Numba runs kernels in its CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``)."""
    try:
        from numba.cuda.core import config
    except ImportError:  # older numba-cuda
        from numba import config
    return bool(config.ENABLE_CUDASIM)


def _fast_path_allowed() -> bool:
    return os.environ.get("NQDQ_FAST_LAUNCH", "1") != "0" and not simulated()


# ---------------------------------------------------------------------------------------
# Argument keys: cheap per call, and the Numba types they stand for


# An array argument's key is the tuple (dtype.char, ndim, layout); a scalar's is its type.

# CuPy fast paths, set once cupy is seen in sys.modules (nqdq never imports it itself)
_cupy_ndarray = None  # the array type: keys and fields from its Cython attributes
_cupy_current_stream = None  # cupy.cuda.get_current_stream
_cupy_launch = None  # cupy.cuda.driver.launchKernel: ~1 us cheaper per call than cuda.bindings'


def _cupy_type():
    global _cupy_ndarray, _cupy_current_stream, _cupy_launch
    if _cupy_ndarray is None:
        cp = sys.modules.get("cupy")
        if cp is not None and hasattr(cp.ndarray, "_c_contiguous") and hasattr(cp.ndarray, "_f_contiguous"):
            _cupy_current_stream = cp.cuda.get_current_stream
            try:
                from cupy.cuda import driver as cupy_driver

                _cupy_launch = cupy_driver.launchKernel
            except (ImportError, AttributeError):
                _cupy_launch = None
            _cupy_ndarray = cp.ndarray
    return _cupy_ndarray


def _arg_key(a):
    t = type(a)
    if t is _cupy_ndarray:
        return (a.dtype.char, a.ndim, "C" if a._c_contiguous else "F" if a._f_contiguous else "A")
    if t in _SCALAR_TYPES:
        return t
    return _arg_key_slow(a, t)


def _arg_key_slow(a, t):
    import numpy as np

    if _cupy_ndarray is None and _cupy_type() is not None and t is _cupy_ndarray:
        return _arg_key(a)
    if isinstance(a, np.generic):
        _SCALAR_TYPES.add(t)
        return t
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        dt = np.dtype(cai["typestr"])
        shape = tuple(cai["shape"])
        return (dt.char, len(shape), _cai_layout(shape, cai.get("strides"), dt.itemsize))
    if hasattr(a, "__array_interface__") or hasattr(a, "__array__"):
        raise TypeError("a host (NumPy) array; FastKernel launches take device arrays (CuPy, Numba device arrays)")
    raise TypeError(f"an argument of type {t.__name__}, which FastKernel cannot pass")


_SCALAR_TYPES = {int, float, bool, complex}


# ---------------------------------------------------------------------------------------
# Per-call helpers


def _array_fields(a):
    """Numba's flattened array parameters, for a CuPy array or any CAI object."""
    if type(a) is _cupy_ndarray:
        return (0, 0, a.size, a.itemsize, a.data.ptr, *a.shape, *a.strides)
    import numpy as np

    cai = a.__cuda_array_interface__
    itemsize = np.dtype(cai["typestr"]).itemsize
    shape = tuple(cai["shape"])
    strides = cai.get("strides") or _c_strides(shape, itemsize)
    size = 1
    for d in shape:
        size *= d
    return (0, 0, size, itemsize, cai["data"][0], *shape, *strides)


_OVERRIDE = threading.local()  # .handle: this thread's launches' stream (stream_override)


def stream_override(handle):
    """Send this thread's launches with no stream of their own to ``handle`` (None: back to
    CuPy's current stream); returns the previous override. A call with a caller's stream
    (``_callers.running_on``) sets it for its body."""
    prev = getattr(_OVERRIDE, "handle", None)
    _OVERRIDE.handle = handle
    return prev


def _stream_handle(stream) -> int:
    if stream is None:
        h = getattr(_OVERRIDE, "handle", None)
        if h is not None:
            return h
        if _cupy_current_stream is not None:
            return _cupy_current_stream().ptr
        cp = sys.modules.get("cupy")
        return cp.cuda.get_current_stream().ptr if cp is not None else 0
    if type(stream) is int:
        return stream
    ptr = getattr(stream, "ptr", None)  # CuPy
    if ptr is not None:
        return int(ptr)
    ptr = getattr(stream, "cuda_stream", None)  # PyTorch
    if ptr is not None:
        return int(ptr)
    if hasattr(stream, "__cuda_stream__"):  # cuda.core, Numba
        return int(stream.__cuda_stream__()[1])
    h = getattr(stream, "handle", None)
    if h is not None:
        return int(getattr(h, "value", h) or 0)
    raise TypeError(f"stream: cannot get a CUDA stream handle from {type(stream).__name__}")


_cu_launch = None


def _driver():
    global _cu_launch
    if _cu_launch is None:
        from cuda.bindings import driver

        _cu_launch = driver.cuLaunchKernel
    return _cu_launch


def _raw_launch(handle, gx, gy, gz, bx, by, bz, shared_mem, stream, params, fk):
    """cuLaunchKernel through CuPy's driver module when CuPy is loaded, else cuda.bindings."""
    if _cupy_launch is not None:
        _cupy_launch(handle, gx, gy, gz, bx, by, bz, shared_mem, stream, params, 0)  # raises on error
        return
    err = _cu_launch(handle, gx, gy, gz, bx, by, bz, shared_mem, stream, params, 0)[0]
    if err:
        _raise_launch_error(err, fk._name())


# The driver's refusals of a launch that needs more of the device at once than it lends this
# process -- a cooperative grid larger than the blocks it holds together, a cluster no GPC
# can hold -- as under an MPS active-thread limit or in a green context with part of the SMs:
# CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, CUDA_ERROR_INVALID_CLUSTER_SIZE.
_REFUSALS = {720: "cooperative", 912: "cluster"}


class LaunchRefused(RuntimeError):
    """The driver refused a cooperative or cluster launch for want of room on the device
    (``kind``: "cooperative" or "cluster"); nothing ran. Callers that planned such a kernel
    may plan again without that kind (:func:`refuse`, :func:`ex_launch_ok`)."""

    def __init__(self, msg, kind):
        super().__init__(msg)
        self.kind = kind


# kinds of launch ("cooperative", "cluster") refused in this process: planned no more
_REFUSED: set = set()


def refuse(kind: str) -> bool:
    """Record that launches of ``kind`` are refused in this process (the planners then
    avoid them: :func:`ex_launch_ok`); True the first time, after a RuntimeWarning."""
    if kind in _REFUSED:
        return False
    import warnings

    _REFUSED.add(kind)
    warnings.warn(f"the driver refused a {kind} launch (this process has less of the GPU at once than the launch "
                  f"needs: an MPS thread limit or a partial green context?); nqdq plans no {kind} kernels from now on "
                  "and takes its other kernels, with the same results", RuntimeWarning, stacklevel=3)
    return True


def ex_launch_ok(kind: str) -> bool:
    """Whether a planner may choose a kernel that launches only by ``cuLaunchKernelEx``
    (``kind``: "cooperative" or "cluster"): not once the driver refused such a launch in
    this process (:func:`refuse`); else under the simulator (its own launch), or on a GPU
    where the fast path is on (``NQDQ_FAST_LAUNCH=0`` launches through Numba, which sets
    neither attribute)."""
    if kind in _REFUSED:
        return False
    return simulated() or _fast_path_allowed()


def launch_error(err, name, kind=None) -> RuntimeError:
    """The exception for the driver's error ``err`` (a CUresult) of a launch of kernel
    ``name``: :class:`LaunchRefused` where it is the driver's refusal of a launch of
    ``kind`` ("cooperative" / "cluster", see _REFUSALS), else RuntimeError."""
    try:
        from cuda.bindings import driver

        msg = driver.cuGetErrorString(err)[1]
        msg = msg.decode() if msg else ""
    except Exception:  # no driver to name it
        msg = ""
    text = f"cuLaunchKernel({name}) failed: {err!r}: {msg}"
    if kind is not None and _REFUSALS.get(int(err)) == kind:
        return LaunchRefused(text, kind)
    return RuntimeError(text)


def _raise_launch_error(err, name, kind=None):
    raise launch_error(err, name, kind)


# ---------------------------------------------------------------------------------------
# Compiled entries

def _function_handle(handle) -> int:
    """The handle to give ``cuLaunchKernel``. Numba (numba-cuda 0.30, cuda.core) loads
    kernels as a library: its handle is a context-independent ``CUkernel``, which the
    driver maps to the current context's ``CUfunction`` on every launch. The
    ``CUfunction`` itself (``cuKernelGetFunction``, once, in the context current now:
    an entry is bound to it anyway) is what CuPy, PyTorch and Triton launch. Other
    handles (already a ``CUfunction``), or a handle the driver refuses: unchanged."""
    try:
        from cuda.bindings import driver

        if type(handle).__name__ != "CUkernel":  # cuda.bindings' own, or one of another build
            return int(handle)
        err, fn = driver.cuKernelGetFunction(driver.CUkernel(int(handle)))
    except (ImportError, AttributeError, TypeError):
        return int(handle)
    return int(fn) if err == driver.CUresult.CUDA_SUCCESS else int(handle)


class _Entry:
    """One compiled signature: kernel handle, packer, and thread-local parameter buffers."""

    __slots__ = ("kernel", "argtypes", "handle", "kernel_handle", "name", "struct", "offsets", "pack", "_tls", "_fast",
                 "__weakref__")  # fmt: skip

    def __init__(self, kernel, argtypes, argnames):
        self.kernel = kernel
        self.argtypes = tuple(argtypes)
        kernel.bind()  # loads the module into the current context, runs its setup
        cufunc = kernel._codelibrary.get_cufunc()
        self.kernel_handle = int(cufunc.handle)
        self.handle = _function_handle(cufunc.handle)
        self.name = kernel.entry_name
        fmt = param_format(self.argtypes)
        self.struct = struct.Struct(fmt)
        self.offsets = _param_offsets(fmt)
        self.pack = _make_packer(self.argtypes, argnames, self.struct.pack_into)
        self._tls = threading.local()
        self._fast = {}

    def fast_launch(self, key):
        """The specialised launcher for ``key`` (cached; None where there is none)."""
        try:
            return self._fast[key]
        except KeyError:
            fl = self._fast[key] = _make_fast_launch(key, self)
            return fl

    def check_abi(self, cc):
        """Compare the packer's parameter sizes with the kernel's PTX ``.entry`` list."""
        ptx = self.kernel.inspect_asm(cc)
        want = ptx_param_sizes(ptx, self.name)
        have = [struct.calcsize("@" + c) for c in self.struct.format[1:]]
        if want != have:
            raise RuntimeError(
                f"{self.name}: parameter sizes {have} do not match the PTX entry's {want}; "
                "Numba's kernel ABI changed, use the plain Numba launch (NQDQ_FAST_LAUNCH=0)"
            )

    def new_buffer(self):
        buf = ctypes.create_string_buffer(max(self.struct.size, 1))
        base = ctypes.addressof(buf)
        ptrs = (ctypes.c_void_p * max(len(self.offsets), 1))(*[base + o for o in self.offsets])
        return buf, ptrs, ctypes.addressof(ptrs)

    def buffer(self):
        try:
            return self._tls.b
        except AttributeError:
            self._tls.b = b = self.new_buffer()
            return b


def _make_packer(argtypes, argnames, pack_into):
    """``pack(buf, args)``: one ``pack_into`` call over every flattened parameter
    (packers.make_packer)."""
    return make_packer(argtypes, argnames, pack_into, _array_fields)


def _make_fast_launch(key, entry):
    """packers.make_fast_launch with the launch state as it is now (CuPy's array type and
    launch, the driver's)."""
    return make_fast_launch(key, entry, _cupy_ndarray, _cupy_launch, _cu_launch, _raise_launch_error)


# ---------------------------------------------------------------------------------------
# The public objects


_ATTR_SET: set = set()  # (function handle, device, attribute, value) already set


def dynamic_smem(kernel) -> int:
    """Bytes of dynamic shared memory ``kernel`` is always launched with: its
    ``nqdq_dynamic_smem`` attribute (set by the factories of kernels that declare
    ``cuda.shared.array(0, ...)``), 0 where it has none."""
    return int(getattr(kernel, "nqdq_dynamic_smem", 0))


def cluster_size(kernel) -> int:
    """Blocks a cluster of ``kernel`` (its ``nqdq_cluster`` attribute, set by the factories
    of kernels written for thread-block clusters, sm_90+): such a kernel is always launched
    by ``cuLaunchKernelEx`` with that cluster dimension (x), 1 where it has none."""
    return int(getattr(kernel, "nqdq_cluster", 1))


def cooperative(kernel) -> bool:
    """Whether ``kernel`` is always launched cooperatively (its ``nqdq_cooperative``
    attribute, set by the factories of kernels whose blocks wait for each other, e.g.
    ``_tensor_resident``): ``cuLaunchKernelEx`` with the cooperative attribute, so that the
    driver starts the grid only when all its blocks can be resident at once (a launch that
    could not is refused, never left waiting)."""
    return bool(getattr(kernel, "nqdq_cooperative", False))


def _set_function_attribute(kern, name, value):
    """cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_<name>, value) on Numba's own handle of every
    compiled overload of ``kern`` for the current device, once each (remembered in _ATTR_SET)."""
    from cuda.bindings.driver import CUfunction_attribute
    from numba.cuda.cudadrv import driver as drv

    attr = getattr(CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")
    for compiled in kern.overloads.values():
        fn = compiled._codelibrary.get_cufunc()  # the current device's
        key = (int(fn.handle), fn.device.id, name, value)
        if key not in _ATTR_SET:
            drv.driver.cuKernelSetAttribute(attr, value, fn.handle, fn.device.id)
            _ATTR_SET.add(key)


def allow_smem(kern, nbytes):
    """Raise the dynamic shared memory limit (48 KiB unless opted in) of every compiled
    overload of ``kern`` to ``nbytes`` (cuKernelSetAttribute on Numba's own handle). Any
    non-zero amount opts in: the 48 KiB default bounds static and dynamic together."""
    if nbytes > 0 and not simulated():
        _set_function_attribute(kern, "MAX_DYNAMIC_SHARED_SIZE_BYTES", nbytes)


def allow_cluster(kern, size):
    """Clusters of more than 8 blocks (not portable: H100 / H200 take up to 16) opted in for
    every compiled overload of ``kern``."""
    if size > 8 and not simulated():
        _set_function_attribute(kern, "NON_PORTABLE_CLUSTER_SIZE_ALLOWED", 1)


class FastKernel:
    """A Numba ``@cuda.jit`` kernel launched through ``cuLaunchKernel`` with packed arguments.

    Parameters
    ----------
    kernel : a ``numba.cuda`` dispatcher (the object ``@cuda.jit`` returns).
    signature : optional Numba signature (string, ``void(...)`` signature or tuple of
        types). With it, one entry is compiled (on first launch) and every launch must fit
        it; without it, an entry is compiled per argument signature, like Numba does.
    max_entries : how many signatures the LRU keeps.
    """

    def __init__(self, kernel, signature=None, *, max_entries: int = 32):
        self.kernel = kernel
        self.max_entries = int(max_entries)
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        self._fixed = None
        self._fixed_entry = {}  # device -> the fixed signature's entry
        # (device, the specialised launcher for the last key seen on it: _make_fast_launch), one
        # tuple, so that threads on two GPUs never pair one's device with the other's launcher
        self._fast = (None, None)
        self._cc = None
        self.smem = dynamic_smem(kernel)  # launched with this much dynamic shared memory where a launch gives 0
        self.cluster = cluster_size(kernel)  # > 1: cuLaunchKernelEx with this cluster dimension
        py = getattr(kernel, "py_func", None)
        import inspect

        self.argnames = tuple(inspect.signature(py).parameters) if py is not None else ()
        self.fast = _fast_path_allowed() and hasattr(kernel, "compile") and hasattr(kernel, "overloads")
        if self.fast:
            try:
                _driver()
            except ImportError:
                self.fast = False
        if signature is not None:
            from numba.core import sigutils

            if isinstance(signature, tuple):
                argtypes = signature
            else:
                argtypes, _ = sigutils.normalize_signature(signature)
            self._fixed = tuple(argtypes)
            for t in self._fixed:
                try:
                    _arg_codes(t)
                except NotImplementedError:
                    self.fast = False

    @property
    def coop(self) -> bool:
        """Launched with the cooperative attribute (``cooperative``: read at each launch, as
        a planner may mark a kernel so)."""
        return cooperative(self.kernel)

    # -- launches

    def launch(self, grid, block, args, stream=None, shared_mem: int = 0):
        """Launch on ``stream`` (None: CuPy's current stream, else the legacy default)."""
        shared_mem = shared_mem or self.smem
        if not self.fast:
            return self._numba_launch(grid, block, args, stream, shared_mem)
        gx, gy, gz = (grid, 1, 1) if type(grid) is int else _dim3(grid)
        bx, by, bz = (block, 1, 1) if type(block) is int else _dim3(block)
        if stream is None and _cupy_current_stream is not None:
            s = _cupy_current_stream().ptr
        else:
            s = _stream_handle(stream)
        dev = _current_device()
        fast_dev, fl = self._fast
        if fast_dev != dev or self.cluster != 1 or self.coop:
            fl = None
        try:
            if fl is not None and fl(args, gx, gy, gz, bx, by, bz, shared_mem, s):
                return
        except struct.error as e:
            raise TypeError(f"{self._name()}: an argument does not fit its parameter type: {e}") from None
        # the general path: key, LRU lookup (compiling on a miss), pack, launch
        try:
            key = (dev, *map(_arg_key, args))
        except TypeError:
            self._explain_args(args)
            raise
        entries = self._entries
        entry = entries.get(key)
        if entry is None:
            entry = self._entry_for(key)
        if entry is _NUMBA_LAUNCH:  # a signature or kernel the fast path does not cover
            return self._numba_launch(grid, block, args, stream, shared_mem)
        try:
            entries.move_to_end(key)  # LRU order
        except KeyError:  # evicted by another thread meanwhile
            pass
        buf, _, addr = entry.buffer()
        try:
            entry.pack(buf, args)
        except struct.error as e:
            raise TypeError(f"{self._name()}: an argument does not fit its parameter type: {e}") from None
        if self.cluster > 1 or self.coop:
            cfg, _attrs = _ex_config((gx, gy, gz), (bx, by, bz), shared_mem, cluster=self.cluster, coop=self.coop)
            cfg.hStream = s
            err = _driver_launch_ex()(ctypes.addressof(cfg), entry.handle, addr, None)
            if err:
                _raise_launch_error(err, self._name(), ex_kind(self))
            return
        if _cupy_launch is not None:  # raises CUDADriverError itself
            _cupy_launch(entry.handle, gx, gy, gz, bx, by, bz, shared_mem, s, addr, 0)
        else:
            err = _cu_launch(entry.handle, gx, gy, gz, bx, by, bz, shared_mem, s, addr, 0)[0]
            if err:
                _raise_launch_error(err, self._name())
        self._fast = (dev, entry.fast_launch(key[1:]))  # the next call with this key skips the lookup

    def __getitem__(self, config):
        """``fk[grid, block]``, ``fk[grid, block, stream]``, ``fk[grid, block, stream, shared_mem]``."""
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise ValueError("launch configuration must be [grid, block(, stream(, shared_mem))]")
        grid, block, *rest = config
        stream = rest[0] if rest else None
        shared_mem = rest[1] if len(rest) > 1 else 0
        launch = self.launch

        def configured(*args):
            launch(grid, block, args, stream, shared_mem)

        return configured

    def prepare(self, grid, block, args, shared_mem: int = 0) -> PreparedLaunch:
        """Pack once for fixed arguments (a decode loop over the same buffers); see
        :class:`PreparedLaunch`. Under the simulator it launches through Numba."""
        if not self.fast:
            return PreparedLaunch(self, None, grid, block, args, shared_mem)
        key = (_current_device(), *map(_arg_key, args))
        entry = self._entries.get(key) or self._entry_for(key)
        return PreparedLaunch(self, None if entry is _NUMBA_LAUNCH else entry, grid, block, args, shared_mem)

    def compile(self, args):
        """Build (or find) the entry for these arguments without launching; returns it
        (None on the Numba path). Call before capturing a graph."""
        if not self.fast:
            return None
        key = (_current_device(), *map(_arg_key, args))
        entry = self._entries.get(key) or self._entry_for(key)
        return None if entry is _NUMBA_LAUNCH else entry

    # -- internals

    def _name(self):
        return getattr(getattr(self.kernel, "py_func", None), "__name__", repr(self.kernel))

    def _numba_launch(self, grid, block, args, stream, shared_mem):
        shared_mem = shared_mem or self.smem
        if (self.cluster > 1 or self.coop) and not simulated():
            raise RuntimeError(f"{self._name()}: a cluster or cooperative kernel launches only by cuLaunchKernelEx "
                               "(the fast path)")
        if stream is None:
            cp = sys.modules.get("cupy")
            stream = 0
            if cp is not None and not simulated():
                from .backend import cuda

                stream = cuda.external_stream(cp.cuda.get_current_stream().ptr)
        if shared_mem and not simulated():  # compiled first, to opt in before the launch
            self.kernel.compile(tuple(self.kernel.typeof_pyval(a) for a in args))
            allow_smem(self.kernel, shared_mem)
        self.kernel[grid, block, stream, shared_mem](*args)

    def _explain_args(self, args):
        for i, a in enumerate(args):
            try:
                _arg_key(a)
            except TypeError as e:
                name = self.argnames[i] if i < len(self.argnames) else f"#{i}"
                raise TypeError(f"{self._name()}: argument {name!r} is {e}") from None

    def _entry_for(self, dev_key):
        """The entry of ``dev_key`` = (device, argument keys...), compiled and loaded on that
        device (the current one) on a miss."""
        with self._lock:
            entry = self._entries.get(dev_key)
            if entry is not None:
                return entry
            dev, key = dev_key[0], dev_key[1:]
            if self._fixed is not None:
                if len(key) != len(self._fixed):
                    raise TypeError(f"{self._name()} takes {len(self._fixed)} arguments, got {len(key)}")
                for i, (k, t) in enumerate(zip(key, self._fixed)):
                    if not _fits(k, t):
                        name = self.argnames[i] if i < len(self.argnames) else f"#{i}"
                        raise TypeError(f"{self._name()}: argument {name!r} ({k}) does not fit the signature's {t}")
                argtypes = self._fixed
                same = self._fixed_entry.get(dev)
            else:
                argtypes = tuple(_numba_type(k) for k in key)
                same = None
            if same is None:
                try:
                    for t in argtypes:
                        _arg_codes(t)
                except NotImplementedError:
                    entry = _NUMBA_LAUNCH
                else:
                    _cupy_type()
                    compiled = self.kernel.compile(argtypes)
                    allow_smem(self.kernel, self.smem)
                    allow_cluster(self.kernel, self.cluster)
                    if _needs_numba_launch(self.kernel, compiled):
                        entry = _NUMBA_LAUNCH
                    else:
                        entry = _Entry(compiled, argtypes, self.argnames)
                if entry is not _NUMBA_LAUNCH:
                    if self._cc is None:
                        from .backend import cuda

                        self._cc = cuda.get_current_device().compute_capability
                    entry.check_abi(self._cc)
                if self._fixed is not None:
                    self._fixed_entry[dev] = entry
            else:
                entry = same
            self._entries[dev_key] = entry
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            return entry


_NUMBA_LAUNCH = object()  # cache value: launch this signature through Numba


def _needs_numba_launch(dispatcher, compiled) -> bool:
    """Kernels whose launch does more than cuLaunchKernel: debug kernels (exception
    flags read back), cooperative launches, launch-config-sensitive kernels, argument
    extensions."""
    return bool(
        getattr(compiled, "debug", False)
        or getattr(compiled, "cooperative", False)
        or getattr(compiled, "launch_config_sensitive", False)
        or getattr(compiled, "extensions", None)
        or getattr(dispatcher, "targetoptions", {}).get("extensions")
    )


class PreparedLaunch:
    """A launch whose parameters were packed once: calling it only calls ``cuLaunchKernel``.

    It keeps references to its arguments (so their memory stays alive) and its own
    parameter buffer. ``prepared(stream=None)`` launches on ``stream``, with the device that
    prepared it current (its entry is that device's).
    """

    def __init__(self, fk: FastKernel, entry, grid, block, args, shared_mem):
        self.fk = fk
        self.entry = entry
        self.args = tuple(args)
        self.grid = _dim3(grid)
        self.block = _dim3(block)
        self.shared_mem = int(shared_mem) or fk.smem
        if entry is not None:
            self._buf, self._ptrs, self._addr = entry.new_buffer()
            entry.pack(self._buf, self.args)

    def __call__(self, stream=None):
        if self.entry is None:
            return self.fk._numba_launch(self.grid, self.block, self.args, stream, self.shared_mem)
        _raw_launch(self.entry.handle, *self.grid, *self.block, self.shared_mem, _stream_handle(stream),
                    self._addr, self.fk)  # fmt: skip


_by_dispatcher: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_by_id: dict = {}


def fast_kernel(kernel) -> FastKernel:
    """The one :class:`FastKernel` of a dispatcher (created on first use)."""
    try:
        fk = _by_dispatcher.get(kernel)
    except TypeError:  # not weak-referenceable
        fk = _by_id.get(id(kernel))
        if fk is None:
            fk = _by_id[id(kernel)] = FastKernel(kernel)
        return fk
    if fk is None:
        fk = _by_dispatcher[kernel] = FastKernel(kernel)
    return fk
# cuLaunchKernelEx, for the kernels launched with attributes (launch_ex, FastKernel.launch,
# sequence.compile_sequence)
_cu_launch_ex = None


def _driver_launch_ex():
    """libcuda's cuLaunchKernelEx by ctypes (config*, CUfunction, kernelParams, extra) -> CUresult."""
    global _cu_launch_ex
    if _cu_launch_ex is None:
        fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
        fn.argtypes = [ctypes.c_void_p] * 4
        fn.restype = ctypes.c_int
        _cu_launch_ex = fn
    return _cu_launch_ex


def _cluster_of(kern) -> int:
    """Cluster size of a sequence's kernel (dispatcher or FastKernel)."""
    return kern.cluster if isinstance(kern, FastKernel) else cluster_size(kern)


def _coop_of(kern) -> bool:
    """Whether a sequence's kernel (dispatcher or FastKernel) launches cooperatively."""
    return kern.coop if isinstance(kern, FastKernel) else cooperative(kern)


def ex_kind(kern):
    """"cooperative", "cluster" or None: the cuLaunchKernelEx attribute a kernel (dispatcher
    or FastKernel) launches with, which names the driver's refusal of it (LaunchRefused)."""
    if _coop_of(kern):
        return "cooperative"
    return "cluster" if _cluster_of(kern) > 1 else None


def _smem_of(kern) -> int:
    """Dynamic shared memory of a sequence's kernel (dispatcher or FastKernel)."""
    return kern.smem if isinstance(kern, FastKernel) else dynamic_smem(kern)


def _init():
    if _fast_path_allowed():
        try:
            _driver()
        except ImportError:
            pass
    _cupy_type()


_init()
