"""``dequantize`` on a GPU, planned once per (scheme, shape, output dtype, device): the
launches of ``quantize.dequantize`` compiled into one launch sequence, and a runner per
caller library that per call only allocates the output and stores the arrays' addresses.

Codes of whole 16-byte units a row (8- and 4-bit codes, scale groups of whole 8-element
chunks: nearly every scheme at model shapes) are decoded by the unit kernel
(``quantize.dequant_units_launch``), which writes float32, bfloat16 or float16 directly;
their codes must be 16-byte aligned (``units``: the hot path's check). Other shapes take
the element kernel (``dequant_kernels.make_dequant_kernel``), which writes float32; a
bfloat16 result is rounded from it by ``f32_to_bf16_kernel`` in the same sequence (float32
scratch), a float16 one by the caller's library (``astype`` / ``to``), as on the general
path.
"""

from __future__ import annotations

import collections
import math
import sys
import threading

import numpy as np

from ...reference.packing import packed_length
from ...schemes import Scheme
from ..runtime import devices as _devices
from . import dequant_kernels
from ..runtime.sequence import Ptr, compile_sequence
from ..device.scales import MODE_MX, MODE_NVFP4
from .params import cdiv, kernel_mode
from ..runtime.target import SIMULATOR

_U8, _F32, _U16 = np.dtype(np.uint8), np.dtype(np.float32), np.dtype(np.uint16)
_DUMMY_BYTES = 256  # what an absent array's pointer reads (never, but the kernel takes one)


class DequantPlan:
    """The launches of one dequantize call to ``out`` ("float32", "bfloat16" or "float16")
    over ``shape`` (codes packed along the last axis): the unit kernel writing ``out``
    itself, or the element kernel's float32 with, for bfloat16, the rounding kernel after it
    (``units`` False: a float16 result is then rounded by the caller's library)."""

    def __init__(self, sch: Scheme, shape: tuple, out: str, threads: int):
        from . import plan as kq

        self.shape = shape
        n = math.prod(shape)
        C = shape[-1]
        rows = n // C
        sub = sch.code_bits < 8
        pcols = packed_length(C, sch.code_bits) if sub else C
        mode = kernel_mode(sch)
        sc = _U8 if mode in (MODE_MX, MODE_NVFP4) else _F32
        ns = math.prod(sch.scale_shape(shape))
        codes = Ptr("codes", 0, rows * pcols, _U8)
        tail = (Ptr("scales", 0, ns, sc), Ptr("zps", 0, ns if sch.symmetric is False else 1, _U8),
                Ptr("means", 0, ns if sch.centred else 1, _F32), Ptr("tscale", 0, 1, _F32))  # fmt: skip
        unit_launch = kq.dequant_units_launch(sch, shape, threads, out)
        # the unit kernel: the codes must start 16-byte aligned, and it writes ``out`` itself
        # (no float32 scratch)
        self.units = unit_launch is not None
        if unit_launch is not None:
            k, grid, block, geometry, tpr_log2 = unit_launch
            result = Ptr("f32", 0, n, _F32) if out == "float32" else Ptr("half", 0, n, _U16)
            self.launches = [(k, grid, block, (codes, *geometry, *tail, result, tpr_log2))]
            self.out = out
        else:
            k, grid, block, geometry, tpr_log2 = kq.dequant_element_launch(sch, shape, threads, sub)
            values = Ptr("f32", 0, n, _F32)
            self.launches = [(k, grid, block, (codes, *geometry, *tail, values, tpr_log2))]
            if out == "bfloat16":
                g = max(1, min(cdiv(n, threads), 1 << 20))
                self.launches.append((dequant_kernels.f32_to_bf16_kernel, g, threads,
                                      (values, Ptr("half", 0, n, _U16), n)))
            self.out = "bfloat16" if out == "bfloat16" else "float32"  # (float16: rounded by the caller's library)
        self.names = ("codes", "scales", "zps", "means", "tscale", "f32", "half")
        self._seq = None
        self._seq_built = False
        self._lock = threading.Lock()

    def sequence(self):
        """The compiled launch sequence ``seq(stream, codes, scales, zps, means, tscale, f32,
        half)`` (addresses), or None where it cannot be built (simulator, NQDQ_FAST_LAUNCH=0)."""
        if not self._seq_built:
            with self._lock:
                if not self._seq_built:
                    self._seq = None if SIMULATOR else compile_sequence(self.launches, self.names)
                    self._seq_built = True
        return self._seq

    def cupy_runner(self):
        """``run(codes, scales, zps, tscale, means) -> values`` (CuPy arrays in and out, on
        CuPy's current stream of the plan's GPU; absent arrays None), or None."""
        seq = self.sequence()
        cp = sys.modules.get("cupy")
        if seq is None or cp is None:
            return None
        dev = _devices.current()
        dummy = cp.zeros(_DUMMY_BYTES // 4, np.float32)
        DP = dummy.data.ptr
        n, shape, alloc, nd, cur = math.prod(self.shape), self.shape, cp.cuda.alloc, cp.ndarray, cp.cuda.get_current_stream
        half = self.out != "float32"
        scratch = 4 * n if half and not self.units else 0  # the float32 values ahead of a rounded result
        nbytes = scratch + n * (2 if half else 4)
        dt = {"float32": _F32, "bfloat16": _U16, "float16": np.dtype(np.float16)}[self.out]

        def run(codes, scales, zps, tscale, means):
            mp = alloc(nbytes)
            p = mp.ptr
            seq(cur(dev).ptr, codes.data.ptr, scales.data.ptr, DP if zps is None else zps.data.ptr,
                DP if means is None else means.data.ptr, DP if tscale is None else tscale.data.ptr, p,
                p + scratch)  # fmt: skip
            return nd(shape, dt, mp + scratch if scratch else mp)

        run.dummy = dummy
        return run

    def torch_runner(self, caller):
        """As :meth:`cupy_runner` for PyTorch tensors, on PyTorch's current stream; results
        float32, torch.bfloat16 or torch.float16 (``out``)."""
        seq = self.sequence()
        if seq is None:
            return None
        torch = caller.torch
        dev = _devices.current()
        device = torch.device("cuda", dev)
        dummy = torch.zeros(_DUMMY_BYTES, dtype=torch.uint8, device=device)
        DP = dummy.data_ptr()
        shape, empty, stream = self.shape, torch.empty, caller.stream
        f32 = torch.float32
        dt = {"float32": f32, "bfloat16": torch.bfloat16, "float16": torch.float16}[self.out]
        scratched = self.out != "float32" and not self.units  # the float32 values in a scratch tensor first

        def run(codes, scales, zps, tscale, means):
            out = empty(shape, dtype=dt, device=device)
            o = out.data_ptr()
            scratch = empty(shape, dtype=f32, device=device) if scratched else None
            seq(stream(dev), codes.data_ptr(), scales.data_ptr(), DP if zps is None else zps.data_ptr(),
                DP if means is None else means.data_ptr(), DP if tscale is None else tscale.data_ptr(),
                o if scratch is None else scratch.data_ptr(), o)  # fmt: skip
            return out

        run.dummy = dummy
        return run


_PLANS: collections.OrderedDict = collections.OrderedDict()
_PLANS_MAX = 256
_PLANS_LOCK = threading.Lock()


def get_plan(sch: Scheme, shape, out: str, threads: int | None = None) -> DequantPlan:
    """The cached :class:`DequantPlan` to ``out`` ("float32", "bfloat16", "float16") on the
    current GPU."""
    from .plan import THREADS

    nt = threads or THREADS
    key = (sch, tuple(shape), out, nt, _devices.current())
    plan = _PLANS.get(key)
    if plan is None:
        plan = DequantPlan(sch, tuple(shape), out, nt)
        with _PLANS_LOCK:
            _PLANS[key] = plan
            while len(_PLANS) > _PLANS_MAX:
                _PLANS.popitem(last=False)
    return plan
