"""Collective GEMM, the pure-JAX form (issue 22): the all-gather + GEMM and GEMM + reduce-scatter of tensor- and
sequence-parallel layers as a ring of `ppermute`s around `tej.gemm` inside `shard_map`, so XLA can run each step's
transfer while the previous chunk is multiplied. It runs on any mesh (the 8-device CPU mesh in the tests) and is the
baseline that the FFI form with NCCL (collective_nccl.py, which tej.gemm's partitioning picks on GPUs) beats there.

  all_gather_gemm    x [M/tp, K] per rank, w [N/tp, K] per rank (TN: y = x·wᵀ)  → y [M, N/tp] per rank
  gemm_reduce_scatter x [M, K/tp] per rank, w [N, K/tp] per rank                → y [M/tp, N] per rank

The two schedules are `ring_all_gather` and `ring_reduce_scatter` (ring.py, their one home, re-exported here), written
once and taking the per-chunk GEMM as a function: the functions here call them around tej.gemm, and tej.gemm's own
partitioning (gemm.py's sharding block) around shard-local te_gemm calls when a jitted call's shardings make it a
sequence-parallel column-parallel GEMM (all-gather) or a row-parallel one with sequence_parallel=True
(reduce-scatter) — which is how tej.dense, tej.mlp and tej.flax run tensor + sequence parallel.

The ring schedules (which chunk each rank multiplies and sends at each step) are described in ring.py.

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

from .gemm import gemm
from .ring import quantize_over_axis, ring_all_gather, ring_reduce_scatter, shard_map
from .scaled_tensor import ScaledTensor

__all__ = ["ring_all_gather", "ring_reduce_scatter", "all_gather_gemm", "gemm_reduce_scatter",
           "all_gather_gemm_sharded", "gemm_reduce_scatter_sharded"]


def all_gather_gemm(x, w, axis_name: str, tp: int, *, x_quantizer=None, w_quantizer=None):
    """Inside shard_map over `axis_name` (tp ranks): this rank's x [m, K] and w [n, K] → all_gather(x) · wᵀ [tp·m, n],
    the gather overlapped with the GEMM as a ring (module docstring)."""
    xq = quantize_over_axis(x, x_quantizer, axis_name)
    wq = quantize_over_axis(w, w_quantizer, axis_name)
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


def all_gather_gemm_sharded(x, w, mesh, axis: str, **kw):
    """The global form: x [M, K] sharded along M over `axis`, w [N, K] sharded along N → y [M, N] sharded along N."""
    tp = mesh.shape[axis]
    f = functools.partial(all_gather_gemm, axis_name=axis, tp=tp, **kw)
    return shard_map(f, mesh, (P(axis, None), P(axis, None)), P(None, axis))(x, w)


def gemm_reduce_scatter_sharded(x, w, mesh, axis: str, **kw):
    """The global form: x [M, K] and w [N, K] sharded along K over `axis` → y [M, N] sharded along M."""
    tp = mesh.shape[axis]
    f = functools.partial(gemm_reduce_scatter, axis_name=axis, tp=tp, **kw)
    return shard_map(f, mesh, (P(None, axis), P(None, axis)), P(axis, None))(x, w)
