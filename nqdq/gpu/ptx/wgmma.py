"""sm_90a's warpgroup MMA and its synchronisation, each with a pure-Python twin the simulator
runs (``mma``'s pattern: a stub whose body is the twin, an ``@intrinsic`` emitting the inline
PTX, an ``@overload`` joining them): ``wgmma`` (``wgmma.mma_async`` from shared-memory
descriptors, its fence / commit / wait and ``fence.proxy.async``), the mbarriers of the
warp-specialised ring, and ``setmaxnreg``. The GEMM kernel that uses them:
``gemm.wgmma``; the ``mma.sync`` / ``ldmatrix`` / ``cp.async`` family: ``ptx.mma``.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import ml_dtypes
import numpy as np

from ..runtime.target import SIMULATOR
from .mma import _FP8_TABLE, FP8_TYPES, _sim_ctx

__all__ = [
    "WGMMA_KINDS", "WGMMA_SBO", "wgmma", "wgmma_desc", "wgmma_fence", "wgmma_commit", "wgmma_wait", "wgmma_wait0",
    "fence_proxy_async", "mbarrier_init", "mbarrier_arrive", "cp_async_mbarrier_arrive", "mbarrier_try_wait",
    "setmaxnreg",
]  # fmt: skip

if not SIMULATOR:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic, overload

    from ._asm import void_asm as _void_asm
    from .mma import _F32, _I32, _join0, _smem_u32


# ============================================================================= wgmma
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
# swizzle and K steps are those of the 8-bit kinds (as m16n8k16 is to m16n8k32 in ``mma``); the
# D fragment is the same. Its two transpose immediates are 0 (both operands K-major).
WGMMA_SBO = 1024


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

