// NCCL communicators for the collective GEMM of frontends that have none of their own (JAX: XLA keeps its NCCL
// communicators private), and the ring transport over them (comm/transport.h). torch uses its process group's
// communicator instead (csrc/torch/collective.cpp), never one of these.
//
// NCCL is opened at run time (nccl_load: dlopen of the path the frontend finds, e.g. the nvidia-nccl wheel's), so the
// build links no NCCL and a process without it imports and runs everything else. Communicators live in a process-wide
// registry keyed by (key, device): `key` names one set of rings (the frontend's hash of a mesh axis: which devices
// form each ring), `device` the CUDA ordinal of one member run by this process; each entry holds the rank of that
// device in its ring, a stream of its own for the exchanges and the two events that order them. The entries are made
// once (nccl_create, outside any capture: it initialises the communicators and runs one small warm-up exchange so
// NCCL's peer connections exist before a CUDA graph or XLA command buffer records an exchange) and never destroyed
// (ncclCommDestroy at exit may wait on peers that are gone).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport.h"

namespace te {
namespace comm {

// Whether this build has the NCCL transport (the toolkit's nccl.h was found at build time).
bool nccl_built();
// Opens NCCL from `path` (a libnccl.so.2; empty: the loader's search path). Idempotent once it succeeded; raises a
// te::Error naming the path and dlerror() otherwise.
void nccl_load(const std::string& path);
bool nccl_loaded();
// NCCL's version code (e.g. 22805 for 2.28.5), 0 before nccl_load.
int nccl_version();

// A fresh ncclUniqueId, as its 128 bytes (the frontend hands it to every process of the ring).
std::string nccl_unique_id();

struct NcclMember {
  int device = 0;  // CUDA ordinal in this process
  int rank = 0;    // its rank in the ring of `size`
};
// Creates the communicators of this process's members of one ring (all of them inside one ncclGroupStart/End, so one
// process may drive several members), then the warm-up exchange. Every process holding a member of the ring must call
// it with the same `unique_id` and `size`; it blocks until they all have. A (key, device) already registered raises.
void nccl_create(int64_t key, const std::string& unique_id, int size, const std::vector<NcclMember>& members);
bool nccl_has(int64_t key, int device);

// The transport of member (key, device) whose exchanges follow `stream` (cudaStream_t): start() forks the member's
// exchange stream from `stream` with an event and issues the sends and receives as one NCCL group there; wait() joins
// it back. Raises, naming the key and device, when no such member was created in this process.
std::unique_ptr<Transport> nccl_transport(int64_t key, int device, void* stream);

// A transport that moves nothing and stands in for NCCL's (the JAX initialize stage records the schedule's kernels
// with it: a throwaway capture must not record NCCL calls, whose peers are not capturing; its SM margin is NCCL's, so
// the GEMMs recorded are the ones execute runs).
class NullTransport : public Transport {
 public:
  NullTransport(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void start(int, const Segment*, int, int, int) override {}
  void wait() override {}
  int default_sm_margin() const override { return kNcclSmMargin; }

 private:
  int rank_, size_;
};

}  // namespace comm
}  // namespace te
