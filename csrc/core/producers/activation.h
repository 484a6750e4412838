// Kernel-level API of the activation / cast family: one params struct passed by value, launchers for CPU and
// CUDA, all instantiated from the functors of act_functors.h. The same kernels serve plain casts (kIdentity),
// activations (forward) and their derivatives (backward), each writing either the input dtype or FP8 codes.
//
// Shapes (row-major, flattened to 2-D): `cols` counts positions per row: K for unary ops, H for gated ones.
//   x     [rows, K] or [rows, 2H]              input dtype (a = first half, b = second half when gated)
//   grad  [rows, K] or [rows, H]               input dtype (backward only)
//   out   [rows, out_cols]                     input dtype (plain) or uint8 FP8 codes
//   out_t [out_cols, rows]                     uint8 FP8 codes, the transposed copy (optional)
// out_cols = 2H for gated backward ([d_a | d_b]), else `cols`.
#pragma once

#include "act_functors.h"
#include "../rules/dispatch.h"
#include "../rules/numerics.h"
#include "../rules/parallel.h"
#include "../rules/scaling.h"
#include "../formats/fp8/fp8.h"
#include "../formats/scale_mode.h"

#if defined(TE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace te {

struct ActKernelParams {
  const void* x = nullptr;
  const void* grad = nullptr;
  void* out = nullptr;
  uint8_t* out_t = nullptr;
  const float* scale = nullptr;     // [1] delayed scaling
  float* amax = nullptr;            // [1] delayed: accumulated; current: written by kAmaxOnly, read by kCurrent
  float* scale_inv = nullptr;       // [1] written as fl(1/scale) by FP8 modes
  const float* noop = nullptr;      // [1] optional: 1.0 means write nothing
  float* dbias_partial = nullptr;   // [act_dbias_blocks(rows, cols), out_cols] FP32 column sums of the values
  // Current scaling in one call (ScaleMode::kCurrent with amax_in_call): the launcher takes the amax itself and
  // writes it to `amax`, which need not be zeroed. On CUDA in one cooperative launch when the tensor fits one
  // resident grid of at most amax_slots blocks (per-block maxima in amax_partials[0..amax_slots), grid barrier, cast
  // of the values still held in registers); otherwise (and on the CPU) by zeroing `amax`, then the amax pass
  // (amax_pass_params) and the cast.
  bool amax_in_call = false;
  float* amax_partials = nullptr;
  int amax_slots = 0;
  // Block scales of the CUDA block-format paths, compact or GEMM-swizzled (blk_swizzled):
  //   MXFP8 rowwise (quantize_mxfp8's streaming path): blk_scale E8M0 [roundup(rows, 128), roundup(out_cols/32, 4)].
  //   NVFP4 (ScaleMode::kNvfp4): blk_scale E4M3 [roundup(rows, 128), roundup(out_cols/16, 4)] of `out`, blk_scale_t
  //   E4M3 [roundup(out_cols, 128), roundup(rows/16, 4)] of `out_t`; the global amax is read from `amax`, and
  //   copied to nv_amax_out[0..1] where those are set.
  uint8_t* blk_scale = nullptr;
  uint8_t* blk_scale_t = nullptr;
  float* nv_amax_out[2] = {nullptr, nullptr};
  bool blk_swizzled = false;
  int64_t rows = 0;
  int64_t cols = 0;
  ActArgs act;
  ScaleMode mode = ScaleMode::kPlain;
  bool e4m3 = true;
  bool force_pow2 = false;
  float amax_epsilon = 0.0f;
};

inline int64_t act_out_cols(ActKind k, bool backward, int64_t cols) {
  return (backward && act_is_gated(k)) ? 2 * cols : cols;
}

// Row blocks of the tile kernel (CUDA grid.y): one per 128-row tile, capped at 65535 (past that a block walks
// tiles blk, blk + 65535, ...).
constexpr int64_t kActBlockRows = 128;
constexpr int64_t kActTileCols = 64;
inline int64_t act_row_blocks(int64_t rows, int64_t /*cols*/) {
  const int64_t row_tiles = (rows + kActBlockRows - 1) / kActBlockRows;
  return row_tiles < 1 ? 1 : (row_tiles < 65535 ? row_tiles : 65535);
}

// dbias partial sums: one FP32 row of column sums per `act_dbias_rows` consecutive rows. 128, halved (down to 4)
// while the CUDA strip kernel (2048 positions per block) would get fewer than 1024 blocks, so short tensors
// still spread over the GPU. Depends on the shape only: the bridge sizes the buffer [act_dbias_blocks, out_cols]
// and every kernel, CPU or CUDA, fills exactly that.
constexpr int64_t kActStripCols = 2048;
inline int64_t act_dbias_rows(int64_t rows, int64_t cols) {
  const int64_t strips = cols < 1 ? 1 : (cols + kActStripCols - 1) / kActStripCols;
  int64_t r = kActBlockRows;
  while (r > 4 && ((rows + r - 1) / r) * strips < 1024) r /= 2;
  return r;
}
// The pipelined tile kernels (FP8 and NVFP4 with a transposed copy) sum dbias per warp of 16 rows: they take dbias
// where a partial row holds at least that many rows (the plan of NVFP4's fused path asks the same).
constexpr int64_t kActPipeDbiasMinRows = 16;
inline bool act_pipe_takes_dbias(int64_t rows, int64_t cols) {
  return act_dbias_rows(rows, cols) >= kActPipeDbiasMinRows;
}
inline int64_t act_dbias_blocks(int64_t rows, int64_t cols) {
  const int64_t n = (rows + act_dbias_rows(rows, cols) - 1) / act_dbias_rows(rows, cols);
  return n < 1 ? 1 : n;
}

// CPU. `in_dtype` is kFloat32/kFloat16/kBFloat16; `fp8_out` selects FP8 codes over the input dtype.
void activation_cpu(ActKind kind, bool backward, DType in_dtype, const ActKernelParams& p,
                    const ParallelFor& parallel_for);
// Sums the partial rows into `out` ([cols], dtype `out_dtype`), one rounding per column.
void dbias_reduce_cpu(const float* partial, int64_t partial_rows, int64_t cols, DType out_dtype, void* out);

#if defined(TE_WITH_CUDA)
void activation_cuda(ActKind kind, bool backward, DType in_dtype, const ActKernelParams& p, cudaStream_t s);
void dbias_reduce_cuda(const float* partial, int64_t partial_rows, int64_t cols, DType out_dtype, void* out,
                       cudaStream_t s);
#endif

}  // namespace te

namespace te {

// Current scaling in one call (ActKernelParams::amax_in_call): the per-block amax slots a caller provides, and the
// largest tensor (elements) worth providing them for (slots x 512 threads x 2 chunks per thread x 8 elements per
// chunk: act_cuda.cuh's kRowThreads, coop_units and kVec, which this torch-free header does not see); the CUDA
// launcher decides from residency whether one launch covers a given tensor.
constexpr int kOneLaunchAmaxSlots = 1024;
constexpr int64_t kOneLaunchMaxElems = int64_t(kOneLaunchAmaxSlots) * 512 * 2 * 8;

// The amax pass over the op of `p` (current scaling's first pass, NVFP4's global amax): the same input and op,
// nothing written but `amax`, which the caller has zeroed.
inline ActKernelParams amax_pass_params(ActKernelParams p) {
  p.mode = ScaleMode::kAmaxOnly;
  p.out = nullptr;
  p.out_t = nullptr;
  p.dbias_partial = nullptr;
  p.amax_in_call = false;
  return p;
}

// The scale an FP8 mode multiplies by.
TE_HD float mode_scale(const ActKernelParams& p) {
  if (p.mode == ScaleMode::kDelayed) return *p.scale;
  if (p.mode == ScaleMode::kCurrent) return current_scale(*p.amax, fp8_max(p.e4m3), p.amax_epsilon, p.force_pow2);
  return 1.0f;
}

}  // namespace te
