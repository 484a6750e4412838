// Copy-engine windows (comm/transport.h CopyEngineWindow) for rings whose every member is a device of this process
// (JAX with one process driving every GPU; several processes use NCCL): one cudaMalloc'd window per member, peer
// access enabled between a ring's members, the flags in their initial state. Keyed like the NCCL registry (key: one
// set of rings, the frontend's hash of a mesh axis; device: a member's CUDA ordinal). CUDA builds only.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "transport.h"

namespace te {
namespace comm {

struct LocalMember {
  int device = 0;  // CUDA ordinal in this process
  int rank = 0;    // its rank in the ring
};

// Grows the windows of every ring of `key` to at least `bytes` each (flags page included), all members at once;
// first waits for the members' devices, so no call in flight reads a window being replaced. Outside any capture (the
// frontend calls it at trace time). Raises, naming the devices, when two members of a ring lack peer access.
void local_windows_ensure(int64_t key, const std::vector<std::vector<LocalMember>>& rings, int64_t bytes);
// The window bytes of member (key, device); 0 when it has none.
int64_t local_window_bytes(int64_t key, int device);
// The copy-engine transport of member (key, device) following `stream`, or nullptr when it has no window.
std::unique_ptr<Transport> local_window_transport(int64_t key, int device, void* stream);

}  // namespace comm
}  // namespace te
