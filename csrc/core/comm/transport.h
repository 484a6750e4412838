// How a collective GEMM's ring (ops/collective_gemm_op.h) moves its chunks between neighbouring ranks. The schedule
// is written once against this interface; the frontends and the tests pick the transport: torch.distributed's
// process group (gloo on the CPU, NCCL on GPUs: csrc/torch/collective.cpp) or the one-GPU loopback below, which keeps
// the simulated peers' shards in the same GPU's memory and moves them with the copy engine on the same streams and
// events as a real exchange.
// Invariant: start() is ordered after everything the caller issued before it and after the exchange before it; after
// wait() (or wait_for(step)) everything the caller issues next sees the exchange(s) complete. A transport that is not
// pipelined() has at most one exchange in flight. Neither synchronises the host on
// CUDA (graph-capture safe); on the CPU, wait() is where the host blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace te {
namespace comm {

// One buffer of an exchange: `bytes` sent from `send` to rank `to` and received into `recv` from rank `from`.
struct Segment {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t bytes = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Starts exchange number `step` (0, 1, ... within one collective call): every segment sent to rank `to` and
  // received from rank `from`.
  virtual void start(int step, const Segment* segs, int n, int to, int from) = 0;
  // Makes the caller wait for every exchange started and not yet waited for.
  virtual void wait() = 0;
  // Stream-ordered transports (the CUDA ones) may have every exchange of a call in flight at once, each ordered after
  // the one before it on the transport's own stream; wait_for(step) then makes the caller's stream wait for exchange
  // `step` alone. The all-gather issues all its exchanges before its first GEMM (the chunk exchange i forwards is the
  // one exchange i − 1 brought), so the ring runs back to back and the GEMMs follow it. false: one exchange in
  // flight, wait() between them (the host-driven CPU ring).
  virtual bool pipelined() const { return false; }
  virtual void wait_for(int /*step*/) { wait(); }
  // The SMs the chunk GEMMs leave free by default while this transport's exchanges run beside them: NCCL's send and
  // receive are kernels that need SMs of their own; copy-engine and host transports need none.
  virtual int default_sm_margin() const { return 0; }
  // Receive memory the transport owns, at least `bytes` (its peers write into it directly: the copy-engine transport);
  // nullptr: the exchanges receive into whatever recv pointer the caller gives. Stable for one collective call.
  virtual void* recv_window(size_t /*bytes*/) { return nullptr; }
  virtual bool has_window() const { return false; }
  // Issued after the caller's last read of the received bytes: the peers may write into the window again (ordered
  // after that read on the caller's stream). A no-op for transports without a window.
  virtual void release_window() {}
};

// NCCL's ring send/receive kernels: the SMs a GEMM leaves them. Measured on 4 x H200 (bench_collective.py
// --sm-margins 0,4,8,16,32, 8192 tokens, hidden 8192, ffn 28672): 8 was the fastest all-gather at tp = 4 (bf16 and
// FP8); tp = 2 lost 1-5 % against 0-4 (its one exchange starts before any GEMM); 16 and 32 slow the GEMMs more than
// they help.
constexpr int kNcclSmMargin = 8;

// The chunk bookkeeping, shared by the schedule and the loopback transport. All-gather: at step i rank r multiplies
// chunk (r − i) mod p and exchange i brings it chunk (r − i − 1) mod p from rank r − 1. Reduce-scatter: at step i
// rank r computes its partial product of output chunk (r + i + 1) mod p and exchange i sends it to that chunk's owner
// while rank (r − i − 1) mod p's partial of chunk r arrives; at step p − 1 the chunk is r's own.
inline int ring_mod(int64_t a, int p) { return int(((a % p) + p) % p); }
inline int ag_chunk(int rank, int p, int step) { return ring_mod(int64_t(rank) - step, p); }
inline int rs_chunk(int rank, int p, int step) { return ring_mod(int64_t(rank) + step + 1, p); }

// Copy engine: every rank's receive window is mapped into this process (CUDA IPC / symmetric memory: the frontend
// maps them), and exchange `step` copies each segment straight into rank `to`'s window with cudaMemcpyAsync — the copy
// engine over NVLink, no SM taken from the GEMMs — at the offset the segment's recv pointer has in this rank's own
// window. Stream memory operations (no kernels) order the two sides: window layout [flags | data], the flags page
// holding ready[p] at 0 and free[p] at kFreeOffset (int32, one per peer). A sender waits for its free[to] = 1 and
// clears it, copies, then sets ready[rank] = 1 in `to`'s window (the write fences the copy); the receiver's wait
// waits for ready[from] = 1 and clears it; release_window sets free[rank] = 1 in each sender's window. Every call
// leaves the flags as it found them (ready 0, free 1: the frontend's initial state), so a CUDA graph replays it.
struct CopyEngineWindow {
  static constexpr int64_t kFlagBytes = 4096;
  static constexpr int64_t kFreeOffset = 2048;
  static constexpr int kMaxRanks = 512;  // kFreeOffset / sizeof(int32)
  int64_t bytes = 0;                 // each rank's window, the flags page included
  const uint64_t* bases = nullptr;   // [size]: every rank's window in this process's address space (own included)
};

#if defined(TE_WITH_CUDA)
// Loopback: rank `rank` of `size` simulated on one GPU. Exchange `step` fills segment s's recv buffer from
// sources[s]: base + index·stride, index = the chunk the exchange brings (all-gather: by_chunk) or the step itself
// (the simulated peer's partial per step: reduce-scatter). The copy runs on `comm_stream` after an event on `stream`;
// wait() makes `stream` wait on the copy's event. The sends go nowhere (the peers are simulated).
struct LoopbackSource {
  const void* base = nullptr;
  size_t stride = 0;
  bool by_chunk = true;
};
class LoopbackTransport : public Transport {
 public:
  static constexpr int kMaxSegments = 2;
  LoopbackTransport(int rank, int size, void* stream, const LoopbackSource* sources, int n_sources);
  ~LoopbackTransport() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void start(int step, const Segment* segs, int n, int to, int from) override;
  void wait() override;
  bool pipelined() const override { return true; }
  void wait_for(int step) override;

 private:
  int rank_, size_;
  void* stream_;
  LoopbackSource sources_[kMaxSegments];
  int n_sources_;
  int last_ = -1;  // the last exchange started
};

// The copy-engine transport over a CopyEngineWindow (above).
class CopyEngineTransport : public Transport {
 public:
  CopyEngineTransport(int rank, int size, void* stream, const CopyEngineWindow& window);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void start(int step, const Segment* segs, int n, int to, int from) override;
  void wait() override;
  bool pipelined() const override { return true; }
  void wait_for(int step) override;
  void* recv_window(size_t bytes) override;
  bool has_window() const override { return true; }
  void release_window() override;

 private:
  char* base(int r) const { return reinterpret_cast<char*>(bases_[size_t(r)]); }
  int rank_, size_;
  void* stream_;
  int64_t bytes_;
  std::vector<uint64_t> bases_;
  std::vector<int> from_;        // exchange i's sender (the flags wait_for(i) waits on)
  std::vector<bool> waited_;     // exchange i's ready flag already waited for
  int last_ = -1;                // the last exchange started
};
#endif

}  // namespace comm
}  // namespace te
