"""Numba's kernel ABI as the fast launch path packs it (``launch``'s docstring states it): the
``struct`` codes of each argument type, a kernel's parameter format and offsets, and the
parameter sizes of a PTX ``.entry``, which ``launch`` checks the packer against; the Numba
type an argument key stands for and whether a key fits a compiled parameter; the layout of
an array interface's strides. Pure Python: testable without a GPU.
"""

from __future__ import annotations

import re
import struct

_INT_CODES = {(8, True): "b", (8, False): "B", (16, True): "h", (16, False): "H",
              (32, True): "i", (32, False): "I", (64, True): "q", (64, False): "Q"}  # fmt: skip


def _arg_codes(ty) -> tuple[str, str]:
    """(struct codes, kind) of one Numba argument type; kind in array/scalar/complex/half.

    Raises NotImplementedError for types the fast path does not pack."""
    from numba.core import types

    if isinstance(ty, types.Array):
        return "QQqqQ" + "q" * (2 * ty.ndim), "array"
    if isinstance(ty, types.Boolean):
        return "?", "scalar"
    if isinstance(ty, types.Integer):
        return _INT_CODES[(ty.bitwidth, ty.signed)], "scalar"
    if isinstance(ty, types.Float):
        return {16: "e", 32: "f", 64: "d"}[ty.bitwidth], "scalar"
    if isinstance(ty, types.Complex):
        return ("ff" if ty.bitwidth == 64 else "dd"), "complex"
    raise NotImplementedError(f"no fast packing for argument type {ty}")


def param_format(argtypes) -> str:
    """The ``struct`` format (native alignment) of a kernel's flattened parameters."""
    return "@" + "".join(_arg_codes(t)[0] for t in argtypes)


def _param_offsets(fmt: str) -> list[int]:
    codes = fmt[1:]
    return [struct.calcsize("@" + codes[: i + 1]) - struct.calcsize("@" + c) for i, c in enumerate(codes)]


_PTX_WIDTH = re.compile(r"\.[busf](8|16|32|64)$")
_PTX_COUNT = re.compile(r"\[(\d+)\]$")


def ptx_param_sizes(ptx: str, entry: str) -> list[int]:
    """Byte sizes of the parameters of ``.entry <entry>`` in PTX text, in order."""
    start = ptx.find(f".entry {entry}(")
    if start < 0:
        raise ValueError(f"entry {entry!r} not found in the PTX")
    body = ptx[ptx.index("(", start) + 1 : ptx.index(")", start)]
    sizes = []
    for line in body.splitlines():
        line = line.strip()
        if not line:
            continue
        tokens = line.rstrip(",").split()  # .param [.ptr .align N] .type name[count]
        widths = [int(m.group(1)) for t in tokens[1:-1] if (m := _PTX_WIDTH.match(t))]
        if tokens[0] != ".param" or len(widths) != 1:
            raise ValueError(f"cannot read PTX parameter line {line!r}")
        count = _PTX_COUNT.search(tokens[-1])
        sizes.append(widths[0] // 8 * (int(count.group(1)) if count else 1))
    return sizes


# ---------------------------------------------------------------------------------------
# Argument keys' Numba types (an array's key is (dtype.char, ndim, layout), a scalar's its type)


def _c_strides(shape, itemsize):
    strides, acc = [], itemsize
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def _cai_layout(shape, strides, itemsize) -> str:
    # as numba.cuda.typing.typeof._typeof_cuda_array_interface_cached
    if not shape or strides is None or tuple(strides) == _c_strides(shape, itemsize):
        return "C"
    if tuple(strides) == tuple(reversed(_c_strides(tuple(reversed(shape)), itemsize))):
        return "F"
    return "A"


def _numba_type(key):
    from numba.core import types
    from numba.np import numpy_support

    if isinstance(key, tuple):
        char, ndim, layout = key
        return types.Array(numpy_support.from_dtype(_np_dtype(char)), ndim, layout)
    if key is bool:
        return types.boolean
    if key is int:
        return types.int64
    if key is float:
        return types.float64
    if key is complex:
        return types.complex128
    import numpy as np

    return numpy_support.from_dtype(np.dtype(key))


def _fits(key, ty) -> bool:
    """Can an argument with this key be passed where the kernel was compiled for ``ty``?"""
    from numba.core import types

    if isinstance(ty, types.Array):
        if not isinstance(key, tuple):
            return False
        char, ndim, layout = key
        if ndim != ty.ndim or _numba_type((char, ndim, "A")).dtype != ty.dtype:
            return False
        return ty.layout == "A" or layout == ty.layout or (ndim <= 1 and layout in "CF")
    if isinstance(key, tuple):
        return False
    kt = _numba_type(key)
    if isinstance(ty, types.Boolean):
        return isinstance(kt, types.Boolean)
    if isinstance(ty, types.Integer):
        return isinstance(kt, (types.Integer, types.Boolean))
    if isinstance(ty, types.Float):
        return isinstance(kt, (types.Integer, types.Float))
    if isinstance(ty, types.Complex):
        return isinstance(kt, (types.Integer, types.Float, types.Complex))
    return False


def _np_dtype(char):
    import numpy as np

    return np.dtype(char)
