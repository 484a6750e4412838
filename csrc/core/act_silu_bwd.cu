// Instantiates the CUDA backward activation kernels (plain / FP8) of the sigmoid family (SiLU, SwiGLU, GLU, clamped
// SwiGLU).
#include "act_cuda.cuh"

TE_INSTANTIATE_ACT_CUDA(kSilu, Silu, false, true)
TE_INSTANTIATE_ACT_CUDA(kSwiglu, Silu, true, true)
TE_INSTANTIATE_ACT_CUDA(kGlu, Sigmoid, true, true)
TE_INSTANTIATE_ACT_CUDA(kClampedSwiglu, ClampedSilu, true, true)
