"""nqdq's tensor-core GEMMs beside cuBLASLt (torch._int_mm / torch._scaled_mm), one run.

    python benchmarks/gemm_peers.py [--shapes 8192x8192x8192,...] [--reps 10] [--out DIR]
                                    [--sass] [--configs "default;GPU_CONFIG;fp8_row@WGMMA_CONFIG_FP8_ROW"]

For every shape M x N x K (activations [M, K], weights [N, K]) and case:

* ``int8``: nqdq int8_row x int8_row -> bfloat16 (fused per-token x per-channel dequant)
  vs ``torch._int_mm`` (int32 out, no dequant at all);
* ``fp8_row``: nqdq fp8_row x fp8_row (e4m3) -> bfloat16 vs ``torch._scaled_mm`` with
  row-wise scales -> bfloat16;
* ``fp8_block``: nqdq fp8_1x128 x fp8_128x128 -> bfloat16 vs ``torch._scaled_mm`` with
  1x128 / 128x128 scales where this torch supports it, else beside the row-wise figure;
* ``mxfp8``: nqdq MX e4m3 x e4m3 (e8m0 scales per 32 of K, the ``"mx"`` scale mode; mxfp6 /
  mxfp4 operands reach the same kernel as e4m3 codes) -> bfloat16 vs cuBLAS bf16
  (``torch.matmul`` of the operands dequantized to bfloat16, exact at these scales);
* ``bf16``: nqdq's bfloat16 GEMM (``mma="bf16.bf16"``, the kernel NVFP4 x NVFP4 runs on after
  its exact conversion to bfloat16) on random finite bfloat16 (tensor scales 1) vs cuBLAS
  bf16 (``torch.matmul``) on the same bits.

* the whole ``nqdq.matmul`` call, from CuPy operands made by ``nqdq.quantize`` (operand
  conversions included, as a user runs it), for the pairs that convert their operands:
  ``nvfp4`` (NVFP4 x NVFP4) and ``wo_<scheme>`` (the weight-only ``matmul(x, qw)``, x
  bfloat16, e.g. ``wo_int4_group`` (the in-register kernel), ``wo_int8_row``, ``wo_mxfp4``,
  ``wo_nvfp4``), vs cuBLAS bf16 on the
  dequantized operands; besides the CUDA-event time of one call, the wall clock of
  back-to-back calls with one synchronize at the end.

Timing: CUDA events around each launch of the prepared kernel (nqdq.gpu.gemm.plan.
PreparedGemm.launch: no Python-side argument work), median of ``--reps`` after 3 warm-up
launches; operands are fresh random codes and scales (never zeros), and several copies
are rotated so the operands of consecutive launches exceed the 50 MB L2. Correctness in the
same run: every nqdq result is compared (rel. L2) with a float32 torch matmul of the
dequantized operands, and with the peer's output. Prints a table last; ``--out`` gets the
JSON rows and, with ``--sass``, the cubin and SASS instruction counts of each kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from nqdq.gpu.gemm import plan as kg  # noqa: E402

SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 7168, 2048), (128, 14336, 4096), (16, 14336, 4096)]
L2_BYTES = 50 * 2**20


def parse_shapes(s):
    return [tuple(int(v) for v in t.split("x")) for t in s.split(",")]


def rel_l2(a, b):
    import cupy as cp

    a, b = a.astype(cp.float64), b.astype(cp.float64)
    return float(cp.linalg.norm(a - b) / cp.linalg.norm(b))


def bf16_to_f32(u16):
    import cupy as cp

    return (u16.astype(cp.uint32) << 16).view(cp.float32)


def time_launches(fn, reps, warmup=3):
    import cupy as cp

    for _ in range(warmup):
        fn(0)
    cp.cuda.Device().synchronize()
    times = []
    for i in range(reps):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        fn(i)
        e.record()
        e.synchronize()
        times.append(cp.cuda.get_elapsed_time(s, e))
    return float(np.median(times))


def make_operands(M, N, K, case, copies, rng):
    """(list of nqdq gemm kwargs per copy, torch tensors per copy, float32 dequantized refs of copy 0)."""
    import cupy as cp

    ops = []
    for c in range(copies):
        if case == "bf16":  # finite bfloat16 bits of N(0, 1) values
            a = cp.asarray((rng.standard_normal((M, K), np.float32).view(np.uint32) >> 16).astype(np.uint16))
            b = cp.asarray((rng.standard_normal((N, K), np.float32).view(np.uint32) >> 16).astype(np.uint16))
            sa = sb = cp.ones(1, np.float32)  # (the peer is a plain matmul: one kernel)
            kw = dict(mma="bf16.bf16", sa=sa, sb=sb, sa_mode="tensor", sb_mode="tensor")
        elif case == "int8":
            a = cp.asarray(rng.integers(-127, 128, (M, K), dtype=np.int8))
            b = cp.asarray(rng.integers(-127, 128, (N, K), dtype=np.int8))
            sa = cp.asarray(rng.uniform(0.5, 2, M).astype(np.float32) / 127)
            sb = cp.asarray(rng.uniform(0.5, 2, N).astype(np.float32) / 127)
            kw = dict(mma="s8s8", sa=sa, sb=sb, sa_mode="row", sb_mode="row")
        else:
            # e4m3 codes of normal-ish values: random bytes minus NaN (0x7F / 0xFF)
            a = cp.asarray(rng.integers(0, 256, (M, K), dtype=np.uint8))
            b = cp.asarray(rng.integers(0, 256, (N, K), dtype=np.uint8))
            a[(a & 0x7F) == 0x7F] = 0x38
            b[(b & 0x7F) == 0x7F] = 0x38
            if case == "mxfp8":
                KB = -(-K // 32)
                sa = cp.asarray(rng.integers(120, 135, (M, KB), dtype=np.uint8))
                sb = cp.asarray(rng.integers(120, 135, (N, KB), dtype=np.uint8))
                kw = dict(mma="e4m3.e4m3", sa=sa, sb=sb, sa_mode="mx", sb_mode="mx")
            elif case == "fp8_row":
                sa = cp.asarray(rng.uniform(0.5, 2, M).astype(np.float32) / 448)
                sb = cp.asarray(rng.uniform(0.5, 2, N).astype(np.float32) / 448)
                kw = dict(mma="e4m3.e4m3", sa=sa, sb=sb, sa_mode="row", sb_mode="row")
            else:
                KB = -(-K // 128)
                sa = cp.asarray(rng.uniform(0.5, 2, (M, KB)).astype(np.float32) / 448)
                sb = cp.asarray(rng.uniform(0.5, 2, (-(-N // 128), KB)).astype(np.float32) / 448)
                kw = dict(mma="e4m3.e4m3", sa=sa, sb=sb, sa_mode="block", sb_mode="block")
        ops.append((a, b, kw))
    return ops


def dequant_ref(a, b, kw, M, N, K, parts=False):
    """float32 torch-free reference on the GPU (CuPy): dequantize both, matmul in float32
    (``parts``: the two dequantized operands instead)."""
    import cupy as cp
    import ml_dtypes

    if kw["mma"] == "bf16.bf16":
        A, B = bf16_to_f32(a) * kw["sa"][0], bf16_to_f32(b) * kw["sb"][0]
    elif kw["mma"] == "s8s8":
        A = a.astype(cp.float32) * kw["sa"][:, None]
        B = b.astype(cp.float32) * kw["sb"][:, None]
    else:
        table = cp.asarray(np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32))
        A, B = table[a], table[b]
        if kw["sa_mode"] == "mx":
            A *= cp.repeat(cp.exp2(kw["sa"].astype(cp.float32) - 127), 32, axis=1)[:, :K]
            B *= cp.repeat(cp.exp2(kw["sb"].astype(cp.float32) - 127), 32, axis=1)[:, :K]
        elif kw["sa_mode"] == "row":
            A *= kw["sa"][:, None]
            B *= kw["sb"][:, None]
        else:
            A *= cp.repeat(kw["sa"], 128, axis=1)[:, :K]
            B *= cp.repeat(cp.repeat(kw["sb"], 128, axis=0), 128, axis=1)[:N, :K]
    return (A, B) if parts else A @ B.T


def torch_peer(case, a, b, kw, M, N, K):
    """A zero-arg callable running the cuBLASLt peer on the same codes, or (None, why)."""
    try:
        import torch
    except Exception as e:  # optional peer
        return None, f"no torch ({type(e).__name__})"
    ta = torch.as_tensor(a, device="cuda")
    tb = torch.as_tensor(b, device="cuda")
    try:
        if case == "int8":
            bt = tb.t()  # [K, N] column-major: cuBLASLt's TN layout

            def run():
                return torch._int_mm(ta, bt)
        elif case == "bf16":  # cuBLAS bf16 on the same bits
            A, B = ta.view(torch.bfloat16), tb.view(torch.bfloat16)

            def run():
                return torch.matmul(A, B.t())
        elif case == "mxfp8":  # cuBLAS bf16 on the same values (e4m3 x 2^k is a bfloat16 here)
            A, B = (torch.as_tensor(v, device="cuda").to(torch.bfloat16) for v in dequant_ref(a, b, kw, M, N, K, parts=True))

            def run():
                return torch.matmul(A, B.t())
        else:
            fa, fb = ta.view(torch.float8_e4m3fn), tb.view(torch.float8_e4m3fn).t()
            sa = torch.as_tensor(kw["sa"], device="cuda")
            sb = torch.as_tensor(kw["sb"], device="cuda")
            if case == "fp8_row":
                sa2, sb2 = sa.reshape(M, 1), sb.reshape(1, N)
            else:  # DeepSeek blockwise: A [M, K/128], B [K/128, N/128] (outer-dim-major per torch)
                sa2, sb2 = sa.t().contiguous().t(), sb.t()

            def run():
                return torch._scaled_mm(fa, fb, scale_a=sa2, scale_b=sb2, out_dtype=torch.bfloat16)
        out = run()
        torch.cuda.synchronize()
        return (run, out), None
    except Exception as e:
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"


def _named_config(name):
    """A named tile of nqdq.gpu.gemm.plan ("GPU_CONFIG", "WGMMA_CONFIG_FP8_ROW", ...)."""
    cfg = getattr(kg, name, None)
    if not isinstance(cfg, (kg.TileConfig, kg.WgmmaConfig)):
        raise SystemExit(f"--configs: {name!r} is not a named config of nqdq.gpu.gemm.plan")
    return cfg


def _cfg_name(cfg):
    if cfg is None:
        return "default"
    if isinstance(cfg, kg.WgmmaConfig):
        return (f"wg{cfg.bm}x{cfg.bn}s{cfg.stages}" + ("-pp" if cfg.pingpong else "") + ("-ws" if cfg.producer else "")
                + ("-d" if cfg.direct else "") + ("-pers" if cfg.persistent else ""))  # fmt: skip
    return f"mma{cfg.bm}x{cfg.bn}s{cfg.stages}"


def bench_case(M, N, K, case, reps, rng, cfg):
    import cupy as cp

    nbytes = (M + N) * K * (2 if case == "bf16" else 1)
    copies = int(min(8, max(1, -(-2 * L2_BYTES // nbytes))))
    ops = make_operands(M, N, K, case, copies, rng)
    preps = [kg.PreparedGemm(a, b, out_dtype="bfloat16", config=cfg, **kw) for a, b, kw in ops]
    ms = time_launches(lambda i: preps[i % copies].launch(), reps)
    a, b, kw = ops[0]
    preps[0].launch()
    got = bf16_to_f32(preps[0].result())
    want = dequant_ref(a, b, kw, M, N, K)
    cfg = preps[0].cfg
    row = dict(shape=f"{M}x{N}x{K}", case=case, nqdq_ms=ms, nqdq_tflops=2 * M * N * K / ms / 1e9,
               err_vs_f32=rel_l2(got, want), copies=copies, tile=_cfg_name(cfg))  # fmt: skip
    peer, why = torch_peer(case, a, b, kw, M, N, K)
    if peer is None:
        row["peer"] = why
    else:
        import torch

        peer_runs = [torch_peer(case, a2, b2, kw2, M, N, K)[0][0] for a2, b2, kw2 in ops]
        pms = time_launches(lambda i: peer_runs[i % copies](), reps)
        out = cp.asarray(peer[1].float() if peer[1].dtype != torch.int32 else peer[1])
        if case == "int8":
            out = out.astype(cp.float32) * kw["sa"][:, None] * kw["sb"][None, :]
        row.update(peer_ms=pms, peer_tflops=2 * M * N * K / pms / 1e9, ratio=pms / ms,
                   err_vs_peer=rel_l2(got, out), peer_err_vs_f32=rel_l2(out, want))  # fmt: skip
    preps.clear()
    ops.clear()
    cp.get_default_memory_pool().free_all_blocks()
    return row


def bench_call(M, N, K, case, reps, rng):
    """One row for a ``nvfp4`` / ``wo_<scheme>`` case: the whole nqdq.matmul call (module
    docstring), rotating operand copies past the L2 as bench_case does."""
    import cupy as cp

    import nqdq

    wbytes = N * K // 2 if case.endswith("fp4") or "int4" in case else N * K
    copies = int(min(8, max(1, -(-2 * L2_BYTES // wbytes))))
    calls, refs, pairs = [], None, []
    for c in range(copies):
        x = cp.asarray(rng.standard_normal((M, K), np.float32))
        w = cp.asarray(rng.standard_normal((N, K), np.float32) * np.float32(0.05))
        qb = nqdq.quantize(w, "nvfp4" if case == "nvfp4" else case[3:])
        if case == "nvfp4":
            qa = nqdq.quantize(x, "nvfp4")
            calls.append((lambda qa, qb: lambda: nqdq.matmul(qa, qb, out_dtype="bfloat16"))(qa, qb))
            A = nqdq.dequantize(qa) if c == 0 else None
        else:
            xb = (x.view(cp.uint32) >> 16).astype(cp.uint16)  # bfloat16 bits
            pairs.append((xb, qb))
            calls.append((lambda xb, qb: lambda: nqdq.matmul(xb, qb, out_dtype="bfloat16", dtype="bfloat16"))(xb, qb))
            A = bf16_to_f32(xb) if c == 0 else None
        if c == 0:
            refs = (A, nqdq.dequantize(qb))
    ms = time_launches(lambda i: calls[i % copies](), reps)
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for i in range(reps):
        calls[i % copies]()
    cp.cuda.Device().synchronize()
    wall = (time.perf_counter() - t0) / reps * 1e3
    dev_ms = None
    if "int4" in case:  # the in-register kernel alone: back-to-back launches, events around the batch
        from nqdq.gpu.gemm import weight_only as wo
        from nqdq.gpu.runtime.interop import Allocator
        from nqdq.gpu.runtime.launch import fast_kernel

        launches = [wo.launch_args(xb, qb, None, 1.0, "bfloat16", None, Allocator("cupy")) for xb, qb in pairs]
        fk = fast_kernel(launches[0][0])
        for kern, grid, block, args, _ in launches:
            fk.launch(grid, block, args, None)
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        for i in range(reps):
            kern, grid, block, args, _ = launches[i % copies]
            fk.launch(grid, block, args, None)
        e.record()
        e.synchronize()
        dev_ms = cp.cuda.get_elapsed_time(s, e) / reps
    A, B = refs
    got = bf16_to_f32(calls[0]())
    want = A @ B.T
    row = dict(shape=f"{M}x{N}x{K}", case=case, nqdq_ms=ms, nqdq_wall_ms=wall, nqdq_tflops=2 * M * N * K / ms / 1e9,
               err_vs_f32=rel_l2(got, want), copies=copies, tile="matmul call")  # fmt: skip
    if dev_ms is not None:
        row.update(kernel_ms=dev_ms, tile=f"kernel {dev_ms * 1e3:.1f} us")
    try:
        import torch

        tA = torch.as_tensor(A, device="cuda").to(torch.bfloat16)
        tB = torch.as_tensor(B, device="cuda").to(torch.bfloat16)
        pms = time_launches(lambda i: torch.matmul(tA, tB.t()), reps)
        row.update(peer_ms=pms, peer_tflops=2 * M * N * K / pms / 1e9, ratio=pms / ms)
    except Exception as e:  # optional peer
        row["peer"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    calls.clear()
    cp.get_default_memory_pool().free_all_blocks()
    return row


def sass_summary(out_dir):
    """Count the tensor-core / copy SASS instructions of each compiled GEMM kernel
    (cuobjdump -sass on Numba's cubin; only the counts are kept, in sass.json)."""
    import tempfile

    rows = []
    tool = shutil.which("cuobjdump")
    for (cfg, spec), kern in kg.built_kernels().items():
        for compiled in kern.overloads.values():
            cubin = compiled._codelibrary.get_cubin()
            cubin = bytes(getattr(cubin, "code", cubin))  # cuda.core ObjectCode or bytes
            name = f"{spec.mma}_{spec.sa_mode}{spec.sb_mode}_{_cfg_name(cfg)}"
            if tool is None:
                rows.append(dict(kernel=name, sass="no cuobjdump"))
                continue
            with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
                fh.write(cubin)
                fh.flush()
                sass = subprocess.run([tool, "-sass", fh.name], capture_output=True, text=True).stdout
            ops = re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)", sass, re.M)
            hist = {}
            for op in ops:
                hist[op] = hist.get(op, 0) + 1
            pat = r"(IMMA|HMMA|QMMA|QGMMA|HGMMA|IGMMA|WARPGROUP|LDSM|LDGSTS|F2FP|F2F|BAR)"
            rows.append(dict(kernel=name, instructions=len(ops), tensor_core={k: v for k, v in hist.items() if re.match(pat, k)}))
    if out_dir:
        with open(os.path.join(out_dir, "sass.json"), "w") as fh:
            json.dump(rows, fh, indent=1)
    return rows


def accuracy(cfgs, cases=("int8", "fp8_row", "fp8_block")):
    """float32-output rel. L2 vs the float64 reference (nqdq.reference.matmul) per config:
    how exactly each kernel accumulates (int8: exact; fp8: the tensor core's adder)."""
    import cupy as cp

    import nqdq
    from nqdq.matmul import _operand
    from nqdq.reference import matmul as ref

    rng = np.random.default_rng(1)
    rows = []
    for M, N, K in [(257, 383, 1000), (130, 136, 4096), (64, 256, 8192)]:
        x = rng.standard_normal((M, K)).astype(np.float32)
        w = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)
        for case, sa, sb in [("int8", "int8_row", "int8_row"), ("fp8_row", "fp8_row", "fp8_row"), ("fp8_row", "e5m2", "e5m2"),
                             ("fp8_block", "fp8_1x128", "fp8_128x128")]:  # fmt: skip
            if case not in cases:
                continue
            a = _operand(nqdq.quantize(x, sa), "qa", "a", np)
            b = _operand(nqdq.quantize(w, sb), "qb", "b", np)
            mma = ("u8s8" if a.za is not None else "s8s8") if a.elem == "int8" else f"{a.elem}.{b.elem}"
            kw = dict(mma=mma, sa=a.scales, sb=b.scales, sa_mode=a.mode, sb_mode=b.mode, za=a.za)
            want = ref.gemm(a.codes, b.codes, **kw)
            for cfg in cfgs:
                if cfg is not None and a.mode == "block" and 128 % cfg.bn and cfg.bn != 256:
                    continue
                got = kg.gemm(cp.asarray(a.codes), cp.asarray(b.codes), config=cfg, **kw).get()
                err = float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))
                rows.append((f"{M}x{N}x{K}", f"{sa} x {sb}", _cfg_name(cfg), err))
                print(f"ACC {rows[-1][0]:>14s} {rows[-1][1]:>26s} {rows[-1][2]:>20s} rel_l2={err:.2e}", flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES))
    p.add_argument("--cases", default="int8,fp8_row,fp8_block")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--configs", default="", help="';'-separated configs: 'default' or a named config of "
                   "nqdq.gpu.gemm.plan ('GPU_CONFIG', 'WGMMA_CONFIG_FP8_ROW', ...); 'CASE@config' times that "
                   "config for CASE only")
    p.add_argument("--out", default=os.environ.get("OUT", ""))
    p.add_argument("--sass", action="store_true")
    p.add_argument("--accuracy", action="store_true", help="float32-output error per config, then exit")
    p.add_argument("--one", default="", help="CASE,MxNxK: just launch that GEMM 3 times (for ncu), then exit")
    args = p.parse_args(argv)
    import cupy as cp

    dev = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    rng = np.random.default_rng(0)
    # None ("default"): the default per case
    only = {}  # config -> the cases it is timed for ("CASE@config"; absent: every case)
    cfgs = []
    for c in (c for c in args.configs.split(";") if c):
        case, _, text = c.rpartition("@")
        cfg = None if text == "default" else _named_config(text)
        if case:
            only.setdefault(cfg, set()).add(case)
        if cfg not in cfgs:
            cfgs.append(cfg)
    cfgs = cfgs or [None]
    if args.accuracy:
        accuracy(cfgs, args.cases.split(","))
        return 0
    if args.one:
        case, shape = args.one.split(",")
        M, N, K = parse_shapes(shape)[0]
        a, b, kw = make_operands(M, N, K, case, 1, rng)[0]
        g = kg.PreparedGemm(a, b, out_dtype="bfloat16", config=cfgs[0], **kw)
        for _ in range(3):
            g.launch()
        cp.cuda.Device().synchronize()
        return 0
    rows = []
    t0 = time.time()
    for shape in parse_shapes(args.shapes):
        for case in args.cases.split(","):
            for cfg in cfgs:
                if cfg is not None and case == "fp8_block" and 128 % cfg.bn and cfg.bn != 256:
                    continue
                if case not in only.get(cfg, {case}):
                    continue
                try:
                    if case == "nvfp4" or case.startswith("wo_"):
                        row = bench_call(*shape, case, args.reps, rng) if cfg is None else None
                        if row is None:
                            continue
                    else:
                        row = bench_case(*shape, case, args.reps, rng, cfg)
                except Exception as e:
                    row = dict(shape="x".join(map(str, shape)), case=case, error=f"{type(e).__name__}: {e}"[:300])
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gemm_peers.json"), "w") as fh:
            json.dump(dict(device=dev, rows=rows), fh, indent=1)
        if args.sass:
            for r in sass_summary(args.out):
                print("SASS", json.dumps(r))
    print(f"\n{dev}; {time.time() - t0:.0f} s; TFLOP/s = 2MNK / median time (TOP/s for int8)")
    print(f"{'shape':>18s} {'case':>9s} {'tile':>16s} {'nqdq ms':>8s} {'nqdq TF':>8s} {'peer ms':>8s} {'peer TF':>8s} "
          f"{'ratio':>6s} {'err/f32':>8s} {'err/peer':>8s}")  # fmt: skip
    for r in rows:
        if "error" in r:
            print(f"{r['shape']:>18s} {r['case']:>9s} ERROR {r['error']}")
            continue
        tile = r.get("tile") or "-"
        if "nqdq_wall_ms" in r:
            tile = f"call, wall {r['nqdq_wall_ms']:.3f}" + (f", {r['tile']}" if "kernel_ms" in r else "")
        print(f"{r['shape']:>18s} {r['case']:>9s} {tile:>16s} {r['nqdq_ms']:8.3f} {r['nqdq_tflops']:8.1f} "
              f"{r.get('peer_ms', float('nan')):8.3f} {r.get('peer_tflops', float('nan')):8.1f} {r.get('ratio', float('nan')):6.2f} "
              f"{r['err_vs_f32']:8.1e} {r.get('err_vs_peer', float('nan')):8.1e}" + (f"  peer: {r['peer']}" if "peer" in r else ""))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
