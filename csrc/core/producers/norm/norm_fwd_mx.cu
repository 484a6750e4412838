// The norm forward's kernels and launcher for the mx output (norm_launch.cuh).
#include "norm_launch.cuh"

namespace te {
namespace norm_cuda {
template void fwd_launch<FwdOut::kMxRow>(const NormFwdParams&, cudaStream_t);
}  // namespace norm_cuda
}  // namespace te
