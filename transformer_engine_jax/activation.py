"""`tej.activation`: a differentiable activation whose forward and backward are the fused kernels.

Forward: act_lu (with a quantizer: quantized in the same kernel, then dequantized to x's dtype — the values a
following GEMM sees). Backward: the fused dact kernel, dx = act'(x) * dy, straight through the quantization.
The quantizer's state is not updated here (a delayed-scaling quantizer's new amax comes from act_lu's ScaledTensor).
"""
from __future__ import annotations

import functools

import jax

from .activation_types import activation_of
from .cpp_extensions import act_lu, dact_lu


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _activation(x, name, quantizer):
    y = act_lu(x, name, quantizer)
    return y if quantizer is None else y.dequantize(x.dtype)


def _activation_fwd(x, name, quantizer):
    return _activation(x, name, quantizer), (x, quantizer)


def _activation_bwd(name, residuals, dy):
    x, quantizer = residuals
    return dact_lu(dy.astype(x.dtype), x, name), jax.tree_util.tree_map(jax.numpy.zeros_like, quantizer)


_activation.defvjp(_activation_fwd, _activation_bwd)


def activation(x, activation_type=("gelu",), quantizer=None):
    """act(x) for x [..., A, K] (A = 2 for gated activations) -> [..., K], differentiable in x."""
    return _activation(x, activation_of(activation_type).name, quantizer)
