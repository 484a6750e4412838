"""Fake (meta) kernels for the `te` ops. Schemas are defined once, in C++ (csrc/torch/registration.cpp); this
file never restates them. Fake kernels return the real shapes, dtypes and strides (all contiguous) so
torch.compile traces without running anything; the activation / cast family's come from the core's plan of the
call (`_C.plan_outputs`), so its output-shape rules are written once, in the core. Trailing arguments at their
schema defaults are not passed to these kernels, so each takes the arguments it does not read as `*rest` (the
family's read the defaults from the schema). The autograd of `te::act` is registered in C++
(csrc/torch/activation_autograd.cpp), where a call that needs no graph costs no Python.
The wrappers call the ops through `call` (eager: csrc/torch/python_call.cpp)."""
from __future__ import annotations

import torch

from . import _C
from .dtypes import to_torch_dtype

# Quantizer kind "none" (SPEC §1.4): plain output. Each format module (formats/) names its own kinds.
QKIND_NONE = 0

_is_compiling = torch.compiler.is_dynamo_compiling


def call(op, args: tuple, keep: int = -1):
    """`op(*args)` for a te op and a tuple of positional arguments. Eagerly through `_C.call`, which converts the
    arguments by the op's schema and dispatches the same way, a few microseconds of host time less per call than
    torch's generic Python binding (python_call.cpp); outputs whose bit in `keep` is clear may come back as None
    (no Python object is made for what the caller does not read). Under torch.compile through the op itself, which
    dynamo traces (it cannot trace into C)."""
    if _is_compiling():
        return op(*args)
    return _C.call(op, args, keep)


def _one_device(op: str, *args) -> None:
    """The real kernels name a tensor on another device than the input (bridge.cpp, gemm.cpp); the fake kernels run
    where no real kernel does (meta tensors, torch.compile's tracing), so they check it too: a meta tensor among CPU
    tensors reaches only the fake kernel, which would otherwise return uninitialised CPU memory."""
    device = None
    for a in args:
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, torch.Tensor):
                if device is None:
                    device = t.device
                elif t.device != device:
                    raise ValueError(f"te::{op}: all tensors must be on one device, got {device} and {t.device}; "
                                     f"move them with .to(device)")


def _meta(t) -> tuple:
    """A tensor as the planner takes it: (sizes, dtype, device). A symbolic size is guarded to its value (the core
    plans concrete shapes)."""
    return (tuple(int(d) for d in t.shape), t.dtype, str(t.device))


def _register_planned_fake(op: str) -> None:
    """The fake kernel of an op of the activation / cast family: the tensors it returns as the core plans the call
    (`_C.plan_outputs`, csrc/torch/activation.cpp: the eager op's request, checks and planner, without a device), so
    the output-shape rules are written once, in the core. Arguments are read by their schema names; the trailing
    ones a caller leaves out, at their schema defaults."""
    schema = getattr(torch.ops.te, op).default._schema.arguments
    names = [a.name for a in schema]

    def fake(*args, **kwargs):
        a = dict(zip(names, tuple(args) + tuple(kwargs.get(s.name, s.default_value) for s in schema[len(args):])))
        _one_device(op, *a.values())
        spec = None
        if "qkind" in a:  # the quantizer spec (SPEC §1.4), its tensors as present or not
            spec = (a["qkind"], a["qdtype"], a["rowwise"], a["columnwise"], a["qflags"], a["amax_epsilon"],
                    a["block_dim"], a["scale"] is not None, a["amax"] is not None)
        grad = a.get("grad")
        x = a["x"]
        outs = _C.plan_outputs(op, a.get("act", 0), _meta(x), None if grad is None else _meta(grad), spec)
        outs = tuple(x.new_empty(shape, dtype=dtype) for shape, dtype in outs)
        return outs if spec is not None else outs[0]

    torch.library.register_fake(f"te::{op}")(fake)


for _op in ("act", "dact", "act_quantize", "dact_quantize", "dbias_dact", "quantize", "bgrad_quantize"):
    _register_planned_fake(_op)


@torch.library.register_fake("te::quantize_into")
def _quantize_into_fake(x, *rest, **buffers):
    _one_device("quantize_into", x, *rest, *buffers.values())
    return None


@torch.library.register_fake("te::dequantize_fp8")
def _dequantize_fp8_fake(data, scale_inv, fp8_dtype, otype):
    _one_device("dequantize_fp8", data, scale_inv)
    return data.new_empty(data.shape, dtype=otype)


@torch.library.register_fake("te::compute_amax")
def _compute_amax_fake(x, amax):
    _one_device("compute_amax", x, amax)
    return None


@torch.library.register_fake("te::fused_amax_and_scale_update")
def _update_fake(amax_reduction_buffer, amax_histories, scales, amax_compute_algo, fp8_dtype, margin):
    _one_device("fused_amax_and_scale_update", amax_reduction_buffer, amax_histories, scales)
    return None


def _rows_cols(x):
    k = x.shape[-1] if x.dim() else 1
    return (x.numel() // k if k else 0), k


@torch.library.register_fake("te::fp8_transpose")
def _fp8_transpose_fake(x):
    rows, cols = _rows_cols(x)
    return x.new_empty((cols, rows))


@torch.library.register_fake("te::fp8_transpose_into")
def _fp8_transpose_into_fake(x, out):
    _one_device("fp8_transpose_into", x, out)
    return None


@torch.library.register_fake("te::gemm")
def _gemm_fake(A, A_scale_inv, A_dtype, transA, B, B_scale_inv, B_dtype, transB, D, D_dtype, *rest, **kw):
    _one_device("gemm", A, A_scale_inv, B, B_scale_inv, D, *rest, *kw.values())
    return None  # writes into D and the optional epilogue buffers only


@torch.library.register_fake("te::grouped_gemm")
def _grouped_gemm_fake(lhs, rhs, group_sizes, lhs_scale_inv, rhs_scale_inv, lhs_dtype, rhs_dtype, rhs_kn, out_dtype,
                       use_split_accumulator=True, wgrad=False):
    _one_device("grouped_gemm", lhs, rhs, group_sizes, lhs_scale_inv, rhs_scale_inv)
    if wgrad:
        shape = (group_sizes.shape[0], lhs.shape[1], rhs.shape[1])
    else:
        shape = (lhs.shape[0], rhs.shape[2] if rhs_kn else rhs.shape[1])
    return lhs.new_empty(shape, dtype=to_torch_dtype(out_dtype))


def _register_norm_fwd_fake(op: str, layernorm: bool) -> None:
    """layernorm_fwd / rmsnorm_fwd: the six pieces, mu and rsigma as the core plans the call (`_C.plan_norm_outputs`,
    csrc/torch/normalization.cpp: the eager op's planner without a device)."""
    schema = getattr(torch.ops.te, op).default._schema.arguments
    names = [a.name for a in schema]

    def fake(*args, **kwargs):
        a = dict(zip(names, tuple(args) + tuple(kwargs.get(s.name, s.default_value) for s in schema[len(args):])))
        _one_device(op, *a.values())
        spec = (a["qkind"], a["qdtype"], a["rowwise"], a["columnwise"], a["qflags"], a["amax_epsilon"],
                a["block_dim"], a["scale"] is not None, a["amax"] is not None)
        x = a["input"]
        bias = a.get("bias")
        outs = _C.plan_norm_outputs(layernorm, _meta(x), _meta(a["weight"]), None if bias is None else _meta(bias),
                                    float(a["eps"]), a["otype"], a["zero_centered_gamma"], spec)
        return tuple(x.new_empty(shape, dtype=dtype) for shape, dtype in outs)

    torch.library.register_fake(f"te::{op}")(fake)


_register_norm_fwd_fake("layernorm_fwd", True)
_register_norm_fwd_fake("rmsnorm_fwd", False)


@torch.library.register_fake("te::layernorm_bwd")
def _layernorm_bwd_fake(dz, x, mu, rsigma, gamma, sm_margin, zero_centered_gamma):
    _one_device("layernorm_bwd", dz, x, mu, rsigma, gamma)
    return x.new_empty(x.shape), gamma.new_empty(gamma.shape), gamma.new_empty(gamma.shape)


@torch.library.register_fake("te::rmsnorm_bwd")
def _rmsnorm_bwd_fake(dz, x, rsigma, gamma, sm_margin, zero_centered_gamma):
    _one_device("rmsnorm_bwd", dz, x, rsigma, gamma)
    return x.new_empty(x.shape), gamma.new_empty(gamma.shape)
