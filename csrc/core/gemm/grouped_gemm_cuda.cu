// The CUDA grouped GEMM (grouped_gemm.h): a CUTLASS Hopper kernel where one covers the operands
// (gemm/grouped_cutlass.h), else the portable kernel below — correct for every format the op takes, FP32
// accumulation on CUDA cores, for the pairings and builds without a tensor-core kernel. Both read the group sizes on
// the device; nothing here synchronises the host or allocates.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "../rules/cuda_utils.cuh"
#include "../rules/numerics.h"
#include "gemm_epilogue.h"
#include "grouped_gemm_cuda.cuh"
#if defined(TE_WITH_CUTLASS)
#include "grouped_cutlass.h"
#endif

namespace te {
namespace grouped {
namespace {

// The most multiprocessors a workspace is planned for (plans are made without asking the device); a device with
// more runs its persistent kernel on this many.
constexpr int kMaxSms = 256;

#if defined(TE_WITH_CUTLASS)
CutlassKind cutlass_kind(const GroupedGemmArgs& a) {
  if (a.d_dtype != DType::kBFloat16) return CutlassKind::kNone;
  if (a.wgrad) {
    const bool bf16 = a.lhs_dtype == DType::kBFloat16 && a.rhs_dtype == DType::kBFloat16;
    return bf16 ? CutlassKind::kBf16Wgrad : CutlassKind::kNone;
  }
  if (a.lhs_dtype == DType::kBFloat16 && a.rhs_dtype == DType::kBFloat16) {
    return a.rhs_kn ? CutlassKind::kBf16Kn : CutlassKind::kBf16Nk;
  }
  if (a.rhs_kn || a.rhs_dtype != DType::kFloat8E4M3) return CutlassKind::kNone;
  if (a.block_scaling) {  // always promoted: the scales apply per 128-deep K step
    if (a.lhs_dtype == DType::kFloat8E4M3) return CutlassKind::kBlockE4m3E4m3;
    return a.lhs_dtype == DType::kFloat8E5M2 ? CutlassKind::kBlockE5m2E4m3 : CutlassKind::kNone;
  }
  if (a.lhs_dtype == DType::kFloat8E4M3) return a.fast_accum ? CutlassKind::kE4m3E4m3NkFast : CutlassKind::kE4m3E4m3Nk;
  if (a.lhs_dtype == DType::kFloat8E5M2) return a.fast_accum ? CutlassKind::kE5m2E4m3NkFast : CutlassKind::kE5m2E4m3Nk;
  return CutlassKind::kNone;
}

template <class F> auto with_kind(CutlassKind k, F&& f) {
  switch (k) {
    case CutlassKind::kBf16Nk: return f(Cutlass<CutlassKind::kBf16Nk>{});
    case CutlassKind::kBf16Kn: return f(Cutlass<CutlassKind::kBf16Kn>{});
    case CutlassKind::kE4m3E4m3Nk: return f(Cutlass<CutlassKind::kE4m3E4m3Nk>{});
    case CutlassKind::kE5m2E4m3Nk: return f(Cutlass<CutlassKind::kE5m2E4m3Nk>{});
    case CutlassKind::kE4m3E4m3NkFast: return f(Cutlass<CutlassKind::kE4m3E4m3NkFast>{});
    case CutlassKind::kBf16Wgrad: return f(Cutlass<CutlassKind::kBf16Wgrad>{});
    case CutlassKind::kBlockE4m3E4m3: return f(Cutlass<CutlassKind::kBlockE4m3E4m3>{});
    case CutlassKind::kBlockE5m2E4m3: return f(Cutlass<CutlassKind::kBlockE5m2E4m3>{});
    default: return f(Cutlass<CutlassKind::kE5m2E4m3NkFast>{});
  }
}
#endif

// ---- The portable kernel: 64x64 output tiles of one group each, 16-deep K steps through shared memory ----------
constexpr int kTile = 64, kDepth = 16, kThreads = 256;

__device__ float load_operand(const void* p, int64_t i, DType d) {
  if (d == DType::kFloat8E4M3 || d == DType::kFloat8E5M2) {
    return fp8_to_float(static_cast<const uint8_t*>(p)[i], d == DType::kFloat8E4M3);
  }
  return gemm_load(p, i, d);
}

__global__ void __launch_bounds__(kThreads) portable_kernel(GroupedGemmArgs a, int64_t col_tiles) {
  __shared__ float xs[kDepth][kTile + 1];  // lhs tile, k-major
  __shared__ float ws[kDepth][kTile + 1];  // rhs tile, k-major
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  for (int64_t job = blockIdx.x; ; job += gridDim.x) {
    // job = (row tile over all groups) * col_tiles + col tile; find the group of the row tile.
    int64_t t = job / col_tiles, first = 0, rows = 0, g = 0;
    bool found = false;
    for (; g < a.groups; ++g) {
      const int64_t end = std::min(first + grouped_gemm_clamp_size(a.group_sizes[g]), a.m_total);
      rows = end - first;
      const int64_t tiles = (rows + kTile - 1) / kTile;
      if (t < tiles) {
        found = true;
        break;
      }
      t -= tiles;
      first = end;
    }
    if (!found) return;  // past the last tile (jobs grow with job, so every later one is too)
    const int64_t r0 = first + t * kTile, c0 = (job % col_tiles) * kTile, r_end = first + rows;
    const float alpha =
        gemm_is_fp8(a.lhs_dtype) && !a.block_scaling ? a.lhs_scale_inv[0] * a.rhs_scale_inv[g] : 1.0f;
    const char* w = static_cast<const char*>(a.rhs);
    const size_t w_elt = gemm_is_fp8(a.rhs_dtype) ? 1 : (a.rhs_dtype == DType::kFloat32 ? 4 : 2);
    w += size_t(g) * size_t(a.n) * size_t(a.k) * w_elt;
    // FP8 blocks: each value decoded with its block's scale (grouped_gemm.h's layouts).
    const int64_t lhs_ld = grouped_lhs_scale_ld(a.m_total), rhs_ld = grouped_rhs_scale_ld(a.k);
    const float* rhs_s = a.block_scaling ? a.rhs_scale_inv + g * grouped_nb(a.n) * rhs_ld : nullptr;
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < a.k; k0 += kDepth) {
      for (int i = threadIdx.x; i < kDepth * kTile; i += kThreads) {
        const int kk = i % kDepth, rr = i / kDepth;
        const int64_t r = r0 + rr, c = c0 + rr, k = k0 + kk;
        float xv = (r < r_end && k < a.k) ? load_operand(a.lhs, r * a.k + k, a.lhs_dtype) : 0.0f;
        float wv = (c < a.n && k < a.k) ? load_operand(w, a.rhs_kn ? k * a.n + c : c * a.k + k, a.rhs_dtype) : 0.0f;
        if (a.block_scaling) {
          if (r < r_end && k < a.k) xv *= a.lhs_scale_inv[(k / kGroupedBlock) * lhs_ld + r];
          if (c < a.n && k < a.k) wv *= rhs_s[(c / kGroupedBlock) * rhs_ld + k / kGroupedBlock];
        }
        xs[kk][rr] = xv;
        ws[kk][rr] = wv;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kDepth; ++kk) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(xs[kk][ty * 4 + i], ws[kk][tx * 4 + j], acc[i][j]);
        }
      }
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t r = r0 + ty * 4 + i;
      if (r >= r_end) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t c = c0 + tx * 4 + j;
        if (c < a.n) gemm_store(a.d, r * a.n + c, a.d_dtype, acc[i][j] * alpha);
      }
    }
  }
}

// wgrad: d[g] tile [64 x 64] of [n, k] = Σ over the group's rows of lhs[row, n-tile]ᵀ · rhs[row, k-tile].
__global__ void __launch_bounds__(kThreads) portable_wgrad_kernel(GroupedGemmArgs a, int64_t k_tiles) {
  __shared__ float ys[kDepth][kTile + 1];  // lhs (dy) rows, n along the tile
  __shared__ float xs[kDepth][kTile + 1];  // rhs (x) rows, k along the tile
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t g = blockIdx.y;
  int64_t first = 0;
  for (int64_t h = 0; h < g; ++h) first = std::min(first + grouped_gemm_clamp_size(a.group_sizes[h]), a.m_total);
  const int64_t end = std::min(first + grouped_gemm_clamp_size(a.group_sizes[g]), a.m_total);
  const int64_t n0 = (blockIdx.x / k_tiles) * kTile, k0 = (blockIdx.x % k_tiles) * kTile;
  float acc[4][4] = {};
  for (int64_t r0 = first; r0 < end; r0 += kDepth) {
    for (int i = threadIdx.x; i < kDepth * kTile; i += kThreads) {
      const int rr = i / kTile, cc = i % kTile;
      const int64_t r = r0 + rr;
      ys[rr][cc] = (r < end && n0 + cc < a.n) ? load_operand(a.lhs, r * a.n + n0 + cc, a.lhs_dtype) : 0.0f;
      xs[rr][cc] = (r < end && k0 + cc < a.k) ? load_operand(a.rhs, r * a.k + k0 + cc, a.rhs_dtype) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kDepth; ++rr) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(ys[rr][ty * 4 + i], xs[rr][tx * 4 + j], acc[i][j]);
      }
    }
    __syncthreads();
  }
  void* d = static_cast<char*>(a.d) + size_t(g) * size_t(a.n) * size_t(a.k) * (a.d_dtype == DType::kFloat32 ? 4 : 2);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t n = n0 + ty * 4 + i;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t k = k0 + tx * 4 + j;
      if (n < a.n && k < a.k) gemm_store(d, n * a.k + k, a.d_dtype, acc[i][j]);
    }
  }
}

struct NoTable {
  __device__ void operator()(int64_t, int64_t, int64_t) const {}
};

void run_portable(const GroupedGemmArgs& a, cudaStream_t stream) {
  setup_kernel<<<kSetupBlocks, kSetupThreads, 0, stream>>>(a, NoTable{});
  act_cuda::check_launch("grouped_gemm setup");
  if (a.wgrad) {
    if (a.groups == 0 || a.n == 0 || a.k == 0) return;
    const int64_t k_tiles = (a.k + kTile - 1) / kTile;
    portable_wgrad_kernel<<<dim3(unsigned(((a.n + kTile - 1) / kTile) * k_tiles), unsigned(a.groups)), kThreads, 0,
                            stream>>>(a, k_tiles);
    act_cuda::check_launch("grouped_gemm portable wgrad kernel");
    return;
  }
  if (a.groups == 0 || a.m_total == 0 || a.n == 0) return;
  const int64_t col_tiles = (a.n + kTile - 1) / kTile;
  const int64_t jobs = ((a.m_total + kTile - 1) / kTile + a.groups) * col_tiles;  // an upper bound on the tiles
  const int grid = int(std::min<int64_t>(jobs, int64_t(act_cuda::device_sm_count_or_default()) * 8));
  portable_kernel<<<grid, kThreads, 0, stream>>>(a, col_tiles);
  act_cuda::check_launch("grouped_gemm portable kernel");
}

}  // namespace
}  // namespace grouped

const char* grouped_gemm_kernel_name(const GroupedGemmArgs& a) {
#if defined(TE_WITH_CUTLASS)
  const grouped::CutlassKind k = grouped::cutlass_kind(a);
  if (k != grouped::CutlassKind::kNone) return grouped::with_kind(k, [](auto c) { return decltype(c)::name(); });
#endif
  (void)a;
  return "portable";
}

size_t grouped_gemm_workspace_bytes(const GroupedGemmArgs& a, int max_sms) {
#if defined(TE_WITH_CUTLASS)
  const grouped::CutlassKind k = grouped::cutlass_kind(a);
  if (k != grouped::CutlassKind::kNone) {
    return grouped::with_kind(k, [&](auto c) { return decltype(c)::workspace(a, max_sms); });
  }
#endif
  (void)a;
  (void)max_sms;
  return 0;
}

void grouped_gemm_cuda(const GroupedGemmArgs& a, cudaStream_t stream) {
#if defined(TE_WITH_CUTLASS)
  const grouped::CutlassKind k = grouped::cutlass_kind(a);
  if (k != grouped::CutlassKind::kNone) {
    const int sms = std::min(act_cuda::device_sm_count_or_default(), grouped::kMaxSms);
    if (a.workspace_bytes < grouped_gemm_workspace_bytes(a, sms)) {
      core_fail("grouped_gemm: the workspace has " + std::to_string(a.workspace_bytes) + " bytes, the kernel needs " +
                std::to_string(grouped_gemm_workspace_bytes(a, sms)));
    }
    grouped::with_kind(k, [&](auto c) { decltype(c)::run(a, stream, sms); });
    return;
  }
#endif
  grouped::run_portable(a, stream);
}

int grouped_gemm_max_sms() { return grouped::kMaxSms; }

}  // namespace te
