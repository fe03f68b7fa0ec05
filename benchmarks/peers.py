"""Quantization kernels side by side with their peers, in one run on one GPU.

    python3 benchmarks/peers.py [--json FILE] [--quick] [--sizes 64x7168,...] [--schemes ...]
        [--seed S] [--bound stripe-stream [--stream-variants ...]]

For bfloat16 inputs of 8192x8192, 16384x7168 and 64x7168 it times, with CUDA events:

* ``copy``: a device-to-device ``cudaMemcpyAsync`` of the input (the bandwidth ceiling;
  bytes = read + written);
* ``triton fp8_row``: a per-token dynamic FP8 quantizer in the style of aiter's
  ``_dynamic_per_token_quant_fp8_i8_kernel`` (one program per row, amax, scale = amax/448,
  x * (1/scale) -> e4m3);
* ``torch.compile fp8_row``: the same math through ``torch.compile``;
* ``nqdq <scheme>``: ``nqdq.quantize`` on CuPy arrays for each scheme of ``--schemes``
  (default fp8_row, int8_row, mxfp8, mxfp4, nvfp4, fp8_1x128), when this nqdq has a GPU
  path (else the row says why not);
* with ``--seed S``: each nqdq scheme again under stochastic rounding
  (``rounding="stochastic", seed=S``: ``nqdq <scheme> SR``), beside the round-to-nearest row
  and the copy. A scheme written ``NAME~sr`` in ``--schemes`` times only that variant (seed
  ``--seed``, default 1);
* with ``--bound stripe-stream``: the per-channel read pattern alone (a stream with no amax
  and no encode, in the order a one-pass per-channel kernel must read; described above
  ``stream_kernel``), beside copy, and beside int8_column with ``--schemes int8_column``
  (docs/design/per-channel.md, "The bound").

Method (docs/performance.md, "Method"): fresh random inputs (never zeros), several input sets
rotated so that what one launch reads is not in L2 from the one before (sets x bytes
>= 4 x L2), warm-up launches excluded, then a sleep kernel is queued so that the host
runs ahead of the device (host launch overhead stays out of device times; a run where
the host fell behind anyway is flagged ``host-bound``), events around each group of
launches, median over groups. GB/s counts bytes read + bytes written once each.
torch and triton are optional: their rows are skipped when they are not installed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

SIZES = [(8192, 8192), (16384, 7168), (64, 7168)]
NO_COMPILE = False
# schemes whose scales come from every row: checked on the whole tensor, not its first rows
_WHOLE_TENSOR_CHECK = ("nvfp4", "fp8_tensor", "int8_column")
NQDQ_SCHEMES = ["fp8_row", "int8_row", "mxfp8", "mxfp4", "nvfp4", "fp8_1x128"]
SR_SEED = 1  # --seed: the seed of the stochastic-rounding rows
# scheme-name suffix -> label suffix: stochastic rounding
_SR_VARIANTS = {"~sr": " SR"}


# ---------------------------------------------------------------------------------------
# timing


def _spin_kernel():
    from numba import cuda

    @cuda.jit
    def spin(n_us):
        if cuda.threadIdx.x == 0:
            for _ in range(n_us):
                cuda.nanosleep(1000)

    return spin


class Timer:
    """CUDA-event timing on the legacy default stream (where CuPy, torch, Triton, Numba and
    FastKernel all launch by default), with a sleep kernel that lets the host run ahead."""

    def __init__(self):
        import cupy

        self.cp = cupy
        self.spin = _spin_kernel()
        self.spin[1, 32](1)
        cupy.cuda.runtime.deviceSynchronize()
        # calibrate: how long does spin(n) take on this device?
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record()
        self.spin[1, 32](2000)
        b.record()
        b.synchronize()
        self.us_per_unit = max(cupy.cuda.get_elapsed_time(a, b) * 1000 / 2000, 0.05)
        self.l2_bytes = cupy.cuda.Device().attributes["L2CacheSize"]

    def sleep_us(self, us):
        self.spin[1, 32](int(us / self.us_per_unit) + 1)

    def device_us(self, launch, n_sets, *, groups=25, per_group=None, bytes_per_launch=0, warmup=5):
        """Median device time of ``launch(i)`` (i: input set index), in microseconds."""
        cp = self.cp
        if per_group is None:
            per_group = 1 if bytes_per_launch > self.l2_bytes else 20
        for i in range(warmup):
            launch(i % n_sets)
        cp.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        for i in range(3):
            launch(i % n_sets)
        host_us = (time.perf_counter() - t0) / 3 * 1e6
        cp.cuda.runtime.deviceSynchronize()
        n = groups * per_group
        self.sleep_us(min(1.5 * n * host_us + 2000, 3_000_000))
        slept = cp.cuda.Event()
        slept.record()
        evs = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(groups)]
        k = 0
        for start, end in evs:
            start.record()
            for _ in range(per_group):
                launch(k % n_sets)
                k += 1
            end.record()
        host_bound = slept.done  # the device finished sleeping before the host queued all
        evs[-1][1].synchronize()
        times = [cp.cuda.get_elapsed_time(s, e) * 1000 / per_group for s, e in evs]
        return statistics.median(times), host_bound


# ---------------------------------------------------------------------------------------
# inputs


def random_bf16_sets(shape, n_sets, seed=0):
    """``n_sets`` CuPy arrays of random bf16 (standard normal times 2^U(-4, 4) per row),
    stored as uint16 bit patterns (truncated float32)."""
    import cupy as cp

    rng = cp.random.default_rng(seed)
    out = []
    for _ in range(n_sets):
        f = rng.standard_normal(shape, dtype=cp.float32)
        f *= cp.exp2(rng.uniform(-4, 4, (shape[0], 1), dtype=cp.float32))
        out.append((f.view(cp.uint32) >> 16).astype(cp.uint16))
    return out


def n_sets_for(bytes_per_set, l2_bytes, cap=256):
    return int(min(cap, max(2, math.ceil(4 * l2_bytes / max(bytes_per_set, 1)))))


# ---------------------------------------------------------------------------------------
# peers (optional)


def _triton_fp8_row():
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def per_token_fp8(q_ptr, s_ptr, x_ptr, cols, stride_x, stride_q, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < cols
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        amax = tl.max(tl.abs(x), axis=0)
        scale = amax / 448.0
        q = (x * (1.0 / scale)).to(q_ptr.dtype.element_ty)
        tl.store(s_ptr + row, scale)
        tl.store(q_ptr + row * stride_q + offs, q, mask=mask, cache_modifier=".cs")

    def run(x, q, s):
        rows, cols = x.shape
        per_token_fp8[(rows,)](q, s, x, cols, x.stride(0), q.stride(0), BLOCK=triton.next_power_of_2(cols))

    return run, torch


def _torch_compile_fp8_row():
    import torch

    @torch.compile(dynamic=False)
    def per_token_fp8(x):
        xf = x.float()
        scale = xf.abs().amax(dim=1, keepdim=True) / 448.0
        q = (xf / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        return q, scale

    return per_token_fp8


def nqdq_launcher(scheme_name, seed=None):
    """``x_uint16 -> QuantParts`` through ``nqdq.gpu.quantize.plan.quantize`` (bf16 bits;
    ``seed``: stochastic rounding)."""
    import nqdq.gpu.quantize.plan as KQ
    from nqdq.schemes import resolve_scheme

    sch = resolve_scheme(scheme_name)
    return lambda x: KQ.quantize(x, sch, dtype="bfloat16", seed=seed)


_AMAX_OUT: dict = {}  # "+amax" rows: scheme name -> its amax array (one for all its calls)


def _static(scheme_name):
    """"fp8_tensor@0.05": the scheme with a caller-given (static) scale 0.05 -> (name, kw);
    "fp8_tensor@0.05+amax": also the amax by-product (kw amax_out: a CuPy float32[1]);
    "mxfp4~sr": stochastic rounding with seed SR_SEED (kw rounding, seed)."""
    full = scheme_name
    scheme_name, sr = _sr_variant(scheme_name)
    scheme_name, plus, _ = scheme_name.partition("+amax")
    name, _, scale = scheme_name.partition("@")
    kw = {"scale": float(scale)} if scale else {}
    if plus:
        import cupy as cp

        kw["amax_out"] = _AMAX_OUT.setdefault(full, cp.zeros(1, cp.float32))
    if sr is not None:
        kw.update(rounding="stochastic", seed=SR_SEED)
    return name, kw


def _sr_variant(scheme_name):
    """(the name without its ~sr suffix, that suffix or None)."""
    for suffix in _SR_VARIANTS:
        if scheme_name.endswith(suffix):
            return scheme_name[: -len(suffix)], suffix
    return scheme_name, None


def nqdq_runner(scheme_name, x_u16):
    """``(label, run)``: ``run(x_uint16)`` quantizes bf16 bits on the GPU with
    ``nqdq.quantize`` when it takes CuPy arrays (as uint16 + ``dtype="bfloat16"``, or as a
    CuPy bfloat16 array), else with the kernels' launcher. Raises when neither works."""
    import ml_dtypes

    import nqdq

    scheme_name, kw = _static(scheme_name)
    tries = [
        ("nqdq.quantize", lambda x: nqdq.quantize(x, scheme_name, dtype="bfloat16", **kw)),
        ("nqdq.quantize", lambda x: nqdq.quantize(x.view(ml_dtypes.bfloat16), scheme_name, **kw)),
        ("nqdq.gpu launcher", nqdq_launcher(scheme_name, kw.get("seed"))),
    ]
    errors = []
    for label, run in tries:
        try:
            q = run(x_u16)
            if not hasattr(q.codes, "__cuda_array_interface__"):
                raise TypeError("returned host arrays")
            return label, run
        except Exception as e:
            errors.append(f"{label}: {type(e).__name__}: {str(e)[:100]}")
    raise RuntimeError("; ".join(errors))


# ---------------------------------------------------------------------------------------


def bench_size(timer, shape, rows_out, *, quick=False, stream_variants=(), log=print):
    import cupy as cp
    import ml_dtypes

    rows, cols = shape
    in_bytes = rows * cols * 2
    # input + fp8 codes + per-row scales: the largest working set of the fp8_row peers
    n_sets = n_sets_for(in_bytes + rows * cols + rows * 4, timer.l2_bytes)
    if quick:
        n_sets = min(n_sets, 4)
    xs = random_bf16_sets(shape, n_sets, seed=rows * 31 + cols)
    groups = 10 if quick else 25

    def add(impl, us, nbytes, host_bound, note=""):
        gbs = nbytes / (us * 1e-6) / 1e9
        rows_out.append(dict(shape=f"{rows}x{cols}", impl=impl, us=us, bytes=nbytes, gbs=gbs,
                             host_bound=bool(host_bound), note=note))  # fmt: skip
        log(f"  {impl:38s} {us:10.2f} us {gbs:8.0f} GB/s{'  host-bound' if host_bound else ''} {note}")

    def skip(impl, why):
        rows_out.append(dict(shape=f"{rows}x{cols}", impl=impl, us=None, bytes=None, gbs=None, note=why))
        log(f"  {impl:38s} skipped: {why}")

    log(f"{rows}x{cols} bf16: {n_sets} input sets")

    # copy: the ceiling
    dst = cp.empty_like(xs[0])

    def copy(i):
        dst.data.copy_from_device_async(xs[i].data, in_bytes)

    us, hb = timer.device_us(copy, n_sets, groups=groups, bytes_per_launch=2 * in_bytes)
    add("copy (cudaMemcpyAsync D2D)", us, 2 * in_bytes, hb)
    if stream_variants:
        bench_stripe_stream(timer, xs, n_sets, groups, stream_variants, add, skip)

    # the peers' reference: nqdq's NumPy fp8_row of the first rows of one set
    import nqdq

    nbytes = in_bytes + rows * cols + rows * 4
    check = min(rows, 64)  # rows are independent: check the first 64 against the reference
    xh = xs[0][:check].get().view(ml_dtypes.bfloat16)
    ref_codes = nqdq.quantize(xh, "fp8_row", device="cpu").codes.view(np.uint8)

    # triton + torch.compile
    try:
        triton_run, torch = _triton_fp8_row()
    except Exception as e:  # torch/triton absent
        skip("triton fp8_row (aiter-style)", f"{type(e).__name__}: {e}")
        torch = None
    if torch is not None:
        tx = [torch.as_tensor(x.view(cp.int16), device="cuda").view(torch.bfloat16) for x in xs]
        tq = [torch.empty((rows, cols), dtype=torch.float8_e4m3fn, device="cuda") for _ in range(n_sets)]
        ts = [torch.empty(rows, dtype=torch.float32, device="cuda") for _ in range(n_sets)]

        def tri(i):
            triton_run(tx[i], tq[i], ts[i])

        us, hb = timer.device_us(tri, n_sets, groups=groups, bytes_per_launch=in_bytes)
        tri(0)
        torch.cuda.synchronize()
        agree = float(np.mean(tq[0][:check].view(torch.uint8).cpu().numpy() == ref_codes))
        add("triton fp8_row (aiter-style)", us, nbytes, hb, f"codes = reference: {agree:.4%}")
        try:
            if NO_COMPILE:
                raise RuntimeError("skipped (--no-compile)")
            comp = _torch_compile_fp8_row()
            t0 = time.perf_counter()
            comp(tx[0])
            torch.cuda.synchronize()
            log(f"    torch.compile took {time.perf_counter() - t0:.1f} s")

            def tc(i):
                comp(tx[i])

            us, hb = timer.device_us(tc, n_sets, groups=groups, bytes_per_launch=in_bytes)
            q, _ = comp(tx[0])
            torch.cuda.synchronize()
            agree = float(np.mean(q[:check].view(torch.uint8).cpu().numpy() == ref_codes))
            add("torch.compile fp8_row", us, nbytes, hb, f"codes = reference: {agree:.4%}")
        except Exception as e:
            skip("torch.compile fp8_row", f"{type(e).__name__}: {e}")
        del tx, tq, ts

    # nqdq's own kernels, when this nqdq has a GPU path
    for scheme in NQDQ_SCHEMES:
        bench_nqdq(timer, scheme, xs, n_sets, groups, in_bytes, add, skip, log)


def bench_nqdq(timer, scheme, xs, n_sets, groups, in_bytes, add, skip, log):
    """nqdq's kernels for ``scheme`` through ``nqdq.quantize`` on CuPy arrays (uint16 bits +
    ``dtype="bfloat16"``; the plan's generated runner on a GPU), timed like the peers:
    ``Timer.device_us`` queues a sleep kernel first, so the host (a few us per call) runs
    ahead and the events around each group of calls measure the device: all kernels of a
    call (nvfp4: 3), back to back. A row flagged host-bound measured the host instead.
    Codes and scales are checked against the NumPy reference on the first rows (stochastic
    rounding too: an element's random bits depend on its linear index, which the first rows
    share with the whole tensor)."""
    import cupy as cp
    import ml_dtypes

    import nqdq

    _, sr = _sr_variant(scheme)
    name = f"nqdq {_sr_variant(scheme)[0]}" + (_SR_VARIANTS[sr] if sr else "")
    try:
        label, run = nqdq_runner(scheme, xs[0])
        parts = run(xs[0])
        for i in range(3):  # warm-up: every kernel of this scheme compiled and loaded
            run(xs[i % n_sets])
        cp.cuda.runtime.deviceSynchronize()
        us, hb = timer.device_us(lambda i: run(xs[i]), n_sets, groups=groups, bytes_per_launch=in_bytes)
        from nqdq.schemes import resolve_scheme

        plan_launches = None
        try:
            import nqdq.gpu.quantize.plan as KQ

            base, kw = _static(scheme)
            static = "scale" in kw
            sch = resolve_scheme(base, static_scale=True) if static else resolve_scheme(base)
            plan = KQ.get_plan(tuple(xs[0].shape), 1, sch, static_scale=static, stoch="seed" in kw,
                               amax="amax_out" in kw)  # fmt: skip
            plan_launches = [k.py_func.__name__ if hasattr(k, "py_func") else str(k) for k, _, _, _ in plan.launches]
        except Exception:
            pass
    except Exception as e:
        skip(name, f"{type(e).__name__}: {str(e)[:160]}")
        return
    out = [getattr(parts, f, None) for f in ("codes", "scales", "zero_points", "tensor_scale", "means")]
    out_bytes = sum(int(a.nbytes) for a in out if a is not None and hasattr(a, "nbytes"))
    note = f"kernels: {'+'.join(plan_launches) if plan_launches else '?'}"
    amax_out = _static(scheme)[1].pop("amax_out", None)
    if amax_out is not None:  # the amax of xs[0], whole tensor, against the reference's
        from nqdq.reference.scales import tensor_amax

        run(xs[0])
        want = tensor_amax(xs[0].get().view(ml_dtypes.bfloat16), finite=scheme.startswith("nvfp4"))
        same = amax_out.get().view(np.uint32)[0] == np.float32(want).view(np.uint32)
        note += f"; amax {'bit-exact' if same else 'DIFFERS from reference'}"
    try:  # row-wise schemes: the first rows alone are a valid input; a scale taken over every row
        # (nvfp4's tensor scale, dynamic per-tensor, per-channel) needs the whole tensor
        check = min(xs[0].shape[0], 128)
        whole = _sr_variant(scheme)[0] in _WHOLE_TENSOR_CHECK and check < xs[0].shape[0]
        if sr and whole:
            # the NumPy reference of a whole large tensor with Philox bits takes about a minute:
            # tests/test_stochastic_lastaxis_gpu.py checks these kernels bit for bit instead
            note += "; not checked here (stochastic, whole-tensor scale)"
        elif not whole:
            base, kw = _static(scheme)
            kw.pop("amax_out", None)
            ref = nqdq.quantize(xs[0][:check].get().view(ml_dtypes.bfloat16), base, device="cpu", **kw)
            got_codes = parts.codes[:check].get()
            got_scales = parts.scales[: ref.scales.shape[0]].get()
            same = np.array_equal(got_codes, ref.codes) and np.array_equal(
                got_scales.view(np.uint8), np.ascontiguousarray(ref.scales).view(np.uint8)
            )
            note += f"; first {check} rows {'bit-exact' if same else 'DIFFER from'} reference"
        else:  # the whole tensor against the reference
            xh = xs[0].get().view(ml_dtypes.bfloat16)
            base, kw = _static(scheme)
            kw.pop("amax_out", None)
            ref = nqdq.quantize(xh, base, device="cpu", **kw)
            same = np.array_equal(parts.codes.get(), ref.codes) and np.array_equal(
                parts.scales.get().view(np.uint8), np.ascontiguousarray(ref.scales).view(np.uint8)
            ) and (ref.tensor_scale is None or np.array_equal(np.asarray(parts.tensor_scale.get()).view(np.uint32),
                                                               np.asarray(ref.tensor_scale).view(np.uint32)))
            note += f"; whole tensor {'bit-exact' if same else 'DIFFERS from'} reference"
    except Exception as e:
        note += f"; check failed: {type(e).__name__}: {str(e)[:80]}"
    add(name, us, in_bytes + out_bytes, hb, note)


# ---------------------------------------------------------------------------------------
# --bound stripe-stream: the per-channel read pattern alone (docs/design/per-channel.md)
#
# A one-pass per-channel quantizer must hold a stripe of channels down *all* the rows before
# it writes any code of it, so it reads the input as 128-byte row pieces of a few adjacent
# stripes at a time (nqdq.gpu.quantize.column_cluster: the stripes of the resident clusters).
# This stream times that read pattern alone: persistent blocks of STREAM_NT threads take
# items (a stripe of WU 16-byte units by UI x STREAM_NT / WU rows) and copy each to the
# output as two XORs of its units (no reduction, no scale, no encode, no block barrier), with
# NBUF items in flight a block (cp.async, the .L2::256B prefetch size or not). Items go
# stripe by stripe, by a ticket (atom.add: the hardware's launch order, as the cluster kernel
# gets it) or statically (block b takes b, b + grid, ...); or, as the control, band of rows
# by band (every stripe of a band in turn, a copy's order). Bytes count as for int8_column
# (input + one byte a value + four a channel), so "% of copy" is the figure int8_column is
# held to.
#
# A variant is UI:NBUF:BPS:L2:TICKET[:ORDER[:WU]]: units a thread an item, items in flight a
# block, blocks an SM (0: no launch bound), the 256-byte prefetch size, ticket order; ORDER 1:
# the control (band by band); WU: row pieces of WU 16-byte units (8, 128 bytes, by default).

STREAM_NT, STREAM_WU = 512, 8  # threads a block; 16-byte units a row piece by default (128 bytes)
STREAM_VARIANTS = "16:1:2:1:1,8:1:2:1:1,8:2:1:1:1,8:2:1:0:1,4:3:2:1:1,16:1:2:1:0,8:1:2:1:1:1,8:1:2:1:1:0:32"

_STREAM_FUNCS = """
def piece(k, chunks, upr, t):  # unit index of thread t's first unit of item k
    if ORDER == 0:  # stripe by stripe (a per-channel kernel's order)
        st = k // chunks
        ch = k - st * chunks
    else:  # band of rows by band, every stripe of a band in turn (a copy's order)
        ns = upr // W
        ch = k // ns
        st = k - ch * ns
    return (np.int64(ch) * ROWS + t // W) * upr + st * W + t % W

def issue(buf, sb, x32, g, b, t, upr):  # item's units into buffer b (cp.async)
    for i in range(UI):
        CP(buf, sb, ((b * UI + i) * NT + t) * 4, x32, (g + i * (RG * np.int64(upr))) * 4, True)

def drain(buf, sb, c32, g, b, t, upr):  # buffer b's units out as two XORs each
    for i in range(UI):
        w = ld_shared_u32x4(buf, sb, ((b * UI + i) * NT + t) * 4)
        store_u32x2(c32, g + i * (RG * np.int64(upr)), w[0] ^ w[1], w[2] ^ w[3])
"""

# static order: block b takes items b, b + grid, b + 2 grid, ...
_STREAM_STATIC = """
def stream(x, nitems, chunks, upr, codes):
    t = cuda.threadIdx.x
    buf = cuda.shared.array(0, u32)
    sb = smem_addr(buf)
    x32 = as_u32(x)
    c32 = as_u32(codes)
    G = cuda.gridDim.x
    k = cuda.blockIdx.x
    for b in range(NBUF):
        if k + b * G < nitems:
            issue(buf, sb, x32, piece(k + b * G, chunks, upr, t), b, t, upr)
        commit()
    j = 0
    while k < nitems:
        waitn()  # this thread's copies of item k have landed (it reads only its own slots)
        b = j % NBUF
        drain(buf, sb, c32, piece(k, chunks, upr, t), b, t, upr)
        if k + NBUF * G < nitems:
            issue(buf, sb, x32, piece(k + NBUF * G, chunks, upr, t), b, t, upr)
        commit()
        k += G
        j += 1
"""

# ticket order: thread 0 takes the block's next item by atom.add; a block stops taking
# tickets after its first one past the end, so a launch takes nitems + grid tickets
_STREAM_TICKET = """
def stream(x, nitems, chunks, upr, codes, counter, base):
    t = cuda.threadIdx.x
    buf = cuda.shared.array(0, u32)
    tk = cuda.shared.array(NBUF, i32)
    sb = smem_addr(buf)
    x32 = as_u32(x)
    c32 = as_u32(codes)
    if t == 0:
        v = 0
        for b in range(NBUF):
            if v < nitems:
                v = cuda.atomic.add(counter, 0, 1) - base
            tk[b] = v
    cuda.syncthreads()
    for b in range(NBUF):
        if tk[b] < nitems:
            issue(buf, sb, x32, piece(tk[b], chunks, upr, t), b, t, upr)
        commit()
    j = 0
    while tk[j % NBUF] < nitems:
        b = j % NBUF
        waitn()
        drain(buf, sb, c32, piece(tk[b], chunks, upr, t), b, t, upr)
        cuda.syncthreads()  # every thread has read tk[b]
        if t == 0:
            last = tk[(b + NBUF - 1) % NBUF]  # the newest ticket taken
            tk[b] = last if last >= nitems else cuda.atomic.add(counter, 0, 1) - base
        cuda.syncthreads()
        if tk[b] < nitems:
            issue(buf, sb, x32, piece(tk[b], chunks, upr, t), b, t, upr)
        commit()
        j += 1
"""


def stream_kernel(UI, NBUF, BPS, L2, TK, ORDER=0, WU=None):
    """The stream kernel (a FastKernel) of one variant: row pieces of WU units (default STREAM_WU)."""
    from numba import cuda, types

    from nqdq.gpu.ptx.memory import as_u32, store_u32x2
    from nqdq.gpu.ptx.mma import (# fmt: skip
        cp_async_commit, cp_async_unit, cp_async_unit_l2_256, cp_async_wait, ld_shared_u32x4, smem_addr,
    )
    from nqdq.gpu.runtime.launch import FastKernel

    wu = WU or STREAM_WU
    rg = STREAM_NT // wu  # rows a block reads at a time
    glb = dict(cuda=cuda, np=np, u32=types.uint32, i32=types.int32, smem_addr=smem_addr, as_u32=as_u32,
               store_u32x2=store_u32x2, ld_shared_u32x4=ld_shared_u32x4, commit=cp_async_commit,
               waitn=cp_async_wait(NBUF - 1), CP=cp_async_unit_l2_256 if L2 else cp_async_unit, NT=STREAM_NT,
               W=wu, RG=rg, UI=UI, NBUF=NBUF, ROWS=UI * rg, ORDER=ORDER)  # fmt: skip
    exec(compile(_STREAM_FUNCS, "<stripe stream functions>", "exec"), glb)
    for f in ("piece", "issue", "drain"):
        glb[f] = cuda.jit(glb[f], device=True)
    exec(compile(_STREAM_TICKET if TK else _STREAM_STATIC, f"<stripe stream UI={UI} NBUF={NBUF} TK={TK}>", "exec"), glb)
    k = cuda.jit(glb["stream"]) if BPS == 0 else cuda.jit(glb["stream"], launch_bounds=(STREAM_NT, BPS))
    k.nqdq_dynamic_smem = NBUF * UI * STREAM_NT * 16
    return FastKernel(k)


def stream_items(R, C, UI, WU=None):
    """(chunks of rows a stripe, units a row, items) of an R x C bf16 input cut into items of
    UI x STREAM_NT / WU rows by a stripe of WU units; None where the shape is not a multiple."""
    wu = WU or STREAM_WU
    upr = C // 8
    if C % 8 or R % (UI * (STREAM_NT // wu)) or upr % wu:
        return None
    chunks = R // (UI * (STREAM_NT // wu))
    return chunks, upr, chunks * (upr // wu)


def bench_stripe_stream(timer, xs, n_sets, groups, variants, add, skip):
    """Each stream variant on the input sets ``xs`` (bf16 bits), timed like the copy beside it;
    its output checked against the XORs computed by CuPy, and a ticket variant's count
    against the tickets it must have taken (items + grid)."""
    import cupy as cp

    R, C = xs[0].shape
    n = R * C
    out = cp.empty((R, C), cp.uint8)
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    w = xs[0].reshape(-1).view(cp.uint32).reshape(-1, 4)
    want = cp.stack([w[:, 0] ^ w[:, 1], w[:, 2] ^ w[:, 3]], axis=1).reshape(-1)
    for v in variants:
        impl = f"stripe stream {v}"
        UI, NBUF, BPS, L2, TK, ORDER, WU = (int(p) for p in (v + ":0:0:0").split(":")[:7])
        geo = stream_items(R, C, UI, WU)
        if geo is None:
            skip(impl, "shape not a multiple of the item")
            continue
        chunks, upr, nitems = geo
        fk = stream_kernel(UI, NBUF, BPS, L2, TK, ORDER, WU)
        G = sms * BPS
        counter = cp.zeros(1, cp.int32)
        base = [0]

        def args(i, chunks=chunks, upr=upr, nitems=nitems, TK=TK, G=G, counter=counter, base=base):
            if not TK:
                return (xs[i].reshape(-1), nitems, chunks, upr, out.reshape(-1))
            b = base[0]  # each launch takes nitems + G tickets (one past the end a block)
            base[0] += nitems + G
            return (xs[i].reshape(-1), nitems, chunks, upr, out.reshape(-1), counter, b)

        out[...] = 0
        fk.launch(G, STREAM_NT, args(0))
        ok = bool(cp.array_equal(want, out.reshape(-1).view(cp.uint32)))
        if TK:
            ok = ok and int(counter[0]) == nitems + G
        us, hb = timer.device_us(lambda i: fk.launch(G, STREAM_NT, args(i)), n_sets, groups=groups,
                                 bytes_per_launch=3 * n)  # fmt: skip
        add(impl, us, 3 * n + 4 * C, hb, f"grid {G}, {nitems} items; output {'right' if ok else 'WRONG'}")


def table(rows):
    """Markdown table; % of copy is against the copy of the same input size."""
    copy = {r["shape"]: r["gbs"] for r in rows if r["impl"].startswith("copy") and r["gbs"]}
    peak = max(copy.values()) if copy else None
    lines = ["| shape (bf16) | implementation | us (median) | GB/s | % of copy (same size) | % of peak copy |",
             "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    skipped = {}
    for r in rows:
        if r["gbs"] is None:
            skipped.setdefault(f"{r['impl']}: {r['note']}", []).append(r["shape"])
            continue
        c = copy.get(r["shape"])
        pc = f"{100 * r['gbs'] / c:.0f}%" if c else "-"
        pp = f"{100 * r['gbs'] / peak:.0f}%" if peak else "-"
        flag = " (host-bound)" if r.get("host_bound") else ""
        lines.append(f"| {r['shape']} | {r['impl']}{flag} | {r['us']:.2f} | {r['gbs']:.0f} | {pc} | {pp} |")
    if skipped:
        lines.append("")
    for what, shapes in skipped.items():
        lines.append(f"skipped ({', '.join(shapes)}): {what}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--quick", action="store_true", help="fewer sets and groups (smoke test)")
    ap.add_argument("--sizes", default=None, help="e.g. 64x7168,8192x8192")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer (slow to compile)")
    ap.add_argument("--schemes", default=None,
                    help="nqdq schemes, comma-separated; NAME@S: a static (caller-given) scale S, e.g. fp8_tensor@0.05 "
                         "(NAME@S+amax: with the amax by-product); "
                         "NAME~sr: stochastic rounding (seed --seed)")
    ap.add_argument("--seed", type=int, default=None,
                    help="also time every nqdq scheme under stochastic rounding with this seed (a 'SR' row after each)")
    ap.add_argument("--bound", choices=["stripe-stream"],
                    help="stripe-stream: also the per-channel read pattern alone, a row per --stream-variants entry, "
                         "bytes as int8_column's (docs/design/per-channel.md)")
    ap.add_argument("--stream-variants", default=STREAM_VARIANTS,
                    help="with --bound stripe-stream: UI:NBUF:BPS:L2:TICKET[:ORDER[:WU]], comma-separated")
    args = ap.parse_args(argv)
    try:
        import cupy  # noqa: F401
    except ImportError:
        print("peers.py needs CuPy and a CUDA GPU")
        return 2
    global NO_COMPILE, NQDQ_SCHEMES, SR_SEED
    NO_COMPILE = args.no_compile
    if args.schemes:
        NQDQ_SCHEMES = args.schemes.split(",")
    if args.seed is not None:
        SR_SEED = args.seed
        NQDQ_SCHEMES = [v for s in NQDQ_SCHEMES for v in [s] + ([s + "~sr"] if not _sr_variant(s)[1] else [])]
    sizes = SIZES if not args.sizes else [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    stream_variants = args.stream_variants.split(",") if args.bound == "stripe-stream" else []
    timer = Timer()
    print(f"spin calibration: {timer.us_per_unit:.3f} us per unit; L2 {timer.l2_bytes / 2**20:.0f} MiB")
    rows = []
    for shape in sizes:
        try:
            bench_size(timer, shape, rows, quick=args.quick, stream_variants=stream_variants)
        except Exception:
            traceback.print_exc()
        cupy.get_default_memory_pool().free_all_blocks()  # this size's inputs are garbage now
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
