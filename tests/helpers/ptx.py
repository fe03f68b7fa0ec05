"""Scripts run in a fresh interpreter outside the CUDA simulator: numba-cuda compiles PTX and
nvJitLink assembles it without a GPU (the simulator is on in the test process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository


def compile_rows(script):
    """Run ``script`` in a fresh interpreter outside the CUDA simulator (it compiles and
    assembles without a GPU) and return the JSON rows it prints last."""
    pytest.importorskip("cuda.bindings.nvjitlink")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
