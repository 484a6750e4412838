// CUDA side of MXFP8 quantization: the activation dispatch switch of the fused MXFP8 kernel (quantize_mxfp8_cuda.cuh).
// The launchers are instantiated next to each family's activation kernels in act/act_*_mx.cu.
#include "quantize_mxfp8_cuda.cuh"

namespace te {
TE_ACT_CUDA_ENTRY(quantize_mxfp8_cuda, mx_cuda, launch_mxfp8, Mxfp8Params)

}  // namespace te
