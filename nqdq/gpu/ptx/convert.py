"""Float conversions by one PTX ``cvt`` each, with their twins.

``cvt_fp8(v, fmt)`` (``cvt_e4m3`` / ``cvt_e5m2``): the float8 code of float32 ``v`` by one
``cvt.rn.satfinite.e4m3x2.f32`` (or ``.e5m2x2``) instruction, sm_89 and newer. It rounds to
nearest even and saturates finite values and +-inf to +-max, exactly as the bit-manipulation
encoder (``device.codec.encode_float_rne``) does; only NaN differs (the instruction writes a
canonical NaN, the spec keeps the NaN's sign), so NaN lanes are fixed up after it.
``cvt_e4m3x2`` / ``cvt_e5m2x2``: two codes by one instruction (the pair form).

The twin (``device.codec.encode_float_rne``) is what the CUDA simulator, numba-hip and GPUs older
than sm_89 run (``fp8_cvt_available`` says whether a kernel may use the instruction; the
names are None where it may not); ``tests/test_kernels.py::test_fp8_cvt_matches_twin``
compares the two on a GPU over every bfloat16 value and random float32 bit patterns.

``cvt_bf16x2`` / ``cvt_f16x2``: two float32 rounded into one word of 16-bit floats. Their
twins: NumPy (``*_twin``, the simulator's) and integer scalar code (``*_scalar``, AMD's),
built on the exact rounding helpers here (``round_to_half_bits``, ``_pack_rne``), which the
bfloat16 pair arithmetic (``pairs``) shares.
"""

from __future__ import annotations

import functools

import numpy as np

from numba import float32 as _float32

from ..runtime.backend import cuda as _cuda
from ..runtime.target import HIP, PTX, devfn
from ..runtime.target import device_twin as _twin

E4M3 = 4  # fmt[8] (exponent bits) of the formats the instruction covers
E5M2 = 5


@functools.lru_cache(maxsize=None)
def fp8_cvt_available() -> bool:
    """Whether kernels built now may use the cvt instruction: not in the simulator, and the
    current GPU is sm_89+ (with no GPU, compile-only tools such as the PTX audit target
    sm_90: yes). Never on AMD (a PTX instruction)."""
    if not PTX:
        return False
    from ..runtime.backend import cuda

    try:
        if not cuda.is_available():
            return True
        return tuple(cuda.get_current_device().compute_capability) >= (8, 9)
    except Exception:  # pragma: no cover - no driver: compile-only
        return True


def fp8_cvt_supports(fmt) -> bool:
    """The element format is e4m3fn (max 448) or e5m2 (max 57344), 8 bits, saturating."""
    return fmt[0] == 1 and fmt[5] == 8 and ((fmt[8] == E4M3 and fmt[1] == 3) or (fmt[8] == E5M2 and fmt[1] == 2))


if PTX:
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
else:  # pragma: no cover - never called where fp8_cvt_available() is False (simulator, AMD)
    cvt_e4m3 = cvt_e5m2 = None

if PTX:

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
else:
    cvt_e4m3x2 = cvt_e5m2x2 = None  # never called where fp8_cvt_available() is False (simulator, AMD)


def round_to_half_bits(v, ebits, mbits):
    """IEEE bits (1 + ebits + mbits wide) of float64 ``v`` rounded to nearest even; overflow
    -> inf, NaN -> the canonical 0x7FFF (sign 0, every other bit 1)."""
    v = np.asarray(v, np.float64)
    bias = (1 << (ebits - 1)) - 1
    a = np.abs(v)
    with np.errstate(all="ignore"):
        _, e = np.frexp(a)
        eq = np.maximum(e.astype(np.int64) - 1, 1 - bias)  # the binade, subnormals in 1 - bias
        r = np.rint(np.ldexp(a, (mbits - eq).astype(np.int32)))  # exact scaling; rint: ties to even
    r = np.where(np.isfinite(r), r, 0).astype(np.int64)
    up = r >> (mbits + 1)  # a carry into the next binade
    eq = eq + up
    r = np.where(up > 0, r >> 1, r)
    bits = np.where(r >= (1 << mbits), ((eq + bias) << mbits) + r - (1 << mbits), r)
    inf = ((1 << ebits) - 1) << mbits
    bits = np.where((eq + bias >= (1 << ebits) - 1) | np.isinf(a), inf, bits)
    bits = bits | (np.signbit(v).astype(np.int64) << (ebits + mbits))
    return np.where(np.isnan(v), (1 << (ebits + mbits + 1)) - 1 - (1 << (ebits + mbits)), bits)


# Exact rounding for the scalar twins, which AMD compiles: integer arithmetic on the bits only
# (int64, every value below 2^40), no float, so that no float rounding can intervene and no
# flush-to-zero mode of the target's FPU can apply. An exact result m * 2^e, plus a sticky bit
# where low bits had to be dropped, is rounded once by ``_pack_rne``: a float32's bits here
# (``f32_bits_to_f16``), bfloat16 products and sums in ``pairs`` (see the comment there).
@_twin
def _bit_length(x):
    """The number of bits of int ``x`` (0 <= x < 2^64): 0 for 0."""
    x = np.int64(x)
    n = np.int64(0)
    s = np.int64(32)
    while s > 0:  # halving steps 32, 16, ..., 1: x ends below 2
        if x >= np.int64(1) << s:
            x >>= s
            n += s
        s >>= 1
    return n + x


@_twin
def _pack_rne(m, e, sticky, mbits, ebits):
    """The IEEE bits (sign clear; 1 + ebits + mbits wide) of m * 2^e rounded to nearest even,
    m >= 1 an int below 2^40, ``sticky`` nonzero where a fraction (0 < f < 1) of m's last unit
    is to be added (it breaks ties up: only where m's rounding drops at least one bit);
    subnormals kept, overflow -> inf. The significand kept has mbits + 1 bits where the
    result is normal (its leading bit at 2^(e + n - 1), n = m's bit length) and sits on the
    subnormal grid 2^(1 - bias - mbits) below; ``base + q`` then carries a rounding overflow
    into the exponent (and the largest subnormal into the smallest normal)."""
    m, e = np.int64(m), np.int64(e)
    bias = (1 << (ebits - 1)) - 1
    n = _bit_length(m)
    shift = np.int64(max(n - mbits - 1, 1 - bias - mbits - e))
    base = np.int64(max(e + n + bias - 2, 0) << mbits)
    if shift <= 0:
        q = np.int64(m << -shift)
    else:
        shift = min(shift, 48)  # (m < 2^40: from 41 on the result is 0 without a tie)
        q = np.int64(m >> shift)
        rem = np.int64(m - (q << shift))
        half = np.int64(1) << (shift - 1)
        if rem > half or (rem == half and (sticky != 0 or (q & 1) != 0)):
            q += 1
    return np.int64(min(base + q, ((1 << ebits) - 1) << mbits))


@devfn  # (under the simulator too: its local array needs the kernel's context)
def _f32_bits(f):
    """The 32 bits of float32 ``f`` as an int (``device.codec.f32_bits``, which imports this module)."""
    a = _cuda.local.array(1, _float32)
    a[0] = f
    return np.int64(a.view(np.uint32)[0])


@_twin
def f32_bits_to_bf16(u):
    """cvt.rn.bf16.f32 of float32 bits ``u``: round-to-nearest-even at bit 16 of the magnitude
    (bfloat16 keeps float32's exponent range, so its values, subnormals included, are the
    float32 bit patterns whose low 16 bits are 0; the largest finite rounds up to inf),
    NaN -> 0x7FFF."""
    u = np.int64(np.uint32(u))
    a = u & 0x7FFFFFFF
    if a > 0x7F800000:
        return np.int64(0x7FFF)
    return np.int64(((u >> 16) & 0x8000) | ((a + 0x7FFF + ((a >> 16) & 1)) >> 16))


@_twin
def f32_bits_to_f16(u):
    """cvt.rn.f16.f32 of float32 bits ``u``: nearest even, subnormals kept, overflow -> inf,
    NaN -> 0x7FFF."""
    u = np.int64(np.uint32(u))
    a = u & 0x7FFFFFFF
    s = (u >> 16) & 0x8000
    if a > 0x7F800000:
        return np.int64(0x7FFF)
    if a == 0x7F800000:
        return np.int64(s | 0x7C00)
    if a == 0:
        return np.int64(s)
    ef = a >> 23
    m = (a & 0x7FFFFF) | (0x800000 if ef != 0 else 0)
    return np.int64(s | _pack_rne(m, max(ef, 1) - 150, 0, 10, 5))


# ``cvt_bf16x2(hi, lo)`` / ``cvt_f16x2(hi, lo)`` (``cvt.rn.bf16x2.f32`` / ``.f16x2.f32``, sm_80+):
# two float32 rounded to nearest even into one word, lo in bits 0-15; overflow -> inf,
# subnormals kept, NaN -> the canonical 0x7FFF (callers that keep NaN signs fix NaN lanes
# up). The GEMM epilogue stores two outputs per instruction with them and ``memory.st_u32_at``;
# tests/test_matmul_gpu.py::
# test_out_pair_intrinsics_match_twins compares both with the twins on a GPU.
def _cvt_pair_twin(hi, lo, ebits, mbits):
    lo_b = round_to_half_bits(np.float64(np.float32(lo)), ebits, mbits)
    hi_b = round_to_half_bits(np.float64(np.float32(hi)), ebits, mbits)
    return np.uint32((int(hi_b) << 16) | int(lo_b))


def cvt_bf16x2_twin(hi, lo):
    return _cvt_pair_twin(hi, lo, 8, 7)


def cvt_f16x2_twin(hi, lo):
    return _cvt_pair_twin(hi, lo, 5, 10)


@_twin
def cvt_bf16x2_scalar(hi, lo):
    return np.uint32(f32_bits_to_bf16(_f32_bits(lo)) | (f32_bits_to_bf16(_f32_bits(hi)) << 16))


@_twin
def cvt_f16x2_scalar(hi, lo):
    return np.uint32(f32_bits_to_f16(_f32_bits(lo)) | (f32_bits_to_f16(_f32_bits(hi)) << 16))


if PTX:

    def _cvt_half2_intrinsic(ptx_type):
        @intrinsic
        def _cvt2(typingctx, hi, lo):
            sig = types.uint32(types.float32, types.float32)

            def codegen(context, builder, sig, args):
                i32 = ir.IntType(32)
                fty = ir.FunctionType(i32, [ir.FloatType(), ir.FloatType()])
                return builder.call(ir.InlineAsm(fty, f"cvt.rn.{ptx_type}.f32 $0, $1, $2;", "=r,f,f"), list(args))

            return sig, codegen

        return _cvt2

    cvt_bf16x2 = _cvt_half2_intrinsic("bf16x2")
    cvt_f16x2 = _cvt_half2_intrinsic("f16x2")
else:
    cvt_bf16x2, cvt_f16x2 = cvt_bf16x2_twin, cvt_f16x2_twin

    if HIP:  # pragma: no cover - numba-hip: the scalar twins (the NumPy ones stay the simulator's)
        cvt_bf16x2, cvt_f16x2 = cvt_bf16x2_scalar, cvt_f16x2_scalar  # (device functions: _twin)
