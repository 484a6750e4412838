"""The plain-Flax side of bench_model.py's JAX section: a Llama-style decoder from flax.nnx layers (nnx.Embed,
nnx.Linear, nnx.RMSNorm, jax.nn.dot_product_attention) in bf16, laid out as tej.flax.TransformerLayer so that its
weights copy over unchanged, the cross-entropy loss and the AdamW train step both contenders run. Nothing here imports
transformer_engine_jax.
"""
import jax
import jax.numpy as jnp
from flax import nnx


def rope_alternate(x, base=10000.0):
    """x [B, T, heads, D] rotated by its positions, in float32, back in x's dtype: channel p pairs with p + D/2 and
    turns by t · base^(-2p/D) (tej.flax's rotary_pos_emb with windows (1, base), group method "alternate": the
    torch side's non-interleaved halves)."""
    t, d = x.shape[1], x.shape[-1]
    angle = jnp.arange(t, dtype=jnp.float32)[:, None] * base ** (-2 * jnp.arange(d // 2, dtype=jnp.float32) / d)
    sin, cos = jnp.sin(angle)[None, :, None, :], jnp.cos(angle)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class PlainLayer(nnx.Module):
    """h = x + out(attn(rope(q), rope(k), v)), (q, k, v) = qkv(RMSNorm(x)) as [B, T, 3, H] (qkv's kernel [H, 3H] is
    tej's [H, 3, H] flattened); y = h + wo(silu(a) · b), (a, b) = wi(RMSNorm(h)) as [B, T, 2, F]. attn: causal
    jax.nn.dot_product_attention, logits scaled by 1/sqrt(head_dim). No biases."""

    def __init__(self, hidden, ffn, heads, eps, rngs):
        kw = dict(use_bias=False, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, rngs=rngs)
        nk = dict(epsilon=eps, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, rngs=rngs)
        self.heads, self.ffn = heads, ffn
        self.attn_norm, self.mlp_norm = nnx.RMSNorm(hidden, **nk), nnx.RMSNorm(hidden, **nk)
        self.qkv = nnx.Linear(hidden, 3 * hidden, **kw)
        self.out = nnx.Linear(hidden, hidden, **kw)
        self.wi = nnx.Linear(hidden, 2 * ffn, **kw)
        self.wo = nnx.Linear(ffn, hidden, **kw)

    def __call__(self, x):
        b, t, h = x.shape
        qkv = self.qkv(self.attn_norm(x)).reshape(b, t, 3, self.heads, h // self.heads)
        q, k, v = rope_alternate(qkv[:, :, 0]), rope_alternate(qkv[:, :, 1]), qkv[:, :, 2]
        a = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.reshape(b, t, h))
        g = self.wi(self.mlp_norm(x)).reshape(b, t, 2, self.ffn)
        return x + self.wo(jax.nn.silu(g[:, :, 0]) * g[:, :, 1])


class Decoder(nnx.Module):
    """nnx.Embed [vocab, hidden] -> layers (each called as layer(x)) -> nnx.RMSNorm -> LM head nnx.Linear(hidden,
    vocab, no bias), bf16; returns the logits [B, T, vocab] in bf16."""

    def __init__(self, vocab, hidden, eps, layers, rngs):
        self.embed = nnx.Embed(vocab, hidden, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, rngs=rngs)
        self.layers = nnx.List(layers) if hasattr(nnx, "List") else layers
        self.norm = nnx.RMSNorm(hidden, epsilon=eps, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, rngs=rngs)
        self.lm_head = nnx.Linear(hidden, vocab, use_bias=False, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16,
                                  rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def plain_decoder(cfg, seed=0):
    """The plain decoder of `cfg` (vocab, hidden, heads, ffn, layers, eps): kernels and the embedding N(0, 0.02), the
    output projections (out, wo) N(0, 0.02 / sqrt(2 * layers)) as the torch side, norms ones."""
    rngs = nnx.Rngs(seed)
    layers = [PlainLayer(cfg["hidden"], cfg["ffn"], cfg["heads"], cfg["eps"], rngs) for _ in range(cfg["layers"])]
    model = Decoder(cfg["vocab"], cfg["hidden"], cfg["eps"], layers, rngs)
    key = jax.random.PRNGKey(seed + 1)
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        v = var.get_value()
        if v.ndim == 2:
            key, sub = jax.random.split(key)
            std = 0.02 / (2 * cfg["layers"]) ** 0.5 if path[-2] in ("out", "wo") else 0.02
            var.set_value((jax.random.normal(sub, v.shape, jnp.float32) * std).astype(v.dtype))
    nnx.update(model, nnx.state(model, nnx.Param))
    return model


def cross_entropy(logits, targets):
    """Mean cross entropy of the float32 logits [B, T, V] against int targets [B, T]."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


ADAMW = dict(lr=3e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.01)


def adamw_init(params):
    """AdamW state (step, first and second moments in float32) for a State of parameters."""
    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    return jnp.zeros((), jnp.int32), zeros, jax.tree.map(jnp.copy, zeros)


def adamw_update(params, grads, state, lr, b1, b2, eps, weight_decay):
    """One AdamW step (torch.optim.AdamW's rule: decoupled decay p·(1 - lr·wd), bias-corrected moments), moments in
    float32, parameters rounded back to their dtype. Returns (new params, new state)."""
    t, m, v = state
    t = t + 1
    m = jax.tree.map(lambda a, g: b1 * a + (1 - b1) * g.astype(jnp.float32), m, grads)
    v = jax.tree.map(lambda a, g: b2 * a + (1 - b2) * jnp.square(g.astype(jnp.float32)), v, grads)
    c1, c2 = 1 - b1 ** t.astype(jnp.float32), 1 - b2 ** t.astype(jnp.float32)

    def upd(p, a, b):
        p32 = p.astype(jnp.float32) * (1 - lr * weight_decay)
        return (p32 - lr * (a / c1) / (jnp.sqrt(b / c2) + eps)).astype(p.dtype)

    return jax.tree.map(upd, params, m, v), (t, m, v)


def train_step(context=None, which=nnx.Param, after_grad=None):
    """The nnx.jit train step of both contenders: loss = cross_entropy(model(tokens), targets), its gradients with
    respect to `which` (traced inside `context()` when given: tej.autocast), `after_grad(model, grads)` -> the
    parameters' gradients (tej.flax.update_fp8_meta under delayed scaling), then AdamW on the nnx.Param leaves.
    step(model, opt_state, tokens, targets) -> (loss, new opt_state)."""
    import contextlib

    @nnx.jit
    def step(model, opt, tokens, targets):
        def loss_fn(m):
            return cross_entropy(m(tokens), targets)

        with (context() if context else contextlib.nullcontext()):
            loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, which))(model)
        if after_grad is not None:
            grads = after_grad(model, grads)
        params, opt = adamw_update(nnx.state(model, nnx.Param), grads, opt, **ADAMW)
        nnx.update(model, params)
        return loss, opt
    return step
