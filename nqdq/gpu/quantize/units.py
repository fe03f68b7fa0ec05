"""The 16-byte units of the last-axis kernels (``lastaxis``): a unit is 16 bytes of input (8
bfloat16 / float16 or 4 float32 elements), read by one ``ld.global.nc.v4.u32`` and kept as its
four raw words; ``unit_elems`` gives its elements as float32 bits; its codes are packed
(``pack4``) and leave in one store (``store_packed``).
"""

from __future__ import annotations

import numpy as np

from ..device.codec import KIND_BF16, KIND_F32, f16_top_to_f32_bits
from ..ptx.memory import load_u32x4, store_u32x2
from ..runtime.target import devfn

FINITE = 0x7F800000  # abs bits below this: a finite float32


def vec_of(kind) -> int:
    """Elements per 16-byte unit."""
    return 4 if kind == KIND_F32 else 8


# Every per-unit function below is written out element by element (no loops over the
# unit): NVVM then keeps a thread's units in registers. A loop over a local array whose
# trip count it does not unroll would put them in local memory instead.
@devfn
def load_unit(x, x32, aligned, unit, valid, kind):
    """The 4 words of ``unit`` (zeros when not ``valid``). Unaligned input (a view at an odd
    offset) is read element by element."""
    z = np.uint32(0)
    if not valid:
        return z, z, z, z
    if aligned:
        return load_u32x4(x32, unit)
    i = np.uint64(4 * unit)
    if kind == KIND_F32:
        return x32[i], x32[i + np.uint64(1)], x32[i + np.uint64(2)], x32[i + np.uint64(3)]
    return pair_word(x, i), pair_word(x, i + np.uint64(1)), pair_word(x, i + np.uint64(2)), pair_word(x, i + np.uint64(3))


@devfn
def pair_word(x, k):
    """Word k of a 16-bit input read as two elements."""
    e = k * np.uint64(2)
    return np.uint32(np.uint32(x[e]) | (np.uint32(x[e + np.uint64(1)]) << np.uint32(16)))


@devfn
def half_bits(w, hi, kind):
    """float32 bits of the low (hi=0) or high (hi=1) 16-bit element of word w."""
    if kind == KIND_BF16:
        if hi == 0:
            return np.uint32(w << np.uint32(16))
        return np.uint32(w & np.uint32(0xFFFF0000))
    # float16: its bits in the word's top half (the high element's are there already)
    return f16_top_to_f32_bits(w if hi == 1 else np.uint32(w << np.uint32(16)))


@devfn
def unit_elems(w, kind):
    """The unit's elements as float32 bits (8 of them; an f32 unit fills the first 4)."""
    if kind == KIND_F32:
        z = np.uint32(0)
        return w[0], w[1], w[2], w[3], z, z, z, z
    return (half_bits(w[0], 0, kind), half_bits(w[0], 1, kind), half_bits(w[1], 0, kind), half_bits(w[1], 1, kind),
            half_bits(w[2], 0, kind), half_bits(w[2], 1, kind), half_bits(w[3], 0, kind), half_bits(w[3], 1, kind))


@devfn
def pack4(q0, q1, q2, q3, nb):
    return np.uint32(q0 | (q1 << np.uint32(nb)) | (q2 << np.uint32(2 * nb)) | (q3 << np.uint32(3 * nb)))


@devfn
def store_packed(lo, hi, unit, c8, c16, c32, vec, nb):
    """Store a unit's codes, packed in ``lo`` (elements 0-3) and ``hi`` (4-7, ``nb`` bits
    each, first element lowest), at byte unit * vec * nb / 8."""
    bits = nb * vec
    if bits == 64:  # eight 8-bit codes
        store_u32x2(c32, unit, lo, hi)
    elif bits == 32:  # four 8-bit or eight 4-bit codes
        c32[np.uint64(unit)] = np.uint32(lo | (hi << np.uint32(16))) if vec == 8 else lo
    elif bits == 16:  # four 4-bit codes
        c16[np.uint64(unit)] = np.uint16(lo)
    elif bits == 48:  # eight 6-bit codes: 24 + 24 bits in three 16-bit words
        i = np.uint64(3 * unit)
        c16[i] = np.uint16(lo & np.uint32(0xFFFF))
        c16[i + np.uint64(1)] = np.uint16((lo >> np.uint32(16)) | ((hi & np.uint32(0xFF)) << np.uint32(8)))
        c16[i + np.uint64(2)] = np.uint16(hi >> np.uint32(8))
    else:  # 24: four 6-bit codes in three bytes
        i = np.uint64(3 * unit)
        c8[i] = np.uint8(lo & np.uint32(0xFF))
        c8[i + np.uint64(1)] = np.uint8((lo >> np.uint32(8)) & np.uint32(0xFF))
        c8[i + np.uint64(2)] = np.uint8(lo >> np.uint32(16))
