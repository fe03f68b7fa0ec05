"""The MX fp6 pair encoders and NVFP4's two-launch plan compiled, on a GPU (``pytest -m gpu``
with NQDQ_TEST_GPU=1), bit for bit with the NumPy reference: what tests/test_mx_encoders.py
checks through the twins in the simulator."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

from helpers.gpu import gpu_cupy_or_skip  # noqa: E402

cp = gpu_cupy_or_skip()

import nqdq.gpu.quantize.plan as kq
from nqdq.gpu.quantize.choices import KernelChoices, PerTensor  # noqa: E402
from nqdq.gpu.quantize import pair_encoders  # noqa: E402
from nqdq.schemes import resolve_scheme  # noqa: E402

from helpers.data import edge_data  # noqa: E402
from helpers.encoders import FP6, FP6_KS, bf16_finite_units  # noqa: E402
from helpers.gpu import check_gpu  # noqa: E402


@pytest.mark.parametrize("name", ["e2m3", "e3m2"])
def test_fp6_pairs_every_bf16_gpu(name):
    """fp6_unit_bf16 compiled, every finite bfloat16 x at 2^-k over the MX range, with and
    without the clamp, against the reference codec on x * 2^-k."""
    from numba import cuda

    from nqdq.formats import get_format
    from nqdq.reference import codec as rcodec

    f6 = pair_encoders.fp6_pair_consts.py_func(FP6[name])

    def make(clamp):
        @cuda.jit
        def enc(w, p2, lo, hi):
            i = cuda.grid(1)
            if i < lo.size:
                a, b = pair_encoders.fp6_unit_bf16((w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]), p2, f6,
                                                   clamp)
                lo[i] = a
                hi[i] = b

        return enc

    pats, words = bf16_finite_units()
    words = words.reshape(-1)
    x = (pats << 16).view(np.float32)
    wd = cp.asarray(words)
    lo = cp.zeros(words.size // 4, cp.uint32)
    hi = cp.zeros(words.size // 4, cp.uint32)
    fmt = get_format(name)
    for clamp in (True, False):
        enc = make(clamp)
        for k in FP6_KS:
            p = np.float32(2.0**-k)
            with np.errstate(over="ignore"):
                y = x * p
            want = rcodec.encode_float(y, fmt).astype(np.uint32)
            hb = int(p.view(np.uint32) >> 16)
            enc[(lo.size + 127) // 128, 128](wd, np.uint32(hb | (hb << 16)), lo, hi)
            lh, hh = lo.get(), hi.get()
            got = np.stack([(lh >> np.uint32(6 * j)) & np.uint32(63) for j in range(4)]
                           + [(hh >> np.uint32(6 * j)) & np.uint32(63) for j in range(4)], axis=1).reshape(-1)
            ok = np.ones(y.shape, bool) if clamp else np.abs(y) <= fmt.max_value
            bad = ok & (got != want)
            assert not bad.any(), f"{name} k={k} clamp={clamp}: {int(bad.sum())} differ, first x={x[bad][0]!r}"


@pytest.mark.parametrize("rounding", ["rceil", "floor"])  # "even" takes floor's (clamped) path
@pytest.mark.parametrize("name", ["mxfp6_e2m3", "mxfp6_e3m2"])
def test_mxfp6_pair_paths_gpu(name, rounding):
    """MXFP6 through the group kernel's pair paths: bfloat16 at 1024 x 7168 (deep chunks, the
    24-byte chunk store; without the clamp for "rceil", with it for "floor") and, for the
    default "rceil", float16 / float32 (encode_store_unit's float32-pair branch); edge data
    with groups at the ends of the MX range."""
    sch = resolve_scheme(name, scale_rounding=rounding)
    x = edge_data((1024, 7168), seed=51, scale=8.0)
    x[3, :32] = np.float32(2.0**-133) * np.arange(32)
    x[3, 32:64] = np.float32(3.3e38) * np.linspace(-1, 1, 32, dtype=np.float32)
    x[4, :64] = np.float32(0.0625) * np.arange(-32, 32)
    check_gpu(x.astype(ml_dtypes.bfloat16), sch)
    if rounding == "rceil":  # compile time: one rounding for the float32-pair branch
        check_gpu(x[:96].astype(np.float16), sch)
        check_gpu(x[:96], sch)


def test_nvfp4_two_launches_gpu():
    """NVFP4 in two launches (PerTensor.AMAX_IN_GROUPS: S_enc from the amax partials in the
    group kernel): 1024 x 7168 bfloat16 (896 partials: several per thread), float16 / float32
    input, an all-zero tensor and one with non-finite values; the plan has the two kernels."""
    amax_in = KernelChoices(per_tensor=PerTensor.AMAX_IN_GROUPS)
    sch = resolve_scheme("nvfp4")
    shape = (1024, 7168)
    names = [k.py_func.__name__ for k, _, _, _ in kq.get_plan(shape, 1, sch, choices=amax_in).launches]
    assert names == ["tensor_amax", "lastaxis_groups"]
    x = edge_data(shape, seed=52, scale=30.0)
    x[500, 7000] = np.float32(5000.0)
    check_gpu(x.astype(ml_dtypes.bfloat16), sch, choices=amax_in)
    check_gpu(x[:96].astype(np.float16), sch, choices=amax_in)
    check_gpu(x[:96], sch, choices=amax_in)
    check_gpu(np.zeros((64, 256), np.float32).astype(ml_dtypes.bfloat16), sch, choices=amax_in)
    y = edge_data((64, 256), seed=53)
    y[0, :3] = [np.inf, np.nan, -np.inf]
    check_gpu(y.astype(ml_dtypes.bfloat16), sch, choices=amax_in)
