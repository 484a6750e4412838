"""tej.flax.MoEMLP (router-free experts over tej.grouped_dense): per-expert init as nnx.Linear, forward and
gradients against a float64 loop over the experts that applies the group-size rules (an empty expert, a negative
size, rows past the sum, a sum past M_total), nnx.jit with the sizes as a traced argument, a small training run in
bf16, under Float8CurrentScaling and under DelayedScaling (state in FP8Meta, rolled by update_fp8_meta), and the
amaxes that state records."""
import functools
import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402  (a flax dependency)
from flax import nnx  # noqa: E402

import transformer_engine_jax as tej  # noqa: E402
from test_dense_jax import ACTS, F64, GRAD_TOL, OUT_TOL, close_and_not_negated, grad64, rand  # noqa: E402

pytestmark = pytest.mark.usefixtures("jax_on_cpu")

F = tej.flax
BF16 = jnp.bfloat16
HIDDEN, FFN, E, M = 32, 48, 5, 44
SIZES = {"gaps": [10, 0, 25, -2, 3],      # 38 of 44 rows: an empty expert, a negative size, 6 rows past the sum
         "past_end": [12, 20, 0, 30, 7]}  # sums to 69 > 44: expert 3 cut to 12 rows, expert 4 gets none


def arr(v):
    return np.asarray(jnp.asarray(v, jnp.float32), F64)


def moe_ref(act, sizes):
    """float64 loop over the experts: expert e owns the next max(size, 0) rows (cut at M_total); the rest are 0."""
    fn = ACTS[act][1]

    def ref(x, w1, b1, w2, b2):
        out, row = jnp.zeros((x.shape[0], w2.shape[2]), x.dtype), 0
        for e, s in enumerate(sizes):
            s = min(max(s, 0), x.shape[0] - row)
            if s:
                h = (x[row:row + s] @ w1[e] + b1[e]).reshape(s, -1, w2.shape[1])
                out = out.at[row:row + s].set(fn(h) @ w2[e] + b2[e])
            row += s
        return out
    return jax.jit(ref)  # eager float64 grads of the loop take seconds


def _params(m):
    return tuple(v[...] for v in (m.fc1_kernel, m.fc1_bias, m.fc2_kernel, m.fc2_bias))


def test_params_per_expert_like_nnx_linear():
    """Expert e's slice is kernel_init(k_e, (in, out)): fan-in is the slice's in dim, not E·in."""
    m = F.MoEMLP(HIDDEN, FFN, E, activation_type=("silu", "linear"), bias_init=nnx.initializers.normal(1.0),
                 rngs=nnx.Rngs(5))
    assert {k: v.shape for k, v in nnx.state(m, nnx.Param).items()} == {
        "fc1_kernel": (E, HIDDEN, 2 * FFN), "fc1_bias": (E, 2 * FFN), "fc2_kernel": (E, FFN, HIDDEN),
        "fc2_bias": (E, HIDDEN)}
    rngs = nnx.Rngs(5)
    init, bias_init = nnx.initializers.lecun_normal(), nnx.initializers.normal(1.0)
    for name, shape, fn in (("fc1_kernel", (HIDDEN, 2 * FFN), init), ("fc1_bias", (2 * FFN,), bias_init),
                            ("fc2_kernel", (FFN, HIDDEN), init), ("fc2_bias", (HIDDEN,), bias_init)):
        keys = jax.random.split(rngs.params(), E)
        got = arr(getattr(m, name))
        for e in range(E):
            np.testing.assert_array_equal(got[e], arr(fn(keys[e], shape, jnp.float32)), err_msg=f"{name}[{e}]")
        assert not np.array_equal(got[0], got[1])  # each expert its own draw
    for name, fan_in in (("fc1_kernel", HIDDEN), ("fc2_kernel", FFN)):
        std = np.std(arr(getattr(m, name)), axis=(1, 2))
        np.testing.assert_allclose(std, fan_in ** -0.5, rtol=0.15, err_msg=name)
    nobias = F.MoEMLP(HIDDEN, FFN, E, use_bias=False, param_dtype=BF16, rngs=nnx.Rngs(0))
    assert nobias.fc1_bias is None and nobias.fc2_bias is None and nobias.fc1_kernel.dtype == jnp.dtype(BF16)
    assert set(nnx.state(nobias, nnx.Param).keys()) == {"fc1_kernel", "fc2_kernel"}


@pytest.mark.parametrize("sizes", list(SIZES))
@pytest.mark.parametrize("act", ["gelu", "swiglu"])
def test_forward_and_grads_vs_float64(act, sizes):
    """fp32: y and the gradients of x and every parameter vs jax.grad of the float64 loop; experts that own no
    rows get zero gradients, rows past the sum come out zero."""
    sizes = SIZES[sizes]
    m = F.MoEMLP(HIDDEN, FFN, E, activation_type=ACTS[act][0], bias_init=nnx.initializers.normal(1.0),
                 rngs=nnx.Rngs(1))
    x, cot = rand(2, (M, HIDDEN), jnp.float32), rand(3, (M, HIDDEN), jnp.float32)
    gs = jnp.asarray(sizes, jnp.int32)

    def loss(m, x):
        y = m(x, gs)
        return jnp.sum(y * cot), y

    (_, y), (g, dx) = nnx.jit(nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True))(m, x)
    want, wgrads = grad64(moe_ref(act, sizes), (x, *_params(m)), cot)
    close_and_not_negated(y, want, OUT_TOL[jnp.dtype(jnp.float32)], "y")
    covered = min(sum(max(s, 0) for s in sizes), M)
    assert not arr(y)[covered:].any() and arr(y)[:covered].all()
    names = ("dx", "fc1_kernel", "fc1_bias", "fc2_kernel", "fc2_bias")
    for name, got, w in zip(names, (dx, *(g[n][...] for n in names[1:])), wgrads):
        close_and_not_negated(got, w, GRAD_TOL[jnp.dtype(jnp.float32)], name)
    idle = [e for e in range(E) if not arr(wgrads[1])[e].any()]
    assert idle == ([1, 3] if sizes == SIZES["gaps"] else [2, 4])
    for e in idle:
        assert not arr(g["fc1_kernel"][...])[e].any() and not arr(g["fc2_bias"][...])[e].any()


def test_jit_takes_sizes_as_data():
    """Under nnx.jit the sizes are a device array: new sizes reuse the trace and give the eager answer."""
    m = F.MoEMLP(HIDDEN, FFN, E, dtype=BF16, rngs=nnx.Rngs(4))
    x = rand(5, (M, HIDDEN), BF16)
    traces = []

    @nnx.jit
    def fwd(m, x, gs):
        traces.append(1)
        return m(x, gs)

    for sizes in SIZES.values():
        gs = jnp.asarray(sizes, jnp.int32)
        y = fwd(m, x, gs)
        assert y.dtype == jnp.dtype(BF16) and y.shape == (M, HIDDEN)
        np.testing.assert_array_equal(arr(y), arr(m(x, gs)))
    assert len(traces) == 1
    # dtype=None promotes as nnx.Linear: bf16 x with fp32 params computes in fp32.
    assert F.MoEMLP(HIDDEN, FFN, E, rngs=nnx.Rngs(4))(x, jnp.asarray(SIZES["gaps"])).dtype == jnp.float32


# ---- training: bf16, FP8 current and delayed scaling -----------------------------------------------------------------
T_E, T_H, T_F, T_M = 4, 32, 64, 128
T_SIZES = [40, 24, 0, 56]  # 120 of 128 tokens: an idle expert, 8 rows past the sum


def _task(steps):
    """Each expert's rows get their own teacher: a linear map plus a quadratic feature no linear model fits, plus
    N(0, 0.1²) noise; the rows past the sum have target 0 (the layer's output there)."""
    g = np.random.default_rng(30)
    x = g.standard_normal((steps, T_M, T_H))
    target, row = np.zeros_like(x), 0
    for s in T_SIZES:
        lin, a, b = (g.standard_normal((T_H, T_H)) * 0.25 / T_H ** 0.5, g.standard_normal((T_H, 32)) / T_H ** 0.5,
                     g.standard_normal((32, T_H)) * 0.3 / 32 ** 0.5)
        xs = x[:, row:row + s]
        target[:, row:row + s] = xs @ lin + ((xs @ a) ** 2 - 1) @ b + 0.1 * g.standard_normal(xs.shape)
        row += s
    return jnp.asarray(x, BF16), jnp.asarray(target, jnp.float32)


TRAIN_RECIPES = {"bf16": None, "current": tej.Float8CurrentScaling(), "delayed": tej.DelayedScaling()}
PARAMS_AND_META = nnx.DiffState(0, nnx.Any(nnx.Param, F.FP8Meta))


def _histories(module):
    return [arr(q.amax_history) for s in jax.tree_util.tree_leaves(nnx.state(module, F.FP8Meta),
                                                                     is_leaf=lambda n: isinstance(n, tej.QuantizerSet))
            for q in s]


@functools.lru_cache(maxsize=None)
def _train(recipe_name, steps=40):
    """Adam (lr 1e-2) on a bf16 SwiGLU MoEMLP built under the recipe, each step's FP8Meta gradients rolled in by
    update_fp8_meta; the mean losses of the first and last 5 steps and the amax histories at the end."""
    recipe = TRAIN_RECIPES[recipe_name]
    with tej.autocast(enabled=recipe is not None, recipe=recipe):
        model = F.MoEMLP(T_H, T_F, T_E, activation_type=("silu", "linear"), dtype=BF16, rngs=nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    gs = jnp.asarray(T_SIZES, jnp.int32)
    xs, targets = _task(steps)

    @nnx.jit
    def step(model, opt, x, target):
        def loss_fn(model):
            with tej.autocast(enabled=recipe is not None, recipe=recipe):
                y = model(x, gs)
            return jnp.mean((y.astype(jnp.float32) - target) ** 2)

        loss, grads = nnx.value_and_grad(loss_fn, argnums=PARAMS_AND_META)(model)
        opt.update(model, F.update_fp8_meta(model, grads))
        return loss

    losses = [float(step(model, opt, x, t)) for x, t in zip(xs, targets)]
    return np.mean(losses[:5]), np.mean(losses[-5:]), _histories(model)


def test_training_fp8_current_tracks_bf16():
    first_bf16, bf16, _ = _train("bf16")
    first, fp8, hist = _train("current")
    print(f"\nMoEMLP: bf16 {first_bf16:.4f} -> {bf16:.4f}; FP8 current {first:.4f} -> {fp8:.4f} "
          f"({(fp8 / bf16 - 1) * 100:+.2f} %)")
    assert bf16 < 0.6 * first_bf16 and fp8 < 0.6 * first  # both learn (measured 0.46x)
    assert fp8 != bf16  # the recipe reached the grouped GEMMs
    assert abs(fp8 - bf16) <= 0.03 * bf16
    assert hist == []  # a stateless recipe keeps no FP8Meta


def test_training_fp8_delayed_tracks_bf16():
    """DelayedScaling() (history 1024, "max") inside nnx.jit, update_fp8_meta after each step: final loss within 2 %
    of bf16, and every one of the 6 histories (fc1, fc2 × x, kernel, dgrad) holds one amax per step."""
    first_bf16, bf16, _ = _train("bf16")
    first, fp8, hist = _train("delayed")
    print(f"\nMoEMLP: bf16 {first_bf16:.4f} -> {bf16:.4f}; FP8 delayed {first:.4f} -> {fp8:.4f} "
          f"({(fp8 / bf16 - 1) * 100:+.2f} %)")
    assert fp8 < 0.6 * first  # it learns
    assert fp8 != bf16  # the recipe reached the grouped GEMMs
    assert abs(fp8 - bf16) <= 0.02 * bf16
    assert len(hist) == 6
    for h in hist:  # 40 steps rolled in: the last 40 rows are amaxes, the rest (row 0 included) still zero
        assert h.shape == (1024,) and np.all(h[-40:] > 0) and not h[:-40].any(), h[-41:]


# ---- delayed scaling: the recorded amaxes and the scales they give ---------------------------------------------------
DELAYED = tej.DelayedScaling(amax_history_len=4)
E4M3_MAX, E5M2_MAX = np.float32(448), np.float32(57344)


def test_delayed_records_observed_amaxes_and_next_scale():
    """After one jitted step the FP8Meta holds, at the end of each history, the amax the step saw: fc1's x = max|x|
    of the layer's (bf16) input, fc1's kernel = the largest over all experts (one shared scale), fc2's dgrad =
    max|dy|; each scale is fp8_max / amax. A second step with a smaller x casts with those scales (its output equals
    grouped_dense with the stored sets) and, "max" over the history, keeps fc1's x scale."""
    with tej.autocast(recipe=DELAYED):
        m = F.MoEMLP(HIDDEN, FFN, E, dtype=BF16, bias_init=nnx.initializers.normal(1.0), rngs=nnx.Rngs(7))
    gs = jnp.asarray(SIZES["gaps"], jnp.int32)
    x1, x2 = rand(20, (M, HIDDEN), BF16, 3.0), rand(21, (M, HIDDEN), BF16, 0.5)
    cot = rand(22, (M, HIDDEN), BF16, 2.0)

    @nnx.jit
    def step(m, x):
        def loss(m):
            with tej.autocast(recipe=DELAYED):
                y = m(x, gs)
            return jnp.sum(y.astype(jnp.float32) * cot.astype(jnp.float32)), y

        (_, y), g = nnx.value_and_grad(loss, argnums=PARAMS_AND_META, has_aux=True)(m)
        F.update_fp8_meta(m, g)
        return y

    assert all(not h.any() for h in _histories(m)) and len(_histories(m)) == 6
    step(m, x1)
    (q1x, q1k, q1g), (q2x, q2k, q2g) = m.fp8_meta.get_value()
    amax_x = np.max(np.abs(arr(x1)))
    amax_k = np.max(np.abs(arr(m.fc1_kernel[...].astype(BF16))))  # fc1's kernel as cast (bf16), all experts
    amax_dy = np.max(np.abs(arr(cot)))
    for q, amax, fp8_max in ((q1x, amax_x, E4M3_MAX), (q1k, amax_k, E4M3_MAX), (q2g, amax_dy, E5M2_MAX)):
        np.testing.assert_array_equal(arr(q.amax_history), [0, 0, 0, amax])
        assert float(q.scale[0]) == fp8_max / np.float32(amax)
    for q, fp8_max in ((q2x, E4M3_MAX), (q2k, E4M3_MAX), (q1g, E5M2_MAX)):  # the other three saw their tensors
        h = arr(q.amax_history)
        assert h[-1] > 0 and not h[:-1].any() and float(q.scale[0]) == fp8_max / np.float32(h[-1])
    assert arr(q2k.amax_history)[-1] == np.max(np.abs(arr(m.fc2_kernel[...].astype(BF16))))
    assert amax_x > 2 * np.max(np.abs(arr(x2)))

    @jax.jit
    def functional(x, sets, w1, b1, w2, b2):
        h = tej.grouped_dense(x, w1, gs, b1, quantizer_set=sets[0])
        return tej.grouped_dense(tej.activation(h.reshape(M, 1, FFN), ("gelu",)), w2, gs, b2, quantizer_set=sets[1])

    want = functional(x2, m.fp8_meta.get_value(), *(v[...].astype(BF16) for v in
                                                      (m.fc1_kernel, m.fc1_bias, m.fc2_kernel, m.fc2_bias)))
    y2 = step(m, x2)
    np.testing.assert_array_equal(arr(y2), arr(want))
    q1x = m.fp8_meta.get_value()[0].x
    h = arr(q1x.amax_history)
    np.testing.assert_array_equal(h[:3], [0, 0, amax_x])
    assert 0 < h[3] < amax_x and h[3] == np.max(np.abs(arr(x2)))
    assert float(q1x.scale[0]) == E4M3_MAX / np.float32(amax_x)  # "max": the larger, older amax still rules


def _has_gpu_backend():
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


# Open bug: on the GPU machines (jax/jaxlib 0.11 with CUDA) this test does not finish: run there with
# TE_RUN_OPEN_BUG=1 and a faulthandler timeout (2026-11-26, 4 x H100), it sat for 170 s in XLA's *CPU* compiler
# (backend_compile_and_load, "Very slow compile" alarm for jit__lambda on CPU) compiling the unquantized MoEMLP
# forward (`want` below; this module runs on the CPU device, conftest's jax_on_cpu) — not a hang in our kernels or
# an NCCL/CUDA wait. On the CPU-only CI machine (jaxlib 0.10) the whole test takes about 7 s. Skipped where a GPU
# backend exists until the slow CPU compile is reduced (or reported to XLA).
@pytest.mark.skipif(_has_gpu_backend() and not os.environ.get("TE_RUN_OPEN_BUG"),
                    reason="open bug: XLA's CPU compile of this program takes minutes on the GPU machines (above)")
def test_nvfp4_stochastic_rounding_takes_rngs():
    """NVFP4 with stochastic rounding keys the gradient's rounding from `rngs` (as Dense / MLP): without it the call
    says so (it used to fail for want of a key no caller could pass); with it the layer runs, and keeps no FP8Meta.
    (The rounding itself: tests/jax/test_flax.py's NVFP4 training.)"""
    recipe = tej.NVFP4BlockScaling(disable_stochastic_rounding=False)
    m = F.MoEMLP(HIDDEN, FFN, 1, dtype=BF16, rngs=nnx.Rngs(0))
    x, gs = rand(23, (32, HIDDEN), BF16), jnp.asarray([32], jnp.int32)
    with tej.autocast(recipe=recipe):
        with pytest.raises(ValueError, match="rngs="):
            m(x, gs)
        y = nnx.jit(lambda m, x, key: m(x, gs, rngs=key))(m, x, jax.random.PRNGKey(3))
    want = arr(nnx.jit(lambda m, x: m(x, gs))(m, x))
    err = np.linalg.norm(arr(y) - want) / np.linalg.norm(want)
    assert 0 < err < 0.35, err  # quantized (FP4 twice: 20 % normwise), not garbage
    assert m.fp8_meta.get_value() is None
