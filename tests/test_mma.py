"""The tensor-core intrinsics (nqdq.gpu.ptx.mma, .wgmma): twins vs NumPy, and PTX assembly.

* In the simulator (CI) the per-lane twins run: one warp stages A [16, 32] and B [8, 32]
  through ``cp_async16`` into shared memory, reads fragments with ``ldmatrix_x4`` and
  multiplies with the ``mma`` stub; every lane writes its D fragment to its documented
  place. The result must equal NumPy's ``A @ B.T`` exactly (int8: exact int32 sums; fp8:
  32 exact products summed in float64, rounded once to float32, which is what the twin
  does). The same kernel (tests/helpers/probes.py) runs on a GPU in tests/test_matmul_gpu.py
  against the same NumPy result: twin and hardware agree through it.
* Every GEMM kernel variant is compiled to PTX by numba-cuda for sm_89, sm_90 and sm_90a
  and assembled by nvJitLink (in a subprocess: the simulator is on in this process); the
  wgmma kernels for sm_90a, checking ptxas did not serialise the wgmma's (warning C7509).
* The mbarrier stubs (the wgmma ring's synchronisation) through a probe kernel whose
  outputs are worked out by hand (``mbarrier_expected``); the same probe runs on the GPU
  in tests/test_matmul_gpu.py.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nqdq.gpu.ptx import mma as _mma
from nqdq.gpu.ptx import wgmma as _wg

from helpers.probes import (MBAR_THREADS, MMA_CASES, make_mbarrier_probe, make_mma_probe, mbarrier_expected,
                            mma_operands, mma_stub)
from helpers.ptx import compile_rows


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


def test_bf16_mma_twin_matches_numpy():
    """``mma_bf16`` (m16n8k16) through the same probe: its 16 x 16 A and 8 x 16 B bfloat16
    tiles are the 16 x 32 and 8 x 32 bytes the 8-bit kinds read, with the same addresses.
    The values (integers up to 15 times 2^-2 .. 2^2: products are multiples of 2^-4 below
    2^12, sums below 2^16) make every partial sum exact in float32, so the result is one bit pattern whatever the summation: the H200's
    m16n8k16 does not round once (on random values it differed from NumPy's float64 sum in
    the last bit of 56 of 128 outputs), and this checks the fragment layout, not the rounding."""
    rng = np.random.default_rng(1616)
    a = (rng.integers(-15, 16, (16, 16)) * 2.0 ** rng.integers(-2, 3, (16, 16))).astype(ml_dtypes.bfloat16)
    b = (rng.integers(-15, 16, (8, 16)) * 2.0 ** rng.integers(-2, 3, (8, 16))).astype(ml_dtypes.bfloat16)
    d = np.zeros(16 * 8, np.float32)
    make_mma_probe(_mma.mma_bf16)[1, 32](a.view(np.uint8).reshape(-1), b.view(np.uint8).reshape(-1), d)
    want = (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.float32)
    np.testing.assert_array_equal(d.reshape(16, 8), want)


def test_twin_cp_async_zero_fills():
    sm = np.full(32, 7, np.uint8)
    g = np.arange(32, dtype=np.uint8)
    _mma.cp_async16(sm, 16, g, 0, 0)
    _mma.cp_async16(sm, 0, g, 16, 16)
    np.testing.assert_array_equal(sm, np.r_[np.arange(16, 32), np.zeros(16)].astype(np.uint8))


# ----------------------------------------------------------------------------- mbarriers
def test_mbarrier_twins_probe():
    rng = np.random.default_rng(164)
    src = rng.integers(0, 256, MBAR_THREADS * 16, dtype=np.uint8)
    out = np.full((MBAR_THREADS, 19), -1, np.int32)
    make_mbarrier_probe()[1, MBAR_THREADS](src, out)
    np.testing.assert_array_equal(out, mbarrier_expected(src))


def test_mbarrier_twin_phase_parity():
    sm = np.zeros(8, np.uint8)
    _wg.mbarrier_init(sm, 0, 1)
    _wg.mbarrier_arrive(sm, 0)  # completes phase 0, reloads the count
    assert _wg.mbarrier_try_wait(sm, 0, 0) and not _wg.mbarrier_try_wait(sm, 0, 1)
    _wg.mbarrier_arrive(sm, 0)
    assert _wg.mbarrier_try_wait(sm, 0, 1) and not _wg.mbarrier_try_wait(sm, 0, 0)


# ----------------------------------------------------------------------------- PTX assembly
_COMPILE_SCRIPT = r"""
import json, re, sys
from nqdq.gpu.gemm import plan as kg
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
    ("bf16.bf16", SCALE_ROW, SCALE_TENSOR, OUT_BF16, ACT_GELU, True, False),
]
out = []
for cc in [(8, 9), (9, 0), (9, 0, "a")]:
    for mma, sa, sb, o, act, bias, asym in specs:
        spec = GemmSpec(mma=mma, sa_mode=sa, sb_mode=sb, out=o, act=act, bias=bias, asym=asym)
        ptx = kg.compile_ptx(spec, cc)
        cubin, log = kg.assemble(ptx, cc)
        target = re.search(r"^\.target\s+(\S+)", ptx, re.M).group(1)
        mmas = sorted(set(re.findall(r"mma\.sync\.aligned\.m16n8k\d+\.row\.col\.[a-z0-9.]+", ptx)))
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
    ("bf16.bf16", SCALE_ROW, SCALE_TENSOR, OUT_BF16, ACT_GELU, True, False),
]
for k, (mma, sa, sb, o, act, bias, asym) in enumerate(wg_specs + [wg_specs[i] for i in (0, 2, 4)]):
    spec = GemmSpec(mma=mma, sa_mode=sa, sb_mode=sb, out=o, act=act, bias=bias, asym=asym)
    cfg = kg.wgmma_config_for(spec, None if k < len(wg_specs) else (2048, 7168))  # + small outputs' tiles
    ptx = kg.compile_ptx(spec, (9, 0, "a"), config=cfg)
    cubin, log = kg.assemble_lto(spec, cfg)  # as Numba links it (setmaxnreg)
    spill = re.search(r"(\d+) bytes spill stores", log)
    out.append(dict(cc=[9, 0, "a"], mma=mma, n=cfg.n, persistent=cfg.persistent, wgmma=sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.[a-z0-9.]+", ptx))),
                    serialized="C7509" in log, cubin=len(cubin), spill=int(spill.group(1)) if spill else None))
print(json.dumps(out))
"""


def test_gemm_kernels_assemble_for_sm89_sm90_sm90a():
    rows = compile_rows(_COMPILE_SCRIPT)
    assert len(rows) == 32
    for i, row in enumerate(rows[24:]):  # the sm_90a wgmma kernels (default tiles: int8 and bf16
        # 128 x 256, fp8 row 128 x 192, fp8 block 128 x 128; m64nNk32 per warpgroup, bf16
        # m64nNk16; the last three: the 128 x 128 persistent tiles of smaller outputs, int8,
        # fp8 row and bf16)
        want = {"s8s8": "s32.s8.s8", "u8s8": "s32.u8.s8"}.get(row["mma"]) or f"f32.{row['mma']}"
        n = 128 if i >= 5 else {"s8s8": 256, "u8s8": 256, "bf16.bf16": 256, "e5m2.e4m3": 192, "e4m3.e4m3": 128}[row["mma"]]
        wide = row["mma"] in ("s8s8", "u8s8", "bf16.bf16")
        assert row["n"] == n and row["persistent"] == (not wide or i >= 5), row
        k = 16 if row["mma"] == "bf16.bf16" else 32
        assert row["wgmma"] == [f"wgmma.mma_async.sync.aligned.m64n{row['n']}k{k}.{want}"], row
        assert not row["serialized"] and row["spill"] == 0 and row["cubin"] > 0, row
    for row in rows[:24]:
        cc = row["cc"]
        assert row["target"] == f"sm_{cc[0]}{cc[1]}" + (cc[2] if len(cc) > 2 else ""), row
        want = "s32.s8.s8.s32" if row["mma"] == "s8s8" else "s32.u8.s8.s32" if row["mma"] == "u8s8" \
            else f"f32.{row['mma']}.f32"  # fmt: skip
        shape = "m16n8k16" if row["mma"] == "bf16.bf16" else "m16n8k32"
        assert row["mmas"] == [f"mma.sync.aligned.{shape}.row.col.{want}"], row
        # 128 x 128 x 64 tile: per 64 of K, 2 k-steps x (4 A + 2 B) ldmatrix, 2 x 16 mma
        assert row["ldmatrix"] >= 12 and row["cp_async"] >= 4 and row["cubin"] > 0, row
        # the mma.sync fp8-block kernel keeps two 64-float accumulator sets and sits at the
        # 255-register limit: a few bytes of spill there; none anywhere else
        assert row["spill"] <= (16 if row["block"] else 0), row


_WS_SCRIPT = r"""
import json, re
from nqdq.gpu.gemm import plan as kg
from nqdq.gpu.gemm.mma_sync import ACT_NONE, GemmSpec, OUT_BF16, SCALE_BLOCK, SCALE_ROW
out = []
for cfg, sm in [(kg.WGMMA_CONFIG_FP8_ROW, SCALE_ROW), (kg.WGMMA_CONFIG_FP8_BLOCK, SCALE_BLOCK)]:
    spec = GemmSpec(mma="e4m3.e4m3", sa_mode=sm, sb_mode=sm, out=OUT_BF16, act=ACT_NONE, bias=False, asym=False)
    ptx = kg.compile_ptx(spec, (9, 0, "a"), config=cfg)
    cubin, log = kg.assemble_lto(spec, cfg)
    spill = re.search(r"(\d+) bytes spill stores", log)
    regs = re.search(r"Used (\d+) registers", log)
    out.append(dict(n=cfg.n, maxntid=re.findall(r"\.maxntid\s+(\d+)", ptx), setmaxnreg=re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32 \d+", ptx),
                    bars=sorted(set(re.findall(r"bar\.sync\s+1, \d+", ptx))), ignored="C7504" in log, cubin=len(cubin),
                    spill=int(spill.group(1)) if spill else None, regs=int(regs.group(1)) if regs else None))
print(json.dumps(out))
"""


def test_warp_specialised_gemm_assembles_without_spills():
    """The producer / consumer wgmma kernels (fp8 row 128 x 192, block 128 x 128 with
    ping-pong), linked as Numba links them on a GPU (LTO, whole program): 384 threads with
    launch bounds, so the launch gives 168 registers each; ``setmaxnreg`` moves them
    (producer 40, consumers 232: 128 * 40 + 256 * 232 = 168 * 384) and is honoured (no
    C7504), the consumers' float32 sets (two of 64 x 192, three of 64 x 128) fit without
    spilling; no named barrier (the direct epilogue needs none)."""
    for row in compile_rows(_WS_SCRIPT):
        assert row["maxntid"] == ["384"], row
        assert row["setmaxnreg"] == ["setmaxnreg.dec.sync.aligned.u32 40", "setmaxnreg.inc.sync.aligned.u32 232"], row
        assert row["bars"] == [], row
        assert not row["ignored"] and row["spill"] == 0 and row["regs"] == 168 and row["cubin"] > 0, row


def test_warp_specialisation_stubs_check_their_immediates():
    """``setmaxnreg`` counts are multiples of 8 in [24, 256] (PTX would reject the rest at
    assembly, far from the cause)."""
    assert _wg.setmaxnreg("dec", 40) is _wg.setmaxnreg("dec", 40)
    for op, n in [("dec", 36), ("inc", 264), ("add", 40)]:
        with pytest.raises(ValueError, match="setmaxnreg"):
            _wg.setmaxnreg(op, n)
