// The weight gradient of a grouped layer: d[g] [n, k] = dy[rows of g]ᵀ · x[rows of g], bf16 → bf16
// (grouped_cutlass.cuh: A = dy M-major, B = x N-major, the contraction over the group's rows).
#include "grouped_cutlass.cuh"
TE_GROUPED_CUTLASS_KIND(kBf16Wgrad, cutlass::bfloat16_t, cutlass::bfloat16_t, cutlass::layout::RowMajor, false, false,
                        "cutlass sm90 grouped bf16 wgrad", cutlass::layout::ColumnMajor)
