"""Delayed scaling: a per-tensor scale from the amax of earlier steps (TransformerEngine's
FP8 recipe), in NumPy / CuPy terms.

Each step quantizes with the scale the history gives and records this step's amax in the
history's current slot, in the same pass (``quantize(..., amax_out=)``)::

    h = nqdq.AmaxHistory("fp8_tensor", length=16, xp=cupy)
    for x in steps:
        q = nqdq.quantize(x, "fp8_tensor", scale=h.scale, amax_out=h.slot)
        h.update()

The history is a float32 array of ``length`` amaxes on the caller's device (``xp``: numpy or
cupy; nqdq imports neither for you), a ring whose current slot ``slot`` is a one-element
view. ``update()`` computes the next scale from the history, ``amax * 2^margin / max`` with
``amax`` the history's max (``algo="max"``) or the slot just written
(``"most_recent"``), and ``max`` the scheme's largest code (448 for e4m3, 127 for int8,
6 * 448 = 2688 for NVFP4's tensor scale S_dec, whose division is done as the dynamic
path does it, 1 / (2688 / amax)); an amax of zero or one that is not finite keeps the scale
it had (TransformerEngine's rule), which starts at 1. Everything stays on the device: no
host reads (``quantize`` reads ``scale`` to check it).
"""

from __future__ import annotations

import numpy as np

from .schemes import resolve_scheme

__all__ = ["AmaxHistory"]

_ALGOS = ("max", "most_recent")


class AmaxHistory:
    """A fixed-length history of a tensor's amax and the scale it gives (module docstring).

    Parameters
    ----------
    scheme : a scheme with one tensor scale: ``"fp8_tensor"``, ``"nvfp4"``, or an element
        format with ``granularity="tensor"`` passed as a resolved :class:`nqdq.Scheme`.
    length : entries kept (at least 1).
    algo : ``"max"`` (over the history) or ``"most_recent"``.
    margin : the scale is multiplied by 2^margin (headroom; an int, may be negative).
    xp : the array module of the history (``numpy`` or ``cupy``).
    """

    def __init__(self, scheme="fp8_tensor", length=1024, *, algo="max", margin=0, xp=np):
        sch = scheme if not isinstance(scheme, str) else resolve_scheme(scheme, static_scale=True)
        if not (sch.granularity == "tensor" or sch.is_nvfp4):
            raise ValueError(f"scheme must have one tensor scale ('fp8_tensor', 'nvfp4', ...), got {sch.name!r}")
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
            raise ValueError(f"length must be a positive int, got {length!r}")
        if algo not in _ALGOS:
            raise ValueError(f"algo must be one of {_ALGOS}, got {algo!r}")
        if isinstance(margin, bool) or not isinstance(margin, (int, np.integer)):
            raise ValueError(f"margin must be an int, got {margin!r}")
        self.scheme, self.algo, self.margin, self.xp = sch, algo, int(margin), xp
        self.history = xp.zeros(int(length), xp.float32)
        self._pos = 0
        self._scale = xp.ones(1, xp.float32)
        elem = sch.element
        top = 6 * 448 if sch.is_nvfp4 else elem.max_value if elem.kind == "float" else elem.qrange(sch.symmetric)[1]
        self._top = np.float32(top)  # the largest code magnitude (the dynamic scale's divisor)

    @property
    def slot(self):
        """The one-element view of the history that this step's amax goes to (``amax_out``)."""
        return self.history[self._pos : self._pos + 1]

    @property
    def scale(self):
        """The scale for this step (float32, one element, on the history's device)."""
        return self._scale

    def update(self):
        """After this step's call: the next scale from the history, then the next slot."""
        xp = self.xp
        amax = self.history.max(keepdims=True) if self.algo == "max" else self.slot.copy()
        amax = (amax * np.float32(2.0**self.margin)).astype(xp.float32)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):  # (NumPy; not used where not usable)
            if self.scheme.is_nvfp4:
                new = (np.float32(1) / (self._top / amax)).astype(xp.float32)
            else:
                new = (amax / self._top).astype(xp.float32)
        usable = xp.isfinite(amax) & (amax > 0) & xp.isfinite(new) & (new > 0)
        self._scale = xp.where(usable, new, self._scale).astype(xp.float32)
        self._pos = (self._pos + 1) % self.history.size
