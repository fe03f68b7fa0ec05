"""NVIDIA-only inline PTX, each with its portable twin.

``cvt_fp8(v, fmt)``: the float8 code of float32 ``v`` by one ``cvt.rn.satfinite.e4m3x2.f32``
(or ``.e5m2x2``) instruction, sm_89 and newer. It rounds to nearest even and saturates
finite values and +-inf to +-max, exactly as the bit-manipulation encoder
(``_codec.encode_float_rne``) does; only NaN differs (the instruction writes a canonical
NaN, the spec keeps the NaN's sign), so NaN lanes are fixed up after it.

The twin (``_codec.encode_float_rne``) is what the CUDA simulator, numba-hip and GPUs older
than sm_89 run; ``tests/test_kernels.py::test_fp8_cvt_matches_twin`` compares the two on a
GPU over every bfloat16 value and random float32 bit patterns.

Selection: each inline-PTX intrinsic is defined where ``_target.PTX`` (numba-cuda); where it
is not, the name is bound to its twin: the Python function itself under the simulator, the
same function compiled as a device function on AMD (numba-hip; ``_target.device_twin``).
On AMD every twin is integer / float32 scalar code that compiles as a device function. The
16-bit pair instructions also have twins in NumPy (``*_twin``: exact over whole arrays, which
the CPU tests call with every bfloat16 value at once), which the simulator keeps;
tests/test_amd_twins.py checks the scalar twins (``*_scalar``) against them.
Intrinsics that emit plain LLVM IR (``array_addr``, ``as_u32``, ``as_u16``) are portable
and stay on both compiled targets.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from numba import float32 as _float32

from ..runtime.backend import cuda as _cuda
from ..runtime.target import HIP, PTX, SIMULATOR, devfn
from ..runtime.target import device_twin as _twin

E4M3 = 4  # fmt[8] (exponent bits) of the formats the instruction covers
E5M2 = 5


@functools.lru_cache(maxsize=None)
def fp8_cvt_available() -> bool:
    """Whether kernels built now may use the cvt instruction: not in the simulator, not
    disabled by NQDQ_FP8_CVT=0, and the current GPU is sm_89+ (with no GPU, compile-only
    tools such as the PTX audit target sm_90: yes). Never on AMD (a PTX instruction)."""
    if not PTX or os.environ.get("NQDQ_FP8_CVT", "1") == "0":
        return False
    from ..runtime.backend import cuda

    try:
        if not cuda.is_available():
            return True
        return tuple(cuda.get_current_device().compute_capability) >= (8, 9)
    except Exception:  # pragma: no cover - no driver: compile-only
        return True


def fp8_cvt_supports(fmt) -> bool:
    """The element format is e4m3fn (max 448) or e5m2 (max 57344), 8 bits, saturating."""
    return fmt[0] == 1 and fmt[5] == 8 and ((fmt[8] == E4M3 and fmt[1] == 3) or (fmt[8] == E5M2 and fmt[1] == 2))


if not SIMULATOR:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.cuda.extending import intrinsic

if PTX:

    def _cvt_intrinsic(ptx_type):
        @intrinsic
        def _cvt(typingctx, v):
            sig = types.uint16(types.float32)

            def codegen(context, builder, sig, args):
                fty = ir.FunctionType(ir.IntType(16), [ir.FloatType(), ir.FloatType()])
                # d = {hi: a, lo: b}; a = 0 so the low byte is v's code and the high byte 0
                asm = ir.InlineAsm(fty, f"cvt.rn.satfinite.{ptx_type}.f32 $0, $1, $2;", "=h,f,f")
                return builder.call(asm, [ir.Constant(ir.FloatType(), 0.0), args[0]])

            return sig, codegen

        return _cvt

    cvt_e4m3 = _cvt_intrinsic("e4m3x2")
    cvt_e5m2 = _cvt_intrinsic("e5m2x2")
else:  # pragma: no cover - never called where fp8_cvt_available() is False (simulator, AMD)
    cvt_e4m3 = cvt_e5m2 = None

_ = np


# ----------------------------------------------------------------------------- addresses
if not SIMULATOR:

    @intrinsic
    def array_addr(typingctx, a):
        """The device address of array ``a``'s first element (to test alignment before
        reading it through a wider view)."""
        sig = types.uint64(a)

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            return builder.ptrtoint(ary.data, ir.IntType(64))

        return sig, codegen

else:

    def array_addr(a):
        """Simulator twin: NumPy views need no alignment, so report an aligned address."""
        return 0


# ----------------------------------------------------------------------------- word views
# Kernels read 16-bit inputs and write 8-bit codes through 32-bit (and 16-bit) views of the
# same memory. Numba's ``a[:k].view(np.uint32)`` checks size and contiguity on the device and
# exits on failure: about 60 SASS instructions a view, ahead of a kernel's first load (the
# row kernel's three: 190 instructions before its first load, 0.4-0.7 us of a bf16
# 8192x8192 fp8_row; docs/design/last-axis.md, "Word views"). ``as_u32`` / ``as_u16``
# build the view's array struct directly: the same data pointer, the array's whole 32-bit
# (16-bit) words, which every array a plan passes allows (1-D and contiguous: the Allocator's
# or a 1-D view of the caller's). Their twins are the slicing views the simulator runs.
if not SIMULATOR:

    def _as_words(ty, size):
        @intrinsic
        def as_words(typingctx, a):
            rty = types.Array(ty, 1, "C")

            def codegen(context, builder, sig, args):
                src = context.make_array(sig.args[0])(context, builder, args[0])
                dst = context.make_array(rty)(context, builder)
                size_c = ir.Constant(ir.IntType(64), size)
                n = builder.udiv(builder.mul(src.nitems, src.itemsize), size_c)
                context.populate_array(dst, data=builder.bitcast(src.data, dst.data.type),
                                       shape=cgutils.pack_array(builder, [n]),
                                       strides=cgutils.pack_array(builder, [size_c]), itemsize=size_c,
                                       meminfo=src.meminfo, parent=src.parent)  # fmt: skip
                return dst._getvalue()

            return rty(a), codegen

        return as_words

    as_u32 = _as_words(types.uint32, 4)
    as_u16 = _as_words(types.uint16, 2)

else:

    def as_u32(a):
        """Simulator twin: the array's whole 32-bit words as a uint32 view."""
        k = a.size * a.dtype.itemsize // 4 * 4 // a.dtype.itemsize
        return a[:k].view(np.uint32)

    def as_u16(a):
        """Simulator twin: the array's whole 16-bit words as a uint16 view."""
        k = a.size * a.dtype.itemsize // 2 * 2 // a.dtype.itemsize
        return a[:k].view(np.uint16)


if PTX:

    @intrinsic
    def prefetch_l2(typingctx, a, i):
        """``prefetch.global.L2`` of the line holding word 4*i of the uint32 array ``a``."""
        sig = types.void(a, i)

        def codegen(context, builder, sig, args):
            arr = context.make_array(sig.args[0])(context, builder, args[0])
            i4 = builder.mul(context.cast(builder, args[1], sig.args[1], types.int64), ir.Constant(ir.IntType(64), 4))
            ptr = builder.gep(arr.data, [i4])
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [ptr.type]), "prefetch.global.L2 [$0];", "l",
                               side_effect=True)  # fmt: skip
            builder.call(asm, [ptr])
            return context.get_dummy_value()

        return sig, codegen

else:

    @_twin
    def prefetch_l2(a, i):
        """Twin: nothing (a prefetch changes no value)."""


# ----------------------------------------------------------------------------- wide memory access
# The last-axis kernels (_rowwise_kernels) move 16 bytes of input per load and 8 bytes of
# codes per store: one instruction where Numba's element indexing would issue 4-8. On a GPU
# these are PTX vector instructions; the twins (simulator, numba-hip) index the arrays.
# Callers guarantee alignment: the input's address is tested (array_addr(x) & 15) and the
# codes array is one the plan allocated (CuPy / Numba allocations are 256-byte aligned).
# ``fp8x2``: two float8 codes by one cvt (sm_89+), the pair form of cvt_e4m3 / cvt_e5m2.
if not SIMULATOR:

    def _elem_ptr(context, builder, aryty, ary, idx, idxty):
        arr = context.make_array(aryty)(context, builder, ary)
        i64 = context.cast(builder, idx, idxty, types.int64)
        return builder.gep(arr.data, [i64])


if PTX:

    def _load_u32x4_intrinsic(ordered, prefetch=""):
        def load(typingctx, a, i):
            sig = types.UniTuple(types.uint32, 4)(a, i)

            def codegen(context, builder, sig, args):
                i4 = builder.mul(context.cast(builder, args[1], sig.args[1], types.int64),
                                 ir.Constant(ir.IntType(64), 4))
                ptr = _elem_ptr(context, builder, sig.args[0], args[0], i4, types.int64)
                i32 = ir.IntType(32)
                fty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [ptr.type])
                asm = ir.InlineAsm(fty, f"ld.global.nc{prefetch}.v4.u32 {{$0, $1, $2, $3}}, [$4];", "=r,=r,=r,=r,l",
                                   side_effect=ordered)
                res = builder.call(asm, [ptr])
                vals = [builder.extract_value(res, k) for k in range(4)]
                return context.make_tuple(builder, sig.return_type, vals)

            return sig, codegen

        return intrinsic(load)

    # Words 4*i .. 4*i + 3 of the uint32 array ``a`` (16-byte aligned) by one
    # ``ld.global.nc.v4.u32``: the input is read-only for the kernel's lifetime.
    load_u32x4 = _load_u32x4_intrinsic(False)
    # The same load as a side effect, so that NVVM keeps it where it is written (the
    # pipelined column kernel issues the next item's loads before it waits on the current
    # item; a load the compiler sank below the wait would not overlap it).
    load_u32x4_ordered = _load_u32x4_intrinsic(True)
    # The same load with the ``.L2::256B`` prefetch size: a miss brings the 256-byte
    # aligned piece around the 16 bytes into L2, where the loads of the other half arrive
    # soon after (the per-channel cluster kernel: neighbouring 128-byte stripes of a row
    # are read by clusters resident together).
    load_u32x4_l2_256 = _load_u32x4_intrinsic(False, ".L2::256B")

    @intrinsic
    def store_u32x2(typingctx, a, i, w0, w1):
        """Words 2*i and 2*i + 1 of the uint32 array ``a`` (8-byte aligned) := w0, w1, by one
        ``st.global.v2.u32``."""
        sig = types.void(a, i, types.uint32, types.uint32)

        def codegen(context, builder, sig, args):
            i2 = builder.mul(context.cast(builder, args[1], sig.args[1], types.int64), ir.Constant(ir.IntType(64), 2))
            ptr = _elem_ptr(context, builder, sig.args[0], args[0], i2, types.int64)
            i32 = ir.IntType(32)
            fty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32])
            asm = ir.InlineAsm(fty, "st.global.v2.u32 [$0], {$1, $2};", "l,r,r", side_effect=True)
            builder.call(asm, [ptr, args[2], args[3]])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def store_u32x4(typingctx, a, i, w0, w1, w2, w3):
        """Words 4*i .. 4*i + 3 of the uint32 array ``a`` (16-byte aligned) := w0 .. w3, by one
        ``st.global.v4.u32``."""
        sig = types.void(a, i, types.uint32, types.uint32, types.uint32, types.uint32)

        def codegen(context, builder, sig, args):
            i4 = builder.mul(context.cast(builder, args[1], sig.args[1], types.int64), ir.Constant(ir.IntType(64), 4))
            ptr = _elem_ptr(context, builder, sig.args[0], args[0], i4, types.int64)
            i32 = ir.IntType(32)
            fty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32, i32])
            asm = ir.InlineAsm(fty, "st.global.v4.u32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r", side_effect=True)
            builder.call(asm, [ptr, args[2], args[3], args[4], args[5]])
            return context.get_dummy_value()

        return sig, codegen

    def _cvt_pair_intrinsic(ptx_type):
        @intrinsic
        def _cvt2(typingctx, hi, lo):
            sig = types.uint32(types.float32, types.float32)

            def codegen(context, builder, sig, args):
                fty = ir.FunctionType(ir.IntType(16), [ir.FloatType(), ir.FloatType()])
                asm = ir.InlineAsm(fty, f"cvt.rn.satfinite.{ptx_type}.f32 $0, $1, $2;", "=h,f,f")
                return builder.zext(builder.call(asm, [args[0], args[1]]), ir.IntType(32))

            return sig, codegen

        return _cvt2

    def _load_sem_i32(sem):
        def load(typingctx, a, i):
            sig = types.int32(a, i)

            def codegen(context, builder, sig, args):
                ptr = _elem_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
                fty = ir.FunctionType(ir.IntType(32), [ptr.type])
                asm = ir.InlineAsm(fty, f"ld.{sem}.gpu.global.s32 $0, [$1];", "=r,l", side_effect=True)
                return builder.call(asm, [ptr])

            return sig, codegen

        return intrinsic(load)

    # ``a[i]`` (int32) by ``ld.relaxed.gpu``: sees other blocks' atomics (never a stale L1
    # line) and is issued again on every call (a spin's poll); cheaper than reading by an
    # atomic, which serialises with the writers at L2. ``load_acquire_i32``: ``ld.acquire.gpu``,
    # the same with acquire semantics (what other blocks released before their write of
    # a[i] is visible to this thread's later loads, and through a block barrier its block's).
    load_relaxed_i32 = _load_sem_i32("relaxed")
    load_acquire_i32 = _load_sem_i32("acquire")
    cvt_e4m3x2 = _cvt_pair_intrinsic("e4m3x2")  # (code(hi) << 8) | code(lo), NaN canonical
    cvt_e5m2x2 = _cvt_pair_intrinsic("e5m2x2")
    _ = cgutils
else:

    @_twin
    def load_u32x4(a, i):
        """Twin: four consecutive words."""
        j = 4 * int(i)
        return (a[j], a[j + 1], a[j + 2], a[j + 3])

    load_u32x4_ordered = load_u32x4  # (the order of loads is not observable in the simulator)
    load_u32x4_l2_256 = load_u32x4  # (nor is what L2 fetches around them)

    if HIP:  # pragma: no cover - numba-hip

        @devfn
        def load_relaxed_i32(a, i):
            """AMD twin: the element by an atomic add of 0 (read where the other blocks' atomics
            land, and again on every call: a plain load could be hoisted out of a poll)."""
            return _cuda.atomic.add(a, i, 0)

        @devfn
        def load_acquire_i32(a, i):
            """AMD twin: load_relaxed_i32, then a device-scope fence before the later loads."""
            v = _cuda.atomic.add(a, i, 0)
            _cuda.threadfence()
            return v

    else:

        def load_relaxed_i32(a, i):
            """Simulator twin: the element."""
            return a[i]

        load_acquire_i32 = load_relaxed_i32

    @_twin
    def store_u32x2(a, i, w0, w1):
        """Twin: two consecutive words."""
        j = 2 * int(i)
        a[j] = w0
        a[j + 1] = w1

    @_twin
    def store_u32x4(a, i, w0, w1, w2, w3):
        """Twin: four consecutive words."""
        j = 4 * int(i)
        a[j], a[j + 1], a[j + 2], a[j + 3] = w0, w1, w2, w3

    cvt_e4m3x2 = cvt_e5m2x2 = None  # never called where fp8_cvt_available() is False (simulator, AMD)


# ----------------------------------------------------------------------------- thread-block clusters
# sm_90+: the blocks of a cluster (launched together on one GPC, ``launch``'s cluster
# attribute) meet at ``barrier.cluster`` and read each other's shared memory.
# ``cluster_arrive_relaxed`` / ``cluster_wait``: ``barrier.cluster.arrive.relaxed`` (an
# arrival that orders nothing: no fence; for "my reads are done") / ``barrier.cluster.wait
# .acquire``. Not the ``.aligned`` forms, which require every thread of a warp to execute the
# same instruction: ptxas may copy a barrier at the end of a kernel into each branch before
# it (a kernel whose last wait followed a per-thread branch hung on an H100 when its lanes
# took different branches). Twins (simulator: clusters of one block): the arrival does
# nothing, the wait is a block barrier; likewise for the push form below (the store writes
# the block's own array, the mbarrier wait is a block barrier). On AMD the same twins, compiled: they hold
# only where a cluster is one block, and the kernels that use clusters are planned only on
# sm_90+ (``_target.device_has``, never on AMD).
if not SIMULATOR:  # (void_asm stays on AMD: _mma builds its NVIDIA-only intrinsics with it)

    def void_asm(text):
        """An intrinsic of no arguments and no result: the PTX ``text``, a side effect that
        clobbers memory (so loads and stores stay on their side of it)."""

        @intrinsic
        def _asm(typingctx):
            sig = types.void()

            def codegen(context, builder, sig, args):
                fty = ir.FunctionType(ir.VoidType(), [])
                builder.call(ir.InlineAsm(fty, text, "~{memory}", side_effect=True), [])
                return context.get_dummy_value()

            return sig, codegen

        return _asm


if PTX:
    cluster_arrive_relaxed = void_asm("barrier.cluster.arrive.relaxed;")
    cluster_wait = void_asm("barrier.cluster.wait.acquire;")

    # The push form (no cluster-scope release fence: ptxas makes every one a MEMBAR.GPU, a
    # round trip to L2 under load): each block stores its words into every block's receive
    # buffer by ``st.async`` (``st_async_u32``), which counts the bytes into the receiver's
    # mbarrier (``mbarrier::complete_tx``); a block waits on its own mbarrier for them all
    # (``mbar_wait0``, acquire at cluster scope). ``mbar_init_tx(m, nbytes)`` (one thread):
    # the mbarrier at ``m[0]`` for one arrival, that arrival made now with ``nbytes``
    # expected, then ``fence.mbarrier_init.release.cluster``; a cluster barrier must follow
    # before any block stores into it.
    def _shared_addr(name):
        return f"cvta.to.shared.u64 {name}64, {{0}}; cvt.u32.u64 {name}, {name}64;"

    @intrinsic
    def mbar_init_tx(typingctx, m, nbytes):
        sig = types.void(m, nbytes)

        def codegen(context, builder, sig, args):
            ptr = _elem_ptr(context, builder, sig.args[0], args[0], context.get_constant(types.int64, 0), types.int64)
            n = context.cast(builder, args[1], sig.args[1], types.uint32)
            fty = ir.FunctionType(ir.VoidType(), [ptr.type, ir.IntType(32)])
            asm = ir.InlineAsm(
                fty,
                "{ .reg .u64 s64; .reg .u32 s; .reg .b64 st; " + _shared_addr("s").format("$0")
                + " mbarrier.init.shared::cta.b64 [s], 1; mbarrier.arrive.expect_tx.shared::cta.b64 st, [s], $1;"
                " fence.mbarrier_init.release.cluster; }",
                "l,r,~{memory}",
                side_effect=True,
            )
            builder.call(asm, [ptr, n])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def st_async_u32(typingctx, a, i, v, m, rank):
        sig = types.void(a, i, v, m, rank)

        def codegen(context, builder, sig, args):
            pa = _elem_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            pm = _elem_ptr(context, builder, sig.args[3], args[3], context.get_constant(types.int64, 0), types.int64)
            v = context.cast(builder, args[2], sig.args[2], types.uint32)
            r = context.cast(builder, args[4], sig.args[4], types.uint32)
            fty = ir.FunctionType(ir.VoidType(), [pa.type, ir.IntType(32), pm.type, ir.IntType(32)])
            asm = ir.InlineAsm(
                fty,
                "{ .reg .u64 a64, b64; .reg .u32 a, b, ra, rb; " + _shared_addr("a").format("$0") + " "
                + _shared_addr("b").format("$2") + " mapa.shared::cluster.u32 ra, a, $3;"
                " mapa.shared::cluster.u32 rb, b, $3;"
                " st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [ra], $1, [rb]; }",
                "l,r,l,r,~{memory}",
                side_effect=True,
            )
            builder.call(asm, [pa, v, pm, r])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def _mbar_try0(typingctx, m):
        sig = types.uint32(m)

        def codegen(context, builder, sig, args):
            ptr = _elem_ptr(context, builder, sig.args[0], args[0], context.get_constant(types.int64, 0), types.int64)
            fty = ir.FunctionType(ir.IntType(32), [ptr.type])
            asm = ir.InlineAsm(
                fty,
                "{ .reg .u64 s64; .reg .u32 s; .reg .pred p; " + _shared_addr("s").format("$1")
                + " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [s], 0; selp.u32 $0, 1, 0, p; }",
                "=r,l,~{memory}",
                side_effect=True,
            )
            return builder.call(asm, [ptr])

        return sig, codegen

    from ..runtime.target import devfn as _devfn

    @_devfn
    def mbar_wait0(m):
        while _mbar_try0(m) == 0:
            pass

else:

    @_twin
    def cluster_arrive_relaxed():
        """Simulator twin: nothing (a cluster is one block; cluster_wait is its barrier)."""

    from ..runtime.target import devfn as _devfn

    @_devfn
    def cluster_wait():
        """Simulator twin: a block barrier."""
        _cuda.syncthreads()

    @_twin
    def mbar_init_tx(m, nbytes):
        """Simulator twin: nothing (mbar_wait0 is a block barrier)."""

    @_twin
    def st_async_u32(a, i, v, m, rank):
        """Simulator twin: the store into the block's own array (rank 0)."""
        a[i] = v

    @_devfn
    def mbar_wait0(m):
        """Simulator twin: a block barrier (every thread calls it)."""
        _cuda.syncthreads()


# ----------------------------------------------------------------------------- 16-bit pairs
# The e2m1 pair encoder of _rowwise_kernels works on two bfloat16 values per 32-bit word
# (element 0 in bits 0-15): ``bf16x2_mul`` / ``bf16x2_add`` (``mul.rn`` / ``add.rn.bf16x2``:
# one IEEE rounding to bfloat16, nearest even, subnormals kept), ``bf16x2_min`` /
# ``bf16x2_max`` (``min`` / ``max.bf16x2``: the non-NaN operand when one is NaN; ``absmul`` /
# ``absmin``: of |a|, ``abs.bf16x2`` first), ``u16x2_max`` / ``u16x2_min`` (``max`` /
# ``min.u16x2``: per 16-bit half, unsigned) and ``prmt`` (``prmt.b32``: byte
# i of the result is byte ``(sel >> 4i) & 7`` of the 8 bytes (b, a), a lowest; the default
# mode, no sign replication). sm_90 has each as one instruction (HMUL2 / HADD2 / HMNMX2 .BF16,
# VIMNMX.U16x2, PRMT). The twins compute in float64 (exact for a sum or product of two
# bfloat16 values, or within far less than half a bfloat16 ulp of it, which cannot create or
# break a tie) and round once; they take NumPy arrays as well as scalars, so the CPU tests
# can run them over every bfloat16 value at once. tests/test_kernels.py::
# test_pair_intrinsics_match_twins compares both on a GPU.
def round_to_half_bits(v, ebits, mbits):
    """IEEE bits (1 + ebits + mbits wide) of float64 ``v`` rounded to nearest even; overflow
    -> inf, NaN -> the canonical 0x7FFF (sign 0, every other bit 1)."""
    v = np.asarray(v, np.float64)
    bias = (1 << (ebits - 1)) - 1
    a = np.abs(v)
    with np.errstate(all="ignore"):
        _, e = np.frexp(a)
        eq = np.maximum(e.astype(np.int64) - 1, 1 - bias)  # the binade, subnormals in 1 - bias
        r = np.rint(np.ldexp(a, (mbits - eq).astype(np.int32)))  # exact scaling; rint: ties to even
    r = np.where(np.isfinite(r), r, 0).astype(np.int64)
    up = r >> (mbits + 1)  # a carry into the next binade
    eq = eq + up
    r = np.where(up > 0, r >> 1, r)
    bits = np.where(r >= (1 << mbits), ((eq + bias) << mbits) + r - (1 << mbits), r)
    inf = ((1 << ebits) - 1) << mbits
    bits = np.where((eq + bias >= (1 << ebits) - 1) | np.isinf(a), inf, bits)
    bits = bits | (np.signbit(v).astype(np.int64) << (ebits + mbits))
    return np.where(np.isnan(v), (1 << (ebits + mbits + 1)) - 1 - (1 << (ebits + mbits)), bits)


def _bf16_value(h):
    return (np.asarray(h, np.uint64).astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def _pairwise(a, b, op):
    a = np.asarray(a, np.uint64) & 0xFFFFFFFF
    b = np.asarray(b, np.uint64) & 0xFFFFFFFF
    lo = round_to_half_bits(op(_bf16_value(a & 0xFFFF), _bf16_value(b & 0xFFFF)), 8, 7)
    hi = round_to_half_bits(op(_bf16_value(a >> 16), _bf16_value(b >> 16)), 8, 7)
    out = (np.asarray(lo, np.uint64) | (np.asarray(hi, np.uint64) << np.uint64(16))).astype(np.uint32)
    return out if out.ndim else np.uint32(out)


def _nonnan_min(x, y):
    with np.errstate(invalid="ignore"):
        m = np.where((x < y) | ((x == y) & np.signbit(x)), x, y)  # -0 below +0
    return np.where(np.isnan(x), y, np.where(np.isnan(y), x, m))


def _nonnan_max(x, y):
    with np.errstate(invalid="ignore"):
        m = np.where((x > y) | ((x == y) & ~np.signbit(x)), x, y)
    return np.where(np.isnan(x), y, np.where(np.isnan(y), x, m))


def bf16x2_mul_twin(a, b):
    return _pairwise(a, b, np.multiply)


def bf16x2_absmul_twin(a, b):
    """|a| * b (``abs.bf16x2`` then ``mul.rn.bf16x2``; abs clears the sign bits, NaN too)."""
    return _pairwise(np.asarray(a, np.uint64) & 0x7FFF7FFF, b, np.multiply)


def bf16x2_add_twin(a, b):
    return _pairwise(a, b, np.add)


def bf16x2_min_twin(a, b):
    return _pairwise(a, b, _nonnan_min)


def bf16x2_max_twin(a, b):
    return _pairwise(a, b, _nonnan_max)


def bf16x2_absmin_twin(a, b):
    """min(|a|, b) (the sign bits cleared, then ``min.bf16x2``)."""
    return _pairwise(np.asarray(a, np.uint64) & 0x7FFF7FFF, b, _nonnan_min)


def absmax_nan_twin(a, b):
    """max(|a|, |b|) of two float32 bit patterns (``max.NaN.f32`` of the magnitudes): the larger
    magnitude's bits, 0x7FFFFFFF where either is a NaN (|x| bits order as the values do)."""
    a, b = int(a) & 0x7FFFFFFF, int(b) & 0x7FFFFFFF
    if a > 0x7F800000 or b > 0x7F800000:
        return np.uint32(0x7FFFFFFF)
    return np.uint32(max(a, b))


def u16x2_min_twin(a, b):
    a = np.asarray(a, np.uint64) & 0xFFFFFFFF
    b = np.asarray(b, np.uint64) & 0xFFFFFFFF
    out = (np.minimum(a & 0xFFFF, b & 0xFFFF) | (np.minimum(a >> 16, b >> 16) << np.uint64(16))).astype(np.uint32)
    return out if out.ndim else np.uint32(out)


def u16x2_max_twin(a, b):
    a = np.asarray(a, np.uint64) & 0xFFFFFFFF
    b = np.asarray(b, np.uint64) & 0xFFFFFFFF
    lo = np.maximum(a & 0xFFFF, b & 0xFFFF)
    hi = np.maximum(a >> 16, b >> 16)
    out = (lo | (hi << np.uint64(16))).astype(np.uint32)
    return out if out.ndim else np.uint32(out)


def prmt_twin(a, b, sel):
    a = np.asarray(a, np.uint64) & 0xFFFFFFFF
    b = np.asarray(b, np.uint64) & 0xFFFFFFFF
    both = a | (b << np.uint64(32))
    out = np.zeros(np.broadcast(a, b).shape, np.uint64)
    for i in range(4):
        k = (int(sel) >> (4 * i)) & 7
        out |= ((both >> np.uint64(8 * k)) & np.uint64(0xFF)) << np.uint64(8 * i)
    out = out.astype(np.uint32)
    return out if out.ndim else np.uint32(out)


# ``cvt_bf16x2(hi, lo)`` / ``cvt_f16x2(hi, lo)`` (``cvt.rn.bf16x2.f32`` / ``.f16x2.f32``, sm_80+):
# two float32 rounded to nearest even into one word, lo in bits 0-15; overflow -> inf,
# subnormals kept, NaN -> the canonical 0x7FFF (callers that keep NaN signs fix NaN lanes
# up). ``st_u32_at(a, i, w)``: the 4 bytes at element i of array ``a`` (4-byte aligned)
# := w, little-endian, by one ``st.global.u32`` (a 16-bit array's elements i, i + 1).
# The GEMM epilogue stores two outputs per instruction with them; tests/test_matmul_gpu.py::
# test_out_pair_intrinsics_match_twins compares both with the twins on a GPU.
def _cvt_pair_twin(hi, lo, ebits, mbits):
    lo_b = round_to_half_bits(np.float64(np.float32(lo)), ebits, mbits)
    hi_b = round_to_half_bits(np.float64(np.float32(hi)), ebits, mbits)
    return np.uint32((int(hi_b) << 16) | int(lo_b))


def cvt_bf16x2_twin(hi, lo):
    return _cvt_pair_twin(hi, lo, 8, 7)


def cvt_f16x2_twin(hi, lo):
    return _cvt_pair_twin(hi, lo, 5, 10)


def st_u32_at_twin(a, i, w):
    i, w = int(i), int(w)
    if a.dtype.itemsize == 2:
        a[i] = w & 0xFFFF
        a[i + 1] = w >> 16
    else:
        a.view(np.uint32)[i] = w


# Scalar twins, which a GPU compiler takes (numba-hip on AMD; tests/test_portability.py
# checks them against the array twins above with numba's CPU jit).
def u16x2_min_scalar(a, b):
    a, b = np.uint32(a), np.uint32(b)
    lo = min(a & np.uint32(0xFFFF), b & np.uint32(0xFFFF))
    hi = min(a >> np.uint32(16), b >> np.uint32(16))
    return np.uint32(lo | (hi << np.uint32(16)))


def u16x2_max_scalar(a, b):
    a, b = np.uint32(a), np.uint32(b)
    lo = max(a & np.uint32(0xFFFF), b & np.uint32(0xFFFF))
    hi = max(a >> np.uint32(16), b >> np.uint32(16))
    return np.uint32(lo | (hi << np.uint32(16)))


def prmt_scalar(a, b, sel):
    both = np.uint64(np.uint32(a)) | (np.uint64(np.uint32(b)) << np.uint64(32))
    out = np.uint64(0)
    for i in range(4):
        k = (np.uint64(sel) >> np.uint64(4 * i)) & np.uint64(7)
        out |= ((both >> (np.uint64(8) * k)) & np.uint64(0xFF)) << np.uint64(8 * i)
    return np.uint32(out)


def absmax_nan_scalar(a, b):
    a, b = np.uint32(a) & np.uint32(0x7FFFFFFF), np.uint32(b) & np.uint32(0x7FFFFFFF)
    if a > np.uint32(0x7F800000) or b > np.uint32(0x7F800000):
        return np.uint32(0x7FFFFFFF)
    return np.uint32(max(a, b))


# Scalar twins of the bfloat16 pair arithmetic, the pair conversions and the pair store, which
# AMD compiles (tests/test_amd_twins.py checks each against the NumPy twins above, as plain
# Python and compiled by Numba's CPU jit: every bfloat16 value of one operand against every
# exponent of the other).
# Integer arithmetic on the bits only (int64, every value below 2^40), no float: no float
# rounding can intervene (a float32 product of two bfloat16 values is exact only while it
# is normal: below 2^-126 float32 rounds it at 2^-149, bfloat16 at 2^-133, twice in all),
# and no flush-to-zero mode of the target's FPU can apply. The exact result is formed as an
# integer significand m and an exponent e (value m * 2^e), plus a sticky bit where an
# addend's low bits had to be dropped, and rounded once by ``_pack_rne``:
#
# * mul: m = ma * mb < 2^16, e = ea + eb: exact.
# * add: |x| >= |y| (swapped so), the pair aligned in a frame of G = 10 guard bits below x's
#   significand: X = mx << G in units of 2^-G of x's last bit, y's exponent d below x's. For
#   d <= G, Y = my << (G - d) and S = X +- Y is exact. For d > G, Y = my >> (d - G) keeps y's
#   bits down to the frame's unit and the rest sets the sticky bit s: the exact sum is
#   (X + Y + f) or (X - Y - f) units with
#   0 <= f < 1, f > 0 iff s, i.e. S = X + Y or X - Y - s units plus a fraction that is
#   nonzero iff s. Then x is normal (d > 0), X >= 2^17 and Y < 2^7, so S >= 2^16 and the
#   rounding drops at least 9 bits (S's bit length less 8): a fraction below S's last unit
#   decides only a tie, and only as "above half" (round-to-nearest-even with a sticky bit).
# * NaN operands give the canonical NaN 0x7FFF (CUDART_NAN_BF16), inf - inf and 0 * inf too,
#   as the NumPy twins do (tests/test_kernels_gpu.py checks those against the instructions);
#   an exact zero sum is +0 unless both addends are -0 (IEEE 754, round to nearest); min / max
#   return the non-NaN operand (0x7FFF where both are NaN), -0 below +0.
@_twin
def _bit_length(x):
    """The number of bits of int ``x`` (0 <= x < 2^64): 0 for 0."""
    x = np.int64(x)
    n = np.int64(0)
    s = np.int64(32)
    while s > 0:  # halving steps 32, 16, ..., 1: x ends below 2
        if x >= np.int64(1) << s:
            x >>= s
            n += s
        s >>= 1
    return n + x


@_twin
def _pack_rne(m, e, sticky, mbits, ebits):
    """The IEEE bits (sign clear; 1 + ebits + mbits wide) of m * 2^e rounded to nearest even,
    m >= 1 an int below 2^40, ``sticky`` nonzero where a fraction (0 < f < 1) of m's last unit
    is to be added (it breaks ties up: only where m's rounding drops at least one bit);
    subnormals kept, overflow -> inf. The significand kept has mbits + 1 bits where the
    result is normal (its leading bit at 2^(e + n - 1), n = m's bit length) and sits on the
    subnormal grid 2^(1 - bias - mbits) below; ``base + q`` then carries a rounding overflow
    into the exponent (and the largest subnormal into the smallest normal)."""
    m, e = np.int64(m), np.int64(e)
    bias = (1 << (ebits - 1)) - 1
    n = _bit_length(m)
    shift = np.int64(max(n - mbits - 1, 1 - bias - mbits - e))
    base = np.int64(max(e + n + bias - 2, 0) << mbits)
    if shift <= 0:
        q = np.int64(m << -shift)
    else:
        shift = min(shift, 48)  # (m < 2^40: from 41 on the result is 0 without a tie)
        q = np.int64(m >> shift)
        rem = np.int64(m - (q << shift))
        half = np.int64(1) << (shift - 1)
        if rem > half or (rem == half and (sticky != 0 or (q & 1) != 0)):
            q += 1
    return np.int64(min(base + q, ((1 << ebits) - 1) << mbits))


@_twin
def _bf16_mul_half(x, y):
    """mul.rn of two bfloat16 bit patterns (ints below 2^16)."""
    x, y = np.int64(x), np.int64(y)
    s = (x ^ y) & 0x8000
    ax, ay = x & 0x7FFF, y & 0x7FFF
    if ax > 0x7F80 or ay > 0x7F80:
        return np.int64(0x7FFF)
    if ax == 0x7F80 or ay == 0x7F80:
        if ax == 0 or ay == 0:
            return np.int64(0x7FFF)  # 0 * inf
        return np.int64(s | 0x7F80)
    if ax == 0 or ay == 0:
        return np.int64(s)
    ex, ey = ax >> 7, ay >> 7
    mx = (ax & 0x7F) | (0x80 if ex != 0 else 0)
    my = (ay & 0x7F) | (0x80 if ey != 0 else 0)
    return np.int64(s | _pack_rne(mx * my, max(ex, 1) + max(ey, 1) - 268, 0, 7, 8))


@_twin
def _bf16_add_half(x, y):
    """add.rn of two bfloat16 bit patterns (ints below 2^16)."""
    x, y = np.int64(x), np.int64(y)
    ax, ay = x & 0x7FFF, y & 0x7FFF
    if ax > 0x7F80 or ay > 0x7F80:
        return np.int64(0x7FFF)
    if ax == 0x7F80 or ay == 0x7F80:
        if ax == ay and ((x ^ y) & 0x8000) != 0:
            return np.int64(0x7FFF)  # inf - inf
        return x if ax == 0x7F80 else y
    if ax < ay:
        x, y, ax, ay = y, x, ay, ax
    if ay == 0:
        return np.int64(x & y) if ax == 0 else x  # (+-0) + (+-0): -0 only for -0 + -0
    ex, ey = ax >> 7, ay >> 7
    mx = (ax & 0x7F) | (0x80 if ex != 0 else 0)
    my = (ay & 0x7F) | (0x80 if ey != 0 else 0)
    ex, ey = max(ex, 1), max(ey, 1)
    d = ex - ey
    big = mx << 10  # G = 10 guard bits
    sticky = np.int64(0)
    if d <= 10:
        small = my << (10 - d)
    else:
        k = min(d - 10, 16)
        small = my >> k
        sticky = np.int64(1 if (my & ((1 << k) - 1)) != 0 else 0)
    if ((x ^ y) & 0x8000) != 0:
        total = big - small - sticky
    else:
        total = big + small
    if total == 0:
        return np.int64(0)  # x - x = +0
    return np.int64((x & 0x8000) | _pack_rne(total, ex - 144, sticky, 7, 8))


@_twin
def _bf16_order(h):
    """An int that orders bfloat16 bit patterns (not NaN) as their values, -0 below +0."""
    return np.int64(h & 0x7FFF) if h < 0x8000 else np.int64(-(h & 0x7FFF) - 1)


@_twin
def _bf16_min_half(x, y):
    """min.bf16: the lesser, the non-NaN operand where one is NaN, 0x7FFF where both are."""
    x, y = np.int64(x), np.int64(y)
    nx, ny = (x & 0x7FFF) > 0x7F80, (y & 0x7FFF) > 0x7F80
    if nx and ny:
        return np.int64(0x7FFF)
    if nx:
        return y
    if ny:
        return x
    return x if _bf16_order(x) <= _bf16_order(y) else y


@_twin
def _bf16_max_half(x, y):
    """max.bf16: the greater, the non-NaN operand where one is NaN, 0x7FFF where both are."""
    x, y = np.int64(x), np.int64(y)
    nx, ny = (x & 0x7FFF) > 0x7F80, (y & 0x7FFF) > 0x7F80
    if nx and ny:
        return np.int64(0x7FFF)
    if nx:
        return y
    if ny:
        return x
    return x if _bf16_order(x) >= _bf16_order(y) else y


@_twin
def bf16x2_mul_scalar(a, b):
    a, b = np.int64(np.uint32(a)), np.int64(np.uint32(b))
    lo = _bf16_mul_half(a & 0xFFFF, b & 0xFFFF)
    return np.uint32(lo | (_bf16_mul_half(a >> 16, b >> 16) << 16))


@_twin
def bf16x2_absmul_scalar(a, b):
    return bf16x2_mul_scalar(np.uint32(np.uint32(a) & np.uint32(0x7FFF7FFF)), b)


@_twin
def bf16x2_add_scalar(a, b):
    a, b = np.int64(np.uint32(a)), np.int64(np.uint32(b))
    lo = _bf16_add_half(a & 0xFFFF, b & 0xFFFF)
    return np.uint32(lo | (_bf16_add_half(a >> 16, b >> 16) << 16))


@_twin
def bf16x2_min_scalar(a, b):
    a, b = np.int64(np.uint32(a)), np.int64(np.uint32(b))
    lo = _bf16_min_half(a & 0xFFFF, b & 0xFFFF)
    return np.uint32(lo | (_bf16_min_half(a >> 16, b >> 16) << 16))


@_twin
def bf16x2_max_scalar(a, b):
    a, b = np.int64(np.uint32(a)), np.int64(np.uint32(b))
    lo = _bf16_max_half(a & 0xFFFF, b & 0xFFFF)
    return np.uint32(lo | (_bf16_max_half(a >> 16, b >> 16) << 16))


@_twin
def bf16x2_absmin_scalar(a, b):
    return bf16x2_min_scalar(np.uint32(np.uint32(a) & np.uint32(0x7FFF7FFF)), b)


@devfn  # (under the simulator too: its local array needs the kernel's context)
def _f32_bits(f):
    """The 32 bits of float32 ``f`` as an int (``_codec.f32_bits``, which imports this module)."""
    a = _cuda.local.array(1, _float32)
    a[0] = f
    return np.int64(a.view(np.uint32)[0])


@_twin
def f32_bits_to_bf16(u):
    """cvt.rn.bf16.f32 of float32 bits ``u``: round-to-nearest-even at bit 16 of the magnitude
    (bfloat16 keeps float32's exponent range, so its values, subnormals included, are the
    float32 bit patterns whose low 16 bits are 0; the largest finite rounds up to inf),
    NaN -> 0x7FFF."""
    u = np.int64(np.uint32(u))
    a = u & 0x7FFFFFFF
    if a > 0x7F800000:
        return np.int64(0x7FFF)
    return np.int64(((u >> 16) & 0x8000) | ((a + 0x7FFF + ((a >> 16) & 1)) >> 16))


@_twin
def f32_bits_to_f16(u):
    """cvt.rn.f16.f32 of float32 bits ``u``: nearest even, subnormals kept, overflow -> inf,
    NaN -> 0x7FFF."""
    u = np.int64(np.uint32(u))
    a = u & 0x7FFFFFFF
    s = (u >> 16) & 0x8000
    if a > 0x7F800000:
        return np.int64(0x7FFF)
    if a == 0x7F800000:
        return np.int64(s | 0x7C00)
    if a == 0:
        return np.int64(s)
    ef = a >> 23
    m = (a & 0x7FFFFF) | (0x800000 if ef != 0 else 0)
    return np.int64(s | _pack_rne(m, max(ef, 1) - 150, 0, 10, 5))


@_twin
def cvt_bf16x2_scalar(hi, lo):
    return np.uint32(f32_bits_to_bf16(_f32_bits(lo)) | (f32_bits_to_bf16(_f32_bits(hi)) << 16))


@_twin
def cvt_f16x2_scalar(hi, lo):
    return np.uint32(f32_bits_to_f16(_f32_bits(lo)) | (f32_bits_to_f16(_f32_bits(hi)) << 16))


@_twin
def st_u32_at_scalar(a, i, w):
    """The word w at element i of the 16-bit (elements i, i + 1, little-endian) or 32-bit
    integer array ``a``."""
    w = np.uint32(w)
    j = np.int64(i)
    if a.itemsize == 2:
        a[j] = np.uint16(w & np.uint32(0xFFFF))
        a[j + 1] = np.uint16(w >> np.uint32(16))
    else:
        a[j] = w


if PTX:

    def _u32_codegen(ptx, nargs):
        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            vals = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            fty = ir.FunctionType(i32, [i32] * nargs)
            return builder.call(ir.InlineAsm(fty, ptx, "=r," + ",".join(["r"] * nargs)), vals)

        return codegen

    def _u32_asm(ptx, nargs):
        """A uint32 function of ``nargs`` integer arguments by one PTX instruction."""
        if nargs == 2:

            @intrinsic
            def _op2(typingctx, a, b):
                return types.uint32(a, b), _u32_codegen(ptx, 2)

            return _op2

        @intrinsic
        def _op3(typingctx, a, b, c):
            return types.uint32(a, b, c), _u32_codegen(ptx, 3)

        return _op3

    bf16x2_mul = _u32_asm("mul.rn.bf16x2 $0, $1, $2;", 2)
    bf16x2_absmul = _u32_asm("{.reg .b32 t; abs.bf16x2 t, $1; mul.rn.bf16x2 $0, t, $2;}", 2)
    bf16x2_add = _u32_asm("add.rn.bf16x2 $0, $1, $2;", 2)
    bf16x2_min = _u32_asm("min.bf16x2 $0, $1, $2;", 2)
    bf16x2_max = _u32_asm("max.bf16x2 $0, $1, $2;", 2)
    # the sign bits cleared by and.b32 (not abs.bf16x2, which sm_90 runs as an HFMA2 of its own):
    # ptxas folds it into the LOP3 that made the pair (rto: hi | sticky), one instruction a pair less
    bf16x2_absmin = _u32_asm("{.reg .b32 t; and.b32 t, $1, 0x7FFF7FFF; min.bf16x2 $0, t, $2;}", 2)
    u16x2_max = _u32_asm("max.u16x2 $0, $1, $2;", 2)
    u16x2_min = _u32_asm("min.u16x2 $0, $1, $2;", 2)
    prmt = _u32_asm("prmt.b32 $0, $1, $2, $3;", 3)
    # max(|a|, |b|) of two float32 bit patterns, NaN if either is (max.NaN: the canonical
    # 0x7FFFFFFF, above every other |x|): one FMNMX.NAN with |.| operand modifiers, where the
    # integer max of the masked bits takes a LOP3 per element besides the max
    absmax_nan = _u32_asm("{.reg .f32 x, y; mov.b32 x, $1; mov.b32 y, $2; abs.f32 x, x; abs.f32 y, y; "
                          "max.NaN.f32 x, x, y; mov.b32 $0, x;}", 2)

    def _cvt_half2_intrinsic(ptx_type):
        @intrinsic
        def _cvt2(typingctx, hi, lo):
            sig = types.uint32(types.float32, types.float32)

            def codegen(context, builder, sig, args):
                i32 = ir.IntType(32)
                fty = ir.FunctionType(i32, [ir.FloatType(), ir.FloatType()])
                return builder.call(ir.InlineAsm(fty, f"cvt.rn.{ptx_type}.f32 $0, $1, $2;", "=r,f,f"), list(args))

            return sig, codegen

        return _cvt2

    cvt_bf16x2 = _cvt_half2_intrinsic("bf16x2")
    cvt_f16x2 = _cvt_half2_intrinsic("f16x2")

    @intrinsic
    def st_u32_at(typingctx, a, i, w):
        sig = types.void(a, i, types.uint32)

        def codegen(context, builder, sig, args):
            ptr = _elem_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            i32 = ir.IntType(32)
            fty = ir.FunctionType(ir.VoidType(), [ptr.type, i32])
            asm = ir.InlineAsm(fty, "st.global.u32 [$0], $1;", "l,r", side_effect=True)
            builder.call(asm, [ptr, args[2]])
            return context.get_dummy_value()

        return sig, codegen

    # programmatic dependent launch (sm_90+; ptxas rejects them for older targets): a grid
    # launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION may start while the
    # kernel before it in the stream runs, once that kernel's blocks have all executed
    # griddep_launch (or exited); griddep_wait blocks until that kernel has completed and its
    # memory is visible. Both do nothing in a grid launched without the attribute.
    griddep_wait = void_asm("griddepcontrol.wait;")
    griddep_launch = void_asm("griddepcontrol.launch_dependents;")

    @intrinsic
    def load_cg(typingctx, a, i):
        """Element i of the int32 array ``a`` by ``ld.global.cg`` (cached in L2 only, never in
        the SM's L1: what other blocks wrote before a grid barrier, without an atomic each; a
        side effect, so NVVM keeps it after the barrier where it is written)."""
        sig = types.int32(a, i)

        def codegen(context, builder, sig, args):
            ptr = _elem_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            fty = ir.FunctionType(ir.IntType(32), [ptr.type])
            return builder.call(ir.InlineAsm(fty, "ld.global.cg.s32 $0, [$1];", "=r,l", side_effect=True), [ptr])

        return sig, codegen
else:
    bf16x2_mul, bf16x2_add, bf16x2_min, bf16x2_max = bf16x2_mul_twin, bf16x2_add_twin, bf16x2_min_twin, bf16x2_max_twin
    cvt_bf16x2, cvt_f16x2, st_u32_at = cvt_bf16x2_twin, cvt_f16x2_twin, st_u32_at_twin
    bf16x2_absmul = bf16x2_absmul_twin
    u16x2_max, u16x2_min, prmt, bf16x2_absmin = u16x2_max_twin, u16x2_min_twin, prmt_twin, bf16x2_absmin_twin

    if HIP:  # pragma: no cover - numba-hip: the scalar twins (the NumPy ones stay the simulator's)
        u16x2_max, u16x2_min = devfn(u16x2_max_scalar), devfn(u16x2_min_scalar)
        prmt, absmax_nan = devfn(prmt_scalar), devfn(absmax_nan_scalar)
        bf16x2_mul, bf16x2_add, bf16x2_min, bf16x2_max = (bf16x2_mul_scalar, bf16x2_add_scalar, bf16x2_min_scalar,
                                                          bf16x2_max_scalar)  # (device functions: _twin)
        bf16x2_absmul, bf16x2_absmin = bf16x2_absmul_scalar, bf16x2_absmin_scalar
        cvt_bf16x2, cvt_f16x2, st_u32_at = cvt_bf16x2_scalar, cvt_f16x2_scalar, st_u32_at_scalar
    else:
        absmax_nan = absmax_nan_twin

    @_twin
    def griddep_wait():
        """Twin: nothing (the simulator's grids run one after another, and no grid is launched
        as a dependent one on AMD: the kernel before has ended)."""

    @_twin
    def griddep_launch():
        """Twin: nothing (no dependent launch to allow)."""

    if HIP:  # pragma: no cover - numba-hip

        @devfn
        def load_cg(a, i):
            """AMD twin: the element by an atomic add of 0 (what other blocks wrote before the grid
            barrier, never a stale cache line)."""
            return _cuda.atomic.add(a, i, 0)

    else:

        def load_cg(a, i):
            """Simulator twin: the element (the simulator has no caches)."""
            return a[i]


# ----------------------------------------------------------------------------- stochastic rounding's integer steps
# Used by _codec (Philox4x32-10, the stochastic element encoders), which describes the rules:
# ``mul_wide_u32`` (one ``mul.wide.u32``: both halves of Philox's product), ``sign_add`` (a
# code's sign by two multiply-adds) and ``sr_e2m1_code_i`` (_codec's comment above
# ``E2M1_SR_I_KEY``). The twins are int64 / uint32 code that a device compiler and Python
# compute alike (no step leaves the int64 range).
@_twin
def mul_wide_u32_twin(a, b):
    """The 64-bit product of uint32 ``a`` and ``b``."""
    return np.uint64(np.uint64(np.uint32(a)) * np.uint64(np.uint32(b)))


def sign_add_twin(u, mag, bit):
    """mag + bit where float32 bits ``u`` are negative, else mag (a code's sign: mag < bit <= 2^7):
    mag + (u >> 31) * bit, as the PTX computes it (``mul.hi.u32 u, 2`` is u >> 31)."""
    return np.uint32(np.uint32(mag) + np.uint32(np.uint32(u) >> np.uint32(31)) * np.uint32(bit))


def sr_e2m1_code_i_twin(a, r, xb):
    """(code, key): encode_float_sr32's stochastic e2m1 code of q with |q|'s bits ``a``
    (finite, sign clear), random bits ``r`` and q's sign that of the float32 bits ``xb``; the
    code is the spec's where ``key >= _codec.E2M1_SR_I_KEY``: q = +-0, |q| < 2^-33 or
    |q| >= 2^-10. The PTX's steps in int64 (none leaves [-2^33, 2^35]: m < 2^24, the
    multiplier 2^c <= 2^10, r < 2^32)."""
    a = np.int64(np.uint32(a))
    r = np.int64(np.uint32(r))
    xb = np.int64(np.uint32(xb))
    e1 = np.int64((a >> 23) - 1)
    c = np.int64(min(e1 - 116, 10))
    e2 = np.int64(max(e1 - 126, 0))
    m = np.int64(a - (e1 << 23))  # the significand with its implicit bit (a + 2^23 for ef = 0, where c < 0)
    p = np.int64(0)
    if c >= 0:
        p = np.int64(1) << c  # (shl.b32 gives 0 for c < 0: a shift of 32 or more)
    hi = np.int64((m * p + r) >> 32)
    return np.uint32(min(hi + 2 * e2, 7) + 8 * (xb >> 31)), np.uint32((c + 23) & 0xFFFFFFFF)


_E2M1_SR_PTX = (
    "{.reg .b32 e1, c, e2, m, p, lo, hi, s, z; .reg .b64 d, t; "
    "shr.u32 e1, $2, 23; add.s32 e1, e1, -1; "
    "add.s32 c, e1, -116; min.s32 c, c, 10; "
    "add.s32 e2, e1, -126; max.s32 e2, e2, 0; "
    "mad.lo.s32 m, e1, -8388608, $2; "
    "mov.b32 p, 1; shl.b32 p, p, c; "
    "mov.b32 z, 0; mov.b64 t, {$3, z}; "
    "mad.wide.u32 d, m, p, t; mov.b64 {lo, hi}, d; "
    "mad.lo.u32 hi, e2, 2, hi; min.u32 hi, hi, 7; "
    "mul.hi.u32 s, $4, 2; mad.lo.u32 $0, s, 8, hi; "
    "add.s32 $1, c, 23;}"
)

if PTX:

    @intrinsic
    def mul_wide_u32(typingctx, a, b):
        """mul_wide_u32_twin by one ``mul.wide.u32`` (one IMAD.WIDE.U32: both halves of
        Philox's product, where umulhi32 and a 32-bit multiply are an IMAD.HI and an IMAD)."""

        def codegen(context, builder, sig, args):
            i32, i64 = ir.IntType(32), ir.IntType(64)
            vals = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            asm = ir.InlineAsm(ir.FunctionType(i64, [i32, i32]), "mul.wide.u32 $0, $1, $2;", "=l,r,r")
            return builder.call(asm, vals)

        return types.uint64(a, b), codegen

    @intrinsic
    def sign_add(typingctx, u, mag, bit):
        """sign_add_twin by two multiply-adds (``mul.hi.u32`` by 2, ``mad.lo``: IMAD.HI and IMAD
        on the FMA pipe), where the shift and the LOP3 of ``mag | (u >> k) & bit`` take two ALU
        slots: stochastic rounding's kernels fill the ALU pipe (Philox's xors)."""
        sig = types.uint32(u, mag, bit)

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            vals = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            asm = ir.InlineAsm(ir.FunctionType(i32, [i32] * 3),
                               "{.reg .b32 s; mul.hi.u32 s, $1, 2; mad.lo.u32 $0, s, $3, $2;}", "=r,r,r,r")
            return builder.call(asm, vals)

        return sig, codegen

    @intrinsic
    def sr_e2m1_code_i(typingctx, a, r, xb):
        """sr_e2m1_code_i_twin by one inline-PTX block (shl, mad.wide.u32 and multiply-adds)."""
        sig = types.UniTuple(types.uint32, 2)(a, r, xb)

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            vals = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            fty = ir.FunctionType(ir.LiteralStructType([i32, i32]), [i32] * 3)
            res = builder.call(ir.InlineAsm(fty, _E2M1_SR_PTX, "=r,=r,r,r,r"), vals)
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, 0),
                                                                 builder.extract_value(res, 1)])

        return sig, codegen

else:
    mul_wide_u32 = mul_wide_u32_twin
    sign_add = _twin(sign_add_twin)
    sr_e2m1_code_i = _twin(sr_e2m1_code_i_twin)
