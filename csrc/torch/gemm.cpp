// The GEMM op (SPEC §6): te::gemm writes D (and the epilogue's outputs) into buffers the Python wrapper allocated.
// Quantized tensors never reach here: per-tensor FP8 operands arrive as uint8 codes + scale_inv + DType code, with
// the stored copy already picked (SPEC §6.4). Every check runs before any library call and names the shapes, the
// formats, the arch and the rule (SPEC §1.5, §6.5).
#include <limits>

#include "../core/gemm/gemm.h"
#include "bridge.h"

namespace te_torch {
namespace {

constexpr const char* kOp = "generic_gemm";

bool is_fp8(te::DType d) { return d == te::DType::kFloat8E4M3 || d == te::DType::kFloat8E5M2; }

// Flattened [rows, cols] of a tensor (SPEC conventions: last dim = cols; 0-d = 1x1).
std::pair<int64_t, int64_t> rows_cols(const Tensor& x) {
  if (x.dim() == 0) return {1, 1};
  const int64_t c = x.size(-1);
  int64_t r = 1;
  for (int64_t i = 0; i + 1 < x.dim(); ++i) r *= x.size(i);
  return {r, c};
}

// "A [32, 24] E4M3" / "B [16, 64] bf16": operand descriptions for messages.
std::string operand_desc(const char* name, const Tensor& x, te::DType d) {
  return std::string(name) + " " + shape_str(x) + " " + te::dtype_short_name(d);
}

te::DType dtype_code(int64_t code, const char* what) {
  TORCH_CHECK_VALUE(code >= 0 && code <= 10, kOp, ": ", what, " DType code ", std::to_string(code), " is not known");
  return static_cast<te::DType>(code);
}

bool is_fp8_block(te::GemmScaling s) {
  return s == te::GemmScaling::kFp8Block1d || s == te::GemmScaling::kFp8Block2d;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t roundup(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// The scale tensor a block-scaled operand stored as [rows, cols] carries (SPEC §4.8), `k_cols` when the
// contraction runs along cols. FP8 block (float32): 1x128 [ceil(cols/128), roundup(rows, 4)], 128x128
// [ceil(rows/128), roundup(ceil(cols/128), 4)]. MXFP8 (E8M0 bytes, GEMM-swizzled): [roundup(rows, 128),
// roundup(ceil(cols/32), 4)], or the columnwise form [roundup(ceil(rows/32), 4), roundup(cols, 128)] when K runs
// along rows. NVFP4 (E4M3 bytes, GEMM-swizzled, always K along cols): [roundup(rows, 128), roundup(cols/16, 4)].
std::vector<int64_t> block_scale_shape(te::GemmScaling s, int64_t rows, int64_t cols, bool k_cols) {
  switch (s) {
    case te::GemmScaling::kFp8Block1d: return {ceil_div(cols, 128), roundup(rows, 4)};
    case te::GemmScaling::kFp8Block2d: return {ceil_div(rows, 128), roundup(ceil_div(cols, 128), 4)};
    case te::GemmScaling::kMxfp8:
      if (k_cols) return {roundup(rows, 128), roundup(ceil_div(cols, 32), 4)};
      return {roundup(ceil_div(rows, 32), 4), roundup(cols, 128)};
    default: return {roundup(rows, 128), roundup(ceil_div(cols, 16), 4)};
  }
}

// Checks an operand tensor against its declared DType code and scaling and returns the core operand.
te::GemmOperand make_operand(const char* name, const Tensor& x, const c10::optional<Tensor>& scale_inv, int64_t code,
                             int64_t scaling, bool trans, const Tensor& ref) {
  const te::DType d = dtype_code(code, name);
  TORCH_CHECK_VALUE(x.device() == ref.device(), kOp, ": operands must be on one device, got ", name, " on ",
                    x.device().str(), " and A on ", ref.device().str(), "; move them with .to(device)");
  te::GemmOperand op;
  op.dtype = d;
  op.trans = trans;
  std::tie(op.rows, op.cols) = rows_cols(x);
  const bool fp4 = d == te::DType::kFloat4E2M1;
  if (is_fp8(d) || fp4) {
    TORCH_CHECK_TYPE(x.scalar_type() == at::kByte, kOp, ": ", fp4 ? "FP4" : "FP8", " operand ", name,
                     " must hold uint8 codes, got ", dtype_name(x.scalar_type()));
    TORCH_CHECK_VALUE(scale_inv.has_value(), kOp, ": quantized operand ", name, " needs its scale_inv");
    TORCH_CHECK_VALUE(fp4 ? scaling == 3 : (scaling <= 2 || scaling == 4 || scaling == 5), kOp, ": ", name,
                      "_scaling must be ", fp4 ? "3 (NVFP4) for E2M1 codes" :
                      "1 (per-tensor), 2 (MXFP8), 4 (FP8 block 1x128) or 5 (FP8 block 128x128) for FP8 codes",
                      ", got ", std::to_string(scaling));
    op.scaling = scaling == 0 ? te::GemmScaling::kFp8PerTensor : static_cast<te::GemmScaling>(scaling);
    if (fp4) op.cols *= 2;  // two E2M1 codes per byte
    const Tensor& s = *scale_inv;
    if (op.scaling == te::GemmScaling::kFp8PerTensor) {
      check_scalar_f32(s, ref, kOp, (std::string(name) + " scale_inv").c_str());
    } else {
      const bool k_cols = (name[0] == 'A') == trans;
      const std::vector<int64_t> want = block_scale_shape(op.scaling, op.rows, op.cols, k_cols);
      const at::ScalarType st = is_fp8_block(op.scaling) ? at::kFloat : at::kByte;
      TORCH_CHECK_VALUE(s.device() == ref.device() && s.scalar_type() == st && s.is_contiguous() &&
                            s.sizes().vec() == want,
                        kOp, ": ", name, " (", te::gemm_scaling_name(op.scaling), ", stored [",
                        std::to_string(op.rows), ", ", std::to_string(op.cols), "]) needs a contiguous ",
                        dtype_name(st), " scale tensor [", std::to_string(want[0]), ", ", std::to_string(want[1]),
                        "] on ", ref.device().str(), ", got ", dtype_name(s.scalar_type()), " ", shape_str(s), " on ",
                        s.device().str());
    }
    op.scale_inv = s.data_ptr();
  } else {
    TORCH_CHECK_VALUE(scaling == 0, kOp, ": ", name, "_scaling=", std::to_string(scaling),
                      " is for quantized operands, but ", name, " is ", te::dtype_short_name(d));
    TORCH_CHECK_TYPE(d == te::DType::kFloat32 || d == te::DType::kFloat16 || d == te::DType::kBFloat16, kOp,
                     ": operand ", name, " must be fp32, fp16, bf16, FP8 (E4M3/E5M2) or E2M1, got DType ",
                     std::to_string(code));
    TORCH_CHECK_TYPE(x.scalar_type() == scalar_type_of(d), kOp, ": operand ", name, " is ",
                     dtype_name(x.scalar_type()), " but its DType code says ", te::dtype_short_name(d));
  }
  return op;
}

std::string layout_str(bool ta, bool tb) { return std::string(ta ? "T" : "N") + (tb ? "T" : "N"); }

void check_out(const char* what, const Tensor& t, int64_t numel, int64_t last, at::ScalarType st, const Tensor& ref) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), kOp, ": ", what, " is on ", t.device().str(),
                    " but the operands are on ", ref.device().str());
  TORCH_CHECK_VALUE(t.is_contiguous() && t.numel() == numel && (numel == 0 || t.dim() == 0 || t.size(-1) == last), kOp,
                    ": ", what, " must be a contiguous tensor of ", std::to_string(numel), " elements with last dim ",
                    std::to_string(last), ", got ", shape_str(t), t.is_contiguous() ? "" : " (non-contiguous)");
  TORCH_CHECK_TYPE(t.scalar_type() == st, kOp, ": ", what, " must be ", dtype_name(st), ", got ",
                   dtype_name(t.scalar_type()));
}

// Rethrows a core error as the exception class SPEC §1.5 asks for: NotImplementedError for a format not provided
// yet, RuntimeError for the rest (library refusals with their shapes and formats).
template <typename F> void run_core(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    TORCH_CHECK_NOT_IMPLEMENTED(msg.find("not yet supported") == std::string::npos, msg);
    TORCH_CHECK(false, msg);
  }
}

#if defined(TE_WITH_CUDA)
// Σ_k op(B) in FP32 (the wgrad bias gradient), for the cases cuBLASLt's BGRADB does not cover: FP8 codes are
// decoded exactly and scaled by scale_inv (per tensor, or per block of the SPEC §4.8 scale matrix). `b` is the
// operand as the kernel sees it ([rows, cols], flag g.b.trans).
Tensor bias_grad_of_b(const te::GemmArgs& g, const Tensor& b, const c10::optional<Tensor>& b_scale_inv) {
  const int64_t rows = g.b.rows, cols = g.b.cols;
  Tensor bf = b.to(at::kFloat).reshape({rows, cols});
  if (is_fp8(g.b.dtype)) {
    bf = b.view(g.b.dtype == te::DType::kFloat8E4M3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2).to(at::kFloat)
             .reshape({rows, cols});
    const Tensor& s = *b_scale_inv;
    Tensor f = s;  // per-tensor: broadcasts
    if (g.b.scaling == te::GemmScaling::kFp8Block1d) {  // s[col / 128, row]
      f = s.narrow(1, 0, rows).t().repeat_interleave(128, 1).narrow(1, 0, cols);
    } else if (g.b.scaling == te::GemmScaling::kFp8Block2d) {  // s[row / 128, col / 128]
      f = s.narrow(1, 0, ceil_div(cols, 128)).repeat_interleave(128, 0).narrow(0, 0, rows)
              .repeat_interleave(128, 1).narrow(1, 0, cols);
    }
    bf = bf * f;
  }
  return bf.sum(g.b.trans ? 0 : 1);
}

// SPEC §6.2: where cuBLASLt has no kernel for an epilogue (format, shape or alignment), the GEMM runs plain into
// FP32 and the epilogue follows as separate ops with the CPU kernel's math (FP32, one rounding to the output).
void unfused_epilogue(const te::GemmArgs& g, const te::GemmDims& dm, const Tensor& b, const Tensor& D,
                      const c10::optional<Tensor>& bias, const c10::optional<Tensor>& bias_grad,
                      const c10::optional<Tensor>& aux, const c10::optional<Tensor>& alpha_beta) {
  Tensor acc = at::empty({dm.n, dm.m}, D.options().dtype(at::kFloat));
  te::GemmArgs p = g;
  p.d = acc.data_ptr();
  p.d_dtype = te::DType::kFloat32;
  p.beta = 0.0f;
  Tensor alpha_0;  // device [alpha, 0]: the plain product only; beta·D_in follows below
  if (alpha_beta.has_value()) {
    alpha_0 = alpha_beta->clone();
    alpha_0.narrow(0, 1, 1).zero_();
    p.alpha_beta = alpha_0.data_ptr<float>();
  }
  p.epilogue = te::GemmEpilogue::kNone;
  p.bias = nullptr;
  p.bias_grad = nullptr;
  p.aux = nullptr;
  run_core([&] { te::gemm_cublaslt(p, current_stream()); });
  Tensor d2 = D.view({dm.n, dm.m});
  Tensor r = acc;
  if (alpha_beta.has_value()) {
    r = r + d2.to(at::kFloat) * alpha_beta->narrow(0, 1, 1);
  } else if (g.beta != 0.0f) {
    r = r + d2.to(at::kFloat) * double(g.beta);
  }
  switch (g.epilogue) {
    case te::GemmEpilogue::kBias: r = r + bias->to(at::kFloat); break;
    case te::GemmEpilogue::kGeluAuxBias: r = r + bias->to(at::kFloat); [[fallthrough]];
    case te::GemmEpilogue::kGeluAux:
      aux->view({dm.n, dm.m}).copy_(r);
      r = at::gelu(r, "tanh");
      break;
    case te::GemmEpilogue::kDGelu:
    case te::GemmEpilogue::kDGeluBGrad:
      r = at::gelu_backward(r, aux->view({dm.n, dm.m}).to(at::kFloat), "tanh");
      if (g.epilogue == te::GemmEpilogue::kDGeluBGrad) bias_grad->copy_(r.sum(0));
      break;
    case te::GemmEpilogue::kBGradB:
      bias_grad->copy_(bias_grad_of_b(g, b, c10::nullopt));
      break;
    case te::GemmEpilogue::kNone: break;
  }
  d2.copy_(r);
}
#endif

void gemm(const Tensor& A_in, const c10::optional<Tensor>& A_scale_inv, int64_t A_dtype, bool transA,
          const Tensor& B_in, const c10::optional<Tensor>& B_scale_inv, int64_t B_dtype, bool transB, const Tensor& D,
          int64_t D_dtype, const c10::optional<Tensor>& bias, const c10::optional<Tensor>& bias_grad,
          const c10::optional<Tensor>& pre_gelu_out, const c10::optional<Tensor>& gelu_in,
          const c10::optional<Tensor>& D_scale, const c10::optional<Tensor>& D_amax,
          const c10::optional<Tensor>& D_scale_inv, const c10::optional<Tensor>& workspace, int64_t workspace_size,
          bool gelu, bool grad, bool use_split_accumulator, double alpha, double beta, int64_t A_scaling,
          int64_t B_scaling, const c10::optional<Tensor>& alpha_beta) {
  const Tensor& ref = A_in;
  te::GemmArgs g;
  g.a = make_operand("A", A_in, A_scale_inv, A_dtype, A_scaling, transA, ref);
  g.b = make_operand("B", B_in, B_scale_inv, B_dtype, B_scaling, transB, ref);
  const std::string arch = arch_name(ref);
  const std::string operands = operand_desc("A", A_in, g.a.dtype) + ", " + operand_desc("B", B_in, g.b.dtype) +
                               ", layout " + layout_str(transA, transB) + ", " + arch;
  const bool fp8_a = is_fp8(g.a.dtype), fp8_b = is_fp8(g.b.dtype);
  TORCH_CHECK_TYPE(fp8_a == fp8_b && (fp8_a || g.a.dtype == g.b.dtype), kOp,
                   ": A and B must both be FP8 or both the same plain dtype (mixed operands are not supported), got ",
                   operands, ". Quantize both operands or neither");
  const te::GemmDims dm = te::gemm_dims(g);
  const int64_t b_inner = transB ? g.b.rows : g.b.cols;
  TORCH_CHECK_VALUE(dm.k == b_inner, kOp, ": inner dims do not agree: op(A) contracts over ", std::to_string(dm.k),
                    " and op(B) over ", std::to_string(b_inner), " (", operands,
                    "; D = op(B)·op(A) needs (transA ? A1 : A0) == (transB ? B0 : B1))");
  const bool scaled = g.a.scaling != te::GemmScaling::kNone;
  if (scaled) {
    const char* fmt = te::gemm_scaling_name(g.a.scaling);
    TORCH_CHECK_VALUE(!(g.a.dtype == te::DType::kFloat8E5M2 && g.b.dtype == te::DType::kFloat8E5M2), kOp,
                      ": E5M2 x E5M2 has no FP8 GEMM kernel (", operands,
                      "). Quantize one operand (usually the weight or activation) as E4M3");
    const bool fam_a = is_fp8_block(g.a.scaling), fam_b = is_fp8_block(g.b.scaling);
    TORCH_CHECK_VALUE(fam_a ? fam_b : g.a.scaling == g.b.scaling, kOp, ": A is ", fmt, " and B is ",
                      te::gemm_scaling_name(g.b.scaling), " (", operands,
                      "); quantize both operands with one recipe (FP8 block 1-D and 2-D may be mixed)");
    TORCH_CHECK_VALUE(!(g.a.scaling == te::GemmScaling::kFp8Block2d && g.b.scaling == te::GemmScaling::kFp8Block2d),
                      kOp, ": FP8 block 128x128 x 128x128 has no kernel (", operands,
                      "); quantize one operand with block_scaling_dim=1");
    const int64_t k_mult = (g.a.scaling == te::GemmScaling::kMxfp8 || g.a.scaling == te::GemmScaling::kNvfp4) ? 32 : 16;
    TORCH_CHECK_VALUE(dm.k % k_mult == 0, kOp, ": ", fmt, " GEMM needs the contraction dim K to be a multiple of ",
                      std::to_string(k_mult), ", got K=", std::to_string(dm.k), " (", operands, "). Pad K to ",
                      std::to_string(roundup(dm.k, k_mult)), " or keep this layer in bf16");
    TORCH_CHECK_VALUE(dm.m % 16 == 0, kOp, ": ", fmt, " GEMM needs the output's last dim N to be a multiple of 16, "
                      "got N=", std::to_string(dm.m), " (", operands, "). Pad it to ", std::to_string(roundup(dm.m, 16)),
                      " or keep this layer in bf16");
    TORCH_CHECK_VALUE(g.a.scaling == te::GemmScaling::kMxfp8 || (transA && !transB), kOp, ": ", fmt,
                      " operands run as TN (", operands, "); pass the copies whose scaling runs along K with "
                      "transA=True and transB=False (general_gemm picks the copies)");
    const te::DType out = dtype_code(D_dtype, "D");
    TORCH_CHECK_VALUE(g.a.scaling != te::GemmScaling::kNvfp4 || out == te::DType::kFloat32 ||
                          out == te::DType::kBFloat16,
                      kOp, ": NVFP4 GEMMs write bf16 or fp32, got ", te::dtype_short_name(out), " (", operands, ")");
    TORCH_CHECK_NOT_IMPLEMENTED(g.a.scaling == te::GemmScaling::kFp8PerTensor || ref.is_cuda(), kOp,
                                ": not yet supported: ", fmt, " operands in the CPU kernel (", operands,
                                "); general_gemm dequantizes them exactly on the CPU");
  }
  // Output.
  g.d_dtype = dtype_code(D_dtype, "D");
  TORCH_CHECK_VALUE(g.d_dtype != te::DType::kFloat4E2M1, kOp, ": FP4 output is not supported (", operands,
                    "); request bf16/fp32 output and quantize it to NVFP4 afterwards");
  const bool fp8_out = is_fp8(g.d_dtype);
  TORCH_CHECK_VALUE(fp8_out || g.d_dtype == te::DType::kFloat32 || g.d_dtype == te::DType::kFloat16 ||
                        g.d_dtype == te::DType::kBFloat16,
                    kOp, ": output DType code ", std::to_string(D_dtype),
                    " is not supported; accepted: fp32 (4), fp16 (5), bf16 (6), or FP8 (7, 8) with FP8 operands");
  check_out("D", D, dm.n * dm.m, dm.m, fp8_out ? at::kByte : scalar_type_of(g.d_dtype), ref);
  g.d = D.data_ptr();
  if (fp8_out) {
    TORCH_CHECK_VALUE(g.a.scaling == te::GemmScaling::kFp8PerTensor, kOp,
                      ": FP8 output needs per-tensor FP8 operands (", operands,
                      "); block-scaled GEMMs write bf16/fp32, then quantize");
    TORCH_CHECK_VALUE(beta == 0.0, kOp, ": accumulating into an FP8 output is not supported (", operands, ")");
    TORCH_CHECK_VALUE(D_scale.has_value() && D_amax.has_value() && D_scale_inv.has_value(), kOp,
                      ": FP8 output needs the quantizer's scale and amax and the output's scale_inv");
    check_scalar_f32(*D_scale, ref, kOp, "output quantizer scale");
    check_scalar_f32(*D_amax, ref, kOp, "output quantizer amax");
    check_scalar_f32(*D_scale_inv, ref, kOp, "output scale_inv");
    g.d_scale = D_scale->data_ptr<float>();
  }
  g.alpha = float(alpha);
  g.beta = float(beta);
  if (alpha_beta.has_value()) {
    const Tensor& ab = *alpha_beta;
    TORCH_CHECK_VALUE(ref.is_cuda() && ab.device() == ref.device() && ab.scalar_type() == at::kFloat &&
                          ab.is_contiguous() && ab.dim() == 1 && ab.size(0) == 2,
                      kOp, ": alpha_beta must be a contiguous float32 [2] tensor (alpha, beta) on the operands' CUDA "
                      "device, got ", dtype_name(ab.scalar_type()), " ", shape_str(ab), " on ", ab.device().str());
    g.alpha_beta = ab.data_ptr<float>();
  }

  g.fast_accum = fp8_a && !use_split_accumulator;
  if (g.a.dtype == te::DType::kFloat32)
    g.allow_tf32 = at::globalContext().float32MatmulPrecision() != at::Float32MatmulPrecision::HIGHEST;

  // Epilogue (SPEC §6.2).
  const at::ScalarType hp_out = fp8_out ? at::kBFloat16 : scalar_type_of(g.d_dtype);
  auto check_vec = [&](const char* what, const Tensor& t, int64_t len) {
    TORCH_CHECK_VALUE(t.device() == ref.device() && t.is_contiguous() && t.dim() == 1 && t.size(0) == len, kOp, ": ",
                      what, " must be a contiguous 1-D tensor of length ", std::to_string(len), " on ",
                      ref.device().str(), ", got ", shape_str(t), t.is_contiguous() ? "" : " (non-contiguous)", " on ",
                      t.device().str(), " (", operands, ")");
    const at::ScalarType st = t.scalar_type();
    TORCH_CHECK_TYPE(fp8_out ? (st == at::kBFloat16 || st == at::kHalf) : st == hp_out, kOp, ": ", what, " must be ",
                     fp8_out ? "bf16 or fp16 (the output is FP8)" : dtype_name(hp_out) + " (the output dtype)",
                     ", got ", dtype_name(st));
    g.bias_dtype = input_dtype(t, kOp, what);
  };
  if (gelu && !grad) {
    TORCH_CHECK_VALUE(pre_gelu_out.has_value(), kOp, ": gelu=True needs the pre_gelu_out buffer");
    if (bias.has_value()) {
      check_vec("bias", *bias, dm.m);
      g.bias = bias->data_ptr();
    }
    const at::ScalarType st = pre_gelu_out->scalar_type();
    TORCH_CHECK_TYPE(st == at::kFloat || st == at::kHalf || st == at::kBFloat16, kOp,
                     ": pre_gelu_out must be fp32, fp16 or bf16 (never FP8), got ", dtype_name(st));
    check_out("pre_gelu_out", *pre_gelu_out, dm.n * dm.m, dm.m, st, ref);
    g.aux = pre_gelu_out->data_ptr();
    g.aux_dtype = input_dtype(*pre_gelu_out, kOp, "pre_gelu_out");
    g.epilogue = bias.has_value() ? te::GemmEpilogue::kGeluAuxBias : te::GemmEpilogue::kGeluAux;
  } else if (gelu && grad) {
    TORCH_CHECK_VALUE(gelu_in.has_value(), kOp, ": gelu=True with grad=True (DGELU) needs gelu_in, the saved "
                      "pre-activation of D's shape");
    const at::ScalarType st = gelu_in->scalar_type();
    TORCH_CHECK_TYPE(st == at::kFloat || st == at::kHalf || st == at::kBFloat16, kOp,
                     ": gelu_in must be fp32, fp16 or bf16, got ", dtype_name(st));
    check_out("gelu_in", *gelu_in, dm.n * dm.m, dm.m, st, ref);
    g.aux = gelu_in->data_ptr();
    g.aux_dtype = input_dtype(*gelu_in, kOp, "gelu_in");
    g.epilogue = te::GemmEpilogue::kDGelu;
    if (bias_grad.has_value()) {
      check_vec("bias_grad", *bias_grad, dm.m);
      g.bias_grad = bias_grad->data_ptr();
      g.epilogue = te::GemmEpilogue::kDGeluBGrad;
    }
  } else if (grad && bias_grad.has_value()) {
    check_vec("bias_grad", *bias_grad, dm.n);
    g.bias_grad = bias_grad->data_ptr();
    g.epilogue = te::GemmEpilogue::kBGradB;
  } else if (!grad && bias.has_value()) {
    check_vec("bias", *bias, dm.m);
    g.bias = bias->data_ptr();
    g.epilogue = te::GemmEpilogue::kBias;
  }
  // FP8 output carries its 16-bit "bias type" for C and the aux buffer even without a bias.
  if (fp8_out && g.bias == nullptr && g.bias_grad == nullptr && g.aux != nullptr) g.bias_dtype = g.aux_dtype;

  // Workspace (SPEC §6.1): uint8 on the operands' device holding at least workspace_size bytes.
  if (workspace.has_value() && workspace->numel() > 0) {
    const Tensor& w = *workspace;
    TORCH_CHECK_VALUE(w.scalar_type() == at::kByte && w.is_contiguous() && w.device() == ref.device() &&
                          workspace_size >= 0 && w.numel() >= workspace_size,
                      kOp, ": workspace must be a contiguous uint8 tensor on ", ref.device().str(), " with at least ",
                      "workspace_size=", std::to_string(workspace_size), " bytes, got ", dtype_name(w.scalar_type()),
                      " ", shape_str(w), " on ", w.device().str(), ". Recommended: 32 MiB + 1 KiB on sm_90 and newer");
    g.workspace = w.data_ptr();
    g.workspace_bytes = size_t(workspace_size);
  }

  // FP8 output: the library (or the CPU kernel) sets a fresh amax into a temporary, merged into the quantizer's
  // amax afterwards (SPEC §6.3), and scale_inv = 1/scale.
  Tensor amax_tmp;
  if (fp8_out) {
    amax_tmp = at::zeros({1}, ref.options().dtype(at::kFloat));
    g.d_amax = amax_tmp.data_ptr<float>();
  }
  auto finish_fp8 = [&]() {
    if (!fp8_out) return;
    Tensor amax = *D_amax;
    at::maximum_out(amax, amax, amax_tmp);
    Tensor sinv = *D_scale_inv;
    at::reciprocal_out(sinv, D_scale->reshape(sinv.sizes()));
  };

  if (!ref.is_cuda()) {
    // Operands must be contiguous row-major for the core; a view is copied.
    const Tensor a = A_in.contiguous(), b = B_in.contiguous();
    g.a.data = a.data_ptr();
    g.b.data = b.data_ptr();
    run_core([&] {
      te::gemm_cpu(g, [](int64_t n, const std::function<void(int64_t, int64_t)>& body) {
        at::parallel_for(0, n, 1, [&](int64_t b, int64_t e) { body(b, e); });
      });
    });
    finish_fp8();
    return;
  }
#if defined(TE_WITH_CUDA)
  const c10::cuda::CUDAGuard guard(ref.device());
  Tensor a = A_in.contiguous(), b = B_in.contiguous();
  // Empty GEMMs (SPEC §6.1): nothing to multiply when D is empty; the bias gradient of op(B) may still be non-empty.
  if (dm.m == 0 || dm.n == 0) {
    if (g.epilogue == te::GemmEpilogue::kDGeluBGrad) bias_grad->zero_();
    if (g.epilogue == te::GemmEpilogue::kBGradB) bias_grad->copy_(bias_grad_of_b(g, b, B_scale_inv));
    finish_fp8();
    return;
  }
  // K = 0: D = beta·D_in (+ bias, epilogue). cuBLASLt wants k > 0, so the operands become 16 zeros along k, which
  // leaves every epilogue's math unchanged (zero products, zero bias gradient).
  if (dm.k == 0) {
    constexpr int64_t kPad = 16;
    a = at::zeros(transA ? std::vector<int64_t>{dm.m, kPad} : std::vector<int64_t>{kPad, dm.m}, a.options());
    b = at::zeros(transB ? std::vector<int64_t>{kPad, dm.n} : std::vector<int64_t>{dm.n, kPad}, b.options());
    if (g.a.scaling != te::GemmScaling::kNone && g.a.scaling != te::GemmScaling::kFp8PerTensor) {
      // Block scales of K = 0 are empty: the zeros become plain bf16 ones.
      a = a.to(at::kBFloat16);
      b = b.to(at::kBFloat16);
      for (te::GemmOperand* op : {&g.a, &g.b}) {
        op->dtype = te::DType::kBFloat16;
        op->scaling = te::GemmScaling::kNone;
      }
    }
    std::tie(g.a.rows, g.a.cols) = rows_cols(a);
    std::tie(g.b.rows, g.b.cols) = rows_cols(b);
  }
  g.a.data = a.data_ptr();
  g.b.data = b.data_ptr();
  // cuBLASLt has no bias-gradient epilogue for FP8 B (SPEC §6.2: the missing part runs separately): Σ_k op(B) of
  // the dequantized codes, then the GEMM without epilogue.
  if (g.epilogue == te::GemmEpilogue::kBGradB && fp8_b) {
    bias_grad->copy_(bias_grad_of_b(g, b, B_scale_inv));
    g.epilogue = te::GemmEpilogue::kNone;
    g.bias_grad = nullptr;
  }
  if (g.workspace == nullptr) {
    // torch's cuBLASLt workspace of this stream (the one torch's own matmuls use, allocated by its caching
    // allocator, so also under CUDA-graph capture).
    g.workspace = at::cuda::getCUDABlasLtWorkspace();
    g.workspace_bytes = at::cuda::getCUDABlasLtWorkspaceSize();
  }
  bool fused = true;
  run_core([&] {
    try {
      te::gemm_cublaslt(g, current_stream());
    } catch (const te::GemmNoKernel&) {
      if (g.epilogue == te::GemmEpilogue::kNone || fp8_out) throw;
      fused = false;
    }
  });
  if (!fused) {
    unfused_epilogue(g, dm, b, D, bias, bias_grad, gelu ? (grad ? gelu_in : pre_gelu_out) : c10::nullopt,
                     alpha_beta);
  }
  finish_fp8();
#else
  TORCH_CHECK(false, "transformer_engine_torch was built without CUDA; CUDA tensors are not supported");
#endif
}

int64_t cublaslt_version() {
#if defined(TE_WITH_CUDA)
  return int64_t(te::cublaslt_version());
#else
  return 0;
#endif
}

}  // namespace

static void gemm_impls(torch::Library& m) { m.impl("gemm", &gemm); }
TE_IMPL_CPU_AND_CUDA(gemm_impls)

// No tensor arguments: one kernel for every dispatch key.
TORCH_LIBRARY_IMPL(te, CompositeImplicitAutograd, m) { m.impl("cublaslt_version", &cublaslt_version); }

}  // namespace te_torch
