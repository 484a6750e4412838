// The frontend-neutral planner (csrc/core/ops/plan.h) on its own: compiled with the core's headers and plan.cpp only,
// no torch, as a JAX frontend will use it. Checks the output plan of each quantizer kind and the error kinds of the
// checks. Prints one line per case, "<name> ok"; exits non-zero at the first mismatch.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ops/plan.h"

using namespace te;
using namespace te::ops;

namespace {

int g_failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what);
    ++g_failures;
  }
}

ActRequest request(const char* op, ActKind kind, bool backward, bool with_dbias, Shape x, DType dt) {
  ActRequest r;
  r.op = op;
  r.kind = kind;
  r.backward = backward;
  r.with_dbias = with_dbias;
  r.x.dtype = dt;
  r.x.shape = x;
  if (backward) {  // grad of the forward output
    r.has_grad = true;
    r.grad = r.x;
    if (act_is_gated(kind)) r.grad.shape.dims[x.ndim - 1] /= 2;
  }
  return r;
}

bool piece_is(const ActPlan& pl, Piece p, DType dt, Shape s) {
  return pl.pieces[p].present && pl.pieces[p].dtype == dt && pl.pieces[p].shape == s;
}

// Runs f, expecting a te::Error of `kind` whose message starts with `prefix`.
template <typename F> void expect_error(F f, ErrorKind kind, const std::string& prefix, const char* what) {
  try {
    f();
  } catch (const Error& e) {
    expect(e.kind == kind && std::string(e.what()).rfind(prefix, 0) == 0, what);
    return;
  }
  expect(false, what);
}

}  // namespace

int main() {
  const ExecCtx cpu;
  ExecCtx cuda;
  cuda.cuda = true;
  cuda.device_index = 0;
  cuda.arch = "sm_90";  // a message may name it; nothing here touches a device

  {  // MXFP8, both copies of gelu(x): not transposed, padded E8M0 scales, nothing in the workspace.
    QuantSpec s = make_spec("act_quantize", 3, 7, true, true, 0, 0.0, 1, false, false);
    const ActPlan pl = plan_act(request("act_quantize", ActKind::kGelu, false, false, Shape::of(4, 64), DType::kBFloat16),
                                s, cpu);
    expect(pl.path == FusionPath::kFullyFused, "mxfp8 path");
    expect(piece_is(pl, kRowData, DType::kByte, Shape::of(4, 64)), "mxfp8 row_data");
    expect(piece_is(pl, kRowScaleInv, DType::kByte, Shape::of(128, 4)), "mxfp8 row_scale_inv");
    expect(piece_is(pl, kColData, DType::kByte, Shape::of(4, 64)), "mxfp8 col_data");
    expect(piece_is(pl, kColScaleInv, DType::kByte, Shape::of(4, 128)), "mxfp8 col_scale_inv");
    expect(!pl.pieces[kAmaxRow].present && !pl.pieces[kGradBias].present, "mxfp8 absent pieces");
    expect(pl.workspace_bytes == 0, "mxfp8 workspace");
    std::puts("mxfp8 ok");
  }
  {  // FP8 current scaling: the amax rides after scale_inv's element, or (exact outputs) in the workspace.
    QuantSpec s = make_spec("quantize", 2, 7, true, true, 0, 0.0, 1, false, false);
    const ActRequest r = request("quantize", ActKind::kIdentity, false, false, Shape::of(3, 5), DType::kFloat32);
    const ActPlan own = plan_act(r, s, cpu);
    expect(own.path == FusionPath::kFusedActivationAmaxFp8, "current path");
    expect(piece_is(own, kColData, DType::kByte, Shape::of(5, 3)), "current col_data transposed");
    expect(own.amax_in_scale_inv && own.pieces[kRowScaleInv].capacity == 2 && own.workspace_bytes == 0,
           "current amax in scale_inv");
    PlanOptions exact;
    exact.exact_outputs = true;
    const ActPlan given = plan_act(r, s, cpu, exact);
    expect(!given.amax_in_scale_inv && given.pieces[kRowScaleInv].capacity == 1 && given.amax_offset == 0 &&
               given.workspace_bytes == 256,
           "current amax in workspace");
    std::puts("fp8_current ok");
  }
  {  // NVFP4 of swiglu(x): packed codes, transposed columnwise copy, the amax pair and the temporary in the workspace.
    QuantSpec s = make_spec("act_quantize", 4, 10, true, true, 0, 0.0, 1, false, false);
    const ActPlan pl = plan_act(
        request("act_quantize", ActKind::kSwiglu, false, false, Shape::of(32, 64), DType::kBFloat16), s, cuda);
    expect(pl.out_shape == Shape::of(32, 32), "nvfp4 out_shape");
    expect(piece_is(pl, kRowData, DType::kByte, Shape::of(32, 16)), "nvfp4 row_data");
    expect(piece_is(pl, kColData, DType::kByte, Shape::of(32, 16)), "nvfp4 col_data");
    expect(piece_is(pl, kAmaxRow, DType::kFloat32, Shape::of(1)) && piece_is(pl, kAmaxCol, DType::kFloat32, Shape::of(1)),
           "nvfp4 amaxes");
    expect(pl.nvfp4_fused_candidate && pl.temp_offset == 256 && pl.workspace_bytes == 256 + 32 * 32 * 2,
           "nvfp4 workspace");
    std::puts("nvfp4 ok");
  }
  {  // dbias of dgelu without a quantizer: the plain output, grad_bias and the partial sums.
    const ActPlan pl = plan_act(request("dbias_dact", ActKind::kGelu, true, true, Shape::of(8, 16), DType::kFloat16),
                                QuantSpec{}, cpu);
    expect(piece_is(pl, kRowData, DType::kFloat16, Shape::of(8, 16)), "dbias row_data");
    expect(piece_is(pl, kGradBias, DType::kFloat16, Shape::of(16)), "dbias grad_bias");
    expect(pl.dbias_offset == 0 && pl.workspace_bytes >= 4 * pl.dbias_rows * 16, "dbias workspace");
    std::puts("dbias ok");
  }
  {  // The halves of a sharded call: the amax pass alone (one f32 piece, no workspace); dbias in FP32.
    QuantSpec s = make_spec("act_quantize", 4, 10, true, true, 0, 0.0, 1, false, false);
    PlanOptions amax_only;
    amax_only.amax_only = true;
    const ActPlan pl = plan_act(
        request("act_quantize", ActKind::kSwiglu, false, false, Shape::of(32, 64), DType::kBFloat16), s, cuda, amax_only);
    expect(pl.amax_only && piece_is(pl, kAmaxRow, DType::kFloat32, Shape::of(1)) && pl.workspace_bytes == 0,
           "amax_only amax piece");
    expect(!pl.pieces[kRowData].present && !pl.pieces[kColData].present && !pl.pieces[kAmaxCol].present,
           "amax_only nothing else");
    PlanOptions fp32;
    fp32.dbias_fp32 = true;
    const ActPlan db = plan_act(request("dbias_dact", ActKind::kGelu, true, true, Shape::of(8, 16), DType::kBFloat16),
                                QuantSpec{}, cpu, fp32);
    expect(piece_is(db, kGradBias, DType::kFloat32, Shape::of(16)), "dbias_fp32 grad_bias");
    std::puts("sharded ok");
  }
  {  // One plan per call: the counter moves once per plan_act. any_device: the largest workspace (CUDA's one-launch
     // amax slots) with the shapes every device gets. write_*: checked for the whole usage, laid out for one copy.
    QuantSpec s = make_spec("quantize", 2, 7, true, false, 0, 0.0, 1, false, false);
    const ActRequest r = request("quantize", ActKind::kIdentity, false, false, Shape::of(3, 5), DType::kFloat32);
    PlanOptions exact;
    exact.exact_outputs = true;
    PlanOptions any = exact;
    any.any_device = true;
    const int64_t before = plan_act_calls();
    const ActPlan on_cpu = plan_act(r, s, cpu, exact);
    const ActPlan on_cuda = plan_act(r, s, cuda, exact);
    const ActPlan anywhere = plan_act(r, s, cpu, any);
    expect(plan_act_calls() - before == 3, "counter");
    expect(anywhere.workspace_bytes == on_cuda.workspace_bytes && anywhere.workspace_bytes > on_cpu.workspace_bytes,
           "any_device workspace");
    for (int p = 0; p < kNumPieces; ++p) {
      expect(anywhere.pieces[p].present == on_cpu.pieces[p].present && anywhere.pieces[p].shape == on_cpu.pieces[p].shape,
             "any_device shapes");
    }
    QuantSpec nv = make_spec("quantize", 4, 10, true, true, 0, 0.0, 1, false, false);
    PlanOptions row_only = exact;
    row_only.write_columnwise = false;
    const ActRequest rows8 = request("quantize", ActKind::kIdentity, false, false, Shape::of(8, 32), DType::kFloat32);
    expect_error([&] { plan_act(rows8, nv, cpu, row_only); }, ErrorKind::kValue,
                 "quantize: NVFP4 columnwise usage quantizes 16x1 blocks", "write_rowwise checks the whole usage");
    const ActPlan one = plan_act(request("quantize", ActKind::kIdentity, false, false, Shape::of(16, 32),
                                         DType::kFloat32), nv, cpu, row_only);
    expect(one.spec.rowwise && !one.spec.columnwise && piece_is(one, kRowData, DType::kByte, Shape::of(16, 16)) &&
               !one.pieces[kColData].present && !one.pieces[kAmaxCol].present,
           "write_rowwise lays out the rowwise copy");
    std::puts("once ok");
  }
  {  // The checks raise typed errors with the op's name first.
    expect_error([&] { plan_act(request("act", ActKind::kGeglu, false, false, Shape::of(4, 5), DType::kFloat32),
                                QuantSpec{}, cpu); },
                 ErrorKind::kValue, "geglu (te::act): gated activations split the last dim", "gated odd");
    expect_error([] { make_spec("quantize", 9, 7, true, true, 0, 0.0, 1, false, false); }, ErrorKind::kValue,
                 "quantize: quantizer kind 9 is not known", "unknown kind");
    expect_error([] { make_spec("quantize", 4, 10, true, true, (1 << 1) | (1 << 3), 0.0, 1, false, false); },
                 ErrorKind::kNotImplemented, "quantize: NVFP4 with both", "nvfp4 2d + rht");
    expect_error([&] {
      QuantSpec s = make_spec("quantize", 4, 10, true, true, 1 << 3, 0.0, 1, false, false);
      plan_act(request("quantize", ActKind::kIdentity, false, false, Shape::of(16, 16), DType::kFloat32), s, cuda);
    }, ErrorKind::kType, "quantize: NVFP4 with the random Hadamard transform", "nvfp4 rht float32");
    expect_error([] { act_kind("act", 100); }, ErrorKind::kValue, "act: activation code 100 is not known", "act code");
    std::puts("errors ok");
  }
  return g_failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
