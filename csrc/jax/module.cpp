// transformer_engine_jax._ffi: the handlers as PyCapsules for jax.ffi.register_ffi_target, and the core's planner
// for trace time (output shapes and dtypes, workspace bytes, and the checks with their messages) — the same plan
// the handlers run, so shapes are decided once, below both frontends. pybind11; no torch, no XLA runtime linked.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "../core/comm/nccl_comm.h"
#include "../core/formats/table.h"
#if defined(TE_WITH_CUDA)
#include "../core/comm/local_windows.h"
#endif
#include "collective.h"
#include "gemm.h"
#include "grouped_gemm.h"
#include "norm.h"
#include "quantizer_attrs.h"

#define TE_JAX_DECLARE(name)                                  \
  extern "C" XLA_FFI_Error* name##Cpu(XLA_FFI_CallFrame*);    \
  TE_JAX_DECLARE_CUDA(name)
#if defined(TE_WITH_CUDA)
#define TE_JAX_DECLARE_CUDA(name)                              \
  extern "C" XLA_FFI_Error* name##Cuda(XLA_FFI_CallFrame*);    \
  extern "C" XLA_FFI_Error* name##CudaInit(XLA_FFI_CallFrame*);
#else
#define TE_JAX_DECLARE_CUDA(name)
#endif
TE_JAX_DECLARE(TeActLu)
TE_JAX_DECLARE(TeDactLuDbiasQuantize)
TE_JAX_DECLARE(TeQuantize)
TE_JAX_DECLARE(TeGemm)
TE_JAX_DECLARE(TeGroupedGemm)
TE_JAX_DECLARE(TeNormFwd)
TE_JAX_DECLARE(TeNormBwd)
#if defined(TE_WITH_CUDA)
TE_JAX_DECLARE_CUDA(TeCollectiveGemm)  // CUDA only: the CPU runs the ring as ppermutes
#endif

namespace py = pybind11;

namespace te_jax {
namespace {

template <typename T> py::capsule capsule(T* fn) {
  return py::capsule(reinterpret_cast<void*>(fn), "xla._CUSTOM_CALL_TARGET");
}

// {target name: capsule} for the CPU, {target name: {"initialize": capsule, "execute": capsule}} for CUDA.
py::dict cpu_targets() {
  py::dict d;
  d["te_act_lu"] = capsule(TeActLuCpu);
  d["te_dact_lu_dbias_quantize"] = capsule(TeDactLuDbiasQuantizeCpu);
  d["te_quantize"] = capsule(TeQuantizeCpu);
  d["te_gemm"] = capsule(TeGemmCpu);
  d["te_grouped_gemm"] = capsule(TeGroupedGemmCpu);
  d["te_norm_fwd"] = capsule(TeNormFwdCpu);
  d["te_norm_bwd"] = capsule(TeNormBwdCpu);
  return d;
}

py::dict cuda_targets() {
  py::dict d;
#if defined(TE_WITH_CUDA)
  const auto stages = [](auto* execute, auto* initialize) {
    py::dict s;
    s["execute"] = capsule(execute);
    s["initialize"] = capsule(initialize);
    return s;
  };
  d["te_act_lu"] = stages(TeActLuCuda, TeActLuCudaInit);
  d["te_dact_lu_dbias_quantize"] = stages(TeDactLuDbiasQuantizeCuda, TeDactLuDbiasQuantizeCudaInit);
  d["te_quantize"] = stages(TeQuantizeCuda, TeQuantizeCudaInit);
  d["te_gemm"] = stages(TeGemmCuda, TeGemmCudaInit);
  d["te_grouped_gemm"] = stages(TeGroupedGemmCuda, TeGroupedGemmCudaInit);
  d["te_norm_fwd"] = stages(TeNormFwdCuda, TeNormFwdCudaInit);
  d["te_norm_bwd"] = stages(TeNormBwdCuda, TeNormBwdCudaInit);
  d["te_collective_gemm"] = stages(TeCollectiveGemmCuda, TeCollectiveGemmCudaInit);
#endif
  return d;
}

te::ops::Shape shape_of(const std::vector<int64_t>& dims, const char* op) {
  if (dims.size() > size_t(te::ops::kMaxDims)) {
    te::fail(te::ErrorKind::kValue, std::string(op) + ": at most " + std::to_string(te::ops::kMaxDims) +
                                        " dims are supported, got " + std::to_string(dims.size()));
  }
  te::ops::Shape s;
  s.ndim = int(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) s.dims[i] = dims[i];
  return s;
}

// The plan of one call as plain Python data: {"pieces": [(present, dtype code, shape) x 7 in te::ops::Piece
// order], "workspace_bytes": n}. x_shape is the core's (gated: [..., 2H]); grad_shape empty without grad.
// any_device: one plan for every platform the trace may lower to (PlanOptions::any_device: the workspace is the
// largest); `cuda` then names only the device of messages.
py::dict plan_act(const std::string& op, int64_t act, bool backward, bool with_dbias, const std::vector<int64_t>& x_shape,
                  int64_t x_dtype, const std::vector<int64_t>& grad_shape, const QuantizerAttrs& q, bool cuda,
                  bool any_device) {
  te::ops::ActRequest r;
  r.op = op.c_str();
  r.kind = act < 0 ? te::ActKind::kIdentity : te::ops::act_kind(r.op, act);
  r.backward = backward;
  r.with_dbias = with_dbias;
  r.x.dtype = te::DType(x_dtype);
  r.x.shape = shape_of(x_shape, r.op);
  if (backward) {
    r.has_grad = true;
    r.grad.dtype = r.x.dtype;
    r.grad.shape = shape_of(grad_shape, r.op);
  }
  te::ops::ExecCtx ctx = cpu_ctx();
  ctx.cuda = cuda;
  ctx.arch = cuda ? "cuda" : "cpu";
  const te::ops::QuantSpec spec = spec_of(r.op, q);
  te::ops::PlanOptions opt = plan_options(spec, q);
  opt.any_device = any_device;
  const te::ops::ActPlan plan = te::ops::plan_act(r, spec, ctx, opt);
  py::list pieces;
  for (int i = 0; i < te::ops::kNumPieces; ++i) {
    const te::ops::PiecePlan& p = plan.pieces[i];
    pieces.append(py::make_tuple(p.present, int(p.dtype),
                                 std::vector<int64_t>(p.shape.dims, p.shape.dims + p.shape.ndim)));
  }
  py::dict d;
  d["pieces"] = pieces;
  d["workspace_bytes"] = plan.workspace_bytes;
  return d;
}

// (shape, dtype code) pairs of a planner's inputs as the core's views (no data).
std::vector<te::ops::TensorView> plan_views(const std::vector<std::pair<std::vector<int64_t>, int64_t>>& inputs,
                                            size_t n, const char* op, const char* rule) {
  if (inputs.size() != n) {
    te::fail(te::ErrorKind::kValue, std::string(op) + ": " + rule + ", got " + std::to_string(inputs.size()));
  }
  std::vector<te::ops::TensorView> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i].shape = shape_of(inputs[i].first, op);
    v[i].dtype = te::DType(inputs[i].second);
  }
  return v;
}

// The context a trace-time plan is made for: the device kind only.
te::ops::ExecCtx plan_ctx(bool cuda) {
  te::ops::ExecCtx ctx = cpu_ctx();
  ctx.cuda = cuda;
  ctx.arch = cuda ? "cuda" : "cpu";
  return ctx;
}

// The plan of one te_gemm call (gemm.h) as plain Python data: {"out": (shape, dtype code), "pre_gelu_out" and
// "bias_grad": (present, shape, dtype code), "workspace_bytes": n}. `inputs`: (shape, dtype code) of lhs,
// lhs_scale_inv, rhs, rhs_scale_inv, bias, gelu_input, global_amax in the handler's argument order.
py::dict plan_gemm(const std::vector<std::pair<std::vector<int64_t>, int64_t>>& inputs, int64_t out_dtype,
                   const GemmAttrs& attrs, bool cuda) {
  const std::vector<te::ops::TensorView> v =
      plan_views(inputs, 7, kGemmOp, "plan_gemm takes 7 inputs (lhs, lhs_scale_inv, rhs, rhs_scale_inv, bias, "
                                     "gelu_input, global_amax)");
  const te::ops::ExecCtx ctx = plan_ctx(cuda);
  const te::ops::GemmRequest r =
      gemm_request({v[0], v[1], v[2], v[3], v[4], v[5], v[6]}, attrs, te::DType(out_dtype));
  const te::ops::GemmPlan plan = te::ops::plan_gemm(r, ctx, gemm_plan_options(true));
  const auto dims = [](const te::ops::Shape& s) { return std::vector<int64_t>(s.dims, s.dims + s.ndim); };
  py::dict d;
  d["out"] = py::make_tuple(dims(plan.d_shape), int(plan.d_storage));
  d["pre_gelu_out"] = py::make_tuple(plan.has_pre_gelu, dims(plan.d_shape), int(plan.pre_gelu_dtype));
  d["bias_grad"] = py::make_tuple(plan.has_bias_grad, std::vector<int64_t>{plan.bias_grad_len},
                                  int(plan.bias_grad_dtype));
  d["workspace_bytes"] = plan.workspace_bytes;
  return d;
}

// The plan of one te_collective_gemm call (collective.h) for rank 0 (every rank's shapes are the same):
// {"out": (shape, dtype code), "gathered": shape (empty unless keep_gathered), "workspace_bytes": n}. `inputs`: (shape,
// dtype code) of x, x_scale_inv, w, w_scale_inv.
py::dict plan_collective_gemm(const std::vector<std::pair<std::vector<int64_t>, int64_t>>& inputs, int64_t kind,
                              int64_t tp, int64_t out_dtype, bool use_split_accumulator, int64_t sm_margin,
                              bool keep_gathered, bool w_kn, bool cuda) {
  const std::vector<te::ops::TensorView> v = plan_views(
      inputs, 4, kCollectiveGemmOp, "plan_collective_gemm takes 4 inputs (x, x_scale_inv, w, w_scale_inv)");
  CollectiveAttrs at;
  at.kind = kind;
  at.tp = tp;
  at.use_split_accumulator = use_split_accumulator;
  at.sm_margin = sm_margin;
  at.keep_gathered = keep_gathered;
  at.w_kn = w_kn;
  const te::ops::CollectiveGemmRequest r = collective_request({v[0], v[1], v[2], v[3]}, at, 0, te::DType(out_dtype));
  const te::ops::CollectiveGemmPlan plan = te::ops::plan_collective_gemm(r, plan_ctx(cuda));
  const auto dims = [](const te::ops::Shape& s) { return std::vector<int64_t>(s.dims, s.dims + s.ndim); };
  py::dict d;
  d["out"] = py::make_tuple(dims(plan.d_shape), int(plan.d_dtype));
  d["gathered"] = keep_gathered && kind == int64_t(te::ops::CollectiveKind::kAllGather) ? dims(plan.gathered_shape)
                                                                                      : std::vector<int64_t>{0};
  d["workspace_bytes"] = collective_workspace_bytes(plan);
  d["window_bytes"] = te::ops::collective_window_bytes(plan);  // the copy engine's window (0: a kind it does not serve)
  return d;
}

// The copy-engine windows of rings whose every member is a device of this process (csrc/core/comm/local_windows.h):
// rings [[(device, rank), ...], ...].
void local_windows_ensure(int64_t key, const std::vector<std::vector<std::pair<int, int>>>& rings, int64_t bytes) {
#if defined(TE_WITH_CUDA)
  std::vector<std::vector<te::comm::LocalMember>> r;
  for (const auto& ring : rings) {
    r.emplace_back();
    for (const auto& [device, rank] : ring) r.back().push_back({device, rank});
  }
  py::gil_scoped_release release;
  te::comm::local_windows_ensure(key, r, bytes);
#else
  (void)key, (void)rings, (void)bytes;
  te::core_fail("local_windows_ensure: this build has no CUDA");
#endif
}

// The NCCL registry (csrc/core/comm/nccl_comm.h) for transformer_engine_jax/collective.py: members are (device, rank).
void nccl_create(int64_t key, const py::bytes& unique_id, int size, const std::vector<std::pair<int, int>>& members) {
  std::vector<te::comm::NcclMember> m;
  for (const auto& [device, rank] : members) m.push_back({device, rank});
  const std::string id = unique_id;
  py::gil_scoped_release release;  // blocks until every process of the ring has joined
  te::comm::nccl_create(key, id, size, m);
}

// The plan of one te_grouped_gemm call (grouped_gemm.h): {"out": (shape, dtype code), "workspace_bytes": n,
// "kernel": what runs it}. `inputs`: (shape, dtype code) of lhs, rhs, group_sizes, lhs_scale_inv, rhs_scale_inv.
py::dict plan_grouped_gemm(const std::vector<std::pair<std::vector<int64_t>, int64_t>>& inputs, bool rhs_kn,
                           int64_t out_dtype, bool cuda, bool use_split_accumulator, bool wgrad) {
  const std::vector<te::ops::TensorView> v =
      plan_views(inputs, 5, kGroupedGemmOp, "plan_grouped_gemm takes 5 inputs (lhs, rhs, group_sizes, "
                                            "lhs_scale_inv, rhs_scale_inv)");
  const te::ops::ExecCtx ctx = plan_ctx(cuda);
  const te::ops::GroupedGemmRequest r = grouped_gemm_request({v[0], v[1], v[2], v[3], v[4]}, rhs_kn, use_split_accumulator, wgrad,
                                                             te::DType(out_dtype));
  const te::ops::GroupedGemmPlan plan = te::ops::plan_grouped_gemm(r, ctx, /*plan_outputs=*/true);
  py::dict d;
  d["out"] = py::make_tuple(std::vector<int64_t>(plan.d_shape.dims, plan.d_shape.dims + plan.d_shape.ndim),
                            int(plan.d_dtype));
  d["workspace_bytes"] = plan.workspace_bytes;
  d["kernel"] = std::string(te::ops::grouped_gemm_kernel(plan));
  return d;
}

// A planned piece as plain Python data: (present, dtype code, shape).
py::tuple piece_tuple(const te::ops::PiecePlan& p) {
  return py::make_tuple(p.present, int(p.dtype), std::vector<int64_t>(p.shape.dims, p.shape.dims + p.shape.ndim));
}

// A view of a planner's input: shape and dtype code, no data.
te::ops::TensorView shape_view(const std::vector<int64_t>& dims, int64_t dtype, const char* op) {
  te::ops::TensorView v;
  v.shape = shape_of(dims, op);
  v.dtype = te::DType(dtype);
  return v;
}

// The plan of one te_norm_fwd call (norm.cpp) as plain Python data: {"pieces": [(present, dtype code, shape) x 7 in
// te::ops::Piece order], "mu", "rsigma": (present, dtype code, shape), "workspace_bytes": n}. beta_dtype < 0: no
// beta (RMSNorm). any_device as plan_act's.
py::dict plan_norm_fwd(int64_t norm_type, bool zero_centered_gamma, double epsilon, int64_t otype,
                       const std::vector<int64_t>& x_shape, int64_t x_dtype, const std::vector<int64_t>& gamma_shape,
                       int64_t gamma_dtype, const std::vector<int64_t>& beta_shape, int64_t beta_dtype,
                       const QuantizerAttrs& q, bool cuda, bool any_device) {
  const char* op = norm_type == 1 ? "rmsnorm_fwd" : "layernorm_fwd";
  const bool has_beta = beta_dtype >= 0;
  const te::ops::NormFwdRequest r = norm_fwd_request(
      norm_type, zero_centered_gamma, epsilon, otype, shape_view(x_shape, x_dtype, op),
      shape_view(gamma_shape, gamma_dtype, op), has_beta,
      has_beta ? shape_view(beta_shape, beta_dtype, op) : te::ops::TensorView{});
  const te::ops::QuantSpec spec = spec_of(r.op, q);
  te::ops::PlanOptions opt = plan_options(spec, q);
  opt.any_device = any_device;
  const te::ops::NormFwdPlan plan = te::ops::plan_norm_fwd(r, spec, plan_ctx(cuda), opt);
  py::list pieces;
  for (const te::ops::PiecePlan& p : plan.pieces) pieces.append(piece_tuple(p));
  py::dict d;
  d["pieces"] = pieces;
  d["mu"] = piece_tuple(plan.mu);
  d["rsigma"] = piece_tuple(plan.rsigma);
  d["workspace_bytes"] = plan.workspace_bytes;
  return d;
}

// The plan of one te_norm_bwd call: {"dx", "dgamma", "dbeta": (present, dtype code, shape), "workspace_bytes": n}.
// mu_shape empty: no mu (RMSNorm).
py::dict plan_norm_bwd(int64_t norm_type, bool zero_centered_gamma, const std::vector<int64_t>& dz_shape,
                       int64_t dz_dtype, const std::vector<int64_t>& x_shape, int64_t x_dtype,
                       const std::vector<int64_t>& mu_shape, const std::vector<int64_t>& rsigma_shape,
                       int64_t stat_dtype, const std::vector<int64_t>& gamma_shape, int64_t gamma_dtype, bool cuda) {
  const char* op = norm_type == 1 ? "rmsnorm_bwd" : "layernorm_bwd";
  const bool has_mu = !mu_shape.empty();
  const te::ops::NormBwdRequest r = norm_bwd_request(
      norm_type, zero_centered_gamma, shape_view(dz_shape, dz_dtype, op), shape_view(x_shape, x_dtype, op), has_mu,
      has_mu ? shape_view(mu_shape, stat_dtype, op) : te::ops::TensorView{}, shape_view(rsigma_shape, stat_dtype, op),
      shape_view(gamma_shape, gamma_dtype, op));
  const te::ops::NormBwdPlan plan = te::ops::plan_norm_bwd(r, plan_ctx(cuda));
  py::dict d;
  d["dx"] = piece_tuple(plan.dx);
  d["dgamma"] = piece_tuple(plan.dgamma);
  d["dbeta"] = piece_tuple(plan.dbeta);
  d["workspace_bytes"] = plan.workspace_bytes;
  return d;
}

// The core's activation table (producers/act_functors.h) as [(code, name, gated)], TE's codes only: tej derives its
// activations from it, so a new activation needs no JAX-side row.
py::list activations() {
  py::list rows;
#define TE_JAX_ROW(code, value, name, F, gated, ...) \
  if (te::ActKind::code != te::ActKind::kIdentity) rows.append(py::make_tuple(value, name, gated));
  TE_FOR_EACH_ACTIVATION(TE_JAX_ROW)
#undef TE_JAX_ROW
  return rows;
}

// The core's format table (csrc/core/formats/table.h), one dict per format id, for transformer_engine_jax's
// quantizers and dequantize, read once at import.
py::object copy_rule(const te::CopyRule& c) {
  if (!c.present) return py::none();
  py::dict d;
  d["transposed"] = c.transposed;
  d["flat2d"] = c.flat2d;
  d["block"] = py::make_tuple(c.block_rows, c.block_cols);
  d["scale_rank"] = c.scale_rank;
  py::list dims;
  for (const te::ScaleDim& s : c.scale) dims.append(py::make_tuple(s.src, s.block, s.pad, s.exact));
  d["scale"] = py::tuple(dims);
  return std::move(d);
}

py::tuple format_table() {
  py::list rows;
  for (int f = 0; f < te::kFormatCount; ++f) {
    const te::FormatInfo& r = te::format_info(te::Format(f));
    py::list elems, kinds;
    for (te::DType t : r.elem_types) elems.append(int(t));
    for (te::QuantKind k : r.kinds) kinds.append(int(k));
    py::dict d;
    d["id"] = f;
    d["name"] = r.name;
    d["elem_types"] = py::tuple(elems);
    d["scale_type"] = int(r.scale_type);
    d["decode"] = int(r.decode);
    d["global_amax"] = r.global_amax;
    d["kinds"] = py::tuple(kinds);
    d["block_dim"] = r.block_dim;
    d["elems_per_byte"] = r.rule.elems_per_byte;
    d["row"] = copy_rule(r.rule.row);
    d["col"] = copy_rule(r.rule.col);
    rows.append(d);
  }
  return py::tuple(rows);
}

py::tuple copy_shapes(const te::CopyShapes& s) {
  return py::make_tuple(py::make_tuple(s.row.r, s.row.c), py::make_tuple(s.col.r, s.col.c));
}

py::bytes format_decode(int fmt, bool columnwise, int code_type, const std::string& codes, const std::string& scales,
                        float amax, int64_t rows, int64_t cols) {
  const std::vector<float> out = te::format_decode(
      te::format_of(fmt), columnwise, te::DType(code_type), reinterpret_cast<const uint8_t*>(codes.data()),
      codes.size(), reinterpret_cast<const uint8_t*>(scales.data()), scales.size(), amax, rows, cols);
  return py::bytes(reinterpret_cast<const char*>(out.data()), out.size() * sizeof(float));
}

}  // namespace
}  // namespace te_jax

PYBIND11_MODULE(_ffi, m) {
  m.doc() = "transformer_engine_jax's XLA FFI handlers and the core's planner";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const te::Error& e) {
      switch (e.kind) {
        case te::ErrorKind::kType: PyErr_SetString(PyExc_TypeError, e.what()); return;
        case te::ErrorKind::kNotImplemented: PyErr_SetString(PyExc_NotImplementedError, e.what()); return;
        case te::ErrorKind::kValue: PyErr_SetString(PyExc_ValueError, e.what()); return;
        default: PyErr_SetString(PyExc_RuntimeError, e.what()); return;
      }
    }
  });
  py::class_<te_jax::QuantizerAttrs>(m, "QuantizerAttrs")
      .def(py::init([](int64_t scaling_mode, int64_t q_dtype, int64_t q_layout, int64_t flags, float amax_epsilon,
                       bool amax_given, bool amax_only, bool dbias_fp32) {
             return te_jax::QuantizerAttrs{scaling_mode, q_dtype,    q_layout,  flags,
                                           amax_epsilon, amax_given, amax_only, dbias_fp32};
           }),
           py::arg("scaling_mode"), py::arg("q_dtype"), py::arg("q_layout"), py::arg("flags"),
           py::arg("amax_epsilon"), py::arg("amax_given"), py::arg("amax_only"), py::arg("dbias_fp32"));
  py::class_<te_jax::GemmAttrs>(m, "GemmAttrs")
      .def(py::init([](bool lhs_transposed, bool rhs_transposed, int64_t lhs_scaling, int64_t rhs_scaling,
                       bool fuse_bias, bool fuse_gelu, bool grad, bool use_split_accumulator, bool allow_tf32) {
             return te_jax::GemmAttrs{lhs_transposed, rhs_transposed, lhs_scaling, rhs_scaling, fuse_bias,
                                      fuse_gelu,      grad,           use_split_accumulator, allow_tf32};
           }),
           py::arg("lhs_transposed"), py::arg("rhs_transposed"), py::arg("lhs_scaling"), py::arg("rhs_scaling"),
           py::arg("fuse_bias"), py::arg("fuse_gelu"), py::arg("grad"), py::arg("use_split_accumulator"),
           py::arg("allow_tf32"));
  m.def("activations", &te_jax::activations);
  m.def("cpu_targets", &te_jax::cpu_targets);
  m.def("cuda_targets", &te_jax::cuda_targets);
  m.def("plan_gemm", &te_jax::plan_gemm, py::arg("inputs"), py::arg("out_dtype"), py::arg("attrs"), py::arg("cuda"));
  m.def("plan_grouped_gemm", &te_jax::plan_grouped_gemm, py::arg("inputs"), py::arg("rhs_kn"), py::arg("out_dtype"),
        py::arg("cuda"), py::arg("use_split_accumulator") = true, py::arg("wgrad") = false);
  m.def("plan_act", &te_jax::plan_act, py::arg("op"), py::arg("act"), py::arg("backward"), py::arg("with_dbias"),
        py::arg("x_shape"), py::arg("x_dtype"), py::arg("grad_shape"), py::arg("quantizer"), py::arg("cuda"),
        py::arg("any_device") = false);
  // Debug counter (te::ops::plan_act_calls): the core's activation/cast plans made by this library so far, the
  // handlers' run-time plans and the trace-time ones above alike.
  m.def("plan_act_calls", &te::ops::plan_act_calls);
  m.def("plan_collective_gemm", &te_jax::plan_collective_gemm, py::arg("inputs"), py::arg("kind"), py::arg("tp"),
        py::arg("out_dtype"), py::arg("use_split_accumulator"), py::arg("sm_margin"), py::arg("keep_gathered"),
        py::arg("w_kn"), py::arg("cuda"));
  m.def("plan_norm_fwd", &te_jax::plan_norm_fwd, py::arg("norm_type"), py::arg("zero_centered_gamma"),
        py::arg("epsilon"), py::arg("otype"), py::arg("x_shape"), py::arg("x_dtype"), py::arg("gamma_shape"),
        py::arg("gamma_dtype"), py::arg("beta_shape"), py::arg("beta_dtype"), py::arg("quantizer"), py::arg("cuda"),
        py::arg("any_device") = false);
  m.def("plan_norm_bwd", &te_jax::plan_norm_bwd, py::arg("norm_type"), py::arg("zero_centered_gamma"),
        py::arg("dz_shape"), py::arg("dz_dtype"), py::arg("x_shape"), py::arg("x_dtype"), py::arg("mu_shape"),
        py::arg("rsigma_shape"), py::arg("stat_dtype"), py::arg("gamma_shape"), py::arg("gamma_dtype"),
        py::arg("cuda"));
  m.def("format_table", &te_jax::format_table);
  m.def("format_scale_shapes", [](int fmt, int64_t rows, int64_t cols) {
    return te_jax::copy_shapes(te::format_scale_shapes(te::format_of(fmt), rows, cols));
  }, py::arg("fmt"), py::arg("rows"), py::arg("cols"));
  m.def("format_data_shapes", [](int fmt, int64_t rows, int64_t cols) {
    return te_jax::copy_shapes(te::format_data_shapes(te::format_of(fmt), rows, cols));
  }, py::arg("fmt"), py::arg("rows"), py::arg("cols"));
  m.def("format_decode", &te_jax::format_decode, py::arg("fmt"), py::arg("columnwise"), py::arg("code_type"),
        py::arg("codes"), py::arg("scales"), py::arg("amax"), py::arg("rows"), py::arg("cols"));
  m.def("nccl_built", &te::comm::nccl_built);
  m.def("nccl_load", &te::comm::nccl_load, py::arg("path"));
  m.def("nccl_loaded", &te::comm::nccl_loaded);
  m.def("nccl_version", &te::comm::nccl_version);
  m.def("nccl_unique_id", [] { return py::bytes(te::comm::nccl_unique_id()); });
  m.def("nccl_create", &te_jax::nccl_create, py::arg("key"), py::arg("unique_id"), py::arg("size"),
        py::arg("members"));
  m.def("nccl_has", &te::comm::nccl_has, py::arg("key"), py::arg("device"));
  // The collective GEMM's transport decision and window size, the core's (collective_gemm_op.h).
  m.def("collective_transport",
        [](bool node_local) { return std::string(te::ops::transport_name(te::ops::collective_transport(node_local))); },
        py::arg("node_local"));
  m.def("collective_window_bytes",
        [](int64_t kind, int64_t rows, int64_t n, int tp) {
          return te::ops::collective_window_bytes(te::ops::CollectiveKind(kind), rows, n, tp);
        },
        py::arg("kind"), py::arg("rows"), py::arg("n"), py::arg("tp"));
  m.def("local_windows_ensure", &te_jax::local_windows_ensure, py::arg("key"), py::arg("rings"), py::arg("bytes"));
#if defined(TE_WITH_CUDA)
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
}
