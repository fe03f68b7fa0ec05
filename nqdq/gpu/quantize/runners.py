"""The generated runners of a quantize plan on a GPU: for CuPy input one function that makes
one allocation and replays the plan's launches as a compiled sequence on CuPy's current
stream (``build_cupy_runner``), for PyTorch tensors the same launches on PyTorch's stream
with its allocator (``build_torch_runner``); the per-stream ``grid_max`` workspaces the
one-launch kernels (``grid``) share, and the CUDA-graph capture test they need. A plan's
:meth:`QuantPlan.cupy_runner` / :meth:`QuantPlan.torch_runner` build and cache these."""

from __future__ import annotations

import math
import sys
import threading

import numpy as np

from ..runtime import devices as _devices
from ..runtime import launch
from ..runtime.sequence import Ptr, Var, compile_sequence
from ..runtime.interop import cupy_array_new
from ..runtime.target import SIMULATOR
from . import grid as grid_sync
from .slots import SEED_HI, SEED_LO, X, Slot


def refusal_guard(plan, run):
    """``run`` (a runner of this plan's cooperative or cluster launches) until the driver
    refuses such a launch; from then on (a refused launch runs nothing) the fallback
    plan's runner, for this call and every later one (the calls that remembered this
    runner keep it: it forwards). Inside a CUDA-graph capture the refusal invalidates the
    capture (the driver's cudaErrorStreamCaptureInvalidated reaches the caller, the
    warning says why); a capture after it records the fallback's launches."""
    state = [run]

    def guarded(x, lo=0, hi=0):
        f = state[0]
        if f is run:
            if not launch._REFUSED or not plan.ex_kinds & launch._REFUSED:
                try:
                    return run(x, lo, hi)
                except launch.LaunchRefused as e:
                    launch.refuse(e.kind)
            f = plan.fallback().cupy_runner()  # (an error here: tried again next call)
            if f is None:  # (built under the same conditions as this plan's: not expected)
                raise RuntimeError(f"no runner for the fallback of the plan of {plan.shape}")
            state[0] = f
        return f(x, lo, hi)

    guarded.__dict__.update(run.__dict__)  # (source, plan, fast_arrays)
    guarded.inner = run
    return guarded


def build_cupy_runner(plan):
    """``run(x, lo=0, hi=0) -> (codes, scales, zero_points, tensor_scale, means)`` for a
    C-contiguous CuPy ``x`` of the plan's shape and kind, on CuPy's current stream: one
    ``cupy.cuda.alloc`` for every output and scratch array (the outputs are arrays over it,
    so scratch lives as long as they do: safe under CUDA-graph capture), the dummies in a
    buffer the runner owns, then per kernel its addresses stored into a parameter buffer
    packed once and one ``cuLaunchKernel`` (``sequence.compile_sequence``); the output arrays
    built by ``interop.cupy_array_new``'s path where it applies. None where it cannot be
    built (simulator, NQDQ_FAST_LAUNCH=0, static scales, no CuPy)."""
    if SIMULATOR or plan.static_scale:
        return None
    cp = sys.modules.get("cupy")
    if cp is None or not launch._fast_path_allowed():
        return None
    align = 256
    offsets, total = {}, 0
    dummy_off, dummy_total = {}, 0
    reset = [s for s in plan.slots if s.role == "reset"]  # direct calls: the stream's workspace
    if len(reset) > 1 or any(s.n > grid_sync.SYNC_WORDS or s.dtype != np.int32 for s in reset):
        return None  # (no plan has more than one grid_max workspace)
    for s in plan.slots:
        nb = max(s.n * s.dtype.itemsize, 1)
        if s.role == "dummy":
            dummy_off[s.i] = dummy_total
            dummy_total += -(-nb // align) * align
        else:
            offsets[s.i] = total
            total += -(-nb // align) * align
    dummies = cp.zeros(max(dummy_total, align), np.uint8) if dummy_total else None

    def ptr(a):
        if type(a) is Slot:
            if a.role == "dummy":
                return Ptr("dummy", dummy_off[a.i], a.n, a.dtype)
            if reset and a is reset[0]:  # the stream's workspace
                return Ptr("ws", 0, a.n, a.dtype)
            return Ptr("base", offsets[a.i], a.n, a.dtype)
        return marker_arg(plan, a)

    launches = [(k, g, b, tuple(map(ptr, args))) for k, g, b, args in plan.launches]
    seq = compile_sequence(launches, ("xp", "base", "dummy", "lo", "hi", "ws"))
    if seq is None:
        return None
    # the output arrays: ndarray's own __new__ + _init where that builds the same array
    # as cupy.ndarray(shape, dtype, memptr) (about half its host time; runtime.interop)
    new = cupy_array_new(cp, dummies.data if dummies is not None else cp.cuda.alloc(align))
    ns = {
        "_seq": seq, "_alloc": cp.cuda.alloc, "_nd": cp.ndarray, "_new": new,
        "_cur": cp.cuda.get_current_stream, "_dummies": dummies,
        "_DP": int(dummies.data.ptr) if dummies is not None else 0,
    }  # fmt: skip
    zero = [s for s in plan.slots if s.role == "zero"]  # zeroed in the call's stream, before the launches
    lines = ["def run(x, lo=0, hi=0):", f"    mp = _alloc({max(total, 1)})"]
    # the current stream of the plan's GPU, named so that CuPy need not ask for the current
    # device again (the caller runs the plan with its GPU current: get_plan)
    ns["_DEV"] = _devices.current()
    lines += ["    cs = _cur(_DEV)", "    st = cs.ptr"] if reset else ["    st = _cur(_DEV).ptr"]
    lines += [f"    _memset(mp.ptr + {offsets[s.i]}, 0, {s.n * s.dtype.itemsize}, st)" for s in zero]
    if reset:  # the stream's own grid_max workspace; in a graph, the call's own (a memset node)
        r = reset[0]
        lines += [
            "    if _capturing(st):",
            f"        ws = mp.ptr + {offsets[r.i]}",
            f"        _memset(ws, 0, {r.n * r.dtype.itemsize}, st)",
            "    else:",
            "        ws = _ws(cs, _DEV)",
        ]
        ns["_capturing"] = capture_test(cp)
        ns["_ws"] = stream_workspaces(cp).get
    lines.append(f"    _seq(st, x.data.ptr, mp.ptr, _DP, lo, hi, {'ws' if reset else 0})")
    ns["_memset"] = cp.cuda.runtime.memsetAsync
    results = []
    for name, s, shape, dt in (
        ("codes", plan.codes, plan.cshape, np.int8 if plan.codes_int8 else np.uint8),
        ("scales", plan.scales, plan.sshape, None),
        ("zps", plan.zps, plan.sshape, None),
        ("ts", plan.tscale, (), None),
        ("means", plan.means, plan.sshape, None),
    ):
        if s is None:
            results.append("None")
            continue
        ns[f"_S_{name}"] = tuple(shape)
        ns[f"_D_{name}"] = np.dtype(dt if dt is not None else s.dtype)
        off = offsets[s.i]
        memptr = "mp" if off == 0 else f"mp + {off}"
        if new is not None:
            lines += [f"    {name} = _new(_nd)", f"    {name}._init(_S_{name}, _D_{name}, {memptr})"]
        else:
            lines.append(f"    {name} = _nd(_S_{name}, _D_{name}, {memptr})")
        results.append(name)
    lines.append(f"    return {', '.join(results)}")
    src = "\n".join(lines) + "\n"
    # generated host code: why it is generated, see the note in runtime/packers.py
    exec(compile(src, f"<nqdq quantize plan {plan.shape}>", "exec"), ns)
    run = ns["run"]
    run.source = src
    run.plan = plan
    run.fast_arrays = new is not None
    return run


def marker_arg(plan, a):
    """A recorded launch argument as a compiled sequence's (sequence.Ptr / Var) where it is
    a marker (the input, the seed's halves), else as it is."""
    if a is X:
        return Ptr("xp", 0, math.prod(plan.shape), plan._xdtype)
    if a is SEED_LO:
        return Var("lo")
    if a is SEED_HI:
        return Var("hi")
    return a


def build_torch_runner(plan, caller):
    """``run(x) -> (codes, scales, zero_points, tensor_scale, means)`` for a contiguous
    PyTorch tensor ``x`` of the plan's shape and kind on the plan's GPU: each output and
    scratch array a ``torch.empty`` on PyTorch's current stream (its caching allocator
    orders reuse by stream and keeps a graph capture's allocations in the graph's pool),
    the workspaces that must start zero ``torch.zeros`` (a memset node under capture), the
    launches a compiled sequence on that stream. None where it cannot be built (as
    :func:`build_cupy_runner`, and plans with cooperative or cluster launches, whose refusal
    fallback the CuPy runner alone carries)."""
    if SIMULATOR or plan.static_scale or plan.ex_kinds:
        return None
    if not launch._fast_path_allowed():
        return None
    torch = caller.torch
    dev_index = _devices.current()
    device = torch.device("cuda", dev_index)
    shapes = {
        plan.codes.i: (plan.cshape, np.int8 if plan.codes_int8 else np.uint8),
        plan.scales.i: (plan.sshape, plan.scales.dtype),
    }
    for s, shape in ((plan.zps, plan.sshape), (plan.tscale, ()), (plan.means, plan.sshape)):
        if s is not None:
            shapes[s.i] = (shape, s.dtype)
    outs = [s for s in plan.slots if s.i in shapes]  # each its own tensor, returned
    reset = [s for s in plan.slots if s.role == "reset"]
    if len(reset) > 1 or any(s.n > grid_sync.SYNC_WORDS or s.dtype != np.int32 for s in reset):
        return None
    offsets, totals = {}, {"scratch": 0, "zero": 0, "dummy": 0}
    for s in plan.slots:  # scratch, zeroed scratch and dummies: one buffer each, 256-byte aligned parts
        if s.i in shapes or s.role == "reset":
            continue
        pool = {"scratch": "scratch", "zero": "zero", "dummy": "dummy"}[s.role]
        offsets[s.i] = (pool, totals[pool])
        totals[pool] += -(-max(s.n * s.dtype.itemsize, 1) // 256) * 256
    dummies = torch.zeros(max(totals["dummy"], 256), dtype=torch.uint8, device=device)
    names = {s.i: f"out{k}" for k, s in enumerate(outs)}

    def ptr(a):
        if type(a) is Slot:
            if a.i in names:
                return Ptr(names[a.i], 0, a.n, a.dtype)
            if a.role == "reset":
                return Ptr("ws", 0, a.n, a.dtype)
            pool, off = offsets[a.i]
            return Ptr(pool, off, a.n, a.dtype)
        return marker_arg(plan, a)

    launches = [(k, g, b, tuple(map(ptr, args))) for k, g, b, args in plan.launches]
    seq = compile_sequence(launches, ("xp", *names.values(), "scratch", "zero", "dummy", "ws", "lo", "hi"))
    if seq is None:
        return None
    make = tuple((shapes[s.i][0], caller.dtypes[np.dtype(shapes[s.i][1])]) for s in outs)
    where = {s.i: k for k, s in enumerate(outs)}
    picks = tuple(None if s is None else where[s.i] for s in (plan.codes, plan.scales, plan.zps, plan.tscale, plan.means))
    stream_of, DP, empty, zeros, u8 = caller.stream, dummies.data_ptr(), torch.empty, torch.zeros, torch.uint8
    n_scratch, n_zero = totals["scratch"], totals["zero"]
    workspaces = TorchWorkspaces(torch, device, dev_index) if reset else None

    def run(x):
        st = stream_of(dev_index)
        arrays = [empty(shape, dtype=dt, device=device) for shape, dt in make]
        scratch = empty(n_scratch, dtype=u8, device=device) if n_scratch else None
        zero = zeros(n_zero, dtype=u8, device=device) if n_zero else None
        ws = workspaces.get(st) if workspaces is not None else None
        seq(st, x.data_ptr(), *[a.data_ptr() for a in arrays], 0 if scratch is None else scratch.data_ptr(),
            0 if zero is None else zero.data_ptr(), DP, 0 if ws is None else ws.data_ptr(), 0, 0)  # fmt: skip
        return tuple(None if k is None else arrays[k] for k in picks)

    run.plan = plan
    run.dummies = dummies
    return run


class TorchWorkspaces:
    """The torch runners' ``grid_max`` workspace (``grid``): one zeroed tensor per stream of
    a direct call, as ``grid.StreamWorkspaces`` keeps for CuPy (the kernels leave it zero,
    and kernels of one stream run one after another); under graph capture the call's own,
    zeroed by a memset node of the graph. Streams are told apart as there
    (``grid.workspace_key``). A stream handle that the caller destroys and PyTorch reuses
    for a new stream keeps the workspace, which is then still zero."""

    def __init__(self, torch, device, dev_index, limit=64):
        self._zeros, self._device, self._dev, self._i32 = torch.zeros, device, dev_index, torch.int32
        self._capturing = torch.cuda.is_current_stream_capturing
        self._by_stream = {}
        self._limit = limit

    def get(self, stream):
        if self._capturing():
            return self._zeros(grid_sync.SYNC_WORDS, dtype=self._i32, device=self._device)
        key = grid_sync.workspace_key(stream, self._dev)
        ws = self._by_stream.get(key)
        if ws is None:
            ws = self._zeros(grid_sync.SYNC_WORDS, dtype=self._i32, device=self._device)
            while len(self._by_stream) >= self._limit:
                self._by_stream.pop(next(iter(self._by_stream)), None)
            self._by_stream[key] = ws
        return ws


_STREAM_WS = None
_STREAM_WS_LOCK = threading.Lock()


def capture_test(cp):
    """``capturing(stream_handle) -> bool`` for a plan's runner: whether the stream is capturing
    a CUDA graph (cudaStreamIsCapturing); an error (the legacy stream queried while another
    stream captures) counts as capturing, the graph-safe answer."""
    is_capturing = cp.cuda.runtime.streamIsCapturing

    def capturing(st):
        try:
            return is_capturing(st) != 0
        except Exception:
            return True

    return capturing


def stream_workspaces(cp):
    """The process's :class:`grid.StreamWorkspaces` (one per process: a stream's kernels
    share one workspace whatever plan launched them)."""
    global _STREAM_WS
    with _STREAM_WS_LOCK:
        if _STREAM_WS is None:
            _STREAM_WS = grid_sync.StreamWorkspaces(cp)
    return _STREAM_WS

