// partial_sum on CUDA (comm/partial_sum.h): one grid-stride pass on the caller's stream, four elements per thread
// (16-byte loads) when the arrays allow it; the same additions in the same order either way.
#include <cuda_runtime.h>

#include <string>

#include "../rules/numerics.h"
#include "partial_sum.h"

namespace te {
namespace comm {
namespace {

__global__ void partial_sum_kernel(const float* slots, int n_slots, const float* own, void* out, DType out_dtype,
                                   int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float acc = n_slots > 0 ? slots[i] : 0.0f;
    for (int s = 1; s < n_slots; ++s) acc += slots[int64_t(s) * n + i];
    gemm_store(out, i, out_dtype, n_slots > 0 ? acc + own[i] : own[i]);
  }
}

__global__ void partial_sum_kernel4(const float4* slots, int n_slots, const float4* own, void* out, DType out_dtype,
                                    int64_t n4) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
    const float4 o = own[i];
    float4 acc = n_slots > 0 ? slots[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 1; s < n_slots; ++s) {
      const float4 v = slots[int64_t(s) * n4 + i];
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
    const bool any = n_slots > 0;
    gemm_store(out, 4 * i + 0, out_dtype, any ? acc.x + o.x : o.x);
    gemm_store(out, 4 * i + 1, out_dtype, any ? acc.y + o.y : o.y);
    gemm_store(out, 4 * i + 2, out_dtype, any ? acc.z + o.z : o.z);
    gemm_store(out, 4 * i + 3, out_dtype, any ? acc.w + o.w : o.w);
  }
}

}  // namespace

void partial_sum_cuda(const float* slots, int n_slots, const float* own, void* out, DType out_dtype, int64_t n,
                      cudaStream_t stream) {
  if (n == 0) return;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = n % 4 == 0 && aligned(own) && (n_slots == 0 || aligned(slots));
  const int64_t blocks = ((vec ? n / 4 : n) + 255) / 256;
  const unsigned grid = unsigned(blocks < 1056 ? blocks : 1056);
  if (vec) {
    partial_sum_kernel4<<<grid, 256, 0, stream>>>(reinterpret_cast<const float4*>(slots), n_slots,
                                                  reinterpret_cast<const float4*>(own), out, out_dtype, n / 4);
  } else {
    partial_sum_kernel<<<grid, 256, 0, stream>>>(slots, n_slots, own, out, out_dtype, n);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) core_fail(std::string("collective GEMM: partial_sum launch failed: ") + cudaGetErrorString(e));
}

}  // namespace comm
}  // namespace te
