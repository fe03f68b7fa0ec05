"""The named kernel choices of the quantize plan: each place where more than one kernel design
remains because the hardware or the input calls for it, with the reason and the measured
figure of each, and the design the plan takes when the caller leaves the choice automatic.

A caller (a test, a benchmark) selects a design by argument, never by a module switch::

    get_plan(shape, kind, scheme, choices=KernelChoices(per_channel=PerChannel.RING))
    quantize(x, scheme, choices=KernelChoices(per_tensor="two_pass"))

A selected design runs wherever it can run the case; where it cannot (its geometry does not
fit the shape, the device lacks what it needs, a stochastic rounding it does not implement,
a scheme it does not serve) the case takes its plain fallback, ``TWO_PASS``, never another
named design. The choices are part of the plan cache key. Which kernels each case launches:
the rule table of ``nqdq.gpu.quantize.plan``.

Figures: NVIDIA H100 80GB HBM3, bf16 input, % of a device-to-device copy of the same bytes
(input read, codes and scales written); docs/design/per-channel.md and
docs/design/per-tensor-dynamic.md give the commands that reproduce them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class PerChannel(enum.Enum):
    """Float per-channel scales, channel axis last, rows of whole 16-byte units, rounding to
    nearest even (int8_column; e4m3 / int4 / e2m1 with ``granularity="column"``). A channel's
    scale needs its amax down every row before any of its codes can be written.

    Automatic: CLUSTER where the device has thread-block clusters (sm_90+, no cluster launch
    refused in this process) and its geometry fits; else RING where the device has
    ``cp.async`` (sm_80+) and a stripe of columns takes more than one chunk of rows; else
    SINGLE_CHUNK where one block holds a stripe's rows; else TWO_PASS.
    """

    # column_cluster.py: a stripe of columns down all the rows is one cluster of 16 blocks (8
    # on GPUs of fewer than 132 SMs); the stripe's amax meets in the cluster's distributed
    # shared memory, so the input is read once and no block waits outside its cluster.
    # 90 % / 86 % of copy at 8192x8192 / 16384x7168.
    CLUSTER = "cluster"
    # column_ring.py: persistent blocks each hold their items in a shared-memory ring while a
    # stripe's chunks meet in a global workspace. The design where a cluster launch is refused
    # (an MPS thread limit, a green context) or missing (sm_80 / sm_89): 74-76 % of copy at
    # 8192x8192 / 16384x7168. The register one-pass kernel that held the chunks in registers
    # across the same wait measured 51-53 % there and was removed; such shapes on devices
    # without cp.async take TWO_PASS.
    RING = "ring"
    # columns.py, column_onepass: one block per stripe holds every row of it in registers (at
    # most 16 units a thread), no workspace, no wait, one launch: decode-size inputs,
    # 64x7168 in 6.2 us against 20.4 us for TWO_PASS (host-bound). Automatically only where
    # the ring's stripe would be one chunk (the ring's workspace and wait buy nothing there).
    SINGLE_CHUNK = "single_chunk"
    # columns.py: column_amax -> finalize -> column_encode, the input read twice; any device,
    # any number of rows. 42 / 46 % of copy at 8192x8192 / 16384x7168.
    TWO_PASS = "two_pass"


class PerTensor(enum.Enum):
    """Dynamic per-tensor scales over whole 16-byte units: float tensor scales (fp8_tensor,
    int / fp4 tensor scales) and NVFP4's tensor scale S_enc. Every code needs the amax of the
    whole tensor.

    Automatic: ONE_LAUNCH where the input fits one block an SM with at most ``GRID_MAX_U``
    items a thread (decode sizes); else, float scales: RESIDENT where the device takes a
    cooperative launch with ``cp.async`` (sm_80+, no cooperative launch refused in this
    process) and the rounding is to nearest even; NVFP4: AMAX_IN_GROUPS below
    ``NVFP4_SENC_MAX_UNITS`` 16-byte units; else TWO_PASS.
    """

    # grid.py: one plain launch whose blocks share the amax (a block that waits too long
    # computes the missing blocks' amaxes itself, so no residency is assumed). 64x7168, host
    # time a call: fp8_tensor 14.16 -> 8.92 us, nvfp4 11.46 -> 9.51 us against TWO_PASS /
    # AMAX_IN_GROUPS.
    ONE_LAUNCH = "one_launch"
    # tensor_resident.py (float scales only): one cooperative launch holding 39 MB of the
    # input in registers and shared memory across the grid's amax, re-reading the rest last
    # round first. 62-63 % of copy at 8192x8192 / 16384x7168 (TWO_PASS 56 / 58 %), 63-65 % at
    # 4096x7168 (51 %). NVFP4 measured no faster in it (its block encode bounds it), so it
    # has no RESIDENT path.
    RESIDENT = "resident"
    # NVFP4 only: tensor_amax -> lastaxis_groups, each group-kernel block computing S_enc from
    # the amax partials itself (two launches, no finalize). 64x7168 host 14.5 -> 11.5 us,
    # device 11.0 -> 7.7 us; but 8192x8192 / 16384x7168 49 / 51 -> 46 / 47 % of copy (every
    # block waits for the partials), hence the size bound of the automatic choice.
    AMAX_IN_GROUPS = "amax_in_groups"
    # tensor_amax -> finalize -> static_encode (float) / lastaxis_groups (NVFP4): the input
    # read twice, any device, stochastic rounding included.
    TWO_PASS = "two_pass"


@dataclass(frozen=True)
class KernelChoices:
    """The designs a quantize plan takes where more than one remains; None: automatic (by the
    device and the input, as each enum's docstring says). Members may be given by value
    (``KernelChoices(per_channel="ring")``)."""

    per_channel: PerChannel | None = None
    per_tensor: PerTensor | None = None

    def __post_init__(self):
        for field, enum_type in (("per_channel", PerChannel), ("per_tensor", PerTensor)):
            value = getattr(self, field)
            if value is not None and not isinstance(value, enum_type):
                object.__setattr__(self, field, enum_type(value))

    def allows(self, design) -> bool:
        """Whether ``design`` (a PerChannel or PerTensor member) may run: the choice of its
        kind is automatic or is that design."""
        chosen = self.per_channel if isinstance(design, PerChannel) else self.per_tensor
        return chosen is None or chosen is design


AUTO = KernelChoices()
