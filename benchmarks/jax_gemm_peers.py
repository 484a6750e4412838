"""The peers of bench_jax_gemm.py: XLA's GEMMs (jax.lax.dot_general in bf16 and on FP8 operands,
jax.lax.ragged_dot), torch's grouped GEMMs (torch._grouped_mm, torch._scaled_grouped_mm), the plain Flax NNX bf16 MLP,
the MoE group sizes and the float64 checks. Nothing here imports transformer_engine_jax or transformer_engine_torch.

Layouts are those of the fprop: x [M, K] row-major, w [N, K] (dense) or [G, N, K] (grouped), out = x · wᵀ [M, N].
"""
import jax
import jax.numpy as jnp
import numpy as np
import torch

TN = (((1,), (1,)), ((), ()))  # dot_general dimension numbers of x [M, K] · w [N, K]ᵀ
BF16_TOL = (1.6e-2, 2e-2)  # (rtol, atol) of a bf16 output against float64 (outputs ~ N(0, 1): w is scaled by K^-0.5)
E4M3_TOL = (0.125, 0.0675)  # SPEC §9, on the dequantized values (bench_gemm's TOL_E4M3)
# XLA's FP8 GEMM takes cuBLASLt's fast accumulation at the DEFAULT operand precision and full-precision
# accumulation at HIGHEST (xla/service/gpu/matmul_utils.cc: fast_accum = compute_precision <= 1), so each of our
# accumulation modes meets XLA's at the precision that selects the same one.
XLA_PRECISION = {"fast": jax.lax.Precision.DEFAULT, "split": jax.lax.Precision.HIGHEST}


# ---- dense --------------------------------------------------------------------------------------------------------
def dot_bf16(x, w):
    """jnp.dot(x, w.T) as XLA sees it: one dot_general, bf16 out (cuBLAS on the GPU)."""
    return jax.lax.dot_general(x, w, TN, preferred_element_type=jnp.bfloat16)


def dot_fp8_dequant(accum):
    """XLA's documented FP8 pattern: each operand converted and multiplied by its scale_inv (f32[1]), then the dot;
    XLA's GEMM rewriter folds the converts and scales into one cuBLASLt FP8 call with the scales as its A/B scales."""
    def f(x8, sx, w8, sw):
        a = x8.astype(jnp.bfloat16) * sx.astype(jnp.bfloat16)
        b = w8.astype(jnp.bfloat16) * sw.astype(jnp.bfloat16)
        return jax.lax.dot_general(a, b, TN, precision=XLA_PRECISION[accum], preferred_element_type=jnp.bfloat16)
    return f


def dot_fp8_direct(accum):
    """dot_general on the float8_e4m3fn operands themselves (bf16 out), then the product of the two scale_invs."""
    def f(x8, sx, w8, sw):
        y = jax.lax.dot_general(x8, w8, TN, precision=XLA_PRECISION[accum], preferred_element_type=jnp.bfloat16)
        return (y.astype(jnp.float32) * (sx * sw)).astype(jnp.bfloat16)
    return f


# ---- grouped ------------------------------------------------------------------------------------------------------
def ragged_dot(x, w_kn, group_sizes):
    """jax.lax.ragged_dot: x [M_total, K] · w_kn [G, K, N] per group of rows; rows past sum(group_sizes) are zero."""
    return jax.lax.ragged_dot(x, w_kn, group_sizes, preferred_element_type=jnp.bfloat16)


def torch_grouped_mm(x, w_nk, offs):
    """torch._grouped_mm on x [M_total, K] and w [G, N, K] (as its column-major [G, K, N] view); offs int32 [G] are the
    cumulative group ends. Rows past offs[-1] are left unwritten."""
    return torch._grouped_mm(x, w_nk.transpose(-2, -1), offs=offs)


def torch_scaled_grouped_mm(x8, w8_nk, scale_rows, scale_cols, offs, fast_accum):
    """torch._scaled_grouped_mm (rowwise scales: scale_rows f32 [M_total], scale_cols f32 [G, N], dequantization
    factors) on E4M3 bytes; the per-tensor scales of our operands expanded to its rowwise form."""
    return torch._scaled_grouped_mm(x8, w8_nk.transpose(-2, -1), scale_rows, scale_cols, offs=offs,
                                    out_dtype=torch.bfloat16, use_fast_accum=fast_accum)


def group_sizes(kind, groups, rows_per_group, seed=21, empty=3):
    """int64 [groups] summing to groups * rows_per_group: 'balanced' (all equal) or 'skewed' (a fixed-seed
    Dirichlet(0.3) draw with `empty` groups forced to zero, the remainder on the largest group)."""
    total = groups * rows_per_group
    if kind == "balanced":
        return np.full(groups, rows_per_group, np.int64)
    r = np.random.default_rng(seed)
    p = r.dirichlet(np.full(groups, 0.3))
    p[r.choice(groups, min(empty, groups - 1), replace=False)] = 0.0
    sizes = np.floor(p / p.sum() * total).astype(np.int64)
    sizes[np.argmax(sizes)] += total - sizes.sum()
    return sizes


# ---- checks -------------------------------------------------------------------------------------------------------
def tol_excess(got, ref, tol):
    """max |got - ref| / (atol + rtol |ref|) in float64: <= 1 is within the tolerance."""
    rtol, atol = tol
    got = np.asarray(got, np.float64)
    if got.size == 0:
        return 0.0
    if not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.max(np.abs(got - ref) / (atol + rtol * np.abs(ref))))


def tol_excess_device(got, want, tol):
    """tol_excess on the device, in float32 (full grouped outputs: 40960 x 2048 would take seconds on the host). got:
    a jax array or a torch tensor (taken through dlpack); want: float32 jax array of the same shape."""
    rtol, atol = tol
    if isinstance(got, torch.Tensor):
        got = jnp.from_dlpack(got.detach().contiguous())
    if got.size == 0:
        return 0.0
    g = got.astype(jnp.float32)
    excess = jnp.where(jnp.isfinite(g), jnp.abs(g - want) / (atol + rtol * jnp.abs(want)), jnp.inf)
    return float(jnp.max(excess))


def to_f64(a, scale_inv=None):
    """A jax array (bf16, FP8) on the host in float64, times its scale_inv when given."""
    v = np.asarray(a).astype(np.float64)
    return v if scale_inv is None else v * float(np.asarray(scale_inv).reshape(-1)[0])


# ---- Flax NNX bf16 MLP (the plain-Flax peer of tej.flax.MLP) -------------------------------------------------------
def flax_mlp(nnx, hidden, ffn, seed=0):
    """fc2(gelu(fc1(x))) from nnx.Linear layers, bf16 parameters and compute (tanh GELU, as the core's functor)."""
    class PlainMLP(nnx.Module):
        def __init__(self, rngs):
            kw = dict(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, rngs=rngs)
            self.fc1 = nnx.Linear(hidden, ffn, **kw)
            self.fc2 = nnx.Linear(ffn, hidden, **kw)

        def __call__(self, x):
            return self.fc2(jax.nn.gelu(self.fc1(x), approximate=True))

    return PlainMLP(nnx.Rngs(seed))


def sgd_step(nnx, lr=1e-3):
    """One train step under nnx.jit: mean-squared-error loss, its gradients w.r.t. the nnx.Param leaves (fwd + bwd),
    and a plain SGD update of them in place; returns the loss. Other variables (FP8 scaling state) are updated by the
    model's own forward."""
    @nnx.jit
    def step(model, x, y):
        def loss_fn(m):
            return jnp.mean(jnp.square(m(x).astype(jnp.float32) - y.astype(jnp.float32)))

        loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, nnx.Param))(model)
        params = nnx.state(model, nnx.Param)
        nnx.update(model, jax.tree.map(lambda p, g: (p - lr * g.astype(jnp.float32)).astype(p.dtype), params, grads))
        return loss
    return step
