"""Collective GEMM on GPUs through the FFI (issue 22): the core's ring schedule (csrc/core/ops/collective_gemm_op.h)
as one te_collective_gemm call per device, its chunk exchanges NCCL sends and receives on a stream of their own,
overlapped with the chunk GEMMs — the same schedule and bytes as the pure-JAX ring of collective.py, which XLA
cannot overlap as tightly (its collective-permutes and GEMMs are separate thunks).

  initialize(mesh, axis)          the NCCL communicators of the axis's rings, made once per (mesh axis, device) and
                                  bootstrapped through jax.distributed's key-value store when several processes hold
                                  the ring (one process per GPU), or directly when one process drives them all
  all_gather_gemm(x, w, mesh, axis)      x [M, K] sharded along M, w [N, K] along N → y [M, N] sharded along N
  gemm_reduce_scatter(x, w, mesh, axis)  x [M, K] and w [N, K] sharded along K → y [M, N] sharded along M

Both are differentiable (custom_vjp, the mirrored rings: the all-gather's dgrad is a reduce-scatter ring and its
wgrad reads the gathered x the forward kept; the reduce-scatter's dgrad is an all-gather ring of dy). FP8 current
scaling (x_quantizer / w_quantizer, per tensor): the amax is reduced over the axis first (every rank's chunk has the
unsharded tensor's scale, so the result is the unsharded FP8 GEMM's bytes), the codes travel; the backward runs in
the operands' precision. `sm_margin`: SMs the chunk GEMMs leave to NCCL's kernels (None: the core's default).
`comm_overlap=False`: the same exchanges, then the same GEMMs (the non-overlapped baseline, the same bytes).
The communicators, windows and the one-device FFI call live in collective_ffi.py (shared with tej.gemm's ring forms).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from . import collective_ffi as F
from .collective_ffi import available, initialize
from .gemm import gemm
from .ring import quantize_over_axis, shard_map
from .scaled_tensor import ScaledTensor

__all__ = ["available", "initialize", "all_gather_gemm", "gemm_reduce_scatter"]


def _operand(a, quantizer, axis):
    """(values or FP8 codes, scale_inv f32[1] or empty): FP8 with the amax reduced over `axis`."""
    if quantizer is None:
        return a, jnp.zeros((0,), jnp.float32)
    q = quantize_over_axis(a, quantizer, axis)
    assert isinstance(q, ScaledTensor)
    return q.data, q.scale_inv.reshape(1).astype(jnp.float32)


def _margin(sm_margin) -> int:
    """None: -1, the core's default for NCCL (the core's planner refuses a negative margin at trace time)."""
    return -1 if sm_margin is None else int(sm_margin)


def _sharded(kind, x, w, mesh, axis, xq, wq, overlap, sm_margin, out_dtype, keep=False):
    """te_collective_gemm on every device of the mesh. All-gather: x [M, K] sharded along M, w [N, K] along N -> y
    sharded along N (keep: also the gathered x, replicated). Reduce-scatter: x and w sharded along K -> y sharded
    along M."""
    key, tp = F.initialize(mesh, axis), mesh.shape[axis]

    def local(x, w):
        xd, xs = _operand(x, xq, axis)
        wd, ws = _operand(w, wq, axis)
        out, g = F.call(kind, key, tp, xd, xs, wd, ws, out_dtype, overlap, sm_margin, keep)
        return (out, g) if keep else out

    if kind == F.AG:
        ins, out = (P(axis, None), P(axis, None)), P(None, axis)
    else:
        ins, out = (P(None, axis), P(None, axis)), P(axis, None)
    return shard_map(local, mesh, ins, (out, P(None, None)) if keep else out, check=False)(x, w)


def _check(op, x, w, mesh, axis, split_x_dim):
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"{op}: x [M, K] and w [N, K] with the same K, got x {tuple(x.shape)}, w {tuple(w.shape)}")
    tp = mesh.shape[axis]
    if tp < 2:
        raise ValueError(f"{op}: mesh axis {axis!r} has {tp} device; a collective GEMM needs a ring of 2 or more")
    for name, a, dim in (("x", x, split_x_dim), ("w", w, 0 if split_x_dim == 0 else 1)):
        if a.shape[dim] % tp:
            raise ValueError(f"{op}: {name} {tuple(a.shape)} dim {dim} must split into tp = {tp} equal shards "
                             f"(mesh axis {axis!r})")


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6, 7, 8))
def _ag(x, w, mesh, axis, xq, wq, overlap, sm_margin, out_dtype):
    return _sharded(F.AG, x, w, mesh, axis, xq, wq, overlap, sm_margin, out_dtype)


def _ag_fwd(x, w, mesh, axis, xq, wq, overlap, sm_margin, out_dtype):
    if xq is None and wq is None:
        y, gathered = _sharded(F.AG, x, w, mesh, axis, None, None, overlap, sm_margin, out_dtype, keep=True)
        return y, (gathered, w, None)
    y = _sharded(F.AG, x, w, mesh, axis, xq, wq, overlap, sm_margin, out_dtype)
    return y, (None, w, x)


def _ag_bwd(mesh, axis, xq, wq, overlap, sm_margin, out_dtype, res, dy):
    gathered, w, x = res
    dy = dy.astype(w.dtype)
    if gathered is None:  # a quantized forward: the backward in the operands' precision
        gathered = jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, P(None, None)))
    # dx [M, K] sharded along M = reduce-scatter over the ranks' dy [M, N/tp] · w [N/tp, K]: the RS ring with
    # "x" = dy (split along N) and "w" = wᵀ [K, N] (split along N).
    dx = _sharded(F.RS, dy, w.T, mesh, axis, None, None, overlap, sm_margin, w.dtype)
    dx = dx.astype(gathered.dtype if x is None else x.dtype)
    dw = gemm(dy, gathered, ((0,), (0,)), out_dtype=w.dtype)  # dyᵀ · gathered x: [N, K], sharded along N
    return dx, dw


_ag.defvjp(_ag_fwd, _ag_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6, 7, 8))
def _rs(x, w, mesh, axis, xq, wq, overlap, sm_margin, out_dtype):
    return _sharded(F.RS, x, w, mesh, axis, xq, wq, overlap, sm_margin, out_dtype)


def _rs_fwd(x, w, mesh, axis, xq, wq, overlap, sm_margin, out_dtype):
    return _rs(x, w, mesh, axis, xq, wq, overlap, sm_margin, out_dtype), (x, w)


def _rs_bwd(mesh, axis, xq, wq, overlap, sm_margin, out_dtype, res, dy):
    x, w = res
    dy = dy.astype(w.dtype)
    # dx [M, K] sharded along K = all-gather of dy [M/tp, N] times w [N, K/tp]: the AG ring with "w" = wᵀ [K, N]
    # sharded along K, keeping the gathered dy for dw.
    dx, gathered = _sharded(F.AG, dy, w.T, mesh, axis, None, None, overlap, sm_margin, w.dtype, keep=True)
    dw = gemm(gathered, x, ((0,), (0,)), out_dtype=w.dtype)  # dyᵀ · x: [N, K], sharded along K
    return dx.astype(x.dtype), dw


_rs.defvjp(_rs_fwd, _rs_bwd)


def all_gather_gemm(x, w, mesh, axis: str, *, x_quantizer=None, w_quantizer=None, comm_overlap=True, sm_margin=None,
                    out_dtype=None):
    """y [M, N] = x [M, K] · w [N, K]ᵀ with x sharded along M and w along N over `axis` (a column-parallel layer's
    sequence-parallel input): each device's te_collective_gemm gathers x around the NCCL ring while it multiplies the
    chunks it has; y comes back sharded along N. Bit for bit the unsharded tej.gemm (FP8: of the unsharded
    quantization)."""
    _check("all_gather_gemm", x, w, mesh, axis, 0)
    out_dtype = jnp.dtype(out_dtype or (x.dtype if x_quantizer is None else jnp.bfloat16))
    return _ag(x, w, mesh, axis, x_quantizer, w_quantizer, bool(comm_overlap), _margin(sm_margin), out_dtype)


def gemm_reduce_scatter(x, w, mesh, axis: str, *, x_quantizer=None, w_quantizer=None, comm_overlap=True,
                        sm_margin=None, out_dtype=None):
    """y [M, N] = x [M, K] · w [N, K]ᵀ with x and w sharded along K over `axis` (a row-parallel layer with a
    sequence-parallel output): each device computes its FP32 partial products chunk by chunk and sends each to the
    chunk's owner while the next is computed — by the copy engine where one process drives every device of the ring
    (collective_ffi.transport), else by NCCL (chunk c summed over ranks c + 1, …, c, rounded once); y comes back
    sharded along M."""
    _check("gemm_reduce_scatter", x, w, mesh, axis, 1)
    if x.shape[0] % mesh.shape[axis]:
        raise ValueError(f"gemm_reduce_scatter: x's {x.shape[0]} rows must split into tp = {mesh.shape[axis]} "
                         f"output shards (mesh axis {axis!r})")
    out_dtype = jnp.dtype(out_dtype or (x.dtype if x_quantizer is None else jnp.bfloat16))
    return _rs(x, w, mesh, axis, x_quantizer, w_quantizer, bool(comm_overlap), _margin(sm_margin), out_dtype)
