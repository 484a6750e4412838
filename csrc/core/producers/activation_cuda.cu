// CUDA side of the activation / cast family: the activation dispatch switch and the dbias reduction (the
// per-tensor FP8 kernels around it, dequantize, byte transpose, delayed-scaling update: formats/fp8/fp8_cuda.cu). All on the given stream, no host
// synchronisation, no allocation.
#include "launch.cuh"

namespace te {
// The dispatch switch; launch_act is instantiated in act_{gelu,silu,relu}_{fwd,bwd}.cu, one family each.
TE_ACT_CUDA_ENTRY(activation_cuda, act_cuda, launch_act, ActKernelParams)

namespace {

// Column sums of the dbias partials: a block takes 32 columns; its 8 warps sum interleaved row slices, then one
// warp adds the 8 slice sums in a fixed order (deterministic, independent of scheduling).
template <typename T>
__global__ void dbias_reduce_kernel(const float* partial, int64_t partial_rows, int64_t cols, T* out) {
  __shared__ float slice[8][33];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int64_t c = int64_t(blockIdx.x) * 32 + lane;
  float s = 0.0f;
  if (c < cols)
    for (int64_t r = w; r < partial_rows; r += 8) s += partial[r * cols + c];
  slice[w][lane] = s;
  __syncthreads();
  if (w == 0 && c < cols) {
    float t = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) t += slice[i][lane];
    out[c] = from_float<T>(t);
  }
}

}  // namespace

void dbias_reduce_cuda(const float* partial, int64_t partial_rows, int64_t cols, DType out_dtype, void* out,
                       cudaStream_t s) {
  if (cols == 0) return;
  const int64_t blocks = (cols + 31) / 32;
  if (blocks > 2147483647LL) core_fail("dbias: too many columns");
  TE_SWITCH_IN_DTYPE(out_dtype, T, {
    dbias_reduce_kernel<T><<<unsigned(blocks), 256, 0, s>>>(partial, partial_rows, cols, static_cast<T*>(out));
  });
  act_cuda::check_launch("dbias reduction");
}

}  // namespace te
