// Torch <-> core bridge helpers: dtype mapping, tensors as the core's views and the core's execution context
// (current stream or CPU pool), the core's errors as torch's, argument checks that name shapes/dtypes/devices, and
// output allocation. Only this folder includes torch headers.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "../core/producers/activation.h"
#include "../core/ops/plan.h"

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

// Makes `t`'s device current for the rest of the scope (CUDA tensors; nothing for CPU ones or in a CPU-only build).
#if defined(TE_WITH_CUDA)
#define TE_DEVICE_GUARD(t) \
  const c10::cuda::OptionalCUDAGuard guard((t).is_cuda() ? c10::optional<c10::Device>((t).device()) : c10::nullopt)
#else
#define TE_DEVICE_GUARD(t) (void)0
#endif

namespace te_torch {

using at::Tensor;

std::string shape_str(const Tensor& t);
std::string shape_str(c10::IntArrayRef sizes);
std::string dtype_name(at::ScalarType s);
std::string arch_name(const Tensor& t);  // "cpu" or "sm_90"
std::string arch_name(c10::Device device);

// float32/float16/bfloat16 -> core DType; anything else raises TypeError naming `what` and `op`. The second form
// takes a tensor's dtype, sizes and device alone (the fake kernels' planner, which has no tensor).
te::DType input_dtype(const Tensor& t, const char* op, const char* what);
te::DType input_dtype(at::ScalarType s, c10::IntArrayRef sizes, c10::Device device, const char* op, const char* what);
at::ScalarType scalar_type_of(te::DType d);
// A tensor's element type as the core's DType (FP8 dtypes included, uint8 as kByte); a type no GEMM argument takes
// raises TypeError naming `what` and `op`. The core then checks it against the argument's role.
te::DType storage_dtype(const Tensor& t, const char* what, const char* op);

// The core's dispatch context for work on `ref`'s device: the current CUDA stream of that device, or ATen's CPU
// thread pool. The arch name is left to the core, which derives it only when a message needs it.
te::ops::ExecCtx exec_ctx(const Tensor& ref);
// A contiguous tensor as the core's view (dtype: its core DType, which the caller has checked). More than
// te::ops::kMaxDims dims raises ValueError naming `op`.
te::ops::TensorView view_of(const Tensor& t, te::DType dtype, const char* op);
// The sizes of a tensor on `device` as the core's shape (view_of's shape; the same check and message).
te::ops::Shape shape_of(c10::IntArrayRef sizes, c10::Device device, const char* op);
// Raises the core's typed error as the Python exception of its kind (ValueError, TypeError, NotImplementedError,
// RuntimeError), with the core's message unchanged.
[[noreturn]] void throw_torch(const te::Error& e);
// Runs f(), turning a te::Error into the matching torch error. The try costs nothing on the success path.
template <typename F> auto with_torch_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const te::Error& e) {
    throw_torch(e);
  }
}

// Checks that `t` is a one-element float32 tensor on `ref`'s device.
void check_scalar_f32(const Tensor& t, const Tensor& ref, const char* op, const char* what);

// The random-bit source of an NVFP4 stochastic-rounding launch on `ref`'s device (SPEC §1.4): an explicit
// (seed, offset) when rng_seed >= 0 (the `quantize` op's trailing arguments: the same bytes on every device), else
// the device's default generator (CUDA: its Philox (seed, offset), advanced per call and graph-safe under capture;
// CPU: a fresh 64-bit seed drawn from the CPU generator, offset 0).
te::RngState nvfp4_rng_state(int64_t rng_seed, int64_t rng_offset, const Tensor& ref);
// Uninitialised contiguous tensor on the device of `options`, straight from that device's allocator (torch's
// caching allocator on CUDA): at::empty adds a dispatcher round trip (about 65 ns on a fast host), and a quantizing
// op makes up to seven tensors, the 0-element ones it returns for absent pieces included.
Tensor new_empty(c10::IntArrayRef shape, const at::TensorOptions& options);
// new_empty for a caller that holds a device guard for options' device (CUDA: no guard of its own).
Tensor new_empty_in_guard(c10::IntArrayRef shape, const at::TensorOptions& options);
// A 0-element tensor of `dtype` on ref's device, made without any CUDA call (the absent pieces of a quantizing op).
Tensor new_placeholder(const Tensor& ref, at::ScalarType dtype);

// The outputs of one call of the activation / cast family as the core plans it, without a device or any data: the
// fake kernels' shapes (transformer_engine_torch/_ops.py through `_C.plan_outputs`), made by the same request
// building, checks and planner as the eager op (activation.cpp), so the tree has one set of shape rules.
struct MetaTensor {
  std::vector<int64_t> sizes;
  at::ScalarType dtype = at::kFloat;
  c10::Device device = c10::Device(c10::kCPU);
};
struct MetaSpec {  // the quantizer spec arguments of SPEC §1.4, its tensors as present / absent
  int64_t qkind = 0, qdtype = 0;
  bool rowwise = true, columnwise = true;
  int64_t qflags = 0;
  double amax_epsilon = 0.0;
  int64_t block_dim = 1;
  bool has_scale = false, has_amax = false;
};
// The op's returned tensors in order, as (sizes, dtype); `op` is a te op of the family that returns tensors (act,
// dact, act_quantize, dact_quantize, dbias_dact, quantize, bgrad_quantize). `spec` is required for the quantizing
// ops; `grad` for the backward ones.
std::vector<std::pair<std::vector<int64_t>, at::ScalarType>> plan_outputs(const std::string& op, int64_t act,
                                                                          const MetaTensor& x,
                                                                          const c10::optional<MetaTensor>& grad,
                                                                          const c10::optional<MetaSpec>& spec);

// The quantizer spec arguments of a quantizing op's schema (SPEC §1.4), as C++ parameters and as make_spec's
// arguments.
#define TE_QSPEC_PARAMS                                                                                      \
  int64_t qkind, int64_t qdtype, bool rowwise, bool columnwise, int64_t qflags, double amax_epsilon,         \
      int64_t block_dim, const c10::optional<Tensor>&scale, const c10::optional<Tensor>&amax,                \
      const c10::optional<Tensor>&noop
#define TE_QSPEC_ARGS(op, input) \
  make_spec(op, qkind, qdtype, rowwise, columnwise, qflags, amax_epsilon, block_dim, scale, amax, noop, input)

// The core's checked spec of a quantizing op's arguments, then the checks of its tensors (one-element float32 on
// the input's device) and their pointers (activation.cpp).
te::ops::QuantSpec make_spec(const char* op, TE_QSPEC_PARAMS, const Tensor& input);
// The dtype of the 0-element tensor a quantizing op returns for a piece its plan leaves out (activation.cpp).
at::ScalarType absent_dtype(te::ops::Piece p, te::QuantKind kind);
c10::IntArrayRef sizes_of(const te::ops::Shape& s);
// A piece as the plan lays it out (room for scratch after its elements kept, its planned shape shown).
Tensor alloc_piece(const te::ops::PiecePlan& pc, const at::TensorOptions& options);

// The outputs of layernorm_fwd / rmsnorm_fwd as the core plans the call (normalization.cpp): the six quantized
// pieces, mu (a 0-element placeholder for RMSNorm) and rsigma; the fake kernels' shapes. spec.qkind 0: plain output.
std::vector<std::pair<std::vector<int64_t>, at::ScalarType>> plan_norm_outputs(
    bool layernorm, const MetaTensor& x, const MetaTensor& gamma, const c10::optional<MetaTensor>& beta, double eps,
    int64_t otype, bool zero_centered_gamma, const MetaSpec& spec);

#if defined(TE_WITH_CUDA)
inline cudaStream_t current_stream() { return at::cuda::getCurrentCUDAStream(); }
#endif

}  // namespace te_torch
