"""Scale layouts on the GPU: the index maps of ``nqdq.reference.layouts``, one scale per
thread, bit-identical to the reference (they only move bytes, so exactness is the map).

Both directions are gathers so that the writes are coalesced:

* ``swizzle``: thread ``o`` of the swizzled array works out which linear scale ``(r, c)``
  lands there (``_position_*``) and copies it, or writes the zero pad byte when ``(r, c)``
  is outside ``[rows, cols]``;
* ``unswizzle``: thread ``e = r * cols + c`` of the linear array reads the swizzled byte at
  ``_offset_*(r, c)`` (the reference's ``ScaleLayout.offset``).

uint8 scales (e8m0, ue4m3) are written four bytes per thread as one 32-bit store (the
``*_words`` kernels; unswizzle needs ``cols % 4 == 0`` for that, else one byte per thread).

Tile sizes are powers of two, so the maps are shifts and masks; the only divisions are by
the number of tile columns and (unswizzle) by ``cols``. Launchers take NumPy arrays (the
CUDA simulator; on a GPU they are copied there and back), CuPy arrays or Numba device
arrays, and return the same library.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from ..reference.layouts import get_layout
from ._interop import Allocator, is_cupy
from ._target import SIMULATOR, devfn
from .launch import fast_kernel

__all__ = ["swizzle", "unswizzle", "THREADS"]

THREADS = 64 if SIMULATOR else 256  # threads per block (results never depend on it)


# ------------------------------------------------------------------ linear (r, c) -> offset
@devfn
def _offset_nv_128x4(r, c, Cp):
    # tile (r // 128, c // 4), row-block major; in the tile (r % 32) * 16 + (r // 32 % 4) * 4 + c % 4
    tile = (r >> 7) * (Cp >> 2) + (c >> 2)
    return (tile << 9) + ((r & 31) << 4) + (((r >> 5) & 3) << 2) + (c & 3)


@devfn
def _offset_cdna4_32(r, c, Cp):
    # stored axes (r // 32, c // 8, c % 2, r % 32, (c % 8) // 2), sizes (., ., 2, 32, 4)
    blk = (r >> 5) * (Cp >> 3) + (c >> 3)
    return (blk << 8) + ((c & 1) << 7) + ((r & 31) << 2) + ((c >> 1) & 3)


@devfn
def _offset_cdna4_16(r, c, Cp):
    # stored axes (r // 32, c // 8, c % 4, r % 16, (c % 8) // 4, (r % 32) // 16), sizes (., ., 4, 16, 2, 2)
    blk = (r >> 5) * (Cp >> 3) + (c >> 3)
    return (blk << 8) + ((c & 3) << 6) + ((r & 15) << 2) + (((c >> 2) & 1) << 1) + ((r >> 4) & 1)


# ------------------------------------------------------------------ offset -> linear (r, c)
@devfn
def _position_nv_128x4(o, Cp):
    ncb = Cp >> 2
    tile = o >> 9
    w = o & 511
    rb = tile // ncb
    cb = tile - rb * ncb
    return (rb << 7) + (((w >> 2) & 3) << 5) + (w >> 4), (cb << 2) + (w & 3)


@devfn
def _position_cdna4_32(o, Cp):
    ncb = Cp >> 3
    blk = o >> 8
    w = o & 255
    a = blk // ncb
    cb = blk - a * ncb
    return (a << 5) + ((w >> 2) & 31), (cb << 3) + ((w & 3) << 1) + (w >> 7)


@devfn
def _position_cdna4_16(o, Cp):
    ncb = Cp >> 3
    blk = o >> 8
    w = o & 255
    a = blk // ncb
    cb = blk - a * ncb
    return (a << 5) + ((w & 1) << 4) + ((w >> 2) & 15), (cb << 3) + (((w >> 1) & 1) << 2) + (w >> 6)


_MAPS = {
    "nv_128x4": (_offset_nv_128x4, _position_nv_128x4),
    "cdna4_32": (_offset_cdna4_32, _position_cdna4_32),
    "cdna4_16": (_offset_cdna4_16, _position_cdna4_16),
}
_KERNELS: dict = {}


def _kernels(name):
    """(swizzle_kernel, unswizzle_kernel) for layout ``name``, built once."""
    if name in _KERNELS:
        return _KERNELS[name]
    offset, position = _MAPS[name]

    @cuda.jit
    def swizzle_kernel(src, rows, cols, Cp, dst, n_out):
        """dst[o] = src[r * cols + c] for the (r, c) stored at o; 0 in the padding."""
        for o in range(cuda.grid(1), n_out, cuda.gridsize(1)):
            r, c = position(o, Cp)
            if r < rows and c < cols:
                dst[o] = src[r * cols + c]
            else:
                dst[o] = 0

    @cuda.jit
    def unswizzle_kernel(src, rows, cols, Cp, dst):
        """dst[r * cols + c] = src[offset(r, c)]."""
        n = rows * cols
        for e in range(cuda.grid(1), n, cuda.gridsize(1)):
            r = e // cols
            c = e - r * cols
            dst[e] = src[offset(r, c, Cp)]

    @cuda.jit
    def swizzle_words_kernel(src, rows, cols, Cp, dst32, n_words):
        """swizzle_kernel for uint8 scales, four output bytes per thread, one 32-bit store
        (little-endian: byte o + j is bits 8j..8j+7 of word o // 4)."""
        for t in range(cuda.grid(1), n_words, cuda.gridsize(1)):
            o = t << 2
            word = 0
            for j in range(4):
                r, c = position(o + j, Cp)
                if r < rows and c < cols:
                    word |= np.int64(src[r * cols + c]) << (j << 3)
            dst32[t] = word

    @cuda.jit
    def unswizzle_words_kernel(src, rows, cols, Cp, dst32):
        """unswizzle_kernel for uint8 scales with cols % 4 == 0: four bytes of one row per
        thread, one 32-bit store."""
        n_words = (rows * cols) >> 2
        for t in range(cuda.grid(1), n_words, cuda.gridsize(1)):
            e = t << 2
            r = e // cols
            c = e - r * cols
            word = 0
            for j in range(4):
                word |= np.int64(src[offset(r, c + j, Cp)]) << (j << 3)
            dst32[t] = word

    _KERNELS[name] = (swizzle_kernel, unswizzle_kernel, swizzle_words_kernel, unswizzle_words_kernel)
    return _KERNELS[name]


def _lib_of(a) -> str:
    if isinstance(a, np.ndarray):
        return "numpy"
    return "cupy" if is_cupy(a) else "numba"


def _flat_device(a, lib, argname):
    """``a`` as a flat C-contiguous array the kernels can read (NumPy is copied to the GPU
    outside the simulator)."""
    if lib == "numpy":
        a = np.ascontiguousarray(a).reshape(-1)
        return a if SIMULATOR else cuda.to_device(a)
    if lib == "cupy":
        import cupy

        return cupy.ascontiguousarray(a).reshape(-1)
    if not getattr(a, "is_c_contiguous", lambda: True)():
        raise ValueError(f"{argname} must be C-contiguous")
    return a.reshape(a.size)


def _copy(a):
    if hasattr(a, "copy_to_host") and not is_cupy(a):  # a Numba device array
        out = cuda.device_array_like(a)
        out.copy_to_device(a)
        return out
    return a.copy()


def _grid(n, nt):
    return max(1, min(-(-n // nt), 1 << 20))


def _words(a):
    """A flat uint8 device array viewed as uint32 (its length is a multiple of 4)."""
    return a.view(np.uint32)


def swizzle(scales, layout: str, *, threads=None, words=True):
    """``nqdq.reference.layouts.get_layout(layout).swizzle(scales)`` on the device.

    ``scales``: 2-D ``[rows, cols]`` (any 1-, 2-, 4- or 8-byte dtype; e8m0 / ue4m3 codes are
    uint8). Returns the swizzled array (shape ``swizzled_shape(rows, cols)``, zero padding)
    in the input's library. ``words``: uint8 scales are written four bytes per thread with
    32-bit stores (every swizzled size is a multiple of 256); False forces one byte per
    thread (same result; tests and benchmarks)."""
    L = get_layout(layout)
    if len(scales.shape) != 2:
        raise ValueError(f"scales must be 2-D [rows, cols], got shape {tuple(scales.shape)}")
    rows, cols = (int(d) for d in scales.shape)
    oshape = L.swizzled_shape(rows, cols)
    if layout == "linear":
        return _copy(scales)
    lib = _lib_of(scales)
    alloc = Allocator(lib)
    n_out = int(np.prod(oshape))
    dst = alloc.empty(n_out, np.dtype(scales.dtype))
    if n_out:
        nt = threads or THREADS
        Cp = L.padded(rows, cols)[1]
        src = _flat_device(scales, lib, "scales")
        ks = _kernels(layout)
        if words and dst.dtype.itemsize == 1:
            args = (src, rows, cols, Cp, _words(dst), n_out >> 2)
            fast_kernel(ks[2]).launch(_grid(n_out >> 2, nt), nt, args, None)
        else:
            fast_kernel(ks[0]).launch(_grid(n_out, nt), nt, (src, rows, cols, Cp, dst, n_out), None)
    return alloc.to_lib(dst, oshape)


def unswizzle(stored, layout: str, rows: int, cols: int, *, threads=None, words=True):
    """``nqdq.reference.layouts.get_layout(layout).unswizzle(stored, rows, cols)`` on the
    device: the ``[rows, cols]`` scales, in the input's library. ``words``: uint8 scales with
    ``cols % 4 == 0`` are written four bytes per thread with 32-bit stores."""
    L = get_layout(layout)
    want = L.swizzled_shape(rows, cols)
    if tuple(int(d) for d in stored.shape) != want:
        raise ValueError(
            f"stored scales have shape {tuple(stored.shape)}, but layout {layout!r} of a "
            f"[{rows}, {cols}] scale matrix is {want}"
        )
    if layout == "linear":
        return _copy(stored)
    lib = _lib_of(stored)
    alloc = Allocator(lib)
    dst = alloc.empty(rows * cols, np.dtype(stored.dtype))
    if rows * cols:
        nt = threads or THREADS
        Cp = L.padded(rows, cols)[1]
        src = _flat_device(stored, lib, "stored")
        ks = _kernels(layout)
        if words and dst.dtype.itemsize == 1 and cols % 4 == 0:
            args = (src, rows, cols, Cp, _words(dst))
            fast_kernel(ks[3]).launch(_grid((rows * cols) >> 2, nt), nt, args, None)
        else:
            fast_kernel(ks[1]).launch(_grid(rows * cols, nt), nt, (src, rows, cols, Cp, dst), None)
    return alloc.to_lib(dst, (rows, cols))
