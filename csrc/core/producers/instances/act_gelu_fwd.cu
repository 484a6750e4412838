// Instantiates the CUDA forward activation kernels (plain / FP8 / current scaling) of every activation table row of
// family gelu (act_functors.h: today the GELU family (gelu, geglu, qgelu, qgeglu)).
#include "../launch.cuh"

TE_FOR_EACH_ACTIVATION_OF(gelu, TE_INSTANTIATE_ACT_CUDA, false)
