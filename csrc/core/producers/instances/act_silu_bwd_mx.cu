// Instantiates the CUDA backward MXFP8 kernels of every activation table row of family silu (act_functors.h: today the
// sigmoid family (silu, swiglu, glu, clamped_swiglu)).
#include "../mxfp8/quantize_mxfp8_cuda.cuh"

TE_FOR_EACH_ACTIVATION_OF(silu, TE_INSTANTIATE_MXFP8_CUDA, true)
