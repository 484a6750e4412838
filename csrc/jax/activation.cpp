// XLA FFI handlers of the activation / cast family (SPEC §3, §4, §5): act_lu, dact_lu_dbias_quantize, quantize and
// dbias_quantize. Each decodes XLA's buffers and attributes into the core's request and quantizer spec, lets the
// core plan and run the call (csrc/core/ops) into the results XLA allocated from the same plan (transformer_engine_jax
// asks `_ffi.plan_act` for their shapes at trace time), and returns the core's errors as XLA FFI errors.
//
// Arguments, results and attributes, in the order the Python calls pass them:
//   args     [dz] x scale amax rng       dz: backward only; x [..., A, K] (A = 2: gated, activated half first);
//                                        scale f32[1] (delayed scaling); amax f32[1] (delayed: accumulated; current
//                                        scaling and NVFP4 with amax_given: the reduced amax to use); rng i64[2] (NVFP4
//                                        stochastic rounding: seed, offset); each 0 elements where not read
//   results  row_data col_data row_scale_inv col_scale_inv amax col_amax [dbias] workspace
//            a piece the plan leaves out is a 0-element result; `amax` (aliased to the amax argument where that is
//            read): delayed scaling's running amax, NVFP4's rowwise global amax, current scaling's amax; col_amax:
//            NVFP4's columnwise global amax.
//   attrs    act (the core's ActKind; not for quantize), quantizer {scaling_mode, q_dtype, q_layout, flags,
//            amax_epsilon, amax_given, amax_only, dbias_fp32}, act_params {limit, alpha, offset} (clamped SwiGLU),
//            [is_dbias]
#include "ffi_common.h"
#include "quantizer_attrs.h"

namespace te_jax {
namespace {

using te::ops::ActPlan;
using te::ops::Piece;
using Buf = ffi::AnyBuffer;
using Ret = ffi::Result<ffi::AnyBuffer>;

// The results every op of the family has, in binding order.
struct QuantResults {
  Ret row_data, col_data, row_scale_inv, col_scale_inv, amax, col_amax;
};

struct Call {
  const char* op;
  te::ActKind kind;
  bool backward, with_dbias;
  te::ActArgs args;
};

te::ActArgs act_args_of(const ActParams& p) {
  te::ActArgs a;
  a.limit = p.limit;
  a.alpha = p.alpha;
  a.glu_linear_offset = p.offset;
  return a;
}

// Binds an XLA result to a planned piece, checking that it has the bytes the plan asked for (Python allocated it
// from the same plan: a mismatch is a bug, reported, never written past).
void bind_piece(const ActPlan& plan, Piece p, Ret& r, te::ops::ActIO& io) {
  if (!plan.pieces[p].present) return;
  const int64_t want = plan.pieces[p].bytes();
  if (int64_t(r->size_bytes()) != want) {
    te::fail(te::ErrorKind::kRuntime, std::string(plan.req.op) + ": result " + te::ops::piece_name(p) + " has " +
                                          std::to_string(r->size_bytes()) + " bytes, the plan needs " +
                                          std::to_string(want) + "; transformer_engine_jax and its _ffi disagree");
  }
  io.out[p] = r->untyped_data();
}

// One call of the family: request + spec from XLA's buffers and attributes, plan, bind, run. Throws te::Error.
void run(const te::ops::ExecCtx& ctx, const Call& c, const Buf* dz, const Buf& x, const Buf& scale, const Buf& rng,
         QuantResults q, Ret* dbias, Ret& workspace, const QuantizerAttrs& qa) {
  te::ops::ActRequest r;
  r.op = c.op;
  r.kind = c.kind;
  r.backward = c.backward;
  r.with_dbias = c.with_dbias;
  r.args = c.args;
  // x [..., A, K] is the core's [..., A*K]; the plain casts take x as it is.
  const bool split = c.kind != te::ActKind::kIdentity && x.dimensions().size() >= 2;
  r.x = view_of(x, c.op, "x", split ? 2 : 1);
  if (dz != nullptr) {
    r.has_grad = true;
    r.grad = view_of(*dz, c.op, "dz");
  }
  te::ops::QuantSpec spec = spec_of(c.op, qa);
  // Where the handler reads the amax argument (delayed scaling, a given amax), Python aliases it to the amax result
  // (one pointer, written in place); elsewhere the argument is a 0-element placeholder.
  float* amax = static_cast<float*>(q.amax->untyped_data());
  const bool reads_amax = spec.kind == te::QuantKind::kFp8Delayed ||
                          ((spec.kind == te::QuantKind::kFp8Current || spec.kind == te::QuantKind::kNvfp4) &&
                           qa.amax_given);
  if ((spec.kind == te::QuantKind::kFp8Delayed && scale.size_bytes() != sizeof(float)) ||
      (reads_amax && q.amax->size_bytes() != sizeof(float))) {
    te::fail(te::ErrorKind::kValue, std::string(c.op) + ": the scale and amax arguments of this quantizer must be "
                                                        "float32[1]; transformer_engine_jax and its _ffi disagree");
  }
  if (spec.kind == te::QuantKind::kFp8Delayed) {
    spec.scale = static_cast<const float*>(scale.untyped_data());
    spec.amax = amax;
  } else if ((spec.kind == te::QuantKind::kFp8Current || spec.kind == te::QuantKind::kNvfp4) && qa.amax_given) {
    spec.amax = amax;
  }
  ActPlan plan = te::ops::plan_act(r, spec, ctx, plan_options(spec, qa));
  if (plan.needs_rng()) plan.spec.rng = rng_of(rng, ctx);
  te::ops::ActIO io;
  io.x = x.untyped_data();
  io.grad = dz != nullptr ? dz->untyped_data() : nullptr;
  bind_piece(plan, te::ops::kRowData, q.row_data, io);
  bind_piece(plan, te::ops::kColData, q.col_data, io);
  bind_piece(plan, te::ops::kRowScaleInv, q.row_scale_inv, io);
  bind_piece(plan, te::ops::kColScaleInv, q.col_scale_inv, io);
  bind_piece(plan, te::ops::kAmaxRow, q.amax, io);
  bind_piece(plan, te::ops::kAmaxCol, q.col_amax, io);
  if (dbias != nullptr) bind_piece(plan, te::ops::kGradBias, *dbias, io);
  bind_workspace(io, workspace);
  te::ops::run_act(plan, io, ctx);
}

// Bindings: arguments, the six quantized results, [dbias], workspace, then attributes.
constexpr int kQuantResults = 6;
// The attributes the forward and the backward share.
template <class B> auto act_attrs(B&& b) {
  return std::move(b)
      .template Attr<int64_t>("act")
      .template Attr<QuantizerAttrs>("quantizer")
      .template Attr<ActParams>("act_params");
}
template <class B> auto act_lu_binding(B b) { return act_attrs(bind_buffers<4, kQuantResults + 1>(std::move(b))); }
template <class B> auto dact_lu_binding(B b) {
  return act_attrs(bind_buffers<5, kQuantResults + 2>(std::move(b))).template Attr<bool>("is_dbias");
}
template <class B> auto quantize_binding(B b) {
  return bind_buffers<4, kQuantResults + 2>(std::move(b))
      .template Attr<QuantizerAttrs>("quantizer")
      .template Attr<bool>("is_dbias");
}

ffi::Error act_lu(const te::ops::ExecCtx& ctx, Buf x, Buf scale, Buf /*amax: aliased*/, Buf rng, Ret row_data,
                  Ret col_data, Ret row_scale_inv, Ret col_scale_inv, Ret amax, Ret col_amax, Ret workspace,
                  int64_t act, QuantizerAttrs qa, ActParams p) {
  return guarded([&] {
    const Call c{"act_lu", te::ops::act_kind("act_lu", act), false, false, act_args_of(p)};
    run(ctx, c, nullptr, x, scale, rng, {row_data, col_data, row_scale_inv, col_scale_inv, amax, col_amax}, nullptr,
        workspace, qa);
  });
}

// dx of a gated activation is [..., 2, K] ([d_a | d_b]); dbias is taken for unary activations only (the core says
// so by name when asked for a gated one).
ffi::Error dact_lu(const te::ops::ExecCtx& ctx, Buf dz, Buf x, Buf scale, Buf /*amax*/, Buf rng, Ret row_data,
                   Ret col_data, Ret row_scale_inv, Ret col_scale_inv, Ret amax, Ret col_amax, Ret dbias,
                   Ret workspace, int64_t act, QuantizerAttrs qa, ActParams p, bool is_dbias) {
  return guarded([&] {
    const Call c{"dact_lu_dbias_quantize", te::ops::act_kind("dact_lu_dbias_quantize", act), true, is_dbias,
                 act_args_of(p)};
    run(ctx, c, &dz, x, scale, rng, {row_data, col_data, row_scale_inv, col_scale_inv, amax, col_amax},
        is_dbias ? &dbias : nullptr, workspace, qa);
  });
}

// quantize (is_dbias false) and dbias_quantize: the identity op of the family, dbias = column sums of x.
ffi::Error quantize(const te::ops::ExecCtx& ctx, Buf x, Buf scale, Buf /*amax*/, Buf rng, Ret row_data, Ret col_data,
                    Ret row_scale_inv, Ret col_scale_inv, Ret amax, Ret col_amax, Ret dbias, Ret workspace,
                    QuantizerAttrs qa, bool is_dbias) {
  return guarded([&] {
    const Call c{is_dbias ? "dbias_quantize" : "quantize", te::ActKind::kIdentity, false, is_dbias, te::ActArgs{}};
    run(ctx, c, nullptr, x, scale, rng, {row_data, col_data, row_scale_inv, col_scale_inv, amax, col_amax},
        is_dbias ? &dbias : nullptr, workspace, qa);
  });
}

}  // namespace
}  // namespace te_jax

TE_JAX_HANDLERS(TeActLu, te_jax::act_lu, te_jax::act_lu_binding);
TE_JAX_HANDLERS(TeDactLuDbiasQuantize, te_jax::dact_lu, te_jax::dact_lu_binding);
TE_JAX_HANDLERS(TeQuantize, te_jax::quantize, te_jax::quantize_binding);
