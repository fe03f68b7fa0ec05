"""The device functions of the fused row kernel (``rows.fused_row_kernel``), built per
configuration: every one a closure over the configuration's compile-time constants (so that
they fold), by families: the residual (``residual_fns``), RMSNorm (``norm_fns``), the
quantized outputs' encode and stores (``encode_fns``), the bfloat16 words' MX e2m1 path and
OP_SCATTER's staged rows (``words_fns``), the L2 prefetch (``prefetch_fn``). The kernel's
statements (generated source, one per unit) call them by name.
"""

from __future__ import annotations

import numpy as np
from numba import int32

from ...reference.fused import UNIT
from ..device.codec import ONE, ZERO, bits_f32, f32_bits, mul_rn
from ..device.division import ratio_ok, recip_guarded
from ..device.elements import encode_element, store_unit_wide
from ..device.scales import MODE_FLOAT
from ..ptx.convert import cvt_bf16x2
from ..ptx.memory import prefetch_l2, store_u32x2, store_u32x4
from ..ptx.pairs import prmt
from ..quantize.encoders import enc, encode_store_unit_r
from ..quantize.general import group_params, store_scale
from ..quantize.pair_encoders import e2m1_unit_bf16, e2m1_unit_f32_p2
from ..quantize.reductions import unit_amax, unit_amax_nan, word_amax16, xor_max
from ..quantize.units import FINITE
from ..runtime.backend import cuda
from ..runtime.target import devfn
from .kernels import CANON_NAN_BITS, OUT_Y, prod_err, round_bits, rsqrt_mean, split_sum64, xor_lane


@devfn
def mx_rceil_params(a, inv):
    """(e8m0 code, multiplier 2^-k) of an MX group with "rceil" scales from its amax bits
    ``a`` (int32, >= 0; NaN above inf) and inv = fp32(1 / max_elem): _scales.mx_scale_code
    (MX_RCEIL) and _codec.e8m0_reciprocal in 32-bit integers (Numba's int64 arithmetic took
    some 80 SASS instructions per unit, once per lane of a group: 10 per element). code =
    the exponent field ef of v = amax * inv, plus 1 when v is above 2^(ef - 127) (a mantissa
    and ef < 0xFE; ef = 0: above 2^-127, i.e. man > 2^22); 0xFF (and a NaN multiplier) for a
    non-finite amax; the multiplier 2^(127 - code) is normal but for code 254 (0x00400000)."""
    vb = np.uint32(f32_bits(bits_f32(np.uint32(a)) * inv))
    # branch-free (selects, no divergent branches: some 10 instructions a group less): ef + 1
    # where a mantissa bit is set is the exponent of (vb + 0x7FFFFF); a subnormal v (ef = 0) is
    # above 2^-127 only for man > 2^22, i.e. (vb + 0x3FFFFF) >> 23 = 1; at most 0xFE (ef = 0xFE
    # with a mantissa stays 0xFE), 0xFF for a NaN or inf v (vb <= 0x7FFFFFFF: no wraparound)
    bias = np.uint32(0x3FFFFF) if vb < np.uint32(0x800000) else np.uint32(0x7FFFFF)
    code = min(np.uint32(np.uint32(vb + bias) >> np.uint32(23)), np.uint32(0xFE))
    # capped at 254 - emax (reference scales.mx_top_code): inv = fp32(1 / max_elem), max_elem's
    # significand above 1 in every MX format, has exponent field 126 - emax, so the cap is 128 + it
    code = min(code, np.uint32(np.uint32(128) + ((np.uint32(f32_bits(inv)) >> np.uint32(23)) & np.uint32(0xFF))))
    nonfinite = vb >= np.uint32(0x7F800000)
    pb = np.uint32(np.uint32(np.uint32(254) - code) << np.uint32(23))
    if code == np.uint32(254):
        pb = np.uint32(0x00400000)
    if nonfinite:
        code, pb = np.uint32(0xFF), np.uint32(CANON_NAN_BITS)
    return code, bits_f32(pb)


@devfn
def store_words8(dst32, q, lo, hi):
    """The words lo[0..3], hi[0..3] at 8-byte pairs q .. q + 3 of ``dst32`` (four
    ``st.global.v2.u32``)."""
    store_u32x2(dst32, q, lo[0], lo[1])
    store_u32x2(dst32, q + 1, lo[2], lo[3])
    store_u32x2(dst32, q + 2, hi[0], hi[1])
    store_u32x2(dst32, q + 3, hi[2], hi[3])


def residual_fns(kind, fast, F32K, RCVT, load_r, elems):
    """``add_res``: a unit of x plus the residual, rounded to the input's dtype, the new
    residual stored (``kind``: the input's; ``fast``: aligned units; ``RCVT``: bfloat16 rows
    on the fast path, by cvt.rn.bf16x2.f32)."""

    @devfn
    def canon_bf16x2(w):
        """Every NaN half of the pair w (|half| above 0x7F80: + 0x7F carries into the half's
        bit 15) made the spec's canonical 0x7FC0, branch-free, whatever sign and payload the
        cvt gave it (0x7FFF by the PTX manual and the twin; not relied on)."""
        t = np.uint32((np.uint32((w & np.uint32(0x7FFF7FFF)) + np.uint32(0x007F007F)) & np.uint32(0x80008000))
                      >> np.uint32(15))
        m = np.uint32(t * np.uint32(0xFFFF))  # 0xFFFF in each NaN half
        return np.uint32((w & ~m) | (np.uint32(0x7FC07FC0) & m))

    @devfn
    def add_res_cvt(a, b, res, r32, newres, nr32, rbase, qu, u, nu, n):
        """add_res of bfloat16 rows on the fast path (RCVT): the sums rounded two at a time by
        cvt.rn.bf16x2.f32 (round to nearest even, overflow to inf, subnormals kept: round_bits'
        bits for every non-NaN sum); its NaN 0x7FFF made round_bits' canonical 0x7FC0 by
        canon_bf16x2 (a branch redoing NaN units by round_bits held the 8 sums through it: 24
        more registers for rmsnorm + res + mxfp4; branch-free, none: 96 either way)."""
        ra, rb = load_r(res, r32, qu, u, nu, rbase, n, n, n, 0)
        xe = elems(a, b)
        re = elems(ra, rb)
        s0, s1 = bits_f32(xe[0]) + bits_f32(re[0]), bits_f32(xe[1]) + bits_f32(re[1])
        s2, s3 = bits_f32(xe[2]) + bits_f32(re[2]), bits_f32(xe[3]) + bits_f32(re[3])
        s4, s5 = bits_f32(xe[4]) + bits_f32(re[4]), bits_f32(xe[5]) + bits_f32(re[5])
        s6, s7 = bits_f32(xe[6]) + bits_f32(re[6]), bits_f32(xe[7]) + bits_f32(re[7])
        na = (canon_bf16x2(cvt_bf16x2(s1, s0)), canon_bf16x2(cvt_bf16x2(s3, s2)), canon_bf16x2(cvt_bf16x2(s5, s4)),
              canon_bf16x2(cvt_bf16x2(s7, s6)))
        if u * UNIT < n:  # fast path: unit qu of the array, 8-byte pairs 2 qu, 2 qu + 1
            store_u32x2(nr32, 2 * qu, na[0], na[1])
            store_u32x2(nr32, 2 * qu + 1, na[2], na[3])
        z = np.uint32(0)
        return na, (z, z, z, z)

    @devfn
    def add_res(a, b, res, r32, newres, nr32, rbase, qu, u, nu, n):
        """The unit of x + residual rounded to the input's dtype (NaN canonical): the new
        residual, stored, and returned as the unit's words."""
        if RCVT:
            return add_res_cvt(a, b, res, r32, newres, nr32, rbase, qu, u, nu, n)
        ra, rb = load_r(res, r32, qu, u, nu, rbase, n, n, n, 0)
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
            if fast:  # unit qu of the array: 8-byte pairs 2 qu, 2 qu + 1 (float32: 4 qu .. 4 qu + 3)
                if F32K:
                    store_words8(nr32, 4 * qu, na, nb)
                else:
                    store_u32x2(nr32, 2 * qu, na[0], na[1])
                    store_u32x2(nr32, 2 * qu + 1, na[2], na[3])
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

    return add_res


def norm_fns(NW, RSQ0, RSPLIT, PEXACT, out, fast, shfl, elems, welems):
    """RMSNorm's steps (reference/fused): ``unit_sq`` (a unit's squares), ``row_rsqrt`` (the
    row's sum and its 1/sqrt), ``norm_unit`` (a unit normalized), ``put_y`` (the unfused y
    stored), ``canon8`` (NaNs made the spec's canonical one)."""

    @devfn
    def unit_sq(a, b):
        """Step 1: the unit's 8 squares in float64 (exact), added in element order. The loop
        starts from +0 (+0 + h_0^2 is h_0^2) and is unrolled by NVVM, which contracts each
        product and sum into fma.rn.f64: the same bits, the product being exact."""
        e = elems(a, b)
        t = np.float64(0.0)
        for i in range(UNIT):
            d = np.float64(bits_f32(e[i]))
            t = t + d * d
        return t

    @devfn
    def warp_sums(s, tid, scratch64, red):
        """Step 3 and the first of step 4: the lanes' halving tree by butterflies, each warp's
        sum into its shared slot, one barrier."""
        off = 16
        while off > 0:
            s = s + xor_lane(s, off, shfl, scratch64, tid)
            off >>= 1
        if (tid & 31) == 0:
            red[tid >> 5] = s
        cuda.syncthreads()

    @devfn
    def row_r(red, nf, eps):
        """The rest of step 4 and the norm's factor: the warps' sums in order, the row's sum as
        the float32 pair (hi, lo) (split_sum64), (r1, r2) = rsqrt_mean of it."""
        s = red[0]
        for k in range(1, NW):
            s = s + red[k]
        s_hi, s_lo = split_sum64(s)
        return rsqrt_mean(s_hi, s_lo, nf, eps)

    @devfn
    def row_rsqrt(s, tid, scratch64, red, rr, nf, eps):
        """(r1, r2) = row_r of the row's sum of squares from the thread's sum ``s``: by every
        thread, or (RSQ0: MX outputs, more than one warp) by thread 0, whose result the others read
        from ``rr`` after a second barrier."""
        warp_sums(s, tid, scratch64, red)
        if not (RSQ0 and NW > 1):
            return row_r(red, nf, eps)
        if tid == 0:
            r1, r2 = row_r(red, nf, eps)
            rr[0] = r1
            rr[1] = r2
        cuda.syncthreads()
        return rr[0], rr[1]

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
            # a * r_hi is exact: the fma rounds once, as the sum of the two products would
            y = cuda.fma(a, r_hi, mul_rn(a, r_lo))
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
    def norm_unit(a, b, wa, wb, u, n, r1, r2, r_hi, r_lo):
        """The unit's normalized values (float32 bits; 0 past n) from the raw words of x
        (a, b) and of the weights (wa, wb)."""
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
    def put_y(y, yout, y32, rbase, qu, u, n):
        c = u * UNIT
        if fast:
            store_words8(y32, 4 * qu, (y[0], y[1], y[2], y[3]), (y[4], y[5], y[6], y[7]))
            return
        for i in range(UNIT):
            if c + i < n:
                yout[rbase + c + i] = bits_f32(y[i])

    return dict(unit_sq=unit_sq, row_rsqrt=row_rsqrt, canon8=canon8, norm_unit=norm_unit, put_y=put_y)


def encode_fns(MODE, fmt, CVT, NB, NORM, MXE2M1, MXRC, MAXE, MXR, MXM, MXE, MXI, LL, fast, shfl, canon8):
    """The quantized outputs' steps: ``put_codes`` (a unit's codes stored), ``amax_y`` (a
    unit's amax bits), ``group_params_r`` (a group's multiplier and reciprocal, its scale
    stored), ``group_max`` / ``group_scale`` (over the group's LL lanes), ``group_unit`` (a
    1x128 / MX-32 unit), ``put_static`` (under the static scale)."""

    @devfn
    def enc4(y, o, c, n, p0, q):
        for i in range(4):
            q[i] = encode_element(bits_f32(y[o + i]), p0, ZERO, 0, MODE, fmt, False, 0, CVT) if c + i < n else 0

    @devfn
    def put_codes(y, u, row, n, pcols, p0, r, clean, codes, c16, c32, qu):
        if MXE2M1 and fast and clean:  # MX e2m1, a finite group: the multiplier in the bfloat16 pairs
            pb = np.uint32(f32_bits(p0))  # (2^-k: its top half is exact in bfloat16)
            c32[np.uint64(qu)] = e2m1_unit_f32_p2(y, prmt(pb, pb, np.uint32(0x3232)), True)  # (unsigned; clamped: CLAMP)
            return
        """Encode and store the unit's codes (row ``row`` of the contiguous codes array); r =
        recip_guarded(p0) for float scales (a clean unit is divided by the reciprocal: see
        _rowwise_kernels.fp8_pair_r), computed once per row where the scale is the row's."""
        if NORM and not clean:
            y = canon8(y)
        if fast:  # n % 8 == 0: the unit's codes start at byte (row * n + 8u) * NB / 8, qu = row * n / 8 + u
            # (a clean unit of the pairs' paths has returned above: their element encoders only)
            clean = clean and not MXE2M1
            encode_store_unit_r(y, qu, p0, r, clean, codes, c16, c32, MODE, fmt, CVT, UNIT, NB)
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
    def amax_y(y):
        """A unit's amax bits (unit_amax; unit_amax_nan for RMSNorm's y)."""
        if NORM:
            return unit_amax_nan(y)
        return unit_amax(y, UNIT)

    @devfn
    def group_params_r(a, st, si, scales):
        """(multiplier p0, r = recip_guarded(p0) for float scales, else 0) of a group whose amax
        has the bits ``a``; where ``st`` its scale is stored at ``si``."""
        if MXRC:  # MX "rceil" (mxfp4, mxfp8): the same code and multiplier in 32-bit arithmetic
            code, p0 = mx_rceil_params(a, MXI)
            if st:
                scales[si] = np.uint8(code)
            return p0, ZERO
        sv, p0, pz = group_params(MODE, a, ZERO, ZERO, MAXE, MXR, MXM, MXE, MXI, ONE)
        if st:
            store_scale(scales, si, MODE, sv)
        return p0, recip_guarded(p0) if MODE == MODE_FLOAT else ZERO

    @devfn
    def group_max(a, tid, scratch):
        """The group's amax over its LL lanes from a lane's amax ``a`` (a butterfly): every
        lane takes part, in the row or not (the simulator's twin syncs the block)."""
        off = LL >> 1
        while off > 0:
            a = xor_max(a, off, shfl, scratch, tid)
            off >>= 1
        return a

    @devfn
    def group_scale(a, ok, si, tid, scratch, scales):
        """(the group's amax over its LL lanes, p0, r) from a lane's amax ``a`` (group_max);
        where ``ok`` the group's parameters (group_params_r; its first lane stores the scale
        ``si``), else p0 = r = 0 (unused)."""
        a = group_max(a, tid, scratch)
        p0, r = ZERO, ZERO
        if ok:
            p0, r = group_params_r(a, (tid & (LL - 1)) == 0, si, scales)
        return a, p0, r

    @devfn
    def group_unit(y, ok, u, row, n, pcols, si, tid, scratch, codes, c16, c32, scales, qu):
        """A 1x128 / MX-32 unit: the group's amax over its LL lanes, parameters, codes; si =
        the group's index in ``scales`` (row * ngroups + u // LL)."""
        a = amax_y(y) if ok else np.int32(0)
        a, p0, r = group_scale(a, ok, si, tid, scratch, scales)
        if ok:
            put_codes(y, u, row, n, pcols, p0, r, a < FINITE, codes, c16, c32, qu)

    @devfn
    def put_static(y, u, row, n, pcols, p0, r, sclean, codes, c16, c32, qu):
        """put_codes under the static scale p0 (r = recip_guarded(p0)): a unit with a non-finite
        value, or (dividing by the reciprocal) one whose |y| reaches p0 * 2^64, is not clean."""
        am = amax_y(y)
        clean = sclean and am < FINITE
        if r != ZERO and not ratio_ok(am, p0):
            clean = False  # a caller-given scale far below |y| (all codes saturate): element by element
        put_codes(y, u, row, n, pcols, p0, r, clean, codes, c16, c32, qu)

    return dict(put_codes=put_codes, amax_y=amax_y, group_params_r=group_params_r, group_max=group_max,
                group_scale=group_scale, group_unit=group_unit, put_static=put_static)


def words_fns(MODE, fmt, CVT, MXRC, MAXE, MXR, MXM, MXE, MXI, LL, LLSH, NT, KD, CLAMP, elems, group_max, group_scale,
              put_codes):
    """Rows of bfloat16 words into MX e2m1 (``group_unit_w``) and OP_SCATTER's staged rows
    (``stage_unit``, ``put_staged``, ``stage_group``, ``put_quad``, ``put_rows``)."""

    @devfn
    def words_amax(w, ok):
        """The amax bits of a unit of bfloat16 words (word_amax16, two halves an instruction:
        the same bits as unit_amax of its elements); 0 where not ``ok``."""
        a = np.int32(0)
        if ok:
            a2 = word_amax16(w)
            a = np.int32(max(a2 & np.uint32(0xFFFF), a2 >> np.uint32(16)) << np.uint32(16))
        return a

    @devfn
    def e2m1_word(w, p0):
        """The e2m1 codes of a finite group's unit of bfloat16 words under the multiplier p0
        (2^-k, exact in bfloat16): one 32-bit word (e2m1_unit_bf16)."""
        hb = np.uint32(f32_bits(p0)) >> np.uint32(16)
        return e2m1_unit_bf16(w, np.uint32(hb | (hb << np.uint32(16))), CLAMP)

    @devfn
    def group_unit_w(w, ok, u, row, n, pcols, si, tid, scratch, codes, c16, c32, scales, qu):
        """group_unit of a unit of bfloat16 words ``w`` (WPAIRS: rows without the norm into
        MX e2m1), as the quantize kernels' group kernel does it (quantize.lastaxis.
        make_lastaxis_group_kernel, PAIRS): the amax two halves per instruction (word_amax16:
        the same bits as unit_amax of the elements), the codes of a finite group by
        e2m1_unit_bf16 on the words themselves; a non-finite group by put_codes."""
        a, p0, r = group_scale(words_amax(w, ok), ok, si, tid, scratch, scales)
        if ok:
            if a < FINITE:
                c32[np.uint64(qu)] = e2m1_word(w, p0)  # (unsigned: no wraparound code)
            else:
                z = np.uint32(0)
                put_codes(elems(w, (z, z, z, z)), u, row, n, pcols, p0, ZERO, False, codes, c16, c32, qu)

    @devfn
    def mx_group(a):
        """(e8m0 code, multiplier) of an MX group whose amax has the bits ``a``: group_params_r
        without the store."""
        if MXRC:
            code, p0 = mx_rceil_params(a, MXI)
            return np.int32(code), p0
        sv, p0, pz = group_params(MODE, a, ZERO, ZERO, MAXE, MXR, MXM, MXE, MXI, ONE)
        return np.int32(int(sv)), p0

    @devfn
    def stage_unit(w, ok, tid, scratch, sw, sc, k):
        """group_unit_w's encode without its stores (OP_SCATTER, STAGE): the unit's e2m1 word
        and its group's scale code to slot ``k`` of the block's shared ``sw`` / ``sc`` (the
        lane's own slot, read back by the same lane: no barrier). A non-finite group's word
        by the element encoder (put_codes' path for it: enc, every NaN rule)."""
        a = group_max(words_amax(w, ok), tid, scratch)
        if ok:
            code, p0 = mx_group(a)
            sw[k] = group_word(w, a, p0)
            sc[k] = np.uint8(code)

    @devfn
    def put_staged(sw, sc, k, ok, u, tid, c32, scales, dd, ss):
        """A staged unit (stage_unit's slot ``k``) to its token's KD sorted rows: the word at
        dd[j] + u, the group's scale (by the group's first lane) at ss[j] + u // LL."""
        put_rows(sw, k, ok, u, c32, dd)
        put_rows(sc, k, ok and (tid & (LL - 1)) == 0, np.int64(u >> LLSH), scales, ss)

    @devfn
    def group_word(w, a, p0):
        """The e2m1 word of a unit of bfloat16 words in a group of amax bits ``a`` and
        multiplier p0: e2m1_word where the group is finite, else the element encoder (enc,
        put_codes' path for it: every NaN rule)."""
        if a < FINITE:
            return e2m1_word(w, p0)
        z = np.uint32(0)
        y = elems(w, (z, z, z, z))
        word = np.uint32(0)
        for i in range(UNIT):
            word |= enc(f32_bits(y[i]), p0, MODE, fmt, CVT, np.uint32(0xF)) << np.uint32(4 * i)
        return word

    @devfn
    def stage_group(w0, w1, w2, w3, n0, n1, n2, n3, sw, sc, k, ks):
        """A lane's whole group of 4 units (OP_SCATTER, STAGE with LANES; ``n*``: the unit is in
        the row): its amax in the lane (words_amax, no butterfly), parameters, the 4 words to
        slots k, k + NT, .. of ``sw`` and the scale code to slot ks of ``sc``."""
        a = max(max(words_amax(w0, n0), words_amax(w1, n1)), max(words_amax(w2, n2), words_amax(w3, n3)))
        if n0:
            code, p0 = mx_group(a)
            sw[k] = group_word(w0, a, p0)
            sw[k + NT] = group_word(w1, a, p0)
            sw[k + 2 * NT] = group_word(w2, a, p0)
            sw[k + 3 * NT] = group_word(w3, a, p0)
            sc[ks] = np.uint8(code)

    @devfn
    def put_quad(sw, k, c32, dd, qi):
        """Staged words k, k + NT, k + 2 NT, k + 3 NT (a lane's 4 consecutive units) to the
        KD sorted rows by one 16-byte store each: quad dd[j] / 4 + qi (dd[j] = row * nunits, a
        multiple of 4: LANES)."""
        w0, w1, w2, w3 = sw[k], sw[k + NT], sw[k + 2 * NT], sw[k + 3 * NT]
        for j in range(KD):
            store_u32x4(c32, np.uint64((dd[j] >> 2) + qi), w0, w1, w2, w3)

    @devfn
    def put_rows(src, k, ok, i, dst, base):
        """Staged slot k of ``src`` (a word or a scale code) to entry i of each of the token's
        KD sorted rows, dst[base[j] + i] (dd: the rows' first units, ss: their first groups),
        where ``ok``."""
        if ok:
            v = src[k]
            for j in range(KD):
                dst[np.uint64(base[j] + i)] = v

    return dict(group_unit_w=group_unit_w, stage_unit=stage_unit, put_staged=put_staged, stage_group=stage_group,
                put_quad=put_quad, put_rows=put_rows)


def prefetch_fn(F32K, NT):
    """``prefetch_rows``: a row's lines into L2."""

    @devfn
    def prefetch_rows(x32, row, tid, nunits, sb):
        """prefetch.global.L2 of the 128-byte lines of x's row ``row``: thread t takes lines
        t, t + NT, ... (a line is 8 of the loads' 16-byte quads)."""
        qn = nunits * (2 if F32K else 1)
        qx = (np.int64(row) * sb) >> (2 if F32K else 3)
        l = np.int32(tid * 8)
        while l < qn:
            prefetch_l2(x32, qx + l)
            l += NT * 8

    return prefetch_rows
