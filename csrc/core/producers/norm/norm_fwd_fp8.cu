// The norm forward's kernels and launcher for the fp8 output (norm_launch.cuh).
#include "norm_launch.cuh"

namespace te {
namespace norm_cuda {
template void fwd_launch<FwdOut::kFp8>(const NormFwdParams&, cudaStream_t);
}  // namespace norm_cuda
}  // namespace te
