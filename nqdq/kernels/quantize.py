"""Quantize / dequantize on the GPU: the launchers, with the signatures of
``nqdq.reference.quantize.quantize`` / ``dequantize`` (plus device-only options).

Which kernels run (see ``_quantize_kernels`` for each):

=====================================================  ======================================
scheme                                                 kernels
=====================================================  ======================================
group / row along the last axis (MX, fp8_1x128, int4   ``group`` (one pass; groups of more
group, per-token, asymmetric, centred INT8)            than SEG_MAX elements re-read L1/L2)
NVFP4                                                  ``tensor_partials`` -> ``finalize``
                                                       (S_enc) -> ``group``
per-tensor (dynamic)                                   ``tensor_partials`` -> ``finalize`` ->
                                                       ``encode``
per-channel (``column``)                               ``column_partials`` -> ``finalize`` ->
                                                       ``encode`` (``group`` when the channel
                                                       axis is the first of a 2-D array)
block B0 x B1                                          ``tile_params`` -> ``encode``
group / row along another axis (and last-axis groups   ``strided_params`` -> ``encode``
whose packed bytes would straddle two blocks)
static scales (``scale=``), any granularity            ``encode``
=====================================================  ======================================

Every path writes codes already packed along the last axis (4-bit: two per byte, 6-bit:
four per three bytes), and scales in the linear layout ``scheme.scale_shape(shape)``.
No path transposes the input: other axes are handled by index arithmetic.
"""

from __future__ import annotations

import math

import numpy as np

from ..reference import quantize as ref
from ..reference.packing import packed_length
from ..reference.quantize import QuantParts
from ..schemes import Scheme
from . import _quantize_kernels as K
from ._elements import format_tuple
from ._interop import Allocator, DeviceInput, device_input, is_cupy
from ._scales import MODE_ASYM, MODE_CENTRED, MODE_FLOAT, MODE_MX, MODE_NVFP4, MX_EVEN, MX_FLOOR, MX_RCEIL
from ._target import SIMULATOR

__all__ = ["quantize", "dequantize", "has_nonfinite", "to_bfloat16_bits", "THREADS"]

THREADS = 64 if SIMULATOR else 256  # threads per block (results never depend on it)
E_TARGET = 8  # elements each thread reduces in the group kernel
_MX_ROUNDING = {"floor": MX_FLOOR, "rceil": MX_RCEIL, "even": MX_EVEN}


def _pow2floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _pow2ceil(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _mode(sch: Scheme) -> int:
    if sch.is_mx:
        return MODE_MX
    if sch.is_nvfp4:
        return MODE_NVFP4
    if sch.centred:
        return MODE_CENTRED
    if not sch.symmetric:
        return MODE_ASYM
    return MODE_FLOAT


def _max_elem(sch: Scheme) -> float:
    elem = sch.element
    if elem.kind == "float":
        return float(elem.max_value)
    return float(elem.qrange(sch.symmetric)[1])


def _mx_cfg(sch: Scheme) -> tuple:
    if not sch.is_mx:
        return (0, 0, 0, 1.0)
    e = sch.element
    return (_MX_ROUNDING[sch.scale_rounding], e.mbits, e.emax, float(np.float32(1.0 / e.max_value)))


def _launch(kernel, grid, block, stream, *args):
    if SIMULATOR or not stream:
        kernel[grid, block](*args)
    else:
        kernel[grid, block, stream](*args)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _team_log2(work_per_row: int, nt: int) -> int:
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


def _geo_args(shape, block):
    dims, blocks = view4(shape, block)
    n = tuple(_cdiv(d, b) for d, b in zip(dims, blocks))
    return (dims[1], dims[2], blocks[0], blocks[1], blocks[2], blocks[3], n[1], n[2], n[3])


class _Outputs:
    """Flat output arrays of one quantize call, and the dummies kernels need for the rest."""

    def __init__(self, alloc: Allocator, sch: Scheme, mode, shape, packed, fill):
        self.alloc = alloc
        n = math.prod(shape)
        C = shape[-1]
        self.rows = n // C
        sub = packed and sch.code_bits < 8
        self.pcols = packed_length(C, sch.code_bits) if sub else C
        self.sshape = sch.scale_shape(shape)
        ns = math.prod(self.sshape)
        self.codes = alloc.empty(self.rows * self.pcols, np.uint8)
        self.scales = alloc.empty(ns, np.uint8 if mode in (MODE_MX, MODE_NVFP4) else np.float32)
        self.zps = alloc.empty(ns, np.uint8) if mode == MODE_ASYM else None
        self.means = alloc.empty(ns, np.float32) if mode == MODE_CENTRED else None
        self.tscale = alloc.empty(1, np.float32) if mode == MODE_NVFP4 else None
        self.sparams = alloc.empty(1, np.float32)
        self._dummy_u8 = alloc.empty(1, np.uint8)
        self._dummy_f32 = alloc.empty(1, np.float32)
        if fill is not None:
            for a in (self.codes, self.scales, self.zps, self.means, self.tscale):
                if a is not None:
                    fill_bytes(a, fill)

    def args(self):
        A = self.alloc.kernel_arg
        return (
            A(self.codes),
            A(self.scales),
            A(self.zps if self.zps is not None else self._dummy_u8),
            A(self.means if self.means is not None else self._dummy_f32),
        )


def fill_bytes(a, value):
    """Fill every byte of ``a`` (NumPy / CuPy / Numba) with ``value`` (test poisoning)."""
    if isinstance(a, np.ndarray):
        a.view(np.uint8)[...] = value
    elif is_cupy(a):
        a.view("uint8").fill(value)
    else:
        a.view(np.uint8).copy_to_device(np.full(a.nbytes, value, np.uint8))


def _split_seed(seed):
    if seed is None:
        return 0, 0
    s = int(seed) & 0xFFFFFFFFFFFFFFFF
    return s & 0xFFFFFFFF, s >> 32


def _group_plan(G_true, cols, ngroups, mode, nt, sub_packed):
    """Geometry of the group kernel, or None when it cannot keep packed bytes in one block."""
    G = G_true if ngroups > 1 else min(G_true, cols)
    P = _pow2ceil(G_true if mode == MODE_CENTRED else G)
    if G <= K.SEG_MAX:
        gpb = _pow2floor(min(K.SEG_MAX // G, max(1, (nt * E_TARGET) // P), nt))
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


def quantize(x, scheme: Scheme, *, scale=None, seed=None, packed=True, dtype=None, threads=None, out_fill=None):
    """``nqdq.reference.quantize.quantize`` on the device.

    ``x``: a device array (CuPy, ``__cuda_array_interface__``, CUDA DLPack) of float32 /
    float16 / bfloat16 -- or uint16 bits with ``dtype="bfloat16"``/``"float16"`` -- or a
    NumPy array (run in the simulator under NUMBA_ENABLE_CUDASIM=1, else copied to the GPU
    and back). Returns a :class:`QuantParts` in the input's library whose codes are packed
    along the last axis when ``packed`` (one per byte, as the reference's, otherwise).
    ``threads`` overrides the block size; ``out_fill`` fills every output byte first (tests).
    """
    xin = x if isinstance(x, DeviceInput) else device_input(x, "x", dtype)
    shape = tuple(xin.shape)
    if len(shape) == 0:
        raise ValueError("x must have at least one dimension, got a 0-d array")
    alloc = Allocator(xin.lib)
    n = math.prod(shape)
    if n == 0:
        return _empty_parts(alloc, scheme, shape, packed)
    nt = threads or THREADS
    sch = scheme
    mode = _mode(sch)
    fmt = format_tuple(sch)
    maxe = _max_elem(sch)
    mxc = _mx_cfg(sch)
    stoch = seed is not None
    key_lo, key_hi = _split_seed(seed)
    block = sch.block_for(shape)
    out = _Outputs(alloc, sch, mode, shape, packed, out_fill)
    codes, scales, zps, means = out.args()
    A = alloc.kernel_arg
    xa = A(xin.arr)
    stream = alloc.stream()
    nd = len(shape)
    C = shape[-1]
    rows = out.rows
    sub_packed = packed and sch.code_bits < 8
    kind = xin.kind

    def run_encode():
        k = K.make_encode_kernel(kind, mode, fmt, nt, packed, stoch)
        tpr_log2 = _team_log2(_cdiv(C, 4), nt)
        grid = max(1, min(_cdiv(rows, nt >> tpr_log2), 1 << 20))
        _launch(
            k, grid, nt, stream,
            xa, rows, C, *_geo_args(shape, block), codes, out.pcols, scales, zps, means, key_lo, key_hi, tpr_log2,
        )

    def run_group(view_rows, view_cols, G_true, plan):
        ngroups = _cdiv(view_cols, G_true)
        k = K.make_group_kernel(
            kind, mode, fmt, mxc, maxe, plan["G"], plan["P"], plan["team"], plan["gpb"], nt, plan["stash"], packed, stoch
        )
        if ngroups == 1:
            segs = 1
            grid = _cdiv(view_rows, plan["gpb"])
        else:
            segs = _cdiv(ngroups, plan["gpb"])
            grid = view_rows * segs
        vpcols = packed_length(view_cols, sch.code_bits) if sub_packed else view_cols
        _launch(
            k, grid, nt, stream,
            xa, view_rows, view_cols, ngroups, segs, codes, vpcols, scales, zps, means,
            A(out.sparams), key_lo, key_hi,
        )

    def run_tensor_stats(stat_mode):
        nblocks = max(1, min(_cdiv(n, nt * E_TARGET), 1024))
        pi = alloc.empty(nblocks, np.int64)
        pa = alloc.empty(nblocks, np.float32)
        pb = alloc.empty(nblocks, np.float32)
        _launch(K.make_tensor_partials_kernel(kind, stat_mode, nt), nblocks, nt, stream, xa, n, A(pi), A(pa), A(pb))
        return pi, pa, pb, nblocks

    def run_finalize(fmode, parts, nchunks, ngroups, I):
        pi, pa, pb = parts
        tsc = out.tscale if out.tscale is not None else out._dummy_f32
        nft = min(nt, _pow2ceil(nchunks * I))  # threads per group: no more than its partials
        _launch(
            K.make_finalize_kernel(fmode, maxe, nft), ngroups, nft, stream,
            A(pi), A(pa), A(pb), nchunks, ngroups, I, scales, zps, A(out.sparams), A(tsc),
        )

    ax = sch.axis % nd
    if scale is not None:
        s = np.ascontiguousarray(np.broadcast_to(np.asarray(_host(scale), np.float32), out.sshape)).reshape(-1)
        _copy_into(out.scales, s)
        run_encode()
    elif mode == MODE_NVFP4:
        pi, pa, pb, nb = run_tensor_stats(MODE_NVFP4)
        run_finalize(MODE_NVFP4, (pi, pa, pb), nb, 1, 1)
        plan = _group_plan(block[-1], C, _cdiv(C, block[-1]), mode, nt, sub_packed)
        run_group(rows, C, block[-1], plan)
    elif sch.granularity == "tensor":
        pi, pa, pb, nb = run_tensor_stats(mode)
        run_finalize(mode, (pi, pa, pb), nb, 1, 1)
        run_encode()
    elif sch.granularity == "block":
        R = shape[-2]
        B0, B1 = sch.block_shape
        ntiles = (n // (R * C)) * _cdiv(R, B0) * _cdiv(C, B1)
        _launch(K.make_tile_params_kernel(kind, mode, maxe, nt, B0, B1), ntiles, nt, stream, xa, R, C, scales, zps)
        run_encode()
    elif sch.granularity == "column":
        O, L, I = math.prod(shape[:ax]), shape[ax], math.prod(shape[ax + 1 :])
        plan = _group_plan(I, I, 1, mode, nt, sub_packed) if O == 1 and (nd == 2 or not sub_packed) else None
        if plan is not None:  # one channel = one contiguous row of the (L, I) view
            run_group(L, I, I, plan)
        else:
            J = L * I
            nchunks = max(1, min(O, _cdiv(1 << 17, J)))
            oc = _cdiv(O, nchunks)
            nchunks = _cdiv(O, oc)
            pi = alloc.empty(nchunks * J, np.int64)
            pa = alloc.empty(nchunks * J, np.float32)
            pb = alloc.empty(nchunks * J, np.float32)
            _launch(
                K.make_column_partials_kernel(kind, mode), (_cdiv(J, 128), nchunks), 128, stream,
                xa, O, J, oc, A(pi), A(pa), A(pb),
            )
            run_finalize(mode, (pi, pa, pb), nchunks, L, I)
            run_encode()
    else:  # group / row
        G = block[ax]
        plan = _group_plan(G, C, _cdiv(C, G), mode, nt, sub_packed) if ax == nd - 1 else None
        if plan is not None:
            run_group(rows, C, G, plan)
        else:
            O, L, I = math.prod(shape[:ax]), shape[ax], math.prod(shape[ax + 1 :])
            ngr = O * _cdiv(L, G) * I
            k = K.make_strided_params_kernel(kind, mode, fmt, mxc, maxe)
            _launch(k, _cdiv(ngr, 128), 128, stream, xa, O, L, I, G, _pow2ceil(G), scales, zps, means)
            run_encode()

    return _parts(out, sch, shape, packed)


def _parts(out: _Outputs, sch: Scheme, shape, packed) -> QuantParts:
    alloc = out.alloc
    cshape = tuple(shape[:-1]) + (out.pcols,)
    codes = alloc.to_lib(out.codes, cshape)
    if sch.element.kind == "int" and sch.symmetric and not (packed and sch.code_bits < 8):
        codes = codes.view(np.int8) if isinstance(codes, np.ndarray) else codes.view("int8")
    ts = alloc.to_lib(out.tscale, ()) if out.tscale is not None else None
    return QuantParts(
        codes=codes,
        scales=alloc.to_lib(out.scales, out.sshape),
        zero_points=alloc.to_lib(out.zps, out.sshape),
        tensor_scale=ts,
        means=alloc.to_lib(out.means, out.sshape),
    )


def _empty_parts(alloc, sch, shape, packed):
    """Empty inputs: the reference's answer (nothing to launch), in the output library."""
    p = ref.quantize(np.zeros(shape, np.float32), sch)
    codes = p.codes
    if packed and sch.code_bits < 8:
        from ..reference.packing import pack_codes

        codes = pack_codes(codes, sch.code_bits)
    return QuantParts(
        *(_to_device_like(alloc, a) for a in (codes, p.scales, p.zero_points, p.tensor_scale, p.means))
    )


def _to_device_like(alloc, a):
    if a is None or SIMULATOR or alloc.lib == "numpy":
        return a
    if alloc.cp is not None:
        return alloc.cp.asarray(a)
    from numba import cuda

    return cuda.to_device(np.ascontiguousarray(a))


def _host(a):
    if a is None or isinstance(a, np.ndarray):
        return a
    if hasattr(a, "get"):
        return a.get()
    if hasattr(a, "copy_to_host"):
        return a.copy_to_host()
    return np.asarray(a)


def _copy_into(dst, host_src):
    if isinstance(dst, np.ndarray):
        dst[...] = host_src
    elif is_cupy(dst):
        dst.set(host_src)
    else:
        dst.copy_to_device(host_src)


# =============================================================================== dequantize
def _lib_of(a) -> str:
    if isinstance(a, np.ndarray):
        return "numpy"
    return "cupy" if is_cupy(a) else "numba"


def dequantize(parts: QuantParts, scheme: Scheme, shape, *, packed=True, threads=None, out_fill=None):
    """``nqdq.reference.quantize.dequantize`` on the device: float32 values, in the
    library of ``parts.codes`` (codes packed along the last axis when ``packed``)."""
    shape = tuple(shape)
    lib = _lib_of(parts.codes)
    alloc = Allocator(lib)
    n = math.prod(shape)
    sch = scheme
    if n == 0:
        return _to_device_like(alloc, np.zeros(shape, np.float32))
    nt = threads or THREADS
    mode = _mode(sch)
    fmt = format_tuple(sch)
    C = shape[-1]
    rows = n // C
    sub = packed and sch.code_bits < 8
    pcols = packed_length(C, sch.code_bits) if sub else C
    block = sch.block_for(shape)

    def dev(a, dtype):
        if a is None:
            a = np.zeros(1, dtype)
        if SIMULATOR:
            return np.ascontiguousarray(_host(a)).reshape(-1).view(dtype) if not isinstance(a, np.ndarray) else np.ascontiguousarray(a).reshape(-1).view(dtype)
        if isinstance(a, np.ndarray):
            from numba import cuda

            return cuda.to_device(np.ascontiguousarray(a).reshape(-1).view(dtype))
        return alloc.kernel_arg(a).reshape(a.size).view(dtype)

    out = alloc.empty(n, np.float32)
    if out_fill is not None:
        fill_bytes(out, out_fill)
    sc_dtype = np.uint8 if mode in (MODE_MX, MODE_NVFP4) else np.float32
    k = K.make_dequant_kernel(mode, fmt, sch.symmetric, packed)
    tpr_log2 = _team_log2(C, nt)
    grid = max(1, min(_cdiv(rows, nt >> tpr_log2), 1 << 20))
    _launch(
        k, grid, nt, alloc.stream(),
        dev(parts.codes, np.uint8), rows, C, pcols, *_geo_args(shape, block),
        dev(parts.scales, sc_dtype), dev(parts.zero_points, np.uint8), dev(parts.means, np.float32),
        dev(parts.tensor_scale, np.float32), alloc.kernel_arg(out), tpr_log2,
    )
    return alloc.to_lib(out, shape)


# =============================================================================== small helpers
def has_nonfinite(x, dtype=None) -> bool:
    """True if the device array ``x`` holds a NaN or an infinity (one reduction pass)."""
    xin = x if isinstance(x, DeviceInput) else device_input(x, "x", dtype)
    n = math.prod(xin.shape)
    if n == 0:
        return False
    alloc = Allocator(xin.lib)
    nt = THREADS
    nblocks = max(1, min(_cdiv(n, nt * E_TARGET), 1024))
    pi = alloc.empty(nblocks, np.int64)
    pa = alloc.empty(nblocks, np.float32)
    pb = alloc.empty(nblocks, np.float32)
    A = alloc.kernel_arg
    _launch(K.make_tensor_partials_kernel(xin.kind, MODE_FLOAT, nt), nblocks, nt, alloc.stream(), A(xin.arr), n, A(pi), A(pa), A(pb))
    return bool((_host(pi) >= 0x7F800000).any())


def to_bfloat16_bits(values):
    """bfloat16 bits (uint16, round to nearest even) of a float32 device array, in its
    library (CuPy has no bfloat16 dtype)."""
    lib = _lib_of(values)
    alloc = Allocator(lib)
    flat = values.reshape(-1)
    dst = alloc.empty(flat.size, np.uint16)
    grid = max(1, min(_cdiv(flat.size, THREADS), 1 << 20))
    _launch(K.f32_to_bf16_kernel, grid, THREADS, alloc.stream(), alloc.kernel_arg(flat), alloc.kernel_arg(dst), flat.size)
    return alloc.to_lib(dst, values.shape)
