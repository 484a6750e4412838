"""`tej.gemm`: a GEMM through the core's GEMM op (csrc/core/ops/gemm_op) as the XLA FFI call `te_gemm` — cuBLASLt on
CUDA (with the unfused epilogue where it has no kernel, SPEC §6.2), the exact CPU kernel on the CPU (SPEC §6.7), the
same bytes as the torch frontend's `generic_gemm` for the same operand bytes.

out = lhs · rhs contracted over `contracting_dims`; its shape is lhs's non-contracting dims followed by rhs's. Each
operand is flattened to 2-D: plain operands whose contracting dims form a leading or trailing block (in the given
order) are passed as they are and the kernel's transpose flags say which; other dim orders are transposed by XLA
first. A ScaledTensor is never transposed here: its rowwise copy serves a contraction over its last dim (any
trailing block for FP8 per-tensor), its colwise copy (stored transposed) one over all its leading dims, so FP8
always reaches the kernel as TN (SPEC §6.4). The output dtype is the operands' (a ScaledTensor's dequantized dtype).

Shapes, dtypes, the workspace and every check come from the core's planner (`_ffi.plan_gemm`) at trace time, so a
bad call raises ValueError / TypeError / NotImplementedError before XLA runs, with the core's message (the core names
rhs "A" and lhs "B": D = op(B)·op(A), csrc/jax/gemm.h).
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from . import _ffi
from . import collective_ffi as F
from .cpp_extensions import _NVFP4, _register, quantize
from .dtype_codes import CODE, DTYPE
from .quantizers import Quantizer, ScalingMode
from .ring import ring_all_gather, ring_reduce_scatter
from .scaled_tensor import ScaledTensor
from .sharding import _mesh_axes

_TARGET = "te_gemm"
_PLAIN = (jnp.dtype(jnp.float32), jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
# te::GemmScaling codes of the ScaledTensor modes the GEMM takes.
_SCALING = {ScalingMode.DELAYED_TENSOR_SCALING: 1, ScalingMode.CURRENT_TENSOR_SCALING: 1,
            ScalingMode.MXFP8_1D_SCALING: 2, ScalingMode.NVFP4_1D_SCALING: 3, ScalingMode.NVFP4_2D_SCALING: 3,
            ScalingMode.BLOCK_SCALING_1x128: 4, ScalingMode.BLOCK_SCALING_128x128: 5}
_PER_TENSOR = (ScalingMode.DELAYED_TENSOR_SCALING, ScalingMode.CURRENT_TENSOR_SCALING)
# jax's matmul precision names under which fp32 operands may run on TF32 tensor cores; anything else (the default
# included) keeps full FP32, as torch's default "highest" does.
_TF32_PRECISIONS = ("tensorfloat32", "fastest")


def describe(x) -> str:
    if isinstance(x, ScaledTensor):
        return f"ScaledTensor{tuple(x.shape)} {x.scaling_mode.name} {jnp.dtype(_copy_dtype(x))}"
    return f"{jnp.dtype(x.dtype)}{tuple(x.shape)}"


def _copy_dtype(x: ScaledTensor):
    return (x.data if x.data is not None else x.colwise_data).dtype


def _normalize(dims, ndim: int, name: str, where: str) -> tuple:
    dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    out = []
    for d in dims:
        if not isinstance(d, (int, np.integer)) or not -ndim <= d < ndim:
            raise ValueError(f"tej.gemm: {name} contracting dim {d!r} is out of range for a {ndim}-D operand {where}")
        out.append(int(d) % ndim)
    if len(set(out)) != len(out) or not out:
        raise ValueError(f"tej.gemm: {name} contracting dims {dims} must be distinct and at least one {where}")
    return tuple(out)


def _block(contract: tuple, ndim: int) -> str | None:
    """'last' when `contract` (in its given order) is the trailing block of dims, 'first' when it is the leading
    block, else None."""
    n = len(contract)
    if contract == tuple(range(ndim - n, ndim)) and n < ndim:
        return "last"
    if contract == tuple(range(n)) and n < ndim:
        return "first"
    if n == ndim and contract == tuple(range(ndim)):
        return "last"
    return None


class _Operand:
    """One operand as the call passes it: the 2-D buffer (K last unless `k_first`), its scale_inv, the te::GemmScaling
    code, its non-contracting dims, its nominal dtype (a ScaledTensor's dequantized dtype) and, NVFP4, its copy's
    global amax f32[1]."""

    def __init__(self, data, scale_inv, scaling, k_first, outer_shape, dtype, amax=None):
        self.data, self.scale_inv, self.scaling, self.k_first = data, scale_inv, scaling, k_first
        self.outer_shape, self.dtype, self.amax = outer_shape, jnp.dtype(dtype), amax


def _plain_operand(x, contract, name) -> _Operand:
    dtype = jnp.dtype(x.dtype)
    if dtype not in _PLAIN:
        raise TypeError(f"tej.gemm: {name} must be float32, float16, bfloat16 or a ScaledTensor, got {dtype} with "
                        f"shape {tuple(x.shape)}")
    outer = [d for d in range(x.ndim) if d not in contract]
    outer_shape = tuple(x.shape[d] for d in outer)
    k = math.prod(x.shape[d] for d in contract)
    m = math.prod(outer_shape)
    block = _block(contract, x.ndim)
    if block is None:  # a dim order cuBLASLt's flags cannot express: XLA transposes (plain operands only)
        x = jnp.transpose(x, outer + list(contract))
        block = "last"
    data = x.reshape((k, m) if block == "first" else (m, k))
    return _Operand(data, jnp.zeros((0,), jnp.float32), 0, block == "first", outer_shape, dtype)


def _scaled_operand(x: ScaledTensor, contract, name) -> _Operand:
    mode = x.scaling_mode
    if mode not in _SCALING:
        raise NotImplementedError(
            f"tej.gemm: not yet supported: {name} {describe(x)}: {mode.name} has no GEMM; dequantize it "
            f"(x.dequantize()) or use an FP8 per-tensor, MXFP8, NVFP4 or FP8 block recipe")
    nd = len(x.shape)
    n = len(contract)
    per_tensor = mode in _PER_TENSOR
    # Rowwise: blocks (and the data's rows) run along the last dim; per-tensor data may be flattened further.
    rowwise = contract == tuple(range(nd - n, nd)) and (per_tensor or n == 1)
    colwise = not rowwise and contract == tuple(range(nd - 1)) and nd >= 2
    if not (rowwise or colwise):
        raise ValueError(
            f"tej.gemm: {name} {describe(x)} contracts over dims {contract}, which neither of its copies holds "
            f"K-contiguous: the rowwise copy serves a contraction over its last dim"
            f"{' (or a trailing block of dims)' if per_tensor else ''}, the colwise copy one over all its leading "
            f"dims {tuple(range(nd - 1))}. FP8 bytes are not transposed here: quantize the operand in the layout "
            f"the GEMM contracts, or pass it unquantized")
    if rowwise:
        if x.data is None:
            raise ValueError(f"tej.gemm: {name} {describe(x)} contracts over its last dim and needs its rowwise "
                             f"copy; quantize it with q_layout ROWWISE or ROWWISE_COLWISE")
        data, scale_inv = x.data, x.scale_inv
        outer_shape = tuple(x.shape[:nd - n])
        k = math.prod(x.shape[nd - n:])
    else:
        if x.colwise_data is None:
            raise ValueError(f"tej.gemm: {name} {describe(x)} contracts over its leading dims and needs its colwise "
                             f"copy (FP8 runs as TN: the transposed copy, never a transpose of FP8 bytes); quantize "
                             f"it with q_layout COLWISE or ROWWISE_COLWISE")
        data, scale_inv = x.colwise_data, x.colwise_scale_inv
        outer_shape = (x.shape[-1],)
        k = math.prod(x.shape[:-1])
    m = math.prod(outer_shape)
    if mode == ScalingMode.MXFP8_1D_SCALING:
        # MXFP8's colwise copy is not transposed: the stored [K, M] matrix, its blocks down the rows. The core
        # takes GEMM-swizzled scales (SPEC §4.8); tej keeps them compact, so they are permuted here (a layout
        # change of the small scale matrix, no arithmetic).
        data = data.reshape((m, k) if rowwise else (k, m))
        return _Operand(data, _swizzle_block_scales(scale_inv, not rowwise), _SCALING[mode], not rowwise,
                        outer_shape, x.dq_dtype)
    if mode in _NVFP4:
        # Both copies hold K along their rows (the colwise one is x^T), two E2M1 codes a byte; the core takes the
        # GEMM-swizzled E4M3 scales (SPEC §4.8) and the copy's global amax (folded into alpha, SPEC §6.7).
        amax = x.amax if rowwise else x.colwise_amax
        if amax is None:
            raise ValueError(f"tej.gemm: {name} {describe(x)} has no {'amax' if rowwise else 'colwise_amax'}; an "
                             f"NVFP4 GEMM needs its copy's global amax")
        return _Operand(data.reshape(m, k // 2), _swizzle_block_scales(scale_inv, False), _SCALING[mode], False,
                        outer_shape, x.dq_dtype, amax.reshape(1).astype(jnp.float32))
    return _Operand(data.reshape(m, k), scale_inv, _SCALING[mode], False, outer_shape, x.dq_dtype)


def _swizzle(buf, rows: int, cols: int):
    """The cuBLASLt scale swizzle of SPEC §4.8 on a [rows, cols] matrix (multiples of 128 x 4): the compact matrix
    viewed as (rows/128, 4, 32, cols/4, 4) with dims 1 and 3 swapped (torch: formats/base.py `_swizzle`)."""
    return buf.reshape(rows // 128, 4, 32, cols // 4, 4).transpose(0, 3, 2, 1, 4).reshape(rows, cols)


def _swizzle_block_scales(scale, columnwise: bool):
    """Compact -> GEMM-swizzled bytes of an MXFP8 or NVFP4 scale matrix (same shape); MXFP8's columnwise scales are
    swizzled as their transpose (torch: formats/mxfp8.py `swizzle_mx_scales`), NVFP4's copies both as stored
    (formats/nvfp4.py `swizzle_nvfp4_scales`: columnwise=False)."""
    scale = scale.reshape(-1, scale.shape[-1])
    r, c = scale.shape
    if r == 0 or c == 0:
        return scale
    if not columnwise:
        return _swizzle(scale, r, c)
    return _swizzle(scale.T, c, r).reshape(r, c)


def _operand(x, contract, quantizer, name) -> _Operand:
    if quantizer is not None:
        if isinstance(x, ScaledTensor):
            raise ValueError(f"tej.gemm: {name} is already a ScaledTensor ({describe(x)}); pass "
                             f"{name}_quantizer=None")
        if not isinstance(quantizer, Quantizer):
            raise TypeError(f"tej.gemm: {name}_quantizer must be a tej quantizer or None, got "
                            f"{type(quantizer).__name__}")
        x = quantize(x, quantizer)
    if isinstance(x, ScaledTensor):
        return _scaled_operand(x, contract, name)
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TypeError(f"tej.gemm: {name} must be an array or a ScaledTensor, got {type(x).__name__}")
    return _plain_operand(jnp.asarray(x), contract, name)


def _allow_tf32() -> bool:
    precision = jax.config.jax_default_matmul_precision
    return precision is not None and str(precision).lower() in _TF32_PRECISIONS


def likely_platform() -> str:
    """The platform a call is most likely lowered for: jax's default device, else its default backend."""
    device = jax.config.jax_default_device
    platform = getattr(device, "platform", None) if device is not None else None
    if isinstance(device, str):
        platform = device
    return (platform or jax.default_backend()).lower()


def _plan(inputs, out_dtype, attrs, cuda: bool):
    return _ffi.plan_gemm([(list(a.shape), CODE[jnp.dtype(a.dtype)]) for a in inputs], CODE[out_dtype], attrs,
                          cuda)


def _plans(inputs, out_dtype, attrs) -> dict:
    """The core's plans of a te_gemm call for CUDA and the CPU (None: a CUDA-only format)."""
    ffi_attrs = _ffi.GemmAttrs(**{k: (v.item() if isinstance(v, np.generic) else v) for k, v in attrs.items()})
    plans = {"cuda": _plan(inputs, out_dtype, ffi_attrs, True)}
    try:
        plans["cpu"] = _plan(inputs, out_dtype, ffi_attrs, False)
    except NotImplementedError:
        if likely_platform() == "cpu":
            raise
        plans["cpu"] = None  # a CUDA-only format: the CPU handler refuses it if the call runs there after all
    return plans


def _te_gemm(out_dtype, attrs: dict, *inputs):
    """The te_gemm FFI call (on the global operands or one device's shards) -> (out, pre_gelu, bias_grad). An lhs of
    more than 2 dims is [M..., K] (K last, no backward epilogue): out and pre_gelu come back [M..., N], so that its
    M dims stay separately sharded (a reshape to [M, N] would gather them)."""
    lead = inputs[0].shape[:-1] if inputs[0].ndim > 2 else None
    if lead is not None:
        inputs = (inputs[0].reshape(-1, inputs[0].shape[-1]), *inputs[1:])
        out, pre_gelu, bgrad = _te_gemm(out_dtype, attrs, *inputs)
        return (out.reshape(*lead, -1), pre_gelu.reshape(*lead, -1) if pre_gelu.ndim == 2 else pre_gelu, bgrad)
    plans = _plans(inputs, out_dtype, attrs)
    plan = plans["cuda"]

    def results(ws_bytes):
        out = jax.ShapeDtypeStruct(tuple(plan["out"][0]), DTYPE[plan["out"][1]])
        extra = []
        for key in ("pre_gelu_out", "bias_grad"):
            present, shape, code = plan[key]
            extra.append(jax.ShapeDtypeStruct(tuple(shape), DTYPE[code]) if present else
                         jax.ShapeDtypeStruct((0,), jnp.uint8))
        return [out, *extra, jax.ShapeDtypeStruct((ws_bytes,), jnp.uint8)]

    def call(platform):
        p = plans[platform] if plans[platform] is not None else plans["cuda"]
        ws = p["workspace_bytes"] if plans[platform] is not None else 0
        return lambda *args: tuple(jax.ffi.ffi_call(_TARGET, results(ws))(*args, **attrs)[:3])

    return jax.lax.platform_dependent(*inputs, cpu=call("cpu"), cuda=call("cuda"))


def gemm(lhs, rhs, contracting_dims=((1,), (0,)), lhs_quantizer=None, rhs_quantizer=None, bias=None, fuse_gelu=False,
         *, gelu_input=None, bias_grad=False, use_split_accumulator=True, out_dtype=None, sequence_parallel=False):
    """lhs · rhs contracted over `contracting_dims` = (lhs dims, rhs dims), paired in order; out has lhs's
    non-contracting dims followed by rhs's, in the operands' dtype (a ScaledTensor's dequantized dtype).

    lhs, rhs: float32 / float16 / bfloat16 arrays of one dtype, or ScaledTensors of one recipe (FP8 per tensor,
    delayed or current scaling, with E4M3 x E4M3, E4M3 x E5M2 or E5M2 x E4M3; MXFP8; NVFP4, whose copies' global
    amaxes the core folds into alpha; FP8 block 1x128 / 128x128). `*_quantizer`
    quantizes a plain operand first. Epilogues (SPEC §6.2; out 2-D as [M, N], M = prod lhs outer dims):
      bias [N]                                  out = lhs·rhs + bias (forward)
      fuse_gelu=True                            returns (gelu(lhs·rhs (+ bias)), pre-GELU values)
      gelu_input [M, N] (the saved pre-GELU)    out = (lhs·rhs) * gelu'(gelu_input) (dGELU)
      bias_grad=True                            returns (out, bias gradient): with gelu_input Σ over M of out [N];
                                                without, Σ over K of lhs [M] (the wgrad layout, lhs = dYᵀ)
    use_split_accumulator: FP8 per-tensor accumulates in full precision (False: Hopper's fast accumulation).
    out_dtype: float32 / float16 / bfloat16 to override the output dtype (float32: the unrounded FP32 accumulation,
    e.g. for partial sums that are added later).

    Under jax.jit with sharded operands the call is partitioned by their shardings (the "sharding" block below):
    data, column and row parallel, and the all-gather ring when lhs's M and rhs's N are sharded on the same mesh axis
    (a sequence-parallel activation into a column-parallel weight: out sharded along N, the unsharded bytes).
    sequence_parallel=True: a row-parallel call (K sharded on one mesh axis) reduce-scatters its output along lhs's
    last M dim over that axis (a ring of FP32 partial sums) instead of all-reducing it; without K shards it changes
    nothing.
    """
    _register()
    lhs_nd = len(lhs.shape) if hasattr(lhs, "shape") else 0
    rhs_nd = len(rhs.shape) if hasattr(rhs, "shape") else 0
    where = f"(lhs {describe(lhs) if hasattr(lhs, 'shape') else type(lhs).__name__}, rhs " \
            f"{describe(rhs) if hasattr(rhs, 'shape') else type(rhs).__name__}, contracting_dims={contracting_dims})"
    if lhs_nd < 2 or rhs_nd < 2:
        raise ValueError(f"tej.gemm: lhs and rhs must be at least 2-D {where}")
    try:
        lhs_c, rhs_c = contracting_dims
    except (TypeError, ValueError):
        raise ValueError(f"tej.gemm: contracting_dims must be a pair (lhs dims, rhs dims) {where}") from None
    lhs_c = _normalize(lhs_c, lhs_nd, "lhs", where)
    rhs_c = _normalize(rhs_c, rhs_nd, "rhs", where)
    if len(lhs_c) != len(rhs_c):
        raise ValueError(f"tej.gemm: lhs contracts over {len(lhs_c)} dims and rhs over {len(rhs_c)} {where}; pair "
                         f"each lhs contracting dim with one of rhs")
    for a, b in zip(lhs_c, rhs_c):
        if lhs.shape[a] != rhs.shape[b]:
            raise ValueError(f"tej.gemm: K mismatch: lhs dim {a} has {lhs.shape[a]} elements but rhs dim {b} has "
                             f"{rhs.shape[b]} {where}")
    L = _operand(lhs, lhs_c, lhs_quantizer, "lhs")
    R = _operand(rhs, rhs_c, rhs_quantizer, "rhs")
    if out_dtype is not None and jnp.dtype(out_dtype) not in _PLAIN:
        raise TypeError(f"tej.gemm: out_dtype must be float32, float16 or bfloat16, got {out_dtype} {where}")
    out_dtype = jnp.dtype(out_dtype) if out_dtype is not None else (
        L.dtype if L.dtype in _PLAIN else jnp.dtype(jnp.bfloat16))
    grad = gelu_input is not None or bool(bias_grad)
    if grad and (fuse_gelu or bias is not None):
        raise ValueError(f"tej.gemm: gelu_input / bias_grad select the backward epilogues; pass fuse_gelu=False and "
                         f"bias=None with them {where}")
    m, n = math.prod(L.outer_shape), math.prod(R.outer_shape)
    empty = jnp.zeros((0,), out_dtype)
    bias_in = empty if bias is None else jnp.asarray(bias).reshape(-1)
    gelu_in = empty if gelu_input is None else jnp.asarray(gelu_input).reshape(m, n)
    # The handler's rhs is [N, K] when `rhs_transposed` (the stored copy has K last) and [K, N] otherwise.
    attrs = dict(lhs_transposed=L.k_first, rhs_transposed=not R.k_first, lhs_scaling=np.int64(L.scaling),
                 rhs_scaling=np.int64(R.scaling), fuse_bias=bias is not None or bool(bias_grad),
                 fuse_gelu=bool(fuse_gelu) or gelu_input is not None, grad=grad,
                 use_split_accumulator=bool(use_split_accumulator), allow_tf32=_allow_tf32())
    amax_in = jnp.concatenate([L.amax, R.amax]) if L.amax is not None and R.amax is not None else \
        jnp.zeros((0,), jnp.float32)
    inputs = (L.data, L.scale_inv, R.data, R.scale_inv, bias_in, gelu_in, amax_in)
    try:
        _plans(inputs, out_dtype, attrs)  # every check at trace time, on the global shapes
    except (ValueError, TypeError, NotImplementedError) as e:
        raise type(e)(f"tej.gemm{where}: {e}") from None
    if len(L.outer_shape) > 1 and not L.k_first and not grad:  # keep lhs's M dims for the partitioner
        inputs = (L.data.reshape(*L.outer_shape, -1), *inputs[1:])
    out, pre_gelu, bgrad = _sharded_gemm(out_dtype, tuple(sorted(attrs.items())), bool(sequence_parallel))(*inputs)
    out = out.reshape(L.outer_shape + R.outer_shape)
    if fuse_gelu:
        return out, pre_gelu.reshape(out.shape)
    if bias_grad:
        return out, bgrad
    return out


# ---- sharding ----------------------------------------------------------------------------------------------------
# Under jax.jit with NamedSharding the te_gemm call is partitioned by the shardings of its operands (M from lhs, N
# and K from rhs and lhs), with exactly the collectives a shard_map would need (its _Form):
#   data parallel   lhs sharded along M, rhs replicated          local GEMMs, out sharded along M, no collective
#   column parallel rhs sharded along N                          local GEMMs, out sharded along N, no collective
#   all-gather ring lhs M and rhs N sharded on one mesh axis a   lhs's row chunks travel a ring of ppermutes over a,
#                   (a sequence-parallel activation into a       each multiplied while the next one arrives
#                   column-parallel weight)                      (ring.ring_all_gather);  out sharded along N on
#                                                                a and along M on M's other axes. Every row is one
#                                                                GEMM over the full K: the unsharded bytes
#   row parallel    lhs and rhs sharded alike along K            local FP32 GEMMs, one psum over the K axes, bias
#                                                                added once after it, rounded once to out's dtype
#   reduce-scatter  row parallel over one axis a, called with    the FP32 partial products of tp chunks of lhs's last
#   ring            sequence_parallel=True                       M dim summed around a ring of ppermutes over a
#                                                                (ring.ring_reduce_scatter; chunk c: ranks
#                                                                c+1, c+2, …, c, the C++ core's order), bias added
#                                                                once, rounded once; out sharded along that M dim on
#                                                                its other axes, then a
# custom_partitioning sees the operands' shardings but not the one the caller wants for the output, so the
# reduce-scatter form is asked for (`sequence_parallel`); the all-gather form follows from the shardings alone (the
# weight is never gathered for it). The Shardy rule cannot say either form (out's M is lhs's factor): a ring's out
# keeps its sharding where its consumers take it so (a sequence-parallel residual add, jit's out_shardings), else XLA
# reshards it after the call (the reduce-scatter's out gathered: the values stay right). M and N shard together (a
# 2-D mesh); an lhs [M..., K] keeps its M dims, each sharded on its own axes (batch and sequence parallel), except
# under the backward epilogues (M flattened there).
# The all-gather ring needs a to be the last axis of its M dim's entry (so that the gathered rows are whole blocks),
# one shared axis, lhs K-last, plain or FP8 per-tensor operands (FP8 codes travel; one scale on every shard) and no
# backward epilogue, and runs K unsharded; other M/N overlaps drop N's shared axes (XLA gathers that part of rhs).
# Row parallel needs plain or FP8 per-tensor operands and no GELU or backward epilogue (they do not compose with a
# sum of partial products); its K axes are those the two operands' K shardings start with alike (XLA gathers the
# rest: e.g. a wgrad whose x is sharded along tokens on (dp, tp) and dy on dp gathers x over tp and sums over dp).
# Its psum and ring add the shards' FP32 partial products in another order than one unsharded GEMM accumulates them,
# so it equals the unsharded call to FP32 accumulation tolerance, not bit for bit. sequence_parallel with K sharded
# over several axes keeps the psum (out not scattered); a tp that does not divide the scattered dim's rows per shard
# raises ValueError. Any other sharding is resharded by XLA to the nearest of these (K replicated at worst; FP8 block
# scales and local shapes the core's planner refuses: everything replicated, no ring), so the result is always the
# unsharded call's. A mesh axis of size 1 gives a ring of one step: one local GEMM, no collective.


class _Form(NamedTuple):
    """How one te_gemm call runs on its shards: "local" (no collective), "psum" (row parallel over the mesh axes
    `k`), "all_gather" / "reduce_scatter" (the ring over mesh axis `axis`; `dim`: the index, among lhs's M dims, of
    the dim whose rows travel / are scattered)."""
    kind: str
    k: tuple = ()
    axis: str | None = None
    dim: int = 0


def _dims(attrs: dict) -> tuple:
    """(lhs M, lhs K, rhs K, rhs N): the positions of those dims in the 2-D buffers the call passes."""
    lhs_m, lhs_k = (1, 0) if attrs["lhs_transposed"] else (0, 1)
    rhs_n, rhs_k = (0, 1) if attrs["rhs_transposed"] else (1, 0)
    return lhs_m, lhs_k, rhs_k, rhs_n


def _axes(arg, dim: int) -> tuple:
    spec = tuple(arg.sharding.spec) + (None,) * len(arg.shape)
    return _mesh_axes((spec[dim],))


def _entry(axes: tuple):
    return axes if axes else None


def _common_prefix(a: tuple, b: tuple) -> tuple:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _gemm_shardings(mesh, arg_shapes, result_shapes, out_dtype, attrs: dict, sequence_parallel: bool = False):
    """(_Form, argument shardings, result shardings) of one te_gemm call, from its operands' shardings (the block
    above)."""
    lhs, _, rhs, _, bias, gelu_in, _ = arg_shapes
    lhs_m, lhs_k, rhs_k, rhs_n = _dims(attrs)
    nd = len(lhs.shape)
    m_dims, lhs_k = ((lhs_m,), lhs_k) if nd == 2 else (tuple(range(nd - 1)), nd - 1)  # [M..., K]: see _te_gemm
    m_parts = [_axes(lhs, d) for d in m_dims]
    m, k, n = sum(m_parts, ()), _common_prefix(_axes(lhs, lhs_k), _axes(rhs, rhs_k)), _axes(rhs, rhs_n)
    per_tensor = attrs["lhs_scaling"] in (0, 1) and attrs["rhs_scaling"] in (0, 1)
    form = _Form("local")
    shared = [a for a in n if a in m]
    ring_dim = [i for i, p in enumerate(m_parts) if shared and p and p[-1] == shared[0]]
    if len(shared) == 1 and ring_dim and per_tensor and not attrs["grad"] and not attrs["lhs_transposed"]:
        form, k = _Form("all_gather", axis=shared[0], dim=ring_dim[0]), ()
    else:
        n = tuple(a for a in n if a not in m)
        if attrs["fuse_gelu"] or attrs["grad"] or set(k) & set(m + n):
            k = ()
        if k:
            form = _Form("psum", k)
            if sequence_parallel and len(k) == 1 and per_tensor:
                form = _Form("reduce_scatter", k, k[0], len(m_dims) - 1)
    if attrs["grad"] and attrs["fuse_gelu"] and attrs["fuse_bias"]:
        m, m_parts = (), [() for _ in m_dims]  # the bias gradient sums out over M
    if not per_tensor:
        m = n = k = ()  # block scales tile the operands: not split here
        m_parts, form = [() for _ in m_dims], _Form("local")
    sizes = {a: mesh.shape[a] for a in m + n + k}
    size = lambda parts: math.prod(sizes[a] for a in parts)
    lhs_parts, rhs_parts = [()] * nd, [(), ()]
    lhs_parts[lhs_k], rhs_parts[rhs_k], rhs_parts[rhs_n] = k, k, n
    for d, p in zip(m_dims, m_parts):
        lhs_parts[d] = p
    out_m = list(m_parts)
    if form.kind == "all_gather":
        out_m[form.dim] = m_parts[form.dim][:-1]
    elif form.kind == "reduce_scatter":
        d, tp = m_dims[form.dim], sizes[form.axis]
        rows = lhs.shape[d] // size(m_parts[form.dim])
        if rows % tp:
            held = f"{rows} per shard of mesh axes {m_parts[form.dim]}" if m_parts[form.dim] else f"all {rows}"
            raise ValueError(
                f"tej.gemm(sequence_parallel=True): the reduce-scatter ring over mesh axis {form.axis!r} (size {tp}) "
                f"splits the rows of lhs's M dim {d} (lhs shape {tuple(lhs.shape)}; {held} on each device) into {tp} "
                f"chunks, and {tp} does not divide {rows}: pad that dim to a multiple of "
                f"{tp * size(m_parts[form.dim])}, or call without sequence_parallel (an all-reduce)")
        out_m[form.dim] = m_parts[form.dim] + (form.axis,)
    local = lambda shape, parts: tuple(dim // size(p) for dim, p in zip(shape, parts))
    try:  # local shapes the kernel refuses (alignment, a shard count that does not divide): replicate
        if any(dim % size(p) for a_, parts in ((lhs, lhs_parts), (rhs, rhs_parts)) for dim, p in
               zip(a_.shape, parts)):
            raise ValueError("uneven shards")
        shrink = lambda a, parts: jax.ShapeDtypeStruct(local(a.shape, parts), a.dtype)
        local_in = list(arg_shapes)
        local_in[0], local_in[2] = shrink(lhs, lhs_parts), shrink(rhs, rhs_parts)
        if form.kind == "reduce_scatter":  # each GEMM of the ring takes one chunk of the local rows
            chunk = list(local_in[0].shape)
            chunk[m_dims[form.dim]] //= sizes[form.axis]
            local_in[0] = jax.ShapeDtypeStruct(tuple(chunk), lhs.dtype)
        if nd > 2:
            local_in[0] = jax.ShapeDtypeStruct((math.prod(local_in[0].shape[:-1]), local_in[0].shape[-1]), lhs.dtype)
        if bias.shape[0]:
            local_in[4] = shrink(bias, [n])
        if len(gelu_in.shape) == 2:
            local_in[5] = shrink(gelu_in, [m, n])
        if k:  # the row-parallel call: no bias, FP32 out
            local_in[4] = jax.ShapeDtypeStruct((0,), jnp.float32)
        _plans(local_in, jnp.dtype(jnp.float32) if k else out_dtype, _partial(attrs) if k else attrs)
    except (ValueError, TypeError, NotImplementedError):
        m = n = k = ()
        form, m_parts, out_m = _Form("local"), [() for _ in m_dims], [() for _ in m_dims]
        lhs_parts, rhs_parts = [()] * nd, [(), ()]
    spec = lambda *parts: NamedSharding(mesh, PartitionSpec(*(_entry(p) for p in parts)))
    args = (spec(*lhs_parts), spec(), spec(*rhs_parts), spec(), spec(n) if bias.shape[0] else spec(),
            spec(m, n) if len(gelu_in.shape) == 2 else spec(), spec())
    bgrad = n if attrs["fuse_gelu"] else m  # with gelu_input: Σ over M of out [N]; without: Σ over K of lhs [M]
    _, pre_gelu, bias_grad = result_shapes
    out = spec(*out_m, n)
    results = (out, out if len(pre_gelu.shape) > 1 else spec(), spec(bgrad) if bias_grad.shape[0] else spec())
    return form, args, results


def _partial(attrs: dict) -> dict:
    """A row-parallel shard's attributes: its bias is added after the psum."""
    return dict(attrs, fuse_bias=False)


def _gemm_rule(attrs: dict):
    """The Shardy rule: factors m, k, n shared by the operands, the output and the epilogues' arrays. (The ring forms
    shard out otherwise than m and n say; where the propagated sharding differs, XLA reshards out after the call.)"""
    lhs_m, lhs_k, rhs_k, rhs_n = _dims(attrs)

    def rule(mesh, value_types, result_types):
        nd = len(value_types[0].shape)
        rhs = ["", ""]
        rhs[rhs_k], rhs[rhs_n] = "k", "n"
        if nd == 2:
            lhs = ["", ""]
            lhs[lhs_m], lhs[lhs_k] = "m", "k"
        else:  # [M..., K]: see _te_gemm
            lhs = [f"m{d}" for d in range(nd - 1)] + ["k"]
        out = " ".join(lhs[:-1] + ["n"]) if nd > 2 else "m n"
        bias, gelu_in = value_types[4], value_types[5]
        bgrad = "n" if attrs["fuse_gelu"] else "m"
        scale = lambda i: " ".join(f"s{i}d{d}" for d in range(len(value_types[2 * i + 1].shape)))  # replicated
        terms = [" ".join(lhs), scale(0), " ".join(rhs), scale(1), "n" if bias.shape[0] else "b",
                 "m n" if len(gelu_in.shape) == 2 else "g", "a" if value_types[6].shape[0] else "z", out,
                 out if len(result_types[1].shape) > 1 else "p",
                 bgrad if result_types[2].shape[0] else "d"]
        return ", ".join(terms[:7]) + " -> " + ", ".join(terms[7:])

    return rule


def _ring_body(form: _Form, tp: int, out_dtype, attrs: dict):
    """The shard-local function of a ring form: ring.py's rings around shard-local te_gemm calls."""
    empty = jnp.zeros((0,), jnp.uint8)

    def all_gather(lhs, lhs_scale_inv, rhs, rhs_scale_inv, bias, gelu_in, amax):
        def mm(chunk):  # rows of lhs [M..., K] (FP8 codes for a ScaledTensor: its scale_inv is on every shard)
            out, pre_gelu, _ = _te_gemm(out_dtype, attrs, chunk, lhs_scale_inv, rhs, rhs_scale_inv, bias, gelu_in,
                                        amax)
            return (out, pre_gelu) if attrs["fuse_gelu"] else (out,)

        outs = ring_all_gather(lhs, mm, form.axis, tp, form.dim)
        return outs[0], outs[1] if attrs["fuse_gelu"] else empty, empty

    def reduce_scatter(lhs, lhs_scale_inv, rhs, rhs_scale_inv, bias, gelu_in, amax):
        d = _dims(attrs)[0] if lhs.ndim == 2 else lhs.ndim - 2  # lhs's last M dim
        rows = lhs.shape[d] // tp

        def partial(c):  # chunk c of the local rows: an FP32 partial product, no bias
            chunk = jax.lax.dynamic_slice_in_dim(lhs, c * rows, rows, d)
            return _te_gemm(jnp.dtype(jnp.float32), _partial(attrs), chunk, lhs_scale_inv, rhs, rhs_scale_inv,
                            jnp.zeros((0,), jnp.float32), gelu_in, amax)[0]

        out = ring_reduce_scatter(partial, form.axis, tp)
        if bias.shape[0]:
            out = out + bias.astype(jnp.float32)
        return out.astype(out_dtype), empty, empty

    return all_gather if form.kind == "all_gather" else reduce_scatter


def _ffi_ring_body(mesh, form: _Form, out_dtype, attrs: dict, arg_shapes):
    """The ring form as one te_collective_gemm call per device (collective_ffi.py: the core's ring over NCCL, its
    exchanges overlapped with the chunk GEMMs on the GPU), or None where only the ppermute ring applies: devices other
    than GPUs or a build without NCCL, an epilogue (GELU, backward) or transposed lhs, FP8 other than per tensor, or
    gathered/scattered rows that are not the leading dim of lhs's rows (a sequence dim sharded under an
    unsharded batch dim: its chunks are not contiguous rows). rhs may be [N, K] or, plain, [K, N] (tej.dense's
    kernel)."""
    lhs, lhs_s, rhs, rhs_s, bias, _, _ = arg_shapes
    if (not F.available(mesh) or attrs["fuse_gelu"] or attrs["grad"] or attrs["lhs_transposed"]
            or attrs["lhs_scaling"] not in (0, 1) or attrs["rhs_scaling"] != attrs["lhs_scaling"]
            or (attrs["lhs_scaling"] and not attrs["rhs_transposed"])):
        return None
    d = form.dim  # lhs K-last (not transposed): the M dims are lhs's leading dims, form.dim indexes them
    if any(lhs.shape[i] // math.prod(mesh.shape[a] for a in _axes(lhs, i)) != 1 for i in range(d)):
        return None
    tp = mesh.shape[form.axis]
    key = F.initialize(mesh, form.axis)
    kind = F.AG if form.kind == "all_gather" else F.RS

    def body(lhs, lhs_scale_inv, rhs, rhs_scale_inv, bias, gelu_in, amax):
        lead, k = lhs.shape[:-1], lhs.shape[-1]
        x = lhs.reshape(-1, k)
        scales = [s.reshape(-1).astype(jnp.float32) if attrs[f"{n}_scaling"] else jnp.zeros((0,), jnp.float32)
                  for n, s in (("lhs", lhs_scale_inv), ("rhs", rhs_scale_inv))]
        with_bias = attrs["fuse_bias"] and bias.shape[0]
        # with a bias: an FP32 result, the bias added and the sum rounded once (the ppermute ring's bytes)
        out, _ = F.call(kind, key, tp, x, scales[0], rhs, scales[1], jnp.float32 if with_bias else out_dtype, True,
                         -1, False, w_kn=not attrs["rhs_transposed"])
        if with_bias:
            out = (out + bias.astype(jnp.float32)).astype(out_dtype)
        rows = lead[:d] + (lead[d] * tp if kind == F.AG else lead[d] // tp,) + lead[d + 1:]
        empty = jnp.zeros((0,), jnp.uint8)
        return out.reshape(*rows, -1), empty, empty

    return body


@functools.lru_cache(maxsize=None)
def _sharded_gemm(out_dtype, attr_items: tuple, sequence_parallel: bool = False):
    """The te_gemm call with these attributes, partitioned (custom_partitioning) as the block above says. Cached: jax
    caches traces and compiled programs by the function's identity."""
    attrs = dict(attr_items)

    def partition(mesh, arg_shapes, result_shape):
        form, args, results = _gemm_shardings(mesh, arg_shapes, result_shape, out_dtype, attrs, sequence_parallel)
        if form.kind == "local":
            return mesh, functools.partial(_te_gemm, out_dtype, attrs), results, args
        if form.kind != "psum":
            body = _ffi_ring_body(mesh, form, out_dtype, attrs, arg_shapes) or \
                _ring_body(form, mesh.shape[form.axis], out_dtype, attrs)
            return mesh, body, results, args

        def row_parallel(lhs, lhs_scale_inv, rhs, rhs_scale_inv, bias, gelu_in, amax):
            # partial FP32 products, summed over the K shards, the bias added once, rounded once
            out, pre_gelu, bgrad = _te_gemm(jnp.dtype(jnp.float32), _partial(attrs), lhs, lhs_scale_inv, rhs,
                                            rhs_scale_inv, jnp.zeros((0,), jnp.float32), gelu_in, amax)
            out = jax.lax.psum(out, form.k)
            if bias.shape[0]:
                out = out + bias.astype(jnp.float32)
            return out.astype(out_dtype), pre_gelu, bgrad

        return mesh, row_parallel, results, args

    def infer(mesh, arg_shapes, result_shape):
        return _gemm_shardings(mesh, arg_shapes, result_shape, out_dtype, attrs, sequence_parallel)[2]

    partitioned = custom_partitioning(functools.partial(_te_gemm, out_dtype, attrs))
    partitioned.def_partition(partition, infer_sharding_from_operands=infer, sharding_rule=_gemm_rule(attrs))
    return partitioned
