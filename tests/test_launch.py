"""nqdq.gpu.runtime.launch: the packed-parameter launch path and its Numba fallback.

Without a GPU (CI: the conftest turns the CUDA simulator on) FastKernel launches through
Numba, so the toy kernel's results are checked through the same API; the parameter layout
is checked against the PTX Numba emits when NVVM is installed (a subprocess without the
simulator). With ``NQDQ_TEST_GPU=1`` on a GPU machine, the ``gpu`` tests compare the raw
``cuLaunchKernel`` path with Numba's own launch, bit for bit, and replay a CUDA graph.
"""

import ctypes
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from numba import cuda, types

import nqdq
from nqdq.gpu.runtime import launch, launch_ex, sequence
from nqdq.gpu.runtime.launch import FastKernel, fast_kernel, param_format, ptx_param_sizes

from helpers import toy_fp8_row
from helpers.launch import FakeCupyArray, fake_entry, record_launches

ON_GPU = os.environ.get("NQDQ_TEST_GPU") == "1"
gpu = pytest.mark.skipif(not ON_GPU, reason="needs NQDQ_TEST_GPU=1 and a CUDA GPU")


def bf16_rows(rng, rows, cols):
    """Random bf16 rows with per-row magnitudes from 2^-30 to 2^8 (tiny rows give subnormal codes)."""
    mag = np.exp2(rng.uniform(-30, 8, (rows, 1)))
    return (rng.standard_normal((rows, cols)) * mag).astype(ml_dtypes.bfloat16)


def reference_fp8_row(x):
    q = nqdq.quantize(x, "fp8_row")
    return q.codes.view(np.uint8), q.scales.reshape(-1)


# --- the parameter layout (pure Python) ------------------------------------------------


def test_param_format_follows_numba_array_abi():
    # meminfo, parent, nitems, itemsize, data, shape[2], strides[2]; then a 1-D array
    assert param_format((types.float32[:, ::1], types.uint8[:])) == "@QQqqQqqqq" + "QQqqQqq"


@pytest.mark.parametrize(
    "ty, code",
    [(types.int8, "b"), (types.uint16, "H"), (types.int32, "i"), (types.uint64, "Q"), (types.boolean, "?"),
     (types.float16, "e"), (types.float32, "f"), (types.float64, "d"), (types.complex64, "ff"),
     (types.complex128, "dd")],
)  # fmt: skip
def test_param_format_scalars(ty, code):
    assert param_format((ty,)) == "@" + code


def test_param_offsets_are_aligned_to_size():
    # int32 then an array: the array's first u64 goes to offset 8, not 4
    fmt = param_format((types.int32, types.float32[:], types.uint8, types.float64))
    offs = launch._param_offsets(fmt)
    assert offs[:2] == [0, 8]
    assert offs[-2:] == [64, 72]  # uint8 at 64, float64 aligned up to 72
    assert struct.calcsize(fmt) == 80


def test_unsupported_argument_types_are_refused_by_the_packer():
    with pytest.raises(NotImplementedError):
        param_format((types.UniTuple(types.int32, 2),))


PTX_ENTRY = """
.visible .entry _Z1kPfi(
	.param .u64 _Z1kPfi_param_0,
	.param .u64 .ptr .align 1 _Z1kPfi_param_1,
	.param .u32 _Z1kPfi_param_2,
	.param .f64 _Z1kPfi_param_3,
	.param .u8 _Z1kPfi_param_4,
	.param .align 8 .b8 _Z1kPfi_param_5[24]
)
{
	ret;
}
"""


def test_ptx_param_sizes_reads_an_entry():
    assert ptx_param_sizes(PTX_ENTRY, "_Z1kPfi") == [8, 8, 4, 8, 1, 24]
    with pytest.raises(ValueError, match="not found"):
        ptx_param_sizes(PTX_ENTRY, "other")


def test_packer_matches_numba_prepare_args_order():
    """The packed bytes are exactly Numba's kernelargs list for a CAI array and scalars."""

    class FakeDeviceArray:  # a CUDA-array-interface object, strided (every 2nd column)
        __cuda_array_interface__ = {
            "shape": (3, 5), "typestr": "<f4", "data": (0x7F0000001000, False),
            "strides": (40, 8), "version": 3,
        }  # fmt: skip

    argtypes = (types.float32[:, :], types.int32, types.float32, types.boolean)
    fmt = param_format(argtypes)
    st = struct.Struct(fmt)
    pack = launch._make_packer(argtypes, ("a", "n", "f", "b"), st.pack_into)
    buf = bytearray(st.size)
    pack(buf, (FakeDeviceArray(), 7, 0.5, True))
    assert st.unpack(buf) == (0, 0, 15, 4, 0x7F0000001000, 3, 5, 40, 8, 7, 0.5, True)


def test_arg_keys_and_layouts():
    class Cai:
        def __init__(self, shape, strides, typestr="<u2"):
            self.__cuda_array_interface__ = {"shape": shape, "strides": strides, "typestr": typestr,
                                             "data": (4096, False), "version": 3}  # fmt: skip

    assert launch._arg_key(Cai((4, 6), None)) == ("H", 2, "C")
    assert launch._arg_key(Cai((4, 6), (12, 2))) == ("H", 2, "C")
    assert launch._arg_key(Cai((4, 6), (2, 8))) == ("H", 2, "F")
    assert launch._arg_key(Cai((4, 6), (24, 2))) == ("H", 2, "A")
    assert launch._numba_type(("H", 2, "A")) == types.uint16[:, :]
    assert launch._arg_key(3) is int and launch._arg_key(np.float32(1)) is np.float32
    with pytest.raises(TypeError, match="host"):
        launch._arg_key(np.zeros(3))


def test_fits_signature_rules():
    key_c = ("f", 2, "C")
    key_a = ("f", 2, "A")
    assert launch._fits(key_c, types.float32[:, ::1]) and launch._fits(key_c, types.float32[:, :])
    assert launch._fits(key_a, types.float32[:, :]) and not launch._fits(key_a, types.float32[:, ::1])
    assert not launch._fits(key_c, types.float64[:, ::1]) and not launch._fits(key_c, types.float32[:])
    assert launch._fits(int, types.int32) and launch._fits(float, types.float32) and not launch._fits(float, types.int32)


def test_specialised_fast_launch_packs_like_the_general_packer(monkeypatch):
    """The generated check-pack-launch function: same bytes as the general packer, and it
    declines (returns False, launches nothing) whenever the arguments' key changes."""
    launched = []

    def fake_launch(handle, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        # read the parameters back through the void*[] the launch would hand the driver
        ptrs = (ctypes.c_void_p * len(entry.offsets)).from_address(params)
        base = ptrs[0] - entry.offsets[0]
        launched.append(((handle, gx, gy, gz, bx, by, bz, smem, stream), ctypes.string_at(base, entry.struct.size)))

    monkeypatch.setattr(launch, "_cupy_ndarray", FakeCupyArray)
    monkeypatch.setattr(launch, "_cupy_launch", fake_launch)
    argtypes = (types.uint32[:, ::1], types.float32[:], types.int32, types.complex64)
    entry = launch._Entry.__new__(launch._Entry)
    entry.argtypes, entry.handle, entry.name = argtypes, 1234, "k"
    entry.struct = struct.Struct(param_format(argtypes))
    entry.offsets = launch._param_offsets(entry.struct.format)
    entry.pack = launch._make_packer(argtypes, ("x", "s", "n", "c"), entry.struct.pack_into)
    entry._tls, entry._fast = launch.threading.local(), {}

    x = FakeCupyArray((4, 6), np.uint32, 0x10000)
    v = FakeCupyArray((5,), np.float32, 0x20000)
    args = (x, v, 7, 1.5 - 2j)
    key = tuple(map(launch._arg_key, args))
    assert key == (("I", 2, "C"), ("f", 1, "C"), int, complex)
    fl = entry.fast_launch(key)
    assert fl(args, 3, 1, 1, 128, 1, 1, 0, 99) is True
    expect = bytearray(entry.struct.size)
    entry.pack(expect, args)
    assert launched == [((1234, 3, 1, 1, 128, 1, 1, 0, 99), bytes(expect))]

    declined = [
        (x, v, 7),  # arity
        (FakeCupyArray((4, 6), np.int32, 1), v, 7, 1j),  # dtype
        (FakeCupyArray((4, 6), np.uint32, 1, order="F"), v, 7, 1j),  # layout
        (FakeCupyArray((24,), np.uint32, 1), v, 7, 1j),  # ndim
        (x, v, np.int32(7), 1j),  # scalar type
        (x, np.zeros(5, np.float32), 7, 1j),  # not a (fake) CuPy array
    ]
    for bad in declined:
        assert fl(bad, 1, 1, 1, 1, 1, 1, 0, 0) is False
    assert len(launched) == 1


_PTX_CHECK = textwrap.dedent(
    """
    import sys, types as pt
    import numba.cuda.dispatcher as D
    D.get_current_device = lambda: pt.SimpleNamespace(compute_capability=(9, 0))  # no GPU here
    from numba import cuda, types
    sys.path.insert(0, sys.argv[1])
    from nqdq.gpu.runtime.launch import param_format, ptx_param_sizes
    from helpers import toy_fp8_row
    import struct, re

    def mixed(a, b, n, f, flag, d, u8, h, c):
        if flag:
            b[0] = a[0, 0] * f + d + u8 + c.real + n + h

    sigs = [
        (mixed, (types.float32[:, :], types.float64[::1], types.int32, types.float32, types.boolean,
                 types.float64, types.uint8, types.float16, types.complex64)),
        (toy_fp8_row.fp8_row_bf16.py_func, (types.uint32[:, ::1], types.uint16[:, ::1], types.float32[::1])),
    ]
    for fn, sig in sigs:
        ptx, _ = cuda.compile_ptx(fn, sig, cc=(9, 0))
        entry = re.search(r"\\.entry (\\w+)\\(", ptx).group(1)
        have = [struct.calcsize("@" + c) for c in param_format(sig)[1:]]
        assert ptx_param_sizes(ptx, entry) == have, (fn.__name__, ptx_param_sizes(ptx, entry), have)
    print("ok")
    """
)


def test_layout_matches_numba_ptx_entry():
    """The packer's parameter sizes equal those of the .entry Numba compiles (needs NVVM)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _PTX_CHECK, str(root / "tests")], env=env,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    if r.returncode != 0 and "AssertionError" not in r.stderr:  # no toolchain here (no NVVM wheel)
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"cannot compile PTX here (pip install numba-cuda[cu13]): {last[:200]}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("ok")


# --- the launch API (simulator in CI, the real path on a GPU) ----------------------------


def _device(a):
    if ON_GPU:
        import cupy

        return cupy.asarray(a.view(np.uint16) if a.dtype == ml_dtypes.bfloat16 else a)
    return a


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _toy_run(launcher, x, stream=None):
    rows, cols = x.shape
    xd = _device(x)
    codes = _device(np.full((rows, cols), 0xA5, np.uint8))  # poisoned: every byte must be written
    scales = _device(np.full(rows, np.nan, np.float32))
    grid, block, args = toy_fp8_row.launch_args(xd, codes, scales)
    launcher(grid, block, args, stream)
    return _host(codes), _host(scales)


def test_fast_kernel_toy_fp8_row_matches_reference():
    rng = np.random.default_rng(1)
    x = bf16_rows(rng, 3, 64)
    x[1] = 0  # amax 0 -> scale 1.0
    fk = FastKernel(toy_fp8_row.fp8_row_bf16)
    codes, scales = _toy_run(fk.launch, x)
    ref_codes, ref_scales = reference_fp8_row(x)
    np.testing.assert_array_equal(codes, ref_codes)
    np.testing.assert_array_equal(scales.view(np.uint32), ref_scales.view(np.uint32))


def test_kernels_needing_numba_launch_are_recognised():
    from types import SimpleNamespace as NS

    assert not launch._needs_numba_launch(NS(targetoptions={}), NS(debug=False, cooperative=False, extensions=[]))
    assert launch._needs_numba_launch(NS(targetoptions={}), NS(debug=True))
    assert launch._needs_numba_launch(NS(targetoptions={}), NS(cooperative=True))
    assert launch._needs_numba_launch(NS(targetoptions={"extensions": [object()]}), NS())


def test_simulator_uses_numba_launch():
    fk = FastKernel(toy_fp8_row.fp8_row_bf16)
    assert fk.fast == (ON_GPU and os.environ.get("NQDQ_FAST_LAUNCH", "1") != "0")


def test_getitem_prepare_and_fast_kernel_memo():
    rng = np.random.default_rng(2)
    x = bf16_rows(rng, 2, 32)
    fk = fast_kernel(toy_fp8_row.fp8_row_bf16)
    assert fast_kernel(toy_fp8_row.fp8_row_bf16) is fk
    ref_codes, _ = reference_fp8_row(x)

    codes, _ = _toy_run(lambda g, b, a, s: fk[g, b](*a), x)
    np.testing.assert_array_equal(codes, ref_codes)
    codes, _ = _toy_run(lambda g, b, a, s: fk.prepare(g, b, a)(), x)
    np.testing.assert_array_equal(codes, ref_codes)


# --- GPU only: the raw path against Numba's launch -------------------------------------


@cuda.jit
def _mixed(a, out, n, f, flag, d, u8, c):
    """Every scalar kind, a strided 2-D input; out[i] depends on each argument."""
    i = cuda.grid(1)
    if i < a.shape[0]:
        v = a[i, 0] * f + d + u8 + c.real - c.imag + n + a.shape[1] + a.strides[0]
        out[i] = v if flag else -v


@gpu
@pytest.mark.gpu
def test_gpu_raw_launch_equals_numba_launch_all_argument_kinds():
    import cupy

    rng = np.random.default_rng(3)
    base = cupy.asarray(rng.standard_normal((50, 12)).astype(np.float32))
    a = base[::2, ::3]  # strided: layout A
    args_common = (np.int32(-7), np.float32(1.5), True, 0.25, np.uint8(200), np.complex64(2 - 3j))
    out_numba = cupy.full(a.shape[0], np.nan, np.float64)
    out_fast = cupy.full(a.shape[0], np.nan, np.float64)
    _mixed[1, 64](a, out_numba, *args_common)
    fk = FastKernel(_mixed)
    assert fk.fast
    fk.launch(1, 64, (a, out_fast) + args_common)  # general path (compiles)
    out_again = cupy.full(a.shape[0], np.nan, np.float64)
    fk.launch(1, 64, (a, out_again) + args_common)  # the specialised launcher for this key
    assert fk._fast[1] is not None
    entry = fk.compile((a, out_again) + args_common)
    assert entry.handle != entry.kernel_handle  # launched: the context's CUfunction, not Numba's CUkernel
    cupy.cuda.runtime.deviceSynchronize()
    np.testing.assert_array_equal(out_fast.get(), out_numba.get())
    np.testing.assert_array_equal(out_again.get(), out_numba.get())
    assert not np.isnan(out_fast.get()).any()


@gpu
@pytest.mark.gpu
def test_gpu_toy_kernel_fast_equals_numba_and_reference():
    import cupy

    rng = np.random.default_rng(4)
    x = bf16_rows(rng, 64, 7168)
    ref_codes, ref_scales = reference_fp8_row(x)

    def numba_launch(g, b, a, s):
        toy_fp8_row.fp8_row_bf16[g, b](*a)

    for launcher in (numba_launch, FastKernel(toy_fp8_row.fp8_row_bf16).launch):
        codes, scales = _toy_run(launcher, x)
        cupy.cuda.runtime.deviceSynchronize()
        np.testing.assert_array_equal(codes, ref_codes)
        np.testing.assert_array_equal(scales.view(np.uint32), ref_scales.view(np.uint32))


@gpu
@pytest.mark.gpu
def test_gpu_graph_capture_and_replay():
    import cupy

    rng = np.random.default_rng(5)
    rows, cols = 64, 7168
    xd = cupy.asarray(bf16_rows(rng, rows, cols).view(np.uint16))
    codes = cupy.empty((rows, cols), np.uint8)
    scales = cupy.empty(rows, np.float32)
    grid, block, args = toy_fp8_row.launch_args(xd, codes, scales)
    fk = FastKernel(toy_fp8_row.fp8_row_bf16, "void(uint32[:, ::1], uint16[:, ::1], float32[::1])")
    fk.compile(args)  # load the module before capturing
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        fk.launch(grid, block, args)  # stream=None: CuPy's current stream, the capturing one
        graph = s.end_capture()
    for trial in range(2):  # new data in the same buffers, then replay
        x = bf16_rows(rng, rows, cols)
        with s:  # on the replay's stream: s is non-blocking, so the null stream's work is unordered with it
            xd[...] = cupy.asarray(x.view(np.uint16))
            codes.fill(0xA5)
        graph.launch(s)
        s.synchronize()
        ref_codes, ref_scales = reference_fp8_row(x)
        np.testing.assert_array_equal(codes.get(), ref_codes)
        np.testing.assert_array_equal(scales.get().view(np.uint32), ref_scales.view(np.uint32))


@gpu
@pytest.mark.gpu
def test_gpu_streams_of_every_kind():
    import cupy

    rng = np.random.default_rng(6)
    x = bf16_rows(rng, 8, 256)
    ref_codes, _ = reference_fp8_row(x)
    fk = FastKernel(toy_fp8_row.fp8_row_bf16)
    keep = cupy.cuda.Stream()  # a raw handle's stream must outlive the launch
    for stream in (cupy.cuda.Stream(), cuda.stream(), 0, keep.ptr):
        codes, _ = _toy_run(fk.launch, x, stream)
        cupy.cuda.runtime.deviceSynchronize()
        np.testing.assert_array_equal(codes, ref_codes)


@gpu
@pytest.mark.gpu
def test_gpu_errors_name_the_argument():
    import cupy

    fk = FastKernel(toy_fp8_row.fp8_row_bf16, "void(uint32[:, ::1], uint16[:, ::1], float32[::1])")
    x2 = cupy.zeros((2, 4), np.uint32)
    codes = cupy.zeros((2, 4), np.uint16)
    with pytest.raises(TypeError, match="'scales'.*host"):
        fk.launch(2, 256, (x2, codes, np.zeros(2, np.float32)))
    with pytest.raises(TypeError, match="'codes2'"):
        fk.launch(2, 256, (x2, codes.astype(np.int16), cupy.zeros(2, np.float32)))
    with pytest.raises(TypeError, match="'x2'"):
        fk.launch(2, 256, (x2[:, ::2], codes, cupy.zeros(2, np.float32)))  # not C-contiguous


def test_compile_sequence_packs_like_the_general_packer(monkeypatch):
    """The generated sequence launcher: per launch, the same parameter bytes as the
    general packer given arrays at those addresses, in order, on the given stream; passed
    as a void*[] of one pointer per parameter."""
    entries = []
    launched = record_launches(monkeypatch, entries)
    e1 = fake_entry((types.uint16[::1], types.int64, types.uint8[::1], types.float32[::1], types.int64), 11, "k1")
    e2 = fake_entry((types.float32[::1], types.int64, types.float64), 22, "k2")
    entries += [e1, e2]
    launches = [
        ("k1", (3, 2), 256, (sequence.Ptr("xp", 0, 448, np.uint16), 7, sequence.Ptr("base", 512, 100, np.uint8),
                             sequence.Ptr("base", 0, 25, np.float32), sequence.Var("lo"))),
        ("k2", 5, (32, 4), (sequence.Ptr("dummy", 256, 1, np.float32), sequence.Var("hi"), 0.5)),
    ]  # fmt: skip
    run = sequence.compile_sequence(launches, ("xp", "base", "dummy", "lo", "hi"), entries=entries)
    run(77, 0x1000, 0x8000, 0x9000, 5, 6)
    want1 = bytearray(e1.struct.size)
    e1.pack(want1, (FakeCupyArray((448,), np.uint16, 0x1000), 7, FakeCupyArray((100,), np.uint8, 0x8200),
                    FakeCupyArray((25,), np.float32, 0x8000), 5))  # fmt: skip
    want2 = bytearray(e2.struct.size)
    e2.pack(want2, (FakeCupyArray((1,), np.float32, 0x9100), 6, 0.5))
    assert launched == [((11, 3, 2, 1, 256, 1, 1, 0, 77), bytes(want1)), ((22, 5, 1, 1, 32, 4, 1, 0, 77), bytes(want2))]
    with pytest.raises(TypeError, match="must be a Ptr"):
        sequence.compile_sequence([("k2", 1, 1, (0, 1, 0.5))], (), entries=[e2])
    with pytest.raises(ValueError, match="call variables"):
        sequence.compile_sequence([("k2", 1, 1, (sequence.Ptr("nope", 0, 1, np.float32), 1, 0.5))], ("xp",), entries=[e2])


def test_compile_sequence_prepacked_launches_store_only_the_addresses(monkeypatch):
    """A launch without Var arguments is packed once per thread; later calls store only
    the new addresses. Two calls with different addresses must each give exactly the
    general packer's bytes (so no stale address and no field left unpacked)."""
    entries = []
    launched = record_launches(monkeypatch, entries)
    # int32 / bool / float32 scalars between the arrays: the array fields still land on
    # 8-byte boundaries (native alignment), which the address stores rely on
    e1 = fake_entry((types.int32, types.uint16[::1], types.boolean, types.uint8[::1], types.float32), 33, "k3")
    e2 = fake_entry((types.float32[::1], types.int64), 44, "k4")
    entries += [e1, e2]
    launches = [
        ("k3", 4, 128, (-3, sequence.Ptr("xp", 0, 448, np.uint16), True, sequence.Ptr("base", 768, 9, np.uint8), 0.25)),
        ("k4", 1, 32, (sequence.Ptr("base", 0, 5, np.float32), 2**40)),
    ]  # fmt: skip
    run = sequence.compile_sequence(launches, ("xp", "base"), entries=entries)
    assert "_P0(" not in run.source and "_P1(" not in run.source  # nothing packed per call
    for xp, base in ((0x1000, 0x8000), (0x22000, 0x4000)):
        launched.clear()
        run(9, xp, base)
        want1 = bytearray(e1.struct.size)
        e1.pack(want1, (-3, FakeCupyArray((448,), np.uint16, xp), True, FakeCupyArray((9,), np.uint8, base + 768), 0.25))
        want2 = bytearray(e2.struct.size)
        e2.pack(want2, (FakeCupyArray((5,), np.float32, base), 2**40))
        assert launched == [((33, 4, 1, 1, 128, 1, 1, 0, 9), bytes(want1)), ((44, 1, 1, 1, 32, 1, 1, 0, 9), bytes(want2))]


def test_compile_sequence_pdl_launches_by_cu_launch_kernel_ex(monkeypatch):
    """A launch named in ``pdl`` goes through cuLaunchKernelEx with a CUlaunchConfig of its
    grid, block and the call's stream, holding one attribute: programmatic stream
    serialization (id 6, value 1); its parameter bytes are the general packer's. The other
    launches stay plain cuLaunchKernel calls, in order."""
    entries = []
    launched = record_launches(monkeypatch, entries)
    plain = launch._cupy_launch

    def fake_ex(cfg_addr, handle, params, extra):
        cfg = launch_ex._LaunchConfig.from_address(cfg_addr)
        attrs = [(cfg.attrs[i].id, cfg.attrs[i].value[0]) for i in range(cfg.numAttrs)]
        assert attrs == [(6, 1)] and cfg.sharedMemBytes == 0
        plain(handle, cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ, 0,
              cfg.hStream, params, extra)
        launched[-1] = (launched[-1][0] + ("ex",), launched[-1][1])
        return 0

    monkeypatch.setattr(launch, "_driver_launch_ex", lambda: fake_ex)
    e1 = fake_entry((types.float32[::1], types.int64), 55, "k5")
    e2 = fake_entry((types.uint8[::1], types.int32), 66, "k6")
    entries += [e1, e2]
    launches = [("k5", 3, 64, (sequence.Ptr("base", 0, 5, np.float32), 7)),
                ("k6", (9, 2), 96, (sequence.Ptr("xp", 16, 32, np.uint8), 4))]
    run = sequence.compile_sequence(launches, ("xp", "base"), entries=entries, pdl=(1,))
    for stream in (5, 0x7F00):  # the config's stream follows the call's
        launched.clear()
        run(stream, 0x1000, 0x8000)
        want1, want2 = bytearray(e1.struct.size), bytearray(e2.struct.size)
        e1.pack(want1, (FakeCupyArray((5,), np.float32, 0x8000), 7))
        e2.pack(want2, (FakeCupyArray((32,), np.uint8, 0x1010), 4))
        assert launched == [((55, 3, 1, 1, 64, 1, 1, 0, stream), bytes(want1)),
                            ((66, 9, 2, 1, 96, 1, 1, 0, stream, "ex"), bytes(want2))]


def _fake_launch_ex(seen):
    """A stand-in for cuLaunchKernelEx: records each config's (dynamic shared memory,
    [(attribute id, its first three value words)]) in ``seen``, then launches through the
    recorded plain launch (record_launches)."""
    plain = launch._cupy_launch

    def fake_ex(cfg_addr, handle, params, extra):
        cfg = launch_ex._LaunchConfig.from_address(cfg_addr)
        attrs = [(cfg.attrs[i].id, list(cfg.attrs[i].value[:3])) for i in range(cfg.numAttrs)]
        seen.append((cfg.sharedMemBytes, attrs))
        plain(handle, cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ,
              cfg.sharedMemBytes, cfg.hStream, params, extra)  # fmt: skip
        return 0

    return fake_ex


class _SmemKernel:
    """A stand-in kernel that declares dynamic shared memory (``launch.dynamic_smem``)."""

    def __init__(self, nbytes):
        self.nqdq_dynamic_smem = nbytes


def test_compile_sequence_dynamic_shared_memory(monkeypatch):
    """A kernel carrying ``nqdq_dynamic_smem`` (the shared-memory ring of per-channel
    scales) is launched with that many bytes of dynamic shared memory, by cuLaunchKernel
    and in a PDL launch's CUlaunchConfig alike; kernels without it get 0."""
    entries, seen = [], []
    launched = record_launches(monkeypatch, entries)
    monkeypatch.setattr(launch, "_driver_launch_ex", lambda: _fake_launch_ex(seen))
    e1 = fake_entry((types.float32[::1], types.int64), 77, "k7")
    e2 = fake_entry((types.uint8[::1], types.int32), 88, "k8")
    e3 = fake_entry((types.uint8[::1], types.int32), 99, "k9")
    entries += [e1, e2, e3]
    assert launch.dynamic_smem(_SmemKernel(49152)) == 49152 and launch.dynamic_smem("k") == 0
    launches = [(_SmemKernel(49152), 3, 128, (sequence.Ptr("base", 0, 5, np.float32), 7)),
                (_SmemKernel(100000), 2, 64, (sequence.Ptr("xp", 0, 32, np.uint8), 4)),
                ("k9", 1, 32, (sequence.Ptr("xp", 0, 32, np.uint8), 4))]
    run = sequence.compile_sequence(launches, ("xp", "base"), entries=entries, pdl=(1,))
    run(5, 0x1000, 0x8000)
    assert [rec[0][7] for rec in launched] == [49152, 100000, 0]
    assert seen == [(100000, [(6, [1, 0, 0])])]


class _ClusterKernel:
    """A stand-in kernel written for thread-block clusters (``launch.cluster_size``)."""

    def __init__(self, n):
        self.nqdq_cluster = n


def test_compile_sequence_cluster_launches_by_cu_launch_kernel_ex(monkeypatch):
    """A kernel carrying ``nqdq_cluster`` (the cluster kernel of per-channel scales) goes
    through cuLaunchKernelEx with the cluster dimension (id 4, value x, 1, 1), beside a PDL
    launch's serialization where both apply; the other launches stay cuLaunchKernel."""
    entries, seen = [], []
    launched = record_launches(monkeypatch, entries)
    monkeypatch.setattr(launch, "_driver_launch_ex", lambda: _fake_launch_ex(seen))
    e1 = fake_entry((types.float32[::1], types.int64), 11, "c1")
    e2 = fake_entry((types.uint8[::1], types.int32), 12, "c2")
    e3 = fake_entry((types.uint8[::1], types.int32), 13, "c3")
    entries += [e1, e2, e3]
    assert launch.cluster_size(_ClusterKernel(16)) == 16 and launch.cluster_size("k") == 1
    launches = [(_ClusterKernel(16), 32, 512, (sequence.Ptr("base", 0, 5, np.float32), 7)),
                ("c2", 2, 64, (sequence.Ptr("xp", 0, 32, np.uint8), 4)),
                (_ClusterKernel(8), 16, 128, (sequence.Ptr("xp", 0, 32, np.uint8), 4))]
    run = sequence.compile_sequence(launches, ("xp", "base"), entries=entries, pdl=(2,))
    run(5, 0x1000, 0x8000)
    assert [rec[0][:5] for rec in launched] == [(11, 32, 1, 1, 512), (12, 2, 1, 1, 64), (13, 16, 1, 1, 128)]
    assert seen == [(0, [(4, [16, 1, 1])]), (0, [(6, [1, 0, 0]), (4, [8, 1, 1])])]


class _CoopKernel:
    """A stand-in kernel whose blocks wait for each other (``launch.cooperative``)."""

    nqdq_cooperative = True


def test_compile_sequence_cooperative_launches_by_cu_launch_kernel_ex(monkeypatch):
    """A kernel carrying ``nqdq_cooperative`` (``quantize.tensor_resident``) goes through
    cuLaunchKernelEx with the cooperative attribute (id 2, value 1), together with its
    dynamic shared memory and beside a cluster dimension where both apply; the other
    launches stay cuLaunchKernel."""
    entries, seen = [], []
    launched = record_launches(monkeypatch, entries)
    monkeypatch.setattr(launch, "_driver_launch_ex", lambda: _fake_launch_ex(seen))
    entries += [fake_entry((types.float32[::1], types.int64), 21, "p1"),
                fake_entry((types.uint8[::1], types.int32), 22, "p2")]
    coop = _CoopKernel()
    coop.nqdq_dynamic_smem = 229376
    assert launch.cooperative(coop) and not launch.cooperative("k") and not launch.cooperative(_ClusterKernel(8))
    launches = [("p1", 3, 128, (sequence.Ptr("base", 0, 5, np.float32), 7)),
                (coop, 132, 1024, (sequence.Ptr("xp", 0, 32, np.uint8), 4))]
    run = sequence.compile_sequence(launches, ("xp", "base"), entries=entries)
    run(5, 0x1000, 0x8000)
    assert [rec[0][:5] for rec in launched] == [(21, 3, 1, 1, 128), (22, 132, 1, 1, 1024)]
    assert seen == [(229376, [(2, [1, 0, 0])])]
    cfg, attrs = launch._ex_config(16, 64, cluster=8, coop=True)
    assert [(attrs[i].id, list(attrs[i].value[:3])) for i in range(cfg.numAttrs)] == [(4, [8, 1, 1]), (2, [1, 0, 0])]
    # the driver's refusal (720) of the cooperative launch: LaunchRefused of that kind
    assert [launch.ex_kind(k) for k in (coop, _ClusterKernel(8), "k")] == ["cooperative", "cluster", None]
    monkeypatch.setattr(launch, "_driver_launch_ex", lambda: lambda *a: 720)
    run = sequence.compile_sequence(launches, ("xp", "base"), entries=entries)
    with pytest.raises(launch.LaunchRefused) as got:
        run(5, 0x1000, 0x8000)
    assert got.value.kind == "cooperative"


def test_launch_config_structs_match_cuda_h(tmp_path):
    """The ctypes CUlaunchConfig / CUlaunchAttribute have cuda.h's sizes and field offsets
    (compiled against the toolkit's header by the C compiler; skipped without either)."""
    import shutil

    nvcc = shutil.which("nvcc")
    cc = shutil.which("gcc") or shutil.which("cc")
    dirs = [os.path.join(os.path.dirname(os.path.realpath(nvcc)), "..", "include")] if nvcc else []
    dirs += ["/usr/local/cuda/include"] + sorted(str(p) for p in Path("/usr/local").glob("cuda-*/include"))
    inc = [d for d in dirs if os.path.exists(os.path.join(d, "cuda.h"))]
    if not (cc and inc):
        pytest.skip("no C compiler or cuda.h")
    src = tmp_path / "sz.c"
    src.write_text("#include <cuda.h>\n#include <stdio.h>\n#include <stddef.h>\nint main(void){printf(\"%zu %zu %zu %zu %zu "
                   "%zu\", sizeof(CUlaunchAttribute), sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, hStream), "
                   "offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, numAttrs), offsetof(CUlaunchAttribute, value));"
                   "return 0;}\n")
    subprocess.run([cc, f"-I{inc[0]}", str(src), "-o", str(tmp_path / "sz")], check=True)
    got = subprocess.run([str(tmp_path / "sz")], capture_output=True, text=True, check=True).stdout.split()
    C, A = launch_ex._LaunchConfig, launch_ex._LaunchAttribute
    assert [int(v) for v in got] == [ctypes.sizeof(A), ctypes.sizeof(C), C.hStream.offset, C.attrs.offset,
                                     C.numAttrs.offset, A.value.offset]


def test_compile_sequence_declines_under_the_simulator():
    if launch.simulated():
        assert sequence.compile_sequence([(toy_fp8_row.fp8_row_bf16, 1, 1, ())], ()) is None


def test_function_handle_takes_the_cufunction_of_a_cukernel(monkeypatch):
    """Entries launch the context's CUfunction (cuKernelGetFunction) of Numba's CUkernel;
    any other handle or a driver error keeps the handle."""
    from cuda.bindings import driver

    asked = []

    def fake_get_function(kernel):
        asked.append(int(kernel))
        return (driver.CUresult.CUDA_SUCCESS, driver.CUfunction(0x5000)) if int(kernel) == 0x99 else (
            driver.CUresult.CUDA_ERROR_INVALID_HANDLE, None)  # fmt: skip

    monkeypatch.setattr(driver, "cuKernelGetFunction", fake_get_function)
    assert launch._function_handle(driver.CUkernel(0x99)) == 0x5000
    assert launch._function_handle(driver.CUkernel(0x77)) == 0x77  # the driver refused: unchanged
    assert launch._function_handle(0x1234) == 0x1234  # not a CUkernel: never asked
    assert asked == [0x99, 0x77]


def test_function_attributes_set_once_per_handle(monkeypatch):
    """allow_smem / allow_cluster set their attribute (MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
    NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14) on each compiled overload's handle once per
    value; nothing for 0 bytes or portable clusters (<= 8 blocks)."""
    from numba.cuda.cudadrv import driver as drv

    calls = []

    class _Fn:
        handle, device = 0x5150, type("Dev", (), {"id": 0})()

    class _Lib:
        @staticmethod
        def get_cufunc():
            return _Fn()

    class _Kern:
        overloads = {"sig": type("Compiled", (), {"_codelibrary": _Lib})()}

    class _Drv:
        def cuKernelSetAttribute(self, attr, value, handle, dev):
            calls.append((int(attr), value, handle))

    pytest.importorskip("cuda.bindings.driver")
    monkeypatch.setattr(drv, "driver", _Drv(), raising=False)  # (the simulator's module has none)
    monkeypatch.setattr(launch, "simulated", lambda: False)
    monkeypatch.setattr(launch, "_ATTR_SET", set())
    launch.allow_smem(_Kern, 100000)
    launch.allow_smem(_Kern, 100000)
    launch.allow_smem(_Kern, 0)
    launch.allow_smem(_Kern, 120000)
    launch.allow_cluster(_Kern, 16)
    launch.allow_cluster(_Kern, 16)
    launch.allow_cluster(_Kern, 8)
    assert calls == [(8, 100000, 0x5150), (8, 120000, 0x5150), (14, 1, 0x5150)]


def test_launch_errors_name_the_refusals(monkeypatch):
    """The driver's refusal of a cooperative grid (720) or of a cluster (912) is
    LaunchRefused for a launch of that kind, any other error a plain RuntimeError; a refusal
    rules that kind out of later plans (ex_launch_ok) and warns once."""
    monkeypatch.setattr(launch, "_REFUSED", set())
    e = launch.launch_error(720, "k", "cooperative")
    assert isinstance(e, launch.LaunchRefused) and e.kind == "cooperative" and "cuLaunchKernel(k)" in str(e)
    assert isinstance(launch.launch_error(912, "k", "cluster"), launch.LaunchRefused)
    for err, kind in [(720, "cluster"), (912, "cooperative"), (701, "cooperative"), (720, None)]:
        e = launch.launch_error(err, "k", kind)
        assert type(e) is RuntimeError, (err, kind)
    assert launch.ex_launch_ok("cooperative") == (launch.simulated() or os.environ.get("NQDQ_FAST_LAUNCH", "1") != "0")
    with pytest.warns(RuntimeWarning, match="refused a cluster launch"):
        assert launch.refuse("cluster")
    assert not launch.refuse("cluster")  # once
    assert not launch.ex_launch_ok("cluster")
