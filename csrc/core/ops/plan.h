// The activation / cast family's dispatch below every frontend (SPEC §3, §4.10, §5): `plan_act` validates a request
// and its quantizer spec, decides the fusion path (SPEC §5.1) and lays out every buffer the call needs: the six
// quantized pieces of SPEC §1.4 and grad_bias (present?, dtype, shape) and one workspace (dbias partials, amaxes,
// temporaries); `run_act` (run.h) then launches the kernels into buffers the frontend allocated from that plan.
// Invariant: a plan is plain data computed from shapes, dtypes, the spec and the device kind alone (no pointer is
// read), so a frontend can ask for output shapes without running anything (JAX: at trace time). Every check raises
// te::Error naming the op, shape, dtype, format, device and the rule broken; the success path allocates nothing.
#pragma once

#include "buffers.h"

namespace te {
namespace ops {

// The call as the user made it. `op` is the frontend op's name ("act_quantize", "quantize", ...); x's and grad's
// data pointers are not read by the planner.
struct ActRequest {
  const char* op = "";
  ActKind kind = ActKind::kIdentity;
  bool backward = false;
  bool with_dbias = false;
  ActArgs args;
  TensorView x;
  bool has_grad = false;  // backward: grad of the forward output
  TensorView grad;
};

// The buffers of a call, in the order the quantizing ops return them (SPEC §1.4), grad_bias last.
enum Piece : int { kRowData, kRowScaleInv, kColData, kColScaleInv, kAmaxRow, kAmaxCol, kGradBias, kNumPieces };
const char* piece_name(Piece p);  // "row_data", ..., "grad_bias"

struct PiecePlan {
  bool present = false;
  DType dtype = DType::kByte;
  Shape shape;
  // Elements to allocate (>= shape.numel()): more where the plan keeps scratch after the piece's own elements.
  int64_t capacity = 0;
  int64_t bytes() const;
};

struct ActPlan {
  ActRequest req;
  QuantSpec spec;
  FusionPath path = FusionPath::kFullyFused;
  bool cuda = false;
  // Geometry: the input flattened to [rows, K]; cols = K (unary) or K/2 (gated); out_cols as in activation.h.
  int64_t rows = 0, cols = 0, out_cols = 0;
  Shape out_shape;  // the plain (unquantized) output's shape
  PiecePlan pieces[kNumPieces];

  // Workspace: byte offsets into one buffer of `workspace_bytes` (enough for any buffer alignment; the exact
  // need for given pointers is ops::workspace_bytes(plan, io)). -1: not used.
  int64_t workspace_bytes = 0;
  int64_t dbias_offset = -1;    // float32 [dbias_rows, out_cols] partial column sums
  int64_t dbias_rows = 0;
  int64_t amax_offset = -1;     // float32 scratch amax(es) of current scaling / NVFP4
  int64_t temp_offset = -1;     // the UNFUSED paths' rnd_in(act(x)): out_shape of the input dtype
  // Current scaling's amax pass: where its amax lives (after row_scale_inv's element when amax_in_scale_inv,
  // else at amax_offset) and how many per-block slots follow it (CUDA one-launch cast).
  bool amax_pass = false;
  bool amax_in_scale_inv = false;
  int amax_slots = 0;
  // NVFP4 on CUDA may take the two-pass fused kernel (needs only the amax scratch) when the buffers are aligned.
  bool nvfp4_fused_candidate = false;
  bool amax_only = false;  // PlanOptions::amax_only

  bool needs_rng() const { return spec.kind == QuantKind::kNvfp4 && spec.stochastic_rounding(); }
};

// Options of a plan. exact_outputs: every piece is allocated with exactly its shape (buffers a caller passes in,
// XLA's results), so no scratch may live after a piece's elements; otherwise (torch allocating its own results)
// current scaling's amax rides in row_scale_inv's allocation, one allocation less per call.
struct PlanOptions {
  bool exact_outputs = false;
  // current scaling's amax pass writes its amax into piece kAmaxRow (f32[1]) for the frontend to return (JAX's
  // updated-amax result); otherwise that amax is scratch.
  bool current_amax_out = false;
  // The two halves of a call whose amax is reduced over several devices (a sharded tensor). amax_only: the call is
  // only the amax pass of SPEC §5.1 (the amax of the op's unrounded FP32 values, as current scaling and NVFP4 take
  // it) into piece kAmaxRow (f32[1]); no other piece, no dbias. The frontend reduces it and runs the call again with
  // the reduced amax in QuantSpec::amax. dbias_fp32: grad_bias comes back as FP32 column sums, not rounded to the
  // input dtype, for the frontend to add over the devices and round once.
  bool amax_only = false;
  bool dbias_fp32 = false;
  // A plan for no device in particular (JAX's trace, which lowers for any platform): the shapes, dtypes and checks
  // are every device's (they never depend on it); the workspace is the most any device kind needs (CUDA's
  // one-launch amax slots). ctx.cuda still names the device of messages.
  bool any_device = false;
  // The copies the caller has buffers for (an in-place quantize into an existing tensor): the request is checked
  // for the quantizer's whole usage, but only these copies are laid out and written (plan.spec's usage is narrowed).
  bool write_rowwise = true;
  bool write_columnwise = true;
};

// Plans one call. Each frontend call plans exactly once: the plan it runs (run_act) is this one, never re-made; a
// frontend that only needs the outputs' shapes (torch's fake kernels, JAX's trace) runs the same planner with a
// context that has no stream. The planner reads no device state: ctx gives the device kind and, for messages, its
// index or arch.
ActPlan plan_act(const ActRequest& r, const QuantSpec& spec, const ExecCtx& ctx, PlanOptions opt = {});

// How many times plan_act has run in this process (this library's copy of the core): a debug counter for the tests
// that each call plans once (`_C.plan_act_calls()`, `_ffi.plan_act_calls()`).
int64_t plan_act_calls();

// The quantizer spec of the op arguments (SPEC §1.4), checked (kind, dtype, usage, flags, block_dim, epsilon,
// whether delayed scaling has its scale and amax); the pointers stay null for the frontend to fill in after it has
// checked its own tensors.
QuantSpec make_spec(const char* op, int64_t qkind, int64_t qdtype, bool rowwise, bool columnwise, int64_t qflags,
                    double amax_epsilon, int64_t block_dim, bool has_scale, bool has_amax);

// TE's activation code of a user-facing op (0..11; kIdentity is internal).
ActKind act_kind(const char* op, int64_t code);

// SPEC §5.1: the one place the fusion path is decided, for forward and backward alike.
FusionPath choose_fusion_path(const QuantSpec& spec);

// The function the user called, for messages: "geglu (te::act)", "dbias_dgelu (te::dbias_dact)"; the op's own
// name for the plain casts (quantize, bgrad_quantize, quantize_into).
std::string op_name(const ActRequest& r);

// Shared message of the grad-dtype rule, for frontends that see a grad dtype the core has no DType for.
std::string grad_dtype_message(const ActRequest& r, const std::string& grad_dtype, const std::string& x_dtype);

}  // namespace ops
}  // namespace te
