"""A whole-grid max inside one kernel, for the schemes whose every code needs a tensor-wide
statistic (dynamic per-tensor float scales, NVFP4's S_enc) at decode sizes.

The streaming paths take that statistic in a kernel of its own (amax partials, then the
encode), which is right for large inputs but costs small ones a second ``cuLaunchKernel``
on the host (~3 us each on an H100 host, docs/performance.md "Host time per call") and a
second launch latency on the device. :func:`grid_max` lets one kernel do both: every block
loads its units into registers, reduces their amax, and publishes it; the blocks wait for
each other; then every block encodes what it already holds.

``sync`` is SYNC_WORDS int32 words, zero when the kernel starts, and zero again when it
ends (the words after the first three: the done bits of :func:`mark_done`). sync[0] counts
the blocks that arrived, sync[1] is the running max (non-negative int32 bits of a float32
magnitude, so integer max is float max, NaN above +inf where the caller counts it), sync[2]
counts the blocks that have read the max back. One thread per block
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

__all__ = ["grid_max", "grid_wait", "grid_leave", "done_bit", "mark_done", "done_words", "all_done", "leave_done",
           "SYNC_WORDS", "DONE_BASE", "DONE_WORDS", "MAX_DONE", "StreamWorkspaces"]

DONE_BASE = 3  # grid_max / grid_wait: words [arrivals, running max, departures]; then ...
DONE_WORDS = 8  # ... the done bits of up to MAX_DONE work items (mark_done, all_done)
MAX_DONE = 32 * DONE_WORDS
SYNC_WORDS = DONE_BASE + DONE_WORDS  # int32 words of a workspace, zero before and after each kernel
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


# -- a wait no residency can deadlock: work items whose results are idempotent --------------
# grid_wait needs every block of the grid resident at once. A kernel whose blocks each do a
# work item before the wait, an item's stores being the same values whoever does it (so that
# an item done twice is harmless), can wait on the items instead of the blocks: block b does
# item b and sets its done bit (mark_done); a block waits for every item's bit (all_done), and
# a block that has waited a while (all_done's ``spins``) does the missing items itself (done_words tells it
# which) and sets their bits. A block waits only for items that a running block does or that
# it does itself, so the wait ends however few of the grid's blocks are resident: a block that
# could not start (its SM held by other grids, an MPS thread limit) does its item again when
# it does start, finds every bit set, and goes on. Every block calls leave_done at its end;
# the last to leave zeroes the bits and the departures.


@devfn
def done_bit(i):
    """Bit i (0..31) of an int32 word."""
    return np.int32(-2147483648) if i == 31 else np.int32(1 << i)


@devfn
def _full(n, w):
    """Word w of the done bits when all of items 0..n-1 are done."""
    m = n - 32 * w
    return np.int32(-1) if m >= 32 else np.int32(0) if m <= 0 else np.int32((1 << m) - 1)


@devfn
def mark_done(sync, i):
    """(one thread of the block, after a block barrier that orders the item's stores before it)
    Item i's stores made visible (a fence), then its done bit set."""
    cuda.threadfence()
    cuda.atomic.or_(sync, DONE_BASE + (i >> 5), done_bit(i & 31))


@devfn
def done_words(sync, w):
    """Word w of the done bits, read by an atomic (never a stale cached word)."""
    return cuda.atomic.or_(sync, DONE_BASE + w, 0)


@devfn
def all_done(sync, n, spins):
    """(one thread) Whether items 0..n-1 (n <= MAX_DONE) are all done, the bits read up to
    ``spins`` times (a short sleep between reads); a fence after the last read when they are,
    so the items' stores are read after it."""
    for _ in range(spins):
        ok = True
        for w in range(DONE_WORDS):  # (unrolled: the words' reads in flight together)
            if 32 * w < n and done_words(sync, w) != _full(n, w):
                ok = False
        if ok:
            cuda.threadfence()
            return True
        if _SLEEP:
            cuda.nanosleep(np.uint32(32))
    return False


@devfn
def leave_done(tid, sync):
    """At a block's end, after all_done: counts its departure (sync[2]); the last block of the
    grid to leave zeroes the departures and the done bits."""
    if tid == 0:
        if cuda.atomic.add(sync, 2, 1) == cuda.gridDim.x - 1:
            cuda.atomic.exch(sync, 2, 0)
            for w in range(DONE_WORDS):
                cuda.atomic.exch(sync, DONE_BASE + w, 0)


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
