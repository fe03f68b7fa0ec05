"""Programmatic dependent launch (sm_90+) by ``griddepcontrol``, with its twins.

A grid launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (``runtime.launch``,
``compile_sequence``'s ``pdl``) may start while the kernel before it in the stream runs, once
that kernel's blocks have all executed ``griddep_launch`` (or exited); ``griddep_wait`` blocks
until that kernel has completed and its memory is visible. Both do nothing in a grid launched
without the attribute (ptxas rejects them for targets older than sm_90). Twins: nothing (the
simulator's grids run one after another, and no grid is launched as a dependent one on AMD).
"""

from __future__ import annotations

from ..runtime.target import PTX
from ..runtime.target import device_twin as _twin

if PTX:
    from ._asm import void_asm

    griddep_wait = void_asm("griddepcontrol.wait;")
    griddep_launch = void_asm("griddepcontrol.launch_dependents;")
else:

    @_twin
    def griddep_wait():
        """Twin: nothing (the simulator's grids run one after another, and no grid is launched
        as a dependent one on AMD: the kernel before has ended)."""

    @_twin
    def griddep_launch():
        """Twin: nothing (no dependent launch to allow)."""
