"""Tensor-core GEMMs with fused dequantization (nqdq.matmul) on CuPy operands.

Needs CuPy and a CUDA GPU; without them ``setup`` raises NotImplementedError (asv: skipped).
``setup`` quantizes random inputs on the GPU and runs the product once (compilation,
module load, memory pool); each timed call is one ``nqdq.matmul.matmul`` call including its
Python argument checks, synchronized. Kernel-only timings beside cuBLASLt are in
``benchmarks/gemm_peers.py`` (CUDA events).
"""

import numpy as np

from ._gpu import cupy_or_skip

CASES = [("int8_row", "int8_row"), ("fp8_row", "fp8_row"), ("fp8_1x128", "fp8_128x128"), ("mxfp8", "mxfp8"),
         ("mxfp8", "mxfp4"), ("nvfp4", "nvfp4")]
WEIGHTS = ["int4_group", "int4_asym", "int8_row", "mxfp4", "nvfp4"]  # the weight-only matmul(x, qw), x bfloat16
WEIGHT_SHAPES = ["1x14336x4096", "16x14336x4096", "128x14336x4096"]
SHAPES = ["4096x4096x4096", "128x14336x4096"]


def _inputs(shape):
    """(cupy, x [M, K], w [N, K]) of random float32 for shape "MxNxK" (skips without a GPU)."""
    cp = cupy_or_skip()
    M, N, K = (int(v) for v in shape.split("x"))
    rng = cp.random.default_rng(0)
    return cp, rng.standard_normal((M, K), dtype=cp.float32), rng.standard_normal((N, K), dtype=cp.float32) * np.float32(0.05)


class TimeMatmul:
    params = (CASES, SHAPES)
    param_names = ["schemes", "MxNxK"]

    def setup(self, schemes, shape):
        import nqdq

        cp, x, w = _inputs(shape)
        self.qa, self.qb = nqdq.quantize(x, schemes[0]), nqdq.quantize(w, schemes[1])
        self.matmul, self.cp = nqdq.matmul, cp
        self.matmul(self.qa, self.qb, "bfloat16")
        cp.cuda.Device().synchronize()

    def time_matmul_bf16(self, schemes, shape):
        self.matmul(self.qa, self.qb, "bfloat16")
        self.cp.cuda.Device().synchronize()


class TimeMatmulWeightOnly:
    """``matmul(x, qw)`` with a bfloat16 x (uint16 bits, ``dtype="bfloat16"``) at decode sizes."""

    params = (WEIGHTS, WEIGHT_SHAPES)
    param_names = ["weights", "MxNxK"]

    def setup(self, weights, shape):
        import nqdq

        cp, x, w = _inputs(shape)
        self.x = (x.view(cp.uint32) >> 16).astype(cp.uint16)  # bfloat16 bits
        self.qw = nqdq.quantize(w, weights)
        self.matmul, self.cp = nqdq.matmul, cp
        self.matmul(self.x, self.qw, "bfloat16", dtype="bfloat16")
        cp.cuda.Device().synchronize()

    def time_matmul_bf16(self, weights, shape):
        self.matmul(self.x, self.qw, "bfloat16", dtype="bfloat16")
        self.cp.cuda.Device().synchronize()
