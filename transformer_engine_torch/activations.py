"""Activation functions with optional fused quantization (SPEC §3, §5), TE's names and argument order.

`f(input, quantizer)`, `df(grad, fwd_input, quantizer)`, `dbias_df(grad, fwd_input, quantizer)` ->
`(grad_bias, grad_input)`. With `quantizer=None` the result is a plain tensor (differentiable for the
forward functions); with a quantizer it is the quantizer's tensor class.
"""
from __future__ import annotations

import torch

from ._activation_table import ACTIVATIONS
from ._ops import call
from .cast import bgrad_quantize, quantize
from .dtypes import FLOAT_DTYPES
from .formats.base import NO_QUANTIZER_SPEC, check_quantizer

# limit, alpha, offset: clamped SwiGLU's defaults, also the schema defaults of act/dact (registration.cpp).
_DEFAULT_ARGS = (7.0, 1.702, 1.0)

# The ops, looked up once: `torch.ops.te.<name>.default` is three attribute lookups on every call otherwise.
_ACT = torch.ops.te.act.default
_DACT = torch.ops.te.dact.default
_ACT_QUANTIZE = torch.ops.te.act_quantize.default
_DACT_QUANTIZE = torch.ops.te.dact_quantize.default
_DBIAS_DACT = torch.ops.te.dbias_dact.default


# Dtype checks stay here although C++ repeats them: here the message names the function the user called
# (`dgelu`), there only the op (`dact`).
def _check_input(op: str, name: str, t) -> torch.dtype:
    """Returns t's dtype: reading `Tensor.dtype` is not free, the callers need it again."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    dtype = t.dtype
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} must be float32, float16 or bfloat16, got {dtype} with shape "
                        f"{tuple(t.shape)} on {t.device}")
    return dtype


def _check_backward_inputs(op: str, grad, x) -> torch.dtype:
    """Checks grad and the forward input of a backward function; returns their dtype."""
    grad_dtype = _check_input(op, "grad", grad)
    dtype = _check_input(op, "fwd_input", x)
    if grad_dtype != dtype:
        raise TypeError(f"{op}: grad dtype {grad_dtype} must match the forward input dtype {dtype}")
    return dtype


def _activation(op: str, code: int, x, quantizer, args=_DEFAULT_ARGS):
    dtype = _check_input(op, "input", x)
    if quantizer is None:
        # Default parameters are left to the schema.
        return call(_ACT, (x, code)) if args is _DEFAULT_ARGS else call(_ACT, (x, code, *args))
    check_quantizer(op, quantizer)
    if quantizer._reduces_amax:  # no fused form: the activation runs unquantized, then the cast
        return quantize(call(_ACT, (x, code, *args)), quantizer)
    return quantizer._wrap(call(_ACT_QUANTIZE, (x, code, *args, *quantizer._spec()), quantizer._pieces()), dtype)


def _dactivation(op: str, code: int, grad, x, quantizer, args=_DEFAULT_ARGS):
    dtype = _check_backward_inputs(op, grad, x)
    if quantizer is None:
        return call(_DACT, (grad, x, code)) if args is _DEFAULT_ARGS else call(_DACT, (grad, x, code, *args))
    check_quantizer(op, quantizer)
    if quantizer._reduces_amax:  # no fused form: the activation runs unquantized, then the cast
        return quantize(call(_DACT, (grad, x, code, *args)), quantizer)
    return quantizer._wrap(call(_DACT_QUANTIZE, (grad, x, code, *args, *quantizer._spec()), quantizer._pieces()),
                           dtype)


def _dbias_dactivation(op: str, code: int, grad, x, quantizer):
    dtype = _check_backward_inputs(op, grad, x)
    check_quantizer(op, quantizer)
    if quantizer is not None and quantizer._reduces_amax:
        return bgrad_quantize(call(_DACT, (grad, x, code)), quantizer)
    if quantizer is None:
        outs = call(_DBIAS_DACT, (grad, x, code, *NO_QUANTIZER_SPEC), 0b11)
        return outs[0], outs[1]
    # grad_bias first, then the six pieces.
    outs = call(_DBIAS_DACT, (grad, x, code, *quantizer._spec()), 1 | quantizer._pieces() << 1)
    return outs[0], quantizer._wrap(outs[1:], dtype)


def _named(fn, name: str, doc: str):
    """fn as the public op `name` (its __name__, __qualname__ and __doc__)."""
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


def _make_forward(name: str, code: int):
    def fn(input, quantizer):
        return _activation(name, code, input, quantizer)

    return _named(fn, name, f"{name}(input, quantizer): activation code {code} (SPEC §3.2), quantized when a "
                            "quantizer is given.")


def _make_backward(name: str, code: int):
    def fn(grad, fwd_input, quantizer):
        return _dactivation(name, code, grad, fwd_input, quantizer)

    return _named(fn, name, f"{name}(grad, fwd_input, quantizer): derivative of activation code {code} times grad.")


def _make_dbias(name: str, code: int):
    def fn(grad, fwd_input, quantizer):
        return _dbias_dactivation(name, code, grad, fwd_input, quantizer)

    return _named(fn, name, f"{name}(grad, fwd_input, quantizer) -> (grad_bias, grad_input).")


# The wrappers of every row of the activation table (_activation_table.py); those of a row with parameters are
# written out below.
for _a in ACTIVATIONS:
    if not _a.params:
        globals()[_a.name] = _make_forward(_a.name, _a.code)
        globals()[_a.backward] = _make_backward(_a.backward, _a.code)
    if _a.dbias:
        globals()[_a.dbias_backward] = _make_dbias(_a.dbias_backward, _a.code)
del _a
__all__ = ([a.name for a in ACTIVATIONS] + [a.backward for a in ACTIVATIONS]
           + [a.dbias_backward for a in ACTIVATIONS if a.dbias])
_CLAMPED_SWIGLU = next(a.code for a in ACTIVATIONS if a.name == "clamped_swiglu")


def _clamped_args(op: str, limit, alpha, offset) -> tuple:
    try:
        return float(limit), float(alpha), float(offset)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: limit, alpha and glu_linear_offset must be real numbers, got limit={limit!r}, "
                        f"alpha={alpha!r}, glu_linear_offset={offset!r}") from None


def clamped_swiglu(input, quantizer, limit=7.0, alpha=1.702, glu_linear_offset=1.0):
    """GPT-OSS SwiGLU (SPEC §3.3): min(a, limit) * sigmoid(alpha * min(a, limit)) * (clamp(b, ±limit) + offset)."""
    return _activation("clamped_swiglu", _CLAMPED_SWIGLU, input, quantizer,
                       _clamped_args("clamped_swiglu", limit, alpha, glu_linear_offset))


def clamped_dswiglu(grad, fwd_input, quantizer, limit=7.0, alpha=1.702, glu_linear_offset=1.0):
    """Backward of clamped_swiglu (SPEC §3.3)."""
    return _dactivation("clamped_dswiglu", _CLAMPED_SWIGLU, grad, fwd_input, quantizer,
                        _clamped_args("clamped_dswiglu", limit, alpha, glu_linear_offset))
