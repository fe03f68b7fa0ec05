"""Kernel bodies. Each ``make_*`` factory builds one ``@cuda.jit`` kernel for a tuple of
compile-time constants (input kind, mode, element format, group geometry, packing,
rounding) and caches it; the launch plans (``plan``, ``rules``) pick the factory and the
constants. The dequantize kernels are ``dequant_kernels``.

=====================  ==========================================================  =========
kernel                 does                                                        passes
=====================  ==========================================================  =========
group (stash)          groups of G <= SEG_MAX along the last axis: a block stages  1 read
                       a segment of groups in shared memory, reduces each group
                       with a team of threads, encodes and packs                   1 write
group (long)           the same, one block per group, G > SEG_MAX: the group is    1 read
                       re-read from L1/L2 for each pass                            (+cache)
strided_params         groups along any axis, one thread per group: scales only    1 read
tile_params            one block per B0 x B1 tile: scales only                     1 read
column_partials        per-channel partial statistics over chunks of the other     1 read
                       axes (no atomics: finalize reduces the chunks)
tensor_partials        per-block statistics of the whole tensor                    1 read
finalize               chunks -> statistics -> scales (column, tensor, NVFP4 S_enc)
encode                 elementwise encode + pack with scales looked up per element 1 read
=====================  ==========================================================  =========

Reductions use shared memory and __syncthreads only (no warp shuffles: the CUDA simulator
and numba-hip both run them), and every reduction is order-independent except the centred
INT8 sum, which follows reference/scales.halving_sum exactly (see ``device.scales``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import float32, int32, int64, uint32
from ..runtime.backend import cuda

from ..device.codec import (
    F32, ONE, ZERO, bits_f32, e8m0_reciprocal, f32_bits, load_f32, mul_rn, nanmax_f32, nanmin_f32,
)
from ..device.elements import encode_element, random_word, store_unit, store_unit_wide
from ..device.scales import (
    MODE_ASYM, MODE_CENTRED, MODE_MX, MODE_NVFP4, STACK_DEPTH, asym_params, centred_params, float_scale,
    mx_scale_code, next_bitrev, nvfp4_block_scale_code, nvfp4_element_multiplier, nvfp4_tensor_encode_scale,
    pairwise_push,
)
from ..device.codec import KIND_BF16
from ..ptx.convert import fp8_cvt_available, fp8_cvt_supports
from ..ptx.memory import array_addr, as_u16, as_u32
from ..runtime.target import devfn


SEG_MAX = 8192  # float32 elements staged per block (32 KiB of shared memory)
LOADS = 8  # global loads each thread keeps in flight in the reduction passes


@devfn
def abs_bits(v):
    return f32_bits(v) & 0x7FFFFFFF


@devfn
def stat_add(mode, acc, mn, mx, v):
    """One element into a scale group's running statistic: (min, max) for asymmetric
    integers, else the amax as non-negative float32 bits (NaN-propagating as an integer max)."""
    if mode == MODE_ASYM:
        return acc, nanmin_f32(mn, v), nanmax_f32(mx, v)
    return max(acc, abs_bits(v)), mn, mx


@devfn
def stat_fold(red_i, red_a, red_b, i, j):
    """Fold slot ``j`` of the shared statistic arrays into slot ``i`` (amax bits, min, max)."""
    red_i[i] = max(red_i[i], red_i[j])
    red_a[i] = nanmin_f32(red_a[i], red_a[j])
    red_b[i] = nanmax_f32(red_b[i], red_b[j])


@devfn
def block_reduce_stat(red_i, red_a, red_b, tid, nt, acc, mn, mx):
    """Every thread of a block of ``nt`` (a power of two) contributes its statistic; after
    the shared-memory tree, slot 0 holds the block's (amax bits, min, max). Ends synced."""
    red_i[tid] = acc
    red_a[tid] = mn
    red_b[tid] = mx
    cuda.syncthreads()
    h = nt >> 1
    while h > 0:
        if tid < h:
            stat_fold(red_i, red_a, red_b, tid, tid + h)
        cuda.syncthreads()
        h >>= 1


@devfn
def group_params(mode, amax_bits, mn, mx, max_elem, mx_rounding, mx_mbits, mx_emax, mx_inv, s_enc):
    """Scale code/value and element parameters of one group from its statistics.
    Returns (scale_out, p0, pz): scale_out is what the scales array stores (float32 value,
    or an e8m0 / ue4m3 code as float32)."""
    amax = bits_f32(amax_bits)
    if mode == MODE_MX:
        code = mx_scale_code(amax, mx_rounding, mx_mbits, mx_emax, mx_inv)
        return F32(code), e8m0_reciprocal(code), 0
    if mode == MODE_NVFP4:
        code = nvfp4_block_scale_code(amax, s_enc)
        return F32(code), nvfp4_element_multiplier(code, s_enc), 0
    if mode == MODE_ASYM:
        s, zp = asym_params(mn, mx, max_elem)
        return s, s, zp
    s = float_scale(amax, max_elem)
    return s, s, 0


@devfn
def store_scale(scales, i, mode, val):
    if mode == MODE_MX or mode == MODE_NVFP4:
        scales[i] = int(val)
    else:
        scales[i] = val


def _pow2ceil(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


# =============================================================================== group kernel
@lru_cache(maxsize=None)
def make_group_kernel(kind, mode, fmt, mx_cfg, max_elem, G, P, team, gpb, nt, stash_on, packed, stoch):
    """Groups of G consecutive elements along the last axis of a (rows, cols) view.

    Block b owns ``gpb`` group slots: with one group per row (``ngroups == 1``) slot k is
    row b*gpb + k; otherwise the block owns groups s*gpb .. s*gpb + gpb - 1 of row b // segs
    (s = b % segs), i.e. the columns [c0, c0 + gpb*G). Thread t is lane t % team of slot
    t // team; lane l reduces the slot's elements l, l + team, l + 2 team, ... (P = the
    group's power-of-two padding for the centred halving sum), then the team combines its
    partials in a shared-memory tree whose levels add lane l and lane l + h for h = team/2,
    ..., 1: exactly the last log2(team) levels of reference/scales.halving_sum.

    One function because the kernel and ``elem`` are closures over the compile-time constants
    computed here, which Numba folds into the PTX (every ``STASH`` / ``PAIRS`` / ``mode``
    branch resolved, the shared arrays sized), and its four stages share the block's shared
    arrays and each lane's registers.
    """
    E = P // team  # elements per lane (pow2: the lane's residue class in halving order)
    INV_P = F32(1.0 / P)  # exact power of two: the centred sum scales its leaves by it
    SEG = gpb * G if stash_on else 1
    M1 = -(-SEG // nt)  # stage-1 loads per thread
    ALIGNED = G % 4 == 0
    NBITS = fmt[5]
    MAXE = F32(max_elem)
    MXR, MXM, MXE, MXI = mx_cfg[0], mx_cfg[1], mx_cfg[2], F32(mx_cfg[3])
    STASH = stash_on
    CVT = fp8_cvt_available() and fp8_cvt_supports(fmt)
    PAIRS = stash_on and kind == KIND_BF16 and G % 2 == 0  # stage 1 may read bf16 in pairs
    M2 = -(-SEG // (2 * nt))  # stage-1 pair loads per thread
    GPB = gpb
    TEAM = team
    NT = nt
    assert team * gpb == nt and P % team == 0

    @devfn
    def elem(x, stash, k, j, row, g, cols):
        if STASH:
            return stash[np.uint64(k * G + j)]
        return load_f32(x, row * cols + g * G + j, kind)

    @cuda.jit
    def group_kernel(x, rows, cols, ngroups, segs, codes, pcols, scales, zps, means, sparams, key_lo, key_hi):
        tid = cuda.threadIdx.x
        b = cuda.blockIdx.x
        stash = cuda.shared.array(SEG, float32)
        red_i = cuda.shared.array(NT, int64)
        red_a = cuda.shared.array(NT, float32)
        red_b = cuda.shared.array(NT, float32)
        p0s = cuda.shared.array(GPB, float32)
        p1s = cuda.shared.array(GPB, float32)
        pzs = cuda.shared.array(GPB, int32)

        # block geometry: mode A (one group per row) or mode B (a run of groups of one row)
        one = ngroups == 1
        if one:
            rb = b * GPB  # first row
            c0 = 0
            cend = cols
        else:
            rb = b // segs
            c0 = (b - rb * segs) * GPB * G
            cend = min(c0 + GPB * G, cols)

        # ---- stage 1: stage the block's groups in shared memory (zeros past the ends);
        # LOADS loads per thread are issued before any is stored, so they are in flight together
        if STASH and PAIRS and (cols & 1) == 0 and (array_addr(x) & 3) == 0:
            # bf16 two at a time: one 32-bit load per pair (rows start at even elements)
            x32 = as_u32(x)
            wv = cuda.local.array(LOADS, uint32)
            for m0 in range(0, M2, LOADS):
                for uu in range(LOADS):
                    i = 2 * (tid + NT * (m0 + uu))
                    w = np.uint32(0)
                    if i < GPB * G:
                        if one:
                            kk = i // G
                            j = i - kk * G
                            if rb + kk < rows and j < cols:
                                w = x32[np.uint64(((rb + kk) * cols + j) >> 1)]
                        elif c0 + i < cend:
                            w = x32[np.uint64((rb * cols + c0 + i) >> 1)]
                    wv[uu] = w
                for uu in range(LOADS):
                    i = 2 * (tid + NT * (m0 + uu))
                    if i < GPB * G:
                        w = wv[uu]
                        stash[np.uint64(i)] = bits_f32(np.uint32(w << np.uint32(16)))
                        stash[np.uint64(i + 1)] = bits_f32(np.uint32(w & np.uint32(0xFFFF0000)))
            cuda.syncthreads()
        elif STASH:
            vals = cuda.local.array(LOADS, float32)
            for m0 in range(0, M1, LOADS):
                for uu in range(LOADS):
                    i = tid + NT * (m0 + uu)
                    v = ZERO
                    if i < GPB * G:
                        if one:
                            kk = i // G
                            j = i - kk * G
                            if rb + kk < rows and j < cols:
                                v = load_f32(x, (rb + kk) * cols + j, kind)
                        elif c0 + i < cend:
                            v = load_f32(x, rb * cols + c0 + i, kind)
                    vals[uu] = v
                for uu in range(LOADS):
                    i = tid + NT * (m0 + uu)
                    if i < GPB * G:
                        stash[np.uint64(i)] = vals[uu]
            cuda.syncthreads()

        # ---- stage 2: per-lane statistics over the lane's residue class
        k = tid // TEAM
        lane = tid - k * TEAM
        if one:
            row = rb + k
            g = 0
            n = cols if row < rows else 0
        else:
            row = rb
            g = c0 // G + k
            n = min(G, cend - g * G) if g * G < cend else 0
        if mode == MODE_CENTRED:
            stack = cuda.local.array(STACK_DEPTH, float32)
            sp = 0
            rev = 0
            for s in range(E):
                j = lane + TEAM * rev
                v = ZERO
                if j < n:
                    v = mul_rn(elem(x, stash, k, j, row, g, cols), INV_P)  # exact: 2^-k scaling
                sp = pairwise_push(stack, sp, s, v)
                rev = next_bitrev(rev, E)
            red_a[tid] = stack[0]
        else:
            acc = 0
            mn = ZERO
            mx = ZERO
            for m in range(E):
                j = lane + TEAM * m
                if j < n:
                    v = elem(x, stash, k, j, row, g, cols)
                    acc, mn, mx = stat_add(mode, acc, mn, mx, v)
            red_i[tid] = acc
            red_a[tid] = mn
            red_b[tid] = mx
        cuda.syncthreads()

        # ---- stage 3: combine each team in a tree, then lane 0 computes the parameters
        h = TEAM >> 1
        while h > 0:
            if lane < h:
                if mode == MODE_CENTRED:
                    red_a[tid] = red_a[tid] + red_a[tid + h]
                else:
                    stat_fold(red_i, red_a, red_b, tid, tid + h)
            cuda.syncthreads()
            h >>= 1
        sidx = row * ngroups + g
        if lane == 0 and n > 0:
            if mode == MODE_CENTRED:
                p1s[k] = red_a[tid] * (F32(P) / F32(n))  # reference/scales.group_mean
            else:
                s_enc = sparams[0] if mode == MODE_NVFP4 else ONE
                sv, p0, pz = group_params(mode, red_i[tid], red_a[tid], red_b[tid], MAXE, MXR, MXM, MXE, MXI, s_enc)
                p0s[k] = p0
                pzs[k] = pz
                store_scale(scales, sidx, mode, sv)
                if mode == MODE_ASYM:
                    zps[sidx] = pz
        cuda.syncthreads()

        if mode == MODE_CENTRED:
            # ---- stage 3b: amax of the centred values x - mean, then the scale
            acc = 0
            if n > 0:
                mean = p1s[k]
                for m in range(E):
                    j = lane + TEAM * m
                    if j < n:
                        acc = max(acc, abs_bits(elem(x, stash, k, j, row, g, cols) - mean))
            red_i[tid] = acc
            cuda.syncthreads()
            h = TEAM >> 1
            while h > 0:
                if lane < h:
                    red_i[tid] = max(red_i[tid], red_i[tid + h])
                cuda.syncthreads()
                h >>= 1
            if lane == 0 and n > 0:
                sv, mv = centred_params(p1s[k], bits_f32(red_i[tid]), MAXE)
                p0s[k] = sv
                p1s[k] = mv
                scales[sidx] = sv
                means[sidx] = mv
            cuda.syncthreads()

        # ---- stage 4: encode and pack, four consecutive columns of a row per work item
        q = cuda.local.array(4, int64)
        xs = cuda.local.array(4, float32)
        cache = cuda.local.array(5, int64)
        cache[0] = -1
        c32 = as_u32(codes)
        c16 = as_u16(codes)
        wide = (array_addr(codes) & 3) == 0
        if one:
            upr = (cols + 3) // 4
            total = GPB * upr
        else:
            upr = 1
            total = (cend - c0 + 3) // 4
        for u in range(tid, total, NT):
            if one:
                kk = u // upr if GPB > 1 else 0
                row = rb + kk
                c = (u - kk * upr) * 4
            else:
                kk = 0
                row = rb
                c = c0 + 4 * u
            if row < rows:
                for j in range(4):  # the four values first (global re-reads overlap)
                    cj = c + j
                    v = ZERO
                    if cj < cend:
                        if one:
                            v = elem(x, stash, kk, cj, row, 0, cols)
                        else:
                            off = cj - c0
                            ks = off // G
                            v = elem(x, stash, ks, off - ks * G, row, c0 // G + ks, cols)
                    xs[j] = v
                # one group for the whole unit when groups are whole units (G % 4 == 0)
                uk = np.uint64(kk if one else (c - c0) // G)
                p0 = p0s[uk]
                p1 = p1s[uk]
                pz = pzs[uk]
                for j in range(4):
                    cj = c + j
                    code = 0
                    if cj < cend:
                        if not (one or ALIGNED):
                            uk = np.uint64((cj - c0) // G)
                            p0 = p0s[uk]
                            p1 = p1s[uk]
                            pz = pzs[uk]
                        rb4 = 0
                        if stoch:
                            rb4 = random_word(row * cols + cj, key_lo, key_hi, cache)
                        code = encode_element(xs[j], p0, p1, pz, mode, fmt, stoch, rb4, CVT)
                    q[j] = code
                store_unit_wide(codes, c32, c16, wide, row * pcols, c, q, cols, pcols, NBITS, packed)

    return group_kernel


# =============================================================================== strided params
@lru_cache(maxsize=None)
def make_strided_params_kernel(kind, mode, fmt, mx_cfg, max_elem):
    """Groups of G along the middle axis of an (O, L, I) view, one thread per group
    (o, g, i): writes the scale arrays (and zero points / means); ``encode`` does the rest."""
    MAXE = F32(max_elem)
    MXR, MXM, MXE, MXI = mx_cfg[0], mx_cfg[1], mx_cfg[2], F32(mx_cfg[3])

    @cuda.jit
    def strided_params(x, O, L, I, G, P, scales, zps, means):
        t = cuda.grid(1)
        ng = (L + G - 1) // G
        if t >= O * ng * I:
            return
        i = t % I
        og = t // I
        g = og % ng
        o = og // ng
        n = min(G, L - g * G)
        base = (o * L + g * G) * I + i
        if mode == MODE_CENTRED:
            stack = cuda.local.array(STACK_DEPTH, float32)
            sp = 0
            rev = 0
            for s in range(P):
                v = ZERO
                if rev < n:
                    v = mul_rn(load_f32(x, base + rev * I, kind), ONE / F32(P))  # exact: 2^-k scaling
                sp = pairwise_push(stack, sp, s, v)
                rev = next_bitrev(rev, P)
            mean = stack[0] * (F32(P) / F32(n))  # reference/scales.group_mean
            acc = 0
            for j in range(n):
                acc = max(acc, abs_bits(load_f32(x, base + j * I, kind) - mean))
            scales[t], means[t] = centred_params(mean, bits_f32(acc), MAXE)
            return
        acc = 0
        mn = ZERO
        mx = ZERO
        for j in range(n):
            v = load_f32(x, base + j * I, kind)
            acc, mn, mx = stat_add(mode, acc, mn, mx, v)
        sv, p0, pz = group_params(mode, acc, mn, mx, MAXE, MXR, MXM, MXE, MXI, ONE)
        store_scale(scales, t, mode, sv)
        if mode == MODE_ASYM:
            zps[t] = pz

    return strided_params


# =============================================================================== tile params
@lru_cache(maxsize=None)
def make_tile_params_kernel(kind, mode, max_elem, nt, B0, B1):
    """One block per B0 x B1 tile of a (batch, R, C) view: float or asymmetric scales."""
    MAXE = F32(max_elem)
    NT = nt

    @cuda.jit
    def tile_params(x, R, C, scales, zps):
        tid = cuda.threadIdx.x
        t = cuda.blockIdx.x
        nR = (R + B0 - 1) // B0
        nC = (C + B1 - 1) // B1
        tj = t % nC
        ti = (t // nC) % nR
        bt = t // (nC * nR)
        red_i = cuda.shared.array(NT, int64)
        red_a = cuda.shared.array(NT, float32)
        red_b = cuda.shared.array(NT, float32)
        vals = cuda.local.array(LOADS, float32)
        ok = cuda.local.array(LOADS, int32)
        acc = 0
        mn = ZERO
        mx = ZERO
        for e0 in range(tid, B0 * B1, NT * LOADS):
            for uu in range(LOADS):
                e = e0 + uu * NT
                ii = e // B1
                jj = e - ii * B1
                r = ti * B0 + ii
                c = tj * B1 + jj
                ok[uu] = 0
                vals[uu] = ZERO
                if e < B0 * B1 and r < R and c < C:
                    vals[uu] = load_f32(x, (bt * R + r) * C + c, kind)
                    ok[uu] = 1
            for uu in range(LOADS):
                if ok[uu] == 1:
                    v = vals[uu]
                    acc, mn, mx = stat_add(mode, acc, mn, mx, v)
        block_reduce_stat(red_i, red_a, red_b, tid, NT, acc, mn, mx)
        if tid == 0:
            sv, p0, pz = group_params(mode, red_i[0], red_a[0], red_b[0], MAXE, 0, 0, 0, ONE, ONE)
            scales[t] = sv
            if mode == MODE_ASYM:
                zps[t] = pz

    return tile_params


# =============================================================================== partial statistics
@lru_cache(maxsize=None)
def make_column_partials_kernel(kind, mode):
    """Statistics of x[o, j] over a chunk of o, for every column j of an (O, J) view:
    thread j of block (., chunk) writes part_*[chunk, j]."""

    @cuda.jit
    def column_partials(x, O, J, OC, part_i, part_a, part_b):
        j = cuda.grid(1)
        cb = cuda.blockIdx.y
        if j >= J:
            return
        acc = 0
        mn = ZERO
        mx = ZERO
        vals = cuda.local.array(LOADS, float32)
        o_end = min(cb * OC + OC, O)
        for o0 in range(cb * OC, o_end, LOADS):
            for uu in range(LOADS):
                vals[uu] = ZERO
                if o0 + uu < o_end:
                    vals[uu] = load_f32(x, (o0 + uu) * J + j, kind)
            for uu in range(LOADS):
                if o0 + uu < o_end:
                    v = vals[uu]
                    acc, mn, mx = stat_add(mode, acc, mn, mx, v)
        part_i[cb * J + j] = acc
        part_a[cb * J + j] = mn
        part_b[cb * J + j] = mx

    return column_partials


@lru_cache(maxsize=None)
def make_tensor_partials_kernel(kind, mode, nt):
    """Per-block statistics of the whole tensor: amax bits (NVFP4: amax over finite values),
    NaN-propagating min and max."""
    NT = nt

    @cuda.jit
    def tensor_partials(x, N, part_i, part_a, part_b):
        tid = cuda.threadIdx.x
        red_i = cuda.shared.array(NT, int64)
        red_a = cuda.shared.array(NT, float32)
        red_b = cuda.shared.array(NT, float32)
        vals = cuda.local.array(LOADS, float32)
        acc = 0
        mn = ZERO
        mx = ZERO
        step = cuda.gridsize(1)
        for e0 in range(cuda.grid(1), N, step * LOADS):
            for uu in range(LOADS):
                e = e0 + uu * step
                vals[uu] = ZERO
                if e < N:
                    vals[uu] = load_f32(x, e, kind)
            for uu in range(LOADS):
                v = vals[uu]  # past the end: 0, which changes neither a max nor a min with 0
                if mode == MODE_ASYM:
                    mn = nanmin_f32(mn, v)
                    mx = nanmax_f32(mx, v)
                else:
                    a = abs_bits(v)
                    if mode != MODE_NVFP4 or a < 0x7F800000:
                        acc = max(acc, a)
        block_reduce_stat(red_i, red_a, red_b, tid, NT, acc, mn, mx)
        if tid == 0:
            b = cuda.blockIdx.x
            part_i[b] = red_i[0]
            part_a[b] = red_a[0]
            part_b[b] = red_b[0]

    return tensor_partials


@lru_cache(maxsize=None)
def make_finalize_kernel(mode, max_elem, nt):
    """Block q reduces scale group q's statistics part_*[c, q*I + i] (all chunks c, all i)
    in a tree, then writes its scale (float / asymmetric) or, for NVFP4 (one group), S_enc
    and S_dec."""
    MAXE = F32(max_elem)
    NT = nt

    @cuda.jit
    def finalize(part_i, part_a, part_b, nchunks, ngroups, I, scales, zps, sparams, tscale):
        q = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        red_i = cuda.shared.array(NT, int64)
        red_a = cuda.shared.array(NT, float32)
        red_b = cuda.shared.array(NT, float32)
        acc = 0
        mn = ZERO
        mx = ZERO
        for t in range(tid, nchunks * I, NT):
            c = t // I
            e = np.uint64((c * ngroups + q) * I + (t - c * I))
            acc = max(acc, np.int64(part_i[e]))
            mn = nanmin_f32(mn, part_a[e])
            mx = nanmax_f32(mx, part_b[e])
        block_reduce_stat(red_i, red_a, red_b, tid, NT, acc, mn, mx)
        if tid != 0:
            return
        if mode == MODE_NVFP4:
            s_enc = nvfp4_tensor_encode_scale(bits_f32(red_i[0]))
            sparams[0] = s_enc
            tscale[0] = ONE / s_enc
            return
        sv, p0, pz = group_params(mode, red_i[0], red_a[0], red_b[0], MAXE, 0, 0, 0, ONE, ONE)
        scales[q] = sv
        if mode == MODE_ASYM:
            zps[q] = pz

    return finalize


# =============================================================================== encode
@devfn
def scale_index(row, c, d1, d2, b0, b1, b2, bc, n1, n2, nc):
    """Scale index of element (row, c) of a (d0, d1, d2, C) view whose scale groups are
    b0 x b1 x b2 x bc (scale array n0 x n1 x n2 x nc)."""
    i2 = row % d2
    r01 = row // d2
    i1 = r01 % d1
    i0 = r01 // d1
    return (((i0 // b0) * n1 + i1 // b1) * n2 + i2 // b2) * nc + c // bc


@devfn
def scale_row_index(row, d1, d2, b0, b1, b2, n1, n2):
    """Row part of scale_index: the scale row of view row ``row``."""
    i2 = row % d2
    r01 = row // d2
    i1 = r01 % d1
    i0 = r01 // d1
    return ((i0 // b0) * n1 + i1 // b1) * n2 + i2 // b2


@lru_cache(maxsize=None)
def make_encode_kernel(kind, mode, fmt, nt, packed, stoch):
    """Elementwise encode + pack of a (rows, C) view, scales read per element."""
    NBITS = fmt[5]
    NT = nt
    CVT = fp8_cvt_available() and fp8_cvt_supports(fmt)

    @cuda.jit
    def encode(x, rows, C, d1, d2, b0, b1, b2, bc, n1, n2, nc, codes, pcols, scales, zps, means, key_lo, key_hi,
               tpr_log2):
        # a team of TPR = 2^tpr_log2 threads per row, NT / TPR rows per block, grid-stride
        upr = (C + 3) // 4
        tpr = 1 << tpr_log2
        lane = cuda.threadIdx.x & (tpr - 1)
        rpb = NT >> tpr_log2
        q = cuda.local.array(4, int64)
        xs = cuda.local.array(4, float32)
        cache = cuda.local.array(5, int64)
        cache[0] = -1
        for row in range(cuda.blockIdx.x * rpb + (cuda.threadIdx.x >> tpr_log2), rows, cuda.gridDim.x * rpb):
            base = row * C
            srow = scale_row_index(row, d1, d2, b0, b1, b2, n1, n2) * nc
            for u in range(lane, upr, tpr):
                c = u * 4
                for j in range(4):
                    xs[j] = ZERO
                    if c + j < C:
                        xs[j] = load_f32(x, base + c + j, kind)
                sc = c // bc  # scale column of element c; advanced incrementally below
                rem = c - sc * bc
                for j in range(4):
                    cj = c + j
                    code = 0
                    if cj < C:
                        si = np.uint64(srow + sc)
                        p1 = ZERO
                        pz = 0
                        if mode == MODE_MX:
                            p0 = e8m0_reciprocal(np.int64(scales[si]))
                        else:
                            p0 = F32(scales[si])
                        if mode == MODE_ASYM:
                            pz = np.int64(zps[si])
                        if mode == MODE_CENTRED:
                            p1 = means[si]
                        rb = 0
                        if stoch:
                            rb = random_word(base + cj, key_lo, key_hi, cache)
                        code = encode_element(xs[j], p0, p1, pz, mode, fmt, stoch, rb, CVT)
                    q[j] = code
                    rem += 1
                    if rem == bc:
                        rem = 0
                        sc += 1
                store_unit(codes, row * pcols, c, q, C, pcols, NBITS, packed)

    return encode
