"""nqdq: exact, fast quantization for NumPy and CuPy arrays.

>>> import numpy as np, nqdq
>>> q = nqdq.quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), "mxfp4")
>>> nqdq.dequantize(q).shape
(2, 32)
"""

from . import fused
from .api import decode, dequantize, encode, quantize
from .delayed import AmaxHistory
from .formats import element_formats
from .matmul import matmul
from .quantized import FORMAT_VERSION, QuantizedTensor, load
from .schemes import Scheme, schemes

__version__ = "0.1.0"

__all__ = [
    "quantize",
    "dequantize",
    "AmaxHistory",
    "encode",
    "decode",
    "matmul",
    "fused",
    "load",
    "schemes",
    "element_formats",
    "QuantizedTensor",
    "Scheme",
    "FORMAT_VERSION",
    "__version__",
]
