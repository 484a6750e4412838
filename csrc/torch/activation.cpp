// Activation and cast ops (SPEC §3, §4.10, §5) on torch tensors: each op turns its tensors into the core's views,
// lets the core plan the call (checks, fusion path, output shapes: csrc/core/ops/plan.h), allocates what the plan
// asks for from torch's caching allocator and lets the core run it on the current stream (ops/run.h). A plain cast
// is the identity activation. What stays here is torch's: devices, contiguity, allocation, the generator, errors.
#include "../core/ops/run.h"
#include "bridge.h"

namespace te_torch {
namespace {

using te::ops::ActPlan;
using te::ops::Piece;
using QOut = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
using QOutBias = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

}  // namespace

// The dtype of the 0-element tensor a quantizing op returns for a piece its plan leaves out: data pieces uint8 with
// a quantizer, float32 without one; the rest float32. The eager ops and their fake kernels (plan_outputs) both use it.
at::ScalarType absent_dtype(Piece p, te::QuantKind kind) {
  const bool data = p == te::ops::kRowData || p == te::ops::kColData;
  return data && kind != te::QuantKind::kNone ? at::kByte : at::kFloat;
}

namespace {

// The buffers of one call as tensors, indexed by te::ops::Piece: the six quantized pieces of SPEC §1.4 in the order
// the ops return them, then grad_bias. A path leaves the pieces it does not produce undefined, so that ops that
// return none of them (act, dact, quantize_into) allocate nothing for them.
struct Outputs {
  Tensor t[te::ops::kNumPieces];

  // The op's return value: each absent piece becomes its own 0-element tensor (outputs of an op may not share
  // storage, so one empty tensor cannot stand for all of them) of absent_dtype.
  QOut returned(const Tensor& ref, te::QuantKind kind) const {
    const auto or_empty = [&](Piece p) { return t[p].defined() ? t[p] : new_placeholder(ref, absent_dtype(p, kind)); };
    return {or_empty(te::ops::kRowData), or_empty(te::ops::kRowScaleInv), or_empty(te::ops::kColData),
            or_empty(te::ops::kColScaleInv), or_empty(te::ops::kAmaxRow), or_empty(te::ops::kAmaxCol)};
  }
};

// One call of the family as a torch op makes it: the core's request and spec, the tensors behind them, and the
// explicit NVFP4 stochastic-rounding key of the `quantize` op (rng_seed < 0: torch's generator).
struct OpCall {
  te::ops::ActRequest r;
  te::ops::QuantSpec spec;
  Tensor x;
  c10::optional<Tensor> grad;
  int64_t rng_seed = -1, rng_offset = 0;
};

}  // namespace

c10::IntArrayRef sizes_of(const te::ops::Shape& s) { return c10::IntArrayRef(s.dims, size_t(s.ndim)); }

// A piece as the plan lays it out; a piece with room for scratch after its elements keeps its planned shape.
Tensor alloc_piece(const te::ops::PiecePlan& pc, const at::TensorOptions& options) {
  const auto opts = options.dtype(scalar_type_of(pc.dtype));
  if (pc.capacity == pc.shape.numel()) return new_empty_in_guard(sizes_of(pc.shape), opts);
  Tensor t = new_empty_in_guard({pc.capacity}, opts);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes_of(pc.shape));
  return t;
}

namespace {

// The torch side of a request's checks (dtypes and devices of the torch tensors; the core plans and checks the rest)
// and the input's core DType. Shared by the eager ops (prepare) and their fake kernels (plan_outputs).
te::DType check_torch_side(const te::ops::ActRequest& r, at::ScalarType x_dtype, c10::IntArrayRef x_sizes,
                           c10::Device x_device, at::ScalarType grad_dtype, c10::Device grad_device) {
  const te::DType dt = input_dtype(x_dtype, x_sizes, x_device, r.op, "input");
  if (r.backward) {
    // Checked here too: a grad dtype without a core DType (float64, int) cannot reach the core's check.
    TORCH_CHECK_TYPE(grad_dtype == x_dtype, te::ops::grad_dtype_message(r, dtype_name(grad_dtype), dtype_name(x_dtype)));
    TORCH_CHECK_VALUE(grad_device == x_device, te::ops::op_name(r), ": grad is on ", grad_device.str(),
                      " but the forward input is on ", x_device.str(), "; move both to one device");
  }
  return dt;
}

// check_torch_side, then the views of the contiguous input and grad.
void prepare(OpCall& c) {
  te::ops::ActRequest& r = c.r;
  const Tensor& g = r.backward ? *c.grad : c.x;
  const te::DType dt = check_torch_side(r, c.x.scalar_type(), c.x.sizes(), c.x.device(), g.scalar_type(), g.device());
  if (r.backward) {
    c.grad = c.grad->contiguous();
    r.has_grad = true;
    r.grad = view_of(*c.grad, dt, r.op);
  }
  c.x = c.x.contiguous();
  r.x = view_of(c.x, dt, r.op);
}

void bind(const ActPlan& plan, const OpCall& c, const Outputs& o, te::ops::ActIO& io) {
  io.x = c.r.x.data;
  io.grad = c.r.has_grad ? c.r.grad.data : nullptr;
  for (int i = 0; i < te::ops::kNumPieces; ++i) {
    if (plan.pieces[i].present) io.out[i] = o.t[i].data_ptr();
  }
}

// Runs a planned call into `o` (a tensor for every piece the plan has): binds the buffers, draws the random bits,
// allocates the workspace and runs the plan as it is (a call is planned once; nothing here plans again).
void run_planned(const OpCall& c, ActPlan& plan, const Outputs& o, const te::ops::ExecCtx& ctx) {
  te::ops::ActIO io;
  bind(plan, c, o, io);
  if (plan.needs_rng()) plan.spec.rng = nvfp4_rng_state(c.rng_seed, c.rng_offset, c.x);
  io.workspace_bytes = te::ops::workspace_bytes(plan, io);
  Tensor workspace;
  if (io.workspace_bytes > 0) {
    workspace = new_empty_in_guard({io.workspace_bytes}, c.x.options().dtype(at::kByte));
    io.workspace = workspace.data_ptr();
  }
  te::ops::run_act(plan, io, ctx);
}

// Plans the call once, allocates its outputs and its workspace from that plan, and runs it.
Outputs run_call(OpCall& c) {
  prepare(c);
  TE_DEVICE_GUARD(c.x);
  const te::ops::ExecCtx ctx = exec_ctx(c.x);
  ActPlan plan = te::ops::plan_act(c.r, c.spec, ctx);
  Outputs o;
  const at::TensorOptions options = c.x.options();
  for (int i = 0; i < te::ops::kNumPieces; ++i) {
    if (plan.pieces[i].present) o.t[i] = alloc_piece(plan.pieces[i], options);
  }
  run_planned(c, plan, o, ctx);
  return o;
}

// Runs a quantizing op and returns its fixed tuple (SPEC §1.4), [grad_bias] first for the dbias ops. Absent data
// pieces are uint8 with a quantizer, float32 without one, as the fake kernels in _ops.py say.
QOut returned(const Outputs& o, const OpCall& c) { return o.returned(c.x, c.spec.kind); }

QOut run_quantizing(OpCall& c) { return returned(run_call(c), c); }

QOutBias run_quantizing_with_bias(OpCall& c) {
  const Outputs o = run_call(c);
  return std::tuple_cat(std::make_tuple(o.t[te::ops::kGradBias]), returned(o, c));
}

te::ActArgs act_args(double limit, double alpha, double offset) {
  te::ActArgs a;
  a.limit = float(limit);
  a.alpha = float(alpha);
  a.glu_linear_offset = float(offset);
  return a;
}

// The family's ops, each stated once for the eager kernels and the fake kernels' planner (plan_outputs): whether it
// takes an activation code (else the identity), runs backward (takes grad), returns dbias, and what it returns.
enum class Returns { kPlain, kQuantized, kNothing };  // kQuantized: the six pieces ([grad_bias] first with dbias)
struct OpInfo {
  const char* name;
  bool act, backward, with_dbias;
  Returns returns;
};
constexpr OpInfo kAct{"act", true, false, false, Returns::kPlain};
constexpr OpInfo kDact{"dact", true, true, false, Returns::kPlain};
constexpr OpInfo kActQuantize{"act_quantize", true, false, false, Returns::kQuantized};
constexpr OpInfo kDactQuantize{"dact_quantize", true, true, false, Returns::kQuantized};
constexpr OpInfo kDbiasDact{"dbias_dact", true, true, true, Returns::kQuantized};
constexpr OpInfo kQuantize{"quantize", false, false, false, Returns::kQuantized};
constexpr OpInfo kBgradQuantize{"bgrad_quantize", false, false, true, Returns::kQuantized};
constexpr OpInfo kQuantizeInto{"quantize_into", false, false, false, Returns::kNothing};
constexpr const OpInfo* kOps[] = {&kAct,      &kDact,          &kActQuantize,  &kDactQuantize,
                                  &kDbiasDact, &kQuantize, &kBgradQuantize, &kQuantizeInto};

// The request of a call of `op` (the activation code checked); tensors and spec are filled in by the caller.
te::ops::ActRequest request_of(const OpInfo& op, int64_t code, te::ActArgs args) {
  te::ops::ActRequest r;
  r.op = op.name;
  r.kind = op.act ? te::ops::act_kind(op.name, code) : te::ActKind::kIdentity;
  r.backward = op.backward;
  r.with_dbias = op.with_dbias;
  r.args = args;
  return r;
}

OpCall make_call(const OpInfo& op, int64_t code, te::ActArgs args, const Tensor& x, const c10::optional<Tensor>& grad) {
  OpCall c;
  c.r = request_of(op, code, args);
  c.x = x;
  c.grad = grad;
  return c;
}

}  // namespace

// The core's checked spec, then the checks of its tensors (one-element float32 on the input's device) and their
// pointers.
te::ops::QuantSpec make_spec(const char* op, TE_QSPEC_PARAMS, const Tensor& input) {
  te::ops::QuantSpec s = te::ops::make_spec(op, qkind, qdtype, rowwise, columnwise, qflags, amax_epsilon, block_dim,
                                            scale.has_value(), amax.has_value());
  if (s.kind == te::QuantKind::kFp8Delayed) {
    check_scalar_f32(*scale, input, op, "Float8Quantizer.scale");
    check_scalar_f32(*amax, input, op, "Float8Quantizer.amax");
    s.scale = scale->data_ptr<float>();
    s.amax = amax->data_ptr<float>();
  }
  if (s.kind == te::QuantKind::kFp8Current && amax.has_value()) {
    check_scalar_f32(*amax, input, op, "amax");
    s.amax = amax->data_ptr<float>();
  }
  if (noop.has_value()) {
    check_scalar_f32(*noop, input, op, "noop");
    s.noop = noop->data_ptr<float>();
  }
  return s;
}

namespace {

Tensor act(const Tensor& x, int64_t code, double limit, double alpha, double offset) {
  return with_torch_errors([&] {
    OpCall c = make_call(kAct, code, act_args(limit, alpha, offset), x, c10::nullopt);
    return run_call(c).t[te::ops::kRowData];
  });
}

Tensor dact(const Tensor& grad, const Tensor& x, int64_t code, double limit, double alpha, double offset) {
  return with_torch_errors([&] {
    OpCall c = make_call(kDact, code, act_args(limit, alpha, offset), x, grad);
    return run_call(c).t[te::ops::kRowData];
  });
}

QOut act_quantize(const Tensor& x, int64_t code, double limit, double alpha, double offset, TE_QSPEC_PARAMS) {
  return with_torch_errors([&] {
    OpCall c = make_call(kActQuantize, code, act_args(limit, alpha, offset), x, c10::nullopt);
    c.spec = TE_QSPEC_ARGS("act_quantize", x);
    return run_quantizing(c);
  });
}

QOut dact_quantize(const Tensor& grad, const Tensor& x, int64_t code, double limit, double alpha, double offset,
                   TE_QSPEC_PARAMS) {
  return with_torch_errors([&] {
    OpCall c = make_call(kDactQuantize, code, act_args(limit, alpha, offset), x, grad);
    c.spec = TE_QSPEC_ARGS("dact_quantize", x);
    return run_quantizing(c);
  });
}

QOutBias dbias_dact(const Tensor& grad, const Tensor& x, int64_t code, TE_QSPEC_PARAMS) {
  return with_torch_errors([&] {
    OpCall c = make_call(kDbiasDact, code, te::ActArgs{}, x, grad);
    c.spec = TE_QSPEC_ARGS("dbias_dact", x);
    return run_quantizing_with_bias(c);
  });
}

// rng_seed >= 0: NVFP4 stochastic rounding with this (seed, offset) instead of the device generator's (ours: the
// same bytes on every device, for reproducibility and the CPU/CUDA parity tests).
QOut quantize(const Tensor& x, TE_QSPEC_PARAMS, int64_t rng_seed, int64_t rng_offset) {
  TORCH_CHECK_VALUE(qkind != 0, "quantize: a quantizer is required (use the tensor as it is)");
  TORCH_CHECK_VALUE(rng_offset >= 0, "quantize: rng_offset must be >= 0, got ", std::to_string(rng_offset));
  return with_torch_errors([&] {
    OpCall c = make_call(kQuantize, 0, te::ActArgs{}, x, c10::nullopt);
    c.spec = TE_QSPEC_ARGS("quantize", x);
    c.rng_seed = rng_seed;
    c.rng_offset = rng_offset;
    return run_quantizing(c);
  });
}

QOutBias bgrad_quantize(const Tensor& x, TE_QSPEC_PARAMS) {
  return with_torch_errors([&] {
    OpCall c = make_call(kBgradQuantize, 0, te::ActArgs{}, x, c10::nullopt);
    c.spec = TE_QSPEC_ARGS("bgrad_quantize", x);
    return run_quantizing_with_bias(c);
  });
}

// A buffer the caller passed for piece `p` must be exactly what the plan would have allocated.
void check_buffer(const Tensor& t, const te::ops::PiecePlan& pc, const Tensor& ref, const char* op, const char* what) {
  const at::ScalarType dtype = scalar_type_of(pc.dtype);
  const c10::IntArrayRef shape = sizes_of(pc.shape);
  TORCH_CHECK_VALUE(t.scalar_type() == dtype && t.sizes() == shape && t.is_contiguous() &&
                        t.device() == ref.device(),
                    op, ": output buffer ", what, " must be a contiguous ", dtype_name(dtype), " tensor of shape ",
                    shape_str(shape), " on ", ref.device().str(), ", got ", dtype_name(t.scalar_type()), " ",
                    shape_str(t), " on ", t.device().str());
}

// The caller's buffers of a block-format output (quantize_into): a copy is written when the quantizer asks for it
// and both its buffers are given (the plan's usage, PlanOptions::write_*); each given buffer must have the plan's
// shape, dtype and device.
void take_block_buffers(const OpCall& c, const ActPlan& plan, Outputs& o, const std::string& format,
                        const c10::optional<Tensor>& row_data, const c10::optional<Tensor>& row_scale_inv,
                        const c10::optional<Tensor>& col_data, const c10::optional<Tensor>& col_scale_inv,
                        const char* col_data_name) {
  const char* op = c.r.op;
  TORCH_CHECK_VALUE(plan.spec.rowwise || plan.spec.columnwise, op, ": the ", format,
                    " output has no buffers for the requested usage");
  if (plan.spec.rowwise) {
    o.t[te::ops::kRowData] = *row_data;
    o.t[te::ops::kRowScaleInv] = *row_scale_inv;
    check_buffer(*row_data, plan.pieces[te::ops::kRowData], c.x, op, "_rowwise_data");
    check_buffer(*row_scale_inv, plan.pieces[te::ops::kRowScaleInv], c.x, op, "_rowwise_scale_inv");
  }
  if (plan.spec.columnwise) {
    o.t[te::ops::kColData] = *col_data;
    o.t[te::ops::kColScaleInv] = *col_scale_inv;
    check_buffer(*col_data, plan.pieces[te::ops::kColData], c.x, op, col_data_name);
    check_buffer(*col_scale_inv, plan.pieces[te::ops::kColScaleInv], c.x, op, "_columnwise_scale_inv");
  }
}

void quantize_into(const Tensor& x, TE_QSPEC_PARAMS, const c10::optional<Tensor>& row_data,
                   const c10::optional<Tensor>& row_scale_inv, const c10::optional<Tensor>& col_data,
                   const c10::optional<Tensor>& col_scale_inv) {
  const char* op = "quantize_into";
  TORCH_CHECK_VALUE(qkind >= 1 && qkind <= 5, op,
                    ": in-place quantization supports FP8 per-tensor, MXFP8, NVFP4 and FP8 block quantizers (kinds "
                    "1-5), got ", std::to_string(qkind));
  with_torch_errors([&] {
    OpCall c = make_call(kQuantizeInto, 0, te::ActArgs{}, x, c10::nullopt);
    c.spec = TE_QSPEC_ARGS(op, x);
    prepare(c);
    TE_DEVICE_GUARD(c.x);
    const te::ops::ExecCtx ctx = exec_ctx(c.x);
    // One plan: checked for the quantizer's whole usage (the format's shape rules), laid out for the copies the
    // caller gave buffers for; its pieces are the shapes those buffers must have.
    const bool per_tensor = c.spec.kind == te::QuantKind::kFp8Delayed || c.spec.kind == te::QuantKind::kFp8Current;
    te::ops::PlanOptions opt;
    opt.exact_outputs = true;
    opt.write_rowwise = row_data.has_value() && (per_tensor || row_scale_inv.has_value());
    opt.write_columnwise = col_data.has_value() && (per_tensor || col_scale_inv.has_value());
    ActPlan plan = te::ops::plan_act(c.r, c.spec, ctx, opt);
    Outputs o;
    if (c.spec.kind == te::QuantKind::kNvfp4) {
      // The amax pair [rowwise, columnwise] (float32 [2], written in place) comes in the spec's amax field.
      TORCH_CHECK_VALUE(amax.has_value(), op, ": NVFP4 in-place quantization needs the output's amax pair");
      const Tensor amax_pair = *amax;
      te::ops::PiecePlan pair;
      pair.dtype = te::DType::kFloat32;
      pair.shape = te::ops::Shape::of(2);
      check_buffer(amax_pair, pair, x, op, "amax pair [_amax_rowwise, _amax_columnwise]");
      take_block_buffers(c, plan, o, "NVFP4", row_data, row_scale_inv, col_data, col_scale_inv, "_columnwise_data");
      if (plan.spec.rowwise) o.t[te::ops::kAmaxRow] = amax_pair.narrow(0, 0, 1);
      if (plan.spec.columnwise) o.t[te::ops::kAmaxCol] = amax_pair.narrow(0, 1, 1);
    } else if (c.spec.kind == te::QuantKind::kMxfp8) {
      take_block_buffers(c, plan, o, "MXFP8", row_data, row_scale_inv, col_data, col_scale_inv, "_columnwise_data");
    } else if (c.spec.kind == te::QuantKind::kFp8Block) {
      take_block_buffers(c, plan, o, c.spec.fp8_block_name(), row_data, row_scale_inv, col_data, col_scale_inv,
                         "_columnwise_data (transposed)");
    } else {
      TORCH_CHECK_VALUE(row_scale_inv.has_value(), op, ": the output's scale_inv buffer is missing");
      check_buffer(*row_scale_inv, plan.pieces[te::ops::kRowScaleInv], x, op, "_scale_inv");
      o.t[te::ops::kRowScaleInv] = *row_scale_inv;
      if (plan.spec.rowwise) {
        o.t[te::ops::kRowData] = *row_data;
        check_buffer(*row_data, plan.pieces[te::ops::kRowData], x, op, "_data");
      }
      if (plan.spec.columnwise) {
        o.t[te::ops::kColData] = *col_data;
        check_buffer(*col_data, plan.pieces[te::ops::kColData], x, op, "_transpose");
      }
    }
    run_planned(c, plan, o, ctx);
  });
}

void compute_amax(const Tensor& x, const Tensor& amax) {
  const char* op = "compute_amax";
  const te::DType dt = input_dtype(x, op, "input");
  check_scalar_f32(amax, x, op, "amax");
  const Tensor xc = x.contiguous();
  TE_DEVICE_GUARD(x);
  with_torch_errors([&] { te::ops::compute_amax(view_of(xc, dt, op), amax.data_ptr<float>(), exec_ctx(xc)); });
}

}  // namespace

std::vector<std::pair<std::vector<int64_t>, at::ScalarType>> plan_outputs(const std::string& op, int64_t act,
                                                                          const MetaTensor& x,
                                                                          const c10::optional<MetaTensor>& grad,
                                                                          const c10::optional<MetaSpec>& spec) {
  const OpInfo* info = nullptr;
  for (const OpInfo* o : kOps) {
    if (op == o->name && o->returns != Returns::kNothing) info = o;
  }
  TORCH_CHECK_VALUE(info != nullptr, "plan_outputs: ", op, " is not an op of the activation / cast family that "
                    "returns tensors (act, dact, act_quantize, dact_quantize, dbias_dact, quantize, bgrad_quantize)");
  TORCH_CHECK_VALUE(info->backward == grad.has_value(), "plan_outputs: ", op,
                    info->backward ? " takes grad" : " takes no grad");
  const bool quantizing = info->returns == Returns::kQuantized;
  TORCH_CHECK_VALUE(quantizing == spec.has_value(), "plan_outputs: ", op,
                    quantizing ? " takes a quantizer spec" : " takes no quantizer spec");
  return with_torch_errors([&] {
    // As the eager op: the request (activation code), the core's spec checks, the torch side, the core's plan.
    te::ops::ActRequest r = request_of(*info, act, te::ActArgs{});
    te::ops::QuantSpec s;
    if (spec) {
      s = te::ops::make_spec(r.op, spec->qkind, spec->qdtype, spec->rowwise, spec->columnwise, spec->qflags,
                             spec->amax_epsilon, spec->block_dim, spec->has_scale, spec->has_amax);
    }
    const MetaTensor& g = grad ? *grad : x;
    const te::DType dt = check_torch_side(r, x.dtype, x.sizes, x.device, g.dtype, g.device);
    r.x.dtype = dt;
    r.x.shape = shape_of(x.sizes, x.device, r.op);
    if (grad) {
      r.has_grad = true;
      r.grad.dtype = dt;
      r.grad.shape = shape_of(g.sizes, g.device, r.op);
    }
    // The device kind and index alone (for messages): no stream, no data, nothing launched.
    te::ops::ExecCtx ctx;
    ctx.cuda = x.device.is_cuda();
    ctx.device_index = ctx.cuda ? x.device.index() : -1;
    const ActPlan plan = te::ops::plan_act(r, s, ctx);
    std::vector<std::pair<std::vector<int64_t>, at::ScalarType>> out;
    const auto piece = [&](Piece p) {
      const te::ops::PiecePlan& pc = plan.pieces[p];
      if (pc.present) {
        out.emplace_back(std::vector<int64_t>(pc.shape.dims, pc.shape.dims + pc.shape.ndim), scalar_type_of(pc.dtype));
      } else {
        out.emplace_back(std::vector<int64_t>{0}, absent_dtype(p, s.kind));
      }
    };
    if (!quantizing) {
      piece(te::ops::kRowData);
      return out;
    }
    if (info->with_dbias) piece(te::ops::kGradBias);
    for (int p = te::ops::kRowData; p <= te::ops::kAmaxCol; ++p) piece(Piece(p));
    return out;
  });
}

static void activation_impls(torch::Library& m) {
  m.impl("act", &act);
  m.impl("dact", &dact);
  m.impl("act_quantize", &act_quantize);
  m.impl("dact_quantize", &dact_quantize);
  m.impl("dbias_dact", &dbias_dact);
  m.impl("quantize", &quantize);
  m.impl("quantize_into", &quantize_into);
  m.impl("bgrad_quantize", &bgrad_quantize);
  m.impl("compute_amax", &compute_amax);
}
TE_IMPL_CPU_AND_CUDA(activation_impls)

}  // namespace te_torch
