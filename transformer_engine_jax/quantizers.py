"""Scaling modes, quantize layouts and quantizers as pytrees (TE/JAX's names), and what each means to the core.

A quantizer is a pytree: its arrays (a delayed-scaling quantizer's `scale` f32[1] and `amax_history` f32[L]) are
leaves, so it passes through `jit`, `grad` and `scan`; its settings are static. Each quantizer knows the core's
quantizer spec (SPEC §1.4: kind, dtype code, usage, flags, amax epsilon, block dim) that the FFI handlers decode.
Quantizers never change: `update(amax)` returns a new one (delayed scaling, SPEC §4.3).
"""
from __future__ import annotations

import dataclasses
import enum

import jax
import jax.numpy as jnp
import numpy as np


class ScalingMode(enum.IntEnum):
    """The scaling recipe of a quantized tensor (csrc/jax/quantizer_attrs.h maps it to the core's quantizer)."""

    NO_SCALING = 0
    DELAYED_TENSOR_SCALING = 1
    CURRENT_TENSOR_SCALING = 2
    MXFP8_1D_SCALING = 3
    NVFP4_1D_SCALING = 4
    BLOCK_SCALING_1x128 = 5
    NVFP4_2D_SCALING = 6
    BLOCK_SCALING_128x128 = 7



class QuantizeLayout(enum.IntEnum):
    """Which copies a quantizer writes: ROWWISE (the tensor as it is), COLWISE (the copy for the transposed
    operand), or both."""

    ROWWISE = 0
    COLWISE = 1
    ROWWISE_COLWISE = 2

    @property
    def rowwise(self) -> bool:
        return self != QuantizeLayout.COLWISE

    @property
    def colwise(self) -> bool:
        return self != QuantizeLayout.ROWWISE


# Core dtype codes (SPEC §1.3) of the quantized data types.
_FP8_CODES = {jnp.dtype(jnp.float8_e4m3fn): 7, jnp.dtype(jnp.float8_e5m2): 8}
_FP4_CODE = 10
# Quantizer spec flag bits (SPEC §1.4).
FLAG_FORCE_POW2, FLAG_2D, FLAG_SR, FLAG_RHT, FLAG_RANDOM_SIGN, FLAG_SWIZZLED = (1 << i for i in range(6))


@dataclasses.dataclass(frozen=True)
class Quantizer:
    """Settings shared by every quantizer (static in the pytree)."""

    scaling_mode: ScalingMode
    q_dtype: object = jnp.float8_e4m3fn
    q_layout: QuantizeLayout = QuantizeLayout.ROWWISE_COLWISE
    force_pow_2_scales: bool = False
    amax_epsilon: float = 0.0
    stochastic_rounding: bool = False
    use_rht: bool = False

    def ffi_attrs(self) -> dict:
        """The quantizer as the FFI handlers' `quantizer` attribute (csrc/jax/quantizer_attrs.h): the mode and
        layout enums, the core's dtype code and the SPEC §1.4 flag bits the mode does not imply."""
        flags = FLAG_FORCE_POW2 if self.force_pow_2_scales else 0
        if self.stochastic_rounding:
            flags |= FLAG_SR
        if self.use_rht:
            flags |= FLAG_RHT | FLAG_RANDOM_SIGN
        nvfp4 = self.scaling_mode in (ScalingMode.NVFP4_1D_SCALING, ScalingMode.NVFP4_2D_SCALING)
        dtype_code = _FP4_CODE if nvfp4 else _FP8_CODES.get(jnp.dtype(self.q_dtype), 0)
        return dict(scaling_mode=np.int64(self.scaling_mode), q_dtype=np.int64(dtype_code),
                    q_layout=np.int64(self.q_layout), flags=np.int64(flags),
                    amax_epsilon=np.float32(self.amax_epsilon))

    def rng_words(self):
        raise NotImplementedError(f"{type(self).__name__}: stochastic rounding from JAX is not provided yet; "
                                  "use stochastic_rounding=False")

    # pytree protocol: settings are aux data; subclasses add array leaves.
    def _leaves(self) -> tuple:
        return ()

    def tree_flatten(self):
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        leaves = self._leaves()
        static = tuple((k, v) for k, v in fields.items() if k not in self._leaf_names())
        return leaves, static

    @classmethod
    def _leaf_names(cls) -> tuple:
        return ()

    @classmethod
    def tree_unflatten(cls, static, leaves):
        return cls(**dict(static), **dict(zip(cls._leaf_names(), leaves)))


def _pytree(cls):
    return jax.tree_util.register_pytree_node_class(dataclasses.dataclass(frozen=True)(cls))


@_pytree
class DelayedScaleQuantizer(Quantizer):
    """Per-tensor FP8 with delayed scaling (SPEC §4.2): casts with `scale`, records the amax of what it cast;
    `update(amax)` rolls that amax into `amax_history` and derives the next scale (SPEC §4.3)."""

    scale: object = None  # f32[1]
    amax_history: object = None  # f32[L]
    margin: float = 0.0
    amax_compute_algo: str = "max"

    @classmethod
    def _leaf_names(cls):
        return ("scale", "amax_history")

    def _leaves(self):
        return (self.scale, self.amax_history)


@_pytree
class CurrentScaleQuantizer(Quantizer):
    """Per-tensor FP8 with current scaling (SPEC §4.4): the amax of this tensor sets its scale."""


@_pytree
class MXFP8Quantizer(Quantizer):
    """MXFP8: 1x32 / 32x1 blocks with E8M0 scales (SPEC §4.5)."""


@_pytree
class NVFP4Quantizer(Quantizer):
    """NVFP4: E2M1 values, 1x16 (or 16x16 for NVFP4_2D_SCALING) blocks with E4M3 scales and a per-tensor global
    scale (SPEC §4.6); stochastic rounding and the random Hadamard transform as flags."""


@_pytree
class BlockScaleQuantizer(Quantizer):
    """FP8 with 1x128 blocks or 128x128 tiles and float32 scales (SPEC §4.7); power-of-two scales by default, as
    the torch frontend's Float8BlockQuantizer."""

    force_pow_2_scales: bool = True


_CLASS_OF = {
    ScalingMode.DELAYED_TENSOR_SCALING: DelayedScaleQuantizer,
    ScalingMode.CURRENT_TENSOR_SCALING: CurrentScaleQuantizer,
    ScalingMode.MXFP8_1D_SCALING: MXFP8Quantizer,
    ScalingMode.NVFP4_1D_SCALING: NVFP4Quantizer,
    ScalingMode.NVFP4_2D_SCALING: NVFP4Quantizer,
    ScalingMode.BLOCK_SCALING_1x128: BlockScaleQuantizer,
    ScalingMode.BLOCK_SCALING_128x128: BlockScaleQuantizer,
}
_FP8 = (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e5m2))


class QuantizerFactory:
    @staticmethod
    def create(n_quantizers: int = 1, *, scaling_mode=ScalingMode.DELAYED_TENSOR_SCALING, q_dtype=jnp.float8_e4m3fn,
               q_layout=QuantizeLayout.ROWWISE_COLWISE, amax_history_len: int = 1024, **settings):
        """One quantizer (or a tuple of `n_quantizers`) of `scaling_mode`. FP8 modes take q_dtype float8_e4m3fn or
        float8_e5m2; NVFP4 modes take float4_e2m1fn (the default is replaced). Delayed scaling starts at scale 1
        with a zero history of `amax_history_len`. Raises ValueError naming the mode and the rule broken."""
        mode = ScalingMode(scaling_mode)
        if mode == ScalingMode.NO_SCALING:
            return None if n_quantizers == 1 else (None,) * n_quantizers
        cls = _CLASS_OF[mode]
        if cls is NVFP4Quantizer:
            q_dtype = jnp.float4_e2m1fn
        elif jnp.dtype(q_dtype) not in _FP8:
            raise ValueError(f"QuantizerFactory.create: {mode.name} quantizes to float8_e4m3fn or float8_e5m2, "
                             f"got q_dtype {jnp.dtype(q_dtype)}")
        if cls is not DelayedScaleQuantizer:
            settings.pop("margin", None), settings.pop("amax_compute_algo", None)
        else:
            if amax_history_len < 1:
                raise ValueError(f"QuantizerFactory.create: amax_history_len must be >= 1, got {amax_history_len}")
            settings.setdefault("scale", jnp.ones((1,), jnp.float32))
            settings.setdefault("amax_history", jnp.zeros((amax_history_len,), jnp.float32))
        made = tuple(cls(scaling_mode=mode, q_dtype=q_dtype, q_layout=QuantizeLayout(q_layout), **settings)
                     for _ in range(n_quantizers))
        return made[0] if n_quantizers == 1 else made
