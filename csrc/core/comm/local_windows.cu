// The in-process copy-engine windows (comm/local_windows.h).
#include "local_windows.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "../rules/common.h"

namespace te {
namespace comm {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) core_fail(std::string("copy-engine windows: ") + what + " failed: " + cudaGetErrorString(e));
}

struct Entry {
  int rank = 0, size = 0;
  int64_t bytes = 0;
  std::vector<uint64_t> bases;  // [size]: the ring's windows (own included)
};

struct Registry {
  std::mutex mu;
  std::map<std::pair<int64_t, int>, Entry> entries;  // (key, device)
  std::map<std::pair<int64_t, int>, void*> owned;    // (key, device): the window this process allocated
};

Registry& registry() {
  static Registry* r = new Registry();  // leaked on purpose, as the NCCL registry
  return *r;
}

constexpr int64_t kGrain = int64_t(2) << 20;

}  // namespace

void local_windows_ensure(int64_t key, const std::vector<std::vector<LocalMember>>& rings, int64_t bytes) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  bool grow = false;
  for (const auto& ring : rings) {
    for (const LocalMember& m : ring) {
      const auto it = reg.entries.find({key, m.device});
      grow = grow || it == reg.entries.end() || it->second.bytes < bytes;
    }
  }
  if (!grow) return;
  const int64_t size_bytes = (std::max(bytes, CopyEngineWindow::kFlagBytes + 1) + kGrain - 1) / kGrain * kGrain;
  int saved = 0;
  check(cudaGetDevice(&saved), "cudaGetDevice");
  std::vector<int32_t> flags(CopyEngineWindow::kFlagBytes / sizeof(int32_t), 0);
  for (size_t i = CopyEngineWindow::kFreeOffset / sizeof(int32_t); i < flags.size(); ++i) flags[i] = 1;
  // every member idle first: no copy in flight targets a window about to be replaced
  for (const auto& ring : rings) {
    for (const LocalMember& m : ring) {
      check(cudaSetDevice(m.device), "cudaSetDevice");
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
  }
  for (const auto& ring : rings) {
    const int size = int(ring.size());
    std::vector<uint64_t> bases(size_t(size), 0);
    for (const LocalMember& m : ring) {
      if (m.rank < 0 || m.rank >= size) core_fail("copy-engine windows: rank outside its ring");
      check(cudaSetDevice(m.device), "cudaSetDevice");
      for (const LocalMember& peer : ring) {
        if (peer.device == m.device) continue;
        int can = 0;
        check(cudaDeviceCanAccessPeer(&can, m.device, peer.device), "cudaDeviceCanAccessPeer");
        if (!can) {
          core_fail("copy-engine windows: device " + std::to_string(m.device) + " cannot access device " +
                    std::to_string(peer.device) + "'s memory (no peer access): use the NCCL transport");
        }
        const cudaError_t e = cudaDeviceEnablePeerAccess(peer.device, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) {
          (void)cudaGetLastError();
        } else {
          check(e, "cudaDeviceEnablePeerAccess");
        }
      }
      void*& owned = reg.owned[{key, m.device}];
      if (owned != nullptr) check(cudaFree(owned), "cudaFree");
      owned = nullptr;
      check(cudaMalloc(&owned, size_t(size_bytes)), "cudaMalloc");
      check(cudaMemcpy(owned, flags.data(), flags.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
      bases[size_t(m.rank)] = reinterpret_cast<uint64_t>(owned);
    }
    for (const LocalMember& m : ring) {
      Entry& e = reg.entries[{key, m.device}];
      e.rank = m.rank;
      e.size = size;
      e.bytes = size_bytes;
      e.bases = bases;
    }
  }
  check(cudaSetDevice(saved), "cudaSetDevice");
}

int64_t local_window_bytes(int64_t key, int device) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  const auto it = reg.entries.find({key, device});
  return it == reg.entries.end() ? 0 : it->second.bytes;
}

std::unique_ptr<Transport> local_window_transport(int64_t key, int device, void* stream) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  const auto it = reg.entries.find({key, device});
  if (it == reg.entries.end()) return nullptr;
  CopyEngineWindow w;
  w.bytes = it->second.bytes;
  w.bases = it->second.bases.data();
  return std::make_unique<CopyEngineTransport>(it->second.rank, it->second.size, stream, w);
}

}  // namespace comm
}  // namespace te
