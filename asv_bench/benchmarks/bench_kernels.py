"""GPU kernels: quantization on CuPy arrays, and the host cost of one kernel launch.

Every benchmark needs CuPy and a CUDA GPU; without them ``setup`` raises
NotImplementedError, which asv reports as skipped. ``setup`` does the warm-up (kernel
compilation, module load, CuPy's memory pool), and each timed call synchronizes the device,
so a time is one complete quantization (or launch), not the time to queue it.

The quantizer is ``nqdq.quantize`` when it accepts CuPy arrays, else the kernels' launcher
``nqdq.gpu.quantize.plan.quantize`` (bf16 given as uint16 bits) while the API has no GPU
path yet. Peer comparisons (Triton, torch.compile, copy bandwidth) are in
``benchmarks/peers.py``, which times with CUDA events instead.
"""

import sys
from pathlib import Path

import numpy as np

from ._gpu import bf16_bits, cupy_or_skip

SCHEMES = ["fp8_row", "fp8_tensor", "mxfp8", "mxfp4", "nvfp4", "fp8_1x128", "int8_column"]
SHAPES = ["64x7168", "8192x8192"]


def _quantizer(scheme, seed=None):
    """``x_uint16 -> quantized`` on the GPU, or NotImplementedError; ``seed``: stochastic
    rounding with that seed."""
    import ml_dtypes

    import nqdq

    kw = {} if seed is None else dict(rounding="stochastic", seed=seed)
    try:
        import cupy as cp

        nqdq.quantize(cp.ones((1, 128), np.uint16).view(ml_dtypes.bfloat16), scheme, **kw)
        return lambda x: nqdq.quantize(x.view(ml_dtypes.bfloat16), scheme, **kw)
    except Exception:
        pass
    try:
        from nqdq.gpu.quantize.plan import quantize as launcher
        from nqdq.schemes import resolve_scheme
    except Exception as e:
        raise NotImplementedError(f"this nqdq has no GPU quantize ({type(e).__name__})") from None
    sch = resolve_scheme(scheme)
    return lambda x: launcher(x, sch, dtype="bfloat16", seed=seed)


class TimeQuantizeGPU:
    params = (SCHEMES, SHAPES)
    param_names = ["scheme", "shape"]
    timeout = 300
    seed = None  # (stochastic rounding's seed: TimeQuantizeStochasticGPU)

    def setup(self, scheme, shape):
        self.cp = cupy_or_skip()
        rows, cols = (int(v) for v in shape.split("x"))
        self.x = bf16_bits(self.cp, (rows, cols))
        self.run = _quantizer(scheme, self.seed)
        self.run(self.x)  # warm-up: compile and load every kernel the scheme uses
        self.cp.cuda.runtime.deviceSynchronize()

    def time_quantize(self, scheme, shape):
        self.run(self.x)
        self.cp.cuda.runtime.deviceSynchronize()


class TimeQuantizeAmaxGPU:
    """A given tensor scale with and without the amax by-product (``amax_out``, delayed
    scaling): the by-product's cost is the difference."""

    params = (["fp8_tensor", "nvfp4"], [False, True], ["8192x8192"])
    param_names = ["scheme", "amax_out", "shape"]
    timeout = 300

    def setup(self, scheme, amax_out, shape):
        import nqdq

        self.cp = cupy_or_skip()
        rows, cols = (int(v) for v in shape.split("x"))
        x = bf16_bits(self.cp, (rows, cols))
        kw = dict(scale=0.05 if scheme == "fp8_tensor" else 0.001, dtype="bfloat16")
        if amax_out:
            kw["amax_out"] = self.cp.zeros(1, self.cp.float32)
        self.run = lambda: nqdq.quantize(x, scheme, **kw)
        self.run()
        self.cp.cuda.runtime.deviceSynchronize()

    def time_quantize(self, scheme, amax_out, shape):
        self.run()
        self.cp.cuda.runtime.deviceSynchronize()


class TimeQuantizeStochasticGPU(TimeQuantizeGPU):
    """Stochastic rounding (seed 1) through the last-axis kernels' stochastic variants: Philox
    bits and the 32-bit encoder per element."""

    params = (["fp8_row", "int8_row", "mxfp8", "mxfp4", "nvfp4"], ["8192x8192"])
    seed = 1


class TimeLaunch:
    """One launch of a small per-row FP8 kernel (benchmarks/launch_overhead.py's fp8_row_bf16,
    64x7168 bf16), through Numba's dispatcher and through nqdq.gpu.runtime.launch.FastKernel."""

    params = ["numba", "fastkernel", "prepared", "graph"]
    param_names = ["path"]

    def setup(self, path):
        cp = self.cp = cupy_or_skip()
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
        import launch_overhead

        from nqdq.gpu.runtime.launch import FastKernel

        x = bf16_bits(cp, (64, 7168))
        self.codes = cp.empty((64, 7168), cp.uint8)
        self.scales = cp.empty(64, cp.float32)
        grid, block, args = launch_overhead.launch_args(x, self.codes, self.scales)
        self.keep = (x, args)
        kernel = launch_overhead.fp8_row_bf16
        fk = FastKernel(kernel)
        if path == "numba":
            self.fn = lambda: kernel[grid, block](*args)
        elif path == "fastkernel":
            self.fn = lambda: fk.launch(grid, block, args)
        elif path == "prepared":
            self.fn = fk.prepare(grid, block, args)
        else:
            fk.compile(args)
            self.stream = cp.cuda.Stream(non_blocking=True)
            with self.stream:
                self.stream.begin_capture()
                fk.launch(grid, block, args)
                graph = self.stream.end_capture()
            self.fn = lambda: graph.launch(self.stream)
        for _ in range(3):
            self.fn()
        cp.cuda.runtime.deviceSynchronize()

    def time_launch(self, path):
        self.fn()
        self.cp.cuda.runtime.deviceSynchronize()
