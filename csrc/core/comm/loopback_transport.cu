// The one-GPU loopback transport (comm/transport.h): the simulated peers' bytes are copied by the copy engine on a
// stream of their own, forked from and joined to the caller's stream with events, as a real exchange would be.
#include <cuda_runtime.h>

#include <string>

#include "../rules/common.h"
#include "transport.h"

namespace te {
namespace comm {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) core_fail(std::string("collective GEMM loopback: ") + what + " failed: " + cudaGetErrorString(e));
}

// The copy stream and the events of this thread on the current device, made once (creating them inside a CUDA graph
// capture would be legal but slow; reusing them is safe because one thread drives one collective at a time): `ready`
// marks the caller's work before an exchange, done[i] the copies of exchange i.
constexpr int kMaxSteps = 64;
struct Resources {
  int device = -1;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;
  cudaEvent_t done[kMaxSteps] = {};
};

Resources& resources() {
  thread_local Resources per_device[16];
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  Resources& r = per_device[dev % 16];
  if (r.stream == nullptr) {
    r.device = dev;
    check(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&r.ready, cudaEventDisableTiming), "cudaEventCreate");
    for (cudaEvent_t& e : r.done) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  }
  return r;
}

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
  Resources& r = resources();
  const cudaStream_t caller = static_cast<cudaStream_t>(stream_);
  check(cudaEventRecord(r.ready, caller), "cudaEventRecord");
  check(cudaStreamWaitEvent(r.stream, r.ready, 0), "cudaStreamWaitEvent");
  const int chunk = ag_chunk(rank_, size_, step + 1);  // the chunk this exchange brings (all-gather)
  for (int s = 0; s < n; ++s) {
    const LoopbackSource& src = sources_[s];
    const size_t index = src.by_chunk ? size_t(chunk) : size_t(step);
    const char* from = static_cast<const char*>(src.base) + index * src.stride;
    check(cudaMemcpyAsync(segs[s].recv, from, segs[s].bytes, cudaMemcpyDeviceToDevice, r.stream), "cudaMemcpyAsync");
  }
  check(cudaEventRecord(r.done[step % kMaxSteps], r.stream), "cudaEventRecord");
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
