"""The block-scaled ``mma.sync`` of sm_120a (nqdq.gpu.ptx.mma_blockscale): twins vs hand-worked
answers, and the instructions assembled for sm_120a ("assembled, not run": no sm_120 GPU here).

* In the simulator one warp stages A [16, 32 bytes] and B [8, 32 bytes] through ``cp_async16``
  into shared memory and reads its fragments with ``ldmatrix_x4``, as tests/test_mma.py's probe
  does (in bytes both shapes have the 8-bit m16n8k32 layout); each lane passes its own scale
  words. The scale words are built here from the ISA's rule (PTX ISA "Block Scaling for
  mma.sync", Figures 43-45) and every byte the rule does not select is a NaN code, so a twin
  reading the wrong lane or byte answers NaN.
* Outside the simulator (``compile_rows``) a kernel using each instruction is compiled for
  ``cc=(12, 0, "a")``, assembled by nvJitLink, and its SASS read by nvdisasm: the block-scaled
  MMA (``QMMA.SF.16832`` for kind::mxf8f6f4, ``OMMA.SF.16864`` for kind::mxf4nvf4) is there
  and nothing spills.
"""

from __future__ import annotations

import importlib.metadata

import ml_dtypes
import numpy as np
import pytest
from numba import cuda

from nqdq.gpu.ptx import mma_blockscale as bs

from helpers.probes import stage_fragments, store_fragment
from helpers.ptx import compile_rows

NAN_E8M0, NAN_UE4M3 = 0xFF, 0x7F


def make_blockscale_probe(mma):
    """One warp: D = the block-scaled product of A [16, 32 bytes] and B [8, 32 bytes] (rows of
    K bytes), fragments through cp.async -> shared -> ldmatrix; lane l passes ``sfa[l]``,
    ``sfb[l]``; D [16, 8] written from each lane's fragment."""

    @cuda.jit
    def probe(a, b, sfa, sfb, d):
        sm = cuda.shared.array(1024, np.uint8)
        lane = cuda.threadIdx.x
        a0, a1, a2, a3, b0, b1 = stage_fragments(sm, a, b, lane)
        z = np.float32(0)
        d0, d1, d2, d3 = mma(a0, a1, a2, a3, b0, b1, z, z, z, z, sfa[lane], sfb[lane])
        store_fragment(d, lane, d0, d1, d2, d3)

    return probe


def run(mma, a, b, sfa, sfb):
    d = np.zeros(16 * 8, np.float32)
    make_blockscale_probe(mma)[1, 32](a.reshape(-1), b.reshape(-1), sfa.view(np.int32), sfb.view(np.int32), d)
    return d.reshape(16, 8)


def scale_words(sa, sb, byte_a, thread_a, byte_b, thread_b, decoy):
    """Each lane's (scale-a-data, scale-b-data) for scale codes ``sa`` [16, V], ``sb`` [8, V],
    written out from the ISA's text (not from the module): A's thread pair
    ``t in {2 thread_a, 2 thread_a + 1}`` of quad g holds row ``g + 8 (t - 2 thread_a)``; B's
    thread ``t == thread_b`` of quad g holds column g; chunk j in byte ``byte_id + j``.
    Every other byte is ``decoy``."""
    wa = np.full((32, 4), decoy, np.uint8)
    wb = np.full((32, 4), decoy, np.uint8)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        if t in (2 * thread_a, 2 * thread_a + 1):
            wa[lane, byte_a:byte_a + sa.shape[1]] = sa[g + 8 * (t - 2 * thread_a)]
        if t == thread_b:
            wb[lane, byte_b:byte_b + sb.shape[1]] = sb[g]
    return wa.view(np.uint32).reshape(32), wb.view(np.uint32).reshape(32)


def expected(va, vb, sa, sb):
    """float32 of the float64 sum of (A * scale_A)(B * scale_B): values va [16, K], vb [8, K],
    scale values sa [16, V], sb [8, V] (chunk j = K / V elements)."""
    chunk = va.shape[1] // sa.shape[1]
    return ((va * np.repeat(sa, chunk, 1)) @ (vb * np.repeat(sb, chunk, 1)).T).astype(np.float32)


E8M0 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
E4M3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
E2M1 = (np.arange(16, dtype=np.uint8)).view(ml_dtypes.float4_e2m1fn).astype(np.float64)


# ----------------------------------------------------------------------------- hand-worked
def test_mxf8f6f4_ones_times_row_and_column_scales():
    """A = B = e4m3 1.0 (0x38): D[m, n] = 32 * 2^(m - 4) * 2^(-n), every other byte NaN."""
    sa = (127 + np.arange(16) - 4).astype(np.uint8)[:, None]
    sb = (127 - np.arange(8)).astype(np.uint8)[:, None]
    for sel in [(0, 0, 0, 0), (3, 1, 2, 3), (1, 0, 3, 1)]:
        wa, wb = scale_words(sa, sb, *sel, NAN_E8M0)
        d = run(bs.mma_mxf8f6f4_1x("e4m3", "e4m3", *sel), np.full((16, 32), 0x38, np.uint8),
                np.full((8, 32), 0x38, np.uint8), wa, wb)  # fmt: skip
        want = 32.0 * 2.0 ** (np.arange(16)[:, None] - 4) * 2.0 ** -np.arange(8)[None, :]
        np.testing.assert_array_equal(d, want.astype(np.float32), err_msg=str(sel))


def test_mxf8f6f4_containers_of_narrow_types():
    """kind::mxf8f6f4 keeps one element a byte: e2m1 in bits 5..2 (1.0 is 0x08, 6.0 0x1C;
    0x02 / 0x01 are padding bits: zero), e3m2 / e2m3 in the low 6 bits (the top 2 padding).
    A = e2m1 6.0, B = e2m3 1.875 (0b0_01_111 = 0x0F, padding 0xC0 set): 32 * 6 * 1.875 = 360;
    e2m1 0x0B (= 0x08 | padding 0x03) * e3m2 -28 (0b1_111_11 = 0x3F): 32 * -28 = -896."""
    one = np.full((16, 1), 127, np.uint8)
    wa, wb = scale_words(one, one[:8], 0, 0, 0, 0, NAN_E8M0)
    d = run(bs.mma_mxf8f6f4_1x("e2m1", "e2m3"), np.full((16, 32), 0x1C, np.uint8), np.full((8, 32), 0xCF, np.uint8),
            wa, wb)  # fmt: skip
    np.testing.assert_array_equal(d, np.full((16, 8), 360.0, np.float32))
    d = run(bs.mma_mxf8f6f4_1x("e2m1", "e3m2"), np.full((16, 32), 0x0B, np.uint8), np.full((8, 32), 0x3F, np.uint8),
            wa, wb)  # fmt: skip
    np.testing.assert_array_equal(d, np.full((16, 8), -896.0, np.float32))
    d = run(bs.mma_mxf8f6f4_1x("e2m1", "e2m1"), np.full((16, 32), 0x02, np.uint8), np.full((8, 32), 0x08, np.uint8),
            wa, wb)  # fmt: skip
    np.testing.assert_array_equal(d, np.zeros((16, 8), np.float32))


def test_mxf4nvf4_nibble_order():
    """Packed e2m1, the lower K index in the low nibble: row 0 of A holds (1.0, 2.0) at K 0, 1
    (byte 0x42), column 0 of B holds (1.0, 0) (byte 0x02): D[0, 0] = 1 (swapped nibbles: 2)."""
    a = np.zeros((16, 32), np.uint8)
    b = np.zeros((8, 32), np.uint8)
    a[0, 0], b[0, 0] = 0x42, 0x02
    sa = np.full((16, 2), 127, np.uint8)
    wa, wb = scale_words(sa, sa[:8], 0, 0, 0, 0, NAN_E8M0)
    d = run(bs.mma_mxf4nvf4("2X", "ue8m0"), a, b, wa, wb)
    want = np.zeros((16, 8), np.float32)
    want[0, 0] = 1.0
    np.testing.assert_array_equal(d, want)


@pytest.mark.parametrize("sel", [(0, 0, 0, 0), (2, 1, 2, 3), (0, 1, 2, 0)])
def test_mxfp4_two_chunks(sel):
    """MXFP4 (2X, ue8m0): e2m1 1.0 everywhere (0x22); row m's chunks (K 0-31, 32-63) scaled
    2^0 and 2^(m % 3), column n's 2^1 and 2^-1: D = 32 * 2 + 32 * 2^(m % 3) / 2."""
    sa = np.stack([np.full(16, 127), 127 + np.arange(16) % 3], 1).astype(np.uint8)
    sb = np.tile(np.array([128, 126], np.uint8), (8, 1))
    wa, wb = scale_words(sa, sb, *sel, NAN_E8M0)
    d = run(bs.mma_mxf4nvf4("2X", "ue8m0", *sel), np.full((16, 32), 0x22, np.uint8), np.full((8, 32), 0x22, np.uint8),
            wa, wb)  # fmt: skip
    want = np.broadcast_to((64.0 + 16.0 * 2.0 ** (np.arange(16) % 3))[:, None], (16, 8))
    np.testing.assert_array_equal(d, want.astype(np.float32))


def test_nvfp4_four_chunks_ue4m3():
    """NVFP4 (4X, ue4m3): e2m1 0.5 everywhere (0x11); row m's four chunks of 16 scaled 1.0,
    1.5, 2.0, 448 (0x38, 0x3C, 0x40, 0x7E), columns by 0.25 (0x28): D = 16 * 0.25 * 0.25 *
    (1 + 1.5 + 2 + 448) = 452.5, with thread-ids (1, 2) and every other byte the NaN 0x7F."""
    sa = np.tile(np.array([0x38, 0x3C, 0x40, 0x7E], np.uint8), (16, 1))
    sb = np.full((8, 4), 0x28, np.uint8)
    wa, wb = scale_words(sa, sb, 0, 1, 0, 2, NAN_UE4M3)
    d = run(bs.mma_mxf4nvf4("4X", "ue4m3", 0, 1, 0, 2), np.full((16, 32), 0x11, np.uint8),
            np.full((8, 32), 0x11, np.uint8), wa, wb)  # fmt: skip
    np.testing.assert_array_equal(d, np.full((16, 8), 452.5, np.float32))


def test_ue4m3_sign_bit_rejected():
    """A selected ue4m3 scale with bit 7 set is no ue4m3 code: the twin refuses it."""
    sa = np.full((16, 4), 0x38, np.uint8)
    sa[5, 2] = 0xB8
    wa, wb = scale_words(sa, sa[:8] & 0x7F, 0, 0, 0, 0, NAN_UE4M3)
    with pytest.raises(Exception, match="bit 7"):
        run(bs.mma_mxf4nvf4("4X", "ue4m3"), np.zeros((16, 32), np.uint8), np.zeros((8, 32), np.uint8), wa, wb)


# ----------------------------------------------------------------------------- random codes
@pytest.mark.parametrize("fa,fb", [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e4m3", "e2m1"), ("e3m2", "e2m3")])
def test_mxf8f6f4_random_codes(fa, fb):
    """Random element codes (padding bits random too) and e8m0 scales 2^-20 .. 2^20 against
    the float64 product of the decoded values, rounded once."""
    rng = np.random.default_rng(12080)
    table = {"e4m3": lambda c: E4M3[c], "e5m2": lambda c: c.view(ml_dtypes.float8_e5m2).astype(np.float64),
             "e3m2": lambda c: (c & 0x3F).view(ml_dtypes.float6_e3m2fn).astype(np.float64),
             "e2m3": lambda c: (c & 0x3F).view(ml_dtypes.float6_e2m3fn).astype(np.float64),
             "e2m1": lambda c: E2M1[(c >> 2) & 0xF]}  # fmt: skip
    a, b = rng.integers(0, 256, (16, 32), dtype=np.uint8), rng.integers(0, 256, (8, 32), dtype=np.uint8)
    for name, codes in ((fa, a), (fb, b)):  # no NaN / inf codes
        codes[~np.isfinite(table[name](codes))] = 0
    sa = rng.integers(107, 148, (16, 1), dtype=np.uint8)
    sb = rng.integers(107, 148, (8, 1), dtype=np.uint8)
    wa, wb = scale_words(sa, sb, 1, 1, 2, 3, NAN_E8M0)
    d = run(bs.mma_mxf8f6f4_1x(fa, fb, 1, 1, 2, 3), a, b, wa, wb)
    np.testing.assert_array_equal(d, expected(table[fa](a), table[fb](b), E8M0[sa], E8M0[sb]))


@pytest.mark.parametrize("scale_vec,stype", bs.MXF4NVF4_SCALES)
def test_mxf4nvf4_random_codes(scale_vec, stype):
    rng = np.random.default_rng(12064)
    a, b = rng.integers(0, 256, (16, 32), dtype=np.uint8), rng.integers(0, 256, (8, 32), dtype=np.uint8)

    def values(codes):  # two e2m1 a byte, low nibble first
        return np.stack([E2M1[codes & 0xF], E2M1[codes >> 4]], -1).reshape(codes.shape[0], 64)

    nvec = 2 if scale_vec == "2X" else 4
    if stype == "ue8m0":
        sa, sb = rng.integers(100, 150, (16, nvec), dtype=np.uint8), rng.integers(100, 150, (8, nvec), dtype=np.uint8)
        dec, decoy, sel = E8M0, NAN_E8M0, (2, 0, 0, 1)
    else:
        sa, sb = rng.integers(1, 0x7F, (16, nvec), dtype=np.uint8), rng.integers(1, 0x7F, (8, nvec), dtype=np.uint8)
        dec, decoy, sel = E4M3, NAN_UE4M3, (0, 1, 0, 3)
    wa, wb = scale_words(sa, sb, *sel, decoy)
    d = run(bs.mma_mxf4nvf4(scale_vec, stype, *sel), a, b, wa, wb)
    np.testing.assert_array_equal(d, expected(values(a), values(b), dec[sa], dec[sb]))


def test_scale_lanes_match_the_isa_figures():
    """Figure 43: thread-id-a 0 -> rows 0..7 from lanes 0, 4, .., 28, rows 8..15 from 1, 5, ..;
    thread-id-a 1 -> lanes 2, 6, .. and 3, 7, ..; Figure 44: column n from lane 4 n + thread-id-b."""
    assert [bs.scale_lane_a(m, 0) for m in range(16)] == [4 * i for i in range(8)] + [4 * i + 1 for i in range(8)]
    assert [bs.scale_lane_a(m, 1) for m in range(16)] == [4 * i + 2 for i in range(8)] + [4 * i + 3 for i in range(8)]
    assert [bs.scale_lane_b(n, 3) for n in range(8)] == [4 * n + 3 for n in range(8)]


def test_selectors_and_kinds_checked():
    """Table 37's selector values, Table 36's kinds; anything else is refused before PTX."""
    assert bs.mma_mxf8f6f4_1x("e4m3", "e5m2") is bs.mma_mxf8f6f4_1x("e4m3", "e5m2")
    for bad in [dict(byte_a=4), dict(thread_a=2), dict(byte_b=-1), dict(thread_b=4)]:
        with pytest.raises(ValueError, match="scale_vec::1X"):
            bs.mma_mxf8f6f4_1x("e4m3", "e4m3", **bad)
    with pytest.raises(ValueError, match="fa and fb"):
        bs.mma_mxf8f6f4_1x("e4m3", "bf16")
    with pytest.raises(ValueError, match="scale_vec::2X"):
        bs.mma_mxf4nvf4("2X", "ue8m0", byte_a=1)
    with pytest.raises(ValueError, match="scale_vec::4X"):
        bs.mma_mxf4nvf4("4X", "ue4m3", byte_b=2)
    for pair in [("2X", "ue4m3"), ("4X", "ue8m0"), ("1X", "ue8m0")]:
        with pytest.raises(ValueError, match="scale_vec, scale_type"):
            bs.mma_mxf4nvf4(*pair)


# ----------------------------------------------------------------------------- sm_120a assembly
def nvdisasm_path():
    """nvdisasm from the ``nvidia-cuda-nvdisasm`` wheel (the ``test`` extra), or None."""
    try:
        files = importlib.metadata.files("nvidia-cuda-nvdisasm") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [f for f in files if f.name == "nvdisasm"]
    return str(found[0].locate()) if found else None


_SM120A_SCRIPT = r"""
import json, re, subprocess, sys, tempfile
from numba import cuda
from numba.cuda import dispatcher
from nqdq.gpu.gemm import plan as kg
from nqdq.gpu.ptx import mma_blockscale as bs

class _Dev:  # numba-cuda compiles device functions for the current device: a stand-in, compile only
    compute_capability = (12, 0)

if not cuda.is_available():
    dispatcher.get_current_device = lambda: _Dev()

def probe(stub):
    @cuda.jit
    def k(a, s, d):
        l = cuda.threadIdx.x
        c = d[l]
        d0, d1, d2, d3 = stub(a[l], a[l + 32], a[l + 64], a[l + 96], a[l + 128], a[l + 160], c, c, c, c,
                              s[l], s[l + 32])
        d[4 * l] = d0
        d[4 * l + 1] = d1
        d[4 * l + 2] = d2
        d[4 * l + 3] = d3
    return k

cases = [("mxf8f6f4", bs.mma_mxf8f6f4_1x("e4m3", "e4m3")), ("mxf8f6f4", bs.mma_mxf8f6f4_1x("e5m2", "e2m1", 3, 1, 2, 3)),
         ("mxf8f6f4", bs.mma_mxf8f6f4_1x("e3m2", "e2m3")), ("mxf4nvf4", bs.mma_mxf4nvf4("2X", "ue8m0", 2, 1, 0, 0)),
         ("mxf4nvf4", bs.mma_mxf4nvf4("4X", "ue4m3"))]
out = []
for kind, stub in cases:
    ptx = cuda.compile_ptx(probe(stub).py_func, "void(int32[:], int32[:], float32[:])", cc=(12, 0, "a"))[0]
    cubin, log = kg.assemble(ptx, (12, 0, "a"))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([sys.argv[1], "-c", f.name], capture_output=True, text=True, check=True).stdout
    spill = re.findall(r"(\d+) bytes spill (?:stores|loads)", log)
    out.append(dict(kind=kind, name=stub.__name__, target=re.search(r"^\.target\s+(\S+)", ptx, re.M).group(1),
                    ptx=re.findall(r"mma\.sync\.aligned\.[^\s]+ .*;", ptx),
                    sass=re.findall(r"\b[A-Z]MMA[A-Z0-9._]*", sass), spill=[int(s) for s in spill],
                    lmem=re.findall(r"(\d+) bytes lmem", log)))
print(json.dumps(out))
"""


def test_blockscale_mma_assembles_for_sm120a():
    """Each instruction in a one-warp kernel for ``(12, 0, "a")``: the PTX carries it with its
    immediate selectors, nvJitLink assembles it, the SASS has exactly one block-scaled MMA
    (``QMMA.SF.16832.F32.<A>.<B>.E8`` for kind::mxf8f6f4; ``OMMA.SF.16864.F32.E2M1.E2M1.E8``
    for MXFP4 and ``... .UE4M3.4X`` for NVFP4), and no spill and no local memory."""
    nvdisasm = nvdisasm_path()
    if nvdisasm is None:
        pytest.skip("nvdisasm not installed: pip install 'nvidia-cuda-nvdisasm>=13' (the test extra)")
    rows = compile_rows(_SM120A_SCRIPT.replace("sys.argv[1]", repr(nvdisasm)))
    want = ["QMMA.SF.16832.F32.E4M3.E4M3.E8", "QMMA.SF.16832.F32.E5M2.E2M1.E8", "QMMA.SF.16832.F32.E3M2.E2M3.E8",
            "OMMA.SF.16864.F32.E2M1.E2M1.E8", "OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X"]
    selectors = ["{0, 0}, %r8, {0, 0}", "{3, 1}, %r8, {2, 3}", "{0, 0}, %r8, {0, 0}", "{2, 1}, %r8, {0, 0}",
                 "{0, 0}, %r8, {0, 0}"]  # fmt: skip
    assert len(rows) == len(want)
    for row, mnemonic, sel in zip(rows, want, selectors):
        assert row["target"] == "sm_120a", row
        assert len(row["ptx"]) == 1 and f"kind::{row['kind']}.block_scale" in row["ptx"][0], row
        assert sel in row["ptx"][0], row
        assert row["sass"] == [mnemonic], row
        assert row["spill"] == [0, 0] and set(row["lmem"]) <= {"0"}, row
