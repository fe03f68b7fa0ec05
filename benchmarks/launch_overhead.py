"""Host time per kernel launch: Numba's dispatcher vs nqdq.gpu.runtime.launch.FastKernel.

    python3 benchmarks/launch_overhead.py [--json FILE] [--rows 64 --cols 7168] [--calls 1000]
    python3 benchmarks/launch_overhead.py --quantize-only [--schemes fp8_row,mxfp4,...] [--label L] [--ab]
        [--rounds 5 [--rounds-only]]

The kernel is the toy per-row FP8 quantizer (benchmarks/toy_fp8_row.py) on a bf16
``rows x cols`` activation (64 x 7168: a decode step), CuPy arguments, legacy default
stream. For each launch path: warm-up (compilation, module load) excluded, then
``calls`` launches timed with ``time.perf_counter``; ``host us/call`` is the loop alone,
``+sync us/call`` includes the final synchronize (when the device is slower than the host
this is device time). Graph rows: one launch captured in a CUDA graph (CuPy), replayed;
and 100 launches captured in one graph, per launch. The device time of one launch is
measured with events over a graph of 100 launches.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")  # 64 blocks: no warning per call

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, os.environ.get("NQDQ_BENCH_ROOT") or str(HERE.parent))  # another nqdq tree: "before" rows


def host_time(fn, calls, sync, warm=50):
    for _ in range(warm):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    sync()
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6


def host_median(fn, calls, sync, sync_every=100):
    """Median host time of ``calls`` calls, each timed on its own (``perf_counter`` around
    the call; the device works in the background). The device is synchronized, untimed,
    every ``sync_every`` calls, so that a call never waits for room in the launch queue:
    where the device takes longer per call than the host (nvfp4's three kernels), an
    unsynchronized loop would time the device instead."""
    import statistics

    pc = time.perf_counter
    ts = []
    sync()
    for i in range(calls):
        t0 = pc()
        fn()
        ts.append(pc() - t0)
        if i % sync_every == sync_every - 1:
            sync()
    sync()
    return statistics.median(ts) * 1e6


def graph_replay_us(cp, graph, stream, replays, per=1, skip=0):
    """Device time of a CUDA graph's replay on ``stream``: CUDA events around each of
    ``replays`` replays, us, divided by ``per`` (the calls the graph holds); the median of
    the replays after the first ``skip``."""
    import numpy as np

    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(replays):
        e0.record(stream)
        graph.launch(stream)
        e1.record(stream)
        e1.synchronize()
        times.append(cp.cuda.get_elapsed_time(e0, e1) * 1000 / per)
    return float(np.median(times[skip:]))


def print_profile(fn, calls, sync, title, *, stats, lines):
    """cProfile ``calls`` calls of ``fn`` and print the top functions by own time."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    sync()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(stats)
    print(f"profile of {calls} {title}, by own time:")
    print("\n".join(text.getvalue().splitlines()[:lines]))


def _same_parts(q, ref):
    """Every output of ``q`` (CuPy or NumPy) the same bits, shape and dtype as ``ref``'s."""
    import numpy as np

    for f in ("codes", "scales", "zero_points", "tensor_scale", "means"):
        g, w = getattr(q, f), getattr(ref, f)
        if (g is None) != (w is None):
            return False
        if g is None:
            continue
        g = g.get() if hasattr(g, "get") else np.asarray(g)
        w = np.asarray(w)  # bit patterns, flattened (a 0-d view cannot change itemsize)
        if g.shape != w.shape or g.dtype != w.dtype or not np.array_equal(
            g.reshape(-1).view(np.uint8), w.reshape(-1).view(np.uint8)
        ):
            return False
    return True


def bench_quantize(schemes, rows, cols, calls, label, results, graphs=True):
    """``nqdq.quantize(x, scheme, dtype="bfloat16")`` on a CuPy uint16 ``rows x cols`` array,
    end to end: host us per call over ``calls`` calls after 50 warm-up calls; each result
    checked bit for bit against the NumPy reference first; with ``graphs``, the call
    captured in a CUDA graph and replayed on new data (checked again), and the replay's
    host time."""
    import cupy as cp
    import ml_dtypes
    import numpy as np

    import nqdq

    rng = np.random.default_rng(0)

    def act():
        x = rng.standard_normal((rows, cols)) * np.exp2(rng.uniform(-6, 6, (rows, 1)))
        return x.astype(ml_dtypes.bfloat16)

    sync = cp.cuda.runtime.deviceSynchronize
    for scheme in schemes:
        try:
            xh = act()
            x = cp.asarray(xh.view(np.uint16))
            ref = nqdq.quantize(xh, scheme, device="cpu")
            q = nqdq.quantize(x, scheme, dtype="bfloat16")
            ok1 = _same_parts(q, ref)
            q = nqdq.quantize(x, scheme, dtype="bfloat16")
            sync()
            ok = ok1 and _same_parts(q, ref)
            print(f"check {label} {scheme}: {'bit-exact vs reference' if ok else 'MISMATCH'}", flush=True)
            results.append(dict(path=f"check {label} nqdq.quantize {scheme}", ok=bool(ok)))
            h, hs = host_time(lambda: nqdq.quantize(x, scheme, dtype="bfloat16"), calls, sync)
            hm = host_median(lambda: nqdq.quantize(x, scheme, dtype="bfloat16"), calls, sync)
            results.append(dict(path=f"{label}: nqdq.quantize {scheme}", host_us=h, host_sync_us=hs, host_median_us=hm))
            print(f"{label}: nqdq.quantize {scheme:10s} host {h:8.2f} us/call   +sync {hs:8.2f} us/call   "
                  f"median of {calls} single calls {hm:8.2f} us", flush=True)
            fq = _remembered(nqdq, scheme)
            run = getattr(fq, "run", None)
            if run is not None:  # the plan's generated function alone (no argument handling, no result object)
                hr = host_median(lambda: run(x), calls, sync)
                results.append(dict(path=f"{label}: plan runner alone {scheme}", host_median_us=hr,
                                    fast_arrays=getattr(run, "fast_arrays", None)))  # fmt: skip
                print(f"{label}: plan runner  {scheme:10s} median of {calls} single calls {hr:8.2f} us "
                      f"(arrays by {'base __new__ + _init' if getattr(run, 'fast_arrays', False) else 'cupy.ndarray()'})",
                      flush=True)  # fmt: skip
            if not graphs:
                continue
            s = cp.cuda.Stream(non_blocking=True)
            with s:
                nqdq.quantize(x, scheme, dtype="bfloat16")  # warm this stream's memory pool
                s.synchronize()
                s.begin_capture()
                qg = nqdq.quantize(x, scheme, dtype="bfloat16")
                g = s.end_capture()
            xh2 = act()
            with s:  # s is non-blocking: null-stream work would be unordered with the replay
                x[...] = cp.asarray(xh2.view(np.uint16))
                qg.codes.fill(0xA5)
            g.launch(s)
            s.synchronize()
            okg = _same_parts(qg, nqdq.quantize(xh2, scheme, device="cpu"))
            print(f"check {label} graph replay {scheme}: {'bit-exact vs reference' if okg else 'MISMATCH'}", flush=True)
            results.append(dict(path=f"check {label} graph {scheme}", ok=bool(okg)))
            h, hs = host_time(lambda: g.launch(s), calls, s.synchronize)
            results.append(dict(path=f"{label}: graph of nqdq.quantize {scheme}, replay", host_us=h, host_sync_us=hs))
            print(f"{label}: graph replay {scheme:10s} host {h:8.2f} us/call   +sync {hs:8.2f} us/call", flush=True)
            dev = graph_replay_us(cp, g, s, 20)
            results.append(dict(path=f"{label}: device us per call {scheme} (graph replay, events)", device_us=dev))
            print(f"{label}: device time {scheme:10s} {dev:8.2f} us (graph replay, median of 20)", flush=True)
        except Exception as e:  # report and go on with the next scheme
            import traceback

            traceback.print_exc()
            print(f"{label} {scheme}: {type(e).__name__}: {e}", flush=True)
            results.append(dict(path=f"{label} {scheme} error", error=f"{type(e).__name__}: {e}"))
    if graphs:  # where the remaining host time goes
        try:
            scheme = schemes[0]
            print_profile(lambda: nqdq.quantize(x, scheme, dtype="bfloat16"), 2000, sync,
                          f"{label} nqdq.quantize {scheme} calls", stats=15, lines=36)
        except Exception as e:
            print(f"profile: {type(e).__name__}: {e}")


def _remembered(nqdq, scheme):
    """The remembered fast-path function of the last ``nqdq.quantize(x, scheme, ...)`` (or None)."""
    try:
        from nqdq import api
    except ImportError:
        return None
    fast = getattr(api, "_FAST", None) or {}
    for key in reversed(list(fast)):
        if key[0] == scheme:
            return fast[key]
    return None


_FUNCTION_HANDLES = {}  # id(entry) -> (entry, its CUfunction handle)


def _set_launch_variant(handles, param_buffer):
    """Every compiled entry launches its CUfunction (``handles="function"``) or Numba's
    CUkernel (``"kernel"``); sequences pass a void*[] or one buffer; the quantize plans and
    remembered calls are dropped so that their runners are generated again that way (the
    kernels stay compiled)."""
    from nqdq import api
    from nqdq.gpu.runtime import launch
    from nqdq.gpu.quantize import plan as kq

    for fk in list(launch._by_dispatcher.values()) + list(launch._by_id.values()):
        for e in list(fk._entries.values()):
            if isinstance(e, launch._Entry):
                fn = _FUNCTION_HANDLES.setdefault(id(e), (e, e.handle))[1]
                e.handle = fn if handles == "function" else e.kernel_handle
    launch.PARAM_BUFFER = param_buffer
    kq._PLANS.clear()
    api.clear_fast_path()


def bench_ab(schemes, rows, cols, calls, results):
    """The launch variants A/B/C/A in one process (no compilation between them): CUfunction
    + void*[] (the default), CUkernel + void*[], CUfunction + one parameter buffer; per
    variant and scheme a bit-exactness check, then the median of ``calls`` single calls."""
    import cupy as cp
    import ml_dtypes
    import numpy as np

    import nqdq

    rng = np.random.default_rng(3)
    xh = (rng.standard_normal((rows, cols)) * np.exp2(rng.uniform(-6, 6, (rows, 1)))).astype(ml_dtypes.bfloat16)
    x = cp.asarray(xh.view(np.uint16))
    refs = {s: nqdq.quantize(xh, s, device="cpu") for s in schemes}
    sync = cp.cuda.runtime.deviceSynchronize
    variants = [("CUfunction, void*[]", "function", False), ("CUkernel, void*[]", "kernel", False),
                ("CUfunction, one buffer", "function", True), ("CUfunction, void*[] (again)", "function", False)]
    for vname, handles, pb in variants:
        _set_launch_variant(handles, pb)
        for scheme in schemes:
            q = nqdq.quantize(x, scheme, dtype="bfloat16")
            q = nqdq.quantize(x, scheme, dtype="bfloat16")
            sync()
            ok = _same_parts(q, refs[scheme])
            for _ in range(50):
                nqdq.quantize(x, scheme, dtype="bfloat16")
            hm = host_median(lambda: nqdq.quantize(x, scheme, dtype="bfloat16"), calls, sync)
            results.append(dict(path=f"A/B {vname}: nqdq.quantize {scheme}", host_median_us=hm, ok=bool(ok)))
            print(f"A/B {vname:28s} {scheme:10s} {'bit-exact' if ok else 'MISMATCH'}  median {hm:7.2f} us", flush=True)
    _set_launch_variant("function", False)


def bench_rounds(schemes, rows, cols, calls, rounds, label, results, warm_s=2.0):
    """Steady state: ``nqdq.quantize`` of every scheme called for ``warm_s`` seconds in turn
    (the host's and the GPU's clocks come up; the single-call rows above start cold and
    their first schemes read up to 1.5x higher in an H100 run), then ``rounds``
    rounds, each timing every scheme in turn: the median of ``calls`` single calls
    (``host_median``) and the unsynchronized loop with its final synchronize (host and
    device, ``host_time``). Each result is checked bit for bit first. Prints per scheme
    every round's figures, their median and their maximum."""
    import statistics

    import cupy as cp
    import ml_dtypes
    import numpy as np

    import nqdq

    rng = np.random.default_rng(5)
    xh = (rng.standard_normal((rows, cols)) * np.exp2(rng.uniform(-6, 6, (rows, 1)))).astype(ml_dtypes.bfloat16)
    x = cp.asarray(xh.view(np.uint16))
    sync = cp.cuda.runtime.deviceSynchronize
    fns = {}
    for scheme in schemes:
        fn = fns[scheme] = functools.partial(nqdq.quantize, x, scheme, dtype="bfloat16")
        ok = _same_parts(fn(), nqdq.quantize(xh, scheme, device="cpu"))
        results.append(dict(path=f"check {label} rounds {scheme}", ok=bool(ok)))
        print(f"check {label} rounds {scheme}: {'bit-exact vs reference' if ok else 'MISMATCH'}", flush=True)
    t_end = time.perf_counter() + warm_s
    while time.perf_counter() < t_end:
        for fn in fns.values():
            for _ in range(100):
                fn()
            sync()
    med = {s: [] for s in schemes}
    loop = {s: [] for s in schemes}
    for _ in range(rounds):
        for scheme, fn in fns.items():
            med[scheme].append(host_median(fn, calls, sync))
            loop[scheme].append(host_time(fn, calls, sync, warm=10)[1])
    print(f"\n| {label}: nqdq.quantize {rows}x{cols} bf16, steady state ({warm_s:g} s warm-up), {rounds} rounds | "
          f"median of {calls} single calls, per round (us) | their median | max | loop of {calls} + sync, per call, per round (us) | their median |")
    print("|---|---|---:|---:|---|---:|")
    for scheme in schemes:
        m, lp = med[scheme], loop[scheme]
        results.append(dict(path=f"{label}: steady nqdq.quantize {scheme}", round_medians_us=m, round_loop_sync_us=lp))
        print(f"| {scheme} | {' '.join(f'{v:.2f}' for v in m)} | {statistics.median(m):.2f} | {max(m):.2f} | "
              f"{' '.join(f'{v:.2f}' for v in lp)} | {statistics.median(lp):.2f} |", flush=True)


def quantize_main(args):
    results = []
    schemes = args.schemes.split(",")
    if args.rounds:  # first, while the process is young: its own warm-up
        bench_rounds(schemes, args.rows, args.cols, args.calls, args.rounds, args.label, results)
        if args.rounds_only:
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1))
            return 0
    bench_quantize(schemes, args.rows, args.cols, args.calls, args.label, results, graphs=not args.no_graphs)
    if args.ab:
        try:
            bench_ab(schemes, args.rows, args.cols, args.calls, results)
        except Exception as e:
            import traceback

            traceback.print_exc()
            print(f"A/B: {type(e).__name__}: {e}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print()
    print(f"| {args.label}: nqdq.quantize, {args.rows}x{args.cols} bf16 (CuPy uint16) | host us/call | us/call incl. sync | median of single calls |")
    print("|---|---:|---:|---:|")
    for r in results:
        if "host_us" in r:
            med = f"{r['host_median_us']:.2f}" if "host_median_us" in r else ""
            print(f"| {r['path']} | {r['host_us']:.2f} | {r['host_sync_us']:.2f} | {med} |")
        elif "host_median_us" in r:
            print(f"| {r['path']} | | | {r['host_median_us']:.2f} |")
        elif "ok" in r:
            print(f"| {r['path']} | {'ok' if r['ok'] else 'MISMATCH'} | |")
        elif "device_us" in r:
            print(f"| {r['path']} | - | {r['device_us']:.2f} |")
        else:
            print(f"| {r['path']} | {r.get('error', '')[:60]} | |")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quantize-only", action="store_true", help="only the nqdq.quantize end-to-end rows")
    ap.add_argument("--schemes", default="fp8_row,mxfp4,nvfp4,fp8_1x128")
    ap.add_argument("--label", default="nqdq")
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--ab", action="store_true", help="with --quantize-only: the launch variants A/B/C/A")
    ap.add_argument("--rounds", type=int, default=0,
                    help="with --quantize-only: first the steady-state rounds (warm-up, then every scheme per round)")
    ap.add_argument("--rounds-only", action="store_true", help="with --rounds: only those")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--cols", type=int, default=7168)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.quantize_only:
        return quantize_main(args)

    import cupy as cp
    import ml_dtypes
    import numpy as np

    import nqdq
    import toy_fp8_row
    from nqdq.gpu.runtime import launch
    from nqdq.gpu.runtime.launch import FastKernel

    rows, cols = args.rows, args.cols
    rng = np.random.default_rng(0)
    xh = (rng.standard_normal((rows, cols)) * np.exp2(rng.uniform(-4, 4, (rows, 1)))).astype(ml_dtypes.bfloat16)
    x = cp.asarray(xh.view(np.uint16))
    codes = cp.full((rows, cols), 0xA5, cp.uint8)
    scales = cp.full(rows, np.nan, cp.float32)
    grid, block, kargs = toy_fp8_row.launch_args(x, codes, scales)
    sync = cp.cuda.runtime.deviceSynchronize
    k = toy_fp8_row.fp8_row_bf16
    fk = FastKernel(k)
    configured = fk[grid, block]
    results = []

    def row(name, fn, calls=args.calls):
        h, hs = host_time(fn, calls, sync)
        results.append(dict(path=name, host_us=h, host_sync_us=hs))
        print(f"{name:46s} host {h:8.2f} us/call   +sync {hs:8.2f} us/call", flush=True)

    # correctness first: both paths, poisoned outputs, vs the NumPy reference
    ref = nqdq.quantize(xh, "fp8_row", device="cpu")
    for name, fn in (("numba", lambda: k[grid, block](*kargs)), ("fast", lambda: fk.launch(grid, block, kargs))):
        codes.fill(0xA5)
        scales.fill(np.nan)
        fn()
        sync()
        ok = np.array_equal(codes.get(), ref.codes.view(np.uint8)) and np.array_equal(
            scales.get().view(np.uint32), ref.scales.reshape(-1).view(np.uint32)
        )
        print(f"check {name}: {'bit-exact vs reference' if ok else 'MISMATCH'}")
        results.append(dict(path=f"check {name}", ok=bool(ok)))

    row("numba kernel[grid, block](*args)", lambda: k[grid, block](*kargs))
    row("FastKernel.launch(grid, block, args)", lambda: fk.launch(grid, block, kargs))
    row("FastKernel[grid, block](*args)", lambda: configured(*kargs))
    prepared = fk.prepare(grid, block, kargs)
    row("PreparedLaunch()", prepared)

    # floors: the driver call alone, through cuda.bindings and through CuPy's driver module
    entry = fk.compile(kargs)
    buf, ptrs, addr = entry.new_buffer()
    entry.pack(buf, kargs)
    cu = launch._cu_launch
    h = entry.handle
    row("cuda.bindings cuLaunchKernel (pre-packed)", lambda: cu(h, grid, 1, 1, block, 1, 1, 0, 0, addr, 0))
    try:
        from cupy.cuda import driver as cpdrv

        lk = cpdrv.launchKernel
        row("cupy driver.launchKernel (pre-packed)", lambda: lk(h, grid, 1, 1, block, 1, 1, 0, 0, addr, 0))
    except Exception as e:
        print(f"cupy driver.launchKernel: {type(e).__name__}: {e}")

    # where the FastKernel.launch time goes (no launch in these loops)
    keyf = launch._arg_key
    sh = launch._stream_handle
    for name, fn in (
        ("  part: argument keys", lambda: tuple(map(keyf, kargs))),
        ("  part: pack_into", lambda: entry.pack(buf, kargs)),
        ("  part: current stream handle", lambda: sh(None)),
    ):
        t0 = time.perf_counter()
        for _ in range(10000):
            fn()
        us = (time.perf_counter() - t0) / 10000 * 1e6
        results.append(dict(path=name, host_us=us, host_sync_us=float("nan")))
        print(f"{name:46s} host {us:8.2f} us/call")
    fkg = FastKernel(k)

    def general():  # drop the specialised launcher: key, LRU lookup, general packer
        fkg._fast = (None, None)
        fkg.launch(grid, block, kargs)

    row("FastKernel.launch, general path", general)
    saved, launch._cupy_launch = launch._cupy_launch, None
    fkb = FastKernel(k)  # its launchers are generated for cuda.bindings' cuLaunchKernel
    row("FastKernel.launch via cuda.bindings", lambda: fkb.launch(grid, block, kargs))
    launch._cupy_launch = saved

    # CUDA graphs (captured on a non-default stream through the FastKernel path)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        fk.launch(grid, block, kargs)
        g1 = s.end_capture()
        s.begin_capture()
        for _ in range(100):
            fk.launch(grid, block, kargs)
        g100 = s.end_capture()
    codes.fill(0xA5)
    g1.launch(s)
    s.synchronize()
    ok = np.array_equal(codes.get(), ref.codes.view(np.uint8))
    print(f"check graph replay: {'bit-exact vs reference' if ok else 'MISMATCH'}")
    results.append(dict(path="check graph", ok=bool(ok)))
    row("graph (1 launch) replay: graph.launch(s)", lambda: g1.launch(s))
    h100, hs100 = host_time(lambda: g100.launch(s), max(args.calls // 100, 10), s.synchronize)
    results.append(dict(path="graph (100 launches), per launch", host_us=h100 / 100, host_sync_us=hs100 / 100))
    print(f"{'graph (100 launches) replay, per launch':46s} host {h100 / 100:8.2f} us/call   +sync {hs100 / 100:8.2f} us/call")

    # device time per launch: events around graph replays of 100 launches
    dev_us = graph_replay_us(cp, g100, s, 20, per=100)
    nbytes = rows * cols * 2 + rows * cols + rows * 4
    print(f"device time per launch (graph of 100, median of 20): {dev_us:.2f} us = {nbytes / dev_us / 1e3:.0f} GB/s")
    results.append(dict(path="device us per launch", device_us=dev_us, gbs=nbytes / dev_us / 1e3))

    # nqdq's own launcher (nqdq.gpu.quantize.plan, fp8_row), end to end per call: as it is
    # (Numba launches) and with its launch helper routed through FastKernel
    try:
        from peers import fastkernel_in_launchers, nqdq_runner

        label, run = nqdq_runner("fp8_row", x)
        calls = max(args.calls // 5, 50)
        row(f"{label} fp8_row, as it is (Numba launches)", lambda: run(x), calls)
        with fastkernel_in_launchers():
            parts = run(x)
            sync()
            ok = np.array_equal(parts.codes.get(), ref.codes.view(np.uint8))
            print(f"check {label} fp8_row + FastKernel: {'bit-exact vs reference' if ok else 'MISMATCH'}")
            results.append(dict(path=f"check {label}+FastKernel", ok=bool(ok)))
            row(f"{label} fp8_row, launches through FastKernel", lambda: run(x), calls)
            # where the launcher's remaining host time goes (written to the log)
            print_profile(lambda: run(x), 200, sync, f"{label} fp8_row calls (FastKernel)", stats=18, lines=40)
    except Exception as e:
        print(f"nqdq GPU quantize: {type(e).__name__}: {e}")

    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print()
    print(f"| launch path ({rows}x{cols} bf16, toy fp8_row kernel) | host us/call | us/call incl. sync |")
    print("|---|---:|---:|")
    for r in results:
        if "host_us" in r:
            print(f"| {r['path']} | {r['host_us']:.2f} | {r['host_sync_us']:.2f} |")
    print(f"| device time per launch (events, graph of 100) | - | {dev_us:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
