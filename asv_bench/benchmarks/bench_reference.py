"""CPU (NumPy reference) quantize and dequantize of float32 tensors: 1024x1024, and a
4096x7168 weight, where the encode's temporaries outgrow the caches (the reference encodes
and draws random bits 2^16 elements at a time for that reason: reference/codec.in_chunks).

The reference is the spec, and the CPU path of NumPy input: its speed decides how long the
test suite, ``nqdq report`` and a CPU user's calls take, so it is tracked too. GPU kernels
get their own files.
"""

import numpy as np

import nqdq

SHAPES = {"1024x1024": (1024, 1024), "4096x7168": (4096, 7168)}

# benchmark parameter -> nqdq.quantize arguments
SCHEMES = {
    "fp8_row": dict(scheme="fp8_row"),
    "fp8_128x128": dict(scheme="fp8_128x128"),
    "mxfp4": dict(scheme="mxfp4"),
    "nvfp4": dict(scheme="nvfp4"),
    "int8_asym": dict(scheme="int8", granularity="row", symmetric=False),
}


def _input(shape):
    rng = np.random.default_rng(0)
    return (rng.standard_normal(shape) * np.exp(rng.normal(0, 0.5, (shape[0], 1)))).astype(np.float32)


class TimeReferenceQuantize:
    params = (list(SCHEMES), list(SHAPES))
    param_names = ["scheme", "shape"]

    def setup(self, scheme, shape):
        self.x = _input(SHAPES[shape])
        self.kwargs = dict(SCHEMES[scheme], device="cpu")
        self.q = nqdq.quantize(self.x, **self.kwargs)  # warm-up
        nqdq.dequantize(self.q)

    def time_quantize(self, scheme, shape):
        nqdq.quantize(self.x, **self.kwargs)

    def time_dequantize(self, scheme, shape):
        nqdq.dequantize(self.q)

    def track_bits_per_value(self, scheme, shape):
        return self.q.bits_per_value

    track_bits_per_value.unit = "bits"
