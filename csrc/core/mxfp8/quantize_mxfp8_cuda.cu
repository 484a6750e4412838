// CUDA side of MXFP8 quantization: the activation dispatch switch of the fused MXFP8 kernel (quantize_mxfp8_cuda.cuh).
// The launchers are instantiated next to each family's activation kernels in act/act_*_mx.cu.
#include "quantize_mxfp8_cuda.cuh"

namespace te {
namespace mx_cuda {
#define TE_DECLARE_MXFP8_CUDA(code, value, name, F, gated, ...)                                                        \
  extern template void launch_mxfp8<ActOp<F, gated>, false>(DType, const Mxfp8Params&, cudaStream_t);      \
  extern template void launch_mxfp8<ActOp<F, gated>, true>(DType, const Mxfp8Params&, cudaStream_t);
TE_FOR_EACH_ACTIVATION(TE_DECLARE_MXFP8_CUDA)
#undef TE_DECLARE_MXFP8_CUDA
}  // namespace mx_cuda

void quantize_mxfp8_cuda(ActKind kind, bool backward, DType in_dtype, const Mxfp8Params& p, cudaStream_t s) {
  visit_activation(kind, backward, [&](auto op, auto bwd) {
    mx_cuda::launch_mxfp8<decltype(op), decltype(bwd)::value>(in_dtype, p, s);
  });
}

}  // namespace te
