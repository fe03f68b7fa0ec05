# Sourced by the one-call GPU scripts: cd to the repo root, $OUT, the carried numpy wheel
# (the image's numpy 2.5 breaks numba-cuda 0.30: shared GPU.md) on PYTHONPATH.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-/tmp/nqdq-gpu}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$HOME/site" .whl/*.whl || exit 1
  export PYTHONPATH="$HOME/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1 NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0
