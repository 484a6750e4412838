"""MXFP8 (SPEC §2 E8M0 encode, §4.5 block rule, §4.8 scale shapes and swizzled layout): 1x32 blocks with a
power-of-two E8M0 scale, rowwise and columnwise copies, compact padded scales and their swizzle."""
import math

import torch

from .common import F32, F64, ceil_div, roundup
from .fp8 import FP8_MAX, fmt_of, fp8_decode, fp8_encode

MX_BLOCK = 32
# fl(1/fp8_max): one FP32 division, done here once; the block rule MULTIPLIES by it.
MX_INV_MAX = {fmt: torch.tensor(1.0, dtype=F32) / torch.tensor(m, dtype=F32) for fmt, m in FP8_MAX.items()}
# Largest exponent of the format (the OCP rule's emax): 448 = 1.75 * 2^8, 57344 = 1.75 * 2^15.
FP8_EMAX = {"e4m3": 8, "e5m2": 15}


def mx_scale_shapes(M, K):
    """(rowwise, columnwise) padded scale shapes of SPEC §4.8."""
    return (roundup(M, 128), roundup(ceil_div(K, MX_BLOCK), 4)), (roundup(ceil_div(M, MX_BLOCK), 4), roundup(K, 128))


def e8m0_encode(v):
    """SPEC §2 E8M0 encode of a non-negative FP32 tensor, rounding UP, on its bit fields E and F:
    NaN -> 0xFF, +Inf -> 0xFE, E = 0 -> (0 if F <= 0x400000 else 1), E = 0xFE -> 0xFE, else E + (F != 0)."""
    assert v.dtype == F32
    bits = v.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    E = (bits >> 23) & 0xFF
    Fm = bits & 0x7FFFFF
    code = E + (Fm != 0).to(torch.int64)
    code = torch.where(E == 0, torch.where(Fm <= 0x400000, 0, 1), code)
    code = torch.where(E == 0xFE, 0xFE, code)
    code = torch.where(E == 0xFF, torch.where(Fm == 0, 0xFE, 0xFF), code)
    return code.to(torch.uint8)


def e8m0_encode_scalar(v):
    """Torch-free: the smallest power of two 2^(e-127) >= v (float64 math on an FP32 value), e clamped
    to [0, 254]; NaN -> 255, Inf -> 254. Validates `e8m0_encode`."""
    if math.isnan(v):
        return 255
    if math.isinf(v):
        return 254
    if v <= 2.0 ** -127:
        return 0
    m, ex = math.frexp(v)                   # v = m * 2^ex, 0.5 <= m < 1
    log2_up = ex - 1 if m == 0.5 else ex    # ceil(log2(v))
    return min(log2_up + 127, 254)


def e8m0_floor_rule(amax, fmt):
    """The OCP-MX rule SPEC §4.5 says NOT to use: floor(log2 amax) - emax (a wrong answer for tests)."""
    a = amax.to(F64)
    e = torch.floor(torch.log2(torch.where(a > 0, a, torch.ones_like(a)))) - FP8_EMAX[fmt_of(fmt)] + 127
    return torch.where(a > 0, e, torch.zeros_like(e)).clamp(0, 254).to(torch.uint8)


def e8m0_multiplier(codes):
    """2^(127 - e) as exact FP32 (e = 254 -> 2^-127, a subnormal), via float64 powers of two; 255 -> NaN."""
    c = codes.to(F64)
    m = torch.pow(torch.tensor(2.0, dtype=F64), 127.0 - c)
    return torch.where(codes == 255, torch.full_like(m, math.nan), m).to(F32)


def e8m0_value(codes):
    """2^(e - 127) as exact FP32; 255 -> NaN."""
    c = codes.to(F64)
    m = torch.pow(torch.tensor(2.0, dtype=F64), c - 127.0)
    return torch.where(codes == 255, torch.full_like(m, math.nan), m).to(F32)


def _mx_blocks(v, fmt):
    """Per-row 1x32 block rule on an FP32 [R, K] tensor: (codes [R, K], scale bytes [R, K/32])."""
    R, K = v.shape
    blocks = v.reshape(R, K // MX_BLOCK, MX_BLOCK)
    a = blocks.abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)      # NaN ignored, Inf kept
    amax = a.amax(dim=-1) if K else torch.zeros(R, 0, dtype=F32)
    e = e8m0_encode(amax * MX_INV_MAX[fmt_of(fmt)])          # one fp32 multiply, then round up
    q = fp8_encode(blocks * e8m0_multiplier(e)[..., None], fmt)  # one fp32 multiply, then the encoder
    return q.reshape(R, K), e


class MXRef:
    """Reference MXFP8 result: data [M, K] uint8 per copy (None if absent), compact padded scales."""

    def __init__(self, row, row_scale, col, col_scale):
        self.row, self.row_scale, self.col, self.col_scale = row, row_scale, col, col_scale


def quantize_mxfp8_ref(v, fmt, rowwise=True, columnwise=True):
    """SPEC §4.5 on the FP32 values `v` (any shape, last dim % 32 == 0): each copy from `v` independently.
    Columnwise blocks are 32 consecutive rows of one column; a partial last block covers the rows that exist
    (zero rows added for the amax only). Scales are compact, padded with zeros to the §4.8 shapes."""
    fmt = fmt_of(fmt)
    v = v.detach().to(F32).cpu()
    K = v.shape[-1]
    M = v.numel() // K if K else math.prod(v.shape[:-1])
    v2 = v.reshape(M, K)
    (rr, rc), (cr, cc) = mx_scale_shapes(M, K)
    row = row_scale = col = col_scale = None
    if rowwise:
        row, e = _mx_blocks(v2, fmt)
        row_scale = torch.zeros(rr, rc, dtype=torch.uint8)
        row_scale[:M, :K // MX_BLOCK] = e
    if columnwise:
        nb = ceil_div(M, MX_BLOCK)
        padded = torch.zeros(nb * MX_BLOCK, K, dtype=F32)
        padded[:M] = v2
        t = padded.reshape(nb, MX_BLOCK, K).permute(0, 2, 1).reshape(nb * K, MX_BLOCK)  # blocks as rows
        q, e = _mx_blocks(t, fmt)
        col = q.reshape(nb, K, MX_BLOCK).permute(0, 2, 1).reshape(nb * MX_BLOCK, K)[:M].contiguous()
        col_scale = torch.zeros(cr, cc, dtype=torch.uint8)
        col_scale[:nb, :K] = e.reshape(nb, K)
    return MXRef(row, row_scale, col, col_scale)


def swizzle_ref(compact):
    """SPEC §4.8 swizzle of a compact [R, C] matrix (multiples of 128 x 4), element by element: (r, c) goes to byte
    (tile_row * C/4 + tile_col) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4. Returns a flat uint8 tensor."""
    R, C = compact.shape
    r = torch.arange(R).reshape(R, 1).expand(R, C)
    c = torch.arange(C).reshape(1, C).expand(R, C)
    off = ((r // 128) * (C // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    out = torch.zeros(R * C, dtype=torch.uint8)
    out[off.reshape(-1)] = compact.reshape(-1)
    return out


def swizzle_mx_ref(scale, columnwise):
    """Swizzled bytes of a compact MXFP8 scale tensor in its storage shape: columnwise scales are swizzled as
    their transpose [roundup(K, 128), roundup(ceil(M/32), 4)]."""
    return swizzle_ref(scale.t() if columnwise else scale).reshape(scale.shape)


def dequantize_mxfp8_ref(codes, scale, fmt, columnwise, otype):
    """fl(decode(code) * 2^(e - 127)) in FP32, rounded once to otype; `scale` compact."""
    M, K = codes.shape
    if columnwise:
        f = e8m0_value(scale[:ceil_div(M, MX_BLOCK), :K]).repeat_interleave(MX_BLOCK, 0)[:M]
    else:
        f = e8m0_value(scale[:M, :K // MX_BLOCK]).repeat_interleave(MX_BLOCK, 1)
    return (fp8_decode(codes, fmt) * f).to(otype)
