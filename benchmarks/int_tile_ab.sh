#!/usr/bin/env bash
# One GPU call for the integer group / tile / asymmetric / centred encode changes
# (tests/test_int_group_tile*.py): the GPU tests of the paths touched, then
# benchmarks/int_tile_ab.py (variants side by side in one process, beside the copy: see its
# docstring). Logs under $OUT; the tables last.
# Defaults: the stat-group run (int4_asym, int8_centred, int8_asym). The earlier runs:
#   SCHEMES=fp8_128x128,int4_group,int8_centred TESTK="int_group_tile or int4_group or fp8_128x128" \
#     AB_ARGS="--variants old,new,new+lb,old" TEST_ENV="NQDQ_INT_GROUP_MIN_BLOCKS=5 NQDQ_TILE_MIN_BLOCKS=3"
#   SCHEMES=int8_asym TESTK="int8_asym or asym_rows" AB_ARGS="--variants old,new,old"
#   (stat groups, first run) AB_ARGS="--variants stat_old,stat_new,stat_clip,stat_k4,stat_old"
set -uo pipefail
source "$(dirname "$0")/../scripts/_gpu_env.sh"
SIZES="${SIZES:-8192x8192,16384x7168}"
SCHEMES="${SCHEMES:-int4_asym,int8_centred,int8_asym}"
TESTK="${TESTK:-asym or centred}"  # pytest -k
AB_ARGS="${AB_ARGS:---variants stat_old,stat_clip,stat_packed,stat_old}"
TEST_ENV="${TEST_ENV:-}"  # e.g. launch-bound knobs for the tests
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
export NQDQ_TEST_GPU=1
env $TEST_ENV timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -m gpu -n 12 -p no:cacheprovider \
  tests/test_int_group_tile_gpu.py tests/test_kernels_gpu.py -k "$TESTK" \
  > "$OUT/tests.log" 2>&1
echo "tests rc=$?: $(tail -1 "$OUT/tests.log")"
timeout "${AB_TIMEOUT:-170}" python3 benchmarks/int_tile_ab.py --no-compile --sizes "$SIZES" --schemes "$SCHEMES" \
  --json "$OUT/ab.json" $AB_ARGS > "$OUT/ab.log" 2>&1
echo "ab rc=$?"; grep -E "^\| " "$OUT/ab.log" | grep -E "copy|nqdq"
grep -E "passed|failed|error" "$OUT/tests.log" | tail -3
