// Instantiates the CUDA forward MXFP8 kernels of the sigmoid family (SiLU, SwiGLU, GLU, clamped SwiGLU).
#include "quantize_mxfp8_cuda.cuh"

TE_INSTANTIATE_MXFP8_CUDA(kSilu, Silu, false, false)
TE_INSTANTIATE_MXFP8_CUDA(kSwiglu, Silu, true, false)
TE_INSTANTIATE_MXFP8_CUDA(kGlu, Sigmoid, true, false)
TE_INSTANTIATE_MXFP8_CUDA(kClampedSwiglu, ClampedSilu, true, false)
