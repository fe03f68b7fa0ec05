"""CPU (NumPy reference) quantize and dequantize of a 1024x1024 float32 tensor.

The reference is the spec, not the fast path, but its speed decides how long the test
suite and ``nqdq report`` take, so it is tracked too. GPU kernels get their own files.
"""

import numpy as np

import nqdq

SHAPE = (1024, 1024)

# benchmark parameter -> nqdq.quantize arguments
SCHEMES = {
    "fp8_row": dict(scheme="fp8_row"),
    "fp8_128x128": dict(scheme="fp8_128x128"),
    "mxfp4": dict(scheme="mxfp4"),
    "nvfp4": dict(scheme="nvfp4"),
    "int8_asym": dict(scheme="int8", granularity="row", symmetric=False),
}


def _input():
    rng = np.random.default_rng(0)
    return (rng.standard_normal(SHAPE) * np.exp(rng.normal(0, 0.5, (SHAPE[0], 1)))).astype(np.float32)


class TimeReferenceQuantize:
    params = list(SCHEMES)
    param_names = ["scheme"]

    def setup(self, scheme):
        self.x = _input()
        self.kwargs = dict(SCHEMES[scheme], device="cpu")
        self.q = nqdq.quantize(self.x, **self.kwargs)  # warm-up
        nqdq.dequantize(self.q)

    def time_quantize(self, scheme):
        nqdq.quantize(self.x, **self.kwargs)

    def time_dequantize(self, scheme):
        nqdq.dequantize(self.q)

    def track_bits_per_value(self, scheme):
        return self.q.bits_per_value

    track_bits_per_value.unit = "bits"
