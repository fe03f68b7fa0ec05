"""What the GPU benchmarks share: CuPy or a skip, and fresh random bf16 inputs."""


def cupy_or_skip():
    """The ``cupy`` module when CuPy and a CUDA GPU are present; else NotImplementedError,
    which asv reports as a skipped benchmark."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise NotImplementedError("no CUDA GPU")
        return cupy
    except NotImplementedError:
        raise
    except Exception as e:  # not installed, no driver, no device
        raise NotImplementedError(f"needs CuPy and a CUDA GPU ({type(e).__name__})") from None


def bf16_bits(cp, shape, seed=0):
    """Random bf16 (normal; 2-D inputs get per-row magnitudes 2^U(-4, 4)) as uint16 bits,
    never zeros."""
    rng = cp.random.default_rng(seed)
    f = rng.standard_normal(shape, dtype=cp.float32)
    if len(shape) == 2:
        f *= cp.exp2(rng.uniform(-4, 4, (shape[0], 1), dtype=cp.float32))
    return (f.view(cp.uint32) >> 16).astype(cp.uint16)
