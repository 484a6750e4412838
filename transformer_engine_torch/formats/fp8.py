"""Per-tensor FP8 (SPEC §4.2-4.4): `Float8Tensor`, its delayed-scaling (`Float8Quantizer`) and current-scaling
(`Float8CurrentScalingQuantizer`) quantizers, and the fake outputs of their quantizing ops. One float32 scale_inv
for the whole tensor; the columnwise copy is the bitwise transpose `(K,) + shape[:-1]`."""
from __future__ import annotations

import math
import warnings

import torch

from ..dtypes import DType, as_fp8_dtype, to_torch_dtype
from .base import QFLAG_POW2, Quantizer, QuantizedTensor, _transposed_shape, _untransposed_shape, register_format
from .table import FORMATS, Format

__all__ = ["Float8Tensor", "Float8Quantizer", "Float8CurrentScalingQuantizer"]

# Quantizer kinds (SPEC §1.4) and element types, from the core's format table (delayed and current scaling share
# the per-tensor FP8 format).
QKIND_FP8_DELAYED, QKIND_FP8_CURRENT = FORMATS[Format.FP8_PER_TENSOR]["kinds"]

_FP8 = tuple(DType(t) for t in FORMATS[Format.FP8_PER_TENSOR]["elem_types"])


class Float8Tensor(QuantizedTensor):
    """Per-tensor scaled FP8: `_data` uint8 of `shape`, `_transpose` uint8 of `(K,) + shape[:-1]`,
    `_scale_inv` float32 [1] shared by both copies."""

    _ROW, _COL, _BUFFERS = "_data", "_transpose", ("_data", "_transpose", "_scale_inv")
    gemm_format = "FP8 per-tensor"

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


class _Float8PerTensorQuantizer(Quantizer):
    """Shared by the delayed and current per-tensor FP8 quantizers: both produce a Float8Tensor."""

    dtype: DType
    tensor_class = Float8Tensor

    def _pieces(self):
        # Data, the scale_inv both copies share, transposed data.
        return (1 if self.rowwise_usage else 0) | 2 | (4 if self.columnwise_usage else 0)

    def _wrap(self, outs, dtype):
        # The tensor refers to the quantizer that made it (as TE's tensors do), no per-call copy.
        data = outs[0] if self.rowwise_usage else None
        transpose = outs[2] if self.columnwise_usage else None
        shape = data.shape if data is not None else torch.Size(_untransposed_shape(transpose.shape))
        return Float8Tensor._from_op(shape, dtype, data, outs[1], transpose, self.dtype, self)

    def make_empty(self, shape, dtype=torch.float32, device=None, requires_grad=False, pin_memory=False):
        shape = torch.Size(shape)
        device = torch.device("cuda" if device is None else device)
        kw = dict(dtype=torch.uint8, device=device, pin_memory=pin_memory)
        data = torch.empty(shape, **kw) if self.rowwise_usage else None
        tr = torch.empty(_transposed_shape(shape), **kw) if self.columnwise_usage else None
        scale_inv = self._initial_scale_inv(device)
        return Float8Tensor(shape=shape, dtype=dtype, data=data, fp8_scale_inv=scale_inv, fp8_dtype=self.dtype,
                            data_transpose=tr, quantizer=self.copy(), requires_grad=requires_grad)

    def _initial_scale_inv(self, device):
        return torch.ones(1, dtype=torch.float32, device=device)

    def _output_buffers(self, output, tensor):
        dev = dict(dtype=torch.uint8, device=tensor.device)
        if self.rowwise_usage and output._data is None:
            output._data = torch.empty(tensor.shape, **dev)
        if self.columnwise_usage and output._transpose is None:
            output._transpose = torch.empty(_transposed_shape(tensor.shape), **dev)
        if not self.rowwise_usage:
            output._data = None
        if not self.columnwise_usage:
            output._transpose = None
        output._transpose_invalid = output._transpose is None
        if output._scale_inv is None:
            output._scale_inv = torch.empty(1, dtype=torch.float32, device=tensor.device)
        output._fp8_dtype = self.dtype
        return dict(row_data=output._data, row_scale_inv=output._scale_inv, col_data=output._transpose)


class Float8Quantizer(_Float8PerTensorQuantizer):
    """Per-tensor FP8 with delayed scaling (SPEC §4.2): q = fp8(x * scale); `amax` max-accumulates in place."""

    def __init__(self, scale: torch.Tensor, amax: torch.Tensor, fp8_dtype, *, rowwise: bool = True,
                 columnwise: bool = True, _check_scale: bool = True):
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        for name, t in (("scale", scale), ("amax", amax)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"Float8Quantizer: {name} must be a one-element float32 tensor, "
                                f"got {type(t).__name__}")
        self.scale = scale
        self.amax = amax
        self.dtype = as_fp8_dtype(fp8_dtype, "Float8Quantizer: fp8_dtype")
        if _check_scale:
            _check_finite_scale(scale)

    def _clone(self):
        # The scale was checked when this quantizer was made: no second read (a device sync for a CUDA scale).
        return Float8Quantizer(self.scale, self.amax, self.dtype, rowwise=self.rowwise_usage,
                               columnwise=self.columnwise_usage, _check_scale=False)

    def _spec(self, noop=None):
        spec = (QKIND_FP8_DELAYED, int(self.dtype), self.rowwise_usage, self.columnwise_usage, 0, 0.0, 1,
                self.scale, self.amax)
        return spec if noop is None else spec + (noop,)

    def _initial_scale_inv(self, device):
        return torch.reciprocal(self.scale.detach().to(device=device, dtype=torch.float32).reshape(1))

    def calibrate(self, tensor: torch.Tensor):
        """amax <- amax(tensor) (overwrite)."""
        torch.ops.te.compute_amax.default(tensor, self.amax)

    def _config(self):
        return super()._config() + (self.dtype, id(self.scale), id(self.amax))


def _check_finite_scale(scale: torch.Tensor) -> None:
    """SPEC §4.2: a delayed-scaling scale must be finite (zero and negative scales are valid: scale_inv = +Inf,
    negated codes). A NaN or Inf scale would make every code NaN or saturated and scale_inv NaN or 0, so the
    constructor reads it once. A CPU scale is read for free; a CUDA scale costs one device sync, so it is read only
    in eager code outside CUDA-graph capture (torch.compile and capture skip the check; the casts never check, they
    stay sync-free). A wrong shape or dtype is named where the scale is used (the op's check)."""
    if torch.compiler.is_compiling() or scale.numel() != 1 or scale.device.type == "meta":
        return
    if scale.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    value = float(scale.detach().reshape(()).float())
    if not math.isfinite(value):
        raise ValueError(f"Float8Quantizer: scale must be finite, got {value} ({scale.dtype} {list(scale.shape)} on "
                         f"{scale.device}): q = fp8(x * scale) would be all NaN or saturated codes with scale_inv "
                         f"{1.0 / value}. Zero and negative scales are valid. Pass a finite "
                         f"scale (e.g. torch.ones(1)), or use Float8CurrentScalingQuantizer to take it from the data")


class Float8CurrentScalingQuantizer(_Float8PerTensorQuantizer):
    """Per-tensor FP8 with current scaling (SPEC §4.4): the scale comes from the amax of the tensor itself."""

    def __init__(self, fp8_dtype, device=None, *, rowwise: bool = True, columnwise: bool = True,
                 use_existing_amax: bool = False, with_amax_reduction: bool = False, amax_reduction_group=None,
                 force_pow_2_scales: bool = False, amax_epsilon: float = 0.0, scale=None, amax=None):
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = as_fp8_dtype(fp8_dtype, "Float8CurrentScalingQuantizer: fp8_dtype")
        for name, v, default in (("device", device, None), ("use_existing_amax", use_existing_amax, False),
                                 ("scale", scale, None), ("amax", amax, None)):
            if v is not default:
                warnings.warn(f"Float8CurrentScalingQuantizer: `{name}` is deprecated and ignored",
                              DeprecationWarning, stacklevel=2)
        self.with_amax_reduction = bool(with_amax_reduction)
        self.amax_reduction_group = amax_reduction_group
        self.force_pow_2_scales = bool(force_pow_2_scales)
        self.amax_epsilon = float(amax_epsilon)
        if self.amax_epsilon < 0:
            raise ValueError(f"Float8CurrentScalingQuantizer: amax_epsilon must be >= 0, got {amax_epsilon}")

    def _clone(self):
        return Float8CurrentScalingQuantizer(
            self.dtype, rowwise=self.rowwise_usage, columnwise=self.columnwise_usage,
            with_amax_reduction=self.with_amax_reduction, amax_reduction_group=self.amax_reduction_group,
            force_pow_2_scales=self.force_pow_2_scales, amax_epsilon=self.amax_epsilon)

    def _spec(self, noop=None, amax=None):
        head = (QKIND_FP8_CURRENT, int(self.dtype), self.rowwise_usage, self.columnwise_usage)
        if noop is None and amax is None and not self.force_pow_2_scales and self.amax_epsilon == 0.0:
            return head
        flags = QFLAG_POW2 if self.force_pow_2_scales else 0
        return head + (flags, self.amax_epsilon, 1, None, amax, noop)

    def _spec_for(self, tensor, noop=None):
        if self.with_amax_reduction:
            amax = torch.zeros(1, dtype=torch.float32, device=tensor.device)
            torch.ops.te.compute_amax.default(tensor, amax)
            self._reduce_amax(amax)
            return self._spec(noop, amax=amax)
        return self._spec(noop)

    @property
    def _reduces_amax(self):
        return self.with_amax_reduction

    def _reduce_amax(self, amax: torch.Tensor):
        """MAX all-reduce of a locally computed amax over the quantizer's group (no host sync)."""
        import torch.distributed as dist

        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=self.amax_reduction_group)

    def _config(self):
        return super()._config() + (self.dtype, self.with_amax_reduction, id(self.amax_reduction_group),
                                    self.force_pow_2_scales, self.amax_epsilon)


register_format(Float8Tensor, Float8Quantizer, Float8CurrentScalingQuantizer)
