#!/usr/bin/env python3
"""Where the time of a small jitted tej call goes (issue 20: host overhead of one 256x4096 call). Prints, per call,
the wall time of a host loop of N jitted calls and one wait, for: an empty jitted program (jax's own dispatch), the
same activation written in jnp (XLA's fusion), tej's plain and FP8-delayed act_lu, and tej's act_lu inside a
program of 8 calls (per call). Run it under several settings to split the cost, e.g.
    python3 tools/jax_overhead.py                                   # as users run it
    TEJ_NO_INITIALIZE=1 python3 tools/jax_overhead.py               # without the initialize stage
    XLA_FLAGS=--xla_gpu_enable_command_buffer= python3 tools/jax_overhead.py   # without command buffers
"""
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import transformer_engine_jax as tej  # noqa: E402


def per_call_us(fn, iters, rounds=5):
    jax.block_until_ready(fn())
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = None
        for _ in range(iters):
            out = fn()
        jax.block_until_ready(out)
        per.append(1e6 * (time.perf_counter() - t0) / iters)
    return statistics.median(per)


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    x = (jax.random.normal(jax.random.PRNGKey(0), (256, 1, 4096), jnp.float32)).astype(jnp.bfloat16)
    q = tej.QuantizerFactory.create(scaling_mode=tej.ScalingMode.DELAYED_TENSOR_SCALING, amax_history_len=1)
    empty = jax.jit(lambda x: x)
    xla = jax.jit(lambda x: jax.nn.gelu(x[:, 0].astype(jnp.float32)).astype(jnp.bfloat16))
    plain = jax.jit(lambda x: tej.act_lu(x, "gelu"))
    delayed = jax.jit(lambda x, q: tej.act_lu(x, "gelu", q).data)

    @jax.jit
    def eight(x):
        for _ in range(8):
            x = tej.act_lu(x, "gelu")[:, None, :]
        return x
    rows = [("identity jit (dispatch only)", lambda: empty(x), 1), ("jnp gelu (XLA fusion)", lambda: xla(x), 1),
            ("tej act_lu plain", lambda: plain(x), 1), ("tej act_lu FP8 delayed", lambda: delayed(x, q), 1),
            ("tej act_lu plain, 8 per program", lambda: eight(x), 8)]
    flags = f"TEJ_NO_INITIALIZE={os.environ.get('TEJ_NO_INITIALIZE', '0')} XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}"
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, {flags}")
    for name, fn, calls in rows:
        print(f"{name:<36} {per_call_us(fn, iters) / calls:8.1f} us per call")


if __name__ == "__main__":
    main()
