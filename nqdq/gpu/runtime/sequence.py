"""Compiled launch sequences (``launch``'s docstring): one generated function packs and
launches a fixed sequence of launches, every shape and constant baked in, only the addresses
given per call (``Ptr``, ``Var``). It launches through ``launch``'s current state (CuPy's or
the driver's launch), read when a sequence is compiled.
"""

from __future__ import annotations

import ctypes
import threading

from . import launch
from .abi import _arg_codes
from .launch_ex import _dim3, _ex_config

# ---------------------------------------------------------------------------------------
# Compiled launch sequences: several launches, one generated function, raw addresses


class Ptr:
    """A 1-D C-contiguous device-array argument of :func:`compile_sequence` whose address
    is the call variable ``base`` plus ``offset`` bytes (``n`` items of ``dtype``). It
    exposes a null ``__cuda_array_interface__`` so FastKernel can type and compile for it."""

    __slots__ = ("base", "offset", "n", "dtype")

    def __init__(self, base: str, offset: int, n: int, dtype):
        import numpy as np

        self.base, self.offset, self.n, self.dtype = base, int(offset), int(n), np.dtype(dtype)

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.n,), "typestr": self.dtype.str, "data": (0, False), "strides": None, "version": 3}


class Var:
    """A per-call integer argument of :func:`compile_sequence` (an int64 parameter)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


def compile_sequence(launches, names, *, entries=None, pdl=()):
    """One generated function ``run(stream, *names)`` that packs and launches ``launches``
    in order with ``cuLaunchKernel``; None where any launch must go through Numba
    (simulator, ``NQDQ_FAST_LAUNCH=0``, kernels the fast path does not cover). The launches
    whose indices are in ``pdl`` go by ``cuLaunchKernelEx`` with programmatic stream
    serialization (the caller's kernels must be written for it: griddepcontrol, sm_90+), and
    so do the launches of cluster kernels (``cluster_size``), with their cluster dimension,
    and of cooperative kernels (``cooperative``).

    ``launches``: ``(kernel, grid, block, args)`` with ``kernel`` a dispatcher or
    launch.FastKernel, and each argument a :class:`Ptr` (the address is computed from a call
    variable), a :class:`Var` (an int given per call) or a constant scalar. Every shape,
    stride and constant is packed once per thread, so a call costs one 8-byte store per
    address plus the driver calls (a launch with a Var is packed whole per call). Compiles (and loads) every
    kernel now: build it before capturing a CUDA graph. ``entries`` (tests) gives the
    compiled entries instead of compiling.
    """
    names = tuple(names)
    clusters = [launch._cluster_of(k) for k, _g, _b, _a in launches]
    coops = [launch._coop_of(k) for k, _g, _b, _a in launches]
    ex = sorted(set(pdl) | {i for i, (c, co) in enumerate(zip(clusters, coops)) if c > 1 or co})  # by cuLaunchKernelEx
    launch._cupy_type()  # CuPy's launchKernel when CuPy is loaded by now
    if entries is None:
        if not launch._fast_path_allowed():
            return None
        entries = []
        for kern, _grid, _block, args in launches:
            fk = kern if isinstance(kern, launch.FastKernel) else launch.fast_kernel(kern)
            if not fk.fast:
                return None
            entry = fk.compile(tuple(0 if isinstance(a, Var) else a for a in args))
            if entry is None:
                return None
            entries.append(entry)
    launch_fn = launch._cupy_launch if launch._cupy_launch is not None else launch._driver()
    ns = {"_K": launch_fn, "_raise": launch._raise_launch_error, "_tls": threading.local()}
    body = []
    # Each launch's parameter buffer is packed once, when a thread first runs the sequence:
    # constants and shapes never change, so a call only stores the addresses of its Ptr
    # arguments (one 8-byte store each through a uint64 view of the buffer, ~0.1 us)
    # instead of packing every field. A launch with a Var argument is packed per call.
    prepacked = []  # per launch: the constant values to pack once, or None
    for i, ((_kern, grid, block, args), entry) in enumerate(zip(launches, entries)):
        if len(args) != len(entry.argtypes):
            raise TypeError(f"{entry.name}: {len(args)} arguments for {len(entry.argtypes)} parameters")
        values, consts, stores = [], [], []
        for j, (a, ty) in enumerate(zip(args, entry.argtypes)):
            kind = _arg_codes(ty)[1]
            if isinstance(a, Ptr):
                if kind != "array" or ty.ndim != 1:
                    raise TypeError(f"{entry.name}: argument {j} is a Ptr but the parameter is {ty}")
                if a.base not in names:
                    raise ValueError(f"Ptr base {a.base!r} is not one of the call variables {names}")
                addr = a.base if not a.offset else f"{a.base} + {a.offset}"
                n, isz = a.n, a.dtype.itemsize
                off = entry.offsets[len(values) + 4]  # the data field of (meminfo, parent, nitems, itemsize, data, ...)
                if off % 8:
                    raise RuntimeError(f"{entry.name}: data pointer of argument {j} at unaligned offset {off}")
                stores.append((off // 8, addr))
                values += ["0", "0", str(n), str(isz), addr, str(n), str(isz)]
                consts += [0, 0, n, isz, 0, n, isz]
            elif isinstance(a, Var):
                if a.name not in names:
                    raise ValueError(f"Var {a.name!r} is not one of the call variables {names}")
                values.append(a.name)
                consts.append(0)
            else:
                if kind == "array":
                    raise TypeError(f"{entry.name}: argument {j} must be a Ptr (an array parameter)")
                ns[f"_c{i}_{j}"] = a
                values += [f"_c{i}_{j}.real", f"_c{i}_{j}.imag"] if kind == "complex" else [f"_c{i}_{j}"]
                consts += [a.real, a.imag] if kind == "complex" else [a]
        if any(isinstance(a, Var) for a in args):
            prepacked.append(None)
            if values:
                body.append(f"    _P{i}(b[{3 * i}], 0, {', '.join(values)})")
        else:
            prepacked.append(consts)
            body += [f"    b[{3 * i + 2}][{k}] = {addr}" for k, addr in stores]
        ns[f"_P{i}"] = entry.struct.pack_into
        ns[f"_H{i}"] = entry.handle
        ns[f"_N{i}"] = entry.name
        gx, gy, gz = _dim3(grid)
        bx, by, bz = _dim3(block)
        smem = launch._smem_of(_kern)
        params = f"b[{3 * i + 1}], 0"  # kernelParams (the void*[]), no extra
        call = f"_K(_H{i}, {gx}, {gy}, {gz}, {bx}, {by}, {bz}, {smem}, stream, {params})"
        if i in ex:  # its CUlaunchConfig (this thread's, after the launches' buffers): the stream, then the launch
            c = 3 * len(launches) + 2 * ex.index(i)
            ns["_KX"] = launch._driver_launch_ex()
            body += [f"    b[{c}].hStream = stream", f"    err = _KX(b[{c + 1}], _H{i}, {params})", "    if err:",
                     f"        _raise(err, _N{i}, {launch.ex_kind(launches[i][0])!r})"]
        elif launch_fn is launch._cupy_launch:
            body.append(f"    {call}")
        else:
            body += [f"    err = {call}[0]", "    if err:", f"        _raise(err, _N{i})"]

    def new_buffers():
        # per launch: the parameter buffer, the void*[] address and a uint64 view of the buffer
        out, keep = [], []
        for e, consts in zip(entries, prepacked):
            buf, ptrs, addr = e.new_buffer()
            words = (ctypes.c_uint64 * (len(buf) // 8)).from_buffer(buf)
            if consts:  # None: packed per call (a Var launch)
                e.struct.pack_into(buf, 0, *consts)
            out += [buf, addr, words]
            keep.append(ptrs)  # what addr points at
        for i in ex:
            cfg, attr = _ex_config(launches[i][1], launches[i][2], launch._smem_of(launches[i][0]), pdl=i in pdl,
                                   cluster=clusters[i], coop=coops[i])  # fmt: skip
            out += [cfg, ctypes.addressof(cfg)]
            keep.append(attr)
        out.append(keep)
        return out

    ns["_new"] = new_buffers
    src = "\n".join(
        [f"def run(stream{''.join(', ' + n for n in names)}):",
         "    try:", "        b = _tls.b", "    except AttributeError:", "        b = _tls.b = _new()"]
        + body
    ) + "\n"  # fmt: skip
    # (source, not a closure: one straight line per call; packers' docstring says why)
    exec(compile(src, f"<nqdq.launch sequence of {len(entries)}>", "exec"), ns)
    run = ns["run"]
    run.source = src
    run.entries = tuple(entries)
    return run
