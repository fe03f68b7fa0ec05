"""Old and new NVFP4 paths side by side in one process: device time (peers.py's method and
table) and host time per call (launch_overhead.py's quantize rows).

    python3 benchmarks/mx_ab.py peers --no-compile --sizes 8192x8192,16384x7168 --schemes nvfp4
    python3 benchmarks/mx_ab.py host --schemes nvfp4 [--rows 64 --cols 7168 --calls 1000]

"old": ``quantize.NVFP4_SENC_IN_GROUPS`` off (NVFP4 in three launches: tensor_amax ->
finalize -> lastaxis_groups); "new": on (NVFP4 in two launches at every size -- the size bound
NVFP4_SENC_MAX_UNITS lifted --, S_enc computed in the group kernel; also with at most PARTS
amax partials). Each scheme is timed old, new, old, so that drift shows; plans are rebuilt at
each switch. Every row keeps the checks its script makes against the NumPy reference.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

ORDER = (False, True, False)
PARTS = 264  # a second "new" row for nvfp4 with at most this many amax partials (2 per H100 SM)


def set_new(on: bool, parts=1024):
    import nqdq.api
    import nqdq.gpu.quantize.plan as KQ

    KQ.NVFP4_SENC_IN_GROUPS = on
    KQ.NVFP4_SENC_MAX_UNITS = 1 << 40 if on else KQ.DEEP_UNITS  # "new": two launches at every size
    KQ.NVFP4_PARTS_MAX = parts
    KQ._PLANS.clear()
    if nqdq.api._FAST is not None:
        nqdq.api._FAST.clear()  # nqdq.quantize's remembered runners (plans of the other switch)


def _memo_cpu_reference():
    """nqdq.quantize(..., device="cpu") remembered by (scheme, shape, crc of the data): the
    peers' whole-tensor nvfp4 check runs the NumPy reference once per size, not per row."""
    import zlib

    import nqdq

    orig = nqdq.quantize
    memo = {}

    def quantize(x, scheme=None, *a, **k):
        if k.get("device") != "cpu" or not hasattr(x, "tobytes"):
            return orig(x, scheme, *a, **k)
        key = (str(scheme), x.shape, str(x.dtype), zlib.crc32(x.tobytes()), tuple(sorted(map(str, k.items()))))
        if key not in memo:
            memo[key] = orig(x, scheme, *a, **k)
        return memo[key]

    nqdq.quantize = quantize


def peers_main(argv):
    import peers

    orig = peers.bench_nqdq

    def ab(timer, scheme, xs, n_sets, groups, in_bytes, add, skip, log):
        variants = [(on, 1024) for on in ORDER]
        if scheme == "nvfp4":
            variants.insert(2, (True, PARTS))
        for on, parts in variants:
            set_new(on, parts)
            tag = (" [new]" if parts == 1024 else f" [new, <= {parts} partials]") if on else " [old]"
            orig(timer, scheme, xs, n_sets, groups, in_bytes,
                 lambda impl, *a, **k: add(impl + tag, *a, **k), lambda impl, why: skip(impl + tag, why), log)

    peers.bench_nqdq = ab
    _memo_cpu_reference()
    return peers.main(argv)


def host_main(argv):
    import argparse

    import launch_overhead as LO

    ap = argparse.ArgumentParser()
    ap.add_argument("--schemes", default="nvfp4")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--cols", type=int, default=7168)
    ap.add_argument("--calls", type=int, default=1000)
    args = ap.parse_args(argv)
    results = []
    for on in ORDER:
        set_new(on)
        LO.bench_quantize(args.schemes.split(","), args.rows, args.cols, args.calls, "new" if on else "old", results)
    print_host_table(results, args.rows, args.cols)
    return 0


def print_host_table(results, rows, cols):
    """launch_overhead.bench_quantize's rows as one markdown table."""
    print()
    print(f"| nqdq.quantize, {rows}x{cols} bf16 (CuPy uint16) | host us/call (loop) | median of single calls | device us |")
    print("|---|---:|---:|---:|")
    for r in results:
        if "host_us" in r or "device_us" in r or "host_median_us" in r:
            h = f"{r['host_us']:.2f}" if "host_us" in r else ""
            m = f"{r['host_median_us']:.2f}" if "host_median_us" in r else ""
            d = f"{r['device_us']:.2f}" if "device_us" in r else ""
            print(f"| {r['path']} | {h} | {m} | {d} |")
        elif "ok" in r:
            print(f"| {r['path']} | {'ok' if r['ok'] else 'MISMATCH'} | | |")
        else:
            print(f"| {r['path']} | {r.get('error', '')[:60]} | | |")


if __name__ == "__main__":
    what, rest = sys.argv[1], sys.argv[2:]
    sys.exit(peers_main(rest) if what == "peers" else host_main(rest))
