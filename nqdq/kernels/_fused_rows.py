"""The fused row kernel (launcher: ``nqdq.kernels.fused.run_rows``; spec: ``reference/fused``).

One block of NT = 32 * NW threads per row, laid out as reference/fused.row_geometry says
(a function of the row length only): thread t holds the row's 8-element units t, t + NT,
..., t + NT * (U - 1) in registers from the load to the store, the way the row-wise quantize
kernels (``_rowwise_kernels``) do:

* a unit is read by one 16-byte ``ld.global.nc.v4.u32`` (two for float32) and kept as its
  raw words (a bfloat16 unit is 4 registers); a row whose units are not 16-byte aligned
  (n % 8 != 0, odd strides or addresses) is read element by element into the same words:
  the same values, the same order, only slower (``fast=False``);
* the residual (optional) is added per element and the new residual leaves in two 8-byte
  stores per unit;
* RMSNorm's sum of squares in float-float, in the spec's order (reference/fused.ff_row_sum):
  a unit's halving tree and the thread's units in order, in registers; the 32 lanes by a
  butterfly of ``shfl.sync.bfly`` (ff_add is commutative bit for bit, so each lane of a pair
  gets the tree's value); the warps by one shared slot each, one barrier, then every thread
  adds the NW pairs in order and computes 1/sqrt itself (no second barrier, no idle lanes);
* quantize: per row (a butterfly max and one more barrier), per 1x128 / MX-32 group (a
  butterfly over the group's 16 / 4 lanes, no barrier) or a static scale; finite units take
  the row-wise kernels' finite encoders (paired cvt for fp8, grid rounding for e2m1) and
  leave in one 8-byte (fp8) or 4-byte (fp4) store, everything else encode_element per element.

The warp shuffles have twins (``_rowwise_kernels.xor_get`` / ``xor_max`` with shfl=False:
shared memory and barriers) that the CUDA simulator runs. Per-unit statements are written
out (generated source, as ``_rowwise_kernels._jit_unrolled``) so NVVM keeps every unit in
registers.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda, float32, int32

from ..reference.fused import UNIT, WARP
from ._codec import F32, KIND_F16, KIND_F32, ONE, ZERO, bits_f32, f32_bits, mul_rn
from ._elements import encode_element, store_unit_wide
from ._fused_kernels import (CANON_NAN_BITS, OP_GATHER, OP_NORM, OUT_MX, OUT_ROW, OUT_TENSOR, OUT_Y,
                             R_SPLIT_MIN_BITS, SIG_BITS, ff_add, prod_err, round_bits, rsqrt_mean, two_sum)
from ._ptx import fp8_cvt_available, fp8_cvt_supports, load_u32x4, store_u32x2
from ._quantize_kernels import group_params, store_scale
from ._division import RECIP_DIV, ratio_ok, recip_guarded
from ._rowwise_kernels import FINITE, _block_max_fn, abs_i32, encode_store_unit_r, half_bits, unit_amax, xor_get, xor_max
from ._scales import MODE_FLOAT, MODE_MX
from ._target import SIMULATOR, devfn

__all__ = ["fused_row_kernel"]


def _loader(kind, fast, strided):
    """load(x, x32, base, u, n, sh, D) -> (a, b): unit u of the row at element ``base`` as
    raw words (16-bit kinds: a = 4 words of 2 elements, b unused; float32: a = elements 0-3,
    b = 4-7), zeros past n. ``strided``: the row is H heads of D elements, head h at
    base + h * sh."""
    F32K = kind == KIND_F32

    @devfn
    def elem(x, base, c, n, sh, D):
        if c >= n:
            return np.uint32(0)
        off = base + c
        if strided:
            hh = c // D
            off = base + hh * sh + (c - hh * D)
        if F32K:
            return np.uint32(f32_bits(x[off]))
        return np.uint32(x[off])

    @devfn
    def pair(x, base, c, n, sh, D):
        return np.uint32(elem(x, base, c, n, sh, D) | (elem(x, base, c + 1, n, sh, D) << np.uint32(16)))

    @devfn
    def load(x, x32, base, u, n, sh, D):
        z = np.uint32(0)
        Z = (z, z, z, z)
        c = u * UNIT
        if fast:
            if c >= n:
                return Z, Z
            off = base + c
            if strided:
                hh = c // D
                off = base + hh * sh + (c - hh * D)
            if F32K:
                q = off >> 2
                return load_u32x4(x32, q), load_u32x4(x32, q + 1)
            return load_u32x4(x32, off >> 3), Z
        if F32K:
            return ((elem(x, base, c, n, sh, D), elem(x, base, c + 1, n, sh, D), elem(x, base, c + 2, n, sh, D),
                     elem(x, base, c + 3, n, sh, D)),
                    (elem(x, base, c + 4, n, sh, D), elem(x, base, c + 5, n, sh, D), elem(x, base, c + 6, n, sh, D),
                     elem(x, base, c + 7, n, sh, D)))
        return (pair(x, base, c, n, sh, D), pair(x, base, c + 2, n, sh, D), pair(x, base, c + 4, n, sh, D),
                pair(x, base, c + 6, n, sh, D)), Z

    return load


def _elems(kind):
    """elems(a, b) -> the unit's 8 elements as float32 bits."""
    if kind == KIND_F32:
        @devfn
        def elems(a, b):
            return a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]
    else:
        @devfn
        def elems(a, b):
            return (half_bits(a[0], 0, kind), half_bits(a[0], 1, kind), half_bits(a[1], 0, kind),
                    half_bits(a[1], 1, kind), half_bits(a[2], 0, kind), half_bits(a[2], 1, kind),
                    half_bits(a[3], 0, kind), half_bits(a[3], 1, kind))
    return elems


_KERNEL_ARGS = "x, res, w, newres, yout, codes, scales, perm, n, pcols, ngroups, eps, sscale, sb, sh, D"


@devfn
def store_words8(dst32, q, lo, hi):
    """The words lo[0..3], hi[0..3] at 8-byte pairs q .. q + 3 of ``dst32`` (four
    ``st.global.v2.u32``)."""
    store_u32x2(dst32, q, lo[0], lo[1])
    store_u32x2(dst32, q + 1, lo[2], lo[3])
    store_u32x2(dst32, q + 2, hi[0], hi[1])
    store_u32x2(dst32, q + 3, hi[2], hi[3])


@lru_cache(maxsize=None)
def fused_row_kernel(op, out, kind, wkind, NW, U, fast, strided, has_res, fmt, mx_cfg, max_elem, G, shfl):
    """The kernel for one configuration (every argument a compile-time constant): ``op``
    OP_*, ``out`` OUT_*, input / weight kinds, NW warps x U units per thread (the spec's
    geometry), ``fast`` (16-byte aligned units: vector loads and stores), ``strided`` (a
    [B, H, D] view), ``fmt`` / ``mx_cfg`` / ``max_elem`` as in kernels.quantize, G the scale
    group (128 or 32; 0 otherwise), ``shfl`` (warp shuffles; False: their simulator twins).
    Arguments: see _KERNEL_ARGS (flat arrays; sb the row stride of x in elements)."""
    NT = WARP * NW
    NORM = op == OP_NORM
    RES = has_res and NORM
    F32K = kind == KIND_F32
    XB, WB = SIG_BITS[kind], SIG_BITS[wkind]
    SQ_EXACT = 2 * XB <= 24
    K = 24 - XB - WB
    RSPLIT = K >= R_SPLIT_MIN_BITS
    PEXACT = XB + WB <= 24
    RMASK = ((0xFFFFFFFF << (24 - K)) & 0xFFFFFFFF) if RSPLIT else 0
    MODE = MODE_MX if out == OUT_MX else MODE_FLOAT
    CVT = out != OUT_Y and fp8_cvt_available() and fp8_cvt_supports(fmt)
    NB = fmt[5] if out != OUT_Y else 8
    MAXE = F32(max_elem)
    MXR, MXM, MXE, MXI = mx_cfg[0], mx_cfg[1], mx_cfg[2], F32(mx_cfg[3])
    LL = G // UNIT  # lanes per scale group
    load_x = _loader(kind, fast, strided)
    load_r = _loader(kind, fast, False)
    load_w = _loader(wkind, fast, False)
    elems = _elems(kind)
    welems = _elems(wkind)

    @devfn
    def add_res(a, b, res, r32, newres, nr32, rbase, u, n):
        """The unit of x + residual rounded to the input's dtype (NaN canonical): the new
        residual, stored, and returned as the unit's words."""
        ra, rb = load_r(res, r32, rbase, u, n, n, n)
        xe = elems(a, b)
        re = elems(ra, rb)
        h0, v0 = round_bits(bits_f32(xe[0]) + bits_f32(re[0]), kind)
        h1, v1 = round_bits(bits_f32(xe[1]) + bits_f32(re[1]), kind)
        h2, v2 = round_bits(bits_f32(xe[2]) + bits_f32(re[2]), kind)
        h3, v3 = round_bits(bits_f32(xe[3]) + bits_f32(re[3]), kind)
        h4, v4 = round_bits(bits_f32(xe[4]) + bits_f32(re[4]), kind)
        h5, v5 = round_bits(bits_f32(xe[5]) + bits_f32(re[5]), kind)
        h6, v6 = round_bits(bits_f32(xe[6]) + bits_f32(re[6]), kind)
        h7, v7 = round_bits(bits_f32(xe[7]) + bits_f32(re[7]), kind)
        z = np.uint32(0)
        if F32K:
            na = (np.uint32(h0), np.uint32(h1), np.uint32(h2), np.uint32(h3))
            nb = (np.uint32(h4), np.uint32(h5), np.uint32(h6), np.uint32(h7))
        else:
            na = (np.uint32(h0 | (h1 << 16)), np.uint32(h2 | (h3 << 16)), np.uint32(h4 | (h5 << 16)),
                  np.uint32(h6 | (h7 << 16)))
            nb = (z, z, z, z)
        c = u * UNIT
        if c < n:
            if fast:
                if F32K:
                    store_words8(nr32, (rbase + c) >> 1, na, nb)
                else:
                    q = (rbase + c) >> 2
                    store_u32x2(nr32, q, na[0], na[1])
                    store_u32x2(nr32, q + 1, na[2], na[3])
            else:
                put_res(newres, rbase + c, n - c, h0, h1, h2, h3, h4, h5, h6, h7, v0, v1, v2, v3, v4, v5, v6, v7)
        return na, nb

    @devfn
    def put1(newres, off, valid, i, h, v):
        if i < valid:
            if F32K:
                newres[off + i] = v
            else:
                newres[off + i] = np.uint16(h)

    @devfn
    def put_res(newres, off, valid, h0, h1, h2, h3, h4, h5, h6, h7, v0, v1, v2, v3, v4, v5, v6, v7):
        put1(newres, off, valid, 0, h0, v0)
        put1(newres, off, valid, 1, h1, v1)
        put1(newres, off, valid, 2, h2, v2)
        put1(newres, off, valid, 3, h3, v3)
        put1(newres, off, valid, 4, h4, v4)
        put1(newres, off, valid, 5, h5, v5)
        put1(newres, off, valid, 6, h6, v6)
        put1(newres, off, valid, 7, h7, v7)

    @devfn
    def sq(e):
        v = bits_f32(e)
        p = mul_rn(v, v)
        return p, (ZERO if SQ_EXACT else prod_err(v, v, p))

    @devfn
    def leaf(a, b):
        # ff_add of two squares: when they are exact (16-bit inputs) their low parts are 0
        # and ff_add's e + (0 + 0) is e itself (e is never -0 for non-negative operands)
        if SQ_EXACT:
            return two_sum(a[0], b[0])
        return ff_add(a[0], a[1], b[0], b[1])

    @devfn
    def unit_sq(a, b):
        """Step 1: the halving tree over the unit's 8 squares (i with i + 4, i + 2, i + 1)."""
        e = elems(a, b)
        s0, s1, s2, s3 = sq(e[0]), sq(e[1]), sq(e[2]), sq(e[3])
        s4, s5, s6, s7 = sq(e[4]), sq(e[5]), sq(e[6]), sq(e[7])
        t0h, t0l = leaf(s0, s4)
        t1h, t1l = leaf(s1, s5)
        t2h, t2l = leaf(s2, s6)
        t3h, t3l = leaf(s3, s7)
        t0h, t0l = ff_add(t0h, t0l, t2h, t2l)
        t1h, t1l = ff_add(t1h, t1l, t3h, t3l)
        return ff_add(t0h, t0l, t1h, t1l)

    @devfn
    def row_sum(hi, lo, tid, scratch, red):
        """Steps 3 and 4: the lanes' halving tree by butterflies, then the warps in order."""
        off = 16
        while off > 0:
            ph = xor_get(hi, off, shfl, scratch, tid)
            pl = xor_get(lo, off, shfl, scratch, tid)
            hi, lo = ff_add(hi, lo, ph, pl)
            off >>= 1
        if (tid & 31) == 0:
            red[tid >> 5] = hi
            red[NW + (tid >> 5)] = lo
        cuda.syncthreads()
        hi = red[0]
        lo = red[NW]
        for k in range(1, NW):
            hi, lo = ff_add(hi, lo, red[k], red[NW + k])
        return hi, lo

    @devfn
    def canon(b):
        if (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
            return np.uint32(CANON_NAN_BITS)
        return b

    @devfn
    def canon8(y):
        """The unit with every NaN made the spec's canonical one (payload and sign), which
        is what its codes are defined from; a unit whose amax is finite holds none."""
        return (canon(y[0]), canon(y[1]), canon(y[2]), canon(y[3]), canon(y[4]), canon(y[5]), canon(y[6]),
                canon(y[7]))

    @devfn
    def norm1(e, we, r1, r2, r_hi, r_lo):
        """reference/fused.normalize of one element (float32 bits in, bits out)."""
        h = bits_f32(e)
        wv = bits_f32(we)
        if RSPLIT:
            a = h * wv
            y = mul_rn(a, r_hi) + mul_rn(a, r_lo)  # a * r_hi is exact; mul_rn: no FMA
        else:
            if PEXACT:
                p = h * wv
                cc = mul_rn(p, r2)
            else:
                p = mul_rn(h, wv)
                plo = prod_err(h, wv, p)
                cc = mul_rn(p, r2) + mul_rn(plo, r1)
            tt = mul_rn(p, r1)
            ee = prod_err(p, r1, tt)
            y = tt + (ee + cc)
        b = np.uint32(f32_bits(y))
        if out == OUT_Y:  # quantized outputs make NaN canonical only where one can be (canon8)
            b = canon(b)
        return b

    @devfn
    def norm_unit(a, b, w, w32, u, n, r1, r2, r_hi, r_lo):
        """The unit's normalized values (float32 bits; 0 past n)."""
        wa, wb = load_w(w, w32, 0, u, n, n, n)
        e = elems(a, b)
        f = welems(wa, wb)
        y = (norm1(e[0], f[0], r1, r2, r_hi, r_lo), norm1(e[1], f[1], r1, r2, r_hi, r_lo),
             norm1(e[2], f[2], r1, r2, r_hi, r_lo), norm1(e[3], f[3], r1, r2, r_hi, r_lo),
             norm1(e[4], f[4], r1, r2, r_hi, r_lo), norm1(e[5], f[5], r1, r2, r_hi, r_lo),
             norm1(e[6], f[6], r1, r2, r_hi, r_lo), norm1(e[7], f[7], r1, r2, r_hi, r_lo))
        if not fast:  # a partial last unit: its padding stays 0 (1/sqrt may be inf)
            c = u * UNIT
            z = np.uint32(0)
            y = (y[0], y[1] if c + 1 < n else z, y[2] if c + 2 < n else z, y[3] if c + 3 < n else z,
                 y[4] if c + 4 < n else z, y[5] if c + 5 < n else z, y[6] if c + 6 < n else z,
                 y[7] if c + 7 < n else z)
        return y

    @devfn
    def put_y(y, yout, y32, rbase, u, n):
        c = u * UNIT
        if fast:
            store_words8(y32, (rbase + c) >> 1, (y[0], y[1], y[2], y[3]), (y[4], y[5], y[6], y[7]))
            return
        for i in range(UNIT):
            if c + i < n:
                yout[rbase + c + i] = bits_f32(y[i])

    @devfn
    def enc4(y, o, c, n, p0, q):
        for i in range(4):
            q[i] = encode_element(bits_f32(y[o + i]), p0, ZERO, 0, MODE, fmt, False, 0, CVT) if c + i < n else 0

    @devfn
    def put_codes(y, u, row, n, pcols, p0, r, clean, codes, c16, c32):
        """Encode and store the unit's codes (row ``row`` of the contiguous codes array); r =
        recip_guarded(p0) for float scales (a clean unit is divided by the reciprocal: see
        _rowwise_kernels.fp8_pair_r), computed once per row where the scale is the row's."""
        if NORM and not clean:
            y = canon8(y)
        if fast:  # n % 8 == 0: the unit's codes start at byte (row * n + 8u) * NB / 8
            encode_store_unit_r(y, np.int64(row) * (n // UNIT) + u, p0, r, clean, codes, c16, c32, MODE, fmt, CVT,
                                UNIT, NB)
            return
        q = cuda.local.array(4, int32)
        c = u * UNIT
        rowbase = np.int64(row) * pcols
        enc4(y, 0, c, n, p0, q)
        store_unit_wide(codes, c32, c16, False, rowbase, c, q, n, pcols, NB, True)
        if c + 4 < n:
            enc4(y, 4, c + 4, n, p0, q)
            store_unit_wide(codes, c32, c16, False, rowbase, c + 4, q, n, pcols, NB, True)

    @devfn
    def group_unit(y, ok, u, row, n, pcols, ngroups, tid, scratch, codes, c16, c32, scales):
        """A 1x128 / MX-32 unit: the group's amax over its LL lanes, parameters, codes."""
        a = unit_amax(y, UNIT) if ok else np.int32(0)
        off = LL >> 1
        while off > 0:  # every lane takes part, in the row or not
            a = xor_max(a, off, shfl, scratch, tid)
            off >>= 1
        if ok:
            sv, p0, pz = group_params(MODE, a, ZERO, ZERO, MAXE, MXR, MXM, MXE, MXI, ONE)
            if (tid & (LL - 1)) == 0:
                store_scale(scales, np.int64(row) * ngroups + u // LL, MODE, sv)
            put_codes(y, u, row, n, pcols, p0, recip_guarded(p0) if MODE == MODE_FLOAT else ZERO, a < FINITE, codes,
                      c16, c32)

    @devfn
    def put_static(y, u, row, n, pcols, p0, r, sclean, codes, c16, c32):
        """put_codes under the static scale p0 (r = recip_guarded(p0)): a unit with a non-finite
        value, or (dividing by the reciprocal) one whose |y| reaches p0 * 2^64, is not clean."""
        am = unit_amax(y, UNIT)
        clean = sclean and am < FINITE
        if RECIP_DIV and r != ZERO and not ratio_ok(am, p0):
            clean = False  # a caller-given scale far below |y| (all codes saturate): element by element
        put_codes(y, u, row, n, pcols, p0, r, clean, codes, c16, c32)

    block_max = _block_max_fn(NT, shfl)

    # ---- the kernel's source, one statement per unit where a unit is involved
    L = [f"def fused_rows({_KERNEL_ARGS}):",
         "    tid = cuda.threadIdx.x",
         "    row = cuda.blockIdx.x",
         "    scratch = cuda.shared.array(SCRATCH, int32)",
         "    red = cuda.shared.array(RED, float32)",
         "    redm = cuda.shared.array(NW, int32)",
         "    x32 = x[: (x.size >> XSH) << XSH].view(np.uint32)",
         "    r32 = res[: (res.size >> XSH) << XSH].view(np.uint32)",
         "    nr32 = newres[: (newres.size >> XSH) << XSH].view(np.uint32)",
         "    w32 = w[: (w.size >> WSH) << WSH].view(np.uint32)",
         "    y32 = yout.view(np.uint32)",
         "    c32 = codes[: (codes.size >> 2) << 2].view(np.uint32)",
         "    c16 = codes[: (codes.size >> 1) << 1].view(np.uint16)",
         "    n = np.int32(n)",
         "    nunits = (n + (UNIT - 1)) // UNIT",
         "    src = perm[row] if OP == OP_GATHER else row",
         "    base = np.int64(src) * sb",
         "    rbase = np.int64(row) * n"]
    J = range(U)
    L += [f"    u{j} = np.int32(tid + {j * NT})" for j in J]
    L += [f"    a{j}, b{j} = load_x(x, x32, base, u{j}, n, sh, D)" for j in J]
    if RES:
        L += [f"    a{j}, b{j} = add_res(a{j}, b{j}, res, r32, newres, nr32, rbase, u{j}, n)" for j in J]
    if NORM:
        L += ["    s_hi, s_lo = unit_sq(a0, b0)"]
        for j in range(1, U):
            L += [f"    t_hi, t_lo = unit_sq(a{j}, b{j})", "    s_hi, s_lo = ff_add(s_hi, s_lo, t_hi, t_lo)"]
        L += ["    s_hi, s_lo = row_sum(s_hi, s_lo, tid, scratch, red)",
              "    r1, r2 = rsqrt_mean(s_hi, s_lo, F32(n), eps)"]
        if RSPLIT:
            L += ["    r_hi = bits_f32(np.uint32(f32_bits(r1) & RMASK))", "    r_lo = (r1 - r_hi) + r2"]
        else:
            L += ["    r_hi = r1", "    r_lo = r2"]
        Y = "norm_unit(a{j}, b{j}, w, w32, u{j}, n, r1, r2, r_hi, r_lo)"
    else:
        Y = "elems(a{j}, b{j})"
    # each unit's values are made right before their use (fewer live registers), except per
    # row, where every unit waits for the row's amax
    if out == OUT_Y:
        use = "    if u{j} < nunits: put_y(y{j}, yout, y32, rbase, u{j}, n)"
    elif out == OUT_TENSOR:
        L += ["    p0 = sscale", "    sclean = abs_i32(f32_bits(p0)) < FINITE and p0 != ZERO", "    rp = recip_guarded(p0)"]
        use = "    if u{j} < nunits: put_static(y{j}, u{j}, row, n, pcols, p0, rp, sclean, codes, c16, c32)"
    elif out == OUT_ROW:
        use = "    if u{j} < nunits: am = max(am, unit_amax(y{j}, UNIT))"
        L += ["    am = np.int32(0)"]
    else:
        use = "    group_unit(y{j}, u{j} < nunits, u{j}, row, n, pcols, ngroups, tid, scratch, codes, c16, c32, scales)"
    for j in J:
        L += ["    y{j} = {Y}".format(j=j, Y=Y.format(j=j)), use.format(j=j)]
    if out == OUT_ROW:
        L += ["    am = block_max(am, tid, scratch, redm)",
              "    sv, p0, pz = group_params(MODE, am, ZERO, ZERO, MAXE, MXR, MXM, MXE, MXI, ONE)",
              "    if tid == 0: store_scale(scales, row, MODE, sv)",
              "    clean = am < FINITE",
              "    rp = recip_guarded(p0) if MODE == MODE_FLOAT else ZERO"]
        L += [f"    if u{j} < nunits: put_codes(y{j}, u{j}, row, n, pcols, p0, rp, clean, codes, c16, c32)" for j in J]
    src = "\n".join(L) + "\n"
    glb = dict(globals())
    glb.update(SCRATCH=1 if shfl else NT, RED=2 * NW, NW=NW, XSH=0 if F32K else 1, WSH=0 if wkind == KIND_F32 else 1,
               OP=op, MODE=MODE, MAXE=MAXE, MXR=MXR, MXM=MXM, MXE=MXE, MXI=MXI, RMASK=RMASK, load_x=load_x,
               add_res=add_res, unit_sq=unit_sq, row_sum=row_sum, norm_unit=norm_unit, elems=elems, put_y=put_y,
               put_codes=put_codes, put_static=put_static, group_unit=group_unit, block_max=block_max)
    exec(compile(src, f"<nqdq fused_rows op={op} out={out} NW={NW} U={U}>", "exec"), glb)
    fn = glb["fused_rows"]
    # launch bounds: a block of NT threads must fit one SM's registers (NT = 1024 at most
    # rows: <= 64 registers a thread; ptxas spills rather than fail at launch)
    kern = cuda.jit(fn) if SIMULATOR else cuda.jit(fn, launch_bounds=(NT,))
    kern.source = src
    return kern


_ = (float32, OP_GATHER, rsqrt_mean, abs_i32, KIND_F16)  # used by the generated source
