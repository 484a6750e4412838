// The tej GEMM call as the core's request (csrc/core/ops/gemm_op.h), shared by the handler (csrc/jax/gemm.cpp, from
// XLA's buffers) and the trace-time planner (module.cpp, from shapes and dtypes), so both plan the same call.
//
// Row-major meaning: out [M, N] = lhs' · rhs', the contraction over K. The core's D = op(B)·op(A) with A = rhs and
// B = lhs (D's rows are lhs's, its columns rhs's):
//   lhs [M, K] (lhs_transposed: [K, M])   = B, transB = lhs_transposed
//   rhs [K, N] (rhs_transposed: [N, K])   = A, transA = rhs_transposed
// so FP8's TN layout is lhs [M, K] with rhs [N, K] (Python picks the copies: never a transpose of FP8 bytes).
#pragma once

#include "../core/ops/gemm_op.h"
#include "ffi_common.h"

namespace te_jax {

// The attributes of a te_gemm call, in binding order. *_scaling: te::GemmScaling codes (0 plain, 1 FP8 per tensor,
// 4/5 FP8 block 1x128/128x128). fuse_bias: + bias (forward) or the bias gradient (grad); fuse_gelu: GELU with the
// pre-activation as a result (forward) or dGELU of the gelu_input (grad). use_split_accumulator: FP8 per-tensor's
// full-precision accumulation (SPEC §6.3); allow_tf32: FP32 operands may use TF32 tensor cores.
struct GemmAttrs {
  bool lhs_transposed = false;
  bool rhs_transposed = false;
  int64_t lhs_scaling = 0;
  int64_t rhs_scaling = 0;
  bool fuse_bias = false;
  bool fuse_gelu = false;
  bool grad = false;
  bool use_split_accumulator = false;
  bool allow_tf32 = false;
};

// What a call knows of its inputs (views with or without data): lhs, its scale_inv, rhs, its scale_inv, bias,
// gelu_input and global_amax (NVFP4: f32[2], lhs's and rhs's global amaxes), in argument order. Only the ones the
// attributes use are read.
struct GemmInputs {
  te::ops::TensorView lhs, lhs_scale_inv, rhs, rhs_scale_inv, bias, gelu_in, global_amax;
};

constexpr const char* kGemmOp = "te_gemm";

// The core's request of a call writing `out_dtype`; its outputs (D, pre_gelu_out, bias_grad) are left for the
// caller: planned at trace time, XLA's results at run time.
te::ops::GemmRequest gemm_request(const GemmInputs& in, const GemmAttrs& at, te::DType out_dtype);

// XLA allocates the cuBLASLt workspace and the unfused epilogue's accumulator as part of the workspace result.
te::ops::GemmPlanOptions gemm_plan_options(bool plan_outputs);

}  // namespace te_jax
