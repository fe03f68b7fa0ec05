"""Small kernels that run one intrinsic or device function, shared by a simulator test (the
twins) and its GPU test (the hardware): the tensor-core path (cp.async, ldmatrix, mma), the
mbarrier stubs, the grid-wide max of the one-launch kernels."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from numba import cuda, int32, uint8

from nqdq.gpu.ptx import mma as _mma
from nqdq.gpu.ptx import wgmma as _wg
from nqdq.gpu.quantize.grid import grid_max

FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


WAIT_ALL = _mma.cp_async_wait(0)  # a PTX immediate: one stub per count, taken outside the kernel


@cuda.jit(device=True)
def stage_fragments(sm, a, b, lane):
    """One warp's A [16, 32 bytes] and B [8, 32 bytes] through cp.async -> shared (A rows at
    0, 32 bytes each; B rows at 512) -> ldmatrix: (a0, a1, a2, a3, b0, b1), the 8-bit
    m16n8k32 fragments (the bf16 m16n8k16 and the block-scaled ones have the same bytes)."""
    for c in range(lane, 48, 32):  # 32 chunks of A (16 rows x 2), 16 of B
        if c < 32:
            _mma.cp_async16(sm, (c >> 1) * 32 + (c & 1) * 16, a, (c >> 1) * 32 + (c & 1) * 16, 16)
        else:
            r = c - 32
            _mma.cp_async16(sm, 512 + (r >> 1) * 32 + (r & 1) * 16, b, (r >> 1) * 32 + (r & 1) * 16, 16)
    _mma.cp_async_commit()
    WAIT_ALL()
    cuda.syncthreads()
    # A: matrices (rows 0-7, k 0-15), (rows 8-15, k 0-15), (rows 0-7, k 16-31), (8-15, 16-31)
    a0, a1, a2, a3 = _mma.ldmatrix_x4(sm, ((lane & 7) + ((lane >> 3) & 1) * 8) * 32 + (lane >> 4) * 16)
    # B (8 rows): matrices (k 0-15), (k 16-31); x4 reads them twice (lanes 16-31 repeat)
    b0, b1, b2, b3 = _mma.ldmatrix_x4(sm, 512 + (lane & 7) * 32 + ((lane >> 3) & 1) * 16)
    return a0, a1, a2, a3, b0, b1


@cuda.jit(device=True)
def store_fragment(d, lane, d0, d1, d2, d3):
    """D [16, 8] (row-major) from each lane's C / D fragment."""
    g = lane >> 2
    t = lane & 3
    cuda.syncthreads()
    d[g * 8 + 2 * t] = d0
    d[g * 8 + 2 * t + 1] = d1
    d[(g + 8) * 8 + 2 * t] = d2
    d[(g + 8) * 8 + 2 * t + 1] = d3


def make_mma_probe(mma):
    """A one-warp kernel: D = A @ B.T for A [16, 32], B [8, 32] uint8 bytes, through
    cp.async -> shared -> ldmatrix -> mma; D written from each lane's fragment."""

    @cuda.jit
    def probe(a, b, d):
        sm = cuda.shared.array(1024, uint8)
        lane = cuda.threadIdx.x
        a0, a1, a2, a3, b0, b1 = stage_fragments(sm, a, b, lane)
        d0, d1, d2, d3 = mma(a0, a1, a2, a3, b0, b1, d[0], d[0], d[0], d[0])  # C = d[0] = 0
        store_fragment(d, lane, d0, d1, d2, d3)

    _ = int32
    return probe


MMA_CASES = ["s8s8", "u8s8", "e4m3.e4m3", "e4m3.e5m2", "e5m2.e4m3", "e5m2.e5m2"]


def mma_stub(kind):
    return {"s8s8": _mma.mma_s8s8, "u8s8": _mma.mma_u8s8}.get(kind) or _mma.mma_fp8(*kind.split("."))


def mma_operands(kind, rng=None):
    """(a bytes [16*32], b bytes [8*32], expected D [16, 8]) with NumPy's result."""
    rng = np.random.default_rng([ord(c) for c in kind]) if rng is None else rng
    if kind in ("s8s8", "u8s8"):
        a = rng.integers(0 if kind == "u8s8" else -128, 256 if kind == "u8s8" else 128, (16, 32))
        b = rng.integers(-128, 128, (8, 32))
        want = (a @ b.T).astype(np.int32)
        return a.astype(np.uint8 if kind == "u8s8" else np.int8).view(np.uint8).reshape(-1), \
            b.astype(np.int8).view(np.uint8).reshape(-1), want  # fmt: skip
    fa, fb = kind.split(".")
    a = (rng.standard_normal((16, 32)) * 4).astype(FP8[fa])
    b = (rng.standard_normal((8, 32)) * 4).astype(FP8[fb])
    want = (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.float32)
    return a.view(np.uint8).reshape(-1), b.view(np.uint8).reshape(-1), want


# mbarriers
MBAR_THREADS = 64


def make_mbarrier_probe():
    """A 64-thread kernel exercising the mbarrier stubs as the wgmma GEMM's ring does:
    each thread copies 16 bytes with cp.async and arrives on barrier F once they land
    (``cp_async_mbarrier_arrive``); after waiting for F's phase 0 every thread reads
    another thread's bytes. Barrier E then runs two phases of plain arrivals. Per thread,
    ``out`` gets the 16 bytes of thread 63 - t's chunk and the answers of try_wait at
    known points: F parity 1 (phase 1 not complete: 0), after E's two phases E parity 0
    (the current, incomplete phase: 0) and parity 1 (completed: 1)."""

    @cuda.jit
    def probe(src, out):
        sm = cuda.shared.array(1040, uint8)  # data [0, 1024), barrier F at 1024, E at 1032
        t = cuda.threadIdx.x
        if t == 0:
            _wg.mbarrier_init(sm, 1024, MBAR_THREADS)
            _wg.mbarrier_init(sm, 1032, MBAR_THREADS)
        cuda.syncthreads()
        _mma.cp_async16(sm, 16 * t, src, 16 * t, 16)
        _wg.cp_async_mbarrier_arrive(sm, 1024)
        while not _wg.mbarrier_try_wait(sm, 1024, 0):
            pass
        u = MBAR_THREADS - 1 - t
        for i in range(16):
            out[t, i] = sm[16 * u + i]
        out[t, 16] = 1 if _wg.mbarrier_try_wait(sm, 1024, 1) else 0
        for ph in range(2):
            _wg.mbarrier_arrive(sm, 1032)
            while not _wg.mbarrier_try_wait(sm, 1032, ph):
                pass
        out[t, 17] = 1 if _wg.mbarrier_try_wait(sm, 1032, 0) else 0
        out[t, 18] = 1 if _wg.mbarrier_try_wait(sm, 1032, 1) else 0

    return probe


def mbarrier_expected(src):
    """What ``make_mbarrier_probe`` must write for ``src`` (64 x 16 bytes)."""
    want = np.zeros((MBAR_THREADS, 19), np.int32)
    want[:, :16] = src.reshape(MBAR_THREADS, 16)[::-1]
    want[:, 18] = 1
    return want


@cuda.jit
def grid_max_kernel(vals, sync, out):
    """Block b writes the grid's max of ``vals`` (one value a block) to ``out[b]``, through
    ``grid_max`` on the ``sync`` workspace (nqdq.gpu.quantize.grid.SYNC_WORDS words)."""
    slot = cuda.shared.array(1, np.int32)
    out[cuda.blockIdx.x] = grid_max(vals[cuda.blockIdx.x], cuda.threadIdx.x, sync, slot)
