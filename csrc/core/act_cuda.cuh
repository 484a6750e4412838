// CUDA kernel of the activation / cast family (included by the act_*.cu translation units, which instantiate
// it for a few activations each so the build parallelises).
//
// Two kernels: a rowwise one for the common case (aligned rows of 8-element chunks, no transposed copy, no
// dbias), a flat list of chunks with several 16-byte loads in flight per thread; and a tile kernel for the rest.
// Tile kernel: a block of 256 threads owns 64 positions x 128 rows; thread t takes the 8 consecutive positions
// 8*(t%8).. and the 4 consecutive rows 4*(t/8)..: 16-byte loads of bf16/fp16 (two for fp32), all four rows in
// flight before any math. FP8 codes of the transposed copy go through shared memory as 4-row words, swizzled
// so that neither the stores nor the 16-byte reads conflict, and leave as 16-byte rows of out_t.
// Invariant: every value is computed by act_forward/act_backward and encoded by fp8_scaled_value +
// float2_to_fp8x2, exactly as on the CPU.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "activation.h"

namespace te {
namespace act_cuda {

constexpr int kThreads = 256;
constexpr int kTileCols = int(kActTileCols);  // positions per block
constexpr int kVec = 8;        // positions per thread
constexpr int kRowsPerThread = 4;

template <typename T> struct alignas(16) Vec8 { T e[kVec]; };

// Loads 8 consecutive raw elements (or the `n` valid ones, zero-filled): conversion to float happens at use,
// so four rows of raw vectors stay in flight with few registers.
template <typename T> __device__ __forceinline__ Vec8<T> load8(const T* ptr, bool vec, int n) {
  if (vec && n == kVec) return *reinterpret_cast<const Vec8<T>*>(ptr);
  Vec8<T> r;
#pragma unroll
  for (int k = 0; k < kVec; ++k) r.e[k] = k < n ? ptr[k] : from_float<T>(0.0f);
  return r;
}

template <typename T> __device__ __forceinline__ void store8(T* ptr, bool vec, int n, const float (&v)[kVec]) {
  Vec8<T> raw;
#pragma unroll
  for (int k = 0; k < kVec; ++k) raw.e[k] = from_float<T>(v[k]);
  if (vec && n == kVec) {
    *reinterpret_cast<Vec8<T>*>(ptr) = raw;
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      if (k < n) ptr[k] = raw.e[k];
  }
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = amax_update(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// Eight values -> eight FP8 codes (little-endian in two words). kRound: current scaling rounds each value to the
// input dtype first (fp8_scaled_value's rule with the mode fixed at compile time).
template <typename InT, bool kRound, bool kE4m3>
__device__ __forceinline__ uint2 encode8_t(const float (&v)[kVec], float scale) {
  uint32_t w[2];
#pragma unroll
  for (int k = 0; k < kVec; k += 4) {
    float s[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) s[j] = (kRound ? round_to<InT>(v[k + j]) : v[k + j]) * scale;
    w[k / 4] = uint32_t(float2_to_fp8x2<kE4m3>(s[0], s[1])) | (uint32_t(float2_to_fp8x2<kE4m3>(s[2], s[3])) << 16);
  }
  return make_uint2(w[0], w[1]);
}
template <typename InT>
__device__ __forceinline__ uint2 encode8(const float (&v)[kVec], ScaleMode mode, float scale, bool e4m3) {
  if (mode == ScaleMode::kCurrent) {
    return e4m3 ? encode8_t<InT, true, true>(v, scale) : encode8_t<InT, true, false>(v, scale);
  }
  return e4m3 ? encode8_t<InT, false, true>(v, scale) : encode8_t<InT, false, false>(v, scale);
}

// Block-wide amax, then one atomic per block. Non-negative floats order like their bit patterns.
__device__ __forceinline__ void block_amax_to_global(float amax, float* red, float* out) {
  amax = warp_max(amax);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x < 32) {
    float a = threadIdx.x < kThreads / 32 ? red[threadIdx.x] : 0.0f;
    a = warp_max(a);
    if (threadIdx.x == 0 && a > 0.0f) atomicMax(reinterpret_cast<int*>(out), __float_as_int(a));
  }
}

// Swizzled word index of (position j in tile, 4-row group w) in the transposed shared tile.
__device__ __forceinline__ int tile_word(int j, int w) { return j * 32 + (w ^ (4 * ((j >> 3) & 7))); }

// Tile kernel: FP8 transposed copies, dbias partial sums, and ragged shapes. A block owns one 128 x 64 tile at a
// time (grid.y row tiles, looping only past 65535 of them); no cross-tile prefetch, so registers stay low and
// several blocks per SM keep enough loads in flight.
// kVecPath: every chunk is 8 aligned elements (cols % 8 == 0, aligned pointers), so rows load and store as 16-byte
// vectors; the general instantiation handles ragged shapes element by element.
template <class Op, bool kBwd, typename InT, bool kVecPath>
__global__ void __launch_bounds__(kThreads, 2) act_kernel(const ActKernelParams p, int64_t dbias_rows) {
  constexpr bool vec = kVecPath;
  constexpr bool kGated = Op::kGated;
  constexpr bool kTwoOut = kBwd && kGated;
  constexpr int kOuts = kTwoOut ? 2 : 1;
  __shared__ uint32_t tile[kOuts][kTileCols * 32];
  __shared__ float red[kThreads / 32];

  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const int64_t rows = p.rows, cols = p.cols;
  const int64_t x_stride = kGated ? 2 * cols : cols;
  const int64_t o_cols = kTwoOut ? 2 * cols : cols;
  const bool fp8 = mode_writes_fp8(p.mode);
  const bool plain = p.mode == ScaleMode::kPlain;
  const bool track_amax = mode_tracks_amax(p.mode);
  const bool want_t = fp8 && p.out_t != nullptr;
  const float scale = fp8 ? mode_scale(p) : 1.0f;
  if (fp8 && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *p.scale_inv = 1.0f / scale;

  const int tid = threadIdx.x;
  const int cchunk = tid % 8, rgroup = tid / 8;
  const int64_t col_base = int64_t(blockIdx.x) * kTileCols;
  const int64_t c0 = col_base + cchunk * kVec;
  const int n_valid = int(max(int64_t(0), min(int64_t(kVec), cols - c0)));
  const InT* x = static_cast<const InT*>(p.x);
  const InT* g = static_cast<const InT*>(p.grad);
  float amax = 0.0f;
  float dsum[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) dsum[k] = 0.0f;

  const int64_t m_step = int64_t(gridDim.y) * kActBlockRows;
  for (int64_t m0 = int64_t(blockIdx.y) * kActBlockRows; m0 < rows; m0 += m_step) {
    const int64_t r0 = m0 + rgroup * kRowsPerThread;
    Vec8<InT> ra[kRowsPerThread], rb[kRowsPerThread], rg[kRowsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int n = r0 + i < rows ? n_valid : 0;
      ra[i] = load8(x + (r0 + i) * x_stride + c0, vec, n);
      if (kGated) rb[i] = load8(x + (r0 + i) * x_stride + cols + c0, vec, n);
      if (kBwd) rg[i] = load8(g + (r0 + i) * cols + c0, vec, n);
    }
    uint32_t tw[kOuts][kVec];  // transposed copy: byte i of word k = code of (row r0+i, position c0+k)
#pragma unroll
    for (int h = 0; h < kOuts; ++h)
#pragma unroll
      for (int k = 0; k < kVec; ++k) tw[h][k] = 0u;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int n = r0 + i < rows ? n_valid : 0;
      float out[kOuts][kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float a = to_float(ra[i].e[k]);
        const float b = kGated ? to_float(rb[i].e[k]) : 0.0f;
        if constexpr (kBwd) {
          float da, db;
          act_backward<Op>(to_float(rg[i].e[k]), a, b, p.act, da, db);
          out[0][k] = da;
          if constexpr (kTwoOut) out[kOuts - 1][k] = db;
        } else {
          out[0][k] = act_forward<Op>(a, b, p.act);
        }
      }
#pragma unroll
      for (int h = 0; h < kOuts; ++h) {
        if (track_amax || p.dbias_partial != nullptr) {
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            if (k < n) {
              if (track_amax) amax = amax_update(amax, out[h][k]);
              if (p.dbias_partial != nullptr) dsum[k] += out[h][k];
            }
          }
        }
        const int64_t o_off = (r0 + i) * o_cols + h * cols + c0;
        if (plain) {
          if (n > 0) store8(static_cast<InT*>(p.out) + o_off, vec, n, out[h]);
        } else if (fp8) {
          uint32_t w[2] = {0u, 0u};
#pragma unroll
          for (int k = 0; k < kVec; k += 2) {
            const uint32_t two = float2_to_fp8x2(fp8_scaled_value<InT>(out[h][k], p.mode, scale),
                                                 fp8_scaled_value<InT>(out[h][k + 1], p.mode, scale), p.e4m3);
            w[k / 4] |= two << (8 * (k % 4));
            tw[h][k] |= (two & 0xFFu) << (8 * i);
            tw[h][k + 1] |= (two >> 8) << (8 * i);
          }
          if (p.out != nullptr && n > 0) {
            uint8_t* dst = static_cast<uint8_t*>(p.out) + o_off;
            if (vec && n == kVec) {
              *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
            } else {
#pragma unroll
              for (int k = 0; k < kVec; ++k)
                if (k < n) dst[k] = uint8_t(w[k / 4] >> (8 * (k % 4)));
            }
          }
        }
      }
    }
    if (p.dbias_partial != nullptr) {
      // Column sums of this tile, one partial row per dbias_rows rows (a multiple of the 4 rows of a row group):
      // stage the 32 row groups' sums in the (free) transposed-tile storage and add them in a fixed order.
      float* dred = reinterpret_cast<float*>(&tile[0][0]);
      if (m0 != int64_t(blockIdx.y) * kActBlockRows) __syncthreads();
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        dred[rgroup * kTileCols + cchunk * kVec + k] = dsum[k];
        dsum[k] = 0.0f;
      }
      __syncthreads();
      const int per = int(dbias_rows / kRowsPerThread), nsub = 32 / per;
      for (int v = tid; v < kTileCols * nsub; v += kThreads) {
        const int col = v % kTileCols, j = v / kTileCols;
        const int64_t mrow = m0 + int64_t(j) * dbias_rows;
        if (col_base + col < cols && mrow < rows) {
          float sum = 0.0f;
          for (int w = j * per; w < (j + 1) * per; ++w) sum += dred[w * kTileCols + col];
          p.dbias_partial[(mrow / dbias_rows) * cols + col_base + col] = sum;
        }
      }
      __syncthreads();
    }
    if (want_t) {
      // Stage the 128 x 64 code tile transposed: word (j, w) holds rows 4w..4w+3 of position j.
      if (m0 != int64_t(blockIdx.y) * kActBlockRows) __syncthreads();  // the previous tile's reads are done
#pragma unroll
      for (int h = 0; h < kOuts; ++h)
#pragma unroll
        for (int k = 0; k < kVec; ++k) tile[h][tile_word(cchunk * kVec + k, rgroup)] = tw[h][k];
      __syncthreads();
      const bool rows_vec = (rows % 16 == 0) && ((reinterpret_cast<uintptr_t>(p.out_t) & 15) == 0);
#pragma unroll
      for (int h = 0; h < kOuts; ++h) {
#pragma unroll
        for (int it = 0; it < 2; ++it) {
          const int v = tid + it * kThreads;
          const int j = v / 8, s = v % 8;
          const int64_t pos = col_base + j;
          const int64_t m = m0 + 16 * s;
          if (pos < cols && m < rows) {
            const uint4 w = *reinterpret_cast<const uint4*>(&tile[h][tile_word(j, 4 * s)]);
            uint8_t* dst = p.out_t + (pos + h * cols) * rows + m;
            if (rows_vec && m + 16 <= rows) {
              *reinterpret_cast<uint4*>(dst) = w;
            } else {
#pragma unroll
              for (int b = 0; b < 16; ++b) {
                const uint32_t word = b < 4 ? w.x : (b < 8 ? w.y : (b < 12 ? w.z : w.w));
                if (m + b < rows) dst[b] = uint8_t(word >> (8 * (b % 4)));
              }
            }
          }
        }
      }
    }
  }

  if (track_amax) block_amax_to_global(amax, red, p.amax);
}

// ---- Exact lookup tables for bf16 inputs ----------------------------------------------------------------------
// A bf16 input has 65536 possible values; for the functors that cost an exp and a reciprocal (kTabulate), a block
// fills shared-memory tables of F::fwd / F::bwd at every bf16 of magnitude in [2^-25, 2^7) (biased exponents
// 102..133, both signs: 8192 entries each) by calling the functor, then looks values up instead of recomputing
// them. A chunk with any input outside the table (zeros, tiny, huge, Inf/NaN) takes the computed path. The table
// holds exactly what the functor returns, so the bytes do not change.
constexpr uint32_t kLutExpLo = 102;
constexpr uint32_t kLutPerSign = 32u * 128u;
constexpr uint32_t kLutSize = 2u * kLutPerSign;

__device__ __forceinline__ uint32_t lut_index(uint16_t bits) {
  const uint32_t m = uint32_t(bits & 0x7FFFu) - (kLutExpLo << 7);
  return m < kLutPerSign ? m + (uint32_t(bits >> 15) << 12) : kLutSize;
}

// Which tables an op needs: fwd for forward and for the gated backward (d_b), bwd for every backward.
template <class Op, bool kBwd> struct LutPlan {
  static constexpr bool kFwd = !kBwd || Op::kGated;
  static constexpr bool kBwdTab = kBwd;
  static constexpr int kTables = int(kFwd) + int(kBwdTab);
  static constexpr size_t kBytes = size_t(kTables) * kLutSize * sizeof(float);
};

template <class Op, bool kBwd>
__device__ __forceinline__ void lut_fill(float* lut, const ActArgs& args) {
  using Plan = LutPlan<Op, kBwd>;
  for (uint32_t i = threadIdx.x; i < kLutSize; i += kThreads) {
    const uint16_t bits = uint16_t(((i >> 12) << 15) | ((i & (kLutPerSign - 1)) + (kLutExpLo << 7)));
    const float a = to_float(bf16_t{bits});
    if (Plan::kFwd) lut[i] = Op::Fn::fwd(a, args);
    if (Plan::kBwdTab) lut[(Plan::kFwd ? kLutSize : 0u) + i] = Op::Fn::bwd(a, args);
  }
  __syncthreads();
}

// The op on one chunk of 8 positions: out[0] (and out[1], the d_b half of a gated backward). With kLut the
// functor values come from the tables when every input of the chunk is covered.
template <class Op, bool kBwd, bool kLut, typename InT>
__device__ __forceinline__ void eval8(const Vec8<InT>& va, const Vec8<InT>& vb, const Vec8<InT>& vg,
                                      const ActArgs& args, const float* lut, float (&out)[2][kVec]) {
  constexpr bool kGated = Op::kGated;
  if constexpr (kLut) {
    using Plan = LutPlan<Op, kBwd>;
    uint32_t idx[kVec];
    bool hit = true;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      idx[k] = lut_index(reinterpret_cast<const uint16_t&>(va.e[k]));
      hit = hit && idx[k] < kLutSize;
    }
    if (hit) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float b = kGated ? to_float(vb.e[k]) : 0.0f;
        const float fa = Plan::kFwd ? lut[idx[k]] : 0.0f;
        if constexpr (kBwd) {
          const float dfa = lut[(Plan::kFwd ? kLutSize : 0u) + idx[k]];
          act_backward_with<Op>(to_float(vg.e[k]), fa, dfa, b, args, out[0][k], out[1][k]);
        } else {
          out[0][k] = act_forward_with<Op>(fa, b, args);
        }
      }
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float a = to_float(va.e[k]);
    const float b = kGated ? to_float(vb.e[k]) : 0.0f;
    if constexpr (kBwd) {
      act_backward<Op>(to_float(vg.e[k]), a, b, args, out[0][k], out[1][k]);
    } else {
      out[0][k] = act_forward<Op>(a, b, args);
    }
  }
}

// Rowwise kernel: no transposed copy, no dbias, every row a whole number of aligned 8-element chunks. The
// tensor is a flat list of chunks (gated inputs map chunk -> (row, position)); per step, thread t of a block
// takes chunks t, t + 256, ... of the block's kUnroll * 256, issues all their loads before any math, and stores
// 16-byte (plain) or 8-byte (FP8) vectors; blocks stride over the steps (one step each unless kLut, whose grid
// is sized to the resident blocks so each table fill serves many steps). One amax atomic per block.
template <class Op, bool kBwd> struct RowwiseUnroll { static constexpr int value = (kBwd && Op::kGated) ? 2 : 4; };

template <class Op, bool kBwd, typename InT, bool kLut>
__global__ void __launch_bounds__(kThreads, sizeof(InT) == 4 ? 3 : 4)
act_rowwise_kernel(const ActKernelParams p, uint32_t chunks_per_row, uint32_t n_chunks, int units) {
  constexpr bool kGated = Op::kGated;
  constexpr bool kTwoOut = kBwd && kGated;
  constexpr int kU = RowwiseUnroll<Op, kBwd>::value;
  const int64_t kPerStep = int64_t(kThreads) * units;  // units <= kU chunks per thread and step
  __shared__ float red[kThreads / 32];
  extern __shared__ float lut[];

  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const int64_t cols = p.cols;
  const bool fp8 = mode_writes_fp8(p.mode);
  const bool plain = p.mode == ScaleMode::kPlain;
  const bool track_amax = mode_tracks_amax(p.mode);
  const float scale = fp8 ? mode_scale(p) : 1.0f;
  if (fp8 && blockIdx.x == 0 && threadIdx.x == 0) *p.scale_inv = 1.0f / scale;
  if constexpr (kLut) lut_fill<Op, kBwd>(lut, p.act);

  const InT* x = static_cast<const InT*>(p.x);
  const InT* g = static_cast<const InT*>(p.grad);
  float amax = 0.0f;
  for (int64_t step = int64_t(blockIdx.x) * kPerStep; step < int64_t(n_chunks); step += int64_t(gridDim.x) * kPerStep) {
    const uint32_t first = uint32_t(step) + threadIdx.x;
    Vec8<InT> ra[kU], rb[kU], rg[kU];
    int64_t ooff[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const uint32_t ci = u < units ? first + uint32_t(u * kThreads) : n_chunks;
      int64_t xoff;
      if (kGated) {
        const uint32_t r = ci / chunks_per_row;
        const int64_t c = int64_t(ci - r * chunks_per_row) * kVec;
        xoff = int64_t(r) * 2 * cols + c;
        ooff[u] = kTwoOut ? xoff : int64_t(ci) * kVec;
      } else {
        xoff = ooff[u] = int64_t(ci) * kVec;
      }
      if (ci < n_chunks) {
        ra[u] = *reinterpret_cast<const Vec8<InT>*>(x + xoff);
        if (kGated) rb[u] = *reinterpret_cast<const Vec8<InT>*>(x + xoff + cols);
        if (kBwd) rg[u] = *reinterpret_cast<const Vec8<InT>*>(g + int64_t(ci) * kVec);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (u >= units || first + uint32_t(u * kThreads) >= n_chunks) break;
      float out[2][kVec];
      eval8<Op, kBwd, kLut>(ra[u], rb[u], rg[u], p.act, lut, out);
#pragma unroll
      for (int h = 0; h < (kTwoOut ? 2 : 1); ++h) {
        if (track_amax) {
#pragma unroll
          for (int k = 0; k < kVec; ++k) amax = amax_update(amax, out[h][k]);
        }
        const int64_t o = ooff[u] + h * cols;
        if (plain) {
          store8(static_cast<InT*>(p.out) + o, true, kVec, out[h]);
        } else if (fp8 && p.out != nullptr) {
          *reinterpret_cast<uint2*>(static_cast<uint8_t*>(p.out) + o) = encode8<InT>(out[h], p.mode, scale, p.e4m3);
        }
      }
    }
  }
  if (track_amax) block_amax_to_global(amax, red, p.amax);
}

// Strip kernel: dbias (unary ops), aligned rows, no transposed copy. A block owns kActStripCols consecutive
// positions (thread t: 8t..8t+7) of one block of act_dbias_rows rows (grid.y; past 65535 blocks it walks
// blk, blk + gridDim.y, ...) and goes down its rows four at a time with all loads in flight; each thread sums
// its own positions and writes them as the block's partial row, so no shared-memory reduction is needed.
constexpr int kStripRows = 4;
static_assert(kActStripCols == kThreads * kVec, "a strip is one 8-position chunk per thread");
template <class Op, bool kBwd, typename InT, bool kLut>
__global__ void __launch_bounds__(kThreads, sizeof(InT) == 4 ? 3 : 4)
act_strip_kernel(const ActKernelParams p, int64_t block_rows) {
  static_assert(!Op::kGated, "dbias is defined for unary activations only");
  __shared__ float red[kThreads / 32];
  extern __shared__ float lut[];
  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const int64_t rows = p.rows, cols = p.cols;
  const bool fp8 = mode_writes_fp8(p.mode);
  const bool plain = p.mode == ScaleMode::kPlain;
  const bool track_amax = mode_tracks_amax(p.mode);
  const float scale = fp8 ? mode_scale(p) : 1.0f;
  if (fp8 && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *p.scale_inv = 1.0f / scale;
  if constexpr (kLut) lut_fill<Op, kBwd>(lut, p.act);

  const int64_t c0 = (int64_t(blockIdx.x) * kThreads + threadIdx.x) * kVec;
  const bool active = c0 < cols;
  const InT* x = static_cast<const InT*>(p.x);
  const InT* g = static_cast<const InT*>(p.grad);
  float amax = 0.0f;
  for (int64_t m0 = int64_t(blockIdx.y) * block_rows; active && m0 < rows; m0 += int64_t(gridDim.y) * block_rows) {
    const int64_t m1 = min(rows, m0 + block_rows);
    float dsum[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) dsum[k] = 0.0f;
    for (int64_t r0 = m0; r0 < m1; r0 += kStripRows) {
      Vec8<InT> ra[kStripRows], rg[kStripRows];
#pragma unroll
      for (int i = 0; i < kStripRows; ++i) {
        if (r0 + i < m1) {
          ra[i] = *reinterpret_cast<const Vec8<InT>*>(x + (r0 + i) * cols + c0);
          if (kBwd) rg[i] = *reinterpret_cast<const Vec8<InT>*>(g + (r0 + i) * cols + c0);
        }
      }
#pragma unroll
      for (int i = 0; i < kStripRows; ++i) {
        if (r0 + i >= m1) break;
        float out[2][kVec];
        eval8<Op, kBwd, kLut>(ra[i], ra[i], rg[i], p.act, lut, out);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          dsum[k] += out[0][k];
          if (track_amax) amax = amax_update(amax, out[0][k]);
        }
        const int64_t o = (r0 + i) * cols + c0;
        if (plain) {
          store8(static_cast<InT*>(p.out) + o, true, kVec, out[0]);
        } else if (fp8 && p.out != nullptr) {
          *reinterpret_cast<uint2*>(static_cast<uint8_t*>(p.out) + o) = encode8<InT>(out[0], p.mode, scale, p.e4m3);
        }
      }
    }
    float* dst = p.dbias_partial + (m0 / block_rows) * cols + c0;
    *reinterpret_cast<float4*>(dst) = make_float4(dsum[0], dsum[1], dsum[2], dsum[3]);
    *reinterpret_cast<float4*>(dst + 4) = make_float4(dsum[4], dsum[5], dsum[6], dsum[7]);
  }
  if (track_amax) block_amax_to_global(amax, red, p.amax);
}

inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) core_fail(std::string(what) + ": CUDA launch failed: " + cudaGetErrorString(e));
}

// SM count of the current device, cached per device (0 if unknown).
inline int device_sm_count() {
  static int cache[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return 0;
  if (dev < 64 && cache[dev] > 0) return cache[dev];
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 0;
  if (dev < 64) cache[dev] = n;
  return n;
}

// Launches kernel<<<grid, kThreads, lut bytes>>> after allowing that much dynamic shared memory.
template <typename Kernel, typename... Args>
void launch_with_smem(Kernel kernel, dim3 grid, size_t smem, cudaStream_t stream, Args... args) {
  if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  kernel<<<grid, kThreads, smem, stream>>>(args...);
}

template <class Op, bool kBwd>
void launch_act(DType in_dtype, const ActKernelParams& p, cudaStream_t stream) {
  auto aligned = [](const void* ptr, int bytes) { return (reinterpret_cast<uintptr_t>(ptr) % bytes) == 0; };
  const bool vec = p.cols % kVec == 0 && aligned(p.x, 16) && (p.grad == nullptr || aligned(p.grad, 16)) &&
                   (p.out == nullptr || aligned(p.out, p.mode == ScaleMode::kPlain ? 16 : 8));
  const int64_t chunks_per_row = p.cols / kVec;
  const int64_t n_chunks = p.rows * chunks_per_row;
  constexpr bool kTab = Op::Fn::kTabulate;
  constexpr size_t kLutBytes = LutPlan<Op, kBwd>::kBytes;
  if (vec && p.out_t == nullptr && p.dbias_partial == nullptr && n_chunks <= int64_t(UINT32_MAX) - kThreads * 4) {
    // kU chunks per thread keep 64+ bytes in flight per thread; a tensor too small to fill the GPU that way
    // gets one chunk per thread and four times the blocks.
    constexpr int kU = RowwiseUnroll<Op, kBwd>::value;
    const int sms = device_sm_count();
    const int units = n_chunks < int64_t(kThreads) * kU * 2 * (sms > 0 ? sms : 132) ? 1 : kU;
    const int64_t per_block = int64_t(kThreads) * units;
    // An empty tensor still launches one block so that scale_inv is written (SPEC §4.10).
    const int64_t blocks = n_chunks < 1 ? 1 : (n_chunks + per_block - 1) / per_block;
    const unsigned cpr = unsigned(chunks_per_row), nc = unsigned(n_chunks);
    TE_SWITCH_IN_DTYPE(in_dtype, T, {
      bool done = false;
      if constexpr (kTab && std::is_same<T, bf16_t>::value) {
        // Tables pay off when each resident block walks several steps after filling them.
        auto kernel = act_rowwise_kernel<Op, kBwd, T, true>;
        int per_sm = 0;
        if (kLutBytes > 48 * 1024)
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kLutBytes));
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, kLutBytes);
        const int64_t resident = int64_t(per_sm) * sms;
        if (units == kU && resident > 0 && blocks >= 4 * resident) {
          launch_with_smem(kernel, dim3(unsigned(resident)), kLutBytes, stream, p, cpr, nc, units);
          done = true;
        }
      }
      if (!done) act_rowwise_kernel<Op, kBwd, T, false><<<unsigned(blocks), kThreads, 0, stream>>>(p, cpr, nc, units);
    });
    check_launch("activation kernel (rowwise)");
    return;
  }
  const int64_t dbias_rows = act_dbias_rows(p.rows, p.cols);
  // dbias exists for unary backward ops and the plain cast (bgrad_quantize).
  constexpr bool kHasDbias = !Op::kGated && (kBwd || std::is_same<typename Op::Fn, Identity>::value);
  if constexpr (kHasDbias) {
    if (vec && p.out_t == nullptr && p.dbias_partial != nullptr && aligned(p.dbias_partial, 16)) {
      const int64_t strips = (p.cols + kActStripCols - 1) / kActStripCols;
      const int64_t gy = std::min<int64_t>(act_dbias_blocks(p.rows, p.cols), 65535);
      const dim3 grid(unsigned(strips < 1 ? 1 : strips), unsigned(gy));
      TE_SWITCH_IN_DTYPE(in_dtype, T, {
        if constexpr (kTab && std::is_same<T, bf16_t>::value) {
          if (dbias_rows >= 64) {
            launch_with_smem(act_strip_kernel<Op, kBwd, T, true>, grid, kLutBytes, stream, p, dbias_rows);
          } else {
            act_strip_kernel<Op, kBwd, T, false><<<grid, kThreads, 0, stream>>>(p, dbias_rows);
          }
        } else {
          act_strip_kernel<Op, kBwd, T, false><<<grid, kThreads, 0, stream>>>(p, dbias_rows);
        }
      });
      check_launch("activation kernel (dbias strips)");
      return;
    }
  }
  const int64_t col_blocks = (p.cols + kTileCols - 1) / kTileCols;
  if (col_blocks > 2147483647LL) core_fail("activation: too many columns");
  const dim3 grid(unsigned(col_blocks < 1 ? 1 : col_blocks), unsigned(act_row_blocks(p.rows, p.cols)));
  TE_SWITCH_IN_DTYPE(in_dtype, T, {
    if (vec) {
      act_kernel<Op, kBwd, T, true><<<grid, kThreads, 0, stream>>>(p, dbias_rows);
    } else {
      act_kernel<Op, kBwd, T, false><<<grid, kThreads, 0, stream>>>(p, dbias_rows);
    }
  });
  check_launch("activation kernel");
}

}  // namespace act_cuda
}  // namespace te

// Explicit instantiation of the launcher of one activation in one direction (kBwd = false / true); each act_*.cu
// translation unit instantiates one family in one direction so the build parallelises.
#define TE_INSTANTIATE_ACT_CUDA(code, F, gated, bwd) \
  template void te::act_cuda::launch_act<te::ActOp<te::F, gated>, bwd>(te::DType, const te::ActKernelParams&, cudaStream_t);
