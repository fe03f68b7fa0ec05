"""nqdq.fused.moe_sort_quantize: its checks, the host reference path, the device path
(launchers: ``nqdq.gpu.fused.moe``) and its hot path (``_MOE_FAST``), which share this
module's state (the hot check reads what ``_remember_moe`` sets)."""

from __future__ import annotations

import sys

import numpy as np

from .. import _arrays
from ..gpu.runtime import callers as _callers
from ..reference import fused as R
from ._common import _finish, _pack, _qt, _scheme, _to_device


def moe_sort_quantize(x, expert_ids, num_experts, scheme="mxfp4", *, device=None, dtype=None, check_ids=True):
    """Gather the rows of x [T, H] in expert order and quantize them.

    ``expert_ids`` [T, k] (integers in [0, num_experts)): token t goes to experts
    expert_ids[t, :]. The T*k (token, slot) pairs are sorted stably by expert id, then token,
    then slot. Returns ``(q, perm, offsets)``: q quantizes the [T*k, H] gathered rows,
    perm[i] (int32) is the source token of sorted row i, and expert e's rows are
    offsets[e]:offsets[e+1] (int32, [E+1]); empty experts have equal offsets.

    An id outside [0, num_experts) is a ValueError naming ``expert_ids``. For ids already on
    the GPU (CuPy) that check is made by the sort kernels and read back, the one wait for the
    device: a repeated call waits for the sort only (the sort writes the result to pinned host
    memory, which the call polls), the first call for the whole op. ``check_ids=False`` skips the read
    (the call then never waits: the pairs with ids out of range sort after every expert, in
    (token, slot) order, as rows offsets[E]: of q and perm, so offsets[E] < T*k says so); a
    call on a stream capturing a CUDA graph must pass it (else RuntimeError).
    """
    if type(x) is _cupy_ndarray and type(expert_ids) is _cupy_ndarray and (device is None or device == "cuda"):
        key = _moe_key(x, expert_ids, num_experts, scheme, dtype)  # the hot path (_remember_moe)
        fm = _MOE_FAST.get(key)
        if (fm is not None and x._c_contiguous and expert_ids._c_contiguous and x.data.ptr % 16 == 0
                and expert_ids.data.device_id == key[0] == _current_gpu()):  # fmt: skip
            return fm(x, expert_ids, check_ids)
    return _moe_sort_quantize(x, expert_ids, num_experts, scheme, device, dtype, check_ids)


@_arrays.on_gpu_of("x", "expert_ids")
@_callers.in_caller_library("x", "expert_ids")
def _moe_sort_quantize(x, expert_ids, num_experts, scheme, device, dtype, check_ids):
    """moe_sort_quantize's general path, on the arrays' GPU (every check, the plan)."""
    sch = _scheme(scheme, None)
    if isinstance(num_experts, bool) or not isinstance(num_experts, (int, np.integer)) or num_experts < 1:
        raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
    num_experts = int(num_experts)
    ids_kind = getattr(getattr(expert_ids, "dtype", None), "kind", None)
    if ids_kind not in ("i", "u"):
        raise TypeError(f"expert_ids must be an integer array, got dtype {getattr(expert_ids, 'dtype', type(expert_ids).__name__)}")
    if getattr(expert_ids, "ndim", None) != 2:
        raise ValueError(f"expert_ids must be 2-D [tokens, k], got shape {getattr(expert_ids, 'shape', None)}")
    if not _arrays.use_device(x, device):
        x32, dname = _arrays.float_input(x, "x", dtype=dtype)
        ids = _arrays.host(expert_ids)
        _check_moe(x32.shape, ids.shape, ids.min() if ids.size else 0, ids.max() if ids.size else 0, num_experts)
        parts, perm, offsets = R.moe_sort_quantize(x32, ids, num_experts, sch)
        shape = (ids.size, x32.shape[1])
        return _qt(_pack(parts.codes, sch), parts.scales, sch, shape, dname), perm, offsets
    from ..gpu.runtime.interop import device_input, is_cupy
    from ..gpu.fused.moe import moe_rows

    xin = device_input(x, "x", dtype)
    if len(xin.shape) != 2:
        raise ValueError(f"x must be 2-D [tokens, hidden], got shape {xin.shape}")
    from ..gpu.runtime.interop import Allocator
    from ..gpu.runtime.target import SIMULATOR

    alloc = Allocator(xin.lib)
    on_device = is_cupy(expert_ids)
    if on_device:  # range-checked by the sort kernels (no min / max here: each would wait for the device)
        ids = _device_ids(expert_ids).reshape(-1)
        lo, hi = 0, 0
    else:
        ids = np.ascontiguousarray(_arrays.host(expert_ids)).reshape(-1)
        lo, hi = (int(ids.min()), int(ids.max())) if ids.size else (0, 0)
        ids = ids.astype(np.int32)  # in [0, E) once checked
        if not SIMULATOR:
            ids = _to_device(ids, alloc)
    _check_moe(xin.shape, tuple(expert_ids.shape), lo, hi, num_experts)
    tk = int(np.prod(expert_ids.shape))
    if on_device and check_ids and tk > 0 and not SIMULATOR and _capturing_now():
        raise RuntimeError(_CHECK_CAPTURED)
    k = int(expert_ids.shape[1])
    shape = (tk, xin.shape[1])
    sch.check_shape(shape)
    out, perm, offsets, _, _ = moe_rows(xin, ids, tk, k, num_experts, sch, alloc)
    q = _finish(out, sch, shape, xin)
    if on_device and check_ids and tk > 0 and int(_arrays.host(offsets[num_experts : num_experts + 1])[0]) != tk:
        raise ValueError(f"expert_ids must lie in [0, {num_experts}): some of the {tk} ids on the device do not")
    if on_device:
        _remember_moe(x, expert_ids, num_experts, scheme, dtype, xin, sch)
    return q, alloc.to_lib(perm, (tk,)), alloc.to_lib(offsets[: num_experts + 1], (num_experts + 1,))


# ----------------------------------------------------------------------------- the MoE hot path
# A repeated moe_sort_quantize with C-contiguous CuPy x (16-byte aligned) and int32 / int64
# CuPy ids of the same shapes, dtypes and arguments skips every check and plan: the first call
# validates on the general path and remembers a function that allocates once and launches the
# planned kernels (gpu.fused.moe.moe_plan: the sort's one or three, then the rows). Where
# check_ids, it polls the word of pinned memory the sort writes its id check to
# (gpu.fused.moe.IdChecks), or (the local path) reads offsets[E] back. Keyed also by the MoE
# launchers' switches (gpu.fused.moe.moe_switches), so a benchmark's A/B of them is seen (as
# nqdq.quantize's fast path, a dict of at most _MOE_FAST_MAX keys, the oldest dropped first).
_MOE_FAST: dict = {}
_MOE_FAST_MAX = 64
_cupy_ndarray = None  # cupy.ndarray once a CuPy input reached the hot path's builder
_current_gpu = None  # cupy.cuda.runtime.getDevice, set with _cupy_ndarray
_moe_switches = None  # nqdq.gpu.fused.moe.moe_switches, set by _remember_moe before any hot call can come


def _moe_key(x, ids, num_experts, scheme, dtype):
    """The hot path's key: x's GPU (first), the call's shapes, dtypes and arguments, then
    (last) the build switches moe_plan takes."""
    try:
        return (x.data.device_id, x.shape, x.dtype.char, ids.shape, ids.dtype.char, num_experts, scheme, dtype,
                _moe_switches())
    except TypeError:  # an unhashable scheme argument
        return None


def _remember_moe(x, expert_ids, num_experts, scheme, dtype, xin, sch):
    global _cupy_ndarray, _current_gpu, _moe_switches
    from ..api import remember_bounded
    from ..gpu.fused.moe import id_checks, moe_plan, moe_switches
    from ..gpu.runtime.interop import is_cupy

    if not (is_cupy(x) and is_cupy(expert_ids) and hasattr(x, "_c_contiguous")) or xin.lib != "cupy":
        return
    if not _ids_as_they_are(expert_ids.dtype):
        return
    _moe_switches = moe_switches
    key = _moe_key(x, expert_ids, num_experts, scheme, dtype)
    if key is None or key in _MOE_FAST:  # (remembered: this call went the general way for x's layout)
        return
    tokens, hidden = (int(v) for v in xin.shape)
    k = int(expert_ids.shape[1])
    run = moe_plan(key[0], tokens, hidden, k, num_experts, xin.kind, xin.dtype, expert_ids.dtype.char, sch, key[-1])
    if run is None:
        return
    _current_gpu = sys.modules["cupy"].cuda.runtime.getDevice
    _cupy_ndarray = type(x)
    tk, E, shape, dname = tokens * k, num_experts, (tokens * k, hidden), xin.dtype

    import cupy

    from ..gpu.quantize.runners import capture_test

    checks = id_checks(cupy) if run.seq_check is not None else None
    capturing, current, dev = capture_test(cupy), cupy.cuda.get_current_stream, key[0]  # (x's GPU: current in fm)

    def fm(x, ids, check_ids):
        if not check_ids:
            codes, scales, perm, offsets = run(x, ids)
            return _qt(codes, scales, sch, shape, dname), perm, offsets
        st = current(dev)
        if capturing(st.ptr):
            raise RuntimeError(_CHECK_CAPTURED)
        if checks is not None:  # wait for the sort's id check, not for the rows
            i, flag = checks.take()
            codes, scales, perm, offsets = run(x, ids, flag)
            ok = checks.wait(i, st)
        else:
            codes, scales, perm, offsets = run(x, ids)
            ok = int(offsets[E : E + 1].get()[0]) == tk
        if not ok:
            raise ValueError(f"expert_ids must lie in [0, {E}): some of the {tk} ids on the device do not")
        return _qt(codes, scales, sch, shape, dname), perm, offsets

    fm.run = run
    remember_bounded(_MOE_FAST, key, fm, _MOE_FAST_MAX)


_CHECK_CAPTURED = ("moe_sort_quantize(check_ids=True) waits for the device's check of expert_ids, which a "
                   "stream capturing a CUDA graph cannot do: pass check_ids=False (offsets[E] < T*k then "
                   "says that some ids were out of range)")


def _capturing_now() -> bool:
    """Whether CuPy's current stream is capturing a CUDA graph."""
    import cupy

    from ..gpu.quantize.runners import capture_test

    return capture_test(cupy)(cupy.cuda.get_current_stream().ptr)


def _ids_as_they_are(dt) -> bool:
    """Whether the sort kernels read CuPy ids of dtype ``dt`` as they are (int32, int64)."""
    return dt.kind == "i" and dt.itemsize in (4, 8)


def _device_ids(ids):
    """CuPy expert ids as the sort kernels read them, every value kept (so one out of range
    stays out of range): int32 / int64 as they are, narrower integers as int32, uint32 and
    uint64 as int64 (a uint64 past 2^63 turns negative: still out of range)."""
    if _ids_as_they_are(ids.dtype):
        return ids
    return ids.astype(np.int32 if ids.dtype.itemsize < 4 else np.int64)


def _check_moe(xshape, idshape, lo, hi, num_experts):
    if len(xshape) != 2:
        raise ValueError(f"x must be 2-D [tokens, hidden], got shape {tuple(xshape)}")
    if idshape[0] != xshape[0]:
        raise ValueError(f"expert_ids has {idshape[0]} rows but x has {xshape[0]} tokens")
    if lo < 0 or hi >= num_experts:
        raise ValueError(f"expert_ids must lie in [0, {num_experts}), got values in [{lo}, {hi}]")
