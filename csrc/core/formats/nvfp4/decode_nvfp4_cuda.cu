// The NVFP4 GEMM operand decode to bf16 (quantize_nvfp4.h, SPEC §6.7): the sm_90 GEMM's single bandwidth-bound pass
// over the operand, on the given stream, no allocation, no host synchronisation.
#include "quantize_nvfp4.h"

#include "../../rules/cuda_utils.cuh"

namespace te {
namespace {

constexpr int kThreads = 256;

// One byte (two E2M1 codes, element 0 in the low nibble) times the block's scale as bf16x2. Each nibble becomes an
// f16 bit pattern with the code's exponent and mantissa bits in place (s e1 e0 m -> sign, exponent e, mantissa m):
// as f16 that is the E2M1 value times 2^-14 (subnormal codes included), so `s14` is the scale times 2^14 (exact).
__device__ __forceinline__ uint32_t decode_byte(uint32_t b, float s14) {
  const uint32_t h2 = ((b & 0x7u) << 9) | ((b & 0x8u) << 12) | ((b & 0x70u) << 21) | ((b & 0x80u) << 24);
  float lo, hi;
  act_cuda::half2_bits_to_float2(h2, lo, hi);
  return act_cuda::float2_to_bf16x2(lo * s14, hi * s14);
}

// One 16-element block (8 packed bytes, one E4M3 scale) a thread over a grid of every block (cols % 16 == 0,
// 8-byte aligned codes, 16-byte aligned output): many small independent loads in flight.
__global__ void __launch_bounds__(kThreads) decode_blocks_kernel(const uint8_t* __restrict__ packed,
                                                                 const uint8_t* __restrict__ scales, int64_t rows,
                                                                 int64_t cols, bf16_t* __restrict__ out) {
  const int64_t per_row = cols / kNvBlock, total = rows * per_row;
  const int64_t cpad = roundup(per_row, 4);
  for (int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x; t < total; t += int64_t(gridDim.x) * kThreads) {
    const int64_t r = t / per_row, j = t % per_row;
    uint2 raw;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(raw.x), "=r"(raw.y) : "l"(packed + t * 8));
    const float s14 = fp8_to_float(__ldg(scales + swizzled_scale_offset(r, j, cpad)), true) * 16384.0f;
    uint32_t o[8];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      o[b] = decode_byte((raw.x >> (8 * b)) & 0xFFu, s14);
      o[4 + b] = decode_byte((raw.y >> (8 * b)) & 0xFFu, s14);
    }
    uint4* dst = reinterpret_cast<uint4*>(out + t * kNvBlock);
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

// Any shape or alignment: one element a thread (nv_gemm_decode, the CPU kernel's rule).
__global__ void decode_any_kernel(const uint8_t* __restrict__ packed, const uint8_t* __restrict__ scales, int64_t rows,
                                  int64_t cols, bf16_t* __restrict__ out) {
  const int64_t n = rows * cols;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x) {
    out[t] = from_float<bf16_t>(nv_gemm_decode(packed, scales, t / cols, t % cols, cols));
  }
}

__global__ void gemm_alpha_kernel(const float* amax_a, const float* amax_b, double alpha, float beta, float* out) {
  out[0] = nvfp4_gemm_alpha(*amax_a, *amax_b, alpha);
  out[1] = beta;
}

}  // namespace

void nvfp4_gemm_alpha_cuda(const float* amax_a, const float* amax_b, double alpha, float beta, float* out,
                           cudaStream_t stream) {
  gemm_alpha_kernel<<<1, 1, 0, stream>>>(amax_a, amax_b, alpha, beta, out);
  act_cuda::check_launch("NVFP4 GEMM alpha");
}

void decode_nvfp4_gemm_operand_cuda(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols,
                                    void* out, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  bf16_t* o = static_cast<bf16_t*>(out);
  if (cols % kNvBlock == 0 && reinterpret_cast<uintptr_t>(packed) % 8 == 0 &&
      reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    const unsigned grid = act_cuda::grid_stride_blocks(rows * (cols / kNvBlock), kThreads);
    decode_blocks_kernel<<<grid, kThreads, 0, stream>>>(packed, scales, rows, cols, o);
  } else {
    const unsigned grid = act_cuda::grid_stride_blocks(rows * cols, kThreads);
    decode_any_kernel<<<grid, kThreads, 0, stream>>>(packed, scales, rows, cols, o);
  }
  act_cuda::check_launch("NVFP4 GEMM operand decode");
}

}  // namespace te
