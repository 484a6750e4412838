"""The quantization formats, one module each (SPEC §4): per-tensor FP8 (`fp8`), MXFP8 (`mxfp8`), NVFP4 (`nvfp4`),
FP8 block scaling (`fp8_block`), on the shared `base`. A module holds its format's quantizer, tensor class, shapes
and the fake outputs of its quantizing ops, and registers them (`base.register_format`) when imported.

A new format is one module and one import line below; the import order is the order in which messages list the
quantizers, and `__all__` (the package's public names) follows from what the modules registered."""
from . import base
from .base import QuantizedTensor, Quantizer
from .fp8 import *  # noqa: F401,F403
from .mxfp8 import *  # noqa: F401,F403
from .nvfp4 import *  # noqa: F401,F403
from .fp8_block import *  # noqa: F401,F403

__all__ = (["Quantizer"] + [c.__name__ for c in base.QUANTIZER_CLASSES] + ["QuantizedTensor"]
           + list(base.TENSOR_CLASSES))
