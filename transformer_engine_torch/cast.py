"""Cast functions (SPEC §4.10): quantize (formats/base.py), dequantize, bgrad_quantize, amax and the delayed-scaling
update."""
from __future__ import annotations

import torch

from ._ops import call
from .dtypes import FLOAT_DTYPES, as_fp8_dtype, to_torch_dtype
from .formats.base import QuantizedTensor, check_quantizer, check_tensor, quantize
from .formats.mxfp8 import MXFP8Tensor, swizzle_mx_scales
from .formats.nvfp4 import NVFP4Tensor, swizzle_nvfp4_scales

_BGRAD_QUANTIZE = torch.ops.te.bgrad_quantize.default  # looked up once rather than per call


def swizzle_scales_for_gemm_(tensor):
    """Rewrites an MXFP8 tensor's compact scales in the GEMM-swizzled layout (SPEC §4.8), in place: the scale
    tensors keep their storage (CUDA graphs that captured them stay valid). A no-op when already swizzled."""
    if not isinstance(tensor, (MXFP8Tensor, NVFP4Tensor)):
        raise TypeError(f"swizzle_scales_for_gemm_: expected an MXFP8Tensor or an NVFP4Tensor, "
                        f"got {type(tensor).__name__}")
    if tensor._with_gemm_swizzled_scales:
        return tensor
    if isinstance(tensor, NVFP4Tensor):
        for s in (tensor._rowwise_scale_inv, tensor._columnwise_scale_inv):
            if s is not None and s.numel():
                s.copy_(swizzle_nvfp4_scales(s))
        tensor._with_gemm_swizzled_scales = True
        return tensor
    for s, columnwise in ((tensor._rowwise_scale_inv, False), (tensor._columnwise_scale_inv, True)):
        if s is not None and s.numel():
            s.copy_(swizzle_mx_scales(s, columnwise))
    tensor._with_gemm_swizzled_scales = True
    return tensor


def dequantize(input, otype):
    """Plain tensor of DType (or torch dtype) `otype` from a quantized tensor (SPEC §4.9)."""
    if not isinstance(input, QuantizedTensor):
        raise TypeError(f"dequantize: input must be a quantized tensor, got {type(input).__name__}")
    dtype = to_torch_dtype(otype, "dequantize: otype")
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dequantize: otype must be float32, float16 or bfloat16 (kFloat32, kFloat16, kBFloat16), got "
                        f"{dtype} for {type(input).__name__}{list(input.shape)}; dequantize to a float dtype, then cast")
    return input.dequantize(dtype=dtype)


def bgrad_quantize(input, quantizer):
    """(grad_bias, quantized): grad_bias = FP32 sum over all rows of `input`, rounded to its dtype."""
    check_tensor("bgrad_quantize", "input", input, float_only=True)
    check_quantizer("bgrad_quantize", quantizer)
    if quantizer is None:
        k = input.shape[-1] if input.dim() else 1
        return input.reshape(-1, k).float().sum(0).to(input.dtype), input
    outs = call(_BGRAD_QUANTIZE, (input, *quantizer._spec_for(input)), 1 | quantizer._pieces() << 1)
    return outs[0], quantizer._wrap(outs[1:], input.dtype)


def compute_amax(input, amax):
    """amax[0] = max |input| (NaN ignored), overwriting amax."""
    check_tensor("compute_amax", "input", input, float_only=True)
    check_tensor("compute_amax", "amax", amax)
    torch.ops.te.compute_amax.default(input, amax)


def fused_amax_and_scale_update_after_reduction(amax_reduction_buffer, amax_histories, scales,
                                                amax_compute_algo, fp8_dtype, margin):
    """Delayed-scaling update of every (history, scale) pair (SPEC §4.3), in place."""
    fp8_dtype = as_fp8_dtype(fp8_dtype, "fused_amax_and_scale_update_after_reduction: fp8_dtype")
    torch.ops.te.fused_amax_and_scale_update.default(amax_reduction_buffer, list(amax_histories), list(scales),
                                             str(amax_compute_algo), int(fp8_dtype), float(margin))


def fp8_transpose(input, dtype, *, out=None):
    """2-D transpose of FP8 bytes: the flattened [M, K] input becomes [K, M] (uint8)."""
    check_tensor("fp8_transpose", "input", input)
    as_fp8_dtype(dtype, "fp8_transpose: dtype")
    if input.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        input = input.view(torch.uint8)
    if out is None:
        return torch.ops.te.fp8_transpose.default(input)
    torch.ops.te.fp8_transpose_into.default(input, out.view(torch.uint8) if out.dtype != torch.uint8 else out)
    return out


def create_empty_quantized_tensor(quantizer, shape, dtype, device, pin_memory=False):
    """Uninitialised quantized tensor of `shape` (delayed FP8: scale_inv = 1/scale)."""
    check_quantizer("create_empty_quantized_tensor", quantizer, allow_none=False)
    return quantizer.make_empty(shape, dtype=to_torch_dtype(dtype), device=device, pin_memory=pin_memory)


__all__ = ["quantize", "dequantize", "bgrad_quantize", "compute_amax",
           "fused_amax_and_scale_update_after_reduction", "fp8_transpose", "create_empty_quantized_tensor",
           "swizzle_scales_for_gemm_"]
