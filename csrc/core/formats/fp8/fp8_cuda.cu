// CUDA kernels of per-tensor FP8 (fp8.h): dequantize, byte transpose, delayed-scaling update. All on the given
// stream, no host synchronisation, no allocation.
#include "fp8.h"

#include "../../rules/cuda_utils.cuh"
#include "../../rules/dispatch.h"

namespace te {
namespace {

template <typename T>
__global__ void dequantize_fp8_kernel(const uint8_t* codes, const float* scale_inv, int64_t n, bool e4m3, T* out) {
  const float si = *scale_inv;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_float<T>(fp8_to_float(codes[i], e4m3) * si);
}

// 32x32 byte tiles through shared memory; a set `noop` flag (1.0) writes nothing.
__global__ void transpose_bytes_kernel(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out,
                                       const float* noop) {
  if (noop != nullptr && *noop == 1.0f) return;
  __shared__ uint8_t t[32][33];
  const int64_t r0 = int64_t(blockIdx.y) * 32, c0 = int64_t(blockIdx.x) * 32;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) t[i][threadIdx.x] = in[r * cols + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) out[c * rows + r] = t[threadIdx.x][i];
  }
}

__global__ void delayed_update_kernel(float* history, int64_t hist_len, int64_t n, float* scale,
                                      const float* reduced, AmaxAlgo algo, float max_over_margin) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= n) return;
  delayed_update_slot(history, hist_len, n, c, scale, reduced != nullptr, reduced ? reduced[c] : 0.0f, algo,
                      max_over_margin);
}

unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

}  // namespace

void dequantize_fp8_cuda(const uint8_t* codes, const float* scale_inv, int64_t n, bool e4m3, DType out_dtype,
                         void* out, cudaStream_t s) {
  if (n == 0) return;
  TE_SWITCH_IN_DTYPE(out_dtype, T, {
    dequantize_fp8_kernel<T><<<blocks_for(n, 256), 256, 0, s>>>(codes, scale_inv, n, e4m3, static_cast<T*>(out));
  });
  act_cuda::check_launch("FP8 dequantize");
}

void transpose_bytes_cuda(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out, cudaStream_t s,
                          const float* noop) {
  if (rows == 0 || cols == 0) return;
  const int64_t gy = (rows + 31) / 32, gx = (cols + 31) / 32;
  if (gy > 65535) core_fail("fp8_transpose: more than 2097120 rows is not supported");
  transpose_bytes_kernel<<<dim3(unsigned(gx), unsigned(gy)), dim3(32, 8), 0, s>>>(in, rows, cols, out, noop);
  act_cuda::check_launch("FP8 transpose");
}

void delayed_update_cuda(float* history, int64_t hist_len, int64_t n, float* scale, const float* reduced,
                         AmaxAlgo algo, float max_over_margin, cudaStream_t s) {
  if (n == 0) return;
  delayed_update_kernel<<<unsigned((n + 127) / 128), 128, 0, s>>>(history, hist_len, n, scale, reduced, algo,
                                                                  max_over_margin);
  act_cuda::check_launch("delayed scaling update");
}

}  // namespace te
