"""A toy per-row (per-token) FP8 e4m3 quantizer for bfloat16, as one Numba kernel.

tests/test_launch.py launches it through :mod:`nqdq.gpu.runtime.launch`, so the launch path
is checked apart from the library's own kernels and plans (benchmarks/launch_overhead.py
loads and times this kernel). Its numerics follow the spec of ``fp8_row``
(``nqdq.reference.quantize``): ``s = amax / 448`` in float32 (1.0 when that is 0),
``code = encode_e4m3(x / s)`` with round-to-nearest-even and saturation, so its bits can
be compared with ``nqdq.quantize(x, "fp8_row")`` on finite inputs.

Layout: ``x`` is bfloat16 ``[rows, cols]`` seen as ``uint32 [rows, cols/2]`` (two
elements per 4-byte load, element 2j in the low half); codes come out as
``uint16 [rows, cols/2]`` (two e4m3 bytes per store), seen by the caller as
``uint8 [rows, cols]``; scales are ``float32 [rows]``. One block of ``TPB`` threads per row,
two passes over the row (the second is served by L1/L2 for rows of a few tens of KB).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

TPB = 256  # threads per block (the shared-memory reduction below assumes it)
F448 = np.float32(448.0)
F1 = np.float32(1.0)
NAN32 = np.float32(np.nan)


@cuda.jit(device=True)
def f32_from_bits(b):
    t = cuda.local.array(1, np.uint32)
    t[0] = b
    return t.view(np.float32)[0]


@cuda.jit(device=True)
def bits_from_f32(v):
    t = cuda.local.array(1, np.float32)
    t[0] = v
    return t.view(np.uint32)[0]


@cuda.jit(device=True)
def encode_e4m3(v):
    """float32 -> e4m3fn code: round to nearest even, saturate to +-448, NaN -> S.1111.111."""
    b = bits_from_f32(v)
    sign = (b >> 24) & 0x80
    a = b & 0x7FFFFFFF
    if a > 0x7F800000:
        return sign | 0x7F
    if a >= 0x3C800000:  # >= 2^-6, normal in e4m3: keep 3 of 23 mantissa bits, rebias 127 -> 7
        code = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - 960
        return sign | min(code, 0x7E)
    # subnormal in e4m3: q = rne(|v| * 2^9) from the float32 mantissa
    shift = 141 - (a >> 23)
    if shift > 24:
        return sign
    mant = (a & 0x7FFFFF) | 0x800000
    q = mant >> shift
    rem = mant - (q << shift)
    half = 1 << (shift - 1)
    if rem > half or (rem == half and (q & 1) == 1):
        q += 1
    return sign | q


@cuda.jit
def fp8_row_bf16(x2, codes2, scales):
    """x2: uint32[rows, cols/2] (bf16 pairs); codes2: uint16[rows, cols/2]; scales: float32[rows]."""
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    n2 = x2.shape[1]
    m = 0
    for j in range(tid, n2, TPB):
        w = x2[row, j]
        m = max(m, w & 0x7FFF, (w >> 16) & 0x7FFF)
    red = cuda.shared.array(TPB, np.uint32)
    red[tid] = m
    cuda.syncthreads()
    step = TPB // 2
    while step > 0:
        if tid < step:
            red[tid] = max(red[tid], red[tid + step])
        cuda.syncthreads()
        step //= 2
    mbits = red[0]
    amax = f32_from_bits(mbits << 16)
    s = amax / F448
    if s == 0:
        s = F1
    if mbits >= 0x7F80:  # inf or NaN in the row: the row's scale is NaN (spec policy)
        s = NAN32
    if tid == 0:
        scales[row] = s
    for j in range(tid, n2, TPB):
        w = x2[row, j]
        lo = encode_e4m3(f32_from_bits((w & 0xFFFF) << 16) / s)
        hi = encode_e4m3(f32_from_bits(w & 0xFFFF0000) / s)
        codes2[row, j] = lo | (hi << 8)


def launch_args(x_bf16, codes_u8, scales_f32):
    """(grid, block, args) for bf16 ``x [rows, cols]`` (cols even, C-contiguous), with the
    views the kernel takes. Works for NumPy (simulator) and CuPy arrays alike."""
    rows, cols = x_bf16.shape
    if cols % 2:
        raise ValueError(f"x has {cols} columns; the toy kernel needs an even number")
    x2 = x_bf16.view(np.uint16).view(np.uint32) if x_bf16.dtype.itemsize == 2 else x_bf16.view(np.uint32)
    return rows, TPB, (x2, codes_u8.view(np.uint16), scales_f32)
