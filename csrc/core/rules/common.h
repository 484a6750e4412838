// Torch-free foundations shared by every kernel (host and device): the enums that cross the op boundary,
// bit casts, and the host/device qualifier. Invariant: nothing here includes torch or ATen headers, so a
// JAX (XLA FFI) frontend can compile csrc/core unchanged.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#if defined(__CUDACC__)
#define TE_HD __host__ __device__ __forceinline__
#define TE_DEVICE __device__ __forceinline__
#else
#define TE_HD inline
#define TE_DEVICE inline
#endif

namespace te {

// TE's DType integers (SPEC §1.3).
enum class DType : int {
  kByte = 0, kInt16 = 1, kInt32 = 2, kInt64 = 3, kFloat32 = 4, kFloat16 = 5, kBFloat16 = 6,
  kFloat8E4M3 = 7, kFloat8E5M2 = 8, kFloat8E8M0 = 9, kFloat4E2M1 = 10,
};

// Quantizer kinds of the quantizer spec (SPEC §1.4; numbering is ours and internal).
enum class QuantKind : int { kNone = 0, kFp8Delayed = 1, kFp8Current = 2, kMxfp8 = 3, kNvfp4 = 4, kFp8Block = 5 };

// The fusion choice (SPEC §5.1), decided once for forward and backward by choose_fusion_path().
enum class FusionPath : int { kUnfused, kFullyFused, kFusedActivationAmaxFp8, kFusedActivationAmaxNvfp4 };

TE_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

TE_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

TE_HD bool is_nan(float x) { return (float_bits(x) & 0x7FFFFFFFu) > 0x7F800000u; }
TE_HD bool is_inf(float x) { return (float_bits(x) & 0x7FFFFFFFu) == 0x7F800000u; }

constexpr float kFloatMax = 3.40282346638528859812e+38f;

// Errors from the core are std::invalid_argument; the torch bridge and a JAX frontend rewrap them.
[[noreturn]] inline void core_fail(const std::string& msg) { throw std::invalid_argument(msg); }

}  // namespace te
