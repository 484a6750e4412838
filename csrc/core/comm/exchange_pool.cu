// The CUDA transports' shared exchange streams and events (comm/exchange_pool.h).
#include "exchange_pool.h"

#include <string>

#include "../rules/common.h"

namespace te {
namespace comm {

void cuda_check(cudaError_t e, const char* who, const char* what) {
  if (e != cudaSuccess) core_fail(std::string(who) + ": " + what + " failed: " + cudaGetErrorString(e));
}

ExchangeResources& exchange_resources(const char* who) {
  thread_local ExchangeResources per_device[16];
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), who, "cudaGetDevice");
  ExchangeResources& r = per_device[dev % 16];
  if (r.streams[0] == nullptr) {
    int least = 0, greatest = 0;
    cuda_check(cudaDeviceGetStreamPriorityRange(&least, &greatest), who, "cudaDeviceGetStreamPriorityRange");
    for (cudaStream_t& s : r.streams) {
      cuda_check(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest), who, "cudaStreamCreate");
    }
    cuda_check(cudaEventCreateWithFlags(&r.ready, cudaEventDisableTiming), who, "cudaEventCreate");
    for (cudaEvent_t& e : r.done) {
      cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), who, "cudaEventCreate");
    }
  }
  return r;
}

}  // namespace comm
}  // namespace te
