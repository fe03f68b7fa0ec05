"""The shared-memory ring kernel of per-channel scales (``column_ring.column_ring``,
``PerChannel.RING``, selected by ``choices=``) in the simulator, bit for bit against the
NumPy reference: through the plan (P = 1: one block takes every stripe in turn, so the
ring's slots cycle), launched directly with P = 2 chunks a stripe (one block holds both),
and with the wait path taken on every item (``make_column_ring_kernel``'s ``force_wait``).
cp.async and ld.shared.v4 run as their twins here; the GPU tests
(tests/test_column_onepass_gpu.py, ``ring``) run the instructions with P > 1. The geometry
is checked by hand against the issue's shapes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nqdq.gpu.quantize.column_cluster as column_cluster
import nqdq.gpu.quantize.column_ring as column_ring
import nqdq.gpu.quantize.plan as kq
from nqdq.gpu.quantize.choices import KernelChoices, PerChannel
from nqdq.gpu.quantize.params import max_elem
from nqdq.gpu.runtime.launch import dynamic_smem
from nqdq.reference import quantize as ref
from nqdq.schemes import resolve_scheme

from helpers.data import column_data
from helpers.kernels import KINDS, check, launched


RING = KernelChoices(per_channel=PerChannel.RING)  # (chosen: the ring at P = 1 too, the simulator's only P)
TWO_PASS = ["column_amax", "finalize", "column_encode"]


# ----------------------------------------------------------------------------- geometry
_H100 = dict(RING_THREADS=128, RING_UNITS=8, RING_SLOTS=3, RING_LAG=1, RING_BLOCKS_PER_SM=4)  # the GPU defaults


@pytest.mark.parametrize(
    "rows, upr, vec, knobs, want",
    [
        # bf16 8192 x 8192 on 132 SMs, 128 threads, 8 units a thread: W = 16 (128 channels:
        # a thread each for the scales), chunks of 8 * 128 / 16 = 64 rows, P = 128 <= 256
        (8192, 1024, 8, {}, (128, 16, 8, 3, 1, 128, 64)),
        # bf16 16384 x 7168: P = 256 (at most RING_P_MAX, and 4 blocks x 132 SMs resident)
        (16384, 896, 8, {}, (128, 16, 8, 3, 1, 256, 56)),
        # 32768 rows: P = 512 at W = 16, 256 at W = 8
        (32768, 896, 8, {}, (128, 8, 8, 3, 1, 256, 112)),
        # f32: 4 channels a unit, W = 32 (128 channels), 32 rows a chunk
        (8192, 2048, 4, {}, (128, 32, 8, 3, 1, 256, 64)),
        # too tall for the narrowest stripe (W = 4: 256 rows a chunk, P = 1024 > 256)
        (262144, 128, 8, {}, None),
        # 256 threads, 2 blocks an SM: W = 32, P = 128 / 256
        (8192, 1024, 8, dict(RING_THREADS=256, RING_BLOCKS_PER_SM=2), (256, 32, 8, 3, 1, 128, 32)),
        (16384, 896, 8, dict(RING_THREADS=256, RING_BLOCKS_PER_SM=2), (256, 32, 8, 3, 1, 256, 28)),
        # 4 slots of 256 threads x 8 units do not fit twice in an SM
        (8192, 1024, 8, dict(RING_THREADS=256, RING_SLOTS=4, RING_BLOCKS_PER_SM=2), None),
        # 2^16 stripes x 256 chunks: 2^24 items, past divp's range
        (16384, 1 << 20, 8, {}, None),
        (16384 - 64, 1 << 20, 8, {}, (128, 16, 8, 3, 1, 255, 1 << 16)),
    ],
)
def test_ring_geometry(rows, upr, vec, knobs, want, monkeypatch):
    monkeypatch.setattr(column_ring, "SIMULATOR", False)  # the GPU's rules
    for k, v in {**_H100, **knobs}.items():
        monkeypatch.setattr(column_ring, k, v)
    assert column_ring.ring_geometry(rows, upr, 132, vec) == want


def test_divp_is_floor_division():
    """divp (the stripe of an item: a multiply by ceil(2^32 / P) and a shift) is a // P for
    every divisor 1 .. 256, over the small items, the top of its range and both sides of
    every multiple of P there."""
    divp = getattr(column_ring.divp, "py_func", column_ring.divp)
    top = column_ring.ITEMS_MAX - 1 - np.arange(4096, dtype=np.int64)
    for P in range(1, 257):
        k = np.arange(column_ring.ITEMS_MAX // P - 4096 // P - 1, column_ring.ITEMS_MAX // P + 1, dtype=np.int64) * P
        a = np.concatenate([np.arange(4096, dtype=np.int64), top, k - 1, k, k + 1])
        a = a[(a >= 0) & (a < column_ring.ITEMS_MAX)]
        assert (divp(a, column_ring.p_reciprocal(P)) == a // P).all(), P
    with pytest.raises(ValueError):
        column_ring.p_reciprocal(257)


def test_ring_smem_fits():
    """The defaults: 3 slots of 8 units x 128 threads, 48 KiB of ring + the static arrays +
    1 KiB reserved, four times within an SM's 228 KiB; a fourth slot does not fit."""
    per_block = column_ring.ring_smem(128, 8, 3) + column_ring.static_smem(128, 8) + column_ring.SMEM_RESERVED
    assert column_ring.ring_smem(128, 8, 3) == 48 * 1024 and 4 * per_block <= column_ring.SMEM_PER_SM
    assert (4 * (column_ring.ring_smem(128, 8, 4) + column_ring.static_smem(128, 8) + column_ring.SMEM_RESERVED)
            > column_ring.SMEM_PER_SM)


# ----------------------------------------------------------------------------- bit for bit
@pytest.mark.parametrize(
    "name, kw, shape, dtype",
    [
        ("int8_column", {}, (13, 256), ml_dtypes.bfloat16),  # 4 stripes of 8 units through one block
        ("int8_column", {}, (7, 100), np.float32),  # 25 units: the last stripe partial
        ("int8_column", {}, (16, 200), np.float16),
        ("e4m3", {"granularity": "column"}, (2, 5, 96), ml_dtypes.bfloat16),
        ("int4", {"granularity": "column"}, (9, 64), ml_dtypes.bfloat16),
    ],
)
def test_ring_exact(name, kw, shape, dtype):
    sch = resolve_scheme(name, **kw)
    x = column_data(shape, seed=shape[-1]).astype(dtype)
    assert launched(x.shape, dtype, sch, choices=RING) == ["column_ring"]
    plan = kq.get_plan(x.shape, KINDS[dtype], sch, choices=RING)
    ((k, grid, block, args),) = plan.launches
    # the simulator counts one SM, so one block takes every stripe; a GPU spreads them over its SMs
    assert (grid == 1) if kq.SIMULATOR else grid >= 1
    assert dynamic_smem(k) == column_ring.ring_smem(block, column_ring.RING_UNITS, column_ring.RING_SLOTS)
    check(x, sch, x_ref=x.astype(np.float32), choices=RING)


def test_ring_single_chunk_only_when_chosen(fresh_plans):
    """Automatically (on a device without clusters) the ring takes stripes of several chunks
    only: a stripe of one chunk takes the single-chunk kernel (no workspace, no wait); where
    the caller chooses the ring, the ring."""
    sch = resolve_scheme("int8_column")
    fresh_plans.setattr(column_cluster, "available", lambda: False)
    assert launched((13, 256), ml_dtypes.bfloat16, sch) == ["column_onepass"]
    assert launched((13, 256), ml_dtypes.bfloat16, sch, choices=RING) == ["column_ring"]


def test_ring_needs_cp_async(fresh_plans):
    """A device without cp.async (compute capability below 8.0; AMD, where target.device_has
    is never true) plans the two passes where the ring is chosen, with the same bits."""
    sch = resolve_scheme("int8_column")
    x = column_data((13, 256), seed=41).astype(ml_dtypes.bfloat16)
    fresh_plans.setattr(column_ring, "device_has", lambda cc: False)
    assert launched(x.shape, ml_dtypes.bfloat16, sch, choices=RING) == TWO_PASS
    check(x, sch, x_ref=x.astype(np.float32), choices=RING)


def _direct(x, sch, W, P, force_wait, D=3, L=1, U=1):
    """Launch column_ring once (one block of the simulator's threads) over a 2-D input with
    W-unit stripes of P chunks of U units a thread; returns (int8 codes, scales)."""
    rows, C = x.shape
    kind = KINDS[x.dtype.type]
    vec = 4 if x.dtype == np.float32 else 8
    upr = C // vec
    S = -(-upr // W)
    NT = column_ring.RING_THREADS
    assert -(-rows // (U * NT // W)) == P
    k = column_ring.make_column_ring_kernel(kind, kq.format_tuple(sch), max_elem(sch), NT, W, U, D, L, False,
                                            force_wait)
    xf = x.reshape(-1)
    xf = xf if x.dtype == np.float32 else xf.view(np.uint16)
    ws = np.zeros(C + S + 1, np.int32)
    scales = np.full(C, np.nan, np.float32)
    codes = np.full(rows * C, 0xA5, np.uint8)
    k[1, NT, 0, dynamic_smem(k)](xf, rows, upr, C, P, column_ring.p_reciprocal(P), S, ws, scales, codes)
    # one block took every ticket: D - 1 ahead, then one an iteration, the last one past the end
    assert ws[C + S] == S * P + D
    assert (ws[C : C + S] == P).all()  # every stripe's P items arrived, none twice
    return codes.view(np.int8).reshape(rows, C), scales


@pytest.mark.parametrize("force_wait", [False, True])
@pytest.mark.parametrize(
    "dtype, C, W, P, D, L",
    [
        (ml_dtypes.bfloat16, 128, 8, 2, 3, 1),  # 2 stripes x 2 chunks of 8 rows; lag 1
        (ml_dtypes.bfloat16, 136, 4, 3, 4, 2),  # 5 stripes (the last partial) x 3 chunks; 4 slots, lag 2
        (np.float32, 96, 8, 2, 3, 2),  # f32; lag 2: arrival right after the loads (wait_group 0)
    ],
)
def test_ring_direct_chunks(dtype, C, W, P, D, L, force_wait):
    """P > 1 in one block: a stripe completes by the block's own arrivals, L items ahead of
    its encode (or, with force_wait, by the wait path's arrival of every item held)."""
    sch = resolve_scheme("int8_column")
    NT = column_ring.RING_THREADS
    rows = P * (NT // W) - 3  # the last chunk short
    x = column_data((rows, C), seed=C + P).astype(dtype)
    codes, scales = _direct(x, sch, W, P, force_wait, D=D, L=L)
    want = ref.quantize(x.astype(np.float32), sch)
    assert (scales.view(np.uint32) == want.scales.view(np.uint32)).all()
    assert (codes == want.codes).all()
