// The exchange streams and events of the CUDA transports (copy engine, loopback: comm/transport.h), one pool for both
// (issue 33: each had its own twin). Per thread and device, made once at a transport's construction (outside any CUDA
// graph capture; creating them inside one would be legal but slow) and reused: one thread drives one collective at a
// time, so the transports of one thread may share them. `ready` marks the caller's work before an exchange, done[i]
// the copies of exchange i. The streams have the device's greatest priority (the exchanges' copies go first when the
// GEMMs beside them fill the queues); a transport that keeps its exchanges in order uses streams[0] alone.
#pragma once

#include <cuda_runtime.h>

namespace te {
namespace comm {

struct ExchangeResources {
  static constexpr int kMaxSteps = 64;  // exchanges per collective call
  static constexpr int kStreams = 4;
  cudaStream_t streams[kStreams] = {};
  cudaEvent_t ready = nullptr;
  cudaEvent_t done[kMaxSteps] = {};
};

// This thread's resources on the current device, created on first use. `who` names the transport in a failure's
// message ("collective GEMM copy engine: cudaStreamCreate failed: ...").
ExchangeResources& exchange_resources(const char* who);

// Raises core_fail("<who>: <what> failed: <CUDA's message>") unless e is cudaSuccess.
void cuda_check(cudaError_t e, const char* who, const char* what);

}  // namespace comm
}  // namespace te
