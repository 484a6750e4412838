"""`tej.grouped_dense`: the differentiable expert layer of a mixture of experts, over `tej.grouped_gemm` (group sizes
on the device, no host sync anywhere in forward or backward).

y[rows of g] = x[rows of g] · kernel[g] (+ bias[g]) for x [M_total, K] (rows grouped by expert, in order), kernel
[G, K, N], bias [G, N], group_sizes int32 [G]; rows past the sizes' sum are zeros (and get no bias). Backward:
dx = dy · kernel[g]ᵀ per group (the grouped GEMM contracting kernel's N), dkernel[g] = x[rows of g]ᵀ · dy[rows of g]
(its weight-gradient form), dbias[g] = Σ dy[rows of g].

Quantization: none (bf16 / fp16 / fp32), or FP8 current scaling (`Float8CurrentScaling`, under `tej.autocast` or a
QuantizerSet of current-scaling quantizers): the forward GEMM multiplies E4M3 x (one scale) by E4M3 kernel[g]ᵀ (each
expert its own scale), dgrad multiplies the E5M2 (per the recipe's format) dy by E4M3 kernel[g]; the weight gradient
runs in the inputs' precision (its contraction is the grouped rows, which FP8's TN-only tensor cores cannot split at
arbitrary offsets). MXFP8, FP8 block and NVFP4 recipes run the same GEMMs emulated (grouped_gemm dequantizes their
quantized operands to bf16). Delayed scaling raises NotImplementedError.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .grouped_gemm import grouped_gemm
from .quantizers import ScalingMode
from .recipe import DelayedScaling, QuantizerSet, default_quantizer_set, get_autocast_recipe

_LAYER = "tej.grouped_dense"


def _quantizers(qs):
    if qs is None:
        if isinstance(get_autocast_recipe(), DelayedScaling):
            raise NotImplementedError(f"{_LAYER}: not yet supported: DelayedScaling (delayed scaling's amax state is "
                                      f"not carried through the grouped layer yet); use Float8CurrentScaling")
        qs = default_quantizer_set("grouped_dense")
    if not isinstance(qs, QuantizerSet):
        raise TypeError(f"{_LAYER}: quantizer_set must be a tej.QuantizerSet or None, got {type(qs).__name__}")
    if all(q is None for q in qs):
        return None
    modes = {q.scaling_mode if q is not None else None for q in qs}
    if None in modes or ScalingMode.DELAYED_TENSOR_SCALING in modes:
        names = sorted(m.name if m is not None else "None" for m in modes)
        raise NotImplementedError(f"{_LAYER}: not yet supported: quantizer set {names}; the grouped layer takes no "
                                  f"quantization, FP8 current scaling, or the emulated MXFP8 / FP8 block / NVFP4 "
                                  f"recipes (delayed scaling's amax state is not carried through it yet)")
    return qs


def _group_ids(group_sizes, m_total: int):
    """The group of each row (G for the rows past the sizes' sum), by the size rules of grouped_gemm."""
    ends = jnp.minimum(jnp.cumsum(jnp.maximum(group_sizes, 0)), m_total)
    return jnp.searchsorted(ends, jnp.arange(m_total), side="right")


def _forward(x, kernel, bias, group_sizes, qs):
    if qs is None:
        y = grouped_gemm(x, kernel, group_sizes, ((1,), (1,)))
    else:  # FP8 runs TN: kernel[g]ᵀ [N, K] quantized per expert
        y = grouped_gemm(x, jnp.swapaxes(kernel, 1, 2), group_sizes, ((1,), (2,)), lhs_quantizer=qs.x,
                         rhs_quantizer=qs.kernel)
    if bias is not None:
        ids = _group_ids(group_sizes, x.shape[0])
        rows_bias = jnp.take(jnp.concatenate([bias, jnp.zeros((1, bias.shape[1]), bias.dtype)]), ids, axis=0)
        y = (y.astype(jnp.float32) + rows_bias.astype(jnp.float32)).astype(y.dtype)
    return y


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _grouped_dense(x, kernel, bias, group_sizes, qs):
    return _forward(x, kernel, bias, group_sizes, qs)


def _fwd(x, kernel, bias, group_sizes, qs):
    return _forward(x, kernel, bias, group_sizes, qs), (x, kernel, bias, group_sizes)


def _bwd(qs, res, dy):
    x, kernel, bias, group_sizes = res
    dy = dy.astype(x.dtype)
    if qs is None:
        dx = grouped_gemm(dy, kernel, group_sizes, ((1,), (2,)))
    else:
        dx = grouped_gemm(dy, kernel, group_sizes, ((1,), (2,)), lhs_quantizer=qs.dgrad, rhs_quantizer=qs.kernel,
                          out_dtype=x.dtype)
    dkernel = grouped_gemm(x, dy, group_sizes, ((0,), (0,))).astype(kernel.dtype)
    dbias = None
    if bias is not None:
        ids = _group_ids(group_sizes, x.shape[0])
        dbias = jax.ops.segment_sum(dy.astype(jnp.float32), ids, num_segments=kernel.shape[0] + 1)[:-1]
        dbias = dbias.astype(bias.dtype)
    return dx.astype(x.dtype), dkernel, dbias, None


_grouped_dense.defvjp(_fwd, _bwd)


def grouped_dense(x, kernel, group_sizes, bias=None, quantizer_set=None):
    """The expert layer: x [M_total, K] (rows grouped by expert, in order), kernel [G, K, N], group_sizes int32 [G]
    (on the device), bias [G, N] or None → y [M_total, N] in x's dtype. Differentiable in x, kernel and bias (see the
    module docstring for the backward GEMMs); quantized by `quantizer_set`, else by the active `tej.autocast` recipe
    (none, or Float8CurrentScaling)."""
    if x.ndim != 2 or kernel.ndim != 3 or x.shape[1] != kernel.shape[1]:
        raise ValueError(f"{_LAYER}: x must be [M_total, K] and kernel [G, K, N] with the same K, got x "
                         f"{tuple(x.shape)} and kernel {tuple(kernel.shape)}")
    if bias is not None and tuple(bias.shape) != (kernel.shape[0], kernel.shape[2]):
        raise ValueError(f"{_LAYER}: bias must be [G, N] = {(kernel.shape[0], kernel.shape[2])}, got "
                         f"{tuple(bias.shape)}")
    group_sizes = jnp.asarray(group_sizes)
    if group_sizes.shape != (kernel.shape[0],) or not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise ValueError(f"{_LAYER}: group_sizes must be an integer [G] = [{kernel.shape[0]}], got "
                         f"{group_sizes.dtype}{tuple(group_sizes.shape)}")
    return _grouped_dense(x, kernel, bias, group_sizes.astype(jnp.int32), _quantizers(quantizer_set))
