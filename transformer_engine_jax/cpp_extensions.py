"""The tej ops as XLA FFI calls: registration of `_ffi`'s handlers (CPU and CUDA) and the calls that lower to them.

Output shapes and dtypes, the workspace size and every input check come from the core's planner (`_ffi.plan_act`),
the same planner the handler runs, so a bad input raises ValueError / TypeError / NotImplementedError here, at trace
time, with the core's message. A trace plans each call signature once (_cached_plan); each execution of the handler
plans once more, for its device, and runs that plan. Under jax.jit with a sharded x each call runs on every device's rows, and plain and
per-tensor calls also on its slice of x's last dim (sharding.py, _sharded_call). Buffers, in the order the handlers
bind them (csrc/jax/activation.cpp):
  args     [dz] x scale amax rng
  results  data colwise_data scale_inv colwise_scale_inv amax colwise_amax [dbias] workspace
"""
from __future__ import annotations

import functools
import math
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi
from .activation_types import activation_of
from .quantizers import FLAG_SWIZZLED, DelayedScaleQuantizer, QuantizeLayout, Quantizer, ScalingMode
from .scaled_tensor import ScaledTensor
from .sharding import along_all_dims, along_leading_dims

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


def _attrs(quantizer: Quantizer | None, amax_given=False, amax_only=False, dbias_fp32=False) -> dict:
    """The handlers' `quantizer` attribute (csrc/jax/quantizer_attrs.h): the quantizer, and how this call takes its
    amax and returns dbias (the halves of a sharded call: amax_only, amax_given, dbias_fp32)."""
    call = dict(amax_given=amax_given, amax_only=amax_only, dbias_fp32=dbias_fp32)
    if quantizer is None:
        return dict(scaling_mode=np.int64(0), q_dtype=np.int64(0), q_layout=np.int64(QuantizeLayout.ROWWISE),
                    flags=np.int64(0), amax_epsilon=np.float32(0.0), **call)
    if not isinstance(quantizer, Quantizer):
        raise TypeError(f"quantizer must be a tej quantizer (QuantizerFactory.create) or None, got "
                        f"{type(quantizer).__name__}")
    return dict(quantizer.ffi_attrs(), **call)


def _plan(op, code, backward, with_dbias, x_shape, dtype, grad_shape, attrs):
    """(pieces, workspace bytes) of a call: the core's trace-time plan, made once per signature (_cached_plan)."""
    key = tuple((k, v.item() if isinstance(v, np.generic) else v) for k, v in attrs.items())
    return _cached_plan(op, -1 if code is None else int(code), bool(backward), bool(with_dbias),
                        tuple(int(d) for d in x_shape), _CODE_OF[dtype], tuple(int(d) for d in grad_shape), key)


@functools.lru_cache(maxsize=4096)
def _cached_plan(op, code, backward, with_dbias, x_shape, dtype_code, grad_shape, attrs):
    """One core plan per call signature (op, shapes, dtype, quantizer attributes), for every platform the trace may
    lower to (`any_device`: shapes are every device's, the workspace the largest); the results XLA allocates
    (_call's ShapeDtypeStructs) come from it. A trace that asks again (the checked unsharded call, then the call
    itself; a retrace of the same signature) reuses it. A bad input raises each time (errors are not cached)."""
    plan = _ffi.plan_act(op, code, backward, with_dbias, list(x_shape), dtype_code, list(grad_shape),
                         _ffi.QuantizerAttrs(**dict(attrs)), cuda=False, any_device=True)
    pieces = tuple((bool(present), int(dt), tuple(shape)) for present, dt, shape in plan["pieces"])
    return pieces, int(plan["workspace_bytes"])


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
    """(scale, amax, rng) arguments of a call and whether the handler reads the amax argument (then the amax result
    is aliased to it). Arguments a call does not read are 0-element placeholders (constants: no copy, no kernel per
    call). scale: delayed scaling's f32[1]; amax: delayed scaling's running amax (the history's row 0) or a given,
    already reduced amax; rng: the NVFP4 stochastic-rounding key uint32[4] (`rng_words()` raises ValueError when the
    quantizer has none, or is not NVFP4)."""
    rng = jnp.zeros((0,), jnp.uint32)
    if quantizer is not None and quantizer.stochastic_rounding:
        rng = quantizer.rng_words()
    if isinstance(quantizer, DelayedScaleQuantizer):
        return quantizer.scale.reshape(1), quantizer.amax_history[:1].reshape(1), rng, True
    none = jnp.zeros((0,), jnp.float32)
    return none, (none if amax is None else amax.reshape(1)), rng, amax is not None


def _data_dtype(quantizer):
    """The dtype a quantizer's data results carry: its FP8 dtype, or uint8 for NVFP4's packed E2M1 pairs."""
    if quantizer.scaling_mode in (ScalingMode.NVFP4_1D_SCALING, ScalingMode.NVFP4_2D_SCALING):
        return jnp.uint8
    return jnp.dtype(quantizer.q_dtype)


def _checked_plan(op, code, backward, with_dbias, x, x_core_shape, dz, quantizer, **call):
    """(x's dtype, the attributes, the plan's pieces, its workspace bytes) of a call; raises on bad input."""
    dtype = _check_float(op, "x", x)
    if dz is not None and jnp.dtype(dz.dtype) != dtype:
        raise TypeError(f"{op}: dz dtype {jnp.dtype(dz.dtype)} must match x dtype {dtype}")
    attrs = _attrs(quantizer, **call)
    pieces, ws_bytes = _plan(op, code, backward, with_dbias, x_core_shape, dtype,
                             () if dz is None else dz.shape, attrs)
    return dtype, attrs, pieces, ws_bytes


def _call(target, op, code, backward, with_dbias, x, x_core_shape, dz, quantizer, amax=None, act_params=None,
          amax_only=False, dbias_fp32=False):
    """One FFI call (on one device's arrays): its results in the handlers' order and the plan's pieces."""
    _register()
    dtype, attrs, pieces, ws_bytes = _checked_plan(op, code, backward, with_dbias, x, x_core_shape, dz, quantizer,
                                                   amax_given=amax is not None, amax_only=amax_only,
                                                   dbias_fp32=dbias_fp32)
    data_dtype = _data_dtype(quantizer) if quantizer is not None else dtype
    results = [_result_type(pieces[i], data_dtype if i in (_ROW_DATA, _COL_DATA) else None, dtype)
               for i in _RESULT_PIECES]
    results[4] = jax.ShapeDtypeStruct((1,), jnp.float32)  # amax, always f32[1]: aliased to the amax argument
    # when the handler reads that (delayed scaling, a given amax)
    if target != "te_act_lu":
        results.append(_result_type(pieces[_GRAD_BIAS], dtype, dtype) if with_dbias else
                       jax.ShapeDtypeStruct((0,), dtype))
    results.append(jax.ShapeDtypeStruct((ws_bytes + _WORKSPACE_ALIGN,), jnp.uint8))
    scale, amax_in, rng, amax_read = _quantizer_inputs(quantizer, amax)
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
    out = jax.ffi.ffi_call(target, results, input_output_aliases={len(args) - 2: 4} if amax_read else {},
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


# ---- Partitioned calls (sharding.py) --------------------------------------------------------------------------
def _rows_at(row: dict) -> tuple:
    """Where x's rows run in each piece (the format table's layouts, SPEC §4.8): the axis of data, colwise data,
    scale_inv and colwise scale_inv at which x's leading dims (per-tensor scaling, no quantizer) or its row groups
    (block scales) start: axis 1 of a transposed copy, the scale matrix's dim whose source is the rows; None: the
    piece does not depend on the rows."""
    data = tuple(None if c is None else int(c["transposed"]) for c in (row["row"], row["col"]))
    scale = tuple(None if c is None or c["scale_rank"] < 2 else [d[0] for d in c["scale"]].index(0)
                  for c in (row["row"], row["col"]))
    return data + scale


def _rows_group(row: dict) -> int:
    """The row padding of the format's scale matrices (SPEC §4.8: 128 rows; 512 for 128x128 tiles, whose colwise
    scale pads ceil(M/128) to 4): whole groups of it give scale rows that concatenate into the unsharded ones."""
    return math.lcm(1, *(d[1] * d[2] for c in (row["row"], row["col"]) if c and c["scale_rank"] == 2
                         for d in c["scale"] if d[0] == 0))


_ROWS_AT = {m: _rows_at(m.format_row) for m in ScalingMode}
_NVFP4 = (ScalingMode.NVFP4_1D_SCALING, ScalingMode.NVFP4_2D_SCALING)
# The modes whose scale comes from the tensor's amax: a sharded call reduces the shards' amaxes first.
_GLOBAL_AMAX = (ScalingMode.CURRENT_TENSOR_SCALING, *_NVFP4)


def _mode(quantizer) -> ScalingMode:
    return ScalingMode.NO_SCALING if quantizer is None else quantizer.scaling_mode


def _row_group(quantizer, rows: int):
    """How a call is partitioned over x's rows: 0 along x's own leading dims (no quantizer or per-tensor scaling: the
    values are elementwise, the scale one per tensor); n > 0 in groups of n rows, the scale tensors' row padding
    (SPEC §4.8: 128 rows; 512 for 128x128 tiles, whose colwise scale pads ceil(M/128) to 4), so that shards of whole
    groups write scales that concatenate into the unsharded ones. None: not partitioned, XLA gathers x (block scales
    of rows that are not whole groups; GEMM-swizzled scales; NVFP4 with RHT or stochastic rounding, whose columnwise
    amax of transformed values and random stream are per tensor)."""
    mode = _mode(quantizer)
    if mode in (ScalingMode.NO_SCALING, ScalingMode.DELAYED_TENSOR_SCALING, ScalingMode.CURRENT_TENSOR_SCALING):
        return 0
    if quantizer.use_rht or quantizer.stochastic_rounding or quantizer.ffi_attrs()["flags"] & FLAG_SWIZZLED:
        return None
    group = _rows_group(mode.format_row)
    return group if rows % group == 0 else None


def _out_last(quantizer, with_dbias: bool, gated_out: bool) -> tuple:
    """Per result (data .. colwise_amax, dbias) of a call partitioned along x's own leading dims (_row_group 0), the
    axis where it holds x's last dim K, which may be sharded as x's is (the values are elementwise along it, dbias a
    sum per column; SPEC §4.8 layouts: data [..., K], the per-tensor colwise copy [K, ...], dbias [K]); None: no K
    (scale_inv, amaxes, absent pieces). gated_out: a gated activation's backward, whose [..., 2K] / [2K, ...] pieces
    are held as [..., 2, K] / [2, K, ...] (sharding K shards both halves alike)."""
    layout = QuantizeLayout.ROWWISE if quantizer is None else quantizer.q_layout
    return (-1 if layout.rowwise else None, (1 if gated_out else 0) if layout.colwise else None, None, None,
            None, None) + ((0,) if with_dbias else ())


def _out_lead(quantizer, with_dbias: bool, gated_out: bool = False) -> tuple:
    """Per result (data .. colwise_amax, dbias), the axis where x's leading dims or row groups start; None: a result
    that holds none (scale_inv and amax of per-tensor scaling, amaxes, dbias, absent pieces). gated_out: the colwise
    copy held as [2, K, ...] (_out_last)."""
    layout = QuantizeLayout.ROWWISE if quantizer is None else quantizer.q_layout
    used = (layout.rowwise, layout.colwise, layout.rowwise, layout.colwise)
    pieces = tuple(at if u else None for at, u in zip(_ROWS_AT[_mode(quantizer)], used))
    if gated_out and pieces[1] is not None:
        pieces = (pieces[0], pieces[1] + 1, *pieces[2:])
    return pieces + (None, None) + ((None,) if with_dbias else ())


class _Partitioned(NamedTuple):
    """The static part of a partitioned call. Its arrays: [dz] x, the quantizer's leaves (its pytree structure
    `qdef` holds the settings), [amax]; x (and dz) with their own leading dims, or as [G, group, ...] when grouped.
    out_last: _out_last's (None when grouped: x's last dim is whole on every device); gated_out: its gated split."""
    target: str
    op: str
    code: int | None
    backward: bool
    with_dbias: bool
    qdef: object
    act_params: tuple | None
    amax_given: bool
    grouped: bool
    out_lead: tuple
    x_trailing: int
    out_last: tuple | None = None
    gated_out: bool = False


def global_amax_call(call, quantizer, every: tuple, amax=None) -> list:
    """A quantizing call on one shard of a tensor with the unsharded call's per-tensor amax: `call(amax, amax_only)`
    -> its results (the amax result at index 4). Current scaling and NVFP4 take each shard's amax (an amax-only
    call), MAX-reduce it over the mesh axes `every` that shard the tensor and cast with it; delayed scaling casts with
    its scale and MAX-reduces the updated amax after the cast. `amax`: already reduced, given by the caller."""
    own_amax = bool(every) and amax is None and _mode(quantizer) in _GLOBAL_AMAX
    if own_amax:
        amax = jax.lax.pmax(call(None, True)[4], every)
    out = list(call(amax, False))
    if every and _mode(quantizer) == ScalingMode.DELAYED_TENSOR_SCALING:
        out[4] = jax.lax.pmax(out[4], every)  # max(history amax, the shard's) -> max(history amax, the tensor's)
    if own_amax and _mode(quantizer) in _NVFP4 and not quantizer.q_layout.rowwise:
        out[4] = jnp.zeros_like(out[4])  # NVFP4 colwise only: the unsharded call leaves its zero amax argument there
    return out


def split_groups(out, out_lead: tuple, groups: int) -> list:
    """Results of a call on [groups * group, ...] rows with each one's rows axis (out_lead; None: none) split into
    (groups, the rest): the shapes of the grouped view that partitions whole row groups."""
    return [o if at is None else o.reshape(*o.shape[:at], groups, -1, *o.shape[at + 1:])
            for o, at in zip(out, out_lead)]


def _shard_call(c: _Partitioned, axes, last_axes, *arrays):
    """The call on one device's block of x; `axes`, `last_axes`: the mesh axes that shard its rows and its last dim
    (empty: all are here). Global amaxes (current scaling, NVFP4) are taken per shard and MAX-reduced over both
    before the cast, delayed scaling's updated amax after it; dbias is summed over the row shards in FP32 (each
    device keeps its columns). Results as _out_lead and _out_last lay them out."""
    dz, x = (arrays[0], arrays[1]) if c.backward else (None, arrays[0])
    rest = arrays[1 + c.backward:]
    quantizer = jax.tree_util.tree_unflatten(c.qdef, rest[:c.qdef.num_leaves])
    amax = rest[c.qdef.num_leaves] if c.amax_given else None
    groups = x.shape[0]
    if c.grouped:
        x, dz = x.reshape(-1, *x.shape[2:]), None if dz is None else dz.reshape(-1, dz.shape[-1])
    core = x.shape if c.code is None else (*x.shape[:-2], x.shape[-2] * x.shape[-1])
    call = functools.partial(_call, c.target, c.op, c.code, c.backward, x=x, x_core_shape=core, dz=dz,
                             quantizer=quantizer, act_params=None if c.act_params is None else dict(c.act_params))
    out = global_amax_call(lambda amax, amax_only: call(False, amax_only=True)[0] if amax_only else
                           call(c.with_dbias, amax=amax, dbias_fp32=bool(axes))[0], quantizer, axes + last_axes, amax)
    out = list(out[:7 if c.with_dbias else 6])
    if axes and c.with_dbias:
        out[6] = jax.lax.psum(out[6], axes).astype(x.dtype)
    if c.grouped:
        out = split_groups(out, c.out_lead, groups)
    if c.gated_out:  # the 2K axis as (2, K): [..., 2K] -> [..., 2, K], [2K, ...] -> [2, K, ...]
        if c.out_last[0] is not None:
            out[0] = out[0].reshape(*out[0].shape[:-1], 2, -1)
        if c.out_last[1] is not None:
            out[1] = out[1].reshape(2, -1, *out[1].shape[1:])
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _partitioned_all_dims(c: _Partitioned):
    """Per-tensor quantize partitioned along every dim of x (sharding.along_all_dims): x's last dim may be sharded
    too (a row-parallel layer's K), each shard cast with the global amax; the colwise copy is sharded transposed."""
    kinds = {0: "x", 1: "xT", None: None}
    return along_all_dims(functools.partial(_shard_call, c), ("x",) + (None,) * (c.qdef.num_leaves + c.amax_given),
                          tuple(kinds[at] for at in c.out_lead))


@functools.lru_cache(maxsize=None)
def _partitioned(c: _Partitioned):
    """The partitioned call of one static configuration, made once: jax caches by its identity. Ungrouped, x's last
    dim (and dz's) may be sharded as well (_out_last)."""
    n_quantizer = c.qdef.num_leaves + c.amax_given
    arg_lead = (0,) * (1 + c.backward) + (None,) * n_quantizer
    arg_last = None if c.out_last is None else (-1,) * (1 + c.backward) + (None,) * n_quantizer
    plain = c.qdef == jax.tree_util.tree_structure(None) and not c.with_dbias
    return along_leading_dims(functools.partial(_shard_call, c), arg_lead, c.out_lead, c.x_trailing,
                              elementwise=plain, arg_last=arg_last, out_last=c.out_last)


def _sharded_call(target, op, code, with_dbias, x, x_core_shape, dz, quantizer, amax=None, act_params=None):
    """A call partitioned over x's rows under jax.jit with a sharded x (sharding.py), where that keeps the unsharded
    bytes (_row_group), else one unpartitioned call: (results data .. colwise_amax [dbias] in the unsharded shapes,
    the plan's pieces), as _call. Plain and per-tensor calls also keep x's last dim sharded (_out_last); a gated
    backward's data and colwise copy then come as [..., 2, K] and [2, K, ...], on every path."""
    backward = target == "te_dact_lu_dbias_quantize"
    n_lead = len(x_core_shape) - 1
    _, _, pieces, _ = _checked_plan(op, code, backward, with_dbias, x, x_core_shape, dz, quantizer,
                                    amax_given=amax is not None)  # the unsharded call's, checked
    rows = int(np.prod(x_core_shape[:-1], dtype=np.int64))
    group = _row_group(quantizer, rows)
    gated_out = backward and group == 0 and x.shape[-2] == 2
    if group is None or n_lead < 1:
        out, pieces = _call(target, op, code, backward, with_dbias, x, x_core_shape, dz, quantizer, amax, act_params)
        if gated_out:
            out = list(out)
            out[:2] = [o.reshape(s) if p[0] else o
                       for o, p, s in zip(out[:2], (pieces[_ROW_DATA], pieces[_COL_DATA]),
                                          (x.shape, (2, x.shape[-1], *x.shape[:-2])))]
        return out, pieces
    if group:
        x = x.reshape(rows // group, group, *x.shape[n_lead:])
        dz = None if dz is None else dz.reshape(rows // group, group, dz.shape[-1])
    first = x if dz is None else dz
    if target == "te_quantize" and not group and not with_dbias and _mode(quantizer) != ScalingMode.NO_SCALING:
        c = _Partitioned(target, op, code, backward, with_dbias, jax.tree_util.tree_structure(quantizer), None,
                         amax is not None, False, _out_lead(quantizer, with_dbias), 0)
        out = _partitioned_all_dims(c)(x, *jax.tree_util.tree_leaves(quantizer), *([] if amax is None else [amax]))
        return [o.reshape(pieces[k][2]) if pieces[k][0] else o for o, k in zip(out, _RESULT_PIECES)], pieces
    c = _Partitioned(target, op, code, backward, with_dbias, jax.tree_util.tree_structure(quantizer),
                     None if act_params is None else tuple(act_params.items()), amax is not None, group > 0,
                     _out_lead(quantizer, with_dbias, gated_out), first.ndim - (1 if group else n_lead),
                     None if group else _out_last(quantizer, with_dbias, gated_out), gated_out)
    arrays = ([] if dz is None else [dz]) + [x, *jax.tree_util.tree_leaves(quantizer)] + \
        ([] if amax is None else [amax])
    out = _partitioned(c)(*arrays)
    if not group:  # already in the unsharded shapes (a reshape here would gather a sharded last dim)
        return list(out), pieces
    kinds = _RESULT_PIECES + (_GRAD_BIAS,)
    return [o.reshape(pieces[k][2]) if pieces[k][0] else o for o, k in zip(out, kinds)], pieces


def act_lu(x, activation_type=("gelu",), quantizer=None, act_params=None):
    """act(x) for x [..., A, K] (A = 2 for gated activations: the activated part at index 0 of axis -2) -> [..., K],
    plain (x's dtype) without a quantizer, else a ScaledTensor of the quantizer's format, quantized in the same
    kernel (SPEC §5.1's fusion paths)."""
    act = activation_of(activation_type)
    out, pieces = _sharded_call("te_act_lu", "act_lu", act.code, False, x, _split_gated("act_lu", x, act), None,
                                quantizer, act_params=act_params)
    shape = (*x.shape[:-2], x.shape[-1])
    if quantizer is None:
        return out[0].reshape(shape)
    return _scaled(out, pieces, quantizer, shape, x.dtype)


def quantize_dact_dbias(dz, x, activation_type=("gelu",), is_dbias=True, quantizer=None, act_params=None):
    """(dx, dbias): dx = act'(x) * dz ([..., A, K], quantized when a quantizer is given), dbias = its column sums
    ([A*K]; unary activations only). dz is [..., K]."""
    act = activation_of(activation_type)
    core_shape = _split_gated("quantize_dact_dbias", x, act)
    out, pieces = _sharded_call("te_dact_lu_dbias_quantize", "dact_lu_dbias_quantize", act.code, is_dbias, x,
                                core_shape, dz, quantizer, act_params=act_params)
    dbias = out[6] if is_dbias else None
    if quantizer is None:
        return out[0].reshape(x.shape), dbias
    return _scaled(out, pieces, quantizer, x.shape, x.dtype), dbias


def dact_lu(dz, x, activation_type=("gelu",), quantizer=None, act_params=None):
    """act'(x) * dz, [..., A, K]; quantized when a quantizer is given."""
    return quantize_dact_dbias(dz, x, activation_type, False, quantizer, act_params)[0]


def quantize(x, quantizer, amax=None):
    """x quantized by `quantizer` (a ScaledTensor). `amax`: current scaling and NVFP4 (without RHT) cast with this
    (already reduced) amax instead of taking their own."""
    if quantizer is None:
        raise ValueError("quantize: a quantizer is required (use the array as it is)")
    out, pieces = _sharded_call("te_quantize", "quantize", None, False, x, x.shape, None, quantizer, amax)
    return _scaled(out, pieces, quantizer, x.shape, x.dtype)


def quantize_dbias(dz, quantizer, is_dbias=True):
    """(dz quantized, dbias = column sums of dz over its last dim)."""
    if quantizer is None:
        raise ValueError("quantize_dbias: a quantizer is required")
    out, pieces = _sharded_call("te_quantize", "dbias_quantize" if is_dbias else "quantize", None, is_dbias, dz,
                                dz.shape, None, quantizer)
    return _scaled(out, pieces, quantizer, dz.shape, dz.dtype), (out[6] if is_dbias else None)
