"""The short GPU check that fits a small device budget: copy bandwidth, then rmsnorm +
fp8_row and rmsnorm + mxfp4 of bf16 [8192, 7168] (nqdq.fused, CUDA events via peers.Timer,
median, 2 input sets rotated past L2), each checked bit for bit against the NumPy spec on 8
rows. Each op costs one kernel compilation (about 20 s of NVVM time) before it is timed;
``benchmarks/fused_peers.py`` is the full comparison (every op, the unfused pair).

    python3 benchmarks/_fused_quick.py
    ncu --section SpeedOfLight ... python3 benchmarks/_fused_quick.py --once   # one call of each op
"""
import sys, time; sys.path.insert(0, 'benchmarks')
import cupy as cp, numpy as np
from peers import Timer, random_bf16_sets
from nqdq import fused
from nqdq.reference import fused as R
from nqdq.schemes import resolve_scheme
t = Timer(); Rr, N = 8192, 7168; ib = Rr * N * 2
xs = random_bf16_sets((Rr, N), 2, seed=1); w = random_bf16_sets((1, N), 1, seed=3)[0].reshape(N)
d = cp.empty_like(xs[0])
tc, _ = t.device_us(lambda i: d.data.copy_from_device_async(xs[i].data, ib), 2, bytes_per_launch=2 * ib)
cg = 2 * ib / tc / 1e3
print(f"copy {tc:.1f} us {cg:.0f} GB/s", flush=True)
import ml_dtypes
sm = np.arange(0, Rr, 1024)
xh = xs[0].get().view(ml_dtypes.bfloat16)[sm].astype(np.float32); wh = w.get().view(ml_dtypes.bfloat16).astype(np.float32)
for s, nb in (("fp8_row", ib + N * 2 + Rr * N + Rr * 4), ("mxfp4", ib + N * 2 + Rr * N // 2 + Rr * N // 32)):
    t0 = time.time()
    f = lambda i, s=s: fused.rmsnorm_quantize(xs[i], w, s, dtype="bfloat16")
    q = f(0)
    p, _ = R.rmsnorm_quantize(xh, wh, resolve_scheme(s), np.float32(1e-6), "bfloat16", "bfloat16")
    from nqdq.reference.packing import pack_codes
    c = pack_codes(p.codes, 4) if s == "mxfp4" else p.codes
    ok = np.array_equal(q.codes.get()[sm].view(np.uint8), c.view(np.uint8)) and np.array_equal(q.scales.get()[sm].view(np.uint8), p.scales.view(np.uint8))
    if "--once" in sys.argv:
        print(f"rmsnorm+{s}: exact vs spec on {len(sm)} rows: {ok}", flush=True)
        continue
    tf, _ = t.device_us(f, 2, bytes_per_launch=ib)
    print(f"rmsnorm+{s}: {tf:.1f} us {nb / tf / 1e3:.0f} GB/s {100 * nb / tf / 1e3 / cg:.1f}% of copy; exact vs spec on {len(sm)} rows: {ok}; compile+check {time.time() - t0:.0f} s", flush=True)
