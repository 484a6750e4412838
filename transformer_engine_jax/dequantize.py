"""Dequantize a ScaledTensor: fl(code * scale) in float32, rounded once to the requested dtype, as the torch
frontend's quantized tensors do (SPEC §4.9), from the rowwise copy when there is one, else from the colwise copy.
The scale layouts are SPEC §4.8's (unswizzled). NVFP4 decoding is not provided here yet."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .quantizers import ScalingMode

_MX, _FB = 32, 128


def _e8m0(codes):
    """Exact 2^(e - 127) of uint8 E8M0 codes (0: the subnormal 2^-127; 255: NaN)."""
    c = codes.astype(jnp.uint32)
    bits = jnp.where(c == 0, jnp.uint32(0x400000), c << 23)
    bits = jnp.where(c == 255, jnp.uint32(0x7FC00000), bits)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _ceil_div(a, b):
    return -(-a // b)


def _rows_cols(shape):
    k = shape[-1] if shape else 1
    m = 1
    for d in shape[:-1]:
        m *= d
    return m, k


def _expand(f, rows, cols, per_row, per_col):
    return jnp.repeat(jnp.repeat(f, per_row, axis=0)[:rows], per_col, axis=1)[:, :cols]


def dequantize(t, dtype=None):
    """The values of ScaledTensor `t` in `dtype` (default: the dtype it was quantized from)."""
    dtype = t.dq_dtype if dtype is None else dtype
    mode = t.scaling_mode
    colwise = t.data is None
    data = t.colwise_data if colwise else t.data
    scale = t.colwise_scale_inv if colwise else t.scale_inv
    if data is None:
        raise ValueError(f"dequantize: the ScaledTensor ({mode.name}, shape {t.shape}) holds no data")
    if mode in (ScalingMode.NVFP4_1D_SCALING, ScalingMode.NVFP4_2D_SCALING):
        raise NotImplementedError("dequantize: NVFP4 decoding is not provided by tej yet; dequantize NVFP4 through "
                                  "transformer_engine_torch or use an FP8/MXFP8 quantizer")
    m, k = _rows_cols(t.shape)
    r, c = (k, m) if colwise and mode != ScalingMode.MXFP8_1D_SCALING else (m, k)  # the stored matrix
    v = data.reshape(r, c).astype(jnp.float32)
    if mode in (ScalingMode.DELAYED_TENSOR_SCALING, ScalingMode.CURRENT_TENSOR_SCALING):
        f = scale.reshape(())
    elif mode == ScalingMode.MXFP8_1D_SCALING:
        if colwise:  # [roundup(ceil(M/32), 4), roundup(K, 128)]: 32x1 blocks down the rows
            f = _expand(_e8m0(scale[:_ceil_div(m, _MX), :k]), m, k, _MX, 1)
        else:        # [roundup(M, 128), roundup(K/32, 4)]
            f = _expand(_e8m0(scale[:m, :_ceil_div(k, _MX)]), m, k, 1, _MX)
    elif mode == ScalingMode.BLOCK_SCALING_128x128:
        f = _expand(scale[:_ceil_div(r, _FB), :_ceil_div(c, _FB)], r, c, _FB, _FB)
    else:  # 1x128 blocks along the stored rows; the scale matrix is [block, row]
        f = _expand(scale[:_ceil_div(c, _FB), :r].T, r, c, 1, _FB)
    out = (v * f).astype(dtype)
    if colwise and mode != ScalingMode.MXFP8_1D_SCALING:
        out = out.T
    return out.reshape(t.shape)
