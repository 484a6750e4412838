// The reduce-scatter ring's elementwise step (ops/collective_gemm_op.h): out = round(a + b) (b may be null: out =
// round(a)), a and b FP32, out FP32/fp16/bf16; one rounding of the FP32 sum.
#pragma once

#include <cstdint>

#include "../common/common.h"
#include "../gemm/gemm.h"

namespace te {
namespace comm {

void ring_add_cpu(const float* a, const float* b, void* out, DType out_dtype, int64_t n,
                  const GemmParallelFor& parallel_for);
#if defined(TE_WITH_CUDA)
void ring_add_cuda(const float* a, const float* b, void* out, DType out_dtype, int64_t n, cudaStream_t stream);
#endif

}  // namespace comm
}  // namespace te
