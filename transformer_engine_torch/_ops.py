"""Fake (meta) kernels for the `te` ops. Schemas are defined once, in C++ (csrc/torch/registration.cpp); this
file never restates them. Fake kernels return the real shapes, dtypes and strides (all contiguous) so
torch.compile traces without running anything. Trailing arguments at their schema defaults are not passed to
these kernels, so each takes the arguments it does not read as `*rest`. The autograd of `te::act` is
registered in C++ (csrc/torch/activation_autograd.cpp), where a call that needs no graph costs no Python.
The wrappers call the ops through `call` (eager: csrc/torch/python_call.cpp)."""
from __future__ import annotations

import torch

from . import _C
from ._activation_table import GATED_CODES
from .dtypes import to_torch_dtype

# Quantizer kind "none" (SPEC §1.4): plain output. Each format module (formats/) names its own kinds and registers
# the fake outputs of each (`register_fake_outputs`).
QKIND_NONE = 0
_FAKE_OUTPUTS: dict = {}

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


def _fwd_shape(x, act):
    shape = list(x.shape)
    if act in GATED_CODES and shape:
        shape[-1] //= 2
    return shape


def register_fake_outputs(*qkinds):
    """Decorator: `fn(x, shape, rowwise, columnwise, rest)` makes the six outputs of a quantizing op for quantizer
    kinds `qkinds` (a format module registers its own)."""
    def decorator(fn):
        for qkind in qkinds:
            _FAKE_OUTPUTS[qkind] = fn
        return fn

    return decorator


def _quant_outputs(x, shape, qkind, rowwise, columnwise, rest=()):
    """The six outputs of a quantizing op with output shape `shape`. `rest`: the spec fields after `columnwise`
    that the caller passed (qflags, amax_epsilon, block_dim, ...)."""
    if qkind == QKIND_NONE:
        e32 = lambda: x.new_empty((0,), dtype=torch.float32)  # noqa: E731
        return (x.new_empty(shape), e32(), e32(), e32(), e32(), e32())
    fn = _FAKE_OUTPUTS.get(qkind)
    if fn is None:
        raise NotImplementedError(f"quantizer kind {qkind} is not available in this build yet")
    return fn(x, shape, rowwise, columnwise, rest)


@torch.library.register_fake("te::act")
def _act_fake(x, act, *rest):
    return x.new_empty(_fwd_shape(x, act))


@torch.library.register_fake("te::dact")
def _dact_fake(grad, x, act, *rest):
    _one_device("dact", grad, x)
    return x.new_empty(x.shape)


@torch.library.register_fake("te::act_quantize")
def _act_quantize_fake(x, act, limit, alpha, offset, qkind, qdtype, rowwise, columnwise, *rest):
    _one_device("act_quantize", x, *rest)
    return _quant_outputs(x, _fwd_shape(x, act), qkind, rowwise, columnwise, rest)


@torch.library.register_fake("te::dact_quantize")
def _dact_quantize_fake(grad, x, act, limit, alpha, offset, qkind, qdtype, rowwise, columnwise, *rest):
    _one_device("dact_quantize", grad, x, *rest)
    return _quant_outputs(x, list(x.shape), qkind, rowwise, columnwise, rest)


def _dbias(x, shape):
    return x.new_empty((shape[-1] if shape else 1,))


@torch.library.register_fake("te::dbias_dact")
def _dbias_dact_fake(grad, x, act, qkind, qdtype, rowwise, columnwise, *rest):
    _one_device("dbias_dact", grad, x, *rest)
    return (_dbias(x, list(x.shape)),) + _quant_outputs(x, list(x.shape), qkind, rowwise, columnwise, rest)


@torch.library.register_fake("te::quantize")
def _quantize_fake(x, qkind, qdtype, rowwise, columnwise, *rest):
    _one_device("quantize", x, *rest)
    return _quant_outputs(x, list(x.shape), qkind, rowwise, columnwise, rest)


@torch.library.register_fake("te::bgrad_quantize")
def _bgrad_quantize_fake(x, qkind, qdtype, rowwise, columnwise, *rest):
    _one_device("bgrad_quantize", x, *rest)
    return (_dbias(x, list(x.shape)),) + _quant_outputs(x, list(x.shape), qkind, rowwise, columnwise, rest)


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
