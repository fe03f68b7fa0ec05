"""Launchers of the MoE sort + quantize (moe_sort_quantize on the GPU; spec:
``reference/fused.moe_sort``, then the quantizer).

The op is the sort that builds the permutation, then the fused row kernel over the sorted rows
(``plan.run_rows``, OP_GATHER; its staged OP_SCATTER form where the rows are bfloat16 into MX
e2m1: ``plan.scatter_geometry``). Which sort (``moe_rows`` picks one):

* ``moe_sort``: one launch, its blocks waiting for each other's counts (three, count / scan /
  scatter, under graph capture);
* ``moe_rank`` from MOE_RANK_MIN_PAIRS pairs on (``rank_path``): one launch that ranks the
  pairs by chunks, the rows kernel then finding each pair's row;
* none up to MOE_LOCAL_MAX_PAIRS pairs (``local_path``): each block of the rows kernel finds
  its own pairs' rows.

``moe_plan`` records the general path's launches once for the hot path of
``nqdq.fused.moe_sort_quantize`` (each kernel after the first launched as its predecessor's
programmatic dependent on sm_90+); ``IdChecks``: the pinned words its id check is polled on.
"""

from __future__ import annotations

import itertools
import threading
from functools import lru_cache

import numpy as np

from ...schemes import Scheme
from . import kernels as fused_kernels
from .plan import _launch, _PlanAlloc, _Slot, run_rows, scatter_geometry, scatter_switches, staged_blocks
from .plan import staged_scatter
from ..runtime.interop import Allocator
from ..runtime.target import SIMULATOR, device_cc
from ..quantize.grid import MAX_DONE, SYNC_WORDS
from ..quantize.plan import _XDTYPES, _sm_count
from ..quantize.slots import fill_bytes

__all__ = ["moe_sort", "moe_rank", "moe_rows", "moe_plan", "moe_switches", "IdChecks", "id_checks"]

# The MoE sort of a direct call is one launch (moe_sort_kernel, its blocks waiting for each
# other's counts, by a wait that no residency can turn into a deadlock: quantize.grid.wait_done), of a
# call under graph capture three (count, scan, scatter). H100 (docs/design/moe.md), 2048 tokens
# top-4 of 256, planned calls, one launch against three:
# called eagerly (host and device) 37.7 -> 36.8 us (and 40.4 -> 37.8 without programmatic dependents), the host's
# time a call 23.2 -> 16.1 us (38.4 -> 28.1 on another host); replayed from a CUDA graph (device
# only) 34.2 -> 36.2 us, and at 64 tokens top-8 9.0 -> 13.3 (moe_plan).
# The planned MoE call launches each kernel after the first as its predecessor's programmatic
# dependent (sequence.compile_sequence's ``pdl``; sm_90+; OP_SCATTER rows only): a kernel allows its
# dependent's launch at its start (griddepcontrol.launch_dependents) and waits for its predecessor
# (griddepcontrol.wait) before it reads what that one wrote, so the OP_SCATTER rows load their
# tokens while the sort runs, and the three-launch sort's kernels start before the one before them
# ends. H100, in the runs of the one-launch sort's figures: eager 37.8 -> 36.8 us (one-launch sort), graph
# 36.6 -> 36.2 (one-launch sort), 35.2 -> 34.2 (three launches).
# From MOE_RANK_MIN_PAIRS (token, expert) pairs on, where the rows take the staged OP_SCATTER
# kernel (rank_path), the sort is moe_rank_kernel (one launch: each block ranks its chunk of pairs,
# the last to finish scans the counts; no grid barrier, no second pass) and the rows kernel
# finds each pair's row from its rank (fused.rows.rank_row), storing the op's perm itself.
# H100, bf16 x 7168 top-4 of 256, MOE_STAGE 8 with pipelined rounds, eager, chunks of 1024 pairs at
# every size (before rank_chunk_shift): 4096 pairs 24.8 us against 17.5 for moe_sort's one launch,
# 8192 33.1 against 30.0; 16384 51.5 against 59.0, 32768 99.5 against 107.6.
MOE_RANK_MIN_PAIRS = 12288
# ... over about MOE_RANK_BLOCKS chunks of 256 to 1024 pairs (rank_chunk_shift). H100, as above,
# chunks of 256 / 512 / 1024 pairs: 8192 pairs 29.8 / 30.9 / 33.4 us, 16384 57.2 / 49.7 / 53.0,
# 32768 121.4 / 105.2 / 95.3 (moe_sort's one launch: 29.4, 57.7, 109.8).
MOE_RANK_BLOCKS = 32
# Up to MOE_LOCAL_MAX_PAIRS (token, expert) pairs, where the staged rows take every token in one
# round (local_path: at most plan.MOE_STAGE_BLOCKS blocks an SM x the stage), no sort is launched:
# each block counts every pair's bucket itself while its tokens load and finds its own pairs'
# rows (fused.rows.RANK_LOCAL). One launch, no workspace, no block waiting for another. Every
# block reads and counts every id, so it pays only for small calls. H100 (docs/design/moe.md),
# hidden 7168 of 256 experts, local / the sorts, us: CUDA graphs 64 tokens
# top-8 5.88 / 8.01, 256 top-8 9.19 / 10.25, 512 top-4 10.45 / 10.60; eager 64 top-8 6.7 / 11.9,
# 256 top-8 9.4 / 14.1, 512 top-4 10.8 / 14.3; past the bound, graphs 512 top-8 14.91 / 13.90,
# 1024 top-4 19.63 / 14.23, eager 2048 top-4 36.3 / 29.2.
MOE_LOCAL_MAX_PAIRS = 2048
# A planned call with check_ids=True passes the sort a word of pinned host memory (IdChecks) for
# its id check (fused.kernels.report_ids) and polls that word: it waits for the sort, not for the
# rows (reading offsets[E] back, CuPy's copy, waited for the whole op). The local path (no sort)
# reads offsets[E] back.


def moe_sort(ids, npairs: int, k: int, num_experts: int, alloc: Allocator, launches=None, ws=None, one=True,
             out=None, flag=None):
    """(perm int32 [npairs], offsets int32 [E+2], inv int32 [npairs]) on the device from
    expert ids [npairs] (int32 or int64; token-major, then slot): reference/fused.moe_sort's
    stable order, perm[row] = token of the pair sorted to ``row``, inv[pair] = its row.
    Nothing waits for the device: ids outside [0, E) sort after every expert, in pair order
    (rows offsets[E]:offsets[E + 1]); offsets[:E + 1] is the op's offsets, and
    offsets[E] == npairs says every id was in range.

    ``one`` (a direct call's): one launch (``moe_sort_kernel``, at most one block per SM,
    its blocks waiting for each other's counts on ``ws``: a zeroed ``_grid`` workspace the
    kernel leaves zero; None: a zeroed one of ``alloc``'s; the wait ends whatever part of the
    grid is resident); else three (count, scan, scatter).
    ``out``: (perm, offsets, inv) to write instead of new arrays (a plan's second sequence).
    ``flag``: an int32 [1] the sort sets to 1 (every id in range) or 2 (_fused_kernels.report_ids:
    what a planned call with check_ids=True polls); None: none set (the kernels' ``report``
    argument 0)."""
    if not 1 <= num_experts <= fused_kernels.MOE_MAX_EXPERTS:
        raise ValueError(f"num_experts={num_experts} must be in [1, {fused_kernels.MOE_MAX_EXPERTS}] "
                         "for the device sort")
    nchunks = max(1, -(-npairs // fused_kernels.MOE_CHUNK))
    nb = num_experts + 1  # the experts, then the bucket of ids out of range
    if out is None:
        out = (alloc.empty(max(npairs, 1), np.int32), alloc.empty(num_experts + 2, np.int32),
               alloc.empty(max(npairs, 1), np.int32))
    perm, offsets, inv = out
    report, flag = _report(flag, alloc)
    if one:
        G = min(nchunks, _sm_count(), MAX_DONE)
        counts = alloc.empty(G * nb, np.int32)
        if ws is None:
            ws = alloc.empty(SYNC_WORDS, np.int32)
            fill_bytes(ws, 0)
        _launch(launches, fused_kernels.moe_sort_kernel, G, fused_kernels.MOE_CHUNK,
                (ids, npairs, num_experts, k, counts, ws, perm, offsets, inv, flag, report))
        return perm[:npairs], offsets, inv[:npairs]
    counts = alloc.empty(nchunks * nb, np.int32)
    base = alloc.empty(nchunks * nb, np.int32)
    _launch(launches, fused_kernels.moe_count_kernel, nchunks, fused_kernels.MOE_CHUNK,
            (ids, npairs, num_experts, counts))
    _launch(launches, fused_kernels.moe_scan_kernel, 1, moe_scan_threads(num_experts),
            (counts, nchunks, num_experts, base, offsets, flag, report))
    _launch(launches, fused_kernels.moe_scatter_kernel, nchunks, fused_kernels.MOE_CHUNK,
            (ids, npairs, num_experts, k, base, perm, inv))
    return perm[:npairs], offsets, inv[:npairs]


def local_path(xin, n: int, sch: Scheme, k: int, npairs: int, num_experts: int) -> bool:
    """Whether moe_sort_quantize launches no sort: the rows take the staged OP_SCATTER kernel
    (_scatter) and fit one round of it, at most MOE_LOCAL_MAX_PAIRS pairs and
    MOE_LOCAL_BUCKETS - 1 experts."""
    if not (0 < npairs <= MOE_LOCAL_MAX_PAIRS and num_experts + 1 <= fused_kernels.MOE_LOCAL_BUCKETS):
        return False
    _, _, stage = scatter_geometry(n, k, local=True)
    if stage <= 0 or -(-npairs // k) > stage * staged_blocks():
        return False
    return staged_scatter(xin, n, sch, k)


def moe_local(ids, npairs: int, k: int, num_experts: int, alloc: Allocator):
    """(offsets int32 [E + 2], perm int32 [npairs], moe) for local_path's call: run_rows'
    ``moe=`` argument, with which the rows kernel sorts the pairs of the ids itself
    (RANK_LOCAL) and writes perm and offsets (moe_sort's)."""
    offsets, perm = alloc.empty(num_experts + 2, np.int32), alloc.empty(max(npairs, 1), np.int32)
    return offsets, perm[:npairs], (ids, k, offsets, perm, num_experts + 1, None)


def rank_path(xin, n: int, sch: Scheme, k: int, npairs: int) -> bool:
    """Whether moe_sort_quantize's sort is moe_rank (npairs >= MOE_RANK_MIN_PAIRS): where
    run_rows takes the staged OP_SCATTER kernel (_scatter) for its rows of
    ``xin`` (C-contiguous [tokens, n]) with k experts a token."""
    return npairs >= MOE_RANK_MIN_PAIRS and staged_scatter(xin, n, sch, k)


def rank_chunk_shift(npairs: int) -> int:
    """log2 of moe_rank_kernel's chunk: about MOE_RANK_BLOCKS chunks, of 256 to 1024 pairs."""
    return max(8, min(fused_kernels.MOE_RANK_SHIFT, (-(-npairs // MOE_RANK_BLOCKS) - 1).bit_length()))


def moe_rank(ids, npairs: int, num_experts: int, alloc: Allocator, launches=None, ws=None, out=None, flag=None):
    """(packed int32 [npairs], cbase, offsets int32 [E+2], perm int32 [npairs], csh) from
    expert ids [npairs] as moe_sort takes them, by moe_rank_kernel (one launch, a block a chunk
    of 2^csh pairs: rank_chunk_shift): packed and cbase (the chunks' first rows of each
    bucket) are what the staged rows kernel reads with RANK (run_rows' ``moe=(packed, k,
    cbase, perm, E + 1, csh)``); perm is written by that kernel; offsets as moe_sort's.
    ``ws``: a zeroed ``quantize.grid`` workspace (its first word the kernel's ticket, left zero); None:
    a zeroed one of ``alloc``'s. ``out``: (packed, cbase, offsets, perm) to write instead of
    new arrays. ``flag``: as moe_sort's."""
    if not 1 <= num_experts <= fused_kernels.MOE_MAX_EXPERTS:
        raise ValueError(f"num_experts={num_experts} must be in [1, {fused_kernels.MOE_MAX_EXPERTS}] "
                         "for the device sort")
    csh = rank_chunk_shift(npairs)
    nchunks = max(1, -(-npairs // (1 << csh)))
    nb = num_experts + 1
    counts = alloc.empty(nchunks * nb, np.int32)
    if out is None:
        out = (alloc.empty(max(npairs, 1), np.int32), alloc.empty(nchunks * nb, np.int32),
               alloc.empty(num_experts + 2, np.int32), alloc.empty(max(npairs, 1), np.int32))
    packed, cbase, offsets, perm = out
    report, flag = _report(flag, alloc)
    if ws is None:
        ws = alloc.empty(SYNC_WORDS, np.int32)
        fill_bytes(ws, 0)
    _launch(launches, fused_kernels.moe_rank_kernel, nchunks, fused_kernels.MOE_CHUNK,
            (ids, npairs, num_experts, csh, counts, cbase, packed, offsets, ws, flag, report))
    return packed, cbase, offsets, perm[:npairs], csh


_SORTS_REPORTING = (fused_kernels.moe_sort_kernel, fused_kernels.moe_scan_kernel,
                    fused_kernels.moe_rank_kernel)  # (their last argument: report)


def _report(flag, alloc):
    """(report, flag) arguments of a sort kernel: (1, flag), or where ``flag`` is None (0, a
    word of ``alloc``'s that the kernel never touches; not an array it writes: the simulator
    copies each argument back after the kernel, the last copy of an array passed twice
    winning)."""
    return (0, alloc.empty(1, np.int32)) if flag is None else (1, flag)


def _unreported(launches):
    """``launches`` (a plan's) with every sort kernel's ``report`` argument 0."""
    return [(kern, g, b, a[:-1] + (0,)) if kern in _SORTS_REPORTING else (kern, g, b, a) for kern, g, b, a in launches]


def moe_rows(xin, ids, npairs: int, k: int, num_experts: int, sch: Scheme, alloc: Allocator, launches=None,
             ws=None, flag=None):
    """The MoE sort + quantize's launches for x ``xin`` (C-contiguous [tokens, hidden]) and
    ``ids`` (npairs, token-major): no sort where local_path holds, moe_rank's
    where rank_path does, else moe_sort's; then run_rows. ``ws``: the sort's
    workspace (None: a zeroed one of ``alloc``'s); ``flag``: the sort's id check word (as
    moe_sort's; the local path has none). Returns (run_rows' outputs, perm, offsets [E + 2],
    the path: "local", "rank" or "sort", and moe_sort's inv on the sort path, else None)."""
    hidden = xin.shape[1]
    if local_path(xin, hidden, sch, k, npairs, num_experts):  # the rows kernel sorts its own pairs
        offsets, perm, moe = moe_local(ids, npairs, k, num_experts, alloc)
        out = run_rows(fused_kernels.OP_GATHER, xin, npairs, hidden, sch, moe=moe, alloc=alloc, launches=launches)
        return out, perm, offsets, "local", None
    if rank_path(xin, hidden, sch, k, npairs):  # the rows kernel finds each pair's row (and stores perm)
        packed, cbase, offsets, perm, csh = moe_rank(ids, npairs, num_experts, alloc, launches, ws=ws, flag=flag)
        out = run_rows(fused_kernels.OP_GATHER, xin, npairs, hidden, sch,
                       moe=(packed, k, cbase, perm, num_experts + 1, csh),
                       alloc=alloc, launches=launches)
        return out, perm, offsets, "rank", None
    perm, offsets, inv = moe_sort(ids, npairs, k, num_experts, alloc, launches, ws=ws, flag=flag)
    out = run_rows(fused_kernels.OP_GATHER, xin, npairs, hidden, sch, perm=perm, moe=(inv, k), alloc=alloc,
                   launches=launches)
    return out, perm, offsets, "sort", inv


def moe_scan_threads(num_experts: int) -> int:
    """The scan's block: a power of two >= E, at least a warp, at most MOE_MAX_EXPERTS."""
    return min(fused_kernels.MOE_MAX_EXPERTS, max(32, 1 << (num_experts - 1).bit_length()))


# ----------------------------------------------------------------------------- the MoE hot path
def moe_switches() -> tuple:
    """What moe_plan reads of the MoE launchers' module settings (its ``switches``, and the MoE
    hot path's key), in one place: the staged rows' geometry (plan.scatter_switches) and the
    size rules here (tests set smaller ones to reach every path at small sizes)."""
    return scatter_switches() + (MOE_RANK_MIN_PAIRS, MOE_LOCAL_MAX_PAIRS)


class IdChecks:
    """Words of pinned host memory that the sort's kernels write (_fused_kernels.report_ids: 1
    every expert id in range, 2 not), mapped into the device's address space: a planned
    moe_sort_quantize with check_ids=True takes one (``take``), passes its device address to
    the sort, and polls it (``wait``) instead of waiting for the stream, so it returns once the
    sort has its totals, the rows still to run. A ring of ``n`` words: a word is taken again only after n
    later calls, each of which waited for its own word (calls in flight at once: at most one
    a thread). ``host``: an int32 array over the words; ``dev``: their device address
    (tests build one over a NumPy array, ``dev`` 0)."""

    POLLS = 1024  # reads of the word between two queries of the stream

    def __init__(self, host, dev: int):
        self.host, self.dev, self.n = host, int(dev), len(host)
        self._read = host.item
        self._next = itertools.count()

    @classmethod
    def pinned(cls, cp, n: int = 1024):
        mem = cp.cuda.alloc_pinned_memory(4 * n)
        # (cudaHostAlloc's memory is mapped; its device address, the same as the host's with
        # unified addressing, by cudaPointerGetAttributes)
        self = cls(np.frombuffer(mem, np.int32, n), cp.cuda.runtime.pointerGetAttributes(mem.ptr).devicePointer)
        self._mem = mem  # (kept alive with the words)
        return self

    def take(self) -> tuple[int, int]:
        """(i, device address) of a word, cleared."""
        i = next(self._next) % self.n
        self.host[i] = 0
        return i, self.dev + 4 * i

    def wait(self, i: int, stream) -> bool:
        """Whether word i says every id was in range, once the kernel has written it. Every
        POLLS reads, the stream is queried (``stream.done``): a stream with nothing left to
        run and the word still clear means the check never ran (RuntimeError), not a wait
        for ever."""
        read, polls = self._read, self.POLLS
        n = 0
        while True:
            v = read(i)
            if v:
                return v == 1
            n += 1
            if n % polls == 0 and stream.done:
                v = read(i)
                if v:
                    return v == 1
                raise RuntimeError("moe_sort_quantize: the stream ended without the sort writing its id "
                                   "check (fused.kernels.report_ids)")


_ID_CHECKS = None
_ID_CHECKS_LOCK = threading.Lock()


def id_checks(cp) -> IdChecks:
    """The process's pinned :class:`IdChecks` (made on first use)."""
    global _ID_CHECKS
    with _ID_CHECKS_LOCK:
        if _ID_CHECKS is None:
            _ID_CHECKS = IdChecks.pinned(cp)
    return _ID_CHECKS


@lru_cache(maxsize=64)
def moe_plan(device: int, tokens: int, hidden: int, k: int, num_experts: int, kind: int, dtype_name: str,
             ids_char: str, sch: Scheme, switches: tuple):
    """``run(x, ids, flag=0) -> (codes, scales, perm, offsets)`` for moe_sort_quantize on
    C-contiguous CuPy arrays of these shapes and dtypes (x: 16-byte aligned; ids: int32 or int64,
    the char ``ids_char``) on GPU ``device`` (current when built and called: _devices), on CuPy's
    current stream: one ``cupy.cuda.alloc`` for every output and
    scratch array and the launches of the general path (moe_rank or moe_sort, run_rows: the
    same kernels, grids and arguments, recorded once) by ``sequence.compile_sequence``; ``offsets``
    is the op's [E + 1] (moe_sort's but its last entry). None where that cannot be built (simulator, NQDQ_FAST_LAUNCH=0,
    no CuPy). ``switches``: moe_switches(), part of the cache key. On the local path (local_path)
    the call is one launch, the rows kernel's, with no workspace. With OP_SCATTER rows on sm_90+
    every launch after the first is its predecessor's programmatic dependent: the rows' loads
    overlap the sort. On the rank path (rank_path) the sort is moe_rank's one launch, its
    ticket the stream's workspace on a
    direct call and, under graph capture, a word of the call's allocation zeroed by a memset
    first. Else a direct call sorts in one launch, a call under graph capture
    in three (``run.seq`` and ``run.seq_graph``). Except on the local path (which has no sort),
    a direct call given ``flag`` (the device address of an IdChecks word:
    check_ids=True) launches ``run.seq_check``, the same launches but the sort's ``report``
    argument 1: the sort writes its id check there (_fused_kernels.report_ids)."""
    import sys

    from ..runtime import launch
    from ..runtime.sequence import compile_sequence

    cp = sys.modules.get("cupy")
    if SIMULATOR or cp is None or not launch._fast_path_allowed() or tokens * k == 0:
        return None
    from ..runtime.interop import DeviceInput, cupy_array_new

    alloc, launches = _PlanAlloc(), []
    tk = tokens * k
    x = _Slot("xp", 0, tokens * hidden, _XDTYPES[kind])
    ids = _Slot("ids", 0, tk, np.dtype(ids_char))
    ws = _Slot("ws", 0, SYNC_WORDS, np.dtype(np.int32))
    flag = _Slot("flag", 0, 1, np.dtype(np.int32))  # the sort's id check word (run's ``flag``)
    xin = DeviceInput(x, kind, (tokens, hidden), dtype_name, "cupy")
    # (x's slot at offset 0: aligned, as the hot path's x must be)
    out, perm, offsets, path, inv = moe_rows(xin, ids, tk, k, num_experts, sch, alloc, launches, ws=ws, flag=flag)
    local, rank = path == "local", path == "rank"
    checked, launches = launches, _unreported(launches)  # (a call with check_ids=True, and one without)
    if rank:
        ws_graph = alloc.empty(SYNC_WORDS, np.int32)  # a captured call's own ticket, zeroed by a memset node
    names = ("xp", "ids", "base", "ws", "flag")
    # each launch after the first is its predecessor's programmatic dependent (the sort's
    # kernels and OP_SCATTER wait for their predecessor before they read its output)
    pdl_ok = out["op"] == fused_kernels.OP_SCATTER and (device_cc() or (0, 0)) >= (9, 0)  # (sm_90+)

    def sequence(ls):
        return compile_sequence(ls, names, pdl=tuple(range(1, len(ls))) if pdl_ok else ())

    seq = seq_graph = sequence(launches)
    reports = not local  # (the local path has no sort to report the check)
    seq_check = sequence(checked) if reports else None
    if seq is None or (reports and seq_check is None):
        return None
    if not rank and not local:
        # Captured in a CUDA graph, the call takes the three-launch sort (into the same arrays):
        # a graph pays no host time a launch, and on the device the three launches are shorter
        # (H100, graphs, dependent launches: 64 tokens top-8 9.0 against 13.3 us a call, 2048 top-4
        # 34.1 against 36.1); and its replays need no workspace of their own (no memset node).
        # Direct calls take the one launch and the stream's quantize.grid workspace (left zero).
        l3 = []
        moe_sort(ids, tk, k, num_experts, alloc, l3, one=False, out=(perm, offsets, inv))
        seq_graph = sequence(l3 + launches[-1:])
        if seq_graph is None:
            return None
    total = max(alloc.total, 1)
    parts = [(out["codes"], (tk, out["pcols"])), (out["scales"], sch.scale_shape((tk, hidden))), (perm, (tk,)),
             (offsets, (num_experts + 1,))]
    views = [(a.offset, tuple(shape), a.dtype) for a, shape in parts]
    _alloc, _nd, _cur = cp.cuda.alloc, cp.ndarray, cp.cuda.get_current_stream
    # the arrays by ndarray's own __new__ + _init where that builds what the constructor does
    # (about 1 us less each: runtime.interop.cupy_array_new, as nqdq.quantize's hot path)
    new = cupy_array_new(cp, cp.cuda.alloc(256))

    if rank:
        # direct calls: the stream's workspace (left zero by the rank kernel); captured: the
        # call's own, zeroed first (a graph may be replayed on any stream, beside direct calls)
        from ..quantize.runners import capture_test, stream_workspaces as _stream_workspaces

        _ws, _capturing, _memset = _stream_workspaces(cp).get, capture_test(cp), cp.cuda.runtime.memsetAsync
        ws_off = ws_graph.offset

        def launch(st, x, ids, mp, flag=0):
            if _capturing(st.ptr):
                _memset(mp.ptr + ws_off, 0, SYNC_WORDS * 4, st.ptr)
                seq(st.ptr, x.data.ptr, ids.data.ptr, mp.ptr, mp.ptr + ws_off, 0)
            else:
                (seq_check if flag else seq)(st.ptr, x.data.ptr, ids.data.ptr, mp.ptr, _ws(st, device), flag)
    elif seq_graph is seq:
        def launch(st, x, ids, mp, flag=0):
            (seq_check if flag else seq)(st.ptr, x.data.ptr, ids.data.ptr, mp.ptr, 0, flag)
    else:
        from ..quantize.runners import capture_test, stream_workspaces as _stream_workspaces

        _ws, _capturing = _stream_workspaces(cp).get, capture_test(cp)

        def launch(st, x, ids, mp, flag=0):
            if _capturing(st.ptr):
                seq_graph(st.ptr, x.data.ptr, ids.data.ptr, mp.ptr, 0, 0)
            else:
                (seq_check if flag else seq)(st.ptr, x.data.ptr, ids.data.ptr, mp.ptr, _ws(st, device), flag)

    if new is not None:
        def run(x, ids, flag=0):
            mp = _alloc(total)
            launch(_cur(device), x, ids, mp, flag)
            arrays = []
            for off, shape, dt in views:
                a = new(_nd)
                a._init(shape, dt, mp + off)
                arrays.append(a)
            return arrays
    else:
        def run(x, ids, flag=0):
            mp = _alloc(total)
            launch(_cur(device), x, ids, mp, flag)
            return [_nd(shape, dt, mp + off) for off, shape, dt in views]

    run.launch, run.total, run.seq, run.seq_graph = launch, total, seq, seq_graph  # (diagnostics and tests)
    run.seq_check = seq_check  # run(x, ids, flag) with ``flag`` != 0 launches it: the sort reports to flag
    return run
