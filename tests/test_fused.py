"""Fused ops (nqdq.fused): the kernels (CUDA simulator in CI) bit for bit against the NumPy
spec (nqdq.reference.fused), the spec against independent evaluations (float64 norm, NumPy /
ml_dtypes rounding of the residual, a sort by explicit tuples), and the argument errors.
Shapes are small and odd (hidden 33, 130, 200, 1100, 1104; tokens 1, 3, 5) so the simulator stays
fast; tests/test_fused_gpu.py runs the real hidden sizes on a GPU.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from helpers.data import topk_ids
from helpers.encoders import ABSMAX_EDGES, e2m1_codes, e2m1_y_case, e2m1_y_probes
from helpers.ptx import compile_rows

import nqdq
from nqdq import fused
from nqdq.reference import fused as R
from nqdq.reference import quantize as RQ
from nqdq.reference.packing import pack_codes
from nqdq.schemes import resolve_scheme

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"bfloat16": BF16, "float16": np.dtype(np.float16), "float32": np.dtype(np.float32)}
SCHEMES = ["fp8_row", "fp8_tensor", "fp8_1x128", "mxfp4"]
STATIC = 0.0173


def bits(a):
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def assert_q_equal(qa, qb):
    assert qa.shape == qb.shape and qa.dtype == qb.dtype and qa.scheme == qb.scheme
    assert np.asarray(qa.codes).shape == np.asarray(qb.codes).shape
    np.testing.assert_array_equal(bits(qa.codes), bits(qb.codes))
    assert np.asarray(qa.scales).shape == np.asarray(qb.scales).shape
    np.testing.assert_array_equal(bits(qa.scales), bits(qb.scales))


def assert_moe_spec(x, ids, E, got):
    """``got`` = moe_sort_quantize's (q, perm, offsets) equal the spec's (reference/fused.moe_sort,
    then nqdq.quantize of the sorted rows) bit for bit; returns the spec's perm."""
    q, perm, off = got
    perm_ref, off_ref = R.moe_sort(ids, E)
    np.testing.assert_array_equal(perm, perm_ref)
    np.testing.assert_array_equal(off, off_ref)
    assert_q_equal(q, nqdq.quantize(x[perm_ref], "mxfp4"))
    return perm_ref


def rows(rng, t, n, dtype, spread=3.0):
    """Random rows with per-row magnitudes 2^U(-spread, spread) (never all zeros)."""
    x = rng.standard_normal((t, n)) * np.exp2(rng.uniform(-spread, spread, (t, 1)))
    return x.astype(DTYPES[dtype])


def scale_for(scheme):
    return STATIC if scheme == "fp8_tensor" else None


@pytest.fixture(autouse=True)
def no_hot_calls_across_tests():
    """Each test starts without remembered calls (fused._ROWS_FAST): tests patch the spec's
    geometry (R.MAX_UNITS_PER_THREAD), which the hot path's key does not hold."""
    fused._ROWS_FAST.clear()
    yield
    fused._ROWS_FAST.clear()


# ----------------------------------------------------------------------------- kernel == spec
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("with_res", [False, True])
def test_rmsnorm_quantize_kernel_matches_reference(dtype, scheme, with_res):
    rng = np.random.default_rng(hash((dtype, scheme, with_res)) % 2**32)
    n = 200 if dtype != "float16" else 130
    x = rows(rng, 3, n, dtype)
    w = rng.standard_normal(n).astype(DTYPES[dtype])
    res = rows(rng, 3, n, dtype) if with_res else None
    kw = dict(residual=res, scale=scale_for(scheme))
    out_c = fused.rmsnorm_quantize(x, w, scheme, **kw)
    out_g = fused.rmsnorm_quantize(x, w, scheme, device="cuda", **kw)
    if with_res:
        (qc, rc), (qg, rg) = out_c, out_g
        assert rc.dtype == rg.dtype == DTYPES[dtype]
        np.testing.assert_array_equal(bits(rc), bits(rg))
    else:
        qc, qg = out_c, out_g
    assert_q_equal(qc, qg)


@pytest.mark.parametrize("n, t, upt", [(33, 3, 8), (1104, 1, 8), (1100, 1, 1)])
def test_rmsnorm_quantize_layouts(n, t, upt, monkeypatch):
    """n = 33: one warp, one partial unit (the element-by-element path); 1104: 5 units per
    lane (the vector path); 1100 with MAX_UNITS_PER_THREAD = 1 (the spec's layout, so the
    reference follows): 5 warps added in order, a partial unit. Weights float32, residual."""
    monkeypatch.setattr(R, "MAX_UNITS_PER_THREAD", upt)
    rng = np.random.default_rng(n)
    x = rows(rng, t, n, "bfloat16")
    w = rng.standard_normal(n).astype(np.float32)  # weights of another dtype than x
    res = rows(rng, t, n, "bfloat16")
    for scheme in ("fp8_row", "mxfp4") if n > 100 else SCHEMES:
        qc, rc = fused.rmsnorm_quantize(x, w, scheme, residual=res, scale=scale_for(scheme))
        qg, rg = fused.rmsnorm_quantize(x, w, scheme, residual=res, scale=scale_for(scheme), device="cuda")
        assert_q_equal(qc, qg)
        np.testing.assert_array_equal(bits(rc), bits(rg))


def test_element_path_equals_vector_path(monkeypatch):
    """An aligned row (n % 8 == 0) read and written element by element (as a misaligned
    device array would be) gives the vector path's bits, for every output mode."""
    import nqdq.gpu.fused.plan as kf

    rng = np.random.default_rng(21)
    x = rows(rng, 2, 200, "float32")
    w = rng.standard_normal(200).astype(np.float32)
    res = rows(rng, 2, 200, "float32")
    want = {s: fused.rmsnorm_quantize(x, w, s, residual=res, scale=scale_for(s), device="cuda") for s in SCHEMES}
    y = fused.rmsnorm(x, w, device="cuda")
    monkeypatch.setattr(kf, "device_address", lambda a: 8)  # not 16-byte aligned: the element path
    for s in SCHEMES:
        (qg, rg), (qw, rw) = fused.rmsnorm_quantize(x, w, s, residual=res, scale=scale_for(s), device="cuda"), want[s]
        assert_q_equal(qg, qw)
        np.testing.assert_array_equal(bits(rg), bits(rw))
    np.testing.assert_array_equal(bits(fused.rmsnorm(x, w, device="cuda")), bits(y))


def test_row_sum_order_is_the_documented_one(monkeypatch):
    """reference/fused.row_sum64 against the order written out element by element (module
    docstring, steps 1-4) in plain Python floats (IEEE float64, one rounding per addition),
    bit for bit, for a 1-warp x 3-unit and a 3-warp x 1-unit layout, 64 rows of float32 values
    within 2^-4..2^4 (enough of their float64 sums round that swapping any step's order
    changes some row's S), and row_sum_sq's pair (hi = fl32(S), lo = fl32(S - hi))."""
    rng = np.random.default_rng(8)
    for upt, n in ((8, 700), (1, 700)):
        monkeypatch.setattr(R, "MAX_UNITS_PER_THREAD", upt)
        nw, u = R.row_geometry(n)
        assert (nw, u) == ((1, 3) if upt == 8 else (3, 1))
        hs = (rng.uniform(1, 2, (64, n)) * np.exp2(rng.integers(-4, 4, (64, n)))).astype(np.float32)
        got = R.row_sum64(hs)
        hi, lo = R.row_sum_sq(hs)
        for r, h in enumerate(hs):
            sq = [float(v) * float(v) for v in h] + [0.0] * (8 * 32 * nw * u - n)  # exact in float64

            def unit(t, j):
                acc = sq[8 * (t + 32 * nw * j)]
                for i in range(1, 8):
                    acc = acc + sq[8 * (t + 32 * nw * j) + i]
                return acc

            def thread(t):
                acc = unit(t, 0)
                for j in range(1, u):
                    acc = acc + unit(t, j)
                return acc

            def warp(wi):
                v = [thread(32 * wi + lane) for lane in range(32)]
                for k in (16, 8, 4, 2, 1):
                    v = [v[i] + v[i + k] for i in range(k)]
                return v[0]

            acc = warp(0)
            for wi in range(1, nw):
                acc = acc + warp(wi)
            assert got[r, 0] == acc, r  # the float64 sum itself, bit for bit
            want_hi = np.float32(acc)
            assert bits(hi[r, 0]) == bits(want_hi) and bits(lo[r, 0]) == bits(np.float32(acc - float(want_hi)))
            assert abs(float(hi[r, 0]) + float(lo[r, 0]) - math.fsum(sq)) <= 2.0**-40 * acc


@pytest.mark.parametrize("dtype, wdtype", [("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", "bfloat16"),
                                           ("bfloat16", "float16")])
def test_rmsnorm_kernel_matches_reference(dtype, wdtype):
    """The normalized float32 values themselves, every path of reference/fused.normalize."""
    rng = np.random.default_rng(7)
    x = rows(rng, 2, 130, dtype)
    w = rng.standard_normal(130).astype(DTYPES[wdtype])
    np.testing.assert_array_equal(bits(fused.rmsnorm(x, w)), bits(fused.rmsnorm(x, w, device="cuda")))


def test_nonfinite_rows_match():
    """A NaN or inf in a row makes that row's values NaN (canonical 0x7FC00000) or 0 in the
    same way in both; other rows are unaffected."""
    rng = np.random.default_rng(3)
    x = rows(rng, 4, 130, "float32")
    x[1, 7] = np.nan
    x[2, 3] = np.inf
    x[3, :] = 0.0  # an all-zero row: r = 1/sqrt(eps), every value 0
    w = rng.standard_normal(130).astype(np.float32)
    for scheme in ("fp8_row", "mxfp4"):
        assert_q_equal(fused.rmsnorm_quantize(x, w, scheme), fused.rmsnorm_quantize(x, w, scheme, device="cuda"))
    y = fused.rmsnorm(x, w)
    assert np.isnan(y[1]).all() and np.isfinite(y[0]).all() and (y[3] == 0).all()


def test_overflowing_sums_of_squares_match():
    """Rows whose squares, or only their sums, overflow float32 (the float64 sum does not: its
    float32 high part is inf, the low part 0 by the spec; the row NaN, as before), bfloat16 and
    float32, kernel against spec bit for bit."""
    rng = np.random.default_rng(31)
    for dtype in ("bfloat16", "float32"):
        x = rows(rng, 4, 200, dtype).astype(np.float32)
        x[0, 9] = 3e19  # its square overflows
        x[1, :] = 1.5e19  # every square finite (2.25e38), every sum of two overflows
        x[2, :8] = 1.8e19  # one unit: its tree overflows at the top
        x[3, 100] = 1.3e19  # one large finite square among ordinary ones
        x = x.astype(DTYPES[dtype])
        w = rng.standard_normal(200).astype(DTYPES[dtype])
        np.testing.assert_array_equal(bits(fused.rmsnorm(x, w)), bits(fused.rmsnorm(x, w, device="cuda")))
        for scheme in ("fp8_row", "mxfp4"):
            assert_q_equal(fused.rmsnorm_quantize(x, w, scheme), fused.rmsnorm_quantize(x, w, scheme, device="cuda"))


# ----------------------------------------------------------------------------- spec vs independent
def ulps_from_float64(y, x, w, eps):
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    y64 = x64 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + np.float64(np.float32(eps))) * w64
    ulp = np.spacing(np.abs(y64).astype(np.float32)).astype(np.float64)
    return np.abs(y.astype(np.float64) - y64) / ulp


@pytest.mark.parametrize("n", [7168, 5120, 2880, 4097, 33, 130, 200])
@pytest.mark.parametrize("dtype, wdtype", [("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", "float32"),
                                           ("bfloat16", "float16")])
def test_reference_norm_within_one_ulp_of_float64(n, dtype, wdtype):
    """The issue's accuracy bound on the spec itself (the kernel equals it bit for bit):
    |y - y_float64| <= 1 ulp (float32) on random rows of wide dynamic range."""
    rng = np.random.default_rng(n)
    x = rows(rng, 16, n, dtype, spread=8).astype(np.float32)
    w = rng.standard_normal(n).astype(DTYPES[wdtype]).astype(np.float32)
    y = R.rmsnorm(x, w, 1e-6, dtype, wdtype)
    assert ulps_from_float64(y, x, w, 1e-6).max() <= 1.0


def test_reference_norm_rows_in_chunks(monkeypatch):
    """R.rmsnorm takes whole rows about codec.CHUNK elements at a time: with a chunk of 2 rows
    (and a remainder of 1) every row equals that row normalized alone, non-finite and
    3-D inputs included, and the 1-ulp bound holds."""
    rng = np.random.default_rng(3)
    n = 200
    x = rows(rng, 15, n, "bfloat16", spread=8).astype(np.float32)
    x[4, 7] = np.inf
    x[9, 0] = np.nan
    x[11] = 0.0
    w = rng.standard_normal(n).astype(BF16).astype(np.float32)
    alone = np.stack([R.rmsnorm(x[i : i + 1], w, 1e-6, "bfloat16", "bfloat16")[0] for i in range(15)])
    from nqdq.reference import codec

    monkeypatch.setattr(codec, "CHUNK", 2 * n)
    y = R.rmsnorm(x, w, 1e-6, "bfloat16", "bfloat16")
    np.testing.assert_array_equal(y.view(np.uint32), alone.view(np.uint32))
    y3 = R.rmsnorm(x.reshape(3, 5, n), w, 1e-6, "bfloat16", "bfloat16")
    np.testing.assert_array_equal(y3.reshape(15, n).view(np.uint32), alone.view(np.uint32))
    fine = np.isfinite(x).all(axis=1) & (np.abs(x).sum(axis=1) > 0)
    assert ulps_from_float64(y[fine], x[fine], w, 1e-6).max() <= 1.0


def test_reference_is_the_unfused_composition():
    """rmsnorm_quantize == nqdq.quantize(rmsnorm(...)) for every scheme (the spec's definition)."""
    rng = np.random.default_rng(11)
    x = rows(rng, 3, 200, "bfloat16")
    w = rng.standard_normal(200).astype(BF16)
    y = fused.rmsnorm(x, w)
    for scheme in SCHEMES:
        q = fused.rmsnorm_quantize(x, w, scheme, scale=scale_for(scheme))
        q_ref = nqdq.quantize(y, scheme, scale=scale_for(scheme))
        np.testing.assert_array_equal(bits(q.codes), bits(q_ref.codes))
        np.testing.assert_array_equal(bits(q.scales), bits(q_ref.scales))
        assert q.dtype == "bfloat16" and q.scheme == q_ref.scheme
        # decodes, saves and loads like any QuantizedTensor
        np.testing.assert_array_equal(bits(nqdq.dequantize(q)), bits(nqdq.dequantize(q_ref)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_residual_rounding_matches_numpy(dtype):
    """The new residual is fl32(x + r) rounded to the dtype by NumPy / ml_dtypes; the kernel's
    own float16/bfloat16 rounding must agree on sums across the whole exponent range
    (subnormals, ties, overflow to inf)."""
    rng = np.random.default_rng(5)
    dt = DTYPES[dtype]
    n = 200
    top = 15 if dtype == "float16" else 100
    mag = np.exp2(rng.integers(-top - 10, top + 2, (2, n))) * rng.uniform(1, 2, (2, n))
    x = (mag[0] * rng.choice([-1, 1], n)).astype(np.float32).astype(dt)[None]
    r = (mag[1] * rng.choice([-1, 1], n)).astype(np.float32).astype(dt)[None]
    x[0, :4] = [65504, 65504, 2.0**-24, -(2.0**-24)] if dtype == "float16" else x[0, :4]
    r[0, :4] = [16, 8, 2.0**-24, 2.0**-24] if dtype == "float16" else r[0, :4]
    expect = (x.astype(np.float32) + r.astype(np.float32)).astype(dt)
    w = np.ones(n, dt)
    _, rc = fused.rmsnorm_quantize(x, w, "fp8_row", residual=r)
    _, rg = fused.rmsnorm_quantize(x, w, "fp8_row", residual=r, device="cuda")
    np.testing.assert_array_equal(bits(rc), bits(expect))
    np.testing.assert_array_equal(bits(rg), bits(expect))


# ----------------------------------------------------------------------------- flatten
@pytest.mark.parametrize("scheme", ["fp8_1x128", "mxfp4"])
def test_flatten_quantize(scheme):
    rng = np.random.default_rng(2)
    x = rows(rng, 3 * 5, 36, "bfloat16").reshape(3, 5, 36)  # H*D = 180: partial 1x128 groups
    q_ref = nqdq.quantize(x.reshape(3, 180), scheme)
    assert_q_equal(fused.flatten_quantize(x, scheme), q_ref)
    assert_q_equal(fused.flatten_quantize(x, scheme, device="cuda"), q_ref)
    # a transposed view of a [H, B, D] array is read in place (strided kernel)
    base = np.ascontiguousarray(x.transpose(1, 0, 2))
    view = base.transpose(1, 0, 2)
    assert not view.flags.c_contiguous
    assert_q_equal(fused.flatten_quantize(view, scheme, device="cuda"), q_ref)


# ----------------------------------------------------------------------------- MoE sort
def sorted_pairs(ids):
    """The spec's order, written independently: sort (expert, token, slot) tuples."""
    t, k = ids.shape
    return sorted((int(ids[i, j]), i, j) for i in range(t) for j in range(k))


@pytest.mark.parametrize("k, E", [(1, 3), (2, 8), (3, 16)])
def test_moe_sort_quantize(k, E):
    rng = np.random.default_rng(k)
    T, H = 5, 130
    x = rows(rng, T, H, "bfloat16")
    ids = topk_ids(rng, T, E, k)
    ids[ids == E - 1] = 0  # expert E-1 is empty
    q_c, perm_c, off_c = fused.moe_sort_quantize(x, ids, E, "mxfp4")
    q_g, perm_g, off_g = fused.moe_sort_quantize(x, ids, E, "mxfp4", device="cuda")
    pairs = sorted_pairs(ids)
    np.testing.assert_array_equal(perm_c, [p[1] for p in pairs])
    np.testing.assert_array_equal(perm_g, perm_c)
    counts = np.bincount(ids.reshape(-1), minlength=E)
    np.testing.assert_array_equal(off_c, np.concatenate([[0], np.cumsum(counts)]))
    np.testing.assert_array_equal(off_g, off_c)
    assert off_c[E] - off_c[E - 1] == 0
    assert_q_equal(q_c, q_g)
    assert_q_equal(q_c, nqdq.quantize(x[perm_c], "mxfp4"))


def test_repeated_calls_build_no_new_kernel():
    """A kernel is built (and on a GPU compiled: ~10 s of NVVM) once per configuration: a
    second identical call finds every fused row kernel in the cache (a decorator that
    slipped off fused_row_kernel once made every MoE call compile anew)."""
    from nqdq.gpu.fused import rows as _fused_rows

    rng = np.random.default_rng(14)
    x = rows(rng, 2, 64, "bfloat16")
    w = rng.standard_normal(64).astype(BF16)
    ids = np.array([[0, 1], [1, 0]])
    calls = [lambda: fused.rmsnorm_quantize(x, w, "mxfp4", device="cuda"),
             lambda: fused.moe_sort_quantize(x, ids, 2, "mxfp4", device="cuda")]
    for call in calls:
        call()
    fused._ROWS_FAST.clear()  # (so the RMSNorm call goes the general way again, not the hot path)
    before = _fused_rows.fused_row_kernel.cache_info()
    for call in calls:
        call()
    after = _fused_rows.fused_row_kernel.cache_info()
    assert after.misses == before.misses and after.hits == before.hits + len(calls)


@pytest.mark.parametrize("stage, rank, wide", [(1, 0, False), (2, 0, False), (1, 1, False), (2, 1, True),
                                              (2, 2, True)])
def test_moe_sort_quantize_scatter_rows(stage, rank, wide, monkeypatch):
    """bfloat16 rows with aligned units into mxfp4 by the staged OP_SCATTER (each token read and
    encoded once, its codes and scales stored to its k sorted rows): the spec's bits. Hidden
    1000: 4 units a lane (MOE_UNITS), the last one and the last group partial; a group with inf
    and one with NaN (the element encoder, once per stored row); k = 3 of 4 experts, one empty.
    The stage over a grid of 2 blocks (tokens b, b + 2, b + 4): rounds of 1 staged token a
    block (three rounds) or 2 (token 2's inf group in block 0's first round, token 4's NaN in
    its second), each round's stores with the next round's loads (block 0's last round of 2 has
    one token). At hidden 1000 the strided staged form (not whole quads of units); ``wide``: at
    1024 and 992 too, rows of whole quads, each lane's 4 units contiguous (its own group), its
    words by 16-byte stores, the last lane wholly past the row at 992. rank 0: moe_sort's sort;
    rank 1 (MOE_RANK_MIN_PAIRS 0): the sort by moe_rank_kernel, each pair's row found by the
    rows kernel, which also stores perm; rank 2 (the local path: no sort): 3 blocks of 2 tokens
    (the last of 1: tokens 0-1, 2-3, 4), each counting every pair's bucket and finding its own
    pairs' rows, perm and (block 0) the offsets."""
    from nqdq.gpu.fused import kernels as fused_kernels
    from nqdq.gpu.fused import moe as KM
    from nqdq.gpu.fused import plan as KF

    ops, built_lanes = [], []
    build = KF.fused_row_kernel

    def spy(op, *a, **kw):
        ops.append(op)
        if op == fused_kernels.OP_SCATTER:  # (op, out, kind, wkind, NW, U, ...): the layout built
            assert a[3:5] == (1, 4)
            # (..., KD, STAGE, LANES, PIPE, RANK): k = 3; the local path's one round has no pipe
            assert a[-5:] == (3, stage, a[-3], int(rank != 2), rank)
            built_lanes.append(a[-3])
        return build(op, *a, **kw)

    monkeypatch.setattr(KF, "MOE_STAGE", stage)
    monkeypatch.setattr(KF, "MOE_STAGE_BLOCKS", 3 if rank == 2 else 2)
    monkeypatch.setattr(KM, "MOE_RANK_MIN_PAIRS", 0 if rank == 1 else 10 ** 9)
    monkeypatch.setattr(KM, "MOE_LOCAL_MAX_PAIRS", 2048 if rank == 2 else 0)
    monkeypatch.setattr(KF, "_sm_count", lambda: 1)  # (the staged rows' grid)
    monkeypatch.setattr(KM, "_sm_count", lambda: 1)  # (the sort's grid)
    monkeypatch.setattr(KF, "fused_row_kernel", spy)
    rng = np.random.default_rng(12)
    T, H, k, E = 5, 1000, 3, 4
    x = rows(rng, T, H, "bfloat16")
    x[2, 70], x[4, 999] = np.inf, np.nan
    ids = topk_ids(rng, T, E, k)
    ids[ids == 2] = 0  # expert 2 empty
    got = fused.moe_sort_quantize(x, ids, E, "mxfp4", device="cuda")
    assert ops == [fused_kernels.OP_SCATTER]
    perm_ref = assert_moe_spec(x, ids, E, got)
    if wide:  # hidden 1024 and 992 (rows of whole quads: the lanes' 128 units, 124): 16-byte stores
        for h in (1024, 992):
            x2 = rows(rng, T, h, "bfloat16")
            x2[1, 980], x2[3, 5] = np.nan, -np.inf
            q2, _, _ = fused.moe_sort_quantize(x2, ids, E, "mxfp4", device="cuda")
            assert_q_equal(q2, nqdq.quantize(x2[perm_ref], "mxfp4"))
    assert built_lanes == ([0, 1, 1] if wide else [0])  # (hidden 1000: not whole quads, the strided staged form)


def test_moe_sort_quantize_gather_rows(row_kernel_ops):
    """The MoE rows that OP_SCATTER does not take, by OP_GATHER (each sorted row reads its
    token): k = 9 of 10 experts (more rows a token than OP_SCATTER holds in registers), bfloat16
    rows of 1000 with aligned units, a group with inf and one with NaN: the spec's bits."""
    from nqdq.gpu.fused import kernels as fused_kernels

    ops = row_kernel_ops
    rng = np.random.default_rng(12)
    T, H, k, E = 3, 1000, 9, 10
    x = rows(rng, T, H, "bfloat16")
    x[1, 70], x[2, 999] = np.inf, np.nan
    ids = topk_ids(rng, T, E, k)
    got = fused.moe_sort_quantize(x, ids, E, "mxfp4", device="cuda")
    assert ops == [fused_kernels.OP_GATHER]
    assert_moe_spec(x, ids, E, got)


def _device_sort(ids, npairs, k, E, mode, flag=None):
    """(perm, offsets, inv) of the device sort ``mode``: "one" / "three" (moe_sort's one
    launch or three), or "rank[B]" (moe_rank_kernel over about B chunks, MOE_RANK_BLOCKS:
    each pair's row from its packed rank and its chunk's base, as the rows kernel finds it,
    perm from those rows; its ticket checked left zero). ``flag``: the id check's word."""
    from nqdq.gpu.fused import kernels as fused_kernels
    from nqdq.gpu.quantize.grid import SYNC_WORDS
    from nqdq.gpu.runtime.interop import Allocator
    from nqdq.gpu.fused import moe as KM
    from nqdq.gpu.fused.moe import moe_rank, moe_sort

    if mode == "one3":  # a grid of 3 blocks, which the simulator runs one after another
        ws = np.zeros(SYNC_WORDS, np.int32)
        sm, KM._sm_count = KM._sm_count, lambda: 3
        try:
            out = moe_sort(ids, npairs, k, E, Allocator("numpy"), ws=ws, one=True, flag=flag)
        finally:
            KM._sm_count = sm
        assert not ws.any()
        return out
    if not mode.startswith("rank"):
        return moe_sort(ids, npairs, k, E, Allocator("numpy"), one=mode == "one", flag=flag)
    ws = np.zeros(SYNC_WORDS, np.int32)
    blocks, KM.MOE_RANK_BLOCKS = KM.MOE_RANK_BLOCKS, int(mode[4:])
    try:
        packed, cbase, off, _, csh = moe_rank(ids, npairs, E, Allocator("numpy"), ws=ws, flag=flag)
    finally:
        KM.MOE_RANK_BLOCKS = blocks
    assert not ws.any()
    p = np.arange(npairs)
    inv = (cbase[(p >> csh) * (E + 1) + (packed >> fused_kernels.MOE_RANK_SHIFT)]
           + (packed & (fused_kernels.MOE_RANK_CHUNK - 1)))
    perm = np.full(npairs, -1, np.int64)
    perm[inv] = p // k
    return perm, off, inv


@pytest.mark.parametrize("mode", ["one", "one3", "three", "rank32", "rank2"])
@pytest.mark.parametrize("tokens, k, E, unroll", [(300, 2, 6, 8), (650, 4, 40, 2), (1100, 2, 33, 8), (200, 3, 300, 8),
                                                  (1100, 4, 300, 8)])
def test_moe_sort_many_pairs_device(tokens, k, E, unroll, mode, monkeypatch):
    """More pairs than one chunk of the device sort (256), so chunk bases are exercised: 3, 11,
    9 and 3 chunks. Three launches: each scan thread's column read one chunk at a time (3), or
    MOE_UNROLL at once and then the rest (11 chunks with MOE_UNROLL 2: read when the simulator
    runs the kernel; 9 with the GPU's 8); E = 6, 40, 33, 300: scans over 32, 64 and 512
    threads, E not a power of two; the scatter's per-warp counts with few and many experts
    (several pairs of an expert in one warp). One launch (sort1; the simulator's grid is one
    block, so it takes every chunk in turn, each bucket's next row advanced chunk by chunk):
    the bucket scan with one bucket a thread and (E = 300) two. One launch of 3 blocks
    ("one3"), which the simulator runs one after another, as a GPU whose SMs other grids
    hold would: block 0 waits, finds blocks 1 and 2 not done, counts their chunks itself
    and sorts its own; blocks 1 and 2, when they run, count theirs again, find every block
    done and sort theirs; the workspace left zero. The rank kernel (MOE_RANK_BLOCKS)
    over about 32 chunks (256 pairs a chunk, one round: 3, 11, 9, 3 and 18 chunks) and about 2
    (512 pairs, two rounds: 2 chunks of 600 pairs; 1024 pairs, four rounds: 3, 3 and 5
    chunks), the last chunk partial, the last block's column sums and scan over 7 to 301
    buckets."""
    from nqdq.gpu.fused import kernels as fused_kernels

    monkeypatch.setattr(fused_kernels, "MOE_UNROLL", unroll)  # read when the simulator runs the kernel
    rng = np.random.default_rng(9)
    ids = rng.integers(0, E, (tokens, k))
    flag = np.full(3, -7, np.int32)
    perm, off, inv = _device_sort(ids.astype(np.int32).reshape(-1), tokens * k, k, E, mode, flag[1:2])
    np.testing.assert_array_equal(flag, [-7, 1, -7])  # the id check: every id in range (its neighbours untouched)
    np.testing.assert_array_equal(perm, [p[1] for p in sorted_pairs(ids)])
    np.testing.assert_array_equal(off[: E + 1], R.moe_sort(ids, E)[1])
    assert off[E + 1] == off[E] == tokens * k  # no id out of range
    np.testing.assert_array_equal(perm[inv], np.arange(tokens * k) // k)  # inv: each pair's sorted row
    assert sorted(inv) == list(range(tokens * k))


class _Stream:
    """A stand-in for a CuPy stream: ``done`` queried; ``on_query`` runs at each query."""

    def __init__(self, done, on_query=None):
        self._done, self.queries, self.on_query = done, 0, on_query

    @property
    def done(self):
        self.queries += 1
        if self.on_query:
            self.on_query(self.queries)
        return self._done


def test_id_checks_ring_and_wait():
    """IdChecks (the words the sort writes its id check to, polled by the host): take clears a word
    and gives its device address, round the ring; wait reads 1 as every id in range and 2 as
    not; it queries the stream every POLLS reads and goes on while the stream runs (the word
    written at the third query here); a stream with nothing left and the word clear is a
    RuntimeError, not a wait for ever."""
    from nqdq.gpu.fused.moe import IdChecks

    host = np.full(4, 9, np.int32)
    ch = IdChecks(host, 0x1000)
    assert [ch.take() for _ in range(5)] == [(0, 0x1000), (1, 0x1004), (2, 0x1008), (3, 0x100C), (0, 0x1000)]
    assert host.tolist() == [0, 0, 0, 0]
    host[0], host[1] = 1, 2
    assert ch.wait(0, _Stream(False)) is True and ch.wait(1, _Stream(False)) is False

    def write_late(q):
        if q == 3:
            host[2] = 1

    st = _Stream(False, write_late)
    assert ch.wait(2, st) is True and st.queries == 3
    st = _Stream(True)
    with pytest.raises(RuntimeError, match="report_ids"):
        ch.wait(3, st)
    assert st.queries == 1
    host[3] = 2
    assert ch.wait(3, _Stream(True)) is False


@pytest.mark.parametrize("mode", ["one", "three", "rank32", "rank4"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_moe_sort_device_sorts_ids_out_of_range_last(dtype, mode):
    """The device sort's own range check (what a CuPy expert_ids relies on: no host min / max):
    ids outside [0, E) in three chunks (int64: one past 2^32, which a cast to int32 would
    have turned into a valid id) sort after every expert, in pair order; offsets[E] counts
    only the valid pairs, offsets[E + 1] all of them."""
    rng = np.random.default_rng(10)
    ids = rng.integers(0, 6, (1200, 2)).astype(dtype)
    ids[5, 1], ids[200, 0], ids[1190, 1] = 6, -1, 99 if dtype == np.int32 else 2**32 + 3
    flag = np.zeros(1, np.int32)
    perm, off, inv = _device_sort(ids.reshape(-1), 2400, 2, 6, mode, flag)
    assert flag[0] == 2  # the id check: some out of range
    valid = [p for p in sorted_pairs(ids) if 0 <= p[0] < 6]
    np.testing.assert_array_equal(perm[:2397], [p[1] for p in valid])
    np.testing.assert_array_equal(perm[2397:], [5, 200, 1190])  # the bad pairs, in pair order
    np.testing.assert_array_equal(inv[[11, 400, 2381]], [2397, 2398, 2399])
    np.testing.assert_array_equal(off[:7], np.concatenate([[0], np.cumsum(np.bincount(ids[(ids >= 0) & (ids < 6)], minlength=6))]))
    assert (off[6], off[7]) == (2397, 2400)


def test_mx_rceil_params_match_the_general_path(monkeypatch):
    """The fused kernel's 32-bit MX "rceil" parameters against _scales.mx_scale_code and
    _codec.e8m0_reciprocal (the quantize kernels'), bit for bit, at every exponent with the
    mantissas around each rounding boundary, for mxfp4 (1/6) and mxfp8 e4m3 (1/448)."""
    from nqdq.gpu.device import codec as _codec, scales as _scales
    from nqdq.gpu.fused import row_fns
    from nqdq.gpu.device.codec import e8m0_reciprocal
    from nqdq.gpu.fused.row_fns import mx_rceil_params
    from nqdq.gpu.device.scales import MX_RCEIL, mx_scale_code

    # the bit casts by NumPy (the device functions' local-array casts need a kernel)
    for mod in (_codec, row_fns, _scales):
        monkeypatch.setattr(mod, "f32_bits", lambda f: np.int64(np.float32(f).view(np.uint32)), raising=False)
        monkeypatch.setattr(mod, "bits_f32", lambda u: np.uint32(u).view(np.float32), raising=False)

    mans = [0, 1, 0x1FFFFF, 0x3FFFFF, 0x400000, 0x400001, 0x555555, 0x7FFFFE, 0x7FFFFF]
    amax = [(e << 23) | m for e in range(256) for m in mans]
    amax += [int(a) for a in np.random.default_rng(5).integers(0, 0x80000000, 4000)]  # (NaNs among them)
    for name in ("mxfp4", "mxfp8"):
        el = resolve_scheme(name).element
        inv = np.float32(1.0 / el.max_value)
        for a in amax:
            code, p0 = mx_rceil_params.py_func(np.int32(a), inv)
            want = mx_scale_code.py_func(np.uint32(a).view(np.float32), MX_RCEIL, el.mbits, el.emax, inv)
            assert int(code) == int(want), (name, hex(a))
            assert bits(np.float32(p0)) == bits(np.float32(e8m0_reciprocal.py_func(want))), (name, hex(a))


# ----------------------------------------------------------------------------- errors
def test_errors_name_the_argument():
    x = np.ones((2, 8), np.float32)
    w = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="weight"):
        fused.rmsnorm_quantize(x, np.ones(7, np.float32), "fp8_row")
    with pytest.raises(ValueError, match="eps"):
        fused.rmsnorm_quantize(x, w, "fp8_row", eps=0.0)
    with pytest.raises(TypeError, match="eps"):
        fused.rmsnorm_quantize(x, w, "fp8_row", eps="1e-6")
    with pytest.raises(ValueError, match="scale="):
        fused.rmsnorm_quantize(x, w, "fp8_tensor")
    with pytest.raises(ValueError, match="scheme"):
        fused.rmsnorm_quantize(x, w, "int8_asym")
    with pytest.raises(ValueError, match="residual"):
        fused.rmsnorm_quantize(x, w, "fp8_row", residual=np.ones((2, 8), np.float16))
    with pytest.raises(TypeError, match="x"):
        fused.rmsnorm_quantize(x.astype(np.int32), w, "fp8_row")
    with pytest.raises(ValueError, match="3-D"):
        fused.flatten_quantize(x, "mxfp4")
    with pytest.raises(ValueError, match="expert_ids"):
        fused.moe_sort_quantize(x, np.array([[0], [3]]), 3)
    with pytest.raises(TypeError, match="expert_ids"):
        fused.moe_sort_quantize(x, np.zeros((2, 1), np.float32), 3)
    with pytest.raises(ValueError, match="num_experts"):
        fused.moe_sort_quantize(x, np.zeros((2, 1), np.int32), 0)
    with pytest.raises(ValueError, match="tokens"):
        fused.moe_sort_quantize(x, np.zeros((3, 1), np.int32), 2)
    with pytest.raises(ValueError, match="weight"):
        fused.rmsnorm_quantize(x, np.ones(7, np.float32), "fp8_row", device="cuda")
    long = np.ones((1, R.MAX_ROW + 8), np.float32)  # the spec defines it (host), the kernels refuse it
    assert fused.rmsnorm(long, long[0]).shape == long.shape
    with pytest.raises(ValueError, match="x has rows of 65544"):
        fused.rmsnorm_quantize(long, long[0], "fp8_row", device="cuda")


def test_scheme_resolution_is_nqdq_quantize_s():
    """Same Scheme object as nqdq.quantize: the fused q saves and loads."""
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)
    q = fused.rmsnorm_quantize(x, np.ones(32, np.float32), "mxfp4")
    assert q.scheme == resolve_scheme("mxfp4")
    assert np.asarray(q.codes).shape == (2, 16) and np.asarray(q.scales).shape == (2, 1)
    parts = RQ.quantize(R.rmsnorm(x, np.ones(32, np.float32), 1e-6, "float32", "float32"), q.scheme)
    np.testing.assert_array_equal(q.codes, pack_codes(parts.codes, 4))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_finite_and_nonfinite_units_vector_path(scheme):
    """Aligned rows (the vector path: finite units by the row-wise finite encoders, units
    holding inf / NaN by encode_element) give the spec's codes, finite and non-finite
    values in one row and across rows."""
    rng = np.random.default_rng(12)
    x = rows(rng, 3, 200, "float32")
    x[1, 5] = np.inf
    x[2, 150] = np.nan
    w = rng.standard_normal(200).astype(np.float32)
    w[17] = np.inf  # one normalized value inf (its unit and group non-finite) in rows 0 and 2
    kw = dict(scale=scale_for(scheme))
    assert_q_equal(fused.rmsnorm_quantize(x, w, scheme, **kw), fused.rmsnorm_quantize(x, w, scheme, device="cuda", **kw))


def test_bits_input_and_save_load(tmp_path):
    """bfloat16 given as uint16 bits + dtype= (how CuPy passes it), weight bits read as x's
    dtype; the result saves and loads like any QuantizedTensor."""
    rng = np.random.default_rng(13)
    x = rows(rng, 2, 130, "bfloat16")
    w = rng.standard_normal(130).astype(BF16)
    q_ref = fused.rmsnorm_quantize(x, w, "fp8_1x128")
    for device in (None, "cuda"):
        q = fused.rmsnorm_quantize(x.view(np.uint16), w.view(np.uint16), "fp8_1x128", dtype="bfloat16", device=device)
        assert_q_equal(q, q_ref)
    path = tmp_path / "q.npz"
    q_ref.save(path)
    assert_q_equal(nqdq.load(path), q_ref)


@pytest.mark.parametrize("clamp", [True, False])
def test_e2m1_unit_f32_p2_matches_the_codec(clamp, monkeypatch):
    """The fused MXFP4 encoder _rowwise_kernels.e2m1_unit_f32_p2 (y rounded to odd into bfloat16,
    then one bfloat16 product by 2^-k; clamped to 6, as the fused kernels take it for "rceil"
    groups, or not) against the reference codec on y * 2^-k, for y = v * 2^k (e2m1_y_probes)
    over the MX range of k: y subnormal (k = -127 .. -120: 2^-k up to 2^127), normal, 2^-k
    subnormal in bfloat16 (k = 127, the "rceil" code 254). tests/test_fused_gpu.py runs the
    unclamped one compiled."""
    from nqdq.gpu.quantize import pair_encoders

    # the bit casts by NumPy views: the twins run on whole arrays
    monkeypatch.setattr(pair_encoders, "f32_bits", lambda f: np.asarray(f, np.float32).view(np.uint32))
    monkeypatch.setattr(pair_encoders, "bits_f32", lambda u: np.asarray(u, np.uint32).view(np.float32))
    v, ks = e2m1_y_probes(not clamp)
    fn = pair_encoders.e2m1_unit_f32_p2.py_func
    for k in ks:
        y, want, p2 = e2m1_y_case(v, k)
        e = y.view(np.uint32).reshape(-1, 8)
        codes = e2m1_codes(fn([e[:, j] for j in range(8)], p2, clamp))
        bad = codes != want
        assert not bad.any(), f"k={k}: {int(bad.sum())} differ, first y={y[bad][0]!r}: {codes[bad][0]} != {want[bad][0]}"


@pytest.mark.parametrize("rounding", ["rceil", "floor"])
def test_mxfp4_of_y_matches_reference(rounding):
    """RMSNorm into MXFP4 gives the spec's bits with and without the residual: "rceil" scales
    (the default: the group parameters once per group, finite groups by e2m1_unit_f32_p2 on
    bfloat16 pairs) and "floor" (the per-lane group path and the general encoder). Row 1 has
    an inf in group 0, row 2 a NaN in group 3 (non-finite groups: the element encoder);
    n = 200 ends inside a group and inside a unit (the slow path)."""
    sch = resolve_scheme("mxfp4", scale_rounding=rounding)
    rng = np.random.default_rng(41)
    x = rows(rng, 3, 200, "bfloat16")
    x = (x * np.repeat(np.exp2(rng.integers(-6, 7, (3, 7))), 32, axis=1)[:, :200]).astype(BF16)
    x[1, 5] = np.inf
    x[2, 100] = np.nan
    w = rng.standard_normal(200).astype(BF16)
    res = rows(rng, 3, 200, "bfloat16")
    assert_q_equal(fused.rmsnorm_quantize(x, w, sch), fused.rmsnorm_quantize(x, w, sch, device="cuda"))
    (qc, rc), (qg, rg) = (fused.rmsnorm_quantize(x, w, sch, residual=res, device=d) for d in (None, "cuda"))
    assert_q_equal(qc, qg)
    np.testing.assert_array_equal(bits(rc), bits(rg))


@pytest.mark.parametrize("scheme, n", [(s, 264) for s in SCHEMES] + [("fp8_row", 3000), ("mxfp4", 3000)])
def test_rmsnorm_nonfinite_rows_match_reference(scheme, n):
    """The RMSNorm ops' unit amax of y by max.NaN of |.| (0x7FFFFFFF for a unit with a NaN) and
    the row's 1/sqrt (by every warp; for MX outputs by warp 0, passed on through shared memory)
    give the spec's bits for the four RMSNorm outputs, with a NaN, an inf and a -inf in
    separate groups (each a NaN scale: row, group or, static, the element encoder) and a row of
    zeros (1/sqrt of eps alone); n = 3000: two warps (mxfp4: the second barrier), 264: one."""
    rng = np.random.default_rng(43)
    x = rows(rng, 3, n, "bfloat16")
    x[0, 7] = np.nan
    x[1, 130] = np.inf
    x[1, 200] = -np.inf
    x[2] = 0
    w = rng.standard_normal(n).astype(BF16)
    sc = scale_for(scheme)
    assert_q_equal(fused.rmsnorm_quantize(x, w, scheme, scale=sc),
                   fused.rmsnorm_quantize(x, w, scheme, scale=sc, device="cuda"))


def absmax_want(a, b):
    """NumPy's rule for ptx.absmax_nan: the larger magnitude's bits, 0x7FFFFFFF for a NaN."""
    fa, fb = np.uint32(a).view(np.float32), np.uint32(b).view(np.float32)
    if np.isnan(fa) or np.isnan(fb):
        return 0x7FFFFFFF
    return int(np.maximum(abs(fa), abs(fb)).view(np.uint32))


def test_absmax_nan_twin():
    """The twin of ptx.absmax_nan (what the simulator runs) against NumPy on every pair of
    ABSMAX_EDGES; tests/test_fused_gpu.py compares the intrinsic with it."""
    from nqdq.gpu.ptx.pairs import absmax_nan_twin

    for a in ABSMAX_EDGES:
        for b in ABSMAX_EDGES:
            assert int(absmax_nan_twin(a, b)) == absmax_want(a, b), (hex(a), hex(b))


@pytest.mark.parametrize("n, t", [(200, 3), (700, 2), (1100, 2), (2048, 1)])
def test_group_scales_once_per_group_match_reference(n, t):
    """The group parameters computed once per group (by the lane that the transposed
    butterfly leaves its amax on, and sent back by shfl.idx) give the spec's bits for 1x128 and
    MX-32 groups at U = 1, 3, 5 and 8 units a lane (one warp: MAX_UNITS_PER_THREAD 8), rows
    that end inside a group and inside a unit (200, 1100), non-finite groups (inf, NaN: the
    element encoder), with the residual, and for flatten's fp8 rows (no norm)."""
    rng = np.random.default_rng(n)
    x = rows(rng, t, n, "bfloat16")
    # every 32-element block its own magnitude, so a unit given another group's multiplier
    # (MX's e8m0 scales too) gets other codes
    mag = np.exp2(rng.integers(-6, 7, (t, -(-n // 32))))
    x = (x * np.repeat(mag, 32, axis=1)[:, :n]).astype(BF16)
    x[0, n - 3] = np.inf  # the last group of row 0
    x[t - 1, 40] = np.nan  # group 0 of the last row
    w = rng.standard_normal(n).astype(BF16)
    res = rows(rng, t, n, "bfloat16")
    for scheme in ("fp8_1x128", "mxfp4"):
        assert_q_equal(fused.rmsnorm_quantize(x, w, scheme), fused.rmsnorm_quantize(x, w, scheme, device="cuda"))
        if n == 1100:
            (qc, rc), (qg, rg) = (fused.rmsnorm_quantize(x, w, scheme, residual=res, device=d) for d in (None, "cuda"))
            assert_q_equal(qc, qg)
            np.testing.assert_array_equal(bits(rc), bits(rg))
    if n == 2048:
        x3 = x.reshape(t, 8, n // 8)
        assert_q_equal(fused.flatten_quantize(x3, "fp8_1x128", device="cuda"), nqdq.quantize(x, "fp8_1x128"))


def test_full_rows_policy():
    """full_rows: FULL for the RMSNorm ops with the residual and for mxfp4 / fp8_tensor without
    it, and flatten (the H100 A/Bs); not for fp8_row / fp8_1x128 without the residual, the y
    kernel or the MoE rows."""
    from nqdq.gpu.fused import kernels as fused_kernels
    from nqdq.gpu.fused import rows as FR

    on = {(fused_kernels.OP_NORM, out, res)
          for out in (fused_kernels.OUT_ROW, fused_kernels.OUT_GROUP, fused_kernels.OUT_MX, fused_kernels.OUT_TENSOR)
          for res in (True,)}
    on |= {(fused_kernels.OP_NORM, fused_kernels.OUT_MX, False),
           (fused_kernels.OP_NORM, fused_kernels.OUT_TENSOR, False)}
    on |= {(fused_kernels.OP_ROWS, out, res)
           for out in (fused_kernels.OUT_ROW, fused_kernels.OUT_GROUP, fused_kernels.OUT_MX, fused_kernels.OUT_TENSOR,
                       fused_kernels.OUT_Y)
           for res in (False, True)}
    ops = [(op, out, res) for op in (fused_kernels.OP_NORM, fused_kernels.OP_ROWS, fused_kernels.OP_GATHER,
                                     fused_kernels.OP_SCATTER)
           for out in (fused_kernels.OUT_ROW, fused_kernels.OUT_GROUP, fused_kernels.OUT_MX, fused_kernels.OUT_TENSOR,
                       fused_kernels.OUT_Y) for res in (False, True)]
    assert {o for o in ops if FR.full_rows(*o)} == on


def test_full_rows_match_reference(monkeypatch):
    """Where the row fills the block's units (n = 512: one warp x 2 units x 8) and full_rows
    says so, the kernel is built with fast = 2 (no unit tested against the row's end) and
    gives the spec's bits for the four RMSNorm outputs with and without the residual (a NaN
    and an inf in separate groups), flatten and the MoE rows; elsewhere, and where the row
    does not fill them (n = 520), fast stays 1."""
    from nqdq.gpu.fused import kernels as fused_kernels
    from nqdq.gpu.fused import rows as FR
    from nqdq.gpu.fused import plan as KF

    built = []
    build = KF.fused_row_kernel

    def spy(op, out, kind, wkind, nw, u, fast, *a, **kw):
        built.append((op, fast))
        return build(op, out, kind, wkind, nw, u, fast, *a, **kw)

    monkeypatch.setattr(KF, "fused_row_kernel", spy)
    rng = np.random.default_rng(47)
    for n in (512, 520):
        x = rows(rng, 2, n, "bfloat16")
        x = (x * np.repeat(np.exp2(rng.integers(-6, 7, (2, -(-n // 32)))), 32, axis=1)[:, :n]).astype(BF16)
        x[0, 300], x[1, 33] = np.nan, np.inf
        w = rng.standard_normal(n).astype(BF16)
        res = rows(rng, 2, n, "bfloat16")
        for scheme in SCHEMES if n == 512 else ["mxfp4"]:
            sc = scale_for(scheme)
            mode = KF.out_kind(resolve_scheme(scheme, static_scale=sc is not None))
            built.clear()
            assert_q_equal(fused.rmsnorm_quantize(x, w, scheme, scale=sc),
                           fused.rmsnorm_quantize(x, w, scheme, scale=sc, device="cuda"))
            # (each general call builds its kernel, and so does the plan it remembers: fused._ROWS_FAST)
            full = n == 512 and FR.full_rows(fused_kernels.OP_NORM, mode, False)
            assert built and set(built) == {(fused_kernels.OP_NORM, 2 if full else True)}, scheme
            built.clear()
            (qc, rc), (qg, rg) = (fused.rmsnorm_quantize(x, w, scheme, scale=sc, residual=res, device=d)
                                  for d in (None, "cuda"))
            assert_q_equal(qc, qg)
            np.testing.assert_array_equal(bits(rc), bits(rg))
            assert built and set(built) == {(fused_kernels.OP_NORM, 2 if n == 512 else True)}, scheme
    x3 = rows(rng, 2 * 4, 128, "bfloat16").reshape(2, 4, 128)
    assert_q_equal(fused.flatten_quantize(x3, "mxfp4", device="cuda"), nqdq.quantize(x3.reshape(2, 512), "mxfp4"))
    ids = np.array([[0, 2], [1, 0], [2, 1]])
    x = rows(rng, 3, 512, "bfloat16")
    q, perm, _ = fused.moe_sort_quantize(x, ids, 3, "mxfp4", device="cuda")
    assert_q_equal(q, nqdq.quantize(x[perm], "mxfp4"))


def test_prefetch_distance_per_op():
    """The L2 prefetch is for RMSNorm into the per-tensor static output only, PREFETCH_TENSOR
    rows ahead (the one op the H100 A/B found faster); never with the residual nor for the
    other outputs or the row ops without a norm; the kernel builds the prefetch code exactly
    where the distance is > 0."""
    from nqdq.gpu.fused import kernels as fused_kernels
    from nqdq.gpu.fused import rows as FR
    from nqdq.gpu.device.elements import format_tuple

    pd = FR.prefetch_distance
    assert pd(fused_kernels.OP_NORM, fused_kernels.OUT_TENSOR, False) == FR.PREFETCH_TENSOR > 0
    for out in (fused_kernels.OUT_ROW, fused_kernels.OUT_GROUP, fused_kernels.OUT_MX, fused_kernels.OUT_Y):
        assert pd(fused_kernels.OP_NORM, out, False) == 0
    for out in (fused_kernels.OUT_TENSOR, fused_kernels.OUT_MX):
        assert pd(fused_kernels.OP_NORM, out, True) == 0
        assert pd(fused_kernels.OP_GATHER, out, False) == 0 and pd(fused_kernels.OP_ROWS, out, False) == 0
    sch = resolve_scheme("fp8_tensor", static_scale=True)
    nw, u = R.row_geometry(7168)
    srcs = {}
    for res in (False, True):
        k = FR.fused_row_kernel(fused_kernels.OP_NORM, fused_kernels.OUT_TENSOR, 1, 1, nw, u, True, False, res,
                                format_tuple(sch), (0, 0, 0, 1.0), 448.0, 0, True)
        srcs[res] = k.source
    assert "prefetch_rows(" in srcs[False] and "prefetch_rows(" not in srcs[True]


@pytest.mark.parametrize("case", ["words", "residual", "prefetch", "strided"])
def test_fused_row_paths_match_reference(case, monkeypatch):
    """The row kernel's paths give the spec's bits on these edge values: "words" flatten / MoE
    rows of bfloat16 into MXFP4 by the words' pair encoder, with a non-finite group (fp8_1x128
    beside it: the float32 path); "residual" the new bfloat16 residual by cvt.rn.bf16x2 with
    NaN (its 0x7FFF made 0x7FC0), inf, overflowing and subnormal sums, and normalize's fma;
    "prefetch" the static per-tensor output's L2 prefetch run 1 row ahead (the launch
    argument: PREFETCH_TENSOR; a hint the simulator's twin ignores, so only that the
    argument and its code path run); "strided" the strided flatten's unit indices per unit
    (D / 8 dividing the block's threads, D = 64, 128, or not, D = 24)."""
    from nqdq.gpu.fused import rows as FR

    rng = np.random.default_rng(43)
    if case == "strided":
        for h, d, scheme in ((8, 64, "mxfp4"), (6, 128, "fp8_1x128"), (16, 24, "mxfp4")):  # 2, 3, 2 units a lane
            x = rows(rng, 3 * h, d, "bfloat16").reshape(3, h, d)
            view = np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)  # read in place, strided
            q = fused.flatten_quantize(view, scheme, device="cuda")
            assert_q_equal(q, nqdq.quantize(x.reshape(3, h * d), scheme))
        return
    if case == "words":
        x = rows(rng, 3 * 2, 64, "bfloat16").reshape(3, 2, 64)
        x[1, 0, 40] = np.inf  # group 1 of row 1: non-finite (element encoder)
        for scheme in ("mxfp4", "fp8_1x128"):
            q_ref = nqdq.quantize(x.reshape(3, 128), scheme)
            assert_q_equal(fused.flatten_quantize(x, scheme, device="cuda"), q_ref)
        ids = np.array([[1, 0], [0, 2], [2, 1]])
        q_g, perm_g, _ = fused.moe_sort_quantize(x.reshape(3, 128), ids, 3, "mxfp4", device="cuda")
        assert_q_equal(q_g, nqdq.quantize(x.reshape(3, 128)[perm_g], "mxfp4"))
        return
    x = rows(rng, 3, 64, "bfloat16")
    w = rng.standard_normal(64).astype(BF16)
    if case == "prefetch":  # built for the static per-tensor output without the residual only
        monkeypatch.setattr(FR, "PREFETCH_TENSOR", 1)
        assert_q_equal(fused.rmsnorm_quantize(x, w, "fp8_tensor", scale=STATIC),
                       fused.rmsnorm_quantize(x, w, "fp8_tensor", scale=STATIC, device="cuda"))
        return
    res = rows(rng, 3, 64, "bfloat16")
    x[0, 3], res[0, 3] = np.inf, -np.inf  # inf + -inf: NaN (0x7FC0 in the spec)
    x[1, 9] = np.nan
    x[2, 17], res[2, 17] = 3e38, 3e38  # overflows to inf (no NaN: the fast words stand)
    x[2, 20], res[2, 20] = 1e-39, 1e-39  # subnormal sum
    for scheme in ("fp8_row", "mxfp4"):
        (qc, rc), (qg, rg) = (fused.rmsnorm_quantize(x, w, scheme, residual=res, device=d) for d in (None, "cuda"))
        assert_q_equal(qc, qg)
        np.testing.assert_array_equal(bits(rc), bits(rg))


_MOE_PTX_SCRIPT = r"""
import json, re
import numpy as np
from numba import cuda, typeof
from nqdq.gpu.fused import plan as KF
from nqdq.tools.ptx_audit import _no_gpu_compile, compile_and_audit
want = ("moe scatter-rows staged mxfp4", "moe scatter-rows staged rank mxfp4",
        "moe scatter-rows staged local mxfp4", "moe count", "moe scan", "moe scatter", "moe sort (one launch)",
        "moe rank")
launches = [l for l in KF.audit_launches() if l[0] in want]
rows = compile_and_audit(launches)
out = {}
for (label, k, args), row in zip(launches, rows):
    with _no_gpu_compile():
        ptx, _ = cuda.compile_ptx(k.py_func, tuple(typeof(a) for a in args), cc=(9, 0))
    ops = re.findall(r"^\s*(?:@!?%p\d+\s+)?(griddepcontrol\.\w+|ld\.global\.[\w.]+|atom\.global\.[\w.]+|st\.global\.[\w.]+)", ptx, re.M)
    fences = re.findall(r"^\s*(membar\.\w+|fence\.[\w.]+)", ptx, re.M)
    out[label] = dict(ops=ops, fences=fences, problems=row["problems"], regs=row.get("regs"))
print(json.dumps(out))
"""


def test_moe_kernels_programmatic_dependent_launch_ptx():
    """The MoE kernels as moe_plan launches them, programmatic dependents (compiled for sm_90 and
    assembled, no GPU): the sort kernels allow their dependent's launch before any global access
    (griddepcontrol.launch_dependents) and the scan, the three-launch scatter and OP_SCATTER's
    staged rows wait (griddepcontrol.wait) before they read what the kernel before wrote: the
    rows after a round's loads, before its stores, the scatter after its ids and before the scan's bases. The one-launch sort reads the other
    blocks' counts by ld.global.cg (L2, no atomics), its only global atomics the barrier's; the
    rank kernel too (its ticket's), and it never waits: no spin, one atomic add a block."""
    k = compile_rows(_MOE_PTX_SCRIPT)
    for label, v in k.items():
        assert not v["problems"], (label, v["problems"])
    # the staged rows (MOE_STAGE, lanes' groups): a round's tokens read (4 v4 loads a lane, in the
    # round's loop), then the one wait, then the round's rows (a thread a pair: inv's one load,
    # or with RANK its packed rank, its chunk's base, and the perm entry stored), then a 16-byte
    # store of the lane's 4 words to each of a token's 4 rows, then the 4 scale codes
    for label, rows_ops in (("moe scatter-rows staged mxfp4", ["ld.global.s32"]),
                            ("moe scatter-rows staged rank mxfp4", ["ld.global.u32", "ld.global.s32", "st.global.u32"])):
        st = k[label]["ops"]
        w = st.index("griddepcontrol.wait")
        assert st.count("griddepcontrol.wait") == 1 and "griddepcontrol.launch_dependents" not in st
        assert set(st[:w]) == {"ld.global.nc.v4.u32"}
        assert st[w + 1:] == rows_ops + ["st.global.v4.u32"] * 4 + ["st.global.u8"] * 4, label
    # the local sort (the local path: no sort before it): no wait, no global atomic; the ids read in
    # batches of MOE_LOCAL_BATCH (the token loads beside them), then the rows (the block's own
    # pairs' ids read again, perm and the offsets stored), then the same 16-byte and byte stores
    loc = k["moe scatter-rows staged local mxfp4"]["ops"]
    assert not [o for o in loc if o.startswith(("griddepcontrol", "atom"))]
    assert loc.count("ld.global.nc.v4.u32") == 4 and loc.count("ld.global.s32") == 8  # (MOE_LOCAL_BATCH)
    assert loc[-8:] == ["st.global.v4.u32"] * 4 + ["st.global.u8"] * 4
    first_u32 = loc.index("ld.global.u32")  # the rows: the block's own pairs' ids, then perm / offsets stored
    assert set(loc[:first_u32]) == {"ld.global.nc.v4.u32", "ld.global.s32"}
    assert set(loc[first_u32:-8]) == {"ld.global.u32", "st.global.u32"}
    rank = k["moe rank"]["ops"]
    assert "griddepcontrol.wait" not in rank and rank.count("ld.global.cg.s32") == 2 * 32  # two column walks
    assert [o for o in rank if o.startswith("atom")] == ["atom.global.add.u32", "atom.global.exch.b32"]
    for label in ("moe count", "moe scan", "moe scatter", "moe sort (one launch)", "moe rank"):
        assert k[label]["ops"][0] == "griddepcontrol.launch_dependents", label
    scan = k["moe scan"]["ops"]
    assert scan[1] == "griddepcontrol.wait" and scan[2].startswith("ld.global")
    sc = k["moe scatter"]["ops"]
    assert sc[1].startswith("ld.global") and sc[2] == "griddepcontrol.wait" and sc[3].startswith("ld.global")
    one = k["moe sort (one launch)"]["ops"]
    assert "griddepcontrol.wait" not in one  # (the first launch of the sequence: nothing to wait for)
    assert one.count("ld.global.cg.s32") == 32  # MOE_WALK counts in flight
    # the arrivals and departures (add) and the done bits (or: set and read), all global; the
    # last block zeroes the workspace by plain stores
    assert sorted(set(o for o in one if o.startswith("atom"))) == ["atom.global.add.u32", "atom.global.or.b32"]
    # the id check's word (report_ids), then (at the kernel's end) a system fence: the host
    # polls the word (check_ids=True); the kernels' own fences are GPU-wide
    for label in ("moe scan", "moe sort (one launch)", "moe rank"):
        assert k[label]["fences"].count("membar.sys") == 1, (label, k[label]["fences"])
    assert k["moe scan"]["fences"][-1] == "membar.sys" and k["moe rank"]["fences"][-1] == "membar.sys"
