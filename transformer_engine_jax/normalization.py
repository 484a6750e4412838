"""`tej.layernorm` and its FFI calls: LayerNorm and RMSNorm over the last dim (SPEC §11), the output plain or
quantized in any format by the core's norm producer, with FP32 statistics; the backward gives dx, dgamma, dbeta.

- `normalization_fwd(x, gamma, beta, zero_centered_gamma, epsilon, norm_type, quantizer)` -> (out, mu, rsigma): out
  is x's dtype without a quantizer, else the ScaledTensor `act_lu` returns for that quantizer (every copy the layout
  asks for); mu (LayerNorm only, else None) and rsigma float32 of x's leading shape.
- `normalization_bwd(dz, x, mu, rsigma, gamma, beta, zero_centered_gamma, epsilon, norm_type)` -> (dx, dgamma,
  dbeta): dx in x's dtype, dgamma / dbeta in gamma's (dbeta None for RMSNorm).
- `layernorm(x, gamma, beta, norm_type, zero_centered_gamma, epsilon, quantizer)`: differentiable (custom_vjp), TE/JAX's
  `layernorm`: with a quantizer the forward quantizes and dequantizes to x's dtype (the values a following GEMM
  sees), and the backward takes the cotangent straight through the quantization, as `tej.activation` does.

Output shapes and dtypes, the workspace and every check come from the core's plan (`_ffi.plan_norm_fwd` /
`plan_norm_bwd`, the planner the handlers run), made once per signature at trace time; bad input raises there with
the core's message. Buffers in the handlers' order (csrc/jax/norm.cpp):
  te_norm_fwd  args x gamma beta scale amax rng; results data colwise_data scale_inv colwise_scale_inv amax
               colwise_amax mu rsigma workspace
  te_norm_bwd  args dz x mu rsigma gamma; results dx dgamma dbeta workspace

Sharding: under jax.jit with x sharded along its leading (token) dims each device normalizes its rows (the
statistics are per row): the plain output, mu and rsigma are the unsharded bytes. A quantized output is partitioned
as `act_lu`'s (cpp_extensions._row_group): per-tensor scaling along x's leading dims with the amax reduced over the
mesh, block formats over whole groups of rows, otherwise unpartitioned. x's last dim (the normalized one) is whole on
every device. The backward's dgamma / dbeta are each shard's FP32 row sums, added over the mesh and rounded once to
gamma's dtype (another addition order than the unsharded kernel's: SPEC §9's dbias tolerance, not bit for bit).
"""
from __future__ import annotations

import functools
import math
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi
from .cpp_extensions import (_GLOBAL_AMAX, _WORKSPACE_ALIGN, _attrs, _call, _check_float, _data_dtype, _mode,
                             _out_lead, _quantizer_inputs, _register, _row_group, _scaled, global_amax_call,
                             split_groups)
from .dtype_codes import CODE, DTYPE
from .sharding import along_leading_dims

__all__ = ["layernorm", "normalization_fwd", "normalization_bwd", "NORM_TYPES"]

# The core's norm kinds (the handlers' `norm_type` attribute).
NORM_TYPES = {"layernorm": 0, "rmsnorm": 1}
_BYTE = 0


def _norm_code(op: str, norm_type) -> int:
    if norm_type not in NORM_TYPES:
        raise ValueError(f"{op}: norm_type must be one of {', '.join(map(repr, NORM_TYPES))}, got {norm_type!r}")
    return NORM_TYPES[norm_type]


def _epsilon(op: str, epsilon) -> float:
    """epsilon as the handlers' float64 attribute (the torch frontend's double); it is static (a Python or NumPy
    number), the core checks its value (> 0 and finite)."""
    if isinstance(epsilon, (bool, np.bool_)) or not isinstance(epsilon, numbers.Real):
        raise TypeError(f"{op}: epsilon must be a Python float (static, not traced), got {type(epsilon).__name__}")
    return float(epsilon)


def _beta_of(op: str, code: int, beta):
    if code == NORM_TYPES["rmsnorm"] and beta is not None:
        raise ValueError(f"{op}: rmsnorm takes no beta (y = x * rsigma * gamma), got beta of shape "
                         f"{tuple(beta.shape)}; pass beta=None")
    if code == NORM_TYPES["layernorm"] and beta is None:
        raise ValueError(f"{op}: layernorm needs beta of shape [H] (zeros for none)")
    return beta


def _code(op: str, what: str, a) -> int:
    """The core's DType code of a float argument (TypeError naming it otherwise)."""
    return CODE[_check_float(op, what, a)]


# ---- trace-time plans ----------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def _cached_fwd_plan(code, zero_centered_gamma, epsilon, otype, x_shape, x_dtype, gamma_shape, gamma_dtype,
                     beta_shape, beta_dtype, attrs):
    """The core's forward plan of one signature, for every platform the trace may lower to (any_device): the
    quantized pieces (te::ops::Piece order), mu, rsigma and the workspace bytes. Errors are not cached."""
    plan = _ffi.plan_norm_fwd(code, zero_centered_gamma, epsilon, otype, list(x_shape), x_dtype, list(gamma_shape),
                              gamma_dtype, list(beta_shape), beta_dtype, _ffi.QuantizerAttrs(**dict(attrs)),
                              cuda=False, any_device=True)
    piece = lambda p: (bool(p[0]), int(p[1]), tuple(p[2]))  # noqa: E731
    return (tuple(piece(p) for p in plan["pieces"]), piece(plan["mu"]), piece(plan["rsigma"]),
            int(plan["workspace_bytes"]))


@functools.lru_cache(maxsize=4096)
def _cached_bwd_plan(code, zero_centered_gamma, dz_shape, dz_dtype, x_shape, x_dtype, mu_shape, rsigma_shape,
                     stat_dtype, gamma_shape, gamma_dtype):
    """The core's backward plan of one signature: dx, dgamma, dbeta (present, dtype, shape) and the workspace (the
    same on every device: the partial-sum layout is a function of the shape)."""
    plan = _ffi.plan_norm_bwd(code, zero_centered_gamma, list(dz_shape), dz_dtype, list(x_shape), x_dtype,
                              list(mu_shape), list(rsigma_shape), stat_dtype, list(gamma_shape), gamma_dtype,
                              cuda=False)
    piece = lambda p: (bool(p[0]), int(p[1]), tuple(p[2]))  # noqa: E731
    return piece(plan["dx"]), piece(plan["dgamma"]), piece(plan["dbeta"]), int(plan["workspace_bytes"])


def _attrs_key(attrs: dict) -> tuple:
    return tuple((k, v.item() if isinstance(v, np.generic) else v) for k, v in attrs.items())


def _shape_of(piece, data_dtype=None):
    """A planned piece as an XLA result (absent: a 0-element uint8 result); byte pieces typed as data_dtype."""
    present, code, shape = piece
    if not present:
        return jax.ShapeDtypeStruct((0,), jnp.uint8)
    dtype = (data_dtype if data_dtype is not None else jnp.uint8) if code == _BYTE else DTYPE[code]
    return jax.ShapeDtypeStruct(shape, dtype)


def _fwd_plan(op, x, gamma, beta, code, zero_centered_gamma, epsilon, quantizer, otype=None, **call):
    """(attrs, otype, pieces, mu, rsigma, workspace bytes) of one forward call; raises on bad input. otype: the
    plain output's DType code (default x's)."""
    x_dtype, g_dtype = _code(op, "x", x), _code(op, "gamma", gamma)
    b_shape, b_dtype = ((), -1) if beta is None else (tuple(beta.shape), _code(op, "beta", beta))
    attrs = _attrs(quantizer, **call)
    otype = x_dtype if otype is None else otype
    return (attrs, otype, *_cached_fwd_plan(code, bool(zero_centered_gamma), float(epsilon), otype,
                                            tuple(map(int, x.shape)),
                                     x_dtype, tuple(map(int, gamma.shape)), g_dtype, tuple(map(int, b_shape)),
                                     b_dtype, _attrs_key(attrs)))


def _fwd_call(x, gamma, beta, code, zero_centered_gamma, epsilon, quantizer, amax=None, otype=None):
    """One te_norm_fwd call on one device's arrays: [data .. colwise_amax, mu, rsigma] (handler order) and the plan's
    pieces. amax: current scaling / NVFP4 cast with this (already reduced) amax; otype: the plain output's DType
    code."""
    _register()
    attrs, otype, pieces, mu, rsigma, ws = _fwd_plan("normalization_fwd", x, gamma, beta, code, zero_centered_gamma,
                                                     epsilon, quantizer, otype, amax_given=amax is not None)
    data_dtype = None if quantizer is None else _data_dtype(quantizer)
    # te::ops::Piece order -> the handler's results: data, colwise data, scale_inv, colwise scale_inv, amaxes
    results = [_shape_of(pieces[i], data_dtype if i in (0, 2) else None) for i in (0, 2, 1, 3, 4, 5)]
    results[4] = jax.ShapeDtypeStruct((1,), jnp.float32)  # always f32[1]: aliased to the amax argument when read
    results += [_shape_of(mu), _shape_of(rsigma), jax.ShapeDtypeStruct((ws + _WORKSPACE_ALIGN,), jnp.uint8)]
    scale, amax_in, rng, amax_read = _quantizer_inputs(quantizer, amax)
    beta_in = jnp.zeros((0,), gamma.dtype) if beta is None else beta
    out = jax.ffi.ffi_call("te_norm_fwd", results, input_output_aliases={4: 4} if amax_read else {},
                           vmap_method="sequential")(
        x, gamma, beta_in, scale, amax_in, rng, norm_type=np.int64(code),
        zero_centered_gamma=bool(zero_centered_gamma), epsilon=float(epsilon), otype=np.int64(otype),
        quantizer=attrs)
    return list(out[:8]), pieces


class _FwdStatic(NamedTuple):
    """The static part of a partitioned forward. Its arrays: x (own leading dims, or [G, group, H] when grouped),
    gamma, [beta], the quantizer's leaves (structure `qdef`)."""
    code: int
    zero_centered_gamma: bool
    epsilon: float
    has_beta: bool
    qdef: object
    grouped: bool
    out_lead: tuple


def _fwd_shard(c: _FwdStatic, axes, last_axes, x, gamma, *rest):
    """The forward on one device's rows. Per-tensor amaxes are the unsharded call's (cpp_extensions.global_amax_call):
    delayed scaling's reduced after the cast; current scaling and NVFP4, whose scale needs the amax of the whole FP32
    y first, normalize to FP32 y here and quantize it with the reduced amax (the core's norm output is by definition
    that quantize of its FP32 y, so the bytes are the unsharded call's)."""
    beta = rest[0] if c.has_beta else None
    quantizer = jax.tree_util.tree_unflatten(c.qdef, rest[c.has_beta:])
    lead = x.shape[:-1]
    if c.grouped:
        x = x.reshape(-1, x.shape[-1])
    norm = functools.partial(_fwd_call, x, gamma, beta, c.code, c.zero_centered_gamma, c.epsilon)
    every = axes + last_axes
    if every and _mode(quantizer) in _GLOBAL_AMAX:
        plain = norm(None, otype=CODE[jnp.dtype(jnp.float32)])[0]
        y = plain[0].reshape(x.shape)
        cast = functools.partial(_call, "te_quantize", "quantize", None, False, False, y, y.shape, None, quantizer)
        out = global_amax_call(lambda amax, amax_only: cast(amax, amax_only=amax_only)[0], quantizer, every)
        out = list(out[:6]) + plain[6:8]
    else:
        out = global_amax_call(lambda amax, amax_only: norm(quantizer, amax)[0], quantizer, every)
    if c.grouped:
        out[:6] = split_groups(out[:6], c.out_lead, lead[0])
    out[6:8] = [s.reshape(lead) if s.size else s for s in out[6:8]]  # mu (LayerNorm), rsigma: per row
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _partitioned_fwd(c: _FwdStatic, n_args: int):
    """The partitioned forward of one static configuration, made once (jax caches by its identity): x's leading
    dims (or row groups) sharded, gamma, beta and the quantizer replicated; mu and rsigma sharded as x's rows."""
    stats = (0 if c.has_beta else None, 0)  # RMSNorm's mu: a 0-element placeholder
    return along_leading_dims(functools.partial(_fwd_shard, c), (0,) + (None,) * (n_args - 1), c.out_lead + stats, 1)


def normalization_fwd(x, gamma, beta, zero_centered_gamma=False, epsilon=1e-5, norm_type="layernorm",
                      quantizer=None):
    """(out, mu, rsigma) of LayerNorm / RMSNorm of x [..., H] over H (SPEC §11). Not differentiable: `layernorm`
    is. Partitioned along x's leading dims under jax.jit with a sharded x (module docstring)."""
    op = "normalization_fwd"
    code = _norm_code(op, norm_type)
    beta = _beta_of(op, code, beta)
    eps = _epsilon(op, epsilon)
    _, _, pieces, mu_p, _, _ = _fwd_plan(op, x, gamma, beta, code, zero_centered_gamma, eps, quantizer)  # checked
    rows = int(np.prod(x.shape[:-1], dtype=np.int64))
    group = _row_group(quantizer, rows)
    if group is None or x.ndim < 2:
        out, pieces = _fwd_call(x, gamma, beta, code, zero_centered_gamma, eps, quantizer)
        out[6:8] = [s.reshape(x.shape[:-1]) if p[0] else None for s, p in zip(out[6:8], (mu_p, (True,)))]
    else:
        xs = x.reshape(rows // group, group, x.shape[-1]) if group else x
        c = _FwdStatic(code, bool(zero_centered_gamma), float(eps), beta is not None,
                       jax.tree_util.tree_structure(quantizer), group > 0, _out_lead(quantizer, False))
        arrays = [xs, gamma] + ([] if beta is None else [beta]) + jax.tree_util.tree_leaves(quantizer)
        out = list(_partitioned_fwd(c, len(arrays))(*arrays))
        if group:  # the grouped view's results in the unsharded shapes
            out[:6] = [o.reshape(pieces[k][2]) if pieces[k][0] else o for o, k in zip(out[:6], (0, 2, 1, 3, 4, 5))]
        out[6:8] = [s.reshape(x.shape[:-1]) if p[0] else None for s, p in zip(out[6:8], (mu_p, (True,)))]
    mu, rsigma = out[6], out[7]
    if quantizer is None:
        return out[0].reshape(x.shape), mu, rsigma
    return _scaled(out, pieces, quantizer, x.shape, x.dtype), mu, rsigma


# ---- backward ------------------------------------------------------------------------------------------------
def _bwd_plan(op, dz, x, mu, rsigma, gamma, code, zero_centered_gamma):
    """(dx, dgamma, dbeta pieces, workspace bytes) of one backward call; raises on bad input."""
    if jnp.dtype(dz.dtype) != jnp.dtype(x.dtype):
        raise TypeError(f"{op}: dz dtype {jnp.dtype(dz.dtype)} must match x dtype {jnp.dtype(x.dtype)}")
    if rsigma is None:
        raise ValueError(f"{op}: rsigma (the forward's 1/sigma per row) is required, got None")
    for name, s in (("mu", mu), ("rsigma", rsigma)):
        if s is not None and jnp.dtype(s.dtype) != jnp.float32:
            raise TypeError(f"{op}: {name} must be float32 (the forward's statistics), got {jnp.dtype(s.dtype)} with "
                            f"shape {tuple(s.shape)}")
    mu_shape = () if mu is None else tuple(map(int, mu.shape))
    return _cached_bwd_plan(code, bool(zero_centered_gamma), tuple(map(int, dz.shape)), _code(op, "dz", dz),
                            tuple(map(int, x.shape)), _code(op, "x", x), mu_shape, tuple(map(int, rsigma.shape)), CODE[jnp.dtype(jnp.float32)],
                            tuple(map(int, gamma.shape)), _code(op, "gamma", gamma))


def _bwd_call(dz, x, mu, rsigma, gamma, code, zero_centered_gamma):
    """One te_norm_bwd call on one device's arrays: [dx, dgamma, dbeta (RMSNorm: a 0-element placeholder)]."""
    _register()
    dx, dgamma, dbeta, ws = _bwd_plan("normalization_bwd", dz, x, mu, rsigma, gamma, code, zero_centered_gamma)
    results = [_shape_of(dx), _shape_of(dgamma), _shape_of(dbeta),
               jax.ShapeDtypeStruct((ws + _WORKSPACE_ALIGN,), jnp.uint8)]
    mu_in = jnp.zeros((0,), jnp.float32) if mu is None else mu
    out = jax.ffi.ffi_call("te_norm_bwd", results, vmap_method="sequential")(
        dz, x, mu_in, rsigma, gamma, norm_type=np.int64(code), zero_centered_gamma=bool(zero_centered_gamma))
    return list(out[:3])


class _BwdStatic(NamedTuple):
    code: int
    zero_centered_gamma: bool
    has_mu: bool


def _bwd_shard(c: _BwdStatic, axes, last_axes, dz, x, *rest):
    mu, rsigma, gamma = rest if c.has_mu else (None, *rest)
    if not axes:
        return tuple(_bwd_call(dz, x, mu, rsigma, gamma, c.code, c.zero_centered_gamma))
    # gamma in float32 (exact; the kernel computes in FP32 either way) makes the shard's dgamma / dbeta its FP32 row
    # sums: added over the mesh, then rounded once to gamma's dtype
    dx, dgamma, dbeta = _bwd_call(dz, x, mu, rsigma, gamma.astype(jnp.float32), c.code, c.zero_centered_gamma)
    dgamma = jax.lax.psum(dgamma, axes).astype(gamma.dtype)
    dbeta = jax.lax.psum(dbeta, axes).astype(gamma.dtype) if dbeta.size else dbeta
    return dx, dgamma, dbeta


@functools.lru_cache(maxsize=None)
def _partitioned_bwd(c: _BwdStatic):
    """dz, x, [mu], rsigma sharded along x's leading dims, gamma replicated; dx sharded as x, dgamma and dbeta
    replicated (summed over the shards)."""
    return along_leading_dims(functools.partial(_bwd_shard, c), (0, 0) + (0,) * (1 + c.has_mu) + (None,),
                              (0, None, None), 1)


def normalization_bwd(dz, x, mu, rsigma, gamma, beta=None, zero_centered_gamma=False, epsilon=1e-5,
                      norm_type="layernorm"):
    """(dx, dgamma, dbeta) of normalization_fwd (SPEC §11; dbeta None for RMSNorm), partitioned along x's leading
    dims under jax.jit with a sharded x. `beta` and `epsilon` are accepted for TE/JAX's signature and not read (the
    statistics hold epsilon)."""
    del beta, epsilon
    op = "normalization_bwd"
    code = _norm_code(op, norm_type)
    if code == NORM_TYPES["layernorm"] and mu is None:
        raise ValueError(f"{op}: layernorm's backward needs mu (the forward's mean), got None")
    mu = mu if code == NORM_TYPES["layernorm"] else None
    _bwd_plan(op, dz, x, mu, rsigma, gamma, code, zero_centered_gamma)  # the checks, at trace time
    if x.ndim < 2:
        dx, dgamma, dbeta = _bwd_call(dz, x, mu, rsigma, gamma, code, zero_centered_gamma)
    else:
        c = _BwdStatic(code, bool(zero_centered_gamma), mu is not None)
        dx, dgamma, dbeta = _partitioned_bwd(c)(dz, x, *([] if mu is None else [mu]), rsigma, gamma)
    return dx, dgamma, (dbeta if code == NORM_TYPES["layernorm"] else None)


# ---- the differentiable op -----------------------------------------------------------------------------------
@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _layernorm(x, gamma, beta, norm_type, zero_centered_gamma, epsilon, quantizer):
    return _layernorm_fwd(x, gamma, beta, norm_type, zero_centered_gamma, epsilon, quantizer)[0]


def _layernorm_fwd(x, gamma, beta, norm_type, zero_centered_gamma, epsilon, quantizer):
    out, mu, rsigma = normalization_fwd(x, gamma, beta, zero_centered_gamma, epsilon, norm_type, quantizer)
    y = out if quantizer is None else out.dequantize(x.dtype)
    return y, (x, mu, rsigma, gamma, beta, quantizer)


def _layernorm_bwd(norm_type, zero_centered_gamma, epsilon, residuals, dy):
    x, mu, rsigma, gamma, beta, quantizer = residuals
    dx, dgamma, dbeta = normalization_bwd(dy.astype(x.dtype), x, mu, rsigma, gamma, None, zero_centered_gamma,
                                          epsilon, norm_type)
    return dx, dgamma, (None if beta is None else dbeta), jax.tree_util.tree_map(jnp.zeros_like, quantizer)


_layernorm.defvjp(_layernorm_fwd, _layernorm_bwd)


def layernorm(x, gamma, beta=None, norm_type="layernorm", zero_centered_gamma=False, epsilon=1e-5, quantizer=None):
    """LayerNorm (norm_type "layernorm": needs beta) or RMSNorm ("rmsnorm": beta None) of x [..., H] over H, with
    gamma (and beta) [H]; differentiable in x, gamma and beta. Without a quantizer the output is x's dtype; with one
    it is quantized by the core's norm kernel and dequantized to x's dtype (normalization_fwd returns the
    ScaledTensor itself). Bad input raises at trace time, naming the argument."""
    op = "layernorm"
    code = _norm_code(op, norm_type)
    _beta_of(op, code, beta)
    return _layernorm(x, gamma, beta, norm_type, bool(zero_centered_gamma), float(_epsilon(op, epsilon)), quantizer)
