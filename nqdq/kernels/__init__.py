"""GPU kernels (Numba ``@cuda.jit``; the same source runs in the CUDA simulator and through
numba-hip), mirroring ``nqdq.reference`` one to one:

=========================  ==================================
reference                  kernels
=========================  ==================================
reference/codec.py         _codec.py (device functions)
reference/rng.py           _codec.py (philox4x32_10)
reference/scales.py        _scales.py (device functions)
reference/packing.py       _elements.py (store_unit / load_code)
reference/quantize.py      quantize.py (launchers), _quantize_kernels.py (bodies)
=========================  ==================================

The launchers are ``nqdq.kernels.quantize.quantize`` / ``.dequantize`` (same signatures as
the reference's). Importing this package does not touch a GPU; kernels compile on first use.
"""
