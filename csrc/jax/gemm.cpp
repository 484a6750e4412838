// XLA FFI handler of the GEMM (SPEC §6): te_gemm. It decodes XLA's buffers and attributes into the core's request
// (gemm.h), lets the core plan the call with XLA's results as the outputs to check, and runs it (csrc/core/ops/gemm_op:
// the CPU kernel, or cuBLASLt with the unfused epilogue where it has no kernel). transformer_engine_jax asks
// `_ffi.plan_gemm` for the results' shapes and the workspace at trace time.
//
// Arguments, results and attributes, in the order the Python call passes them:
//   args     lhs lhs_scale_inv rhs rhs_scale_inv bias gelu_input global_amax
//            lhs/rhs: the stored copies as 2-D buffers (gemm.h); *_scale_inv: f32[1] (FP8 per tensor) or the SPEC §4.8
//            block-scale matrix (MXFP8, NVFP4, FP8 block), 0 elements for plain operands; bias [N] (fuse_bias,
//            forward); gelu_input [M, N] (fuse_gelu with grad); global_amax f32[2] (NVFP4: lhs's and rhs's copies'
//            global amaxes, folded into alpha by the core); 0 elements where not used.
//   results  out [M, N]; pre_gelu_out [M, N] (fuse_gelu, forward); bias_grad ([N] with fuse_gelu, [M] without:
//            fuse_bias with grad); workspace (uint8, aligned up to 256 B here: the cuBLASLt workspace and the
//            unfused epilogue's FP32 accumulator). A result the call does not write has 0 elements.
//   attrs    lhs_transposed rhs_transposed lhs_scaling rhs_scaling fuse_bias fuse_gelu grad use_split_accumulator
//            allow_tf32 (gemm.h GemmAttrs)
//
// The cuBLASLt handle: the core caches one per device and creates it on first use. The initialize stage creates it
// (te::cublaslt_prepare, before its throwaway capture), so execute — also when XLA records it into a command buffer —
// only looks it up.
#include "gemm.h"

namespace te_jax {

te::ops::GemmRequest gemm_request(const GemmInputs& in, const GemmAttrs& at, te::DType out_dtype) {
  const auto operand = [](const te::ops::TensorView& data, const te::ops::TensorView& scale_inv, int64_t scaling,
                          bool trans) {
    te::ops::GemmOperandRequest o;
    o.data.present = true;
    o.data.v = data;
    // Packed E2M1 arrives as uint8; every other operand carries its values' type.
    o.dtype_code = int64_t(scaling == int64_t(te::GemmScaling::kNvfp4) && data.dtype == te::DType::kByte
                               ? te::DType::kFloat4E2M1
                               : data.dtype);
    o.scaling = scaling;
    o.trans = trans;
    o.scale_inv.present = scaling != 0;
    o.scale_inv.v = scale_inv;
    return o;
  };
  te::ops::GemmRequest r;
  r.op = kGemmOp;
  r.a = operand(in.rhs, in.rhs_scale_inv, at.rhs_scaling, at.rhs_transposed);
  r.b = operand(in.lhs, in.lhs_scale_inv, at.lhs_scaling, at.lhs_transposed);
  r.d_dtype = int64_t(out_dtype);
  r.gelu = at.fuse_gelu;
  r.grad = at.grad;
  r.bias.present = at.fuse_bias && !at.grad;
  r.bias.v = in.bias;
  r.gelu_in.present = at.fuse_gelu && at.grad;
  r.gelu_in.v = in.gelu_in;
  r.want_bias_grad = at.fuse_bias && at.grad;
  // NVFP4: lhs's amax at [0] (B's), rhs's at [1] (A's).
  if (at.lhs_scaling == int64_t(te::GemmScaling::kNvfp4) && in.global_amax.shape.numel() == 2 &&
      in.global_amax.dtype == te::DType::kFloat32) {
    const auto at_index = [&](int i) {
      te::ops::GemmBuffer b;
      b.present = true;
      b.v = in.global_amax;
      b.v.shape = te::ops::Shape::of(1);
      if (b.v.data != nullptr) b.v.data = static_cast<const float*>(b.v.data) + i;
      return b;
    };
    r.b_amax = at_index(0);
    r.a_amax = at_index(1);
  }
  r.use_split_accumulator = at.use_split_accumulator;
  r.allow_tf32 = at.allow_tf32;
  return r;
}

te::ops::GemmPlanOptions gemm_plan_options(bool plan_outputs) {
  te::ops::GemmPlanOptions opt;
  opt.plan_outputs = plan_outputs;
  opt.reserve_lt_workspace = true;
  opt.reserve_fallback = true;
  return opt;
}

namespace {

using Buf = ffi::AnyBuffer;
using Ret = ffi::Result<ffi::AnyBuffer>;

te::ops::GemmBuffer result(Ret& r, const char* what, bool present) {
  te::ops::GemmBuffer b;
  b.present = present;
  if (present) b.v = view_of(*r, kGemmOp, what);
  return b;
}

ffi::Error gemm(const te::ops::ExecCtx& ctx, Buf lhs, Buf lhs_scale_inv, Buf rhs, Buf rhs_scale_inv, Buf bias,
                Buf gelu_in, Buf global_amax, Ret out, Ret pre_gelu_out, Ret bias_grad, Ret workspace, bool lhs_transposed,
                bool rhs_transposed, int64_t lhs_scaling, int64_t rhs_scaling, bool fuse_bias, bool fuse_gelu,
                bool grad, bool use_split_accumulator, bool allow_tf32) {
  return guarded([&] {
    const GemmAttrs at{lhs_transposed, rhs_transposed, lhs_scaling, rhs_scaling, fuse_bias,
                       fuse_gelu,      grad,           use_split_accumulator, allow_tf32};
    const GemmInputs in{view_of(lhs, kGemmOp, "lhs"),  view_of(lhs_scale_inv, kGemmOp, "lhs_scale_inv"),
                        view_of(rhs, kGemmOp, "rhs"),  view_of(rhs_scale_inv, kGemmOp, "rhs_scale_inv"),
                        view_of(bias, kGemmOp, "bias"), view_of(gelu_in, kGemmOp, "gelu_input"),
                        view_of(global_amax, kGemmOp, "global_amax")};
    te::ops::GemmRequest r = gemm_request(in, at, view_of(*out, kGemmOp, "out").dtype);
    r.d = result(out, "out", true);
    r.pre_gelu_out = result(pre_gelu_out, "pre_gelu_out", fuse_gelu && !grad);
    r.bias_grad = result(bias_grad, "bias_grad", fuse_bias && grad);
    const te::ops::GemmPlan plan = te::ops::plan_gemm(r, ctx, gemm_plan_options(false));
    te::ops::GemmIO io;
    io.a = rhs.untyped_data();
    io.a_scale_inv = rhs_scale_inv.untyped_data();
    io.b = lhs.untyped_data();
    io.b_scale_inv = lhs_scale_inv.untyped_data();
    io.d = out->untyped_data();
    io.bias = bias.untyped_data();
    io.bias_grad = bias_grad->untyped_data();
    io.pre_gelu_out = pre_gelu_out->untyped_data();
    io.gelu_in = gelu_in.untyped_data();
    if (r.a_amax.present) {
      io.a_amax = static_cast<const float*>(r.a_amax.v.data);
      io.b_amax = static_cast<const float*>(r.b_amax.v.data);
    }
    bind_workspace(io, workspace);
    te::ops::run_gemm(plan, io, ctx);
  });
}

#if defined(TE_WITH_CUDA)
ffi::Error gemm_setup() {
  return guarded([] { te::cublaslt_prepare(); });
}
#endif

template <class B> auto gemm_binding(B b) {
  return bind_buffers<7, 4>(std::move(b))
      .template Attr<bool>("lhs_transposed")
      .template Attr<bool>("rhs_transposed")
      .template Attr<int64_t>("lhs_scaling")
      .template Attr<int64_t>("rhs_scaling")
      .template Attr<bool>("fuse_bias")
      .template Attr<bool>("fuse_gelu")
      .template Attr<bool>("grad")
      .template Attr<bool>("use_split_accumulator")
      .template Attr<bool>("allow_tf32");
}

}  // namespace
}  // namespace te_jax

TE_JAX_HANDLERS_WITH_SETUP(TeGemm, te_jax::gemm, te_jax::gemm_binding, te_jax::gemm_setup);
