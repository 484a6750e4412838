"""Recipes, autocast and quantizer sets for `tej.dense` / `tej.mlp` (SPEC §8, the torch frontend's recipe.py in JAX's
functional form).

A recipe is a frozen dataclass naming a scaling scheme; `make_quantizer_set(recipe)` turns it into a `QuantizerSet`
(TE/JAX's naming: the `x`, `kernel` and `dgrad` quantizers of one dense layer, a pytree). Inside
`with tej.autocast(recipe=...)` a dense / mlp called without quantizer sets builds them from the recipe at trace
time (autocast is Python state read while tracing: enter it around the jitted call's tracing, e.g. around the
first call of a jitted function, or inside the function).

Delayed scaling is carried functionally, with no hidden state: the scales and amax histories are leaves of the
quantizer set, which the caller passes in and gets back. The amaxes a step observes leave a dense / mlp as the
*cotangent* of its quantizer set: differentiate the loss with respect to the sets too, and
`update_quantizer_set(qs, qs_grad)` rolls each delayed quantizer's observed amax (the cotangent's
`amax_history[0]`) into its history and derives the next scale (SPEC §4.3, `DelayedScaleQuantizer.update`):

    loss, (grads, qs_grads) = jax.value_and_grad(loss_fn, argnums=(0, 1))(params, qsets, batch)
    qsets = tej.update_quantizer_set(qsets, qs_grads)

Cotangents add up, so use each quantizer set once per step (one set per layer); `x` and `kernel` amaxes are those
of the forward casts, `dgrad`'s that of the gradient cast. Without autocast's state to carry, a delayed recipe
under `autocast` with no quantizer set given raises (a fresh set each call would never learn a scale).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from .quantizers import DelayedScaleQuantizer, Quantizer, QuantizeLayout, QuantizerFactory, ScalingMode

__all__ = ["Format", "DelayedScaling", "Float8CurrentScaling", "MXFP8BlockScaling", "NVFP4BlockScaling",
           "Float8BlockScaling", "QuantizerSet", "autocast", "get_autocast_recipe", "make_quantizer_set",
           "update_quantizer_set"]


class Format(enum.Enum):
    """FP8 formats of a recipe: E4M3 (forward and backward), HYBRID (forward E4M3, gradients E5M2)."""

    E4M3 = "E4M3"
    HYBRID = "HYBRID"


def _check_format(recipe: str, fmt) -> None:
    if fmt not in (Format.E4M3, Format.HYBRID):
        raise ValueError(f"{recipe}: fp8_format must be Format.E4M3 or Format.HYBRID, got {fmt!r}")


def _grad_dtype(fmt: Format):
    return jnp.float8_e5m2 if fmt == Format.HYBRID else jnp.float8_e4m3fn


@dataclasses.dataclass(frozen=True)
class DelayedScaling:
    """Per-tensor FP8, each scale from an amax history (SPEC §4.2-4.3); state carried in the quantizer set."""

    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    fp8_format: Format = Format.HYBRID

    def __post_init__(self):
        _check_format("DelayedScaling", self.fp8_format)
        if not (isinstance(self.amax_history_len, int) and self.amax_history_len >= 1):
            raise ValueError(f"DelayedScaling: amax_history_len must be an int >= 1, got {self.amax_history_len!r}")
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"DelayedScaling: amax_compute_algo must be 'max' or 'most_recent', got "
                             f"{self.amax_compute_algo!r}")


@dataclasses.dataclass(frozen=True)
class Float8CurrentScaling:
    """Per-tensor FP8, each tensor's scale from its own amax (SPEC §4.4)."""

    fp8_format: Format = Format.HYBRID
    use_power_2_scales: bool = False

    def __post_init__(self):
        _check_format("Float8CurrentScaling", self.fp8_format)


@dataclasses.dataclass(frozen=True)
class MXFP8BlockScaling:
    """MXFP8, E8M0 scales per 32 elements (SPEC §4.5). tej.gemm has no MXFP8 GEMM yet: dense / mlp emulate it."""

    fp8_format: Format = Format.E4M3

    def __post_init__(self):
        _check_format("MXFP8BlockScaling", self.fp8_format)


@dataclasses.dataclass(frozen=True)
class NVFP4BlockScaling:
    """NVFP4 (SPEC §4.6): 1-D 1x16 blocks for x and gradients, 2-D 16x16 tiles for the kernel. tej.gemm has no NVFP4
    GEMM yet: dense / mlp emulate it by dequantizing each operand, which is why the random Hadamard transform is
    not offered here (it only cancels inside one GEMM of two transformed operands). Stochastic rounding of the
    gradients needs a fresh key per step: it is off by default; turn it on with disable_stochastic_rounding=False
    and `make_quantizer_set(recipe, rng_key=...)`."""

    disable_stochastic_rounding: bool = True
    disable_2d_quantization: bool = False


@dataclasses.dataclass(frozen=True)
class Float8BlockScaling:
    """FP8 with 1x128 blocks (x, gradients) and 128x128 tiles (kernel), power-of-two scales (SPEC §4.7). Native on
    CUDA through tej.gemm; emulated on the CPU, where the core has no FP8 block GEMM."""

    fp8_format: Format = Format.E4M3
    force_pow_2_scales: bool = True

    def __post_init__(self):
        _check_format("Float8BlockScaling", self.fp8_format)


_RECIPES = (DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling, NVFP4BlockScaling, Float8BlockScaling)


class QuantizerSet(NamedTuple):
    """The quantizers of one dense layer (TE/JAX's names): `x` the input, `kernel` the weight, `dgrad` the output
    gradient. A pytree; any of them may be None (that operand stays in high precision, and then so must be the
    other operand of each GEMM it enters)."""

    x: Optional[Quantizer] = None
    kernel: Optional[Quantizer] = None
    dgrad: Optional[Quantizer] = None


def make_quantizer_set(recipe, rng_key=None) -> QuantizerSet:
    """The QuantizerSet of one dense layer under `recipe` (None: no quantization). Delayed scaling starts at scale 1
    with a zero history. `rng_key` seeds NVFP4's stochastic rounding of the gradient (required when it is on)."""
    if recipe is None:
        return QuantizerSet()
    if not isinstance(recipe, _RECIPES):
        raise TypeError(f"make_quantizer_set: recipe must be one of {', '.join(r.__name__ for r in _RECIPES)} or "
                        f"None, got {type(recipe).__name__}")
    both = QuantizeLayout.ROWWISE_COLWISE

    def make(mode, dtype=jnp.float8_e4m3fn, **kw):
        return QuantizerFactory.create(scaling_mode=mode, q_dtype=dtype, q_layout=both, **kw)

    if isinstance(recipe, DelayedScaling):
        kw = dict(margin=float(recipe.margin), amax_compute_algo=recipe.amax_compute_algo,
                  amax_history_len=recipe.amax_history_len)
        mode = ScalingMode.DELAYED_TENSOR_SCALING
        return QuantizerSet(make(mode, **kw), make(mode, **kw), make(mode, _grad_dtype(recipe.fp8_format), **kw))
    if isinstance(recipe, Float8CurrentScaling):
        mode, kw = ScalingMode.CURRENT_TENSOR_SCALING, dict(force_pow_2_scales=recipe.use_power_2_scales)
        return QuantizerSet(make(mode, **kw), make(mode, **kw), make(mode, _grad_dtype(recipe.fp8_format), **kw))
    if isinstance(recipe, MXFP8BlockScaling):
        mode = ScalingMode.MXFP8_1D_SCALING
        return QuantizerSet(make(mode), make(mode), make(mode, _grad_dtype(recipe.fp8_format)))
    if isinstance(recipe, Float8BlockScaling):
        kw = dict(force_pow_2_scales=recipe.force_pow_2_scales)
        return QuantizerSet(make(ScalingMode.BLOCK_SCALING_1x128, **kw), make(ScalingMode.BLOCK_SCALING_128x128, **kw),
                            make(ScalingMode.BLOCK_SCALING_1x128, _grad_dtype(recipe.fp8_format), **kw))
    sr = not recipe.disable_stochastic_rounding
    if sr and rng_key is None:
        raise ValueError("make_quantizer_set: NVFP4BlockScaling(disable_stochastic_rounding=False) rounds the "
                         "gradient stochastically and needs rng_key (a fresh jax PRNG key per step)")
    kernel_mode = ScalingMode.NVFP4_1D_SCALING if recipe.disable_2d_quantization else ScalingMode.NVFP4_2D_SCALING
    dgrad = make(ScalingMode.NVFP4_1D_SCALING, stochastic_rounding=sr, **({"rng_key": rng_key} if sr else {}))
    return QuantizerSet(make(ScalingMode.NVFP4_1D_SCALING), make(kernel_mode), dgrad)


def _is_quantizer(node) -> bool:
    return node is None or isinstance(node, Quantizer)


def update_quantizer_set(qsets, qsets_grad):
    """`qsets` (a QuantizerSet or any pytree of them, e.g. mlp's pair) for the next step: each delayed quantizer
    takes the amax its cotangent in `qsets_grad` carries (`amax_history[0]`, from jax.grad with respect to the
    sets) through `DelayedScaleQuantizer.update`; other quantizers are returned as they are. Pure jnp, jit-able."""

    def step(q, g):
        if isinstance(q, DelayedScaleQuantizer):
            return q.update(g.amax_history[:1].astype(jnp.float32))
        return q

    return jax.tree_util.tree_map(step, qsets, qsets_grad, is_leaf=_is_quantizer)


_AUTOCAST = contextvars.ContextVar("tej_autocast_recipe", default=None)


@contextlib.contextmanager
def autocast(enabled: bool = True, recipe=None):
    """Inside it, dense / mlp called without quantizer sets quantize as `recipe` says (default DelayedScaling(),
    which needs explicit, carried quantizer sets: see the module doc). enabled=False: plain high-precision GEMMs."""
    if enabled:
        recipe = DelayedScaling() if recipe is None else recipe
        if not isinstance(recipe, _RECIPES):
            raise TypeError(f"tej.autocast: recipe must be one of {', '.join(r.__name__ for r in _RECIPES)}, got "
                            f"{type(recipe).__name__}")
    token = _AUTOCAST.set(recipe if enabled else None)
    try:
        yield
    finally:
        _AUTOCAST.reset(token)


def get_autocast_recipe():
    """The recipe of the innermost enabled autocast, or None."""
    return _AUTOCAST.get()


def default_quantizer_set(layer: str) -> QuantizerSet:
    """The quantizer set a layer called without one uses: the autocast recipe's, or no quantization."""
    recipe = _AUTOCAST.get()
    if isinstance(recipe, DelayedScaling):
        raise ValueError(f"{layer}: under autocast(recipe=DelayedScaling(...)) the scales and amax histories are "
                         f"state the caller carries: pass quantizer_set(s)=tej.make_quantizer_set(recipe) and update "
                         f"them each step with tej.update_quantizer_set (see tej.recipe's doc)")
    return make_quantizer_set(recipe)
