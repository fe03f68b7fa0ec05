"""The statistics of 16-byte units (``units``) and their reductions over lanes, warps and the
block: the amax as the max of |x|'s float32 bits (order-independent, NaN above +inf), by
elements or two bfloat16 halves an instruction; butterfly steps of a max, a sum or an
exchange over lanes (``shfl.sync.bfly``, or the twin through shared memory and barriers
that the simulator runs: ``shfl=False``); the max over a block.
"""

from __future__ import annotations

import numpy as np

from ..device.codec import KIND_BF16, bits_f32, f32_bits
from ..ptx.pairs import absmax_nan, u16x2_max
from ..runtime.backend import cuda
from ..runtime.target import devfn
from .units import FINITE, unit_elems


@devfn
def xor_max(v, off, shfl, scratch, tid):
    """max(v, v of lane tid ^ off): one butterfly step of a max over lanes. ``shfl``
    (compile-time): ``shfl.sync.bfly``; else the twin through shared memory (every thread of
    the block must call it, as every caller here does)."""
    if shfl:
        return max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, off))
    cuda.syncthreads()
    scratch[tid] = v
    cuda.syncthreads()
    return max(v, scratch[tid ^ off])


@devfn
def abs_i32(b):
    return np.int32(b & np.uint32(0x7FFFFFFF))


@devfn
def unit_amax(e, vec):
    """max over the unit of |x|'s float32 bits (the amax as bits, NaN above +inf)."""
    a = max(max(abs_i32(e[0]), abs_i32(e[1])), max(abs_i32(e[2]), abs_i32(e[3])))
    if vec == 8:
        a = max(a, max(max(abs_i32(e[4]), abs_i32(e[5])), max(abs_i32(e[6]), abs_i32(e[7]))))
    return a


@devfn
def unit_amax_nan(e):
    """unit_amax of an 8-element unit by _ptx.absmax_nan (FMNMX.NAN of |.|): the same bits but
    for a unit holding a NaN, whose amax is 0x7FFFFFFF (above +inf, as unit_amax's |NaN|)."""
    a = absmax_nan(absmax_nan(e[0], e[1]), absmax_nan(e[2], e[3]))
    b = absmax_nan(absmax_nan(e[4], e[5]), absmax_nan(e[6], e[7]))
    return np.int32(absmax_nan(a, b))


@devfn
def finite_abs(b):
    a = abs_i32(b)
    return a if a < FINITE else np.int32(0)


@devfn
def unit_amax_finite(e, vec):
    """The same over the finite elements only (NVFP4's tensor amax)."""
    a = max(max(finite_abs(e[0]), finite_abs(e[1])), max(finite_abs(e[2]), finite_abs(e[3])))
    if vec == 8:
        a = max(a, max(max(finite_abs(e[4]), finite_abs(e[5])), max(finite_abs(e[6]), finite_abs(e[7]))))
    return a


@devfn
def word_amax16(w):
    """Per 16-bit half, max over the unit's 4 words of |x|'s bits (unsigned: the order of
    the float32 bits of |x|, NaN above +inf)."""
    m = np.uint32(0x7FFF7FFF)
    return np.uint32(u16x2_max(u16x2_max(w[0] & m, w[1] & m), u16x2_max(w[2] & m, w[3] & m)))


@devfn
def amax_step(a, a2, w, kind, vec):
    """Running amax of whole units (word tuples): bfloat16 words two halves per instruction
    into a2 (word_amax16), other kinds as float32 bits into a; amax_done combines them into
    unit_amax's value (the order of the bits is that of the float32 bits of |x|)."""
    if kind == KIND_BF16:
        return a, np.uint32(u16x2_max(a2, word_amax16(w)))
    return max(a, unit_amax(unit_elems(w, kind), vec)), a2


@devfn
def amax_done(a, a2, kind):
    if kind == KIND_BF16:
        return np.int32(max(a2 & np.uint32(0xFFFF), a2 >> np.uint32(16)) << np.uint32(16))
    return a


@devfn
def xor_add(v, off, shfl, scratch, tid):
    """v + (v of lane tid ^ off), float32: one butterfly step of a sum. IEEE addition is
    commutative, so both lanes of a pair hold the same sum. The twin passes the bits through
    the int32 scratch."""
    if shfl:
        return v + cuda.shfl_xor_sync(0xFFFFFFFF, v, off)
    cuda.syncthreads()
    scratch[tid] = np.int32(f32_bits(v))
    cuda.syncthreads()
    return v + bits_f32(np.uint32(scratch[tid ^ off]))


@devfn
def xor_get(v, off, shfl, scratch, tid):
    """float32 v of lane tid ^ off (``shfl.sync.bfly``; the twin through the int32 scratch)."""
    if shfl:
        return cuda.shfl_xor_sync(0xFFFFFFFF, v, off)
    cuda.syncthreads()
    scratch[tid] = np.int32(f32_bits(v))
    cuda.syncthreads()
    return bits_f32(np.uint32(scratch[tid ^ off]))


def _block_max_fn(NT, shfl):
    NW = NT // 32

    @devfn
    def block_max(a, tid, scratch, red):
        """The max of ``a`` over the block: butterfly in each warp, one shared slot per warp."""
        off = 16
        while off > 0:
            a = xor_max(a, off, shfl, scratch, tid)
            off >>= 1
        if (tid & 31) == 0:
            red[tid >> 5] = a
        cuda.syncthreads()
        for k in range(NW):
            a = max(a, red[k])
        return a

    return block_max
