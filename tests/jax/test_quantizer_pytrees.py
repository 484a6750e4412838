"""Quantizers and ScaledTensor as pytrees, activation_type spellings: the Python layer of tej (no kernels)."""
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import transformer_engine_jax as tej  # noqa: E402
from transformer_engine_jax.quantizers import FLAG_FORCE_POW2, FLAG_RHT, FLAG_SR  # noqa: E402

MODES = [m for m in tej.ScalingMode if m != tej.ScalingMode.NO_SCALING]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_quantizer_roundtrips_through_jit_and_scan(mode):
    q = tej.QuantizerFactory.create(scaling_mode=mode, amax_history_len=3)
    leaves, treedef = jax.tree_util.tree_flatten(q)
    again = jax.tree_util.tree_unflatten(treedef, leaves)
    assert type(again) is type(q) and again.ffi_attrs() == q.ffi_attrs()
    assert all(a is b for a, b in zip(jax.tree_util.tree_leaves(again), leaves))
    back = jax.jit(lambda q: q)(q)
    assert type(back) is type(q) and back.scaling_mode == mode and back.q_dtype == q.q_dtype
    assert back.ffi_attrs() == q.ffi_attrs()
    n_leaves = 2 if mode == tej.ScalingMode.DELAYED_TENSOR_SCALING else 0
    assert len(leaves) == n_leaves

    def step(carry, _):
        return jax.tree_util.tree_map(lambda a: a + 1, carry), None

    out, _ = jax.lax.scan(step, q, None, length=3)
    for a, b in zip(jax.tree_util.tree_leaves(out), leaves):
        assert jnp.array_equal(a, b + 3)


def test_ffi_attrs_encode_the_quantizer():
    attrs = tej.QuantizerFactory.create(scaling_mode=tej.ScalingMode.CURRENT_TENSOR_SCALING, q_dtype=jnp.float8_e5m2,
                                        q_layout=tej.QuantizeLayout.ROWWISE, force_pow_2_scales=True).ffi_attrs()
    assert {k: int(v) for k, v in attrs.items() if k != "amax_epsilon"} == dict(
        scaling_mode=2, q_dtype=8, q_layout=0, flags=FLAG_FORCE_POW2)
    nv = tej.QuantizerFactory.create(scaling_mode=tej.ScalingMode.NVFP4_2D_SCALING, stochastic_rounding=True)
    assert (int(nv.ffi_attrs()["scaling_mode"]), int(nv.ffi_attrs()["q_dtype"]), int(nv.ffi_attrs()["flags"])) == \
        (6, 10, FLAG_SR)
    rht = tej.QuantizerFactory.create(scaling_mode=tej.ScalingMode.NVFP4_1D_SCALING, use_rht=True).ffi_attrs()
    assert int(rht["flags"]) & FLAG_RHT
    blk = tej.QuantizerFactory.create(scaling_mode=tej.ScalingMode.BLOCK_SCALING_128x128)
    assert blk.force_pow_2_scales and int(blk.ffi_attrs()["scaling_mode"]) == 7


def test_factory_rejects_bad_settings():
    with pytest.raises(ValueError, match=r"MXFP8_1D_SCALING quantizes to float8_e4m3fn or float8_e5m2, got q_dtype "
                                         r"bfloat16"):
        tej.QuantizerFactory.create(scaling_mode=tej.ScalingMode.MXFP8_1D_SCALING, q_dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match="amax_history_len must be >= 1, got 0"):
        tej.QuantizerFactory.create(amax_history_len=0)
    assert tej.QuantizerFactory.create(scaling_mode=tej.ScalingMode.NO_SCALING) is None
    assert len(tej.QuantizerFactory.create(3, scaling_mode=tej.ScalingMode.MXFP8_1D_SCALING)) == 3


@pytest.mark.parametrize("spelling,name,code,gated", [
    (("gelu",), "gelu", 0, False), (("gelu", "linear"), "geglu", 1, True), (("sigmoid", "linear"), "glu", 2, True),
    (("silu",), "silu", 3, False), (("silu", "linear"), "swiglu", 4, True), (("relu",), "relu", 5, False),
    (("relu", "linear"), "reglu", 6, True), (("quick_gelu",), "qgelu", 7, False),
    (("quick_gelu", "linear"), "qgeglu", 8, True), (("squared_relu",), "srelu", 9, False),
    (("squared_relu", "linear"), "sreglu", 10, True), (("clamped_silu", "clamped_linear"), "clamped_swiglu", 11, True),
])
def test_activation_spellings(spelling, name, code, gated):
    for key in (spelling, list(spelling), name, name.upper()):
        a = tej.activation_of(key)
        assert (a.name, a.code, a.gated, a.spelling) == (name, code, gated, spelling)


@pytest.mark.parametrize("bad", [("gelu", "gelu"), "tanh", ("linear",), 3, ()])
def test_activation_spelling_errors_list_the_accepted(bad):
    with pytest.raises(ValueError, match=r"is not known; accepted: \('gelu',\), \('gelu', 'linear'\)"):
        tej.activation_of(bad)


def test_scaled_tensor_copies():
    row, col = jnp.zeros((4, 8), jnp.uint8), jnp.ones((8, 4), jnp.uint8)
    s = jnp.ones((1,), jnp.float32)
    t = tej.ScaledTensor(row, s, col, s, None, None, tej.ScalingMode.CURRENT_TENSOR_SCALING,
                         tej.QuantizeLayout.ROWWISE_COLWISE, (4, 8), jnp.bfloat16)
    assert len(jax.tree_util.tree_leaves(t)) == 4
    r, c = t.get_rowwise_tensor(), t.get_colwise_tensor()
    assert r.colwise_data is None and r.data is row and r.q_layout == tej.QuantizeLayout.ROWWISE
    assert c.data is None and c.colwise_data is col and c.q_layout == tej.QuantizeLayout.COLWISE
    with pytest.raises(ValueError, match=r"holds only the colwise copy"):
        c.get_rowwise_tensor()
    with pytest.raises(ValueError, match=r"holds only the rowwise copy"):
        r.get_colwise_tensor()
    back = jax.jit(lambda t: t)(t)
    assert back.shape == (4, 8) and jnp.array_equal(back.colwise_data, col)
