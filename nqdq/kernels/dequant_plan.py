"""``dequantize`` on a GPU, planned once per (scheme, shape, output dtype, device): the
launches of ``quantize.dequantize`` compiled into one launch sequence, and a runner per
caller library that per call only allocates the output and stores the arrays' addresses.

Codes of whole 16-byte units a row (8- and 4-bit codes, scale groups of whole 8-element
chunks: nearly every scheme at model shapes) are decoded by the unit kernel
(``quantize.dequant_units_launch``), which writes float32 or bfloat16 directly; their codes
must be 16-byte aligned (``aligned``: the hot path's check). Other shapes take the element
kernel (``_quantize_kernels.make_dequant_kernel``), which writes float32; a bfloat16 result
is rounded from it by ``f32_to_bf16_kernel`` in the same sequence (float32 scratch).
float16 results are rounded by the caller's library (``astype`` / ``to``), as on the
general path.
"""

from __future__ import annotations

import collections
import math
import sys
import threading

import numpy as np

from ..reference.packing import packed_length
from ..schemes import Scheme
from . import _devices
from . import _quantize_kernels as quantize_kernels
from . import launch
from ._elements import format_tuple
from ._scales import MODE_MX, MODE_NVFP4
from ._target import SIMULATOR

_U8, _F32, _U16 = np.dtype(np.uint8), np.dtype(np.float32), np.dtype(np.uint16)
_DUMMY_BYTES = 256  # what an absent array's pointer reads (never, but the kernel takes one)


class DequantPlan:
    """The launches of one dequantize call: the decode kernel over ``shape`` (codes packed
    along the last axis), and for ``bfloat16`` the rounding kernel after it."""

    def __init__(self, sch: Scheme, shape: tuple, bfloat16: bool, threads: int):
        from . import quantize as kq

        self.shape = shape
        self.bfloat16 = bfloat16
        n = math.prod(shape)
        C = shape[-1]
        rows = n // C
        sub = sch.code_bits < 8
        pcols = packed_length(C, sch.code_bits) if sub else C
        mode = kq._mode(sch)
        sc = _U8 if mode in (MODE_MX, MODE_NVFP4) else _F32
        ns = math.prod(sch.scale_shape(shape))
        codes = launch.Ptr("codes", 0, rows * pcols, _U8)
        tail = (launch.Ptr("scales", 0, ns, sc), launch.Ptr("zps", 0, ns if sch.symmetric is False else 1, _U8),
                launch.Ptr("means", 0, ns if sch.centred else 1, _F32), launch.Ptr("tscale", 0, 1, _F32))  # fmt: skip
        units = kq.dequant_units_launch(sch, shape, threads, bfloat16)
        self.aligned = units is not None  # the codes must start 16-byte aligned
        self.direct = units is not None  # the kernel writes the result itself (no float32 scratch for bfloat16)
        if units is not None:
            k, grid, block, geometry, tpr_log2 = units
            out = launch.Ptr("bf16", 0, n, _U16) if bfloat16 else launch.Ptr("f32", 0, n, _F32)
            self.launches = [(k, grid, block, (codes, *geometry, *tail, out, tpr_log2))]
            bfloat16 = False  # (no rounding launch)
        else:
            tpr_log2 = kq._team_log2(C, threads)
            grid = max(1, min(kq._cdiv(rows, threads >> tpr_log2), 1 << 20))
            kernel = quantize_kernels.make_dequant_kernel(mode, format_tuple(sch), sch.symmetric, sub)
            out = launch.Ptr("f32", 0, n, _F32)
            self.launches = [(kernel, grid, threads, (codes, rows, C, pcols, *kq._geo_args(shape, sch.block_for(shape)),
                                                      *tail, out, tpr_log2))]  # fmt: skip
        if bfloat16:
            g = max(1, min(kq._cdiv(n, threads), 1 << 20))
            self.launches.append((quantize_kernels.f32_to_bf16_kernel, g, threads,
                                  (out, launch.Ptr("bf16", 0, n, _U16), n)))
        self.names = ("codes", "scales", "zps", "means", "tscale", "f32", "bf16")
        self._seq = None
        self._seq_built = False
        self._lock = threading.Lock()

    def sequence(self):
        """The compiled launch sequence ``seq(stream, codes, scales, zps, means, tscale, f32,
        bf16)`` (addresses), or None where it cannot be built (simulator, NQDQ_FAST_LAUNCH=0)."""
        if not self._seq_built:
            with self._lock:
                if not self._seq_built:
                    self._seq = None if SIMULATOR else launch.compile_sequence(self.launches, self.names)
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
        bf16 = self.bfloat16
        scratch = 0 if self.direct or not bf16 else 4 * n  # the float32 values ahead of the bfloat16 result
        nbytes = scratch + n * (2 if bf16 else 4)

        def run(codes, scales, zps, tscale, means):
            mp = alloc(nbytes)
            p = mp.ptr
            seq(cur(dev).ptr, codes.data.ptr, scales.data.ptr, DP if zps is None else zps.data.ptr,
                DP if means is None else means.data.ptr, DP if tscale is None else tscale.data.ptr, p,
                p + scratch)  # fmt: skip
            return nd(shape, _U16, mp + scratch) if bf16 else nd(shape, _F32, mp)

        run.dummy = dummy
        return run

    def torch_runner(self, caller):
        """As :meth:`cupy_runner` for PyTorch tensors, on PyTorch's current stream; results
        float32 or torch.bfloat16."""
        seq = self.sequence()
        if seq is None:
            return None
        torch = caller.torch
        dev = _devices.current()
        device = torch.device("cuda", dev)
        dummy = torch.zeros(_DUMMY_BYTES, dtype=torch.uint8, device=device)
        DP = dummy.data_ptr()
        shape, empty, stream = self.shape, torch.empty, caller.stream
        f32, bf16 = torch.float32, (torch.bfloat16 if self.bfloat16 else None)
        direct = self.direct

        def run(codes, scales, zps, tscale, means):
            out = empty(shape, dtype=f32 if bf16 is None else bf16, device=device)
            o = out.data_ptr()
            scratch = None if bf16 is None or direct else empty(shape, dtype=f32, device=device)
            seq(stream(dev), codes.data_ptr(), scales.data_ptr(), DP if zps is None else zps.data_ptr(),
                DP if means is None else means.data_ptr(), DP if tscale is None else tscale.data_ptr(),
                o if scratch is None else scratch.data_ptr(), o)  # fmt: skip
            return out

        run.dummy = dummy
        return run


_PLANS: collections.OrderedDict = collections.OrderedDict()
_PLANS_MAX = 256
_PLANS_LOCK = threading.Lock()


def get_plan(sch: Scheme, shape, bfloat16: bool, threads: int | None = None) -> DequantPlan:
    """The cached :class:`DequantPlan` on the current GPU."""
    from .quantize import THREADS

    nt = threads or THREADS
    key = (sch, tuple(shape), bool(bfloat16), nt, _devices.current())
    plan = _PLANS.get(key)
    if plan is None:
        plan = DequantPlan(sch, tuple(shape), bool(bfloat16), nt)
        with _PLANS_LOCK:
            _PLANS[key] = plan
            while len(_PLANS) > _PLANS_MAX:
                _PLANS.popitem(last=False)
    return plan
