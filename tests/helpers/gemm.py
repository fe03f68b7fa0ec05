"""The GEMM tests' shared cases: operand scheme pairs, the relative L2 error, and the
arguments nqdq.matmul passes to the kernel launcher."""

from __future__ import annotations

import numpy as np

# (scheme of A, scheme of B): int8 and fp8, per-row, per-tensor, asymmetric and 1x128 / 128x128 blocks
SCHEME_PAIRS = [
    ("int8_row", "int8_row"),
    ("int8_asym", "int8_row"),
    ("fp8_row", "fp8_row"),
    ("e5m2", "fp8_tensor"),
    ("fp8_tensor", "e5m2"),
    ("fp8_1x128", "fp8_128x128"),
]


def rel_l2(got, want):
    """||got - want|| / ||want|| in float64."""
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-300))


def gemm_kwargs(qa, qb):
    """The launcher arguments nqdq.matmul would pass (through its operand checks)."""
    from nqdq.matmul import _operand

    a, b = _operand(qa, "qa", "a", np), _operand(qb, "qb", "b", np)
    mma = ("u8s8" if a.za is not None else "s8s8") if a.elem == "int8" else f"{a.elem}.{b.elem}"
    return a.codes, b.codes, dict(mma=mma, sa=a.scales, sb=b.scales, sa_mode=a.mode, sb_mode=b.mode, za=a.za)
