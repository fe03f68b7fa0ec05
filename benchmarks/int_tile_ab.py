"""Old and new int4_group / fp8_128x128 encodes side by side in one process (peers.py's method
and table; every nqdq row keeps peers.py's check of the first 128 rows against the reference).

    python3 benchmarks/int_tile_ab.py --no-compile --sizes 8192x8192,16384x7168 \
        --schemes fp8_128x128,int4_group,int8_centred

Variants, in this order (old twice, so that drift shows):
  old     ``_rowwise_kernels.INT_GROUP_FAST``, ``_tile_kernels.RECIP_ONCE`` and
          ``_rowwise_kernels.ASYM_ROW_RECIP_ONCE`` off
  new     all on (the group's reciprocal once per chunk, bfloat16 pair amax, units interleaved
          over a group's lanes; the tile's and the asymmetric row's reciprocal once per thread)
  new+lb  new with launch bounds: ``INT_GROUP_MIN_BLOCKS`` = 5, tile ``MIN_BLOCKS`` = 3
  old
(``--variants old,new,old`` picks some.) Kernels are built once per (variant, arguments); plans and nqdq.quantize's remembered runners
are dropped at each switch (the switches are read when a kernel is built).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

VARIANTS = [("old", False, 0, 0), ("new", True, 0, 0), ("new+lb", True, 5, 3), ("old", False, 0, 0)]
_BUILT = {}


def set_variant(on, group_blocks, tile_blocks):
    import nqdq.api
    import nqdq.kernels._rowwise_kernels as RK
    import nqdq.kernels._tile_kernels as TK
    import nqdq.kernels.quantize as KQ

    if not _BUILT:
        for mod, name in ((RK, "make_lastaxis_group_kernel"), (TK, "make_tile_kernel"),
                          (RK, "make_lastaxis_asym_row_kernel")):
            base = getattr(mod, name).__wrapped__

            def make(*a, _base=base, **k):
                key = (_base.__name__, RK.INT_GROUP_FAST, RK.INT_GROUP_MIN_BLOCKS, TK.RECIP_ONCE, TK.MIN_BLOCKS,
                       RK.ASYM_ROW_RECIP_ONCE, a, tuple(sorted(k.items())))
                if key not in _BUILT:
                    _BUILT[key] = _base(*a, **k)
                return _BUILT[key]

            setattr(mod, name, make)
        _BUILT["installed"] = True
    RK.INT_GROUP_FAST = TK.RECIP_ONCE = RK.ASYM_ROW_RECIP_ONCE = on
    RK.INT_GROUP_MIN_BLOCKS = group_blocks
    TK.MIN_BLOCKS = tile_blocks
    KQ._PLANS.clear()
    if nqdq.api._FAST is not None:
        nqdq.api._FAST.clear()


def main(argv):
    import peers

    global VARIANTS
    if "--variants" in argv:
        i = argv.index("--variants")
        names = argv[i + 1].split(",")
        argv = argv[:i] + argv[i + 2:]
        VARIANTS = [next(v for v in VARIANTS if v[0] == n) for n in names]

    orig = peers.bench_nqdq

    def ab(timer, scheme, xs, n_sets, groups, in_bytes, add, skip, log):
        for tag, on, gb, tb in VARIANTS:
            set_variant(on, gb, tb)
            orig(timer, scheme, xs, n_sets, groups, in_bytes,
                 lambda impl, *a, **k: add(f"{impl} [{tag}]", *a, **k), lambda impl, why: skip(f"{impl} [{tag}]", why), log)

    peers.bench_nqdq = ab
    return peers.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
