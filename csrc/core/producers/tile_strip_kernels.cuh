// The general tile kernel (act_kernel: ragged or misaligned rows, dbias with a transposed copy) and the strip
// kernel (act_strip_kernel: dbias of unary ops on aligned rows without a transposed copy).
// Tile kernel: a block of 256 threads owns 64 positions x 128 rows; thread t takes the 8 consecutive positions
// 8*(t%8).. and the 4 consecutive rows 4*(t/8)..: 16-byte loads of bf16/fp16 (two for fp32), all four rows in
// flight before any math. FP8 codes of the transposed copy go through shared memory as 4-row words, swizzled
// so that neither the stores nor the 16-byte reads conflict, and leave as 16-byte rows of out_t.
// Invariant: dbias partial rows are exactly the act_dbias_rows blocks of activation.h, as on the CPU.
#pragma once

#include "emit.cuh"
#include "eval.cuh"

namespace te {
namespace act_cuda {

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

}  // namespace act_cuda
}  // namespace te
