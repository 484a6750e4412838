// Definitions of the bridge helpers declared in bridge.h.
#include "bridge.h"

#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#if defined(TE_WITH_CUDA)
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/EmptyTensor.h>
#endif


namespace te_torch {

// Integers in messages go through std::to_string, never through an ostream: the GPU machine's toolchain
// (its own g++ next to torch's libstdc++) crashed formatting integers via std::num_put.
std::string shape_str(c10::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}
std::string shape_str(const Tensor& t) { return shape_str(t.sizes()); }

std::string dtype_name(at::ScalarType s) { return c10::toString(s); }

std::string arch_name(c10::Device device) {
  te::ops::ExecCtx ctx;
  ctx.cuda = device.is_cuda();
  ctx.device_index = device.is_cuda() ? device.index() : -1;
  return te::ops::arch_name(ctx);
}
std::string arch_name(const Tensor& t) { return arch_name(t.device()); }

te::DType input_dtype(at::ScalarType s, c10::IntArrayRef sizes, c10::Device device, const char* op,
                      const char* what) {
  switch (s) {
    case at::kFloat: return te::DType::kFloat32;
    case at::kHalf: return te::DType::kFloat16;
    case at::kBFloat16: return te::DType::kBFloat16;
    default: break;
  }
  const std::string where = arch_name(device);
  TORCH_CHECK_TYPE(false, op, ": ", what, " must be float32, float16 or bfloat16, got ", dtype_name(s),
                   " with shape ", shape_str(sizes), " on ", where);
  return te::DType::kFloat32;  // not reached
}
te::DType input_dtype(const Tensor& t, const char* op, const char* what) {
  return input_dtype(t.scalar_type(), t.sizes(), t.device(), op, what);
}

// A torch tensor's element type as the core's DType (the core checks it against the argument's role); a type the core
// has no code for raises TypeError here.
te::DType storage_dtype(const Tensor& t, const char* what, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat: return te::DType::kFloat32;
    case at::kHalf: return te::DType::kFloat16;
    case at::kBFloat16: return te::DType::kBFloat16;
    case at::kByte: return te::DType::kByte;
    case at::kShort: return te::DType::kInt16;
    case at::kInt: return te::DType::kInt32;
    case at::kLong: return te::DType::kInt64;
    case at::kFloat8_e4m3fn: return te::DType::kFloat8E4M3;
    case at::kFloat8_e5m2: return te::DType::kFloat8E5M2;
    default: break;
  }
  TORCH_CHECK_TYPE(false, op, ": ", what, " has dtype ", dtype_name(t.scalar_type()), " with shape ", shape_str(t),
                   ", which no GEMM argument takes");
  return te::DType::kByte;  // not reached
}

at::ScalarType scalar_type_of(te::DType d) {
  switch (d) {
    case te::DType::kFloat32: return at::kFloat;
    case te::DType::kFloat16: return at::kHalf;
    case te::DType::kBFloat16: return at::kBFloat16;
    case te::DType::kByte: return at::kByte;
    case te::DType::kInt32: return at::kInt;
    default: break;
  }
  TORCH_CHECK_VALUE(false, "DType ", std::to_string(int(d)), " has no plain torch dtype for this output");
  return at::kFloat;  // not reached
}

void check_scalar_f32(const Tensor& t, const Tensor& ref, const char* op, const char* what) {
  TORCH_CHECK_VALUE(t.scalar_type() == at::kFloat && t.numel() == 1, op, ": ", what,
                    " must be a one-element float32 tensor, got ", dtype_name(t.scalar_type()), " with shape ",
                    shape_str(t));
  TORCH_CHECK_VALUE(t.device() == ref.device(), op, ": ", what, " is on ", t.device().str(),
                    " but the input is on ", ref.device().str(), "; keep the quantizer's tensors on the input's device");
}

namespace {
// The CPU kernels' parallel loop: ATen's thread pool.
void cpu_parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body) {
  at::parallel_for(0, n, 1, [&](int64_t b, int64_t e) { body(b, e); });
}
const te::ParallelFor kCpuParallelFor = cpu_parallel_for;
}  // namespace

te::ops::ExecCtx exec_ctx(const Tensor& ref) {
  te::ops::ExecCtx ctx;
  ctx.parallel_for = &kCpuParallelFor;
  ctx.cuda = ref.is_cuda();
  if (ctx.cuda) {
    ctx.device_index = ref.get_device();
#if defined(TE_WITH_CUDA)
    ctx.stream = current_stream();
#endif
  }
  return ctx;
}

te::ops::Shape shape_of(c10::IntArrayRef sizes, c10::Device device, const char* op) {
  const int64_t nd = int64_t(sizes.size());
  TORCH_CHECK_VALUE(nd <= te::ops::kMaxDims, op, ": tensors of at most ", std::to_string(te::ops::kMaxDims),
                    " dims are supported, got ", shape_str(sizes), " on ", device.str(), "; flatten leading dims");
  te::ops::Shape s;
  s.ndim = int(nd);
  for (int64_t i = 0; i < nd; ++i) s.dims[i] = sizes[i];
  return s;
}

te::ops::TensorView view_of(const Tensor& t, te::DType dtype, const char* op) {
  te::ops::TensorView v;
  v.shape = shape_of(t.sizes(), t.device(), op);
  v.data = t.data_ptr();
  v.dtype = dtype;
  return v;
}

void throw_torch(const te::Error& e) {
  switch (e.kind) {
    case te::ErrorKind::kValue: TORCH_CHECK_VALUE(false, e.what()); break;
    case te::ErrorKind::kType: TORCH_CHECK_TYPE(false, e.what()); break;
    case te::ErrorKind::kNotImplemented: TORCH_CHECK_NOT_IMPLEMENTED(false, e.what()); break;
    case te::ErrorKind::kRuntime: break;
  }
  TORCH_CHECK(false, e.what());
}

te::RngState nvfp4_rng_state(int64_t rng_seed, int64_t rng_offset, const Tensor& ref) {
  te::RngState s;
  if (rng_seed >= 0) {
    s.seed = uint64_t(rng_seed);
    s.offset = uint64_t(rng_offset);
    return s;
  }
  if (ref.is_cuda()) {
#if defined(TE_WITH_CUDA)
    at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(ref.get_device());
    std::lock_guard<std::mutex> lock(gen.mutex());
    // One Philox counter block per 16 elements, keyed by (seed, offset) and indexed by the block: the offset only
    // has to be distinct per call, so the smallest increment torch allows is enough.
    const at::PhiloxCudaState st = gen.get<at::CUDAGeneratorImpl>()->philox_cuda_state(4);
    if (st.captured_) {
      s.seed_ptr = st.seed_.ptr;
      s.offset_ptr = st.offset_.ptr;
      s.offset = st.offset_intragraph_;
    } else {
      s.seed = st.seed_.val;
      s.offset = st.offset_.val;
    }
#endif
    return s;
  }
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  s.seed = gen.get<at::CPUGeneratorImpl>()->random64();
  s.offset = 0;
  return s;
}

Tensor new_empty(c10::IntArrayRef shape, const at::TensorOptions& options) {
#if defined(TE_WITH_CUDA)
  if (options.device().is_cuda()) return Tensor(at::detail::empty_cuda(shape, options));
#endif
  return Tensor(at::detail::empty_cpu(shape, options));
}

Tensor new_empty_in_guard(c10::IntArrayRef shape, const at::TensorOptions& options) {
#if defined(TE_WITH_CUDA)
  if (options.device().is_cuda()) {
    // empty_cuda's own device guard (a get and a set of the current device) would repeat the caller's.
    constexpr c10::DispatchKeySet kCuda(c10::DispatchKey::CUDA);
    return Tensor(at::detail::empty_generic(shape, at::cuda::getCUDADeviceAllocator(), kCuda,
                                            c10::typeMetaToScalarType(options.dtype()), c10::nullopt));
  }
#endif
  return new_empty(shape, options);
}

Tensor new_placeholder(const Tensor& ref, at::ScalarType dtype) {
#if defined(TE_WITH_CUDA)
  if (ref.is_cuda()) {
    // What empty_cuda makes of zero elements (a null data pointer on ref's device, the caching allocator for any
    // later resize), without the device guard and the allocator call it makes on the way.
    c10::Storage storage(c10::Storage::use_byte_size_t(), 0, c10::DataPtr(nullptr, ref.device()),
                         at::cuda::getCUDADeviceAllocator(), /*resizable=*/true);
    Tensor t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CUDA),
                                                        c10::scalarTypeToTypeMeta(dtype));
    t.unsafeGetTensorImpl()->set_sizes_contiguous({0});
    return t;
  }
#endif
  return new_empty({0}, ref.options().dtype(dtype));
}

}  // namespace te_torch
