"""Scale layouts on the GPU: the index maps of ``nqdq.reference.layouts``, one scale per
thread, bit-identical to the reference (they only move bytes, so exactness is the map).

Both directions are gathers so that the writes are coalesced:

* ``swizzle``: thread ``o`` of the swizzled array works out which linear scale ``(r, c)``
  lands there (``_position_*``) and copies it, or writes the zero pad byte when ``(r, c)``
  is outside ``[rows, cols]``;
* ``unswizzle``: thread ``e = r * cols + c`` of the linear array reads the swizzled byte at
  ``_offset_*(r, c)`` (the reference's ``ScaleLayout.offset``).

uint8 scales (e8m0, ue4m3) with ``cols % 4 == 0`` (K a multiple of 128 for MX, 64 for
NVFP4) go through ``_*_words_*`` kernels instead: one thread per 32-bit word written, which
loads one to four 32-bit words of the other side and shuffles their bytes; other shapes and
dtypes take the one-scale-per-thread kernels above.

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

    _KERNELS[name] = (swizzle_kernel, unswizzle_kernel) + _WORD_KERNELS[name]
    return _KERNELS[name]


# ------------------------------------------------------------------ 32-bit words
# uint8 scales with cols % 4 == 0 (K a multiple of 128 for MX): the linear matrix is
# ``cw = cols / 4`` 32-bit words per row, and every layout moves whole words or shuffles
# the bytes of a few (little-endian: byte j of a word is bits 8j..8j+7). One thread per
# word of the array written, so the stores are coalesced; the loads gather from L2.
@devfn
def _byte(w, j):
    return (w >> (j << 3)) & 0xFF


@devfn
def _load_word(src32, r, wi, rows, cw):
    """Word ``wi`` of linear row ``r``; 0 (the pad) outside ``rows x cw``."""
    if r < rows and wi < cw:
        return np.int64(src32[r * cw + wi])
    return np.int64(0)


@cuda.jit
def _swizzle_words_nv_128x4(src32, rows, cw, dst32, n_words):
    # a row's 4 scales of one tile are one word: word (r, cb) -> tile * 128 + (r % 32) * 4 + r // 32 % 4
    for u in range(cuda.grid(1), n_words, cuda.gridsize(1)):
        tile = u >> 7
        rb = tile // cw
        cb = tile - rb * cw
        r = (rb << 7) + ((u & 3) << 5) + ((u >> 2) & 31)
        dst32[u] = _load_word(src32, r, cb, rows, cw)


@cuda.jit
def _unswizzle_words_nv_128x4(src32, rows, cw, dst32):
    n = rows * cw
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        r = e // cw
        cb = e - r * cw
        dst32[e] = src32[(((r >> 7) * cw + cb) << 7) + ((r & 31) << 2) + ((r >> 5) & 3)]


@cuda.jit
def _swizzle_words_cdna4_32(src32, rows, cw, dst32, n_words):
    # block (r // 32, c // 8) = 64 words; word e * 32 + r % 32 holds columns e, e+2, e+4, e+6
    ncb = (cw + 1) >> 1
    for u in range(cuda.grid(1), n_words, cuda.gridsize(1)):
        blk = u >> 6
        a = blk // ncb
        cb = blk - a * ncb
        e = (u >> 5) & 1
        r = (a << 5) + (u & 31)
        w0 = _load_word(src32, r, cb << 1, rows, cw)  # columns 0..3 of the block
        w1 = _load_word(src32, r, (cb << 1) + 1, rows, cw)  # columns 4..7
        dst32[u] = _byte(w0, e) | (_byte(w0, e + 2) << 8) | (_byte(w1, e) << 16) | (_byte(w1, e + 2) << 24)


@cuda.jit
def _unswizzle_words_cdna4_32(src32, rows, cw, dst32):
    ncb = (cw + 1) >> 1
    n = rows * cw
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        r = e // cw
        wi = e - r * cw
        base = ((r >> 5) * ncb + (wi >> 1)) << 6
        d = (wi & 1) << 1  # columns 4 * wi .. + 3 are d, d, d+1, d+1 of words e=0, 1, 0, 1
        e0 = np.int64(src32[base + (r & 31)])
        e1 = np.int64(src32[base + 32 + (r & 31)])
        dst32[e] = _byte(e0, d) | (_byte(e1, d) << 8) | (_byte(e0, d + 1) << 16) | (_byte(e1, d + 1) << 24)


@cuda.jit
def _swizzle_words_cdna4_16(src32, rows, cw, dst32, n_words):
    # block word k * 16 + r % 16 holds (r, k), (r + 16, k), (r, k + 4), (r + 16, k + 4)
    ncb = (cw + 1) >> 1
    for u in range(cuda.grid(1), n_words, cuda.gridsize(1)):
        blk = u >> 6
        a = blk // ncb
        cb = blk - a * ncb
        k = (u >> 4) & 3
        r = (a << 5) + (u & 15)
        lo0 = _load_word(src32, r, cb << 1, rows, cw)
        hi0 = _load_word(src32, r + 16, cb << 1, rows, cw)
        lo1 = _load_word(src32, r, (cb << 1) + 1, rows, cw)
        hi1 = _load_word(src32, r + 16, (cb << 1) + 1, rows, cw)
        dst32[u] = _byte(lo0, k) | (_byte(hi0, k) << 8) | (_byte(lo1, k) << 16) | (_byte(hi1, k) << 24)


@cuda.jit
def _unswizzle_words_cdna4_16(src32, rows, cw, dst32):
    ncb = (cw + 1) >> 1
    n = rows * cw
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        r = e // cw
        wi = e - r * cw
        base = (((r >> 5) * ncb + (wi >> 1)) << 6) + (r & 15)
        j = ((wi & 1) << 1) + ((r >> 4) & 1)  # byte (g, h) of each word k
        dst32[e] = (_byte(np.int64(src32[base]), j) | (_byte(np.int64(src32[base + 16]), j) << 8)
                    | (_byte(np.int64(src32[base + 32]), j) << 16) | (_byte(np.int64(src32[base + 48]), j) << 24))


_WORD_KERNELS = {
    "nv_128x4": (_swizzle_words_nv_128x4, _unswizzle_words_nv_128x4),
    "cdna4_32": (_swizzle_words_cdna4_32, _unswizzle_words_cdna4_32),
    "cdna4_16": (_swizzle_words_cdna4_16, _unswizzle_words_cdna4_16),
}


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
    """A flat uint8 array viewed as uint32 (its length is a multiple of 4)."""
    return a.view(np.uint32)


def _address(a) -> int:
    if isinstance(a, np.ndarray):
        return a.ctypes.data
    return int(a.__cuda_array_interface__["data"][0])


def _word_path(src, cols) -> bool:
    """The 32-bit word kernels apply: uint8 scales, whole words per row, aligned."""
    return np.dtype(src.dtype).itemsize == 1 and cols % 4 == 0 and _address(src) % 4 == 0


def swizzle(scales, layout: str, *, threads=None, words=True):
    """``nqdq.reference.layouts.get_layout(layout).swizzle(scales)`` on the device.

    ``scales``: 2-D ``[rows, cols]`` (any 1-, 2-, 4- or 8-byte dtype; e8m0 / ue4m3 codes are
    uint8). Returns the swizzled array (shape ``swizzled_shape(rows, cols)``, zero padding)
    in the input's library. ``words``: uint8 scales with ``cols % 4 == 0`` move as 32-bit
    words (see the module docstring); False forces one scale per thread (same result;
    tests and benchmarks)."""
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
        if words and _word_path(src, cols):
            args = (_words(src), rows, cols >> 2, _words(dst), n_out >> 2)
            fast_kernel(ks[2]).launch(_grid(n_out >> 2, nt), nt, args, None)
        else:
            fast_kernel(ks[0]).launch(_grid(n_out, nt), nt, (src, rows, cols, Cp, dst, n_out), None)
    return alloc.to_lib(dst, oshape)


def unswizzle(stored, layout: str, rows: int, cols: int, *, threads=None, words=True):
    """``nqdq.reference.layouts.get_layout(layout).unswizzle(stored, rows, cols)`` on the
    device: the ``[rows, cols]`` scales, in the input's library. ``words``: as in
    :func:`swizzle`."""
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
        if words and _word_path(src, cols):
            args = (_words(src), rows, cols >> 2, _words(dst))
            fast_kernel(ks[3]).launch(_grid((rows * cols) >> 2, nt), nt, args, None)
        else:
            fast_kernel(ks[1]).launch(_grid(rows * cols, nt), nt, (src, rows, cols, Cp, dst), None)
    return alloc.to_lib(dst, (rows, cols))
