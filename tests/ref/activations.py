"""Activations and their derivatives in float64 (SPEC §3): the "math" value of every tex activation, its gradient,
dbias, and the tables of names, codes and gated ops. A path that needs the FP32 activation rounds this float64 value
to float32 once, which can differ from the kernel's own FP32 math by an ulp or two; that is why activation -> FP8
codes are compared with `assert_codes_rn_forgiving`."""
import torch

from .common import F64, f32

C_SQRT_2_PI = f32(0.79788456)
C_GELU_CUBIC = f32(0.03567741)
C_GELU_D = f32(0.1070322243)
C_044715 = f32(0.044715)
C_QGELU = f32(1.702)

ACT_NAMES = ["gelu", "geglu", "qgelu", "qgeglu", "relu", "reglu", "srelu", "sreglu",
             "silu", "swiglu", "glu", "clamped_swiglu"]
DACT_NAMES = {n: ("clamped_dswiglu" if n == "clamped_swiglu" else "d" + n) for n in ACT_NAMES}
GATED = {"geglu", "qgeglu", "reglu", "sreglu", "swiglu", "glu", "clamped_swiglu"}
# gated op -> the nonlinearity applied to the first half
BASE = {"gelu": "gelu", "geglu": "gelu", "qgelu": "qgelu", "qgeglu": "qgelu", "relu": "relu",
        "reglu": "relu", "srelu": "srelu", "sreglu": "srelu", "silu": "silu", "swiglu": "silu",
        "glu": "sigmoid"}
DBIAS_NAMES = {"dbias_dgelu": "gelu", "dbias_dsilu": "silu", "dbias_drelu": "relu",
               "dbias_dqgelu": "qgelu", "dbias_dsrelu": "srelu"}
ACT_CODE = {"gelu": 0, "geglu": 1, "glu": 2, "silu": 3, "swiglu": 4, "relu": 5, "reglu": 6,
            "qgelu": 7, "qgeglu": 8, "srelu": 9, "sreglu": 10, "clamped_swiglu": 11}


def _sig(z):
    return 1.0 / (1.0 + torch.exp(-z))


def _f(base, x):
    if base == "gelu":
        return x * (0.5 + 0.5 * torch.tanh(x * (C_SQRT_2_PI + C_GELU_CUBIC * x * x)))
    if base == "qgelu":
        return x * _sig(C_QGELU * x)
    if base == "relu":
        return torch.where(x > 0, x, torch.zeros_like(x))
    if base == "srelu":
        return torch.where(x > 0, x * x, torch.zeros_like(x))
    if base == "silu":
        return x * _sig(x)
    if base == "sigmoid":
        return _sig(x)
    raise KeyError(base)


def _df(base, x):
    if base == "gelu":
        t = torch.tanh(C_SQRT_2_PI * x * (1.0 + C_044715 * x * x))
        return 0.5 * x * (1.0 - t * t) * (C_SQRT_2_PI + C_GELU_D * x * x) + 0.5 * (1.0 + t)
    if base == "qgelu":
        s = _sig(C_QGELU * x)
        return C_QGELU * x * s * (1.0 - s) + s
    if base == "relu":
        return (x > 0).to(x.dtype)
    if base == "srelu":
        return torch.clamp(2.0 * x, min=0.0)
    if base == "silu":
        s = _sig(x)
        return x * s * (1.0 - s) + s
    if base == "sigmoid":
        s = _sig(x)
        return s * (1.0 - s)
    raise KeyError(base)


def _halves(x):
    H = x.shape[-1] // 2
    return x[..., :H], x[..., H:]


def act_ref(name, x, limit=7.0, alpha=1.702, offset=1.0):
    """float64 forward of tex.<name>; x is converted exactly to float64 (differentiable)."""
    x = x.to(F64)
    if name == "clamped_swiglu":
        a, b = _halves(x)
        L, al, c = f32(limit), f32(alpha), f32(offset)
        ac = torch.clamp(a, max=L)
        act = ac * _sig(al * ac)
        return act * (torch.clamp(b, -L, L) + c)
    base = BASE[name]
    if name in GATED:
        a, b = _halves(x)
        return _f(base, a) * b
    return _f(base, x)


def dact_ref(name, g, x, limit=7.0, alpha=1.702, offset=1.0):
    """float64 backward of tex.d<name>(g, x): [d_a | d_b] for gated ops."""
    x = x.detach().to(F64)
    g = g.detach().to(F64)
    if name == "clamped_swiglu":
        a, b = _halves(x)
        L, al, c = f32(limit), f32(alpha), f32(offset)
        ac = torch.clamp(a, max=L)
        s = _sig(al * ac)
        act = ac * s
        bp = torch.clamp(b, -L, L) + c
        dact = torch.where(a <= L, s + al * ac * s * (1.0 - s), torch.zeros_like(a))
        da = g * bp * dact
        db = g * act * ((b >= -L) & (b <= L)).to(F64)
        return torch.cat([da, db], dim=-1)
    base = BASE[name]
    if name in GATED:
        a, b = _halves(x)
        return torch.cat([g * b * _df(base, a), g * _f(base, a)], dim=-1)
    return g * _df(base, x)


def dbias_ref(base, g, x):
    """(grad_bias float64 [K], grad_input float64) for dbias_d<base>."""
    gi = g.detach().to(F64) * _df(base, x.detach().to(F64))
    K = gi.shape[-1] if gi.dim() else 1
    return gi.reshape(-1, K).sum(0), gi


def out_shape(name, shape):
    shape = tuple(shape)
    if name in GATED:
        return shape[:-1] + (shape[-1] // 2,)
    return shape
