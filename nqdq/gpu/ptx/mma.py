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
``smem_addr(s)``             ``cvta.to.shared``: a shared array's 32-bit shared-window address
===========================  ==========================================================

sm_90a's ``wgmma``, its mbarriers and ``setmaxnreg``: ``ptx.wgmma``.

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

import ml_dtypes
import numpy as np

from ..runtime.target import SIMULATOR

__all__ = [
    "ldmatrix_x4", "mma_s8s8", "mma_u8s8", "mma_fp8", "mma_bf16", "cp_async16", "cp_async_commit",
    "cp_async_wait", "cp_async_unit", "cp_async_unit_l2_256", "ld_shared_u32x4", "smem_addr", "FP8_TYPES",
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


def smem_addr(smem):
    """The 32-bit shared-window address of a shared array's start (the twin: 0, so the
    simulator's "addresses" are byte offsets into the array)."""
    return 0


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

    @overload(smem_addr, target="cuda")
    def _ol_smem_addr(smem):
        def impl(smem):
            return _smem_u32(smem)

        return impl
