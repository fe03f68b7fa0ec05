"""Quantization schemes: which element format, and how values share a scale.

A :class:`Scheme` is resolved from the arguments of :func:`nqdq.quantize`: either an
element format plus a ``granularity``, or a preset name that fixes both. Every scheme is
described by the *extent of one scale group along each axis* (:meth:`Scheme.block_for`),
so a single blocked reduction in the reference serves every granularity:

=============  ========================================  ===============================
granularity    one scale per ...                         scale group extents
=============  ========================================  ===============================
tensor         tensor                                    the whole shape
row            slice along ``axis`` (per token)          ``axis``: full, others: 1
column         index along ``axis`` (per channel)        ``axis``: 1, others: full
group          ``group_size`` consecutive along ``axis``  ``axis``: G, others: 1
block          ``block_shape`` tile of the last 2 axes   (..., 1, B0, B1)
=============  ========================================  ===============================

A group or block side longer than its axis is one partial group (computed as if padded with
zeros, which the reference allocates): :meth:`Scheme.check_shape` allows that only up to
``MAX_OVERHANG`` = 128 elements, the longest group of any preset, so that padding stays
bounded by the data (``group_size=2**40`` on a row of 256 is a ValueError, not 4 TiB).

Presets:

``mxfp8`` (``mxfp8_e5m2``), ``mxfp6_e2m3``, ``mxfp6_e3m2``, ``mxfp4``
    OCP MX v1.0: 32 consecutive elements share one e8m0 scale.
``nvfp4``
    e2m1 elements, one ue4m3 scale per 16 elements and one float32 tensor scale
    (TransformerEngine's two-level formula, see reference/scales.py).
``fp8_1x128`` / ``fp8_128x128``
    DeepSeek-V3 style e4m3 with float32 scales per 1x128 group (activations) and per
    128x128 tile (weights).
``int8_centred``
    Blockwise-centred INT8 (as in Metal quantized attention): per 1xG group, the mean is
    subtracted and stored, the rest is symmetric INT8; the GEMM restores the mean.
``fp8_tensor``, ``fp8_row``, ``int8_row``, ``int8_column``, ``int4_group``
    Shorthands for the common element/granularity pairs.
``int8_asym``, ``int4_asym``
    Asymmetric integers (uint codes + zero point) per row / per 1x128 group.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .formats import FloatFormat, IntFormat, get_format

__all__ = ["Scheme", "resolve_scheme", "schemes", "GRANULARITIES", "SCALE_ROUNDINGS"]

GRANULARITIES = ("tensor", "row", "column", "group", "block")

# MX shared-exponent rounding, X = 2^k with (amax = max |v| over the block, emax_elem the
# exponent of the element format's largest normal, max_elem its largest value):
SCALE_ROUNDINGS = {
    # k = floor(log2(amax)) - emax_elem: OCP MX v1.0 section 6.3; microsoft/microxcaling.
    # The top of a block can exceed max_elem after scaling and is saturated.
    "floor": "floor(log2(amax)) - emax_elem (OCP MX v1.0, microxcaling)",
    # k = ceil(log2(amax / max_elem)), amax / max_elem computed as amax * fp32(1/max_elem):
    # NVIDIA TransformerEngine / cuBLAS / Blackwell cvt.rp.satfinite.ue8m0x2. Never saturates.
    "rceil": "ceil(log2(amax * (1/max_elem))) (TransformerEngine, cuBLAS, torchao RCEIL)",
    # amax is first rounded half-up to the element's mantissa width, then floor as above:
    # torchao ScaleCalculationMode.EVEN.
    "even": "floor(log2(round_half_up(amax, mbits_elem))) - emax_elem (torchao EVEN)",
}
DEFAULT_SCALE_ROUNDING = "rceil"

_DEFAULT_GROUP = 128
# The longest a scale group (group_size, a block_shape side) may be beyond the length of its
# axis: the longest group of any preset. Longer groups are refused by Scheme.check_shape.
MAX_OVERHANG = 128
_DEFAULT_BLOCK = (128, 128)
_MX_BLOCK = 32
_NVFP4_BLOCK = 16


@dataclass(frozen=True)
class Scheme:
    """A fully resolved quantization scheme (all options explicit, JSON-serialisable)."""

    name: str  # preset name, or the element format for ad-hoc schemes
    fmt: str  # element format name
    granularity: str  # one of GRANULARITIES
    scale_format: str = "f32"  # "f32" | "e8m0" | "ue4m3"
    axis: int = -1
    group_size: int | None = None
    block_shape: tuple[int, int] | None = None
    symmetric: bool = True
    centred: bool = False
    scale_rounding: str | None = None  # MX only
    tensor_scale: bool = False  # NVFP4: a second, float32 per-tensor scale
    static_scale: bool = False  # scales given by the caller

    @property
    def element(self) -> FloatFormat | IntFormat:
        return get_format(self.fmt)

    @property
    def is_mx(self) -> bool:
        return self.scale_format == "e8m0"

    @property
    def is_nvfp4(self) -> bool:
        return self.scale_format == "ue4m3"

    @property
    def code_bits(self) -> int:
        return self.element.bits

    def block_for(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Extent of one scale group along each axis of an input of ``shape``."""
        nd = len(shape)
        if self.granularity == "tensor":
            return tuple(max(d, 1) for d in shape)
        if self.granularity == "block":
            return (1,) * (nd - 2) + tuple(self.block_shape)
        ax = self.axis % nd
        if self.granularity == "row":
            return tuple(max(d, 1) if i == ax else 1 for i, d in enumerate(shape))
        if self.granularity == "column":
            return tuple(1 if i == ax else max(d, 1) for i, d in enumerate(shape))
        return tuple(self.group_size if i == ax else 1 for i in range(nd))  # group

    def check_shape(self, shape: tuple[int, ...]) -> None:
        """Raise ValueError (naming the argument) if an input of ``shape`` cannot use this scheme."""
        nd = len(shape)
        if nd == 0:
            raise ValueError("x must have at least one dimension, got a 0-d array")
        if self.granularity in ("block", "column") and nd < 2:
            raise ValueError(f"granularity={self.granularity!r} needs x with at least 2 dimensions, got shape {tuple(shape)}")
        if self.granularity in ("row", "column", "group") and not -nd <= self.axis < nd:
            raise ValueError(f"axis={self.axis} is out of range for x with {nd} dimensions")
        if self.granularity == "group" and self.axis % nd != nd - 1 and self.code_bits < 8:
            raise ValueError(
                f"axis={self.axis}: {self.code_bits}-bit codes are packed along the last axis, so their "
                f"groups must run along it too; transpose x (e.g. np.moveaxis(x, {self.axis}, -1)) first"
            )
        if self.granularity in ("group", "block"):
            # a group longer than its axis is a partial group, computed as if zero-padded; the
            # padding is allocated, so it is bounded by the data (or by the presets' groups)
            for i, (d, b) in enumerate(zip(shape, self.block_for(shape))):
                if b > max(d, MAX_OVERHANG):
                    what = "group_size" if self.granularity == "group" else f"block_shape[{i - nd + 2}]"
                    raise ValueError(
                        f"{what}={b} is longer than axis {i} of x (length {d}); a scale group may be "
                        f"longer than its axis only up to {MAX_OVERHANG} elements"
                    )

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of the (linear-layout) scale array for an input of ``shape``."""
        return tuple(-(-d // b) for d, b in zip(shape, self.block_for(shape)))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["block_shape"] = list(self.block_shape) if self.block_shape else None
        return d

    @classmethod
    def from_dict(cls, d) -> "Scheme":
        """The scheme that :meth:`to_dict` wrote as ``d`` (a file's metadata: untrusted input).

        ``d`` must be exactly what :func:`resolve_scheme` gives for its name and options, so
        it passes the checks :func:`nqdq.quantize` makes; anything else is a ValueError
        naming the field. Fields with defaults may be left out."""
        if not isinstance(d, dict):
            raise ValueError(f"a scheme must be a JSON object, got {type(d).__name__}")
        fields = cls.__dataclass_fields__
        unknown = sorted(set(d) - set(fields))
        if unknown:
            raise ValueError(f"unknown scheme fields {unknown}")
        missing = [k for k in ("name", "fmt", "granularity") if k not in d]
        if missing:
            raise ValueError(f"scheme fields {missing} are missing")
        d = {k: d.get(k, f.default) for k, f in fields.items()}
        for k, types in _FIELD_TYPES.items():
            v = d[k]
            if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
                raise ValueError(f"scheme field {k}={v!r} has the wrong type ({type(v).__name__})")
        bs = d["block_shape"]
        if bs is not None:
            if len(bs) != 2 or not all(isinstance(b, int) and not isinstance(b, bool) for b in bs):
                raise ValueError(f"scheme field block_shape={bs!r} is not a pair of ints")
            d["block_shape"] = tuple(bs)
        want = cls(**d)
        gran = d["granularity"]
        options = dict(
            axis=d["axis"],
            group_size=d["group_size"] if gran == "group" else None,
            block_shape=d["block_shape"] if gran == "block" else None,
            symmetric=d["symmetric"],
            scale_rounding=d["scale_rounding"],
            static_scale=d["static_scale"],
        )
        # a bare element format resolves with granularity=None to its default (e2m1: its MX
        # scheme), and with the granularity named to the f32-scaled one: either may be meant
        resolved, error = [], None
        for g in (gran, None):
            try:
                resolved.append(resolve_scheme(d["name"], granularity=g, **options))
            except (ValueError, TypeError) as exc:
                error = error or exc
        if want in resolved:
            return want
        if not resolved:
            raise ValueError(f"scheme {d['name']!r}: {error}")
        got = resolved[0]
        diff = ", ".join(f"{k}={getattr(want, k)!r} (expected {getattr(got, k)!r})"
                         for k in fields if getattr(want, k) != getattr(got, k))  # fmt: skip
        raise ValueError(f"scheme {d['name']!r} does not match its fields: {diff}")


_FIELD_TYPES = {  # Scheme.from_dict: the JSON type of each field
    "name": (str,), "fmt": (str,), "granularity": (str,), "scale_format": (str,), "axis": (int,),
    "group_size": (int, type(None)), "block_shape": (list, tuple, type(None)), "symmetric": (bool,),
    "centred": (bool,), "scale_rounding": (str, type(None)), "tensor_scale": (bool,), "static_scale": (bool,),
}  # fmt: skip


def _mx(fmt):
    return dict(fmt=fmt, granularity="group", group_size=_MX_BLOCK, scale_format="e8m0")


_PRESETS: dict[str, dict] = {
    "mxfp8": _mx("e4m3"),
    "mxfp8_e4m3": _mx("e4m3"),
    "mxfp8_e5m2": _mx("e5m2"),
    "mxfp6_e2m3": _mx("e2m3"),
    "mxfp6_e3m2": _mx("e3m2"),
    "mxfp4": _mx("e2m1"),
    "nvfp4": dict(
        fmt="e2m1",
        granularity="group",
        group_size=_NVFP4_BLOCK,
        scale_format="ue4m3",
        tensor_scale=True,
    ),
    "fp8_1x128": dict(fmt="e4m3", granularity="group", group_size=128),
    "fp8_128x128": dict(fmt="e4m3", granularity="block", block_shape=(128, 128)),
    "int8_centred": dict(fmt="int8", granularity="group", group_size=_DEFAULT_GROUP, centred=True),
    "fp8_tensor": dict(fmt="e4m3", granularity="tensor"),
    "fp8_row": dict(fmt="e4m3", granularity="row"),
    "int8_row": dict(fmt="int8", granularity="row"),
    "int8_column": dict(fmt="int8", granularity="column"),
    "int4_group": dict(fmt="int4", granularity="group", group_size=_DEFAULT_GROUP),
    "int8_asym": dict(fmt="int8", granularity="row", symmetric=False),
    "int4_asym": dict(fmt="int4", granularity="group", group_size=_DEFAULT_GROUP, symmetric=False),
}

# Default granularity when only an element format is named (documented in the README):
# 8-bit formats scale per row (per token), the narrow float formats use their MX block,
# int4 uses 1x128 groups.
_DEFAULT_GRANULARITY = {
    "e4m3": "row",
    "e5m2": "row",
    "int8": "row",
    "int4": "group",
    "e2m1": "group",
    "e2m3": "group",
    "e3m2": "group",
}


def schemes() -> list[str]:
    """Names accepted as ``scheme`` by :func:`nqdq.quantize`: presets, then element formats."""
    return list(_PRESETS) + list(_DEFAULT_GRANULARITY)


def _positive_int(value, argname):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{argname} must be a positive int, got {value!r}")
    return value


def resolve_scheme(
    scheme,
    *,
    granularity=None,
    axis=-1,
    group_size=None,
    block_shape=None,
    symmetric=None,
    scale_rounding=None,
    static_scale=False,
) -> Scheme:
    """Turn the user's ``scheme`` and options into a :class:`Scheme`, or raise a clear error."""
    if isinstance(scheme, Scheme):
        return scheme
    if not isinstance(scheme, str):
        raise TypeError(f"scheme must be a str, got {type(scheme).__name__}")
    key = scheme.lower()
    if key in _PRESETS:
        spec = dict(_PRESETS[key])
        if granularity is not None and granularity != spec["granularity"]:
            raise ValueError(
                f"granularity={granularity!r} conflicts with scheme={scheme!r}, which is "
                f"{spec['granularity']!r}; pass an element format (e.g. 'e4m3') to choose one"
            )
        name = key
    else:
        try:
            fmt = get_format(key, argname="scheme")
        except ValueError:
            raise ValueError(
                f"scheme={scheme!r} is unknown; known schemes: {', '.join(schemes())}"
            ) from None
        if fmt.kind == "scale":
            raise ValueError(f"scheme={scheme!r} is a scale format, not an element format")
        gran = granularity or _DEFAULT_GRANULARITY[fmt.name]
        if gran not in GRANULARITIES:
            raise ValueError(f"granularity={gran!r} is not one of {GRANULARITIES}")
        spec = dict(fmt=fmt.name, granularity=gran)
        if gran == "group" and fmt.name in ("e2m1", "e2m3", "e3m2") and granularity is None:
            spec.update(_mx(fmt.name))  # a bare narrow float format means its MX scheme
        name = fmt.name

    fmt = get_format(spec["fmt"])
    if spec["granularity"] == "group":
        if group_size is not None:
            if spec.get("scale_format") in ("e8m0", "ue4m3") and group_size != spec["group_size"]:
                raise ValueError(
                    f"group_size={group_size} is not allowed for scheme={scheme!r}: "
                    f"its block is {spec['group_size']} by definition"
                )
            spec["group_size"] = _positive_int(group_size, "group_size")
        spec.setdefault("group_size", _DEFAULT_GROUP)
    elif group_size is not None:
        raise ValueError(f"group_size is only used with granularity='group', not {spec['granularity']!r}")
    if spec["granularity"] == "block":
        bs = block_shape if block_shape is not None else spec.get("block_shape", _DEFAULT_BLOCK)
        if isinstance(bs, int):
            bs = (bs, bs)
        if not (isinstance(bs, (tuple, list)) and len(bs) == 2):
            raise ValueError(f"block_shape must be an int or a pair of ints, got {block_shape!r}")
        spec["block_shape"] = (_positive_int(bs[0], "block_shape[0]"), _positive_int(bs[1], "block_shape[1]"))
    elif block_shape is not None:
        raise ValueError(f"block_shape is only used with granularity='block', not {spec['granularity']!r}")

    if not isinstance(axis, int) or isinstance(axis, bool):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")

    is_mx = spec.get("scale_format") == "e8m0"
    if scale_rounding is not None and not is_mx:
        raise ValueError(f"scale_rounding applies to MX schemes only (e8m0 scales), not scheme={scheme!r}")
    if is_mx:
        scale_rounding = scale_rounding or DEFAULT_SCALE_ROUNDING
        if scale_rounding not in SCALE_ROUNDINGS:
            raise ValueError(f"scale_rounding={scale_rounding!r} is not one of {tuple(SCALE_ROUNDINGS)}")
        spec["scale_rounding"] = scale_rounding

    if symmetric is None:
        symmetric = spec.get("symmetric", True)
    elif not isinstance(symmetric, bool):
        raise TypeError(f"symmetric must be a bool or None, got {type(symmetric).__name__}")
    elif "symmetric" in spec and symmetric != spec["symmetric"]:
        raise ValueError(f"symmetric={symmetric} conflicts with scheme={scheme!r}")
    if not symmetric:
        if fmt.kind != "int":
            raise ValueError(f"symmetric=False (zero points) needs an integer format, not {fmt.name!r}")
        if spec.get("centred"):
            raise ValueError("symmetric=False cannot be combined with the centred INT8 scheme")
    spec["symmetric"] = symmetric

    if static_scale:
        # NVFP4: scale= is the fp32 tensor scale (S_dec), its ue4m3 block scales computed from it
        if spec.get("scale_format", "f32") not in ("f32", "ue4m3"):
            raise ValueError(f"scale= (static scales) is not supported by scheme={scheme!r}: its scales are {spec['scale_format']}")
        if spec.get("centred") or not symmetric:
            raise ValueError("scale= (static scales) needs a symmetric, non-centred scheme")
    spec["static_scale"] = bool(static_scale)
    spec["axis"] = axis
    return Scheme(name=name, **spec)


def bits_per_value(scheme: Scheme, shape: tuple[int, ...]) -> float:
    """Storage bits per element: codes, scales, zero points, means and tensor scale."""
    n = math.prod(shape)
    if n == 0:
        return float("nan")
    n_scales = math.prod(scheme.scale_shape(shape))
    scale_bits = 32 if scheme.scale_format == "f32" else 8
    total = n * scheme.code_bits + n_scales * scale_bits
    if not scheme.symmetric:
        total += n_scales * scheme.code_bits  # zero points, stored in the code width
    if scheme.centred:
        total += n_scales * 32  # float32 means
    if scheme.tensor_scale:
        total += 32
    return total / n
