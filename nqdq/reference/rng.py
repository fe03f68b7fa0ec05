"""Counter-based random bits for stochastic rounding: Philox4x32-10 (Salmon et al.,
"Parallel random numbers: as easy as 1, 2, 3", SC 2011; the Random123 constants).

Element ``i`` of a tensor (its C-order linear index) takes word ``i % 4`` of the Philox
block at counter ``(i // 4 low 32 bits, i // 4 high 32 bits, 0, 0)`` under key
``(seed low 32 bits, seed high 32 bits)``. The bits therefore depend only on the seed and
the element's position, never on how a kernel is launched.
"""

from __future__ import annotations

import numpy as np

from . import codec

__all__ = ["philox4x32_10", "random_bits"]

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9  # golden ratio
PHILOX_W1 = 0xBB67AE85  # sqrt(3) - 1
_MASK32 = np.uint64(0xFFFFFFFF)


def _mulhilo(a: int, b: np.ndarray):
    p = np.uint64(a) * b.astype(np.uint64)
    return p >> np.uint64(32), p & _MASK32


def philox4x32_10(counter, key):
    """Philox4x32 with 10 rounds. ``counter``: 4 uint32 arrays, ``key``: 2 uint32 scalars/arrays.
    Returns 4 uint32 arrays."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in counter)
    k0, k1 = (np.asarray(k, dtype=np.uint64) for k in key)
    for _ in range(10):
        hi0, lo0 = _mulhilo(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + np.uint64(PHILOX_W0)) & _MASK32
        k1 = (k1 + np.uint64(PHILOX_W1)) & _MASK32
    return tuple(c.astype(np.uint32) for c in (c0, c1, c2, c3))


def random_bits(seed: int, n: int) -> np.ndarray:
    """32 random bits for each of ``n`` elements (linear indices 0..n-1), as uint32;
    computed ``codec.CHUNK`` elements (whole Philox blocks) at a time, so that the uint64
    temporaries of the rounds stay small."""
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    key = (np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32))
    step = codec.CHUNK
    assert step % 4 == 0, step
    out = np.empty(n, np.uint32)
    if n > step:
        codec.settle_allocator()
    for i in range(0, n, step):
        m = min(step, n - i)
        blocks = np.arange(i // 4, -(-(i + m) // 4), dtype=np.uint64)
        zero = np.zeros_like(blocks)
        words = philox4x32_10((blocks & _MASK32, blocks >> np.uint64(32), zero, zero), key)
        out[i : i + m] = np.stack(words, axis=-1).reshape(-1)[:m]
    return out
