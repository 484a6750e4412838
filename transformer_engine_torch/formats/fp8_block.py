"""FP8 block scaling (SPEC §4.7): `Float8BlockwiseQTensor`, `Float8BlockQuantizer`, the float32 block-scale
shapes and the fake outputs of its quantizing ops. One float32 scale per 1x128 block or 128x128 tile; the columnwise
copy is stored transposed `(K,) + shape[:-1]`."""
from __future__ import annotations

import math

import torch

from ..dtypes import DType, as_fp8_dtype, to_torch_dtype
from .base import (QFLAG_2D, QFLAG_POW2, NativeGemm, Quantizer, _ceil_div, _rows_cols, _transposed_shape,
                   _TwoCopyTensor, _untransposed_shape, register_format)
from .table import FORMATS, Format, block_len, scale_shapes

__all__ = ["Float8BlockwiseQTensor", "Float8BlockQuantizer"]

QKIND_FP8_BLOCK, = FORMATS[Format.FP8_BLOCK_1x128]["kinds"]  # quantizer kind (SPEC §1.4), from the format table
FP8_BLOCK_LEN = block_len(Format.FP8_BLOCK_1x128)  # 128


def fp8_block_scale_shapes(shape, two_d):
    """(rowwise, columnwise) padded float32 scale shapes of SPEC §4.8 for a tensor of `shape` (flattened [M, K]).
    1-D: [ceil(K/128), roundup(M, 4)] (K-block-major, M contiguous) and [ceil(M/128), roundup(K, 4)];
    2-D: [ceil(M/128), roundup(ceil(K/128), 4)] and its transpose-shaped [ceil(K/128), roundup(ceil(M/128), 4)]
    (the format table's)."""
    return scale_shapes(Format.FP8_BLOCK_128x128 if two_d else Format.FP8_BLOCK_1x128, shape)


def _block_factors(scale, rows, cols, rows_per_entry, cols_per_entry, scale_is_transposed):
    """The [rows, cols] FP32 multiplier of each element from a compact scale matrix whose entry [i, j] covers rows
    i*rows_per_entry.. and columns j*cols_per_entry.. (entry [j, i] when `scale_is_transposed`)."""
    nr, nc = _ceil_div(rows, rows_per_entry), _ceil_div(cols, cols_per_entry)
    s = scale[:nc, :nr].t() if scale_is_transposed else scale[:nr, :nc]
    return s.repeat_interleave(rows_per_entry, 0)[:rows].repeat_interleave(cols_per_entry, 1)[:, :cols]


class Float8BlockwiseQTensor(_TwoCopyTensor):
    """FP8 with one float32 scale per 1x128 block or 128x128 tile (SPEC §4.7, §4.9). `_rowwise_data` uint8 of
    `shape`; `_columnwise_data` uint8 TRANSPOSED `(K,) + shape[:-1]` (x^T quantized along its rows: 128x1 blocks of
    x for 1-D, the bitwise transpose for 2-D). `_rowwise_scale_inv` / `_columnwise_scale_inv` float32 of the
    padded SPEC §4.8 shapes (fp8_block_scale_shapes), padding zero. `_is_2D_scaled`: 128x128 tiles."""

    gemm_format, gemm_k_multiple = "FP8 block", 16
    native_gemm = NativeGemm(((9, 0),), 120900)

    _OP_FIELDS = ("_fp8_dtype", "_is_2D_scaled")

    def __init__(self, *, shape=None, dtype=torch.float32, rowwise_data=None, columnwise_data=None,
                 rowwise_scale_inv=None, columnwise_scale_inv=None, fp8_dtype=DType.kFloat8E4M3, quantizer=None,
                 is_2D_scaled=True, requires_grad=False, device=None):
        if shape is None:
            if rowwise_data is not None:
                shape = rowwise_data.shape
            elif columnwise_data is not None:
                shape = torch.Size(_untransposed_shape(columnwise_data.shape))
            else:
                raise ValueError("Float8BlockwiseQTensor: give `shape` or a data buffer")
        super().__init__(shape, dtype, quantizer, requires_grad)
        self._set_copies(rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv)
        self._fp8_dtype = as_fp8_dtype(fp8_dtype)
        self._is_2D_scaled = bool(is_2D_scaled)


    def dequantize(self, dtype=None) -> torch.Tensor:
        """fl(fp8 * scale_inv[block]) in FP32, rounded once to `dtype` (default: the nominal dtype); the rowwise copy
        when present, else the columnwise copy transposed back. With power-of-two scales (the default) a block max at
        the input dtype's max decodes to 2^128 (Inf) for fp32/bf16 and 65536 for fp16, as MXFP8 does."""
        dtype = self._dtype if dtype is None else to_torch_dtype(dtype)
        columnwise, data = self._dequantize_copy()
        m, k = _rows_cols(self._shape)
        r, c = (k, m) if columnwise else (m, k)   # the stored matrix
        v = data.reshape(r, c).view(to_torch_dtype(self._fp8_dtype)).to(torch.float32)
        s = self._columnwise_scale_inv if columnwise else self._rowwise_scale_inv
        b = FP8_BLOCK_LEN
        if self._is_2D_scaled:
            f = _block_factors(s, r, c, b, b, False)
        else:
            # 1-D: blocks of 128 along the stored rows; the scale matrix is [block, row] (rows contiguous).
            f = _block_factors(s, r, c, 1, b, True)
        out = (v * f).to(dtype)
        if columnwise:
            out = out.t()
        return out.reshape(self._shape)

    def _provide_copy(self, name):
        """2-D: a missing copy is the bitwise transpose of the other, with the tile scales transposed. 1-D: each copy
        is quantized from the high-precision values, so a missing one cannot be derived."""
        other = "columnwise" if name == "rowwise" else "rowwise"
        if not self._is_2D_scaled or getattr(self, f"_{other}_data") is None:
            raise RuntimeError(f"Float8BlockwiseQTensor.update_usage: the {name} copy is absent and cannot be "
                               f"derived (1x128 blocks quantize each copy from the high-precision values); "
                               f"quantize the high-precision tensor again with {name}=True")
        m, k = _rows_cols(self._shape)
        (rs, cs) = fp8_block_scale_shapes(self._shape, True)
        mb, kb = _ceil_div(m, FP8_BLOCK_LEN), _ceil_div(k, FP8_BLOCK_LEN)
        if name == "columnwise":
            src, si, shape = self._rowwise_data.reshape(m, k), self._rowwise_scale_inv[:mb, :kb], cs
            self._columnwise_data = src.t().contiguous().reshape(_transposed_shape(self._shape))
        else:
            src, si, shape = self._columnwise_data.reshape(k, m), self._columnwise_scale_inv[:kb, :mb], rs
            self._rowwise_data = src.t().contiguous().reshape(self._shape)
        s = torch.zeros(shape, dtype=torch.float32, device=si.device)
        s[:si.shape[1], :si.shape[0]] = si.t()
        setattr(self, f"_{name}_scale_inv", s)

    def view(self, *shape):
        """Exact view changing only leading dims (the scales, laid out over the flattened [M, K], are shared)."""
        new_shape = self._view_shape(shape)
        return self._map(lambda t: t, new_shape, lambda t: t.view(new_shape),
                         lambda t: t.view(_transposed_shape(new_shape)))

    reshape = view

    def _native_gemm_operand(self, rowwise, trans, is_a):
        # Runs as TN: the columnwise copy, stored (K,) + shape[:-1], has the logical tensor's K as its rows.
        data, sinv = self._copy(rowwise)
        data = (data.reshape(_rows_cols(data.shape)) if rowwise
                else data.reshape(data.shape[0], math.prod(data.shape[1:])))
        return data, sinv, int(self._fp8_dtype), is_a, 5 if self._is_2D_scaled else 4  # kGemmScalingBlock2D / 1D


class Float8BlockQuantizer(Quantizer):
    """FP8 with one float32 scale per 1x128 block (block_scaling_dim=1) or per 128x128 tile (block_scaling_dim=2),
    SPEC §4.7. Per block: amax (NaN ignored), scale = fp8_max / amax by the current-scaling rule (amax raised to
    `amax_epsilon`; amax 0 / Inf -> 1; an Inf scale -> the input dtype's max finite; `force_pow_2_scales` rounds it
    down to a power of two), q = fp8(x * scale), scale_inv = 1 / scale stored. 1-D: the columnwise copy is x^T
    quantized independently with 1x128 blocks along its rows; 2-D: it is the bitwise transpose, same tile scales.
    Any shape (0-d is one 1x1 block). Activations with this quantizer take the unfused path (SPEC §5.1): the plain
    op, then this quantization. The scales are written in the layout the GEMM reads, so `optimize_for_gemm` changes
    nothing here (TE requires `rowwise`/`columnwise` explicitly; ours defaults them)."""

    block_len = 128
    tensor_class = Float8BlockwiseQTensor

    def __init__(self, fp8_dtype, *, rowwise: bool = True, columnwise: bool = True, amax_epsilon: float = 0.0,
                 force_pow_2_scales: bool = True, block_scaling_dim: int = 2):
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = as_fp8_dtype(fp8_dtype, "Float8BlockQuantizer: fp8_dtype")
        if isinstance(block_scaling_dim, bool) or block_scaling_dim not in (1, 2):
            raise ValueError(f"Float8BlockQuantizer: block_scaling_dim must be 1 (1x128 blocks) or 2 (128x128 tiles), "
                             f"got {block_scaling_dim!r}")
        self.block_scaling_dim = int(block_scaling_dim)
        self.amax_epsilon = float(amax_epsilon)
        if not (0.0 <= self.amax_epsilon < float("inf")):
            raise ValueError(f"Float8BlockQuantizer: amax_epsilon must be finite and >= 0, got {amax_epsilon}")
        self.force_pow_2_scales = bool(force_pow_2_scales)

    def _clone(self):
        return Float8BlockQuantizer(self.dtype, rowwise=self.rowwise_usage, columnwise=self.columnwise_usage,
                                    amax_epsilon=self.amax_epsilon, force_pow_2_scales=self.force_pow_2_scales,
                                    block_scaling_dim=self.block_scaling_dim)

    def _spec(self, noop=None):
        flags = (QFLAG_POW2 if self.force_pow_2_scales else 0) | (QFLAG_2D if self.block_scaling_dim == 2 else 0)
        spec = (QKIND_FP8_BLOCK, int(self.dtype), self.rowwise_usage, self.columnwise_usage, flags, self.amax_epsilon,
                self.block_scaling_dim)
        return spec if noop is None else spec + (None, None, noop)

    def _wrap(self, outs, dtype):
        row = outs[0] if self.rowwise_usage else None
        col = outs[2] if self.columnwise_usage else None
        shape = row.shape if row is not None else torch.Size(_untransposed_shape(col.shape))
        return Float8BlockwiseQTensor._from_op(shape, dtype, row, outs[1] if row is not None else None, col,
                                               outs[3] if col is not None else None, self.dtype,
                                               self.block_scaling_dim == 2, self)

    def make_empty(self, shape, dtype=torch.float32, device=None, requires_grad=False, pin_memory=False):
        shape = torch.Size(shape)
        device = torch.device("cuda" if device is None else device)
        u8 = dict(dtype=torch.uint8, device=device, pin_memory=pin_memory)
        f32 = dict(dtype=torch.float32, device=device, pin_memory=pin_memory)
        rs, cs = fp8_block_scale_shapes(shape, self.block_scaling_dim == 2)
        row = torch.empty(shape, **u8) if self.rowwise_usage else None
        col = torch.empty(_transposed_shape(shape), **u8) if self.columnwise_usage else None
        return Float8BlockwiseQTensor(shape=shape, dtype=dtype, rowwise_data=row, columnwise_data=col,
                                      rowwise_scale_inv=torch.zeros(rs, **f32) if row is not None else None,
                                      columnwise_scale_inv=torch.zeros(cs, **f32) if col is not None else None,
                                      fp8_dtype=self.dtype, quantizer=self.copy(),
                                      is_2D_scaled=self.block_scaling_dim == 2, requires_grad=requires_grad)

    def _output_buffers(self, output, tensor):
        # The output's block layout must be the quantizer's: its scale buffers have other shapes otherwise.
        two_d = self.block_scaling_dim == 2
        if output._is_2D_scaled != two_d and (output._rowwise_data is not None or output._columnwise_data is not None):
            raise ValueError(f"quantize: output Float8BlockwiseQTensor{list(output.shape)} holds "
                             f"{'128x128' if output._is_2D_scaled else '1x128'}-block scales but the quantizer uses "
                             f"block_scaling_dim={self.block_scaling_dim}; make the output with this quantizer "
                             f"(make_empty) or quantize without output=")
        rs, cs = fp8_block_scale_shapes(tensor.shape, two_d)
        u8, f32 = torch.uint8, torch.float32
        buffers = self._two_copy_buffers(
            output, tensor.device, (("_rowwise_data", tensor.shape, u8), ("_rowwise_scale_inv", rs, f32)),
            (("_columnwise_data", _transposed_shape(tensor.shape), u8), ("_columnwise_scale_inv", cs, f32)))
        output._fp8_dtype = self.dtype
        output._is_2D_scaled = two_d
        return buffers

    def _config(self):
        return super()._config() + (self.dtype, self.block_scaling_dim, self.amax_epsilon, self.force_pow_2_scales)


register_format(Float8BlockwiseQTensor, Float8BlockQuantizer)
