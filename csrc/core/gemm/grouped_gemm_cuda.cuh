// Internal to the grouped GEMM's CUDA side (grouped_gemm_cuda.cu and the CUTLASS kernels under cutlass/): the
// setup kernel that applies the group rules (grouped_gemm.h) on the device.
#pragma once

#include <cuda_runtime.h>

#include "grouped_gemm.h"

namespace te {
namespace grouped {

constexpr int kSetupThreads = 256;
constexpr int kSetupBlocks = 264;  // enough to zero a tail at copy speed; idle blocks return at once

// Zeroes bytes [0, n) of p, in 2-byte units (every output element is 2 or 4 bytes), over the whole grid.
__device__ inline void zero_region(char* p, size_t n, size_t tid, size_t stride) {
  for (size_t i = tid * 2; i + 1 < n; i += stride * 2) *reinterpret_cast<uint16_t*>(p + i) = 0;
}

// Every thread walks the groups in order (the prefix of the sizes, by the rules of grouped_gemm.h); block 0 hands
// each group to fill(g, first_row, rows), and the grid zeroes what no group writes: the rows past the last group
// (forward), or the whole d[g] of a group without rows (wgrad).
template <class Fill> __global__ void __launch_bounds__(kSetupThreads) setup_kernel(GroupedGemmArgs a, Fill fill) {
  const size_t elt = a.d_dtype == DType::kFloat32 ? 4 : 2;
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
  char* d = static_cast<char*>(a.d);
  int64_t first = 0;
  for (int64_t g = 0; g < a.groups; ++g) {
    const int64_t s = grouped_gemm_clamp_size(a.group_sizes[g]);
    const int64_t end = first + s < a.m_total ? first + s : a.m_total;
    if (blockIdx.x == 0 && g % blockDim.x == threadIdx.x) fill(g, first, end - first);
    if (a.wgrad && end == first) {
      zero_region(d + size_t(g) * size_t(a.n) * size_t(a.k) * elt, size_t(a.n) * size_t(a.k) * elt, tid, stride);
    }
    first = end;
  }
  if (!a.wgrad) {
    zero_region(d + size_t(first) * size_t(a.n) * elt, size_t(a.m_total - first) * size_t(a.n) * elt, tid, stride);
  }
}

}  // namespace grouped
}  // namespace te
