// The tej grouped GEMM call as the core's request (csrc/core/ops/grouped_gemm_op.h), shared by the handler
// (grouped_gemm.cpp, from XLA's buffers) and the trace-time planner (module.cpp, from shapes and dtypes).
#pragma once

#include "../core/ops/grouped_gemm_op.h"
#include "ffi_common.h"

namespace te_jax {

constexpr const char* kGroupedGemmOp = "te_grouped_gemm";

// In argument order: lhs [m_total, k], rhs [groups, n, k] or [groups, k, n], group_sizes int32 [groups],
// lhs_scale_inv f32 [1] and rhs_scale_inv f32 [groups] (FP8; 0 elements for plain operands).
struct GroupedGemmInputs {
  te::ops::TensorView lhs, rhs, group_sizes, lhs_scale_inv, rhs_scale_inv;
};

// rhs_kn: rhs is [groups, k, n]; wgrad: the weight-gradient form (lhs [m_total, n], rhs [m_total, k], out
// [groups, n, k]).
te::ops::GroupedGemmRequest grouped_gemm_request(const GroupedGemmInputs& in, bool rhs_kn, bool use_split_accumulator,
                                                 bool wgrad, te::DType out_dtype);

}  // namespace te_jax
