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

std::string arch_name(const Tensor& t) {
#if defined(TE_WITH_CUDA)
  if (t.is_cuda()) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, t.get_device()) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, t.get_device()) != cudaSuccess) {
      return t.device().str();
    }
    return "sm_" + std::to_string(major) + std::to_string(minor);
  }
#endif
  return t.device().str();
}

te::DType input_dtype(const Tensor& t, const char* op, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat: return te::DType::kFloat32;
    case at::kHalf: return te::DType::kFloat16;
    case at::kBFloat16: return te::DType::kBFloat16;
    default: break;
  }
  const std::string where = arch_name(t);
  TORCH_CHECK_TYPE(false, op, ": ", what, " must be float32, float16 or bfloat16, got ", dtype_name(t.scalar_type()),
                   " with shape ", shape_str(t), " on ", where);
  return te::DType::kFloat32;  // not reached
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

QuantSpec make_spec(const char* op, int64_t qkind, int64_t qdtype, bool rowwise, bool columnwise, int64_t qflags,
                    double amax_epsilon, int64_t block_dim, const c10::optional<Tensor>& scale,
                    const c10::optional<Tensor>& amax, const c10::optional<Tensor>& noop, const Tensor& input) {
  QuantSpec s;
  TORCH_CHECK_VALUE(qkind >= 0 && qkind <= 5, op, ": quantizer kind ", std::to_string(qkind),
                    " is not known; accepted: 0 none, 1 FP8 delayed, 2 FP8 current, 3 MXFP8, 4 NVFP4, 5 FP8 block");
  s.kind = static_cast<te::QuantKind>(qkind);
  s.dtype = static_cast<te::DType>(qdtype);
  s.rowwise = rowwise;
  s.columnwise = columnwise;
  s.flags = qflags;
  s.amax_epsilon = amax_epsilon;
  s.block_dim = block_dim;
  s.scale = scale;
  s.amax = amax;
  s.noop = noop;
  const bool fp8_codes = s.kind == te::QuantKind::kFp8Delayed || s.kind == te::QuantKind::kFp8Current ||
                         s.kind == te::QuantKind::kMxfp8 || s.kind == te::QuantKind::kFp8Block;
  if (fp8_codes) {
    TORCH_CHECK_VALUE(s.dtype == te::DType::kFloat8E4M3 || s.dtype == te::DType::kFloat8E5M2, op,
                      ": FP8 quantizer dtype must be kFloat8E4M3 (7) or kFloat8E5M2 (8), got ", std::to_string(qdtype));
    TORCH_CHECK_VALUE(rowwise || columnwise, op, ": the quantizer has neither rowwise nor columnwise usage");
  }
  if (s.kind == te::QuantKind::kNvfp4) {
    TORCH_CHECK_VALUE(s.dtype == te::DType::kFloat4E2M1, op, ": NVFP4 quantizer dtype must be kFloat4E2M1 (10), got ",
                      std::to_string(qdtype));
    TORCH_CHECK_VALUE(rowwise || columnwise, op, ": the quantizer has neither rowwise nor columnwise usage");
    TORCH_CHECK_NOT_IMPLEMENTED(!(s.two_d() && s.rht()), op, ": NVFP4 with both with_2d_quantization (16x16 tiles) "
                                "and with_rht is not provided; use 2-D tiles for weights, RHT for inputs and gradients");
  }
  if (s.kind == te::QuantKind::kMxfp8) {
    TORCH_CHECK_NOT_IMPLEMENTED(!s.two_d(), op, ": MXFP8 with_2d_quantization (32x32 tiles) is not provided; "
                                "use 1x32 / 32x1 blocks (with_2d_quantization=False)");
  }
  if (s.kind == te::QuantKind::kFp8Block) {
    TORCH_CHECK_VALUE(block_dim == 1 || block_dim == 2, op, ": Float8BlockQuantizer block_scaling_dim (spec block_dim) "
                      "must be 1 (1x128 blocks) or 2 (128x128 tiles), got ", std::to_string(block_dim));
    TORCH_CHECK_VALUE(s.two_d() == (block_dim == 2), op, ": quantizer spec flag bit1 (2-D blocks) = ",
                      s.two_d() ? "1" : "0", " disagrees with block_dim = ", std::to_string(block_dim));
    TORCH_CHECK_VALUE(amax_epsilon >= 0.0 && amax_epsilon < 3.4028234663852886e38, op, ": ", s.fp8_block_name(),
                      " amax_epsilon must be finite and >= 0, got ", std::to_string(amax_epsilon));
    constexpr int64_t kUnsupported = (1 << 2) | (1 << 3) | (1 << 4) | (1 << 5);
    TORCH_CHECK_NOT_IMPLEMENTED((qflags & kUnsupported) == 0, op, ": ", s.fp8_block_name(),
                                " supports only the force_pow_2_scales and 2-D flags (qflags bits 0, 1), got qflags=",
                                std::to_string(qflags), " (stochastic rounding, RHT and swizzled scales are NVFP4/MXFP8"
                                " features; FP8 block scales are already in the layout the GEMM reads)");
  }
  if (s.kind == te::QuantKind::kFp8Delayed) {
    TORCH_CHECK_VALUE(scale.has_value() && amax.has_value(), op, ": a delayed-scaling FP8 quantizer needs scale and amax");
    check_scalar_f32(*scale, input, op, "Float8Quantizer.scale");
    check_scalar_f32(*amax, input, op, "Float8Quantizer.amax");
  }
  if (s.kind == te::QuantKind::kFp8Current && amax.has_value()) check_scalar_f32(*amax, input, op, "amax");
  if (noop.has_value()) check_scalar_f32(*noop, input, op, "noop");
  return s;
}

te::FusionPath choose_fusion_path(const QuantSpec& spec) {
  constexpr int64_t kRhtFlag = 1 << 3;
  switch (spec.kind) {
    case te::QuantKind::kNone:
    case te::QuantKind::kFp8Delayed:
    case te::QuantKind::kMxfp8: return te::FusionPath::kFullyFused;
    case te::QuantKind::kFp8Current: return te::FusionPath::kFusedActivationAmaxFp8;
    case te::QuantKind::kNvfp4:
      return (spec.flags & kRhtFlag) ? te::FusionPath::kUnfused : te::FusionPath::kFusedActivationAmaxNvfp4;
    case te::QuantKind::kFp8Block: return te::FusionPath::kUnfused;
  }
  return te::FusionPath::kUnfused;
}

namespace {
// The CPU kernels' parallel loop: ATen's thread pool.
void cpu_parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body) {
  at::parallel_for(0, n, 1, [&](int64_t b, int64_t e) { body(b, e); });
}
}  // namespace

void run_activation(te::ActKind kind, bool backward, te::DType dtype, const te::ActKernelParams& p,
                    const Tensor& ref) {
  if (ref.is_cuda()) {
#if defined(TE_WITH_CUDA)
    te::activation_cuda(kind, backward, dtype, p, current_stream());
#else
    TORCH_CHECK(false, "transformer_engine_torch was built without CUDA; CUDA tensors are not supported");
#endif
  } else {
    te::activation_cpu(kind, backward, dtype, p, cpu_parallel_for);
  }
}

void run_mxfp8(te::ActKind kind, bool backward, te::DType dtype, const te::Mxfp8Params& p, const Tensor& ref) {
  if (ref.is_cuda()) {
#if defined(TE_WITH_CUDA)
    te::quantize_mxfp8_cuda(kind, backward, dtype, p, current_stream());
#else
    TORCH_CHECK(false, "transformer_engine_torch was built without CUDA; CUDA tensors are not supported");
#endif
  } else {
    te::quantize_mxfp8_cpu(kind, backward, dtype, p, cpu_parallel_for);
  }
}

void run_fp8_block(te::DType dtype, const te::Fp8BlockParams& p, const Tensor& ref) {
  if (ref.is_cuda()) {
#if defined(TE_WITH_CUDA)
    te::quantize_fp8_block_cuda(dtype, p, current_stream());
#else
    TORCH_CHECK(false, "transformer_engine_torch was built without CUDA; CUDA tensors are not supported");
#endif
  } else {
    te::quantize_fp8_block_cpu(dtype, p, cpu_parallel_for);
  }
}

void run_nvfp4_amax(te::DType dtype, const te::Nvfp4AmaxParams& p, const Tensor& ref) {
  if (ref.is_cuda()) {
#if defined(TE_WITH_CUDA)
    te::nvfp4_amax_cuda(dtype, p, current_stream());
#else
    TORCH_CHECK(false, "transformer_engine_torch was built without CUDA; CUDA tensors are not supported");
#endif
  } else {
    te::nvfp4_amax_cpu(dtype, p, cpu_parallel_for);
  }
}

void run_nvfp4(te::DType dtype, const te::Nvfp4Params& p, const Tensor& ref) {
  if (ref.is_cuda()) {
#if defined(TE_WITH_CUDA)
    te::quantize_nvfp4_cuda(dtype, p, current_stream());
#else
    TORCH_CHECK(false, "transformer_engine_torch was built without CUDA; CUDA tensors are not supported");
#endif
  } else {
    te::quantize_nvfp4_cpu(dtype, p, cpu_parallel_for);
  }
}

te::RngState nvfp4_rng_state(const QuantSpec& spec, const Tensor& ref) {
  te::RngState s;
  if (spec.rng_seed >= 0) {
    s.seed = uint64_t(spec.rng_seed);
    s.offset = uint64_t(spec.rng_offset);
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

void zero_floats(const Tensor& t) {
#if defined(TE_WITH_CUDA)
  if (t.is_cuda()) {
    const cudaError_t e = cudaMemsetAsync(t.data_ptr(), 0, sizeof(float) * size_t(t.numel()), current_stream());
    TORCH_CHECK(e == cudaSuccess, "zeroing an amax buffer failed: ", cudaGetErrorString(e));
    return;
  }
#endif
  float* d = t.data_ptr<float>();
  for (int64_t i = 0; i < t.numel(); ++i) d[i] = 0.0f;
}

void zero_scalar(const Tensor& t) {
#if defined(TE_WITH_CUDA)
  if (t.is_cuda()) {
    const cudaError_t e = cudaMemsetAsync(t.data_ptr(), 0, sizeof(float), current_stream());
    TORCH_CHECK(e == cudaSuccess, "zeroing an amax buffer failed: ", cudaGetErrorString(e));
    return;
  }
#endif
  // A host store: zero_() would cost a trip through the dispatcher for one float.
  *t.data_ptr<float>() = 0.0f;
}

void run_dbias_reduce(const Tensor& partial, Tensor& out) {
  const te::DType dt = input_dtype(out, "dbias", "grad_bias");
  if (out.is_cuda()) {
#if defined(TE_WITH_CUDA)
    te::dbias_reduce_cuda(partial.data_ptr<float>(), partial.size(0), partial.size(1), dt, out.data_ptr(),
                          current_stream());
#endif
  } else {
    te::dbias_reduce_cpu(partial.data_ptr<float>(), partial.size(0), partial.size(1), dt, out.data_ptr());
  }
}

}  // namespace te_torch
