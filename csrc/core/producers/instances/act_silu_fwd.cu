// Instantiates the CUDA forward activation kernels (plain / FP8 / current scaling) of every activation table row of
// family silu (act_functors.h: today the sigmoid family (silu, swiglu, glu, clamped_swiglu)).
#include "../launch.cuh"

TE_FOR_EACH_ACTIVATION_OF(silu, TE_INSTANTIATE_ACT_CUDA, false)
