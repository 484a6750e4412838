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

// The buffers of one call as tensors, indexed by te::ops::Piece: the six quantized pieces of SPEC §1.4 in the order
// the ops return them, then grad_bias. A path leaves the pieces it does not produce undefined, so that ops that
// return none of them (act, dact, quantize_into) allocate nothing for them.
struct Outputs {
  Tensor t[te::ops::kNumPieces];

  // The op's return value: each absent piece becomes its own 0-element tensor (outputs of an op may not share
  // storage, so one empty tensor cannot stand for all of them), data pieces in `data_dtype`, the rest float32.
  QOut returned(const Tensor& ref, at::ScalarType data_dtype) const {
    const auto or_empty = [&](Piece p, at::ScalarType dtype) {
      return t[p].defined() ? t[p] : new_placeholder(ref, dtype);
    };
    return {or_empty(te::ops::kRowData, data_dtype), or_empty(te::ops::kRowScaleInv, at::kFloat),
            or_empty(te::ops::kColData, data_dtype),  or_empty(te::ops::kColScaleInv, at::kFloat),
            or_empty(te::ops::kAmaxRow, at::kFloat),  or_empty(te::ops::kAmaxCol, at::kFloat)};
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

c10::IntArrayRef sizes_of(const te::ops::Shape& s) { return c10::IntArrayRef(s.dims, size_t(s.ndim)); }

// A piece as the plan lays it out; a piece with room for scratch after its elements keeps its planned shape.
Tensor alloc_piece(const te::ops::PiecePlan& pc, const at::TensorOptions& options) {
  const auto opts = options.dtype(scalar_type_of(pc.dtype));
  if (pc.capacity == pc.shape.numel()) return new_empty_in_guard(sizes_of(pc.shape), opts);
  Tensor t = new_empty_in_guard({pc.capacity}, opts);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes_of(pc.shape));
  return t;
}

// The torch side of a request's checks (dtype and device of the torch tensors), then the views of the contiguous
// input and grad; the core plans and checks the rest.
void prepare(OpCall& c) {
  te::ops::ActRequest& r = c.r;
  const te::DType dt = input_dtype(c.x, r.op, "input");
  if (r.backward) {
    const Tensor& g = *c.grad;
    // Checked here too: a grad dtype without a core DType (float64, int) cannot reach the core's check.
    TORCH_CHECK_TYPE(g.scalar_type() == c.x.scalar_type(),
                     te::ops::grad_dtype_message(r, dtype_name(g.scalar_type()), dtype_name(c.x.scalar_type())));
    TORCH_CHECK_VALUE(g.device() == c.x.device(), te::ops::op_name(r), ": grad is on ", g.device().str(),
                      " but the forward input is on ", c.x.device().str(), "; move both to one device");
    c.grad = g.contiguous();
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

// Plans the call, allocates its outputs (unless the caller gave them: `into`) and its workspace, and runs it.
Outputs run_call(OpCall& c, const Outputs* into) {
  prepare(c);
#if defined(TE_WITH_CUDA)
  const c10::cuda::OptionalCUDAGuard guard(c.x.is_cuda() ? c10::optional<c10::Device>(c.x.device()) : c10::nullopt);
#endif
  const te::ops::ExecCtx ctx = exec_ctx(c.x);
  te::ops::PlanOptions opt;
  opt.exact_outputs = into != nullptr;
  ActPlan plan = te::ops::plan_act(c.r, c.spec, ctx, opt);
  Outputs o;
  if (into) {
    o = *into;
  } else {
    const at::TensorOptions options = c.x.options();
    for (int i = 0; i < te::ops::kNumPieces; ++i) {
      if (plan.pieces[i].present) o.t[i] = alloc_piece(plan.pieces[i], options);
    }
  }
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
  return o;
}

// Runs a quantizing op and returns its fixed tuple (SPEC §1.4), [grad_bias] first for the dbias ops. Absent data
// pieces are uint8 with a quantizer, float32 without one, as the fake kernels in _ops.py say.
QOut returned(const Outputs& o, const OpCall& c) {
  return o.returned(c.x, c.spec.kind == te::QuantKind::kNone ? at::kFloat : at::kByte);
}

QOut run_quantizing(OpCall& c) { return returned(run_call(c, nullptr), c); }

QOutBias run_quantizing_with_bias(OpCall& c) {
  const Outputs o = run_call(c, nullptr);
  return std::tuple_cat(std::make_tuple(o.t[te::ops::kGradBias]), returned(o, c));
}

te::ActArgs act_args(double limit, double alpha, double offset) {
  te::ActArgs a;
  a.limit = float(limit);
  a.alpha = float(alpha);
  a.glu_linear_offset = float(offset);
  return a;
}

OpCall make_call(const char* op, te::ActKind kind, bool backward, bool with_dbias, te::ActArgs args, const Tensor& x,
                 const c10::optional<Tensor>& grad) {
  OpCall c;
  c.r.op = op;
  c.r.kind = kind;
  c.r.backward = backward;
  c.r.with_dbias = with_dbias;
  c.r.args = args;
  c.x = x;
  c.grad = grad;
  return c;
}

#define TE_QSPEC_PARAMS                                                                                      \
  int64_t qkind, int64_t qdtype, bool rowwise, bool columnwise, int64_t qflags, double amax_epsilon,         \
      int64_t block_dim, const c10::optional<Tensor>&scale, const c10::optional<Tensor>&amax,                \
      const c10::optional<Tensor>&noop
#define TE_QSPEC_ARGS(op, input) \
  make_spec(op, qkind, qdtype, rowwise, columnwise, qflags, amax_epsilon, block_dim, scale, amax, noop, input)

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

Tensor act(const Tensor& x, int64_t code, double limit, double alpha, double offset) {
  return with_torch_errors([&] {
    OpCall c = make_call("act", te::ops::act_kind("act", code), false, false, act_args(limit, alpha, offset), x,
                         c10::nullopt);
    return run_call(c, nullptr).t[te::ops::kRowData];
  });
}

Tensor dact(const Tensor& grad, const Tensor& x, int64_t code, double limit, double alpha, double offset) {
  return with_torch_errors([&] {
    OpCall c = make_call("dact", te::ops::act_kind("dact", code), true, false, act_args(limit, alpha, offset), x, grad);
    return run_call(c, nullptr).t[te::ops::kRowData];
  });
}

QOut act_quantize(const Tensor& x, int64_t code, double limit, double alpha, double offset, TE_QSPEC_PARAMS) {
  return with_torch_errors([&] {
    OpCall c = make_call("act_quantize", te::ops::act_kind("act_quantize", code), false, false,
                         act_args(limit, alpha, offset), x, c10::nullopt);
    c.spec = TE_QSPEC_ARGS("act_quantize", x);
    return run_quantizing(c);
  });
}

QOut dact_quantize(const Tensor& grad, const Tensor& x, int64_t code, double limit, double alpha, double offset,
                   TE_QSPEC_PARAMS) {
  return with_torch_errors([&] {
    OpCall c = make_call("dact_quantize", te::ops::act_kind("dact_quantize", code), true, false,
                         act_args(limit, alpha, offset), x, grad);
    c.spec = TE_QSPEC_ARGS("dact_quantize", x);
    return run_quantizing(c);
  });
}

QOutBias dbias_dact(const Tensor& grad, const Tensor& x, int64_t code, TE_QSPEC_PARAMS) {
  return with_torch_errors([&] {
    OpCall c = make_call("dbias_dact", te::ops::act_kind("dbias_dact", code), true, true, te::ActArgs{}, x, grad);
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
    OpCall c = make_call("quantize", te::ActKind::kIdentity, false, false, te::ActArgs{}, x, c10::nullopt);
    c.spec = TE_QSPEC_ARGS("quantize", x);
    c.rng_seed = rng_seed;
    c.rng_offset = rng_offset;
    return run_quantizing(c);
  });
}

QOutBias bgrad_quantize(const Tensor& x, TE_QSPEC_PARAMS) {
  return with_torch_errors([&] {
    OpCall c = make_call("bgrad_quantize", te::ActKind::kIdentity, false, true, te::ActArgs{}, x, c10::nullopt);
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
// and both its buffers are given; each given buffer must have the plan's shape, dtype and device.
void take_block_buffers(OpCall& c, const ActPlan& plan, Outputs& o, const std::string& format,
                        const c10::optional<Tensor>& row_data, const c10::optional<Tensor>& row_scale_inv,
                        const c10::optional<Tensor>& col_data, const c10::optional<Tensor>& col_scale_inv,
                        const char* col_data_name) {
  const char* op = c.r.op;
  te::ops::QuantSpec& spec = c.spec;
  spec.rowwise = spec.rowwise && row_data.has_value() && row_scale_inv.has_value();
  spec.columnwise = spec.columnwise && col_data.has_value() && col_scale_inv.has_value();
  TORCH_CHECK_VALUE(spec.rowwise || spec.columnwise, op, ": the ", format,
                    " output has no buffers for the requested usage");
  if (spec.rowwise) {
    o.t[te::ops::kRowData] = *row_data;
    o.t[te::ops::kRowScaleInv] = *row_scale_inv;
    check_buffer(*row_data, plan.pieces[te::ops::kRowData], c.x, op, "_rowwise_data");
    check_buffer(*row_scale_inv, plan.pieces[te::ops::kRowScaleInv], c.x, op, "_rowwise_scale_inv");
  }
  if (spec.columnwise) {
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
    OpCall c = make_call(op, te::ActKind::kIdentity, false, false, te::ActArgs{}, x, c10::nullopt);
    c.spec = TE_QSPEC_ARGS(op, x);
    // The plan of the quantizer's full usage gives the shapes the caller's buffers must have (and checks the shape
    // for the format); run_call plans again for the usage that has buffers.
    const te::DType dt = input_dtype(x, op, "input");
    c.r.x = view_of(x, dt, op);
    te::ops::PlanOptions exact;
    exact.exact_outputs = true;
    const ActPlan plan = te::ops::plan_act(c.r, c.spec, exec_ctx(x), exact);
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
      if (c.spec.rowwise) o.t[te::ops::kAmaxRow] = amax_pair.narrow(0, 0, 1);
      if (c.spec.columnwise) o.t[te::ops::kAmaxCol] = amax_pair.narrow(0, 1, 1);
    } else if (c.spec.kind == te::QuantKind::kMxfp8) {
      take_block_buffers(c, plan, o, "MXFP8", row_data, row_scale_inv, col_data, col_scale_inv, "_columnwise_data");
    } else if (c.spec.kind == te::QuantKind::kFp8Block) {
      take_block_buffers(c, plan, o, c.spec.fp8_block_name(), row_data, row_scale_inv, col_data, col_scale_inv,
                         "_columnwise_data (transposed)");
    } else {
      TORCH_CHECK_VALUE(row_scale_inv.has_value(), op, ": the output's scale_inv buffer is missing");
      check_buffer(*row_scale_inv, plan.pieces[te::ops::kRowScaleInv], x, op, "_scale_inv");
      o.t[te::ops::kRowScaleInv] = *row_scale_inv;
      c.spec.rowwise = c.spec.rowwise && row_data.has_value();
      c.spec.columnwise = c.spec.columnwise && col_data.has_value();
      if (c.spec.rowwise) {
        o.t[te::ops::kRowData] = *row_data;
        check_buffer(*row_data, plan.pieces[te::ops::kRowData], x, op, "_data");
      }
      if (c.spec.columnwise) {
        o.t[te::ops::kColData] = *col_data;
        check_buffer(*col_data, plan.pieces[te::ops::kColData], x, op, "_transpose");
      }
    }
    run_call(c, &o);
  });
}

void compute_amax(const Tensor& x, const Tensor& amax) {
  const char* op = "compute_amax";
  const te::DType dt = input_dtype(x, op, "input");
  check_scalar_f32(amax, x, op, "amax");
  const Tensor xc = x.contiguous();
#if defined(TE_WITH_CUDA)
  const c10::cuda::OptionalCUDAGuard guard(x.is_cuda() ? c10::optional<c10::Device>(x.device()) : c10::nullopt);
#endif
  with_torch_errors([&] { te::ops::compute_amax(view_of(xc, dt, op), amax.data_ptr<float>(), exec_ctx(xc)); });
}

}  // namespace

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
