"""The GEMM kernel body: ``out = epilogue(A @ B^T)`` on 8-bit codes or bfloat16 with tensor cores.

One kernel factory, :func:`make_gemm_kernel`, specialised at compile time (closure
constants fold every branch away) by a :class:`TileConfig` and a :class:`GemmSpec`.

Data (all 1-D, C order): ``a`` uint8 [M * K] codes (int8 / e4m3 / e5m2 / asymmetric uint8
bytes), ``b`` uint8 [N * K] (the weight, [N, K] row-major = the mma's "col" B), K a
multiple of 16 (the launcher pads) so every 16-byte chunk is either wholly inside a row or
wholly past its end. The ``"bf16.bf16"`` kind (m16n8k16, float32 accumulate) takes the
bfloat16 bits' bytes, [M * 2K] and [N * 2K], K (elements) a multiple of 8: the kernel works
in bytes of K throughout (``kbytes`` = 2K), since the 16-bit fragments of m16n8k16 are the
8-bit ones of m16n8k32 byte for byte (``ptx.mma``'s docstring), so every address below is
the same, each mma covering 16 elements of K instead of 32.

Tiling: a CTA computes a BM x BN tile of ``out`` with ``warps_m x warps_n`` warps, each a
``(16 mt) x (8 nt)`` warp tile of m16n8k32 (bf16: m16n8k16) mma's. K advances in BK = 64-byte steps through
a ``stages``-deep ring of shared-memory tiles filled by ``cp.async`` (16 bytes per lane,
zero-filled past M, N or K), read by ``ldmatrix.x4``. Shared rows are 64 bytes (4 chunks
of 16); chunk ``c`` of row ``r`` is stored at chunk ``c ^ ((r >> 1) & 3)``, so the 8 rows
one ``ldmatrix`` phase reads fall in 8 different bank groups (no conflicts).

Epilogue, per element (float32; ``acc`` the exact int32 or float32 sum over K):

* int8:            v = alpha * (acc - za[m] * colsum_b[n]) * sa[m] * sb[n]   (za: zero point,
                   only for asymmetric A; colsum_b[n] = sum_k qb[n, k])
* fp8 / bf16 tensor/row:  v = alpha * acc * sa[m] * sb[n] (tensor: sa[0], sb[0], read on the
                   device, so a device scalar needs no host read: NVFP4's tensor scales)
* fp8 1x128/128x128: acc is promoted every 128 K: tot += part * sa[m, kb] * sb[n // 128, kb],
                   v = alpha * tot
* fp8 mx (OCP MX): every K step of 32 (one mma) goes into a zeroed partial, promoted at
                   once: tot += part * 2^(sa[m, ks] - 127) * 2^(sb[n, ks] - 127), with
                   sa [M, K/32], sb [N, K/32] uint8 e8m0 codes (0xFF: NaN), v = alpha * tot
* fp8 mx_hw (sm_120a, assembled, not run): the same codes applied by the tensor core: each
                   K step is one block-scaled mma (``ptx.mma_blockscale.mma_mxf8f6f4_1x``)
                   accumulating into acc, v = alpha * acc (``make_mx_hw``)
* then ``v += bias[n]``, ``relu`` / ``gelu`` (erf form), and rounding to the output
  (float32, float16 or bfloat16 bits, round to nearest even).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import float32, int32, uint8
from ..runtime.backend import cuda

from ..ptx import mma as _mma
from ..ptx.mma_blockscale import mma_mxf8f6f4_1x
from ..device.codec import bits_f32, f32_bits
from ..ptx.convert import cvt_bf16x2, cvt_f16x2
from ..ptx.memory import st_u32_at
from ..runtime.target import devfn

BK = 64  # bytes of K per pipeline stage (= elements of 8-bit codes, 32 bf16)

# epilogue modes
SCALE_TENSOR, SCALE_ROW, SCALE_BLOCK, SCALE_MX = 0, 1, 2, 3
SCALE_MX_HW = 4  # the MX codes applied by sm_120a's block-scaled mma (plan.MX_KERNEL_BY_CC says where)
MX_MODES = (SCALE_MX, SCALE_MX_HW)
MX_K = 32  # K of one e8m0 scale (OCP MX v1.0 block size) = one m16n8k32 mma
OUT_F32, OUT_F16, OUT_BF16 = 0, 1, 2
ACT_NONE, ACT_RELU, ACT_GELU = 0, 1, 2


@dataclass(frozen=True)
class TileConfig:
    warps_m: int = 2
    warps_n: int = 4
    mt: int = 4  # m16 tiles per warp
    nt: int = 4  # n8 tiles per warp (even: one ldmatrix.x4 feeds two)
    stages: int = 3
    group_m: int = 8  # CTA rasterisation: this many M tiles share a sweep over N (L2 reuse)

    @property
    def bm(self):
        return self.warps_m * self.mt * 16

    @property
    def bn(self):
        return self.warps_n * self.nt * 8

    @property
    def threads(self):
        return 32 * self.warps_m * self.warps_n

    @property
    def smem_bytes(self):
        return self.stages * (self.bm + self.bn) * BK

    def check(self):
        if self.nt % 2 or (self.bm * 4) % self.threads or (self.bn * 4) % self.threads or self.stages < 2:
            raise ValueError(f"bad tile config {self}")
        if self.smem_bytes > 227 * 1024:
            raise ValueError(f"tile config {self} needs more than 227 KiB of shared memory")


@dataclass(frozen=True)
class GemmSpec:
    """What the kernel computes, all compile-time."""

    mma: str  # "s8s8" | "u8s8" | "e4m3.e4m3" | "e4m3.e5m2" | "e5m2.e4m3" | "e5m2.e5m2" | "bf16.bf16"
    # SCALE_TENSOR | SCALE_ROW | SCALE_BLOCK | SCALE_MX | SCALE_MX_HW (fp8 only, both operands); bf16: TENSOR | ROW
    sa_mode: int
    sb_mode: int
    out: int  # OUT_F32 | OUT_F16 | OUT_BF16
    act: int
    bias: bool
    asym: bool  # int8 only: za / colsum_b correction


def elem_bytes(mma: str) -> int:
    """Bytes of one element of K for the ``mma`` kind: 2 for "bf16.bf16", 1 for the 8-bit kinds."""
    return 2 if mma == "bf16.bf16" else 1


# ----------------------------------------------------------------------------- epilogue helpers
INV_SQRT2 = np.float32(1.0 / math.sqrt(2.0))
HALF = np.float32(0.5)


@devfn
def gelu_erf(v):
    """GELU, erf form (torch's approximate='none'): 0.5 v (1 + erf(v / sqrt 2)), computed as
    0.5 v erfc(-v / sqrt 2), which keeps its relative accuracy for negative v where
    1 + erf(...) cancels (float32 1 + erf(-4.3) is 0; the erfc form gives 1.7e-9)."""
    return HALF * v * math.erfc(-v * INV_SQRT2)


@devfn
def bf16_bits_rne(v):
    """bfloat16 bits of float32 ``v``, round to nearest even; NaN -> 0x7FC0 (quiet)."""
    u = np.uint32(f32_bits(v))
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint16(0x7FC0 | ((u >> 16) & 0x8000))
    # 32-bit: no finite (or infinite) pattern + 0x8000 carries out of 32 bits
    return np.uint16(np.uint32(u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


@devfn
def f16_bits_rne(v):
    """float16 bits of float32 ``v``, round to nearest even, overflow to inf, NaN quiet."""
    u = f32_bits(v)
    sign = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    if a > 0x7F800000:
        return np.uint16(sign | 0x7E00)
    if a >= 0x477FF000:  # >= 65520: rounds to inf
        return np.uint16(sign | 0x7C00)
    if a < 0x38800000:  # below the smallest normal float16 (2^-14): subnormal or zero
        # value = a_f * 2^24 units of 2^-24; round the float to an integer (RNE, exact in f32)
        q = bits_f32(a) * float32(16777216.0)
        r = np.int64(q)
        frac = q - float32(r)
        if frac > float32(0.5) or (frac == float32(0.5) and (r & 1) == 1):
            r += 1
        return np.uint16(sign | r)
    m = a + 0xFFF + ((a >> 13) & 1)  # round the 23-bit mantissa to 10 bits
    return np.uint16(sign | ((m - 0x38000000) >> 13))


# ----------------------------------------------------------------------------- the kernel
@devfn
def tile_origin(bid, M, N, BM, BN, GROUP_M):
    """(m0, n0), the first row and column of CTA ``bid``'s BM x BN tile of ``out``, in
    grouped rasterisation: GROUP_M tiles of M per sweep over N, so CTAs running together
    share A and B tiles in L2. The divisions are 32-bit unsigned: a 64-bit one is a
    subroutine call in SASS, and any call makes ptxas serialise the wgmma's (C7509)."""
    tiles_m = np.uint32((M + BM - 1) // BM)
    tiles_n = np.uint32((N + BN - 1) // BN)
    pid = np.uint32(bid)
    per_group = np.uint32(GROUP_M * tiles_n)
    grp = np.uint32(pid // per_group)
    first_m = np.uint32(grp * GROUP_M)
    gsize = np.uint32(min(tiles_m - first_m, GROUP_M))
    in_grp = np.uint32(pid - grp * per_group)
    tn = np.uint32(in_grp // gsize)
    return np.int64(first_m + (in_grp - tn * gsize)) * BM, np.int64(tn) * BN


def make_store_out(spec: GemmSpec):
    """The last step of the epilogue for ``spec``, shared by both kernel families:
    ``store_out(out, bias, m, n, N, v)`` adds bias[n], applies the activation and writes
    ``out[m, n]`` as float32, or as float16 / bfloat16 bits (round to nearest even)."""

    store_at = make_store_at(spec)[0]

    @devfn
    def store_out(out, bias, m, n, N, v):
        store_at(out, bias, np.uint64(m * N + n), n, v)

    return store_out


def make_store_at(spec: GemmSpec):
    """(``store_at(out, bias, i, n, v)``: ``store_out`` with the flat index ``i = m * N + n``
    given (unsigned: no negative-index wraparound code per store), ``store_pair_at(out,
    bias, i, n, v0, v1)``: the same for columns n and n + 1)."""
    OUT, ACT, BIAS = spec.out, spec.act, spec.bias

    @devfn
    def finish(bias, n, v):
        if BIAS:
            v += bias[np.uint64(n)]
        if ACT == ACT_RELU:
            v = max(v, float32(0))
        elif ACT == ACT_GELU:
            v = gelu_erf(v)
        return v

    @devfn
    def store_at(out, bias, i, n, v):
        v = finish(bias, n, v)
        if OUT == OUT_F32:
            out[i] = v
        elif OUT == OUT_F16:
            out[i] = f16_bits_rne(v)
        else:
            out[i] = bf16_bits_rne(v)

    @devfn
    def store_pair_at(out, bias, i, n, v0, v1):
        """``store_at`` of columns n, n + 1 (flat i, i + 1) by one 4-byte store of a pair of
        16-bit outputs (one cvt rounds both; a NaN lane takes the software rounding, which
        keeps its sign), or two float32 stores. i must be even (4-byte aligned)."""
        v0 = finish(bias, n, v0)
        v1 = finish(bias, n + 1, v1)
        if OUT == OUT_F32:
            out[i] = v0
            out[i + np.uint64(1)] = v1
        else:
            if OUT == OUT_F16:
                w = cvt_f16x2(v1, v0)
                if v0 != v0 or v1 != v1:
                    w = np.uint32(f16_bits_rne(v0)) | (np.uint32(f16_bits_rne(v1)) << np.uint32(16))
            else:
                w = cvt_bf16x2(v1, v0)
                if v0 != v0 or v1 != v1:
                    w = np.uint32(bf16_bits_rne(v0)) | (np.uint32(bf16_bits_rne(v1)) << np.uint32(16))
            st_u32_at(out, i, np.uint32(w))

    return store_at, store_pair_at


def make_load_tile(cfg: TileConfig):
    """``load_tile(a, b, smem, M, N, K, m0, n0, kt, stage, tid)``: K step ``kt`` of the CTA's A
    and B tiles (rows from m0 / n0) into ring slot ``stage`` by ``cp.async``, 16 bytes a lane,
    zero-filled past M, N and K, each chunk at its swizzled place (module docstring). K here
    is the rows' length in bytes (the kernel's ``kbytes``)."""
    BM, BN, NTHREADS, STAGES = cfg.bm, cfg.bn, cfg.threads, cfg.stages
    A_ITERS = BM * 4 // NTHREADS
    B_ITERS = BN * 4 // NTHREADS
    A_STAGE, B_STAGE = BM * BK, BN * BK
    SA_BYTES = STAGES * A_STAGE  # B's ring starts here
    cp_async16 = _mma.cp_async16

    @devfn
    def load_tile(a, b, smem, M, N, K, m0, n0, kt, stage, tid):
        k0 = kt * BK
        for it in range(A_ITERS):
            c = tid + it * NTHREADS
            row = c >> 2
            ch = c & 3
            gr = m0 + row
            gk = k0 + ch * 16
            ok = gr < M and gk < K
            src = gr * K + gk if ok else 0
            dst = stage * A_STAGE + row * BK + ((ch ^ ((row >> 1) & 3)) << 4)
            cp_async16(smem, dst, a, src, 16 if ok else 0)
        for it in range(B_ITERS):
            c = tid + it * NTHREADS
            row = c >> 2
            ch = c & 3
            gr = n0 + row
            gk = k0 + ch * 16
            ok = gr < N and gk < K
            src = gr * K + gk if ok else 0
            dst = SA_BYTES + stage * B_STAGE + row * BK + ((ch ^ ((row >> 1) & 3)) << 4)
            cp_async16(smem, dst, b, src, 16 if ok else 0)

    return load_tile


def make_promote(cfg: TileConfig):
    """``promote(tot, part, sa, sb, M, KB, m_base, nb, kb, lane)``: a warp tile's fp8 block-scale
    promotion (``tot += part * sa[m, kb] * sb[nb, kb]``, then ``part = 0``)."""
    MT, NT = cfg.mt, cfg.nt

    @devfn
    def promote(tot, part, sa, sb, M, KB, m_base, nb, kb, lane):
        """tot += part * sa[m, kb] * sb[nb, kb] (fp8 block scales, once per 128 of K)."""
        s_b = sb[nb * KB + kb]
        g = lane >> 2
        for i in range(MT):
            for h in range(2):
                m = m_base + i * 16 + g + h * 8
                s = sa[m * KB + kb] * s_b if m < M else float32(0)
                for j in range(NT):
                    for e in range(2):
                        x = (i * NT + j) * 4 + h * 2 + e
                        tot[x] += part[x] * s
                        part[x] = float32(0)

    return promote


@devfn
def e8m0_f32(c):
    """2^(c - 127) as a float32 for an e8m0 code ``c`` (uint32), without branches: the
    code is the float32 exponent field, and the mantissa bit 0x400000 makes code 0 the
    subnormal 2^-127 and code 0xFF a NaN (0x7FC00000); ``device.codec.decode_e8m0``'s values."""
    extra = np.uint32(0x400000) if ((c + np.uint32(1)) & np.uint32(0xFF)) <= np.uint32(1) else np.uint32(0)
    return bits_f32((c << np.uint32(23)) | extra)


def make_mx_promote(cfg: TileConfig):
    """(``mx_scales(sa, sb, M, N, KS, m_base, n_base, ks, lane, s_a, s_b)``: the float32 values
    2^(c - 127) of the e8m0 codes of the thread's fragment rows (``s_a``, 2 MT) and columns
    (``s_b``, 2 NT) at K step ``ks`` (rows past M / N read the last row's: their sums are
    never stored); ``mx_promote(tot, part, s_a, s_b)``: ``tot += part * s_a[row] *
    s_b[col]`` over the fragment)."""
    MT, NT = cfg.mt, cfg.nt

    @devfn
    def mx_scales(sa, sb, M, N, KS, m_base, n_base, ks, lane, s_a, s_b):
        g = lane >> 2
        t = lane & 3
        for i in range(MT):
            for h in range(2):
                m = min(m_base + i * 16 + g + h * 8, M - 1)
                s_a[2 * i + h] = e8m0_f32(np.uint32(sa[np.uint64(m * KS + ks)]))
        for j in range(NT):
            for e in range(2):
                n = min(n_base + j * 8 + 2 * t + e, N - 1)
                s_b[2 * j + e] = e8m0_f32(np.uint32(sb[np.uint64(n * KS + ks)]))

    @devfn
    def mx_promote(tot, part, s_a, s_b):
        """tot += part * 2^(ea - 127) * 2^(eb - 127): two multiplies by powers of two, each a
        float32 (2^-127 a subnormal), exact while part * 2^(ea - 127) stays in float32's
        normal range; NVVM contracts the second with the add (one FMUL, one FFMA)."""
        for i in range(MT):
            for h in range(2):
                for j in range(NT):
                    for e in range(2):
                        x = (i * NT + j) * 4 + h * 2 + e
                        tot[x] += part[x] * s_a[2 * i + h] * s_b[2 * j + e]

    return mx_scales, mx_promote


def mx_hw_selectors(i, j):
    """(byte_a, thread_a, byte_b, thread_b) of the block-scaled mma of m16 tile ``i`` and n8
    tile ``j`` of a warp tile: A's tiles alternate between the two thread pairs of a quad and
    then take the word's next byte, B's go round the quad's four threads then the next byte,
    so each lane's two scale words carry every tile's scales (MT <= 8, NT <= 16) and a warp
    loads ceil(MT / 2) + ceil(NT / 4) scale bytes a K step (``make_mx_hw``)."""
    return i // 2, i % 2, j // 4, j % 4


def make_mx_hw(cfg: TileConfig, fa: str, fb: str):
    """(``mx_hw_words(sa, sb, M, N, KS, m_base, n_base, ks, lane)``: this lane's (scale-a-data,
    scale-b-data) int32 words at K step ``ks`` for the selectors of ``mx_hw_selectors``;
    ``mma_hw(x, a0..a3, b0, b1, c0..c3, sfa, sfb)``: the block-scaled mma of tile pair
    ``x = i NT + j`` with that pair's immediate selectors).

    The selection rule (``ptx.mma_blockscale.scale_lane_a`` / ``scale_lane_b``): row r of m16
    tile i is read from lane 4 (r % 8) + 2 thread_a + r // 8, byte byte_a; column c of n8
    tile j from lane 4 c + thread_b, byte byte_b. So lane (g, t) puts row g + 8 (t & 1) of
    tile (t >> 1) + 2 b in byte b of its A word and column g of tile t + 4 b in byte b of its
    B word; a byte no tile selects stays 0 (never read). Rows past M and columns past N read
    the last row's / column's codes (their sums are never stored).

    ``mma_hw`` is a chain of inlined calls, one stub per pair: the selectors are PTX
    immediates, and ``x`` is a constant once the kernel's tile loops are unrolled, so the
    chain folds to the pair's one instruction."""
    MT, NT = cfg.mt, cfg.nt
    if MT > 8 or NT > 16:
        raise ValueError(f"{cfg}: the block-scaled mma's selectors reach 8 m16 tiles (mt) and 16 n8 tiles (nt)")
    BYTES_A, BYTES_B = (MT + 1) // 2, (NT + 3) // 4

    @devfn
    def mx_hw_words(sa, sb, M, N, KS, m_base, n_base, ks, lane):
        g = lane >> 2
        t = lane & 3
        wa = np.uint32(0)
        for b in range(BYTES_A):
            i = (t >> 1) + 2 * b
            if i < MT:
                m = min(m_base + i * 16 + g + (t & 1) * 8, M - 1)
                wa |= np.uint32(sa[np.uint64(m * KS + ks)]) << np.uint32(8 * b)
        wb = np.uint32(0)
        for b in range(BYTES_B):
            j = t + 4 * b
            if j < NT:
                n = min(n_base + j * 8 + g, N - 1)
                wb |= np.uint32(sb[np.uint64(n * KS + ks)]) << np.uint32(8 * b)
        return int32(wa), int32(wb)

    def chain(x):
        stub = mma_mxf8f6f4_1x(fa, fb, *mx_hw_selectors(x // NT, x % NT))
        if x == MT * NT - 1:
            @devfn
            def last(k, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, sfa, sfb):
                return stub(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, sfa, sfb)

            return last
        rest = chain(x + 1)

        @devfn
        def link(k, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, sfa, sfb):
            if k == x:
                return stub(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, sfa, sfb)
            return rest(k, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, sfa, sfb)

        return link

    return mx_hw_words, chain(0)


def make_gemm_kernel(cfg: TileConfig, spec: GemmSpec):
    """The ``gemm`` kernel of ``cfg`` and ``spec`` (module docstring). One function because the
    kernel is a closure over the compile-time constants computed here (tile sizes, the mma,
    the scale modes), which Numba folds into the PTX, resolving every ``BLOCK`` / ``MX`` /
    ``ASYM`` / ``SA_ROW`` branch; its helpers that need only the tile configuration are built
    by ``make_load_tile``, ``make_promote`` and ``make_mx_promote``."""
    cfg.check()
    BM, BN, MT, NT, WN = cfg.bm, cfg.bn, cfg.mt, cfg.nt, cfg.warps_n
    STAGES, GROUP_M = cfg.stages, cfg.group_m
    A_STAGE, B_STAGE = BM * BK, BN * BK
    NACC = MT * NT * 4
    SA_BYTES = STAGES * A_STAGE  # B's ring starts here
    MX = spec.sa_mode == SCALE_MX
    MX_HW = spec.sa_mode == SCALE_MX_HW
    BF16_MMA = spec.mma == "bf16.bf16"
    BYTES_PER_K = elem_bytes(spec.mma)
    PROMOTED = spec.sa_mode in (SCALE_BLOCK, SCALE_MX)  # the sum is built in ``tot``
    NTOT = NACC if PROMOTED else 1
    NSA, NSB = (MT * 2, NT * 2) if MX else (1, 1)
    NAF, NBF = MT * 4, NT * 2
    FLOAT_ACC = spec.mma not in ("s8s8", "u8s8")
    mx_any = spec.sa_mode in MX_MODES
    mixed = (mx_any or spec.sb_mode in MX_MODES) and spec.sb_mode != spec.sa_mode
    if mixed or (mx_any and (not FLOAT_ACC or BF16_MMA)):
        raise ValueError(f"{spec}: the MX scale modes are for both operands of an fp8 mma")
    if BF16_MMA and ({spec.sa_mode, spec.sb_mode} - {SCALE_TENSOR, SCALE_ROW} or spec.asym):
        raise ValueError(f"{spec}: the bf16 mma takes the tensor and row scale modes, no zero points")
    if spec.mma == "s8s8":
        mma = _mma.mma_s8s8
    elif spec.mma == "u8s8":
        mma = _mma.mma_u8s8
    elif BF16_MMA:
        mma = _mma.mma_bf16
    else:
        fa, fb = spec.mma.split(".")
        mma = _mma.mma_fp8(fa, fb)
        if MX_HW:
            mx_hw_words, mma_hw = make_mx_hw(cfg, fa, fb)
    if not MX_HW:  # never called: MX_HW folds its branches away
        mx_hw_words = mma_hw = None
    wait_ready = _mma.cp_async_wait(STAGES - 2)
    commit, ldsm = _mma.cp_async_commit, _mma.ldmatrix_x4
    ACC_T = float32 if FLOAT_ACC else int32
    ZERO_ACC = np.float32(0) if FLOAT_ACC else np.int32(0)
    BLOCK = spec.sa_mode == SCALE_BLOCK
    SA_ROW, SB_ROW = spec.sa_mode == SCALE_ROW, spec.sb_mode == SCALE_ROW
    ASYM = spec.asym
    store_out = make_store_out(spec)
    load_tile = make_load_tile(cfg)
    promote = make_promote(cfg)
    mx_scales, mx_promote = make_mx_promote(cfg)

    @cuda.jit
    def gemm(a, b, M, N, K, sa, sb, za, colsum_b, bias, alpha, out):
        # dynamic shared memory (the launcher passes SMEM_BYTES and raises the 48 KiB
        # opt-in limit when needed): A's ring, then B's
        smem = cuda.shared.array(0, uint8)
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        wm = warp // WN
        wn = warp - wm * WN

        m0, n0 = tile_origin(cuda.blockIdx.x, M, N, BM, BN, GROUP_M)

        acc = cuda.local.array(NACC, ACC_T)
        tot = cuda.local.array(NTOT, float32)
        for x in range(NACC):
            acc[x] = ZERO_ACC
        if PROMOTED:
            for x in range(NACC):
                tot[x] = float32(0)
        af = cuda.local.array(NAF, int32)
        bf = cuda.local.array(NBF, int32)

        kbytes = K * BYTES_PER_K  # the rows' length in bytes: the ring, cp.async and ldmatrix work in bytes
        ktiles = (kbytes + BK - 1) // BK
        KB = (K + 127) // 128
        if MX:
            s_a = cuda.local.array(NSA, float32)
            s_b = cuda.local.array(NSB, float32)
            KS = K >> 5  # K steps of MX_K = 32 (the launcher requires K % 32 == 0)
        if MX_HW:
            KS = K >> 5
        for s in range(STAGES - 1):
            if s < ktiles:
                load_tile(a, b, smem, M, N, kbytes, m0, n0, s, s, tid)
            commit()

        a_row = wm * (MT * 16) + (lane & 7) + ((lane >> 3) & 1) * 8  # + i * 16
        a_chunk = lane >> 4  # + 2 kk
        b_row = wn * (NT * 8) + (lane & 7) + (lane >> 4) * 8  # + jj * 16
        b_chunk = (lane >> 3) & 1
        for kt in range(ktiles):
            wait_ready()
            cuda.syncthreads()
            nk = kt + STAGES - 1
            if nk < ktiles:
                load_tile(a, b, smem, M, N, kbytes, m0, n0, nk, nk % STAGES, tid)
            commit()
            stage = kt % STAGES
            for kk in range(2):
                if MX:  # this K step's scales, loaded before its mma's (their latency hides there)
                    ks = 2 * kt + kk
                    if ks < KS:  # (K % 64 == 32: the last tile's second step is zero-filled)
                        mx_scales(sa, sb, M, N, KS, m0 + wm * (MT * 16), n0 + wn * (NT * 8), ks, lane, s_a, s_b)
                if MX_HW:  # the scale words, loaded before the mma's; past K (zero-filled data) codes of 1
                    ks = 2 * kt + kk
                    sfa = int32(0x7F7F7F7F)
                    sfb = int32(0x7F7F7F7F)
                    if ks < KS:
                        sfa, sfb = mx_hw_words(sa, sb, M, N, KS, m0 + wm * (MT * 16), n0 + wn * (NT * 8), ks, lane)
                for i in range(MT):
                    r = a_row + i * 16
                    off = stage * A_STAGE + r * BK + (((a_chunk + 2 * kk) ^ ((r >> 1) & 3)) << 4)
                    af[4 * i], af[4 * i + 1], af[4 * i + 2], af[4 * i + 3] = ldsm(smem, off)
                for jj in range(NT // 2):
                    r = b_row + jj * 16
                    off = SA_BYTES + stage * B_STAGE + r * BK + (((b_chunk + 2 * kk) ^ ((r >> 1) & 3)) << 4)
                    bf[4 * jj], bf[4 * jj + 1], bf[4 * jj + 2], bf[4 * jj + 3] = ldsm(smem, off)
                for i in range(MT):
                    for j in range(NT):
                        x = (i * NT + j) * 4
                        if MX:  # a fresh partial per K step of 32: C = 0
                            acc[x], acc[x + 1], acc[x + 2], acc[x + 3] = mma(
                                af[4 * i], af[4 * i + 1], af[4 * i + 2], af[4 * i + 3],
                                bf[2 * j], bf[2 * j + 1],
                                ZERO_ACC, ZERO_ACC, ZERO_ACC, ZERO_ACC,
                            )  # fmt: skip
                        elif MX_HW:  # the tensor core scales this K step's products: straight into acc
                            acc[x], acc[x + 1], acc[x + 2], acc[x + 3] = mma_hw(
                                i * NT + j,
                                af[4 * i], af[4 * i + 1], af[4 * i + 2], af[4 * i + 3],
                                bf[2 * j], bf[2 * j + 1],
                                acc[x], acc[x + 1], acc[x + 2], acc[x + 3],
                                sfa, sfb,
                            )  # fmt: skip
                        else:
                            acc[x], acc[x + 1], acc[x + 2], acc[x + 3] = mma(
                                af[4 * i], af[4 * i + 1], af[4 * i + 2], af[4 * i + 3],
                                bf[2 * j], bf[2 * j + 1],
                                acc[x], acc[x + 1], acc[x + 2], acc[x + 3],
                            )  # fmt: skip
                if MX:
                    if ks < KS:
                        mx_promote(tot, acc, s_a, s_b)
            if BLOCK:
                if (kt & 1) == 1 or kt == ktiles - 1:
                    promote(tot, acc, sa, sb, M, KB, m0 + wm * (MT * 16), n0 >> 7, kt >> 1, lane)
        # every group holding a real load was waited for before its tile was read; the
        # groups still pending are the empty ones committed in the last STAGES-2 steps

        # epilogue
        g = lane >> 2
        t = lane & 3
        m_base = m0 + wm * (MT * 16)
        n_base = n0 + wn * (NT * 8)
        for i in range(MT):
            for h in range(2):
                m = m_base + i * 16 + g + h * 8
                if m < M:
                    s_m = alpha
                    if not PROMOTED and not MX_HW:
                        s_m = alpha * (sa[m] if SA_ROW else sa[0])
                    z = int32(0)
                    if ASYM:
                        z = int32(za[m] if SA_ROW else za[0])
                    for j in range(NT):
                        for e in range(2):
                            n = n_base + j * 8 + 2 * t + e
                            if n < N:
                                x = (i * NT + j) * 4 + h * 2 + e
                                if PROMOTED:
                                    v = alpha * tot[x]
                                elif MX_HW:
                                    v = alpha * acc[x]
                                else:
                                    if ASYM:
                                        q = acc[x] - z * colsum_b[n]
                                    else:
                                        q = acc[x]
                                    v = float32(q) * s_m * (sb[n] if SB_ROW else sb[0])
                                store_out(out, bias, m, n, N, v)

    return gemm


@cuda.jit
def row_sums_i8(b, N, K, out):
    """out[n] = sum_k b[n, k] over int8 codes ``b`` [N * K] (the zero-point correction's
    colsum_b); one thread per row (reads stay in the row's cache lines)."""
    n = cuda.grid(1)
    if n < N:
        s = int32(0)
        for k in range(K):
            s += int32(b[n * K + k])
        out[n] = s
