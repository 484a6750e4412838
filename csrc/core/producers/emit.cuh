// Output side of the producer kernel skeletons: the block shape of the tile / strip / pipe kernels, the compile-time
// output kind (OutKind, OutTraits, TE_SWITCH_OUT_KIND) and emit8, which hands one 8-value chunk to the emitter of its
// kind (formats/<fmt>/emitter.cuh: plain, FP8; the MXFP8 and NVFP4 rowwise emitters are called by the kernels
// directly), and the swizzled transposed-tile store.
// Invariant: a value is encoded by fp8_scaled_value's rule (encode8_t) or the block formats' encoders of
// formats/mxfp8 / formats/nvfp4, exactly as on the CPU; amax is taken over the unrounded values.
#pragma once

#include "../formats/fp8/emitter.cuh"
#include "../formats/mxfp8/emitter.cuh"
#include "../formats/nvfp4/emitter.cuh"
#include "../formats/plain/emitter.cuh"
#include "../rules/cuda_utils.cuh"
#include "activation.h"

namespace te {
namespace act_cuda {

constexpr int kThreads = 256;
constexpr int kTileCols = int(kActTileCols);  // positions per block
constexpr int kRowsPerThread = 4;

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
    emit8_plain<InT>(v, out, off);
  } else if constexpr (Tr::kFp8) {
    emit8_fp8<InT, Tr::kRound>(v, out, off, scale, e4m3);
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

}  // namespace act_cuda
}  // namespace te
