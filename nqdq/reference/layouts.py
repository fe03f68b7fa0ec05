"""Scale layouts: where each scale of a 2-D ``[rows, cols]`` scale matrix is stored for a
tensor-core GEMM to read it, and the exact inverse. NumPy, the spec for ``nqdq.gpu.layouts``.

A layout applies to the 2-D scale arrays of the MX (e8m0, one per 32 elements) and NVFP4
(ue4m3, one per 16 elements; ``nv_128x4`` only, gfx950 MFMA reads e8m0 scales) schemes: ``scales[rows, cols]`` with ``cols = ceil(K / block)``;
an N-D input's leading axes are flattened into ``rows`` (``rows = prod(shape[:-1])``, a 1-D
input is one row). Swizzling first pads the matrix to whole tiles with **zero bytes** (as
torchao ``to_blocked`` and triton_kernels ``blackwell_scale.py`` / ``cdna4_scale.py`` do; a zero
byte is the e8m0 scale 2^-127 and the ue4m3 scale +0.0; those slots belong to padding rows /
columns that the GEMM must zero-pad in the operand too). Unswizzling drops the padding again,
so ``unswizzle(swizzle(s), rows, cols) == s`` bit for bit for every shape.

=============  ============================================  =================================
name           swizzled array                                padding
=============  ============================================  =================================
``linear``     ``[rows, cols]`` (nothing moves)              none
``nv_128x4``   ``[R/128, C/4, 32, 4, 4]``                    rows to R (x128), cols to C (x4)
``cdna4_32``   ``[R/32, C*32]``                              rows to R (x32), cols to C (x8)
``cdna4_16``   ``[R/32, C*32]``                              rows to R (x32), cols to C (x8)
=============  ============================================  =================================

Each layout is one small class (as triton_kernels' ``layout_details``) with ``swizzle`` /
``unswizzle`` written as a few reshapes and one transpose; ``offset(r, c, rows, cols)`` gives
the same map as a formula, one scale at a time, which is what the kernels compute.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "LAYOUTS", "ScaleLayout", "Linear", "NV128x4", "CDNA4", "get_layout",
    "swizzle_nv_128x4", "unswizzle_nv_128x4", "swizzle_cdna4", "unswizzle_cdna4",
    "scale_matrix_shape",
]

# The names nqdq.quantize(scale_layout=...) accepts (api._LAYOUTS is this tuple).
LAYOUTS = ("linear", "nv_128x4", "cdna4_16", "cdna4_32")


def _ceil_to(n: int, m: int) -> int:
    return -(-n // m) * m


def _check_2d(s, argname="scales"):
    if not isinstance(s, np.ndarray):
        raise TypeError(f"{argname} must be a NumPy array, got {type(s).__name__}")
    if s.ndim != 2:
        raise ValueError(f"{argname} must be 2-D [rows, cols], got shape {s.shape}")


def _pad(s: np.ndarray, rows_to: int, cols_to: int) -> np.ndarray:
    """``s`` zero-padded at the bottom / right to ``[rows_to, cols_to]`` (a new array)."""
    out = np.zeros((rows_to, cols_to), s.dtype)
    out[: s.shape[0], : s.shape[1]] = s
    return out


class ScaleLayout:
    """One scale layout: ``swizzle(s[rows, cols]) -> stored``, ``unswizzle(stored, rows, cols)``."""

    name = ""
    row_align = 1  # rows are padded to a multiple of this
    col_align = 1  # cols are padded to a multiple of this

    def padded(self, rows: int, cols: int) -> tuple[int, int]:
        return _ceil_to(rows, self.row_align), _ceil_to(cols, self.col_align)

    def swizzled_shape(self, rows: int, cols: int) -> tuple[int, ...]:
        raise NotImplementedError

    def swizzle(self, s: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def unswizzle(self, stored: np.ndarray, rows: int, cols: int) -> np.ndarray:
        raise NotImplementedError

    def offset(self, r: int, c: int, rows: int, cols: int) -> int:
        """Flat (C-order) index in the swizzled array of linear scale ``(r, c)``."""
        raise NotImplementedError

    def _check_stored(self, stored, rows, cols):
        want = self.swizzled_shape(rows, cols)
        if not isinstance(stored, np.ndarray):
            raise TypeError(f"stored must be a NumPy array, got {type(stored).__name__}")
        if tuple(stored.shape) != want:
            raise ValueError(
                f"stored scales have shape {tuple(stored.shape)}, but layout {self.name!r} of a "
                f"[{rows}, {cols}] scale matrix is {want}"
            )


class Linear(ScaleLayout):
    """Row-major ``[rows, cols]``, as every quantizer writes it."""

    name = "linear"

    def swizzled_shape(self, rows, cols):
        return (rows, cols)

    def swizzle(self, s):
        _check_2d(s)
        return s.copy()

    def unswizzle(self, stored, rows, cols):
        self._check_stored(stored, rows, cols)
        return stored.copy()

    def offset(self, r, c, rows, cols):
        return r * cols + c


class NV128x4(ScaleLayout):
    """NVIDIA's 128x4 scale-factor tile: the layout cuBLASLt on sm_100 reads for block-scaled
    MXFP8 / MXFP6 / MXFP4 (``VEC32_UE8M0``) and NVFP4 (``VEC16_UE4M3``) operands ("block scaling
    factors layout" in the cuBLAS docs), and the scale-factor layout CUTLASS feeds to the
    ``tcgen05.mma ... .block_scale`` instructions (torchao ``to_blocked``, triton_kernels
    ``blackwell_scale.py``). Checked against that index formula, not against hardware: no
    sm_100 GPU is at hand and no nqdq GEMM reads it yet.

    In: ``s[rows, cols]``, rows = M (or N) of the operand, cols = K / vec (vec = 32 for MX,
    16 for NVFP4). Out: ``[R/128, C/4, 32, 4, 4]`` with R = rows padded to 128 and C = cols
    padded to 4 (zero bytes). Tiles of 128 rows x 4 columns are stored one after another,
    row-block major (torchao ``to_blocked``'s flat order); inside a tile, scale ``(r, c)``
    (r < 128, c < 4) is byte ``(r % 32) * 16 + (r // 32) * 4 + c`` of the tile's 512.
    """

    name = "nv_128x4"
    row_align = 128
    col_align = 4

    def swizzled_shape(self, rows, cols):
        R, C = self.padded(rows, cols)
        return (R // 128, C // 4, 32, 4, 4)

    def swizzle(self, s):
        _check_2d(s)
        R, C = self.padded(*s.shape)
        p = _pad(s, R, C)
        # (row block, r // 32, r % 32, col block, c) -> (row block, col block, r % 32, r // 32, c)
        return np.ascontiguousarray(p.reshape(R // 128, 4, 32, C // 4, 4).transpose(0, 3, 2, 1, 4))

    def unswizzle(self, stored, rows, cols):
        self._check_stored(stored, rows, cols)
        R, C = self.padded(rows, cols)
        lin = stored.transpose(0, 3, 2, 1, 4).reshape(R, C)
        return np.ascontiguousarray(lin[:rows, :cols])

    def offset(self, r, c, rows, cols):
        C = self.padded(rows, cols)[1]
        tile = (r // 128) * (C // 4) + c // 4
        rr, cc = r % 128, c % 4
        return tile * 512 + (rr % 32) * 16 + (rr // 32) * 4 + cc


class CDNA4(ScaleLayout):
    """AMD CDNA4 (gfx950) preshuffled MX scales for ``v_mfma_scale_f32_32x32x64_f8f6f4``
    (``mfma_dim=32``) or ``v_mfma_scale_f32_16x16x128_f8f6f4`` (``mfma_dim=16``), the layout
    Triton's AMD backend reads for ``tl.dot_scaled`` with preshuffled scales
    (python/tutorials/10-block-scaled-matmul.py ``shuffle_scales_cdna4``; triton_kernels
    ``cdna4_scale.py`` for the 16 layout): each lane loads one 32-bit word holding its scales
    for four MFMA operations (32: four consecutive K steps of 64; 16: a 2 x 2 block of
    16-row, 128-K operations). Checked against Triton's views, not against hardware (no
    gfx950 at hand); nqdq's gfx950 GEMMs (``nqdq.gpu.cdna4``, assembled, not run) read
    both layouts.

    In: ``s[rows, cols]``, rows = the non-K dimension (M of A, N of B), cols = K / 32
    (``sm``, ``sn`` in Triton's code). Out: ``[R/32, C*32]`` with R = rows padded to 32 and
    C = cols padded to 8 (zero bytes; triton_kernels ``ALIGN_N = 32``, ``ALIGN_K_SCALE = 8``):

    * 32: ``view(R//32, 32, C//8, 4, 2).permute(0, 2, 4, 1, 3)``
    * 16: ``view(R//32, 2, 16, C//8, 2, 4).permute(0, 3, 5, 2, 4, 1)``

    (Triton's views carry a trailing axis of 1, which changes nothing.)
    """

    row_align = 32
    col_align = 8

    def __init__(self, mfma_dim: int):
        if mfma_dim not in (16, 32):
            raise ValueError(f"mfma_dim must be 16 or 32, got {mfma_dim!r}")
        self.mfma_dim = mfma_dim
        self.name = f"cdna4_{mfma_dim}"

    def swizzled_shape(self, rows, cols):
        R, C = self.padded(rows, cols)
        return (R // 32, C * 32)

    def swizzle(self, s):
        _check_2d(s)
        R, C = self.padded(*s.shape)
        p = _pad(s, R, C)
        if self.mfma_dim == 32:
            v = p.reshape(R // 32, 32, C // 8, 4, 2).transpose(0, 2, 4, 1, 3)
        else:
            v = p.reshape(R // 32, 2, 16, C // 8, 2, 4).transpose(0, 3, 5, 2, 4, 1)
        return np.ascontiguousarray(v).reshape(R // 32, C * 32)

    def unswizzle(self, stored, rows, cols):
        self._check_stored(stored, rows, cols)
        R, C = self.padded(rows, cols)
        if self.mfma_dim == 32:
            # stored axes (r // 32, c // 8, c % 2, r % 32, (c % 8) // 2)
            lin = stored.reshape(R // 32, C // 8, 2, 32, 4).transpose(0, 3, 1, 4, 2)
        else:
            # stored axes (r // 32, c // 8, c % 4, r % 16, (c % 8) // 4, (r % 32) // 16)
            lin = stored.reshape(R // 32, C // 8, 4, 16, 2, 2).transpose(0, 5, 3, 1, 4, 2)
        return np.ascontiguousarray(lin.reshape(R, C)[:rows, :cols])

    def offset(self, r, c, rows, cols):
        C = self.padded(rows, cols)[1]
        a, cb = r // 32, c // 8
        base = (a * (C // 8) + cb) * 256
        if self.mfma_dim == 32:
            return base + ((c % 2) * 32 + r % 32) * 4 + (c % 8) // 2
        return base + (((c % 4) * 16 + r % 16) * 2 + (c % 8) // 4) * 2 + (r % 32) // 16


_BY_NAME = {"linear": Linear(), "nv_128x4": NV128x4(), "cdna4_16": CDNA4(16), "cdna4_32": CDNA4(32)}


def get_layout(name) -> ScaleLayout:
    """The layout called ``name`` (one of :data:`LAYOUTS`)."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"scale_layout={name!r} is not one of {LAYOUTS}") from None


# Function spellings of the same maps.
def swizzle_nv_128x4(s: np.ndarray) -> np.ndarray:
    """``s[rows, cols]`` -> ``[ceil(rows/128), ceil(cols/4), 32, 4, 4]`` (see :class:`NV128x4`)."""
    return _BY_NAME["nv_128x4"].swizzle(s)


def unswizzle_nv_128x4(stored: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Inverse of :func:`swizzle_nv_128x4`: the ``[rows, cols]`` scales, padding dropped."""
    return _BY_NAME["nv_128x4"].unswizzle(stored, rows, cols)


def swizzle_cdna4(s: np.ndarray, mfma_dim: int = 32) -> np.ndarray:
    """``s[rows, cols]`` -> ``[ceil(rows/32), ceil(cols/8)*8*32]`` (see :class:`CDNA4`)."""
    return CDNA4(mfma_dim).swizzle(s)


def unswizzle_cdna4(stored: np.ndarray, rows: int, cols: int, mfma_dim: int = 32) -> np.ndarray:
    """Inverse of :func:`swizzle_cdna4`: the ``[rows, cols]`` scales, padding dropped."""
    return CDNA4(mfma_dim).unswizzle(stored, rows, cols)


def scale_matrix_shape(scheme, shape, layout: str) -> tuple[int, int]:
    """``(rows, cols)`` of the 2-D scale matrix a ``layout`` is applied to, for a ``scheme``
    quantizing an input of ``shape``: the linear scales ``scheme.scale_shape(shape)`` with the
    leading axes flattened into rows. ValueError when the layout does not apply."""
    if layout == "linear":
        ss = scheme.scale_shape(tuple(shape))
        return math.prod(ss[:-1]), ss[-1]
    if not (scheme.is_mx or scheme.is_nvfp4):
        raise ValueError(
            f"scale_layout={layout!r} applies to the MX and NVFP4 schemes (e8m0 / ue4m3 block "
            f"scales), not to scheme={scheme.name!r} (granularity={scheme.granularity!r}, "
            f"scale format {scheme.scale_format!r}); use scale_layout='linear'"
        )
    if layout.startswith("cdna4") and not scheme.is_mx:
        raise ValueError(
            f"scale_layout={layout!r} is for MX schemes (e8m0 scales per 32 elements, what gfx950's "
            f"v_mfma_scale_*_f8f6f4 reads), not scheme={scheme.name!r} ({scheme.scale_format} scales "
            f"per {scheme.group_size}); use 'nv_128x4' or 'linear'"
        )
    nd = len(shape)
    if scheme.axis % nd != nd - 1:
        raise ValueError(
            f"scale_layout={layout!r} needs the scale blocks along the last axis (K), but "
            f"scheme={scheme.name!r} has axis={scheme.axis} for an input of {nd} dimensions"
        )
    ss = scheme.scale_shape(tuple(shape))
    return math.prod(ss[:-1]), ss[-1]
