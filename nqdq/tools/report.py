"""Quantization error report: how much each scheme loses on a tensor, as rows and as a table.

Pure functions, no argument parsing (that is ``nqdq.tools.cli``):

* :func:`sample_weight` builds the built-in sample tensor;
* :func:`open_tensors` reads ``.npy`` / ``.npz`` / ``.safetensors`` files lazily, one tensor
  at a time (see :mod:`nqdq.tools.tensorfile`);
* :func:`report_tensor` quantizes one tensor under each scheme and returns one
  :class:`Row` per scheme, plus notes for the schemes or tensors it skipped;
* :func:`format_report` / :func:`format_schemes` turn rows into aligned text tables.

Error statistics are computed in float64 between the input x (as float32) and its round trip
x̂ = dequantize(quantize(x)):

    SQNR [dB]  = 10 * log10(sum x^2 / sum (x - x̂)^2)       (inf when lossless)
    rel L2     = sqrt(sum (x - x̂)^2 / sum x^2)
    max |err|  = max |x - x̂|
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ..api import dequantize, quantize
from .tensorfile import TensorFileError as ReportError, TensorSource, open_tensors
from ..schemes import Scheme, bits_per_value, resolve_scheme, schemes

__all__ = [
    "ReportError",
    "Row",
    "SAMPLE_SHAPE",
    "sample_weight",
    "error_stats",
    "resolve_schemes",
    "TensorSource",
    "open_tensors",
    "report_tensor",
    "aggregate_rows",
    "format_report",
    "scheme_rows",
    "format_schemes",
    "prepare_tensor",
    "printable",
]

SAMPLE_SHAPE = (1024, 4096)
SAMPLE_SEED = 0
SAMPLE_MAX_VALUES = 1 << 26  # the largest built-in sample: 256 MiB as float32


# --------------------------------------------------------------------------- the sample


def sample_weight(shape=SAMPLE_SHAPE, seed=SAMPLE_SEED) -> np.ndarray:
    """A deterministic float32 tensor shaped and distributed like an LLM linear weight.

    ``shape = (..., in_features)``; every index of the leading axes is one output channel
    (a row). Made from ``np.random.default_rng(seed)`` in four steps:

    1. i.i.d. Gaussian entries with standard deviation 0.02 (the usual init scale);
    2. each row multiplied by a log-normal factor exp(N(0, 0.5^2)): output channels differ in
       scale, so per-tensor scales waste range on the quiet rows;
    3. ``max(1, in_features // 512)`` outlier input columns (8 for 4096), chosen at random,
       multiplied by factors drawn uniformly from [5, 20): the "massive activation"
       feature dimensions of LLMs, which break group/block scales that contain them;
    4. a Student-t (3 degrees of freedom) term of 0.005 added everywhere, for the heavy
       tails that real weights have and Gaussians lack.
    """
    shape = tuple(int(d) for d in shape)
    if len(shape) == 0 or any(d <= 0 for d in shape):
        raise ValueError(f"shape must have positive dimensions, got {shape}")
    rng = np.random.default_rng(seed)
    cols = shape[-1]
    rows = math.prod(shape[:-1])
    x = rng.standard_normal((rows, cols)) * 0.02
    x *= np.exp(rng.normal(0.0, 0.5, size=(rows, 1)))
    n_out = max(1, cols // 512)
    out_cols = rng.choice(cols, size=n_out, replace=False)
    x[:, out_cols] *= rng.uniform(5.0, 20.0, size=n_out)
    x += 0.005 * rng.standard_t(3, size=(rows, cols))
    return x.astype(np.float32).reshape(shape)


# --------------------------------------------------------------------------- statistics


def error_stats(x: np.ndarray, xhat: np.ndarray) -> dict:
    """SQNR (dB), relative L2 error and max abs error of ``xhat`` against ``x``, in float64,
    over the elements where both are finite. Also returns the two energies (for totals)."""
    x = np.asarray(x, np.float64)
    xhat = np.asarray(xhat, np.float64)
    ok = np.isfinite(x) & np.isfinite(xhat)
    if not ok.all():
        x, xhat = x[ok], xhat[ok]
    err = x - xhat
    signal = float(np.dot(x.ravel(), x.ravel()))
    noise = float(np.dot(err.ravel(), err.ravel()))
    return dict(
        sqnr_db=_sqnr(signal, noise),
        rel_l2=_rel_l2(signal, noise),
        max_abs_err=float(np.max(np.abs(err))) if err.size else 0.0,
        signal=signal,
        noise=noise,
    )


def _sqnr(signal, noise):
    if noise == 0:
        return math.inf if signal > 0 else math.nan
    if signal == 0 or math.isinf(noise):
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def _rel_l2(signal, noise):
    if signal == 0:
        return 0.0 if noise == 0 else math.inf
    return math.sqrt(noise / signal)


# --------------------------------------------------------------------------- rows


@dataclass
class Row:
    """One (tensor, scheme) line of the report."""

    tensor: str
    shape: tuple
    dtype: str  # the tensor's dtype in the input (float64 is quantized as float32)
    scheme: str
    fmt: str
    granularity: str
    bits_per_value: float  # codes + scales (+ zero points, means, tensor scale)
    compression: float  # input bits / bits_per_value
    sqnr_db: float
    rel_l2: float
    max_abs_err: float
    numel: int
    signal: float = dataclasses.field(default=0.0, repr=False)  # sum x^2 (float64)
    noise: float = dataclasses.field(default=0.0, repr=False)  # sum (x - x̂)^2
    n_tensors: int = 1  # > 1 for aggregated rows

    def to_json(self) -> dict:
        """Strict JSON: non-finite numbers (a lossless SQNR of inf) become null."""
        d = dict(
            tensor=self.tensor,
            shape=list(self.shape),
            dtype=self.dtype,
            scheme=self.scheme,
            format=self.fmt,
            granularity=self.granularity,
            bits_per_value=self.bits_per_value,
            compression=self.compression,
            sqnr_db=self.sqnr_db,
            rel_l2=self.rel_l2,
            max_abs_err=self.max_abs_err,
            numel=self.numel,
        )
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def resolve_schemes(names=None) -> tuple[list[tuple[str, Scheme]], list[str]]:
    """``[(name, Scheme)]`` for the report and notes. ``names=None``: every name in
    :func:`nqdq.schemes`, leaving out the names that resolve to the same scheme as an
    earlier one (``e4m3`` is ``fp8_row``...), which would only repeat its numbers."""
    if names is None:
        picked, seen, aliases = [], {}, []
        for name in schemes():
            sch = resolve_scheme(name)
            key = dataclasses.replace(sch, name="")
            if key in seen:
                aliases.append(f"{name} = {seen[key]}")
                continue
            seen[key] = name
            picked.append((name, sch))
        return picked, ([f"aliases not repeated: {', '.join(aliases)}"] if aliases else [])
    picked, unknown = [], []
    for name in names:
        try:
            sch = resolve_scheme(name)
        except (ValueError, TypeError):
            unknown.append(name)
            continue
        if name not in [n for n, _ in picked]:
            picked.append((name, sch))
    if unknown:
        raise ReportError(
            "--schemes", f"unknown scheme(s) {', '.join(map(repr, unknown))}; known: {', '.join(schemes())}"
        )
    if not picked:
        raise ReportError("--schemes", "no scheme given")
    return picked, []


def _skip_reason(sch: Scheme, shape: tuple) -> str | None:
    try:
        sch.check_shape(shape)
    except ValueError as exc:
        return str(exc)
    return None


def report_tensor(name: str, x: np.ndarray, picked, *, dtype_name=None, progress=None) -> tuple[list[Row], list[str]]:
    """Quantize ``x`` (float32 / float16 / bfloat16) with each ``(scheme name, Scheme)``
    in ``picked``; return the rows and notes on what was skipped."""
    dtype_name = dtype_name or _dtype_name(x.dtype)
    input_bits = 8 * np.dtype(x.dtype).itemsize if dtype_name != "float64" else 64
    rows, notes = [], []
    if x.ndim == 0 or x.size == 0:
        if progress is not None:
            progress.update(len(picked))
        return rows, [f"{name}: skipped: {'a 0-d tensor' if x.ndim == 0 else 'an empty tensor'} (shape {x.shape})"]
    nonfinite = int(x.size - np.count_nonzero(np.isfinite(x)))
    if nonfinite:
        notes.append(
            f"{name}: {nonfinite} NaN/inf values; the statistics cover only the elements where x and its "
            f"round trip are finite (a NaN/inf makes its whole scale group NaN)"
        )
    for sname, sch in picked:
        if progress is not None:
            progress.set_postfix_str(f"{name} {sname}", refresh=False)
        reason = _skip_reason(sch, tuple(x.shape))
        if reason is None:
            try:
                q = quantize(x, sch)
            except ValueError as exc:  # the API's own shape rules: report, don't crash
                reason = str(exc)
        if reason is not None:
            notes.append(f"{name}: {sname} skipped: {reason}")
        else:
            xhat = dequantize(q)
            st = error_stats(x.astype(np.float32), xhat)
            dropped = int(np.count_nonzero(np.isfinite(x) & ~np.isfinite(xhat)))
            if dropped:  # (finite inputs decode finite by the spec: this says so if one does not)
                notes.append(f"{name}: {sname}: {dropped} finite values decoded to NaN/inf and are left out of "
                             f"its statistics")
            bpv = q.bits_per_value
            rows.append(
                Row(
                    tensor=name,
                    shape=tuple(x.shape),
                    dtype=dtype_name,
                    scheme=sname,
                    fmt=sch.fmt,
                    granularity=sch.granularity,
                    bits_per_value=bpv,
                    compression=input_bits / bpv,
                    sqnr_db=st["sqnr_db"],
                    rel_l2=st["rel_l2"],
                    max_abs_err=st["max_abs_err"],
                    numel=int(x.size),
                    signal=st["signal"],
                    noise=st["noise"],
                )
            )
        if progress is not None:
            progress.update(1)
    return rows, notes


def aggregate_rows(rows: list[Row]) -> list[Row]:
    """One row per scheme over all the tensors it was applied to, each tensor weighted by
    its size: the relative noise power  r = sum_i n_i * noise_i / signal_i / sum_i n_i
    gives SQNR = -10 log10(r) and rel L2 = sqrt(r) (so a tensor of large values, a norm or
    an embedding, does not drown the others); bits per value and compression are those of
    all the tensors together; max |err| is the largest."""
    out: dict[str, Row] = {}
    acc: dict[str, list[float]] = {}  # [quantized bits, input bits, sum n_i * noise_i / signal_i]
    for r in rows:
        if r.scheme not in out:
            out[r.scheme] = dataclasses.replace(r, tensor="(all)", shape=(), dtype="", n_tensors=0, numel=0,
                                                signal=0.0, noise=0.0, max_abs_err=0.0)
            acc[r.scheme] = [0.0, 0.0, 0.0]
        a, s = out[r.scheme], acc[r.scheme]
        a.n_tensors += 1
        a.numel += r.numel
        a.signal += r.signal
        a.noise += r.noise
        a.max_abs_err = max(a.max_abs_err, r.max_abs_err)
        s[0] += r.bits_per_value * r.numel
        s[1] += r.compression * r.bits_per_value * r.numel
        s[2] += r.numel * (r.noise / r.signal if r.signal > 0 else (0.0 if r.noise == 0 else math.inf))
    for name, a in out.items():
        qbits, ibits, rel = acc[name]
        a.bits_per_value = qbits / a.numel
        a.compression = ibits / qbits
        a.sqnr_db = _sqnr(1.0, rel / a.numel)
        a.rel_l2 = math.sqrt(rel / a.numel)
    return list(out.values())


# --------------------------------------------------------------------------- tables

_REPORT_COLUMNS = ("scheme", "bits/value", "compression", "SQNR dB", "rel L2", "max |err|")


def _fmt(v: float, spec: str) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return format(v, spec)


def _cells(r: Row) -> list[str]:
    return [
        r.scheme,
        _fmt(r.bits_per_value, ".3f"),
        _fmt(r.compression, ".2f") + "x",
        _fmt(r.sqnr_db, ".2f"),
        _fmt(r.rel_l2, ".3e"),
        _fmt(r.max_abs_err, ".3e"),
    ]


def _table(header, body, right) -> list[str]:
    widths = [max(len(c) for c in col) for col in zip(header, *body)]

    def line(cells):
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()

    return [line(header), line(["-" * w for w in widths])] + [line(b) for b in body]


def _shape_str(shape) -> str:
    return "x".join(str(d) for d in shape) if len(shape) else "scalar"


def printable(text: str) -> str:
    """``text`` with every character that is not printable (control characters such as ESC,
    BEL, newline; format characters such as U+202E) written as its Python escape, so that a
    tensor name from a file can neither drive the terminal nor start a line of its own."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def tensor_title(r: Row) -> str:
    return f"{printable(r.tensor)}  ({_shape_str(r.shape)} {r.dtype}, {r.numel:,} value{'s' if r.numel != 1 else ''})"


def format_report(rows: list[Row], *, totals: bool = True) -> str:
    """The rows as text: one section per tensor (a title line, then an aligned table with
    one line per scheme) and, when there are several tensors, a section of totals."""
    sections: dict[str, list[Row]] = {}
    for r in rows:
        sections.setdefault(r.tensor, []).append(r)
    agg = aggregate_rows(rows) if totals and len(sections) > 1 else []
    right = (False,) + (True,) * (len(_REPORT_COLUMNS) - 1)
    # one set of column widths for every section, so the tables line up
    all_body = [_cells(r) for r in rows + agg]
    lines = _table(_REPORT_COLUMNS, all_body, right)
    header, rule, body = lines[0], lines[1], lines[2:]
    out, i = [], 0
    for name, rs in sections.items():
        out += [tensor_title(rs[0]), header, rule] + body[i : i + len(rs)] + [""]
        i += len(rs)
    if agg:
        n = len(sections)
        out.append(f"all {n} tensors  (weighted by size: SQNR and rel L2 from the mean relative noise power)")
        out += [header, rule]
        for r, b in zip(agg, body[i:]):
            out.append(b + ("" if r.n_tensors == n else f"  ({r.n_tensors}/{n} tensors)"))
        out.append("")
    return "\n".join(out).rstrip("\n")


def _group_str(sch: Scheme) -> str:
    if sch.granularity == "group":
        return f"1x{sch.group_size}"
    if sch.granularity == "block":
        return "x".join(map(str, sch.block_shape))
    return sch.granularity


def scheme_rows() -> list[dict]:
    """One dict per name in :func:`nqdq.schemes`: its element format, scale granularity,
    scale group, scale format, bits per value for a 1024x4096 input, and notes."""
    out, seen = [], {}
    for name in schemes():
        sch = resolve_scheme(name)
        key = dataclasses.replace(sch, name="")
        notes = []
        if key in seen:
            notes.append(f"= {seen[key]}")
        seen.setdefault(key, name)
        if sch.scale_rounding:
            notes.append(f"scale rounding {sch.scale_rounding}")
        if sch.tensor_scale:
            notes.append("+ f32 tensor scale")
        if sch.centred:
            notes.append("+ f32 group means")
        if not sch.symmetric:
            notes.append("zero points")
        out.append(
            dict(
                scheme=name,
                format=sch.fmt,
                element_bits=sch.code_bits,
                granularity=sch.granularity,
                scale_group=_group_str(sch),
                scale_format=sch.scale_format,
                bits_per_value_1024x4096=bits_per_value(sch, SAMPLE_SHAPE),
                notes="; ".join(notes),
            )
        )
    return out


def format_schemes(rows: list[dict]) -> str:
    header = ("scheme", "format", "bits", "granularity", "scale group", "scale", "bits/value*", "notes")
    body = [
        [r["scheme"], r["format"], str(r["element_bits"]), r["granularity"], r["scale_group"],
         r["scale_format"], f"{r['bits_per_value_1024x4096']:.3f}", r["notes"]]
        for r in rows
    ]
    right = (False, False, True, False, False, False, True, False)
    lines = _table(header, body, right)
    lines.append("* bits per value including scales, for a 1024x4096 input")
    return "\n".join(lines)


# --------------------------------------------------------------------------- files


def _dtype_name(dt) -> str:
    dt = np.dtype(dt)
    return "bfloat16" if dt == np.dtype(ml_dtypes.bfloat16) else dt.name


def prepare_tensor(src: TensorSource) -> tuple[np.ndarray | None, str, str | None]:
    """``(array to quantize, input dtype name, note)``. The array is None when the tensor
    is skipped (the note says why); float64 is converted to float32 (with a note)."""
    x = src.load()
    if x is None:
        dt = src.dtype or "object"
        return None, dt, f"{src.name}: skipped: dtype {dt} cannot be read as a NumPy array of numbers"
    if x.dtype.kind in "fiu" and not x.dtype.isnative:  # e.g. a big-endian .npy
        x = x.astype(x.dtype.newbyteorder("="))
    name = _dtype_name(x.dtype)
    if x.dtype in (np.float32, np.float16) or name == "bfloat16":
        return x, name, None
    if x.dtype == np.float64:
        return (x.astype(np.float32), name,
                f"{src.name}: float64 input converted to float32 to quantize (compression is vs float64)")
    if x.dtype.kind in "iub":
        kind = "boolean" if x.dtype.kind == "b" else "integer"
        return None, name, f"{src.name}: skipped: {kind} tensor ({name}), not a weight or activation to quantize"
    if x.dtype.kind == "V" or name.startswith("float8") or name.startswith("float4"):
        return None, name, f"{src.name}: skipped: dtype {name} is already quantized or not a float"
    return None, name, f"{src.name}: skipped: dtype {name} is not float32, float16, bfloat16 or float64"
