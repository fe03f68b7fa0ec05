"""Per-channel quantize (int8_column, bf16): the one-pass kernel (``column_onepass``) against
the two passes (``column_amax`` -> ``finalize`` -> ``column_encode``) and the D2D copy, in
one process with peers.py's timer (CUDA events, median of groups, warm-up excluded, inputs
over 4 x L2, random data) and its table (bytes = input read + codes + scales written).

    python3 benchmarks/column_onepass_ab.py --sizes 8192x8192,16384x7168,64x7168,65536x1024 \
        --variants old,new,p128,old --ref

Variants (each plan rebuilt; an old row twice shows drift):
  old   ``quantize.COLUMN_ONEPASS`` off (the two passes)
  new   on, P <= ``_column_kernels.ONEPASS_P_MAX`` (64) chunks per stripe
  p128  on, ``quantize.COLUMN_ONEPASS_P_MAX`` = 128 (wider stripes for tall inputs)
  nt128, nt64p128, ...  on, blocks of 256 / 128 / 64 threads (``_column_kernels.ONEPASS_THREADS``,
        ``ONEPASS_MIN_BLOCKS`` = 512 / threads), P at most 64 or 128
  ring, ring256-8-3-1, ring256-16-3-1-b1 ...  the shared-memory ring (``quantize.COLUMN_RING``,
        ``_column_ring``): threads, units a thread, slots, lag (NT-U-D-L; bare "ring": the
        module's defaults), then -bB: B blocks an SM, -w: the wait path on every item
The variants above run with the ring off.
Every variant's codes and scales of one input set are compared bit for bit with the first
variant's (the whole tensor), and with ``--ref`` the first variant's with the NumPy
reference (the whole tensor, on the host).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

SETTINGS = {
    "old": dict(COLUMN_ONEPASS=False, COLUMN_ONEPASS_P_MAX=None),
    "new": dict(COLUMN_ONEPASS=True, COLUMN_ONEPASS_P_MAX=None),
    "p128": dict(COLUMN_ONEPASS=True, COLUMN_ONEPASS_P_MAX=128),
}
_RING_DEFAULTS = {}
# block sizes / P: ``nt128``, ``nt64p128`` ...: _column_kernels.ONEPASS_THREADS = 256 / 128 / 64
# with ONEPASS_MIN_BLOCKS = 512 / threads (128 registers a thread), P_MAX 64 or (p128) 128
for _nt in (256, 128, 64):
    for _p in (None, 128):
        SETTINGS[f"nt{_nt}{'p128' if _p else ''}"] = dict(
            COLUMN_ONEPASS=True, COLUMN_ONEPASS_P_MAX=_p, ONEPASS_THREADS=_nt, ONEPASS_MIN_BLOCKS=512 // _nt)


_BUILT = {}


def set_variant(tag):
    import nqdq.api
    import nqdq.gpu.quantize.columns as column_kernels
    import nqdq.gpu.quantize.plan as kq

    if not _BUILT:  # kernels remembered per ONEPASS_MIN_BLOCKS too (read when a kernel is built)
        base = column_kernels.make_column_onepass_kernel.__wrapped__

        def make(*a):
            key = (a, column_kernels.ONEPASS_MIN_BLOCKS)
            if key not in _BUILT:
                _BUILT[key] = base(*a)
            return _BUILT[key]

        column_kernels.make_column_onepass_kernel = make
        _BUILT["installed"] = True
    import nqdq.gpu.quantize.column_ring as column_ring

    if not _RING_DEFAULTS:
        _RING_DEFAULTS.update(RING_THREADS=column_ring.RING_THREADS, RING_UNITS=column_ring.RING_UNITS,
                              RING_SLOTS=column_ring.RING_SLOTS,
                              RING_LAG=column_ring.RING_LAG, RING_BLOCKS_PER_SM=column_ring.RING_BLOCKS_PER_SM,
                              RING_FORCE_WAIT=False)  # fmt: skip
    if tag.startswith("ring"):
        settings = dict(SETTINGS["nt256"], COLUMN_RING=True, **_RING_DEFAULTS)
        if tag != "ring":  # ringNT-U-D-L, then optionally -bB (blocks an SM) and -w (the wait path)
            parts = tag[4:].split("-")
            nt, u, d, lag = (int(v) for v in parts[:4])
            settings.update(RING_THREADS=nt, RING_UNITS=u, RING_SLOTS=d, RING_LAG=lag)
            for p in parts[4:]:
                if p.startswith("b"):
                    settings["RING_BLOCKS_PER_SM"] = int(p[1:])
                elif p == "w":
                    settings["RING_FORCE_WAIT"] = True
    else:
        settings = dict(SETTINGS[tag], COLUMN_RING=False)
    for k, v in settings.items():
        setattr(column_kernels if k.startswith("ONEPASS") else column_ring if k.startswith("RING") else kq, k, v)
    kq._PLANS.clear()
    if nqdq.api._FAST is not None:
        nqdq.api._FAST.clear()


def check_one(shape, scheme, variant="new"):
    """Quantize one random bf16 input with ``variant`` (the one pass), compare with the NumPy
    reference."""
    import cupy as cp
    import ml_dtypes

    import nqdq.gpu.quantize.plan as kq
    from nqdq.reference import quantize as ref
    from nqdq.schemes import resolve_scheme

    set_variant(variant)
    sch = resolve_scheme(scheme)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * np.exp2(rng.uniform(-8, 8, shape[-1]))).astype(ml_dtypes.bfloat16)
    x[0, :3] = [np.nan, np.inf, 0.0]
    x[:, 5] = 0
    plan = kq.get_plan(shape, 1, sch)
    print("launches:", [(k.py_func.__name__, g, b) for k, g, b, _ in plan.launches])
    q = kq.quantize(cp.asarray(x.view(np.uint16)), sch, dtype="bfloat16")
    want = ref.quantize(x.astype(np.float32), sch)
    same = np.array_equal(q.codes.get().view(np.uint8), want.codes.view(np.uint8)) and np.array_equal(
        q.scales.get().view(np.uint32), want.scales.view(np.uint32))
    print(f"{scheme} {shape}: {'bit-exact vs' if same else 'DIFFERS from'} the NumPy reference")
    return 0 if same else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="8192x8192,16384x7168,64x7168,65536x1024")
    ap.add_argument("--variants", default=None)
    ap.add_argument("--scheme", default="int8_column")
    ap.add_argument("--ref", action="store_true", help="check the first variant against the NumPy reference")
    ap.add_argument("--check", default=None, help="ROWSxCOLS: one call of the first variant given (default 'new') "
                    "checked against the reference, no timing "
                    "(small: under compute-sanitizer)")
    args = ap.parse_args(argv)
    if args.check:
        shape = tuple(int(v) for v in args.check.split("x"))
        return check_one(shape, args.scheme, (args.variants or "new").split(",")[0])
    import cupy as cp
    import ml_dtypes

    import nqdq
    import nqdq.gpu.quantize.plan as kq
    import peers

    variants = (args.variants or "old,new,p128,old").split(",")
    timer = peers.Timer()
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; "
          f"spin {timer.us_per_unit:.3f} us per unit; L2 {timer.l2_bytes / 2**20:.0f} MiB")
    rows_out = []
    for s in args.sizes.split(","):
        rows, cols = (int(v) for v in s.split("x"))
        in_bytes = rows * cols * 2
        n_sets = peers.n_sets_for(in_bytes + rows * cols + cols * 4, timer.l2_bytes)
        xs = peers.random_bf16_sets((rows, cols), n_sets, seed=rows * 31 + cols)
        print(f"{rows}x{cols} bf16: {n_sets} input sets")

        def add(impl, us, nbytes, hb, note=""):
            gbs = nbytes / (us * 1e-6) / 1e9
            rows_out.append(dict(shape=f"{rows}x{cols}", impl=impl, us=us, bytes=nbytes, gbs=gbs, host_bound=bool(hb),
                                 note=note))  # fmt: skip
            print(f"  {impl:44s} {us:10.2f} us {gbs:8.0f} GB/s{'  host-bound' if hb else ''} {note}", flush=True)

        dst = cp.empty_like(xs[0])
        us, hb = timer.device_us(lambda i: dst.data.copy_from_device_async(xs[i].data, in_bytes), n_sets,
                                 bytes_per_launch=2 * in_bytes)  # fmt: skip
        add("copy (cudaMemcpyAsync D2D)", us, 2 * in_bytes, hb)
        first = None
        for tag in variants:
            set_variant(tag)
            run = lambda i: nqdq.quantize(xs[i], args.scheme, dtype="bfloat16")  # noqa: E731
            q = run(0)
            cp.cuda.runtime.deviceSynchronize()
            plan = kq.get_plan((rows, cols), 1, q.scheme)
            names = "+".join(k.py_func.__name__ for k, _, _, _ in plan.launches)
            got = (q.codes.get(), q.scales.get())
            if first is None:
                first = got
                note = "reference run"
                if args.ref:
                    want = nqdq.quantize(xs[0].get().view(ml_dtypes.bfloat16), args.scheme, device="cpu")
                    same = np.array_equal(got[0].view(np.uint8), want.codes.view(np.uint8)) and np.array_equal(
                        got[1].view(np.uint32), np.ascontiguousarray(want.scales).view(np.uint32))
                    note = f"whole tensor {'bit-exact vs' if same else 'DIFFERS from'} NumPy reference"
            else:
                same = np.array_equal(got[0].view(np.uint8), first[0].view(np.uint8)) and np.array_equal(
                    got[1].view(np.uint32), first[1].view(np.uint32))
                note = f"whole tensor {'bit-exact vs' if same else 'DIFFERS from'} {variants[0]}"
            out_bytes = q.codes.nbytes + q.scales.nbytes
            us, hb = timer.device_us(run, n_sets, bytes_per_launch=in_bytes)
            add(f"nqdq {args.scheme} [{tag}]", us, in_bytes + out_bytes, hb, f"{names}; {note}")
        xs = dst = first = None  # this size's arrays are garbage now
        cp.get_default_memory_pool().free_all_blocks()
    set_variant("ring")
    print()
    print(peers.table(rows_out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
