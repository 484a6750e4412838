"""NVFP4 (SPEC §4.6 two-level scaling, stochastic rounding and the random Hadamard transform, §4.8 scale shapes):
1x16 blocks (or 16x16 tiles) of E2M1 with an E4M3 scale each under an FP32 global scale, and the decode factors of
dequantize."""
import torch

from .common import F32, F64, FLT_MAX, ceil_div, roundup
from .e2m1 import e2m1_decode, e2m1_encode, e2m1_encode_sr, nv_pack, nv_unpack
from .fp8 import fp8_decode, fp8_encode
from .per_tensor import amax_ref

NV_BLOCK = 16
NV_INV6 = torch.tensor(1.0, dtype=F32) / torch.tensor(6.0, dtype=F32)         # fl(1/6)
NV_INV2688 = torch.tensor(1.0, dtype=F32) / torch.tensor(2688.0, dtype=F32)   # fl(1/2688)
RHT_SIGNS = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]   # SPEC §4.6, as a list


def nv_scale_shapes(M, K):
    return (roundup(M, 128), roundup(K // NV_BLOCK, 4)), (roundup(K, 128), roundup(M // NV_BLOCK, 4))


def nv_global_scale(amax):
    """S_enc = min(fl(2688 / amax), FLT_MAX); 1 when amax == 0 or S_enc == 0 (FP32 tensor ops)."""
    amax = torch.as_tensor(amax, dtype=F32)
    s = torch.tensor(2688.0, dtype=F32) / amax
    s = torch.clamp(s, max=FLT_MAX)
    return torch.where((amax == 0) | (s == 0), torch.ones_like(s), s)


def philox4x32_10(ctr, key):
    """Philox4x32-10 on Python ints (4 counter words, 2 key words)."""
    m = 0xFFFFFFFF
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & m, p1 & m, ((p0 >> 32) ^ c3 ^ k1) & m, p0 & m
        k0, k1 = (k0 + 0x9E3779B9) & m, (k1 + 0xBB67AE85) & m
    return [c0, c1, c2, c3]


def nv_block_random_bytes(seed, offset, n_blocks, copy):
    """[n_blocks, 16] random bytes: block b of copy 0 (rowwise) / 1 (columnwise) draws Philox at counter
    (b lo, b hi | copy << 31, offset lo, offset hi), key (seed lo, seed hi); byte j drives element j."""
    out = torch.zeros(n_blocks, 16, dtype=torch.int64)
    for b in range(n_blocks):
        w = philox4x32_10([b & 0xFFFFFFFF, (b >> 32) | (copy << 31), offset & 0xFFFFFFFF, offset >> 32],
                          [seed & 0xFFFFFFFF, seed >> 32])
        for j in range(16):
            out[b, j] = (w[j // 4] >> (8 * (j % 4))) & 0xFF
    return out


def rht_ref(v, sign_mask_on=True):
    """SPEC §4.6 transform of each contiguous 16-vector of the rows of v [R, C] (FP32, C % 16 == 0):
    w_i = fl(v_i * s_i / 4) (exact), y_j = w_0 * H[0][j] + w_1 * H[1][j] + ... in FP32 in index order, rounded
    to bf16 (returned widened to FP32)."""
    R, C = v.shape
    s = torch.tensor(RHT_SIGNS if sign_mask_on else [1] * 16, dtype=F32)
    idx = torch.arange(16)
    h = torch.tensor([[(-1.0) ** bin(i & j).count("1") for j in range(16)] for i in range(16)], dtype=F32)
    w = v.reshape(R, C // 16, 16) * s * 0.25
    acc = w[..., 0:1] * h[0]
    for i in idx[1:].tolist():
        acc = acc + w[..., i:i + 1] * h[i]
    return acc.to(torch.bfloat16).to(F32).reshape(R, C)


def rht_matrix_ref(sign_mask_on=True):
    """R = diag(s) * H16 / 4 in float64."""
    s = torch.tensor(RHT_SIGNS if sign_mask_on else [1] * 16, dtype=F64)
    h = torch.tensor([[(-1.0) ** bin(i & j).count("1") for j in range(16)] for i in range(16)], dtype=F64)
    return s[:, None] * h / 4


def _nv_copy(v, amax, two_d_tile_amax=None, rbytes=None):
    """1x16 blocks along the rows of the FP32 [R, C] values v with global amax `amax`: (packed [R, C/2],
    scale bytes [R, C/16]). `two_d_tile_amax` [R, C/16] replaces the block amaxes (2-D tiles); `rbytes`
    [R * C/16, 16] random bytes switch to stochastic rounding."""
    R, C = v.shape
    s_enc = nv_global_scale(amax)
    s_dec = torch.tensor(1.0, dtype=F32) / s_enc
    blocks = v.reshape(R, C // NV_BLOCK, NV_BLOCK)
    a = torch.where(torch.isnan(blocks), torch.zeros_like(blocks), blocks.abs())
    bamax = a.amax(dim=-1) if two_d_tile_amax is None else two_d_tile_amax
    sf = fp8_encode(bamax * (s_enc * NV_INV6), "e4m3")                       # two fp32 ops, then RNE E4M3
    enc = torch.tensor(1.0, dtype=F32) / (fp8_decode(sf, "e4m3") * s_dec)      # fl(1 / fl(sf * S_dec))
    enc = torch.clamp(enc, max=FLT_MAX)
    scaled = blocks * enc[..., None]
    if rbytes is None:
        codes = e2m1_encode(scaled)
    else:
        codes = e2m1_encode_sr(scaled, rbytes.reshape(R, C // NV_BLOCK, NV_BLOCK))
    return nv_pack(codes.reshape(R, C)), sf


class NVRef:
    def __init__(self, row, row_scale, col, col_scale, amax_row, amax_col):
        self.row, self.row_scale, self.col, self.col_scale = row, row_scale, col, col_scale
        self.amax_row, self.amax_col = amax_row, amax_col


def quantize_nvfp4_ref(x, rowwise=True, columnwise=True, two_d=False, rht=False, sign_mask_on=True, amax=None,
                       data=None, seed=None, offset=0):
    """SPEC §4.6 on x (any shape, last dim % 16 == 0): data packed, scales compact and zero-padded to §4.8.
    `data` (default x) are the values encoded; `amax` (default amax(x)) the global amax of both copies when no RHT
    (the fused activation path passes the unrounded activation's amax). `seed` switches on stochastic rounding
    with the Philox stream of (seed, offset). Returns NVRef with float32 [1] amaxes."""
    x = x.detach().cpu().to(F32)
    K = x.shape[-1]
    M = x.numel() // K if K else 0
    v = (x if data is None else data.detach().cpu().to(F32)).reshape(M, K)
    g_row = amax_ref(x) if amax is None else torch.as_tensor(amax, dtype=F32).reshape(())
    (rr, rc), (cr, cc) = nv_scale_shapes(M, K)
    tile = None
    if two_d:
        nb = ceil_div(M, NV_BLOCK)
        pad = torch.zeros(nb * NV_BLOCK, K, dtype=F32)
        pad[:M] = torch.where(torch.isnan(v), torch.zeros_like(v), v.abs())
        tile = pad.reshape(nb, NV_BLOCK, K // NV_BLOCK, NV_BLOCK).amax(dim=(1, 3))     # [M/16, K/16]
    out = NVRef(None, None, None, None, None, None)
    if rowwise:
        t = None if tile is None else tile.repeat_interleave(NV_BLOCK, 0)[:M]
        rb = None if seed is None else nv_block_random_bytes(seed, offset, M * (K // NV_BLOCK), 0)
        out.row, sf = _nv_copy(v, g_row, t, rb)
        out.row_scale = torch.zeros(rr, rc, dtype=torch.uint8)
        out.row_scale[:M, :K // NV_BLOCK] = sf
        out.amax_row = g_row.reshape(1).clone()
    if columnwise:
        vt = v.t().contiguous()                       # [K, M]
        if rht:
            vt = rht_ref(vt, sign_mask_on)
            g_col = amax_ref(vt)
        else:
            g_col = g_row
        t = None if tile is None else tile.t().repeat_interleave(NV_BLOCK, 0)
        rb = None if seed is None else nv_block_random_bytes(seed, offset, K * (M // NV_BLOCK), 1)
        out.col, sf = _nv_copy(vt, g_col, t, rb)
        out.col_scale = torch.zeros(cr, cc, dtype=torch.uint8)
        out.col_scale[:K, :M // NV_BLOCK] = sf
        out.amax_col = g_col.reshape(1).clone()
    return out


NV_INV_FLT_MAX = torch.tensor(1.0, dtype=F32) / torch.tensor(FLT_MAX, dtype=F32)   # fl(1/FLT_MAX) = 2^-128


def nv_decode_factors_ref(sf, amax, formula="ours"):
    """Per-block FP32 decode factor D of one NVFP4 copy (dequantized x = fl(e2m1 * D)); sf: float32 block scales
    (decoded E4M3), amax: the copy's global amax.
    formula="te": TE's D = fl(fl(sf * amax) * fl(1/2688)) (SPEC §4.6), which overflows once sf * amax does (amax
    above FLT_MAX/448, about 7.6e35) and is Inf/NaN for every block when amax is Inf.
    formula="ours" (the rule NVFP4Tensor.dequantize follows): D = the TE value where the quantizer's scales are
    the ones TE's formula assumes and that value is finite -- amax finite and > 0, fl(2688 / amax) finite (S_enc
    not clamped to FLT_MAX), the block's element multiplier enc = min(fl(1 / fl(sf * S_dec)), FLT_MAX) not clamped
    -- and the reciprocal of the multiplier the quantizer applied everywhere else, case by case:
      sf = 0 (a block of zeros / NaNs)                 -> D = 0 (the codes are 0 or NaN's 0x7)
      enc clamped to FLT_MAX                           -> D = fl(1 / enc) = fl(1/FLT_MAX) = 2^-128
      otherwise                                        -> D = fl(sf * S_dec), S_dec = fl(1 / S_enc) of the quantizer
    (amax 0 or Inf: S_enc = 1, so D = sf)."""
    sf = sf.to(F32)
    amax = torch.as_tensor(amax, dtype=F32).reshape(())
    te = (sf * amax) * NV_INV2688                                  # two fp32 multiplies
    if formula == "te":
        return te
    assert formula == "ours", formula
    s_enc = nv_global_scale(amax)
    s_dec = torch.tensor(1.0, dtype=F32) / s_enc
    y = sf * s_dec                                                 # fl(sf * S_dec)
    enc = torch.clamp(torch.tensor(1.0, dtype=F32) / y, max=FLT_MAX)   # the quantizer's multiplier (as in _nv_copy)
    enc_clamped = enc == FLT_MAX
    global_ok = bool(torch.isfinite(amax)) and float(amax) > 0 and \
        bool(torch.isfinite(torch.tensor(2688.0, dtype=F32) / amax))
    recip = torch.where(sf == 0, torch.zeros_like(y), torch.where(enc_clamped, NV_INV_FLT_MAX.expand_as(y), y))
    keep_te = torch.isfinite(te) & ~enc_clamped & global_ok
    return torch.where(keep_te, te, recip)


def dequantize_nvfp4_ref(packed, scale, amax, otype=F32, formula="ours"):
    """x = fl(e2m1 * D) on one copy [R, C/2], rounded once to otype; D per block from `nv_decode_factors_ref`
    (formula "te": TE's fl(fl(float(sf) * amax) * fl(1/2688)) of SPEC §4.6 everywhere)."""
    R, C = packed.shape[0], packed.shape[1] * 2
    sf = fp8_decode(scale[:R, :C // NV_BLOCK].contiguous(), "e4m3")
    f = nv_decode_factors_ref(sf, amax, formula).repeat_interleave(NV_BLOCK, 1)
    return (e2m1_decode(nv_unpack(packed)) * f).to(otype)
