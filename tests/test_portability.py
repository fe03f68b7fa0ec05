"""The kernel source stays portable to AMD (numba-hip posing as numba.cuda): static rules
over every module of nqdq/gpu/ (SPEC.md, "Portability to AMD (numba-hip)"; docs/amd.md).

Rules, checked on the AST:

* ``import``: the name ``cuda`` comes from ``runtime.backend`` only (no ``from numba import
  cuda``, ``import numba.cuda``); ``numba.cuda.<submodule>`` imports are fine (posing maps
  them);
* ``inline-ptx``: ``InlineAsm`` / ``asm(`` strings only in the intrinsics modules (``ptx/``:
  INTRINSIC_MODULES), which select a twin where ``target.PTX`` is False;
* in the bodies of device code (functions decorated by a ``*jit*``, ``devfn`` or ``_twin``
  decorator): ``half`` (no float16 / bfloat16 Numba or NumPy types, ``cuda.fp16``),
  ``coop`` (no cooperative groups: ``cg.``, ``this_grid``, ``.sync()`` of a grid),
  ``atomic-tuple`` (no atomic whose index is a tuple), ``printf`` (no ``print``).

A known violation would be listed in ALLOW with its reason, never skipped silently; an ALLOW
entry that no longer matches fails too, so the list cannot go stale. It is empty: every
inline-PTX helper, the stochastic-rounding ones included, lives in ``ptx/`` beside its twin.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import numpy as np
import pytest

GPU = Path(__file__).resolve().parent.parent / "nqdq" / "gpu"
BACKEND = "runtime/backend.py"  # (where ``cuda`` is imported from numba or numba-hip)
# the modules that hold inline PTX, paths under nqdq/gpu/
INTRINSIC_MODULES = {"ptx/_asm.py", "ptx/cluster.py", "ptx/convert.py", "ptx/griddep.py", "ptx/memory.py", "ptx/mma.py",
                     "ptx/wgmma.py",
                     "ptx/mma_blockscale.py",
                     "ptx/pairs.py", "ptx/stochastic.py"}
HALF_NAMES = {"float16", "bfloat16", "fp16"}  # (not "half": kernels name integers so)

# (module, rule): (number of findings, why it is allowed)
ALLOW: dict[tuple[str, str], tuple[int, str]] = {}


def _is_device_decorator(node) -> bool:
    text = ast.unparse(node)
    return "jit" in text or "devfn" in text or "_twin" in text


class _Checker(ast.NodeVisitor):
    def __init__(self, module: str):
        self.module = module
        self.findings: list[tuple[str, int, str]] = []
        self._device = 0

    def _add(self, rule, node, what):
        self.findings.append((rule, getattr(node, "lineno", 0), what))

    # imports -------------------------------------------------------------------------
    def visit_ImportFrom(self, node):
        if node.module == "numba" and any(a.name == "cuda" for a in node.names):
            self._add("import", node, "from numba import cuda")
        self.generic_visit(node)

    def visit_Import(self, node):
        for a in node.names:
            if a.name == "numba.cuda":
                self._add("import", node, "import numba.cuda")
        self.generic_visit(node)

    # inline PTX -----------------------------------------------------------------------
    def visit_Attribute(self, node):
        if node.attr == "InlineAsm" and self.module not in INTRINSIC_MODULES:
            self._add("inline-ptx", node, ast.unparse(node))
        if self._device:
            text = ast.unparse(node)
            if node.attr in HALF_NAMES:
                self._add("half", node, text)
            if node.attr in ("cg", "this_grid") or (isinstance(node.value, ast.Name) and node.value.id == "cg"):
                self._add("coop", node, text)
        self.generic_visit(node)

    def visit_Name(self, node):
        if node.id == "InlineAsm" and self.module not in INTRINSIC_MODULES:
            self._add("inline-ptx", node, node.id)
        if self._device and node.id in HALF_NAMES | {"this_grid"}:
            self._add("half" if node.id in HALF_NAMES else "coop", node, node.id)
        self.generic_visit(node)

    def visit_Constant(self, node):
        if isinstance(node.value, str) and "asm(" in node.value and self.module not in INTRINSIC_MODULES:
            self._add("inline-ptx", node, node.value[:40])
        self.generic_visit(node)

    # device code ------------------------------------------------------------------------
    def visit_FunctionDef(self, node):
        device = any(_is_device_decorator(d) for d in node.decorator_list)
        self._device += device
        self.generic_visit(node)
        self._device -= device

    def visit_Call(self, node):
        if self._device:
            f = node.func
            name = ast.unparse(f)
            if isinstance(f, ast.Name) and f.id == "print":
                self._add("printf", node, "print(...)")
            if isinstance(f, ast.Attribute) and f.attr == "sync" and "grid" in ast.unparse(f.value):
                self._add("coop", node, name)
            if ".atomic." in f".{name}" and len(node.args) >= 2 and isinstance(node.args[1], ast.Tuple):
                self._add("atomic-tuple", node, name)
        self.generic_visit(node)


def check_source(src: str, module: str = "snippet.py"):
    """[(rule, line, what)] of ``src`` as module ``module`` (its path under nqdq/gpu/)."""
    checker = _Checker(module)
    checker.visit(ast.parse(src))
    return checker.findings


def _kernel_modules():
    """{path under nqdq/gpu/: file} of every module but the backend's."""
    mods = {p.relative_to(GPU).as_posix(): p for p in GPU.rglob("*.py")}
    mods.pop(BACKEND)
    return dict(sorted(mods.items()))


def test_the_scan_sees_the_gpu_package():
    """The scan below covers a package that exists and holds modules (a moved or renamed
    package would otherwise pass it with nothing checked), the intrinsics modules among them."""
    mods = _kernel_modules()
    assert GPU.is_dir() and len(mods) > 20, f"{GPU}: {len(mods)} modules"
    assert INTRINSIC_MODULES <= set(mods), INTRINSIC_MODULES - set(mods)
    assert any(m.startswith("quantize/") for m in mods) and any(m.startswith("gemm/") for m in mods)


def test_kernel_modules_follow_the_portability_rules():
    counts, report = {}, []
    mods = _kernel_modules()
    assert mods, f"no modules under {GPU}"
    for name, path in mods.items():
        for rule, line, what in check_source(path.read_text(), name):
            counts[(name, rule)] = counts.get((name, rule), 0) + 1
            if (name, rule) not in ALLOW:
                report.append(f"{name}:{line}: {rule}: {what}")
    assert not report, "portability rules broken (docs/amd.md):\n" + "\n".join(report)
    for key, (n, why) in ALLOW.items():
        assert counts.get(key, 0) == n, f"ALLOW {key} ({why}) expects {n} findings, found {counts.get(key, 0)}"


@pytest.mark.parametrize("src, rule", [
    ("from numba import cuda, int32\n", "import"),
    ("import numba.cuda\n", "import"),
    ("from llvmlite import ir\nasm = ir.InlineAsm(fty, 'mov.u32 $0, $1;', '=r,r')\n", "inline-ptx"),
    ("s = 'asm(\"mov.u32 %0, %1;\")'\n", "inline-ptx"),
    ("@cuda.jit\ndef k(x):\n    h = numba.types.float16(x[0])\n", "half"),
    ("@devfn\ndef f(x):\n    return np.float16(x)\n", "half"),
    ("@cuda.jit\ndef k(x):\n    y = cuda.fp16.hadd(x[0], x[1])\n", "half"),
    ("@cuda.jit\ndef k(x):\n    g = cuda.cg.this_grid()\n    g.sync()\n", "coop"),
    ("@cuda.jit\ndef k(x):\n    grid = this_grid()\n    grid.sync()\n", "coop"),
    ("@cuda.jit(device=True)\ndef f(a, i, j):\n    cuda.atomic.add(a, (i, j), 1)\n", "atomic-tuple"),
    ("@cuda.jit\ndef k(x):\n    print(x[0])\n", "printf"),
    ("def factory():\n    @cuda.jit(lineinfo=True)\n    def k(x):\n        print(x[0])\n    return k\n", "printf"),
])
def test_checker_finds_a_planted_violation(src, rule):
    assert rule in [r for r, _, _ in check_source(src)], check_source(src)


@pytest.mark.parametrize("src", [
    "from ..runtime.backend import cuda\nfrom numba.cuda.extending import intrinsic\n",
    "@cuda.jit\ndef k(a, i):\n    cuda.atomic.add(a, i, 1)\n    cuda.syncthreads()\n",
    "def host(x):\n    print(x)\n    return np.float16(x)\n",  # host code may print and use float16
])
def test_checker_passes_portable_code(src):
    assert check_source(src) == []


def test_inline_ptx_is_allowed_in_the_intrinsics_modules():
    src = "asm = ir.InlineAsm(fty, 'prefetch.global.L2 [$0];', 'l')\n"
    assert check_source(src, "ptx/memory.py") == []
    assert [r for r, _, _ in check_source(src, "quantize/general.py")] == ["inline-ptx"]


def test_gpu_module_is_numba_cuda_on_nvidia():
    import numba.cuda

    from nqdq.gpu.runtime import backend as _gpu, target as _target

    if _gpu.HIP:  # pragma: no cover - a numba-hip environment
        pytest.skip("numba-hip environment")
    assert _gpu.GPU_BACKEND == "cuda" and _gpu.cuda is numba.cuda
    assert _target.PTX == (not _target.SIMULATOR)


def test_gpu_backend_is_validated(monkeypatch):
    from nqdq.gpu.runtime import backend as _gpu

    monkeypatch.setenv("NQDQ_GPU_BACKEND", "rocm")
    with pytest.raises(ValueError, match="NQDQ_GPU_BACKEND"):
        _gpu._backend()
    monkeypatch.setenv("NQDQ_GPU_BACKEND", "CUDA")
    assert _gpu._backend() == "cuda"
    monkeypatch.delenv("NQDQ_GPU_BACKEND")
    assert _gpu._backend() == ("hip" if _gpu._posed_as_cuda() else "cuda")


@pytest.mark.parametrize("name", ["u16x2_min", "u16x2_max", "prmt", "absmax_nan"])
def test_scalar_twins_match_array_twins(name):
    """The scalar twins AMD compiles agree with the array twins the simulator runs, compiled
    by numba's CPU jit (the same typing front end as the GPU targets)."""
    import numba

    from nqdq.gpu.ptx import pairs

    scalar = numba.njit(getattr(pairs, f"{name}_scalar"))
    twin = getattr(pairs, f"{name}_twin")
    rng = np.random.default_rng(48)
    words = rng.integers(0, 2**32, size=(300, 2), dtype=np.uint64).astype(np.uint32)
    words[:8] = [[0x7FC00000, 1], [0xFF800000, 0x7F800000], [0, 0x80000000], [0x7F800001, 0x7F800000],
                 [0xFFFF0000, 0x0000FFFF], [0x80008000, 0x00010001], [0xFFFFFFFF, 0], [0x12345678, 0x9ABCDEF0]]
    for a, b in words:
        if name == "prmt":
            for sel in (0x6420, 0x7531, 0x7632, 0x5410, 0x3210, 0x0123):
                assert scalar(a, b, np.uint32(sel)) == twin(a, b, sel), (hex(a), hex(b), hex(sel))
        else:
            assert scalar(a, b) == twin(a, b), (hex(a), hex(b))


def test_hip_selection_is_not_forced_here():
    # the CPU tests run in the numba-cuda environment; NQDQ_GPU_BACKEND=hip needs numba-hip
    assert os.environ.get("NQDQ_GPU_BACKEND", "cuda").lower() != "hip" or pytest.importorskip("numba.hip")
