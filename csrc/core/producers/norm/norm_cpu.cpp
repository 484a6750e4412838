// CPU kernels of LayerNorm / RMSNorm (norm.h): the summation order of norm.h's rule emulated lane by lane, so the
// statistics, outputs and gradients are those of the CUDA kernels bit for bit.
#include <algorithm>
#include <vector>

#include "norm.h"
#include "../../rules/dispatch.h"

namespace te {
namespace {

// Element i of a buffer of `dtype` (float32 / float16 / bfloat16) as FP32.
inline float load_as_float(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kFloat16: return to_float(static_cast<const fp16_t*>(p)[i]);
    case DType::kBFloat16: return to_float(static_cast<const bf16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}
inline void store_from_float(void* p, DType dtype, int64_t i, float v) {
  switch (dtype) {
    case DType::kFloat16: static_cast<fp16_t*>(p)[i] = from_float<fp16_t>(v); break;
    case DType::kBFloat16: static_cast<bf16_t*>(p)[i] = from_float<bf16_t>(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

// norm.h's row sum of term(0..h-1): lanes over strided chunks, then the pairwise tree. `lanes` is scratch of
// norm_lanes(h) floats.
template <class F> float row_sum(int64_t h, float* lanes, F&& term) {
  const int L = norm_lanes(h);
  for (int l = 0; l < L; ++l) {
    float s = 0.0f;
    for (int64_t c0 = int64_t(l) * kNormVec; c0 < h; c0 += int64_t(L) * kNormVec) {
      const int64_t c1 = std::min(h, c0 + kNormVec);
      for (int64_t i = c0; i < c1; ++i) s += term(i);
    }
    lanes[l] = s;
  }
  for (int off = 1; off < L; off *= 2) {
    for (int l = 0; l < L; l += 2 * off) lanes[l] = lanes[l] + lanes[l + off];
  }
  return lanes[0];
}

// gamma (FP32), fl(1 + gamma) when zero-centred, and beta (FP32; zeros without one).
struct Params32 {
  std::vector<float> g, b;
};
Params32 params32(const void* gamma, const void* beta, DType dt, int64_t h, bool zero_centered) {
  Params32 q;
  q.g.resize(static_cast<size_t>(h));
  q.b.assign(size_t(h), 0.0f);
  for (int64_t i = 0; i < h; ++i) {
    const float g = load_as_float(gamma, dt, i);
    q.g[size_t(i)] = zero_centered ? 1.0f + g : g;
    if (beta) q.b[size_t(i)] = load_as_float(beta, dt, i);
  }
  return q;
}

}  // namespace

void norm_fwd_cpu(const NormFwdParams& p, const ParallelFor& parallel_for) {
  const int64_t h = p.hidden;
  if (p.rows == 0 || h == 0) return;
  const Params32 q = params32(p.gamma, p.beta, p.gamma_dtype, h, p.zero_centered_gamma);
  const bool ln = p.kind == NormKind::kLayerNorm;
  const float hf = float(h);
  parallel_for(p.rows, [&](int64_t r0, int64_t r1) {
    std::vector<float> xr(static_cast<size_t>(h)), lanes(static_cast<size_t>(norm_lanes(h)));
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t i = 0; i < h; ++i) xr[size_t(i)] = load_as_float(p.x, p.x_dtype, r * h + i);
      float mu = 0.0f, rsigma;
      if (ln) {
        mu = norm_div(row_sum(h, lanes.data(), [&](int64_t i) { return xr[size_t(i)]; }), hf);
        const float var = norm_div(row_sum(h, lanes.data(), [&](int64_t i) {
                                     const float d = xr[size_t(i)] - mu;
                                     return d * d;
                                   }),
                                   hf);
        rsigma = norm_rsigma(var, p.eps);
        p.mu[r] = mu;
      } else {
        const float ms = norm_div(row_sum(h, lanes.data(), [&](int64_t i) { return xr[size_t(i)] * xr[size_t(i)]; }), hf);
        rsigma = norm_rsigma(ms, p.eps);
      }
      p.rsigma[r] = rsigma;
      for (int64_t i = 0; i < h; ++i) {
        float y;
        if (ln) {
          const float t = (xr[size_t(i)] - mu) * rsigma;
          y = t * q.g[size_t(i)] + q.b[size_t(i)];
        } else {
          const float t = xr[size_t(i)] * rsigma;
          y = t * q.g[size_t(i)];
        }
        store_from_float(p.y, p.out_dtype, r * h + i, y);
      }
    }
  });
}

void norm_bwd_cpu(const NormBwdParams& p, const ParallelFor& parallel_for) {
  const int64_t h = p.hidden, rows = p.rows;
  if (h == 0) return;
  const bool ln = p.kind == NormKind::kLayerNorm;
  const Params32 q = params32(p.gamma, nullptr, p.gamma_dtype, h, p.zero_centered_gamma);
  const int64_t rb = norm_bwd_rows(rows, h), blocks = norm_bwd_blocks(rows, h);
  const float hf = float(h);
  parallel_for(blocks, [&](int64_t b0, int64_t b1) {
    std::vector<float> xhat(static_cast<size_t>(h)), dyg(static_cast<size_t>(h)), dzr(static_cast<size_t>(h)), lanes(static_cast<size_t>(norm_lanes(h)));
    for (int64_t b = b0; b < b1; ++b) {
      float* pg = p.dgamma_part + b * h;
      float* pb = p.dbeta_part ? p.dbeta_part + b * h : nullptr;
      std::fill(pg, pg + h, 0.0f);
      if (pb) std::fill(pb, pb + h, 0.0f);
      for (int64_t r = b * rb; r < std::min(rows, (b + 1) * rb); ++r) {
        const float rs = p.rsigma[r];
        const float mu = ln ? p.mu[r] : 0.0f;
        for (int64_t i = 0; i < h; ++i) {
          const float x = load_as_float(p.x, p.x_dtype, r * h + i);
          const float dz = load_as_float(p.dz, p.x_dtype, r * h + i);
          xhat[size_t(i)] = ln ? (x - mu) * rs : x * rs;
          dzr[size_t(i)] = dz;
          dyg[size_t(i)] = dz * q.g[size_t(i)];
        }
        const float ma = ln ? norm_div(row_sum(h, lanes.data(), [&](int64_t i) { return dyg[size_t(i)]; }), hf) : 0.0f;
        const float mb =
            norm_div(row_sum(h, lanes.data(), [&](int64_t i) { return dyg[size_t(i)] * xhat[size_t(i)]; }), hf);
        for (int64_t i = 0; i < h; ++i) {
          const float inner = ln ? (dyg[size_t(i)] - ma) - xhat[size_t(i)] * mb : dyg[size_t(i)] - xhat[size_t(i)] * mb;
          store_from_float(p.dx, p.x_dtype, r * h + i, rs * inner);
          pg[i] += dzr[size_t(i)] * xhat[size_t(i)];
          if (pb) pb[i] += dzr[size_t(i)];
        }
      }
    }
  });
  // The partial rows reduced in norm.h's two levels per column (group sums in place of each group's first row),
  // rounded once.
  parallel_for(h, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      for (int64_t g = 0; g < norm_bwd_groups(blocks); ++g) {
        const float sg = norm_bwd_group_sum(p.dgamma_part, blocks, h, g, c);
        p.dgamma_part[g * kNormReduceGroup * h + c] = sg;
        if (p.dbeta_part) {
          const float sb = norm_bwd_group_sum(p.dbeta_part, blocks, h, g, c);
          p.dbeta_part[g * kNormReduceGroup * h + c] = sb;
        }
      }
      store_from_float(p.dgamma, p.gamma_dtype, c, norm_bwd_total(p.dgamma_part, blocks, h, c));
      if (p.dbeta) store_from_float(p.dbeta, p.gamma_dtype, c, norm_bwd_total(p.dbeta_part, blocks, h, c));
    }
  });
}

}  // namespace te
