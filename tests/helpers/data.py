"""Test inputs: Gaussian data with the edge values mixed in, per-channel edge data,
activations with per-row magnitudes, MoE expert ids."""

from __future__ import annotations

import ml_dtypes
import numpy as np


def edge_data(shape, *, scale=3.0, seed=0):
    """Gaussian data with NaN, +-inf, signed zeros, subnormals, format maxima and ties mixed in."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    f = x.reshape(-1)
    specials = np.array(
        [0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1e-40, -1e-45, 448.0, 449.0, 464.0, -480.0,
         57344.0, 6.0, 5.0, 0.25, 0.75, 3.4e38, -3.4e38, 1e-30, 2.0**-127, 2.5, -3.5, 7.5, 28.0],
        np.float32,
    )
    idx = rng.choice(f.size, min(len(specials), f.size // 3), replace=False)
    f[idx] = specials[: len(idx)]
    return x


def column_data(shape, seed):
    """edge_data with every kind of last-axis channel the per-channel kernels handle: all
    zero, all -0, inf without NaN, subnormal amax, one NaN, large finite."""
    x = edge_data(shape, seed=seed)
    c = x.reshape(-1, shape[-1])
    c[:, 1] = 0.0  # an all-zero channel: s = 1
    c[:, 2] = -0.0
    c[:, 3] = np.inf  # inf but no NaN in the channel: s = NaN
    c[:, 4] = np.random.default_rng(seed).standard_normal(c.shape[0]) * 1e-41  # subnormal amax
    c[c.shape[0] // 2, 5] = np.nan  # one NaN: NaN scale
    c[:, -1] = np.random.default_rng(seed + 1).standard_normal(c.shape[0]) * 1e30  # large finite
    return x


def activation(rng, shape, dtype=ml_dtypes.bfloat16):
    """Gaussian rows scaled by 2^u, u uniform in [-6, 6] a row, as ``dtype``."""
    x = rng.standard_normal(shape).astype(np.float32)
    x *= np.exp2(rng.uniform(-6, 6, (shape[0], 1))).astype(np.float32)
    return x.astype(dtype)


def topk_ids(rng, tokens: int, num_experts: int, k: int, dtype=np.int64):
    """Expert ids [tokens, k] as a router's top-k gives them: k distinct experts a token, in
    random order (one ``rng.permutation`` a token)."""
    return np.stack([rng.permutation(num_experts)[:k] for _ in range(tokens)]).astype(dtype)
