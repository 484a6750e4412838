// The collective GEMM call of transformer_engine_jax (csrc/core/ops/collective_gemm_op.h): te_collective_gemm runs
// one rank's ring over the NCCL communicator the frontend created for its mesh axis (csrc/core/comm/nccl_comm.h).
// The request is built here for both the handler (XLA's buffers) and the trace-time planner (shapes and dtypes).
#pragma once

#include "../core/ops/collective_gemm_op.h"
#include "ffi_common.h"

namespace te_jax {

constexpr const char* kCollectiveGemmOp = "te_collective_gemm";

// The attributes of a te_collective_gemm call, in binding order. kind: 1 all-gather + GEMM, 2 GEMM + reduce-scatter
// (te::ops::CollectiveKind); comm: the registry key of the axis's rings; tp: the ring size (checked against the
// communicator's); overlap: false runs the non-overlapped baseline (same bytes); sm_margin: SMs the chunk GEMMs leave
// to NCCL; keep_gathered: the all-gather's gathered x is a result; w_kn: w is [k, n] (a JAX kernel's layout).
struct CollectiveAttrs {
  int64_t kind = 1;
  int64_t comm = 0;
  int64_t tp = 1;
  bool overlap = true;
  bool use_split_accumulator = true;
  int64_t sm_margin = 0;
  bool keep_gathered = false;
  bool w_kn = false;  // w stored [k, n] (plain operands)
  bool copy_engine = false;  // reduce-scatter: over the ring's copy-engine windows (the frontend made them)
};

// x [rows, k], x_scale_inv (f32[1] for FP8, 0 elements otherwise), w [n, k] ([k, n] with w_kn), w_scale_inv likewise.
struct CollectiveInputs {
  te::ops::TensorView x, x_scale_inv, w, w_scale_inv;
};

te::ops::CollectiveGemmRequest collective_request(const CollectiveInputs& in, const CollectiveAttrs& at, int rank,
                                                  te::DType out_dtype);

// The bytes of the workspace result: the plan's, the cuBLASLt workspace and the alignment slack.
int64_t collective_workspace_bytes(const te::ops::CollectiveGemmPlan& plan);

}  // namespace te_jax
