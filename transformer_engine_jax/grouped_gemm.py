"""`tej.grouped_gemm`: the mixture-of-experts GEMM with the group sizes on the device, as the XLA FFI call
`te_grouped_gemm` over the core's grouped GEMM (csrc/core/ops/grouped_gemm_op.h) — the same op `tex.grouped_gemm`
runs. The sizes are an ordinary device buffer the kernels read, so a call never waits for the host and can sit in a
command buffer; its shapes are static (M_total, the expert count), as XLA needs.

out[rows of g] = lhs[rows of g] · rhs[g] contracted over K, for the groups g in order. Group g owns the rows after
the previous groups' (negative sizes count as 0, sizes summing past M_total are cut there) and the rows past the
sizes' sum come out as zeros (csrc/core/gemm/grouped_gemm.h). On CUDA: CUTLASS Hopper tensor-core kernels for bf16
and FP8 (E4M3 x E4M3, E5M2 x E4M3; per-tensor, or 1x128 x 128x128 blocks), a portable kernel for fp16/fp32; the CPU
runs the exact CPU GEMM per group.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi
from .cpp_extensions import _register, quantize
from .dtype_codes import CODE, DTYPE
from .gemm import describe, likely_platform
from .quantizers import Quantizer, ScalingMode
from .scaled_tensor import ScaledTensor

_TARGET = "te_grouped_gemm"
_PER_TENSOR = (ScalingMode.DELAYED_TENSOR_SCALING, ScalingMode.CURRENT_TENSOR_SCALING)


def _fp8_rowwise(x: ScaledTensor, name: str):
    if x.data is None:
        raise ValueError(f"tej.grouped_gemm: {name} {describe(x)} needs its rowwise copy (K runs along its last "
                         f"dim); quantize it with q_layout ROWWISE or ROWWISE_COLWISE")
    return x.data, x.scale_inv.reshape(-1).astype(jnp.float32)


def _lhs(lhs, quantizer):
    if quantizer is not None:
        lhs = quantize(lhs, _checked(quantizer, "lhs"))
    if isinstance(lhs, ScaledTensor):
        return (*_fp8_rowwise(lhs, "lhs"), jnp.dtype(lhs.dq_dtype))
    lhs = jnp.asarray(lhs)
    return lhs, jnp.zeros((0,), jnp.float32), jnp.dtype(lhs.dtype)


def _checked(quantizer, name):
    if not isinstance(quantizer, Quantizer):
        raise TypeError(f"tej.grouped_gemm: {name}_quantizer must be a tej quantizer or None, got "
                        f"{type(quantizer).__name__}")
    return quantizer


def _emulated(t) -> bool:
    return isinstance(t, ScaledTensor) and t.scaling_mode not in _PER_TENSOR


def _as_bf16(t):
    return t.dequantize(jnp.bfloat16) if isinstance(t, ScaledTensor) else jnp.asarray(t).astype(jnp.bfloat16)


_ROW_BLOCKS = (ScalingMode.MXFP8_1D_SCALING, ScalingMode.BLOCK_SCALING_1x128)


def _emulate(lhs, rhs, lhs_quantizer, rhs_quantizer):
    """MXFP8, NVFP4 and the FP8 block pairings without a native kernel: quantized as asked (rhs per
    group), then both operands' dequantized bf16 values for the bf16 grouped GEMM (SPEC §6.7's emulation). Returns
    (lhs, rhs, lhs_quantizer, rhs_quantizer) unchanged when nothing is emulated."""
    lq = lhs_quantizer is not None and _checked(lhs_quantizer, "lhs").scaling_mode not in _PER_TENSOR
    rq = rhs_quantizer is not None and _checked(rhs_quantizer, "rhs").scaling_mode not in _PER_TENSOR
    if not (lq or rq or _emulated(lhs) or _emulated(rhs)):
        return lhs, rhs, lhs_quantizer, rhs_quantizer
    if lhs_quantizer is not None:
        lhs = quantize(lhs, lhs_quantizer)
    if rhs_quantizer is not None:
        if rhs_quantizer.scaling_mode in _ROW_BLOCKS and rhs_quantizer.q_layout.rowwise:
            # blocks along each row's last dim and no per-tensor state: the groups' rows quantized at once are
            # quantized as each group's alone (dequantize reads the rowwise copy), in one call instead of G
            flat = quantize(rhs.reshape(-1, rhs.shape[-1]), rhs_quantizer)
            rhs = _as_bf16(flat).reshape(rhs.shape)
        else:  # NVFP4's global amax, 128x128 tiles: per group
            rhs = jnp.stack([_as_bf16(quantize(rhs[g], rhs_quantizer)) for g in range(rhs.shape[0])])
    return _as_bf16(lhs), _as_bf16(rhs), None, None


def _block_mode(t, quantizer):
    """The FP8 block mode an operand will have (its quantizer's, or a ScaledTensor's own), None otherwise."""
    mode = quantizer.scaling_mode if isinstance(quantizer, Quantizer) else (
        t.scaling_mode if isinstance(t, ScaledTensor) else None)
    return mode if mode in (ScalingMode.BLOCK_SCALING_1x128, ScalingMode.BLOCK_SCALING_128x128) else None


def _native_block(lhs, rhs, lhs_quantizer, rhs_quantizer):
    """(lhs codes, lhs 1x128 scale_inv, rhs codes [G, N, K], rhs 128x128 scale_inv [G, ...]) when the pair runs
    natively — lhs with 1x128 blocks, rhs with 128x128 tiles per group (SPEC §6.6's 1-D x 2-D pairing) — else None.
    A quantizer quantizes each group of rhs on its own; an rhs ScaledTensor qualifies when its tiles do not straddle
    groups (N a multiple of 128), so that its scales are the per-group ones stacked."""
    if (_block_mode(lhs, lhs_quantizer) != ScalingMode.BLOCK_SCALING_1x128
            or _block_mode(rhs, rhs_quantizer) != ScalingMode.BLOCK_SCALING_128x128 or len(rhs.shape) != 3):
        return None
    g, n, _ = rhs.shape
    if rhs_quantizer is None and n % 128 != 0:
        return None
    if lhs_quantizer is not None:
        lhs = quantize(lhs, lhs_quantizer)
    lhs_data, lhs_scale = _block_rowwise(lhs, "lhs")
    if rhs_quantizer is not None:
        if isinstance(rhs, ScaledTensor):
            raise ValueError(f"tej.grouped_gemm: rhs is already a ScaledTensor ({describe(rhs)}); pass "
                             f"rhs_quantizer=None")
        parts = [_block_rowwise(quantize(rhs[e], rhs_quantizer), "rhs") for e in range(g)]
        return lhs_data, lhs_scale, jnp.stack([p[0] for p in parts]), jnp.stack([p[1] for p in parts])
    rhs_data, rhs_scale = _block_rowwise(rhs, "rhs")
    return lhs_data, lhs_scale, rhs_data, rhs_scale.reshape(g, n // 128, rhs_scale.shape[-1])


def _block_rowwise(x: ScaledTensor, name: str):
    if x.data is None:
        raise ValueError(f"tej.grouped_gemm: {name} {describe(x)} needs its rowwise copy (K runs along its last "
                         f"dim); quantize it with q_layout ROWWISE or ROWWISE_COLWISE")
    return x.data, x.scale_inv.astype(jnp.float32)


def _rhs(rhs, quantizer):
    """rhs codes or values [G, ...] and its per-group scale_inv [G] (0 elements for plain operands). A quantizer
    quantizes each group on its own (current scaling: each group its own scale); a ScaledTensor with one scale
    shares it among the groups."""
    if quantizer is not None:
        if isinstance(rhs, ScaledTensor):
            raise ValueError(f"tej.grouped_gemm: rhs is already a ScaledTensor ({describe(rhs)}); pass "
                             f"rhs_quantizer=None")
        q = _checked(quantizer, "rhs")
        parts = [_fp8_rowwise(quantize(rhs[g], q), "rhs") for g in range(rhs.shape[0])]
        return jnp.stack([p[0] for p in parts]), jnp.concatenate([p[1] for p in parts])
    if isinstance(rhs, ScaledTensor):
        data, scale_inv = _fp8_rowwise(rhs, "rhs")
        if scale_inv.shape[0] == 1:
            scale_inv = jnp.broadcast_to(scale_inv, (data.shape[0],))
        return data, scale_inv
    return jnp.asarray(rhs), jnp.zeros((0,), jnp.float32)


def _contracting(contracting_dims, rhs_ndim: int) -> str:
    """'NK' (rhs [G, N, K]), 'KN' (rhs [G, K, N]) or 'wgrad' (lhs [M_total, N] and rhs [M_total, K] contracted over
    their grouped rows)."""
    try:
        (lc,), (rc,) = contracting_dims
    except (TypeError, ValueError):
        raise ValueError(f"tej.grouped_gemm: contracting_dims must be ((lhs dim,), (rhs dim,)), got "
                         f"{contracting_dims!r}") from None
    if rhs_ndim == 2 and int(lc) % 2 == 0 and int(rc) % 2 == 0:
        return "wgrad"
    if int(lc) % 2 != 1 or rhs_ndim != 3 or int(rc) % 3 not in (1, 2):
        raise ValueError(f"tej.grouped_gemm: contracting_dims {contracting_dims} must contract lhs [M_total, K]'s "
                         f"last dim and rhs's dim 1 ([G, K, N]) or 2 ([G, N, K]) of a 3-D rhs, or both operands' "
                         f"grouped rows (((0,), (0,)), a 2-D rhs: the weight gradient)")
    return "KN" if int(rc) % 3 == 1 else "NK"


def _likely_cpu() -> bool:
    return likely_platform() == "cpu"


def grouped_gemm(lhs, rhs, group_sizes, contracting_dims=((1,), (2,)), lhs_quantizer=None, rhs_quantizer=None,
                 out_dtype=None, *, use_split_accumulator=True):
    """Grouped GEMM: lhs [M_total, K] with its rows grouped by expert, rhs [G, N, K] (contracting_dims ((1,), (2,)),
    the default) or [G, K, N] (((1,), (1,))), group_sizes int32 [G] on the device → out [M_total, N].

    Operands: bf16 / fp16 / fp32 arrays of one dtype, or FP8 per-tensor ScaledTensors (rowwise copies); or plain
    arrays with per-tensor FP8 quantizers (`rhs_quantizer` quantizes each group on its own). FP8 blocks run natively
    for lhs with 1x128 blocks and rhs [G, N, K] with 128x128 tiles (a quantizer's per-group tiles, or a ScaledTensor
    with N a multiple of 128), the scales applied every 128-deep K step; other FP8 block pairings, MXFP8 and NVFP4
    operands or quantizers are emulated: both operands' dequantized bf16 values through the bf16 grouped GEMM. FP8
    rhs must be [G, N, K] (FP8 tensor cores are TN); E5M2 x E5M2 is refused; `use_split_accumulator=False` takes the tensor
    cores' faster, less precise FP8 accumulation (SPEC §6.3). The output is the operands' dtype (bf16 for FP8)
    unless `out_dtype` is given. Shapes and every rule are checked at trace time by the core's planner."""
    _register()
    form = _contracting(contracting_dims, len(rhs.shape))
    rhs_kn, wgrad = form == "KN", form == "wgrad"
    block = None if wgrad or rhs_kn else _native_block(lhs, rhs, lhs_quantizer, rhs_quantizer)
    if block is not None:
        lhs_data, lhs_scale, rhs_data, rhs_scale = block
        nominal = jnp.dtype(jnp.bfloat16)
    elif wgrad:
        lhs_data, lhs_scale, nominal = _lhs(lhs, lhs_quantizer)
        if rhs_quantizer is not None or isinstance(rhs, ScaledTensor) or lhs_scale.shape[0] > 0:
            raise NotImplementedError("tej.grouped_gemm: not yet supported: FP8 operands in the weight-gradient "
                                      "form (contracting the grouped rows); pass the bf16 dy and x")
        rhs_data, rhs_scale = jnp.asarray(rhs), jnp.zeros((0,), jnp.float32)
    else:
        lhs, rhs, lhs_quantizer, rhs_quantizer = _emulate(lhs, rhs, lhs_quantizer, rhs_quantizer)
        lhs_data, lhs_scale, nominal = _lhs(lhs, lhs_quantizer)
        rhs_data, rhs_scale = _rhs(rhs, rhs_quantizer)
    group_sizes = jnp.asarray(group_sizes)
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise TypeError(f"tej.grouped_gemm: group_sizes must be an integer array [G], got {group_sizes.dtype}")
    group_sizes = group_sizes.astype(jnp.int32)
    fp8 = lhs_scale.shape[0] > 0
    out = jnp.dtype(out_dtype) if out_dtype is not None else (jnp.dtype(jnp.bfloat16) if fp8 else nominal)
    inputs = (lhs_data, rhs_data, group_sizes, lhs_scale, rhs_scale)
    for a in inputs:
        if jnp.dtype(a.dtype) not in CODE and jnp.dtype(a.dtype) != jnp.dtype(jnp.int32):
            raise TypeError(f"tej.grouped_gemm: operand dtype {a.dtype} is not supported")
    codes = [(list(a.shape), CODE.get(jnp.dtype(a.dtype), 2)) for a in inputs]  # 2: kInt32
    if out not in CODE:
        raise TypeError(f"tej.grouped_gemm: out_dtype must be bfloat16, float16 or float32, got {out}")
    # The platform the call most likely runs on is planned strictly (its errors raise now); the other leniently: a
    # rule only it breaks (CUDA's alignment) raises from its handler if the call does run there.
    split = bool(use_split_accumulator)
    primary, other = ("cpu", "cuda") if _likely_cpu() else ("cuda", "cpu")
    plans = {primary: _ffi.plan_grouped_gemm(codes, rhs_kn, CODE[out], primary == "cuda", split, wgrad)}
    try:
        plans[other] = _ffi.plan_grouped_gemm(codes, rhs_kn, CODE[out], other == "cuda", split, wgrad)
    except (ValueError, NotImplementedError):
        plans[other] = None

    def call(platform):
        p = plans[platform] if plans[platform] is not None else plans[primary]
        results = [jax.ShapeDtypeStruct(tuple(p["out"][0]), DTYPE[p["out"][1]]),
                   jax.ShapeDtypeStruct((p["workspace_bytes"],), jnp.uint8)]
        return lambda *args: jax.ffi.ffi_call(_TARGET, results)(*args, rhs_kn=np.bool_(rhs_kn),
                                                                 use_split_accumulator=np.bool_(split),
                                                                 wgrad=np.bool_(wgrad))[0]

    return jax.lax.platform_dependent(*inputs, cpu=call("cpu"), cuda=call("cuda"))


def grouped_gemm_kernel(lhs_dtype, rhs_dtype, shape=(256, 128, 128), groups=4, rhs_kn=False,
                        use_split_accumulator=True) -> str:
    """What would run a CUDA grouped GEMM of these operand dtypes ("cutlass sm90 grouped bf16 NK", "portable"): for
    benchmarks and support questions. shape = (M_total, N, K)."""
    m, n, k = shape
    fp8 = jnp.dtype(lhs_dtype).itemsize == 1
    rhs_shape = [groups, k, n] if rhs_kn else [groups, n, k]
    codes = [([m, k], CODE[jnp.dtype(lhs_dtype)]), (rhs_shape, CODE[jnp.dtype(rhs_dtype)]), ([groups], 2),
             ([1] if fp8 else [0], 4), ([groups] if fp8 else [0], 4)]
    out = CODE[jnp.dtype(jnp.bfloat16)] if fp8 else CODE[jnp.dtype(lhs_dtype)]
    return _ffi.plan_grouped_gemm(codes, rhs_kn, out, True, use_split_accumulator)["kernel"]
