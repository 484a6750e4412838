// Internal to the grouped GEMM's CUDA side (grouped_gemm_cuda.cu and the CUTLASS kernels under cutlass/): the
// device reading of the group rules (grouped_gemm.h) and the setup kernel that applies them. A setup kernel runs
// `fill(g, first_row, rows)` once per group (block 0) and zeroes the rows past the last group (every block).
#pragma once

#include <cuda_runtime.h>

#include "grouped_gemm.h"

namespace te {
namespace grouped {

constexpr int kSetupThreads = 256;
constexpr int kSetupBlocks = 264;  // enough to zero a tail at copy speed; idle blocks return at once

// Σ max(sizes[h], 0) over h < g, cut at m_total (each thread of the block sums a stride; one block-wide add).
__device__ inline int64_t rows_before(const int32_t* sizes, int64_t g, int64_t m_total) {
  int64_t o = 0;
  for (int64_t h = 0; h < g; ++h) o += grouped_gemm_clamp_size(sizes[h]);
  return o < m_total ? o : m_total;
}

template <class Fill> __global__ void __launch_bounds__(kSetupThreads) setup_kernel(GroupedGemmArgs a, Fill fill) {
  __shared__ unsigned long long total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  unsigned long long part = 0;
  for (int64_t g = threadIdx.x; g < a.groups; g += blockDim.x) part += grouped_gemm_clamp_size(a.group_sizes[g]);
  atomicAdd(&total, part);
  __syncthreads();
  const int64_t covered = int64_t(total) < a.m_total ? int64_t(total) : a.m_total;
  if (blockIdx.x == 0) {
    for (int64_t g = threadIdx.x; g < a.groups; g += blockDim.x) {
      const int64_t first = rows_before(a.group_sizes, g, a.m_total);
      const int64_t end = first + grouped_gemm_clamp_size(a.group_sizes[g]);
      fill(g, first, (end < a.m_total ? end : a.m_total) - first);
    }
  }
  // The rows no group covers: zeros, in 2-byte units (every output element is 2 or 4 bytes).
  const size_t elt = a.d_dtype == DType::kFloat32 ? 4 : 2;
  const size_t first_byte = size_t(covered) * size_t(a.n) * elt;
  const size_t end_byte = size_t(a.m_total) * size_t(a.n) * elt;
  char* d = static_cast<char*>(a.d);
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = first_byte + (size_t(blockIdx.x) * blockDim.x + threadIdx.x) * 2;
  for (; i + 1 < end_byte; i += stride * 2) *reinterpret_cast<uint16_t*>(d + i) = 0;
}

}  // namespace grouped
}  // namespace te
