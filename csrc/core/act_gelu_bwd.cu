// Instantiates the CUDA backward activation kernels (plain / FP8 and MXFP8) of the GELU family.
#include "quantize_mxfp8_cuda.cuh"

TE_INSTANTIATE_ACT_CUDA(kGelu, Gelu, false, true)
TE_INSTANTIATE_ACT_CUDA(kGeglu, Gelu, true, true)
TE_INSTANTIATE_ACT_CUDA(kQgelu, QGelu, false, true)
TE_INSTANTIATE_ACT_CUDA(kQgeglu, QGelu, true, true)
TE_INSTANTIATE_MXFP8_CUDA(kGelu, Gelu, false, true)
TE_INSTANTIATE_MXFP8_CUDA(kGeglu, Gelu, true, true)
TE_INSTANTIATE_MXFP8_CUDA(kQgelu, QGelu, false, true)
TE_INSTANTIATE_MXFP8_CUDA(kQgeglu, QGelu, true, true)
