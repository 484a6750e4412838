// The grouped GEMM op below both frontends (tex.grouped_gemm, tej.grouped_gemm): `plan_grouped_gemm` checks a request
// over raw views — ranks, the shared K, the group count, dtypes and the SPEC §6.3 FP8 pairing rules, the scale
// shapes, the alignment the tensor-core kernels need — and lays out the output and one workspace; `run_grouped_gemm`
// runs the CPU kernel or the CUDA launcher of gemm/grouped_gemm.h. The group sizes are never read here: they live on
// the device, and the kernels apply the rules of grouped_gemm.h to them.
// Invariant: a plan depends on shapes, dtypes, flags and the device kind only (JAX plans at trace time); every check
// raises te::Error naming the op, the shapes, formats, device and rule; the run path neither allocates nor syncs.
#pragma once

#include "../gemm/grouped_gemm.h"
#include "gemm_op.h"

namespace te {
namespace ops {

// lhs [m_total, k]; rhs [groups, n, k] (rhs_kn false) or [groups, k, n]; group_sizes int32 [groups]; d [m_total, n].
// *_dtype_code: the values' DType (FP8 codes may arrive as uint8 buffers); FP8 operands carry lhs_scale_inv f32 [1]
// and rhs_scale_inv f32 [groups], or FP8 block scales (lhs 1x128 [ceil(k/128), roundup(m_total, 4)], rhs 128x128
// [groups, ceil(n/128), roundup(ceil(k/128), 4)]: grouped_gemm.h), told apart by the scales' ranks. d_dtype: bf16, fp16 or fp32 (plain operands: theirs by default).
struct GroupedGemmRequest {
  const char* op = "grouped_gemm";
  GemmBuffer lhs, rhs, group_sizes, lhs_scale_inv, rhs_scale_inv, d;
  int64_t lhs_dtype_code = int64_t(DType::kBFloat16);
  int64_t rhs_dtype_code = int64_t(DType::kBFloat16);
  bool rhs_kn = false;
  int64_t d_dtype = int64_t(DType::kBFloat16);
  bool use_split_accumulator = true;
  bool wgrad = false;  // the weight-gradient form (grouped_gemm.h): lhs [m_total, n], rhs [m_total, k], d [groups, n, k]  // FP8: promoted (full-precision) accumulation; false: FastAccum (SPEC §6.3)
};

struct GroupedGemmPlan {
  GroupedGemmRequest req;
  GroupedGemmArgs args;    // without pointers
  Shape d_shape;           // [m_total, n]; wgrad: [groups, n, k]
  DType d_dtype = DType::kBFloat16;
  bool cuda = false;
  int64_t workspace_bytes = 0;  // including kWorkspaceAlign slack; 0 on the CPU
};

// plan_outputs: the output is planned (JAX at trace time) rather than checked against r.d.
GroupedGemmPlan plan_grouped_gemm(const GroupedGemmRequest& r, const ExecCtx& ctx, bool plan_outputs = false);

// The operands and d (gemm/grouped_gemm.h GroupedGemmOperands), and one workspace of the plan's workspace_bytes.
struct GroupedGemmIO : GroupedGemmOperands {
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

void run_grouped_gemm(const GroupedGemmPlan& plan, const GroupedGemmIO& io, const ExecCtx& ctx);

// What runs a plan on CUDA ("cutlass sm90 grouped bf16 NK", "portable"; "cpu" for CPU plans).
const char* grouped_gemm_kernel(const GroupedGemmPlan& plan);

}  // namespace ops
}  // namespace te
