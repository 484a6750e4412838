// transformer_engine_jax._ffi: the handlers as PyCapsules for jax.ffi.register_ffi_target, and the core's planner
// for trace time (output shapes and dtypes, workspace bytes, and the checks with their messages) — the same plan
// the handlers run, so shapes are decided once, below both frontends. pybind11; no torch, no XLA runtime linked.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

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
py::dict plan_act(const std::string& op, int64_t act, bool backward, bool with_dbias, const std::vector<int64_t>& x_shape,
                  int64_t x_dtype, const std::vector<int64_t>& grad_shape, const QuantizerAttrs& q, bool cuda) {
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
  const te::ops::ActPlan plan = te::ops::plan_act(r, spec, ctx, plan_options(spec, q));
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

// The core's activation table (act/act_functors.h) as [(code, name, gated)], TE's codes only: tej derives its
// activations from it, so a new activation needs no JAX-side row.
py::list activations() {
  py::list rows;
#define TE_JAX_ROW(code, value, name, F, gated, ...) \
  if (te::ActKind::code != te::ActKind::kIdentity) rows.append(py::make_tuple(value, name, gated));
  TE_FOR_EACH_ACTIVATION(TE_JAX_ROW)
#undef TE_JAX_ROW
  return rows;
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
  m.def("activations", &te_jax::activations);
  m.def("cpu_targets", &te_jax::cpu_targets);
  m.def("cuda_targets", &te_jax::cuda_targets);
  m.def("plan_act", &te_jax::plan_act, py::arg("op"), py::arg("act"), py::arg("backward"), py::arg("with_dbias"),
        py::arg("x_shape"), py::arg("x_dtype"), py::arg("grad_shape"), py::arg("quantizer"), py::arg("cuda"));
#if defined(TE_WITH_CUDA)
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
}
