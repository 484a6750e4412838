"""LayerNorm and RMSNorm with optional quantized output (SPEC §11), TE's names and argument order.

`layernorm_fwd(input, weight, bias, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma)` ->
`[out, mu, rsigma]`; `rmsnorm_fwd(input, weight, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma)` ->
`[out, None, rsigma]`; `layernorm_bwd(dz, x, mu, rsigma, gamma, sm_margin, zero_centered_gamma)` ->
`[dx, dgamma, dbeta]`; `rmsnorm_bwd(dz, x, rsigma, gamma, sm_margin, zero_centered_gamma)` -> `[dx, dgamma]`.
`out` is what `quantize(y, quantizer)` returns for the FP32 y (the quantizer's tensor class and usages), or a plain
tensor of `otype` (torch dtype, tex.DType or int) without a quantizer. `ln_out`: a preallocated output, written and
returned — a plain tensor of `otype` and the input's shape, or a quantized tensor of the quantizer's class (filled
as `quantize(y, quantizer, ln_out)` would). `sm_margin` is a CUDA launch hint, accepted and ignored. mu and rsigma
are FP32 of shape [rows] (the input's leading dims flattened). No autograd (as TE's tex functions).
"""
from __future__ import annotations

import torch

from ._ops import call
from .cast import quantize
from .dtypes import FLOAT_DTYPES, DType, as_dtype, to_torch_dtype
from .formats.base import NO_QUANTIZER_SPEC, check_quantizer

_LAYERNORM_FWD = torch.ops.te.layernorm_fwd.default
_RMSNORM_FWD = torch.ops.te.rmsnorm_fwd.default
_LAYERNORM_BWD = torch.ops.te.layernorm_bwd.default
_RMSNORM_BWD = torch.ops.te.rmsnorm_bwd.default

_MU_RSIGMA = 0b11 << 6  # `keep` bits of mu and rsigma (after the six pieces)


def _check_tensor(op: str, name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} must be float32, float16 or bfloat16, got {t.dtype} with shape "
                        f"{tuple(t.shape)} on {t.device}")


def _otype(op: str, otype) -> int:
    d = as_dtype(otype, f"{op}: otype")
    if d not in (DType.kFloat32, DType.kFloat16, DType.kBFloat16):
        raise TypeError(f"{op}: otype must be float32, float16 or bfloat16 (kFloat32, kFloat16, kBFloat16), "
                        f"got {d.name}")
    return int(d)


def _check_eps(op: str, eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"{op}: eps must be a float, got {type(eps).__name__}")
    return float(eps)


def _norm_fwd(op: str, fwd, head: tuple, zero_centered_gamma, input, ln_out, quantizer, otype):
    """head: the op's arguments before otype (input, weight[, bias], eps)."""
    otype_code = _otype(op, otype)
    check_quantizer(op, quantizer)
    zc = bool(zero_centered_gamma)
    if quantizer is not None and (ln_out is not None or quantizer._reduces_amax):
        # A quantized ln_out, or current scaling whose amax is reduced over a group: the FP32 y, then the cast
        # (into ln_out). The bytes are the fused call's: its output step is this cast of the FP32 y.
        outs = call(fwd, (*head, int(DType.kFloat32), 0, zc, *NO_QUANTIZER_SPEC), _MU_RSIGMA | 1)
        out = quantize(outs[0], quantizer) if ln_out is None else quantize(outs[0], quantizer, ln_out)
        return out, outs[6], outs[7]
    spec = NO_QUANTIZER_SPEC if quantizer is None else quantizer._spec()
    keep = _MU_RSIGMA | (1 if quantizer is None else quantizer._pieces())
    outs = call(fwd, (*head, otype_code, 0, zc, *spec), keep)
    if quantizer is not None:
        return quantizer._wrap(outs[:6], to_torch_dtype(otype_code)), outs[6], outs[7]
    out = outs[0]
    if ln_out is not None:
        if not (isinstance(ln_out, torch.Tensor) and ln_out.shape == input.shape and ln_out.dtype == out.dtype
                and ln_out.device == input.device):
            raise ValueError(f"{op}: ln_out must be a {out.dtype} tensor of shape {tuple(input.shape)} on "
                             f"{input.device} (otype, the input's shape), got {type(ln_out).__name__} "
                             f"{getattr(ln_out, 'dtype', '')} {tuple(getattr(ln_out, 'shape', ()))}")
        ln_out.copy_(out)
        out = ln_out
    return out, outs[6], outs[7]


def layernorm_fwd(input, weight, bias, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma):
    """[out, mu, rsigma] of LayerNorm over the last dim (SPEC §11)."""
    op = "layernorm_fwd"
    _check_tensor(op, "input", input)
    _check_tensor(op, "weight", weight)
    _check_tensor(op, "bias", bias)
    out, mu, rsigma = _norm_fwd(op, _LAYERNORM_FWD, (input, weight, bias, _check_eps(op, eps)), zero_centered_gamma,
                                input, ln_out, quantizer, otype)
    return [out, mu, rsigma]


def rmsnorm_fwd(input, weight, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma):
    """[out, None, rsigma] of RMSNorm over the last dim (SPEC §11)."""
    op = "rmsnorm_fwd"
    _check_tensor(op, "input", input)
    _check_tensor(op, "weight", weight)
    out, _, rsigma = _norm_fwd(op, _RMSNORM_FWD, (input, weight, _check_eps(op, eps)), zero_centered_gamma, input,
                               ln_out, quantizer, otype)
    return [out, None, rsigma]


def layernorm_bwd(dz, x, mu, rsigma, gamma, sm_margin, zero_centered_gamma):
    """[dx, dgamma, dbeta] of LayerNorm (SPEC §11): dx of x's dtype, dgamma / dbeta of gamma's."""
    op = "layernorm_bwd"
    for name, t in (("dz", dz), ("x", x), ("gamma", gamma)):
        _check_tensor(op, name, t)
    for name, t in (("mu", mu), ("rsigma", rsigma)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    return list(call(_LAYERNORM_BWD, (dz, x, mu, rsigma, gamma, 0, bool(zero_centered_gamma))))


def rmsnorm_bwd(dz, x, rsigma, gamma, sm_margin, zero_centered_gamma):
    """[dx, dgamma] of RMSNorm (SPEC §11)."""
    op = "rmsnorm_bwd"
    for name, t in (("dz", dz), ("x", x), ("gamma", gamma)):
        _check_tensor(op, name, t)
    if not isinstance(rsigma, torch.Tensor):
        raise TypeError(f"{op}: rsigma must be a torch.Tensor, got {type(rsigma).__name__}")
    return list(call(_RMSNORM_BWD, (dz, x, rsigma, gamma, 0, bool(zero_centered_gamma))))


__all__ = ["layernorm_fwd", "rmsnorm_fwd", "layernorm_bwd", "rmsnorm_bwd"]
