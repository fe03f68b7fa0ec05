"""AMD CDNA4 (gfx950) block-scaled GEMM through LLVM intrinsics -- assembled for gfx950,
not run (no gfx950 at hand; docs/design/cdna4-gemm.md says what running it would take).

=====================  =====================================================================
module                 what it holds
=====================  =====================================================================
operands.py            the instructions' operand layouts (lanes, registers, scales,
                       accumulators, format codes) per shape, and where each fact comes from
mfma_twin.py           Python twins of ``v_mfma_scale_f32_{32x32x64,16x16x128}_f8f6f4``
cvt_twin.py            Python twins of ``v_cvt_scalef32_pk_{fp4,fp8,bf8}_f32`` and their IR
gemm_ir.py             LLVM IR generator of the GEMM kernels (one wavefront per 32 x 32 tile:
                       one 32x32x64 or 2 x 2 16x16x128 instructions per K step)
gemm_twin.py           NumPy twin of those kernels' data movement + the float64 reference
assemble.py            llvmlite compile for gfx950 in a subprocess, code object statistics
=====================  =====================================================================

Importing this package needs neither llvmlite nor ROCm; only :mod:`.assemble` runs LLVM,
and in a child process.
"""
