"""Test configuration.

Kernels run under Numba's CUDA simulator unless NQDQ_TEST_GPU=1 is set (on the GPU
machine), so the same tests run in CI without a GPU. The variable must be set before
numba.cuda is first imported, hence here.
"""

import os

if os.environ.get("NQDQ_TEST_GPU") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
