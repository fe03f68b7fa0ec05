"""The launch path below nqdq's API: host time per kernel launch, and the parts of one call.

    python3 benchmarks/launch_overhead.py [--json FILE] [--rows 64 --cols 7168] [--calls 1000]
    taskset -c 2 python3 benchmarks/launch_overhead.py --parts [--json FILE]

The kernel is a small one of this file's own (``fp8_row_bf16`` below: a per-row FP8
quantizer, bit-exact with ``nqdq.quantize(x, "fp8_row")``), so the launch machinery is
timed apart from nqdq's kernels and plans: on a bf16 ``rows x cols`` activation (64 x 7168:
a decode step), CuPy arguments, legacy default stream. For each launch path (Numba's
dispatcher, ``nqdq.gpu.runtime.launch.FastKernel`` and its parts, a pre-packed launch, the
driver's ``cuLaunchKernel`` alone, CUDA-graph replay): warm-up excluded, then ``calls``
launches timed with ``time.perf_counter``; ``host us/call`` is the loop alone, ``+sync
us/call`` includes the final synchronize (when the device is slower than the host this is
device time). The device time of one launch is measured with events over a graph of 100
launches. Every path's output is checked bit for bit against the NumPy reference first.

``--parts``: what the CuPy and driver operations inside one ``nqdq.quantize`` call cost on
the host, median of 20000 calls each (``host_median``, the device synchronized every 200):
allocation and array objects the size of a 64 x 7168 mxfp4 plan's (codes + scales in one
147456-byte allocation), the stream lookup, and one launch of the kernel below, its
parameters packed once, three ways: Numba's ``CUkernel`` handle, the context's
``CUfunction`` (what FastKernel launches), and the ``CUfunction`` with the parameters as one
buffer (``CU_LAUNCH_PARAM_BUFFER_POINTER``) instead of a ``void*[]``.

Host time per ``nqdq.quantize`` call, the user's figure: ``benchmarks/user_view.py --host``.
Figures and what they led to: docs/design/launch-path.md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")  # 64 blocks: no warning per call

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


# ---------------------------------------------------------------------------------------
# host and device clocks (also used by user_view.py and fused_peers.py)


def host_time(fn, calls, sync, warm=50):
    """(host us a call of a loop of ``calls`` calls, the same with the final synchronize)."""
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
    where the device takes longer per call than the host, an unsynchronized loop would time
    the device instead."""
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
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(replays):
        e0.record(stream)
        graph.launch(stream)
        e1.record(stream)
        e1.synchronize()
        times.append(cp.cuda.get_elapsed_time(e0, e1) * 1000 / per)
    return float(np.median(times[skip:]))


# ---------------------------------------------------------------------------------------
# the kernel: a per-row (per-token) FP8 e4m3 quantizer for bfloat16 whose bits are
# nqdq.quantize(x, "fp8_row")'s on finite input, tests/helpers/toy_fp8_row.py: loaded from
# there, so the kernel timed here is the one whose launches tests/test_launch.py checks.


def _load_toy():
    import importlib.util

    path = HERE.parent / "tests" / "helpers" / "toy_fp8_row.py"
    spec = importlib.util.spec_from_file_location("toy_fp8_row", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_toy = _load_toy()
TPB, fp8_row_bf16, launch_args = _toy.TPB, _toy.fp8_row_bf16, _toy.launch_args
# ---------------------------------------------------------------------------------------


def kernel_setup(rows, cols):
    """(x bits on the GPU, codes, scales, launch_args(...), check) for a random bf16 input;
    ``check()``: whether codes and scales now equal the NumPy reference's."""
    import cupy as cp
    import ml_dtypes

    import nqdq

    rng = np.random.default_rng(0)
    xh = (rng.standard_normal((rows, cols)) * np.exp2(rng.uniform(-4, 4, (rows, 1)))).astype(ml_dtypes.bfloat16)
    x = cp.asarray(xh.view(np.uint16))
    codes = cp.full((rows, cols), 0xA5, cp.uint8)
    scales = cp.full(rows, np.nan, cp.float32)
    ref = nqdq.quantize(xh, "fp8_row", device="cpu")

    def check():
        return np.array_equal(codes.get(), ref.codes.view(np.uint8)) and np.array_equal(
            scales.get().view(np.uint32), ref.scales.reshape(-1).view(np.uint32)
        )

    return x, codes, scales, launch_args(x, codes, scales), check


def checked(name, fn, codes, scales, check, results, sync):
    """``fn()`` once on poisoned outputs; the check's row; whether it passed."""
    codes.fill(0xA5)
    scales.fill(np.nan)
    fn()
    sync()
    ok = check()
    print(f"check {name}: {'bit-exact vs reference' if ok else 'MISMATCH'}", flush=True)
    results.append(dict(path=f"check {name}", ok=bool(ok)))
    return ok


def launch_paths(args):
    import cupy as cp

    from nqdq.gpu.runtime import launch
    from nqdq.gpu.runtime.launch import FastKernel

    rows, cols = args.rows, args.cols
    x, codes, scales, (grid, block, kargs), check = kernel_setup(rows, cols)
    sync = cp.cuda.runtime.deviceSynchronize
    k = fp8_row_bf16
    fk = FastKernel(k)
    configured = fk[grid, block]
    results = []

    def row(name, fn, calls=args.calls):
        h, hs = host_time(fn, calls, sync)
        results.append(dict(path=name, host_us=h, host_sync_us=hs))
        print(f"{name:46s} host {h:8.2f} us/call   +sync {hs:8.2f} us/call", flush=True)

    checked("numba", lambda: k[grid, block](*kargs), codes, scales, check, results, sync)
    checked("fast", lambda: fk.launch(grid, block, kargs), codes, scales, check, results, sync)
    row("numba kernel[grid, block](*args)", lambda: k[grid, block](*kargs))
    row("FastKernel.launch(grid, block, args)", lambda: fk.launch(grid, block, kargs))
    row("FastKernel[grid, block](*args)", lambda: configured(*kargs))
    prepared = fk.prepare(grid, block, kargs)
    row("PreparedLaunch()", prepared)

    # floors: the driver call alone, through cuda.bindings and through CuPy's driver module
    entry = fk.compile(kargs)
    buf, ptrs, addr = entry.new_buffer()
    entry.pack(buf, kargs)
    cu = launch._driver()
    h = entry.handle
    row("cuda.bindings cuLaunchKernel (pre-packed)", lambda: cu(h, grid, 1, 1, block, 1, 1, 0, 0, addr, 0))
    try:
        lk = cp.cuda.driver.launchKernel
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
    checked("graph replay", lambda: g1.launch(s), codes, scales, check, results, s.synchronize)
    row("graph (1 launch) replay: graph.launch(s)", lambda: g1.launch(s))
    h100, hs100 = host_time(lambda: g100.launch(s), max(args.calls // 100, 10), s.synchronize)
    results.append(dict(path="graph (100 launches), per launch", host_us=h100 / 100, host_sync_us=hs100 / 100))
    print(f"{'graph (100 launches) replay, per launch':46s} host {h100 / 100:8.2f} us/call   "
          f"+sync {hs100 / 100:8.2f} us/call")

    # device time per launch: events around graph replays of 100 launches
    dev_us = graph_replay_us(cp, g100, s, 20, per=100)
    nbytes = rows * cols * 2 + rows * cols + rows * 4
    print(f"device time per launch (graph of 100, median of 20): {dev_us:.2f} us = {nbytes / dev_us / 1e3:.0f} GB/s")
    results.append(dict(path="device us per launch", device_us=dev_us, gbs=nbytes / dev_us / 1e3))

    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print()
    print(f"| launch path ({rows}x{cols} bf16, fp8_row_bf16 kernel) | host us/call | us/call incl. sync |")
    print("|---|---:|---:|")
    for r in results:
        if "host_us" in r:
            print(f"| {r['path']} | {r['host_us']:.2f} | {r['host_sync_us']:.2f} |")
    print(f"| device time per launch (events, graph of 100) | - | {dev_us:.2f} |")
    return 0


def array_parts():
    """(name, fn) of the CuPy operations a call's runner makes: allocation, array objects, stream."""
    import cupy as cp

    from nqdq.gpu.runtime.interop import cupy_array_new

    u8, f32 = np.dtype(np.uint8), np.dtype(np.float32)
    pool = cp.get_default_memory_pool()
    mp = cp.cuda.alloc(147456)
    new = cupy_array_new(cp, mp)
    nd = cp.ndarray
    print(f"cupy_array_new: {'the base __new__ + _init path' if new is not None else 'None (constructor)'}")

    def by_init(shape, dtype, memptr):
        a = new(nd)
        a._init(shape, dtype, memptr)
        return a

    rows = [
        ("cupy.empty(147456, uint8)", lambda: cp.empty(147456, u8)),
        ("cupy.cuda.alloc(147456)", lambda: cp.cuda.alloc(147456)),
        ("pool.malloc(147456)", lambda: pool.malloc(147456)),
        ("cupy.ndarray(shape, uint8, memptr)", lambda: nd((64, 3584), u8, mp)),
        ("memptr + 256", lambda: mp + 256),
        ("cupy.ndarray(shape, float32, memptr + off)", lambda: nd((64, 224), f32, mp + 256)),
        ("cupy.cuda.get_current_stream().ptr", lambda: cp.cuda.get_current_stream().ptr),
    ]
    if new is not None:
        rows += [
            ("ndarray base __new__ + _init(shape, uint8, memptr)", lambda: by_init((64, 3584), u8, mp)),
            ("ndarray base __new__ + _init(shape, float32, memptr + off)", lambda: by_init((64, 224), f32, mp + 256)),
            ("ndarray base __new__ + _init((), float32, memptr + off)", lambda: by_init((), f32, mp + 256)),
        ]
    return rows


def launch_parts(results):
    """(name, fn) of the kernel's pre-packed launch through CuPy's launchKernel: CUkernel vs
    CUfunction handle, void*[] vs one parameter buffer; each checked against the reference."""
    import cupy as cp

    from nqdq.gpu.runtime import launch

    x, codes, scales, (grid, block, kargs), check = kernel_setup(64, 7168)
    entry = launch.FastKernel(fp8_row_bf16).compile(kargs)
    buf, ptrs, addr = entry.new_buffer()
    entry.pack(buf, kargs)
    size = ctypes.c_size_t(entry.struct.size)
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(buf), 2, ctypes.addressof(size), 0)  # BUFFER_POINTER, SIZE, END
    lk = cp.cuda.driver.launchKernel
    print(f"handles: CUkernel {entry.kernel_handle:#x}, launched {entry.handle:#x} "
          f"({'the CUfunction' if entry.handle != entry.kernel_handle else 'the same: no CUfunction taken'})")
    ways = [
        ("launchKernel, Numba's CUkernel handle, void*[]", lambda: lk(entry.kernel_handle, grid, 1, 1, block, 1, 1, 0, 0, addr, 0)),
        ("launchKernel, CUfunction handle, void*[]", lambda: lk(entry.handle, grid, 1, 1, block, 1, 1, 0, 0, addr, 0)),
        ("launchKernel, CUfunction handle, one buffer (extra)",
         lambda: lk(entry.handle, grid, 1, 1, block, 1, 1, 0, 0, 0, ctypes.addressof(extra))),
    ]  # fmt: skip
    # the lambdas pass raw addresses: keep the buffers they point into alive with the rows
    keep = (buf, ptrs, size, extra, x, codes, scales, entry)
    out = []
    for name, fn in ways:
        if checked(name, fn, codes, scales, check, results, cp.cuda.runtime.deviceSynchronize):
            out.append((name, lambda fn=fn, keep=keep: fn()))
    return out


def parts(args):
    import cupy as cp

    results = []
    rows = array_parts()
    try:
        rows += launch_parts(results)
    except Exception as e:  # the array rows still count
        print(f"launch rows: {type(e).__name__}: {e}")
    sync = cp.cuda.runtime.deviceSynchronize
    for name, fn in rows:
        for _ in range(200):
            fn()
        us = host_median(fn, 20000, sync, 200)
        results.append(dict(part=name, median_us=us))
        print(f"{name:60s} {us:6.2f} us", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", action="store_true",
                    help="the CuPy and driver operations inside one call instead, median of 20000 each")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--cols", type=int, default=7168)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    return parts(args) if args.parts else launch_paths(args)


if __name__ == "__main__":
    sys.exit(main())
