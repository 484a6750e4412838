"""Normalization (SPEC §11): LayerNorm and RMSNorm over the last dim, forward and backward, in float64 (the
independent answer), and the FP32 output step spelled out given the statistics (the exact bytes a kernel must write
once its mu / rsigma are known). The statistics' own summation order is the core's, so a kernel's mu / rsigma are
judged against the float64 ones with a tolerance, and its output bit for bit against `norm_output_f32` of them."""
import torch

from .common import F32, F64


def _check(x, gamma, beta, eps):
    h = x.shape[-1]
    if gamma.shape != (h,) or (beta is not None and beta.shape != (h,)):
        raise ValueError(f"gamma/beta must be [{h}]")
    if not eps > 0:
        raise ValueError("eps must be > 0")


def norm_gamma64(gamma, zero_centered_gamma):
    g = gamma.to(F64)
    return g + 1 if zero_centered_gamma else g


def layernorm_fwd_ref(x, gamma, beta, eps, zero_centered_gamma=False):
    """float64 (y, mu, rsigma) of LayerNorm over the last dim; mu and rsigma have the leading shape."""
    _check(x, gamma, beta, eps)
    x64 = x.to(F64)
    mu = x64.mean(-1)
    var = ((x64 - mu[..., None]) ** 2).mean(-1)
    rsigma = 1 / torch.sqrt(var + eps)
    y = (x64 - mu[..., None]) * rsigma[..., None] * norm_gamma64(gamma, zero_centered_gamma)
    return y + beta.to(F64), mu, rsigma


def rmsnorm_fwd_ref(x, gamma, eps, zero_centered_gamma=False):
    """float64 (y, rsigma) of RMSNorm over the last dim."""
    _check(x, gamma, None, eps)
    x64 = x.to(F64)
    rsigma = 1 / torch.sqrt((x64 * x64).mean(-1) + eps)
    return x64 * rsigma[..., None] * norm_gamma64(gamma, zero_centered_gamma), rsigma


def norm_output_f32(x, mu, rsigma, gamma, beta, zero_centered_gamma=False):
    """The FP32 output SPEC §11 prescribes from given FP32 statistics, one rounding per operation, no FMA:
    g = fl(1 + gamma) (zero-centred) or gamma; y = fl(fl(fl(x - mu) * rsigma) * g) + beta; RMSNorm (mu None,
    beta None): fl(fl(x * rsigma) * g). Every operand is an FP32 tensor, so each torch op rounds once."""
    x32 = x.to(F32)
    g = gamma.to(F32)
    if zero_centered_gamma:
        g = torch.ones_like(g) + g
    centred = x32 if mu is None else x32 - mu.to(F32)[..., None]
    y = (centred * rsigma.to(F32)[..., None]) * g
    return y if beta is None else y + beta.to(F32)


def norm_bwd_ref(dz, x, mu, rsigma, gamma, zero_centered_gamma=False):
    """float64 (dx, dgamma, dbeta) of SPEC §11's backward; mu None is RMSNorm (no mean term, dbeta unused).
    xhat = (x - mu) * rsigma, dyg = dz * g; LayerNorm dx = rsigma (dyg - mean(dyg) - xhat mean(dyg xhat)), RMSNorm
    dx = rsigma (dyg - xhat mean(dyg xhat)); dgamma = sum_rows dz xhat, dbeta = sum_rows dz."""
    h = x.shape[-1]
    x64, dz64 = x.to(F64).reshape(-1, h), dz.to(F64).reshape(-1, h)
    rs = rsigma.to(F64).reshape(-1, 1)
    xhat = (x64 if mu is None else x64 - mu.to(F64).reshape(-1, 1)) * rs
    dyg = dz64 * norm_gamma64(gamma, zero_centered_gamma)
    inner = dyg - xhat * (dyg * xhat).mean(-1, keepdim=True)
    if mu is not None:
        inner = inner - dyg.mean(-1, keepdim=True)
    dx = (rs * inner).reshape(x.shape)
    return dx, (dz64 * xhat).sum(0), dz64.sum(0)
