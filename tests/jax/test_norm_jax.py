"""tej.layernorm / normalization_fwd / normalization_bwd (issue 35, SPEC §11) through the XLA FFI handlers on the
core's norm producer: the statistics against float64 (tests/ref/normalization.py), the output bit for bit against
the FP32 output step of the returned statistics, the gradients against the float64 backward, tej = tex byte for byte
(plain and every format), jit, the sharding rule on an 8-device CPU mesh, and bad input at trace time."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

import transformer_engine_jax as tej  # noqa: E402
import transformer_engine_torch as tex  # noqa: E402
from tests.jax.test_parity_torch import _gpu, assert_same_bytes, torch_quantizer  # noqa: E402
from tests.ref.normalization import (layernorm_fwd_ref, norm_bwd_ref, norm_output_f32,  # noqa: E402
                                     rmsnorm_fwd_ref)

SM = tej.ScalingMode
pytestmark = pytest.mark.usefixtures("jax_on_cpu")

MODES = [SM.DELAYED_TENSOR_SCALING, SM.CURRENT_TENSOR_SCALING, SM.MXFP8_1D_SCALING, SM.NVFP4_1D_SCALING,
         SM.NVFP4_2D_SCALING, SM.BLOCK_SCALING_1x128, SM.BLOCK_SCALING_128x128]
NORMS = ["layernorm", "rmsnorm"]


def _t(a):
    """A jax array as a CPU torch tensor (the same bytes)."""
    return torch.from_dlpack(jax.device_get(a)) if a is not None else None


def inputs(shape, dtype, seed=0, gamma_dtype=None):
    """x [..., H] with a per-row offset (so mu matters), gamma near 1 (or near 0: zero-centred), beta small."""
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    h = shape[-1]
    x = jax.random.normal(k[0], shape, jnp.float32) * 2 + jax.random.normal(k[1], shape[:-1] + (1,)) * 3
    gamma = jax.random.uniform(k[2], (h,), jnp.float32, 0.5, 1.5)
    beta = jax.random.normal(k[3], (h,), jnp.float32) * 0.1
    gd = gamma_dtype or dtype
    return x.astype(dtype), gamma.astype(gd), beta.astype(gd)


def _beta(norm, beta):
    return beta if norm == "layernorm" else None


# ---- forward: statistics against float64, y bit for bit from them ------------------------------------------------
@pytest.mark.parametrize("zero_centered_gamma", [False, True])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("norm", NORMS)
def test_forward_against_reference(norm, dtype, zero_centered_gamma):
    x, gamma, beta = inputs((4, 8, 64), dtype)
    if zero_centered_gamma:
        gamma = (gamma.astype(jnp.float32) - 1).astype(dtype)
    beta = _beta(norm, beta)
    eps = 1e-5
    y, mu, rsigma = jax.jit(lambda x, g, b: tej.normalization_fwd(x, g, b, zero_centered_gamma, eps, norm))(
        x, gamma, beta)
    assert y.dtype == x.dtype and y.shape == x.shape and rsigma.shape == x.shape[:-1] == (4, 8)
    assert rsigma.dtype == jnp.float32
    if norm == "layernorm":
        y64, mu64, rs64 = layernorm_fwd_ref(_t(x), _t(gamma), _t(beta), eps, zero_centered_gamma)
        assert mu.shape == (4, 8) and mu.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(mu), mu64.numpy(), rtol=1e-5, atol=1e-5)
    else:
        y64, rs64 = rmsnorm_fwd_ref(_t(x), _t(gamma), eps, zero_centered_gamma)
        assert mu is None
    np.testing.assert_allclose(np.asarray(rsigma), rs64.numpy(), rtol=2e-6)
    # y: exactly SPEC §11's FP32 output step of the statistics the kernel returned, rounded once to x's dtype
    want = norm_output_f32(_t(x), _t(mu), _t(rsigma), _t(gamma), _t(beta), zero_centered_gamma).to(_t(x).dtype)
    assert torch.equal(_t(y).view(torch.uint8), want.view(torch.uint8)), \
        f"{norm}: y differs from norm_output_f32 of its own statistics"
    tol = 1e-5 if dtype == jnp.float32 else 1.6e-2
    np.testing.assert_allclose(np.asarray(y, np.float64), y64.numpy(), rtol=tol, atol=tol)
    # the check can fail: a wrong epsilon moves rsigma beyond the tolerance
    _, _, far = tej.normalization_fwd(x, gamma, beta, zero_centered_gamma, 1.0, norm)
    assert not np.allclose(np.asarray(far), rs64.numpy(), rtol=2e-6)


# ---- backward: against float64 -----------------------------------------------------------------------------------
@pytest.mark.parametrize("zero_centered_gamma", [False, True])
@pytest.mark.parametrize("norm", NORMS)
def test_grad_against_reference(norm, zero_centered_gamma):
    x, gamma, beta = inputs((2, 16, 64), jnp.float32, 1)
    beta = _beta(norm, beta)
    w = jax.random.normal(jax.random.PRNGKey(9), x.shape, jnp.float32)

    def loss(x, g, b):
        return jnp.sum(tej.layernorm(x, g, b, norm, zero_centered_gamma, 1e-5) * w)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2) if beta is not None else (0, 1)))(x, gamma, beta)
    _, mu, rsigma = tej.normalization_fwd(x, gamma, beta, zero_centered_gamma, 1e-5, norm)
    dx64, dg64, db64 = norm_bwd_ref(_t(w), _t(x), _t(mu), _t(rsigma), _t(gamma), zero_centered_gamma)
    np.testing.assert_allclose(np.asarray(grads[0], np.float64), dx64.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(grads[1], np.float64), dg64.numpy(), rtol=1e-4, atol=1e-4)
    assert grads[1].dtype == gamma.dtype
    if beta is not None:
        np.testing.assert_allclose(np.asarray(grads[2], np.float64), db64.numpy(), rtol=1e-4, atol=1e-4)
    assert not np.allclose(np.asarray(grads[0], np.float64), -dx64.numpy(), rtol=1e-4, atol=1e-5)


def test_grad_bf16_in_gamma_dtype_and_quantized_straight_through():
    """bf16: dgamma and dbeta in gamma's dtype; with a quantizer the forward is the dequantized quantized output
    and the backward the same kernel call as without (the cotangent straight through)."""
    x, gamma, beta = inputs((2, 64, 64), jnp.bfloat16, 2)
    q = tej.QuantizerFactory.create(scaling_mode=SM.CURRENT_TENSOR_SCALING)
    f = lambda q: jax.grad(lambda x, g, b: jnp.sum(tej.layernorm(x, g, b, quantizer=q).astype(jnp.float32)),  # noqa
                           argnums=(0, 1, 2))
    plain, quant = jax.jit(f(None))(x, gamma, beta), jax.jit(f(q))(x, gamma, beta)
    assert [g.dtype for g in plain] == [jnp.bfloat16] * 3
    for a, b in zip(plain, quant):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    y = tej.layernorm(x, gamma, beta, quantizer=q)
    st, _, _ = tej.normalization_fwd(x, gamma, beta, quantizer=q)
    assert y.dtype == jnp.bfloat16 and np.asarray(y).tobytes() == np.asarray(st.dequantize()).tobytes()


# ---- tej = tex, byte for byte ------------------------------------------------------------------------------------
def _tex_fwd(norm, x, gamma, beta, eps, zcg, quantizer):
    x2 = _t(x).reshape(-1, x.shape[-1])
    if norm == "layernorm":
        return tex.layernorm_fwd(x2, _t(gamma), _t(beta), eps, None, quantizer, None, 0, zcg)
    return tex.rmsnorm_fwd(x2, _t(gamma), eps, None, quantizer, None, 0, zcg)


@pytest.mark.parametrize("mode", [None] + MODES, ids=lambda m: "plain" if m is None else m.name)
@pytest.mark.parametrize("norm", NORMS)
def test_bytes_equal_tex(norm, mode):
    x, gamma, beta = inputs((128, 128), jnp.bfloat16, 3)
    beta = _beta(norm, beta)
    zcg = mode == SM.MXFP8_1D_SCALING
    q = None if mode is None else tej.QuantizerFactory.create(scaling_mode=mode, amax_history_len=4)
    if mode == SM.DELAYED_TENSOR_SCALING:
        q = q.__class__.tree_unflatten(q.tree_flatten()[1], (jnp.full((1,), 2.0, jnp.float32),
                                                             jnp.zeros((4,), jnp.float32)))
    got, mu, rsigma = jax.jit(lambda x, g, b, q: tej.normalization_fwd(x, g, b, zcg, 1e-5, norm, q))(x, gamma, beta, q)
    want = _tex_fwd(norm, x, gamma, beta, 1e-5, zcg,
                    None if mode is None else torch_quantizer(mode, torch.full((1,), 2.0), torch.zeros(1)))
    if mode is None:
        assert np.asarray(got).view(np.uint16).tobytes() == want[0].view(torch.int16).numpy().tobytes()
    else:
        assert_same_bytes(got, want[0], f"{norm} {mode.name}")
    assert np.asarray(rsigma).tobytes() == want[2].numpy().tobytes()
    if norm == "layernorm":
        assert np.asarray(mu).tobytes() == want[1].numpy().tobytes()


@pytest.mark.parametrize("norm", NORMS)
def test_backward_bytes_equal_tex(norm):
    x, gamma, beta = inputs((64, 128), jnp.bfloat16, 4)
    dz = inputs((64, 128), jnp.bfloat16, 5)[0]
    beta = _beta(norm, beta)
    _, mu, rsigma = tej.normalization_fwd(x, gamma, beta, True, 1e-5, norm)
    got = jax.jit(lambda *a: tej.normalization_bwd(*a, None, True, 1e-5, norm))(dz, x, mu, rsigma, gamma)
    if norm == "layernorm":
        want = tex.layernorm_bwd(_t(dz), _t(x), _t(mu), _t(rsigma), _t(gamma), 0, True)
    else:
        want = tex.rmsnorm_bwd(_t(dz), _t(x), _t(rsigma), _t(gamma), 0, True)
        assert got[2] is None
    for name, a, b in zip(("dx", "dgamma", "dbeta"), got, want):
        if a is not None:
            assert np.asarray(a).view(np.uint16).tobytes() == b.view(torch.int16).numpy().tobytes(), name


# ---- jit, vmap ---------------------------------------------------------------------------------------------------
def test_eager_equals_jit_and_vmap():
    x, gamma, beta = inputs((3, 32, 64), jnp.bfloat16, 6)
    q = tej.QuantizerFactory.create(scaling_mode=SM.MXFP8_1D_SCALING)
    f = lambda x: tej.normalization_fwd(x, gamma, beta, False, 1e-5, "layernorm", q)  # noqa: E731
    leaves = lambda t: [np.asarray(a).tobytes() for a in jax.tree_util.tree_leaves(t)]  # noqa: E731
    assert leaves(f(x)) == leaves(jax.jit(f)(x))
    batched = jax.vmap(f)(x)
    for i in range(3):
        assert leaves(jax.tree_util.tree_map(lambda a: a[i], batched)) == leaves(f(x[i]))


# ---- bad input, at trace time ------------------------------------------------------------------------------------
def trace(fn, *args):
    return jax.eval_shape(fn, *args)


S = jax.ShapeDtypeStruct


@pytest.mark.parametrize("gshape,bshape,what,bad", [((32,), (64,), "gamma", "32"), ((64,), (63,), "beta", "63"),
                                                    ((1, 64), (64,), "gamma", "1, 64")])
def test_bad_gamma_beta_shape(gshape, bshape, what, bad):
    with pytest.raises(ValueError, match=rf"\({what}\) has shape \[{bad}\] but the normalized \(last\) dim of input "
                                         rf"\[4, 64\] is 64; pass .* of shape \[64\]"):
        trace(lambda x, g, b: tej.layernorm(x, g, b), S((4, 64), jnp.float32), S(gshape, jnp.float32),
              S(bshape, jnp.float32))


@pytest.mark.parametrize("eps", [0.0, -1e-5, float("inf"), float("nan")])
def test_bad_epsilon(eps):
    with pytest.raises(ValueError, match=r"eps"):
        trace(lambda x, g: tej.layernorm(x, g, None, "rmsnorm", epsilon=eps), S((4, 64), jnp.float32),
              S((64,), jnp.float32))


def test_traced_epsilon():
    with pytest.raises(TypeError, match=r"layernorm: epsilon must be a Python float \(static, not traced\)"):
        trace(lambda x, g, e: tej.layernorm(x, g, None, "rmsnorm", epsilon=e), S((4, 64), jnp.float32),
              S((64,), jnp.float32), S((), jnp.float32))


@pytest.mark.parametrize("mode,block", [(SM.MXFP8_1D_SCALING, 32), (SM.NVFP4_1D_SCALING, 16)])
def test_h_not_a_multiple_of_the_block(mode, block):
    q = tej.QuantizerFactory.create(scaling_mode=mode)
    with pytest.raises(ValueError, match=rf"blocks of {block} along the hidden size.*got hidden size 40"):
        trace(lambda x, g: tej.layernorm(x, g, None, "rmsnorm", quantizer=q), S((128, 40), jnp.bfloat16),
              S((40,), jnp.bfloat16))


def test_unknown_norm_type():
    with pytest.raises(ValueError, match=r"layernorm: norm_type must be one of 'layernorm', 'rmsnorm', got "
                                         r"'batchnorm'"):
        trace(lambda x, g: tej.layernorm(x, g, None, "batchnorm"), S((4, 64), jnp.float32), S((64,), jnp.float32))


def test_rmsnorm_with_beta_and_layernorm_without():
    x, g = S((4, 64), jnp.float32), S((64,), jnp.float32)
    with pytest.raises(ValueError, match=r"rmsnorm takes no beta.*pass beta=None"):
        trace(lambda x, g, b: tej.layernorm(x, g, b, "rmsnorm"), x, g, g)
    with pytest.raises(ValueError, match=r"layernorm needs beta of shape \[H\]"):
        trace(lambda x, g: tej.layernorm(x, g, None, "layernorm"), x, g)


def test_bad_dtypes():
    x, g = S((4, 64), jnp.float32), S((64,), jnp.float32)
    with pytest.raises(TypeError, match=r"x must be float32, float16 or bfloat16, got int32"):
        trace(lambda x, g: tej.layernorm(x, g, None, "rmsnorm"), S((4, 64), jnp.int32), g)
    with pytest.raises(TypeError, match=r"gamma must be float32, float16 or bfloat16, got int8"):
        trace(lambda x, g: tej.layernorm(x, g, None, "rmsnorm"), x, S((64,), jnp.int8))
    with pytest.raises(TypeError, match=r"beta"):
        trace(lambda x, g, b: tej.layernorm(x, g, b), x, g, S((64,), jnp.float16))
    with pytest.raises(TypeError, match=r"dz dtype bfloat16 must match x dtype float32"):
        trace(lambda dz, x, r, g: tej.normalization_bwd(dz, x, None, r, g, norm_type="rmsnorm"),
              S((4, 64), jnp.bfloat16), x, S((4,), jnp.float32), g)
    with pytest.raises(TypeError, match=r"rsigma must be float32"):
        trace(lambda dz, x, r, g: tej.normalization_bwd(dz, x, None, r, g, norm_type="rmsnorm"),
              x, x, S((4,), jnp.bfloat16), g)


# ---- sharding: the 8-device CPU mesh -----------------------------------------------------------------------------
SHARDING_SCRIPT = r"""
import dataclasses
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import transformer_engine_jax as tej

SM = tej.ScalingMode
leaves = lambda t: [np.asarray(a).view(np.uint8).tobytes() for a in jax.tree_util.tree_leaves(t)]
normal = lambda key, shape: (jax.random.normal(jax.random.PRNGKey(key), shape, jnp.float32) * 3).astype(jnp.bfloat16)
x, big = normal(0, (16, 4, 64)), normal(1, (64, 16, 64))  # big: 1024 rows, whole groups of 128 on each device
gamma, beta = normal(2, (64,)), normal(3, (64,))
q = lambda mode, **kw: tej.QuantizerFactory.create(scaling_mode=mode, **kw)
delayed = dataclasses.replace(q(SM.DELAYED_TENSOR_SCALING, amax_history_len=2), scale=jnp.array([0.375], jnp.float32),
                              amax_history=jnp.array([5.0, 1.0], jnp.float32))
fwd = lambda norm, quantizer: lambda x: tej.normalization_fwd(x, gamma, beta if norm == "layernorm" else None,
                                                              False, 1e-5, norm, quantizer)
cases = (("plain layernorm", fwd("layernorm", None), x), ("plain rmsnorm", fwd("rmsnorm", None), x),
         ("current", fwd("layernorm", q(SM.CURRENT_TENSOR_SCALING)), x), ("delayed", fwd("rmsnorm", delayed), x),
         ("mxfp8", fwd("layernorm", q(SM.MXFP8_1D_SCALING)), big), ("nvfp4", fwd("rmsnorm", q(SM.NVFP4_1D_SCALING)), big))
mesh = Mesh(np.array(jax.devices()).reshape(8), ("dp",))
for name, f, a in cases:
    sharded = jax.device_put(a, NamedSharding(mesh, P("dp")))
    compiled = jax.jit(f).lower(sharded).compile()
    got, want = compiled(sharded), f(a)
    assert leaves(got) == leaves(want), name
    assert "all-gather" not in compiled.as_text(), (name, "an all-gather in the compiled program")
    assert not jax.tree_util.tree_leaves(got)[0].sharding.is_fully_replicated, name

# the gradient: dx the unsharded bytes, dgamma / dbeta summed over the shards in FP32, rounded once
mesh2 = Mesh(np.array(jax.devices()).reshape(4, 2), ("dp", "sp"))
loss = lambda x, g, b: jnp.sum(tej.layernorm(x, g, b).astype(jnp.float32) ** 2)
grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
sharded = jax.device_put(x, NamedSharding(mesh2, P("dp", "sp")))
compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(sharded, gamma, beta).compile()
got, want = compiled(sharded, gamma, beta), grad(x, gamma, beta)
assert leaves(got[0]) == leaves(want[0]), "dx"
assert "all-gather" not in compiled.as_text(), "grad: an all-gather in the compiled program"
for name, a, b in (("dgamma", got[1], want[1]), ("dbeta", got[2], want[2])):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.dtype == b.dtype and (np.abs(a - b) <= 1e-3 + 2 * 7.8e-3 * np.abs(b)).all(), (name, a[:4], b[:4])
    assert not (np.abs(-a - b) <= 1e-3 + 2 * 7.8e-3 * np.abs(b)).all(), name
print("ok")
"""


def test_sharded_along_token_dims(run_on_cpu_mesh):
    """x sharded along its leading dims: each device normalizes its rows (no all-gather) and every result is the
    unsharded call's bytes (plain, per-tensor FP8 with the amax reduced over the mesh, block formats over whole row
    groups); the gradient's dx too, dgamma / dbeta within SPEC §9's tolerance of the unsharded sums."""
    run_on_cpu_mesh(SHARDING_SCRIPT)


# ---- CUDA: the same bytes as the CPU and as tex on CUDA ----------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("mode", [None] + MODES, ids=lambda m: "plain" if m is None else m.name)
@pytest.mark.parametrize("norm", NORMS)
def test_cuda_bytes_equal_cpu(norm, mode):
    gpu = _gpu()
    assert gpu is not None, "jax sees no GPU on a machine where torch does"
    x, gamma, beta = inputs((256, 1024), jnp.bfloat16, 7)
    beta = _beta(norm, beta)
    q = None if mode is None else tej.QuantizerFactory.create(scaling_mode=mode, amax_history_len=4)
    f = jax.jit(lambda x, g, b, q: tej.normalization_fwd(x, g, b, True, 1e-5, norm, q))
    on_gpu = f(*jax.device_put((x, gamma, beta, q), gpu))
    on_cpu = f(x, gamma, beta, q)
    leaves = lambda t: [np.asarray(v).view(np.uint8).tobytes() for v in jax.tree_util.tree_leaves(t)]  # noqa: E731
    assert leaves(on_gpu) == leaves(on_cpu), f"{norm} {mode}: CUDA bytes differ from CPU bytes"
    _, mu, rsigma = on_cpu
    dz = inputs((256, 1024), jnp.bfloat16, 8)[0]
    g = jax.jit(lambda *a: tej.normalization_bwd(*a, None, True, 1e-5, norm))
    args = (dz, x, mu, rsigma, gamma)
    assert leaves(g(*jax.device_put(args, gpu))) == leaves(g(*args)), f"{norm} backward: CUDA differs from CPU"
