"""Kernel bodies of the fused ops (launchers: ``nqdq.kernels.fused``; spec:
``nqdq.reference.fused``).

One kernel family, :func:`row_kernel`, does every fused op in one pass: one block per row,
thread t of T holds the 4-element vectors u = t + T*j (j < M) of its row in registers
(read once, 8 bytes per load for 16-bit inputs), optionally adds the residual (writing the
new residual once), normalizes (RMSNorm), then quantizes (per row, per 1x128 group, MX
per 32, or a static per-tensor scale) and writes codes and scales once. The other ops are
the same body with the norm switched off: flatten (rows of a [B, H, D] view, D % 4 == 0,
any strides) and the MoE gather (row i reads source row perm[i]).

The norm's sum of squares follows reference/fused.ff_halving_sum bit for bit: element
e = 4*(t + T*j) + l of the row padded with zeros to P = 4*T*M (a power of two >= the
reference's padding, which changes no bit: see reference/fused), so the halving tree
removes the bits of j first (each thread over its own vectors), then those of t (a
shared-memory tree, radix 8 per stage), then those of l; every addition is ff_add(lower,
upper) as in the reference. Reductions use shared memory and __syncthreads only (the CUDA
simulator has no warp shuffles). Products that meet an addition go through mul_rn so NVVM
cannot contract them into an FMA (the PTX audit checks it).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, int32

from ._codec import (
    F32,
    KIND_F16,
    KIND_F32,
    ZERO,
    bits_f32,
    e8m0_reciprocal,
    f16_bits_to_f32_bits,
    f32_bits,
    load_f32,
    mul_rn,
)
from ._elements import encode_element, store_unit_wide
from ._rowwise_kernels import e2m1_code_nonnan, fp8_pair
from ._ptx import fp8_cvt_available, fp8_cvt_supports
from ._scales import MODE_FLOAT, MODE_MX, float_scale, mx_scale_code
from ._target import devfn

ONE = F32(1.0)
SPLITTER = F32(4097.0)  # Veltkamp, as reference/fused.SPLITTER
CANON_NAN_BITS = 0x7FC00000

OP_NORM = 0  # RMSNorm rows (optionally after the residual add)
OP_ROWS = 1  # plain rows of a (possibly strided) [B, H, D] view: flatten
OP_GATHER = 2  # row i is source row perm[i]: the MoE sort

OUT_Y = 0  # write float32 y (the unfused norm)
OUT_ROW = 1  # per-row float scale (fp8_row)
OUT_TENSOR = 2  # static per-tensor scale (fp8_tensor with scale=)
OUT_GROUP = 3  # float scale per G = 128 (fp8_1x128)
OUT_MX = 4  # e8m0 scale per 32 (mxfp4)

SIG_BITS = {KIND_F32: 24, 1: 8, KIND_F16: 11}  # KIND_BF16 == 1
R_SPLIT_MIN_BITS = 5  # reference/fused.R_SPLIT_MIN_BITS

MOE_CHUNK = 256  # pairs per block in the MoE sort kernels
FAST_ALL = False  # finite fast encoders for every output mode (see row_kernel); tests set it
MOE_MAX_EXPERTS = 1024
MOE_SCAN_SLOTS = MOE_MAX_EXPERTS + 1


# ----------------------------------------------------------------------------- float-float
@devfn
def two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@devfn
def split(a):
    c = mul_rn(SPLITTER, a)
    hi = c - (c - a)
    return hi, a - hi


@devfn
def prod_err(a, b, p):
    """The exact error a*b - p of p = fl(a*b) (Dekker; reference two_prod)."""
    ah, al = split(a)
    bh, bl = split(b)
    return (((mul_rn(ah, bh) - p) + mul_rn(ah, bl)) + mul_rn(al, bh)) + mul_rn(al, bl)


@devfn
def ff_add(ahi, alo, bhi, blo):
    s, e = two_sum(ahi, bhi)
    return s, e + (alo + blo)


@devfn
def rsqrt_mean(s_hi, s_lo, nf, epsf):
    """reference/fused.rsqrt_mean, operation for operation."""
    h, lo = two_sum(s_hi, s_lo)
    q1 = h / nf
    p = mul_rn(q1, nf)
    pe = prod_err(q1, nf, p)
    q2 = (((h - p) - pe) + lo) / nf
    m1, m2 = two_sum(q1, q2)
    a1, a2 = two_sum(m1, epsf)
    a1, a2 = two_sum(a1, a2 + m2)
    s1 = math.sqrt(a1)
    p = mul_rn(s1, s1)
    pe = prod_err(s1, s1, p)
    s2 = (((a1 - p) - pe) + a2) / (s1 + s1)
    s1, s2 = two_sum(s1, s2)
    r1 = ONE / s1
    p = mul_rn(s1, r1)
    pe = prod_err(s1, r1, p)
    r2 = (((ONE - p) - pe) - mul_rn(s2, r1)) * r1
    return two_sum(r1, r2)


# ----------------------------------------------------------------------------- 16-bit out
@devfn
def f32_to_bf16_bits(u):
    """bfloat16 bits of float32 bits u, nearest even (NaN must be canonical already)."""
    return np.int32(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)


@devfn
def f32_to_f16_bits(u):
    """float16 bits of float32 bits u, nearest even (numpy's astype): overflow to inf,
    subnormals rounded at 2^-24, NaN -> 0x7E00 (with the sign; callers pass canonical NaN)."""
    sign = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    if a > 0x7F800000:
        return np.int32(sign | 0x7E00)
    if a >= 0x477FF000:  # >= 65520 rounds to inf
        return np.int32(sign | 0x7C00)
    e = a >> 23
    if e >= 113:  # a normal float16
        m = a & 0x7FFFFF
        q = ((e - 112) << 10) | (m >> 13)
        rem = m & 0x1FFF
        if rem > 0x1000 or (rem == 0x1000 and (q & 1) == 1):
            q += 1
        return np.int32(sign | q)
    shift = 126 - e  # value = mm * 2^(e - 150); the quantum 2^-24 is mm >> shift
    if shift > 24:
        return np.int32(sign)
    mm = (a & 0x7FFFFF) | 0x800000
    q = mm >> shift
    rem = mm & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if rem > half or (rem == half and (q & 1) == 1):
        q += 1
    return np.int32(sign | q)


@devfn
def round_bits(h, kind):
    """The bits (as stored in the input's array) of float32 h rounded to the input kind,
    after canonicalizing NaN; and the rounded value as float32."""
    u = f32_bits(h)
    if (u & 0x7FFFFFFF) > 0x7F800000:
        u = CANON_NAN_BITS
    if kind == KIND_F32:
        return np.int64(u), bits_f32(u)
    if kind == KIND_F16:
        b = np.int64(f32_to_f16_bits(u))
        return b, bits_f32(f16_bits_to_f32_bits(b))
    b = np.int64(f32_to_bf16_bits(u))
    return b, bits_f32(b << 16)


@devfn
def half_to_f32(h, kind):
    # int64 in: f16_bits_to_f32_bits mixes its argument with int64 constants, and Numba
    # unifies unsigned with signed 64-bit integers as float64 (the audit's f64 rule)
    if kind == KIND_F16:
        return bits_f32(f16_bits_to_f32_bits(np.int64(h)))
    return bits_f32(np.int64(h) << 16)


@devfn
def load4(x, x64, off, valid, kind, wide, out, o):
    """out[o..o+4) = the 4 elements at x[off..off+4) (0 past ``valid`` of them); one or two
    64-bit loads when ``wide`` (off % 4 == 0 and the views are aligned)."""
    if wide and valid >= 4:
        if kind == KIND_F32:
            u0 = np.int64(x64[np.uint64(off >> 1)])
            u1 = np.int64(x64[np.uint64((off >> 1) + 1)])
            out[o] = bits_f32(u0 & 0xFFFFFFFF)
            out[o + 1] = bits_f32((u0 >> 32) & 0xFFFFFFFF)
            out[o + 2] = bits_f32(u1 & 0xFFFFFFFF)
            out[o + 3] = bits_f32((u1 >> 32) & 0xFFFFFFFF)
        else:
            u = x64[np.uint64(off >> 2)]
            w0 = np.uint32(u & np.uint64(0xFFFFFFFF))
            w1 = np.uint32(u >> np.uint64(32))
            if kind == KIND_F16:
                out[o] = half_to_f32(w0 & np.uint32(0xFFFF), kind)
                out[o + 1] = half_to_f32(w0 >> np.uint32(16), kind)
                out[o + 2] = half_to_f32(w1 & np.uint32(0xFFFF), kind)
                out[o + 3] = half_to_f32(w1 >> np.uint32(16), kind)
            else:  # bfloat16: its bits are the top half of the float32's
                out[o] = bits_f32(np.uint32(w0 << np.uint32(16)))
                out[o + 1] = bits_f32(w0 & np.uint32(0xFFFF0000))
                out[o + 2] = bits_f32(np.uint32(w1 << np.uint32(16)))
                out[o + 3] = bits_f32(w1 & np.uint32(0xFFFF0000))
        return
    for i in range(4):
        out[o + i] = load_f32(x, off + i, kind) if i < valid else ZERO


# ----------------------------------------------------------------------------- the row kernel
def _stages(T):
    """(step, next count) of each shared-memory stage of the tree over T threads: radix 8."""
    out, cnt = [], T
    while cnt > 1:
        step = 8 if cnt >= 8 else cnt
        out.append((step, cnt // step))
        cnt //= step
    return tuple(s for s, _ in out), tuple(n for _, n in out)


@lru_cache(maxsize=None)
def row_kernel(op, out, kind, wkind, T, M, wide, strided, has_res, fmt, mx_cfg, max_elem, G, IDX32=False, MINB=0):
    """The fused kernel for one configuration (every argument a compile-time constant):
    ``op`` OP_*, ``out`` OUT_*, input/weight kinds, T threads x M vectors per row, ``wide``
    (64-bit loads of x/residual/weight and stores of the new residual), ``strided``
    (OP_ROWS with a non-contiguous [B, H, D] view), ``fmt``/``mx_cfg``/``max_elem`` as in
    kernels.quantize, G the scale group (32 or 128; 0 otherwise), IDX32: every input offset
    fits in int32 (32-bit address arithmetic), MINB: launch bounds (T, MINB) when > 0 (the
    compiler then caps registers so MINB blocks fit on an SM)."""
    V = 4
    NV = M * V
    LOGM = M.bit_length() - 1
    STEPS, NEXTS = _stages(T)
    NST = len(STEPS)
    NORM = op == OP_NORM
    RES = has_res and NORM
    XB, WB = SIG_BITS[kind], SIG_BITS[wkind]
    SQ_EXACT = 2 * XB <= 24
    K = 24 - XB - WB
    RSPLIT = K >= R_SPLIT_MIN_BITS
    PEXACT = XB + WB <= 24
    RMASK = ((0xFFFFFFFF << (24 - K)) & 0xFFFFFFFF) if RSPLIT else 0
    MODE = MODE_MX if out == OUT_MX else MODE_FLOAT
    CVT = fp8_cvt_available() and fp8_cvt_supports(fmt) if out not in (OUT_Y,) else False
    NBITS = fmt[5] if out != OUT_Y else 8
    MAXE = F32(max_elem)
    MXR, MXM, MXE, MXI = mx_cfg[0], mx_cfg[1], mx_cfg[2], F32(mx_cfg[3])
    GV = max(G // V, 1)  # vectors per scale group
    NGB = max(NV * T // G, 1) if G else 1  # group slots per block (padded row)
    GROUPED = out in (OUT_GROUP, OUT_MX)
    # finite fast encoders: fp8 by the paired cvt (GPU only), e2m1 by grid rounding (MX).
    # Measured (H100, docs/performance.md "Fused ops"): faster for the static per-tensor scale
    # (277.6 -> 251.2 us), slower where the kernel also reduces a row / group amax (more
    # registers, 2 blocks per SM instead of 3: fp8_row 286.5 -> 332.5, fp8_1x128 295.4 ->
    # 353.2, mxfp4 301.1 -> 400.0 us), so only the static scale uses them. FAST_ALL=True
    # restores them everywhere (same codes: both paths are tested bit-exact on the GPU).
    E2M1 = fmt[0] == 1 and fmt[5] == 4 and fmt[1] == 1 and fmt[3] == 7
    FAST_ENC = ((NBITS == 8 and CVT and MODE == MODE_FLOAT) or (E2M1 and MODE == MODE_MX)) and (
        out == OUT_TENSOR or FAST_ALL)
    TV = T * V
    # the within-thread halving over j as constant (a, b) index pairs, level by level
    _jp = [((j * V + i), ((j + (M >> (lv + 1))) * V + i)) for lv in range(LOGM) for j in range(M >> (lv + 1))
           for i in range(V)]
    JPA = tuple(a for a, _ in _jp)
    JPB = tuple(b for _, b in _jp)
    NJP = len(_jp)
    MT = M * T
    XPER = 2 if kind == KIND_F32 else 4  # elements per 64-bit word
    WPER = 2 if wkind == KIND_F32 else 4
    assert T >= 8 and (T & (T - 1)) == 0 and (M & (M - 1)) == 0 and (not GROUPED or T % GV == 0)

    @devfn
    def encode_unit(v, o, c, n, p0, q):
        for i in range(V):
            q[i] = encode_element(v[o + i], p0, ZERO, 0, MODE, fmt, False, 0, CVT) if c + i < n else 0

    @devfn
    def encode_store(v, o, c, n, p0, q, codes, c32, c16, wide_out, rowbase, pcols):
        # A whole vector of finite values under a finite scale cannot meet a NaN rule, so it
        # takes the finite encoders of the row-wise quantize kernels (fp8: one paired cvt per
        # two codes; e2m1: rounding onto the grid) and one 32-/16-bit store; anything else
        # takes encode_element per element (every NaN rule included): the same codes.
        b0 = f32_bits(v[o])
        b1 = f32_bits(v[o + 1])
        b2 = f32_bits(v[o + 2])
        b3 = f32_bits(v[o + 3])
        m = max(max(b0 & 0x7FFFFFFF, b1 & 0x7FFFFFFF), max(b2 & 0x7FFFFFFF, b3 & 0x7FFFFFFF))
        fast = FAST_ENC and c + V <= n and m < 0x7F800000 and p0 == p0 and wide_out
        off = rowbase + c  # byte offset of the vector's codes (8-bit)
        if NBITS != 8:
            off = rowbase + (c >> 1)  # (4-bit: two per byte, c % 4 == 0)
        if fast:
            fast = (off & 3) == 0 if NBITS == 8 else (off & 1) == 0
        if fast:
            if NBITS == 8:
                w = fp8_pair(b0, b1, p0, MODE, fmt) | (fp8_pair(b2, b3, p0, MODE, fmt) << np.uint32(16))
                c32[np.uint64(off >> 2)] = np.uint32(w)
            else:
                w = (e2m1_code_nonnan(v[o] * p0) | (e2m1_code_nonnan(v[o + 1] * p0) << np.uint32(4))
                     | (e2m1_code_nonnan(v[o + 2] * p0) << np.uint32(8))
                     | (e2m1_code_nonnan(v[o + 3] * p0) << np.uint32(12)))
                c16[np.uint64(off >> 1)] = np.uint16(w)
            return
        encode_unit(v, o, c, n, p0, q)
        store_unit_wide(codes, c32, c16, wide_out, rowbase, c, q, n, pcols, NBITS, True)

    @cuda.jit(**({"launch_bounds": (T, MINB)} if MINB else {}))
    def fused_row_kernel(x, res, w, newres, yout, codes, scales, perm, n, pcols, ngroups, eps, sscale, sb, sh, D,
                         wide_out):
        # wider views made here, not on the host: the simulator copies each argument
        # separately, so two host views of one buffer would not see each other's stores
        x64 = x[: (x.size // XPER) * XPER].view(np.uint64)
        res64 = res[: (res.size // XPER) * XPER].view(np.uint64)
        newres64 = newres[: (newres.size // XPER) * XPER].view(np.uint64)
        w64 = w[: (w.size // WPER) * WPER].view(np.uint64)
        c32 = codes[: (codes.size >> 2) << 2].view(np.uint32)
        c16 = codes[: (codes.size >> 1) << 1].view(np.uint16)
        t = cuda.threadIdx.x
        row = cuda.blockIdx.x
        v = cuda.local.array(NV, float32)
        src = row
        if op == OP_GATHER:
            src = perm[row]
        n = np.int32(n)  # rows hold < 2^16 elements: 32-bit column arithmetic
        if IDX32:  # the host checked every offset fits: 32-bit addresses too
            base = np.int32(np.int32(src) * np.int32(sb))
        else:
            base = np.int64(src) * sb

        # ---- read the row once (and the residual; write the new residual once)
        for j in range(M):
            c = np.int32((t + T * j) * V)
            valid = np.int32(n - c)
            off = base + c
            if strided:
                hh = np.int32(c // D)
                off = base + hh * sh + (c - hh * D)
            if IDX32:
                off = np.int32(off)
            load4(x, x64, off, valid, kind, wide, v, j * V)
            if RES and valid > 0:
                r4 = cuda.local.array(V, float32)
                load4(res, res64, off, valid, kind, wide, r4, 0)
                packed = np.int64(0)
                for i in range(V):
                    b, hv = round_bits(v[j * V + i] + r4[i], kind)
                    v[j * V + i] = hv if i < valid else ZERO
                    if kind == KIND_F32:
                        if i < valid:
                            newres[np.uint64(off + i)] = hv
                    elif wide:
                        packed |= np.int64(b) << (16 * i)
                    elif i < valid:
                        newres[np.uint64(off + i)] = np.uint16(b)
                if kind != KIND_F32 and wide:
                    if valid >= V:
                        newres64[np.uint64(off >> 2)] = np.uint64(packed)
                    else:
                        for i in range(V):
                            if i < valid:
                                newres[np.uint64(off + i)] = np.uint16((packed >> (16 * i)) & 0xFFFF)

        # ---- RMSNorm: float-float halving sum of squares, then y = h * w * r
        if NORM:
            hi = cuda.local.array(NV, float32)
            lo = cuda.local.array(NV, float32)
            for i in range(NV):
                p = mul_rn(v[i], v[i])
                hi[i] = p
                lo[i] = ZERO if SQ_EXACT else prod_err(v[i], v[i], p)
            for pi in range(NJP):  # the bits of j, top first (constant pairs: registers)
                a = JPA[pi]
                b = JPB[pi]
                hi[a], lo[a] = ff_add(hi[a], lo[a], hi[b], lo[b])
            sh_hi = cuda.shared.array(TV, float32)
            sh_lo = cuda.shared.array(TV, float32)
            sh_r = cuda.shared.array(2, float32)
            for i in range(V):
                sh_hi[t * V + i] = hi[i]
                sh_lo[t * V + i] = lo[i]
            cuda.syncthreads()
            for st in range(NST):  # the bits of t, top first, radix 8 per stage
                step = STEPS[st]
                nxt = NEXTS[st]
                if t < nxt:
                    for i in range(V):
                        a0, b0 = sh_hi[t * V + i], sh_lo[t * V + i]
                        a1, b1 = sh_hi[(t + nxt) * V + i], sh_lo[(t + nxt) * V + i]
                        if step == 2:
                            a0, b0 = ff_add(a0, b0, a1, b1)
                        else:
                            a2, b2 = sh_hi[(t + 2 * nxt) * V + i], sh_lo[(t + 2 * nxt) * V + i]
                            a3, b3 = sh_hi[(t + 3 * nxt) * V + i], sh_lo[(t + 3 * nxt) * V + i]
                            if step == 8:  # first level: k with k + 4
                                a4, b4 = sh_hi[(t + 4 * nxt) * V + i], sh_lo[(t + 4 * nxt) * V + i]
                                a5, b5 = sh_hi[(t + 5 * nxt) * V + i], sh_lo[(t + 5 * nxt) * V + i]
                                a6, b6 = sh_hi[(t + 6 * nxt) * V + i], sh_lo[(t + 6 * nxt) * V + i]
                                a7, b7 = sh_hi[(t + 7 * nxt) * V + i], sh_lo[(t + 7 * nxt) * V + i]
                                a0, b0 = ff_add(a0, b0, a4, b4)
                                a1, b1 = ff_add(a1, b1, a5, b5)
                                a2, b2 = ff_add(a2, b2, a6, b6)
                                a3, b3 = ff_add(a3, b3, a7, b7)
                            a0, b0 = ff_add(a0, b0, a2, b2)  # k with k + 2, then k with k + 1
                            a1, b1 = ff_add(a1, b1, a3, b3)
                            a0, b0 = ff_add(a0, b0, a1, b1)
                        sh_hi[t * V + i] = a0
                        sh_lo[t * V + i] = b0
                cuda.syncthreads()
            if t == 0:  # the bits of l
                a0, b0 = ff_add(sh_hi[0], sh_lo[0], sh_hi[2], sh_lo[2])
                a1, b1 = ff_add(sh_hi[1], sh_lo[1], sh_hi[3], sh_lo[3])
                s_hi, s_lo = ff_add(a0, b0, a1, b1)
                r1, r2 = rsqrt_mean(s_hi, s_lo, F32(n), eps)
                sh_r[0] = r1
                sh_r[1] = r2
            cuda.syncthreads()
            r1 = sh_r[0]
            r2 = sh_r[1]
            if RSPLIT:
                r_hi = bits_f32(f32_bits(r1) & RMASK)
                r_lo = (r1 - r_hi) + r2
            else:
                r_hi = r1
                r_lo = r2
            for j in range(M):
                c = np.int32((t + T * j) * V)
                wv = cuda.local.array(V, float32)
                load4(w, w64, c, n - c, wkind, wide, wv, 0)
                for i in range(V):
                    h = v[j * V + i]
                    if RSPLIT:
                        a = h * wv[i]
                        y = mul_rn(a, r_hi) + mul_rn(a, r_lo)  # a * r_hi is exact; mul_rn: no FMA
                    else:
                        if PEXACT:
                            p = h * wv[i]
                            cc = mul_rn(p, r2)
                        else:
                            p = mul_rn(h, wv[i])
                            plo = prod_err(h, wv[i], p)
                            cc = mul_rn(p, r2) + mul_rn(plo, r1)
                        tt = mul_rn(p, r1)
                        e = prod_err(p, r1, tt)
                        y = tt + (e + cc)
                    if y != y:
                        y = bits_f32(CANON_NAN_BITS)
                    v[j * V + i] = y
                if c + V > n:  # the row's last, partial vector: padding stays 0
                    for i in range(V):
                        if c + i >= n:
                            v[j * V + i] = ZERO

        # ---- outputs
        if out == OUT_Y:
            ybase = np.int64(row) * n
            for j in range(M):
                c = np.int32((t + T * j) * V)
                for i in range(V):
                    if c + i < n:
                        yout[np.uint64(ybase + c + i)] = v[j * V + i]
            return

        q = cuda.local.array(V, int32)
        rowbase = np.int64(row) * pcols
        if out == OUT_ROW or out == OUT_TENSOR:
            if out == OUT_ROW:
                red = cuda.shared.array(T, int32)
                m = np.int32(0)
                for i in range(NV):
                    b = np.int32(f32_bits(v[i]) & 0x7FFFFFFF)
                    if b > m:
                        m = b
                red[t] = m
                cuda.syncthreads()
                for st in range(NST):
                    step = STEPS[st]
                    nxt = NEXTS[st]
                    if t < nxt:
                        for k in range(1, step):
                            b = red[t + k * nxt]
                            if b > m:
                                m = b
                        red[t] = m
                    cuda.syncthreads()
                p0 = float_scale(bits_f32(red[0]), MAXE)
                if t == 0:
                    scales[row] = p0
            else:
                p0 = sscale
            for j in range(M):
                c = np.int32((t + T * j) * V)
                if c < n:
                    encode_store(v, j * V, c, n, p0, q, codes, c32, c16, wide_out, rowbase, pcols)
            return

        # grouped: amax per vector -> shared; one thread per group -> parameters; encode
        gam = cuda.shared.array(MT, int32)
        gp = cuda.shared.array(NGB, float32)
        for j in range(M):
            m = np.int32(0)
            for i in range(V):
                b = np.int32(f32_bits(v[j * V + i]) & 0x7FFFFFFF)
                if b > m:
                    m = b
            gam[t + T * j] = m
        cuda.syncthreads()
        for g in range(t, NGB, T):
            if g < ngroups:
                m = np.int32(0)
                for k in range(GV):
                    b = gam[g * GV + k]
                    if b > m:
                        m = b
                amax = bits_f32(m)
                if out == OUT_MX:
                    code = mx_scale_code(amax, MXR, MXM, MXE, MXI)
                    scales[np.uint64(np.int64(row) * ngroups + g)] = np.uint8(code)
                    gp[g] = e8m0_reciprocal(code)
                else:
                    s = float_scale(amax, MAXE)
                    scales[np.uint64(np.int64(row) * ngroups + g)] = s
                    gp[g] = s
        cuda.syncthreads()
        for j in range(M):
            u = np.int32(t + T * j)
            c = u * V
            if c < n:
                p0 = gp[u // GV]
                encode_store(v, j * V, c, n, p0, q, codes, c32, c16, wide_out, rowbase, pcols)

    return fused_row_kernel


# ----------------------------------------------------------------------------- MoE sort
@cuda.jit
def moe_count_kernel(ids, npairs, num_experts, counts):
    """counts[chunk, e] = pairs of expert e among the chunk's MOE_CHUNK pairs (atomic adds
    into shared memory: the counts do not depend on their order)."""
    hist = cuda.shared.array(MOE_MAX_EXPERTS, int32)
    t = cuda.threadIdx.x
    ch = cuda.blockIdx.x
    for e in range(t, num_experts, MOE_CHUNK):
        hist[e] = 0
    cuda.syncthreads()
    p = ch * MOE_CHUNK + t
    if p < npairs:
        cuda.atomic.add(hist, ids[p], 1)
    cuda.syncthreads()
    for e in range(t, num_experts, MOE_CHUNK):
        counts[ch * num_experts + e] = hist[e]


@cuda.jit
def moe_scan_kernel(counts, nchunks, num_experts, base, offsets):
    """One block: offsets = exclusive scan of the expert totals; base[chunk, e] = first
    sorted row of expert e's pairs in that chunk."""
    tot = cuda.shared.array(MOE_SCAN_SLOTS, int32)
    e = cuda.threadIdx.x
    if e < num_experts:
        s = 0
        for ch in range(nchunks):
            s += counts[ch * num_experts + e]
        tot[e] = s
    cuda.syncthreads()
    if e == 0:
        run = 0
        for k in range(num_experts):
            c = tot[k]
            tot[k] = run
            offsets[k] = run
            run += c
        offsets[num_experts] = run
    cuda.syncthreads()
    if e < num_experts:
        run = tot[e]
        for ch in range(nchunks):
            base[ch * num_experts + e] = run
            run += counts[ch * num_experts + e]


@cuda.jit
def moe_scatter_kernel(ids, npairs, num_experts, k, base, perm):
    """perm[row] = token of the pair sorted to ``row``: base of (chunk, expert) plus the
    number of earlier pairs of the same expert in the chunk (stable)."""
    sid = cuda.shared.array(MOE_CHUNK, int32)
    t = cuda.threadIdx.x
    ch = cuda.blockIdx.x
    p = ch * MOE_CHUNK + t
    e = -1
    if p < npairs:
        e = ids[p]
    sid[t] = e
    cuda.syncthreads()
    if p < npairs:
        rank = 0
        for i in range(t):
            if sid[i] == e:
                rank += 1
        perm[base[ch * num_experts + e] + rank] = p // k
