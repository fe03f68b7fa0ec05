"""Fused ops (nqdq.fused) on CuPy arrays, bf16 [8192, 7168], beside the unfused nqdq pair
(``nqdq.fused.rmsnorm`` then ``nqdq.quantize``); and the NumPy spec on a small input.

The GPU benchmarks need CuPy and a CUDA GPU; without them ``setup`` raises
NotImplementedError, which asv reports as skipped. ``setup`` does the warm-up (kernel
compilation), and each timed call synchronizes the device. Copy bandwidth and CUDA-event
timings are in ``benchmarks/fused_peers.py``.
"""

import numpy as np

from ._gpu import bf16_bits, cupy_or_skip

SCHEMES = ["fp8_row", "fp8_tensor", "fp8_1x128", "mxfp4"]
ROWS, HIDDEN = 8192, 7168


def _scale(scheme):
    return 0.02 if scheme == "fp8_tensor" else None


class TimeRMSNormQuantizeGPU:
    params = (SCHEMES, [False, True])
    param_names = ["scheme", "residual"]
    timeout = 300

    def setup(self, scheme, residual):
        self.cp = cupy_or_skip()
        from nqdq import fused

        self.fused = fused
        self.x = bf16_bits(self.cp, (ROWS, HIDDEN), 1)
        self.w = bf16_bits(self.cp, (HIDDEN,), 2)
        self.r = bf16_bits(self.cp, (ROWS, HIDDEN), 3) if residual else None
        self.time_fused(scheme, residual)  # warm-up: compile
        self.time_unfused(scheme, residual)

    def time_fused(self, scheme, residual):
        self.fused.rmsnorm_quantize(self.x, self.w, scheme, residual=self.r, scale=_scale(scheme), dtype="bfloat16")
        self.cp.cuda.runtime.deviceSynchronize()

    def time_unfused(self, scheme, residual):
        import nqdq

        y = self.fused.rmsnorm(self.x, self.w, residual=self.r, dtype="bfloat16")
        nqdq.quantize(y[0] if residual else y, scheme, scale=_scale(scheme))
        self.cp.cuda.runtime.deviceSynchronize()


class TimeFlattenMoEGPU:
    params = (["flatten fp8_1x128", "flatten mxfp4", "moe_sort mxfp4", "moe_sort mxfp4 all rows",
               "moe_sort mxfp4 decode"],)
    param_names = ["op"]
    timeout = 300

    def setup(self, op):
        self.cp = cupy_or_skip()
        from nqdq import fused

        self.fused = fused
        # [H, rows, 128] seen as a [rows, H, 128] view: the strided flatten
        self.xt = bf16_bits(self.cp, (HIDDEN // 128, ROWS, 128), 4).transpose(1, 0, 2)
        # the MoE tokens: ROWS / 4 top-4 (ROWS gathered rows out), "all rows": ROWS (x as the other
        # ops'), "decode": 64 top-8 (one launch, no sort before it: gpu.fused.moe.local_path)
        t = ROWS if op.endswith("all rows") else 64 if op.endswith("decode") else ROWS // 4
        k = 8 if op.endswith("decode") else 4
        self.tok = bf16_bits(self.cp, (t, HIDDEN), 5)
        rng = np.random.default_rng(6)
        self.ids = self.cp.asarray(np.stack([rng.permutation(256)[:k] for _ in range(t)]).astype(np.int32))
        self.time_op(op)

    def time_op(self, op):
        if op.startswith("flatten"):
            self.fused.flatten_quantize(self.xt, op.split()[1], dtype="bfloat16")
        else:
            self.fused.moe_sort_quantize(self.tok, self.ids, 256, "mxfp4", dtype="bfloat16")
        self.cp.cuda.runtime.deviceSynchronize()


class TimeReferenceFused:
    """The NumPy spec (float-float RMSNorm + quantize) on a small input."""

    params = (["fp8_row", "mxfp4"],)
    param_names = ["scheme"]

    def setup(self, scheme):
        import ml_dtypes

        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((64, HIDDEN)).astype(ml_dtypes.bfloat16)
        self.w = rng.standard_normal(HIDDEN).astype(ml_dtypes.bfloat16)

    def time_rmsnorm_quantize(self, scheme):
        from nqdq import fused

        fused.rmsnorm_quantize(self.x, self.w, scheme)
