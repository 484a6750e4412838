// Instantiates the CUDA activation kernels of the GELU family (split by family so the build parallelises).
#include "act_cuda.cuh"

TE_INSTANTIATE_ACT_CUDA(kGelu, Gelu, false)
TE_INSTANTIATE_ACT_CUDA(kGeglu, Gelu, true)
TE_INSTANTIATE_ACT_CUDA(kQgelu, QGelu, false)
TE_INSTANTIATE_ACT_CUDA(kQgeglu, QGelu, true)
