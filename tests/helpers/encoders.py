"""Probe values for the element encoders' and intrinsics' twins (what the simulator runs)
and the compiled ones on a GPU: every finite bfloat16 as 16-byte units, the MX and NVFP4
multipliers, MXFP6's format tuples, MXFP4 values around every code boundary, max.NaN's edges."""

from __future__ import annotations

import numpy as np


# MX e2m1 in bfloat16 pairs (lastaxis.e2m1_unit_bf16: two elements per instruction)
def bf16_finite_units():
    """Every finite bfloat16 bit pattern (zeros padded to whole 8-element units) as words."""
    pats = np.arange(65536, dtype=np.uint32)
    pats = pats[(pats & 0x7F80) != 0x7F80]
    pats = np.concatenate([pats, np.zeros((-pats.size) % 8, np.uint32)])
    return pats, (pats[0::2] | (pats[1::2] << 16)).reshape(-1, 4)


E2M1_PAIR_KS = [-127, -126, -60, -8, -2, -1, 0, 1, 2, 3, 7, 60, 120, 126]  # 2^-k: the MX multiplier
NVFP4_PAIR_MBS = [1.0, 1 + 2**-23, 1 - 2**-24, 3.0, 1 / 3, 0.1, 6 / 448, 448 / 6, 3 * 2.0**-100, 1e30, 3.4e38, 1.5e-45,
                  1.4554425, 14.474881, 147183.44, 0.0037]  # NVFP4 element multipliers m_b (float32)

# MXFP6 (lastaxis.fp6_unit_bf16 / fp6_unit_f32)
FP6 = {"e2m3": (1, 3, 0, 31, -1, 6, 0, 0, 2, 0), "e3m2": (1, 2, -2, 31, -1, 6, 0, 0, 3, 0)}  # format_tuple's
# 2^-k, the MX multiplier: the e8m0 code's whole range where groups are finite (k <= 126:
# the largest float32 amax gives k = 128 - emax at most) and values near the grid (k ~ 0)
FP6_KS = [-127, -126, -60, -8, -4, -2, -1, 0, 1, 2, 3, 5, 7, 60, 120, 126]


# the fused MXFP4 encoder (lastaxis.e2m1_unit_f32_p2)
def e2m1_y_probes(rc):
    """(v, ks) for the fused MXFP4 encoders' checks: v around every e2m1 code boundary (grid
    points, ties, 1-2 float32 ulps off, saturation) and random, both signs, a multiple of 8
    long; for e2m1_unit_f32_p2 without the clamp (``rc``: "rceil" groups) only |v| <= 6.05
    (rceil's |y| * 2^-k <= 6 (1 + 2^-22), saturation by the magic sum alone), and k = 127 too
    (2^-k a bfloat16 subnormal: code 254)."""
    base = np.array([0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6] + ([] if rc else [6.5, 7, 8]),
                    np.float32)
    near = [base]
    for d in (1, 2):
        near += [base + d * np.spacing(base), base - d * np.spacing(base)]
    top = 6.05 if rc else 7.0
    rng = np.random.default_rng(12)
    v = np.concatenate(near + [rng.uniform(0, top, 4000).astype(np.float32), np.float32([top, 6 * (1 + 2**-22)])])
    v = v[np.abs(v) <= top]
    v = np.concatenate([v, -v]).astype(np.float32)
    return v[: v.size // 8 * 8], (-127, -125, -120, -60, -1, 0, 1, 20, 126) + ((127,) if rc else ())


def e2m1_y_case(v, k):
    """(y, want, p2): y = v * 2^k in float32 (non-finite ones 0), the reference codec's codes of
    y * 2^-k, and 2^-k as a bfloat16 pair."""
    from nqdq.formats import get_format
    from nqdq.reference import codec as rcodec

    with np.errstate(over="ignore", under="ignore"):
        y = (v.astype(np.float64) * 2.0**k).astype(np.float32)
        y = np.where(np.isfinite(y), y, np.float32(0))
        want = rcodec.encode_float((y * np.float32(2.0**-k)).astype(np.float32), get_format("e2m1")).astype(np.uint32)
    hb = np.uint32(np.float32(2.0**-k).view(np.uint32) >> np.uint32(16))
    return y, want, np.uint32(hb | (hb << np.uint32(16)))


def e2m1_codes(words):
    """The 8 nibbles of packed e2m1 words, element order."""
    return np.stack([(words >> np.uint32(4 * j)) & np.uint32(15) for j in range(8)], axis=1).reshape(-1)


# float32 values at the edges of max.NaN of magnitudes (nqdq.gpu.ptx.pairs.absmax_nan): signs, zeros,
# subnormals, the largest finite, infinities, NaNs of both signs and another payload
ABSMAX_EDGES = np.array([0.0, -0.0, 1e-45, -3e-39, 1.5, -1.5, 6.0, -7.0, 3.4e38, np.inf, -np.inf, np.nan, -np.nan],
                        np.float32).view(np.uint32)
ABSMAX_EDGES = np.append(ABSMAX_EDGES, np.uint32(0xFF812345))
