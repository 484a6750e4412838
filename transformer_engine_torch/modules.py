"""Layers (SPEC §8): `Linear` and `MLP`, ordinary nn.Modules that run their GEMMs quantized inside `tex.autocast`.

Outside autocast (or with `enabled=False`) they are plain PyTorch math (`F.linear`, the differentiable tex
activations) in the parameters' or torch.autocast's dtype. Inside, each GEMM operand gets the quantizer the recipe
assigns to its role and the layers call `generic_gemm` in the standard layouts:

    fprop  TN  A = W  (rowwise)     B = X  (rowwise)     -> Y  = X·Wᵀ (+ bias)
    dgrad  NN  A = W  (columnwise)  B = dY (rowwise)     -> dX = dY·W
    wgrad  NT  A = X  (columnwise)  B = dY (columnwise)  -> dW = dYᵀ·X

(SPEC §6.4: A uses its rowwise copy iff transA, B iff not transB.) Each operand is quantized once with exactly the
copies its GEMMs need, and only the copies backward reads are kept for it (columnwise X and W; MLP: also the
columnwise activation, plus the high-precision pre-activation for the activation's derivative). MLP's activation
comes out of the fused kernel already quantized for the second GEMM; its backward is the fused dact(+dbias)
kernel producing the quantized gradient. Split accumulation: fprop off, dgrad and wgrad on (SPEC §8).

Alignment: under an FP8/FP4 recipe every GEMM dim (in_features, out_features, ffn, and the token count when
training, which is the wgrad contraction dim) must be a multiple of the recipe's alignment (16 per-tensor FP8 and
FP8 block, 32 MXFP8/NVFP4); otherwise the layer raises ValueError telling you to pad or to run the layer outside
autocast. There is no silent bf16 fallback (a fallback would hide a slow layer).

Tensor-parallel modes (`tp_group`, Linear's docstring) run under every recipe too: `_TPLinearFn` in
_tensor_parallel.py, the same GEMM layouts on this rank's shards, with the collective GEMM rings (per-tensor FP8,
sequence parallel) or torch.distributed's all-gather / reduce-scatter / all-reduce around them.

The helpers the layers share (the GEMM calls, quantizer configs, alignment, DelayedMixin) are in _layer_gemms.py.

Delayed scaling keeps per-layer scales and amax histories in non-persistent float32 buffers (moved by `.to()`, saved
in `state_dict` as the layer's `_extra_state`, TE's key: DelayedMixin); they are updated once per step per layer:
forward slots right after the layer's forward, backward slots right after its backward.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from . import activations as _act
from ._activation_table import ACTIVATIONS as _ACTIVATION_TABLE
from ._layer_gemms import (DelayedMixin, activation_dtype, check_alignment, dgrad_gemm, keep_columnwise, layer_configs,
                           layer_gemm, slot_views, wgrad_gemm)
from ._tensor_parallel import tp_alignment, tp_linear, tp_linear_quantized
from .cast import bgrad_quantize
from .enums import FP8BwdTensors, FP8FwdTensors
from .recipe import (DelayedScaling, build_quantizer, get_amax_reduction_group, get_fp8_recipe, is_calibrating,
                     is_fp8_enabled, update_delayed_scaling)

__all__ = ["Linear", "MLP", "ACTIVATIONS", "init_fp8_state"]

# name -> (forward, backward, fused dbias+backward or None, gated), from the activation table.
ACTIVATIONS = {a.name: (a.name, a.backward, a.dbias_backward, a.gated) for a in _ACTIVATION_TABLE}


# ---- Linear ----------------------------------------------------------------------------------------------------
class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, act_dtype, cfgs, recipe, fs, fh, bs, bh):
        in_features = weight.shape[1]
        x2 = x.reshape(-1, in_features)
        if x2.dtype != act_dtype:
            x2 = x2.to(act_dtype)
        need_dgrad, need_wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        qx = build_quantizer(cfgs[0], True, need_wgrad, *slot_views(fs, fh, FP8FwdTensors.GEMM1_INPUT))
        qw = build_quantizer(cfgs[1], True, need_dgrad, *slot_views(fs, fh, FP8FwdTensors.GEMM1_WEIGHT))
        x_q = qx(x2.contiguous())
        w_q = qw(weight)
        b = None if bias is None else bias.to(act_dtype)
        y = layer_gemm(w_q, True, x_q, False, act_dtype, bias=b)
        ctx.x_q = keep_columnwise(x_q) if need_wgrad else None
        ctx.w_q = keep_columnwise(w_q) if need_dgrad else None
        ctx.meta = (x.shape, x.dtype, weight.dtype, None if bias is None else bias.dtype, act_dtype, cfgs[2], recipe)
        ctx.save_for_backward(bs, bh)
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x_shape, x_dtype, w_dtype, b_dtype, act_dtype, cfg_g, recipe = ctx.meta
        bs, bh = ctx.saved_tensors
        need_dgrad, need_wgrad, need_bgrad = ctx.needs_input_grad[:3]
        dy2 = dy.reshape(-1, dy.shape[-1])
        if dy2.dtype != act_dtype:
            dy2 = dy2.to(act_dtype)
        dy2 = dy2.contiguous()
        qg = build_quantizer(cfg_g, need_dgrad, need_wgrad, *slot_views(bs, bh, FP8BwdTensors.GRAD_OUTPUT1))
        db = None
        if need_bgrad:
            db, dy_q = bgrad_quantize(dy2, qg)
            db = db.to(b_dtype)
        else:
            dy_q = qg(dy2) if (need_dgrad or need_wgrad) else None
        dx = dw = None
        if need_dgrad:
            dx = dgrad_gemm(ctx.w_q, dy_q, act_dtype).reshape(x_shape).to(x_dtype)
            ctx.w_q = None  # freed before the wgrad's GEMM, with dY's rowwise copy
            if need_wgrad:
                keep_columnwise(dy_q)
        if need_wgrad:
            dw = wgrad_gemm(ctx.x_q, dy_q, w_dtype)
        if bs is not None:
            update_delayed_scaling(bh, bs, recipe, cfg_g[1], get_amax_reduction_group())
        ctx.x_q = ctx.w_q = None
        return dx, dw, db, None, None, None, None, None, None, None


class Linear(DelayedMixin, torch.nn.Module):
    """y = x·Wᵀ + b with W `[out_features, in_features]` in `params_dtype` (default torch's default dtype), the same
    parameters, initialisation and state_dict keys as `torch.nn.Linear` plus `_extra_state` (the delayed-scaling
    state; a torch.nn.Linear state_dict loads strictly without it). Inside `tex.autocast` the three GEMMs run
    quantized by the recipe (see the module docstring); outside it is `F.linear`.

    Tensor parallel (`tp_group` a torch.distributed group of tp ranks): `parallel_mode="column"` keeps W's rows
    [out_features/tp, in_features] (and the bias's) of this rank, `"row"` W's columns [out_features, in_features/tp]
    (the bias whole, added after the reduction). With `sequence_parallel=True` the activations between layers are
    split along the tokens: a column layer takes x [tokens/tp, in] and all-gathers it inside its GEMM
    (`tex.all_gather_gemm`), a row layer returns y [tokens/tp, out] reduce-scattered out of its GEMM
    (`tex.gemm_reduce_scatter`), both with the communication overlapped (`comm_overlap=False`: the same exchanges
    first, then the GEMMs) and the backward mirrored. Without it, a column layer takes the whole x (its gradient
    all-reduced) and a row layer all-reduces its output (a sequence-parallel row layer's bias gradient is summed over
    the group, so every rank's equals the unsharded layer's). The weight is initialised as the unsharded layer's rows or
    columns would be: `torch.nn.Linear`'s bound (fan-in = the full in_features).

    Inside `tex.autocast` the tensor-parallel modes run every recipe with quantized GEMMs forward and backward (dgrad
    and wgrad with the quantized dy, E5M2 under HYBRID), the alignment rules applied to this rank's dims. Per-tensor
    FP8 (DelayedScaling, Float8CurrentScaling) with sequence parallelism runs on the collective GEMM rings: the FP8
    shards of x (column) or dy (row backward) travel as codes with their scale, overlapped with the chunk GEMMs, and
    the weight gradient reads the gathered codes. To make those codes one tensor the ranks share each scale: current
    scaling MAX-reduces the gathered tensor's amax over `tp_group`, and delayed scaling always MAX-reduces its amax
    history over `tp_group` (then over autocast's amax_reduction_group when the recipe's reduce_amax), so every rank
    holds the same scales. Not overlapped yet for block-scaled formats (the collective op carries per-tensor scales
    only): under MXFP8BlockScaling, Float8BlockScaling and NVFP4BlockScaling the layer all-gathers the high-precision
    activation or gradient with torch.distributed, runs its own quantized GEMMs and reduce-scatters FP32 partial
    products, rounded once. Without sequence parallelism every recipe runs the local quantized GEMMs and all-reduces
    the FP32 partials (the column layer's dx, the row layer's y)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, params_dtype=None, device=None, *,
                 tp_group=None, parallel_mode: Optional[str] = None, sequence_parallel: bool = False,
                 comm_overlap: bool = True):
        super().__init__()
        if parallel_mode not in (None, "column", "row"):
            raise ValueError(f"Linear: parallel_mode must be None, 'column' or 'row', got {parallel_mode!r}")
        if parallel_mode is not None and tp_group is None:
            raise ValueError(f"Linear: parallel_mode={parallel_mode!r} needs tp_group (a torch.distributed group)")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.tp_group, self.parallel_mode = tp_group, parallel_mode
        self.sequence_parallel, self.comm_overlap = bool(sequence_parallel), bool(comm_overlap)
        tp = tp_group.size() if parallel_mode is not None else 1
        split = {"column": self.out_features, "row": self.in_features}.get(parallel_mode)
        if split is not None and split % tp:
            raise ValueError(f"Linear: {parallel_mode}-parallel splits {'out' if parallel_mode == 'column' else 'in'}"
                             f"_features={split} over tp={tp} ranks: it must be a multiple of tp")
        rows = self.out_features // tp if parallel_mode == "column" else self.out_features
        cols = self.in_features // tp if parallel_mode == "row" else self.in_features
        kw = dict(dtype=params_dtype if params_dtype is not None else torch.get_default_dtype(), device=device)
        self.weight = torch.nn.Parameter(torch.empty(rows, cols, **kw))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(rows, **kw))
        else:
            self.register_parameter("bias", None)
        self._init_fp8_buffers(device)
        self.reset_parameters()

    def reset_parameters(self):
        """torch.nn.Linear's initialisation (bounds from the full, unsharded in_features)."""
        bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
        if self.parallel_mode is None:
            torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        else:  # kaiming_uniform with a = sqrt(5) is uniform(±1/sqrt(fan_in)); the shard's fan-in is not the layer's
            torch.nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def extra_repr(self):
        tp = "" if self.parallel_mode is None else (f", parallel_mode={self.parallel_mode}, sequence_parallel="
                                                     f"{self.sequence_parallel}, tp={self.tp_group.size()}")
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}{tp}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k_local = self.weight.shape[1]
        if x.shape[-1] != k_local:
            what = "this rank's in_features shard" if self.parallel_mode == "row" else "in_features"
            raise ValueError(f"Linear: input last dim {x.shape[-1]} != {what} {k_local} (input shape {tuple(x.shape)})")
        if self.parallel_mode is not None and self.tp_group.size() > 1:  # a group of one: the unsharded layer
            return self._tp_forward(x)
        if not is_fp8_enabled():
            return F.linear(x, self.weight, self.bias)
        recipe = get_fp8_recipe()
        if is_calibrating():
            y = F.linear(x, self.weight, self.bias)
            if isinstance(recipe, DelayedScaling):
                self._calibrate(recipe, [(FP8FwdTensors.GEMM1_INPUT, x), (FP8FwdTensors.GEMM1_WEIGHT, self.weight)])
            return y
        training = torch.is_grad_enabled() and (self.weight.requires_grad or x.requires_grad)
        dims = {"in_features": self.in_features, "out_features": self.out_features}
        if training and self.weight.requires_grad:
            dims["tokens (flattened leading dims of the input)"] = x.numel() // max(self.in_features, 1)
        check_alignment(f"Linear({self.in_features}, {self.out_features})", recipe, dims)
        fs, fh, bs, bh = self._delayed_state(recipe, x.device)
        act_dtype = activation_dtype(x)
        cfgs = layer_configs(recipe, act_dtype)
        y = _LinearFn.apply(x, self.weight, self.bias, act_dtype, cfgs, recipe, fs, fh, bs, bh)
        if fs is not None:
            update_delayed_scaling(fh, fs, recipe, cfgs[0][1], get_amax_reduction_group())
        return y

    def _tp_forward(self, x):
        args = (self.parallel_mode, self.tp_group, self.sequence_parallel, self.comm_overlap)
        if not is_fp8_enabled() or is_calibrating():
            y = tp_linear("Linear", x, self.weight, self.bias, *args)
            recipe = get_fp8_recipe()
            if is_fp8_enabled() and isinstance(recipe, DelayedScaling):
                self._calibrate(recipe, [(FP8FwdTensors.GEMM1_INPUT, x), (FP8FwdTensors.GEMM1_WEIGHT, self.weight)],
                                tp_group=self.tp_group)
            return y
        recipe, tp = get_fp8_recipe(), self.tp_group.size()
        name = f"Linear({self.in_features}, {self.out_features}, parallel_mode={self.parallel_mode!r}, tp={tp})"
        column = self.parallel_mode == "column"
        dims = {"in_features" if column else "in_features/tp": self.weight.shape[1],
                "out_features/tp" if column else "out_features": self.weight.shape[0]}
        tp_alignment(name, recipe, x, self.parallel_mode, tp, self.sequence_parallel, dims,
                      torch.is_grad_enabled() and self.weight.requires_grad)
        state = self._delayed_state(recipe, x.device)
        act_dtype = activation_dtype(x)
        cfgs = layer_configs(recipe, act_dtype)
        slots = (FP8FwdTensors.GEMM1_INPUT, FP8FwdTensors.GEMM1_WEIGHT, FP8BwdTensors.GRAD_OUTPUT1)
        y = tp_linear_quantized("Linear", x, self.weight, self.bias, *args, recipe, act_dtype, cfgs, slots, state)
        if state[0] is not None:
            update_delayed_scaling(state[1], state[0], recipe, cfgs[0][1], get_amax_reduction_group(),
                                   tp_group=self.tp_group)
        return y


# ---- MLP -------------------------------------------------------------------------------------------------------
def mlp_gemms_forward(ctx, x_q, w1, b1, w2, b2, activation, act_dtype, cfgs, fs, fh, need_dx, need_w1, need_dh,
                      need_w2):
    """fc1 GEMM of the quantized input `x_q`, the activation fused with fc2's input quantization, fc2 GEMM: (y
    [tokens, hidden], h the pre-activation). Keeps on `ctx` the columnwise copies backward reads (x_q, w1_q, a_q,
    w2_q). Shared by _MLPFn and norm_layers' LayerNormMLP, whose x_q is the norm's quantized output."""
    act_fwd = ACTIVATIONS[activation][0]
    _, cfg_w, _ = cfgs
    qw1 = build_quantizer(cfg_w, True, need_dx, *slot_views(fs, fh, FP8FwdTensors.GEMM1_WEIGHT))
    qa = build_quantizer(cfgs[0], True, need_w2, *slot_views(fs, fh, FP8FwdTensors.GEMM2_INPUT))
    qw2 = build_quantizer(cfg_w, True, need_dh, *slot_views(fs, fh, FP8FwdTensors.GEMM2_WEIGHT))
    w1_q = qw1(w1)
    h = layer_gemm(w1_q, True, x_q, False, act_dtype, bias=None if b1 is None else b1.to(act_dtype))
    # fc1's rowwise copies are done with: dropped before fc2's GEMM (and its decode temporaries on Hopper)
    ctx.x_q = keep_columnwise(x_q) if need_w1 else None
    ctx.w1_q = keep_columnwise(w1_q) if need_dx else None
    del x_q, w1_q
    a_q = getattr(_act, act_fwd)(h, qa)  # the fused kernel writes the activation quantized for fc2
    w2_q = qw2(w2)
    y = layer_gemm(w2_q, True, a_q, False, act_dtype, bias=None if b2 is None else b2.to(act_dtype))
    ctx.a_q = keep_columnwise(a_q) if need_w2 else None
    ctx.w2_q = keep_columnwise(w2_q) if need_dh else None
    return y, h


def mlp_gemms_backward(ctx, dy2, h, activation, act_dtype, cfg_g, bs, bh, needs, dtypes):
    """The backward of mlp_gemms_forward from dy2 [tokens, hidden] (act_dtype, contiguous): needs = (dx, w1, b1, w2,
    b2) flags, dtypes = (w1, b1, w2, b2) dtypes. Returns (dx2 [tokens, hidden] in act_dtype or None, dw1, db1, dw2,
    db2) and drops ctx's quantized copies, each as soon as its last GEMM has run (with dA and dH's rowwise copy), so
    fc1's GEMMs, whose decode temporaries make the step's peak under MXFP8 / NVFP4 on Hopper, do not run next to
    them."""
    need_dx, need_w1, need_b1, need_w2, need_b2 = needs
    w1_dtype, b1_dtype, w2_dtype, b2_dtype = dtypes
    need_dh = need_dx or need_w1 or need_b1
    _, act_bwd, act_dbias, _ = ACTIVATIONS[activation]
    # fc2: dY quantized rowwise (dgrad) and columnwise (wgrad), with the fused bias gradient.
    qg2 = build_quantizer(cfg_g, need_dh, need_w2, *slot_views(bs, bh, FP8BwdTensors.GRAD_OUTPUT2))
    db2 = db1 = dx = dw1 = dw2 = None
    if need_b2:
        db2, dy_q = bgrad_quantize(dy2, qg2)
        db2 = db2.to(b2_dtype)
    else:
        dy_q = qg2(dy2) if (need_dh or need_w2) else None
    if need_w2:
        dw2 = wgrad_gemm(ctx.a_q, dy_q, w2_dtype)
    ctx.a_q = None
    if need_dh:
        da = dgrad_gemm(ctx.w2_q, dy_q, act_dtype)
        ctx.w2_q = None
        del dy_q
        # fc1: dH = dact(dA, H) quantized for the dgrad (rowwise) and wgrad (columnwise), bias gradient fused.
        qg1 = build_quantizer(cfg_g, need_dx, need_w1, *slot_views(bs, bh, FP8BwdTensors.GRAD_OUTPUT1))
        if need_b1 and act_dbias is not None:
            db1, dh_q = getattr(_act, act_dbias)(da, h, qg1)
        elif need_b1:
            db1, dh_q = bgrad_quantize(getattr(_act, act_bwd)(da, h, None), qg1)
        elif need_dx or need_w1:
            dh_q = getattr(_act, act_bwd)(da, h, qg1)
        del da
        if db1 is not None:
            db1 = db1.to(b1_dtype)
        if need_dx:
            dx = dgrad_gemm(ctx.w1_q, dh_q, act_dtype)
            ctx.w1_q = None
            if need_w1:
                keep_columnwise(dh_q)  # the wgrad reads the columnwise copy only
        if need_w1:
            dw1 = wgrad_gemm(ctx.x_q, dh_q, w1_dtype)
    ctx.x_q = ctx.w1_q = ctx.a_q = ctx.w2_q = None
    return dx, dw1, db1, dw2, db2


class _MLPFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, activation, act_dtype, cfgs, recipe, fs, fh, bs, bh):
        hidden = w1.shape[1]
        x2 = x.reshape(-1, hidden)
        if x2.dtype != act_dtype:
            x2 = x2.to(act_dtype)
        g = ctx.needs_input_grad
        need_dx, need_w1, need_w2 = g[0], g[1], g[3]
        need_dh = need_dx or g[1] or g[2]  # the gradient reaching fc1's output (and fc2's input)
        qx = build_quantizer(cfgs[0], True, need_w1, *slot_views(fs, fh, FP8FwdTensors.GEMM1_INPUT))
        y, h = mlp_gemms_forward(ctx, qx(x2.contiguous()), w1, b1, w2, b2, activation, act_dtype, cfgs, fs, fh,
                                 need_dx, need_w1, need_dh, need_w2)
        ctx.meta = (x.shape, x.dtype, (w1.dtype, None if b1 is None else b1.dtype, w2.dtype,
                                       None if b2 is None else b2.dtype), activation, act_dtype, cfgs[2], recipe)
        ctx.save_for_backward(h if need_dh else None, bs, bh)
        return y.reshape(*x.shape[:-1], w2.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x_shape, x_dtype, dtypes, activation, act_dtype, cfg_g, recipe = ctx.meta
        h, bs, bh = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1])
        if dy2.dtype != act_dtype:
            dy2 = dy2.to(act_dtype)
        dx, dw1, db1, dw2, db2 = mlp_gemms_backward(ctx, dy2.contiguous(), h, activation, act_dtype, cfg_g, bs, bh,
                                                    ctx.needs_input_grad[:5], dtypes)
        if dx is not None:
            dx = dx.reshape(x_shape).to(x_dtype)
        if bs is not None:
            update_delayed_scaling(bh, bs, recipe, cfg_g[1], get_amax_reduction_group())
        return dx, dw1, db1, dw2, db2, None, None, None, None, None, None, None, None


class MLP(DelayedMixin, torch.nn.Module):
    """fc2(act(fc1(x))): `fc1` Linear(hidden_size → ffn_hidden_size, or 2·ffn_hidden_size for gated activations,
    whose first half goes through the nonlinearity, SPEC §3.2), `fc2` Linear(ffn_hidden_size → hidden_size).
    `activation`: any key of `ACTIVATIONS` (gelu = tanh approximation). Inside `tex.autocast` one autograd function
    runs both quantized GEMMs, the activation fused with its quantization for fc2, and the fused dact(+dbias)
    backward; outside it is plain PyTorch math. Parameters: `fc1_weight`, `fc1_bias`, `fc2_weight`, `fc2_bias`.

    Tensor parallel (`tp_group`): fc1 column-parallel (this rank's ffn/tp rows of each half for a gated activation:
    [activated rows; linear rows]), fc2 row-parallel, with `sequence_parallel` and `comm_overlap` as Linear's. Inside
    `tex.autocast` both run as tensor-parallel Linears do under every recipe (per-tensor FP8 with sequence
    parallelism on the overlapped collective GEMM rings; block-scaled formats not overlapped yet); the activation is
    then its own op between them (computed in the GEMMs' dtype, quantized by fc2), not fused with fc2's quantization."""

    _N_FWD = 6
    _N_BWD = 4

    def __init__(self, hidden_size: int, ffn_hidden_size: int, activation: str = "gelu", bias: bool = True,
                 params_dtype=None, device=None, *, tp_group=None, sequence_parallel: bool = False,
                 comm_overlap: bool = True):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"MLP: activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
        self.hidden_size, self.ffn_hidden_size, self.activation = int(hidden_size), int(ffn_hidden_size), activation
        self.gated = ACTIVATIONS[activation][3]
        self.tp_group, self.sequence_parallel, self.comm_overlap = tp_group, bool(sequence_parallel), bool(comm_overlap)
        tp = tp_group.size() if tp_group is not None else 1
        if self.ffn_hidden_size % tp:
            raise ValueError(f"MLP: tensor parallelism splits ffn_hidden_size={self.ffn_hidden_size} over tp={tp} "
                             f"ranks: it must be a multiple of tp")
        ffn = self.ffn_hidden_size // tp  # this rank's share (gated: of each half)
        fc1_out = ffn * (2 if self.gated else 1)
        kw = dict(dtype=params_dtype if params_dtype is not None else torch.get_default_dtype(), device=device)
        self.fc1_weight = torch.nn.Parameter(torch.empty(fc1_out, self.hidden_size, **kw))
        self.fc2_weight = torch.nn.Parameter(torch.empty(self.hidden_size, ffn, **kw))
        if bias:
            self.fc1_bias = torch.nn.Parameter(torch.empty(fc1_out, **kw))
            self.fc2_bias = torch.nn.Parameter(torch.empty(self.hidden_size, **kw))
        else:
            self.register_parameter("fc1_bias", None)
            self.register_parameter("fc2_bias", None)
        self._init_fp8_buffers(device)
        self.reset_parameters()

    def reset_parameters(self):
        """torch.nn.Linear's initialisation for each of the two weights and biases (bounds from the unsharded fan-in:
        uniform(±1/sqrt(fan_in)), which kaiming_uniform with a = sqrt(5) is)."""
        for (w, b), fan_in in (((self.fc1_weight, self.fc1_bias), self.hidden_size),
                               ((self.fc2_weight, self.fc2_bias), self.ffn_hidden_size)):
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            if self.tp_group is None:  # torch.nn.Linear's own call, bit for bit
                torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))
            else:  # a shard: the unsharded layer's fan-in
                torch.nn.init.uniform_(w, -bound, bound)
            if b is not None:
                torch.nn.init.uniform_(b, -bound, bound)

    def extra_repr(self):
        return (f"hidden_size={self.hidden_size}, ffn_hidden_size={self.ffn_hidden_size}, "
                f"activation={self.activation!r}, bias={self.fc1_bias is not None}")

    def _plain(self, x):
        h = F.linear(x, self.fc1_weight, self.fc1_bias)
        return F.linear(getattr(_act, ACTIVATIONS[self.activation][0])(h, None), self.fc2_weight, self.fc2_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.hidden_size:
            raise ValueError(f"MLP: input last dim {x.shape[-1]} != hidden_size {self.hidden_size} "
                             f"(input shape {tuple(x.shape)})")
        if self.tp_group is not None and self.tp_group.size() > 1:  # fc1 column-, fc2 row-parallel (a group of
            return self._tp_forward(x)                                  # one: the unsharded MLP)
        if not is_fp8_enabled():
            return self._plain(x)
        recipe = get_fp8_recipe()
        if is_calibrating():
            y = self._plain(x)
            if isinstance(recipe, DelayedScaling):
                with torch.no_grad():
                    a = getattr(_act, ACTIVATIONS[self.activation][0])(
                        F.linear(x, self.fc1_weight, self.fc1_bias), None)
                self._calibrate(recipe, [(FP8FwdTensors.GEMM1_INPUT, x), (FP8FwdTensors.GEMM1_WEIGHT, self.fc1_weight),
                                         (FP8FwdTensors.GEMM2_INPUT, a), (FP8FwdTensors.GEMM2_WEIGHT, self.fc2_weight)])
            return y
        params_grad = any(p.requires_grad for p in (self.fc1_weight, self.fc2_weight))
        dims = {"hidden_size": self.hidden_size, "ffn_hidden_size": self.ffn_hidden_size}
        if torch.is_grad_enabled() and params_grad:
            dims["tokens (flattened leading dims of the input)"] = x.numel() // max(self.hidden_size, 1)
        check_alignment(f"MLP({self.hidden_size}, {self.ffn_hidden_size}, {self.activation!r})", recipe, dims)
        fs, fh, bs, bh = self._delayed_state(recipe, x.device)
        act_dtype = activation_dtype(x)
        cfgs = layer_configs(recipe, act_dtype)
        y = _MLPFn.apply(x, self.fc1_weight, self.fc1_bias, self.fc2_weight, self.fc2_bias, self.activation,
                         act_dtype, cfgs, recipe, fs, fh, bs, bh)
        if fs is not None:
            update_delayed_scaling(fh, fs, recipe, cfgs[0][1], get_amax_reduction_group())
        return y

    def _tp_forward(self, x):
        """fc1 column-parallel, the activation (its own autograd op, not fused with fc2's quantization), fc2
        row-parallel; inside tex.autocast each through _TPLinearFn with the MLP's slots."""
        act = getattr(_act, ACTIVATIONS[self.activation][0])
        args = (self.tp_group, self.sequence_parallel, self.comm_overlap)
        if not is_fp8_enabled() or is_calibrating():
            h = tp_linear("MLP fc1", x, self.fc1_weight, self.fc1_bias, "column", *args)
            a = act(h, None)
            y = tp_linear("MLP fc2", a, self.fc2_weight, self.fc2_bias, "row", *args)
            recipe = get_fp8_recipe()
            if is_fp8_enabled() and isinstance(recipe, DelayedScaling):
                self._calibrate(recipe, [(FP8FwdTensors.GEMM1_INPUT, x), (FP8FwdTensors.GEMM1_WEIGHT, self.fc1_weight),
                                         (FP8FwdTensors.GEMM2_INPUT, a), (FP8FwdTensors.GEMM2_WEIGHT, self.fc2_weight)],
                                tp_group=self.tp_group)
            return y
        recipe, tp = get_fp8_recipe(), self.tp_group.size()
        name = f"MLP({self.hidden_size}, {self.ffn_hidden_size}, {self.activation!r}, tp={tp})"
        train = torch.is_grad_enabled() and any(p.requires_grad for p in (self.fc1_weight, self.fc2_weight))
        tp_alignment(name, recipe, x, "column", tp, self.sequence_parallel,
                      {"hidden_size": self.hidden_size, "ffn_hidden_size/tp": self.fc2_weight.shape[1]}, train)
        state = self._delayed_state(recipe, x.device)
        act_dtype = activation_dtype(x)
        cfgs = layer_configs(recipe, act_dtype)
        h = tp_linear_quantized("MLP fc1", x, self.fc1_weight, self.fc1_bias, "column", *args, recipe, act_dtype,
                                 cfgs, (FP8FwdTensors.GEMM1_INPUT, FP8FwdTensors.GEMM1_WEIGHT,
                                        FP8BwdTensors.GRAD_OUTPUT1), state)
        y = tp_linear_quantized("MLP fc2", act(h, None), self.fc2_weight, self.fc2_bias, "row", *args, recipe,
                                 act_dtype, cfgs, (FP8FwdTensors.GEMM2_INPUT, FP8FwdTensors.GEMM2_WEIGHT,
                                                   FP8BwdTensors.GRAD_OUTPUT2), state)
        if state[0] is not None:
            update_delayed_scaling(state[1], state[0], recipe, cfgs[0][1], get_amax_reduction_group(),
                                   tp_group=self.tp_group)
        return y


def init_fp8_state(model: torch.nn.Module, recipe: DelayedScaling) -> None:
    """`init_fp8_state(recipe)` on every tex layer of `model` (before torch.compile under a DelayedScaling whose
    amax_history_len is not the default)."""
    for m in model.modules():
        if isinstance(m, DelayedMixin):
            m.init_fp8_state(recipe)
