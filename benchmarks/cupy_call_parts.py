"""What the CuPy operations inside one nqdq.quantize call cost on the host.

    python3 benchmarks/cupy_call_parts.py

Median of 20000 calls each (200 warm-up), every call timed on its own with a pair of
``time.perf_counter`` reads. Sizes are those of a 64 x 7168 mxfp4 plan (codes + scales in one
147456-byte allocation). Needs CuPy and a GPU; the figures are in docs/performance.md
("Host time per call").
"""

import statistics
import time

import cupy as cp
import numpy as np


def median_us(fn, n=20000):
    for _ in range(200):
        fn()
    pc = time.perf_counter
    ts = []
    for _ in range(n):
        t0 = pc()
        fn()
        ts.append(pc() - t0)
    return statistics.median(ts) * 1e6


def main():
    u8, f32 = np.dtype(np.uint8), np.dtype(np.float32)
    pool = cp.get_default_memory_pool()
    mp = cp.cuda.alloc(147456)
    rows = [
        ("cupy.empty(147456, uint8)", lambda: cp.empty(147456, u8)),
        ("cupy.cuda.alloc(147456)", lambda: cp.cuda.alloc(147456)),
        ("pool.malloc(147456)", lambda: pool.malloc(147456)),
        ("cupy.ndarray(shape, uint8, memptr)", lambda: cp.ndarray((64, 3584), u8, mp)),
        ("memptr + 256", lambda: mp + 256),
        ("cupy.ndarray(shape, float32, memptr + off)", lambda: cp.ndarray((64, 224), f32, mp + 256)),
        ("cupy.cuda.get_current_stream().ptr", lambda: cp.cuda.get_current_stream().ptr),
    ]
    for name, fn in rows:
        print(f"{name:45s} {median_us(fn):6.2f} us")


if __name__ == "__main__":
    main()
