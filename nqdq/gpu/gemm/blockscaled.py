"""MX operands for the tensor-core GEMMs: element codes converted exactly to fp8 bytes.

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

NVFP4 operands become exact bfloat16 values through ``nqdq.dequantize`` instead
(``nqdq._pairs_gpu.exact_bf16``; docs/design/gemm.md, "NVFP4 as exact bfloat16 operands").
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ...formats import FORMATS, get_format
from ...reference.codec import decode_float, encode_float
from ...reference.packing import packed_length, unpack_codes
from ..runtime.backend import cuda
from ..runtime.interop import Allocator, lib_of
from ..runtime.launch import fast_kernel
from ..runtime.target import SIMULATOR, devfn

__all__ = ["MX_ELEMENTS", "fp8_format", "e4m3_table", "convert_codes", "convert_codes_reference",
           "prepare_mx_operand"]

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
