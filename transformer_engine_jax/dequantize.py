"""Dequantize a ScaledTensor: fl(code * scale) in float32, rounded once to the requested dtype, as the torch
frontend's quantized tensors do (SPEC §4.9), from the rowwise copy when there is one, else from the colwise copy.
The scale layouts, block shapes and decode rules are the core's format table's (csrc/core/formats/table.h, read at
import through `ScalingMode.format_row`; compact scales: tej quantizers write them). NVFP4 decodes with the torch
frontend's factors (`nvfp4_decode_factors` in transformer_engine_torch/formats/nvfp4.py), op for op, so the bytes
match; tests/test_format_table.py checks every decode against the core's host decode (`_ffi.format_decode`)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import _fp32
from .quantizers import ScalingMode

# The format table's decode rules (table.h DecodeRule) and the NVFP4 block length.
_TENSOR_SCALE, _E8M0_BLOCK, _NVFP4, _F32_BLOCK = 1, 2, 3, 4
_NV = ScalingMode.NVFP4_1D_SCALING.format_row["row"]["block"][1]
_FLT_MAX = np.finfo(np.float32).max
_INV_2688 = _fp32.const(np.float32(1) / np.float32(2688))  # fl(1/2688)
_INV_FLT_MAX = _fp32.const(2.0 ** -128)                     # fl(1/FLT_MAX), subnormal
# E2M1 code -> value (SPEC §2), as FP32 bits: bit 3 the sign (code 8 is -0.0), codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6.
_E2M1_BITS = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                      np.float32).view(np.uint32)


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


def _nvfp4_factors(sf, amax):
    """Bits of the per-block decode factors D (x = fl(e2m1 * D)) from the bits of the decoded E4M3 block scales
    `sf` and of the copy's global amax (>= 0 or NaN, as the quantizer writes it), as the torch frontend's
    `nvfp4_decode_factors` (SPEC §4.6, issue 19): TE's fl(fl(sf * amax) * fl(1/2688)) wherever that is finite and
    the scale the quantizer used; else the reciprocal of the quantizer's multiplier: fl(sf * S_dec) (S_dec =
    fl(1 / S_enc), S_enc = min(fl(2688 / amax), FLT_MAX), 1 for amax 0 or Inf), 2^-128 where the multiplier was
    clamped to FLT_MAX, 0 where sf = 0. So a finite input never decodes to Inf or NaN."""
    te = _fp32.mul(_fp32.mul(sf, amax), _INV_2688)
    usual = (amax - 1) < (_fp32.EXP - 1)                                          # 0 < amax < Inf
    s_enc = _fp32.div(_fp32.const(2688), jnp.where(usual, amax, _fp32.const(1)))   # Inf for amax < 2688/FLT_MAX
    regular = usual & _fp32.is_finite(s_enc)
    s_enc = jnp.where(_fp32.is_finite(s_enc), s_enc, _fp32.const(_FLT_MAX))
    s_dec = jnp.where(usual, _fp32.recip(s_enc), jnp.where(_fp32.is_nan(amax), amax, _fp32.const(1)))
    y = _fp32.mul(sf, s_dec)
    enc_clamped = (y & _fp32.ABS) <= _INV_FLT_MAX     # |y| <= 2^-128: fl(1 / y) is Inf, the multiplier was FLT_MAX
    ours = jnp.where(_fp32.is_zero(sf), _fp32.const(0), jnp.where(enc_clamped, _INV_FLT_MAX, y))
    return jnp.where(regular & ~enc_clamped & _fp32.is_finite(te), te, ours)


@functools.partial(jax.jit, static_argnums=(3, 4))   # one compiled decode per shape, also for eager calls
def _dequantize_nvfp4(data, scale, amax, r, c):
    """float32 [r, c] of one NVFP4 copy as stored: `data` uint8 [r, c/2] (two E2M1 codes a byte, the even element
    in the low nibble), `scale` uint8 E4M3 [>= r, >= c/16] (padded), `amax` f32[1] the copy's global amax. On the
    bits throughout (`_fp32`): tiny amaxes give subnormal factors and values, which XLA's CPU would flush."""
    sf = jax.lax.bitcast_convert_type(scale[:r, :c // _NV], jnp.float8_e4m3fn).astype(jnp.float32)
    factor = _nvfp4_factors(_fp32.bits(sf), _fp32.bits(amax.astype(jnp.float32)).reshape(1, 1))
    packed = data.reshape(r, c // 2)
    codes = jnp.stack((packed & 0xF, packed >> 4), axis=-1).reshape(r, c)
    return _fp32.from_bits(_fp32.mul(jnp.asarray(_E2M1_BITS)[codes], jnp.repeat(factor, _NV, axis=1)))


def dequantize(t, dtype=None):
    """The values of ScaledTensor `t` in `dtype` (default: the dtype it was quantized from)."""
    dtype = t.dq_dtype if dtype is None else dtype
    mode = t.scaling_mode
    colwise = t.data is None
    data = t.colwise_data if colwise else t.data
    scale = t.colwise_scale_inv if colwise else t.scale_inv
    if data is None:
        raise ValueError(f"dequantize: the ScaledTensor ({mode.name}, shape {t.shape}) holds no data")
    m, k = _rows_cols(t.shape)
    row = mode.format_row
    if row["decode"] == _NVFP4:
        # The colwise copy holds x^T [K, M] (SPEC §4.9) with its own amax; 1-D and 2-D decode alike (the 2-D tile
        # scale is written into every entry it covers).
        amax = t.colwise_amax if colwise else t.amax
        if amax is None:
            raise ValueError(f"dequantize: the NVFP4 ScaledTensor (shape {t.shape}) has no "
                             f"{'colwise_amax' if colwise else 'amax'}; NVFP4 decoding needs the copy's global amax")
        out = _dequantize_nvfp4(data, scale, amax, *((k, m) if colwise else (m, k))).astype(dtype)
        return (out.T if colwise else out).reshape(t.shape)
    rule = row["col" if colwise else "row"]
    r, c = (k, m) if rule["transposed"] else (m, k)  # the stored matrix
    v = data.reshape(r, c).astype(jnp.float32)
    if row["decode"] == _TENSOR_SCALE:
        f = scale.reshape(())
    else:  # one scale per block: entry [i, j] covers the elements whose sources (rows M / cols K) give i and j
        f = _block_factors(scale, rule, m, k)
        if row["decode"] == _E8M0_BLOCK:
            f = _e8m0(f)
        (src0, b0, _, _), (_, b1, _, _) = rule["scale"]
        if (src0 == 0) == rule["transposed"]:   # the scale's first dim runs along the stored columns
            f, b0, b1 = f.T, b1, b0
        f = _expand(f, r, c, b0, b1)
    out = (v * f).astype(dtype)
    if rule["transposed"]:
        out = out.T
    return out.reshape(t.shape)


def _block_factors(scale, rule, m, k):
    """The used entries of a compact scale matrix (the padding cut off): per dim, div(source, block)."""
    n = [(m if src == 0 else k) // b if exact else _ceil_div(m if src == 0 else k, b)
         for src, b, _, exact in rule["scale"]]
    return scale[:n[0], :n[1]]
