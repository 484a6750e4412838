// The format table's host half: the rows (names, element and scale types, decode rules, quantizer kinds) and the
// host decode of one stored copy (SPEC §4.9). The shape rules are in table.h, shared with the device code.
#include "table.h"

#include "../rules/numerics.h"

#include <cmath>

namespace te {
namespace {

const FormatInfo kRows[kFormatCount] = {
    {Format::kPlain, "plain", {DType::kFloat32, DType::kFloat16, DType::kBFloat16}, DType::kFloat32,
     DecodeRule::kNone, false, {QuantKind::kNone}, 0, format_rule(Format::kPlain)},
    {Format::kFp8PerTensor, "fp8_per_tensor", {DType::kFloat8E4M3, DType::kFloat8E5M2}, DType::kFloat32,
     DecodeRule::kTensorScale, false, {QuantKind::kFp8Delayed, QuantKind::kFp8Current}, 0,
     format_rule(Format::kFp8PerTensor)},
    {Format::kMxfp8, "mxfp8", {DType::kFloat8E4M3, DType::kFloat8E5M2}, DType::kFloat8E8M0, DecodeRule::kE8m0Block,
     false, {QuantKind::kMxfp8}, 0, format_rule(Format::kMxfp8)},
    {Format::kNvfp4, "nvfp4", {DType::kFloat4E2M1}, DType::kFloat8E4M3, DecodeRule::kNvfp4, true,
     {QuantKind::kNvfp4}, 0, format_rule(Format::kNvfp4)},
    {Format::kFp8Block1d, "fp8_block_1x128", {DType::kFloat8E4M3, DType::kFloat8E5M2}, DType::kFloat32,
     DecodeRule::kF32Block, false, {QuantKind::kFp8Block}, 1, format_rule(Format::kFp8Block1d)},
    {Format::kFp8Block2d, "fp8_block_128x128", {DType::kFloat8E4M3, DType::kFloat8E5M2}, DType::kFloat32,
     DecodeRule::kF32Block, false, {QuantKind::kFp8Block}, 2, format_rule(Format::kFp8Block2d)},
};

// E2M1 (SPEC §2): sign bit 3, then 2 exponent bits and 1 mantissa bit, bias 1: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
float e2m1_value(uint32_t code) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMag[code & 7u];
  return (code & 8u) ? m * -1.0f : m;
}

// NVFP4's per-block decode factor D from the decoded E4M3 block scale and the copy's global amax (SPEC §4.6, issue
// 19): TE's fl(fl(sf * amax) * fl(1/2688)) wherever that is finite and the scale the quantizer used, else the
// reciprocal of the quantizer's multiplier: fl(sf * S_dec) (S_dec = fl(1 / S_enc), S_enc = min(fl(2688 / amax),
// FLT_MAX), 1 for amax 0 or Inf), 2^-128 where that multiplier was clamped to FLT_MAX, 0 where sf = 0.
float nvfp4_factor(float sf, float amax) {
  const float te_d = (sf * amax) * (1.0f / 2688.0f);
  float s_enc = 2688.0f / amax;
  const bool regular = amax > 0.0f && std::isfinite(s_enc) && s_enc > 0.0f;
  s_enc = (amax == 0.0f || s_enc == 0.0f) ? 1.0f : (s_enc > kFloatMax ? kFloatMax : s_enc);
  const float y = sf * (1.0f / s_enc);
  const bool enc_clamped = std::isinf(1.0f / y);
  const float ours = sf == 0.0f ? 0.0f : (enc_clamped ? 0x1p-128f : y);
  return regular && !enc_clamped && std::isfinite(te_d) ? te_d : ours;
}

}  // namespace

const FormatInfo& format_info(Format f) { return kRows[int(format_of(int(f)))]; }

Format format_of(int id) {
  if (id < 0 || id >= kFormatCount) {
    core_fail("format id must be 0 (plain), 1 (FP8 per tensor), 2 (MXFP8), 3 (NVFP4), 4 (FP8 block 1x128) or 5 "
              "(FP8 block 128x128), got " + std::to_string(id));
  }
  return static_cast<Format>(id);
}

std::vector<float> format_decode(Format f, bool columnwise, DType code_type, const uint8_t* codes, size_t n_codes,
                                 const uint8_t* scales, size_t n_scale_bytes, float global_amax, int64_t rows,
                                 int64_t cols) {
  const FormatInfo& info = format_info(f);
  const CopyRule& c = columnwise ? info.rule.col : info.rule.row;
  const std::string what = std::string("format_decode (") + info.name + (columnwise ? ", columnwise" : ", rowwise");
  if (info.decode == DecodeRule::kNone || !c.present) core_fail(what + "): nothing to decode");
  bool type_ok = false;
  for (DType t : info.elem_types) type_ok = type_ok || t == code_type;
  if (!type_ok) core_fail(what + "): code type " + std::to_string(int(code_type)) + " is not one of the format's");
  if (rows < 0 || cols < 0) core_fail(what + "): negative shape");
  const int64_t epb = info.rule.elems_per_byte;
  const CopyShapes ds = format_data_shapes(f, rows, cols);
  const Dims2 d = columnwise ? ds.col : ds.row;
  const Dims2 s = copy_scale_shape(c, rows, cols);
  const size_t scale_size = info.scale_type == DType::kFloat32 ? 4 : 1;
  if (n_codes != size_t(d.r * d.c) || n_scale_bytes != size_t(s.r * s.c) * scale_size) {
    core_fail(what + "): needs " + std::to_string(d.r * d.c) + " code bytes and " +
              std::to_string(size_t(s.r * s.c) * scale_size) + " scale bytes, got " + std::to_string(n_codes) +
              " and " + std::to_string(n_scale_bytes));
  }
  const bool e4m3 = code_type == DType::kFloat8E4M3;
  const int64_t R = d.r, C = d.c * epb;  // the stored matrix, unpacked
  std::vector<float> out(size_t(R * C));
  for (int64_t i = 0; i < R; ++i) {
    for (int64_t j = 0; j < C; ++j) {
      const int64_t r = c.transposed ? j : i, k = c.transposed ? i : j;  // the element's [M, K] coordinates
      int64_t at = 0;
      if (c.scale_rank == 2) {
        const int64_t a = (c.scale[0].src == 0 ? r : k) / c.scale[0].block;
        const int64_t b = (c.scale[1].src == 0 ? r : k) / c.scale[1].block;
        at = a * s.c + b;
      }
      const uint8_t byte = codes[i * d.c + j / epb];
      float factor, value;
      if (info.scale_type == DType::kFloat32) {
        float sv;
        std::memcpy(&sv, scales + at * 4, 4);
        factor = sv;
      } else if (info.decode == DecodeRule::kE8m0Block) {
        factor = e8m0_to_float(scales[at]);
      } else {  // NVFP4: an E4M3 block scale and the global amax
        factor = nvfp4_factor(fp8_to_float(scales[at], true), global_amax);
      }
      value = epb == 2 ? e2m1_value(j % 2 ? byte >> 4 : byte & 0xFu) : fp8_to_float(byte, e4m3);
      out[size_t(i * C + j)] = value * factor;
    }
  }
  return out;
}

}  // namespace te
