"""Memory access by PTX, with the twins the simulator and AMD run.

* addresses: ``array_addr`` (an array's device address, for alignment tests);
* word views: ``as_u32`` / ``as_u16`` (an array's memory as 32- / 16-bit words, without
  Numba's checked view);
* wide loads and stores: ``load_u32x4`` (``ld.global.nc.v4.u32``; ``_ordered``: kept where it
  is written; ``_l2_256``: with a 256-byte L2 prefetch), ``store_u32x2`` / ``store_u32x4``
  (``st.global.v2`` / ``.v4.u32``), ``st_u32_at`` (``st.global.u32``: a word at any
  element of a 16- or 32-bit array);
* ordered single loads: ``load_relaxed_i32`` / ``load_acquire_i32`` (``ld.relaxed`` /
  ``ld.acquire.gpu``, a spin's poll) and ``load_cg`` (``ld.global.cg``: L2 only);
* ``prefetch_l2`` (``prefetch.global.L2``).

Twins: the simulator indexes the arrays (it has no caches, no alignment and no order to
keep); AMD compiles the same element accesses, and reads what other blocks wrote by an atomic
add of 0. ``array_addr``, ``as_u32`` and ``as_u16`` emit plain LLVM IR and stay on AMD.
"""

from __future__ import annotations

import numpy as np

from ..runtime.backend import cuda as _cuda
from ..runtime.target import HIP, PTX, SIMULATOR, devfn
from ..runtime.target import device_twin as _twin

if not SIMULATOR:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.cuda.extending import intrinsic

    from ._asm import _elem_ptr


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
# The last-axis kernels (quantize.lastaxis) move 16 bytes of input per load and 8 bytes of
# codes per store: one instruction where Numba's element indexing would issue 4-8. On a GPU
# these are PTX vector instructions; the twins (simulator, numba-hip) index the arrays.
# Callers guarantee alignment: the input's address is tested (array_addr(x) & 15) and the
# codes array is one the plan allocated (CuPy / Numba allocations are 256-byte aligned).
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


# ``st_u32_at(a, i, w)``: the 4 bytes at element i of array ``a`` (4-byte aligned) := w,
# little-endian, by one ``st.global.u32`` (a 16-bit array's elements i, i + 1): the GEMM
# epilogue's store of two outputs (``convert.cvt_bf16x2`` / ``cvt_f16x2``);
# tests/test_matmul_gpu.py::test_out_pair_intrinsics_match_twins checks it on a GPU. Twins:
# NumPy (``st_u32_at_twin``, the simulator's) and scalar (``st_u32_at_scalar``, AMD's).
def st_u32_at_twin(a, i, w):
    i, w = int(i), int(w)
    if a.dtype.itemsize == 2:
        a[i] = w & 0xFFFF
        a[i + 1] = w >> 16
    else:
        a.view(np.uint32)[i] = w


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
    st_u32_at = st_u32_at_twin

    if HIP:  # pragma: no cover - numba-hip
        st_u32_at = st_u32_at_scalar  # (a device function: _twin)

        @devfn
        def load_cg(a, i):
            """AMD twin: the element by an atomic add of 0 (what other blocks wrote before the grid
            barrier, never a stale cache line)."""
            return _cuda.atomic.add(a, i, 0)

    else:

        def load_cg(a, i):
            """Simulator twin: the element (the simulator has no caches)."""
            return a[i]
