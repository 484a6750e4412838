"""`tej.mlp`: dense -> activation -> dense as one custom_vjp, the torch frontend's `MLP` (SPEC §8) in JAX.

Shapes (TE/JAX's layouts): x [..., K]; w1 [K, A, F] with A = 2 for a gated activation (index 0 of axis 1 feeds the
activation, index 1 is the linear half, as `tej.act_lu` takes them) and A = 1 otherwise (w1 [K, F] is accepted for
unary activations); b1 [A, F] (or [F] unary); w2 [F, N]; b2 [N]. y [..., N] in x's dtype.

Forward: h = x·w1 (+ b1) in x's dtype (kept for the backward); a = act(h) from the fused `act_lu`, which with a
quantizer comes out already quantized by the second layer's x quantizer (SPEC §5.1), straight into the second
GEMM; y = a·w2 (+ b2). Backward: dy quantized once with its dbias; da = dy·w2ᵀ; dh = act'(h)·da from the fused
`quantize_dact_dbias`, quantized for both GEMMs of the first layer with its dbias fused (unary activations; a gated
one's dbias comes from a second fused cast, `quantize_dbias`, of the unquantized dact); dx = dh·w1ᵀ, dw1 = xᵀ·dh.
Copies, split accumulation, emulated formats and the delayed-scaling cotangents are dense.py's.
"""
from __future__ import annotations

import functools
import math

import jax

from .activation_types import activation_of
from .cpp_extensions import act_lu, dact_lu, quantize, quantize_dact_dbias
from .dense import (DGRAD, FPROP, WGRAD, amax_of, as_matrix, check_alignment, check_float, copy_for, dq_dtype, flat,
                    keeps_leading_dims, lead_dims, mm, qs_cotangent, quantize_grad, resolve_quantizer_set, wgrad_plain)
from .scaled_tensor import ScaledTensor

__all__ = ["mlp"]


def fwd(x, w1, b1, w2, b2, qs1, qs2, act, a_dim, sp):
    """y [..., N] and the residuals; x [..., K] (its token dims, keeps_leading_dims), or x already quantized by
    qs1.x (a ScaledTensor: layernorm_mlp's normalized x), w1 [K, A*F], b1 [A*F], w2 [F, N], b2 [N]; sp:
    sequence_parallel (the row-parallel fc2 fprop and the column-parallel fc1 dgrad reduce-scatter along the
    tokens)."""
    lead, dtype, fdims = tuple(x.shape[:-1]), dq_dtype(x), ((len(x.shape) - 1,), (0,))
    q = qs1 is not None
    xq = quantize(x, qs1.x) if q and not isinstance(x, ScaledTensor) else x
    w1q = quantize(w1, qs1.kernel) if q else w1
    h = mm(xq, w1q, fdims, dtype, FPROP, b1, sp)                                  # [..., A*F]
    a = act_lu(h.reshape(lead + (a_dim, -1)), act, quantizer=qs2.x if q else None)  # [..., F], quantized for GEMM 2
    w2q = quantize(w2, qs2.kernel) if q else w2
    y = mm(a, w2q, fdims, dtype, FPROP, b2, sp)
    amaxes = tuple(amax_of(t) for t in (xq, w1q, a, w2q))
    res = (copy_for(xq, False), copy_for(w1q, True), h, copy_for(a, False), copy_for(w2q, True), qs1, qs2, amaxes)
    return y, res


def _dact(da, h3, act, q, with_dbias, gated):
    """(dh [..., A*F] — quantized by q when given —, dbias [A*F] or None, the cast's amax); h3 [..., A, F]. Without q,
    a gated activation's dbias is left to the wgrad GEMM's epilogue (None here)."""
    lead, cols = h3.shape[:-2], h3.shape[-2] * h3.shape[-1]
    if with_dbias and gated and q is not None:  # the fused dact + dbias kernel takes unary activations only
        dhq, db = quantize_grad(dact_lu(da, h3, act).reshape(lead + (cols,)), q, True)
        return dhq, db, dhq.amax
    dh, db = quantize_dact_dbias(da, h3, act, with_dbias and not gated, q)
    if q is None:
        return dh.reshape(lead + (cols,)), db, None
    return as_matrix(dh, lead, cols), db, dh.amax


def bwd(act, a_dim, gated, sp, with_b1, with_b2, res, dy):
    """(dx, dw1, db1, dw2, db2, dqs1, dqs2) from fwd's residuals."""
    x_r, w1_r, h, a_r, w2_r, qs1, qs2, (x_amax, w1_amax, a_amax, w2_amax) = res
    dtype = h.dtype
    dy = dy.astype(dtype)
    ddims = ((dy.ndim - 1,), (1,))
    q = qs1 is not None
    if q:
        dyq, db2 = quantize_grad(dy, qs2.dgrad, with_b2)
        da = mm(copy_for(dyq, True), w2_r, ddims, dtype, DGRAD, sequence_parallel=sp)
        dw2 = mm(a_r, copy_for(dyq, False), (lead_dims(a_r),) * 2, dtype, WGRAD)
    else:
        da = mm(dy, w2_r, ddims, dtype, DGRAD, sequence_parallel=sp)
        dw2, db2 = wgrad_plain(flat(a_r), flat(dy), False, with_b2)
    dh, db1, dh_amax = _dact(da, h.reshape(h.shape[:-1] + (a_dim, -1)), act, qs1.dgrad if q else None, with_b1,
                             gated)
    dx = mm(copy_for(dh, True), w1_r, ddims, dtype, DGRAD, sequence_parallel=sp)
    if not q:
        dw1, db_gemm = wgrad_plain(flat(x_r), flat(dh), False, with_b1 and gated)
        return dx, dw1, db1 if db_gemm is None else db_gemm, dw2, db2, None, None
    dw1 = mm(x_r, copy_for(dh, False), (lead_dims(x_r),) * 2, dtype, WGRAD)
    dqs1 = qs_cotangent(qs1, (x_amax, w1_amax, dh_amax))
    dqs2 = qs_cotangent(qs2, (a_amax, w2_amax, dyq.amax))
    return dx, dw1, db1, dw2, db2, dqs1, dqs2


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def _mlp2d(x, w1, b1, w2, b2, qs1, qs2, act, a_dim, sp):
    return fwd(x, w1, b1, w2, b2, qs1, qs2, act, a_dim, sp)[0]


def _mlp2d_fwd(x, w1, b1, w2, b2, qs1, qs2, act, a_dim, sp):
    y, res = fwd(x, w1, b1, w2, b2, qs1, qs2, act, a_dim, sp)
    return y, (res, b1 is not None, b2 is not None)


def _mlp2d_bwd(act, a_dim, sp, saved, dy):
    res, with_b1, with_b2 = saved
    return bwd(act, a_dim, activation_of(act).gated, sp, with_b1, with_b2, res, dy)


_mlp2d.defvjp(_mlp2d_fwd, _mlp2d_bwd)


def mlp(x, w1, b1, w2, b2, activation_type=("gelu",), quantizer_sets=(None, None), *, sequence_parallel=False):
    """y = act(x·w1 + b1)·w2 + b2, differentiable (custom_vjp) in x, the weights, the biases and the quantizer sets
    (their cotangents carry the delayed-scaling amaxes). Shapes in the module doc; b1 / b2 may be None.
    quantizer_sets: (qs1, qs2), the QuantizerSets of the two dense layers (qs2.x quantizes the activation), or
    (None, None): autocast's recipe, or plain GEMMs outside autocast.

    Tensor parallel under jax.jit (tej.dense's rules): w1 sharded along F on mesh axis a (column parallel, with b1)
    and w2 along F on a (row parallel), x's tokens sharded on a as well (sequence parallel): fc1's fprop and fc2's
    dgrad are all-gather rings; sequence_parallel=True makes fc2's fprop and fc1's dgrad reduce-scatter rings, so
    y and dx come back sharded along the tokens like x, with no weight gathered. The fused activation between the
    GEMMs and its backward run on each device's block of h [..., F] (sharded along F on a, and along the tokens on
    other axes; sharding.py): no gather of h, dbias of b1 summed over the token axes only. Not yet: a gated w1
    [K, 2, F] sharded along F is flattened to [K, 2F] for the GEMM, whose partitioner sees 2-D operands (a [2, F]
    sharding along F is no sharding of 2F columns), so XLA gathers w1 and b1 there (shard a unary activation's w1,
    or run gated layers without F sharding)."""
    layer = "tej.mlp"
    act = activation_of(activation_type)
    a_dim = 2 if act.gated else 1
    for name, t in (("x", x), ("w1", w1), ("w2", w2), ("b1", b1), ("b2", b2)):
        if t is not None:
            check_float(layer, name, t)
    where = (f"(x {tuple(x.shape)}, w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)}, activation {act.spelling}; w1 must be "
             f"[K, {a_dim}, F]{'' if act.gated else ' or [K, F]'}, w2 [F, N])")
    if x.ndim < 1 or w2.ndim != 2:
        raise ValueError(f"{layer}: x must be [..., K] and w2 [F, N] {where}")
    k = x.shape[-1]
    if w1.ndim == 3 and w1.shape[1] == a_dim:
        f = w1.shape[2]
    elif w1.ndim == 2 and not act.gated:
        f = w1.shape[1]
    else:
        raise ValueError(f"{layer}: w1 has shape {tuple(w1.shape)}, not the kernel {act.spelling} takes {where}")
    if w1.shape[0] != k:
        raise ValueError(f"{layer}: K mismatch: x's last dim is {k} but w1's first is {w1.shape[0]} {where}")
    if w2.shape[0] != f:
        raise ValueError(f"{layer}: F mismatch: the activation gives {f} features but w2's first dim is "
                         f"{w2.shape[0]} {where}")
    n = w2.shape[1]
    if b1 is not None and math.prod(b1.shape) != a_dim * f:
        raise ValueError(f"{layer}: b1 must be [{a_dim}, {f}] or [{a_dim * f}], got {tuple(b1.shape)} {where}")
    if b2 is not None and tuple(b2.shape) != (n,):
        raise ValueError(f"{layer}: b2 must be [{n}], got {tuple(b2.shape)} {where}")
    try:
        qs1, qs2 = quantizer_sets
    except (TypeError, ValueError):
        raise ValueError(f"{layer}: quantizer_sets must be a pair (qs1, qs2), got {quantizer_sets!r}") from None
    qs1, qs2 = resolve_quantizer_set(layer, qs1), resolve_quantizer_set(layer, qs2)
    if (qs1 is None) != (qs2 is None):
        raise ValueError(f"{layer}: quantize both dense layers or neither (qs1 {qs1}, qs2 {qs2})")
    lead = tuple(x.shape[:-1])
    m = math.prod(lead)
    check_alignment(layer, qs1, {"tokens (the product of x's leading dims)": m, "K": k, "F": f, "N": n})
    dtype = x.dtype
    x2 = x.reshape(lead + (k,) if keeps_leading_dims(qs1, lead) else (m, k))
    y = _mlp2d(x2, w1.astype(dtype).reshape(k, a_dim * f),
               None if b1 is None else b1.astype(dtype).reshape(a_dim * f), w2.astype(dtype),
               None if b2 is None else b2.astype(dtype), qs1, qs2, act.name, a_dim, bool(sequence_parallel))
    return y.reshape(lead + (n,))
