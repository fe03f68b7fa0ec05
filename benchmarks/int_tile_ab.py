"""Old and new integer-group / tile / asymmetric / centred encodes side by side in one process
(peers.py's method and table; every nqdq row keeps peers.py's check of the first 128 rows'
codes and scales against the reference).

    python3 benchmarks/int_tile_ab.py --no-compile --sizes 8192x8192,16384x7168 \
        --schemes int4_asym,int8_centred,int8_asym --variants stat_old,stat_clip,stat_packed,stat_old

Variants (``--variants a,b,...`` picks and orders them; an old one twice shows drift):
  old       ``_rowwise_kernels.INT_GROUP_FAST``, ``_tile_kernels.RECIP_ONCE`` and
            ``_rowwise_kernels.ASYM_ROW_RECIP_ONCE`` off (the stat-group switches as they are)
  new       those on (the group's reciprocal once per chunk, bfloat16 pair amax, units interleaved
            over a group's lanes; the tile's and the asymmetric row's reciprocal once per thread)
  new+lb    new with launch bounds: ``INT_GROUP_MIN_BLOCKS`` = 5, tile ``MIN_BLOCKS`` = 3
  stat_old  the above on; ``STAT_GROUP_FAST`` and ``ASYM_INT_CLIP`` off, ``CENTRED_UNITS`` = 2
  stat_new  ``STAT_GROUP_FAST`` on (lastaxis_stat_groups: units interleaved over a group's lanes,
            reciprocal once per chunk, 16-bit asymmetric keys in pairs, centred unit levels in the
            thread), ``ASYM_INT_CLIP`` off
  stat_clip stat_new with ``ASYM_INT_CLIP`` (asymmetric codes clipped as integers: int4_asym and
            the asymmetric rows, int8_asym)
  stat_k4   stat_clip with ``quantize.CENTRED_UNITS`` = 4 (int8_centred: chunks of 4 units)
  stat_packed  stat_k4 with ``ASYM_PACKED_STATS`` (bfloat16 min / max in pairs, one shuffle per
            butterfly step for both statistics, the zero point by the reciprocal)
The default is old,new,new+lb,old. Kernels are built once per (variant, arguments); plans and
nqdq.quantize's remembered runners are dropped at each switch (the switches are read when a
kernel is built).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

_ON = dict(INT_GROUP_FAST=True, RECIP_ONCE=True, ASYM_ROW_RECIP_ONCE=True, INT_GROUP_MIN_BLOCKS=0, MIN_BLOCKS=0)
_STAT_OFF = dict(STAT_GROUP_FAST=False, ASYM_INT_CLIP=False, ASYM_PACKED_STATS=False, CENTRED_UNITS=2)
SETTINGS = {
    "old": dict(INT_GROUP_FAST=False, RECIP_ONCE=False, ASYM_ROW_RECIP_ONCE=False, INT_GROUP_MIN_BLOCKS=0, MIN_BLOCKS=0),
    "new": dict(_ON),
    "new+lb": dict(_ON, INT_GROUP_MIN_BLOCKS=5, MIN_BLOCKS=3),
    "stat_old": dict(_ON, **_STAT_OFF),
    "stat_new": dict(_ON, **dict(_STAT_OFF, STAT_GROUP_FAST=True)),
    "stat_clip": dict(_ON, **dict(_STAT_OFF, STAT_GROUP_FAST=True, ASYM_INT_CLIP=True)),
    "stat_k4": dict(_ON, **dict(_STAT_OFF, STAT_GROUP_FAST=True, ASYM_INT_CLIP=True, CENTRED_UNITS=4)),
    "stat_packed": dict(_ON, **dict(_STAT_OFF, STAT_GROUP_FAST=True, ASYM_INT_CLIP=True, ASYM_PACKED_STATS=True,
                                    CENTRED_UNITS=4)),
}
VARIANTS = ["old", "new", "new+lb", "old"]
_BUILT = {}
# kernel factories and the switches each reads when it builds (CENTRED_UNITS is in its arguments)
_FACTORIES = (("rowwise_kernels", "make_lastaxis_group_kernel", ("INT_GROUP_FAST", "INT_GROUP_MIN_BLOCKS")),
              ("tile_kernels", "make_tile_kernel", ("RECIP_ONCE", "MIN_BLOCKS")),
              ("rowwise_kernels", "make_lastaxis_asym_row_kernel", ("ASYM_ROW_RECIP_ONCE", "ASYM_INT_CLIP")),
              ("rowwise_kernels", "make_lastaxis_stat_group_kernel",
               ("STAT_GROUP_FAST", "ASYM_INT_CLIP", "ASYM_PACKED_STATS")))


def _modules():
    import nqdq.kernels._rowwise_kernels as rowwise_kernels
    import nqdq.kernels._tile_kernels as tile_kernels
    import nqdq.kernels.quantize as kq

    return {"rowwise_kernels": rowwise_kernels, "tile_kernels": tile_kernels, "quantize": kq}


def _owner(name):
    """The module holding switch ``name``."""
    owners = {"RECIP_ONCE": "tile_kernels", "MIN_BLOCKS": "tile_kernels", "CENTRED_UNITS": "quantize"}
    return owners.get(name, "rowwise_kernels")


def _state(names):
    mods = _modules()
    return tuple((n, getattr(mods[_owner(n)], n)) for n in names)


def set_variant(settings):
    import nqdq.api

    mods = _modules()
    if not _BUILT:
        for mod, name, reads in _FACTORIES:
            base = getattr(mods[mod], name).__wrapped__

            def make(*a, _base=base, _reads=reads, **k):
                key = (_base.__name__, _state(_reads), a, tuple(sorted(k.items())))
                if key not in _BUILT:
                    _BUILT[key] = _base(*a, **k)
                return _BUILT[key]

            setattr(mods[mod], name, make)
        _BUILT["installed"] = True
    for n, v in settings.items():
        setattr(mods[_owner(n)], n, v)
    mods["quantize"]._PLANS.clear()
    if nqdq.api._FAST is not None:
        nqdq.api._FAST.clear()


def main(argv):
    import peers

    variants = VARIANTS
    if "--variants" in argv:
        i = argv.index("--variants")
        variants = argv[i + 1].split(",")
        argv = argv[:i] + argv[i + 2:]
    unknown = [v for v in variants if v not in SETTINGS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; known: {sorted(SETTINGS)}")

    orig = peers.bench_nqdq

    def ab(timer, scheme, xs, n_sets, groups, in_bytes, add, skip, log):
        for tag in variants:
            set_variant(SETTINGS[tag])
            orig(timer, scheme, xs, n_sets, groups, in_bytes,
                 lambda impl, *a, **k: add(f"{impl} [{tag}]", *a, **k), lambda impl, why: skip(f"{impl} [{tag}]", why), log)

    peers.bench_nqdq = ab
    return peers.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
