"""Host time per ``nqdq.quantize`` call, this tree against another, in ONE process.

    python3 benchmarks/tree_ab.py --old build/adhoc/old [--schemes fp8_row,nvfp4] [--rows 64 --cols 7168]
        [--rounds 30] [--calls 500] [--cpu] [--json FILE]
    python3 benchmarks/tree_ab.py --env NQDQ_FAST_LAUNCH=0,1 [--schemes ...] [...]

Two trees timed in separate processes differ by the host's drift: on lent machines of one
kind a process's 64x7168 call ran anywhere from 8 to 18 us within minutes
(docs/design/launch-path.md, "Measured"), far more than a change to the host path moves
it. Here the other tree's ``nqdq`` (``--old``: a directory holding ``nqdq/``, e.g. ``git
archive REV nqdq | tar -x -C DIR``) is loaded beside this one as package ``nqdq_old`` (every import inside
``nqdq`` is relative, so the two share nothing but NumPy, Numba and CuPy). Both trees must
give the same codes and scales, checked first. Then, for ``rounds`` rounds, each scheme
is timed in blocks of ``calls`` single calls (``perf_counter`` around each; the device is
synchronized, untimed, every 100 calls so a call never waits for room in the launch queue),
old then new in even rounds, new then old in odd ones. Printed: each tree's median of its
block medians, the median of the rounds' differences (new - old) and in how many rounds the
new tree was slower.

bf16 input from CuPy (a uint16 view, ``dtype="bfloat16"``) on the current GPU, or with
``--cpu`` NumPy bfloat16 on the reference (no GPU needed; the same method for the NumPy path).

``--env NAME=OLD,NEW`` A/Bs an environment setting instead of a tree: this tree imported twice,
``nqdq_old`` with NAME=OLD and ``nqdq`` with NAME=NEW (a setting read at import, such as
``NQDQ_GPU_BACKEND``, needs the two imports). NAME holds each
tree's value while it imports and around each of its blocks of calls (set outside the timed
calls), so settings read at call time follow it too.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def absolute_imports(pkg):
    """``(file, line)`` of each ``import nqdq...`` / ``from nqdq... import`` inside package
    directory ``pkg``: loaded as another name, such a tree would run those modules from the
    ``nqdq`` already imported (this tree's), and the A/B would not compare the two."""
    pat = re.compile(r"^[ \t]*(?:from|import)[ \t]+nqdq(?:\.|\s|$)", re.M)
    return [(str(f), src[: m.start()].count("\n") + 1) for f in sorted(Path(pkg).rglob("*.py"))
            for src in [f.read_text()] for m in pat.finditer(src)]


def load_tree(root, name="nqdq_old"):
    """The package ``root``/nqdq imported as ``name`` (beside this tree's ``nqdq``)."""
    pkg = Path(root).resolve() / "nqdq"
    if not (pkg / "__init__.py").is_file():
        raise SystemExit(f"--old {root}: no nqdq/__init__.py there")
    bad = absolute_imports(pkg)
    if bad:
        raise SystemExit(f"{pkg} imports nqdq by its absolute name ({bad[0][0]}:{bad[0][1]}, {len(bad)} in all): "
                         "loaded beside this tree it would run this tree's modules")
    spec = importlib.util.spec_from_file_location(name, pkg / "__init__.py", submodule_search_locations=[str(pkg)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def env(name, value):
    """``os.environ[name] = value`` inside the block, restored after (``name`` None: nothing)."""
    if name is None:
        yield
        return
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def parse_env(spec):
    """'NAME=OLD,NEW' -> (NAME, {"old": OLD, "new": NEW})."""
    name, _, values = spec.partition("=")
    values = values.split(",")
    if not name or len(values) != 2:
        raise SystemExit(f"--env {spec}: give NAME=OLD,NEW")
    return name, dict(old=values[0], new=values[1])


def _bytes(a):
    import numpy as np

    a = a.get() if hasattr(a, "get") else np.asarray(a)
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8).tobytes()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--old", help="a directory holding the other tree's nqdq/")
    what.add_argument("--env", metavar="NAME=OLD,NEW", help="this tree twice, with NAME=OLD and with NAME=NEW")
    ap.add_argument("--schemes", default="fp8_row,fp8_tensor,nvfp4,mxfp4")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--cols", type=int, default=7168)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--cpu", action="store_true", help="NumPy input on the reference instead of CuPy on the GPU")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import ml_dtypes
    import numpy as np

    name, setting = parse_env(args.env) if args.env else (None, dict(old=None, new=None))
    with env(name, setting["new"]):
        import nqdq as new
    with env(name, setting["old"]):
        old = load_tree(args.old or HERE.parent)
    if args.old and Path(new.__file__).resolve() == Path(old.__file__).resolve():
        raise SystemExit(f"--old {args.old} is this tree")
    trees = {"old": old, "new": new}
    for t in ("new", "old"):
        print(f"{t}: {trees[t].__file__}" + (f" with {name}={setting[t]}" if name else ""), flush=True)

    def call(t, s):
        with env(name, setting[t]):
            return trees[t].quantize(x, s, dtype=dtype)

    xh = np.random.default_rng(32).standard_normal((args.rows, args.cols), dtype=np.float32).astype(ml_dtypes.bfloat16)
    if args.cpu:
        x, sync = xh, (lambda: None)
    else:
        import cupy as cp

        x, sync = cp.asarray(xh.view(np.uint16)), cp.cuda.get_current_stream().synchronize
    dtype = None if args.cpu else "bfloat16"
    schemes = [s for s in args.schemes.split(",") if s]

    for s in schemes:
        a, b = (call(t, s) for t in ("new", "old"))
        for _ in range(100 if args.cpu else 300):  # warm-up: plans, hot paths, clocks
            call("new", s)
            call("old", s)
        sync()
        same = _bytes(a.codes) == _bytes(b.codes) and _bytes(a.scales) == _bytes(b.scales)
        print(f"{s}: codes and scales identical in both trees: {same}", flush=True)
        if not same:
            raise SystemExit(f"{s}: the trees disagree; an A/B of their host time would compare different work")

    pc = time.perf_counter

    def block(q, s):
        ts = []
        for i in range(args.calls):
            if i % 100 == 0:
                sync()
            t0 = pc()
            q(x, s, dtype=dtype)
            ts.append(pc() - t0)
        sync()
        return statistics.median(ts) * 1e6

    res = {(s, t): [] for s in schemes for t in trees}
    for r in range(args.rounds):
        for s in schemes:
            for t in (("old", "new") if r % 2 == 0 else ("new", "old")):
                with env(name, setting[t]):
                    res[(s, t)].append(block(trees[t].quantize, s))

    where = "NumPy, the reference" if args.cpu else "CuPy, the GPU"
    if name:
        where += f"; old {name}={setting['old']}, new {name}={setting['new']}"
    print(f"\n| {args.rows}x{args.cols} bf16 ({where}), {args.rounds} rounds of {args.calls} calls, alternating "
          "| old median (us) | new median (us) | new - old, median of the round pairs (us) | rounds new slower |")
    print("|---|---:|---:|---:|---:|")
    rows = []
    for s in schemes:
        o, n = res[(s, "old")], res[(s, "new")]
        d = [b - a for a, b in zip(o, n)]
        row = dict(scheme=s, old=statistics.median(o), new=statistics.median(n), diff=statistics.median(d),
                   new_slower=sum(v > 0 for v in d), rounds=args.rounds, old_blocks=o, new_blocks=n)
        rows.append(row)
        print(f"| {s} | {row['old']:.2f} | {row['new']:.2f} | {row['diff']:+.2f} "
              f"| {row['new_slower']} of {args.rounds} |")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(rows=rows, shape=[args.rows, args.cols], cpu=args.cpu, env=args.env),
                                              indent=1))


if __name__ == "__main__":
    main()
