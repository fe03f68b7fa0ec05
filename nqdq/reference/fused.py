"""Fused ops, the spec: RMSNorm (optionally after a residual add), flatten, and the MoE sort,
each followed by the existing quantizer (``nqdq.reference.quantize``). The kernels in
``nqdq.gpu.fused.plan`` do the same in one pass and must give the same bits.

RMSNorm, the order that is the spec (one IEEE rounding per operation, no FMA where it would
change a bit, written as the kernel performs it)::

    h      = x                                   (no residual)
    h      = dtype(fl32(x + residual))           (residual: the new residual, NaN canonical)
    S      = row_sum_sq(h)                       float64 sum of the exact squares h*h
    (s_hi, s_lo) = (fl32(S), fl32(S - s_hi))     float-float; s_lo = 0 where s_hi is inf or NaN
    m      = S / n                               float-float quotient
    a      = m + eps                             float-float
    r      = 1 / sqrt(a)                         float-float (r1, r2), Dekker's algorithms
    y      = fl32(h * w * r)                     see :func:`normalize`; NaN -> 0x7FC00000

Why this precision: a plain float32 sum of n squares can be log2(n) ulps off, and
y = (h*r)*w rounds twice; together they miss the issue's bound (y within 1 float32 ulp of a
float64 evaluation) on ordinary data. The square of a bfloat16, float16 or float32 value is
exact in float64 (at most 48 significant bits, no overflow or underflow), so S is the exact
sum rounded once per addition to 53 bits (relative error below n * 2^-53), carried on as
the float-float pair (s_hi, s_lo) (about 48 bits), and forming h*w*r with a single final
rounding keeps y within 0.5 ulp + 2^-28 relative of the exact value for rows whose products
neither overflow nor underflow float32 (|h|, |w| within about 2^-60..2^60); outside that
range the bits are still exactly specified here, only the accuracy bound does not hold.
(An earlier S, a float-float sum of float32 squares, had the same bound but took some 8
instructions an element on the GPU where float64 takes 3: docs/design/fused.md.)

The sum's order (:func:`row_sum64`) is that of the kernel's thread layout, which is a
function of the row length n only (:func:`row_geometry`, never of a launch): the row is cut
into units of UNIT = 8 consecutive elements (16 bytes of a 16-bit input), padded with
zero units to NT * U units, NT = 32 * NW threads of U units each; thread t = 32 * w + l
(warp w, lane l) holds units t, t + NT, ..., t + NT * (U - 1). Then, every addition a
float64 one (fl64):

1. within a unit: its elements in order, t = h_0^2, t = fl64(t + h_i^2), i = 1..7 (h_i^2
   exact, so a fused multiply-add gives the same bits);
2. within a thread: its units in order, acc = unit 0, acc = fl64(acc + unit j), j = 1..U-1;
3. within a warp: the halving tree over its 32 lanes (l with l + 16, ..., l with l + 1);
4. across warps: in order, acc = warp 0, acc = fl64(acc + warp w), w = 1..NW-1.

On the GPU, step 3 is a butterfly of warp shuffles (lane l adds lane l ^ k's sum): both
lanes of a pair add the same two operands, once as (a, b) and once as (b, a), and fl64(a + b)
is commutative, so every lane ends with the tree's value. Padding adds +0, which changes no
bit (no -0 ever appears in a sum of squares).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..schemes import Scheme
from . import quantize as ref
from . import codec

__all__ = [
    "two_sum", "split", "two_prod", "rsqrt_mean", "normalize",
    "row_geometry", "row_sum64", "row_sum_sq", "add_residual", "rmsnorm", "rmsnorm_quantize", "flatten_quantize", "moe_sort", "moe_sort_quantize",
    "SIG_BITS", "R_SPLIT_MIN_BITS", "UNIT", "MAX_UNITS_PER_THREAD", "MAX_ROW",
]

F32 = np.float32
BF16 = np.dtype(ml_dtypes.bfloat16)
SPLITTER = F32(4097.0)  # 2^12 + 1: Veltkamp's constant for 24-bit significands
ONE = F32(1.0)
CANON_NAN = F32(np.nan)  # bits 0x7FC00000

# significant bits of each input dtype (h and w are exact float32 values of these)
SIG_BITS = {"bfloat16": 8, "float16": 11, "float32": 24}
# normalize() multiplies by a truncated r_hi of 24 - bits(h) - bits(w) bits when that is
# at least this many (see normalize)
R_SPLIT_MIN_BITS = 5

UNIT = 8  # elements per unit of the sum's order (16 bytes of a 16-bit row)
WARP = 32
MAX_UNITS_PER_THREAD = 8  # U <= this; warps are added until it holds (at most 32)
MAX_ROW = UNIT * WARP * 32 * MAX_UNITS_PER_THREAD  # 65536 elements: the longest row the kernels hold


# ----------------------------------------------------------------------------- error-free ops
def two_sum(a, b):
    """(s, e) with s = fl(a + b) and s + e == a + b exactly (Knuth; any |a|, |b|)."""
    s = (a + b).astype(F32) if isinstance(a, np.ndarray) else F32(a + b)
    bb = F32(s - a)
    e = F32(F32(a - F32(s - bb)) + F32(b - bb))
    return s, e


def split(a):
    """Veltkamp: a == hi + lo exactly, hi and lo with at most 12 significant bits each."""
    c = F32(SPLITTER * a)
    hi = F32(c - F32(c - a))
    return hi, F32(a - hi)


def two_prod(a, b, p=None):
    """(p, e) with p = fl(a * b) and p + e == a * b exactly (Dekker, no FMA), barring
    overflow and underflow."""
    if p is None:
        p = F32(a * b)
    ah, al = split(a)
    bh, bl = split(b)
    e = F32(F32(F32(F32(F32(ah * bh) - p) + F32(ah * bl)) + F32(al * bh)) + F32(al * bl))
    return p, e


def row_geometry(n: int) -> tuple[int, int]:
    """(NW warps, U units per thread) of the sum's order for rows of n elements: the fewest
    warps (<= 32) that hold ceil(n / UNIT) units at <= MAX_UNITS_PER_THREAD units per lane,
    then the fewest units per lane (7168 -> (4, 7); 5120 -> (3, 7); 2880 -> (2, 6)). Rows
    longer than MAX_ROW (which the kernels refuse) keep 32 warps and take more units."""
    nu = max(1, -(-n // UNIT))
    nw = min(32, -(-nu // (WARP * MAX_UNITS_PER_THREAD)))
    return nw, -(-nu // (WARP * nw))


def row_sum64(h32):
    """The float64 sum S of the squares of the float32 rows ``h32`` over the last axis in the
    kernel's order (module docstring, steps 1-4; the layout from :func:`row_geometry` of the
    last axis' length), shape [..., 1]."""
    h = np.asarray(h32, F32)
    n = h.shape[-1]
    nw, u = row_geometry(n)
    nt = WARP * nw
    d = np.zeros(h.shape[:-1] + (UNIT * nt * u,), np.float64)
    d[..., :n] = h
    d = d.reshape(h.shape[:-1] + (u, nw, WARP, UNIT))
    sq = d * d  # exact: at most 48 significant bits, far inside float64's exponent range
    with np.errstate(over="ignore", invalid="ignore"):
        t = sq[..., 0]
        for i in range(1, UNIT):  # 1. a unit's elements in order -> [..., u, nw, 32]
            t = t + sq[..., i]
        acc = t[..., 0, :, :]
        for j in range(1, u):  # 2. a thread's units in order -> [..., nw, 32]
            acc = acc + t[..., j, :, :]
        k = WARP // 2
        while k:  # 3. the lanes' halving tree -> [..., nw, 1]
            acc = acc[..., :k] + acc[..., k:2 * k]
            k //= 2
        s = acc[..., 0, :]
        for w in range(1, nw):  # 4. the warps in order
            s = s + acc[..., w, :]
    return s


def row_sum_sq(h32):
    """(s_hi, s_lo): :func:`row_sum64`'s S as the float32 pair fl32(S), fl32(S - fl32(S))
    (the low part 0 where the high part is inf or NaN), each of shape [..., 1]."""
    s = row_sum64(h32)
    with np.errstate(over="ignore", invalid="ignore"):
        hi = s.astype(F32)
        lo = np.where(np.isfinite(hi), (s - hi.astype(np.float64)).astype(F32), F32(0)).astype(F32)
    return hi, lo


def rsqrt_mean(s_hi, s_lo, n: int, eps):
    """(r1, r2) ~ 1 / sqrt((s_hi + s_lo) / n + eps) in float-float, in this exact order
    (the kernel's ``rsqrt_mean`` does the same float32 operations)."""
    nf = F32(n)
    epsf = F32(eps)
    with np.errstate(all="ignore"):
        h, l = two_sum(s_hi, s_lo)
        q1 = F32(h / nf)
        p, pe = two_prod(q1, nf)
        q2 = F32(F32(F32(F32(h - p) - pe) + l) / nf)
        m1, m2 = two_sum(q1, q2)
        a1, a2 = two_sum(m1, epsf)
        a1, a2 = two_sum(a1, F32(a2 + m2))
        s1 = np.sqrt(a1).astype(F32)
        p, pe = two_prod(s1, s1)
        s2 = F32(F32(F32(F32(a1 - p) - pe) + a2) / F32(s1 + s1))
        s1, s2 = two_sum(s1, s2)
        r1 = F32(ONE / s1)
        p, pe = two_prod(s1, r1)
        r2 = F32(F32(F32(F32(ONE - p) - pe) - F32(s2 * r1)) * r1)
        return two_sum(r1, r2)


def r_split(r1, r2, k: int):
    """r1 truncated to k significant bits (exact, by masking), and the rest (r1 - r_hi) + r2."""
    mask = np.uint32((0xFFFFFFFF << (24 - k)) & 0xFFFFFFFF)
    r_hi = (np.asarray(r1, F32).view(np.uint32) & mask).view(F32)
    with np.errstate(invalid="ignore"):
        return r_hi, (F32(r1 - r_hi) + r2).astype(F32)


def normalize(h, w, r1, r2, xbits: int, wbits: int):
    """y = fl32(h * w * r) with one final rounding, r = r1 + r2 (per row, broadcast).

    * xbits + wbits <= 24 - R_SPLIT_MIN_BITS (bfloat16 x bfloat16, bfloat16 x float16):
      a = h*w is exact; r_hi = r1 cut to k = 24 - xbits - wbits bits makes A = a*r_hi exact
      too; y = A + a*r_lo with r_lo = (r1 - r_hi) + r2, |r_lo| < 2^-k+1 r, so the one
      rounded product a*r_lo adds at most 2^-(24+k-1) relative before y's own rounding.
    * otherwise: (p, p_lo) = two_prod(h, w) (p_lo = 0 when xbits + wbits <= 24: the product
      is exact and the term is left out), t = fl(p*r1) with its exact error e, and
      y = t + (e + (p*r2 [+ p_lo*r1])).
    """
    h, w = np.asarray(h, F32), np.asarray(w, F32)
    with np.errstate(all="ignore"):
        k = 24 - xbits - wbits
        if k >= R_SPLIT_MIN_BITS:
            r_hi, r_lo = r_split(r1, r2, k)
            a = (h * w).astype(F32)
            y = ((a * r_hi).astype(F32) + (a * r_lo).astype(F32)).astype(F32)
        else:
            if xbits + wbits <= 24:
                p = (h * w).astype(F32)
                t, e = two_prod(p, r1)
                c = (p * r2).astype(F32)
            else:
                p, plo = two_prod(h, w)
                t, e = two_prod(p, r1)
                c = ((p * r2).astype(F32) + (plo * r1).astype(F32)).astype(F32)
            y = (t + (e + c).astype(F32)).astype(F32)
    return np.where(np.isnan(y), CANON_NAN, y).astype(F32)


# ----------------------------------------------------------------------------- RMSNorm
def round_to_dtype(v32, dtype_name: str) -> np.ndarray:
    """float32 values rounded (nearest even) to ``dtype_name``, as that dtype."""
    if dtype_name == "float32":
        return v32.astype(F32)
    if dtype_name == "bfloat16":
        return v32.astype(BF16)
    return v32.astype(np.float16)


def add_residual(x32, res32, dtype_name: str):
    """The new residual fl32(x + residual) (NaN canonical) rounded to the input dtype."""
    with np.errstate(all="ignore"):
        h = (x32 + res32).astype(F32)
    h = np.where(np.isnan(h), CANON_NAN, h).astype(F32)
    return round_to_dtype(h, dtype_name)


def rmsnorm(x32, w32, eps, dtype_name: str, wdtype_name: str):
    """RMSNorm of float32 rows ``x32`` (exact values of ``dtype_name``) over the last axis:
    float32 y, in the order of the module docstring. Rows are independent: they are taken
    about ``codec.CHUNK`` elements at a time, so that the float64 and float-float temporaries
    stay in the CPU's caches (the same values)."""
    x32 = np.asarray(x32, F32)
    n = x32.shape[-1]
    xbits, wbits = SIG_BITS[dtype_name], SIG_BITS[wdtype_name]

    def rows(h):
        s_hi, s_lo = row_sum_sq(h)
        r1, r2 = rsqrt_mean(s_hi, s_lo, n, eps)
        return normalize(h, w32, r1, r2, xbits, wbits)

    step = max(1, codec.CHUNK // max(n, 1))
    nrows = x32.size // n if n else 0
    if nrows <= step:
        return rows(x32)
    codec.settle_allocator()
    flat = x32.reshape(nrows, n)
    y = np.empty(flat.shape, F32)
    for i in range(0, flat.shape[0], step):
        y[i : i + step] = rows(flat[i : i + step])
    return y.reshape(x32.shape)


def rmsnorm_quantize(x32, w32, sch: Scheme, eps, dtype_name, wdtype_name, *, res32=None, scale=None):
    """Quantized rmsnorm(x [+ residual]): (QuantParts with unpacked codes, new residual or None)."""
    new_res = None
    h = x32
    if res32 is not None:
        new_res = add_residual(x32, res32, dtype_name)
        h = new_res.astype(F32)
    y = rmsnorm(h, w32, eps, dtype_name, wdtype_name)
    return ref.quantize(y, sch, scale=scale), new_res


def flatten_quantize(x32, sch: Scheme):
    """[B, H, D] -> [B, H*D] (C order of the logical indices), then quantize."""
    b, hh, d = x32.shape
    return ref.quantize(np.ascontiguousarray(x32).reshape(b, hh * d), sch)


# ----------------------------------------------------------------------------- MoE sort
def moe_sort(expert_ids: np.ndarray, num_experts: int):
    """Stable expert-major order of the (token, slot) pairs of ``expert_ids`` [T, k]: sorted
    by expert id, then token, then slot. Returns (perm [T*k] int32: source token of each
    sorted row, offsets [E+1] int32: rows of expert e are offsets[e]:offsets[e+1])."""
    ids = np.asarray(expert_ids).astype(np.int64)
    t, k = ids.shape
    flat = ids.reshape(-1)  # pair index t*k + j: token-major, then slot
    order = np.argsort(flat, kind="stable")
    perm = (order // k).astype(np.int32)
    counts = np.bincount(flat, minlength=num_experts)
    offsets = np.zeros(num_experts + 1, np.int32)
    offsets[1:] = np.cumsum(counts)
    return perm, offsets


def moe_sort_quantize(x32, expert_ids, num_experts: int, sch: Scheme):
    """Rows of ``x32`` [T, H] gathered in :func:`moe_sort` order, quantized:
    (QuantParts for [T*k, H], perm, offsets)."""
    perm, offsets = moe_sort(expert_ids, num_experts)
    return ref.quantize(x32[perm], sch), perm, offsets
