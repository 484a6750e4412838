// Instantiates the CUDA forward fused NVFP4 kernels (ScaleMode::kNvfp4) of the GELU family.
#include "act_cuda.cuh"

TE_INSTANTIATE_NVFP4_CUDA(kGelu, Gelu, false, false)
TE_INSTANTIATE_NVFP4_CUDA(kGeglu, Gelu, true, false)
TE_INSTANTIATE_NVFP4_CUDA(kQgelu, QGelu, false, false)
TE_INSTANTIATE_NVFP4_CUDA(kQgeglu, QGelu, true, false)
