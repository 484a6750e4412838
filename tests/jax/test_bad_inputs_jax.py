"""Bad inputs to the tej ops raise a clear Python error at trace time (jax.eval_shape runs no kernel)."""
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import transformer_engine_jax as tej  # noqa: E402

SM = tej.ScalingMode


def trace(fn, *args):
    return jax.eval_shape(fn, *args)


def test_integer_x():
    x = jax.ShapeDtypeStruct((4, 1, 64), jnp.int32)
    with pytest.raises(TypeError, match=r"act_lu: x must be float32, float16 or bfloat16, got int32 with shape "
                                        r"\(4, 1, 64\)"):
        trace(lambda x: tej.act_lu(x, "gelu"), x)


@pytest.mark.parametrize("act,shape,want", [("gelu", (4, 2, 64), 1), ("swiglu", (4, 1, 64), 2),
                                            ("geglu", (64,), 2)])
def test_wrong_a_axis(act, shape, want):
    x = jax.ShapeDtypeStruct(shape, jnp.float32)
    with pytest.raises(ValueError, match=rf"act_lu: .* takes x of shape \[\.\.\., {want}, K\] .* got "
                                         rf"{shape}".replace("(", r"\(").replace(")", r"\)")):
        trace(lambda x: tej.act_lu(x, act), x)


def test_mxfp8_k_not_multiple_of_32():
    q = tej.QuantizerFactory.create(scaling_mode=SM.MXFP8_1D_SCALING)
    x = jax.ShapeDtypeStruct((64, 1, 48), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"MXFP8 E4M3 quantizes blocks of 32 along the last dim.*got quantized "
                                         r"shape \[64, 48\].*Pad the last dim to 64"):
        trace(lambda x: tej.act_lu(x, "gelu", q), x)


def test_nvfp4_rows_not_multiple_of_16_for_colwise():
    q = tej.QuantizerFactory.create(scaling_mode=SM.NVFP4_1D_SCALING)
    x = jax.ShapeDtypeStruct((24, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"NVFP4 columnwise usage quantizes 16x1 blocks down the rows.*M=24"):
        trace(lambda x: tej.quantize(x, q), x)


@pytest.mark.parametrize("bad", ["fp8", 3, object()])
def test_quantizer_of_the_wrong_kind(bad):
    x = jax.ShapeDtypeStruct((4, 1, 64), jnp.float32)
    with pytest.raises(TypeError, match=r"quantizer must be a tej quantizer \(QuantizerFactory.create\) or None, "
                                        r"got " + type(bad).__name__):
        trace(lambda x: tej.act_lu(x, "gelu", bad), x)


def test_gated_dbias_is_refused_by_name():
    x = jax.ShapeDtypeStruct((4, 2, 64), jnp.float32)
    dz = jax.ShapeDtypeStruct((4, 64), jnp.float32)
    with pytest.raises(ValueError, match=r"dbias is defined for unary activations only"):
        trace(lambda dz, x: tej.quantize_dact_dbias(dz, x, "swiglu", True), dz, x)


def test_dz_dtype_must_match():
    x = jax.ShapeDtypeStruct((4, 1, 64), jnp.float32)
    dz = jax.ShapeDtypeStruct((4, 64), jnp.bfloat16)
    with pytest.raises(TypeError, match=r"dz dtype bfloat16 must match x dtype float32"):
        trace(lambda dz, x: tej.dact_lu(dz, x, "gelu"), dz, x)


def test_stochastic_rounding_without_rng_or_outside_nvfp4_is_refused_by_name():
    x = jax.ShapeDtypeStruct((32, 1, 64), jnp.bfloat16)
    q = tej.QuantizerFactory.create(scaling_mode=SM.NVFP4_1D_SCALING, stochastic_rounding=True)
    with pytest.raises(ValueError, match=r"NVFP4Quantizer \(NVFP4_1D_SCALING\): stochastic_rounding=True needs an "
                                         r"rng_state"):
        trace(lambda x: tej.act_lu(x, "gelu", q), x)
    q = tej.QuantizerFactory.create(scaling_mode=SM.CURRENT_TENSOR_SCALING, stochastic_rounding=True)
    with pytest.raises(ValueError, match=r"CurrentScaleQuantizer \(CURRENT_TENSOR_SCALING\): stochastic_rounding=True "
                                         r"is defined for NVFP4 only"):
        trace(lambda x: tej.act_lu(x, "gelu", q), x)
