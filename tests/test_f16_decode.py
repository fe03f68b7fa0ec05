"""float16 input decode, bit for bit: every float16 bit pattern through each device entry
point that widens it (``half_bits`` on the low and on the high half of an input word, the
other half holding the complement; ``f16_bits_to_f32_bits``; ``load_f32``) against NumPy's
float16 -> float32 cast, compared as uint32 (NaN payloads included: NumPy keeps them,
shifted up by 13 bits); then the kernels that read float16 units, on small arrays holding
every class of float16 value, against the reference.

In CI the device functions run in Numba's CUDA simulator, as the plain Python they are (one
source for CUDA, the simulator and numba-hip: no twin); with NQDQ_TEST_GPU=1 the same
kernels run compiled on a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda
from helpers.kernels import assert_same, check

import nqdq.gpu.quantize.plan as kq
from nqdq.gpu.device import codec as _codec
from nqdq.gpu.device.codec import KIND_F16
from nqdq.gpu.quantize.units import half_bits
from nqdq.schemes import resolve_scheme

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN/inf arithmetic in the simulator

ENTRY_POINTS = ["half_bits low", "half_bits high", "f16_bits_to_f32_bits", "load_f32"]


@cuda.jit
def _widen_every_way(h, out, loaded):
    """out[k, i]: float16 h[i] widened by ENTRY_POINTS[k] (k < 3), as float32 bits; loaded[i]:
    by load_f32, as float32."""
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, h.size, step):
        v = np.uint32(h[i])
        other = np.uint32(~v & np.uint32(0xFFFF))  # the half that must be ignored
        out[0, i] = half_bits(np.uint32(v | (other << np.uint32(16))), 0, KIND_F16)
        out[1, i] = half_bits(np.uint32((v << np.uint32(16)) | other), 1, KIND_F16)
        out[2, i] = np.uint32(_codec.f16_bits_to_f32_bits(np.int64(h[i])))
        loaded[i] = _codec.load_f32(h, i, KIND_F16)


def _fields(h) -> str:
    """A float16 pattern's sign / exponent / mantissa, for a mismatch report."""
    h = int(h)
    return f"{h:#06x} (s={h >> 15} e={(h >> 10) & 0x1F:#x} m={h & 0x3FF:#x})"


@pytest.fixture(scope="module")
def widened():
    h = np.arange(1 << 16, dtype=np.uint16)
    out = np.zeros((len(ENTRY_POINTS), h.size), np.uint32)
    loaded = np.zeros(h.size, np.float32)
    _widen_every_way[16, 64](h, out, loaded)
    out[3] = loaded.view(np.uint32)
    return h, out


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_float16_pattern(widened, entry):
    h, out = widened
    want = h.view(np.float16).astype(np.float32).view(np.uint32)
    got = out[ENTRY_POINTS.index(entry)]
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (f"{entry}: {bad.size} of 65536 float16 patterns differ; first {_fields(h[bad[0]])}: "
                           f"got {int(got[bad[0]]):#010x}, want {int(want[bad[0]]):#010x}")


def f16_edge_rows(cols=64, seed=0):
    """Rows of float16 bits, one class of input each: subnormals only (with signed zeros),
    finite values over the whole exponent range (with +-65504 and the smallest subnormal),
    the subnormal / normal border, finite with +inf, finite with a NaN carrying a payload,
    finite with -inf and a negative NaN."""
    rng = np.random.default_rng(seed)
    sign = rng.integers(0, 2, (6, cols), dtype=np.uint16) << 15
    man = rng.integers(0, 1 << 10, (6, cols), dtype=np.uint16)
    exp = rng.integers(0, 31, (6, cols), dtype=np.uint16) << 10
    h = sign | exp | man
    h[0] = sign[0] | man[0]
    h[0, :4] = [0x0000, 0x8000, 0x0001, 0x83FF]
    h[1, :4] = [0x7BFF, 0xFBFF, 0x0001, 0x8001]
    h[2] = sign[2] | np.where(np.arange(cols) % 2 == 0, 0x0000, 0x0400) | (man[2] & 0x3FF)
    h[2, :2] = [0x03FF, 0x0400]
    h[3, 5] = 0x7C00
    h[4, 7] = 0x7D23
    h[5, 3], h[5, 9] = 0xFC00, 0xFE01
    return h.view(np.float16)


@pytest.mark.parametrize("name", ["fp8_row", "nvfp4", "mxfp4", "fp8_1x128", "int8_asym", "int8_column"])
def test_kernels_on_float16_classes(name):
    """Last-axis rows (fp8_row), groups (nvfp4 with its tensor amax, mxfp4, fp8_1x128),
    asymmetric rows (int8_asym) and per-column scales (int8_column) on float16 input."""
    x = f16_edge_rows()
    check(x, resolve_scheme(name), x_ref=x.astype(np.float32))


def test_rows_without_specials_match_float32_input():
    """The same finite float16 data as float16 and as float32 input: identical codes and scales."""
    x = f16_edge_rows()[:3]
    sch = resolve_scheme("fp8_row")
    a = kq.quantize(x, sch)
    b = kq.quantize(x.astype(np.float32), sch)
    assert_same(a.codes, b.codes, "codes")
    assert_same(a.scales, b.scales, "scales")
