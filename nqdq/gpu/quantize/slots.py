"""The arrays of a quantize plan while it is built and when it runs: slots (the arrays a plan
allocates, by role), markers (the input and the seed's halves, filled in per call), the
recorder that stands in for the allocator and the launcher while the rules build a plan,
and the output slots of a scheme; host-side copies the plan's execution needs."""

from __future__ import annotations

import math

import numpy as np

from ...reference.packing import packed_length
from ...schemes import Scheme
from ..device.scales import MODE_ASYM, MODE_CENTRED, MODE_MX, MODE_NVFP4
from ..runtime.interop import is_cupy


class Slot:
    """An array of a quantize plan: ``n`` items of ``dtype``; ``role`` is "out" (returned),
    "scratch" (written by one launch, read by a later one), "zero" (scratch that must be
    zero when the first launch starts: the column ring's workspace), "reset" (the same,
    and the kernel leaves it zero when it ends: a ``grid`` workspace, which the CuPy
    runner takes from ``grid.StreamWorkspaces`` outside graph capture) or "dummy" (a
    placeholder for an output the scheme does not have: never written, never read)."""

    __slots__ = ("i", "n", "dtype", "role")

    def __init__(self, i, n, dtype, role):
        self.i, self.n, self.dtype, self.role = i, int(n), np.dtype(dtype), role


class Marker:
    """A launch argument filled in per call (the input array, the seed's halves, the
    caller's amax array)."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"<{self.name}>"


X = Marker("x")  # the input array (flat)
AMAX = Marker("amax_out")  # the caller's float32[1] for the input's amax (the amax by-product)
SEED_LO = Marker("seed_lo")
SEED_HI = Marker("seed_hi")


class Recorder:
    """Stands in for an :class:`Allocator` and the launcher while a plan is built: it
    records allocations (as slots) and launches (with slots and markers as arguments)."""

    def __init__(self):
        self.slots = []
        self.launches = []
        self.zero_amax = False  # the launches combine into AMAX by atomics: zero it first

    def empty(self, n, dtype, role="scratch"):
        s = Slot(len(self.slots), n, dtype, role)
        self.slots.append(s)
        return s

    def launch(self, kernel, grid, block, *args):
        args = tuple(int(a) if isinstance(a, np.integer) else a for a in args)
        self.launches.append((kernel, grid, block, args))


class Outputs:
    """Output slots of one quantize plan, and the dummies kernels need for the rest."""

    def __init__(self, rec: Recorder, sch: Scheme, mode, shape, packed):
        n = math.prod(shape)
        C = shape[-1]
        self.rows = n // C
        sub = packed and sch.code_bits < 8
        self.pcols = packed_length(C, sch.code_bits) if sub else C
        self.sshape = sch.scale_shape(shape)
        ns = math.prod(self.sshape)
        self.codes = rec.empty(self.rows * self.pcols, np.uint8, "out")
        self.scales = rec.empty(ns, np.uint8 if mode in (MODE_MX, MODE_NVFP4) else np.float32, "out")
        self.zps = rec.empty(ns, np.uint8, "out") if mode == MODE_ASYM else None
        self.means = rec.empty(ns, np.float32, "out") if mode == MODE_CENTRED else None
        self.tscale = rec.empty(1, np.float32, "out") if mode == MODE_NVFP4 else None
        # S_enc: written by the NVFP4 finalize kernel, read by the group kernel; unused otherwise
        self.sparams = rec.empty(1, np.float32, "scratch" if mode == MODE_NVFP4 else "dummy")
        self.dummy_u8 = rec.empty(1, np.uint8, "dummy")
        self.dummy_f32 = rec.empty(1, np.float32, "dummy")

    def args(self):
        return (
            self.codes,
            self.scales,
            self.zps if self.zps is not None else self.dummy_u8,
            self.means if self.means is not None else self.dummy_f32,
        )


def fill_bytes(a, value):
    """Fill every byte of ``a`` (NumPy / CuPy / Numba) with ``value`` (test poisoning)."""
    if isinstance(a, np.ndarray):
        a.view(np.uint8)[...] = value
    elif is_cupy(a):
        a.view("uint8").fill(value)
    else:
        a.view(np.uint8).copy_to_device(np.full(a.nbytes, value, np.uint8))


def zero_word(a):
    """Zero the one 32-bit word of ``a`` in launch order: NumPy in place (the simulator);
    a GPU array by ``cuMemsetD32Async`` on the stream the plan's kernels launch on (a
    memset node under graph capture)."""
    if isinstance(a, np.ndarray):
        a.reshape(-1)[:1] = 0
        return
    from ..runtime.interop import device_address
    from ..runtime.launch import _stream_handle
    from ..runtime.launch_ex import memset32

    memset32(device_address(a), 0, 1, _stream_handle(None))


def split_seed(seed):
    """The 64-bit seed as the (low, high) 32-bit words the stochastic kernels take."""
    if seed is None:
        return 0, 0
    s = int(seed) & 0xFFFFFFFFFFFFFFFF
    return s & 0xFFFFFFFF, s >> 32


def host(a):
    """``a`` (NumPy / CuPy / Numba device array, or array-like) as a NumPy array."""
    if a is None or isinstance(a, np.ndarray):
        return a
    if hasattr(a, "get"):
        return a.get()
    if hasattr(a, "copy_to_host"):
        return a.copy_to_host()
    return np.asarray(a)


def copy_into(dst, host_src):
    """Copy the NumPy array ``host_src`` into ``dst`` (NumPy / CuPy / Numba device array)."""
    if isinstance(dst, np.ndarray):
        dst[...] = host_src
    elif is_cupy(dst):
        dst.set(host_src)
    else:
        dst.copy_to_device(host_src)
