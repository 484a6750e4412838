"""Collective GEMM for tensor + sequence parallel layers (csrc/core/ops/collective_gemm_op.h): the all-gather before
a column-parallel GEMM and the reduce-scatter after a row-parallel one, each split into tp chunks around a ring so
that one chunk's exchange hides under another chunk's GEMM. One schedule in the core for every frontend; here it runs
over torch.distributed's process group (gloo on the CPU, NCCL on GPUs: the group's own communicator).

`all_gather_gemm(x_shard, w, group)`: x_shard [m, K] on each rank (rank r holds rows r·m … r·m + m − 1 of x), w
[N_local, K] → y [tp·m, N_local] = gather(x) · wᵀ, and the gathered x with `return_gathered=True` (kept for the
weight gradient: no second all-gather). `gemm_reduce_scatter(x, w_shard, group)`: x [M, K_local], w_shard [N,
K_local] (the rank's K shards) → y [M/tp, N], rank r's rows of Σ_ranks x·w_shardᵀ, the FP32 partial sums added in
ring order (chunk c: ranks c + 1, c + 2, …, c) and rounded once. `comm_overlap=False` runs the same exchanges to
completion first, then the same GEMMs: the non-overlapped baseline, the same bytes. `sm_margin`: the SMs the chunk
GEMMs leave to the exchanges' kernels (None: the core's default for the transport — NCCL's send/receive kernels need
SMs of their own, or they wait for a GEMM that fills the GPU to drain; gloo and the copy engine need none).

FP8 (per tensor): x and w as Float8Tensors, or plain with a `quantizer` (it quantizes each plain operand: x, and w
unless w is already FP8); the codes travel as FP8 with their scale_inv, each chunk multiplied with its own rank's
scale. Autograd: the backward is the mirrored ring (dgrad of the all-gather form is a reduce-scatter and vice versa)
and the weight gradient reads the gathered x (or dy) the rings keep — with a quantizer the gathered FP8 codes and
per-rank scales, decoded (no second all-gather); these functions' own backward GEMMs run in x's plain dtype.
The tensor-parallel tex.Linear / tex.MLP (modules.py) call the ops outside autograd and run their backward with FP8
GEMMs on the same rings (quantized dy, E5M2 under HYBRID). Not yet: FP8 backward GEMMs in these functions' own
autograd; MXFP8 / NVFP4 / FP8-block operands (NotImplementedError: the op carries one scale per rank's chunk; the
layers run those recipes through a non-overlapped path).

Bad input never hangs: before the ring every rank runs its local checks and the ranks exchange one small record
(_collective_checks.py), so a mismatch between ranks, or a bad operand on one rank, makes every rank raise the same
error before any data moves. A group of one (tp = 1) is refused: not a collective (tex.general_gemm is its GEMM).
"""
from __future__ import annotations

import torch

from . import _collective_window as _cw
from ._collective_checks import check
from ._ops import call
from .cast import quantize
from .dtypes import DType, as_dtype
from .formats.base import QuantizedTensor
from .formats.fp8 import Float8Tensor

_OP = torch.ops.te.collective_gemm.default
_LOOPBACK = torch.ops.te.collective_gemm_loopback.default
_AG, _RS = 1, 2
_CODES = {torch.float32: int(DType.kFloat32), torch.float16: int(DType.kFloat16),
          torch.bfloat16: int(DType.kBFloat16)}


def _operand(name, t, op):
    """(codes or values [rows, K], scale_inv or None, DType code)."""
    if isinstance(t, Float8Tensor):
        if t._data is None:
            raise ValueError(f"{op}: {name} needs its rowwise copy (K along its last dim); quantize with rowwise=True")
        return t._data.reshape(-1, t.shape[-1]), t._scale_inv, int(t._fp8_dtype)
    if isinstance(t, QuantizedTensor):
        raise NotImplementedError(f"{op}: not yet supported: {type(t).__name__} operands (FP8 per tensor, bf16, fp16 "
                                  f"and fp32 are)")
    if not isinstance(t, torch.Tensor) or t.dtype not in _CODES:
        raise TypeError(f"{op}: {name} must be a bf16/fp16/fp32 tensor or a Float8Tensor, got "
                        f"{getattr(t, 'dtype', type(t).__name__)}")
    return t.reshape(-1, t.shape[-1]), None, _CODES[t.dtype]


def _prepare(op, x, w, quantizer, out_dtype):
    if quantizer is not None:  # it quantizes the plain operands: x, and w unless w already is FP8
        if isinstance(x, QuantizedTensor):
            raise ValueError(f"{op}: quantizer quantizes a plain x; x is already {type(x).__name__}")
        x = quantize(x, quantizer)
        if not isinstance(w, QuantizedTensor):
            w = quantize(w.detach(), quantizer)
    xd, xs, xc = _operand("x", x, op)
    wd, ws, wc = _operand("w", w, op)
    if out_dtype is None:
        out_dtype = x.dtype if not isinstance(x, QuantizedTensor) and x.dtype in _CODES else torch.bfloat16
    return xd, xs, xc, wd, ws, wc, int(as_dtype(out_dtype, f"{op} out_dtype"))


def _group_name(group):
    import torch.distributed as dist

    group = dist.group.WORLD if group is None else group
    return group.group_name


def _margin(sm_margin) -> int:
    """None: -1, the core's default for the transport (which also refuses a negative margin)."""
    return -1 if sm_margin is None else int(sm_margin)


def _ag(x_shard, w, group, quantizer, out_dtype, return_gathered, comm_overlap, use_split_accumulator,
        sm_margin=None):
    op = "all_gather_gemm"
    xd, xs, xc, wd, ws, wc, oc = _prepare(op, x_shard, w, quantizer, out_dtype)
    y, g, gs = call(_OP, (xd, xs, xc, wd, ws, wc, _AG, _group_name(group), oc, bool(comm_overlap),
                          bool(use_split_accumulator), bool(return_gathered), _margin(sm_margin)))
    return y, (g if xs is None else (g, gs))


def _rs(x, w_shard, group, quantizer, out_dtype, comm_overlap, use_split_accumulator, sm_margin=None):
    op = "gemm_reduce_scatter"
    xd, xs, xc, wd, ws, wc, oc = _prepare(op, x, w_shard, quantizer, out_dtype)
    return call(_OP, (xd, xs, xc, wd, ws, wc, _RS, _group_name(group), oc, bool(comm_overlap),
                      bool(use_split_accumulator), False, _margin(sm_margin), _window(op, xd, wd, group)))[0]


def _window(op, xd, wd, group):
    """The copy-engine windows of a CUDA reduce-scatter ([] : the process group's NCCL; _collective_window.py)."""
    import torch.distributed as dist

    group = dist.group.WORLD if group is None else group
    if xd.device.type != "cuda" or _cw.transport(group) != "copy_engine":
        return []
    tp = group.size()
    return _cw.window(op, group, _cw.window_bytes(xd.shape[0], wd.shape[0], tp), xd.device)


def _dequantized_chunks(codes, scales, fp8_dtype, dtype):
    """The gathered FP8 x [tp·m, K] (codes, one scale_inv per rank's chunk) decoded chunk by chunk to `dtype`."""
    dq = torch.ops.te.dequantize_fp8.default
    return torch.cat([dq(c, s.reshape(1), int(fp8_dtype), dtype)
                      for c, s in zip(codes.chunk(scales.numel()), scales.unbind())])


def _plain(w, dtype):
    return w.dequantize(dtype) if isinstance(w, QuantizedTensor) else w


def _wgrad(dy, x):
    """dw [N, K] = dyᵀ · x for dy [M, N], x [M, K] (the local weight-gradient GEMM, x's dtype)."""
    from .gemm import general_gemm

    return general_gemm(x, dy, out_dtype=x.dtype, layout="NT")[0]


class _AllGatherGemm(torch.autograd.Function):
    """Forward y = AG(x_shard)·wᵀ, keeping the gathered x. Backward: dx_shard = RS(dy·w) (the reduce-scatter ring
    with dy as x and wᵀ as the rank's K shard: N_local is the split dim), dw = dyᵀ·gathered x (no second gather).
    With a quantizer the gathered x is kept as the FP8 codes and per-chunk scales that travelled, decoded for the
    weight gradient; the backward GEMMs run in x's plain dtype (w: its plain values)."""

    @staticmethod
    def forward(ctx, x_shard, w, group, quantizer, out_dtype, comm_overlap, split, sm_margin):
        y, gathered = _ag(x_shard, w, group, quantizer, out_dtype, True, comm_overlap, split, sm_margin)
        if quantizer is None:
            ctx.save_for_backward(gathered)
            ctx.fp8 = None
        else:
            codes, scales = gathered
            ctx.save_for_backward(codes, scales)
            ctx.fp8 = (quantizer.dtype, x_shard.dtype)
        ctx.w = w  # a plain parameter or a Float8Tensor (not a saveable variable)
        ctx.cfg = (group, comm_overlap, sm_margin)
        return y

    @staticmethod
    def backward(ctx, dy):
        group, comm_overlap, sm_margin = ctx.cfg
        if ctx.fp8 is None:
            (gathered,) = ctx.saved_tensors
            dtype = gathered.dtype
        else:
            fp8_dtype, dtype = ctx.fp8
            gathered = _dequantized_chunks(*ctx.saved_tensors, fp8_dtype, dtype)
        w = _plain(ctx.w, dtype).to(dtype)
        dy = dy.contiguous().to(dtype)
        dx = _rs(dy, w.t().contiguous(), group, None, dtype, comm_overlap, True, sm_margin) \
            if ctx.needs_input_grad[0] else None
        dw = _wgrad(dy, gathered).to(ctx.w.dtype) if ctx.needs_input_grad[1] else None
        ctx.w = None
        return dx, dw, None, None, None, None, None, None


class _GemmReduceScatter(torch.autograd.Function):
    """Forward y_shard = RS(x·w_shardᵀ). Backward: dx = AG(dy_shard)·w_shard (the all-gather ring, keeping the
    gathered dy), dw_shard = gathered dyᵀ·x."""

    @staticmethod
    def forward(ctx, x, w_shard, group, quantizer, out_dtype, comm_overlap, split, sm_margin):
        plain = not isinstance(x, QuantizedTensor)
        ctx.save_for_backward(x if plain else None)  # the plain x (a quantizer's FP8 copy is not kept)
        ctx.x = None if plain else x                   # an FP8 x: its values serve the weight gradient
        ctx.w = w_shard                                # a plain parameter or a Float8Tensor (not a saveable variable)
        ctx.cfg = (group, comm_overlap, sm_margin)
        return _rs(x, w_shard, group, quantizer, out_dtype, comm_overlap, split, sm_margin)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        if x is None:
            x = ctx.x.dequantize(ctx.x.dtype)
        group, comm_overlap, sm_margin = ctx.cfg
        w = _plain(ctx.w, x.dtype).to(x.dtype)
        dy = dy.contiguous().to(x.dtype)
        dx, gathered = _ag(dy, w.t().contiguous(), group, None, x.dtype, True, comm_overlap, True, sm_margin)
        dw = _wgrad(gathered, x).to(ctx.w.dtype) if ctx.needs_input_grad[1] else None
        ctx.w = ctx.x = None
        return (dx if ctx.needs_input_grad[0] else None), dw, None, None, None, None, None, None


def _differentiable(*ts):
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and not isinstance(t, QuantizedTensor)
                                           and t.requires_grad for t in ts)


def all_gather_gemm(x_shard, w, group=None, *, quantizer=None, layout="TN", out_dtype=None, return_gathered=False,
                    comm_overlap=True, use_split_accumulator=True, sm_margin=None, validate=None):
    """y [tp·m, N_local] = all_gather(x_shard [m, K]) · w [N_local, K]ᵀ over `group` (default: the world), the
    exchanges overlapped with the chunk GEMMs; with `return_gathered=True` also the gathered x [tp·m, K] (FP8: a
    (codes, scale_inv [tp]) pair, one scale per rank's chunk). Differentiable in x_shard and w (plain tensors):
    dx_shard comes from the reduce-scatter ring, dw from the gathered x kept by the forward. Every rank passes the
    same x_shard shape and dtype and the same w shape and dtype; before the ring the ranks exchange one small record
    and all raise the same error if they differ or one rank's operands are bad (`validate`: see
    _collective_checks). A group of one is refused (ValueError). `layout`: "TN" (w [N, K], D = X·Wᵀ), the only one."""
    diff = _differentiable(x_shard, w)
    check(_AG, x_shard, w, group, quantizer=quantizer, out_dtype=out_dtype, return_gathered=return_gathered,
          differentiable=diff, validate=validate, sm_margin=sm_margin, layout=layout)
    if diff:
        return _AllGatherGemm.apply(x_shard, w, group, quantizer, out_dtype, comm_overlap, use_split_accumulator,
                                    sm_margin)
    y, gathered = _ag(x_shard, w, group, quantizer, out_dtype, return_gathered, comm_overlap, use_split_accumulator,
                      sm_margin)
    return (y, gathered) if return_gathered else y


def gemm_reduce_scatter(x, w_shard, group=None, *, quantizer=None, layout="TN", out_dtype=None, comm_overlap=True,
                        use_split_accumulator=True, sm_margin=None, validate=None):
    """y [M/tp, N]: this rank's rows of Σ_ranks x [M, K_local] · w_shard [N, K_local]ᵀ over `group`, the partial
    products of the other ranks' chunks computed and sent to their owners while the next ones are computed (on CUDA
    by the copy engine into symmetric-memory windows, or NCCL: NVTE_COLLECTIVE_GEMM_TRANSPORT, _collective_window.py).
    Differentiable in x and w_shard (plain tensors): dx from the all-gather ring over dy, dw_shard from the dy it
    gathers. Every rank passes the same x and w_shard shapes and dtypes, M a multiple of tp; checked before the ring
    as in all_gather_gemm."""
    diff = _differentiable(x, w_shard)
    check(_RS, x, w_shard, group, quantizer=quantizer, out_dtype=out_dtype, differentiable=diff, validate=validate,
          sm_margin=sm_margin, layout=layout)
    if diff:
        return _GemmReduceScatter.apply(x, w_shard, group, quantizer, out_dtype, comm_overlap, use_split_accumulator,
                                        sm_margin)
    return _rs(x, w_shard, group, quantizer, out_dtype, comm_overlap, use_split_accumulator, sm_margin)


def all_gather_gemm_loopback(x, w, rank, tp, *, quantizer=None, out_dtype=None, comm_overlap=True,
                             use_split_accumulator=True):
    """One GPU simulating rank `rank` of `tp`: x [tp·m, K] holds every rank's shard; the rank's ring exchanges copy
    the chunks they bring out of it with the copy engine, on the streams and events of a real exchange. For tests and
    benchmarks of the overlap machinery (stream order, events, CUDA-graph capture) without several GPUs."""
    op = "all_gather_gemm (loopback)"
    if quantizer is not None:
        raise ValueError(f"{op}: quantize x beforehand (one Float8Tensor holding every rank's chunk)")
    xd, xs, xc, wd, ws, wc, oc = _prepare(op, x, w, None, out_dtype)
    if xd.shape[0] % tp:
        raise ValueError(f"{op}: x's {xd.shape[0]} rows must split into tp = {tp} chunks")
    m = xd.shape[0] // tp
    peers_s = None if xs is None else xs.reshape(1).expand(tp).contiguous()
    return call(_LOOPBACK, (xd[rank * m:(rank + 1) * m], xs, xc, wd, ws, wc, _AG, rank, tp, xd, peers_s, oc,
                            bool(comm_overlap), bool(use_split_accumulator), False))[0]


def gemm_reduce_scatter_loopback(x, w, incoming, rank, tp, *, out_dtype=None, comm_overlap=True,
                                 use_split_accumulator=True):
    """One GPU simulating rank `rank` of `tp` for the reduce-scatter: `incoming` FP32 [tp − 1, M/tp, N] are the partial
    products of this rank's output chunk that exchanges 0 … tp − 2 bring (exchange s: from the simulated rank
    rank − s − 1)."""
    op = "gemm_reduce_scatter (loopback)"
    xd, xs, xc, wd, ws, wc, oc = _prepare(op, x, w, None, out_dtype)
    return call(_LOOPBACK, (xd, xs, xc, wd, ws, wc, _RS, rank, tp, incoming.contiguous(), None, oc,
                            bool(comm_overlap), bool(use_split_accumulator), False))[0]


__all__ = ["all_gather_gemm", "gemm_reduce_scatter", "all_gather_gemm_loopback", "gemm_reduce_scatter_loopback"]
