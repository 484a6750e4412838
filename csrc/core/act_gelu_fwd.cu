// Instantiates the CUDA forward activation kernels (plain / FP8) of the GELU family.
#include "act_cuda.cuh"

TE_INSTANTIATE_ACT_CUDA(kGelu, Gelu, false, false)
TE_INSTANTIATE_ACT_CUDA(kGeglu, Gelu, true, false)
TE_INSTANTIATE_ACT_CUDA(kQgelu, QGelu, false, false)
TE_INSTANTIATE_ACT_CUDA(kQgeglu, QGelu, true, false)
