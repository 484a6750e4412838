"""`tej.flax.save_state` / `load_state`: a checkpoint of NNX objects (modules, an `nnx.Optimizer`) as one plain .npz —
every leaf of `nnx.state(obj)`, so parameters *and* delayed scaling's FP8Meta (scales, amax histories), and for an
optimizer its step and moments. No Orbax: numpy only.

The one invariant: a checkpoint is restored into objects of the same structure (the same modules, built under the same
`tej.autocast` recipe, so that their FP8Meta holds the same quantizer sets), and restores their bytes exactly — the
steps after `load_state` are bit-identical to those of the run that saved. Entries are named `<name>/<leaf path>`
(`jax.tree_util.keystr` of the leaf inside `nnx.state`); each leaf is stored as its raw bytes (uint8, so bfloat16 and
FP8 survive numpy) with its dtype and shape in a JSON header; a typed PRNG key (an `nnx.Rngs` stream) as its key data.
"""
from __future__ import annotations

import json

import jax
import numpy as np
from flax import nnx

__all__ = ["save_state", "load_state"]

_HEADER = "__tej_checkpoint__"
_VERSION = 1


def _leaves(name: str, obj) -> dict:
    """{entry name: leaf} of `nnx.state(obj)`."""
    if not isinstance(obj, nnx.Pytree):
        raise TypeError(f"tej.flax checkpoint: {name} must be an nnx.Module or nnx.Optimizer (anything nnx.state "
                        f"takes), got {type(obj).__name__}")
    flat, _ = jax.tree_util.tree_flatten_with_path(nnx.state(obj))
    return {f"{name}/{jax.tree_util.keystr(path)}": leaf for path, leaf in flat}


def _is_key(leaf) -> bool:
    return jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key)


def save_state(path: str, **objects) -> None:
    """Writes the full state of each keyword's NNX object (e.g. `model=model, optimizer=optimizer`) to the .npz file
    `path`, under that keyword. Gathers sharded arrays to the host."""
    if not objects:
        raise ValueError("tej.flax.save_state: name at least one object, e.g. save_state(path, model=model)")
    arrays, header = {}, {"version": _VERSION, "leaves": {}}
    for name, obj in objects.items():
        for key, leaf in _leaves(name, obj).items():
            if _is_key(leaf):
                leaf = jax.random.key_data(leaf)
            a = np.asarray(jax.device_get(leaf))
            header["leaves"][key] = [a.dtype.name, list(a.shape)]
            arrays[f"{len(arrays)}"] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)   # ascontiguousarray: >= 1-D
    header["order"] = list(header["leaves"])
    with open(path, "wb") as f:
        np.savez(f, **arrays, **{_HEADER: np.frombuffer(json.dumps(header).encode(), np.uint8)})


def _restored(key: str, stored, target, saved_dtype: str, saved_shape: list):
    """The saved bytes as an array like `target` (dtype, shape, placement, PRNG key impl); raises on a mismatch."""
    want = jax.random.key_data(target) if _is_key(target) else target
    dtype, shape = np.dtype(want.dtype), tuple(want.shape)
    if dtype.name != saved_dtype or shape != tuple(saved_shape):
        raise ValueError(f"tej.flax.load_state: {key} was saved as {saved_dtype} {tuple(saved_shape)}, the object "
                         f"holds {dtype.name} {shape}: restore into a model of the same sizes and dtypes")
    a = stored.view(dtype).reshape(shape)
    # Placed as the target: a committed (e.g. sharded) array on its sharding, an uncommitted one uncommitted — jit
    # keys its cache on that, and a restored model would otherwise compile its step again.
    value = jax.device_put(a, target.sharding) if getattr(target, "committed", False) else jax.numpy.asarray(a)
    return jax.random.wrap_key_data(value, impl=jax.random.key_impl(target)) if _is_key(target) else value


def load_state(path: str, **objects) -> None:
    """Restores, in place, each keyword's NNX object from the checkpoint `path` that `save_state` wrote with the same
    keywords. The objects must have the structure of those saved (same modules and sizes, built under the same
    recipe: a model built outside `tej.autocast(recipe=DelayedScaling(...))` has no FP8Meta to restore into); an
    entry missing on either side, or of another dtype or shape, raises naming it. Each array keeps the target's
    placement (restore into a sharded model to get a sharded one)."""
    with np.load(path) as z:
        if _HEADER not in z.files:
            raise ValueError(f"tej.flax.load_state: {path!r} is not a tej.flax checkpoint (no {_HEADER} entry)")
        header = json.loads(z[_HEADER].tobytes().decode())
        if header.get("version") != _VERSION:
            raise ValueError(f"tej.flax.load_state: {path!r} has checkpoint version {header.get('version')}, this "
                             f"tej reads version {_VERSION}")
        stored = {key: z[str(i)] for i, key in enumerate(header["order"])}
    saved = header["leaves"]
    names = {k.split("/", 1)[0] for k in saved}
    if names != set(objects):
        raise ValueError(f"tej.flax.load_state: {path!r} holds objects {sorted(names)}, given {sorted(objects)}")
    for name, obj in objects.items():
        targets = _leaves(name, obj)
        missing = sorted(set(saved_k for saved_k in saved if saved_k.startswith(name + "/")) - set(targets))
        extra = sorted(set(targets) - set(saved))
        if missing or extra:
            raise ValueError(f"tej.flax.load_state: {name}'s structure differs from the checkpoint's (in the checkpoint "
                             f"only: {missing[:4]}; in the object only: {extra[:4]}): build it with the same modules, "
                             f"sizes and tej.autocast recipe as the saved one")
        values = [_restored(k, stored[k], t, *saved[k]) for k, t in targets.items()]
        state = nnx.state(obj)
        nnx.update(obj, jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(state), values))
