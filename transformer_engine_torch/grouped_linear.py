"""`GroupedLinear`: the experts layer of a mixture of experts, y[rows of g] = x[rows of g]·W_gᵀ + b_g, over the
grouped GEMM with the group sizes on the device (gemm.py: `grouped_gemm`, `grouped_gemm_wgrad`).

The row counts `m_splits` stay where they are: a device tensor is read only by the kernels (no host sync, so a
training step can be captured in a CUDA graph with the routing changing between replays); a Python list (or a CPU
tensor) is checked, then copied once per call through pinned memory (no wait for the GPU either). The GEMMs:

    fprop  y  = grouped_gemm(x, [W_g])                  w "NK"  (W_g [out, in] as stored)
    dgrad  dx = grouped_gemm(dy, [W_g])                 w "KN"  plain; FP8 per tensor "NK" of W_gᵀ (its columnwise
                                                                copy: FP8 tensor cores take only that layout)
    wgrad  dW = grouped_gemm_wgrad(dy, x)               plain operands only (there is no quantized grouped wgrad):
                                                        the values of the quantized copies, dequantized
    dbias  db = grouped_gemm_wgrad(dy, ones)            the per-group row sums, same size rules, deterministic

Under `tex.autocast` each operand gets the quantizer the recipe assigns to its role, as in `tex.Linear`: x one
quantizer (the grouped kernel takes one x scale), each W_g its own (delayed scaling: one slot each), dy one.
"""
from __future__ import annotations

import typing
from typing import Callable, Optional

import torch

from ._layer_gemms import (DelayedMixin, activation_dtype, check_alignment, keep_columnwise, layer_configs,
                           slot_views)
from .formats.fp8 import Float8Tensor
from .gemm import grouped_gemm, grouped_gemm_wgrad
from .recipe import (DelayedScaling, build_quantizer, get_amax_reduction_group, get_fp8_recipe, is_calibrating,
                     is_fp8_enabled, update_delayed_scaling)

__all__ = ["GroupedLinear"]

_FP8_VIEW = {"kFloat8E4M3": torch.float8_e4m3fn, "kFloat8E5M2": torch.float8_e5m2}
_PER_TENSOR = ("delayed", "current")
_ONES_COLS = 8  # the bias gradient's ones operand: 8 bf16 columns = 16 B, the CUDA kernels' row alignment


def _row_groups(sizes: torch.Tensor, rows: int) -> torch.Tensor:
    """int64 [rows]: the group of each row under the grouped GEMM's size rules (negative sizes count as 0, sizes cut
    at `rows`), `groups` for the rows past the last group. Computed on the device: no host sync."""
    ends = torch.cumsum(sizes.clamp(min=0).to(torch.int64), 0)
    return torch.searchsorted(ends, torch.arange(rows, device=sizes.device), right=True)


def _to_device(sizes: torch.Tensor, device) -> torch.Tensor:
    """Host sizes on `device`: into a CUDA device through pinned memory, so the copy does not wait for the GPU (a
    pageable copy would synchronise the host with the stream)."""
    if torch.device(device).type != "cuda" or torch.compiler.is_compiling():
        return sizes.to(device)
    return sizes.pin_memory().to(device, non_blocking=True)


def _only(q, rowwise: bool):
    """A view of block-format tensor `q` that holds only its rowwise (or columnwise) copy, so that `dequantize`
    reads that copy (it prefers the rowwise one)."""
    v = q._map(lambda t: t)
    v.update_usage(**({"columnwise_usage": False} if rowwise else {"rowwise_usage": False}))
    return v


def _values(q, rowwise: bool, dtype):
    """The values a GEMM reads from quantized `q`'s rowwise (or columnwise) copy, in `dtype`. Both copies of a
    per-tensor FP8 tensor hold one value, so its stored copy is read, whichever it is."""
    if isinstance(q, Float8Tensor):
        return q.dequantize(dtype)
    return _only(q, rowwise).dequantize(dtype)


def _bias_grad(dy: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """[groups, out]: the sum of dy's rows of each group (FP32 accumulation, one rounding), as the grouped wgrad GEMM
    of dy with a column of ones: the GEMM's size rules and no atomics, so the bits do not depend on scheduling."""
    ones = dy.new_ones(dy.shape[0], _ONES_COLS)
    return grouped_gemm_wgrad(dy, ones, sizes, out_dtype=dy.dtype)[:, :, 0]


class _GroupedLinearFn(torch.autograd.Function):
    """Inputs: x, sizes (int32 [G] on x's device), act_dtype, cfgs (None: plain math), recipe, the delayed state
    (fs, fh, bs, bh or Nones), G, then the G weights and the G biases (none when the layer has no bias)."""

    @staticmethod
    def forward(ctx, x, sizes, act_dtype, cfgs, recipe, fs, fh, bs, bh, n, *params):
        weights, biases = params[:n], params[n:]
        out_features, in_features = weights[0].shape
        x2 = x.reshape(-1, in_features)
        if x2.dtype != act_dtype:
            x2 = x2.to(act_dtype)
        x2 = x2.contiguous()
        need_dx = ctx.needs_input_grad[0]
        need_dw = any(ctx.needs_input_grad[10:10 + n])
        if cfgs is None:
            w = torch.stack([wg.to(act_dtype) for wg in weights])  # [G, out, in]
            y = grouped_gemm(x2, w, sizes, out_dtype=act_dtype)
            ctx.x_q = ctx.w_q = None
            saved = (x2 if need_dw else None, w if need_dx else None)
        else:
            per_tensor = cfgs[0][0] in _PER_TENSOR
            # Per-tensor FP8's wgrad reads the rowwise values (both copies are one value): no columnwise x, dy.
            # The grouped GEMM slices x and dy by group: compact scales (gemm_swizzled=False).
            qx = build_quantizer(cfgs[0], True, need_dw and not per_tensor, *slot_views(fs, fh, 0), gemm_swizzled=False)
            x_q = qx(x2)
            w_q = [build_quantizer(cfgs[1], True, need_dx, *slot_views(fs, fh, 1 + g), gemm_swizzled=False)(weights[g])
                   for g in range(n)]
            y = grouped_gemm(x_q, w_q, sizes, out_dtype=act_dtype, use_split_accumulator=False)  # fprop: as Linear
            ctx.x_q = (x_q if per_tensor else keep_columnwise(x_q)) if need_dw else None
            ctx.w_q = [keep_columnwise(q) for q in w_q] if need_dx else None
            saved = (None, None)
        if biases:
            # Added to the GEMM's rounded output (the grouped kernel has no bias epilogue, and an FP32 output would
            # leave its tensor-core path): two roundings where Linear has one. Rows past the groups get none.
            b = torch.cat([torch.stack(biases).to(act_dtype), y.new_zeros(1, out_features)])
            y = y + b[_row_groups(sizes, x2.shape[0])]
        ctx.meta = (x.shape, x.dtype, weights[0].dtype, biases[0].dtype if biases else None, act_dtype,
                    None if cfgs is None else cfgs[2], recipe, n, len(biases))
        ctx.save_for_backward(sizes, bs, bh, *saved)
        return y.reshape(*x.shape[:-1], out_features)

    @staticmethod
    def backward(ctx, dy):
        x_shape, x_dtype, w_dtype, b_dtype, act_dtype, cfg_g, recipe, n, n_bias = ctx.meta
        sizes, bs, bh, x2, w = ctx.saved_tensors
        need_dx = ctx.needs_input_grad[0]
        need_dw = any(ctx.needs_input_grad[10:10 + n])
        need_db = any(ctx.needs_input_grad[10 + n:])
        dy2 = dy.reshape(-1, dy.shape[-1])
        if dy2.dtype != act_dtype:
            dy2 = dy2.to(act_dtype)
        dy2 = dy2.contiguous()
        dx = dw = db = None
        if need_db:
            db = _bias_grad(dy2, sizes).to(b_dtype)
        if cfg_g is None:
            if need_dx:
                dx = grouped_gemm(dy2, w, sizes, w_layout="KN", out_dtype=act_dtype)
            if need_dw:
                dw = grouped_gemm_wgrad(dy2, x2, sizes, out_dtype=act_dtype)
        elif need_dx or need_dw:
            per_tensor = cfg_g[0] in _PER_TENSOR
            qg = build_quantizer(cfg_g, need_dx or per_tensor, need_dw and not per_tensor, *slot_views(bs, bh, 0),
                                 gemm_swizzled=False)
            dy_q = qg(dy2)
            if need_dx and per_tensor:
                # FP8 tensor cores multiply only "NK" operands: W_gᵀ [in, out] is W_g's columnwise copy, as stored.
                codes = torch.stack([q._transpose for q in ctx.w_q]).view(_FP8_VIEW[ctx.w_q[0]._fp8_dtype.name])
                scale_inv = torch.cat([q._scale_inv.reshape(1) for q in ctx.w_q])
                dx = grouped_gemm(dy_q, codes, sizes, w_scale_inv=scale_inv, out_dtype=act_dtype,
                                  use_split_accumulator=True)
            elif need_dx:  # block formats: the emulation (SPEC §6.7) with the copies Linear's dgrad reads
                w_c = torch.stack([_values(q, False, act_dtype) for q in ctx.w_q])
                dx = grouped_gemm(_values(dy_q, True, act_dtype), w_c, sizes, w_layout="KN", out_dtype=act_dtype)
            if need_dw:
                dw = grouped_gemm_wgrad(_values(dy_q, False, act_dtype), _values(ctx.x_q, False, act_dtype), sizes,
                                        out_dtype=act_dtype)
        if bs is not None:
            update_delayed_scaling(bh, bs, recipe, cfg_g[1], get_amax_reduction_group())
        ctx.x_q = ctx.w_q = None
        if dx is not None:
            dx = dx.reshape(x_shape).to(x_dtype)
        dws = [None] * n if dw is None else [d.to(w_dtype) for d in dw.unbind(0)]
        dbs = [None] * n_bias if db is None else list(db.unbind(0))
        return (dx, None, None, None, None, None, None, None, None, None, *dws, *dbs)


class GroupedLinear(DelayedMixin, torch.nn.Module):
    """`num_gemms` linear layers applied to consecutive row groups of one input (TE's `GroupedLinear`):
    `forward(inp, m_splits)` with inp [M_total, in_features] (or [..., in_features], flattened) and `m_splits` the
    row count of each group, in order — an int32/int64 tensor of `num_gemms` entries (on the device: read by the
    kernels only, never on the host) or a list of ints. Returns [..., out_features]: y[rows of g] = x·W_gᵀ + b_g.

    Parameters as TE names them: `weight0` .. `weight{G-1}` [out_features, in_features] and `bias0` .. `bias{G-1}`
    [out_features] in `params_dtype` (default torch's default dtype). Initialisation as TE's: `init_method(weight)`
    for each weight (default normal, mean 0, std 0.023), biases zero.

    Outside `tex.autocast` the GEMMs run in the parameters' (or torch.autocast's) dtype; inside, quantized by the
    recipe (every recipe): per-tensor FP8 (DelayedScaling, Float8CurrentScaling) runs fprop and dgrad on FP8 grouped
    kernels; Float8BlockScaling runs fprop natively (1x128 x and 128x128 weight tiles) and, like MXFP8 and NVFP4 for
    every GEMM, dgrad emulated (dequantized copies through the bf16 grouped GEMM). The weight gradient is always the
    plain grouped wgrad of the dequantized copies Linear's wgrad reads (there is no quantized grouped wgrad kernel),
    in the activation dtype as TE's GroupedLinear computes it, then cast to the weights' dtype. x and dy are quantized
    as one tensor each (the kernels take one x scale), so a block of a columnwise copy (32, 128 or 16 rows) may span
    two groups: a finer or coarser scale for those rows, never a value of one group in another's product.

    m_splits given on the host (a list, or a CPU tensor when not compiling) must be non-negative and sum to the
    input's rows (ValueError otherwise); a device tensor cannot be checked without a sync, and follows the grouped
    GEMM's rules: negative sizes count as 0, sizes past the rows are cut there, rows past the groups come out zero
    (no bias) with a zero input gradient. Delayed scaling keeps 1 + num_gemms forward slots (input, then each
    weight) and one backward slot (grad_output), updated as Linear's."""

    def __init__(self, num_gemms: int, in_features: int, out_features: int, *, bias: bool = True, params_dtype=None,
                 device=None, init_method: Optional[Callable[[torch.Tensor], typing.Any]] = None):
        super().__init__()
        if int(num_gemms) < 1:
            raise ValueError(f"GroupedLinear: num_gemms must be >= 1, got {num_gemms}")
        self.num_gemms, self.in_features, self.out_features = int(num_gemms), int(in_features), int(out_features)
        self.use_bias = bool(bias)
        self.init_method = init_method
        kw = dict(dtype=params_dtype if params_dtype is not None else torch.get_default_dtype(), device=device)
        for g in range(self.num_gemms):
            self.register_parameter(f"weight{g}", torch.nn.Parameter(torch.empty(out_features, in_features, **kw)))
            if self.use_bias:
                self.register_parameter(f"bias{g}", torch.nn.Parameter(torch.empty(out_features, **kw)))
        self._N_FWD, self._N_BWD = 1 + self.num_gemms, 1  # delayed-scaling slots: input, weight g; grad_output
        self._init_fp8_buffers(device)
        self.reset_parameters()

    def reset_parameters(self):
        """TE's initialisation: init_method(weight) (default normal(0, 0.023)) and zero biases."""
        for w in self._weights():
            if self.init_method is None:
                torch.nn.init.normal_(w, mean=0.0, std=0.023)
            else:
                with torch.no_grad():
                    self.init_method(w)
        for b in self._biases():
            torch.nn.init.zeros_(b)

    def _weights(self):
        return [getattr(self, f"weight{g}") for g in range(self.num_gemms)]

    def _biases(self):
        return [getattr(self, f"bias{g}") for g in range(self.num_gemms)] if self.use_bias else []

    def extra_repr(self):
        return (f"num_gemms={self.num_gemms}, in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.use_bias}")

    def _sizes(self, m_splits, rows: int, device) -> torch.Tensor:
        """m_splits as int32 [num_gemms] on `device`, checked where its values are on the host."""
        g = self.num_gemms
        if isinstance(m_splits, torch.Tensor):
            if m_splits.dim() != 1 or m_splits.shape[0] != g:
                raise ValueError(f"GroupedLinear: m_splits must hold one row count per GEMM (num_gemms={g}), got a "
                                 f"tensor of shape {list(m_splits.shape)}")
            if m_splits.dtype not in (torch.int32, torch.int64):
                raise TypeError(f"GroupedLinear: m_splits must be an int32 or int64 tensor (or a list of ints), got "
                                f"{m_splits.dtype}")
            if m_splits.device.type == "cpu":
                if not torch.compiler.is_compiling():
                    self._check_host_sizes(m_splits.tolist(), rows)
                return _to_device(m_splits.to(torch.int32), device)
            return m_splits.to(device=device, dtype=torch.int32)
        if not isinstance(m_splits, (list, tuple)):
            raise TypeError(f"GroupedLinear: m_splits must be a list of ints or an int tensor, got "
                            f"{type(m_splits).__name__}")
        if len(m_splits) != g:
            raise ValueError(f"GroupedLinear: m_splits must hold one row count per GEMM (num_gemms={g}), got "
                             f"{len(m_splits)}: {list(m_splits)}")
        self._check_host_sizes(m_splits, rows)
        return _to_device(torch.tensor([int(s) for s in m_splits], dtype=torch.int32), device)

    @staticmethod
    def _check_host_sizes(sizes, rows: int) -> None:
        if any(int(s) < 0 for s in sizes):
            raise ValueError(f"GroupedLinear: m_splits must be >= 0, got {list(sizes)}")
        total = sum(int(s) for s in sizes)
        if total != rows:
            raise ValueError(f"GroupedLinear: m_splits {list(sizes)} sum to {total}, but the input has {rows} rows; "
                             f"every row must belong to exactly one GEMM")

    def forward(self, inp: torch.Tensor, m_splits) -> torch.Tensor:
        if inp.dim() < 1 or inp.shape[-1] != self.in_features:
            raise ValueError(f"GroupedLinear: input last dim {inp.shape[-1] if inp.dim() else None} != in_features "
                             f"{self.in_features} (input shape {tuple(inp.shape)})")
        rows = inp.numel() // max(self.in_features, 1)
        sizes = self._sizes(m_splits, rows, inp.device)
        weights, biases = self._weights(), self._biases()
        recipe, cfgs, state = None, None, (None, None, None, None)
        act_dtype = activation_dtype(inp)
        if is_fp8_enabled():
            recipe = get_fp8_recipe()
            if is_calibrating():
                y = _GroupedLinearFn.apply(inp, sizes, act_dtype, None, None, *state, self.num_gemms, *weights,
                                           *biases)
                if isinstance(recipe, DelayedScaling):
                    self._calibrate(recipe, [(0, inp)] + [(1 + g, w) for g, w in enumerate(weights)])
                return y
            dims = {"in_features": self.in_features, "out_features": self.out_features}
            training = torch.is_grad_enabled() and any(w.requires_grad for w in weights)
            if training and not recipe.float8_per_tensor_scaling():  # columnwise copies of x and dy along the rows
                dims["tokens (flattened leading dims of the input)"] = rows
            check_alignment(f"GroupedLinear({self.num_gemms}, {self.in_features}, {self.out_features})", recipe,
                             dims)
            state = self._delayed_state(recipe, inp.device)
            cfgs = layer_configs(recipe, act_dtype)
        y = _GroupedLinearFn.apply(inp, sizes, act_dtype, cfgs, recipe, *state, self.num_gemms, *weights, *biases)
        if state[0] is not None:
            update_delayed_scaling(state[1], state[0], recipe, cfgs[0][1], get_amax_reduction_group())
        return y
