// The XLA side of the bridge: XLA FFI buffers -> the core's views and execution context, core errors -> XLA FFI
// errors, the initialize stage's throwaway capture, and the macro that defines each handler for both platforms.
// Only this folder includes XLA headers; nothing here includes or links torch.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "../core/ops/run.h"
#include "xla/ffi/api/ffi.h"

#if defined(TE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace te_jax {

namespace ffi = xla::ffi;

// XLA element type -> the core's DType; false for a type the core has no code for.
bool core_dtype(ffi::DataType t, te::DType* out);
std::string ffi_dtype_name(ffi::DataType t);

// The view of a buffer as the core sees it; `dims_to_merge` > 1 merges that many trailing dims into one (JAX's
// gated [..., 2, H] is the core's [..., 2H]: the same memory).
te::ops::TensorView view_of(const ffi::AnyBuffer& b, const char* op, const char* what, int dims_to_merge = 1);

// Where a handler runs. CPU: a serial loop (XLA's CPU thunks run on its own pool); CUDA: XLA's stream.
te::ops::ExecCtx cpu_ctx();
#if defined(TE_WITH_CUDA)
te::ops::ExecCtx cuda_ctx(cudaStream_t stream);
#endif

// Points an op's IO struct (its `workspace` and `workspace_bytes`) at XLA's workspace result.
template <typename IO> void bind_workspace(IO& io, ffi::Result<ffi::AnyBuffer> workspace) {
  io.workspace = workspace->untyped_data();
  io.workspace_bytes = int64_t(workspace->size_bytes());
}

// A handler's binding is one expression over a builder (a builder cannot be held in a variable: its move
// constructor is private). bind_buffers<NArgs, NRets> appends NArgs untyped buffer arguments, then NRets untyped
// buffer results (at least one: every handler has its workspace result).
template <int NArgs, int NRets, typename B> auto bind_buffers(B&& b) {
  static_assert(NArgs >= 0 && NRets >= 1, "a binding has no negative count and at least one result");
  if constexpr (NArgs > 0) {
    return bind_buffers<NArgs - 1, NRets>(std::move(b).template Arg<ffi::AnyBuffer>());
  } else if constexpr (NRets > 1) {
    return bind_buffers<0, NRets - 1>(std::move(b).template Ret<ffi::AnyBuffer>());
  } else {
    return std::move(b).template Ret<ffi::AnyBuffer>();
  }
}

// Runs `body`, turning the core's typed errors into XLA FFI errors (INVALID_ARGUMENT for a caller's mistake,
// UNIMPLEMENTED for a combination not provided, INTERNAL for a failed CUDA call), so no C++ exception crosses
// XLA's C boundary.
template <typename F> ffi::Error guarded(F&& body) {
  try {
    body();
    return ffi::Error::Success();
  } catch (const te::Error& e) {
    switch (e.kind) {
      case te::ErrorKind::kValue:
      case te::ErrorKind::kType: return ffi::Error::InvalidArgument(e.what());
      case te::ErrorKind::kNotImplemented: return ffi::Error(ffi::ErrorCode::kUnimplemented, e.what());
      default: return ffi::Error::Internal(e.what());
    }
  } catch (const std::exception& e) {
    return ffi::Error::InvalidArgument(e.what());
  }
}

#if defined(TE_WITH_CUDA)
// The initialize stage's memo. Which kernels a call launches is a function of its device, its buffers' dtypes,
// shapes and alignments (the core picks vectorized paths by alignment) and its attributes, never of pointer
// values; a CUDA context keeps a module loaded until it is destroyed. So once a call of the same key has been
// recorded on a device, recording it again loads nothing: XLA runs the initialize stage before every execution of
// the program, and the memo makes every one after the first a lookup (bench_jax.py measures both).
class InitKey {
 public:
  void add(const ffi::AnyBuffer& b);
  void add(ffi::Result<ffi::AnyBuffer> r) { add(*r); }
  template <typename T> std::enable_if_t<std::is_arithmetic_v<T> || std::is_enum_v<T>> add(T v) {
    append(&v, sizeof v);
  }
  // A struct attribute: its fields, through add_fields(InitKey&, const T&) found next to T (padding bytes are
  // indeterminate, so a struct is never hashed as raw bytes).
  template <typename T> std::enable_if_t<std::is_class_v<T>> add(const T& v) { add_fields(*this, v); }
  // Whether a call of this key has been initialized on `device` in this process; remember() records one.
  bool known(int device) const;
  void remember(int device) const;

 private:
  void append(const void* p, size_t n) { bytes_.append(static_cast<const char*>(p), n); }
  std::string bytes_;
};

// The initialize stage (SPEC §10): the execute body recorded in a relaxed-mode capture of XLA's stream, then the
// graph destroyed un-run. Nothing executes and no buffer is touched, but every kernel module the call will launch
// is loaded now, before any thunk of the program (a lazy module load next to a running NCCL kernel can hang).
template <typename F> ffi::Error in_throwaway_capture(cudaStream_t stream, const InitKey& key, F&& body) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || key.known(device)) return ffi::Error::Success();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone) {
    return ffi::Error::Success();  // already inside a capture (a command buffer being recorded): nothing to load
  }
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
    return ffi::Error::Internal(std::string("initialize: cudaStreamBeginCapture failed: ") +
                                cudaGetErrorString(cudaGetLastError()));
  }
  ffi::Error err = body();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);  // always ended, also after a failed body
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (!err.success()) return err;
  if (end != cudaSuccess) {
    return ffi::Error::Internal(std::string("initialize: cudaStreamEndCapture failed: ") + cudaGetErrorString(end));
  }
  key.remember(device);
  return ffi::Error::Success();
}
#endif

}  // namespace te_jax

// One implementation `impl(ctx, args...)` over every platform and stage: <name>Cpu (a CPU binding takes no
// context), <name>Cuda (execute on XLA's stream, command-buffer compatible: all work on that stream, no host sync,
// no allocation, launch parameters from shapes and attributes only) and <name>CudaInit (the initialize stage, the
// same binding). `binding` is a function template that appends the arguments, results and attributes to a builder.
// The _WITH_SETUP form runs `setup()` (-> ffi::Error) at the start of every initialize stage, before the throwaway
// capture: what execute must find ready without creating it (the GEMM's cuBLASLt handle), made outside any capture.
#define TE_JAX_CPU_HANDLER(name, impl, binding)                                         \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name##Cpu, [](auto... a) { return impl(::te_jax::cpu_ctx(), a...); }, \
                                binding(::xla::ffi::Ffi::Bind()))

#if defined(TE_WITH_CUDA)
#define TE_JAX_CUDA_HANDLERS(name, impl, binding, setup)                                                            \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name##Cuda,                                                                         \
                                [](cudaStream_t s, auto... a) { return impl(::te_jax::cuda_ctx(s), a...); },        \
                                binding(::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()),   \
                                {::xla::ffi::Traits::kCmdBufferCompatible});                                        \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                                                    \
      name##CudaInit,                                                                                               \
      [](cudaStream_t s, auto... a) {                                                                               \
        ::xla::ffi::Error ready = setup();                                                                          \
        if (!ready.success()) return ready;                                                                         \
        ::te_jax::InitKey key;                                                                                      \
        (key.add(a), ...);                                                                                          \
        return ::te_jax::in_throwaway_capture(s, key, [&] { return impl(::te_jax::cuda_ctx(s), a...); });           \
      },                                                                                                            \
      binding(::xla::ffi::Ffi::Bind<::xla::ffi::ExecutionStage::kInitialize>()                                      \
                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()))
#else
#define TE_JAX_CUDA_HANDLERS(name, impl, binding, setup)
#endif

namespace te_jax {
inline ffi::Error no_setup() { return ffi::Error::Success(); }
}  // namespace te_jax

#define TE_JAX_HANDLERS_WITH_SETUP(name, impl, binding, setup) \
  TE_JAX_CPU_HANDLER(name, impl, binding);                     \
  TE_JAX_CUDA_HANDLERS(name, impl, binding, setup)
#define TE_JAX_HANDLERS(name, impl, binding) TE_JAX_HANDLERS_WITH_SETUP(name, impl, binding, ::te_jax::no_setup)
