"""Sharding of the tej calls (custom_partitioning with a Shardy rule): under jax.jit with x sharded along its leading
dims, each device runs the kernel on its shard, with no all-gather of x, and gets the unsharded call's bytes.

- Plain activations and their derivatives are elementwise over the leading dims, and over x's last dim (the features
  K; a column-parallel layer's F): that dim may be sharded too, x [..., A, K] of a gated activation with its two
  halves sharded alike (axis -2, the A, stays whole on every device). The same holds for per-tensor FP8 and dbias.
- Per-tensor FP8 quantizes elementwise with one scale. Delayed scaling casts each shard with the given scale and
  MAX-reduces (pmax) the amaxes over the mesh axes that shard x (its last dim's included); current scaling takes
  each shard's amax (an amax-only call), pmaxes it and casts with it, so every shard has the unsharded scale.
- Block formats (MXFP8, NVFP4, FP8 1x128 / 128x128) are partitioned over groups of rows (cpp_extensions.py views x
  [..., A, K] as [G, group, A, K], group = the scale tensors' row padding), so that shards holding whole groups
  write scale tensors that concatenate into the unsharded, padded ones; NVFP4's global amax is reduced as current
  scaling's. When x's sharding does not give each device whole groups of consecutive rows (x sharded along a second
  leading dim, or G not divisible by the shard count), XLA reshards x around the call (an all-gather at worst): the
  same bytes, without the saving. Not partitioned at all (XLA gathers x): rows that are not whole groups, NVFP4 with
  RHT or stochastic rounding, GEMM-swizzled scales (cpp_extensions._row_group says why).
- dbias: each shard's FP32 column sums are added over the mesh axes that shard the tokens (psum) and rounded once to
  x's dtype; it stays sharded along K as x's last dim is. The additions run in another order than the unsharded
  kernel's, so dbias matches it to the SPEC §9 dbias tolerance, not bit for bit (with only K sharded each shard sums
  all rows of its columns: the unsharded bytes); every other result is bit-exact.

custom_partitioning has no batching rule, so each partitioned call is wrapped in a custom_vmap: an elementwise call
takes the vmapped axis as one more leading dim (one launch, still partitioned), a quantizing or dbias call runs
once per batch element (its scales and sums are per tensor), unpartitioned.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec


def _leading(arg, trailing: int) -> tuple:
    """The partition spec entries of `arg`'s leading dims (all but its `trailing` last dims)."""
    spec = tuple(arg.sharding.spec) + (None,) * (len(arg.shape) - len(tuple(arg.sharding.spec)))
    return spec[:len(spec) - trailing]


def _mesh_axes(lead: tuple) -> tuple:
    """The mesh axis names in partition spec entries, in order."""
    return tuple(a for e in lead if e is not None for a in ((e,) if isinstance(e, str) else e))


def _place(n: int, at, last, lead: tuple, k):
    """The n entries of one array: `lead` from position `at` on (None: none), `k` at position `last` (None: none),
    None elsewhere. The same for partition spec entries and Shardy factor names."""
    out = [None] * n
    if at is not None:
        out[at:at + len(lead)] = lead
    if last is not None:
        out[last % n] = k
    return out


def _rule(arg_lead: tuple, out_lead: tuple, x_trailing: int, arg_last: tuple, out_last: tuple):
    """The Shardy rule of a call, from the ranks of its arrays: the leading factors l0, l1, ... of the first argument
    at each array's position in arg_lead / out_lead (None: none), its last dim's factor k at the position in
    arg_last / out_last (None: none), a factor of its own for every other dim."""

    def rule(mesh, value_types, result_types):
        ranks = [len(t.shape) for t in (*value_types, *result_types)]
        leading = [f"l{j}" for j in range(ranks[0] - x_trailing)]

        def term(i, at, last, rank):
            names = _place(rank, at, last, leading, "k")
            return " ".join(n if n is not None else f"f{i}_{j}" for j, n in enumerate(names))

        terms = [term(i, at, last, r) for i, (at, last, r) in
                 enumerate(zip((*arg_lead, *out_lead), (*arg_last, *out_last), ranks))]
        return ", ".join(terms[:len(value_types)]) + " -> " + ", ".join(terms[len(value_types):])

    return rule


def along_leading_dims(local, arg_lead: tuple, out_lead: tuple, x_trailing: int, elementwise: bool = False,
                       arg_last: tuple | None = None, out_last: tuple | None = None):
    """`local(axes, last_axes, *arrays)` -> a tuple of arrays, partitioned along the leading dims of its first argument
    (all but its `x_trailing` last dims) and, where arg_last is given, along its last dim too. An array whose entry in
    arg_lead / out_lead is an axis p holds those leading dims at p, p+1, ... and is sharded as they are; its entry in
    arg_last / out_last (None: none; default: none for every array) is the axis (negative: from the end) where it
    holds the first argument's last dim, sharded as that is; an array with neither is replicated; every other dim is
    whole on each device. `axes`, `last_axes`: the mesh axes that shard the leading dims / the last dim (empty when
    one device holds them all), for `local`'s reductions. `elementwise`: local's results do not depend on how its rows
    are batched, so vmap takes the vmapped axis as one more leading dim; otherwise vmap runs local once per batch
    element (an elementwise call's arguments all hold the leading dims; results that do not stay unbatched). Make it
    once per kernel and keep it: jax caches its traces and compiled programs by the returned function's identity."""
    split_last = arg_last is not None
    arg_last = arg_last if split_last else (None,) * len(arg_lead)
    out_last = out_last if out_last is not None else (None,) * len(out_lead)

    def shardings(mesh, arg_shapes, result_shape):
        lead = _leading(arg_shapes[0], x_trailing)
        last = _leading(arg_shapes[0], 0)[-1] if split_last else None

        def sharding(at, pos, rank):
            return NamedSharding(mesh, PartitionSpec(*_place(rank, at, pos, lead, last)))

        args = tuple(sharding(at, pos, len(a.shape)) for at, pos, a in zip(arg_lead, arg_last, arg_shapes))
        outs = tuple(sharding(at, pos, len(r.shape)) for at, pos, r in zip(out_lead, out_last, result_shape))
        return _mesh_axes(lead), _mesh_axes((last,)), args, outs

    def infer(mesh, arg_shapes, result_shape):
        return shardings(mesh, arg_shapes, result_shape)[3]

    def partition(mesh, arg_shapes, result_shape):
        axes, last_axes, args, outs = shardings(mesh, arg_shapes, result_shape)
        return mesh, functools.partial(local, axes, last_axes), outs, args

    partitioned = custom_partitioning(functools.partial(local, (), ()))
    partitioned.def_partition(partition, infer_sharding_from_operands=infer,
                              sharding_rule=_rule(arg_lead, out_lead, x_trailing, arg_last, out_last))

    @custom_vmap
    def call(*arrays):
        return partitioned(*arrays)

    @call.def_vmap
    def batched(axis_size, in_batched, *arrays):
        if elementwise:  # the vmapped axis (axis 0 of the batched arguments) is one more leading dim
            arrays = [a if b else jnp.broadcast_to(a, (axis_size, *a.shape)) for a, b in zip(arrays, in_batched)]
            return call(*arrays), tuple(at is not None for at in out_lead)
        out = jax.vmap(functools.partial(local, (), ()), in_axes=tuple(0 if b else None for b in in_batched))(*arrays)
        return out, (True,) * len(out)

    return jax.jit(call)  # eager calls reuse one compiled program instead of tracing both wrappers each time


def along_all_dims(local, arg_kinds: tuple, out_kinds: tuple):
    """`local(axes, last_axes, *arrays)` partitioned along every dim of its first argument x, for per-tensor
    quantization, which is elementwise once the amax is global (local reduces it over `axes` and `last_axes`, the mesh
    axes that shard x's other dims and its last dim). A kind per
    array: "x" (x's dims in order: sharded as x), "xT" (x's last dim first, then the others: the colwise copy, the
    transpose of each shard being the shard of the transpose), None (replicated). vmap runs local per batch element.
    Make it once per configuration and keep it (jax caches by the function's identity)."""

    def full_spec(arg):
        spec = tuple(arg.sharding.spec)
        return spec + (None,) * (len(arg.shape) - len(spec))

    def shardings(mesh, arg_shapes, result_shape):
        spec = full_spec(arg_shapes[0])

        def sharding(kind):
            if kind is None:
                return NamedSharding(mesh, PartitionSpec())
            return NamedSharding(mesh, PartitionSpec(*spec) if kind == "x" else PartitionSpec(spec[-1], *spec[:-1]))

        args = tuple(sharding(k) for k in arg_kinds)
        return _mesh_axes(spec[:-1]), _mesh_axes(spec[-1:]), args, tuple(sharding(k) for k in out_kinds)

    def infer(mesh, arg_shapes, result_shape):
        return shardings(mesh, arg_shapes, result_shape)[3]

    def partition(mesh, arg_shapes, result_shape):
        axes, last_axes, args, outs = shardings(mesh, arg_shapes, result_shape)
        return mesh, functools.partial(local, axes, last_axes), outs, args

    def rule(mesh, value_types, result_types):
        n = len(value_types[0].shape)
        x = [f"d{j}" for j in range(n)]

        def term(i, kind, rank):
            if kind == "x":
                return " ".join(x)
            if kind == "xT":
                return " ".join(x[-1:] + x[:-1])
            return " ".join(f"f{i}_{j}" for j in range(rank))

        ranks = [len(t.shape) for t in (*value_types, *result_types)]
        terms = [term(i, k, r) for i, (k, r) in enumerate(zip((*arg_kinds, *out_kinds), ranks))]
        return ", ".join(terms[:len(value_types)]) + " -> " + ", ".join(terms[len(value_types):])

    partitioned = custom_partitioning(functools.partial(local, (), ()))
    partitioned.def_partition(partition, infer_sharding_from_operands=infer, sharding_rule=rule)

    @custom_vmap
    def call(*arrays):
        return partitioned(*arrays)

    @call.def_vmap
    def batched(axis_size, in_batched, *arrays):
        out = jax.vmap(functools.partial(local, (), ()), in_axes=tuple(0 if b else None for b in in_batched))(*arrays)
        return out, (True,) * len(out)

    return jax.jit(call)
