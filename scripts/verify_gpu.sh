#!/usr/bin/env bash
# The whole GPU verification on the GPU machine, in one or two calls (carry .whl; logs
# under $OUT; a call is limited to 10 minutes, so the two phases can go separately):
#
#   bash scripts/verify_gpu.sh tests   every GPU test (`pytest -m gpu tests/`, NQDQ_TEST_GPU=1)
#                                      over pytest-xdist workers (the kernels compile on the
#                                      host's CPUs, the GPU is shared) and, at the same time,
#                                      compute-sanitizer memcheck over scripts/gpu_check.py's
#                                      kernel sweep split over SAN_PARTS processes;
#   bash scripts/verify_gpu.sh pytest / sanitizer   the two halves of "tests" alone, a call each
#                                      (353 tests beside the sanitizer once reported all
#                                      their results in 530 s but were cut before pytest's
#                                      summary);
#   bash scripts/verify_gpu.sh bench   on a quiet GPU: the fused ops (one process per op:
#                                      they compile at once and time one at a time under a
#                                      lock), the quantize peers table for every scheme;
#   bash scripts/verify_gpu.sh gemm    the GEMMs beside cuBLASLt at GEMM_SHAPES (default: the
#                                      issue's five shapes) with the SASS counts;
#   bash scripts/verify_gpu.sh         all three (more than one call's 10 minutes).
#
# Prints the summaries last. Knobs: WORKERS (8), SAN_PARTS (4), TEST_TIMEOUT (540), SCHEMES,
# SIZES, FUSED_OPS, GEMM_SHAPES. (The tests phase has needed 325 s for 340 tests and more than
# 380 s for ~350: TEST_TIMEOUT defaults to 540, inside one call's 600 s.)
set -uo pipefail
source "$(dirname "$0")/_gpu_env.sh"
PHASE="${1:-all}"
WORKERS="${WORKERS:-8}"; SAN_PARTS="${SAN_PARTS:-4}"; TEST_TIMEOUT="${TEST_TIMEOUT:-540}"
SIZES="${SIZES:-8192x8192,16384x7168}"
SCHEMES="${SCHEMES:-fp8_row,fp8_1x128,fp8_128x128,fp8_tensor,fp8_tensor@0.05,mxfp8,mxfp6_e3m2,mxfp4,nvfp4,int8_row,int8_column,int4_group,int8_asym,int4_asym,int8_centred}"
# --only takes a substring of an op's name: "view)+mxfp4" is flatten of the transposed view
FUSED_OPS="${FUSED_OPS:-rmsnorm+fp8_row rmsnorm+res+fp8_row rmsnorm+fp8_tensor rmsnorm+res+fp8_tensor rmsnorm+fp8_1x128 rmsnorm+res+fp8_1x128 rmsnorm+mxfp4 rmsnorm+res+mxfp4 view)+fp8_1x128 view)+mxfp4 moe_sort+mxfp4}"
GEMM_SHAPES="${GEMM_SHAPES:-8192x8192x8192,4096x4096x4096,2048x7168x2048,128x14336x4096,16x14336x4096}"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%FT%TZ
  python3 -c "import numpy, numba, numba_cuda, cupy; print('numpy', numpy.__version__, 'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'cupy', cupy.__version__)"
} | tee "$OUT/device.txt"

RUN_PYTEST=0; RUN_SAN=0
[[ "$PHASE" == tests || "$PHASE" == all || "$PHASE" == pytest ]] && RUN_PYTEST=1
[[ "$PHASE" == tests || "$PHASE" == all || "$PHASE" == sanitizer ]] && RUN_SAN=1
if [[ $RUN_PYTEST == 1 || $RUN_SAN == 1 ]]; then
  SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
  pids=()
  for ((i = 0; i < SAN_PARTS * RUN_SAN; i++)); do
    # --report-api-errors no: the CUDA bindings probe driver entry points at start-up
    NQDQ_TEST_GPU=1 timeout "$TEST_TIMEOUT" "$SAN" --tool memcheck --report-api-errors no --error-exitcode 99 \
      --print-limit 20 python3 scripts/gpu_check.py --sweep --part "$i/$SAN_PARTS" > "$OUT/sanitizer_$i.log" 2>&1 &
    pids+=($!)
  done
  # -v: a test's name per result line, so a timeout shows which tests had not reported
  if [[ $RUN_PYTEST == 1 ]]; then
    NQDQ_TEST_GPU=1 timeout "$TEST_TIMEOUT" python3 -m pytest -v --durations=20 -m gpu -n "$WORKERS" -p no:cacheprovider \
      tests/ > "$OUT/pytest_gpu.log" 2>&1
    echo "pytest rc=$?" >> "$OUT/pytest_gpu.log"
  fi
  for p in "${pids[@]}"; do wait "$p"; echo "sanitizer process rc=$?" >> "$OUT/sanitizer_rc.log"; done
fi

if [[ "$PHASE" == bench || "$PHASE" == all ]]; then
  # per-op logs in a scratch folder, then one file under $OUT (the device tool brings back
  # at most 8 files). The MoE op is host-bound (its id check waits for the device), so it
  # is timed alone after the others: beside their compilations its rows read up to 1.8x
  # slower (H100: 378.5 us, 209.9 us alone)
  FL=$(mktemp -d); rm -f "$FL/fused.lock"; pids=()
  k=0; moe=""
  for op in $FUSED_OPS; do
    if [[ "$op" == moe* ]]; then moe="$op"; continue; fi
    timeout 300 python3 benchmarks/fused_peers.py --only "$op" --lock "$FL/fused.lock" > "$FL/fused_$k.log" 2>&1 &
    pids+=($!); k=$((k + 1))
  done
  for p in "${pids[@]}"; do wait "$p"; done
  [[ -n "$moe" ]] && timeout 200 python3 benchmarks/fused_peers.py --only "$moe" > "$FL/fused_$k.log" 2>&1
  for f in "$FL"/fused_*.log; do echo "== $f"; cat "$f"; done > "$OUT/fused_all.log"
  timeout 200 python3 benchmarks/peers.py --no-compile --sizes "$SIZES" --schemes "$SCHEMES" --json "$OUT/peers.json" \
    > "$OUT/peers.log" 2>&1; echo "peers rc=$?" >> "$OUT/peers.log"
fi
if [[ "$PHASE" == gemm || "$PHASE" == all ]]; then
  timeout 400 python3 benchmarks/gemm_peers.py --shapes "$GEMM_SHAPES" --cases int8,fp8_row,fp8_block --sass \
    > "$OUT/gemm.log" 2>&1; echo "gemm rc=$?" >> "$OUT/gemm.log"
fi

if [[ $RUN_PYTEST == 1 ]]; then
  echo "== GPU tests =="; grep -v -E "^\[gw|PASSED|SKIPPED|^[0-9.]+s (call|setup)" "$OUT/pytest_gpu.log" | grep -E "passed|failed|error|rc=" | tail -15
  grep -E "FAILED|ERROR" "$OUT/pytest_gpu.log" | head -20
fi
if [[ $RUN_SAN == 1 ]]; then
  echo "== compute-sanitizer memcheck ($SAN_PARTS parts) =="; cat "$OUT/sanitizer_rc.log"
  for ((i = 0; i < SAN_PARTS; i++)); do
    echo "part $i: $(grep -E '^sweep: ' "$OUT/sanitizer_$i.log" | tail -1) | $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer_$i.log" | tail -1)"
    grep -E "FAILED" "$OUT/sanitizer_$i.log" | head -5
  done
fi
if [[ "$PHASE" == bench || "$PHASE" == all ]]; then
  echo "== fused (bf16 8192x7168; each op its own process, timed under a lock) =="
  grep -h -E "^device:" "$OUT/fused_all.log" | head -1
  grep -h -E "^(rmsnorm|flatten|moe)|ERROR|exit code|Traceback" "$OUT/fused_all.log"
  echo "== quantize peers =="; grep -E "^\||rc=|skipped" "$OUT/peers.log"
fi
if [[ "$PHASE" == gemm || "$PHASE" == all ]]; then
  echo "== GEMM =="; grep -v -E "^(\{|SASS)" "$OUT/gemm.log" | tail -25
fi
