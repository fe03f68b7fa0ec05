"""nqdq as its users measure it: the wall clock of back-to-back calls from each array library.

    python3 benchmarks/user_view.py [--sizes 64x7168,8192x8192,16384x7168]
        [--schemes fp8_row,nvfp4,mxfp4] [--libs cupy,torch,jax] [--dtypes bfloat16,float16,float32]
        [--ops quantize,dequantize] [--json FILE]
    python3 benchmarks/user_view.py --host [--sizes 64x7168] [--schemes fp8_row,mxfp4,nvfp4,fp8_1x128]
        [--rounds 5] [--calls 1000] [--json FILE]

For each (op, scheme, size, library, dtype):

* ``wall us``: ``calls`` calls back to back from the library's own arrays, one device
  synchronize at the end, divided by ``calls``; the median of 7 rounds. Host work, hidden
  waits and launch gaps count, as they do in a user's program.
* ``device us``: the same calls captured in a CUDA graph (``torch.cuda.graph`` for PyTorch,
  CuPy's stream capture for CuPy) and replayed, timed with CUDA events: the kernels alone.
  JAX cannot be captured: its row shows the CuPy graph's figure (the same kernels).
* ``% of copy``: bytes read and written (input, codes, scales) against a device-to-device
  copy of the input timed in the same run (read + written).

Also ``fused.rmsnorm_quantize(h, w, "fp8_row")`` (``--fused-sizes``) and FP8 row-scaled
``matmul`` with bfloat16 output (``--matmul-shapes`` MxNxK; note: FLOPs). Peers in the same
run: a Triton per-token FP8 quantizer (``peers._triton_fp8_row``) beside ``fp8_row`` from
PyTorch, and ``torch._scaled_mm`` (cuBLASLt) on the same FP8 codes and row scales. Inputs: fresh random data (normal, per-row magnitudes 2^U(-4, 4)),
rotated over enough sets that one call's input is not in L2 from the call before.

``--host``: only the host time of one ``nqdq.quantize`` call from CuPy (bf16 bits,
``dtype="bfloat16"``) in the steady state, at decode size by default (``bench_host``).
Host figures follow the machine: compare two trees only in one process
(``benchmarks/tree_ab.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import nqdq  # noqa: E402

ROUNDS = 7


def _sets(shape, dtype, n_sets, seed):
    """``n_sets`` NumPy float32 arrays of random data, rounded to ``dtype`` later."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_sets):
        f = rng.standard_normal(shape, dtype=np.float32)
        f *= np.exp2(rng.uniform(-4, 4, (shape[0], 1))).astype(np.float32)
        out.append(f)
    return out


class Lib:
    """One array library: its arrays from NumPy data, a device sync, graph timing."""

    def __init__(self, name):
        import cupy

        self.name, self.cp = name, cupy
        if name == "torch":
            import torch

            self.torch = torch
        if name == "jax":
            import jax
            import jax.numpy as jnp

            self.jax, self.jnp = jax, jnp

    def array(self, f32, dtype):
        import ml_dtypes

        host = f32.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
        if self.name == "cupy":
            if dtype == "bfloat16":  # CuPy has no bfloat16: its bits, with dtype= in the call
                return self.cp.asarray(host.view(np.uint16))
            return self.cp.asarray(host)
        if self.name == "torch":
            t = self.torch
            if dtype == "bfloat16":
                return t.from_numpy(host.view(np.int16)).cuda().view(t.bfloat16)
            return t.from_numpy(host).cuda()
        return self.jax.device_put(host)

    def kwargs(self, dtype):
        return {"dtype": "bfloat16"} if self.name == "cupy" and dtype == "bfloat16" else {}

    def sync(self):
        self.cp.cuda.runtime.deviceSynchronize()

    def capture(self, fn, xs):
        """``fn(x)`` for each of ``xs`` captured in one CUDA graph: ``(replay, timed, keep)``,
        ``replay()`` launching the graph, ``timed()`` one launch timed by CUDA events (ms) and
        ``keep`` the captured calls' results; None where the library cannot capture."""
        if self.name == "torch":
            t = self.torch
            s = t.cuda.Stream()
            s.wait_stream(t.cuda.current_stream())
            g = t.cuda.CUDAGraph()
            with t.cuda.stream(s), t.cuda.graph(g, stream=s):
                keep = [fn(x) for x in xs]
            t.cuda.synchronize()
            a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)

            def timed():
                a.record()
                g.replay()
                b.record()
                b.synchronize()
                return a.elapsed_time(b)

            return g.replay, timed, keep
        if self.name == "cupy":
            cp = self.cp
            s = cp.cuda.Stream(non_blocking=True)
            with s:
                s.begin_capture()
                keep = [fn(x) for x in xs]
                g = s.end_capture()
            a, b = cp.cuda.Event(), cp.cuda.Event()

            def timed():
                a.record(s)
                g.launch(s)
                b.record(s)
                b.synchronize()
                return cp.cuda.get_elapsed_time(a, b)

            return (lambda: g.launch(s)), timed, keep
        return None

    def graph_us(self, fn, xs):
        """Device time per call of ``fn(x)`` over ``xs``, captured in one CUDA graph and
        replayed (median of 7 replays); None where the library cannot capture."""
        got = self.capture(fn, xs)
        if got is None:
            return None
        _replay, timed, keep = got
        ts = [timed() * 1000 / len(xs) for _ in range(8)]
        del keep
        return statistics.median(ts[1:])


def wall_us(fn, xs, sync, calls):
    """Median over rounds of (``calls`` back-to-back calls + one sync) / calls, in us."""
    for i in range(min(len(xs), 8) + 3):  # warm-up: plans, compilation, remembered runners
        fn(xs[i % len(xs)])
    sync()
    res = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for i in range(calls):
            fn(xs[i % len(xs)])
        sync()
        res.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(res)


def copy_us(nbytes):
    """A device-to-device copy of ``nbytes``: device us (CuPy events, median of 20)."""
    import cupy as cp

    src = cp.random.default_rng(0).integers(0, 255, nbytes, dtype=cp.uint8)
    dst = cp.empty_like(src)
    dst[...] = src
    a, b = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for _ in range(20):
        a.record()
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, cp.cuda.runtime.memcpyDeviceToDevice, 0)
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) * 1000)
    return statistics.median(ts)


def out_bytes(q):
    n = 0
    for a in (q.codes, q.scales, q.zero_points, q.tensor_scale, q.means):
        if a is not None:
            n += int(np.prod(a.shape)) * (a.element_size() if hasattr(a, "element_size") else a.dtype.itemsize)
    return n


def bench(args):
    import cupy as cp

    l2 = cp.cuda.Device().attributes["L2CacheSize"]
    rows = []
    libs = {name: Lib(name) for name in args.libs}
    device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    for size in args.sizes:
        shape = tuple(int(v) for v in size.split("x"))
        for dtype in args.dtypes:
            isz = 4 if dtype == "float32" else 2
            in_bytes = math.prod(shape) * isz
            n_sets = int(min(64, max(2, math.ceil(4 * l2 / in_bytes))))
            calls = max(n_sets, 20 if in_bytes > l2 else 200)
            data = _sets(shape, dtype, n_sets, seed=len(rows))
            copy = copy_us(in_bytes)
            for lib in libs.values():
                xs = [lib.array(f, dtype) for f in data]
                kw = lib.kwargs(dtype)
                for scheme in args.schemes:
                    q0 = nqdq.quantize(xs[0], scheme, **kw)
                    nbytes = in_bytes + out_bytes(q0)
                    cases = {"quantize": (lambda x, s=scheme, kw=kw: nqdq.quantize(x, s, **kw), xs, nbytes)}
                    if "dequantize" in args.ops:
                        qs = [nqdq.quantize(x, scheme, **kw) for x in xs]
                        cases["dequantize"] = (lambda q: nqdq.dequantize(q, dtype), qs, nbytes)
                    for op in args.ops:
                        fn, inputs, nb = cases[op]
                        w = wall_us(fn, inputs, lib.sync, calls)
                        try:
                            d = lib.graph_us(fn, inputs)
                        except Exception as e:  # a call that cannot be captured: say so in the row
                            d, note = None, f"capture: {type(e).__name__}"
                        else:
                            note = ""
                        rows.append(dict(op=op, scheme=scheme, size=size, lib=lib.name, dtype=dtype, wall_us=w,
                                         device_us=d, copy_us=copy * nb / (2 * in_bytes), note=note))  # fmt: skip
                        print(_row(rows[-1]), flush=True)
            if "torch" in libs and "fp8_row" in args.schemes and dtype != "float32":
                rows += _triton_row(libs["torch"], data, dtype, size, calls, copy, in_bytes, shape)
    return device, rows


def bench_fused(libs, sizes, rows, weight_dtype="bfloat16"):
    """``fused.rmsnorm_quantize(h, w, "fp8_row")`` (bfloat16 h, ``weight_dtype`` w) from each
    library: wall and device."""
    for size in sizes:
        shape = tuple(int(v) for v in size.split("x"))
        in_bytes = math.prod(shape) * 2
        n_sets = int(min(64, max(2, math.ceil(4 * 60e6 / in_bytes))))
        calls = max(n_sets, 20 if in_bytes > 60e6 else 200)
        data = _sets(shape, "bfloat16", n_sets, seed=7)
        copy = copy_us(in_bytes)
        w32 = np.random.default_rng(8).uniform(0.5, 1.5, shape[-1]).astype(np.float32)
        for lib in libs.values():
            if lib.name == "jax":
                continue  # (the general path, as measured for quantize)
            xs = [lib.array(f, "bfloat16") for f in data]
            w = lib.array(w32, weight_dtype)
            kw = lib.kwargs("bfloat16")
            if weight_dtype == "bfloat16" and lib.name == "cupy":
                kw = dict(kw, weight_dtype="bfloat16")  # (CuPy holds bfloat16 as uint16 bits)
            fn = lambda x, w=w, kw=kw: nqdq.fused.rmsnorm_quantize(x, w, "fp8_row", **kw)  # noqa: E731
            nb = in_bytes + math.prod(shape) + shape[0] * 4 + shape[-1] * (2 if weight_dtype == "bfloat16" else 4)
            w_us = wall_us(fn, xs, lib.sync, calls)  # first: the general path's first call is not capturable
            d = None
            try:
                d = lib.graph_us(fn, xs)
            except Exception as e:
                print(f"fused capture ({lib.name}): {type(e).__name__}: {e}")
            rows.append(dict(op=f"rmsnorm_quantize (w {weight_dtype})", scheme="fp8_row", size=size, lib=lib.name,
                             dtype="bfloat16", wall_us=w_us, device_us=d, copy_us=copy * nb / (2 * in_bytes),
                             note=""))  # fmt: skip
            print(_row(rows[-1]), flush=True)


def bench_matmul(libs, shapes, rows):
    """FP8 row-scaled ``matmul`` (bfloat16 out) from CuPy and PyTorch operands made by
    ``quantize``, beside ``torch._scaled_mm`` (cuBLASLt) on the same codes and scales."""
    for mnk in shapes:
        M, N, K = (int(v) for v in mnk.split("x"))
        a32 = _sets((M, K), "bfloat16", 1, seed=11)[0]
        b32 = _sets((N, K), "bfloat16", 1, seed=12)[0]
        for lib in libs.values():
            if lib.name == "jax":
                continue
            kw = lib.kwargs("bfloat16")
            qa = nqdq.quantize(lib.array(a32, "bfloat16"), "fp8_row", **kw)
            qb = nqdq.quantize(lib.array(b32, "bfloat16"), "fp8_row", **kw)
            fn = lambda _q, qa=qa, qb=qb: nqdq.matmul(qa, qb, "bfloat16")  # noqa: E731
            calls = 200 if M * N * K < 2**36 else 20
            rows.append(dict(op="matmul", scheme="fp8_row", size=mnk, lib=lib.name, dtype="bfloat16",
                             wall_us=wall_us(fn, [None], lib.sync, calls), device_us=_try(lib.graph_us, fn, [None]),
                             copy_us=None, note=f"{2 * M * N * K / 1e6:.0f} MFLOP"))  # fmt: skip
            print(_row(rows[-1]), flush=True)
            if lib.name == "torch":
                t = lib.torch
                a8, b8 = qa.codes.view(t.float8_e4m3fn), qb.codes.view(t.float8_e4m3fn)
                sa, sb = qa.scales.reshape(M, 1).contiguous(), qb.scales.reshape(1, N).contiguous()

                def peer(_q):
                    return t._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=t.bfloat16)

                rows.append(dict(op="matmul", scheme="torch._scaled_mm (cuBLASLt)", size=mnk, lib="torch",
                                 dtype="bfloat16", wall_us=wall_us(peer, [None], lib.sync, calls),
                                 device_us=_try(lib.graph_us, peer, [None]), copy_us=None, note=""))  # fmt: skip
                print(_row(rows[-1]), flush=True)


def bench_replay(libs, rows, reps=50, blocks=20):
    """Host time of one replay of a captured ``quantize(x, "fp8_row")`` (64x7168 bfloat16):
    ``torch.cuda.CUDAGraph.replay`` / CuPy's ``Graph.launch``, ``reps`` replays timed back to
    back (perf_counter), the device synchronized untimed between blocks so the launch queue
    never fills; the median over ``blocks`` blocks."""
    x32 = _sets((64, 7168), "bfloat16", 1, seed=21)[0]
    for lib in libs.values():
        if lib.name not in ("torch", "cupy"):
            continue
        kw = lib.kwargs("bfloat16")
        x = lib.array(x32, "bfloat16")
        nqdq.quantize(x, "fp8_row", **kw)  # the runner made outside the capture
        replay, _timed, keep = lib.capture(lambda x, kw=kw: nqdq.quantize(x, "fp8_row", **kw), [x])
        ts = []
        for _ in range(blocks):
            lib.sync()
            t0 = time.perf_counter()
            for _ in range(reps):
                replay()
            ts.append((time.perf_counter() - t0) * 1e6 / reps)
        lib.sync()
        del keep
        rows.append(dict(op="graph replay (host)", scheme="fp8_row", size="64x7168", lib=lib.name, dtype="bfloat16",
                         wall_us=statistics.median(ts), device_us=None, copy_us=None,
                         note="host time of one replay of a captured call"))  # fmt: skip
        print(_row(rows[-1]), flush=True)


def _try(f, *args):
    try:
        return f(*args)
    except Exception as e:
        print(f"capture failed: {type(e).__name__}: {e}")
        return None


def _triton_row(lib, data, dtype, size, calls, copy, in_bytes, shape):
    try:
        from peers import _triton_fp8_row

        run, torch = _triton_fp8_row()
    except Exception as e:
        print(f"triton peer skipped: {type(e).__name__}: {e}")
        return []
    xs = [lib.array(f, dtype) for f in data]

    def fn(x):
        q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        s = torch.empty((x.shape[0], 1), dtype=torch.float32, device=x.device)
        run(x, q, s)
        return q, s

    nb = in_bytes + math.prod(shape) + shape[0] * 4
    row = dict(op="quantize", scheme="fp8_row (Triton peer)", size=size, lib="torch", dtype=dtype,
               wall_us=wall_us(fn, xs, lib.sync, calls), device_us=lib.graph_us(fn, xs),
               copy_us=copy * nb / (2 * in_bytes), note="")  # fmt: skip
    print(_row(row), flush=True)
    return [row]


def _pct(copy, us):
    return f"{100 * copy / us:.0f} %" if us and copy else "-"


def _row(r):
    d = f"{r['device_us']:.1f}" if r["device_us"] else "-"
    return (f"| {r['op']} | {r['scheme']} | {r['size']} | {r['lib']} | {r['dtype']} | {r['wall_us']:.1f} | {d} | "
            f"{_pct(r['copy_us'], r['wall_us'])} | {_pct(r['copy_us'], r['device_us'])} | {r['note']} |")


def same_parts(q, ref):
    """Every output of ``q`` (CuPy or NumPy) the same bits, shape and dtype as ``ref``'s."""
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


def bench_host(sizes, schemes, calls, rounds, warm_s=2.0):
    """Host time per ``nqdq.quantize(x, scheme, dtype="bfloat16")`` call on a CuPy array of
    bf16 bits, in the steady state: every scheme called for ``warm_s`` seconds in turn (the
    host's and the GPU's clocks come up; a cold first scheme reads up to 1.5x higher), then
    ``rounds`` rounds, each timing every scheme in turn: the median of ``calls`` single
    calls (``launch_overhead.host_median``: ``perf_counter`` around each call, the device
    synchronized untimed every 100 calls so no call waits for room in the launch queue) and
    the loop of ``calls`` calls with its final synchronize, per call. Each result is checked
    bit for bit against the NumPy reference first. Prints per scheme every round's figures,
    their median and their maximum; returns the rows."""
    import functools

    import cupy as cp
    import ml_dtypes
    from launch_overhead import host_median, host_time

    sync = cp.cuda.runtime.deviceSynchronize
    out = []
    for size in sizes:
        shape = tuple(int(v) for v in size.split("x"))
        rng = np.random.default_rng(5)
        xh = (rng.standard_normal(shape) * np.exp2(rng.uniform(-6, 6, (shape[0], 1)))).astype(ml_dtypes.bfloat16)
        x = cp.asarray(xh.view(np.uint16))
        fns = {}
        for scheme in schemes:
            fn = fns[scheme] = functools.partial(nqdq.quantize, x, scheme, dtype="bfloat16")
            ok = same_parts(fn(), nqdq.quantize(xh, scheme, device="cpu"))
            print(f"check {size} {scheme}: {'bit-exact vs reference' if ok else 'MISMATCH'}", flush=True)
            out.append(dict(size=size, scheme=scheme, ok=bool(ok)))
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
        print(f"\n| nqdq.quantize {size} bf16 (CuPy), steady state ({warm_s:g} s warm-up), {rounds} rounds | "
              f"median of {calls} single calls, per round (us) | their median | max | "
              f"loop of {calls} + sync, per call, per round (us) | their median |")
        print("|---|---|---:|---:|---|---:|")
        for scheme in schemes:
            m, lp = med[scheme], loop[scheme]
            out.append(dict(size=size, scheme=scheme, round_medians_us=m, round_loop_sync_us=lp))
            print(f"| {scheme} | {' '.join(f'{v:.2f}' for v in m)} | {statistics.median(m):.2f} | {max(m):.2f} | "
                  f"{' '.join(f'{v:.2f}' for v in lp)} | {statistics.median(lp):.2f} |", flush=True)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default=None, type=lambda s: s.split(",") if s else [],
                   help="default 64x7168,8192x8192,16384x7168; with --host 64x7168")
    p.add_argument("--schemes", default=None, type=lambda s: s.split(","),
                   help="default fp8_row,nvfp4,mxfp4; with --host fp8_row,mxfp4,nvfp4,fp8_1x128")
    p.add_argument("--libs", default="cupy,torch,jax", type=lambda s: s.split(","))
    p.add_argument("--dtypes", default="bfloat16,float16,float32", type=lambda s: s.split(","))
    p.add_argument("--ops", default="quantize,dequantize", type=lambda s: s.split(","))
    p.add_argument("--fused-sizes", default="64x7168,8192x7168", type=lambda s: s.split(",") if s else [])
    p.add_argument("--matmul-shapes", default="16x14336x4096,4096x4096x4096,8192x8192x8192",
                   type=lambda s: s.split(",") if s else [])  # fmt: skip
    p.add_argument("--fused-weights", default="bfloat16", type=lambda s: s.split(","),
                   help="the RMSNorm weight's dtypes (bfloat16, float32)")
    p.add_argument("--no-replay", action="store_true", help="skip the host time of a graph replay")
    p.add_argument("--host", action="store_true", help="only the host time per quantize call, steady state")
    p.add_argument("--rounds", type=int, default=5, help="with --host")
    p.add_argument("--calls", type=int, default=1000, help="with --host: single calls a round")
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.host:
        rows = bench_host(args.sizes or ["64x7168"], args.schemes or ["fp8_row", "mxfp4", "nvfp4", "fp8_1x128"],
                          args.calls, args.rounds)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return
    if args.sizes is None:
        args.sizes = ["64x7168", "8192x8192", "16384x7168"]
    args.schemes = args.schemes or ["fp8_row", "nvfp4", "mxfp4"]
    device, rows = bench(args)
    libs = {name: Lib(name) for name in args.libs}
    for wd in args.fused_weights:
        bench_fused(libs, args.fused_sizes, rows, wd)
    bench_matmul(libs, args.matmul_shapes, rows)
    if not args.no_replay:
        bench_replay(libs, rows)
    print(f"\n{device}; wall: back-to-back calls, one synchronize; device: CUDA-graph replay (CUDA events)\n")
    print("| op | scheme | size | library | dtype | wall us | device us | wall % of copy | device % of copy | |")
    print("|---|---|---|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        print(_row(r))
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
