#!/usr/bin/env bash
# The whole GPU verification in one call on the GPU machine (carry .whl; logs under $OUT):
#   1. every GPU test (`pytest -m gpu tests/`, NQDQ_TEST_GPU=1), spread over pytest-xdist
#      workers (the kernels compile on the host's CPUs; the GPU is shared);
#   2. at the same time, compute-sanitizer memcheck over the kernel sweep of
#      scripts/gpu_check.py, split over SAN_PARTS processes;
#   3. then, on a quiet GPU, the quantize peers table for every scheme at the issue's sizes.
# Prints the summaries last. Knobs: WORKERS (6), SAN_PARTS (4), SCHEMES, SIZES, TEST_TIMEOUT.
set -uo pipefail
source "$(dirname "$0")/_gpu_env.sh"
WORKERS="${WORKERS:-6}"; SAN_PARTS="${SAN_PARTS:-4}"; TEST_TIMEOUT="${TEST_TIMEOUT:-330}"
SIZES="${SIZES:-8192x8192,16384x7168}"
SCHEMES="${SCHEMES:-fp8_row,fp8_1x128,fp8_128x128,fp8_tensor,fp8_tensor@0.05,mxfp8,mxfp6_e3m2,mxfp4,nvfp4,int8_row,int8_column,int4_group,int8_asym,int4_asym,int8_centred}"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%FT%TZ
  python3 -c "import numpy, numba, numba_cuda, cupy; print('numpy', numpy.__version__, 'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'cupy', cupy.__version__)"
} | tee "$OUT/device.txt"

SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
pids=()
for ((i = 0; i < SAN_PARTS; i++)); do
  # --report-api-errors no: the CUDA bindings probe driver entry points at start-up
  NQDQ_TEST_GPU=1 timeout "$TEST_TIMEOUT" "$SAN" --tool memcheck --report-api-errors no --error-exitcode 99 \
    --print-limit 20 python3 scripts/gpu_check.py --sweep --part "$i/$SAN_PARTS" > "$OUT/sanitizer_$i.log" 2>&1 &
  pids+=($!)
done
NQDQ_TEST_GPU=1 timeout "$TEST_TIMEOUT" python3 -m pytest -q -m gpu -n "$WORKERS" -p no:cacheprovider tests/ \
  > "$OUT/pytest_gpu.log" 2>&1
echo "pytest rc=$?" >> "$OUT/pytest_gpu.log"
san_rc=0
for p in "${pids[@]}"; do wait "$p" || san_rc=$?; done

timeout 240 python3 benchmarks/peers.py --no-compile --sizes "$SIZES" --schemes "$SCHEMES" --json "$OUT/peers.json" \
  > "$OUT/peers.log" 2>&1; echo "peers rc=$?" >> "$OUT/peers.log"

echo "== GPU tests =="; grep -E "passed|failed|error|rc=" "$OUT/pytest_gpu.log" | tail -15
echo "== compute-sanitizer memcheck ($SAN_PARTS parts, last rc $san_rc) =="
for ((i = 0; i < SAN_PARTS; i++)); do
  echo "part $i: $(grep -E '^sweep: ' "$OUT/sanitizer_$i.log" | tail -1) | $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer_$i.log" | tail -1)"
  grep -E "FAILED" "$OUT/sanitizer_$i.log" | head -5
done
echo "== peers =="; grep -E "^\||rc=|skipped" "$OUT/peers.log"
