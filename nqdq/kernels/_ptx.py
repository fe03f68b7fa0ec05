"""NVIDIA-only inline PTX, each with its portable twin.

``cvt_fp8(v, fmt)``: the float8 code of float32 ``v`` by one ``cvt.rn.satfinite.e4m3x2.f32``
(or ``.e5m2x2``) instruction, sm_89 and newer. It rounds to nearest even and saturates
finite values and +-inf to +-max, exactly as the bit-manipulation encoder
(``_codec.encode_float_rne``) does; only NaN differs (the instruction writes a canonical
NaN, the spec keeps the NaN's sign), so NaN lanes are fixed up after it.

The twin (``_codec.encode_float_rne``) is what the CUDA simulator, numba-hip and GPUs older
than sm_89 run; ``tests/test_kernels.py::test_fp8_cvt_matches_twin`` compares the two on a
GPU over every bfloat16 value and random float32 bit patterns.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from ._target import SIMULATOR

E4M3 = 4  # fmt[8] (exponent bits) of the formats the instruction covers
E5M2 = 5


@functools.lru_cache(maxsize=None)
def fp8_cvt_available() -> bool:
    """Whether kernels built now may use the cvt instruction: not in the simulator, not
    disabled by NQDQ_FP8_CVT=0, and the current GPU is sm_89+ (with no GPU, compile-only
    tools such as the PTX audit target sm_90: yes)."""
    if SIMULATOR or os.environ.get("NQDQ_FP8_CVT", "1") == "0":
        return False
    from numba import cuda

    try:
        if not cuda.is_available():
            return True
        return tuple(cuda.get_current_device().compute_capability) >= (8, 9)
    except Exception:  # pragma: no cover - no driver: compile-only
        return True


def fp8_cvt_supports(fmt) -> bool:
    """The element format is e4m3fn (max 448) or e5m2 (max 57344), 8 bits, saturating."""
    return fmt[0] == 1 and fmt[5] == 8 and ((fmt[8] == E4M3 and fmt[1] == 3) or (fmt[8] == E5M2 and fmt[1] == 2))


if not SIMULATOR:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    def _cvt_intrinsic(ptx_type):
        @intrinsic
        def _cvt(typingctx, v):
            sig = types.uint16(types.float32)

            def codegen(context, builder, sig, args):
                fty = ir.FunctionType(ir.IntType(16), [ir.FloatType(), ir.FloatType()])
                # d = {hi: a, lo: b}; a = 0 so the low byte is v's code and the high byte 0
                asm = ir.InlineAsm(fty, f"cvt.rn.satfinite.{ptx_type}.f32 $0, $1, $2;", "=h,f,f")
                return builder.call(asm, [ir.Constant(ir.FloatType(), 0.0), args[0]])

            return sig, codegen

        return _cvt

    cvt_e4m3 = _cvt_intrinsic("e4m3x2")
    cvt_e5m2 = _cvt_intrinsic("e5m2x2")
else:  # pragma: no cover - the simulator never calls these (fp8_cvt_available() is False)
    cvt_e4m3 = cvt_e5m2 = None

_ = np


# ----------------------------------------------------------------------------- addresses
if not SIMULATOR:

    @intrinsic
    def array_addr(typingctx, a):
        """The device address of array ``a``'s first element (to test alignment before
        reading it through a wider view)."""
        sig = types.uint64(a)

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            return builder.ptrtoint(ary.data, ir.IntType(64))

        return sig, codegen

else:

    def array_addr(a):
        """Simulator twin: NumPy views need no alignment, so report an aligned address."""
        return 0
