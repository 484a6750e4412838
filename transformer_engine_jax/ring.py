"""The ring schedules of the collective GEMM in pure JAX (issues 22, 33): the all-gather and reduce-scatter rings as
`ppermute`s over a mesh axis, written once and taking the per-chunk GEMM as a function. Their callers: the pure-JAX
collective GEMM (collective.py, in shard_map around tej.gemm) and tej.gemm's own partitioning (gemm.py's ring forms,
around shard-local te_gemm calls). Also the helpers both collective forms share: an operand quantized with its amax
reduced over the ring, and jax's shard_map across jax versions. This module imports no other tej GEMM module, so both
can import it (the collective modules' former import circle, issue 33).

Ring schedules (tp ranks, rank r):
- all-gather: at step s the rank multiplies the chunk it holds — rank (r − s) mod tp's rows — into those output rows
  while sending it on to rank r + 1. Every output row is one GEMM over the full K, so the result is the unsharded
  GEMM's bytes.
- reduce-scatter: at step s the rank adds its partial product of output chunk (r − s − 1) mod tp to the partial sum
  received from rank r − 1 (FP32) and sends it on; after tp steps it holds the full sum of chunk r, rounded once to
  the output dtype. The additions run in ring order, so the result equals the unsharded GEMM within FP32
  accumulation, not bit for bit.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .cpp_extensions import quantize
from .quantizers import ScalingMode

__all__ = ["ring_all_gather", "ring_reduce_scatter", "quantize_over_axis", "shard_map"]


def _ring(tp: int):
    return [(i, (i + 1) % tp) for i in range(tp)]


def quantize_over_axis(x, quantizer, axis_name):
    """x quantized with the amax of the whole (ring-sharded) tensor, so each rank's codes are the unsharded call's."""
    if quantizer is None:
        return x
    if quantizer.scaling_mode != ScalingMode.CURRENT_TENSOR_SCALING:
        raise NotImplementedError(f"collective GEMM: not yet supported: {quantizer.scaling_mode.name}; the ring takes "
                                  f"plain operands or FP8 current scaling")
    amax = jax.lax.pmax(jnp.max(jnp.abs(x.astype(jnp.float32))).reshape(1), axis_name)
    return quantize(x, quantizer, amax=amax)


def ring_all_gather(chunk, mm, axis_name: str, tp: int, dim: int = 0):
    """The all-gather ring over `axis_name` (tp ranks, inside shard_map or a custom_partitioning body): this rank's
    `chunk` travels the ring by ppermute while the chunk received before it is multiplied. `mm(c)` -> a tuple of
    arrays whose axis `dim` holds c's rows, one call per chunk. Returns mm's results for all_gather(chunk) along
    `dim` (rank r's rows at block r). tp = 1 is one call, no collective."""
    r = jax.lax.axis_index(axis_name)
    outs = None
    for s in range(tp):
        nxt = jax.lax.ppermute(chunk, axis_name, _ring(tp)) if s + 1 < tp else None
        ys = tuple(mm(chunk))
        if outs is None:
            outs = [jnp.zeros(y.shape[:dim] + (tp,) + y.shape[dim:], y.dtype) for y in ys]
        # this chunk holds rank (r − s) mod tp's rows
        outs = [jax.lax.dynamic_update_index_in_dim(o, y, (r - s) % tp, dim) for o, y in zip(outs, ys)]
        chunk = nxt
    return tuple(o.reshape(o.shape[:dim] + (-1,) + o.shape[dim + 2:]) for o in outs)


def ring_reduce_scatter(partial, axis_name: str, tp: int):
    """The reduce-scatter ring over `axis_name` (tp ranks): `partial(c)` -> this rank's FP32 partial product of
    output chunk c (c traced, in [0, tp)). At step s the rank adds its partial of chunk (r − s − 1) mod tp to the sum
    received from rank r − 1 and sends it on, so chunk c sums the partials of ranks c + 1, c + 2, …, c in that order
    (csrc/core/ops/collective_gemm_op.h's order). Returns the full FP32 sum of chunk r, unrounded."""
    r = jax.lax.axis_index(axis_name)
    acc = None
    for s in range(tp):
        part = partial((r - s - 1) % tp)
        acc = part if acc is None else acc + part
        if s + 1 < tp:
            acc = jax.lax.ppermute(acc, axis_name, _ring(tp))
    return acc


def shard_map(f, mesh, in_specs, out_specs, check=True):
    """jax's shard_map (older jax: jax.experimental's). check=False leaves out its replication check (an FFI call's
    outputs carry no replication facts, e.g. collective_nccl's gathered x, the same on every rank by construction)."""
    sm = getattr(jax, "shard_map", None)
    if sm is None:  # older jax
        from jax.experimental.shard_map import shard_map as sm
    if not check:
        for flag in ("check_vma", "check_rep"):
            try:
                return sm(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **{flag: False})
            except TypeError:
                continue
    return sm(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
