"""Scaling modes, quantize layouts and quantizers as pytrees (TE/JAX's names), and what each means to the core.

A quantizer is a pytree: its arrays (a delayed-scaling quantizer's `scale` f32[1] and `amax_history` f32[L], an
NVFP4 quantizer's stochastic-rounding `rng_state` u32[4]) are leaves, so it passes through `jit`, `grad` and `scan`;
its settings are static. Each quantizer knows the core's quantizer spec (SPEC §1.4: kind, dtype code, usage, flags,
amax epsilon, block dim) that the FFI handlers decode.
Quantizers never change: `update(amax)` returns a new one (delayed scaling, SPEC §4.3).
"""
from __future__ import annotations

import dataclasses
import enum

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi, _fp32

# The core's format table (csrc/core/formats/table.h), one dict per format id: name, element types, block shapes,
# scale type, scale- and data-shape rules of each copy, decode rule. Read once; tej's shape and decode constants
# come from it.
FORMATS = tuple(_ffi.format_table())


class ScalingMode(enum.IntEnum):
    """The scaling recipe of a quantized tensor (csrc/jax/quantizer_attrs.h maps it to the core's quantizer); its
    storage is the core format `format` (an index into FORMATS)."""

    NO_SCALING = 0
    DELAYED_TENSOR_SCALING = 1
    CURRENT_TENSOR_SCALING = 2
    MXFP8_1D_SCALING = 3
    NVFP4_1D_SCALING = 4
    BLOCK_SCALING_1x128 = 5
    NVFP4_2D_SCALING = 6
    BLOCK_SCALING_128x128 = 7

    @property
    def format(self) -> int:
        """The core's format id of what this mode stores (delayed and current scaling share per-tensor FP8; NVFP4's
        2-D tiles are stored as its 1-D blocks, the tile scale repeated)."""
        return _FORMAT_OF[self]

    @property
    def format_row(self) -> dict:
        """This mode's row of the core's format table."""
        return FORMATS[_FORMAT_OF[self]]


_FORMAT_OF = {m: next(r["id"] for r in FORMATS if r["name"] == name) for m, name in (
    (ScalingMode.NO_SCALING, "plain"), (ScalingMode.DELAYED_TENSOR_SCALING, "fp8_per_tensor"),
    (ScalingMode.CURRENT_TENSOR_SCALING, "fp8_per_tensor"), (ScalingMode.MXFP8_1D_SCALING, "mxfp8"),
    (ScalingMode.NVFP4_1D_SCALING, "nvfp4"), (ScalingMode.NVFP4_2D_SCALING, "nvfp4"),
    (ScalingMode.BLOCK_SCALING_1x128, "fp8_block_1x128"), (ScalingMode.BLOCK_SCALING_128x128, "fp8_block_128x128"))}


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
    random_sign_mask: bool = True  # with use_rht: the transform's sign vector (SPEC §4.6), as tex's default

    def ffi_attrs(self) -> dict:
        """The quantizer as the FFI handlers' `quantizer` attribute (csrc/jax/quantizer_attrs.h): the mode and
        layout enums, the core's dtype code and the SPEC §1.4 flag bits the mode does not imply."""
        flags = FLAG_FORCE_POW2 if self.force_pow_2_scales else 0
        if self.stochastic_rounding:
            flags |= FLAG_SR
        if self.use_rht:
            flags |= FLAG_RHT | (FLAG_RANDOM_SIGN if self.random_sign_mask else 0)
        nvfp4 = self.scaling_mode in (ScalingMode.NVFP4_1D_SCALING, ScalingMode.NVFP4_2D_SCALING)
        dtype_code = _FP4_CODE if nvfp4 else _FP8_CODES.get(jnp.dtype(self.q_dtype), 0)
        return dict(scaling_mode=np.int64(self.scaling_mode), q_dtype=np.int64(dtype_code),
                    q_layout=np.int64(self.q_layout), flags=np.int64(flags),
                    amax_epsilon=np.float32(self.amax_epsilon))

    def rng_words(self):
        """The FFI call's `rng` argument when `stochastic_rounding` is set. Only NVFP4 rounds stochastically."""
        raise ValueError(f"{type(self).__name__} ({self.scaling_mode.name}): stochastic_rounding=True is defined for "
                         "NVFP4 only (SPEC §2: FP8 casts round to nearest even); use stochastic_rounding=False")

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

    def update(self, amax) -> "DelayedScaleQuantizer":
        """The quantizer of the next step (SPEC §4.3), as the torch frontend's `amax_history[0] = amax` followed by
        `fused_amax_and_scale_update_after_reduction(None, [amax_history], [scale], amax_compute_algo, q_dtype,
        margin)`, bit for bit. `amax` (f32[1] or scalar): this step's amax, the ScaledTensor's `amax` of a cast
        with this quantizer (after any MAX all-reduce). Pure jnp: jit-able, and the result has this quantizer's
        tree structure, so it can be a `lax.scan` carry.

        If amax != 0 the history rolls (old[1] drops out, amax enters at the end, row 0 is zeroed) and the next
        scale is fl(fl(fp8_max * 2^-margin) / a), a = amax ("most_recent") or the max of amax and the old rows 1..L-1
        ("max", NaN rows skipped); a = 0, Inf or NaN keeps the scale, a quotient of Inf becomes FLT_MAX. If amax == 0
        the history keeps its rows (row 0 = amax) and the scale is kept."""
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"DelayedScaleQuantizer.update: amax_compute_algo must be \"max\" or \"most_recent\", "
                             f"got {self.amax_compute_algo!r}")
        amax = jnp.asarray(amax)
        if amax.size != 1 or amax.dtype != jnp.float32:
            raise ValueError(f"DelayedScaleQuantizer.update: amax must be one float32 value (the ScaledTensor's amax "
                             f"f32[1]), got {amax.dtype} with shape {amax.shape}")
        # On the bits (`_fp32`): XLA's CPU backend would flush a subnormal amax to zero.
        last, hist = _fp32.bits(amax.reshape(())), _fp32.bits(self.amax_history)
        # The core's fold `a = v > a ? v : a` from a = last: NaN rows never win, a NaN last stays NaN.
        keys = jnp.where(_fp32.is_nan(hist[1:]), jnp.iinfo(jnp.int32).min, _fp32.order_key(hist[1:]))  # [L - 1]
        a = last
        if self.amax_compute_algo == "max" and hist.shape[0] > 1:
            older_wins = ~_fp32.is_nan(last) & (jnp.max(keys) > _fp32.order_key(last))
            a = jnp.where(older_wins, hist[1:][jnp.argmax(keys)], last)
        rolls = ~_fp32.is_zero(last)
        rolled = jnp.concatenate([jnp.zeros((1,), _fp32.U32), hist[2:], last[None]])[:hist.shape[0]]
        new_hist = jnp.where(rolls, rolled, hist.at[0].set(last))
        fp8_max = float(jnp.finfo(self.q_dtype).max)
        max_over_margin = np.float32(fp8_max) * np.exp2(np.float32(-self.margin))  # float * exp2f, as the core
        quotient = _fp32.div(_fp32.const(max_over_margin), a)
        quotient = jnp.where(_fp32.is_finite(quotient), quotient, _fp32.const(jnp.finfo(jnp.float32).max))
        positive_finite = (a - 1) < (_fp32.EXP - 1)                    # 0 < a < Inf; NaN and negatives excluded
        new_scale = _fp32.from_bits(jnp.where(rolls & positive_finite, quotient, _fp32.bits(self.scale)))
        new_hist = _fp32.from_bits(new_hist)
        return dataclasses.replace(self, scale=new_scale, amax_history=new_hist)


@_pytree
class CurrentScaleQuantizer(Quantizer):
    """Per-tensor FP8 with current scaling (SPEC §4.4): the amax of this tensor sets its scale."""


@_pytree
class MXFP8Quantizer(Quantizer):
    """MXFP8: 1x32 / 32x1 blocks with E8M0 scales (SPEC §4.5)."""


_U64 = 1 << 64


@_pytree
class NVFP4Quantizer(Quantizer):
    """NVFP4: E2M1 values, 1x16 (or 16x16 for NVFP4_2D_SCALING) blocks with E4M3 scales and a per-tensor global
    scale (SPEC §4.6); stochastic rounding and the random Hadamard transform as flags.

    Stochastic rounding draws its bits from `rng_state` (uint32[4], a pytree leaf: the little-endian words of the
    Philox key int64 [seed, offset] that the torch frontend's `quantize(..., rng_seed, rng_offset)` takes), set with
    `with_rng(key)` or `with_rng_seed(seed, offset)`. The same state gives the same bytes on every call: derive a
    fresh one per step (e.g. `q.with_rng(jax.random.fold_in(key, step))`)."""

    rng_state: object = None  # uint32[4]: seed lo, seed hi, offset lo, offset hi

    @classmethod
    def _leaf_names(cls):
        return ("rng_state",)

    def _leaves(self):
        return (self.rng_state,)

    def with_rng(self, key) -> "NVFP4Quantizer":
        """A copy whose stochastic rounding uses 4 uint32 words drawn from the jax PRNG `key` (traceable)."""
        return dataclasses.replace(self, rng_state=jax.random.bits(key, (4,), jnp.uint32))

    def with_rng_seed(self, seed: int, offset: int = 0) -> "NVFP4Quantizer":
        """A copy whose stochastic rounding uses the Philox key (seed, offset): the bytes of the torch frontend's
        NVFP4 `quantize` with rng_seed=seed, rng_offset=offset. Both are integers in [0, 2^64)."""
        for name, v in (("seed", seed), ("offset", offset)):
            if not isinstance(v, (int, np.integer)) or not 0 <= int(v) < _U64:
                raise ValueError(f"NVFP4Quantizer.with_rng_seed: {name} must be an integer in [0, 2^64), got {v!r}")
        words = [int(v) >> s & 0xFFFFFFFF for v in (seed, offset) for s in (0, 32)]
        return dataclasses.replace(self, rng_state=jnp.asarray(np.array(words, np.uint32)))

    def rng_words(self):
        if self.rng_state is None:
            raise ValueError(f"NVFP4Quantizer ({self.scaling_mode.name}): stochastic_rounding=True needs an rng_state; "
                             "set one with q.with_rng(key), q.with_rng_seed(seed, offset) or "
                             "QuantizerFactory.create(..., stochastic_rounding=True, rng_key=key)")
        rng = self.rng_state
        if rng.shape != (4,) or rng.dtype != jnp.uint32:
            raise ValueError(f"NVFP4Quantizer ({self.scaling_mode.name}): rng_state must be uint32[4] (the words of "
                             f"int64 [seed, offset]), got {rng.dtype} with shape {rng.shape}")
        return rng


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
        with a zero history of `amax_history_len`. NVFP4 with stochastic_rounding=True takes `rng_key` (a jax PRNG key;
        split across `n_quantizers`) for its rng_state. Raises ValueError naming the mode and the rule broken."""
        mode = ScalingMode(scaling_mode)
        if mode == ScalingMode.NO_SCALING:
            return None if n_quantizers == 1 else (None,) * n_quantizers
        cls = _CLASS_OF[mode]
        if cls is NVFP4Quantizer:
            q_dtype = jnp.float4_e2m1fn
        elif jnp.dtype(q_dtype) not in _FP8:
            raise ValueError(f"QuantizerFactory.create: {mode.name} quantizes to float8_e4m3fn or float8_e5m2, "
                             f"got q_dtype {jnp.dtype(q_dtype)}")
        rng_key = settings.pop("rng_key", None)
        if rng_key is not None and cls is not NVFP4Quantizer:
            raise ValueError(f"QuantizerFactory.create: rng_key is for NVFP4 stochastic rounding, not {mode.name}")
        if cls is not DelayedScaleQuantizer:
            settings.pop("margin", None), settings.pop("amax_compute_algo", None)
        else:
            if amax_history_len < 1:
                raise ValueError(f"QuantizerFactory.create: amax_history_len must be >= 1, got {amax_history_len}")
            settings.setdefault("scale", jnp.ones((1,), jnp.float32))
            settings.setdefault("amax_history", jnp.zeros((amax_history_len,), jnp.float32))
        made = tuple(cls(scaling_mode=mode, q_dtype=q_dtype, q_layout=QuantizeLayout(q_layout), **settings)
                     for _ in range(n_quantizers))
        if rng_key is not None:
            keys = [rng_key] if n_quantizers == 1 else list(jax.random.split(rng_key, n_quantizers))
            made = tuple(q.with_rng(k) for q, k in zip(made, keys))
        return made[0] if n_quantizers == 1 else made
