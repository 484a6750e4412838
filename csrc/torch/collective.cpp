// The collective GEMM ops (csrc/core/ops/collective_gemm_op.h) on torch tensors: te::collective_gemm runs the core's
// ring over the process group torch.distributed registered under `group_name` (gloo on the CPU, NCCL on GPUs: its
// communicator, never a second one), te::collective_gemm_loopback over the one-GPU loopback transport. What stays
// here is torch's: the transport over c10d's send/recv, the output and workspace tensors, the current stream.
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "../core/ops/collective_gemm_op.h"
#include "bridge.h"

namespace te_torch {
namespace {

// The ring's exchanges as c10d point-to-point ops: on the CPU (gloo) a send and a receive whose Work the host waits
// on; on CUDA (NCCL) the pair coalesced into one group, whose Work makes the current stream wait (no host sync).
class C10dTransport : public te::comm::Transport {
 public:
  C10dTransport(c10::intrusive_ptr<c10d::ProcessGroup> pg, const at::TensorOptions& bytes)
      : pg_(std::move(pg)), bytes_(bytes) {}
  int rank() const override { return pg_->getRank(); }
  int size() const override { return pg_->getSize(); }

  void start(int step, const te::comm::Segment* segs, int n, int to, int from) override {
    std::vector<Tensor> send, recv;
    for (int i = 0; i < n; ++i) {
      send.push_back(at::from_blob(const_cast<void*>(segs[i].send), {int64_t(segs[i].bytes)}, bytes_));
      recv.push_back(at::from_blob(segs[i].recv, {int64_t(segs[i].bytes)}, bytes_));
    }
    const bool cuda = bytes_.device().is_cuda();
    if (step >= int(works_.size())) works_.resize(size_t(step) + 1);
    auto& works = works_[size_t(step)];
    if (cuda) pg_->startCoalescing(c10::DeviceType::CUDA);
    for (int i = 0; i < n; ++i) {
      std::vector<Tensor> s{send[i]}, r{recv[i]};
      auto ws = pg_->send(s, to, step * 4 + i);
      auto wr = pg_->recv(r, from, step * 4 + i);
      if (!cuda) {
        works.push_back(ws);
        works.push_back(wr);
      }
    }
    if (cuda) works.push_back(pg_->endCoalescing(c10::DeviceType::CUDA));
  }

  // NCCL: the exchanges are ordered on the process group's stream, so all of a call's may be in flight.
  bool pipelined() const override { return bytes_.device().is_cuda(); }
  void wait_for(int step) override {
    if (step < 0 || step >= int(works_.size())) return;
    for (auto& w : works_[size_t(step)]) w->wait();
    works_[size_t(step)].clear();
  }
  void wait() override {
    for (int step = 0; step < int(works_.size()); ++step) wait_for(step);
    works_.clear();
  }
  int default_sm_margin() const override { return bytes_.device().is_cuda() ? te::comm::kNcclSmMargin : 0; }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  at::TensorOptions bytes_;
  std::vector<std::vector<c10::intrusive_ptr<c10d::Work>>> works_;  // per exchange
};

te::ops::CollectiveOperand operand(const Tensor& t, const c10::optional<Tensor>& scale_inv, int64_t code,
                                   const char* name, const char* op) {
  te::ops::CollectiveOperand o;
  o.data.present = true;
  o.data.contiguous = t.is_contiguous();
  o.data.v = view_of(t, storage_dtype(t, name, op), op);  // the core checks it against `code`
  o.dtype_code = code;
  if (scale_inv.has_value()) {
    TORCH_CHECK_VALUE(scale_inv->scalar_type() == at::kFloat && scale_inv->numel() == 1 && scale_inv->device() == t.device(),
                      op, ": ", name, "_scale_inv must be a float32 [1] on ", t.device().str());
    o.scale_inv.present = true;
    o.scale_inv.v = view_of(*scale_inv, te::DType::kFloat32, op);
  }
  return o;
}

// The op body over any transport: plan, outputs (d, and the gathered x and its scales when asked), workspace, run.
template <class MakeTransport>
std::tuple<Tensor, Tensor, Tensor> run(const char* op, const Tensor& x_in, const c10::optional<Tensor>& x_scale_inv,
                                       int64_t x_dtype, const Tensor& w_in, const c10::optional<Tensor>& w_scale_inv,
                                       int64_t w_dtype, int64_t kind, int64_t rank, int64_t tp, int64_t out_dtype,
                                       bool overlap, bool use_split_accumulator, bool return_gathered,
                                       int64_t sm_margin, MakeTransport make_transport) {
  std::tuple<Tensor, Tensor, Tensor> result;
  with_torch_errors([&] {
    const Tensor x = x_in.contiguous(), w = w_in.contiguous();
    TORCH_CHECK_VALUE(w.device() == x.device(), op, ": w is on ", w.device().str(), " but x is on ", x.device().str());
    te::ops::CollectiveGemmRequest r;
    r.op = op;
    r.kind = te::ops::CollectiveKind(kind);
    r.x = operand(x, x_scale_inv, x_dtype, "x", op);
    r.w = operand(w, w_scale_inv, w_dtype, "w", op);
    r.d_dtype = out_dtype;
    r.tp = int(tp);
    r.rank = int(rank);
    r.overlap = overlap;
    r.use_split_accumulator = use_split_accumulator;
    r.sm_margin = int(sm_margin);
    // fp32 operands follow torch's matmul precision, as tex.general_gemm does
    r.allow_tf32 = at::globalContext().float32MatmulPrecision() != at::Float32MatmulPrecision::HIGHEST;
#if defined(TE_WITH_CUDA)
    const c10::cuda::OptionalCUDAGuard guard(x.is_cuda() ? c10::optional<c10::Device>(x.device()) : c10::nullopt);
#endif
    const te::ops::ExecCtx ctx = exec_ctx(x);
    auto transport = make_transport(x, ctx);
    te::ops::resolve_transport(r, *transport);
    const te::ops::CollectiveGemmPlan plan = te::ops::plan_collective_gemm(r, ctx);
    Tensor d = new_empty_in_guard(c10::IntArrayRef(plan.d_shape.dims, 2),
                                  x.options().dtype(scalar_type_of(plan.d_dtype)));
    Tensor gathered, gathered_scale;
    te::ops::CollectiveGemmIO io;
    if (return_gathered && r.kind == te::ops::CollectiveKind::kAllGather) {
      gathered = new_empty_in_guard(c10::IntArrayRef(plan.gathered_shape.dims, 2), x.options());
      io.gathered = gathered.data_ptr();
      if (x_scale_inv.has_value()) {
        gathered_scale = new_empty_in_guard({tp}, x.options().dtype(at::kFloat));
        io.gathered_scale_inv = gathered_scale.data_ptr<float>();
      }
    }
    Tensor ws = new_empty_in_guard({plan.workspace_bytes}, x.options().dtype(at::kByte));
    io.x = x.data_ptr();
    io.x_scale_inv = x_scale_inv.has_value() ? x_scale_inv->data_ptr<float>() : nullptr;
    io.w = w.data_ptr();
    io.w_scale_inv = w_scale_inv.has_value() ? w_scale_inv->data_ptr<float>() : nullptr;
    io.d = d.data_ptr();
    io.workspace = ws.data_ptr();
    io.workspace_bytes = plan.workspace_bytes;
#if defined(TE_WITH_CUDA)
    if (x.is_cuda()) {
      io.lt_workspace = at::cuda::getCUDABlasLtWorkspace();
      io.lt_workspace_bytes = int64_t(at::cuda::getCUDABlasLtWorkspaceSize());
    }
#endif
    te::ops::run_collective_gemm(plan, io, *transport, ctx);
    transport->wait();  // nothing in flight (the schedule's last exchange was waited on; a no-op then)
    result = {d, gathered.defined() ? gathered : Tensor(), gathered_scale.defined() ? gathered_scale : Tensor()};
  });
  return result;
}

// te::collective_gemm: the ring over torch.distributed's group `group_name`; the rank and size are the group's.
std::tuple<Tensor, Tensor, Tensor> collective_gemm(const Tensor& x, const c10::optional<Tensor>& x_scale_inv,
                                                   int64_t x_dtype, const Tensor& w,
                                                   const c10::optional<Tensor>& w_scale_inv, int64_t w_dtype,
                                                   int64_t kind, c10::string_view group_name, int64_t out_dtype,
                                                   bool overlap, bool use_split_accumulator, bool return_gathered,
                                                   int64_t sm_margin, c10::IntArrayRef window) {
  const char* op = kind == 1 ? "all_gather_gemm" : "gemm_reduce_scatter";
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  with_torch_errors([&] { pg = c10d::resolve_process_group(std::string(group_name)); });
  const int size = pg->getSize();
  if (!window.empty()) {
    TORCH_CHECK_VALUE(x.is_cuda() && te::ops::copy_engine_serves(te::ops::CollectiveKind(kind)), op,
                      ": the copy-engine window serves the CUDA reduce-scatter only; got a ", x.device().str(),
                      kind == 1 ? " all-gather" : " reduce-scatter");
    TORCH_CHECK_VALUE(int64_t(window.size()) == 1 + size, op, ": window holds [bytes, one base per rank]: ",
                      1 + size, " values for a group of ", size, ", got ", window.size());
  }
  return run(op, x, x_scale_inv, x_dtype, w, w_scale_inv, w_dtype, kind, pg->getRank(), size, out_dtype, overlap,
             use_split_accumulator, return_gathered, sm_margin,
             [&](const Tensor& ref, const te::ops::ExecCtx& ctx) -> std::unique_ptr<te::comm::Transport> {
#if defined(TE_WITH_CUDA)
               if (!window.empty()) {
                 std::vector<uint64_t> bases(window.begin() + 1, window.end());
                 te::comm::CopyEngineWindow w;
                 w.bytes = window[0];
                 w.bases = bases.data();
                 return std::make_unique<te::comm::CopyEngineTransport>(pg->getRank(), size, ctx.stream, w);
               }
#endif
               (void)ctx;
               return std::make_unique<C10dTransport>(pg, ref.options().dtype(at::kByte));
             });
}

#if defined(TE_WITH_CUDA)
// te::collective_gemm_loopback: rank `rank` of `tp` simulated on one GPU. peers: all-gather, the whole x
// [tp·m, k] (each exchange copies the chunk it brings) with peers_scale_inv [tp] for FP8; reduce-scatter, the
// simulated peers' FP32 partials of this rank's chunk that exchanges 0 … tp − 2 bring, [tp − 1, m, n].
std::tuple<Tensor, Tensor, Tensor> collective_gemm_loopback(
    const Tensor& x, const c10::optional<Tensor>& x_scale_inv, int64_t x_dtype, const Tensor& w,
    const c10::optional<Tensor>& w_scale_inv, int64_t w_dtype, int64_t kind, int64_t rank, int64_t tp,
    const Tensor& peers, const c10::optional<Tensor>& peers_scale_inv, int64_t out_dtype, bool overlap,
    bool use_split_accumulator, bool return_gathered, int64_t sm_margin) {
  const char* op = kind == 1 ? "all_gather_gemm (loopback)" : "gemm_reduce_scatter (loopback)";
  TORCH_CHECK_VALUE(peers.is_cuda() && peers.is_contiguous() && peers.device() == x.device(), op,
                    ": peers must be a contiguous tensor on ", x.device().str());
  return run(op, x, x_scale_inv, x_dtype, w, w_scale_inv, w_dtype, kind, rank, tp, out_dtype, overlap,
             use_split_accumulator, return_gathered, sm_margin, [&](const Tensor&, const te::ops::ExecCtx& ctx) {
               te::comm::LoopbackSource src[2];
               const bool ag = kind == 1;
               src[0].base = peers.data_ptr();
               src[0].stride = size_t(peers.nbytes() / (ag ? tp : std::max<int64_t>(tp - 1, 1)));
               src[0].by_chunk = ag;
               int n = 1;
               if (peers_scale_inv.has_value()) {
                 src[1].base = peers_scale_inv->data_ptr();
                 src[1].stride = sizeof(float);
                 src[1].by_chunk = true;
                 n = 2;
               }
               return std::make_unique<te::comm::LoopbackTransport>(int(rank), int(tp), ctx.stream, src, n);
             });
}
#endif

// The transport decision and the window size, the core's (collective_gemm_op.h): torch asks instead of deciding.
std::string collective_transport(bool node_local) {
  return with_torch_errors(
      [&] { return std::string(te::ops::transport_name(te::ops::collective_transport(node_local))); });
}

int64_t collective_window_bytes(int64_t kind, int64_t rows, int64_t n, int64_t tp) {
  return with_torch_errors(
      [&] { return te::ops::collective_window_bytes(te::ops::CollectiveKind(kind), rows, n, int(tp)); });
}

}  // namespace

// No tensor arguments: one kernel for every dispatch key.
TORCH_LIBRARY_IMPL(te, CompositeImplicitAutograd, m) {
  m.impl("collective_transport", &collective_transport);
  m.impl("collective_window_bytes", &collective_window_bytes);
}

static void collective_impls(torch::Library& m) { m.impl("collective_gemm", &collective_gemm); }
TE_IMPL_CPU_AND_CUDA(collective_impls)

#if defined(TE_WITH_CUDA)
TORCH_LIBRARY_IMPL(te, CUDA, m) {
  m.impl("collective_gemm_loopback", &collective_gemm_loopback);
}
#endif

}  // namespace te_torch
