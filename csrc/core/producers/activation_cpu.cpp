// CPU kernels of the activation / cast family. Same functors, rounding and encoders as the CUDA kernels, so
// bytes, scales and amaxes are identical; dbias partials cover the same row blocks as on the GPU.
#include <algorithm>
#include <vector>

#include "activation.h"

namespace te {
namespace {

template <class Op, bool kBwd, typename InT>
void act_rows(const ActKernelParams& p, int64_t blk, int64_t block_rows, float scale, float* amax_out) {
  constexpr bool kGated = Op::kGated;
  constexpr bool kTwoOut = kBwd && kGated;
  const int64_t rows = p.rows, cols = p.cols;
  const int64_t x_stride = kGated ? 2 * cols : cols;
  const int64_t o_cols = kTwoOut ? 2 * cols : cols;
  const InT* x = static_cast<const InT*>(p.x);
  const InT* g = static_cast<const InT*>(p.grad);
  const bool fp8 = mode_writes_fp8(p.mode);
  const bool plain = p.mode == ScaleMode::kPlain;
  float amax = 0.0f;
  float* dbias = p.dbias_partial ? p.dbias_partial + blk * o_cols : nullptr;
  const int64_t m0 = blk * block_rows, m1 = std::min(rows, m0 + block_rows);
  for (int64_t r = m0; r < m1; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float a = to_float(x[r * x_stride + c]);
      const float b = kGated ? to_float(x[r * x_stride + cols + c]) : 0.0f;
      float v[2];
      if constexpr (kBwd) {
        act_backward<Op>(to_float(g[r * cols + c]), a, b, p.act, v[0], v[1]);
      } else {
        v[0] = act_forward<Op>(a, b, p.act);
      }
      for (int h = 0; h < (kTwoOut ? 2 : 1); ++h) {
        const int64_t oc = c + h * cols;
        if (mode_tracks_amax(p.mode)) amax = amax_update(amax, v[h]);
        if (dbias) dbias[oc] += v[h];
        if (plain) {
          static_cast<InT*>(p.out)[r * o_cols + oc] = from_float<InT>(v[h]);
        } else if (fp8) {
          const uint8_t code = float_to_fp8(fp8_scaled_value<InT>(v[h], p.mode, scale), p.e4m3);
          if (p.out) static_cast<uint8_t*>(p.out)[r * o_cols + oc] = code;
          if (p.out_t) p.out_t[oc * rows + r] = code;
        }
      }
    }
  }
  *amax_out = amax;
}

template <class Op, bool kBwd>
void act_dispatch_dtype(DType in_dtype, const ActKernelParams& p, const ParallelFor& parallel_for) {
  if (p.mode == ScaleMode::kNvfp4) core_fail("activation_cpu: the fused NVFP4 mode is a CUDA path (the CPU casts a temporary)");
  if (p.mode == ScaleMode::kCurrent && p.amax_in_call) {
    // Current scaling in one call (ActKernelParams::amax_in_call): zero the amax, the amax pass, the cast.
    *p.amax = 0.0f;
    act_dispatch_dtype<Op, kBwd>(in_dtype, amax_pass_params(p), parallel_for);
    ActKernelParams pc = p;
    pc.amax_in_call = false;
    return act_dispatch_dtype<Op, kBwd>(in_dtype, pc, parallel_for);
  }
  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const float scale = mode_writes_fp8(p.mode) ? mode_scale(p) : 1.0f;
  // Chunks of rows; with dbias, exactly the partial rows of act_dbias_rows.
  const int64_t block_rows = p.dbias_partial ? act_dbias_rows(p.rows, p.cols) : kActBlockRows;
  const int64_t n_blocks = p.dbias_partial ? act_dbias_blocks(p.rows, p.cols)
                                           : std::max<int64_t>(1, (p.rows + block_rows - 1) / block_rows);
  const int64_t o_cols = (kBwd && Op::kGated) ? 2 * p.cols : p.cols;
  if (p.dbias_partial) std::fill(p.dbias_partial, p.dbias_partial + n_blocks * o_cols, 0.0f);
  std::vector<float> amax_blocks(size_t(n_blocks), 0.0f);
  TE_SWITCH_IN_DTYPE(in_dtype, T, {
    parallel_for(n_blocks, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) act_rows<Op, kBwd, T>(p, b, block_rows, scale, &amax_blocks[size_t(b)]);
    });
  });
  if (mode_tracks_amax(p.mode)) {
    float amax = *p.amax;
    for (float a : amax_blocks) amax = amax_update(amax, a);
    *p.amax = amax;
  }
  if (mode_writes_fp8(p.mode)) *p.scale_inv = 1.0f / scale;
}

}  // namespace

void activation_cpu(ActKind kind, bool backward, DType in_dtype, const ActKernelParams& p,
                    const ParallelFor& parallel_for) {
  visit_activation(kind, backward, [&](auto op, auto bwd) {
    act_dispatch_dtype<decltype(op), decltype(bwd)::value>(in_dtype, p, parallel_for);
  });
}

void dbias_reduce_cpu(const float* partial, int64_t partial_rows, int64_t cols, DType out_dtype, void* out) {
  TE_SWITCH_IN_DTYPE(out_dtype, T, {
    for (int64_t c = 0; c < cols; ++c) {
      float s = 0.0f;
      for (int64_t r = 0; r < partial_rows; ++r) s += partial[r * cols + c];
      static_cast<T*>(out)[c] = from_float<T>(s);
    }
  });
}

}  // namespace te
