"""Cast functions (SPEC §4.10): quantize, dequantize, bgrad_quantize, amax and the delayed-scaling update."""
from __future__ import annotations

import torch

from ._ops import call
from .dtypes import FLOAT_DTYPES, as_fp8_dtype, to_torch_dtype
from .quantizers import (Float8BlockQuantizer, Float8CurrentScalingQuantizer, MXFP8Quantizer, NVFP4Quantizer,
                         check_quantizer)
from .tensors import (Float8BlockwiseQTensor, Float8Tensor, MXFP8Tensor, NVFP4Tensor, QuantizedTensor,
                      _transposed_shape, fp8_block_scale_shapes, mxfp8_scale_shapes, nvfp4_data_shapes,
                      nvfp4_scale_shapes, swizzle_mx_scales, swizzle_nvfp4_scales)

# Looked up once rather than through three attribute lookups per call.
_QUANTIZE = torch.ops.te.quantize.default
_BGRAD_QUANTIZE = torch.ops.te.bgrad_quantize.default


def _check_tensor(op, name, t, float_only=False):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if float_only and t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} must be float32, float16 or bfloat16, got {t.dtype} with shape "
                        f"{tuple(t.shape)} on {t.device}")


def _spec_for(tensor, quantizer, noop=None):
    """The quantizer's spec; current scaling with amax reduction computes and all-reduces the amax first."""
    if isinstance(quantizer, Float8CurrentScalingQuantizer) and quantizer.with_amax_reduction:
        amax = torch.zeros(1, dtype=torch.float32, device=tensor.device)
        torch.ops.te.compute_amax.default(tensor, amax)
        quantizer._reduce_amax(amax)
        return quantizer._spec(noop, amax=amax)
    return quantizer._spec(noop)


def quantize(tensor, quantizer, output=None, noop=None):
    """Quantize `tensor`. With `output`, its buffers are reused (missing usages allocated, unwanted ones
    dropped); with `noop` (float32 [1]) equal to 1.0 nothing is written (CUDA-graph weight caching)."""
    _check_tensor("quantize", "tensor", tensor, float_only=True)
    if quantizer is None:
        raise ValueError("quantize: quantizer is None; use the tensor as it is")
    check_quantizer("quantize", quantizer, allow_none=False)
    if output is None and noop is None:
        # A quantizer with neither usage is refused by the op (ValueError) before anything is allocated.
        return quantizer._wrap(call(_QUANTIZE, (tensor, *_spec_for(tensor, quantizer)), quantizer._pieces()),
                               tensor.dtype)
    # Checked here, before `output` loses the buffers this quantizer does not want.
    quantizer._check_usage("quantize")
    if output is None:
        output = quantizer.make_empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    if isinstance(quantizer, MXFP8Quantizer):
        expected, fill = MXFP8Tensor, _mxfp8_buffers
    elif isinstance(quantizer, Float8BlockQuantizer):
        expected, fill = Float8BlockwiseQTensor, _fp8_block_buffers
    elif isinstance(quantizer, NVFP4Quantizer):
        expected, fill = NVFP4Tensor, None
    else:
        expected, fill = Float8Tensor, _float8_buffers
    if not isinstance(output, expected):
        raise TypeError(f"quantize: output must be a {expected.__name__} for {type(quantizer).__name__}, "
                        f"got {type(output).__name__}")
    if tuple(output.shape) != tuple(tensor.shape):
        raise ValueError(f"quantize: output has shape {tuple(output.shape)} but the input has shape "
                         f"{tuple(tensor.shape)}")
    if expected is NVFP4Tensor:
        buffers, amax_pair = _nvfp4_buffers(output, tensor, quantizer)
        torch.ops.te.quantize_into.default(tensor, *quantizer._spec(noop, amax=amax_pair), **buffers)
        return output
    buffers = fill(output, tensor, quantizer)
    # The buffers by name: the spec before them may stop short of its last field (Quantizer._spec).
    torch.ops.te.quantize_into.default(tensor, *_spec_for(tensor, quantizer, noop), **buffers)
    return output


def _float8_buffers(output, tensor, quantizer):
    """Float8Tensor buffers for quantize_into: missing usages allocated, unwanted ones dropped."""
    dev = dict(dtype=torch.uint8, device=tensor.device)
    if quantizer.rowwise_usage and output._data is None:
        output._data = torch.empty(tensor.shape, **dev)
    if quantizer.columnwise_usage and output._transpose is None:
        output._transpose = torch.empty(_transposed_shape(tensor.shape), **dev)
    if not quantizer.rowwise_usage:
        output._data = None
    if not quantizer.columnwise_usage:
        output._transpose = None
    output._transpose_invalid = output._transpose is None
    if output._scale_inv is None:
        output._scale_inv = torch.empty(1, dtype=torch.float32, device=tensor.device)
    output._fp8_dtype = quantizer.dtype
    return dict(row_data=output._data, row_scale_inv=output._scale_inv, col_data=output._transpose)


def _mxfp8_buffers(output, tensor, quantizer):
    """MXFP8Tensor buffers for quantize_into: missing usages allocated, unwanted ones dropped; the scale layout
    becomes the quantizer's (the kernel writes every scale byte, padding included)."""
    rs, cs = mxfp8_scale_shapes(tensor.shape)
    for usage, pieces in ((quantizer.rowwise_usage, (("_rowwise_data", tensor.shape), ("_rowwise_scale_inv", rs))),
                          (quantizer.columnwise_usage, (("_columnwise_data", tensor.shape),
                                                        ("_columnwise_scale_inv", cs)))):
        for name, shape in pieces:
            if not usage:
                setattr(output, name, None)
            elif getattr(output, name) is None:
                setattr(output, name, torch.empty(shape, dtype=torch.uint8, device=tensor.device))
    output._fp8_dtype = quantizer.dtype
    output._with_gemm_swizzled_scales = quantizer.optimize_for_gemm
    return dict(row_data=output._rowwise_data, row_scale_inv=output._rowwise_scale_inv,
                col_data=output._columnwise_data, col_scale_inv=output._columnwise_scale_inv)


def _fp8_block_buffers(output, tensor, quantizer):
    """Float8BlockwiseQTensor buffers for quantize_into: missing usages allocated, unwanted ones dropped. The
    output's block layout must be the quantizer's: its scale buffers have other shapes otherwise."""
    two_d = quantizer.block_scaling_dim == 2
    if output._is_2D_scaled != two_d and (output._rowwise_data is not None or output._columnwise_data is not None):
        raise ValueError(f"quantize: output Float8BlockwiseQTensor{list(output.shape)} holds "
                         f"{'128x128' if output._is_2D_scaled else '1x128'}-block scales but the quantizer uses "
                         f"block_scaling_dim={quantizer.block_scaling_dim}; make the output with this quantizer "
                         f"(make_empty) or quantize without output=")
    rs, cs = fp8_block_scale_shapes(tensor.shape, two_d)
    u8, f32 = dict(dtype=torch.uint8, device=tensor.device), dict(dtype=torch.float32, device=tensor.device)
    for usage, pieces in ((quantizer.rowwise_usage, (("_rowwise_data", tensor.shape, u8),
                                                     ("_rowwise_scale_inv", rs, f32))),
                          (quantizer.columnwise_usage, (("_columnwise_data", _transposed_shape(tensor.shape), u8),
                                                        ("_columnwise_scale_inv", cs, f32)))):
        for name, shape, kw in pieces:
            if not usage:
                setattr(output, name, None)
            elif getattr(output, name) is None:
                setattr(output, name, torch.empty(shape, **kw))
    output._fp8_dtype = quantizer.dtype
    output._is_2D_scaled = two_d
    return dict(row_data=output._rowwise_data, row_scale_inv=output._rowwise_scale_inv,
                col_data=output._columnwise_data, col_scale_inv=output._columnwise_scale_inv)


def _nvfp4_buffers(output, tensor, quantizer):
    """NVFP4Tensor buffers for quantize_into: missing usages allocated, unwanted ones dropped. The two amaxes are
    written as one float32 [2] pair: when the tensor's `_amax_rowwise` / `_amax_columnwise` are not already the two
    halves of one such buffer (as make_empty makes them), they are rebound to the halves of a new one."""
    (rs, cs), (rd, cd) = nvfp4_scale_shapes(tensor.shape), nvfp4_data_shapes(tensor.shape)
    for usage, pieces in ((quantizer.rowwise_usage, (("_rowwise_data", rd), ("_rowwise_scale_inv", rs))),
                          (quantizer.columnwise_usage, (("_columnwise_data", cd), ("_columnwise_scale_inv", cs)))):
        for name, shape in pieces:
            if not usage:
                setattr(output, name, None)
            elif getattr(output, name) is None:
                setattr(output, name, torch.empty(shape, dtype=torch.uint8, device=tensor.device))
    ar, ac = output._amax_rowwise, output._amax_columnwise
    base = next((t for t in (ar, ac) if t is not None), None)
    pair = None
    if base is not None and base._base is not None and base._base.numel() == 2 and base._base.dtype == torch.float32:
        cand = base._base
        if ((ar is None or ar.data_ptr() == cand.data_ptr()) and
                (ac is None or ac.data_ptr() == cand.data_ptr() + 4)):
            pair = cand
    if pair is None:
        pair = torch.zeros(2, dtype=torch.float32, device=tensor.device)
    output._amax_rowwise = pair[0:1] if quantizer.rowwise_usage else None
    output._amax_columnwise = pair[1:2] if quantizer.columnwise_usage else None
    output._with_gemm_swizzled_scales = quantizer.optimize_for_gemm
    output._quantizer = quantizer.copy()
    return (dict(row_data=output._rowwise_data, row_scale_inv=output._rowwise_scale_inv,
                 col_data=output._columnwise_data, col_scale_inv=output._columnwise_scale_inv), pair)


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
    _check_tensor("bgrad_quantize", "input", input, float_only=True)
    check_quantizer("bgrad_quantize", quantizer)
    if quantizer is None:
        k = input.shape[-1] if input.dim() else 1
        return input.reshape(-1, k).float().sum(0).to(input.dtype), input
    outs = call(_BGRAD_QUANTIZE, (input, *_spec_for(input, quantizer)), 1 | quantizer._pieces() << 1)
    return outs[0], quantizer._wrap(outs[1:], input.dtype)


def compute_amax(input, amax):
    """amax[0] = max |input| (NaN ignored), overwriting amax."""
    _check_tensor("compute_amax", "input", input, float_only=True)
    _check_tensor("compute_amax", "amax", amax)
    torch.ops.te.compute_amax.default(input, amax)


def fused_amax_and_scale_update_after_reduction(amax_reduction_buffer, amax_histories, scales,
                                                amax_compute_algo, fp8_dtype, margin):
    """Delayed-scaling update of every (history, scale) pair (SPEC §4.3), in place."""
    fp8_dtype = as_fp8_dtype(fp8_dtype, "fused_amax_and_scale_update_after_reduction: fp8_dtype")
    torch.ops.te.fused_amax_and_scale_update.default(amax_reduction_buffer, list(amax_histories), list(scales),
                                             str(amax_compute_algo), int(fp8_dtype), float(margin))


def fp8_transpose(input, dtype, *, out=None):
    """2-D transpose of FP8 bytes: the flattened [M, K] input becomes [K, M] (uint8)."""
    _check_tensor("fp8_transpose", "input", input)
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
