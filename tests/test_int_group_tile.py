"""The integer last-axis group encode (one reciprocal per chunk, bfloat16 pair amax, units
interleaved over a group's lanes), the tile kernel's and the asymmetric rows kernel's
reciprocal once per thread, and the asymmetric / centred stat groups, against the reference
bit for bit (codes packed and unpacked, scales, dequantized values). Small cases for the
simulator; with NQDQ_TEST_GPU=1 the same cases run compiled (tests/test_int_group_tile_gpu.py
adds real sizes)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nqdq.gpu.quantize.plan as kq
from nqdq.gpu.quantize import asym_units
from nqdq.gpu.quantize import lastaxis
from nqdq.gpu.quantize import tiles
from nqdq.schemes import resolve_scheme

from helpers.data import edge_data
from helpers.kernels import check, launched

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN/inf arithmetic in the simulator


def _clear():
    lastaxis.make_lastaxis_group_kernel.cache_clear()
    lastaxis.make_lastaxis_stat_group_kernel.cache_clear()
    lastaxis.make_lastaxis_asym_row_kernel.cache_clear()
    tiles.make_tile_kernel.cache_clear()
    kq._PLANS.clear()


@pytest.fixture
def fresh():
    """Plans and kernels built from scratch (CENTRED_UNITS / DEEP_UNITS set by a test are read
    when a plan is built), and dropped after the test."""
    _clear()
    yield
    _clear()


@pytest.mark.parametrize(
    "name, kw, shape, dtype",
    [
        ("int4_group", {}, (6, 256), ml_dtypes.bfloat16),  # L = 16, K = 4: 4 lanes a group, interleaved
        ("int4_group", {}, (4, 256), np.float16),
        ("int4_group", {}, (3, 256), np.float32),  # L = 32 units of 4
        ("int4", {"granularity": "group", "group_size": 32}, (4, 96), ml_dtypes.bfloat16),  # L = 4 = K: one lane
        ("int4", {"granularity": "group", "group_size": 16}, (4, 64), ml_dtypes.bfloat16),  # L = K = 2
        ("int8", {"granularity": "group", "group_size": 64}, (4, 128), ml_dtypes.bfloat16),  # 8-bit codes, LL = 2
    ],
)
def test_int_groups_exact(fresh, name, kw, shape, dtype):
    sch = resolve_scheme(name, **kw)
    x = edge_data(shape, seed=shape[0] + shape[1]).astype(dtype)
    x.reshape(-1)[:32] = 0.0  # an all-zero group (scale 1, recip_guarded's range)
    x.reshape(-1)[32:64] *= np.asarray(1e-25, dtype)  # a tiny one: its scale is below the reciprocal's range
    assert "lastaxis_groups" in launched(shape, dtype, sch)
    check(x, sch, x_ref=x.astype(np.float32))


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32])
def test_tile_recip_once_exact(fresh, dtype):
    sch = resolve_scheme("fp8_128x128", block_shape=(8, 64))
    x = edge_data((17, 128), seed=9).astype(dtype)  # a partial row tile
    x[:8, :64] = 0.0
    x[8:16, 64:] *= np.asarray(1e-30, dtype)
    assert "tile_blocks" in launched(x.shape, dtype, sch)
    check(x, sch, x_ref=x.astype(np.float32))


def test_int_group_interleave_geometry(fresh):
    """int4_group's chunks of 4 units are interleaved over a group's 4 lanes (lane l: units l,
    l + 4, ...: ST = 4), as fp8's are."""
    plan = kq.get_plan((8, 1024), 1, resolve_scheme("int4_group"))
    k = [k for k, _, _, _ in plan.launches if k.py_func.__name__ == "lastaxis_groups"][0]
    assert k.py_func.__globals__["ST"] == 4


@pytest.mark.parametrize(
    "name, shape, dtype",
    [("int8_asym", (5, 512), ml_dtypes.bfloat16), ("int4_asym", (3, 256), np.float32), ("int8_asym", (4, 200), np.float16)],
)
def test_asym_rows_recip_once_exact(fresh, name, shape, dtype):
    """The asymmetric rows kernel's reciprocal and float bounds once per thread (int4_asym:
    per-row scales here, granularity row)."""
    sch = resolve_scheme(name) if name == "int8_asym" else resolve_scheme("int4", granularity="row", symmetric=False)
    x = edge_data(shape, seed=shape[1]).astype(dtype)
    x[1] = 0.0  # an all-zero row
    x[2] *= np.asarray(1e-30, dtype)  # a row whose scale is below the reciprocal's range
    assert "lastaxis_asym_rows" in launched(shape, dtype, sch)
    check(x, sch, x_ref=x.astype(np.float32))


# ----------------------------------------------------------------------------- stat groups
# lastaxis_stat_groups (int4_asym, int8_centred, 1xG asymmetric / centred groups): units
# interleaved over a group's lanes, reciprocal once per chunk, 16-bit asymmetric keys in pairs,
# the centred sum's unit levels in the thread, asymmetric codes clipped as integers (the
# asymmetric rows too).
def _stat_edges(x, G):
    """Special groups at the start of the flat input (G elements each): all zero, tiny (scale
    below recip_guarded's range: the per-element path), constant, one NaN, +inf only, a range
    that overflows (the halves' scale formula), all negative, a wide spread."""
    f = x.reshape(-1)
    dt = x.dtype
    specials = [
        np.zeros(G),
        np.linspace(-1, 1, G) * 1e-30,
        np.full(G, 2.5),
        np.where(np.arange(G) == 3, np.nan, np.linspace(-2, 3, G)),
        np.where(np.arange(G) == 5, np.inf, 1.0),
        np.where(np.arange(G) == G - 1, -np.nan, np.linspace(-1, 2, G)),  # a NaN with its sign bit set
        np.where(np.arange(G) == 2, -np.inf, np.where(np.arange(G) == 9, np.inf, 0.5)),
        np.where(np.arange(G) % 2 == 0, 3.0e38, -3.0e38),
        -np.linspace(1, 7, G),
        np.linspace(-5, 5, G) * 10.0 ** (np.arange(G) % 9 - 4),
    ]
    for i, v in enumerate(specials):
        if (i + 1) * G <= f.size:
            f[i * G:(i + 1) * G] = np.asarray(v, np.float32).astype(dt)
    return x


STAT_CASES = [
    # name, kwargs, shape, dtype, CENTRED_UNITS (L, K, LL in the comment: bf16 / f16 VEC = 8, f32 VEC = 4)
    ("int4_asym", {}, (6, 256), ml_dtypes.bfloat16, 2),  # L = 16, K = 4, LL = 4
    ("int4_asym", {}, (5, 384), np.float16, 2),  # 60 chunks: a partial block
    ("int4_asym", {}, (3, 256), np.float32, 2),  # L = 32, K = 4, LL = 8
    ("int8", {"granularity": "group", "group_size": 32, "symmetric": False}, (4, 96), ml_dtypes.bfloat16, 2),  # LL = 1
    ("int4", {"granularity": "group", "group_size": 16, "symmetric": False}, (3, 64), ml_dtypes.bfloat16, 2),  # L = K = 2
    ("int8_centred", {}, (3, 256), ml_dtypes.bfloat16, 2),  # L = 16, K = 2, LL = 8
    ("int8_centred", {}, (5, 384), ml_dtypes.bfloat16, 4),  # K = 4, LL = 4; a partial block
    ("int8_centred", {}, (2, 256), np.float32, 2),  # L = 32, K = 2, LL = 16
    ("int8_centred", {}, (3, 128), np.float16, 4),  # K = 4, LL = 4
    ("int8_centred", {"group_size": 64}, (4, 128), ml_dtypes.bfloat16, 4),  # L = 8, K = 4, LL = 2
    ("int8_centred", {"group_size": 16}, (3, 64), ml_dtypes.bfloat16, 2),  # L = 2 = K: one lane
]


@pytest.mark.parametrize("name, kw, shape, dtype, cu", STAT_CASES)
def test_stat_groups_exact(fresh, monkeypatch, name, kw, shape, dtype, cu):
    monkeypatch.setattr(kq, "CENTRED_UNITS", cu)
    sch = resolve_scheme(name, **kw)
    x = _stat_edges(edge_data(shape, seed=shape[0] * 7 + shape[1]).astype(dtype), sch.group_size)
    assert "lastaxis_stat_groups" in launched(shape, dtype, sch)
    check(x, sch, x_ref=x.astype(np.float32))


@pytest.mark.parametrize("name, cu", [("int4_asym", 2), ("int8_centred", 2), ("int8_centred", 4)])
def test_stat_groups_deep_exact(fresh, monkeypatch, name, cu):
    """Deep threads (U = GROUP_UNITS / K chunks per thread; DEEP_UNITS lowered so that a small
    input takes them) with a partial last block."""
    monkeypatch.setattr(kq, "CENTRED_UNITS", cu)
    monkeypatch.setattr(kq, "DEEP_UNITS", 64)
    sch = resolve_scheme(name)
    shape = (9, 512)
    x = _stat_edges(edge_data(shape, seed=3).astype(ml_dtypes.bfloat16), 128)
    plan = kq.get_plan(shape, 1, sch)
    k = [k for k, _, _, _ in plan.launches if k.py_func.__name__ == "lastaxis_stat_groups"][0]
    assert k.py_func.__globals__["U"] == 4 // min(16, 4 if name == "int4_asym" else cu)
    check(x, sch, x_ref=x.astype(np.float32))


@pytest.mark.parametrize("shape, dtype", [((4, 512), ml_dtypes.bfloat16), ((4, 200), np.float16), ((4, 256), np.float32)])
def test_asym_rows_int_clip_exact(fresh, shape, dtype):
    """The integer clip of the asymmetric rows kernel (int8_asym), rows with special values."""
    sch = resolve_scheme("int8_asym")
    x = edge_data(shape, seed=shape[1]).astype(dtype)
    x[1] = 0.0
    x[2] *= np.asarray(1e-30, dtype)  # scale below the reciprocal's range
    x[3, ::2] = np.asarray(3.0e38, np.float32).astype(dtype)  # range overflows: the halves' scale
    x[3, 1::2] = np.asarray(-3.0e38, np.float32).astype(dtype)
    assert "lastaxis_asym_rows" in launched(shape, dtype, sch)
    check(x, sch, x_ref=x.astype(np.float32))


def test_stat_interleave_geometry(fresh):
    """int4_asym's chunks of 4 units are interleaved over a group's 4 lanes (ST = 4) and a
    chunk's first unit is (c // LL) * L + c % LL."""
    plan = kq.get_plan((8, 1024), 1, resolve_scheme("int4_asym"))
    k = [k for k, _, _, _ in plan.launches if k.py_func.__name__ == "lastaxis_stat_groups"][0]
    g = k.py_func.__globals__
    assert g["ST"] == 4
    assert [g["unit_of"].py_func(c) for c in (0, 1, 3, 4, 5)] == [0, 1, 3, 16, 17]


def test_word_ukeys_order_every_16bit_value(monkeypatch):
    """word_ukeys orders every bfloat16 and float16 value (both halves of a word) as the value
    orders (NaN with sign 0 above +inf, with sign 1 below -inf; -0 just below +0), and
    ukey_bits inverts it to the element's float32 bits."""
    from nqdq.gpu.device import codec as _codec

    # the bit casts by NumPy: the device functions' local-array casts (float16 decode) need a kernel
    monkeypatch.setattr(_codec, "f32_bits", lambda f: np.int64(np.float32(f).view(np.uint32)))
    monkeypatch.setattr(_codec, "bits_f32", lambda u: np.uint32(u).view(np.float32))
    h = np.arange(1 << 16, dtype=np.uint32)
    for kind, dt in ((1, ml_dtypes.bfloat16), (2, np.float16)):
        vals = h.astype(np.uint16).view(dt).astype(np.float64)
        nan = np.isnan(vals)
        neg = (h >> 15) == 1
        # an order of the values: NaN- < -inf .. -0 < +0 .. +inf < NaN+ (NaNs among themselves by their bits)
        rank_key = np.where(nan, np.where(neg, -np.inf, np.inf), vals)
        for hi in (0, 1):
            words = (h << 16) | 0x1234 if hi else h | 0xABCD0000
            keys = np.array([asym_units.word_ukeys.py_func(np.uint32(w)) for w in words], np.uint64)
            k = (keys >> 16) & 0xFFFF if hi else keys & 0xFFFF
            assert len(np.unique(k)) == 1 << 16  # a bijection
            order = np.argsort(k, kind="stable")
            ranked = rank_key[order]
            assert np.all(np.diff(ranked[~nan[order]]) >= 0)
            ks = k[order]
            nonnan = ~nan[order]
            assert np.all(ks[nan[order] & neg[order]] < ks[nonnan].min())
            assert np.all(ks[nan[order] & ~neg[order]] > ks[nonnan].max())
            zeros = order[np.isin(order, [0, 0x8000])]
            assert list(zeros) == [0x8000, 0]  # -0 below +0
            back = np.array([asym_units.ukey_bits.py_func(np.uint32(v), kind) for v in k], np.uint64)
            want = h.astype(np.uint16).view(dt).astype(np.float32).view(np.uint32)
            assert np.array_equal(back[~nan], want[~nan])
            if kind == 1:  # bfloat16: the bits themselves, NaN payloads included
                assert np.array_equal(back, h << 16)
