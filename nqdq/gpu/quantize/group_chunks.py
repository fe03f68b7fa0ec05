"""The per-chunk device functions of the last-axis group kernel (``lastaxis_groups``, built by
``lastaxis.make_lastaxis_group_kernel``): a chunk of K units' group amax over the group's lanes,
its scale and its encode and stores, for every element format and scale mode.
"""

from __future__ import annotations

import numpy as np

from ..device.codec import F32, KIND_BF16, ZERO, f32_bits
from ..device.division import recip_guarded
from ..device.scales import MODE_FLOAT, MODE_MX, MODE_NVFP4, MX_RCEIL, NVFP4_INV6
from ..ptx.convert import fp8_cvt_available, fp8_cvt_supports
from ..ptx.pairs import u16x2_max
from ..runtime.target import devfn
from .encoders import encode_store_unit, encode_store_unit_r, is_e2m1, nvfp4_block
from .general import group_params, store_scale
from .pair_encoders import e2m1_unit_bf16, e2m1_unit_nvfp4, fp6_pair_consts, fp6_unit_bf16, is_fp6, store_fp6_chunk
from .reductions import unit_amax, word_amax16, xor_max
from .sr_units import sr_store_unit_r
from .units import FINITE, store_packed, unit_elems, vec_of


def mx_uncapped_bound(max_elem, emax):
    """One above the float32 bits of max_elem * 2^(127 - emax): an MX block whose amax bits are
    below it has |x| / 2^k <= max_elem under "rceil" (reference scales.mx_top_code)."""
    return int(np.float32(float(max_elem) * 2.0 ** (127 - int(emax))).view(np.uint32)) + 1


def unit_consts(kind, mode, fmt, mx_cfg, max_elem, packed):
    """(VEC, NB, CVT, MAXE, MXR, MXM, MXE, MXI): elements a unit, bits a code, whether fp8 codes
    are made by the cvt instruction, max_elem as float32 and the MX configuration's four."""
    nb = fmt[5] if packed else 8
    cvt = fp8_cvt_available() and fp8_cvt_supports(fmt)
    return vec_of(kind), nb, cvt, F32(max_elem), mx_cfg[0], mx_cfg[1], mx_cfg[2], F32(mx_cfg[3])


def group_chunk_fns(kind, mode, fmt, mx_cfg, max_elem, L, K, packed, shfl):
    """The per-chunk functions of ``lastaxis_groups`` (see make_lastaxis_group_kernel):
    ``chunk_step`` / ``chunk_step_sr`` (a chunk of K units w0 .. w3: its group's amax over
    the group's L / K lanes, the group's scale, the encode and the stores), ``unit_of`` (a
    chunk's first unit), ``ST`` (units between a chunk's units), ``IG``, ``VEC``. Not cached:
    each kernel factory (cached itself) builds its own."""
    VEC, NB, CVT, MAXE, MXR, MXM, MXE, MXI = unit_consts(kind, mode, fmt, mx_cfg, max_elem, packed)
    assert L & (L - 1) == 0 and 1 <= L <= 32 and L % K == 0 and K in (1, 2, 4)
    LL = L // K
    # MX e2m1 of bfloat16 input: amax and encode two elements per instruction (e2m1_unit_bf16);
    # "floor" / "even" scales can leave |x| / 2^k up to 8, which is clamped to 6 first
    # chunk c holds units unit_of(c) + k * ST, k < K: consecutive (ST = 1), or, for the fp8
    # formats (paired cvt) and integer elements under float scales
    # (int4_group: K = 4), interleaved over the group's lanes (ST = LL: lane l of a group holds its
    # units l, l + LL, ...), so that each load / store instruction of a warp still covers
    # whole contiguous pieces of LL units (coalesced as with K = 1)
    # Integer elements under float scales in last-axis groups (int4_group, int8 1xG): the group's
    # reciprocal once per chunk (not once per unit: the units' encodes sit in separate basic blocks,
    # so NVVM does not share it), bfloat16 amax two elements per instruction (word_amax16: the max
    # of |x|'s 16-bit patterns is the max of their float32 bits), and a chunk's K units interleaved
    # over the group's lanes as fp8 does (each load instruction of a warp covers whole sectors).
    # The same codes and scales bit for bit. H100: int4_group bf16 8192x8192 / 16384x7168 77 / 78
    # -> 95 / 97 % of copy (docs/design/last-axis.md). No launch bound: 5 blocks per SM (48 instead
    # of 49 registers) measured no faster.
    IG = mode == MODE_FLOAT and fmt[0] == 0  # integer elements, float scales
    ILV = K > 1 and (fp8_cvt_supports(fmt) or IG)
    ST = LL if ILV else 1

    @devfn
    def unit_of(c):
        if ILV:
            return (c // LL) * L + (c % LL)
        return c * K

    PAIRS = kind == KIND_BF16 and mode in (MODE_MX, MODE_NVFP4) and NB == 4 and is_e2m1(fmt)
    # MX fp6 of bfloat16 input: the pair encoder (fp6_pair_codes); a chunk of 4 units stores
    # its 24 code bytes (8-byte aligned: 24 * chunk) by three 8-byte stores
    FP6P = kind == KIND_BF16 and mode == MODE_MX and NB == 6 and is_fp6.py_func(fmt)
    F6 = fp6_pair_consts.py_func(fmt) if FP6P else (0, 0, 0, 0)
    CHUNK6 = FP6P and K == 4 and ST == 1
    CLAMP = MXR != MX_RCEIL
    # the unclamped pair encoders need |x| / 2^k <= max_elem, which "rceil" gives but for blocks
    # above max_elem * 2^(127 - emax), whose exponent is capped (reference mx_top_code): those
    # take encode_store_unit's clamped / saturating encoders
    PAIR_CLEAN = FINITE if CLAMP or mode != MODE_MX else mx_uncapped_bound(MAXE, MXE)
    CVT_E4M3 = fp8_cvt_available()  # NVFP4's ue4m3 block code by the cvt instruction (sm_89+)

    @devfn
    def chunk_amax(w0, w1, w2, w3, tid, scratch):
        """The group amax of a chunk (units w0 .. w{K-1}) over the group's LL lanes: the units'
        amax bits (bfloat16 halves two per instruction where the kernel's encoders take the
        words: word_amax16, the same bits as unit_amax), then the butterfly (every lane takes
        part, in range or not)."""
        if PAIRS or FP6P or (IG and kind == KIND_BF16):  # bfloat16 halves: the same amax bits, two per instruction
            a2 = word_amax16(w0)
            if K >= 2:
                a2 = u16x2_max(a2, word_amax16(w1))
            if K >= 4:
                a2 = u16x2_max(a2, u16x2_max(word_amax16(w2), word_amax16(w3)))
            a = np.int32(max(a2 & np.uint32(0xFFFF), a2 >> np.uint32(16)) << np.uint32(16))
        else:
            a = unit_amax(unit_elems(w0, kind), VEC)
            if K >= 2:
                a = max(a, unit_amax(unit_elems(w1, kind), VEC))
            if K >= 4:
                a = max(a, max(unit_amax(unit_elems(w2, kind), VEC), unit_amax(unit_elems(w3, kind), VEC)))
        off = LL >> 1
        while off > 0:
            a = xor_max(a, off, shfl, scratch, tid)
            off >>= 1
        return a

    @devfn
    def chunk_step(w0, w1, w2, w3, chunk, nchunks, tid, scratch, c8, c16, c32, scales, s_enc, s_dec):
        """One chunk (units w0 .. w{K-1}; the rest are unused zeros): amax, butterfly over
        the group's LL lanes, parameters, encode. Chunk by chunk, so that only one chunk's
        parameters are live at a time (registers, hence occupancy). Returns the group's
        amax bits (NaN above inf), which NVFP4's amax by-product folds in."""
        a = chunk_amax(w0, w1, w2, w3, tid, scratch)
        if chunk < nchunks:
            u = unit_of(chunk)
            if PAIRS and mode == MODE_NVFP4 and a < FINITE:
                code, mb = nvfp4_block(a, s_enc, s_enc * NVFP4_INV6, s_dec, CVT_E4M3)
                if (tid & (LL - 1)) == 0:
                    scales[chunk // LL] = np.uint8(code)
                c32[np.uint64(u)] = e2m1_unit_nvfp4(w0, mb)
                if K >= 2:
                    c32[np.uint64(u + ST)] = e2m1_unit_nvfp4(w1, mb)
                if K >= 4:
                    c32[np.uint64(u + 2 * ST)] = e2m1_unit_nvfp4(w2, mb)
                    c32[np.uint64(u + 3 * ST)] = e2m1_unit_nvfp4(w3, mb)
                return a
            sv, p0, pz = group_params(mode, a, ZERO, ZERO, MAXE, MXR, MXM, MXE, MXI, s_enc)
            if (tid & (LL - 1)) == 0:
                store_scale(scales, chunk // LL, mode, sv)
            clean = a < FINITE
            if FP6P and a < PAIR_CLEAN:
                hb = np.uint32(f32_bits(p0)) >> np.uint32(16)  # 2^-k as bfloat16 (exact: a normal power of two)
                p2 = np.uint32(hb | (hb << np.uint32(16)))
                l0, h0 = fp6_unit_bf16(w0, p2, F6, CLAMP)
                if CHUNK6:
                    l1, h1 = fp6_unit_bf16(w1, p2, F6, CLAMP)
                    l2, h2 = fp6_unit_bf16(w2, p2, F6, CLAMP)
                    l3, h3 = fp6_unit_bf16(w3, p2, F6, CLAMP)
                    store_fp6_chunk(c32, chunk, l0, h0, l1, h1, l2, h2, l3, h3)
                    return a
                store_packed(l0, h0, u, c8, c16, c32, VEC, NB)
                if K >= 2:
                    l1, h1 = fp6_unit_bf16(w1, p2, F6, CLAMP)
                    store_packed(l1, h1, u + ST, c8, c16, c32, VEC, NB)
                if K >= 4:
                    l2, h2 = fp6_unit_bf16(w2, p2, F6, CLAMP)
                    store_packed(l2, h2, u + 2 * ST, c8, c16, c32, VEC, NB)
                    l3, h3 = fp6_unit_bf16(w3, p2, F6, CLAMP)
                    store_packed(l3, h3, u + 3 * ST, c8, c16, c32, VEC, NB)
                return a
            if PAIRS and a < PAIR_CLEAN:
                hb = np.uint32(f32_bits(p0)) >> np.uint32(16)  # 2^-k as bfloat16 (exact: a normal power of two)
                p2 = np.uint32(hb | (hb << np.uint32(16)))
                c32[np.uint64(u)] = e2m1_unit_bf16(w0, p2, CLAMP)
                if K >= 2:
                    c32[np.uint64(u + ST)] = e2m1_unit_bf16(w1, p2, CLAMP)
                if K >= 4:
                    c32[np.uint64(u + 2 * ST)] = e2m1_unit_bf16(w2, p2, CLAMP)
                    c32[np.uint64(u + 3 * ST)] = e2m1_unit_bf16(w3, p2, CLAMP)
                return a
            if IG:  # one reciprocal per chunk (encode_store_unit_r)
                rp = recip_guarded(p0)
                encode_store_unit_r(unit_elems(w0, kind), u, p0, rp, clean, c8, c16, c32, mode, fmt, CVT, VEC, NB)
                if K >= 2:
                    encode_store_unit_r(unit_elems(w1, kind), u + ST, p0, rp, clean, c8, c16, c32, mode, fmt, CVT, VEC,
                                        NB)
                if K >= 4:
                    encode_store_unit_r(unit_elems(w2, kind), u + 2 * ST, p0, rp, clean, c8, c16, c32, mode, fmt, CVT,
                                        VEC, NB)
                    encode_store_unit_r(unit_elems(w3, kind), u + 3 * ST, p0, rp, clean, c8, c16, c32, mode, fmt, CVT,
                                        VEC, NB)
                return a
            encode_store_unit(unit_elems(w0, kind), u, p0, clean, c8, c16, c32, mode, fmt, CVT, VEC, NB)
            if K >= 2:
                encode_store_unit(unit_elems(w1, kind), u + ST, p0, clean, c8, c16, c32, mode, fmt, CVT, VEC, NB)
            if K >= 4:
                encode_store_unit(unit_elems(w2, kind), u + 2 * ST, p0, clean, c8, c16, c32, mode, fmt, CVT, VEC, NB)
                encode_store_unit(unit_elems(w3, kind), u + 3 * ST, p0, clean, c8, c16, c32, mode, fmt, CVT, VEC, NB)
        return a

    @devfn
    def chunk_step_sr(w0, w1, w2, w3, chunk, nchunks, tid, scratch, c8, c16, c32, scales, s_enc, s_dec, key_lo, key_hi):
        """chunk_step under stochastic rounding: the same amax and butterfly (chunk_amax), group
        parameters and scale (group_params: the reference's formula; a finite NVFP4 block by
        nvfp4_block's shortcut, which reproduces it), every unit by
        sr_store_unit_r."""
        a = chunk_amax(w0, w1, w2, w3, tid, scratch)
        if chunk < nchunks:
            u = unit_of(chunk)
            clean = a < FINITE
            if mode == MODE_NVFP4 and clean:  # nvfp4_block's shortcut, as chunk_step's
                code, p0 = nvfp4_block(a, s_enc, s_enc * NVFP4_INV6, s_dec, CVT_E4M3)
                if (tid & (LL - 1)) == 0:
                    scales[chunk // LL] = np.uint8(code)
            else:
                sv, p0, pz = group_params(mode, a, ZERO, ZERO, MAXE, MXR, MXM, MXE, MXI, s_enc)
                if (tid & (LL - 1)) == 0:
                    store_scale(scales, chunk // LL, mode, sv)
            rp = recip_guarded(p0) if mode == MODE_FLOAT else ZERO
            sr_store_unit_r(unit_elems(w0, kind), u, p0, rp, clean, key_lo, key_hi, c8, c16, c32, mode, fmt, VEC, NB)
            if K >= 2:
                sr_store_unit_r(unit_elems(w1, kind), u + ST, p0, rp, clean, key_lo, key_hi, c8, c16, c32, mode, fmt,
                                VEC, NB)
            if K >= 4:
                sr_store_unit_r(unit_elems(w2, kind), u + 2 * ST, p0, rp, clean, key_lo, key_hi, c8, c16, c32, mode,
                                fmt, VEC, NB)
                sr_store_unit_r(unit_elems(w3, kind), u + 3 * ST, p0, rp, clean, key_lo, key_hi, c8, c16, c32, mode,
                                fmt, VEC, NB)
        return a

    return dict(chunk_step=chunk_step, chunk_step_sr=chunk_step_sr, unit_of=unit_of, ST=ST, IG=IG, VEC=VEC)
