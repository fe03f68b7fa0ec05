"""The quantized tensor object, and saving / loading it (.npz and .safetensors)."""

from __future__ import annotations

import functools
import json
import math
import os
import struct
import tempfile
import zipfile
import zlib
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from . import _arrays
from .formats import FloatFormat, IntFormat
from .reference.packing import packed_length, unpack_codes
from .schemes import Scheme, bits_per_value

__all__ = ["QuantizedTensor", "load", "FORMAT_VERSION", "ArraySpec", "expected_arrays"]

# Bump when the meaning of a stored field changes; readers refuse newer versions.
FORMAT_VERSION = 1
ARRAY_FIELDS = ("codes", "scales", "zero_points", "tensor_scale", "means")  # a QuantizedTensor's arrays
_META_KEY = "__nqdq__"
_DTYPES = ("float32", "float16", "bfloat16")  # QuantizedTensor.dtype: the input's dtype
_U8, _I8, _F32 = np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.float32)
_MAX_NDIM = 32
_MAX_META_BYTES = 1 << 20  # the metadata member of an .npz (a few hundred bytes when nqdq writes it)
_MAX_NPY_HEADER = 65536 + 12  # an .npy member's magic, header length and header (format 1.0's limit)
_MAX_DEFLATE_RATIO = 1032  # deflate expands at most ~1032:1: a member claiming more is corrupt


def _to_numpy(a):
    if a is None or isinstance(a, np.ndarray):
        return a
    if hasattr(a, "get"):  # CuPy
        return a.get()
    return np.asarray(a)


def _array_nbytes(a) -> int:
    """Bytes of an array of any library: size x item size (PyTorch: element_size())."""
    size = math.prod(int(d) for d in a.shape)
    itemsize = a.element_size() if hasattr(a, "element_size") else np.dtype(a.dtype).itemsize
    return size * int(itemsize)


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
        GPU scales (CuPy, Numba) through ``nqdq.gpu.layouts`` and stay on the GPU."""
        from dataclasses import replace

        self.check_arrays()

        from .reference import layouts as reference_layouts

        target = reference_layouts.get_layout(scale_layout).name
        if target == self.scale_layout:
            return replace(self)
        rows, cols = reference_layouts.scale_matrix_shape(self.scheme, self.shape,
                                                          target if target != "linear" else self.scale_layout)
        s = self.scales
        if isinstance(s, np.ndarray):
            if self.scale_layout == "linear":
                lin = s.reshape(rows, cols)
            else:
                lin = reference_layouts.get_layout(self.scale_layout).unswizzle(s, rows, cols)
            if target == "linear":
                out = lin.reshape(self.scheme.scale_shape(tuple(self.shape)))
            else:
                out = reference_layouts.get_layout(target).swizzle(np.ascontiguousarray(lin))
        else:
            shape = self.scheme.scale_shape(tuple(self.shape)) if target == "linear" else None
            out = _relayout_on_gpu(s, self.scale_layout, target, rows, cols, shape)
        return replace(self, scales=out, scale_layout=target)

    @property
    def bits_per_value(self) -> float:
        return bits_per_value(self.scheme, tuple(self.shape))

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays, from their shapes and item sizes (GPU arrays stay where they are)."""
        return sum(_array_nbytes(getattr(self, k)) for k in ARRAY_FIELDS if getattr(self, k) is not None)

    def __repr__(self) -> str:
        return (
            f"QuantizedTensor(scheme={self.scheme.name!r}, fmt={self.scheme.fmt!r}, "
            f"granularity={self.scheme.granularity!r}, shape={tuple(self.shape)}, dtype={self.dtype!r}, "
            f"scale_layout={self.scale_layout!r}, bits_per_value={self.bits_per_value:.3f})"
        )


    # ------------------------------------------------------------------ checks
    def check_arrays(self, name: str = "q", *, file: str | None = None, values: bool = False) -> None:
        """Raise ValueError unless every array has exactly the shape and dtype that the
        scheme, shape and scale layout imply (:func:`expected_arrays`), and is present
        exactly when the scheme has it. Errors name the array: ``q.scales`` (``name``), or
        ``scales`` of ``file``.

        Reads only ``.shape`` and ``.dtype``, so GPU arrays (CuPy, Numba, anything with
        both) are never copied; on the host it also checks NVFP4's tensor scale (one value:
        finite and positive) and, with ``values=True``, the zero points' range (one pass
        over them, for :func:`load`). Every launch on a QuantizedTensor's arrays
        (``dequantize``, ``with_layout``, ``matmul``) calls this first: the kernels index
        with the implied shapes, so an array that is shorter would be read out of bounds."""
        prefix = f"{file}: " if file is not None else f"{name}: "
        shape = self.shape if type(self.shape) is tuple else tuple(self.shape)
        from .reference.layouts import LAYOUTS

        if file is None and not (isinstance(self.scale_layout, str) and self.scale_layout in LAYOUTS):
            raise ValueError(f"{name}.scale_layout={self.scale_layout!r} is not one of {LAYOUTS}")
        try:
            specs = _specs(self.scheme, shape, self.scale_layout, tuple(map(type, shape)))
        except TypeError:  # unhashable: not a Scheme, a list inside one, ...
            raise ValueError(f"{prefix}scheme={self.scheme!r} / shape={self.shape!r} are not a Scheme and a shape") from None
        except ValueError as exc:
            raise ValueError(f"{prefix}{exc}") from None
        if self.dtype not in _DTYPES:
            raise ValueError(f"{prefix}dtype={self.dtype!r} is not one of {_DTYPES}")
        for k, spec in specs:
            a = getattr(self, k)
            if spec is None:
                if a is not None:
                    raise ValueError(f"{_label(k, name, file)} is set, but scheme {self.scheme.name!r} has no {k}")
                continue
            if a is None:
                raise ValueError(f"{_label(k, name, file)} is missing; {_needs(self, spec)}")
            try:
                ashape, adtype = a.shape, a.dtype
            except AttributeError:
                raise ValueError(f"{_label(k, name, file)} must be an array, got {type(a).__name__}") from None
            if ashape != spec.shape and tuple(ashape) not in (spec.shape, spec.alt_shape):
                raise ValueError(f"{_label(k, name, file)} has shape {tuple(ashape)}, but {_needs(self, spec)}")
            if not _same_dtype(adtype, spec.dtype):
                raise ValueError(f"{_label(k, name, file)} has dtype {adtype}, but {_needs(self, spec)}")
        ts = self.tensor_scale
        if isinstance(ts, (np.ndarray, np.generic)) and not 0 < float(ts) < np.inf:
            raise ValueError(f"{_label('tensor_scale', name, file)} is {float(ts)}; it must be finite and positive")
        zp = self.zero_points
        if values and isinstance(zp, np.ndarray) and zp.size:
            qmax = self.scheme.element.qrange(False)[1]
            if int(zp.max()) > qmax:
                raise ValueError(f"{_label('zero_points', name, file)} holds {int(zp.max())} > {qmax}, "
                                 f"the largest {self.scheme.fmt} code")  # fmt: skip

    # ------------------------------------------------------------------ io
    def _metadata(self) -> dict:
        return {
            "format_version": self.format_version,
            "scheme": self.scheme.to_dict(),
            "shape": list(self.shape),
            "dtype": self.dtype,
            "scale_layout": self.scale_layout,
            "arrays": [k for k in ARRAY_FIELDS if getattr(self, k) is not None],
        }

    def save(self, path) -> None:
        """Write to ``path``: ``.safetensors`` uses the safetensors NumPy API, anything
        else is a NumPy ``.npz`` (no pickles either way). Atomic: the file is written under
        a temporary name in the same directory and renamed over ``path`` when complete, so
        a save that fails leaves ``path`` as it was. The arrays are written as they are
        (:func:`load` checks them)."""
        path = os.fspath(path)
        arrays = {k: np.ascontiguousarray(_to_numpy(getattr(self, k))) for k in ARRAY_FIELDS if getattr(self, k) is not None}
        meta = json.dumps(self._metadata())
        if path.endswith(".safetensors"):
            from safetensors.numpy import save_file

            _write_atomic(path, lambda tmp: save_file(arrays, tmp, metadata={_META_KEY: meta}))
        else:

            def write(tmp):
                with open(tmp, "wb") as fh:  # a file object: np.savez would add .npz to a name
                    np.savez(fh, **arrays, **{_META_KEY: np.array(meta)})

            _write_atomic(path, write)


# ----------------------------------------------------------------------------- what a q holds
class ArraySpec(NamedTuple):
    """The shape and dtype one array of a QuantizedTensor must have."""

    shape: tuple
    dtype: np.dtype
    what: str  # for errors: "packed e2m1 codes", "e8m0 scales in scale_layout='nv_128x4'", ...
    alt_shape: tuple | None = None  # also accepted: (1,) for the tensor scale, as files hold it


def expected_arrays(scheme: Scheme, shape: tuple, scale_layout: str = "linear") -> dict:
    """``{array name: ArraySpec or None (absent)}`` for a QuantizedTensor of ``scheme``,
    input ``shape`` and ``scale_layout``; ValueError if these do not go together (the
    checks of ``quantize``: ``Scheme.check_shape``, the layout's scheme)."""
    shape = tuple(shape)
    return dict(_specs(scheme, shape, scale_layout, tuple(map(type, shape))))


@functools.lru_cache(maxsize=1024)
def _specs(scheme, shape, scale_layout, types) -> tuple:
    """expected_arrays as ``((name, spec), ...)``, remembered: check_arrays runs on every
    dequantize / matmul call (``types`` keeps ``(4.0,)`` and ``(True,)`` apart from ``(4,)``
    and ``(1,)`` in the cache)."""
    from .reference import layouts as reference_layouts

    if not isinstance(scheme, Scheme):
        raise ValueError(f"scheme must be a nqdq Scheme, got {type(scheme).__name__}")
    Scheme.from_dict(scheme.to_dict())  # a hand-built Scheme passes what a file's must
    if len(shape) > _MAX_NDIM or not all(t is int or (issubclass(t, np.integer)) for t in types):
        raise ValueError(f"shape={shape!r} is not a tuple of at most {_MAX_NDIM} ints")
    if any(d < 0 for d in shape):
        raise ValueError(f"shape={shape!r} has a negative length")
    shape = tuple(int(d) for d in shape)
    scheme.check_shape(shape)
    if scale_layout not in reference_layouts.LAYOUTS:
        raise ValueError(f"scale_layout={scale_layout!r} is not one of {reference_layouts.LAYOUTS}")
    elem, sshape = scheme.element, scheme.scale_shape(shape)
    sub = scheme.code_bits < 8
    int8_codes = isinstance(elem, IntFormat) and scheme.symmetric and not sub
    codes_shape = shape[:-1] + (packed_length(shape[-1], scheme.code_bits),) if sub else shape
    codes = ArraySpec(codes_shape, _I8 if int8_codes else _U8, f"{'packed ' if sub else ''}{elem.name} codes")
    block = scheme.is_mx or scheme.is_nvfp4
    sdt, sname = (_U8, scheme.scale_format) if block else (_F32, "float32")
    if scale_layout == "linear":
        scales = ArraySpec(sshape, sdt, f"{sname} scales")
    else:
        rows, cols = reference_layouts.scale_matrix_shape(scheme, shape, scale_layout)
        scales = ArraySpec(reference_layouts.get_layout(scale_layout).swizzled_shape(rows, cols), sdt,
                           f"{sname} scales in scale_layout={scale_layout!r}")  # fmt: skip
    return (
        ("codes", codes),
        ("scales", scales),
        ("zero_points", None if scheme.symmetric else ArraySpec(sshape, _U8, "uint8 zero points")),
        ("tensor_scale", ArraySpec((), _F32, "float32 tensor scale", (1,)) if scheme.tensor_scale else None),
        ("means", ArraySpec(sshape, _F32, "float32 means") if scheme.centred else None),
    )


def _relayout_on_gpu(scales, source, target, rows, cols, linear_shape):
    """with_layout's GPU move of ``scales`` from layout ``source`` to ``target`` (a ``[rows,
    cols]`` scale matrix; ``linear_shape`` where the target is "linear"), by
    ``nqdq.gpu.layouts`` on the GPU of the scales, in their library and on its stream
    (PyTorch's current stream for a tensor: ``_callers.in_caller_library``)."""
    global _relayout
    if _relayout is None:
        _relayout = _make_relayout()
    return _relayout(scales, source, target, rows, cols, linear_shape)


_relayout = None  # _make_relayout(), made at the first GPU with_layout (it imports the kernels)


def _make_relayout():
    from .gpu.runtime import callers as _callers
    from .gpu import layouts as kernel_layouts

    @_arrays.on_gpu_of("s")
    @_callers.in_caller_library("s")
    def relayout(s, source, target, rows, cols, linear_shape):
        lin = s.reshape(rows, cols) if source == "linear" else kernel_layouts.unswizzle(s, source, rows, cols)
        return lin.reshape(linear_shape) if target == "linear" else kernel_layouts.swizzle(lin, target)

    return relayout


def _label(k, name, file):
    return f"{file}: array {k}" if file is not None else f"{name}.{k}"


def _needs(q, spec) -> str:
    return _spec_text(q.scheme, tuple(q.shape), spec)


def _spec_text(scheme, shape, spec) -> str:
    return f"the {spec.what} array for scheme {scheme.name!r} on shape {shape} is {spec.shape} {spec.dtype}"


def _same_dtype(a, want) -> bool:
    try:
        if a == want:
            return True
    except TypeError:
        pass
    return str(a).rpartition(".")[2] == want.name  # a dtype NumPy does not know: torch.uint8, ...


# ----------------------------------------------------------------------------- saving
def _write_atomic(path: str, write) -> None:
    """``write(tmp)`` to a temporary file beside ``path``, then rename it over ``path``
    (``os.replace``: atomic on POSIX and Windows); on any error the temporary is removed."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        try:
            mode = os.stat(path).st_mode & 0o777  # keep an existing file's permissions
        except OSError:
            mode = 0o666 & ~_umask()  # mkstemp creates 0600; a new file gets open()'s mode
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


@functools.lru_cache(maxsize=1)
def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# ----------------------------------------------------------------------------- loading
class _FileError(ValueError):
    """A refusal with its message complete (the file named), passed through as it is."""


def load(path) -> QuantizedTensor:
    """Read a :class:`QuantizedTensor` written by :meth:`QuantizedTensor.save`.

    The file is untrusted input. The metadata is checked first, through the checks
    ``quantize`` makes (``Scheme.from_dict``, ``Scheme.check_shape``, the scale layout);
    it implies the exact shape and dtype of every array (:func:`expected_arrays`), and each
    member's size (from the zip directory, or the safetensors header) and header are
    compared with that before it is read, so nothing is allocated that the data does not
    back. Only the members the metadata names are read. Any fault is a ValueError naming
    the file and, where it is about one, the array."""
    path = os.fspath(path)
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic.startswith(b"PK"):  # zip: .npz
        try:
            with zipfile.ZipFile(path) as zf:
                meta, specs = _parse_meta(_npz_meta(zf, path), path)
                arrays = {k: _npz_array(zf, k, spec, path, meta) for k, spec in specs if spec is not None}
        except _FileError:
            raise
        except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError, ValueError, KeyError,
                NotImplementedError, RuntimeError, struct.error) as exc:  # fmt: skip
            raise ValueError(f"{path}: not a readable .npz file ({type(exc).__name__}: {exc})") from exc
    else:
        from safetensors import safe_open

        try:
            with safe_open(path, framework="numpy") as f:
                header = f.metadata() or {}
                if _META_KEY not in header:
                    raise _FileError(f"{path}: a safetensors file without nqdq metadata")
                meta, specs = _parse_meta(_json(header[_META_KEY], path), path)
                arrays = {k: _safetensors_array(f, k, spec, path, meta) for k, spec in specs if spec is not None}
        except _FileError:
            raise
        except Exception as exc:  # safetensors raises its own error types
            raise ValueError(f"{path}: neither an .npz nor a .safetensors file ({exc})") from exc
    q = QuantizedTensor(**meta, **arrays)
    q.check_arrays(file=path, values=True)
    return q


def _json(text, path):
    try:
        return json.loads(text)
    except (ValueError, TypeError) as exc:
        raise _FileError(f"{path}: the nqdq metadata is not JSON ({exc})") from None


def _parse_meta(meta, path) -> tuple[dict, tuple]:
    """The QuantizedTensor fields of the metadata and its arrays' specs, or _FileError."""
    if not isinstance(meta, dict):
        raise _FileError(f"{path}: the nqdq metadata is not a JSON object")
    version = meta.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _FileError(f"{path}: no nqdq format version in the file; it was not written by nqdq")
    if version > FORMAT_VERSION:
        raise _FileError(
            f"{path}: written by a newer nqdq (format version {version}); this nqdq reads "
            f"format versions up to {FORMAT_VERSION}. Upgrade nqdq to read it."
        )
    try:
        scheme = Scheme.from_dict(meta.get("scheme"))
    except ValueError as exc:
        raise _FileError(f"{path}: scheme metadata: {exc}") from None
    shape, dtype, layout = meta.get("shape"), meta.get("dtype"), meta.get("scale_layout", "linear")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise _FileError(f"{path}: shape={shape!r} in the metadata is not a list of ints")
    if dtype not in _DTYPES:
        raise _FileError(f"{path}: dtype={dtype!r} in the metadata is not one of {_DTYPES}")
    if not isinstance(layout, str):
        raise _FileError(f"{path}: scale_layout={layout!r} in the metadata is not a string")
    shape = tuple(shape)
    try:
        specs = _specs(scheme, shape, layout, (int,) * len(shape))
    except ValueError as exc:
        raise _FileError(f"{path}: {exc}") from None
    listed = meta.get("arrays", [k for k, spec in specs if spec is not None])
    if not isinstance(listed, list) or not all(isinstance(k, str) for k in listed):
        raise _FileError(f"{path}: arrays={listed!r} in the metadata is not a list of names")
    for k, spec in specs:
        if (spec is not None) != (k in listed):
            raise _FileError(
                f"{path}: array {k} is {'not ' if spec is not None else ''}listed in the metadata, but scheme "
                f"{scheme.name!r} {'has' if spec is not None else 'has no'} {k}"
            )
    unknown = sorted(set(listed) - set(ARRAY_FIELDS))
    if unknown:
        raise _FileError(f"{path}: arrays {unknown} in the metadata are not QuantizedTensor arrays")
    fields = dict(scheme=scheme, shape=shape, dtype=dtype, scale_layout=layout, format_version=version)
    return fields, specs


def _file_needs(meta, spec) -> str:
    return _spec_text(meta["scheme"], meta["shape"], spec)


def _npz_meta(zf, path):
    info = _member(zf, _META_KEY)
    if info is None:
        raise _FileError(f"{path}: not an nqdq file (no {_META_KEY} entry)")
    if info.file_size > _MAX_META_BYTES:
        raise _FileError(f"{path}: the nqdq metadata is {info.file_size} bytes (at most {_MAX_META_BYTES})")
    with zf.open(info) as fh:
        text = np.lib.format.read_array(fh, allow_pickle=False)
    if text.dtype.kind != "U" or text.shape != ():
        raise _FileError(f"{path}: the nqdq metadata is not a string")
    return _json(str(text), path)


def _member(zf, name):
    try:
        return zf.getinfo(name + ".npy")
    except KeyError:
        return None


def _npz_array(zf, k, spec, path, meta) -> np.ndarray:
    """Member ``k``, read only after its size in the zip directory and its .npy header
    agree with ``spec``."""
    info = _member(zf, k)
    if info is None:
        raise _FileError(f"{path}: array {k} is listed in the metadata but missing")
    nbytes = math.prod(spec.shape) * spec.dtype.itemsize
    if not nbytes <= info.file_size <= nbytes + _MAX_NPY_HEADER:
        raise _FileError(f"{path}: array {k} is a member of {info.file_size} bytes, but {_file_needs(meta, spec)}")
    if info.compress_type != zipfile.ZIP_STORED and info.file_size > _MAX_DEFLATE_RATIO * info.compress_size + 1024:
        raise _FileError(f"{path}: array {k} claims {info.file_size} bytes from {info.compress_size} compressed")
    with zf.open(info) as fh:
        version = np.lib.format.read_magic(fh)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in read_header:
            raise _FileError(f"{path}: array {k} has .npy format version {version} (nqdq reads 1.0 and 2.0)")
        shape, fortran, dtype = read_header[version](fh)
        if shape not in (spec.shape, spec.alt_shape) or dtype != spec.dtype:
            raise _FileError(f"{path}: array {k} has shape {shape} and dtype {dtype}, but {_file_needs(meta, spec)}")
        buf = bytearray(nbytes)
        view, got = memoryview(buf), 0
        while got < nbytes:
            n = fh.readinto(view[got:])
            if not n:
                raise _FileError(f"{path}: array {k} is truncated ({got} of {nbytes} bytes)")
            got += n
        if fh.read(1):  # reading to the end also checks the member's CRC
            raise _FileError(f"{path}: array {k} has bytes after its data")
    a = np.frombuffer(buf, dtype).reshape(shape, order="F" if fortran else "C")
    return np.ascontiguousarray(a).reshape(spec.shape)  # a (1,) tensor scale as ()


_SAFETENSORS_DTYPES = {"U8": _U8, "I8": _I8, "F32": _F32}


def _safetensors_array(f, k, spec, path, meta) -> np.ndarray:
    """Tensor ``k``, read only after its header entry agrees with ``spec`` (safetensors has
    checked that the header's offsets lie within the file)."""
    if k not in f.keys():
        raise _FileError(f"{path}: array {k} is listed in the metadata but missing")
    sl = f.get_slice(k)
    shape, dtype = tuple(sl.get_shape()), sl.get_dtype()
    if shape not in (spec.shape, spec.alt_shape) or _SAFETENSORS_DTYPES.get(dtype) != spec.dtype:
        raise _FileError(f"{path}: array {k} has shape {shape} and dtype {dtype}, but {_file_needs(meta, spec)}")
    return f.get_tensor(k).reshape(spec.shape)  # a (1,) tensor scale as ()
