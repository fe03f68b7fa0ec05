"""The ``nqdq`` command: ``nqdq report`` (quantization error per scheme) and ``nqdq schemes``.

Argument parsing only; the work is done by :mod:`nqdq.tools.report`. :func:`main` returns the
exit status (0 ok, 1 nothing could be reported, 2 bad arguments) instead of exiting, so it
can be called in-process: ``main(["report", "w.safetensors", "--json"])``. Text from a file
(tensor names) reaches the terminal through :func:`nqdq.tools.report.printable`, control
characters escaped; ``--json`` escapes them as JSON does.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from .. import __version__
from . import report as R

__all__ = ["main", "build_parser"]

_EPILOG_REPORT = """\
columns: bits/value counts codes and scales (and zero points, means, tensor scale);
compression = input dtype bits / bits per value; SQNR = 10 log10(sum x^2 / sum (x - x')^2)
and rel L2 = sqrt(sum (x - x')^2 / sum x^2), in float64, x' = dequantize(quantize(x)).
With no FILE, a deterministic LLM-like weight with outlier columns is used (docs/report.md).
"""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so that main() can return the status."""

    def exit(self, status=0, message=None):
        if message:
            (sys.stderr if status else sys.stdout).write(message)
        raise _Exit(status)


class _Exit(Exception):
    def __init__(self, status):
        super().__init__(status)
        self.status = status


def _shape_arg(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(t) for t in text.lower().replace(",", "x").split("x"))
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape like 1024x4096 (positive integers)")
    if math.prod(shape) > R.SAMPLE_MAX_VALUES:
        raise argparse.ArgumentTypeError(
            f"{text!r} has {math.prod(shape):,} values; the built-in sample has at most {R.SAMPLE_MAX_VALUES:,}"
        )
    return shape


def _seed_arg(text: str) -> int:
    try:
        seed = int(text)
    except ValueError:
        seed = -1
    if seed < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a seed (a non-negative integer)")
    return seed


def _schemes_arg(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise argparse.ArgumentTypeError("no scheme given; e.g. --schemes mxfp4,nvfp4,fp8_row")
    return names


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="nqdq", description="nqdq: exact quantization for NumPy/CuPy arrays.")
    p.add_argument("--version", action="version", version=f"nqdq {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    r = sub.add_parser(
        "report",
        help="quantization error of each scheme on a tensor file (or a built-in sample)",
        description="Quantize a tensor with each scheme and print bits per value, compression,\n"
        "SQNR, relative L2 and max abs error, one row per scheme.",
        epilog=_EPILOG_REPORT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("file", nargs="?", metavar="FILE", help=".npy, .npz or .safetensors file (default: built-in sample)")
    r.add_argument("--tensor", action="append", metavar="NAME",
                   help="only this tensor of FILE (repeatable; default: every tensor)")
    r.add_argument("--schemes", type=_schemes_arg, metavar="A,B,...",
                   help="comma-separated schemes (default: every scheme of `nqdq schemes`, aliases once)")
    r.add_argument("--json", action="store_true", help="print a JSON list, one object per (tensor, scheme)")
    r.add_argument("--sample-shape", type=_shape_arg, metavar="RxC",
                   help=f"shape of the built-in sample (default {'x'.join(map(str, R.SAMPLE_SHAPE))})")
    r.add_argument("--seed", type=_seed_arg, default=R.SAMPLE_SEED, help="seed of the built-in sample (default 0)")
    r.add_argument("--no-progress", action="store_true",
                   help="no progress bar (it is off anyway unless stderr is a TTY)")

    s = sub.add_parser("schemes", help="list the schemes: element format, scale granularity and format")
    s.add_argument("--json", action="store_true", help="print a JSON list")
    return p


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except _Exit as e:
        return e.status
    try:
        if args.command == "schemes":
            return _schemes(args)
        return _report(args)
    except R.ReportError as exc:
        print(f"nqdq {args.command}: error: {R.printable(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `nqdq report | head`
        sys.stderr.close()
        return 0


def _schemes(args) -> int:
    rows = R.scheme_rows()
    print(json.dumps(rows, indent=2) if args.json else R.format_schemes(rows))
    return 0


def _inputs(args):
    """``(title, [TensorSource])`` for the file (filtered by --tensor) or the sample."""
    if args.file is None:
        if args.tensor:
            raise R.ReportError("--tensor", "needs a FILE (the built-in sample has one tensor)")
        shape = args.sample_shape or R.SAMPLE_SHAPE
        seed = args.seed
        src = R.TensorSource("sample", "float32", lambda: R.sample_weight(shape, seed))
        title = (f"input: built-in sample, an LLM-like float32 weight {'x'.join(map(str, shape))} "
                 f"(seed {seed}; see docs/report.md)")
        return title, [src]
    if args.sample_shape is not None:
        raise R.ReportError("--sample-shape", "only applies to the built-in sample, not to FILE")
    sources = R.open_tensors(args.file)
    if args.tensor:
        by_name = {s.name: s for s in sources}
        missing = [t for t in args.tensor if t not in by_name]
        if missing:
            names = list(by_name)
            shown = ", ".join(map(R.printable, names[:20])) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
            raise R.ReportError("--tensor", f"no tensor named {', '.join(map(repr, missing))} in {args.file}; "
                                            f"it has: {shown or '(none)'}")
        sources = [by_name[t] for t in dict.fromkeys(args.tensor)]
    return f"input: {args.file} ({len(sources)} tensor{'s' if len(sources) != 1 else ''})", sources


def _report(args) -> int:
    picked, notes = R.resolve_schemes(args.schemes)
    title, sources = _inputs(args)

    from tqdm import tqdm

    quiet = args.json or args.no_progress or not sys.stderr.isatty()
    rows = []
    with tqdm(total=len(sources) * len(picked), disable=quiet, file=sys.stderr, leave=False,
              unit="scheme", desc="nqdq report") as bar:
        for src in sources:
            x, dtype_name, note = R.prepare_tensor(src)
            if note:
                notes.append(note)
            if x is None:
                bar.update(len(picked))
                continue
            r, n = R.report_tensor(src.name, x, picked, dtype_name=dtype_name, progress=None if quiet else bar)
            rows += r
            notes += n

    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=2))
        for n in notes:
            print(f"note: {R.printable(n)}", file=sys.stderr)
    else:
        print(title)
        print()
        if rows:
            print(R.format_report(rows))
        for n in notes:
            print(f"note: {R.printable(n)}")
    if not rows:
        print("nqdq report: no tensor could be quantized (see the notes)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
