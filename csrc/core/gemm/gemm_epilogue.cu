// The CUDA side of the unfused GEMM epilogue (SPEC §6.2): where cuBLASLt has no kernel for an epilogue, the GEMM runs
// plain into an FP32 accumulator and these kernels finish it with the CPU kernel's math (gemm_epilogue.h). Rare paths:
// simple grid-stride loops, correct rather than fast. Invariant: everything runs on the caller's stream, nothing
// allocates or synchronises (capturable in a CUDA graph / XLA command buffer).
#include <cuda_runtime.h>

#include "../rules/cuda_utils.cuh"
#include "gemm_epilogue.h"

namespace te {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return int(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

__global__ void epilogue_kernel(GemmEpilogueParams p, float* acc, float beta, const float* beta_dev, float* amax) {
  const float b = beta_dev != nullptr ? *beta_dev : beta;
  const float d_scale = p.d_scale != nullptr ? *p.d_scale : 1.0f;
  const int64_t total = p.n * p.m;
  float a = 0.0f;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const float r = gemm_epilogue_value(p, idx, idx % p.m, acc[idx], b);
    if (p.epilogue == GemmEpilogue::kDGeluBGrad) acc[idx] = r;
    gemm_store_output(p, idx, r, d_scale, a);
  }
  if (amax != nullptr) {
    __shared__ float red[kThreads / 32];
    act_cuda::block_amax_to_global<kThreads>(a, red, amax);
  }
}

// out[j] = Σ_i x[i, j] over x [rows, cols] float32, one thread per column (adjacent threads read adjacent memory).
__global__ void column_sum_kernel(const float* x, int64_t rows, int64_t cols, void* out, DType out_dtype) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < cols; j += int64_t(gridDim.x) * blockDim.x) {
    double s = 0.0;
    for (int64_t i = 0; i < rows; ++i) s += double(x[i * cols + j]);
    gemm_store(out, j, out_dtype, float(s));
  }
}

// op(B)[i, t] of the operand as stored ([rows, cols], op = transpose when b.trans), decoded exactly.
__device__ float op_b_at(const GemmOperand& b, int64_t i, int64_t t) {
  const int64_t r = b.trans ? t : i, c = b.trans ? i : t;
  const int64_t idx = r * b.cols + c;
  if (!gemm_is_fp8(b.dtype)) return gemm_load(b.data, idx, b.dtype);
  const float v = fp8_to_float(static_cast<const uint8_t*>(b.data)[idx], b.dtype == DType::kFloat8E4M3);
  const float* s = static_cast<const float*>(b.scale_inv);
  switch (b.scaling) {
    case GemmScaling::kFp8Block1d: return v * s[(c / 128) * ((b.rows + 3) / 4 * 4) + r];
    case GemmScaling::kFp8Block2d: return v * s[(r / 128) * (((b.cols + 127) / 128 + 3) / 4 * 4) + c / 128];
    default: return v * s[0];
  }
}

__global__ void bgrad_b_kernel(GemmOperand b, int64_t n, int64_t k, void* out, DType out_dtype) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    double s = 0.0;
    for (int64_t t = 0; t < k; ++t) s += double(op_b_at(b, i, t));
    gemm_store(out, i, out_dtype, float(s));
  }
}

__global__ void fp8_finish_kernel(const float* amax_tmp, float* amax, const float* scale, float* scale_inv) {
  const float a = *amax, t = *amax_tmp;
  *amax = (is_nan(a) || is_nan(t)) ? a + t : (t > a ? t : a);  // torch.maximum: NaN propagates
  *scale_inv = 1.0f / *scale;
}

}  // namespace

void gemm_epilogue_cuda(const GemmEpilogueParams& p, float* acc, float beta, const float* beta_dev, float* amax,
                        void* bias_grad, DType bias_grad_dtype, cudaStream_t stream) {
  const int64_t total = p.n * p.m;
  if (total > 0) {
    epilogue_kernel<<<blocks_for(total), kThreads, 0, stream>>>(p, acc, beta, beta_dev,
                                                                gemm_is_fp8(p.d_dtype) ? amax : nullptr);
    act_cuda::check_launch("generic_gemm: unfused epilogue");
  }
  if (p.epilogue == GemmEpilogue::kDGeluBGrad && p.m > 0) {
    column_sum_kernel<<<blocks_for(p.m), kThreads, 0, stream>>>(acc, p.n, p.m, bias_grad, bias_grad_dtype);
    act_cuda::check_launch("generic_gemm: unfused bias gradient");
  }
}

void gemm_bgrad_b_cuda(const GemmOperand& b, void* bias_grad, DType bias_grad_dtype, cudaStream_t stream) {
  const int64_t n = b.trans ? b.cols : b.rows, k = b.trans ? b.rows : b.cols;
  if (n == 0) return;
  bgrad_b_kernel<<<blocks_for(n), kThreads, 0, stream>>>(b, n, k, bias_grad, bias_grad_dtype);
  act_cuda::check_launch("generic_gemm: bias gradient of B");
}

void gemm_fp8_finish_cuda(const float* amax_tmp, float* amax, const float* scale, float* scale_inv,
                          cudaStream_t stream) {
  fp8_finish_kernel<<<1, 1, 0, stream>>>(amax_tmp, amax, scale, scale_inv);
  act_cuda::check_launch("generic_gemm: FP8 output amax");
}

}  // namespace te
