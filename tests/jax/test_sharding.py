"""Sharded inputs on an 8-device CPU mesh: the plain activations run on each device's shard (no all-gather of x in
the compiled HLO) and give the unsharded call's bytes. Runs in a subprocess: the device count is fixed when jax
starts."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")

SCRIPT = r"""
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import transformer_engine_jax as tej

assert len(jax.devices()) == 8
bits = lambda a: np.asarray(a).view(np.uint8).tobytes()
x = (jax.random.normal(jax.random.PRNGKey(0), (16, 32, 2, 64), jnp.float32) * 3).astype(jnp.bfloat16)
dz = jax.random.normal(jax.random.PRNGKey(1), (16, 32, 64), jnp.bfloat16)
x1 = x[:, :, :1, :]
for shape, spec in (((8,), P("dp")), ((4, 2), P("dp", "sp"))):
    mesh = Mesh(np.array(jax.devices()).reshape(shape), ("dp", "sp")[:len(shape)])
    put = lambda a, tail: jax.device_put(a, NamedSharding(mesh, P(*spec, *(None,) * tail)))
    xs, dzs, x1s = put(x, 2), put(dz, 1), put(x1, 2)
    fwd = jax.jit(lambda x: tej.act_lu(x, ("silu", "linear")))
    bwd = jax.jit(lambda dz, x: tej.dact_lu(dz, x, ("gelu",)))
    grad = jax.jit(jax.grad(lambda x: jnp.sum(tej.activation(x, "swiglu").astype(jnp.float32))))
    for name, f, args, want in (("act_lu", fwd, (xs,), tej.act_lu(x, "swiglu")),
                                ("dact_lu", bwd, (dzs, x1s), tej.dact_lu(dz, x1, "gelu")),
                                ("grad", grad, (xs,), jax.grad(lambda x: jnp.sum(
                                    tej.activation(x, "swiglu").astype(jnp.float32)))(x))):
        got = f(*args)
        hlo = f.lower(*args).compile().as_text()
        assert bits(got) == bits(want), (name, shape)
        assert "all-gather" not in hlo, (name, shape, "an all-gather in the compiled program")
        assert tuple(got.sharding.spec)[:len(spec)] == tuple(spec), (name, shape, got.sharding)
# the check would see a gather: a quantizing call is not partitioned yet, so XLA gathers x for it
q = tej.QuantizerFactory.create(scaling_mode=tej.ScalingMode.CURRENT_TENSOR_SCALING)
mesh = Mesh(np.array(jax.devices()), ("dp",))
xs = jax.device_put(x, NamedSharding(mesh, P("dp", None, None, None)))
quantized = jax.jit(lambda x: tej.act_lu(x, "swiglu", q).data)
assert "all-gather" in quantized.lower(xs).compile().as_text()
print("ok")
"""


def test_plain_activations_shard_without_all_gather():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.strip().endswith("ok")
