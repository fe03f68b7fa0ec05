"""The twins that AMD compiles where NVIDIA runs inline PTX (``ptx.*_scalar`` for the 16-bit
pair instructions, and the stochastic-rounding helpers' twins, which the simulator runs too)
against the NumPy twins / the PTX they stand for, bit for bit (docs/amd.md).

Two forms of each twin are run: as plain Python (NumPy scalars) and compiled by Numba's CPU
jit (the typing and lowering a GPU target shares: int64 arithmetic where Python's ints are
unbounded). The bfloat16 pair operations cover every bfloat16 value
of one operand against every exponent of the other (zeros, subnormals, inf and NaN among
them) in both halves of the word; the NumPy twins are the reference that
tests/test_kernels_gpu.py::test_pair_intrinsics_match_twins checks against the instructions.
"""

from __future__ import annotations

import types as pytypes

import numba
import numpy as np
import pytest

from nqdq.gpu.device import codec as _codec
from nqdq.gpu.ptx import convert, memory, pairs, stochastic
from nqdq.gpu.runtime import target as _target
from nqdq.gpu.runtime.backend import cuda

# (the NumPy twins compute NaN and inf cases in float64, which NumPy warns about)
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:overflow encountered:RuntimeWarning")

# the twins and their helpers, compiled together by the ``cpu`` fixture
HELPERS = ("_bit_length", "_pack_rne", "_bf16_mul_half", "_bf16_add_half", "_bf16_order", "_bf16_min_half",
           "_bf16_max_half", "f32_bits_to_bf16", "f32_bits_to_f16", "bf16x2_mul_scalar", "bf16x2_add_scalar",
           "bf16x2_min_scalar", "bf16x2_max_scalar", "bf16x2_absmul_scalar", "bf16x2_absmin_scalar",
           "sign_add_twin", "sr_e2m1_code_i_twin", "mul_wide_u32_twin", "cvt_bf16x2_scalar", "cvt_f16x2_scalar")
PAIR_OPS = ("mul", "absmul", "add", "min", "max", "absmin")

SPECIAL_HALVES = [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x807F, 0x0080, 0x8080, 0x3F80, 0xBF80, 0x3F81, 0x3FFF,
                  0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0xFFFF, 0x7FFF, 0x0040, 0x3B80, 0x4000]


def _py(fn):
    """The Python function behind a twin (a device function of the simulator has py_func)."""
    return getattr(fn, "py_func", fn)


def _rebound(wrap, f32_bits):
    """The twins rebuilt from their Python source, each wrapped by ``wrap``, their calls to one
    another resolved to the rebuilt helpers (on a GPU the module's own names are device
    functions, which the host cannot call; the float32 bit cast, a local array there, by
    ``f32_bits``)."""
    twins = {**vars(convert), **vars(memory), **vars(pairs), **vars(stochastic)}
    g = dict(twins)
    for name in HELPERS:
        f = _py(twins[name])
        g[name] = wrap(pytypes.FunctionType(f.__code__, g, name, f.__defaults__))
    g["_f32_bits"] = wrap(f32_bits)
    return pytypes.SimpleNamespace(**{k: g[k] for k in HELPERS})


@pytest.fixture(scope="module")
def cpu():
    """The twins compiled by Numba's CPU jit."""
    return _rebound(numba.njit, lambda f: np.int64(np.array([f], np.float32).view(np.uint32)[0]))


@pytest.fixture(scope="module")
def py():
    """The twins as plain Python on NumPy scalars (the form the simulator runs)."""
    return _rebound(lambda f: f, lambda f: np.int64(np.float32(f).view(np.uint32)))


def _over_arrays(fn):
    @numba.njit
    def run(a, b):
        out = np.empty(a.size, np.uint32)
        for i in range(a.size):
            out[i] = fn(a[i], b[i])
        return out

    return run


def _bf16_probe(seed):
    """One bfloat16 value of every exponent field (0..255, random sign and significand) and
    the special values."""
    rng = np.random.default_rng(seed)
    e = np.arange(256)
    h = (rng.integers(0, 2, 256) << 15) | (e << 7) | rng.integers(0, 128, 256)
    return np.concatenate([h, SPECIAL_HALVES]).astype(np.uint64)


def _all_pairs_words():
    """Words (a, b) whose halves together hold every bfloat16 x against every probe y, in
    the low half and in the high half (x's neighbour in the other half of the same word)."""
    x = np.arange(65536, dtype=np.uint64)
    y = _bf16_probe(48)
    xs, ys = np.repeat(x, y.size), np.tile(y, x.size)
    lo_x, hi_x = xs[0::2], xs[1::2]
    lo_y, hi_y = ys[0::2], ys[1::2]
    a = (lo_x | (hi_x << np.uint64(16))).astype(np.uint32)
    b = (lo_y | (hi_y << np.uint64(16))).astype(np.uint32)
    return a, b


def _describe(a, b, got, want):
    bad = np.flatnonzero(got != want)
    i = bad[0]
    return f"{bad.size} words differ, first a={a[i]:#010x} b={b[i]:#010x}: got {got[i]:#010x}, want {want[i]:#010x}"


@pytest.mark.parametrize("op", PAIR_OPS)
def test_pair_twin_compiled_matches_numpy_twin_exhaustively(cpu, op):
    """Every bfloat16 x (both halves) against a value of every exponent, both orders."""
    run = _over_arrays(getattr(cpu, f"bf16x2_{op}_scalar"))
    twin = getattr(pairs, f"bf16x2_{op}_twin")
    a, b = _all_pairs_words()
    for lo in range(0, a.size, 1 << 20):
        ca, cb = a[lo:lo + (1 << 20)], b[lo:lo + (1 << 20)]
        for p, q in ((ca, cb), (cb, ca)):
            got, want = run(p, q), twin(p, q)
            assert np.array_equal(got, want), f"bf16x2_{op}: " + _describe(p, q, got, want)


@pytest.mark.parametrize("op", PAIR_OPS)
def test_pair_twin_as_python_matches_numpy_twin(py, op):
    """The plain-Python form (the simulator's) on random words and the special values."""
    scalar, twin = getattr(py, f"bf16x2_{op}_scalar"), getattr(pairs, f"bf16x2_{op}_twin")
    rng = np.random.default_rng(7)
    halves = np.concatenate([rng.integers(0, 65536, 1500), np.repeat(SPECIAL_HALVES, 4)]).astype(np.uint64)
    other = rng.permutation(halves)
    a = (halves | (rng.permutation(halves) << np.uint64(16))).astype(np.uint32)
    b = (other | (rng.permutation(other) << np.uint64(16))).astype(np.uint32)
    want = twin(a, b)
    got = np.array([scalar(x, y) for x, y in zip(a, b)], np.uint32)
    assert np.array_equal(got, want), f"bf16x2_{op}: " + _describe(a, b, got, want)


def _bf16(v):
    """bfloat16 bits of float v (exact)."""
    u = int(np.float32(v).view(np.uint32))
    assert u & 0xFFFF == 0, v
    return u >> 16


# (x, y, x + y) with the rounding worked out by hand: bfloat16 keeps 8 significant bits, so at
# 1 the step is 2^-7 and a tie is an odd multiple of 2^-8
ADD_CASES = [
    (1.0, 2.0**-8, 1.0),  # 1 + 2^-8: halfway between 1 and 1 + 2^-7; 1 is even
    (1.0 + 2.0**-7, 2.0**-8, 1.0 + 2.0**-6),  # halfway; 1 + 2^-7 is odd: up
    (1.0, 2.0**-8 + 2.0**-15, 1.0 + 2.0**-7),  # above halfway by y's last bit
    (1.0, -(2.0**-9), 1.0),  # 1 - 2^-9: halfway between 1 - 2^-8 and 1 (step 2^-8 below 1); 1 is even
    (1.0, -(2.0**-9 + 2.0**-16), 1.0 - 2.0**-8),  # just below that halfway point: down
    (1.0, -(2.0**-30), 1.0),  # d > 10: only a sticky bit, far above the halfway point
    (2.0**-126, -(2.0**-133), 2.0**-126 - 2.0**-133),  # into the subnormals, exact
    (2.0**-133, 2.0**-133, 2.0**-132),  # two smallest subnormals
    (float.fromhex("0x1.fep127"), float.fromhex("0x1p119"), np.inf),  # max + half its step 2^120: tie, odd: 2^128
    (1.5, -1.5, 0.0),  # exact cancellation: +0
]


@pytest.mark.parametrize("x, y, want", ADD_CASES)
def test_add_ties_worked_out_by_hand(cpu, py, x, y, want):
    hx, hy, hw = _bf16(x), _bf16(y), _bf16(want)
    for add in (py.bf16x2_add_scalar, cpu.bf16x2_add_scalar):
        assert int(add(hx | (hy << 16), hy | (hx << 16))) == hw | (hw << 16), (x, y)
    assert int(pairs.bf16x2_add_twin(hx, hy)) == hw


def test_add_ties_constructed_at_every_exponent(cpu):
    """x + y with y exactly half of x's step (or that plus or minus y's last bit) for every
    binade and significand of x: round-to-nearest-even at every tie."""
    run = _over_arrays(cpu.bf16x2_add_scalar)
    xs, ys = [], []
    for ex in range(1, 255):
        for m in range(128):
            x = (ex << 7) | m
            for ey in (ex - 8, ex - 9):  # y = 2^(ex - 127 - 8) (half of x's step), 2^-1 of that
                for my in (0, 1, 127):
                    if ey >= 1:
                        for sy in (0, 0x8000):
                            xs.append(x)
                            ys.append(sy | (ey << 7) | my)
    a = np.array(xs, np.uint64)
    b = np.array(ys, np.uint64)
    a32 = (a | (b << np.uint64(16))).astype(np.uint32)
    b32 = (b | (a << np.uint64(16))).astype(np.uint32)
    assert np.array_equal(run(a32, b32), pairs.bf16x2_add_twin(a32, b32))


def test_mul_ties_and_subnormal_products(cpu):
    """Every bfloat16 x times y = 1 + 2^-7 and 1.5 + 2^-7 (odd significands: among the products
    are exact ties), a subnormal y and tiny ones (products below float32's normal range, where
    a float32 product would already have been rounded once)."""
    run = _over_arrays(cpu.bf16x2_mul_scalar)
    x = np.arange(65536, dtype=np.uint64)
    for y in (0x3F81, 0x3FC1, 0x0001, 0x00FF, 0x0C00, 0x3380, 0x2000):  # 1 + 2^-7, 1.5 + 2^-7, subnormal, tiny
        b = np.full(x.size, y | (y << 16), np.uint64).astype(np.uint32)
        a = (x | (x[::-1] << np.uint64(16))).astype(np.uint32)
        assert np.array_equal(run(a, b), pairs.bf16x2_mul_twin(a, b)), hex(y)


def _f32_probe():
    rng = np.random.default_rng(11)
    hi = np.arange(65536, dtype=np.uint64) << np.uint64(16)
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint64)
    every_bf16 = (hi[:, None] | lows[None, :]).ravel()
    # float16's ties: at each float32 exponent of float16's range (subnormals included), the
    # dropped bits exactly half, half less / plus one, and random
    e = np.arange(96, 146, dtype=np.uint64)
    m10 = rng.integers(0, 1 << 23, 64).astype(np.uint64)
    tails = np.array([0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF], np.uint64)
    f16_band = ((e[:, None, None] << np.uint64(23)) | (m10[None, :, None] & np.uint64(~0x1FFF & 0x7FFFFF))
                | tails[None, None, :]).ravel()
    f16_sub_ties = (np.arange(2048) + 0.5) * 2.0**-24  # exact in float32
    out = np.concatenate([every_bf16, f16_band, f16_band | np.uint64(0x80000000),
                          np.array(f16_sub_ties, np.float32).view(np.uint32).astype(np.uint64),
                          rng.integers(0, 2**32, 1 << 18, dtype=np.uint64)])
    return out.astype(np.uint32)


@pytest.mark.parametrize("ebits, mbits, name", [(8, 7, "bf16"), (5, 10, "f16")])
def test_cvt_twins_match_rounding_of_every_probe(cpu, ebits, mbits, name):
    u = _f32_probe()
    want = convert.round_to_half_bits(u.view(np.float32).astype(np.float64), ebits, mbits).astype(np.uint32)
    conv = getattr(cpu, f"f32_bits_to_{name}")
    got = _over_arrays(numba.njit(lambda x, _: np.uint32(conv(x))))(u, u)
    assert np.array_equal(got, want), name + ": " + _describe(u, u, got, want)


def test_cvt_pair_twins_as_python(py):
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.integers(0, 2**32, 2000, dtype=np.uint64).astype(np.uint32),
                        np.array([0x7FC00000, 0xFF800001, 0x7F7FFFFF, 0x477FF000, 0x477FEFFF, 0x33000000,
                                  0x33000001, 0x80000000, 0x00000001, 0x3F808000], np.uint32)]).view(np.float32)
    for hi, lo in zip(x[0::2], x[1::2]):
        assert int(py.cvt_bf16x2_scalar(hi, lo)) == int(convert.cvt_bf16x2_twin(hi, lo)), (hi, lo)
        assert int(py.cvt_f16x2_scalar(hi, lo)) == int(convert.cvt_f16x2_twin(hi, lo)), (hi, lo)


def test_pair_store_and_conversion_in_a_simulated_kernel():
    """The scalar pair conversions and store inside a kernel: the float32 bit cast (a local
    array) and the 16-bit array's element size as a kernel sees them."""
    if not _target.SIMULATOR:  # pragma: no cover - on a GPU the intrinsics are tested elsewhere
        pytest.skip("simulator")

    @cuda.jit
    def kernel(out16, out32, x):
        i = cuda.grid(1)
        if i < x.size // 2:
            memory.st_u32_at_scalar(out16, 2 * i, convert.cvt_bf16x2_scalar(x[2 * i + 1], x[2 * i]))
            memory.st_u32_at_scalar(out32, i, convert.cvt_f16x2_scalar(x[2 * i + 1], x[2 * i]))

    x = np.array([1.0, -2.5, np.nan, 65520.0, 1e-40, -0.0, 3.0e38, 2.0**-25], np.float32)
    out16, out32 = np.zeros(8, np.uint16), np.zeros(4, np.uint32)
    kernel[1, 4](out16, out32, x)
    want16 = convert.round_to_half_bits(x.astype(np.float64), 8, 7).astype(np.uint16)
    want_h = convert.round_to_half_bits(x.astype(np.float64), 5, 10).astype(np.uint32)
    assert np.array_equal(out16, want16)
    assert np.array_equal(out32, want_h[0::2] | (want_h[1::2] << 16))


def test_simulator_bindings():
    """The simulator keeps the NumPy pair twins (whole arrays, for the CPU tests) and runs the
    stochastic-rounding and libdevice helpers' twins, the code AMD compiles."""
    if not _target.SIMULATOR:  # pragma: no cover
        pytest.skip("simulator")
    for op in PAIR_OPS:
        assert getattr(pairs, f"bf16x2_{op}") is getattr(pairs, f"bf16x2_{op}_twin")
    assert _codec.sign_add is stochastic.sign_add_twin and _codec.sr_e2m1_code_i is stochastic.sr_e2m1_code_i_twin
    assert _codec.mul_rn is _codec.mul_rn_twin and _codec.fadd_rz is _codec.fadd_rz_twin


# ----------------------------------------------------------------------------- stochastic rounding's helpers
def _sr_e2m1_code_i_spec(a, r, xb):
    """The PTX block of stochastic._E2M1_SR_PTX step by step in 32-bit registers (Python ints)."""
    m32 = 0xFFFFFFFF
    e1 = ((a >> 23) - 1) & m32
    s1 = e1 - (1 << 32) if e1 >> 31 else e1  # as s32
    c = min(s1 - 116, 10)
    e2 = max(s1 - 126, 0)
    m = (a - s1 * 8388608) & m32  # mad.lo.s32 m, e1, -2^23, a
    p = (1 << c) & m32 if 0 <= c < 32 else 0  # shl.b32: 0 for a shift of 32 or more (c as u32)
    hi = ((m * p + r) >> 32) & m32  # mad.wide.u32
    hi = min((hi + 2 * e2) & m32, 7)
    return (((xb >> 31) * 8 + hi) & m32, (c + 23) & m32)


def _sr_words(seed, n):
    rng = np.random.default_rng(seed)
    ef = np.repeat(np.arange(255, dtype=np.uint64), 8)
    a = (ef << np.uint64(23)) | rng.integers(0, 1 << 23, ef.size, dtype=np.uint64)
    a = np.concatenate([a, [0, 1, 0x7F7FFFFF, 0x3F800000, 0x40C00000, 0x3A800000]]).astype(np.uint64)
    a = np.concatenate([a, rng.integers(0, 0x7F800000, n, dtype=np.uint64)])
    r = rng.integers(0, 2**32, a.size, dtype=np.uint64)
    r[: a.size // 4] = 0xFFFFFFFF
    xb = rng.integers(0, 2**32, a.size, dtype=np.uint64)
    return a.astype(np.uint32), r.astype(np.uint32), xb.astype(np.uint32)


def test_sr_e2m1_code_i_twin_matches_the_ptx_steps(cpu, py):
    a, r, xb = _sr_words(3, 3000)
    for x, y, z in zip(a, r, xb):
        want = _sr_e2m1_code_i_spec(int(x), int(y), int(z))
        got_py = py.sr_e2m1_code_i_twin(x, y, z)
        got_jit = cpu.sr_e2m1_code_i_twin(x, y, z)
        assert (int(got_py[0]), int(got_py[1])) == want, (hex(x), hex(y), hex(z))
        assert (int(got_jit[0]), int(got_jit[1])) == want, (hex(x), hex(y), hex(z))


def test_sign_add_and_mul_wide_twins(cpu, py):
    rng = np.random.default_rng(9)
    u = rng.integers(0, 2**32, 2000, dtype=np.uint64).astype(np.uint32)
    for k, x in enumerate(u):
        bit = 1 << (k % 8)
        mag = k % bit
        want = mag + (bit if int(x) & 0x80000000 else 0)  # mul.hi.u32 s, u, 2; mad.lo.u32 mag + s * bit
        assert int(py.sign_add_twin(x, np.uint32(mag), np.uint32(bit))) == want
        assert int(cpu.sign_add_twin(x, np.uint32(mag), np.uint32(bit))) == want
        y = u[k - 1]
        assert int(py.mul_wide_u32_twin(x, y)) == int(x) * int(y)
        assert int(cpu.mul_wide_u32_twin(x, y)) == int(x) * int(y)
