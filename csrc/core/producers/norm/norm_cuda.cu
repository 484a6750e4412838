// CUDA launchers of LayerNorm / RMSNorm (norm.h): the forward by output kind (its kernels in norm_fwd_<kind>.cu,
// norm_launch.cuh), the backward's kernel variant by input dtype and chunks a lane holds, all on the given stream.
#include <string>
#include <type_traits>

#include "norm_launch.cuh"

namespace te {
namespace norm_cuda {

// norm.h's two-level reduction of the partial rows: one thread per (group, column) writes its group sum in place of
// the group's first partial row, then one thread per column adds the group sums and rounds once to gamma's dtype.
__global__ void bwd_group_kernel(NormBwdParams p, int64_t blocks) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, g = blockIdx.y;
  if (c >= p.hidden) return;
  p.dgamma_part[g * kNormReduceGroup * p.hidden + c] = norm_bwd_group_sum(p.dgamma_part, blocks, p.hidden, g, c);
  if (p.dbeta_part)
    p.dbeta_part[g * kNormReduceGroup * p.hidden + c] = norm_bwd_group_sum(p.dbeta_part, blocks, p.hidden, g, c);
}

__global__ void bwd_reduce_kernel(NormBwdParams p, int64_t blocks) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.hidden) return;
  st_out(p.dgamma, p.gamma_dtype, c, norm_bwd_total(p.dgamma_part, blocks, p.hidden, c));
  if (p.dbeta) st_out(p.dbeta, p.gamma_dtype, c, norm_bwd_total(p.dbeta_part, blocks, p.hidden, c));
}

}  // namespace norm_cuda

namespace {

void check(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) core_fail(std::string(what) + ": CUDA launch failed: " + cudaGetErrorString(e));
}

}  // namespace

void norm_fwd_cuda(const NormFwdParams& p, cudaStream_t s) {
  if (p.rows == 0 || p.hidden == 0) return;
  using norm_cuda::FwdOut;
  using norm_cuda::fwd_launch;
  switch (p.fp8_mode) {
    case 0: fwd_launch<FwdOut::kPlain>(p, s); break;
    case 1: fwd_launch<FwdOut::kFp8>(p, s); break;
    case 2: {
      const cudaError_t e = cudaMemsetAsync(p.amax, 0, sizeof(float), s);
      if (e != cudaSuccess) core_fail(std::string("norm forward: zeroing the amax failed: ") + cudaGetErrorString(e));
      fwd_launch<FwdOut::kAmax>(p, s);
      check("norm forward (amax pass)");
      fwd_launch<FwdOut::kFp8>(p, s);
      break;
    }
    case 3: fwd_launch<FwdOut::kMxRow>(p, s); break;
    case 4: fwd_launch<FwdOut::kFp8>(p, s); break;  // current scaling, amax given
    default: core_fail("norm forward: unknown fp8_mode " + std::to_string(p.fp8_mode));
  }
  check("norm forward");
}

void norm_bwd_cuda(const NormBwdParams& p, cudaStream_t s) {
  if (p.hidden == 0) return;
  const int64_t blocks = norm_bwd_blocks(p.rows, p.hidden);
  if (norm_bwd_groups(blocks) > 65535) {  // the group kernel's grid.y
    core_fail("norm backward: " + std::to_string(p.rows) + " rows is more than this kernel supports (" +
              std::to_string(65535 * kNormReduceGroup * norm_bwd_rows(p.rows, p.hidden)) + ")");
  }
  const bool vec = p.hidden % kNormVec == 0 && norm_cuda::aligned16(p.x) && norm_cuda::aligned16(p.dz) &&
                   norm_cuda::aligned16(p.dx);
  const int L = norm_lanes(p.hidden);
  const bool ln = p.kind == NormKind::kLayerNorm;
  TE_SWITCH_IN_DTYPE(p.x_dtype, T, {
    norm_cuda::by_chunks(p.hidden, [&](auto nc) {
      constexpr int kNC = decltype(nc)::value;
      const int64_t smem = norm_cuda::norm_bwd_smem(kNC, L, ln, p.hidden, vec);
      constexpr auto kKernel = norm_cuda::bwd_kernel<T, kNC>;
      // The most a kernel with its chunks in registers takes: LayerNorm, 4 chunks a lane, the widest row of 4 chunks.
      const int64_t widest = int64_t(4) * kNormVec * norm_lanes(int64_t(1) << 30);
      static const bool allowed = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       int(norm_cuda::norm_bwd_smem(4, norm_lanes(widest), true,
                                                                                    widest, true))) == cudaSuccess;
      (void)allowed;
      kKernel<<<unsigned(blocks), L, size_t(smem), s>>>(p, vec);
    });
  });
  check("norm backward");
  const int64_t rgrid = (p.hidden + 255) / 256;
  norm_cuda::bwd_group_kernel<<<dim3(unsigned(rgrid), unsigned(norm_bwd_groups(blocks))), 256, 0, s>>>(p, blocks);
  check("norm backward group sums");
  norm_cuda::bwd_reduce_kernel<<<unsigned(rgrid), 256, 0, s>>>(p, blocks);
  check("norm backward reduction");
}

}  // namespace te
