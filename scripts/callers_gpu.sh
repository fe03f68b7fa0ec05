#!/usr/bin/env bash
# The caller-library paths on a GPU, in one call: their GPU tests, then the user-view benchmark
# (benchmarks/user_view.py; the table docs/performance.md shows). Logs under $OUT.
#   bash scripts/callers_gpu.sh [user_view.py options]
source "$(dirname "$0")/_gpu_env.sh"
export XLA_PYTHON_CLIENT_PREALLOCATE=false NQDQ_TEST_GPU=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider -n 8 ${TESTS:-tests/test_callers_gpu.py \
  "tests/test_fused_gpu.py::test_gpu_fused_hot_path" "tests/test_matmul_gpu.py::test_hot_path_captured_in_a_cuda_graph" \
  "tests/test_matmul_gpu.py::test_gemm_gpu_epilogues" tests/test_f16_decode.py tests/test_dequant_units.py} > "$OUT/tests.log" 2>&1
tail -25 "$OUT/tests.log"
timeout "${BENCH_TIMEOUT:-290}" python3 benchmarks/user_view.py --json "$OUT/user_view.json" "$@" 2>&1 | tee "$OUT/bench.log" | grep -v "^|"
grep "^|" "$OUT/bench.log" | tail -80
