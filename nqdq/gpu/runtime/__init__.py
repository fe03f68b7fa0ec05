"""What every kernel call stands on: the GPU API in use (``backend``: numba-cuda or
numba-hip), the compile target (``target``: simulator, PTX, HIP), the caller's devices and
streams (``devices``), array interop without importing the caller's library (``interop``),
kernel launches with little host work (``launch``) and the per-library hot paths
(``callers``)."""
