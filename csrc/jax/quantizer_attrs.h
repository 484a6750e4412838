// The attributes the tej ops pass (struct attributes, decoded by XLA FFI) and their translation into the core's
// quantizer spec. The Python side builds the same dicts for `_ffi.plan_act`, so trace-time shapes and run-time
// buffers come from one translation.
#pragma once

#include "ffi_common.h"

namespace te_jax {

// tej.ScalingMode / tej.QuantizeLayout (transformer_engine_jax/quantizers.py): the names TE's JAX users know.
enum class ScalingMode : int64_t {
  kNoScaling = 0, kDelayedTensor = 1, kCurrentTensor = 2, kMxfp8_1d = 3, kNvfp4_1d = 4, kBlock1x128 = 5,
  kNvfp4_2d = 6, kBlock128x128 = 7,
};
enum class QuantizeLayout : int64_t { kRowwise = 0, kColwise = 1, kRowwiseColwise = 2 };

// The quantizer of a call. q_dtype: the core's DType code of the quantized data (7 E4M3, 8 E5M2, 10 E2M1);
// flags: SPEC §1.4 bits the mode does not imply (0 force_pow_2_scales, 2 stochastic rounding, 3 RHT, 4 random sign
// mask, 5 swizzled scales). The halves of a call on a shard of a tensor (transformer_engine_jax/sharding.py):
// amax_only: the call returns only the amax its current scaling or NVFP4 cast would take (te::ops::PlanOptions);
// amax_given: current scaling and NVFP4 cast with the amax argument (that amax reduced over the mesh) instead of
// taking their own; dbias_fp32: dbias comes back as FP32 column sums, to be added over the mesh and rounded once.
struct QuantizerAttrs {
  int64_t scaling_mode;
  int64_t q_dtype;
  int64_t q_layout;
  int64_t flags;
  float amax_epsilon;
  bool amax_given;
  bool amax_only;
  bool dbias_fp32;
};

// Clamped SwiGLU's parameters (SPEC §3.3); the other activations ignore them.
struct ActParams {
  float limit;
  float alpha;
  float offset;
};

#if defined(TE_WITH_CUDA)
// The fields of the struct attributes, for the initialize stage's memo (ffi_common.h InitKey).
inline void add_fields(InitKey& k, const QuantizerAttrs& q) {
  k.add(q.scaling_mode), k.add(q.q_dtype), k.add(q.q_layout), k.add(q.flags), k.add(q.amax_epsilon);
  k.add(q.amax_given), k.add(q.amax_only), k.add(q.dbias_fp32);
}
inline void add_fields(InitKey& k, const ActParams& p) { k.add(p.limit), k.add(p.alpha), k.add(p.offset); }
#endif

// The core's checked spec for these attributes; pointers are left for the handler to fill in.
te::ops::QuantSpec spec_of(const char* op, const QuantizerAttrs& q);

// The plan options of a tej call: XLA allocates every result with exactly its planned shape, current scaling's
// amax of the call comes back in the updated-amax result unless the amax was given, and amax_only / dbias_fp32 as
// asked.
te::ops::PlanOptions plan_options(const te::ops::QuantSpec& spec, const QuantizerAttrs& q);

// NVFP4 stochastic rounding's key from the rng argument (int64 [seed, offset], or the same 16 bytes as
// uint32[4]): read on the device when the call runs on CUDA (capture-safe), directly on the CPU.
te::RngState rng_of(const ffi::AnyBuffer& rng, const te::ops::ExecCtx& ctx);

}  // namespace te_jax

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(::te_jax::QuantizerAttrs, ::xla::ffi::StructMember<int64_t>("scaling_mode"),
                                      ::xla::ffi::StructMember<int64_t>("q_dtype"),
                                      ::xla::ffi::StructMember<int64_t>("q_layout"),
                                      ::xla::ffi::StructMember<int64_t>("flags"),
                                      ::xla::ffi::StructMember<float>("amax_epsilon"),
                                      ::xla::ffi::StructMember<bool>("amax_given"),
                                      ::xla::ffi::StructMember<bool>("amax_only"),
                                      ::xla::ffi::StructMember<bool>("dbias_fp32"));
XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(::te_jax::ActParams, ::xla::ffi::StructMember<float>("limit"),
                                      ::xla::ffi::StructMember<float>("alpha"),
                                      ::xla::ffi::StructMember<float>("offset"));
