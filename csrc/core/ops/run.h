// Running a plan (plan.h): the fusion-path switch and the kernel launches of the activation / cast family, into
// buffers the frontend allocated from the plan. Invariant: nothing here allocates or synchronizes; every launch and
// memset goes to ctx.stream (CUDA) or through ctx.parallel_for (CPU), so a call can be captured in a CUDA graph or
// an XLA command buffer. Temporaries are carved from the one workspace.
#pragma once

#include "plan.h"

// Runs cuda_call on a CUDA context and cpu_call otherwise; a build without CUDA kernels refuses a CUDA context with
// one message. Shared by the launchers of the op families (run.cpp, norm_op.cpp).
#if defined(TE_WITH_CUDA)
#define TE_ON_DEVICE(ctx, cuda_call, cpu_call) \
  do {                                         \
    if ((ctx).cuda) {                          \
      cuda_call;                               \
    } else {                                   \
      cpu_call;                                \
    }                                          \
  } while (0)
#else
#define TE_ON_DEVICE(ctx, cuda_call, cpu_call) \
  do {                                         \
    if ((ctx).cuda) ::te::ops::no_cuda();      \
    cpu_call;                                  \
  } while (0)
#endif

namespace te {
namespace ops {

// The buffers of one call: the contiguous input (and grad), one pointer per present piece of the plan (shapes and
// dtypes as planned; absent pieces are ignored), and the workspace.
struct ActIO {
  const void* x = nullptr;
  const void* grad = nullptr;
  void* out[kNumPieces] = {};
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

// The workspace bytes run_act needs for these buffers (<= plan.workspace_bytes): NVFP4's fused CUDA path, taken only
// for aligned buffers, needs no temporary.
int64_t workspace_bytes(const ActPlan& plan, const ActIO& io);

void run_act(const ActPlan& plan, const ActIO& io, const ExecCtx& ctx);

// amax[0] = max |x| (NaN ignored) over a contiguous float32/float16/bfloat16 tensor; amax is zeroed first.
void compute_amax(const TensorView& x, float* amax, const ExecCtx& ctx);

}  // namespace ops
}  // namespace te
