"""The per-chunk device functions of the last-axis asymmetric and centred group kernel
(``lastaxis_stat_groups``, built by ``lastaxis.make_lastaxis_stat_group_kernel``): a chunk's
group statistics over the group's lanes (max and min keys; the centred halving sum and amax,
a generated step), its parameters and its encode and stores.
"""

from __future__ import annotations

import numpy as np

from ..device.codec import F32, KIND_BF16, KIND_F32, ZERO, bits_f32, f32_bits, mul_rn
from ..device.division import recip_guarded
from ..device.scales import MODE_ASYM, MODE_CENTRED, centred_params
from ..ptx.pairs import bf16x2_max, bf16x2_min, u16x2_max, u16x2_min
from ..runtime.target import devfn
from .asym_units import (
    asym_group, asym_group_r, asym_unit_store_r, encode_store_int_unit_r, key, ukey_bits, unit_bf16_minmax, unit_keys,
    unit_ukeys, word_ukeys, xor_u16x2_max,
)
from .reductions import abs_i32, word_amax16, xor_add, xor_get, xor_max
from .sr_units import sr_store_unit
from .units import FINITE, unit_elems, vec_of
from .unrolled import compile_source, sub_once


# The centred chunk step, generated for the chunk's W = K * VEC elements (one named
# register each). A group of G = P elements (a power of two) is LL lanes of W elements.
# reference halving_sum's levels h = P/2 .. 1 add element i and i + h. Units consecutive
# in a lane (the old layout): the levels P/2 .. W add the same position of lanes l and
# l ^ (h / W): per position, a butterfly over the lanes (offsets LL/2 .. 1, in that order).
# Done as a reduce-scatter: at each such level the two lanes of a pair split the positions
# they hold (on the next position bit), each sending the half it gives up and adding the
# partner's copy of the half it keeps -- the same sums, one shuffle per pair of positions
# instead of one per position. When a lane is down to one position the remaining lane
# levels are plain butterflies. Then the levels between positions a lane still holds are
# added in the thread, and the last ones (positions split across lanes) are butterflies
# again (position bit t <-> lane offset LL >> (t + 1)). Units interleaved (lane l holds
# units l + k * LL): the top log2(K) levels pair unit k with unit k + K/2^i of
# the same lane, additions in the thread (FOLD), which leaves VEC positions per lane for the
# lane levels as above.
_CENTRED_STEP_SRC = """
def centred_step(w0, w1, w2, w3, chunk, nchunks, tid, scratch, c8, c16, c32, scales, zps, means):
    e0 = unit_elems(w0, kind)
    e1 = unit_elems(w1, kind)
    e2 = unit_elems(w2, kind)
    e3 = unit_elems(w3, kind)
LEAVES
CROSS
LOCAL
    mean = mul_rn(v0, FACTOR)
    a = np.int32(0)
AMAX
    off = LL >> 1
    while off > 0:
        a = xor_max(a, off, shfl, scratch, tid)
        off >>= 1
    if chunk < nchunks:
        s, mean = centred_params(mean, bits_f32(np.uint32(a)), MAXE)
        if (tid & (LL - 1)) == 0:
            scales[chunk // LL] = s
            means[chunk // LL] = mean
        clean = a < FINITE
ENCODE
"""
_CENTRED_ENCODE_ONCE = """        u = unit_of(chunk)
        rr = recip_guarded(s)
        encode_store_int_unit_r(e0, u, s, mean, 0, ZERO, ZERO, rr, clean, c8, c16, c32, mode, fmt, VEC, NB)
        if K >= 2:
            encode_store_int_unit_r(e1, u + ST, s, mean, 0, ZERO, ZERO, rr, clean, c8, c16, c32, mode, fmt, VEC, NB)
        if K >= 4:
            encode_store_int_unit_r(e2, u + 2 * ST, s, mean, 0, ZERO, ZERO, rr, clean, c8, c16, c32, mode, fmt, VEC, NB)
            encode_store_int_unit_r(e3, u + 3 * ST, s, mean, 0, ZERO, ZERO, rr, clean, c8, c16, c32, mode, fmt, VEC, NB)"""

# the centred encode under stochastic rounding
_CENTRED_ENCODE_SR = """        u = unit_of(chunk)
        sr_store_unit(e0, u, s, mean, 0, key_lo, key_hi, c8, c16, c32, mode, fmt, VEC, NB)
        if K >= 2:
            sr_store_unit(e1, u + ST, s, mean, 0, key_lo, key_hi, c8, c16, c32, mode, fmt, VEC, NB)
        if K >= 4:
            sr_store_unit(e2, u + 2 * ST, s, mean, 0, key_lo, key_hi, c8, c16, c32, mode, fmt, VEC, NB)
            sr_store_unit(e3, u + 3 * ST, s, mean, 0, key_lo, key_hi, c8, c16, c32, mode, fmt, VEC, NB)"""


def _lane_levels_src(W, LL, ind):
    """(cross, local) statement lines of the halving sum's lane levels and the position
    levels after them, for slots v0 .. v{W-1} holding W consecutive positions of each of LL
    lanes (see the comment above _CENTRED_STEP_SRC); the total ends in v0 of every lane."""
    cross = []
    slots = [f"v{i}" for i in range(W)]  # slot k: position lanebits + (k << S)
    S = 0  # position bits split over lanes so far
    off = LL >> 1
    while off > 0:  # lane levels, LL/2 .. 1
        if len(slots) > 1:
            cross.append(f"{ind}b{S} = (tid & {off}) != 0")
            new = []
            for m in range(len(slots) // 2):
                ev, od = slots[2 * m], slots[2 * m + 1]
                cross.append(f"{ind}r{S}_{m} = xor_get({ev} if b{S} else {od}, {off}, shfl, scratch, tid)")
                cross.append(f"{ind}{ev} = ({od} if b{S} else {ev}) + r{S}_{m}")
                new.append(ev)
            slots = new
            S += 1
        else:
            cross.append(f"{ind}{slots[0]} = xor_add({slots[0]}, {off}, shfl, scratch, tid)")
        off >>= 1
    local = []
    h = W >> 1
    while h > 0:  # position levels W/2 .. 1
        if h >= (1 << S):  # both positions in this lane: slots k and k + h / 2^S
            d = h >> S
            local += [f"{ind}{slots[k]} = {slots[k]} + {slots[k + d]}" for k in range(d)]
        else:  # position bit t = log2(h) was split over lanes at lane offset LL >> (t + 1)
            t = h.bit_length() - 1
            local.append(f"{ind}{slots[0]} = xor_add({slots[0]}, {LL >> (t + 1)}, shfl, scratch, tid)")
        h >>= 1
    assert slots[0] == "v0"
    return cross, local


def _centred_step_src(K, VEC, LL):
    W = K * VEC
    ind = "    "
    leaves = [f"{ind}v{i} = mul_rn(bits_f32(e{i // VEC}[{i % VEC}]), INV_P)" for i in range(W)]
    hk = K >> 1  # unit levels in the thread: v(k VEC + e) += v((k + hk) VEC + e), hk = K/2 .. 1
    while hk > 0:
        leaves += [f"{ind}v{k * VEC + e} = v{k * VEC + e} + v{(k + hk) * VEC + e}" for k in range(hk) for e in range(VEC)]
        hk >>= 1
    cross, local = _lane_levels_src(VEC, LL, ind)
    amax = [f"{ind}a = max(a, abs_i32(f32_bits(bits_f32(e{i // VEC}[{i % VEC}]) - mean)))" for i in range(W)]
    return (_CENTRED_STEP_SRC.replace("LEAVES", "\n".join(leaves)).replace("CROSS", "\n".join(cross) or f"{ind}pass")
            .replace("LOCAL", "\n".join(local) or f"{ind}pass").replace("AMAX", "\n".join(amax))
            .replace("ENCODE", _CENTRED_ENCODE_ONCE))


def stat_chunk_fns(kind, mode, fmt, max_elem, L, K, packed, shfl, stoch):
    """The per-chunk functions of ``lastaxis_stat_groups`` (see make_lastaxis_stat_group_kernel)
    for asymmetric (MODE_ASYM) or centred (MODE_CENTRED) groups of L units, chunks of K units
    over LL = L / K lanes: ``chunk_step`` (a chunk's statistics over the group's lanes, the
    group's parameters, the encode and the stores; ``stoch``: every unit by sr_store_unit, the
    step taking key_lo, key_hi last), ``unit_of`` (a chunk's first unit) and ``ST`` (units
    between a chunk's units). Not cached: the kernel factory (cached itself) builds its own."""
    VEC, NB = vec_of(kind), (fmt[5] if packed else 8)
    assert L & (L - 1) == 0 and 1 <= L <= 32 and L % K == 0 and K in (1, 2, 4)
    assert mode in (MODE_ASYM, MODE_CENTRED)
    LL = L // K
    MAXE = F32(max_elem)
    ST = LL

    @devfn
    def unit_of(c):
        """First unit of chunk c (its others: + k * ST); c >= 0: (c // LL) * L + c % LL,
        without a signed division."""
        return c * K - (c & (LL - 1)) * (K - 1)

    if mode == MODE_ASYM:
        chunk_step = _asym_chunk_step(kind, mode, fmt, VEC, NB, K, LL, MAXE, ST, shfl, stoch, unit_of)
    else:
        chunk_step = _centred_chunk_step(kind, mode, fmt, VEC, NB, L, K, LL, MAXE, ST, shfl, stoch, unit_of)
    return dict(chunk_step=chunk_step, unit_of=unit_of, ST=ST)


def _asym_chunk_step(kind, mode, fmt, VEC, NB, K, LL, MAXE, ST, shfl, stoch, unit_of):
    """stat_chunk_fns' chunk_step of an asymmetric group: its max and min keys over the
    group's lanes (16-bit elements two per instruction), asym_group's scale and zero point,
    the units' codes (``stoch``: by sr_store_unit)."""
    PK = kind != KIND_F32  # 16-bit elements: keys in pairs

    @devfn
    def chunk_ukeys(w0, w1, w2, w3):
        """The 16-bit (max, min) key pairs over a chunk's units w0 .. w{K-1} (unit_ukeys: two
        elements per instruction), for chunk_keys and the packed-stats step."""
        hi2, lo2 = unit_ukeys(w0)
        if K >= 2:
            h1, l1 = unit_ukeys(w1)
            hi2 = u16x2_max(hi2, h1)
            lo2 = u16x2_min(lo2, l1)
        if K >= 4:
            h2, l2 = unit_ukeys(w2)
            h3, l3 = unit_ukeys(w3)
            hi2 = u16x2_max(hi2, u16x2_max(h2, h3))
            lo2 = u16x2_min(lo2, u16x2_min(l2, l3))
        return hi2, lo2

    @devfn
    def chunk_keys(w0, w1, w2, w3, tid, scratch):
        """(max key, ~min key) of an asymmetric chunk's group (units w0 .. w{K-1}) over its LL
        lanes: the units' order-preserving keys (16-bit elements two per instruction where PK:
        unit_ukeys, the same keys as unit_keys), then a butterfly of each (every lane takes part)."""
        if PK:
            hi2, lo2 = chunk_ukeys(w0, w1, w2, w3)
            khi = key(ukey_bits(max(hi2 & np.uint32(0xFFFF), hi2 >> np.uint32(16)), kind))
            nklo = np.int32(~key(ukey_bits(min(lo2 & np.uint32(0xFFFF), lo2 >> np.uint32(16)), kind)))
        else:
            khi, nklo = unit_keys(unit_elems(w0, kind), VEC)
            if K >= 2:
                h1, l1 = unit_keys(unit_elems(w1, kind), VEC)
                khi = max(khi, h1)
                nklo = max(nklo, l1)
            if K >= 4:
                h2, l2 = unit_keys(unit_elems(w2, kind), VEC)
                h3, l3 = unit_keys(unit_elems(w3, kind), VEC)
                khi = max(khi, max(h2, h3))
                nklo = max(nklo, max(l2, l3))
        off = LL >> 1
        while off > 0:
            khi = xor_max(khi, off, shfl, scratch, tid)
            nklo = xor_max(nklo, off, shfl, scratch, tid)
            off >>= 1
        return khi, nklo

    @devfn
    def chunk_asym_group(khi, nklo, chunk, tid, scales, zps):
        """asym_group's (scale, zero point, clean) of a chunk's group from its keys; the group's
        first lane stores the scale and zero point."""
        sv, pz, clean = asym_group(khi, nklo, MAXE)
        if (tid & (LL - 1)) == 0:
            scales[chunk // LL] = sv
            zps[chunk // LL] = pz
        return sv, pz, clean

    if stoch:

        @devfn
        def chunk_step(w0, w1, w2, w3, chunk, nchunks, tid, scratch, c8, c16, c32, scales, zps, means, key_lo, key_hi):
            """The asymmetric chunk under stochastic rounding: the keys (chunk_keys: exact
            values, order-free), asym_group's scale and zero point (asym_params, the
            reference's), every unit by sr_store_unit."""
            khi, nklo = chunk_keys(w0, w1, w2, w3, tid, scratch)
            if chunk < nchunks:
                sv, pz, clean = chunk_asym_group(khi, nklo, chunk, tid, scales, zps)
                u = unit_of(chunk)
                sr_store_unit(unit_elems(w0, kind), u, sv, ZERO, pz, key_lo, key_hi, c8, c16, c32, mode, fmt, VEC, NB)
                if K >= 2:
                    sr_store_unit(unit_elems(w1, kind), u + ST, sv, ZERO, pz, key_lo, key_hi, c8, c16, c32, mode, fmt,
                                  VEC, NB)
                if K >= 4:
                    sr_store_unit(unit_elems(w2, kind), u + 2 * ST, sv, ZERO, pz, key_lo, key_hi, c8, c16, c32, mode,
                                  fmt, VEC, NB)
                    sr_store_unit(unit_elems(w3, kind), u + 3 * ST, sv, ZERO, pz, key_lo, key_hi, c8, c16, c32, mode,
                                  fmt, VEC, NB)
        return chunk_step

    @devfn
    def chunk_step(w0, w1, w2, w3, chunk, nchunks, tid, scratch, c8, c16, c32, scales, zps, means):
        if PK:
            if kind == KIND_BF16:
                mx2, mn2 = unit_bf16_minmax(w0)
                a2 = word_amax16(w0)
                if K >= 2:
                    x1, n1 = unit_bf16_minmax(w1)
                    mx2 = bf16x2_max(mx2, x1)
                    mn2 = bf16x2_min(mn2, n1)
                    a2 = u16x2_max(a2, word_amax16(w1))
                if K >= 4:
                    x2, n2 = unit_bf16_minmax(w2)
                    x3, n3 = unit_bf16_minmax(w3)
                    mx2 = bf16x2_max(mx2, bf16x2_max(x2, x3))
                    mn2 = bf16x2_min(mn2, bf16x2_min(n2, n3))
                    a2 = u16x2_max(a2, u16x2_max(word_amax16(w2), word_amax16(w3)))
                hi2 = word_ukeys(mx2)
                lo2 = word_ukeys(mn2)
                hk = max(hi2 & np.uint32(0xFFFF), hi2 >> np.uint32(16))
                if max(a2 & np.uint32(0xFFFF), a2 >> np.uint32(16)) > np.uint32(0x7F80):
                    hk = np.uint32(0xFFFF)  # a NaN: the max key of a NaN (0x7FFF, sign 0)
            else:
                hi2, lo2 = chunk_ukeys(w0, w1, w2, w3)
                hk = max(hi2 & np.uint32(0xFFFF), hi2 >> np.uint32(16))
            lk = min(lo2 & np.uint32(0xFFFF), lo2 >> np.uint32(16))
            kw = np.uint32(hk | ((np.uint32(0xFFFF) - lk) << np.uint32(16)))  # both maxima in one word
            off = LL >> 1
            while off > 0:
                kw = xor_u16x2_max(kw, off, shfl, scratch, tid)
                off >>= 1
            if chunk < nchunks:
                sv, pz, clean, rr = asym_group_r(ukey_bits(kw & np.uint32(0xFFFF), kind),
                                                 ukey_bits(np.uint32(0xFFFF) - (kw >> np.uint32(16)), kind), MAXE)
                if (tid & (LL - 1)) == 0:
                    scales[chunk // LL] = sv
                    zps[chunk // LL] = pz
                u = unit_of(chunk)
                flo = F32(-pz)
                fhi = F32(np.int32(fmt[7]) - pz)
                asym_unit_store_r(unit_elems(w0, kind), u, sv, rr, pz, flo, fhi, clean, c8, c16, c32, fmt, VEC, NB)
                if K >= 2:
                    asym_unit_store_r(unit_elems(w1, kind), u + ST, sv, rr, pz, flo, fhi, clean, c8, c16, c32, fmt,
                                      VEC, NB)
                if K >= 4:
                    asym_unit_store_r(unit_elems(w2, kind), u + 2 * ST, sv, rr, pz, flo, fhi, clean, c8, c16, c32,
                                      fmt, VEC, NB)
                    asym_unit_store_r(unit_elems(w3, kind), u + 3 * ST, sv, rr, pz, flo, fhi, clean, c8, c16, c32,
                                      fmt, VEC, NB)
            return
        khi, nklo = chunk_keys(w0, w1, w2, w3, tid, scratch)
        if chunk < nchunks:
            sv, pz, clean = chunk_asym_group(khi, nklo, chunk, tid, scales, zps)
            u = unit_of(chunk)
            flo = F32(-pz)  # int -> float conversions and the reciprocal: once per chunk
            fhi = F32(np.int32(fmt[7]) - pz)
            rr = recip_guarded(sv)
            asym_unit_store_r(unit_elems(w0, kind), u, sv, rr, pz, flo, fhi, clean, c8, c16, c32, fmt, VEC, NB)
            if K >= 2:
                asym_unit_store_r(unit_elems(w1, kind), u + ST, sv, rr, pz, flo, fhi, clean, c8, c16, c32, fmt, VEC,
                                  NB)
            if K >= 4:
                asym_unit_store_r(unit_elems(w2, kind), u + 2 * ST, sv, rr, pz, flo, fhi, clean, c8, c16, c32, fmt,
                                  VEC, NB)
                asym_unit_store_r(unit_elems(w3, kind), u + 3 * ST, sv, rr, pz, flo, fhi, clean, c8, c16, c32, fmt,
                                  VEC, NB)

    return chunk_step


def _centred_chunk_step(kind, mode, fmt, VEC, NB, L, K, LL, MAXE, ST, shfl, stoch, unit_of):
    """stat_chunk_fns' chunk_step of a centred group: the generated step (_centred_step_src) of
    its mean by the halving sum, its amax of x - mean, scale and codes (``stoch``: by
    sr_store_unit)."""
    P = L * VEC  # a whole group: the halving sum's padding P is G itself
    glb = dict(globals())
    glb.update(kind=kind, mode=mode, fmt=fmt, VEC=VEC, NB=NB, K=K, LL=LL, MAXE=MAXE, shfl=shfl, ST=ST, unit_of=unit_of,
               INV_P=F32(1.0 / P), FACTOR=F32(np.float32(P) / np.float32(P)))  # fp32(P) / fp32(count)
    src = _centred_step_src(K, VEC, LL)
    if stoch:  # the same mean, scale and layout; the encode by sr_store_unit
        src = sub_once(src, "zps, means):", "zps, means, key_lo, key_hi):")
        src = sub_once(src, _CENTRED_ENCODE_ONCE, _CENTRED_ENCODE_SR)
    # (its W elements written out as named registers: unrolled's note says why)
    step = compile_source(src, f"<nqdq centred_step K={K} VEC={VEC} LL={LL}{' stoch' if stoch else ''}>", glb,
                          "centred_step")
    chunk_step = devfn(step)
    chunk_step.source = src
    return chunk_step


# used by the generated centred step
_ = (mul_rn, centred_params, xor_add, xor_get, abs_i32, bits_f32, f32_bits, FINITE, encode_store_int_unit_r)
