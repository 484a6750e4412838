// LayerNorm / RMSNorm forward and backward below every frontend (SPEC §11), in the style of plan.h / run.h:
// `plan_norm_fwd` / `plan_norm_bwd` validate a call and lay out every buffer it needs from shapes, dtypes and the
// quantizer spec alone (no pointer is read, so torch's fake kernels and JAX's trace ask the same planner), and
// `run_norm_fwd` / `run_norm_bwd` launch into buffers the frontend allocated from that plan, plus one workspace;
// nothing allocates, nothing syncs. Output pieces reuse the activation family's vocabulary (Piece, PiecePlan,
// QuantSpec from make_spec): `out` holds exactly what a quantize of the FP32 y with that spec would hold.
// The forward is the norm kernel (producers/norm/norm.h: statistics and y in FP32, one summation order shared by
// CPU and CUDA) followed, for a quantized output the norm kernel does not emit itself, by the identity cast of the
// FP32 y kept in the workspace (ActPlan `cast`; rnd_in of FP32 is the identity, so the bytes are the format's own).
#pragma once

#include "plan.h"
#include "../producers/norm/norm.h"

namespace te {
namespace ops {

// ---- Forward ------------------------------------------------------------------------------------------------------
// `op`: the frontend op's name for messages ("layernorm_fwd", "rmsnorm_fwd"). x [..., H] float32/float16/bfloat16;
// gamma [H] and (LayerNorm) beta [H] float32/float16/bfloat16, beta of gamma's dtype; eps > 0 and finite. `otype`:
// the plain output's dtype (float32/float16/bfloat16), used when the spec's kind is kNone. Data pointers are not
// read by the planner.
struct NormFwdRequest {
  const char* op = "";
  NormKind kind = NormKind::kLayerNorm;
  TensorView x;
  TensorView gamma;
  bool has_beta = false;  // LayerNorm: required; RMSNorm: must be false
  TensorView beta;
  double eps = 1e-5;
  bool zero_centered_gamma = false;
  DType otype = DType::kFloat32;
};

// How the forward writes its output (decided by the plan from the spec and the device kind).
enum class NormPath : int {
  kPlain,      // the norm kernel writes y rounded to otype (spec kind kNone)
  kFusedFp8,   // CUDA: the norm kernel emits per-tensor FP8 (delayed, or current from the amax of y) itself; the
               // columnwise copy, when asked for, is the byte transpose of those codes (one scale per tensor)
  kFusedMxfp8, // CUDA: the norm kernel emits the MXFP8 rowwise copy itself
  kGeneric,    // the norm kernel writes FP32 y to the workspace; the identity cast (cast plan) quantizes it
};

struct NormFwdPlan {
  NormFwdRequest req;
  QuantSpec spec;
  bool cuda = false;
  int64_t rows = 0, hidden = 0;  // x flattened to [rows, hidden]
  NormPath path = NormPath::kPlain;
  // The output pieces (SPEC §1.4 order; kGradBias never present). Plain: kRowData of dtype otype, x's shape.
  // Quantized: exactly the pieces of an identity cast of an FP32 tensor of x's shape with this spec.
  PiecePlan pieces[kNumPieces];
  PiecePlan mu;      // FP32 [rows]; present for LayerNorm only
  PiecePlan rsigma;  // FP32 [rows]
  // The identity cast's plan (kGeneric, and the fused paths' layouts); its own workspace starts at cast_ws_offset.
  ActPlan cast;
  bool has_cast = false;
  // Workspace: byte offsets (256-aligned) into one buffer of workspace_bytes; -1: not used.
  int64_t workspace_bytes = 0;
  int64_t y_offset = -1;        // FP32 y [rows, hidden] (kGeneric)
  int64_t cast_ws_offset = -1;  // the cast plan's workspace
  int64_t amax_offset = -1;     // kFusedFp8 current scaling: FP32 amax scratch
  bool transpose_copy = false;  // kFusedFp8: the columnwise copy transposed from the rowwise codes
};

// x, gamma, beta (LayerNorm), mu (LayerNorm), rsigma (producers/norm/norm.h), the output pieces, one workspace.
struct NormFwdIO : NormFwdTensors {
  void* out[kNumPieces] = {};  // one pointer per present piece
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

// PlanOptions: as plan_act's (exact_outputs, current_amax_out, any_device, write_rowwise / write_columnwise reach
// the cast plan; amax_only and dbias_fp32 are not taken here).
NormFwdPlan plan_norm_fwd(const NormFwdRequest& r, const QuantSpec& spec, const ExecCtx& ctx, PlanOptions opt = {});
void run_norm_fwd(const NormFwdPlan& plan, const NormFwdIO& io, const ExecCtx& ctx);

// ---- Backward -----------------------------------------------------------------------------------------------------
// dz and x [..., H] of one dtype (float32/float16/bfloat16); mu (LayerNorm) and rsigma FP32 with x's leading shape
// flattened ([rows]; x's leading shape is accepted too); gamma [H].
struct NormBwdRequest {
  const char* op = "";  // "layernorm_bwd", "rmsnorm_bwd"
  NormKind kind = NormKind::kLayerNorm;
  TensorView dz;
  TensorView x;
  bool has_mu = false;  // LayerNorm: required; RMSNorm: must be false
  TensorView mu;
  TensorView rsigma;
  TensorView gamma;
  bool zero_centered_gamma = false;
};

struct NormBwdPlan {
  NormBwdRequest req;
  bool cuda = false;
  int64_t rows = 0, hidden = 0;
  PiecePlan dx;      // x's dtype and shape
  PiecePlan dgamma;  // gamma's dtype, [H]
  PiecePlan dbeta;   // gamma's dtype, [H]; LayerNorm only
  // FP32 column partial sums, one row per norm_bwd_rows(rows, hidden) consecutive rows (norm.h), reduced in
  // partial-row order and rounded once: dgamma's at dgamma_offset, dbeta's at dbeta_offset, [part_blocks, hidden].
  int64_t part_blocks = 0;
  int64_t workspace_bytes = 0;
  int64_t dgamma_offset = -1;
  int64_t dbeta_offset = -1;
};

// dz, x, mu (LayerNorm), rsigma, gamma, dx, dgamma, dbeta (LayerNorm) (producers/norm/norm.h), one workspace.
struct NormBwdIO : NormBwdTensors {
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

NormBwdPlan plan_norm_bwd(const NormBwdRequest& r, const ExecCtx& ctx);
void run_norm_bwd(const NormBwdPlan& plan, const NormBwdIO& io, const ExecCtx& ctx);

}  // namespace ops
}  // namespace te
