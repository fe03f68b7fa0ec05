"""benchmarks/peers.py --bound stripe-stream: its stream kernels move every unit of every item
once, in static and in ticket order (simulator: blocks of 64 threads, so small items).

The bound means something only if the stream reads and writes what an int8_column pass
would: each 16-byte unit of the input once, its 8-byte output where the codes of that unit
go. Here the output is checked against the XORs computed by NumPy, and the ticket kernel's
count against the items it must have taken (nitems + grid).
"""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import peers  # noqa: E402


@pytest.mark.parametrize("ui, nbuf, ticket, grid, order, wu", [
    (2, 1, 0, 2, 0, 8), (2, 2, 0, 3, 0, 8), (1, 3, 0, 2, 0, 8), (2, 2, 1, 3, 0, 8), (1, 3, 1, 2, 0, 8),
    (1, 1, 1, 5, 0, 8), (2, 2, 1, 3, 1, 8), (1, 2, 0, 2, 1, 8), (2, 2, 1, 3, 0, 16), (1, 3, 0, 2, 1, 4),
])  # fmt: skip
def test_stream_moves_every_unit_once(monkeypatch, ui, nbuf, ticket, grid, order, wu):
    monkeypatch.setattr(peers, "STREAM_NT", 64)  # blocks of 64 threads: 64 / wu rows at a time
    nt = peers.STREAM_NT
    k = peers.stream_kernel(ui, nbuf, 0, 1, ticket, order, wu).kernel
    R, C = 48, 256  # chunks of rows x 2-8 stripes: items in both directions of the grid
    chunks, upr, nitems = peers.stream_items(R, C, ui, wu)
    assert nitems * ui * nt == R * upr  # the items cover the input's units exactly
    x = np.random.default_rng(ui * 10 + nbuf).integers(0, 1 << 16, (R, C), dtype=np.uint16)
    out = np.zeros((R, C), np.uint8)
    counter = np.array([7], np.int32)  # a launch's tickets start at `base`
    args = (x.reshape(-1), nitems, chunks, upr, out.reshape(-1)) + ((counter, 7) if ticket else ())
    k[grid, nt, 0, nbuf * ui * nt * 16](*args)
    w = x.reshape(-1).view(np.uint32).reshape(-1, 4)
    want = np.stack([w[:, 0] ^ w[:, 1], w[:, 2] ^ w[:, 3]], axis=1).reshape(-1)
    np.testing.assert_array_equal(out.reshape(-1).view(np.uint32), want)
    if ticket:
        assert counter[0] - 7 == nitems + grid


def test_items_need_whole_items():  # blocks of 512 threads: 64 rows at a time of 128-byte pieces
    assert peers.stream_items(16384, 7168, 8) == (32, 896, 32 * 112)
    assert peers.stream_items(16384, 7168, 8, 16) == (64, 896, 64 * 56)
    assert peers.stream_items(16384, 7168, 8, 32) == (128, 896, 128 * 28)  # 512-byte pieces
    assert peers.stream_items(16384 + 64, 7168, 8) is None  # rows not a multiple of an item's 512
    assert peers.stream_items(16384, 7168 + 8, 8) is None  # 897 units: not whole 8-unit stripes


def test_default_variants_parse():
    for v in peers.STREAM_VARIANTS.split(","):
        parts = [int(p) for p in v.split(":")]
        assert 5 <= len(parts) <= 7 and parts[0] >= 1 and parts[1] >= 1, v
