// Output side of the activation kernels: the block shape of the tile / strip / pipe kernels, the compile-time
// output kind (OutKind, OutTraits, TE_SWITCH_OUT_KIND) and the emitters of one 8-value chunk to each kind (input
// dtype, FP8, MXFP8 rowwise, NVFP4 rowwise), the scale-padding writers, and the swizzled transposed-tile store.
// Invariant: a value is encoded by fp8_scaled_value's rule (encode8_t) or the block formats' encoders of
// quantize_mxfp8.h / quantize_nvfp4.h, exactly as on the CPU; amax is taken over the unrounded values.
#pragma once

#include "../rules/cuda_utils.cuh"
#include "../mxfp8/quantize_mxfp8.h"
#include "../nvfp4/quantize_nvfp4.h"
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

}  // namespace act_cuda
}  // namespace te
