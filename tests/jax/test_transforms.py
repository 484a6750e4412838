"""jit, vmap and eager agree byte for byte; the batch rule keeps per-tensor scaling per batch element."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import transformer_engine_jax as tej  # noqa: E402

SM = tej.ScalingMode


def leaves_bytes(tree):
    return [np.asarray(a).view(np.uint8).tobytes() for a in jax.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize("mode", [None, SM.CURRENT_TENSOR_SCALING, SM.MXFP8_1D_SCALING, SM.NVFP4_1D_SCALING,
                                  SM.BLOCK_SCALING_128x128], ids=lambda m: "plain" if m is None else m.name)
def test_jit_equals_eager(mode):
    x = jax.random.normal(jax.random.PRNGKey(1), (64, 2, 128), jnp.bfloat16)
    q = None if mode is None else tej.QuantizerFactory.create(scaling_mode=mode)
    eager = tej.act_lu(x, ("silu", "linear"), q)
    jitted = jax.jit(lambda x, q: tej.act_lu(x, ("silu", "linear"), q))(x, q)
    assert leaves_bytes(eager) == leaves_bytes(jitted)


@pytest.mark.parametrize("mode", [None, SM.CURRENT_TENSOR_SCALING, SM.MXFP8_1D_SCALING],
                         ids=lambda m: "plain" if m is None else m.name)
def test_vmap_equals_per_element(mode):
    xs = jax.random.normal(jax.random.PRNGKey(2), (3, 32, 1, 64), jnp.float32) * jnp.array([1.0, 10.0, 100.0])[
        :, None, None, None]
    q = None if mode is None else tej.QuantizerFactory.create(scaling_mode=mode)
    batched = jax.vmap(lambda x: tej.act_lu(x, "gelu", q))(xs)
    for i in range(xs.shape[0]):
        one = tej.act_lu(xs[i], "gelu", q)
        got = jax.tree_util.tree_map(lambda a: a[i], batched)
        assert leaves_bytes(got) == leaves_bytes(one), f"batch element {i}"
    if mode == SM.CURRENT_TENSOR_SCALING:  # each element has its own scale: the batch is not one tensor
        assert len({float(s) for s in np.asarray(batched.scale_inv).ravel()}) == 3


def test_vmap_of_dbias_sums_per_element():
    x = jax.random.normal(jax.random.PRNGKey(3), (2, 16, 1, 32), jnp.float32)
    dz = jax.random.normal(jax.random.PRNGKey(4), (2, 16, 32), jnp.float32)
    dx, dbias = jax.vmap(lambda dz, x: tej.quantize_dact_dbias(dz, x, "gelu"))(dz, x)
    for i in range(2):
        dx1, db1 = tej.quantize_dact_dbias(dz[i], x[i], "gelu")
        assert np.asarray(dx[i]).tobytes() == np.asarray(dx1).tobytes()
        assert np.asarray(dbias[i]).tobytes() == np.asarray(db1).tobytes()
