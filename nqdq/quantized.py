"""The quantized tensor object, and saving / loading it (.npz and .safetensors)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from . import _arrays
from .formats import FloatFormat
from .reference.packing import unpack_codes
from .schemes import Scheme, bits_per_value

__all__ = ["QuantizedTensor", "load", "FORMAT_VERSION"]

# Bump when the meaning of a stored field changes; readers refuse newer versions.
FORMAT_VERSION = 1
_ARRAYS = ("codes", "scales", "zero_points", "tensor_scale", "means")
_META_KEY = "__nqdq__"


def _to_numpy(a):
    if a is None or isinstance(a, np.ndarray):
        return a
    if hasattr(a, "get"):  # CuPy
        return a.get()
    return np.asarray(a)


@dataclass
class QuantizedTensor:
    """Codes plus everything needed to decode them.

    ``codes``: uint8 (int8 for symmetric integers); 4-bit and 6-bit codes are packed along
    the last axis (see ``nqdq.reference.packing``), so ``codes.shape[-1]`` is the packed
    length. ``scales``: float32, or uint8 e8m0 / ue4m3 codes, one per scale group
    (``scheme.scale_shape(shape)`` in the linear layout). ``zero_points``: asymmetric
    integer schemes. ``tensor_scale``: NVFP4's float32 per-tensor decode scale.
    ``means``: the centred INT8 scheme's float32 group means.
    """

    codes: object
    scales: object
    scheme: Scheme
    shape: tuple
    dtype: str  # the input's dtype name: "float32" | "float16" | "bfloat16"
    scale_layout: str = "linear"
    zero_points: object = None
    tensor_scale: object = None
    means: object = None
    format_version: int = FORMAT_VERSION
    meta: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ views
    @property
    def packed(self) -> bool:
        return self.scheme.code_bits < 8

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def unpacked_codes(self) -> np.ndarray:
        """One code per byte, input shape (NumPy). For float formats this can be viewed as
        the matching ml_dtypes type, e.g. ``q.unpacked_codes().view(ml_dtypes.float4_e2m1fn)``."""
        codes = _to_numpy(self.codes)
        if not self.packed:
            return codes
        elem = self.scheme.element
        signed = not isinstance(elem, FloatFormat) and self.scheme.symmetric
        return unpack_codes(codes, elem.bits, self.shape[-1], signed=signed)

    @_arrays.on_gpu_of("self.scales")
    def with_layout(self, scale_layout: str) -> "QuantizedTensor":
        """A new QuantizedTensor whose scales are stored in ``scale_layout`` (one of
        ``nqdq.reference.layouts.LAYOUTS``); the other arrays are shared, not copied.

        Non-linear layouts hold the MX / NVFP4 scales as a 2-D ``[rows, cols]`` matrix
        (leading input axes flattened into rows) swizzled for a tensor-core GEMM:
        ``"nv_128x4"`` -> ``[R/128, C/4, 32, 4, 4]``, ``"cdna4_16"`` / ``"cdna4_32"`` ->
        ``[R/32, C*32]`` (zero padding; see ``nqdq.reference.layouts``). ``"linear"`` gives
        back ``scheme.scale_shape(shape)``. NumPy scales go through the NumPy reference,
        GPU scales (CuPy, Numba) through ``nqdq.kernels.layouts`` and stay on the GPU."""
        from dataclasses import replace

        from .reference import layouts as L

        target = L.get_layout(scale_layout).name
        if target == self.scale_layout:
            return replace(self)
        rows, cols = L.scale_matrix_shape(self.scheme, self.shape, target if target != "linear" else self.scale_layout)
        s = self.scales
        on_host = isinstance(s, np.ndarray)
        if not on_host:
            from .kernels import layouts as K
        if self.scale_layout == "linear":
            lin = s.reshape(rows, cols)
        elif on_host:
            lin = L.get_layout(self.scale_layout).unswizzle(s, rows, cols)
        else:
            lin = K.unswizzle(s, self.scale_layout, rows, cols)
        if target == "linear":
            out = lin.reshape(self.scheme.scale_shape(tuple(self.shape)))
        else:
            out = L.get_layout(target).swizzle(np.ascontiguousarray(lin)) if on_host else K.swizzle(lin, target)
        return replace(self, scales=out, scale_layout=target)

    @property
    def bits_per_value(self) -> float:
        return bits_per_value(self.scheme, tuple(self.shape))

    @property
    def nbytes(self) -> int:
        return sum(int(_to_numpy(getattr(self, k)).nbytes) for k in _ARRAYS if getattr(self, k) is not None)

    def __repr__(self) -> str:
        return (
            f"QuantizedTensor(scheme={self.scheme.name!r}, fmt={self.scheme.fmt!r}, "
            f"granularity={self.scheme.granularity!r}, shape={tuple(self.shape)}, dtype={self.dtype!r}, "
            f"scale_layout={self.scale_layout!r}, bits_per_value={self.bits_per_value:.3f})"
        )

    # ------------------------------------------------------------------ io
    def _metadata(self) -> dict:
        return {
            "format_version": self.format_version,
            "scheme": self.scheme.to_dict(),
            "shape": list(self.shape),
            "dtype": self.dtype,
            "scale_layout": self.scale_layout,
            "arrays": [k for k in _ARRAYS if getattr(self, k) is not None],
        }

    def save(self, path) -> None:
        """Write to ``path``: ``.safetensors`` uses the safetensors NumPy API, anything
        else is a NumPy ``.npz`` (no pickles either way)."""
        path = os.fspath(path)
        arrays = {k: np.ascontiguousarray(_to_numpy(getattr(self, k))) for k in _ARRAYS if getattr(self, k) is not None}
        meta = json.dumps(self._metadata())
        if path.endswith(".safetensors"):
            from safetensors.numpy import save_file

            save_file(arrays, path, metadata={_META_KEY: meta})
        else:
            with open(path, "wb") as fh:  # keep the caller's file name (np.savez would add .npz)
                np.savez(fh, **arrays, **{_META_KEY: np.array(meta)})


def _from_parts(meta: dict, arrays: dict, path: str) -> QuantizedTensor:
    version = meta.get("format_version")
    if not isinstance(version, int):
        raise ValueError(f"{path}: no nqdq format version in the file; it was not written by nqdq")
    if version > FORMAT_VERSION:
        raise ValueError(
            f"{path}: written by a newer nqdq (format version {version}); this nqdq reads "
            f"format versions up to {FORMAT_VERSION}. Upgrade nqdq to read it."
        )
    missing = [k for k in meta.get("arrays", []) if k not in arrays]
    if missing:
        raise ValueError(f"{path}: arrays {missing} are listed in the metadata but missing")
    scheme, layout = Scheme.from_dict(meta["scheme"]), meta.get("scale_layout", "linear")
    _check_scale_layout(path, scheme, tuple(meta["shape"]), layout, arrays["scales"])
    return QuantizedTensor(
        codes=arrays["codes"],
        scales=arrays["scales"],
        scheme=scheme,
        shape=tuple(meta["shape"]),
        dtype=meta["dtype"],
        scale_layout=layout,
        zero_points=arrays.get("zero_points"),
        tensor_scale=arrays.get("tensor_scale"),
        means=arrays.get("means"),
        format_version=version,
    )


def _check_scale_layout(path, scheme, shape, layout, scales) -> None:
    """The stored layout is one nqdq knows, and swizzled scales have its padded shape."""
    from .reference import layouts as L

    if layout not in L.LAYOUTS:
        raise ValueError(f"{path}: scale_layout={layout!r} is not one of {L.LAYOUTS}")
    if layout == "linear":
        return
    rows, cols = L.scale_matrix_shape(scheme, shape, layout)
    want = L.get_layout(layout).swizzled_shape(rows, cols)
    if tuple(scales.shape) != want:
        raise ValueError(
            f"{path}: scales have shape {tuple(scales.shape)}, but scale_layout={layout!r} of "
            f"{scheme.name} scales [{rows}, {cols}] (input shape {shape}) is {want}"
        )


def load(path) -> QuantizedTensor:
    """Read a :class:`QuantizedTensor` written by :meth:`QuantizedTensor.save`."""
    path = os.fspath(path)
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic.startswith(b"PK"):  # zip: .npz
        with np.load(path, allow_pickle=False) as z:
            if _META_KEY not in z.files:
                raise ValueError(f"{path}: not an nqdq file (no {_META_KEY} entry)")
            meta = json.loads(str(z[_META_KEY]))
            arrays = {k: z[k] for k in z.files if k != _META_KEY}
    else:
        from safetensors import safe_open

        try:
            with safe_open(path, framework="numpy") as f:
                header = f.metadata() or {}
                arrays = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as exc:  # safetensors raises its own error types
            raise ValueError(f"{path}: neither an .npz nor a .safetensors file ({exc})") from exc
        if _META_KEY not in header:
            raise ValueError(f"{path}: a safetensors file without nqdq metadata")
        meta = json.loads(header[_META_KEY])
    if "tensor_scale" in arrays:
        arrays["tensor_scale"] = np.asarray(arrays["tensor_scale"], np.float32).reshape(())
    return _from_parts(meta, arrays, path)
