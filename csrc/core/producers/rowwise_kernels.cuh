// The rowwise kernels: act_rowwise_kernel (aligned rows, no transposed copy, no dbias: a flat list of 8-element
// chunks, every output kind including MXFP8 and NVFP4 rowwise), act_gated_rows_kernel (gated forward to plain
// outputs on a 2-D grid) and act_current_coop_kernel (current scaling of a small tensor in one cooperative launch).
// Invariant: a chunk's values come from eval8 and leave through the emitters of emit.cuh, so every kernel here
// writes the bytes the tile kernel would.
#pragma once

#include <cooperative_groups.h>

#include "emit.cuh"
#include "eval.cuh"

namespace te {
namespace act_cuda {

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

}  // namespace act_cuda
}  // namespace te
