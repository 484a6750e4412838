"""Quantizers (SPEC §4.1-4.4). A quantizer is a value object holding its configuration; `_spec()` unpacks it
into the plain tensors/scalars that cross into C++ (SPEC §1.4), `_wrap()` turns the op's fixed output list back
into a quantized tensor."""
from __future__ import annotations

import math
import warnings

import torch

from .dtypes import DType, as_dtype, as_fp8_dtype
from .tensors import (Float8BlockwiseQTensor, Float8Tensor, MXFP8Tensor, NVFP4Tensor, _transposed_shape,
                      _untransposed_shape, fp8_block_scale_shapes, mxfp8_scale_shapes, nvfp4_data_shapes,
                      nvfp4_scale_shapes)

# Quantizer kinds of the spec (SPEC §1.4; numbering internal).
QKIND_NONE, QKIND_FP8_DELAYED, QKIND_FP8_CURRENT, QKIND_MXFP8, QKIND_NVFP4, QKIND_FP8_BLOCK = range(6)
# qflags bits.
QFLAG_POW2 = 1 << 0
QFLAG_2D = 1 << 1  # FP8 block: 128x128 tiles (block_dim 2); NVFP4: 16x16 tiles
QFLAG_SR = 1 << 2  # NVFP4 stochastic rounding
QFLAG_RHT = 1 << 3  # NVFP4 random Hadamard transform of the columnwise copy
QFLAG_RANDOM_SIGN = 1 << 4  # the RHT's fixed sign vector (off: all ones)
QFLAG_SWIZZLED = 1 << 5  # write block scales in the GEMM-swizzled layout

# Spec of "no quantizer": plain output (the fields left out are at their schema defaults, see Quantizer._spec).
NO_QUANTIZER_SPEC = (QKIND_NONE, int(DType.kFloat8E4M3), True, True)


class Quantizer:
    """Base class: usages, `quantize`, `update_quantized`, `make_empty`, `copy`, `set_usage`."""

    def __init__(self, *, rowwise: bool = True, columnwise: bool = True):
        self.rowwise_usage = bool(rowwise)
        self.columnwise_usage = bool(columnwise)
        self.internal = False
        self.optimize_for_gemm = False

    # ---- public API ------------------------------------------------------------------------------------
    def quantize(self, tensor: torch.Tensor, out=None):
        from .cast import quantize

        return quantize(tensor, self, out)

    def __call__(self, tensor: torch.Tensor):
        return self.quantize(tensor)

    def update_quantized(self, src: torch.Tensor, dst, noop_flag=None):
        from .cast import quantize

        return quantize(src, self, dst, noop_flag)

    def make_empty(self, shape, dtype=torch.float32, device=None, requires_grad=False, pin_memory=False):
        raise NotImplementedError(f"{type(self).__name__}.make_empty")

    def copy(self):
        """A quantizer with the same configuration (sharing scale/amax tensors). Built through the
        constructor rather than copy.copy, which dynamo refuses to trace."""
        q = self._clone()
        q.internal, q.optimize_for_gemm = self.internal, self.optimize_for_gemm
        return q

    def _clone(self):
        raise NotImplementedError

    def set_usage(self, rowwise=None, columnwise=None):
        if rowwise is not None:
            self.rowwise_usage = bool(rowwise)
        if columnwise is not None:
            self.columnwise_usage = bool(columnwise)

    # ---- op boundary -----------------------------------------------------------------------------------
    def _spec(self, noop=None) -> tuple:
        """(qkind, qdtype, rowwise, columnwise, qflags, amax_epsilon, block_dim, scale, amax, noop), passed
        positionally. Trailing fields at their schema defaults (registration.cpp: 0, 0.0, 1, None, None, None)
        are left out: each argument passed costs host time to convert (registration.cpp, python_call.cpp)."""
        names = ", ".join(c.__name__ for c in QUANTIZER_CLASSES)
        raise TypeError(f"{type(self).__name__} has no quantization format (the base class, or a subclass that does "
                        f"not implement one): pass one of {names}")

    def _wrap(self, outs, dtype):
        """The quantized tensor of nominal `dtype` made of an op's six pieces (SPEC §1.4); its shape is read off
        the pieces."""
        raise NotImplementedError

    def _pieces(self) -> int:
        """Bit i set: `_wrap` reads piece i of the six. The others (0-element placeholders) are left out of the
        Python objects `_ops.call` makes (`keep`). Here the block formats' data and scales of each copy."""
        return (3 if self.rowwise_usage else 0) | (12 if self.columnwise_usage else 0)

    def _check_usage(self, op):
        if not (self.rowwise_usage or self.columnwise_usage):
            raise ValueError(f"{op}: {type(self).__name__} has neither rowwise nor columnwise usage")

    def _config(self):
        return (type(self), self.rowwise_usage, self.columnwise_usage, self.internal, self.optimize_for_gemm)

    def __eq__(self, other):
        return isinstance(other, Quantizer) and self._config() == other._config()

    def __hash__(self):
        try:
            return hash(self._config())
        except AttributeError:
            # An instance whose __init__ has not run yet. torch 2.11's dynamo makes one when a quantizer is built
            # inside a compiled region (object.__new__, the constructor's writes kept aside until the graph is
            # done) and hashes it when the quantizer is called (a membership test that catches only TypeError).
            return hash(type(self))


class _Float8PerTensorQuantizer(Quantizer):
    """Shared by the delayed and current per-tensor FP8 quantizers: both produce a Float8Tensor."""

    dtype: DType

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

    def _reduce_amax(self, amax: torch.Tensor):
        """MAX all-reduce of a locally computed amax over the quantizer's group (no host sync)."""
        import torch.distributed as dist

        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=self.amax_reduction_group)

    def _config(self):
        return super()._config() + (self.dtype, self.with_amax_reduction, id(self.amax_reduction_group),
                                    self.force_pow_2_scales, self.amax_epsilon)


class MXFP8Quantizer(Quantizer):
    """MXFP8 (SPEC §4.5): FP8 codes with one E8M0 scale per 1x32 block along the last dim (rowwise) and per 32x1
    block down the rows (columnwise, same shape, not transposed). The scale rounds UP: e = E8M0(amax * fl(1/fp8_max)),
    so a block's max never saturates. `optimize_for_gemm=True` writes the scales GEMM-swizzled (SPEC §4.8).
    The last dim must be a multiple of 32; any number of rows."""

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

    def _config(self):
        return super()._config() + (self.dtype, self.with_2d_quantization)


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

    def _config(self):
        return super()._config() + (self.dtype, self.block_scaling_dim, self.amax_epsilon, self.force_pow_2_scales)


class NVFP4Quantizer(Quantizer):
    """NVFP4 (SPEC §4.6): E2M1 codes (two per byte) with one E4M3 scale per 1x16 block and a global FP32 scale
    S_enc = 2688 / amax(x); the tensor stores the amax. Rowwise blocks run along the last dim; the columnwise copy
    is the transpose x^T [K, M] quantized the same way (16 consecutive rows of a column per block). Options:
    `with_2d_quantization` (one scale per 16x16 tile; the columnwise data is then the exact transpose of the
    rowwise data), `stochastic_rounding` (both copies; bits from the device's default generator), `with_rht`
    (random Hadamard transform of the columnwise copy, bf16 input only, requires `with_post_rht_amax=True`).
    Shapes: K % 16 == 0; M % 16 == 0 when columnwise usage is requested. TE's positional order."""

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

    def _config(self):
        return super()._config() + (self.with_rht, self.with_post_rht_amax, self.with_2d_quantization,
                                    self.stochastic_rounding, self.with_random_sign_mask)


QUANTIZER_CLASSES = (Float8Quantizer, Float8CurrentScalingQuantizer, MXFP8Quantizer, NVFP4Quantizer,
                     Float8BlockQuantizer)


def check_quantizer(op: str, quantizer, allow_none: bool = True):
    if quantizer is None and allow_none:
        return
    if not isinstance(quantizer, Quantizer):
        names = ", ".join(c.__name__ for c in QUANTIZER_CLASSES)
        raise TypeError(f"{op}: quantizer must be None or one of {names}, got {type(quantizer).__name__}")
