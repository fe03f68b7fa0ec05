"""Arithmetic on 16-bit pairs in one 32-bit word by PTX (``mul`` / ``add`` / ``min`` /
``max.bf16x2``, ``max`` / ``min.u16x2``, ``prmt.b32``) and the float32 max of magnitudes on bit
patterns (``absmax_nan``: ``max.NaN.f32``), with their twins: NumPy (``*_twin``: exact over
whole arrays; the simulator runs them) and integer scalar code (``*_scalar``: AMD compiles
it; tests/test_amd_twins.py and tests/test_portability.py check it against the NumPy twins).
The exact rounding both share is ``convert``'s (``round_to_half_bits``, ``_pack_rne``).
"""

from __future__ import annotations

import numpy as np

from ..runtime.target import HIP, PTX, devfn
from ..runtime.target import device_twin as _twin
from .convert import _pack_rne, round_to_half_bits

if PTX:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic


# The e2m1 pair encoder of quantize.lastaxis works on two bfloat16 values per 32-bit word
# (element 0 in bits 0-15): ``bf16x2_mul`` / ``bf16x2_add`` (``mul.rn`` / ``add.rn.bf16x2``:
# one IEEE rounding to bfloat16, nearest even, subnormals kept), ``bf16x2_min`` /
# ``bf16x2_max`` (``min`` / ``max.bf16x2``: the non-NaN operand when one is NaN; ``absmul`` /
# ``absmin``: of |a|, ``abs.bf16x2`` first), ``u16x2_max`` / ``u16x2_min`` (``max`` /
# ``min.u16x2``: per 16-bit half, unsigned) and ``prmt`` (``prmt.b32``: byte
# i of the result is byte ``(sel >> 4i) & 7`` of the 8 bytes (b, a), a lowest; the default
# mode, no sign replication). sm_90 has each as one instruction (HMUL2 / HADD2 / HMNMX2 .BF16,
# VIMNMX.U16x2, PRMT). The twins compute in float64 (exact for a sum or product of two
# bfloat16 values, or within far less than half a bfloat16 ulp of it, which cannot create or
# break a tie) and round once; they take NumPy arrays as well as scalars, so the CPU tests
# can run them over every bfloat16 value at once. tests/test_kernels.py::
# test_pair_intrinsics_match_twins compares both on a GPU.
def _bf16_value(h):
    return (np.asarray(h, np.uint64).astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def _pairwise(a, b, op):
    a = np.asarray(a, np.uint64) & 0xFFFFFFFF
    b = np.asarray(b, np.uint64) & 0xFFFFFFFF
    lo = round_to_half_bits(op(_bf16_value(a & 0xFFFF), _bf16_value(b & 0xFFFF)), 8, 7)
    hi = round_to_half_bits(op(_bf16_value(a >> 16), _bf16_value(b >> 16)), 8, 7)
    out = (np.asarray(lo, np.uint64) | (np.asarray(hi, np.uint64) << np.uint64(16))).astype(np.uint32)
    return out if out.ndim else np.uint32(out)


def _nonnan_min(x, y):
    with np.errstate(invalid="ignore"):
        m = np.where((x < y) | ((x == y) & np.signbit(x)), x, y)  # -0 below +0
    return np.where(np.isnan(x), y, np.where(np.isnan(y), x, m))


def _nonnan_max(x, y):
    with np.errstate(invalid="ignore"):
        m = np.where((x > y) | ((x == y) & ~np.signbit(x)), x, y)
    return np.where(np.isnan(x), y, np.where(np.isnan(y), x, m))


def bf16x2_mul_twin(a, b):
    return _pairwise(a, b, np.multiply)


def bf16x2_absmul_twin(a, b):
    """|a| * b (``abs.bf16x2`` then ``mul.rn.bf16x2``; abs clears the sign bits, NaN too)."""
    return _pairwise(np.asarray(a, np.uint64) & 0x7FFF7FFF, b, np.multiply)


def bf16x2_add_twin(a, b):
    return _pairwise(a, b, np.add)


def bf16x2_min_twin(a, b):
    return _pairwise(a, b, _nonnan_min)


def bf16x2_max_twin(a, b):
    return _pairwise(a, b, _nonnan_max)


def bf16x2_absmin_twin(a, b):
    """min(|a|, b) (the sign bits cleared, then ``min.bf16x2``)."""
    return _pairwise(np.asarray(a, np.uint64) & 0x7FFF7FFF, b, _nonnan_min)


def absmax_nan_twin(a, b):
    """max(|a|, |b|) of two float32 bit patterns (``max.NaN.f32`` of the magnitudes): the larger
    magnitude's bits, 0x7FFFFFFF where either is a NaN (|x| bits order as the values do)."""
    a, b = int(a) & 0x7FFFFFFF, int(b) & 0x7FFFFFFF
    if a > 0x7F800000 or b > 0x7F800000:
        return np.uint32(0x7FFFFFFF)
    return np.uint32(max(a, b))


def u16x2_min_twin(a, b):
    a = np.asarray(a, np.uint64) & 0xFFFFFFFF
    b = np.asarray(b, np.uint64) & 0xFFFFFFFF
    out = (np.minimum(a & 0xFFFF, b & 0xFFFF) | (np.minimum(a >> 16, b >> 16) << np.uint64(16))).astype(np.uint32)
    return out if out.ndim else np.uint32(out)


def u16x2_max_twin(a, b):
    a = np.asarray(a, np.uint64) & 0xFFFFFFFF
    b = np.asarray(b, np.uint64) & 0xFFFFFFFF
    lo = np.maximum(a & 0xFFFF, b & 0xFFFF)
    hi = np.maximum(a >> 16, b >> 16)
    out = (lo | (hi << np.uint64(16))).astype(np.uint32)
    return out if out.ndim else np.uint32(out)


def prmt_twin(a, b, sel):
    a = np.asarray(a, np.uint64) & 0xFFFFFFFF
    b = np.asarray(b, np.uint64) & 0xFFFFFFFF
    both = a | (b << np.uint64(32))
    out = np.zeros(np.broadcast(a, b).shape, np.uint64)
    for i in range(4):
        k = (int(sel) >> (4 * i)) & 7
        out |= ((both >> np.uint64(8 * k)) & np.uint64(0xFF)) << np.uint64(8 * i)
    out = out.astype(np.uint32)
    return out if out.ndim else np.uint32(out)


# Scalar twins, which a GPU compiler takes (numba-hip on AMD; tests/test_portability.py
# checks them against the array twins above with numba's CPU jit).
def u16x2_min_scalar(a, b):
    a, b = np.uint32(a), np.uint32(b)
    lo = min(a & np.uint32(0xFFFF), b & np.uint32(0xFFFF))
    hi = min(a >> np.uint32(16), b >> np.uint32(16))
    return np.uint32(lo | (hi << np.uint32(16)))


def u16x2_max_scalar(a, b):
    a, b = np.uint32(a), np.uint32(b)
    lo = max(a & np.uint32(0xFFFF), b & np.uint32(0xFFFF))
    hi = max(a >> np.uint32(16), b >> np.uint32(16))
    return np.uint32(lo | (hi << np.uint32(16)))


def prmt_scalar(a, b, sel):
    both = np.uint64(np.uint32(a)) | (np.uint64(np.uint32(b)) << np.uint64(32))
    out = np.uint64(0)
    for i in range(4):
        k = (np.uint64(sel) >> np.uint64(4 * i)) & np.uint64(7)
        out |= ((both >> (np.uint64(8) * k)) & np.uint64(0xFF)) << np.uint64(8 * i)
    return np.uint32(out)


def absmax_nan_scalar(a, b):
    a, b = np.uint32(a) & np.uint32(0x7FFFFFFF), np.uint32(b) & np.uint32(0x7FFFFFFF)
    if a > np.uint32(0x7F800000) or b > np.uint32(0x7F800000):
        return np.uint32(0x7FFFFFFF)
    return np.uint32(max(a, b))


# Scalar twins of the bfloat16 pair arithmetic, which AMD compiles (tests/test_amd_twins.py
# checks each against the NumPy twins above, as plain Python and compiled by Numba's CPU
# jit: every bfloat16 value of one operand against every exponent of the other).
# Integer arithmetic on the bits only (int64, every value below 2^40), no float: no float
# rounding can intervene (a float32 product of two bfloat16 values is exact only while it
# is normal: below 2^-126 float32 rounds it at 2^-149, bfloat16 at 2^-133, twice in all),
# and no flush-to-zero mode of the target's FPU can apply. The exact result is formed as an
# integer significand m and an exponent e (value m * 2^e), plus a sticky bit where an
# addend's low bits had to be dropped, and rounded once by ``_pack_rne`` (``convert``):
#
# * mul: m = ma * mb < 2^16, e = ea + eb: exact.
# * add: |x| >= |y| (swapped so), the pair aligned in a frame of G = 10 guard bits below x's
#   significand: X = mx << G in units of 2^-G of x's last bit, y's exponent d below x's. For
#   d <= G, Y = my << (G - d) and S = X +- Y is exact. For d > G, Y = my >> (d - G) keeps y's
#   bits down to the frame's unit and the rest sets the sticky bit s: the exact sum is
#   (X + Y + f) or (X - Y - f) units with
#   0 <= f < 1, f > 0 iff s, i.e. S = X + Y or X - Y - s units plus a fraction that is
#   nonzero iff s. Then x is normal (d > 0), X >= 2^17 and Y < 2^7, so S >= 2^16 and the
#   rounding drops at least 9 bits (S's bit length less 8): a fraction below S's last unit
#   decides only a tie, and only as "above half" (round-to-nearest-even with a sticky bit).
# * NaN operands give the canonical NaN 0x7FFF (CUDART_NAN_BF16), inf - inf and 0 * inf too,
#   as the NumPy twins do (tests/test_kernels_gpu.py checks those against the instructions);
#   an exact zero sum is +0 unless both addends are -0 (IEEE 754, round to nearest); min / max
#   return the non-NaN operand (0x7FFF where both are NaN), -0 below +0.
@_twin
def _bf16_mul_half(x, y):
    """mul.rn of two bfloat16 bit patterns (ints below 2^16)."""
    x, y = np.int64(x), np.int64(y)
    s = (x ^ y) & 0x8000
    ax, ay = x & 0x7FFF, y & 0x7FFF
    if ax > 0x7F80 or ay > 0x7F80:
        return np.int64(0x7FFF)
    if ax == 0x7F80 or ay == 0x7F80:
        if ax == 0 or ay == 0:
            return np.int64(0x7FFF)  # 0 * inf
        return np.int64(s | 0x7F80)
    if ax == 0 or ay == 0:
        return np.int64(s)
    ex, ey = ax >> 7, ay >> 7
    mx = (ax & 0x7F) | (0x80 if ex != 0 else 0)
    my = (ay & 0x7F) | (0x80 if ey != 0 else 0)
    return np.int64(s | _pack_rne(mx * my, max(ex, 1) + max(ey, 1) - 268, 0, 7, 8))


@_twin
def _bf16_add_half(x, y):
    """add.rn of two bfloat16 bit patterns (ints below 2^16)."""
    x, y = np.int64(x), np.int64(y)
    ax, ay = x & 0x7FFF, y & 0x7FFF
    if ax > 0x7F80 or ay > 0x7F80:
        return np.int64(0x7FFF)
    if ax == 0x7F80 or ay == 0x7F80:
        if ax == ay and ((x ^ y) & 0x8000) != 0:
            return np.int64(0x7FFF)  # inf - inf
        return x if ax == 0x7F80 else y
    if ax < ay:
        x, y, ax, ay = y, x, ay, ax
    if ay == 0:
        return np.int64(x & y) if ax == 0 else x  # (+-0) + (+-0): -0 only for -0 + -0
    ex, ey = ax >> 7, ay >> 7
    mx = (ax & 0x7F) | (0x80 if ex != 0 else 0)
    my = (ay & 0x7F) | (0x80 if ey != 0 else 0)
    ex, ey = max(ex, 1), max(ey, 1)
    d = ex - ey
    big = mx << 10  # G = 10 guard bits
    sticky = np.int64(0)
    if d <= 10:
        small = my << (10 - d)
    else:
        k = min(d - 10, 16)
        small = my >> k
        sticky = np.int64(1 if (my & ((1 << k) - 1)) != 0 else 0)
    if ((x ^ y) & 0x8000) != 0:
        total = big - small - sticky
    else:
        total = big + small
    if total == 0:
        return np.int64(0)  # x - x = +0
    return np.int64((x & 0x8000) | _pack_rne(total, ex - 144, sticky, 7, 8))


@_twin
def _bf16_order(h):
    """An int that orders bfloat16 bit patterns (not NaN) as their values, -0 below +0."""
    return np.int64(h & 0x7FFF) if h < 0x8000 else np.int64(-(h & 0x7FFF) - 1)


@_twin
def _bf16_min_half(x, y):
    """min.bf16: the lesser, the non-NaN operand where one is NaN, 0x7FFF where both are."""
    x, y = np.int64(x), np.int64(y)
    nx, ny = (x & 0x7FFF) > 0x7F80, (y & 0x7FFF) > 0x7F80
    if nx and ny:
        return np.int64(0x7FFF)
    if nx:
        return y
    if ny:
        return x
    return x if _bf16_order(x) <= _bf16_order(y) else y


@_twin
def _bf16_max_half(x, y):
    """max.bf16: the greater, the non-NaN operand where one is NaN, 0x7FFF where both are."""
    x, y = np.int64(x), np.int64(y)
    nx, ny = (x & 0x7FFF) > 0x7F80, (y & 0x7FFF) > 0x7F80
    if nx and ny:
        return np.int64(0x7FFF)
    if nx:
        return y
    if ny:
        return x
    return x if _bf16_order(x) >= _bf16_order(y) else y


@_twin
def bf16x2_mul_scalar(a, b):
    a, b = np.int64(np.uint32(a)), np.int64(np.uint32(b))
    lo = _bf16_mul_half(a & 0xFFFF, b & 0xFFFF)
    return np.uint32(lo | (_bf16_mul_half(a >> 16, b >> 16) << 16))


@_twin
def bf16x2_absmul_scalar(a, b):
    return bf16x2_mul_scalar(np.uint32(np.uint32(a) & np.uint32(0x7FFF7FFF)), b)


@_twin
def bf16x2_add_scalar(a, b):
    a, b = np.int64(np.uint32(a)), np.int64(np.uint32(b))
    lo = _bf16_add_half(a & 0xFFFF, b & 0xFFFF)
    return np.uint32(lo | (_bf16_add_half(a >> 16, b >> 16) << 16))


@_twin
def bf16x2_min_scalar(a, b):
    a, b = np.int64(np.uint32(a)), np.int64(np.uint32(b))
    lo = _bf16_min_half(a & 0xFFFF, b & 0xFFFF)
    return np.uint32(lo | (_bf16_min_half(a >> 16, b >> 16) << 16))


@_twin
def bf16x2_max_scalar(a, b):
    a, b = np.int64(np.uint32(a)), np.int64(np.uint32(b))
    lo = _bf16_max_half(a & 0xFFFF, b & 0xFFFF)
    return np.uint32(lo | (_bf16_max_half(a >> 16, b >> 16) << 16))


@_twin
def bf16x2_absmin_scalar(a, b):
    return bf16x2_min_scalar(np.uint32(np.uint32(a) & np.uint32(0x7FFF7FFF)), b)


if PTX:

    def _u32_codegen(ptx, nargs):
        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            vals = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            fty = ir.FunctionType(i32, [i32] * nargs)
            return builder.call(ir.InlineAsm(fty, ptx, "=r," + ",".join(["r"] * nargs)), vals)

        return codegen

    def _u32_asm(ptx, nargs):
        """A uint32 function of ``nargs`` integer arguments by one PTX instruction."""
        if nargs == 2:

            @intrinsic
            def _op2(typingctx, a, b):
                return types.uint32(a, b), _u32_codegen(ptx, 2)

            return _op2

        @intrinsic
        def _op3(typingctx, a, b, c):
            return types.uint32(a, b, c), _u32_codegen(ptx, 3)

        return _op3

    bf16x2_mul = _u32_asm("mul.rn.bf16x2 $0, $1, $2;", 2)
    bf16x2_absmul = _u32_asm("{.reg .b32 t; abs.bf16x2 t, $1; mul.rn.bf16x2 $0, t, $2;}", 2)
    bf16x2_add = _u32_asm("add.rn.bf16x2 $0, $1, $2;", 2)
    bf16x2_min = _u32_asm("min.bf16x2 $0, $1, $2;", 2)
    bf16x2_max = _u32_asm("max.bf16x2 $0, $1, $2;", 2)
    # the sign bits cleared by and.b32 (not abs.bf16x2, which sm_90 runs as an HFMA2 of its own):
    # ptxas folds it into the LOP3 that made the pair (rto: hi | sticky), one instruction a pair less
    bf16x2_absmin = _u32_asm("{.reg .b32 t; and.b32 t, $1, 0x7FFF7FFF; min.bf16x2 $0, t, $2;}", 2)
    u16x2_max = _u32_asm("max.u16x2 $0, $1, $2;", 2)
    u16x2_min = _u32_asm("min.u16x2 $0, $1, $2;", 2)
    prmt = _u32_asm("prmt.b32 $0, $1, $2, $3;", 3)
    # max(|a|, |b|) of two float32 bit patterns, NaN if either is (max.NaN: the canonical
    # 0x7FFFFFFF, above every other |x|): one FMNMX.NAN with |.| operand modifiers, where the
    # integer max of the masked bits takes a LOP3 per element besides the max
    absmax_nan = _u32_asm("{.reg .f32 x, y; mov.b32 x, $1; mov.b32 y, $2; abs.f32 x, x; abs.f32 y, y; "
                          "max.NaN.f32 x, x, y; mov.b32 $0, x;}", 2)
else:
    bf16x2_mul, bf16x2_add, bf16x2_min, bf16x2_max = bf16x2_mul_twin, bf16x2_add_twin, bf16x2_min_twin, bf16x2_max_twin
    bf16x2_absmul = bf16x2_absmul_twin
    u16x2_max, u16x2_min, prmt, bf16x2_absmin = u16x2_max_twin, u16x2_min_twin, prmt_twin, bf16x2_absmin_twin

    if HIP:  # pragma: no cover - numba-hip: the scalar twins (the NumPy ones stay the simulator's)
        u16x2_max, u16x2_min = devfn(u16x2_max_scalar), devfn(u16x2_min_scalar)
        prmt, absmax_nan = devfn(prmt_scalar), devfn(absmax_nan_scalar)
        bf16x2_mul, bf16x2_add, bf16x2_min, bf16x2_max = (bf16x2_mul_scalar, bf16x2_add_scalar, bf16x2_min_scalar,
                                                          bf16x2_max_scalar)  # (device functions: _twin)
        bf16x2_absmul, bf16x2_absmin = bf16x2_absmul_scalar, bf16x2_absmin_scalar
    else:
        absmax_nan = absmax_nan_twin
