// Our own FP32 exp and sigmoid, compiled identically for host and device (SPEC §2 "CPU/CUDA bit-parity"):
// IEEE mul/add/div/sqrt and explicit fmaf only (the build turns FMA contraction off on both sides), no libm,
// no CUDA intrinsics. exp is within 1 ulp on its domain, exp(0) = 1 exactly, overflow/underflow points are
// fixed by the clamp below, NaN propagates.
#pragma once

#include <cmath>

#include "common.h"

namespace te {

TE_HD float fma_f32(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fmaf(a, b, c);
#endif
}

// e^y. y is clamped to [-87, 88] (NaN passes through the comparisons) so that 2^n stays a normal float:
// e^88 = 1.65e38 and e^-87 = 1.65e-38 bound the results.
TE_HD float exp_f32(float y) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kMagic = 12582912.0f;           // 1.5 * 2^23: adding it rounds to an integer (RNE)
  constexpr float kLn2Hi = 0.693145751953125f;    // ln2 split: hi has 16 significant bits, so n*hi is exact
  constexpr float kLn2Lo = 1.428606765330187045e-06f;
  // Degree-6 minimax fit of e^r on |r| <= 0.354 (relative error 2.3e-9 before rounding).
  constexpr float kC2 = 0.4999999403953552f, kC3 = 0.16666412353515625f, kC4 = 0.0416681133210659f,
                  kC5 = 0.008375789038836956f, kC6 = 0.0013841750333085656f;
  y = y > 88.0f ? 88.0f : y;
  y = y < -87.0f ? -87.0f : y;
  const float t = fma_f32(y, kLog2e, kMagic);
  const float n = t - kMagic;
  float r = fma_f32(n, -kLn2Hi, y);
  r = fma_f32(n, -kLn2Lo, r);
  float p = fma_f32(kC6, r, kC5);
  p = fma_f32(p, r, kC4);
  p = fma_f32(p, r, kC3);
  p = fma_f32(p, r, kC2);
  p = fma_f32(p, r, 1.0f);
  p = fma_f32(p, r, 1.0f);
  // t's mantissa holds 0x400000 + n; (n + 127) << 23 is 2^n.
  const float two_n = bits_float((float_bits(t) - 0x4B3FFF81u) << 23);
  return p * two_n;
}

// sigma(z) = fl(1 / (1 + exp(-z))) (SPEC §3.2), and 1 - sigma(z) computed without cancellation as
// exp(-z) * sigma(z).
struct SigmoidPair { float s, one_minus_s; };
TE_HD SigmoidPair sigmoid_pair(float z) {
  const float e = exp_f32(-z);
  const float s = 1.0f / (1.0f + e);
  return {s, e * s};
}
TE_HD float sigmoid_f32(float z) { return 1.0f / (1.0f + exp_f32(-z)); }

}  // namespace te
