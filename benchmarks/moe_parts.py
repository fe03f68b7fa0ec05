"""The MoE sort + MXFP4 op by parts, on the GPU: device time from CUDA graphs and host time by part.

    python3 benchmarks/moe_parts.py [--tokens 2048 --hidden 7168 --k 4 --experts 256] [--reps 50]
        [--host-tokens 64 --host-k 8] [--stage S/B ...]

1. Device time, no host in the way: ``--reps`` back-to-back calls captured in one CUDA graph,
   events around a replay, divided by reps (median of 15 replays, two warm-up replays left out):
   the sort alone (its kernels launched straight: one launch, a direct call's, or three, a
   captured call's) and the whole planned op (``check_ids=False``), twice (captured, the
   planned call takes the three-launch sort: kernels.fused.moe_plan), the calls cycling over
   token sets larger than twice the L2 together; with ``--stage S/B ..`` also for each
   MOE_STAGE / MOE_STAGE_BLOCKS, outputs checked against the first variant's.
2. Host time of the planned call at decode size (``--host-tokens`` x top-``--host-k``, where the
   device work is small): us a call over 300-call rounds (median of 7), the whole call, the
   remembered function, its run (allocation, launches, arrays), the launches alone, the
   allocation alone, the key. Host figures follow the host: compare only within one run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from launch_overhead import graph_replay_us, host_time  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--host-tokens", type=int, default=64)
    ap.add_argument("--host-k", type=int, default=8)
    ap.add_argument("--stage", nargs="*", default=[], metavar="S/B",
                    help="also time the whole op with kernels.fused.MOE_STAGE = S, MOE_STAGE_BLOCKS = B")
    args = ap.parse_args()

    import cupy as cp

    from nqdq import fused
    from nqdq.gpu.fused import plan as KF
    from nqdq.gpu.quantize.grid import SYNC_WORDS
    from nqdq.gpu.runtime.interop import Allocator
    from nqdq.gpu.runtime.launch import fast_kernel

    T, H, k, E = args.tokens, args.hidden, args.k, args.experts
    rng = np.random.default_rng(5)
    ids2 = cp.asarray(np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32))
    ids = ids2.reshape(-1)
    ws = cp.zeros(SYNC_WORDS, cp.int32)
    s = cp.cuda.Stream(non_blocking=True)

    def graph_us(body):
        with s:
            body()
            s.synchronize()
            s.begin_capture()
            for _ in range(args.reps):
                body()
            g = s.end_capture()
        return graph_replay_us(cp, g, s, 17, per=args.reps, skip=2)

    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; tokens {T} x hidden {H}, "
          f"top-{k} of {E}; CUDA graphs of {args.reps} calls")
    for on in (True, False):
        lst = []
        with s:
            KF.moe_sort(ids, T * k, k, E, Allocator("cupy"), launches=lst, ws=ws, one=on)

        def body(lst=lst):
            for kern, g, b, a in lst:
                fast_kernel(kern).launch(g, b, a)

        print(f"sort alone, {'one launch' if on else 'three launches'}: {graph_us(body):.2f} us a call")
    # the calls of a graph cycle over sets of tokens that together exceed twice the L2 (each call's
    # tokens come from DRAM, as in an eager stream of layers)
    l2 = cp.cuda.runtime.getDeviceProperties(0)["l2CacheSize"]
    nsets = max(2, -(-2 * l2 // (T * H * 2)) + 1)
    xs = [(cp.random.standard_normal((T, H), dtype=cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)
          for _ in range(nsets)]
    print(f"whole op: {nsets} token sets of {T * H * 2 / 1e6:.1f} MB in turn (L2 {l2 / 1e6:.0f} MB)")
    stages = [(KF.MOE_STAGE, KF.MOE_STAGE_BLOCKS)]
    stages += [tuple(int(v) for v in st.split("/"))[:2] for st in args.stage]
    ref = None
    for _ in range(2):
        for stage, blocks in stages:
            KF.MOE_STAGE, KF.MOE_STAGE_BLOCKS = stage, blocks
            turn = [0]

            def call():
                turn[0] += 1
                return fused.moe_sort_quantize(xs[turn[0] % nsets], ids2, E, "mxfp4", dtype="bfloat16",
                                               check_ids=False)

            call()
            q = fused.moe_sort_quantize(xs[0], ids2, E, "mxfp4", dtype="bfloat16", check_ids=False)[0]
            got = (q.codes.get(), q.scales.get())  # (this second call is the planned one)
            ref = got if ref is None else ref
            same = all(np.array_equal(a, b) for a, b in zip(got, ref))
            print(f"whole op (planned, captured: three-launch sort), MOE_STAGE={stage}/{blocks}: "
                  f"{graph_us(call):.2f} us a call{'' if same else '  OUTPUTS DIFFER from the first variant'}")
    KF.MOE_STAGE, KF.MOE_STAGE_BLOCKS = stages[0]
    assert not ws.get().any(), "the one-launch sort left its workspace non-zero"

    T, k = args.host_tokens, args.host_k
    ids = cp.asarray(np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32))
    x = (cp.random.standard_normal((T, H), dtype=cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)

    def per_call(fn, n=300, rounds=7):  # the loop's host time a call: median of the rounds
        return np.median([host_time(fn, n, cp.cuda.runtime.deviceSynchronize, warm=0)[0] for _ in range(rounds)])

    def call():
        return fused.moe_sort_quantize(x, ids, E, "mxfp4", dtype="bfloat16", check_ids=False)

    call()
    call()
    fm = fused._MOE_FAST[fused._moe_key(x, ids, E, "mxfp4", "bfloat16")]
    run, mp, cur = fm.run, cp.cuda.alloc(fm.run.total), cp.cuda.get_current_stream()
    res = dict(call=per_call(call), remembered=per_call(lambda: fm(x, ids, False)), run=per_call(lambda: run(x, ids)),
               launches=per_call(lambda: run.launch(cur, x, ids, mp)),
               alloc=per_call(lambda: cp.cuda.alloc(run.total)),
               key=per_call(lambda: fused._moe_key(x, ids, E, "mxfp4", "bfloat16")))
    print(f"host time a call, {T} tokens top-{k}, us: " + ", ".join(f"{n} {v:.1f}" for n, v in res.items()))


if __name__ == "__main__":
    main()
