"""Stand-ins for nqdq.gpu.runtime.launch's tests without a GPU: a CuPy array, a compiled
launch entry, and the driver launch (recorded, the parameter bytes read back as the driver
would read them)."""

from __future__ import annotations

import ctypes
import struct

import numpy as np

from nqdq.gpu.runtime import launch
from nqdq.gpu.runtime.launch import param_format


class FakeCupyArray:
    """Stands in for cupy.ndarray: the attributes the specialised launcher reads."""

    def __init__(self, shape, dtype, ptr, order="C"):
        dt = np.dtype(dtype)
        self.shape, self.dtype, self.ndim, self.itemsize = tuple(shape), dt, len(shape), dt.itemsize
        self.size = int(np.prod(shape))
        strides = launch._c_strides(self.shape, dt.itemsize)
        self.strides = strides if order == "C" else tuple(reversed(launch._c_strides(self.shape[::-1], dt.itemsize)))
        self._c_contiguous = order == "C" or self.ndim <= 1
        self._f_contiguous = order == "F" or self.ndim <= 1
        self.data = type("MemoryPointer", (), {"ptr": ptr})()


def fake_entry(argtypes, handle, name):
    """A launch entry (launch._Entry) of ``argtypes`` with a made-up function ``handle``: its
    packer and parameter layout, no compiled kernel."""
    entry = launch._Entry.__new__(launch._Entry)
    entry.argtypes, entry.handle, entry.name = tuple(argtypes), handle, name
    entry.struct = struct.Struct(param_format(argtypes))
    entry.offsets = launch._param_offsets(entry.struct.format)
    entry.pack = launch._make_packer(argtypes, tuple(f"a{i}" for i in range(len(argtypes))), entry.struct.pack_into)
    entry._tls, entry._fast = launch.threading.local(), {}
    return entry


def record_launches(monkeypatch, entries):
    """Replace the driver launch by a recorder: the returned list gets, per launch,
    ((handle, grid, block, shared memory, stream), the parameter bytes the launch passed),
    the bytes read through the void*[] as the driver would, for an entry of ``entries``."""
    launched = []

    def fake_launch(handle, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        entry = next(e for e in entries if e.handle == handle)
        assert params and not extra  # a void*[]: one pointer per parameter, at the entry's offsets
        ptrs = (ctypes.c_void_p * len(entry.offsets)).from_address(params)
        assert [p - ptrs[0] for p in ptrs] == [o - entry.offsets[0] for o in entry.offsets]
        data = ctypes.string_at(ptrs[0] - entry.offsets[0], entry.struct.size)
        launched.append(((handle, gx, gy, gz, bx, by, bz, smem, stream), data))

    monkeypatch.setattr(launch, "_cupy_launch", fake_launch)
    monkeypatch.setattr(launch, "_cupy_ndarray", FakeCupyArray)
    return launched
