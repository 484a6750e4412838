// Instantiates the CUDA backward fused NVFP4 kernels (ScaleMode::kNvfp4) of every activation table row of family gelu
// (act_functors.h: today the GELU family (gelu, geglu, qgelu, qgeglu)).
#include "../launch.cuh"

TE_FOR_EACH_ACTIVATION_OF(gelu, TE_INSTANTIATE_NVFP4_CUDA, true)
