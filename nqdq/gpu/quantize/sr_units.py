"""Stochastic rounding of a 16-byte unit (``rounding="stochastic"``): its elements' Philox
bits, encode_element with them (``sr_store_unit``), and the shorter encodes of clean units
that give the same codes (``sr_store_unit_r``).
"""

from __future__ import annotations

import numpy as np

from ..device.codec import (
    E2M1_SR_I_KEY, E2M1_SR_MIN_BITS, ZERO, bits_f32, encode_int_f32, f32_bits, philox4x32_10, sr_e2m1_code_f,
    sr_e2m1_code_i, sr_fast_key_bound, sr_float_code_fast,
)
from ..device.division import div_by_recip
from ..device.elements import encode_element
from ..device.scales import MODE_FLOAT, MODE_MX, MODE_NVFP4
from ..runtime.target import devfn
from .reductions import abs_i32
from .units import FINITE, pack4, store_packed


# ---- stochastic rounding (``rounding="stochastic"``). Every factory below takes ``stoch``, a
# compile-time switch: False (the default) generates the RNE kernel exactly as before; True the
# same kernel -- loads, layout, statistics, group parameters and scales (never rounded
# stochastically, so the RNE kernel's bits) and stores -- whose per-unit encode is
# sr_store_unit, and which takes two more arguments, key_lo and key_hi (the seed's halves).
# Element i (its C-order linear index) takes word i % 4 of the Philox4x32-10 block at counter
# i // 4 (reference/rng.random_bits). A 16-byte unit u holds elements u * VEC .. u * VEC + VEC - 1
# and VEC is 4 or 8, so its random bits are whole Philox blocks, u or 2u and 2u + 1, whatever
# thread or launch geometry holds the unit. The encode is encode_element's with stoch=True (the
# general kernels' encoder, every NaN rule included): the finite-group shortcuts above are
# round-to-nearest only, and a float scale keeps the IEEE x / s (div.rn) -- the reciprocal
# division (device.division) equals it only where |x / s| >= 2^-125 and |x| >= 2^-102; below, its
# quotient is only known to be tiny and of x's sign, which round-to-nearest maps to the same zero
# code but which would move a stochastic rounding's threshold.
@devfn
def unit_random_words(unit, vec, key_lo, key_hi):
    """The 32 random bits of each element of 16-byte unit ``unit`` (element unit * vec + j
    takes r_j): Philox block ``unit`` for a float32 unit (vec = 4; r4 .. r7 are 0), blocks
    2 unit and 2 unit + 1 for a 16-bit one (vec = 8)."""
    b = np.int64(unit)
    if vec == 4:
        r0, r1, r2, r3 = philox4x32_10(b & 0xFFFFFFFF, b >> 32, key_lo, key_hi)
        z = np.int64(0)
        return r0, r1, r2, r3, z, z, z, z
    b = b * 2
    r0, r1, r2, r3 = philox4x32_10(b & 0xFFFFFFFF, b >> 32, key_lo, key_hi)
    b = b + 1
    r4, r5, r6, r7 = philox4x32_10(b & 0xFFFFFFFF, b >> 32, key_lo, key_hi)
    return r0, r1, r2, r3, r4, r5, r6, r7


@devfn
def sr_enc(xb, p0, p1, pz, mode, fmt, r, mask):
    """The stochastically rounded code of the element with float32 bits ``xb`` and random
    bits ``r`` in a group with parameters (p0, p1, pz) (group_params'; centred: p1 = mean)."""
    return np.uint32(encode_element(bits_f32(xb), p0, p1, pz, mode, fmt, True, r, False) & mask)


@devfn
def sr_store_unit(e, unit, p0, p1, pz, key_lo, key_hi, c8, c16, c32, mode, fmt, vec, nb):
    """encode_store_unit under stochastic rounding: the unit's elements (float32 bits ``e``)
    encoded with their Philox bits (unit_random_words) and stored as store_packed does."""
    r = unit_random_words(unit, vec, key_lo, key_hi)
    m = (1 << nb) - 1
    lo = pack4(sr_enc(e[0], p0, p1, pz, mode, fmt, r[0], m), sr_enc(e[1], p0, p1, pz, mode, fmt, r[1], m),
               sr_enc(e[2], p0, p1, pz, mode, fmt, r[2], m), sr_enc(e[3], p0, p1, pz, mode, fmt, r[3], m), nb)
    hi = np.uint32(0)
    if vec == 8:
        hi = pack4(sr_enc(e[4], p0, p1, pz, mode, fmt, r[4], m), sr_enc(e[5], p0, p1, pz, mode, fmt, r[5], m),
                   sr_enc(e[6], p0, p1, pz, mode, fmt, r[6], m), sr_enc(e[7], p0, p1, pz, mode, fmt, r[7], m), nb)
    store_packed(lo, hi, unit, c8, c16, c32, vec, nb)


# ---- stochastic rounding of a clean unit, the short way. sr_store_unit runs encode_element per
# element: an IEEE division (ten instructions and a slow-path branch) and encode_float_sr32,
# whose normal-range shortcut and subnormal block are two branches per element. For a unit of
# a finite group under a float scale with a reciprocal (r != 0), an MX power of two or an NVFP4
# multiplier, sr_store_unit_r takes instead, for every element without a branch:
#   q = x / s by div_by_recip (three instructions), or x * multiplier (the reference's product);
#   the code by sr_float_code_fast (float formats; formats of at most SR_SUB_BITS bits with its
#   branch-free subnormal range, where much of a group lies) or encode_int_f32 (integers);
# then checks the unit once: every code's key passes sr_fast_key_bound, and (float scales) every
# |x| is 0 or at least max(2^-102, s * 2^-124), where div_by_recip is RN(x / s) bit for bit
# (device.division: |x| >= 2^-102 and |x / s| >= 2^-125 hold there, and +-0 is exact; |x| < s * 2^64 holds
# for a dynamic scale's group and is part of ``clean`` for a caller-given one). A unit that fails
# is encoded again by sr_store_unit (its Philox bits are recomputed: rare). The same codes bit
# for bit as sr_store_unit (tests/test_sr_encoder.py, tests/test_stochastic_lastaxis.py).
# H100, bf16 8192x8192, against sr_store_unit for every unit: fp8_row SR 172.9 -> 146.0 us,
# mxfp6_e2m3 201.2 -> 163.1, mxfp8 150.3 -> 140.2 (with Philox's wide multiplies).
SR_SUB_BITS = 6  # e2m3, e3m2: sr_float_code_fast's subnormal range (fp8's subnormals are rare)
# e2m1 (MXFP4, NVFP4) does not take this short encode: H100, bf16 8192x8192, with its branch-free
# subnormal range it took mxfp4 SR from 199.0 to 239.0 us and nvfp4 from 280.7 to 287.9 (about a
# third of an e2m1 group lies below its normal range, [0.5, 1) of 6); e2m1 has its own integer
# encode (sr_unit_e2m1_i, below)
SR_FAST_MIN_FLOAT_BITS = 6
TINY_X_BITS = 0x0C800000  # 2^-102
S_TINY_SHIFT = 124 << 23  # s * 2^-124 on the bits (s >= 2^-80 under recip_guarded: may underflow, then 2^-102 rules)
# The stochastic row and group kernels have no launch bound: H100, bf16 8192x8192, 5 blocks per
# SM (fp8_row 62 -> 56 registers) measured mixed (fp8_row 156.0 -> 154.1 us, mxfp4 198.9 -> 203.0).


@devfn
def sr_fast_code(xb, p0, r, mode, fmt, rw, mask):
    """(code, key) of the element with float32 bits ``xb`` and random bits ``rw`` in a clean
    unit (see above): the key is sr_float_code_fast's (integers: always valid)."""
    x = bits_f32(xb)
    q = div_by_recip(x, p0, r) if mode == MODE_FLOAT else x * p0
    if fmt[0] == 1:
        c, k = sr_float_code_fast(f32_bits(q), fmt[1], fmt[2], fmt[3], fmt[5], rw, fmt[5] <= SR_SUB_BITS)
        return np.uint32(c & np.uint32(mask)), k
    return np.uint32(encode_int_f32(q, fmt[6], fmt[7], True, rw) & mask), np.uint32(0xFFFFFFFF)


@devfn
def x_key(xb):
    """|x|'s bits less 1 as uint32 (x = +-0: 2^32 - 1): a unit's min of these is at least
    T - 1 iff every |x| is 0 or >= T."""
    return np.uint32(np.int64(np.uint32(xb) & np.uint32(0x7FFFFFFF)) - 1)


@devfn
def sr_unit_fast(e, unit, p0, r, key_lo, key_hi, mode, fmt, vec, nb):
    """(lo, hi, ok): the unit's codes packed as store_packed takes them, and whether they are
    sr_store_unit's (every key passes; float scales: every |x| in div_by_recip's range)."""
    rw = unit_random_words(unit, vec, key_lo, key_hi)
    m = (1 << nb) - 1
    c0, k0 = sr_fast_code(e[0], p0, r, mode, fmt, rw[0], m)
    c1, k1 = sr_fast_code(e[1], p0, r, mode, fmt, rw[1], m)
    c2, k2 = sr_fast_code(e[2], p0, r, mode, fmt, rw[2], m)
    c3, k3 = sr_fast_code(e[3], p0, r, mode, fmt, rw[3], m)
    lo = pack4(c0, c1, c2, c3, nb)
    kmin = min(min(k0, k1), min(k2, k3))
    xmin = min(min(x_key(e[0]), x_key(e[1])), min(x_key(e[2]), x_key(e[3])))
    hi = np.uint32(0)
    if vec == 8:
        c4, k4 = sr_fast_code(e[4], p0, r, mode, fmt, rw[4], m)
        c5, k5 = sr_fast_code(e[5], p0, r, mode, fmt, rw[5], m)
        c6, k6 = sr_fast_code(e[6], p0, r, mode, fmt, rw[6], m)
        c7, k7 = sr_fast_code(e[7], p0, r, mode, fmt, rw[7], m)
        hi = pack4(c4, c5, c6, c7, nb)
        kmin = min(kmin, min(min(k4, k5), min(k6, k7)))
        xmin = min(xmin, min(min(x_key(e[4]), x_key(e[5])), min(x_key(e[6]), x_key(e[7]))))
    ok = True
    if fmt[0] == 1:
        ok = kmin >= np.uint32(sr_fast_key_bound(fmt[1], fmt[2], fmt[5] <= SR_SUB_BITS))
    if mode == MODE_FLOAT:
        tb = max(np.int32(TINY_X_BITS), np.int32(np.int32(f32_bits(p0)) - np.int32(S_TINY_SHIFT)))
        ok = ok and xmin >= np.uint32(tb - 1)
    return lo, hi, ok


# MX e2m1 of 16-bit input (mxfp4 of bf16 / f16), clean groups: sr_e2m1_code_f's float form of
# the rule (its steps are powers of two and q = x * 2^-k keeps at most 11 significant bits), kept
# where every |q| is 0 or >= 2^-14; mostly FMA-pipe work where encode_float_sr32's integer carry
# and its subnormal block (about a third of an e2m1 group) fill the ALU pipe (H200, bf16
# 8192x8192: mxfp4 SR 200.6 -> 156.0 us against sr_store_unit). Tried after the integer encode
# below (sr_store_unit_r), which is faster where it holds (H100, bf16 8192x8192, mxfp4 SR
# 145.2 -> 134.5 us, docs/design/stochastic-rounding.md).


@devfn
def sr_unit_e2m1(e, unit, p0, key_lo, key_hi, nb):
    """(lo, hi, ok): the codes of an 8-element unit of a clean MX e2m1 group (multiplier p0 =
    2^-k), packed as store_packed takes them, and whether sr_e2m1_code_f holds for all."""
    rw = unit_random_words(unit, 8, key_lo, key_hi)
    c0, k0 = sr_e2m1_code_f(bits_f32(e[0]) * p0, rw[0])
    c1, k1 = sr_e2m1_code_f(bits_f32(e[1]) * p0, rw[1])
    c2, k2 = sr_e2m1_code_f(bits_f32(e[2]) * p0, rw[2])
    c3, k3 = sr_e2m1_code_f(bits_f32(e[3]) * p0, rw[3])
    c4, k4 = sr_e2m1_code_f(bits_f32(e[4]) * p0, rw[4])
    c5, k5 = sr_e2m1_code_f(bits_f32(e[5]) * p0, rw[5])
    c6, k6 = sr_e2m1_code_f(bits_f32(e[6]) * p0, rw[6])
    c7, k7 = sr_e2m1_code_f(bits_f32(e[7]) * p0, rw[7])
    kmin = min(min(min(k0, k1), min(k2, k3)), min(min(k4, k5), min(k6, k7)))
    ok = kmin >= np.uint32(E2M1_SR_MIN_BITS - 1)
    return pack4(c0, c1, c2, c3, nb), pack4(c4, c5, c6, c7, nb), ok


# MX e2m1 and NVFP4, clean groups, any input kind: sr_e2m1_code_i's integer form of the rule
# (one IMAD.WIDE.U32 an element, no branch), kept where every |q| is 0, below 2^-33 or at
# least 2^-10; q = |x| * p0 (the sign is x's: p0 > 0). H100, bf16 8192x8192
# (docs/design/stochastic-rounding.md): nvfp4 SR 265.0 -> 191 us, mxfp4 SR 145.2 -> 134.5.


@devfn
def e2m1_sr_i(xb, p0, rw):
    """(code, key) of the element with float32 bits ``xb`` times p0 > 0 (sr_e2m1_code_i)."""
    return sr_e2m1_code_i(f32_bits(abs(bits_f32(xb)) * p0), rw, xb)


@devfn
def sr_unit_e2m1_i(e, unit, p0, key_lo, key_hi, vec, nb):
    """(lo, hi, ok): the e2m1 codes of a unit of a clean MX / NVFP4 group (multiplier p0),
    packed as store_packed takes them, and whether sr_e2m1_code_i holds for all."""
    rw = unit_random_words(unit, vec, key_lo, key_hi)
    c0, k0 = e2m1_sr_i(e[0], p0, rw[0])
    c1, k1 = e2m1_sr_i(e[1], p0, rw[1])
    c2, k2 = e2m1_sr_i(e[2], p0, rw[2])
    c3, k3 = e2m1_sr_i(e[3], p0, rw[3])
    kmin = min(min(k0, k1), min(k2, k3))
    hi = np.uint32(0)
    if vec == 8:
        c4, k4 = e2m1_sr_i(e[4], p0, rw[4])
        c5, k5 = e2m1_sr_i(e[5], p0, rw[5])
        c6, k6 = e2m1_sr_i(e[6], p0, rw[6])
        c7, k7 = e2m1_sr_i(e[7], p0, rw[7])
        hi = pack4(c4, c5, c6, c7, nb)
        kmin = min(kmin, min(min(k4, k5), min(k6, k7)))
    return pack4(c0, c1, c2, c3, nb), hi, kmin >= np.uint32(E2M1_SR_I_KEY)


@devfn
def sr_store_unit_r(e, unit, p0, r, clean, key_lo, key_hi, c8, c16, c32, mode, fmt, vec, nb):
    """sr_store_unit of a unit with its group's parameter p0 and, for a float scale, r =
    recip_guarded(p0) (else unused): ``clean`` (a finite group; a caller-given scale: finite,
    non-zero, ratio_ok) units under a float scale with r != 0, an MX scale or a finite NVFP4
    multiplier take sr_unit_fast, and keep its codes where it says they hold."""
    e2m1 = fmt[0] == 1 and fmt[5] == 4 and fmt[1] == 1 and fmt[3] == 7  # (constants: folded)
    if clean and e2m1 and (
            mode == MODE_MX or (mode == MODE_NVFP4 and abs_i32(f32_bits(p0)) < FINITE)):
        lo, hi, ok = sr_unit_e2m1_i(e, unit, p0, key_lo, key_hi, vec, nb)
        if ok:
            store_packed(lo, hi, unit, c8, c16, c32, vec, nb)
            return
    if (fmt[0] == 0 or fmt[5] >= SR_FAST_MIN_FLOAT_BITS) and clean and (
            mode == MODE_MX or (mode == MODE_NVFP4 and abs_i32(f32_bits(p0)) < FINITE)
            or (mode == MODE_FLOAT and r != ZERO)):
        lo, hi, ok = sr_unit_fast(e, unit, p0, r, key_lo, key_hi, mode, fmt, vec, nb)
        if ok:
            store_packed(lo, hi, unit, c8, c16, c32, vec, nb)
            return
    if clean and mode == MODE_MX and vec == 8 and e2m1:
        lo, hi, ok = sr_unit_e2m1(e, unit, p0, key_lo, key_hi, nb)
        if ok:
            store_packed(lo, hi, unit, c8, c16, c32, vec, nb)
            return
    sr_store_unit(e, unit, p0, ZERO, 0, key_lo, key_hi, c8, c16, c32, mode, fmt, vec, nb)
