"""The sm_90a GEMM body: warpgroup MMA (``wgmma.mma_async``) from shared-memory descriptors.

Same arguments, data layout and epilogue as ``mma_sync.make_gemm_kernel`` (read its
docstring first); what differs is the main loop:

* CTA tile BM x BN with BM = 64 * warpgroups; each warpgroup owns 64 rows and all BN
  columns (one ``m64nBNk32`` wgmma per 32 of K, accumulators in BN / 2 registers);
* K advances 128 bytes per stage; tiles are K-major rows of 128 bytes with the 128-byte
  swizzle (``ptx.wgmma`` explains the layout), filled by ``cp.async`` (16 bytes per lane,
  zero-filled past M, N, K) into a ``stages``-deep ring aligned to 1024 bytes;
* fp8 partial sums are promoted into float32 registers once per stage (128 of K = one
  scale block);
* bfloat16 operands (``"bf16.bf16"``, their bytes: 64 elements of K a stage, one
  ``m64nBNk16`` wgmma per 32 bytes) accumulate in float32 without promotion, as int8 does.

Two pipelines, chosen by ``WgmmaConfig.producer`` (``plan.wgmma_config_for`` says which
input takes which):

* the block-barrier ring (``producer=False``; int8 128 x 256 tiles, one tile per CTA):
  every thread loads. Per stage: wait for its copies, ``fence.proxy.async`` (cp.async
  writes through the generic proxy, wgmma reads through the async one), barrier, issue
  the copy of the stage ``stages - 2`` ahead (into the slot of two steps ago, whose
  wgmma's are finished), then 4 wgmma's, commit, and wait until at most 1 group runs on
  (all, where fp8 partial sums are promoted).
* the warp-specialised ring (``producer=True``) on a persistent grid: one more warpgroup
  (the last, 128 threads) issues every copy of the ring, synchronised by a full and an
  empty mbarrier per slot: for step kt it waits on slot kt % STAGES's empty barrier,
  copies, and its copies arrive on the full barrier when they land
  (``cp.async.mbarrier.arrive.noinc``, count 128); the ``warpgroups`` consumers only wait
  on full barriers, run the wgmma's, arrive on the empty barrier (count 128 * warpgroups)
  and promote, drifting up to a step apart, so one's promotion runs while the other's
  wgmma's do. Launch bounds (threads, 1) give every thread 65536 / threads registers (168
  for 384), then ``setmaxnreg`` lowers the producer to 40 and raises the consumers to
  232, enough for two float32 sets of a 64 x 192 fragment (fp8 row scales) or three of
  64 x 128 (block scales with ping-pong); 64 x 256 (two sets: 256 registers) spills. One
  CTA per SM walks the output tiles; the producer's ring runs on from one tile into the
  next, under the consumers' epilogue (the direct one: it must not use the ring), and the
  producer exits after its last copy. This is the structure of DeepGEMM's sm90 fp8 GEMM
  and CUTLASS's warp-specialised mainloops, with cp.async (16 bytes per lane +
  ``cp.async.mbarrier.arrive.noinc``) in place of TMA. Block scales also take N = 256
  tiles: a thread's columns then span two 128-blocks of weight scales.

``WgmmaConfig.pingpong`` (with a producer, fp8) alternates two accumulator sets by K-step
parity: step k + 1's wgmma's are issued before step k's sums are promoted. Every path
through that loop issues both sets (a branch joining an in-flight set with an idle one
makes ptxas serialise the wgmma's, warning C7515), hence the peeled tail.

Epilogues: the direct one (``WgmmaConfig.direct``, ``_direct_epilogue``) scales and stores
each thread's own fragment from registers; the parked one writes the fragments into the
idle ring as a C tile, then each thread walks rows of 4 fixed columns of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import float32, int32, uint8
from ..runtime.backend import cuda

from ..ptx import mma as _mma
from ..ptx import wgmma as _wg
from .mma_sync import SCALE_BLOCK, SCALE_ROW, elem_bytes, make_store_at, make_store_out, tile_origin  # fmt: skip
from ..runtime.target import SIMULATOR, devfn

BK = 128


@dataclass(frozen=True)
class WgmmaConfig:
    warpgroups: int = 2  # BM = 64 * warpgroups
    n: int = 128  # BN = the wgmma N (8 .. 256, multiple of 8; 16 in the simulator)
    stages: int = 4
    group_m: int = 8
    # warp specialisation on a persistent grid (module doc): a producer warpgroup loads the
    # mbarrier ring, the ``warpgroups`` consumers wait, run wgmma's, release slots, promote
    # and store (needs ``direct``); ``setmaxnreg`` moves the producer's registers to them
    producer: bool = False
    # with a producer, fp8: two accumulator sets by K-step parity, so a step's promotion
    # runs while the next step's wgmma's do
    pingpong: bool = False
    # epilogue straight from the accumulator registers: each thread scales and stores its
    # own fragment (rows m_lo, m_lo + 8; column pairs 8 j + 2 q), with no parked C tile and
    # no block-wide barrier; else the parked C tile, each thread keeping 4 columns of it
    # (NQ = BN / 4 apart: conflict-free shared reads, coalesced stores), their scales
    # loaded once, and walking rows
    direct: bool = False

    @property
    def bm(self):
        return 64 * self.warpgroups

    @property
    def bn(self):
        return self.n

    @property
    def threads(self):
        return 128 * (self.warpgroups + (1 if self.producer else 0))

    @property
    def persistent(self):
        """One CTA per SM walks the output tiles (the launcher sizes the grid so)."""
        return self.producer

    @property
    def loaders(self):
        """Threads that issue the ring's copies: the producer warpgroup, else all."""
        return 128 if self.producer else self.threads

    @property
    def smem_bytes(self):
        # + alignment slack (+ the full / empty mbarriers, 8 bytes per slot each)
        return self.stages * (self.bm + self.bn) * BK + 1024 + (256 if self.producer else 0)

    def check(self):
        rs = self.loaders // 8
        if self.n % 8 or not 8 <= self.n <= 256 or self.stages < 3 or self.bm % rs or self.n % rs:
            raise ValueError(f"bad wgmma config {self}")
        if self.bm * (self.n + 4) * 4 > self.stages * (self.bm + self.bn) * BK:
            raise ValueError(f"wgmma config {self}: the C tile does not fit in the shared ring")
        if self.producer and not self.direct:
            raise ValueError(f"wgmma config {self}: a producer warpgroup needs the direct epilogue")
        if self.pingpong and not self.producer:
            raise ValueError(f"wgmma config {self}: ping-pong accumulators need a producer warpgroup")
        if self.producer and self.stages > 16:
            raise ValueError(f"wgmma config {self}: at most 16 stages with mbarriers")
        if self.smem_bytes > 227 * 1024:
            raise ValueError(f"wgmma config {self} needs more than 227 KiB of shared memory")


def _direct_epilogue(NACC, spec, store_at, store_pair_at):
    """``direct_epilogue(acc, out, bias, sa, sb, za, colsum_b, alpha, M, N, m_lo, nq)``: the
    epilogue of a consumer thread's own fragment, element (row m_lo + 8 h, column
    nq + 8 j + e) = acc[4 j + 2 h + e] (``nq`` = the tile's first column + 2 q), products in
    the order of the parked epilogues (bit-identical output). Its statements are written out
    (generated source), so every accumulator is indexed by a constant and stays in a
    register: the nested loops, once their body holds a store, are not fully unrolled and
    the accumulators go to local memory. Column scales are re-read per row half (L1 hits);
    stores are 2-4 bytes, 8 rows x 16 bytes per warp instruction (the output is about 1/64
    of the main loop's traffic)."""
    BLOCK, ASYM = spec.sa_mode == SCALE_BLOCK, spec.asym
    FLOAT_ACC = spec.mma not in ("s8s8", "u8s8")
    SA_ROW, SB_ROW = spec.sa_mode == SCALE_ROW, spec.sb_mode == SCALE_ROW
    last = 8 * (NACC // 4 - 1) + 1  # the thread's last column, past nq

    def value(x, c, ind, h, pre):
        """v{c & 1} := element x's output, column nq + c; ``pre``: the scales were loaded
        into s{c} / cs{c} / sam{h} / zam{h} first."""
        if pre:
            sbn, csn, sam, zam = f"s{c}" if SB_ROW else "s0", f"cs{c}", f"sam{h}", f"zam{h}"
        else:
            sbn = f"sb[np.uint64(nq + {c})]" if SB_ROW else "sb[0]"
            csn, sam, zam = f"colsum_b[np.uint64(nq + {c})]", "sam", "zam"
        if BLOCK:
            return [f"{ind}v{c & 1} = alpha * acc[{x}]"]
        if FLOAT_ACC:
            return [f"{ind}v{c & 1} = acc[{x}] * alpha * {sam} * {sbn}"]
        out = [f"{ind}qv = acc[{x}]"]
        if ASYM:
            out.append(f"{ind}qv -= {zam} * {csn}")
        return out + [f"{ind}v{c & 1} = float32(qv) * alpha * {sam} * {sbn}"]

    def row_half(h, pairs, js):
        ind = "            "
        out = [f"        m = m_lo + {8 * h}", "        if m < M:", "            rb = np.uint64(m * N + nq)"]
        if not pairs:
            out.append(f"            sam = {'sa[np.uint64(m)]' if SA_ROW else 'sa[0]'}")
            if ASYM:
                out.append(f"            zam = int32({'za[np.uint64(m)]' if SA_ROW else 'za[0]'})")
        for j in js:
            x, c = 4 * j + 2 * h, 8 * j
            if pairs:  # interior, N even: columns c, c + 1 by one store
                out += value(x, c, ind, h, True) + value(x + 1, c + 1, ind, h, True)
                out.append(f"{ind}store_pair_at(out, bias, rb + np.uint64({c}), nq + {c}, v0, v1)")
            else:
                for e in range(2):
                    out.append(f"{ind}if nq + {c + e} < N:")
                    out += value(x + e, c + e, ind + "    ", h, False)
                    out.append(f"{ind}    store_at(out, bias, rb + np.uint64({c + e}), nq + {c + e}, v{e})")
        return out

    # interior tiles load every scale before the first store (a load after a store cannot
    # be moved above it: out might alias the scales), so their latencies overlap instead of
    # each pair's loads stalling its multiply (ncu: 80 % of the epilogue's samples waited
    # on them); with zero points (two loads per column) in chunks of 8 columns, so the
    # loaded values fit in the registers beside the accumulators
    lines = ["def direct_epilogue(acc, out, bias, sa, sb, za, colsum_b, alpha, M, N, m_lo, nq):",
             f"    if nq + {last} < N and N % 2 == 0:"]  # fmt: skip
    if not BLOCK:
        for h in range(2):
            m = f"m_lo + {8 * h}"
            lines.append(f"        sam{h} = {f'sa[np.uint64({m})] if {m} < M else float32(0)' if SA_ROW else 'sa[0]'}")
            if ASYM:
                lines.append(f"        zam{h} = int32({f'za[np.uint64({m})] if {m} < M else 0' if SA_ROW else 'za[0]'})")
        if not SB_ROW:
            lines.append("        s0 = sb[0]")
    step = 4 if ASYM else NACC // 4
    for j0 in range(0, NACC // 4, step):
        js = range(j0, min(j0 + step, NACC // 4))
        if not BLOCK:
            chunk = [8 * j + e for j in js for e in range(2)]
            lines += [f"        s{c} = sb[np.uint64(nq + {c})]" for c in (chunk if SB_ROW else [])]
            lines += [f"        cs{c} = colsum_b[np.uint64(nq + {c})]" for c in (chunk if ASYM else [])]
        lines += row_half(0, True, js) + row_half(1, True, js)
    lines.append("    else:")
    lines += row_half(0, False, range(NACC // 4)) + row_half(1, False, range(NACC // 4))
    src = "\n".join(lines) + "\n"
    ns = dict(np=np, int32=int32, float32=float32, store_at=store_at, store_pair_at=store_pair_at)
    # generated device-function source: why it is generated, see the note in quantize/unrolled.py
    exec(compile(src, f"<nqdq direct_epilogue NACC={NACC}>", "exec"), ns)
    fn = ns["direct_epilogue"]
    fn.source = src
    return devfn(fn)


def make_wgmma_kernel(cfg: WgmmaConfig, spec):
    """The ``gemm_wgmma`` kernel of ``cfg`` and ``spec`` (module docstring: the two pipelines,
    ping-pong, the epilogues). One function because the kernel and its device functions (the
    ring's loads, the ping-pong steps, the promotion, ``consume_tile``) are closures over the
    compile-time constants computed here, which Numba folds into the PTX: every ``PRODUCER`` /
    ``PING`` / ``BLOCK`` / ``DIRECT`` branch is resolved and every accumulator index is a
    constant, so the accumulators stay in registers."""
    cfg.check()
    BM, BN, NTHREADS, STAGES, GROUP_M = cfg.bm, cfg.bn, cfg.threads, cfg.stages, cfg.group_m
    A_STAGE, B_STAGE = BM * BK, BN * BK
    SA_BYTES = STAGES * A_STAGE
    PRODUCER = cfg.producer
    NCONS = 128 * cfg.warpgroups  # threads that run wgmma's (all but the producer's)
    LOADERS = cfg.loaders
    RS = LOADERS // 8  # rows one pass of the loading threads covers (8 chunks of 16 bytes per row)
    A_PER, B_PER = BM // RS, BN // RS
    NACC = BN // 2
    FLOAT_ACC = spec.mma not in ("s8s8", "u8s8")
    kind = {"s8s8": "s8.s8", "u8s8": "u8.s8"}.get(spec.mma, spec.mma)
    mma = _wg.wgmma(kind, BN)
    wait_ready = _mma.cp_async_wait(STAGES - 3)
    cp_async16, commit = _mma.cp_async16, _mma.cp_async_commit
    fence, wg_commit, proxy_fence = _wg.wgmma_fence, _wg.wgmma_commit, _wg.fence_proxy_async
    smem_addr, desc = _mma.smem_addr, _wg.wgmma_desc
    ACC_T = float32 if FLOAT_ACC else int32
    ZERO_ACC = np.float32(0) if FLOAT_ACC else np.int32(0)
    BLOCK = spec.sa_mode == SCALE_BLOCK
    # fp8 wgmma accumulates with fewer bits than float32 (DeepSeek-V3 measured ~14 on H800):
    # sum each 128 of K in the tensor core, then add it into float32 registers ("promotion",
    # as cuBLASLt does unless fast accumulation is asked for). Block scales need it anyway.
    # bf16 accumulates in float32 (as cuBLAS's bf16 GEMM does): no promotion, like int8.
    PROMOTE = FLOAT_ACC and spec.mma != "bf16.bf16"
    BYTES_PER_K = elem_bytes(spec.mma)
    NTOT = NACC if PROMOTE else 1
    wg_wait_all = _wg.wgmma_wait(0)
    wg_wait1 = _wg.wgmma_wait(1)
    SA_ROW, SB_ROW = spec.sa_mode == SCALE_ROW, spec.sb_mode == SCALE_ROW
    ASYM = spec.asym
    store_out = make_store_out(spec)
    if cfg.direct:
        direct_epilogue = _direct_epilogue(NACC, spec, *make_store_at(spec))
    RING = STAGES * (A_STAGE + B_STAGE)  # bytes of the ring; the mbarriers follow it
    mbar_init, mbar_arrive, mbar_try_wait = _wg.mbarrier_init, _wg.mbarrier_arrive, _wg.mbarrier_try_wait
    cp_mbar_arrive = _wg.cp_async_mbarrier_arrive
    CROW = BN + 4  # float32 words per row of the parked C tile (+4: fewer bank conflicts)
    # block scales: a CTA tile of N = 256 spans two 128-blocks of weight scales (fragment
    # column 8 j + 2 q + e lies in block j // 16)
    JB = min(NACC // 4, 16)
    DIRECT = cfg.direct
    NQ = BN // 4  # parked epilogue: threads per C-tile row (4 columns each, NQ apart)
    RSTEP = NCONS // NQ  # rows one pass of the consumers covers (the rest of them idle)
    # warp specialisation: the launch gives every thread R = 65536 / threads registers (at
    # most 168 for 384 threads: launch bounds (threads, 1)); the producer keeps 40 and the
    # consumers take the rest (DeepGEMM's 40 / 232 for two consumer warpgroups)
    R_LAUNCH = min(255, (65536 // NTHREADS) & ~7)
    CONS_REGS = min(232, ((R_LAUNCH * NTHREADS - 40 * 128) // max(NCONS, 1)) & ~7)
    if PRODUCER:
        nreg_dec, nreg_inc = _wg.setmaxnreg("dec", 40), _wg.setmaxnreg("inc", CONS_REGS)
        cp_wait_all = _mma.cp_async_wait(0)

    @devfn
    def load_tile(a, b, smem, K, kt, stage, ch16, a_src, a_left, a_dst, b_src, b_left, b_dst, row_step_k):
        """Stage ``kt`` of A and B into ring slot ``stage``. A thread always copies chunk
        ``ch16 / 16`` of rows r0, r0 + RS, r0 + 2 RS, ... (RS = threads / 8, a multiple of
        8, so every row has the same swizzle): the addresses were worked out once before
        the loop, here they only advance (the per-chunk index arithmetic was the busiest
        pipe, ALU, in ncu)."""
        k0 = kt * BK
        kin = k0 + ch16 < K
        # rows past M / N and chunks past K copy 0 bytes (zero fill) from an address that is
        # not read: no select of the address, only of the size (the row tests are invariant)
        for it in range(A_PER):
            ok = kin & (a_left > it * RS)
            cp_async16(smem, a_dst + stage * A_STAGE + it * (RS * BK), a, a_src + it * row_step_k + k0,
                       16 if ok else 0)  # fmt: skip
        for it in range(B_PER):
            ok = kin & (b_left > it * RS)
            cp_async16(smem, b_dst + stage * B_STAGE + it * (RS * BK), b, b_src + it * row_step_k + k0,
                       16 if ok else 0)  # fmt: skip

    PING = PROMOTE and cfg.pingpong  # (with a producer: WgmmaConfig.check)

    @devfn
    def pp_issue(acc, smem, gk, full0, da0, db0):
        """Ping-pong ring: wait for ring step gk (K step + the steps of the CTA's earlier
        tiles), issue its wgmma's into ``acc`` (fresh)."""
        slot, phase = ring_pos(gk)
        while not mbar_try_wait(smem, full0 + 8 * slot, phase):
            pass
        fence()
        for kk in range(4):
            mma(acc, smem, desc_at(da0, slot * A_STAGE + kk * 32), desc_at(db0, slot * B_STAGE + kk * 32),
                0 if kk == 0 else 1)  # fmt: skip
        wg_commit()

    @devfn
    def pp_retire(acc, tot, smem, kt, g0, s0, full0):
        """Step kt's wgmma's are complete: release its slot (ring step g0 + kt) to the
        producer, promote."""
        slot, phase = ring_pos(g0 + kt)
        mbar_arrive(smem, full0 + 8 * (STAGES + slot))
        # row / tensor scales: all 1 (exact: one rounding)
        promote_scaled(tot, acc, s0[0], s0[1], s0[2], s0[3])

    @devfn
    def ring_pos(gk):
        """(slot, barrier phase) of ring step gk >= 0: gk % STAGES and (gk // STAGES) & 1 in
        unsigned 32-bit arithmetic (signed 64-bit division by 6 stages was ~25 uniform
        instructions per step in SASS)."""
        u = np.uint32(gk)
        return np.uint32(u % np.uint32(STAGES)), np.uint32((u // np.uint32(STAGES)) & np.uint32(1))

    @devfn
    def desc_at(d0, off):
        """The descriptor of ``off`` bytes past the tile of descriptor ``d0``: its start field
        holds address >> 4 (14 bits), and shared addresses stay below 2^18, so adding
        off >> 4 never carries out of the field (one 64-bit add instead of the mask/shift/or
        of ``wgmma_desc`` per wgmma)."""
        return d0 + np.uint64(off >> 4)

    @devfn
    def scale_rows(M, N, KB, n0, m_lo):
        """The first K-block's index in sa of rows m_lo, m_lo + 8 and in sb of the tile's
        first and second 128-block of columns (tiles of N = 256), unsigned (no wraparound
        code per load). Rows / blocks past M / N take the last one's (finite) scales: their
        accumulators are 0 (zero-filled operands) and they are never stored."""
        ia0 = np.uint64(min(m_lo, M - 1) * KB)
        ia1 = np.uint64(min(m_lo + 8, M - 1) * KB)
        nb = n0 >> 7
        ib1 = np.uint64(min(nb + 1, (N - 1) >> 7) * KB) if JB < NACC // 4 else np.uint64(0)
        return ia0, ia1, np.uint64(nb * KB), ib1

    @devfn
    def block_scales(sa, sb, ix, kt):
        """This thread's K-step ``kt`` scale products: (rows m_lo, m_lo + 8) x (the
        tile's first 128-block of columns, its second); ``ix`` from scale_rows."""
        k = np.uint64(kt)
        a0 = sa[ix[0] + k]
        a1 = sa[ix[1] + k]
        b0 = sb[ix[2] + k]
        b1 = sb[ix[3] + k] if JB < NACC // 4 else float32(0)
        return a0 * b0, a1 * b0, a0 * b1, a1 * b1

    @devfn
    def promote_scaled(tot, acc, s0, s1, s2, s3):
        """tot += acc * scale: rows m_lo (s0, s2) and m_lo + 8 (s1, s3); columns of the
        first 128-block (s0, s1), of the second (s2, s3)."""
        for j in range(JB):
            tot[4 * j] += acc[4 * j] * s0
            tot[4 * j + 1] += acc[4 * j + 1] * s0
            tot[4 * j + 2] += acc[4 * j + 2] * s1
            tot[4 * j + 3] += acc[4 * j + 3] * s1
        for j in range(JB, NACC // 4):
            tot[4 * j] += acc[4 * j] * s2
            tot[4 * j + 1] += acc[4 * j + 1] * s2
            tot[4 * j + 2] += acc[4 * j + 2] * s3
            tot[4 * j + 3] += acc[4 * j + 3] * s3

    @devfn
    def consume_tile(a, b, M, N, K, sa, sb, za, colsum_b, bias, alpha, out, smem, acc, tot, m0, n0, g0, ktiles,
                     full0, da0, db0, a_base, b_base, pad, tid, wg, w, g, q, one, ch16, a_src, a_left, a_dst, b_src,
                     b_left, b_dst, row_step_k):  # fmt: skip
        """One output tile: the consumers' main loop and epilogue (ring step g0 + kt for K
        step kt)."""
        KB = ktiles
        for x in range(NACC):
            acc[x] = ZERO_ACC
        if PROMOTE:
            for x in range(NACC):
                tot[x] = float32(0)
        m_lo = m0 + wg * 64 + w * 16 + g  # this thread's rows: m_lo, m_lo + 8
        ix = scale_rows(M, N, KB, n0, m_lo) if BLOCK else (np.uint64(0), np.uint64(0), np.uint64(0), np.uint64(0))
        if PING:
            # steps alternate between acc (even) and acc2 (odd); every path through the
            # loop issues both, so no branch merges an in-flight set with an idle one
            # (ptxas serialises the wgmma's otherwise: C7515)
            acc2 = cuda.local.array(NACC, ACC_T)
            pp_issue(acc, smem, g0, full0, da0, db0)
            sc = block_scales(sa, sb, ix, 0) if BLOCK else (one, one, one, one)
            kt = 0
            while kt + 2 < ktiles:
                pp_issue(acc2, smem, g0 + kt + 1, full0, da0, db0)
                tc = block_scales(sa, sb, ix, kt + 1) if BLOCK else (one, one, one, one)
                wg_wait1()
                pp_retire(acc, tot, smem, kt, g0, sc, full0)
                pp_issue(acc, smem, g0 + kt + 2, full0, da0, db0)
                sc = block_scales(sa, sb, ix, kt + 2) if BLOCK else (one, one, one, one)
                wg_wait1()
                pp_retire(acc2, tot, smem, kt + 1, g0, tc, full0)
                kt += 2
            if kt + 1 < ktiles:  # two steps left: kt in flight in acc, kt + 1 to issue
                pp_issue(acc2, smem, g0 + kt + 1, full0, da0, db0)
                tc = block_scales(sa, sb, ix, kt + 1) if BLOCK else (one, one, one, one)
                wg_wait1()
                pp_retire(acc, tot, smem, kt, g0, sc, full0)
                wg_wait_all()
                pp_retire(acc2, tot, smem, kt + 1, g0, tc, full0)
            else:
                wg_wait_all()
                pp_retire(acc, tot, smem, kt, g0, sc, full0)
        for kt in range(ktiles if PRODUCER and not PING else 0):
            # the producer's ring: wait until slot kt has landed (the producer's copies), run
            # its wgmma's to completion, release the slot, promote
            gk = int32(g0 + kt)  # the ring step (persistent grid: counted over the CTA's tiles)
            slot, phase = ring_pos(gk)
            if BLOCK:  # loaded before the wait, so their latency hides behind it
                sc = block_scales(sa, sb, ix, kt)
            while not mbar_try_wait(smem, full0 + 8 * slot, phase):
                pass
            # no fence.proxy.async here: the barrier's completion publishes the cp.async
            # writes to the wgmma's, as CUTLASS's cp.async + GMMA warp-specialised mainloop
            # relies on (sm90_mma_multistage_gmma_ss_warpspecialized.hpp); that fence
            # compiles to MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S, and the MEMBAR waits for the
            # thread's copies still in flight, i.e. for the stages being prefetched
            fence()
            for kk in range(4):
                da = desc_at(da0, slot * A_STAGE + kk * 32)
                db = desc_at(db0, slot * B_STAGE + kk * 32)
                mma(acc, smem, da, db, 0 if (PROMOTE and kk == 0) else 1)  # promoted sums start afresh
            wg_commit()
            wg_wait_all()
            mbar_arrive(smem, full0 + 8 * (STAGES + slot))
            if PROMOTE and not BLOCK:
                for x in range(NACC):
                    tot[x] += acc[x]
            if BLOCK:
                promote_scaled(tot, acc, sc[0], sc[1], sc[2], sc[3])
        for kt in range(0 if PRODUCER else ktiles):
            # the block-barrier ring
            wait_ready()
            proxy_fence()
            cuda.syncthreads()
            nk = kt + STAGES - 2
            if nk < ktiles:
                load_tile(a, b, smem, K, nk, nk % STAGES, ch16, a_src, a_left, a_dst, b_src, b_left, b_dst, row_step_k)
            commit()
            stage = kt % STAGES
            fence()
            for kk in range(4):
                da = desc(a_base + stage * A_STAGE + kk * 32)
                db = desc(b_base + stage * B_STAGE + kk * 32)
                mma(acc, smem, da, db, 0 if (PROMOTE and kk == 0) else 1)
            wg_commit()
            # a K step's wgmma's run on while the next one is prepared (the ring slot refilled
            # is two steps old: finished), except where a promotion reads their sums at once
            if PROMOTE:
                wg_wait_all()
            else:
                wg_wait1()
            if PROMOTE and not BLOCK:
                for x in range(NACC):
                    tot[x] += acc[x]
            if BLOCK:
                sc = block_scales(sa, sb, ix, kt)
                promote_scaled(tot, acc, sc[0], sc[1], sc[2], sc[3])

        wg_wait_all()
        if DIRECT:
            direct_epilogue(tot if PROMOTE else acc, out, bias, sa, sb, za, colsum_b, alpha, M, N, m_lo, n0 + 2 * q)
            return
        # the parked epilogue (block-barrier ring only), in two passes so that the
        # accumulators are only ever indexed by constants (they stay in registers): (1)
        # every thread parks its fragment in the idle shared ring as a [BM, CROW] float32 /
        # int32 tile; (2) each thread keeps 4 columns NQ apart, their scales loaded once, and
        # walks rows (coalesced stores), applying scales, bias, activation, rounding (about
        # 43 SASS instructions per element; a row-major walk, with a 64-bit division and
        # the scale loads per element, took about 100)
        cuda.syncthreads()
        cf = smem.view(np.float32)
        ci = smem.view(np.int32)
        c0 = (pad >> 2) + (wg * 64 + w * 16 + g) * CROW + 2 * q
        for j in range(NACC // 4):
            for h in range(2):
                for e in range(2):
                    if PROMOTE:
                        cf[c0 + 8 * h * CROW + 8 * j + e] = tot[4 * j + 2 * h + e]
                    elif FLOAT_ACC:
                        cf[c0 + 8 * h * CROW + 8 * j + e] = acc[4 * j + 2 * h + e]
                    else:
                        ci[c0 + 8 * h * CROW + 8 * j + e] = acc[4 * j + 2 * h + e]
        cuda.syncthreads()
        cq = tid % NQ
        rr = tid // NQ
        sbn = cuda.local.array(4, float32)  # constant-indexed below: registers
        csn = cuda.local.array(4, int32)
        for e in range(4):
            n = n0 + cq + e * NQ
            sbn[e] = (sb[n] if SB_ROW else sb[0]) if n < N else float32(0)
            csn[e] = colsum_b[n] if ASYM and n < N else int32(0)
        for r in range(rr if rr < RSTEP else BM, BM, RSTEP):
            m = m0 + r
            if m < M:
                xr = (pad >> 2) + r * CROW + cq
                sam = sa[m] if SA_ROW else sa[0]
                zam = int32(za[m] if SA_ROW else za[0]) if ASYM else int32(0)
                for e in range(4):
                    n = n0 + cq + e * NQ
                    if n < N:
                        x = xr + e * NQ
                        if BLOCK:
                            v = alpha * cf[x]
                        elif FLOAT_ACC:
                            v = cf[x] * alpha * sam * sbn[e]
                        else:
                            qv = ci[x]
                            if ASYM:
                                qv -= zam * csn[e]
                            v = float32(qv) * alpha * sam * sbn[e]
                        store_out(out, bias, m, n, N, v)

    # launch bounds (threads, 1 CTA per SM) cap the launch registers at 65536 / threads,
    # which setmaxnreg's redistribution relies on (the simulator's jit takes no bounds)
    kernel_jit = cuda.jit(launch_bounds=(NTHREADS, 1)) if PRODUCER and not SIMULATOR else cuda.jit

    @kernel_jit
    def gemm_wgmma(a, b, M, N, K, sa, sb, za, colsum_b, bias, alpha, out):
        smem = cuda.shared.array(0, uint8)
        base = smem_addr(smem)
        pad = (1024 - (base & 1023)) & 1023  # swizzle atoms must start 1024-byte aligned
        tid = cuda.threadIdx.x
        # the warpgroup index through a shuffle from lane 0, as CUTLASS's canonical_warp_group_idx:
        # ptxas then knows it is warp-uniform and keeps what derives from it (the A operand's
        # wgmma descriptors) in uniform registers
        wg = (tid >> 7) if SIMULATOR else cuda.shfl_sync(0xFFFFFFFF, tid >> 7, 0)  # (no shuffle in the simulator)
        t = tid & 127
        w = t >> 5
        g = (t & 31) >> 2
        q = t & 3

        ntiles = ((M + BM - 1) // BM) * ((N + BN - 1) // BN)
        tile_step = cuda.gridDim.x if PRODUCER else ntiles  # persistent, else one tile per CTA
        tile = cuda.blockIdx.x
        m0, n0 = tile_origin(tile, M, N, BM, BN, GROUP_M)

        kbytes = K * BYTES_PER_K  # the rows' length in bytes: the ring, copies and descriptors work in bytes
        ktiles = int32((kbytes + BK - 1) // BK)  # 32-bit ring steps: cheaper slot / phase arithmetic
        lt = tid - NCONS if PRODUCER else tid  # this thread's index among the loaders
        r0 = lt >> 3
        ch = lt & 7
        ch16 = ch * 16
        row_step_k = np.int64(RS) * kbytes
        a_src = (m0 + r0) * kbytes + ch16
        b_src = (n0 + r0) * kbytes + ch16
        a_left = int32(M - (m0 + r0))  # 32-bit: one compare per row test, not two
        b_left = int32(N - (n0 + r0))
        dst = r0 * BK + ((ch ^ (r0 & 7)) << 4)
        a_dst = pad + dst
        b_dst = pad + SA_BYTES + dst
        full0 = pad + RING  # mbarriers: full[s] at full0 + 8 s, empty[s] at full0 + 8 (STAGES + s)
        if PRODUCER:
            if tid == 0:
                for s in range(STAGES):
                    mbar_init(smem, full0 + 8 * s, LOADERS)
                    mbar_init(smem, full0 + 8 * (STAGES + s), NCONS)
            cuda.syncthreads()
            if wg == NCONS // 128:
                # the producer warpgroup: fill slot kt % STAGES with step kt once the
                # consumers have released its previous use (parity of use kt // STAGES - 1;
                # the first round waits on parity 1, the phase before a fresh barrier's
                # first, which counts as complete), then exit; ring step gk runs on over
                # the CTA's tiles
                nreg_dec()
                gk = int32(0)
                while tile < ntiles:
                    for kt in range(ktiles):
                        slot, phase = ring_pos(gk)
                        while not mbar_try_wait(smem, full0 + 8 * (STAGES + slot), phase ^ 1):
                            pass
                        load_tile(a, b, smem, kbytes, kt, slot, ch16, a_src, a_left, a_dst, b_src, b_left, b_dst,
                                  row_step_k)  # fmt: skip
                        cp_mbar_arrive(smem, full0 + 8 * slot)
                        gk = int32(gk + 1)
                    tile += tile_step
                    if tile < ntiles:
                        m0, n0 = tile_origin(tile, M, N, BM, BN, GROUP_M)
                        a_src = (m0 + r0) * kbytes + ch16
                        b_src = (n0 + r0) * kbytes + ch16
                        a_left = int32(M - (m0 + r0))
                        b_left = int32(N - (n0 + r0))
                cp_wait_all()
                return
            nreg_inc()
        else:
            for s in range(STAGES - 2):
                if s < ktiles:
                    load_tile(a, b, smem, kbytes, s, s, ch16, a_src, a_left, a_dst, b_src, b_left, b_dst, row_step_k)
                commit()

        acc = cuda.local.array(NACC, ACC_T)
        tot = cuda.local.array(NTOT, float32)
        a_base = base + pad + wg * (64 * BK)
        b_base = base + pad + SA_BYTES
        da0, db0 = desc(a_base), desc(b_base)  # the producer's ring: descriptors advance by offsets
        one = float32(1)
        g0 = int32(0)  # ring steps of this CTA's earlier tiles (persistent grid)
        if DIRECT:  # (the one-tile direct kernel was measured in this loop form)
            while tile < ntiles:
                m0, n0 = tile_origin(tile, M, N, BM, BN, GROUP_M)
                consume_tile(a, b, M, N, kbytes, sa, sb, za, colsum_b, bias, alpha, out, smem, acc, tot, m0, n0, g0,
                             ktiles, full0, da0, db0, a_base, b_base, pad, tid, wg, w, g, q, one, ch16, a_src,
                             a_left, a_dst, b_src, b_left, b_dst, row_step_k)  # fmt: skip
                g0 = int32(g0 + ktiles)
                tile += tile_step
        else:  # the parked epilogue, one tile: no loop (loop-carried registers beside it spill)
            consume_tile(a, b, M, N, kbytes, sa, sb, za, colsum_b, bias, alpha, out, smem, acc, tot, m0, n0, g0,
                         ktiles, full0, da0, db0, a_base, b_base, pad, tid, wg, w, g, q, one, ch16, a_src,
                         a_left, a_dst, b_src, b_left, b_dst, row_step_k)  # fmt: skip

    return gemm_wgmma
