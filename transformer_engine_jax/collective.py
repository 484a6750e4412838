"""Collective GEMM, the pure-JAX form (issue 22): the all-gather + GEMM and GEMM + reduce-scatter of tensor- and
sequence-parallel layers as a ring of `ppermute`s around `tej.gemm` inside `shard_map`, so XLA can run each step's
transfer while the previous chunk is multiplied. It runs on any mesh (the 8-device CPU mesh in the tests) and is the
baseline that the FFI form with NCCL (collective_nccl.py, which tej.gemm's partitioning picks on GPUs) beats there.

  all_gather_gemm    x [M/tp, K] per rank, w [N/tp, K] per rank (TN: y = x·wᵀ)  → y [M, N/tp] per rank
  gemm_reduce_scatter x [M, K/tp] per rank, w [N, K/tp] per rank                → y [M/tp, N] per rank

The two schedules are `ring_all_gather` and `ring_reduce_scatter`, written once and taking the per-chunk GEMM as a
function: the functions here call them around tej.gemm, and tej.gemm's own partitioning (gemm.py's sharding block)
around shard-local te_gemm calls when a jitted call's shardings make it a sequence-parallel column-parallel GEMM
(all-gather) or a row-parallel one with sequence_parallel=True (reduce-scatter) — which is how tej.dense, tej.mlp and
tej.flax run tensor + sequence parallel.

Ring schedules (tp ranks, rank r):
- all-gather: at step s the rank multiplies the chunk it holds — rank (r − s) mod tp's rows — into those output rows
  while sending it on to rank r + 1. Every output row is one GEMM over the full K, so the result is the unsharded
  GEMM's bytes.
- reduce-scatter: at step s the rank adds its partial product of output chunk (r − s − 1) mod tp to the partial sum
  received from rank r − 1 (FP32) and sends it on; after tp steps it holds the full sum of chunk r, rounded once to
  the output dtype. The additions run in ring order, so the result equals the unsharded GEMM within FP32
  accumulation, not bit for bit.

FP8 (per-tensor, current scaling): the all-gather's x is quantized on each rank with the amax reduced over the ring
(pmax), which gives every rank the unsharded tensor's scale, and travels as FP8 codes (half the bytes of bf16); w is
quantized likewise with its amax reduced over the ring.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from .cpp_extensions import quantize
from .gemm import gemm
from .quantizers import ScalingMode
from .scaled_tensor import ScaledTensor

__all__ = ["ring_all_gather", "ring_reduce_scatter", "all_gather_gemm", "gemm_reduce_scatter", "all_gather_gemm_sharded",
           "gemm_reduce_scatter_sharded"]


def _ring(tp: int):
    return [(i, (i + 1) % tp) for i in range(tp)]


def _quantized(x, quantizer, axis_name):
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


def all_gather_gemm(x, w, axis_name: str, tp: int, *, x_quantizer=None, w_quantizer=None):
    """Inside shard_map over `axis_name` (tp ranks): this rank's x [m, K] and w [n, K] → all_gather(x) · wᵀ [tp·m, n],
    the gather overlapped with the GEMM as a ring (module docstring)."""
    xq = _quantized(x, x_quantizer, axis_name)
    wq = _quantized(w, w_quantizer, axis_name)
    # What travels: plain rows, or FP8 codes (the scale_inv is the same on every rank).
    if isinstance(xq, ScaledTensor):
        xq = xq.get_rowwise_tensor()
    chunk = xq.data if isinstance(xq, ScaledTensor) else xq

    def mm(c):
        lhs = dataclasses.replace(xq, data=c) if isinstance(xq, ScaledTensor) else c
        return (gemm(lhs, wq, ((1,), (1,))),)

    (out,) = ring_all_gather(chunk, mm, axis_name, tp)
    return out


def gemm_reduce_scatter(x, w, axis_name: str, tp: int, *, out_dtype=None):
    """Inside shard_map over `axis_name` (tp ranks): this rank's x [M, k] and w [N, k] (its share of K) →
    reduce_scatter(x · wᵀ) [M/tp, N] for this rank's rows, the reduction overlapped with the GEMMs as a ring of FP32
    partial sums (module docstring)."""
    m = x.shape[0] // tp

    def partial(c):
        rows = jax.lax.dynamic_slice_in_dim(x, c * m, m, 0)
        return gemm(rows, w, ((1,), (1,)), out_dtype=jnp.float32)

    return ring_reduce_scatter(partial, axis_name, tp).astype(out_dtype or x.dtype)


def _shard_map(f, mesh, in_specs, out_specs, check=True):
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


def all_gather_gemm_sharded(x, w, mesh, axis: str, **kw):
    """The global form: x [M, K] sharded along M over `axis`, w [N, K] sharded along N → y [M, N] sharded along N."""
    tp = mesh.shape[axis]
    f = functools.partial(all_gather_gemm, axis_name=axis, tp=tp, **kw)
    return _shard_map(f, mesh, (P(axis, None), P(axis, None)), P(None, axis))(x, w)


def gemm_reduce_scatter_sharded(x, w, mesh, axis: str, **kw):
    """The global form: x [M, K] and w [N, K] sharded along K over `axis` → y [M, N] sharded along M."""
    tp = mesh.shape[axis]
    f = functools.partial(gemm_reduce_scatter, axis_name=axis, tp=tp, **kw)
    return _shard_map(f, mesh, (P(None, axis), P(None, axis)), P(axis, None))(x, w)
