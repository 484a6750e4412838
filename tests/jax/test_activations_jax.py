"""tej activations, forward, backward and jax.grad, against the one float64 oracle (tests/ref, reached through
DLPack): every activation, float32/bfloat16/float16, the shapes of the torch suite in JAX's [..., A, K] layout."""
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

import transformer_engine_jax as tej  # noqa: E402
from tests import ref  # noqa: E402

DTYPES = {"float32": (jnp.float32, torch.float32), "bfloat16": (jnp.bfloat16, torch.bfloat16),
          "float16": (jnp.float16, torch.float16)}
# (leading dims, K): x is [*lead, A, K] with A = 2 for gated activations.
SHAPES = [((), 37), ((2,), 13), ((257,), 259)]
BIG = ((16, 128), 256)


def make(name, lead, k, jdtype, seed):
    a = 2 if name in ref.GATED else 1
    x = jax.random.uniform(jax.random.PRNGKey(seed), (*lead, a, k), jnp.float32, -4.0, 4.0).astype(jdtype)
    dz = jax.random.uniform(jax.random.PRNGKey(seed + 1), (*lead, k), jnp.float32, -2.0, 2.0).astype(jdtype)
    return x, dz


def core_view(x):
    """[..., A, K] -> the torch layout [..., A*K] the oracle takes (the same memory)."""
    t = ref.as_torch(x)
    return t.reshape(*t.shape[:-2], t.shape[-2] * t.shape[-1])


def cases():
    for name in ref.ACT_NAMES:
        for dt in DTYPES:
            for lead, k in SHAPES:
                yield name, dt, lead, k
    for name in ("gelu", "swiglu"):
        yield name, "bfloat16", *BIG


@pytest.mark.parametrize("name,dt,lead,k", list(cases()))
def test_forward_backward_grad_vs_float64(name, dt, lead, k):
    jdtype, tdtype = DTYPES[dt]
    x, dz = make(name, lead, k, jdtype, len(lead) + k)
    what = f"{name} {dt} {tuple(x.shape)}"
    y = tej.act_lu(x, name)
    assert y.dtype == jdtype and y.shape == (*lead, k)
    ref.assert_close_tol(ref.as_torch(y), ref.act_ref(name, core_view(x)), tdtype, what)
    dx = tej.dact_lu(dz, x, name)
    want_dx = ref.dact_ref(name, ref.as_torch(dz), core_view(x)).reshape(x.shape)
    assert dx.dtype == jdtype and dx.shape == x.shape
    ref.assert_close_tol(ref.as_torch(dx), want_dx, tdtype, "d" + what)
    # jax.grad through the custom_vjp: the cotangent of sum(y * dz) is dz
    g = jax.grad(lambda x: jnp.sum(tej.activation(x, name).astype(jnp.float32) * dz.astype(jnp.float32)))(x)
    ref.assert_close_tol(ref.as_torch(g), want_dx, tdtype, "grad " + what)
    # the comparison would catch a wrong sign
    assert not ref.within_tol(ref.as_torch(y), ref.act_ref(name, -core_view(x)), *ref.TOL[tdtype])
