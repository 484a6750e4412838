"""tej.gemm and tej.dense under jax.jit with NamedSharding on an 8-device CPU mesh, (8,) and (4, 2): data-parallel
(lhs sharded along its rows) and column-parallel (rhs sharded along N) calls give the unsharded call's bytes with no
collective; row-parallel (both operands sharded along K) adds FP32 partial products with exactly one all-reduce and no
all-gather (FP8: plus one 1-element amax all-reduce per quantized operand; x is quantized along its K shards) (a bias added once after it), so it equals the unsharded call to FP32 accumulation tolerance (another
addition order), not bit for bit; GELU, which does not compose with K shards, falls back and is still right. FP8
per tensor (current, delayed) data parallel and row parallel; NVFP4 replicated (block scales); grad of tej.dense with data-parallel x and with a
column-parallel kernel (its dgrad / wgrad become row-parallel GEMMs). Runs in a subprocess: the device count is fixed
when jax starts."""
import pytest

pytest.importorskip("jax")

SCRIPT = r"""
import dataclasses, re
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import transformer_engine_jax as tej

SM = tej.ScalingMode
assert len(jax.devices()) == 8
leaves = lambda t: [np.asarray(a).view(np.uint8).tobytes() for a in jax.tree_util.tree_leaves(t)]
normal = lambda key, shape, dtype=jnp.bfloat16: (jax.random.normal(jax.random.PRNGKey(key), shape) * 3).astype(dtype)
collectives = lambda text, op: len(re.findall(r"= [^=]*? " + op + r"(-start)?\(", text))
x, w, wt = normal(0, (16, 8, 64)), normal(1, (64, 32)), normal(2, (32, 64))
x32, w32 = x.astype(jnp.float32), w.astype(jnp.float32)
bias = normal(3, (32,))
xk, wk = normal(4, (16, 8, 128)), normal(5, (128, 32))    # local K = 16 on 8 shards: FP8's alignment
cs = tej.QuantizerFactory.create(scaling_mode=SM.CURRENT_TENSOR_SCALING)
nv = tej.QuantizerFactory.create(scaling_mode=SM.NVFP4_1D_SCALING)
delayed = dataclasses.replace(tej.QuantizerFactory.create(scaling_mode=SM.DELAYED_TENSOR_SCALING, amax_history_len=2),
                              scale=jnp.array([0.375], jnp.float32), amax_history=jnp.array([5.0, 1.0], jnp.float32))
gemm = lambda x, w: tej.gemm(x, w, ((2,), (0,)))
nt = lambda x, w: tej.gemm(x, w, ((2,), (1,)))            # rhs [N, K]: the kernel's transposed layout
fp8 = lambda q: lambda x, w: tej.gemm(x, w, ((2,), (0,)), q, q)
with_bias = lambda x, w: tej.gemm(x, w, ((2,), (0,)), bias=bias)
with_gelu = lambda x, w: tej.gemm(x, w, ((2,), (0,)), fuse_gelu=True)
loss = lambda x, w: jnp.sum(tej.dense(x, w).astype(jnp.float32) ** 2)
dense_grad = jax.grad(loss, argnums=(0, 1))


def run(mesh, f, args, specs):
    sharded = tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, specs))
    compiled = jax.jit(f).lower(*sharded).compile()
    return compiled(*sharded), f(*args), compiled.as_text()


for shape in ((8,), (4, 2)):
    mesh = Mesh(np.array(jax.devices()).reshape(shape), ("dp", "tp")[:len(shape)])
    axes = mesh.axis_names
    rows, all_ = P(axes), P(None, axes)  # x's batch dim over all mesh axes; w's N over all of them
    exact = (  # name, function, arguments, their specs
        ("data parallel", gemm, (x, w), (rows, P())),
        ("data parallel fp32 NT", nt, (x32, wt.astype(jnp.float32)), (rows, P())),
        ("column parallel", gemm, (x, w), (P(), all_)),
        ("column parallel NT", nt, (x, wt), (P(), P(axes))),
        ("data parallel bias", with_bias, (x, w), (rows, P())),
        ("column parallel gelu", with_gelu, (x, w), (P(), all_)),
        ("data parallel fp8 current", fp8(cs), (x, w), (rows, P())),
        ("data parallel fp8 delayed", fp8(delayed), (x, w), (rows, P())),
    ) + ((("data + column parallel", gemm, (x, w), (P("dp"), P(None, "tp"))),
          ("batch and sequence parallel", gemm, (x, w), (P("dp", "tp"), P())),
          ("batch and sequence parallel gelu", with_gelu, (x, w), (P("dp", "tp"), P()))) if len(shape) == 2 else ())
    for name, f, args, specs in exact:
        got, want, text = run(mesh, f, args, specs)
        assert leaves(got) == leaves(want), (name, shape)
        assert "all-gather" not in text, (name, shape, "an all-gather in the compiled program")
        if "fp8" not in name:  # (current scaling's amax pmax is the quantizer's, not the GEMM's)
            assert collectives(text, "all-reduce") == 0, (name, shape)
        assert not jax.tree_util.tree_leaves(got)[0].sharding.is_fully_replicated, (name, shape)

    k_sharded = (P(None, None, axes), P(axes, None))
    for name, f, args, tol, b in (("row parallel fp32", gemm, (x32, w32), 1e-5, 0),
                                  ("row parallel bf16", gemm, (x, w), 2 ** -7, 0),
                                  ("row parallel bias", with_bias, (x, w), 2 ** -7, bias),
                                  ("row parallel fp8 current", fp8(cs), (xk, wk), 2 ** -7, 0)):
        got, want, text = run(mesh, f, args, k_sharded)
        gathered, reductions = re.findall(r"\[(\d+(?:,\d+)*)\]\S* all-gather", text), 1
        if "fp8" in name:  # against the product of the dequantized operands. x (sharded along K) and the kernel are
            # each quantized per shard with a pmaxed amax (two 1-element all-reduces, which XLA may combine into
            # one), no gather
            args = (tej.quantize(args[0], cs).dequantize(), tej.quantize(args[1], cs).dequantize())
            reductions = (2, 3)
        ref = np.einsum("bsk,kn->bsn", *(np.asarray(a, np.float64) for a in args)) + np.asarray(b, np.float64)
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        scale = np.abs(ref).max()
        assert np.abs(got - want).max() <= tol * scale, (name, shape, np.abs(got - want).max())
        assert np.abs(got - ref).max() <= tol * scale, (name, shape)
        assert not np.abs(-got - ref).max() <= tol * scale, name  # the check can fail
        count = collectives(text, "all-reduce") + collectives(text, "reduce-scatter")
        assert count in (reductions if isinstance(reductions, tuple) else (reductions,)), (name, shape, count)
        assert not gathered and "all-gather" not in text, (name, shape)

    # GELU does not compose with a sum over K shards: resharded, still the unsharded bytes
    got, want, _ = run(mesh, with_gelu, (x, w), k_sharded)
    assert leaves(got) == leaves(want), shape

    # NVFP4 (its copies' global amaxes an extra replicated input): block scales tile the operands, so the call runs
    # replicated whatever the shardings: the unsharded bytes
    got, want, _ = run(mesh, fp8(nv), (x, w), (rows, P(None, axes)))
    assert leaves(got) == leaves(want), ("nvfp4", shape)

    # grad of tej.dense, data parallel: dx has the unsharded bytes; dw (xᵀ·dy, contracted over the sharded rows)
    # is a row-parallel GEMM: one all-reduce, FP32 accumulation tolerance
    (dx, dw), (dx0, dw0), text = run(mesh, dense_grad, (x, w), (rows, P()))
    assert leaves(dx) == leaves(dx0), shape
    dw, dw0 = np.asarray(dw, np.float64), np.asarray(dw0, np.float64)
    assert np.abs(dw - dw0).max() <= 2 ** -7 * np.abs(dw0).max(), shape
    assert "all-gather" not in text, shape

    # grad of tej.dense, column-parallel kernel: wgrad is column parallel (bytes), dgrad (dy·kernelᵀ, contracted over
    # the sharded N) row parallel: FP32 accumulation tolerance
    (dx, dw), (dx0, dw0), text = run(mesh, dense_grad, (x, w), (P(), all_))
    assert leaves(dw) == leaves(dw0), shape
    dx, dx0 = np.asarray(dx, np.float64), np.asarray(dx0, np.float64)
    assert np.abs(dx - dx0).max() <= 2 ** -7 * np.abs(dx0).max(), shape
    assert "all-gather" not in text, shape
print("ok")
"""


def test_sharded_gemm_matches_unsharded(run_on_cpu_mesh):
    run_on_cpu_mesh(SCRIPT)
