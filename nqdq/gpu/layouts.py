"""Scale layouts on the GPU: the index maps of ``nqdq.reference.layouts``, bit-identical to
the reference (they only move bytes, so exactness is the map). Two kernel families:

The general one, one scale per thread (any dtype, any shape); both directions are gathers
so that the writes are coalesced:

* ``swizzle``: thread ``o`` of the swizzled array works out which linear scale ``(r, c)``
  lands there (``_position_*``) and copies it, or writes the zero pad byte when ``(r, c)``
  is outside ``[rows, cols]``;
* ``unswizzle``: thread ``e = r * cols + c`` of the linear array reads the swizzled byte at
  ``_offset_*(r, c)`` (the reference's ``ScaleLayout.offset``).

The fast one, for uint8 scales (e8m0, ue4m3) with ``cols % 4 == 0`` (K a multiple of 128
for MX, 64 for NVFP4): the tiled ``_*_words_*`` kernels move 32-bit words staged through
shared memory, coalesced on both sides (H100, 64 MiB: 49-77% of copy bandwidth against
about 10% for the general kernels).

Tile sizes are powers of two, so the maps are shifts and masks; the only divisions are by
the number of tile columns and (unswizzle) by ``cols``. Launchers take NumPy arrays (the
CUDA simulator; on a GPU they are copied there and back), CuPy arrays or Numba device
arrays, and return the same library.
"""

from __future__ import annotations

import numpy as np
from numba import uint32
from .runtime.backend import cuda

from ..reference.layouts import get_layout
from .runtime.interop import Allocator, is_cupy, lib_of
from .runtime.target import SIMULATOR, devfn
from .runtime.launch import fast_kernel

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


# ------------------------------------------------------------------ 32-bit words, tiled
# uint8 scales with cols % 4 == 0 (K a multiple of 128 for MX, 64 for NVFP4): the linear
# matrix is ``cw = cols / 4`` 32-bit words per row (little-endian: byte j of a word is bits
# 8j..8j+7). One block of TB threads moves one slab through shared memory, so that both the
# linear side (whole 32-byte row segments) and the swizzled side (whole tiles, contiguous)
# are read and written coalesced:
#   nv_128x4: 128 rows x 8 words = 8 tiles of 128 words; a row's 4 scales of one tile are
#             one word, stored at word (r % 32) * 4 + r // 32 of the tile;
#   cdna4_*:  32 rows x 16 words = 8 blocks of 64 words; each swizzled word gathers bytes of
#             two (32) or four (16) linear words.
TB = 256  # threads per block of the tiled kernels (their loops assume it)
_NV_SLAB = 8  # tiles (linear words) per nv_128x4 slab
_NV_PITCH = 129  # shared-memory words per tile (one spare: fewer bank conflicts)
_CD_SLAB = 16  # linear words per cdna4 slab row (8 blocks of 8 scales)
_CD_PITCH = 17
_NV_SMEM = 1032  # _NV_SLAB * _NV_PITCH (shared array sizes must be literal constants)
_CD_SMEM = 544  # 32 * _CD_PITCH
_CD_SMEM_OUT = 512  # 32 * _CD_SLAB


@devfn
def _byte(w, j):
    return (np.int64(w) >> (j << 3)) & 0xFF


@cuda.jit
def _swizzle_words_nv_128x4(src32, rows, cw, dst32, nsc):
    sm = cuda.shared.array(_NV_SMEM, uint32)
    t = cuda.threadIdx.x
    bid = cuda.blockIdx.x
    rb = bid // nsc
    cb0 = (bid - rb * nsc) * _NV_SLAB
    for k in range(4):  # 128 rows x 8 words, 8 consecutive words of a row per 8 threads
        q = t + k * TB
        row = q >> 3
        wi = q & 7
        r = (rb << 7) + row
        v = np.uint32(0)  # the pad: rows beyond ``rows``, tiles beyond ``cw``
        if r < rows and cb0 + wi < cw:
            v = src32[r * cw + cb0 + wi]
        sm[wi * _NV_PITCH + ((row & 31) << 2) + (row >> 5)] = v
    cuda.syncthreads()
    base = (rb * cw + cb0) << 7
    n = min(_NV_SLAB, cw - cb0) << 7
    for k in range(4):
        q = t + k * TB
        if q < n:
            dst32[base + q] = sm[(q >> 7) * _NV_PITCH + (q & 127)]


@cuda.jit
def _unswizzle_words_nv_128x4(src32, rows, cw, dst32, nsc):
    sm = cuda.shared.array(_NV_SMEM, uint32)
    t = cuda.threadIdx.x
    bid = cuda.blockIdx.x
    rb = bid // nsc
    cb0 = (bid - rb * nsc) * _NV_SLAB
    base = (rb * cw + cb0) << 7
    n = min(_NV_SLAB, cw - cb0) << 7
    for k in range(4):
        q = t + k * TB
        if q < n:
            sm[(q >> 7) * _NV_PITCH + (q & 127)] = src32[base + q]
    cuda.syncthreads()
    for k in range(4):
        q = t + k * TB
        row = q >> 3
        wi = q & 7
        r = (rb << 7) + row
        if r < rows and cb0 + wi < cw:
            dst32[r * cw + cb0 + wi] = sm[wi * _NV_PITCH + ((row & 31) << 2) + (row >> 5)]


def _make_cdna4_word_kernels(mfma_dim):
    is32 = mfma_dim == 32

    @cuda.jit
    def swizzle_words(src32, rows, cw, dst32, nsc):
        sm = cuda.shared.array(_CD_SMEM, uint32)
        t = cuda.threadIdx.x
        bid = cuda.blockIdx.x
        a = bid // nsc
        w0 = (bid - a * nsc) * _CD_SLAB
        for k in range(2):  # 32 rows x 16 words
            q = t + k * TB
            row = q >> 4
            wi = q & 15
            r = (a << 5) + row
            v = np.uint32(0)
            if r < rows and w0 + wi < cw:
                v = src32[r * cw + w0 + wi]
            sm[row * _CD_PITCH + wi] = v
        cuda.syncthreads()
        ncb = (cw + 1) >> 1  # 8-scale blocks per row (the last may be half padding)
        cb0 = w0 >> 1
        base = (a * ncb + cb0) << 6
        n = min(_CD_SLAB >> 1, ncb - cb0) << 6
        for k in range(2):
            q = t + k * TB
            if q < n:
                b2 = (q >> 6) << 1  # the block's first linear word in the slab
                u = q & 63
                if is32:
                    # word e * 32 + r holds columns e, e + 2, e + 4, e + 6 of row r
                    e = (u >> 5) & 1
                    p = (u & 31) * _CD_PITCH + b2
                    w = (_byte(sm[p], e) | (_byte(sm[p], e + 2) << 8) | (_byte(sm[p + 1], e) << 16)
                         | (_byte(sm[p + 1], e + 2) << 24))
                else:
                    # word kk * 16 + l holds (l, kk), (l + 16, kk), (l, kk + 4), (l + 16, kk + 4)
                    kk = (u >> 4) & 3
                    p = (u & 15) * _CD_PITCH + b2
                    p16 = p + 16 * _CD_PITCH
                    w = (_byte(sm[p], kk) | (_byte(sm[p16], kk) << 8) | (_byte(sm[p + 1], kk) << 16)
                         | (_byte(sm[p16 + 1], kk) << 24))
                dst32[base + q] = w

    @cuda.jit
    def unswizzle_words(src32, rows, cw, dst32, nsc):
        sm = cuda.shared.array(_CD_SMEM_OUT, uint32)
        t = cuda.threadIdx.x
        bid = cuda.blockIdx.x
        a = bid // nsc
        w0 = (bid - a * nsc) * _CD_SLAB
        ncb = (cw + 1) >> 1
        cb0 = w0 >> 1
        base = (a * ncb + cb0) << 6
        n = min(_CD_SLAB >> 1, ncb - cb0) << 6
        for k in range(2):
            q = t + k * TB
            if q < n:
                sm[q] = src32[base + q]
        cuda.syncthreads()
        for k in range(2):
            q = t + k * TB
            row = q >> 4
            wi = q & 15
            r = (a << 5) + row
            if r < rows and w0 + wi < cw:
                b = (wi >> 1) << 6
                if is32:
                    # columns 4 * wi .. + 3 are bytes d, d, d + 1, d + 1 of words e = 0, 1, 0, 1
                    d = (wi & 1) << 1
                    e0 = sm[b + row]
                    e1 = sm[b + 32 + row]
                    w = _byte(e0, d) | (_byte(e1, d) << 8) | (_byte(e0, d + 1) << 16) | (_byte(e1, d + 1) << 24)
                else:
                    # column kk of the 4 is byte (g, h) of word kk * 16 + row % 16
                    j = ((wi & 1) << 1) + (row >> 4)
                    p = b + (row & 15)
                    w = (_byte(sm[p], j) | (_byte(sm[p + 16], j) << 8) | (_byte(sm[p + 32], j) << 16)
                         | (_byte(sm[p + 48], j) << 24))
                dst32[r * cw + w0 + wi] = w

    return swizzle_words, unswizzle_words


_WORD_KERNELS = {
    "nv_128x4": (_swizzle_words_nv_128x4, _unswizzle_words_nv_128x4),
    "cdna4_32": _make_cdna4_word_kernels(32),
    "cdna4_16": _make_cdna4_word_kernels(16),
}


def _word_grid(layout, rows, cw):
    """(blocks, slabs per row of tiles) of the tiled word kernels."""
    if layout == "nv_128x4":
        nsc = -(-cw // _NV_SLAB)
        return -(-rows // 128) * nsc, nsc
    nsc = -(-cw // _CD_SLAB)
    return -(-rows // 32) * nsc, nsc


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
    lib = lib_of(scales)
    alloc = Allocator(lib)
    n_out = int(np.prod(oshape))
    dst = alloc.empty(n_out, np.dtype(scales.dtype))
    if n_out:
        _move(layout, _SWIZZLE, _flat_device(scales, lib, "scales"), rows, cols, dst, n_out, threads, words)
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
    lib = lib_of(stored)
    alloc = Allocator(lib)
    dst = alloc.empty(rows * cols, np.dtype(stored.dtype))
    if rows * cols:
        _move(layout, _UNSWIZZLE, _flat_device(stored, lib, "stored"), rows, cols, dst, rows * cols, threads, words)
    return alloc.to_lib(dst, (rows, cols))


_SWIZZLE, _UNSWIZZLE = 0, 1  # index of the direction in _kernels(): general, then word kernels at + 2


def _move(layout, direction, src, rows, cols, dst, n_dst, threads, words):
    """Launch one direction of ``layout`` from the flat ``src`` into the ``n_dst`` elements
    of ``dst``: the tiled word kernel where it applies (and ``words``), else the general
    one-scale-per-thread kernel."""
    ks = _kernels(layout)
    if words and _word_path(src, cols):
        nb, nsc = _word_grid(layout, rows, cols >> 2)
        fast_kernel(ks[2 + direction]).launch(nb, TB, (_words(src), rows, cols >> 2, _words(dst), nsc), None)
        return
    nt = threads or THREADS
    Cp = get_layout(layout).padded(rows, cols)[1]
    args = (src, rows, cols, Cp, dst, n_dst) if direction == _SWIZZLE else (src, rows, cols, Cp, dst)
    fast_kernel(ks[direction]).launch(_grid(n_dst, nt), nt, args, None)
