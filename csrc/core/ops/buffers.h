// The vocabulary of the frontend-neutral dispatch (csrc/core/ops): a tensor view over a raw buffer, the execution
// context a call runs in, the quantizer spec of SPEC §1.4 with its tensors as float pointers, and the typed error
// that every check of this layer raises. Invariant: nothing here includes torch or XLA headers, and nothing on a
// successful call allocates or formats a string (message text is built only when a check fails).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "../producers/activation.h"
#include "../formats/nvfp4/quantize_nvfp4.h"

// cudaStream_t without the CUDA headers, so a CPU-only build and its frontends see the same struct.
struct CUstream_st;

namespace te {

// What kind of mistake a check found; the torch frontend raises ValueError / TypeError / NotImplementedError /
// RuntimeError for them, a JAX frontend the matching xla::ffi error codes. kRuntime: not the caller's arguments
// (a failed CUDA call, a frontend handing over too small a workspace).
enum class ErrorKind : int { kValue, kType, kNotImplemented, kRuntime };

// The error of the ops layer. It is a std::invalid_argument so that code catching core_fail's errors catches it too.
struct Error : std::invalid_argument {
  ErrorKind kind;
  Error(ErrorKind k, const std::string& msg) : std::invalid_argument(msg), kind(k) {}
};
[[noreturn]] inline void fail(ErrorKind kind, const std::string& msg) { throw Error(kind, msg); }

// Runs an op's kernel launch, turning the kernel layer's own refusals (core_fail's std::invalid_argument: a library
// failure, or a format "not yet supported") into te::Error — kNotImplemented for the latter, kRuntime otherwise —
// and letting te::Errors through. One place for the rewrap every op's run path needs.
template <class F> void run_rewrapping_errors(F&& f) {
  try {
    f();
  } catch (const Error&) {
    throw;
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    fail(m.find("not yet supported") != std::string::npos ? ErrorKind::kNotImplemented : ErrorKind::kRuntime, m);
  }
}

namespace ops {

constexpr int kMaxDims = 8;

// A shape of at most kMaxDims dims, stored inline (no allocation).
struct Shape {
  int ndim = 0;
  int64_t dims[kMaxDims] = {};

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= dims[i];
    return n;
  }
  int64_t back() const { return dims[ndim - 1]; }
  bool operator==(const Shape& o) const {
    if (ndim != o.ndim) return false;
    for (int i = 0; i < ndim; ++i) {
      if (dims[i] != o.dims[i]) return false;
    }
    return true;
  }
  bool operator!=(const Shape& o) const { return !(*this == o); }
  // [d0, ..., dn-1] -> [dn-1, d0, ..., dn-2]: the transposed copy of a flattened [rows, cols] tensor.
  Shape transposed() const {
    Shape s;
    s.ndim = ndim;
    if (ndim == 0) return s;
    s.dims[0] = dims[ndim - 1];
    for (int i = 0; i + 1 < ndim; ++i) s.dims[i + 1] = dims[i];
    return s;
  }
  static Shape of(int64_t a) { Shape s; s.ndim = 1; s.dims[0] = a; return s; }
  static Shape of(int64_t a, int64_t b) { Shape s; s.ndim = 2; s.dims[0] = a; s.dims[1] = b; return s; }
};

// A contiguous row-major tensor: data pointer, element type, shape. The ops layer never owns memory.
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  Shape shape;
};

// Where a call runs: the CPU (kernels over `parallel_for`) or one CUDA device, everything on `stream`.
// `arch` names the device in messages ("cpu", "sm_90"); null: derived from the device when a message needs it.
struct ExecCtx {
  bool cuda = false;
  int device_index = -1;
  CUstream_st* stream = nullptr;
  const ParallelFor* parallel_for = nullptr;
  const char* arch = nullptr;
};

// The quantizer spec (SPEC §1.4) with its tensors as pointers: scale [1] (delayed scaling), amax [1] (delayed:
// accumulated; current scaling and NVFP4: an already reduced amax that skips the amax pass, for NVFP4 the global
// amax of both copies, so not with a Hadamard-transformed columnwise copy), noop [1] (1.0: write nothing).
// `rng` is the NVFP4 stochastic-rounding key, which the frontend fills in when ActPlan::needs_rng() says so.
struct QuantSpec {
  QuantKind kind = QuantKind::kNone;
  DType dtype = DType::kFloat8E4M3;
  bool rowwise = true;
  bool columnwise = true;
  int64_t flags = 0;
  double amax_epsilon = 0.0;
  int64_t block_dim = 1;
  const float* scale = nullptr;
  float* amax = nullptr;
  const float* noop = nullptr;
  RngState rng;

  bool force_pow2() const { return flags & 1; }
  bool two_d() const { return flags & (1 << 1); }
  bool stochastic_rounding() const { return flags & (1 << 2); }
  bool rht() const { return flags & (1 << 3); }
  bool random_sign_mask() const { return flags & (1 << 4); }
  bool swizzled() const { return flags & (1 << 5); }
  bool e4m3() const { return dtype == DType::kFloat8E4M3; }
  // "FP8 block 1x128 E4M3" / "FP8 block 128x128 E5M2": the format as error messages name it.
  std::string fp8_block_name() const {
    return std::string(block_dim == 2 ? "FP8 block 128x128 " : "FP8 block 1x128 ") + (e4m3() ? "E4M3" : "E5M2");
  }
};

// ---- Message pieces (error paths only) ---------------------------------------------------------------------------
// Integers go through std::to_string, never through an ostream: the GPU machine's toolchain (its own g++ next to
// torch's libstdc++) crashed formatting integers via std::num_put.
std::string shape_str(const Shape& s);
// The element types as the torch frontend's messages have always named them (c10's names: Float, Half, BFloat16,
// Byte, ...), so both frontends' messages read alike.
std::string dtype_name(DType d);

// Concatenates message pieces (error paths only); integers go through str().
template <typename... Ts> std::string msg(const Ts&... parts) {
  std::string s;
  (s += ... += parts);
  return s;
}
inline std::string str(int64_t v) { return std::to_string(v); }
std::string device_str(const ExecCtx& ctx);  // "cpu", "cuda:0"
// Raises the one "this build of the core has no CUDA kernels" error (kNotImplemented), after "<op>: " when op is
// given (TE_ON_DEVICE and the GEMM ops' run paths in a build without CUDA).
[[noreturn]] void no_cuda(const char* op = nullptr);
std::string arch_name(const ExecCtx& ctx);   // "cpu", "sm_90"

}  // namespace ops
}  // namespace te
