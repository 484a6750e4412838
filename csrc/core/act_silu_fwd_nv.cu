// Instantiates the CUDA forward fused NVFP4 kernels (ScaleMode::kNvfp4) of the sigmoid family (SiLU, SwiGLU, GLU,
// clamped SwiGLU).
#include "act_cuda.cuh"

TE_INSTANTIATE_NVFP4_CUDA(kSilu, Silu, false, false)
TE_INSTANTIATE_NVFP4_CUDA(kSwiglu, Silu, true, false)
TE_INSTANTIATE_NVFP4_CUDA(kGlu, Sigmoid, true, false)
TE_INSTANTIATE_NVFP4_CUDA(kClampedSwiglu, ClampedSilu, true, false)
