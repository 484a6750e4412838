// The reduce-scatter's last step (ops/collective_gemm_op.h): out = round(((slot 0 + slot 1) + … + slot n−1) + own),
// the FP32 partial products of one output chunk summed left to right in FP32 and rounded once to the output type.
// `slots` holds n_slots arrays of n floats back to back (n_slots may be 0: out = round(own)).
#pragma once

#include <cstdint>

#include "../rules/common.h"
#include "../rules/parallel.h"

#if defined(TE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace te {
namespace comm {

void partial_sum_cpu(const float* slots, int n_slots, const float* own, void* out, DType out_dtype, int64_t n,
                     const ParallelFor& parallel_for);
#if defined(TE_WITH_CUDA)
void partial_sum_cuda(const float* slots, int n_slots, const float* own, void* out, DType out_dtype, int64_t n,
                      cudaStream_t stream);
#endif

}  // namespace comm
}  // namespace te
