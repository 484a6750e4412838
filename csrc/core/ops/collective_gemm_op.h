// Collective GEMM (tensor + sequence parallel layers): all-gather + GEMM and GEMM + reduce-scatter over a ring of
// tp ranks, each chunk's exchange overlapped with another chunk's GEMM, written once for every frontend and
// transport (comm/transport.h).
//
//   all-gather (AG):     x_shard [m, k] on each rank, w [n, k]     → d [tp·m, n] = gather(x) · wᵀ
//                        (w_kn: w stored [k, n], d = gather(x) · w; the same for the reduce-scatter)
//   reduce-scatter (RS): x [tp·m, k] on each rank, w [n, k] (the rank's K shards) → d [m, n] = rows r of Σ_ranks x·wᵀ
//
// AG: at step i the rank multiplies chunk (r − i) mod tp (its own at step 0) while exchange i brings the next one
// from rank r − 1; the gathered x can be kept for the backward's weight gradient. RS (direct sends): at step i the
// rank computes its FP32 partial product of output chunk (r + i + 1) mod tp and sends it to that chunk's owner while
// rank (r − i − 1) mod tp's partial of chunk r arrives; the own chunk's partial comes last, and one pass sums the
// partials of ranks r + 1, r + 2, …, r in FP32 (the order a ring of running sums would add them) and rounds once to
// the output type. No send waits on an add, so the exchanges run back to back beside the GEMMs; the cost is tp − 1
// FP32 chunks sent plus tp − 1 received held in the workspace.
// FP8 per-tensor operands travel as FP8 with their scale_inv: each chunk keeps its own rank's scale (AG) — so the
// ranks need not agree on one scale — and w's scale applies to every chunk.
// Invariant: the plan depends on shapes, dtypes, tp and the device kind only; the run neither allocates nor syncs
// the host on CUDA (the transport's exchanges are stream-ordered), so a CUDA graph can capture it. overlap = false
// runs the same exchanges and chunk GEMMs one after another (AG: every exchange, then the GEMMs; RS: each exchange
// done before the next GEMM): the non-overlapped baseline, same bytes.
#pragma once

#include "../comm/transport.h"
#include "gemm_op.h"

namespace te {
namespace ops {

enum class CollectiveKind : int { kAllGather = 1, kReduceScatter = 2 };

struct CollectiveOperand {
  GemmBuffer data;                                    // [rows, k] row-major (FP8: uint8 or FP8-typed codes)
  int64_t dtype_code = int64_t(DType::kBFloat16);     // the values' DType
  GemmBuffer scale_inv;                               // FP8 per tensor: float32 [1]
};

struct CollectiveGemmRequest {
  const char* op = "all_gather_gemm";
  CollectiveKind kind = CollectiveKind::kAllGather;
  CollectiveOperand x, w;
  int64_t d_dtype = int64_t(DType::kBFloat16);       // bf16, fp16 or fp32
  int tp = 1;
  int rank = 0;
  bool overlap = true;
  bool use_split_accumulator = true;                  // FP8: promoted accumulation
  bool allow_tf32 = false;                            // fp32 operands: TF32 tensor cores (off: full FP32)
  bool w_kn = false;                                  // w stored [k, n] (plain operands only; FP8 takes [n, k])
  // CUDA: SMs the chunk GEMMs leave free for the exchanges' kernels (NCCL's send/receive run on SMs; a GEMM that
  // fills every SM delays them until it drains, which serialises what should overlap). 0: the GEMMs take every SM;
  // -1: the transport's default (Transport::default_sm_margin; resolve_sm_margin below).
  int sm_margin = -1;
  // The transport receives into a window of its own (Transport::has_window: the copy engine's), so the plan keeps
  // no receive slots in the workspace. Reduce-scatter only (the all-gather receives into the gathered x).
  bool transport_window = false;
};

struct CollectiveGemmPlan {
  CollectiveGemmRequest req;
  GemmPlan chunk;            // one chunk's GEMM: AG [m, k]·[n, k]ᵀ → d rows (d's dtype); RS → an FP32 partial [m, n]
  int64_t m = 0, n = 0, k = 0;
  Shape d_shape;             // AG [tp·m, n]; RS [m, n]
  DType d_dtype = DType::kBFloat16;
  Shape gathered_shape;      // AG: the gathered x [tp·m, k] (codes), returned on request
  int64_t chunk_bytes = 0;   // AG: one x chunk's bytes; RS: one FP32 [m, n] chunk
  // Workspace byte offsets from the 256-B aligned workspace pointer; -1: not used.
  int64_t gathered_offset = -1;   // AG, when the caller does not take the gathered x: [tp·m, k]
  int64_t scales_offset = -1;     // AG FP8: the chunks' scale_inv, one 16-byte slot each (cuBLASLt alignment)
  int64_t partial_offset = -1;    // RS: the own chunk's FP32 partial [m, n]
  int64_t send_offset = -1, recv_offset = -1;  // RS: tp − 1 FP32 [m, n] chunks each (sent; received)
  int64_t gemm_offset = -1;       // the chunk GEMM's own workspace
  int64_t workspace_bytes = 0;    // including the alignment slack
};

// What the request takes from its transport (the frontends call it before planning): sm_margin -1 replaced by the
// transport's default, and whether it receives into a window of its own.
inline void resolve_transport(CollectiveGemmRequest& r, const comm::Transport& t) {
  if (r.sm_margin < 0) r.sm_margin = t.default_sm_margin();
  r.transport_window = t.has_window();
}

// Whether the copy-engine transport (a window every rank maps) serves this kind: the reduce-scatter, whose partial
// sums are the largest exchanges and whose NCCL send/receive kernels contend with the GEMMs for SMs.
inline bool copy_engine_serves(CollectiveKind k) { return k == CollectiveKind::kReduceScatter; }

// The window bytes (flags page included) the copy-engine transport needs for this plan; 0 for a kind it does not
// serve.
int64_t collective_window_bytes(const CollectiveGemmPlan& p);
// The same from the shapes alone, for a frontend that maps the windows before it plans (torch's symmetric memory):
// x [rows, k] reduce-scattered into [rows/tp, n] receives tp − 1 FP32 partials [rows/tp, n] after the flags page
// (comm::CopyEngineWindow::kFlagBytes); 0 for the all-gather. The formula's one home: the plan form calls it.
int64_t collective_window_bytes(CollectiveKind kind, int64_t rows, int64_t n, int tp);

// Which transport a CUDA collective GEMM's reduce-scatter runs over — decided here once for both frontends (issue
// 33): the environment variable NVTE_COLLECTIVE_GEMM_TRANSPORT ("copy_engine" or "nccl"; case and surrounding blanks
// ignored) when it is set and not blank, else the default rule: the copy engine for a node-local group (every rank's
// window mappable into this process), NCCL otherwise. Any other value raises ErrorKind::kValue (ValueError), the
// one message: "collective GEMM: NVTE_COLLECTIVE_GEMM_TRANSPORT='<value>' is not one of copy_engine, nccl". Read at
// every call, so a change of the variable applies to the next call. Every rank must choose alike.
enum class TransportChoice : int { kNccl = 0, kCopyEngine = 1 };
TransportChoice collective_transport(bool node_local);
const char* transport_name(TransportChoice t);  // "nccl" / "copy_engine"

CollectiveGemmPlan plan_collective_gemm(const CollectiveGemmRequest& r, const ExecCtx& ctx);

struct CollectiveGemmIO {
  const void* x = nullptr;
  const float* x_scale_inv = nullptr;
  const void* w = nullptr;
  const float* w_scale_inv = nullptr;
  void* d = nullptr;
  void* gathered = nullptr;          // AG: [tp·m, k] kept for the caller (null: the workspace's)
  float* gathered_scale_inv = nullptr;  // AG FP8 with `gathered`: [tp] (null: the workspace's)
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  void* lt_workspace = nullptr;      // the cuBLASLt workspace (the frontend's)
  int64_t lt_workspace_bytes = 0;
};

void run_collective_gemm(const CollectiveGemmPlan& plan, const CollectiveGemmIO& io, comm::Transport& transport,
                         const ExecCtx& ctx);

}  // namespace ops
}  // namespace te
