"""The pure-JAX collective GEMM (transformer_engine_jax/collective.py) on the 8-device CPU mesh: the ring
all-gather + GEMM equals the unsharded tej.gemm bit for bit (bf16, and FP8 current scaling whose codes travel the
ring), the ring GEMM + reduce-scatter equals it within FP32 accumulation; the compiled programs move data with
collective-permutes only (no all-gather, all-reduce or reduce-scatter)."""
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
