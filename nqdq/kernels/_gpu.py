"""The one place the kernels get their GPU API from."""

from __future__ import annotations

from numba import cuda

__all__ = ["cuda"]
