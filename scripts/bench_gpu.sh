#!/usr/bin/env bash
# One call on the GPU machine: checks and times the launch path and the peers benchmark.
#   run: bash scripts/bench_gpu.sh        (carry .whl; logs and JSON under $OUT)
# Prints the short tables last. See docs/performance.md for the method.
set -uo pipefail
source "$(dirname "$0")/_gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/device.txt"
python3 -c "import numpy, numba, numba_cuda, cupy; print('numpy', numpy.__version__, 'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'cupy', cupy.__version__)" | tee -a "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>/dev/null | tee -a "$OUT/device.txt"
git log -1 --format='commit %h' 2>/dev/null | tee -a "$OUT/device.txt"; git status --short 2>/dev/null | grep -v '^??' | sed 's/^/uncommitted: /' | tee -a "$OUT/device.txt"
date -u +%Y-%m-%dT%H:%MZ | tee -a "$OUT/device.txt"

echo "== tests (NQDQ_TEST_GPU=1) =="
NQDQ_TEST_GPU=1 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_launch.py 2>&1 | tee "$OUT/pytest_gpu.log" | tail -5
echo "== launch overhead =="
timeout 100 python3 benchmarks/launch_overhead.py --json "$OUT/launch.json" > "$OUT/launch.log" 2>&1; echo "rc=$?"
grep -E "^check|^device" "$OUT/launch.log"
echo "== asv benchmarks (asv_bench/benchmarks/bench_kernels.py): setup + 20 timed calls each =="
timeout 150 python3 - > "$OUT/asv_smoke.log" 2>&1 <<'PY'
import itertools, sys, time
sys.path[:0] = ["asv_bench", "."]
from benchmarks import bench_kernels as b
for cls in (b.TimeLaunch, b.TimeQuantizeGPU):
    grid = cls.params if isinstance(cls.params, tuple) else (cls.params,)
    for ps in itertools.product(*grid):
        bench = cls()
        try:
            bench.setup(*ps)
        except NotImplementedError as e:
            print(f"{cls.__name__}{ps}: skipped ({e})")
            continue
        fn = getattr(bench, [m for m in dir(bench) if m.startswith("time_")][0])
        t0 = time.perf_counter()
        for _ in range(20):
            fn(*ps)
        print(f"{cls.__name__}{ps}: {(time.perf_counter() - t0) / 20 * 1e6:.1f} us per call (synchronized)")
PY
echo "rc=$?"; cat "$OUT/asv_smoke.log" | tail -16
echo "== peers =="
timeout 330 python3 benchmarks/peers.py --json "$OUT/peers.json" ${PEERS_ARGS:-} > "$OUT/peers.log" 2>&1; echo "rc=$?"
grep -E "MISMATCH|DIFFER|Traceback|failed" "$OUT/peers.log" | head -20
echo
sed -n '/^| launch path/,$p' "$OUT/launch.log"
echo
sed -n '/^| shape/,$p' "$OUT/peers.log"
