"""Thread-block clusters (sm_90+) by PTX, with the twins the simulator and AMD run: the
cluster barrier (``cluster_arrive_relaxed`` / ``cluster_wait``) and the push form of a
cluster exchange (``mbar_init_tx``, ``st_async_u32``, ``mbar_wait0``). Twins (a cluster of one
block): the arrival and the mbarrier set-up do nothing, the waits are block barriers, the
store writes the block's own array; see the comment below.
"""

from __future__ import annotations

from ..runtime.backend import cuda as _cuda
from ..runtime.target import PTX
from ..runtime.target import device_twin as _twin

if PTX:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from ._asm import _elem_ptr, void_asm


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
# sm_90+ (``runtime.target.device_has``, never on AMD).
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
