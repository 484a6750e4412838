"""Normalization layers (issue 35): `LayerNorm`, `RMSNorm`, and the norm fused in front of a GEMM, `LayerNormLinear`
and `LayerNormMLP`, over the SPEC §11 ops (`layernorm_fwd` / `rmsnorm_fwd` / `layernorm_bwd` / `rmsnorm_bwd`,
normalization.py). Parameter names and initialisation are TE's: `weight` (ones; zeros when `zero_centered_gamma`,
which normalizes with 1 + weight) and `bias` (zeros; LayerNorm only) for the norms; `layer_norm_weight`,
`layer_norm_bias` then the GEMMs' parameters for the fused layers, whose weights default to TE's init_method,
normal(0, 0.023), and biases to zeros.

Inside `tex.autocast` the fused layers run as modules.py's Linear and MLP do, except that the norm kernel writes its
output already quantized by the first GEMM's input quantizer (the fusion: one pass over the activations instead of a
norm then a cast), and that GEMM reads it directly. The backward keeps the norm's input (in the compute dtype), mu
and rsigma (FP32 [tokens]) and the columnwise copy of the quantized norm output the weight-gradient GEMM reads, then
runs the dgrad GEMM and layernorm_bwd / rmsnorm_bwd. (NVFP4 with the Hadamard transform is not fused: the transform
takes bf16 input, so the norm writes bf16 and the cast follows.) Outside autocast, while calibrating, and in the tensor-parallel
modes the norm is its own autograd op (_NormFn) followed by the Linear / MLP the layer is (the same code: these
classes subclass them); in the tensor-parallel modes the norm then runs on this rank's tokens (sequence parallel) or
on all of them, and the column-parallel GEMM quantizes its input itself (not fused, as MLP's activation there).
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from . import normalization as _norm
from ._layer_gemms import (activation_dtype, check_alignment, dgrad_gemm, keep_columnwise, layer_configs, layer_gemm,
                           slot_views, wgrad_gemm)
from ._tensor_parallel import _grad_quantize, _TPAllReduceBackward
from .enums import FP8BwdTensors, FP8FwdTensors
from .modules import MLP, Linear, mlp_gemms_backward, mlp_gemms_forward
from .recipe import (build_quantizer, get_amax_reduction_group, get_fp8_recipe, is_calibrating, is_fp8_enabled,
                     update_delayed_scaling)

__all__ = ["LayerNorm", "RMSNorm", "LayerNormLinear", "LayerNormMLP", "NORMALIZATIONS"]

NORMALIZATIONS = ("LayerNorm", "RMSNorm")
_FLOAT = (torch.float32, torch.float16, torch.bfloat16)
TE_INIT_STD = 0.023  # TE's get_default_init_method(): normal(0, 0.023)


def default_init_method(weight: torch.Tensor) -> None:
    """TE's default weight initialisation (init_method=None): normal(0, 0.023)."""
    torch.nn.init.normal_(weight, mean=0.0, std=TE_INIT_STD)


def check_norm_args(layer: str, normalization: str, eps) -> float:
    """The normalization kind and eps (> 0 and finite), else a ValueError naming the argument."""
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"{layer}: normalization must be one of {', '.join(NORMALIZATIONS)}, got {normalization!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"{layer}: eps must be a finite number > 0, got {eps!r}")
    return float(eps)


def check_input(layer: str, x, hidden: int, what: str = "hidden_size") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{layer}: input must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT:
        raise TypeError(f"{layer}: input dtype must be float32, float16 or bfloat16, got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] != hidden:
        raise ValueError(f"{layer}: input last dim must equal {what}={hidden}, got input shape {tuple(x.shape)}")


def check_gamma(layer: str, name: str, p: Optional[torch.Tensor], hidden: int) -> None:
    """A norm parameter replaced by one of another shape or a non-float dtype: ValueError / TypeError naming it."""
    if p is None:
        return
    if tuple(p.shape) != (hidden,):
        raise ValueError(f"{layer}: {name} must have shape [{hidden}] (hidden_size), got {list(p.shape)}")
    if p.dtype not in _FLOAT:
        raise TypeError(f"{layer}: {name} dtype must be float32, float16 or bfloat16, got {p.dtype}")


def norm_fwd(kind, x2, weight, bias, eps, quantizer, otype, zero_centered_gamma):
    """(out, mu or None, rsigma) of the SPEC §11 forward op of `kind` on x2 [rows, H]."""
    if kind == "LayerNorm":
        return _norm.layernorm_fwd(x2, weight, bias, eps, None, quantizer, otype, 0, zero_centered_gamma)
    return _norm.rmsnorm_fwd(x2, weight, eps, None, quantizer, otype, 0, zero_centered_gamma)


def norm_bwd(kind, dz, x2, mu, rsigma, weight, zero_centered_gamma):
    """(dx, dgamma, dbeta or None) of the SPEC §11 backward op of `kind`."""
    if kind == "LayerNorm":
        return tuple(_norm.layernorm_bwd(dz, x2, mu, rsigma, weight, 0, zero_centered_gamma))
    dx, dg = _norm.rmsnorm_bwd(dz, x2, rsigma, weight, 0, zero_centered_gamma)
    return dx, dg, None


# ---- the norm alone -------------------------------------------------------------------------------------------------
class _NormFn(torch.autograd.Function):
    """y = norm(x) in `act_dtype` (x read in that dtype), backward through the bwd op; dx in x's dtype."""

    @staticmethod
    def forward(ctx, x, weight, bias, kind, eps, zero_centered_gamma, act_dtype):
        x2 = x.reshape(-1, x.shape[-1])
        if x2.dtype != act_dtype:
            x2 = x2.to(act_dtype)
        x2 = x2.contiguous()
        y, mu, rsigma = norm_fwd(kind, x2, weight, bias, eps, None, act_dtype, zero_centered_gamma)
        ctx.meta = (x.shape, x.dtype, kind, zero_centered_gamma)
        ctx.save_for_backward(x2, mu, rsigma, weight)
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x_shape, x_dtype, kind, zcg = ctx.meta
        x2, mu, rsigma, weight = ctx.saved_tensors
        dz = dy.reshape(x2.shape).to(x2.dtype).contiguous()
        dx, dg, db = norm_bwd(kind, dz, x2, mu, rsigma, weight, zcg)
        return dx.reshape(x_shape).to(x_dtype), dg, db, None, None, None, None


def apply_norm(layer: str, kind, x, weight, bias, eps, zero_centered_gamma):
    """The norm of `x` over its last dim as its own op (checked arguments), in the compute dtype (torch.autocast's
    when on, else x's)."""
    check_gamma(layer, "weight", weight, x.shape[-1])
    check_gamma(layer, "bias", bias, x.shape[-1])
    return _NormFn.apply(x, weight, bias, kind, eps, zero_centered_gamma, activation_dtype(x))


class _Norm(torch.nn.Module):
    _KIND = "LayerNorm"

    def __init__(self, hidden_size: int, eps: float = 1e-5, sequence_parallel: bool = False, params_dtype=None,
                 zero_centered_gamma: bool = False, device=None):
        super().__init__()
        self.hidden_size = int(hidden_size)
        self.eps = check_norm_args(self._KIND, self._KIND, eps)
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.sequence_parallel = bool(sequence_parallel)  # TE's flag (marks the parameters); nothing to gather here
        kw = dict(dtype=params_dtype if params_dtype is not None else torch.get_default_dtype(), device=device)
        self.weight = torch.nn.Parameter(torch.empty(self.hidden_size, **kw))
        if self._KIND == "LayerNorm":
            self.bias = torch.nn.Parameter(torch.empty(self.hidden_size, **kw))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        """TE's: weight ones (zeros when zero_centered_gamma), bias zeros."""
        with torch.no_grad():
            self.weight.fill_(0.0 if self.zero_centered_gamma else 1.0)
            if self.bias is not None:
                self.bias.zero_()

    def extra_repr(self):
        return f"{self.hidden_size}, eps={self.eps}, zero_centered_gamma={self.zero_centered_gamma}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input(self._KIND, x, self.hidden_size)
        return apply_norm(self._KIND, self._KIND, x, self.weight, self.bias, self.eps, self.zero_centered_gamma)


class LayerNorm(_Norm):
    """y = (x − mean) / sqrt(var + eps) · weight + bias over the last dim (`zero_centered_gamma`: · (1 + weight)),
    statistics in FP32 (SPEC §11), output in the input's dtype (torch.autocast's when on). TE's arguments (device
    default: torch's) and parameters `weight` (ones) and `bias` (zeros). Inside tex.autocast it is not quantized (its
    consumer quantizes; LayerNormLinear / LayerNormMLP fuse that)."""

    _KIND = "LayerNorm"


class RMSNorm(_Norm):
    """y = x / sqrt(mean(x²) + eps) · weight over the last dim (`zero_centered_gamma`: · (1 + weight)); parameter
    `weight` only. Otherwise as LayerNorm."""

    _KIND = "RMSNorm"


def _te_order(module: torch.nn.Module, first: tuple) -> None:
    """Puts the parameters named in `first` ahead of the others (TE's state_dict order: the norm's first)."""
    params = module._parameters
    order = [k for k in first if k in params] + [k for k in params if k not in first]
    module._parameters = type(params)((k, params[k]) for k in order)


def _init_norm_params(module, hidden: int, normalization: str, zero_centered_gamma: bool, kw: dict,
                      order: tuple = ()) -> None:
    module.layer_norm_weight = torch.nn.Parameter(torch.empty(hidden, **kw))
    if normalization == "LayerNorm":
        module.layer_norm_bias = torch.nn.Parameter(torch.empty(hidden, **kw))
    else:
        module.register_parameter("layer_norm_bias", None)
    with torch.no_grad():
        module.layer_norm_weight.fill_(0.0 if zero_centered_gamma else 1.0)
        if module.layer_norm_bias is not None:
            module.layer_norm_bias.zero_()
    _te_order(module, ("layer_norm_weight", "layer_norm_bias") + order)


def _rows(x, act_dtype):
    """x as contiguous [tokens, hidden] in the compute dtype."""
    x2 = x.reshape(-1, x.shape[-1])
    return (x2 if x2.dtype == act_dtype else x2.to(act_dtype)).contiguous()


def _fused_norm(kind, x2, ln_w, ln_b, eps, qx, act_dtype, zcg, return_ln):
    """(high-precision norm output or None, the norm output quantized by qx, mu, rsigma). Fused (the norm kernel
    writes the quantized copy) unless the caller also wants the high-precision output, or the quantizer is NVFP4's
    with the Hadamard transform (it takes bf16 input, and the norm's is its FP32 y): then the norm in the compute
    dtype, then its cast."""
    if return_ln or getattr(qx, "with_rht", False):
        ln, mu, rsigma = norm_fwd(kind, x2, ln_w, ln_b, eps, None, act_dtype, zcg)
        return (ln if return_ln else None), qx(ln), mu, rsigma
    ln_q, mu, rsigma = norm_fwd(kind, x2, ln_w, ln_b, eps, qx, act_dtype, zcg)
    return None, ln_q, mu, rsigma


def _keep_norm(ctx, x, kind, zcg, act_dtype, need_dln, norm_saved, *others):
    """Saves what the norm's backward reads (x2, mu, rsigma, gamma: only when a gradient reaches it) and `others`."""
    ctx.norm_meta = (x.shape, x.dtype, kind, zcg, act_dtype)
    ctx.save_for_backward(*(norm_saved if need_dln else (None,) * 4), *others)


def _outputs(y, x, ln):
    """y [tokens, N] in x's leading shape, with the norm output when the layer returns it."""
    y = y.reshape(*x.shape[:-1], y.shape[-1])
    return (y, ln.reshape(x.shape)) if ln is not None else y


def _norm_input_grads(ctx, dz, dln_out, x2, mu, rsigma, ln_w):
    """(dx in x's shape and dtype, dgamma, dbeta) from dz, the gradient reaching the norm output through the GEMM,
    plus that of the returned norm output (return_layernorm_output)."""
    x_shape, x_dtype, kind, zcg, act_dtype = ctx.norm_meta
    if dln_out is not None:
        dz = dz + dln_out.reshape(dz.shape).to(act_dtype)
    dx, dgw, dgb = norm_bwd(kind, dz.contiguous(), x2, mu, rsigma, ln_w, zcg)
    g = ctx.needs_input_grad
    return dx.reshape(x_shape).to(x_dtype), dgw if g[1] else None, dgb if g[2] else None


class _NormInFront:
    """What LayerNormLinear and LayerNormMLP share: the norm's settings and parameters, the checks, the unfused path
    (the norm as its own op, then the base layer's forward) and the fused one (their autograd function, whose
    arguments begin x, layer_norm_weight, layer_norm_bias, the GEMM parameters, kind, eps, zero_centered_gamma,
    return_layernorm_output and end act_dtype, cfgs, recipe and the delayed state)."""

    def _norm_settings(self, layer, normalization, eps, zero_centered_gamma, return_layernorm_output):
        self.eps = check_norm_args(layer, normalization, eps)
        self.normalization, self.zero_centered_gamma = normalization, bool(zero_centered_gamma)
        self.return_layernorm_output = bool(return_layernorm_output)

    def _reset_norm(self):
        if getattr(self, "layer_norm_weight", None) is not None:
            with torch.no_grad():
                self.layer_norm_weight.fill_(0.0 if self.zero_centered_gamma else 1.0)
                if self.layer_norm_bias is not None:
                    self.layer_norm_bias.zero_()

    def _norm_front(self, name, x, hidden, what, tp, base_forward, fn, params, extra, dims, params_grad):
        check_input(name, x, hidden, what)
        check_gamma(name, "layer_norm_weight", self.layer_norm_weight, hidden)
        check_gamma(name, "layer_norm_bias", self.layer_norm_bias, hidden)
        if tp or not is_fp8_enabled() or is_calibrating():  # the norm as its own op, then the base layer's paths
            gamma, beta = self.layer_norm_weight, self.layer_norm_bias
            if tp and self.sequence_parallel:  # each rank normalizes its tokens: the gradients summed over the group
                gamma = _TPAllReduceBackward.apply(gamma, self.tp_group)
                beta = None if beta is None else _TPAllReduceBackward.apply(beta, self.tp_group)
            ln = _NormFn.apply(x, gamma, beta, self.normalization, self.eps, self.zero_centered_gamma,
                               activation_dtype(x))
            y = base_forward(self, ln)
            return (y, ln) if self.return_layernorm_output else y
        recipe = get_fp8_recipe()
        if torch.is_grad_enabled() and params_grad:
            dims["tokens (flattened leading dims of the input)"] = x.numel() // max(hidden, 1)
        check_alignment(name, recipe, dims)
        fs, fh, bs, bh = self._delayed_state(recipe, x.device)
        act_dtype = activation_dtype(x)
        cfgs = layer_configs(recipe, act_dtype)
        out = fn.apply(x, self.layer_norm_weight, self.layer_norm_bias, *params, self.normalization, self.eps,
                       self.zero_centered_gamma, self.return_layernorm_output, *extra, act_dtype, cfgs, recipe, fs,
                       fh, bs, bh)
        if fs is not None:
            update_delayed_scaling(fh, fs, recipe, cfgs[0][1], get_amax_reduction_group())
        return out


# ---- LayerNormLinear ------------------------------------------------------------------------------------------------
class _LayerNormLinearFn(torch.autograd.Function):
    """norm → quantized (fused) → fprop GEMM; backward: dgrad GEMM (+ the gradient of the returned norm output) →
    norm bwd, wgrad GEMM from the columnwise copy of the quantized norm output."""

    @staticmethod
    def forward(ctx, x, ln_w, ln_b, weight, bias, kind, eps, zcg, return_ln, act_dtype, cfgs, recipe, fs, fh, bs,
                bh):
        x2 = _rows(x, act_dtype)
        g = ctx.needs_input_grad
        need_dln, need_wgrad = g[0] or g[1] or g[2], g[3]
        qx = build_quantizer(cfgs[0], True, need_wgrad, *slot_views(fs, fh, FP8FwdTensors.GEMM1_INPUT))
        ln, ln_q, mu, rsigma = _fused_norm(kind, x2, ln_w, ln_b, eps, qx, act_dtype, zcg, return_ln)
        w_q = build_quantizer(cfgs[1], True, need_dln, *slot_views(fs, fh, FP8FwdTensors.GEMM1_WEIGHT))(weight)
        y = layer_gemm(w_q, True, ln_q, False, act_dtype, bias=None if bias is None else bias.to(act_dtype))
        ctx.x_q = keep_columnwise(ln_q) if need_wgrad else None
        ctx.w_q = keep_columnwise(w_q) if need_dln else None
        ctx.meta = (weight.dtype, None if bias is None else bias.dtype, cfgs[2], recipe)
        _keep_norm(ctx, x, kind, zcg, act_dtype, need_dln, (x2, mu, rsigma, ln_w), bs, bh)
        return _outputs(y, x, ln)

    @staticmethod
    def backward(ctx, dy, dln_out=None):
        w_dtype, b_dtype, cfg_g, recipe = ctx.meta
        act_dtype = ctx.norm_meta[-1]
        x2, mu, rsigma, ln_w, bs, bh = ctx.saved_tensors
        g = ctx.needs_input_grad
        need_dln, need_wgrad, need_bgrad = g[0] or g[1] or g[2], g[3], g[4]
        dy2 = _rows(dy, act_dtype)
        qg = build_quantizer(cfg_g, need_dln, need_wgrad, *slot_views(bs, bh, FP8BwdTensors.GRAD_OUTPUT1))
        dw = dx = dgw = dgb = None
        db, dy_q = (_grad_quantize(dy2, qg, need_bgrad, b_dtype) if need_dln or need_wgrad or need_bgrad
                    else (None, None))
        if need_wgrad:
            dw = wgrad_gemm(ctx.x_q, dy_q, w_dtype)
        ctx.x_q = None  # read by the wgrad only: freed before the dgrad
        if need_dln:
            dz = dgrad_gemm(ctx.w_q, dy_q, act_dtype)
            ctx.w_q = None
            del dy_q  # both its copies are done with before the norm's backward
            dx, dgw, dgb = _norm_input_grads(ctx, dz, dln_out, x2, mu, rsigma, ln_w)
        if bs is not None:
            update_delayed_scaling(bh, bs, recipe, cfg_g[1], get_amax_reduction_group())
        ctx.x_q = ctx.w_q = None
        return (dx, dgw, dgb, dw, db) + (None,) * 11


class LayerNormLinear(_NormInFront, Linear):
    """y = norm(x)·Wᵀ + b: a LayerNorm or RMSNorm (`normalization`) over in_features, then a Linear, with TE's
    parameter names `layer_norm_weight`, `layer_norm_bias` (LayerNorm only), `weight` [out, in], `bias`, and TE's
    initialisation (`init_method(weight)`, default normal(0, 0.023); bias zeros; norm weight ones, zeros when
    `zero_centered_gamma`). `return_layernorm_output=True` returns (y, norm output). Inside `tex.autocast` the norm
    writes the GEMM's quantized input (module docstring); the alignment rules of Linear apply (in_features under a
    block recipe included: the quantized norm output is blocked along it).

    Tensor parallel as Linear's, `parallel_mode` None or "column" (the norm needs the whole hidden dim): with
    `sequence_parallel` the input is this rank's tokens, normalized here, all-gathered inside the GEMM; the norm's
    parameter gradients are then summed over the group (every rank's equals the unsharded layer's)."""

    def __init__(self, in_features: int, out_features: int, eps: float = 1e-5, *, bias: bool = True,
                 normalization: str = "LayerNorm", zero_centered_gamma: bool = False,
                 return_layernorm_output: bool = False, init_method: Optional[Callable] = None, params_dtype=None,
                 device=None, tp_group=None, parallel_mode: Optional[str] = None, sequence_parallel: bool = False,
                 comm_overlap: bool = True):
        self._norm_settings("LayerNormLinear", normalization, eps, zero_centered_gamma, return_layernorm_output)
        if parallel_mode == "row":
            raise ValueError("LayerNormLinear: parallel_mode must be None or 'column' (the norm needs the whole "
                             "in_features on every rank), got 'row'")
        self.init_method = init_method
        super().__init__(in_features, out_features, bias, params_dtype, device, tp_group=tp_group,
                         parallel_mode=parallel_mode, sequence_parallel=sequence_parallel, comm_overlap=comm_overlap)
        _init_norm_params(self, self.in_features, normalization, self.zero_centered_gamma,
                          dict(dtype=self.weight.dtype, device=self.weight.device))

    def reset_parameters(self):
        """TE's: init_method(weight) (default normal(0, 0.023)), bias zeros; the norm's weight ones (zeros when
        zero_centered_gamma), its bias zeros."""
        (self.init_method or default_init_method)(self.weight)
        if self.bias is not None:
            with torch.no_grad():
                self.bias.zero_()
        self._reset_norm()

    def extra_repr(self):
        return f"{super().extra_repr()}, normalization={self.normalization}, eps={self.eps}"

    def forward(self, x: torch.Tensor):
        tp = self.parallel_mode is not None and self.tp_group.size() > 1
        return self._norm_front(f"LayerNormLinear({self.in_features}, {self.out_features})", x, self.in_features,
                                "in_features", tp, Linear.forward, _LayerNormLinearFn, (self.weight, self.bias), (),
                                {"in_features": self.in_features, "out_features": self.out_features},
                                self.weight.requires_grad)


# ---- LayerNormMLP ---------------------------------------------------------------------------------------------------
class _LayerNormMLPFn(torch.autograd.Function):
    """norm → quantized (fused) → MLP's GEMMs and fused activation (modules.mlp_gemms_forward); backward:
    mlp_gemms_backward to the norm output's gradient, then the norm bwd."""

    @staticmethod
    def forward(ctx, x, ln_w, ln_b, w1, b1, w2, b2, kind, eps, zcg, return_ln, activation, act_dtype, cfgs, recipe,
                fs, fh, bs, bh):
        x2 = _rows(x, act_dtype)
        g = ctx.needs_input_grad
        need_dln, need_w1, need_w2 = g[0] or g[1] or g[2], g[3], g[5]
        need_dh = need_dln or g[3] or g[4]
        qx = build_quantizer(cfgs[0], True, need_w1, *slot_views(fs, fh, FP8FwdTensors.GEMM1_INPUT))
        ln, ln_q, mu, rsigma = _fused_norm(kind, x2, ln_w, ln_b, eps, qx, act_dtype, zcg, return_ln)
        y, h = mlp_gemms_forward(ctx, ln_q, w1, b1, w2, b2, activation, act_dtype, cfgs, fs, fh, need_dln, need_w1,
                                 need_dh, need_w2)
        ctx.meta = (tuple(None if t is None else t.dtype for t in (w1, b1, w2, b2)), activation, cfgs[2], recipe)
        _keep_norm(ctx, x, kind, zcg, act_dtype, need_dln, (x2, mu, rsigma, ln_w), h if need_dh else None, bs, bh)
        return _outputs(y, x, ln)

    @staticmethod
    def backward(ctx, dy, dln_out=None):
        dtypes, activation, cfg_g, recipe = ctx.meta
        act_dtype = ctx.norm_meta[-1]
        x2, mu, rsigma, ln_w, h, bs, bh = ctx.saved_tensors
        g = ctx.needs_input_grad
        need_dln = g[0] or g[1] or g[2]
        dz, dw1, db1, dw2, db2 = mlp_gemms_backward(ctx, _rows(dy, act_dtype), h, activation, act_dtype, cfg_g, bs,
                                                    bh, (need_dln, g[3], g[4], g[5], g[6]), dtypes)
        dx = dgw = dgb = None
        if need_dln:
            dx, dgw, dgb = _norm_input_grads(ctx, dz, dln_out, x2, mu, rsigma, ln_w)
        if bs is not None:
            update_delayed_scaling(bh, bs, recipe, cfg_g[1], get_amax_reduction_group())
        return (dx, dgw, dgb, dw1, db1, dw2, db2) + (None,) * 12


class LayerNormMLP(_NormInFront, MLP):
    """fc2(act(fc1(norm(x)))): a LayerNorm or RMSNorm over hidden_size, then tex.MLP (any of its activations; gated
    ones double fc1's rows), with TE's parameter names `layer_norm_weight`, `layer_norm_bias`, `fc1_weight`,
    `fc1_bias`, `fc2_weight`, `fc2_bias` and TE's initialisation (`init_method` for fc1, `output_layer_init_method`
    for fc2, both default normal(0, 0.023); biases zeros; norm weight ones, zeros when `zero_centered_gamma`).
    `return_layernorm_output=True` returns (y, norm output). Inside `tex.autocast` the norm writes fc1's quantized
    input and MLP's fused activation path runs behind it (module docstring).

    Tensor parallel as MLP's (`tp_group`: fc1 column-, fc2 row-parallel; `sequence_parallel`: the input is this
    rank's tokens, normalized here; the norm's parameter gradients summed over the group)."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, eps: float = 1e-5, *, bias: bool = True,
                 normalization: str = "LayerNorm", activation: str = "gelu", zero_centered_gamma: bool = False,
                 return_layernorm_output: bool = False, init_method: Optional[Callable] = None,
                 output_layer_init_method: Optional[Callable] = None, params_dtype=None, device=None, tp_group=None,
                 sequence_parallel: bool = False, comm_overlap: bool = True):
        self._norm_settings("LayerNormMLP", normalization, eps, zero_centered_gamma, return_layernorm_output)
        self.init_method, self.output_layer_init_method = init_method, output_layer_init_method
        super().__init__(hidden_size, ffn_hidden_size, activation, bias, params_dtype, device, tp_group=tp_group,
                         sequence_parallel=sequence_parallel, comm_overlap=comm_overlap)
        _init_norm_params(self, self.hidden_size, normalization, self.zero_centered_gamma,
                          dict(dtype=self.fc1_weight.dtype, device=self.fc1_weight.device),
                          ("fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"))

    def reset_parameters(self):
        """TE's: init_method(fc1_weight), output_layer_init_method(fc2_weight) (defaults normal(0, 0.023)), biases
        zeros; the norm's weight ones (zeros when zero_centered_gamma), its bias zeros."""
        (self.init_method or default_init_method)(self.fc1_weight)
        (self.output_layer_init_method or default_init_method)(self.fc2_weight)
        with torch.no_grad():
            for b in (self.fc1_bias, self.fc2_bias):
                if b is not None:
                    b.zero_()
        self._reset_norm()

    def extra_repr(self):
        return f"{super().extra_repr()}, normalization={self.normalization}, eps={self.eps}"

    def forward(self, x: torch.Tensor):
        tp = self.tp_group is not None and self.tp_group.size() > 1
        return self._norm_front(f"LayerNormMLP({self.hidden_size}, {self.ffn_hidden_size}, {self.activation!r})", x,
                                self.hidden_size, "hidden_size", tp, MLP.forward, _LayerNormMLPFn,
                                (self.fc1_weight, self.fc1_bias, self.fc2_weight, self.fc2_bias), (self.activation,),
                                {"hidden_size": self.hidden_size, "ffn_hidden_size": self.ffn_hidden_size},
                                any(p.requires_grad for p in (self.fc1_weight, self.fc2_weight)))
