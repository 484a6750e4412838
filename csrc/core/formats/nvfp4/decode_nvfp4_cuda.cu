// The NVFP4 GEMM operand decode to bf16 (quantize_nvfp4.h, SPEC §6.7): the sm_90 GEMM's single bandwidth-bound pass
// over the operand, on the given stream, no allocation, no host synchronisation.
#include "quantize_nvfp4.h"

#include <algorithm>

#include "../../rules/cuda_utils.cuh"

namespace te {
namespace {

TE_HD uint32_t pack_bf16x2(float lo, float hi) {
  return uint32_t(from_float<bf16_t>(lo).bits) | (uint32_t(from_float<bf16_t>(hi).bits) << 16);
}

// One 16-element block (8 packed bytes, one E4M3 scale) a thread; cols % 16 == 0 (the GEMM's K rule).
template <bool kVec>
__global__ void decode_nvfp4_kernel(const uint8_t* __restrict__ packed, const uint8_t* __restrict__ scales,
                                    int64_t rows, int64_t cols, bf16_t* __restrict__ out) {
  const int64_t blocks_per_row = cols / kNvBlock;
  const int64_t total = rows * blocks_per_row;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = t / blocks_per_row, j = t % blocks_per_row, c0 = j * kNvBlock;
    if constexpr (kVec) {
      const float s = fp8_to_float(scales[nv_row_scale_offset(r, j, cols, true)], true);
      const uint2 raw = *reinterpret_cast<const uint2*>(packed + (r * cols + c0) / 2);
      const uint8_t* b = reinterpret_cast<const uint8_t*>(&raw);
      uint32_t w[8];
#pragma unroll
      for (int i = 0; i < 8; ++i)
        w[i] = pack_bf16x2(e2m1_decode(uint8_t(b[i] & 0xFu)) * s, e2m1_decode(uint8_t(b[i] >> 4)) * s);
      uint4* o = reinterpret_cast<uint4*>(out + r * cols + c0);
      o[0] = make_uint4(w[0], w[1], w[2], w[3]);
      o[1] = make_uint4(w[4], w[5], w[6], w[7]);
    } else {
      for (int64_t c = c0; c < c0 + kNvBlock; ++c)
        out[r * cols + c] = from_float<bf16_t>(nv_gemm_decode(packed, scales, r, c, cols));
    }
  }
}

}  // namespace

void decode_nvfp4_gemm_operand_cuda(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols,
                                    void* out, cudaStream_t stream) {
  const int64_t n = rows * (cols / kNvBlock);
  if (n == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t(1) << 20);
  bf16_t* o = static_cast<bf16_t*>(out);
  const bool vec = reinterpret_cast<uintptr_t>(packed) % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vec) {
    decode_nvfp4_kernel<true><<<unsigned(blocks), kThreads, 0, stream>>>(packed, scales, rows, cols, o);
  } else {
    decode_nvfp4_kernel<false><<<unsigned(blocks), kThreads, 0, stream>>>(packed, scales, rows, cols, o);
  }
  act_cuda::check_launch("NVFP4 GEMM operand decode");
}

}  // namespace te
