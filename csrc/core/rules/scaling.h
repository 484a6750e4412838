// Per-tensor FP8 scaling rules (SPEC §4.3, §4.4), one definition for host and device.
#pragma once

#include "common.h"

namespace te {

// NaN-ignoring running max of |v| (SPEC §2 amax); `running` is never NaN.
TE_HD float amax_update(float running, float v) {
#if defined(__CUDA_ARCH__)
  return fmaxf(running, fabsf(v));  // one FMNMX; fmax returns the non-NaN operand, as the host branch below
#else
  const float a = bits_float(float_bits(v) & 0x7FFFFFFFu);
  return a > running ? a : running;
#endif
}

// Current scaling: scale from the amax of the tensor being cast. An infinite fp8_max / amax becomes
// `overflow_scale` (the float max here; FP8 block scaling passes the input dtype's max finite, SPEC §4.7).
TE_HD float current_scale(float amax, float fp8_max_value, float amax_epsilon, bool force_pow2,
                          float overflow_scale = kFloatMax) {
  if (amax < amax_epsilon) amax = amax_epsilon;
  float scale;
  if (amax == 0.0f || is_inf(amax) || is_nan(amax)) {
    scale = 1.0f;
  } else {
    scale = fp8_max_value / amax;
    if (is_inf(scale)) scale = overflow_scale;
  }
  if (force_pow2) scale = bits_float(float_bits(scale) & 0xFF800000u);  // round down to a power of two
  return scale;
}

// Delayed scaling update of one slot (SPEC §4.3). `history` is [L, n] row-major, the slot is column `col`.
// `reduced` is the all-reduced row-0 amax or a negative value when there is no reduction buffer.
enum class AmaxAlgo : int { kMax = 0, kMostRecent = 1 };

TE_HD void delayed_update_slot(float* history, int64_t hist_len, int64_t n, int64_t col, float* scale,
                               bool has_reduced, float reduced, AmaxAlgo algo, float max_over_margin) {
  const float last = (has_reduced && reduced != 0.0f) ? reduced : history[col];
  float amax = 0.0f;
  if (last != 0.0f) {
    if (algo == AmaxAlgo::kMax) {
      amax = last;
      for (int64_t i = 1; i < hist_len; ++i) {
        const float v = history[i * n + col];
        amax = v > amax ? v : amax;
      }
    } else {
      amax = last;
    }
    for (int64_t i = 1; i + 1 < hist_len; ++i) history[i * n + col] = history[(i + 1) * n + col];
    if (hist_len > 1) history[(hist_len - 1) * n + col] = last;
    history[col] = 0.0f;
  }
  if (amax > 0.0f && !is_inf(amax) && !is_nan(amax)) {
    float s = max_over_margin / amax;
    if (is_inf(s)) s = kFloatMax;
    scale[col] = s;
  }
}

// ---- Block-scale layouts (SPEC §4.8) -----------------------------------------------------------------------
// Byte offset of compact element (r, c) of a scale matrix padded to [roundup(R, 128), cpad] (cpad a multiple of 4)
// in cuBLASLt's swizzled layout: 128x4 tiles (512 bytes) row-major over (tile_row, tile_col); inside a tile the
// element at local (i, j) sits at (i % 32) * 16 + (i / 32) * 4 + j.
TE_HD int64_t swizzled_scale_offset(int64_t r, int64_t c, int64_t cpad) {
  const int64_t tile = (r / 128) * (cpad / 4) + c / 4;
  const int64_t i = r % 128, j = c % 4;
  return tile * 512 + (i % 32) * 16 + (i / 32) * 4 + j;
}

TE_HD int64_t roundup(int64_t a, int64_t b) { return (a + b - 1) / b * b; }
TE_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace te
