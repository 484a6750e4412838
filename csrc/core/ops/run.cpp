// run_act (run.h): the fusion-path switch of SPEC §5.1 and the kernel launches, on the CPU or on ctx's CUDA stream.
#include "run.h"

#include <cstring>

#include "../formats/fp8_block/quantize_fp8_block.h"
#include "../producers/mxfp8/quantize_mxfp8.h"

#if defined(TE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace te {
namespace ops {

namespace {

// ---- Launch on the context's device -----------------------------------------------------------------------------
#if defined(TE_WITH_CUDA)
cudaStream_t stream_of(const ExecCtx& ctx) { return ctx.stream; }
#endif

void launch_activation(const ExecCtx& ctx, const ActPlan& pl, const ActKernelParams& p) {
  const ActRequest& r = pl.req;
  TE_ON_DEVICE(ctx, activation_cuda(r.kind, r.backward, r.x.dtype, p, stream_of(ctx)),
               activation_cpu(r.kind, r.backward, r.x.dtype, p, *ctx.parallel_for));
}

// Zeroes `bytes` bytes on the context's stream (all-zero bits are 0.0 in every float dtype): a memset is cheaper to
// issue than a fill kernel, and capturable.
void zero_bytes(const ExecCtx& ctx, void* p, int64_t bytes) {
  if (bytes <= 0) return;
#if defined(TE_WITH_CUDA)
  if (ctx.cuda) {
    const cudaError_t e = cudaMemsetAsync(p, 0, size_t(bytes), stream_of(ctx));
    if (e != cudaSuccess) fail(ErrorKind::kRuntime, std::string("zeroing a scratch buffer failed: ") + cudaGetErrorString(e));
    return;
  }
#endif
  std::memset(p, 0, size_t(bytes));
}

template <typename T> T* ws_at(const ActIO& io, int64_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(io.workspace) + offset);
}
template <typename T> T* out_at(const ActPlan& pl, const ActIO& io, Piece p) {
  return pl.pieces[p].present ? static_cast<T*>(io.out[p]) : nullptr;
}

bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// NVFP4 on CUDA, FUSED_ACTIVATION_AMAX_NVFP4 in two passes over x (the amax of the unrounded values, then the op
// recomputed and both copies quantized from rnd_in(act(x)) in one kernel, ScaleMode::kNvfp4): vector loads and
// stores need aligned buffers.
bool nvfp4_fused(const ActPlan& pl, const ActIO& io) {
  return pl.nvfp4_fused_candidate && aligned(io.x, 16) && (io.grad == nullptr || aligned(io.grad, 16)) &&
         (!pl.spec.rowwise || aligned(io.out[kRowData], 4));
}

// The amax pass of SPEC §5.1 alone: amax[0] = the amax of the op's unrounded FP32 values (zeroed first).
void run_amax_pass(const ActPlan& pl, const ExecCtx& ctx, const ActKernelParams& base, float* amax) {
  zero_bytes(ctx, amax, sizeof(float));
  ActKernelParams pa = amax_pass_params(base);
  pa.amax = amax;
  launch_activation(ctx, pl, pa);
}

// FULLY_FUSED / FUSED_ACTIVATION_AMAX_FP8 for per-tensor FP8 (SPEC §5.1). Current scaling: amax pass over the
// unrounded activation, then recompute + cast; an amax passed in the spec is an already (all-)reduced amax, and the
// first pass is skipped. The kernel launcher takes the amax itself (ActKernelParams::amax_in_call), so nothing is
// zeroed here.
void run_fp8_per_tensor(const ActPlan& pl, const ActIO& io, const ExecCtx& ctx, ActKernelParams p) {
  const QuantSpec& spec = pl.spec;
  p.out = spec.rowwise && pl.pieces[kRowData].shape.numel() > 0 ? io.out[kRowData] : nullptr;
  p.out_t = spec.columnwise && pl.pieces[kColData].shape.numel() > 0 ? out_at<uint8_t>(pl, io, kColData) : nullptr;
  p.scale_inv = out_at<float>(pl, io, kRowScaleInv);
  p.e4m3 = spec.e4m3();
  p.amax = spec.amax;
  if (spec.kind == QuantKind::kFp8Delayed) {
    p.mode = ScaleMode::kDelayed;
    p.scale = spec.scale;
    launch_activation(ctx, pl, p);
    return;
  }
  p.force_pow2 = spec.force_pow2();
  p.amax_epsilon = float(spec.amax_epsilon);
  if (pl.amax_pass) {
    const bool amax_out = pl.pieces[kAmaxRow].present;  // PlanOptions::current_amax_out
    p.amax = amax_out ? out_at<float>(pl, io, kAmaxRow)
                      : (pl.amax_in_scale_inv ? p.scale_inv + 1 : ws_at<float>(io, pl.amax_offset));
    p.amax_in_call = true;
    p.amax_partials = pl.amax_slots == 0 ? nullptr : (amax_out ? ws_at<float>(io, pl.amax_offset) : p.amax + 1);
    p.amax_slots = pl.amax_slots;
  }
  p.mode = ScaleMode::kCurrent;
  launch_activation(ctx, pl, p);
}

// FULLY_FUSED MXFP8 (SPEC §5.1): both copies and the dbias partials from one read of the input.
void run_mxfp8_path(const ActPlan& pl, const ActIO& io, const ExecCtx& ctx, const ActKernelParams& base) {
  Mxfp8Params p;
  p.x = base.x;
  p.grad = base.grad;
  p.dbias_partial = base.dbias_partial;
  p.noop = base.noop;
  p.rows = pl.rows;
  p.cols = pl.cols;
  p.act = base.act;
  p.e4m3 = pl.spec.e4m3();
  p.swizzled = pl.spec.swizzled();
  p.row_data = out_at<uint8_t>(pl, io, kRowData);
  p.row_scale = out_at<uint8_t>(pl, io, kRowScaleInv);
  p.col_data = out_at<uint8_t>(pl, io, kColData);
  p.col_scale = out_at<uint8_t>(pl, io, kColScaleInv);
  const ActRequest& r = pl.req;
  TE_ON_DEVICE(ctx, quantize_mxfp8_cuda(r.kind, r.backward, r.x.dtype, p, stream_of(ctx)),
               quantize_mxfp8_cpu(r.kind, r.backward, r.x.dtype, p, *ctx.parallel_for));
}

// The plain op into the plan's temporary: rnd_in(act(x)) and, with dbias, the partials of the unrounded values.
// `noop` reaches only the quantize kernel that follows: the temporary is ours.
const void* run_to_temp(const ActPlan& pl, const ActIO& io, const ExecCtx& ctx, const ActKernelParams& base) {
  ActKernelParams pp = base;
  pp.out = ws_at<void>(io, pl.temp_offset);
  pp.mode = ScaleMode::kPlain;
  pp.noop = nullptr;
  launch_activation(ctx, pl, pp);
  return pp.out;
}

// The UNFUSED path of SPEC §5.1, taken by the FP8 block quantizer: the block kernel quantizes the temporary (a plain
// cast without dbias quantizes the input itself).
void run_fp8_block_path(const ActPlan& pl, const ActIO& io, const ExecCtx& ctx, const ActKernelParams& base) {
  const QuantSpec& spec = pl.spec;
  Fp8BlockParams p;
  p.x = pl.temp_offset >= 0 ? run_to_temp(pl, io, ctx, base) : io.x;
  p.noop = base.noop;
  p.rows = pl.rows;
  p.cols = pl.out_cols;
  p.amax_epsilon = float(spec.amax_epsilon);
  p.e4m3 = spec.e4m3();
  p.force_pow2 = spec.force_pow2();
  p.two_d = spec.block_dim == 2;
  p.row_data = out_at<uint8_t>(pl, io, kRowData);
  p.row_scale = out_at<float>(pl, io, kRowScaleInv);
  p.col_data = out_at<uint8_t>(pl, io, kColData);
  p.col_scale = out_at<float>(pl, io, kColScaleInv);
  TE_ON_DEVICE(ctx, quantize_fp8_block_cuda(pl.req.x.dtype, p, stream_of(ctx)),
               quantize_fp8_block_cpu(pl.req.x.dtype, p, *ctx.parallel_for));
}

// NVFP4's global amaxes of a call (SPEC §4.6) into amax[0..1]: of the unrounded FP32 activation (the activation
// kernel's amax pass) or, for a plain cast and with RHT, of the values cast (`src`), the columnwise one of the
// transformed transpose.
void nvfp4_amaxes(const ActPlan& pl, const ExecCtx& ctx, const ActKernelParams& base, const void* src, float* amax) {
  const QuantSpec& spec = pl.spec;
  const bool identity = pl.req.kind == ActKind::kIdentity && !pl.req.backward;
  if (!identity && !spec.rht()) return run_amax_pass(pl, ctx, base, amax);
  zero_bytes(ctx, amax, 2 * sizeof(float));
  const bool rht_col = spec.rht() && spec.columnwise;
  Nvfp4AmaxParams ap;
  ap.x = src;
  ap.amax_row = amax;
  ap.amax_col = rht_col ? amax + 1 : nullptr;
  ap.rows = pl.rows;
  ap.cols = pl.out_cols;
  ap.rht = rht_col;
  ap.rht_sign_mask = spec.random_sign_mask() ? kRhtSignMask : 0u;
  const DType dt = pl.req.x.dtype;
  TE_ON_DEVICE(ctx, nvfp4_amax_cuda(dt, ap, stream_of(ctx)), nvfp4_amax_cpu(dt, ap, *ctx.parallel_for));
}

// NVFP4 (SPEC §5.1). Without RHT (FUSED_ACTIVATION_AMAX_NVFP4): the global amax is taken over the unrounded FP32
// activation by the activation kernel's amax pass, then rnd_in(act(x)) is written to a temporary (with the dbias
// partials of the unrounded values) and cast with that amax for both copies. A plain cast reads x directly and
// takes its amax from x. With RHT (UNFUSED): rnd_in(act(x)) in a temporary, then the ordinary cast of it, amaxes
// (rowwise of the values, columnwise of the transformed transpose) included. An amax given in the spec (already
// reduced over devices; never with RHT's columnwise copy) replaces the amax passes.
void run_nvfp4_path(const ActPlan& pl, const ActIO& io, const ExecCtx& ctx, const ActKernelParams& base) {
  const QuantSpec& spec = pl.spec;
  const ActRequest& r = pl.req;
  const DType dt = r.x.dtype;
  const bool given = spec.amax != nullptr;
  float* amax = given ? spec.amax : ws_at<float>(io, pl.amax_offset);
  if (nvfp4_fused(pl, io)) {
    if (!given) run_amax_pass(pl, ctx, base, amax);
    ActKernelParams pq = base;
    pq.mode = ScaleMode::kNvfp4;
    pq.amax = amax;
    pq.out = out_at<void>(pl, io, kRowData);
    pq.blk_scale = out_at<uint8_t>(pl, io, kRowScaleInv);
    pq.out_t = out_at<uint8_t>(pl, io, kColData);
    pq.blk_scale_t = out_at<uint8_t>(pl, io, kColScaleInv);
    pq.nv_amax_out[0] = out_at<float>(pl, io, kAmaxRow);
    pq.nv_amax_out[1] = out_at<float>(pl, io, kAmaxCol);
    pq.blk_swizzled = spec.swizzled();
    launch_activation(ctx, pl, pq);  // with the dbias partials of the unrounded values, if asked
    return;
  }
  const bool identity = r.kind == ActKind::kIdentity && !r.backward;
  const bool rht_col = spec.rht() && spec.columnwise;
  const void* src = io.x;
  if (pl.temp_offset >= 0) {
    ActKernelParams pp = base;
    pp.out = ws_at<void>(io, pl.temp_offset);
    pp.mode = ScaleMode::kPlain;
    launch_activation(ctx, pl, pp);
    if (!identity) src = pp.out;
  }
  if (!given) nvfp4_amaxes(pl, ctx, base, src, amax);
  Nvfp4Params p;
  p.x = src;
  p.noop = base.noop;
  p.rows = pl.rows;
  p.cols = pl.out_cols;
  p.amax_in_row = amax;
  p.amax_in_col = rht_col ? amax + 1 : amax;
  p.two_d = spec.two_d();
  p.sr = spec.stochastic_rounding();
  p.rht = rht_col;
  p.rht_sign_mask = spec.random_sign_mask() ? kRhtSignMask : 0u;
  p.swizzled = spec.swizzled();
  if (p.sr) p.rng = spec.rng;
  p.row_data = out_at<uint8_t>(pl, io, kRowData);
  p.row_scale = out_at<uint8_t>(pl, io, kRowScaleInv);
  p.amax_out_row = out_at<float>(pl, io, kAmaxRow);
  p.col_data = out_at<uint8_t>(pl, io, kColData);
  p.col_scale = out_at<uint8_t>(pl, io, kColScaleInv);
  p.amax_out_col = out_at<float>(pl, io, kAmaxCol);
  TE_ON_DEVICE(ctx, quantize_nvfp4_cuda(dt, p, stream_of(ctx)), quantize_nvfp4_cpu(dt, p, *ctx.parallel_for));
}

void reduce_dbias(const ActPlan& pl, const ActIO& io, const ExecCtx& ctx) {
  void* grad_bias = io.out[kGradBias];
  if (pl.rows == 0 || pl.out_cols == 0) {
    zero_bytes(ctx, grad_bias, pl.pieces[kGradBias].bytes());
    return;
  }
  const float* partial = ws_at<float>(io, pl.dbias_offset);
  const DType dt = pl.pieces[kGradBias].dtype;  // the input dtype, or FP32 (PlanOptions::dbias_fp32)
  TE_ON_DEVICE(ctx, dbias_reduce_cuda(partial, pl.dbias_rows, pl.out_cols, dt, grad_bias, stream_of(ctx)),
               dbias_reduce_cpu(partial, pl.dbias_rows, pl.out_cols, dt, grad_bias));
}

}  // namespace

int64_t workspace_bytes(const ActPlan& plan, const ActIO& io) {
  if (plan.spec.kind == QuantKind::kNvfp4 && plan.temp_offset >= 0 && nvfp4_fused(plan, io)) return plan.temp_offset;
  return plan.workspace_bytes;
}

void run_act(const ActPlan& pl, const ActIO& io, const ExecCtx& ctx) {
  if (io.workspace_bytes < workspace_bytes(pl, io)) {
    fail(ErrorKind::kRuntime, op_name(pl.req) + ": the workspace has " + std::to_string(io.workspace_bytes) +
                                " bytes, the plan needs " + std::to_string(workspace_bytes(pl, io)));
  }
  const ActRequest& r = pl.req;
  ActKernelParams p;
  p.x = io.x;
  p.grad = io.grad;
  p.rows = pl.rows;
  p.cols = pl.cols;
  p.act = r.args;
  p.noop = pl.spec.noop;
  if (pl.amax_only) return run_amax_pass(pl, ctx, p, out_at<float>(pl, io, kAmaxRow));
  if (r.with_dbias) p.dbias_partial = ws_at<float>(io, pl.dbias_offset);
  switch (pl.spec.kind) {
    case QuantKind::kNone:
      p.out = io.out[kRowData];
      p.mode = ScaleMode::kPlain;
      launch_activation(ctx, pl, p);
      break;
    case QuantKind::kFp8Delayed:
    case QuantKind::kFp8Current: run_fp8_per_tensor(pl, io, ctx, p); break;
    case QuantKind::kMxfp8: run_mxfp8_path(pl, io, ctx, p); break;
    case QuantKind::kFp8Block: run_fp8_block_path(pl, io, ctx, p); break;
    case QuantKind::kNvfp4: run_nvfp4_path(pl, io, ctx, p); break;
  }
  if (r.with_dbias) reduce_dbias(pl, io, ctx);
}

void compute_amax(const TensorView& x, float* amax, const ExecCtx& ctx) {
  zero_bytes(ctx, amax, sizeof(float));
  ActKernelParams p;
  p.x = x.data;
  p.mode = ScaleMode::kAmaxOnly;
  p.amax = amax;
  const int64_t k = x.shape.ndim == 0 ? 1 : x.shape.back();
  p.cols = k;
  p.rows = k > 0 ? x.shape.numel() / k : 0;
  TE_ON_DEVICE(ctx, activation_cuda(ActKind::kIdentity, false, x.dtype, p, stream_of(ctx)),
               activation_cpu(ActKind::kIdentity, false, x.dtype, p, *ctx.parallel_for));
}

}  // namespace ops
}  // namespace te
