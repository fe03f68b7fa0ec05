"""Fused ops on a real GPU at real hidden sizes (7168, 5120, an odd 7167 and the longest row, 65536), CuPy
arrays in and out, bit for bit against the NumPy spec (nqdq.reference.fused) on the same
data; and the normalized values within 1 float32 ulp of a float64 evaluation on the GPU.

Runs only with NQDQ_TEST_GPU=1 on a machine with a CUDA GPU and CuPy (``pytest -m gpu``).
Token counts (77, 300) are not multiples of any tile.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

from helpers.data import topk_ids  # noqa: E402
from helpers.gpu import gpu_cupy_or_skip  # noqa: E402

cp = gpu_cupy_or_skip()

from nqdq import fused  # noqa: E402
from nqdq.reference import fused as R  # noqa: E402
from nqdq.reference import quantize as RQ  # noqa: E402
from nqdq.reference.packing import pack_codes  # noqa: E402
from nqdq.schemes import resolve_scheme  # noqa: E402
from nqdq.gpu.quantize.grid import SYNC_WORDS  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
NP = {"bfloat16": BF16, "float16": np.dtype(np.float16), "float32": np.dtype(np.float32)}
STATIC = 0.02


def host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def bits(a):
    a = host(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def to_gpu(a):
    """NumPy -> CuPy; bfloat16 as its uint16 bits (CuPy has no bfloat16)."""
    return cp.asarray(a.view(np.uint16) if a.dtype == BF16 else a)


def rows(rng, t, n, dtype, spread=4.0):
    return (rng.standard_normal((t, n)) * np.exp2(rng.uniform(-spread, spread, (t, 1)))).astype(NP[dtype])


def ref_q(parts, sch):
    codes = pack_codes(parts.codes, sch.code_bits) if sch.code_bits < 8 else parts.codes
    return codes, parts.scales


# One kernel compilation per case costs about 20-25 s of NVVM time on the GPU machine (the
# row kernel is written out per unit), so the cases are chosen to cover each path once:
# every output mode at 7168 (with and without the residual; at 7168 the rows fill the units,
# the FULL kernels where fused.rows.full_rows picks them), the element-by-element path
# (7167, with the residual and MX), 32 warps of 8 units (65536: launch bounds 1024), float32.
CASES = [(7168, "bfloat16", "fp8_row", True), (7168, "bfloat16", "fp8_tensor", False),
         (7168, "bfloat16", "fp8_1x128", True), (7168, "bfloat16", "mxfp4", False), (7167, "bfloat16", "mxfp4", True),
         (7168, "bfloat16", "mxfp4", True), (7168, "bfloat16", "fp8_row", False),
         (65536, "bfloat16", "fp8_tensor", False), (5120, "float32", "fp8_row", True)]


@pytest.mark.parametrize("n, dtype, scheme, with_res", CASES)
def test_gpu_rmsnorm_quantize_matches_reference(n, dtype, scheme, with_res):
    rng = np.random.default_rng(n + len(scheme))
    x = rows(rng, 77, n, dtype)
    # rows whose squares or sums of squares overflow float32, and non-finite ones: the
    # float64 sum's split (high part inf or NaN, low part 0) must give the spec's bits there too
    x[3, 9], x[4, :], x[5, :8], x[6, 11], x[7, 5] = 3e19, 1.5e19, 1.8e19, np.inf, np.nan
    w = rng.standard_normal(n).astype(NP[dtype])
    res = rows(rng, 77, n, dtype) if with_res else None
    scale = STATIC if scheme == "fp8_tensor" else None
    sch = resolve_scheme(scheme, static_scale=scale is not None)
    kw = {"dtype": dtype} if dtype != "float32" else {}
    out = fused.rmsnorm_quantize(to_gpu(x), to_gpu(w), scheme, residual=None if res is None else to_gpu(res),
                                 scale=scale, **kw)
    q = out[0] if with_res else out
    s = None if scale is None else np.full(sch.scale_shape(x.shape), scale, np.float32)
    parts, new_res = R.rmsnorm_quantize(x.astype(np.float32), w.astype(np.float32), sch, np.float32(1e-6), dtype, dtype,
                                        res32=None if res is None else res.astype(np.float32), scale=s)
    codes, scales = ref_q(parts, sch)
    np.testing.assert_array_equal(bits(q.codes), bits(codes))
    np.testing.assert_array_equal(bits(q.scales), bits(scales))
    if with_res:
        np.testing.assert_array_equal(bits(out[1]), bits(new_res))


def test_gpu_absmax_nan_matches_twin():
    """ptx.absmax_nan (max.NaN.f32 of |.|, the RMSNorm ops' unit amax) compiled, on every pair
    of helpers.encoders.ABSMAX_EDGES, against its twin (which test_fused checks against NumPy)."""
    from numba import cuda

    from nqdq.gpu.ptx.pairs import absmax_nan, absmax_nan_twin
    from helpers.encoders import ABSMAX_EDGES

    @cuda.jit
    def k(a, b, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = absmax_nan(a[i], b[i])

    a, b = (v.reshape(-1).copy() for v in np.meshgrid(ABSMAX_EDGES, ABSMAX_EDGES))
    out = cp.zeros(a.size, np.uint32)
    k[1, 256](cp.asarray(a), cp.asarray(b), out)
    want = np.array([absmax_nan_twin(x, y) for x, y in zip(a, b)], np.uint32)
    np.testing.assert_array_equal(out.get(), want)


def test_gpu_e2m1_unit_f32_p2_matches_the_codec():
    """quantize.pair_encoders.e2m1_unit_f32_p2 unclamped (rmsnorm + mxfp4's encoder of finite "rceil" groups:
    the bfloat16 multiply and the magic add compiled) on test_fused's probes around every e2m1
    code boundary over the MX range of k, 2^-k = 2^-127 (a bfloat16 subnormal) included,
    against the reference codec: what test_fused checks through the twins."""
    from numba import cuda

    from nqdq.gpu.quantize import pair_encoders
    from helpers.encoders import e2m1_codes, e2m1_y_case, e2m1_y_probes

    @cuda.jit
    def k(e, p2, out):
        i = cuda.grid(1)
        if i < out.size:
            b = 8 * i
            out[i] = pair_encoders.e2m1_unit_f32_p2((e[b], e[b + 1], e[b + 2], e[b + 3], e[b + 4], e[b + 5], e[b + 6],
                                                     e[b + 7]),
                                         p2, False)

    v, ks = e2m1_y_probes(True)
    out = cp.zeros(v.size // 8, np.uint32)
    for kk in ks:
        y, want, p2 = e2m1_y_case(v, kk)
        k[(out.size + 127) // 128, 128](cp.asarray(y.view(np.uint32)), p2, out)
        codes = e2m1_codes(out.get())
        bad = codes != want
        assert not bad.any(), f"k={kk}: {int(bad.sum())} differ, first y={y[bad][0]!r}: {codes[bad][0]} != {want[bad][0]}"


@pytest.mark.parametrize("scheme", ["fp8_1x128"])
def test_gpu_shuffle_twin_agrees(scheme, monkeypatch):
    """The warp shuffles' simulator twin (shared memory + barriers) run on the GPU gives the
    shuffles' bits (norm sum butterfly, row / group amax butterflies)."""
    import nqdq.gpu.fused.plan as kf

    rng = np.random.default_rng(17)
    x = rows(rng, 77, 7168, "bfloat16")
    w = rng.standard_normal(7168).astype(BF16)
    r = rows(rng, 77, 7168, "bfloat16")
    args = (to_gpu(x), to_gpu(w), scheme)
    q1, r1 = fused.rmsnorm_quantize(*args, residual=to_gpu(r), dtype="bfloat16")
    monkeypatch.setattr(kf, "SHFL_DEFAULT", False)
    q2, r2 = fused.rmsnorm_quantize(*args, residual=to_gpu(r), dtype="bfloat16")
    np.testing.assert_array_equal(bits(q1.codes), bits(q2.codes))
    np.testing.assert_array_equal(bits(q1.scales), bits(q2.scales))
    np.testing.assert_array_equal(bits(r1), bits(r2))


@pytest.mark.parametrize("n, dtype", [(7168, "bfloat16"), (7168, "float32")])
def test_gpu_norm_within_one_ulp_of_float64(n, dtype):
    """y from the GPU against float64 computed on the GPU (CuPy), 256 rows of wide range."""
    rng = np.random.default_rng(n)
    x = rows(rng, 256, n, dtype, spread=8)
    w = rng.standard_normal(n).astype(NP[dtype])
    kw = {"dtype": dtype} if dtype != "float32" else {}
    y = fused.rmsnorm(to_gpu(x), to_gpu(w), **kw)
    x64 = cp.asarray(x.astype(np.float64))
    w64 = cp.asarray(w.astype(np.float64))
    y64 = x64 / cp.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + float(np.float32(1e-6))) * w64
    ulp = cp.asarray(np.spacing(np.abs(host(y64)).astype(np.float32)).astype(np.float64))
    worst = float((cp.abs(y.astype(cp.float64) - y64) / ulp).max())
    assert worst <= 1.0, worst
    np.testing.assert_array_equal(bits(y), bits(R.rmsnorm(x.astype(np.float32), w.astype(np.float32), 1e-6, dtype, dtype)))


@pytest.mark.parametrize("scheme", ["fp8_1x128"])
def test_gpu_flatten_quantize(scheme):
    rng = np.random.default_rng(1)
    x = rows(rng, 77 * 56, 128, "bfloat16").reshape(77, 56, 128)
    sch = resolve_scheme(scheme)
    codes, scales = ref_q(RQ.quantize(x.reshape(77, 56 * 128).astype(np.float32), sch), sch)
    q = fused.flatten_quantize(to_gpu(x), scheme, dtype="bfloat16")
    np.testing.assert_array_equal(bits(q.codes), bits(codes))
    np.testing.assert_array_equal(bits(q.scales), bits(scales))
    view = to_gpu(np.ascontiguousarray(x.transpose(1, 0, 2))).transpose(1, 0, 2)  # strided, read in place
    q = fused.flatten_quantize(view, scheme, dtype="bfloat16")
    np.testing.assert_array_equal(bits(q.codes), bits(codes))
    np.testing.assert_array_equal(bits(q.scales), bits(scales))


def test_gpu_moe_ids_out_of_range():
    """CuPy expert ids are range-checked by the sort kernels: an id out of range raises
    ValueError naming expert_ids; with check_ids=False the call does not wait and offsets[E]
    counts only the valid pairs."""
    rng = np.random.default_rng(6)
    x = to_gpu(rows(rng, 300, 256, "bfloat16"))
    ids = topk_ids(rng, 300, 16, 2, np.int32)
    ids[100, 1] = 16
    with pytest.raises(ValueError, match="expert_ids"):
        fused.moe_sort_quantize(x, cp.asarray(ids), 16, "mxfp4", dtype="bfloat16")
    q, perm, offsets = fused.moe_sort_quantize(x, cp.asarray(ids), 16, "mxfp4", dtype="bfloat16", check_ids=False)
    assert int(host(offsets)[16]) == 599
    assert int(host(perm)[599]) == 100  # the pair out of range sorts last
    ids64 = ids.astype(np.int64)
    ids64[100, 1] = 2**32 + 3  # a cast to int32 would make it expert 3
    with pytest.raises(ValueError, match="expert_ids"):
        fused.moe_sort_quantize(x, cp.asarray(ids64), 16, "mxfp4", dtype="bfloat16")
    ids[100, 1] = 3
    q2, perm2, offsets2 = fused.moe_sort_quantize(x, cp.asarray(ids), 16, "mxfp4", dtype="bfloat16")
    perm_ref, off_ref = R.moe_sort(ids, 16)
    np.testing.assert_array_equal(host(perm2), perm_ref)
    np.testing.assert_array_equal(host(offsets2), off_ref)


def assert_moe_spec(x, ids, E, got):
    """``got`` = moe_sort_quantize's (q, perm, offsets) for bfloat16 ``x`` and ``ids`` (host
    arrays) equal the spec's (reference/fused.moe_sort, then the reference quantizer) bit for bit;
    ids out of [0, E) (check_ids=False) sort after every expert in pair order, and the op's
    offsets stop at the last expert (offsets[E]: the pairs with a valid id)."""
    q, perm, offsets = got
    if ((ids >= 0) & (ids < E)).all():
        perm_ref, off_ref = R.moe_sort(ids, E)
    else:
        key = np.where((ids >= 0) & (ids < E), ids, E).astype(np.int64).reshape(-1)
        perm_ref = np.argsort(key, kind="stable") // ids.shape[1]
        off_ref = np.searchsorted(np.sort(key), np.arange(E + 1))
    np.testing.assert_array_equal(host(perm), perm_ref)
    np.testing.assert_array_equal(host(offsets), off_ref)
    sch = resolve_scheme("mxfp4")
    codes, scales = ref_q(RQ.quantize(x.astype(np.float32)[perm_ref], sch), sch)
    np.testing.assert_array_equal(bits(q.codes), bits(codes))
    np.testing.assert_array_equal(bits(q.scales), bits(scales))


def assert_moe_same(a, b):
    """Two moe_sort_quantize results (q, perm, offsets) bit for bit the same."""
    for u, v in ((a[0].codes, b[0].codes), (a[0].scales, b[0].scales), (a[1], b[1]), (a[2], b[2])):
        np.testing.assert_array_equal(bits(u), bits(v))


def test_gpu_moe_hot_path():
    """A repeated call with the same shapes takes the planned path (one allocation, the four
    launches in one generated function): bit for bit the general path's and the spec's
    results; it still raises on ids out of range (and with check_ids=False sorts them last);
    a 16-byte misaligned x goes the general way, and so does a changed shape."""
    from nqdq import api

    api.clear_fast_path()
    rng = np.random.default_rng(15)
    T, H, k, E = 200, 7168, 4, 32
    x = rows(rng, T, H, "bfloat16")
    ids = topk_ids(rng, T, E, k, np.int32)
    xg, idg = to_gpu(x), cp.asarray(ids)
    assert_moe_spec(x, ids, E, fused.moe_sort_quantize(xg, idg, E, "mxfp4", dtype="bfloat16"))
    assert len(fused._moe._MOE_FAST) == 1
    assert_moe_spec(x, ids, E, fused.moe_sort_quantize(xg, idg, E, "mxfp4", dtype="bfloat16"))  # planned
    bad = ids.copy()
    bad[50, 2] = E
    with pytest.raises(ValueError, match="expert_ids"):
        fused.moe_sort_quantize(xg, cp.asarray(bad), E, "mxfp4", dtype="bfloat16")
    q, perm, offsets = fused.moe_sort_quantize(xg, cp.asarray(bad), E, "mxfp4", dtype="bfloat16", check_ids=False)
    assert int(host(offsets)[E]) == T * k - 1 and int(host(perm)[T * k - 1]) == 50
    flat = cp.empty(T * H + 1, cp.uint16)
    xm = flat[1:].reshape(T, H)  # 2 bytes past an aligned address
    xm[...] = xg
    assert_moe_spec(x, ids, E, fused.moe_sort_quantize(xm, idg, E, "mxfp4", dtype="bfloat16"))
    api.clear_fast_path()


def test_gpu_moe_check_returns_before_the_rows():
    """A planned call with check_ids=True waits for the sort's check (a polled word), not for the
    rows: at 8192 tokens x 7168 top-4 (rows of about 90 us on an H100) the stream still has
    work when the call returns, in at least one of five calls (reading offsets[E] back, it
    never would); perm and offsets are the spec's, and every output
    check_ids=False's (the rows' bits against the spec: the tests above)."""
    from nqdq import api

    api.clear_fast_path()
    rng = np.random.default_rng(29)
    T, H, k, E = 8192, 7168, 4, 256
    x = rows(rng, T, H, "bfloat16")
    ids = topk_ids(rng, T, E, k, np.int32)
    xg, idg = to_gpu(x), cp.asarray(ids)
    fused.moe_sort_quantize(xg, idg, E, "mxfp4", dtype="bfloat16")  # plans it
    st = cp.cuda.get_current_stream()
    busy = []
    for _ in range(5):
        st.synchronize()
        got = fused.moe_sort_quantize(xg, idg, E, "mxfp4", dtype="bfloat16")
        busy.append(not st.done)
    assert any(busy), busy
    perm_ref, off_ref = R.moe_sort(ids, E)
    np.testing.assert_array_equal(host(got[1]), perm_ref)
    np.testing.assert_array_equal(host(got[2]), off_ref)
    assert_moe_same(got, fused.moe_sort_quantize(xg, idg, E, "mxfp4", dtype="bfloat16", check_ids=False))
    api.clear_fast_path()


@pytest.mark.parametrize("k, stage, blocks", [(4, None, None), (9, None, None), (4, 4, 4), (4, 2, 1)])
def test_gpu_moe_scatter_and_gather(k, stage, blocks, monkeypatch, row_kernel_ops):
    """The MoE rows by the staged OP_SCATTER (each token encoded once, stored to its k rows;
    k = 4) and by OP_GATHER (k = 9: more rows a token than OP_SCATTER holds, each sorted row
    reads its token): the spec's bits at hidden 7168 with int64 ids, an inf group and a NaN
    group; every stored row of a token carries them. The launcher's stage (8 tokens over 3 blocks
    an SM), 4 over 4 (a block a token here: every token staged) and 2 over one block an SM (3
    tokens a block on a 132-SM GPU: the third after the staged ones; token 7's inf group staged,
    then encoded again)."""
    from nqdq.gpu.fused import kernels as fused_kernels
    from nqdq.gpu.fused import plan as KF

    if stage is not None:
        monkeypatch.setattr(KF, "MOE_STAGE", stage)
        monkeypatch.setattr(KF, "MOE_STAGE_BLOCKS", blocks)
    ops = row_kernel_ops
    rng = np.random.default_rng(13)
    T, H, E = 333, 7168, 64
    x = rows(rng, T, H, "bfloat16")
    x[7, 100], x[300, 7167] = np.inf, np.nan
    ids = topk_ids(rng, T, E, k)
    assert_moe_spec(x, ids, E, fused.moe_sort_quantize(to_gpu(x), cp.asarray(ids), E, "mxfp4", dtype="bfloat16"))
    assert ops[-1] == (fused_kernels.OP_SCATTER if k <= 8 else fused_kernels.OP_GATHER)


@pytest.mark.parametrize("T, H, k, min_pairs", [(3300, 7168, 4, None), (1500, 2880, 8, 0), (1300, 1000, 8, 0),
                                              (900, 16384, 2, 0), (3300, 7168, 4, 10 ** 9)])
def test_gpu_moe_defaults(T, H, k, min_pairs, monkeypatch):
    """The launcher's defaults (MOE_STAGE 8 over 3 blocks an SM, pipelined rounds, lanes' groups,
    the rank sort from MOE_RANK_MIN_PAIRS)
    against the spec: 3300 tokens at hidden 7168 (13200 pairs: the rank sort by default; a
    second round in some blocks on a 132-SM GPU, loaded while the first is stored), and with the
    rank sort forced at hidden 2880 (lanes' groups), 1000 (rows not whole quads: the strided
    staged form) and 16384 (4 staged tokens a block: the shared-memory bound), or off
    (moe_sort's one launch: min_pairs past every size); inf and NaN groups. The general path,
    then the planned one (bit for bit the same)."""
    from nqdq import api
    from nqdq.gpu.fused import moe as KM

    if min_pairs is not None:
        monkeypatch.setattr(KM, "MOE_RANK_MIN_PAIRS", min_pairs)
    api.clear_fast_path()
    rng = np.random.default_rng(T + H)
    x = rows(rng, T, H, "bfloat16")
    x[7, 100], x[T - 1, H - 1], x[T // 2, 40] = np.inf, np.nan, -np.inf
    E = 256
    ids = topk_ids(rng, T, E, k, np.int32)
    xg, idg = to_gpu(x), cp.asarray(ids)
    first = fused.moe_sort_quantize(xg, idg, E, "mxfp4", dtype="bfloat16")
    assert fused._moe._MOE_FAST  # (remembered: the next call is the planned one)
    planned = fused.moe_sort_quantize(xg, idg, E, "mxfp4", dtype="bfloat16")
    assert_moe_spec(x, ids, E, first)
    assert_moe_same(first, planned)
    api.clear_fast_path()


@pytest.mark.parametrize("T, H, k, E, idt, bad", [
    (1, 7168, 8, 256, np.int32, False), (64, 7168, 8, 256, np.int64, False), (256, 7168, 8, 256, np.int32, True),
    (200, 2880, 4, 512, np.int32, False), (255, 1000, 8, 33, np.int32, True), (500, 16384, 4, 64, np.int32, False),
    (100, 7168, 4, 513, np.int32, False)])
def test_gpu_moe_local(T, H, k, E, idt, bad, monkeypatch):
    """The local path (no sort launch: each block of the staged rows counts every pair's bucket and
    finds its own pairs' rows) against the spec, the general path then the planned one: one
    token; decode sizes at hidden 7168, int64 ids; 2048 pairs (MOE_LOCAL_MAX_PAIRS) with ids
    out of range (sorted last, check_ids=False); 512 experts (513 buckets: the most it
    counts) at hidden 2880; hidden 1000 (the strided staged form); hidden 16384 (the stage cut
    to fit the local sort's shared memory); 513 experts: not taken (moe_sort, moe_rank)."""
    from nqdq import api
    from nqdq.gpu.fused import rows as FR
    from nqdq.gpu.fused import moe as KM
    from nqdq.gpu.fused import plan as KF

    ranks = []
    build = KF.fused_row_kernel

    def spy(*a, **kw):
        ranks.append(a[-1])
        return build(*a, **kw)

    monkeypatch.setattr(KF, "fused_row_kernel", spy)
    monkeypatch.setattr(KM, "MOE_RANK_MIN_PAIRS", 0)
    api.clear_fast_path()
    rng = np.random.default_rng(T + H + E)
    x = rows(rng, T, H, "bfloat16")
    x[0, 5], x[T - 1, H - 1] = np.inf, np.nan
    ids = topk_ids(rng, T, E, k, idt)
    if bad:
        ids[1, 0], ids[T // 2, k - 1], ids[T - 1, 1] = E, -1, E + 100
    xg, idg = to_gpu(x), cp.asarray(ids)
    first = fused.moe_sort_quantize(xg, idg, E, "mxfp4", dtype="bfloat16", check_ids=False)
    local = E + 1 <= 513
    assert ranks[-1] == (FR.RANK_LOCAL if local else FR.RANK_PACKED)
    (fm,) = fused._moe._MOE_FAST.values()
    assert len(fm.run.seq.entries) == (1 if local else 2)
    planned = fused.moe_sort_quantize(xg, idg, E, "mxfp4", dtype="bfloat16", check_ids=False)
    assert_moe_spec(x, ids, E, first)
    assert_moe_same(first, planned)
    if bad:  # by default the call checks the ids
        with pytest.raises(ValueError, match="must lie in"):
            fused.moe_sort_quantize(xg, idg, E, "mxfp4", dtype="bfloat16")
    api.clear_fast_path()


@pytest.mark.parametrize("T, k, E", [(300, 4, 256), (2100, 4, 1024), (3000, 1, 7)])
def test_gpu_moe_sort_quantize(T, k, E):
    """The device sort and gather against the spec: 5 chunks of pairs and 256 experts; 33
    chunks (the scan's columns 8 chunks at a time, then one) and the most experts (a scan
    block of 1024 threads, within its launch bound); 12 chunks of one expert of 7 per pair
    (many pairs of an expert in each warp of the scatter)."""
    rng = np.random.default_rng(4)
    H = 7168 if T <= 300 else 512
    x = rows(rng, T, H, "bfloat16")
    ids = topk_ids(rng, T, E, k, np.int32)
    if E > 8:
        ids[ids >= E - 8] = 3  # experts E-8.. empty
    assert_moe_spec(x, ids, E, fused.moe_sort_quantize(to_gpu(x), cp.asarray(ids), E, "mxfp4", dtype="bfloat16"))


@pytest.mark.parametrize("sort1", [True, False])
@pytest.mark.parametrize("T, k, E", [(1, 1, 1), (2048, 4, 256), (9000, 4, 256), (700, 8, 1024)])
def test_gpu_moe_sort_one_launch(T, k, E, sort1):
    """The sort alone (gpu.fused.moe.moe_sort: perm, offsets and inv) in one launch and in
    three, against the spec, with a few ids out of range: one pair; the bench's 32 chunks on
    32 blocks; 141 chunks on one block per SM (two chunks a block, some blocks none); 22
    chunks of 1025 buckets (five a thread). Twice in a row on one zeroed workspace, which the
    kernel leaves zero (the next call's barrier starts from it)."""
    from nqdq.gpu.fused import moe as KM
    from nqdq.gpu.runtime.interop import Allocator

    rng = np.random.default_rng(T + E)
    ids = rng.integers(0, E, (T, k)).astype(np.int32)
    if T > 1:
        ids[T // 3, 0], ids[T - 1, k - 1] = E, -5
    valid = (ids >= 0) & (ids < E)
    perm_ref = [p[1] for p in sorted((int(ids[i, j]) if valid[i, j] else E, i, j) for i in range(T) for j in range(k))]
    ws = cp.zeros(SYNC_WORDS, cp.int32)
    for _ in range(2):
        perm, off, inv = KM.moe_sort(cp.asarray(ids.reshape(-1)), T * k, k, E, Allocator("cupy"), ws=ws, one=sort1)
        np.testing.assert_array_equal(host(perm), perm_ref)
        off = host(off)
        counts = np.bincount(ids[valid], minlength=E)
        np.testing.assert_array_equal(off[: E + 1], np.concatenate([[0], np.cumsum(counts)]))
        assert off[E + 1] == T * k
        np.testing.assert_array_equal(host(perm)[host(inv)], np.arange(T * k) // k)
        np.testing.assert_array_equal(host(ws), 0)


def test_gpu_moe_sort_one_launch_partly_resident():
    """The one-launch sort (141 chunks of 9000 tokens top-4: one block per SM) while another
    grid holds all but FREE_SMS SMs (a block of all the shared memory an SM has on each,
    helpers.gpu.sm_hog), so only part of the sort's grid is resident at once, as under an MPS
    thread limit or beside another process's kernels. The other grid waits until the sort is
    done (a flag set by a kernel after it in the sort's stream), so a sort whose resident
    blocks waited for the rest (the grid barrier of an earlier version)
    would never end: the hog gives up after about two seconds and counts that. Here the
    resident blocks count the missing blocks' chunks themselves (_grid.mark_done): the sort
    ends, the hog never gives up, and perm, offsets, inv are the spec's, the workspace left
    zero."""
    from helpers.gpu import sm_hog

    from nqdq.gpu.fused import moe as KM
    from nqdq.gpu.runtime.interop import Allocator

    T, k, E = 9000, 4, 256
    ids = np.random.default_rng(28).integers(0, E, (T, k)).astype(np.int32)
    dev = cp.asarray(ids.reshape(-1))
    ws = cp.zeros(SYNC_WORDS, cp.int32)
    KM.moe_sort(dev, T * k, k, E, Allocator("cupy"), ws=ws, one=True)  # (compiled before the hog holds the SMs)
    st = cp.cuda.Stream(non_blocking=True)
    with sm_hog(st) as done:
        with st:
            perm, off, inv = KM.moe_sort(dev, T * k, k, E, Allocator("cupy"), ws=ws, one=True)
        done()
    perm_ref, off_ref = R.moe_sort(ids, E)
    np.testing.assert_array_equal(host(perm), perm_ref)
    np.testing.assert_array_equal(host(off)[: E + 1], off_ref)
    np.testing.assert_array_equal(host(perm)[host(inv)], np.arange(T * k) // k)
    np.testing.assert_array_equal(host(ws), 0)


@pytest.mark.parametrize("T, k, E", [(1, 1, 1), (2048, 4, 256), (9000, 4, 256), (700, 8, 1024), (40000, 8, 256)])
def test_gpu_moe_rank(T, k, E):
    """moe_rank_kernel alone against the spec: each pair's row from its packed rank and its
    chunk's base (as the rows kernel finds it) is the stable sort's, offsets the spec's, with a
    few ids out of range: one pair; 32 chunks of 256 pairs, 36 of 1024, 22 of 256 (1025
    buckets, five a thread) and 313 of 1024 (the last block's column walks 10 rounds of
    MOE_WALK loads). Twice in a row on one zeroed ticket, which the kernel leaves zero."""
    from nqdq.gpu.fused import kernels as fused_kernels
    from nqdq.gpu.fused import moe as KM
    from nqdq.gpu.runtime.interop import Allocator

    rng = np.random.default_rng(T + E + 1)
    ids = rng.integers(0, E, (T, k)).astype(np.int32)
    if T > 1:
        ids[T // 3, 0], ids[T - 1, k - 1] = E, -5
    valid = (ids >= 0) & (ids < E)
    inv_ref = np.empty(T * k, np.int64)  # the stable sort's row of each pair (bucket E: ids out of range)
    inv_ref[[p[1] * k + p[2] for p in sorted((int(ids[i, j]) if valid[i, j] else E, i, j)
                                             for i in range(T) for j in range(k))]] = np.arange(T * k)
    ws = cp.zeros(SYNC_WORDS, cp.int32)
    for _ in range(2):
        packed, cbase, off, _perm, csh = KM.moe_rank(cp.asarray(ids.reshape(-1)), T * k, E, Allocator("cupy"), ws=ws)
        assert csh == KM.rank_chunk_shift(T * k)
        packed, cbase, off = host(packed)[: T * k], host(cbase), host(off)
        p = np.arange(T * k)
        rows_ = (cbase[(p >> csh) * (E + 1) + (packed >> fused_kernels.MOE_RANK_SHIFT)]
                 + (packed & (fused_kernels.MOE_RANK_CHUNK - 1)))
        np.testing.assert_array_equal(rows_, inv_ref)
        counts = np.bincount(ids[valid], minlength=E)
        np.testing.assert_array_equal(off[: E + 1], np.concatenate([[0], np.cumsum(counts)]))
        assert off[E + 1] == T * k
        np.testing.assert_array_equal(host(ws), 0)


@pytest.mark.parametrize("stage, rank, local", [(4, 0, 0), (1, 0, 0), (4, 1, 0), (1, 1, 0), (4, 0, 1), (1, 0, 1)])
def test_gpu_moe_hot_path_streams_and_graph(stage, rank, local, monkeypatch):
    """The planned MoE call, its direct calls with the one-launch sort and its captured ones with
    the three-launch sort, each launch after the first its predecessor's programmatic dependent
    (cuLaunchKernelEx): on two streams at once (each stream its own workspace; check_ids on and
    off: the sort's polled word, and ids out of range a ValueError), and captured in a CUDA
    graph (check_ids=True there a RuntimeError; no workspace; the dependent launches
    programmatic edges) replayed on new ids and data; every result the spec's. MOE_STAGE 4 and
    1 (600 tokens over at most 4 blocks an SM, 1-2 a block: all staged, or at 1 some after the
    staged). The rank sort (MOE_RANK_MIN_PAIRS 0): the rank kernel then the rows, two launches
    direct or captured, its ticket the stream's workspace, or in a graph the call's own, zeroed
    by a memset node. The local path (MOE_LOCAL_MAX_PAIRS past the 2400 pairs; staged, 600
    tokens in one round: at 4 a block, and at 1 with 600 blocks an SM): the rows kernel alone,
    one launch direct or captured, no workspace."""
    from nqdq import api
    from nqdq.gpu.fused import moe as KM
    from nqdq.gpu.fused import plan as KF

    monkeypatch.setattr(KF, "MOE_STAGE", stage)
    monkeypatch.setattr(KM, "MOE_RANK_MIN_PAIRS", 0 if rank else 10 ** 9)
    monkeypatch.setattr(KM, "MOE_LOCAL_MAX_PAIRS", 10 ** 6 if local else 0)  # (2400 pairs)
    if local and stage == 1:
        monkeypatch.setattr(KF, "MOE_STAGE_BLOCKS", 600)
    api.clear_fast_path()
    rng = np.random.default_rng(16)
    T, H, k, E = 600, 512, 4, 64

    def data():
        x = rows(rng, T, H, "bfloat16")
        return x, rng.integers(0, E, (T, k)).astype(np.int32)

    x, ids = data()
    fused.moe_sort_quantize(to_gpu(x), cp.asarray(ids), E, "mxfp4", dtype="bfloat16")  # plans it
    (fm,) = fused._moe._MOE_FAST.values()
    kx = not local  # (one launch: no dependent)
    assert ("_KX(" in fm.run.seq.source) == kx and ("_KX(" in fm.run.seq_graph.source) == kx
    want = (1, 1) if local else (2, 2) if rank else (2, 4)
    assert (len(fm.run.seq.entries), len(fm.run.seq_graph.entries)) == want
    # check_ids=True: the same launches, the sort's report argument set (it writes
    # its id check to a polled word); the local path has no sort and reads offsets back
    assert (fm.run.seq_check is None) == local
    if not local:
        assert len(fm.run.seq_check.entries) == want[0] and "_KX(" in fm.run.seq_check.source
    bad = ids.copy()
    bad[T // 2, 1] = E + 3
    with pytest.raises(ValueError, match="expert_ids"):
        fused.moe_sort_quantize(to_gpu(x), cp.asarray(bad), E, "mxfp4", dtype="bfloat16")  # planned
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    cases = [[data() for _ in range(4)] for _ in streams]
    outs = [[], []]
    for i in range(4):
        for s, cs, o in zip(streams, cases, outs):
            with s:
                xh, ih = cs[i]
                o.append(fused.moe_sort_quantize(to_gpu(xh), cp.asarray(ih), E, "mxfp4", dtype="bfloat16",
                                                 check_ids=i % 2 == 0))
    for s in streams:
        s.synchronize()
    for cs, o in zip(cases, outs):
        for (xh, ih), got in zip(cs, o):
            assert_moe_spec(xh, ih, E, got)
    s = cp.cuda.Stream(non_blocking=True)
    xg, ig = to_gpu(x), cp.asarray(ids)
    with s:
        fused.moe_sort_quantize(xg, ig, E, "mxfp4", dtype="bfloat16", check_ids=False)  # warm s's pool
        s.synchronize()
        s.begin_capture()
        with pytest.raises(RuntimeError, match="check_ids=False"):  # (raised before any launch)
            fused.moe_sort_quantize(xg, ig, E, "mxfp4", dtype="bfloat16")
        got = fused.moe_sort_quantize(xg, ig, E, "mxfp4", dtype="bfloat16", check_ids=False)
        graph = s.end_capture()
    for _ in range(2):
        xh, ih = data()
        with s:
            xg[...] = to_gpu(xh)
            ig[...] = cp.asarray(ih)
            got[0].codes.fill(0xA5)
        graph.launch(s)
        s.synchronize()
        assert_moe_spec(xh, ih, E, got)
    api.clear_fast_path()


@pytest.mark.parametrize("n", [7168, 5120, 2880, 1100])
def test_gpu_group_scales_once_per_group(n):
    """Each 1x128 / MX-32 group's parameters computed once (by the lane the transposed
    butterfly leaves its amax on, and sent back by shfl.sync.idx), bit for bit against the spec
    at the tested hidden sizes (7 / 7 / 6 units a lane; 1100: a row that ends inside a group
    and a unit), groups of their own magnitude, non-finite groups, with and without the
    residual, and flatten into fp8_1x128."""
    rng = np.random.default_rng(n)
    x = rows(rng, 77, n, "bfloat16")
    x = (x * np.repeat(np.exp2(rng.integers(-6, 7, (77, -(-n // 32)))), 32, axis=1)[:, :n]).astype(BF16)
    res = rows(rng, 77, n, "bfloat16")
    x[3, 9], x[4, n - 1], x[5, 200] = np.inf, np.nan, -np.inf
    w = rng.standard_normal(n).astype(BF16)
    for scheme in ("fp8_1x128", "mxfp4"):
        sch = resolve_scheme(scheme)
        for r in (None, res):
            out = fused.rmsnorm_quantize(to_gpu(x), to_gpu(w), scheme, residual=None if r is None else to_gpu(r),
                                         dtype="bfloat16")
            parts, new_res = R.rmsnorm_quantize(x.astype(np.float32), w.astype(np.float32), sch, np.float32(1e-6),
                                                "bfloat16", "bfloat16",
                                                res32=None if r is None else r.astype(np.float32))
            codes, scales = ref_q(parts, sch)
            q = out if r is None else out[0]
            np.testing.assert_array_equal(bits(q.codes), bits(codes))
            np.testing.assert_array_equal(bits(q.scales), bits(scales))
            if r is not None:
                np.testing.assert_array_equal(bits(out[1]), bits(new_res))
    if n % 64 == 0:
        sch = resolve_scheme("fp8_1x128")
        x3 = x.reshape(77, 8, n // 8)
        codes, scales = ref_q(RQ.quantize(x.astype(np.float32), sch), sch)
        q = fused.flatten_quantize(to_gpu(x3), "fp8_1x128", dtype="bfloat16")
        np.testing.assert_array_equal(bits(q.codes), bits(codes))
        np.testing.assert_array_equal(bits(q.scales), bits(scales))


@pytest.mark.parametrize("case", ["words", "residual", "prefetch"])
def test_gpu_fused_row_paths(case, monkeypatch):
    """The row kernel's paths on a GPU, bit for bit against the spec at hidden 7168: "words"
    (flatten of a strided view into fp8_1x128 and MXFP4, and the MoE gather into MXFP4 by the
    words' pair encoder; a non-finite group in one row), "residual" (cvt.rn.bf16x2 for the new
    residual, with NaN, inf - inf, overflowing and subnormal sums: the intrinsic against its
    twin's rule; normalize's y by one fma.rn.f32 where a * r_hi is exact), "prefetch"
    (prefetch.global.L2 of rows 3 ahead for the static per-tensor output, no residual: a hint,
    the outputs must not change)."""
    from nqdq.gpu.fused import rows as FR

    rng = np.random.default_rng(31)
    if case == "words":
        x = rows(rng, 77 * 56, 128, "bfloat16").reshape(77, 56, 128)
        x[5, 3, 7] = np.inf
        view = to_gpu(np.ascontiguousarray(x.transpose(1, 0, 2))).transpose(1, 0, 2)
        for scheme in ("fp8_1x128", "mxfp4"):
            sch = resolve_scheme(scheme)
            codes, scales = ref_q(RQ.quantize(x.reshape(77, 56 * 128).astype(np.float32), sch), sch)
            q = fused.flatten_quantize(view, scheme, dtype="bfloat16")
            np.testing.assert_array_equal(bits(q.codes), bits(codes))
            np.testing.assert_array_equal(bits(q.scales), bits(scales))
        x2 = x.reshape(77, 7168)
        ids = topk_ids(rng, 77, 16, 2, np.int32)
        q, perm, _ = fused.moe_sort_quantize(to_gpu(x2), cp.asarray(ids), 16, "mxfp4", dtype="bfloat16")
        perm_ref, _ = R.moe_sort(ids, 16)
        sch = resolve_scheme("mxfp4")
        codes, scales = ref_q(RQ.quantize(x2.astype(np.float32)[perm_ref], sch), sch)
        np.testing.assert_array_equal(bits(q.codes), bits(codes))
        np.testing.assert_array_equal(bits(q.scales), bits(scales))
        return
    if case == "prefetch":  # (the launch argument only: the kernel is the default one)
        from nqdq import api

        api.clear_fast_path()  # (a remembered call of this shape would replay its plan's distance)
        monkeypatch.setattr(FR, "PREFETCH_TENSOR", 3)
        x = rows(rng, 77, 7168, "bfloat16")
        w = rng.standard_normal(7168).astype(BF16)
        sch = resolve_scheme("fp8_tensor", static_scale=True)
        q = fused.rmsnorm_quantize(to_gpu(x), to_gpu(w), "fp8_tensor", scale=STATIC, dtype="bfloat16")
        s = np.full(sch.scale_shape(x.shape), STATIC, np.float32)
        parts, _ = R.rmsnorm_quantize(x.astype(np.float32), w.astype(np.float32), sch, np.float32(1e-6), "bfloat16",
                                      "bfloat16", scale=s)
        codes, scales = ref_q(parts, sch)
        np.testing.assert_array_equal(bits(q.codes), bits(codes))
        np.testing.assert_array_equal(bits(q.scales), bits(scales))
        return
    x = rows(rng, 77, 7168, "bfloat16")
    res = rows(rng, 77, 7168, "bfloat16")
    x[3, 9], res[3, 9] = np.inf, -np.inf
    x[4, 100] = np.nan
    x[5, 17], res[5, 17] = 3e38, 3e38
    x[6, 20], res[6, 20] = 1e-39, 2e-39
    x[7, :], res[7, :] = 1e-39, -3e-39  # a row of subnormal sums
    w = rng.standard_normal(7168).astype(BF16)
    for scheme in ("fp8_row", "mxfp4"):
        sch = resolve_scheme(scheme)
        q, new = fused.rmsnorm_quantize(to_gpu(x), to_gpu(w), scheme, residual=to_gpu(res), dtype="bfloat16")
        parts, new_res = R.rmsnorm_quantize(x.astype(np.float32), w.astype(np.float32), sch, np.float32(1e-6),
                                            "bfloat16", "bfloat16", res32=res.astype(np.float32))
        codes, scales = ref_q(parts, sch)
        np.testing.assert_array_equal(bits(q.codes), bits(codes))
        np.testing.assert_array_equal(bits(q.scales), bits(scales))
        np.testing.assert_array_equal(bits(new), bits(new_res))


def _q_arrays(out):
    """The arrays of a fused op's result (a QuantizedTensor, an array, or a tuple of them)."""
    got = []
    for o in out if isinstance(out, tuple) else (out,):
        got += [o.codes, o.scales] if hasattr(o, "codes") else [o]
    return got


HOT_CALLS = ["rmsnorm_quantize fp8_row", "rmsnorm_quantize fp8_row +res", "rmsnorm_quantize fp8_tensor",
             "rmsnorm_quantize fp8_1x128 +res", "rmsnorm_quantize mxfp4", "rmsnorm_quantize mxfp4 +res", "rmsnorm +res",
             "flatten_quantize fp8_1x128", "flatten_quantize fp8_1x128 strided"]


@pytest.mark.parametrize("name", HOT_CALLS)
def test_gpu_fused_hot_path(name):
    """Every fused row op's hot path (fused._ROWS_FAST): the repeated call gives the first
    (general) call's bits, its outputs in one allocation, on the current stream (a second
    stream, then a CUDA graph replayed on new data); a 16-byte misaligned x goes the general way
    with the same bits. The shapes and schemes are test_gpu_rmsnorm_quantize_matches_reference's
    and test_gpu_flatten_quantize's (their kernels compiled once)."""
    fused._ROWS_FAST.clear()
    rng = np.random.default_rng(21)
    x = rows(rng, 77, 7168, "bfloat16")
    w = rng.standard_normal(7168).astype(BF16)
    res = rows(rng, 77, 7168, "bfloat16")
    x3 = rows(rng, 77 * 56, 128, "bfloat16").reshape(77, 56, 128)
    op, scheme, *rest = name.split()
    wg = to_gpu(w)  # (made once: no copy to the device inside the graph capture below)
    kw = {"residual": to_gpu(res)} if "+res" in rest else {}
    if scheme == "fp8_tensor":
        kw["scale"] = STATIC

    def call(xg):
        if op == "rmsnorm":
            return fused.rmsnorm(xg, wg, dtype="bfloat16", **kw)
        if op == "rmsnorm_quantize":
            return fused.rmsnorm_quantize(xg, wg, scheme, dtype="bfloat16", **kw)
        return fused.flatten_quantize(xg, scheme, dtype="bfloat16")

    if op == "flatten_quantize":
        xg = to_gpu(x3)
        if "strided" in rest:
            xg = to_gpu(np.ascontiguousarray(x3.transpose(1, 0, 2))).transpose(1, 0, 2)
    else:
        xg = to_gpu(x)
    first = call(xg)
    assert len(fused._ROWS_FAST) == 1
    hot = call(xg)
    assert len(fused._ROWS_FAST) == 1
    for a, b in zip(_q_arrays(first), _q_arrays(hot)):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(bits(a), bits(b))
    assert len({a.data.mem for a in _q_arrays(hot)}) == 1  # one allocation
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        on_stream = call(xg)
    s.synchronize()
    for a, b in zip(_q_arrays(first), _q_arrays(on_stream)):
        np.testing.assert_array_equal(bits(a), bits(b))
    if name == "rmsnorm_quantize fp8_row":  # (one case: the unaligned kernel compiles anew)
        flat = cp.empty(x.size + 1, cp.uint16)
        xm = flat[1:].reshape(x.shape)  # 2 bytes past an aligned address: the general path
        xm[...] = xg
        for a, b in zip(_q_arrays(first), _q_arrays(call(xm))):
            np.testing.assert_array_equal(bits(a), bits(b))
    if op != "flatten_quantize":  # captured in a CUDA graph, replayed on new data in the same input array
        g_stream = cp.cuda.Stream(non_blocking=True)
        with g_stream:
            g_stream.begin_capture()
            captured = call(xg)
            graph = g_stream.end_capture()
        x2 = rows(np.random.default_rng(22), 77, 7168, "bfloat16")
        with g_stream:  # (on the replay's stream: a non-blocking stream does not wait for the null stream)
            xg[...] = to_gpu(x2)
        graph.launch(g_stream)
        g_stream.synchronize()
        want = call(xg)
        for a, b in zip(_q_arrays(want), _q_arrays(captured)):
            np.testing.assert_array_equal(bits(a), bits(b))
    fused._ROWS_FAST.clear()
