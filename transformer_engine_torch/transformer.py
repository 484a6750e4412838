"""`TransformerLayer` (issue 35): TE's pre-norm transformer block built from this package's layers.

    hidden_states [s, b, h] (TE's default "sbhd"; attn_input_format="bshd": [b, s, h])
      → self_attention.layernorm_qkv   LayerNormLinear(h → 3h), one fused QKV weight, per head [q; k; v] rows
                                       (TE's fuse_qkv_params=True with qkv_weight_interleaved=True)
      → RoPE on q and k (rotary_pos_emb, TE's freqs [s, 1, 1, d_rot], non-interleaved halves)
      → torch.nn.functional.scaled_dot_product_attention in the compute dtype (not quantized), mask per
        self_attn_mask_type, softmax scale 1/sqrt(head_dim), attention_dropout
      → self_attention.proj            Linear(h → h, TE's init), hidden_dropout, + residual
      → layernorm_mlp                  LayerNormMLP(h → ffn → h), hidden_dropout, + residual

Inside `tex.autocast` the three GEMM layers run quantized by the recipe (the norms fused with the QKV and fc1 input
quantization); the attention stays in the compute dtype. Tensor parallel (`set_parallel_mode=True` with `tp_group`):
QKV and fc1 column-parallel (this rank's heads and ffn rows), proj and fc2 row-parallel, `sequence_parallel` with
the sequence dim (s) split between the ranks outside the attention and the MLP, through the collective GEMMs as
Linear and MLP do.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .modules import Linear
from .norm_layers import LayerNormLinear, LayerNormMLP, check_input, check_norm_args, default_init_method

__all__ = ["TransformerLayer", "apply_rotary_pos_emb"]

MASK_TYPES = ("no_mask", "causal", "padding", "padding_causal", "arbitrary")


def _rotate_half(t: torch.Tensor) -> torch.Tensor:
    t1, t2 = t.chunk(2, dim=-1)
    return torch.cat((-t2, t1), dim=-1)


def _rotate_half_t(t: torch.Tensor) -> torch.Tensor:
    """The transpose of _rotate_half: _rotate_half_t(_rotate_half(t)) = t."""
    t1, t2 = t.chunk(2, dim=-1)
    return torch.cat((t2, -t1), dim=-1)


def _on_first(t: torch.Tensor, d_rot: int, fn) -> torch.Tensor:
    """fn of the first d_rot channels of t, the others passed through (RoPE rotates d_rot <= d channels)."""
    t_rot, t_pass = t[..., :d_rot], t[..., d_rot:]
    return torch.cat((fn(t_rot), t_pass), dim=-1) if t_pass.shape[-1] else fn(t_rot)


def _rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """t·cos + rotate_half(t)·sin on the first cos.shape[-1] channels of t (cos and sin broadcast against them)."""
    return _on_first(t, cos.shape[-1], lambda u: u * cos + _rotate_half(u) * sin)


def _cos_sin(f: torch.Tensor, dtype: torch.dtype):
    """The rotation tables of freqs f: cos and sin in FP32 math, rounded to the rotated tensor's dtype."""
    return f.cos().to(dtype), f.sin().to(dtype)


def apply_rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor, tensor_format: str = "sbhd") -> torch.Tensor:
    """TE's rotary embedding (non-interleaved): t [s, b, heads, d] ("sbhd") or [b, s, heads, d] ("bshd"), freqs
    [≥ s, 1, 1, d_rot] (d_rot ≤ d, even); the first d_rot channels become t·cos + rotate_half(t)·sin (cos and sin
    of freqs rounded to t's dtype), the others pass through."""
    seq = t.shape[0] if tensor_format == "sbhd" else t.shape[1]
    f = freqs[:seq]
    if tensor_format == "bshd":
        f = f.transpose(0, 1)
    return _rope(t, *_cos_sin(f, t.dtype))


@torch.library.custom_op("te_layers::rope_tables", mutates_args=())
def _rope_tables(freqs: torch.Tensor, seq: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of freqs[:seq] rounded to `dtype` ([seq, 1, 1, d_rot], apply_rotary_pos_emb's tables). An opaque
    op so that torch.compile computes the [seq, d_rot] tables once, in their own small kernel: traced as plain torch,
    Inductor fuses cos and sin into the rotation and evaluates them once per element of q and k, again in the
    backward (the 1B decoder's RoPE backward took 0.43 ms a layer that way; tools/rope_probe.py)."""
    return _cos_sin(freqs[:seq], dtype)


@_rope_tables.register_fake
def _(freqs, seq, dtype):
    shape = (seq, *freqs.shape[1:])
    return freqs.new_empty(shape, dtype=dtype), freqs.new_empty(shape, dtype=dtype)


class _PackedRope(torch.autograd.Function):
    """RoPE of q and k together, straight from the packed QKV output [.., heads, 3, d] (apply_rotary_pos_emb's
    values, same bytes): forward (qkv, cos, sin) -> (rotated [.., heads, 2, d] q and k, the v view); cos / sin
    [.., 1 or 2, d_rot] broadcast over the heads (one table pair for q and k, or stacked ones). The backward is the
    rotation written out, dt = g·cos + rotate_half^T(g·sin) (the ops autograd would record, in that order), and
    returns dqkv in one concatenation: eager runs half the kernels of rotating q and k apart, and compiled the
    gradient is one pointwise kernel over dqkv."""

    @staticmethod
    def forward(ctx, qkv, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rope(qkv[..., :2, :], cos, sin), qkv[..., 2, :]

    @staticmethod
    def backward(ctx, g_qk, g_v):
        cos, sin = ctx.saved_tensors
        d_qk = _on_first(g_qk, cos.shape[-1], lambda u: u * cos + _rotate_half_t(u * sin))
        return torch.cat((d_qk, g_v.unsqueeze(-2)), dim=-2), None, None


def _rope_qkv(qkv: torch.Tensor, qf: torch.Tensor, kf: torch.Tensor, tensor_format: str):
    """(q, k, v) of the packed qkv [s, b, heads, 3, d] ("sbhd") or [b, s, heads, 3, d] ("bshd"), q and k rotated by
    their freqs as apply_rotary_pos_emb does."""
    seq = qkv.shape[0] if tensor_format == "sbhd" else qkv.shape[1]
    # [s, 1, n, d_rot] tables: n = 1 (q and k share freqs) or 2 (q's and k's stacked)
    tables = [_rope_tables(f, seq, qkv.dtype) for f in ((qf,) if qf is kf else (qf, kf))]
    cos, sin = tables[0] if len(tables) == 1 else (torch.cat(parts, dim=2) for parts in zip(*tables))
    if tensor_format == "bshd":
        cos, sin = cos.transpose(0, 1), sin.transpose(0, 1)
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # over the heads: [s, 1, 1, n, d_rot] / [1, s, 1, n, d_rot]
    qk, v = _PackedRope.apply(qkv, cos, sin)
    return qk[..., 0, :], qk[..., 1, :], v


class _SelfAttention(torch.nn.Module):
    """TE's MultiheadAttention names: `layernorm_qkv` and `proj` (the attention itself has no parameters)."""

    def __init__(self, layernorm_qkv: LayerNormLinear, proj: Linear):
        super().__init__()
        self.layernorm_qkv = layernorm_qkv
        self.proj = proj


class TransformerLayer(torch.nn.Module):
    """TE's TransformerLayer (encoder, pre-norm, the module docstring's dataflow) with TE's argument names and
    defaults where it has them (device: torch's default, as this package's other layers): `hidden_dropout` and
    `attention_dropout` 0.1 (applied in training mode only), `init_method` (QKV, fc1) and `output_layer_init_method`
    (proj, fc2) default normal(0, 0.023), biases zeros, norm weights ones (zeros with `zero_centered_gamma`).
    `normalization` "LayerNorm" or "RMSNorm"; `activation` any of tex.MLP's.

    forward(hidden_states, attention_mask=None, self_attn_mask_type=None, rotary_pos_emb=None): hidden_states
    [s, b, hidden] ("sbhd") or [b, s, hidden] ("bshd"); self_attn_mask_type overrides the constructor's:
    "causal" (top-left), "no_mask", "padding" (attention_mask bool [b, 1, 1, s], True = masked out, as TE),
    "padding_causal" (both), "arbitrary" (attention_mask bool broadcastable to [b, heads, s, s], True = masked out);
    rotary_pos_emb: TE's freqs [≥ s, 1, 1, d_rot] applied to q and k (apply_rotary_pos_emb)."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, num_attention_heads: int, *,
                 layernorm_epsilon: float = 1e-5, hidden_dropout: float = 0.1, attention_dropout: float = 0.1,
                 init_method: Optional[Callable] = None, output_layer_init_method: Optional[Callable] = None,
                 self_attn_mask_type: str = "causal", tp_group=None, params_dtype=None, sequence_parallel: bool = False,
                 set_parallel_mode: bool = False, zero_centered_gamma: bool = False, bias: bool = True,
                 activation: str = "gelu", normalization: str = "LayerNorm", device=None,
                 attn_input_format: str = "sbhd", comm_overlap: bool = True):
        super().__init__()
        name = "TransformerLayer"
        self.hidden_size, self.ffn_hidden_size = int(hidden_size), int(ffn_hidden_size)
        self.num_attention_heads = int(num_attention_heads)
        if self.num_attention_heads <= 0 or self.hidden_size % self.num_attention_heads:
            raise ValueError(f"{name}: hidden_size={self.hidden_size} must be a multiple of num_attention_heads="
                             f"{num_attention_heads} (> 0)")
        check_norm_args(name, normalization, layernorm_epsilon)
        for arg, p in (("hidden_dropout", hidden_dropout), ("attention_dropout", attention_dropout)):
            if not 0.0 <= p < 1.0:
                raise ValueError(f"{name}: {arg} must be in [0, 1), got {p!r}")
        self._check_mask_type(self_attn_mask_type)
        if attn_input_format not in ("sbhd", "bshd"):
            raise ValueError(f"{name}: attn_input_format must be 'sbhd' or 'bshd', got {attn_input_format!r}")
        if set_parallel_mode and tp_group is None:
            raise ValueError(f"{name}: set_parallel_mode=True needs tp_group (a torch.distributed group)")
        tp_group = tp_group if set_parallel_mode else None
        tp = tp_group.size() if tp_group is not None else 1
        if self.num_attention_heads % tp:
            raise ValueError(f"{name}: tensor parallelism splits num_attention_heads={self.num_attention_heads} over "
                             f"tp={tp} ranks: it must be a multiple of tp")
        if sequence_parallel and attn_input_format != "sbhd":
            raise ValueError(f"{name}: sequence_parallel splits the sequence dim, the first one: it needs "
                             f"attn_input_format='sbhd', got {attn_input_format!r}")
        self.hidden_dropout, self.attention_dropout = float(hidden_dropout), float(attention_dropout)
        self.self_attn_mask_type, self.attn_input_format = self_attn_mask_type, attn_input_format
        self.head_dim = self.hidden_size // self.num_attention_heads
        self.heads_per_rank = self.num_attention_heads // tp
        self.tp_group, self.sequence_parallel = tp_group, bool(sequence_parallel) and tp_group is not None
        init_method = init_method or default_init_method
        output_layer_init_method = output_layer_init_method or default_init_method
        common = dict(params_dtype=params_dtype, device=device)
        tp_kw = dict(tp_group=tp_group, sequence_parallel=self.sequence_parallel, comm_overlap=comm_overlap)
        qkv = LayerNormLinear(self.hidden_size, 3 * self.hidden_size, layernorm_epsilon, bias=bias,
                              normalization=normalization, zero_centered_gamma=zero_centered_gamma,
                              init_method=init_method, parallel_mode="column" if tp_group is not None else None,
                              **tp_kw, **common)
        proj = Linear(self.hidden_size, self.hidden_size, bias, parallel_mode="row" if tp_group is not None else None,
                      **tp_kw, **common)
        output_layer_init_method(proj.weight)  # TE's init (Linear's own is torch.nn.Linear's)
        if proj.bias is not None:
            with torch.no_grad():
                proj.bias.zero_()
        self.self_attention = _SelfAttention(qkv, proj)
        self.layernorm_mlp = LayerNormMLP(self.hidden_size, self.ffn_hidden_size, layernorm_epsilon, bias=bias,
                                          normalization=normalization, activation=activation,
                                          zero_centered_gamma=zero_centered_gamma, init_method=init_method,
                                          output_layer_init_method=output_layer_init_method, **tp_kw, **common)

    @staticmethod
    def _check_mask_type(mask_type):
        if mask_type not in MASK_TYPES:
            raise ValueError(f"TransformerLayer: self_attn_mask_type must be one of {', '.join(MASK_TYPES)}, got "
                             f"{mask_type!r}")

    def extra_repr(self):
        return (f"hidden_size={self.hidden_size}, ffn_hidden_size={self.ffn_hidden_size}, num_attention_heads="
                f"{self.num_attention_heads}, self_attn_mask_type={self.self_attn_mask_type!r}")

    def _mask(self, mask_type, attention_mask, b, s, device):
        """(SDPA's boolean attn_mask — True = attends — or None, is_causal)."""
        if mask_type in ("no_mask", "causal"):
            if attention_mask is not None:
                raise ValueError(f"TransformerLayer: attention_mask is used with self_attn_mask_type 'padding', "
                                 f"'padding_causal' or 'arbitrary', not {mask_type!r}: pass None")
            return None, mask_type == "causal"
        if attention_mask is None:
            raise ValueError(f"TransformerLayer: self_attn_mask_type={mask_type!r} needs attention_mask (bool, True "
                             f"= masked out)")
        if attention_mask.dtype != torch.bool:
            raise TypeError(f"TransformerLayer: attention_mask must be a bool tensor (True = masked out), got "
                            f"{attention_mask.dtype}")
        want = (b, 1, 1, s) if mask_type.startswith("padding") else None
        if want is not None and tuple(attention_mask.shape) != want:
            raise ValueError(f"TransformerLayer: a {mask_type!r} attention_mask must have shape {list(want)} "
                             f"([batch, 1, 1, seq]), got {list(attention_mask.shape)}")
        if want is None:
            try:
                torch.broadcast_shapes(tuple(attention_mask.shape), (b, self.heads_per_rank, s, s))
            except RuntimeError:
                raise ValueError(f"TransformerLayer: an 'arbitrary' attention_mask must broadcast to [batch, heads, "
                                 f"seq, seq] = {[b, self.heads_per_rank, s, s]}, got "
                                 f"{list(attention_mask.shape)}") from None
        keep = ~attention_mask.to(device)
        if mask_type == "padding_causal":
            keep = keep & torch.ones(s, s, dtype=torch.bool, device=device).tril()
        return keep, False

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                self_attn_mask_type: Optional[str] = None,
                rotary_pos_emb=None) -> torch.Tensor:
        mask_type = self_attn_mask_type if self_attn_mask_type is not None else self.self_attn_mask_type
        self._check_mask_type(mask_type)
        check_input("TransformerLayer", hidden_states, self.hidden_size)
        sbhd = self.attn_input_format == "sbhd"
        if hidden_states.dim() != 3:
            layout = "[seq, batch, hidden]" if sbhd else "[batch, seq, hidden]"
            raise ValueError(f"TransformerLayer: hidden_states must be 3-D ({self.attn_input_format}: {layout}), got "
                             f"shape {tuple(hidden_states.shape)}")
        attn = self.self_attention
        qkv = attn.layernorm_qkv(hidden_states)  # sequence parallel: all-gathered to the whole sequence
        s, b = (qkv.shape[0], qkv.shape[1]) if sbhd else (qkv.shape[1], qkv.shape[0])
        qkv = qkv.view(*qkv.shape[:2], self.heads_per_rank, 3, self.head_dim)
        if rotary_pos_emb is not None:
            qf, kf = rotary_pos_emb if isinstance(rotary_pos_emb, (tuple, list)) else (rotary_pos_emb,) * 2
            for f in (qf, kf):
                self._check_freqs(f, s)
            q, k, v = _rope_qkv(qkv, qf, kf, self.attn_input_format)
        else:
            q, k, v = qkv.unbind(3)
        # SDPA layout [b, heads, s, d]
        perm = (1, 2, 0, 3) if sbhd else (0, 2, 1, 3)
        q, k, v = (t.permute(*perm) for t in (q, k, v))
        keep, causal = self._mask(mask_type, attention_mask, b, s, q.device)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=causal,
                                             dropout_p=self.attention_dropout if self.training else 0.0)
        ctx = ctx.permute(2, 0, 1, 3) if sbhd else ctx.permute(0, 2, 1, 3)
        ctx = ctx.reshape(*ctx.shape[:2], self.heads_per_rank * self.head_dim)
        out = F.dropout(attn.proj(ctx), self.hidden_dropout, self.training)
        hidden = hidden_states + out
        mlp = F.dropout(self.layernorm_mlp(hidden), self.hidden_dropout, self.training)
        return hidden + mlp

    def _check_freqs(self, f, s):
        if not isinstance(f, torch.Tensor) or not f.is_floating_point():
            raise TypeError(f"TransformerLayer: rotary_pos_emb must be a float tensor [seq, 1, 1, d_rot], got "
                            f"{type(f).__name__ if not isinstance(f, torch.Tensor) else f.dtype}")
        if f.dim() != 4 or f.shape[0] < s or f.shape[1:3] != (1, 1) or f.shape[3] % 2 or f.shape[3] > self.head_dim:
            raise ValueError(f"TransformerLayer: rotary_pos_emb must have shape [seq >= {s}, 1, 1, d_rot] with d_rot "
                             f"even and <= head_dim={self.head_dim}, got {list(f.shape)}")
