"""tej.flax's LayerNorm, LayerNormDenseGeneral, LayerNormMLP and TransformerLayer (flax_transformer.py) over
tej.layernorm / tej.layernorm_dense / tej.layernorm_mlp: forward and gradients (inputs and every parameter) against
float64 jnp references of the same math, the norm fused into the GEMM's input quantization equal to the unfused
norm + GEMM, every recipe, jit against eager, the delayed-scaling state through update_fp8_meta, and the errors."""
import functools
import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

import transformer_engine_jax as tej  # noqa: E402
from test_dense_jax import ACTS, F64, GRAD_TOL, OUT_TOL, close_and_not_negated, rand  # noqa: E402

pytestmark = pytest.mark.usefixtures("jax_on_cpu")

F = tej.flax
BF16 = jnp.bfloat16
FP32_OUT, FP32_GRAD = OUT_TOL[jnp.dtype(jnp.float32)], GRAD_TOL[jnp.dtype(jnp.float32)]
RECIPES = {"delayed": tej.DelayedScaling(amax_history_len=4), "current": tej.Float8CurrentScaling(),
           "mxfp8": tej.MXFP8BlockScaling(), "fp8_block": tej.Float8BlockScaling(),
           "nvfp4": tej.NVFP4BlockScaling(disable_stochastic_rounding=True)}
PARAMS_AND_META = nnx.DiffState(0, nnx.Any(nnx.Param, F.FP8Meta))


# ---- float64 references -----------------------------------------------------------------------------------------
def norm64(x, gamma, beta, kind="layernorm", zero_centered_gamma=False, eps=1e-6):
    """SPEC §11's LayerNorm / RMSNorm over the last dim (tests/ref/normalization.py's math, in jnp for jax.grad)."""
    g = gamma + 1 if zero_centered_gamma else gamma
    if kind == "rmsnorm":
        return x / jnp.sqrt((x * x).mean(-1, keepdims=True) + eps) * g
    c = x - x.mean(-1, keepdims=True)
    y = c / jnp.sqrt((c * c).mean(-1, keepdims=True) + eps) * g
    return y if beta is None else y + beta


def rope64(x, windows, group):
    """Rotary embedding as a complex rotation: pair (a, b) -> (a + ib)·exp(i·t / (min·(max/min)^(2p/D)))."""
    t, d = x.shape[1], x.shape[-1]
    theta = jnp.arange(t)[:, None] / (windows[0] * (windows[1] / windows[0]) ** (2 * jnp.arange(d // 2) / d))
    a, b = (x[..., 0::2], x[..., 1::2]) if group == "consecutive" else (x[..., :d // 2], x[..., d // 2:])
    r = (a + 1j * b) * jnp.exp(1j * theta)[None, :, None, :]
    if group == "consecutive":
        return jnp.stack([r.real, r.imag], -1).reshape(x.shape)
    return jnp.concatenate([r.real, r.imag], -1)


def mlp64(z, wi, bi, wo, bo, act):
    h = jnp.einsum("...k,kaf->...af", z, wi)
    h = ACTS[act][1](h if bi is None else h + bi)
    return h @ wo if bo is None else h @ wo + bo


def transformer64(cfg, x, p):
    """TransformerLayer's math: pre-norm fused-QKV self attention (softmax in float64), residual, pre-norm MLP,
    residual. p: the flat parameter dict of the module (its state paths)."""
    heads, kind, act = cfg["heads"], cfg.get("kind", "layernorm"), cfg["act"]
    b, t, hid = x.shape
    d = hid // heads
    qkv = jnp.einsum("btk,kin->btin", norm64(x, p["attention/qkv/scale"], p.get("attention/qkv/ln_bias"), kind),
                     p["attention/qkv/kernel"])
    q, k, v = (qkv[:, :, i].reshape(b, t, heads, d) for i in range(3))
    if cfg.get("rope"):
        q, k = rope64(q, (1, 10000), cfg["rope"]), rope64(k, (1, 10000), cfg["rope"])
    logits = jnp.einsum("bqnd,bknd->bnqk", q, k) * (1 / math.sqrt(d) if cfg.get("scale_logits") else 1.0)
    if cfg.get("mask", "causal") == "causal":
        logits = jnp.where(jnp.arange(t)[None, :] > jnp.arange(t)[:, None], -jnp.inf, logits)
    w = jnp.exp(logits - logits.max(-1, keepdims=True))
    a = jnp.einsum("bnqk,bknd->bqnd", w / w.sum(-1, keepdims=True), v).reshape(b, t, hid)
    h = x + a @ p["attention/out/kernel"]
    z = norm64(h, p["mlp/scale"], p.get("mlp/ln_bias"), kind)
    return h + mlp64(z, p["mlp/wi_kernel"], None, p["mlp/wo_kernel"], None, act)


# ---- helpers ----------------------------------------------------------------------------------------------------
def arr(v):
    return np.asarray(jnp.asarray(v, jnp.float32), F64)


def params(module):
    return {"/".join(map(str, k)): v.get_value() for k, v in nnx.to_flat_state(nnx.state(module, nnx.Param))}


def build(cls, *args, seed, **kwargs):
    """The module built inside nnx.jit (rngs nnx.Rngs(seed)): one compiled initializer instead of an eager compile
    per init op."""
    return nnx.jit(lambda: cls(*args, rngs=nnx.Rngs(seed), **kwargs))()


def run(module, x, cot, first=True, jit=True):
    """(y, dx, {param path: grad}) of sum(y * cot); y is the module's output (its first when a tuple)."""
    def loss(m, x):
        y = m(x)
        y = y[0] if first and isinstance(y, tuple) else y
        return jnp.sum(y.astype(jnp.float32) * cot), y

    f = nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True)
    (_, y), (g, dx) = (nnx.jit(f) if jit else f)(module, x)
    return y, dx, {"/".join(map(str, k)): v.get_value() for k, v in nnx.to_flat_state(nnx.filter_state(g, nnx.Param))}


@functools.lru_cache(maxsize=None)
def _ref64(ref, names):
    """jit(ref's value and the gradients of sum(ref * cot)), compiled once per reference."""
    def value_and_grads(x, *rest):
        *ps, cot = rest
        fn = lambda *a: ref(a[0], dict(zip(names, a[1:])))  # noqa: E731
        y, vjp = jax.vjp(fn, x, *ps)
        return y, vjp(cot)
    return jax.jit(value_and_grads)


def against64(module, x, cot, ref, tol_out=FP32_OUT, tol_grad=FP32_GRAD, rel=None):
    """The module's y and gradients (x and every Param) against jax.grad of ref(x, params) in float64: within
    (rtol, atol), or within rel of the largest reference value when rel is given (the quantized recipes)."""
    y, dx, g = run(module, x, cot)
    names = tuple(sorted(g))
    p = params(module)
    with jax.enable_x64(True):
        args = [jnp.asarray(arr(a)) for a in (x, *(p[n] for n in names), cot)]
        want, wgrads = _ref64(ref, names)(*args)
        want, wgrads = np.asarray(want), [np.asarray(w) for w in wgrads]
    for name, got, w in zip(["y", "x", *names], [y, dx] + [g[n] for n in names], [want] + wgrads):
        if rel is None:
            close_and_not_negated(got, w, tol_out if name == "y" else tol_grad, name)
        else:
            err = np.abs(arr(got) - w).max() / np.abs(w).max()
            assert err < rel, f"{name}: max error {err:.3g} of the largest value"
    return y, g


# ---- the references themselves ------------------------------------------------------------------------------------
def test_norm_reference_is_the_shared_one():
    """norm64 and its jax.grad equal tests/ref/normalization.py's float64 forward and SPEC §11 backward."""
    torch = pytest.importorskip("torch")
    from tests.ref.normalization import layernorm_fwd_ref, norm_bwd_ref, rmsnorm_fwd_ref

    x, g, b, dz = (np.random.default_rng(i).standard_normal(s) for i, s in enumerate([(6, 24), (24,), (24,), (6, 24)]))
    t = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
    with jax.enable_x64(True):
        for kind, zc in (("layernorm", True), ("rmsnorm", False)):
            beta = b if kind == "layernorm" else None
            mine = lambda x, g, b: norm64(x, g, b, kind, zc, 1e-5)  # noqa: E731
            y, vjp = jax.vjp(mine, jnp.asarray(x), jnp.asarray(g), jnp.asarray(b))
            dx, dg, db = vjp(jnp.asarray(dz))
            if kind == "layernorm":
                want, mu, rs = layernorm_fwd_ref(t(x), t(g), t(b), 1e-5, zc)
            else:
                (want, rs), mu = rmsnorm_fwd_ref(t(x), t(g), 1e-5, zc), None
            np.testing.assert_allclose(np.asarray(y), want.numpy(), rtol=1e-12, atol=1e-12)
            wdx, wdg, wdb = norm_bwd_ref(t(dz), t(x), mu, rs, t(g), zc)
            np.testing.assert_allclose(np.asarray(dx), wdx.numpy(), rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(np.asarray(dg), wdg.numpy(), rtol=1e-10, atol=1e-12)
            if beta is not None:
                np.testing.assert_allclose(np.asarray(db), wdb.numpy(), rtol=1e-10, atol=1e-12)


# ---- LayerNorm --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,zc", [("layernorm", True), ("rmsnorm", False)])
def test_layernorm_vs_float64(kind, zc):
    """TE's parameters (scale: ones, or zeros zero-centred; ln_bias for LayerNorm only); y, dx, dscale, dln_bias
    against float64; bf16 x with FP32 parameters computes and returns FP32 (nnx's promotion)."""
    init = nnx.initializers.normal(0.5)
    ln = F.LayerNorm(32, layernorm_type=kind, zero_centered_gamma=zc, rngs=nnx.Rngs(0))
    assert set(params(ln)) == ({"scale", "ln_bias"} if kind == "layernorm" else {"scale"})
    np.testing.assert_array_equal(arr(ln.scale), np.zeros(32) if zc else np.ones(32))
    ln = F.LayerNorm(32, layernorm_type=kind, zero_centered_gamma=zc, scale_init=init, bias_init=init,
                     rngs=nnx.Rngs(0))
    x, cot = rand(1, (4, 8, 32), jnp.float32, 2.0) + 1.0, rand(2, (4, 8, 32), jnp.float32)
    against64(ln, x, cot, lambda x, p: norm64(x, p["scale"], p.get("ln_bias"), kind, zc))
    assert ln(x.astype(BF16)).dtype == jnp.float32


# ---- LayerNormDenseGeneral / LayerNormMLP without quantization ---------------------------------------------------
def test_layernorm_dense_general_vs_float64():
    """Kernel [32, 2, 16] (features a tuple), bias, zero-centred gamma; ln_out with return_layernorm_output equals
    the LayerNorm module's; y and every gradient against float64."""
    init = nnx.initializers.normal(0.5)
    kw = dict(use_bias=True, zero_centered_gamma=True, scale_init=init, ln_bias_init=init, bias_init=init)
    layer = build(F.LayerNormDenseGeneral, 32, (2, 16), seed=3, **kw)
    p = params(layer)
    assert {k: v.shape for k, v in p.items()} == {"scale": (32,), "ln_bias": (32,), "kernel": (32, 2, 16),
                                                  "bias": (2, 16)}
    x, cot = rand(4, (2, 8, 32), jnp.float32), rand(5, (2, 8, 2, 16), jnp.float32)
    against64(layer, x, cot, lambda x, p: jnp.einsum(
        "btk,kin->btin", norm64(x, p["scale"], p["ln_bias"], zero_centered_gamma=True), p["kernel"]) + p["bias"])
    y, none = layer(x)  # eager, as the unfused call below (the shim's jnp norm rounds differently under jit)
    assert none is None
    layer.return_layernorm_output = True
    y2, ln_out = layer(x)
    ln = F.LayerNorm(32, zero_centered_gamma=True, rngs=nnx.Rngs(0))
    ln.scale.set_value(p["scale"])
    ln.ln_bias.set_value(p["ln_bias"])
    np.testing.assert_array_equal(arr(ln_out), arr(ln(x)))
    np.testing.assert_array_equal(arr(y2), arr(y))


def test_layernorm_mlp_vs_float64():
    """RMSNorm + SwiGLU with biases: wi_kernel [H, 2, F] (the activated half first, TE's stacking), wi_bias [2, F],
    wo_kernel [F, H], wo_bias [H]; y and every gradient against float64."""
    init = nnx.initializers.normal(0.5)
    block = build(F.LayerNormMLP, 32, 48, layernorm_type="rmsnorm", activations=("silu", "linear"), use_bias=True,
                  bias_init=init, scale_init=init, seed=6)
    assert {k: v.shape for k, v in params(block).items()} == {
        "scale": (32,), "wi_kernel": (32, 2, 48), "wi_bias": (2, 48), "wo_kernel": (48, 32), "wo_bias": (32,)}
    x, cot = rand(7, (16, 32), jnp.float32), rand(8, (16, 32), jnp.float32)
    against64(block, x, cot, lambda x, p: mlp64(norm64(x, p["scale"], None, "rmsnorm"), p["wi_kernel"],
                                                p["wi_bias"], p["wo_kernel"], p["wo_bias"], "swiglu"))


# ---- the fused norm -> quantized GEMM input ----------------------------------------------------------------------
def ldg64(x, p):
    """LayerNormDenseGeneral's math (LayerNorm, bias)."""
    return norm64(x, p["scale"], p["ln_bias"]) @ p["kernel"] + p["bias"]


@pytest.mark.parametrize("recipe,layer", [("delayed", "mlp"), ("current", "dense"), ("mxfp8", "mlp"),
                                          ("fp8_block", "dense"), ("nvfp4", "dense")])
def test_fused_norm_equals_unfused(recipe, layer):
    """In FP32 the norm's FP32 output is the very array the unfused path quantizes, so a fused layer
    (return_layernorm_output=False: the norm writes the GEMM's input quantized) equals the norm followed by
    tej.dense / tej.mlp bit for bit: forward, every parameter gradient and the delayed amaxes (FP8Meta gradients).
    The quantization shows against the float64 layer, within the recipe's error; under Float8CurrentScaling the
    eager forward equals the jitted one."""
    rec = RECIPES[recipe]
    x = rand(9, (32, 64), jnp.float32, 3.0)
    with tej.autocast(recipe=rec):
        if layer == "mlp":
            fused = build(F.LayerNormMLP, 64, 32, activations=("gelu",), seed=11)
        else:
            init = nnx.initializers.normal(0.5)
            fused = build(F.LayerNormDenseGeneral, 64, 32, use_bias=True, bias_init=init, ln_bias_init=init,
                          seed=10)
    unfused = nnx.clone(fused)
    unfused.return_layernorm_output = True

    @nnx.jit
    def step(fused, unfused):  # both in one program: one compile
        with tej.autocast(recipe=rec):
            return [nnx.value_and_grad(lambda m: (lambda y: (jnp.sum(y ** 2), y))(m(x)[0]), argnums=PARAMS_AND_META,
                                       has_aux=True)(m) for m in (fused, unfused)]

    ((_, y), g), ((_, y_unfused), g_unfused) = step(fused, unfused)
    np.testing.assert_array_equal(arr(y), arr(y_unfused))
    got, want = jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g_unfused)
    assert len(got) == len(want) >= 4
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    p = {k: arr(v) for k, v in params(fused).items()}
    with jax.enable_x64(True):
        want = (ldg64(arr(x), p) if layer == "dense" else
                mlp64(norm64(arr(x), p["scale"], p["ln_bias"]), p["wi_kernel"], None, p["wo_kernel"], None, "gelu"))
    err = np.abs(arr(y) - np.asarray(want)).max() / np.abs(np.asarray(want)).max()
    assert 1e-3 < err < (0.25 if recipe == "nvfp4" else 0.1), err
    if recipe == "current":
        with tej.autocast(recipe=rec):
            np.testing.assert_array_equal(arr(fused(x)[0]), arr(y))
    if recipe == "delayed":  # the step's amaxes rolled in: the first GEMM's x amax is max |norm(x)|
        rest = F.update_fp8_meta(fused, g)
        assert {k[-1] for k, _ in nnx.to_flat_state(rest)} == {"scale", "ln_bias", "wi_kernel", "wo_kernel"}
        (qx, qk, qg), second = fused.fp8_meta.get_value()
        assert float(qx.amax_history[-1]) == pytest.approx(np.abs(norm64(arr(x), p["scale"], p["ln_bias"])).max(),
                                                           rel=1e-6)
        assert float(qk.amax_history[-1]) == np.abs(p["wi_kernel"]).max()
        for q in (qx, qk, qg, *second):
            assert float(q.amax_history[-1]) > 0 and float(q.scale[0]) != 1.0


# ---- TransformerLayer ---------------------------------------------------------------------------------------------
CAUSAL = dict(heads=4, act="swiglu", rope="consecutive", kind="rmsnorm")
NO_MASK = dict(heads=2, act="gelu", rope="alternate", mask="no_mask", scale_logits=True)


def transformer(cfg, **kwargs):
    return build(F.TransformerLayer, 32, 64, cfg["heads"], mlp_activations=ACTS[cfg["act"]][0],
                 self_attn_mask_type=cfg.get("mask", "causal"), enable_rotary_pos_emb=True,
                 rotary_pos_emb_group_method=cfg["rope"], scale_attn_logits=cfg.get("scale_logits", False),
                 layernorm_type=cfg.get("kind", "layernorm"), **kwargs)


def test_transformer_layer_vs_float64():
    """FP32, unquantized, causal, RoPE on consecutive pairs, RMSNorm, SwiGLU: y and the gradients of x and of every
    parameter (TE's names: attention/qkv [H, 3, H] with its norm's scale, attention/out [H, H], mlp) against the
    float64 layer."""
    layer = transformer(CAUSAL, seed=12)
    assert {k: v.shape for k, v in params(layer).items()} == {
        "attention/qkv/scale": (32,), "attention/qkv/kernel": (32, 3, 32), "attention/out/kernel": (32, 32),
        "mlp/scale": (32,), "mlp/wi_kernel": (32, 2, 64), "mlp/wo_kernel": (64, 32)}
    x, cot = rand(13, (2, 8, 32), jnp.float32), rand(14, (2, 8, 32), jnp.float32)
    against64(layer, x, cot, functools.partial(transformer64, CAUSAL), (2e-5, 2e-5), (1e-4, 1e-4))


@pytest.mark.parametrize("recipe", ["current"])
def test_transformer_layer_under_recipe_vs_float64(recipe):
    """bf16 under the recipe, no mask, RoPE on (p, p + D/2) pairs, logits scaled, LayerNorm with ln_bias, GELU: y
    and every gradient within the recipe's error of the float64 layer (E4M3 forward, E5M2 gradients, two FP8 GEMMs
    deep before the first norm's gamma: 20 % of the largest value; 15.7 % measured there)."""
    x, cot = rand(15, (2, 16, 32), BF16), rand(16, (2, 16, 32), jnp.float32)
    with tej.autocast(recipe=RECIPES[recipe]):
        layer = transformer(NO_MASK, dtype=BF16, seed=17)
        assert "attention/qkv/ln_bias" in params(layer)
        y, _ = against64(layer, x, cot, functools.partial(transformer64, NO_MASK), rel=0.2)
    assert y.dtype == jnp.dtype(BF16)


def test_transformer_layer_fp8_meta_per_sublayer():
    """Built under DelayedScaling, a TransformerLayer holds one FP8Meta per sub-layer — qkv and out a set each, the
    MLP a pair — which update_fp8_meta finds and rolls like any module's (test_fused_norm_equals_unfused[delayed])."""
    with tej.autocast(recipe=RECIPES["delayed"]):
        layer = nnx.eval_shape(lambda: F.TransformerLayer(32, 64, 2, rngs=nnx.Rngs(0)))
    metas = dict(("/".join(map(str, k)), v.get_value()) for k, v in nnx.to_flat_state(nnx.state(layer, F.FP8Meta)))
    assert sorted(metas) == ["attention/out/fp8_meta", "attention/qkv/fp8_meta", "mlp/fp8_meta"]
    assert isinstance(metas["attention/qkv/fp8_meta"], tej.QuantizerSet) and len(metas["mlp/fp8_meta"]) == 2
    assert metas["attention/out/fp8_meta"].x.amax_history.shape == (4,)


# ---- errors -------------------------------------------------------------------------------------------------------
def test_errors_name_the_argument():
    r = nnx.Rngs(0)
    with pytest.raises(ValueError, match=r"LayerNorm: layernorm_type must be one of .*'batchnorm'"):
        F.LayerNorm(8, layernorm_type="batchnorm", rngs=r)
    with pytest.raises(ValueError, match=r"LayerNormDenseGeneral: x must be \[\.\.\., 32\].*\(4, 16\)"):
        nnx.eval_shape(lambda: F.LayerNormDenseGeneral(32, 16, rngs=nnx.Rngs(0)))(jnp.zeros((4, 16)))
    with pytest.raises(ValueError, match=r"LayerNormMLP: x must be \[\.\.\., 32\]"):
        nnx.eval_shape(lambda: F.LayerNormMLP(32, 16, rngs=nnx.Rngs(0)))(jnp.zeros((4, 8)))
    with pytest.raises(ValueError, match=r"hidden_size 30 must be a multiple of num_attention_heads 4"):
        F.TransformerLayer(30, 64, 4, rngs=r)
    with pytest.raises(ValueError, match=r"self_attn_mask_type must be one of .*'padding'"):
        F.TransformerLayer(32, 64, 4, self_attn_mask_type="padding", rngs=r)
    with pytest.raises(ValueError, match=r"rotary_pos_emb_group_method must be one of .*'interleaved'"):
        F.TransformerLayer(32, 64, 4, enable_rotary_pos_emb=True, rotary_pos_emb_group_method="interleaved", rngs=r)
    with pytest.raises(ValueError, match=r"head_dim .* = 3 must be even"):
        F.TransformerLayer(12, 64, 4, enable_rotary_pos_emb=True, rngs=r)
    with pytest.raises(ValueError, match=r"rotary_pos_emb_windows must be \(min, max\)"):
        F.TransformerLayer(32, 64, 4, enable_rotary_pos_emb=True, rotary_pos_emb_windows=(0, 10), rngs=r)
    with pytest.raises(ValueError, match=r"TransformerLayer: x must be \[batch, seq, 32\], got \(16, 32\)"):
        nnx.eval_shape(lambda: F.TransformerLayer(32, 64, 4, rngs=nnx.Rngs(0)))(jnp.zeros((16, 32)))
    x, k, g = jnp.zeros((32, 32)), jnp.zeros((32, 32)), jnp.ones(32)
    with pytest.raises(ValueError, match=r"layernorm_dense: epsilon must be a finite number > 0, got 0"):
        tej.layernorm_dense(x, k, g, g, epsilon=0)
    with pytest.raises(ValueError, match=r"gamma and beta must be \[H\] = \[32\].*gamma \(16,\)"):
        tej.layernorm_dense(x, k, jnp.ones(16), g)
    with pytest.raises(ValueError, match=r"RMSNorm has no beta"):
        tej.layernorm_mlp(x, g, g, (jnp.zeros((32, 1, 32)), k), norm_type="rmsnorm")
    with pytest.raises(ValueError, match=r"LayerNorm needs beta \[H\] = \[32\]"):
        tej.layernorm_mlp(x, g, None, (jnp.zeros((32, 1, 32)), k))
    with pytest.raises(ValueError, match=r"norm_type must be one of"):
        tej.layernorm_mlp(x, g, g, (jnp.zeros((32, 1, 32)), k), norm_type="l2")
    with pytest.raises(ValueError, match=r"kernel must be \[H, N\.\.\.\] with H = x's last dim 32"):
        tej.layernorm_dense(x, jnp.zeros((16, 8)), g, g)
    with pytest.raises(TypeError, match=r"layernorm_dense: x must be float32, bfloat16 or float16, got int32"):
        tej.layernorm_dense(x.astype(jnp.int32), k, g, g)
    # Under a recipe the fused path checks the alignment (tokens 24) and the MLP's shapes as tej.dense / tej.mlp.
    qs = tej.make_quantizer_set(tej.Float8CurrentScaling())
    with pytest.raises(ValueError, match=r"layernorm_dense: under CURRENT_TENSOR_SCALING .* multiple of 16.*=24"):
        tej.layernorm_dense(jnp.zeros((24, 32)), k, g, g, quantizer_set=qs)
    with pytest.raises(ValueError, match=r"tej.mlp: F mismatch"):
        tej.layernorm_mlp(x, g, g, (jnp.zeros((32, 1, 32)), jnp.zeros((16, 32))), quantizer_sets=(qs, qs))


# ---- tensor parallel ----------------------------------------------------------------------------------------------
TP_SCRIPT = r"""
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import transformer_engine_jax as tej

mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("dp", "tp"))
SPECS = {"attention/qkv/kernel": P(None, None, "tp"), "attention/out/kernel": P("tp", None),
         "mlp/wi_kernel": P(None, None, "tp"), "mlp/wo_kernel": P("tp", None)}
x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 16, 32)), jnp.float32)
for recipe in (tej.Float8CurrentScaling(),):
    with tej.autocast(enabled=recipe is not None, recipe=recipe):
        layer = tej.flax.TransformerLayer(32, 64, 4, mlp_activations=("gelu",), enable_rotary_pos_emb=True,
                                          rngs=nnx.Rngs(0))

        @nnx.jit
        def step(m, x):
            return nnx.value_and_grad(lambda m, x: jnp.sum(m(x) ** 2), argnums=(0, 1))(m, x)

        loss, (g, dx) = step(layer, x)
        state = nnx.state(layer)
        flat = [(k, v) for k, v in nnx.to_flat_state(state)]
        sharded = []
        for k, v in flat:
            spec = SPECS.get("/".join(map(str, k)), P())
            sharded.append((k, v.replace(jax.device_put(v.get_value(), NamedSharding(mesh, spec)))))
        nnx.update(layer, nnx.from_flat_state(sharded))
        assert layer.mlp.wi_kernel.get_value().sharding.spec == P(None, None, "tp")
        xs = jax.device_put(x, NamedSharding(mesh, P("dp")))
        loss_s, (g_s, dx_s) = step(layer, xs)
    tol = 1e-5 if recipe is None else 2e-2
    np.testing.assert_allclose(float(loss_s), float(loss), rtol=tol)
    np.testing.assert_allclose(np.asarray(dx_s), np.asarray(dx), rtol=tol, atol=tol)
    for (k, a), (_, b) in zip(nnx.to_flat_state(g_s), nnx.to_flat_state(g)):
        np.testing.assert_allclose(np.asarray(a.get_value()), np.asarray(b.get_value()), rtol=tol, atol=tol,
                                   err_msg=str(k))
print("ok")
"""


def test_tensor_parallel_on_cpu_mesh(run_on_cpu_mesh):
    """A TransformerLayer on a (dp 2, tp 2) CPU mesh, x sharded along the batch, qkv's and wi's kernels column
    parallel, out's and wo's row parallel: loss, dx and every parameter gradient equal the unsharded layer's,
    unquantized (FP32: within 1e-5, the sums' order) and under Float8CurrentScaling (the amaxes reduced over the
    mesh: the same scales; 2 % for the GEMMs' partial sums in another order around the FP8 casts)."""
    run_on_cpu_mesh(TP_SCRIPT)
