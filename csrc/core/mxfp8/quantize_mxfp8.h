// MXFP8 quantization (SPEC §4.5, §4.8, §5.1 FULLY_FUSED), fused with every activation functor: the value of each
// output element is rnd_in(act(x)) (rounded to the input dtype, then widened), and each copy is quantized from
// those values independently: rowwise 1x32 blocks along the last dim, columnwise 32x1 blocks down the rows (same
// shape, not transposed). Per block: e = e8m0_encode(fl(amax * fl(1/fp8_max))), q = fp8(fl(v * 2^(127-e))).
// Invariant: CPU and CUDA evaluate the same functors, the same rounding and the same encoders, so data and
// scale bytes are identical; only the dbias sums (FP32, unrounded values) may differ in order.
//
// Shapes (row-major, flattened to 2-D; `cols` as in ActKernelParams: K for unary ops, H for gated ones):
//   x          [rows, K] or [rows, 2H]                        input dtype
//   grad       [rows, K] or [rows, H] (the forward output)     input dtype (backward only)
//   row_data   [rows, out_cols]                                uint8 FP8 codes
//   row_scale  [roundup(rows, 128), roundup(out_cols/32, 4)]   uint8 E8M0 (compact or swizzled)
//   col_data   [rows, out_cols]                                uint8 FP8 codes (not transposed)
//   col_scale  [roundup(ceil(rows/32), 4), roundup(out_cols, 128)]  uint8 E8M0; entry [i, j] covers rows
//              32i..32i+31 of column j (swizzled: as the transpose [out_cols, ceil(rows/32)])
//   dbias_partial [ceil(rows/32), out_cols]                    FP32 column sums of each 32-row tile
// out_cols % 32 == 0 is required (the bridge checks it). Padding entries of the scale tensors are written as
// zero by the kernels themselves (so a noop launch leaves every byte untouched).
#pragma once

#include "../act/activation.h"
#include "../formats/table.h"

namespace te {

constexpr int64_t kMxBlock = format_block_len(Format::kMxfp8);  // 32

struct Mxfp8Params {
  const void* x = nullptr;
  const void* grad = nullptr;
  uint8_t* row_data = nullptr;   // null: no rowwise copy
  uint8_t* row_scale = nullptr;
  uint8_t* col_data = nullptr;   // null: no columnwise copy
  uint8_t* col_scale = nullptr;
  float* dbias_partial = nullptr;
  const float* noop = nullptr;   // [1] optional: 1.0 means write nothing
  int64_t rows = 0;
  int64_t cols = 0;
  ActArgs act;
  bool e4m3 = true;
  bool swizzled = false;         // scales in the GEMM-swizzled layout (qflags bit5)
};

// The padded scale shapes of SPEC §4.8 for an [rows, out_cols] tensor (the format table's rule).
struct Mxfp8ScaleShapes {
  int64_t row_r, row_c, col_r, col_c;
};
inline Mxfp8ScaleShapes mxfp8_scale_shapes(int64_t rows, int64_t out_cols) {
  const CopyShapes s = format_scale_shapes(Format::kMxfp8, rows, out_cols);
  return {s.row.r, s.row.c, s.col.r, s.col.c};
}

// Byte offset of the rowwise scale of (row r, block j) and of the columnwise scale of (row block i, column j).
TE_HD int64_t mx_row_scale_offset(int64_t r, int64_t j, int64_t out_cols, bool swizzled) {
  const int64_t cpad = roundup(ceil_div(out_cols, kMxBlock), 4);
  return swizzled ? swizzled_scale_offset(r, j, cpad) : r * cpad + j;
}
TE_HD int64_t mx_col_scale_offset(int64_t i, int64_t j, int64_t rows, int64_t out_cols, bool swizzled) {
  // Swizzled: the compact matrix is the transpose [out_cols, ceil(rows/32)], padded to multiples of 128 x 4.
  return swizzled ? swizzled_scale_offset(j, i, roundup(ceil_div(rows, kMxBlock), 4)) : i * roundup(out_cols, 128) + j;
}

// dbias partial rows of an MXFP8 launch: one per 32-row tile.
inline int64_t mxfp8_dbias_blocks(int64_t rows) { return ceil_div(rows, kMxBlock) < 1 ? 1 : ceil_div(rows, kMxBlock); }

void quantize_mxfp8_cpu(ActKind kind, bool backward, DType in_dtype, const Mxfp8Params& p,
                        const ParallelFor& parallel_for);
#if defined(TE_WITH_CUDA)
void quantize_mxfp8_cuda(ActKind kind, bool backward, DType in_dtype, const Mxfp8Params& p, cudaStream_t s);
#endif

}  // namespace te
