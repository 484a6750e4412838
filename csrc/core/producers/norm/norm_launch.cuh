// The forward launcher of one output kind (norm_cuda.cu picks the kind; norm_fwd_<kind>.cu instantiate it, one
// translation unit per kind so that a parallel build compiles them side by side): the kernel variant by input
// dtype, the chunks a lane holds (norm_lane_chunks: 1, 2, 4 in registers; more: read again from global memory) and
// kFull, over a resident grid, on the given stream.
#pragma once

#include <type_traits>

#include "norm_kernels.cuh"
#include "../../rules/dispatch.h"

namespace te {
namespace norm_cuda {

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename F> void by_chunks(int64_t h, F&& launch) {
  const int64_t nc = norm_lane_chunks(h);
  if (nc <= 1) {
    launch(std::integral_constant<int, 1>{});
  } else if (nc <= 2) {
    launch(std::integral_constant<int, 2>{});
  } else if (nc <= 4) {
    launch(std::integral_constant<int, 4>{});
  } else {
    launch(std::integral_constant<int, 0>{});
  }
}

// Launches kernel over a resident grid of at most `groups` blocks (the kernel walks the rest), allowing it the
// largest dynamic shared memory it may be given (set once per kernel).
template <auto kKernel, class... Args>
void launch_resident(int64_t groups, int threads, size_t smem, size_t smem_max, cudaStream_t s, Args... args) {
  const int per_sm = act_cuda::resident_per_sm<kKernel>(threads, smem_max);
  const int64_t resident = int64_t(act_cuda::device_sm_count_or_default()) * (per_sm > 0 ? per_sm : 1);
  const int64_t grid = groups < resident ? groups : resident;
  kKernel<<<unsigned(grid), threads, smem, s>>>(args...);
}

template <FwdOut kOut> void fwd_launch(const NormFwdParams& p, cudaStream_t s) {
  const int L = norm_lanes(p.hidden);
  const int64_t rows_per_cta = kThreads / L;
  const int64_t groups = (p.rows + rows_per_cta - 1) / rows_per_cta;
  const bool vec = p.hidden % kNormVec == 0 && aligned16(p.x) && aligned16(p.y);
  const bool params_aligned = aligned16(p.gamma) && (p.kind != NormKind::kLayerNorm || aligned16(p.beta));
  const int64_t stage = norm_stage_bytes(p.hidden, p.kind == NormKind::kLayerNorm);
  const bool staged = stage <= kNormStageBytes;
  const size_t smem = staged ? size_t(stage) : 0;
  TE_SWITCH_IN_DTYPE(p.x_dtype, T, {
    by_chunks(p.hidden, [&](auto nc) {
      constexpr int kNC = decltype(nc)::value;
      if (kNC > 0 && vec && params_aligned && staged && p.hidden == int64_t(kNC) * kNormVec * L) {
        launch_resident<fwd_kernel<T, kNC, kOut, (kNC > 0)>>(groups, kThreads, smem, kNormStageBytes, s, p, vec,
                                                              staged);
      } else {
        launch_resident<fwd_kernel<T, kNC, kOut, false>>(groups, kThreads, smem, kNormStageBytes, s, p, vec, staged);
      }
    });
  });
}

extern template void fwd_launch<FwdOut::kPlain>(const NormFwdParams&, cudaStream_t);
extern template void fwd_launch<FwdOut::kFp8>(const NormFwdParams&, cudaStream_t);
extern template void fwd_launch<FwdOut::kAmax>(const NormFwdParams&, cudaStream_t);
extern template void fwd_launch<FwdOut::kMxRow>(const NormFwdParams&, cudaStream_t);

}  // namespace norm_cuda
}  // namespace te
