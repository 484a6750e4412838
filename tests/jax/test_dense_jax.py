"""tej.dense / tej.mlp (custom_vjp over tej.gemm and the fused activation kernels), recipes and autocast: jax.grad
against jax.grad of a float64 jnp reference, FP8 against the float64 product of the dequantized operands, the
delayed-scaling state carried through cotangents, a small FP8 training run against bf16, and trace-time errors."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import transformer_engine_jax as tej  # noqa: E402

pytestmark = pytest.mark.usefixtures("jax_on_cpu")

F64 = np.float64
# SPEC §9: layer outputs / grads in fp32 and bf16 (rtol, atol), E4M3.
OUT_TOL = {jnp.dtype(jnp.float32): (1e-5, 1e-5), jnp.dtype(jnp.bfloat16): (4e-2, 5e-2)}
GRAD_TOL = {jnp.dtype(jnp.float32): (1e-5, 1e-4), jnp.dtype(jnp.bfloat16): (4e-2, 0.2)}
E4M3_TOL = (0.125, 0.0675)
DTYPES = [jnp.float32, jnp.bfloat16]


def rand(seed, shape, dtype, scale=1.0):
    """N(0, scale²) values rounded to dtype (numpy's generator: jax.random compiles once per shape)."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) * scale, jnp.float32).astype(dtype)


def close(got, want, tol, what=""):
    np.testing.assert_allclose(np.asarray(jnp.asarray(got, jnp.float32), F64), np.asarray(want, F64),
                               rtol=tol[0], atol=tol[1], err_msg=what)


def close_and_not_negated(got, want, tol, what=""):
    close(got, want, tol, what)
    with pytest.raises(AssertionError):  # a wrong answer fails
        close(got, -np.asarray(want, F64), tol)


def grad64(fn, args, cot):
    """jax.grad of sum(fn(*args) * cot) in float64, and fn's value."""
    with jax.enable_x64(True):
        a64 = [None if a is None else jnp.asarray(np.asarray(jnp.asarray(a, jnp.float32), F64)) for a in args]
        c64 = jnp.asarray(np.asarray(jnp.asarray(cot, jnp.float32), F64))
        idx = [i for i, a in enumerate(a64) if a is not None]

        def loss(*xs):
            full = list(a64)
            for i, v in zip(idx, xs):
                full[i] = v
            return jnp.sum(fn(*full) * c64)

        grads = jax.grad(loss, argnums=tuple(range(len(idx))))(*[a64[i] for i in idx])
        return np.asarray(fn(*a64)), [np.asarray(g) for g in grads]


def with_grads(fn, args, cot, extra=()):
    """(fn(*args), grads of sum(fn * cot) in the non-None args), jitted."""
    idx = tuple(i for i, a in enumerate(args) if a is not None)

    def loss(*xs):
        full = list(args)
        for i, v in zip(idx, xs):
            full[i] = v
        y = fn(*full, *extra)
        return jnp.sum(y.astype(jnp.float32) * cot.astype(jnp.float32)), y

    (_, y), g = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(idx))), has_aux=True))(
        *[args[i] for i in idx])
    return y, g


def dense_ref(x, k, b, kernel_last=False):
    y = jnp.tensordot(x, k, ((x.ndim - 1,), (1 if kernel_last else 0,)))
    return y if b is None else y + b


def gelu(x):
    return 0.5 * x * (1 + jnp.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1 + jnp.exp(-x))


ACTS = {"gelu": (("gelu",), lambda h: gelu(h[..., 0, :])),
        "swiglu": (("silu", "linear"), lambda h: silu(h[..., 0, :]) * h[..., 1, :])}


def mlp_ref(act):
    fn = ACTS[act][1]

    def ref(x, w1, b1, w2, b2):
        h = jnp.einsum("...k,kaf->...af", x, w1) + b1
        return fn(h) @ w2 + b2
    return ref


# ---- no quantizer: grads vs float64 ----------------------------------------------------------------------------
@pytest.mark.parametrize("kernel_last", [False, True], ids=["KN", "NK"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_dense_grads_vs_float64(dtype, kernel_last):
    x, b = rand(0, (2, 3, 24), dtype), rand(2, (40,), dtype)
    k = rand(1, (40, 24) if kernel_last else (24, 40), dtype, 0.3)
    cot = rand(3, (2, 3, 40), dtype)
    dims = ((-1,), (1,)) if kernel_last else ((-1,), (0,))
    y, grads = with_grads(lambda *a: tej.dense(*a, contracting_dims=dims), (x, k, b), cot)
    assert y.shape == (2, 3, 40) and y.dtype == jnp.dtype(dtype)
    assert all(g.dtype == jnp.dtype(dtype) for g in grads)
    want, wgrads = grad64(lambda *a: dense_ref(*a, kernel_last=kernel_last), (x, k, b), cot)
    close_and_not_negated(y, want, OUT_TOL[jnp.dtype(dtype)], "y")
    for name, g, w in zip(("dx", "dkernel", "dbias"), grads, wgrads):
        close_and_not_negated(g, w, GRAD_TOL[jnp.dtype(dtype)], name)


def test_dense_multi_dim_contraction_and_no_bias():
    """x [B, T, H, D] contracted over (H, D) with kernel [H, D, N]: leading batch dims, 2 contracting dims."""
    x, k, cot = rand(4, (2, 5, 3, 8), jnp.float32), rand(5, (3, 8, 16), jnp.float32), rand(6, (2, 5, 16), jnp.float32)
    y, grads = with_grads(lambda a, b: tej.dense(a, b, contracting_dims=((2, 3), (0, 1))), (x, k), cot)
    want, wgrads = grad64(lambda a, b: jnp.tensordot(a, b, ((2, 3), (0, 1))), (x, k), cot)
    close(y, want, OUT_TOL[jnp.dtype(jnp.float32)])
    for g, w in zip(grads, wgrads):
        close(g, w, GRAD_TOL[jnp.dtype(jnp.float32)])


@pytest.mark.parametrize("dtype,act", [(jnp.float32, "gelu"), (jnp.bfloat16, "swiglu")],
                         ids=["fp32-gelu", "bf16-swiglu"])
def test_mlp_grads_vs_float64(dtype, act):
    a = 2 if act == "swiglu" else 1
    x, cot = rand(10, (2, 8, 32), dtype), rand(11, (2, 8, 24), dtype)
    w1, b1 = rand(12, (32, a, 48), dtype, 0.2), rand(13, (a, 48), dtype)
    w2, b2 = rand(14, (48, 24), dtype, 0.2), rand(15, (24,), dtype)
    y, grads = with_grads(lambda *p: tej.mlp(*p, activation_type=ACTS[act][0]), (x, w1, b1, w2, b2), cot)
    want, wgrads = grad64(mlp_ref(act), (x, w1, b1, w2, b2), cot)
    # bf16: the pre-activation is rounded to bf16 before the activation (as the torch layer), hence out tol x2.
    rtol, atol = OUT_TOL[jnp.dtype(dtype)]
    close_and_not_negated(y, want, (2 * rtol, 2 * atol), "y")
    for name, g, w in zip(("dx", "dw1", "db1", "dw2", "db2"), grads, wgrads):
        assert g.shape == w.shape and g.dtype == jnp.dtype(dtype), name
        close_and_not_negated(g, w, GRAD_TOL[jnp.dtype(dtype)], name)


# ---- FP8: vs the dequantized operands ------------------------------------------------------------------------
FP8 = {"delayed": tej.DelayedScaling(amax_history_len=4), "current": tej.Float8CurrentScaling()}


@pytest.mark.parametrize("recipe", list(FP8))
def test_dense_fp8_vs_dequantized_float64(recipe):
    """Forward and grads within the E4M3 tolerance of the float64 products of the operands' quantized copies
    (the same casts as inside: the quantizers are deterministic), batch dims, bias grad, under jit; the delayed
    amaxes come back as the quantizer set's cotangent and update_quantizer_set turns them into the next scales."""
    qs = tej.make_quantizer_set(FP8[recipe])
    x, k, b = rand(20, (2, 16, 32), jnp.bfloat16), rand(21, (32, 48), jnp.bfloat16), rand(22, (48,), jnp.bfloat16)
    cot = rand(23, (2, 16, 48), jnp.bfloat16)

    def loss(x, k, b, qs):
        y = tej.dense(x, k, b, quantizer_set=qs)
        return jnp.sum(y.astype(jnp.float32) * cot.astype(jnp.float32)), y

    (_, y), (dx, dk, db, dqs) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(x, k, b, qs)
    deq = lambda t, q: np.asarray(tej.quantize(t, q).dequantize(jnp.float32), F64)  # noqa: E731
    xd, kd = deq(x.reshape(32, 32), qs.x), deq(k, qs.kernel)
    dyd = deq(cot.reshape(32, 48), qs.dgrad)
    close_and_not_negated(y.reshape(32, 48), xd @ kd + np.asarray(b, F64), E4M3_TOL, "y")
    close_and_not_negated(dx.reshape(32, 32), dyd @ kd.T, E4M3_TOL, "dx")
    close_and_not_negated(dk, xd.T @ dyd, E4M3_TOL, "dkernel")
    close(db, np.asarray(cot, F64).sum((0, 1)), (6.4e-2, 1e-2), "dbias")
    assert dx.dtype == dk.dtype == db.dtype == jnp.bfloat16
    # The FP8 GEMMs are not the plain ones: the quantization error shows against the unquantized product.
    assert np.abs(np.asarray(y, F64).reshape(32, 48) - np.asarray(x, F64).reshape(32, 32) @ np.asarray(k, F64)).max() \
        > 1e-3
    if recipe == "delayed":
        amax = lambda t: float(jnp.max(jnp.abs(t.astype(jnp.float32))))  # noqa: E731
        assert float(dqs.x.amax_history[0]) == amax(x)
        assert float(dqs.kernel.amax_history[0]) == amax(k)
        assert float(dqs.dgrad.amax_history[0]) == amax(cot)
        nxt = jax.jit(tej.update_quantizer_set)(qs, dqs)
        assert float(nxt.x.scale[0]) == np.float32(448) / np.float32(amax(x))
        assert float(nxt.dgrad.scale[0]) == np.float32(57344) / np.float32(amax(cot))  # HYBRID: E5M2 grads
        assert float(nxt.x.amax_history[-1]) == amax(x)


@pytest.mark.parametrize("recipe,act", [("delayed", "gelu"), ("current", "gelu"), ("current", "swiglu")])
def test_mlp_fp8(recipe, act):
    """The FP8 MLP (activation quantized by the fused kernel for GEMM 2, fused dact(+dbias) quantization; gated: the
    dbias from a second fused cast) tracks the float64 MLP within FP8's error, and its cotangents carry an amax for
    each of its six delayed quantizers."""
    qs = (tej.make_quantizer_set(FP8[recipe]), tej.make_quantizer_set(FP8[recipe]))
    a = 2 if act == "swiglu" else 1
    x, cot = rand(30, (4, 16, 32), jnp.bfloat16), rand(31, (4, 16, 16), jnp.bfloat16)
    w1, b1 = rand(32, (32, a, 64), jnp.bfloat16, 0.2), rand(33, (a, 64), jnp.bfloat16)
    w2, b2 = rand(34, (64, 16), jnp.bfloat16, 0.2), rand(35, (16,), jnp.bfloat16)
    y, grads = with_grads(lambda *p: tej.mlp(*p[:5], ACTS[act][0], p[5]), (x, w1, b1, w2, b2, qs), cot)
    want, wgrads = grad64(mlp_ref(act), (x, w1, b1, w2, b2), cot)
    for name, g, w in zip(("y", "dx", "dw1", "db1", "dw2", "db2"), (y, *grads[:5]), (want, *wgrads)):
        err = np.abs(np.asarray(jnp.asarray(g, jnp.float32), F64) - w).max() / np.abs(w).max()
        # y: four E4M3 casts on its way; HYBRID gradients are E5M2 (2 mantissa bits), twice on the way to dx.
        assert err < (0.1 if name == "y" else 0.15), f"{name}: max error {err:.3g} of the largest value"
    if recipe == "delayed":
        amaxes = [float(q.amax_history[0]) for s in grads[5] for q in s]
        assert all(a > 0 for a in amaxes), amaxes


@pytest.mark.parametrize("recipe,dtype", [(tej.MXFP8BlockScaling(), jnp.bfloat16),
                                          (tej.Float8BlockScaling(), jnp.bfloat16),
                                          (tej.NVFP4BlockScaling(), jnp.bfloat16),
                                          (tej.NVFP4BlockScaling(), jnp.float16)],
                         ids=["mxfp8", "fp8_block", "nvfp4", "nvfp4-fp16"])
def test_block_recipes(recipe, dtype):
    """The block formats through tej.gemm on the CPU (the core's exact decode, FP64 accumulation; NVFP4's global
    scales in alpha'): the float64 product of the dequantized operands within the output dtype's rounding (float16
    under NVFP4: the GEMM writes fp32, rounded once); grads finite and close."""
    qs = tej.make_quantizer_set(recipe)
    x, k, cot = rand(40, (64, 64), dtype), rand(41, (64, 32), dtype), rand(42, (64, 32), dtype)
    y, (dx, dk) = with_grads(lambda a, b: tej.dense(a, b, quantizer_set=qs), (x, k), cot)
    assert y.dtype == dx.dtype == dk.dtype == jnp.dtype(dtype)
    xq, kq = tej.quantize(x, qs.x), tej.quantize(k, qs.kernel)
    want = np.asarray(xq.dequantize(jnp.float32), F64) @ np.asarray(kq.get_colwise_tensor().dequantize(jnp.float32),
                                                                      F64)
    close_and_not_negated(y, want, (1.6e-2, 1e-5), "y")
    _, (gx, gk) = grad64(lambda a, b: a @ b, (x, k), cot)
    tol = 0.3 if isinstance(recipe, tej.NVFP4BlockScaling) else 0.1
    for name, g, w in (("dx", dx, gx), ("dk", dk, gk)):
        err = np.abs(np.asarray(jnp.asarray(g, jnp.float32), F64) - w).max() / np.abs(w).max()
        assert err < tol, f"{name}: {err:.3g}"


# ---- autocast -------------------------------------------------------------------------------------------------
def test_autocast_builds_the_recipes_quantizer_set():
    x, k = rand(50, (32, 32), jnp.bfloat16), rand(51, (32, 16), jnp.bfloat16)
    recipe = tej.Float8CurrentScaling()
    explicit = tej.dense(x, k, quantizer_set=tej.make_quantizer_set(recipe))
    with tej.autocast(recipe=recipe):
        assert tej.get_autocast_recipe() == recipe
        auto = jax.jit(tej.dense)(x, k)
        with tej.autocast(enabled=False):
            plain = tej.dense(x, k)
    assert tej.get_autocast_recipe() is None
    np.testing.assert_array_equal(np.asarray(auto, F64), np.asarray(explicit, F64))
    np.testing.assert_array_equal(np.asarray(plain, F64), np.asarray(tej.dense(x, k), F64))
    assert not np.array_equal(np.asarray(plain, F64), np.asarray(auto, F64))
    with tej.autocast(recipe=tej.DelayedScaling()):
        with pytest.raises(ValueError, match=r"tej.dense: under autocast\(recipe=DelayedScaling.*make_quantizer_set"):
            tej.dense(x, k)


# ---- training: FP8 vs bf16 -------------------------------------------------------------------------------------
def _train(recipe, steps=40, lr=0.1):
    """SGD on a 2-layer GELU MLP regressing a fixed random teacher; delayed state carried via the cotangents."""
    x, teacher = rand(7, (64, 32), jnp.float32), rand(8, (32, 16), jnp.float32, 1 / 6)
    target = jnp.tanh(x @ teacher).astype(jnp.bfloat16)
    x = x.astype(jnp.bfloat16)
    params = (rand(60, (32, 64), jnp.float32, 0.18), jnp.zeros((64,), jnp.float32),
              rand(61, (64, 16), jnp.float32, 0.12), jnp.zeros((16,), jnp.float32))
    qs = (tej.make_quantizer_set(recipe), tej.make_quantizer_set(recipe))

    def loss_fn(params, qs):
        y = tej.mlp(x, *params, activation_type=("gelu",), quantizer_sets=qs)
        return jnp.mean((y.astype(jnp.float32) - target.astype(jnp.float32)) ** 2)

    @jax.jit
    def step(params, qs):
        loss, (g, gq) = jax.value_and_grad(loss_fn, argnums=(0, 1))(params, qs)
        params = jax.tree_util.tree_map(lambda p, d: p - lr * d.astype(p.dtype), params, g)
        return params, tej.update_quantizer_set(qs, gq), loss

    losses = []
    for _ in range(steps):
        params, qs, loss = step(params, qs)
        losses.append(float(loss))
    return losses, qs


def test_fp8_training_tracks_bf16():
    base, _ = _train(None)
    assert base[-1] < 0.5 * base[0], base  # it learns
    for recipe in (tej.DelayedScaling(amax_history_len=16), tej.Float8CurrentScaling()):
        fp8, qs = _train(recipe)
        assert abs(fp8[-1] - base[-1]) <= 0.04 * base[-1], (type(recipe).__name__, fp8[-1], base[-1])
        if isinstance(recipe, tej.DelayedScaling):  # the state was carried: all six scales left their initial 1
            assert all(float(q.scale[0]) != 1.0 for s in qs for q in s), qs


# ---- errors ---------------------------------------------------------------------------------------------------
def test_errors_name_the_shapes():
    x, k = jnp.zeros((4, 32), jnp.float32), jnp.zeros((32, 16), jnp.float32)
    with pytest.raises(ValueError, match=r"tej.dense: K mismatch.*\(32,\).*\(24,\).*x \(4, 32\), kernel \(24, 16\)"):
        tej.dense(x, jnp.zeros((24, 16)))
    with pytest.raises(ValueError, match=r"x must contract over its trailing dims"):
        tej.dense(jnp.zeros((32, 4)), k, contracting_dims=((0,), (0,)))
    with pytest.raises(ValueError, match=r"kernel must contract over its leading dims.*\(1,\)"):
        tej.dense(x, jnp.zeros((2, 32, 16)), contracting_dims=((-1,), (1,)))
    with pytest.raises(ValueError, match=r"bias must have the kernel's output shape \(16,\), got \(15,\)"):
        tej.dense(x, k, jnp.zeros((15,)))
    with pytest.raises(TypeError, match=r"x must be float32, bfloat16 or float16, got int32"):
        tej.dense(jnp.zeros((4, 32), jnp.int32), k)
    fp8 = tej.make_quantizer_set(tej.Float8CurrentScaling())
    with pytest.raises(ValueError, match=r"multiple of 16 \(SPEC §6.5\), got tokens.*=4. Pad"):
        tej.dense(x, k, quantizer_set=fp8)
    with pytest.raises(ValueError, match=r"all of x, kernel and dgrad or none"):
        tej.dense(jnp.zeros((16, 32)), k, quantizer_set=fp8._replace(dgrad=None))
    w1, w2 = jnp.zeros((32, 2, 64)), jnp.zeros((64, 16))
    with pytest.raises(ValueError, match=r"tej.mlp: w1 has shape \(32, 2, 64\), not the kernel \('gelu',\) takes"):
        tej.mlp(x, w1, None, w2, None, ("gelu",))
    with pytest.raises(ValueError, match=r"F mismatch: the activation gives 64 features but w2's first dim is 48"):
        tej.mlp(x, w1, None, jnp.zeros((48, 16)), None, ("silu", "linear"))
    with pytest.raises(ValueError, match=r"b1 must be \[2, 64\] or \[128\], got \(64,\)"):
        tej.mlp(x, w1, jnp.zeros((64,)), w2, None, "swiglu")
    with pytest.raises(ValueError, match=r"needs rng_key"):
        tej.make_quantizer_set(tej.NVFP4BlockScaling(disable_stochastic_rounding=False))
