"""The tensor-parallel linear of the layers (issue 33: moved out of modules.py): Linear's and MLP's column- and
row-parallel GEMMs with or without sequence parallelism, in plain precision (tp_linear) and inside tex.autocast
(tp_linear_quantized: _TPLinearFn, every recipe; per-tensor FP8 with sequence parallelism on the collective GEMM
rings of collective.py, the other cases on the layers' own quantized GEMMs with torch.distributed's all-gather /
reduce-scatter / all-reduce around them), and the alignment check on this rank's dims (tp_alignment). modules.py's
docstrings (Linear's) describe the modes.
"""
from __future__ import annotations

import typing
from typing import Optional

import torch
import torch.nn.functional as F

from ._layer_gemms import check_alignment, dgrad_gemm, keep_columnwise, layer_gemm, slot_views, wgrad_gemm
from .cast import bgrad_quantize
from . import collective  # its functions looked up at each call (tests count them by patching the module)
from .formats.fp8 import Float8Tensor
from .recipe import build_quantizer, get_amax_reduction_group, update_delayed_scaling

__all__ = ["tp_linear", "tp_linear_quantized", "tp_alignment"]


# ---- tensor parallel -------------------------------------------------------------------------------------------
# Column-parallel: this rank's rows of W, y = x·Wᵀ for its output columns. Row-parallel: this rank's columns of W
# (the matching input columns), y = Σ_ranks x_r·W_rᵀ. Sequence parallel: the activations between the two are split
# along the tokens (first dim), so the column layer all-gathers its input and the row layer reduce-scatters its
# output; without it the column layer's input gradient and the row layer's output are all-reduced.
def _all_gather_rows(t: torch.Tensor, group) -> torch.Tensor:
    """[tp·rows, cols]: every rank's `t` [rows, cols] in rank order (the non-overlapped all-gather)."""
    import torch.distributed as dist

    t = t.contiguous()
    out = t.new_empty((group.size() * t.shape[0],) + tuple(t.shape[1:]))
    dist.all_gather_into_tensor(out, t, group=group)
    return out


def _reduce_scatter_rows(t: torch.Tensor, group) -> torch.Tensor:
    """This rank's rows of Σ_ranks t [tp·rows, cols] (FP32 partials: the sum is rounded once, by the caller)."""
    import torch.distributed as dist

    t = t.contiguous()
    out = t.new_empty((t.shape[0] // group.size(),) + tuple(t.shape[1:]))
    dist.reduce_scatter_tensor(out, t, group=group)
    return out


def _all_reduce(t: torch.Tensor, group) -> torch.Tensor:
    """Σ_ranks t, in place (in t's own storage when it is contiguous)."""
    import torch.distributed as dist

    t = t.contiguous()
    dist.all_reduce(t, group=group)
    return t


class _TPAllReduceBackward(torch.autograd.Function):
    """Identity forward, all-reduce of the gradient over the TP group backward (a column-parallel layer's replicated
    input: each rank's dx holds its output columns' share)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dx):
        return _all_reduce(dx, ctx.group), None


class _TPAllReduce(torch.autograd.Function):
    """All-reduce of the row-parallel partial outputs forward, identity backward."""

    @staticmethod
    def forward(ctx, y, group):
        return _all_reduce(y.clone(), group)

    @staticmethod
    def backward(ctx, dy):
        return dy, None


class _TPSpec(typing.NamedTuple):
    """What a quantized tensor-parallel linear needs besides its tensors (plain values, fixed per call)."""

    mode: str                  # "column" or "row"
    group: object              # the TP process group
    sequence_parallel: bool
    comm_overlap: bool
    act_dtype: torch.dtype     # the dtype the GEMMs compute in
    cfgs: tuple                # (input, weight, grad_output) quantizer configs
    recipe: object
    slots: tuple               # (input slot, weight slot) of FP8FwdTensors, grad-output slot of FP8BwdTensors
    bias_dtype: Optional[torch.dtype]


def _tp_quantizer(cfg, rowwise, columnwise, scale, history, slot, group):
    """A quantizer for an operand whose shards are gathered as FP8 codes: current scaling reduces the amax over the
    TP group, so every rank quantizes with the same scale (delayed scaling gets the same from its TP-reduced amax
    history, update_delayed_scaling(tp_group=...))."""
    return build_quantizer(cfg, rowwise, columnwise, *slot_views(scale, history, slot),
                           amax_reduction_group=group if cfg[0] == "current" else None, gemm_swizzled=False)


def _transposed_fp8(q):
    """Wᵀ as a Float8Tensor [K, N] whose rowwise codes are W's columnwise copy (same scale): the collective ops take
    their w operand rowwise, and the backward rings multiply by W, not Wᵀ."""
    return Float8Tensor(data=q._transpose.reshape(q.shape[-1], -1), fp8_scale_inv=q._scale_inv,
                        fp8_dtype=q._fp8_dtype, dtype=q.dtype)


def _gathered_fp8(gathered, like, dtype):
    """The codes [tp·m, K] the all-gather ring kept, as one Float8Tensor holding only its columnwise copy (for the
    weight gradient). The ring keeps one scale_inv per rank's chunk; in a tensor-parallel layer they are equal by
    construction (_tp_quantizer), so chunk 0's is the tensor's."""
    codes, scales = gathered
    t = Float8Tensor(data=codes, fp8_scale_inv=scales[:1], fp8_dtype=like._fp8_dtype, dtype=dtype)
    t.update_usage(columnwise_usage=True, rowwise_usage=False)
    return t


def _grad_quantize(dy, quantizer, need_bgrad, bias_dtype):
    """(bias gradient or None, quantized dy or None); the bias gradient fused into the cast when both are wanted."""
    if quantizer is None:
        return (dy.float().sum(0).to(bias_dtype) if need_bgrad else None), None
    if need_bgrad:
        db, dy_q = bgrad_quantize(dy, quantizer)
        return db.to(bias_dtype), dy_q
    return None, quantizer(dy)


class _TPLinearFn(torch.autograd.Function):
    """One quantized tensor-parallel linear: x2 [tokens, K_local] (this rank's tokens for a sequence-parallel column
    layer) in the compute dtype → y [tokens', N_local]. The three GEMMs are quantized as _LinearFn's (fprop TN,
    dgrad NN, wgrad NT; gradients in the recipe's backward format, E5M2 under HYBRID).

    Per-tensor FP8 with sequence parallelism (the "ring" path) runs on the collective GEMM core, exchanges overlapped
    with the chunk GEMMs (comm_overlap=False: the same exchanges first, the same bytes): column forward
    all_gather_gemm of the FP8 x shards, backward dgrad = gemm_reduce_scatter(dy, Wᵀ), wgrad from the FP8 codes the
    forward gathered; row forward gemm_reduce_scatter, backward all_gather_gemm of the FP8 dy shards then wgrad
    from the gathered dy. Every other case runs the layer's own quantized GEMMs on this rank's operands: block-scaled
    formats (MXFP8, FP8 block, NVFP4) are not overlapped yet — the core's collective op carries per-tensor scales
    only — so with sequence parallelism the high-precision x (column forward) or dy (row backward) is all-gathered
    with torch.distributed first; the FP32 partial products (row forward, column dgrad) are reduce-scattered
    (sequence parallel) or all-reduced, then rounded once."""

    @staticmethod
    def forward(ctx, x2, weight, bias, spec, fs, fh, bs, bh):
        need_dgrad, need_wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        column, group, act = spec.mode == "column", spec.group, spec.act_dtype
        ring = spec.sequence_parallel and spec.cfgs[0][0] in ("delayed", "current")
        cfg_in, cfg_w, _ = spec.cfgs
        in_slot, w_slot, _ = spec.slots
        w_q = build_quantizer(cfg_w, True, need_dgrad, *slot_views(fs, fh, w_slot))(weight)
        b = None if bias is None else bias.to(act)
        if column and ring:
            # FP8 shards travel with their scale_inv; the fp32 output takes the bias before its one rounding.
            x_q = _tp_quantizer(cfg_in, True, False, fs, fh, in_slot, group)(x2)
            r = collective.all_gather_gemm(x_q, w_q, group, out_dtype=act if b is None else torch.float32,
                                           return_gathered=need_wgrad, comm_overlap=spec.comm_overlap,
                                           use_split_accumulator=False)
            y, gathered = r if need_wgrad else (r, None)
            y = y if b is None else (y + b.float()).to(act)
            ctx.x_q = _gathered_fp8(gathered, x_q, act) if need_wgrad else None
        else:
            if column and spec.sequence_parallel:
                x2 = _all_gather_rows(x2, group)
            x_q = build_quantizer(cfg_in, True, need_wgrad, *slot_views(fs, fh, in_slot))(x2)
            if column:
                y = layer_gemm(w_q, True, x_q, False, act, bias=b)
            else:
                if ring:
                    y = collective.gemm_reduce_scatter(x_q, w_q, group, out_dtype=torch.float32,
                                                       comm_overlap=spec.comm_overlap, use_split_accumulator=False)
                else:
                    y = layer_gemm(w_q, True, x_q, False, torch.float32)
                    y = _reduce_scatter_rows(y, group) if spec.sequence_parallel else _all_reduce(y, group)
                y = (y if b is None else y + b.float()).to(act)
            ctx.x_q = keep_columnwise(x_q) if need_wgrad else None
        ctx.w_q = keep_columnwise(w_q) if need_dgrad else None
        ctx.spec, ctx.ring, ctx.w_dtype = spec, ring, weight.dtype
        ctx.save_for_backward(bs, bh)
        return y

    @staticmethod
    def backward(ctx, dy):
        spec, ring = ctx.spec, ctx.ring
        bs, bh = ctx.saved_tensors
        need_dgrad, need_wgrad, need_bgrad = ctx.needs_input_grad[:3]
        column, group, act = spec.mode == "column", spec.group, spec.act_dtype
        cfg_g, g_slot = spec.cfgs[2], spec.slots[2]
        dy2 = dy.to(act).contiguous()
        dx = dw = db = None
        if not column and ring and need_dgrad:
            # dy shards as FP8 (one scale over the group) through the all-gather ring: dx = AG(dy)·W, and the
            # gathered codes are the weight gradient's dy. The bias gradient: FP32 sums of the shards, all-reduced.
            dy_q = _tp_quantizer(cfg_g, True, False, bs, bh, g_slot, group)(dy2)
            if need_bgrad:
                db = _all_reduce(dy2.float().sum(0), group).to(spec.bias_dtype)
            r = collective.all_gather_gemm(dy_q, _transposed_fp8(ctx.w_q), group, out_dtype=act,
                                           return_gathered=need_wgrad, comm_overlap=spec.comm_overlap,
                                           use_split_accumulator=True)
            dx, gathered = r if need_wgrad else (r, None)
            if need_wgrad:
                dw = wgrad_gemm(ctx.x_q, _gathered_fp8(gathered, dy_q, act), ctx.w_dtype)
        else:
            if not column and spec.sequence_parallel:  # the row layer's output was scattered: gather its gradient
                dy2 = _all_gather_rows(dy2, group)
            qg = (build_quantizer(cfg_g, need_dgrad, need_wgrad, *slot_views(bs, bh, g_slot))
                  if need_dgrad or need_wgrad else None)
            db, dy_q = _grad_quantize(dy2, qg, need_bgrad, spec.bias_dtype)
            if need_dgrad:
                if not column:
                    dx = dgrad_gemm(ctx.w_q, dy_q, act)
                elif ring:
                    dx = collective.gemm_reduce_scatter(dy_q, _transposed_fp8(ctx.w_q), group, out_dtype=act,
                                                        comm_overlap=spec.comm_overlap, use_split_accumulator=True)
                else:  # each rank's output columns' share of dx, summed over the group in FP32
                    dx = layer_gemm(ctx.w_q, False, dy_q, False, torch.float32, split=True)
                    dx = (_reduce_scatter_rows(dx, group) if spec.sequence_parallel else _all_reduce(dx, group))
                    dx = dx.to(act)
            if need_wgrad:
                dw = wgrad_gemm(ctx.x_q, dy_q, ctx.w_dtype)
        if bs is not None:
            update_delayed_scaling(bh, bs, spec.recipe, cfg_g[1], get_amax_reduction_group(), tp_group=group)
        ctx.x_q = ctx.w_q = None
        return dx, dw, db, None, None, None, None, None


def _tp_shapes(layer: str, x, mode: str, tp: int, sequence_parallel: bool):
    """(x as [tokens, K_local], the output's leading dims). A sequence-parallel row layer scatters the first dim."""
    lead = tuple(x.shape[:-1])
    if sequence_parallel and mode == "row":
        first = lead[0] if lead else 1
        if first % tp:
            raise ValueError(f"{layer}: a sequence-parallel row layer scatters the first dim of its input "
                             f"{tuple(x.shape)} over tp={tp} ranks: it must be a multiple of tp")
        lead = (first // tp,) + lead[1:] if lead else lead
    elif sequence_parallel:
        lead = (lead[0] * tp,) + lead[1:] if lead else lead
    return x.reshape(-1, x.shape[-1]), lead


def tp_linear(layer: str, x, w, bias, mode: str, group, sequence_parallel: bool, comm_overlap: bool):
    """One tensor-parallel linear in plain precision (outside tex.autocast; Linear's docstring): y = x·wᵀ + bias with
    w this rank's rows ("column") or columns ("row"); sequence parallel: all-gather of x's first dim inside the GEMM
    (column) or reduce-scatter of y's (row), else the all-reduce of the column layer's input gradient or of the row
    layer's output."""
    x2, lead = _tp_shapes(layer, x, mode, group.size(), sequence_parallel)
    w = w.to(x2.dtype)
    if mode == "column":
        if sequence_parallel:  # x holds this rank's tokens (first dim); y all of them
            y = collective.all_gather_gemm(x2.contiguous(), w, group, comm_overlap=comm_overlap)
        else:
            y = F.linear(_TPAllReduceBackward.apply(x2, group), w)
        if bias is not None:
            y = y + bias.to(y.dtype)
    else:
        if sequence_parallel:  # y: this rank's share of the tokens (first dim)
            y = collective.gemm_reduce_scatter(x2.contiguous(), w, group, comm_overlap=comm_overlap)
        else:
            y = _TPAllReduce.apply(F.linear(x2, w), group)
        if bias is not None:  # sequence parallel: each rank adds it to its tokens, so its grad is summed
            bias = _TPAllReduceBackward.apply(bias, group) if sequence_parallel else bias
            y = y + bias.to(y.dtype)
    return y.reshape(*lead, y.shape[-1])


def tp_linear_quantized(layer: str, x, w, bias, mode: str, group, sequence_parallel: bool, comm_overlap: bool,
                         recipe, act_dtype, cfgs, slots, state):
    """One tensor-parallel linear inside tex.autocast (_TPLinearFn), x in any leading shape."""
    x2, lead = _tp_shapes(layer, x, mode, group.size(), sequence_parallel)
    x2 = x2.to(act_dtype).contiguous()
    spec = _TPSpec(mode, group, bool(sequence_parallel), bool(comm_overlap), act_dtype, cfgs, recipe, slots,
                   None if bias is None else bias.dtype)
    y = _TPLinearFn.apply(x2, w, bias, spec, *state)
    return y.reshape(*lead, y.shape[-1])


def tp_alignment(layer: str, recipe, x, mode: str, tp: int, sequence_parallel: bool, dims: dict,
                  weight_grad: bool) -> None:
    """check_alignment on this rank's GEMM dims; the wgrad's contraction dim is the gathered token count."""
    if weight_grad:
        tokens = x.numel() // max(x.shape[-1], 1)
        if sequence_parallel and mode == "column":
            tokens *= tp
        dims = dict(dims, **{"tokens (flattened leading dims of the input, all ranks')": tokens})
    check_alignment(layer, recipe, dims)
