"""nqdq.matmul's hot path: the remembered runner of a repeated GPU call.

In the simulator (NumPy operands with ``device="cuda"``) the runners are remembered and
keyed as on a GPU, and launch the same sequence of kernels through Numba: a second call
skips ``_matmul`` and returns the first call's bits; any change of a key element goes the
general way again (and bad arguments still raise there). Without a GPU, the GPU runner's
plumbing is checked with stand-ins: the launch sequence packs the parameters
``PreparedGemm`` would (``sequence.compile_sequence`` with recorded launches), and the runner
hands it each array's address. tests/test_matmul_gpu.py repeats the bit check on a GPU.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from numba import types

import nqdq
import nqdq.matmul  # noqa: F401  (the module: nqdq.matmul is also the function's name)
from nqdq.gpu.gemm import plan as kg
from nqdq.gpu.runtime.target import SIMULATOR
from nqdq.schemes import resolve_scheme

from helpers.gemm import SCHEME_PAIRS
from helpers.launch import FakeCupyArray, fake_entry, record_launches

MM = sys.modules["nqdq.matmul"]
sim_only = pytest.mark.skipif(not SIMULATOR, reason="NumPy operands get runners in the simulator only")


@pytest.fixture
def runners(monkeypatch):
    """A clean runner cache, and the list of calls that reached the general path."""
    MM.clear_hot_path()
    general = []
    slow = MM._matmul

    def counted(*args, **kw):
        general.append(args[:2])
        return slow(*args, **kw)

    monkeypatch.setattr(MM, "_matmul", counted)
    yield general
    MM.clear_hot_path()


def operands(M, N, K, sa, sb):
    rng = np.random.default_rng([M, N, K])
    x = rng.standard_normal((M, K)).astype(np.float32)
    x[:, ::7] *= 4
    w = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)
    return nqdq.quantize(x, sa), nqdq.quantize(w, sb)


def bits(a):
    return np.ascontiguousarray(np.asarray(a)).view(np.uint8)


# ----------------------------------------------------------------------------- the simulator
@sim_only
@pytest.mark.parametrize("sa,sb", SCHEME_PAIRS)
@pytest.mark.parametrize("kw", [{}, {"out_dtype": "bfloat16", "activation": "gelu", "alpha": 0.5, "bias": True},
                                {"out_dtype": "float16", "activation": "relu", "bias": True}],
                         ids=["plain", "bf16-gelu-bias", "f16-relu-bias"])  # fmt: skip
def test_second_call_takes_the_runner_with_the_first_calls_bits(runners, sa, sb, kw):
    rng = np.random.default_rng(70)
    M, N, K = 3, 16, 128
    qa, qb = operands(M, N, K, sa, sb)
    kw = dict(kw)
    if kw.pop("bias", False):
        kw["bias"] = rng.standard_normal(N).astype(np.float32)
    first = nqdq.matmul(qa, qb, device="cuda", **kw)
    assert len(runners) == 1 and len(MM._RUNNERS) == 1
    second = nqdq.matmul(qa, qb, device="cuda", **kw)
    assert len(runners) == 1  # no second trip through the checks
    assert second.dtype == first.dtype and second.shape == (M, N) and second.flags.c_contiguous
    np.testing.assert_array_equal(bits(second), bits(first))
    # new codes and scales of the same kind: the same runner, the new operands' product
    qa2, qb2 = operands(M, N, K, sa, sb)
    third = nqdq.matmul(qa2, qb2, device="cuda", **kw)
    assert len(runners) == 1
    MM.clear_hot_path()
    np.testing.assert_array_equal(bits(third), bits(nqdq.matmul(qa2, qb2, device="cuda", **kw)))


@sim_only
def test_every_key_element_misses(runners):
    rng = np.random.default_rng(91)
    M, N, K = 2, 16, 64
    qa, qb = operands(M, N, K, "fp8_row", "fp8_row")
    nqdq.matmul(qa, qb, device="cuda")
    nqdq.matmul(qa, qb, device="cuda")
    assert len(runners) == 1
    bias = rng.standard_normal(N).astype(np.float32)
    qa_e5, _ = operands(M, N, K, "e5m2", "fp8_row")
    qa_m3, _ = operands(3, N, K, "fp8_row", "fp8_row")
    codes_f = np.asfortranarray(qa.codes)  # the same values, not C-contiguous
    variants = [
        ((qa, qb), dict(out_dtype="float16")),
        ((qa, qb), dict(activation="relu")),
        ((qa, qb), dict(alpha=0.5)),
        ((qa, qb), dict(alpha=np.float32(1.0))),  # equal, of another type: a key of its own
        ((qa, qb), dict(alpha=1)),
        ((qa, qb), dict(bias=bias)),
        ((qa, qb), dict(bias=bias.astype(np.float64))),  # converted per call: never remembered
        ((qa_e5, qb), {}),  # another scheme
        ((qa_m3, qb), {}),  # another shape
        ((replace(qa, codes=codes_f), qb), {}),
        ((qa, qb), dict(device=None)),  # NumPy operands: the CPU reference
    ]
    remembered = []
    for (a, b), kw in variants:
        kw.setdefault("device", "cuda")
        before = len(runners)
        got = nqdq.matmul(a, b, **kw)
        assert len(runners) == before + 1, kw  # a miss
        again = nqdq.matmul(a, b, **kw)
        remembered.append(len(runners) == before + 1)
        np.testing.assert_array_equal(bits(again), bits(got))
    assert remembered == [True] * 6 + [False] + [True] * 2 + [False] * 2  # not: converted bias, F-order codes, CPU
    assert len(MM._RUNNERS) == 9  # all but the float64 bias and the CPU call
    want = nqdq.matmul(qa, qb, device="cuda")
    np.testing.assert_array_equal(bits(nqdq.matmul(replace(qa, codes=codes_f), qb, device="cuda")), bits(want))


@sim_only
def test_bad_arguments_still_raise_after_a_remembered_call(runners):
    M, N, K = 2, 16, 64
    qa, qb = operands(M, N, K, "int8_row", "int8_row")
    bias = np.zeros(N, np.float32)
    for alpha in (1.0, 1):
        nqdq.matmul(qa, qb, device="cuda", alpha=alpha, bias=bias)
        nqdq.matmul(qa, qb, device="cuda", alpha=alpha, bias=bias)
    assert len(MM._RUNNERS) == 2
    qf, _ = operands(M, N, K, "fp8_row", "fp8_row")
    _, qb_k = operands(M, N, 80, "int8_row", "int8_row")
    cases = [
        (TypeError, "alpha", (qa, qb), dict(alpha=True, bias=bias)),  # True == 1 == 1.0 in a dict key
        (TypeError, "alpha", (qa, qb), dict(alpha=float("nan"), bias=bias)),
        (ValueError, "activation", (qa, qb), dict(activation="tanh", bias=bias)),
        (ValueError, "bias must have shape", (qa, qb), dict(bias=np.zeros(N + 1, np.float32))),
        (TypeError, "bias must be a float", (qa, qb), dict(bias=np.zeros(N, np.int32))),
        (ValueError, "scale_layout", (replace(qa, scale_layout="nv_128x4"), qb), dict(bias=bias)),
        (TypeError, "QuantizedTensor", (qa.codes, qb), dict(bias=bias)),
        (ValueError, "disagree on K", (qa, qb_k), dict(bias=bias)),
        (ValueError, "pairs int8 with int8", (qf, qb), dict(bias=bias)),
        (TypeError, "out_dtype", (qa, qb), dict(out_dtype="int8", bias=bias)),
    ]
    for exc, match, (a, b), kw in cases:
        with pytest.raises(exc, match=match):
            nqdq.matmul(a, b, device="cuda", **kw)


@sim_only
def test_scales_expanded_per_call_and_padded_k_stay_on_the_general_path(runners):
    """Scales constant along K but shared by 2 rows (expanded to one per row per call), and
    K = 40 (padded to 48 per call): computed, never remembered."""
    rng = np.random.default_rng(158)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    w = rng.standard_normal((16, 64)).astype(np.float32)
    qb_rows = nqdq.quantize(w, "int8", granularity="block", block_shape=(2, 64))
    assert tuple(qb_rows.scheme.block_for((16, 64))) == (2, 64)
    pairs = [(nqdq.quantize(x, "int8_row"), qb_rows), operands(2, 16, 40, "int8_row", "int8_row")]
    for qa, qb in pairs:
        want = nqdq.matmul(qa, qb, device="cpu")
        for _ in range(2):
            got = nqdq.matmul(qa, qb, device="cuda")
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert len(runners) == 6 and not MM._RUNNERS  # (with the CPU calls)


@sim_only
def test_remembered_runners_are_bounded(runners, monkeypatch):
    monkeypatch.setattr(MM, "_RUNNERS_MAX", 2)
    _, qb = operands(1, 16, 32, "fp8_tensor", "fp8_tensor")
    qas = [operands(m, 16, 32, "fp8_tensor", "fp8_tensor")[0] for m in (1, 2, 3)]
    for qa in qas:
        nqdq.matmul(qa, qb, device="cuda")
    assert len(MM._RUNNERS) == 2
    assert [k[3] for k in MM._RUNNERS] == [(2, 32), (3, 32)]  # the oldest dropped
    nqdq.matmul(qas[0], qb, device="cuda")
    assert len(runners) == 4  # (1, 32) went the general way again


# ----------------------------------------------------------------------------- the GPU plumbing
def _entries_for(spec, asym):
    gemm_entry = fake_entry(kg.kernel_signature(spec), 1001, "gemm")
    if not asym:
        return [gemm_entry]
    rows = fake_entry((types.Array(types.int8, 1, "C"), types.int64, types.int64, types.Array(types.int32, 1, "C")),
                       1000, "row_sums_i8")  # fmt: skip
    return [rows, gemm_entry]


@pytest.mark.parametrize("sa_mode,sb_mode,mma,asym,bias", [
    ("row", "row", "s8s8", False, False),
    ("row", "row", "u8s8", True, True),
    ("tensor", "tensor", "u8s8", True, False),
    ("block", "block", "e4m3.e4m3", False, True),
    ("tensor", "row", "e5m2.e4m3", False, False),
])  # fmt: skip
def test_gemm_sequence_packs_the_launchers_arguments(monkeypatch, sa_mode, sb_mode, mma, asym, bias):
    """The sequence's parameters, at the addresses a call gives, are the bytes the general
    packer makes of PreparedGemm's arguments at those addresses (sizes by mode; the column
    sums of an asymmetric A 256-aligned past the output, written by a first launch; the
    parameters the spec does not read point at the output), on the call's stream."""
    M, N, K = 5, 200, 384
    plan = kg.plan_gemm(M, N, K, mma=mma, sa_mode=sa_mode, sb_mode=sb_mode, asym=asym, bias=bias,
                        out_dtype="bfloat16", activation="gelu")  # fmt: skip
    entries = _entries_for(plan.spec, asym)
    launched = record_launches(monkeypatch, entries)
    seq = kg.gemm_sequence(M, N, K, mma=mma, sa_mode=sa_mode, sb_mode=sb_mode, asym=asym, bias=bias, alpha=0.75,
                           out_dtype="bfloat16", activation="gelu", entries=entries)  # fmt: skip
    at = dict(codes_a=0x10000, codes_b=0x20000, scales_a=0x30000, scales_b=0x40000, zeros_a=0x50000 if asym else 0,
              bias=0x60000 if bias else 0, out=0x70000)  # fmt: skip
    assert tuple(at) == kg.SEQUENCE_ARGS
    seq.run(99, *at.values())
    colsum_at = -(-M * N * 2 // 256) * 256
    assert seq.nbytes == (colsum_at + 4 * N if asym else M * N * 2)
    assert seq.out_dtype == (ml_dtypes.bfloat16 if SIMULATOR else np.uint16)  # (GPU arrays hold the bits)
    kb = -(-K // 128)
    n_sa = {"tensor": 1, "row": M, "block": M * kb}[sa_mode]
    n_sb = {"tensor": 1, "row": N, "block": -(-N // 128) * kb}[sb_mode]

    def arr(n, dt, name, off=0):
        return FakeCupyArray((n,), dt, at[name] + off)

    colsum = arr(N, np.int32, "out", colsum_at) if asym else arr(1, np.int32, "out")
    args = (arr(M * K, np.uint8, "codes_a"), arr(N * K, np.uint8, "codes_b"), M, N, K,
            arr(n_sa, np.float32, "scales_a"), arr(n_sb, np.float32, "scales_b"),
            arr(n_sa, np.uint8, "zeros_a") if asym else arr(1, np.uint8, "out"), colsum,
            arr(N, np.float32, "bias") if bias else arr(1, np.float32, "out"), np.float32(0.75),
            arr(M * N, np.uint16, "out"))  # fmt: skip
    want = [(entries[-1], (plan.grid, 1, 1, plan.cfg.threads, 1, 1, plan.cfg.smem_bytes, 99), args)]
    if asym:
        want.insert(0, (entries[0], ((N + 127) // 128, 1, 1, 128, 1, 1, 0, 99),
                        (arr(N * K, np.int8, "codes_b"), N, K, colsum)))  # fmt: skip
    assert len(launched) == len(want)
    for (head, data), (entry, dims, args) in zip(launched, want):
        buf = bytearray(entry.struct.size)
        entry.pack(buf, args)
        assert head == (entry.handle, *dims)
        assert data == bytes(buf)


def test_gemm_sequence_declines_padding_and_empty_outputs():
    for M, N, K in ((4, 16, 40), (0, 16, 64), (4, 0, 64)):
        assert kg.gemm_sequence(M, N, K, mma="s8s8", sa_mode="row", sb_mode="row") is None


class _Mem:
    def __init__(self, ptr, device_id=0):
        self.ptr, self.device_id = ptr, device_id


def _gpu_array(shape, dtype, ptr):
    a = FakeCupyArray(shape, dtype, ptr)
    a.data = _Mem(ptr)
    return a


def test_gpu_runner_hands_the_sequence_every_address(monkeypatch):
    """The CuPy runner: one allocation (_alloc_out, of the sequence's bytes, on the runner's
    GPU), the current stream of that GPU, each operand's address; nothing else."""
    seen = []
    seq = kg.GemmSequence(lambda *a: seen.append(a), 4096, np.dtype(np.float32), None)
    monkeypatch.setattr(MM, "_alloc_out", lambda shape, dt, n, dev: (("out", shape, dt, n, dev), 0xB000))
    monkeypatch.setattr(MM, "_cupy_stream", lambda dev: _Mem(0x5700 + dev))
    sch = resolve_scheme("int8_asym")
    qa = nqdq.QuantizedTensor(_gpu_array((4, 64), np.uint8, 0x1000), _gpu_array((4, 1), np.float32, 0x2000), sch,
                              (4, 64), "float32", zero_points=_gpu_array((4, 1), np.uint8, 0x3000))  # fmt: skip
    qb = nqdq.QuantizedTensor(_gpu_array((8, 64), np.int8, 0x4000), _gpu_array((8, 1), np.float32, 0x5000),
                              resolve_scheme("int8_row"), (8, 64), "float32")  # fmt: skip
    bias = _gpu_array((8,), np.float32, 0x6000)
    for asym, b in ((True, bias), (False, None)):
        seen.clear()
        out = MM._gpu_runner(seq, (4, 8), asym, b is not None, 1)(qa, qb, b)
        assert out == ("out", (4, 8), np.dtype(np.float32), 4096, 1)
        assert seen == [(0x5701, 0x1000, 0x4000, 0x2000, 0x5000, 0x3000 if asym else 0, 0x6000 if b else 0, 0xB000)]
    facts = MM._cupy_facts(qa.codes)
    assert facts == ((4, 64), np.dtype(np.uint8), True, 0)

