"""The thread-block-cluster kernel of per-channel scales (``column_cluster.column_cluster``,
``PerChannel.CLUSTER``, selected by ``choices=``) without a GPU: its geometry by hand against the issue's shapes; bit for bit against the
NumPy reference in the simulator, where a cluster is one block (CL = 1: the cluster barrier
runs as a block barrier and the remote load reads the block's own word); its PTX for sm_90
(the cluster barrier and the distributed shared-memory load, assembled by ptxas); and the
launch's cluster attribute. tests/test_column_cluster_gpu.py runs CL = 8 on the GPU."""

from __future__ import annotations

import ctypes
import re

import ml_dtypes
import numpy as np
import pytest

import nqdq.gpu.quantize.column_cluster as column_cluster
import nqdq.gpu.quantize.plan as kq
from nqdq.gpu.quantize.choices import KernelChoices, PerChannel
from nqdq.gpu.runtime import launch
from nqdq.gpu.quantize.columns import _expand

from helpers.data import column_data
from helpers.kernels import check, launched
from helpers.ptx import compile_rows
from nqdq.schemes import resolve_scheme


CLUSTER = KernelChoices(per_channel=PerChannel.CLUSTER)


# ----------------------------------------------------------------------------- geometry
@pytest.mark.parametrize(
    "rows, upr, vec, cl, want",
    [
        # bf16 8192 x 8192, clusters of 16 (the default on 132 SMs): 512 rows a block, 64 at
        # a time -> 8 units (64 channels, 128 bytes of a row) a stripe, 512 threads
        (8192, 1024, 8, 16, (16, 512, 8, 8, 0)),
        # clusters of 8: 1024 rows a block, 128 at a time -> 4 units: 64-byte pieces of
        # rows, under MIN_STRIPE_BYTES: not taken (the ring)
        (8192, 1024, 8, 8, None),
        # bf16 16384 x 7168: 4 units with clusters of 16: not taken
        (16384, 896, 8, 16, None),
        (4096, 896, 8, 8, (8, 512, 8, 8, 0)),
        # f32 (4 channels a unit): the same rows, the same units
        (8192, 2048, 4, 16, (16, 512, 8, 8, 0)),
        # 129 rows: 3 -> 4 at a time, but at least 8 (a thread for each of 32 units x 8
        # channels: 8 rows x 32 units = 256 threads)
        (129, 896, 8, 8, (8, 256, 32, 8, 0)),
        # ... f32: 4 at a time (4 channels a unit), 128 threads
        (129, 896, 4, 8, (8, 128, 32, 8, 0)),
        # rows of 3 units and of 1: a stripe is whole rows (contiguous), whatever its width
        (8192, 3, 8, 8, (8, 512, 4, 8, 0)),
        (2000, 3, 8, 8, (8, 128, 4, 8, 0)),
        (2000, 1, 8, 8, (8, 32, 1, 8, 0)),
        # 128 rows: one block of 512 threads at 32 units a row holds them (the single-block kernels)
        (128, 896, 8, 8, None),
    ],
)
def test_cluster_geometry(rows, upr, vec, cl, want):
    """One config, (512, 8, 0): 512 threads x 8 units, all in shared slots."""
    assert column_cluster.cluster_geometry(rows, upr, vec, 132, cl=cl, configs=((512, 8, 0),)) == want
    if want is not None:
        CL, NT, W, U, _ = want
        RG = NT // W
        assert CL * U * RG >= rows > CL * U * RG // 2 or RG == vec  # the least power of two that covers
        assert (W * 16 >= column_cluster.MIN_STRIPE_BYTES or W >= upr) and W * vec <= NT and NT % 32 == 0 and RG >= vec


@pytest.mark.parametrize(
    "rows, upr, want",
    [
        # bf16 8192 x 8192: the first config, 256 threads x 16 units (10 in registers): 512
        # rows a block, 32 at a time -> 8-unit stripes
        (8192, 1024, (16, 256, 8, 16, 10)),
        (4096, 896, (16, 256, 16, 16, 10)),
        # bf16 16384 x 7168: 4-unit stripes at 256 threads; the second config, 512 x 16 (5 in
        # registers): 1024 rows a block, 64 at a time -> 8-unit stripes
        (16384, 896, (16, 512, 8, 16, 5)),
        (12000, 257, (16, 512, 8, 16, 5)),
        # twice as many rows: neither (the ring)
        (32768, 896, None),
        # rows one block holds: neither (the single-block kernels)
        (128, 896, None),
    ],
)
def test_cluster_geometry_configs(rows, upr, want):
    """The default configs on a GPU (GPU_CONFIGS) tried in order, clusters of 16."""
    assert column_cluster.GPU_CONFIGS == ((256, 16, 10), (512, 16, 5))
    assert column_cluster.cluster_geometry(rows, upr, 8, 132, cl=16, configs=column_cluster.GPU_CONFIGS) == want


def test_cluster_size_by_sms(monkeypatch):
    """Clusters of 16 on GPUs of 132 SMs or more (H100 SXM, H200), else 8."""
    monkeypatch.setattr(column_cluster, "SIMULATOR", False)
    monkeypatch.setattr(column_cluster, "CLUSTER_SIZE", 0)
    assert (column_cluster.cluster_size_for(132), column_cluster.cluster_size_for(114)) == (16, 8)
    monkeypatch.setattr(column_cluster, "CLUSTER_SIZE", 4)
    assert column_cluster.cluster_size_for(132) == 4


# ----------------------------------------------------------------------------- bit for bit
@pytest.mark.parametrize(
    "name, kw, shape, dtype",
    [
        ("int8_column", {}, (13, 256), ml_dtypes.bfloat16),  # 8 rows at a time, 2 units: the second partial; 4 stripes
        ("int8_column", {}, (7, 100), np.float32),  # 25 units of 4 channels, 16 a stripe: the second partial
        ("int8_column", {}, (16, 200), np.float16),
        ("e4m3", {"granularity": "column"}, (2, 5, 96), ml_dtypes.bfloat16),  # N-D
        ("int4", {"granularity": "column"}, (9, 64), ml_dtypes.bfloat16),  # packed 4-bit codes
    ],
)
def test_cluster_exact(name, kw, shape, dtype):
    sch = resolve_scheme(name, **kw)
    x = column_data(shape, seed=shape[-1]).astype(dtype)
    assert launched(x.shape, dtype, sch, choices=CLUSTER) == ["column_cluster"]
    check(x, sch, x_ref=x.astype(np.float32), choices=CLUSTER)


@pytest.mark.parametrize("units, reg_units, shape", [(2, 1, (13, 200)), (3, 3, (21, 200)), (3, 1, (19, 72))])
def test_cluster_register_units_exact(fresh_plans, units, reg_units, shape):
    """Units held in registers beside the shared slots (UR of a thread's U units),
    bit for bit, with the data in partial stripes and rows."""
    fresh_plans.setattr(column_cluster, "CLUSTER_CONFIGS", ((64, units, reg_units),))
    sch = resolve_scheme("int8_column")
    x = column_data(shape, seed=7).astype(ml_dtypes.bfloat16)
    plan = kq.get_plan(x.shape, 1, sch, choices=CLUSTER)  # (kind 1: bfloat16)
    ((k, _, _, _),) = plan.launches
    fn = getattr(k, "py_func", k)
    src = fn.source
    assert fn.__name__ == "column_cluster"
    loads = src.count("load_unit(") + src.count("load_unit_l2_256(")  # (unaligned; aligned)
    staged = src.count("cp_async_unit(") + src.count("cp_async_unit_l2_256(")
    assert loads == 2 * reg_units and staged == units - reg_units
    check(x, sch, x_ref=x.astype(np.float32), choices=CLUSTER)


def test_cluster_units_template():
    """The kernel template's unit tokens at U = 16 (two-digit units: SLOT1 is not a prefix
    of SLOT10): units 0 .. 5 staged by cp.async and read from their slots, 6 .. 15 loaded
    into registers w6 .. w15 and used by name, no token left; the aligned loads with the
    .L2::256B prefetch size."""
    src = column_cluster._units(_expand(column_cluster._SRC, 16), 16, 6)
    assert not re.search(r"LOAD_A|LOAD_U|SLOT", src)
    staged = sorted(int(i) for i in re.findall(r"cp_async_unit_l2_256\(ring, sb, \(t \+ (\d+) \* NT\)", src))
    assert staged == list(range(6)) and "cp_async_unit(" not in src
    regs = re.findall(r"w(\d+) = load_unit_l2_256\(x32, g \+ (\d+) \* ustep, (\d+) < nv\)", src)
    assert regs == [(str(i),) * 3 for i in range(6, 16)]
    regs = re.findall(r"w(\d+) = load_unit\(x, x32, False, g \+ (\d+) \* ustep, (\d+) < nv", src)
    assert regs == [(str(i),) * 3 for i in range(6, 16)] and "load_unit(x, x32, True" not in src
    words = re.findall(r"word_max\(m, (.+?), kind\)", src)
    slots = [f"ld_shared_u32x4(ring, sb, (t + {i} * NT) * 4)" for i in range(6)]
    assert words == slots + [f"w{i}" for i in range(6, 16)]
    with pytest.raises(AssertionError):  # a unit the thread does not have
        column_cluster._units("SLOT16,", 16, 6)


def test_cluster_l2_prefetch_exact(fresh_plans):
    """The aligned loads with the .L2::256B prefetch size: the kernel built with them, bit
    for bit (register and staged units)."""
    fresh_plans.setattr(column_cluster, "CLUSTER_CONFIGS", ((64, 3, 1),))
    sch = resolve_scheme("int8_column")
    x = column_data((21, 200), seed=9).astype(ml_dtypes.bfloat16)
    plan = kq.get_plan(x.shape, 1, sch, choices=CLUSTER)  # (kind 1: bfloat16)
    ((k, _, _, _),) = plan.launches
    src = getattr(k, "py_func", k).source
    assert "cp_async_unit_l2_256(" in src and "load_unit_l2_256(" in src
    assert "cp_async_unit(" not in src and "load_unit(x, x32, True" not in src
    check(x, sch, x_ref=x.astype(np.float32), choices=CLUSTER)


def test_cluster_declines_rows_of_one_block():
    """Rows that one block of the widest stripes holds are not the cluster's: automatically
    the single-chunk kernel, where the cluster is chosen its plain fallback, the two passes;
    the cluster takes 13 rows, unless another design is chosen."""
    sch = resolve_scheme("int8_column")
    assert launched((4, 256), ml_dtypes.bfloat16, sch) == ["column_onepass"]
    assert launched((4, 256), ml_dtypes.bfloat16, sch, choices=CLUSTER) == ["column_amax", "finalize", "column_encode"]
    assert launched((13, 256), ml_dtypes.bfloat16, sch) == ["column_cluster"]
    single = KernelChoices(per_channel=PerChannel.SINGLE_CHUNK)
    assert launched((13, 256), ml_dtypes.bfloat16, sch, choices=single) == ["column_onepass"]


# ----------------------------------------------------------------------------- launch
def test_cluster_launch_config():
    """The kernel carries its cluster size; cuLaunchKernelEx's config holds the cluster
    dimension (attribute 4: x, y, z) and, for a PDL launch, the serialization (6: 1)."""
    k = column_cluster.make_column_cluster_kernel(1, kq.format_tuple(resolve_scheme("int8_column")), 127.0, 1, 64, 8, 2,
                                                  False)
    assert launch.cluster_size(k) == 1 and launch.cluster_size(object()) == 1
    cfg, attrs = launch._ex_config(64, 512, 0, cluster=8)
    assert (cfg.gridDimX, cfg.blockDimX, cfg.numAttrs) == (64, 512, 1)
    assert attrs[0].id == 4 and list(attrs[0].value[:3]) == [8, 1, 1]
    assert ctypes.addressof(cfg.attrs.contents) == ctypes.addressof(attrs[0])
    cfg, attrs = launch._ex_config((3, 2), 128, 1024, pdl=True, cluster=2)
    assert (cfg.gridDimX, cfg.gridDimY, cfg.sharedMemBytes, cfg.numAttrs) == (3, 2, 1024, 2)
    assert (attrs[0].id, attrs[0].value[0]) == (6, 1) and attrs[1].id == 4 and list(attrs[1].value[:3]) == [2, 1, 1]
    cfg, _ = launch._ex_config(5, 32)
    assert cfg.numAttrs == 0


_CLUSTER_PTX_SCRIPT = r"""
import json, re
import ml_dtypes
from numba import cuda, typeof
from cuda.bindings import nvjitlink
from nqdq.tools import ptx_audit as A
from nqdq.gpu.quantize import column_cluster
from nqdq.tools.ptx_audit import _no_gpu_compile

column_cluster.CLUSTER_SIZE = 16  # (a dry run counts one SM)
out = []
for shape in [(8192, 8192), (4096, 7168), (16384, 7168)]:
    for label, k, args in A._case_launches("int8_column", {}, shape, ml_dtypes.bfloat16, None, False):
        if k.py_func.__name__ != "column_cluster":
            continue
        with _no_gpu_compile():
            ptx, _ = cuda.compile_ptx(k.py_func, tuple(typeof(a) for a in args), cc=(9, 0),
                                      launch_bounds=k.targetoptions.get("launch_bounds"))
        h = nvjitlink.create(1, [b"-arch=sm_90"])
        d = ptx.encode()
        nvjitlink.add_data(h, nvjitlink.InputType.PTX, d, len(d), "k.ptx")
        nvjitlink.complete(h)
        body = ptx[ptx.index(".entry"):]
        ops = [ln.split()[0].rstrip(";") for ln in body.splitlines() if re.match(r"\s*[a-z]", ln)]
        out.append(dict(shape=shape, cluster=k.nqdq_cluster,
                        arrive=[o for o in ops if o.startswith("barrier.cluster.arrive")],
                        wait=[o for o in ops if o.startswith("barrier.cluster.wait")],
                        mapa=body.count("mapa.shared::cluster.u32"),  # (inside the asm's braces)
                        ld_cluster=body.count("ld.shared::cluster.u32"),
                        st_async=body.count("st.async.shared::cluster.mbarrier::complete_tx::bytes.u32"),
                        try_wait=body.count("mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64"),
                        init_fence=body.count("fence.mbarrier_init.release.cluster"),
                        release=body.count(".release.cluster") + body.count("arrive.release"),
                        cp_async=sum(o.startswith("cp.async.cg.shared.global") for o in ops),
                        cp_async_l2=sum(o == "cp.async.cg.shared.global.L2::256B" for o in ops),
                        ldg_v4=body.count("ld.global.nc.v4.u32"),
                        ldg_v4_l2=body.count("ld.global.nc.L2::256B.v4.u32"),
                        smem=k.nqdq_dynamic_smem, bounds=k.targetoptions.get("launch_bounds"),
                        cubin=nvjitlink.get_linked_cubin_size(h)))
print(json.dumps(out))
"""


def test_cluster_kernel_assembles_for_sm90():
    """At the issue's shapes the plan takes column_cluster with clusters of 16: at 8192x8192
    and 4096x7168 the first of GPU_CONFIGS (256 threads x 16 units: 6 staged in shared
    memory by cp.async, 24 KiB a block, and 10 loaded into registers; launch bounds of 3
    blocks an SM), at 16384x7168 the second (512 x 16: 11 staged, 88 KiB, 5 in registers;
    2 blocks an SM). Its PTX pushes the amax words: one st.async into each of the 16 blocks
    (two mapa each: the word's and the mbarrier's address), one acquire wait on its own
    mbarrier at cluster scope, and no cluster-scope release but the mbarrier's init fence
    (ptxas makes a release a MEMBAR.GPU): one relaxed arrival and one acquire wait at the
    start (not ``.aligned``), no remote load. Every load of the input (cp.async and
    ld.global.nc) carries the ``.L2::256B`` prefetch size. ptxas assembles it."""
    rows = compile_rows(_CLUSTER_PTX_SCRIPT)
    assert [r["shape"] for r in rows] == [[8192, 8192], [4096, 7168], [16384, 7168]], rows
    for r, (nt, staged, regs, bps) in zip(rows, [(256, 6, 10, 3), (256, 6, 10, 3), (512, 11, 5, 2)]):
        assert r["cluster"] == 16 and r["smem"] == nt * staged * 16 and r["bounds"] == [nt, bps], r
        assert r["arrive"] == ["barrier.cluster.arrive.relaxed"] and r["wait"] == ["barrier.cluster.wait.acquire"], r
        assert r["st_async"] == 16 and r["mapa"] == 32 and r["ld_cluster"] == 0 and r["try_wait"] >= 1, r
        assert r["init_fence"] == 1 and r["release"] == 1 and r["cp_async"] == staged and r["cubin"] > 0, r
        assert r["cp_async_l2"] == staged and r["ldg_v4_l2"] == regs and r["ldg_v4"] == 0, r
