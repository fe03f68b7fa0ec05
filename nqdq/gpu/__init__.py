"""GPU kernels (Numba ``@cuda.jit``; the same source runs in the CUDA simulator and through
numba-hip), in layers:

==================  =====================================================================
``runtime/``        backend (numba-cuda / numba-hip), compile target, devices and streams,
                    array interop, launches, the per-library hot paths
``ptx/``            inline PTX intrinsics, each with its Python twin; ``ptx.mma``: mma.sync,
                    cp.async; ``ptx.wgmma``: wgmma, mbarriers
``device/``         device functions, the twins of ``nqdq.reference``
``quantize/``       quantize / dequantize: the plan and one file per kernel family
``fused/``          the fused ops
``gemm/``           GEMMs on quantized operands
``layouts.py``      tensor-core scale layouts
``cdna4/``          AMD gfx950 (assembled, not run)
==================  =====================================================================

Mirroring ``nqdq.reference`` one to one:

=========================  ==================================================
reference                  GPU
=========================  ==================================================
reference/codec.py         device/codec.py (device functions)
reference/rng.py           device/codec.py (philox4x32_10)
reference/scales.py        device/scales.py (device functions)
reference/packing.py       device/elements.py (store_unit / load_code)
reference/quantize.py      quantize/plan.py, rules.py (launchers); the kernel families beside them
=========================  ==================================================

The launchers are ``nqdq.gpu.quantize.plan.quantize`` / ``.dequantize`` (same signatures as
the reference's). Importing this package does not touch a GPU; kernels compile on first use.

How the kernels stay bit-identical to the reference (checked by ``nqdq.tools.ptx_audit`` on the PTX
for sm_90, and by tests/test_kernels.py in the simulator and on a GPU):

* float32 arithmetic only (``np.float32`` constants; no float64 instruction in any kernel);
  IEEE ``div.rn.f32`` for every division (Numba's default without fast-math), no ``.ftz``;
* no FMA where the reference rounds a product and a sum separately: NVVM contracts
  ``a * b + c`` by default, so such products go through libdevice ``fmul_rn``
  (``mul.rn.f32``, never contracted; the simulator's twin is a plain multiply);
* NaN: amax is a max over the bits of |x| (every NaN is above +inf), so a NaN anywhere in
  a group gives its NaN scale whatever the reduction order; scales store the canonical
  0x7FC00000 as the reference does; an input NaN keeps its own sign through the element
  division (the host FPU's rule, which the GPU's canonical NaN would not follow);
* the centred INT8 mean adds in exactly reference/scales.halving_sum's tree (see device/scales.py);
* stochastic rounding: Philox4x32-10 keyed by the seed, counter = linear index // 4, so the
  bits do not depend on the launch shape.

NaN *payloads* of computed float32 outputs (a NaN group's mean, a dequantized NaN) follow
the FPU that computed them and are not part of the contract (the tests compare them as
"both NaN").
"""
