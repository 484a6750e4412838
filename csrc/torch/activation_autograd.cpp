// Autograd of the plain activation op `te::act` (SPEC §1.4: backward is the matching `te::dact`).
//
// Registered for the Autograd key here rather than with torch.library.register_autograd in Python: that
// registration installs a Python autograd kernel which every call goes through, requires_grad or not (about 20 us
// of host time per call on a 2-core CPU host, more than the rest of a small call). Here a call that builds no graph
// redispatches straight to the CPU/CUDA kernel, and one that does goes through a torch::autograd::Function, which
// torch.compile traces like any other autograd kernel.
#include <torch/autograd.h>

#include "bridge.h"

namespace te_torch {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using ActSig = Tensor(const Tensor&, int64_t, double, double, double);
using DactSig = Tensor(const Tensor&, const Tensor&, int64_t, double, double, double);

// Looked up once: the schemas are defined in registration.cpp, loaded with this library.
const c10::TypedOperatorHandle<ActSig>& act_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("te::act", "").typed<ActSig>();
  return op;
}

const c10::TypedOperatorHandle<DactSig>& dact_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("te::dact", "").typed<DactSig>();
  return op;
}

Tensor act_below_autograd(const Tensor& x, int64_t act, double limit, double alpha, double offset) {
  const at::AutoDispatchBelowADInplaceOrView guard;
  return act_op().call(x, act, limit, alpha, offset);
}

class ActFunction : public torch::autograd::Function<ActFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, int64_t act, double limit, double alpha,
                        double offset) {
    ctx->save_for_backward({x});
    ctx->saved_data["act"] = act;
    ctx->saved_data["limit"] = limit;
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["offset"] = offset;
    return act_below_autograd(x, act, limit, alpha, offset);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Tensor x = ctx->get_saved_variables()[0];
    const auto& d = ctx->saved_data;
    const Tensor dx = dact_op().call(grads[0].contiguous(), x, d.at("act").toInt(), d.at("limit").toDouble(),
                                     d.at("alpha").toDouble(), d.at("offset").toDouble());
    return {dx, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

Tensor act_autograd(const Tensor& x, int64_t act, double limit, double alpha, double offset) {
  if (!(at::GradMode::is_enabled() && x.requires_grad())) return act_below_autograd(x, act, limit, alpha, offset);
  return ActFunction::apply(x, act, limit, alpha, offset);
}

}  // namespace

TORCH_LIBRARY_IMPL(te, Autograd, m) { m.impl("act", &act_autograd); }

}  // namespace te_torch
