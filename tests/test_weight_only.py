"""The in-register int4 weight-only kernel's parts (``nqdq.gpu.gemm.weight_only``): the nibble
pair decode against values written out here, which weights it takes, its warps a CTA, and
its kernels compiled and assembled for sm_90 without a GPU (no local memory, no spills, the
mma count of the unrolled chunk). Its results against the reference: tests/test_matmul_pairs.py
(simulator) and tests/test_matmul_pairs_gpu.py (GPU)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nqdq
from nqdq.gpu.gemm import weight_only as wo

from helpers.ptx import compile_rows


def test_int4_pair_decodes_both_nibbles():
    """Word 0xF80712A9: nibbles (low first) 9, A, 2, 1, 7, 0, 8, F. Symmetric (the kernel's
    flip 8, c 8: two's complement) 9 -> -7, A -> -6, 8 -> -8, F -> -1; asymmetric (flip 0):
    the nibble minus c = 3."""
    word = np.uint32(0xF80712A9)

    def pair(shift, flip, c):
        bits = np.uint32(np.int32(wo.int4_pair(word, shift, flip, c)).view(np.uint32))
        return np.array([bits & 0xFFFF, bits >> 16], np.uint16).view(ml_dtypes.bfloat16).astype(float).tolist()

    assert pair(0, 8, 8) == [-7.0, -6.0]
    assert pair(8, 8, 8) == [2.0, 1.0]
    assert pair(24, 8, 8) == [-8.0, -1.0]
    assert pair(0, 0, 3) == [6.0, 7.0]
    assert pair(24, 0, 3) == [5.0, 12.0]


@pytest.mark.parametrize("K,warps", [(4096, 8), (14336, 16), (7168, 8), (128, 1), (384, 1), (256, 2)])
def test_warps_for(K, warps, monkeypatch):
    """The GPU's choice (WARPS = 16 .. 1, at least MIN_CHUNKS = 4 chunks a warp where a
    divisor allows): 32 chunks -> 8, 112 -> 16, 56 -> 8, 1 -> 1, 3 -> 1, 2 -> 2."""
    monkeypatch.setattr(wo, "WARPS", (16, 8, 4, 2, 1))
    assert wo.warps_for(K) == warps


@pytest.mark.parametrize("scheme,kw,ok", [("int4_group", {}, None), ("int4_asym", dict(group_size=256), None),
                                          ("int4_group", dict(group_size=64), "multiples of 128"),
                                          ("int8_row", {}, "int4 weights with groups along K"),
                                          ("int4", dict(granularity="row"), "int4 weights with groups along K")])  # fmt: skip
def test_supported(scheme, kw, ok):
    qw = nqdq.quantize(np.random.default_rng(5).standard_normal((4, 512)).astype(np.float32), scheme, **kw)
    why = wo.supported(qw)
    assert why is None if ok is None else ok in why


_SCRIPT = r"""
import json, re
import numpy as np
from numba import cuda, float32, typeof
from nqdq.gpu.gemm import plan as kg
from nqdq.gpu.gemm import weight_only as wo
from nqdq.gpu.gemm.mma_sync import ACT_GELU, ACT_NONE, OUT_BF16, OUT_F32
from nqdq.tools.ptx_audit import _no_gpu_compile
wo.RT = 2  # the GPU's tile (the simulator's is 1)
u8, u16, f32 = (typeof(np.zeros(3, t)) for t in (np.uint8, np.uint16, np.float32))
out = []
for nt, warps, asym, o, act, bias in [(2, 8, False, OUT_F32, ACT_NONE, False), (1, 16, True, OUT_BF16, ACT_GELU, True)]:
    k = wo.make_kernel(nt, warps, asym, o, act, bias)
    sig = (u16, u8, f32, u8, f32, float32, f32 if o == OUT_F32 else u16) + (typeof(1),) * 4
    with _no_gpu_compile():
        ptx, _ = cuda.compile_ptx(k.py_func, sig, cc=(9, 0))
    cubin, log = kg.assemble(ptx, (9, 0))
    spill = re.search(r"(\d+) bytes spill stores", log)
    out.append(dict(nt=nt, local=len(re.findall(r"\.local", ptx)), mma=ptx.count("mma.sync.aligned.m16n8k16"),
                    loads=len(re.findall(r"ld\.global\.nc\.v4\.u32", ptx)), cubin=len(cubin),
                    spill=int(spill.group(1)) if spill else None))
print(json.dumps(out))
"""


def test_kernels_assemble_unrolled():
    """RT = 2 row tiles, NT = 2 / 1 token tiles: every chunk unrolled (2 x 8 x NT mma; 4 weight
    and 4 NT x-loads of 16 bytes), the lane's arrays in registers (no .local), no spills."""
    for row in compile_rows(_SCRIPT):
        assert row["local"] == 0 and row["spill"] == 0 and row["cubin"] > 0, row
        assert row["mma"] == 16 * row["nt"] and row["loads"] == 4 + 4 * row["nt"], row
