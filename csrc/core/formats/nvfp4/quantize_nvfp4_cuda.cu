// CUDA kernels of NVFP4 quantization (see quantize_nvfp4.h), sm_90, current stream, no host sync, no allocation.
// Cast kernel: one block of 256 threads per tile of 16 rows x 256 columns (grid-stride over tiles). The tile is
// widened into shared memory once; thread t then encodes rowwise block (row t/16, block t%16) and columnwise
// block (column t, the tile's 16 rows), the latter Hadamard-transformed when requested, exactly as the CPU kernel
// (same encoders, same Philox counters), so the bytes are identical. Block 0 copies the global amaxes to the
// tensor's fields; every block zeroes a slice of the scale padding (so a noop launch writes nothing at all).
// Amax kernels: without RHT a flat max over 16-byte chunks (both copies' amax is the tensor's); with RHT one thread
// per (16-row group, column), max of |x| and of |RHT(column segment)|; atomicMax on the bits.
#include "quantize_nvfp4.h"

#include <type_traits>

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
    for (int u = 0; u < kAmaxUnroll; ++u)
      v[u] = act_cuda::load8(x + (i + u * stride) * act_cuda::kVec, true, act_cuda::kVec);
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

// The block's index in a 1-D or 2-D grid, and the grid's size.
__device__ __forceinline__ int64_t linear_block() { return int64_t(blockIdx.y) * gridDim.x + blockIdx.x; }
__device__ __forceinline__ int64_t grid_blocks() { return int64_t(gridDim.y) * gridDim.x; }

// Zeroes the padding entries of the scale tensors (grid-stride over the padded index space; only where there is
// padding), so that every byte of a quantized tensor is written by one launch.
__device__ void zero_scale_padding(const Nvfp4Params& p) {
  const int t = threadIdx.x;
  const int64_t rows = p.rows, cols = p.cols, nblk = cols / kNvBlock;
  const Nvfp4ScaleShapes s = nvfp4_scale_shapes(rows, cols);
  const int64_t stride = grid_blocks() * kThreads;
  if (p.row_data != nullptr && (s.row_r > rows || s.row_c > nblk)) {  // only where there is padding
    for (int64_t i = linear_block() * kThreads + t; i < s.row_r * s.row_c; i += stride) {
      const int64_t r = i / s.row_c, c = i % s.row_c;
      if (r >= rows || c >= nblk) p.row_scale[nv_row_scale_offset(r, c, cols, p.swizzled)] = 0;
    }
  }
  if (p.col_data != nullptr && (s.col_r > cols || s.col_c > rows / kNvBlock)) {
    for (int64_t i = linear_block() * kThreads + t; i < s.col_r * s.col_c; i += stride) {
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
  if (linear_block() == 0 && threadIdx.x == 0) {
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
// blocks, encoders and Philox counters as nvfp4_cast_kernel, so the same bytes, with wide memory accesses and the
// options as template flags (each launch runs the straight-line code of its path). Thread t loads the two 16-element
// row segments (rows t/16 and t/16 + 16, segment t%16) as 16-byte vectors and encodes those rowwise blocks from its
// registers; the tile goes through shared memory once for the columnwise blocks, and thread t encodes column t's two
// 16-row blocks and stores their 16 bytes at once (one 16-byte store a column instead of two 8-byte ones rows/2
// bytes apart).
constexpr int kFastRows = 32;

// Shared memory of the fast cast. tile: FP32 [32][256] row-major, the four 16-byte chunks of each 16-column segment
// sg permuted by XOR with (sg / 2) % 4, so that the rowwise threads' 16-byte stores (eight segments a quarter warp)
// and the columnwise threads' 4-byte loads (two segments a warp) touch every bank once. With RHT the tile holds the
// columnwise copy's Hadamard inputs s_i * x / 4 (the rowwise blocks are encoded from registers). seg_amax: 2-D only,
// [half][segment][warp] the max over the warp's two rows of the half. enc: the block multipliers of scale codes
// 0..127 of the rowwise and the columnwise copy (a scale code is <= 0x7E: the block amax is NaN-free).
struct FastSmem {
  float tile[kFastRows * kTileCols];
  float seg_amax[2][16][8];
  float enc[2][128];
};
__device__ __forceinline__ int fast_tile_index(int row, int col) {
  const int sg = col / 16, chunk = (col / 4) % 4;
  return row * kTileCols + sg * 16 + ((chunk ^ ((sg / 2) % 4)) * 4) + col % 4;
}

// max(running, |v|) propagating NaN (PTX max.NaN): over a block, NaN if any value is NaN, else +Inf if any is
// infinite, else amax_update's maximum; so whether every value is finite is one compare.
__device__ __forceinline__ float amax_nan_update(float running, float v) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(running), "f"(fabsf(v)));
  return r;
}
// A block's amax (amax_update's, NaN ignored) and whether all its values are finite.
struct BlockMax {
  float amax;
  bool finite;
};
__device__ __forceinline__ BlockMax block_max(const float v[16]) {
  float m = 0.0f;
#pragma unroll
  for (int k = 0; k < 16; ++k) m = amax_nan_update(m, v[k]);
  const bool finite = m <= kFloatMax;  // false for NaN and +Inf
  if (!finite) {  // rare: the NaN-ignoring amax of SPEC §2
    m = 0.0f;
#pragma unroll
    for (int k = 0; k < 16; ++k) m = amax_update(m, v[k]);
  }
  return {m, finite};
}

// Eight raw input values widened to FP32 (bf16: from the four 32-bit words, one shift or mask each).
template <typename InT> __device__ __forceinline__ void widen8(const act_cuda::Vec8<InT>& raw, float* v) {
  if constexpr (std::is_same_v<InT, bf16_t>) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t b = act_cuda::raw_word(raw, w);
      v[2 * w] = bits_float(b << 16);
      v[2 * w + 1] = bits_float(b & 0xFFFF0000u);
    }
  } else {
#pragma unroll
    for (int k = 0; k < act_cuda::kVec; ++k) v[k] = to_float(raw.e[k]);
  }
}

// One block: its E4M3 scale code from `scale_amax` into *scale and its two code words (nvfp4_encode_words; `amax`
// bounds the values' magnitudes, `finite` says they are all finite). The code is float2_to_fp8x2's low byte
// (nvfp4_block_scale; the high byte, the code of 0, is 0) and indexes the copy's multiplier table.
template <bool kSr>
__device__ __forceinline__ uint2 fast_block(const float v[16], float scale_amax, float amax, bool finite,
                                            float s_enc6, const float* enc_tab, const RngKey& key, int64_t counter,
                                            int copy, uint8_t* scale) {
  const uint32_t sf = float2_to_fp8x2<true>(scale_amax * s_enc6, 0.0f);
  *scale = uint8_t(sf);
  Philox4 bits;
  if (kSr) bits = nvfp4_block_bits(key, counter, copy);
  uint32_t w[2];
  nvfp4_encode_words(v, enc_tab[sf], amax, finite, kSr ? &bits : nullptr, w);
  return make_uint2(w[0], w[1]);
}

// Offsets of a thread's data in the fast cast's tile at rows r0.., columns c0.. (elements of x; bytes of the data and
// scale tensors; Philox block counters) for its first 16-row half, as the sum of a part of the tile (FastOffsets
// ::tile, the same for the whole block) and a part of the thread (::thread, the same for every tile): both split
// exactly because r0 % 32 == 0 and c0 % 256 == 0 (the swizzled layout's 128-row and 4-column tiles, SPEC §4.8, are
// then cut only along the thread's coordinates).
struct FastOffsets {
  int64_t x, row_data, row_scale, row_ctr, col_data, col_scale, col_ctr;
  __device__ __forceinline__ FastOffsets operator+(const FastOffsets& o) const {
    return {x + o.x, row_data + o.row_data, row_scale + o.row_scale, row_ctr + o.row_ctr, col_data + o.col_data,
            col_scale + o.col_scale, col_ctr + o.col_ctr};
  }
  // The tile's part; rowwise blocks (row r0 + g, block c0 / 16 + sg), columnwise blocks (column c0 + t, row block
  // r0 / 16).
  static __device__ __forceinline__ FastOffsets tile(const Nvfp4Params& p, int64_t r0, int64_t c0) {
    const int64_t rows = p.rows, cols = p.cols, nblk = cols / kNvBlock, b0 = c0 / kNvBlock;
    const int64_t rpad = roundup(nblk, 4), cpad = roundup(rows / kNvBlock, 4);
    FastOffsets o;
    o.x = r0 * cols + c0;
    o.row_data = r0 * (cols / 2) + c0 / 2;
    o.row_scale = p.swizzled ? ((r0 / 128) * (rpad / 4) + b0 / 4) * 512 + (r0 % 128 / 32) * 4 : r0 * rpad + b0;
    o.row_ctr = r0 * nblk + b0;
    o.col_data = c0 * (rows / 2) + r0 / 2;
    o.col_scale =
        p.swizzled ? ((c0 / 128) * (cpad / 4) + r0 / 64) * 512 + r0 / kNvBlock % 4 : c0 * cpad + r0 / kNvBlock;
    o.col_ctr = c0 * (rows / kNvBlock) + r0 / kNvBlock;
    return o;
  }
  static __device__ __forceinline__ FastOffsets thread(const Nvfp4Params& p, int g, int sg, int t) {
    const int64_t rows = p.rows, cols = p.cols, nblk = cols / kNvBlock;
    const int64_t rpad = roundup(nblk, 4), cpad = roundup(rows / kNvBlock, 4);
    FastOffsets o;
    o.x = g * cols + sg * 16;
    o.row_data = g * (cols / 2) + sg * 8;
    o.row_scale = p.swizzled ? (sg / 4) * 512 + g * 16 + sg % 4 : g * rpad + sg;
    o.row_ctr = g * nblk + sg;
    o.col_data = t * (rows / 2);
    o.col_scale = p.swizzled ? (t / 128) * (cpad / 4) * 512 + (t % 32) * 16 + (t % 128 / 32) * 4 : t * cpad;
    o.col_ctr = t * (rows / kNvBlock);
    return o;
  }
};

// Tiles of one block of the fast cast: kFastRowTiles row tiles of one column tile (the per-block setup, the global
// scales and the multiplier tables, is paid once for them).
constexpr int kFastRowTiles = 4;

// Four blocks an SM (at most 64 registers a thread); three with stochastic rounding (its Philox state and random words
// would spill at 64).
template <bool kSr> constexpr int kFastMinBlocks = kSr ? 3 : 4;

template <typename InT, bool kTwoD, bool kSr, bool kRht>
__global__ void __launch_bounds__(kThreads, kFastMinBlocks<kSr>) nvfp4_cast_fast_kernel(Nvfp4Params p) {
  if (p.noop != nullptr && *p.noop == 1.0f) return;
  __shared__ __align__(16) FastSmem sm;
  const int t = threadIdx.x;
  const int64_t rows = p.rows, cols = p.cols;
  const CastGlobals gs = cast_globals(p);
  const float s_enc6_row = gs.s_enc_row * kInv6, s_enc6_col = gs.s_enc_col * kInv6;  // nvfp4_block_scale's factor
  sm.enc[t / 128][t % 128] = nvfp4_block_multiplier(uint8_t(t % 128), t < 128 ? gs.s_dec_row : gs.s_dec_col);
  const InT* x = static_cast<const InT*>(p.x);
  const int g = t / 16, sg = t % 16;  // row group (rows g, g + 16) and 16-column segment of this thread
  // The Hadamard input factor of this thread's rows (index g of both 16-row blocks).
  const float rht_factor = kRht ? rht_input_factor(p.rht_sign_mask, g) : 0.0f;
  const FastOffsets own = FastOffsets::thread(p, g, sg, t);
  // From the first 16-row half to the second: rowwise 16 rows further (swizzled: (i % 32) * 16 grows by 256, as
  // r0 % 32 == 0 and g < 16); columnwise the next row block (+1 in both layouts: r0 / 16 is even).
  const int64_t row_scale_step = p.swizzled ? 256 : 16 * roundup(cols / kNvBlock, 4);
  const int64_t c0 = int64_t(blockIdx.x) * kTileCols;
  for (int64_t rt = blockIdx.y; rt < rows / kFastRows; rt += gridDim.y) {
    const int64_t r0 = rt * kFastRows;
    const FastOffsets o = FastOffsets::tile(p, r0, c0) + own;
    float rv[2][16];
    BlockMax bm[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const InT* src = x + o.x + 16 * h * cols;
      const act_cuda::Vec8<InT> a = act_cuda::load8(src, true, act_cuda::kVec);
      const act_cuda::Vec8<InT> b = act_cuda::load8(src + 8, true, act_cuda::kVec);
      widen8(a, rv[h]);
      widen8(b, rv[h] + 8);
      bm[h] = block_max(rv[h]);
    }
    __syncthreads();  // the previous tile's readers are done
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float4 c = make_float4(rv[h][4 * q], rv[h][4 * q + 1], rv[h][4 * q + 2], rv[h][4 * q + 3]);
        if (kRht) c = make_float4(c.x * rht_factor, c.y * rht_factor, c.z * rht_factor, c.w * rht_factor);
        *reinterpret_cast<float4*>(&sm.tile[fast_tile_index(g + 16 * h, sg * 16 + 4 * q)]) = c;
      }
      if (kTwoD) {  // the max over this warp's two rows of the half (lanes l and l ^ 16: rows g and g ^ 1)
        const float m = fmaxf(bm[h].amax, __shfl_xor_sync(0xFFFFFFFFu, bm[h].amax, 16));
        if ((t & 16) == 0) sm.seg_amax[h][sg][t / 32] = m;
      }
    }
    // 2-D: whether every value of the tile is finite (the columnwise blocks' finite flag), with the barrier.
    bool tile_finite = true;
    if (kTwoD) {
      tile_finite = __syncthreads_or(!(bm[0].finite && bm[1].finite)) == 0;
    } else {
      __syncthreads();
    }
    // 2-D: the amax of 16x16 tile (half h, segment j), from the eight warps' maxima.
    const auto tile_amax = [&](int h, int j) {
      const float4 lo = *reinterpret_cast<const float4*>(&sm.seg_amax[h][j][0]);
      const float4 hi = *reinterpret_cast<const float4*>(&sm.seg_amax[h][j][4]);
      return fmaxf(fmaxf(fmaxf(lo.x, lo.y), fmaxf(lo.z, lo.w)), fmaxf(fmaxf(hi.x, hi.y), fmaxf(hi.z, hi.w)));
    };
    if (p.row_data != nullptr) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float amax = kTwoD ? tile_amax(h, sg) : bm[h].amax;
        *reinterpret_cast<uint2*>(p.row_data + o.row_data + 16 * h * (cols / 2)) =
            fast_block<kSr>(rv[h], amax, bm[h].amax, bm[h].finite, s_enc6_row, sm.enc[0], gs.key,
                            o.row_ctr + 16 * h * (cols / kNvBlock), 0, p.row_scale + o.row_scale + h * row_scale_step);
      }
    }
    if (p.col_data != nullptr) {
      uint2 w[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float cv[16], y[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) cv[i] = sm.tile[fast_tile_index(16 * h + i, t)];
        if (kRht) rht16_sums(cv, y);
        const float* vals = kRht ? y : cv;
        // The scale's amax, and a bound of the values' magnitudes with their finite flag: without 2-D both from the
        // values; with 2-D the tile's (it bounds the untransformed values; the Hadamard outputs take their own).
        BlockMax vm{0.0f, tile_finite};
        float amax;
        if (kTwoD) {
          amax = tile_amax(h, t / 16);
          vm.amax = amax;
          if (kRht) vm = block_max(vals);
        } else {
          vm = block_max(vals);
          amax = vm.amax;
        }
        w[h] = fast_block<kSr>(vals, amax, vm.amax, vm.finite, s_enc6_col, sm.enc[1], gs.key, o.col_ctr + h, 1,
                               p.col_scale + o.col_scale + h);
      }
      // rows % 32: 16-byte aligned
      *reinterpret_cast<uint4*>(p.col_data + o.col_data) = make_uint4(w[0].x, w[0].y, w[1].x, w[1].y);
    }
  }
  zero_scale_padding(p);
}

// The fast kernel of a cast's options (RHT: bf16 input only): one block per column tile and kFastRowTiles row tiles.
template <typename InT> void launch_cast_fast(const Nvfp4Params& p, cudaStream_t s) {
  const int64_t row_tiles = p.rows / kFastRows;
  const dim3 grid(unsigned(p.cols / kTileCols), unsigned(std::min<int64_t>(ceil_div(row_tiles, kFastRowTiles), 65535)));
  const auto go = [&](auto two_d, auto sr, auto rht) {
    nvfp4_cast_fast_kernel<InT, decltype(two_d)::value, decltype(sr)::value, decltype(rht)::value>
        <<<grid, kThreads, 0, s>>>(p);
  };
  const auto with_rht = [&](auto two_d, auto sr) {
    if constexpr (std::is_same_v<InT, bf16_t>) {
      if (p.rht) return go(two_d, sr, std::true_type{});
    }
    go(two_d, sr, std::false_type{});
  };
  const auto with_sr = [&](auto two_d) {
    if (p.sr) return with_rht(two_d, std::true_type{});
    with_rht(two_d, std::false_type{});
  };
  if (p.two_d) return with_sr(std::true_type{});
  with_sr(std::false_type{});
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
      aligned(p.col_data) && (!p.rht || in_dtype == DType::kBFloat16) &&
      p.cols / kTileCols <= 0x7FFFFFFF) {
    TE_SWITCH_IN_DTYPE(in_dtype, T, { launch_cast_fast<T>(p, s); });
  } else {
    const int64_t tiles = ceil_div(p.rows, kNvBlock) * ceil_div(p.cols, kTileCols);
    TE_SWITCH_IN_DTYPE(in_dtype, T, {
      nvfp4_cast_kernel<T><<<grid_for(tiles, 1), kThreads, 0, s>>>(p);
    });
  }
  check_launch("quantize_nvfp4");
}

}  // namespace te
