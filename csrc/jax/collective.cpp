// XLA FFI handler of the collective GEMM (collective.h): te_collective_gemm, CUDA only (on the CPU the JAX frontend
// runs the same ring as ppermutes inside shard_map: transformer_engine_jax/collective.py).
//
// Arguments, results and attributes, in the order the Python call passes them:
//   args     x x_scale_inv w w_scale_inv   (one rank's operands; *_scale_inv f32[1] for FP8 per tensor, else empty)
//   results  out (AG [tp·m, n], RS [m, n]); gathered (AG with keep_gathered: [tp·m, k], else empty); workspace (uint8)
//   attrs    kind comm tp overlap use_split_accumulator sm_margin keep_gathered w_kn copy_engine (collective.h
//            CollectiveAttrs)
//
// The rank is the executing device's in the communicator `comm` (made by the frontend before the program runs). A
// reduce-scatter traced with copy_engine runs over the ring's copy-engine windows (comm/local_windows.h: one process
// driving every member), else over NCCL; the workspace is planned for NCCL's (the larger). The initialize
// stage records the schedule's kernels with a transport that moves nothing (a throwaway capture must not record NCCL
// calls whose peers do not capture) and creates the cuBLASLt handle; execute runs the ring. The handler is not
// declared command-buffer compatible: XLA runs it as a thunk of its own, next to its own collectives.
#include "collective.h"

#include "../core/comm/nccl_comm.h"
#if defined(TE_WITH_CUDA)
#include "../core/comm/local_windows.h"
#endif
#include "../core/gemm/gemm.h"

namespace te_jax {

te::ops::CollectiveGemmRequest collective_request(const CollectiveInputs& in, const CollectiveAttrs& at, int rank,
                                                  te::DType out_dtype) {
  const auto operand = [](const te::ops::TensorView& data, const te::ops::TensorView& scale_inv) {
    te::ops::CollectiveOperand o;
    o.data.present = true;
    o.data.contiguous = true;
    o.data.v = data;
    o.dtype_code = int64_t(data.dtype);
    o.scale_inv.present = scale_inv.shape.numel() > 0;
    o.scale_inv.v = scale_inv;
    return o;
  };
  te::ops::CollectiveGemmRequest r;
  r.op = at.kind == int64_t(te::ops::CollectiveKind::kReduceScatter) ? "te_collective_gemm (reduce-scatter)"
                                                                      : "te_collective_gemm (all-gather)";
  r.kind = te::ops::CollectiveKind(at.kind);
  r.x = operand(in.x, in.x_scale_inv);
  r.w = operand(in.w, in.w_scale_inv);
  r.d_dtype = int64_t(out_dtype);
  r.tp = int(at.tp);
  r.rank = rank;
  r.overlap = at.overlap;
  r.use_split_accumulator = at.use_split_accumulator;
  r.sm_margin = int(at.sm_margin);
  r.w_kn = at.w_kn;
  return r;
}

int64_t collective_workspace_bytes(const te::ops::CollectiveGemmPlan& plan) {
  return plan.workspace_bytes + te::ops::kLtWorkspaceBytes + te::ops::kWorkspaceAlign;
}

#if defined(TE_WITH_CUDA)
namespace {

using Buf = ffi::AnyBuffer;
using Ret = ffi::Result<ffi::AnyBuffer>;

int current_device() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) te::core_fail("te_collective_gemm: cudaGetDevice failed");
  return device;
}

// One rank's ring: `transport` is NCCL's (execute) or one that moves nothing (initialize).
void run(cudaStream_t stream, te::comm::Transport& transport, Buf x, Buf xs, Buf w, Buf ws, Ret out, Ret gathered,
         Ret workspace, const CollectiveAttrs& at) {
  const char* op = kCollectiveGemmOp;
  if (transport.size() != at.tp) {
    te::fail(te::ErrorKind::kValue, te::ops::msg(op, ": the communicator's ring has ", te::ops::str(transport.size()),
                                            " ranks but the call was traced for tp = ", te::ops::str(int(at.tp))));
  }
  const CollectiveInputs in{view_of(x, op, "x"), view_of(xs, op, "x_scale_inv"), view_of(w, op, "w"),
                            view_of(ws, op, "w_scale_inv")};
  const te::ops::ExecCtx ctx = cuda_ctx(stream);
  te::ops::CollectiveGemmRequest r = collective_request(in, at, transport.rank(), view_of(*out, op, "out").dtype);
  te::ops::resolve_transport(r, transport);
  const te::ops::CollectiveGemmPlan plan = te::ops::plan_collective_gemm(r, ctx);
  const int64_t need = collective_workspace_bytes(plan);
  if (int64_t(workspace->size_bytes()) < need) {
    te::fail(te::ErrorKind::kValue,
             te::ops::msg(op, ": the workspace has ", te::ops::str(int64_t(workspace->size_bytes())),
                          " bytes, the plan needs ", te::ops::str(need)));
  }
  char* base = static_cast<char*>(te::gemm_align_workspace(workspace->untyped_data()));
  te::ops::CollectiveGemmIO io;
  io.x = x.untyped_data();
  io.x_scale_inv = r.x.scale_inv.present ? static_cast<const float*>(xs.untyped_data()) : nullptr;
  io.w = w.untyped_data();
  io.w_scale_inv = r.w.scale_inv.present ? static_cast<const float*>(ws.untyped_data()) : nullptr;
  io.d = out->untyped_data();
  io.gathered = at.keep_gathered ? gathered->untyped_data() : nullptr;
  io.lt_workspace = base;
  io.lt_workspace_bytes = te::ops::kLtWorkspaceBytes;
  io.workspace = base + te::ops::kLtWorkspaceBytes;
  io.workspace_bytes = plan.workspace_bytes;
  te::ops::run_collective_gemm(plan, io, transport, ctx);
}

ffi::Error execute(cudaStream_t stream, Buf x, Buf xs, Buf w, Buf ws, Ret out, Ret gathered, Ret workspace,
                   int64_t kind, int64_t comm, int64_t tp, bool overlap, bool split, int64_t sm_margin,
                   bool keep_gathered, bool w_kn, bool copy_engine) {
  return guarded([&] {
    const CollectiveAttrs at{kind, comm, tp, overlap, split, sm_margin, keep_gathered, w_kn, copy_engine};
    // the reduce-scatter over the ring's copy-engine windows when the call was traced for them (the frontend made
    // them for every member at once), else NCCL
    std::unique_ptr<te::comm::Transport> t;
    if (copy_engine) {
      if (!te::ops::copy_engine_serves(te::ops::CollectiveKind(kind))) {
        te::fail(te::ErrorKind::kValue, "te_collective_gemm: copy_engine serves the reduce-scatter only");
      }
      t = te::comm::local_window_transport(comm, current_device(), stream);
      if (!t) {
        te::fail(te::ErrorKind::kValue, te::ops::msg("te_collective_gemm: the call was traced for the copy engine "
                                                     "but device ", te::ops::str(current_device()),
                                                     " has no window for its ring (local_windows_ensure first)"));
      }
    } else {
      t = te::comm::nccl_transport(comm, current_device(), stream);
    }
    run(stream, *t, x, xs, w, ws, out, gathered, workspace, at);
  });
}

ffi::Error initialize(cudaStream_t stream, Buf x, Buf xs, Buf w, Buf ws, Ret out, Ret gathered, Ret workspace,
                      int64_t kind, int64_t comm, int64_t tp, bool overlap, bool split, int64_t sm_margin,
                      bool keep_gathered, bool w_kn, bool copy_engine) {
  ffi::Error ready = guarded([] { te::cublaslt_prepare(); });
  if (!ready.success()) return ready;
  InitKey key;
  for (const Buf* b : {&x, &xs, &w, &ws}) key.add(*b);
  key.add(out);
  key.add(gathered);
  key.add(workspace);
  for (int64_t v : {kind, comm, tp, sm_margin}) key.add(v);
  for (bool v : {overlap, split, keep_gathered, w_kn, copy_engine}) key.add(v);
  return in_throwaway_capture(stream, key, [&] {
    return guarded([&] {
      const CollectiveAttrs at{kind, comm, tp, overlap, split, sm_margin, keep_gathered, w_kn, copy_engine};
      te::comm::NullTransport t(0, int(tp));
      run(stream, t, x, xs, w, ws, out, gathered, workspace, at);
    });
  });
}

template <class B> auto binding(B b) {
  return std::move(b)
      .template Ctx<ffi::PlatformStream<cudaStream_t>>()
      .template Arg<Buf>()
      .template Arg<Buf>()
      .template Arg<Buf>()
      .template Arg<Buf>()
      .template Ret<Buf>()
      .template Ret<Buf>()
      .template Ret<Buf>()
      .template Attr<int64_t>("kind")
      .template Attr<int64_t>("comm")
      .template Attr<int64_t>("tp")
      .template Attr<bool>("overlap")
      .template Attr<bool>("use_split_accumulator")
      .template Attr<int64_t>("sm_margin")
      .template Attr<bool>("keep_gathered")
      .template Attr<bool>("w_kn")
      .template Attr<bool>("copy_engine");
}

}  // namespace
}  // namespace te_jax

XLA_FFI_DEFINE_HANDLER_SYMBOL(TeCollectiveGemmCuda, te_jax::execute, te_jax::binding(xla::ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(TeCollectiveGemmCudaInit, te_jax::initialize,
                              te_jax::binding(xla::ffi::Ffi::Bind<xla::ffi::ExecutionStage::kInitialize>()));
#else
}  // namespace te_jax
#endif
