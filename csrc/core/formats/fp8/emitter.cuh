// The per-tensor FP8 emitter of the producer kernels (delayed and current scaling): one 8-value chunk as FP8 codes
// of fp8_scaled_value's rule (fp8.h; kRound: current scaling's rounding to the input dtype before the scale).
#pragma once

#include "../../rules/cuda_utils.cuh"
#include "fp8.h"

namespace te {
namespace act_cuda {

template <typename InT, bool kRound>
__device__ __forceinline__ void emit8_fp8(const float (&v)[kVec], void* out, int64_t off, float scale, bool e4m3) {
  const uint2 w = e4m3 ? encode8_t<InT, kRound, true>(v, scale) : encode8_t<InT, kRound, false>(v, scale);
  *reinterpret_cast<uint2*>(static_cast<uint8_t*>(out) + off) = w;
}

}  // namespace act_cuda
}  // namespace te
