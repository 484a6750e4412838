// CPU kernels of NVFP4 quantization (see quantize_nvfp4.h). Work unit: one 16-row tile; its values are widened once,
// then the rowwise blocks (1x16 along the row) and the columnwise blocks (16x1 down each column, optionally
// Hadamard-transformed) are taken from them, as the CUDA kernel does from one read of x.
#include <algorithm>
#include <cstring>
#include <vector>

#include "quantize_nvfp4.h"

namespace te {
namespace {

template <typename InT> void amax_rows(const Nvfp4AmaxParams& p, int64_t tile, float* row_out, float* col_out) {
  const InT* x = static_cast<const InT*>(p.x);
  const int64_t r0 = tile * kNvBlock, nr = std::min(kNvBlock, p.rows - r0);
  float ar = 0.0f, ac = 0.0f;
  for (int64_t i = 0; i < nr; ++i)
    for (int64_t c = 0; c < p.cols; ++c) ar = amax_update(ar, to_float(x[(r0 + i) * p.cols + c]));
  if (p.amax_col != nullptr && p.rht && nr == kNvBlock) {
    float v[16], y[16];
    for (int64_t c = 0; c < p.cols; ++c) {
      for (int64_t i = 0; i < kNvBlock; ++i) v[i] = to_float(x[(r0 + i) * p.cols + c]);
      rht16(v, p.rht_sign_mask, y);
      for (int i = 0; i < 16; ++i) ac = amax_update(ac, y[i]);
    }
  } else {
    ac = ar;
  }
  *row_out = ar;
  *col_out = ac;
}

template <typename InT> void nv_tile(const Nvfp4Params& p, int64_t tile, float s_enc_row, float s_enc_col) {
  const InT* x = static_cast<const InT*>(p.x);
  const int64_t rows = p.rows, cols = p.cols, nblk = cols / kNvBlock;
  const int64_t r0 = tile * kNvBlock, nr = std::min(kNvBlock, rows - r0);
  std::vector<float> v(size_t(kNvBlock * cols), 0.0f);
  for (int64_t i = 0; i < nr; ++i)
    for (int64_t c = 0; c < cols; ++c) v[size_t(i * cols + c)] = to_float(x[(r0 + i) * cols + c]);
  // 2-D: amax of each 16x16 tile (rows that exist).
  std::vector<float> tile_amax;
  if (p.two_d) {
    tile_amax.assign(size_t(nblk), 0.0f);
    for (int64_t i = 0; i < nr; ++i)
      for (int64_t c = 0; c < cols; ++c)
        tile_amax[size_t(c / kNvBlock)] = amax_update(tile_amax[size_t(c / kNvBlock)], v[size_t(i * cols + c)]);
  }
  const RngKey key = rng_unpack(p.rng);
  if (p.row_data) {
    const float s_dec = 1.0f / s_enc_row;
    for (int64_t i = 0; i < nr; ++i) {
      for (int64_t b = 0; b < nblk; ++b) {
        const float* blk = &v[size_t(i * cols + b * kNvBlock)];
        float amax = 0.0f;
        if (p.two_d) {
          amax = tile_amax[size_t(b)];
        } else {
          for (int k = 0; k < 16; ++k) amax = amax_update(amax, blk[k]);
        }
        nvfp4_emit_block(blk, amax, s_enc_row, s_dec, p.sr, key, (r0 + i) * nblk + b, 0,
                         &p.row_scale[nv_row_scale_offset(r0 + i, b, cols, p.swizzled)],
                         p.row_data + (r0 + i) * (cols / 2) + b * 8);
      }
    }
  }
  if (p.col_data) {  // rows % 16 == 0 here (the bridge checks it), so nr == 16
    const float s_dec = 1.0f / s_enc_col;
    float col[16], y[16];
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t i = 0; i < kNvBlock; ++i) col[i] = v[size_t(i * cols + c)];
      const float* vals = col;
      if (p.rht) {
        rht16(col, p.rht_sign_mask, y);
        vals = y;
      }
      float amax = 0.0f;
      if (p.two_d) {
        amax = tile_amax[size_t(c / kNvBlock)];
      } else {
        for (int k = 0; k < 16; ++k) amax = amax_update(amax, vals[k]);
      }
      nvfp4_emit_block(vals, amax, s_enc_col, s_dec, p.sr, key, c * (rows / kNvBlock) + tile, 1,
                       &p.col_scale[nv_col_scale_offset(c, tile, rows, p.swizzled)],
                       p.col_data + c * (rows / 2) + tile * 8);
    }
  }
}

}  // namespace

void nvfp4_amax_cpu(DType in_dtype, const Nvfp4AmaxParams& p, const ParallelFor& parallel_for) {
  const int64_t tiles = ceil_div(p.rows, kNvBlock);
  if (tiles == 0 || p.cols == 0) return;
  std::vector<float> ar(size_t(tiles), 0.0f), ac(size_t(tiles), 0.0f);
  TE_SWITCH_IN_DTYPE(in_dtype, T, {
    parallel_for(tiles, [&](int64_t b0, int64_t b1) {
      for (int64_t t = b0; t < b1; ++t) amax_rows<T>(p, t, &ar[size_t(t)], &ac[size_t(t)]);
    });
  });
  for (int64_t t = 0; t < tiles; ++t) {
    *p.amax_row = amax_update(*p.amax_row, ar[size_t(t)]);
    if (p.amax_col) *p.amax_col = amax_update(*p.amax_col, ac[size_t(t)]);
  }
}

void quantize_nvfp4_cpu(DType in_dtype, const Nvfp4Params& p, const ParallelFor& parallel_for) {
  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const float amax_row = *p.amax_in_row, amax_col = *p.amax_in_col;
  if (p.amax_out_row) *p.amax_out_row = amax_row;
  if (p.amax_out_col) *p.amax_out_col = amax_col;
  const Nvfp4ScaleShapes s = nvfp4_scale_shapes(p.rows, p.cols);
  // Padding entries are zero; the real ones are overwritten below.
  if (p.row_data) std::memset(p.row_scale, 0, size_t(s.row_r * s.row_c));
  if (p.col_data) std::memset(p.col_scale, 0, size_t(s.col_r * s.col_c));
  const int64_t tiles = ceil_div(p.rows, kNvBlock);
  if (tiles == 0 || p.cols == 0) return;
  const float s_enc_row = nvfp4_global_scale(amax_row), s_enc_col = nvfp4_global_scale(amax_col);
  TE_SWITCH_IN_DTYPE(in_dtype, T, {
    parallel_for(tiles, [&](int64_t b0, int64_t b1) {
      for (int64_t t = b0; t < b1; ++t) nv_tile<T>(p, t, s_enc_row, s_enc_col);
    });
  });
}

}  // namespace te
