"""`tej.grouped_dense`: the differentiable expert layer of a mixture of experts, over `tej.grouped_gemm` (group sizes
on the device, no host sync anywhere in forward or backward).

y[rows of g] = x[rows of g] · kernel[g] (+ bias[g]) for x [M_total, K] (rows grouped by expert, in order), kernel
[G, K, N], bias [G, N], group_sizes int32 [G]; rows past the sizes' sum are zeros (and get no bias). Backward:
dx = dy · kernel[g]ᵀ per group (the grouped GEMM contracting kernel's N), dkernel[g] = x[rows of g]ᵀ · dy[rows of g]
(its weight-gradient form), dbias[g] = Σ dy[rows of g].

Quantization: none (bf16 / fp16 / fp32); FP8 per tensor, delayed or current scaling (under `tej.autocast` or a
QuantizerSet): the forward GEMM multiplies E4M3 x (one scale) by E4M3 kernel[g]ᵀ (current scaling: each expert its
own scale), dgrad multiplies the E5M2 (per the recipe's format) dy by E4M3 kernel[g]; the weight gradient runs in the
inputs' precision (its contraction is the grouped rows, which FP8's TN-only tensor cores cannot split at arbitrary
offsets). Delayed scaling casts with the set's scales and returns the observed amaxes as the quantizer set's
cotangent (pass `quantizer_set=` and differentiate w.r.t. it, then `tej.update_quantizer_set`, as for `tej.dense`).
FP8 block recipes (x and dy with 1x128 blocks, kernel[g] with 128x128 tiles) run both GEMMs natively on the block
kernel; MXFP8 and NVFP4 recipes run them emulated (grouped_gemm dequantizes their operands to bf16).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .cpp_extensions import quantize
from .dense import qs_cotangent
from .grouped_gemm import grouped_gemm
from .quantizers import QuantizeLayout, ScalingMode
from .recipe import QuantizerSet, default_quantizer_set
from .scaled_tensor import ScaledTensor

_LAYER = "tej.grouped_dense"


_PER_TENSOR = (ScalingMode.DELAYED_TENSOR_SCALING, ScalingMode.CURRENT_TENSOR_SCALING)


def _quantizers(qs):
    if qs is None:
        qs = default_quantizer_set("grouped_dense")  # (under a delayed recipe it raises: the caller carries the set)
    if not isinstance(qs, QuantizerSet):
        raise TypeError(f"{_LAYER}: quantizer_set must be a tej.QuantizerSet or None, got {type(qs).__name__}")
    if all(q is None for q in qs):
        return None
    if any(q is None for q in qs):
        raise ValueError(f"{_LAYER}: a QuantizerSet needs all of x, kernel and dgrad or none of them, got {qs}")
    return qs


def _per_tensor(qs) -> bool:
    return qs is not None and qs.x.scaling_mode in _PER_TENSOR


def _experts(w, q):
    """w [G, R, C] quantized expert by expert with the per-tensor quantizer q (rowwise copies): a ScaledTensor with
    scale_inv [G] (current scaling: each expert its own scale; delayed: the one scale), and the largest amax."""
    parts = [quantize(w[g], q) for g in range(w.shape[0])]
    amax = jnp.max(jnp.stack([p.amax.reshape(()) for p in parts])).reshape(1)
    st = ScaledTensor(jnp.stack([p.data for p in parts]), jnp.concatenate([p.scale_inv.reshape(-1) for p in parts]),
                      None, None, amax, None, q.scaling_mode, QuantizeLayout.ROWWISE, tuple(w.shape), w.dtype)
    return st, amax


def _group_ids(group_sizes, m_total: int):
    """The group of each row (G for the rows past the sizes' sum), by the size rules of grouped_gemm."""
    ends = jnp.minimum(jnp.cumsum(jnp.maximum(group_sizes, 0)), m_total)
    return jnp.searchsorted(ends, jnp.arange(m_total), side="right")


def _forward(x, kernel, bias, group_sizes, qs):
    """y and the amaxes the casts observed (x's, the kernel's; None without per-tensor quantizers)."""
    amaxes = (None, None)
    if qs is None:
        y = grouped_gemm(x, kernel, group_sizes, ((1,), (1,)))
    elif _per_tensor(qs):  # FP8 runs TN: kernel[g]ᵀ [N, K] quantized per expert
        xq = quantize(x, qs.x)
        kq, k_amax = _experts(jnp.swapaxes(kernel, 1, 2), qs.kernel)
        y = grouped_gemm(xq, kq, group_sizes, ((1,), (2,)), out_dtype=x.dtype)
        amaxes = (xq.amax, k_amax)
    else:  # FP8 block: native (1x128 x 128x128); MXFP8 / NVFP4: grouped_gemm emulates them
        y = grouped_gemm(x, jnp.swapaxes(kernel, 1, 2), group_sizes, ((1,), (2,)), lhs_quantizer=qs.x,
                         rhs_quantizer=qs.kernel)
    if bias is not None:
        ids = _group_ids(group_sizes, x.shape[0])
        rows_bias = jnp.take(jnp.concatenate([bias, jnp.zeros((1, bias.shape[1]), bias.dtype)]), ids, axis=0)
        y = (y.astype(jnp.float32) + rows_bias.astype(jnp.float32)).astype(y.dtype)
    return y, amaxes


# qs is an argument, not a static one: a delayed quantizer set holds arrays (scale, amax history), and its cotangent
# carries the amaxes the step observed (dense.py's convention: tej.update_quantizer_set takes it).
@jax.custom_vjp
def _grouped_dense(x, kernel, bias, group_sizes, qs):
    return _forward(x, kernel, bias, group_sizes, qs)[0]


def _fwd(x, kernel, bias, group_sizes, qs):
    y, amaxes = _forward(x, kernel, bias, group_sizes, qs)
    return y, (x, kernel, bias, group_sizes, qs, amaxes)


def _bwd(res, dy):
    x, kernel, bias, group_sizes, qs, (x_amax, k_amax) = res
    dy = dy.astype(x.dtype)
    dqs = None
    if qs is None:
        dx = grouped_gemm(dy, kernel, group_sizes, ((1,), (2,)))
    elif _per_tensor(qs):  # dy [M, N] x kernel[g] [K, N] contracted over N: kernel[g] quantized as it is stored
        dyq = quantize(dy, qs.dgrad)
        kq, _ = _experts(kernel, qs.kernel)
        dx = grouped_gemm(dyq, kq, group_sizes, ((1,), (2,)), out_dtype=x.dtype)
        dqs = qs_cotangent(qs, (x_amax, k_amax, dyq.amax))
    else:
        dx = grouped_gemm(dy, kernel, group_sizes, ((1,), (2,)), lhs_quantizer=qs.dgrad, rhs_quantizer=qs.kernel,
                          out_dtype=x.dtype)
    dkernel = grouped_gemm(x, dy, group_sizes, ((0,), (0,))).astype(kernel.dtype)
    dbias = None
    if bias is not None:
        ids = _group_ids(group_sizes, x.shape[0])
        dbias = jax.ops.segment_sum(dy.astype(jnp.float32), ids, num_segments=kernel.shape[0] + 1)[:-1]
        dbias = dbias.astype(bias.dtype)
    return dx.astype(x.dtype), dkernel, dbias, None, dqs


_grouped_dense.defvjp(_fwd, _bwd)


def grouped_dense(x, kernel, group_sizes, bias=None, quantizer_set=None):
    """The expert layer: x [M_total, K] (rows grouped by expert, in order), kernel [G, K, N], group_sizes int32 [G]
    (on the device), bias [G, N] or None → y [M_total, N] in x's dtype. Differentiable in x, kernel, bias and the
    quantizer set (module docstring); quantized by `quantizer_set`, else by the active `tej.autocast` recipe."""
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
