// The MXFP8 GEMM operand decode to bf16 (mxfp8.h, SPEC §6.7): the sm_90 GEMM's single bandwidth-bound pass over the
// operand, on the given stream, no allocation, no host synchronisation.
#include "mxfp8.h"

#include "../../rules/cuda_utils.cuh"

namespace te {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 16;     // rowwise copy: codes a thread decodes per step (16 bytes in, 32 bytes of bf16 out)
constexpr int kQuad = 4;       // columnwise copy: columns a thread decodes, down one 32-row block

using act_cuda::float2_to_bf16x2;
using act_cuda::fp8x2_to_float2;

// Four codes (one 32-bit word, element 0 in the low byte) times their scales as two bf16x2 words.
template <bool kE4M3> __device__ __forceinline__ uint2 decode4(uint32_t w, float s0, float s1, float s2, float s3) {
  float a, b, c, d;
  fp8x2_to_float2<kE4M3>(w, a, b);
  fp8x2_to_float2<kE4M3>(w >> 16, c, d);
  return make_uint2(float2_to_bf16x2(a * s0, b * s1), float2_to_bf16x2(c * s2, d * s3));
}

// The rowwise copy (blocks along cols; cols % 16 == 0, 16-byte aligned): one 16-code chunk a thread over a grid of
// every chunk (many small independent loads in flight: measured faster than fewer threads looping), one scale per
// chunk (a chunk lies in one 32-block).
template <bool kE4M3>
__global__ void __launch_bounds__(kThreads) decode_rows_kernel(const uint8_t* __restrict__ codes,
                                                               const uint8_t* __restrict__ scales, int64_t rows,
                                                               int64_t cols, bf16_t* __restrict__ out) {
  const int64_t chunks = cols / kChunk, total = rows * chunks;
  const int64_t cpad = roundup(ceil_div(cols, kMxBlock), 4);
  for (int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x; t < total; t += int64_t(gridDim.x) * kThreads) {
    const int64_t r = t / chunks, ch = t % chunks;
    uint4 raw;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
        : "l"(codes + t * kChunk));
    const float f = e8m0_to_float(__ldg(scales + swizzled_scale_offset(r, ch / (kMxBlock / kChunk), cpad)));
    const uint2 o0 = decode4<kE4M3>(raw.x, f, f, f, f), o1 = decode4<kE4M3>(raw.y, f, f, f, f);
    const uint2 o2 = decode4<kE4M3>(raw.z, f, f, f, f), o3 = decode4<kE4M3>(raw.w, f, f, f, f);
    uint4* o = reinterpret_cast<uint4*>(out + t * kChunk);
    o[0] = make_uint4(o0.x, o0.y, o1.x, o1.y);
    o[1] = make_uint4(o2.x, o2.y, o3.x, o3.y);
  }
}

// The columnwise copy (blocks along rows; rows % 32 == 0, cols % 4 == 0, 4-byte aligned): one thread a 4-column
// quad of one 32-row block: its four scales loaded once, then 32 rows of one 32-bit load and one 64-bit store each
// (a warp covers 128 consecutive columns: coalesced rows).
template <bool kE4M3>
__global__ void __launch_bounds__(kThreads) decode_cols_kernel(const uint8_t* __restrict__ codes,
                                                               const uint8_t* __restrict__ scales, int64_t rows,
                                                               int64_t cols, bf16_t* __restrict__ out) {
  const int64_t quads = cols / kQuad, items = (rows / kMxBlock) * quads;
  const int64_t cpad = roundup(ceil_div(rows, kMxBlock), 4);
  for (int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x; t < items; t += int64_t(gridDim.x) * kThreads) {
    const int64_t i = t / quads, c0 = (t % quads) * kQuad;
    float s[kQuad];
#pragma unroll
    for (int j = 0; j < kQuad; ++j) s[j] = e8m0_to_float(__ldg(scales + swizzled_scale_offset(c0 + j, i, cpad)));
    const uint8_t* in = codes + i * kMxBlock * cols + c0;
    bf16_t* o = out + i * kMxBlock * cols + c0;
#pragma unroll 8
    for (int rr = 0; rr < kMxBlock; ++rr) {
      uint32_t w;
      asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(w) : "l"(in + rr * cols));
      *reinterpret_cast<uint2*>(o + rr * cols) = decode4<kE4M3>(w, s[0], s[1], s[2], s[3]);
    }
  }
}

// Any shape or alignment: one element a thread (mx_gemm_decode, the CPU kernel's rule).
__global__ void decode_any_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales, int64_t rows,
                                  int64_t cols, bool k_cols, bool e4m3, bf16_t* __restrict__ out) {
  const int64_t n = rows * cols;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x) {
    out[t] = from_float<bf16_t>(mx_gemm_decode(codes, scales, t / cols, t % cols, rows, cols, k_cols, e4m3));
  }
}

}  // namespace

void decode_mxfp8_gemm_operand_cuda(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                                    bool k_cols, bool e4m3, void* out, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  bf16_t* o = static_cast<bf16_t*>(out);
  const auto aligned = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  if (k_cols && cols % kChunk == 0 && aligned(codes, 16) && aligned(out, 16)) {
    const unsigned grid = act_cuda::grid_stride_blocks(rows * (cols / kChunk), kThreads);
    if (e4m3) {
      decode_rows_kernel<true><<<grid, kThreads, 0, stream>>>(codes, scales, rows, cols, o);
    } else {
      decode_rows_kernel<false><<<grid, kThreads, 0, stream>>>(codes, scales, rows, cols, o);
    }
  } else if (!k_cols && rows % kMxBlock == 0 && cols % kQuad == 0 && aligned(codes, 4) && aligned(out, 8)) {
    const unsigned grid = act_cuda::grid_stride_blocks((rows / kMxBlock) * (cols / kQuad), kThreads);
    if (e4m3) {
      decode_cols_kernel<true><<<grid, kThreads, 0, stream>>>(codes, scales, rows, cols, o);
    } else {
      decode_cols_kernel<false><<<grid, kThreads, 0, stream>>>(codes, scales, rows, cols, o);
    }
  } else {
    const unsigned grid = act_cuda::grid_stride_blocks(rows * cols, kThreads);
    decode_any_kernel<<<grid, kThreads, 0, stream>>>(codes, scales, rows, cols, k_cols, e4m3, o);
  }
  act_cuda::check_launch("MXFP8 GEMM operand decode");
}

}  // namespace te
