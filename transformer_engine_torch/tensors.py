"""Quantized tensor classes (SPEC §4.9): plain Python holders of the raw uint8 buffers and their scales.

Raw buffers are torch.uint8 (TE-compatible field names); `rowwise_data` / `columnwise_data` are typed
float8 views of them. A columnwise copy of a Float8Tensor is the bitwise transpose `(K,) + shape[:-1]`.
"""
from __future__ import annotations

import torch

from .dtypes import DType, as_fp8_dtype, to_torch_dtype


_FP8 = (DType.kFloat8E4M3, DType.kFloat8E5M2)


def _transposed_shape(shape):
    shape = tuple(shape)
    return shape if len(shape) == 0 else (shape[-1],) + shape[:-1]


def _untransposed_shape(transposed):
    """Inverse of `_transposed_shape`: the logical shape of a tensor from the shape of its transposed copy."""
    transposed = tuple(transposed)
    return transposed[1:] + transposed[:1]


class QuantizedTensor:
    """Base of the quantized tensor classes: shape, nominal dtype, device and the quantizer that made it."""

    def __init__(self, shape, dtype, quantizer=None, requires_grad=False):
        # A torch.Size (what `Tensor.shape` gives; immutable) is kept as it is: copying one costs more than the rest
        # of __init__.
        self._shape = shape if type(shape) is torch.Size else torch.Size(shape)
        self._dtype = dtype
        self._quantizer = quantizer
        self.requires_grad = requires_grad

    @property
    def shape(self) -> torch.Size:
        return self._shape

    def size(self, dim=None):
        return self._shape if dim is None else self._shape[dim]

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    def dim(self) -> int:
        return len(self._shape)

    @property
    def ndim(self) -> int:
        return len(self._shape)

    def numel(self) -> int:
        n = 1
        for s in self._shape:
            n *= s
        return n

    def dequantize(self, dtype=None) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}(shape={tuple(self._shape)}, dtype={self._dtype}, device={self.device})"


class Float8Tensor(QuantizedTensor):
    """Per-tensor scaled FP8: `_data` uint8 of `shape`, `_transpose` uint8 of `(K,) + shape[:-1]`,
    `_scale_inv` float32 [1] shared by both copies."""

    def __init__(self, *, shape=None, dtype=torch.float32, data=None, fp8_scale_inv=None,
                 fp8_dtype=DType.kFloat8E4M3, data_transpose=None, quantizer=None, requires_grad=False,
                 device=None):
        if shape is None:
            if data is None:
                raise ValueError("Float8Tensor: give `shape` or `data`")
            shape = data.shape
        super().__init__(shape, dtype, quantizer, requires_grad)
        self._data = data
        self._transpose = data_transpose
        self._transpose_invalid = data_transpose is None
        self._scale_inv = fp8_scale_inv
        self._fp8_dtype = fp8_dtype if type(fp8_dtype) is DType and fp8_dtype in _FP8 else as_fp8_dtype(fp8_dtype)

    @classmethod
    def _from_op(cls, shape: torch.Size, dtype, data, scale_inv, transpose, fp8_dtype: DType, quantizer):
        """The tensor of what a quantizing op returned: the same fields as `__init__`, without its keyword
        parsing and normalisation, which cost about as much as the rest of a small op's Python wrapper. The
        arguments are trusted (the op made the buffers, the quantizer checked its dtype)."""
        t = object.__new__(cls)
        t._shape, t._dtype, t._quantizer, t.requires_grad = shape, dtype, quantizer, False
        t._data, t._transpose, t._transpose_invalid = data, transpose, transpose is None
        t._scale_inv, t._fp8_dtype = scale_inv, fp8_dtype
        return t

    @property
    def device(self) -> torch.device:
        for t in (self._data, self._transpose, self._scale_inv):
            if t is not None:
                return t.device
        return torch.device("cpu")

    @property
    def rowwise_data(self):
        return None if self._data is None else self._data.view(to_torch_dtype(self._fp8_dtype))

    @property
    def columnwise_data(self):
        return None if self._transpose is None else self._transpose.view(to_torch_dtype(self._fp8_dtype))

    def dequantize(self, dtype=None) -> torch.Tensor:
        dtype = self._dtype if dtype is None else to_torch_dtype(dtype)
        if self._data is not None:
            return torch.ops.te.dequantize_fp8.default(self._data, self._scale_inv, int(self._fp8_dtype), dtype)
        if self._transpose is None:
            raise RuntimeError("Float8Tensor.dequantize: the tensor holds neither a rowwise nor a columnwise copy")
        t = torch.ops.te.dequantize_fp8.default(self._transpose, self._scale_inv, int(self._fp8_dtype), dtype)
        if len(self._shape) <= 1:
            return t.reshape(self._shape)
        return t.reshape(self._shape[-1], -1).t().reshape(self._shape)

    def update_usage(self, rowwise_usage=None, columnwise_usage=None):
        if columnwise_usage and self._transpose is None:
            if self._data is None:
                raise RuntimeError("Float8Tensor.update_usage: no rowwise copy to derive the columnwise copy from")
            k = self._shape[-1] if len(self._shape) else 1
            self._transpose = torch.ops.te.fp8_transpose.default(self._data.reshape(-1, k)).reshape(
                _transposed_shape(self._shape))
            self._transpose_invalid = False
        if rowwise_usage and self._data is None:
            if self._transpose is None:
                raise RuntimeError("Float8Tensor.update_usage: no columnwise copy to derive the rowwise copy from")
            k = self._shape[-1] if len(self._shape) else 1
            self._data = torch.ops.te.fp8_transpose.default(self._transpose.reshape(k, -1)).reshape(self._shape)
        if rowwise_usage is False:
            if self._transpose is None:
                raise RuntimeError("Float8Tensor.update_usage: dropping the rowwise copy would leave no data")
            self._data = None
        if columnwise_usage is False:
            if self._data is None:
                raise RuntimeError("Float8Tensor.update_usage: dropping the columnwise copy would leave no data")
            self._transpose = None
            self._transpose_invalid = True

    def _replace(self, data, transpose, shape):
        return Float8Tensor(shape=shape, dtype=self._dtype, data=data, fp8_scale_inv=self._scale_inv,
                            fp8_dtype=self._fp8_dtype, data_transpose=transpose, quantizer=self._quantizer,
                            requires_grad=self.requires_grad)

    def clone(self):
        c = lambda t: None if t is None else t.clone()  # noqa: E731
        out = self._replace(c(self._data), c(self._transpose), self._shape)
        out._scale_inv = self._scale_inv.clone()
        return out

    def view(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
            shape = tuple(shape[0])
        data = None if self._data is None else self._data.view(*shape)
        new_shape = data.shape if data is not None else torch.empty(self._shape, device="meta").view(*shape).shape
        if len(new_shape) and len(self._shape) and new_shape[-1] != self._shape[-1]:
            raise ValueError(f"Float8Tensor.view: only leading dims may change (last dim {self._shape[-1]}), "
                             f"got {tuple(new_shape)}")
        tr = None if self._transpose is None else self._transpose.view(_transposed_shape(new_shape))
        return self._replace(data, tr, new_shape)

    reshape = view

    def to(self, device):
        m = lambda t: None if t is None else t.to(device)  # noqa: E731
        out = self._replace(m(self._data), m(self._transpose), self._shape)
        out._scale_inv = m(self._scale_inv)
        return out
