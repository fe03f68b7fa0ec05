"""A whole-grid max inside one kernel, for the schemes whose every code needs a tensor-wide
statistic (dynamic per-tensor float scales, NVFP4's S_enc) at decode sizes.

The streaming paths take that statistic in a kernel of its own (amax partials, then the
encode), which is right for large inputs but costs small ones a second ``cuLaunchKernel``
on the host (~3 us each on an H100 host, docs/performance.md "Host time per call") and a
second launch latency on the device. :func:`grid_max` lets one kernel do both: every block
loads its units into registers, reduces their amax, and publishes it; the blocks wait for
each other; then every block encodes what it already holds.

``sync`` is two int32 words, zero when the kernel starts (the quantize plan zeroes them
with its allocation, in the same stream: a memset node under CUDA-graph capture): sync[0]
counts the blocks that arrived, sync[1] is the running max (non-negative int32 bits of a
float32 magnitude, so integer max is float max, NaN above +inf where the caller counts
it). One thread per block adds its block's value (``atom.global.max``), fences, arrives
(``atom.global.add``), spins on the count with a short sleep until every block of the grid
has arrived, fences again and reads the max back by an atomic (never a cached load).
``max`` is order-independent, so the result is the same bits as the two-kernel path's.

The wait needs every block of the grid resident at once. The plans launch at most one
block per SM (``quantize._sm_count``) of a kernel small enough for four blocks per SM (256
threads of 36-60 registers, no shared memory to speak of): a block that cannot start yet
because another kernel holds its SM only delays the others until that kernel's blocks
leave. Limit: the blocks of up to four such grids fit on the SMs together, so up to four
one-launch calls may be in flight on different streams at once; more, each partly resident,
could wait for each other for ever (a cooperative launch, which the driver places whole,
would lift this; not done). Under the CUDA simulator blocks run one after another, so the
plans use these kernels there only with a grid of one block (the wait is then satisfied by
the block itself); the multi-block wait, concurrent streams and graph replays are tested on
the GPU (tests/test_grid_one_launch_gpu.py).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from ._target import SIMULATOR, devfn

__all__ = ["grid_max", "SYNC_WORDS"]

SYNC_WORDS = 2  # int32 words of a grid_max workspace: [arrivals, running max]
_SLEEP = not SIMULATOR  # (the simulator has no nanosleep; its one-block grids never spin)


@devfn
def grid_max(a, tid, sync, slot):
    """The max over the grid of every block's ``a`` (already its block's max, every thread
    holding it; non-negative int32), returned to every thread. ``slot``: a one-word shared
    int32 array of the caller's, not otherwise in use."""
    if tid == 0:
        cuda.atomic.max(sync, 1, a)
        cuda.threadfence()  # the max is visible before the arrival is
        cuda.atomic.add(sync, 0, 1)
        n = cuda.gridDim.x
        while cuda.atomic.add(sync, 0, 0) < n:
            if _SLEEP:
                cuda.nanosleep(np.uint32(32))
        cuda.threadfence()
        slot[0] = cuda.atomic.max(sync, 1, 0)
    cuda.syncthreads()
    return slot[0]
