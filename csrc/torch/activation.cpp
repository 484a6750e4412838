// Activation and cast ops (SPEC §3, §4.10, §5): the activation helper that every op of the family goes
// through, forward and backward, with or without a quantizer, with or without dbias. A plain cast is the
// identity activation.
#include "bridge.h"

namespace te_torch {
namespace {

// The six quantized pieces of SPEC §1.4, in the order the ops return them.
struct QuantOutputs {
  Tensor row_data, row_scale_inv, col_data, col_scale_inv, amax_row, amax_col;
  std::vector<Tensor> list() const { return {row_data, row_scale_inv, col_data, col_scale_inv, amax_row, amax_col}; }
};

struct ActRequest {
  const char* op;
  te::ActKind kind;
  bool backward;
  Tensor x;
  c10::optional<Tensor> grad;
  te::ActArgs args;
  bool with_dbias;
};

// Flattened geometry of an activation request.
struct ActGeometry {
  std::vector<int64_t> out_shape;  // plain output shape
  int64_t rows = 0, cols = 0, out_cols = 0;
  std::vector<int64_t> transposed_shape() const {
    if (out_shape.empty()) return {};
    std::vector<int64_t> s{out_shape.back()};
    s.insert(s.end(), out_shape.begin(), out_shape.end() - 1);
    return s;
  }
};

ActGeometry geometry(const ActRequest& r) {
  ActGeometry g;
  const bool gated = te::act_is_gated(r.kind);
  const auto sizes = r.x.sizes();
  if (gated) {
    TORCH_CHECK_VALUE(r.x.dim() >= 1 && sizes.back() >= 2 && sizes.back() % 2 == 0, r.op,
                      ": gated activations split the last dim into two halves, so it must be even and >= 2; got input ",
                      shape_str(r.x));
  }
  const int64_t k = r.x.dim() == 0 ? 1 : sizes.back();
  int64_t lead = 1;
  for (int64_t i = 0; i + 1 < r.x.dim(); ++i) lead *= sizes[i];
  g.rows = lead;
  g.cols = gated ? k / 2 : k;
  g.out_cols = te::act_out_cols(r.kind, r.backward, g.cols);
  g.out_shape.assign(sizes.begin(), sizes.end());
  if (gated && !r.backward) g.out_shape.back() = g.cols;
  return g;
}

void check_request(const ActRequest& r) {
  input_dtype(r.x, r.op, "input");
  if (r.backward) {
    const Tensor& g = *r.grad;
    TORCH_CHECK_VALUE(g.scalar_type() == r.x.scalar_type(), r.op, ": grad dtype ", dtype_name(g.scalar_type()),
                     " must match the forward input dtype ", dtype_name(r.x.scalar_type()));
    TORCH_CHECK_VALUE(g.device() == r.x.device(), r.op, ": grad is on ", g.device().str(),
                      " but the forward input is on ", r.x.device().str());
    std::vector<int64_t> expect(r.x.sizes().begin(), r.x.sizes().end());
    if (te::act_is_gated(r.kind) && !expect.empty()) expect.back() /= 2;
    TORCH_CHECK_VALUE(g.sizes().vec() == expect, r.op, ": grad has shape ", shape_str(g),
                      " but the forward output for input ", shape_str(r.x), " has shape ",
                      shape_str(expect));
  }
}

void check_buffer(const Tensor& t, const std::vector<int64_t>& shape, at::ScalarType dtype, const Tensor& ref,
                  const char* op, const char* what) {
  TORCH_CHECK_VALUE(t.scalar_type() == dtype && t.sizes().vec() == shape && t.is_contiguous() &&
                        t.device() == ref.device(),
                    op, ": output buffer ", what, " must be a contiguous ", dtype_name(dtype), " tensor of shape ",
                    shape_str(shape), " on ", ref.device().str(), ", got ", dtype_name(t.scalar_type()), " ",
                    shape_str(t), " on ", t.device().str());
}

Tensor empty_like_dev(const Tensor& ref, at::ScalarType dtype) { return at::empty({0}, ref.options().dtype(dtype)); }

// Fills (or allocates) the per-tensor FP8 outputs and runs the FULLY_FUSED / FUSED_ACTIVATION_AMAX_FP8 kernels.
void run_fp8_per_tensor(const ActRequest& r, const ActGeometry& geo, const QuantSpec& spec, te::DType dt,
                        te::ActKernelParams p, QuantOutputs& o, bool into) {
  const Tensor& x = r.x;
  if (!into) {
    o.row_data = spec.rowwise ? at::empty(geo.out_shape, x.options().dtype(at::kByte)) : empty_like_dev(x, at::kByte);
    o.col_data = spec.columnwise ? at::empty(geo.transposed_shape(), x.options().dtype(at::kByte))
                                 : empty_like_dev(x, at::kByte);
    o.row_scale_inv = at::empty({1}, x.options().dtype(at::kFloat));
  }
  o.col_scale_inv = empty_like_dev(x, at::kFloat);
  o.amax_row = empty_like_dev(x, at::kFloat);
  o.amax_col = empty_like_dev(x, at::kFloat);
  p.out = spec.rowwise && o.row_data.numel() > 0 ? o.row_data.data_ptr() : nullptr;
  p.out_t = spec.columnwise && o.col_data.numel() > 0 ? o.col_data.data_ptr<uint8_t>() : nullptr;
  p.scale_inv = o.row_scale_inv.data_ptr<float>();
  p.e4m3 = spec.e4m3();
  if (spec.kind == te::QuantKind::kFp8Delayed) {
    p.mode = te::ScaleMode::kDelayed;
    p.scale = spec.scale->data_ptr<float>();
    p.amax = spec.amax->data_ptr<float>();
    run_activation(r.kind, r.backward, dt, p, x);
    return;
  }
  // Current scaling: amax pass over the unrounded activation, then recompute + cast (SPEC §5.1). An amax
  // passed in the spec is an already (all-)reduced amax: the first pass is skipped.
  p.force_pow2 = spec.force_pow2();
  p.amax_epsilon = float(spec.amax_epsilon);
  Tensor amax = spec.amax.has_value() ? *spec.amax : at::empty({1}, x.options().dtype(at::kFloat));
  if (!spec.amax.has_value()) zero_scalar(amax);
  p.amax = amax.data_ptr<float>();
  if (!spec.amax.has_value()) {
    te::ActKernelParams pa = p;
    pa.mode = te::ScaleMode::kAmaxOnly;
    pa.out = nullptr;
    pa.out_t = nullptr;
    pa.dbias_partial = nullptr;
    run_activation(r.kind, r.backward, dt, pa, x);
  }
  p.mode = te::ScaleMode::kCurrent;
  run_activation(r.kind, r.backward, dt, p, x);
}

// The activation helper: validates, picks the fusion path (SPEC §5.1), runs the kernels and returns
// [grad_bias]? + [row_data, row_scale_inv, col_data, col_scale_inv, amax_row, amax_col] (row_data is the plain
// output when there is no quantizer).
std::vector<Tensor> activation_helper(ActRequest r, const QuantSpec& spec, QuantOutputs* into) {
  check_request(r);
  const te::DType dt = input_dtype(r.x, r.op, "input");
  r.x = r.x.contiguous();
  if (r.grad) r.grad = r.grad->contiguous();
  const ActGeometry geo = geometry(r);
#if defined(TE_WITH_CUDA)
  const c10::cuda::OptionalCUDAGuard guard(r.x.is_cuda() ? c10::optional<c10::Device>(r.x.device()) : c10::nullopt);
#endif
  te::ActKernelParams p;
  p.x = r.x.data_ptr();
  p.grad = r.grad ? r.grad->data_ptr() : nullptr;
  p.rows = geo.rows;
  p.cols = geo.cols;
  p.act = r.args;
  p.noop = spec.noop ? spec.noop->data_ptr<float>() : nullptr;

  Tensor partial, grad_bias;
  if (r.with_dbias) {
    TORCH_CHECK_VALUE(!te::act_is_gated(r.kind), r.op, ": dbias is defined for unary activations only");
    partial = at::empty({te::act_dbias_blocks(geo.rows, geo.cols), geo.out_cols}, r.x.options().dtype(at::kFloat));
    grad_bias = at::empty({geo.out_cols}, r.x.options());
    p.dbias_partial = partial.data_ptr<float>();
  }

  QuantOutputs o;
  if (into) o = *into;
  switch (choose_fusion_path(spec)) {
    case te::FusionPath::kFullyFused:
    case te::FusionPath::kFusedActivationAmaxFp8:
      if (spec.kind == te::QuantKind::kNone) {
        o.row_data = at::empty(geo.out_shape, r.x.options());
        p.out = o.row_data.data_ptr();
        p.mode = te::ScaleMode::kPlain;
        run_activation(r.kind, r.backward, dt, p, r.x);
        for (Tensor* t : {&o.row_scale_inv, &o.col_data, &o.col_scale_inv, &o.amax_row, &o.amax_col})
          *t = empty_like_dev(r.x, at::kFloat);
        break;
      }
      if (spec.kind == te::QuantKind::kFp8Delayed || spec.kind == te::QuantKind::kFp8Current) {
        run_fp8_per_tensor(r, geo, spec, dt, p, o, into != nullptr);
        break;
      }
      [[fallthrough]];
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(false, r.op, ": quantizer kind ", std::to_string(int(spec.kind)),
                                  " (MXFP8 / NVFP4 / FP8 block) is not available in this build yet");
  }
  if (r.with_dbias) {
    if (geo.rows == 0 || geo.out_cols == 0) {
      grad_bias.zero_();
    } else if (!(spec.noop && into)) {
      run_dbias_reduce(partial, grad_bias);
    }
  }
  std::vector<Tensor> out = o.list();
  if (r.with_dbias) out.insert(out.begin(), grad_bias);
  return out;
}

using QOut = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
using QOutBias = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
QOut as_qout(const std::vector<Tensor>& v) { return {v[0], v[1], v[2], v[3], v[4], v[5]}; }
QOutBias as_qout_bias(const std::vector<Tensor>& v) { return {v[0], v[1], v[2], v[3], v[4], v[5], v[6]}; }

te::ActKind act_kind(const char* op, int64_t code) {
  TORCH_CHECK_VALUE(te::act_is_known(int(code)) && code != int64_t(te::ActKind::kIdentity), op,
                    ": activation code ", std::to_string(code), " is not known; accepted: 0..11 (TE's activation enum)");
  return static_cast<te::ActKind>(code);
}

te::ActArgs act_args(double limit, double alpha, double offset) {
  te::ActArgs a;
  a.limit = float(limit);
  a.alpha = float(alpha);
  a.glu_linear_offset = float(offset);
  return a;
}

#define TE_QSPEC_PARAMS                                                                                      \
  int64_t qkind, int64_t qdtype, bool rowwise, bool columnwise, int64_t qflags, double amax_epsilon,         \
      int64_t block_dim, const c10::optional<Tensor>&scale, const c10::optional<Tensor>&amax,                \
      const c10::optional<Tensor>&noop
#define TE_QSPEC_ARGS(op, input) \
  make_spec(op, qkind, qdtype, rowwise, columnwise, qflags, amax_epsilon, block_dim, scale, amax, noop, input)

Tensor act(const Tensor& x, int64_t code, double limit, double alpha, double offset) {
  ActRequest r{"act", act_kind("act", code), false, x, c10::nullopt, act_args(limit, alpha, offset), false};
  return activation_helper(r, QuantSpec{}, nullptr)[0];
}

Tensor dact(const Tensor& grad, const Tensor& x, int64_t code, double limit, double alpha, double offset) {
  ActRequest r{"dact", act_kind("dact", code), true, x, grad, act_args(limit, alpha, offset), false};
  return activation_helper(r, QuantSpec{}, nullptr)[0];
}

QOut act_quantize(const Tensor& x, int64_t code, double limit, double alpha, double offset,
                                 TE_QSPEC_PARAMS) {
  ActRequest r{"act_quantize", act_kind("act_quantize", code), false, x, c10::nullopt, act_args(limit, alpha, offset),
               false};
  return as_qout(activation_helper(r, TE_QSPEC_ARGS("act_quantize", x), nullptr));
}

QOut dact_quantize(const Tensor& grad, const Tensor& x, int64_t code, double limit, double alpha,
                                  double offset, TE_QSPEC_PARAMS) {
  ActRequest r{"dact_quantize", act_kind("dact_quantize", code), true, x, grad, act_args(limit, alpha, offset), false};
  return as_qout(activation_helper(r, TE_QSPEC_ARGS("dact_quantize", x), nullptr));
}

QOutBias dbias_dact(const Tensor& grad, const Tensor& x, int64_t code, TE_QSPEC_PARAMS) {
  ActRequest r{"dbias_dact", act_kind("dbias_dact", code), true, x, grad, te::ActArgs{}, true};
  return as_qout_bias(activation_helper(r, TE_QSPEC_ARGS("dbias_dact", x), nullptr));
}

QOut quantize(const Tensor& x, TE_QSPEC_PARAMS) {
  TORCH_CHECK_VALUE(qkind != 0, "quantize: a quantizer is required (use the tensor as it is)");
  ActRequest r{"quantize", te::ActKind::kIdentity, false, x, c10::nullopt, te::ActArgs{}, false};
  return as_qout(activation_helper(r, TE_QSPEC_ARGS("quantize", x), nullptr));
}

QOutBias bgrad_quantize(const Tensor& x, TE_QSPEC_PARAMS) {
  ActRequest r{"bgrad_quantize", te::ActKind::kIdentity, false, x, c10::nullopt, te::ActArgs{}, true};
  return as_qout_bias(activation_helper(r, TE_QSPEC_ARGS("bgrad_quantize", x), nullptr));
}

void quantize_into(const Tensor& x, TE_QSPEC_PARAMS, const c10::optional<Tensor>& row_data,
                   const c10::optional<Tensor>& row_scale_inv, const c10::optional<Tensor>& col_data,
                   const c10::optional<Tensor>& col_scale_inv) {
  const char* op = "quantize_into";
  TORCH_CHECK_VALUE(qkind == 1 || qkind == 2, op, ": in-place quantization supports FP8 per-tensor quantizers (kinds 1, 2), got ", std::to_string(qkind));
  QuantSpec spec = TE_QSPEC_ARGS(op, x);
  ActRequest r{op, te::ActKind::kIdentity, false, x, c10::nullopt, te::ActArgs{}, false};
  input_dtype(x, op, "input");
  const ActGeometry geo = geometry(r);
  QuantOutputs o;
  TORCH_CHECK_VALUE(row_scale_inv.has_value(), op, ": the output's scale_inv buffer is missing");
  check_buffer(*row_scale_inv, {1}, at::kFloat, x, op, "_scale_inv");
  o.row_scale_inv = *row_scale_inv;
  spec.rowwise = spec.rowwise && row_data.has_value();
  spec.columnwise = spec.columnwise && col_data.has_value();
  o.row_data = spec.rowwise ? *row_data : empty_like_dev(x, at::kByte);
  o.col_data = spec.columnwise ? *col_data : empty_like_dev(x, at::kByte);
  if (spec.rowwise) check_buffer(o.row_data, geo.out_shape, at::kByte, x, op, "_data");
  if (spec.columnwise) check_buffer(o.col_data, geo.transposed_shape(), at::kByte, x, op, "_transpose");
  (void)col_scale_inv;
  activation_helper(r, spec, &o);
}

void compute_amax(const Tensor& x, const Tensor& amax) {
  const char* op = "compute_amax";
  const te::DType dt = input_dtype(x, op, "input");
  check_scalar_f32(amax, x, op, "amax");
  const Tensor xc = x.contiguous();
#if defined(TE_WITH_CUDA)
  const c10::cuda::OptionalCUDAGuard guard(x.is_cuda() ? c10::optional<c10::Device>(x.device()) : c10::nullopt);
#endif
  zero_scalar(amax);
  te::ActKernelParams p;
  p.x = xc.data_ptr();
  p.mode = te::ScaleMode::kAmaxOnly;
  p.amax = amax.data_ptr<float>();
  const int64_t k = xc.dim() == 0 ? 1 : xc.size(-1);
  p.cols = k;
  p.rows = k > 0 ? xc.numel() / k : 0;
  run_activation(te::ActKind::kIdentity, false, dt, p, xc);
}

}  // namespace

TORCH_LIBRARY_IMPL(te, CPU, m) {
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

#if defined(TE_WITH_CUDA)
TORCH_LIBRARY_IMPL(te, CUDA, m) {
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
#endif

}  // namespace te_torch
