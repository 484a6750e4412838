// Instantiates the CUDA backward MXFP8 kernels of the GELU family.
#include "quantize_mxfp8_cuda.cuh"

TE_INSTANTIATE_MXFP8_CUDA(kGelu, Gelu, false, true)
TE_INSTANTIATE_MXFP8_CUDA(kGeglu, Gelu, true, true)
TE_INSTANTIATE_MXFP8_CUDA(kQgelu, QGelu, false, true)
TE_INSTANTIATE_MXFP8_CUDA(kQgeglu, QGelu, true, true)
