"""GEMM (SPEC §6): `generic_gemm` (TE's positional order), `general_gemm`, and the grouped list forms.

Row-major meaning: D = alpha·op(B)·op(A) + beta·D_in (+ epilogue), op(X) = Xᵀ when its flag is set; TN is fprop
(A = W, B = X), NN dgrad (A = W, B = dY), NT wgrad (A = X, B = dY). Quantized tensors stay in Python: this file
picks the stored copy each operand needs (SPEC §6.4) and passes its codes, scale_inv and DType code to the one
`te::gemm` op, which writes into buffers allocated here.
"""
from __future__ import annotations

import torch

from . import _device
from ._ops import call
from .dtypes import DType, FLOAT_DTYPES, as_dtype, to_torch_dtype
from .cast import quantize
from .formats.base import TENSOR_CLASSES, QuantizedTensor, _rows_cols, _transposed_shape, check_quantizer
from .formats.fp8 import Float8Quantizer, Float8Tensor
from .formats.fp8_block import Float8BlockwiseQTensor

_GEMM = torch.ops.te.gemm.default
_PLAIN_CODES = {torch.float32: int(DType.kFloat32), torch.float16: int(DType.kFloat16),
                torch.bfloat16: int(DType.kBFloat16)}
_LAYOUTS = ("TN", "NN", "NT", "TT")


def _block_format(x):
    """The registered block-format class of operand `x` (by its class's name, formats/base.py), or None. A block
    format's GEMM runs natively where its `native_gemm` holds, elsewhere through the documented emulation (SPEC §6.7):
    the copy §6.4 picks, dequantized on the device, then a plain GEMM."""
    cls = TENSOR_CLASSES.get(type(x).__name__)
    return cls if cls is not None and cls.gemm_k_multiple else None


def _describe(x):
    if isinstance(x, Float8Tensor):
        return f"Float8Tensor{list(x.shape)} {x._fp8_dtype.name[len('kFloat8'):]}"
    if isinstance(x, QuantizedTensor):
        return f"{type(x).__name__}{list(x.shape)}"
    return f"{x.dtype}{list(x.shape)}"


def _where(A, B, layout):
    """The operands, layout and arch of a GEMM, for messages (as the C++ checks give them)."""
    return f"(A {_describe(A)}, B {_describe(B)}, layout {layout}, {_device.arch_name(A.device)})"


def _block_copies(A, transA, B, transB, layout):
    """SPEC §6.5/§6.3 rules for block-format operands on the logical shapes, then the copy each operand uses
    (SPEC §6.4: A rowwise iff transA; B rowwise iff not transB). Returns ((A, rowwise), (B, rowwise))."""
    ka, kb = type(A).__name__, type(B).__name__
    if ka != kb:
        raise TypeError(f"generic_gemm: A ({_describe(A)}) and B ({_describe(B)}) must use one scaling format "
                        f"(mixed operands are not supported); quantize both the same way")
    cls = _block_format(A)
    mult, fmt = cls.gemm_k_multiple, cls.gemm_format
    a_rows, a_cols = _rows_cols(tuple(A.shape))
    m, k = (a_rows, a_cols) if transA else (a_cols, a_rows)
    if k % mult:
        raise ValueError(f"generic_gemm: {fmt} GEMM needs the contraction dim K to be a multiple of {mult}, got K={k} "
                         f"{_where(A, B, layout)}. Pad K to {(k + mult - 1) // mult * mult} or keep this layer in bf16")
    if m % 16:
        raise ValueError(f"generic_gemm: {fmt} GEMM needs the output's last dim N to be a multiple of 16, got N={m} "
                         f"{_where(A, B, layout)}. Pad it to {(m + 15) // 16 * 16} or keep this layer in bf16")
    if getattr(A, "_is_2D_scaled", False) and getattr(B, "_is_2D_scaled", False):
        raise ValueError(f"generic_gemm: FP8 block 2-D x 2-D has no kernel {_where(A, B, layout)}; quantize one operand with "
                         f"block_scaling_dim=1")
    out = []
    for name, x, trans in (("A", A, transA), ("B", B, transB)):
        rowwise = trans if name == "A" else not trans
        field = "_rowwise_data" if rowwise else "_columnwise_data"
        if getattr(x, field, None) is None:
            use = "transposed" if trans else "non-transposed"
            raise ValueError(f"generic_gemm: {name} ({_describe(x)}) is used {use} (layout {layout}) in a {fmt} GEMM "
                             f"on {_device.arch_name(x.device)}, which needs {name}'s {field[1:-5]} copy; quantize it "
                             f"with {field[1:-5]}=True")
        out.append((x, rowwise))
    return out


def _emulated_operands(copies):
    """SPEC §6.7: the picked copies dequantized on the device to bf16 (exactly to FP32 on the CPU)."""
    out = []
    for x, rowwise in copies:
        # A view that holds only the copy to use (dequantize reads rowwise first, else columnwise); built by the
        # class's _map, as copy.copy is not traced by torch 2.11's dynamo (fullgraph compile of a layer fails).
        y = x._map(lambda t: t)
        if not rowwise:
            y._rowwise_data = None
        out.append(y.dequantize(torch.float32 if x.device.type == "cpu" else torch.bfloat16))
    return out


def _native_operands(copies, transA, transB):
    """The native block GEMM's operands (SPEC §6.4, §6.6): for each of A and B the stored copy as a 2-D matrix
    (rows, K or K-major as the layout says), its scales (float32 FP8-block matrices; GEMM-swizzled E8M0 / E4M3 bytes,
    swizzled into a temporary when stored compact), DType code, kernel flag and te::GemmScaling code; and, for NVFP4,
    the two copies' global amaxes (the core folds their decode scales into alpha, SPEC §6.7), else (None, None). FP8
    block and NVFP4 copies run as TN (their columnwise copies are stored transposed); MXFP8 copies keep the layout."""
    out, amaxes = [], []
    for i, (x, rowwise) in enumerate(copies):
        out.append(x._native_gemm_operand(rowwise, transA if i == 0 else transB, i == 0))
        amaxes.append(x._gemm_global_amax(rowwise))
    return out[0], out[1], tuple(None if a is None else a.float().reshape(1) for a in amaxes)


def _operand(name, x, trans, layout):
    """(tensor, scale_inv or None, DType code, trans as the kernel sees it) for operand `name`.

    Per-tensor FP8 always runs as TN (SPEC §6.4, the sm_90 rule, applied on every device): A uses its rowwise
    copy iff transA, B iff not transB; the other use takes `_transpose` with the flag flipped."""
    if isinstance(x, Float8Tensor):
        rowwise = trans if name == "A" else not trans
        if rowwise:
            if x._data is None:
                raise ValueError(
                    f"generic_gemm: {name} ({_describe(x)}) is used {'transposed' if trans else 'non-transposed'} "
                    f"(layout {layout}) in an FP8 GEMM on {_device.arch_name(x.device)}, which needs {name}'s rowwise "
                    f"copy; quantize it with "
                    f"rowwise=True or call update_usage(rowwise_usage=True)")
            return x._data, x._scale_inv, int(x._fp8_dtype), trans
        if x._transpose is None:
            raise ValueError(
                f"generic_gemm: {name} ({_describe(x)}) is used {'transposed' if trans else 'non-transposed'} "
                f"(layout {layout}) in an FP8 GEMM on {_device.arch_name(x.device)}, which runs as TN and needs "
                f"{name}'s columnwise copy; quantize it with columnwise=True or call "
                f"update_usage(columnwise_usage=True)")
        return x._transpose, x._scale_inv, int(x._fp8_dtype), not trans
    if isinstance(x, QuantizedTensor):
        raise NotImplementedError(
            f"generic_gemm: not yet supported: {type(x).__name__} operand {name} ({_describe(x)}, layout {layout}). "
            f"Supported operands: fp32/fp16/bf16 tensors and Float8Tensor; dequantize it to bf16 first")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"generic_gemm: {name} must be a torch.Tensor or a quantized tensor, got {type(x).__name__}")
    if x.dtype not in _PLAIN_CODES:
        raise TypeError(f"generic_gemm: {name} must be float32, float16, bfloat16 or a quantized tensor, got "
                        f"{x.dtype} with shape {list(x.shape)}")
    return x, None, _PLAIN_CODES[x.dtype], trans


def _out_shape(A, transA, B, transB):
    a_rows, a_cols = _rows_cols(tuple(A.shape))
    last = a_rows if transA else a_cols
    if transB:
        return (_rows_cols(tuple(B.shape))[1], last)
    return tuple(B.shape[:-1]) + (last,) if len(B.shape) else (1, last)


def _hp_dtype(value, default, what):
    if value is None:
        return default
    dt = to_torch_dtype(value, what) if not isinstance(value, torch.dtype) else value
    if dt == torch.uint8 or as_dtype(dt, what) == DType.kFloat4E2M1:
        raise ValueError(f"generic_gemm: FP4 output is not supported ({what}={value}); request bf16/fp32 output and "
                         f"quantize it afterwards")
    return dt


def _gemm(A, transA, B, transB, D, quantizer, output_dtype, bias, bias_type, gelu, gelu_in, grad, workspace,
          workspace_size, accumulate, use_split_accumulator, alpha, beta, pre_gelu_buf=None, bias_grad_buf=None):
    transA, transB = bool(transA), bool(transB)
    layout = ("T" if transA else "N") + ("T" if transB else "N")
    check_quantizer("generic_gemm", quantizer)
    nominal = getattr(A, "dtype", None)
    if nominal is None:
        raise TypeError(f"generic_gemm: A must be a torch.Tensor or a quantized tensor, got {type(A).__name__}")
    a_scaling = b_scaling = 0
    amaxes = (None, None)
    if beta is None:
        beta = 1.0 if accumulate else 0.0
    if output_dtype is not None and as_dtype(output_dtype, "generic_gemm: output_dtype") == DType.kFloat4E2M1:
        raise ValueError("generic_gemm: FP4 output is not supported (output_dtype=kFloat4E2M1); request bf16/fp32 "
                         "output and quantize it to NVFP4 afterwards")
    fmt = _block_format(A) or _block_format(B)
    if fmt is not None:
        copies = _block_copies(A, transA, B, transB, layout)
        # The name of the class, a plain constant, is what the device fact takes (it is traced: _device.py).
        # MXFP8 / NVFP4 on CUDA always go to the core's GEMM op: natively on sm_100+, elsewhere it decodes each
        # operand once to bf16 in its workspace and runs the bf16 GEMM (SPEC §6.7).
        native = isinstance(A, fmt) and (fmt.gemm_core_cpu if A.device.type == "cpu" else (
            fmt.gemm_core_decodes or _device.gemm_is_native(fmt.__name__, _device.cuda_index(A.device))))
        if native and fmt.gemm_native_out_dtypes is not None:
            native = _hp_dtype(output_dtype, nominal, "generic_gemm: output_dtype") in fmt.gemm_native_out_dtypes
        if native:
            (a, a_sinv, a_code, ta, a_scaling), (b, b_sinv, b_code, tb, b_scaling), amaxes = _native_operands(
                copies, transA, transB)
        else:
            A, B = _emulated_operands(copies)
    if a_scaling == 0:
        a, a_sinv, a_code, ta = _operand("A", A, transA, layout)
        b, b_sinv, b_code, tb = _operand("B", B, transB, layout)
    fp8_in = a_sinv is not None
    if a.device != b.device:
        raise ValueError(f"generic_gemm: operands must be on one device, got A {_describe(A)} on {a.device}, "
                         f"B {_describe(B)} on {b.device}; move them with .to(device)")
    out_dt = _hp_dtype(output_dtype, nominal, "generic_gemm: output_dtype")
    if out_dt in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise ValueError(f"generic_gemm: output_dtype {out_dt} needs an FP8 quantizer: pass a Float8Quantizer as "
                         f"`quantizer` and a 16-bit or fp32 output_dtype (the nominal dtype)")
    if out_dt not in FLOAT_DTYPES:
        raise TypeError(f"generic_gemm: output_dtype must be float32, float16 or bfloat16, got {out_dt}")
    if not accumulate and beta != 0:
        raise ValueError(f"generic_gemm: beta={beta} reads D, which needs accumulate=True")
    if accumulate and D is None:
        raise ValueError("generic_gemm: accumulate=True needs D, the output to accumulate into")
    out_shape = _out_shape(A, transA, B, transB)
    dev = a.device
    fp8_out = isinstance(quantizer, Float8Quantizer) and fp8_in and a_scaling == 0  # blocks: GEMM, then quantize
    hp16 = to_torch_dtype(bias_type, "generic_gemm: bias_type") if bias_type is not None else torch.bfloat16
    if hp16 not in FLOAT_DTYPES:
        raise TypeError(f"generic_gemm: bias_type must be float32, float16 or bfloat16, got {hp16}")
    vec_dt = hp16 if fp8_out else out_dt  # dtype of a bias gradient (SPEC §6.2)

    # Output buffers.
    d_code = _PLAIN_CODES[out_dt]
    d_scale = d_amax = d_sinv = None
    d_user = D
    if fp8_out:
        d_code = int(quantizer.dtype)
        if D is None:
            d_buf = torch.empty(out_shape, dtype=torch.uint8, device=dev)
            d_sinv = torch.empty(1, dtype=torch.float32, device=dev)
        elif isinstance(D, Float8Tensor) and D._data is not None:
            d_buf, d_sinv = D._data, D._scale_inv
        else:
            raise TypeError(f"generic_gemm: with a Float8Quantizer and FP8 operands D must be None or a Float8Tensor "
                            f"with a rowwise copy, got {type(D).__name__}")
        d_scale, d_amax = quantizer.scale, quantizer.amax
    elif quantizer is not None or isinstance(D, QuantizedTensor):
        d_buf = torch.empty(out_shape, dtype=out_dt, device=dev)  # quantized after the GEMM
    elif D is None:
        d_buf = torch.empty(out_shape, dtype=out_dt, device=dev)
    else:
        if not isinstance(D, torch.Tensor):
            raise TypeError(f"generic_gemm: D must be a torch.Tensor, got {type(D).__name__}")
        if tuple(D.shape) != tuple(out_shape) and D.numel() != _rows_cols(out_shape)[0] * out_shape[-1]:
            raise ValueError(f"generic_gemm: D has shape {list(D.shape)} but op(B)·op(A) {_where(A, B, layout)} has "
                             f"shape {list(out_shape)}")
        if D.dtype != out_dt:
            raise TypeError(f"generic_gemm: D is {D.dtype} but output_dtype is {out_dt}")
        d_buf = D

    pre_gelu = bias_grad = None
    op_bias = bias
    if gelu and not grad:
        aux_dt = hp16 if fp8_in else out_dt
        pre_gelu = pre_gelu_buf if pre_gelu_buf is not None else torch.empty(out_shape, dtype=aux_dt, device=dev)
    if gelu and grad and gelu_in is None:
        raise ValueError("generic_gemm: gelu=True with grad=True (DGELU) needs gelu_in, the saved pre-activation")
    if grad and bias is not None:
        op_bias = None
        if gelu:
            n = out_shape[-1]
        else:
            if not transB:
                raise ValueError(f"generic_gemm: the bias gradient without gelu is the wgrad case (layout NT, B = dY); "
                                 f"got layout {layout} with B {_describe(B)}")
            n = B.shape[-1] if len(B.shape) else 1
        bias_grad = bias_grad_buf if bias_grad_buf is not None else torch.empty(n, dtype=vec_dt, device=dev)
    if isinstance(workspace, torch.Tensor) and workspace.numel() == 0:
        workspace = None
    call(_GEMM, (a, a_sinv, a_code, ta, b, b_sinv, b_code, tb, d_buf, d_code, op_bias, bias_grad, pre_gelu,
                 gelu_in if (gelu and grad) else None, d_scale, d_amax, d_sinv, workspace, int(workspace_size or 0),
                 bool(gelu), bool(grad), bool(use_split_accumulator), float(alpha), float(beta), a_scaling, b_scaling,
                 None, *amaxes))

    if fp8_out:
        out = d_user if d_user is not None else Float8Tensor._from_op(
            torch.Size(out_shape), out_dt, d_buf, d_sinv, None, quantizer.dtype, quantizer)
        out._fp8_dtype = quantizer.dtype
        if quantizer.columnwise_usage:
            k = out_shape[-1]
            out._transpose = torch.ops.te.fp8_transpose.default(d_buf.reshape(-1, k)).reshape(
                _transposed_shape(out_shape))
            out._transpose_invalid = False
        if not quantizer.rowwise_usage and out._transpose is not None:
            out._data = None
    elif quantizer is not None:
        out = quantize(d_buf, quantizer, D if isinstance(D, QuantizedTensor) else None)
    elif isinstance(D, QuantizedTensor):
        raise TypeError("generic_gemm: a quantized D needs the quantizer that fills it")
    else:
        out = d_buf
    return out, bias_grad, pre_gelu


def generic_gemm(A, transA, B, transB, D, quantizer, output_dtype, bias, bias_type, gelu, gelu_in, grad, workspace,
                 workspace_size, accumulate, use_split_accumulator, comm_overlap=None, comm_type=None,
                 extra_output=None, bulk_overlap=False, alpha=1.0, beta=None):
    """TE's `generic_gemm` (SPEC §6.1-6.5): returns [D, bias_grad, pre_gelu_out, extra_output]."""
    if comm_overlap is not None or comm_type is not None or bulk_overlap:
        raise NotImplementedError("generic_gemm: comm+GEMM overlap is out of scope; pass comm_overlap=None, "
                                  "comm_type=None, bulk_overlap=False")
    out, bias_grad, pre_gelu = _gemm(A, transA, B, transB, D, quantizer, output_dtype, bias, bias_type, gelu,
                                     gelu_in, grad, workspace, workspace_size, accumulate, use_split_accumulator,
                                     alpha, beta)
    return [out, bias_grad, pre_gelu, extra_output]


def general_gemm(A, B, out_dtype=None, quantization_params=None, gelu=False, gelu_in=None, alpha=1.0, beta=None,
                 accumulate=False, layout="TN", out=None, bias=None, use_split_accumulator=False, grad=False, *,
                 quantizer=None):
    """TE-style convenience (SPEC §6.8): `layout` = transA + transB ("TN" fprop, "NN" dgrad, "NT" wgrad); returns
    (out, bias_grad, gelu_input, extra_output). The workspace is the cached one of the current device and stream."""
    if quantizer is not None and quantization_params is not None and quantizer is not quantization_params:
        raise ValueError("general_gemm: pass the output quantizer as `quantizer` or `quantization_params`, not both")
    q = quantizer if quantizer is not None else quantization_params
    if layout not in _LAYOUTS:
        raise ValueError(f"general_gemm: layout must be one of {', '.join(_LAYOUTS)}, got {layout!r}")
    bias_type = bias.dtype if bias is not None else torch.bfloat16
    d, bgrad, pre, extra = generic_gemm(A, layout[0] == "T", B, layout[1] == "T", out, q, out_dtype, bias, bias_type,
                                        gelu, gelu_in, grad, None, 0, accumulate, use_split_accumulator,
                                        alpha=alpha, beta=beta)
    return d, bgrad, pre, extra


def _item(lst, i):
    if lst is None or len(lst) == 0:
        return None
    t = lst[i] if i < len(lst) else None
    return t if t is not None and (not isinstance(t, torch.Tensor) or t.numel() > 0) else None


def te_general_grouped_gemm(A, transa, B, transb, D, D_type, m_splits, bias, bias_type, single_output, pre_gelu_out,
                            grad, workspace, workspaceSize, accumulate, use_split_accumulator, math_sm_count=0):
    """TE's list API (SPEC §6.9): GEMM i is generic_gemm(A[i], transa, B[i], transb, D[i], ...). A non-empty
    pre_gelu_out[i] turns on GELU (forward: written; grad: read as gelu_in); a non-empty bias[i] adds the bias
    (forward) or receives the bias gradient (grad). `single_output` writes into row slices of D[0] split by
    m_splits. Returns the bias list (with the gradients written in when grad)."""
    if len(A) != len(B):
        raise ValueError(f"te_general_grouped_gemm: got {len(A)} A operands and {len(B)} B operands")
    if D is None:
        raise ValueError("te_general_grouped_gemm: D must be a list of outputs (or [D] with single_output)")
    n = len(A)
    if single_output:
        if D is None or len(D) != 1 or m_splits is None or len(m_splits) != n:
            raise ValueError("te_general_grouped_gemm: single_output needs one D and m_splits with one entry per GEMM")
        if sum(m_splits) != _rows_cols(tuple(D[0].shape))[0]:
            raise ValueError(f"te_general_grouped_gemm: m_splits sum to {sum(m_splits)} but D[0] has "
                             f"{_rows_cols(tuple(D[0].shape))[0]} rows")
        d2 = D[0].reshape(-1, D[0].shape[-1])
        outs, off = [], 0
        for m in m_splits:
            outs.append(d2[off:off + m])
            off += m
    else:
        if len(D) != n:
            raise ValueError(f"te_general_grouped_gemm: got {len(D)} outputs for {n} GEMMs")
        outs = list(D)
    bias_out = list(bias) if bias is not None else [None] * n
    for i in range(n):
        b_i = _item(bias, i)
        g_i = _item(pre_gelu_out, i)
        ws = _item(workspace, i % len(workspace)) if workspace else None
        _, bgrad, _ = _gemm(A[i], transa, B[i], transb, outs[i], None, D_type, b_i, bias_type, g_i is not None,
                              g_i if grad else None, grad, ws, workspaceSize if ws is not None else 0, accumulate,
                              use_split_accumulator, 1.0, None, pre_gelu_buf=None if grad else g_i,
                              bias_grad_buf=b_i if (grad and b_i is not None) else None)
        if grad and bgrad is not None:
            bias_out[i] = bgrad
    return bias_out


def general_grouped_gemm(A, B, out, quantization_params, out_dtype, layout="TN", m_splits=None, gelu=False,
                         grad=False, accumulate=False, bias=None, use_bias=False, use_split_accumulator=False,
                         D_dtype=None, single_output=False):
    """Python list form (SPEC §6.9) over te_general_grouped_gemm: returns (out, bias or bias-gradient list,
    gelu inputs). `out` may be None (allocated here, one tensor per GEMM)."""
    if layout not in _LAYOUTS:
        raise ValueError(f"general_grouped_gemm: layout must be one of {', '.join(_LAYOUTS)}, got {layout!r}")
    if quantization_params is not None and any(q is not None for q in quantization_params):
        raise NotImplementedError("general_grouped_gemm: output quantizers are not supported yet; quantize the "
                                  "outputs afterwards")
    if gelu and grad:
        raise ValueError("general_grouped_gemm: gelu with grad needs the saved pre-activations; use "
                         "te_general_grouped_gemm with pre_gelu_out")
    n = len(A)
    transa, transb = layout[0] == "T", layout[1] == "T"
    dt = D_dtype if D_dtype is not None else out_dtype
    shapes = [_out_shape(A[i], transa, B[i], transb) for i in range(n)]
    hp = [to_torch_dtype(dt) if dt is not None else
          (torch.bfloat16 if isinstance(A[i], QuantizedTensor) and A[i].dtype not in FLOAT_DTYPES else A[i].dtype)
          for i in range(n)]
    devs = [B[i].device for i in range(n)]
    if out is None:
        if single_output:
            raise ValueError("general_grouped_gemm: single_output needs `out` = [D]")
        out = [torch.empty(shapes[i], dtype=hp[i], device=devs[i]) for i in range(n)]
    gelu_in = [torch.empty(shapes[i], dtype=hp[i], device=devs[i]) for i in range(n)] if gelu else None
    if use_bias and grad:
        bias = [torch.empty(B[i].shape[-1] if len(B[i].shape) else 1, dtype=hp[i], device=devs[i]) for i in range(n)]
    elif not use_bias:
        bias = None
    bias_type = bias[0].dtype if bias else torch.bfloat16
    bias = te_general_grouped_gemm(A, transa, B, transb, out, dt, m_splits, bias, bias_type, single_output, gelu_in,
                                   grad, None, 0, accumulate, use_split_accumulator, 0)
    return out, bias, gelu_in


_GROUPED = torch.ops.te.grouped_gemm.default
_FP8_TORCH = {torch.float8_e4m3fn: int(DType.kFloat8E4M3), torch.float8_e5m2: int(DType.kFloat8E5M2)}


def _grouped_operand(name, x, scale_inv):
    """(codes or values, scale_inv or None, DType code) of one grouped-GEMM operand given as a plain tensor, FP8 codes
    with their scale_inv, or a rowwise Float8Tensor (another quantized tensor: its bf16 values, emulated)."""
    if isinstance(x, Float8Tensor):
        if x._data is None:
            raise ValueError(f"grouped_gemm: {name} ({_describe(x)}) needs its rowwise copy; quantize it with "
                             f"rowwise=True")
        return x._data, x._scale_inv, int(x._fp8_dtype)
    if isinstance(x, QuantizedTensor):  # emulated (grouped_gemm's docstring): bf16 values of the quantized operand
        return x.dequantize(torch.bfloat16), None, int(DType.kBFloat16)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"grouped_gemm: {name} must be a torch.Tensor or a quantized tensor, got {type(x).__name__}")
    if x.dtype in _FP8_TORCH:
        if scale_inv is None:
            raise ValueError(f"grouped_gemm: FP8 {name} {list(x.shape)} {x.dtype} needs {name}_scale_inv")
        return x, scale_inv, _FP8_TORCH[x.dtype]
    if scale_inv is not None:
        raise ValueError(f"grouped_gemm: {name}_scale_inv is for FP8 operands, but {name} is {x.dtype}")
    return x, None, _PLAIN_CODES.get(x.dtype, -1)


def _emulated(t) -> bool:
    return isinstance(t, QuantizedTensor) and not isinstance(t, Float8Tensor)


def _native_block_pair(x, ws) -> bool:
    """FP8 block operands the grouped kernel takes natively: x with 1x128 blocks, every weight with 128x128 tiles,
    both with their rowwise copies (SPEC §6.6's 1-D x 2-D pairing, as DeepSeek-style MoE training quantizes)."""
    def block(t, two_d):
        return isinstance(t, Float8BlockwiseQTensor) and t._is_2D_scaled == two_d and t._rowwise_data is not None
    if len(ws) == 1 and isinstance(ws[0], QuantizedTensor) and ws[0].dim() == 3:  # one [G, N, K] tensor
        return block(x, False) and block(ws[0], True) and ws[0].shape[1] % 128 == 0
    return block(x, False) and len(ws) > 0 and all(block(wg, True) for wg in ws)


def _block_operands(x, ws):
    """(lhs codes [M, K], its 1x128 scale_inv, rhs codes [G, N, K], the per-group 128x128 scale_inv [G, ...], their
    DType codes) of a native FP8 block pair. ws: one [G, N, K] tensor with N a multiple of 128 (its tiles are the
    per-group ones: used as stored), or the per-group weights (stacked on each call)."""
    codes = {int(wg._fp8_dtype) for wg in ws}
    if len(codes) != 1:
        raise TypeError("grouped_gemm: the per-group weights must share one FP8 dtype")
    lhs = x._rowwise_data.reshape(_rows_cols(x.shape))
    if len(ws) == 1 and ws[0].dim() == 3:
        g, n, _ = ws[0].shape
        s = ws[0]._rowwise_scale_inv
        return lhs, x._rowwise_scale_inv, ws[0]._rowwise_data, s.reshape(g, n // 128, s.shape[-1]), \
            int(x._fp8_dtype), codes.pop()
    rhs = torch.stack([wg._rowwise_data for wg in ws])
    rhs_s = torch.stack([wg._rowwise_scale_inv for wg in ws])
    return lhs, x._rowwise_scale_inv, rhs, rhs_s, int(x._fp8_dtype), codes.pop()


def _grouped_weight_parts(w, w_scale_inv):
    """rhs codes/values [G, ...], its per-group scale_inv [G] or None, DType code. A list of per-group weights (or
    Float8Tensors, each with its own scale) is stacked."""
    if isinstance(w, (list, tuple)):
        parts = [_grouped_operand("w", wg, None) for wg in w]
        if not parts:
            raise ValueError("grouped_gemm: w is an empty list; give one weight per group")
        codes = {p[2] for p in parts}
        if len(codes) != 1:
            raise TypeError("grouped_gemm: the per-group weights must share one dtype")
        data = torch.stack([p[0] for p in parts])
        scales = torch.cat([p[1].reshape(1) for p in parts]) if parts[0][1] is not None else None
        return data, scales, parts[0][2]
    return _grouped_operand("w", w, w_scale_inv)


def grouped_gemm(x, w, group_sizes=None, *, offsets=None, w_layout="NK", x_scale_inv=None, w_scale_inv=None,
                 x_quantizer=None, w_quantizer=None, out_dtype=None, use_split_accumulator=True):
    """Grouped GEMM for mixture-of-experts with the group sizes on the device: no host sync, CUDA-graph safe.

    x [M_total, K] (rows grouped by expert, in order) · w[g] for each group g → out [M_total, N]. w is [G, N, K]
    (`w_layout="NK"`, the layout of Linear weights: out = x·w[g]ᵀ) or [G, K, N] ("KN"). Give the group sizes
    (`group_sizes`, int32/int64 [G]) or the cumulative row ends (`offsets`, [G], as torch._grouped_mm takes). Rows past
    the sizes' sum come out as zeros; negative sizes count as 0; sizes summing past M_total are cut there.

    FP8 (per-tensor scaling): x as a Float8Tensor, FP8 codes with `x_scale_inv` [1], or a plain tensor and
    `x_quantizer`; w as FP8 codes [G, N, K] with `w_scale_inv` [G], a list of G Float8Tensors, or a plain tensor and
    `w_quantizer` (each group quantized on its own). E5M2 x E5M2 is refused, and FP8 w must be "NK" (FP8 tensor
    cores are TN). FP8 block operands run natively when x has 1x128 blocks and w 128x128 tiles (block_scaling_dim 1
    and 2: the scales applied every 128-deep K step, always promoted) — w as G per-group tensors (stacked on each
    call), or one quantized [G, N, K] tensor with N a multiple of 128 (no copy); other pairings, MXFP8 and NVFP4 are
    emulated: both operands' dequantized bf16 values through the bf16 grouped GEMM. `use_split_accumulator=False`
    takes the tensor cores' faster, less precise FP8 per-tensor accumulation (SPEC §6.3). The output is x's dtype
    (bf16 for quantized x) unless `out_dtype` says otherwise."""
    if w_layout not in ("NK", "KN"):
        raise ValueError(f"grouped_gemm: w_layout must be 'NK' ([G, N, K]) or 'KN' ([G, K, N]), got {w_layout!r}")
    if (group_sizes is None) == (offsets is None):
        raise ValueError("grouped_gemm: give exactly one of group_sizes and offsets")
    if x_quantizer is not None:
        if x_scale_inv is not None or isinstance(x, QuantizedTensor):
            raise ValueError(f"grouped_gemm: x_quantizer quantizes a plain x; got {_describe(x)}"
                             f"{' with a scale_inv' if x_scale_inv is not None else ''}")
        x = quantize(x, x_quantizer)
    if w_quantizer is not None:
        if w_scale_inv is not None or not isinstance(w, torch.Tensor) or isinstance(w, QuantizedTensor):
            raise ValueError("grouped_gemm: w_quantizer quantizes a plain [G, ...] weight tensor")
        w = [quantize(w[g], w_quantizer) for g in range(w.shape[0])]
    ws = w if isinstance(w, (list, tuple)) else [w]
    sizes = _group_sizes(group_sizes, offsets)
    out_code = int(as_dtype(out_dtype if out_dtype is not None else torch.bfloat16, "grouped_gemm out_dtype"))
    if _native_block_pair(x, ws) and w_layout == "NK" and x_scale_inv is None and w_scale_inv is None:
        lhs, lhs_s, rhs, rhs_s, lhs_code, rhs_code = _block_operands(x, ws)
        return call(_GROUPED, (lhs, rhs, sizes, lhs_s, rhs_s, lhs_code, rhs_code, False, out_code,
                               bool(use_split_accumulator)))
    if _emulated(x) or any(_emulated(wg) for wg in ws):
        # MXFP8, NVFP4 and the other FP8 block pairings (no grouped tensor-core kernel for them): both operands'
        # values in bf16, then the bf16 grouped GEMM (SPEC §6.7's emulation).
        if x_scale_inv is not None or w_scale_inv is not None:
            raise ValueError("grouped_gemm: raw FP8 codes with a scale_inv cannot meet an emulated (MXFP8 / FP8 block "
                             "/ NVFP4) operand; pass quantized tensors")
        x = x.dequantize(torch.bfloat16) if isinstance(x, QuantizedTensor) else x.to(torch.bfloat16)
        ws = [wg.dequantize(torch.bfloat16) if isinstance(wg, QuantizedTensor) else wg.to(torch.bfloat16) for wg in ws]
        w = ws if isinstance(w, (list, tuple)) else ws[0]
    lhs, lhs_s, lhs_code = _grouped_operand("x", x, x_scale_inv)
    rhs, rhs_s, rhs_code = _grouped_weight_parts(w, w_scale_inv)
    if out_dtype is None:
        out_dtype = x.dtype if isinstance(x, torch.Tensor) and x.dtype in _PLAIN_CODES and not \
            isinstance(x, QuantizedTensor) else torch.bfloat16
    out_code = int(as_dtype(out_dtype, "grouped_gemm out_dtype"))
    return call(_GROUPED, (lhs, rhs, sizes, lhs_s, rhs_s, lhs_code, rhs_code, w_layout == "KN", out_code,
                           bool(use_split_accumulator)))


def _group_sizes(group_sizes, offsets):
    if (group_sizes is None) == (offsets is None):
        raise ValueError("grouped_gemm: give exactly one of group_sizes and offsets")
    sizes = group_sizes if offsets is None else torch.diff(offsets, prepend=offsets.new_zeros(1))
    if not isinstance(sizes, torch.Tensor) or sizes.dtype not in (torch.int32, torch.int64):
        what = type(sizes).__name__ if not isinstance(sizes, torch.Tensor) else sizes.dtype
        raise TypeError(f"grouped_gemm: {'group_sizes' if offsets is None else 'offsets'} must be an int32 or int64 "
                        f"tensor on x's device, got {what}")
    return sizes.to(torch.int32).contiguous()


def grouped_gemm_wgrad(dy, x, group_sizes=None, *, offsets=None, out_dtype=None):
    """The weight gradient of a grouped layer, with the group sizes on the device: dw[g] = dy[rows of g]ᵀ · x[rows of g]
    for dy [M_total, N] and x [M_total, K] (bf16 / fp16 / fp32, one dtype) → dw [G, N, K] (zeros for an empty group),
    the [G, N, K] layout `grouped_gemm` takes. Same size rules and arguments as `grouped_gemm`."""
    for name, t in (("dy", dy), ("x", x)):
        if not isinstance(t, torch.Tensor) or isinstance(t, QuantizedTensor) or t.dtype not in _PLAIN_CODES:
            raise TypeError(f"grouped_gemm_wgrad: {name} must be a bf16, fp16 or fp32 tensor, got {_describe(t)}")
    sizes = _group_sizes(group_sizes, offsets)
    out_code = int(as_dtype(out_dtype if out_dtype is not None else dy.dtype, "grouped_gemm_wgrad out_dtype"))
    return call(_GROUPED, (dy, x, sizes, None, None, _PLAIN_CODES[dy.dtype], _PLAIN_CODES[x.dtype], False, out_code,
                           True, True))


def get_cublasLt_version() -> int:
    """cuBLASLt version of the loaded library (0 in a CPU-only build)."""
    return _device.cublaslt_version()


def get_num_cublas_streams() -> int:
    """Streams the grouped GEMM may use; this implementation runs the group in order on the current stream."""
    return 1


__all__ = ["generic_gemm", "general_gemm", "te_general_grouped_gemm", "general_grouped_gemm", "grouped_gemm",
           "grouped_gemm_wgrad",
           "get_cublasLt_version", "get_num_cublas_streams"]
