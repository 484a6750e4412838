// CUDA kernel of the activation / cast family (included by the act_*.cu translation units, which instantiate
// it for a few activations each so the build parallelises).
//
// Four kernels: a rowwise one for the common case (aligned rows of 8-element chunks, no transposed copy, no
// dbias), a flat list of chunks with several 16-byte loads in flight per thread; a strip kernel for dbias; a
// pipelined tile kernel for FP8 with a transposed copy on aligned rows; and the tile kernel for the rest (ragged
// shapes, dbias with a transposed copy). The first three are instantiated per output kind (the rowwise one also for
// MXFP8 rowwise codes and scales) and, for bf16 inputs of exp-based functors, look the functor up in exact
// shared-memory tables. Large bf16 tensors of such a unary forward op going to NVFP4 take kernels of their own
// (act_nv_row_kernel: a thread owns whole 1x16 blocks; act_nv_rowcol_kernel: both copies of 128 x 128 tiles staged
// in shared memory).
// Tile kernel: a block of 256 threads owns 64 positions x 128 rows; thread t takes the 8 consecutive positions
// 8*(t%8).. and the 4 consecutive rows 4*(t/8)..: 16-byte loads of bf16/fp16 (two for fp32), all four rows in
// flight before any math. FP8 codes of the transposed copy go through shared memory as 4-row words, swizzled
// so that neither the stores nor the 16-byte reads conflict, and leave as 16-byte rows of out_t.
// Invariant: every value is computed by act_forward/act_backward and encoded by fp8_scaled_value +
// float2_to_fp8x2, exactly as on the CPU.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "activation.h"
#include "quantize_mxfp8.h"
#include "quantize_nvfp4.h"

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

// The bits of raw elements 2w, 2w+1 (16-bit types) or w (float) in one 32-bit word.
template <typename T> __device__ __forceinline__ uint32_t raw_word(const Vec8<T>& raw, int w) {
  if constexpr (sizeof(T) == 4) {
    return __float_as_uint(raw.e[w]);
  } else {
    return uint32_t(raw.e[2 * w].bits) | (uint32_t(raw.e[2 * w + 1].bits) << 16);
  }
}

// Eight values to the input dtype at a 16-byte aligned `ptr`, in 16-byte stores of packed words spelled out: in the
// gated 2-D kernel the compiler split the struct copy of store8 into four 4-byte stores per chunk. An output only:
// the asm store is not ordered against the kernel's other memory accesses.
template <typename T> __device__ __forceinline__ void store8_packed(T* ptr, const float (&v)[kVec]) {
  Vec8<T> raw;
#pragma unroll
  for (int k = 0; k < kVec; ++k) raw.e[k] = from_float<T>(v[k]);
  constexpr int kWords = int(sizeof(raw)) / 4;
#pragma unroll
  for (int w = 0; w < kWords; w += 4) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(reinterpret_cast<uint4*>(ptr) + w / 4),
                 "r"(raw_word(raw, w)), "r"(raw_word(raw, w + 1)), "r"(raw_word(raw, w + 2)),
                 "r"(raw_word(raw, w + 3)));
  }
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

// Block-wide amax of a kBlock-thread block, then one atomic per block. Non-negative floats order like their bit
// patterns.
// The block's amax (amax_update over its threads' values), valid in warp 0; `red` holds kBlock / 32 floats.
template <int kBlock> __device__ __forceinline__ float block_amax_warp0(float amax, float* red) {
  amax = warp_max(amax);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = amax;
  __syncthreads();
  float a = 0.0f;
  if (threadIdx.x < 32) {
    a = threadIdx.x < kBlock / 32 ? red[threadIdx.x] : 0.0f;
    a = warp_max(a);
  }
  return a;
}

template <int kBlock> __device__ __forceinline__ void block_amax_to_global(float amax, float* red, float* out) {
  const float a = block_amax_warp0<kBlock>(amax, red);
  if (threadIdx.x == 0 && a > 0.0f) atomicMax(reinterpret_cast<int*>(out), __float_as_int(a));
}

// Swizzled word index of (position j in tile, 4-row group w) in the transposed shared tile.
__device__ __forceinline__ int tile_word(int j, int w) { return j * 32 + (w ^ (4 * ((j >> 3) & 7))); }

// Writes a staged 128 x 64 code tile (word (j, w) = rows 4w..4w+3 of position j) to the transposed copy `out_t`
// ([cols, rows] codes) at positions col_base.. and rows m0..: each thread two 16-byte runs of 16 rows, byte stores
// where the rows are ragged or out_t is misaligned.
__device__ __forceinline__ void store_transposed_tile(const uint32_t* tile, uint8_t* out_t, int64_t col_base,
                                                      int64_t m0, int64_t rows, int64_t cols) {
  const bool rows_vec = (rows % 16 == 0) && ((reinterpret_cast<uintptr_t>(out_t) & 15) == 0);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int v = threadIdx.x + half * kThreads;
    const int j = v / 8, s = v % 8;
    const int64_t pos = col_base + j, m = m0 + 16 * s;
    if (pos < cols && m < rows) {
      const uint4 w = *reinterpret_cast<const uint4*>(&tile[tile_word(j, 4 * s)]);
      uint8_t* dst = out_t + pos * rows + m;
      if (rows_vec) {
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

// Tile kernel: what the other kernels leave (ragged or misaligned rows, dbias with a transposed copy). A block owns
// one 128 x 64 tile at a time (grid.y row tiles, looping only past 65535 of them); no cross-tile prefetch; two
// blocks per SM, so that no instantiation spills.
// kVecPath: every chunk is 8 aligned elements (cols % 8 == 0, aligned pointers), so rows load and store as 16-byte
// vectors; the general instantiation handles ragged shapes element by element.
template <class Op, bool kBwd, typename InT, bool kVecPath>
__global__ void __launch_bounds__(kThreads, 2)
act_kernel(const ActKernelParams p, int64_t dbias_rows) {
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
#pragma unroll
      for (int h = 0; h < kOuts; ++h) store_transposed_tile(tile[h], p.out_t + h * cols * rows, col_base, m0, rows, cols);
    }
  }

  if (track_amax) block_amax_to_global<kThreads>(amax, red, p.amax);
}

// ---- Streaming kernels: compile-time output kind ---------------------------------------------------------------
// The rowwise and strip kernels are instantiated per output kind, so their loops carry no mode branches (only the
// E4M3/E5M2 choice stays a warp-uniform runtime branch per chunk).
// kNvRow / kNvRowCol: NVFP4 (ScaleMode::kNvfp4) without / with the transposed copy.
enum class OutKind { kPlain, kDelayed, kCurrent, kAmax, kMxRow, kNvRow, kNvRowCol };

template <OutKind kOut> struct OutTraits {
  static constexpr bool kFp8 = kOut == OutKind::kDelayed || kOut == OutKind::kCurrent;
  static constexpr bool kTrackAmax = kOut == OutKind::kDelayed || kOut == OutKind::kAmax;
  static constexpr bool kRound = kOut == OutKind::kCurrent;  // rnd_in before scaling (SPEC §5.1)
  static constexpr bool kNv = kOut == OutKind::kNvRow || kOut == OutKind::kNvRowCol;
};

// Runtime ScaleMode -> OutKind for the launchers; the default names the accepted values.
#define TE_SWITCH_OUT_KIND(mode, K, ...)                                                                   \
  switch (mode) {                                                                                          \
    case ::te::ScaleMode::kPlain: { constexpr auto K = OutKind::kPlain; __VA_ARGS__; break; }              \
    case ::te::ScaleMode::kDelayed: { constexpr auto K = OutKind::kDelayed; __VA_ARGS__; break; }          \
    case ::te::ScaleMode::kCurrent: { constexpr auto K = OutKind::kCurrent; __VA_ARGS__; break; }          \
    case ::te::ScaleMode::kAmaxOnly: { constexpr auto K = OutKind::kAmax; __VA_ARGS__; break; }            \
    default: ::te::core_fail("activation kernel: scale mode " + std::to_string(int(mode)) +               \
                             " is not known; accepted: plain 0, delayed 1, current 2, amax-only 3");       \
  }

// Writes one chunk of 8 values at element offset `off` of the output: the input dtype (kPlain) or FP8 codes;
// amax over the unrounded values where the kind tracks it.
template <OutKind kOut, typename InT>
__device__ __forceinline__ void emit8(const float (&v)[kVec], void* out, int64_t off, float scale, bool e4m3,
                                      float& amax) {
  using Tr = OutTraits<kOut>;
  if constexpr (Tr::kTrackAmax) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) amax = amax_update(amax, v[k]);
  }
  if constexpr (kOut == OutKind::kPlain) {
    store8(static_cast<InT*>(out) + off, true, kVec, v);
  } else if constexpr (Tr::kFp8) {
    const uint2 w = e4m3 ? encode8_t<InT, Tr::kRound, true>(v, scale) : encode8_t<InT, Tr::kRound, false>(v, scale);
    *reinterpret_cast<uint2*>(static_cast<uint8_t*>(out) + off) = w;
  }
}

// The scale an FP8 kind multiplies by (mode_scale's rule; p.mode is the kind), and scale_inv written once per
// launch (by block 0).
template <OutKind kOut> __device__ __forceinline__ float kind_scale(const ActKernelParams& p) {
  if constexpr (!OutTraits<kOut>::kFp8) {
    return 1.0f;
  } else {
    const float s = mode_scale(p);
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *p.scale_inv = 1.0f / s;
    return s;
  }
}

// ---- Exact lookup tables for bf16 inputs ----------------------------------------------------------------------
// A bf16 input has 65536 possible values; for the functors that cost an exp and a reciprocal (kTabulate), a block
// fills shared-memory tables of F::fwd / F::bwd at every bf16 of magnitude in [2^-25, 2^7) (bit patterns
// 0x3300..0x42FF and their negatives: 4096 entries per sign) by calling the functor, then looks values up instead
// of recomputing them. A chunk with any input outside the table (zeros, tiny, huge, Inf/NaN) takes the computed
// path. The tables hold exactly what the functor returns, so the bytes do not change.
// Table layout (bytes): [positive 16 KB | negative 16 KB] per table; the bwd table follows the fwd one.
constexpr uint32_t kLutLo = 0x3300u;          // bf16 bits of 2^-25
constexpr uint32_t kLutPerSign = 0x1000u;     // 32 binades x 128 mantissas
constexpr uint32_t kLutEntries = 2u * kLutPerSign;
constexpr uint32_t kLutTableBytes = kLutEntries * 4u;

// Which tables an op needs: fwd for forward and for the gated backward (d_b), bwd for every backward.
// kRnd: the caller wants rnd_in of the op's value (SPEC §5.1: MXFP8 and NVFP4 block amaxes); for a unary forward
// op that value is rnd_in(fwd(a)) itself, so the fwd table holds it already rounded (kRoundedFwd) and a lookup
// needs no rounding.
template <class Op, bool kBwd, bool kRnd = false> struct LutPlan {
  static constexpr bool kFwd = !kBwd || Op::kGated;
  static constexpr bool kBwdTab = kBwd;
  static constexpr bool kRoundedFwd = kRnd && !kBwd && !Op::kGated;
  static constexpr uint32_t kBwdOffset = kFwd ? kLutTableBytes : 0u;
  static constexpr size_t kBytes = size_t(int(kFwd) + int(kBwdTab)) * kLutTableBytes;
};

template <class Op, bool kBwd, int kBlock, bool kRnd = false>
__device__ __forceinline__ void lut_fill(float* lut, const ActArgs& args) {
  using Plan = LutPlan<Op, kBwd, kRnd>;
  for (uint32_t i = threadIdx.x; i < kLutEntries; i += kBlock) {
    const uint16_t bits = uint16_t(((i / kLutPerSign) << 15) | (i % kLutPerSign + kLutLo));
    const float a = to_float(bf16_t{bits});
    if (Plan::kFwd) {
      const float f = Op::Fn::fwd(a, args);
      lut[i] = Plan::kRoundedFwd ? round_to<bf16_t>(f) : f;
    }
    if (Plan::kBwdTab) lut[Plan::kBwdOffset / 4u + i] = Op::Fn::bwd(a, args);
  }
  __syncthreads();
}

// Split bf16 table (kernels whose op values are rnd_in of a unary forward op, hence bf16 values): entry i of the
// layout above (sign i / 4096, magnitude index m = i % 4096) holds the bf16 bits of rnd_in(fwd) at byte 2 * m, plus
// kHalfLutNegOffset for the negative half, so that the offset of an in-range half d (see lut_offsets) is 2 * d with
// bit 15 moved to bit 16: one shift and one mask. The 56 KB between the halves are the caller's to use.
constexpr uint32_t kHalfLutNegOffset = 0x10000u;
constexpr uint32_t kHalfLutHalfBytes = 2u * kLutPerSign;  // 8 KB per sign

// Byte offsets into a table of the 8 bf16 of `v` (kSplit: the split bf16 table, else the FP32 layout above); false
// when any of them lies outside the table. Both halves of a 32-bit word at once: d = w - 0x33003300 leaves each
// in-range half in [0, 0x1000) (positive) or [0x8000, 0x9000) (negative), i.e. with bits 12-14 clear; an
// out-of-range low half may borrow from the high one, but then the chunk is rejected anyway.
template <bool kSplit = false>
__device__ __forceinline__ bool lut_offsets(const Vec8<bf16_t>& v, uint32_t (&off)[kVec]) {
  const uint32_t* w = reinterpret_cast<const uint32_t*>(&v);
  uint32_t any = 0u;
#pragma unroll
  for (int j = 0; j < kVec / 2; ++j) {
    const uint32_t d = w[j] - (kLutLo | (kLutLo << 16));
    any |= d;
    if constexpr (kSplit) {
      off[2 * j] = (d << 1) & 0x11FFEu;
      off[2 * j + 1] = (d >> 15) & 0x11FFEu;
    } else {
      off[2 * j] = ((d << 2) & 0x3FFCu) | ((d >> 1) & 0x4000u);
      off[2 * j + 1] = ((d >> 14) & 0x3FFCu) | ((d >> 17) & 0x4000u);
    }
  }
  return (any & 0x70007000u) == 0u;
}

template <class Op, int kBlock>
__device__ __forceinline__ void half_lut_fill(unsigned char* lut, const ActArgs& args) {
  static_assert(!Op::kGated, "the split bf16 table holds rnd_in of a unary forward op");
  for (uint32_t i = threadIdx.x; i < kLutEntries; i += kBlock) {
    const uint32_t neg = i / kLutPerSign, m = i % kLutPerSign;
    const float a = to_float(bf16_t{uint16_t((neg << 15) | (m + kLutLo))});
    *reinterpret_cast<uint16_t*>(lut + neg * kHalfLutNegOffset + 2u * m) = from_float<bf16_t>(Op::Fn::fwd(a, args)).bits;
  }
  __syncthreads();
}

__device__ __forceinline__ float lut_at(const float* lut, uint32_t byte_off) {
  return *reinterpret_cast<const float*>(reinterpret_cast<const char*>(lut) + byte_off);
}

// Two FP32 values rounded to bf16 (RN, cvt.rn.bf16x2.f32 on sm_80+): lo in the low half, hi in the high half.
__device__ __forceinline__ uint32_t bf162_bits_rn(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
#else
  return uint32_t(from_float<bf16_t>(lo).bits) | (uint32_t(from_float<bf16_t>(hi).bits) << 16);
#endif
}

// Rounds 8 values to InT and widens them again (rnd_in, SPEC §5.1); bf16 two at a time (one packed conversion
// per pair, the same RN rounding).
template <typename InT> __device__ __forceinline__ void round8_in(float (&v)[kVec]) {
  if constexpr (std::is_same<InT, bf16_t>::value) {
#pragma unroll
    for (int k = 0; k < kVec; k += 2) {
      const uint32_t w = bf162_bits_rn(v[k], v[k + 1]);
      v[k] = bits_float(w << 16);
      v[k + 1] = bits_float(w & 0xFFFF0000u);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = round_to<InT>(v[k]);
  }
}

// The op on one chunk of 8 positions: out[0] (and out[1], the d_b half of a gated backward). With kLut the
// functor values come from the tables when every input of the chunk is covered. kRnd: the values come out rounded
// to the input dtype (rnd_in; from a unary forward op's pre-rounded table as they are). The caller fills the
// tables with the same kRnd.
template <class Op, bool kBwd, bool kLut, bool kRnd = false, typename InT>
__device__ __forceinline__ void eval8(const Vec8<InT>& va, const Vec8<InT>& vb, const Vec8<InT>& vg,
                                      const ActArgs& args, const float* lut, float (&out)[2][kVec]) {
  constexpr bool kGated = Op::kGated;
  constexpr int kOuts = (kBwd && kGated) ? 2 : 1;
  if constexpr (kLut) {
    using Plan = LutPlan<Op, kBwd, kRnd>;
    uint32_t off[kVec];
    if (lut_offsets(va, off)) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float b = kGated ? to_float(vb.e[k]) : 0.0f;
        const float fa = Plan::kFwd ? lut_at(lut, off[k]) : 0.0f;
        if constexpr (kBwd) {
          const float dfa = lut_at(lut, Plan::kBwdOffset + off[k]);
          act_backward_with<Op>(to_float(vg.e[k]), fa, dfa, b, args, out[0][k], out[1][k]);
        } else {
          out[0][k] = act_forward_with<Op>(fa, b, args);
        }
      }
      if constexpr (kRnd && !Plan::kRoundedFwd) {
#pragma unroll
        for (int h = 0; h < kOuts; ++h) round8_in<InT>(out[h]);
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
  if constexpr (kRnd) {
#pragma unroll
    for (int h = 0; h < kOuts; ++h) round8_in<InT>(out[h]);
  }
}

// n / d by a multiply (round-up method): m = ceil(2^(32+l) / d) with l = ceil(log2 d), split into its low word and
// its 33rd bit; exact for n < 2^31.
struct FastDiv {
  uint32_t m_lo = 0, m_hi = 1, l = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t div) {
    const uint64_t d = div < 1 ? 1 : div;
    while ((uint64_t(1) << l) < d) ++l;
    const uint64_t m = ((uint64_t(1) << (32 + l)) + d - 1) / d;
    m_lo = uint32_t(m);
    m_hi = uint32_t(m >> 32);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const { return (n * m_hi + __umulhi(n, m_lo)) >> l; }
};

// The whole steps first, first + stride, .. < full_end of a resident grid with two register sets: the next step's
// loads are in flight during this step's math (the caller has issued the first step's loads into r0).
template <class Regs, class Load, class Compute>
__device__ __forceinline__ void walk_double_buffered(uint32_t first, uint32_t full_end, uint32_t stride, Regs& r0,
                                                     Regs& r1, Load&& load, Compute&& compute) {
  for (uint32_t step = first; step < full_end; step += 2 * stride) {
    if (step + stride < full_end) load(r1, step + stride);
    compute(r0, step);
    if (step + stride >= full_end) break;
    if (step + 2 * stride < full_end) load(r0, step + 2 * stride);
    compute(r1, step + stride);
  }
}

// 16-byte asynchronous global -> shared copies (cp.async.cg on sm_80+: bypasses L1, no registers held while in
// flight; a plain synchronous copy on older archs, where commit and wait have nothing to do). With `valid` false the
// destination is zero-filled without reading global memory.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t dst = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
#else
  *reinterpret_cast<uint4*>(smem) = *reinterpret_cast<const uint4*>(gmem);
#endif
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t dst = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0));
#else
  *reinterpret_cast<uint4*>(smem) = valid ? *reinterpret_cast<const uint4*>(gmem) : make_uint4(0u, 0u, 0u, 0u);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most kPending of this thread's committed groups are in flight.
template <int kPending> __device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

// The amax of a block of kLanes consecutive lanes x 8 values (v already rounded to the input dtype, rnd_in of
// SPEC §5.1). The lanes of a block are all active or all idle together; kFull: the whole warp is (a full-mask
// shuffle, no mask computed per call).
template <int kLanes, bool kFull>
__device__ __forceinline__ float block_amax8(const float (&v)[kVec]) {
  float a = 0.0f;
#pragma unroll
  for (int k = 0; k < kVec; ++k) a = amax_update(a, v[k]);
  const unsigned group = kFull ? 0xFFFFFFFFu : ((1u << kLanes) - 1u) << (threadIdx.x & (32u - kLanes));
#pragma unroll
  for (int o = 1; o < kLanes; o *= 2) a = amax_update(a, __shfl_xor_sync(group, a, o));
  return a;
}

// MXFP8 rowwise output of one chunk (kOut == kMxRow, SPEC §4.5): v = the values rounded to the input dtype; the
// amax of their 1x32 block over the 4 lanes holding it, the E8M0 code, the codes at element offset `off`; the
// first lane of the block stores the scale at byte `soff` of the scale tensor.
template <bool kFull>
__device__ __forceinline__ void emit8_mx_row(const float (&v)[kVec], const ActKernelParams& p, int64_t off,
                                             int64_t soff) {
  const float a = block_amax8<4, kFull>(v);
  const uint32_t e = mx_block_code_u32(a, p.e4m3);
  const float m = e8m0_multiplier_finite(e);
  const uint2 w = p.e4m3 ? encode8_t<float, false, true>(v, m) : encode8_t<float, false, false>(v, m);
  *reinterpret_cast<uint2*>(static_cast<uint8_t*>(p.out) + off) = w;
  if ((threadIdx.x & 3u) == 0u) p.blk_scale[soff] = uint8_t(e);
}

// Zero the padding of a scale grid (grid-stride over the padding only): the entries right of the data on its
// `rows` data rows, then the whole rows below, up to [pad_rows, pad_cols]. `offset(r, j)` places entry (r, j).
template <class Offset>
__device__ __forceinline__ void zero_scale_padding(uint8_t* scale, int64_t rows, int64_t cols, int64_t pad_rows,
                                                   int64_t pad_cols, Offset offset) {
  const int64_t right = rows * (pad_cols - cols), below = (pad_rows - rows) * pad_cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < right + below;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i < right ? i / (pad_cols - cols) : rows + (i - right) / pad_cols;
    const int64_t j = i < right ? cols + i % (pad_cols - cols) : (i - right) % pad_cols;
    scale[offset(r, j)] = 0;
  }
}

// Zero padding of the MXFP8 rowwise scales [roundup(rows, 128), roundup(out_cols / 32, 4)].
__device__ __forceinline__ void mx_row_scale_padding(uint8_t* scale, int64_t rows, int64_t out_cols, bool swizzled) {
  const int64_t blocks = out_cols / kMxBlock;
  zero_scale_padding(scale, rows, blocks, roundup(rows, 128), roundup(blocks, 4),
                     [=](int64_t r, int64_t j) { return mx_row_scale_offset(r, j, out_cols, swizzled); });
}

// ---- NVFP4 (ScaleMode::kNvfp4) ----------------------------------------------------------------------------------
// The global scales of one launch, from the amax of the previous kAmaxOnly pass (SPEC §4.6).
struct NvGlobal {
  float s_enc, s_dec;
};
__device__ __forceinline__ NvGlobal nv_global(const ActKernelParams& p) {
  const float amax = *p.amax;
  if (blockIdx.x == 0 && threadIdx.x == 0) {  // the tensor's amax fields (rowwise / columnwise copies)
    if (p.nv_amax_out[0] != nullptr) *p.nv_amax_out[0] = amax;
    if (p.nv_amax_out[1] != nullptr) *p.nv_amax_out[1] = amax;
  }
  const float s_enc = nvfp4_global_scale(amax);
  return {s_enc, 1.0f / s_enc};
}

// NVFP4 rowwise output of one chunk: v = the values rounded to the input dtype; the amax of their 1x16 block over
// the 2 lanes holding it, the E4M3 block scale, 4 bytes of packed codes at element offset `off`; the even lane
// stores the scale at byte `soff` of the scale tensor.
template <bool kFull>
__device__ __forceinline__ void emit8_nv_row(const float (&v)[kVec], const ActKernelParams& p, const NvGlobal& gs,
                                             int64_t off, int64_t soff) {
  const float a = block_amax8<2, kFull>(v);
  const uint8_t sf = nvfp4_block_scale(a, gs.s_enc);
  *reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(p.out) + off / 2) =
      nvfp4_pack8(v, nvfp4_block_multiplier(sf, gs.s_dec));
  if ((threadIdx.x & 1u) == 0u) p.blk_scale[soff] = sf;
}

// Zero padding of the NVFP4 scale tensors of a launch (rowwise when `out` is set, columnwise when `out_t` is).
__device__ __forceinline__ void nv_scale_padding(const ActKernelParams& p, int64_t out_cols) {
  const int64_t rows = p.rows;
  const bool swz = p.blk_swizzled;
  if (p.out != nullptr) {
    const int64_t nb = out_cols / kNvBlock;
    zero_scale_padding(p.blk_scale, rows, nb, roundup(rows, 128), roundup(nb, 4),
                       [=](int64_t r, int64_t j) { return nv_row_scale_offset(r, j, out_cols, swz); });
  }
  if (p.out_t != nullptr) {
    const int64_t nb = rows / kNvBlock;
    zero_scale_padding(p.blk_scale_t, out_cols, nb, roundup(out_cols, 128), roundup(nb, 4),
                       [=](int64_t k, int64_t i) { return nv_col_scale_offset(k, i, rows, swz); });
  }
}

// ---- Rowwise kernel ----------------------------------------------------------------------------------------------
// No transposed copy, no dbias, every row a whole number of aligned 8-element chunks: the tensor is a flat list of
// chunks (gated inputs map chunk -> (row, position)). A step of a block is `units` (<= kU) chunks per thread
// (thread t: chunks t, t + kRowThreads, ...), all loads of a step issued before its math; 16-byte (plain) or
// 8-byte (FP8) stores; one amax atomic per block. Computed path: one step per block, the hardware overlaps blocks.
// Table path: a grid of resident blocks, each filling its tables once (while its first loads are in flight) and
// walking many steps in whole rounds (no per-chunk bound checks, full-warp shuffles); forward to plain, FP8 or MXFP8
// issues the next step's loads before this step's math (two register sets, within the 64 registers that two
// 512-thread blocks per SM allow: +0.7 % of copy bandwidth on gelu -> FP8, H200). The block formats (MXFP8, NVFP4)
// take rnd_in values from eval8 (a unary forward op's table holds them pre-rounded) and, on compact scale tensors
// whose rows hold exactly the data's blocks, place a chunk's scale at chunk / chunks-per-block. A read-only amax
// pass of a unary bf16 forward op goes to act_amax_shape_kernel instead.
constexpr int kRowThreads = 512;

// Chunks per thread and step: 64 bytes of 16-bit input (32 of FP32) per input stream of unary forward, shared
// among the streams (gated: a and b; backward: grad).
template <class Op, bool kBwd, typename InT> struct RowwiseUnroll {
  static constexpr int kStreams = 1 + int(Op::kGated) + int(kBwd);
  static constexpr int kRaw = (4 / kStreams) / (sizeof(InT) == 4 ? 2 : 1);
  static constexpr int value = kRaw < 1 ? 1 : kRaw;
};

// Table path: whether a block double-buffers its steps in registers: forward ops to plain, FP8, MXFP8 or NVFP4
// outputs (H200, 16384x8192 bf16: gelu -> MXFP8 84.7 -> 86.0 % of copy bandwidth, swiglu -> MXFP8 86.0 -> 91.6 %,
// gelu -> NVFP4 rowwise 268 -> 260 us), not backward ops (they need those registers themselves: they would spill).
template <bool kBwd, OutKind kOut> struct RowwisePrefetch {
  static constexpr bool value = !kBwd && (kOut == OutKind::kPlain || kOut == OutKind::kDelayed ||
                                          kOut == OutKind::kCurrent || kOut == OutKind::kMxRow ||
                                          kOut == OutKind::kNvRow);
};

struct RowwiseGeom {
  uint32_t n_chunks = 0;     // rows * chunks_per_row (< 2^31)
  uint32_t cpr = 0;          // chunks per row
  FastDiv row_of;            // chunk -> row (gated inputs, block scales)
  int units = 1;             // chunks per thread and step (<= kU)
  bool scale_linear = false; // block formats: compact scales whose rows are exactly the data's blocks, one output
                             // per chunk row (scale entry = chunk / chunks per block)
};

// The split bf16 table with the block multipliers of NVFP4 scale codes 0..127 in the gap after its positive half
// (the NVFP4 both-copies table kernel).
__device__ __forceinline__ const float* nv_enc_tab(const float* lut) {
  return reinterpret_cast<const float*>(reinterpret_cast<const unsigned char*>(lut) + kHalfLutHalfBytes);
}
constexpr size_t kNvTabBytes = kHalfLutNegOffset + kHalfLutHalfBytes;
static_assert(kHalfLutHalfBytes + 128 * 4 <= kHalfLutNegOffset, "the multipliers fit between the table halves");

// Element offsets of chunk ci in x (a half of a gated row) and in the output.
template <bool kGated, bool kTwoOut>
__device__ __forceinline__ void chunk_offsets(uint32_t ci, const RowwiseGeom& geo, int64_t cols, int64_t& xoff,
                                              int64_t& ooff) {
  if constexpr (kGated) {
    const uint32_t r = geo.row_of.div(ci);
    xoff = int64_t(r) * 2 * cols + int64_t(ci - r * geo.cpr) * kVec;
    ooff = kTwoOut ? xoff : int64_t(ci) * kVec;
  } else {
    xoff = ooff = int64_t(ci) * kVec;
  }
}

// The raw inputs of chunk ci: a (and b, grad).
template <bool kGated, bool kBwd, typename InT>
__device__ __forceinline__ void load_chunk(const InT* x, const InT* g, int64_t xoff, int64_t cols, uint32_t ci,
                                           Vec8<InT>& a, Vec8<InT>& b, Vec8<InT>& gr) {
  a = *reinterpret_cast<const Vec8<InT>*>(x + xoff);
  if (kGated) b = *reinterpret_cast<const Vec8<InT>*>(x + xoff + cols);
  if (kBwd) gr = *reinterpret_cast<const Vec8<InT>*>(g + int64_t(ci) * kVec);
}

template <class Op, bool kBwd, typename InT, OutKind kOut, bool kLut>
__global__ void __launch_bounds__(kRowThreads, sizeof(InT) == 4 ? 1 : 2)
act_rowwise_kernel(const ActKernelParams p, const RowwiseGeom geo) {
  constexpr bool kGated = Op::kGated;
  constexpr bool kTwoOut = kBwd && kGated;
  constexpr int kU = RowwiseUnroll<Op, kBwd, InT>::value;
  constexpr bool kPrefetch = RowwisePrefetch<kBwd, kOut>::value;
  // Block formats: values rounded to the input dtype (SPEC §5.1) by eval8; kBlkChunks chunks per 1xN block.
  constexpr bool kBlk = kOut == OutKind::kMxRow || kOut == OutKind::kNvRow;
  constexpr uint32_t kBlkChunks = uint32_t((kOut == OutKind::kNvRow ? kNvBlock : kMxBlock) / kVec);
  __shared__ float red[kRowThreads / 32];
  extern __shared__ float lut[];

  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const float scale = kind_scale<kOut>(p);
  NvGlobal nv{};
  if constexpr (kOut == OutKind::kNvRow) nv = nv_global(p);
  const int64_t cols = p.cols;
  const int64_t out_cols = kTwoOut ? 2 * cols : cols;
  const uint32_t n = geo.n_chunks;
  // The table path always walks whole steps of kU chunks (a compile-time count: no per-chunk bound checks in its
  // rounds); a forced small launch has no whole round and goes straight to the one-chunk tail below.
  const int step_units = kLut ? kU : geo.units;
  const uint32_t per_step = uint32_t(kRowThreads) * uint32_t(step_units);
  const InT* x = static_cast<const InT*>(p.x);
  const InT* g = static_cast<const InT*>(p.grad);

  auto offsets = [&](uint32_t ci, int64_t& xoff, int64_t& ooff) {
    chunk_offsets<kGated, kTwoOut>(ci, geo, cols, xoff, ooff);
  };
  // The raw inputs of one step: a (and b, grad) per chunk.
  struct Regs {
    Vec8<InT> a[kU], b[kU], g[kU];
  };
  auto load_step = [&](Regs& r, uint32_t step, int units) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const uint32_t ci = step + threadIdx.x + uint32_t(u) * kRowThreads;
      if (u < units && ci < n) {
        int64_t xoff, ooff;
        offsets(ci, xoff, ooff);
        load_chunk<kGated, kBwd>(x, g, xoff, cols, ci, r.a[u], r.b[u], r.g[u]);
      }
    }
  };
  float amax = 0.0f;
  // kWhole: every chunk of the step exists for every thread (whole steps of the table path), so no per-chunk bound
  // checks and full-warp shuffles in the block emitters.
  auto compute_step = [&](const Regs& r, uint32_t step, int units, auto whole) {
    constexpr bool kWhole = decltype(whole)::value;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const uint32_t ci = step + threadIdx.x + uint32_t(u) * kRowThreads;
      if (!kWhole && (u >= units || ci >= n)) break;
      int64_t xoff, ooff;
      offsets(ci, xoff, ooff);
      float out[2][kVec];
      eval8<Op, kBwd, kLut, kBlk>(r.a[u], r.b[u], r.g[u], p.act, lut, out);
#pragma unroll
      for (int h = 0; h < (kTwoOut ? 2 : 1); ++h) {
        if constexpr (kBlk) {
          int64_t soff;  // byte of the chunk's block scale
          if (geo.scale_linear) {
            soff = int64_t(ci / kBlkChunks);
          } else {
            const uint32_t r = geo.row_of.div(ci);
            const int64_t j = (int64_t(ci - r * geo.cpr) * kVec + h * cols) / (kBlkChunks * kVec);
            soff = kOut == OutKind::kMxRow ? mx_row_scale_offset(r, j, out_cols, p.blk_swizzled)
                                           : nv_row_scale_offset(r, j, out_cols, p.blk_swizzled);
          }
          if constexpr (kOut == OutKind::kMxRow) {
            emit8_mx_row<kWhole>(out[h], p, ooff + h * cols, soff);
          } else {
            emit8_nv_row<kWhole>(out[h], p, nv, ooff + h * cols, soff);
          }
        } else {
          emit8<kOut, InT>(out[h], p.out, ooff + h * cols, scale, p.e4m3, amax);
        }
      }
    }
  };
  // Whole rounds skip the checks for the block formats only: the other kinds keep their measured code (H200: gelu ->
  // FP8 delayed ran 3 % slower with the checks dropped).
  const std::integral_constant<bool, kBlk> whole{};
  const std::false_type checked{};

  const uint32_t first = blockIdx.x * per_step;
  const uint32_t stride = gridDim.x * per_step;
  // Table path: whole rounds (every block one full step) first; the chunks left over are then spread over all
  // blocks one chunk per thread, so no block walks a whole extra step while the others idle.
  const uint32_t full_end = kLut ? (n / stride) * stride : n;
  Regs r0, r1;
  if constexpr (kLut && kPrefetch) {
    // Two register sets: the next step's loads are in flight during this step's math.
    if (first < full_end) load_step(r0, first, step_units);
    lut_fill<Op, kBwd, kRowThreads, kBlk>(lut, p.act);  // overlaps the first loads
    walk_double_buffered(
        first, full_end, stride, r0, r1, [&](Regs& r, uint32_t step) { load_step(r, step, step_units); },
        [&](const Regs& r, uint32_t step) { compute_step(r, step, step_units, whole); });
  } else {
    if constexpr (kLut) {
      if (first < full_end) load_step(r0, first, step_units);
      lut_fill<Op, kBwd, kRowThreads, kBlk>(lut, p.act);  // overlaps the first loads
    }
    for (uint32_t step = first; step < full_end; step += stride) {
      if (!kLut || step != first) load_step(r0, step, step_units);
      if constexpr (kLut) {
        compute_step(r0, step, step_units, whole);
      } else {
        compute_step(r0, step, step_units, checked);
      }
    }
  }
  if constexpr (kLut) {
    for (uint32_t step = full_end + blockIdx.x * kRowThreads; step < n; step += gridDim.x * kRowThreads) {
      load_step(r0, step, 1);
      compute_step(r0, step, 1, checked);
    }
  }
  if constexpr (kOut == OutKind::kMxRow) mx_row_scale_padding(p.blk_scale, p.rows, out_cols, p.blk_swizzled);
  if constexpr (kOut == OutKind::kNvRow) nv_scale_padding(p, out_cols);
  if constexpr (OutTraits<kOut>::kTrackAmax) block_amax_to_global<kRowThreads>(amax, red, p.amax);
}

// ---- Gated forward ops to plain outputs: a 2-D grid ----------------------------------------------------------------
// x [rows, 2*cols] -> y [rows, cols] in the input dtype. One chunk of 8 outputs per thread: kGatedCols threads of a
// block along a row, kGatedRows rows per block, blockIdx.y down the rows (strided past the grid's 65535 limit). No
// chunk -> row division, no table fill per block, the functor's computed math, full occupancy for 16-bit inputs (32
// registers: at 42-51 registers the H200 lost 10-18 %), and store8_packed keeps the output one 16-byte store per
// chunk. The loads sit in a block of their own (the unrolled loop of one row and its bounds check): written as one
// straight block with the math, ptxas issued the b load only after a's math (SASS of swiglu bf16), and the two load
// latencies queued one behind the other.
// swiglu bf16, x 16384x16384, H200: 191.3 us in the benchmark (torch.compile 189.5 in the same run; 194.0 with the b
// load after a's math; act_rowwise_kernel with tables 198.5). A probe with L2 flushed between calls: this kernel 190.0,
// 128x1 / 64x2 / 32x8 blocks 190.7-192.8, 128x2 196.9, 256x1 229.6; load hints (ld.global.nc.L1::no_allocate, .cs,
// an L2 evict_first policy) 194-195, st.global.cs 190.9, 2 or 4 values per thread 211-322; with compile's kind of
// sigmoid (__expf, __fdividef) this kernel took 188.4 against 189.9: the gap to compile is the exact math (SPEC's
// sigmoid with our own exp and an RN reciprocal, bit-identical to the host: 256 SASS instructions per 8 outputs, 200
// with the approximations). H100 (the kernel before the loads moved): 267 against 281 (compile 269). FP8 outputs
// stay with act_rowwise_kernel's tables (this kernel computing them: H100 delayed 243 against 233 us, current 439
// against 417).
constexpr int kGatedCols = 64;  // chunks along a row per block
constexpr int kGatedRows = 4;   // rows per block

template <class Op, typename InT>
__global__ void __launch_bounds__(kGatedCols * kGatedRows, sizeof(InT) == 4 ? 6 : 8)
act_gated_rows_kernel(const ActKernelParams p) {
  static_assert(Op::kGated, "gated forward ops only");
  constexpr int kRowsPerThread = 1;  // per step: the loop below gives the loads their own block
  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const int64_t cols = p.cols;
  const int64_t c = (int64_t(blockIdx.x) * kGatedCols + threadIdx.x % kGatedCols) * kVec;
  if (c >= cols) return;
  const InT* x = static_cast<const InT*>(p.x);
  InT* y = static_cast<InT*>(p.out);
  for (int64_t r0 = int64_t(blockIdx.y) * kGatedRows + threadIdx.x / kGatedCols; r0 < p.rows;
       r0 += int64_t(gridDim.y) * kGatedRows * kRowsPerThread) {
    Vec8<InT> a[kRowsPerThread], b[kRowsPerThread];
#pragma unroll
    for (int u = 0; u < kRowsPerThread; ++u) {
      const int64_t r = r0 + u * kGatedRows;
      if (r < p.rows) {
        const InT* xr = x + r * 2 * cols + c;
        a[u] = *reinterpret_cast<const Vec8<InT>*>(xr);
        b[u] = *reinterpret_cast<const Vec8<InT>*>(xr + cols);
      }
    }
#pragma unroll
    for (int u = 0; u < kRowsPerThread; ++u) {
      const int64_t r = r0 + u * kGatedRows;
      if (r < p.rows) {
        float out[2][kVec];
        eval8<Op, false, false>(a[u], b[u], b[u], p.act, nullptr, out);
        store8_packed(y + r * cols + c, out[0]);
      }
    }
  }
}

// ---- Current scaling in one launch (small tensors) ------------------------------------------------------------------
// Rowwise FP8 with current scaling, for tensors that one resident grid covers with at most kCoopUnits chunks per
// thread: each thread evaluates its chunks once and keeps the values in registers; each block writes its amax to
// amax_partials[block]; after a grid barrier every block reduces the partials (the same max as the amax pass: max is
// exact and order-free) and casts its values with that scale. One launch, no memset, no second read of the input:
// the launch-bound regime of small calls. Needs a cooperative launch (all blocks resident).
template <class Op, bool kBwd> constexpr int coop_units() { return (kBwd && Op::kGated) ? 1 : 2; }
static_assert(kOneLaunchMaxElems == int64_t(kOneLaunchAmaxSlots) * kRowThreads * 2 * kVec,
              "activation.h's one-launch size: the slots times a block's chunks at two per thread");

template <class Op, bool kBwd, typename InT>
__global__ void __launch_bounds__(kRowThreads, 2) act_current_coop_kernel(const ActKernelParams p, const RowwiseGeom geo) {
  constexpr bool kGated = Op::kGated;
  constexpr bool kTwoOut = kBwd && kGated;
  constexpr int kU = coop_units<Op, kBwd>();
  __shared__ float red[kRowThreads / 32];
  if (p.noop != nullptr && *p.noop == 1.0f) return;  // uniform over the grid: no block waits at the barrier
  const int64_t cols = p.cols;
  const uint32_t n = geo.n_chunks;
  const InT* x = static_cast<const InT*>(p.x);
  const InT* g = static_cast<const InT*>(p.grad);
  auto chunk = [&](int u) { return (blockIdx.x + uint32_t(u) * gridDim.x) * uint32_t(kRowThreads) + threadIdx.x; };
  Vec8<InT> a[kU], b[kU], gr[kU];
  int64_t ooff[kU];
  bool live[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const uint32_t ci = chunk(u);
    live[u] = ci < n;
    if (live[u]) {
      int64_t xoff;
      chunk_offsets<kGated, kTwoOut>(ci, geo, cols, xoff, ooff[u]);
      load_chunk<kGated, kBwd>(x, g, xoff, cols, ci, a[u], b[u], gr[u]);
    }
  }
  float v[kU][2][kVec];
  float amax = 0.0f;
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    if (live[u]) {
      eval8<Op, kBwd, false>(a[u], b[u], gr[u], p.act, nullptr, v[u]);
#pragma unroll
      for (int h = 0; h < (kTwoOut ? 2 : 1); ++h)
#pragma unroll
        for (int k = 0; k < kVec; ++k) amax = amax_update(amax, v[u][h][k]);
    }
  }
  // Block amax -> this block's slot; after the grid barrier every block reduces all slots (L2 reads: other SMs
  // wrote them during this launch) and broadcasts the result through red[0].
  const float block_amax = block_amax_warp0<kRowThreads>(amax, red);
  if (threadIdx.x == 0) p.amax_partials[blockIdx.x] = block_amax;
  cooperative_groups::this_grid().sync();
  float m = 0.0f;
  for (uint32_t i = threadIdx.x; i < gridDim.x; i += kRowThreads) m = amax_update(m, __ldcg(p.amax_partials + i));
  m = block_amax_warp0<kRowThreads>(m, red);
  if (threadIdx.x == 0) red[0] = m;
  __syncthreads();
  m = red[0];
  const float scale = current_scale(m, fp8_max(p.e4m3), p.amax_epsilon, p.force_pow2);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *p.amax = m;
    *p.scale_inv = 1.0f / scale;
  }
  float unused = 0.0f;
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    if (live[u]) {
#pragma unroll
      for (int h = 0; h < (kTwoOut ? 2 : 1); ++h)
        emit8<OutKind::kCurrent, InT>(v[u][h], p.out, ooff[u] + h * cols, scale, p.e4m3, unused);
    }
  }
}

// ---- NVFP4 rowwise, table kernel --------------------------------------------------------------------------------
// Unary forward op on bf16 to NVFP4 rowwise (no transposed copy), the large-tensor case: one thread owns whole 1x16
// blocks (two 16-byte loads), so a block's amax, scale code and multiplier take no shuffle and are paid once per 16
// values, and its 8 code bytes leave in one store. A resident grid of kNvRowThreads-thread blocks, one per SM; each
// fills its tables once (while its first loads are in flight) and walks steps of kNvRowUnits blocks per thread in
// whole rounds, double-buffered in registers, then the leftover blocks one per thread.
// Tables (FP32 entries of rnd_in(fwd), the exact values the computed path gives): the bf16 magnitudes m in
// [0x3300, 0x4300) of kLutLo.. at byte 4 * (m - 0x3300), negatives kNvRowNegOffset further, so that the offset of
// both halves of a 32-bit word of inputs is one shift-add and one mask (nv_row_offsets); the 128 block multipliers
// of the possible scale codes sit in the gap. Blocks with any input outside the table (zeros, tiny, huge, Inf/NaN)
// take the computed path and the NaN-safe encoder.
constexpr int kNvRowThreads = 1024;
constexpr int kNvRowUnits = 2;                                // 16-element blocks per thread and step
constexpr uint32_t kNvRowNegOffset = 0x20000u;                // bit 15 of a half, shifted left by 2
constexpr uint32_t kNvRowEncOffset = 4u * kLutPerSign;        // 16 KB: the multipliers, after the positive half
constexpr size_t kNvRowSmem = kNvRowNegOffset + 4u * kLutPerSign;
static_assert(kNvRowEncOffset + 128 * 4 <= kNvRowNegOffset, "the multipliers fit between the table halves");

// Byte offsets of the 16 bf16 of a block into the tables; false when any lies outside them. For the low half h of a
// word w, 4w - 4 * kLutLo holds h - kLutLo (mod 2^16) in bits 2..17 (a borrow only reaches bit 18 and up); for the
// high half, (w >> 14) - 4 * kLutLo likewise (bits 0-1 hold bits 14-15 of w and take no borrow). An in-range half
// is sign * 0x8000 + index with index < 0x1000, so bits 12-14 of h - kLutLo are clear exactly for in-range halves
// (lut_offsets' test, two bits higher); the mask keeps the index and moves the sign to kNvRowNegOffset.
__device__ __forceinline__ bool nv_row_offsets(const Vec8<bf16_t> (&v)[2], uint32_t (&off)[16]) {
  constexpr uint32_t kMask = 0x3FFCu | kNvRowNegOffset;
  uint32_t any = 0u;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(&v[c]);
#pragma unroll
    for (int j = 0; j < kVec / 2; ++j) {
      const uint32_t lo = (w[j] << 2) - 4u * kLutLo, hi = (w[j] >> 14) - 4u * kLutLo;
      any |= lo | hi;
      off[8 * c + 2 * j] = lo & kMask;
      off[8 * c + 2 * j + 1] = hi & kMask;
    }
  }
  return (any & (0x7000u << 2)) == 0u;
}

template <class Op>
__device__ __forceinline__ void nv_row_tables(unsigned char* smem, const ActArgs& args, float s_dec) {
  float* enc = reinterpret_cast<float*>(smem + kNvRowEncOffset);
  if (threadIdx.x < 128) enc[threadIdx.x] = nvfp4_block_multiplier(uint8_t(threadIdx.x), s_dec);
  for (uint32_t i = threadIdx.x; i < kLutEntries; i += kNvRowThreads) {
    const uint32_t neg = i / kLutPerSign, m = i % kLutPerSign;
    const float a = to_float(bf16_t{uint16_t((neg << 15) | (m + kLutLo))});
    *reinterpret_cast<float*>(smem + neg * kNvRowNegOffset + 4u * m) = round_to<bf16_t>(Op::Fn::fwd(a, args));
  }
  __syncthreads();
}

// Geometry of the table kernel: blocks = rows * cols / 16 (< 2^31), blocks per row, and whether the scale of block b
// is byte b (compact scales whose rows hold exactly the data's blocks).
struct NvRowGeom {
  uint32_t n_blocks = 0;
  uint32_t bpr = 0;
  FastDiv row_of;
  bool scale_linear = false;
};

// Eight codes of the 16 values `v` of one block (two words) with multiplier `enc`: the NaN-safe encoder unless the
// values are known NaN-free (`finite`), then without the cap where fl(amax * enc) < 7.
__device__ __forceinline__ uint2 nv_encode16(const float (&v)[16], float amax, float enc, bool finite) {
  if (!finite) return make_uint2(nvfp4_pack8(v, enc), nvfp4_pack8(v + 8, enc));
  if (amax * enc < 7.0f) return make_uint2(nvfp4_pack8_nonan<false>(v, enc), nvfp4_pack8_nonan<false>(v + 8, enc));
  return make_uint2(nvfp4_pack8_nonan<true>(v, enc), nvfp4_pack8_nonan<true>(v + 8, enc));
}

// One 1x16 block of the table kernels from its 16 values (rnd_in): the E4M3 scale code of amax * S_enc / 6 and the
// 8 code bytes with the block multiplier enc_tab[sf] (sf <= 0x7E: the amax is >= 0 and NaN-free).
struct NvBlockCodes {
  uint2 codes;
  uint32_t sf;
};
__device__ __forceinline__ NvBlockCodes nv_block16(const float (&v)[16], float s_enc6, const float* enc_tab,
                                                   bool finite) {
  float a = 0.0f;
#pragma unroll
  for (int k = 0; k < 16; ++k) a = amax_update(a, v[k]);
  const uint32_t sf = float2_to_fp8x2<true>(a * s_enc6, 0.0f);  // high byte: the code of 0
  return {nv_encode16(v, a, enc_tab[sf], finite), sf};
}

template <class Op>
__global__ void __launch_bounds__(kNvRowThreads, 1)
act_nv_row_kernel(const ActKernelParams p, const NvRowGeom geo) {
  static_assert(!Op::kGated, "the table kernel takes unary forward ops");
  extern __shared__ __align__(16) unsigned char smem[];
  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const NvGlobal nv = nv_global(p);
  const float s_enc6 = nv.s_enc * kInv6;
  const int64_t cols = p.cols;
  const uint32_t n = geo.n_blocks;
  const Vec8<bf16_t>* x = static_cast<const Vec8<bf16_t>*>(p.x);  // two chunks per block
  uint2* out = static_cast<uint2*>(p.out);                        // 8 code bytes per block
  const float* enc_tab = reinterpret_cast<const float*>(smem + kNvRowEncOffset);

  struct Regs {
    Vec8<bf16_t> a[kNvRowUnits][2];
  };
  auto load_step = [&](Regs& r, uint32_t step, int units) {
#pragma unroll
    for (int u = 0; u < kNvRowUnits; ++u) {
      const uint32_t b = step + threadIdx.x + uint32_t(u) * kNvRowThreads;
      if (u < units && b < n) {
        r.a[u][0] = x[2 * int64_t(b)];
        r.a[u][1] = x[2 * int64_t(b) + 1];
      }
    }
  };
  auto emit_block = [&](const Vec8<bf16_t> (&raw)[2], uint32_t b) {
    float v[16];
    uint32_t off[16];
    const bool finite = nv_row_offsets(raw, off);
    if (finite) {
#pragma unroll
      for (int k = 0; k < 16; ++k) v[k] = *reinterpret_cast<const float*>(smem + off[k]);
    } else {
      // Rare (an input outside the tables): one chunk at a time through local memory, so that this code beside the
      // hot loop stays small (H200: fully unrolled, the loop outgrew the instruction cache, 108 instead of 95 us).
      float w[2][kVec];
#pragma unroll 1
      for (int c = 0; c < 2; ++c) {
        const Vec8<bf16_t> rc = c == 0 ? raw[0] : raw[1];
        float o[2][kVec];
        eval8<Op, false, false, true>(rc, rc, rc, p.act, nullptr, o);
#pragma unroll
        for (int k = 0; k < kVec; ++k) w[c][k] = o[0][k];
      }
#pragma unroll
      for (int k = 0; k < 16; ++k) v[k] = w[k / 8][k % 8];
    }
    const NvBlockCodes nb = nv_block16(v, s_enc6, enc_tab, finite);
    out[b] = nb.codes;
    int64_t soff = b;
    if (!geo.scale_linear) {
      const uint32_t r = geo.row_of.div(b);
      soff = nv_row_scale_offset(r, b - r * geo.bpr, cols, p.blk_swizzled);
    }
    p.blk_scale[soff] = uint8_t(nb.sf);
  };
  auto compute_step = [&](const Regs& r, uint32_t step, int units, bool checked) {
#pragma unroll
    for (int u = 0; u < kNvRowUnits; ++u) {
      const uint32_t b = step + threadIdx.x + uint32_t(u) * kNvRowThreads;
      if (checked && (u >= units || b >= n)) break;
      emit_block(r.a[u], b);
    }
  };

  constexpr uint32_t kPerStep = uint32_t(kNvRowThreads) * kNvRowUnits;
  const uint32_t first = blockIdx.x * kPerStep;
  const uint32_t stride = gridDim.x * kPerStep;
  const uint32_t full_end = (n / stride) * stride;
  Regs r0, r1;
  if (first < full_end) load_step(r0, first, kNvRowUnits);
  nv_row_tables<Op>(smem, p.act, nv.s_dec);  // overlaps the first loads
  walk_double_buffered(
      first, full_end, stride, r0, r1, [&](Regs& r, uint32_t step) { load_step(r, step, kNvRowUnits); },
      [&](const Regs& r, uint32_t step) { compute_step(r, step, kNvRowUnits, false); });
  for (uint32_t step = full_end + blockIdx.x * kNvRowThreads; step < n; step += gridDim.x * kNvRowThreads) {
    load_step(r0, step, 1);
    compute_step(r0, step, 1, true);
  }
  nv_scale_padding(p, cols);
}

// ---- NVFP4 both copies, table kernel ----------------------------------------------------------------------------
// Unary forward op on bf16 to both NVFP4 copies, on 128 x 128 tiles (rows and positions multiples of 128), the
// large-tensor case. Row pass: a thread owns four whole 1x16 row blocks of the tile (rnd_in values from the split bf16
// table, the row copy as in act_nv_row_kernel) and stages their bf16 bits in shared memory. Column pass: a thread
// owns two adjacent columns x 32 rows (two 16x1 blocks per column): 32-bit reads give both columns at once, and each
// column's 32 rows of codes leave as one 16-byte store along the transposed copy's rows (adjacent lanes hold adjacent
// 32-row runs: whole 32-byte sectors). The next tile's loads are in flight during the column pass. Two 256-thread
// blocks per SM (up to 128 registers; at three blocks, 80 registers spill).
// Shared memory: the split bf16 table (halves at 0 and kHalfLutNegOffset), the block multipliers after its positive
// half, the staged 128 x 128 bf16 tile (nv_stage_word) in the gap. Measured slower on H200 (16384 x 8192, this kernel
// 220.6 us): a second staged tile after the table, one barrier per tile instead of two, 244.2 us (likely the L1 left
// beside 2 x 104 KB of shared memory, which the row pass's paired 16-byte loads lean on); one 1024-thread block per
// SM on the FP32 tables with two staged tiles in their gap, a 16x1 column block per thread (16-bit reads), 245.0 us;
// warps walking 16 x 64 tiles with no block barrier, 8-byte column stores completing sectors across warps, 522 us.
constexpr int kNvColThreads = 256;
constexpr int kNvColTile = 128;
constexpr int kNvColUnits = kNvColTile * kNvColTile / 16 / kNvColThreads;  // row blocks per thread and tile (4)
constexpr uint32_t kNvColStageOffset = 0x4000u;
constexpr size_t kNvColSmem = kNvTabBytes;
static_assert(kNvColStageOffset >= kHalfLutHalfBytes + 128 * 4 &&
                  kNvColStageOffset + kNvColTile * kNvColTile * 2 <= kHalfLutNegOffset,
              "the staged tile fits between the table halves, after the multipliers");

// Staged word (row r, word w = positions 2w, 2w + 1): 64 words per row, w ^ 4 for w >= 32 (the 16-byte stores of
// a quarter warp, 8 row blocks of one row, then hit 8 different bank quads), ^ 16 in odd 32-row runs (the column
// pass reads 16 words of one run and 16 of the next per warp).
__device__ __forceinline__ int nv_stage_word(int r, int w) { return r * 64 + (w ^ (4 * ((w >> 5) & 1)) ^ (16 * ((r >> 5) & 1))); }

struct NvColGeom {
  int64_t col_tiles = 1;
  int64_t tiles = 1;
};

template <class Op>
__global__ void __launch_bounds__(kNvColThreads, 2)
act_nv_rowcol_kernel(const ActKernelParams p, const NvColGeom geo) {
  static_assert(!Op::kGated, "the table kernel takes unary forward ops");
  extern __shared__ __align__(16) unsigned char smem[];
  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const NvGlobal nv = nv_global(p);
  const float s_enc6 = nv.s_enc * kInv6;
  const int64_t rows = p.rows, cols = p.cols;
  const bool swz = p.blk_swizzled;
  const int tid = threadIdx.x;
  const bf16_t* x = static_cast<const bf16_t*>(p.x);
  const float* enc_tab = nv_enc_tab(reinterpret_cast<const float*>(smem));
  uint32_t* stage = reinterpret_cast<uint32_t*>(smem + kNvColStageOffset);

  // Row pass unit i of this thread: tile row (tid + 256 i) / 8, row block (tid + 256 i) % 8.
  Vec8<bf16_t> raw[kNvColUnits][2];
  auto issue = [&](int64_t t) {
    if (t >= geo.tiles) return;
    const int64_t rt = t / geo.col_tiles;
    const int64_t m0 = rt * kNvColTile, c0 = (t - rt * geo.col_tiles) * kNvColTile;
#pragma unroll
    for (int i = 0; i < kNvColUnits; ++i) {
      const int u = tid + kNvColThreads * i;
      const Vec8<bf16_t>* src = reinterpret_cast<const Vec8<bf16_t>*>(x + (m0 + u / 8) * cols + c0 + 16 * (u % 8));
      raw[i][0] = src[0];
      raw[i][1] = src[1];
    }
  };
  issue(blockIdx.x);
  if (tid < 128) const_cast<float*>(enc_tab)[tid] = nvfp4_block_multiplier(uint8_t(tid), nv.s_dec);
  half_lut_fill<Op, kNvColThreads>(smem, p.act);  // overlaps the first loads; ends with a barrier

  for (int64_t t = blockIdx.x; t < geo.tiles; t += gridDim.x) {
    const int64_t rt = t / geo.col_tiles;
    const int64_t m0 = rt * kNvColTile, c0 = (t - rt * geo.col_tiles) * kNvColTile;
    bool finite = true;
#pragma unroll
    for (int i = 0; i < kNvColUnits; ++i) {
      const int u = tid + kNvColThreads * i, r = u / 8, j = u % 8;
      uint32_t h[16];  // bf16 bits of the rnd_in values
      uint32_t off[2][kVec];
      const bool fin = lut_offsets<true>(raw[i][0], off[0]) & lut_offsets<true>(raw[i][1], off[1]);
      if (fin) {
#pragma unroll
        for (int k = 0; k < 16; ++k) h[k] = *reinterpret_cast<const uint16_t*>(smem + off[k / 8][k % 8]);
      } else {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float o[2][kVec];
          eval8<Op, false, false, true>(raw[i][c], raw[i][c], raw[i][c], p.act, nullptr, o);
#pragma unroll
          for (int k = 0; k < kVec; ++k) h[8 * c + k] = float_bits(o[0][k]) >> 16;
        }
      }
      finite = finite && fin;
      if (p.out != nullptr) {
        float v[16];
#pragma unroll
        for (int k = 0; k < 16; ++k) v[k] = bits_float(h[k] << 16);
        const NvBlockCodes nb = nv_block16(v, s_enc6, enc_tab, fin);
        const int64_t jb = c0 / kNvBlock + j;  // the block's index along its row
        static_cast<uint2*>(p.out)[(m0 + r) * (cols / kNvBlock) + jb] = nb.codes;
        p.blk_scale[nv_row_scale_offset(m0 + r, jb, cols, swz)] = uint8_t(nb.sf);
      }
      // Stage the 16 values as 8 words of bf16 pairs: two 16-byte stores.
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        uint32_t wd[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) wd[k] = h[8 * hh + 2 * k] | (h[8 * hh + 2 * k + 1] << 16);
        *reinterpret_cast<uint4*>(stage + nv_stage_word(r, 8 * j + 4 * hh)) = make_uint4(wd[0], wd[1], wd[2], wd[3]);
      }
    }
    issue(t + gridDim.x);  // the next tile's loads fly during the column pass
    const bool tile_finite = __syncthreads_and(finite) != 0;

    // Column pass: column pair cp (columns 2cp, 2cp + 1 of the tile), 32-row run q.
    const int lane = tid & 31, warp = tid >> 5;
    const int cp = (lane >> 1) + 16 * (warp & 3), q = (lane & 1) + 2 * (warp >> 2);
    uint32_t res[2][4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t wd[16];
#pragma unroll
      for (int rr = 0; rr < 16; ++rr) wd[rr] = stage[nv_stage_word(32 * q + 16 * half + rr, cp)];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float v[16];
#pragma unroll
        for (int rr = 0; rr < 16; ++rr) v[rr] = bits_float(c == 0 ? wd[rr] << 16 : wd[rr] & 0xFFFF0000u);
        const NvBlockCodes nb = nv_block16(v, s_enc6, enc_tab, tile_finite);
        res[c][2 * half] = nb.codes.x;
        res[c][2 * half + 1] = nb.codes.y;
        const int64_t k = c0 + 2 * cp + c;
        p.blk_scale_t[nv_col_scale_offset(k, (m0 + 32 * q + 16 * half) / kNvBlock, rows, swz)] = uint8_t(nb.sf);
      }
    }
#pragma unroll
    for (int c = 0; c < 2; ++c)
      *reinterpret_cast<uint4*>(p.out_t + (c0 + 2 * cp + c) * (rows / 2) + (m0 + 32 * q) / 2) =
          make_uint4(res[c][0], res[c][1], res[c][2], res[c][3]);
    __syncthreads();  // the staged tile has been read
  }
  nv_scale_padding(p, cols);
}

// ---- Strip kernel ------------------------------------------------------------------------------------------------
// dbias (unary ops), aligned rows, no transposed copy. Work item (strip s, row block b): kActStripCols consecutive
// positions (thread t: 8t..8t+7) of the act_dbias_rows rows of block b; each thread sums its own positions down
// the rows and writes them as the item's partial row, so no shared-memory reduction is needed. Blocks walk items
// b-major (grid-stride), so the table path fills its tables once per block. Two rows of loads per step.
constexpr int kStripRows = 2;
static_assert(kActStripCols == kThreads * kVec, "a strip is one 8-position chunk per thread");

template <class Op, bool kBwd, typename InT, OutKind kOut, bool kLut>
__global__ void __launch_bounds__(kThreads, sizeof(InT) == 4 ? 2 : 4)
act_strip_kernel(const ActKernelParams p, int64_t block_rows, int64_t n_strips, int64_t n_items) {
  static_assert(!Op::kGated, "dbias is defined for unary activations only");
  __shared__ float red[kThreads / 32];
  extern __shared__ float lut[];
  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const float scale = kind_scale<kOut>(p);
  if constexpr (kLut) lut_fill<Op, kBwd, kThreads>(lut, p.act);
  const int64_t rows = p.rows, cols = p.cols;
  const InT* x = static_cast<const InT*>(p.x);
  const InT* g = static_cast<const InT*>(p.grad);
  float amax = 0.0f;
  for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
    const int64_t blk = item / n_strips;
    const int64_t c0 = ((item - blk * n_strips) * kThreads + threadIdx.x) * kVec;
    if (c0 >= cols) continue;
    const int64_t m0 = blk * block_rows, m1 = min(rows, m0 + block_rows);
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
        for (int k = 0; k < kVec; ++k) dsum[k] += out[0][k];
        emit8<kOut, InT>(out[0], p.out, (r0 + i) * cols + c0, scale, p.e4m3, amax);
      }
    }
    float* dst = p.dbias_partial + blk * cols + c0;
    *reinterpret_cast<float4*>(dst) = make_float4(dsum[0], dsum[1], dsum[2], dsum[3]);
    *reinterpret_cast<float4*>(dst + 4) = make_float4(dsum[4], dsum[5], dsum[6], dsum[7]);
  }
  if constexpr (OutTraits<kOut>::kTrackAmax) block_amax_to_global<kThreads>(amax, red, p.amax);
}

// NVFP4 both copies of one 128 x 64 tile of the pipelined kernel (thread: rows 4*rgroup.. of positions
// 8*cchunk..; `eval(i, out)` gives the op on row i of the thread). Rowwise 1x16 blocks are lane pairs; a 16x1
// columnwise block is one column of the 4 row groups of a warp (the thread's 4 rows, then two shuffles), so no
// amax goes through shared memory. The rounded values stay in registers as the input dtype (exact) until the
// column scales are known; the transposed codes (2 bytes per column and row group) and the column scales are
// staged in `tile` and leave as 16-byte runs along the rows of the transposed copy.
template <typename InT, int kOuts, class Eval>
__device__ __forceinline__ void nv_pipe_tile(const ActKernelParams& p, const NvGlobal& gs, const float* enc_tab,
                                             uint32_t* tile,
                                             int64_t m0, int64_t col_base, int64_t o_cols, Eval&& eval) {
  const int64_t rows = p.rows, cols = p.cols;
  const int tid = threadIdx.x, cchunk = tid % 8, rgroup = tid / 8;
  const int64_t c0 = col_base + cchunk * kVec;
  const bool col_ok = c0 < cols;  // cols % 16 == 0: lane pairs agree
  Vec8<InT> keep[kOuts][kRowsPerThread];
  float cmax[kOuts][kVec];
#pragma unroll
  for (int h = 0; h < kOuts; ++h)
#pragma unroll
    for (int k = 0; k < kVec; ++k) cmax[h][k] = 0.0f;
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t r = m0 + rgroup * kRowsPerThread + i;
    const bool ok = col_ok && r < rows;  // zero-filled rows and columns past the data hold 0: no effect on maxima
    float out[2][kVec];
    eval(i, out);
#pragma unroll
    for (int h = 0; h < kOuts; ++h) {
      float v[kVec];
      float a = 0.0f;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        v[k] = ok ? round_to<InT>(out[h][k]) : 0.0f;  // rnd_in (SPEC §5.1)
        a = amax_update(a, v[k]);
        cmax[h][k] = amax_update(cmax[h][k], v[k]);
        keep[h][i].e[k] = from_float<InT>(v[k]);
      }
      a = amax_update(a, __shfl_xor_sync(0xFFFFFFFFu, a, 1));
      if (ok && p.out != nullptr) {
        const uint8_t sf = nvfp4_block_scale(a, gs.s_enc);
        const int64_t off = r * o_cols + h * cols + c0;
        *reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(p.out) + off / 2) = nvfp4_pack8(v, enc_tab[sf]);
        if (cchunk % 2 == 0) p.blk_scale[nv_row_scale_offset(r, (h * cols + c0) / kNvBlock, o_cols, p.blk_swizzled)] = sf;
      }
    }
  }
  __syncthreads();  // the previous tile's staged codes have been read
  // Staged per output: 64 positions x 32 row groups of 2 code bytes (16-byte group g = rgroup / 8 of position j
  // at physical group g ^ (j / 8 % 4)), then 64 x 8 column-scale bytes.
  constexpr int kRegion = kTileCols * 32 * 4;
#pragma unroll
  for (int h = 0; h < kOuts; ++h) {
    uint16_t* codes = reinterpret_cast<uint16_t*>(reinterpret_cast<uint8_t*>(tile) + h * kRegion);
    uint8_t* scl = reinterpret_cast<uint8_t*>(tile) + h * kRegion + kTileCols * 64;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      float a = amax_update(cmax[h][k], __shfl_xor_sync(0xFFFFFFFFu, cmax[h][k], 8));
      a = amax_update(a, __shfl_xor_sync(0xFFFFFFFFu, a, 16));
      const uint8_t sf = nvfp4_block_scale(a, gs.s_enc);
      const float enc = enc_tab[sf];  // sf <= 0x7E: the amax is >= 0 and NaN-free
      uint32_t nib = 0u;
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) nib |= uint32_t(e2m1_encode(to_float(keep[h][i].e[k]) * enc)) << (4 * i);
      const int j = cchunk * kVec + k;
      codes[j * 32 + 8 * ((rgroup / 8) ^ ((j / 8) % 4)) + rgroup % 8] = uint16_t(nib);
      if (rgroup % 4 == 0) scl[j * 8 + rgroup / 4] = sf;
    }
  }
  __syncthreads();
  const bool vec_t = (rows / 2) % 16 == 0 && (reinterpret_cast<uintptr_t>(p.out_t) & 15) == 0;
#pragma unroll
  for (int h = 0; h < kOuts; ++h) {
    const uint8_t* region = reinterpret_cast<const uint8_t*>(tile) + h * kRegion;
    {  // codes: thread -> (position j, 32-row run s)
      const int j = tid / 4, sr = tid % 4;
      const int64_t pos = col_base + j, m = m0 + 32 * sr;
      if (pos < cols && m < rows) {
        const uint4 w = *reinterpret_cast<const uint4*>(region + j * 64 + 16 * (sr ^ ((j / 8) % 4)));
        uint8_t* dst = p.out_t + (h * cols + pos) * (rows / 2) + m / 2;
        if (vec_t && m + 32 <= rows) {
          *reinterpret_cast<uint4*>(dst) = w;
        } else {
#pragma unroll
          for (int b = 0; b < 16; ++b) {
            const uint32_t word = b < 4 ? w.x : (b < 8 ? w.y : (b < 12 ? w.z : w.w));
            if (m + 2 * b < rows) dst[b] = uint8_t(word >> (8 * (b % 4)));
          }
        }
      }
    }
#pragma unroll
    for (int e = tid; e < kTileCols * 8; e += kThreads) {  // column scales: (position e / 8, row block e % 8)
      const int64_t pos = col_base + e / 8, m = m0 + kNvBlock * (e % 8);
      if (pos < cols && m < rows)
        p.blk_scale_t[nv_col_scale_offset(h * cols + pos, m / kNvBlock, rows, p.blk_swizzled)] =
            region[kTileCols * 64 + e];
    }
  }
}

// ---- Pipelined tile kernel (transposed copies) ----------------------------------------------------------------
// FP8 output with a transposed copy, aligned rows, no dbias. Persistent blocks walk 128 x 64 tiles (column tile
// fastest, so the blocks in flight together read whole rows); each thread copies its own 4 rows x 8 positions of
// every input stream into shared memory with cp.async, kStages - 1 tiles ahead of the one it computes, so loads
// stay in flight while the block encodes, stages and stores the transposed codes. A thread reads back only what
// it copied itself, so the input buffers need no barrier; the staged transposed tile keeps the tile kernel's two.
constexpr int kPipeStages = 2;

template <class Op, bool kBwd, typename InT> struct PipeLayout {
  static constexpr int kStreams = 1 + int(Op::kGated) + int(kBwd);
  static constexpr int kOuts = (kBwd && Op::kGated) ? 2 : 1;
  static constexpr int kChunkBytes = kVec * int(sizeof(InT));                     // 16 (16-bit) or 32 (FP32)
  static constexpr int kStreamBytes = int(kActBlockRows) * kTileCols * int(sizeof(InT));
  static constexpr int kStageBytes = kStreams * kStreamBytes;
  static constexpr int kTileBytes = kOuts * kTileCols * 32 * 4;                   // staged transposed codes
  static constexpr size_t kLutOffset = size_t(kPipeStages) * kStageBytes + kTileBytes;
  template <bool kLut> static constexpr size_t smem_bytes() {
    return kLutOffset + (kLut ? LutPlan<Op, kBwd>::kBytes : 0);
  }
  // Blocks per SM that the shared memory allows (227 KB per SM on Hopper, 1 KB reserved per block), at most 4:
  // the register budget of __launch_bounds__ follows from it.
  template <bool kLut> static constexpr int min_blocks() {
    const int n = int((227 * 1024) / (smem_bytes<kLut>() + 1024));
    return n < 1 ? 1 : (n > 4 ? 4 : n);
  }
};


struct PipeGeom {
  int64_t col_tiles = 1;
  int64_t tiles = 1;
};

// The NVFP4 tiles keep a tile's rounded values in registers until the column scales are known: 2 blocks per SM (up
// to 128 registers) so that no instantiation spills.
template <class Op, bool kBwd, typename InT, OutKind kOut, bool kLut> constexpr int pipe_min_blocks() {
  constexpr int n = PipeLayout<Op, kBwd, InT>::template min_blocks<kLut>();
  return OutTraits<kOut>::kNv && n > 2 ? 2 : n;
}

template <class Op, bool kBwd, typename InT, OutKind kOut, bool kLut>
__global__ void __launch_bounds__(kThreads, pipe_min_blocks<Op, kBwd, InT, kOut, kLut>())
act_pipe_kernel(const ActKernelParams p, const PipeGeom geo) {
  using L = PipeLayout<Op, kBwd, InT>;
  using Tr = OutTraits<kOut>;
  static_assert(Tr::kFp8 || kOut == OutKind::kNvRowCol, "the transposed copy holds FP8 or NVFP4 codes");
  constexpr bool kGated = Op::kGated;
  constexpr int kOuts = L::kOuts;
  extern __shared__ __align__(16) unsigned char smem[];
  uint32_t* tile = reinterpret_cast<uint32_t*>(smem + kPipeStages * L::kStageBytes);
  const float* lut = reinterpret_cast<const float*>(smem + L::kLutOffset);
  __shared__ float red[kThreads / 32];

  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const float scale = kind_scale<kOut>(p);
  NvGlobal nv{};
  if constexpr (Tr::kNv) nv = nv_global(p);
  const int64_t rows = p.rows, cols = p.cols;
  const int64_t x_stride = kGated ? 2 * cols : cols;
  const int64_t o_cols = kOuts == 2 ? 2 * cols : cols;
  const int tid = threadIdx.x, cchunk = tid % 8, rgroup = tid / 8;
  const char* x = static_cast<const char*>(p.x);
  const char* g = static_cast<const char*>(p.grad);
  // This thread's chunk of row i of a stream in a stage buffer.
  auto chunk_at = [&](int stage, int stream, int i) {
    return smem + stage * L::kStageBytes + stream * L::kStreamBytes +
           ((rgroup * kRowsPerThread + i) * kTileCols + cchunk * kVec) * int(sizeof(InT));
  };
  auto issue = [&](int64_t t, int stage) {
    if (t < geo.tiles) {
      const int64_t rt = t / geo.col_tiles;
      const int64_t c0 = (t - rt * geo.col_tiles) * kTileCols + cchunk * kVec;
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        const int64_t r = rt * kActBlockRows + rgroup * kRowsPerThread + i;
        const bool valid = r < rows && c0 < cols;
        const int64_t xo = valid ? (r * x_stride + c0) * int64_t(sizeof(InT)) : 0;
        const int64_t go = valid ? (r * cols + c0) * int64_t(sizeof(InT)) : 0;
#pragma unroll
        for (int b = 0; b < L::kChunkBytes; b += 16) {
          cp_async16(chunk_at(stage, 0, i) + b, x + xo + b, valid);
          if (kGated) cp_async16(chunk_at(stage, 1, i) + b, x + xo + cols * int64_t(sizeof(InT)) + b, valid);
          if (kBwd) cp_async16(chunk_at(stage, L::kStreams - 1, i) + b, g + go + b, valid);
        }
      }
    }
    cp_async_commit();  // an empty group past the last tile keeps the wait count uniform
  };

  int64_t t = blockIdx.x;
#pragma unroll
  for (int s = 0; s < kPipeStages - 1; ++s) issue(t + s * int64_t(gridDim.x), s);
  if constexpr (kLut) lut_fill<Op, kBwd, kThreads>(const_cast<float*>(lut), p.act);  // overlaps the first loads
  // NVFP4: the block multipliers of the 128 scale codes an amax can give (no decode and division per block).
  __shared__ float nv_enc[Tr::kNv ? 128 : 1];
  if constexpr (Tr::kNv) {
    for (int i = threadIdx.x; i < 128; i += kThreads) nv_enc[i] = nvfp4_block_multiplier(uint8_t(i), nv.s_dec);
    __syncthreads();
  }
  float amax = 0.0f;
  for (int it = 0; t < geo.tiles; ++it, t += gridDim.x) {
    const int stage = it % kPipeStages;
    issue(t + (kPipeStages - 1) * int64_t(gridDim.x), (it + kPipeStages - 1) % kPipeStages);
    cp_async_wait<kPipeStages - 1>();
    const int64_t rt = t / geo.col_tiles;
    const int64_t col_base = (t - rt * geo.col_tiles) * kTileCols;
    const int64_t m0 = rt * kActBlockRows;
    const int64_t c0 = col_base + cchunk * kVec;
    if constexpr (Tr::kNv) {
      nv_pipe_tile<InT, kOuts>(p, nv, nv_enc, tile, m0, col_base, o_cols, [&](int i, float (&out)[2][kVec]) {
        const Vec8<InT> va = *reinterpret_cast<const Vec8<InT>*>(chunk_at(stage, 0, i));
        const Vec8<InT> vb = kGated ? *reinterpret_cast<const Vec8<InT>*>(chunk_at(stage, 1, i)) : va;
        const Vec8<InT> vg = kBwd ? *reinterpret_cast<const Vec8<InT>*>(chunk_at(stage, L::kStreams - 1, i)) : va;
        eval8<Op, kBwd, kLut>(va, vb, vg, p.act, lut, out);
      });
      continue;
    }
    uint32_t tw[kOuts][kVec] = {};  // byte i of word k = code of (row i of this thread's 4, position c0 + k)
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int64_t r = m0 + rgroup * kRowsPerThread + i;
      const bool valid = r < rows && c0 < cols;
      const Vec8<InT> va = *reinterpret_cast<const Vec8<InT>*>(chunk_at(stage, 0, i));
      const Vec8<InT> vb = kGated ? *reinterpret_cast<const Vec8<InT>*>(chunk_at(stage, 1, i)) : va;
      const Vec8<InT> vg = kBwd ? *reinterpret_cast<const Vec8<InT>*>(chunk_at(stage, L::kStreams - 1, i)) : va;
      float out[2][kVec];
      eval8<Op, kBwd, kLut>(va, vb, vg, p.act, lut, out);
#pragma unroll
      for (int h = 0; h < kOuts; ++h) {
        if constexpr (Tr::kTrackAmax) {
          if (valid)
#pragma unroll
            for (int k = 0; k < kVec; ++k) amax = amax_update(amax, out[h][k]);
        }
        const uint2 w = p.e4m3 ? encode8_t<InT, Tr::kRound, true>(out[h], scale)
                               : encode8_t<InT, Tr::kRound, false>(out[h], scale);
        if (valid && p.out != nullptr)
          *reinterpret_cast<uint2*>(static_cast<uint8_t*>(p.out) + r * o_cols + h * cols + c0) = w;
#pragma unroll
        for (int k = 0; k < kVec; ++k) tw[h][k] |= (((k < 4 ? w.x : w.y) >> (8 * (k % 4))) & 0xFFu) << (8 * i);
      }
    }
    __syncthreads();  // the previous tile's staged codes have been read
#pragma unroll
    for (int h = 0; h < kOuts; ++h)
#pragma unroll
      for (int k = 0; k < kVec; ++k) tile[h * kTileCols * 32 + tile_word(cchunk * kVec + k, rgroup)] = tw[h][k];
    __syncthreads();
#pragma unroll
    for (int h = 0; h < kOuts; ++h)
      store_transposed_tile(tile + h * kTileCols * 32, p.out_t + h * cols * rows, col_base, m0, rows, cols);
  }
  cp_async_wait<0>();
  if constexpr (Tr::kNv) nv_scale_padding(p, o_cols);
  if constexpr (Tr::kTrackAmax) block_amax_to_global<kThreads>(amax, red, p.amax);
}

// ---- Amax pass by shape (kAmax, unary forward, bf16) ---------------------------------------------------------------
// Over the bf16 values in increasing order, g(x) = |f(x)| (NaN counted as -1, i.e. ignored) splits into maximal
// monotone runs. A rising run ends at a peak or is the last run; a falling run starts at a peak or is the first. So the
// largest g over a tensor is g at one of: its smallest x (first run falling), its largest x (last run rising), and for
// each peak t its largest x below t and its smallest x at or above t: each is an element of the tensor lying in the
// same run as the maximiser, on the maximiser's far side. The pass keeps these 2 + 2 * peaks candidates (packed bf16
// min/max, one compare per peak per pair of values) and evaluates f only at the block's candidates: a read-only
// stream with no tables and no functor calls, whose result equals the per-element amax bit for bit. The host finds
// the peaks once per functor by evaluating it at every bf16 value (amax_shape), and uses the pass only when there
// are at most kAmaxMaxPeaks of them.
constexpr int kAmaxMaxPeaks = 2;
struct AmaxShape {
  int peaks = -1;                     // < 0: this functor's |f| has too many runs; use the computed pass
  uint32_t peak2[kAmaxMaxPeaks] = {}; // peak bf16 bits in both halves
};
constexpr uint32_t kBf16NaN2 = 0x7FC07FC0u;  // "no candidate yet" in both halves: ignored by the min/max below

// Packed bf16 max (kMax) or min: a NaN half yields the other operand; and the per-half mask of a >= b (0 for NaN).
template <bool kMax> __device__ __forceinline__ uint32_t bf16x2_minmax(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t d;
  if constexpr (kMax) {
    asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  } else {
    asm("min.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  }
  return d;
#else
  uint32_t d = 0;
  for (int h = 0; h < 2; ++h) {
    const uint32_t ha = (a >> (16 * h)) & 0xFFFFu, hb = (b >> (16 * h)) & 0xFFFFu;
    const float fa = bits_float(ha << 16), fb = bits_float(hb << 16);
    const bool take_b = is_nan(fa) || (!is_nan(fb) && (kMax ? fb > fa : fb < fa));
    d |= (take_b ? hb : ha) << (16 * h);
  }
  return d;
#endif
}
__device__ __forceinline__ uint32_t bf16x2_max(uint32_t a, uint32_t b) { return bf16x2_minmax<true>(a, b); }
__device__ __forceinline__ uint32_t bf16x2_min(uint32_t a, uint32_t b) { return bf16x2_minmax<false>(a, b); }
__device__ __forceinline__ uint32_t bf16x2_ge_mask(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t d;
  asm("set.ge.u32.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  uint32_t d = 0;
  for (int h = 0; h < 2; ++h) {
    const float fa = bits_float(((a >> (16 * h)) & 0xFFFFu) << 16), fb = bits_float(((b >> (16 * h)) & 0xFFFFu) << 16);
    if (fa >= fb) d |= 0xFFFFu << (16 * h);
  }
  return d;
#endif
}
// Both halves folded into one (max or min), as a bf16 value.
__device__ __forceinline__ uint32_t bf16x2_fold(uint32_t a, bool take_max) {
  const uint32_t s = (a >> 16) | (a << 16);
  return take_max ? bf16x2_max(a, s) : bf16x2_min(a, s);
}

constexpr int kAmaxShapeThreads = 512;
constexpr int kAmaxShapeUnroll = 4;  // 16-byte loads in flight per thread

template <class F>
__global__ void __launch_bounds__(kAmaxShapeThreads)
act_amax_shape_kernel(const ActKernelParams p, uint32_t n_chunks, const AmaxShape shape) {
  constexpr int kCand = 2 + 2 * kAmaxMaxPeaks;  // [0] max, [1] min, then (below t_j: max, at/above t_j: min)
  __shared__ uint32_t red[kCand][kAmaxShapeThreads / 32];
  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const uint4* x = static_cast<const uint4*>(p.x);
  uint32_t c[kCand];
#pragma unroll
  for (int k = 0; k < kCand; ++k) c[k] = kBf16NaN2;
  auto take_max = [](int k) { return k == 0 || (k >= 2 && k % 2 == 0); };
  const uint32_t per_step = uint32_t(kAmaxShapeThreads) * kAmaxShapeUnroll;
  for (uint32_t step = blockIdx.x * per_step; step < n_chunks; step += gridDim.x * per_step) {
    uint4 v[kAmaxShapeUnroll];
#pragma unroll
    for (int u = 0; u < kAmaxShapeUnroll; ++u) {
      const uint32_t ci = step + threadIdx.x + uint32_t(u) * kAmaxShapeThreads;
      v[u] = ci < n_chunks ? x[ci] : make_uint4(kBf16NaN2, kBf16NaN2, kBf16NaN2, kBf16NaN2);
    }
#pragma unroll
    for (int u = 0; u < kAmaxShapeUnroll; ++u) {
      const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        c[0] = bf16x2_max(c[0], w[i]);
        c[1] = bf16x2_min(c[1], w[i]);
#pragma unroll
        for (int j = 0; j < kAmaxMaxPeaks; ++j) {
          if (j < shape.peaks) {
            const uint32_t m = bf16x2_ge_mask(w[i], shape.peak2[j]);
            c[2 + 2 * j] = bf16x2_max(c[2 + 2 * j], (w[i] & ~m) | (kBf16NaN2 & m));
            c[3 + 2 * j] = bf16x2_min(c[3 + 2 * j], (w[i] & m) | (kBf16NaN2 & ~m));
          }
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kCand; ++k) {
    c[k] = bf16x2_fold(c[k], take_max(k));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const uint32_t other = __shfl_xor_sync(0xFFFFFFFFu, c[k], o);
      c[k] = take_max(k) ? bf16x2_max(c[k], other) : bf16x2_min(c[k], other);
    }
    if (threadIdx.x % 32 == 0) red[k][threadIdx.x / 32] = c[k];
  }
  __syncthreads();
  if (threadIdx.x < kCand) {
    const int k = int(threadIdx.x);
    uint32_t a = red[k][0];
    for (int i = 1; i < kAmaxShapeThreads / 32; ++i) a = take_max(k) ? bf16x2_max(a, red[k][i]) : bf16x2_min(a, red[k][i]);
    const float xv = to_float(bf16_t{uint16_t(a & 0xFFFFu)});
    const float g = is_nan(xv) ? 0.0f : amax_update(0.0f, F::fwd(xv, p.act));
    if (g > 0.0f) atomicMax(reinterpret_cast<int*>(p.amax), __float_as_int(g));
  }
}

// The peaks of |F::fwd| over the bf16 values (see act_amax_shape_kernel), found once per functor on the host by the
// same functor code the device runs; peaks = -1 when there are more than kAmaxMaxPeaks or |f(-0)| != |f(+0)|.
template <class F> AmaxShape find_amax_shape() {
  AmaxShape s;
  auto g = [](uint32_t bits) {
    const float v = F::fwd(to_float(bf16_t{uint16_t(bits)}), ActArgs{});
    return is_nan(v) ? -1.0f : amax_update(0.0f, v);
  };
  if (g(0x8000u) != g(0x0000u)) return s;
  int peaks = 0, dir = 0;
  uint32_t prev_bits = 0xFF80u;
  float prev = g(prev_bits);
  // -inf, ..., -0, then +0, ..., +inf: increasing values (NaNs skipped; -0 and +0 are equal and have equal g).
  for (uint32_t i = 1; i < 2u * 0x7F81u; ++i) {
    const uint32_t bits = i < 0x7F81u ? 0xFF80u - i : i - 0x7F81u;
    const float cur = g(bits);
    const int d = cur > prev ? 1 : (cur < prev ? -1 : 0);
    if (d != 0) {
      if (dir > 0 && d < 0) {
        if (peaks == kAmaxMaxPeaks) return AmaxShape{};
        s.peak2[peaks++] = prev_bits * 0x10001u;
      }
      dir = d;
    }
    prev = cur;
    prev_bits = bits;
  }
  s.peaks = peaks;
  return s;
}
template <class F> const AmaxShape& amax_shape() {
  static const AmaxShape s = find_amax_shape<F>();
  return s;
}

// ---- Launchers -------------------------------------------------------------------------------------------------
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

// Grid sizing needs a count even when the query fails: then that of an H100/H200.
inline int device_sm_count_or_default() {
  const int n = device_sm_count();
  return n > 0 ? n : 132;
}

// TE_FORCE_TABLES=1 makes every bf16 launch of a tabulated functor use the tables, whatever its size (tests use it
// to cover all 65536 inputs with small tensors).
inline bool force_tables() {
  const char* v = std::getenv("TE_FORCE_TABLES");
  return v != nullptr && v[0] == '1';
}

// Blocks of `kernel` resident per SM with `smem` bytes of dynamic shared memory, after allowing that much (cached
// per kernel; 0 if unknown). The allowance is set for any dynamic size: without it, static plus dynamic shared
// memory may not exceed 48 KB (e.g. 48 KB of dynamic next to a few KB of static would not launch).
template <auto kernel> int resident_per_sm(int threads, size_t smem) {
  static int per_sm = -1;
  if (per_sm < 0) {
    if (smem > 0) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    int n = 0;
    per_sm = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) == cudaSuccess ? n : 0;
  }
  return per_sm;
}

template <class Op, typename T>
void launch_gated_rows(const ActKernelParams& p, uint32_t cpr, cudaStream_t stream) {
  const int64_t row_groups = std::max<int64_t>(1, (p.rows + kGatedRows - 1) / kGatedRows);
  const dim3 grid(unsigned((cpr + kGatedCols - 1) / kGatedCols), unsigned(std::min<int64_t>(row_groups, 65535)));
  act_gated_rows_kernel<Op, T><<<grid, kGatedCols * kGatedRows, 0, stream>>>(p);
}

template <class Op, bool kBwd, typename T, OutKind kOut>
void launch_rowwise(const ActKernelParams& p, uint32_t cpr, uint32_t n_chunks, cudaStream_t stream) {
  constexpr int kU = RowwiseUnroll<Op, kBwd, T>::value;
  // Gated forward ops to plain outputs whose rows hold at least one block's width of chunks: the 2-D grid.
  if constexpr (Op::kGated && !kBwd && kOut == OutKind::kPlain) {
    if (cpr >= uint32_t(kGatedCols)) return launch_gated_rows<Op, T>(p, cpr, stream);
  }
  const int sms = device_sm_count_or_default();
  if constexpr (kOut == OutKind::kAmax && !Op::kGated && !kBwd && std::is_same<T, bf16_t>::value) {
    const AmaxShape& shape = amax_shape<typename Op::Fn>();
    const ActArgs dflt{};
    const bool default_args = p.act.limit == dflt.limit && p.act.alpha == dflt.alpha &&
                              p.act.glu_linear_offset == dflt.glu_linear_offset;
    if (shape.peaks >= 0 && default_args) {
      const int64_t per_block = int64_t(kAmaxShapeThreads) * kAmaxShapeUnroll;
      const int64_t blocks = std::min<int64_t>((int64_t(n_chunks) + per_block - 1) / per_block, 4 * int64_t(sms));
      act_amax_shape_kernel<typename Op::Fn>
          <<<unsigned(std::max<int64_t>(blocks, 1)), kAmaxShapeThreads, 0, stream>>>(p, n_chunks, shape);
      return;
    }
  }
  RowwiseGeom geo;
  geo.n_chunks = n_chunks;
  geo.cpr = cpr;
  geo.row_of = FastDiv(cpr);
  // A tensor too small to give every SM two full steps gets one chunk per thread.
  const bool small = int64_t(n_chunks) < int64_t(kRowThreads) * kU * 2 * sms;
  geo.units = small ? 1 : kU;
  if constexpr (kOut == OutKind::kMxRow || kOut == OutKind::kNvRow) {
    const int64_t blk = kOut == OutKind::kMxRow ? kMxBlock : kNvBlock;
    geo.scale_linear = !(kBwd && Op::kGated) && !p.blk_swizzled && (p.cols / blk) % 4 == 0;
  }
  const int64_t per_block = int64_t(kRowThreads) * geo.units;
  // An empty tensor still launches one block so that scale_inv is written (SPEC §4.10).
  const int64_t blocks = n_chunks < 1 ? 1 : (int64_t(n_chunks) + per_block - 1) / per_block;
  if constexpr (Op::Fn::kTabulate && std::is_same<T, bf16_t>::value) {
    // Tables pay off when each resident block walks several steps after filling them.
    constexpr auto kernel = act_rowwise_kernel<Op, kBwd, T, kOut, true>;
    constexpr size_t kSmem = LutPlan<Op, kBwd>::kBytes;
    const int64_t resident = int64_t(resident_per_sm<kernel>(kRowThreads, kSmem)) * sms;
    if (resident > 0 && (force_tables() || (!small && blocks >= 4 * resident))) {
      kernel<<<unsigned(std::min(blocks, resident)), kRowThreads, kSmem, stream>>>(p, geo);
      return;
    }
  }
  act_rowwise_kernel<Op, kBwd, T, kOut, false><<<unsigned(blocks), kRowThreads, 0, stream>>>(p, geo);
}

template <class Op, bool kBwd, typename T, OutKind kOut>
void launch_strip(const ActKernelParams& p, int64_t dbias_rows, cudaStream_t stream) {
  const int sms = device_sm_count_or_default();
  const int64_t strips = std::max<int64_t>(1, (p.cols + kActStripCols - 1) / kActStripCols);
  const int64_t items = strips * act_dbias_blocks(p.rows, p.cols);
  if constexpr (Op::Fn::kTabulate && std::is_same<T, bf16_t>::value) {
    constexpr auto kernel = act_strip_kernel<Op, kBwd, T, kOut, true>;
    constexpr size_t kSmem = LutPlan<Op, kBwd>::kBytes;
    const int per_sm = resident_per_sm<kernel>(kThreads, kSmem);
    // Tables pay off when each block walks enough rows after filling them.
    if (per_sm > 0 && (force_tables() || items * dbias_rows >= 64 * int64_t(per_sm) * sms)) {
      kernel<<<unsigned(std::min<int64_t>(items, int64_t(per_sm) * sms)), kThreads, kSmem, stream>>>(
          p, dbias_rows, strips, items);
      return;
    }
  }
  constexpr auto kernel = act_strip_kernel<Op, kBwd, T, kOut, false>;
  const int per_sm = std::max(1, resident_per_sm<kernel>(kThreads, 0));
  kernel<<<unsigned(std::min<int64_t>(items, int64_t(per_sm) * sms)), kThreads, 0, stream>>>(p, dbias_rows, strips,
                                                                                             items);
}

// A persistent grid: as many blocks as are resident, at most one per tile.
template <auto kernel>
void launch_pipe_grid(const ActKernelParams& p, const PipeGeom& geo, size_t smem, cudaStream_t stream) {
  const int per_sm = std::max(1, resident_per_sm<kernel>(kThreads, smem));
  const int64_t grid = std::min<int64_t>(geo.tiles, int64_t(per_sm) * device_sm_count_or_default());
  kernel<<<unsigned(grid), kThreads, smem, stream>>>(p, geo);
}

template <class Op, bool kBwd, typename T, OutKind kOut>
void launch_pipe(const ActKernelParams& p, cudaStream_t stream) {
  using L = PipeLayout<Op, kBwd, T>;
  PipeGeom geo;
  geo.col_tiles = std::max<int64_t>(1, (p.cols + kTileCols - 1) / kTileCols);
  geo.tiles = geo.col_tiles * std::max<int64_t>(1, (p.rows + kActBlockRows - 1) / kActBlockRows);
  if constexpr (Op::Fn::kTabulate && std::is_same<T, bf16_t>::value) {
    // Tables pay off when each resident block walks several tiles after filling them.
    if (force_tables() || geo.tiles >= 8 * int64_t(device_sm_count_or_default())) {
      launch_pipe_grid<act_pipe_kernel<Op, kBwd, T, kOut, true>>(p, geo, L::template smem_bytes<true>(), stream);
      return;
    }
  }
  launch_pipe_grid<act_pipe_kernel<Op, kBwd, T, kOut, false>>(p, geo, L::template smem_bytes<false>(), stream);
}

// NVFP4 (ScaleMode::kNvfp4): the streaming rowwise kernel without a transposed copy, else the pipelined tiles.
template <class Op, bool kBwd>
void launch_nvfp4_act(DType in_dtype, const ActKernelParams& p, cudaStream_t stream) {
  auto aligned = [](const void* ptr, int bytes) { return (reinterpret_cast<uintptr_t>(ptr) % bytes) == 0; };
  const int64_t n_chunks = p.rows * (p.cols / kVec);
  const bool ok = p.cols % kNvBlock == 0 && aligned(p.x, 16) && (p.grad == nullptr || aligned(p.grad, 16)) &&
                  (p.out == nullptr || aligned(p.out, 4)) && p.dbias_partial == nullptr &&
                  (p.out_t == nullptr || p.rows % kNvBlock == 0) && n_chunks < (int64_t(1) << 31);
  if (!ok) {
    core_fail("activation kernel: the fused NVFP4 path needs positions per row % 16 == 0 (got " +
              std::to_string(p.cols) + "), rows % 16 == 0 with a transposed copy (got " + std::to_string(p.rows) +
              "), 16-byte aligned inputs, a 4-byte aligned output and no dbias");
  }
  if constexpr (!kBwd && !Op::kGated && Op::Fn::kTabulate) {
    // Rowwise only, bf16, a tabulated unary forward op: the table kernel when every resident block walks at least
    // 4 whole steps after filling its tables (or TE_FORCE_TABLES=1).
    if (in_dtype == DType::kBFloat16 && p.out_t == nullptr && p.out != nullptr && aligned(p.out, 8)) {
      constexpr auto kernel = act_nv_row_kernel<Op>;
      const int64_t n_blocks = n_chunks / 2;
      const int64_t resident = int64_t(resident_per_sm<kernel>(kNvRowThreads, kNvRowSmem)) * device_sm_count_or_default();
      const int64_t per_step = int64_t(kNvRowThreads) * kNvRowUnits;
      if (resident > 0 && n_blocks > 0 && (force_tables() || n_blocks >= 4 * resident * per_step)) {
        NvRowGeom geo;
        geo.n_blocks = uint32_t(n_blocks);
        geo.bpr = uint32_t(p.cols / kNvBlock);
        geo.row_of = FastDiv(geo.bpr);
        geo.scale_linear = !p.blk_swizzled && geo.bpr % 4 == 0;
        const int64_t grid = std::min(resident, (n_blocks + kNvRowThreads - 1) / kNvRowThreads);
        kernel<<<unsigned(grid), kNvRowThreads, kNvRowSmem, stream>>>(p, geo);
        check_launch("activation kernel (NVFP4 rowwise tables)");
        return;
      }
    }
  }
  if constexpr (!kBwd && !Op::kGated && Op::Fn::kTabulate) {
    // Both copies, bf16, a tabulated unary forward op, whole 128 x 128 tiles: the table kernel when every resident
    // block walks at least 8 tiles after filling its tables (or TE_FORCE_TABLES=1).
    if (in_dtype == DType::kBFloat16 && p.out_t != nullptr && p.rows % kNvColTile == 0 && p.cols % kNvColTile == 0 &&
        aligned(p.out_t, 16) && (p.out == nullptr || aligned(p.out, 8)) && p.rows > 0 && p.cols > 0) {
      constexpr auto kernel = act_nv_rowcol_kernel<Op>;
      NvColGeom geo;
      geo.col_tiles = p.cols / kNvColTile;
      geo.tiles = geo.col_tiles * (p.rows / kNvColTile);
      const int64_t resident = int64_t(resident_per_sm<kernel>(kNvColThreads, kNvColSmem)) * device_sm_count_or_default();
      if (resident > 0 && (force_tables() || geo.tiles >= 8 * resident)) {
        kernel<<<unsigned(std::min(resident, geo.tiles)), kNvColThreads, kNvColSmem, stream>>>(p, geo);
        check_launch("activation kernel (NVFP4 both copies, tables)");
        return;
      }
    }
  }
  TE_SWITCH_IN_DTYPE(in_dtype, T, {
    if (p.out_t == nullptr) {
      launch_rowwise<Op, kBwd, T, OutKind::kNvRow>(p, uint32_t(p.cols / kVec), uint32_t(n_chunks), stream);
    } else {
      launch_pipe<Op, kBwd, T, OutKind::kNvRowCol>(p, stream);
    }
  });
  check_launch("activation kernel (NVFP4)");
}

// TE_ONE_LAUNCH=0 turns the one-launch current scaling off (tests use it to cover the amax pass on small tensors).
inline bool one_launch_disabled() {
  const char* v = std::getenv("TE_ONE_LAUNCH");
  return v != nullptr && v[0] == '0';
}

// One cooperative launch of act_current_coop_kernel when the tensor fits a resident grid within the partial slots;
// false (nothing launched) otherwise.
template <class Op, bool kBwd, typename T>
bool launch_current_coop(const ActKernelParams& p, uint32_t cpr, uint32_t n_chunks, cudaStream_t stream) {
  constexpr auto kernel = act_current_coop_kernel<Op, kBwd, T>;
  const int64_t resident = int64_t(resident_per_sm<kernel>(kRowThreads, 0)) * device_sm_count();
  const int64_t blocks = std::max<int64_t>(1, (int64_t(n_chunks) + kRowThreads - 1) / kRowThreads);
  const int64_t grid = std::min<int64_t>({blocks, resident, int64_t(p.amax_slots)});
  if (grid < 1 || int64_t(n_chunks) > grid * kRowThreads * coop_units<Op, kBwd>()) return false;
  RowwiseGeom geo;
  geo.n_chunks = n_chunks;
  geo.cpr = cpr;
  geo.row_of = FastDiv(cpr);
  ActKernelParams pk = p;
  void* args[] = {&pk, &geo};
  const cudaError_t e = cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(unsigned(grid)),
                                                    dim3(kRowThreads), args, 0, stream);
  if (e != cudaSuccess) core_fail(std::string("activation kernel (current scaling, one launch): ") + cudaGetErrorString(e));
  return true;
}

template <class Op, bool kBwd>
void launch_act(DType in_dtype, const ActKernelParams& p, cudaStream_t stream) {
  if (p.mode == ScaleMode::kNvfp4) return launch_nvfp4_act<Op, kBwd>(in_dtype, p, stream);
  auto aligned = [](const void* ptr, int bytes) { return (reinterpret_cast<uintptr_t>(ptr) % bytes) == 0; };
  const bool vec = p.cols % kVec == 0 && aligned(p.x, 16) && (p.grad == nullptr || aligned(p.grad, 16)) &&
                   (p.out == nullptr || aligned(p.out, p.mode == ScaleMode::kPlain ? 16 : 8));
  const int64_t chunks_per_row = p.cols / kVec;
  const int64_t n_chunks = p.rows * chunks_per_row;
  if (p.mode == ScaleMode::kCurrent && p.amax_in_call) {
    // Current scaling in one call: one cooperative launch where it fits, else zero amax, amax pass, cast.
    if (vec && p.out != nullptr && p.out_t == nullptr && p.dbias_partial == nullptr && p.amax_partials != nullptr &&
        p.amax_slots > 0 && n_chunks < (int64_t(1) << 31) && !one_launch_disabled()) {
      bool done = false;
      TE_SWITCH_IN_DTYPE(in_dtype, T, {
        done = launch_current_coop<Op, kBwd, T>(p, uint32_t(chunks_per_row), uint32_t(n_chunks), stream);
      });
      if (done) return check_launch("activation kernel (current scaling, one launch)");
    }
    const cudaError_t e = cudaMemsetAsync(p.amax, 0, sizeof(float), stream);
    if (e != cudaSuccess) core_fail(std::string("activation: zeroing the amax failed: ") + cudaGetErrorString(e));
    launch_act<Op, kBwd>(in_dtype, amax_pass_params(p), stream);
    ActKernelParams pc = p;
    pc.amax_in_call = false;
    return launch_act<Op, kBwd>(in_dtype, pc, stream);
  }
  const bool has_out = p.out != nullptr || p.mode == ScaleMode::kAmaxOnly || n_chunks == 0;
  if (vec && has_out && p.out_t == nullptr && p.dbias_partial == nullptr && n_chunks < (int64_t(1) << 31)) {
    TE_SWITCH_IN_DTYPE(in_dtype, T, {
      TE_SWITCH_OUT_KIND(p.mode, K, {
        launch_rowwise<Op, kBwd, T, K>(p, uint32_t(chunks_per_row), uint32_t(n_chunks), stream);
      });
    });
    check_launch("activation kernel (rowwise)");
    return;
  }
  const int64_t dbias_rows = act_dbias_rows(p.rows, p.cols);
  // dbias exists for unary backward ops and the plain cast (bgrad_quantize).
  constexpr bool kHasDbias = !Op::kGated && (kBwd || std::is_same<typename Op::Fn, Identity>::value);
  if constexpr (kHasDbias) {
    if (vec && has_out && p.out_t == nullptr && p.dbias_partial != nullptr && aligned(p.dbias_partial, 16)) {
      TE_SWITCH_IN_DTYPE(in_dtype, T, {
        TE_SWITCH_OUT_KIND(p.mode, K, { launch_strip<Op, kBwd, T, K>(p, dbias_rows, stream); });
      });
      check_launch("activation kernel (dbias strips)");
      return;
    }
  }
  if (vec && p.out_t != nullptr && p.dbias_partial == nullptr &&
      (p.mode == ScaleMode::kDelayed || p.mode == ScaleMode::kCurrent)) {
    TE_SWITCH_IN_DTYPE(in_dtype, T, {
      if (p.mode == ScaleMode::kDelayed) {
        launch_pipe<Op, kBwd, T, OutKind::kDelayed>(p, stream);
      } else {
        launch_pipe<Op, kBwd, T, OutKind::kCurrent>(p, stream);
      }
    });
    check_launch("activation kernel (pipelined tiles)");
    return;
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
// The NVFP4 kernels of the same op are instantiated in their own translation unit (TE_INSTANTIATE_NVFP4_CUDA), so
// the build stays parallel.
#define TE_INSTANTIATE_ACT_CUDA(code, F, gated, bwd)                                                             \
  extern template void te::act_cuda::launch_nvfp4_act<te::ActOp<te::F, gated>, bwd>(                            \
      te::DType, const te::ActKernelParams&, cudaStream_t);                                                      \
  template void te::act_cuda::launch_act<te::ActOp<te::F, gated>, bwd>(te::DType, const te::ActKernelParams&, cudaStream_t);
#define TE_INSTANTIATE_NVFP4_CUDA(code, F, gated, bwd)                                                           \
  template void te::act_cuda::launch_nvfp4_act<te::ActOp<te::F, gated>, bwd>(te::DType, const te::ActKernelParams&, \
                                                                            cudaStream_t);
