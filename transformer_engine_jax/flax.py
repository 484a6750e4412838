"""`tej.flax`: Flax NNX modules over `tej.dense`, `tej.mlp` and `tej.grouped_dense` (issue 21, item 4). Needs flax (>= 0.12); `import
transformer_engine_jax` never imports this module: `tej.flax` loads it on first access.

`Dense` has the parameters and initializers of `flax.nnx.Linear` (kernel [in, out], bias [out]); `MLP` holds fc1
[hidden, A·ffn] (A = 2 for a gated activation, the activated half first, as tej.mlp's w1 [K, A, F] reshaped) and fc2
[ffn, hidden]. `MoEMLP` holds the same pair per expert ([E, ...]). LayerNorm, LayerNormDenseGeneral, LayerNormMLP and
TransformerLayer (TE's names and parameters) live in flax_transformer.py and are exported here. `save_state` /
`load_state` (flax_checkpoint.py): a checkpoint of modules and optimizers, FP8Meta included. All quantize as the
enclosing `tej.autocast` says, read while tracing.

The one invariant: delayed scaling's state (scales, amax histories) is a `QuantizerSet` held in an `FP8Meta`
variable — its own collection, not `nnx.Param`, so optimizers leave it alone — and it changes only through its
*gradient*, which carries the amaxes the step observed (recipe.py). A training step differentiates with respect to
both collections and hands the FP8Meta part to `update_fp8_meta`:

    diff = nnx.DiffState(0, nnx.Any(nnx.Param, tej.flax.FP8Meta))
    loss, grads = nnx.value_and_grad(loss_fn, argnums=diff)(model, x, y)
    grads = tej.flax.update_fp8_meta(model, grads)     # next scales into the model; returns the Param grads
    optimizer.update(model, grads)

The state is created when a layer is built inside `tej.autocast(recipe=tej.DelayedScaling(...))`, or on the first
call under that recipe (also inside `nnx.jit`, which lets the state change structure, but after that step's gradient
was taken: its amaxes are not recorded; `nnx.scan` / `nnx.vmap` cannot add state, so build scanned stacks under the
recipe). A call under a delayed recipe whose history length or formats differ from the stored state starts that
state afresh. A layer that did not run under the recipe in a step keeps its state (its gradient carries amax 0).
"""
from __future__ import annotations

from typing import Sequence, Union

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import dtypes

from ._flax_base import FP8Meta, _Quantized, default_bias_init, default_kernel_init
from .activation import activation
from .activation_types import activation_of
from .dense import dense
from .flax_checkpoint import load_state, save_state
from .flax_transformer import LayerNorm, LayerNormDenseGeneral, LayerNormMLP, TransformerLayer
from .grouped_dense import grouped_dense
from .mlp import mlp
from .quantizers import DelayedScaleQuantizer, Quantizer
from .recipe import QuantizerSet, update_quantizer_set

__all__ = ["FP8Meta", "Dense", "MLP", "MoEMLP", "update_fp8_meta", "LayerNorm", "LayerNormDenseGeneral", "LayerNormMLP",
           "TransformerLayer", "save_state", "load_state"]

class Dense(_Quantized):
    """y = x·kernel + bias through `tej.dense`; parameters, initializers and dtype promotion as `flax.nnx.Linear`
    (kernel [in_features, out_features] from kernel_init(rngs.params(), ...), then bias [out_features]). dtype: the
    computation dtype (None: promoted from x and the parameters). Under a recipe, in/out features and the token
    count must be multiples of 16 (FP8) or 32 (MXFP8, NVFP4). Tensor parallel: shard the kernel along out_features
    (column parallel) or in_features (row parallel) on a mesh axis, e.g. built under `jax.set_mesh(mesh)` with
    `kernel_init=nnx.with_partitioning(init, (None, "tp"))`, or with its value device_put; sequence_parallel=True
    when x's tokens are sharded on that axis too and should stay so (tej.dense's switch: the row-parallel layer
    reduce-scatters y along the tokens, the column-parallel one dx)."""

    def __init__(self, in_features: int, out_features: int, *, use_bias: bool = True, dtype=None,
                 param_dtype=jnp.float32, kernel_init=default_kernel_init, bias_init=default_bias_init,
                 sequence_parallel: bool = False, rngs: nnx.Rngs):
        self.kernel = nnx.Param(kernel_init(rngs.params(), (in_features, out_features), param_dtype))
        self.bias = nnx.Param(bias_init(rngs.params(), (out_features,), param_dtype)) if use_bias else nnx.data(None)
        self.in_features, self.out_features, self.use_bias = in_features, out_features, use_bias
        self.dtype, self.param_dtype, self.sequence_parallel = dtype, param_dtype, sequence_parallel
        self._init_fp8_meta()

    def __call__(self, x, *, rngs=None):
        """x [..., in_features] -> [..., out_features]. rngs: an nnx.Rngs or PRNG key, needed (and only used) for
        NVFP4's stochastic rounding of the gradient."""
        bias = None if self.bias is None else self.bias.get_value()
        x, kernel, bias = dtypes.promote_dtype((x, self.kernel.get_value(), bias), dtype=self.dtype)
        return dense(x, kernel, bias, quantizer_set=self._quantizer_sets(rngs),
                     sequence_parallel=self.sequence_parallel)


class MLP(_Quantized):
    """y = act(x·fc1_kernel + fc1_bias)·fc2_kernel + fc2_bias through `tej.mlp` (fused activation, quantized for
    fc2 inside the kernel). fc1_kernel [hidden, A·ffn] with A = 2 for a gated activation (columns [0, ffn) feed the
    activation, [ffn, 2·ffn) are the linear half: tej.mlp's w1 [hidden, A, ffn] flattened), fc1_bias [A·ffn],
    fc2_kernel [ffn, hidden], fc2_bias [hidden]; each kernel/bias pair created and initialized as an nnx.Linear of
    that shape. activation_type: any tej activation, e.g. ("gelu",) or ("silu", "linear") (SwiGLU). Tensor parallel:
    fc1_kernel / fc1_bias sharded along their ffn columns, fc2_kernel along its ffn rows, on one mesh axis;
    sequence_parallel=True: x's tokens are sharded on it too and y comes back so (tej.mlp's switch and its "not
    yet": a gated activation's fc1 is gathered)."""

    _n_sets = 2

    def __init__(self, hidden: int, ffn: int, *, activation_type: Union[str, Sequence[str]] = ("gelu",),
                 use_bias: bool = True, dtype=None, param_dtype=jnp.float32, kernel_init=default_kernel_init,
                 bias_init=default_bias_init, sequence_parallel: bool = False, rngs: nnx.Rngs):
        act = activation_of(activation_type)
        self.activation_type, self.a_dim = act.name, 2 if act.gated else 1
        self.hidden, self.ffn, self.use_bias = hidden, ffn, use_bias
        self.dtype, self.param_dtype, self.sequence_parallel = dtype, param_dtype, sequence_parallel
        for name, (i, o) in (("fc1", (hidden, self.a_dim * ffn)), ("fc2", (ffn, hidden))):
            setattr(self, f"{name}_kernel", nnx.Param(kernel_init(rngs.params(), (i, o), param_dtype)))
            setattr(self, f"{name}_bias",
                    nnx.Param(bias_init(rngs.params(), (o,), param_dtype)) if use_bias else nnx.data(None))
        self._init_fp8_meta()

    def __call__(self, x, *, rngs=None):
        """x [..., hidden] -> [..., hidden]. rngs: as Dense's."""
        b1, b2 = (None if b is None else b.get_value() for b in (self.fc1_bias, self.fc2_bias))
        x, w1, b1, w2, b2 = dtypes.promote_dtype(
            (x, self.fc1_kernel.get_value(), b1, self.fc2_kernel.get_value(), b2), dtype=self.dtype)
        w1 = w1.reshape(self.hidden, self.a_dim, self.ffn)
        b1 = None if b1 is None else b1.reshape(self.a_dim, self.ffn)
        qs = self._quantizer_sets(rngs)
        return mlp(x, w1, b1, w2, b2, self.activation_type, (None, None) if qs is None else qs,
                   sequence_parallel=self.sequence_parallel)


class MoEMLP(_Quantized):
    """A router-free mixture-of-experts MLP: for the rows of expert e, y = act(x·fc1_kernel[e] + fc1_bias[e])·
    fc2_kernel[e] + fc2_bias[e], as two `tej.grouped_dense` calls (group sizes on the device, no host sync) with the
    fused `tej.activation` between them. fc1_kernel [E, hidden, A·ffn] (A = 2 for a gated activation, columns
    [0, ffn) activated, as MLP's), fc1_bias [E, A·ffn], fc2_kernel [E, ffn, hidden], fc2_bias [E, hidden]; expert
    e's kernel is kernel_init(k_e, (in, out)) — nnx.Linear's draw of that slice, fan-in = its in dim — with k_e the
    e-th of jax.random.split(rngs.params(), E), likewise its bias. Quantization: as the enclosing `tej.autocast`
    says, one quantizer set per grouped_dense (fc1, fc2), as MLP's: DelayedScaling (the pair held in `fp8_meta`,
    updated through update_fp8_meta; one x scale and one kernel scale shared by all experts, the kernel's amax the
    largest expert's), Float8CurrentScaling (each expert's kernel its own scale), MXFP8 / FP8 block / NVFP4 through
    grouped_dense's emulated GEMMs; hidden, ffn and the token count multiples of 16 under FP8."""

    _n_sets = 2

    def __init__(self, hidden: int, ffn: int, num_experts: int, *,
                 activation_type: Union[str, Sequence[str]] = ("gelu",), use_bias: bool = True, dtype=None,
                 param_dtype=jnp.float32, kernel_init=default_kernel_init, bias_init=default_bias_init,
                 rngs: nnx.Rngs):
        act = activation_of(activation_type)
        self.activation_type, self.a_dim = act.name, 2 if act.gated else 1
        self.hidden, self.ffn, self.num_experts, self.use_bias = hidden, ffn, num_experts, use_bias
        self.dtype, self.param_dtype = dtype, param_dtype

        def per_expert(init, shape):
            keys = jax.random.split(rngs.params(), num_experts)
            return nnx.Param(jax.vmap(lambda k: init(k, shape, param_dtype))(keys))

        for name, (i, o) in (("fc1", (hidden, self.a_dim * ffn)), ("fc2", (ffn, hidden))):
            setattr(self, f"{name}_kernel", per_expert(kernel_init, (i, o)))
            setattr(self, f"{name}_bias", per_expert(bias_init, (o,)) if use_bias else nnx.data(None))
        self._init_fp8_meta()

    def __call__(self, x, group_sizes, *, rngs=None):
        """x [M_total, hidden] (rows grouped by expert, in order), group_sizes int [num_experts] (on the device) ->
        [M_total, hidden]. Size rules as tej.grouped_gemm's: negative sizes count as 0, a sum past M_total is cut
        there, rows past the sum come out zero. rngs: as Dense's (NVFP4's stochastic rounding of the gradient)."""
        b1, b2 = (None if b is None else b.get_value() for b in (self.fc1_bias, self.fc2_bias))
        x, w1, b1, w2, b2 = dtypes.promote_dtype(
            (x, self.fc1_kernel.get_value(), b1, self.fc2_kernel.get_value(), b2), dtype=self.dtype)
        qs = self._quantizer_sets(rngs)
        qs1, qs2 = (None, None) if qs is None else qs
        h = grouped_dense(x, w1, group_sizes, b1, quantizer_set=qs1)                # [M_total, A·ffn]
        a = activation(h.reshape(h.shape[0], self.a_dim, self.ffn), self.activation_type)  # [M_total, ffn]
        return grouped_dense(a, w2, group_sizes, b2, quantizer_set=qs2)


def _is_set(node) -> bool:
    return isinstance(node, QuantizerSet)


def _is_quantizer(node) -> bool:
    return node is None or isinstance(node, Quantizer)


def _roll(state, grad):
    """update_quantizer_set, except that a quantizer whose cotangent carries no amax (0: its layer did not run
    under the delayed recipe this step) keeps its scale and history."""
    new = update_quantizer_set(state, grad)

    def pick(q, g, n):
        if not isinstance(q, DelayedScaleQuantizer):
            return n
        seen = g.amax_history[0] > 0
        return jax.tree_util.tree_map(lambda a, b: jnp.where(seen, a, b), n, q)

    return jax.tree_util.tree_map(pick, state, grad, new, is_leaf=_is_quantizer)


def _update(state, grad):
    """_roll, vmapped over the leading axes a stacked layer (nnx.vmap / nnx.scan) adds: a delayed quantizer's scale
    is [1] per layer."""
    first = next(q for s in jax.tree_util.tree_leaves(state, is_leaf=_is_set) for q in s
                 if isinstance(q, DelayedScaleQuantizer))
    fn = _roll
    for _ in range(first.scale.ndim - 1):
        fn = jax.vmap(fn)
    return fn(state, grad)


def update_fp8_meta(model: nnx.Module, grads: nnx.State) -> nnx.State:
    """Rolls the amaxes that `grads` (the gradients of a step with respect to FP8Meta, e.g. from nnx.grad with
    `nnx.DiffState(0, nnx.Any(nnx.Param, FP8Meta))`) carry into `model`'s FP8Meta variables — their next scales
    and histories (tej.update_quantizer_set) — and returns the rest of `grads` (for the optimizer). Jit-able, once
    per step. A quantizer whose gradient carries no amax (its layer did not run under the delayed recipe in this
    step, or saw only zeros) is left as it is."""
    meta_grads, rest = nnx.split_state(grads, FP8Meta, ...)
    by_path = dict(nnx.to_flat_state(meta_grads))
    updated = []
    for path, var in nnx.to_flat_state(nnx.state(model, FP8Meta)):
        grad = by_path.get(path)
        value = var.get_value()
        if value is not None and grad is not None and grad.get_value() is not None:
            updated.append((path, var.replace(_update(value, grad.get_value()))))
    nnx.update(model, nnx.from_flat_state(updated))
    return rest
