// CUDA kernels of NVFP4 quantization (see quantize_nvfp4.h), sm_90, current stream, no host sync, no allocation.
// Cast kernel: one block of 256 threads per tile of 16 rows x 256 columns (grid-stride over tiles). The tile is
// widened into shared memory once; thread t then encodes rowwise block (row t/16, block t%16) and columnwise
// block (column t, the tile's 16 rows), the latter Hadamard-transformed when requested, exactly as the CPU kernel
// (same encoders, same Philox counters), so the bytes are identical. Block 0 copies the global amaxes to the
// tensor's fields; every block zeroes a slice of the scale padding (so a noop launch writes nothing at all).
// Amax kernels: without RHT a flat max over 16-byte chunks (both copies' amax is the tensor's); with RHT one thread
// per (16-row group, column), max of |x| and of |RHT(column segment)|; atomicMax on the bits.
#include "quantize_nvfp4.h"

#include "../../rules/cuda_utils.cuh"

namespace te {
namespace {

constexpr int kThreads = 256;
constexpr int kTileCols = 256;
constexpr int kBlkStride = 17;                 // floats per 16-wide segment in shared memory (16 + 1: no bank conflicts)
constexpr int kRowStride = (kTileCols / 16) * kBlkStride;

__device__ __forceinline__ void atomic_max_nonneg(float* addr, float v) {
  // Non-negative floats order like their bit patterns.
  atomicMax(reinterpret_cast<unsigned int*>(addr), __float_as_uint(v));
}

template <typename InT> __global__ void __launch_bounds__(kThreads) nvfp4_amax_kernel(Nvfp4AmaxParams p) {
  const InT* x = static_cast<const InT*>(p.x);
  const int64_t groups = ceil_div(p.rows, kNvBlock);
  const int64_t n = groups * p.cols;
  float ar = 0.0f, ac = 0.0f;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t c = i % p.cols, g = i / p.cols;
    const int64_t r0 = g * kNvBlock;
    const int nr = int(p.rows - r0 < kNvBlock ? p.rows - r0 : kNvBlock);
    float v[16];
    #pragma unroll
    for (int k = 0; k < 16; ++k) {
      v[k] = k < nr ? to_float(x[(r0 + k) * p.cols + c]) : 0.0f;
      ar = amax_update(ar, v[k]);
    }
    if (p.rht && nr == kNvBlock) {
      float y[16];
      rht16(v, p.rht_sign_mask, y);
      #pragma unroll
      for (int k = 0; k < 16; ++k) ac = amax_update(ac, y[k]);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    ar = fmaxf(ar, __shfl_xor_sync(0xFFFFFFFFu, ar, o));
    ac = fmaxf(ac, __shfl_xor_sync(0xFFFFFFFFu, ac, o));
  }
  if ((threadIdx.x & 31) == 0) {
    if (ar > 0.0f) atomic_max_nonneg(p.amax_row, ar);
    if (p.amax_col != nullptr && (p.rht ? ac : ar) > 0.0f) atomic_max_nonneg(p.amax_col, p.rht ? ac : ar);
  }
}

// Without RHT both copies' global amax is the tensor's: a flat max over 16-byte chunks, four in flight a thread
// (order-independent: NaN is ignored, SPEC §4.1), then the scalar tail; one atomic a warp.
constexpr int kAmaxUnroll = 4;
template <typename InT> __global__ void __launch_bounds__(kThreads) nvfp4_amax_flat_kernel(Nvfp4AmaxParams p) {
  const InT* x = static_cast<const InT*>(p.x);
  const int64_t n = p.rows * p.cols, n_chunks = n / act_cuda::kVec;
  const int64_t stride = int64_t(gridDim.x) * kThreads, gid = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  float a = 0.0f;
  int64_t i = gid;
  for (; i + (kAmaxUnroll - 1) * stride < n_chunks; i += kAmaxUnroll * stride) {
    act_cuda::Vec8<InT> v[kAmaxUnroll];
#pragma unroll
    for (int u = 0; u < kAmaxUnroll; ++u) v[u] = act_cuda::load8(x + (i + u * stride) * act_cuda::kVec, true, act_cuda::kVec);
#pragma unroll
    for (int u = 0; u < kAmaxUnroll; ++u)
#pragma unroll
      for (int k = 0; k < act_cuda::kVec; ++k) a = amax_update(a, to_float(v[u].e[k]));
  }
  for (; i < n_chunks; i += stride) {
    const act_cuda::Vec8<InT> v = act_cuda::load8(x + i * act_cuda::kVec, true, act_cuda::kVec);
#pragma unroll
    for (int k = 0; k < act_cuda::kVec; ++k) a = amax_update(a, to_float(v.e[k]));
  }
  if (gid < n - n_chunks * act_cuda::kVec) a = amax_update(a, to_float(x[n_chunks * act_cuda::kVec + gid]));
  for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
  if ((threadIdx.x & 31) == 0 && a > 0.0f) {
    atomic_max_nonneg(p.amax_row, a);
    if (p.amax_col != nullptr) atomic_max_nonneg(p.amax_col, a);
  }
}

__device__ __forceinline__ void store8(uint8_t* dst, const uint8_t b[8]) {
  uint2 w;
  w.x = uint32_t(b[0]) | (uint32_t(b[1]) << 8) | (uint32_t(b[2]) << 16) | (uint32_t(b[3]) << 24);
  w.y = uint32_t(b[4]) | (uint32_t(b[5]) << 8) | (uint32_t(b[6]) << 16) | (uint32_t(b[7]) << 24);
  *reinterpret_cast<uint2*>(dst) = w;  // 8-byte aligned: row/column starts are multiples of 8 bytes
}

// Zeroes the padding entries of the scale tensors (grid-stride over the padded index space; only where there is
// padding), so that every byte of a quantized tensor is written by one launch.
__device__ void zero_scale_padding(const Nvfp4Params& p) {
  const int t = threadIdx.x;
  const int64_t rows = p.rows, cols = p.cols, nblk = cols / kNvBlock;
  const Nvfp4ScaleShapes s = nvfp4_scale_shapes(rows, cols);
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  if (p.row_data != nullptr && (s.row_r > rows || s.row_c > nblk)) {  // only where there is padding
    for (int64_t i = int64_t(blockIdx.x) * kThreads + t; i < s.row_r * s.row_c; i += stride) {
      const int64_t r = i / s.row_c, c = i % s.row_c;
      if (r >= rows || c >= nblk) p.row_scale[nv_row_scale_offset(r, c, cols, p.swizzled)] = 0;
    }
  }
  if (p.col_data != nullptr && (s.col_r > cols || s.col_c > rows / kNvBlock)) {
    for (int64_t i = int64_t(blockIdx.x) * kThreads + t; i < s.col_r * s.col_c; i += stride) {
      const int64_t r = i / s.col_c, c = i % s.col_c;
      if (r >= cols || c >= rows / kNvBlock) p.col_scale[nv_col_scale_offset(r, c, rows, p.swizzled)] = 0;
    }
  }
}

// The global scales of a cast's two copies and its rounding key; block 0 copies the global amaxes to the tensor's
// fields.
struct CastGlobals {
  float s_enc_row, s_enc_col, s_dec_row, s_dec_col;
  RngKey key;
};
__device__ __forceinline__ CastGlobals cast_globals(const Nvfp4Params& p) {
  const float amax_row = *p.amax_in_row, amax_col = *p.amax_in_col;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (p.amax_out_row) *p.amax_out_row = amax_row;
    if (p.amax_out_col) *p.amax_out_col = amax_col;
  }
  CastGlobals g;
  g.s_enc_row = nvfp4_global_scale(amax_row);
  g.s_enc_col = nvfp4_global_scale(amax_col);
  g.s_dec_row = 1.0f / g.s_enc_row;
  g.s_dec_col = 1.0f / g.s_enc_col;
  g.key = p.sr ? rng_unpack(p.rng) : RngKey{0, 0};
  return g;
}

template <typename InT> __global__ void __launch_bounds__(kThreads) nvfp4_cast_kernel(Nvfp4Params p) {
  if (p.noop != nullptr && *p.noop == 1.0f) return;
  __shared__ float tile[16 * kRowStride];
  __shared__ float seg_amax[16][16];  // [row][16-col segment] block amaxes, for the 2-D tile amax
  const int t = threadIdx.x;
  const int64_t rows = p.rows, cols = p.cols, nblk = cols / kNvBlock;
  const CastGlobals gs = cast_globals(p);
  const int64_t row_tiles = ceil_div(rows, kNvBlock), col_tiles = ceil_div(cols, kTileCols);
  const InT* x = static_cast<const InT*>(p.x);
  for (int64_t tile_id = blockIdx.x; tile_id < row_tiles * col_tiles; tile_id += gridDim.x) {
    const int64_t rt = tile_id / col_tiles, ct = tile_id % col_tiles;
    const int64_t r0 = rt * kNvBlock, c0 = ct * kTileCols;
    const int nr = int(rows - r0 < kNvBlock ? rows - r0 : kNvBlock);
    const int nc = int(cols - c0 < kTileCols ? cols - c0 : kTileCols);
    __syncthreads();  // the previous tile's readers are done
    #pragma unroll
    for (int i = 0; i < 16; ++i) {
      const float v = (i < nr && t < nc) ? to_float(x[(r0 + i) * cols + c0 + t]) : 0.0f;
      tile[i * kRowStride + (t / 16) * kBlkStride + t % 16] = v;
    }
    __syncthreads();
    // Rowwise block (row t/16, segment t%16): its amax (also what the 2-D tile amax is made of).
    const int rr = t / 16, rs = t % 16;
    const bool row_valid = rr < nr && rs * 16 < nc;
    float rv[16];
    float ramax = 0.0f;
    #pragma unroll
    for (int k = 0; k < 16; ++k) {
      rv[k] = tile[rr * kRowStride + rs * kBlkStride + k];
      ramax = amax_update(ramax, rv[k]);
    }
    if (p.two_d) {
      seg_amax[rr][rs] = ramax;  // rows past nr hold zeros: they do not change the max
      __syncthreads();
    }
    if (p.row_data != nullptr && row_valid) {
      float amax = ramax;
      if (p.two_d) {
        amax = 0.0f;
        #pragma unroll
        for (int i = 0; i < 16; ++i) amax = amax_update(amax, seg_amax[i][rs]);
      }
      const int64_t r = r0 + rr, b = c0 / kNvBlock + rs;
      uint8_t out[8];
      nvfp4_emit_block(rv, amax, gs.s_enc_row, gs.s_dec_row, p.sr, gs.key, r * nblk + b, 0,
                       &p.row_scale[nv_row_scale_offset(r, b, cols, p.swizzled)], out);
      store8(p.row_data + r * (cols / 2) + b * 8, out);
    }
    // Columnwise block (column t, the tile's 16 rows; rows % 16 == 0 here).
    if (p.col_data != nullptr && t < nc) {
      float cv[16], y[16];
      #pragma unroll
      for (int i = 0; i < 16; ++i) cv[i] = tile[i * kRowStride + (t / 16) * kBlkStride + t % 16];
      const float* vals = cv;
      if (p.rht) {
        rht16(cv, p.rht_sign_mask, y);
        vals = y;
      }
      float amax = 0.0f;
      if (p.two_d) {
        #pragma unroll
        for (int i = 0; i < 16; ++i) amax = amax_update(amax, seg_amax[i][t / 16]);
      } else {
        #pragma unroll
        for (int k = 0; k < 16; ++k) amax = amax_update(amax, vals[k]);
      }
      const int64_t c = c0 + t;
      uint8_t out[8];
      nvfp4_emit_block(vals, amax, gs.s_enc_col, gs.s_dec_col, p.sr, gs.key, c * (rows / kNvBlock) + rt, 1,
                       &p.col_scale[nv_col_scale_offset(c, rt, rows, p.swizzled)], out);
      store8(p.col_data + c * (rows / 2) + rt * 8, out);
    }
  }
  zero_scale_padding(p);
}

// The cast of full 32-row x 256-column tiles (rows % 32 == 0, cols % 256 == 0, 16-byte aligned input): the same
// blocks, encoders and Philox counters as nvfp4_cast_kernel, so the same bytes, with wide memory accesses. Thread t
// loads the two 16-element row segments (rows t/16 and t/16 + 16, segment t%16) as 16-byte vectors and encodes those
// rowwise blocks from its registers; the tile goes through shared memory once for the columnwise blocks, and thread
// t encodes column t's two 16-row blocks and stores their 16 bytes at once (one 16-byte store a column instead of
// two 8-byte ones rows/2 bytes apart).
constexpr int kFastRows = 32;
template <typename InT> __global__ void __launch_bounds__(kThreads) nvfp4_cast_fast_kernel(Nvfp4Params p) {
  if (p.noop != nullptr && *p.noop == 1.0f) return;
  __shared__ float tile[kFastRows * kRowStride];
  __shared__ float seg_amax[kFastRows][16];  // [row][16-col segment] block amaxes, for the 2-D tile amax
  const int t = threadIdx.x;
  const int64_t rows = p.rows, cols = p.cols, nblk = cols / kNvBlock;
  const CastGlobals gs = cast_globals(p);
  const int64_t col_tiles = cols / kTileCols, tiles = (rows / kFastRows) * col_tiles;
  const InT* x = static_cast<const InT*>(p.x);
  const int g = t / 16, sg = t % 16;  // row group (rows g, g + 16) and 16-column segment of this thread
  for (int64_t tile_id = blockIdx.x; tile_id < tiles; tile_id += gridDim.x) {
    const int64_t r0 = (tile_id / col_tiles) * kFastRows, c0 = (tile_id % col_tiles) * kTileCols;
    float rv[2][16];
    float ramax[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const InT* src = x + (r0 + g + 16 * h) * cols + c0 + sg * 16;
      const act_cuda::Vec8<InT> a = act_cuda::load8(src, true, act_cuda::kVec);
      const act_cuda::Vec8<InT> b = act_cuda::load8(src + 8, true, act_cuda::kVec);
      ramax[h] = 0.0f;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        rv[h][k] = to_float(a.e[k]);
        rv[h][8 + k] = to_float(b.e[k]);
      }
#pragma unroll
      for (int k = 0; k < 16; ++k) ramax[h] = amax_update(ramax[h], rv[h][k]);
    }
    __syncthreads();  // the previous tile's readers are done
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int k = 0; k < 16; ++k) tile[(g + 16 * h) * kRowStride + sg * kBlkStride + k] = rv[h][k];
      if (p.two_d) seg_amax[g + 16 * h][sg] = ramax[h];
    }
    __syncthreads();
    if (p.row_data != nullptr) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float amax = ramax[h];
        if (p.two_d) {
          amax = 0.0f;
#pragma unroll
          for (int i = 0; i < 16; ++i) amax = amax_update(amax, seg_amax[16 * h + i][sg]);
        }
        const int64_t r = r0 + g + 16 * h, b = c0 / kNvBlock + sg;
        uint8_t out[8];
        nvfp4_emit_block(rv[h], amax, gs.s_enc_row, gs.s_dec_row, p.sr, gs.key, r * nblk + b, 0,
                         &p.row_scale[nv_row_scale_offset(r, b, cols, p.swizzled)], out);
        store8(p.row_data + r * (cols / 2) + b * 8, out);
      }
    }
    if (p.col_data != nullptr) {
      uint8_t out[16];
      const int64_t c = c0 + t;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float cv[16], y[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) cv[i] = tile[(16 * h + i) * kRowStride + (t / 16) * kBlkStride + t % 16];
        const float* vals = cv;
        if (p.rht) {
          rht16(cv, p.rht_sign_mask, y);
          vals = y;
        }
        float amax = 0.0f;
        if (p.two_d) {
#pragma unroll
          for (int i = 0; i < 16; ++i) amax = amax_update(amax, seg_amax[16 * h + i][t / 16]);
        } else {
#pragma unroll
          for (int k = 0; k < 16; ++k) amax = amax_update(amax, vals[k]);
        }
        const int64_t rt = r0 / kNvBlock + h;
        nvfp4_emit_block(vals, amax, gs.s_enc_col, gs.s_dec_col, p.sr, gs.key, c * (rows / kNvBlock) + rt, 1,
                         &p.col_scale[nv_col_scale_offset(c, rt, rows, p.swizzled)], out + 8 * h);
      }
      uint4 w;
      w.x = uint32_t(out[0]) | (uint32_t(out[1]) << 8) | (uint32_t(out[2]) << 16) | (uint32_t(out[3]) << 24);
      w.y = uint32_t(out[4]) | (uint32_t(out[5]) << 8) | (uint32_t(out[6]) << 16) | (uint32_t(out[7]) << 24);
      w.z = uint32_t(out[8]) | (uint32_t(out[9]) << 8) | (uint32_t(out[10]) << 16) | (uint32_t(out[11]) << 24);
      w.w = uint32_t(out[12]) | (uint32_t(out[13]) << 8) | (uint32_t(out[14]) << 16) | (uint32_t(out[15]) << 24);
      *reinterpret_cast<uint4*>(p.col_data + c * (rows / 2) + (r0 / kNvBlock) * 8) = w;  // rows % 32: 16-aligned
    }
  }
  zero_scale_padding(p);
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) core_fail(std::string(what) + ": kernel launch failed: " + cudaGetErrorString(e));
}

int grid_for(int64_t work, int64_t per_block) {
  int64_t g = ceil_div(work, per_block);
  if (g < 1) g = 1;
  return int(g < 65535 * 8 ? g : 65535 * 8);
}

}  // namespace

void nvfp4_amax_cuda(DType in_dtype, const Nvfp4AmaxParams& p, cudaStream_t s) {
  const int64_t n = ceil_div(p.rows, kNvBlock) * p.cols;
  if (n == 0) return;
  if (!p.rht && reinterpret_cast<uintptr_t>(p.x) % 16 == 0) {
    const int64_t chunks = p.rows * p.cols / act_cuda::kVec;
    const int64_t blocks = std::min<int64_t>(std::max<int64_t>(ceil_div(chunks, int64_t(kThreads) * kAmaxUnroll), 1),
                                             4 * int64_t(act_cuda::device_sm_count_or_default()));
    TE_SWITCH_IN_DTYPE(in_dtype, T, { nvfp4_amax_flat_kernel<T><<<unsigned(blocks), kThreads, 0, s>>>(p); });
    return check_launch("nvfp4_amax");
  }
  TE_SWITCH_IN_DTYPE(in_dtype, T, {
    nvfp4_amax_kernel<T><<<grid_for(n, kThreads * 4), kThreads, 0, s>>>(p);
  });
  check_launch("nvfp4_amax");
}

void quantize_nvfp4_cuda(DType in_dtype, const Nvfp4Params& p, cudaStream_t s) {
  // One launch even for an empty tensor: block 0 writes the amax fields and the padding is zeroed.
  const auto aligned = [](const void* ptr) { return ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  if (p.rows > 0 && p.rows % kFastRows == 0 && p.cols % kTileCols == 0 && aligned(p.x) && aligned(p.row_data) &&
      aligned(p.col_data)) {
    const int64_t tiles = (p.rows / kFastRows) * (p.cols / kTileCols);
    TE_SWITCH_IN_DTYPE(in_dtype, T, {
      nvfp4_cast_fast_kernel<T><<<grid_for(tiles, 1), kThreads, 0, s>>>(p);
    });
  } else {
    const int64_t tiles = ceil_div(p.rows, kNvBlock) * ceil_div(p.cols, kTileCols);
    TE_SWITCH_IN_DTYPE(in_dtype, T, {
      nvfp4_cast_kernel<T><<<grid_for(tiles, 1), kThreads, 0, s>>>(p);
    });
  }
  check_launch("quantize_nvfp4");
}

}  // namespace te
