"""The one place the kernels get their GPU API from: ``from ._gpu import cuda``.

``cuda`` is ``numba.cuda`` on NVIDIA (numba-cuda; the same object, so nothing changes
there) and numba-hip's module on AMD, which "poses as" ``numba.cuda``
(``numba.hip.pose_as_cuda()``: ``numba.cuda`` and every ``numba.cuda.*`` module name then
resolve to ``numba.hip``, so the kernels' ``numba.cuda.extending`` imports follow too).

The backend is ``NQDQ_GPU_BACKEND`` (``cuda`` or ``hip``), read once at import; unset, it
is ``hip`` when numba-hip already poses as ``numba.cuda`` in this process and ``cuda``
otherwise. numba-hip and numba-cuda cannot share an environment (both install
``cuda.bindings`` modules), so ``hip`` means an environment built for it:
``pip install nqdq[hip]`` (docs/amd.md).

Which intrinsics run on which backend: ``runtime.target.PTX`` (inline PTX allowed) and the
twins of ``ptx``.
"""

from __future__ import annotations

import os
import sys

BACKENDS = ("cuda", "hip")


def _posed_as_cuda() -> bool:
    """Whether numba-hip has already replaced ``numba.cuda`` in this process."""
    numba, hip = sys.modules.get("numba"), sys.modules.get("numba.hip")
    return hip is not None and getattr(numba, "cuda", None) is hip


def _backend() -> str:
    name = os.environ.get("NQDQ_GPU_BACKEND", "").strip().lower()
    if not name:
        return "hip" if _posed_as_cuda() else "cuda"
    if name not in BACKENDS:
        raise ValueError(f"NQDQ_GPU_BACKEND={name!r}: expected one of {BACKENDS}")
    return name


GPU_BACKEND = _backend()
HIP = GPU_BACKEND == "hip"

if HIP:  # pragma: no cover - needs numba-hip (an environment of its own)
    from numba import hip as cuda

    if not _posed_as_cuda():
        cuda.pose_as_cuda()
else:
    from numba import cuda

__all__ = ["BACKENDS", "GPU_BACKEND", "HIP", "cuda"]
