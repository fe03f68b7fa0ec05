"""Assemble LLVM IR for an AMDGPU target with llvmlite (LLVM's AMDGPU backend), each
compile in its own Python subprocess with a timeout: LLVM aborts the whole process on some
inputs (the scaled MFMA intrinsics for a target without them, gfx942 for instance), and an
abort must fail one test, not the run. Nothing here needs ROCm or an AMD GPU.

``assemble(ir, cpu="gfx950")`` returns the assembly text; :func:`kernel_stats` reads the
numbers the tests hold the kernel to from the code object metadata in it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import NamedTuple

__all__ = ["assemble", "AssemblyError", "KernelStats", "kernel_stats", "count_instruction", "TRIPLE"]

TRIPLE = "amdgcn-amd-amdhsa"

# Runs in the child: only llvmlite, so a child costs an interpreter start and one compile.
_CHILD = """
import sys
import llvmlite.binding as llvm
llvm.initialize_all_targets()
llvm.initialize_all_asmprinters()
module = llvm.parse_assembly(sys.stdin.read())
module.verify()
machine = llvm.Target.from_triple(sys.argv[1]).create_target_machine(cpu=sys.argv[2], opt=int(sys.argv[3]))
sys.stdout.write(machine.emit_assembly(module))
"""


class AssemblyError(RuntimeError):
    """The compile failed, crashed or timed out; the message carries LLVM's own words."""


def assemble(ir: str, cpu: str = "gfx950", *, opt: int = 3, timeout: float = 60.0) -> str:
    """Assembly text of LLVM IR module ``ir`` for ``amdgcn-amd-amdhsa`` / ``cpu``."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, TRIPLE, cpu, str(opt)],
            input=ir, capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise AssemblyError(f"llvmlite compile for {cpu} did not finish in {timeout} s") from None
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-20:]
        raise AssemblyError(f"llvmlite compile for {cpu} failed (exit {done.returncode}):\n" + "\n".join(tail))
    return done.stdout


class KernelStats(NamedTuple):
    """Per-kernel resource numbers from the AMDHSA code object metadata."""

    name: str
    vgpr_count: int  # architected + accumulation VGPRs the wave allocates (.vgpr_count)
    agpr_count: int
    sgpr_count: int
    vgpr_spill_count: int
    sgpr_spill_count: int
    private_segment_size: int  # scratch bytes per lane; 0 = no scratch at all
    group_segment_size: int  # LDS bytes
    accum_offset: int  # first AGPR index in the unified register file (gfx90a+)


def _field(block: str, key: str) -> int:
    m = re.search(rf"^\s*\.?{re.escape(key)}:?\s+(\d+)", block, re.M)
    if not m:
        raise ValueError(f"no {key} in the kernel's metadata")
    return int(m.group(1))


def kernel_stats(asm: str, name: str) -> KernelStats:
    """The :class:`KernelStats` of kernel ``name`` in ``asm`` (``.amdhsa_kernel`` directives
    and the ``amdhsa.kernels`` YAML metadata)."""
    m = re.search(rf"\.amdhsa_kernel {re.escape(name)}\n(.*?)\.end_amdhsa_kernel", asm, re.S)
    if not m:
        raise ValueError(f"kernel {name!r} not found in the assembly")
    directives = m.group(1)
    yaml = asm[asm.index("amdhsa.kernels:"):]
    entries = re.split(r"\n  - ", yaml)
    entry = next((e for e in entries if re.search(rf"\.name:\s+{re.escape(name)}\s*$", e, re.M)), None)
    if entry is None:
        raise ValueError(f"kernel {name!r} has no amdhsa.kernels metadata entry")
    return KernelStats(
        name=name,
        vgpr_count=_field(entry, "vgpr_count"),
        agpr_count=_field(entry, "agpr_count"),
        sgpr_count=_field(entry, "sgpr_count"),
        vgpr_spill_count=_field(entry, "vgpr_spill_count"),
        sgpr_spill_count=_field(entry, "sgpr_spill_count"),
        private_segment_size=_field(directives, "amdhsa_private_segment_fixed_size"),
        group_segment_size=_field(directives, "amdhsa_group_segment_fixed_size"),
        accum_offset=_field(directives, "amdhsa_accum_offset"),
    )


def count_instruction(asm: str, mnemonic: str) -> int:
    """How many instructions named exactly ``mnemonic`` the assembly holds."""
    return len(re.findall(rf"^\s+{re.escape(mnemonic)}(?:\s|$)", asm, re.M))
