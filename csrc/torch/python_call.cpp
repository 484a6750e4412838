// `_C.call(op, args[, keep])`: the eager fast path of the Python wrappers, equal to `op(*args)` for an OpOverload of
// the `te` library and a tuple of positional arguments (one tuple, built once by the caller, rather than *args
// packed and unpacked again on the way). Outputs whose bit in the optional `keep` mask is clear may come back as
// None: a quantizing op returns six tensors, and the 0-element placeholders of the absent pieces are released here
// without becoming Python objects (about 70 ns each on a fast host); the fallback returns them all.
//
// Why: `OpOverload.__call__` parses every argument in torch's generic Python binding, about 0.2 us per scalar on a
// fast host (1.6 us for the eight scalars of act_quantize), more than the rest of a small call's host work. Here the
// arguments are converted by the kind their schema gives, read once per op, and the op goes through the same
// dispatcher call (autograd, functionalization, fake/Python modes, profiler and tracer keys all apply), with the GIL
// released around it and errors translated by torch's own handler, as torch does. Only tensors, ints, floats, bools
// and dtypes are read; anything else (tensor subclasses, SymInts, a missing argument without default, a schema with
// lists or strings) and any active __torch_function__ mode fall back to `op(*args)`, so the result, the error and
// its message are always torch's. The op's schema stays defined once (registration.cpp).
#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include "../core/gemm/gemm.h"
#include "../core/ops/plan.h"
#include "bridge.h"

#include <memory>
#include <optional>
#include <vector>

namespace te_torch {
namespace {

enum class ArgKind : uint8_t { kTensor, kOptionalTensor, kInt, kFloat, kBool, kScalarType };

// What `call` needs of one op, read from its schema once.
struct FastOp {
  PyObject* op = nullptr;                    // the OpOverload (a reference is kept: the address stays unique)
  std::optional<c10::OperatorHandle> handle;  // unset: a schema this path does not convert (always falls back)
  std::vector<ArgKind> kinds;
  std::vector<std::optional<c10::IValue>> defaults;
  size_t returns = 0;
};

std::optional<ArgKind> arg_kind(const c10::Argument& a) {
  const c10::TypePtr& t = a.real_type();
  switch (t->kind()) {
    case c10::TypeKind::TensorType: return ArgKind::kTensor;
    case c10::TypeKind::IntType: return ArgKind::kInt;
    case c10::TypeKind::FloatType: return ArgKind::kFloat;
    case c10::TypeKind::BoolType: return ArgKind::kBool;
    case c10::TypeKind::ScalarTypeType: return ArgKind::kScalarType;
    case c10::TypeKind::OptionalType:
      if (t->expectRef<c10::OptionalType>().getElementType()->kind() == c10::TypeKind::TensorType) {
        return ArgKind::kOptionalTensor;
      }
      return std::nullopt;
    default: return std::nullopt;
  }
}

std::string py_str_attr(PyObject* obj, const char* name) {
  PyObject* v = PyObject_GetAttrString(obj, name);
  if (v == nullptr) throw python_error();
  const char* s = PyUnicode_AsUTF8(v);
  std::string out = s != nullptr ? s : "";
  Py_DECREF(v);
  if (s == nullptr) throw python_error();
  return out;
}

FastOp make_fast_op(PyObject* op) {
  FastOp f;
  f.op = op;
  PyObject* schema = PyObject_GetAttrString(op, "_schema");
  if (schema == nullptr) throw python_error();
  std::string name, overload;
  try {
    name = py_str_attr(schema, "name");
    overload = py_str_attr(schema, "overload_name");
  } catch (...) {
    Py_DECREF(schema);
    throw;
  }
  Py_DECREF(schema);
  const auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!handle) return f;
  for (const c10::Argument& a : handle->schema().arguments()) {
    const auto kind = arg_kind(a);
    if (!kind || a.kwarg_only()) return f;
    f.kinds.push_back(*kind);
    f.defaults.push_back(a.default_value());
  }
  for (const c10::Argument& r : handle->schema().returns()) {
    if (r.type()->kind() != c10::TypeKind::TensorType) return f;
  }
  f.returns = handle->schema().returns().size();
  f.handle = handle;
  return f;
}

// The ops seen so far, found by the OpOverload's address. Read and extended only while the GIL is held (before
// `call` releases it); an entry never changes once made (a schema is fixed when its library loads).
const FastOp& fast_op(PyObject* op) {
  static std::vector<std::unique_ptr<FastOp>> ops;
  for (const auto& f : ops) {
    if (f->op == op) return *f;
  }
  auto f = std::make_unique<FastOp>(make_fast_op(op));
  Py_INCREF(op);
  ops.push_back(std::move(f));
  return *ops.back();
}

// A plain tensor (or Parameter, which is one as far as C++ is concerned); subclasses may override __torch_function__.
bool push_tensor(PyObject* obj, torch::jit::Stack& stack) {
  if (!THPVariable_CheckExact(obj)) return false;
  stack.emplace_back(THPVariable_Unpack(obj));
  return true;
}

bool push_arg(ArgKind kind, PyObject* obj, torch::jit::Stack& stack) {
  switch (kind) {
    case ArgKind::kTensor: return push_tensor(obj, stack);
    case ArgKind::kOptionalTensor:
      if (obj == Py_None) {
        stack.emplace_back();
        return true;
      }
      return push_tensor(obj, stack);
    case ArgKind::kInt: {
      if (!PyLong_Check(obj) || PyBool_Check(obj)) return false;
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
      if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return false;
      }
      stack.emplace_back(int64_t(v));
      return true;
    }
    case ArgKind::kFloat:
      if (PyFloat_Check(obj)) {
        stack.emplace_back(PyFloat_AS_DOUBLE(obj));
        return true;
      }
      if (PyLong_Check(obj) && !PyBool_Check(obj)) {
        const double v = PyLong_AsDouble(obj);
        if (v == -1.0 && PyErr_Occurred()) {
          PyErr_Clear();
          return false;
        }
        stack.emplace_back(v);
        return true;
      }
      return false;
    case ArgKind::kBool:
      if (obj != Py_True && obj != Py_False) return false;
      stack.emplace_back(obj == Py_True);
      return true;
    case ArgKind::kScalarType:
      if (!THPDtype_Check(obj)) return false;
      stack.emplace_back(reinterpret_cast<THPDtype*>(obj)->scalar_type);
      return true;
  }
  return false;
}

// The op's arguments on a stack, trailing ones from their schema defaults; false if this path cannot take them.
bool to_stack(const FastOp& f, PyObject* const* args, size_t n, torch::jit::Stack& stack) {
  if (!f.handle || n > f.kinds.size()) return false;
  stack.reserve(f.kinds.size());
  for (size_t i = 0; i < f.kinds.size(); ++i) {
    if (i < n) {
      if (!push_arg(f.kinds[i], args[i], stack)) return false;
    } else if (f.defaults[i]) {
      stack.push_back(*f.defaults[i]);
    } else {
      return false;
    }
  }
  return true;
}

PyObject* call(PyObject* /*module*/, PyObject* const* argv, Py_ssize_t argc) {
  HANDLE_TH_ERRORS
  if (argc < 2 || argc > 3 || !PyTuple_Check(argv[1]) || (argc == 3 && !PyLong_Check(argv[2]))) {
    PyErr_SetString(PyExc_TypeError, "call(op, args, keep=-1): an op, a tuple of its positional arguments and an "
                    "int mask of the outputs to return");
    return nullptr;
  }
  PyObject* op = argv[0];
  PyObject* const* args = &PyTuple_GET_ITEM(argv[1], 0);
  const Py_ssize_t nargs = PyTuple_GET_SIZE(argv[1]);
  const FastOp& f = fast_op(op);
  torch::jit::Stack stack;
  if (at::impl::torch_function_mode_enabled() || !to_stack(f, args, size_t(nargs), stack)) {
    return PyObject_Call(op, argv[1], nullptr);
  }
  {
    pybind11::gil_scoped_release no_gil;
    f.handle->callBoxed(stack);
  }
  if (f.returns == 0) Py_RETURN_NONE;
  const unsigned long long keep = argc == 3 ? PyLong_AsUnsignedLongLongMask(argv[2]) : ~0ull;
  if (f.returns == 1) {
    if (keep & 1) return THPVariable_Wrap(std::move(stack[0]).toTensor());
    Py_RETURN_NONE;
  }
  PyObject* out = PyTuple_New(Py_ssize_t(f.returns));
  if (out == nullptr) return nullptr;
  for (size_t i = 0; i < f.returns; ++i) {
    PyObject* t = Py_None;
    if ((keep >> i) & 1) {
      t = THPVariable_Wrap(std::move(stack[i]).toTensor());
    } else {
      Py_INCREF(t);
    }
    if (t == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyTuple_SET_ITEM(out, Py_ssize_t(i), t);
  }
  return out;
  END_HANDLE_TH_ERRORS
}

// Process constants of this build, as plain functions rather than te ops: they are asked from code that dynamo and
// AOTAutograd trace (gemm.py picks native or emulated block GEMMs by them), where an op without tensor arguments
// has no fake kernel to run. `_device.py` caches them.
PyObject* built_with_cuda(PyObject* /*module*/, PyObject* /*unused*/) {
#if defined(TE_WITH_CUDA)
  Py_RETURN_TRUE;
#else
  Py_RETURN_FALSE;
#endif
}

PyObject* cublaslt_version(PyObject* /*module*/, PyObject* /*unused*/) {
#if defined(TE_WITH_CUDA)
  return PyLong_FromSize_t(te::cublaslt_version());
#else
  return PyLong_FromLong(0);
#endif
}

// `plan_act_calls()`: te::ops::plan_act_calls(), the plans this library's core has made (a debug counter: the tests
// that each call plans once).
PyObject* plan_act_calls(PyObject* /*module*/, PyObject* /*unused*/) {
  return PyLong_FromLongLong(te::ops::plan_act_calls());
}

// (sizes, dtype, device) as the planner's tensor; false with a Python error set when it is not one.
bool meta_tensor(PyObject* obj, MetaTensor& t) {
  PyObject* sizes = nullptr;
  PyObject* dtype = nullptr;
  const char* device = nullptr;
  if (!PyArg_ParseTuple(obj, "OO!s", &sizes, &THPDtypeType, &dtype, &device)) return false;
  PyObject* seq = PySequence_Fast(sizes, "plan_outputs: sizes must be a sequence of ints");
  if (seq == nullptr) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  t.sizes.resize(size_t(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    t.sizes[size_t(i)] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    if (t.sizes[size_t(i)] == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return false;
    }
  }
  Py_DECREF(seq);
  t.dtype = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
  t.device = c10::Device(std::string(device));
  return true;
}

bool meta_spec(PyObject* spec_obj, MetaSpec& m);
PyObject* shape_list(const std::vector<std::pair<std::vector<int64_t>, at::ScalarType>>& outs);

// `plan_outputs(op, act, x, grad, spec)`: the (sizes, dtype) of each tensor the te op `op` returns, from the core's
// plan of the call (bridge.h plan_outputs); the fake kernels' shapes. x, grad: (sizes, dtype, device string) or
// None; spec: (qkind, qdtype, rowwise, columnwise, qflags, amax_epsilon, block_dim, has_scale, has_amax) or None.
PyObject* plan_outputs_py(PyObject* /*module*/, PyObject* args) {
  HANDLE_TH_ERRORS
  const char* op = nullptr;
  long long act = 0;
  PyObject *x_obj = nullptr, *grad_obj = nullptr, *spec_obj = nullptr;
  if (!PyArg_ParseTuple(args, "sLO!OO", &op, &act, &PyTuple_Type, &x_obj, &grad_obj, &spec_obj)) return nullptr;
  MetaTensor x;
  if (!meta_tensor(x_obj, x)) return nullptr;
  c10::optional<MetaTensor> grad;
  if (grad_obj != Py_None) {
    grad.emplace();
    if (!meta_tensor(grad_obj, *grad)) return nullptr;
  }
  c10::optional<MetaSpec> spec;
  if (spec_obj != Py_None) {
    MetaSpec m;
    if (!meta_spec(spec_obj, m)) return nullptr;
    spec = m;
  }
  return shape_list(plan_outputs(op, int64_t(act), x, grad, spec));
  END_HANDLE_TH_ERRORS
}

// (qkind, qdtype, rowwise, columnwise, qflags, amax_epsilon, block_dim, has_scale, has_amax) as the planner's spec;
// false with a Python error set when it is not one.
bool meta_spec(PyObject* spec_obj, MetaSpec& m) {
  long long qkind = 0, qdtype = 0, qflags = 0, block_dim = 1;
  int rowwise = 1, columnwise = 1, has_scale = 0, has_amax = 0;
  if (!PyArg_ParseTuple(spec_obj, "LLppLdLpp", &qkind, &qdtype, &rowwise, &columnwise, &qflags, &m.amax_epsilon,
                        &block_dim, &has_scale, &has_amax)) {
    return false;
  }
  m.qkind = qkind;
  m.qdtype = qdtype;
  m.rowwise = rowwise != 0;
  m.columnwise = columnwise != 0;
  m.qflags = qflags;
  m.block_dim = block_dim;
  m.has_scale = has_scale != 0;
  m.has_amax = has_amax != 0;
  return true;
}

// [(sizes, dtype), ...] as a Python list.
PyObject* shape_list(const std::vector<std::pair<std::vector<int64_t>, at::ScalarType>>& outs) {
  PyObject* result = PyList_New(0);
  if (result == nullptr) return nullptr;
  for (const auto& [sizes, dtype] : outs) {
    PyObject* shape = PyTuple_New(Py_ssize_t(sizes.size()));
    for (size_t j = 0; shape != nullptr && j < sizes.size(); ++j) {
      PyTuple_SET_ITEM(shape, Py_ssize_t(j), PyLong_FromLongLong(sizes[j]));
    }
    PyObject* pair = shape != nullptr ? Py_BuildValue("(NO)", shape, torch::getTHPDtype(dtype)) : nullptr;
    const bool ok = pair != nullptr && PyList_Append(result, pair) == 0;
    Py_XDECREF(pair);
    if (!ok) {
      Py_DECREF(result);
      return nullptr;
    }
  }
  return result;
}

// `plan_norm_outputs(layernorm, x, gamma, beta, eps, otype, zero_centered_gamma, spec)`: the (sizes, dtype) of each
// tensor layernorm_fwd / rmsnorm_fwd return (bridge.h plan_norm_outputs); x, gamma, beta as plan_outputs' tensors
// (beta may be None), spec as plan_outputs' (qkind 0: plain output).
PyObject* plan_norm_outputs_py(PyObject* /*module*/, PyObject* args) {
  HANDLE_TH_ERRORS
  int layernorm = 0, zero_centered = 0;
  double eps = 0.0;
  long long otype = 0;
  PyObject *x_obj = nullptr, *g_obj = nullptr, *b_obj = nullptr, *spec_obj = nullptr;
  if (!PyArg_ParseTuple(args, "pO!O!OdLpO!", &layernorm, &PyTuple_Type, &x_obj, &PyTuple_Type, &g_obj, &b_obj, &eps,
                        &otype, &zero_centered, &PyTuple_Type, &spec_obj)) {
    return nullptr;
  }
  MetaTensor x, g;
  if (!meta_tensor(x_obj, x) || !meta_tensor(g_obj, g)) return nullptr;
  c10::optional<MetaTensor> b;
  if (b_obj != Py_None) {
    b.emplace();
    if (!meta_tensor(b_obj, *b)) return nullptr;
  }
  MetaSpec m;
  if (!meta_spec(spec_obj, m)) return nullptr;
  return shape_list(plan_norm_outputs(layernorm != 0, x, g, b, eps, int64_t(otype), zero_centered != 0, m));
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"plan_norm_outputs", &plan_norm_outputs_py, METH_VARARGS,
     "plan_norm_outputs(layernorm, x, gamma, beta, eps, otype, zero_centered_gamma, spec): the (sizes, dtype) of each "
     "tensor layernorm_fwd / rmsnorm_fwd return, from the core's plan (the fake kernels' shapes)."},
    {"built_with_cuda", &built_with_cuda, METH_NOARGS, "built_with_cuda(): whether this build has the CUDA kernels."},
    {"cublaslt_version", &cublaslt_version, METH_NOARGS,
     "cublaslt_version(): cublasLtGetVersion() of the loaded library (0 in a CPU-only build)."},
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&call)), METH_FASTCALL,
     "call(op, args, keep=-1): op(*args) for an OpOverload of the te library and a tuple of positional arguments, "
     "converted by the op's schema; outputs outside the `keep` bit mask may come back as None (the wrappers' eager fast "
     "path; dynamo traces the op itself)."},
    {"plan_act_calls", &plan_act_calls, METH_NOARGS,
     "plan_act_calls(): how many activation / cast plans this library's core has made (a debug counter)."},
    {"plan_outputs", &plan_outputs_py, METH_VARARGS,
     "plan_outputs(op, act, x, grad, spec): the (sizes, dtype) of each tensor the te op returns, from the core's "
     "plan of the call without a device (the fake kernels' shapes)."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

extern PyMethodDef format_methods[];  // format_table.cpp
}  // namespace te_torch

// `import transformer_engine_torch._C` loads the library (and with it the op registrations); the module holds
// `call`, the build constants, the planner's entries for the fake kernels (plan_outputs, plan_act_calls) and the
// format table's readers (format_table.cpp), so nothing but tensors, scalars, dtypes and shapes crosses into C++.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, te_torch::methods};
  PyObject* m = PyModule_Create(&module_def);
  if (m != nullptr && PyModule_AddFunctions(m, te_torch::format_methods) != 0) Py_CLEAR(m);
  return m;
}
