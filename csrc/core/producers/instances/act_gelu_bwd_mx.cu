// Instantiates the CUDA backward MXFP8 kernels of every activation table row of family gelu (act_functors.h: today the
// GELU family (gelu, geglu, qgelu, qgeglu)).
#include "../mxfp8/quantize_mxfp8_cuda.cuh"

TE_FOR_EACH_ACTIVATION_OF(gelu, TE_INSTANTIATE_MXFP8_CUDA, true)
