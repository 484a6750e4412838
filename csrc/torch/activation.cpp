// Activation and cast ops (SPEC §3, §4.10, §5): the activation helper that every op of the family goes
// through, forward and backward, with or without a quantizer, with or without dbias. A plain cast is the
// identity activation.
#include "bridge.h"

namespace te_torch {
namespace {

using QOut = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
using QOutBias = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

// The six quantized pieces of SPEC §1.4, in the order the ops return them. A path leaves the pieces it does not
// produce undefined, so that ops that return none of them (act, dact, quantize_into) allocate nothing for them.
struct QuantOutputs {
  Tensor row_data, row_scale_inv, col_data, col_scale_inv, amax_row, amax_col;

  // The op's return value: each absent piece becomes its own 0-element tensor (outputs of an op may not share
  // storage, so one empty tensor cannot stand for all of them), data pieces in `data_dtype`, the rest float32.
  QOut returned(const Tensor& ref, at::ScalarType data_dtype) const {
    const auto or_empty = [&ref](const Tensor& t, at::ScalarType dtype) {
      return t.defined() ? t : new_placeholder(ref, dtype);
    };
    return {or_empty(row_data, data_dtype), or_empty(row_scale_inv, at::kFloat), or_empty(col_data, data_dtype),
            or_empty(col_scale_inv, at::kFloat), or_empty(amax_row, at::kFloat), or_empty(amax_col, at::kFloat)};
  }
};

// What the activation helper produced: grad_bias (dbias ops only) and the quantized pieces; `out.row_data` is
// the plain output when there is no quantizer.
struct ActResult {
  Tensor grad_bias;
  QuantOutputs out;
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
// Shapes live in DimVectors (inline storage for up to 5 dims): no heap allocation for a typical tensor.
struct ActGeometry {
  at::DimVector out_shape;  // plain output shape
  int64_t rows = 0, cols = 0, out_cols = 0;
  at::DimVector transposed_shape() const {
    at::DimVector s;
    if (out_shape.empty()) return s;
    s.push_back(out_shape.back());
    s.append(out_shape.begin(), out_shape.end() - 1);
    return s;
  }
};

// The function the user called, for messages: "geglu (te::act)", "dbias_dgelu (te::dbias_dact)"; the op's own
// name for the plain casts (quantize, bgrad_quantize, quantize_into). Only error paths call it.
std::string op_name(const ActRequest& r) {
  const char* const table_name = te::act_name(r.kind);  // the activation table's (act_functors.h)
  if (table_name == nullptr || r.kind == te::ActKind::kIdentity) return r.op;
  std::string name = table_name;
  if (r.backward) {
    name = r.kind == te::ActKind::kClampedSwiglu ? "clamped_dswiglu" : (r.with_dbias ? "dbias_d" : "d") + name;
  }
  return name + " (te::" + r.op + ")";
}

ActGeometry geometry(const ActRequest& r) {
  ActGeometry g;
  const bool gated = te::act_is_gated(r.kind);
  const auto sizes = r.x.sizes();
  if (gated) {
    TORCH_CHECK_VALUE(r.x.dim() >= 1 && sizes.back() >= 2 && sizes.back() % 2 == 0, op_name(r),
                      ": gated activations split the last dim into two halves, so it must be even and >= 2; got input ",
                      shape_str(r.x), " ", dtype_name(r.x.scalar_type()), " on ", r.x.device().str(),
                      ". Pass [..., 2H]: the activated half first, the linear half second");
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

// Checks the request and returns the input's core dtype.
te::DType check_request(const ActRequest& r) {
  const te::DType dt = input_dtype(r.x, r.op, "input");
  if (r.backward) {
    const Tensor& g = *r.grad;
    TORCH_CHECK_TYPE(g.scalar_type() == r.x.scalar_type(), op_name(r), ": grad dtype ", dtype_name(g.scalar_type()),
                     " must match the forward input dtype ", dtype_name(r.x.scalar_type()));
    TORCH_CHECK_VALUE(g.device() == r.x.device(), op_name(r), ": grad is on ", g.device().str(),
                      " but the forward input is on ", r.x.device().str(), "; move both to one device");
    at::DimVector expect(r.x.sizes());
    if (te::act_is_gated(r.kind) && !expect.empty()) expect.back() /= 2;
    TORCH_CHECK_VALUE(g.sizes() == c10::IntArrayRef(expect), op_name(r), ": grad has shape ", shape_str(g),
                      " but the forward output for input ", shape_str(r.x), " has shape ", shape_str(expect),
                      "; pass the gradient of the forward output");
  }
  return dt;
}

void check_buffer(const Tensor& t, c10::IntArrayRef shape, at::ScalarType dtype, const Tensor& ref,
                  const char* op, const char* what) {
  TORCH_CHECK_VALUE(t.scalar_type() == dtype && t.sizes() == shape && t.is_contiguous() &&
                        t.device() == ref.device(),
                    op, ": output buffer ", what, " must be a contiguous ", dtype_name(dtype), " tensor of shape ",
                    shape_str(shape), " on ", ref.device().str(), ", got ", dtype_name(t.scalar_type()), " ",
                    shape_str(t), " on ", t.device().str());
}

// Fills (or allocates) the per-tensor FP8 outputs and runs the FULLY_FUSED / FUSED_ACTIVATION_AMAX_FP8 kernels.
void run_fp8_per_tensor(const ActRequest& r, const ActGeometry& geo, const QuantSpec& spec, te::DType dt,
                        te::ActKernelParams p, QuantOutputs& o, bool into) {
  const Tensor& x = r.x;
  const auto f32 = x.options().dtype(at::kFloat);
  // Current scaling without a given amax takes it in a first pass, into a float that only this call uses. A new
  // scale_inv carries that float in its own allocation, right after its one element: one allocation (and free)
  // less per call; the returned scale_inv is still a plain [1] tensor.
  // The kernel launcher takes that amax itself (ActKernelParams::amax_in_call), so nothing is zeroed here; on CUDA a
  // small rowwise cast does it in one cooperative launch with per-block maxima in slots that follow the amax.
  const bool amax_pass = spec.kind == te::QuantKind::kFp8Current && !spec.amax.has_value();
  const bool one_launch = amax_pass && x.is_cuda() && !spec.columnwise &&
                          geo.rows * geo.out_cols <= te::kOneLaunchMaxElems;
  const int64_t slots = one_launch ? te::kOneLaunchAmaxSlots : 0;
  Tensor amax_tmp;
  float* amax = spec.amax.has_value() ? spec.amax->data_ptr<float>() : nullptr;
  if (!into) {
    if (spec.rowwise) o.row_data = new_empty_in_guard(geo.out_shape, x.options().dtype(at::kByte));
    if (spec.columnwise) o.col_data = new_empty_in_guard(geo.transposed_shape(), x.options().dtype(at::kByte));
    o.row_scale_inv = new_empty_in_guard({amax_pass ? 2 + slots : 1}, f32);
    if (amax_pass) {
      amax = o.row_scale_inv.data_ptr<float>() + 1;
      o.row_scale_inv.unsafeGetTensorImpl()->set_sizes_contiguous({1});
    }
  } else if (amax_pass) {
    amax_tmp = new_empty_in_guard({1 + slots}, f32);
    amax = amax_tmp.data_ptr<float>();
  }
  p.out = spec.rowwise && o.row_data.numel() > 0 ? o.row_data.data_ptr() : nullptr;
  p.out_t = spec.columnwise && o.col_data.numel() > 0 ? o.col_data.data_ptr<uint8_t>() : nullptr;
  p.scale_inv = o.row_scale_inv.data_ptr<float>();
  p.e4m3 = spec.e4m3();
  p.amax = amax;
  if (spec.kind == te::QuantKind::kFp8Delayed) {
    p.mode = te::ScaleMode::kDelayed;
    p.scale = spec.scale->data_ptr<float>();
    run_activation(r.kind, r.backward, dt, p, x);
    return;
  }
  // Current scaling: amax pass over the unrounded activation, then recompute + cast (SPEC §5.1). An amax
  // passed in the spec is an already (all-)reduced amax: the first pass is skipped.
  p.force_pow2 = spec.force_pow2();
  p.amax_epsilon = float(spec.amax_epsilon);
  if (amax_pass) {
    p.amax_in_call = true;
    p.amax_partials = slots > 0 ? amax + 1 : nullptr;
    p.amax_slots = int(slots);
  }
  p.mode = te::ScaleMode::kCurrent;
  run_activation(r.kind, r.backward, dt, p, x);
}

std::string mx_format_name(const QuantSpec& spec) { return spec.e4m3() ? "MXFP8 E4M3" : "MXFP8 E5M2"; }

// SPEC §4.5: MXFP8 needs a tensor of rank >= 1 whose (output) last dim is a multiple of 32.
void check_mxfp8_shape(const ActRequest& r, const ActGeometry& geo, const QuantSpec& spec) {
  TORCH_CHECK_VALUE(r.x.dim() > 0, op_name(r), ": ", mx_format_name(spec), " cannot quantize a 0-d tensor (input ",
                    dtype_name(r.x.scalar_type()), " shape [] on ", arch_name(r.x),
                    "): its blocks run along the last dim; reshape to [1, 32] and pad, or use a per-tensor FP8 "
                    "quantizer");
  TORCH_CHECK_VALUE(geo.out_cols % te::kMxBlock == 0, op_name(r), ": ", mx_format_name(spec),
                    " quantizes blocks of 32 along the last dim, so the last dim of the quantized tensor must be a "
                    "multiple of 32; got quantized shape ", shape_str(geo.out_shape), " (input ", shape_str(r.x), " ",
                    dtype_name(r.x.scalar_type()), " on ", arch_name(r.x), "). Pad the last dim to ",
                    std::to_string(te::roundup(geo.out_cols, te::kMxBlock)), " or use a per-tensor FP8 quantizer");
}

// Fills (or allocates) the MXFP8 outputs and runs the FULLY_FUSED MXFP8 kernel (SPEC §5.1): both copies and the
// dbias partials from one read of the input.
void run_mxfp8_path(const ActRequest& r, const ActGeometry& geo, const QuantSpec& spec, te::DType dt,
                    const te::ActKernelParams& base, QuantOutputs& o, bool into) {
  const Tensor& x = r.x;
  const te::Mxfp8ScaleShapes ss = te::mxfp8_scale_shapes(geo.rows, geo.out_cols);
  if (!into) {
    const auto u8 = x.options().dtype(at::kByte);
    if (spec.rowwise) {
      o.row_data = new_empty_in_guard(geo.out_shape, u8);
      o.row_scale_inv = new_empty_in_guard({ss.row_r, ss.row_c}, u8);
    }
    if (spec.columnwise) {
      o.col_data = new_empty_in_guard(geo.out_shape, u8);
      o.col_scale_inv = new_empty_in_guard({ss.col_r, ss.col_c}, u8);
    }
  }
  te::Mxfp8Params p;
  p.x = base.x;
  p.grad = base.grad;
  p.dbias_partial = base.dbias_partial;
  p.noop = base.noop;
  p.rows = geo.rows;
  p.cols = geo.cols;
  p.act = base.act;
  p.e4m3 = spec.e4m3();
  p.swizzled = spec.swizzled();
  if (spec.rowwise) {
    p.row_data = o.row_data.data_ptr<uint8_t>();
    p.row_scale = o.row_scale_inv.data_ptr<uint8_t>();
  }
  if (spec.columnwise) {
    p.col_data = o.col_data.data_ptr<uint8_t>();
    p.col_scale = o.col_scale_inv.data_ptr<uint8_t>();
  }
  run_mxfp8(r.kind, r.backward, dt, p, x);
}

// Fills (or allocates) the FP8 block outputs of an [rows, out_cols] tensor (SPEC §4.7-4.9): rowwise data in the
// tensor's shape, columnwise data transposed, float32 scales of the padded §4.8 shapes.
void alloc_fp8_block_outputs(const ActGeometry& geo, const QuantSpec& spec, const Tensor& x, QuantOutputs& o) {
  const te::Fp8BlockScaleShapes ss = te::fp8_block_scale_shapes(geo.rows, geo.out_cols, spec.block_dim == 2);
  const auto u8 = x.options().dtype(at::kByte), f32 = x.options().dtype(at::kFloat);
  if (spec.rowwise) {
    o.row_data = new_empty_in_guard(geo.out_shape, u8);
    o.row_scale_inv = new_empty_in_guard({ss.row_r, ss.row_c}, f32);
  }
  if (spec.columnwise) {
    o.col_data = new_empty_in_guard(geo.transposed_shape(), u8);
    o.col_scale_inv = new_empty_in_guard({ss.col_r, ss.col_c}, f32);
  }
}

// The UNFUSED path of SPEC §5.1, taken by the FP8 block quantizer: the plain op writes rnd_in(act(x)) (and the
// dbias partials, sums of the unrounded values) into a temporary, which the block kernel then quantizes. A plain
// cast without dbias quantizes the input itself. `noop` reaches only the quantize kernel: the temporary is ours.
void run_fp8_block_path(const ActRequest& r, const ActGeometry& geo, const QuantSpec& spec, te::DType dt,
                        const te::ActKernelParams& base, QuantOutputs& o, bool into) {
  Tensor src = r.x;
  if (r.kind != te::ActKind::kIdentity || r.with_dbias) {
    src = new_empty_in_guard(geo.out_shape, r.x.options());
    te::ActKernelParams pp = base;
    pp.out = src.data_ptr();
    pp.mode = te::ScaleMode::kPlain;
    pp.noop = nullptr;
    run_activation(r.kind, r.backward, dt, pp, r.x);
  }
  if (!into) alloc_fp8_block_outputs(geo, spec, r.x, o);
  te::Fp8BlockParams p;
  p.x = src.data_ptr();
  p.noop = base.noop;
  p.rows = geo.rows;
  p.cols = geo.out_cols;
  p.amax_epsilon = float(spec.amax_epsilon);
  p.e4m3 = spec.e4m3();
  p.force_pow2 = spec.force_pow2();
  p.two_d = spec.block_dim == 2;
  if (spec.rowwise) {
    p.row_data = o.row_data.data_ptr<uint8_t>();
    p.row_scale = o.row_scale_inv.data_ptr<float>();
  }
  if (spec.columnwise) {
    p.col_data = o.col_data.data_ptr<uint8_t>();
    p.col_scale = o.col_scale_inv.data_ptr<float>();
  }
  run_fp8_block(dt, p, r.x);
}

std::string nv_desc(const ActRequest& r, const ActGeometry& geo) {
  return "quantized shape " + shape_str(geo.out_shape) + " (input " + shape_str(r.x) + " " +
         dtype_name(r.x.scalar_type()) + " on " + arch_name(r.x) + ")";
}

// SPEC §4.6: NVFP4 needs rank >= 1, a last dim that is a multiple of 16, a flat first dim that is a multiple of 16
// when the columnwise copy is requested, and a bf16 input for the Hadamard transform.
void check_nvfp4_request(const ActRequest& r, const ActGeometry& geo, const QuantSpec& spec) {
  TORCH_CHECK_VALUE(r.x.dim() > 0, op_name(r), ": NVFP4 cannot quantize a 0-d tensor (input ",
                    dtype_name(r.x.scalar_type()), " shape [] on ", arch_name(r.x), "): its 1x16 blocks run along the "
                    "last dim; reshape to [1, 16] and pad, or use a per-tensor FP8 quantizer");
  TORCH_CHECK_VALUE(geo.out_cols % te::kNvBlock == 0, op_name(r), ": NVFP4 quantizes 1x16 blocks along the last dim, "
                    "so the last dim of the quantized tensor must be a multiple of 16; got ", nv_desc(r, geo),
                    ". Pad the last dim to ", std::to_string(te::roundup(geo.out_cols, te::kNvBlock)),
                    " or use a per-tensor FP8 quantizer");
  TORCH_CHECK_VALUE(!spec.columnwise || geo.rows % te::kNvBlock == 0, op_name(r), ": NVFP4 columnwise usage "
                    "quantizes 16x1 blocks down the rows, so the flattened first dim must be a multiple of 16; got M=",
                    std::to_string(geo.rows), " for ", nv_desc(r, geo), ". Pad the rows to ",
                    std::to_string(te::roundup(geo.rows, te::kNvBlock)), " or request rowwise usage only");
  TORCH_CHECK_TYPE(!spec.rht() || r.x.scalar_type() == at::kBFloat16, op_name(r), ": NVFP4 with the random Hadamard "
                   "transform (with_rht=True) takes bfloat16 input only; got ", dtype_name(r.x.scalar_type()), " for ",
                   nv_desc(r, geo), ". Cast the input to bfloat16 or use with_rht=False");
}

// NVFP4 (SPEC §5.1). Without RHT (FUSED_ACTIVATION_AMAX_NVFP4): the global amax is taken over the unrounded FP32
// activation by the activation kernel's amax pass, then rnd_in(act(x)) is written to a temporary (with the dbias
// partials of the unrounded values) and cast with that amax for both copies. A plain cast reads x directly and
// takes its amax from x. With RHT (UNFUSED): rnd_in(act(x)) in a temporary, then the ordinary cast of it, amaxes
// (rowwise of the values, columnwise of the transformed transpose) included.
void run_nvfp4_path(const ActRequest& r, const ActGeometry& geo, const QuantSpec& spec, te::DType dt,
                    const te::ActKernelParams& base, QuantOutputs& o, bool into) {
  const Tensor& x = r.x;
  const auto f32 = x.options().dtype(at::kFloat);
  const te::Nvfp4ScaleShapes ss = te::nvfp4_scale_shapes(geo.rows, geo.out_cols);
  if (!into) {
    const auto u8 = x.options().dtype(at::kByte);
    if (spec.rowwise) {
      at::DimVector shape = geo.out_shape;
      shape.back() = geo.out_cols / 2;
      o.row_data = new_empty_in_guard(shape, u8);
      o.row_scale_inv = new_empty_in_guard({ss.row_r, ss.row_c}, u8);
      o.amax_row = new_empty_in_guard({1}, f32);
    }
    if (spec.columnwise) {
      o.col_data = new_empty_in_guard({geo.out_cols, geo.rows / 2}, u8);
      o.col_scale_inv = new_empty_in_guard({ss.col_r, ss.col_c}, u8);
      o.amax_col = new_empty_in_guard({1}, f32);
    }
  }
  const bool identity = r.kind == te::ActKind::kIdentity && !r.backward;
  const bool rht_col = spec.rht() && spec.columnwise;
  auto aligned = [](const Tensor& t, int bytes) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % bytes == 0; };
  if (x.is_cuda() && !rht_col && !spec.two_d() && !spec.stochastic_rounding() && !r.with_dbias &&
      geo.cols % te::kNvBlock == 0 && aligned(x, 16) && (!r.grad || aligned(*r.grad, 16)) &&
      (!spec.rowwise || aligned(o.row_data, 4))) {
    // CUDA, FUSED_ACTIVATION_AMAX_NVFP4 in two passes over x: the amax of the unrounded values, then the op
    // recomputed and both copies quantized from rnd_in(act(x)) in one kernel (ScaleMode::kNvfp4).
    Tensor amax = new_empty_in_guard({1}, f32);  // a temporary: a noop launch leaves the tensor's amax fields untouched
    zero_floats(amax);
    te::ActKernelParams pa = te::amax_pass_params(base);
    pa.amax = amax.data_ptr<float>();
    run_activation(r.kind, r.backward, dt, pa, x);
    te::ActKernelParams pq = base;
    pq.mode = te::ScaleMode::kNvfp4;
    pq.amax = amax.data_ptr<float>();
    pq.out = spec.rowwise ? o.row_data.data_ptr() : nullptr;
    pq.blk_scale = spec.rowwise ? o.row_scale_inv.data_ptr<uint8_t>() : nullptr;
    pq.out_t = spec.columnwise ? o.col_data.data_ptr<uint8_t>() : nullptr;
    pq.blk_scale_t = spec.columnwise ? o.col_scale_inv.data_ptr<uint8_t>() : nullptr;
    pq.nv_amax_out[0] = spec.rowwise ? o.amax_row.data_ptr<float>() : nullptr;
    pq.nv_amax_out[1] = spec.columnwise ? o.amax_col.data_ptr<float>() : nullptr;
    pq.blk_swizzled = spec.swizzled();
    pq.dbias_partial = nullptr;
    run_activation(r.kind, r.backward, dt, pq, x);
    return;
  }
  Tensor amax = new_empty_in_guard({2}, f32);  // [rowwise, columnwise] global amaxes of this call
  zero_floats(amax);
  float* amax_ptr = amax.data_ptr<float>();
  Tensor src = x;
  if (!identity || r.with_dbias) {
    Tensor y = new_empty_in_guard(geo.out_shape, x.options());
    te::ActKernelParams pp = base;
    pp.out = y.data_ptr();
    pp.mode = te::ScaleMode::kPlain;
    run_activation(r.kind, r.backward, dt, pp, x);
    if (!identity) src = y;
  }
  if (!identity && !spec.rht()) {
    te::ActKernelParams pa = te::amax_pass_params(base);
    pa.amax = amax_ptr;
    run_activation(r.kind, r.backward, dt, pa, x);
  } else {
    te::Nvfp4AmaxParams ap;
    ap.x = src.data_ptr();
    ap.amax_row = amax_ptr;
    ap.amax_col = rht_col ? amax_ptr + 1 : nullptr;
    ap.rows = geo.rows;
    ap.cols = geo.out_cols;
    ap.rht = rht_col;
    ap.rht_sign_mask = spec.random_sign_mask() ? te::kRhtSignMask : 0u;
    run_nvfp4_amax(dt, ap, x);
  }
  te::Nvfp4Params p;
  p.x = src.data_ptr();
  p.noop = base.noop;
  p.rows = geo.rows;
  p.cols = geo.out_cols;
  p.amax_in_row = amax_ptr;
  p.amax_in_col = rht_col ? amax_ptr + 1 : amax_ptr;
  p.two_d = spec.two_d();
  p.sr = spec.stochastic_rounding();
  p.rht = rht_col;
  p.rht_sign_mask = spec.random_sign_mask() ? te::kRhtSignMask : 0u;
  p.swizzled = spec.swizzled();
  if (p.sr) p.rng = nvfp4_rng_state(spec, x);
  if (spec.rowwise) {
    p.row_data = o.row_data.data_ptr<uint8_t>();
    p.row_scale = o.row_scale_inv.data_ptr<uint8_t>();
    p.amax_out_row = o.amax_row.data_ptr<float>();
  }
  if (spec.columnwise) {
    p.col_data = o.col_data.data_ptr<uint8_t>();
    p.col_scale = o.col_scale_inv.data_ptr<uint8_t>();
    p.amax_out_col = o.amax_col.data_ptr<float>();
  }
  run_nvfp4(dt, p, x);
}

// The activation helper: validates, picks the fusion path (SPEC §5.1), runs the kernels and returns what they
// produced.
ActResult activation_helper(ActRequest r, const QuantSpec& spec, QuantOutputs* into) {
  const te::DType dt = check_request(r);
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

  const bool mx = spec.kind == te::QuantKind::kMxfp8;
  if (mx) check_mxfp8_shape(r, geo, spec);
  if (spec.kind == te::QuantKind::kNvfp4) check_nvfp4_request(r, geo, spec);
  Tensor partial, grad_bias;
  if (r.with_dbias) {
    TORCH_CHECK_VALUE(!te::act_is_gated(r.kind), op_name(r), ": dbias is defined for unary activations only");
    const int64_t partial_rows = mx ? te::mxfp8_dbias_blocks(geo.rows) : te::act_dbias_blocks(geo.rows, geo.cols);
    partial = new_empty_in_guard({partial_rows, geo.out_cols}, r.x.options().dtype(at::kFloat));
    grad_bias = new_empty_in_guard({geo.out_cols}, r.x.options());
    p.dbias_partial = partial.data_ptr<float>();
  }

  QuantOutputs o;
  if (into) o = *into;
  switch (choose_fusion_path(spec)) {
    case te::FusionPath::kFullyFused:
    case te::FusionPath::kFusedActivationAmaxFp8:
      if (spec.kind == te::QuantKind::kNone) {
        o.row_data = new_empty_in_guard(geo.out_shape, r.x.options());
        p.out = o.row_data.data_ptr();
        p.mode = te::ScaleMode::kPlain;
        run_activation(r.kind, r.backward, dt, p, r.x);
        break;
      }
      if (spec.kind == te::QuantKind::kFp8Delayed || spec.kind == te::QuantKind::kFp8Current) {
        run_fp8_per_tensor(r, geo, spec, dt, p, o, into != nullptr);
        break;
      }
      if (mx) {
        run_mxfp8_path(r, geo, spec, dt, p, o, into != nullptr);
        break;
      }
      [[fallthrough]];
    case te::FusionPath::kFusedActivationAmaxNvfp4:
    case te::FusionPath::kUnfused:
      if (spec.kind == te::QuantKind::kFp8Block) {
        run_fp8_block_path(r, geo, spec, dt, p, o, into != nullptr);
        break;
      }
      if (spec.kind == te::QuantKind::kNvfp4) {
        run_nvfp4_path(r, geo, spec, dt, p, o, into != nullptr);
        break;
      }
      [[fallthrough]];
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(false, op_name(r), ": quantizer kind ", std::to_string(int(spec.kind)),
                                  " is not known; accepted: 0 none, 1 FP8 delayed, 2 FP8 current, 3 MXFP8, 4 NVFP4, 5 FP8 block");
  }
  if (r.with_dbias) {
    if (geo.rows == 0 || geo.out_cols == 0) {
      grad_bias.zero_();
    } else if (!(spec.noop && into)) {
      run_dbias_reduce(partial, grad_bias);
    }
  }
  return {grad_bias, o};
}

// Runs a quantizing op and returns its fixed tuple (SPEC §1.4), [grad_bias] first for the dbias ops. Absent data
// pieces are uint8 with a quantizer, float32 without one, as the fake kernels in _ops.py say.
QOut returned(const ActResult& res, const ActRequest& r, const QuantSpec& spec) {
  return res.out.returned(r.x, spec.kind == te::QuantKind::kNone ? at::kFloat : at::kByte);
}

QOut run_quantizing(const ActRequest& r, const QuantSpec& spec) {
  return returned(activation_helper(r, spec, nullptr), r, spec);
}

QOutBias run_quantizing_with_bias(const ActRequest& r, const QuantSpec& spec) {
  const ActResult res = activation_helper(r, spec, nullptr);
  return std::tuple_cat(std::make_tuple(res.grad_bias), returned(res, r, spec));
}

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
  return activation_helper(r, QuantSpec{}, nullptr).out.row_data;
}

Tensor dact(const Tensor& grad, const Tensor& x, int64_t code, double limit, double alpha, double offset) {
  ActRequest r{"dact", act_kind("dact", code), true, x, grad, act_args(limit, alpha, offset), false};
  return activation_helper(r, QuantSpec{}, nullptr).out.row_data;
}

QOut act_quantize(const Tensor& x, int64_t code, double limit, double alpha, double offset, TE_QSPEC_PARAMS) {
  ActRequest r{"act_quantize", act_kind("act_quantize", code), false, x, c10::nullopt, act_args(limit, alpha, offset),
               false};
  return run_quantizing(r, TE_QSPEC_ARGS("act_quantize", x));
}

QOut dact_quantize(const Tensor& grad, const Tensor& x, int64_t code, double limit, double alpha, double offset,
                   TE_QSPEC_PARAMS) {
  ActRequest r{"dact_quantize", act_kind("dact_quantize", code), true, x, grad, act_args(limit, alpha, offset), false};
  return run_quantizing(r, TE_QSPEC_ARGS("dact_quantize", x));
}

QOutBias dbias_dact(const Tensor& grad, const Tensor& x, int64_t code, TE_QSPEC_PARAMS) {
  ActRequest r{"dbias_dact", act_kind("dbias_dact", code), true, x, grad, te::ActArgs{}, true};
  return run_quantizing_with_bias(r, TE_QSPEC_ARGS("dbias_dact", x));
}

// rng_seed >= 0: NVFP4 stochastic rounding with this (seed, offset) instead of the device generator's (ours: the
// same bytes on every device, for reproducibility and the CPU/CUDA parity tests).
QOut quantize(const Tensor& x, TE_QSPEC_PARAMS, int64_t rng_seed, int64_t rng_offset) {
  TORCH_CHECK_VALUE(qkind != 0, "quantize: a quantizer is required (use the tensor as it is)");
  TORCH_CHECK_VALUE(rng_offset >= 0, "quantize: rng_offset must be >= 0, got ", std::to_string(rng_offset));
  ActRequest r{"quantize", te::ActKind::kIdentity, false, x, c10::nullopt, te::ActArgs{}, false};
  QuantSpec spec = TE_QSPEC_ARGS("quantize", x);
  spec.rng_seed = rng_seed;
  spec.rng_offset = rng_offset;
  return run_quantizing(r, spec);
}

QOutBias bgrad_quantize(const Tensor& x, TE_QSPEC_PARAMS) {
  ActRequest r{"bgrad_quantize", te::ActKind::kIdentity, false, x, c10::nullopt, te::ActArgs{}, true};
  return run_quantizing_with_bias(r, TE_QSPEC_ARGS("bgrad_quantize", x));
}

// The caller's buffers of a block-format output (quantize_into): a copy is written when the quantizer asks for it
// and both its buffers are given; each given buffer must have the format's shape, dtype and device.
struct BlockCopyShapes {
  at::DimVector row_data, row_scale, col_data, col_scale;
  at::ScalarType scale_dtype;
  const char* col_data_name;
};
void take_block_buffers(QuantSpec& spec, QuantOutputs& o, const BlockCopyShapes& shapes, const std::string& format,
                        const c10::optional<Tensor>& row_data, const c10::optional<Tensor>& row_scale_inv,
                        const c10::optional<Tensor>& col_data, const c10::optional<Tensor>& col_scale_inv,
                        const Tensor& x, const char* op) {
  spec.rowwise = spec.rowwise && row_data.has_value() && row_scale_inv.has_value();
  spec.columnwise = spec.columnwise && col_data.has_value() && col_scale_inv.has_value();
  TORCH_CHECK_VALUE(spec.rowwise || spec.columnwise, op, ": the ", format,
                    " output has no buffers for the requested usage");
  if (spec.rowwise) {
    o.row_data = *row_data;
    o.row_scale_inv = *row_scale_inv;
    check_buffer(o.row_data, shapes.row_data, at::kByte, x, op, "_rowwise_data");
    check_buffer(o.row_scale_inv, shapes.row_scale, shapes.scale_dtype, x, op, "_rowwise_scale_inv");
  }
  if (spec.columnwise) {
    o.col_data = *col_data;
    o.col_scale_inv = *col_scale_inv;
    check_buffer(o.col_data, shapes.col_data, at::kByte, x, op, shapes.col_data_name);
    check_buffer(o.col_scale_inv, shapes.col_scale, shapes.scale_dtype, x, op, "_columnwise_scale_inv");
  }
}

void quantize_into(const Tensor& x, TE_QSPEC_PARAMS, const c10::optional<Tensor>& row_data,
                   const c10::optional<Tensor>& row_scale_inv, const c10::optional<Tensor>& col_data,
                   const c10::optional<Tensor>& col_scale_inv) {
  const char* op = "quantize_into";
  TORCH_CHECK_VALUE(qkind >= 1 && qkind <= 5, op,
                    ": in-place quantization supports FP8 per-tensor, MXFP8, NVFP4 and FP8 block quantizers (kinds "
                    "1-5), got ", std::to_string(qkind));
  QuantSpec spec = TE_QSPEC_ARGS(op, x);
  ActRequest r{op, te::ActKind::kIdentity, false, x, c10::nullopt, te::ActArgs{}, false};
  input_dtype(x, op, "input");
  const ActGeometry geo = geometry(r);
  QuantOutputs o;
  if (spec.kind == te::QuantKind::kNvfp4) {
    // The amax pair [rowwise, columnwise] (float32 [2], written in place) comes in the spec's amax field.
    check_nvfp4_request(r, geo, spec);
    TORCH_CHECK_VALUE(spec.amax.has_value(), op, ": NVFP4 in-place quantization needs the output's amax pair");
    const Tensor amax_pair = *spec.amax;
    check_buffer(amax_pair, {2}, at::kFloat, x, op, "amax pair [_amax_rowwise, _amax_columnwise]");
    spec.amax.reset();
    const te::Nvfp4ScaleShapes ss = te::nvfp4_scale_shapes(geo.rows, geo.out_cols);
    at::DimVector packed = geo.out_shape;
    packed.back() = geo.out_cols / 2;
    take_block_buffers(spec, o, {packed, {ss.row_r, ss.row_c}, {geo.out_cols, geo.rows / 2}, {ss.col_r, ss.col_c},
                                 at::kByte, "_columnwise_data"},
                       "NVFP4", row_data, row_scale_inv, col_data, col_scale_inv, x, op);
    if (spec.rowwise) o.amax_row = amax_pair.narrow(0, 0, 1);
    if (spec.columnwise) o.amax_col = amax_pair.narrow(0, 1, 1);
    activation_helper(r, spec, &o);
    return;
  }
  if (spec.kind == te::QuantKind::kMxfp8) {
    check_mxfp8_shape(r, geo, spec);
    const te::Mxfp8ScaleShapes ss = te::mxfp8_scale_shapes(geo.rows, geo.out_cols);
    take_block_buffers(spec, o, {geo.out_shape, {ss.row_r, ss.row_c}, geo.out_shape, {ss.col_r, ss.col_c}, at::kByte,
                                 "_columnwise_data"},
                       "MXFP8", row_data, row_scale_inv, col_data, col_scale_inv, x, op);
    activation_helper(r, spec, &o);
    return;
  }
  if (spec.kind == te::QuantKind::kFp8Block) {
    const te::Fp8BlockScaleShapes ss = te::fp8_block_scale_shapes(geo.rows, geo.out_cols, spec.block_dim == 2);
    take_block_buffers(spec, o, {geo.out_shape, {ss.row_r, ss.row_c}, geo.transposed_shape(), {ss.col_r, ss.col_c},
                                 at::kFloat, "_columnwise_data (transposed)"},
                       spec.fp8_block_name(), row_data, row_scale_inv, col_data, col_scale_inv, x, op);
    activation_helper(r, spec, &o);
    return;
  }
  TORCH_CHECK_VALUE(row_scale_inv.has_value(), op, ": the output's scale_inv buffer is missing");
  check_buffer(*row_scale_inv, {1}, at::kFloat, x, op, "_scale_inv");
  o.row_scale_inv = *row_scale_inv;
  spec.rowwise = spec.rowwise && row_data.has_value();
  spec.columnwise = spec.columnwise && col_data.has_value();
  if (spec.rowwise) {
    o.row_data = *row_data;
    check_buffer(o.row_data, geo.out_shape, at::kByte, x, op, "_data");
  }
  if (spec.columnwise) {
    o.col_data = *col_data;
    check_buffer(o.col_data, geo.transposed_shape(), at::kByte, x, op, "_transpose");
  }
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
