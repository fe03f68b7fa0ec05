"""NVIDIA-only inline PTX, each intrinsic with its portable twin, one instruction family a
module:

* ``convert``: float conversions (fp8 by ``cvt.rn.satfinite.e4m3x2`` / ``.e5m2x2``, bfloat16 /
  float16 pairs by ``cvt.rn.bf16x2.f32`` / ``.f16x2.f32``) and the exact rounding helpers
  their twins share with the pair arithmetic;
* ``memory``: addresses, word views, wide and ordered loads and stores, the L2 prefetch;
* ``pairs``: arithmetic on 16-bit pairs in a 32-bit word (``*.bf16x2``, ``*.u16x2``,
  ``prmt``) and the float32 max of magnitudes on bit patterns;
* ``cluster``: thread-block cluster barriers, mbarriers and ``st.async`` (sm_90+);
* ``griddep``: programmatic dependent launch (``griddepcontrol``, sm_90+);
* ``stochastic``: stochastic rounding's integer steps (``mul.wide.u32``, the e2m1 code block);
* ``mma``: tensor-core MMA (``mma.sync``), ldmatrix and cp.async (the GEMM kernels');
* ``wgmma``: sm_90a's warpgroup MMA, the mbarriers of its warp-specialised ring, ``setmaxnreg``;
* ``mma_blockscale``: sm_120a's block-scaled ``mma.sync`` (assembled, not run).

Selection: each inline-PTX intrinsic is defined where ``runtime.target.PTX`` (numba-cuda); where it
is not, the name is bound to its twin: the Python function itself under the simulator, the
same function compiled as a device function on AMD (numba-hip; ``runtime.target.device_twin``).
On AMD every twin is integer / float32 scalar code that compiles as a device function. The
16-bit pair instructions also have twins in NumPy (``*_twin``: exact over whole arrays, which
the CPU tests call with every bfloat16 value at once), which the simulator keeps;
tests/test_amd_twins.py checks the scalar twins (``*_scalar``) against them.
Intrinsics that emit plain LLVM IR (``array_addr``, ``as_u32``, ``as_u16``) are portable
and stay on both compiled targets. ``_asm`` holds what several families build on (an
element's pointer, an instruction of no operands).
"""
