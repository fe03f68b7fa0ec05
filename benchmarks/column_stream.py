"""The per-channel read pattern alone: a column-stripe stream with no amax and no encode,
timed against the device-to-device copy and nqdq's int8_column in one process, with the same
stream reading in row order as a control.

A one-pass per-channel quantizer must hold a stripe of channels down *all* the rows before
it writes any code of it, so it reads the input as 128-byte row pieces of a few adjacent
stripes at a time (``nqdq.gpu.quantize.column_cluster``: the stripes of the resident clusters).
This script times that read pattern alone: persistent blocks of 512 threads take items (a
stripe of WU 16-byte units by UI x 512 / WU rows) and copy each to the output as two XORs
of its units (no reduction, no scale, no encode, no block barrier), with ``NBUF`` items in
flight a block (``cp.async``, the ``.L2::256B`` prefetch size or not). Items go stripe by
stripe, by a ticket (``atom.add``: the hardware's launch order, as the cluster kernel gets
it) or statically (block b takes b, b + grid, ...); or, as the control, band of rows by
band (every stripe of a band in turn, a copy's order). Bytes count as for int8_column
(input + one byte a value + four a channel), so "% of copy" is the figure int8_column is
held to.

    python3 benchmarks/column_stream.py --sizes 16384x7168,8192x8192 \
        --variants 16:1:2:1:1,8:1:2:1:1,8:2:1:1:1,8:2:1:0:1,4:3:2:1:1,16:1:2:1:0,8:1:2:1:1:1

A variant is UI:NBUF:BPS:L2:TICKET[:ORDER[:WU]] (units a thread an item, items in flight a
block, blocks an SM, the 256-byte prefetch size, ticket order; ORDER 1: a control, the items
band of rows by band, every stripe of a band in turn, as a copy reads; WU: row pieces of WU
16-byte units, 8 by default). Timing is peers.py's (``Timer.device_us``: CUDA events, median
of groups, warm-up excluded, input sets over 4 x L2). Every stream's output is checked
against the XORs computed by CuPy, and the ticket count against the items.
"""

from __future__ import annotations

import argparse

import numpy as np
from numba import cuda, types

NT, W = 512, 8  # threads a block; 16-byte units a row piece by default (128 bytes)

_FUNCS = """
def piece(k, chunks, upr, t):  # unit index of thread t's first unit of item k
    if ORDER == 0:  # stripe by stripe (a per-channel kernel's order)
        st = k // chunks
        ch = k - st * chunks
    else:  # band of rows by band, every stripe of a band in turn (a copy's order)
        ns = upr // W
        ch = k // ns
        st = k - ch * ns
    return (np.int64(ch) * ROWS + t // W) * upr + st * W + t % W

def issue(buf, sb, x32, g, b, t, upr):  # item's units into buffer b (cp.async)
    for i in range(UI):
        CP(buf, sb, ((b * UI + i) * NT + t) * 4, x32, (g + i * (RG * np.int64(upr))) * 4, True)

def drain(buf, sb, c32, g, b, t, upr):  # buffer b's units out as two XORs each
    for i in range(UI):
        w = ld_shared_u32x4(buf, sb, ((b * UI + i) * NT + t) * 4)
        store_u32x2(c32, g + i * (RG * np.int64(upr)), w[0] ^ w[1], w[2] ^ w[3])
"""

# static order: block b takes items b, b + grid, b + 2 grid, ...
_STATIC = """
def stream(x, nitems, chunks, upr, codes):
    t = cuda.threadIdx.x
    buf = cuda.shared.array(0, u32)
    sb = smem_addr(buf)
    x32 = as_u32(x)
    c32 = as_u32(codes)
    G = cuda.gridDim.x
    k = cuda.blockIdx.x
    for b in range(NBUF):
        if k + b * G < nitems:
            issue(buf, sb, x32, piece(k + b * G, chunks, upr, t), b, t, upr)
        commit()
    j = 0
    while k < nitems:
        waitn()  # this thread's copies of item k have landed (it reads only its own slots)
        b = j % NBUF
        drain(buf, sb, c32, piece(k, chunks, upr, t), b, t, upr)
        if k + NBUF * G < nitems:
            issue(buf, sb, x32, piece(k + NBUF * G, chunks, upr, t), b, t, upr)
        commit()
        k += G
        j += 1
"""

# ticket order: thread 0 takes the block's next item by atom.add; a block stops taking
# tickets after its first one past the end, so a launch takes nitems + grid tickets
_TICKET = """
def stream(x, nitems, chunks, upr, codes, counter, base):
    t = cuda.threadIdx.x
    buf = cuda.shared.array(0, u32)
    tk = cuda.shared.array(NBUF, i32)
    sb = smem_addr(buf)
    x32 = as_u32(x)
    c32 = as_u32(codes)
    if t == 0:
        v = 0
        for b in range(NBUF):
            if v < nitems:
                v = cuda.atomic.add(counter, 0, 1) - base
            tk[b] = v
    cuda.syncthreads()
    for b in range(NBUF):
        if tk[b] < nitems:
            issue(buf, sb, x32, piece(tk[b], chunks, upr, t), b, t, upr)
        commit()
    j = 0
    while tk[j % NBUF] < nitems:
        b = j % NBUF
        waitn()
        drain(buf, sb, c32, piece(tk[b], chunks, upr, t), b, t, upr)
        cuda.syncthreads()  # every thread has read tk[b]
        if t == 0:
            last = tk[(b + NBUF - 1) % NBUF]  # the newest ticket taken
            tk[b] = last if last >= nitems else cuda.atomic.add(counter, 0, 1) - base
        cuda.syncthreads()
        if tk[b] < nitems:
            issue(buf, sb, x32, piece(tk[b], chunks, upr, t), b, t, upr)
        commit()
        j += 1
"""


def make(UI, NBUF, BPS, L2, TK, ORDER=0, WU=None):
    """The stream kernel (a FastKernel) for one variant: row pieces of WU units (default W)."""
    from nqdq.gpu.ptx.mma import (# fmt: skip
        cp_async_commit, cp_async_unit, cp_async_unit_l2_256, cp_async_wait, ld_shared_u32x4, smem_addr,
    )
    from nqdq.gpu.ptx import as_u32, store_u32x2
    from nqdq.gpu.runtime.launch import FastKernel

    wu = WU or W
    rg = NT // wu  # rows a block reads at a time
    glb = dict(cuda=cuda, np=np, u32=types.uint32, i32=types.int32, smem_addr=smem_addr, as_u32=as_u32,
               store_u32x2=store_u32x2, ld_shared_u32x4=ld_shared_u32x4, commit=cp_async_commit,
               waitn=cp_async_wait(NBUF - 1), CP=cp_async_unit_l2_256 if L2 else cp_async_unit, NT=NT, W=wu,
               RG=rg, UI=UI, NBUF=NBUF, ROWS=UI * rg, ORDER=ORDER)  # fmt: skip
    exec(compile(_FUNCS, "<column stream functions>", "exec"), glb)
    for f in ("piece", "issue", "drain"):
        glb[f] = cuda.jit(glb[f], device=True)
    exec(compile(_TICKET if TK else _STATIC, f"<column stream UI={UI} NBUF={NBUF} TK={TK}>", "exec"), glb)
    k = cuda.jit(glb["stream"]) if BPS == 0 else cuda.jit(glb["stream"], launch_bounds=(NT, BPS))
    k.nqdq_dynamic_smem = NBUF * UI * NT * 16
    return FastKernel(k)


def items(R, C, UI, WU=None):
    """(chunks of rows a stripe, units a row, items) of an R x C bf16 input cut into items of
    UI x NT / WU rows by a stripe of WU units; None where the shape is not a multiple."""
    wu = WU or W
    upr = C // 8
    if C % 8 or R % (UI * (NT // wu)) or upr % wu:
        return None
    chunks = R // (UI * (NT // wu))
    return chunks, upr, chunks * (upr // wu)


def main():
    import cupy as cp
    import peers

    import nqdq

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="16384x7168,8192x8192")
    ap.add_argument("--variants", default="16:1:2:1:1,8:1:2:1:1,8:2:1:1:1,8:2:1:0:1,4:3:2:1:1,16:1:2:1:0,8:1:2:1:1:1")
    a = ap.parse_args()
    timer = peers.Timer()  # CUDA events, median of groups, warm-up excluded, host run ahead

    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    for size in a.sizes.split(","):
        R, C = (int(v) for v in size.split("x"))
        n = R * C
        n_sets = peers.n_sets_for(3 * n, timer.l2_bytes)
        xs = peers.random_bf16_sets((R, C), n_sets, seed=R * 31 + C)
        out = cp.empty((R, C), cp.uint8)
        dst = cp.empty_like(xs[0])

        def us(launch):
            return timer.device_us(launch, n_sets, bytes_per_launch=3 * n)[0]

        tc = us(lambda i: dst.data.copy_from_device_async(xs[i].data, 2 * n))
        pct = lambda t: (3 * n + 4 * C) / t / (4 * n / tc) * 100  # noqa: E731
        tq = us(lambda i: nqdq.quantize(xs[i], "int8_column", dtype="bfloat16"))
        print(f"\n{R}x{C} ({n_sets} input sets): copy {tc:.2f} us; nqdq int8_column {tq:.2f} us = {pct(tq):.1f} % of copy")
        print("| UI:NBUF:BPS:L2:TICKET[:ORDER:WU] | grid | items | us | % of copy | output |")
        print("|---|---:|---:|---:|---:|---|")
        for v in a.variants.split(","):
            UI, NBUF, BPS, L2, TK, ORDER, WU = (int(p) for p in (v + ":0:0:0").split(":")[:7])
            geo = items(R, C, UI, WU)
            if geo is None:
                print(f"| {v} | | | | | shape not a multiple of the item |")
                continue
            chunks, upr, nitems = geo
            fk = make(UI, NBUF, BPS, L2, TK, ORDER, WU)
            G = sms * BPS
            counter = cp.zeros(1, cp.int32)
            base = [0]

            def args(i):
                if not TK:
                    return (xs[i].reshape(-1), nitems, chunks, upr, out.reshape(-1))
                b = base[0]  # each launch takes nitems + G tickets (one past the end a block)
                base[0] += nitems + G
                return (xs[i].reshape(-1), nitems, chunks, upr, out.reshape(-1), counter, b)

            out[...] = 0
            fk.launch(G, NT, args(0))
            w = xs[0].reshape(-1).view(cp.uint32).reshape(-1, 4)
            want = cp.stack([w[:, 0] ^ w[:, 1], w[:, 2] ^ w[:, 3]], axis=1).reshape(-1)
            ok = bool(cp.array_equal(want, out.reshape(-1).view(cp.uint32)))
            if TK:
                ok = ok and int(counter[0]) == nitems + G
            tp = us(lambda i: fk.launch(G, NT, args(i)))
            print(f"| {v} | {G} | {nitems} | {tp:.2f} | {pct(tp):.1f} % | {'right' if ok else 'WRONG'} |", flush=True)


if __name__ == "__main__":
    main()
