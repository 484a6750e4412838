// The one-GPU loopback transport (comm/transport.h): the simulated peers' bytes are copied by the copy engine on a
// stream of their own, forked from and joined to the caller's stream with events, as a real exchange would be.
#include <cuda_runtime.h>

#include <string>

#include "../rules/common.h"
#include "exchange_pool.h"
#include "transport.h"

namespace te {
namespace comm {
namespace {

void check(cudaError_t e, const char* what) { cuda_check(e, "collective GEMM loopback", what); }

// The copy stream and the events: the CUDA transports' shared pool (exchange_pool.h); the loopback's exchanges run in
// order on its first stream, so the last exchange's event covers the ones before it.
constexpr int kMaxSteps = ExchangeResources::kMaxSteps;
ExchangeResources& resources() { return exchange_resources("collective GEMM loopback"); }

}  // namespace

LoopbackTransport::LoopbackTransport(int rank, int size, void* stream, const LoopbackSource* sources, int n)
    : rank_(rank), size_(size), stream_(stream), n_sources_(n) {
  if (n < 0 || n > kMaxSegments) core_fail("collective GEMM loopback: at most 2 segments per exchange");
  if (size > kMaxSteps) core_fail("collective GEMM loopback: at most 64 simulated ranks");
  for (int i = 0; i < n; ++i) sources_[i] = sources[i];
  resources();  // made now, outside any capture
}

LoopbackTransport::~LoopbackTransport() = default;

void LoopbackTransport::start(int step, const Segment* segs, int n, int /*to*/, int /*from*/) {
  if (n > n_sources_) core_fail("collective GEMM loopback: an exchange has more segments than sources were given");
  ExchangeResources& r = resources();
  const cudaStream_t caller = static_cast<cudaStream_t>(stream_);
  check(cudaEventRecord(r.ready, caller), "cudaEventRecord");
  check(cudaStreamWaitEvent(r.streams[0], r.ready, 0), "cudaStreamWaitEvent");
  const int chunk = ag_chunk(rank_, size_, step + 1);  // the chunk this exchange brings (all-gather)
  for (int s = 0; s < n; ++s) {
    const LoopbackSource& src = sources_[s];
    const size_t index = src.by_chunk ? size_t(chunk) : size_t(step);
    const char* from = static_cast<const char*>(src.base) + index * src.stride;
    check(cudaMemcpyAsync(segs[s].recv, from, segs[s].bytes, cudaMemcpyDeviceToDevice, r.streams[0]),
          "cudaMemcpyAsync");
  }
  check(cudaEventRecord(r.done[step % kMaxSteps], r.streams[0]), "cudaEventRecord");
  last_ = step;
}

void LoopbackTransport::wait_for(int step) {
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), resources().done[step % kMaxSteps], 0),
        "cudaStreamWaitEvent");
}

void LoopbackTransport::wait() {
  if (last_ >= 0) wait_for(last_);  // the copy stream is in order: the last exchange's event covers the others
  last_ = -1;
}

}  // namespace comm
}  // namespace te
