"""NVFP4 (SPEC §4.6): `NVFP4Tensor`, `NVFP4Quantizer`, the packed E2M1 data and E4M3 scale shapes, the decode
helpers (E2M1 values, global decode scale, random Hadamard matrix) and the fake outputs of its quantizing ops.
Two E2M1 codes per byte, one E4M3 scale per 16 elements and a float32 global amax per copy; the columnwise copy is
the transpose, stored 2-D `[K, M/2]`."""
from __future__ import annotations

import torch

from ..dtypes import DType, as_dtype, to_torch_dtype
from .base import (QFLAG_2D, QFLAG_RANDOM_SIGN, QFLAG_RHT, QFLAG_SR, QFLAG_SWIZZLED, NativeGemm, Quantizer,
                   _rows_cols, _swizzle, _TwoCopyTensor, register_format)
from .table import FORMATS, Format, block_len, data_shapes, scale_shapes

__all__ = ["NVFP4Tensor", "NVFP4Quantizer"]

QKIND_NVFP4, = FORMATS[Format.NVFP4]["kinds"]  # quantizer kind (SPEC §1.4), from the core's format table
NV_BLOCK = block_len(Format.NVFP4)  # 16
# The sign vector s of the random Hadamard transform (SPEC §4.6) as a bitmask: bit i set where s_i = -1.
RHT_SIGN_MASK = 0xD7E8


def nvfp4_scale_shapes(shape):
    """(rowwise, columnwise) padded E4M3 scale shapes of SPEC §4.8 for a tensor of `shape` (K % 16 == 0; the
    format table's)."""
    return scale_shapes(Format.NVFP4, shape)


def nvfp4_data_shapes(shape):
    """(rowwise, columnwise) packed-data shapes: shape[:-1] + (K/2,) and the transposed 2-D [K, M/2] (the format
    table's)."""
    return data_shapes(Format.NVFP4, shape)


def swizzle_nvfp4_scales(scale, inverse=False):
    """Compact <-> GEMM-swizzled bytes of an NVFP4 scale tensor (both copies are swizzled as stored, SPEC §4.8)."""
    r, c = scale.shape
    if r == 0 or c == 0:
        return scale.clone()
    return _swizzle(scale, r, c, inverse=inverse)


def _e2m1_values(device):
    """float32 value of each E2M1 code 0..15 (sign bit 3, then 2 exponent bits and 1 mantissa bit, bias 1):
    0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (-0.0 for code 8). Computed on `device` from an arange, so no
    host-to-device copy (which a CUDA graph capture forbids)."""
    code = torch.arange(16, dtype=torch.int32, device=device)
    e, m = (code >> 1) & 3, (code & 1).to(torch.float32)
    mag = torch.where(e == 0, 0.5 * m, torch.exp2((e - 1).to(torch.float32)) * (1.0 + 0.5 * m))
    # times -1.0, not unary minus: IEEE multiplication makes -0.0 of 0.0, where a compiler may emit 0 - x
    # (inductor's Triton code did: code 8 came out +0.0)
    return mag * torch.where((code & 8) != 0, -1.0, 1.0)


def e2m1_unpack(packed, k):
    """float32 values of packed E2M1 bytes [..., k/2] -> [..., k] (even element in the low nibble)."""
    codes = torch.stack(((packed & 0xF), (packed >> 4)), dim=-1).reshape(*packed.shape[:-1], k)
    return _e2m1_values(packed.device)[codes.long()]


def rht_matrix(sign_mask=RHT_SIGN_MASK, dtype=torch.float32, device=None):
    """R = diag(s) * H16 / 4 (SPEC §4.6), H16[i][j] = (-1)^popcount(i & j), s_t = -1 where bit t of sign_mask is set;
    orthogonal. Built in float64 on `device` from an arange (no host-to-device copy: CUDA-graph safe)."""
    i = torch.arange(16, device=device)
    a = i[:, None] & i[None, :]
    pc = sum((a >> b) & 1 for b in range(4))
    h = 1.0 - 2.0 * (pc % 2).to(torch.float64)
    s = 1.0 - 2.0 * ((torch.full_like(i, sign_mask) >> i) & 1).to(torch.float64)
    return (s[:, None] * h / 4).to(dtype=dtype)


_FLT_MAX = torch.finfo(torch.float32).max
_INV_2688 = float(torch.tensor(1.0) / torch.tensor(2688.0))   # fl(1/2688), exactly an FP32 value
_INV_FLT_MAX = 2.0 ** -128                                   # fl(1/FLT_MAX), a subnormal FP32 value


def nvfp4_global_decode(amax):
    """(S_dec, regular) for a float32 global amax tensor, as the quantizer used them (SPEC §4.6): S_enc =
    min(fl(2688 / amax), FLT_MAX), 1 where amax is 0 or Inf; S_dec = fl(1 / S_enc). `regular`: amax is finite and
    > 0 and fl(2688 / amax) did not overflow (amax >= about 7.9e-36), so TE's amax / 2688 stands for S_dec.
    Tensor ops only (true IEEE divisions; no host sync)."""
    amax = amax.to(torch.float32)
    s_enc = torch.full_like(amax, 2688.0) / amax
    regular = (amax > 0) & torch.isfinite(s_enc) & (s_enc > 0)
    s_enc = torch.where((amax == 0) | (s_enc == 0), 1.0, torch.clamp(s_enc, max=_FLT_MAX))
    return torch.reciprocal(s_enc), regular


def nvfp4_decode_factors(sf, amax):
    """Per-block FP32 decode factors D of one NVFP4 copy (x = fl(e2m1 * D)): `sf` float32 block scales (decoded
    E4M3), `amax` the copy's float32 global amax (broadcastable to sf).

    D is TE's fl(fl(sf * amax) * fl(1/2688)) wherever that is finite and stands for the quantizer's scale: amax
    regular (`nvfp4_global_decode`), fl(sf * amax) finite (amax up to FLT_MAX / 448, about 7.6e35, for every sf)
    and the block's element multiplier enc = min(fl(1 / fl(sf * S_dec)), FLT_MAX) not clamped. Elsewhere D is the
    reciprocal of what the quantizer multiplied by: fl(sf * S_dec) (amax above 7.6e35; amax 0 or Inf, where
    S_dec = 1; amax so small that S_enc was clamped to FLT_MAX), fl(1/FLT_MAX) = 2^-128 where enc was clamped to
    FLT_MAX (sf > 0), 0 where sf = 0. Such a D is finite and at most fl(448 * S_dec), and fl(6 * fl(448 * S_dec))
    is finite for every FP32 amax (at most 1.6e-7 above amax, checked for all amax >= 2^126). TE's formula gives
    Inf above 7.6e35, Inf or NaN for every element when amax is Inf, and decodes tensors whose amax is below
    7.9e-36 (FP32/BF16 subnormal-only ones) with a scale the quantizer did not use (1e-38 -> about 4e-42)."""
    te = (sf * amax) * _INV_2688
    s_dec, regular = nvfp4_global_decode(amax)
    y = sf * s_dec
    enc_clamped = torch.isinf(torch.reciprocal(y))   # y <= 2^-128 (or 0): the quantizer's enc was FLT_MAX
    ours = torch.where(sf == 0, 0.0, torch.where(enc_clamped, _INV_FLT_MAX, y))
    return torch.where(regular & ~enc_clamped & torch.isfinite(te), te, ours)


class NVFP4Tensor(_TwoCopyTensor):
    """NVFP4 (SPEC §4.6, §4.9): `_rowwise_data` uint8 `shape[:-1] + (K/2,)` (two E2M1 codes per byte, even element
    in the low nibble), `_columnwise_data` uint8 2-D `[K, M/2]` holding the codes of the transpose (Hadamard-
    transformed when the quantizer has with_rht). Scales: uint8 E4M3 `[roundup(M, 128), roundup(K/16, 4)]` and
    `[roundup(K, 128), roundup(M/16, 4)]`, padding zero, GEMM-swizzled when `_with_gemm_swizzled_scales`.
    `_amax_rowwise` / `_amax_columnwise`: float32 [1] global amaxes (not S_enc). Data is uint8 (TE-compatible);
    `rowwise_data` / `columnwise_data` are `torch.float4_e2m1fn_x2` views where torch has that dtype."""

    gemm_format, gemm_k_multiple = "NVFP4", 32
    native_gemm = NativeGemm(((10, None), (11, None)), 120800)
    gemm_core_decodes = gemm_core_cpu = True
    gemm_native_out_dtypes = (torch.bfloat16, torch.float32)  # cuBLASLt's NVFP4 GEMM writes bf16 or fp32 only

    _BUFFERS = ("_rowwise_data", "_columnwise_data", "_amax_rowwise", "_amax_columnwise")
    _COPY_FIELDS = {"rowwise": ("_rowwise_data", "_rowwise_scale_inv", "_amax_rowwise"),
                    "columnwise": ("_columnwise_data", "_columnwise_scale_inv", "_amax_columnwise")}
    _OP_FIELDS = ("_amax_rowwise", "_amax_columnwise", "_with_gemm_swizzled_scales")
    _fp4_dtype = DType.kFloat4E2M1

    def __init__(self, *, shape=None, dtype=torch.float32, rowwise_data=None, columnwise_data=None,
                 rowwise_scale_inv=None, columnwise_scale_inv=None, amax_rowwise=None, amax_columnwise=None,
                 fp4_dtype=DType.kFloat4E2M1, quantizer=None, with_gemm_swizzled_scales=False, requires_grad=False,
                 device=None):
        if shape is None:
            if rowwise_data is None:
                raise ValueError("NVFP4Tensor: give `shape` or the rowwise data (the columnwise copy alone does not "
                                 "tell the leading dims)")
            shape = tuple(rowwise_data.shape[:-1]) + (rowwise_data.shape[-1] * 2,)
        super().__init__(shape, dtype, quantizer, requires_grad)
        self._set_copies(rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv)
        self._amax_rowwise = amax_rowwise
        self._amax_columnwise = amax_columnwise
        if as_dtype(fp4_dtype, "NVFP4Tensor: fp4_dtype") != DType.kFloat4E2M1:
            raise ValueError(f"NVFP4Tensor: fp4_dtype must be kFloat4E2M1, got {fp4_dtype}")
        self._with_gemm_swizzled_scales = bool(with_gemm_swizzled_scales)


    def _fp8_view(self, name):
        t = getattr(self, name)
        fp4 = getattr(torch, "float4_e2m1fn_x2", None)
        return t if t is None or fp4 is None else t.view(fp4)

    @staticmethod
    def _typed_scale(s):
        return None if s is None else s.view(torch.float8_e4m3fn)

    def _compact_scale(self, columnwise):
        s = self._columnwise_scale_inv if columnwise else self._rowwise_scale_inv
        return swizzle_nvfp4_scales(s, inverse=True) if self._with_gemm_swizzled_scales else s

    def dequantize(self, dtype=None) -> torch.Tensor:
        """x = fl(e2m1 * D) in FP32, rounded once to `dtype`; D = fl(fl(float(sf) * amax) * fl(1/2688)) (TE's
        formula, SPEC §4.6) wherever that is finite and the scale the quantizer used, else the reciprocal of the
        quantizer's multiplier (`nvfp4_decode_factors`), so a finite input never decodes to Inf or NaN. The rowwise
        copy when present, else the columnwise copy transposed back (with the Hadamard transform undone by R^T,
        in float64, when the quantizer applied it: approximate)."""
        dtype = self._dtype if dtype is None else to_torch_dtype(dtype)
        columnwise, data = self._dequantize_copy()
        m, k = _rows_cols(self._shape)
        r, c = (k, m) if columnwise else (m, k)
        amax = (self._amax_columnwise if columnwise else self._amax_rowwise).to(torch.float32).reshape(1, 1)
        sf = self._compact_scale(columnwise)[:r, :c // NV_BLOCK].view(torch.float8_e4m3fn).to(torch.float32)
        factor = nvfp4_decode_factors(sf, amax).repeat_interleave(NV_BLOCK, dim=1)
        v = e2m1_unpack(data.reshape(r, c // 2), c) * factor
        if columnwise:
            if getattr(self._quantizer, "with_rht", False):
                # float64: the partial sums of v . R^T reach 4 * max|v| and would overflow FP32 above FLT_MAX / 4.
                mask = RHT_SIGN_MASK if getattr(self._quantizer, "with_random_sign_mask", True) else 0
                rt = rht_matrix(mask, dtype=torch.float64, device=v.device).t()
                v = (v.double().reshape(r, c // 16, 16) @ rt).reshape(r, c)   # rounded once below
            v = v.t()
        return v.to(dtype).reshape(self._shape)

    def view(self, *shape):
        """Exact view changing only leading dims (scales and the 2-D columnwise copy are laid out over the
        flattened [M, K] and shared)."""
        new_shape = self._view_shape(shape)
        row_shape = tuple(new_shape[:-1]) + (new_shape[-1] // 2,)
        return self._map(lambda t: t, new_shape, lambda t: t.view(row_shape))

    reshape = view

    def _native_gemm_operand(self, rowwise, trans, is_a):
        # Runs as TN: the columnwise copy is stored 2-D [K, M/2] already; scales swizzled as stored into a temporary
        # when compact.
        data, sinv = self._copy(rowwise)
        if not self._with_gemm_swizzled_scales:
            sinv = swizzle_nvfp4_scales(sinv)
        return data.reshape(_rows_cols(data.shape)), sinv, int(DType.kFloat4E2M1), is_a, 3  # kGemmScalingNVFP4

    def _gemm_global_amax(self, rowwise):
        return self._amax_rowwise if rowwise else self._amax_columnwise


class NVFP4Quantizer(Quantizer):
    """NVFP4 (SPEC §4.6): E2M1 codes (two per byte) with one E4M3 scale per 1x16 block and a global FP32 scale
    S_enc = 2688 / amax(x); the tensor stores the amax. Rowwise blocks run along the last dim; the columnwise copy
    is the transpose x^T [K, M] quantized the same way (16 consecutive rows of a column per block). Options:
    `with_2d_quantization` (one scale per 16x16 tile; the columnwise data is then the exact transpose of the
    rowwise data), `stochastic_rounding` (both copies; bits from the device's default generator), `with_rht`
    (random Hadamard transform of the columnwise copy, bf16 input only, requires `with_post_rht_amax=True`).
    Shapes: K % 16 == 0; M % 16 == 0 when columnwise usage is requested. TE's positional order."""

    tensor_class = NVFP4Tensor

    def __init__(self, fp4_dtype=DType.kFloat4E2M1, rowwise: bool = True, columnwise: bool = True,
                 with_amax_reduction: bool = False, amax_reduction_group=None, with_rht: bool = False,
                 with_post_rht_amax: bool = False, with_2d_quantization: bool = False,
                 stochastic_rounding: bool = False, row_scaled_nvfp4: bool = False, nvfp4_use_4over6: bool = False,
                 nvfp4_e4m3_max: float = 448, nvfp4_4over6_err_mode: str = "MAE",
                 with_random_sign_mask: bool = True):
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        if as_dtype(fp4_dtype, "NVFP4Quantizer: fp4_dtype") != DType.kFloat4E2M1:
            raise ValueError(f"NVFP4Quantizer: fp4_dtype must be kFloat4E2M1, got {fp4_dtype}")
        self.dtype = DType.kFloat4E2M1
        for name, v, default in (("row_scaled_nvfp4", row_scaled_nvfp4, False),
                                 ("nvfp4_use_4over6", nvfp4_use_4over6, False),
                                 ("with_amax_reduction", with_amax_reduction, False)):
            if bool(v) != default:
                raise NotImplementedError(f"NVFP4Quantizer: {name}={v} is not provided; leave it at {default}")
        if float(nvfp4_e4m3_max) != 448.0:
            raise NotImplementedError(f"NVFP4Quantizer: nvfp4_e4m3_max={nvfp4_e4m3_max} is not provided; only 448")
        if with_rht and not with_post_rht_amax:
            raise ValueError("NVFP4Quantizer: with_rht=True needs with_post_rht_amax=True (the columnwise global scale "
                             "comes from the amax of the transformed values; a pre-RHT amax is not provided)")
        if with_rht and with_2d_quantization:
            raise NotImplementedError("NVFP4Quantizer: with_rht together with with_2d_quantization is not provided; "
                                      "use 2-D tiles for weights and RHT for inputs and gradients")
        self.with_amax_reduction = False
        self.amax_reduction_group = amax_reduction_group
        self.with_rht = bool(with_rht)
        self.with_post_rht_amax = bool(with_post_rht_amax)
        self.with_2d_quantization = bool(with_2d_quantization)
        self.stochastic_rounding = bool(stochastic_rounding)
        self.with_random_sign_mask = bool(with_random_sign_mask)
        self.row_scaled_nvfp4 = False
        self.nvfp4_use_4over6 = False
        self.nvfp4_e4m3_max = 448
        self.nvfp4_4over6_err_mode = nvfp4_4over6_err_mode

    def _clone(self):
        return NVFP4Quantizer(self.dtype, self.rowwise_usage, self.columnwise_usage,
                              amax_reduction_group=self.amax_reduction_group, with_rht=self.with_rht,
                              with_post_rht_amax=self.with_post_rht_amax,
                              with_2d_quantization=self.with_2d_quantization,
                              stochastic_rounding=self.stochastic_rounding,
                              nvfp4_4over6_err_mode=self.nvfp4_4over6_err_mode,
                              with_random_sign_mask=self.with_random_sign_mask)

    def _flags(self):
        return ((QFLAG_2D if self.with_2d_quantization else 0) | (QFLAG_SR if self.stochastic_rounding else 0)
                | (QFLAG_RHT if self.with_rht else 0) | (QFLAG_RANDOM_SIGN if self.with_random_sign_mask else 0)
                | (QFLAG_SWIZZLED if self.optimize_for_gemm else 0))

    def _spec(self, noop=None, amax=None):
        head = (QKIND_NVFP4, int(self.dtype), self.rowwise_usage, self.columnwise_usage, self._flags())
        if noop is None and amax is None:
            return head
        return head + (0.0, 1, None, amax, noop)

    def _pieces(self):
        # Each copy's data, scales and amax (pieces 0, 1, 4 rowwise; 2, 3, 5 columnwise).
        return (0b010011 if self.rowwise_usage else 0) | (0b101100 if self.columnwise_usage else 0)

    def _wrap(self, outs, dtype):
        row = outs[0] if self.rowwise_usage else None
        col = outs[2] if self.columnwise_usage else None
        if row is not None:
            shape = torch.Size(tuple(row.shape[:-1]) + (row.shape[-1] * 2,))
        else:  # the columnwise copy is [K, M/2]: the logical shape is [M, K]
            shape = torch.Size((col.shape[1] * 2, col.shape[0]))
        return NVFP4Tensor._from_op(shape, dtype, row, outs[1] if row is not None else None, col,
                                    outs[3] if col is not None else None, outs[4] if row is not None else None,
                                    outs[5] if col is not None else None, self.optimize_for_gemm, self)

    def make_empty(self, shape, dtype=torch.float32, device=None, requires_grad=False, pin_memory=False):
        shape = torch.Size(shape)
        device = torch.device("cuda" if device is None else device)
        kw = dict(dtype=torch.uint8, device=device, pin_memory=pin_memory)
        (rs, cs), (rd, cd) = nvfp4_scale_shapes(shape), nvfp4_data_shapes(shape)
        # The two amaxes share one [2] buffer: quantize_into writes the pair in place.
        amax = torch.zeros(2, dtype=torch.float32, device=device, pin_memory=pin_memory)
        row, col = self.rowwise_usage, self.columnwise_usage
        return NVFP4Tensor(shape=shape, dtype=dtype, rowwise_data=torch.empty(rd, **kw) if row else None,
                           columnwise_data=torch.empty(cd, **kw) if col else None,
                           rowwise_scale_inv=torch.zeros(rs, **kw) if row else None,
                           columnwise_scale_inv=torch.zeros(cs, **kw) if col else None,
                           amax_rowwise=amax[0:1] if row else None, amax_columnwise=amax[1:2] if col else None,
                           quantizer=self.copy(), with_gemm_swizzled_scales=self.optimize_for_gemm,
                           requires_grad=requires_grad)

    def _quantize_into_args(self, output, tensor, noop):
        """The two amaxes are written as one float32 [2] pair: when the tensor's `_amax_rowwise` / `_amax_columnwise`
        are not already the two halves of one such buffer (as make_empty makes them), they are rebound to the halves
        of a new one."""
        (rs, cs), (rd, cd) = nvfp4_scale_shapes(tensor.shape), nvfp4_data_shapes(tensor.shape)
        u8 = torch.uint8
        buffers = self._two_copy_buffers(output, tensor.device,
                                         (("_rowwise_data", rd, u8), ("_rowwise_scale_inv", rs, u8)),
                                         (("_columnwise_data", cd, u8), ("_columnwise_scale_inv", cs, u8)))
        ar, ac = output._amax_rowwise, output._amax_columnwise
        base = next((t for t in (ar, ac) if t is not None), None)
        pair = None
        if (base is not None and base._base is not None and base._base.numel() == 2
                and base._base.dtype == torch.float32):
            cand = base._base
            if ((ar is None or ar.data_ptr() == cand.data_ptr()) and
                    (ac is None or ac.data_ptr() == cand.data_ptr() + 4)):
                pair = cand
        if pair is None:
            pair = torch.zeros(2, dtype=torch.float32, device=tensor.device)
        output._amax_rowwise = pair[0:1] if self.rowwise_usage else None
        output._amax_columnwise = pair[1:2] if self.columnwise_usage else None
        output._with_gemm_swizzled_scales = self.optimize_for_gemm
        output._quantizer = self.copy()
        return self._spec(noop, amax=pair), buffers

    def _config(self):
        return super()._config() + (self.with_rht, self.with_post_rht_amax, self.with_2d_quantization,
                                    self.stochastic_rounding, self.with_random_sign_mask)


register_format(NVFP4Tensor, NVFP4Quantizer)
