// plan_norm_fwd / run_norm_fwd, plan_norm_bwd / run_norm_bwd (norm_op.h): the checks of SPEC §11, the output pieces
// (the identity cast's plan for a quantized output) and the launches.
#include "norm_op.h"

#include <cmath>

#include "../formats/fp8/fp8.h"
#include "run.h"

namespace te {
namespace ops {
namespace {

bool float_dtype(DType d) { return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16; }

int64_t take(int64_t& bytes, int64_t n) {
  const int64_t at = bytes;
  bytes += (n + 255) / 256 * 256;
  return at;
}

void set(PiecePlan& pc, DType dtype, const Shape& shape) {
  pc.present = true;
  pc.dtype = dtype;
  pc.shape = shape;
  pc.capacity = shape.numel();
}

// " (input [..] BFloat16 on sm_90)": the request as messages describe it.
std::string in_desc(const TensorView& x, const ExecCtx& ctx) {
  return msg(std::string(" (input "), shape_str(x.shape), " ", dtype_name(x.dtype), " on ", arch_name(ctx), ")");
}

void check_dtype(const char* op, const char* what, DType d, const ExecCtx& ctx) {
  if (!float_dtype(d)) {
    fail(ErrorKind::kType, msg(std::string(op), ": ", what, " dtype ", dtype_name(d), " is not supported on ",
                               arch_name(ctx), "; accepted: Float, Half, BFloat16"));
  }
}

// x [..., H] with H >= 1; returns H and sets rows.
int64_t check_input(const char* op, const char* what, const TensorView& x, int64_t& rows, const ExecCtx& ctx) {
  check_dtype(op, what, x.dtype, ctx);
  if (x.shape.ndim == 0 || x.shape.back() == 0) {
    fail(ErrorKind::kValue, msg(std::string(op), ": ", what, " must have rank >= 1 and a hidden size (last dim) >= 1, "
                                "got ", what, " ", shape_str(x.shape), " on ", arch_name(ctx)));
  }
  const int64_t h = x.shape.back();
  rows = x.shape.numel() / h;
  return h;
}

// Starts a plan of either direction: keeps the request and the device kind, checks x (named `what` in messages) and
// flattens it to [rows, hidden]; returns hidden.
template <class Plan, class Request>
int64_t start_plan(Plan& pl, const Request& r, const char* what, const ExecCtx& ctx) {
  pl.req = r;
  pl.cuda = ctx.cuda;
  pl.hidden = check_input(r.op, what, r.x, pl.rows, ctx);
  return pl.hidden;
}

void check_param(const char* op, const char* what, const TensorView& t, const TensorView& x, int64_t h,
                 const ExecCtx& ctx) {
  check_dtype(op, what, t.dtype, ctx);
  if (t.shape != Shape::of(h)) {
    fail(ErrorKind::kValue, msg(std::string(op), ": ", what, " has shape ", shape_str(t.shape),
                                " but the normalized (last) dim of input ", shape_str(x.shape), " is ", str(h),
                                "; pass ", what, " of shape [", str(h), "]"));
  }
}

// mu / rsigma: FP32 with rows elements ([rows] or x's leading shape).
void check_stat(const char* op, const char* what, const TensorView& t, const TensorView& x, int64_t rows,
                const ExecCtx& ctx) {
  if (t.dtype != DType::kFloat32) {
    fail(ErrorKind::kType, msg(std::string(op), ": ", what, " must be Float (FP32, as the forward returns it), got ",
                               dtype_name(t.dtype), " on ", arch_name(ctx)));
  }
  Shape lead = x.shape;
  lead.ndim -= 1;
  if (t.shape != Shape::of(rows) && t.shape != lead) {
    fail(ErrorKind::kValue, msg(std::string(op), ": ", what, " has shape ", shape_str(t.shape), " but input ",
                                shape_str(x.shape), " has ", str(rows), " rows; pass the forward's ", what, " of shape [",
                                str(rows), "]"));
  }
}

const char* format_name(const QuantSpec& s) {
  switch (s.kind) {
    case QuantKind::kMxfp8: return s.e4m3() ? "MXFP8 E4M3" : "MXFP8 E5M2";
    case QuantKind::kNvfp4: return "NVFP4";
    default: return "";
  }
}

}  // namespace

NormFwdPlan plan_norm_fwd(const NormFwdRequest& r, const QuantSpec& spec, const ExecCtx& ctx, PlanOptions opt) {
  NormFwdPlan pl;
  pl.spec = spec;
  const int64_t h = start_plan(pl, r, "input", ctx);
  const char* op = r.op;
  const bool ln = r.kind == NormKind::kLayerNorm;
  check_param(op, "weight (gamma)", r.gamma, r.x, h, ctx);
  if (ln && !r.has_beta) fail(ErrorKind::kValue, msg(std::string(op), ": LayerNorm needs bias (beta) of shape [", str(h), "]"));
  if (!ln && r.has_beta) fail(ErrorKind::kValue, msg(std::string(op), ": RMSNorm takes no bias (beta)"));
  if (ln) {
    check_param(op, "bias (beta)", r.beta, r.x, h, ctx);
    if (r.beta.dtype != r.gamma.dtype) {
      fail(ErrorKind::kType, msg(std::string(op), ": bias (beta) dtype ", dtype_name(r.beta.dtype),
                                 " must match weight (gamma) dtype ", dtype_name(r.gamma.dtype)));
    }
  }
  if (!(r.eps > 0.0 && std::isfinite(r.eps) && float(r.eps) > 0.0f)) {
    fail(ErrorKind::kValue, msg(std::string(op), ": eps must be finite and > 0 (and > 0 as an FP32 value), got ",
                                std::to_string(r.eps)));
  }
  const int64_t block = spec.kind == QuantKind::kMxfp8 ? 32 : spec.kind == QuantKind::kNvfp4 ? 16 : 0;
  if (block > 0 && h % block != 0) {
    fail(ErrorKind::kValue, msg(std::string(op), ": ", format_name(spec), " output quantizes blocks of ", str(block),
                                " along the hidden size, so the hidden size (input's last dim) must be a multiple of ",
                                str(block), "; got hidden size ", str(h), in_desc(r.x, ctx), ". Pad the hidden size to ",
                                str((h + block - 1) / block * block), " or use a per-tensor FP8 quantizer"));
  }
  int64_t ws = 0;
  if (ln) set(pl.mu, DType::kFloat32, Shape::of(pl.rows));
  set(pl.rsigma, DType::kFloat32, Shape::of(pl.rows));
  if (spec.kind == QuantKind::kNone) {
    if (!float_dtype(r.otype)) {
      fail(ErrorKind::kType, msg(std::string(op), ": otype ", dtype_name(r.otype),
                                 " is not a plain output dtype; accepted: Float, Half, BFloat16 (or pass a quantizer)"));
    }
    pl.path = NormPath::kPlain;
    set(pl.pieces[kRowData], r.otype, r.x.shape);
    pl.workspace_bytes = 0;
    return pl;
  }
  ActRequest cr;
  cr.op = op;
  cr.kind = ActKind::kIdentity;
  cr.x.dtype = DType::kFloat32;
  cr.x.shape = r.x.shape;
  PlanOptions co = opt;
  co.amax_only = false;
  co.dbias_fp32 = false;
  pl.cast = plan_act(cr, spec, ctx, co);
  pl.has_cast = true;
  pl.spec = pl.cast.spec;
  for (int i = 0; i < kNumPieces; ++i) pl.pieces[i] = pl.cast.pieces[i];
  // The fused CUDA paths: the rowwise copy, which the norm kernel emits itself (formats' own emitters), and for
  // per-tensor FP8 the columnwise copy as the byte transpose of its codes (the same codes under one scale: what the
  // cast of y writes there). Per element that reads x twice and writes and moves one byte twice, where the generic
  // path writes and reads FP32 y twice (16 bytes against 7; two such norms a layer of a 1B decoder's step).
  const QuantSpec& cs = pl.cast.spec;
  const bool row_only = cs.rowwise && !cs.columnwise && pl.rows > 0;
  const bool fp8 = cs.kind == QuantKind::kFp8Delayed || cs.kind == QuantKind::kFp8Current;
  const bool fused_fp8 = fp8 && cs.rowwise && pl.rows > 0;
  const bool fused_mx = cs.kind == QuantKind::kMxfp8 && row_only;
  if (ctx.cuda && !opt.any_device && (fused_fp8 || fused_mx)) {
    pl.path = fused_mx ? NormPath::kFusedMxfp8 : NormPath::kFusedFp8;
    pl.transpose_copy = fused_fp8 && cs.columnwise;
    if (cs.kind == QuantKind::kFp8Current && cs.amax == nullptr) pl.amax_offset = take(ws, 4);
    pl.workspace_bytes = ws;
    return pl;
  }
  pl.path = NormPath::kGeneric;
  pl.y_offset = take(ws, pl.rows * h * 4);
  pl.cast_ws_offset = take(ws, pl.cast.workspace_bytes);
  pl.workspace_bytes = ws;
  return pl;
}

namespace {

void launch_fwd(const NormFwdParams& p, const ExecCtx& ctx) {
  run_rewrapping_errors(
      [&] { TE_ON_DEVICE(ctx, norm_fwd_cuda(p, ctx.stream), norm_fwd_cpu(p, *ctx.parallel_for)); });
}

void check_ws(const char* op, int64_t have, int64_t need) {
  if (have < need) {
    fail(ErrorKind::kRuntime, msg(std::string(op), ": the workspace has ", str(have), " bytes, the plan needs ", str(need)));
  }
}

}  // namespace

void run_norm_fwd(const NormFwdPlan& pl, const NormFwdIO& io, const ExecCtx& ctx) {
  const NormFwdRequest& r = pl.req;
  check_ws(r.op, io.workspace_bytes, pl.workspace_bytes);
  NormFwdParams p;
  static_cast<NormFwdTensors&>(p) = io;
  if (r.kind != NormKind::kLayerNorm) p.beta = nullptr;
  p.kind = r.kind;
  p.rows = pl.rows;
  p.hidden = pl.hidden;
  p.eps = float(r.eps);
  p.zero_centered_gamma = r.zero_centered_gamma;
  p.x_dtype = r.x.dtype;
  p.gamma_dtype = r.gamma.dtype;
  if (pl.path == NormPath::kPlain) {
    p.y = io.out[kRowData];
    p.out_dtype = r.otype;
    launch_fwd(p, ctx);
    return;
  }
  char* ws = static_cast<char*>(io.workspace);
  const QuantSpec& cs = pl.cast.spec;
  if (pl.path == NormPath::kFusedFp8 || pl.path == NormPath::kFusedMxfp8) {
    p.y = io.out[kRowData];
    p.e4m3 = cs.e4m3();
    p.noop = cs.noop;
    if (pl.path == NormPath::kFusedMxfp8) {
      p.fp8_mode = 3;
      p.mx_scale = static_cast<uint8_t*>(io.out[kRowScaleInv]);
      p.mx_swizzled = cs.swizzled();
    } else {
      p.scale_inv = static_cast<float*>(io.out[kRowScaleInv]);
      if (cs.kind == QuantKind::kFp8Delayed) {
        p.fp8_mode = 1;
        p.scale = cs.scale;
        p.amax = cs.amax;
      } else {
        p.force_pow2 = cs.force_pow2();
        p.amax_epsilon = float(cs.amax_epsilon);
        p.fp8_mode = cs.amax != nullptr ? 4 : 2;
        p.amax = cs.amax != nullptr ? cs.amax : reinterpret_cast<float*>(ws + pl.amax_offset);
        p.amax_out = pl.pieces[kAmaxRow].present ? static_cast<float*>(io.out[kAmaxRow]) : nullptr;
      }
    }
    launch_fwd(p, ctx);
#if defined(TE_WITH_CUDA)
    if (pl.transpose_copy) {
      run_rewrapping_errors([&] {
        transpose_bytes_cuda(static_cast<const uint8_t*>(io.out[kRowData]), pl.rows, pl.hidden,
                             static_cast<uint8_t*>(io.out[kColData]), ctx.stream, cs.noop);
      });
    }
#endif
    return;
  }
  p.y = ws + pl.y_offset;
  p.out_dtype = DType::kFloat32;
  launch_fwd(p, ctx);
  ActIO cio;
  cio.x = p.y;
  for (int i = 0; i < kNumPieces; ++i) cio.out[i] = io.out[i];
  cio.workspace = ws + pl.cast_ws_offset;
  cio.workspace_bytes = pl.cast.workspace_bytes;
  run_act(pl.cast, cio, ctx);
}

NormBwdPlan plan_norm_bwd(const NormBwdRequest& r, const ExecCtx& ctx) {
  NormBwdPlan pl;
  const int64_t h = start_plan(pl, r, "x", ctx);
  const char* op = r.op;
  const bool ln = r.kind == NormKind::kLayerNorm;
  if (r.dz.dtype != r.x.dtype) {
    fail(ErrorKind::kType, msg(std::string(op), ": dz dtype ", dtype_name(r.dz.dtype), " must match x dtype ",
                               dtype_name(r.x.dtype)));
  }
  if (r.dz.shape != r.x.shape) {
    fail(ErrorKind::kValue, msg(std::string(op), ": dz has shape ", shape_str(r.dz.shape), " but x has shape ",
                                shape_str(r.x.shape), "; pass the gradient of the forward output"));
  }
  if (ln && !r.has_mu) fail(ErrorKind::kValue, msg(std::string(op), ": LayerNorm backward needs mu"));
  if (ln) check_stat(op, "mu", r.mu, r.x, pl.rows, ctx);
  check_stat(op, "rsigma", r.rsigma, r.x, pl.rows, ctx);
  check_param(op, "gamma", r.gamma, r.x, h, ctx);
  set(pl.dx, r.x.dtype, r.x.shape);
  set(pl.dgamma, r.gamma.dtype, Shape::of(h));
  if (ln) set(pl.dbeta, r.gamma.dtype, Shape::of(h));
  pl.part_blocks = norm_bwd_blocks(pl.rows, h);
  int64_t ws = 0;
  pl.dgamma_offset = take(ws, 4 * pl.part_blocks * h);
  if (ln) pl.dbeta_offset = take(ws, 4 * pl.part_blocks * h);
  pl.workspace_bytes = ws;
  return pl;
}

void run_norm_bwd(const NormBwdPlan& pl, const NormBwdIO& io, const ExecCtx& ctx) {
  const NormBwdRequest& r = pl.req;
  check_ws(r.op, io.workspace_bytes, pl.workspace_bytes);
  char* ws = static_cast<char*>(io.workspace);
  NormBwdParams p;
  static_cast<NormBwdTensors&>(p) = io;
  if (r.kind != NormKind::kLayerNorm) {
    p.mu = nullptr;
    p.dbeta = nullptr;
  }
  p.kind = r.kind;
  p.dgamma_part = reinterpret_cast<float*>(ws + pl.dgamma_offset);
  p.dbeta_part = pl.dbeta_offset >= 0 ? reinterpret_cast<float*>(ws + pl.dbeta_offset) : nullptr;
  p.rows = pl.rows;
  p.hidden = pl.hidden;
  p.zero_centered_gamma = r.zero_centered_gamma;
  p.x_dtype = r.x.dtype;
  p.gamma_dtype = r.gamma.dtype;
  run_rewrapping_errors(
      [&] { TE_ON_DEVICE(ctx, norm_bwd_cuda(p, ctx.stream), norm_bwd_cpu(p, *ctx.parallel_for)); });
}

}  // namespace ops
}  // namespace te
