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


# ----------------------------------------------------------------------------- wide memory access
# The last-axis kernels (_rowwise_kernels) move 16 bytes of input per load and 8 bytes of
# codes per store: one instruction where Numba's element indexing would issue 4-8. On a GPU
# these are PTX vector instructions; the twins (simulator, numba-hip) index the arrays.
# Callers guarantee alignment: the input's address is tested (array_addr(x) & 15) and the
# codes array is one the plan allocated (CuPy / Numba allocations are 256-byte aligned).
# ``fp8x2``: two float8 codes by one cvt (sm_89+), the pair form of cvt_e4m3 / cvt_e5m2.
if not SIMULATOR:
    from numba.core import cgutils

    def _elem_ptr(context, builder, aryty, ary, idx, idxty):
        arr = context.make_array(aryty)(context, builder, ary)
        i64 = context.cast(builder, idx, idxty, types.int64)
        return builder.gep(arr.data, [i64])

    @intrinsic
    def load_u32x4(typingctx, a, i):
        """Words 4*i .. 4*i + 3 of the uint32 array ``a`` (16-byte aligned) by one
        ``ld.global.nc.v4.u32``: the input is read-only for the kernel's lifetime."""
        sig = types.UniTuple(types.uint32, 4)(a, i)

        def codegen(context, builder, sig, args):
            i4 = builder.mul(context.cast(builder, args[1], sig.args[1], types.int64), ir.Constant(ir.IntType(64), 4))
            ptr = _elem_ptr(context, builder, sig.args[0], args[0], i4, types.int64)
            i32 = ir.IntType(32)
            fty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [ptr.type])
            asm = ir.InlineAsm(fty, "ld.global.nc.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l")
            res = builder.call(asm, [ptr])
            vals = [builder.extract_value(res, k) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    @intrinsic
    def store_u32x2(typingctx, a, i, w0, w1):
        """Words 2*i and 2*i + 1 of the uint32 array ``a`` (8-byte aligned) := w0, w1, by one
        ``st.global.v2.u32``."""
        sig = types.void(a, i, types.uint32, types.uint32)

        def codegen(context, builder, sig, args):
            i2 = builder.mul(context.cast(builder, args[1], sig.args[1], types.int64), ir.Constant(ir.IntType(64), 2))
            ptr = _elem_ptr(context, builder, sig.args[0], args[0], i2, types.int64)
            i32 = ir.IntType(32)
            fty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32])
            asm = ir.InlineAsm(fty, "st.global.v2.u32 [$0], {$1, $2};", "l,r,r", side_effect=True)
            builder.call(asm, [ptr, args[2], args[3]])
            return context.get_dummy_value()

        return sig, codegen

    def _cvt_pair_intrinsic(ptx_type):
        @intrinsic
        def _cvt2(typingctx, hi, lo):
            sig = types.uint32(types.float32, types.float32)

            def codegen(context, builder, sig, args):
                fty = ir.FunctionType(ir.IntType(16), [ir.FloatType(), ir.FloatType()])
                asm = ir.InlineAsm(fty, f"cvt.rn.satfinite.{ptx_type}.f32 $0, $1, $2;", "=h,f,f")
                return builder.zext(builder.call(asm, [args[0], args[1]]), ir.IntType(32))

            return sig, codegen

        return _cvt2

    cvt_e4m3x2 = _cvt_pair_intrinsic("e4m3x2")  # (code(hi) << 8) | code(lo), NaN canonical
    cvt_e5m2x2 = _cvt_pair_intrinsic("e5m2x2")
    _ = cgutils
else:

    def load_u32x4(a, i):
        """Simulator twin: four consecutive words."""
        j = 4 * int(i)
        return (a[j], a[j + 1], a[j + 2], a[j + 3])

    def store_u32x2(a, i, w0, w1):
        """Simulator twin: two consecutive words."""
        j = 2 * int(i)
        a[j] = w0
        a[j + 1] = w1

    cvt_e4m3x2 = cvt_e5m2x2 = None  # the simulator never calls these (fp8_cvt_available() is False)
