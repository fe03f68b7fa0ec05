"""The weight-only GEMM of 4-bit weights with group scales along K, dequantized in registers:
``out = epilogue(x @ dequant(qw).T)``, x bfloat16 [M, K], qw ``int4_group`` / ``int4_asym``
[N, K] (groups of G along K, G a multiple of 128), for the small M of decoding.

The weight is read once, as it is stored (packed int4, two codes a byte, element 2i in the
low nibble), and never written back in another form: at M <= 64 the GEMM is a read of the
weight (14336 x 4096 int4: 29 MB + scales), so the kernel puts the weight on the MMA's M
side (``mma.sync.m16n8k16.bf16``: A = 16 weight rows, B = 8 tokens of x) and streams it.

K order. The products are summed over K, so a lane may take any K positions as long as A
and B agree. For one 128-element chunk of K, lane (g, t) (g = lane // 4, t = lane % 4)
reads 16 contiguous bytes of weight rows g and g + 8 (K elements 32t .. 32t + 31) and 64
bytes of x (the same K elements, for token g of each n8 tile); step s (0..7) of the chunk
gives the mma, as its logical K pairs (2t, 2t+1) and (8+2t, 9+2t), the physical elements
32t + 4s + (0, 1) and 32t + 4s + (2, 3). Every logical K index maps to one physical index,
whatever the row, so A @ B is the chunk's sum in another order.

Dequantization: a code's integer value v - c (symmetric: the two's-complement nibble, c = 0;
asymmetric: the unsigned nibble minus its group's zero point) is at most 15 in magnitude, so
``float32(v - c)`` and its bfloat16 are exact; the mma sums exact products of x and those
integers in float32, and each chunk's partial sums (one group's, G being a multiple of 128)
are multiplied by the rows' group scales and added into float32 totals. The reference's
float64 value differs only by float32 summation.

Work split: a CTA owns ``RT`` x 16 weight rows and ``NT`` x 8 tokens (grid: row blocks x
token blocks); its ``W`` warps take every W-th chunk of K (every warp the same number:
``warps_for`` picks W dividing K / 128; RT and W are the named choices below), each warp
all RT row tiles against its x fragments (x read once per warp and chunk), then the warps' totals meet in shared memory and are summed
in warp order (deterministic), alpha, bias, activation and the output rounding applied as
``mma_sync``'s epilogue does (``OUT_*``, ``ACT_*``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import float32, int32, uint32

from ..ptx import mma as _mma
from ..ptx.convert import cvt_bf16x2
from ..ptx.memory import as_u32, load_u32x4
from ..runtime.backend import cuda
from ..runtime.target import SIMULATOR, devfn
from .mma_sync import ACT_GELU, ACT_RELU, OUT_BF16, OUT_F16, OUT_F32, bf16_bits_rne, f16_bits_rne, gelu_erf

CHUNK = 128  # K elements a lane pair reads per row and chunk (16 bytes of codes)
# Named choices, from one H200 run (kernel time, int4_group, 4 weight copies rotated past the
# L2; 1 / 16 / 128 x 14336 x 4096 and 16 x 4096 x 14336):
# * RT = 2 row tiles a CTA: 33.5 / 40.0 / 229 / 40.6 us against 42.0 / 51.0 / 305 / 77.0 for 4
#   (fewer registers: 126-148 against 166-168, so more warps a SM) and 39.7 / 53.1 / 369 / 40.1
#   for 1 (with 16 warps; x read by more CTAs);
# * warps a CTA: the most of WARPS dividing the K / 128 chunks that leaves each warp at least
#   MIN_CHUNKS (16 x 4096 x 14336: 16 warps of 7 chunks 33.9 us, 8 of 14 40.6; 16 x 14336 x
#   4096: 8 of 4 40.0 us, 16 of 2 49.3);
# * no register double-buffering of the next chunk's loads: 33.9 / 52.4 / 328 / 41.5 us with it
#   (184 registers).
RT = 1 if SIMULATOR else 2  # 16-row weight tiles a CTA (and each of its warps) covers
WARPS = (2, 1) if SIMULATOR else (16, 8, 4, 2, 1)
MIN_CHUNKS = 4


@devfn
def int4_pair(word, shift, flip, c):
    """bfloat16x2 of the two nibbles at bit ``shift`` of ``word`` (the lower one in the low
    half), each read as (nibble ^ flip) - c: exact integers of at most 15 in magnitude."""
    lo = int32(((word >> uint32(shift)) & uint32(0xF)) ^ uint32(flip)) - c
    hi = int32(((word >> uint32(shift + 4)) & uint32(0xF)) ^ uint32(flip)) - c
    return int32(cvt_bf16x2(float32(hi), float32(lo)))  # (the mma takes its registers as int32)


@lru_cache(maxsize=None)
def make_kernel(nt: int, warps: int, asym: bool, out: int, act: int, bias: bool):
    """The kernel for ``nt`` n8 token tiles (1 or 2), ``warps`` warps a CTA, zero points or
    not, output ``out`` (OUT_F32 / OUT_F16 / OUT_BF16), activation and bias: arguments
    ``(xb, wq, s, z, bias, alpha, out, M, N, K, G)`` with ``xb`` the bf16 bits of x (uint16 [M *
    K]), ``wq`` the codes (uint8 [N * K / 2]), ``s`` float32 [N * K / G], ``z`` uint8 [N * K
    / G] (asymmetric; else any uint8 array), ``bias`` float32 [N], ``out`` float32 or uint16
    [M * N]. K a multiple of 128, G of 128, both arrays 16-byte aligned."""
    NT, W, RTK = nt, warps, RT
    FLIP = 0 if asym else 8  # symmetric: two's complement -> offset binary, then minus 8
    C0 = 0 if asym else 8
    ROWS = RTK * 16
    COLS = NT * 8
    NTOT = RTK * NT * 4  # (array sizes: constants, not expressions, for Numba's typing)
    NRED, NW, NX, NP = W * ROWS * COLS, RTK * 8, NT * 16, NT * 4
    mma = _mma.mma_bf16
    F32 = out == OUT_F32

    @devfn
    def load_chunk(xw, ww, c, n_base, m_base, gl, t, half_k, K, M, N, wv, xv):
        """This lane's 16 code bytes of rows gl, gl + 8 of each row tile and 64 bytes of x
        of token gl of each n8 tile, for chunk c (zeros past N and M)."""
        k0 = c * CHUNK
        for r in range(RTK):
            for h in range(2):
                n = n_base + 16 * r + gl + 8 * h
                if n < N:
                    w0, w1, w2, w3 = load_u32x4(ww, (n * half_k + (k0 >> 1) + 16 * t) >> 4)
                else:
                    w0 = w1 = w2 = w3 = uint32(0)  # (its scale is 0)
                wv[8 * r + 4 * h] = w0
                wv[8 * r + 4 * h + 1] = w1
                wv[8 * r + 4 * h + 2] = w2
                wv[8 * r + 4 * h + 3] = w3
        for j in range(NT):
            m = m_base + 8 * j + gl
            for q in range(4):
                if m < M:
                    v0, v1, v2, v3 = load_u32x4(xw, (m * K + k0 + 32 * t + 8 * q) >> 3)
                else:
                    v0 = v1 = v2 = v3 = uint32(0)
                xv[16 * j + 4 * q] = int32(v0)
                xv[16 * j + 4 * q + 1] = int32(v1)
                xv[16 * j + 4 * q + 2] = int32(v2)
                xv[16 * j + 4 * q + 3] = int32(v3)

    @devfn
    def multiply_chunk(s, z, c, G, groups, n_base, gl, N, wv, xv, part, tot):
        """tot += the chunk's partial sums times the rows' group scales."""
        g = (c * CHUNK) // G
        for r in range(RTK):
            n0 = n_base + 16 * r + gl
            c0 = int32(C0)
            c1 = int32(C0)
            s0 = float32(0)
            s1 = float32(0)
            if n0 < N:
                s0 = s[n0 * groups + g]
                if asym:
                    c0 = int32(z[n0 * groups + g])
            if n0 + 8 < N:
                s1 = s[(n0 + 8) * groups + g]
                if asym:
                    c1 = int32(z[(n0 + 8) * groups + g])
            for i in range(NP):
                part[i] = float32(0)
            for st in range(8):
                i = st >> 1
                sh = 16 * (st & 1)
                a0 = int4_pair(wv[8 * r + i], sh, FLIP, c0)
                a2 = int4_pair(wv[8 * r + i], sh + 8, FLIP, c0)
                a1 = int4_pair(wv[8 * r + 4 + i], sh, FLIP, c1)
                a3 = int4_pair(wv[8 * r + 4 + i], sh + 8, FLIP, c1)
                for j in range(NT):
                    d0, d1, d2, d3 = mma(a0, a1, a2, a3, xv[16 * j + 2 * st], xv[16 * j + 2 * st + 1],
                                         part[4 * j], part[4 * j + 1], part[4 * j + 2], part[4 * j + 3])
                    part[4 * j] = d0
                    part[4 * j + 1] = d1
                    part[4 * j + 2] = d2
                    part[4 * j + 3] = d3
            for j in range(NT):
                b = 4 * (NT * r + j)
                tot[b] += part[4 * j] * s0
                tot[b + 1] += part[4 * j + 1] * s0
                tot[b + 2] += part[4 * j + 2] * s1
                tot[b + 3] += part[4 * j + 3] * s1

    @cuda.jit
    def weight_only_int4(xb, wq, s, z, bias_v, alpha, out_v, M, N, K, G):
        red = cuda.shared.array(NRED, float32)
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        gl = lane >> 2
        t = lane & 3
        n_base = cuda.blockIdx.x * ROWS
        m_base = cuda.blockIdx.y * COLS
        xw = as_u32(xb)
        ww = as_u32(wq)
        half_k = K >> 1
        groups = K // G
        nchunks = K // CHUNK
        tot = cuda.local.array(NTOT, float32)
        for i in range(NTOT):
            tot[i] = float32(0)
        wv = cuda.local.array(NW, uint32)
        xv = cuda.local.array(NX, int32)
        part = cuda.local.array(NP, float32)
        for c in range(warp, nchunks, W):
            load_chunk(xw, ww, c, n_base, m_base, gl, t, half_k, K, M, N, wv, xv)
            multiply_chunk(s, z, c, G, groups, n_base, gl, N, wv, xv, part, tot)
        # the warps' totals, [warp][row][column], then summed in warp order
        for r in range(RTK):
            for j in range(NT):
                b = 4 * (NT * r + j)
                for h in range(2):
                    row = 16 * r + gl + 8 * h
                    for e in range(2):
                        red[(warp * ROWS + row) * COLS + 8 * j + 2 * t + e] = tot[b + 2 * h + e]
        cuda.syncthreads()
        for o in range(tid, ROWS * COLS, W * 32):
            row = o % ROWS
            col = o // ROWS
            n = n_base + row
            m = m_base + col
            if n < N and m < M:
                v = float32(0)
                for w in range(W):
                    v += red[(w * ROWS + row) * COLS + col]
                v = v * alpha
                if bias:
                    v += bias_v[n]
                if act == ACT_RELU:
                    v = max(v, float32(0))
                elif act == ACT_GELU:
                    v = gelu_erf(v)
                if F32:
                    out_v[m * N + n] = v
                elif out == OUT_F16:
                    out_v[m * N + n] = f16_bits_rne(v)
                else:
                    out_v[m * N + n] = bf16_bits_rne(v)

    return weight_only_int4


def warps_for(K: int) -> int:
    """Warps a CTA: the most of ``WARPS`` that divides the K / 128 chunks and leaves each warp
    ``MIN_CHUNKS`` of them, else the most that divides (every warp runs the same number of
    chunks: the simulator's warp-wide MMA twin needs every thread of a block at each call)."""
    chunks = K // CHUNK
    divides = [w for w in WARPS if chunks % w == 0]
    return next((w for w in divides if chunks // w >= MIN_CHUNKS), divides[0])


def supported(qw) -> str | None:
    """Why ``qw`` [N, K] cannot take this kernel (None: it can): int4 codes, groups of G
    along K with G and K multiples of 128."""
    sch = qw.scheme
    N, K = (int(d) for d in qw.shape)
    br, bk = (int(v) for v in sch.block_for((N, K)))
    if sch.fmt != "int4" or br != 1 or bk >= K and sch.granularity != "group":
        return "the in-register kernel takes int4 weights with groups along K"
    if bk % CHUNK or K % CHUNK:
        return f"the in-register int4 kernel needs K ({K}) and the group size ({bk}) multiples of {CHUNK}"
    return None


def launch_args(x_bits, qw, bias, alpha, out_dtype: str, activation, alloc):
    """(kernel, grid, block, args, out [M, N] view) of one call: ``x_bits`` uint16 [M, K]
    (C order, 16-byte aligned), ``qw`` checked by ``supported``, ``alloc`` the output's
    allocator (``runtime.interop.Allocator``)."""
    from .mma_sync import ACT_NONE

    M, K = (int(d) for d in x_bits.shape)
    N = int(qw.shape[0])
    G = int(qw.scheme.block_for((N, K))[1])
    nt = 1 if M <= 8 else 2
    warps = warps_for(K)
    out = {"float32": OUT_F32, "float16": OUT_F16, "bfloat16": OUT_BF16}[out_dtype]
    act = {None: ACT_NONE, "relu": ACT_RELU, "gelu": ACT_GELU}[activation]
    asym = qw.zero_points is not None
    kern = make_kernel(nt, warps, asym, out, act, bias is not None)
    o = alloc.empty(max(M * N, 1), np.float32 if out == OUT_F32 else np.uint16)
    z = qw.zero_points.reshape(-1) if asym else qw.codes.reshape(-1)[:1]
    b = bias if bias is not None else qw.scales.reshape(-1)[:1]
    grid = (-(-N // (RT * 16)), -(-M // (nt * 8)))
    args = (x_bits.reshape(-1), qw.codes.reshape(-1), qw.scales.reshape(-1), z, b, np.float32(alpha), o, M, N, K, G)
    return kern, grid, 32 * warps, args, o
