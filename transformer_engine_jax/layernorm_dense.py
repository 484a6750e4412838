"""`tej.layernorm_dense` and `tej.layernorm_mlp`: a normalization (`tej.layernorm`, LayerNorm or RMSNorm over the
last dim) followed by `tej.dense` / `tej.mlp`, TE/JAX's fused functions of those names.

The one invariant: under a quantizer set the normalized x is never written in x's dtype. The norm kernel emits it
already quantized by the first GEMM's x quantizer (SPEC §11: from the FP32 y), and that ScaledTensor is the GEMM's
x operand (dense.fwd / mlp.fwd take it as it is). The backward is the dense's (or the MLP's) with the normalized
x's residual copy, then the norm's (`normalization_bwd` of dz, the first GEMM's dgrad, with the forward's FP32
statistics mu / rsigma kept as residuals). Without a quantizer set the norm's output is an ordinary array and the
layers compose as they are (`tej.layernorm`, then `tej.dense` / `tej.mlp`).
"""
from __future__ import annotations

import functools
import math

import jax

from .activation_types import activation_of
from .dense import bwd as dense_bwd
from .dense import check_alignment, check_float, dense, dq_dtype, keeps_leading_dims, resolve_quantizer_set
from .dense import fwd as dense_fwd
from .mlp import bwd as mlp_bwd
from .mlp import fwd as mlp_fwd
from .mlp import mlp
from .normalization import layernorm, normalization_bwd, normalization_fwd
from .recipe import QuantizerSet

__all__ = ["layernorm_dense", "layernorm_mlp", "NORM_TYPES"]

NORM_TYPES = ("layernorm", "rmsnorm")


def check_norm(layer: str, x, gamma, beta, norm_type: str, epsilon) -> None:
    """The norm's arguments: the rule, gamma / beta [H] for x [..., H], float dtypes, epsilon > 0."""
    if norm_type not in NORM_TYPES:
        raise ValueError(f"{layer}: norm_type must be one of {NORM_TYPES}, got {norm_type!r}")
    if not hasattr(x, "shape") or len(x.shape) < 1:
        raise TypeError(f"{layer}: x must be an array [..., H], got {type(x).__name__}")
    h = x.shape[-1]
    for name, t in (("x", x), ("gamma", gamma), ("beta", beta)):
        if t is not None:
            check_float(layer, name, t)
    if tuple(gamma.shape) != (h,) or (beta is not None and tuple(beta.shape) != (h,)):
        raise ValueError(f"{layer}: gamma and beta must be [H] = [{h}] for x {tuple(x.shape)}, got gamma "
                         f"{tuple(gamma.shape)}, beta {None if beta is None else tuple(beta.shape)}")
    if norm_type == "rmsnorm" and beta is not None:
        raise ValueError(f"{layer}: RMSNorm has no beta, got beta {tuple(beta.shape)}; pass beta=None")
    if norm_type == "layernorm" and beta is None:
        raise ValueError(f"{layer}: LayerNorm needs beta [H] = [{h}] (zeros for none), got None")
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"{layer}: epsilon must be a finite number > 0, got {epsilon!r}")


def _norm(x, gamma, beta, norm):
    """norm(x) in x's dtype, differentiable (tej.layernorm)."""
    norm_type, zero_centered_gamma, epsilon = norm
    return layernorm(x, gamma, beta, norm_type=norm_type, zero_centered_gamma=zero_centered_gamma, epsilon=epsilon)


def _quantized_norm(x, gamma, beta, norm, quantizer):
    """(norm(x) quantized by `quantizer`, the residuals its backward needs: x, mu, rsigma, gamma, beta)."""
    norm_type, zero_centered_gamma, epsilon = norm
    zq, mu, rsigma = normalization_fwd(x, gamma, beta, zero_centered_gamma, epsilon, norm_type, quantizer)
    return zq, (x, mu, rsigma, gamma, beta)


def _norm_bwd(norm, res, dz):
    """(dx, dgamma, dbeta or None) of the norm from its residuals."""
    norm_type, zero_centered_gamma, epsilon = norm
    x, mu, rsigma, gamma, beta = res
    dx, dgamma, dbeta = normalization_bwd(dz.astype(x.dtype), x, mu, rsigma, gamma, beta, zero_centered_gamma,
                                          epsilon, norm_type)
    return dx, dgamma, None if beta is None else dbeta


# ---- norm -> dense ---------------------------------------------------------------------------------------------
@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _ln_dense(x, gamma, beta, kernel, bias, qs, norm, sp):
    return _ln_dense_fwd(x, gamma, beta, kernel, bias, qs, norm, sp)[0]


def _ln_dense_fwd(x, gamma, beta, kernel, bias, qs, norm, sp):
    zq, norm_res = _quantized_norm(x, gamma, beta, norm, qs.x)
    y, res = dense_fwd(zq, kernel, bias, qs, False, sp)
    return y, (res, norm_res, bias is not None)


def _ln_dense_bwd(norm, sp, saved, dy):
    res, norm_res, with_bias = saved
    dtype = dq_dtype(res[0])
    dz, dk, db, dqs = dense_bwd(False, with_bias, dtype, sp, res, dy.astype(dtype))
    return (*_norm_bwd(norm, norm_res, dz), dk, db, dqs)


_ln_dense.defvjp(_ln_dense_fwd, _ln_dense_bwd)


def layernorm_dense(x, kernel, gamma, beta, bias=None, norm_type="layernorm", zero_centered_gamma=False,
                    epsilon=1e-6, quantizer_set=None, *, sequence_parallel=False):
    """y = norm(x)·kernel (+ bias), differentiable (custom_vjp) in x, kernel, gamma, beta, bias and the quantizer
    set (whose cotangent carries the delayed-scaling amaxes, as tej.dense's). TE/JAX's argument order.

    x [..., H]; gamma, beta [H] (beta None for RMSNorm); norm(x) = tej.layernorm(x, gamma, beta, norm_type,
    zero_centered_gamma, epsilon) over the last dim; kernel [H, N...], bias [N...]; y [..., N...] in x's dtype.
    quantizer_set: a tej.QuantizerSet, or None (autocast's recipe, or plain GEMMs outside it); with one the norm
    writes its output quantized by quantizer_set.x straight into the GEMM (module doc). Alignment, tensor-parallel
    and sequence_parallel rules: tej.dense's (the norm runs on each device's rows)."""
    layer = "tej.layernorm_dense"
    check_norm(layer, x, gamma, beta, norm_type, epsilon)
    if not hasattr(kernel, "shape") or kernel.ndim < 2 or kernel.shape[0] != x.shape[-1]:
        raise ValueError(f"{layer}: kernel must be [H, N...] with H = x's last dim {x.shape[-1]}, got "
                         f"{getattr(kernel, 'shape', type(kernel).__name__)} (x {tuple(x.shape)})")
    norm = (norm_type, bool(zero_centered_gamma), float(epsilon))
    qs = resolve_quantizer_set(layer, quantizer_set)
    if qs is None:
        return dense(_norm(x, gamma, beta, norm), kernel, bias, sequence_parallel=sequence_parallel,
                            quantizer_set=QuantizerSet())
    check_float(layer, "kernel", kernel)
    out_shape = tuple(kernel.shape[1:])
    if bias is not None:
        check_float(layer, "bias", bias)
        if tuple(bias.shape) not in (out_shape, (math.prod(out_shape),)):
            raise ValueError(f"{layer}: bias must have the kernel's output shape {out_shape}, got "
                             f"{tuple(bias.shape)}")
    lead, k, n = tuple(x.shape[:-1]), x.shape[-1], math.prod(out_shape)
    m = math.prod(lead)
    check_alignment(layer, qs, {"tokens (the product of x's leading dims)": m, "K": k, "N": n})
    dtype = x.dtype
    x2 = x if keeps_leading_dims(qs, lead) else x.reshape(m, k)
    y = _ln_dense(x2, gamma, beta, kernel.astype(dtype).reshape(k, n),
                  None if bias is None else bias.astype(dtype).reshape(n), qs, norm, bool(sequence_parallel))
    return y.reshape(lead + out_shape)


# ---- norm -> mlp -----------------------------------------------------------------------------------------------
@functools.partial(jax.custom_vjp, nondiff_argnums=(9, 10, 11, 12))
def _ln_mlp(x, gamma, beta, w1, b1, w2, b2, qs1, qs2, act, a_dim, sp, norm):
    return _ln_mlp_fwd(x, gamma, beta, w1, b1, w2, b2, qs1, qs2, act, a_dim, sp, norm)[0]


def _ln_mlp_fwd(x, gamma, beta, w1, b1, w2, b2, qs1, qs2, act, a_dim, sp, norm):
    zq, norm_res = _quantized_norm(x, gamma, beta, norm, qs1.x)
    y, res = mlp_fwd(zq, w1, b1, w2, b2, qs1, qs2, act, a_dim, sp)
    return y, (res, norm_res, b1 is not None, b2 is not None)


def _ln_mlp_bwd(act, a_dim, sp, norm, saved, dy):
    res, norm_res, with_b1, with_b2 = saved
    dz, *rest = mlp_bwd(act, a_dim, activation_of(act).gated, sp, with_b1, with_b2, res, dy)
    return (*_norm_bwd(norm, norm_res, dz), *rest)


_ln_mlp.defvjp(_ln_mlp_fwd, _ln_mlp_bwd)


def layernorm_mlp(x, gamma, beta, kernels, biases=(None, None), norm_type="layernorm", zero_centered_gamma=False,
                  epsilon=1e-6, activation_type=("gelu",), quantizer_sets=(None, None), *, sequence_parallel=False):
    """y = act(norm(x)·w1 + b1)·w2 + b2, differentiable (custom_vjp) in x, gamma, beta, the weights, the biases
    and the quantizer sets. TE/JAX's argument order: kernels (w1, w2), biases (b1, b2). Shapes, activations,
    alignment and tensor-parallel rules: tej.mlp's (w1 [H, A, F], b1 [A, F], w2 [F, N], b2 [N]); gamma, beta and
    the norm: layernorm_dense's. With quantizer sets the norm writes its output quantized by the first set's x
    quantizer straight into the first GEMM."""
    layer = "tej.layernorm_mlp"
    check_norm(layer, x, gamma, beta, norm_type, epsilon)
    norm = (norm_type, bool(zero_centered_gamma), float(epsilon))
    try:
        (w1, w2), (b1, b2), (qs1, qs2) = kernels, biases, quantizer_sets
    except (TypeError, ValueError):
        raise ValueError(f"{layer}: kernels, biases and quantizer_sets must be pairs (first layer's, second's)") \
            from None
    q1, q2 = resolve_quantizer_set(layer, qs1), resolve_quantizer_set(layer, qs2)
    if q1 is None and q2 is None:
        plain = (QuantizerSet(), QuantizerSet())
        return mlp(_norm(x, gamma, beta, norm), w1, b1, w2, b2, activation_type, plain,
                        sequence_parallel=sequence_parallel)
    # tej.mlp checks the shapes and alignment on the stand-in of the normalized x (nothing runs at trace time).
    z = jax.ShapeDtypeStruct(x.shape, x.dtype)
    jax.eval_shape(lambda z: mlp(z, w1, b1, w2, b2, activation_type, (q1, q2)), z)
    act = activation_of(activation_type)
    a_dim = 2 if act.gated else 1
    lead, k, f, n = tuple(x.shape[:-1]), x.shape[-1], w2.shape[0], w2.shape[1]
    m, dtype = math.prod(lead), x.dtype
    x2 = x if keeps_leading_dims(q1, lead) else x.reshape(m, k)
    y = _ln_mlp(x2, gamma, beta, w1.astype(dtype).reshape(k, a_dim * f),
                None if b1 is None else b1.astype(dtype).reshape(a_dim * f), w2.astype(dtype),
                None if b2 is None else b2.astype(dtype), q1, q2, act.name, a_dim, bool(sequence_parallel), norm)
    return y.reshape(lead + (n,))
