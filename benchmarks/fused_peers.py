"""Fused ops (nqdq.fused) against copy bandwidth and the unfused nqdq pair, in one run on one
GPU, with a bit-exactness check of every op at the measured size.

    python3 benchmarks/fused_peers.py [--json FILE] [--rows 8192] [--hidden 7168] [--only NAME]
                                      [--pytest] [--units-per-thread U ...]
    python3 benchmarks/fused_peers.py --moe-graphs [--moe-tokens T ...] [--moe-k K] [--moe-reps 50]

Cost before any timing: every kernel is compiled on first use, about 20-25 s of NVVM time
each on the GPU machine for the fused row kernels (they are written out per unit), and a
full run compiles about 20 of them; ``--only fp8_row`` (say) keeps a run inside a 300 s
device call. ``--pytest`` first runs tests/test_fused_gpu.py in the same process (its
kernels are then compiled once for both).

For a bfloat16 [rows, hidden] input (default [8192, 7168]) it times, with CUDA events
(benchmarks/peers.Timer: fresh random inputs, input sets rotated past L2, warm-up
excluded, a sleep kernel queued first so host launch overhead stays out, median):

* ``copy``: device-to-device copy of the input (the bandwidth ceiling; bytes = read + written);
* each fused op: ``rmsnorm_quantize`` for fp8_row, fp8_tensor (static scale), fp8_1x128 and
  mxfp4, without and with the residual add; ``flatten_quantize`` (fp8_1x128, mxfp4) of the
  input seen as a transposed view of a [hidden/128, rows, 128] array (a contiguous
  [B, H, D] is a reshape, and flatten_quantize hands it to nqdq.quantize); ``moe_sort_quantize`` (mxfp4) of [rows, hidden]
  tokens with top-4 of 256 experts (4 * rows gathered rows out), and of [rows/4, hidden] (rows gathered rows out;
  ``--moe-tokens T ..`` for others);
* the unfused pair for each: ``nqdq.fused.rmsnorm`` (float32 y, + the new residual) then
  ``nqdq.quantize(y, scheme)``; for flatten of the view, a contiguous copy then
  ``nqdq.quantize``; for the MoE sort, the sort and a gather with CuPy then ``nqdq.quantize``.

Bytes per op = inputs read once (x, weight, residual, expert ids) + outputs written once (codes,
scales, new residual, perm, offsets); for the MoE sort x is the [T, hidden] tokens, read once
however many of its k sorted rows a token has. Checks: the fused codes/scales/residual equal the unfused pair's over
the whole tensor (on the GPU) and the NumPy reference's on 64 sampled rows (rows are
independent; the reference at full size would take minutes on the host); the MoE
permutation and offsets equal the reference's in full.

``--moe-graphs``: the MoE op alone, by parts, from CUDA graphs instead (``moe_graphs``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from peers import Timer, n_sets_for, random_bf16_sets  # noqa: E402

SCHEMES = ["fp8_row", "fp8_tensor", "fp8_1x128", "mxfp4"]
STATIC_SCALE = 0.02
SAMPLE_ROWS = 64


def _host(a):
    return None if a is None else (a.get() if hasattr(a, "get") else np.asarray(a))


def _bits(a):
    a = _host(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint16)


def same(a, b) -> bool:
    a, b = _host(a), _host(b)
    return a.shape == b.shape and np.array_equal(_bits(a), _bits(b))


def q_same(q1, q2) -> bool:
    return same(q1.codes, q2.codes) and same(q1.scales, q2.scales)


def bf16_host(bits_u16):
    import ml_dtypes

    return _host(bits_u16).view(ml_dtypes.bfloat16)


def code_bytes(scheme, rows, n):
    if scheme == "mxfp4":
        return rows * (-(-n // 2)) + rows * (-(-n // 32))
    if scheme == "fp8_1x128":
        return rows * n + rows * (-(-n // 128)) * 4
    if scheme == "fp8_row":
        return rows * n + rows * 4
    return rows * n  # static tensor scale: nothing else written


class _timing_lock:
    """``with``: an exclusive flock on ``path`` (no-op without one)."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        if self.path:
            import fcntl

            self.fh = open(self.path, "a")
            fcntl.flock(self.fh, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        if self.path:
            self.fh.close()  # releases the lock


def moe_graphs(tokens, n, k, reps, E=256):
    """The MoE op's device time with no host in the way: ``reps`` back-to-back calls captured
    in one CUDA graph, events around a replay, divided by ``reps`` (median of 15 replays after
    two left out). For each T of ``tokens`` (top-``k`` of ``E``): the sort alone, its kernels
    launched straight (one launch, a direct call's; or three, a captured call's), and the
    whole planned op twice (``check_ids=False``; captured, it takes the three-launch sort),
    the calls cycling over token sets that together exceed twice the L2, so each call's
    tokens come from DRAM as in an eager stream of layers. Each sort's permutation and
    offsets are checked against the NumPy reference (the whole op's outputs are checked by
    the eager rows)."""
    import cupy as cp
    from launch_overhead import graph_replay_us

    from nqdq import fused
    from nqdq.gpu.fused import moe as KM
    from nqdq.gpu.quantize.grid import SYNC_WORDS
    from nqdq.gpu.runtime.interop import Allocator
    from nqdq.gpu.runtime.launch import fast_kernel
    from nqdq.reference import fused as R

    s = cp.cuda.Stream(non_blocking=True)

    def graph_us(body):
        with s:
            body()
            s.synchronize()
            s.begin_capture()
            for _ in range(reps):
                body()
            g = s.end_capture()
        return graph_replay_us(cp, g, s, 17, per=reps, skip=2)

    l2 = cp.cuda.runtime.getDeviceProperties(0)["l2CacheSize"]
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; hidden {n}, top-{k} of {E}; "
          f"CUDA graphs of {reps} calls")
    for T in tokens:
        rng = np.random.default_rng(5)
        ids_h = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
        ids2 = cp.asarray(ids_h)
        perm_ref, off_ref = R.moe_sort(ids_h, E)
        ws = cp.zeros(SYNC_WORDS, cp.int32)
        for one in (True, False):
            lst = []
            with s:  # the sort's kernels and arrays, not launched yet
                perm, offsets = KM.moe_sort(ids2.reshape(-1), T * k, k, E, Allocator("cupy"), launches=lst, ws=ws,
                                            one=one)[:2]

            def body(lst=lst):
                for kern, g, b, a in lst:
                    fast_kernel(kern).launch(g, b, a)

            us = graph_us(body)
            ok = same(perm, perm_ref) and same(offsets[: E + 1], off_ref)
            print(f"{T} tokens: sort alone, {'one launch' if one else 'three launches'}: {us:.2f} us a call"
                  f"{'' if ok else '  PERMUTATION OR OFFSETS DIFFER from the reference'}", flush=True)
        assert not ws.get().any(), "the one-launch sort left its workspace non-zero"
        nsets = max(2, -(-2 * l2 // (T * n * 2)) + 1)
        xs = random_bf16_sets((T, n), nsets, seed=4)
        turn = [0]

        def call():
            turn[0] += 1
            return fused.moe_sort_quantize(xs[turn[0] % nsets], ids2, E, "mxfp4", dtype="bfloat16", check_ids=False)

        call()  # the first call plans; the graphs hold planned calls
        for _ in range(2):
            print(f"{T} tokens: whole op (planned, captured: three-launch sort), {nsets} token sets of "
                  f"{T * n * 2 / 1e6:.1f} MB in turn: {graph_us(call):.2f} us a call", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--moe-tokens", type=int, nargs="*", default=None, metavar="T",
                    help="the MoE op's tokens, one op row each (default: rows, x of [rows, hidden] as every other "
                         "op's input, and rows / 4, whose top-4 give [rows, hidden] gathered rows: the MoE row "
                         "of older tables)")
    ap.add_argument("--moe-k", type=int, default=4, help="the MoE op's experts a token (top-k of 256)")
    ap.add_argument("--moe-graphs", action="store_true",
                    help="only the MoE op by parts from CUDA graphs (sort alone, whole op), for each --moe-tokens T "
                         "(default: rows and rows / 4)")
    ap.add_argument("--moe-reps", type=int, default=50, help="with --moe-graphs: the calls a graph holds")
    ap.add_argument("--only", help="time only the ops whose name contains this")
    ap.add_argument("--lock", help="hold an exclusive lock on this file while timing, so several processes (each "
                                   "--only one op) compile at once and time one at a time")
    ap.add_argument("--units-per-thread", type=int, nargs="*", default=[],
                    help="also time rmsnorm(+res)+fp8_row / +mxfp4 with reference/fused.MAX_UNITS_PER_THREAD set to "
                         "this (another thread layout, hence another order of the sum: checked against the unfused pair "
                         "under the same setting)")
    ap.add_argument("--fused-only", action="store_true",
                    help="RMSNorm ops: time the fused op only (no unfused pair: not compiled, not timed); exactness "
                         "is then checked against the NumPy spec on the sampled rows only (A/B runs of the kernel's "
                         "NQDQ_FUSED_* switches, whose settings label the rows)")
    ap.add_argument("--ab", action="append", default=[], metavar="SETTING=V1,V2",
                    help="A/B in this process: after an op's default timing, time it again with nqdq.gpu."
                         "fused.SETTING (the MoE launcher's MOE_* geometry and size rules; or A+B: both) set to each value (ints; A+B=V1/V2: "
                         "one each; tried on the MoE ops only), then the default once more; each variant's whole "
                         "outputs are checked bit for bit against the default's")
    ap.add_argument("--pytest", nargs="*", metavar="ARG",
                    help="first run pytest -m gpu tests/test_fused_gpu.py [ARG ...] in this process (the kernels it "
                         "compiles are then reused here: one compilation per kernel for both)")
    args = ap.parse_args(argv)
    if args.moe_graphs:
        moe_graphs(args.moe_tokens or [args.rows, args.rows // args.moe_k], args.hidden, args.moe_k, args.moe_reps)
        return 0
    test_rc = None
    if args.pytest is not None:
        import pytest

        test_rc = int(pytest.main(["-m", "gpu", "-q", "-p", "no:cacheprovider", str(HERE.parent / "tests" / "test_fused_gpu.py"),
                                   *args.pytest]))

    import cupy as cp

    import nqdq
    from nqdq import fused
    from nqdq.reference import fused as R
    from nqdq.reference import quantize as RQ
    from nqdq.reference.packing import pack_codes
    from nqdq.schemes import resolve_scheme

    rows, n = args.rows, args.hidden
    timer = Timer()
    l2 = timer.l2_bytes
    in_bytes = rows * n * 2
    nsets = n_sets_for(in_bytes, l2, cap=4)
    xs = random_bf16_sets((rows, n), nsets, seed=1)
    rs = random_bf16_sets((rows, n), nsets, seed=2)
    w = random_bf16_sets((1, n), 1, seed=3)[0].reshape(n)
    kw = dict(dtype="bfloat16")
    results, checks = [], []
    dev = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()

    timing = _timing_lock(args.lock)
    copy_dst = cp.empty_like(xs[0])
    with timing:
        t_copy, hb = timer.device_us(lambda i: copy_dst.data.copy_from_device_async(xs[i].data, in_bytes), nsets,
                                     bytes_per_launch=2 * in_bytes)
    copy_gbs = 2 * in_bytes / t_copy / 1e3
    results.append(dict(op="copy (cudaMemcpyAsync D2D)", us=t_copy, gbs=copy_gbs, bytes=2 * in_bytes, host_bound=hb))

    sample = np.sort(np.random.default_rng(0).choice(rows, SAMPLE_ROWS, replace=False))
    w_h = bf16_host(w).astype(np.float32)

    from nqdq.gpu.fused import moe as KM
    from nqdq.gpu.fused import plan as KF

    ab = []
    for spec in args.ab:
        name, vals = spec.split("=")
        ab += [(name, v) for v in vals.split(",")]

    def outputs(o):
        """Every output array of a fused call (q's codes and scales, new residual, perm, offsets)."""
        o = o if isinstance(o, tuple) else (o,)
        arrs = []
        for v in o:
            arrs += [v.codes, v.scales] if hasattr(v, "codes") else [v]
        return arrs

    class switched:
        """``with``: NAME (the MoE launchers' switches: nqdq.gpu.fused.plan's staged rows, nqdq.gpu.fused.moe's
        sort) = v (an int; bools stay bools), restored after; NAME may be several joined by "+" (a combination:
        each set to v, or v = "V1/V2/..": one value each)."""

        def __init__(self, name, v):
            self.names = name.split("+")
            vs = [int(t) for t in str(v).split("/")]
            self.vs = vs * len(self.names) if len(vs) == 1 else vs
            if len(self.vs) != len(self.names):
                raise ValueError(f"--ab {name}={v}: one value, or one per switch")
            self.mods = [KF if hasattr(KF, nm) else KM for nm in self.names]  # (the module that holds it)

        def __enter__(self):
            self.old = [getattr(m, nm) for m, nm in zip(self.mods, self.names)]
            for m, nm, o, v in zip(self.mods, self.names, self.old, self.vs):
                setattr(m, nm, bool(v) if isinstance(o, bool) else type(o)(v))

        def __exit__(self, *exc):
            for m, nm, o in zip(self.mods, self.names, self.old):
                setattr(m, nm, o)

    def row(op, t, t_u, nbytes, hb):
        gbs = nbytes / t / 1e3
        r = dict(op=op, us=t, gbs=gbs, frac_copy=gbs / copy_gbs, unfused_us=t_u, speedup=t_u / t, bytes=nbytes,
                 host_bound=hb)
        results.append(r)
        # printed at once too: a run cut short by its time limit keeps what was measured
        print(f"partial: {op:44s} {t:8.1f} us {100 * r['frac_copy']:5.1f}% of copy", flush=True)

    def record(op, fused_fn, unfused_fn, nbytes, n_sets=None):
        if args.only and args.only not in op:
            return
        # the A/B variants are compiled and checked here, outside the timing lock (other
        # processes time meanwhile); only the timings are taken under it
        variants_ab = ab if "moe" in op else []
        ready = []
        if variants_ab:
            ref = outputs(fused_fn(0))
            for name, v in variants_ab:
                with switched(name, v):
                    got = outputs(fused_fn(0))
                ok = len(got) == len(ref) and all(same(a, b) for a, b in zip(got, ref))
                ready.append((name, v, ok))
                checks.append(dict(op=f"{op} [{name}={v}]", full_vs_unfused=ok, rows_vs_reference=ok))
        with timing:
            ns = n_sets or nsets
            t_f, hb_f = timer.device_us(fused_fn, ns, bytes_per_launch=nbytes)
            t_u, hb_u = (float("nan"), False) if unfused_fn is None else timer.device_us(unfused_fn, ns,
                                                                                        bytes_per_launch=nbytes)
            row(op, t_f, t_u, nbytes, hb_f or hb_u)
            for name, v, ok in ready:
                with switched(name, v):
                    t_v, hb_v = timer.device_us(fused_fn, ns, bytes_per_launch=nbytes)
                row(f"{op} [{name}={v}]", t_v, t_u, nbytes, hb_v)
            if ready:  # the default again: the drift over the A/B
                t_a, hb_a = timer.device_us(fused_fn, ns, bytes_per_launch=nbytes)
                row(f"{op} [default again]", t_a, t_u, nbytes, hb_a)
                checks.append(dict(op=f"{op} [default again]", full_vs_unfused=True, rows_vs_reference=True))

    # ---- RMSNorm + quantize, with and without the residual
    for scheme in SCHEMES:
        for with_res in (False, True):
            op = f"rmsnorm{'+res' if with_res else ''}+{scheme}"
            if args.only and args.only not in op:
                continue
            try:
                scale = STATIC_SCALE if scheme == "fp8_tensor" else None
                sch = resolve_scheme(scheme, static_scale=scale is not None)

                def fused_fn(i, scheme=scheme, with_res=with_res, scale=scale):
                    return fused.rmsnorm_quantize(xs[i], w, scheme, residual=rs[i] if with_res else None,
                                                  scale=scale, **kw)

                def unfused_fn(i, scheme=scheme, with_res=with_res, scale=scale):
                    y = fused.rmsnorm(xs[i], w, residual=rs[i] if with_res else None, **kw)
                    if with_res:
                        y = y[0]
                    return nqdq.quantize(y, scheme, scale=scale)

                out_f = fused_fn(0)
                qf = out_f[0] if with_res else out_f
                ok_full = "not run" if args.fused_only else q_same(qf, unfused_fn(0))
                x_h = bf16_host(xs[0])[sample].astype(np.float32)
                r_h = bf16_host(rs[0])[sample].astype(np.float32) if with_res else None
                s = None if scale is None else np.full(sch.scale_shape((SAMPLE_ROWS, n)), scale, np.float32)
                parts, new_res = R.rmsnorm_quantize(x_h, w_h, sch, np.float32(1e-6), "bfloat16", "bfloat16", res32=r_h,
                                                    scale=s)
                codes_ref = pack_codes(parts.codes, 4) if sch.code_bits == 4 else parts.codes
                ok_ref = same(_host(qf.codes)[sample], codes_ref)
                if scale is None:
                    ok_ref = ok_ref and same(_host(qf.scales)[sample], parts.scales)
                if with_res:
                    ok_ref = ok_ref and same(_host(out_f[1])[sample], new_res.view(np.uint16))
                checks.append(dict(op=op, full_vs_unfused=ok_full, rows_vs_reference=ok_ref))
                nbytes = in_bytes + n * 2 + code_bytes(scheme, rows, n) + (2 * in_bytes if with_res else 0)
                record(op, fused_fn, None if args.fused_only else unfused_fn, nbytes)
            except Exception:
                traceback.print_exc()
                checks.append(dict(op=op, error=traceback.format_exc(limit=2)))

    # ---- flatten + quantize: contiguous [rows, H, 128] and a transposed view
    hh = n // 128
    xt = [cp.ascontiguousarray(x.reshape(rows, hh, 128).transpose(1, 0, 2)) for x in xs]  # [H, rows, 128]
    for scheme in ("fp8_1x128", "mxfp4"):
        for layout in ("transposed view",):  # a contiguous [B, H, D] goes to nqdq.quantize itself
            op = f"flatten({layout})+{scheme}"
            if args.only and args.only not in op:
                continue
            try:
                src = [x.reshape(rows, hh, 128) for x in xs] if layout == "contiguous" else [a.transpose(1, 0, 2) for a in xt]

                def fused_fn(i, scheme=scheme, src=src):
                    return fused.flatten_quantize(src[i], scheme, **kw)

                def unfused_fn(i, scheme=scheme, src=src):
                    return nqdq.quantize(cp.ascontiguousarray(src[i]).reshape(rows, hh * 128), scheme, **kw)

                qf, qu = fused_fn(0), unfused_fn(0)
                sch = resolve_scheme(scheme)
                x_h = bf16_host(xs[0]).astype(np.float32)[sample]
                parts = R.flatten_quantize(x_h.reshape(SAMPLE_ROWS, hh, 128), sch)
                codes_ref = pack_codes(parts.codes, 4) if sch.code_bits == 4 else parts.codes
                ok_ref = same(_host(qf.codes)[sample], codes_ref) and same(_host(qf.scales)[sample], parts.scales)
                checks.append(dict(op=op, full_vs_unfused=q_same(qf, qu), rows_vs_reference=ok_ref))
                record(op, fused_fn, unfused_fn, in_bytes + code_bytes(scheme, rows, n))
            except Exception:
                traceback.print_exc()
                checks.append(dict(op=op, error=traceback.format_exc(limit=2)))

    def moe_op(T, k):
        op = f"moe_sort+mxfp4 [{T}x{n}, top-{k}]"
        op2 = op + " (check_ids=False)"
        try:
            if args.only and args.only not in op2:  # (op2's name holds op's: --only check_ids times op2 alone)
                raise StopIteration
            E = 256
            tok = [x[:T] for x in xs] if T <= rows else random_bf16_sets((T, n), n_sets_for(T * n * 2, l2, cap=4), seed=4)
            rng = np.random.default_rng(5)
            ids_h = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
            ids_h[:, 0] = np.minimum(ids_h[:, 0], E - 8)  # experts E-8..E-1 mostly empty: exercises empty ranges
            ids = cp.asarray(ids_h)

            def fused_fn(i):
                return fused.moe_sort_quantize(tok[i], ids, E, "mxfp4", **kw)

            def unfused_fn(i):
                order = cp.argsort(ids.reshape(-1), kind="stable")
                perm = (order // k).astype(cp.int32)
                return nqdq.quantize(cp.take(tok[i], perm, axis=0), "mxfp4", **kw)

            qf, perm, offsets = fused_fn(0)
            qu = unfused_fn(0)
            perm_ref, off_ref = R.moe_sort(ids_h, E)
            ok_perm = same(perm, perm_ref) and same(offsets, off_ref)
            sch = resolve_scheme("mxfp4")
            x_h = bf16_host(tok[0]).astype(np.float32)
            rsample = np.sort(np.random.default_rng(0).choice(T * k, min(SAMPLE_ROWS, T * k), replace=False))
            parts = RQ.quantize(x_h[perm_ref[rsample]], sch)
            ok_ref = same(_host(qf.codes)[rsample], pack_codes(parts.codes, 4))
            ok_ref = ok_ref and same(_host(qf.scales)[rsample], parts.scales)
            checks.append(dict(op=op, full_vs_unfused=q_same(qf, qu) and ok_perm, rows_vs_reference=ok_ref,
                               perm_offsets_vs_reference=ok_perm))
            # the op's bytes: x [T, n] and the ids read once, the [rows, n] codes and scales, perm
            # and offsets written (older tables counted x as the gathered rows, k times its
            # size: 148.7 MB instead of 60.6 at the default size)
            nbytes = T * n * 2 + code_bytes("mxfp4", T * k, n) + ids_h.nbytes + T * k * 4 + (E + 1) * 4
            record(op, fused_fn, unfused_fn, nbytes, len(tok))
            # the same without the read-back of the device's id range check (the call's one wait)

            def fused_nc(i):
                return fused.moe_sort_quantize(tok[i], ids, E, "mxfp4", check_ids=False, **kw)

            qn, permn, offn = fused_nc(0)
            checks.append(dict(op=op2, full_vs_unfused=q_same(qn, qf) and same(permn, perm) and same(offn, offsets),
                               rows_vs_reference=ok_ref))
            record(op2, fused_nc, unfused_fn, nbytes, len(tok))
        except StopIteration:
            pass
        except Exception:
            traceback.print_exc()
            checks.append(dict(op=op, error=traceback.format_exc(limit=2)))

    # ---- MoE sort + MXFP4: T tokens (default rows/4), top-k of 256 experts -> T * k gathered rows
    for T in (args.moe_tokens or [rows, rows // args.moe_k]):
        moe_op(T, args.moe_k)

    variants = []
    default_upt = R.MAX_UNITS_PER_THREAD
    for upt in args.units_per_thread:
        R.MAX_UNITS_PER_THREAD = upt
        nw, u = R.row_geometry(n)
        for scheme in ("fp8_row", "mxfp4"):
            for with_res in (False, True):
                def f(i, scheme=scheme, with_res=with_res):
                    return fused.rmsnorm_quantize(xs[i], w, scheme, residual=rs[i] if with_res else None, **kw)

                qf = f(0)
                qf = qf[0] if with_res else qf
                y = fused.rmsnorm(xs[0], w, residual=rs[0] if with_res else None, **kw)
                ok = q_same(qf, nqdq.quantize(y[0] if with_res else y, scheme))
                t_v, _ = timer.device_us(f, nsets, bytes_per_launch=in_bytes)
                variants.append((f"rmsnorm{'+res' if with_res else ''}+{scheme}, {nw} warps x {u} units", t_v, ok))
    R.MAX_UNITS_PER_THREAD = default_upt
    geo = f"; layout {R.row_geometry(n)[0]} warps x {R.row_geometry(n)[1]} units per lane"

    tag = " ".join(f"{k[11:]}={v}" for k, v in sorted(os.environ.items()) if k.startswith("NQDQ_FUSED_"))
    print(f"\ndevice: {dev}; input bf16 [{rows}, {n}]; copy {copy_gbs:.0f} GB/s ({t_copy:.1f} us){geo}"
          + (f"; switches {tag}" if tag else ""))
    print(f"{'op':36s} {'us':>8s} {'GB/s':>7s} {'%copy':>6s} {'unfused us':>10s} {'speedup':>7s}  exact")
    chk = {c["op"]: c for c in checks}
    for r in results[1:]:
        c = chk.get(r["op"], {})
        exact = "yes" if c.get("full_vs_unfused") and c.get("rows_vs_reference") else f"NO {c}"
        if c.get("full_vs_unfused") == "not run" and c.get("rows_vs_reference"):
            exact = "yes (sampled rows vs spec)"
        name = f"{r['op']} [{tag}]" if tag else r["op"]
        print(f"{name:36s} {r['us']:8.1f} {r['gbs']:7.0f} {100 * r['frac_copy']:5.1f}% {r['unfused_us']:10.1f} "
              f"{r['speedup']:6.2f}x  {exact}" + ("  (host-bound)" if r["host_bound"] else ""))
    for name, t_v, ok in variants:
        print(f"{name:36s} {t_v:8.1f} us  exact vs unfused: {'yes' if ok else 'NO'}")
    for c in checks:
        if "error" in c:
            print(f"{c['op']}: ERROR {c['error']}")
    if test_rc is not None:
        print(f"pytest -m gpu tests/test_fused_gpu.py: exit code {test_rc}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(device=dev, rows=rows, hidden=n, results=results, checks=checks,
                                                   pytest_rc=test_rc), indent=1, default=str))
    ok = all(c.get("full_vs_unfused") and c.get("rows_vs_reference") for c in checks)  # "not run" counts as passed
    return 0 if ok and not test_rc else 1


if __name__ == "__main__":
    sys.exit(main())
