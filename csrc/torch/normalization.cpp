// LayerNorm / RMSNorm ops (SPEC §11) on torch tensors: the core plans the call (csrc/core/ops/norm_op.h: checks,
// output pieces, workspace), this file allocates what the plan asks for and lets the core run it on the current
// stream. The fake kernels' shapes come from the same planner (plan_norm_outputs, exposed through _C).
#include "../core/ops/norm_op.h"
#include "bridge.h"

namespace te_torch {
namespace {

using NormOut = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

// The core's DType of a plain output type code (tex.DType int).
te::DType otype_of(int64_t otype) { return static_cast<te::DType>(otype); }

void check_same_device(const Tensor& t, const Tensor& x, const char* op, const char* what) {
  TORCH_CHECK_VALUE(t.device() == x.device(), op, ": ", what, " is on ", t.device().str(), " but input is on ",
                    x.device().str(), "; move both to one device");
}

// A parameter tensor's core DType: float32/float16/bfloat16, else TypeError naming it.
te::DType param_dtype(const Tensor& t, const char* op, const char* what) { return input_dtype(t, op, what); }

NormOut norm_fwd(te::NormKind kind, const char* op, const Tensor& input, const Tensor& weight,
                 const c10::optional<Tensor>& bias, double eps, int64_t otype, bool zero_centered_gamma,
                 te::ops::QuantSpec spec) {
  te::ops::NormFwdRequest r;
  r.op = op;
  r.kind = kind;
  const te::DType xdt = input_dtype(input, op, "input");
  const Tensor x = input.contiguous();
  check_same_device(weight, input, op, "weight");
  const Tensor g = weight.contiguous();
  r.x = view_of(x, xdt, op);
  r.gamma = view_of(g, param_dtype(g, op, "weight"), op);
  Tensor b;
  if (bias.has_value()) {
    check_same_device(*bias, input, op, "bias");
    b = bias->contiguous();
    r.has_beta = true;
    r.beta = view_of(b, param_dtype(b, op, "bias"), op);
  }
  r.eps = eps;
  r.zero_centered_gamma = zero_centered_gamma;
  r.otype = otype_of(otype);
  TE_DEVICE_GUARD(x);
  const te::ops::ExecCtx ctx = exec_ctx(x);
  te::ops::NormFwdPlan plan = te::ops::plan_norm_fwd(r, spec, ctx);
  const at::TensorOptions options = x.options();
  Tensor out[te::ops::kNumPieces];
  te::ops::NormFwdIO io;
  io.x = x.data_ptr();
  io.gamma = g.data_ptr();
  io.beta = b.defined() ? b.data_ptr() : nullptr;
  for (int i = 0; i < te::ops::kAmaxCol + 1; ++i) {
    if (plan.pieces[i].present) {
      out[i] = alloc_piece(plan.pieces[i], options);
      io.out[i] = out[i].data_ptr();
    } else {
      out[i] = new_placeholder(x, absent_dtype(te::ops::Piece(i), plan.spec.kind));
    }
  }
  Tensor mu = plan.mu.present ? alloc_piece(plan.mu, options) : new_placeholder(x, at::kFloat);
  Tensor rsigma = alloc_piece(plan.rsigma, options);
  io.mu = plan.mu.present ? mu.data_ptr<float>() : nullptr;
  io.rsigma = rsigma.data_ptr<float>();
  if (plan.has_cast && plan.cast.needs_rng()) plan.cast.spec.rng = nvfp4_rng_state(-1, 0, x);
  Tensor workspace;
  if (plan.workspace_bytes > 0) {
    workspace = new_empty_in_guard({plan.workspace_bytes}, options.dtype(at::kByte));
    io.workspace = workspace.data_ptr();
    io.workspace_bytes = plan.workspace_bytes;
  }
  te::ops::run_norm_fwd(plan, io, ctx);
  return {out[0], out[1], out[2], out[3], out[4], out[5], mu, rsigma};
}

NormOut layernorm_fwd(const Tensor& input, const Tensor& weight, const Tensor& bias, double eps, int64_t otype,
                      int64_t /*sm_margin*/, bool zero_centered_gamma, TE_QSPEC_PARAMS) {
  return with_torch_errors([&] {
    return norm_fwd(te::NormKind::kLayerNorm, "layernorm_fwd", input, weight, bias, eps, otype, zero_centered_gamma,
                    TE_QSPEC_ARGS("layernorm_fwd", input));
  });
}

NormOut rmsnorm_fwd(const Tensor& input, const Tensor& weight, double eps, int64_t otype, int64_t /*sm_margin*/,
                    bool zero_centered_gamma, TE_QSPEC_PARAMS) {
  return with_torch_errors([&] {
    return norm_fwd(te::NormKind::kRmsNorm, "rmsnorm_fwd", input, weight, c10::nullopt, eps, otype,
                    zero_centered_gamma, TE_QSPEC_ARGS("rmsnorm_fwd", input));
  });
}

std::tuple<Tensor, Tensor, Tensor> norm_bwd(te::NormKind kind, const char* op, const Tensor& dz, const Tensor& x_in,
                                            const c10::optional<Tensor>& mu_in, const Tensor& rsigma_in,
                                            const Tensor& gamma_in, bool zero_centered_gamma) {
  te::ops::NormBwdRequest r;
  r.op = op;
  r.kind = kind;
  const te::DType xdt = input_dtype(x_in, op, "x");
  TORCH_CHECK_TYPE(dz.scalar_type() == x_in.scalar_type(), op, ": dz dtype ", dtype_name(dz.scalar_type()),
                   " must match x dtype ", dtype_name(x_in.scalar_type()));
  check_same_device(dz, x_in, op, "dz");
  check_same_device(rsigma_in, x_in, op, "rsigma");
  check_same_device(gamma_in, x_in, op, "gamma");
  TORCH_CHECK_TYPE(rsigma_in.scalar_type() == at::kFloat, op, ": rsigma must be Float (FP32), got ",
                   dtype_name(rsigma_in.scalar_type()));
  const Tensor x = x_in.contiguous(), d = dz.contiguous(), rs = rsigma_in.contiguous(), g = gamma_in.contiguous();
  Tensor mu;
  r.x = view_of(x, xdt, op);
  r.dz = view_of(d, xdt, op);
  r.rsigma = view_of(rs, te::DType::kFloat32, op);
  r.gamma = view_of(g, param_dtype(g, op, "gamma"), op);
  if (mu_in.has_value()) {
    check_same_device(*mu_in, x_in, op, "mu");
    TORCH_CHECK_TYPE(mu_in->scalar_type() == at::kFloat, op, ": mu must be Float (FP32), got ",
                     dtype_name(mu_in->scalar_type()));
    mu = mu_in->contiguous();
    r.has_mu = true;
    r.mu = view_of(mu, te::DType::kFloat32, op);
  }
  r.zero_centered_gamma = zero_centered_gamma;
  TE_DEVICE_GUARD(x);
  const te::ops::ExecCtx ctx = exec_ctx(x);
  const te::ops::NormBwdPlan plan = te::ops::plan_norm_bwd(r, ctx);
  const at::TensorOptions options = x.options();
  Tensor dx = alloc_piece(plan.dx, options), dgamma = alloc_piece(plan.dgamma, options);
  Tensor dbeta = plan.dbeta.present ? alloc_piece(plan.dbeta, options) : new_placeholder(x, g.scalar_type());
  te::ops::NormBwdIO io;
  io.dz = d.data_ptr();
  io.x = x.data_ptr();
  io.mu = mu.defined() ? mu.data_ptr<float>() : nullptr;
  io.rsigma = rs.data_ptr<float>();
  io.gamma = g.data_ptr();
  io.dx = dx.data_ptr();
  io.dgamma = dgamma.data_ptr();
  io.dbeta = plan.dbeta.present ? dbeta.data_ptr() : nullptr;
  Tensor workspace = new_empty_in_guard({plan.workspace_bytes}, options.dtype(at::kByte));
  io.workspace = workspace.data_ptr();
  io.workspace_bytes = plan.workspace_bytes;
  te::ops::run_norm_bwd(plan, io, ctx);
  return {dx, dgamma, dbeta};
}

std::tuple<Tensor, Tensor, Tensor> layernorm_bwd(const Tensor& dz, const Tensor& x, const Tensor& mu,
                                                 const Tensor& rsigma, const Tensor& gamma, int64_t /*sm_margin*/,
                                                 bool zero_centered_gamma) {
  return with_torch_errors([&] {
    return norm_bwd(te::NormKind::kLayerNorm, "layernorm_bwd", dz, x, mu, rsigma, gamma, zero_centered_gamma);
  });
}

std::tuple<Tensor, Tensor> rmsnorm_bwd(const Tensor& dz, const Tensor& x, const Tensor& rsigma, const Tensor& gamma,
                                       int64_t /*sm_margin*/, bool zero_centered_gamma) {
  return with_torch_errors([&] {
    auto [dx, dgamma, dbeta] =
        norm_bwd(te::NormKind::kRmsNorm, "rmsnorm_bwd", dz, x, c10::nullopt, rsigma, gamma, zero_centered_gamma);
    (void)dbeta;
    return std::make_tuple(dx, dgamma);
  });
}

}  // namespace

std::vector<std::pair<std::vector<int64_t>, at::ScalarType>> plan_norm_outputs(
    bool layernorm, const MetaTensor& x, const MetaTensor& gamma, const c10::optional<MetaTensor>& beta, double eps,
    int64_t otype, bool zero_centered_gamma, const MetaSpec& m) {
  const char* op = layernorm ? "layernorm_fwd" : "rmsnorm_fwd";
  return with_torch_errors([&] {
    te::ops::QuantSpec s;
    if (m.qkind != 0) {
      s = te::ops::make_spec(op, m.qkind, m.qdtype, m.rowwise, m.columnwise, m.qflags, m.amax_epsilon, m.block_dim,
                             m.has_scale, m.has_amax);
    }
    te::ops::NormFwdRequest r;
    r.op = op;
    r.kind = layernorm ? te::NormKind::kLayerNorm : te::NormKind::kRmsNorm;
    r.x.dtype = input_dtype(x.dtype, x.sizes, x.device, op, "input");
    r.x.shape = shape_of(x.sizes, x.device, op);
    r.gamma.dtype = input_dtype(gamma.dtype, gamma.sizes, gamma.device, op, "weight");
    r.gamma.shape = shape_of(gamma.sizes, gamma.device, op);
    if (beta) {
      r.has_beta = true;
      r.beta.dtype = input_dtype(beta->dtype, beta->sizes, beta->device, op, "bias");
      r.beta.shape = shape_of(beta->sizes, beta->device, op);
    }
    r.eps = eps;
    r.zero_centered_gamma = zero_centered_gamma;
    r.otype = otype_of(otype);
    te::ops::ExecCtx ctx;
    ctx.cuda = x.device.is_cuda();
    ctx.device_index = ctx.cuda ? x.device.index() : -1;
    const te::ops::NormFwdPlan plan = te::ops::plan_norm_fwd(r, s, ctx);
    std::vector<std::pair<std::vector<int64_t>, at::ScalarType>> out;
    const auto add = [&](const te::ops::PiecePlan& pc, at::ScalarType absent) {
      if (pc.present) {
        out.emplace_back(std::vector<int64_t>(pc.shape.dims, pc.shape.dims + pc.shape.ndim), scalar_type_of(pc.dtype));
      } else {
        out.emplace_back(std::vector<int64_t>{0}, absent);
      }
    };
    for (int i = 0; i <= te::ops::kAmaxCol; ++i) add(plan.pieces[i], absent_dtype(te::ops::Piece(i), plan.spec.kind));
    add(plan.mu, at::kFloat);  // RMSNorm: a 0-element placeholder
    add(plan.rsigma, at::kFloat);
    return out;
  });
}

static void normalization_impls(torch::Library& m) {
  m.impl("layernorm_fwd", &layernorm_fwd);
  m.impl("rmsnorm_fwd", &rmsnorm_fwd);
  m.impl("layernorm_bwd", &layernorm_bwd);
  m.impl("rmsnorm_bwd", &rmsnorm_bwd);
}
TE_IMPL_CPU_AND_CUDA(normalization_impls)

}  // namespace te_torch
