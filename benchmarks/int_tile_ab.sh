#!/usr/bin/env bash
# One GPU call for the int4_group / fp8_128x128 encode changes (tests/test_int_group_tile*.py):
# the GPU tests of the paths touched (new switches on and off, launch-bound variants), then
# benchmarks/int_tile_ab.py (old / new / new with launch bounds / old in one process, beside
# the copy: see its docstring).
# Logs under $OUT; the tables last.
set -uo pipefail
source "$(dirname "$0")/../scripts/_gpu_env.sh"
SIZES="${SIZES:-8192x8192,16384x7168}"
SCHEMES="${SCHEMES:-fp8_128x128,int4_group,int8_centred}"
TESTK="${TESTK:-int_group_tile or int4_group or fp8_128x128}"  # pytest -k
AB_ARGS="${AB_ARGS:-}"  # e.g. --variants old,new,old
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
export NQDQ_TEST_GPU=1
NQDQ_INT_GROUP_MIN_BLOCKS=5 NQDQ_TILE_MIN_BLOCKS=3 timeout 150 python3 -m pytest -q -m gpu -n 12 -p no:cacheprovider \
  tests/test_int_group_tile_gpu.py tests/test_kernels_gpu.py -k "$TESTK" \
  > "$OUT/tests.log" 2>&1
echo "tests rc=$?: $(tail -1 "$OUT/tests.log")"
timeout 170 python3 benchmarks/int_tile_ab.py --no-compile --sizes "$SIZES" --schemes "$SCHEMES" \
  --json "$OUT/ab.json" $AB_ARGS > "$OUT/ab.log" 2>&1
echo "ab rc=$?"; grep -E "^\| " "$OUT/ab.log" | grep -E "copy|nqdq"
tail -3 "$OUT/tests.log"
