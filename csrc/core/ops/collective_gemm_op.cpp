// plan_collective_gemm and run_collective_gemm (collective_gemm_op.h).
#include "collective_gemm_op.h"

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>

#include "../comm/partial_sum.h"
#include "../gemm/gemm_epilogue.h"

#if defined(TE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace te {
namespace ops {
namespace {

// Each gathered chunk's scale_inv sits in a 16-byte slot: cuBLASLt wants its scale pointers 16-byte aligned.
constexpr int64_t kScaleSlot = 16;

int64_t align_up(int64_t v) { return (v + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

[[noreturn]] void fail_request(const CollectiveGemmRequest& r, ErrorKind k, const std::string& what) {
  const auto one = [](const char* name, const CollectiveOperand& o) {
    return msg(name, " ", shape_str(o.data.v.shape), " ",
               o.dtype_code >= 0 && o.dtype_code <= 10 ? dtype_short_name(DType(o.dtype_code)) : "?");
  };
  fail(k, msg(r.op, ": ", what, "; got ", one("x", r.x), ", ", one("w", r.w), ", tp ", str(r.tp), ", rank ",
              str(r.rank)));
}

// A view of the given shape and element type (the plan reads no pointer).
GemmBuffer view(const Shape& s, DType d) {
  GemmBuffer b;
  b.present = true;
  b.v.shape = s;
  b.v.dtype = d;
  return b;
}

// The GEMM of one chunk: D [m, n] = x chunk [m, k] · w [n, k]ᵀ, as the GEMM op's D = op(B)·op(A) with A = w
// (transposed), B = the chunk.
GemmRequest chunk_request(const CollectiveGemmRequest& r, int64_t m, DType d_dtype, int sm_count) {
  GemmRequest g;
  g.op = r.op;
  g.a.data = r.w.data;
  g.a.dtype_code = r.w.dtype_code;
  g.a.scale_inv = r.w.scale_inv;
  g.a.trans = !r.w_kn;
  g.b.data = view(Shape::of(m, r.x.data.v.shape.dims[1]), r.x.data.v.dtype);
  g.b.dtype_code = r.x.dtype_code;
  g.b.scale_inv = r.x.scale_inv;
  g.d_dtype = int64_t(d_dtype);
  g.use_split_accumulator = r.use_split_accumulator;
  g.allow_tf32 = r.allow_tf32;
  g.sm_count = sm_count;
  return g;
}

}  // namespace

CollectiveGemmPlan plan_collective_gemm(const CollectiveGemmRequest& r, const ExecCtx& ctx) {
  const bool ag = r.kind == CollectiveKind::kAllGather;
  if (!ag && r.kind != CollectiveKind::kReduceScatter) fail_request(r, ErrorKind::kValue, "unknown collective kind");
  if (r.transport_window && !copy_engine_serves(r.kind)) {
    fail_request(r, ErrorKind::kValue, "the copy-engine transport serves the reduce-scatter only");
  }
  if (r.tp < 1 || r.rank < 0 || r.rank >= r.tp) {
    fail_request(r, ErrorKind::kValue, msg("the rank must lie in [0, tp) with tp >= 1"));
  }
  for (const CollectiveOperand* o : {&r.x, &r.w}) {
    if (!o->data.present || !o->data.contiguous || o->data.v.shape.ndim != 2) {
      fail_request(r, ErrorKind::kValue, "x and w must be contiguous 2-D tensors (x [rows, k], w [n, k])");
    }
  }
  CollectiveGemmPlan p;
  p.req = r;
  const Shape& xs = r.x.data.v.shape;
  p.k = xs.dims[1];
  p.n = r.w.data.v.shape.dims[r.w_kn ? 1 : 0];
  if (ag) {
    p.m = xs.dims[0];
  } else {
    if (xs.dims[0] % r.tp != 0) {
      fail_request(r, ErrorKind::kValue, msg("reduce-scatter splits x's ", str(xs.dims[0]), " rows into tp = ",
                                             str(r.tp), " equal chunks: the rows must be a multiple of tp"));
    }
    p.m = xs.dims[0] / r.tp;
  }
  const DType dd = DType(r.d_dtype);
  if (r.d_dtype < 0 || r.d_dtype > 10 || !gemm_is_plain(dd)) {
    fail_request(r, ErrorKind::kType, "the output must be bf16, fp16 or fp32");
  }
  p.d_dtype = dd;
  const DType x_vals = DType(r.x.dtype_code);
  if (gemm_is_fp8(x_vals) && ag && (!r.x.scale_inv.present || r.x.scale_inv.v.shape.numel() != 1)) {
    fail_request(r, ErrorKind::kValue, "FP8 x travels with its per-tensor scale_inv: give a float32 [1]");
  }
  // The SMs the chunk GEMMs may take: the device's, less the margin left to the exchanges.
  int sm_count = 0;
  if (r.sm_margin < -1) {
    fail_request(r, ErrorKind::kValue, msg("sm_margin must be >= 0 (or -1: the transport's default), got ",
                                           str(r.sm_margin)));
  }
#if defined(TE_WITH_CUDA)
  if (ctx.cuda && r.sm_margin > 0) {
    int dev = ctx.device_index, sms = 0;
    if (dev < 0 && cudaGetDevice(&dev) != cudaSuccess) dev = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) sms = 132;
    if (r.sm_margin >= sms) {
      fail_request(r, ErrorKind::kValue, msg("sm_margin ", str(r.sm_margin), " leaves no SM of the device's ",
                                             str(sms), " to the GEMMs"));
    }
    sm_count = sms - r.sm_margin;
  }
#endif
  // The chunk GEMM's plan carries every GEMM rule (formats, FP8 pairing, alignment), named after this op.
  GemmPlanOptions opt;
  opt.plan_outputs = true;
  opt.reserve_fallback = true;
  p.chunk = plan_gemm(chunk_request(r, p.m, ag ? dd : DType::kFloat32, sm_count), ctx, opt);
  int64_t off = 0;
  const auto take = [&](int64_t bytes) {
    const int64_t at = off;
    off += align_up(bytes);
    return at;
  };
  if (ag) {
    p.d_shape = Shape::of(int64_t(r.tp) * p.m, p.n);
    p.gathered_shape = Shape::of(int64_t(r.tp) * p.m, p.k);
    p.chunk_bytes = p.m * p.k * gemm_elt_bytes(x_vals);
    p.gathered_offset = take(p.chunk_bytes * r.tp);
    if (gemm_is_fp8(x_vals)) p.scales_offset = take(kScaleSlot * r.tp);
  } else {
    p.d_shape = Shape::of(p.m, p.n);
    p.chunk_bytes = p.m * p.n * int64_t(sizeof(float));
    p.partial_offset = take(p.chunk_bytes);
    p.send_offset = take(p.chunk_bytes * (r.tp - 1));
    if (!r.transport_window) p.recv_offset = take(p.chunk_bytes * (r.tp - 1));
  }
  if (p.chunk.workspace_bytes > 0) p.gemm_offset = take(p.chunk.workspace_bytes);
  p.workspace_bytes = off + kWorkspaceAlign;
  return p;
}

int64_t collective_window_bytes(CollectiveKind kind, int64_t rows, int64_t n, int tp) {
  if (!copy_engine_serves(kind)) return 0;
  if (tp < 1 || rows < 0 || n < 0) {
    fail(ErrorKind::kValue, msg("collective_window_bytes: tp must be >= 1 and rows, n >= 0, got tp = ", str(tp),
                                ", rows = ", str(rows), ", n = ", str(n)));
  }
  return comm::CopyEngineWindow::kFlagBytes + int64_t(tp - 1) * (rows / tp) * n * int64_t(sizeof(float));
}

int64_t collective_window_bytes(const CollectiveGemmPlan& p) {
  // RS: x [tp·m, k] into [m, n]; the received partials are the plan's FP32 chunks [m, n]
  return collective_window_bytes(p.req.kind, int64_t(p.req.tp) * p.m, p.n, p.req.tp);
}

TransportChoice collective_transport(bool node_local) {
  constexpr const char* kVar = "NVTE_COLLECTIVE_GEMM_TRANSPORT";
  const char* env = std::getenv(kVar);
  std::string v = env ? env : "";
  const auto blank = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!v.empty() && blank(v.back())) v.pop_back();
  size_t first = 0;
  while (first < v.size() && blank(v[first])) ++first;
  v.erase(0, first);
  for (char& c : v) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (v.empty()) return node_local ? TransportChoice::kCopyEngine : TransportChoice::kNccl;
  if (v == "copy_engine") return TransportChoice::kCopyEngine;
  if (v == "nccl") return TransportChoice::kNccl;
  fail(ErrorKind::kValue, msg("collective GEMM: ", kVar, "='", v, "' is not one of copy_engine, nccl"));
}

const char* transport_name(TransportChoice t) { return t == TransportChoice::kCopyEngine ? "copy_engine" : "nccl"; }

namespace {

struct Runner {
  const CollectiveGemmPlan& p;
  const CollectiveGemmIO& io;
  comm::Transport& t;
  const ExecCtx& ctx;
  char* ws;

  void gemm(const void* x_chunk, const float* x_scale, void* d) const {
    GemmIO g;
    g.a = io.w;
    g.a_scale_inv = io.w_scale_inv;
    g.b = x_chunk;
    g.b_scale_inv = x_scale;
    g.d = d;
    if (p.gemm_offset >= 0) {
      g.workspace = ws + p.gemm_offset;
      g.workspace_bytes = p.chunk.workspace_bytes;
    }
    g.lt_workspace = io.lt_workspace;
    g.lt_workspace_bytes = io.lt_workspace_bytes;
    run_gemm(p.chunk, g, ctx);
  }

  void copy(void* dst, const void* src, size_t bytes) const {
    if (bytes == 0) return;
#if defined(TE_WITH_CUDA)
    if (ctx.cuda) {
      const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                            reinterpret_cast<cudaStream_t>(ctx.stream));
      if (e != cudaSuccess) fail(ErrorKind::kRuntime, msg(p.req.op, ": cudaMemcpyAsync failed: ", cudaGetErrorString(e)));
      return;
    }
#endif
    std::memcpy(dst, src, bytes);
  }

  void all_gather() const {
    const int tp = p.req.tp, r = p.req.rank;
    const bool fp8 = p.scales_offset >= 0;
    char* g = static_cast<char*>(io.gathered ? io.gathered : ws + p.gathered_offset);
    char* slots = fp8 ? ws + p.scales_offset : nullptr;
    const auto chunk = [&](int c) { return g + int64_t(c) * p.chunk_bytes; };
    const auto scale = [&](int c) { return reinterpret_cast<float*>(slots + int64_t(c) * kScaleSlot); };
    // The own chunk is multiplied and sent from x itself; it is copied into the gathered x (after the exchanges were
    // started, so the copy overlaps them) only for the caller who keeps it.
    const auto exchange = [&](int step) {
      const int from_chunk = comm::ag_chunk(r, tp, step), next = comm::ag_chunk(r, tp, step + 1);
      comm::Segment s[2];
      s[0].send = step == 0 ? io.x : chunk(from_chunk);
      s[0].recv = chunk(next);
      s[0].bytes = size_t(p.chunk_bytes);
      if (fp8) {
        s[1].send = step == 0 ? static_cast<const void*>(io.x_scale_inv) : scale(from_chunk);
        s[1].recv = scale(next);
        s[1].bytes = sizeof(float);
      }
      t.start(step, s, fp8 ? 2 : 1, (r + 1) % tp, (r + tp - 1) % tp);
    };
    const auto multiply = [&](int step) {
      const int c = comm::ag_chunk(r, tp, step);
      const void* x = step == 0 ? io.x : chunk(c);
      const float* xs = fp8 ? (step == 0 ? io.x_scale_inv : scale(c)) : nullptr;
      gemm(x, xs, static_cast<char*>(io.d) + int64_t(c) * p.m * p.n * gemm_elt_bytes(p.d_dtype));
    };
    if (!p.req.overlap) {  // the baseline: every exchange done, then the chunk GEMMs
      for (int step = 0; step + 1 < tp; ++step) {
        exchange(step);
        t.wait();
      }
      for (int step = 0; step < tp; ++step) multiply(step);
    } else if (t.pipelined()) {  // the whole ring issued first; chunk i's GEMM waits for exchange i − 1 alone
      for (int step = 0; step + 1 < tp; ++step) exchange(step);
      for (int step = 0; step < tp; ++step) {
        if (step > 0) t.wait_for(step - 1);
        multiply(step);
      }
    } else {
      for (int step = 0; step < tp; ++step) {
        if (step > 0) t.wait();
        if (step + 1 < tp) exchange(step);
        multiply(step);
      }
    }
    if (io.gathered) {
      copy(chunk(r), io.x, size_t(p.chunk_bytes));
      if (fp8 && io.gathered_scale_inv) {
        copy(scale(r), io.x_scale_inv, sizeof(float));
        for (int c = 0; c < tp; ++c) copy(io.gathered_scale_inv + c, scale(c), sizeof(float));
      }
    }
  }

  // Direct sends: the rank computes its FP32 partial product of every other rank's output chunk, nearest first
  // (step s: chunk r + s + 1), and exchange s sends it to that chunk's owner as soon as it is made while the partial
  // of rank r − s − 1 arrives into slot tp − 2 − s (slot j: the partial of rank r + j + 1); the own chunk's partial
  // comes last, then one pass sums the slots in order and the own partial and rounds once: the ring order
  // r + 1, r + 2, …, r. No send waits on an add, so the exchanges run back to back beside the GEMMs.
  void reduce_scatter() const {
    const int tp = p.req.tp, r = p.req.rank;
    float* own = reinterpret_cast<float*>(ws + p.partial_offset);
    float* sends = reinterpret_cast<float*>(ws + p.send_offset);
    // the transport's window when its peers write into one (copy engine), else the workspace's slots
    float* slots = reinterpret_cast<float*>(p.req.transport_window
                                                ? t.recv_window(size_t(p.chunk_bytes) * size_t(tp - 1))
                                                : ws + p.recv_offset);
    const auto at = [&](float* base, int i) { return base + int64_t(i) * p.m * p.n; };
    const int64_t x_row_bytes = p.k * gemm_elt_bytes(DType(p.req.x.dtype_code));
    const auto x_chunk = [&](int c) { return static_cast<const char*>(io.x) + int64_t(c) * p.m * x_row_bytes; };
    const bool host_driven = !t.pipelined();
    for (int step = 0; step < tp; ++step) {
      const int c = comm::rs_chunk(r, tp, step);
      gemm(x_chunk(c), io.x_scale_inv, step + 1 < tp ? at(sends, step) : own);
      if (step + 1 == tp) break;
      if (p.req.overlap && host_driven && step > 0) t.wait();  // one exchange in flight
      comm::Segment seg;
      seg.send = at(sends, step);
      seg.recv = at(slots, tp - 2 - step);
      seg.bytes = size_t(p.chunk_bytes);
      t.start(step, &seg, 1, c, comm::ring_mod(int64_t(r) - step - 1, tp));
      if (!p.req.overlap) t.wait();
    }
    if (p.req.overlap && tp > 1) t.wait();
    const int64_t n = p.m * p.n;
#if defined(TE_WITH_CUDA)
    if (ctx.cuda) {
      comm::partial_sum_cuda(slots, tp - 1, own, io.d, p.d_dtype, n, reinterpret_cast<cudaStream_t>(ctx.stream));
      t.release_window();
      return;
    }
#endif
    comm::partial_sum_cpu(slots, tp - 1, own, io.d, p.d_dtype, n, *ctx.parallel_for);
    t.release_window();
  }
};

}  // namespace

void run_collective_gemm(const CollectiveGemmPlan& p, const CollectiveGemmIO& io, comm::Transport& transport,
                         const ExecCtx& ctx) {
  if (transport.size() != p.req.tp || transport.rank() != p.req.rank) {
    fail(ErrorKind::kValue, msg(p.req.op, ": the transport is rank ", str(transport.rank()), " of ",
                                str(transport.size()), " but the plan is rank ", str(p.req.rank), " of ",
                                str(p.req.tp)));
  }
  if (transport.has_window() != p.req.transport_window) {
    fail(ErrorKind::kValue, msg(p.req.op, ": the plan was made for a transport ",
                                p.req.transport_window ? "with" : "without", " a receive window; this one has ",
                                transport.has_window() ? "one" : "none", " (plan after resolve_transport)"));
  }
  if (io.workspace_bytes < p.workspace_bytes) {
    fail(ErrorKind::kRuntime, msg(p.req.op, ": the workspace has ", str(io.workspace_bytes), " bytes, the plan needs ",
                                  str(p.workspace_bytes)));
  }
  char* ws = static_cast<char*>(gemm_align_workspace(io.workspace));
  const Runner run{p, io, transport, ctx, ws};
  run_rewrapping_errors([&] {
    if (p.req.kind == CollectiveKind::kAllGather) {
      run.all_gather();
    } else {
      run.reduce_scatter();
    }
  });
}

}  // namespace ops
}  // namespace te
