// CUDA side of MXFP8 quantization: the activation dispatch switch of the fused MXFP8 kernel (quantize_mxfp8_cuda.cuh).
// The launchers are instantiated next to each family's activation kernels in act_*.cu.
#include "quantize_mxfp8_cuda.cuh"

namespace te {
namespace mx_cuda {
#define TE_DECLARE_MXFP8_CUDA(code, F, gated)                                                                \
  extern template void launch_mxfp8<ActOp<F, gated>, false>(DType, const Mxfp8Params&, cudaStream_t);      \
  extern template void launch_mxfp8<ActOp<F, gated>, true>(DType, const Mxfp8Params&, cudaStream_t);
TE_FOR_EACH_ACTIVATION(TE_DECLARE_MXFP8_CUDA)
#undef TE_DECLARE_MXFP8_CUDA
}  // namespace mx_cuda

void quantize_mxfp8_cuda(ActKind kind, bool backward, DType in_dtype, const Mxfp8Params& p, cudaStream_t s) {
  switch (kind) {
#define TE_CUDA_MX_CASE(code, F, gated)                                  \
  case ActKind::code:                                                    \
    if (backward) {                                                      \
      mx_cuda::launch_mxfp8<ActOp<F, gated>, true>(in_dtype, p, s);      \
    } else {                                                             \
      mx_cuda::launch_mxfp8<ActOp<F, gated>, false>(in_dtype, p, s);     \
    }                                                                    \
    return;
    TE_FOR_EACH_ACTIVATION(TE_CUDA_MX_CASE)
#undef TE_CUDA_MX_CASE
  }
  core_fail("activation code " + std::to_string(int(kind)) + " is not known; accepted: 0..11 (TE's enum)");
}

}  // namespace te
