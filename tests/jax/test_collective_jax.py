"""The pure-JAX collective GEMM (transformer_engine_jax/collective.py) on the 8-device CPU mesh: the ring
all-gather + GEMM equals the unsharded tej.gemm bit for bit (bf16, and FP8 current scaling whose codes travel the
ring), the ring GEMM + reduce-scatter equals it within FP32 accumulation; the compiled programs move data with
collective-permutes only (no all-gather, all-reduce or reduce-scatter).

Tensor + sequence parallel through tej.gemm's partitioning (gemm.py's sharding block) on a ("tp",) and a
("dp", "tp") mesh, x [B, S, H] sharded along S on tp (and B on dp), bf16 and FP8 current scaling, forward and
backward (jax.vjp) against the unsharded call: a column-parallel tej.dense runs the all-gather ring (bytes equal) and
its dgrad the reduce-scatter ring (FP32-sum tolerance); a row-parallel one with sequence_parallel=True the
reduce-scatter ring (tolerance, and against float64) and its dgrad the all-gather ring (bytes equal); tej.mlp (fc1
column, fc2 row, gelu) likewise (and against float64), its fused activation and backward run on h [B, S, F] sharded
along F; the compiled programs hold the rings' collective-permutes and gather no weight, nor anything along F (only
token dims, for the wgrads). Also: a
mesh axis of size 1 (no collective), MXFP8 (no ring, the same values), a token count the ring cannot split (a clear
error), and tej.flax.Dense with sequence_parallel=True."""
import pytest

pytest.importorskip("jax")

SCRIPT = r"""
import re
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh
import transformer_engine_jax as tej
from transformer_engine_jax import collective as C

rng = np.random.default_rng(0)
x = jnp.asarray(rng.uniform(-2, 2, (64, 128)), jnp.bfloat16)
w = jnp.asarray(rng.uniform(-2, 2, (128, 128)), jnp.bfloat16)  # N per rank >= 16 (FP8 rule)
q = lambda: tej.QuantizerFactory.create(scaling_mode=tej.ScalingMode.CURRENT_TENSOR_SCALING,
                                        q_dtype=jnp.float8_e4m3fn, q_layout=tej.QuantizeLayout.ROWWISE)
devices = np.array(jax.devices())
meshes = [(Mesh(devices, ("tp",)), "tp"), (Mesh(devices.reshape(2, 4), ("dp", "tp")), "tp")]

def only_permutes(f, *args):
    hlo = jax.jit(f).lower(*args).compile().as_text()
    assert "collective-permute" in hlo
    for op in ("all-gather", "all-reduce", "reduce-scatter", "all-to-all"):
        assert re.search(r"\b" + op + r"(-start)?\(", hlo) is None, op

def same(a, b, what):
    assert np.asarray(a).view(np.uint8).tobytes() == np.asarray(b).view(np.uint8).tobytes(), what

for mesh, axis in meshes:
    tp = mesh.shape[axis]
    ag = lambda x, w: C.all_gather_gemm_sharded(x, w, mesh, axis)
    same(jax.jit(ag)(x, w), tej.gemm(x, w, ((1,), (1,))), f"AG bf16 tp={tp}")
    only_permutes(ag, x, w)
    ag8 = lambda x, w: C.all_gather_gemm_sharded(x, w, mesh, axis, x_quantizer=q(), w_quantizer=q())
    want8 = tej.gemm(tej.quantize(x, q()), tej.quantize(w, q()), ((1,), (1,)))
    same(jax.jit(ag8)(x, w), want8, f"AG FP8 tp={tp}")
    rs = lambda x, w: C.gemm_reduce_scatter_sharded(x, w, mesh, axis)
    got = np.asarray(jax.jit(rs)(x, w), np.float64)
    want = np.asarray(tej.gemm(x, w, ((1,), (1,)), out_dtype=jnp.float32), np.float64)
    # FP32 partial sums added in ring order, then one rounding to bf16: within bf16's half ulp plus FP32 sums' error.
    assert np.all(np.abs(got - want) <= 2.0 ** -8 * np.abs(want) + 1e-3), f"RS tp={tp}"
    assert not np.allclose(got, np.asarray(tej.gemm(x[::-1], w, ((1,), (1,))), np.float64)), "a wrong answer passes"
    only_permutes(rs, x, w)
print("ok")
"""


def test_ring_collective_gemm_on_cpu_mesh(run_on_cpu_mesh):
    run_on_cpu_mesh(SCRIPT)


TP_SCRIPT = r"""
import re
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import transformer_engine_jax as tej

F64 = np.float64
B, S, H, F = 2, 48, 64, 128     # tokens 96 (sharded tp and dp x tp); weights [64, 128], [128, 64]: no activation has
rng = np.random.default_rng(0)  # a weight's shape, so a gathered weight shows in the HLO
rand = lambda shape, s=1.0: jnp.asarray(rng.uniform(-2, 2, shape) * s, jnp.bfloat16)
x, g1, g2 = rand((B, S, H)), rand((B, S, F)), rand((B, S, H))
w1, w2, b1, b2 = rand((H, F), 0.25), rand((F, H), 0.25), rand((F,)), rand((H,))
h = rand((B, S, F))
cs = lambda: tej.make_quantizer_set(tej.Float8CurrentScaling())
bits = lambda a: np.asarray(a).view(np.uint8).tobytes()
gathers = lambda text: re.findall(r"= \w+\[([\d,]*)\]\S* all-gather(?:-start)?\(", text)
permutes = lambda text: len(re.findall(r"= [^=]*? collective-permute(?:-start)?\(", text))


def close(got, want, what, rel=2.0 ** -7):
    '''Within FP32-sum-then-bf16 rounding of the unsharded result (scaled by its largest value), and a wrong answer
    (the negation) would fail.'''
    got, want = np.asarray(got, F64), np.asarray(want, F64)
    tol = rel * np.abs(want).max()
    assert np.abs(got - want).max() <= tol, (what, np.abs(got - want).max(), tol)
    assert np.abs(-got - want).max() > tol, what


def only_rings(text, what, rings):
    '''`rings` rings of collective-permutes over tp, and no weight gathered: every all-gather has a token dim (the
    activation a wgrad reads, gathered over tp where its other operand holds all tokens).'''
    shapes = [[int(d) for d in shape.split(",")] for shape in gathers(text)]
    assert all(S in dims or B * S in dims for dims in shapes), (what, "gathered", shapes)  # (B * S / dp = S)
    assert permutes(text) == rings * (MESH.shape["tp"] - 1), (what, permutes(text))


def vjp(layer):
    '''jit(x, w, b, cotangent -> (y, dx, dw, db)) of layer(x, w, b).'''
    def f(x, w, b, g):
        y, back = jax.vjp(layer, x, w, b)
        return (y,) + back(g)
    return f


def put(a, *spec):
    return jax.device_put(a, NamedSharding(MESH, P(*spec)))


def compile_sharded(f, args, out_specs):
    '''f jitted on the sharded args, its results sharded as a training step's consumers take them (a reduce-scatter
    ring's output stays sharded where its consumer takes it so; unconstrained, XLA gathers it after the call).'''
    outs = tuple(NamedSharding(MESH, P(*s)) for s in out_specs)
    return jax.jit(f, out_shardings=outs).lower(*args).compile()


devices = np.array(jax.devices())
for MESH in (Mesh(devices, ("tp",)), Mesh(devices.reshape(2, 4), ("dp", "tp"))):
    dp = "dp" if "dp" in MESH.axis_names else None
    tokens = (dp, "tp", None)  # x [B, S, H]: batch on dp, sequence on tp
    for recipe in (None, "current"):
        qs = cs if recipe else (lambda: tej.QuantizerSet())
        tag = f"{MESH.axis_names} {recipe}"
        col = lambda x, w, b: tej.dense(x, w, b, quantizer_set=qs(), sequence_parallel=True)
        row = lambda x, w, b: tej.dense(x, w, b, quantizer_set=qs(), sequence_parallel=True)
        # column parallel, sequence-parallel x: fprop = the all-gather ring (bytes), dgrad = the reduce-scatter ring
        args = (put(x, *tokens), put(w1, None, "tp"), put(b1, "tp"), put(g1, dp, None, "tp"))
        compiled = compile_sharded(vjp(col), args, ((dp, None, "tp"), tokens, (None, "tp"), ("tp",)))
        got, want = compiled(*args), jax.jit(vjp(col))(x, w1, b1, g1)
        assert bits(got[0]) == bits(want[0]), (tag, "column fprop")
        close(got[1], want[1], (tag, "column dx"))
        for i, what in ((2, "dw1"), (3, "db1")):
            if dp:  # summed over dp in FP32
                close(got[i], want[i], (tag, what))
            else:  # one GEMM over all tokens: the unsharded bytes
                assert bits(got[i]) == bits(want[i]), (tag, what)
        only_rings(compiled.as_text(), (tag, "column"), 2)
        # row parallel: fprop = the reduce-scatter ring (vs float64 too), dgrad = the all-gather ring (bytes)
        args = (put(h, dp, None, "tp"), put(w2, "tp", None), put(b2), put(g2, *tokens))
        compiled = compile_sharded(vjp(row), args, (tokens, (dp, None, "tp"), ("tp", None), ()))
        got, want = compiled(*args), jax.jit(vjp(row))(h, w2, b2, g2)
        close(got[0], want[0], (tag, "row fprop"))
        ops = (h, w2) if recipe is None else tuple(tej.quantize(a, tej.make_quantizer_set(
            tej.Float8CurrentScaling()).x).dequantize() for a in (h, w2))
        ref = np.einsum("bsf,fh->bsh", *(np.asarray(a, F64) for a in ops)) + np.asarray(b2, F64)
        close(got[0], ref, (tag, "row fprop vs float64"), 2.0 ** -8)
        assert bits(got[1]) == bits(want[1]), (tag, "row dgrad")
        close(got[2], want[2], (tag, "dw2"))
        only_rings(compiled.as_text(), (tag, "row"), 2)
    # tej.mlp (gelu): fc1 column, fc2 row; four rings, forward and backward; y and dx sharded like x; h stays sharded
    # along F through the fused activation and its backward (dbias summed over the tokens, sharded along F)
    hf = np.asarray(x, F64) @ np.asarray(w1, F64) + np.asarray(b1, F64)
    gelu64 = 0.5 * hf * (1 + np.tanh(np.sqrt(2 / np.pi) * (hf + 0.044715 * hf ** 3)))
    y64 = gelu64 @ np.asarray(w2, F64) + np.asarray(b2, F64)
    for recipe in (None, "current"):
        qs = (cs(), cs()) if recipe else (tej.QuantizerSet(), tej.QuantizerSet())
        tag = f"{MESH.axis_names} mlp {recipe}"

        def mlp_vjp(x, w1, b1, w2, b2, g):
            y, back = jax.vjp(lambda *p: tej.mlp(*p, quantizer_sets=qs, sequence_parallel=True), x, w1, b1, w2, b2)
            return (y,) + back(g)

        args = (put(x, *tokens), put(w1, None, "tp"), put(b1, "tp"), put(w2, "tp", None), put(b2), put(g2, *tokens))
        compiled = compile_sharded(mlp_vjp, args, (tokens, tokens, (None, "tp"), ("tp",), ("tp", None), ()))
        got, want = compiled(*args), jax.jit(mlp_vjp)(x, w1, b1, w2, b2, g2)
        # the same math as the unsharded run (every token's sum on one device, elementwise activation): its bytes;
        # reduce-scatter rings and sums over dp: FP32 partial sums added in another order
        exact = () if dp else ("dw1", "db1", "dw2") + (("db2",) if recipe is None else ())
        for name, a, b in zip(("y", "dx", "dw1", "db1", "dw2", "db2"), got, want):
            if name in exact:
                assert bits(a) == bits(b), (tag, name)
            else:
                close(a, b, (tag, name), 2.0 ** -6)  # (through the GELU of a pre-activation rounded to bf16)
        if recipe is None:  # (h and act(h) rounded to bf16)
            close(got[0], y64, (tag, "y vs float64"), 2.0 ** -7)
        text = compiled.as_text()
        only_rings(text, tag, 4)
        assert not [s for s in gathers(text) if str(F) in s.split(",")], (tag, "gathered along F", gathers(text))

# a mesh axis of size 1: rings of one step, no collective-permute, the unsharded bytes
MESH = Mesh(devices.reshape(8, 1), ("dp", "tp"))
layer = lambda x, w, b: tej.dense(x, w, b, sequence_parallel=True)
seq = (None, ("dp", "tp"), None)
for args, outs in (
        ((put(x, *seq), put(w1, None, "tp"), put(b1, "tp"), put(g1, None, "dp", "tp")),
         ((None, "dp", "tp"), seq, (None, "tp"), ("tp",))),
        ((put(h, None, "dp", "tp"), put(w2, "tp", None), put(b2), put(g2, *seq)),
         (seq, (None, "dp", "tp"), ("tp", None), ()))):
    compiled = compile_sharded(vjp(layer), args, outs)
    got, want = compiled(*args), jax.jit(vjp(layer))(*(jax.device_get(a) for a in args))
    assert bits(got[0]) == bits(want[0]) and bits(got[1]) == bits(want[1]), "tp = 1"
    only_rings(compiled.as_text(), "tp = 1", 0)

# MXFP8 (no ring for its GEMMs): sequence_parallel still gives the unsharded values, partitioned by XLA
MESH = Mesh(devices, ("tp",))
mx = lambda x, w, b: tej.dense(x, w, b, quantizer_set=tej.make_quantizer_set(tej.MXFP8BlockScaling()),
                               sequence_parallel=True)
args = (put(h, None, None, "tp"), put(w2, "tp", None), put(b2), put(g2, None, "tp", None))
got, want = jax.jit(vjp(mx))(*args), jax.jit(vjp(mx))(h, w2, b2, g2)
for name, a, b in zip(("y", "dx", "dw", "db"), got, want):
    close(a, b, ("mxfp8", name))

# a token count the ring cannot split: a clear error when the program is compiled
try:
    jax.jit(lambda a, w: tej.dense(a, w, sequence_parallel=True)).lower(put(rand((1, 12, F)), None, None, "tp"),
                                                                        put(w2, "tp", None)).compile()
    raise AssertionError("no error")
except Exception as e:  # XLA's custom-partitioner wrapper carries the ValueError's message
    assert "sequence_parallel" in str(e) and "'tp'" in str(e) and "does not divide 12" in str(e), str(e)[-600:]

# tej.flax: a column + row Dense pair with sequence_parallel=True, its kernels sharded on the tp mesh
from flax import nnx


class Block(nnx.Module):
    def __init__(self, rngs):
        kw = dict(param_dtype=jnp.bfloat16, bias_init=nnx.initializers.normal(1.0), sequence_parallel=True, rngs=rngs)
        self.up, self.down = tej.flax.Dense(H, F, **kw), tej.flax.Dense(F, H, **kw)

    def __call__(self, x):
        return self.down(self.up(x)) + x


def block_grads(model, x):
    graph, state = nnx.split(model)
    loss = lambda state, x: jnp.sum(nnx.merge(graph, state)(x).astype(jnp.float32) ** 2)
    return state, jax.jit(jax.value_and_grad(loss))


sharded, plain = Block(nnx.Rngs(1)), Block(nnx.Rngs(1))
for var, spec in ((sharded.up.kernel, (None, "tp")), (sharded.up.bias, ("tp",)), (sharded.down.kernel, ("tp", None))):
    var.set_value(put(var.get_value(), *spec))
state, step = block_grads(sharded, x)
xs = put(x, None, "tp", None)
compiled = step.lower(state, xs).compile()
(loss, grads), (loss0, grads0) = compiled(state, xs), block_grads(plain, x)[1](nnx.state(plain), x)
close(loss, loss0, "flax loss")
for (path, g), (_, g0) in zip(nnx.to_flat_state(grads), nnx.to_flat_state(grads0)):
    if g.get_value() is not None:  # (fp8_meta: None outside a delayed recipe)
        close(g.get_value(), g0.get_value(), ("flax", path))
only_rings(compiled.as_text(), "flax", 3)  # fprop AG + RS, the row layer's dgrad AG (x is not differentiated)
print("ok")
"""


def test_tensor_sequence_parallel_dense_mlp_flax(run_on_cpu_mesh):
    pytest.importorskip("flax")
    run_on_cpu_mesh(TP_SCRIPT)
