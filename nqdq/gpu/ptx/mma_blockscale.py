"""Block-scaled ``mma.sync`` (sm_120a, Blackwell GeForce), each with a pure-Python per-lane twin.

**Assembled, not run**: CI compiles kernels using these for ``cc=(12, 0, "a")``, assembles
them with nvJitLink and reads the SASS (tests/test_mma_blockscale.py); no sm_120 GPU has run
them here. The twins are the ISA's text worked out, checked against hand-worked answers.

Same pattern as ``mma``: a stub carrying the docstring whose body is the twin (what the
simulator runs), an ``@intrinsic`` emitting the inline PTX, an ``@overload`` joining them.
The selectors ``{byte-id, thread-id}`` are PTX immediates, so each (types, selectors) tuple
is its own stub, made once by the factory (``cp_async_wait(n)``'s pattern).

=======================================  ==================================================
factory -> stub(a0..a3, b0, b1,          PTX (PTX ISA 8.7+, ``sm_120a`` / ``sm_121a``)
c0..c3, sfa, sfb) -> (d0, d1, d2, d3)
=======================================  ==================================================
``mma_mxf8f6f4_1x(fa, fb, ...)``         ``mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4
                                         .block_scale.scale_vec::1X.f32.fa.fb.f32.ue8m0``
``mma_mxf4nvf4("2X", "ue8m0", ...)``     ``mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4
                                         .block_scale.scale_vec::2X.f32.e2m1.e2m1.f32.ue8m0``
                                         (MXFP4: one scale per 32 of K)
``mma_mxf4nvf4("4X", "ue4m3", ...)``     ``... .scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3``
                                         (NVFP4: one scale per 16 of K)
=======================================  ==================================================

each followed by the operands ``d, a, b, c, scale-a-data, {byte-id-a, thread-id-a},
scale-b-data, {byte-id-b, thread-id-b}`` (PTX ISA 9.x, "Multiply-and-Accumulate Instruction:
mma", alternate floating point type with block scaling). Not offered: ``.kind::mxf4`` (the
2X ue8m0 subset of ``mxf4nvf4``), and 4X with ue8m0 scales (PTX ISA 9.1; numba-cuda 0.30's
NVVM emits ``.version 9.0``).

The operation (PTX ISA, "Block Scaling for mma.sync"): D = (A * scale_A) (B * scale_B) + C,
``scale_A`` of shape M x V and ``scale_B`` V x N for ``.scale_vec::VX``: row m of A is cut
into V chunks of K / V (32 for 1X at K = 32 and 2X at K = 64; 16 for 4X at K = 64), chunk j
multiplied by ``scale_A[m, j]``; column n of B likewise by ``scale_B[j, n]``.

Which lane supplies which scale (same section, Figures 43-45, Table 37), with ``g = lane // 4``
and ``t = lane % 4`` as in ``mma``'s fragment tables:

* A: ``thread-id-a`` (0 or 1) picks a thread *pair* of every quad, ``t == 2 thread-id-a`` and
  ``t == 2 thread-id-a + 1``; the lower of the pair gives row g, the upper row g + 8. So row
  m's scale word is lane ``4 (m % 8) + 2 thread-id-a + m // 8``'s ``scale-a-data``.
* B: ``thread-id-b`` (0 .. 3) picks one thread of every quad: column n's word is lane
  ``4 n + thread-id-b``'s ``scale-b-data``.
* Bytes of that word (little-endian): 1X: byte ``byte-id`` (0 .. 3) is the one scale;
  2X: bytes ``byte-id``, ``byte-id + 1`` (byte-id 0 or 2) are chunks 0 and 1 (K 0-31, 32-63);
  4X: bytes 0 .. 3 are chunks 0 .. 3 (K 16 j .. 16 j + 15), byte-id 0.
  Every other lane's word, and the unselected bytes, are not read.

Scale codes: ``ue8m0`` is 2^(code - 127) (code 0 is 2^-127, 0xFF NaN; ml_dtypes
``float8_e8m0fnu``); ``ue4m3`` is e4m3 without its sign bit (0x7F NaN), the NVFP4 block
scale (the twin rejects a set bit 7 rather than guess what the hardware does with it).

Operand registers (PTX ISA, "Matrix fragments for mma.m16n8k32" / "... mma.m16n8k64"): in
*bytes* both shapes are the 8-bit ``m16n8k32`` layout of ``mma``'s docstring (a0 = bytes
4t .. 4t + 3 of row g, a1 of row g + 8, a2 / a3 the same 16 bytes on; b0 / b1 likewise for
column g), so ``ldmatrix_x4`` feeds them unchanged. What a byte holds differs:

* ``kind::mxf8f6f4`` (K = 32): *one element a byte*, whatever its width. e4m3 / e5m2: the
  byte. e3m2 / e2m3: the low 6 bits (2 bits of padding above). e2m1: bits 5..2, the "central
  4 bits" (2 bits of padding above and below: e2m1 1.0 is 0x08, not 0x02).
* ``kind::mxf4nvf4`` (K = 64): *packed*, two e2m1 a byte, the lower K index in the low
  nibble (a .b32 register holds 8 consecutive elements of K): a0 = A[g, 8t .. 8t + 7].

The twin pads nothing and checks no padding: it reads the element bits only. It sums the
exact scaled products in float64, adds C and rounds once to float32, as ``mma``'s fp8 twin
does (the hardware's order, width and subnormal handling are unspecified by the ISA).
"""

from __future__ import annotations

from functools import lru_cache

import ml_dtypes
import numpy as np

from ..runtime.target import SIMULATOR
from .mma import _FP8_TABLE, _a_matrix, _b_matrix, _bytes, _dec_table, _exchange

__all__ = ["MXF8F6F4_TYPES", "MXF4NVF4_SCALES", "mma_mxf8f6f4_1x", "mma_mxf4nvf4", "scale_lane_a", "scale_lane_b"]

MXF8F6F4_TYPES = ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")
MXF4NVF4_SCALES = (("2X", "ue8m0"), ("4X", "ue4m3"))  # (scale_vec, stype): MXFP4, NVFP4

# value of every container byte, per element type (kind::mxf8f6f4: one element a byte)
_CODES = np.arange(256, dtype=np.uint8)
_MXF8F6F4_TABLE = {
    "e4m3": _FP8_TABLE["e4m3"],
    "e5m2": _FP8_TABLE["e5m2"],
    "e3m2": (_CODES & 0x3F).view(ml_dtypes.float6_e3m2fn).astype(np.float64),
    "e2m3": (_CODES & 0x3F).view(ml_dtypes.float6_e2m3fn).astype(np.float64),
    "e2m1": ((_CODES >> 2) & 0xF).view(ml_dtypes.float4_e2m1fn).astype(np.float64),
}
_E2M1 = (_CODES & 0xF).view(ml_dtypes.float4_e2m1fn).astype(np.float64)  # a nibble's value
_SCALE_TABLE = {
    "ue8m0": _CODES.view(ml_dtypes.float8_e8m0fnu).astype(np.float64),
    "ue4m3": _FP8_TABLE["e4m3"],  # bit 7 (e4m3's sign) must be 0: checked where read
}
# scale_vec -> (chunks of K per row / column, valid byte-ids)
_SCALE_VEC = {"1X": (1, (0, 1, 2, 3)), "2X": (2, (0, 2)), "4X": (4, (0,))}


def scale_lane_a(row, thread_id):
    """The lane whose ``scale-a-data`` holds row ``row``'s scales (PTX ISA Figure 43)."""
    return 4 * (row % 8) + 2 * thread_id + row // 8


def scale_lane_b(col, thread_id):
    """The lane whose ``scale-b-data`` holds column ``col``'s scales (PTX ISA Figure 44)."""
    return 4 * col + thread_id


def _check_selectors(scale_vec, byte_a, thread_a, byte_b, thread_b):
    """Table 37 of the PTX ISA: any other value is undefined behaviour, so refuse it here."""
    _, bytes_ok = _SCALE_VEC[scale_vec]
    if byte_a not in bytes_ok or byte_b not in bytes_ok or thread_a not in (0, 1) or thread_b not in (0, 1, 2, 3):
        raise ValueError(
            f"scale_vec::{scale_vec}: byte_a and byte_b must be in {bytes_ok}, thread_a in (0, 1), "
            f"thread_b in (0, 1, 2, 3); got byte_a={byte_a}, thread_a={thread_a}, byte_b={byte_b}, thread_b={thread_b}")


def _scales(words, lane_of, thread_id, byte_id, nvec, stype, what):
    """[16 or 8, nvec] scale values: entry (i, j) is byte ``byte_id + j`` of lane
    ``lane_of(i, thread_id)``'s word."""
    n = 16 if what == "A" else 8
    out = np.empty((n, nvec), np.float64)
    for i in range(n):
        lane = lane_of(i, thread_id)
        b = _bytes(words[lane], False)
        for j in range(nvec):
            code = b[byte_id + j]
            if stype == "ue4m3" and code & 0x80:
                raise ValueError(
                    f"ue4m3 scale of {what} {i} (lane {lane}, byte {byte_id + j}) has bit 7 set: {code:#x}")
            out[i, j] = _SCALE_TABLE[stype][code]
    return out


def _blockscale_twin(a, b, c, sfa, sfb, dec_a, dec_b, per, scale_vec, stype, sel):
    """The warp's D fragment of this lane: D = (A * scale_A) (B * scale_B) + C, the exact
    scaled products summed in float64, C added and rounded once to float32."""
    byte_a, thread_a, byte_b, thread_b = sel
    lanes, lane = _exchange((a, b, sfa, sfb))
    A = _a_matrix([x[0] for x in lanes], dec_a, per)  # [16, K]
    B = _b_matrix([x[1] for x in lanes], dec_b, per)  # [K, 8]
    nvec = _SCALE_VEC[scale_vec][0]
    sa = _scales([x[2] for x in lanes], scale_lane_a, thread_a, byte_a, nvec, stype, "A")  # [16, V]
    sb = _scales([x[3] for x in lanes], scale_lane_b, thread_b, byte_b, nvec, stype, "B")  # [8, V]
    chunk = A.shape[1] // nvec
    A = A * np.repeat(sa, chunk, axis=1)  # exact: a power of two or a 4-bit significand, times
    B = B * np.repeat(sb, chunk, axis=1).T  # an element of <= 4 significant bits, in float64
    g, t = lane // 4, lane % 4
    d = []
    for i, (row, col) in enumerate(((g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1))):
        d.append(np.float32(float(np.dot(A[row], B[:, col])) + float(c[i])))
    return tuple(d)


def _dec_container(fmt):
    return _dec_table(_MXF8F6F4_TABLE[fmt])


def _dec_e2m1x8(w):
    """The 8 e2m1 values of a word, element k in bits 4k .. 4k + 3."""
    out = []
    for v in _bytes(w, False):
        out += [_E2M1[v & 0xF], _E2M1[v >> 4]]
    return out


_DOC_TAIL = (
    " D = (A * scale_A) (B * scale_B) + C: fragments as ``mma``'s (int32 words; the element "
    "encoding and the scale lanes in this module's docstring), float32 C / D, ``sfa`` / ``sfb`` "
    "this lane's ``scale-a-data`` / ``scale-b-data`` (int32). Returns (d0, d1, d2, d3). Warp-wide; "
    "sm_120a."
)


@lru_cache(maxsize=None)
def mma_mxf8f6f4_1x(fa: str, fb: str, byte_a: int = 0, thread_a: int = 0, byte_b: int = 0, thread_b: int = 0):
    """The ``m16n8k32 kind::mxf8f6f4.block_scale.scale_vec::1X`` stub for A in ``fa`` and B in
    ``fb`` (each of ``MXF8F6F4_TYPES``, one element a byte), ue8m0 scales, selectors
    ``{byte_a, thread_a}``, ``{byte_b, thread_b}`` (PTX immediates)."""
    if fa not in MXF8F6F4_TYPES or fb not in MXF8F6F4_TYPES:
        raise ValueError(f"mma_mxf8f6f4_1x: fa and fb must be in {MXF8F6F4_TYPES}, got {fa!r}, {fb!r}")
    sel = (byte_a, thread_a, byte_b, thread_b)
    _check_selectors("1X", *sel)
    da, db = _dec_container(fa), _dec_container(fb)

    def stub(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, sfa, sfb):
        return _blockscale_twin((a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3), sfa, sfb, da, db, 4, "1X", "ue8m0", sel)

    ptx = f"mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.{fa}.{fb}.f32.ue8m0"
    stub.__name__ = f"mma_mxf8f6f4_1x_{fa}_{fb}_{byte_a}{thread_a}{byte_b}{thread_b}"
    stub.__doc__ = f"``{ptx}`` with selectors {{{byte_a}, {thread_a}}}, {{{byte_b}, {thread_b}}}:" + _DOC_TAIL
    if not SIMULATOR:
        _join(stub, _blockscale_intrinsic(ptx, sel))
    return stub


@lru_cache(maxsize=None)
def mma_mxf4nvf4(scale_vec: str, scale_type: str, byte_a: int = 0, thread_a: int = 0, byte_b: int = 0,
                 thread_b: int = 0):  # fmt: skip
    """The ``m16n8k64 kind::mxf4nvf4.block_scale`` stub (e2m1 x e2m1, packed two a byte):
    ``("2X", "ue8m0")`` is MXFP4, ``("4X", "ue4m3")`` NVFP4 (``MXF4NVF4_SCALES``); selectors
    as for ``mma_mxf8f6f4_1x`` (2X: byte-ids 0 or 2; 4X: 0)."""
    if (scale_vec, scale_type) not in MXF4NVF4_SCALES:
        raise ValueError(f"mma_mxf4nvf4: (scale_vec, scale_type) must be one of {MXF4NVF4_SCALES}, "
                         f"got {(scale_vec, scale_type)!r}")  # fmt: skip
    sel = (byte_a, thread_a, byte_b, thread_b)
    _check_selectors(scale_vec, *sel)

    def stub(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, sfa, sfb):
        return _blockscale_twin((a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3), sfa, sfb, _dec_e2m1x8, _dec_e2m1x8,
                                8, scale_vec, scale_type, sel)  # fmt: skip

    ptx = (f"mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::{scale_vec}"
           f".f32.e2m1.e2m1.f32.{scale_type}")  # fmt: skip
    stub.__name__ = f"mma_mxf4nvf4_{scale_vec}_{scale_type}_{byte_a}{thread_a}{byte_b}{thread_b}"
    stub.__doc__ = f"``{ptx}`` with selectors {{{byte_a}, {thread_a}}}, {{{byte_b}, {thread_b}}}:" + _DOC_TAIL
    if not SIMULATOR:
        _join(stub, _blockscale_intrinsic(ptx, sel))
    return stub


# ----------------------------------------------------------------------------- the GPU side
if not SIMULATOR:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic, overload

    from .mma import _F32, _I32, _ret_tuple

    def _blockscale_intrinsic(ptx, sel):
        """An intrinsic of the block-scaled ``ptx`` with the selectors as immediates."""
        byte_a, thread_a, byte_b, thread_b = sel
        text = (f"{ptx} {{$0, $1, $2, $3}}, {{$4, $5, $6, $7}}, {{$8, $9}}, {{$10, $11, $12, $13}}, "
                f"$14, {{{byte_a}, {thread_a}}}, $15, {{{byte_b}, {thread_b}}};")  # fmt: skip

        @intrinsic
        def _mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, sfa, sfb):
            sig = types.UniTuple(types.float32, 4)(*([types.int32] * 6 + [types.float32] * 4 + [types.int32] * 2))

            def codegen(context, builder, sig, args):
                st = ir.LiteralStructType([_F32] * 4)
                fty = ir.FunctionType(st, [_I32] * 6 + [_F32] * 4 + [_I32] * 2)
                asm = ir.InlineAsm(fty, text, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f,r,r")
                return _ret_tuple(context, builder, sig, builder.call(asm, args), 4)

            return sig, codegen

        return _mma

    def _join(stub, intr):
        @overload(stub, target="cuda")
        def _ol(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, sfa, sfb):
            def impl(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, sfa, sfb):
                return intr(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, sfa, sfb)

            return impl
