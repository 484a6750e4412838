"""tej.grouped_dense: forward and gradients (x, kernel, bias) against a float64 jnp reference that applies the group
size rules row by row; FP8 current scaling within the FP8 tolerance; errors."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import transformer_engine_jax as tej  # noqa: E402

pytestmark = pytest.mark.usefixtures("jax_on_cpu")
SIZES = [10, 0, 25, -2, 3]  # 38 of 44 rows covered


def reference(x, kernel, bias, sizes):
    """float64: each row times its group's kernel (+ bias); rows past the groups are zeros."""
    ids, row = np.full(x.shape[0], -1), 0
    for g, s in enumerate(sizes):
        s = max(s, 0)
        ids[row:row + s] = g
        row += s
    covered = ids >= 0
    w = kernel[np.where(covered, ids, 0)]
    y = jnp.einsum("mk,mkn->mn", x, w) + bias[np.where(covered, ids, 0)]
    return jnp.where(covered[:, None], y, 0.0)


def data(dtype):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (44, 32))
    k = rng.uniform(-1, 1, (5, 32, 16))
    b = rng.uniform(-1, 1, (5, 16))
    return x, k, b


def loss(y):
    return jnp.sum(jnp.sin(y.astype(jnp.float32)) * jnp.arange(y.shape[1], dtype=jnp.float32))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_forward_and_grads_vs_float64(dtype):
    x, k, b = data(dtype)
    gs = jnp.asarray(SIZES, jnp.int32)
    args = [jnp.asarray(v, dtype) for v in (x, k, b)]
    f = jax.jit(lambda x, k, b: loss(tej.grouped_dense(x, k, gs, b)))
    got = jax.grad(f, argnums=(0, 1, 2))(*args)
    with jax.enable_x64():
        want = jax.grad(lambda *a: jnp.sum(jnp.sin(reference(*a, SIZES)) * jnp.arange(16.0)), argnums=(0, 1, 2))(
            *[jnp.asarray(np.asarray(a, np.float64)) for a in args])
        y = tej.grouped_dense(*args[:2], gs, args[2])
        np.testing.assert_allclose(np.asarray(y, np.float64), np.asarray(reference(
            *[jnp.asarray(np.asarray(a, np.float64)) for a in args], SIZES)), rtol=1e-2 if dtype == jnp.bfloat16
            else 1e-5, atol=2e-2 if dtype == jnp.bfloat16 else 1e-5)
    tol = 3e-2 if dtype == jnp.bfloat16 else 1e-4
    for name, g, w in zip(("dx", "dkernel", "dbias"), got, want):
        w = np.asarray(w)
        err = np.max(np.abs(np.asarray(g, np.float64) - w)) / np.max(np.abs(w))
        assert err < tol, f"{name}: {err}"
    assert not np.asarray(got[1][1]).any(), "the empty group's kernel gets a zero gradient"
    assert not np.asarray(got[1][3]).any(), "a negative size counts as 0: zero gradient"


def test_fp8_current_scaling_grads():
    x, k, b = data(jnp.bfloat16)
    gs = jnp.asarray(SIZES, jnp.int32)
    args = [jnp.asarray(v, jnp.bfloat16) for v in (x, k, b)]
    with tej.autocast(recipe=tej.Float8CurrentScaling()):
        got = jax.jit(jax.grad(lambda x, k, b: loss(tej.grouped_dense(x, k, gs, b)), argnums=(0, 1, 2)))(*args)
    plain = jax.jit(jax.grad(lambda x, k, b: loss(tej.grouped_dense(x, k, gs, b)), argnums=(0, 1, 2)))(*args)
    # E4M3 operands forward, E5M2 dy in dgrad: within the FP8 tolerance of the unquantized layer's gradients.
    for name, g, w, tol in zip(("dx", "dkernel", "dbias"), got, plain, (0.25, 0.25, 0.25)):
        w = np.asarray(w, np.float64)
        err = np.max(np.abs(np.asarray(g, np.float64) - w)) / np.max(np.abs(w))
        assert err < tol, f"{name}: {err}"
        assert err > 0 or name == "dbias", f"{name}: FP8 gives exactly the bf16 result: not quantized?"


def test_errors():
    x, k = jnp.ones((8, 32)), jnp.ones((2, 32, 16))
    with pytest.raises(ValueError, match=r"same K"):
        tej.grouped_dense(x, jnp.ones((2, 30, 16)), jnp.ones(2, jnp.int32))
    with pytest.raises(ValueError, match=r"bias must be \[G, N\]"):
        tej.grouped_dense(x, k, jnp.ones(2, jnp.int32), jnp.ones(16))
    with pytest.raises(ValueError, match=r"group_sizes must be an integer \[G\]"):
        tej.grouped_dense(x, k, jnp.ones(3, jnp.int32))
    with pytest.raises(ValueError, match="state the caller carries"):
        with tej.autocast(recipe=tej.DelayedScaling()):
            tej.grouped_dense(x, k, jnp.ones(2, jnp.int32))


def test_delayed_scaling_carries_the_amaxes():
    """Delayed scaling: the casts use the set's scales; the set's cotangent carries the observed amaxes (x's, the
    largest expert kernel's, dy's), which tej.update_quantizer_set rolls into the next step's scales."""
    x, k, b = data(jnp.bfloat16)
    gs = jnp.asarray(SIZES, jnp.int32)
    args = [jnp.asarray(v, jnp.bfloat16) for v in (x, k, b)]
    qs = tej.make_quantizer_set(tej.DelayedScaling())
    f = lambda x, k, b, qs: loss(tej.grouped_dense(x, k, gs, b, quantizer_set=qs))  # noqa: E731
    dx, dk, db, dqs = jax.jit(jax.grad(f, argnums=(0, 1, 2, 3)))(*args, qs)
    plain = jax.grad(lambda x, k, b: loss(tej.grouped_dense(x, k, gs, b)), argnums=(0, 1, 2))(*args)
    for name, g, w in zip(("dx", "dkernel", "dbias"), (dx, dk, db), plain):
        w = np.asarray(w, np.float64)
        err = np.max(np.abs(np.asarray(g, np.float64) - w)) / np.max(np.abs(w))
        assert err < 0.25, f"{name}: {err}"
    assert float(dqs.x.amax_history[0]) == float(jnp.max(jnp.abs(args[0].astype(jnp.float32))))
    assert float(dqs.kernel.amax_history[0]) == float(jnp.max(jnp.abs(args[1].astype(jnp.float32))))
    assert float(dqs.dgrad.amax_history[0]) > 0
    nxt = tej.update_quantizer_set(qs, dqs)
    assert float(nxt.x.scale[0]) != float(qs.x.scale[0]), "the next step's scale follows the observed amax"


@pytest.mark.parametrize("recipe", [tej.MXFP8BlockScaling(), tej.Float8BlockScaling()], ids=["mxfp8", "fp8_block"])
def test_emulated_recipes(recipe):
    """MXFP8 / FP8 block: forward and gradients through the emulated grouped GEMMs, within the FP8 tolerance of the
    unquantized layer, and not equal to it (the operands were quantized)."""
    rng = np.random.default_rng(3)
    x, k = (jnp.asarray(rng.uniform(-1, 1, s), jnp.bfloat16) for s in ((128, 64), (2, 64, 32)))
    gs = jnp.asarray([64, 48], jnp.int32)
    f = lambda x, k: loss(tej.grouped_dense(x, k, gs))  # noqa: E731
    plain = jax.grad(f, argnums=(0, 1))(x, k)
    with tej.autocast(recipe=recipe):
        got = jax.jit(jax.grad(f, argnums=(0, 1)))(x, k)
    for name, g, w in zip(("dx", "dkernel"), got, plain):
        w = np.asarray(w, np.float64)
        err = np.max(np.abs(np.asarray(g, np.float64) - w)) / np.max(np.abs(w))
        assert 0 < err < 0.25, f"{name}: {err}"
