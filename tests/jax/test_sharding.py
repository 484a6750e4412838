"""Sharded inputs on an 8-device CPU mesh: the plain and the quantizing calls run on each device's shard (no
all-gather in the compiled HLO) and give the unsharded call's bytes in every result (data, colwise data, scale_inv,
colwise scale_inv, amaxes); dbias, summed over the shards in FP32 and rounded once, is checked against a float64
reference with SPEC §9's dbias tolerance (another addition order than the unsharded kernel's, so not bit for bit).
Per-tensor quantize also shards along x's last dim (a row-parallel layer's K); plain and per-tensor activations,
their backward and dbias do too (a column-parallel layer's hidden features, gated halves sharded alike), dbias summed
over the token shards only and left sharded along K. A block-format call whose rows are not whole groups of 128 falls
back (XLA gathers x) with the same bytes. Runs in a subprocess: the device count is fixed when jax starts."""
import pytest

pytest.importorskip("jax")

SCRIPT = r"""
import dataclasses
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import transformer_engine_jax as tej

SM = tej.ScalingMode
assert len(jax.devices()) == 8
leaves = lambda t: [np.asarray(a).view(np.uint8).tobytes() for a in jax.tree_util.tree_leaves(t)]
normal = lambda key, shape: (jax.random.normal(jax.random.PRNGKey(key), shape, jnp.float32) * 3).astype(jnp.bfloat16)
x, dz = normal(0, (16, 32, 2, 64)), normal(1, (16, 32, 64))
x1 = x[:, :, :1, :]
big = normal(2, (64, 16, 2, 64))   # 1024 rows: whole groups of 128 on every device
odd = normal(3, (24, 4, 2, 64))    # 96 rows: not a whole group, so block formats fall back
quantizer = lambda mode, **kw: tej.QuantizerFactory.create(scaling_mode=mode, **kw)
cs, mx, nv = quantizer(SM.CURRENT_TENSOR_SCALING), quantizer(SM.MXFP8_1D_SCALING), quantizer(SM.NVFP4_1D_SCALING)
delayed = dataclasses.replace(quantizer(SM.DELAYED_TENSOR_SCALING, amax_history_len=2),
                              scale=jnp.array([0.375], jnp.float32), amax_history=jnp.array([5.0, 1.0], jnp.float32))
swiglu = lambda q: lambda x: tej.act_lu(x, ("silu", "linear"), q)
gelu = lambda q: lambda x: tej.act_lu(x, "gelu", q)
dbias = lambda q: lambda dz, x: tej.quantize_dact_dbias(dz, x, "gelu", True, q)
cases = (  # name, function, arguments, a block format (its rows sharded as one dim on the (4, 2) mesh)
    ("plain act_lu", swiglu(None), (x,), False),
    ("plain dact_lu", lambda dz, x: tej.dact_lu(dz, x, "gelu"), (dz, x1), False),
    ("plain grad", jax.grad(lambda x: jnp.sum(tej.activation(x, "swiglu").astype(jnp.float32))), (x,), False),
    ("current swiglu", swiglu(cs), (x,), False),
    ("current gelu", gelu(cs), (x1,), False),
    ("delayed swiglu", swiglu(delayed), (x,), False),
    ("current quantize", lambda x: tej.quantize(x, cs), (dz,), False),
    ("current dact dbias", dbias(cs), (dz, x1), False),
    ("nvfp4 gelu", gelu(nv), (big[:, :, :1],), True),
    ("mxfp8 swiglu", swiglu(mx), (big,), True),
    ("mxfp8 dact dbias", dbias(mx), (big[:, :, 0], big[:, :, 1:]), True),
)


def check_dbias(name, got, args, values=None):  # against float64 sums of the FP32 act'(x) * dz (or of `values`), SPEC
    # §9's bf16 dbias tolerance
    if values is None:
        values = tej.dact_lu(*(a.astype(jnp.float32) for a in args), "gelu")
    ref = np.asarray(values, np.float64).reshape(-1, values.shape[-1]).sum(axis=0)
    got = np.asarray(got, np.float64)
    tolerance = 1e-5 + 4 * 1.6e-2 * np.abs(ref)
    assert (np.abs(got - ref) <= tolerance).all(), (name, got[:4], ref[:4])
    assert not (np.abs(-got - ref) <= tolerance).all(), name  # the check can fail


for shape in ((8,), (4, 2)):
    mesh = Mesh(np.array(jax.devices()).reshape(shape), ("dp", "sp")[:len(shape)])
    for name, f, args, block in cases:
        spec = P(("dp", "sp")) if block and len(shape) == 2 else P(*mesh.axis_names)
        put = lambda a: jax.device_put(a, NamedSharding(mesh, P(*spec, *(None,) * (a.ndim - len(spec)))))
        sharded = tuple(put(a) for a in args)
        compiled = jax.jit(f).lower(*sharded).compile()
        got, want = compiled(*sharded), f(*args)
        if "dbias" in name:  # (dx, dbias)
            check_dbias(name, got[1], args)
            got, want = got[0], want[0]
        assert leaves(got) == leaves(want), (name, shape)
        assert "all-gather" not in compiled.as_text(), (name, shape, "an all-gather in the compiled program")
        assert not jax.tree_util.tree_leaves(got)[0].sharding.is_fully_replicated, (name, shape)

# per-tensor quantize along every dim of x, its last (K) included: each shard cast with the pmaxed amax, the colwise
# copy sharded transposed; the unsharded bytes, no all-gather
kx = normal(4, (64, 128))
for shape, spec in (((8,), P(None, "dp")), ((4, 2), P("dp", "sp")), ((4, 2), P("sp", "dp"))):
    mesh = Mesh(np.array(jax.devices()).reshape(shape), ("dp", "sp")[:len(shape)])
    for qname, q in (("current", cs), ("delayed", delayed)):
        sharded = jax.device_put(kx, NamedSharding(mesh, spec))
        compiled = jax.jit(lambda x: tej.quantize(x, q)).lower(sharded).compile()
        got = compiled(sharded)
        assert leaves(got) == leaves(tej.quantize(kx, q)), (qname, shape, spec)
        assert "all-gather" not in compiled.as_text(), (qname, shape, spec)
        col = tuple(got.colwise_data.sharding.spec) + (None, None)
        assert col[:2] == (spec[1], spec[0]), (qname, got.colwise_data.sharding.spec)

# x's last dim K (a column-parallel layer's hidden features) sharded, alone or under sharded tokens: plain and
# per-tensor calls run on each device's block (amaxes pmaxed over every axis, dbias summed over the token axes only,
# left sharded along K: the unsharded bytes when the tokens are whole), gated ones with their two halves sharded
# alike; the unsharded bytes and no all-gather
feature_cases = (
    ("plain swiglu", swiglu(None), (x,)),
    ("current swiglu", swiglu(cs), (x,)),
    ("delayed gelu", gelu(delayed), (x1,)),
    ("plain dswiglu", lambda dz, x: tej.dact_lu(dz, x, "swiglu"), (dz, x)),
    ("current dswiglu", lambda dz, x: tej.dact_lu(dz, x, "swiglu", cs), (dz, x)),
    ("current dact dbias", dbias(cs), (dz, x1)),
    ("current quantize dbias", lambda dz: tej.quantize_dbias(dz, cs), (dz,)),
)
for shape, (t0, t1, k) in (((8,), (None, None, "dp")), ((4, 2), ("dp", None, "sp"))):
    mesh = Mesh(np.array(jax.devices()).reshape(shape), ("dp", "sp")[:len(shape)])
    for name, f, args in feature_cases:
        put = lambda a: jax.device_put(a, NamedSharding(mesh, P(t0, t1, *(None,) * (a.ndim - 3), k)))
        sharded = tuple(put(a) for a in args)
        compiled = jax.jit(f).lower(*sharded).compile()
        got, want = compiled(*sharded), f(*args)
        if "dbias" in name:  # (dx, dbias)
            assert tuple(got[1].sharding.spec) == (k,), (name, shape, got[1].sharding.spec)
            if t0 is None:  # every row on each device: its columns' sums, the unsharded bytes
                assert leaves(got[1]) == leaves(want[1]), (name, shape)
            else:
                check_dbias(name, got[1], args, None if "dact" in name else args[0].astype(jnp.float32))
            got, want = got[0], want[0]
        assert leaves(got) == leaves(want), (name, shape)
        assert "all-gather" not in compiled.as_text(), (name, shape, "an all-gather in the compiled program")
        data = jax.tree_util.tree_leaves(got)[0]
        assert tuple(data.sharding.spec)[-1] == k and tuple(data.sharding.spec)[0] == t0, (name, data.sharding.spec)

# fallback: MXFP8 of 96 rows (scale rows padded to 128) is not partitioned: XLA gathers x, the bytes are unchanged
mesh = Mesh(np.array(jax.devices()), ("dp",))
odd_sharded = jax.device_put(odd, NamedSharding(mesh, P("dp")))
fallback = jax.jit(swiglu(mx)).lower(odd_sharded).compile()
assert leaves(fallback(odd_sharded)) == leaves(swiglu(mx)(odd))
assert "all-gather" in fallback.as_text()
print("ok")
"""


def test_sharded_calls_run_per_shard_with_unsharded_bytes(run_on_cpu_mesh):
    run_on_cpu_mesh(SCRIPT)
