// Input side of the activation kernels: the op on one chunk of 8 positions (eval8), computed by the functor or
// looked up in exact shared-memory tables of it for bf16 inputs (LutPlan, lut_fill, the split bf16 table), and
// rnd_in of 8 values (round8_in).
// Invariant: a table holds exactly what the functor returns (or its rnd_in), and a chunk with any input outside a
// table takes the computed path, so tabulated and computed values have the same bits.
#pragma once

#include <type_traits>

#include "../rules/cuda_utils.cuh"
#include "activation.h"

namespace te {
namespace act_cuda {

// dbias (column sums of the op's values) exists for unary backward ops and the plain cast (bgrad_quantize).
template <class Op, bool kBwd> constexpr bool act_has_dbias() {
  return !Op::kGated && (kBwd || std::is_same<typename Op::Fn, Identity>::value);
}

// ---- Exact lookup tables for bf16 inputs ----------------------------------------------------------------------
// A bf16 input has 65536 possible values; for the functors that cost an exp and a reciprocal (kTabulate), a block
// fills shared-memory tables of F::fwd / F::bwd at every bf16 of magnitude in [2^-25, 2^7) (bit patterns
// 0x3300..0x42FF and their negatives: 4096 entries per sign) by calling the functor, then looks values up instead
// of recomputing them. A chunk with any input outside the table (zeros, tiny, huge, Inf/NaN) takes the computed
// path. The tables hold exactly what the functor returns, so the bytes do not change.
// Table layout (bytes): [positive 16 KB | negative 16 KB] per table; the bwd table follows the fwd one.
constexpr uint32_t kLutLo = 0x3300u;          // bf16 bits of 2^-25
constexpr uint32_t kLutPerSign = 0x1000u;     // 32 binades x 128 mantissas
constexpr uint32_t kLutEntries = 2u * kLutPerSign;
constexpr uint32_t kLutTableBytes = kLutEntries * 4u;

// Which tables an op needs: fwd for forward and for the gated backward (d_b), bwd for every backward.
// kRnd: the caller wants rnd_in of the op's value (SPEC §5.1: MXFP8 and NVFP4 block amaxes); for a unary forward
// op that value is rnd_in(fwd(a)) itself, so the fwd table holds it already rounded (kRoundedFwd) and a lookup
// needs no rounding.
template <class Op, bool kBwd, bool kRnd = false> struct LutPlan {
  static constexpr bool kFwd = !kBwd || Op::kGated;
  static constexpr bool kBwdTab = kBwd;
  static constexpr bool kRoundedFwd = kRnd && !kBwd && !Op::kGated;
  static constexpr uint32_t kBwdOffset = kFwd ? kLutTableBytes : 0u;
  static constexpr size_t kBytes = size_t(int(kFwd) + int(kBwdTab)) * kLutTableBytes;
};

template <class Op, bool kBwd, int kBlock, bool kRnd = false>
__device__ __forceinline__ void lut_fill(float* lut, const ActArgs& args) {
  using Plan = LutPlan<Op, kBwd, kRnd>;
  for (uint32_t i = threadIdx.x; i < kLutEntries; i += kBlock) {
    const uint16_t bits = uint16_t(((i / kLutPerSign) << 15) | (i % kLutPerSign + kLutLo));
    const float a = to_float(bf16_t{bits});
    if (Plan::kFwd) {
      const float f = Op::Fn::fwd(a, args);
      lut[i] = Plan::kRoundedFwd ? round_to<bf16_t>(f) : f;
    }
    if (Plan::kBwdTab) lut[Plan::kBwdOffset / 4u + i] = Op::Fn::bwd(a, args);
  }
  __syncthreads();
}

// Split bf16 table (kernels whose op values are rnd_in of a unary forward op, hence bf16 values): entry i of the
// layout above (sign i / 4096, magnitude index m = i % 4096) holds the bf16 bits of rnd_in(fwd) at byte 2 * m, plus
// kHalfLutNegOffset for the negative half, so that the offset of an in-range half d (see lut_offsets) is 2 * d with
// bit 15 moved to bit 16: one shift and one mask. The 56 KB between the halves are the caller's to use.
constexpr uint32_t kHalfLutNegOffset = 0x10000u;
constexpr uint32_t kHalfLutHalfBytes = 2u * kLutPerSign;  // 8 KB per sign

// Byte offsets into a table of the 8 bf16 of `v` (kSplit: the split bf16 table, else the FP32 layout above); false
// when any of them lies outside the table. Both halves of a 32-bit word at once: d = w - 0x33003300 leaves each
// in-range half in [0, 0x1000) (positive) or [0x8000, 0x9000) (negative), i.e. with bits 12-14 clear; an
// out-of-range low half may borrow from the high one, but then the chunk is rejected anyway.
template <bool kSplit = false>
__device__ __forceinline__ bool lut_offsets(const Vec8<bf16_t>& v, uint32_t (&off)[kVec]) {
  const uint32_t* w = reinterpret_cast<const uint32_t*>(&v);
  uint32_t any = 0u;
#pragma unroll
  for (int j = 0; j < kVec / 2; ++j) {
    const uint32_t d = w[j] - (kLutLo | (kLutLo << 16));
    any |= d;
    if constexpr (kSplit) {
      off[2 * j] = (d << 1) & 0x11FFEu;
      off[2 * j + 1] = (d >> 15) & 0x11FFEu;
    } else {
      off[2 * j] = ((d << 2) & 0x3FFCu) | ((d >> 1) & 0x4000u);
      off[2 * j + 1] = ((d >> 14) & 0x3FFCu) | ((d >> 17) & 0x4000u);
    }
  }
  return (any & 0x70007000u) == 0u;
}

template <class Op, int kBlock>
__device__ __forceinline__ void half_lut_fill(unsigned char* lut, const ActArgs& args) {
  static_assert(!Op::kGated, "the split bf16 table holds rnd_in of a unary forward op");
  for (uint32_t i = threadIdx.x; i < kLutEntries; i += kBlock) {
    const uint32_t neg = i / kLutPerSign, m = i % kLutPerSign;
    const float a = to_float(bf16_t{uint16_t((neg << 15) | (m + kLutLo))});
    *reinterpret_cast<uint16_t*>(lut + neg * kHalfLutNegOffset + 2u * m) = from_float<bf16_t>(Op::Fn::fwd(a, args)).bits;
  }
  __syncthreads();
}

__device__ __forceinline__ float lut_at(const float* lut, uint32_t byte_off) {
  return *reinterpret_cast<const float*>(reinterpret_cast<const char*>(lut) + byte_off);
}

// Rounds 8 values to InT and widens them again (rnd_in, SPEC §5.1); bf16 two at a time (one packed conversion
// per pair, the same RN rounding).
template <typename InT> __device__ __forceinline__ void round8_in(float (&v)[kVec]) {
  if constexpr (std::is_same<InT, bf16_t>::value) {
#pragma unroll
    for (int k = 0; k < kVec; k += 2) {
      const uint32_t w = float2_to_bf16x2(v[k], v[k + 1]);
      v[k] = bits_float(w << 16);
      v[k + 1] = bits_float(w & 0xFFFF0000u);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = round_to<InT>(v[k]);
  }
}

// The op on one chunk of 8 positions: out[0] (and out[1], the d_b half of a gated backward). With kLut the
// functor values come from the tables when every input of the chunk is covered. kRnd: the values come out rounded
// to the input dtype (rnd_in; from a unary forward op's pre-rounded table as they are). The caller fills the
// tables with the same kRnd.
template <class Op, bool kBwd, bool kLut, bool kRnd = false, typename InT>
__device__ __forceinline__ void eval8(const Vec8<InT>& va, const Vec8<InT>& vb, const Vec8<InT>& vg,
                                      const ActArgs& args, const float* lut, float (&out)[2][kVec]) {
  constexpr bool kGated = Op::kGated;
  constexpr int kOuts = (kBwd && kGated) ? 2 : 1;
  if constexpr (kLut) {
    using Plan = LutPlan<Op, kBwd, kRnd>;
    uint32_t off[kVec];
    if (lut_offsets(va, off)) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float b = kGated ? to_float(vb.e[k]) : 0.0f;
        const float fa = Plan::kFwd ? lut_at(lut, off[k]) : 0.0f;
        if constexpr (kBwd) {
          const float dfa = lut_at(lut, Plan::kBwdOffset + off[k]);
          act_backward_with<Op>(to_float(vg.e[k]), fa, dfa, b, args, out[0][k], out[1][k]);
        } else {
          out[0][k] = act_forward_with<Op>(fa, b, args);
        }
      }
      if constexpr (kRnd && !Plan::kRoundedFwd) {
#pragma unroll
        for (int h = 0; h < kOuts; ++h) round8_in<InT>(out[h]);
      }
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float a = to_float(va.e[k]);
    const float b = kGated ? to_float(vb.e[k]) : 0.0f;
    if constexpr (kBwd) {
      act_backward<Op>(to_float(vg.e[k]), a, b, args, out[0][k], out[1][k]);
    } else {
      out[0][k] = act_forward<Op>(a, b, args);
    }
  }
  if constexpr (kRnd) {
#pragma unroll
    for (int h = 0; h < kOuts; ++h) round8_in<InT>(out[h]);
  }
}

// n / d by a multiply (round-up method): m = ceil(2^(32+l) / d) with l = ceil(log2 d), split into its low word and

}  // namespace act_cuda
}  // namespace te
