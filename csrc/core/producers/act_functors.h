// One functor per activation (SPEC §3.2-3.3). Each has fwd(x) and bwd(x) = act'(x); gated forms multiply by
// lin(b) (the linear half) and get d_b from dlin(b). Adding an activation: one functor here, one row in
// TE_FOR_EACH_ACTIVATION, one row in tests/ (and the Python table). All math is FP32, identical on host and device.
#pragma once

#include <type_traits>

#include "../rules/math.h"

namespace te {

// Runtime parameters; only clamped SwiGLU reads them (SPEC §3.3).
struct ActArgs {
  float limit = 7.0f;
  float alpha = 1.702f;
  float glu_linear_offset = 1.0f;
};

// Gated ops use b unchanged unless the functor says otherwise. kTabulate: fwd/bwd cost an exp and a
// reciprocal, so the CUDA kernels look them up for bf16 inputs in a table the functor itself fills (exact).
struct LinearGate {
  static constexpr bool kTabulate = false;
  TE_HD static float lin(float b, const ActArgs&) { return b; }
  TE_HD static float dlin(float, const ActArgs&) { return 1.0f; }
};

struct Identity : LinearGate {
  TE_HD static float fwd(float x, const ActArgs&) { return x; }
  TE_HD static float bwd(float, const ActArgs&) { return 1.0f; }
};

// Tanh-approximation GELU. fwd evaluates x*(0.5 + 0.5*tanh(u)) as the algebraically identical x*sigma(2u),
// u = x*(0.79788456 + 0.03567741*x^2) (the inner sum one FMA): one exp and one reciprocal, no cancellation for
// x < 0. The constants are doubled exactly, so the argument is 2u with u's roundings. bwd uses the derivative's own inner form
// v = 0.79788456*x*(1 + 0.044715*x^2), with 0.5(1+tanh v) = s and 1 - tanh^2 v = 4 s (1-s), s = sigma(2v).
struct Gelu : LinearGate {
  static constexpr bool kTabulate = true;
  TE_HD static float fwd(float x, const ActArgs&) {
    const float u2 = x * fma_f32(2.0f * 0.03567741f, x * x, 2.0f * 0.79788456f);
    return x * sigmoid_f32(u2);
  }
  TE_HD static float bwd(float x, const ActArgs&) {
    const float v = 0.79788456f * x * (1.0f + 0.044715f * x * x);
    const SigmoidPair sp = sigmoid_pair(2.0f * v);
    const float x2 = x * x;
    return 2.0f * x * sp.s * sp.one_minus_s * (0.79788456f + 0.1070322243f * x2) + sp.s;
  }
};

// Quick GELU: x * sigma(1.702 x).
struct QGelu : LinearGate {
  static constexpr bool kTabulate = true;
  TE_HD static float fwd(float x, const ActArgs&) { return x * sigmoid_f32(1.702f * x); }
  TE_HD static float bwd(float x, const ActArgs&) {
    const SigmoidPair sp = sigmoid_pair(1.702f * x);
    return 1.702f * x * sp.s * sp.one_minus_s + sp.s;
  }
};

// NaN propagates through relu/srelu (the comparison is written so that NaN takes the x branch); -0 -> +0.
struct Relu : LinearGate {
  TE_HD static float fwd(float x, const ActArgs&) { return !(x <= 0.0f) ? x : 0.0f; }
  TE_HD static float bwd(float x, const ActArgs&) { return x > 0.0f ? 1.0f : 0.0f; }
};

// Squared ReLU.
struct SRelu : LinearGate {
  TE_HD static float fwd(float x, const ActArgs&) { return !(x <= 0.0f) ? x * x : 0.0f; }
  TE_HD static float bwd(float x, const ActArgs&) { return !(x <= 0.0f) ? 2.0f * x : 0.0f; }
};

struct Silu : LinearGate {
  static constexpr bool kTabulate = true;
  TE_HD static float fwd(float x, const ActArgs&) { return x * sigmoid_f32(x); }
  TE_HD static float bwd(float x, const ActArgs&) {
    const SigmoidPair sp = sigmoid_pair(x);
    return x * sp.s * sp.one_minus_s + sp.s;
  }
};

// GLU's gate function is sigma itself. exp_f32 maps NaN to a number, so NaN is passed on explicitly here (the
// other functors multiply by x, which carries it).
struct Sigmoid : LinearGate {
  static constexpr bool kTabulate = true;
  TE_HD static float fwd(float x, const ActArgs&) { return is_nan(x) ? x : sigmoid_f32(x); }
  TE_HD static float bwd(float x, const ActArgs&) {
    const SigmoidPair sp = sigmoid_pair(x);
    return is_nan(x) ? x : sp.s * sp.one_minus_s;
  }
};

// GPT-OSS clamped SwiGLU (SPEC §3.3): a clamped above only, b clamped to [-L, L] then offset by c.
struct ClampedSilu {
  static constexpr bool kTabulate = true;
  TE_HD static float clamp_a(float a, float limit) { return a > limit ? limit : a; }
  TE_HD static float fwd(float a, const ActArgs& p) {
    const float ac = clamp_a(a, p.limit);
    return ac * sigmoid_f32(p.alpha * ac);
  }
  TE_HD static float bwd(float a, const ActArgs& p) {
    if (a > p.limit) return 0.0f;
    const SigmoidPair sp = sigmoid_pair(p.alpha * a);
    return sp.s + p.alpha * a * sp.s * sp.one_minus_s;
  }
  TE_HD static float lin(float b, const ActArgs& p) {
    const float bc = b > p.limit ? p.limit : (b < -p.limit ? -p.limit : b);
    return bc + p.glu_linear_offset;
  }
  TE_HD static float dlin(float b, const ActArgs& p) { return (b >= -p.limit && b <= p.limit) ? 1.0f : 0.0f; }
};

// An activation op: the functor and whether it is gated (input [.., 2H] -> output [.., H]).
template <class F, bool kGatedOp> struct ActOp {
  using Fn = F;
  static constexpr bool kGated = kGatedOp;
};

// The activation table: one row per activation, X(code, value, name, functor, gated, family, ...):
//   code     the ActKind enumerator;           value   TE's activation enum (kIdentity, 100, is ours: a plain cast);
//   name     te's Python op name (messages);   functor one of the structs above;
//   gated    input [.., 2H] -> output [.., H]; family  which CUDA translation units instantiate it
//                                                      (instances/act_<family>_{fwd,bwd}{,_mx,_nv}.cu: gelu, relu, silu).
// The enum, the known / gated checks, the names, the dispatch switch and the per-family CUDA instantiations all
// derive from it; extra arguments of TE_FOR_EACH_ACTIVATION are passed on to every X.
#define TE_FOR_EACH_ACTIVATION(X, ...)                                        \
  X(kGelu, 0, "gelu", Gelu, false, gelu, __VA_ARGS__)                         \
  X(kGeglu, 1, "geglu", Gelu, true, gelu, __VA_ARGS__)                        \
  X(kGlu, 2, "glu", Sigmoid, true, silu, __VA_ARGS__)                         \
  X(kSilu, 3, "silu", Silu, false, silu, __VA_ARGS__)                         \
  X(kSwiglu, 4, "swiglu", Silu, true, silu, __VA_ARGS__)                      \
  X(kRelu, 5, "relu", Relu, false, relu, __VA_ARGS__)                         \
  X(kReglu, 6, "reglu", Relu, true, relu, __VA_ARGS__)                        \
  X(kQgelu, 7, "qgelu", QGelu, false, gelu, __VA_ARGS__)                      \
  X(kQgeglu, 8, "qgeglu", QGelu, true, gelu, __VA_ARGS__)                     \
  X(kSrelu, 9, "srelu", SRelu, false, relu, __VA_ARGS__)                      \
  X(kSreglu, 10, "sreglu", SRelu, true, relu, __VA_ARGS__)                    \
  X(kClampedSwiglu, 11, "clamped_swiglu", ClampedSilu, true, silu, __VA_ARGS__) \
  X(kIdentity, 100, "identity", Identity, false, relu, __VA_ARGS__)

// The CUDA entry point of a kernel family over the table, inside namespace te: declares ns::launcher<ActOp<F,
// gated>, bwd> for every row (instantiated in the per-family .cu files) and defines
// `void entry(ActKind, bool backward, DType, const Params&, cudaStream_t)`, which dispatches through
// visit_activation. TE_ACT_CUDA_ENTRY(activation_cuda, act_cuda, launch_act, ActKernelParams).
#define TE_DECLARE_ACT_LAUNCHERS(code, value, name, F, gated, family, launcher, Params)     \
  extern template void launcher<ActOp<F, gated>, false>(DType, const Params&, cudaStream_t); \
  extern template void launcher<ActOp<F, gated>, true>(DType, const Params&, cudaStream_t);
#define TE_ACT_CUDA_ENTRY(entry, ns, launcher, Params)                                            \
  namespace ns {                                                                                  \
  TE_FOR_EACH_ACTIVATION(TE_DECLARE_ACT_LAUNCHERS, launcher, Params)                              \
  }                                                                                               \
  void entry(ActKind kind, bool backward, DType in_dtype, const Params& p, cudaStream_t s) {      \
    visit_activation(kind, backward, [&](auto op, auto bwd) {                                     \
      ns::launcher<decltype(op), decltype(bwd)::value>(in_dtype, p, s);                           \
    });                                                                                           \
  }

// The rows of one family only: TE_FOR_EACH_ACTIVATION_OF(gelu, X, args...) calls X(row..., args...) for the rows
// whose family is gelu. A new family adds its row and column to this 3 x 3 selector.
#define TE_ACT_FAMILY_gelu_gelu(...) __VA_ARGS__
#define TE_ACT_FAMILY_gelu_relu(...)
#define TE_ACT_FAMILY_gelu_silu(...)
#define TE_ACT_FAMILY_relu_gelu(...)
#define TE_ACT_FAMILY_relu_relu(...) __VA_ARGS__
#define TE_ACT_FAMILY_relu_silu(...)
#define TE_ACT_FAMILY_silu_gelu(...)
#define TE_ACT_FAMILY_silu_relu(...)
#define TE_ACT_FAMILY_silu_silu(...) __VA_ARGS__
#define TE_ACT_IF_FAMILY(code, value, name, F, gated, family, want, X, ...) \
  TE_ACT_FAMILY_##family##_##want(X(code, value, name, F, gated, family, __VA_ARGS__))
#define TE_FOR_EACH_ACTIVATION_OF(want, X, ...) TE_FOR_EACH_ACTIVATION(TE_ACT_IF_FAMILY, want, X, __VA_ARGS__)

// Activation codes follow TE's activation enum; kIdentity (ours) turns the activation kernels into plain casts.
enum class ActKind : int {
#define TE_ENUM_ROW(code, value, ...) code = value,
  TE_FOR_EACH_ACTIVATION(TE_ENUM_ROW)
#undef TE_ENUM_ROW
};

TE_HD bool act_is_gated(ActKind k) {
  switch (k) {
#define TE_GATED_CASE(code, value, name, F, gated, ...) case ActKind::code: return gated;
    TE_FOR_EACH_ACTIVATION(TE_GATED_CASE)
#undef TE_GATED_CASE
  }
  return false;
}

// te's Python op name of `k` ("gelu", "clamped_swiglu", "identity" for the plain cast), for messages; nullptr when
// `k` is not a known code.
inline const char* act_name(ActKind k) {
  switch (k) {
#define TE_NAME_CASE(code, value, name, ...) case ActKind::code: return name;
    TE_FOR_EACH_ACTIVATION(TE_NAME_CASE)
#undef TE_NAME_CASE
  }
  return nullptr;
}

inline bool act_is_known(int code) { return act_name(static_cast<ActKind>(code)) != nullptr; }

// The largest of TE's activation codes in the table (kIdentity, ours, aside): TE's codes are 0..act_max_te_code().
constexpr int act_max_te_code() {
  int m = 0;
#define TE_MAX_ROW(code, value, ...) if (value != int(ActKind::kIdentity) && value > m) m = value;
  TE_FOR_EACH_ACTIVATION(TE_MAX_ROW)
#undef TE_MAX_ROW
  return m;
}

// Runtime (kind, direction) -> compile time: calls visit(ActOp<F, gated>{}, std::bool_constant<backward>{}) for
// the functor of `kind`. The one dispatch switch the CPU and CUDA launchers of every kernel family go through.
template <class Visitor> void visit_activation(ActKind kind, bool backward, Visitor&& visit) {
  switch (kind) {
#define TE_VISIT_CASE(code, value, name, F, gated, ...)          \
  case ActKind::code:                                            \
    if (backward) {                                              \
      visit(ActOp<F, gated>{}, std::bool_constant<true>{});      \
    } else {                                                     \
      visit(ActOp<F, gated>{}, std::bool_constant<false>{});     \
    }                                                            \
    return;
    TE_FOR_EACH_ACTIVATION(TE_VISIT_CASE)
#undef TE_VISIT_CASE
  }
  core_fail("activation code " + std::to_string(int(kind)) + " is not known; accepted: 0.." +
            std::to_string(act_max_te_code()) + " (TE's enum)");
}

// Per-element math shared by the CPU and CUDA kernels. Forward: y = act(a) [* lin(b)].
// Backward: unary d = g * act'(x); gated d_a = (g * lin(b)) * act'(a), d_b = (g * act(a)) * dlin(b).
// The *_with forms take fa = F::fwd(a) and dfa = F::bwd(a) already evaluated (or looked up): one definition of
// the remaining operations and their order, so tabulated and computed paths give the same bits.
template <class Op> TE_HD float act_forward_with(float fa, float b, const ActArgs& p) {
  if constexpr (Op::kGated) {
    return fa * Op::Fn::lin(b, p);
  } else {
    return fa;
  }
}

template <class Op>
TE_HD void act_backward_with(float g, float fa, float dfa, float b, const ActArgs& p, float& da, float& db) {
  using F = typename Op::Fn;
  if constexpr (Op::kGated) {
    da = g * F::lin(b, p) * dfa;
    db = g * fa * F::dlin(b, p);
  } else {
    da = g * dfa;
    db = 0.0f;
  }
}

template <class Op> TE_HD float act_forward(float a, float b, const ActArgs& p) {
  return act_forward_with<Op>(Op::Fn::fwd(a, p), b, p);
}

template <class Op> TE_HD void act_backward(float g, float a, float b, const ActArgs& p, float& da, float& db) {
  using F = typename Op::Fn;
  const float fa = Op::kGated ? F::fwd(a, p) : 0.0f;
  act_backward_with<Op>(g, fa, F::bwd(a, p), b, p, da, db);
}

}  // namespace te
