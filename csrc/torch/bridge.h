// Torch <-> core bridge helpers: dtype mapping, the quantizer spec that crosses the op boundary (SPEC §1.4),
// argument checks that name shapes/dtypes/devices, and the CPU/CUDA launch of core kernels on the current
// stream. Only this folder includes torch headers.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "../core/act/activation.h"
#include "../core/fp8_block/quantize_fp8_block.h"
#include "../core/mxfp8/quantize_mxfp8.h"
#include "../core/nvfp4/quantize_nvfp4.h"

#if defined(TE_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

// Registers one op file's kernels for CPU and, in a CUDA build, for CUDA (the same functions serve both: the core
// launch helpers below pick the device from the tensors). `register_fn(torch::Library& m)` lists the file's ops once;
// TE_IMPL_CPU_AND_CUDA(register_fn) at namespace scope replaces the twin TORCH_LIBRARY_IMPL blocks.
#if defined(TE_WITH_CUDA)
#define TE_IMPL_CPU_AND_CUDA(register_fn)                   \
  TORCH_LIBRARY_IMPL(te, CPU, m) { register_fn(m); }        \
  TORCH_LIBRARY_IMPL(te, CUDA, m) { register_fn(m); }
#else
#define TE_IMPL_CPU_AND_CUDA(register_fn) TORCH_LIBRARY_IMPL(te, CPU, m) { register_fn(m); }
#endif

namespace te_torch {

using at::Tensor;

std::string shape_str(const Tensor& t);
std::string shape_str(c10::IntArrayRef sizes);
std::string dtype_name(at::ScalarType s);
std::string arch_name(const Tensor& t);  // "cpu" or "sm_90"

// float32/float16/bfloat16 -> core DType; anything else raises TypeError naming `what` and `op`.
te::DType input_dtype(const Tensor& t, const char* op, const char* what);
at::ScalarType scalar_type_of(te::DType d);

// The quantizer spec of SPEC §1.4.
struct QuantSpec {
  te::QuantKind kind = te::QuantKind::kNone;
  te::DType dtype = te::DType::kFloat8E4M3;
  bool rowwise = true;
  bool columnwise = true;
  int64_t flags = 0;
  double amax_epsilon = 0.0;
  int64_t block_dim = 1;
  c10::optional<Tensor> scale, amax, noop;
  // NVFP4 stochastic rounding: an explicit (seed, offset) when rng_seed >= 0 (the `quantize` op's trailing
  // arguments: reproducible across devices), else drawn from the input device's default generator.
  int64_t rng_seed = -1, rng_offset = 0;

  bool force_pow2() const { return flags & 1; }
  bool two_d() const { return flags & (1 << 1); }
  bool stochastic_rounding() const { return flags & (1 << 2); }
  bool rht() const { return flags & (1 << 3); }
  bool random_sign_mask() const { return flags & (1 << 4); }
  bool swizzled() const { return flags & (1 << 5); }
  bool e4m3() const { return dtype == te::DType::kFloat8E4M3; }
  // "FP8 block 1x128 E4M3" / "FP8 block 128x128 E5M2": the format as error messages name it.
  std::string fp8_block_name() const {
    return std::string(block_dim == 2 ? "FP8 block 128x128 " : "FP8 block 1x128 ") + (e4m3() ? "E4M3" : "E5M2");
  }
};

QuantSpec make_spec(const char* op, int64_t qkind, int64_t qdtype, bool rowwise, bool columnwise, int64_t qflags,
                    double amax_epsilon, int64_t block_dim, const c10::optional<Tensor>& scale,
                    const c10::optional<Tensor>& amax, const c10::optional<Tensor>& noop, const Tensor& input);

// SPEC §5.1: the one place the fusion path is decided, for forward and backward alike.
te::FusionPath choose_fusion_path(const QuantSpec& spec);

// Checks that `t` is a one-element float32 tensor on `ref`'s device.
void check_scalar_f32(const Tensor& t, const Tensor& ref, const char* op, const char* what);

// Launches on the current stream of `ref`'s device (or the CPU thread pool).
void run_activation(te::ActKind kind, bool backward, te::DType dtype, const te::ActKernelParams& p, const Tensor& ref);
void run_mxfp8(te::ActKind kind, bool backward, te::DType dtype, const te::Mxfp8Params& p, const Tensor& ref);
void run_fp8_block(te::DType dtype, const te::Fp8BlockParams& p, const Tensor& ref);
void run_nvfp4_amax(te::DType dtype, const te::Nvfp4AmaxParams& p, const Tensor& ref);
void run_nvfp4(te::DType dtype, const te::Nvfp4Params& p, const Tensor& ref);
// The random-bit source of an NVFP4 stochastic-rounding launch on `ref`'s device (SPEC §1.4): the explicit seed of
// the spec, else the device's default generator (CUDA: its Philox (seed, offset), advanced per call and graph-safe
// under capture; CPU: a fresh 64-bit seed drawn from the CPU generator, offset 0).
te::RngState nvfp4_rng_state(const QuantSpec& spec, const Tensor& ref);
void run_dbias_reduce(const Tensor& partial, Tensor& out);
// Uninitialised contiguous tensor on the device of `options`, straight from that device's allocator (torch's
// caching allocator on CUDA): at::empty adds a dispatcher round trip (about 65 ns on a fast host), and a quantizing
// op makes up to seven tensors, the 0-element ones it returns for absent pieces included.
Tensor new_empty(c10::IntArrayRef shape, const at::TensorOptions& options);
// new_empty for a caller that holds a device guard for options' device (CUDA: no guard of its own).
Tensor new_empty_in_guard(c10::IntArrayRef shape, const at::TensorOptions& options);
// A 0-element tensor of `dtype` on ref's device, made without any CUDA call (the absent pieces of a quantizing op).
Tensor new_placeholder(const Tensor& ref, at::ScalarType dtype);
// Zeroes a one-element float32 tensor: a 4-byte memset on the current stream for CUDA (cheaper to issue than a
// fill kernel, capturable), a plain store on the CPU.
void zero_scalar(const Tensor& t);
// Zeroes a small contiguous float32 tensor the same way.
void zero_floats(const Tensor& t);

#if defined(TE_WITH_CUDA)
inline cudaStream_t current_stream() { return at::cuda::getCurrentCUDAStream(); }
#endif

}  // namespace te_torch
