"""NVFP4 with the tensor scale given: ``nqdq.quantize(x, "nvfp4", scale=S_dec)`` (issue 46, item 1).

``scale`` is the decode scale S_dec stored as ``q.tensor_scale`` (the dynamic path's is
RN(1 / S_enc), S_enc = 2688 / amax); S_enc = min(RN(1 / S_dec), FLT_MAX) and the block scales
and codes follow the dynamic path's formulas from it (docs/numerics.md, "NVFP4"). Each test
runs on the reference and on the kernels (the CUDA simulator here, the GPU with
NQDQ_TEST_GPU=1) and compares every array bit for bit; the hand-worked cases state the bits.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import nqdq
from nqdq.reference import scales as S

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
BF16 = ml_dtypes.bfloat16


def _host(a):
    if a is None:
        return None
    return np.asarray(a.copy_to_host() if hasattr(a, "copy_to_host") else a)


def reference(x, **kw):
    return nqdq.quantize(x, "nvfp4", **kw)


def kernels(x, **kw):
    return nqdq.quantize(x, "nvfp4", device="cuda", **kw)


IMPLEMENTATIONS = [reference, kernels]


def _bits(q):
    """Every array of ``q`` and its decode, as bytes (codes packed two per byte)."""
    out = {name: _host(getattr(q, name)).tobytes() for name in ("codes", "scales", "tensor_scale")}
    out["decode"] = _host(nqdq.dequantize(q)).tobytes()
    return out


def _same(a, b, what):
    ba, bb = _bits(a), _bits(b)
    for name in ba:
        assert ba[name] == bb[name], f"{what}: {name} differ"


def _unpacked_codes(q):
    c = _host(q.codes)
    return np.stack([c & 0xF, c >> 4], axis=-1).reshape(c.shape[:-1] + (-1,))[..., : q.shape[-1]]


def _one_launch_plan(shape, dtype):
    """The kernels' plan of a given-scale call: one launch (the group kernel), nothing before it."""
    from nqdq.gpu.device import codec as _codec
    from nqdq.gpu.quantize import plan as kq
    from nqdq.schemes import resolve_scheme

    kind = {np.dtype(np.float32): _codec.KIND_F32, np.dtype(np.float16): _codec.KIND_F16,
            np.dtype(BF16): _codec.KIND_BF16}[np.dtype(dtype)]  # fmt: skip
    plan = kq.get_plan(shape, kind, resolve_scheme("nvfp4", static_scale=True), static_scale=True)
    assert len(plan.launches) == 1, [k for k, *_ in plan.launches]
    return plan


# shapes: rows of whole 16-element blocks on the 16-byte-unit group kernel (lastaxis_groups),
# and rows that are not a multiple of 16 (or of a unit) on the general group kernel
CASES = [
    ((2, 32), np.float32),  # lastaxis_groups, float32 units of 4
    ((3, 48), BF16),  # lastaxis_groups, units of 8
    ((2, 2, 16), np.float16),  # 3-D, one block a row
    ((2, 40), np.float16),  # 40 = 2.5 blocks: the last block partial (general group kernel)
    ((3, 24), np.float32),  # 1.5 blocks a row
    ((1, 7), BF16),  # one partial block, not a whole unit
]


def _data(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * F32(3)
    x.reshape(-1)[:: 5] *= F32(1e-3)  # blocks of mixed magnitudes
    return x.astype(dtype)


@pytest.mark.parametrize("shape,dtype", CASES)
@pytest.mark.parametrize("factor", [1.0, 2.0, 0.5, 1e-6, 1e6])
def test_kernels_match_reference(shape, dtype, factor):
    """Given scales around the dynamic one (factor 1), below it (blocks saturate at 448) and
    above it (blocks underflow towards code 0): kernels == reference, every bit."""
    x = _data(shape, dtype)
    s = F32(_host(reference(x).tensor_scale) * F32(factor))
    want = reference(x, scale=s)
    assert _host(want.tensor_scale) == s
    _same(kernels(x, scale=s), want, f"{shape} {np.dtype(dtype).name} scale={s}")


@pytest.mark.parametrize("shape,dtype", CASES[:3])
def test_one_pass(shape, dtype):
    """With the scale given, the kernels run the group kernel alone: no amax pass, no finalize."""
    _one_launch_plan(shape, dtype)


@pytest.mark.parametrize("s", [S.NVFP4_TENSOR_SCALE_MIN, F32(2.0**-127), F32(1e-30), F32(1e30), S.NVFP4_TENSOR_SCALE_MAX])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_extreme_scales_decode_finite(s, impl):
    """The ends of the range (2^-128: S_enc clamped to FLT_MAX; 0x1.86186p+116: the top code
    decodes to just below FLT_MAX) and scales far from the data's: codes and scales equal the
    reference's, and every finite input decodes finite."""
    x = np.array([[FLT_MAX, -1e30, 1.0, -1e-30] * 4, [3e38, 2.5, -1e-38, 0.0] * 4], F32)
    q = impl(x, scale=s)
    if impl is kernels:
        _same(q, reference(x, scale=s), f"scale={s}")
    assert np.isfinite(_host(nqdq.dequantize(q))).all()


def test_range_constants():
    """The accepted range is the dynamic path's range of tensor scales: RN(1 / FLT_MAX) at the
    bottom, the S_dec of amax = FLT_MAX at the top, which is also the largest S_dec whose top
    decode 6 * (448 * S_dec) stays finite."""
    with np.errstate(over="ignore", divide="ignore"):
        assert F32(F32(1) / FLT_MAX) == S.NVFP4_TENSOR_SCALE_MIN == F32(2.0**-128)
        assert F32(F32(1) / S.nvfp4_tensor_encode_scale(FLT_MAX)) == S.NVFP4_TENSOR_SCALE_MAX
        top = S.NVFP4_TENSOR_SCALE_MAX
        assert np.isfinite(F32(F32(6) * F32(F32(448) * top)))
        up = np.nextafter(top, F32(np.inf))
        assert not np.isfinite(F32(F32(6) * F32(F32(448) * up)))
    assert S.nvfp4_given_encode_scale(S.NVFP4_TENSOR_SCALE_MIN) == FLT_MAX  # 1 / 2^-128 overflows: clamped


def test_reciprocal_rounds_back_on_its_image():
    """RN(1 / S_enc) == S_dec for S_enc = nvfp4_given_encode_scale(S_dec) whenever S_dec =
    RN(1 / y) is a rounded reciprocal: every float32 y of the binades at both ends of the
    dynamic S_enc range (where S_dec is subnormal, and 1 / 2^-128 is clamped) and one in the
    middle. So a given S_dec that is a dynamic one gives the dynamic element multipliers."""
    m = np.arange(1 << 23, dtype=np.uint32)
    for e in (1, 127, 253, 254):
        y = (m | np.uint32(e << 23)).view(np.float32)
        with np.errstate(over="ignore", divide="ignore"):
            s_dec = (F32(1) / y).astype(F32)
            s_enc = np.minimum((F32(1) / s_dec).astype(F32), FLT_MAX)  # nvfp4_given_encode_scale, vectorized
            assert ((F32(1) / s_enc).astype(F32) == s_dec).all(), e
    for y in (F32(1.5), FLT_MAX, np.nextafter(FLT_MAX, F32(0)), F32(2.0**127)):  # the scalar function agrees
        s_dec = F32(F32(1) / y)
        assert F32(F32(1) / S.nvfp4_given_encode_scale(s_dec)) == s_dec


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("shape,dtype", [((2, 32), np.float32), ((3, 48), BF16), ((2, 40), np.float16)])
@pytest.mark.parametrize("amax", [5.0, 7.0, 10.0, 0.37109375, 1e-20])
def test_given_dynamic_scale_is_dynamic(impl, shape, dtype, amax):
    """scale = the dynamic q.tensor_scale gives the dynamic codes, scales and tensor scale
    bit for bit wherever the dynamic S_enc's reciprocal rounds back to it (asserted here for
    these amaxes; 83 % of float32 S_enc)."""
    x = _data(shape, dtype, seed=3).astype(np.float32)
    x *= F32(amax) / np.abs(x).max()
    x = x.astype(dtype)
    a = F32(np.abs(x.astype(np.float32)).max())
    s_enc = S.nvfp4_tensor_encode_scale(a)
    assert S.nvfp4_given_encode_scale(F32(F32(1) / s_enc)) == s_enc  # the case this test covers
    dyn = impl(x)
    _same(impl(x, scale=dyn.tensor_scale), dyn, f"amax {a}")
    _same(impl(x, scale=float(_host(dyn.tensor_scale))), dyn, f"amax {a}, a Python float")


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_given_dynamic_scale_neighbour(impl):
    """Hand-worked: where the dynamic S_enc does not round-trip, the given path's S_enc is its
    neighbour and a block whose scaled amax falls on an e4m3 tie can round the other way.

    amax 3: S_enc = 2688 / 3 = 896, S_dec = RN(1 / 896) = 0x1.24924ap-10, RN(1 / S_dec) =
    0x1.bffffep+9 (895.99994). Block 1's amax b = 1.125 * 2^-12 (a bfloat16 value):
    dynamic t6 = RN(896 * RN(1/6)) = 0x1.2aaaacp+7, v = RN(b * t6) = 0x1.500002p-5, above the
    e4m3 midpoint 1.3125 * 2^-5 of 1.25 and 1.375 (* 2^-5): code 0x13 (exponent field 2,
    mantissa 3); given t6 = 0x1.2aaaaap+7, v = 0x1.5p-5, the tie itself: to the even mantissa
    1.25, code 0x12. Block 0 (amax 3: v = 448.00003 / 447.99997) is 0x7E in both; the tensor
    scale is the same float32."""
    x = np.zeros((1, 32), F32)
    x[0, 0] = 3.0
    x[0, 16] = 1.125 * 2.0**-12
    dyn = impl(x)
    s_dec = _host(dyn.tensor_scale)
    assert float(s_dec).hex() == "0x1.24924a0000000p-10"
    giv = impl(x, scale=s_dec)
    assert _host(giv.tensor_scale).tobytes() == s_dec.tobytes()
    assert list(_host(dyn.scales).ravel()) == [0x7E, 0x13]
    assert list(_host(giv.scales).ravel()) == [0x7E, 0x12]
    if impl is kernels:
        _same(giv, reference(x, scale=s_dec), "neighbour")


# Hand-worked saturation and underflow at scale = fp32(1/6) = 0x1.555556p-3: S_enc = RN(1 /
# scale) = 6 exactly, t6 = RN(6 * RN(1/6)) = 1 (6 * RN(1/6) = 1 + 2^-25 rounds to 1), so a
# block's scale code is e4m3(block amax) itself.
SIXTH = F32(1.0 / 6.0)


def _block(values):
    b = np.zeros(16, F32)
    b[: len(values)] = values
    return b


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_hand_worked_saturation_and_underflow(impl):
    """Four blocks at scale = fp32(1/6) (S_enc = 6, t6 = 1):

    0. amax 1000 > 448: s_b saturates to 448 (0x7E); m_b = RN(1 / RN(448 * scale)) with
       448 * scale = 74.66667; 1000 * m_b = 13.4 saturates to 6 (code 0x7, -1000: 0xF);
       100 * m_b = 1.339 rounds to 1.5 (0x3); decode 6 * 74.66667 = 448.00003 (the block's
       top, 2688 * scale), 1.5 * 74.66667 = 112.
    1. amax 1.0: s_b = e4m3(1.0) = 0x38; m_b = RN(1 / RN(1.0 * scale)) = 6; 1.0 -> 6 (0x7),
       0.25 -> 1.5 (0x3), 0.0625 -> 0.375 -> 0.5 (0x1, 0.375 nearer 0.5).
    2. amax 2^-11: v = 2^-11 is below half the least e4m3 subnormal (2^-10): s_b = 0 (code
       0x00); m_b = fmin(1 / (0 * S_dec), FLT_MAX) = FLT_MAX (TransformerEngine's formula, as
       the dynamic path), so +-2^-11 * FLT_MAX saturates to codes 0x7 / 0xF; they decode to
       6 * 0 = +-0: a block whose scale code is 0 decodes to (signed) zeros, never NaN.
    3. amax 2^-10: the tie between 0 and 2^-9 goes to the even code 0x00: as block 2.
    """
    x = np.stack([
        _block([1000.0, -1000.0, 100.0]),
        _block([1.0, 0.25, 0.0625]),
        _block([2.0**-11, -(2.0**-11), 2.0**-13]),
        _block([2.0**-10, -(2.0**-12)]),
    ]).reshape(1, 64)  # fmt: skip
    assert S.nvfp4_given_encode_scale(SIXTH) == F32(6.0)
    q = impl(x, scale=SIXTH)
    assert list(_host(q.scales).ravel()) == [0x7E, 0x38, 0x00, 0x00]
    codes = _unpacked_codes(q).reshape(4, 16)
    assert list(codes[0, :4]) == [0x7, 0xF, 0x3, 0x0]
    assert list(codes[1, :4]) == [0x7, 0x3, 0x1, 0x0]
    assert list(codes[2, :4]) == [0x7, 0xF, 0x7, 0x0]
    assert list(codes[3, :3]) == [0x7, 0xF, 0x0]
    d = _host(nqdq.dequantize(q)).reshape(4, 16)
    top = F32(F32(448) * SIXTH)
    assert d[0, 0] == F32(F32(6) * top) and d[0, 1] == -F32(F32(6) * top) and d[0, 2] == F32(F32(1.5) * top)
    assert list(d[1, :3]) == [F32(6) * SIXTH, F32(1.5) * SIXTH, F32(0.5) * SIXTH]
    assert not d[2:].any() and not np.isnan(d).any()
    assert np.signbit(d[2, 1]) and np.signbit(d[3, 1])
    if impl is kernels:
        _same(q, reference(x, scale=SIXTH), "hand-worked")


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_block_scale_overflow_to_inf(impl):
    """scale = 2^-128 (S_enc = FLT_MAX): a block of amax 10 has v = 10 * t6 = inf; it saturates
    to 448 like any v above 448 (cvt.rn.satfinite and the reference's encoder agree), the
    elements to 6: decode 6 * (448 * 2^-128) = 6 * 7 * 2^-122."""
    x = np.zeros((1, 16), F32)
    x[0, :3] = [10.0, -10.0, 1e-37]
    q = impl(x, scale=S.NVFP4_TENSOR_SCALE_MIN)
    assert list(_host(q.scales).ravel()) == [0x7E]
    assert list(_unpacked_codes(q)[0, :3]) == [0x7, 0xF, 0x0]
    assert _host(nqdq.dequantize(q))[0, 0] == F32(6 * 7 * 2.0**-122)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_nonfinite_blocks(impl):
    """A NaN / inf block gets the NaN scale 0x7F (decodes to NaN), as in the dynamic path;
    the other blocks are unaffected by it (their scale comes from the given S_dec)."""
    x = np.zeros((1, 48), F32)
    x[0, :3] = [np.nan, 1.0, 2.0]
    x[0, 16] = np.inf
    x[0, 32:35] = [1.0, -3.0, 0.5]
    q = impl(x, scale=SIXTH)
    assert list(_host(q.scales).ravel()) == [0x7F, 0x7F, 0x44]  # e4m3(3 = 1.5 * 2^1): 8 << 3 | 4
    d = _host(nqdq.dequantize(q))
    assert np.isnan(d[0, :32]).all() and np.isfinite(d[0, 32:]).all()
    if impl is kernels:
        _same(q, reference(x, scale=SIXTH), "non-finite")


def test_scale_not_a_reciprocal_is_stored_as_given():
    """A scale that is no float32's rounded reciprocal (RN(1 / RN(1 / s)) != s) is still the
    stored tensor scale; the encode's multipliers use RN(1 / S_enc), its neighbour."""
    s = F32(0.003)
    while F32(F32(1) / S.nvfp4_given_encode_scale(s)) == s:  # the next float32 that does not round back
        s = np.nextafter(s, F32(1))
    x = _data((2, 32), np.float32, seed=5)
    want = reference(x, scale=s)
    assert _host(want.tensor_scale) == s
    _same(kernels(x, scale=s), want, "not a reciprocal")


@pytest.mark.parametrize("form", ["float", "np.float32", "0-d", "1-element", "1x1"])
def test_scale_forms(form):
    x = _data((2, 32), np.float32)
    s = F32(0.003)
    given = {"float": float(s), "np.float32": s, "0-d": np.array(s), "1-element": np.array([s]),
             "1x1": np.array([[s]])}[form]  # fmt: skip
    _same(kernels(x, scale=given), reference(x, scale=s), form)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_stochastic_rounding_with_given_scale(impl):
    x = _data((2, 32), BF16, seed=7)
    q = impl(x, scale=F32(0.002), rounding="stochastic", seed=11)
    if impl is kernels:
        _same(q, reference(x, scale=F32(0.002), rounding="stochastic", seed=11), "stochastic")


@pytest.mark.parametrize(
    "scale,error",
    [(0.0, ValueError), (-1.0, ValueError), (np.nan, ValueError), (np.inf, ValueError), (-np.inf, ValueError),
     (np.ones(2, F32), ValueError), (np.ones((2, 1), F32), ValueError), (np.ones(0, F32), ValueError),
     (1e-39, ValueError), (float(np.nextafter(S.NVFP4_TENSOR_SCALE_MAX, F32(np.inf))), ValueError),
     ("0.1", TypeError), (np.array([1 + 1j]), TypeError)],
)  # fmt: skip
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_bad_scale_names_scale(impl, scale, error):
    with pytest.raises(error, match=r"\bscale\b"):
        impl(np.ones((2, 32), F32), scale=scale)


def test_scale_on_another_gpu():
    """A scale on another GPU than x's is refused, naming scale (checked through DLPack's
    device; stand-ins here, as the simulator has one device)."""
    from nqdq.api import _nvfp4_tensor_scale

    class OnGPU:
        def __init__(self, dev, value=0.5):
            self.dev, self.value = dev, np.float32(value)

        def __dlpack_device__(self):
            return (2, self.dev)

        def get(self):
            return np.array(self.value)

        __cuda_array_interface__ = {}

    with pytest.raises(ValueError, match=r"\bscale\b.*GPU 1.*GPU 0"):
        _nvfp4_tensor_scale(OnGPU(1), OnGPU(0))
    assert _nvfp4_tensor_scale(OnGPU(0), OnGPU(0)) == F32(0.5)
    assert _nvfp4_tensor_scale(OnGPU(1), np.ones(3, F32)) == F32(0.5)  # host x: the scale read to the host


def test_scheme_accepts_static_scale():
    from nqdq.schemes import Scheme, resolve_scheme

    sch = resolve_scheme("nvfp4", static_scale=True)
    assert sch.static_scale and sch.tensor_scale and sch.is_nvfp4
    assert Scheme.from_dict(sch.to_dict()) == sch
    with pytest.raises(ValueError, match=r"scale="):
        resolve_scheme("mxfp4", static_scale=True)


def test_save_load_round_trip(tmp_path):
    x = _data((2, 32), np.float32)
    q = reference(x, scale=F32(0.004))
    path = tmp_path / "q.npz"
    q.save(path)
    q2 = nqdq.load(path)
    assert q2.scheme == q.scheme and math.isclose(float(_host(q2.tensor_scale)), 0.004, rel_tol=1e-7)
    _same(q2, q, "save / load")
