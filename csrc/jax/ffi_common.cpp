// XLA buffers and contexts as the core sees them (ffi_common.h).
#include "ffi_common.h"

#include <functional>
#include <mutex>
#include <unordered_set>

namespace te_jax {

bool core_dtype(ffi::DataType t, te::DType* out) {
  switch (t) {
    case ffi::DataType::F32: *out = te::DType::kFloat32; return true;
    case ffi::DataType::F16: *out = te::DType::kFloat16; return true;
    case ffi::DataType::BF16: *out = te::DType::kBFloat16; return true;
    case ffi::DataType::U8: *out = te::DType::kByte; return true;
    case ffi::DataType::S32: *out = te::DType::kInt32; return true;
    case ffi::DataType::S64: *out = te::DType::kInt64; return true;
    case ffi::DataType::F8E4M3FN: *out = te::DType::kFloat8E4M3; return true;
    case ffi::DataType::F8E5M2: *out = te::DType::kFloat8E5M2; return true;
    default: return false;
  }
}

std::string ffi_dtype_name(ffi::DataType t) { return "XLA element type " + std::to_string(int(t)); }

te::ops::TensorView view_of(const ffi::AnyBuffer& b, const char* op, const char* what, int dims_to_merge) {
  te::ops::TensorView v;
  if (!core_dtype(b.element_type(), &v.dtype)) {
    te::fail(te::ErrorKind::kType, std::string(op) + ": " + what + " has " + ffi_dtype_name(b.element_type()) +
                                       ", which the kernels do not take; pass float32, float16 or bfloat16");
  }
  const auto dims = b.dimensions();
  const int64_t nd = int64_t(dims.size()) - (dims_to_merge - 1);
  if (nd > te::ops::kMaxDims) {
    te::fail(te::ErrorKind::kValue, std::string(op) + ": " + what + " has " + std::to_string(dims.size()) +
                                        " dims; at most " + std::to_string(te::ops::kMaxDims) + " are supported");
  }
  v.data = b.untyped_data();
  v.shape.ndim = int(nd);
  for (int64_t i = 0; i < nd; ++i) v.shape.dims[i] = dims[i];
  for (int64_t i = nd; i < int64_t(dims.size()); ++i) v.shape.dims[nd - 1] *= dims[i];
  return v;
}

namespace {
// XLA runs a CPU custom call on one of its own threads: the kernels loop serially here. Their results do not depend
// on how a loop is split (fixed dbias row blocks, max-reduced amaxes), so the bytes equal the torch frontend's.
void serial_for(int64_t n, const std::function<void(int64_t, int64_t)>& body) {
  if (n > 0) body(0, n);
}
const te::ParallelFor kSerialFor = serial_for;
}  // namespace

te::ops::ExecCtx cpu_ctx() {
  te::ops::ExecCtx ctx;
  ctx.parallel_for = &kSerialFor;
  ctx.arch = "cpu";
  return ctx;
}

#if defined(TE_WITH_CUDA)
void InitKey::add(const ffi::AnyBuffer& b) {
  const int64_t type = int64_t(b.element_type());
  append(&type, sizeof type);
  const auto dims = b.dimensions();
  const int64_t rank = int64_t(dims.size());
  append(&rank, sizeof rank);
  for (const int64_t d : dims) append(&d, sizeof d);
  const uint8_t align = uint8_t(reinterpret_cast<uintptr_t>(b.untyped_data()) & 0xFFu);  // 256 B covers every
  append(&align, 1);                                                                      // vector width
}

namespace {
std::mutex init_mu;  // XLA may initialize several devices' programs from several threads
std::unordered_set<std::string> init_seen;
std::string with_device(const std::string& bytes, int device) {
  return bytes + std::string(reinterpret_cast<const char*>(&device), sizeof device);
}
}  // namespace

bool InitKey::known(int device) const {
  const std::string k = with_device(bytes_, device);
  std::lock_guard<std::mutex> lock(init_mu);
  return init_seen.count(k) != 0;
}

void InitKey::remember(int device) const {
  std::string k = with_device(bytes_, device);
  std::lock_guard<std::mutex> lock(init_mu);
  init_seen.insert(std::move(k));
}

te::ops::ExecCtx cuda_ctx(cudaStream_t stream) {
  te::ops::ExecCtx ctx;
  ctx.cuda = true;
  int device = 0;
  cudaGetDevice(&device);  // XLA makes the executing device current before a thunk runs
  ctx.device_index = device;
  ctx.stream = reinterpret_cast<CUstream_st*>(stream);
  return ctx;
}
#endif

}  // namespace te_jax
