// Our own FP32 exp and sigmoid, compiled identically for host and device (SPEC §2 "CPU/CUDA bit-parity"):
// IEEE mul/add/div/sqrt and explicit fmaf only (the build turns FMA contraction off on both sides), no libm,
// no CUDA intrinsics beyond device spellings of exact results (fminf/fmaxf; recip_f32's correctly rounded
// reciprocal). exp(0) = 1 exactly; overflow/underflow points are fixed by the clamp below.
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

// max(lo, min(hi, y)) with fmin/fmax semantics: NaN maps to lo. One FMNMX each on the device.
TE_HD float clamp_f32(float y, float lo, float hi) {
#if defined(__CUDA_ARCH__)
  return fminf(fmaxf(y, lo), hi);
#else
  y = !(y >= lo) ? lo : y;
  return y > hi ? hi : y;
#endif
}

// e^y for y in [-87, 87]; y is clamped there first (NaN -> -87: callers whose result must be NaN for a NaN
// input get it from a product with the input, or check explicitly), so 2^n stays a normal float:
// e^87 = 6.08e37 (below 2^126, which keeps 1 + e^y in recip_f32's range) and e^-87 = 1.65e-38 bound the results.
// Single-step reduction r = y - n*fl(ln2) (error <= 126 * 1.9e-9 at the clamp) and a degree-5 fit of e^r on
// |r| <= 0.3475: within 4 ulp on the domain.
TE_HD float exp_f32(float y) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer (RNE)
  constexpr float kLn2 = 0.693147182464599609375f;
  constexpr float kC2 = 0.49999234080314636f, kC3 = 0.16667115688323975f, kC4 = 0.041890181601047516f,
                  kC5 = 0.008312733843922615f;
  y = clamp_f32(y, -87.0f, 87.0f);
  const float t = fma_f32(y, kLog2e, kMagic);
  const float n = t - kMagic;
  const float r = fma_f32(n, -kLn2, y);
  float p = fma_f32(kC5, r, kC4);
  p = fma_f32(p, r, kC3);
  p = fma_f32(p, r, kC2);
  p = fma_f32(p, r, 1.0f);
  p = fma_f32(p, r, 1.0f);
  // t's mantissa holds 0x400000 + n; (n + 127) << 23 is 2^n.
  const float two_n = bits_float((float_bits(t) - 0x4B3FFF81u) << 23);
  return p * two_n;
}

// fl(1 / d), IEEE round-to-nearest, for 1 <= d < 2^126 (every sigmoid denominator 1 + exp_f32(y)). The host
// divides. The device takes the fast path of the compiler's own RN reciprocal without its range test and the
// per-element branch around it (which split every element's math into its own region): the approximate reciprocal,
// then one FMA residual and one FMA correction, correctly rounded for normal d whose reciprocal is normal, as here.
// The same bits as `1.0f / d` (checked on the device for every float in [1, 2^126)); the computed gelu forward
// path takes about 21 instead of 37 instructions per element.
TE_HD float recip_f32(float d) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  const float e = __fmaf_rn(d, r, -1.0f);
  return __fmaf_rn(r, -e, r);
#else
  return 1.0f / d;
#endif
}

// sigma(z) = fl(1 / (1 + exp(-z))) (SPEC §3.2), and 1 - sigma(z) computed without cancellation as
// exp(-z) * sigma(z).
struct SigmoidPair { float s, one_minus_s; };
TE_HD SigmoidPair sigmoid_pair(float z) {
  const float e = exp_f32(-z);
  const float s = recip_f32(1.0f + e);
  return {s, e * s};
}
TE_HD float sigmoid_f32(float z) { return recip_f32(1.0f + exp_f32(-z)); }

}  // namespace te
