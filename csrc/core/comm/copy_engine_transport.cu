// The copy-engine transport (comm/transport.h): cudaMemcpyAsync into the peers' mapped windows on a stream of its
// own, ordered across ranks with stream memory operations (cuStreamWaitValue32 / cuStreamWriteValue32, reached
// through the runtime's driver entry points: nothing links libcuda), which run on the GPU's front end, not on SMs.
#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

#include "../rules/common.h"
#include "exchange_pool.h"
#include "transport.h"

namespace te {
namespace comm {
namespace {

constexpr const char* kWho = "collective GEMM copy engine";
void check(cudaError_t e, const char* what) { cuda_check(e, kWho, what); }

using MemOpFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
struct MemOps {
  MemOpFn wait = nullptr, write = nullptr;
};

const MemOps& mem_ops() {
  static const MemOps ops = [] {
    MemOps o;
    const auto get = [](const char* name, MemOpFn* fn) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
      check(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q), "cudaGetDriverEntryPoint");
      if (q != cudaDriverEntryPointSuccess || p == nullptr) {
        core_fail(std::string("collective GEMM copy engine: the driver has no ") + name);
      }
      *fn = reinterpret_cast<MemOpFn>(p);
    };
    get("cuStreamWaitValue32", &o.wait);
    get("cuStreamWriteValue32", &o.write);
    return o;
  }();
  return ops;
}

void mem_op(MemOpFn fn, cudaStream_t s, void* addr, uint32_t value, unsigned flags, const char* what) {
  const CUresult r = fn(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(addr), value, flags);
  if (r != CUDA_SUCCESS) core_fail(std::string("collective GEMM copy engine: ") + what + " failed: CUresult " +
                                   std::to_string(int(r)));
}

// The exchange streams and events: the CUDA transports' shared pool (exchange_pool.h). Exchange i runs on stream
// i mod kStreams: the reduce-scatter's exchanges go to different peers and need not wait for each other, so the
// copies of one call run side by side on the GPU's copy engines whenever their GEMMs are done.
constexpr int kMaxSteps = ExchangeResources::kMaxSteps;
constexpr int kStreams = ExchangeResources::kStreams;
ExchangeResources& resources() { return exchange_resources(kWho); }

int32_t* ready_flag(char* window, int r) { return reinterpret_cast<int32_t*>(window) + r; }
int32_t* free_flag(char* window, int r) {
  return reinterpret_cast<int32_t*>(window + CopyEngineWindow::kFreeOffset) + r;
}

}  // namespace

CopyEngineTransport::CopyEngineTransport(int rank, int size, void* stream, const CopyEngineWindow& window)
    : rank_(rank), size_(size), stream_(stream), bytes_(window.bytes) {
  if (size > CopyEngineWindow::kMaxRanks || size > kMaxSteps) {
    core_fail("collective GEMM copy engine: at most 64 ranks");
  }
  if (window.bases == nullptr || window.bytes <= CopyEngineWindow::kFlagBytes) {
    core_fail("collective GEMM copy engine: no window (give every rank's window and its size)");
  }
  bases_.assign(window.bases, window.bases + size);
  for (int r = 0; r < size; ++r) {
    if (bases_[size_t(r)] == 0 || bases_[size_t(r)] % 256 != 0) {
      core_fail("collective GEMM copy engine: rank " + std::to_string(r) + "'s window is null or not 256-B aligned");
    }
  }
  mem_ops();
  resources();
}

void* CopyEngineTransport::recv_window(size_t bytes) {
  if (int64_t(bytes) > bytes_ - CopyEngineWindow::kFlagBytes) {
    core_fail("collective GEMM copy engine: the call receives " + std::to_string(bytes) +
              " bytes but the window holds " + std::to_string(bytes_ - CopyEngineWindow::kFlagBytes));
  }
  return base(rank_) + CopyEngineWindow::kFlagBytes;
}

void CopyEngineTransport::start(int step, const Segment* segs, int n, int to, int from) {
  if (step >= kMaxSteps) core_fail("collective GEMM copy engine: at most 64 exchanges per call");
  const MemOps& ops = mem_ops();
  ExchangeResources& r = resources();
  const cudaStream_t caller = static_cast<cudaStream_t>(stream_), comm = r.streams[step % kStreams];
  check(cudaEventRecord(r.ready, caller), "cudaEventRecord");
  check(cudaStreamWaitEvent(comm, r.ready, 0), "cudaStreamWaitEvent");
  // `to` has finished reading what this rank wrote into its window last time
  mem_op(ops.wait, comm, free_flag(base(rank_), to), 1, CU_STREAM_WAIT_VALUE_EQ, "wait (window free)");
  mem_op(ops.write, comm, free_flag(base(rank_), to), 0, CU_STREAM_WRITE_VALUE_DEFAULT, "write (window taken)");
  char* const own = base(rank_);
  for (int s = 0; s < n; ++s) {
    const int64_t off = static_cast<char*>(segs[s].recv) - own;
    if (off < CopyEngineWindow::kFlagBytes || off + int64_t(segs[s].bytes) > bytes_) {
      core_fail("collective GEMM copy engine: a segment's recv buffer lies outside the window");
    }
    check(cudaMemcpyAsync(base(to) + off, segs[s].send, segs[s].bytes, cudaMemcpyDefault, comm), "cudaMemcpyAsync");
  }
  // the write's fence orders the copies before it: `to` sees the bytes once it sees the flag
  mem_op(ops.write, comm, ready_flag(base(to), rank_), 1, CU_STREAM_WRITE_VALUE_DEFAULT, "write (data ready)");
  check(cudaEventRecord(r.done[step], comm), "cudaEventRecord");
  if (int(from_.size()) <= step) {
    from_.resize(size_t(step) + 1, -1);
    waited_.resize(size_t(step) + 1, true);
  }
  from_[size_t(step)] = from;
  waited_[size_t(step)] = false;
  last_ = step;
}

void CopyEngineTransport::wait_for(int step) {
  if (step < 0 || step >= int(from_.size()) || waited_[size_t(step)]) return;
  const MemOps& ops = mem_ops();
  const cudaStream_t caller = static_cast<cudaStream_t>(stream_);
  char* const own = base(rank_);
  const int from = from_[size_t(step)];
  mem_op(ops.wait, caller, ready_flag(own, from), 1, CU_STREAM_WAIT_VALUE_EQ, "wait (data ready)");
  mem_op(ops.write, caller, ready_flag(own, from), 0, CU_STREAM_WRITE_VALUE_DEFAULT, "write (data taken)");
  // the sends of this exchange read the caller's buffers: the caller may reuse them once they are done
  check(cudaStreamWaitEvent(caller, resources().done[step], 0), "cudaStreamWaitEvent");
  waited_[size_t(step)] = true;
}

void CopyEngineTransport::wait() {
  for (int step = 0; step <= last_; ++step) wait_for(step);  // one event per exchange: its streams run side by side
  last_ = -1;
}

void CopyEngineTransport::release_window() {
  const MemOps& ops = mem_ops();
  const cudaStream_t caller = static_cast<cudaStream_t>(stream_);
  for (size_t step = 0; step < from_.size(); ++step) {
    if (from_[step] < 0) continue;
    mem_op(ops.write, caller, free_flag(base(from_[step]), rank_), 1, CU_STREAM_WRITE_VALUE_DEFAULT,
           "write (window free)");
    from_[step] = -1;
  }
}

}  // namespace comm
}  // namespace te
