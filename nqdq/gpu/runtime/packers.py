"""The launch path's host code, generated per kernel signature: ``make_packer`` (all of a
kernel's flattened parameters by one ``struct.pack_into`` call) and ``make_fast_launch`` (a
key's argument checks, the packing and the driver call in one function).

Why generated source and not a closure: the per-call cost is the point (``launch``'s docstring:
a whole launch in about 7 us of host time, the driver call about 4). A closure over the
argument list would loop over the arguments on every call, branching on each one's kind and
building the flattened values, where the generated function is one straight line of
attribute reads and one ``pack_into`` call with every field named, its checks ``type(a) is
T`` tests inlined. The argument list's length and kinds are known only per signature, so the
line is written as text and compiled by ``exec``, once per signature. ``sequence
.compile_sequence`` generates its launch function for the same reason.
"""

from __future__ import annotations

from .abi import _arg_codes


def make_packer(argtypes, argnames, pack_into, array_fields):
    """``pack(buf, args)``: one ``pack_into`` call over every flattened parameter (an array's by
    ``array_fields``)."""
    parts = []
    for i, ty in enumerate(argtypes):
        _, kind = _arg_codes(ty)
        if kind == "array":
            parts.append(f"*_array_fields(a[{i}])")
        elif kind == "complex":
            parts.append(f"a[{i}].real, a[{i}].imag")
        else:
            parts.append(f"a[{i}]")
    src = f"def pack(buf, a):\n    _pack_into(buf, 0, {', '.join(parts)})\n" if parts else "def pack(buf, a):\n    pass\n"
    ns = {"_pack_into": pack_into, "_array_fields": array_fields}
    exec(compile(src, f"<nqdq.launch packer {len(argtypes)} args>", "exec"), ns)
    return ns["pack"]


def make_fast_launch(key, entry, cupy_ndarray, cupy_launch, cu_launch, raise_error):
    """A launcher specialised to one argument key and entry, for repeated calls with CuPy
    arrays: it checks that ``args`` still have this key (CuPy type, ndim, dtype, layout;
    scalar types) with inline attribute tests, packs, and launches, all in one function;
    returns False, having done nothing, when they do not (the caller takes the general
    path). None when the key has non-CuPy arrays or CuPy is not loaded. The launch's state, as
    ``launch`` holds it now: CuPy's array type and launch (None where CuPy is not loaded), the
    driver's launch and the error raiser."""
    if cupy_ndarray is None:
        return None
    n = len(key)
    guards, values, ns = [], [], {}
    for i, (k, ty) in enumerate(zip(key, entry.argtypes)):
        a = f"a{i}"
        _, kind = _arg_codes(ty)
        if isinstance(k, tuple):
            char, ndim, layout = k
            guards += [f"type({a}) is _ND", f"{a}.ndim == {ndim}", f"{a}.dtype.char == {char!r}"]
            if layout == "C":
                guards.append(f"{a}._c_contiguous")
            elif layout == "F":
                guards.append(f"not {a}._c_contiguous and {a}._f_contiguous")
            else:  # the key says neither; an entry compiled for "A" takes any layout
                guards.append(f"not {a}._c_contiguous and not {a}._f_contiguous")
            values.append(f"0, 0, {a}.size, {a}.itemsize, {a}.data.ptr, *{a}.shape, *{a}.strides")
        else:
            ns[f"_T{i}"] = k
            guards.append(f"type({a}) is _T{i}")
            values.append(f"{a}.real, {a}.imag" if kind == "complex" else a)
    lines = ["def fast_launch(args, gx, gy, gz, bx, by, bz, smem, stream):",
             f"    if len(args) != {n}:",
             "        return False"]  # fmt: skip
    if n:
        lines.append(f"    {', '.join(f'a{i}' for i in range(n))}, = args")
        lines += [f"    if not ({' and '.join(guards)}):", "        return False"]
    lines += ["    try:", "        b = _tls.b", "    except AttributeError:", "        b = _tls.b = _new_buffer()"]
    if values:
        lines.append(f"    _pack_into(b[0], 0, {', '.join(values)})")
    if cupy_launch is not None:  # CuPy's raises CUDADriverError itself
        lines.append("    _launch(_H, gx, gy, gz, bx, by, bz, smem, stream, b[2], 0)")
    else:
        lines += ["    err = _launch(_H, gx, gy, gz, bx, by, bz, smem, stream, b[2], 0)[0]",
                  "    if err:", "        _raise(err, _NAME)"]  # fmt: skip
    lines.append("    return True")
    src = "\n".join(lines) + "\n"
    ns.update(_ND=cupy_ndarray, _tls=entry._tls, _new_buffer=entry.new_buffer, _pack_into=entry.struct.pack_into,
              _H=entry.handle, _launch=cupy_launch or cu_launch, _raise=raise_error,
              _NAME=entry.name)  # fmt: skip
    exec(compile(src, f"<nqdq.launch fast path {entry.name[:40]}>", "exec"), ns)
    return ns["fast_launch"]
