"""div_by_recip compiled (fma.rn.f32) against the GPU's own IEEE division (div.rn.f32) and
against its twins, at scale: every finite bfloat16 and float16 x over >= 100k scales, 1e9
random (x, s) pairs, and the significand sweep (x, s in [1, 2): every pair, as far as a time
budget allows: the proof's whole normalized domain, docs/numerics.md).

``pytest -m gpu tests/test_division_gpu.py`` (NQDQ_TEST_GPU=1) runs a shorter sweep;
``python3 tests/test_division_gpu.py [--sweep-seconds S] [--json FILE]`` prints the full
counts (their H100 result: docs/numerics.md, "Division by a reciprocal", "Checked").
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import pytest

if __name__ != "__main__":
    pytestmark = [pytest.mark.gpu]
    from helpers.gpu import gpu_cupy_or_skip

    gpu_cupy_or_skip()

from numba import cuda  # noqa: E402

from nqdq.gpu.device import division as D  # noqa: E402
from nqdq.gpu.device.codec import bits_f32, f32_bits  # noqa: E402

TINY = np.float32(2.0**-20)
F102 = np.float32(2.0**-102)
F125 = np.float32(2.0**-125)
TWO64 = np.float32(2.0**64)


@cuda.jit(device=True, inline=True)
def _judge(x, s, q, ref, cnt):
    """Count one pair: cnt[0] checked for RN(x / s), cnt[1] wrong there, cnt[2] tiny pairs
    (outside the exact range: must be a code-zero of x's sign), cnt[3] tiny and wrong,
    cnt[4] skipped (|x| >= s * 2^64 or s outside the guarded range). Local counts."""
    ax = abs(x)
    if ax >= s * TWO64:
        cnt[4] += 1
    elif ax >= F102 and abs(ref) >= F125:
        cnt[0] += 1
        if f32_bits(q) != f32_bits(ref):
            cnt[1] += 1
    else:
        cnt[2] += 1
        if not (abs(q) < TINY and (f32_bits(q) >> 31) == (f32_bits(x) >> 31)):
            cnt[3] += 1


@cuda.jit
def _grid_kernel(xs, ss, out):
    """Every (xs[i], ss[j]); thread-local counts, one atomic add each at the end."""
    cnt = cuda.local.array(5, np.int64)
    for t in range(5):
        cnt[t] = 0
    n = xs.size
    total = n * ss.size
    for k in range(cuda.grid(1), total, cuda.gridsize(1)):
        s = ss[k // n]
        x = xs[k % n]
        r = D.recip_guarded(s)
        if r == np.float32(0):
            cnt[4] += 1
            continue
        _judge(x, s, D.div_by_recip(x, s, r), x / s, cnt)
    for t in range(5):
        cuda.atomic.add(out, t, cnt[t])


@cuda.jit(device=True, inline=True)
def _hash(v):
    v = (v ^ (v >> 16)) * 0x7FEB352D & 0xFFFFFFFF
    v = (v ^ (v >> 15)) * 0x846CA68B & 0xFFFFFFFF
    return v ^ (v >> 16)


@cuda.jit
def _random_kernel(seed, npairs, out):
    """npairs random pairs: s uniform on the bits of the guarded range, x = s * 2^d with d
    uniform over [-150, 64) on the exponent bits (any significand), random sign."""
    cnt = cuda.local.array(5, np.int64)
    for t in range(5):
        cnt[t] = 0
    span = np.int64(D.RCP_S_MAX_BITS - D.RCP_S_MIN_BITS + 1)
    for k in range(cuda.grid(1), npairs, cuda.gridsize(1)):
        h1 = _hash(np.int64(k) * 2 + seed * 0x9E3779B1 & 0xFFFFFFFF)
        h2 = _hash(h1 ^ 0x5BD1E995)
        sb = D.RCP_S_MIN_BITS + (np.int64(h1) * span >> 32)
        xb = sb + (np.int64(h2 & 0x7FFFFFF) * (214 << 23) >> 27) - (150 << 23)
        if xb < 0:
            xb = xb & 0x7FFFFF  # a subnormal
        if xb > 0x7F7FFFFF:
            xb = 0x7F7FFFFF
        xb = xb | ((h2 >> 31) << 31)
        s = bits_f32(sb)
        x = bits_f32(xb)
        r = D.recip_guarded(s)
        _judge(x, s, D.div_by_recip(x, s, r), x / s, cnt)
    for t in range(5):
        cuda.atomic.add(out, t, cnt[t])


@cuda.jit
def _sweep_kernel(b0, nb, out):
    """Significands: s = 1 + b * 2^-23 for b in [b0, b0 + nb), every x = 1 + a * 2^-23; one s
    per thread (its reciprocal once), mismatches counted, the first one's (a, b) kept."""
    b = b0 + cuda.grid(1)
    if b >= b0 + nb:
        return
    s = bits_f32(0x3F800000 | b)
    r = D.recip_guarded(s)
    wrong = 0
    for a in range(1 << 23):
        x = bits_f32(0x3F800000 | a)
        if f32_bits(D.div_by_recip(x, s, r)) != f32_bits(x / s):
            wrong += 1
            out[2] = a
            out[3] = b
    if wrong:
        cuda.atomic.add(out, 1, wrong)


@cuda.jit
def _fma_kernel(a, b, c, out):
    i = cuda.grid(1)
    if i < a.size:
        out[i] = D.fma_f32(a[i], b[i], c[i])


def all_finite(bits16, to32):
    v = to32(np.arange(1 << 16, dtype=np.uint32).astype(bits16))
    return v[np.isfinite(v)].astype(np.float32)


def scales(n_random=100000, seed=1):
    """>= 100k scales: every power of two of the guarded range, its edge values, random
    float32 bits across it, and amax / 448 for random amax."""
    rng = np.random.default_rng(seed)
    pw = (2.0 ** np.arange(-80, 127)).astype(np.float32)
    lo, hi = np.uint32(D.RCP_S_MIN_BITS), np.uint32(D.RCP_S_MAX_BITS)
    edges = np.array([lo, lo + 1, lo + 2, hi, hi - 1, hi - 2, 0x3F7FFFFF, 0x3FFFFFFF], np.uint32).view(np.float32)
    rnd = rng.integers(int(lo), int(hi) + 1, n_random, dtype=np.uint32).view(np.float32)
    amax = (np.abs(rng.standard_normal(2000)) * 2.0 ** rng.integers(-40, 40, 2000)).astype(np.float32)
    return np.concatenate([pw, edges, rnd, amax / np.float32(448), amax / np.float32(127)])


def grid_counts(xs, ss):
    out = cuda.to_device(np.zeros(5, np.int64))
    _grid_kernel[132 * 32, 256](cuda.to_device(xs), cuda.to_device(ss), out)
    return out.copy_to_host()


def random_counts(npairs, seed=7):
    out = cuda.to_device(np.zeros(5, np.int64))
    _random_kernel[132 * 32, 256](seed, npairs, out)
    return out.copy_to_host()


def sweep(seconds, chunk=1 << 16, start=0):
    """The significand sweep of divisors b >= ``start`` for up to ``seconds``: (divisors done,
    mismatches, first (a, b), seconds)."""
    out = cuda.to_device(np.array([0, 0, -1, -1], np.int64))
    t0 = time.time()
    b0 = start
    while b0 < (1 << 23) and time.time() - t0 < seconds:
        nb = min(chunk, (1 << 23) - b0)
        _sweep_kernel[(nb + 127) // 128, 128](b0, nb, out)
        cuda.synchronize()
        b0 += nb
    o = out.copy_to_host()
    return int(b0 - start), int(o[1]), (int(o[2]), int(o[3])), time.time() - t0


def fma_vs_twin(n=1 << 20, seed=3):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(n) * 2.0 ** rng.integers(-60, 60, n)).astype(np.float32)
    b = (rng.standard_normal(n) * 2.0 ** rng.integers(-60, 60, n)).astype(np.float32)
    c = np.where(rng.random(n) < 0.5, -(a * b), rng.standard_normal(n) * 2.0 ** rng.integers(-120, 60, n)).astype(np.float32)
    c = np.where(rng.random(n) < 0.25, (-(a * b) * np.float32(1 + 2.0**-23)).astype(np.float32), c)
    out = cuda.device_array(n, np.float32)
    _fma_kernel[(n + 255) // 256, 256](cuda.to_device(a), cuda.to_device(b), cuda.to_device(c), out)
    got = out.copy_to_host()
    return int((got.view(np.uint32) != D.fma_f32_twin(a, b, c).view(np.uint32)).sum()), n


def _bf16(v):
    return (v.astype(np.uint32) << 16).view(np.float32)


def _f16(v):
    return v.astype(np.uint16).view(np.float16)


# ----------------------------------------------------------------------------- pytest (shorter)
def test_fma_matches_twin_gpu():
    bad, n = fma_vs_twin(1 << 18)
    assert bad == 0, f"{bad} of {n}"


@pytest.mark.parametrize("name, conv", [("bf16", _bf16), ("f16", _f16)])
def test_every_16bit_value_gpu(name, conv):
    c = grid_counts(all_finite(np.uint16, conv), scales(20000))
    assert c[1] == 0 and c[3] == 0 and c[0] > 10**8, c


def test_random_pairs_gpu():
    c = random_counts(1 << 27)
    assert c[1] == 0 and c[3] == 0 and c[0] > 1 << 25, c


def test_significand_sweep_part_gpu():
    done, bad, first, _ = sweep(5.0)
    assert bad == 0 and done > 0, (bad, first)


# ----------------------------------------------------------------------------- full report
def main(argv):
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep-seconds", type=float, default=60.0)
    ap.add_argument("--random", type=float, default=2e9)
    ap.add_argument("--sweep-from", type=int, default=0, help="first divisor significand of the sweep")
    ap.add_argument("--sweep-only", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    rows = {}
    t = time.time()
    if a.sweep_only:
        done, bad, first, sec = sweep(a.sweep_seconds, start=a.sweep_from)
        rows = dict(significand_sweep=dict(first_divisor=a.sweep_from, divisors=done, wrong=bad, first_wrong=first,
                                           s=round(sec, 1)))
        print(rows)
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(rows, fh, indent=1)
        return 0 if bad == 0 else 1
    rows["fma_vs_twin"] = fma_vs_twin()
    ss = scales()
    for name, conv in (("bf16", _bf16), ("f16", _f16)):
        xs = all_finite(np.uint16, conv)
        t0 = time.time()
        c = grid_counts(xs, ss)
        rows[f"every_{name}"] = dict(values=int(xs.size), scales=int(ss.size), checked=int(c[0]), wrong=int(c[1]),
                                     tiny=int(c[2]), tiny_wrong=int(c[3]), skipped=int(c[4]), s=round(time.time() - t0, 2))
    t0 = time.time()
    c = random_counts(int(a.random))
    rows["random"] = dict(pairs=int(a.random), checked=int(c[0]), wrong=int(c[1]), tiny=int(c[2]), tiny_wrong=int(c[3]),
                          skipped=int(c[4]), s=round(time.time() - t0, 2))
    done, bad, first, sec = sweep(a.sweep_seconds)
    rows["significand_sweep"] = dict(divisors=done, of=1 << 23, pairs=done * (1 << 23), wrong=bad, first_wrong=first,
                                     s=round(sec, 1))
    name = cuda.get_current_device().name
    rows["device"] = name.decode() if isinstance(name, bytes) else str(name)
    rows["total_s"] = round(time.time() - t, 1)
    for k, v in rows.items():
        print(f"{k:18s} {v}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    ok = rows["fma_vs_twin"][0] == 0 and all(rows[k]["wrong"] == 0 for k in ("every_bf16", "every_f16", "random",
                                                                              "significand_sweep"))
    ok = ok and all(rows[k]["tiny_wrong"] == 0 for k in ("every_bf16", "every_f16", "random"))
    print("ALL EXACT" if ok else "MISMATCHES")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
