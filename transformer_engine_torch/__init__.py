"""transformer_engine_torch: fused activations quantized to FP8, quantizers, quantized tensors, cuBLASLt GEMMs.

`import transformer_engine_torch as tex; y = tex.gelu(x, quantizer)`; layers `tex.Linear`, `tex.MLP` run
quantized inside `with tex.autocast(recipe=tex.Float8CurrentScaling()):`. Importing needs no GPU and no driver:
nothing here queries a device. SPEC: shared/SPEC.md.
"""
import torch  # noqa: F401  (first: loads libc10/libtorch, which _C links against)

from . import _C  # noqa: F401  (loads the `te` operator library)
from . import _ops  # noqa: F401  (fake kernels, autograd)
from .activations import *  # noqa: F401,F403
from .activations import __all__ as _act_all
from .cast import *  # noqa: F401,F403
from .cast import __all__ as _cast_all
from .dtypes import DType
from .enums import FP8BwdTensors, FP8FwdTensors
from .gemm import *  # noqa: F401,F403
from .normalization import *  # noqa: F401,F403
from .normalization import __all__ as _norm_all
from .gemm import __all__ as _gemm_all
from .collective import all_gather_gemm, gemm_reduce_scatter  # noqa: F401
from .formats import *  # noqa: F401,F403  (quantizers and quantized tensors, one module per format)
from .formats import __all__ as _formats_all
from . import jit  # noqa: F401  (transformer_engine_torch.jit, SPEC §7)
from .recipe import (DelayedScaling, Float8BlockScaling, Float8CurrentScaling, Format, MXFP8BlockScaling,
                     NVFP4BlockScaling, Recipe, autocast, fp8_autocast)
from . import modules  # noqa: F401
from .modules import MLP, Linear, init_fp8_state
from .grouped_linear import GroupedLinear  # noqa: F401  (MoE experts over the grouped GEMM)
from .norm_layers import LayerNorm, LayerNormLinear, LayerNormMLP, RMSNorm  # noqa: F401  (issue 35)
from .transformer import TransformerLayer  # noqa: F401
from .checkpoint import load_te_state_dict  # noqa: F401  (TE checkpoints, issue 36)

__version__ = "0.1.0"

__all__ = (["DType", "FP8FwdTensors", "FP8BwdTensors"] + _formats_all
           + ["Format", "Recipe", "DelayedScaling", "Float8CurrentScaling", "MXFP8BlockScaling", "NVFP4BlockScaling",
              "Float8BlockScaling", "autocast", "fp8_autocast", "Linear", "MLP", "init_fp8_state",
              "LayerNorm", "RMSNorm", "LayerNormLinear", "LayerNormMLP", "TransformerLayer", "load_te_state_dict",
              "all_gather_gemm", "gemm_reduce_scatter"]
           + _act_all + _cast_all + _gemm_all + _norm_all)
