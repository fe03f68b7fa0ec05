"""Sub-byte packing along the last axis, as an LSB-first bit stream.

Element ``i`` of a row occupies bits ``[b*i, b*i + b)`` of the row's byte stream, counting
from the least significant bit of byte 0. For 4-bit codes this is the usual "element 2i in
the low nibble" (PyTorch float4_e2m1fn_x2, cuBLAS/CUTLASS, OCP MX); for 6-bit codes four
elements fill three bytes (the little-endian order of AMD CDNA4's packed FP6 registers).
A row whose length does not fill its last byte group is padded with zero codes.
"""

from __future__ import annotations

import numpy as np

__all__ = ["pack_codes", "unpack_codes", "packed_length"]

_GROUP = {4: (2, 1), 6: (4, 3), 8: (1, 1)}  # bits -> (codes, bytes) per group


def packed_length(n: int, bits: int) -> int:
    codes, nbytes = _GROUP[bits]
    return -(-n // codes) * nbytes


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack ``bits``-wide codes (uint8/int8, one per byte) along the last axis."""
    codes = np.asarray(codes)
    if bits == 8:
        return codes
    per, nbytes = _GROUP[bits]
    n = codes.shape[-1]
    pad = -n % per
    c = codes.view(np.uint8) if codes.dtype == np.int8 else codes.astype(np.uint8, copy=False)
    c = c & np.uint8((1 << bits) - 1)
    if pad:
        c = np.concatenate([c, np.zeros(c.shape[:-1] + (pad,), np.uint8)], axis=-1)
    g = c.reshape(c.shape[:-1] + (c.shape[-1] // per, per)).astype(np.uint32)
    word = np.zeros(g.shape[:-1], np.uint32)
    for j in range(per):
        word |= g[..., j] << np.uint32(bits * j)
    out = np.stack([(word >> np.uint32(8 * k)).astype(np.uint8) for k in range(nbytes)], axis=-1)
    return out.reshape(codes.shape[:-1] + (g.shape[-2] * nbytes,))


def unpack_codes(packed: np.ndarray, bits: int, n: int, *, signed: bool = False) -> np.ndarray:
    """Inverse of :func:`pack_codes`: ``n`` codes per row, uint8 (int8 sign-extended if ``signed``)."""
    packed = np.asarray(packed, dtype=np.uint8)
    if bits == 8:
        out = packed
    else:
        per, nbytes = _GROUP[bits]
        g = packed.reshape(packed.shape[:-1] + (packed.shape[-1] // nbytes, nbytes)).astype(np.uint32)
        word = np.zeros(g.shape[:-1], np.uint32)
        for k in range(nbytes):
            word |= g[..., k] << np.uint32(8 * k)
        codes = np.stack(
            [((word >> np.uint32(bits * j)) & np.uint32((1 << bits) - 1)).astype(np.uint8) for j in range(per)],
            axis=-1,
        )
        out = codes.reshape(packed.shape[:-1] + (g.shape[-2] * per,))[..., :n]
    if signed:
        s = out.astype(np.int16)
        s = np.where(s >= (1 << (bits - 1)), s - (1 << bits), s)
        return s.astype(np.int8)
    return out
