"""Compile the kernels the launchers would run, without a GPU, and audit the PTX.

``python -m nqdq.tools.ptx_audit`` (needs numba-cuda with NVVM; no GPU, no simulator)
runs the launchers in a *dry run* (host arrays, launches recorded instead of executed) over
a sweep of schemes, compiles every recorded kernel with ``numba.cuda.compile_ptx`` for
sm_90, and checks what exactness depends on:

* no float64 instruction anywhere (a stray Python float literal would promote float32 math),
  except in a kernel that declares ``f64_cvts = (a, b)`` (the fused RMSNorm kernels, whose
  sum of squares is float64 by the spec): there its conversions must be exactly ``a``
  ``cvt.f64.f32`` and ``b`` ``cvt.rn.f32.f64`` (a stray promotion adds one of each) and no
  f64 instruction may be approximate (``.approx``), flush to zero or a division / sqrt;
* every float32 division is IEEE ``div.rn.f32`` (not ``div.approx`` / ``div.full``);
* no ``fma`` where the reference rounds a product and a sum separately (NVVM contracts
  ``a * b + c`` by default; the centred dequantize uses libdevice ``fmul_rn``), except the
  two of each division by a reciprocal (``device.division.div_by_recip``: ``q0 = x * r``,
  ``e = fma(q0, s, -x)``, ``q = fma(-e, r, q0)``), which ``recip_div_fmas`` matches
  operand by operand, and the fused RMSNorm's ``fma.rn.f32 y, a, r_hi, t`` whose addend is
  ``t = mul.rn.f32 a, r_lo`` of the same factor ``a`` (``split_product_fmas``: the split
  product of its normalisation, where a * r_hi is exact by the spec, so the fma is the rounded sum of the two products); any other
  ``fma.f32`` is a problem;
* no flush-to-zero (``.ftz``) on any float instruction;
* no atomic without a state space (a generic ``atom`` / ``red``: NVVM could not tell the
  array's memory, e.g. through a select between two shared arrays; on sm_90 it runs as a
  generic ``ATOM``, far slower than a shared ``ATOMS``: ``generic_atomics``);

and reports registers and spills per kernel (assembled by nvJitLink for sm_90, which
accepts NVVM's newest PTX ISA where the machine's ptxas may not) and its count of 64-bit
integer PTX instructions (``i64``: static, informational; Numba types integer arithmetic
as int64).
"""

from __future__ import annotations

import contextlib
import re
import sys

import numpy as np

# 64-bit integer instructions (Numba types integer arithmetic as int64): informational
_INT64 = re.compile(r"^\s*(?:@%p\d+\s+)?[a-z]+(?:\.[a-z0-9]+)*\.[sub]64\b", re.M)
_FP64 = re.compile(r"^\s*(?:@%p\d+\s+)?[a-z]+(?:\.[a-z0-9]+)*\.f64\b", re.M)


@contextlib.contextmanager
def _no_gpu_compile():
    """numba-cuda compiles device functions for the *current* device's compute capability;
    without a GPU, pretend one of sm_90 is current (compile only, nothing runs)."""
    from ..gpu.runtime.backend import cuda
    from numba.cuda import dispatcher

    if cuda.is_available():
        yield
        return

    class _Dev:
        compute_capability = (9, 0)

    old = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: _Dev()
    try:
        yield
    finally:
        dispatcher.get_current_device = old


@contextlib.contextmanager
def dry_run(record):
    """Run ``nqdq.gpu.quantize.plan`` on host arrays and record the launches instead."""
    from ..gpu.runtime import interop as _interop
    from ..gpu.quantize import plan as kq

    saved = (kq.SIMULATOR, _interop.SIMULATOR, kq._launch)
    kq.SIMULATOR = _interop.SIMULATOR = True

    def _record(kernel, grid, block, stream, *args):
        record.append((kernel, args))

    kq._launch = _record
    try:
        yield
    finally:
        kq.SIMULATOR, _interop.SIMULATOR, kq._launch = saved


def sweep_launches():
    """(label, kernel, args) for the kernels of a representative sweep of schemes."""
    import ml_dtypes

    from ..schemes import schemes

    cases = [(n, {}, (8, 256), np.float32, None) for n in schemes()]
    cases += [
        ("mxfp4", {}, (8, 256), ml_dtypes.bfloat16, None),
        ("fp8_row", {}, (8, 256), np.float16, None),
        ("mxfp8", {"scale_rounding": "floor"}, (8, 256), np.float32, None),
        ("mxfp6_e3m2", {"scale_rounding": "even"}, (8, 256), np.float32, None),
        ("fp8_row", {}, (4, 9000), ml_dtypes.bfloat16, None),  # long rows
        ("fp8_row", {}, (1024, 8192), ml_dtypes.bfloat16, None),  # last-axis rows, deep units
        ("int8_row", {}, (1024, 7168), np.float16, None),
        ("mxfp4", {}, (2048, 2048), ml_dtypes.bfloat16, None),  # last-axis groups, deep units
        ("nvfp4", {}, (2048, 2048), ml_dtypes.bfloat16, None),
        ("fp8_1x128", {}, (2048, 2048), ml_dtypes.bfloat16, None),
        ("int8_asym", {}, (1024, 8192), ml_dtypes.bfloat16, None),  # asymmetric rows, deep units
        ("int8_asym", {}, (1024, 7168), np.float16, None),
        ("int4_asym", {}, (2048, 2048), ml_dtypes.bfloat16, None),  # asymmetric groups, deep units
        ("int8_centred", {}, (2048, 2048), ml_dtypes.bfloat16, None),  # centred groups, deep units
        ("int8_centred", {}, (2048, 2048), np.float32, None),
        ("int8_centred", {"group_size": 16384}, (2, 20000), np.float32, None),
        ("fp8_128x128", {}, (2048, 2048), ml_dtypes.bfloat16, None),  # one-pass 128 x 128 tiles
        ("fp8_128x128", {}, (2048, 2048), np.float32, None),
        ("fp8_tensor", {"static_scale": True}, (2048, 2048), ml_dtypes.bfloat16, None),  # static: one pass
        ("fp8_tensor", {}, (4, 256), ml_dtypes.bfloat16, None),  # dynamic, one launch (quantize.grid)
        ("nvfp4", {}, (4, 256), ml_dtypes.bfloat16, None),
        ("e4m3", {"granularity": "row", "static_scale": True}, (8, 256), np.float16, None),
        ("int4", {"granularity": "tensor", "static_scale": True}, (8, 256), np.float32, None),
        ("mxfp4", {}, (8, 250), np.float32, 7),  # stochastic, general kernels (rows not of whole units)
        ("int8_centred", {}, (8, 250), np.float32, 7),
        ("int4_asym", {}, (8, 250), np.float32, 7),
        ("e4m3", {"granularity": "row", "axis": 0}, (8, 256), np.float32, None),
        ("int8_centred", {"axis": 0}, (256, 8), np.float32, None),
        ("mxfp8", {"axis": 0}, (64, 8), np.float32, None),
        ("int4", {"granularity": "column"}, (8, 256), np.float32, None),
        ("int8_column", {}, (128, 4096), ml_dtypes.bfloat16, None),  # the shared-memory ring (P = 2 in a dry run)
        ("e4m3", {"granularity": "column"}, (256, 1024), np.float32, None),
        ("int8", {"granularity": "block", "symmetric": False}, (8, 256), np.float32, None),
    ]
    # stochastic rounding on the 16-byte-unit kernels (their stoch variants), at sizes that take
    # the deep paths
    bf16 = ml_dtypes.bfloat16
    sr_fast = [
        ("fp8_row", {}, (1024, 8192), bf16, 7),  # rows
        ("int8_row", {}, (1024, 7168), np.float16, 7),
        ("fp8_row", {}, (8, 256), np.float32, 7),
        ("fp8_1x128", {}, (2048, 2048), bf16, 7),  # groups
        ("mxfp8", {}, (2048, 2048), bf16, 7),
        ("mxfp6_e3m2", {}, (2048, 2048), bf16, 7),
        ("mxfp6_e2m3", {}, (8, 256), np.float32, 7),
        ("mxfp4", {}, (2048, 2048), bf16, 7),
        ("mxfp4", {}, (8, 256), np.float32, 7),
        ("int4_group", {}, (2048, 2048), bf16, 7),
        ("nvfp4", {}, (2048, 2048), bf16, 7),  # NVFP4: S_enc from the amax partials
        ("nvfp4", {}, (8192, 8192), bf16, 7),  # ... from finalize (three launches)
        ("nvfp4", {}, (4, 256), bf16, 7),  # ... one launch (quantize.grid)
        ("fp8_tensor", {}, (8192, 8192), bf16, 7),  # dynamic per tensor: two passes
        ("fp8_tensor", {}, (4, 256), bf16, 7),  # ... one launch (quantize.grid)
        ("fp8_tensor", {"static_scale": True}, (2048, 2048), bf16, 7),  # static: one pass
        ("int8_asym", {}, (1024, 8192), bf16, 7),  # asymmetric rows
        ("int4_asym", {}, (2048, 2048), bf16, 7),  # asymmetric groups
        ("int8_centred", {}, (2048, 2048), bf16, 7),  # centred groups
    ]
    out = []
    for case in [c + (False,) for c in cases] + [c + (True,) for c in sr_fast]:
        out += _case_launches(*case)
    return out


def _case_launches(name, kw, shape, dt, seed, sr_fast):
    """(label, kernel, args) of one sweep case's quantize and dequantize, in a dry run."""
    import ml_dtypes

    from ..schemes import resolve_scheme
    from ..gpu.runtime import interop as _interop
    from ..gpu.quantize import plan as kq

    sch = resolve_scheme(name, **kw)
    x = np.zeros(shape, dt)
    rec = []
    with dry_run(rec):
        xin = _interop.DeviceInput(
            x.reshape(-1).view(np.uint16 if dt != np.float32 else np.float32),
            {np.float32: 0, ml_dtypes.bfloat16: 1, np.float16: 2}[dt],
            shape, str(np.dtype(dt)), "numpy",
        )
        parts = kq.quantize(xin, sch, seed=seed, scale=1.0 if sch.static_scale else None)
        kq.dequantize(parts, sch, shape)
    label = f"{name}{kw or ''} {np.dtype(dt).name} {shape}" + (" stochastic" if seed else "")
    label += " (last-axis)" if sr_fast else ""
    return [(label, k, a) for k, a in rec]


def compile_and_audit(launches, cc=(9, 0), registers=True):
    """Compile each distinct (kernel, signature) once; return report rows."""
    from numba import typeof
    from ..gpu.runtime.backend import cuda

    rows, seen = [], set()
    with _no_gpu_compile():
        for label, kernel, args in launches:
            sig = tuple(typeof(a) for a in args)
            key = (id(kernel), sig)
            if key in seen:
                continue
            seen.add(key)
            # the kernel's own launch bound (ptxas fits its registers to it)
            lb = getattr(kernel, "targetoptions", {}).get("launch_bounds")
            ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=cc, launch_bounds=lb)
            rows.append(_audit_ptx(label, kernel.py_func.__name__, ptx, cc, registers,
                                   getattr(kernel, "f64_cvts", (0, 0))))
    return rows


_INSN = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][a-z0-9.]*)\s+(%\w+)((?:\s*,\s*[^,;]+)*)\s*;", re.M)


def _defs_and_fmas(body):
    """(defs, fmas) of a PTX ``body``: register -> (opcode, source operands) of the
    instruction that defines it, and the fma.f32 as (opcode, destination, operands)."""
    defs = {}
    fmas = []
    for op, dst, rest in _INSN.findall(body):
        args = tuple(a.strip() for a in rest.split(",")[1:])
        defs[dst] = (op, args)
        if re.fullmatch(r"fma\.[a-z.]*f32", op):
            fmas.append((op, dst, args))
    return defs, fmas


def recip_div_fmas(body):
    """(pairs, stray): the fma.f32 of ``body`` that form device.division.div_by_recip's pattern
    (2 per division: ``mul.f32 q0, x, r``, ``neg.f32 nx, x``, ``fma.rn.f32 e, q0, s, nx``,
    ``neg.f32 ne, e``, ``fma.rn.f32 q, ne, r, q0``; operands of the mul and of the fma's
    product in either order), and the number of fma.f32 that do not."""
    defs, fmas = _defs_and_fmas(body)

    def is_op(reg, op, n):
        d = defs.get(reg)
        return d is not None and d[0] == op and len(d[1]) == n

    first = {}  # e -> (q0, x, r)
    for op, dst, (a, b, c) in fmas:
        if op != "fma.rn.f32" or not is_op(c, "neg.f32", 1):
            continue
        x = defs[c][1][0]
        for q0 in (a, b):
            if is_op(q0, "mul.f32", 2) and x in defs[q0][1]:
                m = defs[q0][1]
                first[dst] = (q0, x, m[1] if m[0] == x else m[0])
    pairs = 0
    used = set()
    for op, dst, (a, b, c) in fmas:
        if op != "fma.rn.f32":
            continue
        for ne, r in ((a, b), (b, a)):
            if is_op(ne, "neg.f32", 1) and defs[ne][1][0] in first:
                e = defs[ne][1][0]
                q0, _x, r0 = first[e]
                if c == q0 and r == r0 and e not in used:
                    used.add(e)
                    pairs += 1
                    break
    return pairs, len(fmas) - 2 * pairs


def split_product_fmas(body):
    """The fma.rn.f32 of ``body`` of the shape ``fma.rn.f32 y, a, b, t`` (or ``b, a``) with
    ``t`` defined by ``mul.rn.f32 t, a, c`` (either order): the fused RMSNorm's y = a * r_hi +
    fl(a * r_lo) (the split product of fused.rows' normalisation)."""
    defs, fmas = _defs_and_fmas(body)
    n = 0
    for op, _dst, args in fmas:
        if op != "fma.rn.f32" or len(args) != 3:
            continue
        a, b, t = args
        d = defs.get(t)
        if d is not None and d[0] == "mul.rn.f32" and len(d[1]) == 2 and (a in d[1] or b in d[1]):
            n += 1
    return n


def generic_atomics(body) -> int:
    """The atomics / reductions of PTX ``body`` without a state space (``atom.add.u32``, not
    ``atom.shared.add.u32`` or ``atom.global...``)."""
    return len(re.findall(r"^\s*(?:@!?%p\d+\s+)?(?:atom|red)\.(?!global\b|shared\b|shared::)", body, re.M))


def _audit_ptx(label, name, ptx, cc, registers, f64_cvts=(0, 0)):
    body = ptx[ptx.find(".entry"):]
    problems = []
    n64 = len(_FP64.findall(body))
    if f64_cvts == (0, 0):
        if n64:
            problems.append(f"{n64} f64 instructions")
    else:
        cvts = (len(re.findall(r"\bcvt\.f64\.f32\b", body)), len(re.findall(r"\bcvt\.rn\.f32\.f64\b", body)))
        if cvts != tuple(f64_cvts):
            problems.append(f"f64 conversions {cvts}, expected {tuple(f64_cvts)}")
        bad64 = sorted(set(re.findall(r"\b(?:div|sqrt|rcp|rsqrt)\.[a-z.]*f64|\b[a-z]+\.approx[a-z.]*f64", body)))
        if bad64:
            problems.append(f"f64 {bad64}")
    divs = re.findall(r"\bdiv\.[a-z.]*f32", body)
    bad_div = [d for d in divs if d != "div.rn.f32"]
    if bad_div:
        problems.append(f"non-IEEE division {sorted(set(bad_div))}")
    nfma = len(re.findall(r"\bfma\.[a-z.]*f32", body))
    rdiv, stray = recip_div_fmas(body)
    stray -= split_product_fmas(body)
    if stray:
        problems.append(f"{stray} fma.f32 outside the reciprocal-division pattern")
    if re.search(r"\.ftz\.", body):
        problems.append("ftz")
    gen = generic_atomics(body)
    if gen:
        problems.append(f"{gen} generic atomics")
    row = dict(case=label, kernel=name, divs=len(divs), fma=nfma, rdiv=rdiv, f64=n64, problems=problems,
               mul_rn=len(re.findall(r"\bmul\.rn\.f32", body)), i64=len(_INT64.findall(body)))
    if registers:
        row.update(_registers(ptx, cc))
    return row


def _registers(ptx, cc):
    """Registers / spills / stack from nvJitLink's verbose log (empty dict if unavailable)."""
    try:
        from cuda.bindings import nvjitlink
    except ImportError:
        return {}
    try:
        h = nvjitlink.create(2, [f"-arch=sm_{cc[0]}{cc[1]}".encode(), b"-verbose"])
        data = ptx.encode()
        nvjitlink.add_data(h, nvjitlink.InputType.PTX, data, len(data), "k.ptx")
        nvjitlink.complete(h)
        n = nvjitlink.get_info_log_size(h)
        buf = bytearray(n)
        nvjitlink.get_info_log(h, buf)
        nvjitlink.destroy(h)
    except Exception as e:  # pragma: no cover - depends on the toolkit present
        return {"ptxas": f"unavailable ({type(e).__name__})"}
    log = bytes(buf).decode(errors="replace")
    out = {}
    m = re.search(r"Used (\d+) registers", log)
    if m:
        out["regs"] = int(m.group(1))
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if m:
        out["stack"], out["spill_st"], out["spill_ld"] = (int(v) for v in m.groups())
    return out


def main(argv=None):
    launches = sweep_launches()
    rows = compile_and_audit(launches)
    bad = 0
    print(f"{'kernel':22s} {'regs':>4s} {'stack':>5s} {'spill':>5s} {'div.rn':>6s} {'rdiv':>5s} {'mul.rn':>6s} {'i64':>5s}"
          "  case / problems")
    for r in rows:
        spill = r.get("spill_st", 0) + r.get("spill_ld", 0)
        print(f"{r['kernel']:22s} {r.get('regs', '-')!s:>4s} {r.get('stack', '-')!s:>5s} {spill!s:>5s} "
              f"{r['divs']:6d} {r['rdiv']:5d} {r['mul_rn']:6d} {r['i64']:5d}  {r['case']}"
              + (f"  PROBLEMS: {r['problems']}" if r["problems"] else ""))
        bad += bool(r["problems"])
    print(f"{len(rows)} kernels compiled for sm_90, {bad} with problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
