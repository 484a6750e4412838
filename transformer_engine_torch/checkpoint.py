"""Loading TransformerEngine checkpoints: `load_te_state_dict(module, te_state_dict)` (docs/torch.md, "Checkpoints").

Our layers use TE's parameter names (LayerNormMLP, LayerNormLinear, Linear, TransformerLayer with
fuse_qkv_params=True and qkv_weight_interleaved=True); two things differ. (1) TE's default TransformerLayer
(fuse_qkv_params=False) stores the QKV projection as `query_weight`, `key_weight`, `value_weight` (and `*_bias`), and
with qkv_weight_interleaved=False its fused `weight` is [Q; K; V]; ours is one `weight` [3·hidden, hidden] whose rows
are per head [q; k; v] (head_dim rows each), TE's interleaved layout. (2) TE's `_extra_state` entries are pickled
objects of TE's own classes (its recipe, its FP8 metadata): they are dropped, so the delayed-scaling state restarts
fresh (scales 1, histories 0) as after `init_fp8_state`.
"""
from __future__ import annotations

import torch

from .transformer import TransformerLayer

__all__ = ["load_te_state_dict"]

_QKV = "self_attention.layernorm_qkv."
_SPLIT = ("query_", "key_", "value_")


def _per_head(parts, head_dim: int) -> torch.Tensor:
    """[Q; K; V] (each [heads·head_dim, ...]) → per head [q; k; v]: our (and TE's interleaved) QKV row order."""
    heads = parts[0].shape[0] // head_dim
    return torch.stack([p.reshape(heads, head_dim, *p.shape[1:]) for p in parts], 1).reshape(-1, *parts[0].shape[1:])


def _qkv_prefixes(module: torch.nn.Module) -> dict:
    """{state-dict prefix of each TransformerLayer's layernorm_qkv: that layer's head_dim}."""
    return {(f"{name}." if name else "") + _QKV: m.head_dim for name, m in module.named_modules()
            if isinstance(m, TransformerLayer)}


def _convert_qkv(sd: dict, prefix: str, head_dim: int, interleaved: bool) -> None:
    for kind in ("weight", "bias"):
        split, fused = [f"{prefix}{s}{kind}" for s in _SPLIT], prefix + kind
        have = [k in sd for k in split]
        if any(have):
            if not all(have):
                missing = ", ".join(k for k, h in zip(split, have) if not h)
                raise ValueError(f"load_te_state_dict: TE's split QKV {kind} needs query_, key_ and value_{kind}; "
                                 f"missing {missing}")
            if fused in sd:
                raise ValueError(f"load_te_state_dict: {prefix} holds both TE's split query_/key_/value_ parameters "
                                 f"and a fused weight or bias ({fused}): a TE checkpoint has one or the other")
            sd[fused] = _per_head([sd.pop(k) for k in split], head_dim)
        elif fused in sd and not interleaved:
            t = sd[fused]
            if t.shape[0] % (3 * head_dim):
                raise ValueError(f"load_te_state_dict: {fused} has {t.shape[0]} rows, not a multiple of 3·head_dim="
                                 f"{3 * head_dim} (Q, K and V of whole heads)")
            sd[fused] = _per_head(t.chunk(3, dim=0), head_dim)


def load_te_state_dict(module: torch.nn.Module, te_state_dict: dict, *, qkv_weight_interleaved: bool = True,
                       strict: bool = True):
    """Loads a state_dict written by TE's modules into `module` (this package's equivalents, built with the same
    sizes): TransformerLayer's QKV parameters converted to our per-head [q; k; v] rows (from TE's query_/key_/value_
    split, or from a fused `weight` in [Q; K; V] order when `qkv_weight_interleaved=False`, TE's layout when it was
    built so), every `_extra_state` entry dropped (the delayed-scaling state restarts fresh). Everything else must
    already carry our names. Returns `module.load_state_dict(...)`'s (missing_keys, unexpected_keys); strict raises
    on both, as torch does."""
    sd = {k: v for k, v in te_state_dict.items() if not k.endswith("_extra_state")}
    for prefix, head_dim in _qkv_prefixes(module).items():
        _convert_qkv(sd, prefix, head_dim, qkv_weight_interleaved)
    return module.load_state_dict(sd, strict=strict)
