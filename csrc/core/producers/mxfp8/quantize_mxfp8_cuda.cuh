// CUDA kernel of MXFP8 quantization fused with the activation functors (SPEC §4.5, §5.1 FULLY_FUSED; layout and
// invariants in quantize_mxfp8.h). Included by the act_*.cu translation units, which instantiate it next to the
// activation kernels of the same family (TE_INSTANTIATE_MXFP8_CUDA), so the build stays parallel.
//
// One block of 256 threads owns a 32-row x 64-column output tile at a time: thread t takes the 8 consecutive
// output columns 8*(t%8).. of row t/8, one 16-byte load per input stream (two for FP32). From that one read it
// evaluates the op (eval8: the bf16 lookup tables for exp-based functors, else the functor), rounds to the input
// dtype, and derives
//   - the rowwise scale of its 1x32 block: a max over the 4 lanes holding the block (two shuffles);
//   - the columnwise scale of each of its 8 columns: a max over the 4 rows of the warp (two shuffles), then
//     over the 8 warps through shared memory;
//   - the dbias partial of each column (FP32 sums of the unrounded values, in a fixed order).
// Blocks walk tiles grid-stride (a resident grid, so the tables are filled once per block). Loads run kStages - 1
// tiles ahead through cp.async into per-thread shared-memory slots (each thread reads back only what it copied, so
// the pipeline needs no block barrier and no registers for the tiles in flight). Scale padding is written as zero
// by the tiles on the last row / column. A rowwise-only request on aligned rows instead goes to the streaming rowwise
// kernel of act_cuda.cuh (output kind kMxRow: a 1x32 block is 4 consecutive lanes), which needs no tiles; both
// copies of a unary op (forward, or backward with or without dbias) go to the warp-tile kernel below (no block
// barriers).
#pragma once

#include "../launch.cuh"
#include "quantize_mxfp8.h"

namespace te {
namespace mx_cuda {

using act_cuda::kVec;
using act_cuda::Vec8;

constexpr int kMxThreads = 256;
constexpr int kMxTileRows = int(kMxBlock);  // one columnwise block per tile
constexpr int kMxTileCols = 64;
constexpr int kMxWarps = kMxThreads / 32;
static_assert(kMxTileRows * kMxTileCols == kMxThreads * kVec, "one 8-column chunk per thread");
static_assert(kMxTileCols / kVec == 8, "a row of the tile is 8 lanes: a 1x32 block is 4 lanes, a warp holds 4 rows");

struct MxGeom {
  int64_t out_cols = 0;
  int64_t n_row_tiles = 0, n_col_tiles = 0, n_tiles = 0;
  bool vec = false;  // 16-byte aligned inputs and 8-byte aligned outputs
  // Warp-tile kernel: bytes between the rowwise scales of consecutive rows (16 swizzled, the padded row compact);
  // columnwise scales compact and 8-byte aligned (8 consecutive columns' scales are one 8-byte store; swizzled,
  // consecutive columns are 16 bytes apart).
  int64_t row_scale_step = 0;
  bool col_scale_vec = false;
};

// Staging of the input tiles in flight: per stage, one slot of kVec raw elements per thread and input stream
// (x, or a and b when gated; grad when backward). Stages: as many as fit in about 32 KB, 2 to 8 (a 4 KB stage
// is one 16-byte chunk per thread: seven of them in flight keep enough bytes moving per SM).
template <class Op, bool kBwd, typename InT> struct MxStaging {
  static constexpr int kStreams = 1 + int(Op::kGated) + int(kBwd);
  static constexpr int kChunkBytes = kVec * int(sizeof(InT));  // 16 (bf16/fp16) or 32 (fp32)
  static constexpr int kStageBytes = kStreams * kMxThreads * kChunkBytes;
  static constexpr int kStages =
      kStageBytes <= 4096 ? 8 : (kStageBytes <= 8192 ? 4 : (kStageBytes <= 16384 ? 3 : 2));
  static constexpr size_t kBytes = size_t(kStages) * size_t(kStageBytes);
  static_assert(kChunkBytes % 16 == 0, "slots are copied in 16-byte pieces");
};

// Zero padding of the scale tensors owned by tile (tr, tc): the tiles on the last row / column own the entries
// past the data (compact coordinates, then mapped to the layout).
__device__ __forceinline__ void mx_write_padding(const Mxfp8Params& p, const MxGeom& geo, int64_t tr, int64_t tc) {
  const bool last_r = tr == geo.n_row_tiles - 1, last_c = tc == geo.n_col_tiles - 1;
  if (!last_r && !last_c) return;
  const int64_t rows = p.rows, out_cols = geo.out_cols;
  const int64_t row_r = roundup(rows, 128), row_c = roundup(out_cols / kMxBlock, 4);
  const int64_t col_r = roundup(ceil_div(rows, kMxBlock), 4), col_c = roundup(out_cols, 128);
  constexpr int64_t kBlocksPerTile = kMxTileCols / kMxBlock;
  if (p.row_data != nullptr) {
    const int64_t ra = tr * kMxTileRows, rb = last_r ? row_r : ra + kMxTileRows;
    const int64_t ja = tc * kBlocksPerTile, jb = last_c ? row_c : ja + kBlocksPerTile;
    const int64_t w = jb - ja;
    for (int64_t i = threadIdx.x; i < (rb - ra) * w; i += kMxThreads) {
      const int64_t r = ra + i / w, j = ja + i % w;
      if (r >= rows || j >= out_cols / kMxBlock) p.row_scale[mx_row_scale_offset(r, j, out_cols, p.swizzled)] = 0;
    }
  }
  if (p.col_data != nullptr) {
    const int64_t ia = tr, ib = last_r ? col_r : tr + 1;
    const int64_t ja = tc * kMxTileCols, jb = last_c ? col_c : ja + kMxTileCols;
    const int64_t w = jb - ja;
    for (int64_t i = threadIdx.x; i < (ib - ia) * w; i += kMxThreads) {
      const int64_t bi = ia + i / w, j = ja + i % w;
      if (bi >= geo.n_row_tiles || j >= out_cols)
        p.col_scale[mx_col_scale_offset(bi, j, rows, out_cols, p.swizzled)] = 0;
    }
  }
}

// Eight values times a power of two -> eight FP8 codes (two little-endian words).
__device__ __forceinline__ uint2 mx_encode8(const float (&v)[kVec], float m, bool e4m3) {
  return e4m3 ? act_cuda::encode8_t<float, false, true>(v, m) : act_cuda::encode8_t<float, false, false>(v, m);
}

__device__ __forceinline__ void mx_store8(uint8_t* dst, uint2 w, bool vec) {
  if (vec) {
    *reinterpret_cast<uint2*>(dst) = w;
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) dst[k] = uint8_t((k < 4 ? w.x : w.y) >> (8 * (k % 4)));
  }
}

// Eight values that are values of InT (rounded to it) -> their InT encodings, exactly; bf16 takes the upper halves
// of the FP32 bit patterns, two per byte permute.
template <typename InT> __device__ __forceinline__ Vec8<InT> pack_exact(const float (&v)[kVec]) {
  Vec8<InT> r;
  if constexpr (std::is_same<InT, bf16_t>::value) {
    uint32_t* w = reinterpret_cast<uint32_t*>(&r);
#pragma unroll
    for (int k = 0; k < kVec; k += 2) w[k / 2] = __byte_perm(float_bits(v[k]), float_bits(v[k + 1]), 0x7632);
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) r.e[k] = from_float<InT>(v[k]);
  }
  return r;
}

template <class Op, bool kBwd, typename InT, bool kLut>
__global__ void __launch_bounds__(kMxThreads) mxfp8_kernel(const Mxfp8Params p, const MxGeom geo) {
  using Stage = MxStaging<Op, kBwd, InT>;
  constexpr bool kGated = Op::kGated;
  constexpr bool kTwoOut = kBwd && kGated;
  constexpr int kStages = Stage::kStages;
  __shared__ float cred[kMxWarps][kMxTileCols];  // per-warp column maxima
  __shared__ float dred[kMxWarps][kMxTileCols];  // per-warp column sums (dbias)
  __shared__ float cmul[kMxTileCols];            // columnwise multipliers of the tile
  extern __shared__ uint4 mx_smem[];             // [staging | lookup tables]
  unsigned char* staging = reinterpret_cast<unsigned char*>(mx_smem);
  float* lut = reinterpret_cast<float*>(staging + Stage::kBytes);

  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const int64_t rows = p.rows, cols = p.cols, out_cols = geo.out_cols;
  const int64_t x_stride = kGated ? 2 * cols : cols;
  const InT* x = static_cast<const InT*>(p.x);
  const InT* g = static_cast<const InT*>(p.grad);
  const int tid = threadIdx.x, cc = tid % 8, rr = tid / 8, warp = tid / 32, lane = tid % 32;
  const bool want_col = p.col_data != nullptr, want_dbias = p.dbias_partial != nullptr;

  // Tiles of this block: t = blockIdx.x + i * gridDim.x, with (row tile, column tile) advanced incrementally, so
  // the 64-bit divisions happen once per thread, not per tile.
  const int64_t step = gridDim.x, step_r = step / geo.n_col_tiles, step_c = step - step_r * geo.n_col_tiles;
  struct Cursor {
    int64_t t, tr, tc;
  };
  auto cursor_at = [&](int64_t t) {
    const int64_t tr = t / geo.n_col_tiles;
    return Cursor{t, tr, t - tr * geo.n_col_tiles};
  };
  auto advance = [&](Cursor& c) {
    c.t += step;
    c.tr += step_r;
    c.tc += step_c;
    if (c.tc >= geo.n_col_tiles) {
      c.tc -= geo.n_col_tiles;
      ++c.tr;
    }
  };
  // Geometry of this thread's chunk in a tile: row, first output column, first input position, which half.
  struct Where {
    int64_t r, oc0, c0;
    int h;
    bool valid;
  };
  auto where = [&](const Cursor& c) {
    Where w;
    w.r = c.tr * kMxTileRows + rr;
    w.oc0 = c.tc * kMxTileCols + cc * kVec;
    w.h = (kTwoOut && w.oc0 >= cols) ? 1 : 0;
    w.c0 = w.oc0 - w.h * cols;
    w.valid = w.r < rows && w.oc0 < out_cols;
    return w;
  };
  auto slot = [&](int stage, int stream) {
    return staging + ((stage * Stage::kStreams + stream) * kMxThreads + tid) * Stage::kChunkBytes;
  };
  // Starts the copies of this thread's chunk of tile c into `stage` (aligned: cp.async; else element loads).
  auto issue = [&](const Cursor& c, int stage) {
    if (c.t >= geo.n_tiles) return;
    const Where w = where(c);
    if (!w.valid) return;
    const InT* src[3] = {x + w.r * x_stride + w.c0, x + w.r * x_stride + cols + w.c0,
                         kBwd ? g + w.r * cols + w.c0 : x};
    int stream = 0;
#pragma unroll
    for (int j = 0; j < 3; ++j) {
      if ((j == 1 && !kGated) || (j == 2 && !kBwd)) continue;
      unsigned char* dst = slot(stage, stream++);
      if (geo.vec) {
#pragma unroll
        for (int b = 0; b < Stage::kChunkBytes; b += 16)
          act_cuda::cp_async16(dst + b, reinterpret_cast<const unsigned char*>(src[j]) + b);
      } else {
        *reinterpret_cast<Vec8<InT>*>(dst) = act_cuda::load8(src[j], false, kVec);
      }
    }
  };
  auto read = [&](int stage, int stream) { return *reinterpret_cast<const Vec8<InT>*>(slot(stage, stream)); };

  Cursor ahead = cursor_at(blockIdx.x);  // the next tile to start copying
#pragma unroll
  for (int sidx = 0; sidx < kStages - 1; ++sidx) {
    issue(ahead, sidx);
    act_cuda::cp_async_commit();
    advance(ahead);
  }
  if constexpr (kLut) act_cuda::lut_fill<Op, kBwd, kMxThreads>(lut, p.act);  // overlaps the first copies
  int stage = 0;
  for (Cursor cur = cursor_at(blockIdx.x); cur.t < geo.n_tiles; advance(cur)) {
    const Where w = where(cur);
    issue(ahead, (stage + kStages - 1) % kStages);  // tile cur + kStages - 1, into the slot read last tile
    act_cuda::cp_async_commit();
    advance(ahead);
    act_cuda::cp_async_wait<kStages - 1>();  // this thread's copies of tile cur have landed

    float raw[kVec], v[kVec];
    if (w.valid) {
      const Vec8<InT> va = read(stage, 0);
      const Vec8<InT> vb = kGated ? read(stage, 1) : va;
      const Vec8<InT> vg = kBwd ? read(stage, kGated ? 2 : 1) : va;
      float out[2][kVec];
      act_cuda::eval8<Op, kBwd, kLut>(va, vb, vg, p.act, lut, out);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        if constexpr (kTwoOut) {
          raw[k] = w.h ? out[1][k] : out[0][k];  // [d_a | d_b]: both indices constant, no local memory
        } else {
          raw[k] = out[0][k];
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) raw[k] = 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = round_to<InT>(raw[k]);  // rnd_in before the block amax (SPEC §5.1)

    // Rowwise: the 1x32 block is lanes 4*(cc/4)..+3 of this row.
    if (p.row_data != nullptr) {
      float a = 0.0f;
#pragma unroll
      for (int k = 0; k < kVec; ++k) a = amax_update(a, v[k]);
      a = amax_update(a, __shfl_xor_sync(0xFFFFFFFFu, a, 1));
      a = amax_update(a, __shfl_xor_sync(0xFFFFFFFFu, a, 2));
      if (w.valid) {
        const uint8_t e = mx_block_code(a, p.e4m3);
        mx_store8(p.row_data + w.r * out_cols + w.oc0, mx_encode8(v, e8m0_multiplier(e), p.e4m3), geo.vec);
        if (cc % 4 == 0) p.row_scale[mx_row_scale_offset(w.r, w.oc0 / kMxBlock, out_cols, p.swizzled)] = e;
      }
    }

    // Columnwise maxima and dbias sums: 4 rows per warp by shuffles (lanes cc, cc+8, cc+16, cc+24), then 8 warps.
    if (want_col || want_dbias) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        if (want_col) {
          float a = amax_update(0.0f, v[k]);
          a = amax_update(a, __shfl_xor_sync(0xFFFFFFFFu, a, 8));
          a = amax_update(a, __shfl_xor_sync(0xFFFFFFFFu, a, 16));
          if (lane < 8) cred[warp][cc * kVec + k] = a;
        }
        if (want_dbias) {
          float s = raw[k];
          s += __shfl_xor_sync(0xFFFFFFFFu, s, 8);
          s += __shfl_xor_sync(0xFFFFFFFFu, s, 16);
          if (lane < 8) dred[warp][cc * kVec + k] = s;
        }
      }
      __syncthreads();
      if (tid < kMxTileCols) {
        const int64_t tr = cur.tr, col = cur.tc * kMxTileCols + tid;
        if (want_col) {
          float a = 0.0f;
#pragma unroll
          for (int i = 0; i < kMxWarps; ++i) a = amax_update(a, cred[i][tid]);
          const uint8_t e = mx_block_code(a, p.e4m3);
          cmul[tid] = e8m0_multiplier(e);
          if (col < out_cols) p.col_scale[mx_col_scale_offset(tr, col, rows, out_cols, p.swizzled)] = e;
        }
        if (want_dbias && col < out_cols) {
          float s = 0.0f;
#pragma unroll
          for (int i = 0; i < kMxWarps; ++i) s += dred[i][tid];
          p.dbias_partial[tr * out_cols + col] = s;
        }
      }
      __syncthreads();
      if (want_col && w.valid) {
        float q[kVec];
#pragma unroll
        for (int k = 0; k < kVec; ++k) q[k] = v[k] * cmul[cc * kVec + k];
        mx_store8(p.col_data + w.r * out_cols + w.oc0, mx_encode8(q, 1.0f, p.e4m3), geo.vec);
      }
    }
    mx_write_padding(p, geo, cur.tr, cur.tc);
    stage = (stage + 1) % kStages;
  }
}

// Zero padding of both scale tensors (entries past the data), grid-stride over the padding only.
__device__ __forceinline__ void mx_scale_padding(const Mxfp8Params& p, const MxGeom& geo) {
  const int64_t rows = p.rows, out_cols = geo.out_cols;
  if (p.row_data != nullptr) act_cuda::mx_row_scale_padding(p.row_scale, rows, out_cols, p.swizzled);
  if (p.col_data != nullptr) {
    const int64_t nrb = ceil_div(rows, kMxBlock);
    const bool swz = p.swizzled;
    act_cuda::zero_scale_padding(p.col_scale, nrb, out_cols, roundup(nrb, 4), roundup(out_cols, 128),
                                 [=](int64_t b, int64_t j) { return mx_col_scale_offset(b, j, rows, out_cols, swz); });
  }
}

// ---- Warp-tile kernel: both copies of a unary op (forward; backward with or without dbias) -------------------------
// Each warp owns whole 32 x 64 tiles (no block barriers): lane l takes the 8 columns 8*(l%8).. of rows
// 8*(l/8)..+7. While a tile is computed, the lane's 8 chunks of the warp's next two tiles are in flight through
// cp.async into its own shared-memory slots (two stages, each refilled as soon as the lane has read its tile into
// registers; a lane reads back only what it copied, so no barrier is needed). Pass 1 per row: the op and rnd_in (for
// bf16 inputs of exp-based functors one lookup of the bf16 result per value), the rowwise 1x32 block (4 lanes, two
// shuffles), its codes and scale; the values stay in registers as the input dtype (exact: they were rounded to it)
// and the column maxima accumulate. Then the column maxima over the 4 row groups (two shuffles per column), the
// columnwise scales, and pass 2 encodes the columnwise codes from the kept values. A lane's 8 rows and 8 columns
// have their scale bytes at fixed steps from the first (MxGeom::row_scale_step; 1 or 16 for the columns), so no
// scale offset is computed per row or column.
// Backward (dact of grad and x; MxWarpBwdLayout): two input streams, so one stage a warp (the tile moves to
// registers before its slot takes the next tile's copies) and bf16 inputs look the derivative up in the FP32 bwd
// table; dbias sums the unrounded values of the lane's 8 rows, then the 4 row groups (two shuffles): a warp's tile
// is one whole 32-row partial row, stored by the lanes of row group 0 (no shared memory, no barrier).
constexpr int kMxWarpRows = 8;  // rows per lane

// Shared memory of the warp-tile kernel: per warp and stage a slot of 8 rows x 32 lanes of chunks (4 KB for 16-bit
// inputs). kLut (bf16 inputs of a tabulated functor): the split bf16 table of rnd_in(fwd) (act_cuda::half_lut_fill,
// 16 KB over a 72 KB span) is there too; the first slots fill the gap between its halves, the others follow the
// negative half (80 KB in all: two blocks per SM, as with the 32 KB FP32 table before it, whose lookups took more
// integer instructions: gelu -> MXFP8 both copies 176.4 -> 169.7 us, H200).
template <typename InT, bool kLut> struct MxWarpLayout {
  static constexpr int kStages = 2;
  static constexpr int kStreams = 1;
  static constexpr size_t kStageBytes = size_t(kMxWarpRows) * 32 * sizeof(Vec8<InT>);
  static constexpr int kSlots = kMxWarps * kStages;
  static constexpr int kGapSlots =
      kLut ? int((act_cuda::kHalfLutNegOffset - act_cuda::kHalfLutHalfBytes) / kStageBytes) : 0;
  static constexpr size_t kTail = act_cuda::kHalfLutNegOffset + act_cuda::kHalfLutHalfBytes;
  static constexpr size_t slot_offset(int s) {
    return !kLut ? size_t(s) * kStageBytes
                 : (s < kGapSlots ? act_cuda::kHalfLutHalfBytes + size_t(s) * kStageBytes
                                  : kTail + size_t(s - kGapSlots) * kStageBytes);
  }
  static constexpr size_t kBytes = slot_offset(kSlots);
  static constexpr size_t kLutOffset = 0;  // the split table starts the buffer
  static_assert(!kLut || (sizeof(InT) == 2 && kGapSlots <= kSlots), "the split table is for bf16 inputs");
};

// Backward: per warp one stage of two slots (x, grad), then the FP32 bwd table (bf16 inputs of a tabulated functor;
// 64 + 32 KB for bf16: two blocks per SM).
template <class Op, typename InT, bool kLut> struct MxWarpBwdLayout {
  static constexpr int kStages = 1;
  static constexpr int kStreams = 2;
  static constexpr size_t kStageBytes = size_t(kMxWarpRows) * 32 * sizeof(Vec8<InT>);
  static constexpr int kSlots = kMxWarps * kStages * kStreams;
  static constexpr size_t slot_offset(int s) { return size_t(s) * kStageBytes; }
  static constexpr size_t kLutOffset = slot_offset(kSlots);
  static constexpr size_t kBytes = kLutOffset + (kLut ? act_cuda::LutPlan<Op, true>::kBytes : 0);
};
template <class Op, bool kBwd, typename InT, bool kLut>
using MxWarpLayoutOf = std::conditional_t<kBwd, MxWarpBwdLayout<Op, InT, kLut>, MxWarpLayout<InT, kLut>>;

template <class Op, bool kBwd, typename InT, bool kLut>
__global__ void __launch_bounds__(kMxThreads, 2) mxfp8_warp_kernel(const Mxfp8Params p, const MxGeom geo) {
  static_assert(!Op::kGated, "unary ops only");
  using WL = MxWarpLayoutOf<Op, kBwd, InT, kLut>;
  constexpr int kStages = WL::kStages, kStreams = WL::kStreams;
  extern __shared__ __align__(16) unsigned char mxw_smem[];
  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const int64_t rows = p.rows, out_cols = geo.out_cols;
  const char* x = static_cast<const char*>(p.x);
  const char* g = static_cast<const char*>(p.grad);
  const float* lut = reinterpret_cast<const float*>(mxw_smem + WL::kLutOffset);
  const int lane = threadIdx.x % 32, cc = lane % 8, rg = lane / 8, warp = threadIdx.x / 32;
  const int64_t warps = int64_t(gridDim.x) * kMxWarps;
  // This lane's chunk of row i of an input stream in a stage's slot.
  auto slot = [&](int stage, int stream, int i) {
    return mxw_smem + WL::slot_offset((warp * kStages + stage) * kStreams + stream) +
           (i * 32 + lane) * sizeof(Vec8<InT>);
  };
  auto issue = [&](int64_t t, int stage) {
    if (t < geo.n_tiles) {
      const int64_t tr = t / geo.n_col_tiles, tc = t - tr * geo.n_col_tiles;
      const int64_t c0 = tc * kMxTileCols + cc * kVec, r0 = tr * kMxTileRows + rg * kMxWarpRows;
#pragma unroll
      for (int i = 0; i < kMxWarpRows; ++i) {
        const bool ok = c0 < out_cols && r0 + i < rows;
        const int64_t off = ok ? ((r0 + i) * out_cols + c0) * int64_t(sizeof(InT)) : 0;
#pragma unroll
        for (int b = 0; b < int(sizeof(Vec8<InT>)); b += 16) {
          act_cuda::cp_async16(slot(stage, 0, i) + b, x + off + b, ok);
          if constexpr (kBwd) act_cuda::cp_async16(slot(stage, 1, i) + b, g + off + b, ok);
        }
      }
    }
    act_cuda::cp_async_commit();  // an empty group past the last tile keeps the wait count uniform
  };
  int64_t t = int64_t(blockIdx.x) * kMxWarps + warp;
#pragma unroll
  for (int s = 0; s < kStages; ++s) issue(t + s * warps, s);
  if constexpr (kLut && kBwd) act_cuda::lut_fill<Op, true, kMxThreads>(const_cast<float*>(lut), p.act);
  if constexpr (kLut && !kBwd) act_cuda::half_lut_fill<Op, kMxThreads>(mxw_smem, p.act);  // overlaps the copies
  for (int it = 0; t < geo.n_tiles; ++it, t += warps) {
    const int stage = it % kStages;
    act_cuda::cp_async_wait<kStages - 1>();  // this lane's copies of tile t have landed
    const int64_t tr = t / geo.n_col_tiles, tc = t - tr * geo.n_col_tiles;
    const int64_t c0 = tc * kMxTileCols + cc * kVec;
    const int64_t r0 = tr * kMxTileRows + rg * kMxWarpRows;
    const bool col_ok = c0 < out_cols;
    Vec8<InT> keep[kMxWarpRows], grad[kBwd ? kMxWarpRows : 1];
#pragma unroll
    for (int i = 0; i < kMxWarpRows; ++i) {
      keep[i] = *reinterpret_cast<const Vec8<InT>*>(slot(stage, 0, i));
      if constexpr (kBwd) grad[i] = *reinterpret_cast<const Vec8<InT>*>(slot(stage, 1, i));
    }
    // The tile now lives in registers: its slots take the copies of the tile kStages ahead at once, so that
    // many tiles are in flight during this one's math (the lane's own reads above were issued first; the copies
    // land a global-memory latency later).
    issue(t + kStages * warps, stage);
    // Rows of this lane that exist (none past the last column); the staged copies of the others are zero-filled.
    const int n_ok = col_ok ? int(min(rows - r0, int64_t(kMxWarpRows))) : 0;
    // This lane's first row of codes (the next ones follow out_cols bytes apart) and scale bytes of its first row /
    // column (the next ones follow at fixed steps: r0 and c0 are multiples of 8, so its 8 rows / columns share a
    // 32-group of the swizzled layout).
    const int64_t data0 = r0 * out_cols + c0;
    uint8_t* row_scale =
        p.row_data == nullptr ? nullptr : p.row_scale + mx_row_scale_offset(r0, c0 / kMxBlock, out_cols, p.swizzled);
    const int64_t cs0 = mx_col_scale_offset(tr, c0, rows, out_cols, p.swizzled);
    float cmax[kVec], dsum[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) cmax[k] = dsum[k] = 0.0f;
#pragma unroll
    for (int i = 0; i < kMxWarpRows; ++i) {
      const bool ok = i < n_ok;
      float v[kVec];  // rnd_in(op) (SPEC §5.1); keep[i] becomes the same values as InT
      bool hit = false;
      if constexpr (kBwd) {
        float out[2][kVec];
        act_cuda::eval8<Op, true, kLut>(keep[i], keep[i], grad[i], p.act, lut, out);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          if (ok) dsum[k] += out[0][k];  // dbias sums the unrounded values (SPEC §5.2)
          v[k] = round_to<InT>(out[0][k]);
        }
        keep[i] = pack_exact<InT>(v);
        hit = true;
      } else if constexpr (kLut) {
        uint32_t off[kVec];
        if (act_cuda::lut_offsets<true>(keep[i], off)) {
          uint32_t* w = reinterpret_cast<uint32_t*>(&keep[i]);
#pragma unroll
          for (int k = 0; k < kVec; k += 2) {
            const uint32_t lo = *reinterpret_cast<const uint16_t*>(mxw_smem + off[k]);
            const uint32_t hi = *reinterpret_cast<const uint16_t*>(mxw_smem + off[k + 1]);
            v[k] = bits_float(lo << 16);
            v[k + 1] = bits_float(hi << 16);
            w[k / 2] = lo + (hi << 16);
          }
          hit = true;
        }
      }
      if (!hit) {
        float out[2][kVec];
        act_cuda::eval8<Op, false, false, true>(keep[i], keep[i], keep[i], p.act, nullptr, out);
#pragma unroll
        for (int k = 0; k < kVec; ++k) v[k] = out[0][k];
        keep[i] = pack_exact<InT>(v);
      }
      // The 4 lanes of a 1x32 block share the row and the column range: a block that does not exist is not
      // stored, so only the column maxima skip the missing rows.
      const float a = act_cuda::block_amax8<4, true>(v);
      if (ok) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) cmax[k] = amax_update(cmax[k], v[k]);
      }
      if (ok && p.row_data != nullptr) {
        const uint32_t e = mx_block_code_u32(a, p.e4m3);
        mx_store8(p.row_data + data0 + i * out_cols, mx_encode8(v, e8m0_multiplier_finite(e), p.e4m3), true);
        if (cc % 4 == 0) row_scale[i * geo.row_scale_step] = uint8_t(e);
      }
    }
    float cmul[kVec];
    uint32_t ecodes[2] = {0u, 0u};
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      float a = amax_update(cmax[k], __shfl_xor_sync(0xFFFFFFFFu, cmax[k], 8));
      a = amax_update(a, __shfl_xor_sync(0xFFFFFFFFu, a, 16));
      const uint32_t e = mx_block_code_u32(a, p.e4m3);
      cmul[k] = e8m0_multiplier_finite(e);
      ecodes[k / 4] |= e << (8 * (k % 4));
    }
    if (kBwd && p.dbias_partial != nullptr) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {  // the 4 row groups, lanes 8 and 16 apart
        dsum[k] += __shfl_xor_sync(0xFFFFFFFFu, dsum[k], 8);
        dsum[k] += __shfl_xor_sync(0xFFFFFFFFu, dsum[k], 16);
      }
      if (rg == 0 && col_ok) {
        float* dst = p.dbias_partial + tr * out_cols + c0;  // 32-byte aligned: out_cols % 8 == 0, c0 % 8 == 0
        *reinterpret_cast<float4*>(dst) = make_float4(dsum[0], dsum[1], dsum[2], dsum[3]);
        *reinterpret_cast<float4*>(dst + 4) = make_float4(dsum[4], dsum[5], dsum[6], dsum[7]);
      }
    }
    if (rg == 0 && col_ok) {
      if (geo.col_scale_vec) {  // compact, 8-byte aligned: the 8 column scales are 8 consecutive bytes
        *reinterpret_cast<uint2*>(p.col_scale + cs0) = make_uint2(ecodes[0], ecodes[1]);
      } else {
        const int64_t step = p.swizzled ? 16 : 1;
#pragma unroll
        for (int k = 0; k < kVec; ++k) p.col_scale[cs0 + step * k] = uint8_t(ecodes[k / 4] >> (8 * (k % 4)));
      }
    }
#pragma unroll
    for (int i = 0; i < kMxWarpRows; ++i) {
      if (i >= n_ok) continue;
      float q[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) q[k] = to_float(keep[i].e[k]) * cmul[k];
      mx_store8(p.col_data + data0 + i * out_cols, mx_encode8(q, 1.0f, p.e4m3), true);
    }
  }
  act_cuda::cp_async_wait<0>();
  mx_scale_padding(p, geo);
}

template <class Op, bool kBwd, typename T>
void launch_mxfp8_warp(const Mxfp8Params& p, MxGeom geo, cudaStream_t stream) {
  geo.row_scale_step = p.swizzled ? 16 : roundup(geo.out_cols / kMxBlock, 4);
  geo.col_scale_vec = !p.swizzled && (reinterpret_cast<uintptr_t>(p.col_scale) % 8) == 0;
  constexpr bool kLut = Op::Fn::kTabulate && std::is_same<T, bf16_t>::value;
  constexpr auto kernel = mxfp8_warp_kernel<Op, kBwd, T, kLut>;
  const size_t smem = MxWarpLayoutOf<Op, kBwd, T, kLut>::kBytes;
  const int per_sm = std::max(1, act_cuda::resident_per_sm<kernel>(kMxThreads, smem));
  const int64_t warp_tiles_per_block = kMxThreads / 32;
  const int64_t blocks = std::min((geo.n_tiles + warp_tiles_per_block - 1) / warp_tiles_per_block,
                                  int64_t(per_sm) * act_cuda::device_sm_count_or_default());
  kernel<<<unsigned(std::max<int64_t>(blocks, 1)), kMxThreads, smem, stream>>>(p, geo);
}

template <class Op, bool kBwd, typename T>
void launch_mxfp8_t(const Mxfp8Params& p, const MxGeom& geo, cudaStream_t stream) {
  constexpr bool kLut = Op::Fn::kTabulate && std::is_same<T, bf16_t>::value;
  constexpr auto kernel = mxfp8_kernel<Op, kBwd, T, kLut>;
  const size_t smem = MxStaging<Op, kBwd, T>::kBytes + (kLut ? act_cuda::LutPlan<Op, kBwd>::kBytes : 0);
  const int per_sm = std::max(1, act_cuda::resident_per_sm<kernel>(kMxThreads, smem));
  const int64_t resident = int64_t(per_sm) * act_cuda::device_sm_count_or_default();
  kernel<<<unsigned(std::min(geo.n_tiles, resident)), kMxThreads, smem, stream>>>(p, geo);
}

template <class Op, bool kBwd> void launch_mxfp8(DType in_dtype, const Mxfp8Params& p, cudaStream_t stream) {
  auto aligned = [](const void* ptr, int bytes) { return (reinterpret_cast<uintptr_t>(ptr) % bytes) == 0; };
  MxGeom geo;
  geo.out_cols = (kBwd && Op::kGated) ? 2 * p.cols : p.cols;
  geo.n_row_tiles = ceil_div(p.rows, kMxTileRows);
  geo.n_col_tiles = ceil_div(geo.out_cols, kMxTileCols);
  geo.n_tiles = geo.n_row_tiles * geo.n_col_tiles;
  if (geo.n_tiles == 0) return;  // no data, and the padded scale tensors are empty too
  geo.vec = aligned(p.x, 16) && (p.grad == nullptr || aligned(p.grad, 16)) &&
            (p.row_data == nullptr || aligned(p.row_data, 8)) && (p.col_data == nullptr || aligned(p.col_data, 8));
  // Rowwise copy only (no columnwise copy, no dbias), aligned, whole 1x32 blocks per half: the streaming rowwise
  // kernel of the activation family writes the codes and scales (no tiles, no barriers).
  const int64_t n_chunks = p.rows * (p.cols / kVec);
  if (geo.vec && p.col_data == nullptr && p.dbias_partial == nullptr && p.cols % kMxBlock == 0 &&
      n_chunks < (int64_t(1) << 31)) {
    ActKernelParams ap;
    ap.x = p.x;
    ap.grad = p.grad;
    ap.out = p.row_data;
    ap.noop = p.noop;
    ap.blk_scale = p.row_scale;
    ap.blk_swizzled = p.swizzled;
    ap.rows = p.rows;
    ap.cols = p.cols;
    ap.act = p.act;
    ap.e4m3 = p.e4m3;
    TE_SWITCH_IN_DTYPE(in_dtype, T, {
      act_cuda::launch_rowwise<Op, kBwd, T, act_cuda::OutKind::kMxRow>(ap, uint32_t(p.cols / kVec),
                                                                        uint32_t(n_chunks), stream);
    });
    act_cuda::check_launch("MXFP8 quantize kernel (rowwise)");
    return;
  }
  if constexpr (!Op::kGated) {
    // Both copies of a unary op (a forward op without dbias, a backward op with or without), aligned: warp-owned
    // tiles, no block barriers.
    if (geo.vec && p.col_data != nullptr && (kBwd || p.dbias_partial == nullptr) &&
        (p.dbias_partial == nullptr || (reinterpret_cast<uintptr_t>(p.dbias_partial) % 16) == 0)) {
      bool done = false;
      TE_SWITCH_IN_DTYPE(in_dtype, T, {
        // A backward lane keeps 8 chunks of two streams in registers: FP32 inputs would spill (the tile kernel).
        if constexpr (!kBwd || sizeof(T) == 2) {
          launch_mxfp8_warp<Op, kBwd, T>(p, geo, stream);
          done = true;
        }
      });
      if (done) {
        act_cuda::check_launch("MXFP8 quantize kernel (warp tiles)");
        return;
      }
    }
  }
  TE_SWITCH_IN_DTYPE(in_dtype, T, { launch_mxfp8_t<Op, kBwd, T>(p, geo, stream); });
  act_cuda::check_launch("MXFP8 quantize kernel");
}

}  // namespace mx_cuda
}  // namespace te

// Explicit instantiation of the MXFP8 launcher of one activation in one direction (next to the activation
// kernels of the same family in act_*.cu).
#define TE_INSTANTIATE_MXFP8_CUDA(code, value, name, F, gated, family, bwd)                                            \
  template void te::mx_cuda::launch_mxfp8<te::ActOp<te::F, gated>, bwd>(te::DType, const te::Mxfp8Params&, \
                                                                        cudaStream_t);
