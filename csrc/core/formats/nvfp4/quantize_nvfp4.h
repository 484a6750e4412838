// NVFP4 quantization (SPEC §2 E2M1, §4.6, §4.8): two-level scaling of a high-precision [rows, cols] tensor into
// packed E2M1 codes with one E4M3 scale per 16 elements and a global FP32 scale derived from the tensor amax.
// Invariant: CPU and CUDA kernels call the same encoders below (E2M1 RNE and stochastic rounding, the E4M3 block
// scale, the Philox stream, the Hadamard transform), so for a given global amax and (seed, offset) the bytes are
// identical on both sides. The activation (if any) is applied before these kernels run: they cast values of the
// input dtype (the bridge writes rnd_in(act(x)) to a temporary, SPEC §5.1).
//
// Shapes (row-major, flattened to 2-D; cols % 16 == 0, and rows % 16 == 0 when a columnwise copy is written):
//   x          [rows, cols]                                   input dtype (float32 / float16 / bfloat16)
//   row_data   [rows, cols/2]                                 uint8, two E2M1 codes, even element in the low nibble
//   row_scale  [roundup(rows, 128), roundup(cols/16, 4)]      uint8 E4M3 (compact or GEMM-swizzled), padding 0
//   col_data   [cols, rows/2]                                 uint8, codes of the transpose x^T (optionally RHT'd)
//   col_scale  [roundup(cols, 128), roundup(rows/16, 4)]      uint8 E4M3; entry [k, i] covers rows 16i..16i+15 of
//                                                             column k
//   amax_in_*  [1] float32 global amaxes the scales derive from (computed by a previous pass, never written here)
//   amax_out_* [1] float32 the tensor's _amax_rowwise / _amax_columnwise, copied from amax_in_* (unless noop)
#pragma once

#include "../../rules/dispatch.h"
#include "../../rules/numerics.h"
#include "../../rules/parallel.h"
#include "../../rules/scaling.h"
#include "../table.h"

#if defined(TE_WITH_CUDA)
#include <cuda_runtime.h>
#endif
#include "../../rules/math.h"

namespace te {

constexpr int64_t kNvBlock = format_block_len(Format::kNvfp4);  // 16
constexpr float kInv6 = 0x1.555556p-3f;     // fl(1/6)
constexpr float kNvfp4GlobalMax = 2688.0f;  // 448 * 6
// The fixed sign vector s of SPEC §4.6 as a bitmask (bit i set where s_i = -1).
constexpr uint32_t kRhtSignMask = 0xD7E8u;

// ---- E2M1 ------------------------------------------------------------------------------------------------------
// FP32 -> E2M1 nibble, RNE with saturation at 6 (SPEC §2 thresholds, ties to the even code); sign bit of v; NaN -> 0x7.
// Branch-free on the magnitude bits a (the same arithmetic on host and device; equal to counting the SPEC
// thresholds |v| lies past for all 2^32 inputs, checked exhaustively): |v| >= 1 rounds its mantissa to one bit by
// an integer RNE add, and the code is then the pattern's top bits minus 252, saturated at 7; |v| < 1 rounds onto
// the 0.5 grid by one FP32 addition of 2^22 (codes 0, 1, 2).
TE_HD uint8_t e2m1_encode(float v) {
  const uint32_t x = float_bits(v);
  const uint32_t a = x & 0x7FFFFFFFu;
  const uint32_t r = ((a + 0x1FFFFFu + ((a >> 22) & 1u)) >> 22) - 252u;
  const uint32_t big = r > 7u ? 7u : r;
  const uint32_t small = float_bits(bits_float(a) + 4194304.0f) - 0x4A800000u;
  const uint32_t c = a < 0x3F800000u ? small : big;
  return uint8_t(a > 0x7F800000u ? 0x7u : (((x >> 28) & 0x8u) | c));
}

// Eight values times `enc`, round to nearest: eight nibbles, element 2j in the low nibble of byte j.
TE_HD uint32_t nvfp4_pack8(const float v[8], float enc) {
  uint32_t w = 0u;
  for (int k = 0; k < 8; ++k) w |= uint32_t(e2m1_encode(v[k] * enc)) << (4 * k);
  return w;
}

// nvfp4_pack8 for products that are never NaN (v finite, enc finite; the CUDA kernels' table path), written for
// few integer-pipe instructions: the same nibbles as nvfp4_pack8 for every non-NaN v[k] * enc (checked exhaustively
// on the host against e2m1_encode for every non-NaN FP32 product). With a = |p|, the code is rint(min(2a, a + 2,
// a/2 + 4, 7)) (RNE; the three affine pieces follow the E2M1 grid spacings 0.5, 1, 2 and meet at a = 2 and 4, so
// ties to the even integer are ties to the even code); each piece is rounded once by an exact FMA/add onto 2^23
// (ulp 1), so the minimum is 2^23 + code and its low bits are the code. Codes and signs (p >> 28, the sign at bit
// 3; one funnel shift per value on the device) are gathered as base-16 digits; the codes' constant 0x4B000000
// digits are subtracted at the end (the sum is exact mod 2^32).
// kCap = false leaves out the cap at 7: valid when every |p| < 7 (then a/2 + 4 < 7.5 rounds to at most 7; checked
// exhaustively over every non-NaN |p| < 7), which a caller knows from fl(block_amax * enc) < 7 (p = fl(v * enc) is
// monotone in |v|); with normal E4M3 block scales the block's largest product is about 6.
constexpr uint32_t nvfp4_pack8_bias() {
  uint32_t g = 0u;
  for (int k = 0; k < 8; ++k) g += 0x4B000000u << (4 * k);
  return g;
}
template <bool kCap = true> TE_HD uint32_t nvfp4_pack8_nonan(const float v[8], float enc) {
  uint32_t c = 0u, t = 0u;
  for (int k = 7; k >= 0; --k) {
    const float p = v[k] * enc;
#if defined(__CUDA_ARCH__)
    const float a = fabsf(p);
    const float lo = fminf(fma_f32(a, 2.0f, 0x1p23f), a + 0x1.000004p23f);
    const float hi = fma_f32(a, 0.5f, 0x1.000008p23f);
    const float m = fminf(lo, kCap ? fminf(hi, 0x1.00000ep23f) : hi);
    t = __funnelshift_l(float_bits(p), t, 4);  // t * 16 + (p >> 28): one SHF
#else
    const float a = std::fabs(p);
    const float lo = std::fmin(fma_f32(a, 2.0f, 0x1p23f), a + 0x1.000004p23f);
    const float hi = fma_f32(a, 0.5f, 0x1.000008p23f);
    const float m = std::fmin(lo, kCap ? std::fmin(hi, 0x1.00000ep23f) : hi);
    t = t * 16u + (float_bits(p) >> 28);
#endif
    c = c * 16u + float_bits(m);
  }
  return (t & 0x88888888u) | (c - nvfp4_pack8_bias());
}

// The 16 values of one block times `enc` (finite), as two words of nibbles (elements 0-7, 8-15): the NaN-safe
// nvfp4_pack8 unless the values are known finite (`finite`: NaN-free products), then nvfp4_pack8_nonan, without
// its cap where fl(amax * enc) < 7 (`amax`: the values' largest magnitude). The same nibbles on every path.
TE_HD void nvfp4_pack16(const float v[16], float amax, float enc, bool finite, uint32_t w[2]) {
  if (!finite) {
    w[0] = nvfp4_pack8(v, enc);
    w[1] = nvfp4_pack8(v + 8, enc);
  } else if (amax * enc < 7.0f) {
    w[0] = nvfp4_pack8_nonan<false>(v, enc);
    w[1] = nvfp4_pack8_nonan<false>(v + 8, enc);
  } else {
    w[0] = nvfp4_pack8_nonan<true>(v, enc);
    w[1] = nvfp4_pack8_nonan<true>(v + 8, enc);
  }
}

TE_HD float e2m1_decode(uint8_t code) {
  const uint32_t m = code & 0x7u;
  // 0, 0.5, 1, 1.5, 2, 3, 4, 6: exponent field e = m >> 1, mantissa bit m & 1.
  const float mag = m < 2 ? 0.5f * float(m) : bits_float(uint32_t(127 + (m >> 1) - 1) << 23) * (1.0f + 0.5f * float(m & 1u));
  return (code & 0x8u) ? -mag : mag;
}

// Stochastic rounding onto the E2M1 grid (SPEC §4.6) with 8 random bits r: every value lands on one of the two
// grid points around it, grid points stay; NaN -> +6, magnitudes beyond 6 saturate.
TE_HD float e2m1_step(float a) { return a < 2.0f ? 0.5f : (a < 4.0f ? 1.0f : 2.0f); }
TE_HD float e2m1_step_inv(float a) { return a < 2.0f ? 2.0f : (a < 4.0f ? 1.0f : 0.5f); }  // 1 / e2m1_step, exact
TE_HD uint8_t e2m1_encode_sr(float v, uint32_t r) {
  const uint32_t x = float_bits(v);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return 0x7;
  const uint8_t sign = uint8_t((x >> 28) & 0x8u);
  const float a = bits_float(x & 0x7FFFFFFFu);
  const float u = float(r & 0xFFu) * 0.00390625f;  // r / 256, exact
  const float t = fma_f32(u, e2m1_step(a), a);
  const float st = e2m1_step(t);
  // t / st as t times the exact reciprocal: st is 0.5, 1 or 2, and t >= 0 stays far from the subnormal and overflow
  // ranges where the two could differ (t < 2 doubles, t >= 4 halves), so the same value without a division.
#if defined(__CUDA_ARCH__)
  float q = floorf(t * e2m1_step_inv(t)) * st;
#else
  float q = std::floor(t * e2m1_step_inv(t)) * st;
#endif
  q = q < 6.0f ? q : 6.0f;  // Inf -> 6
  return uint8_t(sign | e2m1_encode(q));
}

// Random byte of element k (0..7) of a block half from its two Philox words: byte k & 3 of word k >> 2.
TE_HD uint32_t nvfp4_sr_byte(uint32_t r0, uint32_t r1, int k) { return ((k < 4 ? r0 : r1) >> (8 * (k & 3))) & 0xFFu; }

// Eight values times `enc`, stochastically rounded with their random bytes (element k: nvfp4_sr_byte), as eight
// nibbles: e2m1_encode_sr of each product.
TE_HD uint32_t nvfp4_pack8_sr(const float v[8], float enc, uint32_t r0, uint32_t r1) {
  uint32_t w = 0u;
  for (int k = 0; k < 8; ++k) w |= uint32_t(e2m1_encode_sr(v[k] * enc, nvfp4_sr_byte(r0, r1, k))) << (4 * k);
  return w;
}

// nvfp4_pack8_sr for products that are never NaN (v finite, enc finite), written for few instructions on the device:
// the same nibbles (the host runs nvfp4_pack8_sr). With a = |p| and t = fl(a + u * step(a)) as e2m1_encode_sr, the
// code of q = floor(t / step(t)) * step(t) is floor(c(t)) capped at 7, where c(t) = min(2t, t + 2, t/2 + 4) is the
// piecewise-linear map of nvfp4_pack8_nonan that sends the E2M1 grid to the codes (q lies on t's piece, whose grid
// spacing is step(t)); so the code is min(floor(2t), floor(t) + 2, floor(t/2) + 4, 7). Each floor is one FMA or add
// rounded toward -inf onto 2^23 (ulp 1): the minimum is 2^23 + code. u * step(a) is r * (step(a) / 256), the same
// exact product. Equal to e2m1_encode_sr (code bits) for every |p| in [2^-24, 16) and all 256 bytes, checked
// exhaustively on the host with the floors in exact arithmetic, and for sampled |p| below and above that range (to
// +Inf); the sign nibble bits are gathered as in nvfp4_pack8_nonan (sign of p, as e2m1_encode_sr's).
TE_HD uint32_t nvfp4_pack8_sr_nonan(const float v[8], float enc, uint32_t r0, uint32_t r1) {
#if defined(__CUDA_ARCH__)
  uint32_t c = 0u, t = 0u;
#pragma unroll
  for (int k = 7; k >= 0; --k) {
    const float p = v[k] * enc;
    const float a = fabsf(p);
    const float s = a < 2.0f ? 0x1p-9f : (a < 4.0f ? 0x1p-8f : 0x1p-7f);  // step(a) / 256
    const float tt = __fmaf_rn(float(nvfp4_sr_byte(r0, r1, k)), s, a);
    const float lo = fminf(__fmaf_rd(tt, 2.0f, 0x1p23f), __fadd_rd(tt, 0x1.000004p23f));
    const float m = fminf(lo, fminf(__fmaf_rd(tt, 0.5f, 0x1.000008p23f), 0x1.00000ep23f));
    t = __funnelshift_l(float_bits(p), t, 4);  // t * 16 + (p >> 28)
    c = c * 16u + float_bits(m);
  }
  return (t & 0x88888888u) | (c - nvfp4_pack8_bias());
#else
  return nvfp4_pack8_sr(v, enc, r0, r1);
#endif
}

// ---- Two-level scaling ------------------------------------------------------------------------------------------
// Global encode scale S_enc = min(fl(2688 / amax), FLT_MAX); 1 when amax is 0 or Inf (S_enc would be 0).
TE_HD float nvfp4_global_scale(float amax) {
  if (amax == 0.0f) return 1.0f;
  float s = kNvfp4GlobalMax / amax;
  if (s > kFloatMax) s = kFloatMax;
  if (s == 0.0f) s = 1.0f;
  return s;
}
// E4M3 block scale byte: e4m3(fl(block_amax * fl(S_enc * fl(1/6)))) (RNE, saturating at 448).
TE_HD uint8_t nvfp4_block_scale(float block_amax, float s_enc) {
  return float_to_fp8(block_amax * (s_enc * kInv6), true);
}
// Element multiplier enc = min(fl(1 / fl(float(sf) * S_dec)), FLT_MAX) (sf = 0 gives FLT_MAX).
TE_HD float nvfp4_block_multiplier(uint8_t sf, float s_dec) {
  const float e = 1.0f / (fp8_to_float(sf, true) * s_dec);
  return e > kFloatMax ? kFloatMax : e;
}

// The GEMM's alpha' with both operands' global decode scales folded in (SPEC §6.7), from their copies' global
// amaxes: TE's fl(fl(amax_a * amax_b) * fl(alpha / (6 * 6 * 448 * 448))) wherever that is finite and both amaxes
// stand for the quantizers' S_dec (finite, fl(2688 / amax) did not overflow; amax 0 gives 0 as in TE). Elsewhere
// fl(alpha * g_a * g_b) from float64, with g = amax / 2688 for such an operand and g = S_dec = fl(1 / S_enc) for the
// others: amaxes whose FP32 product overflows give the finite alpha' the dequantized operands imply, and an Inf amax
// (S_dec 1) does not make every output Inf. The one formula of the CPU kernel and the device (nvfp4_gemm_alpha_cuda).
TE_HD bool nvfp4_amax_regular(float amax) {
  const float s = kNvfp4GlobalMax / amax;
  return amax > 0.0f && s > 0.0f && s <= kFloatMax;  // false for NaN
}
TE_HD float nvfp4_gemm_alpha(float amax_a, float amax_b, double alpha) {
  const float te = (amax_a * amax_b) * float(alpha * (1.0 / (6.0 * 6.0 * 448.0 * 448.0)));
  const bool ra = nvfp4_amax_regular(amax_a), rb = nvfp4_amax_regular(amax_b);
  const bool keep = te - te == 0.0f && (ra || amax_a == 0.0f) && (rb || amax_b == 0.0f);  // te finite
  if (keep) return te;
  const double ga = ra ? double(amax_a) / 2688.0 : double(1.0f / nvfp4_global_scale(amax_a));
  const double gb = rb ? double(amax_b) / 2688.0 : double(1.0f / nvfp4_global_scale(amax_b));
  return float(ga * gb * alpha);
}
#if defined(TE_WITH_CUDA)
// [alpha', beta] into out[0..2) on `stream` from the device amaxes (one thread): the sm_90 GEMM's device scalars.
void nvfp4_gemm_alpha_cuda(const float* amax_a, const float* amax_b, double alpha, float beta, float* out,
                           cudaStream_t stream);
#endif

// ---- Philox4x32-10 (counter-based; the same 128 bits on host and device for a given key and counter) ------------
struct Philox4 { uint32_t v[4]; };
TE_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kM0) * c0, p1 = uint64_t(kM1) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0), hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return {{c0, c1, c2, c3}};
}

// Where the random bits come from: (seed, offset) as values, or (CUDA graph capture) as device pointers that the
// graph's replays update, plus the capture's intra-graph offset. Mirrors torch's PhiloxCudaState without its header.
struct RngState {
  uint64_t seed = 0, offset = 0;
  const int64_t* seed_ptr = nullptr;    // captured: read *seed_ptr in the kernel
  const int64_t* offset_ptr = nullptr;  // captured: *offset_ptr + offset
};
struct RngKey { uint64_t seed, offset; };
TE_HD RngKey rng_unpack(const RngState& s) {
  if (s.seed_ptr != nullptr) return {uint64_t(*s.seed_ptr), uint64_t(*s.offset_ptr) + s.offset};
  return {s.seed, s.offset};
}

// The 16 random bytes of one 16-element block: block index `blk` in its copy's own layout (rowwise: r * cols/16 + kb,
// columnwise: k * rows/16 + i), copy 0 rowwise / 1 columnwise. Byte j (little-endian within the 4 words) drives
// element j of the block. Independent of the launch configuration.
TE_HD Philox4 nvfp4_block_bits(const RngKey& key, int64_t blk, int copy) {
  const uint64_t b = uint64_t(blk);
  return philox4x32_10(uint32_t(b), uint32_t(b >> 32) | (uint32_t(copy) << 31), uint32_t(key.offset),
                       uint32_t(key.offset >> 32), uint32_t(key.seed), uint32_t(key.seed >> 32));
}

// ---- Random Hadamard transform (SPEC §4.6) ---------------------------------------------------------------------
// y_j = sum_i v_i * s_i * H16[i][j] / 4, H16[i][j] = (-1)^popcount(i & j), accumulated in FP32 in index order
// (starting from the i = 0 term), each y_j rounded to bf16. R = diag(s) * H16 / 4 is orthogonal.
TE_HD int popcount4(uint32_t x) { return int((x & 1u) + ((x >> 1) & 1u) + ((x >> 2) & 1u) + ((x >> 3) & 1u)); }
// The sums of rht16 from the signed, scaled inputs w_i = s_i * v_i / 4 (each exact): unrolled, every H16 sign is a
// constant, 15 additions or subtractions an output, in index order; outputs rounded to bf16 in pairs.
TE_HD void rht16_sums(const float w[16], float y[16]) {
#pragma unroll
  for (int j = 0; j < 16; j += 2) {
    float acc[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      acc[h] = w[0];
#pragma unroll
      for (int i = 1; i < 16; ++i) acc[h] = acc[h] + ((popcount4(uint32_t(i & (j + h))) & 1) ? -w[i] : w[i]);
    }
    const uint32_t b = float2_to_bf16x2(acc[0], acc[1]);
    y[j] = bits_float(b << 16);
    y[j + 1] = bits_float(b & 0xFFFF0000u);
  }
}
TE_HD float rht_input_factor(uint32_t sign_mask, int i) { return ((sign_mask >> i) & 1u) ? -0.25f : 0.25f; }
TE_HD void rht16(const float v[16], uint32_t sign_mask, float y[16]) {
  float w[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) w[i] = v[i] * rht_input_factor(sign_mask, i);  // exact: s_i * v_i / 4
  rht16_sums(w, y);
}

// The 16 codes of one block as two words (elements 0-7, 8-15) with multiplier `enc`: RNE (`bits` null) or stochastic
// rounding with `bits` (byte j of the four words drives element j). `finite` and `amax` as for nvfp4_pack16 (what the
// caller knows of the values: every value finite; an upper bound of their magnitudes); the same nibbles either way.
TE_HD void nvfp4_encode_words(const float v[16], float enc, float amax, bool finite, const Philox4* bits,
                              uint32_t w[2]) {
  if (bits == nullptr) {
    nvfp4_pack16(v, amax, enc, finite, w);
  } else if (finite) {
    w[0] = nvfp4_pack8_sr_nonan(v, enc, bits->v[0], bits->v[1]);
    w[1] = nvfp4_pack8_sr_nonan(v + 8, enc, bits->v[2], bits->v[3]);
  } else {
    w[0] = nvfp4_pack8_sr(v, enc, bits->v[0], bits->v[1]);
    w[1] = nvfp4_pack8_sr(v + 8, enc, bits->v[2], bits->v[3]);
  }
}

// Quantizes one 16-element block of values `v` (what the copy encodes) given its scale byte and the copy's
// S_dec; `bits` (may be null: RNE) supplies the stochastic-rounding bytes. Writes 8 packed bytes.
TE_HD void nvfp4_encode_block(const float v[16], uint8_t sf, float s_dec, const Philox4* bits, uint8_t out[8]) {
  // Finite values (enc is finite) give NaN-free products: the few-instruction encoders, uncapped where the block's
  // largest product is below 7 (the same nibbles: nvfp4_encode_words).
  float a = 0.0f;
  bool finite = true;
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    a = amax_update(a, v[k]);
    finite &= (float_bits(v[k]) & 0x7F800000u) != 0x7F800000u;  // exponent field not all ones: not Inf / NaN
  }
  uint32_t w[2];
  nvfp4_encode_words(v, nvfp4_block_multiplier(sf, s_dec), a, finite, bits, w);
#pragma unroll
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 4; ++j) out[4 * h + j] = uint8_t(w[h] >> (8 * j));
}

// One block of a cast: the E4M3 scale code of `amax` into *scale, the 8 code bytes of `v` into `out`; stochastic
// rounding (`sr`) draws from the block's Philox counter `counter` of copy `copy` (0 rowwise, 1 columnwise) under
// `key`. The CPU and CUDA cast kernels emit every block through it.
TE_HD void nvfp4_emit_block(const float v[16], float amax, float s_enc, float s_dec, bool sr, const RngKey& key,
                            int64_t counter, int copy, uint8_t* scale, uint8_t out[8]) {
  const uint8_t sf = nvfp4_block_scale(amax, s_enc);
  *scale = sf;
  Philox4 bits;
  if (sr) bits = nvfp4_block_bits(key, counter, copy);
  nvfp4_encode_block(v, sf, s_dec, sr ? &bits : nullptr, out);
}

// ---- Params, layouts, launchers -----------------------------------------------------------------------------------
struct Nvfp4Params {
  const void* x = nullptr;
  uint8_t* row_data = nullptr;     // null: no rowwise copy
  uint8_t* row_scale = nullptr;
  uint8_t* col_data = nullptr;     // null: no columnwise copy
  uint8_t* col_scale = nullptr;
  const float* amax_in_row = nullptr;  // [1] global amax of the rowwise copy
  const float* amax_in_col = nullptr;  // [1] global amax of the columnwise copy (post-RHT when rht)
  float* amax_out_row = nullptr;   // [1] optional
  float* amax_out_col = nullptr;   // [1] optional
  const float* noop = nullptr;     // [1] optional: 1.0 means write nothing
  int64_t rows = 0, cols = 0;
  bool two_d = false;              // one scale per 16x16 tile (qflags bit1)
  bool sr = false;                 // stochastic rounding (qflags bit2)
  bool rht = false;                // Hadamard transform of the columnwise copy (qflags bit3; bf16 input only)
  uint32_t rht_sign_mask = kRhtSignMask;  // 0 without the random sign mask (qflags bit4)
  bool swizzled = false;           // scales in the GEMM-swizzled layout (qflags bit5)
  RngState rng;
};

// Amax pass: amax_row = amax(x); amax_col = amax(RHT(x^T)) when rht, else amax(x). Both accumulate with max into
// buffers the caller zeroed.
struct Nvfp4AmaxParams {
  const void* x = nullptr;
  float* amax_row = nullptr;
  float* amax_col = nullptr;  // null: not wanted
  int64_t rows = 0, cols = 0;
  bool rht = false;
  uint32_t rht_sign_mask = kRhtSignMask;
};

struct Nvfp4ScaleShapes { int64_t row_r, row_c, col_r, col_c; };
TE_HD Nvfp4ScaleShapes nvfp4_scale_shapes(int64_t rows, int64_t cols) {  // the format table's rule
  const CopyShapes s = format_scale_shapes(Format::kNvfp4, rows, cols);
  return {s.row.r, s.row.c, s.col.r, s.col.c};
}
// Byte offset of rowwise scale (row r, block j) and of columnwise scale (column k, row block i); both compact
// matrices are swizzled as stored (SPEC §4.8: the NVFP4 columnwise data is already transposed).
TE_HD int64_t nv_row_scale_offset(int64_t r, int64_t j, int64_t cols, bool swizzled) {
  const int64_t cpad = roundup(cols / kNvBlock, 4);
  return swizzled ? swizzled_scale_offset(r, j, cpad) : r * cpad + j;
}
TE_HD int64_t nv_col_scale_offset(int64_t k, int64_t i, int64_t rows, bool swizzled) {
  const int64_t cpad = roundup(rows / kNvBlock, 4);
  return swizzled ? swizzled_scale_offset(k, i, cpad) : k * cpad + i;
}

// The GEMM operand decode (SPEC §6.7): element (r, c) of an NVFP4 GEMM operand stored as packed [rows, cols / 2]
// bytes (K along cols, as every NVFP4 GEMM copy) with GEMM-swizzled E4M3 scales: fl(e2m1 · float(sf)), exact; the
// global decode factors stay out (the GEMM folds them into alpha).
TE_HD float nv_gemm_decode(const uint8_t* packed, const uint8_t* scales, int64_t r, int64_t c, int64_t cols) {
  const uint8_t byte = packed[(r * cols + c) / 2];
  const uint8_t code = (c & 1) ? uint8_t(byte >> 4) : uint8_t(byte & 0xFu);
  return e2m1_decode(code) * fp8_to_float(scales[nv_row_scale_offset(r, c / kNvBlock, cols, true)], true);
}
#if defined(TE_WITH_CUDA)
// The operand decoded once into bf16 `out` [rows, cols] (exact) on `stream`: the sm_90 NVFP4 GEMM's input
// (ops/gemm_op.cpp). Bandwidth-bound, one 16-element block a thread.
void decode_nvfp4_gemm_operand_cuda(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols,
                                    void* out, cudaStream_t stream);
#endif

void nvfp4_amax_cpu(DType in_dtype, const Nvfp4AmaxParams& p, const ParallelFor& parallel_for);
void quantize_nvfp4_cpu(DType in_dtype, const Nvfp4Params& p, const ParallelFor& parallel_for);
#if defined(TE_WITH_CUDA)
void nvfp4_amax_cuda(DType in_dtype, const Nvfp4AmaxParams& p, cudaStream_t s);
void quantize_nvfp4_cuda(DType in_dtype, const Nvfp4Params& p, cudaStream_t s);
#endif

}  // namespace te
