// `_C.format_table()`, `_C.format_scale_shapes`, `_C.format_data_shapes`, `_C.format_decode`: the core's format
// table (csrc/core/formats/table.h) for transformer_engine_torch.formats.table, which reads it once at import (the
// quantizers then evaluate its shape rules in Python, where dynamo traces them). Plain Python objects only.
#include <Python.h>

#include <torch/csrc/Exceptions.h>

#include "../core/formats/table.h"

#include <stdexcept>
#include <string>

namespace te_torch {
namespace {

// The core's refusals (std::invalid_argument: a bad format id, wrong buffer sizes) as ValueError, as `_ffi` raises.
#define TE_VALUE_ERRORS_BEGIN try {
#define TE_VALUE_ERRORS_END                          \
  }                                                  \
  catch (const std::invalid_argument& e) {           \
    PyErr_SetString(PyExc_ValueError, e.what());     \
    return nullptr;                                  \
  }

PyObject* copy_dict(const te::CopyRule& c) {
  if (!c.present) Py_RETURN_NONE;
  const te::ScaleDim& a = c.scale[0];
  const te::ScaleDim& b = c.scale[1];
  return Py_BuildValue("{s:N,s:N,s:(ii),s:i,s:((iiiN)(iiiN))}", "transposed", PyBool_FromLong(c.transposed), "flat2d",
                       PyBool_FromLong(c.flat2d), "block", c.block_rows, c.block_cols, "scale_rank", c.scale_rank,
                       "scale", a.src, a.block, a.pad, PyBool_FromLong(a.exact), b.src, b.block, b.pad,
                       PyBool_FromLong(b.exact));
}

PyObject* int_tuple(const std::vector<int>& v) {
  PyObject* t = PyTuple_New(Py_ssize_t(v.size()));
  for (size_t i = 0; t != nullptr && i < v.size(); ++i) PyTuple_SET_ITEM(t, Py_ssize_t(i), PyLong_FromLong(v[i]));
  return t;
}

PyObject* format_table(PyObject* /*module*/, PyObject* /*unused*/) {
  HANDLE_TH_ERRORS
  PyObject* rows = PyTuple_New(te::kFormatCount);
  for (int f = 0; rows != nullptr && f < te::kFormatCount; ++f) {
    const te::FormatInfo& r = te::format_info(te::Format(f));
    std::vector<int> elems, kinds;
    for (te::DType d : r.elem_types) elems.push_back(int(d));
    for (te::QuantKind k : r.kinds) kinds.push_back(int(k));
    PyObject* row = Py_BuildValue("{s:i,s:s,s:N,s:i,s:i,s:N,s:N,s:i,s:i,s:N,s:N}", "id", f, "name", r.name,
                                  "elem_types", int_tuple(elems), "scale_type", int(r.scale_type), "decode",
                                  int(r.decode), "global_amax", PyBool_FromLong(r.global_amax), "kinds",
                                  int_tuple(kinds), "block_dim", r.block_dim, "elems_per_byte", r.rule.elems_per_byte,
                                  "row", copy_dict(r.rule.row), "col", copy_dict(r.rule.col));
    if (row == nullptr) {
      Py_DECREF(rows);
      return nullptr;
    }
    PyTuple_SET_ITEM(rows, f, row);
  }
  return rows;
  END_HANDLE_TH_ERRORS
}

// (rowwise, columnwise) of `fn`'s shapes of an [rows, cols] tensor of format `fmt`.
template <te::CopyShapes (*fn)(te::Format, int64_t, int64_t)>
PyObject* shapes(PyObject* /*module*/, PyObject* args) {
  HANDLE_TH_ERRORS
  int fmt = 0;
  long long rows = 0, cols = 0;
  if (!PyArg_ParseTuple(args, "iLL", &fmt, &rows, &cols)) return nullptr;
  TE_VALUE_ERRORS_BEGIN
  const te::CopyShapes s = fn(te::format_of(fmt), rows, cols);
  return Py_BuildValue("((LL)(LL))", (long long)s.row.r, (long long)s.row.c, (long long)s.col.r, (long long)s.col.c);
  TE_VALUE_ERRORS_END
  END_HANDLE_TH_ERRORS
}

PyObject* format_decode(PyObject* /*module*/, PyObject* args) {
  HANDLE_TH_ERRORS
  int fmt = 0, columnwise = 0, code_type = 0;
  Py_buffer codes, scales;
  float amax = 0.0f;
  long long rows = 0, cols = 0;
  if (!PyArg_ParseTuple(args, "ipiy*y*fLL", &fmt, &columnwise, &code_type, &codes, &scales, &amax, &rows, &cols)) {
    return nullptr;
  }
  std::vector<float> out;
  std::string refused;
  try {
    out = te::format_decode(te::format_of(fmt), columnwise != 0, te::DType(code_type),
                            static_cast<const uint8_t*>(codes.buf), size_t(codes.len),
                            static_cast<const uint8_t*>(scales.buf), size_t(scales.len), amax, rows, cols);
  } catch (const std::invalid_argument& e) {
    refused = e.what();
  }
  PyBuffer_Release(&codes);
  PyBuffer_Release(&scales);
  if (!refused.empty()) {
    PyErr_SetString(PyExc_ValueError, refused.c_str());
    return nullptr;
  }
  return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(out.data()), Py_ssize_t(out.size() * sizeof(float)));
  END_HANDLE_TH_ERRORS
}

}  // namespace

PyMethodDef format_methods[] = {
    {"format_table", &format_table, METH_NOARGS,
     "format_table(): the core's format table, one dict per format id (csrc/core/formats/table.h)."},
    {"format_scale_shapes", &shapes<&te::format_scale_shapes>, METH_VARARGS,
     "format_scale_shapes(fmt, rows, cols): ((r, c), (r, c)) padded scale matrices of the two copies."},
    {"format_data_shapes", &shapes<&te::format_data_shapes>, METH_VARARGS,
     "format_data_shapes(fmt, rows, cols): ((r, c), (r, c)) stored 2-D data matrices (bytes) of the two copies."},
    {"format_decode", &format_decode, METH_VARARGS,
     "format_decode(fmt, columnwise, code_type, codes, scales, amax, rows, cols): float32 bytes of one stored copy, "
     "decoded on the host (compact scales)."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace te_torch
