// The tile kernel of FP8 block quantization (fb_cuda::fp8_block_kernel): what the pipelined kernel of
// pipe_kernel.cuh leaves (ragged shapes, misaligned buffers), and fb_scale, the block scale both kernels use.
//
// Tile kernel (fb_cuda; everything else: ragged shapes, misaligned buffers). One block of 512 threads owns a 128x128
// tile at a time (grid-stride over tiles): thread t holds the 8 consecutive columns 8*(t%16).. of rows t/16,
// t/16 + 32, t/16 + 64, t/16 + 96 (4 passes, one 16-byte load per pass for 16-bit inputs, two for FP32; element
// loads on ragged or unaligned data). From that one read of x it derives
//   - block_dim 1, rowwise: the 1x128 block of each row is the 16 lanes of a half-warp (4 shuffles);
//   - block_dim 1, columnwise: the 128x1 block of each column: a max over the thread's 4 rows, the other
//     half-warp (1 shuffle), then the 16 warps through shared memory;
//   - block_dim 2: the tile amax (a warp reduction, then the 16 warps), one scale for both copies.
// 512 threads and 4 passes keep the tile in about 120 registers without spills (256 threads x 8 passes needed 212;
// capping either at 2 blocks per SM spills).
// Rowwise codes are stored 8 bytes per thread. Columnwise codes go through a 128x128 byte tile in shared memory
// (transposed; 16-byte chunks XOR-swizzled by column group to spread the byte writes over banks) and leave as
// 16-byte stores along the rows of x^T, byte stores where rows or col_data are not aligned.
//
// Both: scale padding entries are written as zero by the tiles on the last tile row / column; a noop launch returns
// before writing anything. No allocation, no host synchronisation, the caller's stream.
#pragma once

#include "../../rules/cuda_utils.cuh"
#include "quantize_fp8_block.h"

namespace te {
namespace fb_cuda {

constexpr int kThreads = 512;
constexpr int kTile = int(kFp8BlockLen);
constexpr int kVec = 8;                                  // columns per thread
constexpr int kLanesPerRow = kTile / kVec;               // 16: a tile row is a half-warp
constexpr int kRowsPerPass = kThreads / kLanesPerRow;    // 32
constexpr int kPasses = kTile / kRowsPerPass;            // 4
constexpr int kWarps = kThreads / 32;
constexpr int kChunks = kTile / 16;                      // 16-byte chunks per row of the transposed tile
static_assert(kLanesPerRow == 16, "a tile row must be one half-warp: the row reduction shuffles over 16 lanes");
static_assert(kPasses * kRowsPerPass == kTile && kRowsPerPass % 2 == 0, "passes cover the tile; a warp holds 2 rows");
static_assert((kTile * kChunks) % kThreads == 0, "the columnwise write-out splits evenly over the threads");

template <typename T> struct alignas(16) Vec8 {
  T e[kVec];
};

struct FbGeom {
  int64_t n_row_tiles = 0, n_col_tiles = 0, n_tiles = 0;
  bool vec_in = false;       // x 16-byte aligned and cols % 8 == 0: every full chunk is one aligned vector load
  bool vec_row_out = false;  // row_data 8-byte aligned and cols % 8 == 0
  bool vec_col_out = false;  // col_data 16-byte aligned and rows % 16 == 0
};

// The physical 16-byte chunk of chunk `ch` of transposed-tile row `cl` (an XOR swizzle by column group).
__device__ __forceinline__ int fb_chunk(int cl, int ch) { return ch ^ ((cl / kVec) % kChunks); }

__device__ __forceinline__ float fb_scale(float amax, const Fp8BlockParams& p, float in_max) {
  return fp8_block_scale(amax, fp8_max(p.e4m3), p.amax_epsilon, p.force_pow2, in_max);
}

// Eight values times `scale` -> eight FP8 codes (two little-endian words).
__device__ __forceinline__ uint2 fb_encode8(const float (&v)[kVec], float scale, bool e4m3) {
  uint32_t w[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t lo = float2_to_fp8x2(v[4 * h] * scale, v[4 * h + 1] * scale, e4m3);
    const uint32_t hi = float2_to_fp8x2(v[4 * h + 2] * scale, v[4 * h + 3] * scale, e4m3);
    w[h] = lo | (hi << 16);
  }
  return make_uint2(w[0], w[1]);
}

__device__ __forceinline__ uint8_t fb_byte(uint2 w, int k) { return uint8_t((k < 4 ? w.x : w.y) >> (8 * (k % 4))); }

template <typename InT>
__global__ void __launch_bounds__(kThreads) fp8_block_kernel(const Fp8BlockParams p, const FbGeom geo) {
  __shared__ float colmax[kWarps][kTile];            // per-warp column maxima (block_dim 1, columnwise)
  __shared__ float colscale[kTile];                  // the tile's column scales
  __shared__ float warpmax[kWarps];                  // per-warp tile maxima (block_dim 2)
  __shared__ __align__(16) uint8_t tbuf[kTile * kTile];  // columnwise codes, [column][row] of the tile

  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const int64_t rows = p.rows, cols = p.cols;
  const InT* x = static_cast<const InT*>(p.x);
  const int tid = threadIdx.x, lane16 = tid % kLanesPerRow, rsub = tid / kLanesPerRow;
  const int warp = tid / 32, lane = tid % 32;
  const bool want_row = p.row_data != nullptr, want_col = p.col_data != nullptr;
  const float in_max = input_max_finite<InT>();

  for (int64_t t = blockIdx.x; t < geo.n_tiles; t += gridDim.x) {
    const int64_t tr = t / geo.n_col_tiles, tc = t - tr * geo.n_col_tiles;
    const int64_t r0 = tr * kTile, c0 = tc * kTile;
    const int64_t c = c0 + lane16 * kVec;  // this thread's first column
    const int nc = c < cols ? int(cols - c < kVec ? cols - c : kVec) : 0;

    // ---- one read of x: 4 passes of 8 columns, kept in the input dtype (widened where used: exact) -----------
    Vec8<InT> raw[kPasses];
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int64_t r = r0 + i * kRowsPerPass + rsub;
      const InT* src = x + r * cols + c;
      if (r < rows && nc == kVec && geo.vec_in) {
        raw[i] = *reinterpret_cast<const Vec8<InT>*>(src);
      } else {
#pragma unroll
        for (int k = 0; k < kVec; ++k) raw[i].e[k] = (r < rows && k < nc) ? src[k] : from_float<InT>(0.0f);
      }
    }
    auto v = [&](int i, int k) { return to_float(raw[i].e[k]); };

    // ---- scales ---------------------------------------------------------------------------------------------
    float tile_scale = 1.0f;
    if (p.two_d) {
      float a = 0.0f;
#pragma unroll
      for (int i = 0; i < kPasses; ++i)
#pragma unroll
        for (int k = 0; k < kVec; ++k) a = amax_update(a, v(i, k));
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) a = amax_update(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
      if (lane == 0) warpmax[warp] = a;
      __syncthreads();
      a = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) a = amax_update(a, warpmax[w]);
      tile_scale = fb_scale(a, p, in_max);
      if (tid == 0) {
        const float si = 1.0f / tile_scale;
        if (want_row) p.row_scale[fb2_row_scale_offset(tr, tc, cols)] = si;
        if (want_col) p.col_scale[fb2_col_scale_offset(tr, tc, rows)] = si;
      }
    } else if (want_col) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        float a = 0.0f;
#pragma unroll
        for (int i = 0; i < kPasses; ++i) a = amax_update(a, v(i, k));
        a = amax_update(a, __shfl_xor_sync(0xFFFFFFFFu, a, 16));  // the other row of this warp
        if (lane < 16) colmax[warp][lane16 * kVec + k] = a;
      }
      __syncthreads();
      if (tid < kTile) {
        float a = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) a = amax_update(a, colmax[w][tid]);
        const float s = fb_scale(a, p, in_max);
        colscale[tid] = s;
        if (c0 + tid < cols) p.col_scale[fb1_col_scale_offset(tr, c0 + tid, cols)] = 1.0f / s;
      }
      __syncthreads();
    }

    // ---- rowwise codes (and, for 2-D, the columnwise codes: the same bytes) ----------------------------------
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int64_t r = r0 + i * kRowsPerPass + rsub;
      float s = tile_scale;
      if (!p.two_d) {
        if (!want_row) break;
        float a = 0.0f;
#pragma unroll
        for (int k = 0; k < kVec; ++k) a = amax_update(a, v(i, k));
#pragma unroll
        for (int o = kLanesPerRow / 2; o > 0; o >>= 1) a = amax_update(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
        s = fb_scale(a, p, in_max);
        if (lane16 == 0 && r < rows) p.row_scale[fb1_row_scale_offset(r, tc, rows)] = 1.0f / s;
      }
      float vi[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) vi[k] = v(i, k);
      const uint2 w = fb_encode8(vi, s, p.e4m3);
      if (want_row && r < rows && nc > 0) {
        uint8_t* dst = p.row_data + r * cols + c;
        if (nc == kVec && geo.vec_row_out) {
          *reinterpret_cast<uint2*>(dst) = w;
        } else {
#pragma unroll
          for (int k = 0; k < kVec; ++k)
            if (k < nc) dst[k] = fb_byte(w, k);
        }
      }
      if (p.two_d && want_col) {
        const int rl = i * kRowsPerPass + rsub;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const int cl = lane16 * kVec + k;
          tbuf[cl * kTile + fb_chunk(cl, rl / 16) * 16 + rl % 16] = fb_byte(w, k);
        }
      }
    }

    // ---- columnwise codes of 1-D (each column by its own scale) into the transposed tile -------------------
    if (!p.two_d && want_col) {
      float cs[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) cs[k] = colscale[lane16 * kVec + k];
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        float q[kVec];
#pragma unroll
        for (int k = 0; k < kVec; ++k) q[k] = v(i, k) * cs[k];
        const uint2 w = fb_encode8(q, 1.0f, p.e4m3);  // exact: q * 1 == q
        const int rl = i * kRowsPerPass + rsub;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const int cl = lane16 * kVec + k;
          tbuf[cl * kTile + fb_chunk(cl, rl / 16) * 16 + rl % 16] = fb_byte(w, k);
        }
      }
    }

    // ---- columnwise write-out: rows of x^T, 16 bytes at a time ----------------------------------------------
    if (want_col) {
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kTile * kChunks / kThreads; ++j) {
        const int item = tid + j * kThreads;
        const int cl = item / kChunks, ch = item % kChunks;
        const int64_t cc = c0 + cl, rr = r0 + ch * 16;
        if (cc >= cols || rr >= rows) continue;
        const uint4 chunk = *reinterpret_cast<const uint4*>(&tbuf[cl * kTile + fb_chunk(cl, ch) * 16]);
        uint8_t* dst = p.col_data + cc * rows + rr;
        if (geo.vec_col_out && rr + 16 <= rows) {
          *reinterpret_cast<uint4*>(dst) = chunk;
        } else {
          const uint32_t words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
#pragma unroll
          for (int b = 0; b < 16; ++b)
            if (rr + b < rows) dst[b] = uint8_t(words[b / 4] >> (8 * (b % 4)));
        }
      }
    }

    // ---- zero padding of the scale tensors (at most 3 entries per scale line) -------------------------------
    const bool last_r = tr == geo.n_row_tiles - 1, last_c = tc == geo.n_col_tiles - 1;
    if (tid < 3) {
      if (p.two_d) {
        const int64_t jr = geo.n_col_tiles + tid, ic = geo.n_row_tiles + tid;
        if (want_row && last_c && jr < roundup(geo.n_col_tiles, 4)) p.row_scale[fb2_row_scale_offset(tr, jr, cols)] = 0;
        if (want_col && last_r && ic < roundup(geo.n_row_tiles, 4)) p.col_scale[fb2_col_scale_offset(ic, tc, rows)] = 0;
      } else {
        const int64_t rp = rows + tid, cp = cols + tid;
        if (want_row && last_r && rp < roundup(rows, 4)) p.row_scale[fb1_row_scale_offset(rp, tc, rows)] = 0;
        if (want_col && last_c && cp < roundup(cols, 4)) p.col_scale[fb1_col_scale_offset(tr, cp, cols)] = 0;
      }
    }
    __syncthreads();  // shared buffers are reused by the next tile
  }
}

}  // namespace fb_cuda

}  // namespace te
