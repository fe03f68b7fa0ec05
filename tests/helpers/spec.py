"""Format spec cards written out independently of ``nqdq.formats``, an exact float64
rounding oracle, SQNR, and a microxcaling-style mismatch report.

Nothing here calls nqdq: these are the *expected* side of the tests.
"""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np

# name -> (exponent bits, mantissa bits, NaN/inf style, ml_dtypes type), from the spec cards:
#   e4m3fn: OCP FP8, bias 7, no inf, NaN = S.1111.111            (max 448)
#   e5m2:   OCP FP8, bias 15, IEEE inf = S.11111.00, NaN S.11111.xx (max 57344)
#   e2m3:   OCP MX FP6, bias 1, no inf/NaN                         (max 7.5)
#   e3m2:   OCP MX FP6, bias 3, no inf/NaN                         (max 28)
#   e2m1:   OCP MX FP4, bias 1, no inf/NaN                         (max 6)
SPEC = {
    "e4m3": (4, 3, "all_ones", ml_dtypes.float8_e4m3fn),
    "e5m2": (5, 2, "ieee", ml_dtypes.float8_e5m2),
    "e2m3": (2, 3, "none", ml_dtypes.float6_e2m3fn),
    "e3m2": (3, 2, "none", ml_dtypes.float6_e3m2fn),
    "e2m1": (2, 1, "none", ml_dtypes.float4_e2m1fn),
}
FLOAT_FORMATS = tuple(SPEC)

# Largest finite magnitude and its code, written by hand from the cards above.
MAX_VALUE = {"e4m3": 448.0, "e5m2": 57344.0, "e2m3": 7.5, "e3m2": 28.0, "e2m1": 6.0}
MAX_CODE = {"e4m3": 0x7E, "e5m2": 0x7B, "e2m3": 0x1F, "e3m2": 0x1F, "e2m1": 0x7}


def bits(name: str) -> int:
    e, m, _, _ = SPEC[name]
    return 1 + e + m


def bias(name: str) -> int:
    return (1 << (SPEC[name][0] - 1)) - 1


def emin(name: str) -> int:
    return 1 - bias(name)


def emax(name: str) -> int:
    """Unbiased exponent of the largest finite value."""
    return int(np.floor(np.log2(MAX_VALUE[name])))


def code_values(name: str) -> np.ndarray:
    """float64 value of every code (index = code), straight from the bit-field definition."""
    e_bits, m_bits, nan, _ = SPEC[name]
    n = 1 << bits(name)
    out = np.empty(n)
    for c in range(n):
        s = c >> (e_bits + m_bits)
        ef = (c >> m_bits) & ((1 << e_bits) - 1)
        man = c & ((1 << m_bits) - 1)
        if ef == 0:
            v = man * 2.0 ** (1 - bias(name) - m_bits)
        else:
            v = (1 + man / 2**m_bits) * 2.0 ** (ef - bias(name))
        top = ef == (1 << e_bits) - 1
        if nan == "ieee" and top:
            v = np.inf if man == 0 else np.nan
        elif nan == "all_ones" and top and man == (1 << m_bits) - 1:
            v = np.nan
        out[c] = -v if s else v
    return out


def oracle_encode(x, name: str, *, saturate: bool) -> np.ndarray:
    """Round-to-nearest-even codes of *finite* ``x`` (any float dtype), computed exactly in
    float64: with ``e = max(floor(log2|x|), emin)`` and ``ulp = 2^(e - M)``, ``|x| / ulp`` is
    exact (a power-of-two scaling), ``np.rint`` rounds it to the nearest even integer (whose
    parity is the parity of the code's last mantissa bit), and the result times ``ulp`` is
    looked up in the code table. A result above max overflows: +-max when saturating,
    otherwise inf (e5m2), NaN (e4m3fn) or max (formats without either: ml_dtypes saturates).
    """
    x = np.asarray(x, np.float64)
    assert np.isfinite(x).all()
    e_bits, m_bits, nan, _ = SPEC[name]
    table = code_values(name)
    n_pos = 1 << (e_bits + m_bits)
    mags = table[:n_pos]
    finite_mags = mags[: MAX_CODE[name] + 1]
    a = np.abs(x)
    _, E = np.frexp(a)  # a = f * 2^E, f in [0.5, 1): floor(log2 a) = E - 1
    e = np.maximum(E - 1, emin(name))
    ulp = np.ldexp(1.0, e - m_bits)
    r = np.rint(a / ulp) * ulp
    over = r > MAX_VALUE[name]
    idx = np.searchsorted(finite_mags, np.minimum(r, MAX_VALUE[name]))
    assert np.all(finite_mags[idx] == np.minimum(r, MAX_VALUE[name]))
    if not saturate and nan == "ieee":
        idx = np.where(over, MAX_CODE[name] + 1, idx)  # inf: S.11111.00
    elif not saturate and nan == "all_ones":
        idx = np.where(over, n_pos - 1, idx)  # NaN: S.1111.111
    sign = np.signbit(x).astype(np.int64)
    return (idx | (sign << (bits(name) - 1))).astype(np.uint8)


def concentrated_f32(name: str, n: int, seed: int) -> np.ndarray:
    """``n`` float32 values with random sign, an unbiased exponent uniform over
    ``[emin - 12, emax + 3]`` of the format and a random 23-bit mantissa."""
    rng = np.random.default_rng(seed)
    sign = rng.integers(0, 2, n, dtype=np.uint32)
    e = rng.integers(emin(name) - 12, emax(name) + 4, n).astype(np.uint32)
    man = rng.integers(0, 1 << 23, n, dtype=np.uint32)
    u = (sign << np.uint32(31)) | ((e + np.uint32(127)) << np.uint32(23)) | man
    return u.view(np.float32)


def special_f32(name: str) -> np.ndarray:
    """Every code value, every midpoint between adjacent codes (exact ties) and its two
    float32 neighbours, values at and beyond max, signed zeros, inf and NaNs, both signs."""
    mags = code_values(name)[: MAX_CODE[name] + 1]
    ulp_top = mags[-1] - mags[-2]
    mids = (mags[:-1] + mags[1:]) / 2
    over = np.array([mags[-1] + ulp_top / 2, mags[-1] + ulp_top, 2 * mags[-1], 1e30, 3.4028234663852886e38])
    v = np.concatenate([mags, mids, over]).astype(np.float32)
    with np.errstate(over="ignore"):  # nextafter(FLT_MAX) is inf, which is wanted too
        v = np.concatenate([v, np.nextafter(v, np.float32(np.inf)), np.nextafter(v, np.float32(0))])
    v = np.concatenate([v, -v])
    nan_bits = np.array([0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0xFFC00000, 0xFF800001], np.uint32)
    special = np.concatenate([np.array([0.0, -0.0, np.inf, -np.inf], np.float32), nan_bits.view(np.float32)])
    return np.concatenate([v, special])


def all_bf16_as_f32() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)


def all_f16_as_f32() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)


# --------------------------------------------------------------------- mismatch reports
def float_fields(value, dtype) -> str:
    """sign / biased exponent / mantissa of one float32 or float64 value."""
    dt = np.dtype(dtype)
    if dt == np.float64:
        u, e_bits, m_bits = int(np.float64(value).view(np.uint64)), 11, 52
    else:
        u, e_bits, m_bits = int(np.float32(value).view(np.uint32)), 8, 23
    s = u >> (e_bits + m_bits)
    e = (u >> m_bits) & ((1 << e_bits) - 1)
    m = u & ((1 << m_bits) - 1)
    return f"{float(value)!r} (s={s} e={e:#x} m={m:#x})"


def code_fields(code, name) -> str:
    """sign / exponent / mantissa of one code of format ``name`` (the hex code alone for a
    format without a spec card here)."""
    if name not in SPEC:
        return f"{int(code):#04x}"
    e_bits, m_bits, _, _ = SPEC[name]
    c = int(code)
    s = (c >> (e_bits + m_bits)) & 1
    e = (c >> m_bits) & ((1 << e_bits) - 1)
    m = c & ((1 << m_bits) - 1)
    return f"{c:#04x} (s={s} e={e:0{e_bits}b} m={m:0{m_bits}b})"


def assert_codes_equal(got, want, x, name: str, what: str = ""):
    """Exact code equality; on mismatch, report the first bad element field by field."""
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
    if bad.size:
        i = bad[0]
        xf = np.asarray(x).reshape(-1)
        raise AssertionError(
            f"{what} [{name}]: {bad.size} of {got.size} codes differ; first at flat index {i}:\n"
            f"  input {float_fields(xf[i], xf.dtype)}\n"
            f"  got   {code_fields(got.reshape(-1)[i], name)}\n"
            f"  want  {code_fields(want.reshape(-1)[i], name)}"
        )


def assert_same_floats(got, want, what: str = ""):
    """Equal values with NaNs in the same places, and the same sign of zero (bitwise for
    non-NaN values)."""
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    gn = np.isnan(got.astype(np.float64))
    wn = np.isnan(want.astype(np.float64))
    uint = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
    diff = (gn != wn) | (~gn & (got.view(uint) != want.view(uint)))
    bad = np.flatnonzero(diff.reshape(-1))
    if bad.size:
        i = bad[0]
        raise AssertionError(
            f"{what}: {bad.size} of {got.size} values differ; first at flat index {i}: "
            f"got {got.reshape(-1)[i]!r}, want {want.reshape(-1)[i]!r}"
        )


# --------------------------------------------------------------------- exact scalar math
def f32_round(q: Fraction) -> Fraction:
    """``q`` rounded to the nearest binary32 value (ties to even, subnormals, overflow to
    inf returned as None). Pure Python on Fractions: an oracle independent of NumPy."""
    if q == 0:
        return Fraction(0)
    sign = -1 if q < 0 else 1
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()  # 2^e <= a < 2^(e+2)
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    e = max(e, -126)
    ulp = Fraction(2) ** (e - 23)
    n, rem = divmod(a, ulp)
    n = int(n)
    if rem * 2 > ulp or (rem * 2 == ulp and n % 2 == 1):
        n += 1
    r = n * ulp
    if r >= Fraction(2) ** 128:
        return None
    return sign * r


def per_element(a, block, shape):
    """Repeat one value per scale group (extents ``block``) back to every element of ``shape``."""
    a = np.asarray(a)
    for ax, b in enumerate(block):
        a = np.repeat(a, b, axis=ax)
    return a[tuple(slice(0, d) for d in shape)]


def sqnr_db(x, y) -> float:
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    return float(10 * np.log10(np.sum(x * x) / np.sum((x - y) ** 2)))
