// Instantiates the CUDA forward MXFP8 kernels of every activation table row of family relu (act_functors.h: today the
// ReLU family (relu, reglu, srelu, sreglu) and the identity (the plain cast)).
#include "../mxfp8/quantize_mxfp8_cuda.cuh"

TE_FOR_EACH_ACTIVATION_OF(relu, TE_INSTANTIATE_MXFP8_CUDA, false)
