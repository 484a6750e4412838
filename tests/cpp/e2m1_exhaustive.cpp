// Exhaustive host check of the E2M1 encoders of csrc/core/formats/nvfp4/quantize_nvfp4.h (run by tests/cpp/test_e2m1_exhaustive.py):
//   1. e2m1_encode against SPEC §2's thresholds (float64 comparisons) for all 2^32 FP32 bit patterns;
//   2. nvfp4_pack8_nonan<true> (the CUDA table kernels' encoder) against e2m1_encode for every non-NaN FP32 value;
//   3. nvfp4_pack8_nonan<false> (no cap at 7) against e2m1_encode for every non-NaN value with |v| < 7.
// enc = 1, so each product is the value itself. Prints one line per check: name, values checked, mismatches.
#include "formats/nvfp4/quantize_nvfp4.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
static uint8_t spec_code(float v) {
  uint32_t x; std::memcpy(&x, &v, 4);
  if (std::isnan(v)) return 0x7;
  const double a = std::fabs(double(v));
  const uint8_t c = a <= 0.25 ? 0 : a < 0.75 ? 1 : a <= 1.25 ? 2 : a < 1.75 ? 3 : a <= 2.5 ? 4 : a < 3.5 ? 5 : a <= 5.0 ? 6 : 7;
  return uint8_t((x >> 31) ? 8 : 0) | c;
}
int main() {
  const unsigned nt = std::max(1u, std::thread::hardware_concurrency());
  std::vector<unsigned long long> bad(3 * nt, 0), seen(3 * nt, 0);
  std::vector<std::thread> th;
  for (unsigned t = 0; t < nt; ++t) th.emplace_back([&, t] {
    const uint64_t per = (uint64_t(1) << 32) / nt, lo = t * per, hi = t + 1 == nt ? (uint64_t(1) << 32) : lo + per;
    for (uint64_t g = lo; g < hi; g += 8) {
      float v[8], capped[8], uncapped[8];
      for (int k = 0; k < 8; ++k) {
        const uint32_t bits = uint32_t(g + k);
        std::memcpy(&v[k], &bits, 4);
        if (te::e2m1_encode(v[k]) != spec_code(v[k])) ++bad[3 * t];
        ++seen[3 * t];
        capped[k] = std::isnan(v[k]) ? 0.0f : v[k];
        uncapped[k] = (std::isnan(v[k]) || std::fabs(v[k]) >= 7.0f) ? 0.0f : v[k];
      }
      const uint32_t wc = te::nvfp4_pack8_nonan<true>(capped, 1.0f), wu = te::nvfp4_pack8_nonan<false>(uncapped, 1.0f);
      for (int k = 0; k < 8; ++k) {
        if (((wc >> (4 * k)) & 0xFu) != te::e2m1_encode(capped[k])) ++bad[3 * t + 1];
        if (((wu >> (4 * k)) & 0xFu) != te::e2m1_encode(uncapped[k])) ++bad[3 * t + 2];
        seen[3 * t + 1] += !std::isnan(v[k]);
        seen[3 * t + 2] += !std::isnan(v[k]) && std::fabs(v[k]) < 7.0f;
      }
    }
  });
  for (auto& x : th) x.join();
  const char* names[3] = {"e2m1_encode_vs_spec", "pack8_nonan_capped", "pack8_nonan_uncapped"};
  for (int c = 0; c < 3; ++c) {
    unsigned long long b = 0, s = 0;
    for (unsigned t = 0; t < nt; ++t) { b += bad[3 * t + c]; s += seen[3 * t + c]; }
    std::printf("%s checked %llu mismatches %llu\n", names[c], s, b);
  }
}
