"""Sharding of the tej calls that partition without communication (custom_partitioning with a Shardy rule).

The plain (unquantized) activations and their derivatives are elementwise over the leading dims, so under jax.jit
with a batch- or sequence-sharded x each device runs the kernel on its shard: no all-gather of x, and the same bytes
as the unsharded call. custom_partitioning has no batching rule, so each partitioned call is wrapped in a
custom_vmap whose rule treats the vmapped axis as one more leading dim (the calls are elementwise).

Not partitioned yet: the quantizing calls (per-tensor scales need a mesh-wide amax, block scales whole blocks and
their padded layouts) and dbias (a sum over the sharded rows); XLA gathers their inputs.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec


def _leading(arg, trailing: int) -> tuple:
    """The partition spec entries of `arg`'s leading dims (all but its `trailing` last dims)."""
    spec = tuple(arg.sharding.spec) + (None,) * (len(arg.shape) - len(tuple(arg.sharding.spec)))
    return spec[:len(spec) - trailing]


def elementwise(kernel, arg_trailing: tuple, out_trailing: int, rule: str):
    """`kernel(*arrays)` partitioned along the leading dims of its last argument: every argument and the result keep
    those leading dims sharded and their trailing dims (arg_trailing, out_trailing: how many) whole. `rule` is the
    Shardy rule, e.g. "... a k -> ... k". Make it once per kernel and keep it: jax caches its traces and compiled
    programs by the returned function's identity."""

    def shardings(mesh, arg_shapes):
        lead = _leading(arg_shapes[-1], arg_trailing[-1])
        args = tuple(NamedSharding(mesh, PartitionSpec(*lead, *(None,) * t)) for t in arg_trailing)
        return args, NamedSharding(mesh, PartitionSpec(*lead, *(None,) * out_trailing))

    def infer(mesh, arg_shapes, result_shape):
        return shardings(mesh, arg_shapes)[1]

    def partition(mesh, arg_shapes, result_shape):
        args, out = shardings(mesh, arg_shapes)
        return mesh, kernel, out, args

    partitioned = custom_partitioning(kernel)
    partitioned.def_partition(partition, infer_sharding_from_operands=infer, sharding_rule=rule)

    @custom_vmap
    def call(*arrays):
        return partitioned(*arrays)

    @call.def_vmap
    def batched(axis_size, in_batched, *arrays):
        # an elementwise call: the vmapped axis (axis 0 of the batched arguments) is one more leading dim
        arrays = [a if b else jnp.broadcast_to(a, (axis_size, *a.shape)) for a, b in zip(arrays, in_batched)]
        return call(*arrays), True

    return jax.jit(call)  # eager calls reuse one compiled program instead of tracing both wrappers each time
