"""Launchers of the tensor-core GEMMs (kernel bodies in ``gemm.mma_sync``), mirroring
``nqdq.reference.matmul.gemm`` argument for argument.

Arrays may be NumPy (the simulator uses them as they are; on a GPU they are copied over
and the result copied back), CuPy or anything with ``__cuda_array_interface__`` (used in
place; the result is CuPy when CuPy is installed, a Numba device array otherwise).

Named choices: the tile each case takes (``default_config``) and the measurement that
decided it (H100 80GB HBM3, bf16 output; int8 in TOP/s, fp8 in TFLOP/s; "large": an output
of at least ``LARGE_OUTPUT`` = 4096^2 elements):

* ``SIM_CONFIG``: the CUDA simulator, which runs one Python thread per CUDA thread: one
  warp per CTA, a 16 x 16 tile.
* ``GPU_CONFIG``: GPUs other than sm_90 (``mma.sync``; wgmma needs sm_90a): 128 x 128 x 64,
  8 warps of 64 x 32, 3 stages (48 KiB). Also the MX block scales (``"mx"``) on every GPU,
  sm_90 included (``mma_sync_only``): the wgmma kernel has no MX mode yet (H200: 106
  TFLOP/s at 8192^3).
* ``MX_KERNEL_BY_CC``: which kernel the MX scales take, by compute capability: sm_120
  (Blackwell GeForce, built for sm_120a) the block-scaled mma that applies the e8m0 codes
  itself (``mma_sync.SCALE_MX_HW``; assembled, not run: no sm_120 GPU here); every other GPU
  and the simulator the float32 promotion every 32 of K (``SCALE_MX``).
* ``WGMMA_CONFIG_WIDE_DIRECT``: sm_90 int8, large outputs: 128 x 256 tiles (193 KiB; int8
  needs no promotion registers) on the block-barrier ring, direct epilogue: 1235 vs 1201
  for the parked epilogue at 8192^3, 965 vs 893 at 4096^3 (1149 and 1023 with a producer
  warpgroup on a persistent grid).
* ``WGMMA_CONFIG_WIDE_FIXED``: sm_90 int8 with zero points and GELU, large outputs: the
  same tile with the parked epilogue, as the direct one spills there (1.2 KiB: zero points
  and GELU beside 128 live int32 accumulators); 1187 vs 1035 for a row-major walk of the
  parked tile at 8192^3, 874 vs 730 at 4096^3.
* ``WGMMA_CONFIG_FP8_ROW``: sm_90 fp8 row / tensor scales, large outputs of at least
  ``FP8_ROW_MIN_TILES`` = 640 tiles of 128 x 192 (4096^3, 704 tiles: faster; 2048 x 7168,
  608: equal; M = 128, 75: slower): 128 x 192 tiles (m64n192k32, 161 KiB), a producer
  warpgroup (consumers at 232 registers hold the accumulators and the promoted sums
  without spilling), direct epilogue, persistent grid. 829 with the producer vs 702
  without at 8192^3, 531 vs 512 at 4096^3; 1070 with the direct epilogue on the persistent
  grid vs 1026 parked at 8192^3, 780 vs 711 at 4096^3.
* ``WGMMA_CONFIG_FP8_BLOCK``: sm_90 fp8 block scales, every size: 128 x 128 tiles (one
  128-block of weight scales per CTA), 6 stages, a producer warpgroup, ping-pong
  accumulators (3 x 64 float32 per thread), direct epilogue, persistent grid. 8192^3: 804
  vs 760 for ping-pong without the producer (4 stages); 876 vs 827 parked (781 vs 670 at
  4096^3); at the shapes below 739, 421, 61 (426, 349, 50 parked, one tile per CTA).
* ``WGMMA_CONFIG_BF16``: sm_90 bfloat16 operands (``"bf16.bf16"``: NVFP4 pairs and
  weight-only GEMMs as exact bfloat16, ``nqdq._pairs_gpu.exact_bf16``), large outputs:
  int8's tile and ring (no promotion either) with the tensor / row scales' direct epilogue. Below ``LARGE_OUTPUT``
  ``WGMMA_CONFIG_PERSISTENT_128``. (The mma.sync kernel, ``GPU_CONFIG``: 249 TFLOP/s at
  8192^3 on an H200, 223 at 4096^3, against cuBLAS bf16's 784 and 604.)
* ``WGMMA_CONFIG_PERSISTENT_128``: sm_90 int8, bf16 and fp8 row / tensor scales below those
  sizes: 128 x 128 tiles, a producer warpgroup, direct epilogue, persistent grid.
  2048x7168x2048 int8 775, fp8 row 746; 128x14336x4096 443, 447; 16x14336x4096 62, 64
  (vs 394, 249, 42 for int8 128 x 256 tiles and 349, 333, 51 for fp8 128 x 128 tiles, on
  the block-barrier ring with a parked row-major epilogue).
"""

from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numpy as np

from . import mma_sync
from . import wgmma
from ..runtime.target import SIMULATOR, device_cc
from ..runtime.launch import allow_smem, dynamic_smem
from ..runtime.sequence import Ptr, compile_sequence

__all__ = ["gemm", "PreparedGemm", "plan_gemm", "gemm_sequence", "TileConfig", "WgmmaConfig", "GemmSpec",
           "default_config", "SIM_CONFIG"]

TileConfig, GemmSpec, WgmmaConfig = mma_sync.TileConfig, mma_sync.GemmSpec, wgmma.WgmmaConfig
# the named choices (module docstring)
SIM_CONFIG = TileConfig(warps_m=1, warps_n=1, mt=1, nt=2, stages=2, group_m=2)
GPU_CONFIG = TileConfig()
WGMMA_CONFIG_WIDE_DIRECT = WgmmaConfig(n=256, direct=True)
WGMMA_CONFIG_WIDE_FIXED = WgmmaConfig(n=256)
WGMMA_CONFIG_FP8_ROW = WgmmaConfig(n=192, producer=True, direct=True)
WGMMA_CONFIG_FP8_BLOCK = WgmmaConfig(stages=6, pingpong=True, producer=True, direct=True)
WGMMA_CONFIG_PERSISTENT_128 = WgmmaConfig(producer=True, direct=True)
WGMMA_CONFIG_BF16 = WgmmaConfig(n=256, direct=True)
LARGE_OUTPUT = 4096 * 4096  # the large tiles were timed at 4096^3 and 8192^3
FP8_ROW_MIN_TILES = 640  # output tiles of 128 x 192

_OUT = {"float32": mma_sync.OUT_F32, "float16": mma_sync.OUT_F16, "bfloat16": mma_sync.OUT_BF16}
_ACT = {None: mma_sync.ACT_NONE, "relu": mma_sync.ACT_RELU, "gelu": mma_sync.ACT_GELU}
_SCALE = {"tensor": mma_sync.SCALE_TENSOR, "row": mma_sync.SCALE_ROW, "block": mma_sync.SCALE_BLOCK,
          "mx": mma_sync.SCALE_MX}


# compute capability -> the MX kernel variant (module docstring); absent: SCALE_MX
MX_KERNEL_BY_CC = {(12, 0): mma_sync.SCALE_MX_HW}


def mx_kernel_mode(cc) -> int:
    """The scale mode (kernel variant) that MX scales take on a GPU of compute capability
    ``cc`` (None: no GPU, the simulator): ``MX_KERNEL_BY_CC``."""
    return MX_KERNEL_BY_CC.get(None if cc is None else tuple(cc[:2]), mma_sync.SCALE_MX)


def mma_sync_only(spec: GemmSpec) -> bool:
    """Whether ``spec`` runs on the mma.sync kernel only: MX block scales (the wgmma kernel
    has no MX mode yet)."""
    return spec.sa_mode in mma_sync.MX_MODES


def default_config(spec: GemmSpec, shape: tuple[int, int] | None = None):
    """The tile ``spec`` takes for an output of ``shape`` = (M, N) (the module docstring's
    named choices): the simulator's one-warp tile; wgmma on sm_90 (numba-cuda builds for
    sm_90a there: ``wgmma_config_for``) except MX scales (``mma_sync_only``); mma.sync on
    other GPUs."""
    if SIMULATOR:
        return SIM_CONFIG
    if device_cc() == (9, 0) and not mma_sync_only(spec):
        return wgmma_config_for(spec, shape)
    return GPU_CONFIG


def wgmma_config_for(spec: GemmSpec, shape: tuple[int, int] | None = None) -> WgmmaConfig:
    """The sm_90a tile for ``spec`` and output ``shape`` (no shape: the large-output choice)."""
    large = shape is None or shape[0] * shape[1] >= LARGE_OUTPUT
    if spec.mma == "bf16.bf16":
        return WGMMA_CONFIG_BF16 if large else WGMMA_CONFIG_PERSISTENT_128
    if spec.mma in ("s8s8", "u8s8"):
        if not large:
            return WGMMA_CONFIG_PERSISTENT_128
        return WGMMA_CONFIG_WIDE_FIXED if spec.asym and spec.act == mma_sync.ACT_GELU else WGMMA_CONFIG_WIDE_DIRECT
    if spec.sa_mode == mma_sync.SCALE_BLOCK:
        return WGMMA_CONFIG_FP8_BLOCK
    if shape is not None and (not large or -(-shape[0] // 128) * -(-shape[1] // WGMMA_CONFIG_FP8_ROW.n) < FP8_ROW_MIN_TILES):
        return WGMMA_CONFIG_PERSISTENT_128
    return WGMMA_CONFIG_FP8_ROW


def _sm_count() -> int:
    from ..runtime.backend import cuda

    return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)


_KERNELS: dict = {}


def get_kernel(cfg, spec: GemmSpec):
    """The kernel for (cfg, spec), built once (Numba compiles it at the first launch):
    mma.sync for a TileConfig, wgmma (sm_90a) for a WgmmaConfig."""
    k = _KERNELS.get((cfg, spec))
    if k is None:
        if isinstance(cfg, WgmmaConfig) and mma_sync_only(spec):
            raise ValueError("the wgmma kernel has no MX scale mode; MX runs on the mma.sync kernel (a TileConfig)")
        make = wgmma.make_wgmma_kernel if isinstance(cfg, WgmmaConfig) else mma_sync.make_gemm_kernel
        k = make(cfg, spec)
        k.nqdq_dynamic_smem = cfg.smem_bytes  # launched with its whole tile ring (launch.dynamic_smem)
        _KERNELS[(cfg, spec)] = k
    return k


def built_kernels() -> dict:
    """{(TileConfig, GemmSpec): dispatcher} of every kernel built so far (SASS dumps)."""
    return dict(_KERNELS)


class _Lib:
    """Allocation and copies in the array library the call runs in."""

    def __init__(self, on_host_sim: bool, cupy):
        self.sim = on_host_sim
        self.cp = cupy

    def asarray(self, a, dtype):
        """1-D contiguous ``a`` in this library: integer codes reinterpreted as ``dtype``
        (int8 -> uint8 bytes), floats converted; None becomes a 1-element dummy."""
        dtype = np.dtype(dtype)
        if a is None:
            a = np.zeros(1, dtype)
        if self.sim or self.cp is not None:
            xp = np if self.sim else self.cp
            x = xp.ascontiguousarray(xp.asarray(a).reshape(-1))
        else:  # a GPU without CuPy: Numba device arrays
            from ..runtime.backend import cuda

            x = a.reshape(-1) if isinstance(a, np.ndarray) else cuda.as_cuda_array(a).reshape(-1)
        if x.dtype.kind in "iu" and dtype.kind in "iu" and x.dtype.itemsize == dtype.itemsize:
            x = x.view(dtype)
        elif x.dtype != dtype:
            x = x.astype(dtype)
        if isinstance(x, np.ndarray) and not self.sim:
            from ..runtime.backend import cuda

            x = cuda.to_device(np.ascontiguousarray(x))
        return x

    def empty(self, n, dtype):
        if self.sim:
            return np.empty(n, dtype)
        if self.cp is not None:
            return self.cp.empty(n, dtype)
        from ..runtime.backend import cuda

        return cuda.device_array(n, dtype)

    def pad_k(self, codes, rows, K, Kp):
        """[rows, K] uint8 codes (1-D) copied into zero-filled [rows, Kp] (bf16: bytes, K and
        Kp twice the elements)."""
        if self.sim or self.cp is not None:
            xp = np if self.sim else self.cp
            out = xp.zeros((rows, Kp), np.uint8)
            out[:, :K] = codes.reshape(rows, K)
            return out.reshape(-1)
        h = np.zeros((rows, Kp), np.uint8)
        h[:, :K] = codes.copy_to_host().reshape(rows, K)
        from ..runtime.backend import cuda

        return cuda.to_device(h.reshape(-1))


def _cupy():
    try:
        import cupy

        return cupy
    except Exception:
        return None


class GemmPlan(NamedTuple):
    """What one GEMM launches: the kernel's spec and tile, K padded to whole MMA steps, and
    the grid (0: an empty output, nothing to launch)."""

    spec: GemmSpec
    cfg: object  # TileConfig (mma.sync) or WgmmaConfig (sm_90a)
    Kp: int  # K rounded up to 16 bytes a row: 16 one-byte codes, 8 bf16 (zero codes fill the rest)
    grid: int


def plan_gemm(M, N, K, *, mma, sa_mode, sb_mode, asym=False, bias=False, out_dtype="float32", activation=None,
              config=None, mx_kernel=None) -> GemmPlan:  # fmt: skip
    """The kernel and grid of an [M, K] x [N, K]^T GEMM (``gemm``'s arguments; ``asym``: zero
    points given, ``bias``: a bias given; ``mx_kernel``: for mode "mx", SCALE_MX or
    SCALE_MX_HW, default ``mx_kernel_mode`` of this GPU). The one place both launchers choose them."""
    _check_mx(M, N, K, mma, sa_mode, sb_mode, asym, config)
    _check_bf16(mma, sa_mode, sb_mode, asym)
    if sa_mode == "mx":
        if mx_kernel is None:
            mx_kernel = mx_kernel_mode(None if SIMULATOR else device_cc())
        if mx_kernel not in mma_sync.MX_MODES:
            raise ValueError(f"mx_kernel={mx_kernel!r}: one of mma_sync.SCALE_MX, mma_sync.SCALE_MX_HW")
        sa_code = sb_code = mx_kernel
    else:
        sa_code, sb_code = _SCALE[sa_mode], _SCALE[sb_mode]
    spec = GemmSpec(mma=mma, sa_mode=sa_code, sb_mode=sb_code, out=_OUT[out_dtype],
                    act=_ACT[activation], bias=bool(bias), asym=bool(asym))  # fmt: skip
    cfg = config or default_config(spec, (M, N))
    # one n-block of scales per CTA, or (wgmma) two for N = 256 tiles
    if spec.sa_mode == mma_sync.SCALE_BLOCK and 128 % cfg.bn and not (isinstance(cfg,
                                                                                     WgmmaConfig) and cfg.bn == 256):
        raise ValueError(f"block scales need a CTA tile N ({cfg.bn}) dividing 128 (or 256 with wgmma)")
    grid = 0
    if M > 0 and N > 0:
        grid = (-(-M // cfg.bm)) * (-(-N // cfg.bn))
        if getattr(cfg, "persistent", False):  # one CTA per SM walks the tiles (2 in the simulator)
            grid = min(grid, 2 if SIMULATOR else _sm_count())
    align = 16 // mma_sync.elem_bytes(mma)  # whole 16-byte chunks a row (the kernel's cp.async)
    return GemmPlan(spec, cfg, -(-K // align) * align, grid)


def _check_mx(M, N, K, mma, sa_mode, sb_mode, asym, config):
    """The MX scale mode's preconditions: both operands in it, fp8 codes, K a whole number of
    32-element blocks (one mma step each), an mma.sync tile."""
    if (sa_mode == "mx") != (sb_mode == "mx"):
        raise ValueError(f"sa_mode={sa_mode!r} and sb_mode={sb_mode!r}: the MX scale mode ('mx', e8m0 codes "
                         "per 32 of K) applies to both operands together, not mixed with another mode")
    if sa_mode != "mx":
        return
    if mma in ("s8s8", "u8s8", "bf16.bf16") or asym:
        raise ValueError(f"mma={mma!r}: the MX scale mode takes fp8 codes ('<fa>.<fb>' of e4m3 / e5m2; "
                         "blockscaled.prepare_mx_operand converts mxfp6 / mxfp4 codes to e4m3)")
    if K % mma_sync.MX_K:
        whole = -(-K // mma_sync.MX_K) * mma_sync.MX_K
        raise ValueError(f"K={K}: the MX scale mode needs K a multiple of {mma_sync.MX_K} (one e8m0 scale per "
                         f"{mma_sync.MX_K} of K); pad both operands with zero codes to {whole}")
    if isinstance(config, WgmmaConfig):
        raise ValueError("config: the wgmma kernel has no MX scale mode; MX runs on the mma.sync kernel (a TileConfig)")


def _check_bf16(mma, sa_mode, sb_mode, asym):
    """The bf16 kind's preconditions: float32 scales per tensor or row (the epilogue of the
    fp8 row kernel), no zero points."""
    if mma != "bf16.bf16":
        return
    for name, mode in (("sa_mode", sa_mode), ("sb_mode", sb_mode)):
        if mode not in ("tensor", "row"):
            raise ValueError(f"{name}={mode!r}: mma='bf16.bf16' takes the 'tensor' and 'row' scale modes "
                             "(NVFP4's block scales are in the converted operands: nqdq._pairs_gpu.exact_bf16)")
    if asym:
        raise ValueError("za: mma='bf16.bf16' takes no zero points")


def _bf16_bits(x, name):
    """bfloat16 operand ``x`` as its uint16 bits: uint16 / int16 arrays as they are (any
    library), NumPy ml_dtypes.bfloat16 viewed as its bits; anything else a TypeError."""
    try:
        dt = np.dtype(getattr(x, "dtype", None))
    except TypeError:
        dt = None
    if dt == np.dtype(ml_dtypes.bfloat16) and isinstance(x, np.ndarray):
        return x.view(np.uint16)
    if dt is not None and dt.kind in "iu" and dt.itemsize == 2:
        return x
    raise TypeError(f"{name} (mma 'bf16.bf16') must hold bfloat16 bits (uint16) or ml_dtypes.bfloat16 values, "
                    f"got dtype {getattr(x, 'dtype', type(x).__name__)}")


class PreparedGemm:
    """One GEMM with every argument converted and the output allocated: ``launch()`` runs
    the kernel alone (benchmarks time this), ``result()`` returns the output as ``gemm``."""

    def __init__(self, a_codes, b_codes, *, mma, sa, sb, sa_mode, sb_mode, za=None, bias=None, alpha=1.0,
                 out_dtype="float32", activation=None, config=None, mx_kernel=None):  # fmt: skip
        M, K = (int(d) for d in a_codes.shape)
        N = int(b_codes.shape[0])
        self.shape, self.out_dtype = (M, N), out_dtype
        self.on_host = isinstance(a_codes, np.ndarray)
        lib = _Lib(SIMULATOR, None if SIMULATOR else _cupy())
        spec, cfg, Kp, grid = plan_gemm(M, N, K, mma=mma, sa_mode=sa_mode, sb_mode=sb_mode, asym=za is not None,
                                        bias=bias is not None, out_dtype=out_dtype, activation=activation,
                                        config=config, mx_kernel=mx_kernel)  # fmt: skip
        self.cfg = cfg
        eb = mma_sync.elem_bytes(mma)
        if eb == 2:  # bf16 bits, handed to the kernel as their bytes (it works in bytes of K)
            a = lib.asarray(_bf16_bits(a_codes, "a_codes"), np.uint16).view(np.uint8)
            b = lib.asarray(_bf16_bits(b_codes, "b_codes"), np.uint16).view(np.uint8)
        else:
            a = lib.asarray(a_codes, np.uint8)
            b = lib.asarray(b_codes, np.uint8)
        if Kp != K:  # zero codes contribute nothing (fp8 0x00 is +0.0; int8 0; bf16 0x0000)
            a, b = lib.pad_k(a, M, K * eb, Kp * eb), lib.pad_k(b, N, K * eb, Kp * eb)
        colsum = lib.empty(max(N, 1), np.int32)
        if za is not None and N > 0:
            mma_sync.row_sums_i8[(N + 127) // 128, 128](b.view(np.int8), N, Kp, colsum)
        self.out = lib.empty(max(M * N, 1), {"float32": np.float32}.get(out_dtype, np.uint16))
        if sa_mode == "mx":  # e8m0 codes, read as they are
            sa, sb = _mx_scale_bytes(sa, "sa", M, K), _mx_scale_bytes(sb, "sb", N, K)
        sdt = np.uint8 if sa_mode == "mx" else np.float32
        args = (a, b, M, N, Kp, lib.asarray(sa, sdt), lib.asarray(sb, sdt), lib.asarray(za, np.uint8),
                colsum, lib.asarray(bias, np.float32), np.float32(alpha), self.out)  # fmt: skip
        self._launch = None
        if grid:
            kern = get_kernel(cfg, spec)
            if SIMULATOR:
                self._launch = lambda: kern[grid, cfg.threads, 0, cfg.smem_bytes](*args)
            else:
                from ..runtime.launch import fast_kernel

                kern.compile(kernel_signature(spec))
                allow_smem(kern, cfg.smem_bytes)
                fk = fast_kernel(kern)
                fk.compile(args)
                self._launch = fk.prepare(grid, cfg.threads, args, shared_mem=cfg.smem_bytes)

    def launch(self, stream=None):
        if self._launch is not None:
            self._launch() if stream is None or SIMULATOR else self._launch(stream)

    def result(self):
        M, N = self.shape
        out = self.out[: M * N].reshape(M, N)
        if self.on_host and not SIMULATOR:
            out = out.get() if hasattr(out, "get") else out.copy_to_host()
        if self.out_dtype == "float16":
            out = out.view(np.float16)
        elif self.out_dtype == "bfloat16" and isinstance(out, np.ndarray):
            out = out.view(ml_dtypes.bfloat16)  # GPU arrays keep the bits (no bfloat16 dtype)
        return out


def _mx_scale_bytes(s, name, rows, K):
    """MX scales ``s`` as uint8: one-byte e8m0 codes (uint8, or ml_dtypes.float8_e8m0fnu
    viewed as its bits), [rows, K / 32] of them (the kernel indexes them so)."""
    dt = np.dtype(getattr(s, "dtype", np.float64))
    if dt.itemsize != 1:
        raise TypeError(f"{name} (mode 'mx') must hold uint8 e8m0 codes, got dtype {dt}")
    if int(s.size) != rows * (K // mma_sync.MX_K):
        raise ValueError(f"{name} (mode 'mx') must hold {rows} x {K // mma_sync.MX_K} e8m0 codes "
                         f"([rows, K / {mma_sync.MX_K}]), got {int(s.size)}")
    return s if dt == np.uint8 else s.view(np.uint8)


def gemm(a_codes, b_codes, **kw):
    """``epilogue(A @ B^T)`` on tensor cores; arguments as ``nqdq.reference.matmul.gemm``.

    a_codes: [M, K] codes (int8, or uint8 for fp8 / asymmetric int8; "bf16.bf16": uint16
    bfloat16 bits, or NumPy ml_dtypes.bfloat16); b_codes: [N, K];
    mma: "s8s8" | "u8s8" | "<fa>.<fb>" (fp8 formats) | "bf16.bf16" (m16n8k16, float32
    accumulate; scale modes "tensor" / "row"; the mma.sync kernel on every GPU); sa, sb:
    float32 scales (sizes by mode: tensor 1, read on the device, so a device scalar costs no
    host read; row M / N; block [M, ceil(K/128)] / [ceil(N/128), ceil(K/128)]), or for
    ``sa_mode = sb_mode = "mx"`` uint8 e8m0 codes [M, K/32] / [N, K/32] (fp8 codes, K a
    multiple of 32; mxfp6 / mxfp4 codes go through ``blockscaled.prepare_mx_operand`` first);
    za: uint8 zero points of an asymmetric A (1 or M); ``config``: a TileConfig or a
    WgmmaConfig (default :func:`default_config`); ``mx_kernel``: the MX variant
    (``mma_sync.SCALE_MX`` / ``SCALE_MX_HW``, default :func:`mx_kernel_mode`). Returns [M, N] out_dtype (bfloat16 as
    uint16 bits on a GPU array library; NumPy results are float16 / ml_dtypes.bfloat16).
    """
    g = PreparedGemm(a_codes, b_codes, **kw)
    g.launch()
    return g.result()


# ----------------------------------------------------------------------------- launch sequences
# nqdq.matmul's hot path: the GEMM's launches with every shape and constant packed once, so
# that a call passes only the addresses of its arrays (sequence.compile_sequence)
# what run(stream, ...) takes after the stream (names the generated function does not use itself)
SEQUENCE_ARGS = ("codes_a", "codes_b", "scales_a", "scales_b", "zeros_a", "bias", "out")
_OUT_ALIGN = 256  # the column sums of an asymmetric A start this aligned past the output


class GemmSequence(NamedTuple):
    """``run(stream, codes_a, codes_b, scales_a, scales_b, zeros_a, bias, out)``: one GEMM's
    launches (``gemm``'s), given the addresses of its arrays on a GPU, the NumPy arrays
    themselves in the simulator; ``out`` is one allocation of ``nbytes``: the [M, N] output
    (``out_dtype``), then (asymmetric A) the int32 column sums of B that the first launch
    writes."""

    run: object
    nbytes: int
    out_dtype: np.dtype  # float32, float16, or bfloat16 (uint16 bits on a GPU; ml_dtypes.bfloat16 in the simulator)
    plan: GemmPlan


def scale_count(mode: str, rows: int, K: int, block_rows: int = 1) -> int:
    """How many float32 scales (or zero points) an operand of ``rows`` x ``K`` has in
    ``mode``: 1, ``rows``, (block) one per ``block_rows`` x 128 tile (A: 1, B: 128), or
    (mx) one uint8 e8m0 code per row and 32 of K."""
    if mode == "mx":
        return rows * -(-K // mma_sync.MX_K)
    return {"tensor": 1, "row": rows, "block": -(-rows // block_rows) * -(-K // 128)}[mode]


def gemm_sequence(M, N, K, *, mma, sa_mode, sb_mode, asym=False, bias=False, alpha=1.0, out_dtype="float32",
                  activation=None, config=None, entries=None) -> GemmSequence | None:  # fmt: skip
    """The GEMM ``gemm`` would launch for these shapes and arguments (``asym``: zero points
    given, ``bias``: a bias given) as a :class:`GemmSequence`, or None where it needs per-call
    host work or Numba's launch: rows of K not whole 16-byte chunks (16 codes, 8 bf16: padded
    copies), an empty output, or the fast launch path off (``sequence.compile_sequence``). The
    arrays must be C-contiguous: codes [M, K] / [N, K] of one byte ("bf16.bf16": uint16 bits),
    float32 scales (mx: uint8 e8m0 codes; ``scale_count``), uint8 zero points (as A's scales),
    float32 bias [N]. ``entries``: compiled entries (tests)."""
    plan = plan_gemm(M, N, K, mma=mma, sa_mode=sa_mode, sb_mode=sb_mode, asym=asym, bias=bias, out_dtype=out_dtype,
                     activation=activation, config=config)  # fmt: skip
    spec, cfg, Kp, grid = plan
    if Kp != K or not grid:
        return None
    out_dt = np.dtype(np.float32 if out_dtype == "float32" else np.uint16)
    out_bytes = M * N * out_dt.itemsize
    colsum_at = -(-out_bytes // _OUT_ALIGN) * _OUT_ALIGN
    u8, f32, i32 = np.dtype(np.uint8), np.dtype(np.float32), np.dtype(np.int32)
    s_dt = u8 if sa_mode == "mx" else f32
    # parameters the spec compiles out (no zero points, no bias) point at the output: never read
    unused_u8, unused_i32, unused_f32 = Ptr("out", 0, 1, u8), Ptr("out", 0, 1, i32), Ptr("out", 0, 1, f32)
    colsum = Ptr("out", colsum_at, N, i32) if asym else unused_i32
    kern = get_kernel(cfg, spec)
    eb = mma_sync.elem_bytes(mma)  # the kernel reads the codes as bytes
    args = (Ptr("codes_a", 0, M * K * eb, u8), Ptr("codes_b", 0, N * K * eb, u8), M, N, K,
            Ptr("scales_a", 0, scale_count(sa_mode, M, K), s_dt),
            Ptr("scales_b", 0, scale_count(sb_mode, N, K, 128), s_dt),
            Ptr("zeros_a", 0, scale_count(sa_mode, M, K), u8) if asym else unused_u8, colsum,
            Ptr("bias", 0, N, f32) if bias else unused_f32, np.float32(alpha),
            Ptr("out", 0, M * N, out_dt))  # fmt: skip
    launches = [(kern, grid, cfg.threads, args)]
    if asym:  # colsum_b[n] = sum_k qb[n, k], for the zero-point correction
        launches.insert(0, (mma_sync.row_sums_i8, (N + 127) // 128, 128,
                            (Ptr("codes_b", 0, N * K, np.int8), N, K, colsum)))
    if SIMULATOR and entries is None:
        run = _simulated_sequence(launches)
    else:
        if entries is None:
            kern.compile(kernel_signature(spec))
            allow_smem(kern, cfg.smem_bytes)
        run = compile_sequence(launches, SEQUENCE_ARGS, entries=entries)
        if run is None:
            return None
    if out_dtype == "float16":
        out_dt = np.dtype(np.float16)
    elif out_dtype == "bfloat16" and SIMULATOR:
        out_dt = np.dtype(ml_dtypes.bfloat16)
    return GemmSequence(run, colsum_at + 4 * N if asym else out_bytes, out_dt, plan)


def _simulated_sequence(launches):
    """``compile_sequence``'s stand-in for the simulator: ``run(stream, *arrays)`` launches
    through Numba, each :class:`sequence.Ptr` a view of the NumPy array its name is given
    (``SEQUENCE_ARGS``), from its byte offset."""

    def view(arrays, p):
        flat = arrays[p.base].reshape(-1).view(np.uint8)
        return flat[p.offset : p.offset + p.n * p.dtype.itemsize].view(p.dtype)

    def run(stream, *arrays):
        named = dict(zip(SEQUENCE_ARGS, arrays))
        for kern, grid, block, args in launches:
            kern[grid, block, 0, dynamic_smem(kern)](*(view(named, a) if isinstance(a, Ptr) else a for a in args))

    return run


# ----------------------------------------------------------------------------- compile only
def kernel_signature(spec: GemmSpec):
    """The Numba signature the launcher's arguments have (for compile-only use)."""
    from numba import types as T

    u8, f32 = T.Array(T.uint8, 1, "C"), T.Array(T.float32, 1, "C")
    out = f32 if spec.out == mma_sync.OUT_F32 else T.Array(T.uint16, 1, "C")
    s = u8 if spec.sa_mode in mma_sync.MX_MODES else f32  # e8m0 codes, or float32 scales
    return (u8, u8, T.int64, T.int64, T.int64, s, s, u8, T.Array(T.int32, 1, "C"), f32, T.float32, out)


def compile_ptx(spec: GemmSpec, cc=(9, 0), config: TileConfig | WgmmaConfig | None = None) -> str:
    """PTX of one GEMM kernel for compute capability ``cc`` (e.g. ``(9, 0, "a")``), with or
    without a GPU present (numba-cuda compiles device functions for the *current* device;
    without one, a stand-in of capability ``cc[:2]`` is made current for the call)."""
    from ..runtime.backend import cuda
    from numba.cuda import dispatcher

    kern = get_kernel(config or GPU_CONFIG, spec)
    opts = {"launch_bounds": kern.targetoptions["launch_bounds"]} if kern.targetoptions.get("launch_bounds") else {}
    if cuda.is_available():
        return cuda.compile_ptx(kern.py_func, kernel_signature(spec), cc=cc, **opts)[0]

    class _Dev:
        compute_capability = tuple(cc[:2])

    old = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: _Dev()
    try:
        return cuda.compile_ptx(kern.py_func, kernel_signature(spec), cc=cc, **opts)[0]
    finally:
        dispatcher.get_current_device = old


def assemble(ptx: str, cc=(9, 0)) -> tuple[bytes, str]:
    """(cubin, info log) of ``ptx`` for ``cc`` by nvJitLink (``cuda.bindings``), which
    accepts the PTX ISA NVVM emits where an older ptxas may not. Raises on errors."""
    from cuda.bindings import nvjitlink

    return _nvjitlink(ptx.encode(), nvjitlink.InputType.PTX, "gemm.ptx", cc, lto=False)


def _nvjitlink(data: bytes, kind, name: str, cc, lto: bool) -> tuple[bytes, str]:
    """(cubin, info log) of one nvJitLink input (PTX or LTO-IR) linked for ``cc``."""
    from cuda.bindings import nvjitlink

    arch = f"sm_{cc[0]}{cc[1]}" + (cc[2] if len(cc) > 2 else "")
    opts = [f"-arch={arch}".encode(), b"-verbose"] + ([b"-lto"] if lto else [])
    h = nvjitlink.create(len(opts), opts)
    try:
        try:
            nvjitlink.add_data(h, kind, data, len(data), name)
            nvjitlink.complete(h)
        except Exception as exc:
            buf = bytearray(nvjitlink.get_error_log_size(h))
            nvjitlink.get_error_log(h, buf)
            what = "nvJitLink (LTO)" if lto else "nvJitLink"
            raise RuntimeError(f"{what} failed for {arch}: {bytes(buf).decode(errors='replace')}") from exc
        buf = bytearray(nvjitlink.get_info_log_size(h))
        nvjitlink.get_info_log(h, buf)
        cubin = bytearray(nvjitlink.get_linked_cubin_size(h))
        nvjitlink.get_linked_cubin(h, cubin)
        return bytes(cubin), bytes(buf).decode(errors="replace")
    finally:
        nvjitlink.destroy(h)


def assemble_lto(spec: GemmSpec, config, cc=(9, 0, "a")) -> tuple[bytes, str]:
    """(cubin, info log) of one GEMM kernel linked as Numba links it on a GPU: NVVM's
    LTO-IR through nvJitLink with link-time optimisation, i.e. one whole program (a PTX
    link, as ``assemble`` does, compiles relocatable code, where ptxas ignores
    ``setmaxnreg``: warning C7504). Works without a GPU."""
    from cuda.bindings import nvjitlink
    from ..runtime.backend import cuda
    from numba.cuda import dispatcher

    kern = get_kernel(config, spec)

    class _Dev:
        compute_capability = tuple(cc[:2])

    old = dispatcher.get_current_device
    if not cuda.is_available():
        dispatcher.get_current_device = lambda: _Dev()
    try:
        ltoir, _ = cuda.compile(kern.py_func, kernel_signature(spec), cc=cc, device=False, abi="numba", output="ltoir",
                                launch_bounds=kern.targetoptions.get("launch_bounds"))  # fmt: skip
    finally:
        dispatcher.get_current_device = old
    return _nvjitlink(ltoir, nvjitlink.InputType.LTOIR, "gemm.ltoir", cc, lto=True)
