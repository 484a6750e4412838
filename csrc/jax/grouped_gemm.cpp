// XLA FFI handler of the grouped GEMM: te_grouped_gemm. The group sizes are an ordinary device buffer the kernels
// read (csrc/core/gemm/grouped_gemm.h), so the call is command-buffer compatible and never syncs.
//   args     lhs rhs group_sizes lhs_scale_inv rhs_scale_inv   (grouped_gemm.h)
//   results  out [m_total, n] (wgrad: [groups, n, k]); workspace (uint8, aligned up to 256 B here: the problem table and the kernel's own)
//   attrs    rhs_kn (rhs is [groups, k, n]), use_split_accumulator (FP8: promoted accumulation; false: FastAccum),
//            wgrad (the weight-gradient form: rhs [m_total, k], out [groups, n, k])
#include "grouped_gemm.h"

namespace te_jax {

te::ops::GroupedGemmRequest grouped_gemm_request(const GroupedGemmInputs& in, bool rhs_kn, bool use_split_accumulator,
                                                 bool wgrad, te::DType out_dtype) {
  const auto present = [](const te::ops::TensorView& v, bool p) {
    te::ops::GemmBuffer b;
    b.present = p;
    b.v = v;
    return b;
  };
  const bool fp8 = in.lhs_scale_inv.shape.numel() > 0 || in.rhs_scale_inv.shape.numel() > 0;
  te::ops::GroupedGemmRequest r;
  r.op = kGroupedGemmOp;
  r.lhs = present(in.lhs, true);
  r.rhs = present(in.rhs, true);
  r.group_sizes = present(in.group_sizes, true);
  r.lhs_scale_inv = present(in.lhs_scale_inv, fp8);
  r.rhs_scale_inv = present(in.rhs_scale_inv, fp8);
  r.lhs_dtype_code = int64_t(in.lhs.dtype);
  r.rhs_dtype_code = int64_t(in.rhs.dtype);
  r.rhs_kn = rhs_kn;
  r.use_split_accumulator = use_split_accumulator;
  r.wgrad = wgrad;
  r.d_dtype = int64_t(out_dtype);
  return r;
}

namespace {

using Buf = ffi::AnyBuffer;
using Ret = ffi::Result<ffi::AnyBuffer>;

ffi::Error grouped_gemm(const te::ops::ExecCtx& ctx, Buf lhs, Buf rhs, Buf group_sizes, Buf lhs_scale_inv,
                        Buf rhs_scale_inv, Ret out, Ret workspace, bool rhs_kn, bool use_split_accumulator,
                        bool wgrad) {
  return guarded([&] {
    const char* op = kGroupedGemmOp;
    const GroupedGemmInputs in{view_of(lhs, op, "lhs"), view_of(rhs, op, "rhs"), view_of(group_sizes, op, "group_sizes"),
                               view_of(lhs_scale_inv, op, "lhs_scale_inv"), view_of(rhs_scale_inv, op, "rhs_scale_inv")};
    const te::ops::TensorView d = view_of(*out, op, "out");
    te::ops::GroupedGemmRequest r = grouped_gemm_request(in, rhs_kn, use_split_accumulator, wgrad, d.dtype);
    r.d.present = true;
    r.d.v = d;
    const te::ops::GroupedGemmPlan plan = te::ops::plan_grouped_gemm(r, ctx);
    te::ops::GroupedGemmIO io;
    io.lhs = lhs.untyped_data();
    io.rhs = rhs.untyped_data();
    io.group_sizes = static_cast<const int32_t*>(group_sizes.untyped_data());
    io.lhs_scale_inv = static_cast<const float*>(lhs_scale_inv.untyped_data());
    io.rhs_scale_inv = static_cast<const float*>(rhs_scale_inv.untyped_data());
    io.d = out->untyped_data();
    bind_workspace(io, workspace);
    te::ops::run_grouped_gemm(plan, io, ctx);
  });
}

template <class B> auto grouped_gemm_binding(B b) {
  return bind_buffers<5, 2>(std::move(b))
      .template Attr<bool>("rhs_kn")
      .template Attr<bool>("use_split_accumulator")
      .template Attr<bool>("wgrad");
}

}  // namespace
}  // namespace te_jax

TE_JAX_HANDLERS(TeGroupedGemm, te_jax::grouped_gemm, te_jax::grouped_gemm_binding);
