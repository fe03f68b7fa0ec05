"""Stochastic rounding's integer steps by PTX, with their twins (int64 / uint32 code that a
device compiler and Python compute alike: the simulator runs the Python function, AMD
compiles it). ``device.codec`` (Philox4x32-10, the stochastic element encoders) uses them
and describes the rules; tests/test_amd_twins.py checks the twins and the PTX block's steps.
"""

from __future__ import annotations

import numpy as np

from ..runtime.target import PTX
from ..runtime.target import device_twin as _twin

if PTX:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic


# Used by device.codec (Philox4x32-10, the stochastic element encoders), which describes the rules:
# ``mul_wide_u32`` (one ``mul.wide.u32``: both halves of Philox's product), ``sign_add`` (a
# code's sign by two multiply-adds) and ``sr_e2m1_code_i`` (device.codec's comment above
# ``E2M1_SR_I_KEY``). The twins are int64 / uint32 code that a device compiler and Python
# compute alike (no step leaves the int64 range).
@_twin
def mul_wide_u32_twin(a, b):
    """The 64-bit product of uint32 ``a`` and ``b``."""
    return np.uint64(np.uint64(np.uint32(a)) * np.uint64(np.uint32(b)))


def sign_add_twin(u, mag, bit):
    """mag + bit where float32 bits ``u`` are negative, else mag (a code's sign: mag < bit <= 2^7):
    mag + (u >> 31) * bit, as the PTX computes it (``mul.hi.u32 u, 2`` is u >> 31)."""
    return np.uint32(np.uint32(mag) + np.uint32(np.uint32(u) >> np.uint32(31)) * np.uint32(bit))


def sr_e2m1_code_i_twin(a, r, xb):
    """(code, key): encode_float_sr32's stochastic e2m1 code of q with |q|'s bits ``a``
    (finite, sign clear), random bits ``r`` and q's sign that of the float32 bits ``xb``; the
    code is the spec's where ``key >= device.codec.E2M1_SR_I_KEY``: q = +-0, |q| < 2^-33 or
    |q| >= 2^-10. The PTX's steps in int64 (none leaves [-2^33, 2^35]: m < 2^24, the
    multiplier 2^c <= 2^10, r < 2^32)."""
    a = np.int64(np.uint32(a))
    r = np.int64(np.uint32(r))
    xb = np.int64(np.uint32(xb))
    e1 = np.int64((a >> 23) - 1)
    c = np.int64(min(e1 - 116, 10))
    e2 = np.int64(max(e1 - 126, 0))
    m = np.int64(a - (e1 << 23))  # the significand with its implicit bit (a + 2^23 for ef = 0, where c < 0)
    p = np.int64(0)
    if c >= 0:
        p = np.int64(1) << c  # (shl.b32 gives 0 for c < 0: a shift of 32 or more)
    hi = np.int64((m * p + r) >> 32)
    return np.uint32(min(hi + 2 * e2, 7) + 8 * (xb >> 31)), np.uint32((c + 23) & 0xFFFFFFFF)


_E2M1_SR_PTX = (
    "{.reg .b32 e1, c, e2, m, p, lo, hi, s, z; .reg .b64 d, t; "
    "shr.u32 e1, $2, 23; add.s32 e1, e1, -1; "
    "add.s32 c, e1, -116; min.s32 c, c, 10; "
    "add.s32 e2, e1, -126; max.s32 e2, e2, 0; "
    "mad.lo.s32 m, e1, -8388608, $2; "
    "mov.b32 p, 1; shl.b32 p, p, c; "
    "mov.b32 z, 0; mov.b64 t, {$3, z}; "
    "mad.wide.u32 d, m, p, t; mov.b64 {lo, hi}, d; "
    "mad.lo.u32 hi, e2, 2, hi; min.u32 hi, hi, 7; "
    "mul.hi.u32 s, $4, 2; mad.lo.u32 $0, s, 8, hi; "
    "add.s32 $1, c, 23;}"
)

if PTX:

    @intrinsic
    def mul_wide_u32(typingctx, a, b):
        """mul_wide_u32_twin by one ``mul.wide.u32`` (one IMAD.WIDE.U32: both halves of
        Philox's product, where umulhi32 and a 32-bit multiply are an IMAD.HI and an IMAD)."""

        def codegen(context, builder, sig, args):
            i32, i64 = ir.IntType(32), ir.IntType(64)
            vals = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            asm = ir.InlineAsm(ir.FunctionType(i64, [i32, i32]), "mul.wide.u32 $0, $1, $2;", "=l,r,r")
            return builder.call(asm, vals)

        return types.uint64(a, b), codegen

    @intrinsic
    def sign_add(typingctx, u, mag, bit):
        """sign_add_twin by two multiply-adds (``mul.hi.u32`` by 2, ``mad.lo``: IMAD.HI and IMAD
        on the FMA pipe), where the shift and the LOP3 of ``mag | (u >> k) & bit`` take two ALU
        slots: stochastic rounding's kernels fill the ALU pipe (Philox's xors)."""
        sig = types.uint32(u, mag, bit)

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            vals = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            asm = ir.InlineAsm(ir.FunctionType(i32, [i32] * 3),
                               "{.reg .b32 s; mul.hi.u32 s, $1, 2; mad.lo.u32 $0, s, $3, $2;}", "=r,r,r,r")
            return builder.call(asm, vals)

        return sig, codegen

    @intrinsic
    def sr_e2m1_code_i(typingctx, a, r, xb):
        """sr_e2m1_code_i_twin by one inline-PTX block (shl, mad.wide.u32 and multiply-adds)."""
        sig = types.UniTuple(types.uint32, 2)(a, r, xb)

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            vals = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            fty = ir.FunctionType(ir.LiteralStructType([i32, i32]), [i32] * 3)
            res = builder.call(ir.InlineAsm(fty, _E2M1_SR_PTX, "=r,=r,r,r,r"), vals)
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, 0),
                                                                 builder.extract_value(res, 1)])

        return sig, codegen

else:
    mul_wide_u32 = mul_wide_u32_twin
    sign_add = _twin(sign_add_twin)
    sr_e2m1_code_i = _twin(sr_e2m1_code_i_twin)
