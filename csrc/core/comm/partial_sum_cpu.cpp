// partial_sum on the CPU (comm/partial_sum.h).
#include "partial_sum.h"

#include "../rules/numerics.h"

namespace te {
namespace comm {

void partial_sum_cpu(const float* slots, int n_slots, const float* own, void* out, DType out_dtype, int64_t n,
                     const ParallelFor& parallel_for) {
  parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float acc = n_slots > 0 ? slots[i] : 0.0f;
      for (int s = 1; s < n_slots; ++s) acc += slots[int64_t(s) * n + i];
      gemm_store(out, i, out_dtype, n_slots > 0 ? acc + own[i] : own[i]);
    }
  });
}

}  // namespace comm
}  // namespace te
