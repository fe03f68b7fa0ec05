"""cuLaunchKernelEx's launch configuration (cuda.h, CUDA 12+), built by ctypes: a grid and a
block with the attributes nqdq's kernels launch with (programmatic stream serialization, a
cluster dimension, the cooperative attribute). ``launch`` and ``sequence`` launch with it.
Also ``memset32``: the one other driver call made in stream order (words a kernel combines
into by atomics, static scale words), by ctypes as well.
"""

from __future__ import annotations

import ctypes

# cuLaunchKernelEx (cuda.h, CUDA 12+): a launch with attributes, here one: programmatic stream
# serialization (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6, value: int 1), which
# lets the grid start while the kernel before it in the stream still runs (programmatic
# dependent launch, sm_90+: the kernels' griddepcontrol instructions, ptx.griddep_*).
_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6


# ... and a cluster dimension (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4, value: unsigned x, y, z)
_ATTR_CLUSTER_DIMENSION = 4
# ... and a cooperative launch (CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2, value: int 1): every block
# of the grid resident at once, or CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
_ATTR_COOPERATIVE = 2


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: id, pad to 8, a 64-byte union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


def _dim3(d) -> tuple[int, int, int]:
    if type(d) is int:
        return d, 1, 1
    d = tuple(int(v) for v in d)
    if not 1 <= len(d) <= 3:
        raise ValueError(f"a grid or block must have 1 to 3 dimensions, got {d}")
    return d + (1,) * (3 - len(d))


def _ex_config(grid, block, smem=0, *, pdl=False, cluster=1, coop=False):
    """(config, attributes): a CUlaunchConfig of ``grid`` x ``block`` (``smem`` bytes of
    dynamic shared memory) with the programmatic serialization attribute (``pdl``), a
    cluster dimension (``cluster`` > 1 blocks along x) and the cooperative attribute
    (``coop``); its stream is set per call. Keep both alive together."""
    attrs = (_LaunchAttribute * 3)()
    n = 0
    if pdl:
        attrs[n].id, attrs[n].value[0] = _ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, 1
        n += 1
    if cluster > 1:
        attrs[n].id = _ATTR_CLUSTER_DIMENSION
        attrs[n].value[0], attrs[n].value[1], attrs[n].value[2] = cluster, 1, 1
        n += 1
    if coop:
        attrs[n].id, attrs[n].value[0] = _ATTR_COOPERATIVE, 1
        n += 1
    gx, gy, gz = _dim3(grid)
    bx, by, bz = _dim3(block)
    cfg = _LaunchConfig(gx, gy, gz, bx, by, bz, smem, None, attrs, n)
    return cfg, attrs


_cu_memset32 = None  # libcuda's cuMemsetD32Async, loaded at the first fill


def memset32(address: int, word: int, count: int, stream: int):
    """``count`` 32-bit words ``word`` at ``address``, in ``stream``'s order (a memset node
    under graph capture; no host copy)."""
    global _cu_memset32
    f = _cu_memset32
    if f is None:
        import ctypes

        f = ctypes.CDLL("libcuda.so.1").cuMemsetD32Async  # (CUdeviceptr, unsigned int, size_t, CUstream)
        f.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]
        f.restype = ctypes.c_int
        _cu_memset32 = f
    err = f(address, word, count, stream)
    if err:
        raise RuntimeError(f"cuMemsetD32Async failed: CUresult {err}")
