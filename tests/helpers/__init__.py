"""Helpers shared by several test files (``from helpers.kernels import check``: pytest puts
tests/ on ``sys.path``, as for the test files themselves). A test file imports from here,
never from another test file.

* ``spec``: the format spec cards written out by hand, an exact rounding oracle, mismatch reports.
* ``data``: inputs (edge values, per-channel edge data, activations, MoE expert ids).
* ``kernels``: the quantize kernels against the reference, bit for bit, and the plans' kernels.
* ``encoders``: probe values for the element encoders' and intrinsics' twins.
* ``probes``: small kernels that run an intrinsic or device function (simulator and GPU).
* ``ptx``: a script run outside the CUDA simulator (compiles and assembles without a GPU).
* ``gemm``: the GEMM's scheme pairs, error measure and launcher arguments.
* ``launch``: stand-ins for CuPy arrays, launch entries and the driver launch.
* ``toy_fp8_row``: a small per-row FP8 kernel of its own for the launch path's tests.
* ``gpu``: the GPU test modules' gate and checks on a real GPU (CuPy arrays).
"""
