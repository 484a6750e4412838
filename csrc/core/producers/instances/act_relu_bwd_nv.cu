// Instantiates the CUDA backward fused NVFP4 kernels (ScaleMode::kNvfp4) of every activation table row of family relu
// (act_functors.h: today the ReLU family (relu, reglu, srelu, sreglu) and the identity (the plain cast)).
#include "../launch.cuh"

TE_FOR_EACH_ACTIVATION_OF(relu, TE_INSTANTIATE_NVFP4_CUDA, true)
