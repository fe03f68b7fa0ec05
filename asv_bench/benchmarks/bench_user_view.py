"""nqdq as its users call it: back-to-back calls from CuPy, PyTorch and JAX arrays.

Each timed call queues ``CALLS`` calls on the caller's own arrays (bfloat16 and float16) and
synchronizes the device once, so host work and hidden waits count as they do in a user's
program; asv divides nothing: a time is ``CALLS`` calls. ``benchmarks/user_view.py`` prints
the same cases beside the device-only figure and the copy bandwidth. Without CuPy and a GPU,
or without the caller's library, ``setup`` raises NotImplementedError (skipped).
"""

import numpy as np

from ._gpu import cupy_or_skip

CALLS = 100


def _array(lib, shape, dtype, seed):
    import ml_dtypes

    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    host = x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    try:
        if lib == "cupy":
            import cupy

            return cupy.asarray(host.view(np.uint16) if dtype == "bfloat16" else host)
        if lib == "torch":
            import torch

            t = torch.from_numpy(host.view(np.int16) if dtype == "bfloat16" else host).cuda()
            return t.view(torch.bfloat16) if dtype == "bfloat16" else t
        import jax

        return jax.device_put(host)
    except ImportError as e:
        raise NotImplementedError(f"{lib} is not installed") from e


class TimeUserView:
    params = (["cupy", "torch", "jax"], ["bfloat16", "float16"], ["fp8_row", "nvfp4", "mxfp4"],
              ["quantize", "dequantize"], ["64x7168", "8192x8192"])  # fmt: skip
    param_names = ["library", "dtype", "scheme", "op", "shape"]
    timeout = 300

    def setup(self, lib, dtype, scheme, op, shape):
        import nqdq

        self.cp = cupy_or_skip()
        rows, cols = (int(v) for v in shape.split("x"))
        x = _array(lib, (rows, cols), dtype, seed=1)
        kw = {"dtype": "bfloat16"} if lib == "cupy" and dtype == "bfloat16" else {}
        if op == "quantize":
            self.arg, self.fn = x, lambda a: nqdq.quantize(a, scheme, **kw)
        else:
            self.arg, self.fn = nqdq.quantize(x, scheme, **kw), lambda q: nqdq.dequantize(q, dtype)
        for _ in range(3):  # warm-up: plans, compilation, the remembered runners
            self.fn(self.arg)
        self.cp.cuda.runtime.deviceSynchronize()

    def time_calls(self, lib, dtype, scheme, op, shape):
        fn, a = self.fn, self.arg
        for _ in range(CALLS):
            fn(a)
        self.cp.cuda.runtime.deviceSynchronize()
