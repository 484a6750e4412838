"""Quantized tensor classes (SPEC §4.9): plain Python holders of the raw uint8 buffers and their scales.

Raw buffers are torch.uint8 (TE-compatible field names); `rowwise_data` / `columnwise_data` are typed
float8 views of them. A columnwise copy of a Float8Tensor is the bitwise transpose `(K,) + shape[:-1]`.
"""
from __future__ import annotations

import torch

from .dtypes import DType, as_dtype, as_fp8_dtype, to_torch_dtype


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

    # Names of the raw rowwise / columnwise FP8 buffers, and of the buffers that tell the device (per class).
    _ROW = _COL = None
    _BUFFERS = ()

    @property
    def device(self) -> torch.device:
        for name in self._BUFFERS:
            t = getattr(self, name)
            if t is not None:
                return t.device
        return torch.device("cpu")

    def _fp8_view(self, name):
        t = getattr(self, name)
        return None if t is None else t.view(to_torch_dtype(self._fp8_dtype))

    @property
    def rowwise_data(self):
        """The rowwise codes as a float8 tensor (a view of the uint8 buffer)."""
        return self._fp8_view(self._ROW)

    @property
    def columnwise_data(self):
        """The columnwise codes as a float8 tensor (a view of the uint8 buffer)."""
        return self._fp8_view(self._COL)

    def dequantize(self, dtype=None) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}(shape={tuple(self._shape)}, dtype={self._dtype}, device={self.device})"


class Float8Tensor(QuantizedTensor):
    """Per-tensor scaled FP8: `_data` uint8 of `shape`, `_transpose` uint8 of `(K,) + shape[:-1]`,
    `_scale_inv` float32 [1] shared by both copies."""

    _ROW, _COL, _BUFFERS = "_data", "_transpose", ("_data", "_transpose", "_scale_inv")

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


class _TwoCopyTensor(QuantizedTensor):
    """Base of the block-scaled tensors (MXFP8, FP8 block, NVFP4): a rowwise and a columnwise copy, each its data,
    scale_inv and (per class) further fields named in _COPY_FIELDS; `_map(fn, shape, ...)` rebuilds the tensor with
    `fn` applied to every buffer."""

    _ROW, _COL, _BUFFERS = "_rowwise_data", "_columnwise_data", ("_rowwise_data", "_columnwise_data")
    _COPY_FIELDS = {"rowwise": ("_rowwise_data", "_rowwise_scale_inv"),
                    "columnwise": ("_columnwise_data", "_columnwise_scale_inv")}

    def _set_copies(self, row, row_si, col, col_si):
        self._rowwise_data, self._rowwise_scale_inv = row, row_si
        self._columnwise_data, self._columnwise_scale_inv = col, col_si

    @classmethod
    def _bare(cls, shape, dtype, quantizer, row, row_si, col, col_si):
        """The start of a `_from_op`: a tensor of what a quantizing op returned, header and both copies set without
        `__init__`'s keyword parsing (trusted arguments); the caller sets its class's own fields."""
        t = object.__new__(cls)
        t._shape, t._dtype, t._quantizer, t.requires_grad = shape, dtype, quantizer, False
        t._set_copies(row, row_si, col, col_si)
        return t

    def clone(self):
        return self._map(lambda t: t.clone())

    def to(self, device):
        return self._map(lambda t: t.to(device))

    def _view_shape(self, shape):
        """The shape a view(*shape) asks for; only leading dims may change (the scales are laid out over the
        flattened [M, K] and shared)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
            shape = tuple(shape[0])
        new_shape = torch.empty(self._shape, device="meta").view(*shape).shape
        if len(new_shape) == 0 or (len(self._shape) and new_shape[-1] != self._shape[-1]):
            raise ValueError(f"{type(self).__name__}.view: only leading dims may change (shape "
                             f"{tuple(self._shape)}), got {tuple(new_shape)}")
        return new_shape

    def update_usage(self, rowwise_usage=None, columnwise_usage=None):
        """Provides a requested copy that is absent (_provide_copy), or drops one (never the last)."""
        for want, name in ((rowwise_usage, "rowwise"), (columnwise_usage, "columnwise")):
            if want and getattr(self, f"_{name}_data") is None:
                self._provide_copy(name)
        for want, name, other in ((rowwise_usage, "rowwise", "_columnwise_data"),
                                  (columnwise_usage, "columnwise", "_rowwise_data")):
            if want is False:
                if getattr(self, other) is None:
                    raise RuntimeError(f"{type(self).__name__}.update_usage: dropping the {name} copy would leave "
                                       f"no data")
                for field in self._COPY_FIELDS[name]:
                    setattr(self, field, None)

    def _provide_copy(self, name):
        """By default a copy cannot be derived from the other (each is quantized from the high-precision values)."""
        raise RuntimeError(f"{type(self).__name__}.update_usage: the {name} copy is absent and cannot be derived from "
                           f"the other one; quantize the high-precision tensor again with {name}=True")


# ---- MXFP8 ---------------------------------------------------------------------------------------------------
MX_BLOCK = 32


def _ceil_div(a, b):
    return (a + b - 1) // b


def _roundup(a, b):
    return _ceil_div(a, b) * b


def _rows_cols(shape):
    """The flattened [M, K] of a shape (SPEC conventions: 1-D is [1, K])."""
    shape = tuple(shape)
    k = shape[-1] if shape else 1
    m = 1
    for s in shape[:-1]:
        m *= s
    return m, k


def mxfp8_scale_shapes(shape):
    """(rowwise, columnwise) padded E8M0 scale shapes of SPEC §4.8 for a tensor of `shape`."""
    m, k = _rows_cols(shape)
    return ((_roundup(m, 128), _roundup(_ceil_div(k, MX_BLOCK), 4)),
            (_roundup(_ceil_div(m, MX_BLOCK), 4), _roundup(k, 128)))


def _swizzle(buf, rows, cols, inverse=False):
    """The cuBLASLt scale swizzle of SPEC §4.8 on a [rows, cols] matrix (multiples of 128 x 4): view the compact
    matrix as (rows/128, 4, 32, cols/4, 4) and swap dims 1 and 3; `inverse` views the swizzled bytes as
    (rows/128, cols/4, 32, 4, 4) and swaps them back."""
    view = (rows // 128, cols // 4, 32, 4, 4) if inverse else (rows // 128, 4, 32, cols // 4, 4)
    return buf.reshape(view).permute(0, 3, 2, 1, 4).reshape(rows, cols)


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

    @classmethod
    def _from_op(cls, shape, dtype, row, row_si, col, col_si, fp8_dtype, swizzled, quantizer):
        """The tensor of what a quantizing op returned (trusted arguments, no keyword parsing)."""
        t = cls._bare(shape, dtype, quantizer, row, row_si, col, col_si)
        t._fp8_dtype, t._with_gemm_swizzled_scales = fp8_dtype, swizzled
        return t

    @staticmethod
    def _typed_scale(s):
        e8m0 = getattr(torch, "float8_e8m0fnu", None)
        return s if s is None or e8m0 is None else s.view(e8m0)

    @property
    def rowwise_scale_inv(self):
        return self._typed_scale(self._rowwise_scale_inv)

    @property
    def columnwise_scale_inv(self):
        return self._typed_scale(self._columnwise_scale_inv)

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
        columnwise = self._rowwise_data is None
        data = self._columnwise_data if columnwise else self._rowwise_data
        if data is None:
            raise RuntimeError("MXFP8Tensor.dequantize: the tensor holds neither a rowwise nor a columnwise copy")
        m, k = _rows_cols(self._shape)
        s = self._compact_scale(columnwise)
        if columnwise:
            f = e8m0_to_float32(s[:_ceil_div(m, MX_BLOCK), :k]).repeat_interleave(MX_BLOCK, dim=0)[:m]
        else:
            f = e8m0_to_float32(s[:m, :k // MX_BLOCK]).repeat_interleave(MX_BLOCK, dim=1)
        v = data.reshape(m, k).view(to_torch_dtype(self._fp8_dtype)).to(torch.float32)
        return (v * f).to(dtype).reshape(self._shape)

    def _map(self, fn, shape=None, data_fn=None):
        data_fn = data_fn or fn
        m = lambda f, t: None if t is None else f(t)  # noqa: E731
        return MXFP8Tensor._from_op(self._shape if shape is None else shape, self._dtype,
                                    m(data_fn, self._rowwise_data), m(fn, self._rowwise_scale_inv),
                                    m(data_fn, self._columnwise_data), m(fn, self._columnwise_scale_inv),
                                    self._fp8_dtype, self._with_gemm_swizzled_scales, self._quantizer)

    def view(self, *shape):
        """Exact view changing only leading dims (the scales, laid out over the flattened [M, K], are shared)."""
        new_shape = self._view_shape(shape)
        return self._map(lambda t: t, new_shape, lambda t: t.view(new_shape))

    reshape = view


# ---- FP8 block (1x128 / 128x128) -------------------------------------------------------------------------------
FP8_BLOCK_LEN = 128


def fp8_block_scale_shapes(shape, two_d):
    """(rowwise, columnwise) padded float32 scale shapes of SPEC §4.8 for a tensor of `shape` (flattened [M, K]).
    1-D: [ceil(K/128), roundup(M, 4)] (K-block-major, M contiguous) and [ceil(M/128), roundup(K, 4)];
    2-D: [ceil(M/128), roundup(ceil(K/128), 4)] and its transpose-shaped [ceil(K/128), roundup(ceil(M/128), 4)]."""
    m, k = _rows_cols(shape)
    mb, kb = _ceil_div(m, FP8_BLOCK_LEN), _ceil_div(k, FP8_BLOCK_LEN)
    if two_d:
        return (mb, _roundup(kb, 4)), (kb, _roundup(mb, 4))
    return (kb, _roundup(m, 4)), (mb, _roundup(k, 4))


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

    @classmethod
    def _from_op(cls, shape, dtype, row, row_si, col, col_si, fp8_dtype, is_2d, quantizer):
        """The tensor of what a quantizing op returned (trusted arguments, no keyword parsing)."""
        t = cls._bare(shape, dtype, quantizer, row, row_si, col, col_si)
        t._fp8_dtype, t._is_2D_scaled = fp8_dtype, is_2d
        return t

    @property
    def rowwise_scale_inv(self):
        return self._rowwise_scale_inv

    @property
    def columnwise_scale_inv(self):
        return self._columnwise_scale_inv

    def dequantize(self, dtype=None) -> torch.Tensor:
        """fl(fp8 * scale_inv[block]) in FP32, rounded once to `dtype` (default: the nominal dtype); the rowwise copy
        when present, else the columnwise copy transposed back. With power-of-two scales (the default) a block max at
        the input dtype's max decodes to 2^128 (Inf) for fp32/bf16 and 65536 for fp16, as MXFP8 does."""
        dtype = self._dtype if dtype is None else to_torch_dtype(dtype)
        columnwise = self._rowwise_data is None
        data = self._columnwise_data if columnwise else self._rowwise_data
        if data is None:
            raise RuntimeError("Float8BlockwiseQTensor.dequantize: the tensor holds neither a rowwise nor a "
                               "columnwise copy")
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

    def _map(self, fn, shape=None, row_fn=None, col_fn=None):
        m = lambda f, t: None if t is None else f(t)  # noqa: E731
        return Float8BlockwiseQTensor._from_op(self._shape if shape is None else shape, self._dtype,
                                               m(row_fn or fn, self._rowwise_data), m(fn, self._rowwise_scale_inv),
                                               m(col_fn or fn, self._columnwise_data),
                                               m(fn, self._columnwise_scale_inv), self._fp8_dtype, self._is_2D_scaled,
                                               self._quantizer)

    def view(self, *shape):
        """Exact view changing only leading dims (the scales, laid out over the flattened [M, K], are shared)."""
        new_shape = self._view_shape(shape)
        return self._map(lambda t: t, new_shape, lambda t: t.view(new_shape),
                         lambda t: t.view(_transposed_shape(new_shape)))

    reshape = view


# ---- NVFP4 ---------------------------------------------------------------------------------------------------
NV_BLOCK = 16
# The sign vector s of the random Hadamard transform (SPEC §4.6) as a bitmask: bit i set where s_i = -1.
RHT_SIGN_MASK = 0xD7E8


def nvfp4_scale_shapes(shape):
    """(rowwise, columnwise) padded E4M3 scale shapes of SPEC §4.8 for a tensor of `shape` (K % 16 == 0)."""
    m, k = _rows_cols(shape)
    return ((_roundup(m, 128), _roundup(k // NV_BLOCK, 4)), (_roundup(k, 128), _roundup(m // NV_BLOCK, 4)))


def nvfp4_data_shapes(shape):
    """(rowwise, columnwise) packed-data shapes: shape[:-1] + (K/2,) and the transposed 2-D [K, M/2]."""
    m, k = _rows_cols(shape)
    return tuple(shape[:-1]) + (k // 2,), (k, m // 2)


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

    _BUFFERS = ("_rowwise_data", "_columnwise_data", "_amax_rowwise", "_amax_columnwise")
    _COPY_FIELDS = {"rowwise": ("_rowwise_data", "_rowwise_scale_inv", "_amax_rowwise"),
                    "columnwise": ("_columnwise_data", "_columnwise_scale_inv", "_amax_columnwise")}

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
        self._fp4_dtype = DType.kFloat4E2M1
        self._with_gemm_swizzled_scales = bool(with_gemm_swizzled_scales)

    @classmethod
    def _from_op(cls, shape, dtype, row, row_si, col, col_si, amax_row, amax_col, swizzled, quantizer):
        """The tensor of what a quantizing op returned (trusted arguments, no keyword parsing)."""
        t = cls._bare(shape, dtype, quantizer, row, row_si, col, col_si)
        t._amax_rowwise, t._amax_columnwise = amax_row, amax_col
        t._fp4_dtype, t._with_gemm_swizzled_scales = DType.kFloat4E2M1, swizzled
        return t

    def _fp8_view(self, name):
        t = getattr(self, name)
        fp4 = getattr(torch, "float4_e2m1fn_x2", None)
        return t if t is None or fp4 is None else t.view(fp4)

    @staticmethod
    def _typed_scale(s):
        return None if s is None else s.view(torch.float8_e4m3fn)

    @property
    def rowwise_scale_inv(self):
        return self._typed_scale(self._rowwise_scale_inv)

    @property
    def columnwise_scale_inv(self):
        return self._typed_scale(self._columnwise_scale_inv)

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
        columnwise = self._rowwise_data is None
        data = self._columnwise_data if columnwise else self._rowwise_data
        if data is None:
            raise RuntimeError("NVFP4Tensor.dequantize: the tensor holds neither a rowwise nor a columnwise copy")
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

    def _map(self, fn, shape=None, row_fn=None):
        row_fn = row_fn or fn
        m = lambda f, t: None if t is None else f(t)  # noqa: E731
        return NVFP4Tensor._from_op(self._shape if shape is None else shape, self._dtype,
                                    m(row_fn, self._rowwise_data), m(fn, self._rowwise_scale_inv),
                                    m(fn, self._columnwise_data), m(fn, self._columnwise_scale_inv),
                                    m(fn, self._amax_rowwise), m(fn, self._amax_columnwise),
                                    self._with_gemm_swizzled_scales, self._quantizer)

    def view(self, *shape):
        """Exact view changing only leading dims (scales and the 2-D columnwise copy are laid out over the
        flattened [M, K] and shared)."""
        new_shape = self._view_shape(shape)
        row_shape = tuple(new_shape[:-1]) + (new_shape[-1] // 2,)
        return self._map(lambda t: t, new_shape, lambda t: t.view(row_shape))

    reshape = view
