// XLA FFI handlers of LayerNorm / RMSNorm (SPEC §11): te_norm_fwd and te_norm_bwd. Each decodes XLA's buffers and
// attributes into the core's norm request (norm.h) and quantizer spec, lets the core plan and run the call
// (csrc/core/ops/norm_op.h) into the results XLA allocated from the same plan (transformer_engine_jax/normalization.py
// asks `_ffi.plan_norm_fwd` / `plan_norm_bwd` for their shapes at trace time), and returns the core's errors as XLA
// FFI errors.
//
// te_norm_fwd
//   args     x [..., H]; gamma [H]; beta [H] (LayerNorm; RMSNorm: 0 elements); scale amax rng as the activation
//            family's (activation.cpp): delayed scaling's scale f32[1], the amax the call reads (aliased to the amax
//            result) or a 0-element placeholder, NVFP4's stochastic-rounding key
//   results  row_data col_data row_scale_inv col_scale_inv amax col_amax mu rsigma workspace; a piece the plan leaves
//            out is a 0-element result (RMSNorm's mu)
//   attrs    norm_type (0 layernorm, 1 rmsnorm), zero_centered_gamma, epsilon (f64), otype (the plain output's DType
//            code), quantizer (quantizer_attrs.h)
// te_norm_bwd
//   args     dz [..., H]; x [..., H]; mu f32 (LayerNorm; RMSNorm: 0 elements); rsigma f32; gamma [H]
//   results  dx dgamma dbeta (RMSNorm: 0 elements) workspace
//   attrs    norm_type, zero_centered_gamma
#include "norm.h"

#include "quantizer_attrs.h"

namespace te_jax {

te::NormKind norm_kind(int64_t code) {
  if (code != 0 && code != 1) {
    te::fail(te::ErrorKind::kValue, "normalization: norm_type " + std::to_string(code) +
                                        " is not known; accepted: 0 layernorm, 1 rmsnorm");
  }
  return te::NormKind(code);
}

namespace {

// The fields a forward and a backward request share: the kind, the op's name for messages ("layernorm_<dir>",
// "rmsnorm_<dir>"), x, gamma and zero_centered_gamma.
template <typename Request>
Request norm_request(int64_t norm_type, const char* ln_op, const char* rms_op, bool zero_centered_gamma,
                     const te::ops::TensorView& x, const te::ops::TensorView& gamma) {
  Request r;
  r.kind = norm_kind(norm_type);
  r.op = r.kind == te::NormKind::kLayerNorm ? ln_op : rms_op;
  r.x = x;
  r.gamma = gamma;
  r.zero_centered_gamma = zero_centered_gamma;
  return r;
}

}  // namespace

te::ops::NormFwdRequest norm_fwd_request(int64_t norm_type, bool zero_centered_gamma, double epsilon, int64_t otype,
                                         const te::ops::TensorView& x, const te::ops::TensorView& gamma,
                                         bool has_beta, const te::ops::TensorView& beta) {
  auto r = norm_request<te::ops::NormFwdRequest>(norm_type, "layernorm_fwd", "rmsnorm_fwd", zero_centered_gamma, x,
                                                 gamma);
  r.has_beta = has_beta;
  if (has_beta) r.beta = beta;
  r.eps = epsilon;
  r.otype = te::DType(otype);
  return r;
}

te::ops::NormBwdRequest norm_bwd_request(int64_t norm_type, bool zero_centered_gamma, const te::ops::TensorView& dz,
                                         const te::ops::TensorView& x, bool has_mu, const te::ops::TensorView& mu,
                                         const te::ops::TensorView& rsigma, const te::ops::TensorView& gamma) {
  auto r = norm_request<te::ops::NormBwdRequest>(norm_type, "layernorm_bwd", "rmsnorm_bwd", zero_centered_gamma, x,
                                                 gamma);
  r.dz = dz;
  r.has_mu = has_mu;
  if (has_mu) r.mu = mu;
  r.rsigma = rsigma;
  return r;
}

namespace {

using te::ops::Piece;
using Buf = ffi::AnyBuffer;
using Ret = ffi::Result<ffi::AnyBuffer>;

// An XLA result bound to a planned piece, checked to have the bytes the plan asked for (Python allocated it from the
// same plan: a mismatch is a bug, reported, never written past); null for an absent piece.
void* bound(const char* op, const te::ops::PiecePlan& p, const char* name, Ret& r) {
  if (!p.present) return nullptr;
  if (int64_t(r->size_bytes()) != p.bytes()) {
    te::fail(te::ErrorKind::kRuntime, std::string(op) + ": result " + name + " has " +
                                          std::to_string(r->size_bytes()) + " bytes, the plan needs " +
                                          std::to_string(p.bytes()) + "; transformer_engine_jax and its _ffi disagree");
  }
  return r->untyped_data();
}

ffi::Error norm_fwd(const te::ops::ExecCtx& ctx, Buf x, Buf gamma, Buf beta, Buf scale, Buf /*amax: aliased*/,
                    Buf rng, Ret row_data, Ret col_data, Ret row_scale_inv, Ret col_scale_inv, Ret amax, Ret col_amax,
                    Ret mu, Ret rsigma, Ret workspace, int64_t norm_type, bool zero_centered_gamma, double epsilon,
                    int64_t otype, QuantizerAttrs qa) {
  return guarded([&] {
    const bool has_beta = beta.element_count() > 0;
    const char* op = norm_type == 1 ? "rmsnorm_fwd" : "layernorm_fwd";
    const te::ops::NormFwdRequest r =
        norm_fwd_request(norm_type, zero_centered_gamma, epsilon, otype, view_of(x, op, "x"),
                         view_of(gamma, op, "gamma"), has_beta, has_beta ? view_of(beta, op, "beta") : te::ops::TensorView{});
    te::ops::QuantSpec spec = spec_of(r.op, qa);
    // As the activation family's: delayed scaling reads its scale and accumulates into the amax result (aliased to
    // the amax argument); current scaling and NVFP4 read a given amax there.
    float* amax_ptr = static_cast<float*>(amax->untyped_data());
    const bool reads_amax = spec.kind == te::QuantKind::kFp8Delayed ||
                            ((spec.kind == te::QuantKind::kFp8Current || spec.kind == te::QuantKind::kNvfp4) &&
                             qa.amax_given);
    if ((spec.kind == te::QuantKind::kFp8Delayed && scale.size_bytes() != sizeof(float)) ||
        (reads_amax && amax->size_bytes() != sizeof(float))) {
      te::fail(te::ErrorKind::kValue, std::string(r.op) + ": the scale and amax arguments of this quantizer must be "
                                                          "float32[1]; transformer_engine_jax and its _ffi disagree");
    }
    if (spec.kind == te::QuantKind::kFp8Delayed) spec.scale = static_cast<const float*>(scale.untyped_data());
    if (reads_amax) spec.amax = amax_ptr;
    te::ops::NormFwdPlan plan = te::ops::plan_norm_fwd(r, spec, ctx, plan_options(spec, qa));
    if (plan.spec.kind == te::QuantKind::kNvfp4 && plan.spec.stochastic_rounding()) {
      plan.spec.rng = rng_of(rng, ctx);
      if (plan.has_cast) plan.cast.spec.rng = plan.spec.rng;
    }
    te::ops::NormFwdIO io;
    io.x = x.untyped_data();
    io.gamma = gamma.untyped_data();
    io.beta = has_beta ? beta.untyped_data() : nullptr;
    const std::pair<Piece, Ret*> pieces[] = {
        {te::ops::kRowData, &row_data},         {te::ops::kColData, &col_data}, {te::ops::kRowScaleInv, &row_scale_inv},
        {te::ops::kColScaleInv, &col_scale_inv}, {te::ops::kAmaxRow, &amax},     {te::ops::kAmaxCol, &col_amax}};
    for (const auto& [p, ret] : pieces) io.out[p] = bound(r.op, plan.pieces[p], te::ops::piece_name(p), *ret);
    io.mu = static_cast<float*>(bound(r.op, plan.mu, "mu", mu));
    io.rsigma = static_cast<float*>(bound(r.op, plan.rsigma, "rsigma", rsigma));
    bind_workspace(io, workspace);
    te::ops::run_norm_fwd(plan, io, ctx);
  });
}

ffi::Error norm_bwd(const te::ops::ExecCtx& ctx, Buf dz, Buf x, Buf mu, Buf rsigma, Buf gamma, Ret dx, Ret dgamma,
                    Ret dbeta, Ret workspace, int64_t norm_type, bool zero_centered_gamma) {
  return guarded([&] {
    const bool has_mu = norm_type == 0;
    const char* op = has_mu ? "layernorm_bwd" : "rmsnorm_bwd";
    const te::ops::NormBwdRequest r =
        norm_bwd_request(norm_type, zero_centered_gamma, view_of(dz, op, "dz"), view_of(x, op, "x"), has_mu,
                         has_mu ? view_of(mu, op, "mu") : te::ops::TensorView{}, view_of(rsigma, op, "rsigma"),
                         view_of(gamma, op, "gamma"));
    const te::ops::NormBwdPlan plan = te::ops::plan_norm_bwd(r, ctx);
    te::ops::NormBwdIO io;
    io.dz = dz.untyped_data();
    io.x = x.untyped_data();
    io.mu = has_mu ? static_cast<const float*>(mu.untyped_data()) : nullptr;
    io.rsigma = static_cast<const float*>(rsigma.untyped_data());
    io.gamma = gamma.untyped_data();
    io.dx = bound(r.op, plan.dx, "dx", dx);
    io.dgamma = bound(r.op, plan.dgamma, "dgamma", dgamma);
    io.dbeta = bound(r.op, plan.dbeta, "dbeta", dbeta);
    bind_workspace(io, workspace);
    te::ops::run_norm_bwd(plan, io, ctx);
  });
}

// Bindings: arguments, results, then attributes, the two both directions take first.
template <class B> auto norm_attrs(B&& b) {
  return std::move(b).template Attr<int64_t>("norm_type").template Attr<bool>("zero_centered_gamma");
}
template <class B> auto norm_fwd_binding(B b) {
  return norm_attrs(bind_buffers<6, 9>(std::move(b)))
      .template Attr<double>("epsilon")
      .template Attr<int64_t>("otype")
      .template Attr<QuantizerAttrs>("quantizer");
}
template <class B> auto norm_bwd_binding(B b) { return norm_attrs(bind_buffers<5, 4>(std::move(b))); }

}  // namespace
}  // namespace te_jax

TE_JAX_HANDLERS(TeNormFwd, te_jax::norm_fwd, te_jax::norm_fwd_binding);
TE_JAX_HANDLERS(TeNormBwd, te_jax::norm_bwd, te_jax::norm_bwd_binding);
