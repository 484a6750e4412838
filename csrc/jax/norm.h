// The tej LayerNorm / RMSNorm calls as the core's requests (csrc/core/ops/norm_op.h), shared by the handlers
// (csrc/jax/norm.cpp, from XLA's buffers) and the trace-time planners (module.cpp, from shapes and dtypes), so both
// plan the same call. Op names are the torch frontend's (layernorm_fwd, rmsnorm_bwd, ...): both frontends' messages
// read alike.
#pragma once

#include "../core/ops/norm_op.h"
#include "ffi_common.h"

namespace te_jax {

// norm_type attribute (transformer_engine_jax/normalization.py NORM_TYPES): 0 layernorm, 1 rmsnorm; anything else
// raises kValue naming the accepted values.
te::NormKind norm_kind(int64_t code);

// The forward request: x [..., H], gamma [H], beta [H] (has_beta: LayerNorm); otype: the core's DType code of the
// plain output (x's dtype for tej's output; float32 for the FP32 y a sharded current-scaling call quantizes).
te::ops::NormFwdRequest norm_fwd_request(int64_t norm_type, bool zero_centered_gamma, double epsilon, int64_t otype,
                                         const te::ops::TensorView& x, const te::ops::TensorView& gamma,
                                         bool has_beta, const te::ops::TensorView& beta);

// The backward request: dz, x [..., H], mu (has_mu: LayerNorm) and rsigma FP32, gamma [H].
te::ops::NormBwdRequest norm_bwd_request(int64_t norm_type, bool zero_centered_gamma, const te::ops::TensorView& dz,
                                         const te::ops::TensorView& x, bool has_mu, const te::ops::TensorView& mu,
                                         const te::ops::TensorView& rsigma, const te::ops::TensorView& gamma);

}  // namespace te_jax
