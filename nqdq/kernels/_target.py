"""Which target the kernels are built for, and the decorator for device functions.

``SIMULATOR`` is read from Numba's config once, at import: with NUMBA_ENABLE_CUDASIM=1 the
kernels run as Python in Numba's CUDA simulator (on NumPy arrays), otherwise they are
compiled by NVVM. The few target-specific helpers (libdevice's ``fmul_rn``) pick their
portable twin from this flag.
"""

from __future__ import annotations

from numba import config
from ._gpu import cuda

SIMULATOR = bool(config.ENABLE_CUDASIM)

if SIMULATOR:
    devfn = cuda.jit(device=True)
else:
    # forceinline: every device function is inlined into its kernel, so the compile-time
    # constants the kernel factories pass in fold the per-scheme branches away.
    devfn = cuda.jit(device=True, forceinline=True)


def device_cc():
    """The current GPU's compute capability (major, minor), or None without a driver or device."""
    try:
        return tuple(cuda.get_current_device().compute_capability)
    except Exception:  # pragma: no cover - no driver
        return None


def device_has(cc) -> bool:
    """Whether kernels that need compute capability ``cc`` (major, minor) or newer may be
    planned: the current GPU's, always under the simulator (which runs their twins), and
    with no GPU (compile-only tools such as the PTX audit target the newest paths)."""
    if SIMULATOR or not cuda.is_available():
        return True
    have = device_cc()
    return have is not None and have >= cc
