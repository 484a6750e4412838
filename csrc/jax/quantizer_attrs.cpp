// tej's scaling modes and layouts -> the core's quantizer spec (quantizer_attrs.h).
#include "quantizer_attrs.h"

namespace te_jax {

te::ops::QuantSpec spec_of(const char* op, const QuantizerAttrs& q) {
  constexpr int64_t kTwoD = 1 << 1;
  int64_t kind = 0, block_dim = 1, flags = q.flags;
  switch (ScalingMode(q.scaling_mode)) {
    case ScalingMode::kNoScaling: kind = 0; break;
    case ScalingMode::kDelayedTensor: kind = 1; break;
    case ScalingMode::kCurrentTensor: kind = 2; break;
    case ScalingMode::kMxfp8_1d: kind = 3; break;
    case ScalingMode::kNvfp4_1d: kind = 4; break;
    case ScalingMode::kNvfp4_2d: kind = 4; flags |= kTwoD; break;
    case ScalingMode::kBlock1x128: kind = 5; break;
    case ScalingMode::kBlock128x128: kind = 5; block_dim = 2; flags |= kTwoD; break;
    default:
      te::fail(te::ErrorKind::kValue, std::string(op) + ": scaling_mode " + std::to_string(q.scaling_mode) +
                                          " is not known; accepted: 0 NO_SCALING, 1 DELAYED_TENSOR_SCALING, 2 "
                                          "CURRENT_TENSOR_SCALING, 3 MXFP8_1D_SCALING, 4 NVFP4_1D_SCALING, 5 "
                                          "BLOCK_SCALING_1x128, 6 NVFP4_2D_SCALING, 7 BLOCK_SCALING_128x128");
  }
  if (q.q_layout < 0 || q.q_layout > 2) {
    te::fail(te::ErrorKind::kValue, std::string(op) + ": q_layout " + std::to_string(q.q_layout) +
                                        " is not known; accepted: 0 ROWWISE, 1 COLWISE, 2 ROWWISE_COLWISE");
  }
  const bool rowwise = QuantizeLayout(q.q_layout) != QuantizeLayout::kColwise;
  const bool colwise = QuantizeLayout(q.q_layout) != QuantizeLayout::kRowwise;
  constexpr int64_t kRht = 1 << 3;
  if (kind == 4 && q.amax_given && colwise && (flags & kRht) != 0) {
    te::fail(te::ErrorKind::kNotImplemented, std::string(op) + ": NVFP4 with the random Hadamard transform takes its "
                                             "own amaxes (the columnwise one of the transformed values); a given amax "
                                             "is not supported, pass amax=None");
  }
  // Delayed scaling's scale and amax are always arguments here; current scaling's and NVFP4's amax only when given.
  return te::ops::make_spec(op, kind, q.q_dtype, rowwise, colwise, flags, double(q.amax_epsilon), block_dim,
                            kind == 1, kind == 1 || ((kind == 2 || kind == 4) && q.amax_given));
}

te::ops::PlanOptions plan_options(const te::ops::QuantSpec& spec, const QuantizerAttrs& q) {
  te::ops::PlanOptions opt;
  opt.exact_outputs = true;
  opt.current_amax_out = spec.kind == te::QuantKind::kFp8Current && !q.amax_given;
  opt.amax_only = q.amax_only;
  opt.dbias_fp32 = q.dbias_fp32;
  return opt;
}

te::RngState rng_of(const ffi::AnyBuffer& rng, const te::ops::ExecCtx& ctx) {
  // 16 bytes: int64 [seed, offset], or uint32 [4] holding the same little-endian words (JAX without x64 has no
  // int64 arrays).
  const bool ok = (rng.element_type() == ffi::DataType::S64 || rng.element_type() == ffi::DataType::U32) &&
                  rng.size_bytes() == 16;
  if (!ok) {
    te::fail(te::ErrorKind::kType, "NVFP4 stochastic rounding: the rng argument must be int64[2] or uint32[4] "
                                   "(seed, offset as two 64-bit words), got " + ffi_dtype_name(rng.element_type()) +
                                       " with " + std::to_string(rng.element_count()) + " elements");
  }
  const int64_t* key = static_cast<const int64_t*>(rng.untyped_data());
  te::RngState s;
  if (ctx.cuda) {
    s.seed_ptr = key;
    s.offset_ptr = key + 1;
  } else {
    s.seed = uint64_t(key[0]);
    s.offset = uint64_t(key[1]);
  }
  return s;
}

}  // namespace te_jax
