// The MXFP8 GEMM operand decode to bf16 (mxfp8.h, SPEC §6.7): the sm_90 GEMM's single bandwidth-bound pass over the
// operand, on the given stream, no allocation, no host synchronisation.
#include "mxfp8.h"

#include "../../rules/cuda_utils.cuh"

#include <algorithm>

namespace te {
namespace {

constexpr int kChunk = 16;  // codes a thread decodes: 16 bytes in, 32 bytes of bf16 out

TE_HD uint32_t pack_bf16x2(float lo, float hi) {
  return uint32_t(from_float<bf16_t>(lo).bits) | (uint32_t(from_float<bf16_t>(hi).bits) << 16);
}

// kVec: cols % 16 == 0 and 16-byte aligned codes; one 16-code chunk of one row a thread.
template <bool kVec>
__global__ void decode_mxfp8_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                                    int64_t rows, int64_t cols, bool k_cols, bool e4m3, bf16_t* __restrict__ out) {
  const int64_t chunks_per_row = (cols + kChunk - 1) / kChunk;
  const int64_t total = rows * chunks_per_row;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = t / chunks_per_row, c0 = (t % chunks_per_row) * kChunk;
    if constexpr (kVec) {
      const uint4 raw = *reinterpret_cast<const uint4*>(codes + r * cols + c0);
      const uint8_t* b = reinterpret_cast<const uint8_t*>(&raw);
      float s[kChunk];
      if (k_cols) {
        const float f = e8m0_to_float(scales[mx_row_scale_offset(r, c0 / kMxBlock, cols, true)]);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) s[i] = f;
      } else {
#pragma unroll
        for (int i = 0; i < kChunk; ++i) s[i] = e8m0_to_float(scales[mx_col_scale_offset(r / kMxBlock, c0 + i, rows, cols, true)]);
      }
      uint32_t w[kChunk / 2];
#pragma unroll
      for (int i = 0; i < kChunk / 2; ++i)
        w[i] = pack_bf16x2(fp8_to_float(b[2 * i], e4m3) * s[2 * i], fp8_to_float(b[2 * i + 1], e4m3) * s[2 * i + 1]);
      uint4* o = reinterpret_cast<uint4*>(out + r * cols + c0);
      o[0] = make_uint4(w[0], w[1], w[2], w[3]);
      o[1] = make_uint4(w[4], w[5], w[6], w[7]);
    } else {
      for (int64_t c = c0; c < c0 + kChunk && c < cols; ++c)
        out[r * cols + c] = from_float<bf16_t>(mx_gemm_decode(codes, scales, r, c, rows, cols, k_cols, e4m3));
    }
  }
}

}  // namespace

void decode_mxfp8_gemm_operand_cuda(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                                    bool k_cols, bool e4m3, void* out, cudaStream_t stream) {
  const int64_t chunks = rows * ((cols + kChunk - 1) / kChunk);
  if (chunks == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((chunks + kThreads - 1) / kThreads, int64_t(1) << 20);
  bf16_t* o = static_cast<bf16_t*>(out);
  const bool vec = cols % kChunk == 0 && reinterpret_cast<uintptr_t>(codes) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vec) {
    decode_mxfp8_kernel<true><<<unsigned(blocks), kThreads, 0, stream>>>(codes, scales, rows, cols, k_cols, e4m3, o);
  } else {
    decode_mxfp8_kernel<false><<<unsigned(blocks), kThreads, 0, stream>>>(codes, scales, rows, cols, k_cols, e4m3, o);
  }
  act_cuda::check_launch("MXFP8 GEMM operand decode");
}

}  // namespace te
