// plan_act and the spec checks (plan.h): what a request means, whether it is allowed, and which buffers it needs.
// Check order and message text are those the torch tests match (tests/test_errors.py, tests/test_bad_inputs.py).
#include "plan.h"

#include <atomic>

#include "../formats/fp8_block/quantize_fp8_block.h"
#include "../producers/mxfp8/quantize_mxfp8.h"

#if defined(TE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace te {
namespace ops {

// ---- Message pieces ------------------------------------------------------------------------------------------------
std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (int i = 0; i < s.ndim; ++i) out += (i ? ", " : "") + std::to_string(s.dims[i]);
  return out + "]";
}

std::string dtype_name(DType d) {
  switch (d) {
    case DType::kByte: return "Byte";
    case DType::kInt16: return "Short";
    case DType::kInt32: return "Int";
    case DType::kInt64: return "Long";
    case DType::kFloat32: return "Float";
    case DType::kFloat16: return "Half";
    case DType::kBFloat16: return "BFloat16";
    case DType::kFloat8E4M3: return "Float8_e4m3fn";
    case DType::kFloat8E5M2: return "Float8_e5m2";
    case DType::kFloat8E8M0: return "Float8_e8m0fnu";
    case DType::kFloat4E2M1: return "Float4_e2m1fn_x2";
  }
  return "DType(" + std::to_string(int(d)) + ")";
}

std::string device_str(const ExecCtx& ctx) { return ctx.cuda ? "cuda:" + std::to_string(ctx.device_index) : "cpu"; }

void no_cuda(const char* op) {
  const std::string rule = "this build of the core has no CUDA kernels; CUDA buffers are not supported";
  fail(ErrorKind::kNotImplemented, op == nullptr ? rule : msg(std::string(op), ": ", rule));
}

std::string arch_name(const ExecCtx& ctx) {
  if (ctx.arch != nullptr) return ctx.arch;
#if defined(TE_WITH_CUDA)
  if (ctx.cuda) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx.device_index) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ctx.device_index) != cudaSuccess) {
      return device_str(ctx);
    }
    return "sm_" + std::to_string(major) + std::to_string(minor);
  }
#endif
  return device_str(ctx);
}

const char* piece_name(Piece p) {
  static const char* const kNames[kNumPieces] = {"row_data", "row_scale_inv", "col_data", "col_scale_inv",
                                                 "amax_row", "amax_col",      "grad_bias"};
  return p >= 0 && p < kNumPieces ? kNames[p] : "?";
}

namespace {

int64_t elem_bytes(DType d) {
  switch (d) {
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt16: return 2;
    case DType::kInt64: return 8;
    default: return 1;
  }
}

// Concatenates message pieces (error paths only).
template <typename... Ts> std::string cat(const Ts&... parts) {
  std::string s;
  (s += ... += parts);
  return s;
}

}  // namespace

int64_t PiecePlan::bytes() const { return capacity * elem_bytes(dtype); }

std::string op_name(const ActRequest& r) {
  const char* const table_name = act_name(r.kind);  // the activation table's (producers/act_functors.h)
  if (table_name == nullptr || r.kind == ActKind::kIdentity) return r.op;
  std::string name = table_name;
  if (r.backward) {
    name = r.kind == ActKind::kClampedSwiglu ? "clamped_dswiglu" : (r.with_dbias ? "dbias_d" : "d") + name;
  }
  return name + " (te::" + r.op + ")";
}

std::string grad_dtype_message(const ActRequest& r, const std::string& grad_dtype, const std::string& x_dtype) {
  return cat(op_name(r), ": grad dtype ", grad_dtype, " must match the forward input dtype ", x_dtype);
}

ActKind act_kind(const char* op, int64_t code) {
  if (!act_is_known(int(code)) || code == int64_t(ActKind::kIdentity)) {
    fail(ErrorKind::kValue, cat(std::string(op), ": activation code ", std::to_string(code),
                                " is not known; accepted: 0..", std::to_string(act_max_te_code()),
                                " (TE's activation enum)"));
  }
  return static_cast<ActKind>(code);
}

QuantSpec make_spec(const char* op, int64_t qkind, int64_t qdtype, bool rowwise, bool columnwise, int64_t qflags,
                    double amax_epsilon, int64_t block_dim, bool has_scale, bool has_amax) {
  QuantSpec s;
  if (qkind < 0 || qkind > 5) {
    fail(ErrorKind::kValue, cat(op, ": quantizer kind ", std::to_string(qkind),
                                " is not known; accepted: 0 none, 1 FP8 delayed, 2 FP8 current, 3 MXFP8, 4 NVFP4, 5 FP8 block"));
  }
  s.kind = static_cast<QuantKind>(qkind);
  s.dtype = static_cast<DType>(qdtype);
  s.rowwise = rowwise;
  s.columnwise = columnwise;
  s.flags = qflags;
  s.amax_epsilon = amax_epsilon;
  s.block_dim = block_dim;
  const bool fp8_codes = s.kind == QuantKind::kFp8Delayed || s.kind == QuantKind::kFp8Current ||
                         s.kind == QuantKind::kMxfp8 || s.kind == QuantKind::kFp8Block;
  const auto need_usage = [&] {
    if (!rowwise && !columnwise) fail(ErrorKind::kValue, cat(op, ": the quantizer has neither rowwise nor columnwise usage"));
  };
  if (fp8_codes) {
    if (s.dtype != DType::kFloat8E4M3 && s.dtype != DType::kFloat8E5M2) {
      fail(ErrorKind::kValue, cat(op, ": FP8 quantizer dtype must be kFloat8E4M3 (7) or kFloat8E5M2 (8), got ",
                                  std::to_string(qdtype)));
    }
    need_usage();
  }
  if (s.kind == QuantKind::kNvfp4) {
    if (s.dtype != DType::kFloat4E2M1) {
      fail(ErrorKind::kValue, cat(op, ": NVFP4 quantizer dtype must be kFloat4E2M1 (10), got ", std::to_string(qdtype)));
    }
    need_usage();
    if (s.two_d() && s.rht()) {
      fail(ErrorKind::kNotImplemented, cat(op, ": NVFP4 with both with_2d_quantization (16x16 tiles) and with_rht is "
                                               "not provided; use 2-D tiles for weights, RHT for inputs and gradients"));
    }
  }
  if (s.kind == QuantKind::kMxfp8 && s.two_d()) {
    fail(ErrorKind::kNotImplemented, cat(op, ": MXFP8 with_2d_quantization (32x32 tiles) is not provided; "
                                             "use 1x32 / 32x1 blocks (with_2d_quantization=False)"));
  }
  if (s.kind == QuantKind::kFp8Block) {
    if (block_dim != 1 && block_dim != 2) {
      fail(ErrorKind::kValue, cat(op, ": Float8BlockQuantizer block_scaling_dim (spec block_dim) must be 1 (1x128 "
                                     "blocks) or 2 (128x128 tiles), got ", std::to_string(block_dim)));
    }
    if (s.two_d() != (block_dim == 2)) {
      fail(ErrorKind::kValue, cat(op, ": quantizer spec flag bit1 (2-D blocks) = ", std::string(s.two_d() ? "1" : "0"),
                                  " disagrees with block_dim = ", std::to_string(block_dim)));
    }
    if (!(amax_epsilon >= 0.0 && amax_epsilon < 3.4028234663852886e38)) {
      fail(ErrorKind::kValue, cat(op, ": ", s.fp8_block_name(), " amax_epsilon must be finite and >= 0, got ",
                                  std::to_string(amax_epsilon)));
    }
    constexpr int64_t kUnsupported = (1 << 2) | (1 << 3) | (1 << 4) | (1 << 5);
    if ((qflags & kUnsupported) != 0) {
      fail(ErrorKind::kNotImplemented,
           cat(op, ": ", s.fp8_block_name(), " supports only the force_pow_2_scales and 2-D flags (qflags bits 0, 1), "
                  "got qflags=", std::to_string(qflags), " (stochastic rounding, RHT and swizzled scales are "
                  "NVFP4/MXFP8 features; FP8 block scales are already in the layout the GEMM reads)"));
    }
  }
  if (s.kind == QuantKind::kFp8Delayed && !(has_scale && has_amax)) {
    fail(ErrorKind::kValue, cat(op, ": a delayed-scaling FP8 quantizer needs scale and amax"));
  }
  return s;
}

FusionPath choose_fusion_path(const QuantSpec& spec) {
  switch (spec.kind) {
    case QuantKind::kNone:
    case QuantKind::kFp8Delayed:
    case QuantKind::kMxfp8: return FusionPath::kFullyFused;
    case QuantKind::kFp8Current: return FusionPath::kFusedActivationAmaxFp8;
    case QuantKind::kNvfp4: return spec.rht() ? FusionPath::kUnfused : FusionPath::kFusedActivationAmaxNvfp4;
    case QuantKind::kFp8Block: return FusionPath::kUnfused;
  }
  return FusionPath::kUnfused;
}

namespace {

// "quantized shape [..] (input [..] BFloat16 on sm_90)": NVFP4's messages' description of the request.
std::string nv_desc(const ActPlan& pl, const ExecCtx& ctx) {
  return cat(std::string("quantized shape "), shape_str(pl.out_shape), " (input ", shape_str(pl.req.x.shape), " ",
             dtype_name(pl.req.x.dtype), " on ", arch_name(ctx), ")");
}

void check_request(const ActRequest& r) {
  if (!r.backward) return;
  if (r.grad.dtype != r.x.dtype) {
    fail(ErrorKind::kType, grad_dtype_message(r, dtype_name(r.grad.dtype), dtype_name(r.x.dtype)));
  }
  Shape expect = r.x.shape;
  if (act_is_gated(r.kind) && expect.ndim > 0) expect.dims[expect.ndim - 1] /= 2;
  if (r.grad.shape != expect) {
    fail(ErrorKind::kValue, cat(op_name(r), ": grad has shape ", shape_str(r.grad.shape), " but the forward output for "
                                "input ", shape_str(r.x.shape), " has shape ", shape_str(expect),
                                "; pass the gradient of the forward output"));
  }
}

void plan_geometry(ActPlan& pl, const ExecCtx& ctx) {
  const ActRequest& r = pl.req;
  const Shape& xs = r.x.shape;
  const bool gated = act_is_gated(r.kind);
  if (gated && !(xs.ndim >= 1 && xs.back() >= 2 && xs.back() % 2 == 0)) {
    fail(ErrorKind::kValue, cat(op_name(r), ": gated activations split the last dim into two halves, so it must be even "
                                "and >= 2; got input ", shape_str(xs), " ", dtype_name(r.x.dtype), " on ",
                                device_str(ctx), ". Pass [..., 2H]: the activated half first, the linear half second"));
  }
  const int64_t k = xs.ndim == 0 ? 1 : xs.back();
  int64_t lead = 1;
  for (int i = 0; i + 1 < xs.ndim; ++i) lead *= xs.dims[i];
  pl.rows = lead;
  pl.cols = gated ? k / 2 : k;
  pl.out_cols = act_out_cols(r.kind, r.backward, pl.cols);
  pl.out_shape = xs;
  if (gated && !r.backward) pl.out_shape.dims[xs.ndim - 1] = pl.cols;
}

std::string mx_format_name(const QuantSpec& spec) { return spec.e4m3() ? "MXFP8 E4M3" : "MXFP8 E5M2"; }

// SPEC §4.5: MXFP8 needs a tensor of rank >= 1 whose (output) last dim is a multiple of 32.
void check_mxfp8_shape(const ActPlan& pl, const ExecCtx& ctx) {
  const ActRequest& r = pl.req;
  if (r.x.shape.ndim == 0) {
    fail(ErrorKind::kValue, cat(op_name(r), ": ", mx_format_name(pl.spec), " cannot quantize a 0-d tensor (input ",
                                dtype_name(r.x.dtype), " shape [] on ", arch_name(ctx), "): its blocks run along the "
                                "last dim; reshape to [1, 32] and pad, or use a per-tensor FP8 quantizer"));
  }
  if (pl.out_cols % kMxBlock != 0) {
    fail(ErrorKind::kValue, cat(op_name(r), ": ", mx_format_name(pl.spec), " quantizes blocks of 32 along the last "
                                "dim, so the last dim of the quantized tensor must be a multiple of 32; got quantized "
                                "shape ", shape_str(pl.out_shape), " (input ", shape_str(r.x.shape), " ",
                                dtype_name(r.x.dtype), " on ", arch_name(ctx), "). Pad the last dim to ",
                                std::to_string(roundup(pl.out_cols, kMxBlock)), " or use a per-tensor FP8 quantizer"));
  }
}

// SPEC §4.6: NVFP4 needs rank >= 1, a last dim that is a multiple of 16, a flat first dim that is a multiple of 16
// when the columnwise copy is requested, and a bf16 input for the Hadamard transform.
void check_nvfp4_request(const ActPlan& pl, const ExecCtx& ctx) {
  const ActRequest& r = pl.req;
  const QuantSpec& spec = pl.spec;
  if (r.x.shape.ndim == 0) {
    fail(ErrorKind::kValue, cat(op_name(r), ": NVFP4 cannot quantize a 0-d tensor (input ", dtype_name(r.x.dtype),
                                " shape [] on ", arch_name(ctx), "): its 1x16 blocks run along the last dim; reshape "
                                "to [1, 16] and pad, or use a per-tensor FP8 quantizer"));
  }
  if (pl.out_cols % kNvBlock != 0) {
    fail(ErrorKind::kValue, cat(op_name(r), ": NVFP4 quantizes 1x16 blocks along the last dim, so the last dim of the "
                                "quantized tensor must be a multiple of 16; got ", nv_desc(pl, ctx), ". Pad the last dim "
                                "to ", std::to_string(roundup(pl.out_cols, kNvBlock)),
                                " or use a per-tensor FP8 quantizer"));
  }
  if (spec.columnwise && pl.rows % kNvBlock != 0) {
    fail(ErrorKind::kValue, cat(op_name(r), ": NVFP4 columnwise usage quantizes 16x1 blocks down the rows, so the "
                                "flattened first dim must be a multiple of 16; got M=", std::to_string(pl.rows), " for ",
                                nv_desc(pl, ctx), ". Pad the rows to ", std::to_string(roundup(pl.rows, kNvBlock)),
                                " or request rowwise usage only"));
  }
  if (spec.rht() && r.x.dtype != DType::kBFloat16) {
    fail(ErrorKind::kType, cat(op_name(r), ": NVFP4 with the random Hadamard transform (with_rht=True) takes bfloat16 "
                               "input only; got ", dtype_name(r.x.dtype), " for ", nv_desc(pl, ctx),
                               ". Cast the input to bfloat16 or use with_rht=False"));
  }
}

void set_piece(ActPlan& pl, Piece p, DType dtype, const Shape& shape) {
  PiecePlan& piece = pl.pieces[p];
  piece.present = true;
  piece.dtype = dtype;
  piece.shape = shape;
  piece.capacity = shape.numel();
}

// The quantized pieces of each format (SPEC §4.5-4.9) and the scratch its path needs, appended to the workspace at
// 256-byte aligned offsets (what the allocators give, so vector loads of a temporary stay aligned).
struct WorkspaceLayout {
  int64_t bytes = 0;
  int64_t take(int64_t n) {
    const int64_t at = bytes;
    bytes += roundup(n, 256);
    return at;
  }
};

void plan_pieces(ActPlan& pl, PlanOptions opt, WorkspaceLayout& ws) {
  const QuantSpec& spec = pl.spec;
  const ActRequest& r = pl.req;
  const DType dt = r.x.dtype;
  const int64_t temp_bytes = pl.out_shape.numel() * elem_bytes(dt);
  switch (spec.kind) {
    case QuantKind::kNone: set_piece(pl, kRowData, dt, pl.out_shape); break;
    case QuantKind::kFp8Delayed:
    case QuantKind::kFp8Current: {
      if (spec.rowwise) set_piece(pl, kRowData, DType::kByte, pl.out_shape);
      if (spec.columnwise) set_piece(pl, kColData, DType::kByte, pl.out_shape.transposed());
      set_piece(pl, kRowScaleInv, DType::kFloat32, Shape::of(1));
      // Current scaling without a given amax takes it in a first pass, into a float only this call uses (with
      // per-block maxima in slots after it when a small rowwise cast runs as one cooperative CUDA launch).
      pl.amax_pass = spec.kind == QuantKind::kFp8Current && spec.amax == nullptr;
      if (!pl.amax_pass) break;
      const bool one_launch = (pl.cuda || opt.any_device) && !spec.columnwise && pl.rows * pl.out_cols <= kOneLaunchMaxElems;
      pl.amax_slots = one_launch ? kOneLaunchAmaxSlots : 0;
      if (opt.current_amax_out) {
        set_piece(pl, kAmaxRow, DType::kFloat32, Shape::of(1));
        if (pl.amax_slots > 0) pl.amax_offset = ws.take(4 * pl.amax_slots);
      } else if (opt.exact_outputs) {
        pl.amax_offset = ws.take(4 * (1 + pl.amax_slots));
      } else {
        pl.amax_in_scale_inv = true;
        pl.pieces[kRowScaleInv].capacity = 2 + pl.amax_slots;
      }
      break;
    }
    case QuantKind::kMxfp8: {
      const Mxfp8ScaleShapes ss = mxfp8_scale_shapes(pl.rows, pl.out_cols);
      if (spec.rowwise) {
        set_piece(pl, kRowData, DType::kByte, pl.out_shape);
        set_piece(pl, kRowScaleInv, DType::kByte, Shape::of(ss.row_r, ss.row_c));
      }
      if (spec.columnwise) {
        set_piece(pl, kColData, DType::kByte, pl.out_shape);
        set_piece(pl, kColScaleInv, DType::kByte, Shape::of(ss.col_r, ss.col_c));
      }
      break;
    }
    case QuantKind::kFp8Block: {
      const Fp8BlockScaleShapes ss = fp8_block_scale_shapes(pl.rows, pl.out_cols, spec.block_dim == 2);
      if (spec.rowwise) {
        set_piece(pl, kRowData, DType::kByte, pl.out_shape);
        set_piece(pl, kRowScaleInv, DType::kFloat32, Shape::of(ss.row_r, ss.row_c));
      }
      if (spec.columnwise) {
        set_piece(pl, kColData, DType::kByte, pl.out_shape.transposed());
        set_piece(pl, kColScaleInv, DType::kFloat32, Shape::of(ss.col_r, ss.col_c));
      }
      if (r.kind != ActKind::kIdentity || r.with_dbias) pl.temp_offset = ws.take(temp_bytes);
      break;
    }
    case QuantKind::kNvfp4: {
      const Nvfp4ScaleShapes ss = nvfp4_scale_shapes(pl.rows, pl.out_cols);
      if (spec.rowwise) {
        Shape packed = pl.out_shape;
        packed.dims[packed.ndim - 1] = pl.out_cols / 2;
        set_piece(pl, kRowData, DType::kByte, packed);
        set_piece(pl, kRowScaleInv, DType::kByte, Shape::of(ss.row_r, ss.row_c));
        set_piece(pl, kAmaxRow, DType::kFloat32, Shape::of(1));
      }
      if (spec.columnwise) {
        set_piece(pl, kColData, DType::kByte, Shape::of(pl.out_cols, pl.rows / 2));
        set_piece(pl, kColScaleInv, DType::kByte, Shape::of(ss.col_r, ss.col_c));
        set_piece(pl, kAmaxCol, DType::kFloat32, Shape::of(1));
      }
      // [rowwise, columnwise] global amaxes of this call (the fused path uses the first), then the UNFUSED path's
      // temporary; a temporary, not the tensor's amax fields, so that a noop launch leaves those untouched.
      pl.amax_offset = ws.take(2 * 4);
      const bool rht_col = spec.rht() && spec.columnwise;
      // dbias: in the pipelined tiles of both copies only (act_pipe_takes_dbias).
      const bool dbias_ok = !r.with_dbias || (spec.columnwise && act_pipe_takes_dbias(pl.rows, pl.cols));
      pl.nvfp4_fused_candidate = pl.cuda && !rht_col && !spec.two_d() && !spec.stochastic_rounding() && dbias_ok &&
                                 pl.cols % kNvBlock == 0;
      const bool identity = r.kind == ActKind::kIdentity && !r.backward;
      if (!identity || r.with_dbias) pl.temp_offset = ws.take(temp_bytes);
      break;
    }
  }
}

std::atomic<int64_t> g_plan_act_calls{0};

}  // namespace

int64_t plan_act_calls() { return g_plan_act_calls.load(std::memory_order_relaxed); }

ActPlan plan_act(const ActRequest& r, const QuantSpec& spec, const ExecCtx& ctx, PlanOptions opt) {
  g_plan_act_calls.fetch_add(1, std::memory_order_relaxed);
  ActPlan pl;
  pl.req = r;
  pl.spec = spec;
  pl.cuda = ctx.cuda;
  check_request(r);
  plan_geometry(pl, ctx);
  const bool mx = spec.kind == QuantKind::kMxfp8;
  if (mx) check_mxfp8_shape(pl, ctx);
  if (spec.kind == QuantKind::kNvfp4) check_nvfp4_request(pl, ctx);
  if (opt.amax_only) {
    pl.amax_only = true;
    set_piece(pl, kAmaxRow, DType::kFloat32, Shape::of(1));
    return pl;
  }
  WorkspaceLayout ws;
  if (r.with_dbias) {
    if (act_is_gated(r.kind)) fail(ErrorKind::kValue, op_name(r) + ": dbias is defined for unary activations only");
    pl.dbias_rows = mx ? mxfp8_dbias_blocks(pl.rows) : act_dbias_blocks(pl.rows, pl.cols);
    pl.dbias_offset = ws.take(4 * pl.dbias_rows * pl.out_cols);
    set_piece(pl, kGradBias, opt.dbias_fp32 ? DType::kFloat32 : r.x.dtype, Shape::of(pl.out_cols));
  }
  if (int(spec.kind) < 0 || int(spec.kind) > 5) {
    fail(ErrorKind::kNotImplemented, cat(op_name(r), ": quantizer kind ", std::to_string(int(spec.kind)),
                                         " is not known; accepted: 0 none, 1 FP8 delayed, 2 FP8 current, 3 MXFP8, "
                                         "4 NVFP4, 5 FP8 block"));
  }
  pl.path = choose_fusion_path(spec);
  pl.spec.rowwise = pl.spec.rowwise && opt.write_rowwise;
  pl.spec.columnwise = pl.spec.columnwise && opt.write_columnwise;
  plan_pieces(pl, opt, ws);
  pl.workspace_bytes = ws.bytes;
  return pl;
}

}  // namespace ops
}  // namespace te
