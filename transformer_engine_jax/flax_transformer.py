"""`tej.flax`'s normalization and transformer modules (issue 35): LayerNorm, LayerNormDenseGeneral, LayerNormMLP and
TransformerLayer, TE/JAX's Flax modules of those names as NNX modules (as flax.py adapts Dense and MLP).

Adapted to NNX: the input width is a constructor argument (NNX builds parameters eagerly), `dtype` is the
computation dtype and `param_dtype` the parameters' (flax.nnx's convention; TE's linen `dtype` is the parameters'
and the parameters are FP32), quantization follows the enclosing `tej.autocast` with delayed-scaling state in
`FP8Meta` (flax.py's doc: `update_fp8_meta`). Parameter names and defaults are TE's: `scale` (gamma; ones, zeros when
zero_centered_gamma), `ln_bias` (beta, LayerNorm only), `kernel` / `bias`, `wi_kernel` [H, A, F] / `wi_bias` [A, F] /
`wo_kernel` [F, H] / `wo_bias` [H]; epsilon 1e-6, use_bias False, kernels variance_scaling(1, fan_in, truncated
normal) (TransformerLayer's attention kernels: normal). One default differs: return_layernorm_output is False (TE:
True), so that the fused path (the norm's output quantized straight into the GEMM, layernorm_dense.py) is the
default; True returns the normalized x as well and runs the norm and the GEMM as two ops (TE's behaviour too). Not
here: dropout, LoRA, axis != -1, TE's logical-axis sharding hints (shard the parameters as flax.py's doc says),
GQA, cross attention, padding masks.
"""
from __future__ import annotations

import math
from typing import Sequence, Union

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import dtypes

from ._flax_base import _Quantized
from .activation_types import activation_of
from .dense import dense
from .layernorm_dense import NORM_TYPES, layernorm_dense, layernorm_mlp
from .mlp import mlp
from .normalization import layernorm

__all__ = ["LayerNorm", "LayerNormDenseGeneral", "LayerNormMLP", "TransformerLayer"]

zeros = nnx.initializers.zeros_init()
default_kernel_init = nnx.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
default_mha_kernel_init = nnx.initializers.variance_scaling(1.0, "fan_in", "normal")
MASK_TYPES = ("causal", "no_mask")
ROPE_GROUPS = ("consecutive", "alternate")


def _norm_params(module, features, layernorm_type, zero_centered_gamma, scale_init, ln_bias_init, param_dtype,
                 rngs):
    """`scale` [features] and `ln_bias` [features] (None for RMSNorm) on `module`, TE's names and defaults."""
    if layernorm_type not in NORM_TYPES:
        raise ValueError(f"tej.flax.{type(module).__name__}: layernorm_type must be one of {NORM_TYPES}, got "
                         f"{layernorm_type!r}")
    if scale_init is None:
        scale_init = zeros if zero_centered_gamma else nnx.initializers.ones_init()
    module.scale = nnx.Param(scale_init(rngs.params(), (features,), param_dtype))
    module.ln_bias = (nnx.Param(ln_bias_init(rngs.params(), (features,), param_dtype))
                      if layernorm_type == "layernorm" else nnx.data(None))


def _value(p):
    return None if p is None else p.get_value()


def _check_width(module, x, features):
    if not hasattr(x, "shape") or len(x.shape) < 1 or x.shape[-1] != features:
        raise ValueError(f"tej.flax.{type(module).__name__}: x must be [..., {features}] (the layer's in_features), "
                         f"got {getattr(x, 'shape', type(x).__name__)}")


class LayerNorm(nnx.Module):
    """y = norm(x) over the last dim through `tej.layernorm`: layernorm_type "layernorm" ((x − mean)·rsigma·g +
    ln_bias) or "rmsnorm" (x·rsigma·g), g = scale, or 1 + scale with zero_centered_gamma (whose default scale_init
    is then zeros). Statistics and output in FP32, rounded once to the computation dtype (dtype, else x's promoted
    with param_dtype)."""

    def __init__(self, features: int, *, epsilon: float = 1e-6, layernorm_type: str = "layernorm",
                 zero_centered_gamma: bool = False, scale_init=None, bias_init=zeros, dtype=None,
                 param_dtype=jnp.float32, rngs: nnx.Rngs):
        _norm_params(self, features, layernorm_type, zero_centered_gamma, scale_init, bias_init, param_dtype, rngs)
        self.features, self.epsilon, self.layernorm_type = features, epsilon, layernorm_type
        self.zero_centered_gamma, self.dtype, self.param_dtype = zero_centered_gamma, dtype, param_dtype

    def __call__(self, x):
        _check_width(self, x, self.features)
        x = x.astype(self.dtype or jnp.promote_types(x.dtype, self.param_dtype))
        return layernorm(x, self.scale.get_value(), _value(self.ln_bias), norm_type=self.layernorm_type,
                         zero_centered_gamma=self.zero_centered_gamma, epsilon=self.epsilon)


class LayerNormDenseGeneral(_Quantized):
    """(y, ln_out): y = norm(x)·kernel + bias through `tej.layernorm_dense` — under a recipe the norm writes its
    output quantized by the GEMM's x quantizer, never in x's dtype —, ln_out the normalized x when
    return_layernorm_output (then the norm and `tej.dense` run as two ops), else None. x [..., in_features]; kernel
    [in_features, *features] (features an int or a tuple: y [..., *features]), bias [*features] when use_bias;
    scale / ln_bias as LayerNorm's, absent with enable_layernorm=False (y = x·kernel + bias). Computation dtype,
    alignment, tensor and sequence parallelism as tej.flax.Dense's (shard the kernel along its last dim: column
    parallel)."""

    def __init__(self, in_features: int, features: Union[int, Sequence[int]], *, enable_layernorm: bool = True,
                 layernorm_type: str = "layernorm", epsilon: float = 1e-6, zero_centered_gamma: bool = False,
                 scale_init=None, ln_bias_init=zeros, kernel_init=default_kernel_init, use_bias: bool = False,
                 bias_init=zeros, return_layernorm_output: bool = False, dtype=None, param_dtype=jnp.float32,
                 sequence_parallel: bool = False, rngs: nnx.Rngs):
        self.features = (features,) if isinstance(features, int) else tuple(features)
        if enable_layernorm:
            _norm_params(self, in_features, layernorm_type, zero_centered_gamma, scale_init, ln_bias_init,
                         param_dtype, rngs)
        else:
            self.scale, self.ln_bias = nnx.data(None), nnx.data(None)
        self.kernel = nnx.Param(kernel_init(rngs.params(), (in_features,) + self.features, param_dtype))
        self.bias = (nnx.Param(bias_init(rngs.params(), self.features, param_dtype)) if use_bias
                     else nnx.data(None))
        self.in_features, self.enable_layernorm, self.layernorm_type = in_features, enable_layernorm, layernorm_type
        self.epsilon, self.zero_centered_gamma, self.use_bias = epsilon, zero_centered_gamma, use_bias
        self.return_layernorm_output, self.dtype, self.param_dtype = return_layernorm_output, dtype, param_dtype
        self.sequence_parallel = sequence_parallel
        self._init_fp8_meta()

    def __call__(self, x, *, rngs=None):
        """x [..., in_features] -> (y [..., *features], ln_out or None). rngs: as tej.flax.Dense's (NVFP4's
        stochastic rounding of the gradient)."""
        _check_width(self, x, self.in_features)
        x, kernel, bias = dtypes.promote_dtype((x, self.kernel.get_value(), _value(self.bias)), dtype=self.dtype)
        qs = self._quantizer_sets(rngs)
        sp = self.sequence_parallel
        if not self.enable_layernorm:
            return dense(x, kernel, bias, quantizer_set=qs, sequence_parallel=sp), None
        norm = dict(norm_type=self.layernorm_type, zero_centered_gamma=self.zero_centered_gamma,
                    epsilon=self.epsilon)
        gamma, beta = self.scale.get_value(), _value(self.ln_bias)
        if self.return_layernorm_output:
            z = layernorm(x, gamma, beta, **norm)
            return dense(z, kernel, bias, quantizer_set=qs, sequence_parallel=sp), z
        return layernorm_dense(x, kernel, gamma, beta, bias, quantizer_set=qs, sequence_parallel=sp, **norm), None


class LayerNormMLP(_Quantized):
    """(y, ln_out): y = act(norm(x)·wi_kernel + wi_bias)·wo_kernel + wo_bias through `tej.layernorm_mlp` (the
    norm's output quantized straight into the first GEMM under a recipe, the activation fused and quantized for the
    second: tej.mlp), ln_out as LayerNormDenseGeneral's. wi_kernel [in_features, A, intermediate_dim] with A =
    len(activations) (TE's stacking: one kernel_init draw of [in_features, intermediate_dim] per activation),
    wo_kernel [intermediate_dim, in_features], wi_bias [A, intermediate_dim] and wo_bias [in_features] when use_bias.
    activations: a tej activation as TE spells it, e.g. ("relu",), ("gelu", "linear") (GEGLU), ("silu", "linear")
    (SwiGLU). Tensor parallel as tej.flax.MLP's (wi sharded along its last dim, wo along its first)."""

    _n_sets = 2

    def __init__(self, in_features: int, intermediate_dim: int = 2048, *, enable_layernorm: bool = True,
                 layernorm_type: str = "layernorm", epsilon: float = 1e-6, zero_centered_gamma: bool = False,
                 scale_init=None, ln_bias_init=zeros, kernel_init=default_kernel_init, use_bias: bool = False,
                 bias_init=zeros, return_layernorm_output: bool = False,
                 activations: Union[str, Sequence[str]] = ("relu",), dtype=None, param_dtype=jnp.float32,
                 sequence_parallel: bool = False, rngs: nnx.Rngs):
        act = activation_of(activations)
        self.activation_type, a_dim = act.name, 2 if act.gated else 1
        if enable_layernorm:
            _norm_params(self, in_features, layernorm_type, zero_centered_gamma, scale_init, ln_bias_init,
                         param_dtype, rngs)
        else:
            self.scale, self.ln_bias = nnx.data(None), nnx.data(None)
        keys = jax.random.split(rngs.params(), a_dim)
        self.wi_kernel = nnx.Param(jnp.stack([kernel_init(k, (in_features, intermediate_dim), param_dtype)
                                              for k in keys], axis=-2))
        self.wo_kernel = nnx.Param(kernel_init(rngs.params(), (intermediate_dim, in_features), param_dtype))
        if use_bias:
            self.wi_bias = nnx.Param(bias_init(rngs.params(), (a_dim, intermediate_dim), param_dtype))
            self.wo_bias = nnx.Param(bias_init(rngs.params(), (in_features,), param_dtype))
        else:
            self.wi_bias, self.wo_bias = nnx.data(None), nnx.data(None)
        self.in_features, self.intermediate_dim, self.enable_layernorm = in_features, intermediate_dim, enable_layernorm
        self.layernorm_type, self.epsilon, self.zero_centered_gamma = layernorm_type, epsilon, zero_centered_gamma
        self.use_bias, self.return_layernorm_output = use_bias, return_layernorm_output
        self.dtype, self.param_dtype, self.sequence_parallel = dtype, param_dtype, sequence_parallel
        self._init_fp8_meta()

    def __call__(self, x, *, rngs=None):
        """x [..., in_features] -> (y [..., in_features], ln_out or None). rngs: as tej.flax.Dense's."""
        _check_width(self, x, self.in_features)
        x, w1, b1, w2, b2 = dtypes.promote_dtype(
            (x, self.wi_kernel.get_value(), _value(self.wi_bias), self.wo_kernel.get_value(), _value(self.wo_bias)),
            dtype=self.dtype)
        qs = self._quantizer_sets(rngs)
        qs = (None, None) if qs is None else qs
        sp = self.sequence_parallel
        if not self.enable_layernorm:
            return mlp(x, w1, b1, w2, b2, self.activation_type, qs, sequence_parallel=sp), None
        norm = dict(norm_type=self.layernorm_type, zero_centered_gamma=self.zero_centered_gamma,
                    epsilon=self.epsilon)
        gamma, beta = self.scale.get_value(), _value(self.ln_bias)
        if self.return_layernorm_output:
            z = layernorm(x, gamma, beta, **norm)
            return mlp(z, w1, b1, w2, b2, self.activation_type, qs, sequence_parallel=sp), z
        return layernorm_mlp(x, gamma, beta, (w1, w2), (b1, b2), activation_type=self.activation_type,
                             quantizer_sets=qs, sequence_parallel=sp, **norm), None


def rotary_pos_emb(x, windows=(1, 10000), group_method="consecutive"):
    """x [B, T, heads, D] rotated by its positions 0..T-1, in FP32, back in x's dtype: pair p of D/2 turns by the
    angle t / (min · (max/min)^(2p/D)) for (min, max) = windows. "consecutive" pairs dims (2p, 2p + 1),
    "alternate" (p, p + D/2)."""
    t, d = x.shape[1], x.shape[-1]
    half = d // 2
    lo, hi = windows
    timescale = lo * (hi / lo) ** (2 * jnp.arange(half, dtype=jnp.float32) / d)
    angle = jnp.arange(t, dtype=jnp.float32)[:, None] / timescale           # [T, D/2]
    sin, cos = jnp.sin(angle)[None, :, None, :], jnp.cos(angle)[None, :, None, :]
    x32 = x.astype(jnp.float32)
    if group_method == "alternate":
        x1, x2 = x32[..., :half], x32[..., half:]
        out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    else:
        x1, x2 = x32[..., 0::2], x32[..., 1::2]
        out = jnp.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).reshape(x.shape)
    return out.astype(x.dtype)


class _SelfAttention(nnx.Module):
    """TE's MultiHeadAttention for self attention with fused QKV: `qkv` a LayerNormDenseGeneral [H, 3, H] (q, k, v
    columns in that order; the query third drawn from kernel_init / sqrt(head_dim) with scaled_query_init), `out` a
    LayerNormDenseGeneral without norm [H, H]."""

    def __init__(self, hidden_size, num_attention_heads, *, kernel_init, use_bias, bias_init, scaled_query_init,
                 norm_args, dtype, param_dtype, sequence_parallel, rngs):
        head_dim = hidden_size // num_attention_heads

        def qkv_init(key, shape, dtype_):
            keys = jax.random.split(key, 3)
            parts = [kernel_init(k, (shape[0], shape[-1]), dtype_) for k in keys]
            if scaled_query_init:
                parts[0] = parts[0] / jnp.sqrt(jnp.asarray(head_dim, dtype_))
            return jnp.stack(parts, axis=-2)

        common = dict(use_bias=use_bias, bias_init=bias_init, dtype=dtype, param_dtype=param_dtype,
                      sequence_parallel=sequence_parallel, rngs=rngs)
        self.qkv = LayerNormDenseGeneral(hidden_size, (3, hidden_size), kernel_init=qkv_init, **norm_args, **common)
        self.out = LayerNormDenseGeneral(hidden_size, hidden_size, enable_layernorm=False, kernel_init=kernel_init,
                                         **common)


class TransformerLayer(nnx.Module):
    """A pre-norm transformer encoder layer (TE's TransformerLayer, self attention):
        h = x + attention.out(attn(rope(q), rope(k), v)),  (q, k, v) = attention.qkv(x)  (norm fused into the QKV GEMM)
        y = h + mlp(h)                                      (LayerNormMLP, its norm fused into the first GEMM)
    x [batch, seq, hidden_size]. attn: `jax.nn.dot_product_attention` in the computation dtype (dtype, else x's
    promoted with param_dtype; bf16 for the cuDNN kernel on GPU) over num_attention_heads heads of hidden_size /
    num_attention_heads, self_attn_mask_type "causal" or "no_mask", logits scaled by 1/sqrt(head_dim) only with
    scale_attn_logits (TE's default instead scales the query kernel at init: scaled_query_init). RoPE on q and k with
    enable_rotary_pos_emb (`rotary_pos_emb`: windows and group method as TE's). Every GEMM quantizes as the
    enclosing `tej.autocast` says, each sub-layer with its own FP8Meta; hidden_size, mlp_hidden_size and
    batch·seq must meet the recipe's alignment (16 FP8, 32 MXFP8 / NVFP4). Tensor parallel: shard qkv's and the
    MLP's wi kernels along their last dim and out's and wo's along their first (e.g. with nnx.with_partitioning
    initializers under jax.set_mesh, or device_put); heads then split across devices."""

    def __init__(self, hidden_size: int = 512, mlp_hidden_size: int = 2048, num_attention_heads: int = 8, *,
                 layernorm_type: str = "layernorm", layernorm_epsilon: float = 1e-6,
                 zero_centered_gamma: bool = False, mha_kernel_init=default_mha_kernel_init,
                 mlp_kernel_init=default_kernel_init, mlp_activations: Union[str, Sequence[str]] = ("relu",),
                 use_bias: bool = False, bias_init=zeros, self_attn_mask_type: str = "causal",
                 enable_rotary_pos_emb: bool = False, rotary_pos_emb_windows=(1, 10000),
                 rotary_pos_emb_group_method: str = "consecutive", scale_attn_logits: bool = False,
                 scaled_query_init: bool = True, dtype=None, param_dtype=jnp.float32, sequence_parallel: bool = False,
                 rngs: nnx.Rngs):
        where = "tej.flax.TransformerLayer"
        if hidden_size % num_attention_heads:
            raise ValueError(f"{where}: hidden_size {hidden_size} must be a multiple of num_attention_heads "
                             f"{num_attention_heads}")
        if self_attn_mask_type not in MASK_TYPES:
            raise ValueError(f"{where}: self_attn_mask_type must be one of {MASK_TYPES}, got {self_attn_mask_type!r}")
        head_dim = hidden_size // num_attention_heads
        if enable_rotary_pos_emb:
            if rotary_pos_emb_group_method not in ROPE_GROUPS:
                raise ValueError(f"{where}: rotary_pos_emb_group_method must be one of {ROPE_GROUPS}, got "
                                 f"{rotary_pos_emb_group_method!r}")
            if head_dim % 2:
                raise ValueError(f"{where}: rotary position embedding rotates pairs of dims: head_dim (hidden_size / "
                                 f"num_attention_heads) = {head_dim} must be even")
            lo, hi = rotary_pos_emb_windows
            if not 0 < lo <= hi:
                raise ValueError(f"{where}: rotary_pos_emb_windows must be (min, max) with 0 < min <= max, got "
                                 f"{rotary_pos_emb_windows}")
        norm_args = dict(layernorm_type=layernorm_type, epsilon=layernorm_epsilon,
                         zero_centered_gamma=zero_centered_gamma)
        common = dict(dtype=dtype, param_dtype=param_dtype, sequence_parallel=sequence_parallel, rngs=rngs)
        self.attention = _SelfAttention(hidden_size, num_attention_heads, kernel_init=mha_kernel_init,
                                        use_bias=use_bias, bias_init=bias_init, scaled_query_init=scaled_query_init,
                                        norm_args=norm_args, **common)
        self.mlp = LayerNormMLP(hidden_size, mlp_hidden_size, kernel_init=mlp_kernel_init, use_bias=use_bias,
                                bias_init=bias_init, activations=mlp_activations, **norm_args, **common)
        self.hidden_size, self.mlp_hidden_size, self.num_attention_heads = hidden_size, mlp_hidden_size, \
            num_attention_heads
        self.head_dim, self.self_attn_mask_type, self.scale_attn_logits = head_dim, self_attn_mask_type, \
            scale_attn_logits
        self.enable_rotary_pos_emb, self.rotary_pos_emb_windows = enable_rotary_pos_emb, tuple(rotary_pos_emb_windows)
        self.rotary_pos_emb_group_method, self.dtype, self.param_dtype = rotary_pos_emb_group_method, dtype, \
            param_dtype

    def __call__(self, x, *, rngs=None):
        """x [batch, seq, hidden_size] -> [batch, seq, hidden_size] in the computation dtype. rngs: an nnx.Rngs
        (each sub-layer draws its own key) or a PRNG key (folded with the sub-layer's index), for NVFP4's
        stochastic rounding of the gradients."""
        if not hasattr(x, "shape") or len(x.shape) != 3 or x.shape[-1] != self.hidden_size:
            raise ValueError(f"tej.flax.TransformerLayer: x must be [batch, seq, {self.hidden_size}], got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
        x = x.astype(self.dtype or jnp.promote_types(x.dtype, self.param_dtype))
        keys = [rngs if rngs is None or isinstance(rngs, nnx.Rngs) else jax.random.fold_in(rngs, i)
                for i in range(3)]
        b, t, _ = x.shape
        qkv, _ = self.attention.qkv(x, rngs=keys[0])                       # [B, T, 3, H]
        q, k, v = (qkv[:, :, i].reshape(b, t, self.num_attention_heads, self.head_dim) for i in range(3))
        if self.enable_rotary_pos_emb:
            q, k = (rotary_pos_emb(a, self.rotary_pos_emb_windows, self.rotary_pos_emb_group_method) for a in (q, k))
        scale = 1 / math.sqrt(self.head_dim) if self.scale_attn_logits else 1.0
        a = jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=self.self_attn_mask_type == "causal")
        out, _ = self.attention.out(a.reshape(b, t, self.hidden_size), rngs=keys[1])
        h = x + out.astype(x.dtype)
        y, _ = self.mlp(h, rngs=keys[2])
        return h + y.astype(x.dtype)
