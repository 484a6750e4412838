"""The tej ops as XLA FFI calls: registration of `_ffi`'s handlers (CPU and CUDA) and the calls that lower to them.

Output shapes and dtypes, the workspace size and every input check come from the core's planner (`_ffi.plan_act`),
the same plan the handler runs, so a bad input raises ValueError / TypeError / NotImplementedError here, at trace
time, with the core's message. Buffers, in the order the handlers bind them (csrc/jax/activation.cpp):
  args     [dz] x scale amax rng
  results  data colwise_data scale_inv colwise_scale_inv amax colwise_amax [dbias] workspace
"""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi
from .activation_types import activation_of
from .quantizers import DelayedScaleQuantizer, QuantizeLayout, Quantizer, ScalingMode
from .scaled_tensor import ScaledTensor
from .sharding import elementwise

# The core's DType codes (SPEC §1.3) of the dtypes tej passes in and gets back.
_CODE_OF = {jnp.dtype(jnp.float32): 4, jnp.dtype(jnp.float16): 5, jnp.dtype(jnp.bfloat16): 6}
_BYTE, _F32, _E4M3, _E5M2 = 0, 4, 7, 8
# Core piece order of a plan (te::ops::Piece) and the handlers' result order.
_ROW_DATA, _ROW_SCALE_INV, _COL_DATA, _COL_SCALE_INV, _AMAX_ROW, _AMAX_COL, _GRAD_BIAS = range(7)
_RESULT_PIECES = (_ROW_DATA, _COL_DATA, _ROW_SCALE_INV, _COL_SCALE_INV, _AMAX_ROW, _AMAX_COL)
_WORKSPACE_ALIGN = 256  # the core aligns its workspace itself: XLA's buffer may start anywhere


@functools.lru_cache(maxsize=None)
def _register() -> None:
    """Registers every handler once, for the CPU and (when built with CUDA) for CUDA with its initialize stage.
    TEJ_NO_INITIALIZE=1 registers the CUDA execute stages alone: the switch that measures what the initialize
    stage costs and what it prevents (bench_jax.py, the multi-GPU hang test)."""
    for name, capsule in _ffi.cpu_targets().items():
        jax.ffi.register_ffi_target(name, capsule, platform="cpu")
    skip_init = os.environ.get("TEJ_NO_INITIALIZE", "0") == "1"
    for name, stages in _ffi.cuda_targets().items():
        if skip_init:
            stages = {"execute": stages["execute"]}
        jax.ffi.register_ffi_target(name, stages, platform="CUDA")


def _attrs(quantizer: Quantizer | None, amax_given: bool = False) -> dict:
    if quantizer is None:
        return dict(scaling_mode=np.int64(0), q_dtype=np.int64(0), q_layout=np.int64(QuantizeLayout.ROWWISE),
                    flags=np.int64(0), amax_epsilon=np.float32(0.0), amax_given=False)
    if not isinstance(quantizer, Quantizer):
        raise TypeError(f"quantizer must be a tej quantizer (QuantizerFactory.create) or None, got "
                        f"{type(quantizer).__name__}")
    return dict(quantizer.ffi_attrs(), amax_given=amax_given)


def _plan(op, code, backward, with_dbias, x_shape, dtype, grad_shape, attrs):
    q = _ffi.QuantizerAttrs(**{k: (v.item() if isinstance(v, np.generic) else v) for k, v in attrs.items()})
    args = (op, -1 if code is None else code, backward, with_dbias, list(x_shape), _CODE_OF[dtype], list(grad_shape), q)
    cpu, cuda = _ffi.plan_act(*args, cuda=False), _ffi.plan_act(*args, cuda=True)
    # Shapes are the same on both platforms (the bytes are); the workspace may differ (CUDA's one-launch slots).
    return cpu["pieces"], max(cpu["workspace_bytes"], cuda["workspace_bytes"])


def _result_type(piece, data_dtype, x_dtype):
    """A planned piece as an XLA result: data bytes typed as the quantizer's dtype, scale bytes (E8M0, E4M3) as
    uint8, float32 and input-dtype pieces as they are; an absent piece is a 0-element uint8 result."""
    present, code, shape = piece
    if not present:
        return jax.ShapeDtypeStruct((0,), jnp.uint8)
    if code == _BYTE:
        dtype = data_dtype if data_dtype is not None else jnp.uint8
    elif code == _F32:
        dtype = jnp.float32
    else:
        dtype = x_dtype
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


def _check_float(op: str, what: str, x) -> jnp.dtype:
    dtype = jnp.dtype(x.dtype)
    if dtype not in _CODE_OF:
        raise TypeError(f"{op}: {what} must be float32, float16 or bfloat16, got {dtype} with shape {tuple(x.shape)}")
    return dtype


def _split_gated(op: str, x, act):
    """x [..., A, K] -> the core's shape [..., A*K]; A must be 2 for a gated activation, 1 otherwise."""
    want = 2 if act.gated else 1
    if x.ndim < 2 or x.shape[-2] != want:
        raise ValueError(f"{op}: {act.spelling} takes x of shape [..., {want}, K] (axis -2 holds "
                         f"{'the activated and the linear part' if act.gated else 'the one input'}), got "
                         f"{tuple(x.shape)}")
    return (*x.shape[:-2], x.shape[-2] * x.shape[-1])


def _quantizer_inputs(quantizer, amax=None):
    """scale, amax and rng arguments of a call (placeholders where the quantizer has none)."""
    one = jnp.ones((1,), jnp.float32)
    if isinstance(quantizer, DelayedScaleQuantizer):
        return quantizer.scale.reshape(1), quantizer.amax_history[:1].reshape(1), jnp.zeros((4,), jnp.uint32)
    rng = jnp.zeros((4,), jnp.uint32)
    if quantizer is not None and quantizer.stochastic_rounding:
        rng = quantizer.rng_words()
    return one, (jnp.zeros((1,), jnp.float32) if amax is None else amax.reshape(1)), rng


def _data_dtype(quantizer):
    """The dtype a quantizer's data results carry: its FP8 dtype, or uint8 for NVFP4's packed E2M1 pairs."""
    if quantizer.scaling_mode in (ScalingMode.NVFP4_1D_SCALING, ScalingMode.NVFP4_2D_SCALING):
        return jnp.uint8
    return jnp.dtype(quantizer.q_dtype)


def _call(target, op, code, backward, with_dbias, x, x_core_shape, dz, quantizer, amax=None, act_params=None):
    _register()
    dtype = _check_float(op, "x", x)
    if dz is not None and jnp.dtype(dz.dtype) != dtype:
        raise TypeError(f"{op}: dz dtype {jnp.dtype(dz.dtype)} must match x dtype {dtype}")
    attrs = _attrs(quantizer, amax_given=amax is not None)
    pieces, ws_bytes = _plan(op, code, backward, with_dbias, x_core_shape, dtype,
                             () if dz is None else dz.shape, attrs)
    data_dtype = _data_dtype(quantizer) if quantizer is not None else dtype
    results = [_result_type(pieces[i], data_dtype if i in (_ROW_DATA, _COL_DATA) else None, dtype)
               for i in _RESULT_PIECES]
    results[4] = jax.ShapeDtypeStruct((1,), jnp.float32)  # amax: aliased to the amax argument, always f32[1]
    if target != "te_act_lu":
        results.append(_result_type(pieces[_GRAD_BIAS], dtype, dtype) if with_dbias else
                       jax.ShapeDtypeStruct((0,), dtype))
    results.append(jax.ShapeDtypeStruct((ws_bytes + _WORKSPACE_ALIGN,), jnp.uint8))
    scale, amax_in, rng = _quantizer_inputs(quantizer, amax)
    args = ([] if dz is None else [dz]) + [x, scale, amax_in, rng]
    kwargs = dict(quantizer=attrs)
    if code is not None:
        kwargs["act"] = np.int64(code)
        kwargs["act_params"] = act_params or dict(limit=np.float32(7.0), alpha=np.float32(1.702),
                                                  offset=np.float32(1.0))
    if target != "te_act_lu":
        kwargs["is_dbias"] = bool(with_dbias)
    # Batch rule: a plain elementwise call takes the batch as more rows (one launch); a quantizing call (a scale
    # per tensor or per block of the unbatched shape) or a dbias (sums per tensor) runs once per batch element.
    elementwise = quantizer is None and not with_dbias
    out = jax.ffi.ffi_call(target, results, input_output_aliases={len(args) - 2: 4},
                           vmap_method="broadcast_all" if elementwise else "sequential")(*args, **kwargs)
    return out, pieces


def _scaled(out, pieces, quantizer, shape, dtype):
    """The ScaledTensor of a quantizing call's results."""
    data, col_data, scale_inv, col_scale_inv, amax, col_amax = out[:6]
    layout = quantizer.q_layout
    nv = quantizer.scaling_mode in (ScalingMode.NVFP4_1D_SCALING, ScalingMode.NVFP4_2D_SCALING)
    has_amax = nv or quantizer.scaling_mode in (ScalingMode.DELAYED_TENSOR_SCALING,
                                                ScalingMode.CURRENT_TENSOR_SCALING)
    return ScaledTensor(
        data if layout.rowwise else None, scale_inv if layout.rowwise else None,
        col_data if layout.colwise else None,
        (col_scale_inv if pieces[_COL_SCALE_INV][0] else scale_inv) if layout.colwise else None,
        amax if has_amax else None, col_amax if nv and layout.colwise else None,
        quantizer.scaling_mode, layout, tuple(shape), dtype)


def act_lu(x, activation_type=("gelu",), quantizer=None, act_params=None):
    """act(x) for x [..., A, K] (A = 2 for gated activations: the activated part at index 0 of axis -2) -> [..., K],
    plain (x's dtype) without a quantizer, else a ScaledTensor of the quantizer's format, quantized in the same
    kernel (SPEC §5.1's fusion paths)."""
    act = activation_of(activation_type)
    core_shape = _split_gated("act_lu", x, act)
    if quantizer is None and act_params is None:
        return _plain_act(act.name)(x)
    out, pieces = _call("te_act_lu", "act_lu", act.code, False, False, x, core_shape, None, quantizer,
                        act_params=act_params)
    shape = (*x.shape[:-2], x.shape[-1])
    if quantizer is None:
        return out[0].reshape(shape)
    return _scaled(out, pieces, quantizer, shape, x.dtype)


@functools.lru_cache(maxsize=None)
def _plain_act(name):
    """The partitioned plain act_lu of one activation (sharding.py), made once: jax caches by its identity."""
    return elementwise(functools.partial(_act_plain, name), (2,), 1, "... a k -> ... k")


@functools.lru_cache(maxsize=None)
def _plain_dact(name):
    """The partitioned plain dact_lu of one activation, made once."""
    return elementwise(functools.partial(_dact_plain, name), (1, 2), 2, "... k, ... a k -> ... a k")


def _act_plain(name, x):
    """act(x) into x's dtype: one FFI call (the shard-local body of the partitioned plain act_lu)."""
    act = activation_of(name)
    out, _ = _call("te_act_lu", "act_lu", act.code, False, False, x, _split_gated("act_lu", x, act), None, None)
    return out[0].reshape(*x.shape[:-2], x.shape[-1])


def _dact_plain(name, dz, x):
    """act'(x) * dz into x's dtype, [..., A, K] (the shard-local body of the partitioned plain dact_lu)."""
    act = activation_of(name)
    out, _ = _call("te_dact_lu_dbias_quantize", "dact_lu_dbias_quantize", act.code, True, False, x,
                   _split_gated("dact_lu", x, act), dz, None)
    return out[0].reshape(x.shape)


def quantize_dact_dbias(dz, x, activation_type=("gelu",), is_dbias=True, quantizer=None, act_params=None):
    """(dx, dbias): dx = act'(x) * dz ([..., A, K], quantized when a quantizer is given), dbias = its column sums
    ([A*K]; unary activations only). dz is [..., K]."""
    act = activation_of(activation_type)
    core_shape = _split_gated("quantize_dact_dbias", x, act)
    if quantizer is None and not is_dbias and act_params is None:
        return _plain_dact(act.name)(dz, x), None
    out, pieces = _call("te_dact_lu_dbias_quantize", "dact_lu_dbias_quantize", act.code, True, is_dbias, x,
                        core_shape, dz, quantizer, act_params=act_params)
    dbias = out[6] if is_dbias else None
    if quantizer is None:
        return out[0].reshape(x.shape), dbias
    return _scaled(out, pieces, quantizer, x.shape, x.dtype), dbias


def dact_lu(dz, x, activation_type=("gelu",), quantizer=None, act_params=None):
    """act'(x) * dz, [..., A, K]; quantized when a quantizer is given."""
    return quantize_dact_dbias(dz, x, activation_type, False, quantizer, act_params)[0]


def quantize(x, quantizer, amax=None):
    """x quantized by `quantizer` (a ScaledTensor). `amax`: current scaling casts with this (already reduced) amax
    instead of taking its own."""
    if quantizer is None:
        raise ValueError("quantize: a quantizer is required (use the array as it is)")
    out, pieces = _call("te_quantize", "quantize", None, False, False, x, x.shape, None, quantizer, amax)
    return _scaled(out, pieces, quantizer, x.shape, x.dtype)


def quantize_dbias(dz, quantizer, is_dbias=True):
    """(dz quantized, dbias = column sums of dz over its last dim)."""
    if quantizer is None:
        raise ValueError("quantize_dbias: a quantizer is required")
    out, pieces = _call("te_quantize", "dbias_quantize" if is_dbias else "quantize", None, False, is_dbias, dz,
                        dz.shape, None, quantizer)
    return _scaled(out, pieces, quantizer, dz.shape, dz.dtype), (out[6] if is_dbias else None)
