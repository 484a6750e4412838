// Instantiates the CUDA forward MXFP8 kernels of the GELU family.
#include "quantize_mxfp8_cuda.cuh"

TE_INSTANTIATE_MXFP8_CUDA(kGelu, Gelu, false, false)
TE_INSTANTIATE_MXFP8_CUDA(kGeglu, Gelu, true, false)
TE_INSTANTIATE_MXFP8_CUDA(kQgelu, QGelu, false, false)
TE_INSTANTIATE_MXFP8_CUDA(kQgeglu, QGelu, true, false)
