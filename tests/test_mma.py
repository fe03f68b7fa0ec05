"""The tensor-core intrinsics (nqdq.gpu.ptx.mma): twins vs NumPy, and PTX assembly.

* In the simulator (CI) the per-lane twins run: one warp stages A [16, 32] and B [8, 32]
  through ``cp_async16`` into shared memory, reads fragments with ``ldmatrix_x4`` and
  multiplies with the ``mma`` stub; every lane writes its D fragment to its documented
  place. The result must equal NumPy's ``A @ B.T`` exactly (int8: exact int32 sums; fp8:
  32 exact products summed in float64, rounded once to float32, which is what the twin
  does). The same kernel runs on a GPU in tests/test_matmul_gpu.py against the same NumPy
  result: twin and hardware agree through it.
* Every GEMM kernel variant is compiled to PTX by numba-cuda for sm_89, sm_90 and sm_90a
  and assembled by nvJitLink (in a subprocess: the simulator is on in this process); the
  wgmma kernels for sm_90a, checking ptxas did not serialise the wgmma's (warning C7509).
* The mbarrier stubs (the wgmma ring's synchronisation) through a probe kernel whose
  outputs are worked out by hand (``mbarrier_expected``); the same probe runs on the GPU
  in tests/test_matmul_gpu.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from numba import cuda, int32, uint8

from nqdq.gpu.ptx import mma as _mma

FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


WAIT_ALL = _mma.cp_async_wait(0)  # a PTX immediate: one stub per count, taken outside the kernel


def make_mma_probe(mma):
    """A one-warp kernel: D = A @ B.T for A [16, 32], B [8, 32] uint8 bytes, through
    cp.async -> shared -> ldmatrix -> mma; D written from each lane's fragment."""

    @cuda.jit
    def probe(a, b, d):
        sm = cuda.shared.array(1024, uint8)  # A rows at 0 (32 bytes each), B rows at 512
        lane = cuda.threadIdx.x
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
        d0, d1, d2, d3 = mma(a0, a1, a2, a3, b0, b1, d[0], d[0], d[0], d[0])  # C = d[0] = 0
        g = lane >> 2
        t = lane & 3
        cuda.syncthreads()
        d[g * 8 + 2 * t] = d0
        d[g * 8 + 2 * t + 1] = d1
        d[(g + 8) * 8 + 2 * t] = d2
        d[(g + 8) * 8 + 2 * t + 1] = d3

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


def run_probe(kind):
    a, b, want = mma_operands(kind)
    d = np.zeros(16 * 8, np.int32 if kind in ("s8s8", "u8s8") else np.float32)
    make_mma_probe(mma_stub(kind))[1, 32](a, b, d)
    return d.reshape(16, 8), want


@pytest.mark.parametrize("kind", MMA_CASES)
def test_mma_twin_matches_numpy(kind):
    got, want = run_probe(kind)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)  # exact: see the module docstring


def test_twin_cp_async_zero_fills():
    sm = np.full(32, 7, np.uint8)
    g = np.arange(32, dtype=np.uint8)
    _mma.cp_async16(sm, 16, g, 0, 0)
    _mma.cp_async16(sm, 0, g, 16, 16)
    np.testing.assert_array_equal(sm, np.r_[np.arange(16, 32), np.zeros(16)].astype(np.uint8))


# ----------------------------------------------------------------------------- mbarriers
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
            _mma.mbarrier_init(sm, 1024, MBAR_THREADS)
            _mma.mbarrier_init(sm, 1032, MBAR_THREADS)
        cuda.syncthreads()
        _mma.cp_async16(sm, 16 * t, src, 16 * t, 16)
        _mma.cp_async_mbarrier_arrive(sm, 1024)
        while not _mma.mbarrier_try_wait(sm, 1024, 0):
            pass
        u = MBAR_THREADS - 1 - t
        for i in range(16):
            out[t, i] = sm[16 * u + i]
        out[t, 16] = 1 if _mma.mbarrier_try_wait(sm, 1024, 1) else 0
        for ph in range(2):
            _mma.mbarrier_arrive(sm, 1032)
            while not _mma.mbarrier_try_wait(sm, 1032, ph):
                pass
        out[t, 17] = 1 if _mma.mbarrier_try_wait(sm, 1032, 0) else 0
        out[t, 18] = 1 if _mma.mbarrier_try_wait(sm, 1032, 1) else 0

    return probe


def mbarrier_expected(src):
    """What ``make_mbarrier_probe`` must write for ``src`` (64 x 16 bytes)."""
    want = np.zeros((MBAR_THREADS, 19), np.int32)
    want[:, :16] = src.reshape(MBAR_THREADS, 16)[::-1]
    want[:, 18] = 1
    return want


def test_mbarrier_twins_probe():
    rng = np.random.default_rng(164)
    src = rng.integers(0, 256, MBAR_THREADS * 16, dtype=np.uint8)
    out = np.full((MBAR_THREADS, 19), -1, np.int32)
    make_mbarrier_probe()[1, MBAR_THREADS](src, out)
    np.testing.assert_array_equal(out, mbarrier_expected(src))


def test_mbarrier_twin_phase_parity():
    sm = np.zeros(8, np.uint8)
    _mma.mbarrier_init(sm, 0, 1)
    _mma.mbarrier_arrive(sm, 0)  # completes phase 0, reloads the count
    assert _mma.mbarrier_try_wait(sm, 0, 0) and not _mma.mbarrier_try_wait(sm, 0, 1)
    _mma.mbarrier_arrive(sm, 0)
    assert _mma.mbarrier_try_wait(sm, 0, 1) and not _mma.mbarrier_try_wait(sm, 0, 0)


# ----------------------------------------------------------------------------- PTX assembly
_COMPILE_SCRIPT = r"""
import json, re, sys
from nqdq.gpu import gemm as kg
from nqdq.gpu.gemm.mma_sync import (ACT_GELU, ACT_NONE, ACT_RELU, OUT_BF16, OUT_F16, OUT_F32, SCALE_BLOCK,
                                        SCALE_ROW, SCALE_TENSOR, GemmSpec)
specs = [
    ("s8s8", SCALE_ROW, SCALE_ROW, OUT_F32, ACT_GELU, True, False),
    ("u8s8", SCALE_ROW, SCALE_TENSOR, OUT_BF16, ACT_RELU, False, True),
    ("e4m3.e4m3", SCALE_ROW, SCALE_ROW, OUT_F16, ACT_NONE, True, False),
    ("e4m3.e5m2", SCALE_TENSOR, SCALE_ROW, OUT_F32, ACT_NONE, False, False),
    ("e5m2.e4m3", SCALE_ROW, SCALE_TENSOR, OUT_BF16, ACT_NONE, False, False),
    ("e5m2.e5m2", SCALE_TENSOR, SCALE_TENSOR, OUT_F32, ACT_NONE, False, False),
    ("e4m3.e4m3", SCALE_BLOCK, SCALE_BLOCK, OUT_BF16, ACT_NONE, False, False),
]
out = []
for cc in [(8, 9), (9, 0), (9, 0, "a")]:
    for mma, sa, sb, o, act, bias, asym in specs:
        spec = GemmSpec(mma=mma, sa_mode=sa, sb_mode=sb, out=o, act=act, bias=bias, asym=asym)
        ptx = kg.compile_ptx(spec, cc)
        cubin, log = kg.assemble(ptx, cc)
        target = re.search(r"^\.target\s+(\S+)", ptx, re.M).group(1)
        mmas = sorted(set(re.findall(r"mma\.sync\.aligned\.m16n8k32\.row\.col\.[a-z0-9.]+", ptx)))
        regs = re.search(r"[Uu]sed (\d+) registers", log)
        spill = re.search(r"(\d+) bytes spill stores", log)
        out.append(dict(cc=list(cc), mma=mma, block=sa == SCALE_BLOCK, target=target, mmas=mmas,
                        ldmatrix=ptx.count("ldmatrix.sync.aligned.m8n8.x4.shared.b16"),
                        cp_async=ptx.count("cp.async.cg.shared.global"), cubin=len(cubin),
                        regs=int(regs.group(1)) if regs else None, spill=int(spill.group(1)) if spill else None))
wg_specs = [
    ("s8s8", SCALE_ROW, SCALE_ROW, OUT_BF16, ACT_NONE, False, False),
    ("u8s8", SCALE_ROW, SCALE_ROW, OUT_F32, ACT_GELU, True, True),
    ("e5m2.e4m3", SCALE_ROW, SCALE_TENSOR, OUT_F16, ACT_NONE, False, False),
    ("e4m3.e4m3", SCALE_BLOCK, SCALE_BLOCK, OUT_BF16, ACT_NONE, False, False),
]
for k, (mma, sa, sb, o, act, bias, asym) in enumerate(wg_specs + wg_specs[:3:2]):
    spec = GemmSpec(mma=mma, sa_mode=sa, sb_mode=sb, out=o, act=act, bias=bias, asym=asym)
    cfg = kg.wgmma_config_for(spec, None if k < len(wg_specs) else (2048, 7168))  # + small outputs' tiles
    ptx = kg.compile_ptx(spec, (9, 0, "a"), config=cfg)
    cubin, log = kg.assemble_lto(spec, cfg)  # as Numba links it (setmaxnreg)
    spill = re.search(r"(\d+) bytes spill stores", log)
    out.append(dict(cc=[9, 0, "a"], mma=mma, n=cfg.n, persistent=cfg.persistent, wgmma=sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.[a-z0-9.]+", ptx))),
                    serialized="C7509" in log, cubin=len(cubin), spill=int(spill.group(1)) if spill else None))
print(json.dumps(out))
"""


def _compile_rows(script):
    """Run ``script`` in a fresh interpreter outside the CUDA simulator (it compiles and
    assembles without a GPU) and return the JSON rows it prints last."""
    pytest.importorskip("cuda.bindings.nvjitlink")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_gemm_kernels_assemble_for_sm89_sm90_sm90a():
    rows = _compile_rows(_COMPILE_SCRIPT)
    assert len(rows) == 27
    for i, row in enumerate(rows[21:]):  # the sm_90a wgmma kernels (default tiles: int8 128 x 256,
        # fp8 row 128 x 192, fp8 block 128 x 128; m64nNk32 per warpgroup; the last two: the
        # 128 x 128 persistent tiles of smaller outputs, int8 and fp8 row)
        want = {"s8s8": "s32.s8.s8", "u8s8": "s32.u8.s8"}.get(row["mma"]) or f"f32.{row['mma']}"
        n = 128 if i >= 4 else {"s8s8": 256, "u8s8": 256, "e5m2.e4m3": 192, "e4m3.e4m3": 128}[row["mma"]]
        assert row["n"] == n and row["persistent"] == (row["mma"] not in ("s8s8", "u8s8") or i >= 4), row
        assert row["wgmma"] == [f"wgmma.mma_async.sync.aligned.m64n{row['n']}k32.{want}"], row
        assert not row["serialized"] and row["spill"] == 0 and row["cubin"] > 0, row
    for row in rows[:21]:
        cc = row["cc"]
        assert row["target"] == f"sm_{cc[0]}{cc[1]}" + (cc[2] if len(cc) > 2 else ""), row
        want = "s32.s8.s8.s32" if row["mma"] == "s8s8" else "s32.u8.s8.s32" if row["mma"] == "u8s8" \
            else f"f32.{row['mma']}.f32"  # fmt: skip
        assert row["mmas"] == [f"mma.sync.aligned.m16n8k32.row.col.{want}"], row
        # 128 x 128 x 64 tile: per 64 of K, 2 k-steps x (4 A + 2 B) ldmatrix, 2 x 16 mma
        assert row["ldmatrix"] >= 12 and row["cp_async"] >= 4 and row["cubin"] > 0, row
        # the mma.sync fp8-block kernel keeps two 64-float accumulator sets and sits at the
        # 255-register limit: a few bytes of spill there; none anywhere else
        assert row["spill"] <= (16 if row["block"] else 0), row


_WS_SCRIPT = r"""
import json, re
from nqdq.gpu import gemm as kg
from nqdq.gpu.gemm.mma_sync import ACT_NONE, GemmSpec, OUT_BF16, SCALE_BLOCK, SCALE_ROW
out = []
for n, stages, sm in [(192, 4, SCALE_ROW), (128, 6, SCALE_BLOCK)]:
    spec = GemmSpec(mma="e4m3.e4m3", sa_mode=sm, sb_mode=sm, out=OUT_BF16, act=ACT_NONE, bias=False, asym=False)
    cfg = kg.WgmmaConfig(n=n, stages=stages, mbarrier=True, producer=True)
    ptx = kg.compile_ptx(spec, (9, 0, "a"), config=cfg)
    cubin, log = kg.assemble_lto(spec, cfg)
    spill = re.search(r"(\d+) bytes spill stores", log)
    regs = re.search(r"Used (\d+) registers", log)
    out.append(dict(n=n, maxntid=re.findall(r"\.maxntid\s+(\d+)", ptx), setmaxnreg=re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32 \d+", ptx),
                    bars=sorted(set(re.findall(r"bar\.sync\s+1, \d+", ptx))), ignored="C7504" in log, cubin=len(cubin),
                    spill=int(spill.group(1)) if spill else None, regs=int(regs.group(1)) if regs else None))
print(json.dumps(out))
"""


def test_warp_specialised_gemm_assembles_without_spills():
    """The producer / consumer wgmma kernels (fp8 row 128 x 192, block 128 x 128), linked as
    Numba links them on a GPU (LTO, whole program): 384 threads with launch bounds, so the
    launch gives 168 registers each; ``setmaxnreg`` moves them (producer 40, consumers 232:
    128 * 40 + 256 * 232 = 168 * 384) and is honoured (no C7504), the consumers' two
    float32 tile sets fit without spilling, the consumers meet at named barrier 1."""
    for row in _compile_rows(_WS_SCRIPT):
        assert row["maxntid"] == ["384"], row
        assert row["setmaxnreg"] == ["setmaxnreg.dec.sync.aligned.u32 40", "setmaxnreg.inc.sync.aligned.u32 232"], row
        assert row["bars"] == ["bar.sync 1, 256"], row
        assert not row["ignored"] and row["spill"] == 0 and row["regs"] == 168 and row["cubin"] > 0, row


def test_warp_specialisation_stubs_check_their_immediates():
    """``setmaxnreg`` counts are multiples of 8 in [24, 256]; named barriers 1 .. 15 over
    whole warps (PTX would reject the rest at assembly, far from the cause)."""
    assert _mma.setmaxnreg("dec", 40) is _mma.setmaxnreg("dec", 40)
    for op, n in [("dec", 36), ("inc", 264), ("add", 40)]:
        with pytest.raises(ValueError, match="setmaxnreg"):
            _mma.setmaxnreg(op, n)
    for bar, count in [(0, 256), (16, 256), (1, 100)]:
        with pytest.raises(ValueError, match="named_barrier"):
            _mma.named_barrier(bar, count)
