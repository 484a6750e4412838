// Instantiates the CUDA backward activation kernels (plain / FP8) of the ReLU family and the identity (the plain FP8
// cast).
#include "act_cuda.cuh"

TE_INSTANTIATE_ACT_CUDA(kRelu, Relu, false, true)
TE_INSTANTIATE_ACT_CUDA(kReglu, Relu, true, true)
TE_INSTANTIATE_ACT_CUDA(kSrelu, SRelu, false, true)
TE_INSTANTIATE_ACT_CUDA(kSreglu, SRelu, true, true)
TE_INSTANTIATE_ACT_CUDA(kIdentity, Identity, false, true)
