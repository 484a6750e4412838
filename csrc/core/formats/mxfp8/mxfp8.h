// MXFP8 (SPEC §4.5, §4.8): FP8 codes with one E8M0 scale per 1x32 block (rowwise) or 32x1 block (columnwise). The
// block size, the padded scale shapes and the byte offsets of a block's scale (compact or GEMM-swizzled). The E8M0
// codec and the block code rule are rules/numerics.h's. The kernels that write the format are the producers'
// (producers/mxfp8: the activation / identity fused with the MXFP8 emitter).
#pragma once

#include "../../rules/common.h"
#include "../../rules/numerics.h"
#include "../../rules/scaling.h"
#include "../table.h"

#if defined(TE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

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

// The GEMM operand decode (SPEC §6.7): element (r, c) of an MXFP8 GEMM operand stored as [rows, cols] with
// GEMM-swizzled E8M0 scales, fl(code · 2^(e - 127)). `k_cols`: the blocks run along cols (the rowwise copy), else
// along rows (the columnwise copy, not transposed).
TE_HD float mx_gemm_decode(const uint8_t* codes, const uint8_t* scales, int64_t r, int64_t c, int64_t rows,
                           int64_t cols, bool k_cols, bool e4m3) {
  const int64_t so = k_cols ? mx_row_scale_offset(r, c / kMxBlock, cols, true)
                            : mx_col_scale_offset(r / kMxBlock, c, rows, cols, true);
  return fp8_to_float(codes[r * cols + c], e4m3) * e8m0_to_float(scales[so]);
}

#if defined(TE_WITH_CUDA)
// The operand decoded once into bf16 `out` [rows, cols] (exact unless a value falls below bf16's range, 2^-133) on
// `stream`: the sm_90 MXFP8 GEMM's input (ops/gemm_op.cpp). Bandwidth-bound, 16 codes a thread.
void decode_mxfp8_gemm_operand_cuda(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                                    bool k_cols, bool e4m3, void* out, cudaStream_t stream);
#endif

}  // namespace te
