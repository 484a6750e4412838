// Instantiates the CUDA backward fused NVFP4 kernels (ScaleMode::kNvfp4) of the ReLU family and the identity (the
// plain FP8 cast).
#include "act_cuda.cuh"

TE_INSTANTIATE_NVFP4_CUDA(kRelu, Relu, false, true)
TE_INSTANTIATE_NVFP4_CUDA(kReglu, Relu, true, true)
TE_INSTANTIATE_NVFP4_CUDA(kSrelu, SRelu, false, true)
TE_INSTANTIATE_NVFP4_CUDA(kSreglu, SRelu, true, true)
TE_INSTANTIATE_NVFP4_CUDA(kIdentity, Identity, false, true)
