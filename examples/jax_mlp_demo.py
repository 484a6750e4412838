"""JAX demo: a jitted training step of a 2-layer MLP whose activation is tej.activation — in float32, then with an
FP8 current-scaling quantizer and an MXFP8 quantizer on the activation output — losses side by side.

The activation runs as the project's fused kernel through XLA FFI (forward: act + quantize in one kernel; backward:
the fused dact kernel); the two GEMMs are jnp.dot here (tej's GEMM is the JAX part 2 issue). Runs on the GPU when
jax sees one, else on the CPU, with the same bytes.
"""
import time

import jax
import jax.numpy as jnp

import transformer_engine_jax as tej


def init_params(key, hidden, ffn):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (hidden, ffn)) / hidden ** 0.5,
            "w2": jax.random.normal(k2, (ffn, hidden)) / ffn ** 0.5}


def loss_fn(params, x, y, quantizer):
    h = x @ params["w1"]                                    # [batch, ffn]
    h = tej.activation(h[:, None, :], ("gelu",), quantizer)  # [batch, 1, ffn] -> [batch, ffn]
    return jnp.mean((h @ params["w2"] - y) ** 2)


def train(quantizer, steps, hidden, ffn, batch):
    params = init_params(jax.random.PRNGKey(0), hidden, ffn)
    teacher = init_params(jax.random.PRNGKey(1), hidden, ffn)

    @jax.jit
    def step(params, key):
        x = jax.random.normal(key, (batch, hidden))
        y = jnp.tanh(x @ teacher["w1"]) @ teacher["w2"]
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, quantizer)
        return jax.tree_util.tree_map(lambda p, g: p - 0.05 * g, params, grads), loss

    losses, key = [], jax.random.PRNGKey(2)
    for i in range(steps):
        if i == 2:
            jax.block_until_ready(params)
            t0 = time.perf_counter()
        key, sub = jax.random.split(key)
        params, loss = step(params, sub)
        losses.append(float(loss))
    return losses, (time.perf_counter() - t0) / (steps - 2)


def main():
    gpu = jax.default_backend() == "gpu"
    hidden, ffn, batch, steps = (1024, 4096, 4096, 100) if gpu else (64, 256, 128, 60)
    runs = {"float32": None,
            "FP8 current": tej.QuantizerFactory.create(scaling_mode=tej.ScalingMode.CURRENT_TENSOR_SCALING),
            "MXFP8": tej.QuantizerFactory.create(scaling_mode=tej.ScalingMode.MXFP8_1D_SCALING)}
    print(f"tej demo on {jax.devices()[0]}: MLP {hidden}->{ffn}->{hidden}, batch {batch}, {steps} steps")
    for name, q in runs.items():
        losses, t = train(q, steps, hidden, ffn, batch)
        print(f"  {name:12s} loss {losses[0]:.4f} -> {losses[-1]:.4f}   {t * 1e3:.2f} ms/step")


if __name__ == "__main__":
    main()
