"""Element and scale formats, as data.

Each format is a small frozen dataclass; everything the codecs need (max value, the
code of the largest finite magnitude, the NaN code, the smallest normal exponent)
is derived from a handful of fields, so no code path branches on a format's name.

Spec cards (value = (-1)^s * 2^(e - bias) * 1.m, subnormal when e == 0):

=========  ====  =====  ====  ===============  ================================
name       bits  e/m    bias  max              specials
=========  ====  =====  ====  ===============  ================================
e4m3fn     8     4/3    7     448              NaN = S.1111.111, no inf
e5m2       8     5/2    15    57344            IEEE: inf = S.11111.00, NaN
e2m3       6     2/3    1     7.5              none (OCP MX v1.0 FP6)
e3m2       6     3/2    3     28               none (OCP MX v1.0 FP6)
e2m1       4     2/1    1     6                none; {0, .5, 1, 1.5, 2, 3, 4, 6}
ue4m3      8     4/3    7     448              e4m3fn restricted to sign 0
e8m0       8     8/0    127   2^127            unsigned, no zero, 0xFF = NaN
int8       8                  127 / 255        symmetric int8 or uint8 + zp
int4       4                  7 / 15           symmetric int4 or uint4 + zp
=========  ====  =====  ====  ===============  ================================
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "FloatFormat",
    "IntFormat",
    "ScaleFormat",
    "get_format",
    "element_formats",
    "FORMATS",
]


@dataclass(frozen=True)
class FloatFormat:
    """A signed binary floating-point element format with subnormals.

    ``nan`` says how NaN is encoded: ``"ieee"`` (all-ones exponent, non-zero mantissa,
    with inf at all-ones exponent and zero mantissa), ``"all_ones"`` (only S.1111.111,
    no inf: the OCP "fn" formats) or ``"none"`` (no NaN, no inf).
    """

    name: str
    ebits: int
    mbits: int
    nan: str  # "ieee" | "all_ones" | "none"
    ml_dtype: str  # the ml_dtypes type with the same bits
    kind: str = field(default="float", init=False)

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits

    @property
    def bias(self) -> int:
        return (1 << (self.ebits - 1)) - 1

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal number."""
        return 1 - self.bias

    @property
    def max_code(self) -> int:
        """Code (sign bit clear) of the largest finite magnitude."""
        all_ones = (1 << (self.ebits + self.mbits)) - 1
        if self.nan == "ieee":  # top exponent is inf/NaN
            return all_ones - (1 << self.mbits)
        if self.nan == "all_ones":  # only the all-ones code is NaN
            return all_ones - 1
        return all_ones

    @property
    def emax(self) -> int:
        """Unbiased exponent of the largest finite number (OCP MX's emax_elem)."""
        return (self.max_code >> self.mbits) - self.bias

    @property
    def max_value(self) -> float:
        mant = self.max_code & ((1 << self.mbits) - 1)
        return (1.0 + mant / (1 << self.mbits)) * 2.0**self.emax

    @property
    def sign_bit(self) -> int:
        return 1 << (self.ebits + self.mbits)

    @property
    def nan_code(self) -> int | None:
        """Canonical positive quiet NaN code, or None if the format has no NaN."""
        if self.nan == "ieee":
            return ((1 << self.ebits) - 1) << self.mbits | (1 << (self.mbits - 1))
        if self.nan == "all_ones":
            return (1 << (self.ebits + self.mbits)) - 1
        return None

    @property
    def inf_code(self) -> int | None:
        if self.nan == "ieee":
            return ((1 << self.ebits) - 1) << self.mbits
        return None


@dataclass(frozen=True)
class IntFormat:
    """A two's-complement (symmetric) or unsigned (asymmetric, with zero point) integer."""

    name: str
    bits: int
    ml_dtype: str
    kind: str = field(default="int", init=False)

    def qrange(self, symmetric: bool) -> tuple[int, int]:
        """Code range: symmetric is +-(2^(b-1) - 1) (the most negative code unused),
        asymmetric is [0, 2^b - 1]."""
        if symmetric:
            q = (1 << (self.bits - 1)) - 1
            return -q, q
        return 0, (1 << self.bits) - 1

    def max_value(self, symmetric: bool = True) -> float:
        return float(self.qrange(symmetric)[1])


@dataclass(frozen=True)
class ScaleFormat:
    """A format used only for scales: ``e8m0`` (power of two, OCP MX) or ``ue4m3``
    (NVFP4 block scale: e4m3fn with the sign bit always clear) or ``f32``."""

    name: str
    bits: int
    ml_dtype: str | None
    kind: str = field(default="scale", init=False)


E4M3 = FloatFormat("e4m3", 4, 3, "all_ones", "float8_e4m3fn")
E5M2 = FloatFormat("e5m2", 5, 2, "ieee", "float8_e5m2")
E2M3 = FloatFormat("e2m3", 2, 3, "none", "float6_e2m3fn")
E3M2 = FloatFormat("e3m2", 3, 2, "none", "float6_e3m2fn")
E2M1 = FloatFormat("e2m1", 2, 1, "none", "float4_e2m1fn")
INT8 = IntFormat("int8", 8, "int8")
INT4 = IntFormat("int4", 4, "int4")
E8M0 = ScaleFormat("e8m0", 8, "float8_e8m0fnu")
UE4M3 = ScaleFormat("ue4m3", 8, "float8_e4m3fn")
F32 = ScaleFormat("f32", 32, None)

FORMATS = {f.name: f for f in (E4M3, E5M2, E2M3, E3M2, E2M1, INT8, INT4, E8M0, UE4M3, F32)}

_ALIASES = {
    "e4m3fn": "e4m3",
    "float8_e4m3fn": "e4m3",
    "fp8": "e4m3",
    "float8_e5m2": "e5m2",
    "e2m1fn": "e2m1",
    "float4_e2m1fn": "e2m1",
    "fp4": "e2m1",
    "e2m3fn": "e2m3",
    "float6_e2m3fn": "e2m3",
    "e3m2fn": "e3m2",
    "float6_e3m2fn": "e3m2",
    "e8m0fnu": "e8m0",
    "float8_e8m0fnu": "e8m0",
}


def element_formats() -> list[str]:
    """Names accepted by :func:`nqdq.encode` / :func:`nqdq.decode` as element formats."""
    return [n for n, f in FORMATS.items() if f.kind != "scale"]


def get_format(name, *, argname: str = "fmt"):
    """Look a format up by name (or alias); raise a ValueError naming ``argname``."""
    if isinstance(name, (FloatFormat, IntFormat, ScaleFormat)):
        return name
    if not isinstance(name, str):
        raise TypeError(f"{argname} must be a format name (str), got {type(name).__name__}")
    key = _ALIASES.get(name.lower(), name.lower())
    try:
        return FORMATS[key]
    except KeyError:
        known = ", ".join(sorted(FORMATS))
        raise ValueError(f"{argname}={name!r} is not a known format; known: {known}") from None
