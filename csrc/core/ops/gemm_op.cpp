// plan_gemm and run_gemm (gemm_op.h). Check order and message text are those the torch tests match
// (tests/torch/test_gemm.py, test_bad_inputs.py); the JAX frontend raises the same messages at trace time.
#include "gemm_op.h"

#include <utility>

#include "../formats/mxfp8/mxfp8.h"
#include "../formats/nvfp4/quantize_nvfp4.h"
#include "../formats/table.h"
#include "../gemm/gemm_epilogue.h"

#if defined(TE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace te {
namespace ops {
namespace {

bool is_fp8(DType d) { return d == DType::kFloat8E4M3 || d == DType::kFloat8E5M2; }
bool is_plain(DType d) { return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16; }
bool is_fp8_block(GemmScaling s) { return s == GemmScaling::kFp8Block1d || s == GemmScaling::kFp8Block2d; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t roundup(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Flattened [rows, cols] of a shape (SPEC conventions: last dim = cols; 0-d = 1x1).
std::pair<int64_t, int64_t> rows_cols(const Shape& s) {
  if (s.ndim == 0) return {1, 1};
  int64_t r = 1;
  for (int i = 0; i + 1 < s.ndim; ++i) r *= s.dims[i];
  return {r, s.back()};
}

std::string layout_str(bool ta, bool tb) { return std::string(ta ? "T" : "N") + (tb ? "T" : "N"); }

DType dtype_code(const char* op, int64_t code, const char* what) {
  if (code < 0 || code > 10) fail(ErrorKind::kValue, msg(op, ": ", what, " DType code ", str(code), " is not known"));
  return static_cast<DType>(code);
}

void check_scalar_f32(const char* op, const std::string& what, const GemmBuffer& b) {
  if (b.v.dtype != DType::kFloat32 || b.v.shape.numel() != 1) {
    fail(ErrorKind::kValue, msg(op, ": ", what, " must be a one-element float32 tensor, got ", dtype_name(b.v.dtype),
                                " with shape ", shape_str(b.v.shape)));
  }
}

// The scale tensor a block-scaled operand stored as [rows, cols] carries (SPEC §4.8, the format table's rule),
// `k_cols` when the contraction runs along cols: the rowwise form, or for MXFP8 with K along rows the columnwise
// form (its columnwise copy is not transposed). FP8 block and NVFP4 operands are stored with K along cols.
static_assert(int(GemmScaling::kMxfp8) == int(Format::kMxfp8) && int(GemmScaling::kNvfp4) == int(Format::kNvfp4) &&
                  int(GemmScaling::kFp8Block1d) == int(Format::kFp8Block1d) &&
                  int(GemmScaling::kFp8Block2d) == int(Format::kFp8Block2d),
              "a GEMM scaling code is its operand's format id");
Shape block_scale_shape(GemmScaling s, int64_t rows, int64_t cols, bool k_cols) {
  const CopyShapes t = format_scale_shapes(static_cast<Format>(int(s)), rows, cols);
  const Dims2 d = s == GemmScaling::kMxfp8 && !k_cols ? t.col : t.row;
  return Shape::of(d.r, d.c);
}

// Checks an operand against its declared DType code and scaling and returns the launcher's operand (no pointers).
GemmOperand make_operand(const char* op, const char* name, const GemmOperandRequest& o, const ExecCtx& ctx) {
  const DType d = dtype_code(op, o.dtype_code, name);
  const DType storage = o.data.v.dtype;
  GemmOperand g;
  g.dtype = d;
  g.trans = o.trans;
  std::tie(g.rows, g.cols) = rows_cols(o.data.v.shape);
  const bool fp4 = d == DType::kFloat4E2M1;
  if (is_fp8(d) || fp4) {
    if (storage != DType::kByte && (fp4 || storage != d)) {
      fail(ErrorKind::kType, msg(op, ": ", fp4 ? "FP4" : "FP8", " operand ", name, " must hold uint8 codes, got ",
                                 dtype_name(storage)));
    }
    if (!o.scale_inv.present) fail(ErrorKind::kValue, msg(op, ": quantized operand ", name, " needs its scale_inv"));
    const int64_t sc = o.scaling;
    if (fp4 ? sc != 3 : !((sc >= 0 && sc <= 2) || sc == 4 || sc == 5)) {
      fail(ErrorKind::kValue,
           msg(op, ": ", name, "_scaling must be ",
               fp4 ? "3 (NVFP4) for E2M1 codes"
                   : "1 (per-tensor), 2 (MXFP8), 4 (FP8 block 1x128) or 5 (FP8 block 128x128) for FP8 codes",
               ", got ", str(sc)));
    }
    g.scaling = sc == 0 ? GemmScaling::kFp8PerTensor : static_cast<GemmScaling>(sc);
    if (fp4) g.cols *= 2;  // two E2M1 codes per byte
    const GemmBuffer& s = o.scale_inv;
    if (g.scaling == GemmScaling::kFp8PerTensor) {
      check_scalar_f32(op, std::string(name) + " scale_inv", s);
    } else {
      const bool k_cols = (name[0] == 'A') == o.trans;
      const Shape want = block_scale_shape(g.scaling, g.rows, g.cols, k_cols);
      const DType st = is_fp8_block(g.scaling) ? DType::kFloat32 : DType::kByte;
      if (!s.contiguous || s.v.dtype != st || s.v.shape != want) {
        const std::string dev = device_str(ctx);
        fail(ErrorKind::kValue, msg(op, ": ", name, " (", gemm_scaling_name(g.scaling), ", stored [", str(g.rows),
                                    ", ", str(g.cols), "]) needs a contiguous ", dtype_name(st), " scale tensor ",
                                    shape_str(want), " on ", dev, ", got ", dtype_name(s.v.dtype), " ",
                                    shape_str(s.v.shape), " on ", dev));
      }
    }
  } else {
    if (o.scaling != 0) {
      fail(ErrorKind::kValue, msg(op, ": ", name, "_scaling=", str(o.scaling), " is for quantized operands, but ", name,
                                  " is ", dtype_short_name(d)));
    }
    if (!is_plain(d)) {
      fail(ErrorKind::kType, msg(op, ": operand ", name, " must be fp32, fp16, bf16, FP8 (E4M3/E5M2) or E2M1, got DType ",
                                 str(o.dtype_code)));
    }
    if (storage != d) {
      fail(ErrorKind::kType, msg(op, ": operand ", name, " is ", dtype_name(storage), " but its DType code says ",
                                 dtype_short_name(d)));
    }
  }
  return g;
}

// The checks of one call, with the operand description every message carries.
struct Checker {
  const char* op;
  const ExecCtx& ctx;
  std::string operands;  // "A [32, 24] E4M3, B [32, 24] E4M3, layout TN, sm_90"

  void out(const char* what, const GemmBuffer& b, int64_t numel, int64_t last, DType st) const {
    const Shape& s = b.v.shape;
    if (!b.present) fail(ErrorKind::kValue, msg(op, ": ", what, " is required"));
    if (!b.contiguous || s.numel() != numel || (numel != 0 && s.ndim != 0 && s.back() != last)) {
      fail(ErrorKind::kValue, msg(op, ": ", what, " must be a contiguous tensor of ", str(numel),
                                  " elements with last dim ", str(last), ", got ", shape_str(s),
                                  b.contiguous ? "" : " (non-contiguous)"));
    }
    if (b.v.dtype != st) {
      fail(ErrorKind::kType, msg(op, ": ", what, " must be ", dtype_name(st), ", got ", dtype_name(b.v.dtype)));
    }
  }

  // A bias or bias gradient: 1-D of `len`, the output's dtype (bf16/fp16 when the output is FP8). Returns its dtype.
  DType vec(const char* what, const GemmBuffer& b, int64_t len, bool fp8_out, DType hp_out) const {
    const Shape& s = b.v.shape;
    const std::string dev = device_str(ctx);
    if (!b.contiguous || s.ndim != 1 || s.dims[0] != len) {
      fail(ErrorKind::kValue, msg(op, ": ", what, " must be a contiguous 1-D tensor of length ", str(len), " on ", dev,
                                  ", got ", shape_str(s), b.contiguous ? "" : " (non-contiguous)", " on ", dev, " (",
                                  operands, ")"));
    }
    const DType st = b.v.dtype;
    if (fp8_out ? (st != DType::kBFloat16 && st != DType::kFloat16) : st != hp_out) {
      fail(ErrorKind::kType, msg(op, ": ", what, " must be ",
                                 fp8_out ? std::string("bf16 or fp16 (the output is FP8)")
                                         : dtype_name(hp_out) + " (the output dtype)",
                                 ", got ", dtype_name(st)));
    }
    return st;
  }
};

// The SPEC §6.3/§6.5/§6.6 rules of scaled (quantized) operands.
void check_scaled(const Checker& c, const GemmRequest& r, const GemmArgs& g, const GemmDims& dm) {
  const char* op = c.op;
  const std::string& operands = c.operands;
  const char* fmt = gemm_scaling_name(g.a.scaling);
  if (g.a.dtype == DType::kFloat8E5M2 && g.b.dtype == DType::kFloat8E5M2) {
    fail(ErrorKind::kValue, msg(op, ": E5M2 x E5M2 has no FP8 GEMM kernel (", operands,
                                "). Quantize one operand (usually the weight or activation) as E4M3"));
  }
  const bool fam_a = is_fp8_block(g.a.scaling), fam_b = is_fp8_block(g.b.scaling);
  if (fam_a ? !fam_b : g.a.scaling != g.b.scaling) {
    fail(ErrorKind::kValue, msg(op, ": A is ", fmt, " and B is ", gemm_scaling_name(g.b.scaling), " (", operands,
                                "); quantize both operands with one recipe (FP8 block 1-D and 2-D may be mixed)"));
  }
  if (g.a.scaling == GemmScaling::kFp8Block2d && g.b.scaling == GemmScaling::kFp8Block2d) {
    fail(ErrorKind::kValue, msg(op, ": FP8 block 128x128 x 128x128 has no kernel (", operands,
                                "); quantize one operand with block_scaling_dim=1"));
  }
  const bool mx_or_nv = g.a.scaling == GemmScaling::kMxfp8 || g.a.scaling == GemmScaling::kNvfp4;
  const int64_t k_mult = mx_or_nv ? 32 : 16;
  if (dm.k % k_mult != 0) {
    fail(ErrorKind::kValue, msg(op, ": ", fmt, " GEMM needs the contraction dim K to be a multiple of ", str(k_mult),
                                ", got K=", str(dm.k), " (", operands, "). Pad K to ", str(roundup(dm.k, k_mult)),
                                " or keep this layer in bf16"));
  }
  if (dm.m % 16 != 0) {
    fail(ErrorKind::kValue, msg(op, ": ", fmt, " GEMM needs the output's last dim N to be a multiple of 16, got N=",
                                str(dm.m), " (", operands, "). Pad it to ", str(roundup(dm.m, 16)),
                                " or keep this layer in bf16"));
  }
  if (g.a.scaling != GemmScaling::kMxfp8 && !(g.a.trans && !g.b.trans)) {
    fail(ErrorKind::kValue, msg(op, ": ", fmt, " operands run as TN (", operands,
                                "); pass the copies whose scaling runs along K with transA=True and transB=False "
                                "(general_gemm picks the copies)"));
  }
  const DType out = dtype_code(op, r.d_dtype, "D");
  if (g.a.scaling == GemmScaling::kNvfp4 && out != DType::kFloat32 && out != DType::kBFloat16) {
    fail(ErrorKind::kValue, msg(op, ": NVFP4 GEMMs write bf16 or fp32, got ", dtype_short_name(out), " (", operands, ")"));
  }
  if (g.a.scaling == GemmScaling::kNvfp4) {
    if (!r.a_amax.present || !r.b_amax.present) {
      fail(ErrorKind::kValue, msg(op, ": NVFP4 operands need both copies' global amaxes (a_amax and b_amax, float32 "
                                      "[1]) for their global decode scales (", operands, ")"));
    }
    check_scalar_f32(op, "A's global amax", r.a_amax);
    check_scalar_f32(op, "B's global amax", r.b_amax);
    if (r.alpha_beta.present) {
      fail(ErrorKind::kValue, msg(op, ": NVFP4 GEMMs fold the global decode scales into alpha themselves; pass alpha "
                                      "and beta as numbers, not alpha_beta (", operands, ")"));
    }
  }
}

bool uses_bias(GemmEpilogue e) { return e == GemmEpilogue::kBias || e == GemmEpilogue::kGeluAuxBias; }
bool uses_bias_grad(GemmEpilogue e) { return e == GemmEpilogue::kDGeluBGrad || e == GemmEpilogue::kBGradB; }
bool gelu_fwd(GemmEpilogue e) { return e == GemmEpilogue::kGeluAux || e == GemmEpilogue::kGeluAuxBias; }
bool gelu_bwd(GemmEpilogue e) { return e == GemmEpilogue::kDGelu || e == GemmEpilogue::kDGeluBGrad; }

// The SPEC §6.2 epilogue of a request: which one, and its buffers checked (or planned).
void plan_epilogue(const Checker& c, const GemmRequest& r, const GemmPlanOptions& opt, GemmPlan& pl) {
  const char* op = c.op;
  GemmArgs& g = pl.args;
  const GemmDims& dm = pl.dims;
  const bool fp8_out = pl.fp8_out;
  const DType hp_out = fp8_out ? DType::kBFloat16 : g.d_dtype;
  const bool want_bias_grad = opt.plan_outputs ? r.want_bias_grad : r.bias_grad.present;
  // A planned bias gradient takes the output's dtype (the bias's, or bf16, when the output is FP8).
  const DType planned_vec = fp8_out ? (r.bias.present ? r.bias.v.dtype : DType::kBFloat16) : hp_out;
  const auto bias_grad = [&](int64_t len) {
    pl.has_bias_grad = true;
    pl.bias_grad_len = len;
    pl.bias_grad_dtype = opt.plan_outputs ? planned_vec : c.vec("bias_grad", r.bias_grad, len, fp8_out, hp_out);
    g.bias_dtype = pl.bias_grad_dtype;
  };
  const auto aux_dtype_ok = [](DType d) { return is_plain(d); };
  if (r.gelu && !r.grad) {
    if (!opt.plan_outputs && !r.pre_gelu_out.present) {
      fail(ErrorKind::kValue, msg(op, ": gelu=True needs the pre_gelu_out buffer"));
    }
    if (r.bias.present) g.bias_dtype = c.vec("bias", r.bias, dm.m, fp8_out, hp_out);
    DType st;
    if (opt.plan_outputs) {
      st = r.aux_dtype >= 0 ? dtype_code(op, r.aux_dtype, "pre_gelu_out") : (fp8_out ? planned_vec : g.d_dtype);
    } else {
      st = r.pre_gelu_out.v.dtype;
    }
    if (!aux_dtype_ok(st)) {
      fail(ErrorKind::kType, msg(op, ": pre_gelu_out must be fp32, fp16 or bf16 (never FP8), got ", dtype_name(st)));
    }
    if (!opt.plan_outputs) c.out("pre_gelu_out", r.pre_gelu_out, dm.n * dm.m, dm.m, st);
    pl.has_pre_gelu = true;
    pl.pre_gelu_dtype = st;
    g.aux_dtype = st;
    g.epilogue = r.bias.present ? GemmEpilogue::kGeluAuxBias : GemmEpilogue::kGeluAux;
  } else if (r.gelu && r.grad) {
    if (!r.gelu_in.present) {
      fail(ErrorKind::kValue, msg(op, ": gelu=True with grad=True (DGELU) needs gelu_in, the saved pre-activation of "
                                      "D's shape"));
    }
    const DType st = r.gelu_in.v.dtype;
    if (!aux_dtype_ok(st)) fail(ErrorKind::kType, msg(op, ": gelu_in must be fp32, fp16 or bf16, got ", dtype_name(st)));
    c.out("gelu_in", r.gelu_in, dm.n * dm.m, dm.m, st);
    g.aux_dtype = st;
    g.epilogue = GemmEpilogue::kDGelu;
    if (want_bias_grad) {
      bias_grad(dm.m);
      g.epilogue = GemmEpilogue::kDGeluBGrad;
    }
  } else if (r.grad && want_bias_grad) {
    // Decoded MXFP8 B holds its values; decoded NVFP4 B lacks the global factor (it is in alpha).
    if (c.ctx.cuda && (g.b.scaling == GemmScaling::kNvfp4 || (g.b.scaling == GemmScaling::kMxfp8 && !pl.decode_block))) {
      fail(ErrorKind::kNotImplemented, msg(op, ": not yet supported: the bias gradient of a ",
                                           gemm_scaling_name(g.b.scaling), " B operand (", c.operands,
                                           "); take it from the high-precision dY"));
    }
    bias_grad(dm.n);
    g.epilogue = GemmEpilogue::kBGradB;
  } else if (!r.grad && r.bias.present) {
    g.bias_dtype = c.vec("bias", r.bias, dm.m, fp8_out, hp_out);
    g.epilogue = GemmEpilogue::kBias;
  }
  // FP8 output carries its 16-bit "bias type" for C and the aux buffer even without a bias.
  if (fp8_out && !uses_bias(g.epilogue) && !uses_bias_grad(g.epilogue) && g.epilogue != GemmEpilogue::kNone) {
    g.bias_dtype = g.aux_dtype;
  }
}

}  // namespace

int64_t gemm_decode_bytes(int64_t rows, int64_t cols) {
  return roundup(rows * cols * int64_t(sizeof(uint16_t)), kWorkspaceAlign);
}

bool gemm_block_native(const ExecCtx& ctx) {
#if defined(TE_WITH_CUDA)
  if (!ctx.cuda) return false;
  int dev = ctx.device_index, major = 0;
  if (dev < 0 && cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  return major >= 10 && cublaslt_version() >= 120800;
#else
  (void)ctx;
  return false;
#endif
}

std::string gemm_operand_desc(const char* name, const Shape& s, DType d) {
  return std::string(name) + " " + shape_str(s) + " " + dtype_short_name(d);
}

GemmPlan plan_gemm(const GemmRequest& r, const ExecCtx& ctx, GemmPlanOptions opt) {
  const char* op = r.op;
  GemmPlan pl;
  pl.req = r;
  pl.cuda = ctx.cuda;
  GemmArgs& g = pl.args;
  g.a = make_operand(op, "A", r.a, ctx);
  g.b = make_operand(op, "B", r.b, ctx);
  Checker c{op, ctx, gemm_operand_desc("A", r.a.data.v.shape, g.a.dtype) + ", " +
                         gemm_operand_desc("B", r.b.data.v.shape, g.b.dtype) + ", layout " +
                         layout_str(g.a.trans, g.b.trans) + ", " + arch_name(ctx)};
  const bool fp8_a = is_fp8(g.a.dtype), fp8_b = is_fp8(g.b.dtype);
  if (fp8_a != fp8_b || (!fp8_a && g.a.dtype != g.b.dtype)) {
    fail(ErrorKind::kType, msg(op, ": A and B must both be FP8 or both the same plain dtype (mixed operands are not "
                                   "supported), got ", c.operands, ". Quantize both operands or neither"));
  }
  const GemmDims dm = gemm_dims(g);
  pl.dims = dm;
  const int64_t b_inner = g.b.trans ? g.b.rows : g.b.cols;
  if (dm.k != b_inner) {
    fail(ErrorKind::kValue, msg(op, ": inner dims do not agree: op(A) contracts over ", str(dm.k), " and op(B) over ",
                                str(b_inner), " (", c.operands,
                                "; D = op(B)·op(A) needs (transA ? A1 : A0) == (transB ? B0 : B1))"));
  }
  if (g.a.scaling != GemmScaling::kNone) check_scaled(c, r, g, dm);
  const bool mx_or_nv = g.a.scaling == GemmScaling::kMxfp8 || g.a.scaling == GemmScaling::kNvfp4;
  pl.decode_block = mx_or_nv && ctx.cuda && !gemm_block_native(ctx);

  // Output.
  g.d_dtype = dtype_code(op, r.d_dtype, "D");
  if (g.d_dtype == DType::kFloat4E2M1) {
    fail(ErrorKind::kValue, msg(op, ": FP4 output is not supported (", c.operands,
                                "); request bf16/fp32 output and quantize it to NVFP4 afterwards"));
  }
  pl.fp8_out = is_fp8(g.d_dtype);
  if (!pl.fp8_out && !is_plain(g.d_dtype)) {
    fail(ErrorKind::kValue, msg(op, ": output DType code ", str(r.d_dtype),
                                " is not supported; accepted: fp32 (4), fp16 (5), bf16 (6), or FP8 (7, 8) with FP8 "
                                "operands"));
  }
  pl.d_shape = Shape::of(dm.n, dm.m);
  pl.d_storage = pl.fp8_out ? DType::kByte : g.d_dtype;
  if (!opt.plan_outputs) c.out("D", r.d, dm.n * dm.m, dm.m, pl.d_storage);
  if (pl.fp8_out) {
    if (g.a.scaling != GemmScaling::kFp8PerTensor) {
      fail(ErrorKind::kValue, msg(op, ": FP8 output needs per-tensor FP8 operands (", c.operands,
                                  "); block-scaled GEMMs write bf16/fp32, then quantize"));
    }
    if (r.beta != 0.0) {
      fail(ErrorKind::kValue, msg(op, ": accumulating into an FP8 output is not supported (", c.operands, ")"));
    }
    if (!r.d_scale.present || !r.d_amax.present || !r.d_scale_inv.present) {
      fail(ErrorKind::kValue, msg(op, ": FP8 output needs the quantizer's scale and amax and the output's scale_inv"));
    }
    check_scalar_f32(op, "output quantizer scale", r.d_scale);
    check_scalar_f32(op, "output quantizer amax", r.d_amax);
    check_scalar_f32(op, "output scale_inv", r.d_scale_inv);
  }
  g.alpha = float(r.alpha);
  g.beta = float(r.beta);
  if (r.alpha_beta.present) {
    const GemmBuffer& ab = r.alpha_beta;
    if (!ctx.cuda || ab.v.dtype != DType::kFloat32 || !ab.contiguous || ab.v.shape != Shape::of(2)) {
      fail(ErrorKind::kValue, msg(op, ": alpha_beta must be a contiguous float32 [2] tensor (alpha, beta) on the "
                                      "operands' CUDA device, got ", dtype_name(ab.v.dtype), " ",
                                  shape_str(ab.v.shape), " on ", device_str(ctx)));
    }
  }
  g.fast_accum = fp8_a && !r.use_split_accumulator;
  if (g.a.dtype == DType::kFloat32) g.allow_tf32 = r.allow_tf32;
  if (r.sm_count < 0) fail(ErrorKind::kValue, msg(op, ": sm_count must be >= 0 (0: every SM), got ", str(r.sm_count)));
  g.sm_count = ctx.cuda ? r.sm_count : 0;

  plan_epilogue(c, r, opt, pl);

  // Workspace: FP8 D's amax temporary, the unfused epilogue's scratch, cuBLASLt's workspace (CUDA only: the CPU
  // kernel needs none).
  int64_t off = 0;
  if (ctx.cuda && pl.fp8_out) {
    pl.amax_offset = off;
    off += kWorkspaceAlign;
  }
  const bool may_fall_back =
      ctx.cuda && dm.n * dm.m > 0 && (g.epilogue != GemmEpilogue::kNone || pl.fp8_out || dm.k == 0);
  if (may_fall_back) pl.fallback_bytes = kWorkspaceAlign + roundup(dm.n * dm.m * int64_t(sizeof(float)), kWorkspaceAlign);
  if (opt.reserve_fallback && pl.fallback_bytes > 0) {
    pl.fallback_offset = off;
    off += pl.fallback_bytes;
  }
  if (ctx.cuda && g.a.scaling == GemmScaling::kNvfp4) {
    pl.alpha_offset = off;
    off += kWorkspaceAlign;
  }
  if (pl.decode_block) {
    pl.a_decode_offset = off;
    off += gemm_decode_bytes(g.a.rows, g.a.cols);
    pl.b_decode_offset = off;
    off += gemm_decode_bytes(g.b.rows, g.b.cols);
  }
  if (opt.reserve_lt_workspace && ctx.cuda) {
    pl.lt_offset = off;
    off += kLtWorkspaceBytes;
  }
  pl.workspace_bytes = off > 0 ? off + kWorkspaceAlign : 0;
  return pl;
}

namespace {

// The launcher's arguments of a plan with the call's pointers.
GemmArgs args_of(const GemmPlan& pl, const GemmIO& io) {
  GemmArgs g = pl.args;
  g.a.data = io.a;
  g.a.scale_inv = io.a_scale_inv;
  g.b.data = io.b;
  g.b.scale_inv = io.b_scale_inv;
  g.d = io.d;
  g.d_scale = io.d_scale;
  if (uses_bias(g.epilogue)) g.bias = io.bias;
  if (uses_bias_grad(g.epilogue)) g.bias_grad = io.bias_grad;
  if (gelu_fwd(g.epilogue)) g.aux = io.pre_gelu_out;
  if (gelu_bwd(g.epilogue)) g.aux = const_cast<void*>(io.gelu_in);  // read only
  if (pl.req.alpha_beta.present) g.alpha_beta = io.alpha_beta;
  return g;
}

void run_cpu(const GemmPlan& pl, GemmArgs g, const GemmIO& io, const ExecCtx& ctx) {
  if (g.a.scaling == GemmScaling::kNvfp4) g.alpha = nvfp4_gemm_alpha(*io.a_amax, *io.b_amax, pl.req.alpha);
  float amax = 0.0f;  // FP8 D: the fresh amax, max-merged into the quantizer's below (SPEC §6.3)
  if (pl.fp8_out) g.d_amax = &amax;
  gemm_cpu(g, *ctx.parallel_for);
  if (pl.fp8_out) {
    const float a = *io.d_amax;
    *io.d_amax = (is_nan(a) || is_nan(amax)) ? a + amax : (amax > a ? amax : a);  // torch.maximum: NaN propagates
    *io.d_scale_inv = 1.0f / *io.d_scale;
  }
}

#if defined(TE_WITH_CUDA)
void check_cuda(cudaError_t e, const char* op, const char* what) {
  if (e != cudaSuccess) fail(ErrorKind::kRuntime, msg(op, ": ", what, " failed: ", cudaGetErrorString(e)));
}

// SPEC §6.2 fallback: the plain GEMM into the FP32 accumulator (zeros when k = 0), then the epilogue kernels with the
// CPU kernel's math (FP32, one rounding to the output).
void run_unfused(const GemmPlan& pl, const GemmArgs& g, const GemmIO& io, char* ws, cudaStream_t s) {
  const char* op = pl.req.op;
  const GemmDims& dm = pl.dims;
  void* scratch = nullptr;
  if (pl.fallback_offset >= 0) {
    scratch = ws + pl.fallback_offset;
  } else if (io.alloc != nullptr) {
    scratch = io.alloc(io.alloc_ctx, pl.fallback_bytes);
  }
  if (scratch == nullptr) {
    fail(ErrorKind::kRuntime, msg(op, ": the unfused epilogue needs ", str(pl.fallback_bytes), " bytes of scratch, "
                                      "but the plan reserved none and the frontend gave no allocator"));
  }
  float* scalars = static_cast<float*>(scratch);  // [alpha, 0] for device pointer mode
  float* acc = reinterpret_cast<float*>(static_cast<char*>(scratch) + kWorkspaceAlign);  // [n, m]
  if (dm.k > 0) {
    GemmArgs p = g;
    p.d = acc;
    p.d_dtype = DType::kFloat32;
    p.d_scale = nullptr;
    p.d_amax = nullptr;
    p.beta = 0.0f;
    if (g.alpha_beta != nullptr) {
      check_cuda(cudaMemcpyAsync(scalars, g.alpha_beta, sizeof(float), cudaMemcpyDeviceToDevice, s), op,
                 "copying alpha");
      check_cuda(cudaMemsetAsync(scalars + 1, 0, sizeof(float), s), op, "zeroing beta");
      p.alpha_beta = scalars;
    }
    p.epilogue = GemmEpilogue::kNone;
    p.bias = nullptr;
    p.bias_grad = nullptr;
    p.aux = nullptr;
    gemm_cublaslt(p, s);
  } else {
    check_cuda(cudaMemsetAsync(acc, 0, size_t(dm.n * dm.m) * sizeof(float), s), op, "zeroing the accumulator");
  }
  gemm_epilogue_cuda(gemm_epilogue_params(g), acc, g.beta, g.alpha_beta != nullptr ? g.alpha_beta + 1 : nullptr,
                     g.d_amax, g.bias_grad, g.bias_dtype, s);
  if (g.epilogue == GemmEpilogue::kBGradB) gemm_bgrad_b_cuda(g.b, g.bias_grad, g.bias_dtype, s);
}

void run_cuda(const GemmPlan& pl, GemmArgs g, const GemmIO& io, const ExecCtx& ctx) {
  const char* op = pl.req.op;
  const GemmDims& dm = pl.dims;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(ctx.stream);
  if (io.workspace_bytes < pl.workspace_bytes) {
    fail(ErrorKind::kRuntime, msg(op, ": the workspace has ", str(io.workspace_bytes), " bytes, the plan needs ",
                                  str(pl.workspace_bytes)));
  }
  char* ws = static_cast<char*>(gemm_align_workspace(io.workspace));
  if (pl.amax_offset >= 0) {
    g.d_amax = reinterpret_cast<float*>(ws + pl.amax_offset);
    check_cuda(cudaMemsetAsync(g.d_amax, 0, sizeof(float), s), op, "zeroing the amax temporary");
  }
  if (pl.lt_offset >= 0) {
    g.workspace = ws + pl.lt_offset;
    g.workspace_bytes = size_t(kLtWorkspaceBytes);
  } else {
    g.workspace = io.lt_workspace;
    g.workspace_bytes = size_t(io.lt_workspace_bytes);
  }
  if (pl.alpha_offset >= 0) {  // NVFP4: [alpha', beta] on the device, from the amaxes
    float* alpha_beta = reinterpret_cast<float*>(ws + pl.alpha_offset);
    nvfp4_gemm_alpha_cuda(io.a_amax, io.b_amax, pl.req.alpha, float(pl.req.beta), alpha_beta, s);
    g.alpha_beta = alpha_beta;
  }
  if (pl.decode_block) {
    // SPEC §6.7 on sm_90: each operand decoded once to bf16 (same stored layout), then the bf16 GEMM; NVFP4's
    // global factors are in the device alpha'.
    const auto decode = [&](GemmOperand& x, int64_t offset, bool k_cols) {
      void* out = ws + offset;
      const auto* codes = static_cast<const uint8_t*>(x.data);
      const auto* scales = static_cast<const uint8_t*>(x.scale_inv);
      if (x.scaling == GemmScaling::kMxfp8) {
        decode_mxfp8_gemm_operand_cuda(codes, scales, x.rows, x.cols, k_cols, x.dtype == DType::kFloat8E4M3, out, s);
      } else {
        decode_nvfp4_gemm_operand_cuda(codes, scales, x.rows, x.cols, out, s);
      }
      x.data = out;
      x.dtype = DType::kBFloat16;
      x.scaling = GemmScaling::kNone;
      x.scale_inv = nullptr;
    };
    decode(g.a, pl.a_decode_offset, g.a.trans);
    decode(g.b, pl.b_decode_offset, !g.b.trans);
    g.fast_accum = false;
  }
  const auto finish = [&] {
    if (pl.fp8_out) gemm_fp8_finish_cuda(g.d_amax, io.d_amax, io.d_scale, io.d_scale_inv, s);
  };
  // Empty D (SPEC §6.1): nothing to multiply; the bias gradient may still be non-empty.
  if (dm.m == 0 || dm.n == 0) {
    if (g.epilogue == GemmEpilogue::kDGeluBGrad) {
      check_cuda(cudaMemsetAsync(g.bias_grad, 0, size_t(dm.m) * (g.bias_dtype == DType::kFloat32 ? 4 : 2), s), op,
                 "zeroing the bias gradient");
    }
    if (g.epilogue == GemmEpilogue::kBGradB) gemm_bgrad_b_cuda(g.b, g.bias_grad, g.bias_dtype, s);
    finish();
    return;
  }
  // cuBLASLt has no bias-gradient epilogue for FP8 B (SPEC §6.2: the missing part runs separately), nor any GEMM
  // with k = 0: Σ_k op(B) apart, then the GEMM without that epilogue.
  if (g.epilogue == GemmEpilogue::kBGradB && (is_fp8(g.b.dtype) || dm.k == 0)) {
    gemm_bgrad_b_cuda(g.b, g.bias_grad, g.bias_dtype, s);
    g.epilogue = GemmEpilogue::kNone;
    g.bias_grad = nullptr;
  }
  bool fused = dm.k > 0;  // K = 0: D = beta·D_in (+ bias, epilogue), the unfused path with a zero product
  if (fused) {
    try {
      gemm_cublaslt(g, s);
    } catch (const GemmNoKernel&) {
      if (g.epilogue == GemmEpilogue::kNone && !pl.fp8_out) throw;
      fused = false;
    }
  }
  if (!fused) run_unfused(pl, g, io, ws, s);
  finish();
}
#endif

}  // namespace

void run_gemm(const GemmPlan& pl, const GemmIO& io, const ExecCtx& ctx) {
  const GemmArgs g = args_of(pl, io);
  // The launchers' own refusals (core_fail, a cuBLASLt status): a format not provided yet, or a library failure.
  run_rewrapping_errors([&] {
    if (!ctx.cuda) {
      run_cpu(pl, g, io, ctx);
      return;
    }
#if defined(TE_WITH_CUDA)
    run_cuda(pl, g, io, ctx);
#else
    no_cuda(pl.req.op);
#endif
  });
}

}  // namespace ops
}  // namespace te
