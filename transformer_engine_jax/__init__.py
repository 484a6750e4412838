"""transformer_engine_jax (`tej`): the project's fused activation / normalization + quantization kernels for JAX,
through XLA's typed FFI, from the same torch-free core as transformer_engine_torch. Nothing here imports torch."""
# jaxlib first: it loads its own CUDA runtime, which our _ffi then shares (same soname). Loading _ffi first binds the
# toolkit's older libcudart.so.13 into the process, and jaxlib's CUDA plugin crashed on it (segfault at import, H100).
import jax.numpy  # noqa: F401  (isort: skip)
from .activation_types import ACTIVATIONS, ActivationType, activation_of
from .quantizers import (BlockScaleQuantizer, CurrentScaleQuantizer, DelayedScaleQuantizer, MXFP8Quantizer,
                         NVFP4Quantizer, Quantizer, QuantizeLayout, QuantizerFactory, ScalingMode)
from .scaled_tensor import ScaledTensor
from .activation import activation
from .cpp_extensions import act_lu, dact_lu, quantize, quantize_dact_dbias, quantize_dbias
from .dequantize import dequantize
from .normalization import layernorm, normalization_bwd, normalization_fwd
from .gemm import gemm
from .grouped_gemm import grouped_gemm
from .recipe import (DelayedScaling, Float8BlockScaling, Float8CurrentScaling, Format, MXFP8BlockScaling,
                     NVFP4BlockScaling, QuantizerSet, autocast, get_autocast_recipe, make_quantizer_set,
                     update_quantizer_set)
from .dense import dense
from .mlp import mlp
from .layernorm_dense import layernorm_dense, layernorm_mlp
from .grouped_dense import grouped_dense
from . import collective
from . import collective_nccl


def __getattr__(name):
    """`tej.flax` (Flax NNX modules) loads on first access: the package itself imports without flax."""
    if name == "flax":
        import importlib
        return importlib.import_module(".flax", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
