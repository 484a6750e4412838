"""MXFP8 (SPEC §4.5): `MXFP8Tensor`, `MXFP8Quantizer`, the E8M0 scale shapes and swizzle, and the fake outputs of
its quantizing ops. One E8M0 scale per 32 elements, 1x32 along the rows for the rowwise copy and 32x1 down the
columns for the columnwise copy, which keeps the tensor's shape (not transposed)."""
from __future__ import annotations

import torch

from ..dtypes import DType, as_fp8_dtype, to_torch_dtype
from .base import (QFLAG_SWIZZLED, NativeGemm, Quantizer, _ceil_div, _rows_cols, _swizzle, _TwoCopyTensor,
                   register_format)
from .table import FORMATS, Format, block_len, scale_shapes

__all__ = ["MXFP8Tensor", "MXFP8Quantizer"]

QKIND_MXFP8, = FORMATS[Format.MXFP8]["kinds"]  # quantizer kind (SPEC §1.4), from the core's format table
MX_BLOCK = block_len(Format.MXFP8)  # 32


def mxfp8_scale_shapes(shape):
    """(rowwise, columnwise) padded E8M0 scale shapes of SPEC §4.8 for a tensor of `shape` (the format table's)."""
    return scale_shapes(Format.MXFP8, shape)


def swizzle_mx_scales(scale, columnwise):
    """Compact <-> GEMM-swizzled bytes of an MXFP8 scale tensor (same shape). Columnwise scales are swizzled as
    their transpose [roundup(K, 128), roundup(ceil(M/32), 4)] (SPEC §4.8)."""
    r, c = scale.shape
    if r == 0 or c == 0:
        return scale.clone()
    if not columnwise:
        return _swizzle(scale, r, c)
    # The transpose [c, r] is swizzled; its bytes fill the [r, c] buffer.
    return _swizzle(scale.t(), c, r).reshape(r, c)


def unswizzle_mx_scales(scale, columnwise):
    """Inverse of `swizzle_mx_scales`."""
    r, c = scale.shape
    if r == 0 or c == 0:
        return scale.clone()
    if not columnwise:
        return _swizzle(scale, r, c, inverse=True)
    return _swizzle(scale, c, r, inverse=True).t().contiguous()


def e8m0_to_float32(codes):
    """Exact 2^(e - 127) of uint8 E8M0 codes as float32 (code 0 is the subnormal 2^-127, 0xFF is NaN)."""
    c = codes.to(torch.int32)
    bits = torch.where(c == 0, torch.full_like(c, 0x400000), c << 23)
    bits = torch.where(c == 255, torch.full_like(c, 0x7FC00000), bits)
    return bits.view(torch.float32)


class MXFP8Tensor(_TwoCopyTensor):
    """MXFP8 (SPEC §4.5, §4.9): `_rowwise_data` and `_columnwise_data` are uint8 FP8 codes, both of `shape` (the
    columnwise copy is NOT transposed; its blocks run down the rows). `_rowwise_scale_inv` is uint8 E8M0
    [roundup(M, 128), roundup(K/32, 4)], `_columnwise_scale_inv` uint8 E8M0 [roundup(ceil(M/32), 4),
    roundup(K, 128)], padding zero; byte e means 2^(e - 127). E8M0 is stored as torch.uint8 (TE-compatible);
    `rowwise_scale_inv` / `columnwise_scale_inv` are `torch.float8_e8m0fnu` views where torch has that dtype.
    `_with_gemm_swizzled_scales`: the scale bytes are in cuBLASLt's swizzled layout (same shapes)."""

    gemm_format, gemm_k_multiple = "MXFP8", 32
    native_gemm = NativeGemm(((10, None), (11, None)), 120800)
    gemm_core_decodes = True

    _OP_FIELDS = ("_fp8_dtype", "_with_gemm_swizzled_scales")

    def __init__(self, *, shape=None, dtype=torch.float32, rowwise_data=None, columnwise_data=None,
                 rowwise_scale_inv=None, columnwise_scale_inv=None, fp8_dtype=DType.kFloat8E4M3, quantizer=None,
                 with_gemm_swizzled_scales=False, requires_grad=False, device=None):
        if shape is None:
            data = rowwise_data if rowwise_data is not None else columnwise_data
            if data is None:
                raise ValueError("MXFP8Tensor: give `shape` or a data buffer")
            shape = data.shape
        super().__init__(shape, dtype, quantizer, requires_grad)
        self._set_copies(rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv)
        self._fp8_dtype = as_fp8_dtype(fp8_dtype)
        self._with_gemm_swizzled_scales = bool(with_gemm_swizzled_scales)


    @staticmethod
    def _typed_scale(s):
        e8m0 = getattr(torch, "float8_e8m0fnu", None)
        return s if s is None or e8m0 is None else s.view(e8m0)

    def _compact_scale(self, columnwise):
        s = self._columnwise_scale_inv if columnwise else self._rowwise_scale_inv
        return unswizzle_mx_scales(s, columnwise) if self._with_gemm_swizzled_scales else s

    def dequantize(self, dtype=None) -> torch.Tensor:
        """fl(fp8 * 2^(e - 127)) in FP32, rounded once to `dtype` (SPEC §4.5); rowwise copy when present. The one
        finite input that comes back Inf: the scale rounds up to a power of two and the block max's code can round
        up to the next power (E4M3 256, E5M2 32768), so a block max at the dtype's max decodes to that max rounded
        up to a power of two: 2^128 for fp32/bf16 (Inf in FP32), 65536 for fp16 (Inf in fp16). FP8 current/block
        scaling with force_pow_2_scales does the same (README, "Dequantize at the edges")."""
        dtype = self._dtype if dtype is None else to_torch_dtype(dtype)
        columnwise, data = self._dequantize_copy()
        m, k = _rows_cols(self._shape)
        s = self._compact_scale(columnwise)
        if columnwise:
            f = e8m0_to_float32(s[:_ceil_div(m, MX_BLOCK), :k]).repeat_interleave(MX_BLOCK, dim=0)[:m]
        else:
            f = e8m0_to_float32(s[:m, :k // MX_BLOCK]).repeat_interleave(MX_BLOCK, dim=1)
        v = data.reshape(m, k).view(to_torch_dtype(self._fp8_dtype)).to(torch.float32)
        return (v * f).to(dtype).reshape(self._shape)

    def view(self, *shape):
        """Exact view changing only leading dims (the scales, laid out over the flattened [M, K], are shared)."""
        new_shape = self._view_shape(shape)
        as_new_shape = lambda t: t.view(new_shape)  # noqa: E731  (both copies keep the tensor's shape)
        return self._map(lambda t: t, new_shape, as_new_shape, as_new_shape)

    reshape = view

    def _native_gemm_operand(self, rowwise, trans, is_a):
        # Both copies keep the tensor's shape: the layout stays as asked; scales swizzled (columnwise ones as their
        # transpose) into a temporary when stored compact.
        data, sinv = self._copy(rowwise)
        if not self._with_gemm_swizzled_scales:
            sinv = swizzle_mx_scales(sinv, columnwise=not rowwise)
        return data.reshape(_rows_cols(data.shape)), sinv, int(self._fp8_dtype), trans, 2  # kGemmScalingMXFP8


class MXFP8Quantizer(Quantizer):
    """MXFP8 (SPEC §4.5): FP8 codes with one E8M0 scale per 1x32 block along the last dim (rowwise) and per 32x1
    block down the rows (columnwise, same shape, not transposed). The scale rounds UP: e = E8M0(amax * fl(1/fp8_max)),
    so a block's max never saturates. `optimize_for_gemm=True` writes the scales GEMM-swizzled (SPEC §4.8).
    The last dim must be a multiple of 32; any number of rows."""

    tensor_class = MXFP8Tensor

    def __init__(self, fp8_dtype, *, rowwise: bool = True, columnwise: bool = True,
                 with_2d_quantization: bool = False):
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = as_fp8_dtype(fp8_dtype, "MXFP8Quantizer: fp8_dtype")
        if with_2d_quantization:
            raise NotImplementedError("MXFP8Quantizer: with_2d_quantization=True (one scale per 32x32 tile) is not "
                                      "provided; use the default 1x32 / 32x1 blocks")
        self.with_2d_quantization = False

    def _clone(self):
        return MXFP8Quantizer(self.dtype, rowwise=self.rowwise_usage, columnwise=self.columnwise_usage)

    def _spec(self, noop=None):
        head = (QKIND_MXFP8, int(self.dtype), self.rowwise_usage, self.columnwise_usage)
        if noop is None and not self.optimize_for_gemm:
            return head
        return head + (QFLAG_SWIZZLED if self.optimize_for_gemm else 0, 0.0, 1, None, None, noop)

    def _wrap(self, outs, dtype):
        row = outs[0] if self.rowwise_usage else None
        col = outs[2] if self.columnwise_usage else None
        shape = (row if row is not None else col).shape
        return MXFP8Tensor._from_op(shape, dtype, row, outs[1] if row is not None else None, col,
                                    outs[3] if col is not None else None, self.dtype, self.optimize_for_gemm, self)

    def make_empty(self, shape, dtype=torch.float32, device=None, requires_grad=False, pin_memory=False):
        shape = torch.Size(shape)
        device = torch.device("cuda" if device is None else device)
        kw = dict(dtype=torch.uint8, device=device, pin_memory=pin_memory)
        (rs, cs) = mxfp8_scale_shapes(shape)
        row = torch.empty(shape, **kw) if self.rowwise_usage else None
        col = torch.empty(shape, **kw) if self.columnwise_usage else None
        return MXFP8Tensor(shape=shape, dtype=dtype, rowwise_data=row, columnwise_data=col,
                           rowwise_scale_inv=torch.zeros(rs, **kw) if row is not None else None,
                           columnwise_scale_inv=torch.zeros(cs, **kw) if col is not None else None,
                           fp8_dtype=self.dtype, quantizer=self.copy(),
                           with_gemm_swizzled_scales=self.optimize_for_gemm, requires_grad=requires_grad)

    def _output_buffers(self, output, tensor):
        # The scale layout becomes the quantizer's (the kernel writes every scale byte, padding included).
        rs, cs = mxfp8_scale_shapes(tensor.shape)
        u8 = torch.uint8
        buffers = self._two_copy_buffers(output, tensor.device,
                                         (("_rowwise_data", tensor.shape, u8), ("_rowwise_scale_inv", rs, u8)),
                                         (("_columnwise_data", tensor.shape, u8), ("_columnwise_scale_inv", cs, u8)))
        output._fp8_dtype = self.dtype
        output._with_gemm_swizzled_scales = self.optimize_for_gemm
        return buffers

    def _config(self):
        return super()._config() + (self.dtype, self.with_2d_quantization)


register_format(MXFP8Tensor, MXFP8Quantizer)
