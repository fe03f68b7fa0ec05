"""Values of one ``nqdq.gpu.quantize.plan`` knob side by side in one process: device time
per call (peers.py's method and table, every row checked against the NumPy reference) or
host time per ``nqdq.quantize`` call (launch_overhead.py's quantize rows).

    python3 benchmarks/knob_ab.py peers GRID_ONE_LAUNCH=0,1,0 --no-compile --sizes 64x7168,128x7168 --schemes fp8_tensor,nvfp4
    python3 benchmarks/knob_ab.py host GRID_ONE_LAUNCH=0,1,0 --schemes fp8_tensor,nvfp4 [--rows 64 --cols 7168 --calls 1000]
    python3 benchmarks/knob_ab.py peers ROW_UNITS_MAX=8,4,2,8 --no-compile --sizes 8192x8192 --schemes fp8_row
    python3 benchmarks/knob_ab.py peers ROW_NT_EXACT=1+ROW_UNITS_MAX=4,6 --no-compile --sizes 8192x8192 --schemes fp8_row

The knob takes each value in turn (repeat the first one last so that drift shows); plans
and nqdq.quantize's remembered runners are rebuilt at each switch (knobs are read when a
plan is built). Rows are tagged ``[KNOB=value]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


def parse_knob(spec):
    """'NAME=v1,v2' -> (NAME, [values]) with each value as the knob's current type;
    'A=1+B=2+NAME=v1,v2': A and B set once first, then NAME varied."""
    import nqdq.gpu.quantize.plan as KQ

    *fixed, spec = spec.split("+")
    for f in fixed:
        n, v = parse_knob(f)
        setattr(KQ, n, v[0])
    name, _, vals = spec.partition("=")
    if not hasattr(KQ, name):
        raise SystemExit(f"knob_ab: nqdq.gpu.quantize.plan has no knob {name!r}")
    cur = getattr(KQ, name)
    conv = (lambda v: v not in ("0", "false", "False")) if isinstance(cur, bool) else type(cur)
    return name, [conv(v) for v in vals.split(",")]


def set_knob(name, value):
    import nqdq.api
    import nqdq.gpu.quantize.plan as KQ

    setattr(KQ, name, value)
    KQ._PLANS.clear()
    if nqdq.api._FAST is not None:
        nqdq.api._FAST.clear()


def peers_main(name, values, argv):
    import peers

    orig = peers.bench_nqdq

    def ab(timer, scheme, xs, n_sets, groups, in_bytes, add, skip, log):
        for v in values:
            set_knob(name, v)
            tag = f" [{name}={v}]"
            orig(timer, scheme, xs, n_sets, groups, in_bytes,
                 lambda impl, *a, **k: add(impl + tag, *a, **k), lambda impl, why: skip(impl + tag, why), log)

    peers.bench_nqdq = ab
    return peers.main(argv)


def host_main(name, values, argv):
    import argparse

    import launch_overhead as LO
    from mx_ab import print_host_table

    ap = argparse.ArgumentParser()
    ap.add_argument("--schemes", default="fp8_tensor,nvfp4")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--cols", type=int, default=7168)
    ap.add_argument("--calls", type=int, default=1000)
    args = ap.parse_args(argv)
    results = []
    for v in values:
        set_knob(name, v)
        LO.bench_quantize(args.schemes.split(","), args.rows, args.cols, args.calls, f"{name}={v}", results)
    print_host_table(results, args.rows, args.cols)
    return 0


if __name__ == "__main__":
    what, knob, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    name, values = parse_knob(knob)
    sys.exit(peers_main(name, values, rest) if what == "peers" else host_main(name, values, rest))
