"""Which target the kernels are built for, and the decorator for device functions.

``SIMULATOR`` is read from Numba's config once, at import: with NUMBA_ENABLE_CUDASIM=1 the
kernels run as Python in Numba's CUDA simulator (on NumPy arrays), otherwise they are
compiled: by NVVM (numba-cuda), or by numba-hip's AMDGPU back end when ``_gpu.HIP``.
``PTX``: whether the kernels may use inline PTX and libdevice (compiled for NVIDIA); where
it is False every intrinsic of ``ptx`` and every inline-PTX / libdevice helper of ``device.codec``
is its portable twin (``device_twin``).
"""

from __future__ import annotations

from numba import config

from .backend import HIP, cuda

SIMULATOR = bool(config.ENABLE_CUDASIM)
PTX = not SIMULATOR and not HIP

if SIMULATOR or HIP:  # (numba-hip's jit takes no forceinline)
    devfn = cuda.jit(device=True)
else:
    # forceinline: every device function is inlined into its kernel, so the compile-time
    # constants the kernel factories pass in fold the per-scheme branches away.
    devfn = cuda.jit(device=True, forceinline=True)


def device_twin(fn):
    """A portable twin as the kernels call it where ``PTX`` is False: the Python function
    itself under the simulator, the same function compiled as a device function elsewhere
    (AMD; on NVIDIA a twin defined beside its intrinsic is compiled only if a kernel calls it,
    which none does there). Twins use integer and float32 arithmetic only."""
    return fn if SIMULATOR else devfn(fn)


def device_cc():
    """The current GPU's compute capability (major, minor), or None without a driver or device
    (or on AMD, where no NVIDIA compute capability applies)."""
    if HIP:
        return None
    try:
        return tuple(cuda.get_current_device().compute_capability)
    except Exception:  # pragma: no cover - no driver
        return None


def device_has(cc) -> bool:
    """Whether kernels that need compute capability ``cc`` (major, minor) or newer may be
    planned: the current GPU's, always under the simulator (which runs their twins), and
    with no GPU (compile-only tools such as the PTX audit target the newest paths). Never on
    AMD: every gate names an NVIDIA feature (sm_89 cvt, sm_90 clusters, cooperative launch)."""
    if HIP:
        return False
    if SIMULATOR or not cuda.is_available():
        return True
    have = device_cc()
    return have is not None and have >= cc
