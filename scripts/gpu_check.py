#!/usr/bin/env python3
"""Everything the quantization kernels need checked on a GPU, in one call.

    python3 scripts/gpu_check.py            # on the GPU machine; full logs under $OUT

1. environment (GPU, driver, versions);
2. ``pytest -m gpu tests/test_kernels_gpu.py``: real sizes, CuPy in/out, bf16, ND, axes;
3. ``pytest tests/test_kernels.py`` with NQDQ_TEST_GPU=1: the simulator's bit-exact edge
   cases, now through the compiled kernels;
4. ``compute-sanitizer --tool memcheck`` over a small sweep of every kernel family
   (``--sweep`` runs that sweep alone, and checks it against the reference);
5. timings: bf16 4096 x 7168 per scheme, median of CUDA-event timings of the launch
   sequence (replayed through ``nqdq.gpu.runtime.launch`` prepared launches so host overhead
   stays off the GPU's critical path), next to a device-to-device copy;

and prints a short table last. ``--skip-small``, ``--skip-sanitizer``, ``--skip-bench``
leave parts out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.environ.get("OUT") or os.path.join(ROOT, "gpu_check_out")
SWEEP = [
    # the last-axis kernels (quantize.lastaxis) first: rows, groups, the NVFP4 tensor pass
    ("fp8_row", {}, (37, 304)),
    ("int8_row", {}, (5, 1000)),
    ("mxfp4", {}, (19, 256)),
    ("mxfp8", {}, (7, 96)),
    ("nvfp4", {}, (21, 96)),
    ("fp8_1x128", {}, (5, 384)),
    ("int4_group", {}, (3, 256)),
    # the earlier sweep (mostly the general kernels; mxfp6_e3m2 (9, 96) is last-axis)
    ("fp8_row", {}, (37, 300)),
    ("mxfp4", {}, (19, 200)),
    ("mxfp6_e3m2", {}, (9, 96)),
    ("nvfp4", {}, (21, 80)),
    ("fp8_1x128", {}, (5, 333)),
    ("fp8_128x128", {"block_shape": (16, 32)}, (40, 70)),
    ("fp8_tensor", {}, (13, 77)),
    ("int8_column", {}, (33, 45)),
    ("int4_group", {"group_size": 6}, (7, 50)),
    ("int8_centred", {"group_size": 24}, (11, 100)),
    ("int4_asym", {}, (9, 130)),
    ("e4m3", {"granularity": "row", "axis": 0}, (40, 9)),
    ("fp8_row", {}, (3, 9000)),
    # the one-pass paths on by default (asym rows / stat groups / tiles /
    # static encode); "scale" is a static per-tensor scale given to quantize
    ("int8_asym", {}, (5, 256)),
    ("int4_asym", {}, (9, 128)),
    ("int8_centred", {}, (11, 256)),
    ("fp8_128x128", {}, (130, 256)),
    ("fp8_tensor", {"static_scale": True, "scale": 0.05}, (7, 512)),
    # one launch at decode sizes (quantize.grid: blocks waiting for the grid's amax), many blocks
    ("fp8_tensor", {}, (64, 7168)),
    ("nvfp4", {}, (64, 7168)),
    ("fp8_tensor", {}, (3, 512)),
]
BENCH = ["fp8_row", "fp8_1x128", "fp8_128x128", "fp8_tensor", "mxfp8", "mxfp6_e3m2", "mxfp4", "nvfp4",
         "int8_row", "int8_column", "int4_group", "int8_centred", "int4_asym"]


def log_path(name):
    os.makedirs(OUT, exist_ok=True)
    return os.path.join(OUT, name)


def run(cmd, logname, env=None, timeout=None):
    """Run ``cmd`` with output to $OUT/<logname>; returns (rc, seconds, last line)."""
    t0 = time.time()
    with open(log_path(logname), "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        try:
            rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = 124
    with open(log_path(logname)) as fh:
        lines = [ln.strip() for ln in fh if ln.strip()]
    return rc, time.time() - t0, (lines[-1] if lines else "")


# --------------------------------------------------------------------------------- sweep
def sweep(part=0, parts=1):
    """Every kernel family once, small odd shapes, compared with the reference (run under
    compute-sanitizer by the main script). ``part`` of ``parts``: every parts-th case from
    the part-th, so several sanitizer processes can share the sweep."""
    os.environ.setdefault("NQDQ_TEST_GPU", "1")
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    sys.path.insert(0, ROOT)
    import cupy as cp
    import ml_dtypes
    import numpy as np

    import nqdq.gpu.quantize.plan as kq
    from nqdq.reference import quantize as ref
    from nqdq.reference.packing import pack_codes
    from nqdq.schemes import resolve_scheme
    from helpers.data import edge_data
    from helpers.kernels import assert_same

    bad = 0
    cases = SWEEP[part::parts]
    for name, kw, shape in cases:
        kw = dict(kw)
        scale = kw.pop("scale", None)
        sch = resolve_scheme(name, **kw)
        x = edge_data(shape, seed=len(name)).astype(ml_dtypes.bfloat16)
        for seed in (None, 5):
            try:
                got = kq.quantize(cp.asarray(x.view(np.uint16)), sch, dtype="bfloat16", seed=seed, scale=scale,
                                  out_fill=0xA5)  # fmt: skip
                want = ref.quantize(x.astype(np.float32), sch, seed=seed, scale=scale)
                wc = want.codes if sch.code_bits == 8 else pack_codes(want.codes, sch.code_bits)
                assert_same(got.codes.get(), wc, "codes")
                assert_same(got.scales.get(), want.scales, "scales")
                d = kq.dequantize(got, sch, shape)
                assert_same(d.get(), ref.dequantize(want, sch, shape), "dequantized", nan_equal=True)
                print(f"sweep {name} {kw} {shape} seed={seed}: ok", flush=True)
            except Exception as e:  # report and go on: the sanitizer log is the point
                bad += 1
                print(f"sweep {name} {kw} {shape} seed={seed}: FAILED {type(e).__name__}: {e}", flush=True)
    cp.cuda.runtime.deviceSynchronize()
    print(f"sweep: {len(cases) * 2 - bad} ok, {bad} failed")
    return 1 if bad else 0


# --------------------------------------------------------------------------------- bench
def bench(shape=(4096, 7168), reps=30, names=None):
    sys.path.insert(0, ROOT)
    import cupy as cp
    import numpy as np

    import nqdq.gpu.quantize.plan as kq
    from nqdq.schemes import resolve_scheme

    rows, cols = shape
    rng = np.random.default_rng(0)
    x = cp.asarray((rng.standard_normal(shape, dtype=np.float32) * 2).view(np.uint32) >> 16).astype(cp.uint16)
    stream = cp.cuda.Stream(non_blocking=True)
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()

    def time_it(fn):
        fn()
        stream.synchronize()
        ts = []
        for _ in range(reps):
            e0.record(stream)
            fn()
            e1.record(stream)
            e1.synchronize()
            ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
        return float(np.median(ts))

    def time_batch(fn, batch=20):
        fn()
        stream.synchronize()
        ts = []
        for _ in range(max(3, reps // 4)):
            e0.record(stream)
            for _ in range(batch):
                fn()
            e1.record(stream)
            e1.synchronize()
            ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / batch)
        return float(np.median(ts))

    # device-to-device copy of the same bytes as a bf16 read + fp8 write
    nb = rows * cols * 3
    src = cp.empty(nb // 2, cp.uint8)
    dst = cp.empty_like(src)
    with stream:
        copy_us = time_it(lambda: dst.__setitem__(Ellipsis, src))
    copy_gbs = 2 * src.nbytes / copy_us / 1e3
    results = [dict(scheme="d2d copy", us=copy_us, gbs=copy_gbs, pct=100.0, launches=1)]

    import ml_dtypes

    from nqdq.reference import quantize as ref
    from nqdq.reference.packing import pack_codes

    x_small = x[:64]
    xs_host = x_small.get().view(ml_dtypes.bfloat16).astype(np.float32)
    for name in names or BENCH:
        sch = resolve_scheme(name)
        # bit-exactness on the first 64 rows (same compiled kernels as the timed call)
        got = kq.quantize(x_small, sch, dtype="bfloat16")
        want = ref.quantize(xs_host, sch)
        wc = want.codes if sch.code_bits == 8 else pack_codes(want.codes, sch.code_bits)
        exact = bool(np.array_equal(got.codes.get().view(np.uint8), wc.view(np.uint8))
                     and np.array_equal(got.scales.get().view(np.uint8), np.asarray(want.scales).view(np.uint8)))
        # the plan's generated CuPy runner (one pack + cuLaunchKernel per kernel), timed as
        # BATCH back-to-back calls between two events: its host time per call (tens of us)
        # stays under the device time, so the events measure the kernels
        from nqdq.gpu.runtime.interop import device_input

        xin = device_input(x, "x", "bfloat16")
        plan = kq.get_plan(tuple(shape), xin.kind, sch)
        runner = plan.cupy_runner()
        if runner is not None:
            fn = lambda: runner(xin.arr)  # noqa: E731
            how = "plan runner"
        else:
            fn = lambda: kq.quantize(x, sch, dtype="bfloat16")  # noqa: E731
            how = "kq.quantize"
        with stream:
            parts = kq.quantize(x, sch, dtype="bfloat16")
            stream.synchronize()
            out_bytes = sum(int(a.nbytes) for a in (parts.codes, parts.scales, parts.zero_points, parts.means)
                            if a is not None)
            moved = rows * cols * 2 + out_bytes
            us = time_batch(fn)
            t0 = time.perf_counter()
            for _ in range(10):
                kq.quantize(x, sch, dtype="bfloat16")
            stream.synchronize()
            call_us = (time.perf_counter() - t0) / 10 * 1e6
        per_kernel = []
        rec = plan.launches
        gbs = moved / us / 1e3
        results.append(dict(scheme=name, us=us, gbs=gbs, pct=100 * gbs / copy_gbs, launches=len(rec),
                            call_us=call_us, how=how, per_kernel=per_kernel, exact=exact))
        print(f"bench {name}: {'bit-exact' if exact else 'MISMATCH vs reference'}, {us:.1f} us, {gbs:.0f} GB/s ({100 * gbs / copy_gbs:.0f}% of copy), "
              f"{len(rec)} launches ({how}{'; ' + ', '.join(per_kernel) if per_kernel else ''}), "
              f"end-to-end call {call_us:.0f} us", flush=True)
    with open(log_path(f"bench_{rows}x{cols}.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    return results


def print_bench_table(shape, results):
    print(f"\n{'bf16 %dx%d' % shape:16s} {'us':>8s} {'GB/s':>7s} {'% copy':>7s} {'launches':>8s} {'call us':>8s} exact")
    for r in results:
        print(f"{r['scheme']:16s} {r['us']:8.1f} {r['gbs']:7.0f} {r['pct']:7.0f} {r['launches']:8d} "
              f"{r.get('call_us', 0):8.0f} {r.get('exact', '')}")


# --------------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", action="store_true", help="run the small kernel sweep only (for the sanitizer)")
    ap.add_argument("--part", default="0/1", help="with --sweep: I/N runs every N-th case from the I-th")
    ap.add_argument("--bench", action="store_true", help="run the timings only")
    ap.add_argument("--schemes", default="", help="comma-separated schemes for --bench (default: all)")
    ap.add_argument("--shapes", default="4096x7168", help="comma-separated ROWSxCOLS for --bench")
    ap.add_argument("--skip-small", action="store_true")
    ap.add_argument("--skip-sanitizer", action="store_true")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--pytest-args", default="", help="extra pytest arguments for both pytest steps")
    ap.add_argument("--small-k", default="", help="-k filter for the compiled run of tests/test_kernels.py")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds; later steps are skipped or cut to fit")
    args = ap.parse_args()
    if args.sweep:
        i, n = (int(v) for v in args.part.split("/"))
        return sweep(i, n)
    if args.bench:
        names = [n for n in args.schemes.split(",") if n] or None
        for sh in args.shapes.split(","):
            shape = tuple(int(v) for v in sh.lower().split("x"))
            print_bench_table(shape, bench(shape, names=names))
        return 0

    env = dict(os.environ, NQDQ_TEST_GPU="1", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    table = []
    t_all = time.time()

    info = []
    for cmd in (["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                [sys.executable, "-c", "import numpy, numba, numba.cuda, cupy; print('numpy', numpy.__version__, "
                 "'numba', numba.__version__, 'cupy', cupy.__version__)"]):
        try:
            info.append(subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip())
        except Exception as e:
            info.append(f"{cmd[0]}: {e}")
    with open(log_path("env.txt"), "w") as fh:
        fh.write("\n".join(info) + "\n")
    print("\n".join(info), flush=True)

    pa = args.pytest_args.split()
    left = lambda: args.budget - (time.time() - t_all)  # noqa: E731
    rc, dt, last = run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/test_kernels_gpu.py", "-p", "no:cacheprovider", *pa],
                       "pytest_gpu.log", env=env, timeout=max(60, left() - 60))
    table.append(("pytest -m gpu tests/test_kernels_gpu.py", rc, dt, last))
    print(f"gpu tests: rc={rc} {dt:.0f}s {last}", flush=True)

    results = []
    if not args.skip_bench:
        try:
            results = bench()
        except Exception as e:
            table.append(("bench", 1, 0.0, f"{type(e).__name__}: {e}"))

    if not args.skip_sanitizer and left() > 60:
        san = shutil.which("compute-sanitizer") or next(
            (p for p in ("/usr/local/cuda/bin/compute-sanitizer", "/opt/nvidia/compute-sanitizer/compute-sanitizer")
             if os.path.exists(p)), None)
        if san is None:
            table.append(("compute-sanitizer memcheck", "n/a", 0.0, "compute-sanitizer not found"))
        else:
            # --report-api-errors no: the CUDA bindings probe driver entry points with
            # cuGetProcAddress at start-up, which returns "invalid value" by design
            rc, dt, last = run([san, "--tool", "memcheck", "--report-api-errors", "no", "--error-exitcode", "99",
                                "--print-limit", "20",
                                sys.executable, os.path.abspath(__file__), "--sweep"], "sanitizer_memcheck.log",
                               env=env, timeout=max(30, left() - 30))
            table.append(("compute-sanitizer memcheck (sweep)", rc, dt, last))
        print(f"sanitizer: {table[-1]}", flush=True)

    if not args.skip_small and left() > 60:
        kf = ["-k", args.small_k] if args.small_k else []
        rc, dt, last = run([sys.executable, "-m", "pytest", "-q", "tests/test_kernels.py", "-p", "no:cacheprovider", *kf, *pa],
                           "pytest_small_compiled.log", env=env, timeout=max(30, left() - 20))
        table.append(("tests/test_kernels.py, compiled" + (f" -k {args.small_k!r}" if kf else ""), rc, dt, last))
        print(f"small cases compiled: rc={rc} {dt:.0f}s {last}", flush=True)

    print("\n== nqdq kernels on the GPU ==")
    for what, rc, dt, last in table:
        print(f"{what:42s} rc={rc!s:4s} {dt:6.0f}s  {last[:90]}")
    if results:
        print(f"\n{'bf16 4096x7168':14s} {'us':>8s} {'GB/s':>7s} {'% copy':>7s} {'launches':>8s} {'call us':>8s} exact")
        for r in results:
            print(f"{r['scheme']:14s} {r['us']:8.1f} {r['gbs']:7.0f} {r['pct']:7.0f} {r['launches']:8d} "
                  f"{r.get('call_us', 0):8.0f} {r.get('exact', '')}")
    print(f"\ntotal {time.time() - t_all:.0f}s; logs in {OUT}")
    return 0 if all(rc in (0, "n/a") for _, rc, _, _ in table) else 1


if __name__ == "__main__":
    sys.exit(main())
