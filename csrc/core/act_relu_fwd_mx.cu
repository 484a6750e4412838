// Instantiates the CUDA forward MXFP8 kernels of the ReLU family and the identity (the plain FP8 cast).
#include "quantize_mxfp8_cuda.cuh"

TE_INSTANTIATE_MXFP8_CUDA(kRelu, Relu, false, false)
TE_INSTANTIATE_MXFP8_CUDA(kReglu, Relu, true, false)
TE_INSTANTIATE_MXFP8_CUDA(kSrelu, SRelu, false, false)
TE_INSTANTIATE_MXFP8_CUDA(kSreglu, SRelu, true, false)
TE_INSTANTIATE_MXFP8_CUDA(kIdentity, Identity, false, false)
