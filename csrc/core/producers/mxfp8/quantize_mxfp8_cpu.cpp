// CPU kernel of MXFP8 quantization fused with the activation functors (see quantize_mxfp8.h). Work unit: one
// 32-row tile, in column chunks of kChunk output columns: the chunk's values are evaluated once, then both copies
// and the dbias partials are taken from them, as the CUDA kernel does from one read of x.
#include <algorithm>
#include <cstring>
#include <vector>

#include "quantize_mxfp8.h"

namespace te {
namespace {

constexpr int64_t kChunk = 256;  // output columns per chunk (a multiple of 32)

// The unrounded FP32 value of output element (r, oc): act(a)[*lin(b)], or for backward g*act'(x), with the
// gated backward's [d_a | d_b] halves.
template <class Op, bool kBwd, typename InT> float mx_value(const Mxfp8Params& p, int64_t r, int64_t oc) {
  const int64_t cols = p.cols;
  const int64_t x_stride = Op::kGated ? 2 * cols : cols;
  const InT* x = static_cast<const InT*>(p.x);
  int64_t c = oc;
  int h = 0;
  if (kBwd && Op::kGated && oc >= cols) {
    c = oc - cols;
    h = 1;
  }
  const float a = to_float(x[r * x_stride + c]);
  const float b = Op::kGated ? to_float(x[r * x_stride + cols + c]) : 0.0f;
  if constexpr (kBwd) {
    float d[2];
    act_backward<Op>(to_float(static_cast<const InT*>(p.grad)[r * cols + c]), a, b, p.act, d[0], d[1]);
    return d[h];
  } else {
    return act_forward<Op>(a, b, p.act);
  }
}

template <class Op, bool kBwd, typename InT> void mx_tile(const Mxfp8Params& p, int64_t out_cols, int64_t tile) {
  const int64_t r0 = tile * kMxBlock;
  const int64_t nr = std::min(kMxBlock, p.rows - r0);
  std::vector<float> v(size_t(kMxBlock * kChunk));
  float dsum[kChunk];
  for (int64_t c0 = 0; c0 < out_cols; c0 += kChunk) {
    const int64_t nc = std::min(kChunk, out_cols - c0);
    std::fill(dsum, dsum + kChunk, 0.0f);
    for (int64_t i = 0; i < nr; ++i) {
      for (int64_t k = 0; k < nc; ++k) {
        const float raw = mx_value<Op, kBwd, InT>(p, r0 + i, c0 + k);
        dsum[k] += raw;
        v[size_t(i * kChunk + k)] = round_to<InT>(raw);  // rnd_in before the block amax (SPEC §5.1)
      }
    }
    if (p.dbias_partial) std::copy(dsum, dsum + nc, p.dbias_partial + tile * out_cols + c0);
    if (p.row_data) {
      for (int64_t i = 0; i < nr; ++i) {
        for (int64_t b0 = 0; b0 < nc; b0 += kMxBlock) {
          const float* blk = &v[size_t(i * kChunk + b0)];
          float amax = 0.0f;
          for (int64_t k = 0; k < kMxBlock; ++k) amax = amax_update(amax, blk[k]);
          const uint8_t e = mx_block_code(amax, p.e4m3);
          const float m = e8m0_multiplier(e);
          p.row_scale[mx_row_scale_offset(r0 + i, (c0 + b0) / kMxBlock, out_cols, p.swizzled)] = e;
          uint8_t* dst = p.row_data + (r0 + i) * out_cols + c0 + b0;
          for (int64_t k = 0; k < kMxBlock; ++k) dst[k] = float_to_fp8(blk[k] * m, p.e4m3);
        }
      }
    }
    if (p.col_data) {
      for (int64_t k = 0; k < nc; ++k) {
        float amax = 0.0f;
        for (int64_t i = 0; i < nr; ++i) amax = amax_update(amax, v[size_t(i * kChunk + k)]);
        const uint8_t e = mx_block_code(amax, p.e4m3);
        const float m = e8m0_multiplier(e);
        p.col_scale[mx_col_scale_offset(tile, c0 + k, p.rows, out_cols, p.swizzled)] = e;
        for (int64_t i = 0; i < nr; ++i)
          p.col_data[(r0 + i) * out_cols + c0 + k] = float_to_fp8(v[size_t(i * kChunk + k)] * m, p.e4m3);
      }
    }
  }
}

template <class Op, bool kBwd>
void mx_dispatch(DType in_dtype, const Mxfp8Params& p, const ParallelFor& parallel_for) {
  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const int64_t out_cols = (kBwd && Op::kGated) ? 2 * p.cols : p.cols;
  const Mxfp8ScaleShapes s = mxfp8_scale_shapes(p.rows, out_cols);
  // Padding entries are zero; the real ones are overwritten below.
  if (p.row_data) std::memset(p.row_scale, 0, size_t(s.row_r * s.row_c));
  if (p.col_data) std::memset(p.col_scale, 0, size_t(s.col_r * s.col_c));
  const int64_t tiles = ceil_div(p.rows, kMxBlock);
  TE_SWITCH_IN_DTYPE(in_dtype, T, {
    parallel_for(tiles, [&](int64_t b0, int64_t b1) {
      for (int64_t t = b0; t < b1; ++t) mx_tile<Op, kBwd, T>(p, out_cols, t);
    });
  });
}

}  // namespace

void quantize_mxfp8_cpu(ActKind kind, bool backward, DType in_dtype, const Mxfp8Params& p,
                        const ParallelFor& parallel_for) {
  visit_activation(kind, backward, [&](auto op, auto bwd) {
    mx_dispatch<decltype(op), decltype(bwd)::value>(in_dtype, p, parallel_for);
  });
}

}  // namespace te
