"""Block-scaled operands for the tensor-core GEMMs, converted exactly: MX element codes to fp8
bytes, NVFP4 elements times their block scales to bfloat16.

MX
--

The fp8 ``mma`` (``m16n8k32 .e4m3 / .e5m2``) takes one byte per element; an MX operand
holds nqdq's packed codes (``reference.packing``: mxfp4 two e2m1 codes a byte, element 2i
in the low nibble; mxfp6 four 6-bit codes in three bytes, LSB first) or fp8 bytes (mxfp8).
Every value of the narrow formats is an e4m3 value (OCP MX v1.0 spec cards; e4m3fn: bias 7,
3 mantissa bits, normals from 2^-6 to 448):

=====  ====  =====================================  ====================================
code   bias  values                                 as e4m3
=====  ====  =====================================  ====================================
e2m1   1     0, 0.5 (the one subnormal) .. 6        exponent e - 1 + 7, mantissa m << 2;
                                                    0.5 = 2^-1
e2m3   1     0, 1/8 .. 7/8 (subnormals) .. 7.5      exponent e - 1 + 7, mantissa m;
                                                    m / 8 normalised
e3m2   3     0, 1/16 .. 3/16 (subnormals) .. 28     exponent e - 3 + 7, mantissa m << 1;
                                                    m / 16 normalised
=====  ====  =====================================  ====================================

so ``convert_codes`` maps each code to the e4m3 byte of the same value: signed zeros kept,
subnormals become e4m3 normals (the smallest, 2^-4 of e3m2, is above e4m3's 2^-6), none of
the three has NaN or inf. mxfp8 bytes (e4m3 or e5m2) are used as they are, so a pair with
an e5m2 side takes the kernel's e5m2 ``mma`` kinds. The block scales (e8m0, one per 32 of
K) do not change: the GEMM applies them (``mma_sync``'s ``"mx"`` mode).

================================  ============================================================
``convert_codes``                 the device kernel: packed codes [rows, packed K] -> e4m3
                                  bytes [rows, K], one launch, in the codes' array library
``convert_codes_reference``       its NumPy twin, from the reference codec (decode, encode
                                  as e4m3: exact, checked when its table is built)
``prepare_mx_operand``            what ``nqdq.matmul`` calls: (fp8 bytes, their format)
================================  ============================================================

NVFP4
-----
An NVFP4 block is 16 e2m1 codes with one ue4m3 scale (plus one float32 tensor scale
S_dec per operand): half an fp8 ``m16n8k32`` K step, so the MX route (the scales promoted
per mma) does not fit. But every e2m1 value (2 significant bits, 0.5 .. 6) times every
e4m3 value (at most 4 significant bits, 2^-9 .. 448) is exactly a bfloat16 value (8
significant bits, float32's exponent range): at most 6 significant bits, magnitudes 2^-10
.. 2688 (``nvfp4_bf16_table`` checks all 16 x 256 when it is built). So an operand becomes
bfloat16 bits of ``e2m1 value x ue4m3 block scale`` [rows, Kp] (Kp: K rounded up to
``NVFP4_BLOCK`` = 16, one ``m16n8k16`` K step, zero-padded), and NVFP4 x NVFP4 is the bf16
GEMM (``mma_sync``'s ``"bf16.bf16"`` kind) of the two with the tensor scales as the
"tensor" scale mode's ``sa``, ``sb`` (read on the device in the epilogue: a device scalar
``q.tensor_scale`` costs no host read): ``alpha * S_dec,a * S_dec,b * sum_k a_k b_k``, each
element product the formats' own, summed in float32.

Scale bytes are read as e4m3fn, as ``reference.matmul.dequantize_exact`` reads them (a ue4m3
code is an e4m3 byte with the sign bit clear; a set sign bit negates, as there); 0x7F /
0xFF (NaN) make the block's elements the bfloat16 NaN 0x7FC0.

================================  ============================================================
``convert_nvfp4``                 the device kernel: packed e2m1 codes [rows, ceil(K/2)] and
                                  scales [rows, ceil(K/16)] -> bf16 bits [rows, Kp], one
                                  launch, in the codes' array library
``convert_nvfp4_reference``       its NumPy twin (``nvfp4_bf16_table``, from the reference codec)
``prepare_nvfp4_operand``         device kernel or twin, as ``prepare_mx_operand`` chooses
``nvfp4_gemm``                    both conversions and the bf16 GEMM (``plan.gemm``)
================================  ============================================================
"""

from __future__ import annotations

from functools import lru_cache

import ml_dtypes
import numpy as np

from . import plan
from ...formats import FORMATS, get_format
from ...reference.codec import decode_float, encode_float
from ...reference.packing import packed_length, unpack_codes
from ..runtime.backend import cuda
from ..runtime.interop import Allocator, lib_of
from ..runtime.launch import fast_kernel
from ..device.codec import decode_small_float, f32_bits
from ..runtime.target import SIMULATOR, devfn

__all__ = ["MX_ELEMENTS", "fp8_format", "e4m3_table", "convert_codes", "convert_codes_reference",
           "prepare_mx_operand", "NVFP4_BLOCK", "nvfp4_padded_k", "nvfp4_bf16_table", "convert_nvfp4",
           "convert_nvfp4_reference", "prepare_nvfp4_operand", "nvfp4_gemm"]  # fmt: skip

MX_ELEMENTS = ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1")  # OCP MX v1.0: mxfp8 (two), mxfp6 (two), mxfp4
NARROW = ("e2m3", "e3m2", "e2m1")  # converted to e4m3
THREADS = 64 if SIMULATOR else 256  # threads per block (results never depend on it)
_GRID_MAX = 1 << 20  # blocks at most; a block-stride loop covers the rest


def fp8_format(elem: str) -> str:
    """The fp8 format the GEMM reads an ``elem`` operand as: e5m2 for e5m2, e4m3 otherwise."""
    return "e5m2" if elem == "e5m2" else "e4m3"


@lru_cache(maxsize=None)
def e4m3_table(elem: str) -> np.ndarray:
    """uint8 [2^bits]: the e4m3 byte of every ``elem`` code (e2m1, e2m3, e3m2), from the
    reference codec; raises if a value were not exactly an e4m3 value."""
    fmt = FORMATS[elem]
    codes = np.arange(1 << fmt.bits, dtype=np.uint8)
    values = decode_float(codes, fmt)
    table = encode_float(values, FORMATS["e4m3"], saturate=False)
    back = decode_float(table, FORMATS["e4m3"])
    if not np.array_equal(back.view(np.uint32), values.view(np.uint32)):  # bits: -0.0 too
        raise AssertionError(f"{elem} has codes that are not e4m3 values")
    return table


def _check(codes, elem: str, rows: int, K: int):
    """The format (FloatFormat) of an MX operand's codes, checked against [rows, K]."""
    fmt = get_format(elem, argname="elem_name")
    if fmt.name not in MX_ELEMENTS:
        raise ValueError(f"elem_name={elem!r} is not an MX element format ({', '.join(MX_ELEMENTS)})")
    if rows < 0 or K < 0:
        raise ValueError(f"rows={rows}, K={K}: the operand's shape must be non-negative")
    pcols = packed_length(K, fmt.bits)
    if int(codes.size) != rows * pcols:
        raise ValueError(f"codes hold {int(codes.size)} bytes; a [{rows}, {K}] {fmt.name} operand packs into "
                         f"{rows} x {pcols} (nqdq.reference.packing)")  # fmt: skip
    dt = np.dtype(codes.dtype)
    if dt.itemsize != 1:
        raise TypeError(f"codes must be bytes (uint8 / int8), got dtype {dt}")
    return fmt, pcols


# ----------------------------------------------------------------------------- the NumPy twin
def convert_codes_reference(codes, elem: str, rows: int, K: int) -> np.ndarray:
    """The e4m3 bytes [rows, K] (uint8) of ``elem`` codes packed as nqdq packs them
    ([rows, packed_length(K)] bytes), by the reference codec's table (``e4m3_table``)."""
    fmt, pcols = _check(codes, elem, rows, K)
    c = np.asarray(codes).reshape(rows, pcols).view(np.uint8)
    return e4m3_table(fmt.name)[unpack_codes(c, fmt.bits, K)]


# ----------------------------------------------------------------------------- the device kernel
@devfn
def small_float_to_e4m3(c, ebits, mbits, bias):
    """The e4m3 byte of code ``c`` of a float format with ``ebits`` <= 3, ``mbits`` <= 3 and no
    NaN / inf (e2m1, e2m3, e3m2). Normals keep their fraction (``m << (3 - mbits)``) under
    the exponent rebiased to 7; a subnormal m * 2^(1 - bias - mbits) is normalised by its
    leading bit p (m < 8: 0, 1 or 2); zero keeps its sign."""
    sign = (c >> (ebits + mbits)) & 1
    e = (c >> mbits) & ((1 << ebits) - 1)
    m = c & ((1 << mbits) - 1)
    if e != 0:
        mag = ((e - bias + 7) << 3) | (m << (3 - mbits))
    elif m == 0:
        mag = 0
    else:
        p = 0
        if m >= 2:
            p = 1
        if m >= 4:
            p = 2
        mag = ((p + 1 - bias - mbits + 7) << 3) | ((m << (3 - p)) & 7)
    return (sign << 7) | mag


@lru_cache(maxsize=None)
def make_convert_kernel(elem: str):
    """``convert(src, dst, rows, K, pcols)``: e4m3 bytes ``dst`` [rows * K] of ``elem`` codes
    ``src`` [rows * pcols] (packed); a thread converts one group of codes (two e2m1 from one
    byte, four 6-bit codes from three), block-stride over rows * groups."""
    fmt = FORMATS[elem]
    EBITS, MBITS, BIAS, BITS = fmt.ebits, fmt.mbits, fmt.bias, fmt.bits
    PER, NBYTES = (2, 1) if BITS == 4 else (4, 3)  # codes, bytes per group (reference.packing)
    MASK = (1 << BITS) - 1

    @cuda.jit
    def convert(src, dst, rows, K, pcols):
        groups = (K + PER - 1) // PER
        total = rows * groups
        step = cuda.gridDim.x * cuda.blockDim.x
        for i in range(cuda.grid(1), total, step):
            row = i // groups
            grp = i - row * groups
            at = np.uint64(row * pcols + grp * NBYTES)
            word = np.int64(src[at])
            for k in range(1, NBYTES):
                word |= np.int64(src[at + np.uint64(k)]) << (8 * k)
            for j in range(PER):
                col = grp * PER + j
                if col < K:
                    c = (word >> (BITS * j)) & MASK
                    dst[np.uint64(row * K + col)] = np.uint8(small_float_to_e4m3(c, EBITS, MBITS, BIAS))

    return convert


def convert_codes(codes, elem: str, rows: int, K: int):
    """``convert_codes_reference`` on the device: one launch, the result [rows, K] uint8 in
    the codes' array library (NumPy arrays as they are under the simulator)."""
    fmt, pcols = _check(codes, elem, rows, K)
    if fmt.name not in NARROW:
        raise ValueError(f"elem_name={elem!r}: only {', '.join(NARROW)} codes are converted "
                         "(fp8 bytes are used as they are)")  # fmt: skip
    lib = lib_of(codes)
    if lib == "numpy" and not SIMULATOR:
        raise TypeError("convert_codes takes GPU arrays (NumPy arrays under the CUDA simulator only); "
                        "convert_codes_reference converts NumPy codes")  # fmt: skip
    alloc = Allocator(lib)
    out = alloc.empty(max(rows * K, 1), np.uint8)
    n = rows * -(-K // (2 if fmt.bits == 4 else 4))
    if n:
        src = codes.reshape(-1)
        src = src if np.dtype(src.dtype) == np.uint8 else src.view(np.uint8)
        grid = max(1, min(-(-n // THREADS), _GRID_MAX))
        fast_kernel(make_convert_kernel(fmt.name)).launch(grid, THREADS, (src, out, rows, K, pcols), None)
    return alloc.to_lib(out[: rows * K], (rows, K))


def prepare_mx_operand(codes, elem_name: str, rows: int, K: int):
    """(fp8 bytes [rows, K], "e4m3" / "e5m2") of an MX operand: ``codes`` as nqdq packs
    ``elem_name`` codes ([rows, packed_length(K)]) in any array library. fp8 codes come back
    as they are; e2m1 / e2m3 / e3m2 codes are converted to e4m3 on the device
    (``convert_codes``: GPU arrays, and NumPy arrays under the simulator) or by the NumPy
    twin (NumPy arrays on a machine with a GPU: the GEMM launcher copies them over)."""
    fmt, pcols = _check(codes, elem_name, rows, K)
    if fmt.name not in NARROW:
        return codes.reshape(rows, K), fmt.name
    if lib_of(codes) == "numpy" and not SIMULATOR:
        return convert_codes_reference(codes, fmt.name, rows, K), "e4m3"
    return convert_codes(codes, fmt.name, rows, K), "e4m3"


# ============================================================================= NVFP4 -> bfloat16
NVFP4_BLOCK = 16  # elements per ue4m3 scale; also the K of one m16n8k16 bf16 mma
BF16_NAN = 0x7FC0  # the quiet NaN a NaN block scale gives (the kernel and the twin alike)


def nvfp4_padded_k(K: int) -> int:
    """K rounded up to whole NVFP4 blocks of 16: the converted operands' row length."""
    return -(-K // NVFP4_BLOCK) * NVFP4_BLOCK


@lru_cache(maxsize=None)
def nvfp4_bf16_table() -> np.ndarray:
    """uint16 [256, 16]: at [s, c] the bfloat16 bits of e2m1 code ``c`` times e4m3 byte ``s``,
    from the reference codec (float64 product, converted by ml_dtypes); ``BF16_NAN`` where
    ``s`` is NaN. Raises if a product were not exactly a bfloat16 value (signed zeros kept)."""
    e2m1 = decode_float(np.arange(16, dtype=np.uint8), FORMATS["e2m1"]).astype(np.float64)
    e4m3 = decode_float(np.arange(256, dtype=np.uint8), FORMATS["e4m3"]).astype(np.float64)
    product = e4m3[:, None] * e2m1[None, :]
    bits = product.astype(ml_dtypes.bfloat16).view(np.uint16)
    back = bits.view(ml_dtypes.bfloat16).astype(np.float64)
    nan = np.isnan(product)
    if not (np.array_equal(back[~nan], product[~nan]) and np.array_equal(np.signbit(back), np.signbit(product))):
        raise AssertionError("an e2m1 x e4m3 product is not a bfloat16 value")
    bits[nan] = BF16_NAN
    bits.setflags(write=False)  # shared by every caller (lru_cache)
    return bits


def _check_nvfp4(codes, block_scales, rows: int, K: int):
    """(packed bytes a row, scales a row) of an NVFP4 operand, checked against [rows, K]."""
    if rows < 0 or K < 0:
        raise ValueError(f"rows={rows}, K={K}: the operand's shape must be non-negative")
    pcols, nblocks = packed_length(K, 4), -(-K // NVFP4_BLOCK)
    for name, a, per in (("codes", codes, pcols), ("block_scales", block_scales, nblocks)):
        dt = np.dtype(a.dtype)
        if dt.itemsize != 1:
            raise TypeError(f"{name} must be bytes (uint8; ue4m3 scale codes for block_scales), got dtype {dt}")
        if int(a.size) != rows * per:
            what = "packed e2m1 codes, two a byte" if name == "codes" else f"ue4m3 codes, one per {NVFP4_BLOCK} of K"
            raise ValueError(f"{name} hold {int(a.size)} bytes; a [{rows}, {K}] NVFP4 operand has {rows} x {per} "
                             f"({what})")  # fmt: skip
    return pcols, nblocks


def _bytes_view(a, shape=None):
    a = a if shape is None else a.reshape(shape)
    return a if np.dtype(a.dtype) == np.uint8 else a.view(np.uint8)


def convert_nvfp4_reference(codes, block_scales, rows: int, K: int) -> np.ndarray:
    """bfloat16 bits (uint16 [rows, nvfp4_padded_k(K)], zeros past K) of ``e2m1 value x
    e4m3 value of its block's scale`` for NVFP4 ``codes`` packed as nqdq packs them
    ([rows, ceil(K/2)], element 2i in the low nibble) and ``block_scales`` [rows, ceil(K/16)],
    by the reference codec's table (``nvfp4_bf16_table``). NumPy arrays."""
    pcols, nblocks = _check_nvfp4(codes, block_scales, rows, K)
    c = unpack_codes(_bytes_view(np.asarray(codes), (rows, pcols)), 4, K)
    s = np.repeat(_bytes_view(np.asarray(block_scales), (rows, nblocks)), NVFP4_BLOCK, axis=1)[:, :K]
    out = np.zeros((rows, nvfp4_padded_k(K)), np.uint16)
    out[:, :K] = nvfp4_bf16_table()[s, c]
    return out


@devfn
def e2m1_times_e4m3_bf16(c, s):
    """The bfloat16 bits (uint32) of e2m1 code ``c`` times e4m3 byte ``s``: the float32
    product of the two decoded values is exact (6 significant bits at most) and a bfloat16
    value, so its top 16 bits are the answer; a NaN scale gives ``BF16_NAN`` (chosen here:
    the GPU's NaN product would be 0x7FFFFFFF, the simulator's another)."""
    if (s & 0x7F) == 0x7F:
        return np.uint32(BF16_NAN)
    v = decode_small_float(c, 2, 1, 0) * decode_small_float(s, 4, 3, 1)
    return np.uint32(f32_bits(v)) >> np.uint32(16)


@cuda.jit
def convert_nvfp4_kernel(src, scales, dst, rows, K, pcols, nblocks, half):
    """bf16 bits of NVFP4 ``src`` [rows * pcols] (packed e2m1) under ``scales`` [rows *
    nblocks] into ``dst``, uint32 [rows * half] (half = Kp / 2: a pair of bf16 a word, the
    low half first); a thread a word (one code byte, one scale byte read), zeros past K
    (a partial last byte's high nibble ignored), block-stride over rows * half."""
    total = rows * half
    step = cuda.gridDim.x * cuda.blockDim.x
    for i in range(cuda.grid(1), total, step):
        row = i // half
        pair = i - row * half
        col = 2 * pair
        w = np.uint32(0)
        if col < K:
            byte = np.uint32(src[np.uint64(row * pcols + pair)])
            s = np.uint32(scales[np.uint64(row * nblocks + (col >> 4))])
            w = e2m1_times_e4m3_bf16(byte & np.uint32(0xF), s)
            if col + 1 < K:
                w |= e2m1_times_e4m3_bf16(byte >> np.uint32(4), s) << np.uint32(16)
        dst[np.uint64(i)] = w


def convert_nvfp4(codes, block_scales, rows: int, K: int):
    """``convert_nvfp4_reference`` on the device: one launch, the result uint16 [rows, Kp] in
    the codes' array library (NumPy arrays as they are under the simulator)."""
    pcols, nblocks = _check_nvfp4(codes, block_scales, rows, K)
    lib = lib_of(codes)
    if lib == "numpy" and not SIMULATOR:
        raise TypeError("convert_nvfp4 takes GPU arrays (NumPy arrays under the CUDA simulator only); "
                        "convert_nvfp4_reference converts NumPy codes")  # fmt: skip
    if (lib_of(block_scales) == "numpy") != (lib == "numpy"):
        raise TypeError(f"block_scales ({lib_of(block_scales)}) must be on the codes' side ({lib}): both GPU arrays "
                        "or both NumPy")  # fmt: skip
    Kp = nvfp4_padded_k(K)
    half = Kp // 2
    alloc = Allocator(lib)
    out = alloc.empty(max(rows * half, 1), np.uint32)
    n = rows * half
    if n:
        src, sc = _bytes_view(codes.reshape(-1)), _bytes_view(block_scales.reshape(-1))
        grid = max(1, min(-(-n // THREADS), _GRID_MAX))
        fast_kernel(convert_nvfp4_kernel).launch(grid, THREADS, (src, sc, out, rows, K, pcols, nblocks, half), None)
    return alloc.to_lib(out.view(np.uint16)[: rows * Kp], (rows, Kp))


def prepare_nvfp4_operand(codes, block_scales, rows: int, K: int):
    """bfloat16 bits [rows, nvfp4_padded_k(K)] (uint16) of an NVFP4 operand (``q.codes``,
    ``q.scales`` of a linear-layout [rows, K] ``nvfp4`` tensor): on the device
    (``convert_nvfp4``: GPU arrays, and NumPy arrays under the simulator) or by the NumPy twin
    (NumPy arrays on a machine with a GPU: the GEMM launcher copies them over)."""
    if lib_of(codes) == "numpy" and not SIMULATOR:
        return convert_nvfp4_reference(codes, block_scales, rows, K)
    return convert_nvfp4(codes, block_scales, rows, K)


def nvfp4_gemm(codes_a, scales_a, tscale_a, codes_b, scales_b, tscale_b, M: int, N: int, K: int, *, bias=None,
               alpha=1.0, out_dtype="float32", activation=None):  # fmt: skip
    """NVFP4 x NVFP4: ``epilogue(A @ B^T)`` with A [M, K], B [N, K] the dequantized operands,
    ``codes_*`` / ``scales_*`` / ``tscale_*`` a ``nvfp4`` tensor's ``q.codes``, ``q.scales``
    (linear) and ``q.tensor_scale`` (one float32, left on the device). Both operands through
    ``prepare_nvfp4_operand``, then the bf16 GEMM with the tensor scales as scale mode
    "tensor" (``alpha * S_dec,a * S_dec,b`` applied to the float32 sums). Arguments and result
    as ``plan.gemm``."""
    for name, t in (("tscale_a", tscale_a), ("tscale_b", tscale_b)):
        numel = getattr(t, "numel", None)  # (a torch tensor's size is a method)
        n = int(numel() if callable(numel) else getattr(t, "size", 1))
        if n != 1:
            raise ValueError(f"{name} must be one float32 tensor scale (q.tensor_scale), got {n} values")
    a = prepare_nvfp4_operand(codes_a, scales_a, M, K)
    b = prepare_nvfp4_operand(codes_b, scales_b, N, K)
    return plan.gemm(a, b, mma="bf16.bf16", sa=tscale_a, sb=tscale_b, sa_mode="tensor", sb_mode="tensor", bias=bias,
                     alpha=alpha, out_dtype=out_dtype, activation=activation)  # fmt: skip
