// Instantiates the CUDA backward activation kernels (plain / FP8) of the GELU family.
#include "act_cuda.cuh"

TE_INSTANTIATE_ACT_CUDA(kGelu, Gelu, false, true)
TE_INSTANTIATE_ACT_CUDA(kGeglu, Gelu, true, true)
TE_INSTANTIATE_ACT_CUDA(kQgelu, QGelu, false, true)
TE_INSTANTIATE_ACT_CUDA(kQgeglu, QGelu, true, true)
