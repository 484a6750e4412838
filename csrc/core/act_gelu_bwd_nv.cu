// Instantiates the CUDA backward fused NVFP4 kernels (ScaleMode::kNvfp4) of the GELU family.
#include "act_cuda.cuh"

TE_INSTANTIATE_NVFP4_CUDA(kGelu, Gelu, false, true)
TE_INSTANTIATE_NVFP4_CUDA(kGeglu, Gelu, true, true)
TE_INSTANTIATE_NVFP4_CUDA(kQgelu, QGelu, false, true)
TE_INSTANTIATE_NVFP4_CUDA(kQgeglu, QGelu, true, true)
