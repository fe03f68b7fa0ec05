"""A whole-grid max inside one kernel, for the schemes whose every code needs a tensor-wide
statistic (dynamic per-tensor float scales, NVFP4's S_enc) at decode sizes.

The streaming paths take that statistic in a kernel of its own (amax partials, then the
encode), which is right for large inputs but costs small ones a second ``cuLaunchKernel``
on the host (~3 us each on an H100 host, docs/design/launch-path.md) and a
second launch latency on the device. One kernel can do both: every block loads its units
into registers, reduces their amax, and publishes it; the blocks wait for each other; then
every block encodes what it already holds.

Two waits. :func:`grid_max` is a barrier over the grid: it needs every block resident at
once, so only a cooperative launch (which the driver places whole or refuses) may use it
(``quantize.tensor_resident``). The plainly launched one-launch kernels (quantize's at decode sizes,
at most one block per SM; the MoE sort's one launch) wait on work items instead
(:func:`wait_done`, below): a block that waits long computes the missing blocks' maxima (or
counts) itself, so the wait ends however few of the grid's blocks are resident: beside other
grids that hold the SMs, under an MPS thread limit, with any number of calls in flight on
other streams (tests/test_grid_one_launch_gpu.py and tests/test_fused_gpu.py hold all but a
few SMs while such a grid runs).

``sync`` is SYNC_WORDS int32 words, zero when the kernel starts, and zero again when it
ends. sync[0] counts the blocks that arrived, sync[1] is the running max (non-negative int32
bits of a float32 magnitude, so integer max is float max, NaN above +inf where the caller
counts it), sync[2] counts the blocks that have read the max back (departed), and the words
after those are wait_done's done bits. In grid_max one thread per block adds its block's
value (``atom.global.max``), fences, arrives (``atom.global.add``), spins on the count with
a short sleep until every block of the grid has arrived, fences again, reads the max back by
an atomic (never a cached load), fences, and departs (``atom.global.add`` on sync[2]); the
block that departs last has seen every other block's read done, so it sets the words back to
zero. ``max`` is order-independent, so the result is the same bits as the two-kernel path's.

Because the kernel leaves its workspace as it found it, kernels that run one after another
can share one: :class:`StreamWorkspaces` gives each CUDA stream its own (kernels of one
stream never overlap), so the CuPy runner of a quantize plan issues no memset on its
direct calls. Under CUDA-graph capture the runner instead puts the workspace in the call's
own allocation and zeroes it with a memset (a graph node): a graph may be replayed on any
stream, concurrently with direct calls, so it must not share the stream's workspace.
Under the CUDA simulator blocks run one after another: a grid of several blocks there is
the worst case of residency, which the wait_done kernels' simulator tests take.
"""

from __future__ import annotations

import threading

import numpy as np
from ..runtime.backend import cuda

from ..runtime.target import SIMULATOR, devfn

__all__ = ["grid_max", "done_bit", "arrive", "mark_done", "missing", "wait_done", "leave_done", "grid_max_publish",
           "grid_max_help", "grid_max_read", "SYNC_WORDS", "DONE_BASE", "DONE_WORDS", "MAX_DONE", "HELP_SPINS",
           "StreamWorkspaces", "workspace_key"]

DONE_BASE = 3  # words [arrivals, running max, departures]; then ...
DONE_WORDS = 8  # ... the done bits of up to MAX_DONE work items (arrive, mark_done, wait_done)
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


# -- a wait no residency can deadlock: work items whose results are idempotent --------------
# grid_max needs every block of the grid resident at once. A kernel whose blocks
# each do a work item before the wait, an item's results being the same whoever produces them
# (stores of the same values, an atomic max of the same value: an item done twice is
# harmless), can wait on the items instead of the blocks. Block b does item b and arrives
# (``arrive``: grid_max's arrival count, sync[0], then item b's done bit); the block waits
# for the count to reach the grid's size, as grid_max does (``wait_done``), and once it has
# read the count HELP_SPINS times it reads the done bits instead, does the missing items
# itself and sets their bits (``mark_done``), and is through when every bit is set. A block
# waits only for items that a running block does or that it does itself, so the wait ends
# however few of the grid's blocks are resident: a block that could not start (its SM held
# by other grids, an MPS thread limit) does its item again when it does start, finds every
# bit set, and goes on. While every block is resident, no block reads a bit: the wait is
# grid_max's, one atomic word polled (polling the done words themselves, 4 of them at 112
# blocks, made the one-launch kernels at 64x7168 1.3-2.0 us slower by atomics and 0.8 us by
# ld.global.cg on an H100; this way 0.45 us: docs/design/per-tensor-dynamic.md).
# Every block calls leave_done (or grid_max_read) at its end; the last to leave zeroes the
# words.

# reads of the arrival count before a block turns to the done bits (each read about a
# microsecond on an H100; a grid whose blocks are all resident waits a few of them)
HELP_SPINS = 2 if SIMULATOR else 256


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
def arrive(sync, b):
    """(one thread of block b, after a block barrier that orders its item's results before
    it) Item b's results made visible (a fence), block b's arrival counted (sync[0]), then
    item b's done bit set (not awaited: the count is what a resident grid waits on)."""
    cuda.threadfence()
    cuda.atomic.add(sync, 0, 1)
    cuda.atomic.or_(sync, DONE_BASE + (b >> 5), done_bit(b & 31))


@devfn
def mark_done(sync, i):
    """(one thread, after a block barrier that orders item i's results before it; a block
    doing another block's item) Item i's results made visible (a fence), then its done bit
    set."""
    cuda.threadfence()
    cuda.atomic.or_(sync, DONE_BASE + (i >> 5), done_bit(i & 31))


@devfn
def _arrived(sync, n):
    """(one thread) Whether all n blocks have arrived, the count read up to HELP_SPINS times
    (a short sleep between reads), each by an atomic (never a stale cached word); a fence
    after the last read when they have, so their results are read after it."""
    k = 0
    while cuda.atomic.add(sync, 0, 0) < n:  # (a while, not a for of HELP_SPINS: NVVM unrolled that
        k += 1  # 32 times, 0.4 us slower a launch at 64x7168 on an H100)
        if k == HELP_SPINS:
            return False
        if _SLEEP:
            cuda.nanosleep(np.uint32(32))
    cuda.threadfence()
    return True


@devfn
def missing(miss, i):
    """Whether item i is among wait_done's missing items ``miss``."""
    return miss[i >> 5] & done_bit(i & 31)


@devfn
def wait_done(tid, sync, flag, miss):
    """(every thread of the block) True once items 0..gridDim.x-1 are all done: every block
    has arrived, or (read after HELP_SPINS reads of the count) every done bit is set. Else
    False, with ``miss`` (DONE_WORDS words of shared memory) holding the items not done then
    as set bits (:func:`missing`): the caller does those items (mark_done each) and calls
    again. ``flag``: a one-word shared int32 array. Block barriers
    inside; the result is the same in every thread."""
    n = cuda.gridDim.x
    if tid == 0:
        flag[0] = _arrived(sync, n)
    cuda.syncthreads()
    if flag[0]:
        return True
    if tid < DONE_WORDS:
        miss[tid] = ~cuda.atomic.or_(sync, DONE_BASE + tid, 0)
        cuda.threadfence()  # (where every bit is set, the items' results are read after this)
    cuda.syncthreads()
    for w in range(DONE_WORDS):
        if miss[w] & _full(n, w):
            return False
    return True


@devfn
def _zero(sync):
    """(the last block to leave: no other block reads the words any more) The words zeroed by
    plain stores, visible to the next kernel of the stream."""
    for w in range(DONE_BASE + DONE_WORDS):
        sync[w] = 0


@devfn
def leave_done(tid, sync):
    """At a block's end, after wait_done: counts its departure (sync[2]); the last block of the
    grid to leave zeroes the workspace."""
    if tid == 0:
        if cuda.atomic.add(sync, 2, 1) == cuda.gridDim.x - 1:
            _zero(sync)


@devfn
def grid_max_publish(a, tid, sync):
    """(every thread, after its block's max ``a``: non-negative int32) The block's max
    published (sync[1] raised to it) and the block arrived (item blockIdx.x)."""
    if tid == 0:
        cuda.atomic.max(sync, 1, a)
        arrive(sync, cuda.blockIdx.x)


@devfn
def grid_max_help(h, tid, sync, i):
    """(every thread, after block i's max ``h``, computed by this block from block i's
    inputs) Block i's max published and item i marked done."""
    if tid == 0:
        cuda.atomic.max(sync, 1, h)
        mark_done(sync, i)


@devfn
def grid_max_read(tid, sync, slot):
    """(every thread, after wait_done returned True) The grid's max (sync[1]), read by an
    atomic into ``slot`` (a one-word shared int32 array) and returned; then the block's
    departure counted, the last block to leave zeroing the workspace. The grid_max of a
    kernel whose blocks publish their maxima (grid_max_publish) and, in wait_done's loop,
    the missing blocks' maxima (grid_max_help, each from that block's inputs)."""
    if tid == 0:
        slot[0] = cuda.atomic.max(sync, 1, 0)
        cuda.threadfence()  # this block's read is done before its departure is counted
        if cuda.atomic.add(sync, 2, 1) == cuda.gridDim.x - 1:
            _zero(sync)
    cuda.syncthreads()
    return slot[0]

def workspace_key(handle: int, device: int):
    """Which stream's workspace a call on stream ``handle`` of GPU ``device`` takes: the
    handle, except for the default streams, which have one handle on every GPU (and the
    per-thread one in every thread)."""
    if handle <= _PER_THREAD:
        return (handle, device, threading.get_ident() if handle == _PER_THREAD else 0)
    return handle


class StreamWorkspaces:
    """One zeroed ``grid_max`` workspace per CUDA stream, for the host side of a plan's
    direct (not captured) calls: ``get(stream)`` -> the device address of ``stream``'s
    workspace, allocated and zeroed in that stream on first use; ``get(stream, device)`` names
    the stream's GPU (the caller's plan's: _devices), which tells apart the default streams,
    whose handles are the same on every GPU. Safe because the kernels
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

    def get(self, stream, device):
        key = workspace_key(stream.ptr, device)
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
