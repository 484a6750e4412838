// The pipelined tile kernel (act_pipe_kernel): FP8 or NVFP4 outputs with a transposed copy on aligned rows, with
// or without dbias; persistent blocks stream 128 x 64 tiles through cp.async stages. nv_pipe_tile is its NVFP4
// tile body.
// Invariant: a thread reads back from shared memory only what it copied itself, so the input stages need no
// barrier; the staged transposed tile keeps the tile kernel's two.
#pragma once

#include "emit.cuh"
#include "eval.cuh"

namespace te {
namespace act_cuda {

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
// FP8 output with a transposed copy, aligned rows. Persistent blocks walk 128 x 64 tiles (column tile fastest, so
// the blocks in flight together read whole rows); each thread copies its own 4 rows x 8 positions of every input
// stream into shared memory with cp.async, kStages - 1 tiles ahead of the one it computes, so loads stay in flight
// while the block encodes, stages and stores the transposed codes. A thread reads back only what it copied
// itself, so the input buffers need no barrier; the staged transposed tile keeps the tile kernel's two.
// dbias (unary backward ops, act_pipe_takes_dbias): a 128-row tile holds whole partial-row blocks
// (act_dbias_rows is a power of two <= 128), so a tile's column sums go straight to their partial rows: each thread
// sums its 4 rows, a warp its 4 row groups (two shuffles: 16 rows), and the block the warps of each partial row
// through 2 KB of shared memory, inside the two barriers the transposed tile already has.
constexpr int kPipeStages = 2;
static_assert(kActPipeDbiasMinRows == 4 * kRowsPerThread, "dbias is summed per warp: its 4 row groups");

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


// dbias of one tile in two phases around a block barrier. Stage: this thread's column sums of its 4 rows, summed
// over the warp's 4 row groups (lanes 8 and 16 apart), go to dred[warp][position]. Store: partial row j of the tile
// is warps j * per .. (j + 1) * per - 1, added in order.
__device__ __forceinline__ void pipe_dbias_stage(float (&dsum)[kVec], float* dred, int tid) {
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    dsum[k] += __shfl_xor_sync(0xFFFFFFFFu, dsum[k], 8);
    dsum[k] += __shfl_xor_sync(0xFFFFFFFFu, dsum[k], 16);
  }
  if (tid % 32 < 8) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) dred[(tid / 32) * kTileCols + (tid % 8) * kVec + k] = dsum[k];
  }
}
__device__ __forceinline__ void pipe_dbias_store(const ActKernelParams& p, int64_t dbias_rows, const float* dred,
                                                 int64_t m0, int64_t col_base) {
  const int per = int(dbias_rows / kActPipeDbiasMinRows), nsub = (kThreads / 32) / per;
  for (int v = threadIdx.x; v < kTileCols * nsub; v += kThreads) {
    const int col = v % kTileCols, j = v / kTileCols;
    const int64_t mrow = m0 + int64_t(j) * dbias_rows;
    if (col_base + col < p.cols && mrow < p.rows) {
      float sum = 0.0f;
      for (int w = j * per; w < (j + 1) * per; ++w) sum += dred[w * kTileCols + col];
      p.dbias_partial[(mrow / dbias_rows) * p.cols + col_base + col] = sum;
    }
  }
}

struct PipeGeom {
  int64_t col_tiles = 1;
  int64_t tiles = 1;
  int64_t dbias_rows = kActBlockRows;  // act_dbias_rows of the shape (with dbias)
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
  constexpr bool kHasDbias = act_has_dbias<Op, kBwd>();
  __shared__ float dred[kHasDbias ? (kThreads / 32) * kTileCols : 1];  // [warp][position] sums of 16 rows

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
    float dsum[kVec] = {};  // dbias: this thread's column sums of its 4 rows (unrounded values, SPEC §5.2)
    const bool dbias = kHasDbias && p.dbias_partial != nullptr;
    if constexpr (Tr::kNv) {
      nv_pipe_tile<InT, kOuts>(p, nv, nv_enc, tile, m0, col_base, o_cols, [&](int i, float (&out)[2][kVec]) {
        const Vec8<InT> va = *reinterpret_cast<const Vec8<InT>*>(chunk_at(stage, 0, i));
        const Vec8<InT> vb = kGated ? *reinterpret_cast<const Vec8<InT>*>(chunk_at(stage, 1, i)) : va;
        const Vec8<InT> vg = kBwd ? *reinterpret_cast<const Vec8<InT>*>(chunk_at(stage, L::kStreams - 1, i)) : va;
        eval8<Op, kBwd, kLut>(va, vb, vg, p.act, lut, out);
        if constexpr (kHasDbias) {
          if (dbias && m0 + rgroup * kRowsPerThread + i < rows && c0 < cols)
#pragma unroll
            for (int k = 0; k < kVec; ++k) dsum[k] += out[0][k];
        }
      });
      if (dbias) {  // after the tile's own barriers, so the previous tile's sums have been read
        pipe_dbias_stage(dsum, dred, tid);
        __syncthreads();
        pipe_dbias_store(p, geo.dbias_rows, dred, m0, col_base);
      }
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
        if constexpr (kHasDbias) {
          if (dbias && valid)
#pragma unroll
            for (int k = 0; k < kVec; ++k) dsum[k] += out[h][k];
        }
        const uint2 w = p.e4m3 ? encode8_t<InT, Tr::kRound, true>(out[h], scale)
                               : encode8_t<InT, Tr::kRound, false>(out[h], scale);
        if (valid && p.out != nullptr)
          *reinterpret_cast<uint2*>(static_cast<uint8_t*>(p.out) + r * o_cols + h * cols + c0) = w;
#pragma unroll
        for (int k = 0; k < kVec; ++k) tw[h][k] |= (((k < 4 ? w.x : w.y) >> (8 * (k % 4))) & 0xFFu) << (8 * i);
      }
    }
    __syncthreads();  // the previous tile's staged codes and warp sums have been read
    if (dbias) pipe_dbias_stage(dsum, dred, tid);
#pragma unroll
    for (int h = 0; h < kOuts; ++h)
#pragma unroll
      for (int k = 0; k < kVec; ++k) tile[h * kTileCols * 32 + tile_word(cchunk * kVec + k, rgroup)] = tw[h][k];
    __syncthreads();
    if (dbias) pipe_dbias_store(p, geo.dbias_rows, dred, m0, col_base);
#pragma unroll
    for (int h = 0; h < kOuts; ++h)
      store_transposed_tile(tile + h * kTileCols * 32, p.out_t + h * cols * rows, col_base, m0, rows, cols);
  }
  cp_async_wait<0>();
  if constexpr (Tr::kNv) nv_scale_padding(p, o_cols);
  if constexpr (Tr::kTrackAmax) block_amax_to_global<kThreads>(amax, red, p.amax);
}

}  // namespace act_cuda
}  // namespace te
