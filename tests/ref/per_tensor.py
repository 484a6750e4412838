"""Per-tensor FP8 scaling: amax (SPEC §2), delayed scaling (§4.2) and its amax-history update (§4.3), current
scaling (§4.4), dequantize, and the activation -> FP8 fusion paths (§5.1). Inputs are torch tensors; every FP32 step
is one torch op on float32 tensors, which rounds once, to nearest even."""
import torch

from .common import F32, FLT_MAX
from .fp8 import FP8_MAX, fmt_of, fp8_decode, fp8_encode


def amax_ref(x):
    """max |x| in FP32, NaN ignored, empty -> 0. Returns a 0-d float32 tensor."""
    a = x.detach().to(F32).abs().reshape(-1)
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    if a.numel() == 0:
        return torch.zeros((), dtype=F32)
    return a.max()


def reciprocal_f32(s):
    """fl(1/s) in FP32."""
    return torch.ones((), dtype=F32) / s.to(F32)


def clear_mantissa(s):
    """Round a positive FP32 value down to a power of two (clear the 23 mantissa bits)."""
    bits = s.to(F32).reshape(()).view(torch.int32)
    return torch.bitwise_and(bits, torch.tensor(-8388608, dtype=torch.int32)).view(F32)  # 0xFF800000


def current_scale_ref(amax, fmt, pow2=False, eps=0.0):
    """SPEC §4.4 step 3. amax: 0-d float32 tensor. Returns a 0-d float32 scale."""
    fmt = fmt_of(fmt)
    a = amax.to(F32).reshape(())
    eps32 = torch.tensor(eps, dtype=F32)
    if bool(a < eps32):
        a = eps32
    if bool(a == 0) or bool(torch.isinf(a)) or bool(torch.isnan(a)):
        scale = torch.ones((), dtype=F32)
    else:
        scale = torch.tensor(FP8_MAX[fmt], dtype=F32) / a      # fp32 division
        if bool(torch.isinf(scale)):
            scale = torch.tensor(FLT_MAX, dtype=F32)
    if pow2:
        scale = clear_mantissa(scale)
    return scale


class QRef:
    """Result of a reference quantization: codes (input shape), transposed codes, scale_inv, amax."""

    def __init__(self, codes, scale_inv, amax=None, scale=None):
        self.codes = codes
        self.t_codes = transpose_codes(codes)
        self.scale_inv = scale_inv.reshape(1)
        self.amax = None if amax is None else amax.reshape(1)
        self.scale = scale


def transpose_codes(codes):
    """[d0..dn-2, K] -> the [K, M] bitwise transpose, reshaped to (K,) + shape[:-1].
    0-d -> shape (1,)."""
    if codes.dim() == 0:
        return codes.reshape(1).clone()
    K = codes.shape[-1]
    M = codes.numel() // K if K else int(torch.tensor(codes.shape[:-1]).prod().item())
    return codes.reshape(M, K).t().contiguous().reshape((K,) + tuple(codes.shape[:-1]))


def quantize_delayed_ref(x, scale, amax_old, fmt):
    """SPEC §4.2: q = fp8(fl(x * scale)), amax_new = max(amax_old, amax(x)), scale_inv = fl(1/scale)."""
    fmt = fmt_of(fmt)
    s = scale.to(F32).reshape(())
    xf = x.detach().to(F32)
    codes = fp8_encode(xf * s, fmt)                     # one fp32 multiply, then the encoder
    amax_new = torch.maximum(amax_old.to(F32).reshape(()), amax_ref(xf))
    return QRef(codes, reciprocal_f32(s), amax_new, s)


def quantize_current_ref(x, fmt, pow2=False, eps=0.0, amax=None, data=None):
    """SPEC §4.4: amax over `x` (or the given amax), scale rule, q = fp8(fl(data * scale)).
    `data` defaults to x (the fused activation path passes the rounded activation here)."""
    fmt = fmt_of(fmt)
    xf = x.detach().to(F32)
    a = amax_ref(xf) if amax is None else amax.to(F32).reshape(())
    scale = current_scale_ref(a, fmt, pow2, eps)
    d = xf if data is None else data.detach().to(F32)
    codes = fp8_encode(d * scale, fmt)
    return QRef(codes, reciprocal_f32(scale), a, scale)


def dequantize_ref(codes, scale_inv, fmt, otype):
    """fl(decode(code) * scale_inv) in FP32, rounded once to otype."""
    return (fp8_decode(codes, fmt) * scale_inv.to(F32).reshape(())).to(otype)


# Delayed-scaling update (SPEC §4.3)
def amax_and_scale_update_ref(buffer, histories, scales, algo, fmt, margin):
    """Returns new (histories, scales) lists; the inputs are not modified."""
    fmt = fmt_of(fmt)
    fmax_m = torch.tensor(FP8_MAX[fmt], dtype=F32) * torch.tensor(2.0 ** (-margin), dtype=F32)
    new_h, new_s = [], []
    off = 0
    for hist, scale in zip(histories, scales):
        h = hist.detach().to(F32).clone()
        s = scale.detach().to(F32).clone()
        L, n = h.shape
        for j in range(n):
            last = h[0, j].clone()
            if buffer is not None and float(buffer[off + j]) != 0.0:
                last = buffer[off + j].to(F32).clone()
            if float(last) != 0.0:
                old = h[:, j].clone()
                if algo == "max":
                    amax = torch.max(torch.cat([old[1:], last.reshape(1)]))
                else:
                    amax = last
                col = torch.zeros(L, dtype=F32)
                if L > 1:
                    col[1:L - 1] = old[2:L]
                    col[L - 1] = last
                h[:, j] = col
            else:
                amax = torch.zeros((), dtype=F32)
            if bool(torch.isfinite(amax)) and float(amax) > 0:
                sc = fmax_m / amax
                if bool(torch.isinf(sc)):
                    sc = torch.tensor(FLT_MAX, dtype=F32)
                s[j] = sc
        off += n
        new_h.append(h)
        new_s.append(s)
    return new_h, new_s


# Fusion paths (SPEC §5.1): activation -> FP8
def rnd_in(v32, dtype):
    """Round an FP32 tensor to the input dtype and widen back (identity for FP32)."""
    return v32.to(dtype).to(F32)


def act_fp8_delayed_ref(v64, scale, amax_old, fmt):
    """FULLY_FUSED delayed: q = fp8(fl(act_f32 * scale)) on the UNROUNDED FP32 activation."""
    v32 = v64.to(F32)
    return quantize_delayed_ref(v32, scale, amax_old, fmt)


def act_fp8_current_ref(v64, in_dtype, fmt, pow2=False, eps=0.0):
    """FUSED_ACTIVATION_AMAX_FP8: amax of the unrounded FP32 activation, data rounded to the
    input dtype before scaling."""
    v32 = v64.to(F32)
    return quantize_current_ref(v32, fmt, pow2, eps, amax=amax_ref(v32), data=rnd_in(v32, in_dtype))
