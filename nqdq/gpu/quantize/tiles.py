"""One-pass kernel for B0 x B1 block scales (``fp8_128x128``: 128 x 128 tiles) over the last
two axes of a C-contiguous input whose rows hold whole tiles of whole 16-byte units
(C % B1 == 0, B1 % VEC == 0); a partial last row-tile is fine (its missing rows count as
zeros, as the reference pads them). ``quantize._fast_tile`` decides, at plan time; the
general path (``tile_params`` then ``encode``) reads the input twice, element by element.

One block per tile: thread t holds the tile's units t, t + NT, ... (U of them; a tile row
is LU = B1 / VEC units, so a warp reads 32 / LU whole rows of 16 * LU bytes: coalesced) in
registers from the load to the encode. The tile's amax is combined by a warp butterfly and
one shared slot per warp (``quantize.reductions._block_max_fn``), the scale is ``group_params``'
float scale, and units are encoded and stored by ``encode_store_unit``: the same device
functions, hence the same exactness argument, as the last-axis kernels (see
``quantize.lastaxis``).
"""

from __future__ import annotations

from functools import lru_cache

from . import lastaxis
from ..device.codec import F32
from ..ptx.convert import fp8_cvt_available, fp8_cvt_supports
from ..ptx.memory import as_u16, as_u32

__all__ = ["make_tile_kernel"]

# The tile's reciprocal 1 / s once per thread (encode_store_unit_r), not once per unit: each
# unit's encode sits in its own `if ok{j}` block, so NVVM would compute recip_guarded (a div.rn)
# U = 8 times per thread. The same quotients (device.division), hence the same codes. H100: bf16
# 8192x8192 / 16384x7168 86 / 88 -> 91 / 93 % of copy (docs/design/last-axis.md). No launch
# bound: 3 blocks per SM (80 instead of 89 registers, no spills) measured no faster.
_STORE_UNIT = "encode_store_unit_r(unit_elems(w{j}, kind), g{j}, p0, rp, clean, codes, c16, c32, MODE_FLOAT, fmt, CVT, VEC, NB)"

_TILE_SRC = """
def tile_blocks(x, R, C, nR, nC, codes, scales):
    tid = cuda.threadIdx.x
    t = cuda.blockIdx.x
    scratch = cuda.shared.array(SCRATCH, int32)
    red = cuda.shared.array(NW, int32)
    x32 = as_u32(x)
    c32 = as_u32(codes)
    c16 = as_u16(codes)
    aligned = (array_addr(x) & 15) == 0
    tj = t % nC
    tr = t // nC
    ti = tr % nR
    bt = tr // nR
    r0 = ti * B0
    upr = C // VEC
    ubase = (bt * R + r0) * upr + tj * LU
    nrows = min(B0, R - r0)
    q{j} = tid + {jNT}
    ok{j} = q{j} < TU and q{j} // LU < nrows
    g{j} = ubase + (q{j} // LU) * upr + (q{j} % LU)
    w{j} = load_unit(x, x32, aligned, g{j}, ok{j}, kind)
    a = np.int32(0)
    a = max(a, unit_amax(unit_elems(w{j}, kind), VEC))
    a = block_max(a, tid, scratch, red)
    sv, p0, pz = group_params(MODE_FLOAT, a, ZERO, ZERO, MAXE, 0, 0, 0, ONE, ONE)
    if tid == 0:
        scales[t] = sv
    clean = a < FINITE
    rp = recip_guarded(p0)
    if ok{j}: STORE_UNIT
"""


def tile_geometry(kind, B0, B1):
    """(LU, TU, NT, U): units per tile row, per tile, threads per block, units per thread
    (about 8 per thread, at most 1024 threads)."""
    vec = lastaxis.vec_of(kind)
    LU = B1 // vec
    TU = B0 * LU
    NT = 32
    while NT < 1024 and NT * 8 < TU:
        NT *= 2
    return LU, TU, NT, -(-TU // NT)


@lru_cache(maxsize=None)
def make_tile_kernel(kind, fmt, max_elem, B0, B1, packed, shfl):
    """The one-pass B0 x B1 tile kernel for float scales (symmetric float / int elements,
    RNE): launched with one block of NT threads per tile, tiles numbered (batch, row tile,
    column tile) in C order, as the scales array."""
    VEC = lastaxis.vec_of(kind)
    assert B1 % VEC == 0
    LU, TU, NT, U = tile_geometry(kind, B0, B1)
    ns = dict(NT=NT, U=U, NW=NT // 32, SCRATCH=1 if shfl else NT, kind=kind,
              fmt=fmt, VEC=VEC, NB=fmt[5] if packed else 8, CVT=fp8_cvt_available() and fp8_cvt_supports(fmt),
              MAXE=F32(max_elem), B0=B0, LU=LU, TU=TU, block_max=lastaxis._block_max_fn(NT, shfl))
    return lastaxis._jit_unrolled("tile_blocks", _TILE_SRC.replace("STORE_UNIT", _STORE_UNIT), ns, U)
