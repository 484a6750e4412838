// The plain emitter of the producer kernels: one 8-value chunk written in the input dtype (fp32 / fp16 / bf16),
// rounded to nearest even (rules/numerics.h).
#pragma once

#include "../../rules/cuda_utils.cuh"

namespace te {
namespace act_cuda {

template <typename InT>
__device__ __forceinline__ void emit8_plain(const float (&v)[kVec], void* out, int64_t off) {
  store8(static_cast<InT*>(out) + off, true, kVec, v);
}

}  // namespace act_cuda
}  // namespace te
