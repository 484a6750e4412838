// CPU kernel of FP8 block quantization (see quantize_fp8_block.h). Work unit: one band of 128 rows, which holds
// whole columnwise blocks (block_dim 1) and whole tiles (block_dim 2), so bands are independent.
#include <algorithm>
#include <cstring>
#include <vector>

#include "quantize_fp8_block.h"

namespace te {
namespace {

template <typename InT> void fb_band(const Fp8BlockParams& p, int64_t band) {
  const InT* x = static_cast<const InT*>(p.x);
  const int64_t rows = p.rows, cols = p.cols;
  const int64_t r0 = band * kFp8BlockLen, r1 = std::min(rows, r0 + kFp8BlockLen);
  const float fmax = fp8_max(p.e4m3), in_max = input_max_finite<InT>();
  auto scale_of = [&](float amax) { return fp8_block_scale(amax, fmax, p.amax_epsilon, p.force_pow2, in_max); };
  auto val = [&](int64_t r, int64_t c) { return to_float(x[r * cols + c]); };

  if (p.two_d) {
    for (int64_t c0 = 0; c0 < cols; c0 += kFp8BlockLen) {
      const int64_t c1 = std::min(cols, c0 + kFp8BlockLen);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = amax_update(amax, val(r, c));
      const float scale = scale_of(amax), scale_inv = 1.0f / scale;
      const int64_t j = c0 / kFp8BlockLen;
      if (p.row_data) p.row_scale[fb2_row_scale_offset(band, j, cols)] = scale_inv;
      if (p.col_data) p.col_scale[fb2_col_scale_offset(band, j, rows)] = scale_inv;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const uint8_t q = float_to_fp8(val(r, c) * scale, p.e4m3);
          if (p.row_data) p.row_data[r * cols + c] = q;
          if (p.col_data) p.col_data[c * rows + r] = q;  // the bitwise transpose
        }
      }
    }
    return;
  }
  if (p.row_data) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c0 = 0; c0 < cols; c0 += kFp8BlockLen) {
        const int64_t c1 = std::min(cols, c0 + kFp8BlockLen);
        float amax = 0.0f;
        for (int64_t c = c0; c < c1; ++c) amax = amax_update(amax, val(r, c));
        const float scale = scale_of(amax);
        p.row_scale[fb1_row_scale_offset(r, c0 / kFp8BlockLen, rows)] = 1.0f / scale;
        for (int64_t c = c0; c < c1; ++c) p.row_data[r * cols + c] = float_to_fp8(val(r, c) * scale, p.e4m3);
      }
    }
  }
  if (p.col_data) {
    // Column maxima over the band's rows (a row-major sweep), then the codes of x^T's blocks.
    std::vector<float> scale(size_t(cols), 0.0f);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < cols; ++c) scale[size_t(c)] = amax_update(scale[size_t(c)], val(r, c));
    for (int64_t c = 0; c < cols; ++c) {
      scale[size_t(c)] = scale_of(scale[size_t(c)]);
      p.col_scale[fb1_col_scale_offset(band, c, cols)] = 1.0f / scale[size_t(c)];
    }
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = r0; r < r1; ++r) p.col_data[c * rows + r] = float_to_fp8(val(r, c) * scale[size_t(c)], p.e4m3);
  }
}

}  // namespace

void quantize_fp8_block_cpu(DType in_dtype, const Fp8BlockParams& p, const ParallelFor& parallel_for) {
  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const Fp8BlockScaleShapes s = fp8_block_scale_shapes(p.rows, p.cols, p.two_d);
  // Padding entries are zero; the real ones are overwritten below.
  if (p.row_data) std::memset(p.row_scale, 0, size_t(s.row_r * s.row_c) * sizeof(float));
  if (p.col_data) std::memset(p.col_scale, 0, size_t(s.col_r * s.col_c) * sizeof(float));
  const int64_t bands = ceil_div(p.rows, kFp8BlockLen);
  if (bands == 0 || p.cols == 0) return;
  TE_SWITCH_IN_DTYPE(in_dtype, T, {
    parallel_for(bands, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) fb_band<T>(p, b);
    });
  });
}

}  // namespace te
