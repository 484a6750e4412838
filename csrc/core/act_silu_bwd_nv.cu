// Instantiates the CUDA backward fused NVFP4 kernels (ScaleMode::kNvfp4) of the sigmoid family (SiLU, SwiGLU, GLU,
// clamped SwiGLU).
#include "act_cuda.cuh"

TE_INSTANTIATE_NVFP4_CUDA(kSilu, Silu, false, true)
TE_INSTANTIATE_NVFP4_CUDA(kSwiglu, Silu, true, true)
TE_INSTANTIATE_NVFP4_CUDA(kGlu, Sigmoid, true, true)
TE_INSTANTIATE_NVFP4_CUDA(kClampedSwiglu, ClampedSilu, true, true)
