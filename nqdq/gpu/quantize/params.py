"""What the quantize and dequantize kernels are given for a scheme and a shape: the scale mode,
the format's largest element, MX's rounding constants; ceilings and powers of two, the 4-D
view the general kernels index scale groups by, and the group kernel's geometry."""

from __future__ import annotations

import numpy as np

from ...schemes import Scheme
from ..device.scales import MODE_ASYM, MODE_CENTRED, MODE_FLOAT, MODE_MX, MODE_NVFP4, MX_EVEN, MX_FLOOR, MX_RCEIL
from . import general

E_TARGET = 8  # elements each thread reduces in the group kernel
_MX_ROUNDING = {"floor": MX_FLOOR, "rceil": MX_RCEIL, "even": MX_EVEN}


def kernel_mode(sch: Scheme) -> int:
    """The kernels' scale mode (``device.scales.MODE_*``) of a scheme."""
    if sch.is_mx:
        return MODE_MX
    if sch.is_nvfp4:
        return MODE_NVFP4
    if sch.centred:
        return MODE_CENTRED
    if not sch.symmetric:
        return MODE_ASYM
    return MODE_FLOAT


def max_elem(sch: Scheme) -> float:
    """The largest code magnitude a scale maps the amax to (the format's largest value; an
    integer format's range end)."""
    elem = sch.element
    if elem.kind == "float":
        return float(elem.max_value)
    return float(elem.qrange(sch.symmetric)[1])


def mx_config(sch: Scheme) -> tuple:
    """(rounding, mantissa bits, emax, 1 / max) of an MX scheme's shared exponent; neutral
    values otherwise."""
    if not sch.is_mx:
        return (0, 0, 0, 1.0)
    e = sch.element
    return (_MX_ROUNDING[sch.scale_rounding], e.mbits, e.emax, float(np.float32(1.0 / e.max_value)))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pow2floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def pow2ceil(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def team_log2(work_per_row: int, nt: int) -> int:
    """log2 of the threads that share a row in the elementwise kernels: the power of two
    nearest above the row's work items, at most a block."""
    return min(max(work_per_row - 1, 0).bit_length(), nt.bit_length() - 1)


def view4(shape, block):
    """Merge the leading axes of ``shape`` into at most three, keeping the last axis:
    returns (dims, blocks) of a (d0, d1, d2, C) view whose scale groups are blocks."""
    merged = []
    for d, b in zip(shape[:-1], block[:-1]):
        if d == 1:
            continue
        if merged:
            D, B = merged[-1]
            if b == d:  # a fully reduced axis joins the previous one's groups
                merged[-1] = (D * d, B * d)
                continue
            if b == 1 and B == 1:
                merged[-1] = (D * d, 1)
                continue
        merged.append((d, b))
    if len(merged) > 3:
        raise NotImplementedError(f"scale groups {block} over shape {shape} do not fit a 4-D view")
    merged = [(1, 1)] * (3 - len(merged)) + merged
    dims = tuple(d for d, _ in merged) + (shape[-1],)
    blocks = tuple(b for _, b in merged) + (block[-1],)
    return dims, blocks


def geo_args(shape, block):
    """The general kernels' view arguments ``(d1, d2, b0, b1, b2, bc, n1, n2, nc)`` of
    :func:`view4` (dimensions, group sizes, groups per axis)."""
    dims, blocks = view4(shape, block)
    n = tuple(cdiv(d, b) for d, b in zip(dims, blocks))
    return (dims[1], dims[2], blocks[0], blocks[1], blocks[2], blocks[3], n[1], n[2], n[3])


def group_plan(G_true, cols, ngroups, mode, nt, sub_packed):
    """Geometry of the group kernel, or None when it cannot keep packed bytes in one block."""
    G = G_true if ngroups > 1 else min(G_true, cols)
    P = pow2ceil(G_true if mode == MODE_CENTRED else G)
    if G <= general.SEG_MAX:
        gpb = pow2floor(min(general.SEG_MAX // G, max(1, (nt * E_TARGET) // P), nt))
        team = nt // gpb
        if team > P:
            team = P
            gpb = nt // team
        stash = True
    else:
        gpb, team, stash = 1, nt, False
    if ngroups > 1 and sub_packed and (gpb * G) % 4:
        return None
    return dict(G=G, P=P, gpb=gpb, team=team, stash=stash)
