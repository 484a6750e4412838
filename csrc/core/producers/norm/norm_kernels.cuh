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
// What the forward kernel writes besides the statistics: y in p.out_dtype; per-tensor FP8 codes (fp8_mode 1
// delayed: amax of y accumulated into *p.amax; 2 current: the scale of *p.amax); only the amax of y (current
// scaling's first launch, nothing else written); the MXFP8 rowwise copy (p.y codes, p.mx_scale E8M0).
enum class FwdOut : int { kPlain, kFp8, kAmax, kMxRow };

// Blocks per SM the forward kernel is compiled for (its register budget): 2 (128 registers) where the next row
// group's chunks are prefetched into registers (the plain output), else 4 (64). Measured with tools/norm_probe.cu on
// the H200 (benchmarks/NOTES.md, 2026-11-29): the plain output gained 1.2-1.6x from the prefetch; with the FP8 and
// MXFP8 emitters' registers on top it spilled (3 blocks) or fell to 2 blocks a SM and lost 5-35 %.
// The quantized outputs' choice is a macro so that tools/norm_probe.cu can time the others.
#ifndef TE_NORM_FWD_Q_PREFETCH
#define TE_NORM_FWD_Q_PREFETCH 0
#endif
#ifndef TE_NORM_FWD_Q_MIN_BLOCKS
#define TE_NORM_FWD_Q_MIN_BLOCKS 3
#endif
template <FwdOut kOut> constexpr bool fwd_prefetch() { return kOut == FwdOut::kPlain || TE_NORM_FWD_Q_PREFETCH; }
template <FwdOut kOut> constexpr int fwd_min_blocks() {
  return kOut == FwdOut::kPlain ? 2 : TE_NORM_FWD_Q_MIN_BLOCKS;
}

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
// A whole aligned chunk goes out in packed 16-byte stores that the compiler may order freely against the loads
// (store8_packed): written as plain stores, the next chunk's gamma load waited behind this chunk's store.
template <typename T> __device__ __forceinline__ void store_chunk_t(T* p, int n, bool vec, const float (&v)[kNormVec]) {
  if (vec && n == kNormVec) {
    act_cuda::store8_packed(p, v);
  } else {
    act_cuda::store8(p, vec, n, v);
  }
}
__device__ __forceinline__ void store_chunk(void* p, DType dt, int64_t off, const float (&v)[kNormVec], int n,
                                            bool vec) {
  if (dt == DType::kBFloat16) {
    store_chunk_t(static_cast<bf16_t*>(p) + off, n, vec, v);
  } else if (dt == DType::kFloat16) {
    store_chunk_t(static_cast<fp16_t*>(p) + off, n, vec, v);
  } else {
    store_chunk_t(static_cast<float*>(p) + off, n, vec, v);
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

// The MXFP8 emitter's view of the forward parameters (formats/mxfp8/emitter.cuh reads out, blk_scale, e4m3).
struct MxOut {
  void* out;
  uint8_t* blk_scale;
  bool e4m3;
};

// Shared memory of the staged parameters (FP32 gamma as applied, then beta): used when it fits in this many bytes,
// else every chunk reads gamma / beta from global memory.
constexpr int kNormStageBytes = 64 * 1024;
TE_HD int64_t norm_stage_bytes(int64_t h, bool layernorm) { return (layernorm ? 2 : 1) * h * int64_t(sizeof(float)); }

__device__ __forceinline__ float param_at(const void* base, DType dt, int64_t i) {
  if (dt == DType::kBFloat16) return to_float(static_cast<const bf16_t*>(base)[i]);
  if (dt == DType::kFloat16) return to_float(static_cast<const fp16_t*>(base)[i]);
  return static_cast<const float*>(base)[i];
}

// Stages gamma (as applied) and, when bs is given, beta into shared memory: threads t, t + stride, ... of the block.
__device__ __forceinline__ void stage_params(float* gs, float* bs, const void* gamma, const void* beta, DType dt,
                                             bool zero_centered, int64_t h, int t, int stride) {
#pragma unroll 4
  for (int64_t i = t; i < h; i += stride) {
    const float gv = param_at(gamma, dt, i);
    gs[i] = zero_centered ? 1.0f + gv : gv;
    if (bs != nullptr) bs[i] = param_at(beta, dt, i);
  }
}

// The staged gamma (and beta) of the chunk at e0 (n valid values; `vec`: 16-byte aligned in shared memory).
__device__ __forceinline__ void staged_affine(const float* gs, const float* bs, int64_t e0, int n, bool vec,
                                              float (&g)[kNormVec], float (&b)[kNormVec]) {
  if (vec && n == kNormVec) {
    const float4* g4 = reinterpret_cast<const float4*>(gs + e0);
    const float4 g0 = g4[0], g1 = g4[1];
    g[0] = g0.x; g[1] = g0.y; g[2] = g0.z; g[3] = g0.w; g[4] = g1.x; g[5] = g1.y; g[6] = g1.z; g[7] = g1.w;
    if (bs != nullptr) {
      const float4* b4 = reinterpret_cast<const float4*>(bs + e0);
      const float4 b0 = b4[0], b1 = b4[1];
      b[0] = b0.x; b[1] = b0.y; b[2] = b0.z; b[3] = b0.w; b[4] = b1.x; b[5] = b1.y; b[6] = b1.z; b[7] = b1.w;
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kNormVec; ++j) {
    g[j] = j < n ? gs[e0 + j] : 0.0f;
    if (bs != nullptr) b[j] = j < n ? bs[e0 + j] : 0.0f;
  }
}

// Forward: blockDim.x = kThreads, a row per group of L = norm_lanes(h) threads; a resident grid walks the row groups
// (block b: groups b, b + gridDim.x, ...), so gamma / beta are staged in shared memory once per block (`staged`,
// kNormStageBytes of dynamic shared memory at most) and, with the chunks in registers (NC > 0), the next group's
// loads are issued before this group's outputs are computed.
// kFull: every lane holds exactly NC whole chunks (h == NC · L · kNormVec), x, y, gamma, beta are 16-byte aligned
// and the parameters are staged: the element guards, the partial-chunk paths and the global parameter loads compile
// away (the same sums, the same bytes).
template <typename InT, int NC, FwdOut kOut, bool kFull>
__global__ void __launch_bounds__(kThreads, fwd_min_blocks<kOut>()) fwd_kernel(NormFwdParams p, bool vec,
                                                                                 bool staged) {
  static_assert(!kFull || NC > 0, "kFull needs the chunks in registers");
  extern __shared__ float4 stage_s[];
  __shared__ float red[kThreads / 32];
  const int64_t h = p.hidden;
  const int warps = norm_warps(h);
  const int L = 32 * warps;
  const int rows_per_cta = kThreads / L;
  const int group = threadIdx.x / L, lane = threadIdx.x % L;
  const int64_t groups = (p.rows + rows_per_cta - 1) / rows_per_cta;
  const int64_t step = int64_t(L) * kNormVec;
  const bool ln = p.kind == NormKind::kLayerNorm;
  const float hf = float(h);
  if (kFull) vec = true;
  using Raw = act_cuda::Vec8<InT>;
  // The lane's chunks of `row` as raw input elements (converted at use: half the registers of FP32 for 16-bit
  // input); zeros for absent chunks and rows past the end.
  const auto load_row = [&](Raw (&r)[NC > 0 ? NC : 1], int64_t row) {
    if constexpr (NC > 0) {
      const bool active = row < p.rows;
      const InT* x = static_cast<const InT*>(p.x) + (active ? row * h : 0);
#pragma unroll
      for (int k = 0; k < NC; ++k) {
        const int64_t e0 = int64_t(lane) * kNormVec + k * step;
        const int n = kFull ? kNormVec : active && e0 < h ? (h - e0 < kNormVec ? int(h - e0) : kNormVec) : 0;
        if (kFull || n > 0) {
          r[k] = act_cuda::load8_stream(x + e0, vec, n);
        } else {
#pragma unroll
          for (int j = 0; j < kNormVec; ++j) r[k].e[j] = from_float<InT>(0.0f);
        }
      }
    }
  };
  Raw raw[NC > 0 ? NC : 1];
  int64_t g0 = blockIdx.x;
  load_row(raw, g0 * rows_per_cta + group);
  float* gs = reinterpret_cast<float*>(stage_s);
  float* bs = ln ? gs + h : nullptr;
  if (staged) {  // overlaps the first loads
    stage_params(gs, bs, p.gamma, p.beta, p.gamma_dtype, p.zero_centered_gamma, h, threadIdx.x, kThreads);
    __syncthreads();
  }
  const bool skip = kOut != FwdOut::kPlain && p.noop != nullptr && *p.noop == 1.0f;  // uniform over the grid
  float scale = 1.0f;
  if constexpr (kOut == FwdOut::kFp8) {
    scale = p.fp8_mode == 1 ? *p.scale : current_scale(*p.amax, fp8_max(p.e4m3), p.amax_epsilon, p.force_pow2);
    if (!skip && blockIdx.x == 0 && threadIdx.x == 0) {
      *p.scale_inv = 1.0f / scale;
      if (p.amax_out != nullptr) *p.amax_out = *p.amax;
    }
  }
  const MxOut mx{p.y, p.mx_scale, p.e4m3};
  const bool vec_param = kFull || (h % kNormVec == 0 && aligned16_dev(p.gamma) && (!ln || aligned16_dev(p.beta)));
  const bool vec_stage = kFull || h % 4 == 0;
  float amax = 0.0f;
  const int first_warp = group * warps;
  int64_t next_row = -1;  // without the prefetch: the row whose chunks the loop's next step loads first
  for (int64_t gi = g0; gi < groups; gi += gridDim.x) {
    if (next_row >= 0) load_row(raw, next_row);
    const int64_t row = gi * rows_per_cta + group;
    const bool active = row < p.rows;
    const int64_t base = active ? row * h : 0;
    const void* x = static_cast<const InT*>(p.x) + base;
    // Sum over the lane's elements of f(value) in the rule's order.
    const auto lane_sum = [&](auto f) {
      float s = 0.0f;
      if constexpr (NC > 0) {
#pragma unroll
        for (int k = 0; k < NC; ++k) {
          const int64_t e0 = int64_t(lane) * kNormVec + k * step;
          if (kFull || e0 + kNormVec <= h) {  // a whole chunk: no per-element guard (the same sum)
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
    Raw cur[NC > 0 ? NC : 1];
#pragma unroll
    for (int k = 0; k < (NC > 0 ? NC : 1); ++k) cur[k] = raw[k];
    if (NC > 0 && gi + gridDim.x < groups) {
      if (fwd_prefetch<kOut>()) {
        load_row(raw, (gi + gridDim.x) * rows_per_cta + group);
      } else {
        next_row = (gi + gridDim.x) * rows_per_cta + group;
      }
    }
    if (!active || (kOut != FwdOut::kPlain && kOut != FwdOut::kAmax && skip)) continue;
    // y of the chunk at e0 (v: its x values) and what the mode writes of it.
    const auto emit_chunk = [&](int64_t e0, const float* v) {
      const int n = kFull || h - e0 >= kNormVec ? kNormVec : int(h - e0);
      float g[kNormVec], b[kNormVec], y[kNormVec];
      if (kFull || staged) {  // kFull kernels are launched staged only
        staged_affine(gs, bs, e0, n, vec_stage, g, b);
      } else {
        load_affine(p.gamma, ln ? p.beta : nullptr, p.gamma_dtype, p.zero_centered_gamma, e0, h,
                    vec_param && n == kNormVec, g, b);
      }
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
        if (n == kNormVec && vec) {
          act_cuda::emit8_fp8<float, false>(y, p.y, base + e0, scale, p.e4m3);
        } else {
          for (int j = 0; j < n; ++j) static_cast<uint8_t*>(p.y)[base + e0 + j] = float_to_fp8(y[j] * scale, p.e4m3);
        }
      } else if constexpr (kOut == FwdOut::kMxRow) {
        act_cuda::emit8_mx_row<false>(y, mx, base + e0, mx_row_scale_offset(row, e0 / kMxBlock, h, p.mx_swizzled));
      }
    };
    if constexpr (NC > 0) {
#pragma unroll
      for (int k = 0; k < NC; ++k) {
        const int64_t e0 = int64_t(lane) * kNormVec + k * step;
        if (kFull || e0 < h) {
          float c[kNormVec];
#pragma unroll
          for (int j = 0; j < kNormVec; ++j) c[j] = to_float(cur[k].e[j]);
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
    if (!skip) act_cuda::mx_row_scale_padding(p.mx_scale, p.rows, h, p.mx_swizzled);
  }
}

// Backward: one block of L threads per partial row (norm_bwd_rows consecutive rows, in order). With the chunks in
// registers (NC > 0) each thread keeps the dgamma / dbeta column sums of its own chunks in shared memory (its own
// slots: no synchronisation; registers would spill), norm_bwd_smem bytes; NC = 0: in the partial row itself.
// With NC > 0 the applied gamma is staged in shared memory too (after the sums): h floats; and, with whole 16-byte
// chunks (`prefetch`), each thread's x and dz chunks of the next row: 2 * nc * 16 bytes a thread, written by
// cp.async while the current row is reduced (its own slots: no synchronisation).
TE_HD int64_t norm_bwd_smem(int nc, int lanes, bool layernorm, int64_t h, bool prefetch = false) {
  if (nc == 0) return 0;
  const int64_t sums = ((layernorm ? 2 : 1) * int64_t(nc) * kNormVec * lanes + h) * int64_t(sizeof(float));
  return sums + (prefetch ? 2 * int64_t(nc) * lanes * 16 : 0);
}

__device__ __forceinline__ void get8(const float4& a, const float4& b, float (&v)[kNormVec]) {
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ __forceinline__ void put8(const float (&v)[kNormVec], float4& a, float4& b) {
  a = make_float4(v[0], v[1], v[2], v[3]);
  b = make_float4(v[4], v[5], v[6], v[7]);
}

template <typename InT, int NC> __global__ void __launch_bounds__(256, 2) bwd_kernel(NormBwdParams p, bool vec) {
  extern __shared__ float4 acc_s[];  // [(ln ? 2 : 1) * NC * 2][L] float4: chunk k's column sums, halves q = 0, 1
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
  // The float4 slot of half q of chunk k's column sums (dgamma; + NC * 2 * L: dbeta).
  const auto slot = [&](int k, int q, bool beta) -> float4& {
    return acc_s[((beta ? NC : 0) + k) * 2 * L + q * L + lane];
  };
  float* gs = reinterpret_cast<float*>(acc_s + (pb ? 2 : 1) * NC * 2 * L);  // NC > 0: the staged applied gamma
  // vec (whole, aligned chunks) of a 2-byte dtype with NC > 0: the next row's chunks are prefetched into this
  // thread's stage slots, [x / dz][NC][L] 16-byte slots after the staged gamma (h % 8 == 0 keeps them 16-byte
  // aligned).
  uint4* stage = reinterpret_cast<uint4*>(gs + h);
  const bool pf = NC > 0 && vec && sizeof(InT) == 2;  // a 2-byte chunk of 8 is one 16-byte cp.async
  const auto prefetch_row = [&](int64_t row) {
#pragma unroll
    for (int k = 0; k < (NC > 0 ? NC : 1); ++k) {
      const int64_t e0 = int64_t(lane) * kNormVec + k * step;
      if (e0 < h) {
        act_cuda::cp_async16(&stage[k * L + lane], static_cast<const InT*>(p.x) + row * h + e0);
        act_cuda::cp_async16(&stage[(NC + k) * L + lane], static_cast<const InT*>(p.dz) + row * h + e0);
      }
    }
    act_cuda::cp_async_commit();
  };
  if (pf && r0 < r1) prefetch_row(r0);
  if constexpr (NC > 0) {
    stage_params(gs, nullptr, p.gamma, nullptr, p.gamma_dtype, p.zero_centered_gamma, h, lane, L);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < NC; ++k) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        slot(k, q, false) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (pb) slot(k, q, true) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
  } else {
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
    // The chunk at e0's applied gamma (one load per chunk; staged in shared memory when NC > 0).
    const auto gammas = [&](int64_t e0, float (&g)[kNormVec]) {
      float unused[kNormVec];
      if constexpr (NC > 0) {
        staged_affine(gs, nullptr, e0, h - e0 < kNormVec ? int(h - e0) : kNormVec, h % 4 == 0, g, unused);
      } else {
        load_affine(p.gamma, nullptr, p.gamma_dtype, p.zero_centered_gamma, e0, h, vec_param && e0 + kNormVec <= h,
                    g, unused);
      }
    };
    act_cuda::Vec8<InT> xs[NC > 0 ? NC : 1], ds[NC > 0 ? NC : 1];
    float sa = 0.0f, sb = 0.0f;
    if constexpr (NC > 0) {
      if (pf) act_cuda::cp_async_wait<0>();  // this row's chunks, prefetched into this thread's slots
#pragma unroll
      for (int k = 0; k < NC; ++k) {
        const int64_t e0 = int64_t(lane) * kNormVec + k * step;
        if (e0 < h) {
          const int n = h - e0 < kNormVec ? int(h - e0) : kNormVec;
          if (pf) {
            xs[k] = *reinterpret_cast<const act_cuda::Vec8<InT>*>(&stage[k * L + lane]);
            ds[k] = *reinterpret_cast<const act_cuda::Vec8<InT>*>(&stage[(NC + k) * L + lane]);
          } else {
            xs[k] = act_cuda::load8_stream(static_cast<const InT*>(x) + e0, vec, n);
            ds[k] = act_cuda::load8_stream(static_cast<const InT*>(dz) + e0, vec, n);
          }
        }
      }
#pragma unroll
      for (int k = 0; k < NC; ++k) {
        const int64_t e0 = int64_t(lane) * kNormVec + k * step;
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
      // The sums consumed the stage's values (in registers from here on): the next row's copies may land there while
      // this one is reduced and written.
      if (pf && r + 1 < r1) prefetch_row(r + 1);
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
          float dx[kNormVec], g[kNormVec], ag[kNormVec], ab[kNormVec] = {};
          gammas(e0, g);
          get8(slot(k, 0, false), slot(k, 1, false), ag);
          if (pb) get8(slot(k, 0, true), slot(k, 1, true), ab);
#pragma unroll
          for (int j = 0; j < kNormVec; ++j) {
            dx[j] = e0 + j < h ? out(g[j], to_float(xs[k].e[j]), to_float(ds[k].e[j]), ag[j], ab[j]) : 0.0f;
          }
          put8(ag, slot(k, 0, false), slot(k, 1, false));
          if (pb) put8(ab, slot(k, 0, true), slot(k, 1, true));
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
      float ag[kNormVec], ab[kNormVec] = {};
      get8(slot(k, 0, false), slot(k, 1, false), ag);
      if (pb) get8(slot(k, 0, true), slot(k, 1, true), ab);
#pragma unroll
      for (int j = 0; j < kNormVec; ++j) {
        if (e0 + j < h) {
          pg[e0 + j] = ag[j];
          if (pb) pb[e0 + j] = ab[j];
        }
      }
    }
  }
}

}  // namespace norm_cuda
}  // namespace te
