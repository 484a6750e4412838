// Instantiates the CUDA forward activation kernels (plain / FP8) of the ReLU family and the identity (the plain FP8
// cast).
#include "act_cuda.cuh"

TE_INSTANTIATE_ACT_CUDA(kRelu, Relu, false, false)
TE_INSTANTIATE_ACT_CUDA(kReglu, Relu, true, false)
TE_INSTANTIATE_ACT_CUDA(kSrelu, SRelu, false, false)
TE_INSTANTIATE_ACT_CUDA(kSreglu, SRelu, true, false)
TE_INSTANTIATE_ACT_CUDA(kIdentity, Identity, false, false)
