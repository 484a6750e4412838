// FP8 block quantization (SPEC §4.7, §4.8; Hopper's native block format): FP8 codes with one FP32 scale per
// 1x128 block (block_dim 1) or per 128x128 tile (block_dim 2). Activations take the UNFUSED path (SPEC §5.1): the
// bridge writes rnd_in(act(x)) into a temporary and quantizes that, so this kernel only needs the input dtype.
// Per block: amax over the elements that exist (NaN ignored), scale by block_scale() below, scale_inv = fl(1/scale),
// q = fp8(fl(x * scale)). Invariant: CPU and CUDA use these same functions and the same encoder, and a block's
// amax is a max (order-free), so data and scale bytes are identical on both sides.
//
// Shapes (row-major, the tensor flattened to [rows, cols]; a 0-d tensor is one 1x1 block):
//   x          [rows, cols]                                    input dtype
//   row_data   [rows, cols]                                    uint8 FP8 codes
//   col_data   [cols, rows]                                    uint8 FP8 codes, the columnwise copy stored transposed
//   block_dim 1: rowwise 1x128 blocks along cols; the columnwise copy is x^T quantized with 1x128 blocks along ITS
//                rows (128x1 blocks of x), each copy from x independently.
//     row_scale  [ceil(cols/128), roundup(rows, 4)]   float32; entry [j, r] = block j of row r (rows contiguous)
//     col_scale  [ceil(rows/128), roundup(cols, 4)]   float32; entry [i, c] = rows 128i.. of column c
//   block_dim 2: 128x128 tiles; col_data is the bitwise transpose of row_data, scales shared by the tile.
//     row_scale  [ceil(rows/128), roundup(ceil(cols/128), 4)]  float32; entry [i, j] = tile (i, j)
//     col_scale  [ceil(cols/128), roundup(ceil(rows/128), 4)]  float32; entry [j, i] = tile (i, j)
// Padding entries of the scale tensors are written as zero by the kernels themselves (a noop launch leaves every
// byte untouched).
#pragma once

#include "../../rules/dispatch.h"
#include "../../rules/numerics.h"
#include "../../rules/parallel.h"
#include "../../rules/scaling.h"
#include "../table.h"

#if defined(TE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace te {

constexpr int64_t kFp8BlockLen = format_block_len(Format::kFp8Block1d);  // 128

struct Fp8BlockParams {
  const void* x = nullptr;        // [rows, cols] input dtype, contiguous
  uint8_t* row_data = nullptr;    // null: no rowwise copy
  float* row_scale = nullptr;
  uint8_t* col_data = nullptr;    // null: no columnwise copy
  float* col_scale = nullptr;
  const float* noop = nullptr;    // [1] optional: 1.0 means write nothing
  int64_t rows = 0;
  int64_t cols = 0;
  float amax_epsilon = 0.0f;
  bool e4m3 = true;
  bool force_pow2 = true;
  bool two_d = false;             // 128x128 tiles (block_dim 2) instead of 1x128 blocks
};

// Padded scale shapes of SPEC §4.8 for an [rows, cols] tensor (the format table's rule).
struct Fp8BlockScaleShapes {
  int64_t row_r, row_c, col_r, col_c;
};
inline Fp8BlockScaleShapes fp8_block_scale_shapes(int64_t rows, int64_t cols, bool two_d) {
  const CopyShapes s = format_scale_shapes(two_d ? Format::kFp8Block2d : Format::kFp8Block1d, rows, cols);
  return {s.row.r, s.row.c, s.col.r, s.col.c};
}

// Largest finite value of the input dtype: an Inf scale (a tiny amax) is replaced by it (SPEC §4.7; TE's rule,
// not FLT_MAX as per-tensor current scaling does).
template <typename InT> TE_HD float input_max_finite();
template <> TE_HD float input_max_finite<float>() { return kFloatMax; }
template <> TE_HD float input_max_finite<fp16_t>() { return 65504.0f; }
template <> TE_HD float input_max_finite<bf16_t>() { return bits_float(0x7F7F0000u); }  // 3.3895314e38

// The scale of one block (SPEC §4.4 step 3 with the §4.7 change): amax raised to epsilon; amax 0, Inf or NaN ->
// 1; else fl(fp8_max / amax), an Inf result -> the input dtype's max finite; pow2 clears the mantissa (rounds
// down to a power of two). All-zero block: scale 1, scale_inv 1, codes 0.
TE_HD float fp8_block_scale(float amax, float fp8_max_value, float amax_epsilon, bool force_pow2, float in_max) {
  return current_scale(amax, fp8_max_value, amax_epsilon, force_pow2, in_max);
}

// Offsets of the scale of rowwise block (r, j) / columnwise block (i, c) in the 1-D layouts, and of tile (i, j) in
// the 2-D layouts (compact, SPEC §4.8).
TE_HD int64_t fb1_row_scale_offset(int64_t r, int64_t j, int64_t rows) { return j * roundup(rows, 4) + r; }
TE_HD int64_t fb1_col_scale_offset(int64_t i, int64_t c, int64_t cols) { return i * roundup(cols, 4) + c; }
TE_HD int64_t fb2_row_scale_offset(int64_t i, int64_t j, int64_t cols) {
  return i * roundup(ceil_div(cols, kFp8BlockLen), 4) + j;
}
TE_HD int64_t fb2_col_scale_offset(int64_t i, int64_t j, int64_t rows) {
  return j * roundup(ceil_div(rows, kFp8BlockLen), 4) + i;
}

void quantize_fp8_block_cpu(DType in_dtype, const Fp8BlockParams& p, const ParallelFor& parallel_for);
#if defined(TE_WITH_CUDA)
void quantize_fp8_block_cuda(DType in_dtype, const Fp8BlockParams& p, cudaStream_t s);
#endif

}  // namespace te
