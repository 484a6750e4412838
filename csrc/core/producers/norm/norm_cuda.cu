// CUDA launchers of LayerNorm / RMSNorm (norm.h): the kernel variant by input dtype and the chunks a lane holds
// (norm_lane_chunks: 1, 2, 4 in registers; more: read again from global memory), all on the given stream.
#include <string>
#include <type_traits>

#include "norm_kernels.cuh"
#include "../../rules/dispatch.h"

namespace te {
namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void check(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) core_fail(std::string(what) + ": CUDA launch failed: " + cudaGetErrorString(e));
}

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

}  // namespace

// Launches kernel over a resident grid of at most `groups` blocks (the kernel walks the rest), allowing it the
// largest dynamic shared memory it may be given (set once per kernel).
template <auto kKernel, class... Args>
void launch_resident(int64_t groups, int threads, size_t smem, size_t smem_max, cudaStream_t s, Args... args) {
  const int per_sm = act_cuda::resident_per_sm<kKernel>(threads, smem_max);
  const int64_t resident = int64_t(act_cuda::device_sm_count_or_default()) * (per_sm > 0 ? per_sm : 1);
  const int64_t grid = groups < resident ? groups : resident;
  kKernel<<<unsigned(grid), threads, smem, s>>>(args...);
}

void norm_fwd_cuda(const NormFwdParams& p, cudaStream_t s) {
  if (p.rows == 0 || p.hidden == 0) return;
  const int L = norm_lanes(p.hidden);
  const int64_t rows_per_cta = norm_cuda::kThreads / L;
  const int64_t groups = (p.rows + rows_per_cta - 1) / rows_per_cta;
  const bool vec = p.hidden % kNormVec == 0 && aligned16(p.x) && aligned16(p.y);
  const bool params_aligned = aligned16(p.gamma) && (p.kind != NormKind::kLayerNorm || aligned16(p.beta));
  const int64_t stage = norm_cuda::norm_stage_bytes(p.hidden, p.kind == NormKind::kLayerNorm);
  const bool staged = stage <= norm_cuda::kNormStageBytes;
  const size_t smem = staged ? size_t(stage) : 0;
  using norm_cuda::FwdOut;
  const auto launch = [&](auto out) {
    TE_SWITCH_IN_DTYPE(p.x_dtype, T, {
      by_chunks(p.hidden, [&](auto nc) {
        constexpr int kNC = decltype(nc)::value;
        constexpr FwdOut kOut = decltype(out)::value;
        if (kNC > 0 && vec && params_aligned && staged && p.hidden == int64_t(kNC) * kNormVec * L) {
          launch_resident<norm_cuda::fwd_kernel<T, kNC, kOut, (kNC > 0)>>(
              groups, norm_cuda::kThreads, smem, norm_cuda::kNormStageBytes, s, p, vec, staged);
        } else {
          launch_resident<norm_cuda::fwd_kernel<T, kNC, kOut, false>>(
              groups, norm_cuda::kThreads, smem, norm_cuda::kNormStageBytes, s, p, vec, staged);
        }
      });
    });
  };
  switch (p.fp8_mode) {
    case 0: launch(std::integral_constant<FwdOut, FwdOut::kPlain>{}); break;
    case 1: launch(std::integral_constant<FwdOut, FwdOut::kFp8>{}); break;
    case 2: {
      const cudaError_t e = cudaMemsetAsync(p.amax, 0, sizeof(float), s);
      if (e != cudaSuccess) core_fail(std::string("norm forward: zeroing the amax failed: ") + cudaGetErrorString(e));
      launch(std::integral_constant<FwdOut, FwdOut::kAmax>{});
      check("norm forward (amax pass)");
      launch(std::integral_constant<FwdOut, FwdOut::kFp8>{});
      break;
    }
    case 3: launch(std::integral_constant<FwdOut, FwdOut::kMxRow>{}); break;
    case 4: launch(std::integral_constant<FwdOut, FwdOut::kFp8>{}); break;  // current scaling, amax given
    default: core_fail("norm forward: unknown fp8_mode " + std::to_string(p.fp8_mode));
  }
  check("norm forward");
}

void norm_bwd_cuda(const NormBwdParams& p, cudaStream_t s) {
  if (p.hidden == 0) return;
  const int64_t blocks = norm_bwd_blocks(p.rows, p.hidden);
  if (blocks > 2147483647LL) core_fail("norm backward: too many rows");
  const bool vec = p.hidden % kNormVec == 0 && aligned16(p.x) && aligned16(p.dz) && aligned16(p.dx);
  const int L = norm_lanes(p.hidden);
  const bool ln = p.kind == NormKind::kLayerNorm;
  TE_SWITCH_IN_DTYPE(p.x_dtype, T, {
    by_chunks(p.hidden, [&](auto nc) {
      constexpr int kNC = decltype(nc)::value;
      const int64_t smem = norm_cuda::norm_bwd_smem(kNC, L, ln, p.hidden);
      constexpr auto kKernel = norm_cuda::bwd_kernel<T, kNC>;
      // The most a kernel with its chunks in registers takes: LayerNorm, 4 chunks a lane, the widest row of 4 chunks.
      const int64_t widest = int64_t(4) * kNormVec * norm_lanes(int64_t(1) << 30);
      static const bool allowed = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       int(norm_cuda::norm_bwd_smem(4, norm_lanes(widest), true,
                                                                                    widest))) == cudaSuccess;
      (void)allowed;
      kKernel<<<unsigned(blocks), L, size_t(smem), s>>>(p, vec);
    });
  });
  check("norm backward");
  const int64_t rgrid = (p.hidden + 255) / 256;
  norm_cuda::bwd_reduce_kernel<<<unsigned(rgrid), 256, 0, s>>>(p, blocks);
  check("norm backward reduction");
}

}  // namespace te
