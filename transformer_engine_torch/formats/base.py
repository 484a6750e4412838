"""What every quantization format shares (SPEC §4.1, §4.9): the `Quantizer` and `QuantizedTensor` bases, the
block formats' two-copy tensor base, the shape helpers, the qflags bits, `quantize` itself and the registry of
formats.

A format lives in one module of this package (fp8, mxfp8, nvfp4, fp8_block): its quantizer, its tensor class, its
shapes and the fake outputs of its quantizing ops; the module's last line registers it (`register_format`). This
module imports no format: `quantize` reaches a format only through the quantizer's methods, and the GEMM and the
device facts find a tensor's format through the registry.
"""
from __future__ import annotations

import typing

import torch

from .._ops import QKIND_NONE, call
from ..dtypes import FLOAT_DTYPES, DType, to_torch_dtype

# qflags bits (SPEC §1.4), shared by the formats that read them.
QFLAG_POW2 = 1 << 0
QFLAG_2D = 1 << 1  # FP8 block: 128x128 tiles (block_dim 2); NVFP4: 16x16 tiles
QFLAG_SR = 1 << 2  # NVFP4 stochastic rounding
QFLAG_RHT = 1 << 3  # NVFP4 random Hadamard transform of the columnwise copy
QFLAG_RANDOM_SIGN = 1 << 4  # the RHT's fixed sign vector (off: all ones)
QFLAG_SWIZZLED = 1 << 5  # write block scales in the GEMM-swizzled layout

# Spec of "no quantizer": plain output (the fields left out are at their schema defaults, see Quantizer._spec).
NO_QUANTIZER_SPEC = (QKIND_NONE, int(DType.kFloat8E4M3), True, True)

# Looked up once rather than through three attribute lookups per call.
_QUANTIZE = torch.ops.te.quantize.default


# ---- shapes ------------------------------------------------------------------------------------------------------
def _transposed_shape(shape):
    shape = tuple(shape)
    return shape if len(shape) == 0 else (shape[-1],) + shape[:-1]


def _untransposed_shape(transposed):
    """Inverse of `_transposed_shape`: the logical shape of a tensor from the shape of its transposed copy."""
    transposed = tuple(transposed)
    return transposed[1:] + transposed[:1]


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


def _swizzle(buf, rows, cols, inverse=False):
    """The cuBLASLt scale swizzle of SPEC §4.8 on a [rows, cols] matrix (multiples of 128 x 4): view the compact
    matrix as (rows/128, 4, 32, cols/4, 4) and swap dims 1 and 3; `inverse` views the swizzled bytes as
    (rows/128, cols/4, 32, 4, 4) and swaps them back."""
    view = (rows // 128, cols // 4, 32, 4, 4) if inverse else (rows // 128, 4, 32, cols // 4, 4)
    return buf.reshape(view).permute(0, 3, 2, 1, 4).reshape(rows, cols)


# ---- quantizers ---------------------------------------------------------------------------------------------------
class Quantizer:
    """Base class: usages, `quantize`, `update_quantized`, `make_empty`, `copy`, `set_usage`. A format's quantizer
    names the class of the tensors it makes (`tensor_class`) and implements the op boundary below."""

    tensor_class: type = None  # set after QuantizedTensor below; each format's quantizer names its own

    def __init__(self, *, rowwise: bool = True, columnwise: bool = True):
        self.rowwise_usage = bool(rowwise)
        self.columnwise_usage = bool(columnwise)
        self.internal = False
        self.optimize_for_gemm = False

    # ---- public API ------------------------------------------------------------------------------------
    def quantize(self, tensor: torch.Tensor, out=None):
        return quantize(tensor, self, out)

    def __call__(self, tensor: torch.Tensor):
        return self.quantize(tensor)

    def update_quantized(self, src: torch.Tensor, dst, noop_flag=None):
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

    def _spec_for(self, tensor, noop=None) -> tuple:
        """The spec of quantizing `tensor` (current scaling with amax reduction computes and reduces the amax
        first)."""
        return self._spec(noop)

    @property
    def _reduces_amax(self) -> bool:
        """Whether the amax is all-reduced before scaling: activations cannot fuse such a quantization (they run
        unquantized, then the cast)."""
        return False

    def _quantize_into_args(self, output, tensor, noop) -> tuple:
        """(spec, buffers by name) of te::quantize_into writing `tensor` into `output` (of `tensor_class`)."""
        spec = self._spec_for(tensor, noop)
        return spec, self._output_buffers(output, tensor)

    def _output_buffers(self, output, tensor) -> dict:
        """`output`'s buffers for quantize_into: missing usages allocated, unwanted ones dropped."""
        raise NotImplementedError

    def _two_copy_buffers(self, output, device, row_fields, col_fields) -> dict:
        """`_output_buffers` of the block formats: each copy's fields (name, shape, dtype) are dropped where its
        usage is not wanted and allocated where it is wanted and missing; returns the four buffers by name."""
        for usage, fields in ((self.rowwise_usage, row_fields), (self.columnwise_usage, col_fields)):
            for name, shape, dtype in fields:
                if not usage:
                    setattr(output, name, None)
                elif getattr(output, name) is None:
                    setattr(output, name, torch.empty(shape, dtype=dtype, device=device))
        return dict(row_data=output._rowwise_data, row_scale_inv=output._rowwise_scale_inv,
                    col_data=output._columnwise_data, col_scale_inv=output._columnwise_scale_inv)

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


# ---- quantized tensors -------------------------------------------------------------------------------------------
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

    # What the GEMM (gemm.py) and autocast (recipe.py) know of the format, per class (SPEC §6.5-6.7).
    gemm_format = None  # the format's name in messages, e.g. "MXFP8"
    gemm_k_multiple = 0  # block formats: the contraction dim K must be a multiple of it; 0: a per-tensor format
    native_gemm = None  # block formats: NativeGemm, where cuBLASLt runs it natively (emulated elsewhere)
    gemm_core_decodes = False  # CUDA: the core's GEMM op takes the operands on every arch (decoding them to bf16
    # where there is no native kernel, SPEC §6.7) instead of this package dequantizing them
    gemm_core_cpu = False  # CPU: the core's CPU kernel takes the operands (the bytes tej's GEMM gives) instead of
    # this package dequantizing them

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

    # The class's own fields, set by _from_op from the arguments after the two copies (in this order).
    _OP_FIELDS = ()

    @classmethod
    def _from_op(cls, shape, dtype, row, row_si, col, col_si, *fields_then_quantizer):
        """The tensor of what a quantizing op returned, without `__init__`'s keyword parsing (trusted arguments):
        the header, both copies, the values of the class's _OP_FIELDS, then the quantizer."""
        *fields, quantizer = fields_then_quantizer
        t = object.__new__(cls)
        t._shape, t._dtype, t._quantizer, t.requires_grad = shape, dtype, quantizer, False
        t._set_copies(row, row_si, col, col_si)
        for name, value in zip(cls._OP_FIELDS, fields):
            setattr(t, name, value)
        return t

    @staticmethod
    def _typed_scale(s):
        """A scale buffer as the public `*_scale_inv` properties give it (a typed view where the class has one)."""
        return s

    @property
    def rowwise_scale_inv(self):
        return self._typed_scale(self._rowwise_scale_inv)

    @property
    def columnwise_scale_inv(self):
        return self._typed_scale(self._columnwise_scale_inv)

    def _copy(self, rowwise: bool) -> tuple:
        """(data, scale_inv) of the rowwise or the columnwise copy."""
        if rowwise:
            return self._rowwise_data, self._rowwise_scale_inv
        return self._columnwise_data, self._columnwise_scale_inv

    def _dequantize_copy(self) -> tuple:
        """(columnwise, data) of the copy `dequantize` reads: the rowwise one when present."""
        columnwise = self._rowwise_data is None
        data = self._columnwise_data if columnwise else self._rowwise_data
        if data is None:
            raise RuntimeError(f"{type(self).__name__}.dequantize: the tensor holds neither a rowwise nor a "
                               f"columnwise copy")
        return columnwise, data

    def _map(self, fn, shape=None, row_fn=None, col_fn=None):
        """The tensor rebuilt with `fn` applied to every buffer: the data and scales of both copies and the class's
        tensor _OP_FIELDS (NVFP4's amaxes; its other fields are kept). row_fn / col_fn, where given, replace fn for
        the rowwise / columnwise data; `shape`, where given, replaces the shape. Absent buffers stay None."""
        m = lambda f, t: None if t is None else f(t)  # noqa: E731
        fields = []
        for name in self._OP_FIELDS:
            value = getattr(self, name)
            fields.append(fn(value) if isinstance(value, torch.Tensor) else value)
        return type(self)._from_op(self._shape if shape is None else shape, self._dtype,
                                   m(row_fn or fn, self._rowwise_data), m(fn, self._rowwise_scale_inv),
                                   m(col_fn or fn, self._columnwise_data), m(fn, self._columnwise_scale_inv),
                                   *fields, self._quantizer)

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

    # ---- the native block GEMM (gemm.py) ----
    gemm_native_out_dtypes = None  # the output dtypes cuBLASLt's native GEMM of the format writes; None: all

    def _native_gemm_operand(self, rowwise: bool, trans: bool) -> tuple:
        """(data as a 2-D matrix, scales as cuBLASLt reads them, DType code, trans as the kernel sees it,
        te::GemmScaling code) of the copy the GEMM picked (SPEC §6.4, §6.6); `trans` is the operand's flag."""
        raise NotImplementedError(f"{type(self).__name__} has no native GEMM")

    def _gemm_global_amax(self, rowwise: bool):
        """The copy's global amax, folded into the native GEMM's alpha (NVFP4); None for formats without one."""
        return None


Quantizer.tensor_class = QuantizedTensor


# ---- the registry of formats -------------------------------------------------------------------------------------
class NativeGemm(typing.NamedTuple):
    """Where a format's GEMM runs natively through cuBLASLt (SPEC §6.6); elsewhere it is emulated (§6.7)."""

    archs: tuple  # (major, minor) compute capabilities; minor None: every minor of that major
    min_cublaslt: int  # cublasLtGetVersion(), e.g. 120800 for 12.8

    def holds(self, capability: tuple, cublaslt: int) -> bool:
        major, minor = capability
        return cublaslt >= self.min_cublaslt and any(
            major == a and (m is None or minor == m) for a, m in self.archs)

    def where(self) -> str:
        """'sm_100/sm_110 with cuBLASLt >= 12.8', for messages."""
        archs = "/".join(f"sm_{a}{0 if m is None else m}" for a, m in self.archs)
        return f"{archs} with cuBLASLt >= {self.min_cublaslt // 10000}.{self.min_cublaslt // 100 % 100}"


QUANTIZER_CLASSES: tuple = ()  # in registration order (error messages list them)
TENSOR_CLASSES: dict = {}  # class name -> quantized tensor class


def register_format(tensor_cls: type, *quantizer_classes: type) -> None:
    """Makes a format known: its quantizers to `check_quantizer` and its messages, its tensor class (by name) to the
    GEMM (gemm.py) and the device facts (_device.py). Each format module ends with this call."""
    global QUANTIZER_CLASSES
    QUANTIZER_CLASSES += tuple(quantizer_classes)
    TENSOR_CLASSES[tensor_cls.__name__] = tensor_cls


def check_quantizer(op: str, quantizer, allow_none: bool = True):
    if quantizer is None and allow_none:
        return
    if not isinstance(quantizer, Quantizer):
        names = ", ".join(c.__name__ for c in QUANTIZER_CLASSES)
        raise TypeError(f"{op}: quantizer must be None or one of {names}, got {type(quantizer).__name__}")


def check_tensor(op, name, t, float_only=False):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if float_only and t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} must be float32, float16 or bfloat16, got {t.dtype} with shape "
                        f"{tuple(t.shape)} on {t.device}")


def quantize(tensor, quantizer, output=None, noop=None):
    """Quantize `tensor`. With `output`, its buffers are reused (missing usages allocated, unwanted ones
    dropped); with `noop` (float32 [1]) equal to 1.0 nothing is written (CUDA-graph weight caching)."""
    check_tensor("quantize", "tensor", tensor, float_only=True)
    if quantizer is None:
        raise ValueError("quantize: quantizer is None; use the tensor as it is")
    check_quantizer("quantize", quantizer, allow_none=False)
    if output is None and noop is None:
        # A quantizer with neither usage is refused by the op (ValueError) before anything is allocated.
        return quantizer._wrap(call(_QUANTIZE, (tensor, *quantizer._spec_for(tensor)), quantizer._pieces()),
                               tensor.dtype)
    # Checked here, before `output` loses the buffers this quantizer does not want.
    quantizer._check_usage("quantize")
    if output is None:
        output = quantizer.make_empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    expected = quantizer.tensor_class
    if not isinstance(output, expected):
        raise TypeError(f"quantize: output must be a {expected.__name__} for {type(quantizer).__name__}, "
                        f"got {type(output).__name__}")
    if tuple(output.shape) != tuple(tensor.shape):
        raise ValueError(f"quantize: output has shape {tuple(output.shape)} but the input has shape "
                         f"{tuple(tensor.shape)}")
    spec, buffers = quantizer._quantize_into_args(output, tensor, noop)
    # The buffers by name: the spec before them may stop short of its last field (Quantizer._spec).
    torch.ops.te.quantize_into.default(tensor, *spec, **buffers)
    return output
