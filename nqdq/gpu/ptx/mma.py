"""Tensor-core instructions through inline PTX, each with a pure-Python per-lane twin.

Every instruction follows numba-cuda's own pattern (``numba.cuda.cache_hints``): a plain
Python *stub* carrying the docstring, an ``@intrinsic`` emitting ``llvmlite.ir.InlineAsm``,
and an ``@overload(stub, target="cuda")`` joining them. The stub's body is the **twin**:
what the CUDA simulator runs (``NUMBA_ENABLE_CUDASIM=1``), so the GEMM kernels' fragment
indexing is exercised in CI exactly as the GPU runs it.

===========================  ==========================================================
stub                         PTX (sm_80+; the fp8 ``mma`` needs sm_89+)
===========================  ==========================================================
``ldmatrix_x4(s, off)``      ``ldmatrix.sync.aligned.m8n8.x4.shared.b16``
``mma_s8s8(a.., b.., c..)``  ``mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32``
``mma_u8s8(...)``            ``... .s32.u8.s8.s32`` (asymmetric uint8 activations)
``mma_fp8(fa, fb)(...)``     ``... .f32.{e4m3,e5m2}.{e4m3,e5m2}.f32``
``mma_bf16(...)``            ``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32``
``cp_async16(...)``          ``cp.async.cg.shared.global [s], [g], 16, src_bytes``
``cp_async_commit()``        ``cp.async.commit_group``
``cp_async_wait(n)()``       ``cp.async.wait_group n``
``cp_async_unit(s, b, i, g, j)``  ``cp.async.cg.shared.global`` of one 16-byte unit, word indices
``cp_async_unit_l2_256(...)``  ``cp.async.cg.shared.global.L2::256B``: the same, 256-byte L2 fetch
``ld_shared_u32x4(s, b, i)``  ``ld.shared.v4.u32``
``mbarrier_*`` (sm_90 wait)  ``mbarrier.init / arrive / try_wait.parity``,
                             ``cp.async.mbarrier.arrive.noinc``
``setmaxnreg(op, n)()``      ``setmaxnreg.{inc,dec}.sync.aligned.u32 n`` (sm_90a; warp
                             specialisation, end of this module)
===========================  ==========================================================

Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k32", 8-bit types), with
``g = lane // 4`` and ``t = lane % 4``; every ``.b32`` register holds 4 consecutive
8-bit elements along K, lowest address in the lowest byte:

* A (16 x 32, row-major): ``a0`` = A[g, 4t:4t+4], ``a1`` = A[g+8, 4t:4t+4],
  ``a2`` = A[g, 16+4t:...], ``a3`` = A[g+8, 16+4t:...];
* B (32 x 8, "col", i.e. stored as the [N, K] rows of a weight): ``b0`` = B[4t:4t+4, g],
  ``b1`` = B[16+4t:16+4t+4, g];
* C / D (16 x 8): ``c0, c1`` = D[g, 2t], D[g, 2t+1]; ``c2, c3`` = D[g+8, 2t], D[g+8, 2t+1].

The 16-bit ``m16n8k16`` (PTX ISA, "Matrix fragments for mma.m16n8k16 with floating point
type"; ``.bf16``) has the same layout *in bytes*: a register holds 2 consecutive elements
along K (the lower index in the low half), so ``a0`` = A[g, 2t:2t+2] is again bytes 4t..4t+4
of row g, ``a2`` = A[g, 8+2t:...] bytes 16+4t.., ``b0`` = B[2t:2t+2, g], ``b1`` = B[8+2t:..., g],
and C / D as above. A 16 x 16 bf16 A tile is the 16 x 32 bytes of an 8-bit one, so the same
``ldmatrix`` addresses feed either kind.

``ldmatrix .x4``: lane ``l`` gives the shared address of row ``l % 8`` of matrix ``l // 8``
(8 rows of 16 bytes each); lane ``l`` receives, for each matrix ``j``, the 32-bit word
``l % 4`` of that matrix's row ``l // 4``: exactly the A / B fragment layout above when
the four matrices are chosen as the kernels do (see ``_gemm_kernels``).

The twins of the warp-wide instructions (``ldmatrix``, ``mma``) exchange the 32 lanes'
operands through a dictionary and the simulator's block barrier, so every thread of a
block must reach them the same number of times (true of the GEMM mainloop). The fp8 and
bf16 twins sum the 32 / 16 exact products in float64 and round once to float32 (the
hardware's internal order and width are not specified, and differ: the H200's bf16
m16n8k16 differed in the last bit on random values; tests allow for that, and the probes
that compare twin and instruction bit for bit use values whose sums are exact).
"""

from __future__ import annotations

import threading
from functools import lru_cache

import ml_dtypes
import numpy as np

from ..runtime.target import SIMULATOR

__all__ = [
    "ldmatrix_x4", "mma_s8s8", "mma_u8s8", "mma_fp8", "mma_bf16", "cp_async16", "cp_async_commit",
    "cp_async_wait", "cp_async_unit", "cp_async_unit_l2_256", "ld_shared_u32x4", "FP8_TYPES", "mbarrier_init",
    "mbarrier_arrive", "cp_async_mbarrier_arrive", "mbarrier_try_wait", "setmaxnreg",
]

FP8_TYPES = ("e4m3", "e5m2")
_FP8_TABLE = {
    "e4m3": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64),
    "e5m2": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e5m2).astype(np.float64),
}


# ----------------------------------------------------------------------------- simulator twins
# The simulator runs one Python thread per CUDA thread and blocks one after another; a
# warp-wide twin deposits its lane's operands in slot [warp][parity][lane], waits at the
# block barrier, then reads the other lanes'. Alternating parity (a per-thread call count)
# makes one barrier per call enough: a lane can only overwrite a slot of parity p after a
# later barrier that every lane reaches after reading it.
_slots: dict = {}
_calls = threading.local()


def _sim_ctx():
    from numba.cuda.simulator.kernel import _get_kernel_context

    ctx = _get_kernel_context()
    if ctx is None:
        raise RuntimeError("the warp-wide twins run inside a simulated kernel only")
    return ctx


def _lane_ids(ctx):
    tid = ctx.threadIdx.x + ctx.blockDim.x * (ctx.threadIdx.y + ctx.blockDim.y * ctx.threadIdx.z)
    return tid // 32, tid % 32


def _exchange(value):
    """All 32 lanes' ``value`` (a list indexed by lane) for this lane's warp."""
    ctx = _sim_ctx()
    warp, lane = _lane_ids(ctx)
    n = getattr(_calls, "n", 0)
    _calls.n = n + 1
    slot = _slots.setdefault((warp, n & 1), [None] * 32)
    slot[lane] = value
    ctx.syncthreads()
    return list(slot), lane


def _word(arr, off):
    """The little-endian 32-bit word at byte ``off`` of a uint8/int8 array, as int32."""
    b = np.asarray([int(arr[off + i]) & 0xFF for i in range(4)], np.uint8)
    return np.int32(b.view(np.int32)[0])


def _bytes(w, signed):
    b = np.asarray([w], np.int32).view(np.int8 if signed else np.uint8)
    return [int(v) for v in b]


def _a_matrix(lanes_a, decode, per=4):
    """A [16, 8 per] from the lanes' (a0, a1, a2, a3), ``per`` elements a register (4 of
    8 bits: m16n8k32; 2 of 16 bits: m16n8k16)."""
    A = np.zeros((16, 8 * per), np.float64)
    for lane, regs in enumerate(lanes_a):
        g, t = lane // 4, lane % 4
        for r, (row, col) in enumerate(((g, per * t), (g + 8, per * t), (g, 4 * per + per * t),
                                        (g + 8, 4 * per + per * t))):  # fmt: skip
            A[row, col:col + per] = decode(regs[r])
    return A


def _b_matrix(lanes_b, decode, per=4):
    """B [8 per, 8] from the lanes' (b0, b1), ``per`` elements a register."""
    B = np.zeros((8 * per, 8), np.float64)
    for lane, regs in enumerate(lanes_b):
        g, t = lane // 4, lane % 4
        B[per * t:per * t + per, g] = decode(regs[0])
        B[4 * per + per * t:4 * per + per * t + per, g] = decode(regs[1])
    return B


def _mma_twin(a, b, c, dec_a, dec_b, out, per=4):
    lanes, lane = _exchange((a, b))
    A = _a_matrix([x[0] for x in lanes], dec_a, per)
    B = _b_matrix([x[1] for x in lanes], dec_b, per)
    g, t = lane // 4, lane % 4
    d = []
    for i, (row, col) in enumerate(((g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1))):
        s = float(np.dot(A[row], B[:, col]))
        if out == "s32":
            d.append(np.int32(int(s) + int(c[i])))  # exact: |s| < 2^21
        else:
            d.append(np.float32(s + float(c[i])))
    return tuple(d)


def _dec_s8(w):
    return _bytes(w, True)


def _dec_u8(w):
    return _bytes(w, False)


def _dec_table(table):
    """Decode of a word's 4 bytes (one element each) by a 256-entry value table."""

    def dec(w):
        return [table[v] for v in _bytes(w, False)]

    return dec


def _dec_fp8(fmt):
    return _dec_table(_FP8_TABLE[fmt])


def _dec_bf16(w):
    """The two bfloat16 values of a 32-bit word, the low half first."""
    return np.asarray([w], np.int32).view(ml_dtypes.bfloat16).astype(np.float64).tolist()


# ----------------------------------------------------------------------------- stubs (= twins)
def ldmatrix_x4(smem, off):
    """``ldmatrix.sync.aligned.m8n8.x4.shared.b16``: this lane's four 32-bit words (int32).

    ``smem``: a shared uint8 array; ``off``: the byte offset in it of the 16-byte row this
    lane supplies (row ``lane % 8`` of matrix ``lane // 8``); 16-byte aligned. Warp-wide."""
    lanes, lane = _exchange(int(off))
    row = lane // 4
    return tuple(_word(smem, lanes[8 * j + row] + 4 * (lane % 4)) for j in range(4))


def mma_s8s8(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """``mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32``: D = A * B + C on int8
    fragments (layout in the module docstring); returns (d0, d1, d2, d3) int32. Warp-wide."""
    return _mma_twin((a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3), _dec_s8, _dec_s8, "s32")


def mma_u8s8(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """``mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32``: A holds uint8 (asymmetric
    activation codes), B int8. Returns (d0, d1, d2, d3) int32. Warp-wide."""
    return _mma_twin((a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3), _dec_u8, _dec_s8, "s32")


def _make_fp8_stub(fa, fb):
    da, db = _dec_fp8(fa), _dec_fp8(fb)

    def mma_fp8_stub(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        return _mma_twin((a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3), da, db, "f32")

    mma_fp8_stub.__name__ = f"mma_{fa}_{fb}"
    mma_fp8_stub.__doc__ = (
        f"``mma.sync.aligned.m16n8k32.row.col.f32.{fa}.{fb}.f32`` (sm_89+): D = A * B + C with "
        f"{fa} A and {fb} B fragments (uint8 codes packed in int32), float32 C / D. Warp-wide."
    )
    return mma_fp8_stub


_FP8_STUBS = {(fa, fb): _make_fp8_stub(fa, fb) for fa in FP8_TYPES for fb in FP8_TYPES}


def mma_fp8(fa: str, fb: str):
    """The fp8 ``mma`` stub for A in ``fa`` and B in ``fb`` (each "e4m3" or "e5m2")."""
    return _FP8_STUBS[(fa, fb)]


def mma_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`` (sm_80+): D = A * B + C with
    bfloat16 A (16 x 16) and B (16 x 8) fragments, two bf16 bit patterns packed in each
    int32 (the lower K index in the low half; layout in the module docstring), float32 C /
    D. Returns (d0, d1, d2, d3) float32. Warp-wide."""
    return _mma_twin((a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3), _dec_bf16, _dec_bf16, "f32", per=2)


def cp_async16(smem, soff, gmem, goff, nbytes):
    """``cp.async.cg.shared.global [smem + soff], [gmem + goff], 16, nbytes``: copy
    ``nbytes`` (0 or 16) bytes from global uint8 ``gmem`` and fill the rest of the 16
    shared bytes with zeros. Both addresses 16-byte aligned. Per lane."""
    for i in range(16):
        smem[soff + i] = gmem[goff + i] if i < nbytes else 0


def cp_async_commit():
    """``cp.async.commit_group``. The twin copies at once, so nothing is pending."""


def _make_wait(n):
    def cp_async_wait_stub():
        """``cp.async.wait_group n``: at most n of this thread's committed groups pending."""

    cp_async_wait_stub.__name__ = f"cp_async_wait{n}"
    return cp_async_wait_stub


_WAITS = {n: _make_wait(n) for n in range(8)}


def cp_async_wait(n: int):
    """The ``cp.async.wait_group n`` stub (n is a PTX immediate, so one function each)."""
    return _WAITS[n]


def cp_async_unit(smem, sb, si, gmem, gi, ok):
    """``cp.async.cg.shared.global`` of one 16-byte unit between uint32 arrays: words
    ``si .. si + 3`` of shared ``smem`` (``sb``: its ``smem_addr``) from words ``gi .. gi
    + 3`` of global ``gmem``, or zeros where not ``ok`` (``gmem`` is then not read). Word
    indices, both units 16-byte aligned. Per thread; complete (and visible to this thread)
    after a ``cp_async_wait`` that covers its group. The twin copies at once."""
    for k in range(4):
        smem[si + k] = gmem[gi + k] if ok else np.uint32(0)


def cp_async_unit_l2_256(smem, sb, si, gmem, gi, ok):
    """``cp_async_unit`` with the ``.L2::256B`` prefetch size (a miss brings the 256-byte
    aligned piece around the unit into L2); the same twin."""
    cp_async_unit(smem, sb, si, gmem, gi, ok)


def ld_shared_u32x4(smem, sb, si):
    """``ld.shared.v4.u32``: words ``si .. si + 3`` (``si % 4 == 0``) of shared uint32
    ``smem`` (``sb``: its ``smem_addr``), one 16-byte load (four 32-bit loads of
    16-byte strided lanes would conflict)."""
    return smem[si], smem[si + 1], smem[si + 2], smem[si + 3]


# ----------------------------------------------------------------------------- the GPU side
if not SIMULATOR:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic, overload

    _I32 = ir.IntType(32)
    _F32 = ir.FloatType()

    def _ret_tuple(context, builder, sig, st, n):
        vals = [builder.extract_value(st, i) for i in range(n)]
        return context.make_tuple(builder, sig.return_type, vals)

    @intrinsic
    def _smem_u32(typingctx, arr):
        """The 32-bit shared-window address of a shared array's first element."""
        sig = types.uint32(arr)

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            p = builder.ptrtoint(ary.data, ir.IntType(64))
            fty = ir.FunctionType(_I32, [ir.IntType(64)])
            asm = ir.InlineAsm(fty, "{ .reg .u64 t; cvta.to.shared.u64 t, $1; cvt.u32.u64 $0, t; }", "=r,l")
            return builder.call(asm, [p])

        return sig, codegen

    @intrinsic
    def _gmem_u64(typingctx, arr):
        """The global address of an array's first element."""
        sig = types.uint64(arr)

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            return builder.ptrtoint(ary.data, ir.IntType(64))

        return sig, codegen

    def _shared_x4(text, ty):
        """An intrinsic: four 32-bit words (Numba type ``ty``) read from a 32-bit shared
        address by the one PTX instruction ``text``. A side effect: it reads what cp.async
        wrote, so it must stay after the waits and barriers."""

        @intrinsic
        def _load(typingctx, addr):
            sig = types.UniTuple(ty, 4)(types.uint32)

            def codegen(context, builder, sig, args):
                st = ir.LiteralStructType([_I32] * 4)
                fty = ir.FunctionType(st, [_I32])
                asm = ir.InlineAsm(fty, text, "=r,=r,=r,=r,r", side_effect=True)
                return _ret_tuple(context, builder, sig, builder.call(asm, args), 4)

            return sig, codegen

        return _load

    _ldsm_x4 = _shared_x4("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];", types.int32)
    _lds_u32x4 = _shared_x4("ld.shared.v4.u32 {$0, $1, $2, $3}, [$4];", types.uint32)

    def _mma_intrinsic(ptx_types, acc, shape="m16n8k32"):
        ity = types.int32 if acc == "s32" else types.float32
        lty = _I32 if acc == "s32" else _F32
        cc = "r" if acc == "s32" else "f"

        @intrinsic
        def _mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            sig = types.UniTuple(ity, 4)(*([types.int32] * 6 + [ity] * 4))

            def codegen(context, builder, sig, args):
                st = ir.LiteralStructType([lty] * 4)
                fty = ir.FunctionType(st, [_I32] * 6 + [lty] * 4)
                asm = ir.InlineAsm(
                    fty,
                    f"mma.sync.aligned.{shape}.row.col.{ptx_types} "
                    "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
                    f"={cc},={cc},={cc},={cc},r,r,r,r,r,r,{cc},{cc},{cc},{cc}",
                )
                return _ret_tuple(context, builder, sig, builder.call(asm, args), 4)

            return sig, codegen

        return _mma

    def _join(stub, intr):
        @overload(stub, target="cuda")
        def _ol(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            def impl(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
                return intr(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)

            return impl

    _join(mma_s8s8, _mma_intrinsic("s32.s8.s8.s32", "s32"))
    _join(mma_u8s8, _mma_intrinsic("s32.u8.s8.s32", "s32"))
    for (_fa, _fb), _stub in _FP8_STUBS.items():
        _join(_stub, _mma_intrinsic(f"f32.{_fa}.{_fb}.f32", "f32"))
    _join(mma_bf16, _mma_intrinsic("f32.bf16.bf16.f32", "f32", "m16n8k16"))

    @overload(ldmatrix_x4, target="cuda")
    def _ol_ldmatrix_x4(smem, off):
        def impl(smem, off):
            return _ldsm_x4(_smem_u32(smem) + np.uint32(off))

        return impl

    def _cp_async16_intrinsic(prefetch):
        def cp(typingctx, saddr, gaddr, nbytes):
            sig = types.void(types.uint32, types.uint64, types.uint32)

            def codegen(context, builder, sig, args):
                fty = ir.FunctionType(ir.VoidType(), [_I32, ir.IntType(64), _I32])
                asm = ir.InlineAsm(fty, f"cp.async.cg.shared.global{prefetch} [$0], [$1], 16, $2;", "r,l,r",
                                   side_effect=True)
                builder.call(asm, args)
                return context.get_dummy_value()

            return sig, codegen

        return intrinsic(cp)

    _cp_async16 = _cp_async16_intrinsic("")
    _cp_async16_l2_256 = _cp_async16_intrinsic(".L2::256B")

    @overload(cp_async16, target="cuda")
    def _ol_cp_async16(smem, soff, gmem, goff, nbytes):
        def impl(smem, soff, gmem, goff, nbytes):
            _cp_async16(_smem_u32(smem) + np.uint32(soff), _gmem_u64(gmem) + np.uint64(goff), np.uint32(nbytes))

        return impl

    def _unit_copy(cp):
        """The body of a ``cp_async_unit`` overload that copies by the intrinsic ``cp``."""

        def impl(smem, sb, si, gmem, gi, ok):
            g = np.uint64(gi) if ok else np.uint64(0)
            n = np.uint32(16) if ok else np.uint32(0)
            cp(np.uint32(sb) + np.uint32(si) * np.uint32(4), _gmem_u64(gmem) + g * np.uint64(4), n)

        return impl

    @overload(cp_async_unit, target="cuda")
    def _ol_cp_async_unit(smem, sb, si, gmem, gi, ok):
        return _unit_copy(_cp_async16)

    @overload(cp_async_unit_l2_256, target="cuda")
    def _ol_cp_async_unit_l2_256(smem, sb, si, gmem, gi, ok):
        return _unit_copy(_cp_async16_l2_256)

    @overload(ld_shared_u32x4, target="cuda")
    def _ol_ld_shared_u32x4(smem, sb, si):
        def impl(smem, sb, si):
            return _lds_u32x4(np.uint32(sb) + np.uint32(si) * np.uint32(4))

        return impl

    from ._asm import void_asm as _void_asm

    def _join0(stub, intr):
        @overload(stub, target="cuda")
        def _ol():
            def impl():
                intr()

            return impl

    _join0(cp_async_commit, _void_asm("cp.async.commit_group;"))
    for _n, _stub in _WAITS.items():
        _join0(_stub, _void_asm(f"cp.async.wait_group {_n};"))


# ============================================================================= sm_90a: wgmma
# Warpgroup MMA (PTX ISA 8.0+, sm_90a only): 128 threads (4 warps) compute D[64, N] +=
# A[64, 32] @ B[32, N] with both operands in shared memory, described by 64-bit "matrix
# descriptors". The kernels use one layout only: K-major tiles whose rows are 128 bytes
# (128 8-bit elements of K) with the 128-byte swizzle, 8-row atoms of 1024 bytes:
#
#   byte of element (r, k) = (r // 8) * 1024 + (r % 8) * 128 + (((k // 16) ^ (r % 8)) * 16) + k % 16
#
# i.e. the hardware XORs address bits [4:6] with bits [7:9] (tile base 1024-byte aligned);
# a K step of 32 inside the 128-byte row moves the descriptor's start address by 32 bytes.
# Descriptor: bits 0-13 start >> 4, 16-29 leading byte offset >> 4 (unused for this
# layout: 1), 32-45 stride byte offset >> 4 (1024 between 8-row atoms), 62-63 swizzle
# (1 = 128 B). D fragment (m64nNk32, 32-bit): thread t of the warpgroup, w = t // 32,
# g = t % 32 // 4, q = t % 4: d[4j + 2h + e] = D[16 w + g + 8 h, 8 j + 2 q + e].
# The bfloat16 kind (``m64nNk16.f32.bf16.bf16``) reads the same tiles in bytes: a 128-byte
# row holds 64 bf16 elements of K, one wgmma's 16 of K are its 32 bytes, so descriptors,
# swizzle and K steps are those of the 8-bit kinds (as m16n8k16 is to m16n8k32 above); the
# D fragment is the same. Its two transpose immediates are 0 (both operands K-major).
WGMMA_SBO = 1024


def smem_addr(smem):
    """The 32-bit shared-window address of a shared array's start (the twin: 0, so the
    simulator's "addresses" are byte offsets into the array)."""
    return 0


def wgmma_desc(addr):
    """Descriptor of a K-major, 128-byte-swizzled tile starting at shared address ``addr``."""
    return np.uint64(((addr & 0x3FFFF) >> 4) | (1 << 16) | ((WGMMA_SBO >> 4) << 32) | (1 << 62))


def _sw128_read(smem, desc, rows, k32=32):
    """[rows, 32] bytes a descriptor points at (the twin's model of the swizzle)."""
    start = (int(desc) & 0x3FFF) << 4
    sbo = ((int(desc) >> 32) & 0x3FFF) << 4
    r = np.arange(rows)[:, None]
    lin = start + (r // 8) * sbo + (r % 8) * 128 + np.arange(k32)[None, :]
    phys = lin ^ (((lin >> 7) & 7) << 4)
    return np.asarray(smem).view(np.uint8)[phys]


def _wgmma_k(kind: str) -> int:
    """K (elements) of one wgmma of ``kind``: 16 for bf16, 32 for the 8-bit kinds (32 bytes either way)."""
    return 16 if kind == "bf16.bf16" else 32


def _make_wgmma_stub(kind, n):
    dec = {"s8": lambda b: b.view(np.int8).astype(np.float64), "u8": lambda b: b.astype(np.float64),
           "bf16": lambda b: np.ascontiguousarray(b).view(ml_dtypes.bfloat16).astype(np.float64)}  # fmt: skip
    for f in FP8_TYPES:
        dec[f] = (lambda t: lambda b: t[b])(_FP8_TABLE[f])
    ta, tb = kind.split(".")
    integer = ta in ("s8", "u8")
    k = _wgmma_k(kind)

    def wgmma_stub(acc, smem, desc_a, desc_b, scale_d):
        ctx = _sim_ctx()
        tid = ctx.threadIdx.x % 128
        w, g, q = tid // 32, (tid % 32) // 4, tid % 4
        rows = (16 * w + g, 16 * w + g + 8)
        A = dec[ta](_sw128_read(smem, desc_a, 64))
        B = dec[tb](_sw128_read(smem, desc_b, n))
        for j in range(n // 8):
            for h in range(2):
                for e in range(2):
                    s = float(np.dot(A[rows[h]], B[8 * j + 2 * q + e]))
                    x = 4 * j + 2 * h + e
                    old = acc[x] if scale_d else 0
                    acc[x] = np.int32(int(s) + int(old)) if integer else np.float32(s + float(old))

    wgmma_stub.__name__ = f"wgmma_m64n{n}k{k}_{kind.replace('.', '_')}"
    wgmma_stub.__doc__ = (
        f"``wgmma.mma_async.sync.aligned.m64n{n}k{k}.{'s32' if integer else 'f32'}.{ta}.{tb}``: "
        f"acc[{n // 2}] (this thread's D fragment, a local array) = A @ B + (acc if scale_d else 0), "
        f"A [64, {k}] and B [N, {k}] (32 bytes a row) read from shared memory through descriptors. Warpgroup-wide, "
        "asynchronous: fence before, commit and wait after (the twin is synchronous)."
    )
    return wgmma_stub


WGMMA_KINDS = ("s8.s8", "u8.s8", "bf16.bf16") + tuple(f"{a}.{b}" for a in FP8_TYPES for b in FP8_TYPES)
_WGMMA_STUBS: dict = {}


def wgmma(kind: str, n: int):
    """The wgmma stub for operand types ``kind`` (``WGMMA_KINDS``: "s8.s8", "u8.s8",
    "e4m3.e5m2", ..., "bf16.bf16") and N."""
    if kind not in WGMMA_KINDS:
        raise ValueError(f"wgmma kind {kind!r}: one of {', '.join(WGMMA_KINDS)}")
    key = (kind, n)
    if key not in _WGMMA_STUBS:
        _WGMMA_STUBS[key] = stub = _make_wgmma_stub(kind, n)
        if not SIMULATOR:
            _join_wgmma(stub, kind, n)
    return _WGMMA_STUBS[key]


def wgmma_fence():
    """``wgmma.fence.sync.aligned``: order register / shared accesses before the next wgmma."""


def wgmma_commit():
    """``wgmma.commit_group.sync.aligned``."""


def _make_wgmma_wait(n):
    def wgmma_wait_stub():
        """``wgmma.wait_group.sync.aligned n``: at most n committed wgmma groups pending."""

    wgmma_wait_stub.__name__ = f"wgmma_wait{n}"
    return wgmma_wait_stub


_WG_WAITS = {n: _make_wgmma_wait(n) for n in range(4)}
wgmma_wait0 = _WG_WAITS[0]


def wgmma_wait(n: int):
    """The ``wgmma.wait_group.sync.aligned n`` stub (n is a PTX immediate)."""
    return _WG_WAITS[n]


def fence_proxy_async():
    """``fence.proxy.async.shared::cta``: make generic-proxy shared writes (cp.async,
    st.shared) visible to the async proxy that wgmma reads through."""


if not SIMULATOR:

    @overload(smem_addr, target="cuda")
    def _ol_smem_addr(smem):
        def impl(smem):
            return _smem_u32(smem)

        return impl

    @overload(wgmma_desc, target="cuda")
    def _ol_wgmma_desc(addr):
        def impl(addr):
            return (np.uint64((addr & 0x3FFFF) >> 4) | np.uint64(1 << 16) | np.uint64((WGMMA_SBO >> 4) << 32)
                    | np.uint64(1 << 62))  # fmt: skip

        return impl

    _join0(wgmma_fence, _void_asm("wgmma.fence.sync.aligned;"))
    _join0(wgmma_commit, _void_asm("wgmma.commit_group.sync.aligned;"))
    for _n, _stub in _WG_WAITS.items():
        _join0(_stub, _void_asm(f"wgmma.wait_group.sync.aligned {_n};"))
    _join0(fence_proxy_async, _void_asm("fence.proxy.async.shared::cta;"))

    def _join_wgmma(stub, kind, n):
        ta, tb = kind.split(".")
        integer = ta in ("s8", "u8")
        nacc = n // 2
        lty = _I32 if integer else _F32
        c = "r" if integer else "f"
        regs = ", ".join(f"${i}" for i in range(nacc))
        # scale-d, then (floats) imm-scale-a / -b = 1 and (bf16) imm-trans-a / -b = 0
        tail = "p" if integer else ("p, 1, 1, 0, 0" if ta == "bf16" else "p, 1, 1")
        text = (
            "{ .reg .pred p; setp.ne.b32 p, $" + str(2 * nacc + 2) + ", 0; "
            f"wgmma.mma_async.sync.aligned.m64n{n}k{_wgmma_k(kind)}.{'s32' if integer else 'f32'}.{ta}.{tb} "
            "{" + regs + "}, $" + str(2 * nacc) + ", $" + str(2 * nacc + 1) + f", {tail}; }}"
        )
        cons = ",".join([f"={c}"] * nacc + [str(i) for i in range(nacc)] + ["l", "l", "r"])

        @intrinsic
        def _wg(typingctx, acc, da, db, sd):
            sig = types.void(acc, types.uint64, types.uint64, types.int32)

            def codegen(context, builder, sig, args):
                ary = context.make_array(sig.args[0])(context, builder, args[0])
                ptrs = [builder.gep(ary.data, [ir.Constant(ir.IntType(64), i)], inbounds=True) for i in range(nacc)]
                vals = [builder.load(p) for p in ptrs]
                st = ir.LiteralStructType([lty] * nacc)
                fty = ir.FunctionType(st, [lty] * nacc + [ir.IntType(64), ir.IntType(64), _I32])
                asm = ir.InlineAsm(fty, text, cons, side_effect=True)
                res = builder.call(asm, vals + list(args[1:]))
                for i, p in enumerate(ptrs):
                    builder.store(builder.extract_value(res, i), p)
                return context.get_dummy_value()

            return sig, codegen

        @overload(stub, target="cuda")
        def _ol(acc, smem, desc_a, desc_b, scale_d):
            def impl(acc, smem, desc_a, desc_b, scale_d):
                _wg(acc, desc_a, desc_b, np.int32(scale_d))

            return impl


# ============================================================================= mbarriers
# A shared-memory mbarrier (PTX ISA "mbarrier", sm_80+; try_wait sm_90): an 8-byte object
# counting arrivals; when the pending count of the current phase reaches 0 the phase flips
# and the count is reloaded. ``try_wait.parity p`` is true once the phase of parity p has
# completed (a waiter tracks the parity of the use it waits for). The GEMM pipeline keeps
# one "full" (copies landed) and one "empty" (wgmma's done reading) barrier per ring slot,
# so the two warpgroups synchronise through the ring instead of a block-wide barrier.
#
# Twins: the state lives in the barrier's own 8 shared bytes, as two uint32 words
# (pending arrivals; expected count * 2 + phase bit), updated under one lock; a failed
# try_wait yields the GIL, so the simulator's preemptive threads make progress.
_MBAR_LOCK = threading.Lock()


def _mbar_words(smem, off):
    return np.asarray(smem).view(np.uint8)[off:off + 8].view(np.uint32)


def mbarrier_init(smem, off, count):
    """``mbarrier.init.shared::cta.b64 [smem + off], count``: phase 0, ``count`` arrivals
    expected per phase. One thread; a block barrier before anyone else uses it."""
    with _MBAR_LOCK:
        w = _mbar_words(smem, off)
        w[0] = count
        w[1] = 2 * count


def mbarrier_arrive(smem, off):
    """``mbarrier.arrive.shared::cta.b64``: this thread's arrival (release semantics)."""
    with _MBAR_LOCK:
        w = _mbar_words(smem, off)
        if w[0] == 0:
            raise RuntimeError(f"mbarrier at {off}: more arrivals than expected")
        w[0] -= 1
        if w[0] == 0:  # phase complete: flip the phase bit, reload the count
            w[1] ^= 1
            w[0] = w[1] >> 1


def cp_async_mbarrier_arrive(smem, off):
    """``cp.async.mbarrier.arrive.noinc.shared::cta.b64``: arrive once all of this thread's
    earlier ``cp.async`` copies have landed (``noinc``: the arrival is one of the count
    given to init). The twin's copies are synchronous, so it arrives at once."""
    mbarrier_arrive(smem, off)


def mbarrier_try_wait(smem, off, parity):
    """``mbarrier.try_wait.parity.shared::cta.b64``: True once the phase of parity
    ``parity`` has completed (acquire semantics); the hardware suspends a while before
    answering False. Loop on it: ``while not mbarrier_try_wait(...): pass``."""
    with _MBAR_LOCK:
        done = (int(_mbar_words(smem, off)[1]) & 1) != (parity & 1)
    if not done:
        import time

        time.sleep(1e-4)  # let the simulator's other threads arrive
    return done


if not SIMULATOR:

    def _mbar_asm(text, cons, nargs, ret=False):
        """An intrinsic of ``nargs`` uint32 operands (shared addresses, counts) emitting
        ``text``; returns a uint32 when ``ret``. Ordered against memory (``~{memory}``)."""
        rty = types.uint32 if ret else types.void

        def codegen(context, builder, sig, args):
            fty = ir.FunctionType(_I32 if ret else ir.VoidType(), [_I32] * nargs)
            r = builder.call(ir.InlineAsm(fty, text, cons + ",~{memory}", side_effect=True), list(args))
            return r if ret else context.get_dummy_value()

        if nargs == 1:

            @intrinsic
            def _asm1(typingctx, x):
                return rty(types.uint32), codegen

            return _asm1

        @intrinsic
        def _asm2(typingctx, x, y):
            return rty(types.uint32, types.uint32), codegen

        return _asm2

    _mbar_init = _mbar_asm("mbarrier.init.shared::cta.b64 [$0], $1;", "r,r", 2)
    _mbar_arrive = _mbar_asm("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [$0]; }", "r", 1)
    _cp_mbar_arrive = _mbar_asm("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [$0];", "r", 1)
    _mbar_try_wait = _mbar_asm(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; selp.u32 $0, 1, 0, p; }",
        "=r,r,r", 2, ret=True)  # fmt: skip

    @overload(mbarrier_init, target="cuda")
    def _ol_mbarrier_init(smem, off, count):
        def impl(smem, off, count):
            _mbar_init(_smem_u32(smem) + np.uint32(off), np.uint32(count))

        return impl

    @overload(mbarrier_arrive, target="cuda")
    def _ol_mbarrier_arrive(smem, off):
        def impl(smem, off):
            _mbar_arrive(_smem_u32(smem) + np.uint32(off))

        return impl

    @overload(cp_async_mbarrier_arrive, target="cuda")
    def _ol_cp_async_mbarrier_arrive(smem, off):
        def impl(smem, off):
            _cp_mbar_arrive(_smem_u32(smem) + np.uint32(off))

        return impl

    @overload(mbarrier_try_wait, target="cuda")
    def _ol_mbarrier_try_wait(smem, off, parity):
        def impl(smem, off, parity):
            return _mbar_try_wait(_smem_u32(smem) + np.uint32(off), np.uint32(parity)) != 0

        return impl


# ============================================================================= warp specialisation
# A warp-specialised kernel splits its warpgroups into a producer (loads) and consumers
# (wgmma + promotion). ``setmaxnreg`` (sm_90a, warpgroup-wide) moves registers between
# them: the producer gives its registers back to the CTA's pool, the consumers take them
# (the kernel's launch count times its threads must cover both; ptxas allocates each side
# within its count). The twin: ``setmaxnreg`` changes nothing the simulator can see (no-op).
def _make_setmaxnreg(op, n):
    def setmaxnreg_stub():
        """``setmaxnreg.{op}.sync.aligned.u32 n``: this warpgroup's registers per thread
        become n (the twin: no-op)."""

    setmaxnreg_stub.__name__ = f"setmaxnreg_{op}{n}"
    setmaxnreg_stub.__doc__ = setmaxnreg_stub.__doc__.replace("{op}", op).replace(" n``", f" {n}``")
    return setmaxnreg_stub


@lru_cache(maxsize=None)
def setmaxnreg(op: str, n: int):
    """The ``setmaxnreg.{inc,dec}.sync.aligned.u32 n`` stub (n: 24 .. 256, a multiple of 8)."""
    if op not in ("inc", "dec") or n % 8 or not 24 <= n <= 256:
        raise ValueError(f"setmaxnreg: op must be 'inc' or 'dec' and n a multiple of 8 in [24, 256], got {op!r}, {n}")
    return _void_stub(_make_setmaxnreg(op, n), f"setmaxnreg.{op}.sync.aligned.u32 {n};")


def _void_stub(stub, asm):
    """``stub``, lowered to the operand-less instruction ``asm`` when compiling for a GPU
    (the simulator calls the stub's body: its twin)."""
    if not SIMULATOR:
        _join0(stub, _void_asm(asm))
    return stub

