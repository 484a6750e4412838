"""FP8 block scaling (SPEC §4.7 block rule, §4.8 scale shapes, §4.9 transposed columnwise copy): 1x128 or 128x128
blocks with an FP32 scale each."""
import math

import torch

from .common import F32, F64, ceil_div, roundup
from .fp8 import FP8_MAX, fmt_of, fp8_decode, fp8_encode

FB_BLOCK = 128


def input_max_finite(dtype):
    """The input dtype's largest finite value as an FP32 0-d tensor (bf16: 0x7F7F0000, fp16: 65504)."""
    return torch.tensor(torch.finfo(dtype).max, dtype=F64).to(F32)


def fb_scale_shapes(M, K, block_dim):
    """(rowwise, columnwise) padded scale shapes of SPEC §4.8."""
    mb, kb = ceil_div(M, FB_BLOCK), ceil_div(K, FB_BLOCK)
    if block_dim == 2:
        return (mb, roundup(kb, 4)), (kb, roundup(mb, 4))
    return (kb, roundup(M, 4)), (mb, roundup(K, 4))


def fb_block_scale(amax, fmt, pow2, eps, in_max):
    """SPEC §4.4 step 3 with §4.7's change, elementwise on an FP32 tensor of block amaxes (NaN already ignored):
    amax < eps -> eps; amax 0 or Inf -> 1; else fl(fp8_max / amax) (one FP32 division), Inf -> in_max;
    pow2 clears the 23 mantissa bits."""
    a = torch.where(amax < torch.tensor(eps, dtype=F32), torch.tensor(eps, dtype=F32), amax)
    special = (a == 0) | torch.isinf(a) | torch.isnan(a)
    safe = torch.where(special, torch.ones_like(a), a)
    s = torch.tensor(FP8_MAX[fmt_of(fmt)], dtype=F32) / safe
    s = torch.where(torch.isinf(s), in_max.expand_as(s), s)
    s = torch.where(special, torch.ones_like(s), s)
    if pow2:
        s = torch.bitwise_and(s.contiguous().view(torch.int32), torch.tensor(-8388608, dtype=torch.int32)).view(F32)
    return s


def _fb_amax(blocks, dims):
    """max |v| over `dims`, NaN ignored (padding zeros never raise it)."""
    a = blocks.abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    return a.amax(dim=dims)


def _fb_rows_1x128(v, fmt, pow2, eps, in_max):
    """1x128 blocks along the rows of an FP32 [R, C] matrix: (codes [R, C], scale_inv [R, ceil(C/128)])."""
    R, C = v.shape
    nb = ceil_div(C, FB_BLOCK)
    padded = torch.zeros(R, nb * FB_BLOCK, dtype=F32)
    padded[:, :C] = v
    blocks = padded.reshape(R, nb, FB_BLOCK)
    scale = fb_block_scale(_fb_amax(blocks, -1), fmt, pow2, eps, in_max)      # [R, nb]
    q = fp8_encode(blocks * scale[..., None], fmt).reshape(R, nb * FB_BLOCK)[:, :C]
    return q.contiguous(), torch.ones((), dtype=F32) / scale


class FBRef:
    """Reference FP8 block result: row [M, K] uint8, col [K, M] uint8 (the stored transposed copy), compact padded
    float32 scales; None for an absent copy."""

    def __init__(self, row, row_scale, col, col_scale):
        self.row, self.row_scale, self.col, self.col_scale = row, row_scale, col, col_scale


def quantize_fp8_block_ref(x, fmt, block_dim=2, pow2=True, eps=0.0, rowwise=True, columnwise=True):
    """SPEC §4.7 on `x` (any shape, float32/float16/bfloat16; its dtype sets the Inf-scale replacement): flattened
    to [M, K] (0-d: [1, 1]); q = fp8(fl(x * scale)), scale_inv = fl(1 / scale). 1-D: rowwise 1x128 blocks along K;
    columnwise = x^T [K, M] quantized with 1x128 blocks along its rows. 2-D: one scale per 128x128 tile; the
    columnwise copy is the bitwise transpose. Partial edge blocks use the elements that exist."""
    fmt = fmt_of(fmt)
    in_max = input_max_finite(x.dtype)
    v = x.detach().cpu().to(F32)
    K = v.shape[-1] if v.dim() else 1
    M = math.prod(v.shape[:-1]) if v.dim() else 1
    v = v.reshape(M, K)
    (rr, rc), (cr, cc) = fb_scale_shapes(M, K, block_dim)
    row = row_scale = col = col_scale = None
    if block_dim == 2:
        mb, kb = ceil_div(M, FB_BLOCK), ceil_div(K, FB_BLOCK)
        padded = torch.zeros(mb * FB_BLOCK, kb * FB_BLOCK, dtype=F32)
        padded[:M, :K] = v
        tiles = padded.reshape(mb, FB_BLOCK, kb, FB_BLOCK)
        scale = fb_block_scale(_fb_amax(tiles, (1, 3)), fmt, pow2, eps, in_max)   # [mb, kb]
        q = fp8_encode(tiles * scale[:, None, :, None], fmt).reshape(mb * FB_BLOCK, kb * FB_BLOCK)[:M, :K]
        sinv = torch.ones((), dtype=F32) / scale
        if rowwise:
            row = q.contiguous()
            row_scale = torch.zeros(rr, rc, dtype=F32)
            row_scale[:, :kb] = sinv
        if columnwise:
            col = q.t().contiguous()
            col_scale = torch.zeros(cr, cc, dtype=F32)
            col_scale[:, :mb] = sinv.t()
        return FBRef(row, row_scale, col, col_scale)
    if rowwise:
        row, sinv = _fb_rows_1x128(v, fmt, pow2, eps, in_max)                       # sinv [M, kb]
        row_scale = torch.zeros(rr, rc, dtype=F32)
        row_scale[:, :M] = sinv.t()
    if columnwise:
        col, sinv = _fb_rows_1x128(v.t().contiguous(), fmt, pow2, eps, in_max)      # [K, M], sinv [K, mb]
        col_scale = torch.zeros(cr, cc, dtype=F32)
        col_scale[:, :K] = sinv.t()
    return FBRef(row, row_scale, col, col_scale)


def dequantize_fp8_block_ref(r, fmt, block_dim, shape, otype, columnwise=False):
    """fl(decode(code) * scale_inv[block]) in FP32, rounded once to otype, element by element through explicit
    block indices; the columnwise copy is transposed back to `shape`."""
    fmt = fmt_of(fmt)
    codes, scale = (r.col, r.col_scale) if columnwise else (r.row, r.row_scale)
    R, C = codes.shape
    ri = torch.arange(R).reshape(R, 1).expand(R, C)
    ci = torch.arange(C).reshape(1, C).expand(R, C)
    if block_dim == 2:
        f = scale[ri // FB_BLOCK, ci // FB_BLOCK]   # the stored copy's own tile grid (transposed for columnwise)
    else:
        f = scale[ci // FB_BLOCK, ri]               # [block along the stored row, stored row]
    out = (fp8_decode(codes, fmt) * f).to(otype)
    return (out.t() if columnwise else out).reshape(shape)
