"""The pieces every `tej.flax` module shares (flax.py, flax_transformer.py): the `FP8Meta` variable that holds a
layer's delayed-scaling state and `_Quantized`, the base that resolves a call's quantizer sets from the enclosing
`tej.autocast`. flax.py's doc says how that state is created and updated."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .recipe import DelayedScaling, NVFP4BlockScaling, get_autocast_recipe, make_quantizer_set

# flax.nnx.Linear's defaults.
default_kernel_init = nnx.initializers.lecun_normal()
default_bias_init = nnx.initializers.zeros_init()


@nnx.register_variable_name("fp8_meta", overwrite=True)
class FP8Meta(nnx.Variable):
    """A layer's delayed-scaling state: its QuantizerSet (Dense) or pair of sets (MLP, MoEMLP: fc1's, fc2's), None
    when it has none. Linen collection name "fp8_meta"."""


def _delayed_state(recipe, n_sets: int):
    """The fresh state of a layer with `n_sets` quantizer sets under `recipe`, None unless it is delayed."""
    if not isinstance(recipe, DelayedScaling):
        return None
    sets = tuple(make_quantizer_set(recipe) for _ in range(n_sets))
    return sets[0] if n_sets == 1 else sets


def _same_layout(a, b) -> bool:
    """Same quantizers (formats, margin, algorithm: the treedef) and history lengths."""
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    return ta == tb and all(jnp.shape(x) == jnp.shape(y) for x, y in zip(la, lb))


class _Quantized(nnx.Module):
    """Holds `fp8_meta` and resolves the quantizer sets of one call."""

    _n_sets = 1

    def _init_fp8_meta(self):
        self.fp8_meta = FP8Meta(_delayed_state(get_autocast_recipe(), self._n_sets))

    def _quantizer_sets(self, rngs):
        """The stored delayed state (created or restarted to match the recipe); a stateless recipe's fresh sets
        (NVFP4's stochastic rounding keyed from `rngs`); None outside autocast."""
        recipe = get_autocast_recipe()
        if recipe is None:
            return None
        if not isinstance(recipe, DelayedScaling):
            key = None
            if isinstance(recipe, NVFP4BlockScaling) and not recipe.disable_stochastic_rounding:
                if rngs is None:
                    raise ValueError(f"tej.flax.{type(self).__name__}: NVFP4BlockScaling(disable_stochastic_rounding="
                                     f"False) rounds the gradients stochastically: call the layer with rngs= (an "
                                     f"nnx.Rngs, or a jax PRNG key, fresh each step)")
                key = rngs() if isinstance(rngs, nnx.Rngs) else rngs
            sets = tuple(make_quantizer_set(recipe, None if key is None else jax.random.fold_in(key, i))
                         for i in range(self._n_sets))
            return sets[0] if self._n_sets == 1 else sets
        fresh = _delayed_state(recipe, self._n_sets)
        if not _same_layout(self.fp8_meta.get_value(), fresh):
            self.fp8_meta.set_value(fresh)
        return self.fp8_meta.get_value()
