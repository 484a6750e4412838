// Instantiates the CUDA backward MXFP8 kernels of the ReLU family and the identity (the plain FP8 cast).
#include "quantize_mxfp8_cuda.cuh"

TE_INSTANTIATE_MXFP8_CUDA(kRelu, Relu, false, true)
TE_INSTANTIATE_MXFP8_CUDA(kReglu, Relu, true, true)
TE_INSTANTIATE_MXFP8_CUDA(kSrelu, SRelu, false, true)
TE_INSTANTIATE_MXFP8_CUDA(kSreglu, SRelu, true, true)
TE_INSTANTIATE_MXFP8_CUDA(kIdentity, Identity, false, true)
