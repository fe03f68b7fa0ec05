"""The NumPy path (the reference, nqdq's CPU backend) on one large tensor, every scheme.

    python3 benchmarks/reference_cpu.py [--rows 4096] [--cols 7168] [--fused]

Times ``nqdq.quantize`` and ``nqdq.dequantize`` of a float32 [rows, cols] NumPy array per
scheme (best of two calls, after warm-up calls), stochastic fp8_row, ``nqdq.encode`` to e4m3
and, with ``--fused``, ``nqdq.fused.rmsnorm_quantize`` (fp8_row; mxfp4 with a residual).
To compare with another tree, run it with ``PYTHONPATH=<that tree>`` (the first line printed
names the nqdq it imported). CPU times vary from run to run on a shared machine: compare
two trees in the same minutes, more than once.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import nqdq

SCHEMES = ["fp8_row", "fp8_tensor", "fp8_1x128", "mxfp8", "mxfp4", "nvfp4", "int8_row", "int4_group",
           "int8_asym", "int8_centred"]


def best(f, n=2):
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        out = f()
        ts.append(time.perf_counter() - t)
    return min(ts), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=7168)
    ap.add_argument("--fused", action="store_true", help="also the fused RMSNorm ops")
    args = ap.parse_args()
    print(f"nqdq: {nqdq.__file__}")
    x = np.random.default_rng(0).standard_normal((args.rows, args.cols), dtype=np.float32)
    nqdq.quantize(x, "fp8_tensor")  # warm-up: the process's first large allocations
    nqdq.quantize(x, "int8_row")
    print(f"float32 {args.rows}x{args.cols}, seconds (best of two)")
    for s in SCHEMES:
        tq, q = best(lambda: nqdq.quantize(x, s))
        td, _ = best(lambda: nqdq.dequantize(q))
        print(f"  {s:14s} quantize {tq:6.2f}  dequantize {td:6.2f}", flush=True)
    t, _ = best(lambda: nqdq.quantize(x, "fp8_row", rounding="stochastic", seed=3))
    print(f"  {'fp8_row SR':14s} quantize {t:6.2f}")
    t, _ = best(lambda: nqdq.encode(x, "e4m3"))
    print(f"  {'encode e4m3':14s}          {t:6.2f}")
    if args.fused:
        w = np.random.default_rng(1).standard_normal(args.cols).astype(np.float32)
        for name, f in [("rmsnorm+fp8_row", lambda: nqdq.fused.rmsnorm_quantize(x, w, "fp8_row")),
                        ("rmsnorm+res+mxfp4", lambda: nqdq.fused.rmsnorm_quantize(x, w, "mxfp4", residual=x))]:
            f()
            t, _ = best(f)
            print(f"  {name:18s}  {t:6.2f}", flush=True)


if __name__ == "__main__":
    main()
