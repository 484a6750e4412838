"""`tej.dense`: a differentiable dense layer whose three GEMMs are `tej.gemm` calls on the quantized copies the torch
frontend's `Linear` uses (SPEC §8), with TE/JAX's kernel layout.

With kernel [K, N] (contracted over its leading dims, TE/JAX's layout) and x [M, K] (leading dims flattened):

    fprop  y  = x·kernel (+ bias)   x rowwise, kernel colwise    (torch: W [N, K] rowwise, X rowwise: TN)
    dgrad  dx = dy·kernelᵀ          dy rowwise, kernel rowwise   (torch: W columnwise, dY rowwise: NN)
    wgrad  dk = xᵀ·dy               x colwise, dy colwise        (torch: X columnwise, dY columnwise: NT)

(each operand uses the copy whose scaling runs along the contraction dim, SPEC §6.4; a kernel given [N, K], contracted
over its trailing dims, swaps its two copies). x and kernel are quantized once, in the forward, with both copies; the
residuals keep only the copy the backward reads. The output gradient is quantized once with its dbias fused
(`quantize_dbias`); without quantizers dbias comes out of the wgrad GEMM's bias-grad epilogue. Split accumulation as
the torch layers: fprop off, dgrad and wgrad on (FP8 per-tensor only). Gradients come back in the inputs' dtypes.

Every format runs through tej.gemm, the core's GEMM op (MXFP8 and NVFP4 decoded to bf16 inside it on sm_90, SPEC
§6.7; exact on the CPU), so tex and tej give the same bytes. NVFP4 runs without the random Hadamard transform here
(recipe.py).

Delayed scaling: the amaxes of the forward and backward casts leave as the cotangent of the quantizer set
(`amax_history[0]`); `tej.update_quantizer_set` turns them into the next step's set (recipe.py).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from .cpp_extensions import _NVFP4, quantize, quantize_dbias
from .gemm import _PER_TENSOR, gemm
from .quantizers import DelayedScaleQuantizer, ScalingMode
from .recipe import QuantizerSet, default_quantizer_set
from .scaled_tensor import ScaledTensor

__all__ = ["dense"]

_FLOATS = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
# Every GEMM dim (K, N, and the token count: the wgrad's contraction dim) must be a multiple of this (SPEC §6.5).
_ALIGNMENT = {ScalingMode.DELAYED_TENSOR_SCALING: 16, ScalingMode.CURRENT_TENSOR_SCALING: 16,
              ScalingMode.BLOCK_SCALING_1x128: 16, ScalingMode.BLOCK_SCALING_128x128: 16,
              ScalingMode.MXFP8_1D_SCALING: 32, ScalingMode.NVFP4_1D_SCALING: 32, ScalingMode.NVFP4_2D_SCALING: 32}
FPROP, DGRAD, WGRAD = "fprop", "dgrad", "wgrad"
_SPLIT = {FPROP: False, DGRAD: True, WGRAD: True}


# ---- helpers shared with mlp.py --------------------------------------------------------------------------------
def resolve_quantizer_set(layer: str, qs) -> QuantizerSet | None:
    """The layer's quantizer set: the given one, else autocast's; None when nothing quantizes. All three quantizers
    or none (a GEMM takes two quantized operands or two plain ones)."""
    if qs is None:
        qs = default_quantizer_set(layer)
    if not isinstance(qs, QuantizerSet):
        raise TypeError(f"{layer}: quantizer_set must be a tej.QuantizerSet (tej.make_quantizer_set(recipe)) or "
                        f"None, got {type(qs).__name__}")
    given = [q is not None for q in qs]
    if not any(given):
        return None
    if not all(given):
        raise ValueError(f"{layer}: a QuantizerSet needs all of x, kernel and dgrad or none of them (each GEMM takes "
                         f"two quantized operands or two plain ones), got {qs}")
    return qs


def check_alignment(layer: str, qs: QuantizerSet | None, dims: dict) -> None:
    if qs is None:
        return
    a = max(_ALIGNMENT.get(q.scaling_mode, 1) for q in qs)
    for name, v in dims.items():
        if v % a:
            raise ValueError(f"{layer}: under {qs.x.scaling_mode.name} every GEMM dim must be a multiple of {a} "
                             f"(SPEC §6.5), got {name}={v}. Pad {name} to {-(-v // a) * a}, or run this layer "
                             f"without quantizers (quantizer_set=tej.QuantizerSet() outside autocast)")


def check_float(layer: str, name: str, a) -> None:
    if jnp.dtype(a.dtype) not in _FLOATS:
        raise TypeError(f"{layer}: {name} must be float32, bfloat16 or float16, got {jnp.dtype(a.dtype)} with shape "
                        f"{tuple(a.shape)}")


def copy_for(t, contract_last: bool):
    """The copy of ScaledTensor `t` that a contraction over its last dim (rowwise) or first dim (colwise) reads;
    a plain array as it is. A residual keeps only this."""
    if not isinstance(t, ScaledTensor):
        return t
    return t.get_rowwise_tensor() if contract_last else t.get_colwise_tensor()


def as_matrix(t: ScaledTensor, lead: tuple, cols: int) -> ScaledTensor:
    """A ScaledTensor of a [*lead, A, F] kernel result seen as the [*lead, cols] array whose [prod(lead), cols]
    matrix the core quantized (its bytes and scales are laid out for that 2-D shape)."""
    return dataclasses.replace(t, shape=tuple(lead) + (cols,))


def keeps_leading_dims(qs, lead: tuple) -> bool:
    """Whether a layer passes x's leading (token) dims to its GEMMs as they are, rather than flattened to one: with
    several of them, unquantized or FP8 per tensor (whose cast is elementwise), so that a sequence dim sharded under
    an unsharded batch dim stays sharded (tej.gemm's rings split it). The other formats' scales are laid out for the
    flattened [tokens, K] matrix."""
    return len(lead) > 1 and (qs is None or qs.x.scaling_mode in _PER_TENSOR)


def flat(t):
    """A plain [..., C] array as [prod(...), C] (ScaledTensors as they are: the GEMM flattens them)."""
    return t if isinstance(t, ScaledTensor) else t.reshape(-1, t.shape[-1])


def lead_dims(t) -> tuple:
    """The contracting dims of a wgrad operand [..., C]: all its leading dims."""
    return tuple(range(len(t.shape) - 1))


def mm(lhs, rhs, dims, dtype, gemm_kind: str, bias=None, sequence_parallel=False):
    """2-D lhs·rhs contracted over dims ((a,), (b,)) through tej.gemm (its output dtype: the operands' nominal one,
    `dtype`). sequence_parallel: tej.gemm's (a row-parallel GEMM reduce-scatters its output along M)."""
    if isinstance(lhs, ScaledTensor) and lhs.scaling_mode not in _PER_TENSOR:
        if lhs.scaling_mode in _NVFP4 and jnp.dtype(dtype) == jnp.float16:
            # NVFP4 GEMMs write bf16 or fp32 (cuBLASLt's rule, kept on every device): fp32, + bias, one rounding
            out = gemm(lhs, rhs, dims, out_dtype=jnp.float32)
            return (out if bias is None else out + bias.astype(jnp.float32)).astype(dtype)
        return gemm(lhs, rhs, dims, bias=bias)
    return gemm(lhs, rhs, dims, bias=bias, use_split_accumulator=_SPLIT[gemm_kind],
                sequence_parallel=sequence_parallel)


def quantize_grad(dy, q, with_dbias: bool):
    """(dy quantized with both copies, its column sums or None): one fused cast."""
    if with_dbias:
        return quantize_dbias(dy, q)
    return quantize(dy, q), None


def wgrad_plain(lhs_t, dy, kernel_last: bool, with_dbias: bool):
    """(dk, dbias) without quantizers: dk = lhs_tᵀ·dy ([K, N], or [N, K] when kernel_last), dbias = Σ_rows dy from
    the GEMM's bias-grad epilogue (which sums the GEMM's lhs: dy, so it computes dkᵀ and transposes when needed)."""
    if not with_dbias:
        return (gemm(dy, lhs_t, ((0,), (0,)), use_split_accumulator=True) if kernel_last else
                gemm(lhs_t, dy, ((0,), (0,)), use_split_accumulator=True)), None
    dk_t, db = gemm(dy, lhs_t, ((0,), (0,)), bias_grad=True, use_split_accumulator=True)
    return (dk_t if kernel_last else dk_t.T), db


def amax_cotangent(q, amax):
    """The cotangent of quantizer `q` that carries the amax its cast observed: a delayed quantizer's
    `amax_history[0]` (zeros elsewhere); quantizers without float state get their own (leafless) structure, or None."""
    if isinstance(q, DelayedScaleQuantizer):
        hist = jnp.zeros_like(q.amax_history).at[0].set(amax.reshape(()).astype(q.amax_history.dtype))
        return dataclasses.replace(q, scale=jnp.zeros_like(q.scale), amax_history=hist)
    return None


def qs_cotangent(qs: QuantizerSet | None, amaxes):
    if qs is None:
        return None
    return QuantizerSet(*(amax_cotangent(q, a) for q, a in zip(qs, amaxes)))


def dq_dtype(t):
    """The dtype of a plain array, or the one a ScaledTensor dequantizes to (its source's)."""
    return t.dq_dtype if isinstance(t, ScaledTensor) else t.dtype


def amax_of(t):
    return t.amax if isinstance(t, ScaledTensor) else None


# ---- the layer -------------------------------------------------------------------------------------------------
def fwd(x, kernel, bias, qs, kernel_last, sp):
    """y [..., N] and the residuals; x [..., K] (its token dims, keeps_leading_dims), or x already quantized by
    qs.x (a ScaledTensor: layernorm_dense's normalized x), kernel [K, N] ([N, K] when kernel_last), bias [N] or
    None; sp: the sequence_parallel switch of the fprop and dgrad GEMMs."""
    dtype = dq_dtype(x)
    fdims = ((len(x.shape) - 1,), (1,) if kernel_last else (0,))
    if qs is None:
        y = mm(x, kernel, fdims, dtype, FPROP, bias, sp)
        return y, (x, kernel, None, (None, None))
    xq = x if isinstance(x, ScaledTensor) else quantize(x, qs.x)
    kq = quantize(kernel, qs.kernel)
    y = mm(xq, kq, fdims, dtype, FPROP, bias, sp)
    # Residuals: x's colwise copy (wgrad), the kernel's copy the dgrad contracts over N with.
    return y, (copy_for(xq, False), copy_for(kq, not kernel_last), qs, (xq.amax, kq.amax))


def bwd(kernel_last, with_bias, dtype, sp, res, dy):
    """(dx, dkernel, dbias, the quantizer set's cotangent) from fwd's residuals."""
    x_res, k_res, qs, (x_amax, k_amax) = res
    ddims = ((dy.ndim - 1,), (0,) if kernel_last else (1,))
    if qs is None:
        dx = mm(dy, k_res, ddims, dtype, DGRAD, sequence_parallel=sp)
        dk, db = wgrad_plain(flat(x_res), flat(dy), kernel_last, with_bias)
        return dx, dk, db, None
    dyq, db = quantize_grad(dy, qs.dgrad, with_bias)
    dx = mm(copy_for(dyq, True), k_res, ddims, dtype, DGRAD, sequence_parallel=sp)
    dyc = copy_for(dyq, False)
    wdims = (lead_dims(dyc),) * 2  # over the tokens
    dk = mm(dyc, x_res, wdims, dtype, WGRAD) if kernel_last else mm(x_res, dyc, wdims, dtype, WGRAD)
    return dx, dk, db, qs_cotangent(qs, (x_amax, k_amax, dyq.amax))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _dense2d(x, kernel, bias, qs, kernel_last, sp):
    return fwd(x, kernel, bias, qs, kernel_last, sp)[0]


def _dense2d_fwd(x, kernel, bias, qs, kernel_last, sp):
    y, res = fwd(x, kernel, bias, qs, kernel_last, sp)
    return y, (res, bias is not None)


def _dense2d_bwd(kernel_last, sp, saved, dy):
    res, with_bias = saved
    dtype = dq_dtype(res[0])
    dx, dk, db, dqs = bwd(kernel_last, with_bias, dtype, sp, res, dy.astype(dtype))
    return dx, dk, db, dqs


_dense2d.defvjp(_dense2d_fwd, _dense2d_bwd)


def _normalize(dims, ndim, name, where):
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    out = tuple(int(d) % ndim if isinstance(d, int) and -ndim <= d < ndim else None for d in dims)
    if not out or None in out or len(set(out)) != len(out):
        raise ValueError(f"tej.dense: {name} contracting dims {dims} must be distinct, in range for a {ndim}-D "
                         f"{name} and at least one {where}")
    return out


def dense(x, kernel, bias=None, contracting_dims=((-1,), (0,)), quantizer_set=None, *, sequence_parallel=False):
    """y = x·kernel (+ bias), differentiable (custom_vjp) in x, kernel and bias — and in `quantizer_set`, whose
    cotangent carries the delayed-scaling amaxes (recipe.py).

    x [..., K...]: contracted over its trailing dims `contracting_dims[0]`, any leading (batch) dims. kernel:
    [K..., N...] contracted over its leading dims (TE/JAX's layout, the default), or [N..., K...] over its trailing
    dims. bias: the kernel's non-contracting shape [N...]. y: [x's leading dims, N...] in x's dtype; the kernel and
    bias are cast to it. quantizer_set: a tej.QuantizerSet (x, kernel, dgrad), or None: autocast's recipe, or plain
    GEMMs outside autocast.

    Tensor parallel under jax.jit with sharded arrays (tej.gemm's partitioning): a kernel sharded along N on a mesh
    axis a is column parallel, one sharded along K (x's K sharded alike) row parallel. With x's tokens (its leading
    dims) also sharded on a — sequence parallel — the column-parallel fprop is tej.gemm's all-gather ring (x's row
    chunks travel by ppermute while the GEMM runs; the weight is never gathered; the unsharded bytes), with no
    switch. sequence_parallel=True keeps the token-sharded activations sharded: the row-parallel fprop
    reduce-scatters y along the tokens (a ring of FP32 partial sums) instead of all-reducing it, and the
    column-parallel dgrad does the same for dx; the row-parallel dgrad is then the all-gather ring over dy. The
    wgrads gather the token-sharded activation (x, or dy) over a where the other operand has it gathered (an XLA
    all-gather of the activation, never of a weight) and sum over the data-parallel axes. Plain and FP8 per-tensor
    GEMMs take the rings (FP8 codes travel; the amax is pmaxed so every shard has the unsharded scale); MXFP8, NVFP4
    and FP8 block GEMMs run without a ring, partitioned by XLA (the same values). Without sharded K or tokens the
    switch changes nothing."""
    layer = "tej.dense"
    if not hasattr(x, "shape") or not hasattr(kernel, "shape"):
        raise TypeError(f"{layer}: x and kernel must be arrays, got {type(x).__name__} and {type(kernel).__name__}")
    where = f"(x {tuple(x.shape)}, kernel {tuple(kernel.shape)}, contracting_dims={contracting_dims})"
    check_float(layer, "x", x)
    check_float(layer, "kernel", kernel)
    try:
        x_c, k_c = contracting_dims
    except (TypeError, ValueError):
        raise ValueError(f"{layer}: contracting_dims must be a pair (x dims, kernel dims) {where}") from None
    x_c, k_c = _normalize(x_c, x.ndim, "x", where), _normalize(k_c, kernel.ndim, "kernel", where)
    n = len(x_c)
    if len(k_c) != n or n >= kernel.ndim or n > x.ndim:
        raise ValueError(f"{layer}: x and kernel must contract over the same number of dims, and the kernel must keep "
                         f"at least one output dim {where}")
    if x_c != tuple(range(x.ndim - n, x.ndim)):
        raise ValueError(f"{layer}: x must contract over its trailing dims {tuple(range(x.ndim - n, x.ndim))}, got "
                         f"{x_c} {where}; move the batch dims to the front")
    if k_c == tuple(range(n)):
        kernel_last = False
    elif k_c == tuple(range(kernel.ndim - n, kernel.ndim)):
        kernel_last = True
    else:
        raise ValueError(f"{layer}: kernel must contract over its leading dims {tuple(range(n))} ([K.., N..]) or its "
                         f"trailing dims ([N.., K..]), got {k_c} {where}")
    k_shape = tuple(x.shape[d] for d in x_c)
    if tuple(kernel.shape[d] for d in k_c) != k_shape:
        raise ValueError(f"{layer}: K mismatch: x's contracting dims have shape {k_shape} but the kernel's "
                         f"{tuple(kernel.shape[d] for d in k_c)} {where}")
    out_shape = tuple(kernel.shape[d] for d in range(kernel.ndim) if d not in k_c)
    if bias is not None and tuple(bias.shape) not in (out_shape, (math.prod(out_shape),)):
        raise ValueError(f"{layer}: bias must have the kernel's output shape {out_shape}, got {tuple(bias.shape)} "
                         f"{where}")
    if bias is not None:
        check_float(layer, "bias", bias)
    qs = resolve_quantizer_set(layer, quantizer_set)
    lead = tuple(x.shape[:x.ndim - n])
    m, k, nn = math.prod(lead), math.prod(k_shape), math.prod(out_shape)
    check_alignment(layer, qs, {"tokens (the product of x's leading dims)": m, "K": k, "N": nn})
    dtype = x.dtype
    k2 = kernel.astype(dtype).reshape((nn, k) if kernel_last else (k, nn))
    b = None if bias is None else bias.astype(dtype).reshape(nn)
    x2 = x.reshape(lead + (k,) if keeps_leading_dims(qs, lead) else (m, k))
    y = _dense2d(x2, k2, b, qs, kernel_last, bool(sequence_parallel))
    return y.reshape(lead + out_shape)
