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
same function compiled as a device function on AMD (numba-hip; ``_twin``). Intrinsics that
emit plain LLVM IR (``array_addr``, ``as_u32``, ``as_u16``) are portable and stay on both
compiled targets. ``NO_DEVICE_TWIN`` names the intrinsics whose twin is NumPy code the
simulator runs but no GPU compiler does: on AMD a kernel that calls one does not compile
(docs/amd.md, "What is expected to break first").
"""

from __future__ import annotations

import functools
import os

import numpy as np

from ._target import HIP, PTX, SIMULATOR, devfn

# The bfloat16-pair arithmetic and the GEMM epilogue's pair conversions / stores: twins in
# NumPy (exact over whole arrays at once, for the CPU tests), no device twin yet.
NO_DEVICE_TWIN = ("bf16x2_mul", "bf16x2_absmul", "bf16x2_add", "bf16x2_min", "bf16x2_max", "bf16x2_absmin",
                  "cvt_bf16x2", "cvt_f16x2", "st_u32_at")


def _twin(fn):
    """A twin as the kernels call it: the function itself under the simulator, a device
    function on AMD."""
    return devfn(fn) if HIP else fn

E4M3 = 4  # fmt[8] (exponent bits) of the formats the instruction covers
E5M2 = 5


@functools.lru_cache(maxsize=None)
def fp8_cvt_available() -> bool:
    """Whether kernels built now may use the cvt instruction: not in the simulator, not
    disabled by NQDQ_FP8_CVT=0, and the current GPU is sm_89+ (with no GPU, compile-only
    tools such as the PTX audit target sm_90: yes). Never on AMD (a PTX instruction)."""
    if not PTX or os.environ.get("NQDQ_FP8_CVT", "1") == "0":
        return False
    from ._gpu import cuda

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
        from ._gpu import cuda as _cuda

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
# ``cluster_arrive`` / ``cluster_wait``: ``barrier.cluster.arrive.release`` /
# ``barrier.cluster.wait.acquire`` (every thread of every block of the cluster arrives;
# what a thread wrote before its arrival is visible to every thread of the cluster after
# its wait); ``cluster_arrive_relaxed``: an arrival that orders nothing (``.relaxed``: no
# fence; for "my reads are done"). Not the ``.aligned`` forms, which require every thread
# of a warp to execute the same instruction: ptxas may copy a barrier at the end of a
# kernel into each branch before it (a kernel whose last wait followed a per-thread branch
# hung on an H100 when its lanes took different branches). ``ld_cluster_u32(a, i, rank)``:
# word ``i`` of the shared uint32 array ``a`` of the cluster's block ``rank``
# (``mapa.shared::cluster`` then ``ld.shared::cluster``). Twins (simulator: clusters of one
# block): the arrival does nothing, the wait is a block barrier, the load reads the block's
# own array (rank 0); likewise for the push form below (the store writes the block's own
# array, the mbarrier wait is a block barrier). On AMD the same twins, compiled: they hold
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
    cluster_arrive = void_asm("barrier.cluster.arrive.release;")
    cluster_arrive_relaxed = void_asm("barrier.cluster.arrive.relaxed;")
    cluster_wait = void_asm("barrier.cluster.wait.acquire;")

    @intrinsic
    def ld_cluster_u32(typingctx, a, i, rank):
        sig = types.uint32(a, i, rank)

        def codegen(context, builder, sig, args):
            ptr = _elem_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            r = context.cast(builder, args[2], sig.args[2], types.uint32)
            fty = ir.FunctionType(ir.IntType(32), [ptr.type, ir.IntType(32)])
            asm = ir.InlineAsm(
                fty,
                "{ .reg .u64 g; .reg .u32 s, d; cvta.to.shared.u64 g, $1; cvt.u32.u64 s, g; "
                "mapa.shared::cluster.u32 d, s, $2; ld.shared::cluster.u32 $0, [d]; }",
                "=r,l,r",
                side_effect=True,
            )
            return builder.call(asm, [ptr, r])

        return sig, codegen

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

    from ._target import devfn as _devfn

    @_devfn
    def mbar_wait0(m):
        while _mbar_try0(m) == 0:
            pass

else:

    @_twin
    def cluster_arrive():
        """Simulator twin: nothing (a cluster is one block; cluster_wait is its barrier)."""

    cluster_arrive_relaxed = cluster_arrive

    from ._gpu import cuda as _cuda

    from ._target import devfn as _devfn

    @_devfn
    def cluster_wait():
        """Simulator twin: a block barrier."""
        _cuda.syncthreads()

    @_twin
    def ld_cluster_u32(a, i, rank):
        """Simulator twin: the block's own word (a cluster of one block: rank 0)."""
        return np.uint32(a[i])

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

    if HIP:  # pragma: no cover - numba-hip
        u16x2_max, u16x2_min = devfn(u16x2_max_scalar), devfn(u16x2_min_scalar)
        prmt, absmax_nan = devfn(prmt_scalar), devfn(absmax_nan_scalar)
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
        from ._gpu import cuda as _cuda

        @devfn
        def load_cg(a, i):
            """AMD twin: the element by an atomic add of 0 (what other blocks wrote before the grid
            barrier, never a stale cache line)."""
            return _cuda.atomic.add(a, i, 0)

    else:

        def load_cg(a, i):
            """Simulator twin: the element (the simulator has no caches)."""
            return a[i]
