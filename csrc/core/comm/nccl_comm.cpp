// The NCCL registry and ring transport (comm/nccl_comm.h).
#include "nccl_comm.h"

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "../rules/common.h"

#if defined(TE_WITH_CUDA) && defined(TE_WITH_NCCL)
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#endif

namespace te {
namespace comm {

#if defined(TE_WITH_CUDA) && defined(TE_WITH_NCCL)
namespace {

// The NCCL entry points the ring uses, resolved from the dlopen'ed library.
struct Api {
  void* lib = nullptr;
  int version = 0;
  decltype(&::ncclGetVersion) get_version = nullptr;
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&::ncclGroupStart) group_start = nullptr;
  decltype(&::ncclGroupEnd) group_end = nullptr;
  decltype(&::ncclSend) send = nullptr;
  decltype(&::ncclRecv) recv = nullptr;
  decltype(&::ncclGetErrorString) error_string = nullptr;
};

std::mutex& api_mutex() {
  static std::mutex mu;
  return mu;
}

Api& api() {
  static Api a;
  return a;
}

const Api& loaded_api(const char* what) {
  const Api& a = api();
  if (a.lib == nullptr) core_fail(std::string(what) + ": NCCL is not loaded (nccl_load first)");
  return a;
}

void check_nccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  const Api& a = api();
  core_fail(std::string("NCCL ") + what + " failed: " + (a.error_string ? a.error_string(r) : "?") + " (code " +
            std::to_string(int(r)) + ")");
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) core_fail(std::string("NCCL transport: ") + what + " failed: " + cudaGetErrorString(e));
}

struct Member {
  ncclComm_t comm = nullptr;
  int rank = 0, size = 0;
  cudaStream_t stream = nullptr;  // the exchanges' own stream (highest priority: its kernels go first to free SMs)
  cudaEvent_t ready = nullptr;    // the caller's work before an exchange
  std::vector<cudaEvent_t> done;  // [size]: exchange i of a call (a call has size − 1)
};

struct Registry {
  std::mutex mu;
  std::map<std::pair<int64_t, int>, Member> members;
};

Registry& registry() {
  static Registry* r = new Registry();  // leaked on purpose: communicators outlive static destruction
  return *r;
}

class NcclTransport : public Transport {
 public:
  NcclTransport(const Member& m, cudaStream_t stream) : m_(m), stream_(stream) {}  // m: a registry entry (stable)
  int rank() const override { return m_.rank; }
  int size() const override { return m_.size; }

  void start(int step, const Segment* segs, int n, int to, int from) override {
    const Api& a = loaded_api("NCCL transport");
    if (step < 0 || step >= int(m_.done.size())) core_fail("NCCL transport: exchange " + std::to_string(step) +
                                                           " of a ring of " + std::to_string(m_.size));
    check_cuda(cudaEventRecord(m_.ready, stream_), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(m_.stream, m_.ready, 0), "cudaStreamWaitEvent");
    check_nccl(a.group_start(), "ncclGroupStart");
    for (int i = 0; i < n; ++i) {
      if (segs[i].bytes == 0) continue;
      check_nccl(a.send(segs[i].send, segs[i].bytes, ncclUint8, to, m_.comm, m_.stream), "ncclSend");
      check_nccl(a.recv(segs[i].recv, segs[i].bytes, ncclUint8, from, m_.comm, m_.stream), "ncclRecv");
    }
    check_nccl(a.group_end(), "ncclGroupEnd");
    check_cuda(cudaEventRecord(m_.done[step], m_.stream), "cudaEventRecord");
    last_ = step;
  }

  bool pipelined() const override { return true; }
  void wait_for(int step) override {
    check_cuda(cudaStreamWaitEvent(stream_, m_.done[step], 0), "cudaStreamWaitEvent");
  }
  void wait() override {
    if (last_ >= 0) wait_for(last_);  // one stream: the last exchange's event covers the others
    last_ = -1;
  }
  int default_sm_margin() const override { return kNcclSmMargin; }

 private:
  const Member& m_;
  cudaStream_t stream_;
  int last_ = -1;
};

template <class T> void resolve(void* lib, const char* name, T* fn, const std::string& path) {
  *fn = reinterpret_cast<T>(dlsym(lib, name));
  if (*fn == nullptr) core_fail("nccl_load: " + path + " has no " + name);
}

}  // namespace

bool nccl_built() { return true; }

void nccl_load(const std::string& path) {
  std::lock_guard<std::mutex> lock(api_mutex());
  Api& a = api();
  if (a.lib != nullptr) return;
  const std::string name = path.empty() ? std::string("libnccl.so.2") : path;
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (lib == nullptr) {
    const char* e = dlerror();
    core_fail("nccl_load: cannot open " + name + ": " + (e ? e : "?"));
  }
  Api b;
  b.lib = lib;
  resolve(lib, "ncclGetVersion", &b.get_version, name);
  resolve(lib, "ncclGetUniqueId", &b.get_unique_id, name);
  resolve(lib, "ncclCommInitRank", &b.comm_init_rank, name);
  resolve(lib, "ncclGroupStart", &b.group_start, name);
  resolve(lib, "ncclGroupEnd", &b.group_end, name);
  resolve(lib, "ncclSend", &b.send, name);
  resolve(lib, "ncclRecv", &b.recv, name);
  resolve(lib, "ncclGetErrorString", &b.error_string, name);
  if (b.get_version(&b.version) != ncclSuccess) b.version = 0;
  a = b;
}

bool nccl_loaded() { return api().lib != nullptr; }
int nccl_version() { return api().version; }

std::string nccl_unique_id() {
  const Api& a = loaded_api("nccl_unique_id");
  ncclUniqueId id;
  check_nccl(a.get_unique_id(&id), "ncclGetUniqueId");
  return std::string(id.internal, sizeof id.internal);
}

void nccl_create(int64_t key, const std::string& unique_id, int size, const std::vector<NcclMember>& members) {
  const Api& a = loaded_api("nccl_create");
  ncclUniqueId id;
  if (unique_id.size() != sizeof id.internal) {
    core_fail("nccl_create: the unique id has " + std::to_string(unique_id.size()) + " bytes, NCCL's has " +
              std::to_string(sizeof id.internal));
  }
  std::copy(unique_id.begin(), unique_id.end(), id.internal);
  if (size < 1) core_fail("nccl_create: the ring size must be >= 1, got " + std::to_string(size));
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  for (const NcclMember& m : members) {
    if (m.rank < 0 || m.rank >= size) {
      core_fail("nccl_create: rank " + std::to_string(m.rank) + " outside the ring of " + std::to_string(size));
    }
    if (reg.members.count({key, m.device})) {
      core_fail("nccl_create: device " + std::to_string(m.device) + " already has a communicator for key " +
                std::to_string(key));
    }
  }
  int saved = 0;
  check_cuda(cudaGetDevice(&saved), "cudaGetDevice");
  std::vector<Member> made(members.size());
  check_nccl(a.group_start(), "ncclGroupStart");
  for (size_t i = 0; i < members.size(); ++i) {
    check_cuda(cudaSetDevice(members[i].device), "cudaSetDevice");
    made[i].rank = members[i].rank;
    made[i].size = size;
    check_nccl(a.comm_init_rank(&made[i].comm, size, id, members[i].rank), "ncclCommInitRank");
  }
  check_nccl(a.group_end(), "ncclGroupEnd");
  // Streams, events and a warm-up ring exchange of one float per member (peer connections made now, outside any
  // capture); one group again so that one process may drive several members.
  std::vector<float*> bufs(members.size() * 2, nullptr);
  for (size_t i = 0; i < members.size(); ++i) {
    check_cuda(cudaSetDevice(members[i].device), "cudaSetDevice");
    int lowest = 0, highest = 0;
    check_cuda(cudaDeviceGetStreamPriorityRange(&lowest, &highest), "cudaDeviceGetStreamPriorityRange");
    check_cuda(cudaStreamCreateWithPriority(&made[i].stream, cudaStreamNonBlocking, highest), "cudaStreamCreate");
    check_cuda(cudaEventCreateWithFlags(&made[i].ready, cudaEventDisableTiming), "cudaEventCreate");
    made[i].done.resize(size_t(size));
    for (cudaEvent_t& e : made[i].done) {
      check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    }
    check_cuda(cudaMalloc(&bufs[2 * i], 2 * sizeof(float)), "cudaMalloc");
    bufs[2 * i + 1] = bufs[2 * i] + 1;
  }
  if (size > 1) {
    check_nccl(a.group_start(), "ncclGroupStart");
    for (size_t i = 0; i < members.size(); ++i) {
      const int r = made[i].rank;
      check_nccl(a.send(bufs[2 * i], 1, ncclFloat32, (r + 1) % size, made[i].comm, made[i].stream), "ncclSend");
      check_nccl(a.recv(bufs[2 * i + 1], 1, ncclFloat32, (r + size - 1) % size, made[i].comm, made[i].stream),
                 "ncclRecv");
    }
    check_nccl(a.group_end(), "ncclGroupEnd");
  }
  for (size_t i = 0; i < members.size(); ++i) {
    check_cuda(cudaSetDevice(members[i].device), "cudaSetDevice");
    check_cuda(cudaStreamSynchronize(made[i].stream), "cudaStreamSynchronize");
    check_cuda(cudaFree(bufs[2 * i]), "cudaFree");
    reg.members[{key, members[i].device}] = made[i];
  }
  check_cuda(cudaSetDevice(saved), "cudaSetDevice");
}

bool nccl_has(int64_t key, int device) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  return reg.members.count({key, device}) > 0;
}

std::unique_ptr<Transport> nccl_transport(int64_t key, int device, void* stream) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  const auto it = reg.members.find({key, device});
  if (it == reg.members.end()) {
    core_fail("collective GEMM: no NCCL communicator for key " + std::to_string(key) + " on device " +
              std::to_string(device) + " in this process (create it first: the frontend's initialize call)");
  }
  return std::make_unique<NcclTransport>(it->second, static_cast<cudaStream_t>(stream));
}

#else  // no CUDA or no nccl.h at build time

namespace {
[[noreturn]] void not_built(const char* what) {
  core_fail(std::string(what) + ": this build has no NCCL transport (built without CUDA or without nccl.h)");
}
}  // namespace

bool nccl_built() { return false; }
void nccl_load(const std::string&) { not_built("nccl_load"); }
bool nccl_loaded() { return false; }
int nccl_version() { return 0; }
std::string nccl_unique_id() { not_built("nccl_unique_id"); }
void nccl_create(int64_t, const std::string&, int, const std::vector<NcclMember>&) { not_built("nccl_create"); }
bool nccl_has(int64_t, int) { return false; }
std::unique_ptr<Transport> nccl_transport(int64_t, int, void*) { not_built("collective GEMM over NCCL"); }

#endif

}  // namespace comm
}  // namespace te
