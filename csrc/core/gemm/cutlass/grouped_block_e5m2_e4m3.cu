// FP8 block E5M2xE4M3: lhs 1x128 blocks x rhs [groups, n, k] 128x128 tiles → bf16, the scales applied every 128-deep K
// step (grouped_cutlass.cuh's CutlassBlockConfig).
#include "grouped_cutlass.cuh"
TE_GROUPED_CUTLASS_KIND_OF(kBlockE5m2E4m3, true, "cutlass sm90 grouped FP8 block E5M2xE4M3 NK",
                           CutlassBlockConfig<cutlass::float_e5m2_t, cutlass::float_e4m3_t>)
