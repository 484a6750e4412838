// The pipelined tile kernel of FP8 block quantization (fb_pipe::fp8_block_pipe_kernel) and its launcher.
//
// Pipelined tile kernel (fb_pipe; x 16-byte aligned, rows and cols multiples of 8, outputs 8-byte aligned, which
// covers every ragged edge of whole 8x8 sub-blocks). Persistent blocks of 256 threads walk the 128x128 tiles of x,
// column tile fastest. Each thread cp.asyncs its own 16-byte pieces of a tile (a half-warp per row: coalesced)
// kStages - 1 = 2 tiles ahead into a stage of shared memory, zero-filled past the edges (a zero never raises a max),
// so two tiles' reads per block stay in flight while the block works on the current one. Thread (g, j) owns the
// 8x8 sub-block of rows 8g.. and columns 8j.. (a warp: 4 row groups x 8 chunks); per tile, after the barrier that
// publishes the stage:
//   A  the sub-block goes from shared memory into registers (kept in the input dtype until C). block_dim 1: the
//      maxima of its 8 rows, reduced over the warp's 8 chunks (3 xor shuffles), and of its 8 columns, reduced over
//      the warp's 4 row groups (2), go to shared memory as partials; 16-bit inputs take these maxima on pairs
//      (max.bf16x2 / max.f16x2 of sign-cleared words: exact, NaN-ignoring like amax_update, 2 elements per
//      instruction, two rows or two columns per shuffle). block_dim 2: one maximum per warp;
//   B  barrier; block_dim 1: thread t < 128 finishes row t (2 partials), thread 128 + c column c (4 partials): one
//      scale per block computed once, scale_inv stored coalesced, the scale kept for C; block_dim 2: warp 0;
//   C  barrier; each thread encodes its sub-block from registers twice: rows -> 8-byte stores of row_data; columns ->
//      8-byte stores along the rows of col_data (the transpose is free: the thread holds all 8 rows of its columns,
//      and 4 lanes of a warp fill one 32-byte sector).
// A stage is [plane][128 rows][16 slots of 16 bytes] (FP32 input: two planes of 4 elements per 8-element chunk);
// chunk c of row r sits in slot c ^ 2*(r/8 % 4) ^ 4*plane, so the copies (8 pieces of one row per quarter-warp)
// and the sub-block loads (4 row groups x 2 chunks per quarter-warp) are both free of bank conflicts.
// Budget: 16-bit inputs 3 x 32 KB stages + 4 KB, 2 blocks per SM (<= 128 registers); FP32 3 x 64 KB, 1 block per SM.
// Each block has 2 tiles of reads in flight (128 KB per SM, several times HBM bandwidth x latency per SM). bf16, both
// copies: ~12 instructions per element, ~6200 warp instructions per tile, i.e. 2000-3100 cycles at 2-3 per clock,
// against ~4200 cycles of an SM's share of HBM bandwidth per tile (66.5 KB at 4.1 TB/s / 132): memory-bound.
//
// Both: scale padding entries are written as zero by the tiles on the last tile row / column; a noop launch returns
// before writing anything. No allocation, no host synchronisation, the caller's stream.
#pragma once

#include "tile_kernel.cuh"

namespace te {

namespace fb_pipe {

constexpr int kThreads = 256;
constexpr int kTile = int(kFp8BlockLen);
constexpr int kVec = 8;                          // a chunk: 8 consecutive elements of a row
constexpr int kChunks = kTile / kVec;            // 16 chunks per tile row
constexpr int kSubRows = 8;                      // a thread's sub-block: 8 rows x 1 chunk
constexpr int kGroups = kTile / kSubRows;        // 16 row groups
constexpr int kWarps = kThreads / 32;
static_assert(kGroups * kChunks == kThreads, "one 8x8 sub-block per thread");
static_assert(kWarps == 8 && kSubRows == kVec,
              "the lane map spreads a warp over 4 row groups x 8 chunks (4 x 2 warps per tile), 8x8 sub-blocks");

// Stage geometry per input dtype, and the blocks per SM it leaves room for (227 KB of shared memory per SM on
// Hopper, 1 KB reserved per block, 4.1 KB of static buffers).
template <typename InT> struct Layout {
  static constexpr int kPlanes = int(sizeof(InT)) / 2;         // 16-byte pieces per chunk: 1, or 2 for FP32
  static constexpr int kPieceElems = kVec / kPlanes;
  static constexpr int kPiecesPerRow = kChunks * kPlanes;
  static constexpr int kPlaneBytes = kTile * kChunks * 16;     // 32 KB
  static constexpr int kStageBytes = kPlanes * kPlaneBytes;
  static constexpr int kStages = 3;
  static constexpr size_t kSmemBytes = size_t(kStages) * kStageBytes;
  static constexpr int kMinBlocks = kPlanes == 1 ? 2 : 1;
  static constexpr int kCopyRowStep = kThreads / kPiecesPerRow;  // rows between two pieces a thread copies
  static constexpr int kCopies = kTile / kCopyRowStep;           // pieces a thread copies per tile
  static_assert(sizeof(InT) == 2 || sizeof(InT) == 4, "16-bit or FP32 input");
  static_assert(kThreads % kPiecesPerRow == 0, "a thread copies the same piece of every kCopyRowStep-th row");
  static_assert(kStages >= 2, "the pipeline wait counts kStages - 2 pending groups");
  static_assert(kMinBlocks * (kSmemBytes + 6 * 1024) <= 227 * 1024, "kMinBlocks blocks fit in an SM");
};

// Byte offset in a stage of piece `plane` of chunk `chunk` of tile row `row` (the bank-conflict swizzle of the file
// comment; it only permutes slots within a row, keeping each in its half-row).
__device__ __forceinline__ int piece_offset(int row, int chunk, int plane) {
  return ((plane * kTile + row) * kChunks + (chunk ^ ((row >> 2) & 6) ^ (plane << 2))) * 16;
}

// Max of two pairs of non-negative 16-bit floats (low and high halves separately), NaN-ignoring: a NaN half loses
// to a number, two NaNs give a NaN (PTX max.bf16x2 / max.f16x2, sm_80+; a software twin below that). Maxima are
// exact in the input dtype, so this equals the FP32 amax_update on the widened values, up to the all-NaN case,
// which the readers map to 0 (amax_update(0, NaN) = 0).
template <typename InT> __device__ __forceinline__ uint32_t max2(uint32_t a, uint32_t b) {
  static_assert(sizeof(InT) == 2, "pairs of 16-bit floats");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t d;
  if constexpr (std::is_same<InT, bf16_t>::value) {
    asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  } else {
    asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  }
  return d;
#else
  uint32_t d = 0u;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint16_t ha = uint16_t(a >> (16 * h)), hb = uint16_t(b >> (16 * h));
    const float fa = to_float(InT{ha}), fb = to_float(InT{hb});
    d |= uint32_t(is_nan(fa) || (!is_nan(fb) && fb > fa) ? hb : ha) << (16 * h);
  }
  return d;
#endif
}

// Partial maxima as a reader sees them: FP32 values, or the 16-bit floats the packed reduction stored.
template <typename InT> __device__ __forceinline__ float part_at(const float* part, int i) {
  if constexpr (sizeof(InT) == 4) {
    return part[i];
  } else {
    return to_float(InT{reinterpret_cast<const uint16_t*>(part)[i]});
  }
}

// FP32 maxima of the 8 rows (kRows) or 8 columns of a sub-block, each reduced over the lanes that xor shuffles by
// kFirst, 2 kFirst, .. < kEnd reach; the lanes where `store` write them to dst[0..7].
template <bool kRows, int kFirst, int kEnd, typename Vec>
__device__ __forceinline__ void line_maxima(const Vec (&v)[kSubRows], float* dst, bool store) {
  float m[kVec];
#pragma unroll
  for (int n = 0; n < kVec; ++n) {
    float a = 0.0f;
#pragma unroll
    for (int e = 0; e < kVec; ++e) a = amax_update(a, to_float(kRows ? v[n].e[e] : v[e].e[n]));
#pragma unroll
    for (int s = kFirst; s < kEnd; s <<= 1) a = amax_update(a, __shfl_xor_sync(0xFFFFFFFFu, a, s));
    m[n] = a;
  }
  if (store) {
    reinterpret_cast<float4*>(dst)[0] = make_float4(m[0], m[1], m[2], m[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(m[4], m[5], m[6], m[7]);
  }
}

struct PipeGeom {
  int n_row_tiles = 0, n_col_tiles = 0, n_tiles = 0;  // n_tiles < 2^30
  act_cuda::FastDiv tile_row;                         // tile index -> tile row (divides by n_col_tiles)
};

template <typename InT>
__global__ void __launch_bounds__(kThreads, Layout<InT>::kMinBlocks)
fp8_block_pipe_kernel(const Fp8BlockParams p, const PipeGeom geo) {
  using L = Layout<InT>;
  using Vec = act_cuda::Vec8<InT>;
  constexpr bool kPacked = sizeof(InT) == 2;  // maxima on pairs of 16-bit floats (2 elements per instruction)
  extern __shared__ __align__(16) unsigned char stages[];  // [kStages][kStageBytes]
  // block_dim 1 partial maxima (FP32, or the input's 16-bit floats when kPacked): rows over chunks 0-7 / 8-15;
  // columns over rows 32q..32q+31.
  __shared__ __align__(16) float rowpart[2][kTile];
  __shared__ __align__(16) float colpart[4][kTile];
  __shared__ __align__(16) float scales[2 * kTile];  // rows' scales, then columns' (block_dim 2: [0])
  __shared__ float warpmax[kWarps];                  // block_dim 2

  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const int64_t rows = p.rows, cols = p.cols;
  const bool want_row = p.row_data != nullptr, want_col = p.col_data != nullptr;
  const float in_max = input_max_finite<InT>();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = 4 * (warp % 4) + lane % 4;  // this thread's rows 8g..8g+7 of a tile
  const int j = 8 * (warp / 4) + lane / 4;  // and its columns 8j..8j+7

  // Copies: this thread's piece cq (bytes 16cq.. of a tile row) of rows crow, crow + kCopyRowStep, ...; one commit
  // group per tile (an empty one past the last tile keeps the wait count uniform).
  const int cq = tid % L::kPiecesPerRow, crow = tid / L::kPiecesPerRow;
  const int cchunk = cq / L::kPlanes, cplane = cq % L::kPlanes;
  const char* x = static_cast<const char*>(p.x);
  const int64_t row_bytes = cols * int64_t(sizeof(InT));
  const int64_t copy_step = L::kCopyRowStep * row_bytes;
  auto issue = [&](int t, int stage) {
    if (t < geo.n_tiles) {
      const int tr = int(geo.tile_row.div(uint32_t(t))), tc = t - tr * geo.n_col_tiles;
      const int64_t r = int64_t(tr) * kTile + crow;
      const int rows_left = int(rows - r < kTile ? rows - r : kTile);  // from the thread's first row on
      const bool col_ok = int64_t(tc) * kTile + cchunk * kVec < cols;
      const char* src = x + r * row_bytes + int64_t(tc) * (kTile * int(sizeof(InT))) + cq * 16;
      unsigned char* dst = stages + stage * L::kStageBytes;
#pragma unroll
      for (int u = 0; u < L::kCopies; ++u) {
        const bool valid = col_ok && u * L::kCopyRowStep < rows_left;
        act_cuda::cp_async16(dst + piece_offset(crow + u * L::kCopyRowStep, cchunk, cplane), valid ? src : x, valid);
        src += copy_step;
      }
    }
    act_cuda::cp_async_commit();
  };
  auto encode = [&](const float (&v)[kVec], float scale) {
    return p.e4m3 ? act_cuda::encode8_t<float, false, true>(v, scale)
                  : act_cuda::encode8_t<float, false, false>(v, scale);
  };

  int t = blockIdx.x, stage = 0;
#pragma unroll
  for (int s = 0; s < L::kStages - 1; ++s) issue(t + s * int(gridDim.x), s);
  for (; t < geo.n_tiles; t += gridDim.x) {
    // Tile t's group is complete (kStages - 2 younger ones may be in flight); the barrier publishes every thread's
    // copies and ends the previous tile, whose stage the next issue refills.
    act_cuda::cp_async_wait<L::kStages - 2>();
    __syncthreads();
    issue(t + (L::kStages - 1) * int(gridDim.x), stage == 0 ? L::kStages - 1 : stage - 1);
    const int tr = int(geo.tile_row.div(uint32_t(t))), tc = t - tr * geo.n_col_tiles;
    const int64_t r0 = int64_t(tr) * kTile, c0 = int64_t(tc) * kTile;

    // ---- A: the sub-block into registers; partial maxima ------------------------------------------------------
    Vec v[kSubRows];  // v[i].e[k] = x[r0 + 8g + i][c0 + 8j + k] (zero past the edges)
    const unsigned char* src = stages + stage * L::kStageBytes;
#pragma unroll
    for (int i = 0; i < kSubRows; ++i)
#pragma unroll
      for (int h = 0; h < L::kPlanes; ++h)
        reinterpret_cast<uint4*>(&v[i])[h] = *reinterpret_cast<const uint4*>(src + piece_offset(kSubRows * g + i, j, h));
    if constexpr (kPacked) {
      // w[i][q] = |columns 2q, 2q+1 of row i| as a pair (sign bits cleared).
      uint32_t w[kSubRows][kVec / 2];
#pragma unroll
      for (int i = 0; i < kSubRows; ++i)
#pragma unroll
        for (int q = 0; q < kVec / 2; ++q) w[i][q] = reinterpret_cast<const uint32_t*>(&v[i])[q] & 0x7FFF7FFFu;
      if (p.two_d) {
        uint32_t m = w[0][0];
#pragma unroll
        for (int i = 0; i < kSubRows; ++i)
#pragma unroll
          for (int q = 0; q < kVec / 2; ++q) m = max2<InT>(m, w[i][q]);
        const float a = act_cuda::warp_max(
            amax_update(amax_update(0.0f, to_float(InT{uint16_t(m)})), to_float(InT{uint16_t(m >> 16)})));
        if (lane == 0) warpmax[warp] = a;
      } else {
        if (want_row) {
          uint32_t m[kSubRows / 2];  // m[h]: maxima of rows 2h (low half) and 2h+1 (high half)
#pragma unroll
          for (int h = 0; h < kSubRows / 2; ++h) {
            uint32_t e = max2<InT>(max2<InT>(w[2 * h][0], w[2 * h][1]), max2<InT>(w[2 * h][2], w[2 * h][3]));
            uint32_t o = max2<InT>(max2<InT>(w[2 * h + 1][0], w[2 * h + 1][1]), max2<InT>(w[2 * h + 1][2], w[2 * h + 1][3]));
            m[h] = max2<InT>(__byte_perm(e, o, 0x5410), __byte_perm(e, o, 0x7632));
#pragma unroll
            for (int s = 4; s < 32; s <<= 1) m[h] = max2<InT>(m[h], __shfl_xor_sync(0xFFFFFFFFu, m[h], s));  // 8 chunks
          }
          if (lane < 4)  // one lane per row group: rows 8g..8g+7 in order
            *reinterpret_cast<uint4*>(reinterpret_cast<uint16_t*>(rowpart[warp / 4]) + kSubRows * g) =
                make_uint4(m[0], m[1], m[2], m[3]);
        }
        if (want_col) {
          uint32_t m[kVec / 2];  // m[q]: maxima of columns 2q (low half) and 2q+1 (high half)
#pragma unroll
          for (int q = 0; q < kVec / 2; ++q) {
            m[q] = w[0][q];
#pragma unroll
            for (int i = 1; i < kSubRows; ++i) m[q] = max2<InT>(m[q], w[i][q]);
#pragma unroll
            for (int s = 1; s < 4; s <<= 1) m[q] = max2<InT>(m[q], __shfl_xor_sync(0xFFFFFFFFu, m[q], s));  // 4 groups
          }
          if (lane % 4 == 0)  // one lane per chunk: columns 8j..8j+7 in order
            *reinterpret_cast<uint4*>(reinterpret_cast<uint16_t*>(colpart[warp % 4]) + kVec * j) =
                make_uint4(m[0], m[1], m[2], m[3]);
        }
      }
    } else if (p.two_d) {
      float a = 0.0f;
#pragma unroll
      for (int i = 0; i < kSubRows; ++i)
#pragma unroll
        for (int k = 0; k < kVec; ++k) a = amax_update(a, to_float(v[i].e[k]));
      a = act_cuda::warp_max(a);
      if (lane == 0) warpmax[warp] = a;
    } else {
      if (want_row) line_maxima<true, 4, 32>(v, &rowpart[warp / 4][kSubRows * g], lane < 4);    // over 8 chunks
      if (want_col) line_maxima<false, 1, 4>(v, &colpart[warp % 4][kVec * j], lane % 4 == 0);  // over 4 groups
    }
    __syncthreads();

    // ---- B: one scale per block; scale_inv and zero padding -----------------------------------------------------
    if (p.two_d) {
      if (warp == 0) {
        const float a = act_cuda::warp_max(lane < kWarps ? warpmax[lane] : 0.0f);
        const float s = fb_cuda::fb_scale(a, p, in_max);
        if (lane == 0) {
          scales[0] = s;
          const float si = 1.0f / s;
          if (want_row) p.row_scale[fb2_row_scale_offset(tr, tc, cols)] = si;
          if (want_col) p.col_scale[fb2_col_scale_offset(tr, tc, rows)] = si;
        }
        if (lane < 3) {
          const int jr = geo.n_col_tiles + lane, ic = geo.n_row_tiles + lane;
          if (want_row && tc == geo.n_col_tiles - 1 && jr < roundup(geo.n_col_tiles, 4))
            p.row_scale[fb2_row_scale_offset(tr, jr, cols)] = 0.0f;
          if (want_col && tr == geo.n_row_tiles - 1 && ic < roundup(geo.n_row_tiles, 4))
            p.col_scale[fb2_col_scale_offset(ic, tc, rows)] = 0.0f;
        }
      }
    } else if (tid < kTile) {
      if (want_row) {
        const float a = amax_update(amax_update(0.0f, part_at<InT>(rowpart[0], tid)), part_at<InT>(rowpart[1], tid));
        const float s = fb_cuda::fb_scale(a, p, in_max);
        scales[tid] = s;
        const int64_t r = r0 + tid;
        if (r < roundup(rows, 4)) p.row_scale[fb1_row_scale_offset(r, tc, rows)] = r < rows ? 1.0f / s : 0.0f;
      }
    } else if (want_col) {
      const int cl = tid - kTile;
      float a = 0.0f;
#pragma unroll
      for (int q = 0; q < 4; ++q) a = amax_update(a, part_at<InT>(colpart[q], cl));
      const float s = fb_cuda::fb_scale(a, p, in_max);
      scales[tid] = s;
      const int64_t c = c0 + cl;
      if (c < roundup(cols, 4)) p.col_scale[fb1_col_scale_offset(tr, c, cols)] = c < cols ? 1.0f / s : 0.0f;
    }
    __syncthreads();

    // ---- C: codes of both copies from the registers ---------------------------------------------------------------
    // rows and cols are multiples of 8, so a sub-block lies wholly inside x or wholly outside.
    if (r0 + kSubRows * g < rows && c0 + kVec * j < cols) {
      float f[kSubRows][kVec];  // the sub-block widened once for both copies
#pragma unroll
      for (int i = 0; i < kSubRows; ++i)
#pragma unroll
        for (int k = 0; k < kVec; ++k) f[i][k] = to_float(v[i].e[k]);
      if (want_row) {
        uint8_t* dst = p.row_data + (r0 + kSubRows * g) * cols + c0 + kVec * j;
#pragma unroll
        for (int i = 0; i < kSubRows; ++i)
          *reinterpret_cast<uint2*>(dst + i * cols) = encode(f[i], p.two_d ? scales[0] : scales[kSubRows * g + i]);
      }
      if (want_col) {
        uint8_t* dst = p.col_data + (c0 + kVec * j) * rows + r0 + kSubRows * g;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          float col[kSubRows];
#pragma unroll
          for (int i = 0; i < kSubRows; ++i) col[i] = f[i][k];
          *reinterpret_cast<uint2*>(dst + k * rows) = encode(col, p.two_d ? scales[0] : scales[kTile + kVec * j + k]);
        }
      }
    }
    stage = stage == L::kStages - 1 ? 0 : stage + 1;
  }
  act_cuda::cp_async_wait<0>();
}

// A persistent grid: as many blocks as are resident, at most one per tile. False where not one block's stages fit
// in the device's shared memory (pre-Hopper parts, FP32 input): the caller then takes the tile kernel.
template <typename InT> bool launch(const Fp8BlockParams& p, const PipeGeom& geo, cudaStream_t stream) {
  constexpr auto kernel = fp8_block_pipe_kernel<InT>;
  constexpr size_t kSmem = Layout<InT>::kSmemBytes;
  const int per_sm = act_cuda::resident_per_sm<kernel>(kThreads, kSmem);
  if (per_sm < 1) {
    (void)cudaGetLastError();  // the refused shared-memory allowance, not a launch failure
    return false;
  }
  const int64_t grid = std::min<int64_t>(geo.n_tiles, int64_t(per_sm) * act_cuda::device_sm_count_or_default());
  kernel<<<unsigned(grid), kThreads, kSmem, stream>>>(p, geo);
  return true;
}

}  // namespace fb_pipe

}  // namespace te
