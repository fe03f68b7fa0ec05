"""What the CuPy and driver operations inside one nqdq.quantize call cost on the host.

    taskset -c 2 python3 benchmarks/cupy_call_parts.py [--json FILE]

Median of 20000 calls each (200 warm-up), every call timed on its own with a pair of
``time.perf_counter`` reads (the device synchronized, untimed, every 200 calls). Sizes are those of a 64 x 7168 mxfp4 plan (codes + scales in one
147456-byte allocation). Then the launch of one small kernel (the toy fp8_row kernel,
``benchmarks/toy_fp8_row.py``, 64 x 7168 bf16), its parameters packed once, three ways:
Numba's ``CUkernel`` handle, the context's ``CUfunction`` (what nqdq.gpu.runtime.launch now
launches), and the ``CUfunction`` with the parameters given as one buffer
(``CU_LAUNCH_PARAM_BUFFER_POINTER``) instead of a ``void*[]``; each checked bit for bit
against the NumPy reference first. Needs CuPy and a GPU; the figures are in
docs/design/launch-path.md ("Where the time goes").
"""

import argparse
import ctypes
import json
import os
import sys
from pathlib import Path

import cupy as cp
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


def median_us(fn, n=20000, sync_every=200):
    """Median host time of one call, after 200 untimed ones: launch_overhead.host_median,
    which synchronizes the device (untimed) every ``sync_every`` calls so kernel launches
    never wait for room in the launch queue (the toy kernel runs longer on the device than
    its launch takes on the host)."""
    from launch_overhead import host_median

    for _ in range(200):
        fn()
    return host_median(fn, n, cp.cuda.runtime.deviceSynchronize, sync_every)


def array_rows():
    from nqdq.gpu.runtime.interop import cupy_array_new

    u8, f32 = np.dtype(np.uint8), np.dtype(np.float32)
    pool = cp.get_default_memory_pool()
    mp = cp.cuda.alloc(147456)
    new = cupy_array_new(cp, mp)
    nd = cp.ndarray
    print(f"cupy_array_new: {'the base __new__ + _init path' if new is not None else 'None (constructor)'}")

    def by_init(shape, dtype, memptr):
        a = new(nd)
        a._init(shape, dtype, memptr)
        return a

    rows = [
        ("cupy.empty(147456, uint8)", lambda: cp.empty(147456, u8)),
        ("cupy.cuda.alloc(147456)", lambda: cp.cuda.alloc(147456)),
        ("pool.malloc(147456)", lambda: pool.malloc(147456)),
        ("cupy.ndarray(shape, uint8, memptr)", lambda: nd((64, 3584), u8, mp)),
        ("memptr + 256", lambda: mp + 256),
        ("cupy.ndarray(shape, float32, memptr + off)", lambda: nd((64, 224), f32, mp + 256)),
        ("cupy.cuda.get_current_stream().ptr", lambda: cp.cuda.get_current_stream().ptr),
    ]
    if new is not None:
        rows += [
            ("ndarray base __new__ + _init(shape, uint8, memptr)", lambda: by_init((64, 3584), u8, mp)),
            ("ndarray base __new__ + _init(shape, float32, memptr + off)", lambda: by_init((64, 224), f32, mp + 256)),
            ("ndarray base __new__ + _init((), float32, memptr + off)", lambda: by_init((), f32, mp + 256)),
        ]
    return rows


def launch_rows(results):
    """The toy kernel's prepacked launch through CuPy's launchKernel: CUkernel vs CUfunction
    handle, void*[] vs one parameter buffer; outputs checked against the reference."""
    import ml_dtypes

    import nqdq
    import toy_fp8_row
    from nqdq.gpu.runtime import launch

    rows, cols = 64, 7168
    rng = np.random.default_rng(0)
    xh = (rng.standard_normal((rows, cols)) * np.exp2(rng.uniform(-4, 4, (rows, 1)))).astype(ml_dtypes.bfloat16)
    x = cp.asarray(xh.view(np.uint16))
    codes = cp.empty((rows, cols), cp.uint8)
    scales = cp.empty(rows, cp.float32)
    grid, block, kargs = toy_fp8_row.launch_args(x, codes, scales)
    ref = nqdq.quantize(xh, "fp8_row", device="cpu")
    entry = launch.FastKernel(toy_fp8_row.fp8_row_bf16).compile(kargs)
    buf, ptrs, addr = entry.new_buffer()
    entry.pack(buf, kargs)
    size = ctypes.c_size_t(entry.struct.size)
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(buf), 2, ctypes.addressof(size), 0)  # BUFFER_POINTER, SIZE, END
    lk = cp.cuda.driver.launchKernel
    print(f"handles: CUkernel {entry.kernel_handle:#x}, launched {entry.handle:#x} "
          f"({'the CUfunction' if entry.handle != entry.kernel_handle else 'the same: no CUfunction taken'})")
    ways = [
        ("launchKernel, Numba's CUkernel handle, void*[]", lambda: lk(entry.kernel_handle, grid, 1, 1, block, 1, 1, 0, 0, addr, 0)),
        ("launchKernel, CUfunction handle, void*[]", lambda: lk(entry.handle, grid, 1, 1, block, 1, 1, 0, 0, addr, 0)),
        ("launchKernel, CUfunction handle, one buffer (extra)",
         lambda: lk(entry.handle, grid, 1, 1, block, 1, 1, 0, 0, 0, ctypes.addressof(extra))),
    ]  # fmt: skip
    # the lambdas pass raw addresses: keep the buffers they point into alive with the rows
    keep = (buf, ptrs, size, extra, x, codes, scales, entry)
    out = []
    for name, fn in ways:
        codes.fill(0xA5)
        scales.fill(np.nan)
        fn()
        cp.cuda.runtime.deviceSynchronize()
        ok = np.array_equal(codes.get(), ref.codes.view(np.uint8)) and np.array_equal(
            scales.get().view(np.uint32), ref.scales.reshape(-1).view(np.uint32)
        )
        print(f"check {name}: {'bit-exact vs reference' if ok else 'MISMATCH'}", flush=True)
        results.append(dict(part=f"check {name}", ok=bool(ok)))
        if ok:
            out.append((name, lambda fn=fn, keep=keep: fn()))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")
    results = []
    rows = array_rows()
    try:
        rows += launch_rows(results)
    except Exception as e:  # the array rows still count
        print(f"launch rows: {type(e).__name__}: {e}")
    for name, fn in rows:
        us = median_us(fn)
        results.append(dict(part=name, median_us=us))
        print(f"{name:60s} {us:6.2f} us", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
