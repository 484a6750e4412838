// CUDA kernels of LayerNorm / RMSNorm (norm.h): a row is held by norm_lanes(H) threads, each owning the chunks of
// norm.h's rule in registers (NC chunks per lane; NC = 0: read again from global memory, for long rows), summed in
// the rule's order and combined by an xor butterfly (inside a warp by shuffles, across the row's warps in shared
// memory), so every lane holds the rule's sum bit for bit. No FMA (the build passes -fmad=false), correctly rounded
// sqrt and division (norm_sqrt / norm_div).
#pragma once

#include <cuda_runtime.h>

#include "norm.h"
#include "../../formats/fp8/emitter.cuh"
#include "../../formats/mxfp8/emitter.cuh"
#include "../../rules/scaling.h"

namespace te {
namespace norm_cuda {

constexpr int kThreads = 256;

__device__ __forceinline__ void st_out(void* p, DType dt, int64_t i, float v) {
  if (dt == DType::kBFloat16) {
    static_cast<bf16_t*>(p)[i] = from_float<bf16_t>(v);
  } else if (dt == DType::kFloat16) {
    static_cast<fp16_t*>(p)[i] = from_float<fp16_t>(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

// The n (<= 8) values of a chunk stored at element `off` of a buffer of dtype dt (vec: one 16/32-byte store).
__device__ __forceinline__ void store_chunk(void* p, DType dt, int64_t off, const float (&v)[kNormVec], int n,
                                            bool vec) {
  if (dt == DType::kBFloat16) {
    act_cuda::store8(static_cast<bf16_t*>(p) + off, vec, n, v);
  } else if (dt == DType::kFloat16) {
    act_cuda::store8(static_cast<fp16_t*>(p) + off, vec, n, v);
  } else {
    act_cuda::store8(static_cast<float*>(p) + off, vec, n, v);
  }
}

// The chunk of kNormVec elements at element e0 of row `base` into v[0..8) (zeros past h). vec: 16-byte aligned
// chunks of whole vectors (h % 8 == 0, aligned base pointer).
template <typename T>
__device__ __forceinline__ void load_chunk(const void* base, int64_t e0, int64_t h, bool vec, float* v) {
  const T* p = static_cast<const T*>(base) + e0;
  if (vec) {
    if constexpr (sizeof(T) == 4) {
      const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
      v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
      const uint4 u = *reinterpret_cast<const uint4*>(p);
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[2 * j] = to_float(T{uint16_t(w[j] & 0xFFFFu)});
        v[2 * j + 1] = to_float(T{uint16_t(w[j] >> 16)});
      }
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kNormVec; ++j) v[j] = e0 + j < h ? to_float(p[j]) : 0.0f;
}

// The chunk of a parameter vector (gamma or beta, dtype dt) at element e0 into v[0..8): one vector load when `vec`
// (a whole, 16-byte aligned chunk), else element by element (zeros past h). One dtype switch per chunk, not per
// element: the kernels are instruction-bound, not memory-bound (benchmarks/NOTES.md, 2026-11-29).
__device__ __forceinline__ void load_param_chunk(const void* base, DType dt, int64_t e0, int64_t h, bool vec,
                                                 float* v) {
  if (dt == DType::kBFloat16) {
    load_chunk<bf16_t>(base, e0, h, vec, v);
  } else if (dt == DType::kFloat16) {
    load_chunk<fp16_t>(base, e0, h, vec, v);
  } else {
    load_chunk<float>(base, e0, h, vec, v);
  }
}

// gamma (as applied: 1 + gamma when zero-centred) and, for LayerNorm, beta of the chunk at e0.
__device__ __forceinline__ void load_affine(const void* gamma, const void* beta, DType dt, bool zero_centered,
                                            int64_t e0, int64_t h, bool vec, float (&g)[kNormVec],
                                            float (&b)[kNormVec]) {
  load_param_chunk(gamma, dt, e0, h, vec, g);
  if (zero_centered) {
#pragma unroll
    for (int j = 0; j < kNormVec; ++j) g[j] = 1.0f + g[j];
  }
  if (beta != nullptr) load_param_chunk(beta, dt, e0, h, vec, b);
}

__device__ __forceinline__ bool aligned16_dev(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// norm.h's combination of the lane sums s (one per thread of the row's `warps` warps, which start at warp
// `first_warp` of the block): the xor butterfly in the warp, then the pairwise tree over the warps' totals. `red`:
// shared scratch of one float per warp of the block; every thread of the block calls this (it synchronises).
__device__ __forceinline__ float row_reduce(float s, int warps, int first_warp, float* red) {
#pragma unroll
  for (int off = 1; off < 32; off *= 2) s = s + __shfl_xor_sync(0xFFFFFFFFu, s, off);
  if (warps == 1) return s;
  const int w = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) red[w] = s;
  __syncthreads();
  float t[kNormMaxWarps];
#pragma unroll
  for (int i = 0; i < kNormMaxWarps; ++i) t[i] = i < warps ? red[first_warp + i] : 0.0f;
#pragma unroll
  for (int off = 1; off < kNormMaxWarps; off *= 2) {
#pragma unroll
    for (int i = 0; i + off < kNormMaxWarps; i += 2 * off) {
      if (off < warps) t[i] = t[i] + t[i + off];
    }
  }
  __syncthreads();
  return t[0];
}

// What the forward kernel writes besides the statistics: y in p.out_dtype; per-tensor FP8 codes (fp8_mode 1
// delayed: amax of y accumulated into *p.amax; 2 current: the scale of *p.amax); only the amax of y (current
// scaling's first launch, nothing else written); the MXFP8 rowwise copy (p.y codes, p.mx_scale E8M0).
enum class FwdOut : int { kPlain, kFp8, kAmax, kMxRow };

// The MXFP8 emitter's view of the forward parameters (formats/mxfp8/emitter.cuh reads out, blk_scale, e4m3).
struct MxOut {
  void* out;
  uint8_t* blk_scale;
  bool e4m3;
};

// Forward: blockDim.x = kThreads; a row per group of L = norm_lanes(h) threads.
template <typename InT, int NC, FwdOut kOut>
__global__ void __launch_bounds__(kThreads, 3) fwd_kernel(NormFwdParams p, bool vec) {
  __shared__ float red[kThreads / 32];
  const int64_t h = p.hidden;
  const int warps = norm_warps(h);
  const int L = 32 * warps;
  const int group = threadIdx.x / L, lane = threadIdx.x % L;
  const int64_t row = int64_t(blockIdx.x) * (kThreads / L) + group;
  const bool active = row < p.rows;
  const int64_t base = active ? row * h : 0;
  const void* x = static_cast<const InT*>(p.x) + base;
  const int64_t step = int64_t(L) * kNormVec;
  const bool ln = p.kind == NormKind::kLayerNorm;
  const float hf = float(h);
  // The lane's chunks as raw input elements (converted at use: half the registers of FP32 for 16-bit input).
  act_cuda::Vec8<InT> raw[NC > 0 ? NC : 1];
  if constexpr (NC > 0) {
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int64_t e0 = int64_t(lane) * kNormVec + k * step;
      const int n = active && e0 < h ? (h - e0 < kNormVec ? int(h - e0) : kNormVec) : 0;
      if (n > 0) {
        raw[k] = act_cuda::load8(static_cast<const InT*>(x) + e0, vec, n);
      } else {
#pragma unroll
        for (int j = 0; j < kNormVec; ++j) raw[k].e[j] = from_float<InT>(0.0f);
      }
    }
  }
  // Sum over the lane's elements of f(value) in the rule's order.
  const auto lane_sum = [&](auto f) {
    float s = 0.0f;
    if constexpr (NC > 0) {
#pragma unroll
      for (int k = 0; k < NC; ++k) {
        const int64_t e0 = int64_t(lane) * kNormVec + k * step;
        if (e0 + kNormVec <= h) {  // a whole chunk: no per-element guard (the same sum)
#pragma unroll
          for (int j = 0; j < kNormVec; ++j) s += f(to_float(raw[k].e[j]));
        } else {
#pragma unroll
          for (int j = 0; j < kNormVec; ++j) {
            if (e0 + j < h) s += f(to_float(raw[k].e[j]));
          }
        }
      }
    } else if (active) {
      for (int64_t e0 = int64_t(lane) * kNormVec; e0 < h; e0 += step) {
        float c[kNormVec];
        load_chunk<InT>(x, e0, h, vec, c);
#pragma unroll
        for (int j = 0; j < kNormVec; ++j) {
          if (e0 + j < h) s += f(c[j]);
        }
      }
    }
    return s;
  };
  const int first_warp = group * warps;
  float mu = 0.0f, rsigma;
  if (ln) {
    mu = norm_div(row_reduce(lane_sum([](float a) { return a; }), warps, first_warp, red), hf);
    const float var = norm_div(row_reduce(lane_sum([mu](float a) {
                                            const float d = a - mu;
                                            return d * d;
                                          }),
                                          warps, first_warp, red),
                               hf);
    rsigma = norm_rsigma(var, p.eps);
  } else {
    const float ms = norm_div(row_reduce(lane_sum([](float a) { return a * a; }), warps, first_warp, red), hf);
    rsigma = norm_rsigma(ms, p.eps);
  }
  if (active && lane == 0 && kOut != FwdOut::kAmax) {
    if (ln) p.mu[row] = mu;
    p.rsigma[row] = rsigma;
  }
  const bool skip = kOut != FwdOut::kPlain && p.noop != nullptr && *p.noop == 1.0f;  // uniform over the grid
  if (kOut == FwdOut::kMxRow && skip) return;
  float scale = 1.0f;
  if constexpr (kOut == FwdOut::kFp8) {
    scale = p.fp8_mode == 1 ? *p.scale : current_scale(*p.amax, fp8_max(p.e4m3), p.amax_epsilon, p.force_pow2);
    if (!skip && blockIdx.x == 0 && threadIdx.x == 0) {
      *p.scale_inv = 1.0f / scale;
      if (p.amax_out != nullptr) *p.amax_out = *p.amax;
    }
  }
  const MxOut mx{p.y, p.mx_scale, p.e4m3};
  const bool vec_param = h % kNormVec == 0 && aligned16_dev(p.gamma) && (!ln || aligned16_dev(p.beta));
  float amax = 0.0f;
  // y of the chunk at e0 (v: its x values) and what the mode writes of it.
  const auto emit_chunk = [&](int64_t e0, const float* v) {
    const int n = h - e0 < kNormVec ? int(h - e0) : kNormVec;
    float g[kNormVec], b[kNormVec], y[kNormVec];
    load_affine(p.gamma, ln ? p.beta : nullptr, p.gamma_dtype, p.zero_centered_gamma, e0, h,
                vec_param && n == kNormVec, g, b);
    if (ln) {
#pragma unroll
      for (int j = 0; j < kNormVec; ++j) {
        const float t = (v[j] - mu) * rsigma;
        y[j] = t * g[j] + b[j];
      }
    } else {
#pragma unroll
      for (int j = 0; j < kNormVec; ++j) {
        const float t = v[j] * rsigma;
        y[j] = t * g[j];
      }
    }
    if constexpr (kOut == FwdOut::kAmax || kOut == FwdOut::kFp8) {
      if (kOut == FwdOut::kAmax || p.fp8_mode == 1) {
        for (int j = 0; j < n; ++j) amax = amax_update(amax, y[j]);
      }
    }
    if constexpr (kOut == FwdOut::kPlain) {
      store_chunk(p.y, p.out_dtype, base + e0, y, n, vec);
    } else if constexpr (kOut == FwdOut::kFp8) {
      if (skip) return;
      if (n == kNormVec && vec) {
        act_cuda::emit8_fp8<float, false>(y, p.y, base + e0, scale, p.e4m3);
      } else {
        for (int j = 0; j < n; ++j) static_cast<uint8_t*>(p.y)[base + e0 + j] = float_to_fp8(y[j] * scale, p.e4m3);
      }
    } else if constexpr (kOut == FwdOut::kMxRow) {
      act_cuda::emit8_mx_row<false>(y, mx, base + e0, mx_row_scale_offset(row, e0 / kMxBlock, h, p.mx_swizzled));
    }
  };
  if (active) {
    if constexpr (NC > 0) {
#pragma unroll
      for (int k = 0; k < NC; ++k) {
        const int64_t e0 = int64_t(lane) * kNormVec + k * step;
        if (e0 < h) {
          float c[kNormVec];
#pragma unroll
          for (int j = 0; j < kNormVec; ++j) c[j] = to_float(raw[k].e[j]);
          emit_chunk(e0, c);
        }
      }
    } else {
      for (int64_t e0 = int64_t(lane) * kNormVec; e0 < h; e0 += step) {
        float c[kNormVec];
        load_chunk<InT>(x, e0, h, vec, c);
        emit_chunk(e0, c);
      }
    }
  }
  if constexpr (kOut == FwdOut::kAmax) {
    act_cuda::block_amax_to_global<kThreads>(amax, red, p.amax);
  } else if constexpr (kOut == FwdOut::kFp8) {
    if (p.fp8_mode == 1 && !skip) act_cuda::block_amax_to_global<kThreads>(amax, red, p.amax);
  } else if constexpr (kOut == FwdOut::kMxRow) {
    act_cuda::mx_row_scale_padding(p.mx_scale, p.rows, h, p.mx_swizzled);
  }
}

// Backward: one block of L threads per partial row (norm_bwd_rows consecutive rows, in order); each thread keeps
// the dgamma / dbeta column sums of its own chunks (in registers; NC = 0: in the partial row itself).
template <typename InT, int NC> __global__ void __launch_bounds__(256, 2) bwd_kernel(NormBwdParams p, bool vec) {
  __shared__ float red[kNormMaxWarps];
  const int64_t h = p.hidden;
  const int warps = norm_warps(h);
  const int L = 32 * warps;
  const int lane = threadIdx.x;
  const int64_t rb = norm_bwd_rows(p.rows, h);
  const int64_t r0 = int64_t(blockIdx.x) * rb;
  const int64_t r1 = r0 + rb < p.rows ? r0 + rb : p.rows;
  const int64_t step = int64_t(L) * kNormVec;
  const bool ln = p.kind == NormKind::kLayerNorm;
  const float hf = float(h);
  const bool vec_param = h % kNormVec == 0 && aligned16_dev(p.gamma);
  float* pg = p.dgamma_part + int64_t(blockIdx.x) * h;
  float* pb = p.dbeta_part ? p.dbeta_part + int64_t(blockIdx.x) * h : nullptr;
  constexpr int kN = NC > 0 ? NC * kNormVec : 1;
  float ag[kN], ab[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) ag[i] = ab[i] = 0.0f;
  if constexpr (NC == 0) {
    for (int64_t e = int64_t(lane) * kNormVec; e < h; e += step) {
      for (int j = 0; j < kNormVec && e + j < h; ++j) {
        pg[e + j] = 0.0f;
        if (pb) pb[e + j] = 0.0f;
      }
    }
  }
  for (int64_t r = r0; r < r1; ++r) {
    const void* x = static_cast<const InT*>(p.x) + r * h;
    const void* dz = static_cast<const InT*>(p.dz) + r * h;
    const float rs = p.rsigma[r];
    const float mu = ln ? p.mu[r] : 0.0f;
    // Per element: xhat, dyg from x, dz and the applied gamma g.
    const auto terms = [&](float g, float xv, float dzv, float& xhat, float& dyg) {
      xhat = ln ? (xv - mu) * rs : xv * rs;
      dyg = dzv * g;
    };
    // The chunk at e0's applied gamma (one load per chunk).
    const auto gammas = [&](int64_t e0, float (&g)[kNormVec]) {
      float unused[kNormVec];
      load_affine(p.gamma, nullptr, p.gamma_dtype, p.zero_centered_gamma, e0, h, vec_param && e0 + kNormVec <= h, g,
                  unused);
    };
    act_cuda::Vec8<InT> xs[NC > 0 ? NC : 1], ds[NC > 0 ? NC : 1];
    float sa = 0.0f, sb = 0.0f;
    if constexpr (NC > 0) {
#pragma unroll
      for (int k = 0; k < NC; ++k) {
        const int64_t e0 = int64_t(lane) * kNormVec + k * step;
        if (e0 < h) {
          const int n = h - e0 < kNormVec ? int(h - e0) : kNormVec;
          xs[k] = act_cuda::load8(static_cast<const InT*>(x) + e0, vec, n);
          ds[k] = act_cuda::load8(static_cast<const InT*>(dz) + e0, vec, n);
        }
        float g[kNormVec];
        gammas(e0, g);
#pragma unroll
        for (int j = 0; j < kNormVec; ++j) {
          if (e0 + j < h) {
            float xhat, dyg;
            terms(g[j], to_float(xs[k].e[j]), to_float(ds[k].e[j]), xhat, dyg);
            sa += dyg;
            sb += dyg * xhat;
          }
        }
      }
    } else {
      for (int64_t e0 = int64_t(lane) * kNormVec; e0 < h; e0 += step) {
        float cx[kNormVec], cd[kNormVec];
        load_chunk<InT>(x, e0, h, vec, cx);
        load_chunk<InT>(dz, e0, h, vec, cd);
        float g[kNormVec];
        gammas(e0, g);
        for (int j = 0; j < kNormVec && e0 + j < h; ++j) {
          float xhat, dyg;
          terms(g[j], cx[j], cd[j], xhat, dyg);
          sa += dyg;
          sb += dyg * xhat;
        }
      }
    }
    const float ma = ln ? norm_div(row_reduce(sa, warps, 0, red), hf) : 0.0f;
    const float mb = norm_div(row_reduce(sb, warps, 0, red), hf);
    const auto out = [&](float g, float xv, float dzv, float& accg, float& accb) {
      float xhat, dyg;
      terms(g, xv, dzv, xhat, dyg);
      const float inner = ln ? (dyg - ma) - xhat * mb : dyg - xhat * mb;
      accg += dzv * xhat;
      accb += dzv;
      return rs * inner;
    };
    if constexpr (NC > 0) {
#pragma unroll
      for (int k = 0; k < NC; ++k) {
        const int64_t e0 = int64_t(lane) * kNormVec + k * step;
        if (e0 < h) {
          float dx[kNormVec], g[kNormVec];
          gammas(e0, g);
#pragma unroll
          for (int j = 0; j < kNormVec; ++j) {
            const int i = k * kNormVec + j;
            dx[j] = e0 + j < h ? out(g[j], to_float(xs[k].e[j]), to_float(ds[k].e[j]), ag[i], ab[i]) : 0.0f;
          }
          store_chunk(p.dx, p.x_dtype, r * h + e0, dx, h - e0 < kNormVec ? int(h - e0) : kNormVec, vec);
        }
      }
    } else {
      for (int64_t e0 = int64_t(lane) * kNormVec; e0 < h; e0 += step) {
        float cx[kNormVec], cd[kNormVec];
        load_chunk<InT>(x, e0, h, vec, cx);
        load_chunk<InT>(dz, e0, h, vec, cd);
        float dx[kNormVec] = {}, g[kNormVec];
        gammas(e0, g);
        for (int j = 0; j < kNormVec && e0 + j < h; ++j) {
          float accg = pg[e0 + j], accb = pb ? pb[e0 + j] : 0.0f;
          dx[j] = out(g[j], cx[j], cd[j], accg, accb);
          pg[e0 + j] = accg;
          if (pb) pb[e0 + j] = accb;
        }
        store_chunk(p.dx, p.x_dtype, r * h + e0, dx, h - e0 < kNormVec ? int(h - e0) : kNormVec, vec);
      }
    }
  }
  if constexpr (NC > 0) {
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int64_t e0 = int64_t(lane) * kNormVec + k * step;
#pragma unroll
      for (int j = 0; j < kNormVec; ++j) {
        if (e0 + j < h) {
          pg[e0 + j] = ag[k * kNormVec + j];
          if (pb) pb[e0 + j] = ab[k * kNormVec + j];
        }
      }
    }
  }
}

// The partial rows added in increasing order per column, rounded once to gamma's dtype.
__global__ void bwd_reduce_kernel(NormBwdParams p, int64_t blocks) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.hidden) return;
  float sg = 0.0f, sb = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) {
    sg += p.dgamma_part[b * p.hidden + c];
    if (p.dbeta_part) sb += p.dbeta_part[b * p.hidden + c];
  }
  st_out(p.dgamma, p.gamma_dtype, c, sg);
  if (p.dbeta) st_out(p.dbeta, p.gamma_dtype, c, sb);
}

}  // namespace norm_cuda
}  // namespace te
