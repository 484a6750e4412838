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

void norm_fwd_cuda(const NormFwdParams& p, cudaStream_t s) {
  if (p.rows == 0 || p.hidden == 0) return;
  const int L = norm_lanes(p.hidden);
  const int64_t rows_per_cta = norm_cuda::kThreads / L;
  const int64_t grid = (p.rows + rows_per_cta - 1) / rows_per_cta;
  if (grid > 2147483647LL) core_fail("norm forward: too many rows");
  const bool vec = p.hidden % kNormVec == 0 && aligned16(p.x) && (p.fp8_mode == 0 || aligned16(p.y));
  using norm_cuda::FwdOut;
  const auto launch = [&](auto out) {
    TE_SWITCH_IN_DTYPE(p.x_dtype, T, {
      by_chunks(p.hidden, [&](auto nc) {
        norm_cuda::fwd_kernel<T, decltype(nc)::value, decltype(out)::value>
            <<<unsigned(grid), norm_cuda::kThreads, 0, s>>>(p, vec);
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
  const bool vec = p.hidden % kNormVec == 0 && aligned16(p.x) && aligned16(p.dz);
  const int L = norm_lanes(p.hidden);
  TE_SWITCH_IN_DTYPE(p.x_dtype, T, {
    by_chunks(p.hidden, [&](auto nc) {
      norm_cuda::bwd_kernel<T, decltype(nc)::value><<<unsigned(blocks), L, 0, s>>>(p, vec);
    });
  });
  check("norm backward");
  const int64_t rgrid = (p.hidden + 255) / 256;
  norm_cuda::bwd_reduce_kernel<<<unsigned(rgrid), 256, 0, s>>>(p, blocks);
  check("norm backward reduction");
}

}  // namespace te
