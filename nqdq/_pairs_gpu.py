"""The GPU routes of ``nqdq.matmul``'s block-scaled and weight-only pairs: how each pair that
``matmul._matmul_new`` has checked runs on the tensor cores (``new_pair_gpu``), the operands
converted exactly where a kernel takes another form (MX codes as fp8 bytes, NVFP4 and
foldable weights as bfloat16: ``exact_bf16``), and the in-register int4 weight-only kernel's
launch (``weight_only_int4``). docs/design/gemm.md has the reasons and the figures.
"""

from __future__ import annotations

import numpy as np

from .gpu.runtime.interop import is_cupy
from .matmul import _dtype_name, _expand_rows, _pattern
from .quantized import ARRAY_FIELDS, QuantizedTensor


def new_pair_gpu(pair: str, a, b, *, bias, alpha, out_dtype, activation):
    """The GPU GEMM of a pair that ``_matmul_new`` checked: ``a`` the QuantizedTensor qa or
    the plain x, ``b`` the QuantizedTensor qb / qw (linear scales), the epilogue's arguments
    as ``nqdq.gpu.gemm.plan.gemm`` takes them.

    * MX x MX: the codes as fp8 bytes (``gemm.blockscaled.prepare_mx_operand``; K padded with
      zero codes to whole blocks of 32, which the partial block's scale already covers), the
      e8m0 scales as they are, the "mx" scale mode.
    * NVFP4 x NVFP4: each operand as the exact bfloat16 of e2m1 x its ue4m3 block scale
      (``exact_bf16``), the bf16 GEMM with the two tensor scales in its epilogue.
    * weight-only, x bfloat16 (``weight_only_route``): int4 in groups along K in registers,
      weights with scales per row / tensor, MX and NVFP4 as exact bfloat16 weights.

    The centred pairs, and weight-only x of float16 / float32 or other weights with float32
    scales that vary along K, have no GPU kernel yet: NotImplementedError."""
    if isinstance(a, QuantizedTensor) and a.scheme.is_mx and b.scheme.is_mx:
        from .gpu.gemm import plan as kg
        from .gpu.gemm.blockscaled import prepare_mx_operand

        (M, K), N = tuple(a.shape), int(b.shape[0])
        a8, fa = mx_fp8(prepare_mx_operand(a.codes, a.scheme.element.name, M, K), M, K)
        b8, fb = mx_fp8(prepare_mx_operand(b.codes, b.scheme.element.name, N, K), N, K)
        return kg.gemm(a8, b8, mma=f"{fa}.{fb}", sa=a.scales, sb=b.scales, sa_mode="mx", sb_mode="mx", bias=bias,
                       alpha=alpha, out_dtype=out_dtype, activation=activation)  # fmt: skip
    epi = dict(bias=bias, alpha=alpha, out_dtype=out_dtype, activation=activation)
    if isinstance(a, QuantizedTensor) and a.scheme.is_nvfp4 and b.scheme.is_nvfp4:
        from .gpu.gemm import plan as kg

        (a16, sa, _), (b16, sb, _) = exact_bf16(a), exact_bf16(b)
        return kg.gemm(a16, b16, mma="bf16.bf16", sa=sa, sb=sb, sa_mode="tensor", sb_mode="tensor", **epi)
    if not isinstance(a, QuantizedTensor):
        route, why = weight_only_route(pair, b)
        if route == "int4":
            return weight_only_int4(bf16_view(a), b, **epi)
        if route == "exact":
            from .gpu.gemm import plan as kg

            wb, sb, mode = exact_bf16(b)
            return kg.gemm(bf16_view(a), wb, mma="bf16.bf16", sa=gpu_xp(b.codes).ones(1, np.float32), sb=sb,
                           sa_mode="tensor", sb_mode=mode, **epi)  # fmt: skip
        raise NotImplementedError(f"matmul of {pair} has no GPU kernel yet ({why}); device=\"cpu\" computes it "
                                  "(the float64 reference on NumPy operands)")  # fmt: skip
    raise NotImplementedError(f"matmul of {pair} has no GPU kernel yet; device=\"cpu\" computes it "
                              "(the float64 reference on NumPy operands)")  # fmt: skip


def weight_only_route(pair: str, qw) -> tuple[str | None, str | None]:
    """(route, why) of the weight-only ``pair`` on the GPU, x bfloat16: "int4" (int4 in
    groups along K that ``gemm.weight_only`` takes: the packed weight read once, dequantized
    in registers), "exact" (scales per row / tensor, MX, NVFP4: ``exact_bf16`` weights on
    the bf16 GEMM), or None and why there is no GPU path."""
    from .gpu.gemm import weight_only as wo

    if not pair.startswith("bfloat16 x "):
        return None, "x must be bfloat16 on the GPU: the kernels multiply bfloat16 x by exact bfloat16 weights"
    why = wo.supported(qw)
    if why is None:
        return "int4", None
    if qw.scheme.is_mx or qw.scheme.is_nvfp4 or _pattern(qw.scheme, tuple(qw.shape)) in ("row", "tensor"):
        return "exact", None
    if qw.scheme.fmt == "int4":
        return None, why
    return None, ("weights with float32 scales that vary along K (groups, 128 x 128 tiles) need the scale applied "
                  "inside the K loop, which the in-register kernel does for int4 only")  # fmt: skip


def weight_only_int4(x, qw, *, bias, alpha, out_dtype, activation):
    """The in-register int4 kernel's launch (``gemm.weight_only``) on the current stream:
    x's bits C-contiguous and 16-byte aligned (copied where not), the output [M, N] in q's
    library (bfloat16 as uint16 bits on the GPU, ml_dtypes.bfloat16 in NumPy). NumPy operands
    on a GPU (``device="cuda"``) go over and back, as ``plan.gemm``'s do."""
    import dataclasses

    import ml_dtypes

    from .gpu.gemm import weight_only as wo
    from .gpu.runtime.interop import Allocator, lib_of
    from .gpu.runtime.launch import fast_kernel
    from .gpu.runtime.target import SIMULATOR

    xb = x.view(np.uint16) if _dtype_name(x) == "bfloat16" else x
    round_trip = isinstance(qw.codes, np.ndarray) and not SIMULATOR
    if round_trip:
        import cupy

        qw = dataclasses.replace(qw, **{f: cupy.asarray(getattr(qw, f)) for f in ARRAY_FIELDS
                                        if getattr(qw, f) is not None})  # fmt: skip
        xb = cupy.asarray(xb)
    xp = gpu_xp(qw.codes)
    if not xb.flags.c_contiguous or (xp is not np and xb.data.ptr % 16):
        xb = xp.ascontiguousarray(xb) if not xb.flags.c_contiguous else xb.copy()
    b = None if bias is None else xp.asarray(bias, np.float32)
    alloc = Allocator(lib_of(qw.codes))
    kern, grid, block, args, o = wo.launch_args(xb, qw, b, alpha, out_dtype, activation, alloc)
    M, N = int(xb.shape[0]), int(qw.shape[0])
    if SIMULATOR:
        kern[grid, block](*args)
    else:
        fast_kernel(kern).launch(grid, block, args, None)
    out = alloc.to_lib(o[: M * N], (M, N))
    if round_trip:
        out = out.get()
    if out_dtype == "float16":
        return out.view(np.float16)
    if out_dtype == "bfloat16" and isinstance(out, np.ndarray):
        return out.view(ml_dtypes.bfloat16)
    return out


def exact_bf16(q):
    """(bfloat16 [rows, K], s, mode) with ``dequant(q) = diag(s) @ that`` ("row": s per row;
    "tensor": s one value), the bfloat16 values exact: nqdq's own dequantize of ``q`` with
    the factor bfloat16 could not hold set to 1, that factor being ``s``:

    * scales constant along K (per row, per block of rows, per tensor; int4 / int8 / fp8,
      zero points too): the dequantize of unit scales is ``q`` (or ``q - z``), integers of
      at most 8 bits or fp8 values, all bfloat16 values; ``s`` the scales;
    * NVFP4: e2m1 x ue4m3 is a bfloat16 value (at most 6 significant bits, magnitudes 2^-10
      .. 2688: tests/test_gemm_nvfp4.py checks every pair); ``s`` the tensor scale; a NaN
      block scale gives NaN elements;
    * MX: an element (at most 4 significant bits) times 2^(e - 127) is a bfloat16 value
      wherever the product is at least 2^-133 in its last bit (every float32 normal);
      below that bfloat16 keeps fewer bits than float32's subnormals and the product is
      rounded to nearest even; ``s`` = 1.

    The arrays are q's library's (NumPy under the simulator, CuPy on a GPU: dequantize's
    unit kernel, bfloat16 as uint16 bits)."""
    import dataclasses

    from .api import dequantize

    sch = q.scheme
    xp = gpu_xp(q.codes)
    if sch.is_mx:
        return dequantize(q, dtype="bfloat16"), xp.ones(1, np.float32), "tensor"
    if sch.is_nvfp4:
        unit = dataclasses.replace(q, tensor_scale=xp.ones_like(q.tensor_scale))
        return dequantize(unit, dtype="bfloat16"), q.tensor_scale, "tensor"
    shape = tuple(q.shape)
    if _pattern(sch, shape) == "tensor":
        mode, s = "tensor", q.scales.reshape(-1)
    else:  # one per row, or one per block of rows expanded to one per row
        mode, s = "row", _expand_rows(q.scales, shape[0], int(sch.block_for(shape)[0]), xp)
    return dequantize(dataclasses.replace(q, scales=xp.ones_like(q.scales)), dtype="bfloat16"), s, mode


def gpu_xp(a):
    """The array module of a GPU operand's arrays: NumPy under the simulator (NumPy operands
    with ``device="cuda"``), else CuPy (``kernel_view`` gives the kernels CuPy arrays)."""
    if isinstance(a, np.ndarray):
        return np
    import cupy

    return cupy


def bf16_view(x):
    """x as the bf16 GEMM takes it: NumPy / CuPy as they are (bfloat16 values or uint16
    bits), another library's GPU array as a zero-copy CuPy view (bfloat16 as its bits)."""
    if isinstance(x, np.ndarray) or is_cupy(x):
        return x
    from .gpu.runtime.interop import kernel_view

    return kernel_view(x, "x")


def mx_fp8(prepared, rows, K):
    """(fp8 codes [rows, K rounded up to 32] zero-padded, their element name)."""
    codes, name = prepared
    Kp = -(-K // 32) * 32
    if Kp == K:
        return codes, name
    padded = gpu_xp(codes).zeros((rows, Kp), np.uint8)
    padded[:, :K] = codes.reshape(rows, K)
    return padded, name
