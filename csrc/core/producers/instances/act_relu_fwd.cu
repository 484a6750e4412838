// Instantiates the CUDA forward activation kernels (plain / FP8 / current scaling) of every activation table row of
// family relu (act_functors.h: today the ReLU family (relu, reglu, srelu, sreglu) and the identity (the plain cast)).
#include "../launch.cuh"

TE_FOR_EACH_ACTIVATION_OF(relu, TE_INSTANTIATE_ACT_CUDA, false)
