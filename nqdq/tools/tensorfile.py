"""Reading tensors from ``.npy``, ``.npz`` and ``.safetensors`` files, one at a time.

Each tensor comes as a :class:`TensorSource` whose ``load()`` reads it on demand, so a large
checkpoint is never held in memory whole. safetensors files are read through the
safetensors package's NumPy API (``safe_open``), which gives bfloat16 as
``ml_dtypes.bfloat16``; a dtype NumPy cannot hold (FP8 tensors, say) loads as None.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np

__all__ = ["TensorFileError", "TensorSource", "open_tensors", "SUFFIXES"]

SUFFIXES = (".npy", ".npz", ".safetensors")


class TensorFileError(ValueError):
    """A bad input (missing file, unknown scheme or tensor...). ``argname`` is the
    command-line argument it is about."""

    def __init__(self, argname: str, message: str):
        super().__init__(f"argument {argname}: {message}")
        self.argname = argname


@dataclass
class TensorSource:
    """A named tensor in a file. ``dtype``: the file's name for it (``"BF16"``...), or ""
    when only loading tells; ``load()`` returns the array, or None for a dtype NumPy cannot
    hold."""

    name: str
    dtype: str
    load: object  # () -> np.ndarray | None


def _safetensors_sources(path: str) -> list[TensorSource]:
    from safetensors import safe_open

    try:
        with safe_open(path, framework="numpy") as f:
            entries = [(k, f.get_slice(k).get_dtype()) for k in f.keys()]
    except Exception as exc:  # safetensors raises its own (Rust) error type
        raise TensorFileError("FILE", f"{path} is not a readable safetensors file ({exc})") from None

    def loader(name):
        def load():
            try:
                with safe_open(path, framework="numpy") as f:
                    try:
                        return f.get_tensor(name)
                    except (AttributeError, TypeError):  # a dtype NumPy has no type for
                        return None
            except Exception as exc:  # the file changed or is damaged (safetensors' own error type)
                raise TensorFileError("FILE", f"tensor {name!r} of {path} cannot be read ({exc})") from None

        return load

    return [TensorSource(name, dtype, loader(name)) for name, dtype in entries]


# What a damaged zip raises: zipfile's own errors, a truncated or corrupt deflate stream, a
# short read, a compression method Python lacks, an encrypted member.
_ZIP_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error,
               NotImplementedError, RuntimeError)  # fmt: skip


def _npz_sources(path: str) -> list[TensorSource]:
    try:
        with np.load(path, allow_pickle=False) as z:
            names = list(z.files)
    except _ZIP_ERRORS as exc:
        raise TensorFileError("FILE", f"{path} is not a readable .npz file ({exc})") from None

    def loader(name):
        def load():
            try:
                with np.load(path, allow_pickle=False) as z:
                    try:
                        return z[name]
                    except ValueError as exc:
                        if "allow_pickle" in str(exc):  # an object array: not a tensor
                            return None
                        raise
            except _ZIP_ERRORS as exc:
                raise TensorFileError("FILE", f"tensor {name!r} of {path} cannot be read ({exc})") from None

        return load

    return [TensorSource(name, "", loader(name)) for name in names]


def open_tensors(path) -> list[TensorSource]:
    """The tensors of a ``.npy`` (one, named after the file), ``.npz`` or ``.safetensors``."""
    path = os.fspath(path)
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in SUFFIXES:
        raise TensorFileError(
            "FILE", f"unsupported file extension {suffix or '(none)'!r} of {path}; expected one of {', '.join(SUFFIXES)}"
        )
    if not os.path.exists(path):
        raise TensorFileError("FILE", f"no such file: {path}")
    if os.path.isdir(path):
        raise TensorFileError("FILE", f"{path} is a directory, not a tensor file")
    if suffix == ".safetensors":
        return _safetensors_sources(path)
    if suffix == ".npz":
        return _npz_sources(path)
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise TensorFileError("FILE", f"{path} is not a readable .npy file ({exc})") from None
    name = os.path.splitext(os.path.basename(path))[0]
    return [TensorSource(name, str(arr.dtype), lambda: np.array(arr))]
