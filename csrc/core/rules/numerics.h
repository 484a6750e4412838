// Number formats: FP32 <-> BF16/FP16 (round-to-nearest-even) and FP32 -> FP8 E4M3/E5M2 (RNE, saturate to
// finite, NaN -> 0x7F), FP8 -> FP32 decode. Invariant: the host and device versions give identical bits for
// every input; the device uses a hardware conversion only where it is bit-identical to the software one
// (cvt.rn.satfinite.e4m3x2/e5m2x2.f32 on sm_89+, cvt.rn.bf16/f16.f32), which the CUDA parity tests check.
#pragma once

#include "common.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace te {

struct bf16_t { uint16_t bits; };
struct fp16_t { uint16_t bits; };

// ---- 16-bit float conversions -------------------------------------------------------------------------
TE_HD float to_float(float x) { return x; }
TE_HD float to_float(bf16_t x) { return bits_float(uint32_t(x.bits) << 16); }

TE_HD float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return bits_float(sign | 0x7F800000u | (mant << 13));  // Inf / NaN
  if (exp == 0) {
    // Subnormal or zero: mant * 2^-24 is exact in FP32.
    const float v = float(mant) * 5.9604644775390625e-08f;
    return bits_float(float_bits(v) | sign);
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}
TE_HD float to_float(fp16_t x) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(x.bits));  // exact widening, same bits as the software decode
#else
  return fp16_bits_to_float(x.bits);
#endif
}

TE_HD uint16_t float_to_bf16_bits_sw(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;  // canonical NaN, as cvt.rn.bf16.f32
  x += 0x7FFFu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

TE_HD uint16_t float_to_fp16_bits_sw(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return 0x7FFF;                     // canonical NaN, as cvt.rn.f16.f32
  if (ax >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // >= 65520 rounds to Inf
  if (ax >= 0x38800000u) {                                 // normal half (>= 2^-14)
    ax += 0xC8000FFFu + ((ax >> 13) & 1u);                 // rebias exponent by -112, round half to even
    return uint16_t(sign | (ax >> 13));
  }
  // Subnormal half: adding 0.5 puts the value's 2^-24 quantum in the low mantissa bits with one RNE rounding.
  const float t = bits_float(ax) + 0.5f;
  return uint16_t(sign | (float_bits(t) - 0x3F000000u));
}

template <typename T> TE_HD T from_float(float x);
template <> TE_HD float from_float<float>(float x) { return x; }
template <> TE_HD bf16_t from_float<bf16_t>(float x) {
#if defined(__CUDA_ARCH__)
  return bf16_t{__bfloat16_as_ushort(__float2bfloat16_rn(x))};
#else
  return bf16_t{float_to_bf16_bits_sw(x)};
#endif
}
template <> TE_HD fp16_t from_float<fp16_t>(float x) {
#if defined(__CUDA_ARCH__)
  return fp16_t{__half_as_ushort(__float2half_rn(x))};
#else
  return fp16_t{float_to_fp16_bits_sw(x)};
#endif
}

// rnd_in of SPEC §5.1: round an FP32 value to the input dtype and widen it again (identity for FP32).
template <typename T> TE_HD float round_to(float x) { return to_float(from_float<T>(x)); }
// Two floats as bf16x2 (round to nearest even, no flush; lo in the low half): one cvt on sm_80+, which rounds each
// half as cvt.rn.bf16.f32 (from_float's).
TE_HD uint32_t float2_to_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t out;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
#else
  return uint32_t(from_float<bf16_t>(lo).bits) | (uint32_t(from_float<bf16_t>(hi).bits) << 16);
#endif
}

// ---- FP8 -----------------------------------------------------------------------------------------------
struct Fp8Format {
  float max;        // largest finite value
  int mant_bits;    // 3 (E4M3) or 2 (E5M2)
  int bias;         // 7 or 15
  float sub_magic;  // 2^k whose FP32 ulp is the FP8 subnormal quantum
  uint8_t max_code; // 0x7E or 0x7B
};
TE_HD Fp8Format fp8_format(bool e4m3) {
  return e4m3 ? Fp8Format{448.0f, 3, 7, 16384.0f, 0x7E} : Fp8Format{57344.0f, 2, 15, 128.0f, 0x7B};
}
TE_HD float fp8_max(bool e4m3) { return e4m3 ? 448.0f : 57344.0f; }

// Software encoder, the definition both sides follow (SPEC §2).
TE_HD uint8_t float_to_fp8_sw(float v, bool e4m3) {
  const Fp8Format f = fp8_format(e4m3);
  const uint32_t x = float_bits(v);
  const uint32_t sign = (x >> 24) & 0x80u;
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return 0x7F;
  const float a = bits_float(ax);
  if (a >= f.max) return uint8_t(sign | f.max_code);
  const uint32_t min_normal_bits = uint32_t(127 + 1 - f.bias) << 23;
  if (ax >= min_normal_bits) {
    const int shift = 23 - f.mant_bits;
    ax += (1u << (shift - 1)) - 1u + ((ax >> shift) & 1u);
    return uint8_t(sign | ((ax >> shift) - (uint32_t(127 - f.bias) << f.mant_bits)));
  }
  const float t = a + f.sub_magic;  // one RNE rounding onto the subnormal grid
  return uint8_t(sign | (float_bits(t) - float_bits(f.sub_magic)));
}

// Encodes two values; the device path uses the hardware conversion (sm_89+), bit-identical to the above.
TE_HD uint16_t float2_to_fp8x2(float lo, float hi, bool e4m3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  if (e4m3) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  }
  return r;
#else
  return uint16_t(float_to_fp8_sw(lo, e4m3)) | uint16_t(uint16_t(float_to_fp8_sw(hi, e4m3)) << 8);
#endif
}
// The same with the format fixed at compile time (the device kernels hoist the runtime choice out of their loops).
template <bool kE4m3> TE_HD uint16_t float2_to_fp8x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  if constexpr (kE4m3) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  }
  return r;
#else
  return float2_to_fp8x2(lo, hi, kE4m3);
#endif
}
TE_HD uint8_t float_to_fp8(float v, bool e4m3) { return uint8_t(float2_to_fp8x2(v, 0.0f, e4m3) & 0xFFu); }

TE_HD float fp8_to_float(uint8_t c, bool e4m3) {
  const Fp8Format f = fp8_format(e4m3);
  const uint32_t sign = uint32_t(c & 0x80u) << 24;
  const uint32_t exp = (c & 0x7Fu) >> f.mant_bits;
  const uint32_t mant = c & ((1u << f.mant_bits) - 1u);
  if (e4m3 && (c & 0x7Fu) == 0x7Fu) return bits_float(0x7FC00000u | sign);
  if (!e4m3 && exp == 0x1Fu) return bits_float(sign | (mant ? 0x7FC00000u : 0x7F800000u));
  if (exp == 0) {
    // mant * 2^(1 - bias - mant_bits), exact.
    const float q = bits_float(uint32_t(127 + 1 - f.bias - f.mant_bits) << 23);
    return bits_float(float_bits(float(mant) * q) | sign);
  }
  return bits_float(sign | ((exp + uint32_t(127 - f.bias)) << 23) | (mant << (23 - f.mant_bits)));
}

// ---- E8M0 (MX block scales) ------------------------------------------------------------------------------
// A scale byte e stands for 2^(e - 127); 0xFF is NaN. Stored as uint8 (SPEC §2, §4.5).
// Encode of a non-negative FP32 value, rounding UP to a power of two (not the OCP floor rule): NaN -> 0xFF,
// +Inf -> 0xFE, zero/subnormal -> 0 if v <= 2^-127 else 1, saturating at 0xFE, else E + (mantissa != 0).
// Written as one add and selects, not branches (the MX kernels evaluate it per block): on the magnitude bits a,
// (a + 0x7FFFFF) >> 23 is E + (F != 0); saturating it at 0xFE also covers E = 0xFE and +Inf; a <= 0x400000 (zero and
// subnormals up to 2^-127) gives 0; NaN (of either sign) is picked last.
TE_HD uint8_t e8m0_encode(float v) {
  const uint32_t a = float_bits(v) & 0x7FFFFFFFu;
  const uint32_t up = (a + 0x7FFFFFu) >> 23;
  const uint32_t r = a <= 0x400000u ? 0u : (up > 0xFEu ? 0xFEu : up);
  return uint8_t(a > 0x7F800000u ? 0xFFu : r);
}

// 2^(e - 127) exactly (the dequantize factor): e = 0 is the subnormal 2^-127.
TE_HD float e8m0_to_float(uint8_t e) {
  if (e == 0xFFu) return bits_float(0x7FC00000u);
  return e == 0u ? bits_float(0x400000u) : bits_float(uint32_t(e) << 23);
}

// 2^(127 - e) exactly (the quantize multiplier, the reciprocal of the scale): e = 254 gives the subnormal
// 2^-127, e = 0 gives 2^127, e = 255 gives NaN. Built from bits, never divided.
TE_HD float e8m0_multiplier(uint8_t e) {
  const uint32_t bits = e == 0xFEu ? 0x400000u : (uint32_t(254u - e) << 23);
  return bits_float(e == 0xFFu ? 0x7FC00000u : bits);
}

// fl(1 / fp8_max) as FP32 constants: the MX scale rule multiplies by these, it never divides by fp8_max.
constexpr float kInvE4m3Max = 0x1.24924ap-9f;   // fl(1/448)
constexpr float kInvE5m2Max = 0x1.24924ap-16f;  // fl(1/57344)

// The E8M0 code of a block with the given amax (SPEC §4.5): e = encode(fl(amax * fl(1/fp8_max))).
TE_HD uint8_t mx_block_code(float block_amax, bool e4m3) {
  return e8m0_encode(block_amax * (e4m3 ? kInvE4m3Max : kInvE5m2Max));
}
// The same code as a 32-bit value for kernels whose block amax comes from amax_update (NaN-free, >= +0, possibly
// +Inf): then v = amax * fl(1/fp8_max) is a non-negative non-NaN float and e8m0_encode needs neither the sign mask
// nor the NaN select (same code for every such v); the result is at most 0xFE.
TE_HD uint32_t mx_block_code_u32(float block_amax, bool e4m3) {
  const uint32_t a = float_bits(block_amax * (e4m3 ? kInvE4m3Max : kInvE5m2Max));
  const uint32_t up = (a + 0x7FFFFFu) >> 23;
  return a <= 0x400000u ? 0u : (up > 0xFEu ? 0xFEu : up);
}
// e8m0_multiplier of a code <= 0xFE (mx_block_code_u32's range): no NaN select.
TE_HD float e8m0_multiplier_finite(uint32_t e) { return bits_float(e == 0xFEu ? 0x400000u : ((254u - e) << 23)); }

// ---- Plain buffers -----------------------------------------------------------------------------------
// Element i of a float32 / float16 / bfloat16 buffer (the caller has checked the dtype; anything else reads 0).
TE_HD float gemm_load(const void* p, int64_t i, DType d) {
  switch (d) {
    case DType::kFloat32: return static_cast<const float*>(p)[i];
    case DType::kFloat16: return to_float(static_cast<const fp16_t*>(p)[i]);
    case DType::kBFloat16: return to_float(static_cast<const bf16_t*>(p)[i]);
    default: return 0.0f;
  }
}

TE_HD void gemm_store(void* p, int64_t i, DType d, float v) {
  switch (d) {
    case DType::kFloat32: static_cast<float*>(p)[i] = v; return;
    case DType::kFloat16: static_cast<fp16_t*>(p)[i] = from_float<fp16_t>(v); return;
    case DType::kBFloat16: static_cast<bf16_t*>(p)[i] = from_float<bf16_t>(v); return;
    default: return;
  }
}

}  // namespace te
