"""The row ops' hot path (rmsnorm, rmsnorm_quantize, flatten_quantize): a repeated GPU call
takes a remembered function that skips every check and plan. Here: the remembered calls
(``_ROWS_FAST``) and their keys, the array libraries' adapters (``_CupyLib``, ``_TorchLib``,
``_SimulatedLib``) and the functions each op's general path remembers (``_norm_runner``,
``_flat_rows_runner``, ...). The MoE op's hot path lives with its op (``_moe``)."""

from __future__ import annotations

import sys

import numpy as np

from ..gpu.runtime import callers as _callers
from ..gpu.runtime.launch_ex import memset32
from ..quantized import QuantizedTensor
from ._common import _residual_dtype


# ----------------------------------------------------------------------------- the rows hot path
# A repeated rmsnorm / rmsnorm_quantize / flatten_quantize call on the GPU with the same
# arguments (op, array types, shapes, dtypes, strides for flatten, scheme, eps, static scale,
# residual or not, dtype options, the current GPU, the build switches: the key) skips every
# check and plan: the first call validates on the general path and remembers a function that
# takes the arrays' addresses (refusing, for the general path, arrays on another GPU, not
# C-contiguous where the plan reads them so, or not 16-byte aligned), makes the call's one
# allocation of outputs and launches the planned sequence on the current stream of the
# caller's library (_CupyLib for CuPy arrays, _TorchLib for PyTorch tensors: results in that
# library; gpu.fused.plan.rows_plan: the general path's kernel, grid and arguments, recorded
# once; a contiguous flatten on a GPU: nqdq.quantize's hot path, as its general path). No
# host copy, no wait for the device: fp8_tensor's static scales are filled on the stream
# (cuMemsetD32Async). Under the simulator, NumPy arrays with device="cuda" take it too
# (_SimulatedLib: the plan's replay), so CI runs it. A dict of at most _ROWS_FAST_MAX keys,
# the oldest dropped first (api.remember_bounded).
_ROWS_FAST: dict = {}
_ROWS_FAST_MAX = 256
_OP_Y, _OP_NORM_Q, _OP_FLAT = "rmsnorm", "rmsnorm_quantize", "flatten_quantize"  # the keys' first element
_device_now = None  # nqdq.gpu.runtime.devices.current, set by _remember_rows before any key is made
_rows_switches = None  # nqdq.gpu.fused.plan.rows_switches, set with it
_LIBS: dict = {}  # "cupy" / "simulated" -> the library adapter, made once


def _hot(key):
    """The remembered function of ``key``, or None (None or unhashable keys included)."""
    try:
        return _ROWS_FAST.get(key)
    except TypeError:  # an unhashable argument (a list for scale, ...)
        return None


def _norm_key(op, x, weight, residual, options, device, dtype, weight_dtype):
    """The hot path's key of an RMSNorm op (None for arguments without shapes and dtypes)."""
    try:
        return (op, device, type(x), x.shape, x.dtype, type(weight), weight.shape, weight.dtype,
                None if residual is None else (type(residual), residual.shape, residual.dtype), options, dtype,
                weight_dtype, _device_now(), _rows_switches())  # fmt: skip
    except AttributeError:
        return None


def _flat_key(x, scheme, device, dtype):
    """The hot path's key of flatten_quantize (x's strides included: they pick the kernel;
    a PyTorch tensor's ``stride()``, in elements)."""
    try:
        strides = x.stride() if callable(getattr(x, "stride", None)) else x.strides
        return (_OP_FLAT, device, type(x), x.shape, strides, x.dtype, scheme, dtype, _device_now(), _rows_switches())
    except AttributeError:
        return None


def _remember_rows(make_key, build):
    """Remember ``build()`` (a hot-path function, or None: nothing) under ``make_key()``."""
    global _device_now, _rows_switches
    from ..api import remember_bounded
    from ..gpu.runtime.devices import current
    from ..gpu.fused.plan import rows_switches

    _device_now, _rows_switches = current, rows_switches
    key = make_key()
    try:
        if key is None or key in _ROWS_FAST:
            return
    except TypeError:  # an unhashable argument
        return
    fr = build()
    if fr is not None:
        remember_bounded(_ROWS_FAST, key, fr, _ROWS_FAST_MAX)


def _hot_lib(x, xin, device, *others):
    """The hot path's library adapter for this call (x and ``others``: the caller's own
    arrays, None or of x's type), or None: CuPy arrays and PyTorch CUDA tensors on a GPU;
    NumPy arrays with device="cuda" under the simulator."""
    from ..gpu.runtime.interop import is_cupy
    from ..gpu.runtime.target import SIMULATOR

    if any(a is not None and type(a) is not type(x) for a in others):
        return None
    if is_cupy(x) and hasattr(x, "_c_contiguous") and (xin is None or xin.lib == "cupy"):
        name = "cupy"
    elif _callers.caller_of(x).name == "torch" and getattr(x, "is_cuda", False):
        name = "torch"
    elif SIMULATOR and type(x) is np.ndarray and device in ("cuda", "gpu"):
        name = "simulated"
    else:
        return None
    lib = _LIBS.get(name)
    if lib is None:
        make = {"cupy": lambda: _CupyLib(sys.modules["cupy"]), "torch": lambda: _TorchLib(sys.modules["torch"]),
                "simulated": _SimulatedLib}[name]  # fmt: skip
        lib = _LIBS[name] = make()
    return lib


class _CupyLib:
    """CuPy arrays on a GPU, as the hot paths take and give them: an input by its device
    address; CuPy's current stream of the call's GPU; the outputs as arrays over one
    allocation a call (``alloc``: the one place the hot paths allocate, so that results in
    another library, PyTorch's or JAX's, change it and ``view`` alone)."""

    name = "cupy"
    compiled = True  # runs a RowsPlan's compiled sequence (raw addresses)

    def __init__(self, cp):
        from ..gpu.runtime.interop import cupy_array_new

        self._malloc, self._nd, self._current = cp.cuda.alloc, cp.ndarray, cp.cuda.get_current_stream
        # arrays by ndarray's own __new__ + _init where that builds what the constructor does
        # (about 1 us less each: runtime.interop.cupy_array_new, as nqdq.quantize's runners)
        self._new = cupy_array_new(cp, cp.cuda.alloc(256))

    def address(self, a, dev: int, contiguous: bool = True):
        """a's device address, or None where a planned launch cannot take a: on another GPU
        than ``dev``, not 16-byte aligned, not C-contiguous where ``contiguous``."""
        m = a.data
        p = m.ptr
        if m.device_id != dev or p & 15 or (contiguous and not a._c_contiguous):
            return None
        return p

    def stream(self, dev: int) -> int:
        return self._current(dev).ptr

    def alloc(self, nbytes: int, dev: int):
        """(owner, device address): a uint8 array of ``nbytes`` new bytes on GPU ``dev`` (the
        current one: the hot path's key holds it), the memory of every output of a call."""
        mem = self._malloc(nbytes)
        return self._array((nbytes,), _U8, mem), mem.ptr

    def view(self, owner, offset: int, shape, dtype):
        """An output: ``shape`` of ``dtype`` at ``offset`` bytes into ``owner``'s memory."""
        return self._array(shape, dtype, owner.data + offset if offset else owner.data)

    def _array(self, shape, dtype, memptr):
        new = self._new
        if new is None:
            return self._nd(shape, dtype, memptr)
        a = new(self._nd)
        a._init(shape, dtype, memptr)
        return a

    def fill32(self, base: int, offset: int, word: int, count: int, stream: int):
        memset32(base + offset, word, count, stream)


class _TorchLib:
    """PyTorch CUDA tensors, the twin of _CupyLib for a PyTorch caller: an input by
    ``data_ptr()``; PyTorch's current stream of the GPU; the outputs tensors over one
    ``torch.empty`` a call (PyTorch's caching allocator, on that stream), a bfloat16 x's new
    residual as ``torch.bfloat16`` (the one 16-bit output that holds bfloat16 bits)."""

    name = "torch"
    compiled = True

    def __init__(self, torch):
        self._empty, self._u8, self._device = torch.empty, torch.uint8, torch.device
        self._stream = _callers.TorchCaller(torch).stream
        self._devices: dict = {}
        self._dtypes = {np.dtype(np.uint8): torch.uint8, np.dtype(np.float32): torch.float32,
                        np.dtype(np.uint16): torch.bfloat16, np.dtype(np.float16): torch.float16}  # fmt: skip

    def address(self, a, dev: int, contiguous: bool = True):
        p = a.data_ptr()
        if a.get_device() != dev or p & 15 or (contiguous and not a.is_contiguous()):
            return None
        return p

    def stream(self, dev: int) -> int:
        return self._stream(dev)

    def alloc(self, nbytes: int, dev: int):
        d = self._devices.get(dev)
        if d is None:
            d = self._devices[dev] = self._device("cuda", dev)
        owner = self._empty(nbytes, dtype=self._u8, device=d)
        return owner, owner.data_ptr()

    def view(self, owner, offset: int, shape, dtype):
        n = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        part = owner if offset == 0 and n == owner.numel() else owner[offset : offset + n]
        return part.view(self._dtypes[dtype]).view(shape)

    def fill32(self, base: int, offset: int, word: int, count: int, stream: int):
        memset32(base + offset, word, count, stream)


class _SimulatedLib:
    """NumPy arrays with device="cuda" under the CUDA simulator: the twin of _CupyLib that CI
    runs (an input is the array itself, the outputs views of one NumPy buffer)."""

    name = "simulated"
    compiled = False  # runs a RowsPlan's replay (arrays)

    def address(self, a, dev: int, contiguous: bool = True):
        if not a.dtype.isnative or (contiguous and not a.flags.c_contiguous):
            return None
        return a

    def stream(self, dev: int) -> int:
        return 0

    def alloc(self, nbytes: int, dev: int):
        owner = np.empty(nbytes, np.uint8)
        return owner, owner

    def view(self, owner, offset: int, shape, dtype):
        dt = np.dtype(dtype)
        return owner[offset : offset + dt.itemsize * int(np.prod(shape, dtype=np.int64))].view(dt).reshape(shape)

    def fill32(self, base, offset: int, word: int, count: int, stream: int):
        base[offset : offset + 4 * count].view(np.uint32)[:] = word


_U8 = np.dtype(np.uint8)


def _rows_runner(lib, plan, dev: int, parts, finish, contiguous: bool = True, static_word: int = 0):
    """``fr(x, w, r)`` -> ``finish(*outputs)``, or None where ``lib`` refuses an array (the
    general path then runs): ``plan``'s launch on the arrays' addresses, the outputs ``parts``
    ((plan output name, shape, dtype), in finish's order) views of the call's one allocation;
    the "static" output filled with ``static_word``. ``contiguous``: x must be C-contiguous
    (else a strided view, as the plan reads it)."""
    seq = plan.sequence if lib.compiled else plan.replay
    address, alloc, view, stream = lib.address, lib.alloc, lib.view, lib.stream
    total = plan.total
    views = tuple((plan.outputs[name][0], tuple(shape), np.dtype(dt)) for name, shape, dt in parts)
    static = plan.outputs.get("static")
    fill32 = lib.fill32

    def fr(x, w, r):
        xp = address(x, dev, contiguous)
        wp = 0 if w is None else address(w, dev)
        rp = 0 if r is None else address(r, dev)
        if xp is None or wp is None or rp is None:
            return None
        owner, base = alloc(total, dev)
        st = stream(dev)
        seq(st, xp, wp, rp, base)
        if static is not None:
            fill32(base, static[0], static_word, static[1], st)
        return finish(*[view(owner, off, shape, dt) for off, shape, dt in views])

    fr.plan = plan
    return fr


def _norm_runner(lib, xin, win, rin, sch, e, s, x):
    """The hot path of an RMSNorm op (rmsnorm where ``sch`` is None, else rmsnorm_quantize;
    ``s``: the static scales, or None) as its general path ran it, or None."""
    from ..gpu.fused import kernels as fused_kernels
    from ..gpu.fused.plan import rows_plan, rows_switches

    shape = tuple(xin.shape)
    rows, n = int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]
    words, word = 0, 0
    if s is not None:
        bits = np.ascontiguousarray(s, np.float32).reshape(-1).view(np.uint32)
        if bits.size == 0 or (bits != bits[0]).any():
            return None
        words, word = bits.size, int(bits[0])
    dev = _device_now()
    plan = rows_plan(dev, fused_kernels.OP_NORM, rows, n, xin.kind, win.kind, rin is not None, sch, sch is None, e,
                     None if s is None else np.float32(s.reshape(-1)[0]), None, words, rows_switches())  # fmt: skip
    if plan is None:
        return None
    res_part = [("newres", shape, _residual_dtype(xin.dtype, xin.lib, x))] if rin is not None else []
    if sch is None:
        parts = [("y", shape, np.float32)] + res_part
        return _rows_runner(lib, plan, dev, parts, _pair if rin is not None else _first)
    sshape = sch.scale_shape(shape)
    scales = ("static", sshape, np.float32) if s is not None else ("scales", sshape, plan.outputs["scales"][2])
    parts = [("codes", shape[:-1] + (plan.pcols,), np.uint8), scales] + res_part
    QT, dname = QuantizedTensor, xin.dtype

    if rin is None:
        def finish(codes, scales):
            return QT(codes, scales, sch, shape, dname, "linear")
    else:
        def finish(codes, scales, new_res):
            return QT(codes, scales, sch, shape, dname, "linear"), new_res

    return _rows_runner(lib, plan, dev, parts, finish, static_word=word)


def _first(a):
    return a


def _pair(a, b):
    return a, b


def _flat_rows_runner(lib, xin, strides, sch, q):
    """The hot path of flatten_quantize by the fused row kernel (``strides``: the [B, H, D]
    view's, read in place; None: contiguous), as its general path ran it (``q``), or None."""
    from ..gpu.fused import kernels as fused_kernels
    from ..gpu.fused.plan import rows_plan, rows_switches

    b, h, d = xin.shape
    shape = (b, h * d)
    dev = _device_now()
    plan = rows_plan(dev, fused_kernels.OP_ROWS, b, h * d, xin.kind, 0, False, sch, False, 0.0, None, strides, 0,
                     rows_switches())
    if plan is None:
        return None
    parts = [("codes", tuple(np.shape(q.codes)), np.uint8), ("scales", sch.scale_shape(shape), plan.outputs["scales"][2])]
    QT, dname = QuantizedTensor, xin.dtype

    def finish(codes, scales):
        return QT(codes, scales, sch, shape, dname, "linear")

    return _rows_runner(lib, plan, dev, parts, finish, contiguous=strides is None)


def _flat_plan_runner(x, sch, q, dtype):
    """The hot path of flatten_quantize of a C-contiguous CuPy [B, H, D]: the plan runner of
    nqdq.quantize on [B, H*D] (the same memory; it reads x's address alone), as the general
    path's nqdq.quantize call, or None."""
    from ..gpu.quantize import plan as kq
    from ..gpu.runtime.interop import device_input

    xin = device_input(x, "x", dtype)
    run = kq.get_plan(tuple(q.shape), xin.kind, sch).cupy_runner()
    if run is None:
        return None
    dev, shape, dname, QT = _device_now(), tuple(q.shape), q.dtype, QuantizedTensor

    def fr(x, w, r):
        if x.data.device_id != dev:
            return None
        c, s, z, t, m = run(x)
        return QT(c, s, sch, shape, dname, "linear", z, t, m)

    fr.run = run
    return fr


def _flat_quantize_runner(sch, shape, device, dtype):
    """The hot path of flatten_quantize of a contiguous PyTorch [B, H, D]: nqdq.quantize of
    the [B, H*D] view (its own PyTorch hot path), as the general path's call."""
    from ..api import quantize

    def fr(x, w, r):
        return quantize(x.view(shape), sch, device=device, dtype=dtype)

    return fr
