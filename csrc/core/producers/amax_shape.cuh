// The amax pass by shape (act_amax_shape_kernel; kAmax of a unary forward op on bf16): candidates per monotone
// run of |f|, found once per functor on the host (amax_shape), and f evaluated only at those.
// Invariant: the result equals the per-element amax bit for bit; a functor with more than kAmaxMaxPeaks peaks, or
// |f(-0)| != |f(+0)|, is never given to this pass.
#pragma once

#include "../rules/cuda_utils.cuh"
#include "activation.h"

namespace te {
namespace act_cuda {

// ---- Amax pass by shape (kAmax, unary forward, bf16) ---------------------------------------------------------------
// Over the bf16 values in increasing order, g(x) = |f(x)| (NaN counted as -1, i.e. ignored) splits into maximal
// monotone runs. A rising run ends at a peak or is the last run; a falling run starts at a peak or is the first. So the
// largest g over a tensor is g at one of: its smallest x (first run falling), its largest x (last run rising), and for
// each peak t its largest x below t and its smallest x at or above t: each is an element of the tensor lying in the
// same run as the maximiser, on the maximiser's far side. The pass keeps these 2 + 2 * peaks candidates (packed bf16
// min/max, one compare per peak per pair of values) and evaluates f only at the block's candidates: a read-only
// stream with no tables and no functor calls, whose result equals the per-element amax bit for bit. The host finds
// the peaks once per functor by evaluating it at every bf16 value (amax_shape), and uses the pass only when there
// are at most kAmaxMaxPeaks of them.
constexpr int kAmaxMaxPeaks = 2;
struct AmaxShape {
  int peaks = -1;                     // < 0: this functor's |f| has too many runs; use the computed pass
  uint32_t peak2[kAmaxMaxPeaks] = {}; // peak bf16 bits in both halves
};
constexpr uint32_t kBf16NaN2 = 0x7FC07FC0u;  // "no candidate yet" in both halves: ignored by the min/max below

// Packed bf16 max (kMax) or min: a NaN half yields the other operand; and the per-half mask of a >= b (0 for NaN).
template <bool kMax> __device__ __forceinline__ uint32_t bf16x2_minmax(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t d;
  if constexpr (kMax) {
    asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  } else {
    asm("min.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  }
  return d;
#else
  uint32_t d = 0;
  for (int h = 0; h < 2; ++h) {
    const uint32_t ha = (a >> (16 * h)) & 0xFFFFu, hb = (b >> (16 * h)) & 0xFFFFu;
    const float fa = bits_float(ha << 16), fb = bits_float(hb << 16);
    const bool take_b = is_nan(fa) || (!is_nan(fb) && (kMax ? fb > fa : fb < fa));
    d |= (take_b ? hb : ha) << (16 * h);
  }
  return d;
#endif
}
__device__ __forceinline__ uint32_t bf16x2_max(uint32_t a, uint32_t b) { return bf16x2_minmax<true>(a, b); }
__device__ __forceinline__ uint32_t bf16x2_min(uint32_t a, uint32_t b) { return bf16x2_minmax<false>(a, b); }
__device__ __forceinline__ uint32_t bf16x2_ge_mask(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t d;
  asm("set.ge.u32.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  uint32_t d = 0;
  for (int h = 0; h < 2; ++h) {
    const float fa = bits_float(((a >> (16 * h)) & 0xFFFFu) << 16), fb = bits_float(((b >> (16 * h)) & 0xFFFFu) << 16);
    if (fa >= fb) d |= 0xFFFFu << (16 * h);
  }
  return d;
#endif
}
// Both halves folded into one (max or min), as a bf16 value.
__device__ __forceinline__ uint32_t bf16x2_fold(uint32_t a, bool take_max) {
  const uint32_t s = (a >> 16) | (a << 16);
  return take_max ? bf16x2_max(a, s) : bf16x2_min(a, s);
}

constexpr int kAmaxShapeThreads = 512;
constexpr int kAmaxShapeUnroll = 4;  // 16-byte loads in flight per thread

template <class F>
__global__ void __launch_bounds__(kAmaxShapeThreads)
act_amax_shape_kernel(const ActKernelParams p, uint32_t n_chunks, const AmaxShape shape) {
  constexpr int kCand = 2 + 2 * kAmaxMaxPeaks;  // [0] max, [1] min, then (below t_j: max, at/above t_j: min)
  __shared__ uint32_t red[kCand][kAmaxShapeThreads / 32];
  if (p.noop != nullptr && *p.noop == 1.0f) return;
  const uint4* x = static_cast<const uint4*>(p.x);
  uint32_t c[kCand];
#pragma unroll
  for (int k = 0; k < kCand; ++k) c[k] = kBf16NaN2;
  auto take_max = [](int k) { return k == 0 || (k >= 2 && k % 2 == 0); };
  const uint32_t per_step = uint32_t(kAmaxShapeThreads) * kAmaxShapeUnroll;
  for (uint32_t step = blockIdx.x * per_step; step < n_chunks; step += gridDim.x * per_step) {
    uint4 v[kAmaxShapeUnroll];
#pragma unroll
    for (int u = 0; u < kAmaxShapeUnroll; ++u) {
      const uint32_t ci = step + threadIdx.x + uint32_t(u) * kAmaxShapeThreads;
      v[u] = ci < n_chunks ? x[ci] : make_uint4(kBf16NaN2, kBf16NaN2, kBf16NaN2, kBf16NaN2);
    }
#pragma unroll
    for (int u = 0; u < kAmaxShapeUnroll; ++u) {
      const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        c[0] = bf16x2_max(c[0], w[i]);
        c[1] = bf16x2_min(c[1], w[i]);
#pragma unroll
        for (int j = 0; j < kAmaxMaxPeaks; ++j) {
          if (j < shape.peaks) {
            const uint32_t m = bf16x2_ge_mask(w[i], shape.peak2[j]);
            c[2 + 2 * j] = bf16x2_max(c[2 + 2 * j], (w[i] & ~m) | (kBf16NaN2 & m));
            c[3 + 2 * j] = bf16x2_min(c[3 + 2 * j], (w[i] & m) | (kBf16NaN2 & ~m));
          }
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kCand; ++k) {
    c[k] = bf16x2_fold(c[k], take_max(k));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const uint32_t other = __shfl_xor_sync(0xFFFFFFFFu, c[k], o);
      c[k] = take_max(k) ? bf16x2_max(c[k], other) : bf16x2_min(c[k], other);
    }
    if (threadIdx.x % 32 == 0) red[k][threadIdx.x / 32] = c[k];
  }
  __syncthreads();
  if (threadIdx.x < kCand) {
    const int k = int(threadIdx.x);
    uint32_t a = red[k][0];
    for (int i = 1; i < kAmaxShapeThreads / 32; ++i) a = take_max(k) ? bf16x2_max(a, red[k][i]) : bf16x2_min(a, red[k][i]);
    const float xv = to_float(bf16_t{uint16_t(a & 0xFFFFu)});
    const float g = is_nan(xv) ? 0.0f : amax_update(0.0f, F::fwd(xv, p.act));
    if (g > 0.0f) atomicMax(reinterpret_cast<int*>(p.amax), __float_as_int(g));
  }
}

// The peaks of |F::fwd| over the bf16 values (see act_amax_shape_kernel), found once per functor on the host by the
// same functor code the device runs; peaks = -1 when there are more than kAmaxMaxPeaks or |f(-0)| != |f(+0)|.
template <class F> AmaxShape find_amax_shape() {
  AmaxShape s;
  auto g = [](uint32_t bits) {
    const float v = F::fwd(to_float(bf16_t{uint16_t(bits)}), ActArgs{});
    return is_nan(v) ? -1.0f : amax_update(0.0f, v);
  };
  if (g(0x8000u) != g(0x0000u)) return s;
  int peaks = 0, dir = 0;
  uint32_t prev_bits = 0xFF80u;
  float prev = g(prev_bits);
  // -inf, ..., -0, then +0, ..., +inf: increasing values (NaNs skipped; -0 and +0 are equal and have equal g).
  for (uint32_t i = 1; i < 2u * 0x7F81u; ++i) {
    const uint32_t bits = i < 0x7F81u ? 0xFF80u - i : i - 0x7F81u;
    const float cur = g(bits);
    const int d = cur > prev ? 1 : (cur < prev ? -1 : 0);
    if (d != 0) {
      if (dir > 0 && d < 0) {
        if (peaks == kAmaxMaxPeaks) return AmaxShape{};
        s.peak2[peaks++] = prev_bits * 0x10001u;
      }
      dir = d;
    }
    prev = cur;
    prev_bits = bits;
  }
  s.peaks = peaks;
  return s;
}
template <class F> const AmaxShape& amax_shape() {
  static const AmaxShape s = find_amax_shape<F>();
  return s;
}

}  // namespace act_cuda
}  // namespace te
