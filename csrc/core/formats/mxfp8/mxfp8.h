// MXFP8 (SPEC §4.5, §4.8): FP8 codes with one E8M0 scale per 1x32 block (rowwise) or 32x1 block (columnwise). The
// block size, the padded scale shapes and the byte offsets of a block's scale (compact or GEMM-swizzled). The E8M0
// codec and the block code rule are rules/numerics.h's. The kernels that write the format are the producers'
// (producers/mxfp8: the activation / identity fused with the MXFP8 emitter).
#pragma once

#include "../../rules/common.h"
#include "../../rules/scaling.h"
#include "../table.h"

namespace te {

constexpr int64_t kMxBlock = format_block_len(Format::kMxfp8);  // 32

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

}  // namespace te
