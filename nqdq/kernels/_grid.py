"""A whole-grid max inside one kernel, for the schemes whose every code needs a tensor-wide
statistic (dynamic per-tensor float scales, NVFP4's S_enc) at decode sizes.

The streaming paths take that statistic in a kernel of its own (amax partials, then the
encode), which is right for large inputs but costs small ones a second ``cuLaunchKernel``
on the host (~3 us each on an H100 host, docs/performance.md "Host time per call") and a
second launch latency on the device. :func:`grid_max` lets one kernel do both: every block
loads its units into registers, reduces their amax, and publishes it; the blocks wait for
each other; then every block encodes what it already holds.

``sync`` is three int32 words, zero when the kernel starts, and zero again when it ends:
sync[0] counts the blocks that arrived, sync[1] is the running max (non-negative int32
bits of a float32 magnitude, so integer max is float max, NaN above +inf where the caller
counts it), sync[2] counts the blocks that have read the max back. One thread per block
adds its block's value (``atom.global.max``), fences, arrives (``atom.global.add``), spins
on the count with a short sleep until every block of the grid has arrived, fences again,
reads the max back by an atomic (never a cached load), fences, and departs
(``atom.global.add`` on sync[2]); the block that departs last has seen every other block's
read done, so it sets the three words back to zero. ``max`` is order-independent, so the
result is the same bits as the two-kernel path's.

Because the kernel leaves its workspace as it found it, kernels that run one after another
can share one: :class:`StreamWorkspaces` gives each CUDA stream its own (kernels of one
stream never overlap), so the CuPy runner of a quantize plan issues no memset on its
direct calls. Under CUDA-graph capture the runner instead puts the workspace in the call's
own allocation and zeroes it with a memset (a graph node): a graph may be replayed on any
stream, concurrently with direct calls, so it must not share the stream's workspace.

The wait needs every block of the grid resident at once. The plans launch at most one
block per SM (``quantize._sm_count``) of a kernel small enough for four blocks per SM (256
threads of 36-60 registers, no shared memory to speak of): a block that cannot start yet
because another kernel holds its SM only delays the others until that kernel's blocks
leave. Limit: the blocks of up to four such grids fit on the SMs together, so up to four
one-launch calls may be in flight on different streams at once; more, each partly resident,
could wait for each other for ever, as could grids on a GPU of which the process has only
part (an MPS thread limit). ``quantize.GRID_COOPERATIVE`` (``NQDQ_GRID_COOPERATIVE=1``)
lifts both: a cooperative launch, which the driver places whole or refuses (the plan then
takes the two launches); off by default, as it costs about 1 us a call (H100). Under the
CUDA simulator blocks run one after another, so the plans use these kernels there only with
a grid of one block (the wait is then satisfied by the block itself); the multi-block wait,
concurrent streams and graph replays are tested on the GPU
(tests/test_grid_one_launch_gpu.py).
"""

from __future__ import annotations

import threading

import numpy as np
from numba import cuda

from ._target import SIMULATOR, devfn

__all__ = ["grid_max", "grid_wait", "grid_leave", "SYNC_WORDS", "StreamWorkspaces"]

SYNC_WORDS = 3  # int32 words of a grid_max workspace: [arrivals, running max, departures]
_PER_THREAD = 2  # cudaStreamPerThread, the per-thread default stream's handle
_SLEEP = not SIMULATOR  # (the simulator has no nanosleep; its one-block grids never spin)


@devfn
def arrive_and_wait(sync):
    """(one thread of the block) Count its block's arrival in sync[0], then spin (a short sleep
    between reads, each an atomic: never a stale cached word) until every block of the grid
    has arrived."""
    cuda.atomic.add(sync, 0, 1)
    n = cuda.gridDim.x
    while cuda.atomic.add(sync, 0, 0) < n:
        if _SLEEP:
            cuda.nanosleep(np.uint32(32))


@devfn
def grid_max(a, tid, sync, slot):
    """The max over the grid of every block's ``a`` (already its block's max, every thread
    holding it; non-negative int32), returned to every thread. ``slot``: a one-word shared
    int32 array of the caller's, not otherwise in use."""
    if tid == 0:
        cuda.atomic.max(sync, 1, a)
        cuda.threadfence()  # the max is visible before the arrival is
        arrive_and_wait(sync)
        cuda.threadfence()
        slot[0] = cuda.atomic.max(sync, 1, 0)
        cuda.threadfence()  # this block's read is done before its departure is counted
        if cuda.atomic.add(sync, 2, 1) == cuda.gridDim.x - 1:  # the last to leave: the next kernel finds zeros
            cuda.atomic.exch(sync, 0, 0)
            cuda.atomic.exch(sync, 1, 0)
            cuda.atomic.exch(sync, 2, 0)
    cuda.syncthreads()
    return slot[0]


@devfn
def grid_wait(tid, sync):
    """A grid barrier on the zeroed workspace ``sync`` (grid_max's, without the max): one thread
    of each block fences (the block's writes, ordered before it by a block barrier, are
    visible before its arrival is), arrives (sync[0]), spins until every block has, and
    fences again; then a block barrier. Every block calls :func:`grid_leave` once after it:
    the last to leave zeroes the workspace."""
    cuda.syncthreads()
    if tid == 0:
        cuda.threadfence()
        arrive_and_wait(sync)
        cuda.threadfence()
    cuda.syncthreads()


@devfn
def grid_leave(tid, sync):
    """After :func:`grid_wait` (once a block, whenever it no longer needs the barrier: off the
    critical path, e.g. at its end): counts the block's departure (sync[2]); the last block
    to leave, after which nobody reads sync[0], zeroes sync[0] and sync[2]."""
    if tid == 0:
        if cuda.atomic.add(sync, 2, 1) == cuda.gridDim.x - 1:
            cuda.atomic.exch(sync, 0, 0)
            cuda.atomic.exch(sync, 2, 0)


class StreamWorkspaces:
    """One zeroed ``grid_max`` workspace per CUDA stream, for the host side of a plan's
    direct (not captured) calls: ``get(stream)`` -> the device address of ``stream``'s
    workspace, allocated and zeroed in that stream on first use. Safe because the kernels
    leave it zero (``grid_max``) and kernels of one stream run one after another. A dict
    entry keeps its CuPy ``Stream`` object alive, so a handle in the dict is never a
    destroyed stream's reused by a new one; at most ``limit`` streams are kept (the oldest
    entry is dropped past that: its array goes back to CuPy's pool in its own stream's
    arena). One exception: an ``ExternalStream`` does not own its handle, so a stream the
    caller destroys while its work is pending, and a new stream given the same handle at
    once, would share a workspace; nqdq cannot see that."""

    def __init__(self, cupy, words=SYNC_WORDS, limit=64):
        self._cp = cupy
        self._words = int(words)
        self._limit = int(limit)
        self._by_ptr = {}  # stream handle -> (Stream, array, address)

    def get(self, stream):
        key = stream.ptr
        if key == _PER_THREAD:  # one handle, a different stream in every host thread
            key = (key, threading.get_ident())
        e = self._by_ptr.get(key)
        if e is None:
            e = self._new(stream, key)
        return e[2]

    def _new(self, stream, key):
        with stream:
            a = self._cp.zeros(self._words, np.int32)  # its memset in this stream, before any use
        e = (stream, a, int(a.data.ptr))
        while len(self._by_ptr) >= self._limit:
            self._by_ptr.pop(next(iter(self._by_ptr)), None)
        self._by_ptr[key] = e
        return e
